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
//! back. Once open, the gate stays open for the server's lifetime.
//!
//! Pure (no I/O, time passed in): the [`Gateway`](crate::state::Gateway) feeds it and applies what
//! it decides to its DiffTracker with [`DiffTracker::set_withheld`].

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime};

use clb_core::difftracker::{DiffTracker, Withheld, WithheldLocations};

use crate::grpc::resync::Scope;
use crate::state::unix_ms;

/// Default bound of the wait for a pod writer or an expected writer.
pub const DEFAULT_RESYNC_WAIT: Duration = Duration::from_secs(180);

/// One node as the cluster view declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDecl {
    /// The node's name.
    pub name: String,
    /// Its IPs: the locations of its pods.
    pub locations: Vec<IpAddr>,
    /// The source that reports its pods.
    pub pods_source: String,
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
    /// The pod writer of some declared nodes has not resynced their locations yet.
    PodWriter(String),
}

impl HoldReason {
    /// The reason's label: `nrp_not_observed`, `cluster_view`, `expected_writer`, `pod_writer`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::NrpNotObserved => "nrp_not_observed",
            Self::ClusterView => "cluster_view",
            Self::ExpectedWriter(_) => "expected_writer",
            Self::PodWriter(_) => "pod_writer",
        }
    }

    /// Every label, in order.
    pub const LABELS: [&'static str; 4] = [
        "nrp_not_observed",
        "cluster_view",
        "expected_writer",
        "pod_writer",
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
    /// The source of the cluster view, once it came.
    pub cluster_view_source: Option<String>,
    /// Whether the cluster view declared a topology.
    pub topology_declared: bool,
    /// What holds removals back.
    pub holds: Vec<HoldView>,
}

/// What the pods resyncs of one source covered.
#[derive(Debug, Clone)]
enum PodsCover {
    /// Every location.
    All,
    /// These locations.
    At(HashSet<IpAddr>),
}

#[derive(Debug, Clone)]
struct ClusterView {
    source: String,
    at: Instant,
    /// Location → (node, pods source), when a topology was declared.
    topology: Option<HashMap<IpAddr, (String, String)>>,
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
}

