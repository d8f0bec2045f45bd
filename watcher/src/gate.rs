//! The pod readiness gate `clb.azure.com/programmed` (docs/readiness-gate.md), cluster mode with
//! `--readiness-gate=true`.
//!
//! A pod that lists the gate in `spec.readinessGates` is Ready only once the condition is `True`.
//! The watcher watches only the pods that carry the label [`GATE_LABEL`] (the webhook adds it with
//! the gate; users who add the gate by hand add the label too): at 100,000 pods the watch carries
//! just the gated ones, and no pod of the cluster is held in memory for this.
//!
//! - **No deadlock.** A gated pod is not Ready, so its EndpointSlice endpoint says `ready: false`.
//!   A pod whose containers are all ready and whose only unmet readiness condition is this gate
//!   is *eligible*: the translators program its endpoints as if ready
//!   ([`crate::translate::Translator::set_gate_ready`]), as AWS's controller does.
//! - **True once programmed.** An eligible pod's gate turns `True` (reason `Programmed`) once, for
//!   every clb Service whose EndpointSlices list the pod's address, the state server of the
//!   Service's gateway reports the address in NRP's actual state at the pod's node's location
//!   with that Service (`Writer.AddressesProgrammed`, verb `write`). A pod no clb Service lists
//!   (after [`NOT_SELECTED_GRACE`], so that a late EndpointSlice is not raced) gets `True` with
//!   reason `NotSelected`: a gate never blocks an unrelated pod. While it waits, the condition is
//!   `False`, reason `Pending`.
//! - **Fail open, bounded.** Not programmed within `--readiness-gate-timeout` (10 min): `True`
//!   with reason `Timeout`, a Warning Event `ReadinessGateTimeout` on the pod naming the Services,
//!   and `clb_watcher_readiness_gate_total{reason="Timeout"}`.
//! - **Never back to False.** A gate once `True` is left alone: a restarted server or watcher, or
//!   a state held back by the restart gate, never turns a Ready pod un-Ready.
//!
//! The condition is written with a strategic merge patch of the `status` subresource (pod
//! conditions merge by `type`, so other conditions are untouched; RBAC `patch` on `pods/status`,
//! granted by `deploy/components/readiness-gate`).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use clb_proto::v1::AddressQuery;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::time::Instant;

use crate::config::{WATCHER_WRITER, WatcherConfig};
use crate::lane::Lane;
use crate::sender::Conn;
use crate::supervise::{Ended, READINESS_GATE, fault_point};
use crate::translate::ObjKey;
use crate::webhook::{GATE_CONDITION_TYPE, GATE_LABEL, GATE_LABEL_VALUE};

/// A pod that no clb Service lists gets `True` only after this long (its EndpointSlice may lag).
pub const NOT_SELECTED_GRACE: Duration = Duration::from_secs(2);

/// How often pending gates are checked against the state server.
const POLL: Duration = Duration::from_millis(50);

/// What the gate needs of a gated pod.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GatedPod {
    uid: String,
    ips: Vec<IpAddr>,
    /// Lists the gate in `spec.readinessGates`.
    has_gate: bool,
    /// `ContainersReady` is `True` and every readiness gate but ours is `True`.
    ready_but_ours: bool,
    deleting: bool,
    /// Our condition's status (`True`, `False`), if set.
    ours: Option<String>,
}

