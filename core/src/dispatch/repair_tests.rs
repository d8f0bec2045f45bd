//! How the dispatcher folds failures (docs/errors.md): a failure that shows the actual state wrong
//! is repaired by a read-back before the retry, never parked; a saga that stopped part-way is
//! recorded step by step; only invalid work is parked, and parks are counted by code.

use std::time::{Duration, Instant};

use super::*;
use crate::difftracker::{Endpoint, Operation, ServiceKind};

fn env() -> DispatchEnv {
    DispatchEnv::new(Instant::now(), 1_700_000_000_000, 7)
}

fn config() -> DispatchConfig {
    DispatchConfig {
        retry_base: Duration::from_millis(10),
        retry_max: Duration::from_millis(10),
        ..DispatchConfig::unbatched()
    }
}

fn report(work_id: u64, outcome: Outcome) -> Report {
    Report {
        refused: Vec::new(),
        work_id,
        applied: vec![],
        progress: vec![],
        outcome,
    }
}

fn observed(
    work_id: u64,
    services: &[&str],
    locations: Vec<crate::difftracker::actual::ObservedLocation>,
) -> Report {
    report(
        work_id,
        Outcome::Observed {
            snapshot: ActualSnapshot {
                load_balancers: services.iter().map(|s| s.to_string()).collect(),
                locations,
                ..ActualSnapshot::default()
            },
            last: true,
        },
    )
}

fn repair(work_id: u64, code: &str) -> Report {
    report(
        work_id,
        Outcome::Repair {
            retry_after: Duration::ZERO,
            code: code.into(),
            message: String::new(),
            refused: false,
        },
    )
}

fn applied(work_id: u64) -> Report {
    report(work_id, Outcome::Applied)
}

fn ep(address: &'static str) -> Endpoint<'static> {
    Endpoint {
        address,
        location: "10.0.0.1",
    }
}

/// `svc` desired with one address; NRP read back empty; the creation recorded. Returns the
/// dispatcher ready to cut the location unit, and the next work id.
fn started(t: &mut DiffTracker, now: Instant) -> (Dispatcher, u64) {
    t.update_service(Operation::Add, "svc").unwrap();
    t.set_endpoints("svc", &[ep("10.1.0.1")]).unwrap();
    let mut d = Dispatcher::new(config(), env());
    let o = d.next_unit(t, 1, 1, now).expect("observe first");
    assert_eq!(o.work, UnitWork::Observe);
    d.on_report(t, 1, observed(1, &[], vec![]), now);
    let s = d.next_unit(t, 1, 2, now).expect("creation");
    assert!(matches!(s.work, UnitWork::Services(_)));
    d.on_report(t, 1, applied(2), now);
    (d, 3)
}

#[test]
fn a_repair_holds_its_keys_until_nrp_is_read_back_and_never_parks_them() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    let (mut d, id) = started(&mut t, now);
    let u = d.next_unit(&mut t, 1, id, now).expect("location unit");
    assert!(matches!(u.work, UnitWork::Locations(_)));
    // NRP: the service is not registered (it went meanwhile, behind the server's back).
    d.on_report(&mut t, 1, repair(id, "ServiceNotRegistered"), now);
    assert_eq!(d.parked_units(), 0);
    assert_eq!(d.awaiting_read_back(), 1);
    assert_eq!(d.stats().repairs.get("ServiceNotRegistered"), Some(&1));
    // Long after its backoff, the location still waits: the next unit is the read-back.
    let later = now + Duration::from_secs(1);
    let o = d.next_unit(&mut t, 1, id + 1, later).expect("read-back");
    assert_eq!(o.work, UnitWork::Observe);
    assert!(
        d.next_unit(&mut t, 2, id + 2, later).is_none(),
        "nothing mutates during it"
    );
    d.on_report(&mut t, 1, observed(id + 1, &[], vec![]), later);
    assert_eq!(d.awaiting_read_back(), 0);
    // NRP lacks the service: it is created again, and only then the location goes.
    let s = d
        .next_unit(&mut t, 1, id + 3, later)
        .expect("creation again");
    let UnitWork::Services(changes) = &s.work else {
        panic!("{s:?}")
    };
    assert_eq!(changes[0].action, ServiceAction::Create);
    assert!(
        d.next_unit(&mut t, 2, id + 4, later).is_none(),
        "readiness filter"
    );
    d.on_report(&mut t, 1, applied(id + 3), later);
    let again = d
        .next_unit(&mut t, 1, id + 5, later)
        .expect("the location again");
    assert!(matches!(again.work, UnitWork::Locations(_)));
}

