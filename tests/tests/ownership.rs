//! A change of who owns the pods never strands state: the state server, sync workers and the NRP
//! emulator over loopback, with a watcher and one node agent per node.
//!
//! The watcher first reports every pod (`--pods=true`, its topology names itself as every node's
//! pod writer). Then it stops (`--pods=false`, the topology names the node agents) and pods are
//! deleted: the agents come in a random order with random delays (the seed is printed,
//! `CLB_OWNERSHIP_SEED` replays one), except one that never comes. Each location loses its deleted
//! pods once its agent resynced; the absent agent's location keeps everything until the bounded
//! wait ends, then loses the pods the watcher wrote; no still-desired backend is removed anywhere
//! else. Then the watcher takes the pods back, with nothing held. Waits only bound a hung test
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
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// 8 nodes, 8 apps of 6 pods, every 10th pod not ready.
fn spec(seed: u64) -> ClusterSpec {
    ClusterSpec {
        seed,
        ..ClusterSpec::small(8, 8, 6)
    }
}

/// The seed of this run: `CLB_OWNERSHIP_SEED`, or a random one (printed).
fn seed(test: &str) -> u64 {
    let seed = std::env::var("CLB_OWNERSHIP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{test}: seed {seed} (replay with CLB_OWNERSHIP_SEED={seed})");
    seed
}

/// The watcher's scope with `--pods=false`.
fn watcher_scope() -> ResyncScope {
    ResyncScope {
        services: true,
        egresses: true,
        endpoints: true,
        ..ResyncScope::default()
    }
}

struct Writers {
    watcher: Writer,
    agents: BTreeMap<String, Writer>,
    /// Agents that have resynced since the watcher gave them the pods (they send their pods).
    arrived: BTreeSet<String>,
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
            arrived: BTreeSet::new(),
        }
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
        self.arrived.insert(location.to_owned());
    }

    /// Sends a batch of the cluster's changes with node agents as pod writers: the pods of a node
    /// whose agent is not there are reported by nobody.
    async fn apply(&mut self, batch: Vec<Update>) {
        let split = SplitBatch::of(batch);
        if !split.watcher.is_empty() {
            self.watcher.apply_ok(split.watcher).await;
        }
        for (location, pods) in split.pods {
            if self.arrived.contains(&location) {
                let agent = self.agents.get_mut(&location).expect("an agent per node");
                agent.apply_ok(pods).await;
            }
        }
    }
}

fn removals_after(h: &Harness, from: u64) -> Vec<Removal> {
    h.emulator()
        .removals()
        .into_iter()
        .filter(|r| r.seq > from)
        .collect()
}

