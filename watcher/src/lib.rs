//! The kube watcher and the node agent: Kubernetes → desired state of the clb state server.
//!
//! One process, two modes (binary `clb-watcher`, docs/watcher.md):
//! - **cluster** (writer `watcher`): watches Services, EndpointSlices, Nodes and (unless pods are
//!   left to node agents) egress-labelled Pods; writes inbound identities, their endpoints and pods;
//!   writes back `status.loadBalancer.ingress` and owns a finalizer on the Services it programs;
//! - **node agent** (`--node NAME`, writer `node-agent/NAME`): watches only the egress-labelled
//!   Pods on that node and the Node itself; writes those pods.
//!
//! This file is the crate root only. Each concern is a module that owns its state and talks to
//! the others through handles, messages and `watch` channels that [`run`] (`run.rs`) hands out:
//! - `lane.rs`: one lane per gateway written to — its translator ([`translate::Translator`]), the
//!   deltas queued for its sender and what the server acknowledged, behind a lock only it takes;
//! - `kube_side.rs`: the watch streams, decoded and fed to the lanes; messages to the write-back
//!   (bounded inbox); node moves (`moves.rs`) and the PoolService side (`pools.rs`) inside it;
//! - `sender.rs`: per lane, the resyncs (built from a snapshot, outside the lane's lock) and the
//!   coalesced `Apply` batches, with reconnects and the writer's session stream;
//! - `writeback.rs` (cluster mode): finalizer, ingress, condition and Events, following the
//!   server's pushed service states;
//! - `gate.rs`: the pod readiness gate.
//!
//! Every task is supervised (`supervise.rs`): one that returns or panics stops the watcher with a
//! [`WatcherError`] naming it.

pub mod backoff;
pub mod cli;
pub mod config;
pub mod decode;
pub mod families;
#[cfg(any(test, feature = "test-support"))]
pub mod faults;
pub mod ingress;
pub mod metrics;
pub mod poolservice;
pub mod routing;
pub mod settings;
pub mod supervise;
pub mod translate;
pub mod webhook;

mod gate;
mod kube_side;
mod lane;
mod moves;
mod pools;
mod relist;
mod run;
mod sender;
mod writeback;

pub use clb_gateways::Gateways;
pub use config::{Mode, WATCHER_WRITER, WatcherConfig, node_agent_writer};
pub use metrics::WatcherMetrics;
pub use run::{KubeClients, run};
pub use supervise::WatcherError;
pub use translate::{
    DEFAULT_CLASS, EGRESS_LABEL, FINALIZER, NAT_GATEWAY_ANNOTATION, SERVICE_NAME_LABEL,
};
pub use writeback::{CONDITION_TYPE, REPORTING_CONTROLLER};
