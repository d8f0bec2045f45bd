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
