//! The restart gate: after a (re)start the server sends a removal to NRP only once the writer that
//! owns the removed piece of desired state has told it the new truth since the start.
//!
//! Until NRP has been read back (the first observe) and a writer has resynced the services scope
//! (the cluster-wide watcher: the **cluster view**), every removal is withheld. Then:
//!
//! * if the cluster view declared the cluster's nodes ([`Topology`]), removals at a node's locations
//!   wait for the resync of that node's pod writer (the watcher itself, or `node-agent/<node>`);
//!   a location of no declared node (its node is gone) is released at once;
//! * if it declared nothing, the cluster view releases every location (the old behaviour);
//! * writers of `--expected-writers` that have not resynced hold back everything.
//!
//! The waits for pod writers and expected writers are bounded: `resync_wait` after the cluster view
//! and the read-back are both there, the server gives up on a writer that has not come (a dead
//! node's agent), logs a warning naming it and releases what it held. The wait for the cluster view
//! itself is not bounded: without it the desired state lacks every Service, and releasing would
//! delete every load balancer. Inbound service deletions wait for the cluster view; outbound ones
//! (NAT gateways, used by pods) also for every pod writer. Adds and updates are never held back.
//!
//! A first read-back that finds nothing the desired state does not hold (no location, no service
//! that is not desired) leaves nothing to protect: only `--expected-writers` still hold removals
//! back. Once open, the restart part of the gate stays open for the server's lifetime.
//!
//! **Handovers.** The same gate applies, at any time, to a location whose pod owner changes (see
//! [`RestartGate::resync_completed`]): the watcher's topology gives the location's pods to another
//! writer, the watcher's cluster view stops covering `pods`, or a declared node goes. The pods the
//! old owner wrote there are nobody's any more, so they leave the desired state at once (the
//! caller drops them), while removals at the location are withheld until the new owner has
//! resynced it (its view is then the truth there), for at most `resync_wait` after the handover,
//! exactly as after a restart. A declared node that goes is released at once (its pods are gone);
//! a location nobody owns any more with no topology waits for any writer's pods resync of it.
//!
//! Pure (no I/O, no logging, time passed in): the [`GatewayCore`](super::GatewayCore) feeds it and
//! applies what it decides to its DiffTracker with [`DiffTracker::set_withheld`]; what it would log
//! it keeps as [`GateNote`]s for the caller ([`RestartGate::take_notes`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime};

use crate::difftracker::{DiffTracker, Withheld, WithheldLocations};

use super::Scope;
use crate::unix_ms;

/// Default bound of the wait for a pod writer or an expected writer.
pub const DEFAULT_RESYNC_WAIT: Duration = Duration::from_secs(180);

/// One node as the cluster view declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDecl {
    /// The node's name.
    pub name: String,
    /// Its IPs: the locations of its pods.
    pub locations: Vec<IpAddr>,
    /// The writer that reports its pods.
    pub pods_writer: String,
}

/// The cluster's nodes and who reports the pods of each, as declared by the cluster view.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// The declared nodes.
    pub nodes: Vec<NodeDecl>,
}

/// Why removals are held back.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HoldReason {
    /// NRP has not been read back yet.
    NrpNotObserved,
    /// No writer has resynced the services scope yet.
    ClusterView,
    /// A writer of `--expected-writers` has not resynced yet.
    ExpectedWriter(String),
    /// The pod writer of some declared nodes has not resynced their locations yet (after a start,
    /// or after their pods were handed over to it).
    PodWriter(String),
    /// The writer of the pods at some locations stopped reporting them and no topology names a
    /// new owner: any writer's pods resync of a location releases it.
    NoPodWriter,
}

impl HoldReason {
    /// The reason's label: `nrp_not_observed`, `cluster_view`, `expected_writer`, `pod_writer`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::NrpNotObserved => "nrp_not_observed",
            Self::ClusterView => "cluster_view",
            Self::ExpectedWriter(_) => "expected_writer",
            Self::PodWriter(_) => "pod_writer",
            Self::NoPodWriter => "no_pod_writer",
        }
    }

    /// Every label, in order.
    pub const LABELS: [&'static str; 5] = [
        "nrp_not_observed",
        "cluster_view",
        "expected_writer",
        "pod_writer",
        "no_pod_writer",
    ];

    /// The writer waited for, if the reason names one.
    pub fn writer(&self) -> Option<&str> {
        match self {
            Self::ExpectedWriter(w) | Self::PodWriter(w) => Some(w),
            _ => None,
        }
    }
}

