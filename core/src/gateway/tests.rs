//! The gateway's rules without a runtime, as a driver uses them: apply → lease → report →
//! converged; the port book; deadlines.

use std::time::{Duration, Instant};

use super::*;
use crate::difftracker::{ActualSnapshot, Endpoint, Operation};
use crate::dispatch::{Outcome, Report, UnitWork};

fn config() -> GatewayConfig {
    GatewayConfig {
        expected_writers: Vec::new(),
        resync_wait: Duration::from_secs(180),
        dispatch: DispatchConfig {
            lease: Duration::from_secs(30),
            ..DispatchConfig::unbatched()
        },
    }
}

fn gateway(t0: Instant) -> GatewayCore {
    GatewayCore::new(
        "gw".into(),
        &config(),
        DispatchEnv::new(t0, 1_700_000_000_000, 7),
    )
}

fn tcp(port: u32) -> Port {
    Port {
        protocol: Protocol::Tcp,
        port,
        target_port: 0,
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

/// The watcher's view: one inbound service with two endpoints at one location, port 80.
fn apply_view(g: &mut GatewayCore) {
    g.tracker_mut()
        .update_service(Operation::Add, "svc")
        .unwrap();
    g.spec_desired("svc", Some(LbSpec::ports(vec![tcp(80)])));
    g.tracker_mut()
        .set_endpoints(
            "svc",
            &[
                Endpoint {
                    address: "10.1.0.1",
                    location: "10.0.0.1",
                },
                Endpoint {
                    address: "10.1.0.2",
                    location: "10.0.0.1",
                },
            ],
        )
        .unwrap();
    g.record_writes("watcher", 3, 0);
}

/// Leases units to worker 1 and answers each as NRP accepting it, until nothing is left.
fn drain(g: &mut GatewayCore, now: Instant, next_id: &mut u64) -> Vec<UnitWork> {
    let mut seen = Vec::new();
    while let Some(leased) = g.lease(1, *next_id, now) {
        *next_id += 1;
        let outcome = match leased.unit.work {
            UnitWork::Observe => Outcome::Observed {
                snapshot: ActualSnapshot::default(),
                last: true,
            },
            _ => Outcome::Applied,
        };
        let extras = match &leased.unit.work {
            UnitWork::Services(_) => ReportExtras {
                frontends: vec![("svc".into(), "20.0.0.1".into())],
                rules: vec![],
                ..ReportExtras::default()
            },
            _ => ReportExtras::default(),
        };
        assert!(g.take_report(1, report(leased.unit.work_id, outcome), extras, now));
        seen.push(leased.unit.work);
    }
    seen
}

fn converged(g: &GatewayCore) -> bool {
    let diff = g.tracker().pending_diff();
    diff.locations.is_empty() && diff.services.is_empty() && g.dispatch().units_in_flight() == 0
}

#[test]
fn apply_lease_report_converges_and_the_creation_carries_the_desired_ports() {
    let t0 = Instant::now();
    let mut g = gateway(t0);
    apply_view(&mut g);
    let (_, dropped) = g.resync_scope_completed("watcher", &Scope::ALL, None, t0, 1);
    assert_eq!(dropped, 0);
    assert!(g.writers()["watcher"].last_resync_unix_ms.is_some());

    // The observe first, then the creation with its ports.
    let observe = g.lease(1, 1, t0).expect("an observe first");
    assert_eq!(observe.unit.work, UnitWork::Observe);
    assert!(g.take_report(
        1,
        report(
            1,
            Outcome::Observed {
                snapshot: ActualSnapshot::default(),
                last: true
            }
        ),
        ReportExtras::default(),
        t0,
    ));
    let create = g.lease(1, 2, t0).expect("the service's creation");
    assert!(matches!(create.unit.work, UnitWork::Services(_)));
    assert_eq!(create.specs, vec![LbSpec::ports(vec![tcp(80)])]);
    assert!(g.take_report(
        1,
        report(2, Outcome::Applied),
        ReportExtras {
            frontends: vec![("svc".into(), "20.0.0.1".into())],
            rules: vec![],
            ..ReportExtras::default()
        },
        t0,
    ));
    assert_eq!(g.frontend("svc"), Some("20.0.0.1"));

    let mut next = 3;
    let rest = drain(&mut g, t0, &mut next);
    assert!(
        rest.iter().all(|w| matches!(w, UnitWork::Locations(_))),
        "{rest:?}"
    );
    assert!(converged(&g));
    // A report for a unit nobody holds is refused.
    assert!(!g.take_report(
        1,
        report(999, Outcome::Applied),
        ReportExtras::default(),
        t0
    ));
}

#[test]
fn a_port_change_creates_the_service_again_with_the_new_ports() {
    let t0 = Instant::now();
    let mut g = gateway(t0);
    apply_view(&mut g);
    g.resync_completed("watcher", t0, 1);
    let mut next = 1;
    drain(&mut g, t0, &mut next);
    assert!(converged(&g));

    g.spec_desired("svc", Some(LbSpec::ports(vec![tcp(80), tcp(443)])));
    let again = g.lease(1, next, t0).expect("the service is created again");
    match &again.unit.work {
        UnitWork::Services(changes) => {
            assert_eq!(changes.len(), 1);
            assert_eq!(changes[0].name, "svc");
        }
        other => panic!("expected a services unit, got {other:?}"),
    }
    assert_eq!(again.specs, vec![LbSpec::ports(vec![tcp(80), tcp(443)])]);
    // The same ports in another order, or a target port equal to the port, change nothing.
    assert!(g.take_report(
        1,
        report(next, Outcome::Applied),
        ReportExtras::default(),
        t0
    ));
    g.spec_desired(
        "svc",
        Some(LbSpec::ports(vec![
            Port {
                target_port: 443,
                ..tcp(443)
            },
            tcp(80),
        ])),
    );
    assert!(g.lease(1, next + 1, t0).is_none(), "nothing to do");
}

#[test]
fn the_next_deadline_is_the_lease_and_a_tick_then_takes_the_unit_back() {
    let t0 = Instant::now();
    let mut g = gateway(t0);
    apply_view(&mut g);
    g.resync_completed("watcher", t0, 1);
    // Nothing leased: time alone changes nothing (the restart gate's bound is not running: the
    // cluster view came, NRP was not read back yet).
    assert_eq!(g.next_deadline(t0), None);
    let observe = g.lease(1, 1, t0).unwrap();
    let lease = config().dispatch.lease;
    assert_eq!(g.next_deadline(t0), Some(t0 + lease));
    assert!(g.tick(t0 + lease / 2).is_empty(), "not yet");
    let expired = g.tick(t0 + lease);
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].work_id, observe.unit.work_id);
    assert!(!g.holds(observe.unit.work_id));
    // The observe is leased again, to another worker.
    let again = g.lease(2, 2, t0 + lease).unwrap();
    assert_eq!(again.unit.work, UnitWork::Observe);
}

