//! The watcher with several gateways (`--gateways-file`) against the scripted fake Kubernetes API
//! (`clb_tests::fake_kube`) and a real state server driving two gateways, `a` (node pool `pool-a`)
//! and `b` (`pool-b`). Each gateway's desired state is read through the Admin API (`GetService`,
//! `GetLocation` per gateway); no NRP runs, so nothing here becomes actual.
//!
//! Waits poll with a generous deadline that only bounds a hung test; nothing asserts timing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use clb_client::client::Client;
use clb_state_server::state::ServerConfig;
use clb_tests::fake_kube::FakeApi;
use clb_tests::kube_objects::{
    RunningWatcher, endpoint as ep, eventually, pod, service as svc, slice, test_config,
};
use clb_tests::{ServerProc, init_tracing};
use clb_watcher::Gateways;
use clb_watcher::routing::{GATEWAYS_ANNOTATION, NODEPOOL_SELECTOR_ANNOTATION};
use clb_watcher::{DEFAULT_CLASS, Mode, WatcherConfig};
use serde_json::{Value, json};

const WEB: &str = "5a0c0d4e-0000-4000-8000-00000000000a";
const BOTH: &str = "5a0c0d4e-0000-4000-8000-00000000000b";

const GATEWAYS: &str = r#"
gateways:
  - name: a
    labels: {region: east, tier: edge}
    nodes: {pool: pool-a}
    azure: {subscription: s, resourceGroup: rg-a, region: eastus}
  - name: b
    labels: {region: west, tier: edge}
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

