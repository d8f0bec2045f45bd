//! Several gateways per cluster (issue 16), end to end: two gateways, `east` (the default) and
//! `west`, each on its own NRP emulator standing for a region of its own, described to the state
//! server and the sync workers by a gateways file (`--gateways-file`, through the binaries' own flag
//! parsing). The tests play the watcher: one writer per gateway, each writing every Service and
//! egress and the endpoints and pods of its gateway's nodes (half the nodes each).
//!
//! The cluster's seed is random and printed; `CLB_GATEWAYS_SEED` replays one. Waits only bound a
//! hung test ([`PATIENCE`]); nothing here asserts on time.

use std::time::Duration;

use clb_nrp_emulator::EmulatorConfig;
use clb_proto::v1::Update;
use clb_tests::recorder::spurious;
use clb_tests::regions::{Locations, expected_for, split_nodes, topology_for, view_for};
use clb_tests::{
    Cluster, ClusterSpec, Expected, Harness, Options, PATIENCE, PodWriters, Writer, WriterExt,
    scope,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const EAST: &str = "east";
const WEST: &str = "west";
const GATEWAYS: [&str; 2] = [EAST, WEST];

/// The seed of this run: `CLB_GATEWAYS_SEED`, or a random one. Printed, so that a failure can be
/// replayed.
fn seed(test: &str) -> u64 {
    let seed = std::env::var("CLB_GATEWAYS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{test}: seed {seed} (replay with CLB_GATEWAYS_SEED={seed})");
    seed
}

/// 10 nodes (5 per gateway), 8 apps of 8 pods, 11 Services, 3 egresses, every 10th pod not ready.
fn spec(seed: u64) -> ClusterSpec {
    ClusterSpec {
        seed,
        ..ClusterSpec::small(10, 8, 8)
    }
}

/// The system with two gateways on two emulators, a cluster, and its nodes split between them.
struct Regions {
    h: Harness,
    cluster: Cluster,
    /// The locations of `east`, then of `west`.
    parts: Vec<Locations>,
    seed: u64,
}

impl Regions {
    async fn start(test: &str, options: Options) -> Self {
        clb_tests::init_tracing();
        let seed = seed(test);
        let h = Harness::start_gateways(options, &GATEWAYS).await;
        assert_eq!(h.gateways(), GATEWAYS);
        let cluster = Cluster::generate(spec(seed));
        let parts = split_nodes(&cluster, 2);
        assert!(
            parts.iter().all(|p| !p.is_empty()),
            "seed {seed}: a gateway without nodes"
        );
        Self {
            h,
            cluster,
            parts,
            seed,
        }
    }

    fn part(&self, gateway: &str) -> &Locations {
        let i = GATEWAYS
            .iter()
            .position(|g| *g == gateway)
            .expect("a gateway");
        &self.parts[i]
    }

    /// What `gateway`'s NRP must hold now.
    fn expected(&self, gateway: &str) -> Expected {
        expected_for(&self.cluster.expected(), self.part(gateway))
    }

    /// The watcher's writer of `gateway` resyncs its part of the cluster, declaring its nodes.
    async fn resync(&self, writer: &mut Writer, gateway: &str) {
        let topology = topology_for(
            &self.cluster.topology(PodWriters::Watcher),
            self.part(gateway),
        );
        writer
            .resync_scope_ok(
                scope::all(),
                Some(topology),
                view_for(&self.cluster.full_view(), self.part(gateway)),
            )
            .await;
    }

    /// Each gateway's writer applies its part of `batch`.
    async fn apply(&self, writers: &mut [Writer; 2], batch: &[Update]) {
        for (w, g) in writers.iter_mut().zip(GATEWAYS) {
            let part = view_for(batch, self.part(g));
            if !part.is_empty() {
                w.apply_ok(part).await;
            }
        }
    }

    async fn writers(&self) -> [Writer; 2] {
        [self.h.writer(EAST).await, self.h.writer(WEST).await]
    }

    /// A watcher per gateway, each resynced with its region's part of the cluster.
    async fn resynced_writers(&self) -> [Writer; 2] {
        let mut writers = self.writers().await;
        for (w, g) in writers.iter_mut().zip(GATEWAYS) {
            self.resync(w, g).await;
        }
        writers
    }

    /// [`Regions::resynced_writers`], then both regions converged.
    async fn converged_writers(&self) -> [Writer; 2] {
        let writers = self.resynced_writers().await;
        for g in GATEWAYS {
            self.converge(g).await;
        }
        writers
    }

    async fn converge(&self, gateway: &str) {
        let seed = self.seed;
        self.h
            .try_converge_gateway(gateway, &self.expected(gateway), PATIENCE)
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
}

/// A Service whose endpoints are on nodes of both gateways.
fn service_in_both(r: &Regions) -> String {
    r.cluster
        .services()
        .keys()
        .find(|s| {
            let eps = r.cluster.endpoints_of(s);
            GATEWAYS
                .iter()
                .all(|g| eps.iter().any(|e| r.part(g).contains(&e.location)))
        })
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "seed {}: no Service with endpoints in both gateways",
                r.seed
            )
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_exposed_in_two_regions_converges_in_both() {
    let r = Regions::start(
        "a_service_exposed_in_two_regions_converges_in_both",
        Options::e2e(),
    )
    .await;
    let _writers = r.converged_writers().await;
    // The Service is in both regions, each with the endpoints of its own nodes only.
    let svc = service_in_both(&r);
    for g in GATEWAYS {
        let dump = r.h.dump_of(g);
        let gw = dump
            .gateway(&r.h.resource_name(g))
            .expect("the gateway exists");
        // Every call went to the ARM name of the file (serviceGateway), none to clb's name.
        assert_ne!(r.h.resource_name(g), g);
        assert!(
            dump.gateway(g).is_none(),
            "seed {}: a gateway named {g} in NRP",
            r.seed
        );
        assert!(
            gw.service_names().contains(&svc),
            "seed {}: {svc} not in {g}",
            r.seed
        );
        let addresses = gw.address_map();
        assert!(!addresses.is_empty());
        assert!(
            addresses.keys().all(|(l, _)| r.part(g).contains(l)),
            "seed {}: {g} holds an address of the other region",
            r.seed
        );
        assert!(
            addresses.values().any(|s| s.contains(&svc)),
            "seed {}: {svc} has no backend in {g}",
            r.seed
        );
        assert!(
            r.h.emulator_of(g).removals().is_empty(),
            "nothing was removed in {g}"
        );
    }
    // The comparison per gateway is not vacuous: east's state is not west's.
    assert!(
        clb_embedded::compare_gateway(
            r.h.emulator_of(WEST),
            &r.h.resource_name(WEST),
            &r.expected(EAST)
        )
        .is_err(),
        "seed {}",
        r.seed
    );
    r.h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_service_exposed_in_two_regions_drains_both() {
    let mut r = Regions::start(
        "deleting_a_service_exposed_in_two_regions_drains_both",
        Options::e2e(),
    )
    .await;
    let mut writers = r.converged_writers().await;
    let svc = service_in_both(&r);
    let batch = r.cluster.remove_service(&svc);
    r.apply(&mut writers, &batch).await;
    for g in GATEWAYS {
        r.converge(g).await;
        let dump = r.h.dump_of(g);
        let gw = dump
            .gateway(&r.h.resource_name(g))
            .expect("the gateway exists");
        assert!(
            !gw.service_names().contains(&svc),
            "seed {}: {svc} left in {g}",
            r.seed
        );
        assert!(
            gw.address_map().values().all(|s| !s.contains(&svc)),
            "seed {}: an address of {g} still refers to {svc}",
            r.seed
        );
        let lb = clb_sync_worker::worker::load_balancer_name(&svc);
        assert!(
            dump.load_balancers
                .iter()
                .all(|x| x.name.as_deref() != Some(lb.as_str())),
            "seed {}: the load balancer of {svc} is left in {g}",
            r.seed
        );
    }
    r.h.shutdown().await;
}

/// Every call of the region fails with a 5xx (reads too).
fn failing() -> EmulatorConfig {
    EmulatorConfig {
        fault_rate_5xx: 1.0,
        faults_on_reads: true,
        ..Options::e2e().emulator
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_region_does_not_hold_up_the_other_and_catches_up_once_healed() {
    let r = Regions::start(
        "a_failing_region_does_not_hold_up_the_other_and_catches_up_once_healed",
        Options::e2e(),
    )
    .await;
    r.h.emulator_of(WEST)
        .set_config(failing())
        .expect("valid config");
    let _writers = r.resynced_writers().await;
    // East converges while every call to west fails.
    r.converge(EAST).await;
    let west = r.h.emulator_of(WEST);
    assert!(
        west.stats().rejected_by_code.values().sum::<u64>() > 0,
        "seed {}: west was never called",
        r.seed
    );
    let err = clb_embedded::compare_gateway(west, &r.h.resource_name(WEST), &r.expected(WEST))
        .expect_err("west cannot hold its state while every call fails");
    assert!(err.contains("missing"), "seed {}: {err}", r.seed);
    assert!(
        r.h.emulator_of(EAST).stats().rejected_by_code.is_empty(),
        "seed {}: east saw errors: {:?}",
        r.seed,
        r.h.emulator_of(EAST).stats().rejected_by_code
    );
    // West heals and catches up; east stays as it is.
    west.set_config(Options::e2e().emulator)
        .expect("valid config");
    r.converge(WEST).await;
    r.converge(EAST).await;
    assert!(r.h.emulator_of(EAST).removals().is_empty());
    r.h.shutdown().await;
}

/// Every call of west hangs (far longer than the test waits), reads too; one worker with two
/// slots, and leases longer than the test: west's units hold their slots for good. East keeps a
/// slot of the worker and converges all the same (a worker's slots are shared fairly between the
/// gateways it serves); then west heals and catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_region_does_not_take_every_slot_of_a_worker() {
    let mut options = Options::e2e();
    options.workers = 1;
    options.worker_capacity = 2;
    options.server.dispatch.lease = PATIENCE * 10;
    let r = Regions::start(
        "a_hanging_region_does_not_take_every_slot_of_a_worker",
        options,
    )
    .await;
    let west = r.h.emulator_of(WEST);
    west.set_config(EmulatorConfig {
        fault_rate_timeout: 1.0,
        timeout_hold_ms: 10 * PATIENCE.as_millis() as u64,
        faults_on_reads: true,
        ..Options::e2e().emulator
    })
    .expect("valid config");
    let _writers = r.resynced_writers().await;
    r.converge(EAST).await;
    let status = r.h.gateway_status_of(WEST).await;
    assert!(
        status.units_in_flight > 0,
        "seed {}: west holds no unit: {status:?}",
        r.seed
    );
    assert!(
        clb_embedded::compare_gateway(west, &r.h.resource_name(WEST), &r.expected(WEST)).is_err(),
        "seed {}: west converged while every call hangs",
        r.seed
    );
    r.h.shutdown().await;
}

fn set_latency(h: &Harness, gateway: &str, ms: u64) {
    let mut c = h.emulator_of(gateway).config();
    c.latency_ms = ms;
    h.emulator_of(gateway).set_config(c).expect("valid config");
}

/// A converged cluster in both regions, then half of a rollout with both regions slowed down so
/// that the server stops with units in flight; the server restarts and reads the gateways file
/// again; the writers of the two gateways come back in a random order with random delays; no
/// backend desired at the restart is removed in either region; then the rollout ends and both
/// converge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_two_gateways_removes_no_live_backend_in_either() {
    let mut r = Regions::start(
        "a_restart_with_two_gateways_removes_no_live_backend_in_either",
        Options::e2e(),
    )
    .await;
    let seed = r.seed;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut writers = r.converged_writers().await;

    for g in GATEWAYS {
        set_latency(&r.h, g, 300);
    }
    let apps = r.cluster.spec().apps;
    for app in 0..apps / 2 {
        for b in r.cluster.roll_app(app) {
            r.apply(&mut writers, &b).await;
        }
    }
    let deadline = std::time::Instant::now() + PATIENCE;
    while GATEWAYS
        .iter()
        .all(|g| r.h.emulator_of(g).stats().in_flight_mutations == 0)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "seed {seed}: no NRP call in flight"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let at_restart = GATEWAYS.map(|g| r.expected(g));

    r.h.restart_server().await;
    let removals_at_restart = GATEWAYS.map(|g| r.h.emulator_of(g).stats().removals);
    for g in GATEWAYS {
        set_latency(&r.h, g, 2);
    }
    let check = |r: &Regions, what: &str| {
        for (i, g) in GATEWAYS.iter().enumerate() {
            let removals: Vec<_> =
                r.h.emulator_of(g)
                    .removals()
                    .into_iter()
                    .filter(|x| x.seq > removals_at_restart[i])
                    .collect();
            let bad = spurious(&removals, &at_restart[i]);
            assert!(
                bad.is_empty(),
                "seed {seed}: {what}: still-desired backends removed in {g}: {bad:?}"
            );
        }
    };

    // The writers come back in a random order, within a second each.
    let mut writers = r.writers().await;
    let mut order: Vec<(u64, usize)> = (0..2).map(|i| (rng.random_range(0..1000), i)).collect();
    order.sort();
    let mut last_ms = 0;
    for (at_ms, i) in order {
        tokio::time::sleep(Duration::from_millis(at_ms - last_ms)).await;
        last_ms = at_ms;
        r.resync(&mut writers[i], GATEWAYS[i]).await;
        check(&r, "before every writer resynced");
    }
    for (i, g) in GATEWAYS.iter().enumerate() {
        r.h.wait_idle_gateway(g, PATIENCE)
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: {g}: {e}"));
        clb_embedded::compare_gateway(r.h.emulator_of(g), &r.h.resource_name(g), &at_restart[i])
            .unwrap_or_else(|e| panic!("seed {seed}: {g}: {e}"));
    }
    check(&r, "across the restart");

    // The rollout goes on, then both converge.
    for app in apps / 2..apps {
        for b in r.cluster.roll_app(app) {
            r.apply(&mut writers, &b).await;
        }
    }
    for g in GATEWAYS {
        r.converge(g).await;
    }
    r.h.shutdown().await;
}

/// The gateways file `deploy/` ships (ConfigMap `clb-gateways`) is read by the state server (as
/// its manifest runs it) and the workers through their own flags: one gateway, `default`, what
/// `--gateways=default` drove before.
#[test]
fn the_deployed_gateways_file_is_read_by_the_server_and_the_workers() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/gateways.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/gateways.yaml");
    let doc: yaml_serde::Value = yaml_serde::from_str(&text).expect("YAML");
    assert_eq!(doc["kind"].as_str(), Some("ConfigMap"));
    assert_eq!(doc["metadata"]["name"].as_str(), Some("clb-gateways"));
    let file = doc["data"]["gateways.yaml"]
        .as_str()
        .expect("data.gateways.yaml");
    let local =
        std::env::temp_dir().join(format!("clb-deployed-gateways-{}.yaml", std::process::id()));
    std::fs::write(&local, file).expect("write");

    let mut server = clb_tests::deploy::state_server_args();
    assert_eq!(
        server.gateways_file.as_deref(),
        Some(std::path::Path::new("/etc/clb/gateways/gateways.yaml"))
    );
    server.gateways_file = Some(local.clone());
    server.load_gateways_file().expect("the server reads it");
    assert_eq!(server.to_server_config().gateways, ["default"]);

    let flag = format!("--gateways-file={}", local.display());
    let worker = <clb_sync_worker::cli::Args as clap::Parser>::try_parse_from([
        "clb-sync-worker",
        "--credential=none",
        flag.as_str(),
    ])
    .expect("the worker's flags");
    let read = worker
        .gateways_file()
        .expect("the worker reads it")
        .expect("given");
    let arms = worker.gateway_arm_configs(&read).expect("valid");
    assert_eq!(arms.len(), 1);
    assert_eq!(arms[0].0, "default");
    assert_eq!(arms[0].1.resource_group, "my-cluster-nodes-rg");
    assert_eq!(worker.worker_config().expect("valid").gateways, ["default"]);
    std::fs::remove_file(local).expect("remove");
}
