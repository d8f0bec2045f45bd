//! One gateway's rules, in one place: the [`GatewayCore`] owns the gateway's DiffTracker, its
//! dispatcher, its restart gate ([`gate`]), its writers, and what is kept beside the tracker for
//! inbound services (the port book and the frontend IPs NRP reported). The state server drives it
//! (one task per gateway) and maps its types to and from the wire; nothing here knows of gRPC,
//! tokio or Kubernetes, and time is passed in.
//!
//! The port book ties three things together: the ports each inbound service is **desired** with
//! (from the writers), the ports its load balancer rules were **programmed** with (as far as
//! reports and read-backs showed), and the ports the creation **in flight** carries. A difference
//! between desired and programmed creates the service again (its saga re-programs the rules); a
//! creation's report moves its in-flight ports to programmed; a read-back replaces programmed with
//! what NRP has, except for a service whose creation is still in flight (its report will say).

pub mod condition;
pub mod gate;
pub mod lb;
pub mod node_scope;
pub mod programmed;
mod report;
pub use report::Folded;
pub mod update;
mod views;
pub use views::{
    EgressStatus, LoadView, LocationStatus, PacingView, PendingView, ServiceStatus, StatusView,
};

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::difftracker::{
    DiffTracker, Operation, PodUpdate, ServiceAction, ServiceChange, ServiceKind,
};
use crate::dispatch::{DispatchConfig, DispatchEnv, Dispatcher, Expired, Unit};
use gate::{GateNote, GateView, Handover, RestartGate, Topology};
pub use lb::{Frontend, LbSettings, LbSpec};
use update::{ApplyOutcome, Item, ItemFault, ResyncOutcome, Rights, Update};

/// The part of the desired state a resync covers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scope {
    /// Every inbound identity.
    pub services: bool,
    /// Every declared outbound identity.
    pub egresses: bool,
    /// The endpoints of every inbound identity.
    pub endpoints: bool,
    /// Every pod, or with `location` only the pods at that location.
    pub pods: bool,
    /// Restricts `pods` to one location (a node agent's view of its node).
    pub location: Option<IpAddr>,
}

impl Scope {
    /// Every scope: services, egresses, endpoints, all pods.
    pub const ALL: Scope = Scope {
        services: true,
        egresses: true,
        endpoints: true,
        pods: true,
        location: None,
    };
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for (on, name) in [
            (self.services, "services"),
            (self.egresses, "egresses"),
            (self.endpoints, "endpoints"),
        ] {
            if on {
                parts.push(name.to_owned());
            }
        }
        if self.pods {
            parts.push(match self.location {
                Some(l) => format!("pods at {l}"),
                None => "pods".to_owned(),
            });
        }
        f.write_str(&parts.join(", "))
    }
}

/// The transport protocol of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// Anything else a writer sent (no load balancing rule can be made of it); the wire value.
    Other(i32),
}

/// One port of an inbound service: a load balancing rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Port {
    /// The transport protocol.
    pub protocol: Protocol,
    /// The frontend port.
    pub port: u32,
    /// The port the pods listen on; 0 means `port`.
    pub target_port: u32,
}

impl Port {
    /// The backend port of the rule: the target port, or the port when the target port is 0.
    pub fn backend_port(&self) -> u32 {
        if self.target_port == 0 {
            self.port
        } else {
            self.target_port
        }
    }

    /// Whether a worker can make a load balancing rule of it (TCP or UDP, port and target port 1
    /// to 65535, the target port 0 meaning the port).
    pub fn programmable(&self) -> bool {
        matches!(self.protocol, Protocol::Tcp | Protocol::Udp)
            && (1..=65535).contains(&self.port)
            && self.target_port <= 65535
    }
}

/// What the server knows of one writer of a gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriterRecord {
    /// Unix ms of the last completed resync, if any.
    pub last_resync_unix_ms: Option<i64>,
    /// Updates applied from this writer.
    pub updates_applied: u64,
    /// Items rejected from this writer.
    pub items_rejected: u64,
    /// The sequence the writer gave its last recorded resync (0: none given); kept when the
    /// resync is forgotten.
    pub resync_sequence: u64,
}

