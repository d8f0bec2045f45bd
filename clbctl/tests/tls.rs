//! Every client of the state server over TLS, against a real state server behind TLS on 127.0.0.1:0
//! (certificates from `tests/support/pki.rs`, shared with the state server's TLS tests: a CA, a
//! server certificate for `localhost` and 127.0.0.1, a client certificate): the typed client (with
//! the CA, without it, by IP address with a domain override), mutual TLS (no certificate refused,
//! the signed one accepted, also through the watcher's `--tls-*` flags), `clbctl --tls-ca`
//! (`status`, and `load --node-agents`: each simulated node agent on a TLS connection of its own),
//! and a sync worker that gets its work over mutual TLS and executes it against the NRP emulator.
//! Nothing reaches the network; waits are bounded only to fail a hung test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser as _;
use clb_client::client::{Client, ClientError, ConnectOptions, TlsOptions};
use clb_client::updates::{endpoint, endpoints_level, port, service_add};
use clb_embedded::WorkerProc;
use clb_nrp_emulator::{Emulator, EmulatorConfig, RunningEmulator};
use clb_proto::v1::Protocol;
use clb_state_server::state::{ServerConfig, StateServer};
use clb_state_server::tls::TlsFiles;
use clb_sync_worker::worker::{self, Backoff, WorkerConfig, WorkerTls};
use tokio::sync::oneshot;

#[path = "../../tests/support/pki.rs"]
mod pki;
use pki::Pki;

/// A guard against hangs, not a timing assertion.
const PATIENCE: Duration = Duration::from_secs(60);

fn init() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

// ---- a state server behind TLS -----------------------------------------------------------------------

