//! Highly available state servers over loopback, shared by `tests/tests/ha.rs` and the fail-over
//! benchmark (`tests/benches/failover.rs`): replicas that elect a leader with a
//! `coordination.k8s.io/v1` Lease on the fake Kubernetes API ([`crate::fake_kube`]), a loopback
//! stand-in for the Kubernetes Service in front of them, three sync workers, the NRP emulator, and
//! the writers of a cluster (one watcher, one node agent per node).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use clb_client::client::{Client, ConnectOptions, Writer};
use clb_embedded::harness::{
    Admin, admin_client, compare_gateway, compare_nrp, wait_quiet_at, wait_quiet_gateway,
};
use clb_embedded::{
    Cluster, Expected, Harness, Options, PATIENCE, PodWriters, ServerProc, SplitBatch, WATCHER,
    WorkerProc, WriterExt,
};
use clb_nrp::Nrp;
use clb_nrp::azure::{ArmClient, ArmConfig};
use clb_nrp_emulator::{Emulator, RunningEmulator};
use clb_proto::v1::{ResyncScope, Update};
use clb_state_server::leader::{self, ElectionConfig};
use clb_state_server::state::{ServerConfig, StateServer};
use clb_sync_worker::worker::Backoff;
use clb_sync_worker::worker::{GatewayTarget, NrpTargets};
use k8s_openapi::api::coordination::v1::Lease;
use rand::Rng;
use rand::rngs::StdRng;
use tokio::task::JoinHandle;

use crate::fake_kube::{FakeApi, Partition};
use crate::recorder::DeletionLog;
use crate::regions::{Locations, topology_for, view_for};
use clb_client::client::scope;

/// The namespace of the Lease (deploy/'s).
pub const NAMESPACE: &str = "clb-system";
/// The name of the Lease (deploy/'s).
pub const LEASE: &str = "clb-state-server";

/// The state server's configuration from the flags of `deploy/state-server.yaml` (leader election
/// on, no `--expected-writers`).
pub fn deploy_config() -> ServerConfig {
    let args = crate::deploy::state_server_args();
    assert!(args.leader_elect && args.expected_writers.is_empty());
    args.to_server_config()
}

/// The election timings of `deploy/state-server.yaml` for replica `identity`.
pub fn deploy_election(identity: &str) -> ElectionConfig {
    let mut e = crate::deploy::state_server_args().election_config(NAMESPACE);
    e.identity = identity.into();
    e
}

/// Short timings for a test (Kubernetes' defaults are 15 s / 10 s / 2 s).
pub fn short_election(identity: &str) -> ElectionConfig {
    ElectionConfig {
        namespace: NAMESPACE.into(),
        name: LEASE.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(500),
    }
}

/// Waits until `f` holds; panics (naming `what` and the seed) after [`PATIENCE`].
pub async fn wait_until(what: &str, seed: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "seed {seed}: {what}: not after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// One replica: a state server and its elector, with its own link to the Kubernetes API.
pub struct Replica {
    /// Its identity in the Lease.
    pub id: String,
    server: Option<ServerProc>,
    /// Its state.
    pub state: Arc<StateServer>,
    /// Its gRPC address.
    pub addr: SocketAddr,
    elector: JoinHandle<()>,
    /// Its link to the Kubernetes API (cut it to partition the replica).
    pub link: Partition,
}

impl Replica {
    /// Starts a standby replica `election.identity` with `config`, and its elector.
    pub async fn start(api: &FakeApi, config: &ServerConfig, election: ElectionConfig) -> Self {
        let id = election.identity.clone();
        let config = ServerConfig {
            server_id: id.clone(),
            leader_elect: true,
            ..config.clone()
        };
        let server = ServerProc::start(config).await;
        assert!(!server.state.is_leader(), "a replica starts as a standby");
        let (client, link) = api.partitionable_client().await;
        let leases: kube::Api<Lease> = kube::Api::namespaced(client, &election.namespace);
        let elector = tokio::spawn(leader::run(
            leases,
            election,
            server.state.clone(),
            std::future::pending(),
        ));
        Self {
            id,
            state: server.state.clone(),
            addr: server.addr,
            server: Some(server),
            elector,
            link,
        }
    }

    /// Its gRPC URL (not through the Service).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Kills the replica: its elector stops without releasing the Lease, its server dies.
    pub async fn kill(&mut self) {
        self.elector.abort();
        if let Some(s) = self.server.take() {
            s.kill().await;
        }
    }
}

type Endpoints = Arc<Mutex<Vec<(Arc<StateServer>, SocketAddr)>>>;

fn lock_endpoints(e: &Endpoints) -> MutexGuard<'_, Vec<(Arc<StateServer>, SocketAddr)>> {
    e.lock().unwrap_or_else(|p| p.into_inner())
}

