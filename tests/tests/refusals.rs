//! Issue 34: what NRP refuses costs one address and a bounded number of writes, not its node, not
//! the other nodes and not the subscription's write budget. The state server, workers and the
//! emulator in one process (`clb_tests::Harness`); the emulator refuses every call that carries one
//! given address (`EmulatorConfig::refused_addresses`), naming it in its message or not.
//!
//! - Only the refused address is held: every other address of its node and every other node,
//!   sent in the same units, reach NRP; a later change of another Service at the same node goes
//!   through while the address is held.
//! - The held address is visible (`Admin.Status`: `refused`, `refused_addresses`) with its code,
//!   and sent again on the refusal schedule (here shortened: 400 ms doubling to 1.6 s), not on the
//!   retry schedule: the refused calls counted by the emulator over 12 s stay within its bound.
//! - A change of its desired state (another Service gains it) sends it at once (refused again,
//!   with the new ref); removed, its hold is gone.
//! - Through the watcher (the real one, against the fake Kubernetes API): the Service whose
//!   endpoint NRP refuses shows `Programmed=False` (`RejectedByAzure`) naming the code and the
//!   address, with one Warning Event, and its other endpoint is in NRP.
//!
//! Waits poll with a generous deadline that only bounds a hung test; nothing asserts timing.

use std::time::{Duration, Instant};

use clb_client::updates;
use clb_tests::fake_kube::FakeApi;
use clb_tests::kube_objects::{
    RunningWatcher, endpoint, eventually, node, service, slice, test_config, wait_condition,
};
use clb_tests::refusal::{
    CODE, REFUSED, at_refused_node, good_addresses, in_nrp, refuse, refused_calls, view,
    wait_in_nrp,
};
use clb_tests::{Harness, Options, PATIENCE, WriterExt};
use clb_watcher::Mode;
use serde_json::{Value, json};

async fn start(name_address: bool) -> Harness {
    clb_tests::init_tracing();
    let mut options = Options::e2e();
    refuse(&mut options, name_address);
    options.server.dispatch.refusal_base = Duration::from_millis(400);
    options.server.dispatch.refusal_max = Duration::from_millis(1600);
    Harness::start(options).await
}

