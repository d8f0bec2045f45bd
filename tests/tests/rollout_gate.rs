//! Zero-downtime rollouts with the pod readiness gate `clb.azure.com/programmed` (issue 21):
//! simulated Deployment controller, kubelet and EndpointSlice controller in the fake Kubernetes
//! API (`FakeApi::start_controllers`: pods Ready = containers ready AND every readiness gate True;
//! rolling update with maxSurge 25 % / maxUnavailable 0; old pods deleted only once new ones are
//! Ready), the whole clb system (state server, workers, the NRP emulator at 1 s per call, the
//! watcher with `--readiness-gate`).
//!
//! Every 10 ms a sampler counts the Service's backends in NRP that belong to live, non-terminating
//! pods. With the gate the count never drops below the replica count (10 replicas, and 1); without
//! it the same rollout shows the drop (asserted, so the test proves it can see one). A pod whose
//! programming does not happen gets its gate True with reason `Timeout` after the bound, with a
//! Warning Event.

use std::time::{Duration, Instant};

use clb_tests::fake_kube::FakeApi;
use clb_tests::fake_kube::controllers::{ControllersConfig, ControllersHandle, condition};
use clb_tests::kube_objects::{
    RunningWatcher, deployment, eventually, node, selecting_service, test_config,
    with_readiness_gate,
};
use clb_tests::rollout::{RolloutRun, RolloutSpec, UID, ready_pods};
use clb_tests::{Harness, Options};
use clb_watcher::Mode;
use clb_watcher::webhook::{GATE_CONDITION_TYPE, GATE_LABEL, GATE_LABEL_VALUE};
use serde_json::Value;

