//! The whole system in one process over loopback: the NRP emulator (HTTP), the state server (gRPC)
//! and N sync workers (each a [`worker::run`] task with its own shutdown, so that a test can stop or
//! kill one), every server on port 0.
//!
//! [`Harness::converge`] waits until the server has nothing left to do (no pending diff, no unit in
//! flight, no NRP call in flight) and then compares the emulator's state with the expected state.
//! Its timeout only bounds a hung test; it is never a performance claim.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clb_core::dispatch::DispatchConfig;
use clb_nrp::Nrp;
use clb_nrp::azure::{ArmClient, ArmConfig};
use clb_nrp_emulator::{Emulator, EmulatorConfig, RunningEmulator};
use clb_proto::v1::admin_client::AdminClient;
use clb_proto::v1::worker_client::WorkerClient;
use clb_proto::v1::{
    DiffQuery, GatewayStatus, Hello, PendingDiffResponse, ServerMessage, StatusRequest,
    StatusResponse, WorkUnit, WorkerMessage, server_message, worker_message,
};
use clb_state_server::auth::Auth;
use clb_state_server::grpc::ServeOptions;
use clb_state_server::state::{ServerConfig, StateServer};
use clb_sync_worker::worker::{
    self, Backoff, Limits, WorkerConfig, WorkerError, load_balancer_name, nat_gateway_name,
    public_ip_name,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::cluster::Expected;
use clb_client::client::{Client, ConnectOptions, Writer};
use clb_client::token::{CallInterceptor, TokenFile};

/// An Admin client that sends the harness's bearer token (if any) with every call.
pub type Admin = AdminClient<InterceptedService<Channel, CallInterceptor>>;

/// An [`Admin`] client of the server at `url`, sending the token of `token_file` if given.
pub async fn admin_client(url: String, token_file: Option<std::path::PathBuf>) -> Admin {
    let channel = Endpoint::from_shared(url)
        .expect("a valid URL")
        .connect()
        .await
        .expect("admin connects");
    AdminClient::with_interceptor(
        channel,
        CallInterceptor::new(token_file.map(TokenFile::new)),
    )
}

/// Authentication and authorization on: the server checks every call with `server`, and the
/// harness's clients send tokens from files.
#[derive(Debug, Clone)]
pub struct HarnessAuth {
    /// The state server's checks (e.g. against a Kubernetes API's TokenReview and
    /// SubjectAccessReview).
    pub server: Arc<Auth>,
    /// Token file of the writers and Admin readers the harness connects.
    pub client_token: std::path::PathBuf,
    /// Token file of the sync workers.
    pub worker_token: std::path::PathBuf,
}

/// Source name of the cluster-wide watcher.
pub const WATCHER: &str = "watcher";

/// The gateway the state server drives by default (and the Service Gateway's name in NRP).
pub const GATEWAY: &str = "default";

/// Upper bound of any wait in the end-to-end tests: a guard against hangs, not a timing assertion.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// How to start the system.
#[derive(Debug, Clone)]
pub struct Options {
    /// Workers started with the harness (named `w0`, `w1`, …).
    pub workers: usize,
    /// Units each worker holds at once.
    pub worker_capacity: u32,
    /// The workers' limits on NRP calls.
    pub worker_limits: Limits,
    /// The emulator's cost and fault model.
    pub emulator: EmulatorConfig,
    /// The state server's configuration (the same after a restart, with a new server id).
    pub server: ServerConfig,
    /// Authentication and authorization; `None` checks nothing (the server on loopback, as the
    /// demo runs it).
    pub auth: Option<HarnessAuth>,
}

impl Options {
    /// Defaults for the end-to-end tests: 3 workers, an emulator with 2 ms per call and no faults,
    /// a server that waits for the watcher's resync, small packing limits (so that a small cluster
    /// still makes several units) and short retry delays.
    pub fn e2e() -> Self {
        Self {
            workers: 3,
            worker_capacity: 4,
            worker_limits: Limits {
                max_locations_per_call: 8,
                ..Limits::default()
            },
            emulator: EmulatorConfig {
                latency_ms: 2,
                latency_per_address_us: 10,
                ..EmulatorConfig::default()
            },
            server: ServerConfig {
                server_id: "state-server-1".into(),
                expected_writers: vec![WATCHER.into()],
                dispatch: DispatchConfig {
                    lease: Duration::from_secs(10),
                    max_locations_per_unit: 8,
                    retry_base: Duration::from_millis(20),
                    retry_max: Duration::from_millis(500),
                    ..DispatchConfig::default()
                },
                ..ServerConfig::default()
            },
            auth: None,
        }
    }

    fn serve_options(&self) -> ServeOptions {
        ServeOptions {
            tls: None,
            auth: self.auth.as_ref().map(|a| a.server.clone()),
        }
    }

    fn client_token(&self) -> Option<std::path::PathBuf> {
        self.auth.as_ref().map(|a| a.client_token.clone())
    }
}

/// A state server running in a task.
#[derive(Debug)]
pub struct ServerProc {
    /// Its shared state (for white-box checks).
    pub state: Arc<StateServer>,
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl ServerProc {
    /// Starts a state server with `config` on `127.0.0.1:0`.
    pub async fn start(config: ServerConfig) -> Self {
        Self::start_with(config, ServeOptions::default()).await
    }

    /// [`ServerProc::start`] serving with `options` (authentication, authorization).
    pub async fn start_with(config: ServerConfig, options: ServeOptions) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("bound");
        let state = StateServer::new(config);
        let (stop, stopped) = oneshot::channel::<()>();
        let s = state.clone();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(e) = clb_state_server::grpc::serve_with(listener, s, options, shutdown).await
            {
                eprintln!("state server ended: {e}");
            }
        });
        Self {
            state,
            addr,
            stop: Some(stop),
            task,
        }
    }

    /// `http://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Asks the server to shut down (streams end, sessions release their units).
    pub fn request_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Kills the server as a crash would, as far as one process can: it stops leading at once (no
    /// unit is cut any more, worker streams end) and its task is aborted without a graceful
    /// shutdown; a Lease it holds is not released.
    pub async fn kill(mut self) {
        self.state.set_leader(false);
        self.request_stop();
        self.task.abort();
        let _ = self.task.await;
    }

    /// Shuts the server down; if it has not ended within `grace`, it is aborted.
    pub async fn stop(mut self, grace: Duration) {
        self.request_stop();
        if tokio::time::timeout(grace, &mut self.task).await.is_err() {
            self.task.abort();
            let _ = self.task.await;
        }
    }
}

