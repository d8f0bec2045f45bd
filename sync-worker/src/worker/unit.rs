//! Executing one work unit: its lease, and the dispatch to the location, service and observe
//! executors (which share [`super::ctx`], never this module).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clb_proto::v1::{Report, WorkUnit, report, work_unit};
use tracing::Instrument;

use super::ctx::{Env, UnitCtx, UnitError, report};
use super::{locations, observe, services};

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
        let ctx = match UnitCtx::new(&env, &unit.gateway, deadline) {
            Ok(ctx) => ctx,
            Err(e) => {
                tracing::warn!(error = ?e, "no NRP client for the unit's gateway");
                return vec![report(unit.work_id, Vec::new(), e.outcome())];
            }
        };
        let answered_before = ctx.nrp().writes_answered();
        let mut reports = if ctx.gate().is_err_and(|e| e == UnitError::LeaseExpired) {
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
        // The subscription's write budget as the gateway's client saw it during this unit, for the
        // server to pace by (it sees every worker's reports). None when no mutating answer came
        // meanwhile (an observe's reads, a unit refused before NRP): a figure left by earlier
        // calls may be stale, higher than the budget now, and would let the server spend faster.
        let remaining_writes = (ctx.nrp().writes_answered() != answered_before)
            .then(|| ctx.nrp().remaining_subscription_writes())
            .flatten();
        for r in &mut reports {
            r.remaining_subscription_writes = remaining_writes;
        }
        if let Some(last) = reports.last() {
            let outcome = match &last.outcome {
                Some(report::Outcome::Applied(_)) => "applied".to_string(),
                Some(report::Outcome::Observed(_)) => "observed".to_string(),
                Some(report::Outcome::Retryable(r)) => format!("retryable {}", r.code),
                Some(report::Outcome::Repair(r)) => format!("repair {}", r.code),
                Some(report::Outcome::Terminal(t)) => format!("terminal {}", t.code),
                None => "none".to_string(),
            };
            if let Some(report::Outcome::Terminal(t)) = &last.outcome {
                tracing::warn!(
                    code = %t.code,
                    reason = %t.message,
                    unapplied = kind,
                    "invalid whatever NRP holds: the server parks this work until its desired \
                     state changes"
                );
            }
            tracing::info!(
                %outcome,
                applied_indices = last.applied_indices.len(),
                remaining_subscription_writes = remaining_writes,
                service_progress = last.service_progress.len(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "unit done"
            );
        }
        reports
    }
    .instrument(span)
}
