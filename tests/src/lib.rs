//! End-to-end test support for clb. The in-process system (NRP emulator, state server, sync workers
//! over loopback) and the synthetic cluster live in `clb-embedded`, shared with `clbctl demo`; this
//! crate adds what only tests need: [`nrp::Detached`] (an NRP client that finishes a call its caller
//! dropped, as ARM does) and [`fake_kube`] (a scripted Kubernetes API server over loopback). No crate
//! depends on this one: the tests that need it live in `tests/tests/`.
//!
//! ```no_run
//! # async fn demo() {
//! use std::time::Duration;
//! use clb_tests::{Cluster, ClusterSpec, Harness, Options, WriterExt};
//! let h = Harness::start(Options::e2e()).await;
//! let cluster = Cluster::generate(ClusterSpec::small(20, 10, 10));
//! h.watcher().await.resync_ok(cluster.full_view()).await;
//! h.converge(&cluster.expected(), Duration::from_secs(60)).await;
//! # }
//! ```
//!
//! The end-to-end tests are in `tests/tests/e2e.rs`; the rollout benchmark in
//! `tests/benches/rollout.rs`.

pub mod auth_setup;
pub mod bench;
pub mod crd_schema;
pub mod deploy;
pub mod ha;
pub mod kube_objects;
pub mod metrics_check;
pub mod nrp;
pub mod rbac;
pub mod recorder;
pub mod refusal;
pub mod regions;
pub mod rollout;
pub mod shipped;

pub mod fake_kube;

pub use clb_client::client::{ApplyOutcome, ResyncOutcome, Writer, scope};
pub use clb_embedded::{
    Cluster, ClusterSpec, Expected, GATEWAY, Harness, Options, PATIENCE, Pod, PodWriters,
    ServerProc, SplitBatch, StalledWorker, WATCHER, WorkerProc, WriterExt,
};

/// Installs a `tracing` subscriber writing to the test output, filtered by `RUST_LOG` (default:
/// warnings). Calling it more than once is harmless.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}
