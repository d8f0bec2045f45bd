//! Dispatcher rules without a runtime: the clock is passed in.

use std::time::{Duration, Instant};

use super::*;
use crate::difftracker::{Endpoint, Operation};

fn observed(d: &mut Dispatcher, t: &mut DiffTracker, now: Instant) {
    let u = d.next_unit(t, 1, 1, now).expect("observe first");
    assert_eq!(u.work, UnitWork::Observe);
    d.on_report(
        t,
        1,
        Report {
            work_id: 1,
            applied: vec![],
            progress: vec![],
            outcome: Outcome::Observed {
                snapshot: ActualSnapshot::default(),
                last: true,
            },
        },
        now,
    );
    assert!(d.nrp_observed());
}

fn env() -> DispatchEnv {
    DispatchEnv::new(Instant::now(), 1_700_000_000_000, 42)
}

fn applied(work_id: u64) -> Report {
    Report {
        work_id,
        applied: vec![],
        progress: vec![],
        outcome: Outcome::Applied,
    }
}

fn tracker_with(locations: u8, per_location: u8) -> DiffTracker {
    let mut t = DiffTracker::new();
    t.update_service(Operation::Add, "svc").unwrap();
    let eps: Vec<(String, String)> = (1..=locations)
        .flat_map(|l| {
            (1..=per_location).map(move |p| (format!("10.1.{l}.{p}"), format!("10.0.0.{l}")))
        })
        .collect();
    let eps: Vec<Endpoint> = eps
        .iter()
        .map(|(a, l)| Endpoint {
            address: a,
            location: l,
        })
        .collect();
    t.set_endpoints("svc", &eps).unwrap();
    t
}

#[test]
fn locations_are_packed_up_to_the_address_limit() {
    let now = Instant::now();
    let mut t = tracker_with(5, 3);
    let mut d = Dispatcher::new(
        DispatchConfig {
            max_addresses_per_unit: 7,
            // No bound on calls in flight: no share per slot, only the unit bounds.
            max_mutating_units_in_flight: 0,
            ..DispatchConfig::unbatched()
        },
        env(),
    );
    observed(&mut d, &mut t, now);
    let s = d.next_unit(&mut t, 1, 2, now).unwrap();
    assert!(matches!(s.work, UnitWork::Services(_)));
    d.on_report(&mut t, 1, applied(2), now);
    let mut sizes = Vec::new();
    for id in 3..10 {
        let Some(u) = d.next_unit(&mut t, 1, id, now) else {
            break;
        };
        let UnitWork::Locations(diffs) = &u.work else {
            panic!("location unit")
        };
        sizes.push(diffs.iter().map(|d| d.addresses.len()).sum::<usize>());
    }
    // 15 addresses, 3 per location, at most 7 per unit: 2 locations (6) per unit.
    assert_eq!(sizes, vec![6, 6, 3]);
}

#[test]
fn a_backlog_is_spread_over_the_free_slots_in_one_wave() {
    let now = Instant::now();
    let mut t = tracker_with(100, 1);
    let mut d = Dispatcher::new(
        DispatchConfig {
            max_mutating_units_in_flight: 4,
            ..DispatchConfig::unbatched()
        },
        env(),
    );
    observed(&mut d, &mut t, now);
    let s = d.next_unit(&mut t, 1, 2, now).unwrap();
    assert!(matches!(s.work, UnitWork::Services(_)));
    d.on_report(&mut t, 1, applied(2), now);
    let mut sizes = Vec::new();
    for id in 3..10 {
        let Some(u) = d.next_unit(&mut t, 1, id, now) else {
            break;
        };
        sizes.push(u.work.len());
    }
    // 100 locations, 4 free slots, at least 32 locations a split: 3 units of 34, 33, 33 — one
    // wave, no unit thinner than a split is worth.
    assert_eq!(sizes, vec![34, 33, 33]);
    assert!(d.next_unit(&mut t, 1, 10, now).is_none(), "nothing is left");
}

#[test]
fn a_small_backlog_stays_whole_whatever_the_free_slots() {
    let now = Instant::now();
    let mut t = tracker_with(40, 1);
    let mut d = Dispatcher::new(
        DispatchConfig {
            max_mutating_units_in_flight: 4,
            ..DispatchConfig::unbatched()
        },
        env(),
    );
    observed(&mut d, &mut t, now);
    let s = d.next_unit(&mut t, 1, 2, now).unwrap();
    d.on_report(&mut t, 1, applied(s.work_id), now);
    // 40 locations: splitting them would cost writes for little time; one unit.
    let u = d.next_unit(&mut t, 1, 3, now).expect("a location unit");
    assert_eq!(u.work.len(), 40);
}

