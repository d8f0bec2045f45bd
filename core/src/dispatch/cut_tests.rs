//! Cutting units: a backlog spread over the free slots, partial updates side by side.

use std::time::Instant;

use super::tests::{applied, env, observed, tracker_with};
use super::*;
use crate::difftracker::Endpoint;

/// A dispatcher with 4 free mutating slots over `locations` locations of one address each, NRP
/// observed and the service created: what waits is the locations' first programming.
fn service_created(locations: u8, now: Instant) -> (DiffTracker, Dispatcher) {
    let mut t = tracker_with(locations, 1);
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
    d.on_report(&mut t, 1, applied(s.work_id), now);
    (t, d)
}

#[test]
fn a_backlog_is_spread_over_the_free_slots_in_one_wave() {
    let now = Instant::now();
    let (mut t, mut d) = service_created(100, now);
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
    let (mut t, mut d) = service_created(40, now);
    // 40 locations: splitting them would cost writes for little time; one unit.
    let u = d.next_unit(&mut t, 1, 3, now).expect("a location unit");
    assert_eq!(u.work.len(), 40);
}

#[test]
fn a_partial_update_in_flight_holds_its_addresses_only() {
    let now = Instant::now();
    let (mut t, mut d) = service_created(1, now);
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
