//! The port book and the frontends: how reports, read-backs and writers' ports move them (these
//! tests lived beside the state server's `Gateway` before its rules moved here).

use std::time::{Duration, Instant};

use super::lb::port_set;
use super::*;
use clb_core::difftracker::{ActualSnapshot, Operation};
use clb_core::dispatch::{Outcome, Report, UnitWork};

fn gateway() -> GatewayCore {
    let config = GatewayConfig {
        expected_writers: Vec::new(),
        resync_wait: Duration::from_secs(180),
        dispatch: DispatchConfig::unbatched(),
    };
    GatewayCore::new(
        "gw".into(),
        &config,
        DispatchEnv::new(Instant::now(), 1_700_000_000_000, 7),
    )
}

/// The state server's former entry point, kept for these tests: a report with its frontends and
/// rules.
trait OnReport {
    fn on_report(
        &mut self,
        worker: u64,
        report: Report,
        frontends: Vec<(String, String)>,
        rules: Vec<(String, LbSpec)>,
        now: Instant,
    ) -> bool;
}

impl OnReport for GatewayCore {
    fn on_report(
        &mut self,
        worker: u64,
        report: Report,
        frontends: Vec<(String, String)>,
        rules: Vec<(String, LbSpec)>,
        now: Instant,
    ) -> bool {
        self.take_report(
            worker,
            report,
            ReportExtras {
                frontends,
                rules,
                ..ReportExtras::default()
            },
            now,
        )
    }
}

fn frontends(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(s, ip)| (s.to_string(), ip.to_string()))
        .collect()
}

fn observed(work_id: u64, load_balancers: &[&str], last: bool) -> Report {
    Report {
        refused: Vec::new(),
        work_id,
        applied: Vec::new(),
        progress: Vec::new(),
        outcome: Outcome::Observed {
            snapshot: ActualSnapshot {
                load_balancers: load_balancers.iter().map(|s| s.to_string()).collect(),
                ..ActualSnapshot::default()
            },
            last,
        },
    }
}

#[test]
fn an_observe_replaces_the_frontends_with_the_union_of_its_parts_at_the_last_part() {
    let mut g = gateway();
    g.tracker.update_service(Operation::Add, "a").unwrap();
    g.tracker.update_service(Operation::Add, "b").unwrap();
    g.frontends.insert("old".into(), "20.0.0.1".into());
    let now = Instant::now();
    let unit = g.dispatch.next_unit(&mut g.tracker, 1, 7, now).unwrap();
    assert_eq!(unit.work, UnitWork::Observe);
    // Another worker's report, or one for another unit, is ignored.
    assert!(!g.on_report(
        2,
        observed(7, &[], true),
        frontends(&[("a", "x")]),
        Vec::new(),
        now
    ));
    assert!(!g.on_report(
        1,
        observed(8, &[], true),
        frontends(&[("a", "x")]),
        Vec::new(),
        now
    ));
    let part = frontends(&[("a", "20.0.0.2")]);
    assert!(g.on_report(1, observed(7, &["a", "b"], false), part, Vec::new(), now));
    assert_eq!(
        g.frontends,
        HashMap::from([("old".to_string(), "20.0.0.1".to_string())]),
        "nothing changes before the last part"
    );
    let part = frontends(&[("b", "20.0.0.3")]);
    assert!(g.on_report(1, observed(7, &[], true), part, Vec::new(), now));
    assert_eq!(
        g.frontends,
        HashMap::from([
            ("a".to_string(), "20.0.0.2".to_string()),
            ("b".to_string(), "20.0.0.3".to_string()),
        ])
    );
    assert!(g.dispatch.nrp_observed());
    // The parts of an observe that was given up do not leak into the next one.
    g.dispatch.request_observe();
    let unit = g.dispatch.next_unit(&mut g.tracker, 1, 9, now).unwrap();
    assert_eq!(unit.work, UnitWork::Observe);
    let part = frontends(&[("a", "20.0.0.4")]);
    assert!(g.on_report(1, observed(9, &["a", "b"], false), part, Vec::new(), now));
    g.dispatch.release_worker(1, now);
    g.dispatch.request_observe();
    let unit = g
        .dispatch
        .next_unit(&mut g.tracker, 1, 10, now + Duration::from_secs(60));
    assert_eq!(unit.map(|u| u.work), Some(UnitWork::Observe));
    assert!(g.on_report(
        1,
        observed(10, &["a", "b"], true),
        Vec::new(),
        Vec::new(),
        now
    ));
    assert!(g.frontends.is_empty(), "{:?}", g.frontends);
}

/// A load balancer as a read-back that did not report its settings has it.
fn read(ports: Vec<Port>) -> LbSpec {
    LbSpec {
        ports,
        settings: None,
    }
}

fn ports(list: &[(Protocol, u32)]) -> Vec<Port> {
    list.iter()
        .map(|&(protocol, port)| Port {
            port,
            protocol,
            target_port: 0,
        })
        .collect()
}

