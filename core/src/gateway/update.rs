//! Writers' updates as the gateway takes them: one [`Update`] per change (borrowing the strings of
//! the message it came from, so a batch is applied without copying them), the rights of the writer
//! ([`Rights`]), what was refused and why ([`ItemFault`]), and the two ways to apply them: a batch
//! ([`GatewayCore::apply`](super::GatewayCore::apply)) and a resync that replaces a scope
//! ([`GatewayCore::replace_scope`](super::GatewayCore::replace_scope)).
//!
//! The wire layer maps its messages to [`Update`]s; what it cannot map (a missing kind, an unknown
//! operation, ports that are not ports) it passes as a [`Refusal`] that still names the object, so
//! that a resync keeps a malformed report's object instead of removing a live backend.

use std::collections::HashSet;
use std::net::IpAddr;

use super::{Port, Scope};
use crate::difftracker::identity::normalize_identity;
use crate::difftracker::ip::parse_ip;
use crate::difftracker::{DiffTracker, Endpoint, InvalidInput, IpFamily, Operation, PodUpdate};

/// The kind of an update, named as the wire names it (`service`, `egress`, `endpoints`, `pod`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateKind {
    /// An inbound service (a load balancer).
    Service,
    /// An egress (an outbound identity: a NAT gateway).
    Egress,
    /// The endpoints of an inbound service.
    Endpoints,
    /// A pod's address, location and egress.
    Pod,
}

impl UpdateKind {
    /// The field name of the kind.
    pub fn name(self) -> &'static str {
        match self {
            Self::Service => "service",
            Self::Egress => "egress",
            Self::Endpoints => "endpoints",
            Self::Pod => "pod",
        }
    }

    fn covered_by(self, scope: &Scope) -> bool {
        match self {
            Self::Service => scope.services,
            Self::Egress => scope.egresses,
            Self::Endpoints => scope.endpoints,
            Self::Pod => scope.pods,
        }
    }
}

/// A change of the endpoints of an inbound service.
#[derive(Debug, Clone)]
pub enum EndpointsChange<'a> {
    /// The whole list.
    Level(Vec<Endpoint<'a>>),
    /// What changed: the list before and after.
    Edge {
        /// The endpoints before.
        old: Vec<Endpoint<'a>>,
        /// The endpoints after.
        new: Vec<Endpoint<'a>>,
    },
}

/// One change to a gateway's desired state.
#[derive(Debug, Clone)]
pub enum Update<'a> {
    /// Adds (with its ports) or removes an inbound service.
    Service {
        /// Add or remove.
        operation: Operation,
        /// The service's identity.
        id: &'a str,
        /// Its ports (for an add; already checked to be ports).
        ports: Vec<Port>,
        /// Its IP family (for an add); `None`: not stated.
        family: Option<IpFamily>,
        /// Its load balancer's settings (for an add; already checked).
        settings: super::LbSettings,
    },
    /// Declares or removes an egress.
    Egress {
        /// Add or remove.
        operation: Operation,
        /// The egress's identity.
        id: &'a str,
    },
    /// Sets or changes the endpoints of an inbound service.
    Endpoints {
        /// The service's identity.
        service: &'a str,
        /// The change.
        change: EndpointsChange<'a>,
    },
    /// Adds or removes a pod.
    Pod {
        /// Add or remove.
        operation: Operation,
        /// The pod.
        pod: PodUpdate<'a>,
    },
}

impl Update<'_> {
    /// Its kind.
    pub fn kind(&self) -> UpdateKind {
        match self {
            Self::Service { .. } => UpdateKind::Service,
            Self::Egress { .. } => UpdateKind::Egress,
            Self::Endpoints { .. } => UpdateKind::Endpoints,
            Self::Pod { .. } => UpdateKind::Pod,
        }
    }

    fn named(&self) -> Named<'_> {
        match self {
            Self::Service { id, .. } => Named::Service(id),
            Self::Egress { id, .. } => Named::Egress(id),
            Self::Endpoints { service, .. } => Named::Endpoints(service),
            Self::Pod { pod, .. } => Named::Pod {
                address: pod.address,
                location: pod.location,
            },
        }
    }

    fn operation(&self) -> Option<Operation> {
        match self {
            Self::Service { operation, .. }
            | Self::Egress { operation, .. }
            | Self::Pod { operation, .. } => Some(*operation),
            Self::Endpoints { .. } => None,
        }
    }
}

