//! Prometheus metrics of the watcher and node agent, served on `--metrics-listen` by
//! [`clb_telemetry::metrics`] (docs/metrics.md lists them). They travel in
//! [`crate::config::WatcherConfig::metrics`], so every task of the watcher records into the same ones.
//!
//! `/readyz` answers ready once the watcher is synced: every watch has completed its first list and
//! the state server has acknowledged the first resync ([`WatcherMetrics::is_synced`]).

use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    kind: String,
    event: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RestartLabels {
    kind: String,
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: String,
}

/// The watcher's metrics and their registry.
#[derive(Debug)]
pub struct WatcherMetrics {
    registry: Registry,
    events: Family<EventLabels, Counter>,
    restarts: Family<RestartLabels, Counter>,
    resyncs: Family<ResultLabels, Counter>,
    writeback_failures: Family<OperationLabels, Counter>,
    synced: Gauge,
    gate_seconds: Histogram,
    gate_outcomes: Family<ReasonLabels, Counter>,
    listed: AtomicBool,
    resynced: AtomicBool,
    /// With several gateways: the gateways whose lane has not resynced yet.
    pending_lanes: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl Default for WatcherMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl WatcherMetrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("clb");
        clb_telemetry::metrics::register_build_info(&mut registry);
        let events = Family::<EventLabels, Counter>::default();
        let restarts = Family::<RestartLabels, Counter>::default();
        let resyncs = Family::<ResultLabels, Counter>::default();
        let writeback_failures = Family::<OperationLabels, Counter>::default();
        let synced = Gauge::default();
        // 10 ms .. ~10 min (the gate's default bound), doubling.
        let gate_seconds =
            Histogram::new(std::iter::successors(Some(0.01_f64), |b| Some(b * 2.0)).take(17));
        let gate_outcomes = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "watcher_readiness_gate_seconds",
            "Pod readiness gate clb.azure.com/programmed: seconds from the pod's containers being \
             ready (as the watcher saw it) to the gate set True",
            gate_seconds.clone(),
        );
        registry.register(
            "watcher_readiness_gate",
            "Readiness gates set True, by reason: Programmed, NotSelected, Timeout (failed open)",
            gate_outcomes.clone(),
        );
        registry.register(
            "watcher_events",
            "Watch events processed, by resource kind and event (init, apply, delete, init_done)",
            events.clone(),
        );
        registry.register(
            "watcher_watch_restarts",
            "Watches that ended and were re-opened, by resource kind and reason (expired: 410 Gone, \
             relisted at once; failed: retried with backoff)",
            restarts.clone(),
        );
        registry.register(
            "watcher_resyncs",
            "Resyncs sent to the state server, by result (ok, error)",
            resyncs.clone(),
        );
        registry.register(
            "watcher_writeback_failures",
            "Writes to the Kubernetes API (finalizers, ingress status, conditions) that failed, by \
             operation",
            writeback_failures.clone(),
        );
        registry.register(
            "watcher_synced",
            "1 once every watch completed its first list and the state server acknowledged the \
             first resync",
            synced.clone(),
        );
        Self {
            registry,
            events,
            restarts,
            resyncs,
            writeback_failures,
            synced,
            gate_seconds,
            gate_outcomes,
            listed: AtomicBool::new(false),
            resynced: AtomicBool::new(false),
            pending_lanes: std::sync::Mutex::new(std::collections::BTreeSet::new()),
        }
    }

    /// A readiness gate was set True for `reason` after `seconds` (from containers ready).
    pub fn gate_opened(&self, reason: &str, seconds: f64) {
        self.gate_seconds.observe(seconds);
        self.gate_outcomes
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts one watch event of `kind` (`init`, `apply`, `delete`, `init_done`).
    pub fn event(&self, kind: &str, event: &str) {
        self.events
            .get_or_create(&EventLabels {
                kind: kind.to_owned(),
                event: event.to_owned(),
            })
            .inc();
    }

    /// Counts one watch of `kind` that ended with an error and is re-opened: `expired` (410 Gone)
    /// or `failed`.
    pub fn watch_restart(&self, kind: &str, reason: &str) {
        self.restarts
            .get_or_create(&RestartLabels {
                kind: kind.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// With several gateways: the watcher is synced only once each of these has resynced.
    pub fn expect_gateways(&self, gateways: impl IntoIterator<Item = String>) {
        *self.pending_lanes.lock().unwrap_or_else(|e| e.into_inner()) =
            gateways.into_iter().collect();
    }

    /// Counts one resync of the lane of `gateway`; the watcher is synced once its lists are done
    /// and every expected gateway has resynced successfully.
    pub fn resync_of(&self, gateway: &str, ok: bool) {
        if ok && self.listed.load(Ordering::SeqCst) {
            let mut pending = self.pending_lanes.lock().unwrap_or_else(|e| e.into_inner());
            pending.remove(gateway);
            if !pending.is_empty() {
                drop(pending);
                self.count_resync(ok);
                return;
            }
        }
        self.resync(ok);
    }

    fn count_resync(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.resyncs
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    /// Counts one resync; a successful one makes the watcher synced once its lists are done.
    pub fn resync(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.resyncs
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
        if ok && self.listed.load(Ordering::SeqCst) {
            self.resynced.store(true, Ordering::SeqCst);
            self.update_synced();
        }
    }

    /// Every watch has completed its first list.
    pub fn lists_done(&self) {
        self.listed.store(true, Ordering::SeqCst);
        self.update_synced();
    }

    /// Counts one failed write-back `operation`.
    pub fn writeback_failure(&self, operation: &str) {
        self.writeback_failures
            .get_or_create(&OperationLabels {
                operation: operation.to_owned(),
            })
            .inc();
    }

    fn update_synced(&self) {
        self.synced.set(i64::from(self.is_synced()));
    }

    /// Whether the initial lists are done and the first resync after them was acknowledged.
    pub fn is_synced(&self) -> bool {
        self.listed.load(Ordering::SeqCst) && self.resynced.load(Ordering::SeqCst)
    }

    /// All metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        clb_telemetry::metrics::encode(&self.registry)
    }

    /// The `/metrics`, `/healthz` and `/readyz` routes (`/readyz`: [`WatcherMetrics::is_synced`]).
    pub fn router(self: &std::sync::Arc<Self>) -> axum::Router {
        let (m, r) = (self.clone(), self.clone());
        clb_telemetry::metrics::router(move || m.encode(), move || r.is_synced())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synced_needs_the_lists_and_then_a_resync() {
        let m = WatcherMetrics::new();
        m.resync(true);
        assert!(
            !m.is_synced(),
            "a resync before the lists are done does not count"
        );
        m.lists_done();
        assert!(!m.is_synced());
        m.resync(false);
        assert!(!m.is_synced());
        m.resync(true);
        assert!(m.is_synced());
        let several = WatcherMetrics::new();
        several.expect_gateways(["a".to_owned(), "b".to_owned()]);
        several.lists_done();
        several.resync_of("a", true);
        assert!(!several.is_synced(), "b has not resynced");
        several.resync_of("b", true);
        assert!(several.is_synced());
        let text = m.encode();
        for line in [
            "clb_watcher_synced 1",
            "clb_watcher_resyncs_total{result=\"ok\"} 2",
            "clb_watcher_resyncs_total{result=\"error\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
