//! Measurement (issue 20): resyncs and Admin calls per minute of 1 cluster watcher + 10 node agents
//! in steady state, against a state server with authentication and authorization on and exactly
//! deploy/'s roles (watcher: write, node agents: write-node). Run with --ignored --nocapture.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clb_client::client::ConnectOptions;
use clb_state_server::auth::{Auth, AuthConfig, Mode as AuthMode};
use clb_state_server::grpc::{ServeOptions, serve_with};
use clb_state_server::state::{ServerConfig, StateServer};
use clb_tests::fake_kube::{FakeApi, TokenUser};
use clb_tests::kube_objects::{RunningWatcher, endpoint, node, pod, service, slice, test_config};
use clb_watcher::Mode;
use serde_json::json;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::SubscriberExt;

const NS: &str = "clb-system";
const NODES: usize = 10;

static ADMIN_REFUSED: AtomicU64 = AtomicU64::new(0);
static PERMISSION_DENIED_LOGS: AtomicU64 = AtomicU64::new(0);

struct Counter;
struct V {
    admin: bool,
    refused: bool,
    denied: bool,
}
impl Visit for V {
    fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
        let s = format!("{v:?}");
        if f.name() == "path" && s.contains("/clb.v1.Admin/") {
            self.admin = true;
        }
        if f.name() == "message" && s.contains("call refused") {
            self.refused = true;
        }
        if s.contains("PermissionDenied") || s.contains("may not") {
            self.denied = true;
        }
    }
    fn record_str(&mut self, f: &Field, v: &str) {
        self.record_debug(f, &v);
    }
}
impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Counter {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut v = V {
            admin: false,
            refused: false,
            denied: false,
        };
        e.record(&mut v);
        if v.admin && v.refused {
            ADMIN_REFUSED.fetch_add(1, Ordering::Relaxed);
        }
        if v.denied && !v.refused {
            PERMISSION_DENIED_LOGS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn resyncs(state: &StateServer) -> u64 {
    state
        .metrics()
        .encode()
        .lines()
        .find(|l| l.starts_with("clb_server_update_rpcs_total{rpc=\"resync\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a 70 s measurement: cargo test -p clb-tests --test steady_writers -- --ignored --nocapture"]
async fn steady_state_resyncs_and_admin_calls_per_minute() {
    let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Counter));
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let api = FakeApi::start().await;
    grant_deploy_roles(&api);
    let dir = std::env::temp_dir().join(format!("clb-steady-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = |t: &str, account: &str, node: Option<&str>| -> PathBuf {
        api.add_token(t, TokenUser::service_account(NS, account, node, "clb"));
        let p = dir.join(t);
        std::fs::write(&p, t).unwrap();
        p
    };
    let state = StateServer::new(ServerConfig::default());
    let mut kcfg = kube::Config::new(api.url.parse().unwrap());
    kcfg.default_retry = false;
    let auth = Auth::new(
        AuthConfig {
            authentication: AuthMode::Kubernetes,
            authorization: AuthMode::Kubernetes,
            ..AuthConfig::default()
        },
        Some(kube::Client::try_from(kcfg).unwrap()),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(serve_with(
        listener,
        state.clone(),
        ServeOptions {
            tls: None,
            auth: Some(auth),
        },
        std::future::pending(),
    ));

    for i in 0..NODES {
        let n = format!("node-{i}");
        let ip = format!("10.0.0.{}", i + 1);
        api.put("nodes", node(&n, &[&ip]));
        for p in 0..3 {
            let addr = format!("10.1.{i}.{}", p + 1);
            let egress = (p == 0).then_some("eg-1");
            api.put("pods", pod(&format!("p-{i}-{p}"), &n, &[&addr], egress));
        }
    }
    for (name, uid) in [("web", "uid-web"), ("api", "uid-api")] {
        api.put(
            "services",
            service(
                name,
                uid,
                json!({"type": "LoadBalancer", "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}),
            ),
        );
        let eps = (0..NODES)
            .map(|i| endpoint(&format!("10.1.{i}.2"), &format!("node-{i}"), true))
            .collect();
        api.put(
            "endpointslices",
            slice(&format!("{name}-1"), name, "IPv4", eps),
        );
    }

    let mut watchers = Vec::new();
    let mut c = test_config(&url, Mode::Cluster { pods: false });
    c.server.token_file = Some(token("t-watcher", "clb-watcher", Some("node-w")));
    watchers.push(RunningWatcher::start(c, api.watcher_clients()));
    for i in 0..NODES {
        let n = format!("node-{i}");
        let mut c = test_config(&url, Mode::NodeAgent { node: n.clone() });
        c.server.token_file = Some(token(&format!("t-agent-{i}"), "clb-node-agent", Some(&n)));
        watchers.push(RunningWatcher::start(c, api.watcher_clients()));
    }
    // Warm-up, then one minute of steady state.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (r0, a0, d0) = (
        resyncs(&state),
        ADMIN_REFUSED.load(Ordering::Relaxed),
        PERMISSION_DENIED_LOGS.load(Ordering::Relaxed),
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    let (r1, a1, d1) = (
        resyncs(&state),
        ADMIN_REFUSED.load(Ordering::Relaxed),
        PERMISSION_DENIED_LOGS.load(Ordering::Relaxed),
    );
    println!(
        "STEADY 60 s, 1 watcher + {NODES} node agents: resyncs {} (server total {r1}), Admin calls refused {}, PermissionDenied log events {}",
        r1 - r0,
        a1 - a0,
        d1 - d0
    );
    for w in watchers {
        w.stop().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = Arc::strong_count(&state);
    let _ = ConnectOptions::new("-");
}

fn grant_deploy_roles(api: &FakeApi) {
    // Exactly deploy/'s roles and bindings (clb-writer for clb-watcher, clb-node-writer for
    // clb-node-agent), evaluated by the fake API. At f977fb6 the same measurement granted these
    // two verbs by hand (the fake API had a grant table then).
    api.load_rbac(&clb_tests::deploy::Rendered::load(&[]));
}
