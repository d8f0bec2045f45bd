//! Addresses NRP refused on their own (`refused.rs`): held on their refusal schedule while the
//! rest of their location goes, sent again when their delay passes or at once when they change.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::*;
use crate::difftracker::{AddressUpdateAction, Endpoint, Operation};

const BAD: &str = "10.1.0.9";
const CODE: &str = "BackendPoolAddressesMustHaveSameIpVersion";

fn env() -> DispatchEnv {
    DispatchEnv::new(Instant::now(), 1_700_000_000_000, 11)
}

fn ep(address: &'static str, location: &'static str) -> Endpoint<'static> {
    Endpoint { address, location }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn report(work_id: u64, refused: Vec<AddressRefusal>, outcome: Outcome) -> Report {
    Report {
        work_id,
        applied: vec![],
        progress: vec![],
        refused,
        outcome,
    }
}

/// `svc` desired with `endpoints`; NRP read back empty; the creation recorded.
fn started(t: &mut DiffTracker, now: Instant, endpoints: &[Endpoint<'_>]) -> (Dispatcher, u64) {
    t.update_service(Operation::Add, "svc").unwrap();
    t.set_endpoints("svc", endpoints).unwrap();
    let mut d = Dispatcher::new(DispatchConfig::unbatched(), env());
    let o = d.next_unit(t, 1, 1, now).expect("observe first");
    assert_eq!(o.work, UnitWork::Observe);
    let snapshot = ActualSnapshot::default();
    let last = true;
    d.on_report(
        t,
        1,
        report(1, vec![], Outcome::Observed { snapshot, last }),
        now,
    );
    let s = d.next_unit(t, 1, 2, now).expect("creation");
    assert!(matches!(s.work, UnitWork::Services(_)));
    d.on_report(t, 1, report(2, vec![], Outcome::Applied), now);
    (d, 3)
}

/// What NRP answers: every change applied, except that it refuses `BAD` wherever it is carried.
fn answer(u: &Unit) -> Report {
    let UnitWork::Locations(diffs) = &u.work else {
        panic!("a location unit: {u:?}")
    };
    let refused = diffs
        .iter()
        .enumerate()
        .flat_map(|(i, d)| {
            d.addresses
                .iter()
                .filter(|a| a.address == ip(BAD))
                .map(move |a| AddressRefusal {
                    index: i as u32,
                    address: a.address,
                    code: CODE.into(),
                    message: format!("address '{}' has another IP version", a.address),
                })
        })
        .collect();
    report(u.work_id, refused, Outcome::Applied)
}

/// The addresses a location unit carries.
fn carried(u: &Unit) -> Vec<String> {
    match &u.work {
        UnitWork::Locations(diffs) => diffs
            .iter()
            .flat_map(|d| d.addresses.iter().map(|a| a.address.to_string()))
            .collect(),
        other => panic!("a location unit: {other:?}"),
    }
}

fn actual(t: &DiffTracker, address: &str) -> Vec<String> {
    t.actual_ref(ip("10.0.0.1"), ip(address))
}

#[test]
fn a_refused_address_is_held_and_the_rest_of_its_location_goes() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    let (mut d, id) = started(
        &mut t,
        now,
        &[ep("10.1.0.1", "10.0.0.1"), ep(BAD, "10.0.0.1")],
    );
    let u = d.next_unit(&mut t, 1, id, now).expect("the location");
    assert_eq!(carried(&u), ["10.1.0.1", BAD]);
    d.on_report(&mut t, 1, answer(&u), now);
    assert_eq!(actual(&t, "10.1.0.1"), ["svc"], "the rest is recorded");
    assert!(actual(&t, BAD).is_empty(), "the refused address is not");
    assert_eq!(d.refused_address_count(), 1);
    let held = d.refused_address(ip("10.0.0.1"), ip(BAD)).expect("held");
    assert_eq!(
        (held.kind, held.record.code.as_str(), held.refusals),
        (RefusedKind::Address, CODE, 1)
    );
    assert_eq!(held.services, ["svc"]);
    assert_eq!(d.refused_addresses_of("svc").count(), 1);
    assert_eq!(d.refused_by_code().get(CODE), Some(&1));

    // Another change at the same location goes at once, without the held address.
    t.set_endpoints(
        "svc",
        &[
            ep("10.1.0.1", "10.0.0.1"),
            ep(BAD, "10.0.0.1"),
            ep("10.1.0.2", "10.0.0.1"),
        ],
    )
    .unwrap();
    let u = d
        .next_unit(&mut t, 1, id + 1, now)
        .expect("the new address");
    assert_eq!(carried(&u), ["10.1.0.2"]);
    d.on_report(&mut t, 1, answer(&u), now);
    assert!(d.next_unit(&mut t, 1, id + 2, now).is_none(), "held");

    // Its delay passes (30 s, jittered to [15 s, 30 s]): it goes alone; refused again, the delay
    // doubles.
    let retry = d.next_deadline(now).expect("a retry time");
    let delay = retry - now;
    assert!(
        delay >= Duration::from_secs(15) && delay <= Duration::from_secs(30),
        "{delay:?}"
    );
    let u = d.next_unit(&mut t, 1, id + 3, retry).expect("sent again");
    assert_eq!(carried(&u), [BAD]);
    d.on_report(&mut t, 1, answer(&u), retry);
    let held = d.refused_address(ip("10.0.0.1"), ip(BAD)).expect("held");
    assert_eq!(held.refusals, 2);
    let again = d.next_deadline(retry).expect("a retry time") - retry;
    assert!(
        again >= Duration::from_secs(30) && again <= Duration::from_secs(60),
        "{again:?}"
    );
    let items = d.refused_items(10);
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].address, Some(ip(BAD)));
    assert!(items[0].retry_at_unix_ms.is_some());
}

