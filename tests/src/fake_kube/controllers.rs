//! Simulated Kubernetes controllers running inside the fake API ([`FakeApi::start_controllers`]),
//! for tests that need a cluster that moves by itself (a rollout with a pod readiness gate):
//! - a **scheduler and kubelet** ([`KubeletConfig`]): binds unscheduled pods round-robin to the
//!   schedulable Nodes; for each pod bound to an existing Node sets `phase: Running`, a pod IP
//!   from the node's CIDR (node *i*, in the order of their names when first seen, gets
//!   `10.244.i.0/24`), `hostIP`s (the node's InternalIPs), the conditions `PodScheduled`,
//!   `Initialized`, `ContainersReady` (after [`KubeletConfig::containers_ready_after`]) and
//!   `Ready` = `ContainersReady` and every `spec.readinessGates[].conditionType` condition
//!   `True` (kept up to date when another writer changes a gate; other writers' conditions are
//!   never touched); a terminating pod is marked not ready (after
//!   [`KubeletConfig::ready_while_terminating`]) and removed when its grace
//!   (`deletionGracePeriodSeconds`, capped by [`KubeletConfig::termination_grace`]) is over;
//! - the **EndpointSlice controller**: one slice per IP family of each Service with a selector
//!   (`spec.ipFamilies`, IPv4 when absent; `addressType` the family; the IPv4 slice named
//!   `{service}-{hash}`), listing each matching pod of its namespace that has an IP of that family
//!   (`status.podIPs`, as a dual-stack CNI sets them; `ready`, `serving`, `terminating` as the real
//!   controller derives them), its ports (a numeric or named `targetPort` resolved); a slice of a
//!   family the Service no longer has is deleted. (The kubelet allocates IPv4 pod IPs only: a test
//!   gives pods their IPv6 ones in `status.podIPs`, which the kubelet keeps.)
//! - the **Deployment controller** (`apps/v1`, without ReplicaSets): pods
//!   `{deployment}-{template hash}-{random}` owned by the Deployment, labelled with the
//!   template's labels and `pod-template-hash`; the `RollingUpdate` strategy with `maxSurge` and
//!   `maxUnavailable` (ints or percentages, rounded as Kubernetes does) and `Recreate`;
//!   `status` (`replicas`, `updatedReplicas`, `readyReplicas`, `availableReplicas`,
//!   `unavailableReplicas`, `observedGeneration`, conditions); pods whose Deployment is gone are
//!   deleted (garbage collection).
//!
//! Each controller is a task that wakes on the fake's change broadcast of the resources it
//! watches (with a short resync tick as a fallback, e.g. while a resource's watches are paused),
//! and reconciles under the fake's lock: a read-modify-write of only the fields it owns, each a
//! commit with a new `resourceVersion` (a MODIFIED event), so it never overwrites another writer.
//! Pods are deleted through the API's deletion path (graceful: see
//! [`FakeApi::graceful_pod_deletion`], turned on when a kubelet runs).

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::StreamMap;
use tokio_stream::wrappers::BroadcastStream;

use super::workloads::{ALPHANUMS, now, random_suffix, string_map};
use super::{FakeApi, Inner, finalizers, pointer_str};

/// The label naming an EndpointSlice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label naming an EndpointSlice's manager.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// The manager of the slices the EndpointSlice controller maintains.
pub const ENDPOINTSLICE_CONTROLLER: &str = "endpointslice-controller.k8s.io";
/// The label of a Deployment's pods naming their template.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// The template annotation `kubectl rollout restart` sets ([`FakeApi::rollout`]).
pub const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";

/// Which simulated controllers run, and how.
#[derive(Debug, Clone)]
pub struct ControllersConfig {
    /// The scheduler and kubelet (`None`: pods are neither scheduled nor run).
    pub kubelet: Option<KubeletConfig>,
    /// The EndpointSlice controller.
    pub endpoint_slices: bool,
    /// The Deployment controller.
    pub deployments: bool,
    /// How often each controller looks again without a change (a fallback). Default 50 ms.
    pub resync: Duration,
}

