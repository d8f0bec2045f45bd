//! Prometheus metrics of the state server (`GET /metrics`: Prometheus text 0.0.4, or OpenMetrics
//! when asked; served by [`clb_telemetry::metrics`]).
//!
//! Counters are incremented where things happen (`update_rpc`, `rejected`, `unit_outcome`,
//! `lease_expired`, `late_report`); the desired → programmed latency is observed through the
//! dispatcher's [`DispatchObserver`] of each gateway ([`gateway_observer`]). Per-gateway gauges are
//! set from a [`GatewaySnapshot`], usually by the `refresh` callback of [`serve_metrics`] right
//! before each scrape (see `Metrics::refresh_from`, in `state/scrape.rs`). Every name starts with
//! `clb_server_` (`clb_build_info` aside: every binary has it under that name); the list is in
//! docs/metrics.md.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use axum::Router;
use clb_core::dispatch::DispatchObserver;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// Content type of the OpenMetrics text format.
pub const OPENMETRICS_CONTENT_TYPE: &str = clb_telemetry::metrics::OPENMETRICS_CONTENT_TYPE;

/// Upper bounds of the desired → programmed latency buckets: 10 ms doubling to ~5.5 min.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.01, 2.0, 16)
}

/// Final result of a work unit, the `result` label of `clb_server_units_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnitResult {
    /// NRP accepted every change.
    Applied,
    /// Failed, will be retried.
    Retryable,
    /// Failed, parked until the desired state changes.
    Terminal,
    /// An observe unit read NRP back.
    Observed,
    /// The lease ran out before a report arrived.
    LeaseExpired,
}

impl UnitResult {
    /// The label value: `applied`, `retryable`, `terminal`, `observed` or `lease_expired`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Retryable => "retryable",
            Self::Terminal => "terminal",
            Self::Observed => "observed",
            Self::LeaseExpired => "lease_expired",
        }
    }
}

