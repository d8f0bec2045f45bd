//! What the executors of locations, services and observes share: the context of one unit (the gate
//! every NRP call passes: lease, shutdown, per-gateway concurrency), its errors, and the reports
//! they become. The executors depend on this module, and `unit` (which dispatches to them) on
//! them and on this: no module of the worker imports one that imports it back.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use clb_proto::v1::{self, Report, report};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use super::config::WorkerConfig;
use super::errors::{self, Handling};
use super::limiter::{AimdLimiter, GatewayLimiters};
use super::targets::{GatewayTarget, NrpTargets};
use crate::metrics::WorkerMetrics;
use clb_nrp::{CallOptions, Nrp, NrpError};

/// Why a step of a unit did not happen or failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum UnitError {
    /// The lease ended before the step (no call was sent), or during its call.
    LeaseExpired,
    /// The worker is shutting down or lost its stream: no new NRP call may start.
    Cancelled,
    /// Not started because another part of the same unit failed in a retryable way.
    Aborted,
    /// NRP answered with an error.
    Nrp(NrpError),
    /// The unit itself is malformed (a server bug): retrying will not help.
    Invalid {
        /// Machine-readable code.
        code: &'static str,
        /// What is wrong.
        message: String,
    },
}

impl From<NrpError> for UnitError {
    fn from(e: NrpError) -> Self {
        match e {
            NrpError::DeadlineExceeded => UnitError::LeaseExpired,
            e => UnitError::Nrp(e),
        }
    }
}

impl UnitError {
    /// The code reported for it: NRP's ARM code, or the worker's own.
    pub(crate) fn code(&self) -> &str {
        match self {
            UnitError::LeaseExpired => "LeaseExpired",
            UnitError::Cancelled => "WorkerCancelled",
            UnitError::Aborted => "Aborted",
            UnitError::Nrp(e) => e.code(),
            UnitError::Invalid { code, .. } => code,
        }
    }

    /// What the server should do with the work that failed with it (see [`errors`]).
    pub(crate) fn handling(&self) -> Handling {
        match self {
            UnitError::Nrp(e) => errors::classify(e),
            other => errors::row_of(other.code()).map_or(Handling::Park, |r| r.handling),
        }
    }

    /// Whether the work may succeed when sent again (after a read-back or not).
    pub(crate) fn is_retryable(&self) -> bool {
        self.handling() != Handling::Park
    }

    /// Whether the failed call may have been applied all the same (no clear answer).
    pub(crate) fn outcome_unknown(&self) -> bool {
        match self {
            UnitError::LeaseExpired => true,
            UnitError::Nrp(e) => errors::outcome_unknown(e),
            _ => false,
        }
    }

    /// Whether this is NRP's `NotFound`.
    pub(crate) fn is_not_found(&self) -> bool {
        matches!(self, UnitError::Nrp(NrpError::NotFound { .. }))
    }

    fn message(&self) -> String {
        match self {
            UnitError::LeaseExpired => "the lease ended before the work was done".into(),
            UnitError::Cancelled => "the worker is shutting down or lost its stream".into(),
            UnitError::Aborted => "not started after another part of the unit failed".into(),
            UnitError::Nrp(e) => e.to_string(),
            UnitError::Invalid { message, .. } => message.clone(),
        }
    }

    /// The report outcome for this error.
    pub(crate) fn outcome(&self) -> report::Outcome {
        let retry_after_ms = match self {
            UnitError::Nrp(e) => e
                .retry_after()
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            _ => 0,
        };
        let (code, message) = (self.code().to_string(), self.message());
        match self.handling() {
            Handling::Retry => report::Outcome::Retryable(v1::Retryable {
                retry_after_ms,
                code,
                message,
            }),
            Handling::Repair => report::Outcome::Repair(v1::Repair {
                retry_after_ms,
                code,
                message,
                refused: matches!(self, UnitError::Nrp(e) if super::errors::unknown_refusal(e)),
            }),
            Handling::Park => report::Outcome::Terminal(v1::Terminal {
                code,
                message,
                changes: Vec::new(),
            }),
        }
    }
}

/// The error that decides the outcome of a unit whose parts failed: one that asks for a read-back
/// if any (the read-back serves them all), else a retryable one (so that retryable parts are not
/// parked with a terminal one); `Aborted` only when there is nothing else.
pub(crate) fn decisive(errors: impl IntoIterator<Item = UnitError>) -> Option<UnitError> {
    errors.into_iter().min_by_key(|e| match (e, e.handling()) {
        (UnitError::Aborted, _) => 3,
        (_, Handling::Repair) => 0,
        (_, Handling::Retry) => 1,
        (_, Handling::Park) => 2,
    })
}

