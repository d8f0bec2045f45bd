//! Kubernetes-native authentication and authorization (docs/security.md): the state server with
//! `--authentication=kubernetes --authorization=kubernetes` against the fake Kubernetes API, which
//! answers TokenReview from a table of tokens and SubjectAccessReview by evaluating deploy/'s RBAC
//! (plus the bindings an operator creates); clients send their token from a file.
//! Loopback and port 0 only; no timing assertions.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use clb_client::client::{Client, ClientError, ConnectOptions, scope};
use clb_client::updates::{egress_add, pod_add, port, service_add};
use clb_proto::v1::worker_client::WorkerClient;
use clb_proto::v1::{ClusterNode, ClusterTopology, Hello, Protocol, WorkerMessage, worker_message};
use clb_state_server::auth::{Auth, AuthConfig, Mode};
use clb_state_server::grpc::{ServeOptions, serve_with};
use clb_state_server::state::{ServerConfig, StateServer};
use clb_tests::deploy::Rendered;
use clb_tests::fake_kube::{FakeApi, TokenUser};
use clb_tests::rbac;
use tonic::Code;

const NS: &str = "clb-system";
/// The operator who reads (bound to clb-reader by the test, as an operator binds it).
const READER: &str = "alice";
const NODE_A: &str = "10.0.0.1";
const NODE_B: &str = "10.0.0.2";
const EGRESS: &str = "eg-1";

/// A client of the fake without kube's retries of 503 (an API server that is down refuses
/// connections; the fake answers 503 instead).
fn kube_client(api: &FakeApi) -> kube::Client {
    let mut config = kube::Config::new(api.url.parse().expect("url"));
    config.default_retry = false;
    kube::Client::try_from(config).expect("client")
}

struct System {
    api: FakeApi,
    state: Arc<StateServer>,
    url: String,
    dir: PathBuf,
}

impl System {
    /// A state server checking callers against a fake API that knows the project's identities
    /// and evaluates deploy/'s RBAC: the watcher (`write` by deploy/'s binding, its pod on
    /// node-w), node agents on node-a and node-b (`write-node`), a sync worker (`work`), an
    /// operator `alice` bound to `clb-reader` as docs/operations.md tells operators to bind
    /// themselves, and a ServiceAccount no binding names.
    async fn start() -> Self {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let api = FakeApi::start().await;
        api.load_rbac(&Rendered::load(&[]));
        let accounts = [
            ("t-watcher", "clb-watcher", Some("node-w")),
            ("t-agent-a", "clb-node-agent", Some("node-a")),
            ("t-agent-b", "clb-node-agent", Some("node-b")),
            ("t-worker", "clb-sync-worker", Some("node-w")),
            ("t-nobody", "someone", Some("node-a")),
        ];
        for (token, account, node) in accounts {
            api.add_token(token, TokenUser::service_account(NS, account, node, "clb"));
        }
        // `kubectl create clusterrolebinding clb-reader-alice --clusterrole=clb-reader --user=alice`
        api.add_token("t-reader", TokenUser::user(READER, &[], "clb"));
        api.create_cluster_role_binding("clb-reader-alice", "clb-reader", rbac::user(READER));
        api.add_token(
            "t-other-audience",
            TokenUser::service_account(NS, "clb-watcher", None, "https://kubernetes.default.svc"),
        );
        let state = StateServer::new(ServerConfig::default());
        let auth = Auth::new(
            AuthConfig {
                authentication: Mode::Kubernetes,
                authorization: Mode::Kubernetes,
                ..AuthConfig::default()
            },
            Some(kube_client(&api)),
        )
        .expect("auth");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let options = ServeOptions {
            tls: None,
            auth: Some(auth),
        };
        tokio::spawn(serve_with(
            listener,
            state.clone(),
            options,
            std::future::pending(),
        ));
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "clb-auth-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self {
            api,
            state,
            url,
            dir,
        }
    }

    fn token_file(&self, token: &str) -> PathBuf {
        let path = self.dir.join(token);
        std::fs::write(&path, format!("{token}\n")).expect("token file");
        path
    }

    async fn client(&self, token: Option<&str>) -> Client {
        let mut options = ConnectOptions::new(&self.url);
        options.token_file = token.map(|t| self.token_file(t));
        Client::connect(options).await.expect("connect")
    }

    fn revision(&self) -> u64 {
        self.state
            .gateway("default")
            .expect("default gateway")
            .lock()
            .tracker()
            .revision()
    }

    /// The watcher's cluster view: one service, node-a at NODE_A, node-b at NODE_B.
    async fn watcher_declares_the_nodes(&self) {
        let topology = ClusterTopology {
            nodes: ["a", "b"]
                .iter()
                .zip([NODE_A, NODE_B])
                .map(|(n, ip)| ClusterNode {
                    name: format!("node-{n}"),
                    locations: vec![ip.to_owned()],
                    pods_writer: format!("node-agent/node-{n}"),
                })
                .collect(),
        };
        let scope = clb_proto::v1::ResyncScope {
            pods: false,
            ..scope::all()
        };
        let outcome = self
            .client(Some("t-watcher"))
            .await
            .writer("watcher")
            .resync_with_topology(
                scope,
                Some(topology),
                vec![
                    service_add("svc-1", &[port(80, Protocol::Tcp)]),
                    egress_add(EGRESS),
                ],
            )
            .await
            .expect("the watcher resyncs");
        assert!(
            outcome.rejected.is_empty(),
            "{}",
            outcome.describe_rejected()
        );
    }
}

