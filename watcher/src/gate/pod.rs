//! What the readiness gate needs of a gated pod, read from the Pod object.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;

use crate::webhook::GATE_CONDITION_TYPE;

/// What the gate needs of a gated pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct GatedPod {
    pub(super) uid: String,
    pub(super) ips: Vec<IpAddr>,
    /// Lists the gate in `spec.readinessGates`.
    pub(super) has_gate: bool,
    /// `ContainersReady` is `True` and every readiness gate but ours is `True`.
    pub(super) ready_but_ours: bool,
    pub(super) deleting: bool,
    /// Our condition's status (`True`, `False`), if set.
    pub(super) ours: Option<String>,
}

impl GatedPod {
    pub(super) fn of(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        let conditions = status.and_then(|s| s.conditions.as_ref());
        let cond = |t: &str| {
            conditions
                .into_iter()
                .flatten()
                .find(|c| c.type_ == t)
                .map(|c| c.status.clone())
        };
        let gates: Vec<String> = pod
            .spec
            .as_ref()
            .and_then(|s| s.readiness_gates.as_ref())
            .into_iter()
            .flatten()
            .map(|g| g.condition_type.clone())
            .collect();
        let others_true = gates
            .iter()
            .filter(|g| *g != GATE_CONDITION_TYPE)
            .all(|g| cond(g).as_deref() == Some("True"));
        let mut ips: Vec<IpAddr> = status
            .and_then(|s| s.pod_ips.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|p| p.ip.parse().ok())
            .collect();
        if ips.is_empty()
            && let Some(ip) = status
                .and_then(|s| s.pod_ip.as_ref())
                .and_then(|i| i.parse().ok())
        {
            ips.push(ip);
        }
        Self {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            ips,
            has_gate: gates.iter().any(|g| g == GATE_CONDITION_TYPE),
            ready_but_ours: cond("ContainersReady").as_deref() == Some("True") && others_true,
            deleting: pod.metadata.deletion_timestamp.is_some(),
            ours: cond(GATE_CONDITION_TYPE),
        }
    }

    /// Containers ready, only our gate unmet (or met), not being deleted.
    pub(super) fn eligible(&self) -> bool {
        self.has_gate && self.ready_but_ours && !self.deleting && !self.ips.is_empty()
    }

    pub(super) fn open(&self) -> bool {
        self.ours.as_deref() == Some("True")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(gates: &[&str], conditions: &[(&str, &str)], ips: &[&str]) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {"containers": [], "readinessGates": gates.iter().map(|g| json!({"conditionType": g})).collect::<Vec<_>>()},
            "status": {
                "conditions": conditions.iter().map(|(t, s)| json!({"type": t, "status": s})).collect::<Vec<_>>(),
                "podIPs": ips.iter().map(|i| json!({"ip": i})).collect::<Vec<_>>(),
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_is_eligible_when_only_our_gate_is_unmet() {
        let ours = GATE_CONDITION_TYPE;
        let p = GatedPod::of(&pod(&[ours], &[("ContainersReady", "True")], &["10.1.0.5"]));
        assert!(p.eligible() && !p.open());
        let p = GatedPod::of(&pod(
            &[ours],
            &[("ContainersReady", "False")],
            &["10.1.0.5"],
        ));
        assert!(!p.eligible(), "containers not ready");
        let p = GatedPod::of(&pod(
            &[ours, "other/gate"],
            &[("ContainersReady", "True")],
            &["10.1.0.5"],
        ));
        assert!(!p.eligible(), "another gate unmet");
        let p = GatedPod::of(&pod(
            &[ours, "other/gate"],
            &[
                ("ContainersReady", "True"),
                ("other/gate", "True"),
                (ours, "True"),
            ],
            &["10.1.0.5"],
        ));
        assert!(p.eligible() && p.open());
        let p = GatedPod::of(&pod(&[], &[("ContainersReady", "True")], &["10.1.0.5"]));
        assert!(!p.eligible(), "no gate: nothing to do");
        let p = GatedPod::of(&pod(&[ours], &[("ContainersReady", "True")], &[]));
        assert!(!p.eligible(), "no IP yet");
    }
}
