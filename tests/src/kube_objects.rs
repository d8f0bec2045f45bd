//! Kubernetes objects as the API server stores them (JSON), for the fake API
//! ([`crate::fake_kube`]), and a watcher or node agent running in a task against it.

use std::future::Future;
use std::time::{Duration, Instant};

use clb_client::client::ConnectOptions;
use clb_embedded::{Expected, Harness};
use clb_watcher::{EGRESS_LABEL, Mode, WatcherConfig};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::PATIENCE;

/// A Service `default/name` with `spec`.
pub fn service(name: &str, uid: &str, spec: Value) -> Value {
    json!({"metadata": {"namespace": "default", "name": name, "uid": uid}, "spec": spec})
}

/// One endpoint of an EndpointSlice.
pub fn endpoint(address: &str, node: &str, ready: bool) -> Value {
    json!({"addresses": [address], "nodeName": node, "conditions": {"ready": ready}})
}

/// An EndpointSlice `default/name` of Service `service` (`family`: `IPv4` or `IPv6`).
pub fn slice(name: &str, service: &str, family: &str, endpoints: Vec<Value>) -> Value {
    json!({
        "metadata": {"namespace": "default", "name": name,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": family,
        "endpoints": endpoints,
    })
}

/// A Node with these InternalIPs.
pub fn node(name: &str, ips: &[&str]) -> Value {
    let addresses: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"type": "InternalIP", "address": ip}))
        .collect();
    json!({"metadata": {"name": name, "uid": format!("uid-{name}")}, "status": {"addresses": addresses}})
}

/// A running Pod `default/name` on `node`, with the egress label when `egress` is set.
pub fn pod(name: &str, node: &str, ips: &[&str], egress: Option<&str>) -> Value {
    let mut labels = json!({"app": "demo"});
    if let Some(e) = egress {
        labels[EGRESS_LABEL] = json!(e);
    }
    let pod_ips: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    json!({
        "metadata": {"namespace": "default", "name": name, "uid": format!("uid-{name}"), "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "podIP": ips.first(), "podIPs": pod_ips},
    })
}

/// A Service `default/name` of type LoadBalancer selecting the pods labelled `app=APP`: port 80
/// to their port 8080 (TCP), for the simulated EndpointSlice controller
/// ([`crate::fake_kube::FakeApi::start_controllers`]).
pub fn selecting_service(name: &str, uid: &str, app: &str) -> Value {
    service(
        name,
        uid,
        json!({
            "type": "LoadBalancer",
            "selector": {"app": app},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
        }),
    )
}

/// A Deployment `default/name` of `replicas` pods labelled `app=APP` (one container `c`, port
/// 8080), rolled out with `maxSurge: 25%` and `maxUnavailable: 0`, for the simulated
/// Deployment controller.
pub fn deployment(name: &str, replicas: i64, app: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"namespace": "default", "name": name, "uid": format!("uid-deploy-{name}")},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": app}},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0},
            },
            "template": {
                "metadata": {"labels": {"app": app}},
                "spec": {
                    "containers": [{
                        "name": "c", "image": "demo:1",
                        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    }],
                },
            },
        },
    })
}

/// A Pod `default/name` labelled `app=APP`, not yet scheduled (the simulated scheduler binds it).
pub fn unscheduled_pod(name: &str, app: &str) -> Value {
    json!({
        "metadata": {"namespace": "default", "name": name, "uid": format!("uid-{name}"),
                     "labels": {"app": app}},
        "spec": {"containers": [{"name": "c", "image": "demo:1"}]},
        "status": {"phase": "Pending"},
    })
}

/// `obj` (a Pod, or a Deployment: its template) with a readiness gate on `condition_type`.
pub fn with_readiness_gate(mut obj: Value, condition_type: &str) -> Value {
    let spec = if obj.get("kind").and_then(Value::as_str) == Some("Deployment") {
        &mut obj["spec"]["template"]["spec"]
    } else {
        &mut obj["spec"]
    };
    if !spec["readinessGates"].is_array() {
        spec["readinessGates"] = json!([]);
    }
    spec["readinessGates"]
        .as_array_mut()
        .expect("a list")
        .push(json!({"conditionType": condition_type}));
    obj
}

/// A watcher or node agent (`clb_watcher::run`) in a task.
#[derive(Debug)]
pub struct RunningWatcher {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningWatcher {
    /// Starts `config` against the API `kube` talks to.
    pub fn start(config: WatcherConfig, kube: clb_watcher::KubeClients) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            clb_watcher::run(config, kube, async move {
                let _ = stopped.await;
            })
            .await
            .expect("the watcher runs");
        });
        Self {
            stop: Some(stop),
            task,
        }
    }

    /// Stops it and waits for its end.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        tokio::time::timeout(PATIENCE, &mut self.task)
            .await
            .expect("the watcher stops")
            .expect("the watcher task");
    }
}

/// The tests' watcher settings against the state server at `server`: short coalescing, retries
/// and backoff.
pub fn test_config(server: &str, mode: Mode) -> WatcherConfig {
    let mut config = WatcherConfig::new(ConnectOptions::new(server), mode);
    config.coalesce = Duration::from_millis(20);
    config.backoff_initial = Duration::from_millis(50);
    config.backoff_max = Duration::from_millis(500);
    config
}

/// Polls `check` until it succeeds; panics with `what` and its last error after [`PATIENCE`]
/// (a bound on a hung test, not a timing assertion).
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        match check().await {
            Ok(t) => return t,
            Err(e) if Instant::now() >= deadline => panic!("{what}: not after {PATIENCE:?}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
}

/// Waits until NRP (the emulator of `h`) equals `expected` with nothing pending.
pub async fn converge(h: &Harness, expected: &Expected) {
    eventually("NRP equals the expected state", || async {
        h.try_converge(expected, Duration::from_secs(2)).await
    })
    .await;
}

/// Our condition (`clb.azure.com/Programmed`) of Service `default/name`, if it has one.
pub fn condition_of(fake: &crate::fake_kube::FakeApi, name: &str) -> Option<Value> {
    fake.get("services", "default", name)?
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == clb_watcher::CONDITION_TYPE)
        .cloned()
}

/// Waits until Service `default/name` shows our condition with `reason`; returns it.
pub async fn wait_condition(fake: &crate::fake_kube::FakeApi, name: &str, reason: &str) -> Value {
    eventually(&format!("{name} shows condition {reason}"), || async {
        let c = condition_of(fake, name).ok_or("no condition")?;
        (c["reason"] == reason)
            .then(|| c.clone())
            .ok_or_else(|| format!("{c}"))
    })
    .await
}
