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
//! - the **EndpointSlice controller**: one IPv4 slice `{service}-{hash}` per Service with a
//!   selector, listing each matching pod of its namespace that has an IP (`ready`, `serving`,
//!   `terminating` as the real controller derives them), its ports (a numeric or named
//!   `targetPort` resolved);
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

// ---------------------------------------------------------------------------------------------
// Scheduler and kubelet

struct Kubelet {
    config: KubeletConfig,
    /// When the kubelet first saw each pod (by uid) on its node.
    started: HashMap<String, Instant>,
    /// When it saw each pod's deletion.
    deleting: HashMap<String, Instant>,
    /// Node name → i of its CIDR `10.244.i.0/24`.
    node_index: HashMap<String, u8>,
    /// The last host number allocated on each node.
    cursor: HashMap<String, u8>,
    /// Pods scheduled so far (round-robin).
    scheduled: usize,
}

impl Kubelet {
    fn new(config: KubeletConfig) -> Self {
        Self {
            config,
            started: HashMap::new(),
            deleting: HashMap::new(),
            node_index: HashMap::new(),
            cursor: HashMap::new(),
            scheduled: 0,
        }
    }

    /// A free IP of `node`'s CIDR, round-robin from the last one (as host-local IPAM).
    fn allocate(&mut self, node: &str, in_use: &mut HashSet<Ipv4Addr>) -> Option<Ipv4Addr> {
        let i = self.node_index[node];
        let cursor = self.cursor.entry(node.to_owned()).or_insert(1);
        for _ in 0..253 {
            *cursor = if *cursor >= 254 { 2 } else { *cursor + 1 };
            let ip = Ipv4Addr::new(10, 244, i, *cursor);
            if in_use.insert(ip) {
                return Some(ip);
            }
        }
        None
    }

    /// The status the kubelet reports for a pod on `node` (from its current status: other
    /// writers' fields and conditions are kept).
    fn status(
        &mut self,
        pod: &Value,
        node: &Value,
        containers_ready: bool,
        in_use: &mut HashSet<Ipv4Addr>,
    ) -> Value {
        let mut st = pod.get("status").cloned().unwrap_or_default();
        if !st.is_object() {
            st = json!({});
        }
        st["phase"] = json!("Running");
        let host_ips: Vec<&str> = node
            .pointer("/status/addresses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|a| a.get("type").and_then(Value::as_str) == Some("InternalIP"))
            .filter_map(|a| a.get("address").and_then(Value::as_str))
            .collect();
        if let Some(first) = host_ips.first() {
            st["hostIP"] = json!(first);
            st["hostIPs"] = json!(
                host_ips
                    .iter()
                    .map(|ip| json!({"ip": ip}))
                    .collect::<Vec<_>>()
            );
        }
        if pointer_str(&st, "/podIP").is_none_or(str::is_empty) {
            let node_name = s(node, "/metadata/name");
            if let Some(ip) = self.allocate(&node_name, in_use) {
                st["podIP"] = json!(ip.to_string());
                st["podIPs"] = json!([{"ip": ip.to_string()}]);
            }
        } else if !st["podIPs"].is_array() {
            st["podIPs"] = json!([{"ip": st["podIP"].clone()}]);
        }
        if pointer_str(&st, "/startTime").is_none() {
            st["startTime"] = json!(now());
        }
        let containers: Vec<&Value> = pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default();
        let names: Vec<String> = containers.iter().map(|c| s(c, "/name")).collect();
        let unready = || {
            Some((
                "ContainersNotReady",
                format!("containers with unready status: [{}]", names.join(" ")),
            ))
        };
        set_condition(&mut st, pod_condition("PodScheduled", true, None));
        set_condition(&mut st, pod_condition("Initialized", true, None));
        set_condition(
            &mut st,
            pod_condition(
                "ContainersReady",
                containers_ready,
                (!containers_ready).then(unready).flatten(),
            ),
        );
        let gate_problem = pod
            .pointer("/spec/readinessGates")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|g| g.get("conditionType").and_then(Value::as_str))
            .find_map(|gate| match condition(&json!({"status": st}), gate) {
                Some("True") => None,
                Some(other) => Some(format!(
                    "the status of pod readiness gate {gate:?} is not \"True\", but {other}"
                )),
                None => Some(format!(
                    "corresponding condition of pod readiness gate {gate:?} does not exist."
                )),
            });
        let ready = match (containers_ready, gate_problem) {
            (false, _) => pod_condition("Ready", false, unready()),
            (true, Some(problem)) => {
                pod_condition("Ready", false, Some(("ReadinessGatesNotReady", problem)))
            }
            (true, None) => pod_condition("Ready", true, None),
        };
        set_condition(&mut st, ready);
        let started_at = st["startTime"].clone();
        let uid = s(pod, "/metadata/uid");
        st["containerStatuses"] = json!(
            containers
                .iter()
                .map(|c| json!({
                    "name": c.get("name"),
                    "image": c.get("image"),
                    "imageID": "",
                    "containerID": format!("containerd://{uid}-{}", s(c, "/name")),
                    "ready": containers_ready,
                    "started": true,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": started_at}},
                }))
                .collect::<Vec<_>>()
        );
        st
    }

