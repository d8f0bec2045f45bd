//! The harness of the worker tests: a scripted fake state server (the `Worker` gRPC service), the
//! real NRP emulator, the worker under test, and builders of work units.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clb_nrp::azure::{ArmClient, ArmConfig};
use clb_nrp::wire::{
    AddressLocation, GatewayService, LoadBalancer, NatGateway, PublicIpAddress, ServiceGateway,
    UpdateAddressLocationsRequest, UpdateServicesRequest,
};
use clb_nrp::{CallOptions, Nrp, NrpError};
use clb_nrp_emulator::{Emulator, EmulatorConfig, RunningEmulator};
use clb_proto::v1::worker_server::{Worker, WorkerServer};
use clb_proto::v1::{
    self, AddressChange, Hello, LocationChange, LocationWork, Report, ServerMessage, ServiceChange,
    ServicePort, ServiceWork, WorkUnit, WorkerMessage, report, server_message, work_unit,
    worker_message,
};
use clb_sync_worker::metrics::WorkerMetrics;
use clb_sync_worker::worker::{Backoff, Limits, WorkerConfig, WorkerError, run_with_metrics};
use futures::{Stream, StreamExt};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

pub const GW: &str = "gw";
/// A guard against hangs, not a timing assertion: every expected message comes much sooner.
pub const PATIENCE: Duration = Duration::from_secs(60);

// ---- the fake state server ------------------------------------------------------------------------

/// One accepted `Sync` stream, after its `Hello`.
pub struct Conn {
    pub hello: Hello,
    pub to_worker: mpsc::Sender<Result<ServerMessage, Status>>,
    pub from_worker: mpsc::UnboundedReceiver<WorkerMessage>,
}

impl Conn {
    pub async fn send(&self, unit: WorkUnit) {
        let msg = ServerMessage {
            kind: Some(server_message::Kind::Unit(unit)),
        };
        self.to_worker.send(Ok(msg)).await.expect("stream open");
    }

    /// The next report, or `None` when the worker closed the stream.
    pub async fn next_report(&mut self) -> Option<Report> {
        let msg = tokio::time::timeout(PATIENCE, self.from_worker.recv())
            .await
            .expect("the worker answers")?;
        match msg.kind {
            Some(worker_message::Kind::Report(r)) => Some(r),
            other => panic!("expected a report, got {other:?}"),
        }
    }

    pub async fn report(&mut self) -> Report {
        self.next_report().await.expect("a report")
    }

    /// Sends `unit` and returns its (single) report.
    pub async fn run(&mut self, unit: WorkUnit) -> Report {
        let id = unit.work_id;
        self.send(unit).await;
        let r = self.report().await;
        assert_eq!(r.work_id, id);
        r
    }
}

pub struct FakeServer {
    pub conns: mpsc::UnboundedSender<Conn>,
}

#[tonic::async_trait]
impl Worker for FakeServer {
    type SyncStream = Pin<Box<dyn Stream<Item = Result<ServerMessage, Status>> + Send>>;

    async fn sync(
        &self,
        request: Request<Streaming<WorkerMessage>>,
    ) -> Result<Response<Self::SyncStream>, Status> {
        let mut inbound = request.into_inner();
        let (to_worker, rx) = mpsc::channel(64);
        // Like a real server, end the response stream once the worker has half-closed its own.
        let (closed, on_closed) = oneshot::channel::<()>();
        let conns = self.conns.clone();
        tokio::spawn(async move {
            let _closed = closed;
            let Ok(Some(WorkerMessage {
                kind: Some(worker_message::Kind::Hello(hello)),
            })) = inbound.message().await
            else {
                let _ = to_worker
                    .send(Err(Status::invalid_argument("Hello first")))
                    .await;
                return;
            };
            let welcome = v1::Welcome {
                server_id: "fake".into(),
                lease_duration_ms: 60_000,
            };
            let msg = ServerMessage {
                kind: Some(server_message::Kind::Welcome(welcome)),
            };
            if to_worker.send(Ok(msg)).await.is_err() {
                return;
            }
            let (tx, from_worker) = mpsc::unbounded_channel();
            let _ = conns.send(Conn {
                hello,
                to_worker,
                from_worker,
            });
            // Forward until the worker half-closes; dropping `tx` then tells the test.
            while let Ok(Some(m)) = inbound.message().await {
                if tx.send(m).is_err() {
                    break;
                }
            }
        });
        let stream = ReceiverStream::new(rx).take_until(on_closed);
        Ok(Response::new(Box::pin(stream)))
    }
}

