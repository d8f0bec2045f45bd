//! Events about the NAT gateways egresses bring (docs/watcher.md, "Bringing your own NAT gateway").
//!
//! The write-back's streams of service states include the gateways' egresses
//! (`WatchServicesRequest.include_outbound`), each with the NAT gateway it brings
//! (`ServiceState.nat_gateway`) and whether the last read-back of NRP found that NAT gateway missing
//! (`nat_gateway_missing`). From that state [`NatEvent::of`] derives one of four Events:
//!
//! - `Linked` (Normal): NRP has the egress, linked to the NAT gateway and registered with it;
//! - `Rejected` (Warning): the worker or NRP refused it for good (not `StandardV2`, no NAT gateway
//!   resource group configured, linked to another Service Gateway, a reserved name, …);
//! - `Unreadable` (Warning): it could not be read: not found, or clb's identity may not read it
//!   (an authorization failure, whichever call of the saga met it: the read comes first);
//! - `Deleted` (Warning): it was linked, and a later read-back of NRP did not find it (deleted out
//!   of band). clb does not create it again.
//!
//! One Event per change of (reason, error code) of an egress in a gateway, not per push, poll or
//! retry; a state that gives no Event (pending, retrying for another reason) changes nothing, so a
//! linked egress whose pods come and go is not announced again. A restarted watcher publishes each
//! egress's current Event once.
//!
//! **What the Events regard.** An egress is no Kubernetes object: its pods are, and they may live in
//! several namespaces. Each Event is published in every namespace that has pods of the egress,
//! regarding one pod there: the oldest not being deleted (then by name), the one most likely to
//! stay, so that `kubectl describe pod` and `kubectl get events -n <namespace>` show it where the
//! pods' owners look. The pods are listed (label `kubernetes.azure.com/service-egress-gateway`,
//! matched without regard to case as the egress name is), once for the Events due at a push. An
//! egress with no pod gets no Event; its next change is published.

use std::collections::BTreeMap;

use clb_proto::v1::{ProgrammingReason, ServiceState};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::events::{Event, EventType};

use super::{WriteBack, truncate};
use crate::translate::EGRESS_LABEL;

/// The failures that mean "the NAT gateway could not be read": missing, or no permission.
const UNREADABLE_CODES: &[&str] = &[
    "NatGatewayNotFound",
    "AuthorizationFailed",
    "LinkedAuthorizationFailed",
    "InvalidAuthenticationToken",
];

/// The Event due for an egress that brings a NAT gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NatEvent {
    pub type_: EventType,
    /// `Linked`, `Rejected`, `Unreadable` or `Deleted`.
    pub reason: &'static str,
    /// The error code (the NAT gateway's name for `Linked`): with the reason, what a change is.
    pub code: String,
    pub note: String,
}

impl NatEvent {
    /// The Event for egress state `s` in gateway `gateway` (`""`: the server's default); `None`
    /// for an egress that brings no NAT gateway, or a state that gives no Event.
    pub(crate) fn of(gateway: &str, s: &ServiceState) -> Option<Self> {
        let nat = s.nat_gateway.as_str();
        if nat.is_empty() {
            return None;
        }
        let what = match gateway {
            "" => format!("NAT gateway {nat:?} of egress {:?}", s.service_id),
            g => format!(
                "NAT gateway {nat:?} of egress {:?} (gateway {g:?})",
                s.service_id
            ),
        };
        if s.actual && s.nat_gateway_missing {
            return Some(Self {
                type_: EventType::Warning,
                reason: "Deleted",
                code: "NatGatewayDeleted".into(),
                note: format!(
                    "{what} was deleted after clb linked it: NRP's read-back did not find it. clb \
                     does not create a brought NAT gateway; the egress's pods have no outbound \
                     connectivity through it until it is created again (then clb links it again)"
                ),
            });
        }
        let c = s.condition.clone().unwrap_or_default();
        let reason =
            ProgrammingReason::try_from(c.reason).unwrap_or(ProgrammingReason::Unspecified);
        let failure = |type_: &'static str, text: &str| Self {
            type_: EventType::Warning,
            reason: type_,
            code: c.error_code.clone(),
            note: format!("{what} {text}: {}: {}", c.error_code, c.error_message),
        };
        match reason {
            ProgrammingReason::Programmed if s.actual => Some(Self {
                type_: EventType::Normal,
                reason: "Linked",
                code: nat.to_owned(),
                note: format!(
                    "{what} is linked to the Service Gateway and the egress is registered with it \
                     ({} pods)",
                    s.actual_addresses
                ),
            }),
            ProgrammingReason::Rejected
            | ProgrammingReason::Retrying
            | ProgrammingReason::Throttled
                if UNREADABLE_CODES.contains(&c.error_code.as_str()) =>
            {
                Some(failure("Unreadable", "could not be read"))
            }
            ProgrammingReason::Rejected => Some(failure(
                "Rejected",
                "was refused; nothing is retried until the egress changes",
            )),
            _ => None,
        }
    }
}

