//! Rollout load test: the whole system (NRP emulator, state server, sync workers) in one process
//! over loopback, rolling out every pod of a 10,000-pod cluster on 500 nodes, against an emulator
//! that costs 100 ms per call + 0.05 ms per address and allows 4 concurrent mutating calls per
//! gateway.
//!
//! ```sh
//! cargo bench -p clb-tests --bench rollout
//! ```
//!
//! Configurations: packing with the defaults (bursts gathered, a backlog spread over the free
//! slots, up to 1,000 locations and 5,000 addresses per unit and per call) with 3 workers and with
//! 1 worker; the same cut eagerly (100 locations per unit, linger 0: as before issue 23's Build
//! 3); and the baseline with packing off (1 location per unit) and 1 worker. For each:
//! the time from the first rollout write to convergence, NRP calls, addresses per call; then the
//! ratios against the baseline and the physical floor (total address cost ÷ allowed concurrency +
//! one call's latency).
//!
//! Then the packed 3-worker configuration runs in pairs, authentication and authorization off and
//! on (on as deploy/ runs the server: every call's token checked with a TokenReview, its right with
//! a SubjectAccessReview, both cached; the reviews answered by the fake Kubernetes API over
//! loopback): `CLB_BENCH_AUTH_PAIRS` pairs (default 5), medians compared.
//!
//! Four configurations in all: the three above, and the packed 3-worker one split over two
//! gateways (issue 16): half the nodes each, each gateway on its own emulator (a region each, with
//! the same costs and its own 4 concurrent mutating calls), described by a gateways file, one
//! watcher writer per gateway streaming its part of the rollout. Its calls and addresses are the
//! sum over both emulators; its floor counts both regions' concurrency.
//!
//! Set `CLB_BENCH_PODS` / `CLB_BENCH_LOCATIONS` for another size, `CLB_BENCH_GATEWAYS_ONLY=1`
//! to run only the packed 3-worker configuration on one gateway and split over two (no baseline,
//! no authentication pairs), `CLB_BENCH_BATCHING_ONLY=1` to run only the eager and the default
//! packing in pairs; `CLB_BENCH_LINGER_MS` and `CLB_BENCH_QUIET_MS` set the default
//! configurations' --batch-linger and --batch-quiet.

use std::time::{Duration, Instant};

use clb_core::dispatch::DispatchConfig;
use clb_nrp_emulator::{EmulatorConfig, Stats};
use clb_state_server::state::ServerConfig;
use clb_sync_worker::worker::Limits;
use clb_tests::auth_setup::AuthOn;
use clb_tests::bench::{
    CONCURRENCY, LATENCY_MS, LATENCY_PER_ADDRESS_US, PODS_PER_APP, costly, env_usize, rollout_spec,
};
use clb_tests::regions::{expected_for, split_nodes, view_for};
use clb_tests::{Cluster, Harness, Options, WATCHER, WriterExt};

const UAL: &str = "ServiceGateways_UpdateAddressLocations";
/// Upper bound of a convergence: a guard against a hung run, not a target.
const PATIENCE: Duration = Duration::from_secs(900);

#[derive(Debug, Clone, Copy)]
struct Scenario {
    name: &'static str,
    workers: usize,
    max_locations_per_unit: usize,
    /// The state server's --batch-linger (zero: units cut as soon as a slot is free).
    batch_linger: Duration,
    /// The state server's --batch-quiet.
    batch_quiet: Duration,
    /// The state server's --unit-headway (0: units go as soon as a slot is free).
    unit_headway: f64,
    auth: bool,
    /// Gateways the nodes are split over, each on its own emulator (1: today's single gateway).
    gateways: usize,
}

#[derive(Debug)]
struct Outcome {
    scenario: Scenario,
    write: Duration,
    converge: Duration,
    /// Of each gateway's emulator.
    stats: Vec<Stats>,
    /// TokenReviews and SubjectAccessReviews the server made (authentication on).
    reviews: Option<(usize, usize)>,
}

impl Outcome {
    fn calls(&self) -> u64 {
        self.stats.iter().map(|s| s.calls).sum()
    }

    fn addresses_carried(&self) -> u64 {
        self.stats.iter().map(|s| s.addresses_carried).sum()
    }

