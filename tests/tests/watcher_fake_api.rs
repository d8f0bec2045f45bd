//! The watcher and node agent against a scripted fake Kubernetes API (axum on 127.0.0.1:0: list
//! with resourceVersion, chunked watch with BOOKMARK and 410 Gone, merge PATCH with
//! resourceVersion preconditions, finalizer semantics) and a real state server with workers and
//! the NRP emulator (`clb_tests::Harness`). The fake API is `clb_tests::fake_kube`.
//!
//! Waits poll with a generous deadline that only bounds a hung test; nothing asserts timing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clb_client::client::Client;
use clb_client::updates;
use clb_sync_worker::worker::load_balancer_name;
use clb_tests::fake_kube::{FakeApi, PatchRecord, finalizers};
use clb_tests::kube_objects::{
    RunningWatcher as Running, condition_of, converge, endpoint as ep, eventually, node, pod,
    service as svc, slice, test_config, wait_condition,
};
use clb_tests::{Expected, Harness, Options, WriterExt, init_tracing};
use clb_watcher::{
    CONDITION_TYPE, DEFAULT_CLASS, EGRESS_LABEL, FINALIZER, Mode, REPORTING_CONTROLLER,
    WatcherConfig,
};
use serde_json::{Value, json};

const WEB: &str = "3b0c0d4e-0000-4000-8000-00000000000a";
const API: &str = "3b0c0d4e-0000-4000-8000-00000000000b";
const OTHER: &str = "3b0c0d4e-0000-4000-8000-00000000000c";