impl GatedPod {
    fn of(pod: &Pod) -> Self {
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
    fn eligible(&self) -> bool {
        self.has_gate && self.ready_but_ours && !self.deleting && !self.ips.is_empty()
    }

    fn open(&self) -> bool {
        self.ours.as_deref() == Some("True")
    }
}

#[derive(Debug)]
struct Tracked {
    pod: GatedPod,
    /// When the watcher first saw it eligible (the gate's clock).
    eligible_since: Option<Instant>,
    /// `False, Pending` written (or found).
    pending_written: bool,
    /// We set it `True` (waiting for the watch to show it).
    opened: bool,
}

/// The gate's task: the gated pods' watch, the eligibility fed to the translators, and the checks.
pub(crate) struct Gate {
    config: WatcherConfig,
    lanes: Vec<Lane>,
    write: kube::Client,
    recorder: Recorder,
    pods: HashMap<ObjKey, Tracked>,
    /// One connection per lane (by index).
    conns: Vec<Conn>,
    listing: Option<HashSet<ObjKey>>,
}

impl Gate {
    pub(crate) fn new(config: WatcherConfig, lanes: Vec<Lane>, write: kube::Client) -> Self {
        let reporter = Reporter {
            controller: crate::writeback::REPORTING_CONTROLLER.to_owned(),
            instance: std::env::var("POD_NAME").ok().filter(|n| !n.is_empty()),
        };
        let conns = lanes
            .iter()
            .map(|l| Conn::new(&l.config().server))
            .collect();
        Self {
            recorder: Recorder::new(write.clone(), reporter),
            config,
            lanes,
            write,
            pods: HashMap::new(),
            conns,
            listing: None,
        }
    }

    /// Runs until `watch`'s stream ends (it does not).
    pub(crate) async fn run(mut self, watch: kube::Client) -> Ended {
        let api: Api<Pod> = Api::all(watch);
        let wc = watcher::Config::default().labels(&format!("{GATE_LABEL}={GATE_LABEL_VALUE}"));
        let mut events = crate::relist::paced(
            watcher::watcher(api, wc),
            crate::relist::connection_backoff(self.config.watch_backoff_max),
        )
        .boxed();
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if fault_point!(self.config.faults, READINESS_GATE) {
                return Ended::failed(READINESS_GATE, "it returned");
            }
            tokio::select! {
                e = events.next() => match e {
                    Some(Ok(e)) => self.event(e),
                    Some(Err(e)) => tracing::warn!(error = %e, "readiness gate: pod watch failed; retrying"),
                    None => return Ended::failed(READINESS_GATE, "its pod watch ended"),
                },
                _ = tick.tick(), if self.has_pending() => self.check().await,
            }
        }
    }

    fn has_pending(&self) -> bool {
        self.pods
            .values()
            .any(|t| t.pod.eligible() && !t.pod.open() && !t.opened)
    }

    fn event(&mut self, e: Event<Pod>) {
        match e {
            Event::Init => self.listing = Some(HashSet::new()),
            Event::InitApply(pod) | Event::Apply(pod) => self.seen(&pod),
            Event::Delete(pod) => {
                if let Some(key) = ObjKey::of(crate::translate::Kind::Pod, &pod.metadata) {
                    self.gone(&key);
                }
            }
            Event::InitDone => {
                if let Some(seen) = self.listing.take() {
                    let stale: Vec<ObjKey> = self
                        .pods
                        .keys()
                        .filter(|k| !seen.contains(*k))
                        .cloned()
                        .collect();
                    for k in stale {
                        self.gone(&k);
                    }
                }
            }
        }
    }

    fn seen(&mut self, pod: &Pod) {
        let Some(key) = ObjKey::of(crate::translate::Kind::Pod, &pod.metadata) else {
            return;
        };
        if let Some(l) = &mut self.listing {
            l.insert(key.clone());
        }
        let now = GatedPod::of(pod);
        let before = self.pods.get(&key).map(|t| t.pod.clone());
        let was = before.as_ref().is_some_and(GatedPod::eligible);
        let old_ips = before.as_ref().map(|p| p.ips.clone()).unwrap_or_default();
        let t = self.pods.entry(key).or_insert(Tracked {
            pod: now.clone(),
            eligible_since: None,
            pending_written: false,
            opened: false,
        });
        if t.pod.uid != now.uid {
            // Another pod of the same name (a missed deletion): start afresh.
            t.eligible_since = None;
            t.pending_written = false;
            t.opened = false;
        }
        if now.eligible() && t.eligible_since.is_none() {
            t.eligible_since = Some(Instant::now());
        }
        if !now.eligible() && !now.open() {
            t.eligible_since = None;
        }
        t.pending_written |= now.ours.is_some();
        // `opened` stays once we set True: an event older than our patch may still show False,
        // and the gate never goes back to False.
        t.pod = now.clone();
        let is = now.eligible();
        if was != is || old_ips != now.ips {
            for ip in old_ips.iter().filter(|ip| !now.ips.contains(ip)) {
                self.feed(*ip, false);
            }
            for ip in &now.ips {
                self.feed(*ip, is);
            }
        }
    }