// ---- harness --------------------------------------------------------------------------------------

pub struct Harness {
    pub nrp: RunningEmulator,
    /// The worker's metrics.
    pub metrics: Arc<WorkerMetrics>,
    pub conns: mpsc::UnboundedReceiver<Conn>,
    pub stop: Option<oneshot::Sender<()>>,
    pub worker: Option<JoinHandle<Result<(), WorkerError>>>,
}

impl Harness {
    pub async fn start(emulator: EmulatorConfig, limits: Limits) -> Self {
        Self::start_with(emulator, limits, |c| c).await
    }

    /// Like [`Harness::start`], with the worker's NRP client wrapped by `wrap`.
    pub async fn start_with(
        emulator: EmulatorConfig,
        limits: Limits,
        wrap: impl FnOnce(Arc<dyn Nrp>) -> Arc<dyn Nrp>,
    ) -> Self {
        let nrp = RunningEmulator::start(Emulator::new(emulator).unwrap())
            .await
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (conns_tx, conns) = mpsc::unbounded_channel();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(WorkerServer::new(FakeServer { conns: conns_tx }))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        let mut arm = ArmConfig::new("sub1", "rg1").with_endpoint(nrp.base_url());
        arm.poll_interval = Duration::from_millis(1);
        let plain = ArmClient::new(arm, None).unwrap();
        // NRP has a gateway only once it is PUT (as an operator provisions it).
        let gateway = clb_nrp::wire::ServiceGateway {
            location: Some("eastus".into()),
            ..Default::default()
        };
        plain
            .put_service_gateway(GW, &gateway, CallOptions::with_timeout(PATIENCE))
            .await
            .expect("create the test gateway");
        // The tests count the worker's calls only.
        nrp.emulator().reset_stats();
        let client = wrap(Arc::new(plain));
        let mut config = WorkerConfig::new(format!("http://{addr}"), "worker-under-test");
        config.capacity = 3;
        config.limits = limits;
        config.backoff = Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(50),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let metrics = Arc::new(WorkerMetrics::new());
        let worker = tokio::spawn(run_with_metrics(
            config,
            client,
            Arc::clone(&metrics),
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            nrp,
            metrics,
            conns,
            stop: Some(stop),
            worker: Some(worker),
        }
    }

    pub async fn default() -> Self {
        Self::start(EmulatorConfig::default(), Limits::default()).await
    }

    pub fn emulator(&self) -> &Emulator {
        self.nrp.emulator()
    }

    /// Every address of the gateway in NRP as `(location, address) → services`.
    pub fn address_map(&self) -> BTreeMap<(String, String), BTreeSet<String>> {
        self.emulator()
            .dump()
            .gateway(GW)
            .map(|g| g.address_map())
            .unwrap_or_default()
    }

    pub async fn conn(&mut self) -> Conn {
        tokio::time::timeout(PATIENCE, self.conns.recv())
            .await
            .expect("the worker connects")
            .expect("server running")
    }

    /// Completes the worker's shutdown future.
    pub fn request_shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Stops the worker and waits for `run` to return.
    pub async fn shutdown(&mut self) {
        self.request_shutdown();
        if let Some(w) = self.worker.take() {
            tokio::time::timeout(PATIENCE, w)
                .await
                .expect("run returns")
                .unwrap()
                .unwrap();
        }
    }
}

// ---- units ----------------------------------------------------------------------------------------

pub fn now_ms() -> i64 {
    clb_proto::now_unix_ms()
}

pub fn unit(work_id: u64, work: work_unit::Work) -> WorkUnit {
    WorkUnit {
        work_id,
        gateway: GW.into(),
        revision: 1,
        lease_deadline_unix_ms: now_ms() + 600_000,
        lease_duration_ms: 600_000,
        attempt: 1,
        work: Some(work),
        trace_context: Default::default(),
    }
}

pub fn service(
    name: &str,
    kind: v1::ServiceKind,
    action: v1::ServiceAction,
    ports: &[(u32, v1::Protocol)],
) -> ServiceChange {
    let mut c = ServiceChange {
        service_id: name.into(),
        ports: ports
            .iter()
            .map(|&(port, p)| {
                let mut sp = ServicePort {
                    port,
                    ..Default::default()
                };
                sp.set_protocol(p);
                sp
            })
            .collect(),
        ..Default::default()
    };
    c.set_kind(kind);
    c.set_action(action);
    c
}

pub fn inbound(name: &str, action: v1::ServiceAction) -> ServiceChange {
    let ports = [(80, v1::Protocol::Tcp), (53, v1::Protocol::Udp)];
    service(name, v1::ServiceKind::Inbound, action, &ports)
}

pub fn outbound(name: &str, action: v1::ServiceAction) -> ServiceChange {
    service(name, v1::ServiceKind::Outbound, action, &[])
}

pub fn services(work_id: u64, changes: Vec<ServiceChange>) -> WorkUnit {
    unit(
        work_id,
        work_unit::Work::Services(ServiceWork {
            changes,
            side_by_side: 0,
        }),
    )
}

pub fn location(loc: &str, full: bool, addresses: &[(&str, &[&str])]) -> LocationChange {
    let mut c = LocationChange {
        location: loc.into(),
        action: 0,
        addresses: addresses
            .iter()
            .map(|(a, s)| AddressChange {
                address: a.to_string(),
                service_ids: s.iter().map(|s| s.to_string()).collect(),
            })
            .collect(),
    };
    c.set_action(if full {
        v1::AddressUpdateAction::FullUpdate
    } else {
        v1::AddressUpdateAction::PartialUpdate
    });
    c
}

pub fn locations(work_id: u64, locations: Vec<LocationChange>) -> WorkUnit {
    unit(
        work_id,
        work_unit::Work::Locations(LocationWork { locations }),
    )
}

pub fn assert_applied(r: &Report) {
    assert!(
        matches!(r.outcome, Some(report::Outcome::Applied(_))),
        "{r:?}"
    );
}

pub fn retryable(r: &Report) -> &v1::Retryable {
    match &r.outcome {
        Some(report::Outcome::Retryable(x)) => x,
        other => panic!("expected retryable, got {other:?}"),
    }
}

pub fn repair(r: &Report) -> &v1::Repair {
    match &r.outcome {
        Some(report::Outcome::Repair(x)) => x,
        other => panic!("expected repair, got {other:?}"),
    }
}

pub fn terminal(r: &Report) -> &v1::Terminal {
    match &r.outcome {
        Some(report::Outcome::Terminal(x)) => x,
        other => panic!("expected terminal, got {other:?}"),
    }
}

#[allow(unused_imports)] // not every test file deletes
pub use v1::ServiceAction::{Create, Delete};

/// Creates inbound `svc-a` and outbound `egress-e` through the worker.
pub async fn create_services(conn: &mut Conn) {
    let r = conn
        .run(services(
            1,
            vec![inbound("svc-a", Create), outbound("egress-e", Create)],
        ))
        .await;
    assert_applied(&r);
}

pub fn three_locations() -> Vec<LocationChange> {
    vec![
        location(
            "10.0.0.1",
            true,
            &[
                ("10.1.0.1", &["svc-a", "egress-e"]),
                ("10.1.0.2", &["svc-a"]),
            ],
        ),
        location("10.0.0.2", false, &[("10.1.0.3", &["svc-a"])]),
        location("10.0.0.3", true, &[("10.1.0.4", &["egress-e"])]),
    ]
}

// ---- an NRP client that holds updateAddressLocations calls -----------------------------------------

/// Delegates to `inner`, except that each `updateAddressLocations` call first announces itself on
/// `entered` and then waits for a permit of `release`, so that a test can act while a call is under
/// way.
pub struct GatedNrp {
    pub inner: Arc<dyn Nrp>,
    pub entered: mpsc::UnboundedSender<()>,
    pub release: Arc<Semaphore>,
}

#[async_trait]
impl Nrp for GatedNrp {
    fn remaining_subscription_writes(&self) -> Option<u32> {
        self.inner.remaining_subscription_writes()
    }