#[test]
fn a_change_of_the_held_address_sends_it_at_once_and_starts_its_schedule_over() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    let all = [ep("10.1.0.1", "10.0.0.1"), ep(BAD, "10.0.0.1")];
    let (mut d, mut id) = started(&mut t, now, &all);
    for _ in 0..2 {
        let u = d.next_unit(&mut t, 1, id, now).expect("the location");
        d.on_report(&mut t, 1, answer(&u), now);
        id += 1;
        let retry = d.next_deadline(now).unwrap();
        let u = d.next_unit(&mut t, 1, id, retry).expect("again");
        d.on_report(&mut t, 1, answer(&u), retry);
        id += 1;
        assert_eq!(
            d.refused_address(ip("10.0.0.1"), ip(BAD)).unwrap().refusals,
            2
        );

        // Its ref changes (a second service becomes ready with it): void, sent at once.
        t.update_service(Operation::Add, "svc2").unwrap();
        t.set_endpoints("svc2", &[ep(BAD, "10.0.0.1")]).unwrap();
        let s = d.next_unit(&mut t, 1, id, retry).expect("svc2's creation");
        assert!(matches!(s.work, UnitWork::Services(_)), "{s:?}");
        d.on_report(&mut t, 1, report(id, vec![], Outcome::Applied), retry);
        id += 1;
        let u = d.next_unit(&mut t, 1, id, retry).expect("at once");
        assert_eq!(carried(&u), [BAD]);
        d.on_report(&mut t, 1, answer(&u), retry);
        id += 1;
        let held = d.refused_address(ip("10.0.0.1"), ip(BAD)).unwrap();
        assert_eq!(held.refusals, 1, "the schedule starts over");
        assert_eq!(held.services, ["svc", "svc2"]);

        // It is no longer desired: the hold is forgotten with it.
        t.set_endpoints("svc", &all[..1]).unwrap();
        t.update_service(Operation::Remove, "svc2").unwrap();
        while let Some(u) = d.next_unit(&mut t, 1, id, retry) {
            let r = match &u.work {
                UnitWork::Locations(_) => answer(&u),
                _ => report(id, vec![], Outcome::Applied),
            };
            d.on_report(&mut t, 1, r, retry);
            id += 1;
        }
        let retry = d.next_deadline(retry).unwrap_or(retry);
        assert!(d.next_unit(&mut t, 1, id, retry).is_none());
        assert_eq!(d.refused_address_count(), 0, "forgotten");
        // Desired again: it goes at once, refused as the first time.
        t.set_endpoints("svc", &all).unwrap();
    }
}

#[test]
fn a_full_replacement_goes_without_its_held_address() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    let (mut d, id) = started(&mut t, now, &[ep(BAD, "10.0.0.1")]);
    let u = d.next_unit(&mut t, 1, id, now).expect("the new location");
    let UnitWork::Locations(diffs) = &u.work else {
        panic!()
    };
    assert_eq!(diffs[0].action, AddressUpdateAction::Full);
    d.on_report(&mut t, 1, answer(&u), now);
    assert!(
        !t.location_view(ip("10.0.0.1")).unwrap().in_nrp,
        "nothing of it was sent: not recorded"
    );
    // A second address at the location: the full replacement carries it alone.
    t.set_endpoints("svc", &[ep(BAD, "10.0.0.1"), ep("10.1.0.1", "10.0.0.1")])
        .unwrap();
    let u = d.next_unit(&mut t, 1, id + 1, now).expect("the location");
    let UnitWork::Locations(diffs) = &u.work else {
        panic!()
    };
    assert_eq!(diffs[0].action, AddressUpdateAction::Full);
    assert_eq!(carried(&u), ["10.1.0.1"]);
    d.on_report(&mut t, 1, answer(&u), now);
    assert!(t.location_view(ip("10.0.0.1")).unwrap().in_nrp);
    assert_eq!(d.refused_address_count(), 1);
}