#[test]
fn one_unit_per_location_and_a_changed_location_is_recut_after_its_result() {
    let now = Instant::now();
    let mut t = tracker_with(1, 1);
    let mut d = Dispatcher::new(DispatchConfig::unbatched(), env());
    observed(&mut d, &mut t, now);
    let s = d.next_unit(&mut t, 1, 2, now).unwrap();
    d.on_report(&mut t, 1, applied(s.work_id), now);
    let u = d.next_unit(&mut t, 1, 3, now).unwrap();
    assert!(matches!(u.work, UnitWork::Locations(_)));
    t.set_endpoints(
        "svc",
        &[
            Endpoint {
                address: "10.1.1.1",
                location: "10.0.0.1",
            },
            Endpoint {
                address: "10.1.1.2",
                location: "10.0.0.1",
            },
        ],
    )
    .unwrap();
    assert!(
        d.next_unit(&mut t, 2, 4, now).is_none(),
        "the location is in flight"
    );
    d.on_report(&mut t, 1, applied(3), now);
    let again = d
        .next_unit(&mut t, 2, 5, now)
        .expect("re-diffed after the result");
    let UnitWork::Locations(diffs) = again.work else {
        panic!()
    };
    assert_eq!(diffs[0].addresses.len(), 1, "only the new address is sent");
}

