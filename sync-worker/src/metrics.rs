//! Prometheus metrics of the sync worker, served on `--metrics-listen` by [`clb_telemetry::metrics`]
//! (docs/metrics.md lists them).
//!
//! Every NRP call goes through [`MeteredNrp`], which counts it by operation and result (ARM code),
//! times it and counts throttling answers. The adaptive concurrency limit of each gateway is read
//! from the worker's limiters at each scrape, and `clb_worker_connected` follows the session with
//! the (leading) state server: it is also what `/readyz` answers.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use async_trait::async_trait;
use clb_nrp::wire::{
    AddressLocation, GatewayService, LoadBalancer, NatGateway, PublicIpAddress, ServiceGateway,
    UpdateAddressLocationsRequest, UpdateServicesRequest,
};
use clb_nrp::{CallOptions, Nrp, NrpError};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::worker::GatewayLimiters;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    operation: String,
    result: String,
    code: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GatewayLabels {
    gateway: String,
}

type DurationFamily = Family<OperationLabels, Histogram, fn() -> Histogram>;

/// The worker's metrics and their registry.
#[derive(Debug)]
pub struct WorkerMetrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: DurationFamily,
    throttles: Family<OperationLabels, Counter>,
    limit: Family<GatewayLabels, Gauge>,
    connected: Gauge,
    sessions: Counter,
    refusal_split_calls: Counter,
    connected_now: AtomicBool,
    limiters: Mutex<Option<Arc<GatewayLimiters>>>,
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl WorkerMetrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("clb");
        clb_telemetry::metrics::register_build_info(&mut registry);
        let requests = Family::<RequestLabels, Counter>::default();
        // 10 ms doubling to ~82 s: a long-running operation is awaited to its end.
        let durations: DurationFamily =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.01, 2.0, 14)));
        let throttles = Family::<OperationLabels, Counter>::default();
        let limit = Family::<GatewayLabels, Gauge>::default();
        let connected = Gauge::default();
        let sessions = Counter::default();
        let refusal_split_calls = Counter::default();
        registry.register(
            "worker_nrp_requests",
            "NRP calls, by operation, result (ok or the error kind: throttled, conflict, not_found, \
             validation, server, timeout, transport, auth, deadline_exceeded, unconfirmed, \
             operation_failed) and ARM error code (empty when ok)",
            requests.clone(),
        );
        registry.register_with_unit(
            "worker_nrp_request_duration",
            "Duration of NRP calls (a long-running operation until its end), by operation",
            Unit::Seconds,
            durations.clone(),
        );
        registry.register(
            "worker_nrp_throttles",
            "NRP calls answered with throttling (429, or 409 AnotherOperationInProgress), by operation",
            throttles.clone(),
        );
        registry.register(
            "worker_concurrency_limit",
            "Adaptive (AIMD) limit of concurrent mutating NRP calls, by gateway",
            limit.clone(),
        );
        registry.register(
            "worker_connected",
            "1 while a session with the leading state server is established (Welcome received)",
            connected.clone(),
        );
        registry.register(
            "worker_sessions",
            "Sessions established with the state server (a reconnection counts one more)",
            sessions.clone(),
        );
        registry.register(
            "worker_refusal_split_calls",
            "Extra updateAddressLocations calls sent to find the location changes that cause a \
             call's refusal and send the others (docs/errors.md, \"A refused call is split\")",
            refusal_split_calls.clone(),
        );
        Self {
            registry,
            requests,
            durations,
            throttles,
            limit,
            connected,
            sessions,
            refusal_split_calls,
            connected_now: AtomicBool::new(false),
            limiters: Mutex::new(None),
        }
    }

    /// Counts and times one NRP call of `operation` that took `seconds` and ended with `result`.
    pub fn nrp_call(&self, operation: &str, seconds: f64, result: Result<(), &NrpError>) {
        let (kind, code) = match result {
            Ok(()) => ("ok", ""),
            Err(e) => (e.metric_label(), e.code()),
        };
        let op = OperationLabels {
            operation: operation.to_owned(),
        };
        // The duration first: a scrape never sees a call counted but not timed.
        self.durations.get_or_create(&op).observe(seconds);
        self.requests
            .get_or_create(&RequestLabels {
                operation: operation.to_owned(),
                result: kind.to_owned(),
                code: code.to_owned(),
            })
            .inc();
        if let Err(e) = result
            && e.is_throttling()
        {
            self.throttles.get_or_create(&op).inc();
        }
    }

    /// Counts one extra call sent to split a refused `updateAddressLocations` call.
    pub fn refusal_split_call(&self) {
        self.refusal_split_calls.inc();
    }

    /// The extra calls sent to split refused calls so far.
    pub fn refusal_split_calls(&self) -> u64 {
        self.refusal_split_calls.get()
    }

    /// The limiters whose limits `clb_worker_concurrency_limit` shows.
    pub fn watch_limiters(&self, limiters: Arc<GatewayLimiters>) {
        *self.limiters.lock().unwrap_or_else(PoisonError::into_inner) = Some(limiters);
    }

    /// Marks the session with the state server as established (`true`) or ended.
    pub fn set_connected(&self, connected: bool) {
        if connected && !self.connected_now.swap(true, Ordering::SeqCst) {
            self.sessions.inc();
        }
        if !connected {
            self.connected_now.store(false, Ordering::SeqCst);
        }
        self.connected.set(i64::from(connected));
    }

    /// Whether the worker is connected to the leading state server (what `/readyz` answers).
    pub fn is_connected(&self) -> bool {
        self.connected_now.load(Ordering::SeqCst)
    }

    /// Brings the limit gauges up to date.
    pub fn refresh(&self) {
        let limiters = self
            .limiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(limiters) = limiters {
            for (gateway, limit) in limiters.limits() {
                self.limit
                    .get_or_create(&GatewayLabels { gateway })
                    .set(i64::try_from(limit).unwrap_or(i64::MAX));
            }
        }
    }

    /// All metrics in the OpenMetrics text format (gauges refreshed first).
    pub fn encode(&self) -> String {
        self.refresh();
        clb_telemetry::metrics::encode(&self.registry)
    }

    /// The `/metrics`, `/healthz` and `/readyz` routes of the worker (`/readyz`: connected).
    pub fn router(self: &Arc<Self>) -> axum::Router {
        let (m, r) = (Arc::clone(self), Arc::clone(self));
        clb_telemetry::metrics::router(move || m.encode(), move || r.is_connected())
    }
}

