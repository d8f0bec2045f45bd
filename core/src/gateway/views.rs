//! What an operator reads of one gateway, as domain views: its status, one location, one service,
//! the pending diff, and the figures the state server's metrics sample. Each read is one method of
//! [`GatewayCore`] that answers one question whole, so the state server only maps the answer to
//! its wire types and never reaches into the tracker or the dispatcher.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::condition::Condition;
use super::gate::GateView;
use super::{GatewayCore, LbSettings, Port};
use crate::difftracker::view::{Counts, LocationView, ServiceView};
use crate::difftracker::{IpFamily, LocationDiff, ServiceChange, ServiceKind};
use crate::dispatch::{ErrorRecord, RefusedItem};

/// A gateway's status at a moment: sizes, work, errors, refused work and the restart gate.
#[derive(Debug, Clone)]
pub struct StatusView {
    /// The desired state's revision.
    pub revision: u64,
    /// Sizes of the desired and actual state.
    pub counts: Counts,
    /// Units leased out.
    pub units_in_flight: usize,
    /// Units parked after a terminal error.
    pub parked_units: usize,
    /// The dispatcher's recent errors, in no particular order.
    pub last_errors: Vec<ErrorRecord>,
    /// Age of the oldest change NRP has not confirmed (zero: none).
    pub oldest_pending_age: Duration,
    /// Work held on the refusal schedule, addresses first, at most the limit asked for.
    pub refused: Vec<RefusedItem>,
    /// Every address held on the refusal schedule.
    pub refused_addresses: usize,
    /// The restart gate.
    pub gate: GateView,
}

/// One location, both sides, with the hold of each address NRP refused on its own.
#[derive(Debug, Clone)]
pub struct LocationStatus {
    /// Both sides of the location.
    pub view: LocationView,
    /// The hold of each refused address of the location.
    pub refused: HashMap<IpAddr, RefusedItem>,
}

/// What the gateway keeps of an egress's brought NAT gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressStatus {
    /// The brought NAT gateway's resource ID (`None`: clb's own).
    pub nat_gateway: Option<String>,
    /// Whether the last read-back found the brought NAT gateway missing.
    pub nat_gateway_missing: bool,
}

/// One service: both sides, and beside them what the gateway keeps of it.
#[derive(Debug, Clone)]
pub struct ServiceStatus {
    /// Both sides of the service.
    pub view: ServiceView,
    /// The IP family of an inbound service (`None`: unspecified, IPv4).
    pub family: Option<IpFamily>,
    /// The desired ports of an inbound service (empty otherwise).
    pub ports: Vec<Port>,
    /// The desired load balancer settings of an inbound service.
    pub settings: Option<LbSettings>,
    /// The frontend IP of an inbound service while NRP has it.
    pub frontend: Option<String>,
    /// The locations NRP has the service at; `None` when not counted (it scans every location).
    pub actual_locations: Option<u64>,
    /// An egress's brought NAT gateway (`None` for an inbound service).
    pub egress: Option<EgressStatus>,
    /// Where its programming stands; `None` when not derived.
    pub condition: Option<Condition>,
}

/// What the gateway would still send, at most a limit of each list.
#[derive(Debug, Clone)]
pub struct PendingView {
    /// The desired state's revision.
    pub revision: u64,
    /// Service changes with the IP family of each service.
    pub services: Vec<(ServiceChange, Option<IpFamily>)>,
    /// Location changes.
    pub locations: Vec<LocationDiff>,
    /// Whether either list was cut at the limit.
    pub truncated: bool,
    /// Work held on the refusal schedule (at most the limit).
    pub refused: Vec<RefusedItem>,
}

/// The figures the state server's metrics sample of a gateway.
#[derive(Debug, Clone)]
pub struct LoadView {
    /// The desired state's revision.
    pub revision: u64,
    /// Sizes of the desired and actual state.
    pub counts: Counts,
    /// Units leased out.
    pub units_in_flight: usize,
    /// Units parked after a terminal error.
    pub parked_units: usize,
    /// Age of the oldest change NRP has not confirmed (zero: none).
    pub oldest_pending_age: Duration,
    /// Pacing: see [`PacingView`].
    pub pacing: PacingView,
    /// Refused work held, by NRP's code, in code order.
    pub refused_by_code: std::collections::BTreeMap<String, u64>,
    /// Brought NAT gateways an observe found missing.
    pub missing_nat_gateways: usize,
}

/// How the gateway paces its writes now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacingView {
    /// The subscription's remaining writes as last estimated (`None`: none reported).
    pub remaining_writes: Option<u32>,
    /// The batching window chosen (`None`: not paced).
    pub batching_window: Option<Duration>,
    /// The headway between location units (`None`: none).
    pub unit_headway: Option<Duration>,
}

