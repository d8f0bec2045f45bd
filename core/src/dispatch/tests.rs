//! Dispatcher rules without a runtime: the clock is passed in.

use std::time::{Duration, Instant};

use super::*;
use crate::difftracker::{Endpoint, Operation};

pub(super) fn observed(d: &mut Dispatcher, t: &mut DiffTracker, now: Instant) {
    let u = d.next_unit(t, 1, 1, now).expect("observe first");
    assert_eq!(u.work, UnitWork::Observe);
    d.on_report(
        t,
        1,
        Report {
            refused: Vec::new(),
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

pub(super) fn env() -> DispatchEnv {
    DispatchEnv::new(Instant::now(), 1_700_000_000_000, 42)
}

pub(super) fn applied(work_id: u64) -> Report {
    Report {
        refused: Vec::new(),
        work_id,
        applied: vec![],
        progress: vec![],
        outcome: Outcome::Applied,
    }
}

pub(super) fn tracker_with(locations: u8, per_location: u8) -> DiffTracker {
    let mut t = DiffTracker::new();
    t.update_service(Operation::Add, "svc").unwrap();
    let eps: Vec<(String, String)> = (1..=locations)
        .flat_map(|l| {
            (1..=per_location).map(move |p| (format!("10.1.{l}.{p}"), format!("10.0.0.{l}")))
        })
        .collect();
    set_all(&mut t, &eps);
    t
}

/// Sets `svc`'s endpoints to the (address, location) pairs.
pub(super) fn set_all(t: &mut DiffTracker, pairs: &[(String, String)]) {
    let eps: Vec<Endpoint> = pairs
        .iter()
        .map(|(a, l)| Endpoint {
            address: a,
            location: l,
        })
        .collect();
    t.set_endpoints("svc", &eps).unwrap();
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
            refused: Vec::new(),
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
            refused: Vec::new(),
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
        refused: Vec::new(),
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
                refused: Vec::new(),
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

fn retryable(work_id: u64) -> Report {
    Report {
        refused: Vec::new(),
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
            refused: Vec::new(),
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
                refused: Vec::new(),
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
            changes: Vec::new(),
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
            refused: Vec::new(),
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