    fn location_calls(&self) -> u64 {
        self.stats.iter().map(|s| s.calls_of(UAL)).sum()
    }

    fn addresses_per_call(&self) -> f64 {
        self.addresses_carried() as f64 / self.location_calls().max(1) as f64
    }

    fn throttled(&self) -> u64 {
        self.stats
            .iter()
            .map(|s| s.rejected("TooManyRequests") + s.rejected("AnotherOperationInProgress"))
            .sum()
    }
}

async fn run(s: Scenario) -> Outcome {
    if s.gateways > 1 {
        return run_split(s).await;
    }
    let options = options_of(s);
    let auth = if s.auth {
        Some(AuthOn::start().await)
    } else {
        None
    };
    let options = Options {
        auth: auth.as_ref().map(|a| a.harness.clone()),
        ..options
    };
    let mut cluster = Cluster::generate(rollout_spec());
    let h = Harness::start(options).await;
    let mut watcher = h.watcher().await;
    watcher.resync_ok(cluster.full_view()).await;
    h.converge(&cluster.expected(), PATIENCE).await;

    h.emulator().set_config(costly()).expect("valid config");
    h.emulator().reset_stats();
    let batches = cluster.roll_all();
    let expected = cluster.expected();
    let start = Instant::now();
    // The bulk path: one ApplyStream, no round trip per batch.
    let written = watcher
        .apply_stream(futures::stream::iter(batches))
        .await
        .expect("rollout streamed");
    assert!(
        written.rejected.is_empty(),
        "{}",
        written.describe_rejected()
    );
    let write = start.elapsed();
    let seen = settled(&h, start).await;
    h.converge(&expected, PATIENCE).await;
    let revision = settled_revision(&h).await;
    let converge = match seen {
        Some((at, seen)) if seen == revision => at,
        // Something happened after the idle status was seen: the coarser harness figure.
        _ => start.elapsed(),
    };
    let stats = vec![h.emulator().stats()];
    h.shutdown().await;
    Outcome {
        scenario: s,
        write,
        converge,
        stats,
        reviews: auth.map(|a| a.api.review_counts()),
    }
}

