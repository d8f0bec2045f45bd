//! High availability: two state-server replicas elect a leader with a `coordination.k8s.io/v1`
//! Lease on the fake Kubernetes API (`tests/src/fake_kube.rs`), behind a loopback stand-in for the
//! Kubernetes Service (new connections go to the replica that leads, as the Service routes to the
//! ready pod). Three sync workers and the NRP emulator; the writers are a watcher and one node
//! agent per node. Waits only bound a hung test ([`PATIENCE`]); nothing here asserts on time, only
//! on order. The seed is printed (`CLB_HA_SEED` replays one).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clb_client::client::{Client, ConnectOptions};
use clb_embedded::harness::{compare_nrp, gateway_status_at, wait_quiet_at};
use clb_nrp_emulator::{Emulator, RunningEmulator};
use clb_proto::v1::admin_client::AdminClient;
use clb_proto::v1::{ResyncScope, Update};
use clb_state_server::leader::{self, ElectionConfig};
use clb_state_server::state::{ServerConfig, StateServer};
use clb_tests::fake_kube::{FakeApi, Partition};
use clb_tests::recorder::DeletionLog;
use clb_tests::{
    Cluster, ClusterSpec, Expected, Options, PATIENCE, PodWriters, ServerProc, SplitBatch, WATCHER,
    WorkerProc, Writer, WriterExt, scope,
};
use k8s_openapi::api::coordination::v1::Lease;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const NAMESPACE: &str = "clb-system";
const LEASE: &str = "clb-state-server";

/// The state server's configuration from the flags of `deploy/state-server.yaml` (leader election
/// on, no `--expected-writers`); the election's timings are shortened for the test.
fn deploy_config() -> ServerConfig {
    let args = clb_tests::deploy::state_server_args();
    assert!(args.leader_elect && args.expected_writers.is_empty());
    args.to_server_config()
}

fn seed(test: &str) -> u64 {
    let seed = std::env::var("CLB_HA_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{test}: seed {seed} (replay with CLB_HA_SEED={seed})");
    seed
}

/// Short timings for a test (Kubernetes' defaults are 15 s / 10 s / 2 s).
fn election(identity: &str) -> ElectionConfig {
    ElectionConfig {
        namespace: NAMESPACE.into(),
        name: LEASE.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(500),
    }
}

/// One replica: a state server and its elector, with its own link to the Kubernetes API.
struct Replica {
    id: String,
    server: Option<ServerProc>,
    state: Arc<StateServer>,
    addr: SocketAddr,
    elector: JoinHandle<()>,
    link: Partition,
}

async fn replica(api: &FakeApi, id: &str, options: &Options) -> Replica {
    let config = ServerConfig {
        server_id: id.into(),
        leader_elect: true,
        ..options.server.clone()
    };
    let server = ServerProc::start(config).await;
    assert!(!server.state.is_leader(), "a replica starts as a standby");
    let (client, link) = api.partitionable_client().await;
    let leases: kube::Api<Lease> = kube::Api::namespaced(client, NAMESPACE);
    let elector = tokio::spawn(leader::run(
        leases,
        election(id),
        server.state.clone(),
        std::future::pending(),
    ));
    Replica {
        id: id.into(),
        state: server.state.clone(),
        addr: server.addr,
        server: Some(server),
        elector,
        link,
    }
}

impl Replica {
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Kills the replica: its elector stops without releasing the Lease, its server dies.
    async fn kill(&mut self) {
        self.elector.abort();
        if let Some(s) = self.server.take() {
            s.kill().await;
        }
    }
}

