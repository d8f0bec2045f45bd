//! What one address NRP refuses costs the rest of its node and the write budget (issue 34).
//!
//! The scenario of `tests/tests/refusals.rs` (`clb_tests::refusal`): `svc-a` has one address at
//! each of 8 nodes plus the refused address at node 3; then `svc-b` gains one endpoint at node 3.
//! The system runs with the shipped defaults (the dispatcher's and the workers': retries from
//! 200 ms, the refusal schedule from 30 s doubling to 15 min), 3 workers, and the benchmarks' NRP
//! (`clb_tests::bench::costly`: 100 ms per call + 0.05 ms per address, 4 mutating calls at once).
//! Three arms, a fresh system per trial:
//!
//! - `clean`: NRP accepts every address (the refused one included: the same work);
//! - `named`: NRP refuses every call that carries the address and names it in its message;
//! - `unnamed`: the same, without naming it (the worker finds it by splitting).
//!
//! Printed per arm, over `CLB_BENCH_TRIALS` trials (default 10), p50 / max in ms: **first**, from
//! the writer's resync to NRP holding all 8 good addresses; **held**, from the resync to the server
//! holding the refused address (`GatewayStatus.refused_addresses`: the worker's search is over);
//! **later**, from `svc-b`'s Apply, sent once the address is held, to NRP holding its endpoint at
//! the refused address's node. Then for each refusing arm
//! one run of `CLB_BENCH_WINDOW_S` seconds (default 60) from the resync: the calls NRP refused with
//! the code, and every mutating call NRP received, against the clean arm's.
//!
//! ```sh
//! cargo bench --profile dev -p clb-tests --bench refusal_containment
//! ```

use std::time::{Duration, Instant};

use clb_core::dispatch::DispatchConfig;
use clb_state_server::state::ServerConfig;
use clb_sync_worker::worker::Limits;
use clb_tests::bench::{costly, env_usize};
use clb_tests::refusal::{
    at_refused_node, good_addresses, refuse, refused_calls, view, wait_in_nrp,
};
use clb_tests::{Harness, Options, WATCHER, WriterExt};

#[derive(Clone, Copy, Debug)]
enum Arm {
    Clean,
    Named,
    Unnamed,
}

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Arm::Clean => "clean",
            Arm::Named => "named",
            Arm::Unnamed => "unnamed",
        }
    }
}

async fn start(arm: Arm) -> Harness {
    let mut options = Options {
        workers: 3,
        worker_capacity: 4,
        worker_limits: Limits::default(),
        emulator: costly(),
        server: ServerConfig {
            server_id: "bench".into(),
            expected_writers: vec![WATCHER.into()],
            dispatch: DispatchConfig::default(),
            ..ServerConfig::default()
        },
        auth: None,
        nat_gateway_resource_group: None,
    };
    match arm {
        Arm::Clean => {}
        Arm::Named => refuse(&mut options, true),
        Arm::Unnamed => refuse(&mut options, false),
    }
    Harness::start(options).await
}

/// (first, held, later) of one trial; held is zero in the clean arm.
async fn trial(arm: Arm) -> (Duration, Duration, Duration) {
    let h = start(arm).await;
    let t = Instant::now();
    h.watcher().await.resync_ok(view()).await;
    wait_in_nrp(&h, "svc-a", &good_addresses()).await;
    let first = t.elapsed();
    let mut held = Duration::ZERO;
    if !matches!(arm, Arm::Clean) {
        while h.gateway_status().await.refused_addresses == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        held = t.elapsed();
    }
    let t = Instant::now();
    h.watcher()
        .await
        .apply_ok(at_refused_node("svc-b", "10.1.1.3"))
        .await;
    wait_in_nrp(&h, "svc-b", &["10.1.1.3".to_owned()]).await;
    (first, held, t.elapsed())
}

/// (refused calls, mutating calls) over `window` from the resync.
async fn window(arm: Arm, window: Duration) -> (u64, u64) {
    let h = start(arm).await;
    h.watcher().await.resync_ok(view()).await;
    tokio::time::sleep(window).await;
    (refused_calls(&h), h.emulator().stats().mutating_calls)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// "p50 / max" in ms.
fn summary(mut v: Vec<Duration>) -> String {
    v.sort();
    format!("{:.0} / {:.0}", ms(v[v.len() / 2]), ms(v[v.len() - 1]))
}

#[tokio::main]
async fn main() {
    let trials = env_usize("CLB_BENCH_TRIALS", 10);
    let window_s = env_usize("CLB_BENCH_WINDOW_S", 60) as u64;
    let arms = [Arm::Clean, Arm::Named, Arm::Unnamed];
    let mut firsts = vec![Vec::new(); arms.len()];
    let mut helds = vec![Vec::new(); arms.len()];
    let mut laters = vec![Vec::new(); arms.len()];
    // The arms alternate, so that the machine's load falls on each alike.
    for _ in 0..trials {
        for (i, arm) in arms.iter().enumerate() {
            let (first, held, later) = trial(*arm).await;
            firsts[i].push(first);
            helds[i].push(held);
            laters[i].push(later);
        }
    }
    println!(
        "| arm | trials | first: 8 good addresses in NRP | the refused address held | \
         later: svc-b at its node |"
    );
    println!("|---|---|---|---|---|");
    for (i, arm) in arms.iter().enumerate() {
        let held = match arm {
            Arm::Clean => "–".to_owned(),
            _ => summary(helds[i].clone()),
        };
        println!(
            "| {} | {trials} | {} | {held} | {} |",
            arm.name(),
            summary(firsts[i].clone()),
            summary(laters[i].clone())
        );
    }
    println!();
    println!("| arm | window | refused calls | mutating calls |");
    println!("|---|---|---|---|");
    for arm in arms {
        let (refused, mutating) = window(arm, Duration::from_secs(window_s)).await;
        println!("| {} | {window_s} s | {refused} | {mutating} |", arm.name());
    }
}
