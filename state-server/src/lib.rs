//! clb state server: owns the DiffTracker (desired vs actual state) per gateway, hands the difference
//! out to sync workers as leased work units, and serves the Writer, Worker and Admin gRPC APIs.

pub mod config;
pub mod difftracker;
pub mod dispatch;
pub mod grpc;
pub mod metrics;
pub mod state;
pub use clb_telemetry as telemetry;
pub mod tls;