/// When the server first reported the rollout's gateway idle (no unit in flight, nothing dirty,
/// no change waiting for NRP's confirmation, NRP idle) after `start`, polled every millisecond, with the revision it reported then (`None`:
/// not within [`PATIENCE`]). The harness's own wait ([`Harness::converge`], which also compares
/// NRP with the expected state) polls every 20 ms, which would add up to 20 ms to the figure.
async fn settled(h: &Harness, start: Instant) -> Option<(Duration, u64)> {
    while start.elapsed() < PATIENCE {
        let s = h.status().await;
        let g = s.gateways.first()?;
        let idle =
            g.units_in_flight == 0 && g.dirty_locations == 0 && g.oldest_pending_change_age_ms == 0;
        if idle && h.emulator().stats().in_flight_mutations == 0 {
            return Some((start.elapsed(), g.revision));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    None
}

/// The gateway's revision now (after the harness's check).
async fn settled_revision(h: &Harness) -> u64 {
    h.status().await.gateways.first().map_or(0, |g| g.revision)
}

/// The options of scenario `s` (authentication off).
fn options_of(s: Scenario) -> Options {
    Options {
        nat_gateway_resource_group: None,
        workers: s.workers,
        worker_capacity: 4,
        worker_limits: Limits {
            max_locations_per_call: s.max_locations_per_unit,
            max_concurrent_mutations_per_gateway: CONCURRENCY,
            ..Limits::default()
        },
        // The initial cluster is built at no cost; the costs apply to the rollout only.
        emulator: EmulatorConfig::default(),
        server: ServerConfig {
            server_id: "bench".into(),
            expected_writers: vec![WATCHER.into()],
            dispatch: DispatchConfig {
                lease: Duration::from_secs(120),
                max_locations_per_unit: s.max_locations_per_unit,
                batch_linger: s.batch_linger,
                batch_quiet: s.batch_quiet,
                unit_headway: s.unit_headway,
                ..DispatchConfig::default()
            },
            ..ServerConfig::default()
        },
        auth: None,
    }
}

/// [`run`] with the nodes split over `s.gateways` gateways, each on its own emulator: one writer
/// per gateway streams its part of the rollout (all at once); converged when every gateway is.
async fn run_split(s: Scenario) -> Outcome {
    assert!(!s.auth, "the split scenario runs without authentication");
    let names: Vec<String> = (0..s.gateways).map(|i| format!("region-{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut cluster = Cluster::generate(rollout_spec());
    let parts = split_nodes(&cluster, s.gateways);
    let h = Harness::start_gateways(options_of(s), &refs).await;
    let mut writers = Vec::new();
    for (g, part) in names.iter().zip(&parts) {
        let mut w = h.writer(g).await;
        let topology = cluster.topology(clb_tests::PodWriters::Watcher);
        w.resync_scope_ok(
            clb_tests::scope::all(),
            Some(clb_tests::regions::topology_for(&topology, part)),
            view_for(&cluster.full_view(), part),
        )
        .await;
        writers.push(w);
    }
    for (g, part) in names.iter().zip(&parts) {
        h.converge_gateway(g, &expected_for(&cluster.expected(), part), PATIENCE)
            .await;
    }
    for g in &names {
        h.emulator_of(g).set_config(costly()).expect("valid config");
        h.emulator_of(g).reset_stats();
    }
    let batches = cluster.roll_all();
    let expected = cluster.expected();
    let start = Instant::now();
    let streams = writers.iter_mut().zip(&parts).map(|(w, part)| {
        let mine: Vec<_> = batches
            .iter()
            .map(|b| view_for(b, part))
            .filter(|b| !b.is_empty())
            .collect();
        w.apply_stream(futures::stream::iter(mine))
    });
    for written in futures::future::join_all(streams).await {
        let written = written.expect("rollout streamed");
        assert!(
            written.rejected.is_empty(),
            "{}",
            written.describe_rejected()
        );
    }
    let write = start.elapsed();
    let wanted: Vec<_> = parts.iter().map(|p| expected_for(&expected, p)).collect();
    let converged = names
        .iter()
        .zip(&wanted)
        .map(|(g, e)| h.converge_gateway(g, e, PATIENCE));
    futures::future::join_all(converged).await;
    let converge = start.elapsed();
    let stats = names.iter().map(|g| h.emulator_of(g).stats()).collect();
    h.shutdown().await;
    Outcome {
        scenario: s,
        write,
        converge,
        stats,
        reviews: None,
    }
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// The allocator of the shipped binaries: glibc's spent about a third of the CPU under load
/// (docs/benchmarks.md, "The allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let spec = rollout_spec();
    let pods = spec.pods();
    println!(
        "rollout of {pods} pods ({} apps × {PODS_PER_APP}) over {} locations; emulator: \
         {LATENCY_MS} ms per call + {} ms per address, {CONCURRENCY} concurrent mutating calls per \
         gateway",
        spec.apps,
        spec.locations,
        LATENCY_PER_ADDRESS_US as f64 / 1000.0
    );
    let mut defaults = DispatchConfig::default();
    if let Some(ms) = std::env::var("CLB_BENCH_LINGER_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        defaults.batch_linger = Duration::from_millis(ms);
    }
    if let Some(ms) = std::env::var("CLB_BENCH_QUIET_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        defaults.batch_quiet = Duration::from_millis(ms);
    }
    let packed = Scenario {
        name: "packed (defaults: a backlog spread over the free slots), 3 workers",
        workers: 3,
        max_locations_per_unit: defaults.max_locations_per_unit,
        batch_linger: defaults.batch_linger,
        batch_quiet: defaults.batch_quiet,
        unit_headway: defaults.unit_headway,
        auth: false,
        gateways: 1,
    };
    let eager = Scenario {
        name: "packed, 100 locations/unit, cut as soon as a slot is free (linger 0), 3 workers",
        max_locations_per_unit: 100,
        batch_linger: Duration::ZERO,
        ..packed
    };
    let split = Scenario {
        name: "packed, 3 workers, split over 2 gateways (2 emulators, half the nodes each)",
        gateways: 2,
        ..packed
    };
    if env_usize("CLB_BENCH_GATEWAYS_ONLY", 0) == 1 {
        let pairs = env_usize("CLB_BENCH_GATEWAY_PAIRS", 3);
        compare(&rt, packed, split, pairs);
        return;
    }
    if env_usize("CLB_BENCH_HEADWAY_ONLY", 0) == 1 {
        let pairs = env_usize("CLB_BENCH_HEADWAY_PAIRS", 3);
        let unstaggered = Scenario {
            name: "packed, units as soon as a slot is free (headway 0), 3 workers",
            unit_headway: 0.0,
            ..packed
        };
        compare(&rt, unstaggered, packed, pairs);
        return;
    }
    if env_usize("CLB_BENCH_BATCHING_ONLY", 0) == 1 {
        let pairs = env_usize("CLB_BENCH_BATCHING_PAIRS", 5);
        compare(&rt, eager, packed, pairs);
        return;
    }
    let scenarios = [
        packed,
        split,
        eager,
        Scenario {
            name: "packed (defaults), 1 worker",
            workers: 1,
            ..packed
        },
        Scenario {
            name: "baseline: unpacked (1 location/unit), 1 worker",
            workers: 1,
            max_locations_per_unit: 1,
            batch_linger: Duration::ZERO,
            ..packed
        },
    ];
    let outcomes: Vec<Outcome> = scenarios
        .iter()
        .map(|s| {
            let o = rt.block_on(run(*s));
            eprintln!("done: {} in {}", s.name, secs(o.converge));
            o
        })
        .collect();

    println!();
    println!(
        "| configuration | time to converge | (writes) | NRP calls | updateAddressLocations calls \
         | addresses carried | addresses per call | throttled (429) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for o in &outcomes {
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.1} | {} |",
            o.scenario.name,
            secs(o.converge),
            secs(o.write),
            o.calls(),
            o.location_calls(),
            o.addresses_carried(),
            o.addresses_per_call(),
            o.throttled(),
        );
    }
    let base = outcomes.last().expect("baseline");
    println!();
    for o in &outcomes[..outcomes.len() - 1] {
        println!(
            "{} vs baseline: {:.1}× faster, {:.1}× fewer NRP calls, {:.1}× more addresses per call",
            o.scenario.name,
            base.converge.as_secs_f64() / o.converge.as_secs_f64(),
            base.calls() as f64 / o.calls().max(1) as f64,
            o.addresses_per_call() / base.addresses_per_call().max(f64::MIN_POSITIVE),
        );
    }
    // Every pod is replaced: each new address is added once and each old one removed once.
    let minimal_addresses = 2 * pods as u64;
    println!();
    println!(
        "physical floor (total address cost ÷ {CONCURRENCY} concurrent calls + one call's \
         {LATENCY_MS} ms): {} for the {minimal_addresses} address changes of the rollout",
        secs(floor(minimal_addresses, 1)),
    );
    for o in &outcomes {
        let f = floor(o.addresses_carried(), o.scenario.gateways);
        println!(
            "  {}: {} for the {} addresses it carried ({} × {CONCURRENCY} concurrent calls); \
             converged at {:.1}× that",
            o.scenario.name,
            secs(f),
            o.addresses_carried(),
            o.scenario.gateways,
            o.converge.as_secs_f64() / f.as_secs_f64(),
        );
    }
    auth_pairs(&rt, scenarios[0]);
}

/// Two scenarios in `pairs` pairs, alternating, medians compared: one gateway against two
/// (`CLB_BENCH_GATEWAYS_ONLY=1`, `CLB_BENCH_GATEWAY_PAIRS`, default 3), or units cut eagerly
/// against the defaults (`CLB_BENCH_BATCHING_ONLY=1`, `CLB_BENCH_BATCHING_PAIRS`, default 5).
fn compare(rt: &tokio::runtime::Runtime, one: Scenario, two: Scenario, pairs: usize) {
    let pairs = pairs.max(1);
    let mut runs: Vec<(Outcome, Outcome)> = Vec::new();
    for i in 0..pairs {
        let a = rt.block_on(run(one));
        let b = rt.block_on(run(two));
        eprintln!(
            "pair {}/{pairs}: {} / {}",
            i + 1,
            secs(a.converge),
            secs(b.converge)
        );
        runs.push((a, b));
    }
    println!();
    println!(
        "| configuration | time to converge (median) | all runs: converge | writes (median) | NRP calls | updateAddressLocations calls | addresses carried | throttled | median ÷ floor |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let median = |mut d: Vec<Duration>| {
        d.sort();
        d[d.len() / 2]
    };
    for (label, pick) in [
        (
            one.name,
            (|p: &(Outcome, Outcome)| &p.0) as fn(&(Outcome, Outcome)) -> &Outcome,
        ),
        (two.name, |p| &p.1),
    ] {
        let v: Vec<&Outcome> = runs.iter().map(pick).collect();
        let last = v.last().expect("a run");
        let converged = median(v.iter().map(|o| o.converge).collect());
        let floor = floor(2 * rollout_spec().pods() as u64, last.scenario.gateways);
        println!(
            "| {label} | {} | {} | {} | {} | {} | {} | {} | {:.2}× |",
            secs(converged),
            v.iter()
                .map(|o| format!("{:.2}", o.converge.as_secs_f64()))
                .collect::<Vec<_>>()
                .join(" / "),
            secs(median(v.iter().map(|o| o.write).collect())),
            last.calls(),
            last.location_calls(),
            last.addresses_carried(),
            last.throttled(),
            converged.as_secs_f64() / floor.as_secs_f64(),
        );
    }
}

/// The physical floor of carrying `addresses`: their cost spread over the allowed concurrency of
/// `gateways` gateways, plus one call's fixed latency.
fn floor(addresses: u64, gateways: usize) -> Duration {
    Duration::from_micros(
        addresses * LATENCY_PER_ADDRESS_US / (CONCURRENCY * gateways.max(1)) as u64,
    ) + Duration::from_millis(LATENCY_MS)
}

/// The packed 3-worker rollout with authentication and authorization off and on, in pairs.
fn auth_pairs(rt: &tokio::runtime::Runtime, plain: Scenario) {
    let pairs = env_usize("CLB_BENCH_AUTH_PAIRS", 5).max(1);
    let authed = Scenario {
        auth: true,
        ..plain
    };
    let mut off = Vec::new();
    let mut on = Vec::new();
    for i in 0..pairs {
        off.push(rt.block_on(run(plain)));
        on.push(rt.block_on(run(authed)));
        eprintln!(
            "pair {}/{pairs}: off {} / on {}",
            i + 1,
            secs(off[i].converge),
            secs(on[i].converge)
        );
    }
    let median = |v: &[Outcome], f: fn(&Outcome) -> Duration| {
        let mut d: Vec<Duration> = v.iter().map(f).collect();
        d.sort();
        d[d.len() / 2]
    };
    let list = |v: &[Outcome], f: fn(&Outcome) -> Duration| {
        v.iter()
            .map(|o| format!("{:.2}", f(o).as_secs_f64()))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    println!();
    println!(
        "authentication + authorization off vs on, {plain_name}, {pairs} pairs (seconds, in run order):",
        plain_name = plain.name
    );
    println!();
    println!(
        "| | writes (median) | time to converge (median) | all runs: converge | TokenReviews | SubjectAccessReviews |"
    );
    println!("|---|---|---|---|---|---|");
    for (label, v) in [("off", &off), ("on", &on)] {
        let (t, a) = v
            .iter()
            .filter_map(|o| o.reviews)
            .fold((0, 0), |acc, r| (acc.0 + r.0, acc.1 + r.1));
        println!(
            "| {label} | {} | {} | {} | {} | {} |",
            secs(median(v, |o| o.write)),
            secs(median(v, |o| o.converge)),
            list(v, |o| o.converge),
            if label == "on" {
                (t / pairs).to_string()
            } else {
                "–".into()
            },
            if label == "on" {
                (a / pairs).to_string()
            } else {
                "–".into()
            },
        );
    }
    let change = |f: fn(&Outcome) -> Duration| {
        100.0 * (median(&on, f).as_secs_f64() / median(&off, f).as_secs_f64() - 1.0)
    };
    println!();
    println!(
        "on vs off: writes {:+.1}%, convergence {:+.1}% (medians; reviews per run)",
        change(|o| o.write),
        change(|o| o.converge)
    );
}