/// A loopback stand-in for the Kubernetes Service in front of the replicas: a new connection goes
/// to the replica that leads now (the only ready pod); with no leader it is closed at once, as a
/// Service without ready endpoints refuses it. Established connections stay where they are.
pub struct Service {
    /// `http://` URL of the Service.
    pub url: String,
    endpoints: Endpoints,
}

impl Service {
    /// Starts the Service in front of `replicas`.
    pub async fn start(replicas: &[&Replica]) -> Self {
        let endpoints: Endpoints = Arc::new(Mutex::new(
            replicas.iter().map(|r| (r.state.clone(), r.addr)).collect(),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let e = endpoints.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = lock_endpoints(&e)
                    .iter()
                    .find(|(s, _)| s.is_leader())
                    .map(|(_, a)| *a);
                let Some(target) = target else {
                    continue; // dropped: refused
                };
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Self {
            url: format!("http://{addr}"),
            endpoints,
        }
    }

    /// Adds a replica behind the Service (a new pod of the Deployment).
    pub fn add(&self, r: &Replica) {
        lock_endpoints(&self.endpoints).push((r.state.clone(), r.addr));
    }

    /// Removes a replica (its pod is gone).
    pub fn remove(&self, r: &Replica) {
        lock_endpoints(&self.endpoints).retain(|(_, a)| *a != r.addr);
    }
}

/// The writers of a deployment, connected through the Service.
pub struct Writers {
    /// The cluster watcher (services, egresses, endpoints).
    pub watcher: Writer,
    /// The node agents, by location.
    pub agents: BTreeMap<String, Writer>,
    /// With several gateways: the locations of the gateway these writers write to (the watcher
    /// declares these nodes only and writes their endpoints only).
    part: Option<Locations>,
}

/// The watcher's resync scope when node agents report the pods.
pub fn watcher_scope() -> ResyncScope {
    ResyncScope {
        services: true,
        egresses: true,
        endpoints: true,
        ..ResyncScope::default()
    }
}

impl Writers {
    /// Connects every writer of `cluster` to `url`.
    pub async fn connect(url: &str, cluster: &Cluster) -> Self {
        let client = Client::connect(ConnectOptions::new(url))
            .await
            .expect("client connects");
        let agents = cluster
            .nodes()
            .into_iter()
            .map(|i| {
                let w = client.writer(clb_embedded::cluster::node_agent(i));
                (clb_embedded::cluster::location_ip(i), w)
            })
            .collect();
        Self {
            watcher: client.writer(WATCHER),
            agents,
            part: None,
        }
    }

    /// Connects the writers of `gateway` to `url`: the watcher's writer of that gateway, and the
    /// node agents of its nodes (`part`), as a cluster with a gateway per node pool runs them.
    pub async fn connect_gateway(
        url: &str,
        cluster: &Cluster,
        gateway: &str,
        part: &Locations,
    ) -> Self {
        let client = Client::connect(ConnectOptions::new(url))
            .await
            .expect("client connects")
            .with_gateway(gateway);
        let agents = cluster
            .nodes()
            .into_iter()
            .filter(|i| part.contains(&clb_embedded::cluster::location_ip(*i)))
            .map(|i| {
                let w = client.writer(clb_embedded::cluster::node_agent(i));
                (clb_embedded::cluster::location_ip(i), w)
            })
            .collect();
        Self {
            watcher: client.writer(WATCHER),
            agents,
            part: Some(part.clone()),
        }
    }

    /// Every writer resyncs (as after a reconnect), in a random order within `spread_ms`.
    pub async fn resync_all(&mut self, cluster: &Cluster, rng: &mut StdRng, spread_ms: u64) {
        let mut arrivals: Vec<(u64, Option<String>)> = vec![(rng.random_range(0..spread_ms), None)];
        for l in self.agents.keys() {
            arrivals.push((rng.random_range(0..spread_ms), Some(l.clone())));
        }
        arrivals.sort();
        let mut last = 0;
        for (at, who) in arrivals {
            tokio::time::sleep(Duration::from_millis(at - last)).await;
            last = at;
            match who {
                None => {
                    let (topology, view) = match &self.part {
                        None => (
                            cluster.topology(PodWriters::NodeAgents),
                            cluster.watcher_view(),
                        ),
                        Some(part) => (
                            topology_for(&cluster.topology(PodWriters::NodeAgents), part),
                            view_for(&cluster.watcher_view(), part),
                        ),
                    };
                    self.watcher
                        .resync_scope_ok(watcher_scope(), Some(topology), view)
                        .await;
                }
                Some(l) => {
                    let agent = self.agents.get_mut(&l).unwrap();
                    agent
                        .resync_scope_ok(scope::pods_at(&l), None, cluster.pods_view_at(&l))
                        .await;
                }
            }
        }
    }

    /// Sends `batch`, each update by the writer that owns it.
    pub async fn apply(&mut self, batch: Vec<Update>) {
        let split = SplitBatch::of(batch);
        let watcher = match &self.part {
            None => split.watcher,
            Some(part) => view_for(&split.watcher, part),
        };
        if !watcher.is_empty() {
            self.watcher.apply_ok(watcher).await;
        }
        for (l, pods) in split.pods {
            if self.part.as_ref().is_some_and(|p| !p.contains(&l)) {
                continue; // another gateway's node
            }
            self.agents.get_mut(&l).unwrap().apply_ok(pods).await;
        }
    }
}

/// The NRP side of a [`System`]: one emulator, or one per gateway.
enum Regions {
    /// One gateway (the default) on one emulator.
    One(RunningEmulator),
    /// Several gateways, each on its own emulator, with the gateways file that describes them:
    /// as [`Harness::start_gateways`] builds them (its own state server, started without workers
    /// and never written to, is left aside).
    Gateways(Box<Harness>),
}

/// The system: the fake API, the emulator(s), the replicas behind the Service, three workers.
pub struct System {
    /// The fake Kubernetes API.
    pub api: FakeApi,
    nrp: Regions,
    /// The replicas, oldest first.
    pub replicas: Vec<Replica>,
    /// The Service in front of them.
    pub service: Service,
    workers: Vec<WorkerProc>,
    /// Every deletion a worker made in NRP (the default gateway's).
    pub log: DeletionLog,
    /// Every deletion a worker made in each gateway's NRP, by gateway.
    logs: BTreeMap<String, DeletionLog>,
    /// The options everything was started with.
    pub options: Options,
    election: fn(&str) -> ElectionConfig,
    started: usize,
}

impl System {
    /// Starts the emulator, two replicas (`replica-a` leads), the Service and three workers
    /// (with `worker_backoff`). The replicas run `options.server` with `election`'s timings.
    pub async fn start(
        seed: u64,
        options: Options,
        election: fn(&str) -> ElectionConfig,
        worker_backoff: Backoff,
    ) -> Self {
        let nrp = clb_embedded::harness::start_emulator(options.emulator.clone()).await;
        Self::start_on(seed, options, election, worker_backoff, Regions::One(nrp)).await
    }

    /// [`System::start`] with several gateways, `gateways` (the first is the default), each on its
    /// own emulator standing for a region, described by a gateways file: the emulators and the file
    /// are [`Harness::start_gateways`]'s; the replicas drive every gateway of the file, and each
    /// worker reaches each gateway's emulator under its ARM name, as the harness's workers do.
    pub async fn start_gateways(
        seed: u64,
        options: Options,
        election: fn(&str) -> ElectionConfig,
        worker_backoff: Backoff,
        gateways: &[&str],
    ) -> Self {
        let spare = Options {
            workers: 0,
            ..options.clone()
        };
        let h = Harness::start_gateways(spare, gateways).await;
        let mut options = options;
        options.server.gateways = h.gateways();
        Self::start_on(
            seed,
            options,
            election,
            worker_backoff,
            Regions::Gateways(Box::new(h)),
        )
        .await
    }

    async fn start_on(
        seed: u64,
        options: Options,
        election: fn(&str) -> ElectionConfig,
        worker_backoff: Backoff,
        nrp: Regions,
    ) -> Self {
        let api = FakeApi::start().await;
        let a = Replica::start(&api, &options.server, election("replica-a")).await;
        wait_until("replica-a leads", seed, || a.state.is_leader()).await;
        let b = Replica::start(&api, &options.server, election("replica-b")).await;
        let service = Service::start(&[&a, &b]).await;
        let logs: BTreeMap<String, DeletionLog> = match &nrp {
            Regions::One(_) => [(String::new(), DeletionLog::new())].into(),
            Regions::Gateways(h) => h
                .gateways()
                .into_iter()
                .map(|g| (g, DeletionLog::new()))
                .collect(),
        };
        let log = logs.values().next().expect("a gateway").clone();
        let workers = (0..options.workers)
            .map(|i| {
                let targets = match &nrp {
                    Regions::One(nrp) => {
                        NrpTargets::single(log.wrap(WorkerProc::arm_client(&nrp.base_url())))
                    }
                    Regions::Gateways(h) => worker_targets(h, &logs),
                };
                WorkerProc::start_with_backoff(
                    &format!("w{i}"),
                    &service.url,
                    targets,
                    &options,
                    worker_backoff,
                )
            })
            .collect();
        Self {
            api,
            nrp,
            replicas: vec![a, b],
            service,
            workers,
            log,
            logs,
            options,
            election,
            started: 2,
        }
    }

    /// The emulator (the default gateway's).
    pub fn emulator(&self) -> &Emulator {
        match &self.nrp {
            Regions::One(nrp) => nrp.emulator(),
            Regions::Gateways(h) => h.emulator(),
        }
    }

    /// The gateways, the default first (empty with one gateway started by [`System::start`]).
    pub fn gateways(&self) -> Vec<String> {
        match &self.nrp {
            Regions::One(_) => Vec::new(),
            Regions::Gateways(h) => h.gateways(),
        }
    }

    /// The emulator standing for the region of `gateway` (of [`System::start_gateways`]).
    pub fn emulator_of(&self, gateway: &str) -> &Emulator {
        self.harness().emulator_of(gateway)
    }

    fn harness(&self) -> &Harness {
        match &self.nrp {
            Regions::One(_) => panic!("a system started with one gateway"),
            Regions::Gateways(h) => h,
        }
    }

    /// Sets the latency per call of `gateway`'s emulator.
    pub fn set_latency_of(&self, gateway: &str, ms: u64) {
        let e = self.emulator_of(gateway);
        let mut c = e.config();
        c.latency_ms = ms;
        e.set_config(c).unwrap();
    }

    /// Waits until nothing of `gateway` is pending and its NRP holds exactly `expected` (under
    /// the gateway's ARM name).
    pub async fn converge_gateway(&self, gateway: &str, expected: &Expected, seed: u64) {
        let admin = self.admin().await;
        let emulator = self.emulator_of(gateway);
        wait_quiet_gateway(&admin, emulator, gateway, PATIENCE, true)
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: gateway {gateway}: {e}"));
        let sgw = self.harness().resource_name(gateway);
        compare_gateway(emulator, &sgw, expected)
            .unwrap_or_else(|e| panic!("seed {seed}: gateway {gateway} (ARM {sgw}): {e}"));
    }

    /// Removals `gateway`'s NRP made after its removal `from` of an address from a service
    /// `desired` still wants.
    pub fn removals_of_after(
        &self,
        gateway: &str,
        from: u64,
        desired: &Expected,
    ) -> Vec<clb_nrp_emulator::Removal> {
        let later: Vec<_> = self
            .emulator_of(gateway)
            .removals()
            .into_iter()
            .filter(|r| r.seq > from)
            .collect();
        crate::recorder::spurious(&later, desired)
    }

    /// The deletions a worker made in `gateway`'s NRP.
    pub fn log_of(&self, gateway: &str) -> &DeletionLog {
        self.logs
            .get(gateway)
            .unwrap_or_else(|| panic!("no gateway {gateway}"))
    }

    /// Sets the emulator's latency per call.
    pub fn set_latency(&self, ms: u64) {
        let mut c = self.emulator().config();
        c.latency_ms = ms;
        self.emulator().set_config(c).unwrap();
    }

    /// The replica that leads now, if any.
    pub fn leader(&self) -> Option<usize> {
        self.replicas.iter().position(|r| r.state.is_leader())
    }

    /// Kills replica `i` and starts a new standby in its place (Kubernetes recreates the pod);
    /// returns the new replica's index.
    pub async fn replace(&mut self, i: usize) -> usize {
        let mut dead = self.replicas.remove(i);
        dead.kill().await;
        self.service.remove(&dead);
        self.started += 1;
        let id = format!("replica-{}", self.started);
        let r = Replica::start(&self.api, &self.options.server, (self.election)(&id)).await;
        self.service.add(&r);
        self.replicas.push(r);
        self.replicas.len() - 1
    }

    /// An Admin client on a new connection: it reaches the replica that leads now.
    pub async fn admin(&self) -> Admin {
        admin_client(self.service.url.clone(), None).await
    }

    /// Waits until nothing is pending and NRP holds exactly `expected`.
    pub async fn converge(&self, expected: &Expected, seed: u64) {
        let admin = self.admin().await;
        wait_quiet_at(&admin, self.emulator(), PATIENCE, true)
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        compare_nrp(self.emulator(), expected).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }

    /// Removals NRP made after removal `from` of an address from a service `desired` still wants.
    pub fn removals_after(&self, from: u64, desired: &Expected) -> Vec<clb_nrp_emulator::Removal> {
        let later: Vec<_> = self
            .emulator()
            .removals()
            .into_iter()
            .filter(|r| r.seq > from)
            .collect();
        crate::recorder::spurious(&later, desired)
    }

    /// Deletions (after deletion `from`) of a resource of a service `desired` still wants.
    pub fn desired_deleted(&self, from: u64, desired: &Expected) -> Vec<String> {
        self.log.deleted_desired(from, desired)
    }

    /// Stops everything.
    pub async fn shutdown(mut self) {
        for w in std::mem::take(&mut self.workers) {
            w.kill().await;
        }
        for r in &mut self.replicas {
            r.kill().await;
        }
        match self.nrp {
            Regions::One(nrp) => {
                let _ = nrp.shutdown().await;
            }
            Regions::Gateways(h) => h.shutdown().await,
        }
    }
}

/// A worker's NRP clients for the gateways of `h`'s gateways file, each at its gateway's endpoint
/// and in its resource group, under its ARM name and region (as the harness's workers reach them),
/// each wrapped by its gateway's deletion log.
fn worker_targets(h: &Harness, logs: &BTreeMap<String, DeletionLog>) -> NrpTargets {
    let file = h.gateways_file().expect("a gateways file");
    let mut targets = NrpTargets::empty();
    for g in file.all() {
        let endpoint = g.azure.endpoint.clone().expect("the emulator's URL");
        let mut arm =
            ArmConfig::new(&g.azure.subscription, &g.azure.resource_group).with_endpoint(endpoint);
        arm.poll_interval = Duration::from_millis(5);
        let nrp: Arc<dyn Nrp> = Arc::new(ArmClient::new(arm, None).expect("valid ARM config"));
        targets.insert(
            &g.name,
            GatewayTarget {
                nrp: logs[&g.name].wrap(nrp),
                resource_name: Some(g.resource_name().to_owned()),
                region: Some(g.azure.region.clone()),
                virtual_network_id: None,
                nat_gateway_resource_group: g.azure.nat_gateway_resource_group.clone(),
            },
        );
    }
    targets
}
