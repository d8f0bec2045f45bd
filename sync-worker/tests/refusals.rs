//! A call NRP refuses for one address is split (docs/errors.md, "A refused call is split"): the
//! worker, against the real emulator refusing one address (`EmulatorConfig::refused_addresses`),
//! finds the location change that causes the refusal and sends the others in the same unit.

#[path = "worker/harness.rs"]
mod harness;

use std::collections::BTreeSet;

use clb_nrp_emulator::{AddressRefusal, EmulatorConfig};
use clb_proto::v1::{self, LocationChange, report};
use clb_sync_worker::worker::{Limits, refusal_split_bound};
use harness::*;

const CALL: &str = "ServiceGateways_UpdateAddressLocations";

/// Eight location changes `10.0.0.{i}`, each with address `10.1.{i}.1` for `svc-a` (and `10.1.{i}.2`
/// for `egress-e`); the even ones full updates.
fn eight() -> Vec<LocationChange> {
    (0..8)
        .map(|i| {
            let (a, b) = (format!("10.1.{i}.1"), format!("10.1.{i}.2"));
            location(
                &format!("10.0.0.{i}"),
                i % 2 == 0,
                &[(a.as_str(), &["svc-a"]), (b.as_str(), &["egress-e"])],
            )
        })
        .collect()
}

fn refusing(refusals: &[(&str, &str, bool)]) -> EmulatorConfig {
    EmulatorConfig {
        refused_addresses: refusals
            .iter()
            .map(|&(address, code, name_address)| AddressRefusal {
                address: address.parse().unwrap(),
                code: code.into(),
                name_address,
            })
            .collect(),
        ..Default::default()
    }
}

/// A harness whose emulator refuses as `config` says once the services are created.
async fn start(config: EmulatorConfig, limits: Limits) -> (Harness, Conn) {
    let mut h = Harness::start(EmulatorConfig::default(), limits).await;
    let mut conn = h.conn().await;
    create_services(&mut conn).await;
    h.emulator().set_config(config).unwrap();
    h.emulator().reset_stats();
    (h, conn)
}

/// The locations NRP holds addresses at.
fn programmed(h: &Harness) -> BTreeSet<String> {
    h.address_map().into_keys().map(|(l, _)| l).collect()
}

fn locations_but(except: &[usize]) -> BTreeSet<String> {
    (0..8)
        .filter(|i| !except.contains(i))
        .map(|i| format!("10.0.0.{i}"))
        .collect()
}

fn indices_but(except: &[u32]) -> Vec<u32> {
    (0..8).filter(|i| !except.contains(i)).collect()
}

