//! The Kubernetes API down while the state server checks callers (docs/security.md, "fail
//! closed"): the state server as `clb-state-server` runs it (`clb_state_server::run`, with the
//! flags `deploy/` gives it: `--authentication=kubernetes --authorization=kubernetes`) against the
//! fake Kubernetes API. A caller the server has not cached gets `UNAVAILABLE` within 2 s (the
//! clients' deadline is 8 s) when the API answers 503 or refuses connections, and nothing is
//! applied; a cached caller keeps working. The fake answers at once: the 2 s bound leaves room
//! for a loaded machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser as _;
use clb_client::client::{Client, ClientError, ConnectOptions};
use clb_client::updates::service_add;
use clb_state_server::config::Args;
use clb_state_server::run::{self, Bound, KubeClients, Options};
use clb_state_server::state::StateServer;
use clb_tests::fake_kube::{FakeApi, TokenUser};
use tonic::Code;

const NS: &str = "clb-system";
/// Well below the clients' 8 s deadline, well above what an instant answer takes.
const FAST: Duration = Duration::from_secs(2);

/// The state server with caller checks on, bound to ports 0, on the Kubernetes API `kube`.
async fn server(
    kube: kube::Config,
) -> (Arc<StateServer>, String, tokio::sync::oneshot::Sender<()>) {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let args = Args::try_parse_from([
        "clb-state-server",
        "--listen=127.0.0.1:0",
        "--metrics-listen=127.0.0.1:0",
        "--authentication=kubernetes",
        "--authorization=kubernetes",
    ])
    .expect("flags");
    let options = Options::from_args(args).expect("options");
    assert!(options.needs_kubernetes().is_some());
    let kube = KubeClients::from_config(kube).expect("kube clients");
    let bound: Bound = run::bind(options, Some(kube)).await.expect("bind");
    let url = format!("http://{}", bound.started().grpc_addr);
    let state = bound.state().clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        bound
            .serve(async move {
                let _ = stopped.await;
            })
            .await
            .expect("the server runs");
    });
    (state, url, stop)
}

/// A token file for `token` in a fresh temporary directory (removed by the returned guard).
struct Tokens(std::path::PathBuf);

impl Tokens {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "clb-auth-unavailable-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }

    async fn client(&self, url: &str, token: &str) -> Client {
        let path = self.0.join(token);
        std::fs::write(&path, token).expect("token file");
        let mut options = ConnectOptions::new(url);
        options.token_file = Some(path);
        Client::connect(options).await.expect("connect")
    }
}

impl Drop for Tokens {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn revision(state: &StateServer) -> u64 {
    state
        .gateway("default")
        .expect("default gateway")
        .lock()
        .tracker()
        .revision()
}

/// The call's status code and message, and how long it took.
async fn timed<T: std::fmt::Debug>(
    call: impl std::future::Future<Output = Result<T, ClientError>>,
) -> (Code, String, Duration) {
    let started = Instant::now();
    let r = call.await;
    let took = started.elapsed();
    match r {
        Err(e) => {
            let s = e.status().unwrap_or_else(|| panic!("not a status: {e}"));
            eprintln!("{:?} after {took:?}: {}", s.code(), s.message());
            (s.code(), s.message().to_owned(), took)
        }
        Ok(v) => panic!("expected an error status, got {v:?}"),
    }
}

/// The TokenReview and SubjectAccessReview requests the fake API received.
fn review_requests(api: &FakeApi) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.starts_with("POST ") && r.contains("reviews"))
        .count()
}

/// Two writers' tokens: the watcher's ServiceAccount (deploy/'s own binding: `write`) and a
/// second identity bound to clb-writer and clb-reader as an operator binds one.
fn watcher_tokens(api: &FakeApi) {
    api.load_rbac(&clb_tests::deploy::Rendered::load(&[]));
    for role in ["clb-writer", "clb-reader"] {
        api.create_cluster_role_binding(
            &format!("{role}-watcher-2"),
            role,
            clb_tests::rbac::service_account(NS, "clb-watcher-2"),
        );
    }
    api.create_cluster_role_binding(
        "clb-reader-watcher",
        "clb-reader",
        clb_tests::rbac::service_account(NS, "clb-watcher"),
    );
    for (token, account) in [("t-cached", "clb-watcher"), ("t-new", "clb-watcher-2")] {
        api.add_token(
            token,
            TokenUser::service_account(NS, account, Some("node-w"), "clb"),
        );
    }
}