/// One reason removals are held back, with what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// Why.
    pub reason: HoldReason,
    /// The locations held back; `None` = every location (and every service deletion).
    pub locations: Option<Vec<IpAddr>>,
    /// When the server stops waiting; `None` = no bound.
    pub deadline: Option<Instant>,
}

/// One [`Hold`] with what it holds back in the tracker now (for status and metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldView {
    /// Why.
    pub reason: HoldReason,
    /// Locations held back (for a hold of everything: every location the tracker knows).
    pub locations: u64,
    /// Addresses in NRP that keep a ref, or stay, only because removals are withheld there.
    pub addresses: u64,
    /// Services in NRP whose deletion is withheld (counted with the first hold only).
    pub services: u64,
    /// When the wait ends, in Unix ms; `None` = no bound.
    pub deadline_unix_ms: Option<i64>,
}

/// The gate as the Admin API shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GateView {
    /// NRP has been read back.
    pub nrp_observed: bool,
    /// Writers waited for now.
    pub pending_writers: Vec<String>,
    /// Nothing is withheld any more.
    pub open: bool,
    /// The writer of the cluster view, once it came.
    pub cluster_view_writer: Option<String>,
    /// Whether the cluster view declared a topology.
    pub topology_declared: bool,
    /// What holds removals back.
    pub holds: Vec<HoldView>,
}

/// What the pods resyncs of one writer covered since the start, less the locations whose pods
/// were handed over since (a resync before a handover does not speak for the location after it).
#[derive(Debug, Clone)]
enum PodsCover {
    /// Every location but these.
    All(HashSet<IpAddr>),
    /// These locations.
    At(HashSet<IpAddr>),
}

/// Pods handed over at one location: removals there wait for the new owner's resync of it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Handoff {
    /// The new owner; `None`: any writer's pods resync of the location.
    to: Option<String>,
    /// When the server stops waiting.
    deadline: Instant,
}

/// What the caller must do after a resync that changed who owns the pods of some locations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Handover {
    /// Locations whose pods must leave the desired state: their owner changed and the new one has
    /// not resynced them (removals there are withheld while it may still come, unless the node is
    /// gone).
    pub drop_pods_at: Vec<IpAddr>,
    /// Writers that now own pods they have not resynced: the server forgets their last resync, so
    /// that a live writer (which checks `Admin.Status` for it) resyncs.
    pub resync_asked: Vec<String>,
}

#[derive(Debug, Clone)]
struct ClusterView {
    writer: String,
    at: Instant,
    /// Location → (node, pods writer), when a topology was declared.
    topology: Option<HashMap<IpAddr, (String, String)>>,
}

/// Something the gate decided that an operator should read in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateNote {
    /// A warning (a writer given up on), not information.
    pub warning: bool,
    /// What happened, with the writer, locations and bounds involved.
    pub message: String,
}

/// The restart gate of one gateway (see the module documentation).
#[derive(Debug)]
pub struct RestartGate {
    resync_wait: Duration,
    expected: Vec<String>,
    observed_at: Option<Instant>,
    cluster_view: Option<ClusterView>,
    pods: HashMap<String, PodsCover>,
    resynced: HashSet<String>,
    /// Writers the server stopped waiting for (each warned once).
    given_up: BTreeSet<String>,
    /// The holds computed last.
    holds: Vec<Hold>,
    /// Something changed since the holds were computed.
    dirty: bool,
    open: bool,
    /// The first read-back found nothing to protect: only `--expected-writers` still hold.
    nothing_to_protect: bool,
    /// Locations whose pods were handed over and whose new owner has not resynced them yet.
    handoffs: BTreeMap<IpAddr, Handoff>,
    /// What the gate would log, until the caller takes it.
    notes: Vec<GateNote>,
}

impl RestartGate {
    fn note(&mut self, warning: bool, message: String) {
        self.notes.push(GateNote { warning, message });
    }

    /// What the gate decided since the last call that an operator should read in the log.
    pub fn take_notes(&mut self) -> Vec<GateNote> {
        std::mem::take(&mut self.notes)
    }