#[test]
fn a_burst_of_writes_is_gathered_into_one_wave_and_the_deadline_says_when() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut g = GatewayCore::new(
        "gw".into(),
        &GatewayConfig {
            dispatch: DispatchConfig {
                max_mutating_units_in_flight: 4,
                batch_quiet: ms(10),
                batch_linger: ms(100),
                ..DispatchConfig::default()
            },
            ..config()
        },
        DispatchEnv::new(t0, 1_700_000_000_000, 7),
    );
    apply_view(&mut g);
    g.resync_completed("watcher", t0, 1);
    let mut next = 1;
    // The first endpoints go once the writes went quiet (10 ms); then the service is in NRP.
    drain(&mut g, t0, &mut next);
    drain(&mut g, t0 + ms(10), &mut next);
    assert!(converged(&g));

    // A burst: one location more every half millisecond, as a rollout streams in, 100
    // addresses each (not a trickle: 2,000 addresses in its first quiet interval of 10 ms).
    let us = Duration::from_micros;
    let mut endpoints: Vec<(String, String)> = Vec::new();
    let mut now = t0;
    for n in 0..150u64 {
        now = t0 + ms(40) + us(500 * n);
        endpoints.extend((1..=100).map(|p| (format!("10.2.{n}.{p}"), format!("10.0.1.{n}"))));
        let eps: Vec<Endpoint> = endpoints
            .iter()
            .map(|(a, l)| Endpoint {
                address: a,
                location: l,
            })
            .collect();
        g.tracker_mut().set_endpoints("svc", &eps).unwrap();
        g.tick(now);
        assert!(g.lease(1, next, now).is_none(), "gathering at change {n}");
        let deadline = g.next_deadline(now).expect("a deadline");
        assert!(deadline > now && deadline <= now + ms(10), "quiet ends it");
    }
    // Quiet: the burst goes as one wave over the free slots, in even shares of addresses (15,000
    // addresses: 4 units of 3,750; a location's first programming is not split).
    let quiet = now + ms(10);
    g.tick(quiet);
    let mut wave = Vec::new();
    while let Some(leased) = g.lease(1, next, quiet) {
        next += 1;
        wave.push(leased.unit.work.len());
    }
    // 150 new locations, and the first one, whose endpoints the new set no longer names.
    assert_eq!(wave, vec![38, 37, 38, 38]);
}