/// An [`Nrp`] that records every call in [`WorkerMetrics`] and passes it on.
pub struct MeteredNrp {
    inner: Arc<dyn Nrp>,
    metrics: Arc<WorkerMetrics>,
}

impl MeteredNrp {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Nrp>, metrics: Arc<WorkerMetrics>) -> Self {
        Self { inner, metrics }
    }

    async fn call<T>(
        &self,
        operation: &'static str,
        fut: impl Future<Output = Result<T, NrpError>>,
    ) -> Result<T, NrpError> {
        let started = Instant::now();
        let r = fut.await;
        let seconds = started.elapsed().as_secs_f64();
        self.metrics
            .nrp_call(operation, seconds, r.as_ref().map(|_| ()));
        r
    }
}

#[async_trait]
impl Nrp for MeteredNrp {
    fn remaining_subscription_writes(&self) -> Option<u32> {
        self.inner.remaining_subscription_writes()
    }

    fn writes_answered(&self) -> u64 {
        self.inner.writes_answered()
    }

    async fn get_service_gateway(
        &self,
        gateway: &str,
        opts: CallOptions,
    ) -> Result<ServiceGateway, NrpError> {
        self.call(
            "get_service_gateway",
            self.inner.get_service_gateway(gateway, opts),
        )
        .await
    }

    async fn put_service_gateway(
        &self,
        gateway: &str,
        body: &ServiceGateway,
        opts: CallOptions,
    ) -> Result<ServiceGateway, NrpError> {
        self.call(
            "put_service_gateway",
            self.inner.put_service_gateway(gateway, body, opts),
        )
        .await
    }

    async fn list_services(
        &self,
        gateway: &str,
        opts: CallOptions,
    ) -> Result<Vec<GatewayService>, NrpError> {
        self.call("list_services", self.inner.list_services(gateway, opts))
            .await
    }

    async fn list_address_locations(
        &self,
        gateway: &str,
        opts: CallOptions,
    ) -> Result<Vec<AddressLocation>, NrpError> {
        self.call(
            "list_address_locations",
            self.inner.list_address_locations(gateway, opts),
        )
        .await
    }

    async fn update_services(
        &self,
        gateway: &str,
        request: &UpdateServicesRequest,
        opts: CallOptions,
    ) -> Result<(), NrpError> {
        self.call(
            "update_services",
            self.inner.update_services(gateway, request, opts),
        )
        .await
    }