/// The regions of the gateways known to exist, learnt once per gateway per session.
#[derive(Debug, Default)]
pub(crate) struct GatewayCache {
    cells: Mutex<HashMap<String, Arc<OnceCell<String>>>>,
}

impl GatewayCache {
    fn cell(&self, gateway: &str) -> Arc<OnceCell<String>> {
        let mut map = self.cells.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(map.entry(gateway.to_string()).or_default())
    }

    /// Forgets what is known of `gateway` (NRP said something of it is missing): the next service
    /// saga reads it again, and creates it when it is gone.
    pub(crate) fn forget(&self, gateway: &str) {
        let mut map = self.cells.lock().unwrap_or_else(PoisonError::into_inner);
        map.remove(gateway);
    }
}

/// What the units of one session share.
pub(crate) struct Env {
    /// The NRP client of each gateway.
    pub targets: NrpTargets,
    pub config: Arc<WorkerConfig>,
    pub limiters: Arc<GatewayLimiters>,
    pub gateways: GatewayCache,
    /// Cancelled when the worker shuts down or the session's stream breaks.
    pub cancel: CancellationToken,
    /// The worker's metrics (the NRP calls themselves are counted by the clients).
    pub metrics: Arc<WorkerMetrics>,
}

/// The context of one unit: every NRP call goes through [`UnitCtx::read`] or [`UnitCtx::mutate`].
pub(crate) struct UnitCtx<'a> {
    pub env: &'a Env,
    pub gateway: &'a str,
    pub deadline: Instant,
    target: &'a GatewayTarget,
    limiter: Arc<AimdLimiter>,
    abort: AtomicBool,
    /// The unit's own bound on its mutating calls at once (a service unit's `side_by_side`), if any.
    side_by_side: std::sync::OnceLock<tokio::sync::Semaphore>,
}

impl<'a> UnitCtx<'a> {
    /// The context of a unit of `gateway` leased until `deadline`; an error when the worker has no
    /// NRP client for `gateway` (not in its gateways file).
    pub(crate) fn new(
        env: &'a Env,
        gateway: &'a str,
        deadline: Instant,
    ) -> Result<Self, UnitError> {
        let Some(target) = env.targets.get(gateway) else {
            let known = env.targets.gateways().join(", ");
            return Err(UnitError::Invalid {
                code: "InvalidWorkUnit",
                message: format!(
                    "gateway {:?} is not in this worker's gateways file (it has: {known})",
                    gateway.chars().take(100).collect::<String>()
                ),
            });
        };
        Ok(Self {
            env,
            gateway,
            deadline,
            target,
            limiter: env.limiters.get(gateway),
            abort: AtomicBool::new(false),
            side_by_side: std::sync::OnceLock::new(),
        })
    }

    /// The NRP client of the unit's gateway.
    pub(crate) fn nrp(&self) -> &dyn Nrp {
        self.target.nrp.as_ref()
    }

    /// The ARM resource name of the unit's Service Gateway (what NRP calls take).
    pub(crate) fn resource(&self) -> &str {
        self.target.resource_name.as_deref().unwrap_or(self.gateway)
    }

    /// The resource group where the unit's gateway's egresses may bring their NAT gateway, if
    /// bringing one is on for it.
    pub(crate) fn nat_gateway_resource_group(&self) -> Option<String> {
        self.target
            .nat_gateway_resource_group
            .clone()
            .or_else(|| self.env.config.nat_gateway_resource_group.clone())
            .filter(|rg| !rg.trim().is_empty())
    }

    /// The region of a Service Gateway this worker creates for the unit's gateway.
    fn region(&self) -> String {
        self.target
            .region
            .clone()
            .unwrap_or_else(|| self.env.config.gateway_region.clone())
    }

    /// Bounds the unit's mutating calls at once to `calls` (at least 1), besides the gateway's
    /// limiter: what the server counted the unit for. Set once, before the unit's first call.
    pub(crate) fn bound_calls(&self, calls: usize) {
        let _ = self
            .side_by_side
            .set(tokio::sync::Semaphore::new(calls.max(1)));
    }

    /// Stops the parts of the unit that have not started their next call yet.
    pub(crate) fn abort(&self) {
        self.abort.store(true, Ordering::SeqCst);
    }

    /// Checks that a call may start now, and returns its options.
    pub(crate) fn gate(&self) -> Result<CallOptions, UnitError> {
        if self.env.cancel.is_cancelled() {
            return Err(UnitError::Cancelled);
        }
        if self.abort.load(Ordering::SeqCst) {
            return Err(UnitError::Aborted);
        }
        let opts = CallOptions::with_deadline(self.deadline);
        if opts.expired() {
            return Err(UnitError::LeaseExpired);
        }
        Ok(opts)
    }