/// Settings of a gateway.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Writers whose first resync must complete before removals are allowed (see [`gate`]).
    pub expected_writers: Vec<String>,
    /// Longest wait for a pod writer or an expected writer that has not resynced.
    pub resync_wait: Duration,
    /// Dispatcher settings.
    pub dispatch: DispatchConfig,
}

/// A unit leased to a worker, with the load balancer each of its service changes carries (empty
/// but for the creation of an inbound service).
#[derive(Debug, Clone)]
pub struct Leased {
    /// The unit.
    pub unit: Unit,
    /// For a services unit, one entry per change, in order; empty otherwise.
    pub specs: Vec<LbSpec>,
}

/// What a report carries beside the dispatcher's [`Report`](crate::dispatch::Report): the frontends it names (for a
/// service unit, those of its creations; for an observe, those of this part), as canonical
/// (service, IP) pairs, and the load balancer rules of an observe's part.
#[derive(Debug, Clone, Default)]
pub struct ReportExtras {
    /// (service, frontend IP) pairs.
    pub frontends: Vec<(String, String)>,
    /// (service, load balancer as read back) pairs of an observe's part.
    pub rules: Vec<(String, LbSpec)>,
    /// Outbound services whose brought NAT gateway an observe's part found missing.
    pub missing_nat_gateways: Vec<String>,
}

/// What a resync did: its outcome, whether each item of the view was applied, and what changed
/// owner (the pods that left the desired state with it).
#[derive(Debug, Clone)]
pub struct ResyncDone {
    /// Applied, removed, refused.
    pub outcome: ResyncOutcome,
    /// Whether each item of the view was applied.
    pub applied: Vec<bool>,
    /// The locations whose pods changed owner, and the writers asked to resync.
    pub handover: Handover,
    /// The pods that left the desired state with the handover.
    pub dropped: u32,
}

/// What an observe reports beside the DiffTracker's snapshot, merged over its parts.
#[derive(Debug, Default)]
struct ObservedExtras {
    frontends: HashMap<String, String>,
    rules: HashMap<String, LbSpec>,
    missing_nat_gateways: BTreeSet<String>,
}

/// One gateway: its DiffTracker, dispatcher, restart gate, writers and port book.
#[derive(Debug)]
pub struct GatewayCore {
    name: String,
    tracker: DiffTracker,
    dispatch: Dispatcher,
    writers: BTreeMap<String, WriterRecord>,
    /// Writers whose session (resync held or forgotten, its sequence) changed since
    /// [`GatewayCore::take_session_changes`].
    session_changes: Vec<String>,
    /// Desired load balancers (ports and settings) of inbound identities (canonical name).
    service_specs: HashMap<String, LbSpec>,
    /// Frontend IPs of inbound identities as NRP last reported them: set by the report of a
    /// service's creation, replaced by each completed observe, dropped with its deletion.
    frontends: HashMap<String, String>,
    /// The load balancer each inbound identity was last created with in NRP, as far as seen.
    programmed: HashMap<String, LbSpec>,
    /// The load balancer the creation unit in flight for a service carries. An entry may outlive
    /// its unit (a creation that failed or was not confirmed): the dispatcher says what is in
    /// flight.
    in_flight: HashMap<String, LbSpec>,
    /// What the parts received so far of an observe unit (by work id) carried beside the snapshot.
    observing: Option<(u64, ObservedExtras)>,
    /// Brought NAT gateways deleted out of band: `report.rs`.
    missing_nat: report::MissingNat,
    gate: RestartGate,
}

