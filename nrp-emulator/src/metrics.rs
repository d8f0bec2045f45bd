//! Prometheus metrics of the `nrp-emulator` binary (`--metrics-listen`), taken from its [`Stats`]
//! at each scrape and served by [`clb_telemetry::metrics`] (docs/metrics.md lists them).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::{Emulator, Stats};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    operation: String,
    status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    code: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FaultLabels {
    kind: String,
}

fn counter(n: u64) -> Counter {
    let c = Counter::default();
    c.inc_by(n);
    c
}

fn gauge(n: usize) -> Gauge {
    let g = Gauge::default();
    g.set(i64::try_from(n).unwrap_or(i64::MAX));
    g
}

/// `stats` as metrics, in the OpenMetrics text format.
pub fn encode(stats: &Stats) -> String {
    let mut r = Registry::with_prefix("clb");
    clb_telemetry::metrics::register_build_info(&mut r);
    let calls = Family::<CallLabels, Counter>::default();
    for (operation, by_status) in &stats.calls_by_operation {
        for (status, n) in by_status {
            calls
                .get_or_create(&CallLabels {
                    operation: operation.clone(),
                    status: status.to_string(),
                })
                .inc_by(*n);
        }
    }
    r.register(
        "emulator_calls",
        "ARM calls answered, by ARM operation id and HTTP status",
        calls,
    );
    let rejected = Family::<CodeLabels, Counter>::default();
    for (code, n) in &stats.rejected_by_code {
        rejected
            .get_or_create(&CodeLabels { code: code.clone() })
            .inc_by(*n);
    }
    r.register(
        "emulator_rejected",
        "Error answers, by ARM error code (rule violations, throttling, injected faults)",
        rejected,
    );
    let faults = Family::<FaultLabels, Counter>::default();
    for (kind, n) in &stats.faults_injected {
        faults
            .get_or_create(&FaultLabels { kind: kind.clone() })
            .inc_by(*n);
    }
    r.register(
        "emulator_faults_injected",
        "Injected faults, by kind (timeout, 500, 503, 429, 409)",
        faults,
    );
    r.register(
        "emulator_mutating_calls",
        "Mutating calls received (PUT, POST, DELETE), whatever their outcome",
        counter(stats.mutating_calls),
    );
    r.register(
        "emulator_mutations_applied",
        "Mutating calls that were applied",
        counter(stats.mutations_applied),
    );
    r.register(
        "emulator_addresses_carried",
        "Addresses carried by updateAddressLocations calls that were parsed",
        counter(stats.addresses_carried),
    );
    r.register(
        "emulator_throttled_by_limit",
        "Calls refused by the per-gateway concurrency limit",
        counter(stats.throttled_by_limit),
    );
    r.register(
        "emulator_throttled_by_write_budget",
        "Mutating calls refused with 429 SubscriptionRequestsThrottled: their subscription's write \
         budget (token bucket or writes per window) was spent",
        counter(stats.throttled_by_write_budget),
    );
    r.register(
        "emulator_in_flight_mutations",
        "Mutating gateway calls in flight (including running long-running operations)",
        gauge(stats.in_flight_mutations),
    );
    clb_telemetry::metrics::encode(&r)
}

/// The `/metrics`, `/healthz` and `/readyz` routes of `emulator` (always ready: it serves from the
/// start).
pub fn router(emulator: Emulator) -> axum::Router {
    clb_telemetry::metrics::router(move || encode(&emulator.stats()), || true)
}