    /// A closed gate: everything withheld until NRP is read back and the cluster view comes.
    pub fn new(expected_writers: Vec<String>, resync_wait: Duration) -> Self {
        let mut gate = Self {
            resync_wait,
            expected: expected_writers,
            observed_at: None,
            cluster_view: None,
            pods: HashMap::new(),
            resynced: HashSet::new(),
            given_up: BTreeSet::new(),
            holds: Vec::new(),
            dirty: true,
            open: false,
            nothing_to_protect: false,
            handoffs: BTreeMap::new(),
            notes: Vec::new(),
        };
        gate.holds = gate.compute(Instant::now());
        gate
    }

    /// True once the restart part of the gate is open (for good). Handovers may still hold
    /// locations back ([`RestartGate::holds`]).
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// The holds computed last (empty once open).
    pub fn holds(&self) -> &[Hold] {
        &self.holds
    }

    /// NRP has been read back (the first completed observe). `nothing_to_protect`: the read-back
    /// found nothing the desired state does not already hold, so the gate opens at once.
    pub fn observed(&mut self, now: Instant, nothing_to_protect: bool) {
        if self.observed_at.is_some() || self.open {
            return;
        }
        self.observed_at = Some(now);
        self.dirty = true;
        if nothing_to_protect {
            self.note(
                false,
                "NRP read back with nothing but desired state in it: removals wait for no writer \
                 but the expected ones"
                    .to_owned(),
            );
            self.nothing_to_protect = true;
        }
    }

    /// Whether NRP has been read back.
    pub fn nrp_observed(&self) -> bool {
        self.observed_at.is_some()
    }

    /// A resync of `writer` covering `scope` completed; `topology` is what its header declared;
    /// `tracker` is the desired state after the resync was applied. Returns what changed hands.
    ///
    /// The pods at a location are owned by the writer its node declares in the cluster view's
    /// topology; at a location of no declared node (or with no topology), by a writer whose pods
    /// resync covers every location, else by one that resynced that location. A cluster view
    /// without `pods` ends its writer's claim on pods. When this resync changes the owner of a
    /// location that holds pods (or that waits for a handover), the old owner's resync no longer
    /// speaks for it: unless the new owner is this very resync's writer and the resync covered
    /// the location, its pods leave the desired state and removals there wait for the new owner's
    /// resync, for at most `resync_wait` (a declared node that went is released at once).
    pub fn resync_completed(
        &mut self,
        writer: &str,
        scope: &Scope,
        topology: Option<&Topology>,
        tracker: &DiffTracker,
        now: Instant,
    ) -> Handover {
        self.dirty = true;
        self.resynced.insert(writer.to_owned());
        // Only a cluster view or a resync of every pod can change a location's owner: a resync of
        // the pods at one location only adds coverage. (Both cost O(cluster) anyway.)
        let may_change_owners = scope.services || (scope.pods && scope.location.is_none());
        let before: Vec<(IpAddr, Option<String>, bool)> = if may_change_owners {
            let mut locations: BTreeSet<IpAddr> =
                tracker.pods(None).into_iter().map(|(_, l)| l).collect();
            locations.extend(self.handoffs.keys().copied());
            locations
                .into_iter()
                .map(|l| {
                    let owner = self.owner(l);
                    let covered = owner.as_deref().is_some_and(|o| self.covers(o, l));
                    (l, owner, covered)
                })
                .collect()
        } else {
            Vec::new()
        };
        if scope.pods {
            match (scope.location, self.pods.get_mut(writer)) {
                (None, _) => {
                    self.pods
                        .insert(writer.to_owned(), PodsCover::All(HashSet::new()));
                }
                (Some(l), Some(PodsCover::All(except))) => {
                    except.remove(&l);
                }
                (Some(l), Some(PodsCover::At(set))) => {
                    set.insert(l);
                }
                (Some(l), None) => {
                    self.pods
                        .insert(writer.to_owned(), PodsCover::At(HashSet::from([l])));
                }
            }
        } else if scope.services {
            // The writer's whole view no longer reports pods: it owns none any more.
            self.pods.remove(writer);
        }
        if scope.services {
            self.cluster_view_resynced(writer, topology, now);
        }
        let mut out = Handover::default();
        for (location, old, was_covered) in before {
            let new = self.owner(location);
            let covered = new.as_deref().is_some_and(|o| self.covers(o, location));
            // A declared owner that stops reporting pods hands them over to itself: it must
            // resync them again (or they go after the bound).
            let stopped_covering = new == old && was_covered && !covered;
            if (new == old && !stopped_covering)
                || (old.is_none() && !self.handoffs.contains_key(&location))
            {
                // Unchanged, or nothing known to hand over (state written before any owner was
                // known is the restart gate's business).
                continue;
            }
            let by_this_resync = scope.pods
                && scope.location.is_none_or(|l| l == location)
                && new.as_deref() == Some(writer);
            self.forget_coverage(location, by_this_resync.then_some(writer));
            if by_this_resync {
                // The new owner's view of the location is in this very resync.
                self.handoffs.remove(&location);
                continue;
            }
            out.drop_pods_at.push(location);
            if new.is_none() && self.topology().is_some() {
                // A declared node that went: its pods went with it.
                self.handoffs.remove(&location);
                continue;
            }
            if let Some(to) = &new
                && !out.resync_asked.contains(to)
            {
                out.resync_asked.push(to.clone());
            }
            let message = format!(
                "pods handed over: removals at the location wait for the new owner's resync \
                 (location {location}, from {}, to {}, bound {:?})",
                old.as_deref().unwrap_or("-"),
                new.as_deref().unwrap_or("any pods writer"),
                self.resync_wait
            );
            self.note(false, message);
            self.handoffs.insert(
                location,
                Handoff {
                    to: new,
                    deadline: now + self.resync_wait,
                },
            );
        }
        // Handoffs this resync completes: the new owner (or, for an unowned location, anyone)
        // resynced the location.
        if scope.pods {
            let covered: Vec<IpAddr> = self
                .handoffs
                .iter()
                .filter(|(l, h)| {
                    h.to.as_deref().is_none_or(|to| to == writer) && self.covers(writer, **l)
                })
                .map(|(l, _)| *l)
                .collect();
            for l in covered {
                self.handoffs.remove(&l);
            }
        }
        out
    }

