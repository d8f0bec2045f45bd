//! Cutting units: a backlog spread over the free slots, partial updates side by side.

use std::time::Instant;

use super::tests::{applied, env, observed, set_all, tracker_with};
use super::*;
use crate::difftracker::Endpoint;

/// A dispatcher with 4 free mutating slots over `locations` locations of `per_location` addresses
/// each, NRP observed and the service created: what waits is the locations' first programming.
fn service_created(locations: u8, per_location: u8, now: Instant) -> (DiffTracker, Dispatcher) {
    created_with(locations, per_location, now, DispatchConfig::unbatched())
}

fn created_with(
    locations: u8,
    per_location: u8,
    now: Instant,
    config: DispatchConfig,
) -> (DiffTracker, Dispatcher) {
    let mut t = tracker_with(locations, per_location);
    let mut d = Dispatcher::new(
        DispatchConfig {
            max_mutating_units_in_flight: 4,
            ..config
        },
        env(),
    );
    observed(&mut d, &mut t, now);
    let s = d.next_unit(&mut t, 1, 2, now).unwrap();
    assert!(matches!(s.work, UnitWork::Services(_)));
    d.on_report(&mut t, 1, applied(s.work_id), now);
    (t, d)
}

/// The endpoints of the three locations of `created_with(3, 1, ..)`; the first `n` of them have
/// moved to a new address.
fn moved(n: usize) -> Vec<Endpoint<'static>> {
    const OLD: [&str; 3] = ["10.1.1.1", "10.1.2.1", "10.1.3.1"];
    const NEW: [&str; 3] = ["10.1.1.9", "10.1.2.9", "10.1.3.9"];
    const AT: [&str; 3] = ["10.0.0.1", "10.0.0.2", "10.0.0.3"];
    (0..3)
        .map(|i| Endpoint {
            address: if i < n { NEW[i] } else { OLD[i] },
            location: AT[i],
        })
        .collect()
}

/// Three locations programmed with gathering on (quiet `quiet_ms`, linger 100 ms, no headway):
/// their first programming, from idle, waited one quiet interval, went, and landed at
/// `t0 + 2 × quiet`. Returns `t0` too.
fn programmed_gathering(quiet_ms: u64) -> (DiffTracker, Dispatcher, Instant) {
    let t0 = Instant::now();
    let quiet = std::time::Duration::from_millis(quiet_ms);
    let config = DispatchConfig {
        batch_quiet: quiet,
        batch_linger: std::time::Duration::from_millis(100),
        unit_headway: 0.0,
        ..DispatchConfig::default()
    };
    let (mut t, mut d) = created_with(3, 1, t0, config);
    assert!(
        d.next_unit(&mut t, 1, 3, t0).is_none(),
        "gathering from idle"
    );
    let first = d.next_unit(&mut t, 1, 3, t0 + quiet).expect("quiet");
    d.on_report(&mut t, 1, applied(first.work_id), t0 + 2 * quiet);
    (t, d, t0)
}

/// Staggering on (a headway of 1.2), batching off.
fn staggered() -> DispatchConfig {
    DispatchConfig {
        unit_headway: 1.2,
        ..DispatchConfig::unbatched()
    }
}

/// The endpoints of `created_with(locations, per_location, ..)` with address `p` of location
/// `l` replaced by a new one at the same location where `new(l, p)` (2 changes each).
fn endpoints(
    locations: u32,
    per_location: u32,
    new: impl Fn(u32, u32) -> bool,
) -> Vec<(String, String)> {
    (1..=locations)
        .flat_map(|l| (1..=per_location).map(move |p| (l, p)))
        .map(|(l, p)| {
            let net = if new(l, p) { 2 } else { 1 };
            (format!("10.{net}.{l}.{p}"), format!("10.0.0.{l}"))
        })
        .collect()
}

/// Every address of `created_with(90, 40, ..)` replaced by a new one at the same location (80
/// changes a location, 7,200 in all).
fn all_replaced() -> Vec<(String, String)> {
    endpoints(90, 40, |_, _| true)
}