/// `web` (no annotation: the default gateway `a`) and `both` (pools selected by labels: `a`
/// and `b`), each with an endpoint on each node; an egress pod on each node.
fn seed(fake: &FakeApi) {
    fake.put("nodes", node("n-a", "pool-a", "10.0.0.1"));
    fake.put("nodes", node("n-b", "pool-b", "10.0.0.2"));
    fake.put(
        "services",
        svc(
            "web",
            WEB,
            json!({"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}),
        ),
    );
    let mut both = svc(
        "both",
        BOTH,
        json!({"type": "LoadBalancer", "ports": [{"port": 443, "protocol": "TCP"}]}),
    );
    both["metadata"]["annotations"] = json!({NODEPOOL_SELECTOR_ANNOTATION: "tier=edge"});
    fake.put("services", both);
    fake.put(
        "endpointslices",
        slice(
            "web-1",
            "web",
            "IPv4",
            vec![ep("10.1.0.1", "n-a", true), ep("10.1.0.2", "n-b", true)],
        ),
    );
    fake.put(
        "endpointslices",
        slice(
            "both-1",
            "both",
            "IPv4",
            vec![ep("10.2.0.1", "n-a", true), ep("10.2.0.2", "n-b", true)],
        ),
    );
    fake.put("pods", pod("p1", "n-a", &["10.1.0.5"], Some("eg1")));
    fake.put("pods", pod("p2", "n-b", &["10.1.0.6"], Some("eg1")));
}

struct Setup {
    fake: FakeApi,
    server: ServerProc,
    client: Client,
}

async fn setup() -> Setup {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let fake = FakeApi::start().await;
    seed(&fake);
    let server = ServerProc::start(ServerConfig {
        gateways: vec!["a".into(), "b".into()],
        ..ServerConfig::default()
    })
    .await;
    let client = Client::connect(clb_client::client::ConnectOptions::new(server.url()))
        .await
        .expect("connect");
    Setup {
        fake,
        server,
        client,
    }
}

fn config(s: &Setup, bound: Duration) -> WatcherConfig {
    let mut c = test_config(&s.server.url(), Mode::Cluster { pods: true });
    c.gateways = Some(Arc::new(Gateways::parse(GATEWAYS).expect("gateways file")));
    c.move_bound = bound;
    c
}

/// `address=services` desired at `location` in `gateway`, sorted.
async fn desired_at(client: &Client, gateway: &str, location: &str) -> Vec<String> {
    match client.with_gateway(gateway).location(location).await {
        Ok(l) => l
            .addresses
            .iter()
            .filter(|a| a.desired)
            .map(|a| format!("{}={}", a.address, a.desired_service_ids.join(",")))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
        Err(e)
            if e.status()
                .is_some_and(|s| s.code() == tonic::Code::NotFound) =>
        {
            Vec::new()
        }
        Err(e) => panic!("GetLocation {gateway}/{location}: {e}"),
    }
}

/// Whether `gateway` desires inbound service `uid`.
async fn has_service(client: &Client, gateway: &str, uid: &str) -> bool {
    match client.with_gateway(gateway).service(uid).await {
        Ok(s) => s.desired,
        Err(e)
            if e.status()
                .is_some_and(|s| s.code() == tonic::Code::NotFound) =>
        {
            false
        }
        Err(e) => panic!("GetService {gateway}/{uid}: {e}"),
    }
}

/// Waits until `location` in `gateway` desires exactly `want`.
async fn wait_at(client: &Client, gateway: &str, location: &str, want: &[&str]) {
    let want: Vec<String> = want.iter().map(|s| (*s).to_owned()).collect();
    eventually(&format!("{gateway}/{location} desires {want:?}"), || {
        let want = want.clone();
        async move {
            let got = desired_at(client, gateway, location).await;
            if got == want {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        }
    })
    .await;
}

async fn wait_service(client: &Client, gateway: &str, uid: &str, want: bool) {
    eventually(
        &format!("{gateway} desires service {uid}: {want}"),
        || async move {
            if has_service(client, gateway, uid).await == want {
                Ok(())
            } else {
                Err("not yet".to_owned())
            }
        },
    )
    .await;
}

/// The routing of the seed: each endpoint and pod at its node's gateway, each Service where its
/// annotations select it.
async fn wait_seed(c: &Client) {
    wait_service(c, "a", WEB, true).await;
    wait_service(c, "a", BOTH, true).await;
    wait_service(c, "b", BOTH, true).await;
    wait_at(
        c,
        "a",
        "10.0.0.1",
        &[
            &format!("10.1.0.1={WEB}"),
            "10.1.0.5=eg1",
            &format!("10.2.0.1={BOTH}"),
        ],
    )
    .await;
    // `web` is not exposed in `b`: its endpoint on n-b goes nowhere.
    wait_at(
        c,
        "b",
        "10.0.0.2",
        &["10.1.0.6=eg1", &format!("10.2.0.2={BOTH}")],
    )
    .await;
}

#[tokio::test]
async fn endpoints_and_pods_go_to_their_nodes_gateway_and_services_where_selected() {
    let s = setup().await;
    let w = RunningWatcher::start(
        config(&s, Duration::from_secs(3600)),
        s.fake.watcher_clients(),
    );
    let c = &s.client;
    wait_seed(c).await;
    assert!(
        !has_service(c, "b", WEB).await,
        "web is in the default gateway only"
    );
    assert_eq!(desired_at(c, "a", "10.0.0.2").await, Vec::<String>::new());
    assert_eq!(desired_at(c, "b", "10.0.0.1").await, Vec::<String>::new());

    // Deselecting `a` removes `both` (and its endpoints) from `a` only.
    let mut both = s.fake.get("services", "default", "both").expect("both");
    both["metadata"]["annotations"] = json!({GATEWAYS_ANNOTATION: "b"});
    s.fake.put("services", both);
    wait_service(c, "a", BOTH, false).await;
    wait_at(
        c,
        "a",
        "10.0.0.1",
        &[&format!("10.1.0.1={WEB}"), "10.1.0.5=eg1"],
    )
    .await;
    assert!(has_service(c, "b", BOTH).await);
    assert_eq!(
        desired_at(c, "b", "10.0.0.2").await,
        vec!["10.1.0.6=eg1".to_owned(), format!("10.2.0.2={BOTH}")]
    );

    // Selecting `a` again (by name, with `web`'s default gateway untouched) brings it back.
    let mut both = s.fake.get("services", "default", "both").expect("both");
    both["metadata"]["annotations"] = json!({GATEWAYS_ANNOTATION: "a, b"});
    s.fake.put("services", both);
    wait_service(c, "a", BOTH, true).await;
    wait_at(
        c,
        "a",
        "10.0.0.1",
        &[
            &format!("10.1.0.1={WEB}"),
            "10.1.0.5=eg1",
            &format!("10.2.0.1={BOTH}"),
        ],
    )
    .await;
    w.stop().await;
}

#[tokio::test]
async fn a_refused_selection_changes_nothing_and_is_a_warning_event() {
    let s = setup().await;
    let w = RunningWatcher::start(
        config(&s, Duration::from_secs(3600)),
        s.fake.watcher_clients(),
    );
    let c = &s.client;
    wait_seed(c).await;
    let mut both = s.fake.get("services", "default", "both").expect("both");
    both["metadata"]["annotations"] = json!({NODEPOOL_SELECTOR_ANNOTATION: "tier in (edge)"});
    s.fake.put("services", both);
    let note = eventually("a Warning Event on both", || async {
        s.fake
            .events()
            .into_iter()
            .find(|e| e["reason"] == "InvalidGatewaySelection")
            .map(|e| e["note"].as_str().unwrap_or_default().to_owned())
            .ok_or_else(|| format!("{:?}", s.fake.events()))
    })
    .await;
    assert!(
        note.contains(NODEPOOL_SELECTOR_ANNOTATION)
            && note.contains("\"tier in (edge)\"")
            && note.contains("equality form"),
        "{note}"
    );
    // Still in both gateways, with the same endpoints.
    assert!(has_service(c, "a", BOTH).await);
    assert!(has_service(c, "b", BOTH).await);
    assert_eq!(
        desired_at(c, "b", "10.0.0.2").await,
        vec!["10.1.0.6=eg1".to_owned(), format!("10.2.0.2={BOTH}")]
    );
    // An unknown gateway name is refused as well.
    let mut both = s.fake.get("services", "default", "both").expect("both");
    both["metadata"]["annotations"] = json!({GATEWAYS_ANNOTATION: "a,nowhere"});
    s.fake.put("services", both);
    // A different problem is a new Event with the current message (kube's recorder alone would
    // only bump the count of the first one, whose text names the previous value).
    let notes = eventually("a second Warning Event naming the new value", || async {
        let notes: Vec<String> = s
            .fake
            .events()
            .into_iter()
            .filter(|e| e["reason"] == "InvalidGatewaySelection")
            .map(|e| e["note"].as_str().unwrap_or_default().to_owned())
            .collect();
        if notes.iter().any(|n| n.contains("nowhere")) {
            Ok(notes)
        } else {
            Err(format!("{:?}", s.fake.events()))
        }
    })
    .await;
    assert_eq!(notes.len(), 2, "one Event per distinct problem: {notes:?}");
    assert!(has_service(c, "b", BOTH).await, "refused: nothing changed");
    w.stop().await;
}

/// Node `n-b` moved from pool-b to pool-a with the move bound `bound`; returns once its pod and
/// endpoints are desired in `a`.
async fn move_n_b_to_pool_a(bound: Duration) -> (Setup, RunningWatcher) {
    let s = setup().await;
    let w = RunningWatcher::start(config(&s, bound), s.fake.watcher_clients());
    wait_seed(&s.client).await;
    s.fake.put("nodes", node("n-b", "pool-a", "10.0.0.2"));
    wait_at(
        &s.client,
        "a",
        "10.0.0.2",
        &[
            &format!("10.1.0.2={WEB}"),
            "10.1.0.6=eg1",
            &format!("10.2.0.2={BOTH}"),
        ],
    )
    .await;
    (s, w)
}

/// A node moved from pool-b to pool-a: its pod and endpoints appear in `a`; with no NRP nothing
/// becomes actual, so `b` keeps them for as long as the bound (here: an hour).
#[tokio::test]
async fn a_moved_node_stays_at_its_old_gateway_until_the_new_one_has_it() {
    let (s, w) = move_n_b_to_pool_a(Duration::from_secs(3600)).await;
    assert_eq!(
        desired_at(&s.client, "b", "10.0.0.2").await,
        vec!["10.1.0.6=eg1".to_owned(), format!("10.2.0.2={BOTH}")],
        "the old gateway keeps the node until the new one has programmed it"
    );
    w.stop().await;
}

/// The same move with a zero bound: the old gateway lets the node go.
#[tokio::test]
async fn a_moved_node_leaves_its_old_gateway_after_the_bound() {
    let (s, w) = move_n_b_to_pool_a(Duration::ZERO).await;
    wait_at(&s.client, "b", "10.0.0.2", &[]).await;
    w.stop().await;
}

fn pool_service(s: &Setup, name: &str) -> Option<Value> {
    s.fake.get("poolservices", "default", name)
}

/// The `Ready` condition's (status, reason) of PoolService `name`, once written.
async fn wait_ready_written(s: &Setup, name: &str) -> (String, String) {
    eventually(&format!("the status of PoolService {name}"), || async {
        let ps = pool_service(s, name).ok_or("no such PoolService")?;
        ps.pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|l| l.iter().find(|c| c["type"] == "Ready"))
            .map(|c| {
                (
                    c["status"].as_str().unwrap_or_default().to_owned(),
                    c["reason"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .ok_or_else(|| format!("{ps}"))
    })
    .await
}

async fn wait_pool_service(s: &Setup, name: &str, exists: bool) {
    eventually(
        &format!("PoolService {name} exists: {exists}"),
        || async move {
            if pool_service(s, name).is_some() == exists {
                Ok(())
            } else {
                Err(format!("{:?}", s.fake.objects("poolservices")))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn pool_services_follow_the_services_pools_and_get_their_status() {
    let s = setup().await;
    let mut c = config(&s, Duration::from_secs(3600));
    c.pool_services = true;
    let w = RunningWatcher::start(c, s.fake.watcher_clients());
    wait_seed(&s.client).await;
    for (name, svc, uid, pool) in [
        ("web-pool-a", "web", WEB, "pool-a"),
        ("both-pool-a", "both", BOTH, "pool-a"),
        ("both-pool-b", "both", BOTH, "pool-b"),
    ] {
        wait_pool_service(&s, name, true).await;
        let ps = pool_service(&s, name).expect("created");
        assert_eq!(ps["spec"]["loadBalancerClass"], DEFAULT_CLASS, "{ps}");
        assert_eq!(ps["spec"]["nodepoolName"], pool, "{ps}");
        assert_eq!(ps["metadata"]["labels"]["openyurt.io/service-name"], svc);
        let owner = &ps["metadata"]["ownerReferences"][0];
        assert_eq!(
            (
                owner["kind"].as_str(),
                owner["name"].as_str(),
                owner["uid"].as_str()
            ),
            (Some("Service"), Some(svc), Some(uid)),
            "{ps}"
        );
        // No NRP here: the pool's load balancer is not programmed, and the status says so.
        assert_eq!(
            wait_ready_written(&s, name).await,
            ("False".to_owned(), "Pending".to_owned())
        );
    }
    assert_eq!(s.fake.objects("poolservices").len(), 3);

    // Deselecting pool-a deletes that PoolService only.
    let mut both = s.fake.get("services", "default", "both").expect("both");
    both["metadata"]["annotations"] = json!({GATEWAYS_ANNOTATION: "b"});
    s.fake.put("services", both);
    wait_pool_service(&s, "both-pool-a", false).await;
    assert!(pool_service(&s, "both-pool-b").is_some());
    assert!(pool_service(&s, "web-pool-a").is_some());

    // Deleting the Service deletes its PoolServices.
    s.fake.delete("services", "default", "web");
    wait_pool_service(&s, "web-pool-a", false).await;
    assert!(pool_service(&s, "both-pool-b").is_some());
    w.stop().await;
    // What the watcher asked of PoolServices is what deploy/components/poolservice grants:
    // list, watch, create, delete, and patch of the status subresource only.
    let calls: BTreeSet<String> = s
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.contains("/poolservices"))
        .map(|r| {
            let (method, rest) = r.split_once(' ').expect("METHOD path");
            let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
            let sub = path.rsplit('/').next().unwrap_or_default();
            match method {
                "GET" if query.contains("watch=true") => "watch".to_owned(),
                "GET" if path.ends_with("/poolservices") => "list".to_owned(),
                "POST" => "create".to_owned(),
                "DELETE" => "delete".to_owned(),
                "PATCH" => format!("patch {sub}"),
                _ => format!("{method} {path}"),
            }
        })
        .collect();
    let granted: BTreeSet<String> = ["list", "watch", "create", "delete", "patch status"]
        .map(str::to_owned)
        .into();
    assert!(calls.is_subset(&granted), "{calls:?}");
    assert!(
        calls.contains("patch status") && calls.contains("create"),
        "{calls:?}"
    );
}

#[tokio::test]
async fn a_pool_service_of_someone_else_exposes_its_service_at_its_pool() {
    let s = setup().await;
    let mut c = config(&s, Duration::from_secs(3600));
    c.pool_services = true;
    let w = RunningWatcher::start(c, s.fake.watcher_clients());
    let client = &s.client;
    wait_seed(client).await;
    assert!(!has_service(client, "b", WEB).await);
    // OpenYurt's first layer: a PoolService of our class for `web` in pool-b, no ownerReference.
    s.fake.put(
        "poolservices",
        json!({
            "metadata": {"namespace": "default", "name": "web-edge-b", "uid": "uid-ps-1",
                         "labels": {"openyurt.io/service-name": "web",
                                    "openyurt.io/pool-name": "pool-b"}},
            "spec": {"loadBalancerClass": DEFAULT_CLASS, "nodepoolName": "pool-b"},
        }),
    );
    wait_service(client, "b", WEB, true).await;
    wait_at(
        client,
        "b",
        "10.0.0.2",
        &[
            &format!("10.1.0.2={WEB}"),
            "10.1.0.6=eg1",
            &format!("10.2.0.2={BOTH}"),
        ],
    )
    .await;
    assert_eq!(
        wait_ready_written(&s, "web-edge-b").await,
        ("False".to_owned(), "Pending".to_owned())
    );
    assert!(
        has_service(client, "a", WEB).await,
        "still in its default gateway"
    );
    // Of another class: not ours, nothing happens.
    s.fake.put(
        "poolservices",
        json!({
            "metadata": {"namespace": "default", "name": "both-other", "uid": "uid-ps-2",
                         "labels": {"openyurt.io/service-name": "web"}},
            "spec": {"loadBalancerClass": "example.com/other", "nodepoolName": "pool-b"},
        }),
    );
    // Gone: `web` leaves gateway b; the PoolService was never ours to delete.
    s.fake.delete("poolservices", "default", "web-edge-b");
    wait_service(client, "b", WEB, false).await;
    wait_at(
        client,
        "b",
        "10.0.0.2",
        &["10.1.0.6=eg1", &format!("10.2.0.2={BOTH}")],
    )
    .await;
    let other = pool_service(&s, "both-other").expect("left alone");
    assert!(other.get("status").is_none(), "{other}");
    // Of our class but for a pool no gateway stands for: a Warning Event, nothing programmed.
    s.fake.put(
        "poolservices",
        json!({
            "metadata": {"namespace": "default", "name": "web-z", "uid": "uid-ps-3",
                         "labels": {"openyurt.io/service-name": "web"}},
            "spec": {"loadBalancerClass": DEFAULT_CLASS, "nodepoolName": "pool-z"},
        }),
    );
    let note = eventually("a Warning Event on web-z", || async {
        s.fake
            .events()
            .into_iter()
            .find(|e| e["reason"] == "InvalidPoolService" && e["regarding"]["name"] == "web-z")
            .map(|e| e["note"].as_str().unwrap_or_default().to_owned())
            .ok_or_else(|| format!("{:?}", s.fake.events()))
    })
    .await;
    assert!(
        note.contains("spec.nodepoolName = \"pool-z\"") && note.contains("pool-a, pool-b"),
        "{note}"
    );
    assert!(!has_service(client, "b", WEB).await);
    assert!(
        pool_service(&s, "web-z")
            .expect("left alone")
            .get("status")
            .is_none()
    );
    w.stop().await;
}

/// Gateways `a` and `b` with NRP (one emulator each, `Harness::start_gateways`; the harness's file:
/// `a` serves every node no other takes, `b` the nodes of pool `b`), and a fake API with node `n-a`
/// in `a`, `n-b` in `b`, and Service `both` (annotated with `gateways`) with an endpoint on each.
async fn with_nrp(gateways: &str) -> (clb_tests::Harness, FakeApi) {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = clb_tests::Harness::start_gateways(clb_tests::Options::e2e(), &["a", "b"]).await;
    let fake = FakeApi::start().await;
    fake.put("nodes", node("n-a", "a", "10.0.0.1"));
    fake.put("nodes", node("n-b", "b", "10.0.0.2"));
    let mut both = svc(
        "both",
        BOTH,
        json!({"type": "LoadBalancer", "ports": [{"port": 443, "protocol": "TCP"}]}),
    );
    both["metadata"]["annotations"] = json!({GATEWAYS_ANNOTATION: gateways});
    fake.put("services", both);
    fake.put(
        "endpointslices",
        slice(
            "both-1",
            "both",
            "IPv4",
            vec![ep("10.2.0.1", "n-a", true), ep("10.2.0.2", "n-b", true)],
        ),
    );
    (h, fake)
}

/// With NRP (one emulator per gateway, `Harness::start_gateways`): a Service exposed in both
/// gateways gets both frontend IPs in `status.loadBalancer.ingress`, sorted; each of its
/// PoolServices gets its own gateway's IP and `Ready=True`; deleted, it keeps the finalizer until
/// neither gateway has it.
#[tokio::test]
async fn a_service_in_two_gateways_lists_both_frontend_ips() {
    let (h, fake) = with_nrp("b,a").await;
    // Each emulator counts its public IPs from 20.0.0.1: one taken in `b` first makes the two
    // gateways' frontends differ, as two regions' do.
    let gb = h
        .gateways_file()
        .and_then(|f| f.get("b"))
        .expect("gateway b")
        .clone();
    let mut arm = clb_nrp::azure::ArmConfig::new(&gb.azure.subscription, &gb.azure.resource_group)
        .with_endpoint(gb.azure.endpoint.clone().expect("the emulator's URL"));
    arm.poll_interval = Duration::from_millis(5);
    let arm = clb_nrp::azure::ArmClient::new(arm, None).expect("ARM client");
    let pip = clb_nrp::wire::PublicIpAddress {
        location: Some(gb.azure.region.clone()),
        sku: Some(clb_nrp::wire::Sku::standard()),
        properties: clb_nrp::wire::PublicIpAddressProperties {
            public_ip_allocation_method: Some("Static".into()),
            public_ip_address_version: Some("IPv4".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    clb_nrp::Nrp::put_public_ip(
        &arm,
        "taken-by-the-test",
        &pip,
        clb_nrp::CallOptions::with_timeout(clb_tests::PATIENCE),
    )
    .await
    .expect("a public IP in b");
    let mut c = test_config(&h.url(), Mode::Cluster { pods: true });
    c.gateways = Some(Arc::new(
        h.gateways_file().expect("a gateways file").clone(),
    ));
    c.pool_services = true;
    let w = RunningWatcher::start(c, fake.watcher_clients());
    let client = h.client().await;
    let frontend = |g: &'static str| {
        let client = client.clone();
        async move {
            eventually(&format!("{g} programs both"), || async {
                let s = client
                    .with_gateway(g)
                    .service(BOTH)
                    .await
                    .map_err(|e| e.to_string())?;
                if s.actual && !s.frontend_ip.is_empty() {
                    Ok(s.frontend_ip)
                } else {
                    Err(format!("{s:?}"))
                }
            })
            .await
        }
    };
    let (ip_a, ip_b) = (frontend("a").await, frontend("b").await);
    assert_ne!(ip_a, ip_b);
    let mut want = vec![ip_a.clone(), ip_b.clone()];
    want.sort();
    eventually("the Service's ingress lists both IPs", || async {
        let s = fake.get("services", "default", "both").ok_or("gone")?;
        let modes: Vec<Value> = s
            .pointer("/status/loadBalancer/ingress")
            .and_then(Value::as_array)
            .map(|l| l.iter().map(|i| i["ipMode"].clone()).collect())
            .unwrap_or_default();
        if modes.iter().any(|m| m != "VIP") {
            return Err(format!("every entry has ipMode VIP: {modes:?}"));
        }
        let got: Vec<String> = s
            .pointer("/status/loadBalancer/ingress")
            .and_then(Value::as_array)
            .map(|l| {
                l.iter()
                    .filter_map(|i| i["ip"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if got == want {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    for (name, ip) in [("both-a", &ip_a), ("both-b", &ip_b)] {
        eventually(&format!("PoolService {name} shows {ip}, Ready"), || async {
            let ps = fake.get("poolservices", "default", name).ok_or("missing")?;
            let ready = ps
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|l| l.iter().find(|c| c["type"] == "Ready"))
                .map(|c| (c["status"].clone(), c["reason"].clone()));
            let got = ps.pointer("/status/loadBalancer/ingress/0/ip").cloned();
            let mode = ps.pointer("/status/loadBalancer/ingress/0/ipMode").cloned();
            if got == Some(json!(ip))
                && mode == Some(json!("VIP"))
                && ready == Some((json!("True"), json!("Programmed")))
            {
                Ok(())
            } else {
                Err(format!("{ps}"))
            }
        })
        .await;
    }
    // Deleted: both gateways drop it, then the finalizer goes (and the Service with it).
    fake.delete("services", "default", "both");
    eventually("the Service is gone", || async {
        match fake.get("services", "default", "both") {
            None => Ok(()),
            Some(s) => Err(format!("{s}")),
        }
    })
    .await;
    for g in ["a", "b"] {
        let dump = h.emulator_of(g).dump();
        let gw = dump
            .gateway(&h.resource_name(g))
            .unwrap_or_else(|| panic!("{g}'s Service Gateway exists in its emulator"));
        assert!(gw.services.is_empty(), "{g} still has the service");
    }
    assert!(fake.get("poolservices", "default", "both-a").is_none());
    assert!(fake.get("poolservices", "default", "both-b").is_none());
    w.stop().await;
}

/// Node agents with the gateways file: the watcher (`--pods=false`) declares each gateway's nodes
/// with their agents as pod writers; the agent of n-b writes its pod to `b` only, the agent of n-a
/// to `a` only.
#[tokio::test]
async fn a_node_agent_writes_its_pods_to_its_nodes_gateway() {
    let s = setup().await;
    let mut wc = config(&s, Duration::from_secs(3600));
    wc.mode = Mode::Cluster { pods: false };
    let w = RunningWatcher::start(wc, s.fake.watcher_clients());
    let c = &s.client;
    wait_service(c, "b", BOTH, true).await;
    let mut agents = Vec::new();
    for n in ["n-a", "n-b"] {
        let mut ac = config(&s, Duration::from_secs(3600));
        ac.mode = Mode::NodeAgent { node: n.into() };
        agents.push(RunningWatcher::start(ac, s.fake.watcher_clients()));
    }
    wait_at(
        c,
        "b",
        "10.0.0.2",
        &["10.1.0.6=eg1", &format!("10.2.0.2={BOTH}")],
    )
    .await;
    wait_at(
        c,
        "a",
        "10.0.0.1",
        &[
            &format!("10.1.0.1={WEB}"),
            "10.1.0.5=eg1",
            &format!("10.2.0.1={BOTH}"),
        ],
    )
    .await;
    assert_eq!(desired_at(c, "a", "10.0.0.2").await, Vec::<String>::new());
    assert_eq!(desired_at(c, "b", "10.0.0.1").await, Vec::<String>::new());
    for a in agents {
        a.stop().await;
    }
    w.stop().await;
}

/// With NRP: a node moved from pool `b` to the catch-all gateway `a` leaves `b` once `a` has
/// programmed its addresses (the bound, an hour, is never reached).
#[tokio::test]
async fn a_moved_node_leaves_its_old_gateway_once_the_new_one_programmed_it() {
    let (h, fake) = with_nrp("a,b").await;
    let mut c = test_config(&h.url(), Mode::Cluster { pods: true });
    c.gateways = Some(Arc::new(
        h.gateways_file().expect("a gateways file").clone(),
    ));
    c.move_bound = Duration::from_secs(3600);
    let w = RunningWatcher::start(c, fake.watcher_clients());
    let client = h.client().await;
    let actual_at = |g: &'static str, loc: &'static str| {
        let client = client.clone();
        async move {
            match client.with_gateway(g).location(loc).await {
                Ok(l) => l
                    .addresses
                    .iter()
                    .filter(|a| a.actual)
                    .map(|a| a.address.clone())
                    .collect::<Vec<_>>(),
                Err(_) => Vec::new(),
            }
        }
    };
    eventually("b programs n-b's endpoint", || async {
        let got = actual_at("b", "10.0.0.2").await;
        if got == ["10.2.0.2"] {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    // n-b leaves pool b: the catch-all gateway a takes it.
    fake.put("nodes", node("n-b", "elsewhere", "10.0.0.2"));
    eventually("a programs n-b's endpoint", || async {
        let got = actual_at("a", "10.0.0.2").await;
        if got == ["10.2.0.2"] {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    wait_at(&client, "b", "10.0.0.2", &[]).await;
    eventually("b's NRP drops n-b's endpoint", || async {
        let got = actual_at("b", "10.0.0.2").await;
        if got.is_empty() {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    w.stop().await;
}

/// A pod as the kubelet reports it: with `status.hostIP` and `status.hostIPs` (its node's IP).
fn hosted_pod(name: &str, node: &str, ip: &str, host: &str) -> Value {
    let mut p = pod(name, node, &[ip], Some("eg1"));
    p["status"]["hostIP"] = json!(host);
    p["status"]["hostIPs"] = json!([{"ip": host}]);
    p
}

/// Pods as the kubelet reports them (with `hostIPs`), written by node agents: the watcher
/// (`--pods=false`, its move bound an hour, so that `b` keeps declaring a moved node) and one agent
/// per node, all with the gateways file and `token` files when given (`None`: no authentication).
struct Agents {
    watcher: RunningWatcher,
    agents: Vec<(String, RunningWatcher, Arc<clb_watcher::WatcherMetrics>)>,
}

impl Agents {
    fn start(s: &Setup, tokens: Option<&std::path::Path>, agent_bound: Duration) -> Self {
        s.fake
            .put("pods", hosted_pod("p1", "n-a", "10.1.0.5", "10.0.0.1"));
        s.fake
            .put("pods", hosted_pod("p2", "n-b", "10.1.0.6", "10.0.0.2"));
        let token = |name: &str| tokens.map(|dir| dir.join(name));
        let mut wc = config(s, Duration::from_secs(3600));
        wc.mode = Mode::Cluster { pods: false };
        wc.server.token_file = token("t-watcher");
        let watcher = RunningWatcher::start(wc, s.fake.watcher_clients());
        let agents = ["n-a", "n-b"]
            .into_iter()
            .map(|n| {
                let mut ac = config(s, agent_bound);
                ac.mode = Mode::NodeAgent { node: n.into() };
                ac.server.token_file = token(&format!("t-agent-{n}"));
                let metrics = ac.metrics.clone();
                (
                    n.to_owned(),
                    RunningWatcher::start(ac, s.fake.watcher_clients()),
                    metrics,
                )
            })
            .collect();
        Self { watcher, agents }
    }

    /// Every agent reports ready (`/readyz`): each of its lanes has resynced.
    async fn wait_ready(&self) {
        for (n, _, metrics) in &self.agents {
            eventually(&format!("the agent of {n} is ready"), || async {
                if metrics.is_synced() {
                    Ok(())
                } else {
                    Err("not synced".to_owned())
                }
            })
            .await;
        }
    }

    /// Each agent's pod at its own node's gateway only (the watcher's endpoints beside it).
    async fn wait_routed(&self, c: &Client) {
        wait_at(
            c,
            "a",
            "10.0.0.1",
            &[
                &format!("10.1.0.1={WEB}"),
                "10.1.0.5=eg1",
                &format!("10.2.0.1={BOTH}"),
            ],
        )
        .await;
        wait_at(
            c,
            "b",
            "10.0.0.2",
            &["10.1.0.6=eg1", &format!("10.2.0.2={BOTH}")],
        )
        .await;
        // Every lane of every agent has resynced: what another gateway holds now stays.
        self.wait_ready().await;
        assert_eq!(desired_at(c, "b", "10.0.0.1").await, Vec::<String>::new());
        assert_eq!(desired_at(c, "a", "10.0.0.2").await, Vec::<String>::new());
    }

    /// Node n-b moves from pool-b to pool-a: its agent writes its pod to `a` and empties its view
    /// in `b` (where the watcher still holds the node, with its endpoint there).
    async fn wait_n_b_moved(&self, s: &Setup) {
        s.fake.put("nodes", node("n-b", "pool-a", "10.0.0.2"));
        let c = &s.client;
        eventually("n-b's pod and endpoints in a", || async {
            let got = desired_at(c, "a", "10.0.0.2").await;
            if got.contains(&"10.1.0.6=eg1".to_owned()) {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        })
        .await;
        wait_at(c, "b", "10.0.0.2", &[&format!("10.2.0.2={BOTH}")]).await;
    }

    async fn stop(self) {
        for (_, a, _) in self.agents {
            a.stop().await;
        }
        self.watcher.stop().await;
    }
}

/// A node agent with the gateways file writes its pods to its node's gateway only, even though the
/// kubelet reports the pods' `hostIPs` (they do not say the gateway), and every agent turns ready.
/// A node that moves to another pool takes its agent along: the pod goes to the new gateway, and
/// the agent's view in the old one is emptied (the agent's move bound is zero; the watcher keeps
/// the node declared at `b` for an hour).
#[tokio::test]
async fn node_agents_write_only_their_nodes_gateway_and_turn_ready() {
    let s = setup().await;
    let agents = Agents::start(&s, None, Duration::ZERO);
    agents.wait_routed(&s.client).await;
    agents.wait_n_b_moved(&s).await;
    agents.stop().await;
}

/// The same with authentication and authorization on (as deploy/ runs, with deploy/'s RBAC): the
/// watcher holds `write`, each agent only `write-node` with a token bound to its node. An agent never writes to
/// a gateway that does not serve its node (there its writes would be refused, and it would retry
/// for ever and never turn ready).
#[tokio::test]
async fn with_authorization_node_agents_write_only_their_nodes_gateway_and_turn_ready() {
    use clb_state_server::auth::{Auth, AuthConfig, Mode as AuthMode};
    use clb_tests::fake_kube::TokenUser;
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let fake = FakeApi::start().await;
    seed(&fake);
    let ns = "clb-system";
    let dir = std::env::temp_dir().join(format!(
        "clb-watcher-gateways-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // deploy/'s roles and bindings (the watcher: write; node agents: write-node), and the test's
    // reader bound to clb-reader as an operator binds one.
    fake.load_rbac(&clb_tests::deploy::Rendered::load(&[]));
    fake.create_cluster_role_binding(
        "clb-reader-test",
        "clb-reader",
        clb_tests::rbac::service_account(ns, "clb-reader"),
    );
    for (token, account, node) in [
        ("t-watcher", "clb-watcher", "n-w"),
        ("t-agent-n-a", "clb-node-agent", "n-a"),
        ("t-agent-n-b", "clb-node-agent", "n-b"),
        ("t-reader", "clb-reader", "n-w"),
    ] {
        fake.add_token(
            token,
            TokenUser::service_account(ns, account, Some(node), "clb"),
        );
        std::fs::write(dir.join(token), token).expect("token file");
    }
    let auth = Auth::new(
        AuthConfig {
            authentication: AuthMode::Kubernetes,
            authorization: AuthMode::Kubernetes,
            ..AuthConfig::default()
        },
        Some(fake.kube_client()),
    )
    .expect("auth");
    let server = ServerProc::start_with(
        ServerConfig {
            gateways: vec!["a".into(), "b".into()],
            ..ServerConfig::default()
        },
        clb_state_server::grpc::ServeOptions {
            tls: None,
            auth: Some(auth),
        },
    )
    .await;
    let mut options = clb_client::client::ConnectOptions::new(server.url());
    options.token_file = Some(dir.join("t-reader"));
    let client = Client::connect(options).await.expect("connect");
    let s = Setup {
        fake,
        server,
        client,
    };
    let agents = Agents::start(&s, Some(&dir), Duration::ZERO);
    agents.wait_routed(&s.client).await;
    agents.wait_n_b_moved(&s).await;
    agents.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
