//! The whole system in one process, for the demo, the load generator and the end-to-end tests:
//! [`harness`] starts the NRP emulator, the state server and sync workers over loopback (every server
//! on port 0); [`cluster`] generates a synthetic cluster and the changes a watcher would send for it.
//!
//! The harness is a driver for demos and tests: it panics when a part of the system cannot start.

pub mod cluster;
pub mod harness;

pub use cluster::{Cluster, ClusterSpec, Expected, Pod};
pub use harness::{
    GATEWAY, Harness, Options, PATIENCE, ServerProc, StalledWorker, WATCHER, WorkerProc,
};
