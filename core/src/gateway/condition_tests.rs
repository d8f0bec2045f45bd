//! How a service's condition is derived and gathered.

use std::time::{Duration, Instant};

use super::*;
use crate::difftracker::{Endpoint, Operation};
use crate::dispatch::{DispatchConfig, DispatchEnv, Outcome, Report, UnitWork};
use crate::gateway::GatewayConfig;

fn record(code: &str) -> ErrorRecord {
    ErrorRecord {
        at_unix_ms: 1_700_000_000_000,
        work_id: 7,
        worker: 1,
        unit: "locations 10.0.0.1".into(),
        code: code.into(),
        message: format!("{code} happened"),
        terminal: false,
    }
}

fn facts(desired: bool, actual: bool, ip: &str) -> ConditionFacts<'_> {
    ConditionFacts {
        inbound: true,
        desired,
        actual,
        frontend_ip: ip,
        desired_addresses: 2,
        actual_addresses: 2,
        pending: false,
        parked: None,
        failing: None,
        held: None,
    }
}

fn reason(c: &Condition) -> ConditionReason {
    c.reason
}

#[test]
fn the_condition_follows_the_desired_and_actual_state() {
    let c = derive_condition(&facts(true, true, "20.0.0.1"));
    assert_eq!(reason(&c), ConditionReason::Programmed);
    assert!(c.message.contains("20.0.0.1"), "{}", c.message);
    assert!(c.error_code.is_empty());
    for f in [
        facts(true, false, ""),
        facts(true, true, ""),
        facts(false, true, "20.0.0.1"),
        ConditionFacts {
            pending: true,
            ..facts(true, true, "20.0.0.1")
        },
        ConditionFacts {
            actual_addresses: 1,
            ..facts(true, true, "20.0.0.1")
        },
    ] {
        assert_eq!(
            reason(&derive_condition(&f)),
            ConditionReason::Pending,
            "{f:?}"
        );
    }
    assert_eq!(
        reason(&derive_condition(&facts(false, false, ""))),
        ConditionReason::Removed
    );
    // An egress has no frontend IP and is programmed without one.
    let egress = ConditionFacts {
        inbound: false,
        ..facts(true, true, "")
    };
    assert_eq!(
        reason(&derive_condition(&egress)),
        ConditionReason::Programmed
    );
}

#[test]
fn failures_come_first_rejected_before_retrying_before_held_back() {
    let parked = record("InvalidResourceName");
    let throttled = record("TooManyRequests");
    let other = record("InternalServerError");
    let l: IpAddr = "10.0.0.1".parse().unwrap();
    let held = HeldBack {
        location: Some(l),
        reason: "pod_writer",
        writer: Some("node-agent/a".into()),
    };
    let all = ConditionFacts {
        parked: Some(Failure {
            location: None,
            address: None,
            error: &parked,
        }),
        failing: Some(Failure {
            location: Some(l),
            address: None,
            error: &throttled,
        }),
        held: Some(held.clone()),
        pending: true,
        ..facts(true, true, "20.0.0.1")
    };
    let c = derive_condition(&all);
    assert_eq!(reason(&c), ConditionReason::Rejected);
    assert_eq!(c.error_code, "InvalidResourceName");
    assert_eq!(c.error_message, "InvalidResourceName happened");
    assert_eq!(c.error_at_unix_ms, 1_700_000_000_000);
    assert!(c.location.is_empty());
    assert!(c.message.contains("InvalidResourceName"), "{}", c.message);

    let c = derive_condition(&ConditionFacts {
        parked: None,
        ..all.clone()
    });
    assert_eq!(reason(&c), ConditionReason::Throttled);
    assert_eq!(c.error_code, "TooManyRequests");
    assert_eq!(c.location, "10.0.0.1");

    let c = derive_condition(&ConditionFacts {
        parked: None,
        failing: Some(Failure {
            location: None,
            address: None,
            error: &other,
        }),
        ..all.clone()
    });
    assert_eq!(reason(&c), ConditionReason::Retrying);
    assert_eq!(c.error_code, "InternalServerError");

    let c = derive_condition(&ConditionFacts {
        parked: None,
        failing: None,
        ..all.clone()
    });
    assert_eq!(reason(&c), ConditionReason::HeldBack);
    assert_eq!(c.held_for, "pod_writer");
    assert_eq!(c.held_for_writer, "node-agent/a");
    assert_eq!(c.location, "10.0.0.1");
    assert!(c.message.contains("node-agent/a"), "{}", c.message);
}

