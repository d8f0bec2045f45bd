//! What the translator has sent (the resync view's source), and [`SentView`]: a snapshot of it that
//! the sender builds its resync from without holding the lane's lock.
//!
//! The record is copy on write: the translator keeps it in an `Arc`, a snapshot is a clone of that
//! `Arc` (O(1)), and the translator's next change copies the map only while a snapshot is still
//! alive (the entries themselves are shared `Arc`s, copied one by one as they change).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use clb_proto::v1::{IpFamily, LoadBalancerSettings, ServicePort, Update};

use clb_client::updates;

use super::ObjKey;

/// What was sent for one Service: its ports, and one inbound identity per IP family
/// (`crate::families`).
#[derive(Debug, Clone)]
pub(super) struct SentService {
    pub(super) uid: String,
    pub(super) ports: Vec<ServicePort>,
    /// Primary family first.
    pub(super) units: Vec<SentUnit>,
}

/// One inbound identity sent for a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SentUnit {
    /// The identity: the UID, or `{uid}-v6` / `{uid}-v4` for a secondary family.
    pub(super) service_id: String,
    /// Its family (`Unspecified`: none stated, both families).
    pub(super) family: IpFamily,
    /// address → location, of its family.
    pub(super) endpoints: BTreeMap<IpAddr, IpAddr>,
    /// Its load balancer's settings (`crate::settings`).
    pub(super) settings: LoadBalancerSettings,
}

/// What was sent for one Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SentPod {
    pub(super) uid: String,
    pub(super) egress: String,
    /// The NAT gateway its egress brings (empty: none).
    pub(super) nat_gateway: String,
    /// address → location.
    pub(super) at: BTreeMap<IpAddr, IpAddr>,
}

/// Everything sent: what a resync carries.
#[derive(Debug, Clone, Default)]
pub(super) struct Sent {
    pub(super) services: BTreeMap<ObjKey, Arc<SentService>>,
    pub(super) pods: BTreeMap<ObjKey, Arc<SentPod>>,
}

/// A snapshot of what a translator has sent (see the module comment).
#[derive(Debug, Clone)]
pub struct SentView(pub(super) Arc<Sent>);

impl SentView {
    /// Everything sent so far, as a resync view: every inbound identity with its ports and its
    /// endpoints (as a level, when not empty; before the identity when it states a family), then
    /// every pod. Deterministic order.
    pub fn full_view(&self) -> Vec<Update> {
        let mut out = Vec::new();
        for s in self.0.services.values() {
            for u in &s.units {
                // An identity of a stated family: its endpoints first, so that a server that holds
                // it without a family (from a watcher before families) with endpoints of the other
                // family takes the new set before the family (it refuses a contradicted family).
                let endpoints_first = u.family != IpFamily::Unspecified;
                if endpoints_first && !u.endpoints.is_empty() {
                    out.push(level(&u.service_id, &u.endpoints));
                }
                out.push(service_add(u, &s.ports));
                if !endpoints_first && !u.endpoints.is_empty() {
                    out.push(level(&u.service_id, &u.endpoints));
                }
            }
        }
        for (key, p) in &self.0.pods {
            out.extend(pod_adds(key, p, None));
        }
        out
    }

    /// The pods sent at one location, as a node agent's resync view of it.
    pub fn pods_at(&self, location: IpAddr) -> Vec<Update> {
        let mut out = Vec::new();
        for (key, p) in &self.0.pods {
            out.extend(pod_adds(key, p, Some(location)));
        }
        out
    }

    /// Every location at which a pod was sent.
    pub fn pod_locations(&self) -> BTreeSet<IpAddr> {
        self.0
            .pods
            .values()
            .flat_map(|p| p.at.values().copied())
            .collect()
    }
}

pub(super) fn pod_adds(key: &ObjKey, p: &SentPod, only: Option<IpAddr>) -> Vec<Update> {
    let pod_key = key.to_string();
    p.at.iter()
        .filter(|(_, l)| only.is_none_or(|o| o == **l))
        .map(|(a, l)| {
            updates::pod_add_bringing(
                &a.to_string(),
                &l.to_string(),
                &p.egress,
                &pod_key,
                &p.uid,
                &p.nat_gateway,
            )
        })
        .collect()
}

/// No endpoints.
pub(super) static EMPTY: BTreeMap<IpAddr, IpAddr> = BTreeMap::new();

/// The `service_add` of one identity: with its family, when one is stated.
pub(super) fn service_add(unit: &SentUnit, ports: &[ServicePort]) -> Update {
    updates::service_add_with(&unit.service_id, ports, unit.family, &unit.settings)
}

pub(super) fn level(service_id: &str, endpoints: &BTreeMap<IpAddr, IpAddr>) -> Update {
    updates::endpoints_level(
        service_id,
        endpoints
            .iter()
            .map(|(a, l)| updates::endpoint(&a.to_string(), &l.to_string()))
            .collect(),
    )
}