impl AsRef<str> for UnitResult {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    rpc: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    /// `Writer`, `Worker`, `Admin` or `other` (bounded: never the caller's path).
    service: &'static str,
    /// `Unauthenticated`, `PermissionDenied` or `Unavailable`.
    code: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UnitLabels {
    kind: String,
    result: String,
    code: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GatewayLabels {
    gateway: String,
}

type GatewayGauge = Family<GatewayLabels, Gauge>;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    gateway: String,
    kind: String,
}

type LatencyFamily = Family<LatencyLabels, Histogram, fn() -> Histogram>;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HeldLabels {
    gateway: String,
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedItemLabels {
    gateway: String,
    /// NRP's error code (bounded by what NRP sends: its error codes).
    code: String,
}

/// What the restart gate holds back for one reason (summed over the writers waited for).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeldBack {
    /// Removals held back: addresses that keep a ref (or stay) and services kept from deletion.
    pub removals: u64,
    /// Locations whose removals are held back.
    pub locations: u64,
}

/// Everything the gauges of one gateway show, at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GatewaySnapshot {
    /// Gateway name.
    pub gateway: String,
    /// Desired-state revision.
    pub revision: u64,
    /// Desired addresses.
    pub desired_addresses: u64,
    /// Addresses NRP has.
    pub actual_addresses: u64,
    /// Desired locations.
    pub desired_locations: u64,
    /// Locations NRP has.
    pub actual_locations: u64,
    /// Desired services (inbound load balancers and outbound NAT gateways).
    pub desired_services: u64,
    /// Services NRP has.
    pub actual_services: u64,
    /// Locations whose desired state differs from what was last sent.
    pub dirty_locations: u64,
    /// Work units leased to workers.
    pub units_in_flight: u64,
    /// Work parked after a terminal error.
    pub parked_units: u64,
    /// Egresses whose brought NAT gateway the last read-back of NRP found missing (deleted out of
    /// band; clb does not create it again).
    pub nat_gateways_missing: u64,
    /// Age of the oldest change not yet applied in NRP (zero when nothing is pending).
    pub staleness: Duration,
    /// Connected workers serving this gateway.
    pub workers: u64,
    /// The subscription's remaining writes as a worker last saw them (`None`: never reported).
    pub write_budget: Option<u32>,
    /// The spacing of mutating units while the write budget is tight (zero: not pacing).
    pub batching_window: Duration,
    /// The headway between location units in steady churn (zero: off or not measured yet).
    pub unit_headway: Duration,
    /// What the restart gate holds back, by reason label (see [`crate::gate::HoldReason::label`]);
    /// a reason not listed holds back nothing.
    pub held_back: Vec<(&'static str, HeldBack)>,
    /// The pieces of work NRP refused that are held on the refusal schedule (addresses refused on
    /// their own, locations and services parked whole), by error code; a code not listed has none.
    pub refused: Vec<(String, u64)>,
}

#[derive(Debug, Default)]
struct GatewayGauges {
    revision: GatewayGauge,
    desired_addresses: GatewayGauge,
    actual_addresses: GatewayGauge,
    desired_locations: GatewayGauge,
    actual_locations: GatewayGauge,
    desired_services: GatewayGauge,
    actual_services: GatewayGauge,
    dirty_locations: GatewayGauge,
    units_in_flight: GatewayGauge,
    parked_units: GatewayGauge,
    nat_gateways_missing: GatewayGauge,
    staleness_seconds: Family<GatewayLabels, Gauge<f64, AtomicU64>>,
    workers: GatewayGauge,
    write_budget_remaining: GatewayGauge,
    batching_window_seconds: Family<GatewayLabels, Gauge<f64, AtomicU64>>,
    unit_headway_seconds: Family<GatewayLabels, Gauge<f64, AtomicU64>>,
    removals_held_back: Family<HeldLabels, Gauge>,
    locations_held_back: Family<HeldLabels, Gauge>,
    refused_items: Family<RefusedItemLabels, Gauge>,
    /// The codes of `refused_items` set per gateway, so that a code no longer held is set to 0.
    refused_codes: std::sync::Mutex<HashMap<String, Vec<String>>>,
}

/// The server's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    update_rpcs: Family<RpcLabels, Counter>,
    calls_refused: Family<RefusedLabels, Counter>,
    rejected_items: Counter,
    units: Family<UnitLabels, Counter>,
    units_leased: Family<KindLabels, Counter>,
    leader: Gauge,
    lease_expiries: Counter,
    late_reports: Counter,
    session_wakeups: Counter,
    programmed_latency: LatencyFamily,
    gw: GatewayGauges,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("clb");
        let update_rpcs = Family::<RpcLabels, Counter>::default();
        let calls_refused = Family::<RefusedLabels, Counter>::default();
        let rejected_items = Counter::default();
        let units = Family::<UnitLabels, Counter>::default();
        let units_leased = Family::<KindLabels, Counter>::default();
        let leader = Gauge::default();
        let lease_expiries = Counter::default();
        let late_reports = Counter::default();
        let session_wakeups = Counter::default();
        let programmed_latency: LatencyFamily =
            Family::new_with_constructor(|| Histogram::new(latency_buckets()));
        let gw = GatewayGauges::default();
        clb_telemetry::metrics::register_build_info(&mut registry);
        // The state server's own metrics are `clb_server_…`, as the sync worker's are
        // `clb_worker_…` and the watcher's `clb_watcher_…`; `clb_build_info` is every binary's.
        let server = registry.sub_registry_with_prefix("server");

        server.register(
            "update_rpcs",
            "Writer RPCs received, by rpc",
            update_rpcs.clone(),
        );
        server.register(
            "calls_refused",
            "Calls refused by the caller checks (docs/security.md), by service and code: \
             Unauthenticated, PermissionDenied, or Unavailable when the Kubernetes API could not \
             tell",
            calls_refused.clone(),
        );
        server.register(
            "rejected_items",
            "Updates rejected as invalid",
            rejected_items.clone(),
        );
        server.register(
            "units",
            "Work unit outcomes, by unit kind, result and error code",
            units.clone(),
        );
        server.register(
            "units_leased",
            "Work units handed out to workers, by unit kind",
            units_leased.clone(),
        );
        server.register(
            "leader",
            "1 while this replica leads (serves writers and workers), 0 while it stands by",
            leader.clone(),
        );
        server.register(
            "lease_expiries",
            "Work unit leases that expired",
            lease_expiries.clone(),
        );
        server.register(
            "late_reports",
            "Reports for units no longer leased to their sender (ignored)",
            late_reports.clone(),
        );
        server.register(
            "session_wakeups",
            "Wake-ups of writers' WatchSession streams (each a change of that writer's own \
             session, or of leadership): a writer's stream is not woken by other writers' resyncs \
             or by changes of services",
            session_wakeups.clone(),
        );