    async fn update_address_locations(
        &self,
        gateway: &str,
        request: &UpdateAddressLocationsRequest,
        opts: CallOptions,
    ) -> Result<(), NrpError> {
        self.call(
            "update_address_locations",
            self.inner.update_address_locations(gateway, request, opts),
        )
        .await
    }

    async fn get_public_ip(
        &self,
        name: &str,
        opts: CallOptions,
    ) -> Result<PublicIpAddress, NrpError> {
        self.call("get_public_ip", self.inner.get_public_ip(name, opts))
            .await
    }

    async fn put_public_ip(
        &self,
        name: &str,
        body: &PublicIpAddress,
        opts: CallOptions,
    ) -> Result<PublicIpAddress, NrpError> {
        self.call("put_public_ip", self.inner.put_public_ip(name, body, opts))
            .await
    }

    async fn delete_public_ip(&self, name: &str, opts: CallOptions) -> Result<(), NrpError> {
        self.call("delete_public_ip", self.inner.delete_public_ip(name, opts))
            .await
    }

    async fn find_public_ips(
        &self,
        names: &[String],
        opts: CallOptions,
    ) -> Result<Vec<PublicIpAddress>, NrpError> {
        self.call("find_public_ips", self.inner.find_public_ips(names, opts))
            .await
    }

    async fn get_load_balancer(
        &self,
        name: &str,
        opts: CallOptions,
    ) -> Result<LoadBalancer, NrpError> {
        self.call(
            "get_load_balancer",
            self.inner.get_load_balancer(name, opts),
        )
        .await
    }

    async fn find_load_balancers(
        &self,
        names: &[String],
        opts: CallOptions,
    ) -> Result<Vec<LoadBalancer>, NrpError> {
        self.call(
            "find_load_balancers",
            self.inner.find_load_balancers(names, opts),
        )
        .await
    }

    async fn put_load_balancer(
        &self,
        name: &str,
        body: &LoadBalancer,
        opts: CallOptions,
    ) -> Result<LoadBalancer, NrpError> {
        self.call(
            "put_load_balancer",
            self.inner.put_load_balancer(name, body, opts),
        )
        .await
    }

    async fn delete_load_balancer(&self, name: &str, opts: CallOptions) -> Result<(), NrpError> {
        self.call(
            "delete_load_balancer",
            self.inner.delete_load_balancer(name, opts),
        )
        .await
    }

    async fn get_nat_gateway(&self, name: &str, opts: CallOptions) -> Result<NatGateway, NrpError> {
        self.call("get_nat_gateway", self.inner.get_nat_gateway(name, opts))
            .await
    }

    async fn put_nat_gateway(
        &self,
        name: &str,
        body: &NatGateway,
        opts: CallOptions,
    ) -> Result<NatGateway, NrpError> {
        self.call(
            "put_nat_gateway",
            self.inner.put_nat_gateway(name, body, opts),
        )
        .await
    }

    async fn delete_nat_gateway(&self, name: &str, opts: CallOptions) -> Result<(), NrpError> {
        self.call(
            "delete_nat_gateway",
            self.inner.delete_nat_gateway(name, opts),
        )
        .await
    }

    async fn get_public_ip_in(
        &self,
        resource_group: &str,
        name: &str,
        opts: CallOptions,
    ) -> Result<PublicIpAddress, NrpError> {
        self.call(
            "get_public_ip_in",
            self.inner.get_public_ip_in(resource_group, name, opts),
        )
        .await
    }

    async fn find_public_ip_by_address(
        &self,
        address: &str,
        opts: CallOptions,
    ) -> Result<Option<PublicIpAddress>, NrpError> {
        self.call(
            "find_public_ip_by_address",
            self.inner.find_public_ip_by_address(address, opts),
        )
        .await
    }

    async fn get_nat_gateway_in(
        &self,
        resource_group: &str,
        name: &str,
        opts: CallOptions,
    ) -> Result<NatGateway, NrpError> {
        self.call(
            "get_nat_gateway_in",
            self.inner.get_nat_gateway_in(resource_group, name, opts),
        )
        .await
    }

    async fn put_nat_gateway_in(
        &self,
        resource_group: &str,
        name: &str,
        body: &NatGateway,
        opts: CallOptions,
    ) -> Result<NatGateway, NrpError> {
        self.call(
            "put_nat_gateway_in",
            self.inner
                .put_nat_gateway_in(resource_group, name, body, opts),
        )
        .await
    }
}
