//! Fail-over benchmark: two state-server replicas with the flags of `deploy/state-server.yaml`
//! (leader election on, its lease timings, no `--expected-writers`) elect a leader on the fake
//! Kubernetes API; three sync workers (the binary's reconnect backoff) and the NRP emulator (the
//! rollout bench's costs: 100 ms per call + 0.05 ms per address, 4 concurrent mutating calls);
//! the rollout bench's cluster (10,000 pods on 500 nodes), written by one watcher and one node
//! agent per node.
//!
//! ```sh
//! cargo bench -p clb-tests --bench failover
//! ```
//!
//! Each round rolls out every pod, and once the writes are in and NRP calls are in flight the
//! leader is killed (its elector stops without releasing the Lease; Kubernetes starts a new
//! standby in its place). Then the writers behave as `clb-watcher` does after a server is lost:
//! finds out at once (its `Writer.WatchSession` stream breaks with the killed leader), then resyncs, backing off with the watcher's own `ServerBackoff` (its defaults:
//! a refused connection waits at most 2 s) while no replica serves. Measured from the kill: the new leader's takeover, its first unit handed out, its
//! first location unit, the last writer's resync, and convergence (NRP equal to the desired state,
//! nothing pending); and the removals of still-desired backends, which must be zero.
//!
//! `CLB_BENCH_FAILOVERS` (default 20) sets the number of rounds, `CLB_BENCH_SEED` replays a run;
//! `CLB_BENCH_PODS` / `CLB_BENCH_LOCATIONS` another size.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clb_client::client::{Client, ClientError, ConnectOptions};
use clb_proto::v1::{ClusterTopology, ResyncScope, Update};
use clb_state_server::state::StateServer;
use clb_sync_worker::worker::{Backoff, Limits};
use clb_tests::bench::{CONCURRENCY, costly, env_usize, rollout_spec};
use clb_tests::ha::{System, Writers, deploy_config, deploy_election, wait_until, watcher_scope};
use clb_tests::{Cluster, Options, PodWriters, SplitBatch, WATCHER, scope};
use clb_watcher::backoff::{RECONNECT_MAX, ServerBackoff};
use clb_watcher::{Mode, WatcherConfig};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// One fail-over, every time from the kill.
#[derive(Debug, Clone, Copy)]
struct Round {
    takeover: Duration,
    first_unit: Duration,
    first_location_unit: Option<Duration>,
    last_resync: Duration,
    converged: Duration,
    in_flight_at_kill: usize,
    live_removed: usize,
}

/// What a writer resyncs with the new leader.
struct Resync {
    writer: String,
    scope: ResyncScope,
    topology: Option<ClusterTopology>,
    view: Vec<Update>,
}

fn resyncs(cluster: &Cluster, writers: &Writers) -> Vec<Resync> {
    let mut all = vec![Resync {
        writer: WATCHER.into(),
        scope: watcher_scope(),
        topology: Some(cluster.topology(PodWriters::NodeAgents)),
        view: cluster.watcher_view(),
    }];
    for (l, w) in &writers.agents {
        all.push(Resync {
            writer: w.name().to_owned(),
            scope: scope::pods_at(l),
            topology: None,
            view: cluster.pods_view_at(l),
        });
    }
    all
}