        let gauges: [(&str, &str, &GatewayGauge); 12] = [
            ("revision", "Desired-state revision", &gw.revision),
            (
                "desired_addresses",
                "Desired addresses",
                &gw.desired_addresses,
            ),
            (
                "actual_addresses",
                "Addresses NRP has",
                &gw.actual_addresses,
            ),
            (
                "desired_locations",
                "Desired locations",
                &gw.desired_locations,
            ),
            (
                "actual_locations",
                "Locations NRP has",
                &gw.actual_locations,
            ),
            (
                "desired_services",
                "Desired services (load balancers and NAT gateways)",
                &gw.desired_services,
            ),
            ("actual_services", "Services NRP has", &gw.actual_services),
            (
                "dirty_locations",
                "Locations with changes not yet sent",
                &gw.dirty_locations,
            ),
            (
                "units_in_flight",
                "Work units leased to workers",
                &gw.units_in_flight,
            ),
            (
                "parked_units",
                "Work parked after a terminal error",
                &gw.parked_units,
            ),
            (
                "nat_gateways_missing",
                "Egresses whose brought NAT gateway the last read-back of NRP found missing (deleted out of band; not created again)",
                &gw.nat_gateways_missing,
            ),
            (
                "workers",
                "Connected workers serving the gateway",
                &gw.workers,
            ),
        ];
        for (name, help, gauge) in gauges {
            server.register(name, help, gauge.clone());
        }
        server.register(
            "removals_held_back",
            "Removals the restart gate holds back (addresses keeping a ref or staying, services kept \
             from deletion), by reason: nrp_not_observed, cluster_view, expected_writer, pod_writer",
            gw.removals_held_back.clone(),
        );
        server.register(
            "refused_items",
            "Work NRP refused and the server holds on its refusal schedule (addresses refused on \
             their own, locations and services parked whole), by gateway and error code",
            gw.refused_items.clone(),
        );
        server.register(
            "locations_held_back",
            "Locations whose removals the restart gate holds back, by reason",
            gw.locations_held_back.clone(),
        );
        server.register_with_unit(
            "desired_to_programmed",
            "Time from the update that changed a location or service (as the dispatcher took it up) \
             to the worker's report that NRP accepted it, by gateway and kind (locations, services)",
            Unit::Seconds,
            programmed_latency.clone(),
        );
        server.register_with_unit(
            "staleness",
            "Age of the oldest change not yet applied in NRP",
            Unit::Seconds,
            gw.staleness_seconds.clone(),
        );
        server.register(
            "write_budget_remaining",
            "The subscription's remaining writes (x-ms-ratelimit-remaining-subscription-writes) as a \
             worker last saw them; absent until a worker reported one",
            gw.write_budget_remaining.clone(),
        );
        server.register_with_unit(
            "batching_window",
            "The spacing of mutating units while the write budget is below --write-reserve (0: not \
             pacing): each unit carries what changed meanwhile",
            Unit::Seconds,
            gw.batching_window_seconds.clone(),
        );
        server.register_with_unit(
            "unit_headway",
            "The spacing of location units in steady churn: a location unit's smoothed duration / \
             the mutating slots x --unit-headway (0: off or not measured yet)",
            Unit::Seconds,
            gw.unit_headway_seconds.clone(),
        );

