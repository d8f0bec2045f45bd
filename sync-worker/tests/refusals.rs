//! A call NRP refuses for one address is split (docs/errors.md, "A refused call is split"): the
//! worker, against the real emulator refusing one address (`EmulatorConfig::refused_addresses`),
//! finds the location change that causes the refusal and sends the others in the same unit, then
//! finds the address in that location change and sends the rest of it: only the address is left
//! out (`Report.refused_addresses`).

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

/// Whether NRP holds `address` at `location`.
fn holds(h: &Harness, location: &str, address: &str) -> bool {
    h.address_map()
        .contains_key(&(location.to_string(), address.to_string()))
}

/// The report's refused addresses as `(index, address, code)`.
fn refused(r: &v1::Report) -> Vec<(u32, &str, &str)> {
    r.refused_addresses
        .iter()
        .map(|a| (a.index, a.address.as_str(), a.code.as_str()))
        .collect()
}

/// Asserts that unit `locs` went through but for the addresses `expected` lists (location change,
/// address, code): the report is `applied` and lists exactly those, and NRP holds every other
/// address of `locs` and nothing else.
fn assert_all_but(
    h: &Harness,
    r: &v1::Report,
    locs: &[LocationChange],
    expected: &[(u32, &str, &str)],
) {
    assert_applied(r);
    assert_eq!(refused(r), expected, "{r:?}");
    let left_out = |i: usize, a: &str| expected.iter().any(|&(j, x, _)| j as usize == i && x == a);
    let wanted: BTreeSet<(String, String)> = locs
        .iter()
        .enumerate()
        .flat_map(|(i, l)| {
            l.addresses
                .iter()
                .filter(move |a| !left_out(i, &a.address))
                .map(|a| (l.location.clone(), a.address.clone()))
        })
        .collect();
    let held: BTreeSet<(String, String)> = h.address_map().into_keys().collect();
    assert_eq!(held, wanted);
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
async fn a_refusal_naming_its_address_leaves_out_only_that_address() {
    let (mut h, mut conn) = start(
        refusing(&[("10.1.5.1", "AddressRefusedByPolicy", true)]),
        Limits::default(),
    )
    .await;
    let r = conn.run(locations(2, eight())).await;
    // The location change went through without its refused address: the server holds that one.
    let only = (5, "10.1.5.1", "AddressRefusedByPolicy");
    assert_all_but(&h, &r, &eight(), &[only]);
    assert!(
        r.refused_addresses[0].message.contains("'10.1.5.1'"),
        "{r:?}"
    );
    let calls = h.emulator().stats().calls_of(CALL);
    assert_eq!(
        calls, 2,
        "the call, then the call without the named address (the fast path)"
    );
    assert!(calls <= 1 + (1 + refusal_split_bound(8) + refusal_split_bound(2)) as u64);
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
async fn a_refusal_naming_no_address_is_halved_down_to_its_address_within_the_bounds() {
    let (mut h, mut conn) = start(
        refusing(&[("10.1.5.1", "AddressRefusedByPolicy", false)]),
        Limits::default(),
    )
    .await;
    let r = conn.run(locations(2, eight())).await;
    assert_all_but(
        &h,
        &r,
        &eight(),
        &[(5, "10.1.5.1", "AddressRefusedByPolicy")],
    );
    let calls = h.emulator().stats().calls_of(CALL);
    // Halves of 4, 2 and 1 location changes: two calls a level, three levels; then the two
    // addresses of the culprit, one call each.
    assert_eq!(calls, 1 + 6 + 2);
    assert!(calls <= 1 + (refusal_split_bound(8) + refusal_split_bound(2)) as u64);
    assert_eq!(h.metrics.refusal_split_calls(), 8);
    h.shutdown().await;
}

#[tokio::test]
async fn a_full_update_goes_through_without_its_refused_address() {
    let (mut h, mut conn) = start(
        refusing(&[("10.1.4.1", "AddressRefusedByPolicy", false)]),
        Limits::default(),
    )
    .await;
    // NRP holds an address at 10.0.0.4 that the full update does not carry: it is replaced.
    let old = location("10.0.0.4", false, &[("10.1.4.9", &["svc-a"])]);
    assert_applied(&conn.run(locations(2, vec![old])).await);
    assert!(holds(&h, "10.0.0.4", "10.1.4.9"));
    h.emulator().reset_stats();
    let mut locs = eight();
    let six: Vec<String> = (1..=6).map(|k| format!("10.1.4.{k}")).collect();
    let carried: Vec<(&str, &[&str])> = six.iter().map(|a| (a.as_str(), &["svc-a"][..])).collect();
    locs[4] = location("10.0.0.4", true, &carried);
    let r = conn.run(locations(3, locs.clone())).await;
    // A full replacement at 10.0.0.4 with every address but the refused one (10.1.4.9 is gone).
    assert_all_but(&h, &r, &locs, &[(4, "10.1.4.1", "AddressRefusedByPolicy")]);
    let calls = h.emulator().stats().calls_of(CALL);
    // Location changes: [0..4) through, [4..8) refused, [4,5] refused, [6,7] through, [4]
    // refused, [5] through. Addresses of 10.0.0.4: [1,2,3] refused, [4,5,6] through (a full
    // update), [1,2] refused, [3] through, [1] refused, [2] through (partial updates).
    assert_eq!(calls, 1 + 6 + 6);
    assert!(calls <= 1 + (refusal_split_bound(8) + refusal_split_bound(6)) as u64);
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
    // Both location changes went through without their refused address (one a partial update,
    // one a full update).
    let both = [
        (1, "10.1.1.2", "InvalidAddress"),
        (6, "10.1.6.1", "InvalidAddress"),
    ];
    assert_all_but(&h, &r, &eight(), &both);
    // Without 10.1.1.2 (the fast path), refused naming 10.1.6.1; without it and location 6;
    // location 6 without its address.
    assert_eq!(h.emulator().stats().calls_of(CALL), 1 + 1 + 1 + 1);
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
    // [0] through, [1] refused: the 8 extra calls of the bound. [6,7] is not decided and fails
    // whole; location 1 is split by address (two calls) and goes through without 10.1.1.1.
    assert_eq!(r.applied_indices, vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(
        refused(&r),
        vec![(1, "10.1.1.1", "InvalidAddress")],
        "{r:?}"
    );
    assert_eq!(programmed(&h), locations_but(&[6, 7]));
    assert!(!holds(&h, "10.0.0.1", "10.1.1.1") && holds(&h, "10.0.0.1", "10.1.1.2"));
    assert_eq!(
        h.emulator().stats().calls_of(CALL),
        1 + (refusal_split_bound(8) + 2) as u64
    );
    assert_eq!(h.metrics.refusal_split_calls(), 8 + 2);
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
    assert_all_but(
        &h,
        &r,
        &eight(),
        &[(2, "10.1.2.2", "AddressRefusedByPolicy")],
    );
    // The first call, the first call without the address; the second call.
    assert_eq!(h.emulator().stats().calls_of(CALL), 1 + 1 + 1);
    h.shutdown().await;
}

#[tokio::test]
async fn limits_split_a_unit_and_a_failed_call_reports_what_went_through() {
    let limits = Limits {
        max_locations_per_call: 1,
        ..Limits::default()
    };
    let mut h = Harness::start(EmulatorConfig::default(), limits).await;
    let mut conn = h.conn().await;
    create_services(&mut conn).await;
    h.emulator().reset_stats();
    // An address NRP refuses fails only its own call, and in it only itself: the others go. A
    // partial update of that one address goes through without it (no extra call); a full update
    // of it alone would fail whole (NRP keeps what it had there).
    let mut locs = three_locations();
    locs[1] = location("10.0.0.2", false, &[("not-an-ip", &["svc-a"])]);
    let r = conn.run(locations(2, locs.clone())).await;
    assert_applied(&r);
    assert_eq!(
        refused(&r),
        vec![(1, "not-an-ip", "InvalidAddress")],
        "{r:?}"
    );
    locs[1].set_action(v1::AddressUpdateAction::FullUpdate);
    let r = conn.run(locations(20, locs)).await;
    assert_eq!(terminal(&r).code, "InvalidAddress");
    assert_eq!(r.applied_indices, vec![0, 2]);
    assert_eq!(r.refused_addresses.len(), 1, "{r:?}");
    assert_eq!(
        h.emulator().stats().calls_of(CALL),
        3 + 3,
        "one call a location change, twice"
    );
    assert_eq!(
        programmed(&h),
        BTreeSet::from(["10.0.0.1".to_string(), "10.0.0.3".to_string()])
    );
    // A failure that shows the server's view wrong stops the unit: the rest would be cut from the
    // same wrong view, and is sent again after the server has read NRP back.
    h.emulator().reset_stats();
    let mut locs = three_locations();
    locs[1] = location("10.0.0.2", false, &[("10.1.0.3", &["not-registered"])]);
    let r = conn.run(locations(3, locs)).await;
    assert_eq!(repair(&r).code, "ServiceNotRegistered");
    assert_eq!(r.applied_indices, vec![0]);
    assert_eq!(h.emulator().stats().calls_of(CALL), 2);
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
    assert!(r.applied_indices.is_empty() && r.refused_addresses.is_empty());
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
    assert!(
        r.applied_indices.is_empty() && r.refused_addresses.is_empty(),
        "{r:?}"
    );
    assert_eq!(
        h.emulator().stats().calls_of(CALL),
        2,
        "the second half is not sent"
    );
    assert_eq!(h.metrics.refusal_split_calls(), 1);
    assert!(programmed(&h).is_empty());
    h.shutdown().await;
}
