//! Nothing in the watcher dies silently (issue 34): each of its tasks — a sender, the write-back,
//! the readiness gate, a node move, the PoolService side, the kube side — made to end or panic
//! (faults injected through `clb_watcher::faults`, feature `test-support`, once the watcher runs
//! and has programmed a Service) stops `clb_watcher::run` with `WatcherError::TaskEnded` naming
//! it, and the other tasks stop with it; an invalid state-server endpoint stops it with the
//! client's error; the real `clb-watcher` binary exits non-zero with a log line naming the task.
//! Against the fake Kubernetes API and a real state server (no NRP: nothing becomes actual).

use std::sync::Arc;
use std::time::Duration;

use clb_client::client::{Client, ClientError, ConnectOptions};
use clb_state_server::state::ServerConfig;
use clb_tests::fake_kube::{FakeApi, finalizers};
use clb_tests::kube_objects::{endpoint as ep, eventually, service as svc, slice, test_config};
use clb_tests::{PATIENCE, ServerProc, init_tracing};
use clb_watcher::faults::Fault;
use clb_watcher::supervise::{
    KUBE_SIDE, NODE_MOVE, POOL_SERVICE_SIDE, READINESS_GATE, SENDER, WRITE_BACK,
};
use clb_watcher::webhook::{GATE_LABEL, GATE_LABEL_VALUE};
use clb_watcher::{DEFAULT_CLASS, FINALIZER, Gateways, Mode, WatcherConfig, WatcherError};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

const WEB: &str = "5a0c0d4e-0000-4000-8000-0000000000a1";

const GATEWAYS: &str = r#"
gateways:
  - name: a
    nodes: {pool: pool-a}
    azure: {subscription: s, resourceGroup: rg-a, region: eastus}
  - name: b
    nodes: {pool: pool-b}
    azure: {subscription: s, resourceGroup: rg-b, region: westus}
"#;

/// A Node in node pool `pool` with one InternalIP.
fn node(name: &str, pool: &str, ip: &str) -> Value {
    json!({
        "metadata": {"name": name, "uid": format!("uid-{name}"),
                     "labels": {"apps.openyurt.io/nodepool": pool}},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
    })
}

struct Setup {
    fake: FakeApi,
    server: ServerProc,
    client: Client,
    /// Several gateways (`a`, `b`), or the server's default one.
    gateways: bool,
}

