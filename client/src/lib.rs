//! clb client: the typed gRPC client of the state server, `clbctl`, the kube watcher and node agent,
//! and the embedded system the demo plays.
//!
//! - [`client`]: [`client::Client`] (connect with retry, optional TLS, Admin reads) and
//!   [`client::Writer`] (single updates, bulk streaming, resync); [`updates`] builds updates.
//! - [`embedded`]: the NRP emulator, state server and sync workers in one process over loopback, and
//!   a synthetic cluster (shared with the end-to-end tests in `tests/`).
//! - [`demo`]: `clbctl demo`, the README's main job: create → rollout → scale down → delete a
//!   service → node drained, with progress and a summary table.
//! - [`status`]: `clbctl status`, the state server's Admin Status as tables, and the convergence check
//!   through Admin.
//! - [`cli`]: the other `clbctl` commands (`state`, `diff`, `apply`, `load`, `completions`), with
//!   `--output table|json`.
//! - [`watcher`]: `clb-watcher`, the kube watcher and (`--node NAME`) the node agent.

pub mod cli;
pub mod client;
pub mod demo;
pub mod embedded;
pub mod status;
pub mod updates;
pub mod watcher;

pub use client::{Client, ClientError, ConnectOptions, Writer};
