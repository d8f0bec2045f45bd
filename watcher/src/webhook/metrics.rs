//! Prometheus metrics of `clb-webhook`, served on `--metrics-listen` by
//! [`clb_telemetry::metrics`] with `/healthz` and `/readyz`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

/// The webhook's metrics and their registry:
/// - `clb_webhook_admissions_total{result="patched|unchanged|error"}`: AdmissionReviews answered
///   (`error`: the body was not an AdmissionReview, answered 400, or its object was not a Pod,
///   allowed without a patch);
/// - `clb_webhook_stores_synced`: 1 once the Services and Namespaces have been listed;
/// - `clb_build_info`.
#[derive(Debug)]
pub struct WebhookMetrics {
    registry: Registry,
    admissions: Family<ResultLabels, Counter>,
    synced: Gauge,
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl WebhookMetrics {
    /// Creates and registers every metric (each `result` at 0).
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("clb");
        clb_telemetry::metrics::register_build_info(&mut registry);
        let admissions = Family::<ResultLabels, Counter>::default();
        let synced = Gauge::default();
        registry.register(
            "webhook_admissions",
            "AdmissionReviews answered by the readiness-gate webhook, by result (patched: the gate \
             and label added; unchanged: allowed as is; error: a malformed review, allowed as is \
             or answered 400)",
            admissions.clone(),
        );
        registry.register(
            "webhook_stores_synced",
            "1 once the webhook has listed the Services and Namespaces (before that every pod is \
             allowed as is)",
            synced.clone(),
        );
        for result in ["patched", "unchanged", "error"] {
            let _ = admissions.get_or_create(&ResultLabels {
                result: result.to_owned(),
            });
        }
        Self {
            registry,
            admissions,
            synced,
        }
    }

    /// Counts one AdmissionReview answered with `result` (`patched`, `unchanged`, `error`).
    pub fn admission(&self, result: &str) {
        self.admissions
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    /// How many AdmissionReviews were answered with `result`.
    pub fn admissions(&self, result: &str) -> u64 {
        self.admissions
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .get()
    }

    /// Sets `clb_webhook_stores_synced`.
    pub fn set_synced(&self, synced: bool) {
        self.synced.set(i64::from(synced));
    }

    /// The registry in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        clb_telemetry::metrics::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admissions_are_counted_by_result() {
        let m = WebhookMetrics::new();
        m.admission("patched");
        m.admission("patched");
        m.admission("error");
        let text = clb_telemetry::metrics::openmetrics_to_prometheus(&m.encode());
        for line in [
            "clb_webhook_admissions_total{result=\"patched\"} 2",
            "clb_webhook_admissions_total{result=\"unchanged\"} 0",
            "clb_webhook_admissions_total{result=\"error\"} 1",
            "clb_webhook_stores_synced 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        assert_eq!(m.admissions("patched"), 2);
    }
}