#[test]
fn a_deletion_refused_for_overlay_mappings_drains_after_the_read_back() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    let (mut d, id) = started(&mut t, now);
    // The server never learnt that the address reached NRP (say its call timed out and the
    // report said so); the service goes.
    t.update_service(Operation::Remove, "svc").unwrap();
    let del = d.next_unit(&mut t, 1, id, now).expect("deletion");
    assert!(matches!(&del.work, UnitWork::Services(c) if c[0].action == ServiceAction::Delete));
    d.on_report(
        &mut t,
        1,
        repair(id, "ServiceWithOverlayMappingsCannotBeDeleted"),
        now,
    );
    let o = d.next_unit(&mut t, 1, id + 1, now).expect("read-back");
    assert_eq!(o.work, UnitWork::Observe);
    let address = ("10.1.0.1".parse().unwrap(), vec!["svc".to_string()]);
    d.on_report(
        &mut t,
        1,
        observed(
            id + 1,
            &["svc"],
            vec![("10.0.0.1".parse().unwrap(), vec![address])],
        ),
        now,
    );
    // The drain first (the location), then the deletion.
    let later = now + Duration::from_secs(1);
    let drain = d.next_unit(&mut t, 1, id + 2, later).expect("drain");
    assert!(matches!(drain.work, UnitWork::Locations(_)), "{drain:?}");
    assert!(d.next_unit(&mut t, 2, id + 3, later).is_none());
    d.on_report(&mut t, 1, applied(id + 2), later);
    let del = d
        .next_unit(&mut t, 1, id + 4, later)
        .expect("deletion again");
    assert!(matches!(&del.work, UnitWork::Services(c) if c[0].action == ServiceAction::Delete));
    assert_eq!(d.parked_units(), 0);
}

#[test]
fn a_deletion_that_stopped_after_unregistering_is_recorded_as_such() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    let (mut d, id) = started(&mut t, now);
    let u = d.next_unit(&mut t, 1, id, now).expect("location unit");
    d.on_report(&mut t, 1, applied(u.work_id), now);
    t.update_service(Operation::Remove, "svc").unwrap();
    let drain = d.next_unit(&mut t, 1, id + 1, now).expect("drain");
    d.on_report(&mut t, 1, applied(drain.work_id), now);
    let del = d.next_unit(&mut t, 1, id + 2, now).expect("deletion");
    // Unregistered; the load balancer's deletion got a 500.
    let mut r = report(
        del.work_id,
        Outcome::Retryable {
            retry_after: Duration::ZERO,
            code: "InternalServerError".into(),
            message: String::new(),
        },
    );
    r.progress = vec![ServiceProgress {
        index: 0,
        step: ServiceStep::Unregistered,
    }];
    let folded = d.on_report(&mut t, 1, r, now).expect("held");
    assert_eq!(
        folded.services.len(),
        1,
        "the registration's removal is recorded"
    );
    assert!(!t.service_view("svc").unwrap().actual);
    // The Service comes back before the clean-up went: it is created again (never assumed there).
    t.update_service(Operation::Add, "svc").unwrap();
    t.set_endpoints("svc", &[ep("10.1.0.1")]).unwrap();
    let later = now + Duration::from_secs(1);
    let c = d.next_unit(&mut t, 1, id + 3, later).expect("creation");
    assert!(matches!(&c.work, UnitWork::Services(c) if c[0].action == ServiceAction::Create));
    assert!(
        d.next_unit(&mut t, 2, id + 4, later).is_none(),
        "no address refers to it yet"
    );
}

