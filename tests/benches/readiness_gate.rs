//! The pod readiness gate (issue 21): a rollout of `CLB_BENCH_PODS` (default 100) pods with the gate
//! on and off, the NRP emulator at 0 ms and at 100 ms per call — simulated Deployment controller
//! (maxSurge 25 %, maxUnavailable 0), kubelet (containers ready 100 ms after start) and EndpointSlice
//! controller in the fake Kubernetes API; the state server, 3 workers, the watcher with
//! `--readiness-gate` (`clb_tests::rollout`).
//!
//! ```sh
//! cargo bench -p clb-tests --bench readiness_gate
//! ```
//!
//! Printed per configuration: the gate latency of the new pods (from their containers seen ready to
//! their gate seen True, sampled every 10 ms: p50, p99, max), the rollout's duration (from the
//! template change until every pod is new and Ready and NRP holds exactly them), and the fewest live
//! backends NRP had during the rollout.

use std::time::Duration;

use clb_tests::bench::env_usize;
use clb_tests::rollout::{RolloutSpec, rollout};

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    rustls::crypto::aws_lc_rs::default_provider()
        .install_default()
        .ok();
    let pods = env_usize("CLB_BENCH_PODS", 100) as i64;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "readiness gate: a rollout of {pods} pods (maxSurge 25 %, maxUnavailable 0, containers \
         ready 100 ms after start), 3 nodes, 3 workers"
    );
    println!(
        "| NRP latency | gate | gate latency p50 | p99 | max | rollout duration | fewest live backends |"
    );
    println!("|---|---|---|---|---|---|---|");
    for latency in [0u64, 100] {
        for gate in [true, false] {
            let r = rt.block_on(rollout(RolloutSpec {
                replicas: pods,
                gate,
                nrp_latency_ms: latency,
            }));
            let mut l = r.gate_latencies.clone();
            l.sort();
            let (p50, p99, max) = if gate {
                (
                    format!("{:.0} ms", pct(&l, 0.5).as_secs_f64() * 1e3),
                    format!("{:.0} ms", pct(&l, 0.99).as_secs_f64() * 1e3),
                    format!(
                        "{:.0} ms",
                        l.last().copied().unwrap_or_default().as_secs_f64() * 1e3
                    ),
                )
            } else {
                ("—".into(), "—".into(), "—".into())
            };
            println!(
                "| {latency} ms | {} | {p50} | {p99} | {max} | {:.2} s | {} of {pods} |",
                if gate { "on" } else { "off" },
                r.duration.as_secs_f64(),
                r.min_live_backends,
            );
        }
    }
}