    /// A terminating pod's status: its containers stopped (not ready); `terminal`: the pod has
    /// ended (`Succeeded`), as the kubelet reports before the final deletion.
    fn stopped(pod: &Value, terminal: bool) -> Value {
        let mut st = pod.get("status").cloned().unwrap_or_default();
        if !st.is_object() {
            st = json!({});
        }
        let why = || {
            Some((
                "ContainersNotReady",
                "containers with unready status".to_owned(),
            ))
        };
        set_condition(&mut st, pod_condition("ContainersReady", false, why()));
        set_condition(&mut st, pod_condition("Ready", false, why()));
        if let Some(list) = st["containerStatuses"].as_array_mut() {
            for c in list {
                c["ready"] = json!(false);
            }
        }
        if terminal {
            st["phase"] = json!("Succeeded");
        }
        st
    }

    /// A terminating pod on a node: not ready, then removed when its grace is over.
    fn terminate(
        &mut self,
        inner: &mut Inner,
        key: &Key,
        pod: &Value,
        now: Instant,
    ) -> Option<Instant> {
        let since = *self.deleting.entry(pod_id(pod)).or_insert(now);
        let grace_secs = pod
            .pointer("/metadata/deletionGracePeriodSeconds")
            .or_else(|| pod.pointer("/spec/terminationGracePeriodSeconds"))
            .and_then(Value::as_i64)
            .unwrap_or(30)
            .max(0)
            .unsigned_abs();
        let grace = Duration::from_secs(grace_secs).min(self.config.termination_grace);
        if now >= since + grace {
            if finalizers(pod).is_empty() {
                inner.commit("pods", key.clone(), None);
            } else {
                // The final DELETE with grace 0: the pod goes when its finalizers are removed.
                let mut done = pod.clone();
                done["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                done["status"] = Self::stopped(pod, true);
                if &done != pod {
                    inner.commit("pods", key.clone(), Some(done));
                }
            }
            return None;
        }
        let mut next = earliest(None, since + grace);
        let unready_at = since + self.config.ready_while_terminating;
        if now >= unready_at {
            let st = Self::stopped(pod, false);
            if pod.get("status") != Some(&st) {
                let mut p = pod.clone();
                p["status"] = st;
                inner.commit("pods", key.clone(), Some(p));
            }
        } else {
            next = earliest(next, unready_at);
        }
        next
    }
}

impl Controller for Kubelet {
    const WATCHES: &'static [&'static str] = &["pods", "nodes"];

