//! High availability with several gateways: two state-server replicas elect a leader with a
//! `coordination.k8s.io/v1` Lease on the fake Kubernetes API, behind a loopback stand-in for the
//! Kubernetes Service, and drive two gateways, `east` (the default) and `west`, each on its own NRP
//! emulator standing for a region (the gateways file and the emulators are
//! `Harness::start_gateways`'s). Per gateway the cluster's writers are a watcher's writer declaring
//! that gateway's nodes and the node agents of those nodes. The leader is killed mid-rollout; no
//! backend still desired is removed in either region, and the standby takes over and both gateways
//! converge. Waits only bound a hung test (`PATIENCE`); nothing here asserts on time. The seed
//! is printed (`CLB_HA_SEED` replays one).

use std::time::Duration;

use clb_sync_worker::worker::Backoff;
use clb_tests::ha::{LEASE, NAMESPACE, System, Writers, deploy_config, short_election, wait_until};
use clb_tests::regions::{Locations, expected_for, split_nodes};
use clb_tests::{Cluster, ClusterSpec, Expected, Options};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const EAST: &str = "east";
const WEST: &str = "west";
const GATEWAYS: [&str; 2] = [EAST, WEST];

fn seed(test: &str) -> u64 {
    let seed = std::env::var("CLB_HA_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{test}: seed {seed} (replay with CLB_HA_SEED={seed})");
    seed
}

/// 10 nodes (5 per gateway), 8 apps of 8 pods.
fn spec(seed: u64) -> ClusterSpec {
    ClusterSpec {
        seed,
        ..ClusterSpec::small(10, 8, 8)
    }
}

/// What each gateway's NRP must hold now (east's, then west's).
fn expected(cluster: &Cluster, parts: &[Locations]) -> [Expected; 2] {
    let all = cluster.expected();
    [0, 1].map(|i| expected_for(&all, &parts[i]))
}

/// The writers of both gateways connect through the Service and resync, each gateway's watcher
/// writer and node agents in a random order within `spread_ms`, the two gateways interleaved.
async fn connect_and_resync(
    sys: &System,
    cluster: &Cluster,
    parts: &[Locations],
    rng: &mut StdRng,
    spread_ms: u64,
) -> [Writers; 2] {
    let mut east = Writers::connect_gateway(&sys.service.url, cluster, EAST, &parts[0]).await;
    let mut west = Writers::connect_gateway(&sys.service.url, cluster, WEST, &parts[1]).await;
    let (mut r_east, mut r_west) = (
        StdRng::seed_from_u64(rng.random()),
        StdRng::seed_from_u64(rng.random()),
    );
    tokio::join!(
        east.resync_all(cluster, &mut r_east, spread_ms),
        west.resync_all(cluster, &mut r_west, spread_ms),
    );
    [east, west]
}

/// Each gateway's writers send their part of the batches of a rollout of `app`.
async fn roll(cluster: &mut Cluster, writers: &mut [Writers; 2], app: usize) {
    for batch in cluster.roll_app(app) {
        for w in writers.iter_mut() {
            w.apply(batch.clone()).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_over_with_two_gateways_removes_no_live_backend_in_either() {
    clb_tests::init_tracing();
    let seed = seed("fail-over with two gateways");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut options = Options::e2e();
    options.server = deploy_config();
    let backoff = Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(200),
    };
    let mut sys = System::start_gateways(seed, options, short_election, backoff, &GATEWAYS).await;
    assert_eq!(sys.gateways(), GATEWAYS);
    assert_eq!(sys.api.lease_holder(NAMESPACE, LEASE), "replica-a");

    let mut cluster = Cluster::generate(spec(seed));
    let parts = split_nodes(&cluster, 2);
    assert!(
        parts.iter().all(|p| !p.is_empty()),
        "seed {seed}: a gateway without nodes"
    );
    let mut writers = connect_and_resync(&sys, &cluster, &parts, &mut rng, 10).await;
    let converged = expected(&cluster, &parts);
    for (g, e) in GATEWAYS.iter().zip(&converged) {
        sys.converge_gateway(g, e, seed).await;
        assert!(
            sys.emulator_of(g).removals().is_empty(),
            "seed {seed}: {g}: a removal while converging from nothing"
        );
    }

    // Half a rollout in both regions with NRP slowed down; the leader dies with calls in flight.
    for g in GATEWAYS {
        sys.set_latency_of(g, 300);
    }
    let apps = cluster.spec().apps;
    for app in 0..apps / 2 {
        roll(&mut cluster, &mut writers, app).await;
    }
    wait_until("an NRP call in flight in both regions", seed, || {
        GATEWAYS
            .iter()
            .all(|g| sys.emulator_of(g).stats().in_flight_mutations > 0)
    })
    .await;
    let at_kill = expected(&cluster, &parts);
    let removals_at_kill = GATEWAYS.map(|g| sys.emulator_of(g).stats().removals);
    let deletions_at_kill = GATEWAYS.map(|g| sys.log_of(g).len());
    sys.replicas[0].kill().await;
    for g in GATEWAYS {
        sys.set_latency_of(g, 2);
    }
    let check = |sys: &System, what: &str| {
        for (i, g) in GATEWAYS.iter().enumerate() {
            let bad = sys.removals_of_after(g, removals_at_kill[i], &at_kill[i]);
            assert!(
                bad.is_empty(),
                "seed {seed}: {what}: still-desired backends removed in {g}: {bad:?}"
            );
            let bad = sys
                .log_of(g)
                .deleted_desired(deletions_at_kill[i], &at_kill[i]);
            assert!(
                bad.is_empty(),
                "seed {seed}: {what}: desired services deleted in {g}: {bad:?}"
            );
        }
    };

    // The standby takes the Lease once it expires, and starts like a restarted server: empty, in
    // both gateways.
    let b_state = sys.replicas[1].state.clone();
    wait_until("replica-b leads", seed, || b_state.is_leader()).await;
    assert_eq!(sys.api.lease_holder(NAMESPACE, LEASE), "replica-b");
    let admin = sys.admin().await;
    for g in GATEWAYS {
        let s = clb_embedded::harness::gateway_status_named(&admin, g).await;
        assert_eq!(
            s.desired_addresses, 0,
            "seed {seed}: the new leader starts empty in {g}"
        );
    }
    check(&sys, "at the take-over");

    // The writers of both gateways notice and resync with the new leader, in a random order.
    let mut writers = connect_and_resync(&sys, &cluster, &parts, &mut rng, 2000).await;
    check(&sys, "once every writer resynced");
    for (g, e) in GATEWAYS.iter().zip(&at_kill) {
        sys.converge_gateway(g, e, seed).await;
    }
    check(&sys, "across the fail-over");
    for (i, g) in GATEWAYS.iter().enumerate() {
        eprintln!(
            "seed {seed}: {g}: {} removals in NRP across the fail-over, none of a desired backend",
            sys.emulator_of(g).stats().removals - removals_at_kill[i]
        );
    }

    // The rollout finishes under the new leader, in both regions.
    let removals_before_end = GATEWAYS.map(|g| sys.emulator_of(g).stats().removals);
    for app in apps / 2..apps {
        roll(&mut cluster, &mut writers, app).await;
    }
    let end = expected(&cluster, &parts);
    for (i, g) in GATEWAYS.iter().enumerate() {
        sys.converge_gateway(g, &end[i], seed).await;
        let bad = sys.removals_of_after(g, removals_before_end[i], &end[i]);
        assert!(
            bad.is_empty(),
            "seed {seed}: new pods lost services in {g}: {bad:?}"
        );
    }
    sys.shutdown().await;
}
