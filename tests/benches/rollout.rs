//! Rollout load test: the whole system (NRP emulator, state server, sync workers) in one process
//! over loopback, rolling out every pod of a 10,000-pod cluster on 500 nodes, against an emulator
//! that costs 100 ms per call + 0.05 ms per address and allows 4 concurrent mutating calls per
//! gateway.
//!
//! ```sh
//! cargo bench -p clb-tests --bench rollout
//! ```
//!
//! Three configurations: packing on (up to 100 locations per unit and per call) with 3 workers and
//! with 1 worker, and the baseline with packing off (1 location per unit) and 1 worker. For each:
//! the time from the first rollout write to convergence, NRP calls, addresses per call; then the
//! ratios against the baseline and the physical floor (total address cost ÷ allowed concurrency +
//! one call's latency).
//!
//! Then the packed 3-worker configuration runs in pairs, authentication and authorization off and
//! on (on as deploy/ runs the server: every call's token checked with a TokenReview, its right with
//! a SubjectAccessReview, both cached; the reviews answered by the fake Kubernetes API over
//! loopback): `CLB_BENCH_AUTH_PAIRS` pairs (default 5), medians compared.
//!
//! Set `CLB_BENCH_PODS` / `CLB_BENCH_LOCATIONS` for another size.

use std::time::{Duration, Instant};

use clb_core::dispatch::DispatchConfig;
use clb_nrp_emulator::{EmulatorConfig, Stats};
use clb_state_server::state::ServerConfig;
use clb_sync_worker::worker::Limits;
use clb_tests::auth_setup::AuthOn;
use clb_tests::bench::{
    CONCURRENCY, LATENCY_MS, LATENCY_PER_ADDRESS_US, PODS_PER_APP, costly, env_usize, rollout_spec,
};
use clb_tests::{Cluster, Harness, Options, WATCHER, WriterExt};

const UAL: &str = "ServiceGateways_UpdateAddressLocations";
/// Upper bound of a convergence: a guard against a hung run, not a target.
const PATIENCE: Duration = Duration::from_secs(900);

#[derive(Debug, Clone, Copy)]
struct Scenario {
    name: &'static str,
    workers: usize,
    max_locations_per_unit: usize,
    auth: bool,
}

#[derive(Debug)]
struct Outcome {
    scenario: Scenario,
    write: Duration,
    converge: Duration,
    stats: Stats,
    /// TokenReviews and SubjectAccessReviews the server made (authentication on).
    reviews: Option<(usize, usize)>,
}

impl Outcome {
    fn location_calls(&self) -> u64 {
        self.stats.calls_of(UAL)
    }

    fn addresses_per_call(&self) -> f64 {
        self.stats.addresses_carried as f64 / self.location_calls().max(1) as f64
    }

    fn throttled(&self) -> u64 {
        self.stats.rejected("TooManyRequests") + self.stats.rejected("AnotherOperationInProgress")
    }
}

async fn run(s: Scenario) -> Outcome {
    let options = Options {
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
                ..DispatchConfig::default()
            },
            ..ServerConfig::default()
        },
        auth: None,
    };
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
    h.converge(&expected, PATIENCE).await;
    let converge = start.elapsed();
    let stats = h.emulator().stats();
    h.shutdown().await;
    Outcome {
        scenario: s,
        write,
        converge,
        stats,
        reviews: auth.map(|a| a.api.review_counts()),
    }
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

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
    let scenarios = [
        Scenario {
            name: "packed (100 locations/unit), 3 workers",
            workers: 3,
            max_locations_per_unit: 100,
            auth: false,
        },
        Scenario {
            name: "packed (100 locations/unit), 1 worker",
            workers: 1,
            max_locations_per_unit: 100,
            auth: false,
        },
        Scenario {
            name: "baseline: unpacked (1 location/unit), 1 worker",
            workers: 1,
            max_locations_per_unit: 1,
            auth: false,
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
            o.stats.calls,
            o.location_calls(),
            o.stats.addresses_carried,
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
            base.stats.calls as f64 / o.stats.calls.max(1) as f64,
            o.addresses_per_call() / base.addresses_per_call().max(f64::MIN_POSITIVE),
        );
    }
    // Every pod is replaced: each new address is added once and each old one removed once.
    let minimal_addresses = 2 * pods as u64;
    let floor = |addresses: u64| {
        Duration::from_micros(addresses * LATENCY_PER_ADDRESS_US / CONCURRENCY as u64)
            + Duration::from_millis(LATENCY_MS)
    };
    println!();
    println!(
        "physical floor (total address cost ÷ {CONCURRENCY} concurrent calls + one call's \
         {LATENCY_MS} ms): {} for the {minimal_addresses} address changes of the rollout",
        secs(floor(minimal_addresses)),
    );
    for o in &outcomes {
        println!(
            "  {}: {} for the {} addresses it carried; converged at {:.1}× that",
            o.scenario.name,
            secs(floor(o.stats.addresses_carried)),
            o.stats.addresses_carried,
            o.converge.as_secs_f64() / floor(o.stats.addresses_carried).as_secs_f64(),
        );
    }
    auth_pairs(&rt, scenarios[0]);
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