    fn reconcile(&mut self, inner: &mut Inner, now: Instant) -> Option<Instant> {
        let nodes: Vec<Value> = inner.resources["nodes"].objects.values().cloned().collect();
        for n in &nodes {
            let i = u8::try_from(self.node_index.len()).expect("at most 256 nodes");
            self.node_index.entry(s(n, "/metadata/name")).or_insert(i);
        }
        let pods = snapshot(inner, "pods");
        let mut in_use: HashSet<Ipv4Addr> = pods
            .iter()
            .flat_map(|(_, p)| {
                let ips = p.pointer("/status/podIPs").and_then(Value::as_array);
                ips.into_iter()
                    .flatten()
                    .filter_map(|i| i.get("ip")?.as_str()?.parse().ok())
                    .chain(pointer_str(p, "/status/podIP").and_then(|i| i.parse().ok()))
            })
            .collect();
        let mut next = None;
        let mut live = HashSet::new();
        for (key, pod) in pods {
            live.insert(pod_id(&pod));
            let node_name = s(&pod, "/spec/nodeName");
            if node_name.is_empty() {
                // The scheduler: bind to the next schedulable node.
                let candidates: Vec<&Value> = nodes
                    .iter()
                    .filter(|n| n.pointer("/spec/unschedulable") != Some(&json!(true)))
                    .collect();
                if terminating(&pod) || terminal(&pod) || candidates.is_empty() {
                    continue;
                }
                let node = candidates[self.scheduled % candidates.len()];
                self.scheduled += 1;
                let mut pod = pod;
                pod["spec"]["nodeName"] = json!(s(node, "/metadata/name"));
                set_condition(
                    &mut pod["status"],
                    pod_condition("PodScheduled", true, None),
                );
                inner.commit("pods", key, Some(pod));
                continue;
            }
            let Some(node) = nodes.iter().find(|n| s(n, "/metadata/name") == node_name) else {
                continue;
            };
            if terminating(&pod) {
                if let Some(t) = self.terminate(inner, &key, &pod, now) {
                    next = earliest(next, t);
                }
                continue;
            }
            if terminal(&pod) {
                continue;
            }
            let started = *self.started.entry(pod_id(&pod)).or_insert(now);
            let ready_at = started + self.config.containers_ready_after;
            let containers_ready = now >= ready_at;
            if !containers_ready {
                next = earliest(next, ready_at);
            }
            let st = self.status(&pod, node, containers_ready, &mut in_use);
            if pod.get("status") != Some(&st) {
                let mut pod = pod;
                pod["status"] = st;
                inner.commit("pods", key, Some(pod));
            }
        }
        self.started.retain(|uid, _| live.contains(uid));
        self.deleting.retain(|uid, _| live.contains(uid));
        next
    }
}

// ---------------------------------------------------------------------------------------------
// EndpointSlice controller

struct EndpointSlices;

