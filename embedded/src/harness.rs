//! The whole system in one process over loopback: the NRP emulator (HTTP), the state server (gRPC)
//! and N sync workers (each a [`clb_sync_worker::worker::run`] task with its own shutdown, so that a test can stop or
//! kill one), every server on port 0.
//!
//! [`Harness::converge`] waits until the server has nothing left to do (no pending diff, no unit in
//! flight, no NRP call in flight) and then compares the emulator's state with the expected state.
//! Its timeout only bounds a hung test; it is never a performance claim.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clb_core::dispatch::DispatchConfig;
use clb_gateways::Gateways;
use clb_nrp::Nrp;
use clb_nrp::azure::ArmClient;
use clb_nrp_emulator::{Emulator, EmulatorConfig, RunningEmulator};
use clb_proto::v1::admin_client::AdminClient;
use clb_proto::v1::{DiffQuery, GatewayStatus, PendingDiffResponse, StatusRequest, StatusResponse};
use clb_state_server::auth::Auth;
use clb_state_server::grpc::ServeOptions;
use clb_state_server::state::ServerConfig;
use clb_sync_worker::worker::{GatewayTarget, Limits, NrpTargets};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::cluster::Expected;
pub use crate::compare::{compare_gateway, compare_nrp};
pub use crate::procs::{ServerProc, StalledWorker, WorkerProc};
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

/// Writer name of the cluster-wide watcher.
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
    /// The workers' `--nat-gateway-resource-group` (where egresses may bring their NAT gateway);
    /// `None`: bringing one is off.
    pub nat_gateway_resource_group: Option<String>,
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
            nat_gateway_resource_group: None,
        }
    }

    pub(crate) fn serve_options(&self) -> ServeOptions {
        ServeOptions {
            tls: None,
            auth: self.auth.as_ref().map(|a| a.server.clone()),
        }
    }

    fn client_token(&self) -> Option<std::path::PathBuf> {
        self.auth.as_ref().map(|a| a.client_token.clone())
    }
}