impl Default for ControllersConfig {
    /// All of them, the kubelet with its defaults.
    fn default() -> Self {
        Self {
            kubelet: Some(KubeletConfig::default()),
            endpoint_slices: true,
            deployments: true,
            resync: Duration::from_millis(50),
        }
    }
}

/// The simulated kubelet's timings.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// From when the kubelet first sees a pod on its node until its containers are ready
    /// (`ContainersReady`). Default 100 ms.
    pub containers_ready_after: Duration,
    /// The cap on a terminating pod's grace (`deletionGracePeriodSeconds`, from the DELETE or the
    /// pod's `terminationGracePeriodSeconds`, default 30 s): the pod is removed this long after
    /// the kubelet saw its deletion, or sooner if its grace is shorter. Default 300 ms.
    pub termination_grace: Duration,
    /// How long a terminating pod's containers stay ready (its `Ready` condition, hence its
    /// endpoint `serving`) after the kubelet saw its deletion. Default zero: not ready at once.
    pub ready_while_terminating: Duration,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            containers_ready_after: Duration::from_millis(100),
            termination_grace: Duration::from_millis(300),
            ready_while_terminating: Duration::ZERO,
        }
    }
}

/// The running controllers: [`ControllersHandle::stop`] them, or drop the handle (the tasks are
/// aborted).
#[derive(Debug)]
pub struct ControllersHandle {
    tasks: Vec<JoinHandle<()>>,
}

impl ControllersHandle {
    /// Stops every controller; panics if one of them panicked.
    pub async fn stop(mut self) {
        for task in std::mem::take(&mut self.tasks) {
            if task.is_finished() {
                if let Err(e) = task.await
                    && e.is_panic()
                {
                    std::panic::resume_unwind(e.into_panic());
                }
            } else {
                task.abort();
                let _ = task.await;
            }
        }
    }
}

impl Drop for ControllersHandle {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl FakeApi {
    /// Starts the simulated controllers of `config` (see the module docs); with a kubelet,
    /// [`FakeApi::graceful_pod_deletion`] is turned on.
    pub fn start_controllers(&self, config: ControllersConfig) -> ControllersHandle {
        let mut tasks = Vec::new();
        if let Some(kubelet) = config.kubelet {
            self.graceful_pod_deletion(true);
            tasks.push(self.spawn_controller(Kubelet::new(kubelet), config.resync));
        }
        if config.endpoint_slices {
            tasks.push(self.spawn_controller(EndpointSlices, config.resync));
        }
        if config.deployments {
            tasks.push(self.spawn_controller(Deployments, config.resync));
        }
        ControllersHandle { tasks }
    }

    fn spawn_controller<C: Controller>(
        &self,
        mut controller: C,
        resync: Duration,
    ) -> JoinHandle<()> {
        let mut changes = StreamMap::new();
        {
            let inner = self.lock();
            for plural in C::WATCHES {
                let rx = inner.resources[plural].tx.subscribe();
                changes.insert(*plural, BroadcastStream::new(rx));
            }
        }
        let shared = self.inner.clone();
        tokio::spawn(async move {
            loop {
                let now = Instant::now();
                let next = {
                    let mut inner = shared.lock().unwrap();
                    controller.reconcile(&mut inner, now)
                };
                let wake = next.map_or(now + resync, |n| n.min(now + resync));
                tokio::select! {
                    Some(_) = changes.next() => {}
                    () = tokio::time::sleep_until(wake.into()) => {}
                }
            }
        })
    }

    /// `kubectl rollout restart deployment/NAME` (namespace `default`): bumps the template's
    /// [`RESTARTED_AT`] annotation, which starts a rollout; returns the new template's hash (the
    /// `pod-template-hash` of the new pods).
    pub fn rollout(&self, name: &str) -> String {
        let mut inner = self.lock();
        let key = ("default".to_owned(), name.to_owned());
        let mut d = inner.resources["deployments"]
            .objects
            .get(&key)
            .cloned()
            .unwrap_or_else(|| panic!("no deployment default/{name}"));
        let template = &mut d["spec"]["template"];
        if !template["metadata"]["annotations"].is_object() {
            template["metadata"]["annotations"] = json!({});
        }
        let at = k8s_openapi::jiff::Timestamp::now().to_string();
        template["metadata"]["annotations"][RESTARTED_AT] = json!(at);
        let hash = template_hash(template);
        inner.commit("deployments", key, Some(d));
        hash
    }