impl Drop for System {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn code(r: Result<impl std::fmt::Debug, ClientError>) -> (Code, String) {
    match r {
        Err(e) => {
            let s = e.status().unwrap_or_else(|| panic!("not a status: {e}"));
            (s.code(), s.message().to_owned())
        }
        Ok(v) => panic!("expected an error status, got {v:?}"),
    }
}

fn a_pod(location: &str, n: u8) -> clb_proto::v1::Update {
    let ip = format!("10.244.{}.{n}", location.rsplit('.').next().unwrap_or("0"));
    pod_add(&ip, location, EGRESS, &format!("ns/p{n}"), "")
}

#[tokio::test]
async fn a_call_without_a_token_is_unauthenticated_but_health_stays_open() {
    let sys = System::start().await;
    let before = sys.revision();
    let c = sys.client(None).await;
    let (code_, msg) = code(c.status().await);
    assert_eq!(code_, Code::Unauthenticated, "{msg}");
    assert!(msg.contains("no bearer token"), "{msg}");
    let (code_, _) = code(
        c.writer("watcher")
            .apply(vec![service_add("svc-x", &[])])
            .await,
    );
    assert_eq!(code_, Code::Unauthenticated);
    assert_eq!(sys.revision(), before, "nothing applied");
    // The kubelet's probes and reflection need no token.
    let channel = tonic::transport::Endpoint::from_shared(sys.url.clone())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let health = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health is open");
    assert_eq!(health.into_inner().status, 1, "SERVING");
}

#[tokio::test]
async fn invalid_expired_and_foreign_audience_tokens_are_unauthenticated() {
    let sys = System::start().await;
    let before = sys.revision();
    for token in ["t-unknown", "t-other-audience"] {
        let c = sys.client(Some(token)).await;
        let (code_, msg) = code(c.writer("watcher").apply(vec![service_add("s", &[])]).await);
        assert_eq!(code_, Code::Unauthenticated, "{token}: {msg}");
        assert!(msg.contains("rejected"), "{msg}");
    }
    // A token that expires: valid, then revoked. The positive answer is cached for the TTL, so
    // the revocation is seen by a server without that cache entry: a token never seen before
    // stands for it here.
    sys.api.add_token(
        "t-expiring",
        TokenUser::service_account(NS, "clb-watcher", None, "clb"),
    );
    sys.api.revoke_token("t-expiring");
    let c = sys.client(Some("t-expiring")).await;
    let (code_, msg) = code(c.writer("watcher").apply(vec![service_add("s", &[])]).await);
    assert_eq!(code_, Code::Unauthenticated, "{msg}");
    assert!(msg.contains("invalid bearer token"), "{msg}");
    assert_eq!(sys.revision(), before, "nothing applied");
}

#[tokio::test]
async fn callers_without_the_role_are_denied_naming_the_missing_permission() {
    let sys = System::start().await;
    let before = sys.revision();
    for token in ["t-nobody", "t-reader", "t-worker"] {
        let c = sys.client(Some(token)).await;
        let (code_, msg) = code(
            c.writer("watcher")
                .apply(vec![service_add("svc-x", &[port(80, Protocol::Tcp)])])
                .await,
        );
        assert_eq!(code_, Code::PermissionDenied, "{token}: {msg}");
        for part in [
            "verb \"write\"",
            "resource \"gateways\"",
            "API group \"clb.azure.com\"",
            "name \"default\"",
            "clb-writer",
        ] {
            assert!(msg.contains(part), "{token}: {msg} lacks {part}");
        }
        let (code_, _) = code(c.writer("watcher").resync(scope::all(), vec![]).await);
        assert_eq!(code_, Code::PermissionDenied, "{token} resync");
    }
    assert_eq!(sys.revision(), before, "state unchanged");
    // Admin is for readers: the reader reads, the watcher (a writer only) does not.
    let status = sys.client(Some("t-reader")).await.status().await;
    assert!(status.is_ok(), "{status:?}");
    let (code_, msg) = code(sys.client(Some("t-watcher")).await.status().await);
    assert_eq!(code_, Code::PermissionDenied, "{msg}");
    assert!(
        msg.contains("verb \"get\"") && msg.contains("clb-reader"),
        "{msg}"
    );
    // The watcher writes.
    let ok = sys
        .client(Some("t-watcher"))
        .await
        .writer("watcher")
        .apply(vec![service_add("svc-y", &[port(80, Protocol::Tcp)])])
        .await
        .expect("the watcher may write");
    assert_eq!(ok.applied, 1);
    assert!(sys.revision() > before);
}

/// Opens `Worker.Sync` with `token` and returns the first answer's status code (`Ok` once welcomed).
async fn sync_as(sys: &System, token: &str) -> Code {
    let c = sys.client(Some(token)).await;
    let channel = tonic::transport::Endpoint::from_shared(sys.url.clone())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut worker = WorkerClient::with_interceptor(channel, c.interceptor());
    let hello = WorkerMessage {
        kind: Some(worker_message::Kind::Hello(Hello {
            worker_id: "w1".into(),
            capacity: 1,
            gateways: vec![],
        })),
    };
    // The stream stays open (a live session) until the test ends.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(hello).await.expect("send");
    std::mem::forget(tx);
    match worker
        .sync(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
    {
        Ok(mut s) => match s.get_mut().message().await {
            Ok(Some(_)) => Code::Ok,
            Ok(None) => Code::Aborted,
            Err(status) => status.code(),
        },
        Err(status) => status.code(),
    }
}

#[tokio::test]
async fn only_workers_may_sync() {
    let sys = System::start().await;
    assert_eq!(sync_as(&sys, "t-worker").await, Code::Ok);
    for token in ["t-watcher", "t-reader", "t-nobody"] {
        assert_eq!(
            sync_as(&sys, token).await,
            Code::PermissionDenied,
            "{token}"
        );
    }
}

#[tokio::test]
async fn a_node_agent_writes_only_pods_at_its_own_node() {
    let sys = System::start().await;
    let agent_a = sys.client(Some("t-agent-a")).await;
    // Before the watcher has declared the nodes (right after a start) the agent's resync is
    // answered UNAVAILABLE, a transient refusal it retries soon, not PERMISSION_DENIED.
    let revision = sys.revision();
    let (code_, msg) = code(
        agent_a
            .writer("node-agent/node-a")
            .resync(scope::pods_at(NODE_A), vec![a_pod(NODE_A, 9)])
            .await,
    );
    assert_eq!(code_, Code::Unavailable, "{msg}");
    assert!(msg.contains("topology"), "{msg}");
    assert_eq!(sys.revision(), revision, "nothing applied");
    sys.watcher_declares_the_nodes().await;
    let before = sys.revision();
    let outcome = agent_a
        .writer("node-agent/node-a")
        .apply(vec![
            a_pod(NODE_B, 1),
            a_pod(NODE_A, 2),
            service_add("svc-evil", &[]),
            a_pod("10.9.9.9", 3),
        ])
        .await
        .expect("the batch is answered");
    assert_eq!(outcome.applied, 1, "only the pod at node-a's location");
    let rejected: Vec<(usize, &str, &str)> = outcome
        .rejected
        .iter()
        .map(|r| (r.position, r.error.field.as_str(), r.error.value.as_str()))
        .collect();
    assert_eq!(
        rejected,
        [
            (0, "updates[0].pod.location", NODE_B),
            (2, "updates[2].service", ""),
            (3, "updates[3].pod.location", "10.9.9.9"),
        ]
    );
    assert!(
        outcome.rejected[0].error.reason.contains("node \"node-b\""),
        "{}",
        outcome.describe_rejected()
    );
    // Nothing at node-b, nor the service.
    {
        let handle = sys.state.gateway("default").expect("gw");
        let gw = handle.lock();
        assert!(gw.tracker().revision() > before);
        let ids = gw.tracker().desired_inbound_identities();
        assert!(!ids.iter().any(|i| i == "svc-evil"), "{ids:?}");
    }
    let b = location_state(&sys, NODE_B).await;
    assert!(b.is_none(), "nothing at node-b: {b:?}");
    let a = location_state(&sys, NODE_A).await.expect("node-a's pod");
    assert_eq!(a.addresses.len(), 1, "{a:?}");

    // Resyncs: only pods at its own node's location.
    let mut w = agent_a.writer("node-agent/node-a");
    let (code_, msg) = code(w.resync(scope::pods_at(NODE_B), vec![]).await);
    assert_eq!(code_, Code::PermissionDenied, "{msg}");
    assert!(
        msg.contains("header.scope.location") && msg.contains("node-b"),
        "{msg}"
    );
    let (code_, msg) = code(w.resync(scope::pods(), vec![]).await);
    assert_eq!(code_, Code::PermissionDenied, "{msg}");
    assert!(msg.contains("header.scope"), "{msg}");
    let revision = sys.revision();
    let (code_, _) = code(w.resync(scope::all(), vec![]).await);
    assert_eq!(code_, Code::PermissionDenied);
    assert_eq!(sys.revision(), revision, "refused resyncs change nothing");
    let ok = w
        .resync(
            scope::pods_at(NODE_A),
            vec![a_pod(NODE_A, 2), a_pod(NODE_A, 4)],
        )
        .await
        .expect("its own node");
    assert_eq!((ok.applied, ok.rejected.len()), (2, 0));
    // Node b's agent resyncs node b.
    let ok = sys
        .client(Some("t-agent-b"))
        .await
        .writer("node-agent/node-b")
        .resync(scope::pods_at(NODE_B), vec![a_pod(NODE_B, 5)])
        .await
        .expect("node b's agent");
    assert_eq!(ok.applied, 1);
}

/// The location's state as a reader sees it; `None` when nothing is there.
async fn location_state(sys: &System, location: &str) -> Option<clb_proto::v1::LocationState> {
    match sys.client(Some("t-reader")).await.location(location).await {
        Ok(state) => Some(state),
        Err(e) if e.status().is_some_and(|s| s.code() == Code::NotFound) => None,
        Err(e) => panic!("the reader reads: {e}"),
    }
}

#[tokio::test]
async fn a_node_agent_may_use_only_its_own_writer_name() {
    let sys = System::start().await;
    sys.watcher_declares_the_nodes().await;
    let before = sys.revision();
    let agent_a = sys.client(Some("t-agent-a")).await;
    for writer in ["watcher", "node-agent/node-b", "node-agent/node-a-2"] {
        let (code_, msg) = code(agent_a.writer(writer).apply(vec![a_pod(NODE_A, 1)]).await);
        assert_eq!(code_, Code::PermissionDenied, "{writer}: {msg}");
        assert!(msg.contains("node-agent/node-a"), "{msg}");
        let (code_, _) = code(
            agent_a
                .writer(writer)
                .resync(scope::pods_at(NODE_A), vec![])
                .await,
        );
        assert_eq!(code_, Code::PermissionDenied, "{writer} resync");
    }
    assert_eq!(sys.revision(), before);
}

#[tokio::test]
async fn a_rotated_token_file_is_used_without_a_restart() {
    let sys = System::start().await;
    let path = sys.dir.join("rotating");
    std::fs::write(&path, "t-nobody").expect("write");
    let mut options = ConnectOptions::new(&sys.url);
    options.token_file = Some(path.clone());
    let client = Client::connect(options).await.expect("connect");
    let mut writer = client.writer("watcher");
    let (code_, _) = code(writer.apply(vec![service_add("svc-r", &[])]).await);
    assert_eq!(code_, Code::PermissionDenied);
    // The kubelet rotates the projected token: a new file renamed over the old one.
    let next = sys.dir.join("rotating.new");
    std::fs::write(&next, "t-watcher\n").expect("write");
    std::fs::rename(&next, &path).expect("rename");
    let ok = writer
        .apply(vec![service_add("svc-r", &[])])
        .await
        .expect("the new token is sent");
    assert_eq!(ok.applied, 1);
}

#[tokio::test]
async fn reviews_are_cached() {
    let sys = System::start().await;
    let c = sys.client(Some("t-watcher")).await;
    let mut w = c.writer("watcher");
    for i in 0..20 {
        w.apply(vec![service_add(&format!("svc-{i}"), &[])])
            .await
            .expect("apply");
    }
    let (token_reviews, access_reviews) = sys.api.review_counts();
    assert_eq!(token_reviews, 1, "one TokenReview for 20 calls");
    assert_eq!(access_reviews, 1, "one SubjectAccessReview for 20 calls");
}

#[tokio::test]
async fn the_api_server_down_fails_closed_and_recovers() {
    let sys = System::start().await;
    let before = sys.revision();
    sys.api.reviews_down(true);
    let c = sys.client(Some("t-watcher")).await;
    let mut w = c.writer("watcher");
    let (code_, msg) = code(w.apply(vec![service_add("svc-d", &[])]).await);
    assert_eq!(code_, Code::Unavailable, "{msg}");
    assert!(msg.contains("TokenReview"), "{msg}");
    let (code_, _) = code(w.resync(scope::all(), vec![]).await);
    assert_eq!(code_, Code::Unavailable);
    assert_eq!(sys.revision(), before, "nothing applied");
    // Authenticated while up, then the authorization fails closed too.
    sys.api.reviews_down(false);
    let reader = sys.client(Some("t-reader")).await;
    reader.status().await.expect("reader reads");
    sys.api.reviews_down(true);
    let (code_, msg) = code(
        reader
            .writer("watcher")
            .apply(vec![service_add("s", &[])])
            .await,
    );
    assert_eq!(code_, Code::Unavailable, "{msg}");
    assert!(msg.contains("SubjectAccessReview"), "{msg}");
    assert_eq!(sys.revision(), before, "nothing applied");
    // Back up: the same client goes through.
    sys.api.reviews_down(false);
    let ok = w
        .apply(vec![service_add("svc-d", &[])])
        .await
        .expect("recovered");
    assert_eq!(ok.applied, 1);
}

#[tokio::test]
async fn apply_streams_are_checked_per_batch() {
    let sys = System::start().await;
    sys.watcher_declares_the_nodes().await;
    let before = sys.revision();
    // Without the role the stream ends with PERMISSION_DENIED, nothing applied.
    let batches = vec![vec![a_pod(NODE_A, 1)], vec![a_pod(NODE_A, 2)]];
    let (code_, msg) = code(
        sys.client(Some("t-reader"))
            .await
            .writer("watcher")
            .apply_stream(futures::stream::iter(batches))
            .await,
    );
    assert_eq!(code_, Code::PermissionDenied, "{msg}");
    assert_eq!(sys.revision(), before);
    // A node agent's stream: each batch bound to its node, rejections per item.
    let batches = vec![
        vec![a_pod(NODE_A, 1), a_pod(NODE_B, 2)],
        vec![a_pod(NODE_B, 3), a_pod(NODE_A, 4)],
    ];
    let outcome = sys
        .client(Some("t-agent-a"))
        .await
        .writer("node-agent/node-a")
        .apply_stream(futures::stream::iter(batches))
        .await
        .expect("the stream is answered");
    assert_eq!(outcome.applied, 2);
    let rejected: Vec<(usize, &str)> = outcome
        .rejected
        .iter()
        .map(|r| (r.position, r.error.value.as_str()))
        .collect();
    assert_eq!(rejected, [(1, NODE_B), (2, NODE_B)]);
    assert!(location_state(&sys, NODE_B).await.is_none());
}

/// The code of a write by `token` (`Ok` when applied).
async fn write_as(sys: &System, token: &str, service: &str) -> Code {
    match sys
        .client(Some(token))
        .await
        .writer("watcher")
        .apply(vec![service_add(service, &[port(80, Protocol::Tcp)])])
        .await
    {
        Ok(_) => Code::Ok,
        Err(e) => e.status().map_or(Code::Unknown, |s| s.code()),
    }
}

#[tokio::test]
async fn deleting_deploys_binding_or_role_takes_the_verb_away() {
    // The watcher writes through deploy/'s ClusterRoleBinding clb-writer-watcher; without it (or
    // without the role it names) the same token is denied. Fresh servers: answers are cached.
    for (kind, name) in [
        ("ClusterRoleBinding", "clb-writer-watcher"),
        ("ClusterRole", "clb-writer"),
    ] {
        let sys = System::start().await;
        assert!(
            sys.api.delete_rbac(kind, "", name),
            "{kind} {name} is in deploy/"
        );
        assert_eq!(
            write_as(&sys, "t-watcher", "svc-1").await,
            Code::PermissionDenied
        );
    }
    // The node agents' binding grants write-node, not write: they cannot write as the watcher.
    let sys = System::start().await;
    assert_eq!(
        write_as(&sys, "t-agent-a", "svc-1").await,
        Code::PermissionDenied
    );
    assert_eq!(write_as(&sys, "t-watcher", "svc-1").await, Code::Ok);
}

#[tokio::test]
async fn operator_bindings_grant_as_rbac_does() {
    let sys = System::start().await;
    let user = |name: &str, token: &str| {
        sys.api
            .add_token(token, TokenUser::user(name, &["ops"], "clb"));
    };
    // A RoleBinding grants only in its namespace: gateways are not namespaced, so a RoleBinding
    // of clb-writer in clb-system does not let bob write.
    user("bob", "t-bob");
    sys.api.create_role_binding(
        NS,
        "clb-writer-bob",
        rbac::RoleKind::ClusterRole,
        "clb-writer",
        rbac::user("bob"),
    );
    assert_eq!(
        write_as(&sys, "t-bob", "svc-b").await,
        Code::PermissionDenied
    );
    // A role limited by resourceNames to another gateway does not let carol write "default".
    user("carol", "t-carol");
    let mut only_blue = rbac::rule(&["clb.azure.com"], &["gateways"], &["write"]);
    only_blue.resource_names = Some(vec!["blue".to_owned()]);
    let role = rbac::cluster_role("clb-writer-blue", vec![only_blue]);
    sys.api
        .apply_rbac(&serde_json::to_value(&role).expect("json"));
    sys.api.create_cluster_role_binding(
        "clb-writer-blue-carol",
        "clb-writer-blue",
        rbac::user("carol"),
    );
    assert_eq!(
        write_as(&sys, "t-carol", "svc-c").await,
        Code::PermissionDenied
    );
    // A binding to the operators' group lets dave (a member) write every gateway.
    user("dave", "t-dave");
    sys.api
        .create_cluster_role_binding("clb-writer-ops", "clb-writer", rbac::group("ops"));
    assert_eq!(write_as(&sys, "t-dave", "svc-d").await, Code::Ok);
}
