//! Restarts never remove a live backend, in the shipped configuration and with no configuration at
//! all: the state server, three sync workers and the NRP emulator over loopback, with the writers
//! of a real deployment — one watcher (services, egresses, endpoints; it declares the nodes in its
//! resync) and one node agent per node (the pods of that node).
//!
//! The server is stopped in the middle of a rollout and a new one started; the writers come back in
//! a random order with random delays (the seed is printed, and `CLB_RESTART_SEED` replays one).
//! The emulator's removal log and a log of the service deletions the workers sent must show
//! nothing still desired removed; then the cluster converges. Waits only bound a hung test
//! ([`PATIENCE`]); nothing here asserts on time.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use clb_nrp_emulator::Removal;
use clb_proto::v1::{ResyncScope, Update};
use clb_state_server::state::ServerConfig;
use clb_tests::recorder::{DeletionLog, spurious};
use clb_tests::{
    Cluster, ClusterSpec, GATEWAY, Harness, Options, PATIENCE, PodWriters, SplitBatch, WATCHER,
    Writer, WriterExt, scope,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// 8 nodes, 8 apps of 6 pods (48 pods), 11 Services, 3 egresses, every 10th pod not ready.
fn spec(seed: u64) -> ClusterSpec {
    ClusterSpec {
        seed,
        ..ClusterSpec::small(8, 8, 6)
    }
}

/// The seed of this run: `CLB_RESTART_SEED`, or a random one. Printed, so that a failure can be
/// replayed.
fn seed(test: &str) -> u64 {
    let seed = std::env::var("CLB_RESTART_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{test}: seed {seed} (replay with CLB_RESTART_SEED={seed})");
    seed
}

/// The state server's configuration from the flags of `deploy/state-server.yaml`. deploy/ runs two
/// replicas with leader election; here one replica restarts, so it leads from the start (the
/// fail-over between replicas, with these flags, is `tests/tests/ha.rs`).
fn deploy_config() -> ServerConfig {
    let args = clb_tests::deploy::state_server_args();
    assert!(
        args.expected_writers.is_empty(),
        "deploy/ must not need --expected-writers"
    );
    assert!(args.leader_elect, "deploy/ runs active/standby replicas");
    ServerConfig {
        leader_elect: false,
        ..args.to_server_config()
    }
}

/// The state server's configuration with no flag at all.
fn default_config() -> ServerConfig {
    let args =
        <clb_state_server::config::Args as clap::Parser>::try_parse_from(["clb-state-server"])
            .unwrap();
    args.to_server_config()
}

/// The watcher's scope when node agents report the pods.
fn watcher_scope() -> ResyncScope {
    ResyncScope {
        services: true,
        egresses: true,
        endpoints: true,
        ..ResyncScope::default()
    }
}

/// The writers of a deployment: the watcher and one node agent per node, on one server.
struct Writers {
    watcher: Writer,
    agents: BTreeMap<String, Writer>,
}

impl Writers {
    async fn connect(h: &Harness, cluster: &Cluster) -> Self {
        let client = h.client().await;
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

    async fn resync_watcher(&mut self, cluster: &Cluster) {
        self.watcher
            .resync_scope_ok(
                watcher_scope(),
                Some(cluster.topology(PodWriters::NodeAgents)),
                cluster.watcher_view(),
            )
            .await;
    }

    async fn resync_agent(&mut self, cluster: &Cluster, location: &str) {
        let agent = self.agents.get_mut(location).expect("an agent per node");
        agent
            .resync_scope_ok(
                scope::pods_at(location),
                None,
                cluster.pods_view_at(location),
            )
            .await;
    }

    /// Sends a batch of the cluster's changes, each part by the writer that owns it.
    async fn apply(&mut self, batch: Vec<Update>) {
        let split = SplitBatch::of(batch);
        if !split.watcher.is_empty() {
            self.watcher.apply_ok(split.watcher).await;
        }
        for (location, pods) in split.pods {
            let agent = self.agents.get_mut(&location).expect("an agent per node");
            agent.apply_ok(pods).await;
        }
    }
}

/// Starts the system with `config` and three workers whose service deletions go to `log`.
async fn start(config: ServerConfig, log: &DeletionLog) -> Harness {
    clb_tests::init_tracing();
    let mut options = Options::e2e();
    options.server = config;
    options.workers = 0;
    let mut h = Harness::start(options).await;
    for i in 0..3 {
        h.spawn_worker_with(&format!("w{i}"), |n| log.wrap(n));
    }
    h
}

/// Restarts the server; the workers come back at once (with the deletion log).
async fn restart(h: &mut Harness, log: &DeletionLog) {
    for id in h.restart_server_without_workers().await {
        h.spawn_worker_with(&id, |n| log.wrap(n));
    }
}

fn set_latency(h: &Harness, ms: u64) {
    let mut c = h.emulator().config();
    c.latency_ms = ms;
    h.emulator().set_config(c).expect("valid config");
}

/// The removals of the emulator's log after `from` (its position as `stats().removals`).
fn removals_after(h: &Harness, from: u64) -> Vec<Removal> {
    h.emulator()
        .removals()
        .into_iter()
        .filter(|r| r.seq > from)
        .collect()
}

/// Waits until the restart gate is open.
async fn wait_gate_open(h: &Harness, what: &str) {
    h.wait_status(what, PATIENCE, |s| {
        s.gateways[0]
            .init
            .as_ref()
            .is_some_and(|i| i.removals_allowed)
    })
    .await;
}

/// A converged cluster, then the first half of a rollout with NRP slowed down so that the server is
/// stopped while units are in flight; the server restarts, the watcher and the node agents come
/// back in a random order with random delays (agents up to seconds after the watcher); nothing
/// desired at the restart is removed; then the rollout finishes and the cluster converges.
async fn restart_mid_rollout(config: ServerConfig, test: &str) {
    let seed = seed(test);
    let mut rng = StdRng::seed_from_u64(seed);
    let log = DeletionLog::new();
    let mut h = start(config, &log).await;
    let mut cluster = Cluster::generate(spec(seed));
    let mut writers = Writers::connect(&h, &cluster).await;
    writers.resync_watcher(&cluster).await;
    for i in cluster.nodes() {
        let l = clb_embedded::cluster::location_ip(i);
        writers.resync_agent(&cluster, &l).await;
    }
    h.converge(&cluster.expected(), PATIENCE).await;

    // The first half of the rollout, with NRP slowed down: the server goes down while NRP holds
    // some old pods not yet removed and some new ones not yet added, with calls in flight.
    set_latency(&h, 300);
    let apps = cluster.spec().apps;
    for app in 0..apps / 2 {
        for b in cluster.roll_app(app) {
            writers.apply(b).await;
        }
    }
    let deadline = std::time::Instant::now() + PATIENCE;
    while h.emulator().stats().in_flight_mutations == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "seed {seed}: no NRP call in flight"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // What Kubernetes wants while the server is down.
    let at_restart = cluster.expected();

    restart(&mut h, &log).await;
    let removals_at_restart = h.emulator().stats().removals;
    let deletions_at_restart = log.len();
    set_latency(&h, 2);

    // The writers come back: the watcher within a second, each node agent within three seconds,
    // in a random order (some agents may come before the watcher).
    let mut writers = Writers::connect(&h, &cluster).await;
    let mut arrivals: Vec<(u64, Option<String>)> = vec![(rng.random_range(0..1000), None)];
    for i in cluster.nodes() {
        let l = clb_embedded::cluster::location_ip(i);
        arrivals.push((rng.random_range(0..3000), Some(l)));
    }
    arrivals.sort();
    let mut last_ms = 0;
    for (at_ms, who) in arrivals {
        tokio::time::sleep(Duration::from_millis(at_ms - last_ms)).await;
        last_ms = at_ms;
        match who {
            None => writers.resync_watcher(&cluster).await,
            Some(l) => writers.resync_agent(&cluster, &l).await,
        }
        // Whatever the server sends meanwhile must not remove what is desired.
        let bad = spurious(&removals_after(&h, removals_at_restart), &at_restart);
        assert!(
            bad.is_empty(),
            "seed {seed}: still-desired backends removed before every writer resynced: {bad:?}"
        );
    }
    wait_gate_open(&h, "every writer resynced").await;
    // Let what the gate released reach NRP before looking at the logs.
    h.wait_idle(PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    h.compare(&at_restart)
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let bad = spurious(&removals_after(&h, removals_at_restart), &at_restart);
    assert!(
        bad.is_empty(),
        "seed {seed}: {} still-desired backends removed across the restart: {bad:?}",
        bad.len()
    );
    let bad = log.deleted_desired(deletions_at_restart, &at_restart);
    assert!(
        bad.is_empty(),
        "seed {seed}: still-desired services deleted: {bad:?}"
    );

    // The rollout goes on: the second half, then convergence.
    let removals_before_end = h.emulator().stats().removals;
    for app in apps / 2..apps {
        for b in cluster.roll_app(app) {
            writers.apply(b).await;
        }
    }
    let end = cluster.expected();
    h.try_converge(&end, PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let bad = spurious(&removals_after(&h, removals_before_end), &end);
    assert!(
        bad.is_empty(),
        "seed {seed}: new pods lost services: {bad:?}"
    );
    let bad = log.deleted_desired(deletions_at_restart, &end);
    assert!(
        bad.is_empty(),
        "seed {seed}: desired services deleted: {bad:?}"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_rollout_with_default_flags_removes_no_live_backend() {
    restart_mid_rollout(default_config(), "default flags").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_rollout_with_the_deploy_flags_removes_no_live_backend() {
    restart_mid_rollout(deploy_config(), "deploy flags").await;
}

/// A converged cluster with its writers.
async fn converged(config: ServerConfig, seed: u64, log: &DeletionLog) -> (Harness, Cluster) {
    let h = start(config, log).await;
    let cluster = Cluster::generate(spec(seed));
    let mut writers = Writers::connect(&h, &cluster).await;
    writers.resync_watcher(&cluster).await;
    for i in cluster.nodes() {
        let l = clb_embedded::cluster::location_ip(i);
        writers.resync_agent(&cluster, &l).await;
    }
    h.try_converge(&cluster.expected(), PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    (h, cluster)
}

/// The locations NRP holds now.
fn nrp_locations(h: &Harness) -> BTreeSet<String> {
    let dump = h.emulator().dump();
    dump.gateway(GATEWAY)
        .map(|g| {
            g.address_locations
                .iter()
                .map(|l| l.address_location.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// NRP's addresses now, `(location, address) → services`.
fn nrp_addresses(h: &Harness) -> BTreeMap<(String, String), BTreeSet<String>> {
    h.emulator()
        .dump()
        .gateway(GATEWAY)
        .map(|g| g.address_map())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_deleted_while_the_server_was_down_is_removed_after_the_watchers_resync() {
    let seed = seed("deleted node");
    let mut rng = StdRng::seed_from_u64(seed);
    let log = DeletionLog::new();
    let (mut h, mut cluster) = converged(default_config(), seed, &log).await;

    // The server goes down (a new one starts, but no worker and no writer reach it yet).
    let ids = h.restart_server_without_workers().await;
    let removals_at_restart = h.emulator().stats().removals;
    // Meanwhile a node is deleted with its pods, and another node's agent is slow to come back.
    let in_nrp: Vec<String> = nrp_locations(&h).into_iter().collect();
    let gone_loc = in_nrp[rng.random_range(0..in_nrp.len())].clone();
    let gone = cluster
        .nodes()
        .into_iter()
        .find(|i| clb_embedded::cluster::location_ip(*i) == gone_loc)
        .expect("a node of the cluster");
    let _ = cluster.delete_node(gone);
    let others: Vec<String> = in_nrp.iter().filter(|l| **l != gone_loc).cloned().collect();
    let slow = others[rng.random_range(0..others.len())].clone();
    for id in ids {
        h.spawn_worker_with(&id, |n| log.wrap(n));
    }
    let mut writers = Writers::connect(&h, &cluster).await;
    writers.resync_watcher(&cluster).await;
    for l in cluster
        .nodes()
        .into_iter()
        .map(clb_embedded::cluster::location_ip)
    {
        if l != slow {
            writers.resync_agent(&cluster, &l).await;
        }
    }

    // The deleted node's location goes although the slow agent has not resynced yet.
    let deadline = std::time::Instant::now() + PATIENCE;
    while nrp_locations(&h).contains(&gone_loc) {
        assert!(
            std::time::Instant::now() < deadline,
            "seed {seed}: the deleted node's location {gone_loc} stays in NRP"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let init = h.gateway_status().await.init.expect("gates");
    assert!(!init.removals_allowed, "seed {seed}: {init:?}");
    let slow_agent = format!(
        "node-agent/{}",
        clb_embedded::cluster::node_name(
            cluster
                .nodes()
                .into_iter()
                .find(|i| clb_embedded::cluster::location_ip(*i) == slow)
                .unwrap()
        )
    );
    assert_eq!(
        init.pending_writers,
        std::slice::from_ref(&slow_agent),
        "seed {seed}"
    );
    assert!(
        init.held
            .iter()
            .any(|x| x.reason == "pod_writer" && x.writer == slow_agent && x.locations == 1),
        "seed {seed}: {init:?}"
    );

    writers.resync_agent(&cluster, &slow).await;
    let end = cluster.expected();
    h.try_converge(&end, PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let bad = spurious(&removals_after(&h, removals_at_restart), &end);
    assert!(
        bad.is_empty(),
        "seed {seed}: live backends removed: {bad:?}"
    );
    let bad = log.deleted_desired(0, &end);
    assert!(
        bad.is_empty(),
        "seed {seed}: desired services deleted: {bad:?}"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_agent_that_never_returns_holds_back_only_its_location_and_only_for_the_bound() {
    let seed = seed("absent agent");
    let mut rng = StdRng::seed_from_u64(seed);
    let log = DeletionLog::new();
    let mut config = default_config();
    // Short enough for a test, long enough for the other locations to converge meanwhile.
    config.resync_wait = Duration::from_secs(15);
    let (mut h, mut cluster) = converged(config, seed, &log).await;

    let ids = h.restart_server_without_workers().await;
    let removals_at_restart = h.emulator().stats().removals;
    // While the server is down every app scales down; one node's agent never comes back.
    let before = cluster.expected();
    let _ = cluster.scale_down(3);
    let after = cluster.expected();
    let removed: BTreeSet<(String, String)> = before
        .addresses
        .keys()
        .filter(|k| !after.addresses.contains_key(*k))
        .cloned()
        .collect();
    let with_removals: Vec<String> = removed
        .iter()
        .map(|(l, _)| l.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert!(with_removals.len() > 1, "seed {seed}: {removed:?}");
    let absent = with_removals[rng.random_range(0..with_removals.len())].clone();
    let absent_node = cluster
        .nodes()
        .into_iter()
        .find(|i| clb_embedded::cluster::location_ip(*i) == absent)
        .unwrap();
    let absent_agent = clb_embedded::cluster::node_agent(absent_node);
    for id in ids {
        h.spawn_worker_with(&id, |n| log.wrap(n));
    }
    let mut writers = Writers::connect(&h, &cluster).await;
    writers.resync_watcher(&cluster).await;
    for l in cluster
        .nodes()
        .into_iter()
        .map(clb_embedded::cluster::location_ip)
    {
        if l != absent {
            writers.resync_agent(&cluster, &l).await;
        }
    }

    // Every other location loses its scaled-down pods, while the absent agent's location keeps
    // all of them.
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let have = nrp_addresses(&h);
        let left: Vec<&(String, String)> = removed
            .iter()
            .filter(|k| k.0 != absent && have.contains_key(*k))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "seed {seed}: scaled-down pods stay in NRP: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let init = h.gateway_status().await.init.expect("gates");
    let have = nrp_addresses(&h);
    assert!(!init.removals_allowed, "seed {seed}: {init:?}");
    assert_eq!(
        init.pending_writers,
        std::slice::from_ref(&absent_agent),
        "seed {seed}"
    );
    let held = init
        .held
        .iter()
        .find(|x| x.reason == "pod_writer")
        .unwrap_or_else(|| panic!("seed {seed}: {init:?}"));
    assert_eq!(held.writer, absent_agent);
    assert_eq!(held.locations, 1);
    assert!(held.addresses > 0 && held.deadline_unix_ms > 0, "{held:?}");
    for (k, refs) in &before.addresses {
        if k.0 == absent {
            assert_eq!(
                have.get(k),
                Some(refs),
                "seed {seed}: {k:?} at the absent agent's location changed"
            );
        }
    }
    let early = removals_after(&h, removals_at_restart);
    assert!(
        early.iter().all(|r| r.location != absent),
        "seed {seed}: removals at the held location: {early:?}"
    );
    let bad = spurious(&early, &after);
    assert!(
        bad.is_empty(),
        "seed {seed}: live backends removed: {bad:?}"
    );

    // The bound passes: the server proceeds without the agent (the scaled-down pods there go).
    wait_gate_open(&h, "the bounded wait ends").await;
    h.wait_server_idle(PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let have = nrp_addresses(&h);
    for k in removed.iter().filter(|k| k.0 == absent) {
        assert!(!have.contains_key(k), "seed {seed}: {k:?} still in NRP");
    }
    // When the agent finally comes back, its pods get their egresses again.
    writers.resync_agent(&cluster, &absent).await;
    h.try_converge(&after, PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let bad = spurious(
        &removals_after(&h, removals_at_restart)
            .into_iter()
            .filter(|r| r.location != absent)
            .collect::<Vec<_>>(),
        &after,
    );
    assert!(
        bad.is_empty(),
        "seed {seed}: live backends removed: {bad:?}"
    );
    let bad = log.deleted_desired(0, &after);
    assert!(
        bad.is_empty(),
        "seed {seed}: desired services deleted: {bad:?}"
    );
    h.shutdown().await;
}
