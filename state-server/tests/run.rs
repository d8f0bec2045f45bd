//! `clb_state_server::run`: what the `clb-state-server` binary runs, from its flags, as a library —
//! bound to ports 0 (the addresses learned from [`Bound::started`]), serving gRPC and `/readyz`,
//! and stopping on its shutdown future.

use clap::Parser as _;
use clb_proto::v1::StatusRequest;
use clb_proto::v1::admin_client::AdminClient;
use clb_state_server::config::Args;
use clb_state_server::run::{self, Bound, Options};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

fn args(flags: &[&str]) -> Args {
    Args::try_parse_from(
        [
            "clb-state-server",
            "--listen=127.0.0.1:0",
            "--metrics-listen=127.0.0.1:0",
        ]
        .iter()
        .chain(flags),
    )
    .expect("flags")
}

/// The status line of `GET path` on `addr`.
async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out.lines().next().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn the_binary_s_server_binds_ports_0_serves_and_stops_on_shutdown() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let options = Options::from_args(args(&["--gateways=a,b"])).expect("options");
    assert_eq!(options.needs_kubernetes(), None);
    let bound: Bound = run::bind(options, None).await.expect("bind");
    let started = bound.started();
    assert_ne!(started.grpc_addr.port(), 0);
    assert_ne!(started.metrics_addr.port(), 0);
    assert!(bound.state().gateway("b").is_ok());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(bound.serve(async move {
        let _ = stopped.await;
    }));

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", started.grpc_addr))
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let status = AdminClient::new(channel)
        .status(StatusRequest {})
        .await
        .expect("Admin.Status")
        .into_inner();
    assert_eq!(status.gateways.len(), 2, "{status:?}");
    assert!(get(started.metrics_addr, "/readyz").await.contains(" 200 "));

    stop.send(()).expect("running");
    task.await.expect("joined").expect("a clean stop");
}

#[test]
fn invalid_flags_are_refused_before_anything_starts() {
    let e = Options::from_args(args(&["--retry-base=500ms", "--retry-max=100ms"]))
        .expect_err("refused");
    assert!(e.to_string().contains("retry"), "{e:#}");
}

#[tokio::test]
async fn kubernetes_checks_or_leader_election_need_a_kubernetes_client() {
    for (flags, named) in [
        (
            &["--authentication=kubernetes", "--authorization=kubernetes"][..],
            "--authentication/--authorization=kubernetes",
        ),
        (&["--leader-elect"][..], "--leader-elect"),
    ] {
        let options = Options::from_args(args(flags)).expect("options");
        assert!(
            options
                .needs_kubernetes()
                .is_some_and(|n| n.contains(named))
        );
        let e = run::bind(options, None).await.expect_err("no client");
        assert!(
            e.to_string().contains(named) && e.to_string().contains("Kubernetes client"),
            "{e:#}"
        );
    }
}