fn labels_contain(obj: &Value, selector: &Map<String, Value>) -> bool {
    let labels = obj.pointer("/metadata/labels");
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

fn pod_ipv4(pod: &Value) -> Option<String> {
    let listed = pod
        .pointer("/status/podIPs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|i| i.get("ip").and_then(Value::as_str));
    listed
        .chain(pointer_str(pod, "/status/podIP"))
        .find(|ip| ip.parse::<Ipv4Addr>().is_ok())
        .map(str::to_owned)
}

/// The port of a pod's container named `name`.
fn named_port(pod: &Value, name: &str) -> Option<i64> {
    pod.pointer("/spec/containers")?
        .as_array()?
        .iter()
        .filter_map(|c| c.get("ports").and_then(Value::as_array))
        .flatten()
        .find(|p| p.get("name").and_then(Value::as_str) == Some(name))?
        .get("containerPort")?
        .as_i64()
}

/// The fields of a Service's slice the controller owns: labels, owner, address type, endpoints,
/// ports.
fn desired_slice(
    svc: &Value,
    selector: &Map<String, Value>,
    pods: &[&Value],
    zones: &HashMap<String, String>,
) -> Value {
    let ns = s(svc, "/metadata/namespace");
    let name = s(svc, "/metadata/name");
    let publish = svc.pointer("/spec/publishNotReadyAddresses") == Some(&json!(true));
    let mut members: Vec<(&Value, String)> = pods
        .iter()
        .filter(|p| {
            s(p, "/metadata/namespace") == ns && labels_contain(p, selector) && !terminal(p)
        })
        .filter_map(|p| pod_ipv4(p).map(|ip| (*p, ip)))
        .collect();
    members.sort_by_key(|(p, _)| s(p, "/metadata/name"));
    let endpoints: Vec<Value> = members
        .iter()
        .map(|(p, ip)| {
            let ready_pod = pod_ready(p);
            let deleting = terminating(p);
            let serving = publish || ready_pod;
            let mut e = json!({
                "addresses": [ip],
                "conditions": {
                    "ready": publish || (ready_pod && !deleting),
                    "serving": serving,
                    "terminating": deleting,
                },
                "targetRef": {
                    "kind": "Pod",
                    "namespace": ns,
                    "name": s(p, "/metadata/name"),
                    "uid": s(p, "/metadata/uid"),
                },
            });
            let node = s(p, "/spec/nodeName");
            if !node.is_empty() {
                if let Some(zone) = zones.get(&node) {
                    e["zone"] = json!(zone);
                }
                e["nodeName"] = json!(node);
            }
            e
        })
        .collect();
    let ports: Vec<Value> = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|sp| {
            let port = match sp.get("targetPort") {
                None | Some(Value::Null) => sp.get("port")?.as_i64()?,
                Some(Value::Number(n)) => n.as_i64()?,
                Some(Value::String(t)) => match t.parse::<i64>() {
                    Ok(n) => n,
                    Err(_) => members.iter().find_map(|(p, _)| named_port(p, t))?,
                },
                Some(_) => return None,
            };
            let mut out = json!({
                "name": sp.get("name").and_then(Value::as_str).unwrap_or(""),
                "port": port,
                "protocol": sp.get("protocol").and_then(Value::as_str).unwrap_or("TCP"),
            });
            if let Some(app) = sp.get("appProtocol") {
                out["appProtocol"] = app.clone();
            }
            Some(out)
        })
        .collect();
    let mut labels = string_map(svc.pointer("/metadata/labels"));
    labels.insert(SERVICE_NAME_LABEL.to_owned(), json!(name));
    labels.insert(MANAGED_BY_LABEL.to_owned(), json!(ENDPOINTSLICE_CONTROLLER));
    json!({
        "metadata": {
            "labels": labels,
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Service", "name": name,
                "uid": s(svc, "/metadata/uid"), "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": ports,
    })
}

/// Whether slice `cur` differs from `desired` in the fields the controller owns.
fn slice_differs(cur: &Value, desired: &Value) -> bool {
    [
        "/metadata/labels",
        "/metadata/ownerReferences",
        "/addressType",
        "/endpoints",
        "/ports",
    ]
    .iter()
    .any(|p| cur.pointer(p) != desired.pointer(p))
}

impl Controller for EndpointSlices {
    const WATCHES: &'static [&'static str] = &["services", "pods", "endpointslices", "nodes"];

    fn reconcile(&mut self, inner: &mut Inner, _now: Instant) -> Option<Instant> {
        let services = snapshot(inner, "services");
        let pods: Vec<Value> = inner.resources["pods"].objects.values().cloned().collect();
        let pods: Vec<&Value> = pods.iter().collect();
        let zones: HashMap<String, String> = inner.resources["nodes"]
            .objects
            .values()
            .filter_map(|n| {
                let zone = pointer_str(n, "/metadata/labels/topology.kubernetes.io~1zone")?;
                Some((s(n, "/metadata/name"), zone.to_owned()))
            })
            .collect();
        let managed: Vec<(Key, Value)> = snapshot(inner, "endpointslices")
            .into_iter()
            .filter(|(_, sl)| {
                pointer_str(
                    sl,
                    &format!("/metadata/labels/{}", MANAGED_BY_LABEL.replace('/', "~1")),
                ) == Some(ENDPOINTSLICE_CONTROLLER)
            })
            .collect();
        let mut kept: HashSet<Key> = HashSet::new();
        for (key, svc) in services {
            let selector = string_map(svc.pointer("/spec/selector"));
            if selector.is_empty()
                || pointer_str(&svc, "/spec/type") == Some("ExternalName")
                || terminating(&svc)
            {
                continue;
            }
            let desired = desired_slice(&svc, &selector, &pods, &zones);
            let mine = managed.iter().find(|(k, sl)| {
                k.0 == key.0
                    && pointer_str(sl, "/metadata/labels/kubernetes.io~1service-name")
                        == Some(key.1.as_str())
            });
            match mine {
                Some((k, cur)) => {
                    kept.insert(k.clone());
                    if slice_differs(cur, &desired) {
                        let mut next = cur.clone();
                        for f in ["addressType", "endpoints", "ports"] {
                            next[f] = desired[f].clone();
                        }
                        for f in ["labels", "ownerReferences"] {
                            next["metadata"][f] = desired["metadata"][f].clone();
                        }
                        inner.commit("endpointslices", k.clone(), Some(next));
                    }
                }
                None => {
                    let mut name = format!("{}-{}", key.1, short_hash(&s(&svc, "/metadata/uid")));
                    while inner.resources["endpointslices"]
                        .objects
                        .contains_key(&(key.0.clone(), name.clone()))
                    {
                        name = format!("{}-{}", key.1, random_suffix(5));
                    }
                    let mut slice = desired;
                    let n = inner.rv + 1;
                    slice["metadata"]["namespace"] = json!(key.0);
                    slice["metadata"]["name"] = json!(name);
                    slice["metadata"]["generateName"] = json!(format!("{}-", key.1));
                    slice["metadata"]["uid"] = json!(format!("uid-endpointslices-{n}"));
                    slice["metadata"]["creationTimestamp"] = json!(now());
                    let k = (key.0.clone(), name);
                    kept.insert(k.clone());
                    inner.commit("endpointslices", k, Some(slice));
                }
            }
        }
        for (k, _) in managed {
            if !kept.contains(&k) {
                inner.commit("endpointslices", k, None);
            }
        }
        None
    }
}

// ---------------------------------------------------------------------------------------------
// Deployment controller

struct Deployments;

/// `maxSurge` (rounded up) and `maxUnavailable` (rounded down) of a Deployment of `replicas`,
/// as Kubernetes resolves them (`ResolveFenceposts`: both 0 makes `maxUnavailable` 1).
fn fenceposts(d: &Value, replicas: i64) -> (i64, i64) {
    let resolve = |v: Option<&Value>, up: bool| -> i64 {
        match v {
            Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
            Some(Value::String(p)) if p.ends_with('%') => {
                let pct: i64 = p.trim_end_matches('%').parse().unwrap_or(0);
                let x = pct * replicas;
                if up { (x + 99) / 100 } else { x / 100 }
            }
            Some(Value::String(n)) => n.parse().unwrap_or(0),
            _ => {
                let x = 25 * replicas;
                if up { (x + 99) / 100 } else { x / 100 }
            }
        }
    };
    let ru = d.pointer("/spec/strategy/rollingUpdate");
    let surge = resolve(ru.and_then(|r| r.get("maxSurge")), true).max(0);
    let mut unavailable = resolve(ru.and_then(|r| r.get("maxUnavailable")), false).max(0);
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    (surge, unavailable.min(replicas))
}

/// The order in which a ReplicaSet deletes pods (first deleted first): unscheduled, pending,
/// not ready, then the newest.
fn deletion_rank(pod: &Value) -> (bool, bool, bool, std::cmp::Reverse<u64>) {
    let created: u64 = s(pod, "/metadata/uid")
        .rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    (
        !s(pod, "/spec/nodeName").is_empty(),
        pointer_str(pod, "/status/phase") == Some("Running"),
        pod_ready(pod),
        std::cmp::Reverse(created),
    )
}

impl Deployments {
    fn create_pod(inner: &mut Inner, d: &Value, hash: &str) {
        let ns = s(d, "/metadata/namespace");
        let dname = s(d, "/metadata/name");
        let name = loop {
            let name = format!("{dname}-{hash}-{}", random_suffix(5));
            if !inner.resources["pods"]
                .objects
                .contains_key(&(ns.clone(), name.clone()))
            {
                break name;
            }
        };
        let template = &d["spec"]["template"];
        let mut labels = string_map(template.pointer("/metadata/labels"));
        labels.insert(POD_TEMPLATE_HASH.to_owned(), json!(hash));
        let mut metadata = json!({
            "namespace": ns,
            "name": name,
            "generateName": format!("{dname}-{hash}-"),
            "labels": labels,
            "uid": format!("uid-pods-{}", inner.rv + 1),
            "creationTimestamp": now(),
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "Deployment", "name": dname,
                "uid": s(d, "/metadata/uid"), "controller": true, "blockOwnerDeletion": true,
            }],
        });
        if let Some(a) = template
            .pointer("/metadata/annotations")
            .filter(|a| a.is_object())
        {
            metadata["annotations"] = a.clone();
        }
        let pod = json!({
            "metadata": metadata,
            "spec": template.get("spec").cloned().unwrap_or_else(|| json!({})),
            "status": {"phase": "Pending"},
        });
        inner.commit("pods", (ns, name), Some(pod));
    }

    /// Deletes the first `n` of `pods` in deletion order, through the API's deletion path.
    fn delete_pods(inner: &mut Inner, mut pods: Vec<&(Key, Value)>, n: usize) -> usize {
        pods.sort_by_key(|(_, p)| deletion_rank(p));
        let n = n.min(pods.len());
        for (key, _) in pods.into_iter().take(n) {
            inner.delete("pods", key.clone(), None);
        }
        n
    }

    /// One step of a rollout; whether it changed anything.
    fn step(
        inner: &mut Inner,
        d: &Value,
        hash: &str,
        new: &[&(Key, Value)],
        old: &[&(Key, Value)],
        any_old_left: bool,
    ) -> bool {
        let replicas = usize::try_from(
            d.pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(1)
                .max(0),
        )
        .unwrap_or(0);
        let recreate = pointer_str(d, "/spec/strategy/type") == Some("Recreate");
        if recreate {
            if !old.is_empty() {
                return Self::delete_pods(inner, old.to_vec(), old.len()) > 0;
            }
            if any_old_left {
                return false;
            }
        }
        if new.len() > replicas {
            return Self::delete_pods(inner, new.to_vec(), new.len() - replicas) > 0;
        }
        let (surge, unavailable) = fenceposts(d, i64::try_from(replicas).unwrap_or(0));
        let (surge, unavailable) = (
            usize::try_from(surge).unwrap_or(0),
            usize::try_from(unavailable).unwrap_or(0),
        );
        let total = new.len() + old.len();
        if new.len() < replicas {
            let allowed = if recreate { replicas } else { replicas + surge };
            let up = allowed.saturating_sub(total).min(replicas - new.len());
            if up > 0 {
                for _ in 0..up {
                    Self::create_pod(inner, d, hash);
                }
                return true;
            }
        }
        if old.is_empty() {
            return false;
        }
        // As `reconcileOldReplicaSets`: never below `replicas - maxUnavailable` available.
        let min_available = replicas.saturating_sub(unavailable);
        let new_unavailable = new.iter().filter(|(_, p)| !pod_ready(p)).count();
        let Some(max_scaled_down) = total
            .checked_sub(min_available + new_unavailable)
            .filter(|m| *m > 0)
        else {
            return false;
        };
        let unhealthy: Vec<&(Key, Value)> =
            old.iter().copied().filter(|(_, p)| !pod_ready(p)).collect();
        let mut deleted = Self::delete_pods(inner, unhealthy, max_scaled_down);
        let available = new.iter().chain(old).filter(|(_, p)| pod_ready(p)).count();
        if available > min_available {
            let healthy: Vec<&(Key, Value)> =
                old.iter().copied().filter(|(_, p)| pod_ready(p)).collect();
            deleted += Self::delete_pods(inner, healthy, available - min_available);
        }
        deleted > 0
    }

    fn status(d: &Value, new: &[&(Key, Value)], old: &[&(Key, Value)]) -> Value {
        let replicas = d
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1)
            .max(0);
        let (_, unavailable) = fenceposts(d, replicas);
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let ready = count(new.iter().chain(old).filter(|(_, p)| pod_ready(p)).count());
        let mut st = d.get("status").cloned().unwrap_or_default();
        if !st.is_object() {
            st = json!({});
        }
        st["observedGeneration"] = d
            .pointer("/metadata/generation")
            .cloned()
            .unwrap_or(json!(1));
        // As the API server serializes them: zero counts are omitted.
        for (f, v) in [
            ("replicas", count(new.len() + old.len())),
            ("updatedReplicas", count(new.len())),
            ("readyReplicas", ready),
            ("availableReplicas", ready),
            ("unavailableReplicas", (replicas - ready).max(0)),
        ] {
            if v == 0 {
                st.as_object_mut().expect("an object").remove(f);
            } else {
                st[f] = json!(v);
            }
        }
        let available = ready >= replicas - unavailable;
        set_condition(
            &mut st,
            json!({
                "type": "Available",
                "status": if available { "True" } else { "False" },
                "reason": if available { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
                "message": if available {
                    "Deployment has minimum availability."
                } else {
                    "Deployment does not have minimum availability."
                },
            }),
        );
        let complete = old.is_empty() && count(new.len()) == replicas && ready == replicas;
        let name = s(d, "/metadata/name");
        set_condition(
            &mut st,
            json!({
                "type": "Progressing",
                "status": "True",
                "reason": if complete { "NewReplicaSetAvailable" } else { "ReplicaSetUpdated" },
                "message": if complete {
                    format!("Deployment \"{name}\" has successfully progressed.")
                } else {
                    format!("Deployment \"{name}\" is progressing.")
                },
            }),
        );
        st
    }
}

