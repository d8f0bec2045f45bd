//! OpenYurt's PoolService (`network.openyurt.io/v1alpha1`): one Service's load balancer in one node
//! pool, both layers.
//!
//! - **First layer (ours)**: with `--pool-services`, the watcher creates one PoolService per
//!   (Service, selected gateway), named `<service>-<pool>` in the Service's namespace, of our
//!   `loadBalancerClass`, labelled [`LABEL_SERVICE_NAME`] / [`LABEL_POOL_NAME`] and
//!   [`LABEL_MANAGED_BY`], with a controller ownerReference to the Service; it deletes the ones of
//!   pools no longer selected.
//! - **Second layer**: a PoolService of our class that someone else created (OpenYurt's
//!   controller; no ownerReference of ours) exposes its Service (label [`LABEL_SERVICE_NAME`]) at
//!   its pool's gateway (`spec.nodepoolName`, else label [`LABEL_POOL_NAME`]).
//!
//! Either way the watcher writes each one's status (`status_of`): `loadBalancer.ingress` (the
//! pool's gateway's frontend IP of each of the Service's IP families once programmed, IPv4 first)
//! and a `Ready` condition (`True` once every family is programmed).

use clb_proto::v1::{IpFamily, ServiceState};
use k8s_openapi::api::core::v1::LoadBalancerStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::ingress::{self, IngressEntry};
use crate::translate::ObjKey;

/// OpenYurt's label naming a PoolService's Service.
pub const LABEL_SERVICE_NAME: &str = "openyurt.io/service-name";
/// OpenYurt's label naming a PoolService's node pool.
pub const LABEL_POOL_NAME: &str = "openyurt.io/pool-name";
/// The label on the PoolServices the watcher creates.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "clb-watcher";
/// The type of the condition written on PoolServices.
pub const READY: &str = "Ready";

/// The desired state of a PoolService (OpenYurt's `PoolServiceSpec`).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "network.openyurt.io",
    version = "v1alpha1",
    kind = "PoolService",
    plural = "poolservices",
    shortname = "ps",
    namespaced,
    status = "PoolServiceStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct PoolServiceSpec {
    /// Inherited from the Service's `spec.loadBalancerClass`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer_class: Option<String>,
    /// The node pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodepool_name: Option<String>,
}

/// The observed state of a PoolService (OpenYurt's `PoolServiceStatus`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolServiceStatus {
    /// The load balancer in the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerStatus>,
    /// Current state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}

/// What the watcher needs of a PoolService of our class.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PoolServiceFacts {
    pub key: ObjKey,
    pub uid: String,
    /// Why someone else's PoolService cannot be programmed (for a Warning Event), if it cannot.
    pub problem: Option<String>,
    pub resource_version: String,
    /// The UID of the Service that owns it when the watcher created it (`None`: someone else's).
    pub owner_uid: Option<String>,
    /// Its Service (same namespace), if it names one.
    pub service: Option<ObjKey>,
    /// Its node pool, if it names one.
    pub pool: Option<String>,
    /// `status.loadBalancer.ingress`.
    pub ingress: Vec<IngressEntry>,
    /// `status.conditions`.
    pub conditions: Vec<Condition>,
}

impl PoolServiceFacts {
    /// The facts of `ps` when it is of class `class`; `None` otherwise.
    pub(crate) fn of(ps: &PoolService, class: &str) -> Option<Self> {
        if ps.spec.load_balancer_class.as_deref() != Some(class) {
            return None;
        }
        let namespace = ps.metadata.namespace.clone()?;
        let name = ps.metadata.name.clone()?;
        let labels = ps.metadata.labels.clone().unwrap_or_default();
        let managed = labels.get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY);
        let owner_uid = ps
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| managed && o.kind == "Service" && o.api_version == "v1")
            .map(|o| o.uid.clone());
        let service = labels
            .get(LABEL_SERVICE_NAME)
            .filter(|s| !s.is_empty())
            .map(|s| ObjKey {
                namespace: namespace.clone(),
                name: s.clone(),
            });
        let pool = ps
            .spec
            .nodepool_name
            .clone()
            .or_else(|| labels.get(LABEL_POOL_NAME).cloned())
            .filter(|p| !p.is_empty());
        let status = ps.status.clone().unwrap_or_default();
        Some(Self {
            key: ObjKey { namespace, name },
            uid: ps.metadata.uid.clone().unwrap_or_default(),
            problem: None,
            resource_version: ps.metadata.resource_version.clone().unwrap_or_default(),
            owner_uid,
            service,
            pool,
            ingress: ingress::entries(status.load_balancer.as_ref()),
            conditions: status.conditions.unwrap_or_default(),
        })
    }
}

