//! clb state server: owns one DiffTracker (desired vs actual state) and one dispatcher per gateway
//! (both from `clb-core`), hands the difference out to sync workers as leased work units, and serves
//! the Writer, Worker and Admin gRPC APIs. Every proto <-> domain conversion is in [`grpc::convert`].

pub mod auth;
pub mod config;
pub use clb_core::gateway::gate;
pub mod grpc;
pub mod leader;
pub mod metrics;
pub mod pki;
pub mod run;
pub mod state;
pub use clb_telemetry as telemetry;
pub mod self_managed;
pub mod tls;
pub mod tls_listener;
pub mod trace_links;