/// The fake API with node `n-a` (pool-a), Service `web` and its endpoint there; a state server
/// (driving `a` and `b` when `gateways`).
async fn setup(gateways: bool) -> Setup {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let fake = FakeApi::start().await;
    fake.put("nodes", node("n-a", "pool-a", "10.0.0.1"));
    fake.put(
        "services",
        svc(
            "web",
            WEB,
            json!({"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}),
        ),
    );
    fake.put(
        "endpointslices",
        slice("web-1", "web", "IPv4", vec![ep("10.1.0.1", "n-a", true)]),
    );
    let server = ServerProc::start(ServerConfig {
        gateways: if gateways {
            vec!["a".into(), "b".into()]
        } else {
            ServerConfig::default().gateways
        },
        ..ServerConfig::default()
    })
    .await;
    let client = Client::connect(ConnectOptions::new(server.url()))
        .await
        .expect("connect");
    Setup {
        fake,
        server,
        client,
        gateways,
    }
}

fn config(s: &Setup) -> WatcherConfig {
    let mut c = test_config(&s.server.url(), Mode::Cluster { pods: true });
    if s.gateways {
        c.gateways = Some(Arc::new(Gateways::parse(GATEWAYS).expect("gateways file")));
        c.move_bound = Duration::from_secs(3600);
    }
    c
}

/// `clb_watcher::run` in a task, never asked to stop.
fn start(s: &Setup, config: WatcherConfig) -> JoinHandle<Result<(), WatcherError>> {
    let kube = s.fake.watcher_clients();
    tokio::spawn(clb_watcher::run(config, kube, std::future::pending()))
}

/// Waits until every task works: `web` carries our finalizer (the write-back) and the state
/// server desires it (a sender).
async fn steady(s: &Setup) {
    let gateway = if s.gateways { "a" } else { "" };
    eventually("web programmed: finalizer and desired", || async {
        let obj = s.fake.get("services", "default", "web").ok_or("no web")?;
        if !finalizers(&obj).iter().any(|f| f == FINALIZER) {
            return Err("no finalizer yet".to_owned());
        }
        let client = if gateway.is_empty() {
            s.client.clone()
        } else {
            s.client.with_gateway(gateway)
        };
        match client.service(WEB).await {
            Ok(st) if st.desired => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// The error `run` ended with (at most [`PATIENCE`]).
async fn ended(w: JoinHandle<Result<(), WatcherError>>) -> WatcherError {
    tokio::time::timeout(PATIENCE, w)
        .await
        .expect("the watcher stops")
        .expect("run does not panic")
        .expect_err("run ends with an error")
}

/// Asserts `e` is `TaskEnded` of `task` with a reason containing `why`.
fn assert_ended(e: &WatcherError, task: &str, why: &str) {
    match e {
        WatcherError::TaskEnded { task: t, reason } => {
            assert_eq!(*t, task, "{e}");
            assert!(reason.contains(why), "{e}");
            assert!(e.to_string().contains(task), "{e}");
        }
        other => panic!("not TaskEnded of {task}: {other:?}"),
    }
}

/// Service `name` (LoadBalancer, port 80).
fn another_service(name: &str, uid: &str) -> Value {
    svc(
        name,
        uid,
        json!({"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_that_panics_stops_the_watcher_and_the_write_back_with_it() {
    let s = setup(false).await;
    let c = config(&s);
    let faults = c.faults.clone();
    let w = start(&s, c);
    steady(&s).await;
    faults.inject(SENDER, Fault::Panic);
    // A change wakes the sender.
    s.fake.put(
        "endpointslices",
        slice(
            "web-1",
            "web",
            "IPv4",
            vec![ep("10.1.0.1", "n-a", true), ep("10.1.0.2", "n-a", true)],
        ),
    );
    let e = ended(w).await;
    assert_ended(
        &e,
        SENDER,
        "it panicked: a panic injected by a test into the sender",
    );
    // The others were stopped: a new Service gets no finalizer (the write-back is gone).
    s.fake.put(
        "services",
        another_service("late", "5a0c0d4e-0000-4000-8000-0000000000a2"),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let late = s.fake.get("services", "default", "late").expect("late");
    assert!(finalizers(&late).is_empty(), "{late}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_state_server_endpoint_stops_the_watcher_with_the_clients_error() {
    let s = setup(false).await;
    let mut c = config(&s);
    c.server = ConnectOptions::new("http://not a host");
    let e = ended(start(&s, c)).await;
    assert!(
        matches!(
            &e,
            WatcherError::Client(ClientError::InvalidEndpoint { .. })
        ),
        "{e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_back_whose_inbox_closes_stops_the_watcher() {
    let s = setup(false).await;
    let c = config(&s);
    let faults = c.faults.clone();
    let w = start(&s, c);
    steady(&s).await;
    faults.inject(WRITE_BACK, Fault::End);
    s.fake.put(
        "services",
        another_service("next", "5a0c0d4e-0000-4000-8000-0000000000a3"),
    );
    let e = ended(w).await;
    assert_ended(&e, WRITE_BACK, "its inbox closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_gate_that_panics_stops_the_watcher() {
    let s = setup(false).await;
    let mut c = config(&s);
    c.readiness_gate = true;
    let faults = c.faults.clone();
    let w = start(&s, c);
    steady(&s).await;
    faults.inject(READINESS_GATE, Fault::Panic);
    // A gated pod: an event of the gate's watch.
    s.fake.put(
        "pods",
        json!({
            "metadata": {"namespace": "default", "name": "gated", "uid": "uid-gated",
                         "labels": {GATE_LABEL: GATE_LABEL_VALUE}},
            "spec": {"nodeName": "n-a", "containers": [{"name": "c", "image": "i"}],
                     "readinessGates": [{"conditionType": "clb.azure.com/programmed"}]},
            "status": {"phase": "Running", "podIP": "10.1.0.1", "podIPs": [{"ip": "10.1.0.1"}]},
        }),
    );
    let e = ended(w).await;
    assert_ended(&e, READINESS_GATE, "it panicked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_move_that_panics_stops_the_watcher() {
    let s = setup(true).await;
    let c = config(&s);
    let faults = c.faults.clone();
    let w = start(&s, c);
    steady(&s).await;
    faults.inject(NODE_MOVE, Fault::Panic);
    // n-a moves to pool-b: a move task holds it at gateway a.
    s.fake.put("nodes", node("n-a", "pool-b", "10.0.0.1"));
    let e = ended(w).await;
    assert_ended(&e, NODE_MOVE, "it panicked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_move_that_is_done_is_not_an_error() {
    let s = setup(true).await;
    let mut c = config(&s);
    // Released at once: the move's task ends, its work done.
    c.move_bound = Duration::from_millis(1);
    let w = start(&s, c);
    steady(&s).await;
    s.fake.put("nodes", node("n-a", "pool-b", "10.0.0.1"));
    // The endpoint leaves gateway a once the move is released; the watcher runs on.
    eventually("n-a released from gateway a", || async {
        match s.client.with_gateway("a").location("10.0.0.1").await {
            Ok(l) if l.addresses.iter().any(|a| a.desired) => Err(format!("{l:?}")),
            _ => Ok(()),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!w.is_finished(), "the watcher stopped: {:?}", w.await);
    w.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_service_side_that_panics_stops_the_watcher() {
    let s = setup(true).await;
    let mut c = config(&s);
    c.pool_services = true;
    let faults = c.faults.clone();
    let w = start(&s, c);
    steady(&s).await;
    faults.inject(POOL_SERVICE_SIDE, Fault::Panic);
    // OpenYurt's first layer: a PoolService of our class for `web` in pool-b.
    s.fake.put(
        "poolservices",
        json!({
            "metadata": {"namespace": "default", "name": "web-edge-b", "uid": "uid-ps-1",
                         "labels": {"openyurt.io/service-name": "web",
                                    "openyurt.io/pool-name": "pool-b"}},
            "spec": {"loadBalancerClass": DEFAULT_CLASS, "nodepoolName": "pool-b"},
        }),
    );
    let e = ended(w).await;
    // Named as the PoolService side, although it runs inside the kube side's task.
    assert_ended(
        &e,
        POOL_SERVICE_SIDE,
        "it panicked: a panic injected by a test into the PoolService side",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kube_side_that_ends_stops_the_watcher() {
    let s = setup(false).await;
    let c = config(&s);
    let faults = c.faults.clone();
    let w = start(&s, c);
    steady(&s).await;
    faults.inject(KUBE_SIDE, Fault::End);
    s.fake.put(
        "services",
        another_service("next", "5a0c0d4e-0000-4000-8000-0000000000a4"),
    );
    let e = ended(w).await;
    assert_ended(&e, KUBE_SIDE, "it returned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_asked_to_stop_returns_ok() {
    let s = setup(false).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let w = tokio::spawn(clb_watcher::run(
        config(&s),
        s.fake.watcher_clients(),
        async move {
            let _ = stopped.await;
        },
    ));
    steady(&s).await;
    let _ = stop.send(());
    tokio::time::timeout(PATIENCE, w)
        .await
        .expect("stops")
        .expect("no panic")
        .expect("a shutdown is not an error");
}

/// The shipped binary (built without `test-support`): the sender's end (an invalid endpoint, the
/// one end a production build can be driven into from outside) makes it log the task and exit
/// non-zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_exits_non_zero_naming_the_task() {
    init_tracing();
    let fake = FakeApi::start().await;
    fake.put("services", another_service("web", WEB));
    let dir = std::env::temp_dir().join(format!("clb-supervision-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             users:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    cluster: fake\n    \
             user: u\n    namespace: default\ncurrent-context: c\n",
            fake.url
        ),
    )
    .expect("kubeconfig");
    let bin = clb_tests::shipped::bin_dir().join("clb-watcher");
    let out = tokio::time::timeout(
        PATIENCE,
        tokio::process::Command::new(bin)
            .args(["--server=http://not a host", "--pods=false"])
            .env_clear()
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the binary exits")
    .expect("the binary runs");
    let _ = std::fs::remove_dir_all(&dir);
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{:?}\n{log}", out.status);
    assert_eq!(out.status.code(), Some(1), "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("a task of the watcher ended"))
        .unwrap_or_else(|| panic!("no line naming the task:\n{log}"));
    eprintln!("the binary's line: {line}");
    assert!(line.contains("ERROR") && line.contains("sender"), "{line}");
    assert!(line.contains("invalid"), "{line}");
}