#[test]
fn a_partial_update_in_flight_holds_its_addresses_only() {
    let now = Instant::now();
    let mut t = tracker_with(1, 1);
    let mut d = Dispatcher::new(DispatchConfig::unbatched(), env());
    observed(&mut d, &mut t, now);
    let s = d.next_unit(&mut t, 1, 2, now).unwrap();
    d.on_report(&mut t, 1, applied(s.work_id), now);
    // The location's first programming (a full replacement) goes and lands.
    let first = d.next_unit(&mut t, 1, 3, now).unwrap();
    d.on_report(&mut t, 1, applied(first.work_id), now);
    let eps = |addresses: &[&'static str]| -> Vec<Endpoint<'static>> {
        addresses
            .iter()
            .map(|a| Endpoint {
                address: a,
                location: "10.0.0.1",
            })
            .collect()
    };
    // .2 joins: a partial update of the location.
    t.set_endpoints("svc", &eps(&["10.1.1.1", "10.1.1.2"]))
        .unwrap();
    let second = d.next_unit(&mut t, 1, 4, now).unwrap();
    let carried = |u: &Unit| -> Vec<String> {
        let UnitWork::Locations(diffs) = &u.work else {
            panic!("{u:?}")
        };
        diffs[0]
            .addresses
            .iter()
            .map(|a| a.address.to_string())
            .collect()
    };
    assert_eq!(carried(&second), ["10.1.1.2"]);
    // While it is in flight, .3 joins and .2 leaves again: .3 goes at once beside it, .2's
    // removal waits for the unit that carries .2.
    t.set_endpoints("svc", &eps(&["10.1.1.1", "10.1.1.3"]))
        .unwrap();
    let third = d.next_unit(&mut t, 2, 5, now).expect(".3 goes beside");
    assert_eq!(carried(&third), ["10.1.1.3"]);
    assert!(d.next_unit(&mut t, 2, 6, now).is_none(), ".2 is in flight");
    d.on_report(&mut t, 1, applied(second.work_id), now);
    let fourth = d.next_unit(&mut t, 1, 7, now).expect(".2's removal");
    assert_eq!(carried(&fourth), ["10.1.1.2"]);
    d.on_report(&mut t, 2, applied(third.work_id), now);
    d.on_report(&mut t, 1, applied(fourth.work_id), now);
    assert!(d.next_unit(&mut t, 1, 8, now).is_none());
    let diff = t.pending_diff();
    assert!(diff.locations.is_empty(), "{diff:?}");
}

#[test]
fn a_service_is_not_deleted_while_a_location_unit_naming_it_is_in_flight() {
    let now = Instant::now();
    let mut t = tracker_with(1, 1);
    let mut d = Dispatcher::new(DispatchConfig::unbatched(), env());
    observed(&mut d, &mut t, now);
    let s = d.next_unit(&mut t, 1, 2, now).unwrap();
    d.on_report(&mut t, 1, applied(s.work_id), now);
    let u = d.next_unit(&mut t, 1, 3, now).unwrap();
    // The service goes while its first addresses are on their way to NRP.
    t.update_service(Operation::Remove, "svc").unwrap();
    assert!(
        d.next_unit(&mut t, 2, 4, now).is_none(),
        "no delete under an in-flight unit"
    );
    d.on_report(&mut t, 1, applied(u.work_id), now);
    let drain = d.next_unit(&mut t, 1, 5, now).unwrap();
    assert!(matches!(drain.work, UnitWork::Locations(_)), "drain first");
    d.on_report(&mut t, 1, applied(5), now);
    let delete = d.next_unit(&mut t, 1, 6, now).unwrap();
    assert!(
        matches!(&delete.work, UnitWork::Services(c) if c[0].action == crate::difftracker::ServiceAction::Delete)
    );
}

#[test]
fn retries_back_off_and_expired_leases_come_back_without_backoff() {
    let now = Instant::now();
    let mut t = tracker_with(1, 1);
    let mut d = Dispatcher::new(
        DispatchConfig {
            retry_base: Duration::from_secs(1),
            lease: Duration::from_secs(5),
            ..DispatchConfig::unbatched()
        },
        env(),
    );
    observed(&mut d, &mut t, now);
    let s = d.next_unit(&mut t, 1, 2, now).unwrap();
    d.on_report(
        &mut t,
        1,
        Report {
            work_id: s.work_id,
            applied: vec![],
            progress: vec![],
            outcome: Outcome::Retryable {
                retry_after: Duration::from_secs(3),
                code: "TooManyRequests".into(),
                message: String::new(),
            },
        },
        now,
    );
    assert!(
        d.next_unit(&mut t, 1, 3, now + Duration::from_secs(2))
            .is_none(),
        "Retry-After honoured"
    );
    let s = d
        .next_unit(&mut t, 1, 4, now + Duration::from_secs(3))
        .expect("due again");
    assert_eq!(d.expire(now + Duration::from_secs(9)).len(), 1);
    let again = d
        .next_unit(&mut t, 2, 5, now + Duration::from_secs(9))
        .expect("no backoff after expiry");
    assert_eq!(again.work, s.work);
    d.on_report(&mut t, 1, applied(4), now + Duration::from_secs(9));
    assert_eq!(d.stats().late_reports, 1);
}

#[test]
fn no_location_work_is_cut_before_nrp_has_been_read_back() {
    let now = Instant::now();
    let mut t = tracker_with(2, 1);
    let mut d = Dispatcher::new(DispatchConfig::unbatched(), env());
    let observe = d.next_unit(&mut t, 1, 1, now).unwrap();
    assert_eq!(observe.work, UnitWork::Observe);
    let s = d
        .next_unit(&mut t, 2, 2, now)
        .expect("service creation only adds: allowed");
    assert!(matches!(s.work, UnitWork::Services(_)));
    d.on_report(&mut t, 2, applied(2), now);
    assert!(
        d.next_unit(&mut t, 2, 3, now).is_none(),
        "locations wait for the read-back"
    );
    d.on_report(
        &mut t,
        1,
        Report {
            work_id: 1,
            applied: vec![],
            progress: vec![],
            outcome: Outcome::Observed {
                // NRP has the service the unit above created.
                snapshot: ActualSnapshot {
                    load_balancers: vec!["svc".into()],
                    ..ActualSnapshot::default()
                },
                last: true,
            },
        },
        now,
    );
    assert!(matches!(
        d.next_unit(&mut t, 2, 4, now).unwrap().work,
        UnitWork::Locations(_)
    ));
}

#[test]
fn nrp_is_read_back_one_lease_after_units_were_taken_from_a_worker() {
    let now = Instant::now();
    let lease = Duration::from_secs(5);
    let mut t = tracker_with(1, 1);
    let mut d = Dispatcher::new(
        DispatchConfig {
            lease,
            ..DispatchConfig::unbatched()
        },
        env(),
    );
    observed(&mut d, &mut t, now);
    let s = d.next_unit(&mut t, 1, 2, now).unwrap();
    d.on_report(&mut t, 1, applied(s.work_id), now);
    let u = d.next_unit(&mut t, 1, 3, now).unwrap();
    assert!(matches!(u.work, UnitWork::Locations(_)));
    assert_eq!(d.release_worker(1, now), 1);
    // The released location goes out again at once; the read-back waits until the killed
    // worker's call can no longer be under way.
    let again = d.next_unit(&mut t, 2, 4, now).unwrap();
    assert_eq!(again.work, u.work);
    d.on_report(&mut t, 2, applied(4), now);
    assert!(d.next_unit(&mut t, 2, 5, now + lease / 2).is_none());
    assert_eq!(
        d.next_unit(&mut t, 2, 6, now + lease).unwrap().work,
        UnitWork::Observe
    );
}

#[test]
fn a_report_returns_what_it_recorded() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    for s in ["a", "b"] {
        t.update_service(Operation::Add, s).unwrap();
    }
    let mut d = Dispatcher::new(DispatchConfig::unbatched(), env());
    let u = d.next_unit(&mut t, 1, 1, now).unwrap();
    assert_eq!(u.work, UnitWork::Observe);
    let last = |last| Report {
        work_id: 1,
        applied: vec![],
        progress: vec![],
        outcome: Outcome::Observed {
            snapshot: ActualSnapshot::default(),
            last,
        },
    };
    let part = d.on_report(&mut t, 1, last(false), now).unwrap();
    assert_eq!(part, Folded::default());
    assert!(d.on_report(&mut t, 1, last(true), now).unwrap().observed);
    let u = d.next_unit(&mut t, 1, 2, now).unwrap();
    let UnitWork::Services(changes) = &u.work else {
        panic!("service unit")
    };
    assert_eq!(changes.len(), 2);
    // Late or foreign reports record nothing.
    assert_eq!(d.on_report(&mut t, 9, applied(2), now), None);
    let folded = d
        .on_report(
            &mut t,
            1,
            Report {
                work_id: 2,
                applied: vec![1],
                progress: vec![],
                outcome: Outcome::Retryable {
                    retry_after: Duration::ZERO,
                    code: "x".into(),
                    message: String::new(),
                },
            },
            now,
        )
        .unwrap();
    assert_eq!(folded.services, vec![changes[1].clone()]);
    assert!(!folded.observed);
}

