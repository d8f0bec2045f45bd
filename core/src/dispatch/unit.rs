//! Work units as the dispatcher cuts them, and the reports workers send back (domain types; the
//! gRPC edge converts them to and from `clb.v1`).

use std::time::Duration;

use super::Key;
use crate::difftracker::{ActualSnapshot, LocationDiff, ServiceAction, ServiceChange, ServiceStep};

/// What a unit asks a worker to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitWork {
    /// Create or delete services (sagas).
    Services(Vec<ServiceChange>),
    /// Update address locations, one entry per location.
    Locations(Vec<LocationDiff>),
    /// Read NRP's state back.
    Observe,
}

/// The kind of a unit, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitKind {
    /// Service work.
    Services,
    /// Location work.
    Locations,
    /// Observe work.
    Observe,
}

impl UnitKind {
    /// Stable label.
    pub fn as_str(self) -> &'static str {
        match self {
            UnitKind::Services => "services",
            UnitKind::Locations => "locations",
            UnitKind::Observe => "observe",
        }
    }
}

impl UnitWork {
    /// The kind.
    pub fn kind(&self) -> UnitKind {
        match self {
            UnitWork::Services(_) => UnitKind::Services,
            UnitWork::Locations(_) => UnitKind::Locations,
            UnitWork::Observe => UnitKind::Observe,
        }
    }

    /// Number of changes (services or locations) it carries.
    pub fn len(&self) -> usize {
        match self {
            UnitWork::Services(c) => c.len(),
            UnitWork::Locations(d) => d.len(),
            UnitWork::Observe => 0,
        }
    }

    /// True if it carries no change (an observe unit).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the unit carries, in short, for status and logs: its kind and first key, and how many
    /// more (`locations 10.0.0.1 +2 more`, `services delete svc-a`, `observe`).
    pub fn summary(&self) -> String {
        let (kind, first) = match self {
            UnitWork::Observe => return "observe".to_owned(),
            UnitWork::Services(c) => (
                "services",
                c.first().map(|c| {
                    let op = match c.action {
                        ServiceAction::Create => "create",
                        ServiceAction::Delete => "delete",
                    };
                    format!("{op} {}", c.name)
                }),
            ),
            UnitWork::Locations(d) => ("locations", d.first().map(|d| d.location.to_string())),
        };
        let first = first.unwrap_or_default();
        match self.len() {
            0 | 1 => format!("{kind} {first}"),
            n => format!("{kind} {first} +{} more", n - 1),
        }
    }

    /// The one-in-flight keys of what this unit carries, in order.
    pub(super) fn keys(&self) -> Vec<Key> {
        match self {
            UnitWork::Observe => Vec::new(),
            UnitWork::Services(c) => c.iter().map(|c| Key::Service(c.name.clone())).collect(),
            UnitWork::Locations(d) => d.iter().map(|d| Key::Location(d.location)).collect(),
        }
    }
}

/// A unit leased to one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    /// Unique id.
    pub work_id: u64,
    /// Desired-state revision it was cut at.
    pub revision: u64,
    /// Lease end, wall clock (Unix ms).
    pub lease_deadline_unix_ms: i64,
    /// Lease length (the worker also bounds it on its monotonic clock).
    pub lease: Duration,
    /// 1 the first time what it carries is handed out; more on each re-dispatch of any of its
    /// keys (after a failure, an expired lease or a disconnected worker) until that is recorded.
    pub attempt: u32,
    /// What to do.
    pub work: UnitWork,
    /// For a service unit: the most of its changes whose NRP calls go side by side, what it counts
    /// against [`super::DispatchConfig::max_mutating_units_in_flight`] (0 for other units: a
    /// location unit's calls go one after the other, an observe is not counted).
    pub side_by_side: u32,
}

/// How a unit ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// NRP accepted everything.
    Applied,
    /// Failed; try again after at least `retry_after`.
    Retryable {
        /// Hint from NRP (Retry-After), zero if none.
        retry_after: Duration,
        /// Error code.
        code: String,
        /// Message.
        message: String,
    },
    /// Failed in a way that shows the actual state to be wrong, or leaves it unknown (the call may
    /// or may not have been applied): NRP is read back before the work is cut again, and it is
    /// never parked. Try again after at least `retry_after`.
    Repair {
        /// Hint from NRP (Retry-After), zero if none.
        retry_after: Duration,
        /// Error code.
        code: String,
        /// Message.
        message: String,
        /// NRP refused the work with a code the worker does not know: repaired once; refused again
        /// with the same code after the read-back, the work is held on the refusal schedule.
        refused: bool,
    },
    /// Failed for good until the desired state changes.
    Terminal {
        /// Error code.
        code: String,
        /// Message.
        message: String,
        /// For a service unit: the changes parked with an error of their own (a change not
        /// listed and not applied is parked with `code` and `message`).
        changes: Vec<ChangeError>,
    },
    /// Part of what an observe unit read (the last part completes it).
    Observed {
        /// NRP's state (this part of it).
        snapshot: ActualSnapshot,
        /// Whether this is the final part.
        last: bool,
    },
}

/// The terminal error of one change of a service unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeError {
    /// The change's index in the unit.
    pub index: u32,
    /// Its error code.
    pub code: String,
    /// Its message.
    pub message: String,
}

/// A worker's report on one unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The unit.
    pub work_id: u64,
    /// Indices of the changes NRP accepted when the unit as a whole did not go through.
    pub applied: Vec<u32>,
    /// For a service unit that did not go through as a whole: how far changes that are not in
    /// `applied` got in NRP (the actual state follows it).
    pub progress: Vec<ServiceProgress>,
    /// For a location unit: the addresses NRP refused on their own. A location change that went
    /// through went through except for these (after a partial update NRP keeps what it had for
    /// them; after a full one it does not have them); each is held on the refusal schedule.
    pub refused: Vec<AddressRefusal>,
    /// The outcome.
    pub outcome: Outcome,
}

/// One address of a location change that NRP refused on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressRefusal {
    /// The location change's index in the unit.
    pub index: u32,
    /// The address.
    pub address: std::net::IpAddr,
    /// NRP's error code.
    pub code: String,
    /// NRP's message.
    pub message: String,
}

/// How far one service change of a unit got in NRP although it did not go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceProgress {
    /// Index of the change in the unit.
    pub index: u32,
    /// The step it reached.
    pub step: ServiceStep,
}

/// What [`super::Dispatcher::on_report`] folded into the actual state: what the server keeps beside
/// the tracker (ports, frontends) follows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Folded {
    /// The service changes recorded as applied, in the unit's order; a deletion that removed the
    /// service's registration counts even if it stopped before its resources were gone (the
    /// service is no longer in NRP).
    pub services: Vec<ServiceChange>,
    /// Whether the report completed an observe whose snapshot became the actual state.
    pub observed: bool,
}