async fn wait_until(what: &str, seed: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "seed {seed}: {what}: not after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A loopback stand-in for the Kubernetes Service: each new connection goes to the replica that
/// leads now (waiting for one); established connections stay where they are.
async fn leader_proxy(replicas: Vec<(Arc<StateServer>, SocketAddr)>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let replicas = replicas.clone();
            tokio::spawn(async move {
                let deadline = Instant::now() + PATIENCE;
                let target = loop {
                    if let Some((_, a)) = replicas.iter().find(|(s, _)| s.is_leader()) {
                        break *a;
                    }
                    if Instant::now() > deadline {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                };
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    format!("http://{addr}")
}

async fn health(url: &str, service: &str) -> ServingStatus {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
        .expect("url")
        .connect()
        .await
        .expect("connects");
    let mut c = HealthClient::new(channel);
    let r = c
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("health check")
        .into_inner();
    ServingStatus::try_from(r.status).expect("known status")
}

/// The writers of a deployment, connected through the Service.
struct Writers {
    watcher: Writer,
    agents: BTreeMap<String, Writer>,
}

impl Writers {
    async fn connect(url: &str, cluster: &Cluster) -> Self {
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
        }
    }

    /// Every writer resyncs (as after a reconnect), in a random order within `spread_ms`.
    async fn resync_all(&mut self, cluster: &Cluster, rng: &mut StdRng, spread_ms: u64) {
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
                    let scope = ResyncScope {
                        services: true,
                        egresses: true,
                        endpoints: true,
                        ..ResyncScope::default()
                    };
                    self.watcher
                        .resync_scope_ok(
                            scope,
                            Some(cluster.topology(PodWriters::NodeAgents)),
                            cluster.watcher_view(),
                        )
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

    async fn apply(&mut self, batch: Vec<Update>) {
        let split = SplitBatch::of(batch);
        if !split.watcher.is_empty() {
            self.watcher.apply_ok(split.watcher).await;
        }
        for (l, pods) in split.pods {
            self.agents.get_mut(&l).unwrap().apply_ok(pods).await;
        }
    }
}

/// The system: the fake API, the emulator, two replicas behind the Service, three workers.
struct System {
    api: FakeApi,
    nrp: RunningEmulator,
    replicas: Vec<Replica>,
    service: String,
    workers: Vec<WorkerProc>,
    log: DeletionLog,
    options: Options,
}

impl System {
    async fn start(seed: u64) -> Self {
        clb_tests::init_tracing();
        let mut options = Options::e2e();
        // The server's flags as deploy/ runs it (leader election on, no --expected-writers).
        options.server = deploy_config();
        let api = FakeApi::start().await;
        let nrp = RunningEmulator::start(Emulator::new(options.emulator.clone()).unwrap())
            .await
            .expect("emulator starts");
        let a = replica(&api, "replica-a", &options).await;
        wait_until("replica-a leads", seed, || a.state.is_leader()).await;
        let b = replica(&api, "replica-b", &options).await;
        let service =
            leader_proxy(vec![(a.state.clone(), a.addr), (b.state.clone(), b.addr)]).await;
        let log = DeletionLog::new();
        let workers = (0..3)
            .map(|i| {
                let nrp = log.wrap(WorkerProc::arm_client(&nrp.base_url()));
                WorkerProc::start(&format!("w{i}"), &service, nrp, &options)
            })
            .collect();
        Self {
            api,
            nrp,
            replicas: vec![a, b],
            service,
            workers,
            log,
            options,
        }
    }

    fn emulator(&self) -> &Emulator {
        self.nrp.emulator()
    }

    fn set_latency(&self, ms: u64) {
        let mut c = self.emulator().config();
        c.latency_ms = ms;
        self.emulator().set_config(c).unwrap();
    }

    /// An Admin client on a new connection: it reaches the replica that leads now.
    async fn admin(&self) -> AdminClient<Channel> {
        AdminClient::connect(self.service.clone())
            .await
            .expect("admin connects")
    }

    async fn converge(&self, expected: &Expected, seed: u64) {
        let admin = self.admin().await;
        wait_quiet_at(&admin, self.emulator(), PATIENCE, true)
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        compare_nrp(self.emulator(), expected).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }

    fn removals_after(&self, from: u64, desired: &Expected) -> Vec<clb_nrp_emulator::Removal> {
        self.emulator()
            .removals()
            .into_iter()
            .filter(|r| r.seq > from)
            .filter(|r| {
                r.removed_services
                    .iter()
                    .any(|s| desired.wants(&r.location, &r.address, s))
            })
            .collect()
    }

    fn desired_deleted(&self, from: u64, desired: &Expected) -> Vec<String> {
        use clb_sync_worker::worker::{load_balancer_name, nat_gateway_name, public_ip_name};
        let names: std::collections::BTreeSet<String> = desired
            .services()
            .iter()
            .flat_map(|s| {
                [
                    s.clone(),
                    load_balancer_name(s),
                    nat_gateway_name(s),
                    public_ip_name(s),
                ]
            })
            .collect();
        self.log
            .entries()
            .into_iter()
            .filter(|d| d.seq > from && names.contains(&d.name))
            .map(|d| format!("{} {}", d.what, d.name))
            .collect()
    }

    async fn shutdown(mut self) {
        for w in std::mem::take(&mut self.workers) {
            w.kill().await;
        }
        for r in &mut self.replicas {
            r.kill().await;
        }
        let _ = self.nrp.shutdown().await;
        let _ = &self.options;
    }
}

fn spec(seed: u64) -> ClusterSpec {
    ClusterSpec {
        seed,
        ..ClusterSpec::small(6, 6, 6)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_over_a_killed_leader_without_removing_a_live_backend() {
    let seed = seed("killed leader");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut sys = System::start(seed).await;
    let (a, b) = (&sys.replicas[0], &sys.replicas[1]);
    assert_eq!(sys.api.lease_holder(NAMESPACE, LEASE), "replica-a");

    // The standby serves nothing: NOT_SERVING on gRPC health, UNAVAILABLE to writers and workers.
    assert_eq!(health(&a.url(), "").await, ServingStatus::Serving);
    assert_eq!(health(&b.url(), "").await, ServingStatus::NotServing);
    assert_eq!(
        health(&b.url(), "clb.v1.Writer").await,
        ServingStatus::NotServing
    );
    let standby = Client::connect(ConnectOptions::new(b.url())).await.unwrap();
    let err = standby
        .writer(WATCHER)
        .apply(Vec::new())
        .await
        .expect_err("a standby refuses writes");
    assert_eq!(
        err.status().map(tonic::Status::code),
        Some(tonic::Code::Unavailable),
        "{err}"
    );
    assert!(standby.status().await.is_err(), "a standby refuses Admin");

    let mut cluster = Cluster::generate(spec(seed));
    let mut writers = Writers::connect(&sys.service, &cluster).await;
    writers.resync_all(&cluster, &mut rng, 10).await;
    sys.converge(&cluster.expected(), seed).await;

    // Half a rollout with NRP slowed down; the leader dies with calls in flight.
    sys.set_latency(300);
    let apps = cluster.spec().apps;
    for app in 0..apps / 2 {
        for batch in cluster.roll_app(app) {
            writers.apply(batch).await;
        }
    }
    wait_until("an NRP call in flight", seed, || {
        sys.emulator().stats().in_flight_mutations > 0
    })
    .await;
    let at_kill = cluster.expected();
    let removals_at_kill = sys.emulator().stats().removals;
    let deletions_at_kill = sys.log.len();
    sys.replicas[0].kill().await;
    sys.set_latency(2);

    // The standby takes the Lease once it expires, and starts like a restarted server.
    let b_state = sys.replicas[1].state.clone();
    wait_until("replica-b leads", seed, || b_state.is_leader()).await;
    assert_eq!(sys.api.lease_holder(NAMESPACE, LEASE), "replica-b");
    let admin = sys.admin().await;
    let g = gateway_status_at(&admin).await;
    assert_eq!(
        g.desired_addresses, 0,
        "seed {seed}: the new leader starts empty"
    );
    // The writers notice (their calls fail) and resync with the new leader, in a random order.
    let mut writers = Writers::connect(&sys.service, &cluster).await;
    writers.resync_all(&cluster, &mut rng, 2000).await;
    sys.converge(&at_kill, seed).await;
    let bad = sys.removals_after(removals_at_kill, &at_kill);
    assert!(
        bad.is_empty(),
        "seed {seed}: still-desired backends removed across the fail-over: {bad:?}"
    );
    let bad = sys.desired_deleted(deletions_at_kill, &at_kill);
    assert!(
        bad.is_empty(),
        "seed {seed}: desired services deleted: {bad:?}"
    );

    // The rollout finishes under the new leader.
    let removals_before_end = sys.emulator().stats().removals;
    for app in apps / 2..apps {
        for batch in cluster.roll_app(app) {
            writers.apply(batch).await;
        }
    }
    let end = cluster.expected();
    sys.converge(&end, seed).await;
    let bad = sys.removals_after(removals_before_end, &end);
    assert!(
        bad.is_empty(),
        "seed {seed}: new pods lost services: {bad:?}"
    );
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_stops_dispatching_before_the_new_one_starts() {
    let seed = seed("partitioned leader");
    let mut rng = StdRng::seed_from_u64(seed);
    let sys = System::start(seed).await;
    let mut cluster = Cluster::generate(spec(seed));
    let mut writers = Writers::connect(&sys.service, &cluster).await;
    writers.resync_all(&cluster, &mut rng, 10).await;
    sys.converge(&cluster.expected(), seed).await;

    // Every change of leadership, in the order it happened.
    let events: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    for r in &sys.replicas {
        let mut rx = r.state.leadership();
        let (id, events) = (r.id.clone(), events.clone());
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let leading = *rx.borrow_and_update();
                events.lock().unwrap().push((id.clone(), leading));
            }
        });
    }
    let (a, b) = (&sys.replicas[0], &sys.replicas[1]);
    a.link.cut();
    wait_until("replica-b leads", seed, || b.state.is_leader()).await;
    let order = events.lock().unwrap().clone();
    let a_stopped = order
        .iter()
        .position(|(id, leading)| id == "replica-a" && !leading);
    let b_started = order
        .iter()
        .position(|(id, leading)| id == "replica-b" && *leading);
    assert!(
        matches!((a_stopped, b_started), (Some(x), Some(y)) if x < y),
        "seed {seed}: the cut-off leader must stop before the new one starts: {order:?}"
    );
    assert!(!a.state.is_leader());
    // The old leader's worker streams are closed: nothing of it dispatches any more.
    let a_state = a.state.clone();
    wait_until("the old leader has no worker", seed, || {
        a_state.workers().is_empty()
    })
    .await;
    for g in a.state.gateways() {
        assert_eq!(g.lock().dispatch.units_in_flight(), 0);
    }

    // The cluster goes on with the new leader.
    let mut writers = Writers::connect(&sys.service, &cluster).await;
    writers.resync_all(&cluster, &mut rng, 1000).await;
    let removals_before = sys.emulator().stats().removals;
    for batch in cluster.roll_app(0) {
        writers.apply(batch).await;
    }
    let end = cluster.expected();
    sys.converge(&end, seed).await;
    let bad = sys.removals_after(removals_before, &end);
    assert!(
        bad.is_empty(),
        "seed {seed}: live backends removed: {bad:?}"
    );

    // Healed, the old leader stays a standby while the new one renews.
    a.link.heal();
    let rv = |api: &FakeApi| {
        api.lease(NAMESPACE, LEASE)
            .and_then(|l| {
                l.pointer("/metadata/resourceVersion")
                    .and_then(|v| v.as_str())
                    .map(str::to_owned)
            })
            .unwrap_or_default()
    };
    let mut renewals = 0;
    let mut last = rv(&sys.api);
    wait_until("two renewals by the new leader", seed, || {
        let now = rv(&sys.api);
        if now != last {
            renewals += 1;
            last = now;
        }
        renewals >= 2
    })
    .await;
    assert_eq!(sys.api.lease_holder(NAMESPACE, LEASE), "replica-b");
    assert!(!a.state.is_leader() && b.state.is_leader());
    sys.shutdown().await;
}