#[test]
fn port_sets_compare_the_effective_target_port() {
    use Protocol::Tcp;
    let with_target = |target_port| {
        vec![Port {
            port: 80,
            protocol: Tcp,
            target_port,
        }]
    };
    // 0 is the port itself: the same rule as an explicit 80.
    assert_eq!(port_set(&with_target(0)), port_set(&with_target(80)));
    assert_eq!(port_set(&with_target(0)), port_set(&ports(&[(Tcp, 80)])));
    assert_ne!(port_set(&with_target(0)), port_set(&with_target(8080)));
    assert_ne!(port_set(&with_target(8080)), port_set(&with_target(8081)));
    assert!(with_target(65_535)[0].programmable());
    assert!(!with_target(65_536)[0].programmable());
}

#[test]
fn observed_rules_create_again_only_a_desired_service_read_back_with_other_ports() {
    use Protocol::{Tcp, Udp};
    let unspecified = Protocol::Other(0);
    let mut g = gateway();
    let now = Instant::now();
    g.tracker.update_service(Operation::Add, "a").unwrap();
    g.service_specs
        .insert("a".into(), LbSpec::ports(ports(&[(Tcp, 80)])));
    let unit = g.dispatch.next_unit(&mut g.tracker, 1, 7, now).unwrap();
    assert_eq!(unit.work, UnitWork::Observe);
    // A creation of `a` is in flight (with the desired ports): its report decides.
    let unit = g.dispatch.next_unit(&mut g.tracker, 1, 6, now).unwrap();
    let UnitWork::Services(changes) = &unit.work else {
        panic!("{:?}", unit.work)
    };
    assert_eq!(g.spec_for(&changes[0]), LbSpec::ports(ports(&[(Tcp, 80)])));
    for s in ["b", "c", "d"] {
        g.tracker.update_service(Operation::Add, s).unwrap();
        g.service_specs
            .insert(s.into(), LbSpec::ports(ports(&[(Tcp, 80)])));
    }
    g.service_specs
        .insert("c".into(), LbSpec::ports(ports(&[(unspecified, 80)])));
    let before = g.tracker.revision();
    let rules = vec![
        ("a".to_string(), read(ports(&[(Tcp, 1)]))),
        ("c".to_string(), read(ports(&[(Tcp, 1)]))),
        ("d".to_string(), read(ports(&[(Tcp, 80), (Tcp, 80)]))),
        ("gone".to_string(), read(ports(&[(Tcp, 1)]))),
    ];
    let lbs = ["a", "b", "c", "d"];
    assert!(g.on_report(1, observed(7, &lbs, true), Vec::new(), rules, now));
    assert_eq!(
        g.tracker.revision(),
        before,
        "in flight (a), no rules read (b), unprogrammable (c), the same (d): nothing to do"
    );
    assert!(!g.programmed.contains_key("a"));
    assert!(!g.programmed.contains_key("b"));
    assert!(!g.programmed.contains_key("gone"), "not in NRP");
    assert_eq!(g.programmed["c"].ports, ports(&[(Tcp, 1)]));

    // b's rules read back, with another protocol: b is created again (and only b).
    g.dispatch.request_observe();
    let unit = g.dispatch.next_unit(&mut g.tracker, 1, 8, now).unwrap();
    assert_eq!(unit.work, UnitWork::Observe);
    let rules = vec![("b".to_string(), read(ports(&[(Udp, 80)])))];
    assert!(g.on_report(1, observed(8, &lbs, true), Vec::new(), rules, now));
    assert!(g.tracker.revision() > before, "b is created again");
}
/// Found by fault seeds 577789694, 269131352 and 550532718: a creation that NRP applied but
/// whose report said "unconfirmed" left its ports marked as in flight for good, so observes
/// skipped the service's rules and a later port change was never sent.
#[test]
fn an_unconfirmed_creation_does_not_hide_the_rules_read_back() {
    use Protocol::Tcp;
    let mut g = gateway();
    let now = Instant::now();
    g.tracker.update_service(Operation::Add, "a").unwrap();
    g.service_specs
        .insert("a".into(), LbSpec::ports(ports(&[(Tcp, 80)])));
    let unit = g.dispatch.next_unit(&mut g.tracker, 1, 1, now).unwrap();
    assert_eq!(unit.work, UnitWork::Observe);
    assert!(g.on_report(1, observed(1, &[], true), Vec::new(), Vec::new(), now));
    let unit = g.dispatch.next_unit(&mut g.tracker, 1, 2, now).unwrap();
    let UnitWork::Services(changes) = &unit.work else {
        panic!("{:?}", unit.work)
    };
    g.spec_for(&changes[0]);
    let unconfirmed = Report {
        refused: Vec::new(),
        work_id: 2,
        applied: Vec::new(),
        progress: Vec::new(),
        outcome: Outcome::Repair {
            retry_after: Duration::ZERO,
            code: "OperationUnconfirmed".into(),
            message: "accepted, not followed to its end".into(),
            refused: false,
        },
    };
    assert!(g.on_report(1, unconfirmed, Vec::new(), Vec::new(), now));
    // NRP did create it; the read-back finds it with the ports sent.
    let later = now + Duration::from_secs(60);
    let unit = g.dispatch.next_unit(&mut g.tracker, 1, 3, later).unwrap();
    assert_eq!(unit.work, UnitWork::Observe);
    let rules = vec![("a".to_string(), read(ports(&[(Tcp, 80)])))];
    assert!(g.on_report(1, observed(3, &["a"], true), Vec::new(), rules, later));
    assert!(
        g.tracker.service_view("a").is_some_and(|v| v.actual),
        "in NRP"
    );
    assert_eq!(
        g.programmed.get("a").map(|s| &s.ports),
        Some(&ports(&[(Tcp, 80)]))
    );
    // The port changes: the service is created again.
    let before = g.tracker.revision();
    g.spec_desired("a", Some(LbSpec::ports(ports(&[(Tcp, 1000)]))));
    assert!(g.tracker.revision() > before, "a is created again");
}