    fn cluster_view_resynced(&mut self, writer: &str, topology: Option<&Topology>, now: Instant) {
        let topology = topology.map(|t| {
            let mut map = HashMap::new();
            for n in &t.nodes {
                for l in &n.locations {
                    map.insert(*l, (n.name.clone(), n.pods_writer.clone()));
                }
            }
            map
        });
        // The first cluster view starts the bounded waits; a later one (a relist) only refreshes
        // the topology.
        if self.cluster_view.is_none() && !self.open {
            let waiting: BTreeSet<&str> = topology
                .iter()
                .flat_map(|t| t.values())
                .map(|(_, owner)| owner.as_str())
                .filter(|o| !self.covers_any(o))
                .collect();
            let message = format!(
                "cluster view resynced; removals at each node's locations wait for its pod \
                 writer's resync (writer {writer}, nodes {:?}, waiting {waiting:?}, bound {:?})",
                topology.as_ref().map(|t| t.len()),
                self.resync_wait
            );
            self.note(false, message);
        }
        let at = self.cluster_view.as_ref().map_or(now, |cv| cv.at);
        self.cluster_view = Some(ClusterView {
            writer: writer.to_owned(),
            at,
            topology,
        });
    }

    /// The declared topology (location → (node, pods writer)), if the cluster view declared one.
    fn topology(&self) -> Option<&HashMap<IpAddr, (String, String)>> {
        self.cluster_view
            .as_ref()
            .and_then(|cv| cv.topology.as_ref())
    }

    /// Who owns the pods at `location` now (see [`RestartGate::resync_completed`]).
    fn owner(&self, location: IpAddr) -> Option<String> {
        if let Some((_, owner)) = self.topology().and_then(|t| t.get(&location)) {
            return Some(owner.clone());
        }
        let mut covering: Vec<(bool, &String)> = self
            .pods
            .iter()
            .filter(|(w, _)| self.covers(w, location))
            .map(|(w, c)| (!matches!(c, PodsCover::All(_)), w))
            .collect();
        if self.topology().is_some() {
            // At a location of no declared node only a writer of every pod speaks for it.
            covering.retain(|(partial, _)| !partial);
        }
        covering.sort_unstable();
        covering.first().map(|(_, w)| (*w).clone())
    }

    /// Forgets every writer's resync of `location` (but `keep`'s): its pods changed hands.
    fn forget_coverage(&mut self, location: IpAddr, keep: Option<&str>) {
        for (writer, cover) in &mut self.pods {
            if Some(writer.as_str()) == keep {
                continue;
            }
            match cover {
                PodsCover::All(except) => {
                    except.insert(location);
                }
                PodsCover::At(set) => {
                    set.remove(&location);
                }
            }
        }
    }