/// The first wave of `created_with(90, 40, ..)` at `t0`: its first programming, a burst spread
/// over the free slots.
fn first_wave(t: &mut DiffTracker, d: &mut Dispatcher, t0: Instant) -> Vec<Unit> {
    (3..7).map_while(|id| d.next_unit(t, 1, id, t0)).collect()
}

/// The addresses each location unit cut at `now` carries, until none is cut.
fn wave(
    t: &mut DiffTracker,
    d: &mut Dispatcher,
    ids: std::ops::Range<u64>,
    now: Instant,
) -> Vec<usize> {
    ids.map_while(|id| d.next_unit(t, 1, id, now))
        .map(|u| match &u.work {
            UnitWork::Locations(diffs) => diffs.iter().map(|d| d.addresses.len()).sum(),
            other => panic!("{other:?}"),
        })
        .collect()
}

#[test]
fn a_backlog_is_spread_over_the_free_slots_in_one_wave() {
    let now = Instant::now();
    let (mut t, mut d) = service_created(90, 40, now);
    // 3,600 addresses, 4 free slots, at least 1,000 addresses a split: 3 even units of 30
    // locations — one wave, no unit thinner than a split is worth.
    let sizes: Vec<usize> = (3..10)
        .map_while(|id| d.next_unit(&mut t, 1, id, now))
        .map(|u| u.work.len())
        .collect();
    assert_eq!(sizes, vec![30, 30, 30]);
    assert!(d.next_unit(&mut t, 1, 10, now).is_none(), "nothing is left");
}

#[test]
fn a_small_backlog_stays_whole_whatever_the_free_slots_and_locations() {
    let now = Instant::now();
    let (mut t, mut d) = service_created(40, 1, now);
    // 40 addresses: splitting them would cost writes for little time; one unit.
    let u = d.next_unit(&mut t, 1, 3, now).expect("a location unit");
    assert_eq!(u.work.len(), 40);
    // So are 200 locations of one address each (the first writes of a rollout): four thin units
    // would hold every slot for a call's fixed latency.
    let (mut t, mut d) = service_created(200, 1, now);
    assert_eq!(wave(&mut t, &mut d, 3..10, now), vec![200]);
}