impl GatewayCore {
    /// A gateway that starts afresh: empty desired state, removals withheld until NRP is read back
    /// and the writers resynced, an observe first.
    pub fn new(name: String, config: &GatewayConfig, env: DispatchEnv) -> Self {
        let mut tracker = DiffTracker::new();
        tracker.set_removals_allowed(false);
        Self {
            name,
            tracker,
            dispatch: Dispatcher::new(config.dispatch.clone(), env),
            writers: BTreeMap::new(),
            session_changes: Vec::new(),
            service_specs: HashMap::new(),
            frontends: HashMap::new(),
            programmed: HashMap::new(),
            in_flight: HashMap::new(),
            observing: None,
            missing_nat: report::MissingNat::default(),
            gate: RestartGate::new(config.expected_writers.clone(), config.resync_wait),
        }
    }

    /// The gateway's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The desired and actual state (read only; tests only, feature `test-support`). The state
    /// server's reads go through the views (`views.rs`: [`GatewayCore::status`],
    /// [`GatewayCore::service_status`], [`GatewayCore::service_family`], …).
    #[cfg(any(test, feature = "test-support"))]
    pub fn tracker(&self) -> &DiffTracker {
        &self.tracker
    }

    /// The desired state, changed directly (tests only, feature `test-support`: writers' updates
    /// go through [`GatewayCore::apply`] and [`GatewayCore::replace_scope`]).
    #[cfg(any(test, feature = "test-support"))]
    pub fn tracker_mut(&mut self) -> &mut DiffTracker {
        &mut self.tracker
    }

    /// The dispatcher (read only; tests only, feature `test-support`: reads go through the views,
    /// leases, reports and expiries through the core).
    #[cfg(any(test, feature = "test-support"))]
    pub fn dispatch(&self) -> &Dispatcher {
        &self.dispatch
    }

    /// Makes this gateway spend from `budget`, shared with the other gateways of its Azure
    /// subscription (ARM counts writes per subscription; see [`crate::dispatch::WriteBudget`]).
    pub fn share_write_budget(&mut self, budget: crate::dispatch::WriteBudget) {
        self.dispatch.share_write_budget(budget);
    }

    /// Folds the remaining writes of the subscription a worker of this gateway saw (see
    /// [`crate::dispatch::DispatchConfig::write_pace`]).
    pub fn note_remaining_writes(&mut self, remaining: u32) {
        self.dispatch.note_remaining_writes(remaining);
    }

    /// [`GatewayCore::note_remaining_writes`] as the report of `work_id` carried it (that unit's
    /// own writes are in the reading).
    pub fn note_remaining_writes_of(&mut self, remaining: u32, work_id: u64) {
        self.dispatch.note_remaining_writes_of(remaining, work_id);
    }

    /// Asks for a read-back of NRP as soon as possible.
    pub fn request_observe(&mut self) {
        self.dispatch.request_observe();
    }

    /// The restart gate (tests only, feature `test-support`: reads go through
    /// [`GatewayCore::gate_view`]).
    #[cfg(any(test, feature = "test-support"))]
    pub fn gate(&self) -> &RestartGate {
        &self.gate
    }

    /// The writers seen, by name.
    pub fn writers(&self) -> &BTreeMap<String, WriterRecord> {
        &self.writers
    }

    /// The desired ports of an inbound service.
    pub fn service_ports(&self, name: &str) -> Option<&[Port]> {
        self.service_specs.get(name).map(|s| s.ports.as_slice())
    }

    /// The desired settings of an inbound service's load balancer.
    pub fn service_settings(&self, name: &str) -> Option<&LbSettings> {
        self.service_specs
            .get(name)
            .and_then(|s| s.settings.as_ref())
    }

    /// The frontend IP NRP reported for an inbound service.
    pub fn frontend(&self, name: &str) -> Option<&str> {
        self.frontends.get(name).map(String::as_str)
    }

    /// Every frontend IP NRP reported, by service.
    pub fn frontends(&self) -> &HashMap<String, String> {
        &self.frontends
    }

