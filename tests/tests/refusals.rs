//! Issue 34: what NRP refuses costs one location and a bounded number of writes, not the other
//! nodes and not the subscription's write budget. The state server, workers and the emulator in
//! one process (`clb_tests::Harness`); the emulator refuses every call that carries one given
//! address (`EmulatorConfig::refused_addresses`), naming it in its message or not.
//!
//! - The location of the refused address fails alone: every other node's changes, sent in the same
//!   units, reach NRP.
//! - The refused location is sent again on the refusal schedule (here shortened: 400 ms doubling to
//!   1.6 s), not on the retry schedule: the refused calls counted by the emulator over 12 s stay
//!   within the schedule's bound.
//! - A change of the refused location's desired state (the bad endpoint removed) sends it at once,
//!   and it goes through.
//!
//! Gap (left for the next step of the issue): a valid change of another Service at the *same*
//! location still waits with the refused address, as the location fails as a whole.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use clb_client::updates;
use clb_nrp_emulator::AddressRefusal;
use clb_tests::{Harness, Options, PATIENCE, WriterExt};

const REFUSED: &str = "10.1.0.77";
const CODE: &str = "AddressRefusedByPolicy";

async fn start(name_address: bool) -> Harness {
    clb_tests::init_tracing();
    let mut options = Options::e2e();
    options.emulator.refused_addresses = vec![AddressRefusal {
        address: REFUSED.parse::<IpAddr>().unwrap(),
        code: CODE.into(),
        name_address,
    }];
    options.server.dispatch.refusal_base = Duration::from_millis(400);
    options.server.dispatch.refusal_max = Duration::from_millis(1600);
    Harness::start(options).await
}

/// `svc-a` at 8 nodes (one address each, `10.1.0.{i}` at `10.0.0.{i}`), plus the refused address
/// at node 3.
fn view() -> Vec<clb_proto::v1::Update> {
    let mut endpoints: Vec<_> = (1..=8)
        .map(|i| updates::endpoint(&format!("10.1.0.{i}"), &format!("10.0.0.{i}")))
        .collect();
    endpoints.push(updates::endpoint(REFUSED, "10.0.0.3"));
    vec![
        updates::service_add_family("svc-a", &[], clb_proto::v1::IpFamily::Ipv4),
        updates::endpoints_level("svc-a", endpoints),
    ]
}

/// The addresses NRP holds for `svc-a`.
fn in_nrp(h: &Harness) -> Vec<String> {
    let mut got: Vec<String> = h
        .emulator()
        .dump()
        .gateway(clb_tests::GATEWAY)
        .map(|g| {
            g.address_map()
                .into_iter()
                .filter(|(_, services)| services.contains("svc-a"))
                .map(|((_, address), _)| address)
                .collect()
        })
        .unwrap_or_default();
    got.sort();
    got
}

fn refused_calls(h: &Harness) -> u64 {
    h.emulator()
        .stats()
        .rejected_by_code
        .get(CODE)
        .copied()
        .unwrap_or(0)
}

async fn every_other_node_converges(h: &Harness) {
    let want: Vec<String> = {
        let mut v: Vec<String> = (1..=8)
            .filter(|i| *i != 3)
            .map(|i| format!("10.1.0.{i}"))
            .collect();
        v.sort();
        v
    };
    let deadline = Instant::now() + PATIENCE;
    loop {
        let got = in_nrp(h);
        if want.iter().all(|a| got.contains(a)) {
            assert!(
                !got.iter().any(|a| a == REFUSED || a == "10.1.0.3"),
                "{got:?}"
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the other nodes never converged: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn refusal_is_contained_and_bounded(name_address: bool) {
    let h = start(name_address).await;
    let r = h.watcher().await.resync_ok(view()).await;
    assert_eq!(r.rejected.len(), 0, "{r:?}");
    every_other_node_converges(&h).await;

    // Over 12 s, the refused location is sent again on the refusal schedule only: delays of at
    // least 200, 400, 800, 800, … ms (jitter in [delay/2, delay]) after a first call and its
    // repair, so at most 2 + 16 refused calls; on the retry schedule (200 ms to 30 s, every
    // attempt repaired by a read-back) it was 30 and more in 20 s.
    let before = refused_calls(&h);
    tokio::time::sleep(Duration::from_secs(12)).await;
    let spent = refused_calls(&h) - before;
    eprintln!("refused calls in 12 s (named: {name_address}): {spent}");
    assert!(spent >= 2, "still sent again: {spent}");
    assert!(
        spent <= 18,
        "the refusal budget: {spent} refused calls in 12 s"
    );
    let status = h.gateway_status().await;
    assert!(status.parked_units >= 1, "held and visible: {status:?}");

    // The bad endpoint removed: node 3 goes at once, and through.
    let endpoints: Vec<_> = (1..=8)
        .map(|i| updates::endpoint(&format!("10.1.0.{i}"), &format!("10.0.0.{i}")))
        .collect();
    h.watcher()
        .await
        .apply_ok(vec![updates::endpoints_level("svc-a", endpoints)])
        .await;
    let deadline = Instant::now() + PATIENCE;
    while !in_nrp(&h).contains(&"10.1.0.3".to_owned()) {
        assert!(Instant::now() < deadline, "node 3 never converged");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(h.gateway_status().await.parked_units, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_nrp_refuses_and_names_costs_its_location_only_and_a_bounded_budget() {
    refusal_is_contained_and_bounded(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_nrp_refuses_without_naming_it_is_found_by_splitting() {
    refusal_is_contained_and_bounded(false).await;
}