/// What the watcher writes on a PoolService: its gateway's report of each of the Service's IP
/// families, as the Service's own status is (one PoolService per pool, listing every family).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PoolStatus {
    /// `status.loadBalancer.ingress`: the frontend IP of every programmed family, IPv4 first.
    pub ips: Vec<String>,
    /// The `Ready` condition's status: `True` once every family is programmed.
    pub ready: bool,
    /// Its reason: `Programmed` or `Pending`.
    pub reason: &'static str,
    /// Its message: the gateway, and each family's frontend or that it is pending.
    pub message: String,
}

/// The status of a PoolService at `gateway` from that gateway's report of each of the Service's
/// identities (`families`: one per IP family, primary first; `None` while the gateway does not
/// know it). A family is programmed when NRP has its service with a frontend IP.
pub(crate) fn status_of(
    gateway: &str,
    families: &[(IpFamily, Option<ServiceState>)],
) -> PoolStatus {
    let programmed = |s: &Option<ServiceState>| {
        s.as_ref()
            .filter(|s| s.actual && !s.frontend_ip.is_empty())
            .map(|s| s.frontend_ip.clone())
    };
    let ips = ingress::ordered(families.iter().filter_map(|(_, s)| programmed(s)));
    let pending: Vec<&str> = families
        .iter()
        .filter(|(_, s)| programmed(s).is_none())
        .map(|(f, _)| family_name(*f))
        .collect();
    // Families are named only when the Service has two.
    let named = families.len() > 1;
    let ready = !families.is_empty() && pending.is_empty();
    let message = if ready {
        let at: Vec<String> = ips
            .iter()
            .map(|ip| match (named, ip.parse::<std::net::IpAddr>()) {
                (true, Ok(a)) => format!("{ip} ({})", if a.is_ipv6() { "IPv6" } else { "IPv4" }),
                _ => ip.clone(),
            })
            .collect();
        format!(
            "gateway {gateway:?} serves the pool's load balancer at {}",
            at.join(" and ")
        )
    } else if named {
        format!(
            "gateway {gateway:?} has not programmed the pool's {} load balancer yet",
            pending.join(" and ")
        )
    } else {
        format!("gateway {gateway:?} has not programmed the pool's load balancer yet")
    };
    PoolStatus {
        ips,
        ready,
        reason: if ready { "Programmed" } else { "Pending" },
        message,
    }
}

fn family_name(f: IpFamily) -> &'static str {
    match f {
        IpFamily::Ipv6 => "IPv6",
        IpFamily::Ipv4 => "IPv4",
        _ => "unspecified-family",
    }
}