    /// `kubectl scale deployment/NAME --replicas=N` (namespace `default`).
    pub fn scale(&self, name: &str, replicas: i64) {
        let mut inner = self.lock();
        let key = ("default".to_owned(), name.to_owned());
        let mut d = inner.resources["deployments"]
            .objects
            .get(&key)
            .cloned()
            .unwrap_or_else(|| panic!("no deployment default/{name}"));
        d["spec"]["replicas"] = json!(replicas);
        inner.commit("deployments", key, Some(d));
    }

    /// Whether the rollout of Deployment `default/name` is complete, as `kubectl rollout status`
    /// decides ([`deployment_complete`]).
    pub fn rolled_out(&self, name: &str) -> bool {
        self.get("deployments", "default", name)
            .is_some_and(|d| deployment_complete(&d))
    }

    /// The pods of Deployment `default/name` (terminating ones included).
    pub fn deployment_pods(&self, name: &str) -> Vec<Value> {
        let Some(d) = self.get("deployments", "default", name) else {
            return Vec::new();
        };
        let uid = s(&d, "/metadata/uid");
        self.objects("pods")
            .into_iter()
            .filter(|p| controller_uid(p).as_deref() == Some(uid.as_str()))
            .collect()
    }
}

/// The status of condition `type_` of an object (`True`, `False`, `Unknown`), if it has one.
pub fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a str> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))?
        .get("status")?
        .as_str()
}

/// Whether a pod's `Ready` condition is `True`.
pub fn pod_ready(pod: &Value) -> bool {
    condition(pod, "Ready") == Some("True")
}

/// Whether a pod (any object) is being deleted.
pub fn terminating(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

/// The `pod-template-hash` of a pod template: FNV-1a of its JSON, encoded as Kubernetes
/// encodes it (`rand.SafeEncodeString` of the decimal hash).
pub fn template_hash(template: &Value) -> String {
    fnv1a(template.to_string().as_bytes())
        .to_string()
        .bytes()
        .map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char)
        .collect()
}

/// Whether a Deployment's rollout is complete, as `kubectl rollout status` decides: its status
/// observed the current generation, every replica is updated and available, no old one is left.
pub fn deployment_complete(d: &Value) -> bool {
    let int = |p: &str| d.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    let replicas = d
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    int("/status/observedGeneration") >= int("/metadata/generation")
        && int("/status/updatedReplicas") == replicas
        && int("/status/replicas") == replicas
        && int("/status/availableReplicas") == replicas
}

fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// Five characters of a hash of `s` (a slice's name suffix).
fn short_hash(s: &str) -> String {
    let mut h = fnv1a(s.as_bytes()) as usize;
    (0..5)
        .map(|_| {
            let c = ALPHANUMS[h % ALPHANUMS.len()] as char;
            h /= ALPHANUMS.len();
            c
        })
        .collect()
}

fn s(v: &Value, pointer: &str) -> String {
    pointer_str(v, pointer).unwrap_or("").to_owned()
}

/// A pod's identity for the kubelet: its uid (its namespace and name if it has none).
fn pod_id(pod: &Value) -> String {
    let uid = s(pod, "/metadata/uid");
    if uid.is_empty() {
        format!(
            "{}/{}",
            s(pod, "/metadata/namespace"),
            s(pod, "/metadata/name")
        )
    } else {
        uid
    }
}

fn terminal(pod: &Value) -> bool {
    matches!(
        pointer_str(pod, "/status/phase"),
        Some("Succeeded" | "Failed")
    )
}