/// The cluster every test starts from (plus objects the watcher must skip).
fn seed(fake: &FakeApi) {
    fake.put("nodes", node("node-a", &["10.0.0.1", "fd00::1"]));
    fake.put("nodes", node("node-b", &["10.0.0.2", "fd00::2"]));
    fake.put(
        "services",
        svc(
            "web",
            WEB,
            json!({"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}),
        ),
    );
    fake.put(
        "services",
        svc(
            "api",
            API,
            json!({"type": "LoadBalancer", "loadBalancerClass": DEFAULT_CLASS, "ports": [{"port": 443}]}),
        ),
    );
    fake.put(
        "services",
        svc(
            "other",
            OTHER,
            json!({"type": "LoadBalancer", "loadBalancerClass": "example.com/other", "ports": [{"port": 80}]}),
        ),
    );
    fake.put(
        "services",
        svc(
            "internal",
            "uid-internal",
            json!({"type": "ClusterIP", "ports": [{"port": 80}]}),
        ),
    );
    // Malformed: a LoadBalancer Service without UID; a slice whose endpoints are not a list.
    fake.put(
        "services",
        json!({"metadata": {"namespace": "default", "name": "no-uid"},
               "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
    );
    fake.put(
        "endpointslices",
        json!({"metadata": {"namespace": "default", "name": "mangled",
                            "labels": {"kubernetes.io/service-name": "web"}},
               "addressType": "IPv4", "endpoints": "oops"}),
    );
    fake.put(
        "endpointslices",
        slice(
            "web-v4",
            "web",
            "IPv4",
            vec![
                ep("10.1.0.1", "node-a", true),
                ep("10.1.0.2", "node-b", true),
                ep("10.1.0.3", "node-b", false),
                ep("10.1.0.300", "node-b", true),
            ],
        ),
    );
    // web is SingleStack IPv4 (the fake gives it `ipFamilies: [IPv4]`, as the API server does): its
    // IPv6 slice (which Kubernetes would not make) is not sent. docs/watcher.md, "IP families".
    fake.put(
        "endpointslices",
        slice("web-v6", "web", "IPv6", vec![ep("fd01::1", "node-a", true)]),
    );
    fake.put(
        "endpointslices",
        slice("api-1", "api", "IPv4", vec![ep("10.1.0.4", "node-a", true)]),
    );
    fake.put(
        "endpointslices",
        slice(
            "other-1",
            "other",
            "IPv4",
            vec![ep("10.1.0.7", "node-a", true)],
        ),
    );
    fake.put("pods", pod("p1", "node-a", &["10.1.0.5"], Some("eg1")));
    fake.put(
        "pods",
        pod("p2", "node-b", &["10.1.0.6", "fd01::6"], Some("eg1")),
    );
    fake.put("pods", pod("plain", "node-a", &["10.1.0.8"], None));
    fake.put(
        "pods",
        pod("bad-ip", "node-a", &["10.1.0.999"], Some("eg1")),
    );
}

/// NRP's state once the seed is programmed.
fn seed_expected() -> Expected {
    let mut e = Expected::default();
    e.inbound.extend([WEB.to_owned(), API.to_owned()]);
    e.outbound.insert("eg1".into());
    for (loc, addr, svc) in [
        ("10.0.0.1", "10.1.0.1", WEB),
        ("10.0.0.2", "10.1.0.2", WEB),
        ("10.0.0.1", "10.1.0.4", API),
        ("10.0.0.1", "10.1.0.5", "eg1"),
        ("10.0.0.2", "10.1.0.6", "eg1"),
        ("fd00::2", "fd01::6", "eg1"),
    ] {
        e.addresses
            .entry((loc.into(), addr.into()))
            .or_default()
            .insert(svc.into());
    }
    e
}

fn start_watcher(h: &Harness, fake: &FakeApi, mode: Mode) -> Running {
    run_watcher(test_config(&h.url(), mode), fake)
}

fn run_watcher(config: WatcherConfig, fake: &FakeApi) -> Running {
    Running::start(config, fake.watcher_clients())
}

/// `address=services` of a location's desired state, sorted as strings.
async fn desired_at(client: &Client, location: &str) -> Vec<String> {
    let l = match client.location(location).await {
        Ok(l) => l,
        Err(e)
            if e.status()
                .is_some_and(|s| s.code() == tonic::Code::NotFound) =>
        {
            return Vec::new();
        }
        Err(e) => panic!("GetLocation {location}: {e}"),
    };
    l.addresses
        .iter()
        .filter(|a| a.desired)
        .map(|a| format!("{}={}", a.address, a.desired_service_ids.join(",")))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

fn lbs_probe(h: &Harness) -> impl Fn() -> Value + Send + Sync + 'static {
    let emulator = h.emulator().clone();
    move || {
        let dump = emulator.dump();
        let lbs: Vec<String> = dump
            .load_balancers
            .iter()
            .filter_map(|r| r.name.clone())
            .collect();
        let services: Vec<String> = dump
            .gateway(clb_tests::GATEWAY)
            .map(|g| g.services.iter().map(|s| s.name.clone()).collect())
            .unwrap_or_default();
        json!({"load_balancers": lbs, "gateway_services": services})
    }
}

/// `(API group, resource, verb)` that RBAC must grant for a request recorded by the fake.
fn rbac_need(request: &str) -> (String, String, String) {
    let (method, rest) = request.split_once(' ').expect("METHOD path");
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, resource) = match segs.as_slice() {
        ["api", "v1", plural] => ("", (*plural).to_owned()),
        ["apis", group, _, plural] => (*group, (*plural).to_owned()),
        ["apis", group, _, "namespaces", _, plural] => (*group, (*plural).to_owned()),
        ["apis", group, _, "namespaces", _, plural, _] => (*group, (*plural).to_owned()),
        ["api", "v1", "namespaces", _, plural, _] => ("", (*plural).to_owned()),
        ["api", "v1", "namespaces", _, plural, _, sub] => ("", format!("{plural}/{sub}")),
        _ => panic!("unexpected request {request}"),
    };
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match (method, watch) {
        ("GET", true) => "watch",
        ("GET", false) if matches!(segs.len(), 3 | 4) => "list",
        ("GET", false) => "get",
        ("PATCH", _) => "patch",
        ("POST", _) => "create",
        (m, _) => panic!("unexpected method in {request}: {m}"),
    };
    (group.to_owned(), resource, verb.to_owned())
}

/// Every recorded request is allowed by the ClusterRoles bound to `account` in the `deploy/` files
/// `files` (a base manifest, and the components a configuration needs).
fn assert_rbac_covers(requests: &[String], files: &[&str], account: &str) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use serde::Deserialize;
    let file = files.join(" + ");
    let text = files
        .iter()
        .map(|f| {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../deploy")
                .join(f);
            std::fs::read_to_string(&path).expect("deploy manifest")
        })
        .collect::<Vec<_>>()
        .join("\n---\n");
    let mut roles = Vec::new();
    let mut bound = Vec::new();
    for de in yaml_serde::Deserializer::from_str(&text) {
        let doc = yaml_serde::Value::deserialize(de).expect("YAML");
        match doc["kind"].as_str() {
            Some("ClusterRole") => roles.push(yaml_serde::from_value::<ClusterRole>(doc).unwrap()),
            Some("ClusterRoleBinding") => {
                let b: ClusterRoleBinding = yaml_serde::from_value(doc).unwrap();
                if b.subjects.iter().flatten().any(|s| s.name == account) {
                    bound.push(b.role_ref.name);
                }
            }
            _ => {}
        }
    }
    let rules: Vec<_> = roles
        .into_iter()
        .filter(|r| bound.contains(r.metadata.name.as_ref().unwrap()))
        .flat_map(|r| r.rules.unwrap_or_default())
        .collect();
    assert!(!rules.is_empty(), "{file}: no rules bound to {account}");
    assert!(!requests.is_empty());
    for request in requests {
        let (group, resource, verb) = rbac_need(request);
        let granted = rules.iter().any(|r| {
            r.api_groups.iter().flatten().any(|g| *g == group)
                && r.resources.iter().flatten().any(|x| *x == resource)
                && r.verbs.contains(&verb)
        });
        assert!(
            granted,
            "{file}: {account} may not {verb} {group}/{resource}, but it sent {request}"
        );
    }
}

fn has_finalizer(obj: &Value) -> bool {
    finalizers(obj).iter().any(|f| f == FINALIZER)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn first_list_resyncs_programs_writes_ingress_back_and_the_finalizer_waits_for_nrp() {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    let fake = FakeApi::start().await;
    fake.set_probe(lbs_probe(&h));
    seed(&fake);
    let w = start_watcher(&h, &fake, Mode::Cluster { pods: true });
    let client = h.client().await;

    // (a) The first list becomes one resync (the server's gate waits for "watcher"), the
    // finalizer is added to our two Services only, and the cluster converges.
    converge(&h, &seed_expected()).await;
    let status = client.status().await.unwrap();
    let writer = status
        .writers
        .iter()
        .find(|w| w.writer == "watcher")
        .unwrap();
    assert!(writer.last_resync_unix_ms > 0);
    assert!(
        status.gateways[0]
            .init
            .as_ref()
            .unwrap()
            .pending_writers
            .is_empty()
    );
    for name in ["web", "api"] {
        assert!(
            has_finalizer(&fake.get("services", "default", name).unwrap()),
            "{name}"
        );
    }
    for name in ["other", "internal", "no-uid"] {
        let o = fake.get("services", "default", name).unwrap();
        assert!(!has_finalizer(&o), "{name} is not ours: {o}");
    }
    let add_patches: Vec<PatchRecord> = fake
        .patches()
        .into_iter()
        .filter(|p| p.path == "/api/v1/namespaces/default/services/web" && p.status == 200)
        .collect();
    let first = &add_patches[0];
    assert_eq!(first.content_type, "application/merge-patch+json");
    assert_eq!(first.body["metadata"]["finalizers"], json!([FINALIZER]));
    assert!(
        first.body["metadata"]["resourceVersion"].is_string(),
        "{:?}",
        first.body
    );
    // Nothing of the other class, nothing from the malformed objects, no pod without the label.
    assert!(client.service(OTHER).await.is_err());
    assert_eq!(
        desired_at(&client, "10.0.0.1").await,
        vec![
            format!("10.1.0.1={WEB}"),
            format!("10.1.0.4={API}"),
            "10.1.0.5=eg1".to_owned()
        ]
    );

    // (c) Programmed: the ingress IP is written to the status subresource, as GetService has it.
    let ingress_ip = eventually("status.loadBalancer.ingress of web is patched", || async {
        let state = client.service(WEB).await.map_err(|e| e.to_string())?;
        // The ingress goes with the condition in one status patch, with a resourceVersion
        // precondition (the condition list is replaced as a whole).
        let patch = fake
            .patches()
            .into_iter()
            .find(|p| {
                p.path == "/api/v1/namespaces/default/services/web/status"
                    && p.body.pointer("/status/loadBalancer").is_some()
            })
            .ok_or("no status PATCH yet")?;
        assert!(state.actual);
        assert_eq!(patch.content_type, "application/merge-patch+json");
        // Every entry carries `ipMode: VIP` (KEP-1860), written by the watcher itself.
        assert_eq!(
            patch.body["status"]["loadBalancer"],
            json!({"ingress": [{"ip": state.frontend_ip, "ipMode": "VIP"}]})
        );
        assert!(patch.body["metadata"]["resourceVersion"].is_string());
        Ok(state.frontend_ip)
    })
    .await;
    assert!(!ingress_ip.is_empty(), "GetService gave no frontend IP");
    let web = fake.get("services", "default", "web").unwrap();
    assert_eq!(
        web["status"]["loadBalancer"]["ingress"],
        json!([{"ip": ingress_ip, "ipMode": "VIP"}])
    );

    // (d) Deleting web: the finalizer keeps the object until NRP has no load balancer for it; the
    // PATCH that removes it is sent only then.
    assert!(
        h.emulator()
            .dump()
            .load_balancers
            .iter()
            .any(|l| l.name.as_deref() == Some(load_balancer_name(WEB).as_str()))
    );
    fake.delete("services", "default", "web");
    eventually("web is deleted", || async {
        match fake.get("services", "default", "web") {
            None => Ok(()),
            Some(o) => Err(format!("still there: {o}")),
        }
    })
    .await;
    let removal = fake
        .patches()
        .into_iter()
        .rfind(|p| p.path == "/api/v1/namespaces/default/services/web" && p.status == 200)
        .unwrap();
    assert_eq!(removal.body["metadata"]["finalizers"], json!([]));
    let lbs = removal.probe["load_balancers"].as_array().unwrap();
    assert!(
        !lbs.contains(&json!(load_balancer_name(WEB))),
        "finalizer removed while NRP still had the load balancer: {}",
        removal.probe
    );
    assert!(
        !removal.probe["gateway_services"]
            .as_array()
            .unwrap()
            .contains(&json!(WEB)),
        "{}",
        removal.probe
    );
    let mut expected = seed_expected();
    expected.inbound.remove(WEB);
    expected.addresses.retain(|_, s| {
        s.remove(WEB);
        !s.is_empty()
    });
    converge(&h, &expected).await;

    // api stops being a LoadBalancer: withdrawn, then its finalizer and ingress are removed.
    eventually("api has its ingress", || async {
        let o = fake.get("services", "default", "api").unwrap();
        if o["status"]["loadBalancer"]["ingress"].is_array() {
            Ok(())
        } else {
            Err(o.to_string())
        }
    })
    .await;
    let mut api = fake.get("services", "default", "api").unwrap();
    api["spec"] = json!({"type": "ClusterIP", "ports": [{"port": 443}]});
    fake.put("services", api);
    eventually("api's finalizer is removed", || async {
        let o = fake.get("services", "default", "api").unwrap();
        if !has_finalizer(&o) && o["status"]["loadBalancer"].get("ingress").is_none() {
            Ok(())
        } else {
            Err(o.to_string())
        }
    })
    .await;
    let removal = fake
        .patches()
        .into_iter()
        .rfind(|p| p.path == "/api/v1/namespaces/default/services/api" && p.status == 200)
        .unwrap();
    assert!(
        !removal.probe["load_balancers"]
            .as_array()
            .unwrap()
            .contains(&json!(load_balancer_name(API))),
        "{}",
        removal.probe
    );
    expected.inbound.remove(API);
    expected.addresses.retain(|_, s| {
        s.remove(API);
        !s.is_empty()
    });
    converge(&h, &expected).await;
    // Every call the watcher made is granted by its ClusterRoles in deploy/: with --pods=true, the
    // base's and the watcher-pods component's.
    assert_rbac_covers(
        &fake.requests(),
        &["watcher.yaml", "components/watcher-pods/rbac.yaml"],
        "clb-watcher",
    );

    w.stop().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_410_gone_the_relist_resyncs_and_removes_exactly_what_vanished() {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    let fake = FakeApi::start().await;
    seed(&fake);
    let w = start_watcher(&h, &fake, Mode::Cluster { pods: true });
    let client = h.client().await;
    converge(&h, &seed_expected()).await;
    let resynced_at = |s: &clb_proto::v1::StatusResponse| {
        s.writers
            .iter()
            .find(|w| w.writer == "watcher")
            .map_or(0, |w| w.last_resync_unix_ms)
    };
    let before = resynced_at(&client.status().await.unwrap());
    // Make sure a later resync has a later timestamp.
    tokio::time::sleep(Duration::from_millis(5)).await;

    // The watches are cut off; meanwhile api (whose finalizer someone removed), its slice and
    // pod p2 vanish. The watcher hears nothing of it...
    for plural in ["services", "endpointslices", "pods"] {
        fake.pause(plural);
    }
    fake.vanish("services", "default", "api");
    fake.vanish("endpointslices", "default", "api-1");
    fake.vanish("pods", "default", "p2");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(client.service(API).await.unwrap().desired);

    // ...until the watches end with 410 Gone: it lists again and resyncs.
    for plural in ["services", "endpointslices", "pods"] {
        fake.expire(plural);
    }
    let mut expected = seed_expected();
    expected.inbound.remove(API);
    expected.addresses.retain(|_, s| {
        s.remove(API);
        !s.is_empty()
    });
    expected
        .addresses
        .remove(&("10.0.0.2".into(), "10.1.0.6".into()));
    expected
        .addresses
        .remove(&("fd00::2".into(), "fd01::6".into()));
    converge(&h, &expected).await;
    assert!(
        resynced_at(&client.status().await.unwrap()) > before,
        "the relist did not resync"
    );
    // The rest is untouched: web's endpoints on both nodes, p1.
    assert_eq!(
        desired_at(&client, "10.0.0.2").await,
        vec![format!("10.1.0.2={WEB}")]
    );
    assert_eq!(
        desired_at(&client, "10.0.0.1").await,
        vec![format!("10.1.0.1={WEB}"), "10.1.0.5=eg1".to_owned()]
    );
    // Every stream listed again, and the watch resumed from the new list's version.
    let lists = fake
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("GET /api/v1/services?") && !r.contains("watch=true"))
        .count();
    assert!(lists >= 2, "{:?}", fake.requests());

    // Changes after the relist still flow as deltas.
    fake.put("pods", pod("p3", "node-b", &["10.1.0.9"], Some("eg2")));
    eventually("p3 is desired", || async {
        let at = desired_at(&client, "10.0.0.2").await;
        if at.contains(&"10.1.0.9=eg2".to_owned()) {
            Ok(())
        } else {
            Err(format!("{at:?}"))
        }
    })
    .await;

    w.stop().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_agent_reports_only_the_pods_on_its_node() {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    let fake = FakeApi::start().await;
    seed(&fake);
    let client = h.client().await;
    // Another node's agent reported a pod on node-a; this agent's previous run reported a pod on
    // node-b that no longer exists.
    client
        .writer("node-agent/node-a")
        .apply_ok(vec![updates::pod_add(
            "10.1.0.5",
            "10.0.0.1",
            "eg1",
            "default/p1",
            "uid-p1",
        )])
        .await;
    client
        .writer("node-agent/node-b")
        .apply_ok(vec![updates::pod_add(
            "10.1.0.99",
            "10.0.0.2",
            "eg1",
            "default/gone",
            "uid-gone",
        )])
        .await;

    let w = start_watcher(
        &h,
        &fake,
        Mode::NodeAgent {
            node: "node-b".into(),
        },
    );
    eventually("node-b's pods are reported", || async {
        let v4 = desired_at(&client, "10.0.0.2").await;
        let v6 = desired_at(&client, "fd00::2").await;
        if v4 == ["10.1.0.6=eg1"] && v6 == ["fd01::6=eg1"] {
            Ok(())
        } else {
            Err(format!("{v4:?} {v6:?}"))
        }
    })
    .await;
    // node-a is not this agent's: its pod stays as the other agent reported it, and nothing of
    // the Services is written.
    assert_eq!(desired_at(&client, "10.0.0.1").await, vec!["10.1.0.5=eg1"]);
    assert!(client.service(WEB).await.is_err());
    let status = client.status().await.unwrap();
    let agent = status
        .writers
        .iter()
        .find(|w| w.writer == "node-agent/node-b")
        .unwrap();
    assert!(agent.last_resync_unix_ms > 0);
    // It watched only its node's pods and its node; it patched nothing.
    let requests = fake.requests();
    assert!(
        requests
            .iter()
            .all(|r| r.starts_with("GET /api/v1/pods?") || r.starts_with("GET /api/v1/nodes?")),
        "{requests:#?}"
    );
    assert!(requests.iter().any(|r| r.starts_with("GET /api/v1/pods?")
        && r.contains("fieldSelector=spec.nodeName=node-b")
        && r.contains(&format!("labelSelector={EGRESS_LABEL}"))));
    assert!(
        requests.iter().any(|r| r.starts_with("GET /api/v1/nodes?")
            && r.contains("fieldSelector=metadata.name=node-b"))
    );
    assert!(fake.patches().is_empty());
    assert_rbac_covers(&requests, &["node-agent.yaml"], "clb-node-agent");

    // A new pod on node-b comes as a delta; one on node-a is not this agent's.
    fake.put("pods", pod("p4", "node-b", &["10.1.0.10"], Some("eg2")));
    fake.put("pods", pod("p5", "node-a", &["10.1.0.11"], Some("eg2")));
    eventually("p4 is reported", || async {
        let v4 = desired_at(&client, "10.0.0.2").await;
        if v4 == ["10.1.0.10=eg2", "10.1.0.6=eg1"] {
            Ok(())
        } else {
            Err(format!("{v4:?}"))
        }
    })
    .await;
    assert_eq!(desired_at(&client, "10.0.0.1").await, vec!["10.1.0.5=eg1"]);

    w.stop().await;
    h.shutdown().await;
}

/// A TCP forwarder between the watcher and the state server: it can be re-pointed (a restarted
/// server listens on a new port) and can cut every open connection.
#[derive(Clone)]
struct Forwarder {
    url: String,
    target: Arc<Mutex<String>>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Forwarder {
    async fn start(target: &str) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let f = Self {
            url,
            target: Arc::new(Mutex::new(target.trim_start_matches("http://").to_owned())),
            conns: Arc::default(),
        };
        let me = f.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = me.target.lock().unwrap().clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
                me.conns.lock().unwrap().push(task);
            }
        });
        f
    }

    /// Points new connections at `target` and cuts the open ones.
    fn retarget(&self, target: &str) {
        *self.target.lock().unwrap() = target.trim_start_matches("http://").to_owned();
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_or_unreachable_state_server_gets_the_whole_view_again() {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut h = Harness::start(Options::e2e()).await;
    let fake = FakeApi::start().await;
    seed(&fake);
    let fwd = Forwarder::start(&h.url()).await;
    let mut config = test_config(&fwd.url, Mode::Cluster { pods: true });
    config.backoff_max = Duration::from_millis(300);
    let w = run_watcher(config, &fake);
    converge(&h, &seed_expected()).await;

    // The server restarts (empty desired state, gate closed until "watcher" resyncs) while nothing
    // changes in the cluster: the watcher notices that the server lost its view and resyncs.
    h.restart_server().await;
    fwd.retarget(&h.url());
    converge(&h, &seed_expected()).await;

    // The server is unreachable while the cluster changes, then comes back restarted: nothing is
    // lost.
    fwd.retarget("127.0.0.1:1");
    fake.put("pods", pod("p3", "node-b", &["10.1.0.9"], Some("eg2")));
    fake.vanish("pods", "default", "p1");
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.restart_server().await;
    fwd.retarget(&h.url());
    let mut expected = seed_expected();
    expected.outbound.insert("eg2".into());
    expected.addresses.insert(
        ("10.0.0.2".into(), "10.1.0.9".into()),
        ["eg2".to_owned()].into(),
    );
    expected
        .addresses
        .remove(&("10.0.0.1".into(), "10.1.0.5".into()));
    converge(&h, &expected).await;

    w.stop().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_finalizer_removal_that_meets_a_concurrent_writer_is_retried_and_keeps_their_finalizer() {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    let fake = FakeApi::start().await;
    fake.set_probe(lbs_probe(&h));
    seed(&fake);
    let w = start_watcher(&h, &fake, Mode::Cluster { pods: true });
    converge(&h, &seed_expected()).await;
    assert!(has_finalizer(
        &fake.get("services", "default", "api").unwrap()
    ));

    // api is deleted; when the watcher removes its finalizer, another controller has just added
    // its own: the PATCH gets 409, and the retry must keep the other controller's finalizer.
    const THEIRS: &str = "example.com/keep";
    fake.conflict_next("api", THEIRS);
    fake.delete("services", "default", "api");
    let path = "/api/v1/namespaces/default/services/api";
    let retried = eventually("the removal is retried after the 409", || async {
        let patches: Vec<PatchRecord> = fake
            .patches()
            .into_iter()
            .filter(|p| p.path == path && p.body["metadata"]["finalizers"].is_array())
            .collect();
        let conflict = patches.iter().position(|p| p.status == 409);
        match conflict.and_then(|i| patches[i + 1..].iter().find(|p| p.status == 200)) {
            Some(p) => Ok(p.clone()),
            None => Err(format!("{} finalizer patches so far", patches.len())),
        }
    })
    .await;
    assert_eq!(retried.body["metadata"]["finalizers"], json!([THEIRS]));
    let api = fake
        .get("services", "default", "api")
        .expect("kept by their finalizer");
    assert_eq!(api["metadata"]["finalizers"], json!([THEIRS]));
    // Ours went only after NRP dropped the service (the probe at the PATCH).
    let lbs = retried.probe["load_balancers"].as_array().unwrap();
    assert!(
        !lbs.contains(&json!(load_balancer_name(API))),
        "{}",
        retried.probe
    );

    w.stop().await;
    h.shutdown().await;
}

/// The finalizer of a new Service is added on its watch event (nothing polls): a Service created
/// after the first list gets its finalizer and its endpoints reach the state server's desired
/// state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_services_finalizer_is_added_on_its_first_event_without_waiting_for_a_poll() {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    let fake = FakeApi::start().await;
    seed(&fake);
    let w = start_watcher(&h, &fake, Mode::Cluster { pods: true });
    let client = h.client().await;
    eventually("the first list is resynced", || async {
        let s = client.status().await.map_err(|e| e.to_string())?;
        s.writers
            .iter()
            .any(|w| w.writer == "watcher" && w.last_resync_unix_ms > 0)
            .then_some(())
            .ok_or_else(|| "no resync yet".to_owned())
    })
    .await;

    const LATE: &str = "3b0c0d4e-0000-4000-8000-00000000000d";
    fake.put(
        "services",
        svc(
            "late",
            LATE,
            json!({"type": "LoadBalancer", "ports": [{"port": 8080, "protocol": "TCP"}]}),
        ),
    );
    fake.put(
        "endpointslices",
        slice(
            "late-1",
            "late",
            "IPv4",
            vec![ep("10.1.0.7", "node-a", true)],
        ),
    );
    eventually("the late Service carries our finalizer", || async {
        let o = fake.get("services", "default", "late").ok_or("gone")?;
        has_finalizer(&o)
            .then_some(())
            .ok_or_else(|| format!("no finalizer: {o}"))
    })
    .await;
    let desired = eventually("the late Service's endpoint is desired", || async {
        let d = desired_at(&client, "10.0.0.1").await;
        d.iter()
            .any(|a| a == &format!("10.1.0.7={LATE}"))
            .then_some(d.clone())
            .ok_or_else(|| format!("{d:?}"))
    })
    .await;
    assert!(desired.contains(&format!("10.1.0.7={LATE}")));
    w.stop().await;
}

// ---- Events and the Programmed condition -------------------------------------------------------

const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

/// One node and one LoadBalancer Service `name` (UID `uid`) with a ready endpoint on it; the
/// Service carries a condition of another controller, which ours must not drop.
fn small_cluster(fake: &FakeApi, name: &str, uid: &str) {
    fake.put("nodes", node("node-a", &["10.0.0.1"]));
    let mut s = svc(
        name,
        uid,
        json!({"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}),
    );
    s["status"] = json!({"conditions": [{
        "type": "example.com/Other", "status": "True", "reason": "Fine", "message": "theirs",
        "lastTransitionTime": "2025-01-01T00:00:00Z"
    }]});
    fake.put("services", s);
    fake.put(
        "endpointslices",
        slice(
            &format!("{name}-1"),
            name,
            "IPv4",
            vec![ep("10.1.0.1", "node-a", true)],
        ),
    );
}

/// The Events regarding Service `name` (UID `uid`).
fn events_of(fake: &FakeApi, uid: &str) -> Vec<Value> {
    fake.events()
        .into_iter()
        .filter(|e| e.pointer("/regarding/uid").and_then(Value::as_str) == Some(uid))
        .collect()
}

/// Requests of `method` to the Events API.
fn event_requests(fake: &FakeApi, method: &str) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.starts_with(&format!("{method} {EVENTS_PATH}")))
        .count()
}

/// Every status PATCH of Service `name` the API answered with 200.
fn status_patches(fake: &FakeApi, name: &str) -> Vec<PatchRecord> {
    fake.patches()
        .into_iter()
        .filter(|p| {
            p.path == format!("/api/v1/namespaces/default/services/{name}/status")
                && p.status == 200
        })
        .collect()
}

fn assert_event(e: &Value, uid: &str, name: &str, type_: &str, reason: &str) {
    assert_eq!(e["type"], type_, "{e}");
    assert_eq!(e["reason"], reason, "{e}");
    assert_eq!(e["reportingController"], REPORTING_CONTROLLER, "{e}");
    assert!(
        e["reportingInstance"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "{e}"
    );
    assert!(e["action"].as_str().is_some_and(|s| !s.is_empty()), "{e}");
    assert!(e["eventTime"].is_string(), "{e}");
    assert_eq!(e["regarding"]["kind"], "Service", "{e}");
    assert_eq!(e["regarding"]["name"], name, "{e}");
    assert_eq!(e["regarding"]["namespace"], "default", "{e}");
    assert_eq!(e["regarding"]["uid"], uid, "{e}");
}

/// A Service that gets programmed: one Normal `Programmed` Event with the frontend IP, and the
/// condition True/Programmed (with `observedGeneration` and `lastTransitionTime`) written with the
/// ingress in one merge patch of the status subresource that keeps the other conditions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_programmed_service_gets_a_normal_event_and_the_programmed_condition() {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    let fake = FakeApi::start().await;
    small_cluster(&fake, "web", WEB);
    let w = start_watcher(&h, &fake, Mode::Cluster { pods: false });

    let c = wait_condition(&fake, "web", "Programmed").await;
    let obj = fake.get("services", "default", "web").unwrap();
    let ip = obj["status"]["loadBalancer"]["ingress"][0]["ip"]
        .as_str()
        .expect("the ingress is set with the condition")
        .to_owned();
    assert_eq!(c["status"], "True");
    assert!(c["message"].as_str().unwrap().contains(&ip), "{c}");
    assert_eq!(
        c["observedGeneration"], obj["metadata"]["generation"],
        "{c}"
    );
    assert!(c["lastTransitionTime"].is_string(), "{c}");
    let others: Vec<&Value> = obj["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] == "example.com/Other")
        .collect();
    assert_eq!(
        others.len(),
        1,
        "the other controller's condition stays: {obj}"
    );
    assert_eq!(others[0]["message"], "theirs");

    let events = eventually("the Programmed event", || async {
        let e = events_of(&fake, WEB);
        e.iter()
            .any(|e| e["reason"] == "Programmed")
            .then_some(e.clone())
            .ok_or_else(|| format!("{e:?}"))
    })
    .await;
    let programmed: Vec<&Value> = events
        .iter()
        .filter(|e| e["reason"] == "Programmed")
        .collect();
    assert_eq!(programmed.len(), 1, "{events:?}");
    assert_event(programmed[0], WEB, "web", "Normal", "Programmed");
    assert!(
        programmed[0]["note"].as_str().unwrap().contains(&ip),
        "{}",
        programmed[0]
    );
    assert!(
        events.iter().all(|e| e["type"] == "Normal"),
        "no warning for a Service that just gets programmed: {events:?}"
    );

    // The status patches: merge patches of the status subresource with a resourceVersion
    // precondition; the one that set our condition carries the whole list.
    let patches = status_patches(&fake, "web");
    assert!(!patches.is_empty());
    for p in &patches {
        assert_eq!(p.content_type, "application/merge-patch+json");
        assert!(
            p.body["metadata"]["resourceVersion"].is_string(),
            "{:?}",
            p.body
        );
    }
    let last = patches
        .iter()
        .rev()
        .find(|p| p.body.pointer("/status/conditions").is_some())
        .expect("a patch sets the conditions");
    let list = last.body["status"]["conditions"].as_array().unwrap();
    assert!(
        list.iter().any(|c| c["type"] == "example.com/Other"),
        "{list:?}"
    );
    assert!(
        list.iter()
            .any(|c| c["type"] == CONDITION_TYPE && c["reason"] == "Programmed")
    );

    // Settled: more reads of the server send neither an Event nor a patch.
    let patches_before = patches.len();
    let posts_before = event_requests(&fake, "POST");
    let gets = |client: Client| async move { client.service(WEB).await.unwrap() };
    let client = h.client().await;
    for _ in 0..3 {
        let _ = gets(client.clone()).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status_patches(&fake, "web").len(), patches_before);
    assert_eq!(event_requests(&fake, "POST"), posts_before);
    assert_eq!(event_requests(&fake, "PATCH"), 0);

    // A spec change that does not concern the load balancer bumps the generation: the condition
    // follows it (a new observedGeneration, the same lastTransitionTime since the status stays
    // True), and no new Event.
    let mut obj = fake.get("services", "default", "web").unwrap();
    obj["spec"]["sessionAffinity"] = json!("None");
    fake.put("services", obj);
    let generation =
        fake.get("services", "default", "web").unwrap()["metadata"]["generation"].clone();
    let c2 = eventually("the condition observes the new generation", || async {
        let c = condition_of(&fake, "web").ok_or("no condition")?;
        (c["observedGeneration"] == generation && c["reason"] == "Programmed")
            .then(|| c.clone())
            .ok_or_else(|| format!("{c}"))
    })
    .await;
    assert_eq!(c2["lastTransitionTime"], c["lastTransitionTime"]);
    assert_eq!(
        events_of(&fake, WEB)
            .iter()
            .filter(|e| e["reason"] == "Programmed")
            .count(),
        1
    );
    assert_rbac_covers(&fake.requests(), &["watcher.yaml"], "clb-watcher");
    w.stop().await;
}

/// NRP rejects the Service for good (it brings a public IP that does not exist:
/// `PublicIpNotFound`, parked): a Warning Event with the code and the condition
/// False/RejectedByAzure.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_azure_rejects_gets_a_warning_event_and_the_rejected_condition() {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    let fake = FakeApi::start().await;
    let long_uid = "5e771265-0000-4000-8000-00000000dead";
    small_cluster(&fake, "long", long_uid);
    let mut obj = fake.get("services", "default", "long").unwrap();
    obj["metadata"]["annotations"] =
        json!({"service.beta.kubernetes.io/azure-pip-name": "pip-nowhere"});
    fake.put("services", obj);
    let w = start_watcher(&h, &fake, Mode::Cluster { pods: false });

    let c = wait_condition(&fake, "long", "RejectedByAzure").await;
    assert_eq!(c["status"], "False");
    assert!(
        c["message"].as_str().unwrap().contains("PublicIpNotFound"),
        "{c}"
    );
    let events = eventually("the RejectedByAzure event", || async {
        let e = events_of(&fake, long_uid);
        e.iter()
            .any(|e| e["reason"] == "RejectedByAzure")
            .then_some(e.clone())
            .ok_or_else(|| format!("{e:?}"))
    })
    .await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_event(&events[0], long_uid, "long", "Warning", "RejectedByAzure");
    assert!(
        events[0]["note"]
            .as_str()
            .unwrap()
            .contains("PublicIpNotFound"),
        "{}",
        events[0]
    );
    let obj = fake.get("services", "default", "long").unwrap();
    assert!(obj["status"]["loadBalancer"]["ingress"].is_null(), "{obj}");
    w.stop().await;
}

/// NRP throttles every call for a while: one Warning `Throttled` Event and the condition
/// False/Throttled, however many times the work is retried (the fake's request log counts the
/// Event requests); once the throttling ends, one Normal `Programmed` Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retries_under_throttling_give_one_event_not_one_per_retry() {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut options = Options::e2e();
    options.emulator.fault_rate_429 = 1.0;
    options.emulator.retry_after_secs = 0;
    let h = Harness::start(options).await;
    let fake = FakeApi::start().await;
    small_cluster(&fake, "web", WEB);
    let w = start_watcher(&h, &fake, Mode::Cluster { pods: false });

    let c = wait_condition(&fake, "web", "Throttled").await;
    assert_eq!(c["status"], "False");
    assert!(
        c["message"].as_str().unwrap().contains("TooManyRequests"),
        "{c}"
    );
    // Let the work be retried many times, while the watcher polls.
    let throttled = || -> u64 { h.emulator().stats().faults_injected.values().sum() };
    let first = throttled();
    eventually("NRP throttles several more retries", || async {
        let n = throttled();
        (n >= first + 5)
            .then_some(())
            .ok_or_else(|| format!("{n} faults"))
    })
    .await;
    let events = events_of(&fake, WEB);
    let warnings: Vec<&Value> = events
        .iter()
        .filter(|e| e["reason"] == "Throttled")
        .collect();
    assert_eq!(warnings.len(), 1, "{events:?}");
    assert_event(warnings[0], WEB, "web", "Warning", "Throttled");
    assert!(
        warnings[0]["note"]
            .as_str()
            .unwrap()
            .contains("TooManyRequests")
    );
    assert_eq!(
        event_requests(&fake, "POST"),
        1,
        "one Event, not one per retry"
    );
    assert_eq!(event_requests(&fake, "PATCH"), 0, "not even a series");
    // Our condition in each status patch that carried conditions: (reason, message).
    let ours: Vec<(String, String)> = status_patches(&fake, "web")
        .iter()
        .filter_map(|p| p.body.pointer("/status/conditions")?.as_array().cloned())
        .filter_map(|conditions| {
            let c = conditions
                .iter()
                .find(|c| c["type"] == "clb.azure.com/Programmed")?;
            Some((
                c["reason"].as_str()?.to_owned(),
                c["message"].as_str()?.to_owned(),
            ))
        })
        .collect();

    // The throttling ends: programmed, one Normal Event more.
    let mut config = h.emulator().config();
    config.fault_rate_429 = 0.0;
    h.emulator().set_config(config).unwrap();
    wait_condition(&fake, "web", "Programmed").await;
    let events = eventually("the Programmed event", || async {
        let e = events_of(&fake, WEB);
        e.iter()
            .any(|e| e["reason"] == "Programmed")
            .then_some(e.clone())
            .ok_or_else(|| format!("{e:?}"))
    })
    .await;
    let reasons: Vec<&str> = events
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert_eq!(
        reasons.iter().filter(|r| **r == "Throttled").count(),
        1,
        "{reasons:?}"
    );
    assert_eq!(
        reasons.iter().filter(|r| **r == "Programmed").count(),
        1,
        "{reasons:?}"
    );
    assert_eq!(event_requests(&fake, "POST"), 2);
    // While throttled, the condition was patched once per change, not per poll or retry: Throttled
    // once, and no patch repeats the one before it. (Before Throttled it may or may not pass
    // through "waiting for Azure" first, as the pushed state and the first retry race.)
    assert_eq!(
        ours.iter().filter(|(r, _)| r == "Throttled").count(),
        1,
        "{ours:#?}"
    );
    assert!(ours.windows(2).all(|w| w[0] != w[1]), "{ours:#?}");
    assert!(ours.len() <= 3, "{ours:#?}");
    w.stop().await;
}

/// The endpoints of a Service disagree on the number behind its named targetPort: the translator's
/// port-name conflict becomes one Warning `PortNameConflict` Event and part of the condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_port_name_conflict_becomes_a_warning_event_and_part_of_the_condition() {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    let fake = FakeApi::start().await;
    fake.put("nodes", node("node-a", &["10.0.0.1"]));
    fake.put(
        "services",
        svc(
            "named",
            WEB,
            json!({"type": "LoadBalancer",
                   "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": "web"}]}),
        ),
    );
    for (name, address, number) in [("named-a", "10.1.0.1", 8080), ("named-b", "10.1.0.2", 9090)] {
        let mut s = slice(name, "named", "IPv4", vec![ep(address, "node-a", true)]);
        s["ports"] = json!([{"name": "http", "port": number, "protocol": "TCP"}]);
        fake.put("endpointslices", s);
    }
    let w = start_watcher(&h, &fake, Mode::Cluster { pods: false });

    let events = eventually("the PortNameConflict event", || async {
        let e = events_of(&fake, WEB);
        e.iter()
            .any(|e| e["reason"] == "PortNameConflict")
            .then_some(e.clone())
            .ok_or_else(|| format!("{e:?}"))
    })
    .await;
    let conflicts: Vec<&Value> = events
        .iter()
        .filter(|e| e["reason"] == "PortNameConflict")
        .collect();
    assert_eq!(conflicts.len(), 1, "{events:?}");
    assert_event(conflicts[0], WEB, "named", "Warning", "PortNameConflict");
    let note = conflicts[0]["note"].as_str().unwrap();
    assert!(note.contains("8080") && note.contains("9090"), "{note}");
    let c = wait_condition(&fake, "named", "PortNameConflict").await;
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("port name conflict"),
        "{c}"
    );
    w.stop().await;
}