/// The system under test: NRP emulator(s), state server, workers.
#[derive(Debug)]
pub struct Harness {
    /// One emulator per gateway (a region each), the default gateway's first.
    nrps: Vec<(String, RunningEmulator)>,
    /// With several gateways: the gateways file the server and the workers read, and its contents.
    gateways_file: Option<(PathBuf, Gateways)>,
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
        Self::start_on(options, vec![(GATEWAY.to_owned(), nrp)], None).await
    }

    /// Starts one emulator per gateway of `gateways` (the first is the default), each standing for
    /// a region of its own, and the server and `options.workers` workers as the binaries start with
    /// `--gateways-file`: a gateways file is written (each gateway in a resource group of its own,
    /// at its emulator's URL, its Service Gateway named `sgw-{g}` in ARM; the first serves the
    /// nodes no other takes, gateway `g` the nodes of pool `g`) and read by the state server's and
    /// the worker's own flag parsing.
    pub async fn start_gateways(options: Options, gateways: &[&str]) -> Self {
        assert!(!gateways.is_empty(), "at least one gateway");
        let mut nrps = Vec::new();
        let mut yaml = String::from("gateways:\n");
        for (i, g) in gateways.iter().enumerate() {
            let sgw = resource_name_of(g);
            let nrp =
                start_emulator_at(options.emulator.clone(), &rg_of(g), &sgw, &region_of(i)).await;
            let _ = writeln!(yaml, "  - name: {g}");
            if i > 0 {
                let _ = writeln!(yaml, "    nodes: {{pool: {g}}}");
            }
            let _ = writeln!(
                yaml,
                "    azure: {{subscription: {SUBSCRIPTION}, resourceGroup: {}, region: {}, \
                 serviceGateway: {sgw}, endpoint: '{}'}}",
                rg_of(g),
                region_of(i),
                nrp.base_url()
            );
            nrps.push(((*g).to_owned(), nrp));
        }
        let path = std::env::temp_dir().join(format!(
            "clb-harness-gateways-{}-{}.yaml",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::write(&path, yaml).expect("write the gateways file");
        let file = Gateways::load(&path).expect("the harness's gateways file");
        Self::start_on(options, nrps, Some((path, file))).await
    }

    async fn start_on(
        options: Options,
        nrps: Vec<(String, RunningEmulator)>,
        gateways_file: Option<(PathBuf, Gateways)>,
    ) -> Self {
        let config = server_config(&options.server, gateways_file.as_ref(), 1);
        let server = ServerProc::start_with(config, options.serve_options()).await;
        let admin = admin_client(server.url(), options.client_token()).await;
        let mut h = Self {
            nrps,
            gateways_file,
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

    /// The gateways the harness runs, the default first.
    pub fn gateways(&self) -> Vec<String> {
        self.nrps.iter().map(|(g, _)| g.clone()).collect()
    }

    /// The gateways file the server and the workers read (with several gateways).
    pub fn gateways_file(&self) -> Option<&Gateways> {
        self.gateways_file.as_ref().map(|(_, f)| f)
    }

    /// The emulator standing for the region of `gateway`.
    pub fn emulator_of(&self, gateway: &str) -> &Emulator {
        self.running(gateway).emulator()
    }

    fn running(&self, gateway: &str) -> &RunningEmulator {
        self.nrps
            .iter()
            .find(|(g, _)| g.eq_ignore_ascii_case(gateway))
            .map(|(_, n)| n)
            .unwrap_or_else(|| panic!("no gateway {gateway} in the harness"))
    }

    /// What the emulator of `gateway` holds.
    pub fn dump_of(&self, gateway: &str) -> clb_nrp_emulator::Dump {
        self.emulator_of(gateway).dump()
    }

    /// The ARM name of the Service Gateway of `gateway` (what its emulator's dump names it).
    pub fn resource_name(&self, gateway: &str) -> String {
        match self.gateways_file() {
            Some(file) => file
                .get(gateway)
                .unwrap_or_else(|| panic!("no gateway {gateway} in the harness"))
                .resource_name()
                .to_owned(),
            None => gateway.to_owned(),
        }
    }

    /// A writer connected as the watcher, writing to `gateway`.
    pub async fn writer(&self, gateway: &str) -> Writer {
        self.client().await.with_gateway(gateway).writer(WATCHER)
    }

    /// [`Harness::wait_idle`] for `gateway` (its emulator's calls included).
    pub async fn wait_idle_gateway(&self, gateway: &str, timeout: Duration) -> Result<(), String> {
        wait_quiet_gateway(
            &self.admin,
            self.emulator_of(gateway),
            gateway,
            timeout,
            true,
        )
        .await
    }

    /// [`Harness::try_converge`] for `gateway`: it is idle and its emulator holds `expected`.
    pub async fn try_converge_gateway(
        &self,
        gateway: &str,
        expected: &Expected,
        timeout: Duration,
    ) -> Result<(), String> {
        self.wait_idle_gateway(gateway, timeout).await?;
        let sgw = self.resource_name(gateway);
        compare_gateway(self.emulator_of(gateway), &sgw, expected)
            .map_err(|e| format!("gateway {gateway} (ARM {sgw}): {e}"))
    }

    /// [`Harness::try_converge_gateway`], panicking with the differences on failure.
    pub async fn converge_gateway(&self, gateway: &str, expected: &Expected, timeout: Duration) {
        if let Err(e) = self.try_converge_gateway(gateway, expected, timeout).await {
            panic!("{e}");
        }
    }

    /// The status of `gateway`.
    pub async fn gateway_status_of(&self, gateway: &str) -> GatewayStatus {
        gateway_status_named(&self.admin, gateway).await
    }

    /// The emulator (state, stats, removal log, configuration).
    pub fn emulator(&self) -> &Emulator {
        self.nrps[0].1.emulator()
    }

    /// The emulator's base URL.
    pub fn nrp_url(&self) -> String {
        self.nrps[0].1.base_url()
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
    /// `clb_tests::nrp::Detached::wrap`); with several gateways, the default gateway's client.
    pub fn spawn_worker_with(&mut self, id: &str, wrap: impl FnOnce(Arc<dyn Nrp>) -> Arc<dyn Nrp>) {
        let targets = match &self.gateways_file {
            None => NrpTargets::single(wrap(WorkerProc::arm_client(&self.nrp_url()))),
            Some((path, file)) => {
                let mut wrap = Some(wrap);
                let mut targets = NrpTargets::empty();
                for (gateway, mut arm) in worker_arm_configs(path, file) {
                    arm.poll_interval = Duration::from_millis(5);
                    // A call that hangs ends at its unit's lease, not at a shorter client timeout.
                    arm.request_timeout = Duration::from_secs(600);
                    let nrp: Arc<dyn Nrp> =
                        Arc::new(ArmClient::new(arm, None).expect("valid ARM config"));
                    let nrp = match wrap.take() {
                        Some(w) => w(nrp),
                        None => nrp,
                    };
                    let g = file.get(&gateway).expect("a gateway of the file");
                    targets.insert(
                        &gateway,
                        GatewayTarget {
                            nrp,
                            resource_name: Some(g.resource_name().to_owned()),
                            region: Some(g.azure.region.clone()),
                            virtual_network_id: None,
                            nat_gateway_resource_group: g.azure.nat_gateway_resource_group.clone(),
                        },
                    );
                }
                targets
            }
        };
        let w = WorkerProc::start(id, &self.url(), targets, &self.options);
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

    /// The first half of a restart: the server is asked to stop and the workers are stopped;
    /// returns their ids and the next server's configuration (the gateways file is read again, as
    /// a restarted binary does).
    async fn stop_for_restart(&mut self) -> (Vec<String>, ServerConfig) {
        self.server.request_stop();
        let ids = self.worker_ids();
        let stops = std::mem::take(&mut self.workers)
            .into_iter()
            .map(WorkerProc::stop);
        for s in stops {
            s.await;
        }
        self.generation += 1;
        let config = server_config(
            &self.options.server,
            self.gateways_file.as_ref(),
            self.generation,
        );
        (ids, config)
    }

    /// Like [`Harness::restart_server`], but the workers are not started again: their ids are
    /// returned, for the test to start them when it wants.
    pub async fn restart_server_without_workers(&mut self) -> Vec<String> {
        let (ids, config) = self.stop_for_restart().await;
        let new = ServerProc::start_with(config, self.options.serve_options()).await;
        let old = std::mem::replace(&mut self.server, new);
        old.stop(Duration::from_secs(5)).await;
        self.admin = admin_client(self.server.url(), self.options.client_token()).await;
        ids
    }

    /// Restarts the state server in place, as a Kubernetes restart of its pod looks to clients
    /// that dial the Service's address: the running one and the workers are stopped, a new one
    /// (new server id, empty state) listens on the same address, and the workers start again.
    /// Connected clients lose their connections and reconnect to the same URL.
    pub async fn restart_server_in_place(&mut self) {
        let addr = self.server.addr;
        let (ids, config) = self.stop_for_restart().await;
        // The old one lets go of the address (a graceful shutdown: streams end, connections get a
        // GOAWAY) before the new one binds it; meanwhile clients find nobody there.
        self.server.halt(Duration::from_secs(5)).await;
        self.server = ServerProc::start_on(addr, config, self.options.serve_options()).await;
        self.admin = admin_client(self.server.url(), self.options.client_token()).await;
        for id in ids {
            self.spawn_worker(&id);
        }
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
        for (_, nrp) in self.nrps {
            let _ = nrp.shutdown().await;
        }
        if let Some((path, _)) = self.gateways_file {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The subscription of the harness's gateways.
const SUBSCRIPTION: &str = "sub-e2e";

fn rg_of(gateway: &str) -> String {
    format!("rg-{gateway}")
}

fn resource_name_of(gateway: &str) -> String {
    format!("sgw-{gateway}")
}

fn region_of(i: usize) -> String {
    format!("region{i}")
}

/// The server's configuration: `base`, its gateways from the gateways file at `file` through the
/// state server's own flags (`--gateways-file`), and the id of generation `generation`.
fn server_config(
    base: &ServerConfig,
    file: Option<&(PathBuf, Gateways)>,
    generation: u32,
) -> ServerConfig {
    let mut config = base.clone();
    if generation > 1 {
        config.server_id = format!("state-server-{generation}");
    }
    if let Some((path, _)) = file {
        let flag = format!("--gateways-file={}", path.display());
        let mut args = <clb_state_server::config::Args as clap::Parser>::try_parse_from([
            "clb-state-server",
            "--listen=127.0.0.1:0",
            flag.as_str(),
        ])
        .expect("the state server's flags");
        args.validate().expect("valid flags");
        args.load_gateways_file().expect("the gateways file");
        config.gateways = args.to_server_config().gateways;
    }
    config
}

/// Each gateway's ARM configuration from the gateways file at `path`, through the worker's own
/// flags (`--gateways-file`).
fn worker_arm_configs(
    path: &std::path::Path,
    file: &Gateways,
) -> Vec<(String, clb_nrp::azure::ArmConfig)> {
    let flag = format!("--gateways-file={}", path.display());
    let args = <clb_sync_worker::cli::Args as clap::Parser>::try_parse_from([
        "clb-sync-worker",
        "--credential=none",
        flag.as_str(),
    ])
    .expect("the worker's flags");
    let _ = file;
    let read = args
        .gateways_file()
        .expect("the gateways file")
        .expect("given");
    args.gateway_arm_configs(&read).expect("valid gateways")
}

/// An emulator with the default gateway created (before `config` applies, as an operator
/// creates it before installing clb: the costs and faults of `config` are the system's to meet).
pub async fn start_emulator(config: EmulatorConfig) -> RunningEmulator {
    start_emulator_at(config, "rg-e2e", GATEWAY, "eastus").await
}

/// An emulator with the service gateway `name` created in resource group `rg` of the harness's
/// subscription, in `region` (then `config` applies).
pub async fn start_emulator_at(
    config: EmulatorConfig,
    rg: &str,
    name: &str,
    region: &str,
) -> RunningEmulator {
    let nrp = RunningEmulator::start(Emulator::new(EmulatorConfig::default()).expect("default"))
        .await
        .expect("emulator starts");
    let mut arm = clb_nrp::azure::ArmConfig::new(SUBSCRIPTION, rg).with_endpoint(nrp.base_url());
    arm.poll_interval = Duration::from_millis(5);
    let client = ArmClient::new(arm, None).expect("valid ARM config");
    put_gateway(&client, name, region).await;
    nrp.emulator()
        .set_config(config)
        .expect("valid emulator config");
    nrp
}

/// Creates the service gateway `name` on the NRP (emulator) at `nrp_url` with a PUT, as an operator
/// provisions one in Azure, in the subscription and resource group of [`WorkerProc::arm_client`]: NRP
/// (and the emulator by default) has a gateway only once it is PUT.
pub async fn create_gateway(nrp_url: &str, name: &str) {
    put_gateway(WorkerProc::arm_client(nrp_url).as_ref(), name, "eastus").await;
}

async fn put_gateway(nrp: &dyn Nrp, name: &str, region: &str) {
    let gateway = clb_nrp::wire::ServiceGateway {
        location: Some(region.into()),
        sku: Some(clb_nrp::wire::Sku::standard()),
        ..Default::default()
    };
    nrp.put_service_gateway(name, &gateway, clb_nrp::CallOptions::with_timeout(PATIENCE))
        .await
        .unwrap_or_else(|e| panic!("creating service gateway {name}: {e}"));
}

/// [`Harness::wait_idle`] (`nrp_too`) or [`Harness::wait_server_idle`] against the server behind
/// `admin` (e.g. whichever replica leads) and `emulator`.
pub async fn wait_quiet_at(
    admin: &Admin,
    emulator: &Emulator,
    timeout: Duration,
    nrp_too: bool,
) -> Result<(), String> {
    wait_quiet_gateway(admin, emulator, "", timeout, nrp_too).await
}

/// [`wait_quiet_at`] for `gateway` (empty: the default), whose NRP is `emulator`.
pub async fn wait_quiet_gateway(
    admin: &Admin,
    emulator: &Emulator,
    gateway: &str,
    timeout: Duration,
    nrp_too: bool,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let g = gateway_status_named(admin, gateway).await;
        let gates_open = g.init.as_ref().is_some_and(|i| i.removals_allowed);
        if gates_open && g.units_in_flight == 0 && g.dirty_locations == 0 {
            let d = pending_diff_named(admin, gateway).await;
            let nrp_idle = !nrp_too || emulator.stats().in_flight_mutations == 0;
            if d.services.is_empty() && d.locations.is_empty() && nrp_idle {
                let again = gateway_status_named(admin, gateway).await;
                if again.revision == g.revision && again.units_in_flight == 0 {
                    return Ok(());
                }
            }
        }
        if Instant::now() >= deadline {
            let d = pending_diff_named(admin, gateway).await;
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
    gateway_status_named(admin, "").await
}

/// The status of `gateway` (empty: the default, the first) from the server behind `admin`.
pub async fn gateway_status_named(admin: &Admin, gateway: &str) -> GatewayStatus {
    let all = admin
        .clone()
        .status(StatusRequest {})
        .await
        .expect("status")
        .into_inner()
        .gateways;
    let found = if gateway.is_empty() {
        all.into_iter().next()
    } else {
        all.into_iter()
            .find(|g| g.name.eq_ignore_ascii_case(gateway))
    };
    found.unwrap_or_else(|| panic!("no gateway {gateway:?} in the server's status"))
}

/// `Admin.PendingDiff` of the default gateway from the server behind `admin`.
pub async fn pending_diff_at(admin: &Admin) -> PendingDiffResponse {
    pending_diff_named(admin, "").await
}

/// `Admin.PendingDiff` of `gateway` (empty: the default) from the server behind `admin`.
pub async fn pending_diff_named(admin: &Admin, gateway: &str) -> PendingDiffResponse {
    admin
        .clone()
        .pending_diff(DiffQuery {
            gateway: gateway.to_owned(),
            limit: 0,
        })
        .await
        .expect("pending diff")
        .into_inner()
}