/// Issue 33: a change of a load balancer's settings (not only of its ports) creates the service
/// again, both when a writer changes it and when a read-back finds NRP's settings other than the
/// desired ones; a read-back that matches them changes nothing.
#[test]
fn settings_that_differ_from_the_programmed_ones_create_the_service_again() {
    use Protocol::Tcp;
    let mut g = gateway();
    let now = Instant::now();
    g.tracker.update_service(Operation::Add, "a").unwrap();
    let desired = LbSpec {
        ports: ports(&[(Tcp, 80)]),
        settings: Some(LbSettings {
            idle_timeout_minutes: 15,
            ..LbSettings::default()
        }),
    };
    g.spec_desired("a", Some(desired.clone()));
    let unit = g.dispatch.next_unit(&mut g.tracker, 1, 1, now).unwrap();
    assert_eq!(unit.work, UnitWork::Observe);
    assert!(g.on_report(1, observed(1, &["a"], true), Vec::new(), Vec::new(), now));
    // NRP has it with the desired settings: nothing to do.
    g.dispatch.request_observe();
    let unit = g.dispatch.next_unit(&mut g.tracker, 1, 2, now).unwrap();
    assert_eq!(unit.work, UnitWork::Observe);
    let before = g.tracker.revision();
    let same = vec![("a".to_string(), desired.clone())];
    assert!(g.on_report(1, observed(2, &["a"], true), Vec::new(), same, now));
    assert_eq!(g.tracker.revision(), before);
    // A read-back finds the idle timeout changed out of band: created again.
    g.dispatch.request_observe();
    let unit = g.dispatch.next_unit(&mut g.tracker, 1, 3, now).unwrap();
    assert_eq!(unit.work, UnitWork::Observe);
    let drifted = LbSpec {
        settings: Some(LbSettings::default()),
        ..desired.clone()
    };
    let rules = vec![("a".to_string(), drifted)];
    assert!(g.on_report(1, observed(3, &["a"], true), Vec::new(), rules, now));
    assert!(g.tracker.revision() > before, "drift repaired");
    // Programmed as desired again; then the writer asks for affinity: created again.
    g.programmed.insert("a".into(), desired.clone());
    let before = g.tracker.revision();
    g.spec_desired("a", Some(desired.clone()));
    let affinity = LbSpec {
        settings: Some(LbSettings {
            idle_timeout_minutes: 15,
            source_ip_affinity: true,
            ..LbSettings::default()
        }),
        ..desired
    };
    g.spec_desired("a", Some(affinity));
    assert!(
        g.tracker.revision() > before,
        "created again for the new settings"
    );
}

#[test]
fn a_creation_confirmed_during_an_observe_keeps_its_frontend() {
    let mut g = gateway();
    let now = Instant::now();
    let unit = g.dispatch.next_unit(&mut g.tracker, 1, 1, now).unwrap();
    assert_eq!(unit.work, UnitWork::Observe);
    assert!(g.on_report(1, observed(1, &[], true), Vec::new(), Vec::new(), now));
    g.tracker.update_service(Operation::Add, "a").unwrap();
    let create = g.dispatch.next_unit(&mut g.tracker, 1, 2, now).unwrap();
    assert!(matches!(create.work, UnitWork::Services(_)));
    // An observe is cut while the creation is under way; the creation is confirmed with its
    // frontend; then the observe's snapshot, read before the creation, comes.
    g.dispatch.request_observe();
    let unit = g.dispatch.next_unit(&mut g.tracker, 1, 3, now).unwrap();
    assert_eq!(unit.work, UnitWork::Observe);
    let created = Report {
        refused: Vec::new(),
        work_id: 2,
        applied: Vec::new(),
        progress: Vec::new(),
        outcome: Outcome::Applied,
    };
    let ip = frontends(&[("a", "20.0.0.9")]);
    assert!(g.on_report(1, created, ip, Vec::new(), now));
    assert!(g.on_report(1, observed(3, &[], true), Vec::new(), Vec::new(), now));
    assert!(g.tracker.service_view("a").is_some_and(|v| v.actual));
    assert_eq!(g.frontends.get("a").map(String::as_str), Some("20.0.0.9"));
}