#[test]
fn a_creation_that_stopped_part_way_is_cleaned_up_once_not_desired() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    t.update_egress(Operation::Add, "egress").unwrap();
    let mut d = Dispatcher::new(config(), env());
    d.next_unit(&mut t, 1, 1, now).expect("observe");
    d.on_report(&mut t, 1, observed(1, &[], vec![]), now);
    let c = d.next_unit(&mut t, 1, 2, now).expect("creation");
    let mut r = repair(2, "GatewayTimeout");
    r.progress = vec![ServiceProgress {
        index: 0,
        step: ServiceStep::Resources,
    }];
    d.on_report(&mut t, 1, r, now);
    t.update_egress(Operation::Remove, "egress").unwrap();
    let o = d.next_unit(&mut t, 1, 3, now).expect("read-back first");
    assert_eq!(o.work, UnitWork::Observe);
    d.on_report(&mut t, 1, observed(3, &[], vec![]), now);
    let later = now + Duration::from_secs(1);
    let del = d.next_unit(&mut t, 1, 4, later).expect("clean-up");
    let UnitWork::Services(changes) = &del.work else {
        panic!("{del:?}")
    };
    assert_eq!(
        changes[0],
        ServiceChange {
            name: "egress".into(),
            kind: ServiceKind::Outbound,
            action: ServiceAction::Delete,
            nat_gateway: None,
            ipv6: false,
        }
    );
    assert_ne!(c.work, del.work);
    d.on_report(&mut t, 1, applied(4), later);
    assert!(d.next_unit(&mut t, 1, 5, later).is_none());
    assert!(t.pending_diff().is_empty());
}

#[test]
fn only_terminal_failures_park_and_parks_are_counted_by_code() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    let (mut d, id) = started(&mut t, now);
    let u = d.next_unit(&mut t, 1, id, now).expect("location unit");
    d.on_report(
        &mut t,
        1,
        report(
            u.work_id,
            Outcome::Terminal {
                code: "InvalidAddress".into(),
                message: "not an IP".into(),
                changes: Vec::new(),
            },
        ),
        now,
    );
    assert_eq!(d.parked_units(), 1);
    assert_eq!(d.stats().parked.get("InvalidAddress"), Some(&1));
    assert!(d.last_errors().last().unwrap().terminal);
    let later = now + Duration::from_secs(1);
    assert!(d.next_unit(&mut t, 1, id + 1, later).is_none(), "parked");
    // Its desired state changes: it goes again.
    t.set_endpoints("svc", &[ep("10.1.0.1"), ep("10.1.0.2")])
        .unwrap();
    assert!(d.next_unit(&mut t, 1, id + 2, later).is_some());
    assert_eq!(d.parked_units(), 0);
}

#[test]
fn a_read_back_wanted_now_is_not_delayed_by_one_wanted_a_lease_later() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    let (mut d, id) = started(&mut t, now);
    let u = d.next_unit(&mut t, 7, id, now).expect("location unit");
    // The worker goes away: NRP is to be read back one lease later.
    d.release_worker(7, now);
    let again = d
        .next_unit(&mut t, 1, id + 1, now)
        .expect("released unit again");
    assert_eq!(again.work, u.work);
    d.on_report(&mut t, 1, repair(id + 1, "Timeout"), now);
    let o = d
        .next_unit(&mut t, 1, id + 2, now)
        .expect("read back at once");
    assert_eq!(o.work, UnitWork::Observe);
    d.on_report(&mut t, 1, observed(id + 2, &["svc"], vec![]), now);
    let l = d
        .next_unit(&mut t, 1, id + 3, now + Duration::from_millis(50))
        .expect("location");
    d.on_report(
        &mut t,
        1,
        applied(l.work_id),
        now + Duration::from_millis(50),
    );
    // And the one a lease later still comes.
    let lease = d.config().lease;
    assert!(d.next_unit(&mut t, 1, id + 4, now + lease / 2).is_none());
    let o = d
        .next_unit(&mut t, 1, id + 5, now + lease)
        .expect("the deferred read-back");
    assert_eq!(o.work, UnitWork::Observe);
}

