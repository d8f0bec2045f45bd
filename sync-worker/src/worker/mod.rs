//! The sync worker: receives leased work units from the state server over one bidirectional gRPC
//! stream, executes them against NRP, and reports each outcome on the same stream
//! (`docs/contract.md` §5, `docs/protocol.md` "Worker").
//!
//! ```no_run
//! # async fn demo(nrp: std::sync::Arc<dyn clb_nrp::Nrp>) {
//! use clb_sync_worker::worker::{WorkerConfig, run};
//! let config = WorkerConfig::new("http://127.0.0.1:50051", "worker-1");
//! run(config, nrp, async { let _ = tokio::signal::ctrl_c().await; }).await.unwrap();
//! # }
//! ```
//!
//! - **Session.** Connect, send `Hello {worker_id, capacity, gateways}`, wait for `Welcome`, then run
//!   up to `capacity` units concurrently and send one `Report` per unit (several `Observed` parts for a
//!   large observe unit). A broken stream or connection ends the session: in-flight units stop at once
//!   (the server has released their leases), and the worker reconnects with capped exponential backoff
//!   and jitter.
//! - **Leases.** A unit's lease ends at the earlier of `lease_deadline_unix_ms` and receipt +
//!   `lease_duration_ms` (monotonic clock). Every NRP call carries it as its deadline, and no call
//!   starts after it; a unit that runs out of lease is reported `Repair` with code `LeaseExpired` (a
//!   call cut off may or may not have landed: the server reads NRP back before it retries).
//! - **Work.** Location changes become as few `updateAddressLocations` calls as the [`Limits`] allow;
//!   service changes run as sagas of idempotent steps; observe units read the gateway back. A unit that
//!   went through only in part reports the `applied_indices` of what NRP accepted, and a service
//!   saga that stopped part-way the step it reached (`service_progress`).
//! - **Errors.** Every failure is retried, repaired (the server reads NRP back before it retries)
//!   or parked, by one table: [`ERRORS`] (docs/errors.md).
//! - **Concurrency.** Mutating calls per gateway are bounded by an AIMD limit (halved on throttling,
//!   +1 after a run of successes, within `[1, max]`); waiting for it respects the lease.
//! - **Shutdown.** When `shutdown` completes, no new unit is taken and no new NRP call starts; in-flight
//!   calls may finish and their units report, within [`WorkerConfig::shutdown_grace`]; then the stream
//!   is closed.

mod byo;
mod config;
mod ctx;
mod errors;
mod inbound;
mod limiter;
mod locations;
mod observe;
mod registrar;
mod services;
mod session;
mod split;
mod targets;
mod unit;

use std::future::Future;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub use config::{Backoff, Limits, WorkerConfig, WorkerTls};
pub use errors::{ERRORS, ErrorRow, Handling, classify as classify_error};
pub use inbound::{
    DEFAULT_IDLE_TIMEOUT_MINUTES, IDLE_TIMEOUT_MINUTES, PUBLIC_IP_SKU, RuleSettings,
    observed_settings,
};
pub use limiter::{AcquireError, AimdLimiter, GatewayLimiters, Permit};
pub use locations::{
    Piece, plan as plan_location_calls, refusal_split_bound, request as location_call_request,
};
pub use observe::{frontends_of, snapshot_parts};
pub use services::{
    BACKEND_POOL_NAME, FRONTEND_NAME, NAT_GATEWAY_SKU, load_balancer, load_balancer_name,
    nat_gateway_name, public_ip_name, public_ip_v6_name,
};
pub use targets::{GatewayTarget, NrpTargets};
pub use unit::lease_deadline;

use crate::metrics::{MeteredNrp, WorkerMetrics};
use clb_nrp::Nrp;

/// Why [`run`] could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkerError {
    /// The configuration cannot work (e.g. a malformed server URL or a capacity of 0).
    #[error("invalid worker configuration: {0}")]
    InvalidConfig(String),
}

/// Runs the worker until `shutdown` completes: connects to the state server at `config.server`,
/// executes the units it receives against `nrp`, reconnects whenever the stream or the connection
/// breaks, and ends gracefully (see the module documentation). Returns an error only for an unusable
/// configuration; connection problems are retried for as long as the worker runs.
pub async fn run(
    config: WorkerConfig,
    nrp: Arc<dyn Nrp>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WorkerError> {
    run_with_metrics(config, nrp, Arc::new(WorkerMetrics::new()), shutdown).await
}

/// [`run`], recording in `metrics`: every NRP call (through [`MeteredNrp`]), the adaptive limit of
/// each gateway, and whether a session with the state server is established (`/readyz`).
pub async fn run_with_metrics(
    config: WorkerConfig,
    nrp: Arc<dyn Nrp>,
    metrics: Arc<WorkerMetrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WorkerError> {
    run_targets(config, NrpTargets::single(nrp), metrics, shutdown).await
}

/// [`run_with_metrics`] with one NRP client per gateway (a gateways file): the calls on each
/// gateway go to its own client, under its ARM name.
pub async fn run_targets(
    config: WorkerConfig,
    targets: NrpTargets,
    metrics: Arc<WorkerMetrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WorkerError> {
    let targets = targets
        .map_clients(|nrp| Arc::new(MeteredNrp::new(nrp, Arc::clone(&metrics))) as Arc<dyn Nrp>);
    if config.capacity == 0 {
        return Err(WorkerError::InvalidConfig(
            "capacity must be at least 1".into(),
        ));
    }
    if config.worker_id.trim().is_empty() {
        return Err(WorkerError::InvalidConfig("worker id is empty".into()));
    }
    let endpoint = session::endpoint(&config)?;
    let stop = CancellationToken::new();
    let main = session::supervise(Arc::new(config), endpoint, targets, metrics, stop.clone());
    tokio::pin!(main);
    tokio::pin!(shutdown);
    tokio::select! {
        () = &mut main => return Ok(()),
        () = &mut shutdown => {
            tracing::info!("shutdown requested");
            stop.cancel();
        }
    }
    main.await;
    Ok(())
}