impl GatewayCore {
    /// The gateway's status at `now`, with at most `refused_limit` refused items.
    pub fn status(&self, now: Instant, refused_limit: usize) -> StatusView {
        StatusView {
            revision: self.tracker.revision(),
            counts: self.tracker.counts(),
            units_in_flight: self.dispatch.units_in_flight(),
            parked_units: self.dispatch.parked_units(),
            last_errors: self.dispatch.last_errors(),
            oldest_pending_age: self.dispatch.oldest_pending_age(now).unwrap_or_default(),
            refused: self.dispatch.refused_items(refused_limit),
            refused_addresses: self.dispatch.refused_address_count(),
            gate: self.gate_view(now),
        }
    }

    /// The figures the metrics sample at `now`.
    pub fn load(&self, now: Instant) -> LoadView {
        LoadView {
            revision: self.tracker.revision(),
            counts: self.tracker.counts(),
            units_in_flight: self.dispatch.units_in_flight(),
            parked_units: self.dispatch.parked_units(),
            oldest_pending_age: self.dispatch.oldest_pending_age(now).unwrap_or_default(),
            pacing: self.pacing(),
            refused_by_code: self.dispatch.refused_by_code().into_iter().collect(),
            missing_nat_gateways: self.missing_nat_gateways(),
        }
    }

    /// How the gateway paces its writes now.
    pub fn pacing(&self) -> PacingView {
        PacingView {
            remaining_writes: self.dispatch.remaining_writes(),
            batching_window: self.dispatch.batching_window(),
            unit_headway: self.dispatch.unit_headway(),
        }
    }

    /// Units leased out now.
    pub fn units_in_flight(&self) -> usize {
        self.dispatch.units_in_flight()
    }

    /// Both sides of `location` with its refused addresses; `None` when it is neither desired nor
    /// in NRP.
    pub fn location_status(&self, location: IpAddr) -> Option<LocationStatus> {
        let view = self.tracker.location_view(location)?;
        let refused = view
            .addresses
            .iter()
            .filter_map(|a| {
                let held = self.dispatch.refused_address(view.location, a.address)?;
                Some((a.address, held))
            })
            .collect();
        Some(LocationStatus { view, refused })
    }

    /// Everything known of service `name` (any case): both sides, what is kept beside them, the
    /// locations NRP has it at (a scan of every location) and its condition; `None` when the
    /// gateway does not know it.
    pub fn service_status(&self, name: &str) -> Option<ServiceStatus> {
        let view = self.tracker.service_view(name)?;
        let mut status = self.service_status_of(&view);
        status.actual_locations = Some(self.tracker.actual_locations_of(&view.name));
        let frontend = status.frontend.as_deref().unwrap_or_default();
        status.condition = Some(self.service_condition(&view, frontend));
        Some(status)
    }

    /// What is kept beside the service of `view`, without the scan of
    /// [`GatewayCore::service_status`] nor the condition: what a stream of every service sends.
    pub fn service_status_of(&self, view: &ServiceView) -> ServiceStatus {
        let inbound = view.kind == ServiceKind::Inbound;
        let spec = self.service_specs.get(&view.name).filter(|_| inbound);
        ServiceStatus {
            view: view.clone(),
            family: self.tracker.service_family(&view.name),
            ports: spec.map(|s| s.ports.clone()).unwrap_or_default(),
            settings: spec.and_then(|s| s.settings.clone()),
            frontend: self
                .frontend(&view.name)
                .filter(|_| inbound && view.actual)
                .map(str::to_owned),
            actual_locations: None,
            egress: (!inbound).then(|| self.egress_status(&view.name)),
            condition: None,
        }
    }

    /// What the gateway keeps of egress `name`'s brought NAT gateway.
    pub fn egress_status(&self, name: &str) -> EgressStatus {
        EgressStatus {
            nat_gateway: self.tracker.egress_nat_gateway(name).map(str::to_owned),
            nat_gateway_missing: self.nat_gateway_missing(name),
        }
    }

    /// The IP family of service `name` (`None`: unspecified, IPv4, or unknown).
    pub fn service_family(&self, name: &str) -> Option<IpFamily> {
        self.tracker.service_family(name)
    }

    /// What the gateway would still send: at most `limit` service changes and location changes,
    /// and at most `limit` refused items.
    pub fn pending(&self, limit: usize) -> PendingView {
        let diff = self.tracker.pending_diff();
        let truncated = diff.services.len() > limit || diff.locations.len() > limit;
        PendingView {
            revision: self.tracker.revision(),
            services: diff
                .services
                .into_iter()
                .take(limit)
                .map(|s| {
                    let family = self.tracker.service_family(&s.name);
                    (s, family)
                })
                .collect(),
            locations: diff.locations.into_iter().take(limit).collect(),
            truncated,
            refused: self.dispatch.refused_items(limit),
        }
    }
}
