//! High availability: two state-server replicas elect a leader with a `coordination.k8s.io/v1`
//! Lease on the fake Kubernetes API (`tests/src/fake_kube.rs`), behind a loopback stand-in for the
//! Kubernetes Service (new connections go to the replica that leads, as the Service routes to the
//! ready pod). Three sync workers and the NRP emulator; the writers are a watcher and one node
//! agent per node. Waits only bound a hung test ([`PATIENCE`]); nothing here asserts on time, only
//! on order. The seed is printed (`CLB_HA_SEED` replays one).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clb_client::client::{Client, ConnectOptions};
use clb_embedded::harness::gateway_status_at;
use clb_sync_worker::worker::Backoff;
use clb_tests::fake_kube::FakeApi;
use clb_tests::ha::{LEASE, NAMESPACE, System, Writers, deploy_config, short_election, wait_until};
use clb_tests::{Cluster, ClusterSpec, Options, WATCHER};
use rand::SeedableRng;
use rand::rngs::StdRng;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn seed(test: &str) -> u64 {
    let seed = std::env::var("CLB_HA_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{test}: seed {seed} (replay with CLB_HA_SEED={seed})");
    seed
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

/// The system with the server's flags as deploy/ runs it (leader election on, no
/// `--expected-writers`), the election's timings shortened for the test.
async fn start(seed: u64) -> System {
    clb_tests::init_tracing();
    let mut options = Options::e2e();
    options.server = deploy_config();
    let backoff = Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(200),
    };
    System::start(seed, options, short_election, backoff).await
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
    let mut sys = start(seed).await;
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
    let mut writers = Writers::connect(&sys.service.url, &cluster).await;
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
    let mut writers = Writers::connect(&sys.service.url, &cluster).await;
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
    let sys = start(seed).await;
    let mut cluster = Cluster::generate(spec(seed));
    let mut writers = Writers::connect(&sys.service.url, &cluster).await;
    writers.resync_all(&cluster, &mut rng, 10).await;
    sys.converge(&cluster.expected(), seed).await;

    let (a, b) = (&sys.replicas[0], &sys.replicas[1]);
    // When replica-b starts leading, whether replica-a still leads (read from its state at that
    // moment: the listeners' own scheduling cannot reorder the two replicas' changes).
    let a_leading_when_b_started: Arc<Mutex<Option<bool>>> = Arc::default();
    {
        let mut rx = b.state.leadership();
        let a_state = a.state.clone();
        let seen = a_leading_when_b_started.clone();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                if *rx.borrow_and_update() {
                    seen.lock().unwrap().get_or_insert(a_state.is_leader());
                }
            }
        });
    }
    a.link.cut();
    wait_until("replica-b leads", seed, || b.state.is_leader()).await;
    wait_until("replica-b's start is seen", seed, || {
        a_leading_when_b_started.lock().unwrap().is_some()
    })
    .await;
    assert_eq!(
        *a_leading_when_b_started.lock().unwrap(),
        Some(false),
        "seed {seed}: the cut-off leader must stop before the new one starts"
    );
    assert!(!a.state.is_leader());
    // The old leader's worker streams are closed: nothing of it dispatches any more.
    let a_state = a.state.clone();
    wait_until("the old leader has no worker", seed, || {
        a_state.workers().is_empty()
    })
    .await;
    for g in a.state.gateways() {
        assert_eq!(g.lock().dispatch().units_in_flight(), 0);
    }

    // The cluster goes on with the new leader.
    let mut writers = Writers::connect(&sys.service.url, &cluster).await;
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