struct TlsServer {
    state: Arc<StateServer>,
    port: u16,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsServer {
    async fn start(files: &TlsFiles) -> Self {
        let tls = files.load().expect("valid TLS files");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = StateServer::new(ServerConfig::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let s = Arc::clone(&state);
        let task = tokio::spawn(async move {
            clb_state_server::grpc::serve_tls(listener, s, Some(tls), async {
                let _ = stopped.await;
            })
            .await
            .expect("the server runs");
        });
        Self {
            state,
            port,
            stop: Some(stop),
            task,
        }
    }

    fn url(&self) -> String {
        format!("https://localhost:{}", self.port)
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(PATIENCE, &mut self.task).await;
    }
}

/// Options for `url` with `tls`, failing fast (one attempt).
fn options(url: &str, tls: TlsOptions) -> ConnectOptions {
    let mut o = ConnectOptions::new(url);
    o.attempts = 1;
    o.connect_timeout = Duration::from_secs(10);
    o.tls = Some(tls);
    o
}

fn with_ca(pki: &Pki) -> TlsOptions {
    TlsOptions {
        ca: Some(clb_client::tls::CaBundle::Pem(pki.ca.clone().into_bytes())),
        ..TlsOptions::default()
    }
}

/// Connects and applies one service: what every writer does first.
async fn connect_and_apply(options: ConnectOptions) -> Result<(), ClientError> {
    let client = Client::connect(options).await?;
    let outcome = client
        .writer("tls-test")
        .apply(vec![service_add("svc-tls", &[port(443, Protocol::Tcp)])])
        .await?;
    assert!(
        outcome.rejected.is_empty(),
        "{}",
        outcome.describe_rejected()
    );
    assert_eq!(outcome.applied, 1);
    Ok(())
}

// ---- tests --------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_typed_client_needs_the_ca_and_then_writes_over_tls() {
    init();
    let pki = Pki::new("typed");
    let server = TlsServer::start(&pki.server_files(false)).await;

    // (a) With the CA, by name: connect and Apply.
    connect_and_apply(options(&server.url(), with_ca(&pki)))
        .await
        .expect("TLS with the CA");
    assert_eq!(
        server
            .state
            .gateway("")
            .unwrap()
            .lock()
            .tracker()
            .counts()
            .desired_services,
        1
    );
    // By IP address with the domain override, and by IP address alone (the certificate names it).
    let by_ip = format!("https://127.0.0.1:{}", server.port);
    let domain = TlsOptions {
        domain: Some("localhost".into()),
        ..with_ca(&pki)
    };
    connect_and_apply(options(&by_ip, domain))
        .await
        .expect("TLS by IP with --tls-domain-like override");
    connect_and_apply(options(&by_ip, with_ca(&pki)))
        .await
        .expect("TLS by IP address");
    // TLS options with an `http://` URL (e.g. `clb-watcher --tls-ca … --server http://…`): the
    // client upgrades to TLS rather than falling back to plaintext.
    let http_url = format!("http://127.0.0.1:{}", server.port);
    connect_and_apply(options(&http_url, with_ca(&pki)))
        .await
        .expect("TLS options upgrade an http:// URL");

    // (b) Without the CA: refused before dialling (this build trusts no system roots).
    match Client::connect(options(&server.url(), TlsOptions::default())).await {
        Err(e @ ClientError::InvalidEndpoint { .. }) => {
            assert!(e.to_string().contains("--tls-ca"), "{e}");
        }
        other => panic!("expected an invalid endpoint, got {other:?}"),
    }
    // Another CA: the handshake fails, and the error says which bundle and name were checked.
    let stranger = Pki::new("stranger-ca");
    let foreign_ca = TlsOptions {
        ca: Some(clb_client::tls::CaBundle::Pem(
            stranger.ca.clone().into_bytes(),
        )),
        ..TlsOptions::default()
    };
    let e = Client::connect(options(&server.url(), foreign_ca))
        .await
        .expect_err("a server signed by another CA");
    let e = format!("{:?}", anyhow::Error::from(e));
    assert!(
        e.contains("TLS handshake") && e.contains("UnknownIssuer"),
        "{e}"
    );
    // A domain the certificate does not name: a connect error too.
    let wrong = TlsOptions {
        domain: Some("not-the-server".into()),
        ..with_ca(&pki)
    };
    match Client::connect(options(&by_ip, wrong)).await {
        Err(ClientError::Connect { .. }) => {}
        other => panic!("expected a connect error, got {other:?}"),
    }
    // A plaintext client is told that the port serves TLS only.
    let mut plain = ConnectOptions::new(format!("http://127.0.0.1:{}", server.port));
    plain.attempts = 1;
    let e = connect_and_apply(plain)
        .await
        .expect_err("plaintext to a TLS port");
    let e = format!("{:?}", anyhow::Error::from(e));
    assert!(e.contains("serves TLS only"), "{e}");
    server.stop().await;
}

#[tokio::test]
async fn mutual_tls_refuses_a_client_without_a_certificate_and_admits_the_signed_one() {
    init();
    let pki = Pki::new("mutual");
    let server = TlsServer::start(&pki.server_files(true)).await;

    // (c) No client certificate: refused, at connect or (TLS 1.3 reports it after the client's
    // side of the handshake) at the first call.
    let refused = connect_and_apply(options(&server.url(), with_ca(&pki))).await;
    assert!(refused.is_err(), "a client without a certificate got in");
    // A certificate signed by another CA: refused as well.
    let stranger = Pki::new("mutual-stranger");
    let foreign = TlsOptions {
        identity: Some(stranger.client_identity()),
        ..with_ca(&pki)
    };
    connect_and_apply(options(&server.url(), foreign))
        .await
        .expect_err("a certificate from another CA");
    // The client certificate the CA signed: in.
    let signed = TlsOptions {
        identity: Some(pki.client_identity()),
        ..with_ca(&pki)
    };
    connect_and_apply(options(&server.url(), signed))
        .await
        .expect("mutual TLS with the signed client certificate");

    // The watcher's flags build the same options: --tls-ca, --tls-cert, --tls-key.
    let args = clb_watcher::cli::Args::try_parse_from([
        "clb-watcher",
        "--server",
        &server.url(),
        "--tls-ca",
        &pki.path_str("ca.pem"),
        "--tls-cert",
        &pki.path_str("client.pem"),
        "--tls-key",
        &pki.path_str("client.key"),
    ])
    .expect("watcher flags");
    let mut watcher = args.config().expect("watcher config").server;
    watcher.attempts = 1;
    connect_and_apply(watcher)
        .await
        .expect("the watcher's TLS options pass mutual TLS");
    server.stop().await;
}

#[tokio::test]
async fn clbctl_reads_status_over_tls_with_its_tls_ca_flag() {
    init();
    let pki = Pki::new("clbctl");
    let server = TlsServer::start(&pki.server_files(false)).await;
    let run = |args: Vec<String>| async move {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_clbctl"))
            .args(args)
            .env_remove("CLB_SERVER")
            .env_remove("CLB_GATEWAY")
            .env_remove("CLB_TLS_CA")
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .expect("clbctl runs")
    };
    let base = |ca: bool| {
        let mut a = vec![
            "--server".to_owned(),
            server.url(),
            "--connect-attempts".into(),
            "1".into(),
        ];
        if ca {
            a.extend(["--tls-ca".to_owned(), pki.path_str("ca.pem")]);
        }
        a.extend(["status".to_owned(), "-o".into(), "json".into()]);
        a
    };
    let o = run(base(true)).await;
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("clb-state-server"), "{stdout}");
    let o = run(base(false)).await;
    assert!(!o.status.success(), "clbctl trusted an unknown CA");
    server.stop().await;
}