/// A writer after the server it talked to died, as `clb-watcher`'s sender: it notices at its next
/// check (`phase`), then resyncs on a new connection, paced by the watcher's own
/// [`ServerBackoff`] while no replica serves. Returns when the resync is acknowledged.
async fn writer_after_loss(
    url: String,
    r: Resync,
    phase: Duration,
    mut backoff: ServerBackoff,
) -> (Instant, BTreeMap<String, usize>) {
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    tokio::time::sleep(phase).await;
    loop {
        let mut options = ConnectOptions::new(url.clone());
        options.attempts = 1;
        let error = match Client::connect(options).await {
            Ok(client) => {
                let mut w = client.writer(r.writer.clone());
                match w
                    .resync_with_topology(r.scope.clone(), r.topology.clone(), r.view.clone())
                    .await
                {
                    Ok(o) if o.rejected.is_empty() => return (Instant::now(), errors),
                    Ok(o) => panic!("{}: resync rejected: {}", r.writer, o.describe_rejected()),
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        let kind = match &error {
            ClientError::Rpc { status, .. } => format!("{:?}", status.code()),
            ClientError::Connect { .. } => "Connect".into(),
            other => format!("{other}").chars().take(40).collect(),
        };
        *errors.entry(kind).or_default() += 1;
        tokio::time::sleep(backoff.next_delay(&error)).await;
    }
}

/// Sends a rollout's batches as the cluster's writers do: the watcher's part, then every node
/// agent's part at once.
async fn write(writers: &mut Writers, batches: Vec<Vec<Update>>) {
    for batch in batches {
        let split = SplitBatch::of(batch);
        if !split.watcher.is_empty() {
            let r = writers.watcher.apply(split.watcher).await.expect("apply");
            assert!(r.rejected.is_empty(), "{}", r.describe_rejected());
        }
        let mut pods: BTreeMap<String, Vec<Update>> = split.pods.into_iter().collect();
        let calls = writers
            .agents
            .iter_mut()
            .filter_map(|(l, w)| pods.remove(l).map(|p| (w, p)))
            .map(|(w, p)| async move {
                let r = w.apply(p).await.expect("apply");
                assert!(r.rejected.is_empty(), "{}", r.describe_rejected());
            });
        futures::future::join_all(calls).await;
    }
}

async fn first(what: &str, seed: u64, from: Instant, f: impl Fn() -> bool) -> Duration {
    wait_until(what, seed, f).await;
    from.elapsed()
}

fn units(s: &StateServer, kind: &str) -> u64 {
    s.metrics().units_leased(kind)
}

async fn run(seed: u64, rounds: usize) -> Vec<Round> {
    let mut rng = StdRng::seed_from_u64(seed);
    let options = Options {
        nat_gateway_resource_group: None,
        workers: 3,
        worker_capacity: 4,
        worker_limits: Limits {
            max_locations_per_call: 100,
            max_concurrent_mutations_per_gateway: CONCURRENCY,
            ..Limits::default()
        },
        emulator: clb_nrp_emulator::EmulatorConfig::default(),
        server: deploy_config(),
        auth: None,
    };
    let mut sys = System::start(seed, options, deploy_election, Backoff::default()).await;
    let writer_defaults = WatcherConfig::new(
        ConnectOptions::new(sys.service.url.clone()),
        Mode::Cluster { pods: false },
    );
    let mut cluster = Cluster::generate(rollout_spec());
    let mut writers = Writers::connect(&sys.service.url, &cluster).await;
    writers.resync_all(&cluster, &mut rng, 10).await;
    sys.converge(&cluster.expected(), seed).await;
    eprintln!("cluster built: {} pods", cluster.pods().len());

    let mut out = Vec::new();
    for round in 1..=rounds {
        sys.emulator().set_config(costly()).expect("valid config");
        let batches = cluster.roll_all();
        let expected = cluster.expected();
        write(&mut writers, batches).await;
        let in_flight = {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let n = sys.emulator().stats().in_flight_mutations;
                if n > 0 || Instant::now() > deadline {
                    break n;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        let removals_at_kill = sys.emulator().stats().removals;
        let deletions_at_kill = sys.log.len();
        let old = sys.leader().expect("a leader");
        // Units each replica had handed out before (a standby none; counted to be sure).
        let before: Vec<(u64, u64)> = sys
            .replicas
            .iter()
            .map(|r| (units(&r.state, "observe"), units(&r.state, "locations")))
            .collect();
        let (observe0, locations0) = before[1 - old];
        let killed = Instant::now();
        sys.replace(old).await;

        let writer_tasks: Vec<_> = resyncs(&cluster, &writers)
            .into_iter()
            .map(|r| {
                // The session stream broke with the leader: every writer tries at once.
                let phase = Duration::ZERO;
                tokio::spawn(writer_after_loss(
                    sys.service.url.clone(),
                    r,
                    phase,
                    ServerBackoff::new(
                        writer_defaults.backoff_initial,
                        writer_defaults.backoff_max,
                    ),
                ))
            })
            .collect();
        // The survivor or the replica started in the killed one's place: whichever wins the Lease.
        let states: Vec<Arc<StateServer>> = sys.replicas.iter().map(|r| r.state.clone()).collect();
        let takeover = first("takeover", seed, killed, || {
            states.iter().any(|s| s.is_leader())
        })
        .await;
        let leader = states
            .iter()
            .find(|s| s.is_leader())
            .expect("a leader")
            .clone();
        let (observe0, locations0) = if Arc::ptr_eq(&leader, &states[0]) {
            (observe0, locations0)
        } else {
            (0, 0)
        };
        let s = leader.clone();
        let first_unit = first("first unit", seed, killed, move || {
            units(&s, "observe") > observe0
        })
        .await;
        let s = leader.clone();
        let location_unit = tokio::spawn(async move {
            wait_until("first location unit", seed, || {
                units(&s, "locations") > locations0
            })
            .await;
            killed.elapsed()
        });
        let mut last = killed;
        let mut errors: BTreeMap<String, usize> = BTreeMap::new();
        for t in writer_tasks {
            let (at, e) = t.await.expect("writer");
            last = last.max(at);
            for (k, n) in e {
                *errors.entry(k).or_default() += n;
            }
        }
        eprintln!("round {round}: writers' failed attempts before their resync: {errors:?}");
        let last_resync = last - killed;
        sys.set_latency(costly().latency_ms);
        sys.converge(&expected, seed).await;
        let converged = killed.elapsed();
        let first_location_unit = if location_unit.is_finished() {
            location_unit.await.ok()
        } else {
            location_unit.abort();
            None
        };
        let mut bad: Vec<String> = sys
            .removals_after(removals_at_kill, &expected)
            .iter()
            .map(|r| format!("{r:?}"))
            .collect();
        bad.extend(sys.desired_deleted(deletions_at_kill, &expected));
        if !bad.is_empty() {
            eprintln!(
                "seed {seed} round {round}: still-desired backends removed: {:?}",
                &bad[..bad.len().min(5)]
            );
        }
        let r = Round {
            takeover,
            first_unit,
            first_location_unit,
            last_resync,
            converged,
            in_flight_at_kill: in_flight,
            live_removed: bad.len(),
        };
        eprintln!("round {round}: {r:?}");
        out.push(r);
        writers = Writers::connect(&sys.service.url, &cluster).await;
    }
    sys.shutdown().await;
    out
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// min / median / max of `xs`.
fn spread(mut xs: Vec<Duration>) -> String {
    if xs.is_empty() {
        return "—".into();
    }
    xs.sort();
    format!(
        "{} / {} / {}",
        secs(xs[0]),
        secs(xs[xs.len() / 2]),
        secs(xs[xs.len() - 1])
    )
}

/// The allocator of the shipped binaries: glibc's spent about a third of the CPU under load
/// (docs/benchmarks.md, "The allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    clb_tests::init_tracing();
    rustls::crypto::aws_lc_rs::default_provider()
        .install_default()
        .ok();
    let rounds = env_usize("CLB_BENCH_FAILOVERS", 20);
    let seed = std::env::var("CLB_BENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let spec = rollout_spec();
    let election = deploy_election("-");
    let writer = WatcherConfig::new(ConnectOptions::new("-"), Mode::Cluster { pods: false });
    println!(
        "fail-over of the leader mid-rollout, {rounds} times: {} pods over {} locations; lease \
         {:?} / renew deadline {:?} / retry {:?} (deploy/); writers notice at once (session \
         stream), back off {:?} to {:?} ({:?} when refused); seed {seed} (CLB_BENCH_SEED={seed} replays it)",
        spec.pods(),
        spec.locations,
        election.lease_duration,
        election.renew_deadline,
        election.retry_period,
        writer.backoff_initial,
        writer.backoff_max,
        RECONNECT_MAX,
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let out = rt.block_on(run(seed, rounds));

    println!();
    println!(
        "| round | takeover | first unit (observe) | first location unit | last writer resynced | \
         converged | NRP calls in flight at the kill | live backends removed |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (i, r) in out.iter().enumerate() {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            i + 1,
            secs(r.takeover),
            secs(r.first_unit),
            r.first_location_unit.map_or("—".into(), secs),
            secs(r.last_resync),
            secs(r.converged),
            r.in_flight_at_kill,
            r.live_removed
        );
    }
    println!();
    println!("| from the kill (min / median / max) | |");
    println!("|---|---|");
    let col = |f: fn(&Round) -> Option<Duration>| spread(out.iter().filter_map(f).collect());
    println!("| takeover | {} |", col(|r| Some(r.takeover)));
    println!("| first unit (observe) | {} |", col(|r| Some(r.first_unit)));
    println!(
        "| first location unit | {} |",
        col(|r| r.first_location_unit)
    );
    println!(
        "| last writer resynced | {} |",
        col(|r| Some(r.last_resync))
    );
    println!("| converged | {} |", col(|r| Some(r.converged)));
    let goal = election.lease_duration + Duration::from_secs(2);
    let within = out.iter().filter(|r| r.takeover <= goal).count();
    let removed: usize = out.iter().map(|r| r.live_removed).sum();
    println!();
    println!(
        "takeover within lease duration + 2 s ({}): {within}/{}; live backends removed across all \
         fail-overs: {removed}",
        secs(goal),
        out.len()
    );
}