#[test]
fn mutating_units_in_flight_are_capped_per_gateway_and_observes_are_not() {
    let now = Instant::now();
    let mut t = tracker_with(5, 3);
    let mut d = Dispatcher::new(
        DispatchConfig {
            max_locations_per_unit: 1,
            max_mutating_units_in_flight: 2,
            ..DispatchConfig::unbatched()
        },
        env(),
    );
    observed(&mut d, &mut t, now);
    let s = d.next_unit(&mut t, 1, 2, now).unwrap();
    assert!(matches!(s.work, UnitWork::Services(_)));
    d.on_report(&mut t, 1, applied(2), now);
    // Five dirty locations, one per unit, but only two units at once — whichever worker asks.
    let a = d.next_unit(&mut t, 1, 3, now).expect("first location unit");
    let b = d
        .next_unit(&mut t, 2, 4, now)
        .expect("second location unit");
    assert!(matches!(a.work, UnitWork::Locations(_)) && matches!(b.work, UnitWork::Locations(_)));
    assert_eq!(d.mutating_calls_in_flight(), 2);
    assert!(d.next_unit(&mut t, 3, 5, now).is_none(), "the cap holds");
    // A result frees one slot: exactly one more unit.
    d.on_report(&mut t, 1, applied(3), now);
    let c = d
        .next_unit(&mut t, 3, 7, now)
        .expect("a third location unit");
    assert!(d.next_unit(&mut t, 3, 8, now).is_none());
    // A worker that goes away frees its slots at once.
    d.release_worker(2, now);
    assert!(d.next_unit(&mut t, 3, 9, now).is_some());
    // An observe does not count against the cap, but it waits for the location units in flight
    // to end (and none is cut meanwhile).
    let later = now + d.config().lease;
    d.request_observe();
    assert!(d.next_unit(&mut t, 3, 10, later).is_none(), "draining");
    d.on_report(&mut t, 3, applied(c.work_id), later);
    d.on_report(&mut t, 3, applied(9), later);
    let o = d.next_unit(&mut t, 3, 11, later).expect("observe");
    assert!(matches!(o.work, UnitWork::Observe));
}

#[test]
fn a_service_unit_counts_one_call_per_change_against_the_cap() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    let mut d = Dispatcher::new(
        DispatchConfig {
            max_mutating_units_in_flight: 3,
            ..DispatchConfig::unbatched()
        },
        env(),
    );
    observed(&mut d, &mut t, now);
    for i in 0..5 {
        t.update_service(Operation::Add, &format!("svc-{i}"))
            .unwrap();
    }
    // Five creations pending, room for three side-by-side calls: one unit of three changes.
    let u = d.next_unit(&mut t, 1, 2, now).expect("service unit");
    let UnitWork::Services(changes) = &u.work else {
        panic!("service unit");
    };
    assert_eq!(changes.len(), 3);
    assert_eq!(d.mutating_calls_in_flight(), 3);
    assert!(d.next_unit(&mut t, 2, 3, now).is_none(), "no room left");
    d.on_report(&mut t, 1, applied(2), now);
    let u = d.next_unit(&mut t, 2, 4, now).expect("the rest");
    let UnitWork::Services(changes) = &u.work else {
        panic!("service unit");
    };
    assert_eq!(changes.len(), 2);
}