/// A follower is owed each first answer, then only the answers that changed: a location is
/// programmed once NRP has every address desired there, an address once NRP has it with its
/// service (any case).
#[test]
fn awaiting_owes_first_answers_then_only_changes() {
    use super::programmed::{Awaited, Awaiting};
    let t0 = Instant::now();
    let mut g = gateway(t0);
    let location: std::net::IpAddr = "10.0.0.1".parse().unwrap();
    let address = |a: &str, service: &str| Awaited::Address {
        location,
        address: a.parse().unwrap(),
        service: service.into(),
    };
    let mut awaiting = Awaiting::default();
    awaiting.watch(Awaited::Location(location));
    awaiting.watch(address("10.1.0.1", "SVC"));
    awaiting.watch(address("10.1.0.9", "svc"));
    awaiting.watch(Awaited::Location(location));
    assert_eq!(awaiting.len(), 3);
    // Nothing desired yet: the location is programmed, no address is.
    assert!(awaiting.refresh(&g));
    assert_eq!(
        awaiting.take_owed(),
        [
            (Awaited::Location(location), true),
            (address("10.1.0.1", "SVC"), false),
            (address("10.1.0.9", "svc"), false),
        ]
    );
    assert!(!awaiting.refresh(&g), "nothing changed");
    apply_view(&mut g);
    assert!(awaiting.refresh(&g));
    assert_eq!(awaiting.take_owed(), [(Awaited::Location(location), false)]);
    awaiting.unwatch(&Awaited::Location(location));
    drain(&mut g, t0, &mut 1);
    assert!(g.location_programmed(location));
    assert!(awaiting.refresh(&g));
    assert_eq!(awaiting.take_owed(), [(address("10.1.0.1", "SVC"), true)]);
    awaiting.unwatch(&address("10.1.0.1", "SVC"));
    awaiting.unwatch(&address("10.1.0.1", "SVC"));
    assert_eq!(awaiting.len(), 1);
    assert!(!awaiting.refresh(&g));
}

#[test]
fn the_views_answer_status_location_service_and_pending_whole() {
    use super::condition::ConditionReason;
    let t0 = Instant::now();
    let mut g = gateway(t0);
    apply_view(&mut g);
    g.resync_scope_completed("watcher", &Scope::ALL, None, t0, 1);

    // Nothing programmed yet: the creation (with its family) is pending.
    let p = g.pending(10);
    assert_eq!(p.revision, g.revision());
    assert_eq!(p.services.len(), 1);
    assert_eq!(
        (p.services[0].0.name.as_str(), p.services[0].1),
        ("svc", None)
    );
    assert!(!p.truncated && p.refused.is_empty());
    assert!(g.pending(0).truncated);
    let s = g.service_status("SVC").expect("any case");
    assert!(s.view.desired && !s.view.actual);
    assert_eq!(s.ports, vec![tcp(80)]);
    assert_eq!((s.frontend.as_deref(), s.actual_locations), (None, Some(0)));
    assert!(s.egress.is_none());
    assert_eq!(
        s.condition.map(|c| c.reason),
        Some(ConditionReason::Pending)
    );
    assert!(g.service_status("nobody").is_none());

    let mut next = 1;
    drain(&mut g, t0, &mut next);
    let s = g.service_status("svc").expect("known");
    assert!(s.view.actual);
    assert_eq!(s.frontend.as_deref(), Some("20.0.0.1"));
    assert_eq!(s.actual_locations, Some(1));
    assert_eq!(
        s.condition.map(|c| c.reason),
        Some(ConditionReason::Programmed)
    );
    // The light view (a stream of every service) neither scans nor derives the condition.
    let light = g.service_status_of(&s.view);
    assert!(light.actual_locations.is_none() && light.condition.is_none());
    assert_eq!(light.frontend, s.frontend);

    let l = g
        .location_status("10.0.0.1".parse().unwrap())
        .expect("desired");
    assert!(l.view.in_nrp && l.view.addresses.len() == 2 && l.refused.is_empty());
    assert!(g.location_status("10.9.9.9".parse().unwrap()).is_none());

    let status = g.status(t0, 10);
    assert_eq!(status.revision, g.revision());
    assert_eq!(status.counts.actual_addresses, 2);
    assert_eq!((status.units_in_flight, status.parked_units), (0, 0));
    assert!(status.gate.nrp_observed && status.refused.is_empty());
    let load = g.load(t0);
    assert_eq!(
        (load.counts, load.revision),
        (status.counts, status.revision)
    );
    assert_eq!(load.pacing, g.pacing());
    assert!(g.pending(10).services.is_empty());
}
