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
//! Either way the watcher writes each one's status: `loadBalancer.ingress` (the pool's gateway's
//! frontend IP once programmed) and a `Ready` condition.

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