fn retryable(work_id: u64) -> Report {
    Report {
        work_id,
        applied: vec![],
        progress: vec![],
        outcome: Outcome::Retryable {
            retry_after: Duration::ZERO,
            code: "TooManyRequests".into(),
            message: String::new(),
        },
    }
}

#[test]
fn the_attempt_grows_with_each_re_dispatch_and_starts_again_after_the_change_is_recorded() {
    let now = Instant::now();
    let lease = Duration::from_secs(5);
    let mut t = tracker_with(1, 1);
    let mut d = Dispatcher::new(
        DispatchConfig {
            lease,
            retry_base: Duration::from_secs(1),
            retry_max: Duration::from_secs(1),
            ..DispatchConfig::unbatched()
        },
        env(),
    );
    observed(&mut d, &mut t, now);
    let s = d.next_unit(&mut t, 1, 2, now).unwrap();
    assert_eq!(s.attempt, 1, "a service creation handed out the first time");
    d.on_report(&mut t, 1, applied(s.work_id), now);

    let first = d.next_unit(&mut t, 1, 3, now).unwrap();
    assert!(matches!(first.work, UnitWork::Locations(_)));
    assert_eq!(first.attempt, 1);
    // A retryable failure: the re-cut (after its backoff, at most retry_max) is attempt 2.
    d.on_report(&mut t, 1, retryable(3), now);
    let later = now + Duration::from_secs(1);
    let second = d.next_unit(&mut t, 1, 4, later).expect("due again");
    assert_eq!(second.work, first.work);
    assert_eq!(second.attempt, 2);
    // The lease runs out: attempt 3.
    let expired = later + lease;
    assert_eq!(
        d.expire(expired),
        [Expired {
            work_id: 4,
            worker: 1
        }]
    );
    // Errors name the worker session and what the unit carried.
    let errors = d.last_errors();
    let retry = &errors[errors.len() - 2];
    assert_eq!((retry.work_id, retry.worker), (3, 1));
    assert!(retry.unit.starts_with("locations "), "{retry:?}");
    let lease_error = errors.last().expect("the expiry is recorded");
    assert_eq!(
        (
            lease_error.work_id,
            lease_error.worker,
            lease_error.code.as_str()
        ),
        (4, 1, "LeaseExpired")
    );
    assert_eq!(lease_error.unit, retry.unit);
    let third = d.next_unit(&mut t, 2, 5, expired).expect("taken back");
    assert_eq!(third.work, first.work);
    assert_eq!(third.attempt, 3);
    // The worker goes away: attempt 4.
    assert_eq!(d.release_worker(2, expired), 1);
    let fourth = d.next_unit(&mut t, 3, 6, expired).expect("released");
    assert_eq!(fourth.work, first.work);
    assert_eq!(fourth.attempt, 4);
    // Recorded: the next change of that location starts at 1 again.
    d.on_report(&mut t, 3, applied(6), expired);
    t.set_endpoints(
        "svc",
        &[
            Endpoint {
                address: "10.1.1.1",
                location: "10.0.0.1",
            },
            Endpoint {
                address: "10.1.1.2",
                location: "10.0.0.1",
            },
        ],
    )
    .unwrap();
    let next = d.next_unit(&mut t, 3, 7, expired).expect("the new change");
    assert!(matches!(&next.work, UnitWork::Locations(l) if l[0].addresses.len() == 1));
    assert_eq!(next.attempt, 1);
}

#[test]
fn an_observe_that_is_handed_out_again_counts_its_attempts_until_one_completes() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    let mut d = Dispatcher::new(DispatchConfig::unbatched(), env());
    let first = d.next_unit(&mut t, 1, 1, now).unwrap();
    assert_eq!((first.work.clone(), first.attempt), (UnitWork::Observe, 1));
    d.release_worker(1, now);
    let second = d.next_unit(&mut t, 2, 2, now).unwrap();
    assert_eq!((second.work, second.attempt), (UnitWork::Observe, 2));
    d.on_report(
        &mut t,
        2,
        Report {
            work_id: 2,
            applied: vec![],
            progress: vec![],
            outcome: Outcome::Observed {
                snapshot: ActualSnapshot::default(),
                last: true,
            },
        },
        now,
    );
    d.request_observe();
    let next = d.next_unit(&mut t, 2, 3, now).unwrap();
    assert_eq!((next.work, next.attempt), (UnitWork::Observe, 1));
}