/// A sync worker running in a task.
#[derive(Debug)]
pub struct WorkerProc {
    /// Its worker id.
    pub id: String,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), WorkerError>>,
}

impl WorkerProc {
    /// The ARM client of a worker talking to the NRP (emulator) at `nrp_url`.
    pub fn arm_client(nrp_url: &str) -> Arc<dyn Nrp> {
        let mut arm = ArmConfig::new("sub-e2e", "rg-e2e").with_endpoint(nrp_url);
        arm.poll_interval = Duration::from_millis(5);
        Arc::new(ArmClient::new(arm, None).expect("valid ARM config"))
    }

    /// Starts worker `id` against the state server at `server_url`, talking to NRP through `nrp`.
    /// Its reconnect backoff is short (20–200 ms), for tests.
    pub fn start(id: &str, server_url: &str, nrp: Arc<dyn Nrp>, options: &Options) -> Self {
        let backoff = Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
        };
        Self::start_with_backoff(id, server_url, nrp, options, backoff)
    }

    /// [`WorkerProc::start`] with the given reconnect backoff (`Backoff::default()` is the
    /// binary's).
    pub fn start_with_backoff(
        id: &str,
        server_url: &str,
        nrp: Arc<dyn Nrp>,
        options: &Options,
        backoff: Backoff,
    ) -> Self {
        let mut config = WorkerConfig::new(server_url, id);
        config.capacity = options.worker_capacity;
        config.limits = options.worker_limits;
        config.backoff = backoff;
        config.token_file = options.auth.as_ref().map(|a| a.worker_token.clone());
        config.shutdown_grace = Duration::from_secs(5);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(worker::run(config, nrp, async move {
            let _ = stopped.await;
        }));
        Self {
            id: id.to_owned(),
            stop: Some(stop),
            task,
        }
    }

    /// Kills the worker at once, as a crash would: its task is aborted mid-call, its stream and its
    /// HTTP connections are dropped without a goodbye.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    /// Shuts the worker down gracefully (in-flight calls may finish and report).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match tokio::time::timeout(PATIENCE, &mut self.task).await {
            Ok(r) => r.expect("worker task").expect("worker config"),
            Err(_) => panic!("worker {} did not stop", self.id),
        }
    }
}