    /// Applies a batch from `writer` in order: each item that `rights` allow and the DiffTracker
    /// takes is applied (with the ports of an inbound service); the others are refused, and
    /// nothing of a refused item changes anything. Counts the batch in the writer's record.
    /// Returns, beside the outcome, whether each item was applied.
    pub fn apply(
        &mut self,
        writer: &str,
        rights: &Rights,
        items: &[Item<'_>],
    ) -> (ApplyOutcome, Vec<bool>) {
        let mut out = ApplyOutcome::default();
        let mut applied = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            match self.apply_item(rights, item) {
                Ok(()) => {
                    out.applied += 1;
                    applied.push(true);
                    if let Ok(update) = item {
                        self.ports_of(update);
                    }
                }
                Err(fault) => {
                    out.rejected.push(ItemFault { index, fault });
                    applied.push(false);
                }
            }
        }
        self.record_writes(writer, u64::from(out.applied), out.rejected.len() as u64);
        (out, applied)
    }

    /// What [`GatewayCore::apply`] would answer now, changing nothing (it applies the batch to a
    /// copy of the DiffTracker).
    pub fn dry_run(&self, rights: &Rights, items: &[Item<'_>]) -> ApplyOutcome {
        let mut copy = self.tracker.clone();
        let mut out = ApplyOutcome::default();
        for (index, item) in items.iter().enumerate() {
            let checked = self.check_rights(rights, item).and_then(|()| match item {
                Ok(update) => update::apply_one(&mut copy, update),
                Err(refusal) => Err(refusal.fault.clone()),
            });
            match checked {
                Ok(()) => out.applied += 1,
                Err(fault) => out.rejected.push(ItemFault { index, fault }),
            }
        }
        out
    }

    fn check_rights(&self, rights: &Rights, item: &Item<'_>) -> Result<(), update::Fault> {
        match rights {
            Rights::Any => Ok(()),
            Rights::Node(node) => update::node_check(
                |ip| self.gate.node_of(ip).map(str::to_owned),
                node,
                &update::named(item),
            ),
        }
    }

    fn apply_item(&mut self, rights: &Rights, item: &Item<'_>) -> Result<(), update::Fault> {
        self.check_rights(rights, item)?;
        match item {
            Ok(update) => update::apply_one(&mut self.tracker, update),
            Err(refusal) => Err(refusal.fault.clone()),
        }
    }

    /// Keeps the book in step with an applied update.
    fn ports_of(&mut self, update: &Update<'_>) {
        if let Update::Service {
            operation,
            id,
            ports,
            settings,
            ..
        } = update
        {
            let spec = (*operation == Operation::Add).then(|| LbSpec {
                ports: ports.clone(),
                settings: Some(settings.clone()),
            });
            self.spec_desired(id, spec);
        }
    }

    /// Replaces `scope` with `writer`'s view (see [`update`]): applies every valid item, removes
    /// what the scope holds but the view does not name, keeps the port book in step, counts the
    /// view in the writer's record, and completes the writer's resync of the scope (with the
    /// topology its header declared; see [`GatewayCore::resync_scope_completed`]).
    pub fn replace_scope(
        &mut self,
        writer: &str,
        scope: &Scope,
        topology: Option<&Topology>,
        view: &[Item<'_>],
        now: Instant,
        now_unix_ms: i64,
    ) -> ResyncDone {
        let (outcome, applied) = update::replace_scope(&mut self.tracker, scope, view);
        for (item, done) in view.iter().zip(&applied) {
            if let (Ok(update), true) = (item, done) {
                self.ports_of(update);
            }
        }
        // The services the view no longer names were removed: so are their ports.
        self.forget_undesired_ports();
        self.record_writes(
            writer,
            u64::from(outcome.applied),
            outcome.rejected.len() as u64,
        );
        let (handover, dropped) =
            self.resync_scope_completed(writer, scope, topology, now, now_unix_ms);
        ResyncDone {
            outcome,
            applied,
            handover,
            dropped,
        }
    }

    /// Records the load balancer of an inbound service an applied update added (`Some`) or
    /// removed (`None`). When the load balancer of a service NRP has differs from the one it was
    /// created with (ports or settings), the service is created again.
    pub fn spec_desired(&mut self, service: &str, spec: Option<LbSpec>) {
        let id = service.to_ascii_lowercase();
        match spec {
            Some(spec) => {
                self.reprogram_if_changed(&id, &spec);
                self.service_specs.insert(id, spec);
            }
            None => {
                self.service_specs.remove(&id);
            }
        }
    }

    /// Forgets the ports of every service that is no longer desired (a resync that replaced the
    /// services scope removes services without naming them).
    pub fn forget_undesired_ports(&mut self) {
        let desired: HashSet<String> = self
            .tracker
            .desired_inbound_identities()
            .into_iter()
            .collect();
        self.service_specs.retain(|name, _| desired.contains(name));
    }

    fn reprogram_if_changed(&mut self, id: &str, desired: &LbSpec) {
        let changed = self
            .programmed
            .get(id)
            .is_some_and(|have| have.differs_from(desired));
        if changed {
            let _ = self.tracker.reprogram_service(id);
        }
    }

    /// Leases the next unit to `worker`, if there is work; the creation of an inbound service
    /// carries its desired load balancer (remembered as in flight, so that its report tells which
    /// rules and frontend NRP got).
    pub fn lease(&mut self, worker: u64, work_id: u64, now: Instant) -> Option<Leased> {
        let unit = self
            .dispatch
            .next_unit(&mut self.tracker, worker, work_id, now)?;
        let specs = match &unit.work {
            crate::dispatch::UnitWork::Services(changes) => {
                changes.iter().map(|c| self.spec_for(c)).collect()
            }
            _ => Vec::new(),
        };
        Some(Leased { unit, specs })
    }

    fn spec_for(&mut self, change: &ServiceChange) -> LbSpec {
        if change.kind != ServiceKind::Inbound || change.action != ServiceAction::Create {
            return LbSpec::default();
        }
        let spec = self
            .service_specs
            .get(&change.name)
            .cloned()
            .unwrap_or_else(|| LbSpec::ports(Vec::new()));
        self.in_flight.insert(change.name.clone(), spec.clone());
        spec
    }

    /// Whether `work_id` is leased out.
    pub fn holds(&self, work_id: u64) -> bool {
        self.dispatch.holds(work_id)
    }

    /// Counts a report for a unit nobody holds (late or unknown).
    pub fn count_late_report(&mut self) {
        self.dispatch.count_late_report();
    }

    /// Takes the writes' changes in (the dispatcher times bursts by it), takes back every unit
    /// whose lease expired at `now`, and lets the restart gate's bounds pass.
    pub fn tick(&mut self, now: Instant) -> Vec<Expired> {
        self.dispatch.take_changes(&mut self.tracker, now);
        let expired = self.dispatch.expire(now);
        self.update_gates(now);
        expired
    }

    /// Releases every unit of a worker that went away.
    pub fn release_worker(&mut self, worker: u64, now: Instant) -> usize {
        self.dispatch.release_worker(worker, now)
    }

    /// The next moment at which time alone changes something here (see
    /// [`Dispatcher::next_deadline`], [`RestartGate::next_deadline`]).
    pub fn next_deadline(&self, now: Instant) -> Option<Instant> {
        [
            self.dispatch.next_deadline(now),
            self.gate.next_deadline(now),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Counts a batch from `writer`.
    pub fn record_writes(&mut self, writer: &str, applied: u64, rejected: u64) {
        let w = self.writers.entry(writer.to_owned()).or_default();
        w.updates_applied += applied;
        w.items_rejected += rejected;
    }

    /// Marks `writer`'s resync of every scope complete (see
    /// [`GatewayCore::resync_scope_completed`]).
    pub fn resync_completed(&mut self, writer: &str, now: Instant, now_unix_ms: i64) {
        self.resync_scope_completed(writer, &Scope::ALL, None, now, now_unix_ms);
    }

    /// Marks `writer`'s resync of `scope` complete (with the topology its header declared) and
    /// opens what the restart gate no longer holds back. When the resync changed who owns the pods
    /// of some locations (see [`RestartGate::resync_completed`]), the pods the old owner wrote
    /// there leave the desired state, removals there wait for the new owner's resync, and the new
    /// owner's last resync is forgotten so that a live writer resyncs. Returns the handover and the
    /// pods removed.
    pub fn resync_scope_completed(
        &mut self,
        writer: &str,
        scope: &Scope,
        topology: Option<&Topology>,
        now: Instant,
        now_unix_ms: i64,
    ) -> (Handover, u32) {
        self.writers
            .entry(writer.to_owned())
            .or_default()
            .last_resync_unix_ms = Some(now_unix_ms);
        self.session_changes.push(writer.to_owned());
        let handover = self
            .gate
            .resync_completed(writer, scope, topology, &self.tracker, now);
        let mut dropped = 0;
        for location in &handover.drop_pods_at {
            dropped += self.drop_pods_at(*location);
        }
        for w in &handover.resync_asked {
            if let Some(record) = self.writers.get_mut(w) {
                record.last_resync_unix_ms = None;
                self.session_changes.push(w.clone());
            }
        }
        self.update_gates(now);
        (handover, dropped)
    }

    /// Records the sequence `writer` gave the resync just completed (see
    /// [`WriterRecord::resync_sequence`]); its session changed.
    pub fn record_resync_sequence(&mut self, writer: &str, sequence: u64) {
        let record = self.writers.entry(writer.to_owned()).or_default();
        if record.resync_sequence != sequence {
            record.resync_sequence = sequence;
            self.session_changes.push(writer.to_owned());
        }
    }

    /// The writers whose session changed since the last call (a writer may be listed twice):
    /// whoever follows writers' sessions reads only theirs again.
    pub fn take_session_changes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.session_changes)
    }

    /// Removes every pod at `location` from the desired state (an address stays while an inbound
    /// identity uses it). Returns how many went.
    fn drop_pods_at(&mut self, location: IpAddr) -> u32 {
        let mut dropped = 0;
        for (address, at) in self.tracker.pods(Some(location)) {
            let (address, at) = (address.to_string(), at.to_string());
            let pod = PodUpdate {
                address: &address,
                location: &at,
                outbound_identity: "",
                uid: "",
                ..Default::default()
            };
            if self.tracker.update_pod(Operation::Remove, &pod).is_ok() {
                dropped += 1;
            }
        }
        dropped
    }

    /// The writers the restart gate waits for now.
    pub fn pending_writers(&self) -> Vec<String> {
        self.gate.pending_writers()
    }

    /// Brings the tracker's removal gate in step with the restart gate (after an observe, a
    /// resync, or when a bounded wait may have passed). Returns true when it changed what is
    /// withheld. Cheap when nothing changed.
    pub fn update_gates(&mut self, now: Instant) -> bool {
        if self.dispatch.nrp_observed() && !self.gate.nrp_observed() {
            // At the first read-back the tracker withholds everything, so these are every location
            // and every service NRP has that is not desired.
            let nothing_to_protect = self.tracker.counts().actual_locations == 0
                && self.tracker.withheld_deletions().is_empty();
            self.gate.observed(now, nothing_to_protect);
        }
        match self.gate.poll(now) {
            Some(withheld) if &withheld != self.tracker.withheld() => {
                self.tracker.set_withheld(withheld);
                true
            }
            _ => false,
        }
    }

    /// What the restart gate decided that an operator should read (see [`RestartGate::take_notes`]).
    pub fn take_gate_notes(&mut self) -> Vec<GateNote> {
        self.gate.take_notes()
    }

    /// The restart gate as the Admin API shows it.
    pub fn gate_view(&self, now: Instant) -> GateView {
        self.gate.view(&self.tracker, now)
    }
}

#[cfg(test)]
mod book_tests;
#[cfg(test)]
mod tests;
