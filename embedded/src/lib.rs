//! The whole system in one process, for the demo, the load generator and the end-to-end tests:
//! [`harness`] starts the NRP emulator, the state server and sync workers over loopback (every server
//! on port 0); [`cluster`] generates a synthetic cluster and the changes a watcher would send for it.
//!
//! The harness is a driver for demos and tests: it panics when a part of the system cannot start.

pub mod cluster;
pub mod compare;
pub mod harness;
pub mod procs;

pub use cluster::{Cluster, ClusterSpec, Expected, Pod, PodWriters, SplitBatch};
pub use harness::{
    GATEWAY, Harness, Options, PATIENCE, ServerProc, StalledWorker, WATCHER, WorkerProc,
    compare_gateway, create_gateway,
};

use clb_client::client::{ApplyOutcome, ResyncOutcome, Writer, scope};
use clb_proto::v1::{ClusterTopology, ResyncScope, Update};

/// Writer calls for tests and scripted runs: they panic when the call fails or any item is rejected.
#[allow(async_fn_in_trait)]
pub trait WriterExt {
    /// Resyncs the whole cluster-wide scope with `view`.
    async fn resync_ok(&mut self, view: Vec<Update>) -> ResyncOutcome;
    /// Resyncs `scope` with `view`, declaring `topology` in the header.
    async fn resync_scope_ok(
        &mut self,
        scope: ResyncScope,
        topology: Option<ClusterTopology>,
        view: Vec<Update>,
    ) -> ResyncOutcome;
    /// Applies `updates` (in batches).
    async fn apply_ok(&mut self, updates: Vec<Update>) -> ApplyOutcome;
    /// Applies each batch in order.
    async fn apply_all(&mut self, batches: Vec<Vec<Update>>);
}

impl WriterExt for Writer {
    async fn resync_ok(&mut self, view: Vec<Update>) -> ResyncOutcome {
        self.resync_scope_ok(scope::all(), None, view).await
    }

    async fn resync_scope_ok(
        &mut self,
        scope: ResyncScope,
        topology: Option<ClusterTopology>,
        view: Vec<Update>,
    ) -> ResyncOutcome {
        let r = self
            .resync_with_topology(scope, topology, view)
            .await
            .expect("resync call");
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