    /// The node a location belongs to, as the cluster view's topology declares it (node binding
    /// of writers, see `crate::auth`).
    pub fn node_of(&self, location: IpAddr) -> Option<&str> {
        let topology = self.cluster_view.as_ref()?.topology.as_ref()?;
        topology.get(&location).map(|(node, _)| node.as_str())
    }

    /// Whether the cluster watcher has declared the node topology since the start.
    pub fn topology_declared(&self) -> bool {
        self.cluster_view
            .as_ref()
            .is_some_and(|v| v.topology.is_some())
    }

    fn covers_any(&self, writer: &str) -> bool {
        self.pods.contains_key(writer)
    }

    fn covers(&self, writer: &str, location: IpAddr) -> bool {
        match self.pods.get(writer) {
            Some(PodsCover::All(except)) => !except.contains(&location),
            Some(PodsCover::At(set)) => set.contains(&location),
            None => false,
        }
    }

    /// When the bounded waits end: `resync_wait` after both the cluster view and the read-back.
    fn deadline(&self) -> Option<Instant> {
        let cv = self.cluster_view.as_ref()?;
        let observed = self.observed_at?;
        Some(cv.at.max(observed) + self.resync_wait)
    }

    /// The next moment at which a bound of the gate passes (a hold's deadline, or the end of the
    /// bounded waits): [`RestartGate::poll`] must run then. `None`: only a resync or a read-back
    /// changes the gate. Only moments after `now` count.
    pub fn next_deadline(&self, now: Instant) -> Option<Instant> {
        self.holds
            .iter()
            .filter_map(|h| h.deadline)
            .chain(self.deadline())
            .filter(|t| *t > now)
            .min()
    }

    /// Recomputes the holds if something changed or a bound passed; returns what the tracker must
    /// withhold when that may have changed (`None`: nothing to do). Cheap when nothing changed.
    pub fn poll(&mut self, now: Instant) -> Option<Withheld> {
        let bound_passed = self
            .holds
            .iter()
            .any(|h| h.deadline.is_some_and(|d| now >= d));
        if !self.dirty && !bound_passed {
            return None;
        }
        self.dirty = false;
        let was_clear = self.open && self.holds.is_empty();
        let mut holds = if self.open {
            Vec::new()
        } else {
            self.compute(now)
        };
        if holds.is_empty() && !self.open {
            self.note(
                false,
                "restart gate open: every writer resynced, removals are sent".to_owned(),
            );
            self.open = true;
        }
        holds.extend(self.handoff_holds(now));
        self.holds = holds;
        if was_clear && self.holds.is_empty() {
            return None;
        }
        Some(self.withheld())
    }

    /// The holds of the pending handovers, one per new owner and deadline; gives up on those whose
    /// bound passed.
    fn handoff_holds(&mut self, now: Instant) -> Vec<Hold> {
        let expired: Vec<IpAddr> = self
            .handoffs
            .iter()
            .filter(|(_, h)| now >= h.deadline)
            .map(|(l, _)| *l)
            .collect();
        let mut gave_up: BTreeMap<Option<String>, Vec<IpAddr>> = BTreeMap::new();
        for l in expired {
            if let Some(h) = self.handoffs.remove(&l) {
                gave_up.entry(h.to).or_default().push(l);
            }
        }
        for (to, locations) in gave_up {
            let message = format!(
                "no resync of handed-over pods from their new owner: the old owner's pods there \
                 are removed (writer {}, locations {}, first {:?}, waited {:?})",
                to.as_deref().unwrap_or("any pods writer"),
                locations.len(),
                locations.first(),
                self.resync_wait
            );
            self.note(true, message);
        }
        let mut grouped: BTreeMap<(Option<String>, Instant), Vec<IpAddr>> = BTreeMap::new();
        for (l, h) in &self.handoffs {
            grouped
                .entry((h.to.clone(), h.deadline))
                .or_default()
                .push(*l);
        }
        grouped
            .into_iter()
            .map(|((to, deadline), locations)| Hold {
                reason: to.map_or(HoldReason::NoPodWriter, HoldReason::PodWriter),
                locations: Some(locations),
                deadline: Some(deadline),
            })
            .collect()
    }