fn nrp_addresses(h: &Harness) -> BTreeMap<(String, String), BTreeSet<String>> {
    h.emulator()
        .dump()
        .gateway(GATEWAY)
        .map(|g| g.address_map())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_handed_from_the_watcher_to_node_agents_and_back_are_never_stranded() {
    let seed = seed("ownership");
    let mut rng = StdRng::seed_from_u64(seed);
    clb_tests::init_tracing();
    let log = DeletionLog::new();
    let mut options = Options::e2e();
    options.server = ServerConfig {
        // Short enough for a test, long enough for the other locations to converge meanwhile.
        resync_wait: Duration::from_secs(15),
        ..options.server
    };
    options.workers = 0;
    let mut h = Harness::start(options).await;
    for i in 0..3 {
        h.spawn_worker_with(&format!("w{i}"), |n| log.wrap(n));
    }
    let mut cluster = Cluster::generate(spec(seed));
    let mut writers = Writers::connect(&h, &cluster).await;

    // The watcher reports every pod.
    writers
        .watcher
        .resync_scope_ok(
            scope::all(),
            Some(cluster.topology(PodWriters::Watcher)),
            cluster.full_view(),
        )
        .await;
    h.try_converge(&cluster.expected(), PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));

    // It stops: node agents own the pods from now on. Then every app scales down.
    writers
        .watcher
        .resync_scope_ok(
            watcher_scope(),
            Some(cluster.topology(PodWriters::NodeAgents)),
            cluster.watcher_view(),
        )
        .await;
    let removals_at_switch = h.emulator().stats().removals;
    let before = cluster.expected();
    for b in cluster.scale_down(4) {
        writers.apply(b).await;
    }
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
    let absent_agent = clb_embedded::cluster::node_agent(
        cluster
            .nodes()
            .into_iter()
            .find(|i| clb_embedded::cluster::location_ip(*i) == absent)
            .unwrap(),
    );

    // The agents come in a random order with random delays; the absent one never does.
    let mut arrivals: Vec<String> = cluster
        .nodes()
        .into_iter()
        .map(clb_embedded::cluster::location_ip)
        .filter(|l| *l != absent)
        .collect();
    arrivals.shuffle(&mut rng);
    for l in arrivals {
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..400))).await;
        writers.resync_agent(&cluster, &l).await;
        let bad = spurious(&removals_after(&h, removals_at_switch), &after);
        assert!(
            bad.is_empty(),
            "seed {seed}: still-desired backends removed during the handover: {bad:?}"
        );
    }
    // A pod deleted now, at a location whose agent resynced, goes with that agent's update.
    let before_second = cluster.expected();
    for b in cluster.scale_down(3) {
        writers.apply(b).await;
    }
    let end = cluster.expected();
    let removed_later: BTreeSet<(String, String)> = before_second
        .addresses
        .keys()
        .filter(|k| !end.addresses.contains_key(*k))
        .cloned()
        .collect();
    let all_removed: BTreeSet<(String, String)> = removed.union(&removed_later).cloned().collect();

    // Every other location loses its deleted pods; the absent agent's keeps everything.
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let have = nrp_addresses(&h);
        let left: Vec<&(String, String)> = all_removed
            .iter()
            .filter(|k| k.0 != absent && have.contains_key(*k))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "seed {seed}: deleted pods stay in NRP after their agent resynced: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Sample NRP, then confirm that the absent agent's location was still held meanwhile.
    let have = nrp_addresses(&h);
    let early = removals_after(&h, removals_at_switch);
    let init = h.gateway_status().await.init.expect("gates");
    let held = init
        .held
        .iter()
        .find(|x| x.reason == "pod_writer" && x.writer == absent_agent);
    if let Some(held) = held {
        assert_eq!(
            init.pending_writers,
            std::slice::from_ref(&absent_agent),
            "seed {seed}"
        );
        assert_eq!(held.locations, 1, "seed {seed}: {held:?}");
        assert!(held.deadline_unix_ms > 0, "seed {seed}: {held:?}");
        for (k, refs) in &before.addresses {
            if k.0 == absent {
                assert_eq!(
                    have.get(k),
                    Some(refs),
                    "seed {seed}: {k:?} changed before its new owner had its chance"
                );
            }
        }
        assert!(
            early.iter().all(|r| r.location != absent),
            "seed {seed}: removals at the held location: {early:?}"
        );
    } else {
        eprintln!("seed {seed}: the bound passed before the check: {init:?}");
    }
    let bad = spurious(&early, &end);
    assert!(
        bad.is_empty(),
        "seed {seed}: live backends removed: {bad:?}"
    );

    // The bound passes: the pods the watcher wrote at the absent agent's node are nobody's, and go.
    h.wait_status("the handover's bounded wait ends", PATIENCE, |s| {
        s.gateways[0]
            .init
            .as_ref()
            .is_some_and(|i| i.removals_allowed)
    })
    .await;
    h.wait_server_idle(PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let have = nrp_addresses(&h);
    for k in all_removed.iter().filter(|k| k.0 == absent) {
        assert!(!have.contains_key(k), "seed {seed}: {k:?} still in NRP");
    }
    let bad = spurious(
        &removals_after(&h, removals_at_switch)
            .into_iter()
            .filter(|r| r.location != absent)
            .collect::<Vec<_>>(),
        &end,
    );
    assert!(
        bad.is_empty(),
        "seed {seed}: live backends removed: {bad:?}"
    );
    // When the agent finally comes, its pods get their egresses again.
    writers.resync_agent(&cluster, &absent).await;
    h.try_converge(&end, PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));

    // The reverse: the watcher reports every pod again. Its resync covers every location: nothing
    // waits, and nothing desired is removed.
    let removals_back = h.emulator().stats().removals;
    writers
        .watcher
        .resync_scope_ok(
            scope::all(),
            Some(cluster.topology(PodWriters::Watcher)),
            cluster.full_view(),
        )
        .await;
    let init = h.gateway_status().await.init.expect("gates");
    assert!(
        init.removals_allowed && init.held.is_empty(),
        "seed {seed}: {init:?}"
    );
    let before_last = cluster.expected();
    let batches = cluster.scale_down(2);
    for b in batches {
        writers.watcher.apply_ok(b).await;
    }
    let last = cluster.expected();
    h.try_converge(&last, PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let bad = spurious(&removals_after(&h, removals_back), &last);
    assert!(
        bad.is_empty(),
        "seed {seed}: live backends removed after the watcher took the pods back: {bad:?}"
    );
    assert!(before_last.addresses.len() > last.addresses.len());
    let bad = log.deleted_desired(0, &last);
    assert!(
        bad.is_empty(),
        "seed {seed}: desired services deleted: {bad:?}"
    );
    h.shutdown().await;
}