/// What a refused update names, as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named<'a> {
    /// Nothing (no kind was set).
    Nothing,
    /// An inbound service.
    Service(&'a str),
    /// An egress.
    Egress(&'a str),
    /// The endpoints of an inbound service.
    Endpoints(&'a str),
    /// A pod.
    Pod {
        /// Its address.
        address: &'a str,
        /// Its location.
        location: &'a str,
    },
}

impl Named<'_> {
    fn kind(&self) -> Option<UpdateKind> {
        match self {
            Self::Nothing => None,
            Self::Service(_) => Some(UpdateKind::Service),
            Self::Egress(_) => Some(UpdateKind::Egress),
            Self::Endpoints(_) => Some(UpdateKind::Endpoints),
            Self::Pod { .. } => Some(UpdateKind::Pod),
        }
    }
}

/// An update the wire layer could not map, with the object it names.
#[derive(Debug, Clone)]
pub struct Refusal<'a> {
    /// What it names.
    pub named: Named<'a>,
    /// Why it was refused.
    pub fault: Fault,
}

/// One item of a batch or a view: an update, or one refused before it got here.
pub type Item<'a> = Result<Update<'a>, Refusal<'a>>;

/// Why an item was refused. Field paths are relative to the item (`pod.address`); the wire layer
/// puts its own path in front (`updates[3].pod.address`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The DiffTracker refused it; `within` is the path of the message the error's field belongs
    /// to (`pod`, `endpoints.level`).
    Domain {
        /// The path of the message the field belongs to.
        within: String,
        /// The tracker's error (boxed: a fault travels in every `Result` of the hot path).
        error: Box<InvalidInput>,
    },
    /// A rule of the gateway refused it.
    Field {
        /// The path of the field at fault.
        field: String,
        /// The value at fault (the wire layer quotes an excerpt).
        value: String,
        /// Why.
        reason: String,
    },
}

impl Fault {
    fn field(
        field: impl Into<String>,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self::Field {
            field: field.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }
}

/// A refused item: its position in the batch (or across the whole view) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemFault {
    /// Its position.
    pub index: usize,
    /// Why.
    pub fault: Fault,
}

/// What a writer may change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rights {
    /// Anything.
    Any,
    /// Only pods, and only at the locations of this node (a node agent bound to its node).
    Node(String),
}

/// What a batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// Updates applied.
    pub applied: u32,
    /// Items refused, in order.
    pub rejected: Vec<ItemFault>,
}

/// What a resync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResyncOutcome {
    /// Updates of the view that were applied.
    pub applied: u32,
    /// Objects of the scope removed because the view did not name them.
    pub removed: u32,
    /// Items of the view that were refused, in order.
    pub rejected: Vec<ItemFault>,
}

/// Applies one update to `tracker`; on error nothing of it was applied.
pub fn apply_one(tracker: &mut DiffTracker, update: &Update<'_>) -> Result<(), Fault> {
    let kind = update.kind().name();
    let domain = |within: &str, error| Fault::Domain {
        within: within.to_owned(),
        error: Box::new(error),
    };
    match update {
        Update::Service {
            operation,
            id,
            family,
            ..
        } => tracker
            .update_service_family(*operation, id, *family)
            .map_err(|e| domain(kind, e)),
        Update::Egress { operation, id } => tracker
            .update_egress(*operation, id)
            .map_err(|e| domain(kind, e)),
        Update::Endpoints { service, change } => {
            // `service_id` belongs to the endpoints message; the lists to its `level` or `edge`.
            let (result, within) = match change {
                EndpointsChange::Level(list) => (tracker.set_endpoints(service, list), "level"),
                EndpointsChange::Edge { old, new } => {
                    (tracker.update_endpoints(service, old, new), "edge")
                }
            };
            result.map_err(|e| {
                if e.field == "service_id" {
                    domain(kind, e)
                } else {
                    domain(&format!("{kind}.{within}"), e)
                }
            })
        }
        Update::Pod { operation, pod } => tracker
            .update_pod(*operation, pod)
            .map_err(|e| domain(kind, e)),
    }
}

/// Node binding: a writer bound to `node` writes only pods, and only at that node's locations as
/// the cluster watcher's topology declares them. A malformed location is left to the usual
/// validation.
pub(super) fn node_check(
    node_of: impl Fn(IpAddr) -> Option<String>,
    node: &str,
    named: &Named<'_>,
) -> Result<(), Fault> {
    let Some(kind) = named.kind() else {
        return Ok(());
    };
    let Named::Pod { location, .. } = named else {
        return Err(Fault::field(
            kind.name(),
            "",
            format!(
                "the node agent of node {node:?} may write only pods (at its node's locations)"
            ),
        ));
    };
    let Ok(at) = parse_ip("location", location) else {
        return Ok(());
    };
    match node_of(at) {
        Some(owner) if owner == node => Ok(()),
        owner => Err(Fault::field(
            "pod.location",
            *location,
            match owner {
                Some(other) => format!(
                    "is a location of node {other:?}: the node agent of node {node:?} may write \
                     pods only at its own node's locations"
                ),
                None => format!(
                    "is not a location of node {node:?} in the topology the cluster watcher \
                     declared (none declared yet, or another node's): the node agent of node \
                     {node:?} may write pods only at its own node's locations"
                ),
            },
        )),
    }
}