/// The lookups the Admin API derives a service's condition from: the last failure of a location
/// is kept while its change is retried and dropped once it goes through; a terminal error moves it
/// to the parked locations.
#[test]
fn failing_and_parked_lookups_follow_the_reports() {
    let mut now = Instant::now();
    let mut t = tracker_with(1, 1);
    let mut d = Dispatcher::new(DispatchConfig::unbatched(), env());
    observed(&mut d, &mut t, now);
    let s = d.next_unit(&mut t, 1, 2, now).unwrap();
    assert!(matches!(s.work, UnitWork::Services(_)));
    assert!(d.service_pending("svc"));
    d.on_report(&mut t, 1, applied(2), now);
    assert!(!d.service_pending("svc"));
    let location: IpAddr = "10.0.0.1".parse().unwrap();
    let fail = |d: &mut Dispatcher, t: &mut DiffTracker, id: u64, now: Instant, outcome| {
        let u = d.next_unit(t, 1, id, now).expect("the location is cut");
        assert!(matches!(u.work, UnitWork::Locations(_)));
        d.on_report(
            t,
            1,
            Report {
                work_id: id,
                applied: vec![],
                progress: vec![],
                outcome,
            },
            now,
        );
    };
    fail(
        &mut d,
        &mut t,
        3,
        now,
        Outcome::Retryable {
            retry_after: Duration::from_millis(1),
            code: "TooManyRequests".into(),
            message: "slow down".into(),
        },
    );
    let failing: Vec<_> = d.failing_locations().collect();
    assert_eq!(failing.len(), 1);
    assert_eq!(
        (failing[0].0, failing[0].1.code.as_str()),
        (location, "TooManyRequests")
    );
    assert!(d.location_pending(location));
    assert_eq!(d.failing_service("svc"), None);

    now += Duration::from_secs(60);
    fail(
        &mut d,
        &mut t,
        4,
        now,
        Outcome::Terminal {
            code: "InvalidAddress".into(),
            message: "not an IP".into(),
        },
    );
    assert_eq!(d.failing_locations().count(), 0);
    let parked: Vec<_> = d.parked_locations().collect();
    assert_eq!(parked.len(), 1);
    assert_eq!(
        (parked[0].0, parked[0].1.code.as_str()),
        (location, "InvalidAddress")
    );
    assert!(parked[0].1.terminal);
    assert_eq!(d.parked_service("svc"), None);

    // The desired state changes: unparked, cut again, and this time it goes through.
    t.set_endpoints(
        "svc",
        &[Endpoint {
            address: "10.1.1.2",
            location: "10.0.0.1",
        }],
    )
    .unwrap();
    now += Duration::from_secs(60);
    let u = d.next_unit(&mut t, 1, 5, now).expect("unparked");
    assert!(matches!(u.work, UnitWork::Locations(_)));
    assert_eq!(d.parked_locations().count(), 0);
    d.on_report(&mut t, 1, applied(5), now);
    assert_eq!(d.failing_locations().count(), 0);
    assert!(!d.location_pending(location));
}

