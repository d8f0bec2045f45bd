//! Executing one work unit: its lease, the gate every NRP call passes (lease, shutdown, per-gateway
//! concurrency), the mapping of failures to report outcomes, and the dispatch to the location, service
//! and observe executors.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use clb_proto::v1::{self, Report, WorkUnit, report, work_unit};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::config::WorkerConfig;
use super::limiter::{AimdLimiter, GatewayLimiters};
use super::{locations, observe, services};
use clb_nrp::{CallOptions, Nrp, NrpError};

/// When the lease of `unit` ends: the earlier of `lease_deadline_unix_ms` (server clock, converted to
/// the local monotonic clock now) and `received + lease_duration_ms` (local monotonic clock). A
/// missing bound (0) is ignored; `fallback` applies when the unit has neither.
pub fn lease_deadline(unit: &WorkUnit, received: Instant, fallback: Duration) -> Instant {
    let by_duration = (unit.lease_duration_ms > 0)
        .then(|| received + Duration::from_millis(unit.lease_duration_ms));
    let by_clock = (unit.lease_deadline_unix_ms != 0).then(|| {
        let now_ms = clb_proto::now_unix_ms();
        let left = unit.lease_deadline_unix_ms.saturating_sub(now_ms);
        let now = Instant::now();
        match u64::try_from(left) {
            Ok(ms) if ms > 0 => now + Duration::from_millis(ms),
            _ => now.min(received),
        }
    });
    match (by_duration, by_clock) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => received + fallback,
    }
}

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
    /// Whether trying again later may succeed.
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            UnitError::LeaseExpired | UnitError::Cancelled | UnitError::Aborted => true,
            UnitError::Nrp(e) => e.is_retryable(),
            UnitError::Invalid { .. } => false,
        }
    }

    /// Whether this is NRP's `NotFound`.
    pub(crate) fn is_not_found(&self) -> bool {
        matches!(self, UnitError::Nrp(NrpError::NotFound { .. }))
    }

    /// The report outcome for this error.
    pub(crate) fn outcome(&self) -> report::Outcome {
        let retryable = |retry_after: Option<Duration>, code: &str, message: String| {
            report::Outcome::Retryable(v1::Retryable {
                retry_after_ms: retry_after
                    .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                code: code.into(),
                message,
            })
        };
        match self {
            UnitError::LeaseExpired => retryable(
                None,
                "LeaseExpired",
                "the lease ended before the work was done".into(),
            ),
            UnitError::Cancelled => retryable(
                None,
                "WorkerCancelled",
                "the worker is shutting down or lost its stream".into(),
            ),
            UnitError::Aborted => retryable(
                None,
                "Aborted",
                "not started after another part of the unit failed".into(),
            ),
            UnitError::Nrp(e) if e.is_retryable() => {
                retryable(e.retry_after(), e.code(), e.to_string())
            }
            UnitError::Nrp(e) => report::Outcome::Terminal(v1::Terminal {
                code: e.code().into(),
                message: e.to_string(),
            }),
            UnitError::Invalid { code, message } => report::Outcome::Terminal(v1::Terminal {
                code: (*code).into(),
                message: message.clone(),
            }),
        }
    }
}

