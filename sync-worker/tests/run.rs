//! `clb_sync_worker::run`: what the `clb-sync-worker` binary runs, from its flags, as a library —
//! against a real state server (`clb_state_server::run`) and the NRP emulator over loopback: it
//! connects (ready on `/readyz` at the metrics address learned from [`Bound::metrics_addr`]) and
//! stops on its shutdown future.

use std::time::{Duration, Instant};

use clap::Parser as _;
use clb_nrp_emulator::{Emulator, EmulatorConfig, RunningEmulator};
use clb_sync_worker::cli::Args;
use clb_sync_worker::run::{self, Bound};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

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
async fn the_binary_s_worker_connects_serves_its_metrics_and_stops_on_shutdown() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let nrp = RunningEmulator::start(Emulator::new(EmulatorConfig::default()).unwrap())
        .await
        .unwrap();
    let server_args = clb_state_server::config::Args::try_parse_from([
        "clb-state-server",
        "--listen=127.0.0.1:0",
        "--metrics-listen=127.0.0.1:0",
    ])
    .unwrap();
    let server = clb_state_server::run::bind(
        clb_state_server::run::Options::from_args(server_args).unwrap(),
        None,
    )
    .await
    .unwrap();
    let grpc = server.started().grpc_addr;
    let (server_stop, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(server.serve(async move {
        let _ = server_stopped.await;
    }));

    let args = Args::try_parse_from([
        "clb-sync-worker".to_owned(),
        format!("--server=http://{grpc}"),
        format!("--nrp-endpoint={}", nrp.base_url()),
        "--subscription=sub".to_owned(),
        "--resource-group=rg".to_owned(),
        "--credential=none".to_owned(),
        "--worker-id=w-run".to_owned(),
        "--metrics-listen=127.0.0.1:0".to_owned(),
    ])
    .unwrap();
    let bound: Bound = run::bind(args).await.expect("bind");
    let metrics = bound.metrics_addr().expect("--metrics-listen was given");
    assert_ne!(metrics.port(), 0);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(bound.serve(async move {
        let _ = stopped.await;
    }));

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let line = get(metrics, "/readyz").await;
        if line.contains(" 200 ") {
            break;
        }
        assert!(Instant::now() < deadline, "never ready: {line}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).expect("running");
    worker.await.expect("joined").expect("a clean stop");
    server_stop.send(()).expect("running");
    server.await.expect("joined").expect("a clean stop");
}

#[tokio::test]
async fn a_bad_flag_fails_before_anything_starts() {
    let args = Args::try_parse_from([
        "clb-sync-worker",
        "--nrp-api-version=1999-01-01",
        "--subscription=sub",
        "--resource-group=rg",
        "--credential=none",
    ])
    .unwrap();
    let e = run::run(args, std::future::pending())
        .await
        .expect_err("refused");
    assert!(format!("{e:#}").contains("--nrp-api-version"), "{e:#}");
}