/// Waits until the gateway's status satisfies `check`; returns it.
async fn wait_status(
    h: &Harness,
    what: &str,
    check: impl Fn(&clb_proto::v1::GatewayStatus) -> bool,
) -> clb_proto::v1::GatewayStatus {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let status = h.gateway_status().await;
        if check(&status) {
            return status;
        }
        assert!(Instant::now() < deadline, "{what}: {status:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn refusal_is_contained_and_bounded(name_address: bool) {
    let h = start(name_address).await;
    let r = h.watcher().await.resync_ok(view()).await;
    assert_eq!(r.rejected.len(), 0, "{r:?}");
    // Every address but the refused one, node 3's other address included.
    let all = good_addresses();
    wait_in_nrp(&h, "svc-a", &all).await;
    assert!(!in_nrp(&h, "svc-a").contains(&REFUSED.to_owned()));
    let status = wait_status(&h, "the refused address held", |s| s.refused_addresses == 1).await;
    let held = &status.refused[0];
    assert_eq!(
        (
            held.kind.as_str(),
            held.location.as_str(),
            held.address.as_str()
        ),
        ("address", "10.0.0.3", REFUSED),
        "{held:?}"
    );
    assert_eq!(held.code, CODE);
    assert_eq!(held.service_ids, ["svc-a"]);
    assert_eq!(
        status.parked_units, 0,
        "its location is not held: {status:?}"
    );

    // Another Service's endpoint at the same node goes through while the address is held.
    h.watcher()
        .await
        .apply_ok(at_refused_node("svc-b", "10.1.1.3"))
        .await;
    wait_in_nrp(&h, "svc-b", &["10.1.1.3".to_owned()]).await;
    assert_eq!(h.gateway_status().await.refused_addresses, 1, "still held");

    // Over 12 s, the held address is sent again on the refusal schedule only: delays of at least
    // 200, 400, 800, 800, … ms (jitter in [delay/2, delay]), so at most 17 refused calls; on the
    // retry schedule (200 ms to 30 s, every attempt repaired by a read-back) it was 30 and more in
    // 20 s, with its whole node.
    let before = refused_calls(&h);
    tokio::time::sleep(Duration::from_secs(12)).await;
    let spent = refused_calls(&h) - before;
    eprintln!("refused calls in 12 s (named: {name_address}): {spent}");
    assert!(spent >= 2, "still sent again: {spent}");
    assert!(
        spent <= 17,
        "the refusal budget: {spent} refused calls in 12 s"
    );

    // Its desired state changes (svc-b gains it): sent at once with the new ref, refused again.
    h.watcher()
        .await
        .apply_ok(vec![updates::endpoints_level(
            "svc-b",
            vec![
                updates::endpoint("10.1.1.3", "10.0.0.3"),
                updates::endpoint(REFUSED, "10.0.0.3"),
            ],
        )])
        .await;
    wait_status(&h, "refused again with its new ref", |s| {
        s.refused
            .first()
            .is_some_and(|r| r.service_ids == ["svc-a", "svc-b"])
    })
    .await;

    // Removed from both: its hold is gone, and nothing else moved.
    h.watcher()
        .await
        .apply_ok(vec![
            updates::endpoints_level("svc-a", clb_tests::refusal::endpoints(false)),
            updates::endpoints_level("svc-b", vec![updates::endpoint("10.1.1.3", "10.0.0.3")]),
        ])
        .await;
    let status = wait_status(&h, "the hold gone", |s| {
        s.refused_addresses == 0 && s.refused.is_empty()
    })
    .await;
    assert_eq!(status.parked_units, 0);
    wait_in_nrp(&h, "svc-a", &all).await;
    wait_in_nrp(&h, "svc-b", &["10.1.1.3".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_nrp_refuses_and_names_costs_that_address_only_and_a_bounded_budget() {
    refusal_is_contained_and_bounded(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_nrp_refuses_without_naming_it_is_found_by_splitting() {
    refusal_is_contained_and_bounded(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_service_of_a_refused_endpoint_shows_the_rejection_and_a_warning() {
    let h = start(false).await;
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let fake = FakeApi::start().await;
    fake.put("nodes", node("node-a", &["10.0.0.1"]));
    let uid = "3e1f0e5a-0000-4000-8000-000000000034";
    fake.put(
        "services",
        service(
            "web",
            uid,
            json!({"type": "LoadBalancer", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}),
        ),
    );
    let slice_of = |endpoints| slice("web-1", "web", "IPv4", endpoints);
    fake.put(
        "endpointslices",
        slice_of(vec![
            endpoint("10.1.0.1", "node-a", true),
            endpoint(REFUSED, "node-a", true),
        ]),
    );
    let w = RunningWatcher::start(
        test_config(&h.url(), Mode::Cluster { pods: false }),
        fake.watcher_clients(),
    );
    let c = wait_condition(&fake, "web", "RejectedByAzure").await;
    assert_eq!(c["status"], "False");
    let message = c["message"].as_str().unwrap_or_default();
    assert!(message.contains(CODE), "{c}");
    assert!(
        message.contains(&format!("address {REFUSED} at location 10.0.0.1")),
        "{c}"
    );
    wait_in_nrp(&h, uid, &["10.1.0.1".to_owned()]).await;
    let warnings = eventually("the Warning Event with the code", || async {
        let e: Vec<Value> = fake
            .events()
            .into_iter()
            .filter(|e| {
                e.pointer("/regarding/uid").and_then(Value::as_str) == Some(uid)
                    && e["type"] == "Warning"
                    && e["reason"] == "RejectedByAzure"
            })
            .collect();
        (!e.is_empty()).then_some(e).ok_or("none yet".to_owned())
    })
    .await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0]["note"]
            .as_str()
            .unwrap_or_default()
            .contains(CODE),
        "{:?}",
        warnings[0]
    );

    // The bad endpoint gone: programmed.
    fake.put(
        "endpointslices",
        slice_of(vec![endpoint("10.1.0.1", "node-a", true)]),
    );
    wait_condition(&fake, "web", "Programmed").await;
    w.stop().await;
}