    fn compute(&mut self, now: Instant) -> Vec<Hold> {
        let mut holds = Vec::new();
        if self.observed_at.is_none() {
            holds.push(Hold {
                reason: HoldReason::NrpNotObserved,
                locations: None,
                deadline: None,
            });
        }
        if self.cluster_view.is_none() && !self.nothing_to_protect {
            holds.push(Hold {
                reason: HoldReason::ClusterView,
                locations: None,
                deadline: None,
            });
        }
        let deadline = self.deadline();
        let passed = deadline.is_some_and(|d| now >= d);
        let missing: Vec<String> = self
            .expected
            .iter()
            .filter(|w| !self.resynced.contains(*w))
            .cloned()
            .collect();
        for w in missing {
            if passed {
                self.give_up(&w, None);
            } else {
                holds.push(Hold {
                    reason: HoldReason::ExpectedWriter(w),
                    locations: None,
                    deadline,
                });
            }
        }
        let mut by_writer: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
        if let Some(topology) = self
            .cluster_view
            .as_ref()
            .and_then(|cv| cv.topology.as_ref())
            .filter(|_| !self.nothing_to_protect)
        {
            for (location, (_, owner)) in topology {
                if !self.covers(owner, *location) {
                    by_writer.entry(owner.clone()).or_default().push(*location);
                }
            }
        }
        for (writer, mut locations) in by_writer {
            locations.sort_unstable();
            if passed {
                self.give_up(&writer, Some(&locations));
            } else {
                holds.push(Hold {
                    reason: HoldReason::PodWriter(writer),
                    locations: Some(locations),
                    deadline,
                });
            }
        }
        holds
    }

    fn give_up(&mut self, writer: &str, locations: Option<&[IpAddr]>) {
        if self.given_up.insert(writer.to_owned()) {
            let message = match locations {
                Some(l) => format!(
                    "no resync from this pod writer: removals at its locations proceed without it \
                     (writer {writer}, locations {}, first {:?}, waited {:?})",
                    l.len(),
                    l.first(),
                    self.resync_wait
                ),
                None => format!(
                    "no resync from this expected writer: removals proceed without it (writer \
                     {writer}, waited {:?})",
                    self.resync_wait
                ),
            };
            self.note(true, message);
        }
    }

    /// What the tracker must withhold for the holds computed last.
    pub fn withheld(&self) -> Withheld {
        if self.holds.iter().any(|h| h.locations.is_none()) {
            return Withheld::everything();
        }
        let locations: HashSet<IpAddr> = self
            .holds
            .iter()
            .flat_map(|h| h.locations.iter().flatten().copied())
            .collect();
        Withheld {
            outbound_deletions: !locations.is_empty(),
            locations: WithheldLocations::Only(locations),
            inbound_deletions: false,
        }
    }

    /// Writers waited for now.
    pub fn pending_writers(&self) -> Vec<String> {
        self.holds
            .iter()
            .filter_map(|h| h.reason.writer().map(str::to_owned))
            .collect()
    }

    /// The gate with what each hold holds back in `tracker` now (O(held locations' addresses), or
    /// O(tracker) while everything is held).
    pub fn view(&self, tracker: &DiffTracker, now: Instant) -> GateView {
        let wall = unix_ms(SystemTime::now());
        let deadline_ms = |d: Instant| {
            let left = d.saturating_duration_since(now);
            wall + i64::try_from(left.as_millis()).unwrap_or(i64::MAX / 2)
        };
        let mut services = tracker.withheld_deletions().len() as u64;
        let mut all: Option<(u64, u64)> = None;
        let holds = self
            .holds
            .iter()
            .map(|h| {
                let (locations, addresses) = match &h.locations {
                    None => *all.get_or_insert_with(|| {
                        let held = tracker.withheld_removals();
                        (
                            tracker.counts().actual_locations.max(held.len() as u64),
                            held.iter().map(|(_, n)| *n as u64).sum(),
                        )
                    }),
                    Some(l) => (
                        l.len() as u64,
                        l.iter()
                            .map(|l| tracker.withheld_removals_at(*l) as u64)
                            .sum(),
                    ),
                };
                HoldView {
                    reason: h.reason.clone(),
                    locations,
                    addresses,
                    services: std::mem::take(&mut services),
                    deadline_unix_ms: h.deadline.map(deadline_ms),
                }
            })
            .collect();
        GateView {
            nrp_observed: self.nrp_observed(),
            pending_writers: self.pending_writers(),
            open: self.open && self.holds.is_empty(),
            cluster_view_writer: self.cluster_view.as_ref().map(|cv| cv.writer.clone()),
            topology_declared: self
                .cluster_view
                .as_ref()
                .is_some_and(|cv| cv.topology.is_some()),
            holds,
        }
    }
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod gate_tests;
