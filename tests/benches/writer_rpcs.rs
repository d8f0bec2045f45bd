//! Writer RPCs the watcher costs the state server (issue 35): every Writer RPC the server received
//! (its metric `clb_server_update_rpcs_total{rpc}`; a stream counts once, when it opens), per
//! second, in two phases:
//!
//! - **idle**: a settled cluster — 2 Services (`web`, `api`) of 2 gated pods each, every pod
//!   Ready, its gate `True` — for `CLB_BENCH_IDLE_S` seconds (default 20);
//! - **100 gated pods waiting**: Deployment `web` scaled from 2 to 2 + `CLB_BENCH_PODS` (default
//!   100) replicas while NRP takes 1 s per call; from the scale-up until every pod of `web` has
//!   its gate `True` (reason `Programmed`).
//!
//! The NRP emulator answers every call after `CLB_BENCH_NRP_LATENCY_MS` (default 1000) ms, in
//! both phases. The fake Kubernetes API runs its simulated Deployment controller, kubelet
//! (containers ready 100 ms after start) and EndpointSlice controller; 3 nodes; the state server
//! and 3 workers (`Options::e2e`); the watcher in cluster mode with the readiness gate, with the
//! tests' settings (`test_config`).
//!
//! ```sh
//! cargo bench --profile dev -p clb-tests --bench writer_rpcs
//! ```
//!
//! Printed: one table row per phase, the window, the total of Writer RPCs and their rate, and the
//! count and rate of each RPC that was called; for the second phase also the gates' waits (the
//! watcher's histogram: pod-seconds from containers ready to gate `True`). Each wait is bounded by
//! `CLB_BENCH_MAX_WAIT_S` (default 180): the row says how many gates opened, and a line lists the
//! pods still pending with whether NRP has their addresses.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clb_embedded::{Harness, Options};
use clb_nrp_emulator::EmulatorConfig;
use clb_tests::bench::env_usize;
use clb_tests::fake_kube::FakeApi;
use clb_tests::fake_kube::controllers::{ControllersConfig, condition};
use clb_tests::kube_objects::{
    RunningWatcher, deployment, node, selecting_service, test_config, with_readiness_gate,
};
use clb_watcher::webhook::{GATE_CONDITION_TYPE, GATE_LABEL, GATE_LABEL_VALUE};
use clb_watcher::{Mode, WatcherMetrics};
use serde_json::Value;