/// The facts are gathered from the dispatcher and the gate of a real gateway: a throttled
/// creation, then one NRP rejects for good, and removals held back by the restart gate.
#[test]
fn the_condition_is_gathered_from_the_dispatcher_and_the_gate() {
    let config = GatewayConfig {
        expected_writers: Vec::new(),
        resync_wait: Duration::from_secs(180),
        dispatch: DispatchConfig::unbatched(),
    };
    let mut core = GatewayCore::new(
        "gw".into(),
        &config,
        DispatchEnv::new(Instant::now(), 1_700_000_000_000, 7),
    );
    let g = &mut core;
    let svc = "3b0c0d4e-0000-4000-8000-00000000000a";
    g.tracker_mut().update_service(Operation::Add, svc).unwrap();
    g.tracker_mut()
        .set_endpoints(
            svc,
            &[Endpoint {
                address: "10.1.0.1",
                location: "10.0.0.1",
            }],
        )
        .unwrap();
    let condition = |g: &GatewayCore| {
        let view = g.tracker().service_view(svc).unwrap();
        g.service_condition(&view, "")
    };
    // Nothing read back, nothing sent yet.
    assert_eq!(reason(&condition(g)), ConditionReason::Pending);

    // NRP has a load balancer nobody wants any more.
    let old = "3b0c0d4e-0000-4000-8000-0000000000ff";
    let mut snapshot = clb_core::difftracker::ActualSnapshot::default();
    snapshot.load_balancers.push(old.into());
    let mut now = Instant::now();
    let observe = g.lease(1, 1, now).unwrap().unit;
    assert_eq!(observe.work, UnitWork::Observe);
    g.take_report(
        1,
        Report {
            refused: Vec::new(),
            work_id: 1,
            applied: vec![],
            progress: vec![],
            outcome: Outcome::Observed {
                snapshot,
                last: true,
            },
        },
        Default::default(),
        now,
    );
    g.update_gates(now);
    let fail = |g: &mut GatewayCore, id: u64, now: Instant, outcome: Outcome| {
        let unit = g.lease(1, id, now).unwrap().unit;
        assert!(
            matches!(unit.work, UnitWork::Services(_)),
            "{:?}",
            unit.work
        );
        g.take_report(
            1,
            Report {
                refused: Vec::new(),
                work_id: id,
                applied: vec![],
                progress: vec![],
                outcome,
            },
            Default::default(),
            now,
        );
    };
    fail(
        g,
        2,
        now,
        Outcome::Retryable {
            retry_after: Duration::from_millis(1),
            code: "TooManyRequests".into(),
            message: "slow down".into(),
        },
    );
    let c = condition(g);
    assert_eq!(reason(&c), ConditionReason::Throttled, "{c:?}");
    assert_eq!(c.error_code, "TooManyRequests");
    assert_eq!(c.error_message, "slow down");

    now += Duration::from_secs(60);
    fail(
        g,
        3,
        now,
        Outcome::Terminal {
            code: "InvalidResourceName".into(),
            message: "resource name is invalid".into(),
            changes: Vec::new(),
        },
    );
    let c = condition(g);
    assert_eq!(reason(&c), ConditionReason::Rejected, "{c:?}");
    assert_eq!(c.error_code, "InvalidResourceName");
    assert!(c.location.is_empty());

    // While the gate waits for the cluster view, the deletion of the unwanted one is held back.
    let view = g.tracker().service_view(old).unwrap();
    let c = g.service_condition(&view, "");
    assert_eq!(reason(&c), ConditionReason::HeldBack, "{c:?}");
    assert_eq!(c.held_for, "cluster_view");
    assert!(c.location.is_empty());
}