/// The named of an item.
pub(super) fn named<'a>(item: &'a Item<'a>) -> Named<'a> {
    match item {
        Ok(update) => update.named(),
        Err(refusal) => refusal.named,
    }
}

/// What a view names, in canonical form. An object named by an item of the scope is kept even
/// when that item is refused: a malformed report must not delete a live backend.
#[derive(Debug, Default)]
struct Reported {
    services: HashSet<String>,
    egresses: HashSet<String>,
    endpoints: HashSet<String>,
    pods: HashSet<IpAddr>,
}

fn canonical_id(id: &str) -> Option<String> {
    normalize_identity("id", id).ok().map(|c| c.into_owned())
}

/// Checks that an item of a view is inside the scope and describes what exists, noting the object
/// it names; then applies it.
fn apply_view_item(
    tracker: &mut DiffTracker,
    scope: &Scope,
    item: &Item<'_>,
    reported: &mut Reported,
) -> Result<(), Fault> {
    let named = named(item);
    let Some(kind) = named.kind() else {
        return match item {
            Ok(update) => apply_one(tracker, update),
            Err(refusal) => Err(refusal.fault.clone()),
        };
    };
    if !kind.covered_by(scope) {
        return Err(Fault::field(
            kind.name(),
            "",
            format!("is outside the resync scope ({scope})"),
        ));
    }
    match named {
        Named::Nothing => {}
        Named::Service(id) => reported.services.extend(canonical_id(id)),
        Named::Egress(id) => reported.egresses.extend(canonical_id(id)),
        Named::Endpoints(id) => {
            reported.endpoints.extend(canonical_id(id));
            if let Ok(Update::Endpoints {
                change: EndpointsChange::Edge { .. },
                ..
            }) = item
            {
                return Err(Fault::field(
                    "endpoints.edge",
                    "",
                    "a resync view must give endpoints as a level, not as an edge",
                ));
            }
        }
        Named::Pod { address, location } => {
            if let (Some(want), Ok(at)) = (scope.location, parse_ip("location", location))
                && want != at
            {
                return Err(Fault::field(
                    "pod.location",
                    location,
                    format!("is outside the resync scope, which covers only the pods at {want}"),
                ));
            }
            reported.pods.extend(parse_ip("address", address).ok());
        }
    }
    let update = item.as_ref().map_err(|refusal| refusal.fault.clone())?;
    if update.operation().is_some_and(|op| op != Operation::Add) {
        return Err(Fault::field(
            format!("{}.operation", kind.name()),
            "OPERATION_REMOVE",
            "a resync view describes what exists: only OPERATION_ADD is allowed",
        ));
    }
    apply_one(tracker, update)
}

/// Replaces the scope's desired state with the view: applies every valid item of the view, then
/// removes what the scope holds but the view does not name. Objects outside the scope are left
/// alone. Returns, beside the outcome, whether each item was applied.
pub fn replace_scope(
    tracker: &mut DiffTracker,
    scope: &Scope,
    view: &[Item<'_>],
) -> (ResyncOutcome, Vec<bool>) {
    let mut out = ResyncOutcome::default();
    let mut applied = Vec::with_capacity(view.len());
    let mut reported = Reported::default();
    for (index, item) in view.iter().enumerate() {
        match apply_view_item(tracker, scope, item, &mut reported) {
            Ok(()) => {
                out.applied += 1;
                applied.push(true);
            }
            Err(fault) => {
                out.rejected.push(ItemFault { index, fault });
                applied.push(false);
            }
        }
    }
    if scope.services {
        for id in tracker.desired_inbound_identities() {
            if !reported.services.contains(&id)
                && tracker.update_service(Operation::Remove, &id).is_ok()
            {
                out.removed += 1;
            }
        }
    }
    if scope.egresses {
        for id in tracker.declared_egresses() {
            if !reported.egresses.contains(&id)
                && tracker.update_egress(Operation::Remove, &id).is_ok()
            {
                out.removed += 1;
            }
        }
    }
    if scope.endpoints {
        for id in tracker.services_with_endpoints() {
            if !reported.endpoints.contains(&id) && tracker.set_endpoints(&id, &[]).is_ok() {
                out.removed += 1;
            }
        }
    }
    if scope.pods {
        for (address, location) in tracker.pods(scope.location) {
            if reported.pods.contains(&address) {
                continue;
            }
            let (address, location) = (address.to_string(), location.to_string());
            let pod = PodUpdate {
                address: &address,
                location: &location,
                outbound_identity: "",
                uid: "",
                ..Default::default()
            };
            if tracker.update_pod(Operation::Remove, &pod).is_ok() {
                out.removed += 1;
            }
        }
    }
    (out, applied)
}