/// The error that decides the outcome of a unit whose parts failed: a retryable one if any (so that
/// retryable parts are not parked with a terminal one), never `Aborted` when there is another.
pub(crate) fn decisive(errors: impl IntoIterator<Item = UnitError>) -> Option<UnitError> {
    errors.into_iter().min_by_key(|e| match e {
        UnitError::Aborted => 2,
        e if e.is_retryable() => 0,
        _ => 1,
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
}

/// What the units of one session share.
pub(crate) struct Env {
    pub nrp: Arc<dyn Nrp>,
    pub config: Arc<WorkerConfig>,
    pub limiters: Arc<GatewayLimiters>,
    pub gateways: GatewayCache,
    /// Cancelled when the worker shuts down or the session's stream breaks.
    pub cancel: CancellationToken,
}

/// The context of one unit: every NRP call goes through [`UnitCtx::read`] or [`UnitCtx::mutate`].
pub(crate) struct UnitCtx<'a> {
    pub env: &'a Env,
    pub gateway: &'a str,
    pub deadline: Instant,
    limiter: Arc<AimdLimiter>,
    abort: AtomicBool,
}

impl<'a> UnitCtx<'a> {
    fn new(env: &'a Env, gateway: &'a str, deadline: Instant) -> Self {
        Self {
            env,
            gateway,
            deadline,
            limiter: env.limiters.get(gateway),
            abort: AtomicBool::new(false),
        }
    }

    /// The NRP client.
    pub(crate) fn nrp(&self) -> &dyn Nrp {
        self.env.nrp.as_ref()
    }

    /// Stops the parts of the unit that have not started their next call yet.
    pub(crate) fn abort(&self) {
        self.abort.store(true, Ordering::SeqCst);
    }

    /// Checks that a call may start now, and returns its options.
    fn gate(&self) -> Result<CallOptions, UnitError> {
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

    /// A read (no concurrency permit).
    pub(crate) async fn read<T, F, Fut>(&self, call: F) -> Result<T, UnitError>
    where
        F: FnOnce(CallOptions) -> Fut,
        Fut: Future<Output = Result<T, NrpError>>,
    {
        let opts = self.gate()?;
        Ok(call(opts).await?)
    }

    /// A mutating call: waits for a permit of the gateway's limiter (until the lease ends), then
    /// calls, and feeds the outcome back to the limiter.
    pub(crate) async fn mutate<T, F, Fut>(&self, call: F) -> Result<T, UnitError>
    where
        F: FnOnce(CallOptions) -> Fut,
        Fut: Future<Output = Result<T, NrpError>>,
    {
        self.gate()?;
        let deadline = tokio::time::Instant::from_std(self.deadline);
        let permit = tokio::select! {
            () = self.env.cancel.cancelled() => return Err(UnitError::Cancelled),
            p = self.limiter.acquire(deadline) => p.map_err(|_| UnitError::LeaseExpired)?,
        };
        let opts = self.gate()?;
        let result = call(opts).await;
        match &result {
            Ok(_) => permit.success(),
            Err(e) if e.is_throttling() => permit.throttled(),
            Err(_) => drop(permit),
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
                    .read(|o| self.nrp().get_service_gateway(self.gateway, o))
                    .await
                {
                    Ok(gw) => Ok(gw.location.unwrap_or_else(|| cfg.gateway_region.clone())),
                    Err(e) if e.is_not_found() => {
                        tracing::info!(
                            gateway = self.gateway,
                            "creating the missing service gateway"
                        );
                        let body = clb_nrp::wire::ServiceGateway {
                            location: Some(cfg.gateway_region.clone()),
                            sku: Some(clb_nrp::wire::Sku::standard()),
                            properties: clb_nrp::wire::ServiceGatewayProperties {
                                virtual_network: cfg
                                    .virtual_network_id
                                    .clone()
                                    .map(clb_nrp::wire::SubResource::new),
                                ..Default::default()
                            },
                            ..Default::default()
                        };
                        let gw = self
                            .mutate(|o| self.nrp().put_service_gateway(self.gateway, &body, o))
                            .await?;
                        Ok(gw.location.unwrap_or_else(|| cfg.gateway_region.clone()))
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

fn kind_name(work: Option<&work_unit::Work>) -> &'static str {
    match work {
        Some(work_unit::Work::Services(_)) => "services",
        Some(work_unit::Work::Locations(_)) => "locations",
        Some(work_unit::Work::Observe(_)) => "observe",
        None => "none",
    }
}

/// Executes `unit` (leased until `deadline`) and returns its reports: one, or several parts for an
/// observe unit.
pub(crate) fn execute(
    env: Arc<Env>,
    unit: WorkUnit,
    deadline: Instant,
) -> impl Future<Output = Vec<Report>> + Send {
    let kind = kind_name(unit.work.as_ref());
    let span = tracing::info_span!(
        "work_unit",
        work_id = unit.work_id,
        gateway = %unit.gateway,
        kind,
        attempt = unit.attempt,
        revision = unit.revision,
    );
    // A child of the server's span of this unit, so that the unit's NRP calls join its trace.
    clb_telemetry::set_parent_from_map(&span, &unit.trace_context);
    async move {
        let started = Instant::now();
        let ctx = UnitCtx::new(&env, &unit.gateway, deadline);
        let reports = if ctx.gate().is_err_and(|e| e == UnitError::LeaseExpired) {
            vec![report(
                unit.work_id,
                Vec::new(),
                UnitError::LeaseExpired.outcome(),
            )]
        } else {
            match &unit.work {
                Some(work_unit::Work::Locations(w)) => {
                    vec![locations::execute(&ctx, unit.work_id, w).await]
                }
                Some(work_unit::Work::Services(w)) => {
                    vec![services::execute(&ctx, unit.work_id, w).await]
                }
                Some(work_unit::Work::Observe(_)) => observe::execute(&ctx, unit.work_id).await,
                None => vec![report(
                    unit.work_id,
                    Vec::new(),
                    UnitError::Invalid {
                        code: "InvalidWorkUnit",
                        message: "the unit carries no work".into(),
                    }
                    .outcome(),
                )],
            }
        };
        if let Some(last) = reports.last() {
            let outcome = match &last.outcome {
                Some(report::Outcome::Applied(_)) => "applied".to_string(),
                Some(report::Outcome::Observed(_)) => "observed".to_string(),
                Some(report::Outcome::Retryable(r)) => format!("retryable {}", r.code),
                Some(report::Outcome::Terminal(t)) => format!("terminal {}", t.code),
                None => "none".to_string(),
            };
            tracing::info!(
                %outcome,
                applied_indices = last.applied_indices.len(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "unit done"
            );
        }
        reports
    }
    .instrument(span)
}