    fn writes_answered(&self) -> u64 {
        self.inner.writes_answered()
    }

    async fn get_service_gateway(
        &self,
        g: &str,
        o: CallOptions,
    ) -> Result<ServiceGateway, NrpError> {
        self.inner.get_service_gateway(g, o).await
    }
    async fn put_service_gateway(
        &self,
        g: &str,
        b: &ServiceGateway,
        o: CallOptions,
    ) -> Result<ServiceGateway, NrpError> {
        self.inner.put_service_gateway(g, b, o).await
    }
    async fn list_services(
        &self,
        g: &str,
        o: CallOptions,
    ) -> Result<Vec<GatewayService>, NrpError> {
        self.inner.list_services(g, o).await
    }
    async fn list_address_locations(
        &self,
        g: &str,
        o: CallOptions,
    ) -> Result<Vec<AddressLocation>, NrpError> {
        self.inner.list_address_locations(g, o).await
    }
    async fn update_services(
        &self,
        g: &str,
        r: &UpdateServicesRequest,
        o: CallOptions,
    ) -> Result<(), NrpError> {
        self.inner.update_services(g, r, o).await
    }
    async fn update_address_locations(
        &self,
        g: &str,
        r: &UpdateAddressLocationsRequest,
        o: CallOptions,
    ) -> Result<(), NrpError> {
        let _ = self.entered.send(());
        self.release.acquire().await.expect("open").forget();
        self.inner.update_address_locations(g, r, o).await
    }
    async fn get_public_ip(&self, n: &str, o: CallOptions) -> Result<PublicIpAddress, NrpError> {
        self.inner.get_public_ip(n, o).await
    }
    async fn put_public_ip(
        &self,
        n: &str,
        b: &PublicIpAddress,
        o: CallOptions,
    ) -> Result<PublicIpAddress, NrpError> {
        self.inner.put_public_ip(n, b, o).await
    }
    async fn delete_public_ip(&self, n: &str, o: CallOptions) -> Result<(), NrpError> {
        self.inner.delete_public_ip(n, o).await
    }
    async fn find_public_ips(
        &self,
        n: &[String],
        o: CallOptions,
    ) -> Result<Vec<PublicIpAddress>, NrpError> {
        self.inner.find_public_ips(n, o).await
    }
    async fn find_load_balancers(
        &self,
        n: &[String],
        o: CallOptions,
    ) -> Result<Vec<LoadBalancer>, NrpError> {
        self.inner.find_load_balancers(n, o).await
    }
    async fn get_load_balancer(&self, n: &str, o: CallOptions) -> Result<LoadBalancer, NrpError> {
        self.inner.get_load_balancer(n, o).await
    }
    async fn put_load_balancer(
        &self,
        n: &str,
        b: &LoadBalancer,
        o: CallOptions,
    ) -> Result<LoadBalancer, NrpError> {
        self.inner.put_load_balancer(n, b, o).await
    }
    async fn delete_load_balancer(&self, n: &str, o: CallOptions) -> Result<(), NrpError> {
        self.inner.delete_load_balancer(n, o).await
    }
    async fn get_nat_gateway(&self, n: &str, o: CallOptions) -> Result<NatGateway, NrpError> {
        self.inner.get_nat_gateway(n, o).await
    }
    async fn put_nat_gateway(
        &self,
        n: &str,
        b: &NatGateway,
        o: CallOptions,
    ) -> Result<NatGateway, NrpError> {
        self.inner.put_nat_gateway(n, b, o).await
    }
    async fn delete_nat_gateway(&self, n: &str, o: CallOptions) -> Result<(), NrpError> {
        self.inner.delete_nat_gateway(n, o).await
    }

    async fn get_public_ip_in(
        &self,
        rg: &str,
        n: &str,
        o: CallOptions,
    ) -> Result<PublicIpAddress, NrpError> {
        self.inner.get_public_ip_in(rg, n, o).await
    }
    async fn find_public_ip_by_address(
        &self,
        a: &str,
        o: CallOptions,
    ) -> Result<Option<PublicIpAddress>, NrpError> {
        self.inner.find_public_ip_by_address(a, o).await
    }
    async fn get_nat_gateway_in(
        &self,
        rg: &str,
        n: &str,
        o: CallOptions,
    ) -> Result<NatGateway, NrpError> {
        self.inner.get_nat_gateway_in(rg, n, o).await
    }
    async fn put_nat_gateway_in(
        &self,
        rg: &str,
        n: &str,
        b: &NatGateway,
        o: CallOptions,
    ) -> Result<NatGateway, NrpError> {
        self.inner.put_nat_gateway_in(rg, n, b, o).await
    }
}
