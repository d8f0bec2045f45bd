//! The shipped system as one (issue 20): every component is its real binary with the args and
//! environment of its container in `deploy/`, its own ServiceAccount tokens, and nothing but what
//! `deploy/` grants — the fake Kubernetes API enforces `deploy/`'s RBAC on its own requests and
//! answers the state server's SubjectAccessReviews by evaluating it (`clb_tests::shipped`).
//!
//! Two state servers (leader election, authentication and authorization on), three sync workers,
//! `clb-watcher`, one node agent per node, the NRP emulator. Shown with the real libraries: a
//! LoadBalancer Service gets its ingress and condition; churn converges; in steady state no
//! writer resyncs and nothing is refused anywhere (logs, metrics, the API's 403s); a leader killed
//! and a leader rolled remove no live backend and the writers notice; with the API down a caller
//! the server has not cached gets UNAVAILABLE within 2 s and nothing changes; deleting the Service
//! empties NRP, then drops the finalizer. With the poolservice component and two gateways, each
//! node agent writes to its own node's gateway only.
//!
//! `CLB_SHIPPED_STEADY_S` sets the steady-state window (default 60 s); `CLB_SHIPPED_LOGS=1`
//! echoes every component's log.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use clb_client::updates;
use clb_tests::PATIENCE;
use clb_tests::kube_objects::{endpoint, pod, service, slice};
use clb_tests::shipped::{NodeSpec, Options, Shipped};
use serde_json::{Value, json};

trait UnwrapErrOr<T, E> {
    fn unwrap_err_or(self, f: impl FnOnce(T) -> E) -> E;
}

impl<T, E> UnwrapErrOr<T, E> for Result<T, E> {
    fn unwrap_err_or(self, f: impl FnOnce(T) -> E) -> E {
        match self {
            Ok(t) => f(t),
            Err(e) => e,
        }
    }
}

const UID: &str = "uid-web";
const EGRESS: &str = "eg-1";

type AddressMap = BTreeMap<(String, String), BTreeSet<String>>;

/// The cluster: per node an app pod (an endpoint of `web`, ready) and an egress pod.
struct Cluster {
    /// (pod name, node, node ip, pod ip, egress?)
    pods: Vec<(String, String, String, String, bool)>,
}

impl Cluster {
    fn of(nodes: &[NodeSpec]) -> Self {
        let mut pods = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            pods.push((
                format!("app-{i}"),
                n.name.clone(),
                n.ip.clone(),
                format!("10.1.{i}.10"),
                false,
            ));
            pods.push((
                format!("egr-{i}"),
                n.name.clone(),
                n.ip.clone(),
                format!("10.1.{i}.20"),
                true,
            ));
        }
        Self { pods }
    }

    fn put(&self, api: &clb_tests::fake_kube::FakeApi) {
        for (name, node, _, ip, egress) in &self.pods {
            api.put("pods", pod(name, node, &[ip], egress.then_some(EGRESS)));
        }
        let eps: Vec<Value> = self
            .pods
            .iter()
            .filter(|p| !p.4)
            .map(|(_, node, _, ip, _)| endpoint(ip, node, true))
            .collect();
        api.put("endpointslices", slice("web-1", "web", "IPv4", eps));
    }

    /// NRP's expected addresses: endpoints with the Service's UID, egress pods with the egress.
    fn expected(&self, with_service: bool) -> AddressMap {
        let mut m = AddressMap::new();
        for (_, _, node_ip, ip, egress) in &self.pods {
            let name = if *egress { EGRESS } else { UID };
            if *egress || with_service {
                m.entry((node_ip.clone(), ip.clone()))
                    .or_default()
                    .insert(name.to_owned());
            }
        }
        m
    }
}

fn web() -> Value {
    service(
        "web",
        UID,
        json!({"type": "LoadBalancer",
               "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}),
    )
}

/// NRP's addresses in gateway `arm_name` (every service name lower-cased as NRP keeps them).
fn nrp_addresses(s: &Shipped, arm_name: &str) -> AddressMap {
    s.nrp
        .emulator()
        .dump()
        .gateway(arm_name)
        .map(|g| g.address_map())
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.into_iter().map(|n| n.to_ascii_lowercase()).collect()))
        .collect()
}

