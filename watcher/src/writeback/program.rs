//! Following the server's report of one Service (`WriteBack::program`): its Events, then one merge
//! patch of the `status` subresource for the ingress and our condition; and its cleanup once NRP no
//! longer has it (`WriteBack::cleanup`). The module comment of `writeback.rs` says why and how.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use clb_proto::v1::{IpFamily, ProgrammingReason, ServiceState};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::Patch;
use kube::runtime::events::{Event, EventType, Recorder};
use serde_json::json;

use super::ingress;
use super::wanted::{Wanted, ours, truncate};
use super::{CONDITION_TYPE, Next, Record, ServiceFacts, WriteBack, WriteBackError};
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
        &self,
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
        &self,
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
        let recorder = {
            let mut log = self.events.lock().unwrap_or_else(|p| p.into_inner());
            if log.notes.get(&key).is_some_and(|last| *last != note) {
                log.recorder = Recorder::new(self.kube.clone(), self.reporter.clone());
            }
            log.notes.insert(key, note);
            log.recorder.clone()
        };
        recorder.publish(ev, reference).await
    }

    /// Follows the server's report of an inbound Service: Events when its condition changes,
    /// then one merge patch of the `status` subresource for the ingress and our condition when
    /// either differs from what the watch shows.
    pub(super) async fn program(
        &self,
        key: &ObjKey,
        r: &mut Record,
    ) -> Result<Next, WriteBackError> {
        let facts = r.facts.clone();
        if let Some(e) = &facts.selection_error
            && r.selection_warned.as_ref() != Some(e)
        {
            tracing::warn!(service = %key, "{e}");
            self.publish(
                &facts,
                EventType::Warning,
                "InvalidGatewaySelection",
                e.clone(),
            )
            .await;
            r.selection_warned = Some(e.clone());
        }
        if let Some(note) = &facts.ignored
            && r.ignored_warned.as_ref() != Some(note)
        {
            tracing::warn!(service = %key, "{note}");
            self.publish(&facts, EventType::Warning, "IgnoredSettings", note.clone())
                .await;
            r.ignored_warned = Some(note.clone());
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
        let pools = if self.config.pool_services {
            self.reconcile_pools(key, &facts, &by_gateway).await
        } else {
            Ok(())
        };
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
        let conflicts: Vec<String> = r.port_conflicts.values().cloned().collect();
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
        let already = r.reported.as_ref() == Some(&event_key)
            || (r.reported.is_none()
                && ours(&facts.conditions)
                    .is_some_and(|c| c.reason == want.reason && c.status == want.status));
        if !already {
            if let Some(type_) = want.event {
                self.publish(&facts, type_, want.reason, want.message.clone())
                    .await;
            }
            r.reported = Some(event_key);
        }
        for m in std::mem::take(&mut r.conflicts_due) {
            self.publish(&facts, EventType::Warning, "PortNameConflict", m)
                .await;
        }

        // `ipMode` is compared too: an entry written without it (or by someone else) is rewritten.
        let clear_ingress = withdrawn && !facts.ingress.is_empty();
        let ingress_due = clear_ingress
            || (!ips.is_empty()
                && !ingress::is_written(
                    &facts.ingress,
                    &ips,
                    self.ip_mode_kept.load(Ordering::Relaxed),
                ));
        let condition = want.condition(&facts);
        let condition_due = condition.is_some();
        if !ingress_due && !condition_due {
            // Written as wanted: the next change of the Service or of its state makes it due.
            return pools.map(|()| Next::Wait);
        }
        let rv = facts.resource_version.clone();
        if r.patched_at_rv.as_deref() == Some(rv.as_str()) {
            // Our last patch is not in the watch yet: its event makes the record due.
            return pools.map(|()| Next::Wait);
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
                    Self::note_ip_mode(&self.ip_mode_kept, &stored, "Service");
                    tracing::info!(service = %key, ip = %ips.join(","), "status.loadBalancer.ingress set");
                }
                if condition_due {
                    tracing::info!(service = %key, reason = want.reason, message = %want.message, "condition {CONDITION_TYPE} set");
                }
                r.patched_at_rv = Some(rv);
                pools.map(|()| Next::Wait)
            }
            Err(e) => {
                if super::is_conflict(&e) {
                    // A patch at this version cannot succeed: not sent again until the newer
                    // version's event (on its way) makes the record due.
                    r.patched_at_rv = Some(rv);
                }
                super::kube_error(key, "patching the Service's status", e)
            }
        }
    }

    pub(super) async fn cleanup(
        &self,
        key: &ObjKey,
        r: &mut Record,
    ) -> Result<Next, WriteBackError> {
        if r.patched_at_rv.as_deref() == Some(r.facts.resource_version.as_str()) {
            // Our patch is not in the watch yet: its event makes the record due.
            return Ok(Next::Wait);
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
            match held {
                Some(c) if r.reported.as_ref().is_none_or(|r| r.0 != "HeldBack") => {
                    self.publish(&facts, EventType::Normal, "HeldBack", c.message.clone())
                        .await;
                    r.reported = Some(("HeldBack", String::new()));
                }
                Some(_) => {}
                None => r.reported = None,
            }
            // A pushed change of its state makes it due again.
            return Ok(Next::Wait);
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
                Err(e) => return super::kube_error(key, "clearing status.loadBalancer.ingress", e),
            }
        }
        let remaining: Vec<String> = facts
            .finalizers
            .iter()
            .filter(|f| **f != self.config.finalizer)
            .cloned()
            .collect();
        if self.patch_finalizers(key, remaining, &rv).await? {
            tracing::info!(service = %key, uid = %facts.uid, "NRP no longer has the service; finalizer removed");
        }
        // Written, or refused for a newer version: not sent again at this version.
        r.patched_at_rv = Some(facts.resource_version);
        Ok(Next::Wait)
    }
}