/// A worker that takes one unit and never reports it: it holds the unit's lease until it is
/// dropped (then the server releases the unit at once, as for any disconnected worker).
#[derive(Debug)]
pub struct StalledWorker {
    /// The unit it holds.
    pub unit: WorkUnit,
    _to_server: mpsc::Sender<WorkerMessage>,
    _from_server: tonic::Streaming<ServerMessage>,
}

impl StalledWorker {
    /// Connects to the state server at `url` with a capacity of 1 and waits for its first unit.
    pub async fn connect(url: &str, id: &str) -> Self {
        let mut client = WorkerClient::connect(url.to_owned())
            .await
            .expect("worker connects");
        let (tx, rx) = mpsc::channel(4);
        tx.send(WorkerMessage {
            kind: Some(worker_message::Kind::Hello(Hello {
                worker_id: id.to_owned(),
                capacity: 1,
                gateways: Vec::new(),
            })),
        })
        .await
        .expect("stream open");
        let mut stream = client
            .sync(ReceiverStream::new(rx))
            .await
            .expect("sync accepted")
            .into_inner();
        loop {
            let msg = tokio::time::timeout(PATIENCE, stream.message())
                .await
                .expect("a unit comes")
                .expect("stream healthy")
                .expect("stream open");
            if let Some(server_message::Kind::Unit(unit)) = msg.kind {
                return Self {
                    unit,
                    _to_server: tx,
                    _from_server: stream,
                };
            }
        }
    }
}

/// The system under test: NRP emulator, state server, workers.
#[derive(Debug)]
pub struct Harness {
    nrp: RunningEmulator,
    server: ServerProc,
    admin: Admin,
    workers: Vec<WorkerProc>,
    options: Options,
    generation: u32,
}

impl Harness {
    /// Starts the emulator, the state server and `options.workers` workers.
    pub async fn start(options: Options) -> Self {
        let nrp = start_emulator(options.emulator.clone()).await;
        let server = ServerProc::start_with(options.server.clone(), options.serve_options()).await;
        let admin = admin_client(server.url(), options.client_token()).await;
        let mut h = Self {
            nrp,
            server,
            admin,
            workers: Vec::new(),
            options,
            generation: 1,
        };
        for i in 0..h.options.workers {
            h.spawn_worker(&format!("w{i}"));
        }
        h
    }

    /// The emulator (state, stats, removal log, configuration).
    pub fn emulator(&self) -> &Emulator {
        self.nrp.emulator()
    }

    /// The emulator's base URL.
    pub fn nrp_url(&self) -> String {
        self.nrp.base_url()
    }

    /// The state server's URL.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The running state server.
    pub fn server(&self) -> &ServerProc {
        &self.server
    }

    /// The options the harness was started with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// A writer connected as the watcher.
    pub async fn watcher(&self) -> Writer {
        self.client().await.writer(WATCHER)
    }

    /// A typed client of the state server.
    pub async fn client(&self) -> Client {
        let mut options = ConnectOptions::new(self.url());
        options.token_file = self.options.client_token();
        Client::connect(options).await.expect("client connects")
    }

    /// Ids of the running workers.
    pub fn worker_ids(&self) -> Vec<String> {
        self.workers.iter().map(|w| w.id.clone()).collect()
    }

    /// Starts another worker named `id`.
    pub fn spawn_worker(&mut self, id: &str) {
        self.spawn_worker_with(id, |nrp| nrp);
    }

    /// Starts another worker named `id` whose NRP client is wrapped by `wrap` (e.g.
    /// `clb_tests::nrp::Detached::wrap`).
    pub fn spawn_worker_with(&mut self, id: &str, wrap: impl FnOnce(Arc<dyn Nrp>) -> Arc<dyn Nrp>) {
        let nrp = wrap(WorkerProc::arm_client(&self.nrp_url()));
        let w = WorkerProc::start(id, &self.url(), nrp, &self.options);
        self.workers.push(w);
    }

