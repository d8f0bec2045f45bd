//! What `clbctl load` reports: percentiles, the serialisable report (`--output json`) and its table.

use std::fmt::Write as _;
use std::time::Duration;

use clb_nrp_emulator::Stats;
use comfy_table::{Cell, CellAlignment, ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use serde::Serialize;

/// The `updateAddressLocations` operation, as the emulator counts it.
pub(super) const UAL: &str = "ServiceGateways_UpdateAddressLocations";

/// Percentiles of a list of durations, in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    /// How many values.
    pub count: usize,
    /// Median (nearest rank).
    pub p50_ms: Option<f64>,
    /// 90th percentile.
    pub p90_ms: Option<f64>,
    /// 99th percentile.
    pub p99_ms: Option<f64>,
    /// Largest.
    pub max_ms: Option<f64>,
    /// Mean.
    pub mean_ms: Option<f64>,
}

impl Percentiles {
    /// The percentiles of `values`.
    pub fn of(values: &[Duration]) -> Self {
        let mut v: Vec<f64> = values.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        v.sort_by(f64::total_cmp);
        let rank = |q: f64| -> Option<f64> {
            if v.is_empty() {
                return None;
            }
            let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
            Some(round(v[i]))
        };
        Self {
            count: v.len(),
            p50_ms: rank(0.50),
            p90_ms: rank(0.90),
            p99_ms: rank(0.99),
            max_ms: v.last().copied().map(round),
            mean_ms: (!v.is_empty()).then(|| round(v.iter().sum::<f64>() / v.len() as f64)),
        }
    }
}

pub(super) fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The load's settings, as reported.
#[derive(Debug, Clone, Serialize)]
pub struct LoadConfigView {
    /// Pods.
    pub pods: u64,
    /// Locations.
    pub locations: u64,
    /// Services.
    pub services: u64,
    /// Target pod replacements per second.
    pub churn_per_sec: f64,
    /// Churn duration, seconds.
    pub duration_s: f64,
    /// Batch window, ms.
    pub batch_window_ms: f64,
    /// Embedded system only: workers and NRP cost model.
    pub embedded: Option<EmbeddedView>,
}

/// The embedded system's settings.
#[derive(Debug, Clone, Serialize)]
pub struct EmbeddedView {
    /// Sync workers.
    pub workers: usize,
    /// NRP latency per call, ms.
    pub nrp_latency_ms: u64,
    /// NRP latency per address, µs.
    pub nrp_latency_per_address_us: u64,
    /// Concurrent mutating NRP calls per gateway.
    pub nrp_concurrency: u64,
    /// Most locations per unit and per call.
    pub locations_per_call: usize,
    /// Azure's write budget per subscription, as the emulator models it (`None`: off).
    pub nrp_write_budget: Option<String>,
}

/// Ingest figures.
#[derive(Debug, Clone, Serialize)]
pub struct IngestView {
    /// Churn events sent and acknowledged.
    pub churn_events: u64,
    /// Updates acknowledged (3 per event).
    pub updates_acknowledged: u64,
    /// Updates the server rejected (should be 0).
    pub updates_rejected: u64,
    /// From the first send to the last acknowledgement, seconds.
    pub elapsed_s: f64,
    /// Updates acknowledged per second: the ingest rate.
    pub updates_per_sec: f64,
    /// Churn events per second achieved.
    pub churn_events_per_sec: f64,
    /// Churn events per second asked for.
    pub target_churn_per_sec: f64,
    /// `Apply` calls.
    pub batches: u64,
    /// Time from sending a batch to its acknowledgement.
    pub batch_ack: Percentiles,
}

/// Convergence latency figures.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyView {
    /// How it is measured.
    pub method: String,
    /// Latencies of the sampled events.
    pub latency: Percentiles,
    /// Samples whose pod was churned away before it converged.
    pub abandoned: u64,
    /// Samples still not converged when the run ended.
    pub not_converged: usize,
    /// Failed read-backs (retried).
    pub poll_errors: u64,
}

/// NRP figures.
#[derive(Debug, Clone, Serialize)]
pub struct NrpView {
    /// Whether NRP's counters are known (embedded emulator).
    pub available: bool,
    /// Why not, when not.
    pub note: Option<String>,
    /// ARM calls during the churn and the drain.
    pub calls: Option<u64>,
    /// `updateAddressLocations` calls.
    pub update_address_locations_calls: Option<u64>,
    /// Addresses carried by them.
    pub addresses_carried: Option<u64>,
    /// Addresses per `updateAddressLocations` call.
    pub addresses_per_call: Option<f64>,
    /// Churn events per `updateAddressLocations` call.
    pub events_per_location_call: Option<f64>,
    /// Calls refused for throttling (retried): 429s (the write budget's included) and 409
    /// `AnotherOperationInProgress`.
    pub throttled: Option<u64>,
    /// Of those, the 429s of the subscription's write budget (`SubscriptionRequestsThrottled`).
    pub throttled_by_write_budget: Option<u64>,
    /// Highest number of concurrent mutating calls seen.
    pub max_concurrent_mutations: Option<usize>,
}

/// What `clbctl load` measured.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// `embedded` or `external`.
    pub mode: String,
    /// The state server loaded.
    pub state_server: String,
    /// The settings.
    pub config: LoadConfigView,
    /// Time to program the initial population, seconds.
    pub initial_sync_s: f64,
    /// Ingest.
    pub ingest: IngestView,
    /// Convergence latency.
    pub convergence: LatencyView,
    /// From the last acknowledgement until the system was idle and converged, seconds.
    pub drain_s: f64,
    /// Whether the system converged at the end (embedded: NRP equals the desired state;
    /// external: the Admin API says so).
    pub converged: bool,
    /// The differences or the reason, when it did not converge.
    pub convergence_error: Option<String>,
    /// NRP calls.
    pub nrp: NrpView,
    /// The state server's pacing against the write budget (embedded only).
    pub pacing: Option<super::load_pacing::PacingView>,
}