#[tokio::test]
async fn clbctl_load_node_agents_connect_and_resync_over_tls() {
    // What tests/bench/node_agents.sh runs with CLB_BENCH_TLS=1, at N = 3: each simulated agent
    // dials its own TLS connection with the global --tls-ca.
    init();
    let pki = Pki::new("agents");
    let server = TlsServer::start(&pki.server_files(false)).await;
    let o = tokio::process::Command::new(env!("CARGO_BIN_EXE_clbctl"))
        .args([
            "-o",
            "json",
            "--tls-ca",
            &pki.path_str("ca.pem"),
            "load",
            "--state-server",
            &server.url(),
            "--node-agents",
            "3",
            "--idle-phase",
            "0s",
            "--writes-phase",
            "0s",
            "--churn-per-sec",
            "0",
        ])
        .env_remove("CLB_SERVER")
        .env_remove("CLB_GATEWAY")
        .env_remove("CLB_TLS_CA")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let o = tokio::time::timeout(PATIENCE, o)
        .await
        .expect("clbctl load ends")
        .expect("clbctl runs");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON report");
    assert_eq!(report["agents_resynced"], 3, "{report}");
    assert_eq!(report["agents_resynced_more_than_once"], 0, "{report}");
    assert_eq!(report["connect_failures"], 0, "{report}");
    assert!(
        report["state_server"]
            .as_str()
            .is_some_and(|s| s.starts_with("https://")),
        "{report}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_sync_worker_gets_its_work_over_mutual_tls() {
    init();
    let pki = Pki::new("worker");
    let server = TlsServer::start(&pki.server_files(true)).await;
    let nrp = RunningEmulator::start(Emulator::new(EmulatorConfig::default()).unwrap())
        .await
        .unwrap();

    // (d) The worker's TLS: the CA, its client certificate, and the server reached by IP address
    // with the name its certificate carries (--tls-domain); the URL says http:// and is upgraded.
    let mut config = WorkerConfig::new(format!("http://127.0.0.1:{}", server.port), "w-tls");
    config.tls = Some(
        WorkerTls::from_files(
            Some(&pki.path("ca.pem")),
            Some((&pki.path("client.pem"), &pki.path("client.key"))),
            Some("localhost".into()),
        )
        .expect("valid worker TLS files"),
    );
    assert!(config.uses_tls());
    config.backoff = Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(200),
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let worker = tokio::spawn(worker::run(
        config,
        WorkerProc::arm_client(&nrp.base_url()),
        async move {
            let _ = stopped.await;
        },
    ));

    // Desired state through the typed client over mutual TLS.
    let signed = TlsOptions {
        identity: Some(pki.client_identity()),
        ..with_ca(&pki)
    };
    let client = Client::connect(options(&server.url(), signed))
        .await
        .expect("mutual TLS");
    let outcome = client
        .writer("tls-test")
        .apply(vec![
            service_add("svc-tls", &[port(443, Protocol::Tcp)]),
            endpoints_level("svc-tls", vec![endpoint("10.1.0.1", "10.0.0.1")]),
        ])
        .await
        .expect("apply");
    assert!(
        outcome.rejected.is_empty(),
        "{}",
        outcome.describe_rejected()
    );

    // The worker observes NRP (the first unit: it opens the removal gate), creates the service and
    // programs the address; the server then has nothing left to do.
    let started = Instant::now();
    loop {
        let done = {
            let g = server.state.gateway("").unwrap();
            let gw = g.lock();
            gw.tracker().removals_allowed()
                && gw.tracker().pending_diff().is_empty()
                && gw.dispatch().units_in_flight() == 0
        };
        if done {
            break;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "the worker did not converge over TLS"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let map = nrp
        .emulator()
        .dump()
        .gateway("default")
        .expect("the worker created the gateway")
        .address_map();
    assert_eq!(
        map.get(&("10.0.0.1".to_owned(), "10.1.0.1".to_owned()))
            .map(|s| s.iter().cloned().collect::<Vec<_>>()),
        Some(vec!["svc-tls".to_owned()]),
        "{map:?}"
    );

    let _ = stop.send(());
    tokio::time::timeout(PATIENCE, worker)
        .await
        .expect("the worker stops")
        .expect("the worker task")
        .expect("the worker ran");
    server.stop().await;
}