    fn gone(&mut self, key: &ObjKey) {
        if let Some(t) = self.pods.remove(key) {
            for ip in t.pod.ips {
                self.feed(ip, false);
            }
        }
    }

    /// Tells every lane's translator whether the pod at `ip` is eligible.
    fn feed(&self, ip: IpAddr, eligible: bool) {
        for lane in &self.lanes {
            lane.feed(|t| t.set_gate_ready(ip, eligible));
        }
    }

    /// Checks every pending gate: writes `False, Pending` once, then `True` once programmed (or
    /// selected by no clb Service, or past the bound).
    async fn check(&mut self) {
        let keys: Vec<ObjKey> = self
            .pods
            .iter()
            .filter(|(_, t)| t.pod.eligible() && !t.pod.open() && !t.opened)
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            let Some(t) = self.pods.get(&key) else {
                continue;
            };
            let since = t.eligible_since.unwrap_or_else(Instant::now);
            let pod = t.pod.clone();
            let pending_written = t.pending_written;
            // Per lane: the (service, location, address) the gate waits for.
            let mut wanted: Vec<(usize, Vec<AddressQuery>)> = Vec::new();
            let mut listed = false;
            let mut ours_listed = false;
            for (i, lane) in self.lanes.iter().enumerate() {
                let mut q = Vec::new();
                lane.read(|t| {
                    for ip in &pod.ips {
                        listed |= t.lists_address(*ip);
                        ours_listed |= t.ours_lists_address(*ip);
                        for (uid, loc) in t.gate_services(*ip) {
                            q.push(AddressQuery {
                                location: loc.to_string(),
                                address: ip.to_string(),
                                service: uid,
                            });
                        }
                    }
                });
                if !q.is_empty() {
                    wanted.push((i, q));
                }
            }
            let waited = since.elapsed();
            let outcome = if wanted.is_empty() && !ours_listed {
                if !listed && waited < NOT_SELECTED_GRACE {
                    None
                } else {
                    Some((
                        "NotSelected",
                        "no Service of clb's class lists the pod".to_owned(),
                    ))
                }
            } else if !wanted.is_empty() && self.programmed(&wanted).await {
                let services: Vec<&str> = wanted
                    .iter()
                    .flat_map(|(_, q)| q.iter().map(|a| a.service.as_str()))
                    .collect();
                Some((
                    "Programmed",
                    format!(
                        "Azure has the pod's address in the backend pools of {}",
                        services.join(", ")
                    ),
                ))
            } else if waited >= self.config.readiness_gate_timeout {
                let services = self.why_not(&wanted).await;
                let why = format!(
                    "not programmed in Azure within {:?}: {}; failing open (the pod turns Ready \
                     without Azure's confirmation)",
                    self.config.readiness_gate_timeout,
                    services.join("; ")
                );
                self.warn(&key, &pod, &why).await;
                Some(("Timeout", why))
            } else {
                if !pending_written {
                    let msg = "waiting for Azure to program the pod's address in its Services' backend pools";
                    if self.patch(&key, "False", "Pending", msg).await
                        && let Some(t) = self.pods.get_mut(&key)
                    {
                        t.pending_written = true;
                    }
                }
                None
            };
            if let Some((reason, message)) = outcome
                && self.patch(&key, "True", reason, &message).await
            {
                self.config
                    .metrics
                    .gate_opened(reason, since.elapsed().as_secs_f64());
                tracing::info!(pod = %key, reason, waited = ?since.elapsed(), "readiness gate {GATE_CONDITION_TYPE} set True");
                if let Some(t) = self.pods.get_mut(&key) {
                    t.opened = true;
                }
            }
        }
    }

    /// Whether every queried address is programmed in its lane's gateway.
    async fn programmed(&mut self, wanted: &[(usize, Vec<AddressQuery>)]) -> bool {
        for (i, q) in wanted {
            let client = match self.conns[*i].get().await {
                Ok(c) => c,
                Err(_) => {
                    self.conns[*i].reset();
                    return false;
                }
            };
            match client
                .writer(WATCHER_WRITER)
                .addresses_programmed(q.clone())
                .await
            {
                Ok(p) if p.iter().all(|b| *b) => {}
                Ok(_) => return false,
                Err(e) => {
                    tracing::debug!(error = %e, "readiness gate: AddressesProgrammed failed");
                    self.conns[*i].reset();
                    return false;
                }
            }
        }
        true
    }

    /// Per queried service, why it is not programmed: the server's condition (parked after a
    /// terminal error, throttled, retrying, held back, pending), or what is known without it.
    async fn why_not(&mut self, wanted: &[(usize, Vec<AddressQuery>)]) -> Vec<String> {
        let mut out = Vec::new();
        for (i, q) in wanted {
            let answer = match self.conns[*i].get().await {
                Ok(client) => client
                    .writer(WATCHER_WRITER)
                    .addresses_state(q.clone(), true)
                    .await
                    .ok(),
                Err(_) => None,
            };
            for (n, a) in q.iter().enumerate() {
                let what = format!(
                    "Service {} at {} (gateway {:?})",
                    a.service,
                    a.location,
                    self.lanes[*i].gateway()
                );
                let cond = answer.as_ref().and_then(|r| r.conditions.get(n));
                out.push(match cond {
                    Some(c) => {
                        let reason = clb_proto::v1::ProgrammingReason::try_from(c.reason)
                            .map_or("UNKNOWN", |r| r.as_str_name());
                        let mut s = format!("{what}: {reason}");
                        if !c.message.is_empty() {
                            s.push_str(&format!(": {}", c.message));
                        }
                        if !c.error_code.is_empty() {
                            s.push_str(&format!(" ({}: {})", c.error_code, c.error_message));
                        }
                        s
                    }
                    None => format!("{what}: the state server could not be asked"),
                });
            }
        }
        out
    }

    /// Sets our condition on the pod (strategic merge patch of `status`: merged by `type`).
    async fn patch(&self, key: &ObjKey, status: &str, reason: &str, message: &str) -> bool {
        let api: Api<Pod> = Api::namespaced(self.write.clone(), &key.namespace);
        let now = k8s_openapi::jiff::Timestamp::now();
        let now = k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
        let patch = json!({"status": {"conditions": [{
            "type": GATE_CONDITION_TYPE,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now.to_string(),
        }]}});
        let params = PatchParams {
            field_manager: Some(crate::writeback::FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        match api
            .patch_status(&key.name, &params, &Patch::Strategic(&patch))
            .await
        {
            Ok(_) => true,
            Err(e) => {
                self.config
                    .metrics
                    .writeback_failure("setting a pod's readiness gate");
                tracing::warn!(pod = %key, error = %e, "setting the readiness gate failed; retrying");
                false
            }
        }
    }

    async fn warn(&self, key: &ObjKey, pod: &GatedPod, why: &str) {
        let reference = ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            name: Some(key.name.clone()),
            namespace: Some(key.namespace.clone()),
            uid: Some(pod.uid.clone()).filter(|u| !u.is_empty()),
            ..ObjectReference::default()
        };
        let ev = KubeEvent {
            type_: EventType::Warning,
            reason: "ReadinessGateTimeout".to_owned(),
            note: Some(why.chars().take(1024).collect()),
            action: "Programming".to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &reference).await {
            tracing::warn!(pod = %key, error = %e, "publishing an event failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