pub(super) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

pub(super) fn nrp_view(s: &Stats, events: u64) -> NrpView {
    let ual = s.calls_of(UAL);
    NrpView {
        available: true,
        note: Some("NRP emulator counters over the churn and the drain after it".to_owned()),
        calls: Some(s.calls),
        update_address_locations_calls: Some(ual),
        addresses_carried: Some(s.addresses_carried),
        addresses_per_call: Some(round(s.addresses_carried as f64 / ual.max(1) as f64)),
        events_per_location_call: Some(round(events as f64 / ual.max(1) as f64)),
        throttled: Some(
            s.rejected("TooManyRequests")
                + s.rejected("SubscriptionRequestsThrottled")
                + s.rejected("AnotherOperationInProgress"),
        ),
        throttled_by_write_budget: Some(s.throttled_by_write_budget),
        max_concurrent_mutations: Some(s.max_concurrent_mutations),
    }
}

pub(super) fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |x| format!("{x:.1} ms"))
}

/// The report as text: one table of figures and the method.
pub fn render(r: &LoadReport) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(vec!["figure", "value"]);
    let mut row = |k: &str, v: String| {
        t.add_row(vec![
            Cell::new(k),
            Cell::new(v).set_alignment(CellAlignment::Right),
        ]);
    };
    let c = &r.config;
    let i = &r.ingest;
    let l = &r.convergence.latency;
    row(
        "load",
        format!(
            "{} pods, {} locations, {} services; {} pods/s for {:.1} s",
            c.pods, c.locations, c.services, c.churn_per_sec, c.duration_s
        ),
    );
    row(
        "initial population programmed in",
        format!("{:.2} s", r.initial_sync_s),
    );
    row(
        "ingest rate (updates acknowledged/s)",
        format!("{:.0}", i.updates_per_sec),
    );
    row(
        "churn events/s (achieved / target)",
        format!(
            "{:.0} / {:.0}",
            i.churn_events_per_sec, i.target_churn_per_sec
        ),
    );
    row(
        "updates acknowledged (rejected)",
        format!("{} ({})", i.updates_acknowledged, i.updates_rejected),
    );
    row("batches", i.batches.to_string());
    row(
        "batch acknowledgement p50 / p99",
        format!("{} / {}", ms(i.batch_ack.p50_ms), ms(i.batch_ack.p99_ms)),
    );
    row("convergence latency p50", ms(l.p50_ms));
    row("convergence latency p90", ms(l.p90_ms));
    row("convergence latency p99", ms(l.p99_ms));
    row("convergence latency max", ms(l.max_ms));
    row(
        "latency samples (abandoned, not converged)",
        format!(
            "{} ({}, {})",
            l.count, r.convergence.abandoned, r.convergence.not_converged
        ),
    );
    row(
        "drain after the last acknowledgement",
        format!("{:.2} s", r.drain_s),
    );
    row(
        "converged at the end",
        if r.converged { "yes" } else { "NO" }.to_owned(),
    );
    let n = &r.nrp;
    if n.available {
        let o = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |x| x.to_string());
        row("NRP calls", o(n.calls));
        row(
            "NRP updateAddressLocations calls",
            o(n.update_address_locations_calls),
        );
        row("NRP addresses carried", o(n.addresses_carried));
        row(
            "NRP addresses per call",
            n.addresses_per_call
                .map_or_else(|| "-".to_owned(), |x| format!("{x:.1}")),
        );
        row(
            "churn events per updateAddressLocations call",
            n.events_per_location_call
                .map_or_else(|| "-".to_owned(), |x| format!("{x:.1}")),
        );
        row("NRP throttled calls (retried)", o(n.throttled));
        if let Some(budget) = c
            .embedded
            .as_ref()
            .and_then(|e| e.nrp_write_budget.as_ref())
        {
            row("NRP write budget per subscription", budget.clone());
            row(
                "NRP 429s of the write budget (SubscriptionRequestsThrottled)",
                o(n.throttled_by_write_budget),
            );
        }
        if let Some(p) = &r.pacing {
            row(
                "write budget remaining (min / last reported)",
                format!(
                    "{} / {}",
                    p.remaining_min.map_or("-".to_owned(), |x| x.to_string()),
                    p.remaining_last.map_or("-".to_owned(), |x| x.to_string())
                ),
            );
            row(
                "batching window chosen (widest; share of the churn paced)",
                format!("{}; {:.0} %", ms(p.window_max_ms), p.paced_share * 100.0),
            );
        }
        row(
            "NRP max concurrent mutating calls",
            n.max_concurrent_mutations
                .map_or_else(|| "-".to_owned(), |x| x.to_string()),
        );
    } else {
        row(
            "NRP calls",
            "unavailable (external state server)".to_owned(),
        );
    }
    let mut out = format!(
        "clbctl load: {} system, state server {}\n",
        r.mode, r.state_server
    );
    let _ = writeln!(out, "{t}");
    let _ = writeln!(out, "convergence latency: {}", r.convergence.method);
    if let Some(e) = &r.convergence_error {
        let _ = writeln!(out, "did not converge: {e}");
    }
    if let Some(note) = &r.nrp.note {
        let _ = writeln!(out, "NRP: {note}");
    }
    out
}