    fn take_worker(&mut self, id: &str) -> WorkerProc {
        let i = self
            .workers
            .iter()
            .position(|w| w.id == id)
            .unwrap_or_else(|| panic!("no worker {id}"));
        self.workers.remove(i)
    }

    /// Kills worker `id` (task aborted, as a crash).
    pub async fn kill_worker(&mut self, id: &str) {
        self.take_worker(id).kill().await;
    }

    /// Stops worker `id` gracefully.
    pub async fn stop_worker(&mut self, id: &str) {
        self.take_worker(id).stop().await;
    }

    /// Restarts the state server: the running one is shut down and the workers with it; a new one
    /// (new server id, same configuration) starts on a new port, and the workers are started again
    /// pointed at it. Its DiffTracker starts empty: the watcher must resync, and the workers'
    /// first observe reads NRP back.
    pub async fn restart_server(&mut self) {
        for id in self.restart_server_without_workers().await {
            self.spawn_worker(&id);
        }
    }

    /// Like [`Harness::restart_server`], but the workers are not started again: their ids are
    /// returned, for the test to start them when it wants.
    pub async fn restart_server_without_workers(&mut self) -> Vec<String> {
        self.server.request_stop();
        let ids = self.worker_ids();
        let stops = std::mem::take(&mut self.workers)
            .into_iter()
            .map(WorkerProc::stop);
        for s in stops {
            s.await;
        }
        self.generation += 1;
        let mut config = self.options.server.clone();
        config.server_id = format!("state-server-{}", self.generation);
        let new = ServerProc::start_with(config, self.options.serve_options()).await;
        let old = std::mem::replace(&mut self.server, new);
        old.stop(Duration::from_secs(5)).await;
        self.admin = admin_client(self.server.url(), self.options.client_token()).await;
        ids
    }

    /// `Admin.Status`.
    pub async fn status(&self) -> StatusResponse {
        self.admin
            .clone()
            .status(StatusRequest {})
            .await
            .expect("status")
            .into_inner()
    }

    /// The default gateway's status.
    pub async fn gateway_status(&self) -> GatewayStatus {
        self.status()
            .await
            .gateways
            .into_iter()
            .next()
            .expect("a gateway")
    }

    /// `Admin.PendingDiff` of the default gateway (server's default limit).
    pub async fn pending_diff(&self) -> PendingDiffResponse {
        self.admin
            .clone()
            .pending_diff(DiffQuery {
                gateway: String::new(),
                limit: 0,
            })
            .await
            .expect("pending diff")
            .into_inner()
    }

    /// Waits until the server has nothing left to send: removals allowed (gates open), no pending
    /// diff, no unit in flight, and no mutating NRP call in flight, twice in a row at the same
    /// revision.
    pub async fn wait_idle(&self, timeout: Duration) -> Result<(), String> {
        self.wait_quiet(timeout, true).await
    }

    /// Like [`Harness::wait_idle`], without waiting for NRP calls that no unit accounts for any more
    /// (e.g. a killed worker's).
    pub async fn wait_server_idle(&self, timeout: Duration) -> Result<(), String> {
        self.wait_quiet(timeout, false).await
    }

    async fn wait_quiet(&self, timeout: Duration, nrp_too: bool) -> Result<(), String> {
        wait_quiet_at(&self.admin, self.emulator(), timeout, nrp_too).await
    }

    /// Compares the emulator's state with `expected`: the same services (of the right kind), the
    /// same addresses at the same locations with the same services — desired refs filtered to the
    /// services NRP has — no empty location, and exactly the load balancers, NAT gateways and public
    /// IPs of the expected services.
    pub fn compare(&self, expected: &Expected) -> Result<(), String> {
        compare_nrp(self.emulator(), expected)
    }

    /// [`Harness::wait_idle`] then [`Harness::compare`].
    pub async fn try_converge(&self, expected: &Expected, timeout: Duration) -> Result<(), String> {
        self.wait_idle(timeout).await?;
        self.compare(expected)
    }

    /// [`Harness::try_converge`], panicking with the differences on failure.
    pub async fn converge(&self, expected: &Expected, timeout: Duration) {
        if let Err(e) = self.try_converge(expected, timeout).await {
            panic!("{e}");
        }
    }

