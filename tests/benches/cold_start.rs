//! Cold start (issue 36): S Services with 10 ready endpoints each over 100 nodes, created before clb
//! starts, taken to NRP by the whole system in one process (NRP emulator, state server, sync
//! workers over loopback). The watcher's first resync carries the whole cluster; the bench
//! reports the NRP writes it cost (mutating calls the emulator received, whatever their outcome),
//! per Service, and the `updateServices` calls among them; the throttled calls; the time from the
//! resync to NRP holding every address (the harness's comparison of NRP with the expected state);
//! and, with the write budget on, that time against the budget's own floor: the writes beyond the
//! bucket at the refill rate, `(writes − bucket) ÷ refill`.
//!
//! ```sh
//! CLB_BENCH_SERVICES=250 cargo bench -p clb-tests --bench cold_start
//! CLB_BENCH_SERVICES=1000 CLB_BENCH_BUDGET=1 cargo bench -p clb-tests --bench cold_start
//! ```
//!
//! - `CLB_BENCH_SERVICES`: S (default 250). The synthetic cluster makes a second Service for every
//!   third app, so the apps are chosen to make exactly S Services (the count is printed).
//! - `CLB_BENCH_BUDGET=1`: the emulator's write budget on, ARM's token bucket:
//!   `CLB_BENCH_BUCKET` writes (default 200) refilled at `CLB_BENCH_REFILL` per second (default 10),
//!   no window cap. The state server paces against it with `--write-burst` = the bucket and
//!   `--write-pace` = the refill (`CLB_BENCH_BURST` / `CLB_BENCH_PACE` to set them otherwise):
//!   the pacing a subscription with this budget is configured with.
//! - The emulator has no latency and no concurrency limit (as in the issue's figures); 3 workers,
//!   the dispatcher's and the workers' defaults otherwise.

use std::time::{Duration, Instant};

use clb_core::dispatch::DispatchConfig;
use clb_nrp_emulator::{EmulatorConfig, Stats};
use clb_state_server::state::ServerConfig;
use clb_sync_worker::worker::Limits;
use clb_tests::bench::env_usize;
use clb_tests::{Cluster, ClusterSpec, Harness, Options, WATCHER, WriterExt};

const UPDATE_SERVICES: &str = "ServiceGateways_UpdateServices";
/// Endpoints of each Service (the pods of its app), all ready.
const ENDPOINTS: usize = 10;
/// Nodes the pods are spread over.
const NODES: usize = 100;
/// Upper bound of a cold start: a guard against a hung run, not a target.
const PATIENCE: Duration = Duration::from_secs(3_600);

/// The fewest apps whose Services (one each, two for every third app) are at least `services`.
fn apps_for(services: usize) -> usize {
    (0..=services)
        .find(|&apps| apps + apps.div_ceil(3) >= services)
        .unwrap_or(services)
}

/// The write budget of the emulator and the server's pacing against it.
#[derive(Debug, Clone, Copy)]
struct Budget {
    bucket: u32,
    refill: f64,
    burst: u32,
    pace: f64,
}

fn budget() -> Option<Budget> {
    if env_usize("CLB_BENCH_BUDGET", 0) == 0 {
        return None;
    }
    let bucket = env_usize("CLB_BENCH_BUCKET", 200) as u32;
    let refill = env_usize("CLB_BENCH_REFILL", 10) as f64;
    Some(Budget {
        bucket,
        refill,
        burst: env_usize("CLB_BENCH_BURST", bucket as usize) as u32,
        pace: env_usize("CLB_BENCH_PACE", refill as usize) as f64,
    })
}

fn options(budget: Option<Budget>) -> Options {
    let mut dispatch = DispatchConfig::default();
    if let Some(b) = budget {
        dispatch.write_burst = b.burst;
        dispatch.write_pace = b.pace;
    }
    Options {
        workers: 3,
        worker_capacity: 4,
        worker_limits: Limits::default(),
        emulator: EmulatorConfig {
            write_bucket_size: budget.map(|b| b.bucket),
            write_refill_per_sec: budget.map_or(10.0, |b| b.refill),
            ..EmulatorConfig::default()
        },
        server: ServerConfig {
            server_id: "bench".into(),
            expected_writers: vec![WATCHER.into()],
            dispatch,
            ..ServerConfig::default()
        },
        auth: None,
        nat_gateway_resource_group: None,
    }
}

fn throttled(s: &Stats) -> u64 {
    s.throttled_by_write_budget
        .max(s.rejected("SubscriptionRequestsThrottled"))
        + s.rejected("TooManyRequests")
        + s.rejected("AnotherOperationInProgress")
}

#[tokio::main]
async fn main() {
    let wanted = env_usize("CLB_BENCH_SERVICES", 250);
    let budget = budget();
    let spec = ClusterSpec {
        locations: NODES,
        apps: apps_for(wanted),
        pods_per_app: ENDPOINTS,
        egresses: 0,
        not_ready_every: 0,
        seed: 36,
    };
    let cluster = Cluster::generate(spec);
    let services = cluster.services().len();
    let expected = cluster.expected();
    println!(
        "cold start: {services} Services, {} pods over {NODES} nodes, budget {}",
        cluster.pods().len(),
        match budget {
            Some(b) => format!(
                "bucket {} + {}/s (server pacing: burst {}, {}/s)",
                b.bucket, b.refill, b.burst, b.pace
            ),
            None => "off".into(),
        }
    );
    let h = Harness::start(options(budget)).await;
    h.emulator().reset_stats();
    let start = Instant::now();
    h.watcher().await.resync_ok(cluster.full_view()).await;
    h.converge(&expected, PATIENCE).await;
    let took = start.elapsed();
    // What is in flight when NRP holds everything (a registration answered after the last
    // address) is counted too.
    h.wait_idle(Duration::from_secs(60))
        .await
        .expect("the server goes idle");
    let stats = h.emulator().stats();
    h.shutdown().await;

    let writes = stats.mutating_calls;
    println!("| what | figure |\n|---|---|");
    println!("| Services | {services} |");
    println!(
        "| NRP writes (mutating calls received) | {writes} ({:.3} per Service) |",
        writes as f64 / services as f64
    );
    println!(
        "| `updateServices` calls | {} |",
        stats.calls_of(UPDATE_SERVICES)
    );
    println!("| throttled calls | {} |", throttled(&stats));
    println!(
        "| resync → NRP holds every address | {:.2} s |",
        took.as_secs_f64()
    );
    if let Some(b) = budget {
        let floor = writes.saturating_sub(u64::from(b.bucket)) as f64 / b.refill;
        println!(
            "| the budget's floor, (writes − {}) ÷ {}/s | {floor:.1} s: the start took {:.3}× it |",
            b.bucket,
            b.refill,
            took.as_secs_f64() / floor.max(f64::MIN_POSITIVE)
        );
    }
}