/// The pods an Event about egress `egress` regards: in each namespace with pods of the egress, the
/// oldest not being deleted (then by name; a namespace whose pods are all being deleted gives one of
/// them). Sorted by namespace.
pub(crate) fn regarded(pods: &[Pod], egress: &str) -> Vec<ObjectReference> {
    let mut by_ns: BTreeMap<String, &Pod> = BTreeMap::new();
    let rank = |p: &Pod| {
        let m = &p.metadata;
        (
            m.deletion_timestamp.is_some(),
            m.creation_timestamp.as_ref().map(|t| t.0),
            m.name.clone(),
        )
    };
    for p in pods {
        let m = &p.metadata;
        let ours = m
            .labels
            .as_ref()
            .and_then(|l| l.get(EGRESS_LABEL))
            .is_some_and(|v| v.trim().eq_ignore_ascii_case(egress));
        let (Some(ns), Some(_)) = (m.namespace.as_ref(), m.name.as_ref()) else {
            continue;
        };
        if !ours {
            continue;
        }
        match by_ns.get(ns) {
            Some(best) if rank(best) <= rank(p) => {}
            _ => {
                by_ns.insert(ns.clone(), p);
            }
        }
    }
    by_ns
        .into_values()
        .map(|p| ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            name: p.metadata.name.clone(),
            namespace: p.metadata.namespace.clone(),
            uid: p.metadata.uid.clone(),
            ..ObjectReference::default()
        })
        .collect()
}

impl WriteBack {
    /// Publishes the Events due for the egresses among `ids` (a push of the server changed them).
    pub(super) async fn egress_events(&mut self, ids: &[String]) {
        let mut due = Vec::new();
        for gateway in self.all_gateways() {
            for id in ids {
                let key = (gateway.clone(), id.clone());
                let Some(state) = self.states.egress(&gateway, id) else {
                    if self.states.get(&gateway, id).is_ok() {
                        // The gateway no longer knows it (or it is not an egress).
                        self.egress_reported.remove(&key);
                    }
                    continue;
                };
                let Some(want) = NatEvent::of(&gateway, &state) else {
                    continue;
                };
                if self.egress_reported.get(&key) != Some(&(want.reason, want.code.clone())) {
                    due.push((key, want));
                }
            }
        }
        if due.is_empty() {
            return;
        }
        // One listing for every Event due now.
        let api: Api<Pod> = Api::all(self.kube.clone());
        let pods = match api.list(&ListParams::default().labels(EGRESS_LABEL)).await {
            Ok(list) => list.items,
            Err(e) => {
                self.config
                    .metrics
                    .writeback_failure("listing the egress pods");
                tracing::warn!(error = %e, events = due.len(),
                    "listing the egress pods for the NAT gateway Events failed; the next change publishes");
                return;
            }
        };
        for (key, want) in due {
            if self.publish_on_pods(&pods, &key.1, &want).await {
                self.egress_reported.insert(key, (want.reason, want.code));
            }
        }
    }