#[test]
fn a_repair_reported_during_an_observe_waits_for_the_next_one() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    t.update_egress(Operation::Add, "egress").unwrap();
    let mut d = Dispatcher::new(config(), env());
    let o = d.next_unit(&mut t, 1, 1, now).expect("observe");
    assert_eq!(o.work, UnitWork::Observe);
    // A creation goes while NRP is read back (a snapshot that misses it only makes it go again).
    let c = d
        .next_unit(&mut t, 2, 2, now)
        .expect("creation during the observe");
    assert!(matches!(&c.work, UnitWork::Services(c) if c[0].action == ServiceAction::Create));
    // Its call timed out: the observe in flight may have read NRP before the call landed.
    d.on_report(&mut t, 2, repair(2, "GatewayTimeout"), now);
    d.on_report(&mut t, 1, observed(1, &[], vec![]), now);
    assert_eq!(
        d.awaiting_read_back(),
        1,
        "not met by an observe cut before"
    );
    let later = now + Duration::from_secs(1);
    let o = d.next_unit(&mut t, 1, 3, later).expect("another read-back");
    assert_eq!(o.work, UnitWork::Observe);
    d.on_report(&mut t, 1, observed(3, &[], vec![]), later);
    assert_eq!(d.awaiting_read_back(), 0);
    let again = d
        .next_unit(&mut t, 1, 4, later)
        .expect("the creation again");
    assert_eq!(again.work, c.work);
}

#[test]
fn changes_refused_together_are_parked_each_with_its_own_error() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    for s in ["eg-a", "eg-b", "eg-c"] {
        t.update_service(Operation::Add, s).unwrap();
    }
    let mut d = Dispatcher::new(config(), env());
    let o = d.next_unit(&mut t, 1, 1, now).expect("observe first");
    d.on_report(&mut t, 1, observed(o.work_id, &[], vec![]), now);
    let u = d.next_unit(&mut t, 1, 2, now).expect("the creations");
    let UnitWork::Services(changes) = &u.work else {
        panic!("{u:?}")
    };
    let names: Vec<&str> = changes.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    // The first goes through; the second is refused for a reason of its own, the third with the
    // unit's (decisive) error.
    let folded = d.on_report(
        &mut t,
        1,
        Report {
            refused: Vec::new(),
            work_id: u.work_id,
            applied: vec![0],
            progress: vec![],
            outcome: Outcome::Terminal {
                code: "NatGatewayNotFound".into(),
                message: "missing".into(),
                changes: vec![
                    ChangeError {
                        index: 1,
                        code: "NatGatewayNotStandardV2".into(),
                        message: "Standard".into(),
                    },
                    ChangeError {
                        index: 2,
                        code: "NatGatewayNotFound".into(),
                        message: "missing".into(),
                    },
                ],
            },
        },
        now,
    );
    assert!(folded.is_some());
    let parked = |name: &str| {
        d.parked_service(name)
            .map(|e| (e.code.clone(), e.message.clone()))
    };
    assert_eq!(parked(names[0]), None, "applied");
    assert_eq!(
        parked(names[1]),
        Some(("NatGatewayNotStandardV2".into(), "Standard".into()))
    );
    assert_eq!(
        parked(names[2]),
        Some(("NatGatewayNotFound".into(), "missing".into()))
    );
    assert_eq!(d.stats().parked.get("NatGatewayNotStandardV2"), Some(&1));
    assert_eq!(d.stats().parked.get("NatGatewayNotFound"), Some(&1));
}

/// A refusal NRP's table does not list (`refused`): repaired once (a read-back, then sent again);
/// refused again with the same code, it is held on the refusal schedule instead.
fn refused(work_id: u64, code: &str) -> Report {
    report(
        work_id,
        Outcome::Repair {
            retry_after: Duration::ZERO,
            code: code.into(),
            message: format!("{code}: address 10.1.0.1 refused"),
            refused: true,
        },
    )
}

fn terminal(work_id: u64, code: &str) -> Report {
    report(
        work_id,
        Outcome::Terminal {
            code: code.into(),
            message: String::new(),
            changes: Vec::new(),
        },
    )
}