async fn rollout(replicas: i64, gate: bool) -> RolloutRun {
    clb_tests::init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    clb_tests::rollout::rollout(RolloutSpec {
        replicas,
        gate,
        nrp_latency_ms: 1_000,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_gate_a_rollout_of_10_never_has_fewer_than_10_live_backends() {
    let r = rollout(10, true).await;
    println!(
        "gate on, 10 replicas: min live backends {} over {} samples",
        r.min_live_backends, r.samples
    );
    assert!(r.samples > 10, "the sampler ran");
    assert!(
        r.min_live_backends >= 10,
        "the Service lost capacity: {} of 10",
        r.min_live_backends
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_gate_a_rollout_of_1_never_has_no_live_backend() {
    let r = rollout(1, true).await;
    println!(
        "gate on, 1 replica: min live backends {} over {} samples",
        r.min_live_backends, r.samples
    );
    assert!(
        r.min_live_backends >= 1,
        "the Service had no live backend during the rollout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_gate_the_same_rollout_loses_capacity() {
    let r = rollout(10, false).await;
    println!(
        "gate off, 10 replicas: min live backends {} over {} samples",
        r.min_live_backends, r.samples
    );
    assert!(
        r.min_live_backends < 10,
        "no drop seen without the gate: the test could not tell the difference"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_never_programmed_fails_open_after_the_bound_with_a_warning_event() {
    clb_tests::init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    // No sync worker: nothing reaches NRP, the pod's address is never programmed.
    let mut options = Options::e2e();
    options.workers = 0;
    let h = Harness::start(options).await;
    let fake = FakeApi::start().await;
    fake.put("nodes", node("node-0", &["10.0.0.1"]));
    let controllers = fake.start_controllers(ControllersConfig::default());
    fake.put("services", selecting_service("web", UID, "web"));
    let mut d = with_readiness_gate(deployment("web", 1, "web"), GATE_CONDITION_TYPE);
    d["spec"]["template"]["metadata"]["labels"][GATE_LABEL] = Value::from(GATE_LABEL_VALUE);
    fake.put("deployments", d);
    let mut config = test_config(&h.url(), Mode::Cluster { pods: true });
    config.readiness_gate = true;
    config.readiness_gate_timeout = Duration::from_secs(2);
    let metrics = config.metrics.clone();
    let w = RunningWatcher::start(config, fake.watcher_clients());
    // First False/Pending, then True/Timeout.
    let gate_of = |fake: &FakeApi| -> Option<(String, String)> {
        let pods = fake.deployment_pods("web");
        let c = pods.first()?["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == GATE_CONDITION_TYPE)?
            .clone();
        Some((
            c["status"].as_str()?.to_owned(),
            c["reason"].as_str()?.to_owned(),
        ))
    };
    eventually("the gate False, Pending", || async {
        match gate_of(&fake) {
            Some((s, r)) if s == "False" && r == "Pending" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    eventually("the gate True, Timeout", || async {
        match gate_of(&fake) {
            Some((s, r)) if s == "True" && r == "Timeout" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    eventually("the pod Ready", || async {
        if ready_pods(&fake) == 1 {
            Ok(())
        } else {
            Err("not Ready".to_owned())
        }
    })
    .await;
    let events: Vec<Value> = fake
        .events()
        .into_iter()
        .filter(|e| e["reason"] == "ReadinessGateTimeout")
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    let note = events[0]["note"].as_str().unwrap_or_default();
    assert!(
        note.contains(UID) && note.contains("failing open"),
        "{note}"
    );
    assert_eq!(events[0]["type"], "Warning");
    // Counted once the watcher has seen its patch answered, which may be just after the fake API
    // shows it.
    eventually("the Timeout counted", || async {
        let text = metrics.encode();
        if text
            .lines()
            .any(|l| l.starts_with("clb_watcher_readiness_gate_total{reason=\"Timeout\"} 1"))
        {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;
    w.stop().await;
    controllers.stop().await;
    h.shutdown().await;
}

/// Every Writer RPC the state server has received, by RPC (`clb_server_update_rpcs_total`).
fn writer_rpcs(h: &Harness) -> Vec<(String, u64)> {
    h.server()
        .state
        .metrics()
        .encode()
        .lines()
        .filter(|l| l.starts_with("clb_server_update_rpcs_total{"))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The system, the fake API with its controllers, Service `web` selecting Deployment `web` of 2
/// gated pods on one node, and the watcher in cluster mode with the readiness gate; every list of
/// EndpointSlices takes `list_latency`.
async fn gated_web(
    list_latency: Duration,
) -> (Harness, FakeApi, ControllersHandle, RunningWatcher) {
    clb_tests::init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    let fake = FakeApi::start().await;
    fake.put("nodes", node("node-0", &["10.0.0.1"]));
    let controllers = fake.start_controllers(ControllersConfig::default());
    fake.put("services", selecting_service("web", UID, "web"));
    let mut d = with_readiness_gate(deployment("web", 2, "web"), GATE_CONDITION_TYPE);
    d["spec"]["template"]["metadata"]["labels"][GATE_LABEL] = Value::from(GATE_LABEL_VALUE);
    fake.put("deployments", d);
    if !list_latency.is_zero() {
        fake.set_list_latency("endpointslices", list_latency);
    }
    let mut config = test_config(&h.url(), Mode::Cluster { pods: true });
    config.readiness_gate = true;
    let w = RunningWatcher::start(config, fake.watcher_clients());
    (h, fake, controllers, w)
}

/// Gated pods are released by what the state server pushes (`WatchAddresses`: no unary call for
/// them, no poll), and once they are Ready an idle cluster costs the server no RPC at all: the
/// watcher's session, write-back and gate only hold their streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gates_open_on_a_push_and_an_idle_cluster_costs_no_rpc() {
    let (h, fake, controllers, w) = gated_web(Duration::ZERO).await;
    eventually("both pods Ready, their gates Programmed", || async {
        let programmed = fake
            .deployment_pods("web")
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
            })
            .count();
        match (programmed, ready_pods(&fake)) {
            (2, 2) => Ok(()),
            other => Err(format!("(programmed, ready) = {other:?}")),
        }
    })
    .await;
    let before = writer_rpcs(&h);
    assert!(
        before
            .iter()
            .any(|(rpc, n)| rpc.contains("\"watch_addresses\"") && *n >= 1),
        "{before:?}"
    );
    // Idle: nothing changes in the cluster; the count of RPCs stays where it is.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(writer_rpcs(&h), before);
    w.stop().await;
    controllers.stop().await;
    h.shutdown().await;
}

/// Pods of Deployment `web` whose gate is `True` with reason `Programmed` and that are Ready.
fn programmed_and_ready(fake: &FakeApi) -> usize {
    fake.deployment_pods("web")
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
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
        .count()
}

/// A scale-up of gated pods is not held back by the gate's own writes. Each write to the API
/// takes 250 ms here (a loaded API server); 40 new gated pods. The gate once took in one pod event
/// per patch it made (a watch's body is read only while it is polled, and its loop awaited each
/// patch) and patched one pod after the other: at least 40 × 250 ms = 10 s for the `True`
/// patches alone, as long again for the `Pending` ones. Now the pod watch is read by a task of
/// its own and the patches go side by side (the fake API counts the pod writes it serves at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_up_is_not_held_back_by_the_gates_patches_one_after_another() {
    clb_tests::init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    let fake = FakeApi::start().await;
    for i in 0..3 {
        fake.put(
            "nodes",
            node(&format!("node-{i}"), &[&format!("10.0.0.{}", i + 1)]),
        );
    }
    let controllers = fake.start_controllers(ControllersConfig::default());
    fake.put("services", selecting_service("web", UID, "web"));
    let mut d = with_readiness_gate(deployment("web", 1, "web"), GATE_CONDITION_TYPE);
    d["spec"]["template"]["metadata"]["labels"][GATE_LABEL] = Value::from(GATE_LABEL_VALUE);
    fake.put("deployments", d);
    let mut config = test_config(&h.url(), Mode::Cluster { pods: true });
    config.readiness_gate = true;
    let w = RunningWatcher::start(config, fake.watcher_clients());
    eventually("the first pod Programmed and Ready", || async {
        match programmed_and_ready(&fake) {
            1 => Ok(()),
            n => Err(format!("{n}")),
        }
    })
    .await;
    fake.set_write_latency(Duration::from_millis(250));
    let started = Instant::now();
    fake.scale("web", 41);
    let bound = started + Duration::from_secs(60);
    while programmed_and_ready(&fake) < 41 && Instant::now() < bound {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let took = started.elapsed();
    let done = programmed_and_ready(&fake);
    println!(
        "40 gated pods, 250 ms per API write: {done} of 41 Programmed and Ready after {:.1} s \
         (at most {} writes in flight at once)",
        took.as_secs_f64(),
        fake.max_writes_in_flight()
    );
    assert_eq!(done, 41, "not every gate opened within 60 s");
    // What the test holds is the shape, not a time (the time is the bench's, `writer_rpcs`): the
    // gate's pod patches went side by side, which the loop that awaited each could not do.
    assert!(
        fake.max_pod_writes_in_flight() > 1,
        "the gate's pod patches went one after the other ({took:?} for the scale-up)"
    );
    w.stop().await;
    controllers.stop().await;
    h.shutdown().await;
}

/// A gate is not opened as `NotSelected` before the watcher has listed the EndpointSlices: a
/// large cluster's first list takes seconds, longer than the grace a late EndpointSlice gets, and
/// a watcher restarted mid-rollout would otherwise turn the new pods Ready before Azure has them
/// (the gate never goes back to `False`). Here every list of EndpointSlices takes 4 s, twice the
/// grace; the pods' gates must end `Programmed`, none `NotSelected`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_waits_for_the_endpointslices_first_list_before_deciding_not_selected() {
    // Twice the grace of the gate (`NOT_SELECTED_GRACE`, 2 s).
    let (h, fake, controllers, w) = gated_web(Duration::from_secs(4)).await;
    let reasons = eventually("both pods' gates True", || async {
        let reasons: Vec<String> = fake
            .deployment_pods("web")
            .iter()
            .filter_map(|p| {
                p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["type"] == GATE_CONDITION_TYPE && c["status"] == "True")
                    .map(|c| c["reason"].as_str().unwrap_or_default().to_owned())
            })
            .collect();
        (reasons.len() == 2)
            .then_some(reasons.clone())
            .ok_or(format!("{reasons:?}"))
    })
    .await;
    assert_eq!(reasons, ["Programmed", "Programmed"]);
    w.stop().await;
    controllers.stop().await;
    h.shutdown().await;
}