    /// Notes what an error says of the gateway: a `NotFound` may be the gateway's own.
    fn learn(&self, e: &NrpError) {
        if matches!(e, NrpError::NotFound { .. }) {
            self.env.gateways.forget(self.gateway);
        }
    }

    /// A read (no concurrency permit).
    pub(crate) async fn read<T, F, Fut>(&self, call: F) -> Result<T, UnitError>
    where
        F: FnOnce(CallOptions) -> Fut,
        Fut: Future<Output = Result<T, NrpError>>,
    {
        let opts = self.gate()?;
        Ok(call(opts).await?)
    }

    /// A mutating call: waits for a permit of the unit's own bound if it has one, then for one of
    /// the gateway's limiter (until the lease ends), then calls, and feeds the outcome back to the
    /// limiter.
    pub(crate) async fn mutate<T, F, Fut>(&self, call: F) -> Result<T, UnitError>
    where
        F: FnOnce(CallOptions) -> Fut,
        Fut: Future<Output = Result<T, NrpError>>,
    {
        self.gate()?;
        let deadline = tokio::time::Instant::from_std(self.deadline);
        let _own = match self.side_by_side.get() {
            Some(bound) => tokio::select! {
                () = self.env.cancel.cancelled() => return Err(UnitError::Cancelled),
                () = tokio::time::sleep_until(deadline) => return Err(UnitError::LeaseExpired),
                p = bound.acquire() => Some(p.map_err(|_| UnitError::Cancelled)?),
            },
            None => None,
        };
        let permit = tokio::select! {
            () = self.env.cancel.cancelled() => return Err(UnitError::Cancelled),
            p = self.limiter.acquire(deadline) => p.map_err(|_| UnitError::LeaseExpired)?,
        };
        let opts = self.gate()?;
        let result = call(opts).await;
        match &result {
            Ok(_) => permit.success(),
            Err(e) if e.is_throttling() => permit.throttled(),
            Err(e) => {
                self.learn(e);
                drop(permit);
            }
        }
        Ok(result?)
    }

    /// Ensures the unit's service gateway exists (GET, PUT when missing), once per gateway per
    /// session, and returns its Azure region.
    pub(crate) async fn ensure_gateway(&self) -> Result<String, UnitError> {
        let cell = self.env.gateways.cell(self.gateway);
        let region = cell
            .get_or_try_init(|| async {
                let cfg = &self.env.config;
                match self
                    .read(|o| self.nrp().get_service_gateway(self.resource(), o))
                    .await
                {
                    Ok(gw) => Ok(gw.location.unwrap_or_else(|| self.region())),
                    Err(e) if e.is_not_found() && !cfg.create_missing_gateway => {
                        tracing::warn!(
                            gateway = self.gateway,
                            "the service gateway does not exist and creating it is off"
                        );
                        Err(e)
                    }
                    Err(e) if e.is_not_found() => {
                        tracing::info!(
                            gateway = self.gateway,
                            "creating the missing service gateway"
                        );
                        let body = clb_nrp::wire::ServiceGateway {
                            location: Some(self.region()),
                            sku: Some(clb_nrp::wire::Sku::standard()),
                            properties: clb_nrp::wire::ServiceGatewayProperties {
                                virtual_network: self
                                    .target
                                    .virtual_network_id
                                    .clone()
                                    .or_else(|| cfg.virtual_network_id.clone())
                                    .map(clb_nrp::wire::SubResource::new),
                                ..Default::default()
                            },
                            ..Default::default()
                        };
                        let gw = self
                            .mutate(|o| self.nrp().put_service_gateway(self.resource(), &body, o))
                            .await?;
                        Ok(gw.location.unwrap_or_else(|| self.region()))
                    }
                    Err(e) => Err(e),
                }
            })
            .await?;
        Ok(region.clone())
    }
}

/// A report of `work_id` with `outcome`.
pub(crate) fn report(work_id: u64, applied_indices: Vec<u32>, outcome: report::Outcome) -> Report {
    Report {
        work_id,
        applied_indices,
        frontends: Vec::new(),
        service_progress: Vec::new(),
        remaining_subscription_writes: None,
        refused_addresses: Vec::new(),
        outcome: Some(outcome),
    }
}

/// The report of a unit whose changes `applied` went through and whose other changes failed with
/// `errors` (none: everything went through).
pub(crate) fn partial_report(work_id: u64, applied: Vec<u32>, errors: Vec<UnitError>) -> Report {
    match decisive(errors) {
        None => report(
            work_id,
            Vec::new(),
            report::Outcome::Applied(v1::Applied {}),
        ),
        Some(e) => report(work_id, applied, e.outcome()),
    }
}