#[test]
fn a_partial_update_is_split_to_fill_even_shares() {
    let now = Instant::now();
    let config = DispatchConfig {
        max_addresses_per_unit: 1_000,
        ..DispatchConfig::unbatched()
    };
    let (mut t, mut d) = created_with(1, 1, now, config);
    let first = d.next_unit(&mut t, 1, 3, now).unwrap();
    d.on_report(&mut t, 1, applied(first.work_id), now);
    // 3,000 addresses join the one location (in NRP now: a partial update): three units of
    // 1,000, one per slot, rather than one of 1,000 and the rest a call later.
    let joined: Vec<(String, String)> = (0..3_000u32)
        .map(|i| {
            (
                format!("10.2.{}.{}", i / 250, i % 250 + 1),
                "10.0.0.1".to_owned(),
            )
        })
        .chain(std::iter::once((
            "10.1.1.1".to_owned(),
            "10.0.0.1".to_owned(),
        )))
        .collect();
    set_all(&mut t, &joined);
    let units: Vec<Unit> = (4..10)
        .map_while(|id| d.next_unit(&mut t, 1, id, now))
        .collect();
    let sizes: Vec<usize> = units
        .iter()
        .map(|u| match &u.work {
            UnitWork::Locations(diffs) => diffs.iter().map(|d| d.addresses.len()).sum(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(sizes, vec![1_000, 1_000, 1_000]);
    for u in &units {
        d.on_report(&mut t, 1, applied(u.work_id), now);
    }
    let diff = t.pending_diff();
    assert!(diff.locations.is_empty(), "{diff:?}");
}

#[test]
fn a_partial_update_in_flight_holds_its_addresses_only() {
    let now = Instant::now();
    let (mut t, mut d) = service_created(1, 1, now);
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
fn in_steady_churn_location_units_take_turns_a_headway_apart() {
    let t0 = Instant::now();
    let ms = |n: u64| t0 + std::time::Duration::from_millis(n);
    let config = DispatchConfig {
        unit_headway: 1.2,
        ..DispatchConfig::unbatched()
    };
    let (mut t, mut d) = created_with(3, 1, t0, config);
    // The first programming goes at once and takes 200 ms: the headway is 200 / 4 × 1.2 = 60 ms.
    let first = d.next_unit(&mut t, 1, 3, t0).expect("idle: at once");
    d.on_report(&mut t, 1, applied(first.work_id), ms(200));
    // A change with nothing in flight goes at once.
    t.set_endpoints("svc", &moved(1)).unwrap();
    let second = d
        .next_unit(&mut t, 1, 4, ms(200))
        .expect("nothing in flight");
    // The next change, 10 ms later, waits for its turn although three slots are free.
    t.set_endpoints("svc", &moved(2)).unwrap();
    assert!(d.next_unit(&mut t, 2, 5, ms(210)).is_none(), "held");
    assert_eq!(
        d.next_deadline(ms(210)),
        Some(ms(260)),
        "woken for its turn"
    );
    // What arrives meanwhile joins it: one unit of both, not one each.
    t.set_endpoints("svc", &moved(3)).unwrap();
    let third = d.next_unit(&mut t, 2, 6, ms(260)).expect("its turn");
    assert_eq!(third.work.len(), 2, "{third:?}");
    d.on_report(&mut t, 1, applied(second.work_id), ms(400));
    d.on_report(&mut t, 2, applied(third.work_id), ms(400));
    assert!(t.pending_diff().locations.is_empty());
}

#[test]
fn a_burst_is_spread_over_the_free_slots_whatever_the_headway() {
    let t0 = Instant::now();
    let at = t0 + std::time::Duration::from_millis(200);
    let (mut t, mut d) = created_with(90, 40, t0, staggered());
    // A burst: the first programming of 90 locations, spread over the free slots at once
    // (each unit but the last leaves ready work behind), each unit measured at 200 ms.
    let first = first_wave(&mut t, &mut d, t0);
    let sizes: Vec<usize> = first.iter().map(|u| u.work.len()).collect();
    assert_eq!(sizes, vec![30, 30, 30]);
    for u in &first {
        d.on_report(&mut t, 1, applied(u.work_id), at);
    }
    assert_eq!(
        d.stagger.headway(&d.config),
        Some(std::time::Duration::from_millis(60))
    );
    // Later, from idle, every address is replaced at once (80 changes a location, 7,200 in all,
    // partial updates): again one wave over the free slots, none held, in even shares.
    let later = at + std::time::Duration::from_millis(50);
    set_all(&mut t, &all_replaced());
    assert_eq!(wave(&mut t, &mut d, 7..12, later), vec![1_800; 4]);
}

#[test]
fn a_burst_is_gathered_from_idle_only_not_beside_units_in_flight() {
    let (mut t, mut d, t0) = programmed_gathering(3);
    let ms = |n: u64| t0 + std::time::Duration::from_millis(n);
    // Idle again: a change is gathered.
    t.set_endpoints("svc", &moved(1)).unwrap();
    assert!(d.next_unit(&mut t, 1, 4, ms(20)).is_none(), "gathering");
    let a = d.next_unit(&mut t, 1, 4, ms(23)).expect("quiet");
    // With a location unit in flight, the next change goes at once: nothing is gathered beside
    // units in flight (steady churn is spaced by the headway, not held to the linger).
    t.set_endpoints("svc", &moved(2)).unwrap();
    let b = d
        .next_unit(&mut t, 2, 5, ms(24))
        .expect("not held beside a unit in flight");
    assert_eq!(b.work.len(), 1);
    d.on_report(&mut t, 1, applied(a.work_id), ms(200));
    d.on_report(&mut t, 2, applied(b.work_id), ms(200));
    assert!(t.pending_diff().locations.is_empty());
}

#[test]
fn a_backlog_built_beside_units_in_flight_is_not_spread_into_a_wave() {
    let t0 = Instant::now();
    let at = t0 + std::time::Duration::from_millis(200);
    let (mut t, mut d) = created_with(90, 40, t0, staggered());
    // A burst from idle: spread over the free slots.
    let first = first_wave(&mut t, &mut d, t0);
    assert_eq!(first.len(), 3);
    // Every address is replaced while that wave is in flight (steady churn piling up).
    set_all(&mut t, &all_replaced());
    d.take_changes(&mut t, t0 + std::time::Duration::from_millis(50));
    for u in &first {
        d.on_report(&mut t, 1, applied(u.work_id), at);
    }
    // The slots are free, but the 7,200 changes did not begin from idle: one unit up to the bound
    // and the rest at once (a unit that left work behind is not held), not four that end together.
    assert_eq!(wave(&mut t, &mut d, 7..12, at), vec![5_000, 2_200]);
}

#[test]
fn a_trickle_from_idle_is_not_held_past_its_first_quiet_interval() {
    let (mut t, mut d, t0) = programmed_gathering(10);
    let ms = |n: u64| t0 + std::time::Duration::from_millis(n);
    // Long after, steady churn starts: a change every 5 ms, a few addresses each.
    t.set_endpoints("svc", &moved(1)).unwrap();
    assert!(d.next_unit(&mut t, 1, 4, ms(100)).is_none(), "gathering");
    t.set_endpoints("svc", &moved(2)).unwrap();
    assert!(
        d.next_unit(&mut t, 1, 4, ms(105)).is_none(),
        "within its first quiet interval"
    );
    assert_eq!(d.next_deadline(ms(105)), Some(ms(110)), "woken to weigh it");
    t.set_endpoints("svc", &moved(3)).unwrap();
    // 6 addresses in the first 10 ms: a trickle, cut although the changes keep coming (the
    // linger would have held them until 200 ms).
    let u = d.next_unit(&mut t, 1, 4, ms(110)).expect("a trickle goes");
    assert_eq!(u.work.len(), 3);
}

/// The endpoints of `created_with(90, 40, ..)` with the addresses of locations `from..=to`
/// replaced by new ones at the same location (80 changes a location).
fn replaced(from: u32, to: u32) -> Vec<(String, String)> {
    endpoints(90, 40, |l, _| (from..=to).contains(&l))
}

#[test]
fn a_late_turn_takes_what_had_built_up_by_its_time_and_keeps_the_schedule() {
    let t0 = Instant::now();
    let ms = |n: u64| t0 + std::time::Duration::from_millis(n);
    let (mut t, mut d) = created_with(90, 40, t0, staggered());
    let first = first_wave(&mut t, &mut d, t0);
    for u in &first {
        d.on_report(&mut t, 1, applied(u.work_id), ms(200));
    }
    // Steady churn: a location moves every 60 ms, each in its turn (headway 200 / 4 × 1.2).
    let mut out = Vec::new();
    for (k, at) in [(1, 200), (2, 260), (3, 320), (4, 380)] {
        set_all(&mut t, &replaced(1, k));
        out.push(
            d.next_unit(&mut t, 1, 10 + u64::from(k), ms(at))
                .expect("its turn"),
        );
    }
    // Then 60 locations move (4,800 changes). The turn due at 440 finds every slot busy; the
    // first slot frees at 470, and the unit then takes what had built up by its turn: the
    // backlog in proportion to the time (the headway over the time since the last turn), not
    // all of it.
    set_all(&mut t, &replaced(1, 64));
    assert!(
        d.next_unit(&mut t, 1, 20, ms(440)).is_none(),
        "every slot busy"
    );
    d.on_report(&mut t, 1, applied(out[0].work_id), ms(470));
    // The estimate is now 0.8 × 200 + 0.2 × 270 = 214 ms: a headway of 64.2 ms.
    let headway = 64.2;
    assert_eq!(d.ready_backlog(&t, ms(470), usize::MAX), 4_800);
    let late = wave(&mut t, &mut d, 20..22, ms(470));
    let expected = 4_800.0 * headway / (470.0 - 380.0);
    assert_eq!(late.len(), 1, "{late:?}");
    assert!(
        (late[0] as f64 - expected).abs() <= 1.0,
        "{late:?}, expected {expected}"
    );
    // The rest waits for the next turn, a headway after the one due (444.2 ms), though a slot
    // frees before it: with the estimate at 219.2 ms, at 509.96 ms.
    d.on_report(&mut t, 1, applied(out[1].work_id), ms(500));
    assert!(
        d.next_unit(&mut t, 1, 22, ms(509)).is_none(),
        "held for its turn"
    );
    assert_eq!(wave(&mut t, &mut d, 22..24, ms(510)), vec![4_800 - late[0]]);
}

/// The endpoints of `created_with(10, 40, ..)` with the first `replaced[l - 1]` addresses of
/// location `l` replaced by new ones (2 changes a location for each).
fn replaced_at(replaced: &[u32; 10]) -> Vec<(String, String)> {
    endpoints(10, 40, |l, p| p <= replaced[l as usize - 1])
}

/// The locations a location unit carries.
fn locations_of(u: &Unit) -> Vec<IpAddr> {
    match &u.work {
        UnitWork::Locations(diffs) => diffs.iter().map(|d| d.location).collect(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn units_cut_short_take_turns_over_the_locations() {
    let now = Instant::now();
    let config = DispatchConfig {
        max_addresses_per_unit: 6,
        ..DispatchConfig::unbatched()
    };
    let (mut t, mut d) = created_with(10, 40, now, config);
    let first = d
        .next_unit(&mut t, 1, 3, now)
        .expect("the first programming");
    d.on_report(&mut t, 1, applied(first.work_id), now);
    let mut id = 4;
    while let Some(u) = d.next_unit(&mut t, 1, id, now) {
        d.on_report(&mut t, 1, applied(u.work_id), now);
        id += 1;
    }
    assert!(t.pending_diff().locations.is_empty(), "all programmed");
    // Every location changes (2 addresses each): 4 units of at most 6 addresses hold the 4 slots.
    let mut replaced = [1u32; 10];
    set_all(&mut t, &replaced_at(&replaced));
    let wave: Vec<Unit> = (20..24)
        .map_while(|id| d.next_unit(&mut t, 1, id, now))
        .collect();
    assert_eq!(wave.len(), 4);
    // The first ends; the locations of the other three change again, beside what is in flight.
    d.on_report(&mut t, 1, applied(wave[0].work_id), now);
    let done = locations_of(&wave[0]);
    let again = |replaced: &mut [u32; 10]| {
        for l in 1..=10u8 {
            if !done.contains(&IpAddr::from([10, 0, 0, l])) {
                replaced[l as usize - 1] += 1;
            }
        }
    };
    again(&mut replaced);
    set_all(&mut t, &replaced_at(&replaced));
    let e = locations_of(&d.next_unit(&mut t, 1, 24, now).expect("a unit"));
    // The second ends and they change once more. What the last unit served (in flight, and
    // pending still) goes behind what it did not reach: the next unit takes other locations, not
    // the same ones first again.
    d.on_report(&mut t, 1, applied(wave[1].work_id), now);
    again(&mut replaced);
    set_all(&mut t, &replaced_at(&replaced));
    let f = locations_of(&d.next_unit(&mut t, 1, 25, now).expect("a unit"));
    assert!(f.iter().all(|l| !e.contains(l)), "{e:?} then {f:?}");
}