#[tokio::test]
async fn while_the_api_answers_503_a_new_caller_is_unavailable_at_once_and_a_cached_one_works() {
    clb_tests::init_tracing();
    let api = FakeApi::start().await;
    watcher_tokens(&api);
    let (state, url, _stop) = server(api.kube_config()).await;
    let tokens = Tokens::new();
    let cached = tokens.client(&url, "t-cached").await;
    let mut writer = cached.writer("watcher");
    writer
        .apply(vec![service_add("svc-1", &[])])
        .await
        .expect("applied while the API is up");
    let before = revision(&state);

    api.reviews_down(true);
    let reviews = review_requests(&api);
    // A caller the server has not seen: its TokenReview is answered 503.
    let fresh = tokens.client(&url, "t-new").await;
    let (code, msg, took) = timed(
        fresh
            .writer("watcher")
            .apply(vec![service_add("svc-2", &[])]),
    )
    .await;
    assert_eq!(code, Code::Unavailable, "{msg}");
    assert!(took < FAST, "UNAVAILABLE after {took:?}: {msg}");
    assert!(
        msg.contains("TokenReview") && msg.contains("503") && msg.contains("nothing was changed"),
        "{msg}"
    );
    // A cached token whose access decision is not cached: the SubjectAccessReview fails as fast.
    let (code, msg, took) = timed(cached.status()).await;
    assert_eq!(code, Code::Unavailable, "{msg}");
    assert!(took < FAST, "UNAVAILABLE after {took:?}: {msg}");
    assert!(
        msg.contains("SubjectAccessReview") && msg.contains("503"),
        "{msg}"
    );
    assert_eq!(revision(&state), before, "nothing applied");
    // One request each: the reviews were not retried inside the request.
    assert_eq!(review_requests(&api) - reviews, 2, "{:?}", api.requests());

    // The cached caller keeps writing while the API is down.
    let ok = writer
        .apply(vec![service_add("svc-3", &[])])
        .await
        .expect("a cached caller works while the API is down");
    assert_eq!(ok.applied, 1);

    // Back up: the new caller goes through.
    api.reviews_down(false);
    let ok = fresh
        .writer("watcher")
        .apply(vec![service_add("svc-2", &[])])
        .await
        .expect("recovered");
    assert_eq!(ok.applied, 1);
}

#[tokio::test]
async fn while_the_api_refuses_connections_a_caller_is_unavailable_at_once() {
    clb_tests::init_tracing();
    // A port nothing listens on: bound, then closed.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let kube = kube::Config::new(format!("http://{closed}").parse().expect("url"));
    let (state, url, _stop) = server(kube).await;
    let before = revision(&state);
    let tokens = Tokens::new();
    let client = tokens.client(&url, "t-any").await;
    let (code, msg, took) = timed(
        client
            .writer("watcher")
            .apply(vec![service_add("svc-1", &[])]),
    )
    .await;
    assert_eq!(code, Code::Unavailable, "{msg}");
    assert!(took < FAST, "UNAVAILABLE after {took:?}: {msg}");
    assert!(
        msg.contains("could not be reached for the TokenReview")
            && msg.contains("nothing was changed"),
        "{msg}"
    );
    assert_eq!(revision(&state), before, "nothing applied");
    let (code, _, took) = timed(client.status()).await;
    assert_eq!(code, Code::Unavailable);
    assert!(took < FAST, "UNAVAILABLE after {took:?}");
}

/// An API server that does not answer at all (a network partition): the call fails closed after
/// the review timeout (1.5 s), still well within the clients' 8 s deadline.
#[tokio::test]
async fn while_the_api_does_not_answer_a_caller_is_unavailable_within_its_deadline() {
    clb_tests::init_tracing();
    let api = FakeApi::start().await;
    watcher_tokens(&api);
    let (kube, link) = api.partitionable_config().await;
    let (state, url, _stop) = server(kube).await;
    let before = revision(&state);
    link.cut();
    let tokens = Tokens::new();
    let client = tokens.client(&url, "t-new").await;
    let (code, msg, took) = timed(
        client
            .writer("watcher")
            .apply(vec![service_add("svc-1", &[])]),
    )
    .await;
    assert_eq!(code, Code::Unavailable, "{msg}");
    assert!(
        took < Duration::from_secs(7),
        "UNAVAILABLE after {took:?}: {msg}"
    );
    assert!(msg.contains("has not answered the TokenReview"), "{msg}");
    assert_eq!(revision(&state), before, "nothing applied");
    link.heal();
    let ok = client
        .writer("watcher")
        .apply(vec![service_add("svc-1", &[])])
        .await
        .expect("recovered");
    assert_eq!(ok.applied, 1);
}
