//! The simulated scheduler and kubelet (see [`super`]).

use super::*;

// ---------------------------------------------------------------------------------------------
// Scheduler and kubelet

pub(super) struct Kubelet {
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
    pub(super) fn new(config: KubeletConfig) -> Self {
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