impl RestartGate {
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
        };
        gate.holds = gate.compute(Instant::now());
        gate
    }

    /// True once nothing is withheld any more (for good).
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
            tracing::info!(
                "NRP read back with nothing but desired state in it: removals wait for no writer \
                 but the expected ones"
            );
            self.nothing_to_protect = true;
        }
    }

    /// Whether NRP has been read back.
    pub fn nrp_observed(&self) -> bool {
        self.observed_at.is_some()
    }

    /// A resync of `source` covering `scope` completed; `topology` is what its header declared.
    pub fn resync_completed(
        &mut self,
        source: &str,
        scope: &Scope,
        topology: Option<&Topology>,
        now: Instant,
    ) {
        self.dirty = true;
        self.resynced.insert(source.to_owned());
        if scope.pods {
            match (scope.location, self.pods.get_mut(source)) {
                (None, _) => {
                    self.pods.insert(source.to_owned(), PodsCover::All);
                }
                (Some(_), Some(PodsCover::All)) => {}
                (Some(l), Some(PodsCover::At(set))) => {
                    set.insert(l);
                }
                (Some(l), None) => {
                    self.pods
                        .insert(source.to_owned(), PodsCover::At(HashSet::from([l])));
                }
            }
        }
        if !scope.services {
            return;
        }
        let topology = topology.map(|t| {
            let mut map = HashMap::new();
            for n in &t.nodes {
                for l in &n.locations {
                    map.insert(*l, (n.name.clone(), n.pods_source.clone()));
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
            tracing::info!(
                source,
                nodes = topology.as_ref().map(|t| t.len()),
                ?waiting,
                bound = ?self.resync_wait,
                "cluster view resynced; removals at each node's locations wait for its pod \
                 writer's resync"
            );
        }
        let at = self.cluster_view.as_ref().map_or(now, |cv| cv.at);
        self.cluster_view = Some(ClusterView {
            source: source.to_owned(),
            at,
            topology,
        });
    }

    fn covers_any(&self, source: &str) -> bool {
        self.pods.contains_key(source)
    }

    fn covers(&self, source: &str, location: IpAddr) -> bool {
        match self.pods.get(source) {
            Some(PodsCover::All) => true,
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

    /// Recomputes the holds if something changed or a bound passed; returns what the tracker must
    /// withhold when that changed (`None`: nothing to do). Cheap when nothing changed.
    pub fn poll(&mut self, now: Instant) -> Option<Withheld> {
        if self.open && self.holds.is_empty() {
            return None;
        }
        let deadline = self.deadline();
        let passed = deadline.is_some_and(|d| now >= d);
        let bound_passed = passed && self.holds.iter().any(|h| h.deadline.is_some());
        if !self.dirty && !bound_passed {
            return None;
        }
        self.dirty = false;
        let holds = if self.open {
            Vec::new()
        } else {
            self.compute(now)
        };
        if holds.is_empty() && !self.open {
            tracing::info!("restart gate open: every writer resynced, removals are sent");
            self.open = true;
        }
        self.holds = holds;
        Some(self.withheld())
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
            match locations {
                Some(l) => tracing::warn!(
                    writer,
                    locations = l.len(),
                    first = ?l.first(),
                    waited = ?self.resync_wait,
                    "no resync from this pod writer: removals at its locations proceed without it"
                ),
                None => tracing::warn!(
                    writer,
                    waited = ?self.resync_wait,
                    "no resync from this expected writer: removals proceed without it"
                ),
            }
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
            cluster_view_source: self.cluster_view.as_ref().map(|cv| cv.source.clone()),
            topology_declared: self
                .cluster_view
                .as_ref()
                .is_some_and(|cv| cv.topology.is_some()),
            holds,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn cluster_view() -> Scope {
        Scope {
            services: true,
            endpoints: true,
            ..Scope::default()
        }
    }

    fn pods_at(l: &str) -> Scope {
        Scope {
            pods: true,
            location: Some(ip(l)),
            ..Scope::default()
        }
    }

    fn topology() -> Topology {
        let node = |name: &str, l: &[&str]| NodeDecl {
            name: name.into(),
            locations: l.iter().map(|s| ip(s)).collect(),
            pods_source: format!("node-agent/{name}"),
        };
        Topology {
            nodes: vec![
                node("a", &["10.0.0.1", "fd00::1"]),
                node("b", &["10.0.0.2"]),
            ],
        }
    }

    fn only(list: &[&str]) -> WithheldLocations {
        WithheldLocations::Only(list.iter().map(|s| ip(s)).collect())
    }

    #[test]
    fn removals_wait_for_the_read_back_the_cluster_view_and_each_location_s_pod_writer() {
        let t0 = Instant::now();
        let mut g = RestartGate::new(Vec::new(), Duration::from_secs(60));
        assert_eq!(g.poll(t0), Some(Withheld::everything()));
        assert_eq!(g.poll(t0), None, "nothing changed");
        // A node agent first: nothing opens before the cluster view.
        g.resync_completed("node-agent/b", &pods_at("10.0.0.2"), None, t0);
        assert_eq!(g.poll(t0), Some(Withheld::everything()));
        g.observed(t0, false);
        g.resync_completed("watcher", &cluster_view(), Some(&topology()), t0);
        let w = g.poll(t0).unwrap();
        assert_eq!(w.locations, only(&["10.0.0.1", "fd00::1"]));
        assert!(!w.inbound_deletions && w.outbound_deletions);
        assert_eq!(g.pending_writers(), ["node-agent/a"]);
        // Agent a resyncs one of its two locations, then the other.
        g.resync_completed("node-agent/a", &pods_at("10.0.0.1"), None, t0);
        assert_eq!(g.poll(t0).unwrap().locations, only(&["fd00::1"]));
        g.resync_completed("node-agent/a", &pods_at("fd00::1"), None, t0);
        assert_eq!(g.poll(t0), Some(Withheld::nothing()));
        assert!(g.is_open());
        // Open for good.
        g.resync_completed("watcher", &cluster_view(), Some(&Topology::default()), t0);
        assert_eq!(g.poll(t0 + Duration::from_secs(3600)), None);
    }

    #[test]
    fn a_writer_that_never_comes_holds_back_only_its_locations_and_only_for_the_bound() {
        let t0 = Instant::now();
        let bound = Duration::from_secs(60);
        let mut g = RestartGate::new(Vec::new(), bound);
        g.resync_completed("watcher", &cluster_view(), Some(&topology()), t0);
        let later = t0 + Duration::from_secs(10);
        g.observed(later, false);
        g.resync_completed("node-agent/a", &pods_at("10.0.0.1"), None, later);
        g.resync_completed("node-agent/a", &pods_at("fd00::1"), None, later);
        assert_eq!(g.poll(later).unwrap().locations, only(&["10.0.0.2"]));
        // The bound counts from when both the read-back and the cluster view are there.
        assert_eq!(g.poll(t0 + bound), None);
        assert_eq!(g.poll(later + bound), Some(Withheld::nothing()));
        assert!(g.is_open());
    }

    #[test]
    fn without_a_topology_the_cluster_view_and_the_expected_writers_gate_everything() {
        let t0 = Instant::now();
        let bound = Duration::from_secs(60);
        let mut g = RestartGate::new(vec!["watcher".into(), "extra".into()], bound);
        g.observed(t0, false);
        assert_eq!(g.poll(t0), Some(Withheld::everything()));
        assert_eq!(
            g.pending_writers(),
            ["watcher", "extra"],
            "expected writers are listed before the cluster view"
        );
        g.resync_completed("watcher", &cluster_view(), None, t0);
        assert_eq!(g.poll(t0), Some(Withheld::everything()));
        assert_eq!(g.pending_writers(), ["extra"]);
        assert_eq!(g.holds()[0].deadline, Some(t0 + bound));
        g.resync_completed("extra", &pods_at("10.0.0.9"), None, t0);
        assert_eq!(g.poll(t0), Some(Withheld::nothing()));
    }

    #[test]
    fn the_cluster_view_is_waited_for_without_bound_and_an_empty_read_back_opens_the_gate() {
        let t0 = Instant::now();
        let mut g = RestartGate::new(Vec::new(), Duration::from_secs(1));
        g.observed(t0, false);
        g.poll(t0);
        assert_eq!(g.poll(t0 + Duration::from_secs(86_400)), None);
        assert_eq!(g.withheld(), Withheld::everything());

        let mut g = RestartGate::new(Vec::new(), Duration::from_secs(1));
        g.observed(t0, true);
        assert_eq!(g.poll(t0), Some(Withheld::nothing()));
        assert!(g.is_open());
        // Expected writers still hold removals back.
        let mut g = RestartGate::new(vec!["watcher".into()], Duration::from_secs(1));
        g.observed(t0, true);
        assert_eq!(g.poll(t0), Some(Withheld::everything()));
        assert_eq!(g.pending_writers(), ["watcher"]);
        g.resync_completed("watcher", &pods_at("10.0.0.1"), None, t0);
        assert_eq!(g.poll(t0), Some(Withheld::nothing()));
    }

    #[test]
    fn a_watcher_that_reports_pods_itself_releases_its_nodes_with_its_own_resync() {
        let t0 = Instant::now();
        let mut g = RestartGate::new(Vec::new(), Duration::from_secs(60));
        g.observed(t0, false);
        let mut topo = topology();
        for n in &mut topo.nodes {
            n.pods_source = "watcher".into();
        }
        let all = Scope {
            services: true,
            endpoints: true,
            pods: true,
            ..Scope::default()
        };
        g.resync_completed("watcher", &all, Some(&topo), t0);
        assert_eq!(g.poll(t0), Some(Withheld::nothing()));
    }
}