/// Remembers what [`DispatchObserver::programmed`] is told.
#[derive(Debug, Default)]
struct Programmed(std::sync::Mutex<Vec<(&'static str, Duration)>>);

impl DispatchObserver for Programmed {
    fn unit_outcome(&self, _: &'static str, _: &'static str, _: &str) {}
    fn lease_expired(&self, _: u64) {}
    fn late_report(&self) {}
    fn programmed(&self, kind: &'static str, latency: Duration) {
        self.0.lock().unwrap().push((kind, latency));
    }
}

#[test]
fn the_observer_is_told_how_long_an_accepted_change_was_pending() {
    let t0 = Instant::now();
    let mut t = tracker_with(1, 1);
    let observer = std::sync::Arc::new(Programmed::default());
    let mut d = Dispatcher::new(
        DispatchConfig::unbatched(),
        env().with_observer(observer.clone()),
    );
    observed(&mut d, &mut t, t0);
    let s = d.next_unit(&mut t, 1, 2, t0).unwrap();
    assert!(matches!(s.work, UnitWork::Services(_)));
    d.on_report(
        &mut t,
        1,
        applied(s.work_id),
        t0 + Duration::from_millis(300),
    );
    let u = d
        .next_unit(&mut t, 1, 3, t0 + Duration::from_millis(300))
        .unwrap();
    assert!(matches!(u.work, UnitWork::Locations(_)));
    // A failed report programs nothing.
    d.on_report(
        &mut t,
        1,
        Report {
            work_id: u.work_id,
            applied: vec![],
            progress: vec![],
            outcome: Outcome::Retryable {
                code: "TooManyRequests".into(),
                message: String::new(),
                retry_after: Duration::ZERO,
            },
        },
        t0 + Duration::from_millis(400),
    );
    assert_eq!(
        *observer.0.lock().unwrap(),
        vec![("services", Duration::from_millis(300))]
    );
    // Its retry goes through: the latency runs from when the change first became pending.
    let later = t0 + Duration::from_secs(60);
    let u = d.next_unit(&mut t, 1, 4, later).unwrap();
    assert!(matches!(u.work, UnitWork::Locations(_)));
    d.on_report(
        &mut t,
        1,
        applied(u.work_id),
        later + Duration::from_secs(1),
    );
    assert_eq!(
        *observer.0.lock().unwrap(),
        vec![
            ("services", Duration::from_millis(300)),
            ("locations", Duration::from_secs(61)),
        ]
    );
}

#[test]
fn a_tight_write_budget_spaces_mutating_units_and_each_carries_what_accumulated() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut t = tracker_with(20, 1);
    let mut d = Dispatcher::new(
        DispatchConfig {
            max_locations_per_unit: 100,
            write_pace: 2.0,
            write_reserve: 20,
            ..DispatchConfig::unbatched()
        },
        env(),
    );
    observed(&mut d, &mut t, t0);
    // No budget reported: no pacing; the service's creation goes at once.
    assert_eq!(d.batching_window(), None);
    let create = d.next_unit(&mut t, 1, 2, t0).expect("the creation");
    assert!(matches!(create.work, UnitWork::Services(_)));
    d.on_report(&mut t, 1, applied(create.work_id), t0);
    // A worker saw 5 writes left: below the reserve, mutating units start 1 / 2 s = 500 ms apart.
    d.note_remaining_writes(5);
    assert_eq!(d.batching_window(), Some(ms(500)));
    assert!(
        d.next_unit(&mut t, 1, 3, t0 + ms(100)).is_none(),
        "held by the window"
    );
    assert_eq!(d.next_deadline(t0 + ms(100)), Some(t0 + ms(500)));
    let first = d
        .next_unit(&mut t, 1, 4, t0 + ms(500))
        .expect("the window passed");
    assert_eq!(
        first.work.len(),
        20,
        "every location that waited, in one unit"
    );
    d.on_report(&mut t, 1, applied(first.work_id), t0 + ms(500));
    // 30 more locations change while the next window runs: they go together when it ends.
    let eps: Vec<(String, String)> = (1..=50)
        .map(|l| (format!("10.1.{l}.1"), format!("10.0.0.{l}")))
        .collect();
    let eps: Vec<Endpoint> = eps
        .iter()
        .map(|(a, l)| Endpoint {
            address: a,
            location: l,
        })
        .collect();
    t.set_endpoints("svc", &eps).unwrap();
    assert!(d.next_unit(&mut t, 1, 5, t0 + ms(600)).is_none());
    assert_eq!(d.next_deadline(t0 + ms(600)), Some(t0 + ms(1000)));
    let next = d
        .next_unit(&mut t, 1, 6, t0 + ms(1000))
        .expect("the window passed");
    assert_eq!(next.work.len(), 30);
    // Spent out by the estimate: half the pace until a report says otherwise.
    d.note_remaining_writes(0);
    assert_eq!(d.batching_window(), Some(ms(1000)));
    // A report is read less the other units in flight: 21 left, 2 others in flight → 19, under
    // the reserve of 20.
    let (mut t2, mut d2) = (
        tracker_with(3, 1),
        Dispatcher::new(d.config().clone(), env()),
    );
    observed(&mut d2, &mut t2, t0);
    let c = d2.next_unit(&mut t2, 1, 2, t0).expect("the creation");
    d2.on_report(&mut t2, 1, applied(c.work_id), t0);
    for l in 1..=3u8 {
        t2.set_endpoints(
            "svc",
            &[Endpoint {
                address: "10.1.9.9",
                location: ["10.0.0.1", "10.0.0.2", "10.0.0.3"][usize::from(l - 1)],
            }],
        )
        .unwrap();
        assert!(d2.next_unit(&mut t2, 1, 10 + u64::from(l), t0).is_some());
    }
    d2.note_remaining_writes(21);
    assert_eq!(d2.batching_window(), Some(ms(500)));
    // A report with a full budget ends the pacing.
    d.note_remaining_writes(150);
    assert_eq!(d.batching_window(), None);
    // Pacing off: no window whatever the budget.
    let mut off = Dispatcher::new(
        DispatchConfig {
            write_pace: 0.0,
            ..DispatchConfig::unbatched()
        },
        env(),
    );
    off.note_remaining_writes(0);
    assert_eq!(off.batching_window(), None);
}

#[test]
fn gateways_sharing_a_subscription_share_its_write_budget_and_its_pace() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let config = DispatchConfig {
        write_pace: 2.0,
        write_reserve: 20,
        ..DispatchConfig::unbatched()
    };
    let budget = WriteBudget::new();
    let mut west = Dispatcher::new(config.clone(), env());
    let mut east = Dispatcher::new(config.clone(), env());
    let mut alone = Dispatcher::new(config, env());
    west.share_write_budget(budget.clone());
    east.share_write_budget(budget.clone());
    assert!(west.write_budget().same_as(east.write_budget()));
    assert!(!alone.write_budget().same_as(&budget));
    let (mut tw, mut te, mut ta) = (tracker_with(3, 1), tracker_with(3, 1), tracker_with(3, 1));
    for (d, t) in [
        (&mut west, &mut tw),
        (&mut east, &mut te),
        (&mut alone, &mut ta),
    ] {
        observed(d, t, t0);
        let create = d.next_unit(t, 1, 2, t0).expect("the creation");
        d.on_report(t, 1, applied(create.work_id), t0);
    }
    // A worker of the west gateway saw 5 writes left: the east gateway paces too, another
    // subscription's does not.
    west.note_remaining_writes(5);
    assert_eq!(east.batching_window(), Some(ms(500)));
    assert_eq!(alone.batching_window(), None);
    // The pace is the subscription's: once the west gateway cut a unit, the east one waits.
    let w = west.next_unit(&mut tw, 1, 3, t0 + ms(600));
    assert!(w.is_some(), "the first unit after the window");
    assert!(
        east.next_unit(&mut te, 1, 4, t0 + ms(700)).is_none(),
        "the subscription's next write is 500 ms after the west one"
    );
    assert_eq!(east.next_deadline(t0 + ms(700)), Some(t0 + ms(1100)));
    assert!(east.next_unit(&mut te, 1, 5, t0 + ms(1100)).is_some());
    assert!(alone.next_unit(&mut ta, 1, 6, t0 + ms(700)).is_some());
}