/// The name of the PoolService of Service `service` in pool `pool`: `<service>-<pool>`, lowercased,
/// characters a name may not hold replaced by `-`, cut to 253 characters.
pub fn name_for(service: &str, pool: &str) -> String {
    let raw = format!("{service}-{pool}").to_ascii_lowercase();
    let mut name: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(253)
        .collect();
    while name.ends_with(['-', '.']) {
        name.pop();
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid() {
        assert_eq!(name_for("web", "pool-a"), "web-pool-a");
        assert_eq!(name_for("web", "Pool_A"), "web-pool-a");
        assert_eq!(name_for("web", &"x".repeat(300)).len(), 253);
    }

    fn at(family: IpFamily, ip: &str) -> (IpFamily, Option<ServiceState>) {
        let state = ServiceState {
            actual: !ip.is_empty(),
            frontend_ip: ip.to_owned(),
            ip_family: family as i32,
            ..ServiceState::default()
        };
        (family, Some(state))
    }

    #[test]
    fn a_single_stack_pool_service_shows_its_one_frontend() {
        let s = status_of("a", &[at(IpFamily::Ipv4, "20.0.0.1")]);
        assert_eq!(s.ips, ["20.0.0.1"]);
        assert!(s.ready);
        assert_eq!(s.reason, "Programmed");
        assert_eq!(
            s.message,
            "gateway \"a\" serves the pool's load balancer at 20.0.0.1"
        );
        // No stated family (an API server before dual stack): the same.
        let s = status_of("a", &[at(IpFamily::Unspecified, "20.0.0.1")]);
        assert_eq!(
            (s.ips.as_slice(), s.ready),
            (&["20.0.0.1".to_owned()][..], true)
        );
        let s = status_of("a", &[(IpFamily::Ipv6, None)]);
        assert!(s.ips.is_empty() && !s.ready);
        assert_eq!(s.reason, "Pending");
        assert!(!s.message.contains("IPv6"), "{}", s.message);
        // Nothing known at all is not ready.
        assert!(!status_of("a", &[]).ready);
    }

    #[test]
    fn a_dual_stack_pool_service_lists_every_family_ipv4_first() {
        for families in [
            vec![
                at(IpFamily::Ipv4, "20.0.0.1"),
                at(IpFamily::Ipv6, "2001:db8::1"),
            ],
            vec![
                at(IpFamily::Ipv6, "2001:db8::1"),
                at(IpFamily::Ipv4, "20.0.0.1"),
            ],
        ] {
            let s = status_of("a", &families);
            assert_eq!(s.ips, ["20.0.0.1", "2001:db8::1"], "IPv4 first");
            assert!(s.ready);
            assert_eq!(
                s.message,
                "gateway \"a\" serves the pool's load balancer at 20.0.0.1 (IPv4) and \
                 2001:db8::1 (IPv6)"
            );
            // What is written reads back as written: both entries with ipMode VIP.
            let json = serde_json::json!({ "ingress": ingress::to_json(&s.ips) });
            let read: LoadBalancerStatus = serde_json::from_value(json).unwrap();
            assert!(ingress::is_written(
                &ingress::entries(Some(&read)),
                &s.ips,
                true
            ));
        }
    }

    #[test]
    fn a_pool_service_is_ready_only_once_every_family_is() {
        // IPv6 (secondary) not programmed yet: the IPv4 frontend is listed, not ready.
        let s = status_of(
            "a",
            &[at(IpFamily::Ipv4, "20.0.0.1"), at(IpFamily::Ipv6, "")],
        );
        assert_eq!(s.ips, ["20.0.0.1"]);
        assert!(!s.ready);
        assert_eq!(s.reason, "Pending");
        assert_eq!(
            s.message,
            "gateway \"a\" has not programmed the pool's IPv6 load balancer yet"
        );
        // The gateway does not know the secondary identity at all yet.
        let s = status_of(
            "a",
            &[(IpFamily::Ipv6, None), at(IpFamily::Ipv4, "20.0.0.1")],
        );
        assert_eq!((s.ips.len(), s.ready), (1, false));
        assert!(s.message.contains("IPv6"), "{}", s.message);
        // Neither.
        let s = status_of("a", &[(IpFamily::Ipv4, None), (IpFamily::Ipv6, None)]);
        assert!(s.ips.is_empty() && !s.ready);
        assert!(s.message.contains("IPv4 and IPv6"), "{}", s.message);
    }

    #[test]
    fn a_family_removed_from_the_service_leaves_the_pool_service() {
        // Dual → single: the write-back asks with the primary family only; its frontend alone is
        // listed, and the status is ready on it alone.
        let dual = status_of(
            "a",
            &[
                at(IpFamily::Ipv4, "20.0.0.1"),
                at(IpFamily::Ipv6, "2001:db8::1"),
            ],
        );
        let single = status_of("a", &[at(IpFamily::Ipv4, "20.0.0.1")]);
        assert_eq!(single.ips, ["20.0.0.1"]);
        assert!(single.ready);
        let dual_entries = {
            let json = serde_json::json!({ "ingress": ingress::to_json(&dual.ips) });
            ingress::entries(Some(&serde_json::from_value(json).unwrap()))
        };
        assert!(
            !ingress::is_written(&dual_entries, &single.ips, true),
            "the dual-stack ingress is rewritten"
        );
    }

    #[test]
    fn facts_tell_ours_from_theirs() {
        let ps: PoolService = serde_json::from_value(serde_json::json!({
            "apiVersion": "network.openyurt.io/v1alpha1", "kind": "PoolService",
            "metadata": {"namespace": "default", "name": "web-x",
                         "labels": {LABEL_SERVICE_NAME: "web", LABEL_POOL_NAME: "pool-x"}},
            "spec": {"loadBalancerClass": "c"},
        }))
        .unwrap();
        assert!(PoolServiceFacts::of(&ps, "other").is_none());
        let f = PoolServiceFacts::of(&ps, "c").unwrap();
        assert_eq!(f.owner_uid, None);
        assert_eq!(f.pool.as_deref(), Some("pool-x"));
        assert_eq!(f.service.unwrap().name, "web");
    }
}
