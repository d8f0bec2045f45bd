//! Pacing against the write budget, without a runtime: the clock is passed in.

use std::time::{Duration, Instant};

use super::tests::{applied, env, observed, set_all, tracker_with};
use super::*;
use crate::difftracker::Endpoint;

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
    set_all(&mut t, &eps);
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

/// A dispatcher pacing at 10 writes/s from a bucket of `burst` writes (no reserve; service units
/// of up to 16 changes), NRP read back at `t0`, and a tracker with `services` creations pending.
fn paced_creations(burst: u32, services: usize, t0: Instant) -> (DiffTracker, Dispatcher) {
    let mut t = DiffTracker::new();
    let mut d = Dispatcher::new(
        DispatchConfig {
            max_services_per_unit: 16,
            write_pace: 10.0,
            write_burst: burst,
            write_reserve: 0,
            ..DispatchConfig::unbatched()
        },
        env(),
    );
    observed(&mut d, &mut t, t0);
    for i in 0..services {
        t.update_service(crate::difftracker::Operation::Add, &format!("svc-{i}"))
            .unwrap();
    }
    (t, d)
}

#[test]
fn a_service_unit_spends_two_writes_per_change_and_one_for_its_registrations() {
    let t0 = Instant::now();
    let (mut t, mut d) = paced_creations(33, 20, t0);
    d.note_remaining_writes(1_000);
    let u = d.next_unit(&mut t, 1, 2, t0).expect("a service unit");
    assert_eq!(u.work.len(), 16);
    assert_eq!(pacing::writes_of(&u.work), 16 * 2 + 1);
    d.on_report(&mut t, 1, applied(u.work_id), t0);
    // The unit spent the bucket's 33 writes exactly. The next, of the other four (9 writes), waits
    // until the bucket holds them: 900 ms at 10/s (at 3 writes a change the first unit would have
    // overdrawn it by 15, and ARM's bucket with it).
    assert!(
        d.next_unit(&mut t, 1, 3, t0).is_none(),
        "the bucket is empty"
    );
    let due = d.next_deadline(t0).expect("the bucket holds the next unit");
    let ms = Duration::from_millis;
    assert!(due >= t0 + ms(899) && due <= t0 + ms(901), "{due:?}");
    let rest = d.next_unit(&mut t, 1, 4, due).expect("the other four");
    assert_eq!(pacing::writes_of(&rest.work), 4 * 2 + 1);
}

#[test]
fn a_report_caps_the_bucket_at_what_the_subscription_has_left() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let (mut t, mut d) = paced_creations(200, 40, t0);
    // No budget reported yet: the first unit goes unpaced.
    let first = d.next_unit(&mut t, 1, 2, t0).expect("the first unit");
    d.on_report(&mut t, 1, applied(first.work_id), t0);
    // The subscription has 20 writes left (its bucket paid for the first unit, others write too):
    // the next unit's 33 writes wait for 13 more (1.3 s at 10/s), not for none (167 left).
    d.note_remaining_writes(20);
    assert!(d.next_unit(&mut t, 1, 3, t0).is_none(), "13 writes short");
    let due = d.next_deadline(t0).expect("the bucket's next writes");
    assert!(due >= t0 + ms(1_299) && due <= t0 + ms(1_301), "{due:?}");
    let second = d.next_unit(&mut t, 1, 4, due).expect("the bucket holds it");
    assert_eq!(pacing::writes_of(&second.work), 33);
}

#[test]
fn a_service_unit_s_own_writes_are_not_taken_off_its_report_twice() {
    let t0 = Instant::now();
    let (mut t, mut d) = paced_creations(200, 40, t0);
    d.note_remaining_writes(1_000);
    let a = d.next_unit(&mut t, 1, 2, t0).expect("a unit of 16");
    // Its report: 34 writes left after its own 33, which the reading counts already.
    d.note_remaining_writes_of(34, a.work_id);
    d.on_report(&mut t, 1, applied(a.work_id), t0);
    // 34 left, not 2: the next unit of 16 (33 writes) goes at once.
    let b = d
        .next_unit(&mut t, 1, 3, t0)
        .expect("34 writes left: one more unit");
    assert_eq!(pacing::writes_of(&b.work), 33);
}
