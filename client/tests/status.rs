//! `clbctl status` against a state server running in-process.

use std::time::Duration;

use clb_client::status;
use clb_tests::{Harness, Options, WriterExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_renders_gateways_workers_and_writers() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    h.watcher().await.resync_ok(Vec::new()).await;
    let mut text = String::new();
    for _ in 0..500 {
        let s = status::fetch(&h.url()).await.expect("status");
        text = status::render(&s);
        if s.workers.len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(text.contains("default"), "{text}");
    assert!(text.contains("w0"), "{text}");
    assert!(text.contains("watcher"), "{text}");
    h.shutdown().await;
}