/// Drives one refused location for `horizon` of simulated time (a read-back whenever one is
/// wanted, every location unit refused with `code`), and returns the instants of its attempts.
fn attempts_over(
    t: &mut DiffTracker,
    d: &mut Dispatcher,
    mut id: u64,
    start: Instant,
    horizon: Duration,
    refusal: impl Fn(u64) -> Report,
) -> Vec<Duration> {
    let mut at = Vec::new();
    let mut now = start;
    while now < start + horizon {
        match d.next_unit(t, 1, id, now) {
            Some(u) if matches!(u.work, UnitWork::Locations(_)) => {
                at.push(now - start);
                d.on_report(t, 1, refusal(id), now);
            }
            Some(u) => {
                assert_eq!(u.work, UnitWork::Observe, "{u:?}");
                d.on_report(t, 1, observed(id, &["svc"], vec![]), now);
            }
            None => {
                let next = d.next_deadline(now).unwrap_or(now + Duration::from_secs(1));
                now = next.max(now + Duration::from_millis(1));
            }
        }
        id += 1;
    }
    at
}

#[test]
fn an_unknown_refusal_repeated_after_its_read_back_is_held_on_the_refusal_schedule() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    let (mut d, id) = started(&mut t, now);
    let hour = Duration::from_secs(3600);
    let at = attempts_over(&mut t, &mut d, id, now, hour, |id| {
        refused(id, "AddressRefusedByPolicy")
    });
    // The default schedule: 30 s doubling to 15 min, with jitter in [delay/2, delay]. In an hour:
    // the first call, its repair, then at most one attempt per delay of 15 s, 30 s, 1 min, …
    eprintln!("unknown refusal, one hour: {} attempts at {at:?}", at.len());
    assert!(at.len() >= 4, "{at:?}");
    // Worst case (every jitter at its shortest): the call, its repair, 11 held attempts.
    assert!(
        at.len() <= 13,
        "the refusal budget: {} attempts in an hour: {at:?}",
        at.len()
    );
    let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter().skip(2).all(|g| *g >= Duration::from_secs(15)),
        "held, not repaired again and again: {gaps:?}"
    );
    assert_eq!(d.parked_units(), 1, "visible as parked while held");
    // Its desired state changes: it goes at once, and the schedule starts over.
    t.set_endpoints("svc", &[ep("10.1.0.1"), ep("10.1.0.2")])
        .unwrap();
    let later = now + hour + Duration::from_secs(1);
    let mut u = d.next_unit(&mut t, 1, 10_000, later).expect("sent at once");
    if u.work == UnitWork::Observe {
        // The hour's anti-entropy read-back comes first.
        d.on_report(&mut t, 1, observed(10_000, &["svc"], vec![]), later);
        u = d.next_unit(&mut t, 1, 10_001, later).expect("sent at once");
    }
    assert!(matches!(u.work, UnitWork::Locations(_)), "{u:?}");
    assert_eq!(d.parked_units(), 0);
    d.on_report(&mut t, 1, applied(u.work_id), later);
}

#[test]
fn a_parked_refusal_is_sent_again_on_the_refusal_schedule_and_no_more() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    let (mut d, id) = started(&mut t, now);
    let at = attempts_over(
        &mut t,
        &mut d,
        id,
        now,
        Duration::from_secs(3 * 3600),
        |id| terminal(id, "InvalidAddress"),
    );
    // After the first hour, at most one attempt per 7.5 min (the 15-min cap, jittered).
    let late: Vec<&Duration> = at
        .iter()
        .filter(|a| **a >= Duration::from_secs(3600))
        .collect();
    eprintln!(
        "parked refusal, three hours: {} attempts, {} after the first hour",
        at.len(),
        late.len()
    );
    assert!(!late.is_empty(), "still tried: {at:?}");
    assert!(
        late.len() <= 2 * 8,
        "{} attempts in two hours: {at:?}",
        late.len()
    );
    assert!(at.len() <= 11 + 16, "{at:?}");
    // A known repair code (the server's view was wrong) is repaired every time, never held.
    let mut t = DiffTracker::new();
    let (mut d, id) = started(&mut t, now);
    let at = attempts_over(&mut t, &mut d, id, now, Duration::from_secs(60), |id| {
        repair(id, "ServiceNotRegistered")
    });
    assert_eq!(d.parked_units(), 0);
    assert!(at.len() > 5, "{at:?}");
}