        Self {
            registry,
            update_rpcs,
            calls_refused,
            rejected_items,
            units,
            units_leased,
            leader,
            lease_expiries,
            late_reports,
            session_wakeups,
            programmed_latency,
            gw,
        }
    }

    /// Counts one Writer RPC (`apply`, `apply_stream`, `resync`, ...).
    pub fn update_rpc(&self, rpc: &str) {
        self.update_rpcs
            .get_or_create(&RpcLabels {
                rpc: rpc.to_owned(),
            })
            .inc();
    }

    /// Counts one call refused by the caller checks: `path` is the gRPC path (only its service
    /// becomes a label), `code` the refusal's.
    pub fn call_refused(&self, path: &str, code: tonic::Code) {
        let service = ["Writer", "Worker", "Admin"]
            .into_iter()
            .find(|s| path.starts_with(&format!("/clb.v1.{s}/")))
            .unwrap_or("other");
        let code = match code {
            tonic::Code::Unauthenticated => "Unauthenticated",
            tonic::Code::PermissionDenied => "PermissionDenied",
            tonic::Code::Unavailable => "Unavailable",
            _ => return,
        };
        self.calls_refused
            .get_or_create(&RefusedLabels { service, code })
            .inc();
    }

    /// Counts `n` rejected updates.
    pub fn rejected(&self, n: u64) {
        self.rejected_items.inc_by(n);
    }

    /// Counts one unit outcome: `kind` (`services`, `locations`, `observe`), `result` (a
    /// [`UnitResult`] or its label) and `code` (error code; empty on success).
    pub fn unit_outcome(
        &self,
        kind: impl AsRef<str>,
        result: impl AsRef<str>,
        code: impl AsRef<str>,
    ) {
        let labels = UnitLabels {
            kind: kind.as_ref().to_owned(),
            result: result.as_ref().to_owned(),
            code: code.as_ref().to_owned(),
        };
        self.units.get_or_create(&labels).inc();
    }

    /// Counts one unit handed out to a worker: `kind` is `services`, `locations` or `observe`.
    pub fn unit_leased(&self, kind: &str) {
        self.units_leased
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// Units of `kind` handed out since the start.
    pub fn units_leased(&self, kind: &str) -> u64 {
        self.units_leased
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .get()
    }

    /// Sets the `clb_server_leader` gauge.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Counts `n` expired leases.
    pub fn lease_expired(&self, n: u64) {
        self.lease_expiries.inc_by(n);
    }

    /// Counts one wake-up of a writer's `WatchSession` stream.
    pub fn session_woken(&self) {
        self.session_wakeups.inc();
    }

    /// Wake-ups of writers' `WatchSession` streams so far.
    pub fn session_wakeups(&self) -> u64 {
        self.session_wakeups.get()
    }

    /// Counts one late report.
    pub fn late_report(&self) {
        self.late_reports.inc();
    }

    /// Observes one desired → programmed latency of `gateway`: a change of `kind` (`locations`,
    /// `services`) NRP accepted `latency` after it became pending.
    pub fn programmed(&self, gateway: &str, kind: &str, latency: Duration) {
        self.programmed_latency
            .get_or_create(&LatencyLabels {
                gateway: gateway.to_owned(),
                kind: kind.to_owned(),
            })
            .observe(latency.as_secs_f64());
    }

    /// Sets `refused_items` of `s.gateway`: each code held now, and 0 for a code held before.
    fn set_refused(&self, s: &GatewaySnapshot) {
        let g = &self.gw;
        let mut codes = g.refused_codes.lock().unwrap_or_else(|e| e.into_inner());
        let before = codes.remove(&s.gateway).unwrap_or_default();
        let labels = |code: &str| RefusedItemLabels {
            gateway: s.gateway.clone(),
            code: code.to_owned(),
        };
        for code in before
            .iter()
            .filter(|c| !s.refused.iter().any(|(now, _)| now == *c))
        {
            g.refused_items.get_or_create(&labels(code)).set(0);
        }
        for (code, n) in &s.refused {
            g.refused_items
                .get_or_create(&labels(code))
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        codes.insert(
            s.gateway.clone(),
            s.refused.iter().map(|(c, _)| c.clone()).collect(),
        );
    }

    /// Sets the gauges of `s.gateway`.
    pub fn set_gateway(&self, s: &GatewaySnapshot) {
        let l = GatewayLabels {
            gateway: s.gateway.clone(),
        };
        let g = &self.gw;
        let set = |family: &GatewayGauge, v: u64| {
            family
                .get_or_create(&l)
                .set(i64::try_from(v).unwrap_or(i64::MAX));
        };
        set(&g.revision, s.revision);
        set(&g.desired_addresses, s.desired_addresses);
        set(&g.actual_addresses, s.actual_addresses);
        set(&g.desired_locations, s.desired_locations);
        set(&g.actual_locations, s.actual_locations);
        set(&g.desired_services, s.desired_services);
        set(&g.actual_services, s.actual_services);
        set(&g.dirty_locations, s.dirty_locations);
        set(&g.units_in_flight, s.units_in_flight);
        set(&g.parked_units, s.parked_units);
        set(&g.nat_gateways_missing, s.nat_gateways_missing);
        set(&g.workers, s.workers);
        if let Some(remaining) = s.write_budget {
            set(&g.write_budget_remaining, u64::from(remaining));
        }
        g.batching_window_seconds
            .get_or_create(&l)
            .set(s.batching_window.as_secs_f64());
        g.unit_headway_seconds
            .get_or_create(&l)
            .set(s.unit_headway.as_secs_f64());
        g.staleness_seconds
            .get_or_create(&l)
            .set(s.staleness.as_secs_f64());
        self.set_refused(s);
        for reason in crate::gate::HoldReason::LABELS {
            let held = s.held_back.iter().filter(|(r, _)| *r == reason).fold(
                HeldBack::default(),
                |a, (_, h)| HeldBack {
                    removals: a.removals + h.removals,
                    locations: a.locations + h.locations,
                },
            );
            let labels = HeldLabels {
                gateway: s.gateway.clone(),
                reason: reason.to_owned(),
            };
            let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            g.removals_held_back
                .get_or_create(&labels)
                .set(as_i64(held.removals));
            g.locations_held_back
                .get_or_create(&labels)
                .set(as_i64(held.locations));
        }
    }

    /// All metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        clb_telemetry::metrics::encode(&self.registry)
    }

    /// All metrics in the Prometheus text format 0.0.4.
    pub fn encode_prometheus(&self) -> String {
        clb_telemetry::metrics::openmetrics_to_prometheus(&self.encode())
    }
}