#[test]
fn an_address_refused_on_its_own_rejects_its_services_naming_it() {
    let config = GatewayConfig {
        expected_writers: Vec::new(),
        resync_wait: Duration::from_secs(180),
        dispatch: DispatchConfig::unbatched(),
    };
    let now = Instant::now();
    let mut g = GatewayCore::new(
        "gw".into(),
        &config,
        DispatchEnv::new(now, 1_700_000_000_000, 7),
    );
    let svc = "3b0c0d4e-0000-4000-8000-00000000000b";
    g.tracker_mut().update_service(Operation::Add, svc).unwrap();
    let ep = |address| Endpoint {
        address,
        location: "10.0.0.1",
    };
    g.tracker_mut()
        .set_endpoints(svc, &[ep("10.1.0.1"), ep("10.1.0.9")])
        .unwrap();
    let report = |work_id, refused| Report {
        refused,
        work_id,
        applied: vec![],
        progress: vec![],
        outcome: Outcome::Applied,
    };
    let observe = g.lease(1, 1, now).unwrap().unit;
    assert_eq!(observe.work, UnitWork::Observe);
    let observed = Report {
        outcome: Outcome::Observed {
            snapshot: Default::default(),
            last: true,
        },
        ..report(1, vec![])
    };
    g.take_report(1, observed, Default::default(), now);
    let created = g.lease(1, 2, now).unwrap().unit;
    assert!(matches!(created.work, UnitWork::Services(_)));
    g.take_report(1, report(2, vec![]), Default::default(), now);
    let unit = g.lease(1, 3, now).unwrap().unit;
    assert!(matches!(unit.work, UnitWork::Locations(_)));
    let refusal = clb_core::dispatch::AddressRefusal {
        index: 0,
        address: "10.1.0.9".parse().unwrap(),
        code: "BackendPoolAddressesMustHaveSameIpVersion".into(),
        message: "refused".into(),
    };
    g.take_report(1, report(3, vec![refusal]), Default::default(), now);
    let view = g.tracker().service_view(svc).unwrap();
    let c = g.service_condition(&view, "20.0.0.1");
    assert_eq!(reason(&c), ConditionReason::Rejected, "{c:?}");
    assert_eq!(c.error_code, "BackendPoolAddressesMustHaveSameIpVersion");
    assert_eq!(
        (c.location.as_str(), c.address.as_str()),
        ("10.0.0.1", "10.1.0.9")
    );
    assert!(
        c.message.contains("address 10.1.0.9 at location 10.0.0.1"),
        "{}",
        c.message
    );
    assert_eq!(view.actual_addresses, 1, "the rest of the location went");
    // The refused endpoint removed: no longer rejected, before the location is cut again.
    g.tracker_mut()
        .set_endpoints(svc, &[ep("10.1.0.1")])
        .unwrap();
    let view = g.tracker().service_view(svc).unwrap();
    let c = g.service_condition(&view, "20.0.0.1");
    assert_eq!(reason(&c), ConditionReason::Programmed, "{c:?}");
}

#[test]
fn held_removals_read_once_give_every_service_the_condition_it_gets_alone() {
    let config = GatewayConfig {
        expected_writers: Vec::new(),
        resync_wait: Duration::from_secs(180),
        dispatch: DispatchConfig::unbatched(),
    };
    let mut core = GatewayCore::new(
        "gw".into(),
        &config,
        DispatchEnv::new(Instant::now(), 1_700_000_000_000, 7),
    );
    let g = &mut core;
    let id = |i: usize| format!("3b0c0d4e-0000-4000-8000-{i:012}");
    let ip = |s: String| s.parse::<IpAddr>().unwrap();
    // NRP has 12 services over 4 locations; the cluster still wants 0..6, each without one of
    // the addresses NRP has with it, and 6..12 not at all: their removals are held back while the
    // gate waits for the cluster view.
    let mut snapshot = crate::difftracker::ActualSnapshot::default();
    for l in 0..4 {
        let addresses = (0..12)
            .map(|i| {
                (
                    ip(format!("10.1.{l}.{}", i + 1)),
                    vec![id(i), id((i + 5) % 12)],
                )
            })
            .collect();
        snapshot
            .locations
            .push((ip(format!("10.0.0.{}", l + 1)), addresses));
    }
    for i in 0..12 {
        snapshot.load_balancers.push(id(i));
    }
    for i in 0..6 {
        g.tracker_mut()
            .update_service(Operation::Add, &id(i))
            .unwrap();
        let address = format!("10.1.{}.{}", i % 4, i + 1);
        let location = format!("10.0.0.{}", i % 4 + 1);
        g.tracker_mut()
            .set_endpoints(
                &id(i),
                &[Endpoint {
                    address: &address,
                    location: &location,
                }],
            )
            .unwrap();
    }
    let now = Instant::now();
    let observe = g.lease(1, 1, now).unwrap().unit;
    assert_eq!(observe.work, UnitWork::Observe);
    g.take_report(
        1,
        Report {
            refused: Vec::new(),
            work_id: 1,
            applied: vec![],
            progress: vec![],
            outcome: Outcome::Observed {
                snapshot,
                last: true,
            },
        },
        Default::default(),
        now,
    );
    g.update_gates(now);
    let held = g.held_removals();
    let (mut held_back, mut at_a_location) = (0, 0);
    for i in 0..12 {
        let view = g.tracker().service_view(&id(i)).unwrap();
        let alone = g.service_condition(&view, "");
        assert_eq!(
            g.service_condition_among(&view, "", &held),
            alone,
            "service {i}"
        );
        if alone.reason == ConditionReason::HeldBack {
            held_back += 1;
            at_a_location += usize::from(!alone.location.is_empty());
        }
    }
    assert!(held_back >= 6, "{held_back} services held back");
    assert!(at_a_location >= 1, "no removal held back at a location");
}