/// The ingress entries of Service `name` as stored.
fn stored_ingress(fake: &FakeApi, name: &str) -> Value {
    fake.get("services", "default", name).unwrap()["status"]["loadBalancer"]["ingress"].clone()
}

/// Reads the server a few times and checks that no status patch of `name`
/// follows: the write-back has settled.
async fn assert_settled(h: &Harness, fake: &FakeApi, name: &str) {
    let before = status_patches(fake, name).len();
    let client = h.client().await;
    for _ in 0..5 {
        let _ = client.service(WEB).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        status_patches(fake, name).len(),
        before,
        "status patched again: {:?}",
        status_patches(fake, name)
            .iter()
            .map(|p| &p.body)
            .collect::<Vec<_>>()
    );
}

/// An ingress entry without `ipMode` (a status written before the field, or by someone else) is
/// rewritten with `ipMode: VIP` — once: the comparison includes the field, and the entry then reads
/// back as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ingress_entry_without_ip_mode_is_rewritten_once() {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    let fake = FakeApi::start().await;
    small_cluster(&fake, "web", WEB);
    let w = start_watcher(&h, &fake, Mode::Cluster { pods: false });
    wait_condition(&fake, "web", "Programmed").await;
    let ip = stored_ingress(&fake, "web")[0]["ip"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        stored_ingress(&fake, "web"),
        json!([{"ip": ip, "ipMode": "VIP"}])
    );
    assert_settled(&h, &fake, "web").await;

    // Someone stores the entry without ipMode.
    let before = status_patches(&fake, "web").len();
    let mut obj = fake.get("services", "default", "web").unwrap();
    obj["status"]["loadBalancer"]["ingress"] = json!([{"ip": ip}]);
    fake.put("services", obj);
    eventually("the ingress has ipMode VIP again", || async {
        let i = stored_ingress(&fake, "web");
        (i == json!([{"ip": ip, "ipMode": "VIP"}]))
            .then_some(())
            .ok_or_else(|| i.to_string())
    })
    .await;
    let patches = status_patches(&fake, "web");
    assert_eq!(patches.len(), before + 1, "one patch rewrites it");
    assert_eq!(
        patches[before].body["status"]["loadBalancer"]["ingress"],
        json!([{"ip": ip, "ipMode": "VIP"}])
    );
    assert_settled(&h, &fake, "web").await;
    w.stop().await;
}

/// An API server with the `LoadBalancerIPMode` gate off drops `ipMode` on write: the watcher sees it
/// in the answer to its patch and compares the IPs alone from then on — one ingress patch, no loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_drops_ip_mode_gets_the_ingress_once() {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    let fake = FakeApi::start().await;
    fake.ip_mode_gate_off();
    small_cluster(&fake, "web", WEB);
    let w = start_watcher(&h, &fake, Mode::Cluster { pods: false });
    wait_condition(&fake, "web", "Programmed").await;
    let ingress = stored_ingress(&fake, "web");
    assert!(ingress[0]["ip"].is_string(), "{ingress}");
    assert!(ingress[0].get("ipMode").is_none(), "dropped: {ingress}");
    let with_ingress: Vec<PatchRecord> = status_patches(&fake, "web")
        .into_iter()
        .filter(|p| p.body.pointer("/status/loadBalancer").is_some())
        .collect();
    assert_eq!(with_ingress.len(), 1, "{with_ingress:?}");
    assert_eq!(
        with_ingress[0].body["status"]["loadBalancer"]["ingress"][0]["ipMode"],
        "VIP"
    );
    assert_settled(&h, &fake, "web").await;
    w.stop().await;
}