impl Controller for Deployments {
    const WATCHES: &'static [&'static str] = &["deployments", "pods"];

    fn reconcile(&mut self, inner: &mut Inner, _now: Instant) -> Option<Instant> {
        let deployments = snapshot(inner, "deployments");
        let pods = snapshot(inner, "pods");
        let uids: HashSet<String> = deployments
            .iter()
            .map(|(_, d)| s(d, "/metadata/uid"))
            .collect();
        // Garbage collection: the pods of a Deployment that is gone.
        for (key, pod) in &pods {
            let owner_is_deployment = pod
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|refs| {
                    refs.iter().any(|r| {
                        r.get("kind").and_then(Value::as_str) == Some("Deployment")
                            && r.get("controller").and_then(Value::as_bool) == Some(true)
                    })
                });
            if owner_is_deployment
                && !terminating(pod)
                && controller_uid(pod).is_some_and(|u| !uids.contains(&u))
            {
                inner.delete("pods", key.clone(), None);
            }
        }
        for (key, d) in deployments {
            if terminating(&d) || d.pointer("/spec/paused") == Some(&json!(true)) {
                continue;
            }
            let uid = s(&d, "/metadata/uid");
            let hash = template_hash(&d["spec"]["template"]);
            let owned: Vec<&(Key, Value)> = pods
                .iter()
                .filter(|(k, p)| k.0 == key.0 && controller_uid(p).as_deref() == Some(uid.as_str()))
                .collect();
            let is_new = |p: &Value| {
                pointer_str(p, &format!("/metadata/labels/{POD_TEMPLATE_HASH}"))
                    == Some(hash.as_str())
            };
            let active = |p: &Value| !terminating(p) && !terminal(p);
            let new: Vec<&(Key, Value)> = owned
                .iter()
                .copied()
                .filter(|(_, p)| active(p) && is_new(p))
                .collect();
            let old: Vec<&(Key, Value)> = owned
                .iter()
                .copied()
                .filter(|(_, p)| active(p) && !is_new(p))
                .collect();
            let any_old_left = owned.iter().any(|(_, p)| !is_new(p) && !terminal(p));
            if Self::step(inner, &d, &hash, &new, &old, any_old_left) {
                // The next pass (woken by these changes) writes the status.
                continue;
            }
            let st = Self::status(&d, &new, &old);
            if d.get("status") != Some(&st) {
                let mut d = d;
                d["status"] = st;
                inner.commit("deployments", key, Some(d));
            }
        }
        None
    }
}

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