/// The uid of the controller (owner reference with `controller: true`) of `obj`.
fn controller_uid(obj: &Value) -> Option<String> {
    obj.pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
        .and_then(|r| r.get("uid")?.as_str().map(str::to_owned))
}

/// Sets condition `c` (with `type` and `status`) in `status.conditions`: `lastTransitionTime`
/// changes only with the status; other conditions are kept.
fn set_condition(status: &mut Value, c: Value) {
    if !status.is_object() {
        *status = json!({});
    }
    if !status["conditions"].is_array() {
        status["conditions"] = json!([]);
    }
    let list = status["conditions"].as_array_mut().expect("a list");
    let at = list.iter().position(|x| x.get("type") == c.get("type"));
    let mut c = c;
    match at {
        Some(i) if list[i].get("status") == c.get("status") => {
            c["lastTransitionTime"] = list[i]["lastTransitionTime"].clone();
            list[i] = c;
        }
        Some(i) => {
            c["lastTransitionTime"] = json!(now());
            list[i] = c;
        }
        None => {
            c["lastTransitionTime"] = json!(now());
            list.push(c);
        }
    }
}

/// A pod condition (`lastProbeTime: null`, as the kubelet writes it).
fn pod_condition(type_: &str, ok: bool, why: Option<(&str, String)>) -> Value {
    let mut c =
        json!({"type": type_, "status": if ok { "True" } else { "False" }, "lastProbeTime": null});
    if let Some((reason, message)) = why {
        c["reason"] = json!(reason);
        c["message"] = json!(message);
    }
    c
}

/// One simulated controller: what it watches and one pass of its reconciliation.
trait Controller: Send + 'static {
    /// The resources whose changes wake it.
    const WATCHES: &'static [&'static str];
    /// One pass over the fake's state (under its lock); when it must look again at the latest
    /// (a timer), if ever.
    fn reconcile(&mut self, inner: &mut Inner, now: Instant) -> Option<Instant>;
}

fn earliest(a: Option<Instant>, b: Instant) -> Option<Instant> {
    Some(a.map_or(b, |a| a.min(b)))
}

type Key = (String, String);

fn snapshot(inner: &Inner, plural: &str) -> Vec<(Key, Value)> {
    inner.resources[plural]
        .objects
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

mod deployments;
mod endpointslices;
mod kubelet;

use deployments::Deployments;
#[cfg(test)]
use deployments::fenceposts;
use endpointslices::EndpointSlices;
use kubelet::Kubelet;

#[cfg(test)]
mod tests {
    use super::*;

    fn with(surge: Value, unavailable: Value) -> Value {
        json!({"spec": {"strategy": {"rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}}})
    }

    #[test]
    fn fenceposts_round_as_kubernetes_does() {
        // Surge rounds up, unavailable down.
        assert_eq!(fenceposts(&with(json!("25%"), json!(0)), 4), (1, 0));
        assert_eq!(fenceposts(&with(json!("25%"), json!("25%")), 5), (2, 1));
        assert_eq!(fenceposts(&with(json!("10%"), json!("10%")), 3), (1, 0));
        assert_eq!(fenceposts(&with(json!(2), json!(1)), 4), (2, 1));
        // Both zero: one may be unavailable.
        assert_eq!(fenceposts(&with(json!(0), json!("10%")), 3), (0, 1));
        // The defaults: 25 % and 25 %.
        assert_eq!(fenceposts(&json!({"spec": {}}), 10), (3, 2));
        // Never more unavailable than replicas.
        assert_eq!(fenceposts(&with(json!(1), json!(5)), 2), (1, 2));
    }

    #[test]
    fn template_hashes_are_stable_and_safe() {
        let t = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": []}});
        let h = template_hash(&t);
        assert_eq!(h, template_hash(&t.clone()));
        assert!(h.bytes().all(|b| ALPHANUMS.contains(&b)), "{h}");
        let mut u = t.clone();
        u["metadata"]["annotations"] = json!({RESTARTED_AT: "now"});
        assert_ne!(h, template_hash(&u));
    }
}
