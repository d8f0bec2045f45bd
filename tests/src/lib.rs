//! End-to-end test support for clb: the NRP emulator, the state server and sync workers started
//! in-process over loopback (every server on port 0), a synthetic cluster generator, a writer client
//! that speaks the Writer gRPC API as the kube watcher does, and a convergence check that compares the
//! emulator's state with the readiness-filtered desired state.
//!
//! ```no_run
//! # async fn demo() {
//! use std::time::Duration;
//! use clb_tests::{Cluster, ClusterSpec, Harness, Options};
//! let h = Harness::start(Options::e2e()).await;
//! let cluster = Cluster::generate(ClusterSpec::small(20, 10, 10));
//! h.watcher().await.resync(cluster.full_view()).await;
//! h.converge(&cluster.expected(), Duration::from_secs(60)).await;
//! # }
//! ```
//!
//! The end-to-end tests are in `tests/tests/e2e.rs`; the rollout benchmark in
//! `tests/benches/rollout.rs`.

pub mod cluster;
pub mod harness;
pub mod nrp;
pub mod writer;

pub use cluster::{Cluster, ClusterSpec, Expected, Pod};
pub use harness::{GATEWAY, Harness, Options, PATIENCE, ServerProc, StalledWorker, WorkerProc};
pub use writer::{WATCHER, Watcher};

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
