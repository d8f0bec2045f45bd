//! Following the server's report of one Service (`WriteBack::program`): its Events, then one merge
//! patch of the `status` subresource for the ingress and our condition; and its cleanup once NRP no
//! longer has it (`WriteBack::cleanup`). The module comment of `writeback.rs` says why and how.

use std::collections::BTreeMap;
use std::time::Duration;

use clb_proto::v1::{IpFamily, ProgrammingReason, ServiceState};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::Patch;
use kube::runtime::events::{Event, EventType, Recorder};
use serde_json::json;

use super::ingress;
use super::wanted::{Wanted, ours, truncate};
use super::{CONDITION_TYPE, ServiceFacts, WriteBack};
use crate::translate::ObjKey;

impl WriteBack {
    /// The reference of our Events to the Service (no resourceVersion: the recorder keys its
    /// series on the reference, and one Service's Events form one series per reason).
    pub(super) fn reference(facts: &ServiceFacts) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Service".to_owned()),
            name: Some(facts.key.name.clone()),
            namespace: Some(facts.key.namespace.clone()),
            uid: Some(facts.uid.clone()),
            ..ObjectReference::default()
        }
    }

    /// Publishes one Event on the Service (best effort: a failure is logged, never retried on
    /// its own; the next change of the condition publishes again).
    pub(super) async fn publish(
        &mut self,
        facts: &ServiceFacts,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate(note, 1024)),
            action: "Programming".to_owned(),
            secondary: None,
        };
        match self.publish_event(&ev, &Self::reference(facts)).await {
            Ok(()) => {
                tracing::debug!(service = %facts.key, reason, "event published");
            }
            Err(e) => {
                tracing::warn!(service = %facts.key, reason, error = %e, "publishing an event failed");
            }
        }
    }

    /// Publishes `ev` about `reference` with kube's recorder, which turns a repeat of the same
    /// (type, reason, action, object) into a series of one Event: the right thing for the same
    /// problem seen again, the wrong one for a *different* problem of the same reason (another
    /// refused annotation value), whose count it would bump under the old message. So a note that
    /// differs from the last one published under the same key starts a fresh recorder: a new Event
    /// with the current message.
    pub(super) async fn publish_event(
        &mut self,
        ev: &Event,
        reference: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let key = (
            format!(
                "{}/{}/{}/{}",
                reference.kind.as_deref().unwrap_or_default(),
                reference.namespace.as_deref().unwrap_or_default(),
                reference.name.as_deref().unwrap_or_default(),
                reference.uid.as_deref().unwrap_or_default()
            ),
            format!("{:?}/{}", ev.type_, ev.reason),
        );
        let note = ev.note.clone().unwrap_or_default();
        if self.event_notes.get(&key).is_some_and(|last| *last != note) {
            self.recorder = Recorder::new(self.kube.clone(), self.reporter.clone());
        }
        self.event_notes.insert(key, note);
        self.recorder.publish(ev, reference).await
    }

    /// Follows the server's report of an inbound Service: Events when its condition changes,
    /// then one merge patch of the `status` subresource for the ingress and our condition when
    /// either differs from what the watch shows.
    pub(super) async fn program(&mut self, key: &ObjKey) -> Result<Option<Duration>, ()> {
        let facts = self.records[key].facts.clone();
        if let Some(e) = &facts.selection_error
            && self.records[key].selection_warned.as_ref() != Some(e)
        {
            tracing::warn!(service = %key, "{e}");
            self.publish(
                &facts,
                EventType::Warning,
                "InvalidGatewaySelection",
                e.clone(),
            )
            .await;
            if let Some(r) = self.records.get_mut(key) {
                r.selection_warned = Some(e.clone());
            }
        }
        if let Some(note) = &facts.ignored
            && self.records[key].ignored_warned.as_ref() != Some(note)
        {
            tracing::warn!(service = %key, "{note}");
            self.publish(&facts, EventType::Warning, "IgnoredSettings", note.clone())
                .await;
            if let Some(r) = self.records.get_mut(key) {
                r.ignored_warned = Some(note.clone());
            }
        }
        // Every selected gateway's report of every IP family's identity: the condition follows the
        // first not programmed (else the first), the ingress lists every programmed frontend IP,
        // IPv4 first. Each PoolService gets its gateway's report of every family the same way.
        let mut states = Vec::new();
        let mut by_gateway: BTreeMap<String, Vec<(IpFamily, Option<ServiceState>)>> =
            BTreeMap::new();
        let mut all = facts.gateways.clone();
        for g in self.foreign_gateways(key) {
            if !all.contains(&g) {
                all.push(g);
            }
        }
        for g in &all {
            for (id, family) in &facts.ids {
                let st = self.service_state(g, id)?;
                by_gateway
                    .entry(g.clone())
                    .or_default()
                    .push((*family, st.clone()));
                states.push(st);
            }
        }
        if self.config.pool_services {
            self.reconcile_pools(key, &facts, &by_gateway).await;
        }
        let ips = ingress::ordered(
            states
                .iter()
                .flatten()
                .filter(|s| s.actual && !s.frontend_ip.is_empty())
                .map(|s| s.frontend_ip.clone()),
        );
        let state = states
            .iter()
            .find(|s| {
                !s.as_ref()
                    .is_some_and(|s| s.actual && !s.frontend_ip.is_empty())
            })
            .or(states.first())
            .cloned()
            .flatten();
        let record = &self.records[key];
        let conflicts: Vec<String> = record.port_conflicts.values().cloned().collect();
        let refused = facts.refusal.as_ref();
        let want = match refused {
            Some(r) => Wanted::refused(r),
            None => Wanted::of(state.as_ref(), &conflicts),
        };
        // A refused Service is withdrawn: its ingress goes once NRP no longer has it (until then it
        // still is where the ingress says).
        let withdrawn = refused.is_some() && !states.iter().flatten().any(|s| s.actual);
        let ips = if refused.is_some() { Vec::new() } else { ips };

        // Events: one per change of the reason (or error code), not per poll or retry. A Service
        // that already shows this condition (a restarted watcher) gets none.
        let event_key = (want.reason, want.error_code.clone());
        let already = record.reported.as_ref() == Some(&event_key)
            || (record.reported.is_none()
                && ours(&facts.conditions)
                    .is_some_and(|c| c.reason == want.reason && c.status == want.status));
        if !already {
            if let Some(type_) = want.event {
                self.publish(&facts, type_, want.reason, want.message.clone())
                    .await;
            }
            if let Some(r) = self.records.get_mut(key) {
                r.reported = Some(event_key);
            }
        }
        let due = self
            .records
            .get_mut(key)
            .map(|r| std::mem::take(&mut r.conflicts_due))
            .unwrap_or_default();
        for m in due {
            self.publish(&facts, EventType::Warning, "PortNameConflict", m)
                .await;
        }

        // `ipMode` is compared too: an entry written without it (or by someone else) is rewritten.
        let clear_ingress = withdrawn && !facts.ingress.is_empty();
        let ingress_due = clear_ingress
            || (!ips.is_empty() && !ingress::is_written(&facts.ingress, &ips, self.ip_mode_kept));
        let condition = want.condition(&facts);
        let condition_due = condition.is_some();
        let settled = (matches!(want.reason, "Programmed" | "RejectedByAzure")
            || (refused.is_some() && withdrawn))
            && !ingress_due
            && !condition_due;
        if !ingress_due && !condition_due {
            return Ok(Some(if settled {
                self.config.recheck
            } else {
                self.pending_delay(key)
            }));
        }
        let rv = facts.resource_version.clone();
        if self.records[key].patched_at_rv.as_deref() == Some(rv.as_str()) {
            // Our last patch is not in the watch yet.
            return Ok(Some(self.pending_delay(key)));
        }
        let mut status = serde_json::Map::new();
        if clear_ingress {
            status.insert("loadBalancer".into(), json!({ "ingress": null }));
        } else if ingress_due {
            status.insert(
                "loadBalancer".into(),
                json!({ "ingress": ingress::to_json(&ips) }),
            );
        }
        if let Some(conditions) = condition {
            status.insert("conditions".into(), json!(conditions));
        }
        let patch = json!({ "metadata": { "resourceVersion": rv }, "status": status });
        match self
            .api(key)
            .patch_status(&key.name, &Self::params(), &Patch::Merge(&patch))
            .await
        {
            Ok(stored) => {
                if clear_ingress {
                    tracing::info!(service = %key, "status.loadBalancer.ingress cleared: the Service is refused and NRP no longer has it");
                } else if ingress_due {
                    let stored = ingress::entries(
                        stored
                            .status
                            .as_ref()
                            .and_then(|s| s.load_balancer.as_ref()),
                    );
                    Self::note_ip_mode(&mut self.ip_mode_kept, &stored, "Service");
                    tracing::info!(service = %key, ip = %ips.join(","), "status.loadBalancer.ingress set");
                }
                if condition_due {
                    tracing::info!(service = %key, reason = want.reason, message = %want.message, "condition {CONDITION_TYPE} set");
                }
                if let Some(r) = self.records.get_mut(key) {
                    r.patched_at_rv = Some(rv);
                }
                Ok(Some(self.pending_delay(key)))
            }
            Err(e) => self.kube_error(key, "patching the Service's status", e),
        }
    }

    pub(super) async fn cleanup(&mut self, key: &ObjKey) -> Result<Option<Duration>, ()> {
        let r = &self.records[key];
        if r.patched_at_rv.as_deref() == Some(r.facts.resource_version.as_str()) {
            return Ok(Some(self.config.poll));
        }
        let facts = r.facts.clone();
        let mut still = None;
        if !facts.uid.is_empty() {
            // Every identity the Service may have had: a family removed just before may still be
            // draining.
            'gateways: for g in self.all_gateways() {
                for id in crate::families::every_identity(&facts.uid) {
                    if let Some(s) = self.service_state(&g, &id)?
                        && (s.desired || s.actual)
                    {
                        still = Some(s);
                        break 'gateways;
                    }
                }
            }
        }
        if let Some(s) = still {
            tracing::debug!(service = %key, desired = s.desired, actual = s.actual, "waiting for NRP to drop the service");
            let held = s
                .condition
                .as_ref()
                .filter(|c| c.reason == ProgrammingReason::HeldBack as i32);
            let reported = self.records.get(key).and_then(|r| r.reported.clone());
            match held {
                Some(c) if reported.as_ref().is_none_or(|r| r.0 != "HeldBack") => {
                    self.publish(&facts, EventType::Normal, "HeldBack", c.message.clone())
                        .await;
                    if let Some(r) = self.records.get_mut(key) {
                        r.reported = Some(("HeldBack", String::new()));
                    }
                }
                Some(_) => {}
                None => {
                    if let Some(r) = self.records.get_mut(key) {
                        r.reported = None;
                    }
                }
            }
            return Ok(Some(self.pending_delay(key)));
        }
        let mut rv = facts.resource_version.clone();
        if !facts.deleting && !facts.ingress.is_empty() {
            let patch = json!({ "status": { "loadBalancer": { "ingress": null } } });
            match self
                .api(key)
                .patch_status(&key.name, &Self::params(), &Patch::Merge(&patch))
                .await
            {
                Ok(svc) => {
                    tracing::info!(service = %key, "status.loadBalancer.ingress cleared: no longer a load balancer of ours");
                    rv = svc.metadata.resource_version.unwrap_or(rv);
                }
                Err(e) => return self.kube_error(key, "clearing status.loadBalancer.ingress", e),
            }
        }
        let remaining: Vec<String> = facts
            .finalizers
            .iter()
            .filter(|f| **f != self.config.finalizer)
            .cloned()
            .collect();
        let r = self.patch_finalizers(key, remaining, &rv).await;
        if let Ok(Some(_)) = &r {
            tracing::info!(service = %key, uid = %facts.uid, "NRP no longer has the service; finalizer removed");
            if let Some(rec) = self.records.get_mut(key) {
                rec.patched_at_rv = Some(facts.resource_version);
            }
        }
        r
    }
}
