//! clb client: `clbctl` and the embedded demo.
//!
//! - [`demo`]: `clbctl demo`, the whole system (NRP emulator, state server, two sync workers) in
//!   one process over loopback, driven by a synthetic cluster through create → rollout → scale down
//!   → delete a service → node drained, with progress and a summary table.
//!
//! The synthetic cluster and the in-process harness the demo plays come from `clb-tests`
//! (`tests/src/`), shared with the end-to-end tests.
//! - [`status`]: `clbctl status`, the state server's Admin Status as tables.
//!
//! The typed client, the kube watcher and the node agent arrive with the client issue.

pub mod demo;
pub mod status;
