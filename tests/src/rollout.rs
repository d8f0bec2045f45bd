//! A Deployment rollout against the whole clb system with the pod readiness gate on or off
//! (issue 21): simulated Deployment controller, kubelet and EndpointSlice controller in the fake
//! Kubernetes API, the state server, 3 workers, the NRP emulator at a given latency per call, the
//! watcher in cluster mode. Every 10 ms a sampler counts the Service's backends in NRP that belong
//! to live, non-terminating pods, and notes when each pod's containers turned ready and when its
//! gate turned True. Used by `tests/tests/rollout_gate.rs` and `tests/benches/readiness_gate.rs`.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clb_embedded::{Harness, Options};
use clb_nrp_emulator::EmulatorConfig;
use clb_watcher::Mode;
use clb_watcher::webhook::{GATE_CONDITION_TYPE, GATE_LABEL, GATE_LABEL_VALUE};
use serde_json::Value;

use crate::fake_kube::FakeApi;
use crate::fake_kube::controllers::{ControllersConfig, KubeletConfig};
use crate::kube_objects::{
    RunningWatcher, deployment, eventually, node, selecting_service, test_config,
    with_readiness_gate,
};

/// Pod UID → (its containers seen ready, its gate seen True).
type Seen = HashMap<String, (Option<Instant>, Option<Instant>)>;

/// What to roll out.
#[derive(Debug, Clone, Copy)]
pub struct RolloutSpec {
    /// Replicas of the Deployment.
    pub replicas: i64,
    /// Whether the pods carry the gate (and the watcher drives it).
    pub gate: bool,
    /// The emulator's latency per NRP call.
    pub nrp_latency_ms: u64,
}

/// What a rollout showed.
#[derive(Debug, Clone)]
pub struct RolloutRun {
    /// The fewest live backends in NRP seen during the rollout.
    pub min_live_backends: usize,
    /// Samples taken.
    pub samples: usize,
    /// From the rollout's start to every pod new, Ready, and NRP holding exactly them.
    pub duration: Duration,
    /// Per new pod (gate on): from its containers seen ready to its gate seen True.
    pub gate_latencies: Vec<Duration>,
}

/// The Service's UID.
pub const UID: &str = "uid-web";

/// Pod IPs of the Deployment's live pods (not being deleted).
pub fn live_ips(fake: &FakeApi) -> BTreeSet<String> {
    fake.deployment_pods("web")
        .into_iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|p| p["status"]["podIP"].as_str().map(str::to_owned))
        .collect()
}

/// The addresses NRP has with the Service.
pub fn nrp_backends(h: &Harness) -> BTreeSet<String> {
    let dump = h.emulator().dump();
    dump.gateways
        .iter()
        .flat_map(|g| g.address_map())
        .filter(|(_, services)| services.iter().any(|s| s.eq_ignore_ascii_case(UID)))
        .map(|((_, address), _)| address)
        .collect()
}

/// Ready pods of the Deployment (not being deleted).
pub fn ready_pods(fake: &FakeApi) -> usize {
    fake.deployment_pods("web")
        .iter()
        .filter(|p| {
            p["metadata"]["deletionTimestamp"].is_null()
                && p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
        .count()
}

/// Runs one rollout as `spec` says.
pub async fn rollout(spec: RolloutSpec) -> RolloutRun {
    let RolloutSpec {
        replicas,
        gate,
        nrp_latency_ms,
    } = spec;
    let mut options = Options::e2e();
    options.emulator = EmulatorConfig {
        latency_ms: nrp_latency_ms,
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
    let controllers = fake.start_controllers(ControllersConfig {
        kubelet: Some(KubeletConfig {
            containers_ready_after: Duration::from_millis(100),
            termination_grace: Duration::from_millis(300),
            ..KubeletConfig::default()
        }),
        ..ControllersConfig::default()
    });
    fake.put("services", selecting_service("web", UID, "web"));
    let mut d = deployment("web", replicas, "web");
    if gate {
        d = with_readiness_gate(d, GATE_CONDITION_TYPE);
        d["spec"]["template"]["metadata"]["labels"][GATE_LABEL] = Value::from(GATE_LABEL_VALUE);
    }
    fake.put("deployments", d);
    let mut config = test_config(&h.url(), Mode::Cluster { pods: true });
    config.readiness_gate = gate;
    let w = RunningWatcher::start(config, fake.watcher_clients());

    let want = replicas as usize;
    eventually("every pod Ready and in NRP", || async {
        let (ready, live, nrp) = (ready_pods(&fake), live_ips(&fake), nrp_backends(&h));
        if ready == want && live.len() == want && live.is_subset(&nrp) {
            Ok(())
        } else {
            Err(format!("ready {ready}, live {live:?}, NRP {nrp:?}"))
        }
    })
    .await;

    // Sample every 10 ms through the rollout.
    let stop = Arc::new(AtomicBool::new(false));
    let min = Arc::new(AtomicUsize::new(usize::MAX));
    let samples = Arc::new(AtomicUsize::new(0));
    // uid → (containers seen ready, gate seen True)
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let sampler = {
        let (stop, min, samples, seen) = (stop.clone(), min.clone(), samples.clone(), seen.clone());
        let (fake, dump) = (fake.clone(), h.emulator().clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let now = Instant::now();
                for p in fake.deployment_pods("web") {
                    let cond = |t: &str| {
                        p["status"]["conditions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|c| c["type"] == t && c["status"] == "True")
                    };
                    let uid = p["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
                    let mut seen = seen.lock().unwrap();
                    let e = seen.entry(uid).or_default();
                    if e.0.is_none() && cond("ContainersReady") {
                        e.0 = Some(now);
                    }
                    if e.1.is_none() && cond(GATE_CONDITION_TYPE) {
                        e.1 = Some(now);
                    }
                }
                let live = live_ips(&fake);
                let nrp: BTreeSet<String> = dump
                    .dump()
                    .gateways
                    .iter()
                    .flat_map(|g| g.address_map())
                    .filter(|(_, s)| s.iter().any(|s| s.eq_ignore_ascii_case(UID)))
                    .map(|((_, a), _)| a)
                    .collect();
                let n = live.intersection(&nrp).count();
                min.fetch_min(n, Ordering::SeqCst);
                samples.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let before: BTreeSet<String> = seen.lock().unwrap().keys().cloned().collect();
    let started = Instant::now();
    let hash = fake.rollout("web");
    eventually(
        "the rollout is complete and NRP holds exactly the new pods",
        || async {
            let live = live_ips(&fake);
            let nrp = nrp_backends(&h);
            let new_only = fake
                .deployment_pods("web")
                .iter()
                .all(|p| p["metadata"]["labels"]["pod-template-hash"] == hash.as_str());
            if fake.rolled_out("web") && new_only && live == nrp && live.len() == want {
                Ok(())
            } else {
                Err(format!("live {live:?}, NRP {nrp:?}"))
            }
        },
    )
    .await;
    let duration = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let _ = sampler.await;
    let gate_latencies = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(uid, _)| !before.contains(*uid))
        .filter_map(|(_, (ready, open))| Some(open.as_ref()?.saturating_duration_since((*ready)?)))
        .collect();
    w.stop().await;
    controllers.stop().await;
    h.shutdown().await;
    RolloutRun {
        min_live_backends: min.load(Ordering::SeqCst),
        samples: samples.load(Ordering::SeqCst),
        duration,
        gate_latencies,
    }
}