/// The code of the report's outcome.
fn code(r: &v1::Report) -> &str {
    match &r.outcome {
        Some(report::Outcome::Repair(x)) => &x.code,
        Some(report::Outcome::Terminal(x)) => &x.code,
        Some(report::Outcome::Retryable(x)) => &x.code,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[tokio::test]
async fn a_refusal_naming_its_address_costs_one_extra_call_and_fails_only_its_location() {
    let (mut h, mut conn) = start(
        refusing(&[("10.1.5.1", "AddressRefusedByPolicy", true)]),
        Limits::default(),
    )
    .await;
    let r = conn.run(locations(2, eight())).await;
    // An unlisted 4xx is repaired (read back, then sent again), never parked on a guess.
    assert_eq!(repair(&r).code, "AddressRefusedByPolicy", "{r:?}");
    assert!(repair(&r).message.contains("'10.1.5.1'"), "{r:?}");
    assert_eq!(r.applied_indices, indices_but(&[5]));
    assert_eq!(programmed(&h), locations_but(&[5]), "NRP holds the other 7");
    assert_eq!(h.address_map().len(), 14, "both addresses of each");
    let calls = h.emulator().stats().calls_of(CALL);
    assert_eq!(
        calls, 2,
        "the call, and the call without the named location"
    );
    assert_eq!(h.metrics.refusal_split_calls(), 1);
    assert!(
        h.metrics
            .encode()
            .contains("clb_worker_refusal_split_calls_total 1"),
        "{}",
        h.metrics.encode()
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_refusal_naming_no_address_is_halved_down_to_its_location_within_the_bound() {
    let (mut h, mut conn) = start(
        refusing(&[("10.1.5.1", "AddressRefusedByPolicy", false)]),
        Limits::default(),
    )
    .await;
    let r = conn.run(locations(2, eight())).await;
    assert_eq!(repair(&r).code, "AddressRefusedByPolicy", "{r:?}");
    assert_eq!(r.applied_indices, indices_but(&[5]));
    assert_eq!(programmed(&h), locations_but(&[5]), "NRP holds the other 7");
    let calls = h.emulator().stats().calls_of(CALL);
    // Halves of 4, 2 and 1: two calls a level, three levels.
    assert_eq!(calls, 1 + 6);
    assert!(calls <= 1 + refusal_split_bound(8) as u64);
    assert_eq!(h.metrics.refusal_split_calls(), 6);
    h.shutdown().await;
}

#[tokio::test]
async fn two_refused_addresses_named_are_left_out_one_after_the_other() {
    let (mut h, mut conn) = start(
        refusing(&[
            ("10.1.1.2", "InvalidAddress", true),
            ("10.1.6.1", "InvalidAddress", true),
        ]),
        Limits::default(),
    )
    .await;
    let r = conn.run(locations(2, eight())).await;
    // A parked code: the culprits are parked, the others went through.
    assert_eq!(terminal(&r).code, "InvalidAddress", "{r:?}");
    assert_eq!(r.applied_indices, indices_but(&[1, 6]));
    assert_eq!(programmed(&h), locations_but(&[1, 6]));
    assert_eq!(h.emulator().stats().calls_of(CALL), 1 + 2);
    h.shutdown().await;
}

#[tokio::test]
async fn when_the_bound_is_reached_what_is_not_decided_fails_with_the_refusal() {
    let (mut h, mut conn) = start(
        refusing(&[
            ("10.1.1.1", "InvalidAddress", false),
            ("10.1.6.1", "InvalidAddress", false),
        ]),
        Limits::default(),
    )
    .await;
    let r = conn.run(locations(2, eight())).await;
    assert_eq!(terminal(&r).code, "InvalidAddress", "{r:?}");
    // Halves [0..4] and [4..8] refused; [0,1] refused, [2,3] and [4,5] through, [6,7] refused;
    // [0] through, [1] refused: the 8 extra calls of the bound. [6,7] is not decided.
    assert_eq!(r.applied_indices, vec![0, 2, 3, 4, 5]);
    assert_eq!(programmed(&h), locations_but(&[1, 6, 7]));
    assert_eq!(
        h.emulator().stats().calls_of(CALL),
        1 + refusal_split_bound(8) as u64
    );
    assert_eq!(h.metrics.refusal_split_calls(), 8);
    h.shutdown().await;
}

#[tokio::test]
async fn the_unit_goes_on_after_a_split_call() {
    // Two calls of four: the first is refused and split, the second is sent as planned.
    let limits = Limits {
        max_locations_per_call: 4,
        ..Limits::default()
    };
    let (mut h, mut conn) = start(
        refusing(&[("10.1.2.2", "AddressRefusedByPolicy", true)]),
        limits,
    )
    .await;
    let r = conn.run(locations(2, eight())).await;
    assert_eq!(repair(&r).code, "AddressRefusedByPolicy", "{r:?}");
    assert_eq!(r.applied_indices, indices_but(&[2]));
    assert_eq!(programmed(&h), locations_but(&[2]));
    assert_eq!(h.emulator().stats().calls_of(CALL), 2 + 1);
    h.shutdown().await;
}

#[tokio::test]
async fn a_retryable_failure_is_not_split() {
    // The address is refused, but every call meets an injected 500 or 503 first.
    let config = EmulatorConfig {
        fault_rate_5xx: 1.0,
        seed: Some(7),
        ..refusing(&[("10.1.5.1", "AddressRefusedByPolicy", true)])
    };
    let (mut h, mut conn) = start(config, Limits::default()).await;
    let r = conn.run(locations(2, eight())).await;
    let x = retryable(&r);
    assert!(
        ["InternalServerError", "ServiceUnavailable"].contains(&x.code.as_str()),
        "{x:?}"
    );
    assert!(r.applied_indices.is_empty());
    assert_eq!(h.emulator().stats().calls_of(CALL), 1, "not split");
    assert_eq!(h.metrics.refusal_split_calls(), 0);
    assert!(programmed(&h).is_empty());
    h.shutdown().await;
}

#[tokio::test]
async fn a_refusal_that_depends_on_the_server_s_view_is_not_split() {
    let (mut h, mut conn) = start(EmulatorConfig::default(), Limits::default()).await;
    let mut locs = eight();
    locs[3] = location("10.0.0.3", false, &[("10.1.3.1", &["not-registered"])]);
    let r = conn.run(locations(2, locs)).await;
    assert_eq!(code(&r), "ServiceNotRegistered");
    assert!(r.applied_indices.is_empty(), "{r:?}");
    assert_eq!(h.emulator().stats().calls_of(CALL), 1, "not split");
    assert!(programmed(&h).is_empty());
    h.shutdown().await;
}

#[tokio::test]
async fn a_retryable_failure_while_splitting_stops_the_split_and_the_unit() {
    use std::sync::Arc;
    use tokio::sync::Semaphore;

    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
    let release = Arc::new(Semaphore::new(0));
    let gate = Arc::clone(&release);
    let mut h = Harness::start_with(EmulatorConfig::default(), Limits::default(), move |inner| {
        Arc::new(GatedNrp {
            inner,
            entered: entered_tx,
            release: gate,
        })
    })
    .await;
    let mut conn = h.conn().await;
    create_services(&mut conn).await;
    let refusal = refusing(&[("10.1.5.1", "InvalidAddress", false)]);
    h.emulator().set_config(refusal.clone()).unwrap();
    h.emulator().reset_stats();
    conn.send(locations(2, eight())).await;
    // The call is refused.
    entered.recv().await.expect("the call");
    release.add_permits(1);
    // The first half is under way when NRP starts failing every call with a 500 or a 503.
    entered.recv().await.expect("the first half");
    h.emulator()
        .set_config(EmulatorConfig {
            fault_rate_5xx: 1.0,
            seed: Some(7),
            ..refusal
        })
        .unwrap();
    release.add_permits(1);
    let r = conn.report().await;
    // The retryable error decides (retryable parts are never parked with a terminal one).
    let x = retryable(&r);
    assert!(
        ["InternalServerError", "ServiceUnavailable"].contains(&x.code.as_str()),
        "{x:?}"
    );
    assert!(r.applied_indices.is_empty(), "{r:?}");
    assert_eq!(
        h.emulator().stats().calls_of(CALL),
        2,
        "the second half is not sent"
    );
    assert_eq!(h.metrics.refusal_split_calls(), 1);
    assert!(programmed(&h).is_empty());
    h.shutdown().await;
}