    /// Publishes `want` on the regarded pods of `egress` among `pods`; whether it was published
    /// anywhere.
    async fn publish_on_pods(&mut self, pods: &[Pod], egress: &str, want: &NatEvent) -> bool {
        let ev = Event {
            type_: want.type_,
            reason: want.reason.to_owned(),
            note: Some(truncate(want.note.clone(), 1024)),
            action: "LinkNatGateway".to_owned(),
            secondary: None,
        };
        let mut published = false;
        for pod in regarded(pods, egress) {
            match self.publish_event(&ev, &pod).await {
                Ok(()) => {
                    published = true;
                    tracing::info!(egress, reason = want.reason, namespace = ?pod.namespace,
                        pod = ?pod.name, "NAT gateway event published");
                }
                Err(e) => {
                    tracing::warn!(egress, reason = want.reason, namespace = ?pod.namespace,
                        error = %e, "publishing a NAT gateway event failed");
                }
            }
        }
        published
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clb_proto::v1::{ServiceCondition, ServiceKind};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn state(reason: ProgrammingReason, code: &str, actual: bool) -> ServiceState {
        ServiceState {
            service_id: "eg".into(),
            kind: ServiceKind::Outbound as i32,
            actual,
            nat_gateway: "natgw-v2".into(),
            condition: Some(ServiceCondition {
                reason: reason as i32,
                error_code: code.into(),
                error_message: "why".into(),
                ..ServiceCondition::default()
            }),
            ..ServiceState::default()
        }
    }

    fn reason(s: &ServiceState) -> Option<&'static str> {
        NatEvent::of("", s).map(|e| e.reason)
    }

    #[test]
    fn each_state_of_a_brought_nat_gateway_gives_its_event() {
        use ProgrammingReason as R;
        assert_eq!(reason(&state(R::Programmed, "", true)), Some("Linked"));
        assert_eq!(reason(&state(R::Programmed, "", false)), None);
        assert_eq!(reason(&state(R::Pending, "", true)), None);
        let refused = state(R::Rejected, "NatGatewayNotStandardV2", false);
        let e = NatEvent::of("east", &refused).unwrap();
        assert_eq!((e.reason, e.type_), ("Rejected", EventType::Warning));
        assert!(e.note.contains("NatGatewayNotStandardV2"), "{}", e.note);
        assert!(
            e.note.contains("\"natgw-v2\"") && e.note.contains("\"east\""),
            "{}",
            e.note
        );
        assert_eq!(
            reason(&state(R::Rejected, "NatGatewayNotFound", false)),
            Some("Unreadable")
        );
        assert_eq!(
            reason(&state(R::Retrying, "AuthorizationFailed", false)),
            Some("Unreadable")
        );
        assert_eq!(
            reason(&state(R::Retrying, "InternalServerError", false)),
            None
        );
        let mut missing = state(R::Programmed, "", true);
        missing.nat_gateway_missing = true;
        assert_eq!(reason(&missing), Some("Deleted"));
        // clb's own NAT gateway: no Event.
        let mut own = state(R::Programmed, "", true);
        own.nat_gateway.clear();
        assert_eq!(reason(&own), None);
    }

    fn pod(ns: &str, name: &str, egress: &str, created: i64, deleting: bool) -> Pod {
        let at = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap());
        Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                labels: Some([(EGRESS_LABEL.to_owned(), egress.to_owned())].into()),
                creation_timestamp: Some(at(created)),
                deletion_timestamp: deleting.then(|| at(created + 1)),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    #[test]
    fn events_regard_the_oldest_live_pod_of_each_namespace() {
        let pods = [
            pod("apps", "b", "EG", 10, false),
            pod("apps", "a", "eg", 20, false),
            pod("apps", "old", "eg", 1, true),
            pod("jobs", "x", "eg", 5, true),
            pod("other", "o", "other", 1, false),
        ];
        let got: Vec<(String, String)> = regarded(&pods, "eg")
            .into_iter()
            .map(|r| (r.namespace.unwrap(), r.name.unwrap()))
            .collect();
        assert_eq!(
            got,
            [("apps".into(), "b".into()), ("jobs".into(), "x".into())]
        );
    }
}
