//! Plays the demo in-process with the quick settings: every phase must converge.

use clb_client::demo::{self, DemoConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_quick_demo_converges_after_every_phase() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut config = DemoConfig::quick();
    config.plain = true;
    let summary = demo::run(&config).await;
    assert_eq!(summary.phases.len(), 5, "{summary:#?}");
    assert!(summary.ok(), "{}", summary.failure().unwrap_or_default());
}
