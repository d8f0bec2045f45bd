//! Service units (issue 36): up to `max_services_per_unit` changes whatever the room for concurrent
//! calls (their registrations go in one `updateServices` call), counted for the calls they run side by
//! side (`Unit::side_by_side`, at most the room).

use std::time::Instant;

use super::tests::{applied, env, observed, tracker_with};
use super::*;
use crate::difftracker::Operation;

#[test]
fn a_service_unit_carries_up_to_its_bound_and_counts_its_side_by_side_calls() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    let mut d = Dispatcher::new(
        DispatchConfig {
            max_mutating_units_in_flight: 3,
            max_services_per_unit: 4,
            ..DispatchConfig::unbatched()
        },
        env(),
    );
    observed(&mut d, &mut t, now);
    for i in 0..6 {
        t.update_service(Operation::Add, &format!("svc-{i}"))
            .unwrap();
    }
    // Six creations pending, room for three side-by-side calls: a unit of four changes (its
    // registrations in one call), three of them side by side.
    let u = d.next_unit(&mut t, 1, 2, now).expect("service unit");
    let UnitWork::Services(changes) = &u.work else {
        panic!("service unit");
    };
    assert_eq!((changes.len(), u.side_by_side), (4, 3));
    assert_eq!(d.mutating_calls_in_flight(), 3);
    assert!(d.next_unit(&mut t, 2, 3, now).is_none(), "no room left");
    d.on_report(&mut t, 1, applied(2), now);
    let u = d.next_unit(&mut t, 2, 4, now).expect("the rest");
    let UnitWork::Services(changes) = &u.work else {
        panic!("service unit");
    };
    // Two changes: both side by side, one call of room left.
    assert_eq!((changes.len(), u.side_by_side), (2, 2));
    assert_eq!(d.mutating_calls_in_flight(), 2);
}

#[test]
fn a_service_unit_cut_with_little_room_runs_its_changes_one_after_the_other() {
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
    d.on_report(&mut t, 1, applied(s.work_id), now);
    // One location unit takes a slot; five creations then go in one unit, one call at a time.
    let l = d.next_unit(&mut t, 1, 3, now).expect("location unit");
    assert!(matches!(l.work, UnitWork::Locations(_)));
    for i in 0..5 {
        t.update_service(Operation::Add, &format!("new-{i}"))
            .unwrap();
    }
    let u = d.next_unit(&mut t, 2, 4, now).expect("service unit");
    let UnitWork::Services(changes) = &u.work else {
        panic!("service unit");
    };
    assert_eq!((changes.len(), u.side_by_side), (5, 1));
    assert_eq!(d.mutating_calls_in_flight(), 2);
    assert!(d.next_unit(&mut t, 3, 5, now).is_none(), "the cap holds");
}

/// A creation NRP confirms while an observe is in flight is not undone by the observe's snapshot,
/// read before it: the service stays in the actual state and is not created again (at 2,500
/// Services under ARM's write budget, an anti-entropy observe within the start sent 48 creations
/// again: 99 writes for nothing).
#[test]
fn a_creation_confirmed_during_an_observe_is_not_sent_again() {
    let now = Instant::now();
    let mut t = DiffTracker::new();
    let mut d = Dispatcher::new(DispatchConfig::unbatched(), env());
    observed(&mut d, &mut t, now);
    t.update_service(Operation::Add, "svc").unwrap();
    let create = d.next_unit(&mut t, 1, 2, now).expect("the creation");
    assert!(matches!(create.work, UnitWork::Services(_)));
    // An observe is cut while the creation is under way (creations do not hold it back)...
    d.request_observe();
    let observe = d.next_unit(&mut t, 1, 3, now).expect("the observe");
    assert_eq!(observe.work, UnitWork::Observe);
    // ...the creation is confirmed, then the observe's snapshot, read before it, comes.
    let folded = d.on_report(&mut t, 1, applied(2), now).unwrap();
    assert_eq!(folded.services.len(), 1);
    let folded = d
        .on_report(
            &mut t,
            1,
            Report {
                refused: Vec::new(),
                work_id: 3,
                applied: vec![],
                progress: vec![],
                outcome: Outcome::Observed {
                    snapshot: crate::difftracker::ActualSnapshot::default(),
                    last: true,
                },
            },
            now,
        )
        .unwrap();
    assert!(folded.observed);
    assert!(t.service_view("svc").is_some_and(|v| v.actual));
    assert!(
        d.next_unit(&mut t, 1, 4, now).is_none(),
        "nothing to send again"
    );
    // The confirmed creation is handed on, for what is kept beside the tracker (its frontend).
    assert_eq!(folded.services.len(), 1);
}
