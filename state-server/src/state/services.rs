//! What `WatchServices` streams read of a gateway without its lock: every service's
//! writer-facing state as a domain record ([`ServiceRecord`]; the gRPC edge turns it into proto
//! when it sends), published by the gateway's task ([`crate::state::push`]) after changes, at most
//! every [`crate::state::push::SNAPSHOT_SPACING`], and only while a stream follows it.
//!
//! Each publication carries its sequence and the delta from the one before it: the task compares
//! once, outside the gateway's lock, for every follower; a follower one publication behind applies
//! the delta (and skips at no cost a delta of services it does not follow), and only a follower
//! that missed publications compares the full maps.

use std::collections::HashMap;
use std::sync::Arc;

use clb_core::difftracker::IpFamily;
use clb_core::difftracker::identity::ServiceKind;
use clb_core::difftracker::view::ServiceView;
use clb_core::gateway::condition::{Condition, HeldRemovals};
use clb_core::gateway::{GatewayCore, LbSettings, Port};

/// One service's writer-facing state: what `Admin.GetService` shows, condition included, its
/// locations with NRP not counted (that costs a scan of every location).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRecord {
    /// The tracker's view (canonical name, kind, both sides' counts).
    pub view: ServiceView,
    /// The desired ports (inbound only).
    pub ports: Vec<Port>,
    /// The frontend IP while NRP has the inbound service (empty: unknown).
    pub frontend_ip: String,
    /// The IP family stated for an inbound service.
    pub family: Option<IpFamily>,
    /// The desired load balancer settings (inbound only).
    pub settings: Option<LbSettings>,
    /// The programming condition.
    pub condition: Condition,
    /// An egress's brought NAT gateway (empty: clb's own).
    pub nat_gateway: String,
    /// The last read-back did not find the egress's brought NAT gateway.
    pub nat_gateway_missing: bool,
}

impl ServiceRecord {
    /// The record of the service `view` of `g`.
    pub fn of(g: &GatewayCore, view: ServiceView, held: &HeldRemovals) -> Self {
        let inbound = view.kind == ServiceKind::Inbound;
        let ports = match g.service_ports(&view.name) {
            Some(ports) if inbound => ports.to_vec(),
            _ => Vec::new(),
        };
        let frontend_ip = match g.frontend(&view.name) {
            Some(ip) if inbound && view.actual => ip.to_owned(),
            _ => String::new(),
        };
        let condition = g.service_condition_among(&view, &frontend_ip, held);
        let (nat_gateway, nat_gateway_missing) = if inbound {
            (String::new(), false)
        } else {
            let egress = g.egress_status(&view.name);
            (
                egress.nat_gateway.unwrap_or_default(),
                egress.nat_gateway_missing,
            )
        };
        Self {
            family: g.service_family(&view.name),
            settings: g.service_settings(&view.name).filter(|_| inbound).cloned(),
            ports,
            frontend_ip,
            condition,
            nat_gateway,
            nat_gateway_missing,
            view,
        }
    }
}

/// The services of one kind, by canonical name.
pub type Records = HashMap<String, Arc<ServiceRecord>>;

/// What changed in one kind of service between two publications.
#[derive(Debug, Default, Clone)]
pub struct KindDelta {
    /// New or changed services.
    pub changed: Vec<Arc<ServiceRecord>>,
    /// Services no longer listed, by name.
    pub gone: Vec<String>,
}

impl KindDelta {
    /// What changed from `before` to `now`.
    pub fn between(before: &Records, now: &Records) -> Self {
        let mut changed: Vec<Arc<ServiceRecord>> = now
            .iter()
            .filter(|(id, r)| before.get(*id) != Some(*r))
            .map(|(_, r)| r.clone())
            .collect();
        changed.sort_by(|a, b| a.view.name.cmp(&b.view.name));
        let mut gone: Vec<String> = before
            .keys()
            .filter(|id| !now.contains_key(*id))
            .cloned()
            .collect();
        gone.sort();
        Self { changed, gone }
    }

    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.gone.is_empty()
    }
}

/// One publication of a gateway's services.
#[derive(Debug, Default)]
pub struct ServicesSnapshot {
    /// The gateway's change counter it was built at ([`super::GatewayHandle::changes`]).
    pub changes: u64,
    /// Numbers the publications (the first is 1; 0: nothing published yet).
    pub seq: u64,
    /// Whether NRP was read back since the state started.
    pub nrp_observed: bool,
    /// Every inbound service.
    pub inbound: Arc<Records>,
    /// Every outbound service (egress).
    pub outbound: Arc<Records>,
    /// Inbound services changed since publication `seq - 1`.
    pub inbound_delta: KindDelta,
    /// Outbound services changed since publication `seq - 1`.
    pub outbound_delta: KindDelta,
}

/// What the gateway's task reads under the gateway's lock to publish: every record, unsorted.
#[derive(Debug)]
pub struct Gathered {
    changes: u64,
    nrp_observed: bool,
    inbound: Vec<ServiceRecord>,
    outbound: Vec<ServiceRecord>,
}

/// Reads `g`'s services at change counter `changes` (under its lock; the comparison is
/// [`publication`]'s, after the lock).
pub fn gather(g: &GatewayCore, changes: u64) -> Gathered {
    // The restart gate's held-back removals, read once for every service's condition.
    let held = g.held_removals();
    let read = |kind| {
        g.service_views(kind)
            .map(|view| ServiceRecord::of(g, view, &held))
            .collect()
    };
    Gathered {
        changes,
        nrp_observed: g.nrp_observed(),
        inbound: read(ServiceKind::Inbound),
        outbound: read(ServiceKind::Outbound),
    }
}

/// The publication after `before` of what was `gathered`. A record equal to the one published
/// before keeps its allocation.
pub fn publication(before: &ServicesSnapshot, gathered: Gathered) -> ServicesSnapshot {
    let keep = |before: &Records, records: Vec<ServiceRecord>| -> Records {
        records
            .into_iter()
            .map(|r| {
                let name = r.view.name.clone();
                let arc = match before.get(&name) {
                    Some(old) if **old == r => old.clone(),
                    _ => Arc::new(r),
                };
                (name, arc)
            })
            .collect()
    };
    let inbound = keep(&before.inbound, gathered.inbound);
    let outbound = keep(&before.outbound, gathered.outbound);
    ServicesSnapshot {
        changes: gathered.changes,
        seq: before.seq + 1,
        nrp_observed: gathered.nrp_observed,
        inbound_delta: KindDelta::between(&before.inbound, &inbound),
        outbound_delta: KindDelta::between(&before.outbound, &outbound),
        inbound: Arc::new(inbound),
        outbound: Arc::new(outbound),
    }
}
