//! End-to-end test support for clb. The in-process system (NRP emulator, state server, sync workers
//! over loopback) and the synthetic cluster live in `clb_client::embedded`, shared with `clbctl demo`;
//! this crate adds what only tests need: [`nrp::Detached`] (an NRP client that finishes a call its
//! caller dropped, as ARM does) and [`WriterExt`] (writer calls that fail the test on any rejection).
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

pub mod nrp;

pub use clb_client::client::{ApplyOutcome, ResyncOutcome, Writer, scope};
pub use clb_client::embedded::{
    Cluster, ClusterSpec, Expected, GATEWAY, Harness, Options, PATIENCE, Pod, ServerProc,
    StalledWorker, WATCHER, WorkerProc,
};
use clb_proto::v1::Update;

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

/// Writer calls for tests: they panic when the call fails or any item is rejected.
#[allow(async_fn_in_trait)]
pub trait WriterExt {
    /// Resyncs the whole cluster-wide scope with `view`.
    async fn resync_ok(&mut self, view: Vec<Update>) -> ResyncOutcome;
    /// Applies `updates` (in batches).
    async fn apply_ok(&mut self, updates: Vec<Update>) -> ApplyOutcome;
    /// Applies each batch in order.
    async fn apply_all(&mut self, batches: Vec<Vec<Update>>);
}

impl WriterExt for Writer {
    async fn resync_ok(&mut self, view: Vec<Update>) -> ResyncOutcome {
        let r = self.resync(scope::all(), view).await.expect("resync call");
        assert!(
            r.rejected.is_empty(),
            "resync items rejected:\n{}",
            r.describe_rejected()
        );
        r
    }

    async fn apply_ok(&mut self, updates: Vec<Update>) -> ApplyOutcome {
        let r = self.apply(updates).await.expect("apply call");
        assert!(
            r.rejected.is_empty(),
            "items rejected:\n{}",
            r.describe_rejected()
        );
        r
    }

    async fn apply_all(&mut self, batches: Vec<Vec<Update>>) {
        for b in batches {
            self.apply_ok(b).await;
        }
    }
}
