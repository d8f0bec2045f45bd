//! Plays the demo in-process with the quick settings, on the embedded system and against an
//! "external" state server (one started here, reached only through its URL): every phase must
//! converge.

use clb_client::client::{Client, ConnectOptions};
use clb_embedded::{Harness, Options};
use clbctl::demo::{self, DemoConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_quick_demo_converges_after_every_phase() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut config = DemoConfig::quick();
    config.plain = true;
    let summary = demo::run(&config).await;
    assert_eq!(summary.phases.len(), 5, "{summary:#?}");
    assert!(summary.ok(), "{}", summary.failure().unwrap_or_default());
    assert!(!summary.external);
    assert!(summary.phases.iter().all(|p| p.stats.is_some()));
    // The summary and its legend fit a 100-column terminal.
    let printed = format!("{}\n{}", summary.table(), demo::LEGEND);
    for line in printed.lines() {
        assert!(
            line.chars().count() <= 100,
            "{} columns: {line}",
            line.chars().count()
        );
    }
    assert!(
        printed.contains("UAL calls  updateAddressLocations"),
        "{printed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_quick_demo_converges_on_an_external_state_server() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    let client = Client::connect(ConnectOptions::new(h.url()))
        .await
        .expect("connect");
    let mut config = DemoConfig::quick();
    config.plain = true;
    config.external = Some(client);
    let summary = demo::run(&config).await;
    assert_eq!(summary.phases.len(), 5, "{summary:#?}");
    assert!(summary.ok(), "{}", summary.failure().unwrap_or_default());
    assert!(summary.external);
    assert!(summary.phases.iter().all(|p| p.stats.is_none()));
    // The Admin-based check agrees with the emulator: NRP holds what the last phase wants.
    let last = summary.phases.last().expect("a phase");
    assert_eq!(
        h.gateway_status().await.actual_addresses,
        last.desired_addresses
    );
    h.shutdown().await;
}