#[test]
fn once_a_budget_is_reported_a_burst_goes_at_once_and_the_long_run_keeps_the_pace() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let config = DispatchConfig {
        write_pace: 2.0,
        write_reserve: 20,
        write_burst: 3,
        max_mutating_units_in_flight: 0,
        ..DispatchConfig::unbatched()
    };
    let mut t = tracker_with(10, 1);
    let mut d = Dispatcher::new(config.clone(), env());
    observed(&mut d, &mut t, t0);
    let create = d.next_unit(&mut t, 1, 2, t0).expect("the creation");
    d.on_report(&mut t, 1, applied(create.work_id), t0);
    // Before any budget is reported (an NRP that does not throttle), nothing is paced.
    assert_eq!(d.batching_window(), None);
    // A budget far above the reserve: the bucket of 3 writes goes at once, then 1 write per
    // 500 ms, whatever the budget says.
    d.note_remaining_writes(900);
    let move_to = |t: &mut DiffTracker, l: u8| {
        let location = format!("10.0.0.{l}");
        t.set_endpoints(
            "svc",
            &[Endpoint {
                address: "10.1.9.9",
                location: &location,
            }],
        )
        .unwrap();
    };
    let mut cut = Vec::new();
    let mut now = t0;
    for step in 0..6u64 {
        move_to(&mut t, 20 + step as u8);
        now = t0 + ms(10 * step);
        if let Some(u) = d.next_unit(&mut t, 1, 10 + step, now) {
            cut.push(step);
            d.on_report(&mut t, 1, applied(u.work_id), now);
        }
    }
    assert_eq!(cut, vec![0, 1, 2], "the burst, then held");
    assert_eq!(d.batching_window(), Some(ms(500)));
    let due = d.next_deadline(now).expect("the bucket's next write");
    assert!(due > now && due <= t0 + ms(20) + ms(500), "{due:?}");
    assert!(
        d.next_unit(&mut t, 1, 30, due).is_some(),
        "one write refilled"
    );
    assert!(d.next_unit(&mut t, 1, 31, due).is_none());
    // Pacing off: no bucket either.
    let mut off = Dispatcher::new(
        DispatchConfig {
            write_pace: 0.0,
            ..config
        },
        env(),
    );
    off.note_remaining_writes(900);
    assert_eq!(off.batching_window(), None);
}