async fn until<T>(what: &str, mut f: impl AsyncFnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match f().await {
            Ok(t) => return t,
            Err(e) if Instant::now() > deadline => panic!("{what}: not within {PATIENCE:?}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn converge(s: &Shipped, arm_name: &str, expected: &AddressMap) {
    until("NRP equals the cluster", async || {
        let now = nrp_addresses(s, arm_name);
        if &now == expected {
            Ok(())
        } else {
            Err(format!("NRP {now:?}\nexpected {expected:?}"))
        }
    })
    .await;
}

/// Removals the emulator logged from `from` on of an address still desired with that service.
fn live_removals(s: &Shipped, from: u64, desired: &AddressMap) -> Vec<String> {
    s.nrp
        .emulator()
        .removals()
        .into_iter()
        .filter(|r| r.seq > from)
        .filter(|r| {
            desired
                .get(&(r.location.clone(), r.address.clone()))
                .is_some_and(|want| {
                    r.address_removed
                        || r.removed_services
                            .iter()
                            .any(|x| want.contains(&x.to_ascii_lowercase()))
                })
        })
        .map(|r| format!("{r:?}"))
        .collect()
}

fn last_removal(s: &Shipped) -> u64 {
    s.nrp.emulator().removals().last().map_or(0, |r| r.seq)
}

/// Nothing refused anywhere: no component's log, no state server's `clb_server_calls_refused_total`,
/// no 403 of the Kubernetes API.
async fn assert_nothing_refused(s: &Shipped) {
    let logs = s.refusals_in_logs();
    assert!(logs.is_empty(), "refusals in the logs: {logs:#?}");
    // UNAVAILABLE (a review slower than its bound on a loaded machine) is transient and retried;
    // a refusal of rights is not.
    for code in ["PermissionDenied", "Unauthenticated"] {
        let prefix = format!("clb_server_calls_refused_total{{code=\"{code}\"");
        let refused = s.server_metric(&prefix).await;
        assert_eq!(refused, 0.0, "clb_server_calls_refused_total, code {code}");
    }
    let denials = s.api.denials();
    assert!(
        denials.is_empty(),
        "the Kubernetes API refused: {denials:#?}"
    );
}

fn steady_window() -> Duration {
    Duration::from_secs(
        std::env::var("CLB_SHIPPED_STEADY_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_system_works_as_one() {
    clb_tests::init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let options = Options::base(3);
    let nodes = options.nodes.clone();
    let mut s = Shipped::start(options).await;
    let arm = s.gateways.all()[0].resource_name().to_owned();
    let cluster = Cluster::of(&nodes);
    cluster.put(&s.api);
    s.api.put("services", web());

    // The Service gets its ingress and condition; NRP holds the cluster.
    let ingress = until("ingress and condition on the Service", async || {
        let svc = s.api.get("services", "default", "web").ok_or("gone")?;
        let ip = svc["status"]["loadBalancer"]["ingress"][0]["ip"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let programmed = svc["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "clb.azure.com/Programmed" && c["status"] == "True");
        if !ip.is_empty() && programmed {
            Ok(ip)
        } else {
            Err(format!("{}", svc["status"]))
        }
    })
    .await;
    assert!(ingress.parse::<std::net::IpAddr>().is_ok(), "{ingress}");
    let mut expected = cluster.expected(true);
    converge(&s, &arm, &expected).await;
    // The test's own reads (Admin) go through an operator bound to clb-reader, never a
    // component's identity.
    let operator = s.operator().await;

    // Churn: pods come and go on every node; NRP follows.
    let mut churned = Cluster {
        pods: cluster.pods.clone(),
    };
    for (i, n) in nodes.iter().enumerate() {
        churned.pods.push((
            format!("app-{i}-b"),
            n.name.clone(),
            n.ip.clone(),
            format!("10.1.{i}.11"),
            false,
        ));
    }
    churned.pods.retain(|p| p.0 != "egr-0");
    s.api.vanish("pods", "default", "egr-0");
    churned.put(&s.api);
    expected = churned.expected(true);
    converge(&s, &arm, &expected).await;

    // Steady state: no writer resyncs, nothing refused, no Admin call by anyone.
    let resyncs_before = s.writer_resyncs().await;
    let server_resyncs = s
        .server_metric("clb_server_update_rpcs_total{rpc=\"resync\"}")
        .await;
    tokio::time::sleep(steady_window()).await;
    assert_eq!(
        s.writer_resyncs().await,
        resyncs_before,
        "writers resynced in steady state"
    );
    assert_eq!(
        s.server_metric("clb_server_update_rpcs_total{rpc=\"resync\"}")
            .await,
        server_resyncs,
        "the server received resyncs in steady state"
    );
    assert_nothing_refused(&s).await;

    // Fail-over: the leader is killed (no Lease release); the standby takes over after the
    // lease; the writers notice and resync; no live backend is removed.
    let from = last_removal(&s);
    let old = s.wait_leader().await;
    let killed = Instant::now();
    s.servers[old].kill().await;
    let new = until("a new leader", async || match s.leader().await {
        Some(i) if i != old => Ok(i),
        other => Err(format!("{other:?}")),
    })
    .await;
    let took_over = killed.elapsed();
    let noticed = until("a writer resyncs with the new leader", async || {
        let n = s.servers[new]
            .metric("clb_server_update_rpcs_total{rpc=\"resync\"}")
            .await;
        if n > 0.0 {
            Ok(killed.elapsed())
        } else {
            Err(format!("{n}"))
        }
    })
    .await;
    println!(
        "fail-over: takeover {:.1} s after the kill, first writer resync {:.2} s after the kill ({:.2} s after the takeover)",
        took_over.as_secs_f64(),
        noticed.as_secs_f64(),
        (noticed - took_over).as_secs_f64()
    );
    converge(&s, &arm, &expected).await;
    s.wait_writers_resynced(&operator).await;
    let removed = live_removals(&s, from, &expected);
    assert!(
        removed.is_empty(),
        "live backends removed in the fail-over: {removed:#?}"
    );
    // The Deployment replaces the dead pod.
    s.start_server().await;

    // A rollout: SIGTERM to the leader (it releases the Lease); the standby takes over at once.
    let from = last_removal(&s);
    let leader = s.wait_leader().await;
    s.servers[leader].terminate().await;
    until("the standby leads", async || match s.leader().await {
        Some(i) if i != leader => Ok(()),
        other => Err(format!("{other:?}")),
    })
    .await;
    s.start_server().await;
    converge(&s, &arm, &expected).await;
    s.wait_writers_resynced(&operator).await;
    let removed = live_removals(&s, from, &expected);
    assert!(
        removed.is_empty(),
        "live backends removed in the rollout: {removed:#?}"
    );
    assert_nothing_refused(&s).await;

    // The Kubernetes API down (503, then refused connections): a caller the server has not
    // cached gets UNAVAILABLE within 2 s, and nothing changes.
    let before = nrp_addresses(&s, &arm);
    for refuse in [false, true] {
        let mut fresh = s.operator().await.writer("operator");
        if refuse {
            s.api_gate.close().await;
        } else {
            s.api.reviews_down(true);
        }
        let asked = Instant::now();
        let r = fresh
            .apply(vec![updates::service_add("intruder", &[])])
            .await;
        let waited = asked.elapsed();
        if refuse {
            s.api_back().await;
        } else {
            s.api.reviews_down(false);
        }
        let leader = s.leader().await.map(|i| s.servers[i].name.clone());
        let status = r
            .unwrap_err_or(|o| panic!("an answer without the API (refused connections: {refuse}, leader {leader:?}): {o:?}"))
            .status()
            .cloned();
        assert_eq!(
            status.as_ref().map(|s| s.code()),
            Some(tonic::Code::Unavailable),
            "{status:?}"
        );
        assert!(
            waited < Duration::from_secs(2),
            "UNAVAILABLE after {waited:?} (refused: {refuse})"
        );
    }
    let applied = operator
        .writer("operator")
        .apply(Vec::new())
        .await
        .expect("the API is back");
    let _ = applied;
    assert_eq!(
        nrp_addresses(&s, &arm),
        before,
        "the refused calls changed NRP"
    );
    let intruder = operator.service("intruder").await;
    assert!(
        intruder.is_err(),
        "a refused update was applied: {intruder:?}"
    );

    // Deletion: NRP is emptied of the Service, then the finalizer goes (the object with it).
    let probe_nrp = s.nrp.emulator().clone();
    let arm_probe = arm.clone();
    s.api.set_probe(move || {
        let has = probe_nrp.dump().gateway(&arm_probe).is_some_and(|g| {
            g.address_map()
                .values()
                .any(|v| v.iter().any(|n| n.eq_ignore_ascii_case(UID)))
        });
        json!({ "nrp_has_service": has })
    });
    s.api.delete("services", "default", "web");
    until("the Service is gone", async || {
        match s.api.get("services", "default", "web") {
            None => Ok(()),
            Some(o) => Err(format!("{}", o["metadata"])),
        }
    })
    .await;
    let finalizer_patches: Vec<_> = s
        .api
        .patches()
        .into_iter()
        .filter(|p| {
            p.path.ends_with("/services/web")
                && p.body["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.iter().any(|x| x == "clb.azure.com/load-balancer-cleanup"))
        })
        .collect();
    assert!(
        finalizer_patches
            .iter()
            .all(|p| p.probe["nrp_has_service"] == false),
        "the finalizer went while NRP still had the Service: {finalizer_patches:?}"
    );
    converge(&s, &arm, &churned.expected(false)).await;
    assert_nothing_refused(&s).await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_gateways_each_node_agent_writes_to_its_own_gateway_only() {
    clb_tests::init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let gateways = "gateways:
  - name: east
    nodes: {pool: pool-a}
    azure: {subscription: 00000000-0000-0000-0000-000000000000, resourceGroup: rg-east, region: eastus, serviceGateway: sgw-east}
  - name: west
    nodes: {pool: pool-b}
    azure: {subscription: 00000000-0000-0000-0000-000000000000, resourceGroup: rg-west, region: westus, serviceGateway: sgw-west}
";
    let mut options = Options::base(4);
    options.components = vec!["poolservice"];
    options.gateways_yaml = Some(gateways.to_owned());
    for (i, n) in options.nodes.iter_mut().enumerate() {
        n.pool = Some(if i % 2 == 0 { "pool-a" } else { "pool-b" }.to_owned());
    }
    let nodes = options.nodes.clone();
    let s = Shipped::start(options).await;
    let cluster = Cluster::of(&nodes);
    cluster.put(&s.api);
    // Exposed in both gateways (docs/watcher.md: `clb.azure.com/gateways`).
    let mut svc = web();
    svc["metadata"]["annotations"] = json!({"clb.azure.com/gateways": "east,west"});
    s.api.put("services", svc);
    // Each gateway holds exactly its own nodes' addresses.
    let all = cluster.expected(true);
    for (arm, pool) in [("sgw-east", "pool-a"), ("sgw-west", "pool-b")] {
        let ips: BTreeSet<&str> = nodes
            .iter()
            .filter(|n| n.pool.as_deref() == Some(pool))
            .map(|n| n.ip.as_str())
            .collect();
        let mine: AddressMap = all
            .iter()
            .filter(|((l, _), _)| ips.contains(l.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        converge(&s, arm, &mine).await;
    }
    // The watcher made one PoolService per (Service, pool) and wrote their status.
    for pool in ["pool-a", "pool-b"] {
        let name = format!("web-{pool}");
        until(&format!("PoolService {name} ready"), async || {
            let p = s
                .api
                .get("poolservices", "default", &name)
                .ok_or("absent")?;
            let ready = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            if ready {
                Ok(())
            } else {
                Err(format!("{}", p["status"]))
            }
        })
        .await;
    }
    // Every node agent is ready (it writes only where it may).
    for a in &s.agents {
        until(&format!("{} ready", a.name), async || {
            match a.get("/readyz").await {
                Some((200, _)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
    assert_nothing_refused(&s).await;
    s.shutdown().await;
}