/// The metrics HTTP routes: `GET /metrics` (calls `refresh` first, so gauges are current),
/// `GET /healthz` and `GET /readyz` (always ready; see [`router_with_readiness`]).
pub fn router(metrics: Arc<Metrics>, refresh: impl Fn() + Send + Sync + 'static) -> Router {
    router_with_readiness(metrics, refresh, || true)
}

/// Like [`router`], with `GET /readyz` answering 200 while `ready()` holds and 503 otherwise (a
/// standby replica is not ready: the Kubernetes Service routes to the leader only).
pub fn router_with_readiness(
    metrics: Arc<Metrics>,
    refresh: impl Fn() + Send + Sync + 'static,
    ready: impl Fn() -> bool + Send + Sync + 'static,
) -> Router {
    clb_telemetry::metrics::router(
        move || {
            refresh();
            metrics.encode()
        },
        ready,
    )
}

/// Serves [`router`] on `listener` until `shutdown` resolves, then finishes open requests.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    refresh: impl Fn() + Send + Sync + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_router(listener, router(metrics, refresh), shutdown).await
}

/// Serves `router` (e.g. [`router_with_readiness`]) on `listener` until `shutdown` resolves.
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    clb_telemetry::metrics::serve(listener, router, shutdown).await
}

/// The observer of the dispatcher of `gateway`: its outcomes and latencies reach `metrics`.
pub fn gateway_observer(metrics: Arc<Metrics>, gateway: &str) -> Arc<dyn DispatchObserver> {
    Arc::new(GatewayObserver {
        metrics,
        gateway: gateway.to_owned(),
    })
}

/// [`Metrics`] seen from the dispatcher of one gateway.
#[derive(Debug)]
struct GatewayObserver {
    metrics: Arc<Metrics>,
    gateway: String,
}

impl DispatchObserver for GatewayObserver {
    fn unit_outcome(&self, kind: &'static str, result: &'static str, code: &str) {
        self.metrics.unit_outcome(kind, result, code);
    }

    fn lease_expired(&self, n: u64) {
        self.metrics.lease_expired(n);
    }

    fn late_report(&self) {
        self.metrics.late_report();
    }

    fn programmed(&self, kind: &'static str, latency: Duration) {
        self.metrics.programmed(&self.gateway, kind, latency);
    }
}

/// The dispatcher's outcomes reach `/metrics` through this (no gateway: no latency).
impl DispatchObserver for Metrics {
    fn unit_outcome(&self, kind: &'static str, result: &'static str, code: &str) {
        Metrics::unit_outcome(self, kind, result, code);
    }

    fn lease_expired(&self, n: u64) {
        Metrics::lease_expired(self, n);
    }

    fn late_report(&self) {
        Metrics::late_report(self);
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