#[test]
fn writes_spent_on_a_refused_address_stay_within_the_refusal_budget() {
    let start = Instant::now();
    let mut t = DiffTracker::new();
    let (mut d, mut id) = started(
        &mut t,
        start,
        &[ep("10.1.0.1", "10.0.0.1"), ep(BAD, "10.0.0.1")],
    );
    let hours = 3;
    let mut now = start;
    let mut attempts: Vec<Duration> = Vec::new();
    let (mut churn, mut churn_at) = (0usize, start + Duration::from_secs(60));
    while now < start + Duration::from_secs(3600 * hours) {
        match d.next_unit(&mut t, 1, id, now) {
            Some(u) if matches!(u.work, UnitWork::Locations(_)) => {
                if carried(&u).iter().any(|a| a == BAD) {
                    attempts.push(now - start);
                }
                d.on_report(&mut t, 1, answer(&u), now);
            }
            Some(u) => {
                // The anti-entropy read-back: NRP has what was recorded.
                assert_eq!(u.work, UnitWork::Observe, "{u:?}");
                let snapshot = ActualSnapshot {
                    load_balancers: vec!["svc".into()],
                    locations: vec![(
                        ip("10.0.0.1"),
                        t.location_view(ip("10.0.0.1"))
                            .unwrap()
                            .addresses
                            .into_iter()
                            .filter_map(|a| Some((a.address, a.actual?)))
                            .collect(),
                    )],
                    ..ActualSnapshot::default()
                };
                let last = true;
                let r = report(id, vec![], Outcome::Observed { snapshot, last });
                d.on_report(&mut t, 1, r, now);
            }
            None if now >= churn_at => {
                // The location churns: another pod comes or goes every minute.
                churn += 1;
                let extra = ["10.1.0.2", "10.1.0.3"][churn % 2];
                let eps = [
                    ep("10.1.0.1", "10.0.0.1"),
                    ep(BAD, "10.0.0.1"),
                    ep(extra, "10.0.0.1"),
                ];
                t.set_endpoints("svc", &eps).unwrap();
                churn_at += Duration::from_secs(60);
            }
            None => {
                let next = d
                    .next_deadline(now)
                    .unwrap_or(now + Duration::from_secs(1))
                    .min(churn_at);
                now = next.max(now + Duration::from_millis(1));
            }
        }
        id += 1;
    }
    let hour = Duration::from_secs(3600);
    let first = attempts.iter().filter(|a| **a < hour).count();
    let later = attempts.len() - first;
    eprintln!(
        "a refused address over {hours} h: {} writes, {first} in the first hour: {attempts:?}",
        attempts.len()
    );
    // docs/errors.md, "The refusal budget": at most 12 in the first hour (the call and 11 retries
    // at the shortest jitter of 30 s doubling to 15 min), then at most 8 an hour.
    assert!(first <= 12, "{attempts:?}");
    assert!(later <= 8 * (hours as usize - 1), "{attempts:?}");
    assert!(first >= 5, "still retried: {attempts:?}");
    assert_eq!(d.refused_address_count(), 1, "still held");
}

#[test]
fn a_report_refusing_an_address_the_unit_does_not_carry_changes_nothing() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    let (mut d, id) = started(&mut t, now, &[ep("10.1.0.1", "10.0.0.1")]);
    let u = d.next_unit(&mut t, 1, id, now).expect("the location");
    let wrong = |index: u32, address: &str| AddressRefusal {
        index,
        address: ip(address),
        code: CODE.into(),
        message: String::new(),
    };
    let r = report(
        u.work_id,
        vec![wrong(0, "10.9.9.9"), wrong(3, "10.1.0.1")],
        Outcome::Applied,
    );
    d.on_report(&mut t, 1, r, now);
    assert_eq!(d.refused_address_count(), 0);
    assert_eq!(actual(&t, "10.1.0.1"), ["svc"]);
    let codes: Vec<String> = d.last_errors().into_iter().map(|e| e.code).collect();
    assert_eq!(
        codes.iter().filter(|c| *c == "InconsistentReport").count(),
        2,
        "{codes:?}"
    );
}