    /// Waits until `pred` holds for the default gateway's status (polling), or panics after `timeout`.
    pub async fn wait_status(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&StatusResponse) -> bool,
    ) {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.status().await;
            if pred(&s) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: not after {timeout:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Shuts everything down.
    pub async fn shutdown(mut self) {
        self.server.request_stop();
        for w in std::mem::take(&mut self.workers) {
            w.kill().await;
        }
        self.server.stop(Duration::from_secs(5)).await;
        let _ = self.nrp.shutdown().await;
    }
}

/// An emulator with the default gateway created (before `config` applies, as an operator
/// creates it before installing clb: the costs and faults of `config` are the system's to meet).
pub async fn start_emulator(config: EmulatorConfig) -> RunningEmulator {
    let nrp = RunningEmulator::start(Emulator::new(EmulatorConfig::default()).expect("default"))
        .await
        .expect("emulator starts");
    create_gateway(&nrp.base_url(), GATEWAY).await;
    nrp.emulator()
        .set_config(config)
        .expect("valid emulator config");
    nrp
}

/// Creates the service gateway `name` on the NRP (emulator) at `nrp_url` with a PUT, as an operator
/// provisions one in Azure, in the subscription and resource group of [`WorkerProc::arm_client`]: NRP
/// (and the emulator by default) has a gateway only once it is PUT.
pub async fn create_gateway(nrp_url: &str, name: &str) {
    let gateway = clb_nrp::wire::ServiceGateway {
        location: Some("eastus".into()),
        sku: Some(clb_nrp::wire::Sku::standard()),
        ..Default::default()
    };
    WorkerProc::arm_client(nrp_url)
        .put_service_gateway(name, &gateway, clb_nrp::CallOptions::with_timeout(PATIENCE))
        .await
        .unwrap_or_else(|e| panic!("creating service gateway {name}: {e}"));
}

/// Compares `emulator`'s state with `expected` (see [`Harness::compare`]).
pub fn compare_nrp(emulator: &Emulator, expected: &Expected) -> Result<(), String> {
    let dump = emulator.dump();
    let empty = Default::default();
    let gw = dump.gateway(GATEWAY).unwrap_or(&empty);
    let mut errors = Vec::new();
    let mut inbound = BTreeSet::new();
    let mut outbound = BTreeSet::new();
    for s in &gw.services {
        if s.service_type.is_inbound() {
            inbound.insert(s.name.clone());
        }
        if s.service_type.is_outbound() {
            outbound.insert(s.name.clone());
        }
    }
    set_diff(&mut errors, "inbound service", &expected.inbound, &inbound);
    set_diff(
        &mut errors,
        "outbound service",
        &expected.outbound,
        &outbound,
    );
    // The readiness filter: an address refers only to services NRP has.
    let nrp_services = gw.service_names();
    let want: BTreeMap<(String, String), BTreeSet<String>> = expected
        .addresses
        .iter()
        .map(|(k, v)| {
            let ready: BTreeSet<String> = v.intersection(&nrp_services).cloned().collect();
            (k.clone(), ready)
        })
        .filter(|(_, v)| !v.is_empty())
        .collect();
    let have = gw.address_map();
    for (k, w) in &want {
        match have.get(k) {
            None => errors.push(format!("missing address {k:?} with {w:?}")),
            Some(h) if h != w => errors.push(format!("address {k:?}: has {h:?}, want {w:?}")),
            Some(_) => {}
        }
    }
    for (k, h) in &have {
        if !want.contains_key(k) {
            errors.push(format!("extra address {k:?} with {h:?}"));
        }
    }
    for l in &gw.address_locations {
        if l.addresses.is_empty() {
            errors.push(format!("empty location {}", l.address_location));
        }
    }
    let lbs: BTreeSet<String> = dump
        .load_balancers
        .iter()
        .filter_map(|r| r.name.clone())
        .collect();
    let want_lbs = expected
        .inbound
        .iter()
        .map(|s| load_balancer_name(s))
        .collect();
    set_diff(&mut errors, "load balancer", &want_lbs, &lbs);
    // The rules of each load balancer whose rules are expected: frontend port → the pods' port.
    for (service, want) in &expected.rules {
        let name = load_balancer_name(service);
        let Some(lb) = dump
            .load_balancers
            .iter()
            .find(|lb| lb.name.as_deref() == Some(name.as_str()))
        else {
            continue; // reported missing above, if it is expected
        };
        let have: BTreeSet<crate::cluster::Rule> = lb
            .properties
            .load_balancing_rules
            .iter()
            .map(|r| {
                let protocol = match r.properties.protocol {
                    Some(clb_nrp::wire::TransportProtocol::Udp) => "udp",
                    Some(clb_nrp::wire::TransportProtocol::Tcp) => "tcp",
                    _ => "other",
                };
                (
                    protocol.to_owned(),
                    r.properties.frontend_port,
                    r.properties.backend_port,
                )
            })
            .collect();
        if &have != want {
            errors.push(format!(
                "load balancer {name}: rules (protocol, frontend port, backend port) {have:?}, want {want:?}"
            ));
        }
    }
    let nats: BTreeSet<String> = dump
        .nat_gateways
        .iter()
        .filter_map(|r| r.name.clone())
        .collect();
    let want_nats = expected
        .outbound
        .iter()
        .map(|s| nat_gateway_name(s))
        .collect();
    set_diff(&mut errors, "NAT gateway", &want_nats, &nats);
    let pips: BTreeSet<String> = dump
        .public_ip_addresses
        .iter()
        .filter_map(|r| r.name.clone())
        .collect();
    let want_pips = expected
        .services()
        .iter()
        .map(|s| public_ip_name(s))
        .collect();
    set_diff(&mut errors, "public IP", &want_pips, &pips);
    if errors.is_empty() {
        return Ok(());
    }
    let mut msg = format!(
        "NRP differs from the desired state in {} ways (first 30):\n",
        errors.len()
    );
    for e in errors.iter().take(30) {
        let _ = writeln!(msg, "  {e}");
    }
    Err(msg)
}

/// [`Harness::wait_idle`] (`nrp_too`) or [`Harness::wait_server_idle`] against the server behind
/// `admin` (e.g. whichever replica leads) and `emulator`.
pub async fn wait_quiet_at(
    admin: &Admin,
    emulator: &Emulator,
    timeout: Duration,
    nrp_too: bool,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let g = gateway_status_at(admin).await;
        let gates_open = g.init.as_ref().is_some_and(|i| i.removals_allowed);
        if gates_open && g.units_in_flight == 0 && g.dirty_locations == 0 {
            let d = pending_diff_at(admin).await;
            let nrp_idle = !nrp_too || emulator.stats().in_flight_mutations == 0;
            if d.services.is_empty() && d.locations.is_empty() && nrp_idle {
                let again = gateway_status_at(admin).await;
                if again.revision == g.revision && again.units_in_flight == 0 {
                    return Ok(());
                }
            }
        }
        if Instant::now() >= deadline {
            let d = pending_diff_at(admin).await;
            return Err(format!(
                "not idle after {timeout:?}\nstatus: {g:#?}\npending diff: {} services, {} \
                 locations (first: {:?})",
                d.services.len(),
                d.locations.len(),
                d.locations.first(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The default gateway's status from the server behind `admin`.
pub async fn gateway_status_at(admin: &Admin) -> GatewayStatus {
    admin
        .clone()
        .status(StatusRequest {})
        .await
        .expect("status")
        .into_inner()
        .gateways
        .into_iter()
        .next()
        .expect("a gateway")
}

/// `Admin.PendingDiff` of the default gateway from the server behind `admin`.
pub async fn pending_diff_at(admin: &Admin) -> PendingDiffResponse {
    admin
        .clone()
        .pending_diff(DiffQuery {
            gateway: String::new(),
            limit: 0,
        })
        .await
        .expect("pending diff")
        .into_inner()
}

fn set_diff(
    errors: &mut Vec<String>,
    what: &str,
    want: &BTreeSet<String>,
    have: &BTreeSet<String>,
) {
    for m in want.difference(have) {
        errors.push(format!("missing {what} {m}"));
    }
    for x in have.difference(want) {
        errors.push(format!("extra {what} {x}"));
    }
}
