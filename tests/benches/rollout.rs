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
//! Set `CLB_BENCH_PODS` / `CLB_BENCH_LOCATIONS` for another size.

use std::time::{Duration, Instant};

use clb_core::dispatch::DispatchConfig;
use clb_nrp_emulator::{EmulatorConfig, Stats};
use clb_state_server::state::ServerConfig;
use clb_sync_worker::worker::Limits;
use clb_tests::bench::{
    CONCURRENCY, LATENCY_MS, LATENCY_PER_ADDRESS_US, PODS_PER_APP, costly, rollout_spec,
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
}

#[derive(Debug)]
struct Outcome {
    scenario: Scenario,
    write: Duration,
    converge: Duration,
    stats: Stats,
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
        },
        Scenario {
            name: "packed (100 locations/unit), 1 worker",
            workers: 1,
            max_locations_per_unit: 100,
        },
        Scenario {
            name: "baseline: unpacked (1 location/unit), 1 worker",
            workers: 1,
            max_locations_per_unit: 1,
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
}