/// The server's count of Writer RPCs received, by rpc.
fn writer_rpcs(h: &Harness) -> BTreeMap<String, u64> {
    h.server()
        .state
        .metrics()
        .encode()
        .lines()
        .filter_map(|l| l.strip_prefix("clb_server_update_rpcs_total{rpc=\""))
        .filter_map(|l| {
            let (rpc, rest) = l.split_once('"')?;
            let (_, value) = rest.rsplit_once(' ')?;
            Some((rpc.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The gate's (status, reason) and the pod's Ready of each live pod of Deployment `name`, counted.
fn gates(fake: &FakeApi, name: &str) -> BTreeMap<(String, String, String), usize> {
    let mut out = BTreeMap::new();
    for p in fake.deployment_pods(name) {
        if !p["metadata"]["deletionTimestamp"].is_null() {
            continue;
        }
        let gate = p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == GATE_CONDITION_TYPE);
        let s = |k: &str| gate.and_then(|c| c[k].as_str()).unwrap_or("-").to_owned();
        let ready = condition(&p, "Ready").unwrap_or("-").to_owned();
        *out.entry((s("status"), s("reason"), ready)).or_default() += 1;
    }
    out
}

/// The watcher's readiness gate histogram: (seconds summed, gates opened): from each pod's
/// containers seen ready to its gate set True.
fn gate_waits(metrics: &WatcherMetrics) -> (f64, u64) {
    let text = metrics.encode();
    let value = |suffix: &str| {
        text.lines()
            .find(|l| l.contains(&format!("readiness_gate_seconds_{suffix} ")))
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (value("sum"), value("count") as u64)
}

/// Pods of Deployment `name` whose gate is `True` with reason `Programmed`, and all its live pods.
fn programmed(fake: &FakeApi, name: &str) -> (usize, usize) {
    let pods: Vec<Value> = fake
        .deployment_pods(name)
        .into_iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect();
    let open = pods
        .iter()
        .filter(|p| {
            p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| {
                    c["type"] == GATE_CONDITION_TYPE
                        && c["status"] == "True"
                        && c["reason"] == "Programmed"
                })
                && condition(p, "Ready") == Some("True")
        })
        .count();
    (open, pods.len())
}

fn gated(name: &str, replicas: i64) -> Value {
    let mut d = with_readiness_gate(deployment(name, replicas, name), GATE_CONDITION_TYPE);
    d["spec"]["template"]["metadata"]["labels"][GATE_LABEL] = Value::from(GATE_LABEL_VALUE);
    d
}

/// One table row: the RPCs received between `before` and `after`, over `window`.
fn row(
    phase: &str,
    window: Duration,
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) {
    let secs = window.as_secs_f64();
    let mut total = 0;
    let mut by = Vec::new();
    for (rpc, n) in after {
        let d = n - before.get(rpc).copied().unwrap_or(0);
        if d > 0 {
            total += d;
            by.push(format!("`{rpc}` {d} ({:.1}/s)", d as f64 / secs));
        }
    }
    let by = if by.is_empty() {
        "—".to_owned()
    } else {
        by.join(", ")
    };
    println!(
        "| {phase} | {secs:.1} s | {total} | {:.1} | {by} |",
        total as f64 / secs
    );
}

async fn run(idle: Duration, pods: i64, latency_ms: u64, max_wait: Duration) {
    let mut options = Options::e2e();
    options.emulator = EmulatorConfig {
        latency_ms,
        ..EmulatorConfig::default()
    };
    let h = Harness::start(options).await;
    let fake = FakeApi::start().await;
    for i in 0..3 {
        fake.put(
            "nodes",
            node(&format!("node-{i}"), &[&format!("10.0.0.{}", i + 1)]),
        );
    }
    let controllers = fake.start_controllers(ControllersConfig::default());
    for name in ["web", "api"] {
        fake.put(
            "services",
            selecting_service(name, &format!("uid-{name}"), name),
        );
        fake.put("deployments", gated(name, 2));
    }
    let mut config = test_config(&h.url(), Mode::Cluster { pods: true });
    config.readiness_gate = true;
    let metrics = config.metrics.clone();
    let w = RunningWatcher::start(config, fake.watcher_clients());
    let settled = Instant::now();
    let bound = settled + max_wait;
    while (programmed(&fake, "web"), programmed(&fake, "api")) != ((2, 2), (2, 2))
        && Instant::now() < bound
    {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let start = (programmed(&fake, "web"), programmed(&fake, "api"));
    println!(
        "(the 4 first pods: (programmed, pods) of web and api {start:?} after {:.1} s)",
        settled.elapsed().as_secs_f64()
    );
    // Let the write-back's conditions and ingress settle.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Phase A: idle.
    let before = writer_rpcs(&h);
    let started = Instant::now();
    tokio::time::sleep(idle).await;
    let after = writer_rpcs(&h);
    row(
        "idle (2 Services, 4 pods programmed)",
        started.elapsed(),
        &before,
        &after,
    );

    // Phase B: `pods` gated pods wait while NRP takes `latency_ms` per call.
    let want = 2 + pods as usize;
    let before = writer_rpcs(&h);
    let waits_before = gate_waits(&metrics);
    let started = Instant::now();
    fake.scale("web", want as i64);
    let bound = Instant::now() + max_wait;
    while programmed(&fake, "web") != (want, want) && Instant::now() < bound {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let window = started.elapsed();
    let after = writer_rpcs(&h);
    let (open, all) = programmed(&fake, "web");
    let waits = gate_waits(&metrics);
    let (waited, gates_opened) = (waits.0 - waits_before.0, waits.1 - waits_before.1);
    let rpcs: u64 = after.values().sum::<u64>() - before.values().sum::<u64>();
    println!(
        "(phase B: {gates_opened} gates opened, {waited:.1} pod-seconds from containers ready to \
         gate True, mean {:.2} s; {:.2} Writer RPCs per pod-second waited)",
        waited / gates_opened.max(1) as f64,
        rpcs as f64 / waited.max(f64::MIN_POSITIVE)
    );
    row(
        &format!("{pods} gated pods waiting (scale-up until all programmed: {open} of {all})"),
        window,
        &before,
        &after,
    );
    if open != want {
        let nrp = clb_tests::rollout::nrp_backends(&h);
        let pending: Vec<String> = fake
            .deployment_pods("web")
            .iter()
            .filter(|p| {
                p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == GATE_CONDITION_TYPE && c["status"] == "False")
            })
            .map(|p| {
                let ip = p["status"]["podIP"].as_str().unwrap_or("-").to_owned();
                format!("{ip} in NRP: {}", nrp.contains(&ip))
            })
            .collect();
        println!(
            "not all programmed after {max_wait:?}: (gate, reason, Ready) {:?}; gates False: {pending:?}",
            gates(&fake, "web")
        );
    }

    w.stop().await;
    controllers.stop().await;
    h.shutdown().await;
}

fn main() {
    clb_tests::init_tracing();
    rustls::crypto::aws_lc_rs::default_provider()
        .install_default()
        .ok();
    let idle = Duration::from_secs(env_usize("CLB_BENCH_IDLE_S", 20) as u64);
    let pods = env_usize("CLB_BENCH_PODS", 100) as i64;
    let latency_ms = env_usize("CLB_BENCH_NRP_LATENCY_MS", 1000) as u64;
    let max_wait = Duration::from_secs(env_usize("CLB_BENCH_MAX_WAIT_S", 180) as u64);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "Writer RPCs of the watcher: NRP {latency_ms} ms per call, 3 nodes, 3 workers, readiness \
         gate on"
    );
    println!("| phase | window | Writer RPCs | per second | by rpc (count, per second) |");
    println!("|---|---|---|---|---|");
    rt.block_on(run(idle, pods, latency_ms, max_wait));
}
