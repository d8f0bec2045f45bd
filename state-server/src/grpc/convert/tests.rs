//! Tests of `convert.rs`: writer input, worker traffic and reads, as proto.

use super::*;
use clb_core::difftracker::DiffTracker;
use clb_proto::v1::{EgressUpdate, EndpointEdge, EndpointSet, EndpointsUpdate, ServiceUpdate};

fn ep(address: &str, location: &str) -> v1::Endpoint {
    v1::Endpoint {
        address: address.into(),
        location: location.into(),
    }
}

fn level(service: &str, eps: Vec<v1::Endpoint>) -> Update {
    Update {
        kind: Some(Kind::Endpoints(EndpointsUpdate {
            service_id: service.into(),
            change: Some(Change::Level(EndpointSet { endpoints: eps })),
        })),
    }
}

fn pod(op: v1::Operation, address: &str, location: &str, egress: &str) -> Update {
    Update {
        kind: Some(Kind::Pod(v1::PodUpdate {
            operation: op as i32,
            address: address.into(),
            location: location.into(),
            egress_id: egress.into(),
            pod_key: "ns/p".into(),
            pod_uid: "uid-1".into(),
            ..Default::default()
        })),
    }
}

fn service(op: i32, id: &str, ports: Vec<ServicePort>) -> Update {
    Update {
        kind: Some(Kind::Service(ServiceUpdate {
            operation: op,
            service_id: id.into(),
            ports,
            ..Default::default()
        })),
    }
}

fn err(update: &Update, index: usize) -> ItemError {
    let mut t = DiffTracker::new();
    let e = apply_update(&mut t, update, index).unwrap_err();
    assert_eq!(t.revision(), 0, "a refused update changed the tracker");
    e
}

#[test]
fn valid_updates_are_applied() {
    let mut t = DiffTracker::new();
    let tcp = ServicePort {
        port: 80,
        protocol: v1::Protocol::Tcp as i32,
        target_port: 0,
    };
    apply_update(&mut t, &service(1, "Svc-A", vec![tcp]), 0).unwrap();
    apply_update(&mut t, &level("svc-a", vec![ep("10.1.0.1", "10.0.0.1")]), 1).unwrap();
    apply_update(
        &mut t,
        &pod(v1::Operation::Add, "10.1.0.2", "10.0.0.1", "eg"),
        2,
    )
    .unwrap();
    let egress = Update {
        kind: Some(Kind::Egress(EgressUpdate {
            operation: 1,
            egress_id: "eg2".into(),
        })),
    };
    apply_update(&mut t, &egress, 3).unwrap();
    let c = t.counts();
    assert_eq!(
        (c.desired_services, c.desired_egresses, c.desired_addresses),
        (1, 2, 2)
    );
}

#[test]
fn refusals_name_the_precise_field() {
    let e = err(&pod(v1::Operation::Add, "10.0.0.300", "10.0.0.1", ""), 3);
    assert_eq!((e.index, e.field.as_str()), (3, "updates[3].pod.address"));
    assert_eq!(e.value, "10.0.0.300");
    assert_eq!(e.reason, "is not an IPv4 or IPv6 address");

    let e = err(
        &level("svc", vec![ep("10.1.0.1", "10.0.0.1"), ep("10.1.0.2", "")]),
        2,
    );
    assert_eq!(e.field, "updates[2].endpoints.level.endpoints[1].location");
    assert_eq!(e.reason, "must not be empty");

    let e = err(
        &level(
            "svc",
            vec![ep("10.1.0.1", "10.0.0.1"), ep("10.1.0.1", "10.0.0.2")],
        ),
        0,
    );
    assert_eq!(e.field, "updates[0].endpoints.level.endpoints[1].address");
    assert_eq!(
        e.reason,
        "appears twice (first at updates[0].endpoints.level.endpoints[0].address)"
    );

    let e = err(&level("", vec![]), 1);
    assert_eq!(e.field, "updates[1].endpoints.service_id");

    let edge = Update {
        kind: Some(Kind::Endpoints(EndpointsUpdate {
            service_id: "svc".into(),
            change: Some(Change::Edge(EndpointEdge {
                old_endpoints: vec![],
                new_endpoints: vec![ep("fd00::1", "10.0.0.1")],
            })),
        })),
    };
    let e = err(&edge, 4);
    assert_eq!(
        e.field,
        "updates[4].endpoints.edge.new_endpoints[0].address"
    );
    assert!(
        e.reason.contains("IPv6 but its location 10.0.0.1 is IPv4"),
        "{}",
        e.reason
    );

    let e = err(&service(1, "", vec![]), 0);
    assert_eq!(
        (e.field.as_str(), e.reason.as_str()),
        ("updates[0].service.service_id", "must not be empty")
    );
}

#[test]
fn missing_oneofs_and_bad_enums_are_refused() {
    let e = err(&Update { kind: None }, 5);
    assert_eq!(
        (e.index, e.field.as_str(), e.value.as_str()),
        (5, "updates[5].kind", "")
    );

    let no_change = Update {
        kind: Some(Kind::Endpoints(EndpointsUpdate {
            service_id: "svc".into(),
            change: None,
        })),
    };
    assert_eq!(err(&no_change, 0).field, "updates[0].endpoints.change");

    let e = err(&service(0, "svc", vec![]), 0);
    assert_eq!(e.field, "updates[0].service.operation");
    assert_eq!(e.value, "OPERATION_UNSPECIFIED");
    let e = err(&service(7, "svc", vec![]), 0);
    assert_eq!(e.value, "7");
    assert!(e.reason.starts_with("unknown operation"));

    let bad_port = ServicePort {
        port: 70_000,
        protocol: 1,
        target_port: 0,
    };
    let e = err(&service(1, "svc", vec![bad_port]), 0);
    assert_eq!(e.field, "updates[0].service.ports[0].port");
    let no_proto = ServicePort {
        port: 80,
        protocol: 0,
        target_port: 0,
    };
    let e = err(&service(1, "svc", vec![no_proto]), 0);
    assert_eq!(e.field, "updates[0].service.ports[0].protocol");
    assert_eq!(e.value, "PROTOCOL_UNSPECIFIED");
    let tcp = ServicePort {
        port: 80,
        protocol: 1,
        target_port: 0,
    };
    let e = err(&service(1, "svc", vec![tcp, tcp]), 0);
    assert_eq!(e.field, "updates[0].service.ports[1]");
    let bad_target = ServicePort {
        port: 80,
        protocol: 1,
        target_port: 65_536,
    };
    let e = err(&service(1, "svc", vec![tcp, bad_target]), 0);
    assert_eq!(
        (e.field.as_str(), e.value.as_str()),
        ("updates[0].service.ports[1].target_port", "65536")
    );
    assert!(e.reason.contains("must be 1 to 65535"), "{}", e.reason);
    // 0 (the same as the port) and any port number are fine.
    for target_port in [0, 1, 8080, 65_535] {
        let p = ServicePort {
            port: 80,
            protocol: 1,
            target_port,
        };
        let mut t = DiffTracker::new();
        apply_update(&mut t, &service(1, "svc", vec![p]), 0).unwrap();
    }
    // Ports are ignored on removal.
    let mut t = DiffTracker::new();
    apply_update(&mut t, &service(2, "svc", vec![no_proto]), 0).unwrap();
}

#[test]
fn header_scopes_are_validated() {
    assert!(resync_scope(None).is_err());
    let empty = ResyncScope::default();
    assert_eq!(
        resync_scope(Some(&empty)).unwrap_err().field,
        "header.scope"
    );
    let loc_without_pods = ResyncScope {
        services: true,
        location: "10.0.0.1".into(),
        ..ResyncScope::default()
    };
    assert_eq!(
        resync_scope(Some(&loc_without_pods)).unwrap_err().field,
        "header.scope.location"
    );
    let bad_loc = ResyncScope {
        pods: true,
        location: "10.0.0.999".into(),
        ..ResyncScope::default()
    };
    let e = resync_scope(Some(&bad_loc)).unwrap_err();
    assert_eq!(
        (e.field.as_str(), e.value.as_str()),
        ("header.scope.location", "10.0.0.999")
    );
    let node = ResyncScope {
        pods: true,
        location: "10.0.0.1".into(),
        ..ResyncScope::default()
    };
    let s = resync_scope(Some(&node)).unwrap();
    assert_eq!(s.location, Some("10.0.0.1".parse::<IpAddr>().unwrap()));
    assert_eq!(s.to_string(), "pods at 10.0.0.1");
}

#[test]
fn long_values_are_cut_in_item_errors_and_messages() {
    let long = "x".repeat(1 << 20);
    let e = err(&pod(v1::Operation::Add, &long, "10.0.0.1", ""), 0);
    assert_eq!(e.field, "updates[0].pod.address");
    assert_eq!(
        e.value,
        format!(
            "{}… (1048576 bytes)",
            "x".repeat(difftracker::MAX_QUOTED_CHARS)
        )
    );
    let e = err(&service(1, &long, vec![]), 0);
    assert!(e.value.ends_with("… (1048576 bytes)"), "{}", e.value);
    assert!(e.reason.contains("1048576 characters long"), "{}", e.reason);

    let status = invalid_argument("id", &long, "is too long");
    assert!(status.message().len() < 200, "{}", status.message());
    assert!(
        status
            .message()
            .ends_with("…\" (1048576 bytes): is too long")
    );
    let status = unknown_gateway(&UnknownGateway(long.clone()));
    assert_eq!(status.code(), tonic::Code::NotFound);
    assert!(status.message().len() < 200, "{}", status.message());

    let header = resync_scope(Some(&ResyncScope {
        pods: true,
        location: long.clone(),
        ..ResyncScope::default()
    }))
    .unwrap_err();
    assert!(header.to_string().len() < 300, "{header}");

    // A worker's malformed observe: the message kept in status quotes an excerpt.
    let report = report_from_proto(v1::Report {
        work_id: 3,
        outcome: Some(v1::report::Outcome::Observed(v1::Observed {
            snapshot: Some(v1::NrpSnapshot {
                locations: vec![LocationChange {
                    location: long,
                    ..LocationChange::default()
                }],
                ..v1::NrpSnapshot::default()
            }),
            last: true,
        })),
        ..v1::Report::default()
    });
    let Outcome::Retryable { code, message, .. } = report.outcome else {
        panic!("{:?}", report.outcome)
    };
    assert_eq!(code, "InvalidReport");
    assert!(message.starts_with("observed.snapshot.locations[0].location = \"xxx"));
    assert!(message.len() < 300, "{message}");
}

#[test]
fn reports_convert_from_proto() {
    let applied = report_from_proto(v1::Report {
        work_id: 7,
        applied_indices: vec![1],
        outcome: Some(v1::report::Outcome::Applied(v1::Applied {})),
        ..v1::Report::default()
    });
    assert_eq!(
        applied,
        Report {
            work_id: 7,
            applied: vec![1],
            progress: vec![],
            refused: vec![],
            outcome: Outcome::Applied
        }
    );
    let retry = report_from_proto(v1::Report {
        work_id: 8,
        outcome: Some(v1::report::Outcome::Retryable(v1::Retryable {
            retry_after_ms: 1500,
            code: "TooManyRequests".into(),
            message: "slow down".into(),
        })),
        ..v1::Report::default()
    });
    assert_eq!(
        retry.outcome,
        Outcome::Retryable {
            retry_after: Duration::from_millis(1500),
            code: "TooManyRequests".into(),
            message: "slow down".into(),
        }
    );
    let parked = report_from_proto(v1::Report {
        work_id: 11,
        outcome: Some(v1::report::Outcome::Terminal(v1::Terminal {
            code: "NatGatewayNotFound".into(),
            message: "missing".into(),
            changes: vec![v1::ChangeError {
                index: 1,
                code: "NatGatewayNotStandardV2".into(),
                message: "Standard".into(),
            }],
        })),
        ..v1::Report::default()
    });
    assert_eq!(
        parked.outcome,
        Outcome::Terminal {
            code: "NatGatewayNotFound".into(),
            message: "missing".into(),
            changes: vec![clb_core::dispatch::ChangeError {
                index: 1,
                code: "NatGatewayNotStandardV2".into(),
                message: "Standard".into(),
            }],
        }
    );
    let missing = report_from_proto(v1::Report {
        work_id: 9,
        ..v1::Report::default()
    });
    assert!(matches!(missing.outcome, Outcome::Retryable { code, .. } if code == "InvalidReport"));

    let observed = v1::Report {
        work_id: 10,
        outcome: Some(v1::report::Outcome::Observed(v1::Observed {
            snapshot: Some(v1::NrpSnapshot {
                load_balancers: vec!["svc-a".into()],
                locations: vec![LocationChange {
                    location: "::ffff:10.0.0.1".into(),
                    action: 0,
                    addresses: vec![AddressChange {
                        address: "10.1.0.1".into(),
                        service_ids: vec!["svc-a".into()],
                    }],
                }],
                frontends: vec![
                    v1::ServiceFrontend {
                        service_id: "SVC-A".into(),
                        ip: "20.0.0.1".into(),
                    },
                    v1::ServiceFrontend {
                        service_id: "svc-b".into(),
                        ip: "not an ip".into(),
                    },
                ],
                rules: vec![v1::ServiceRules {
                    service_id: "Svc-A".into(),
                    ports: vec![ServicePort {
                        port: 80,
                        protocol: 1,
                        target_port: 0,
                    }],
                    settings: None,
                }],
                ..v1::NrpSnapshot::default()
            }),
            last: false,
        })),
        ..v1::Report::default()
    };
    assert_eq!(
        frontends_from_proto(&observed),
        vec![("svc-a".to_string(), "20.0.0.1".to_string())]
    );
    assert_eq!(
        rules_from_proto(&observed),
        vec![(
            "svc-a".to_string(),
            LbSpec {
                ports: vec![Port {
                    port: 80,
                    protocol: Protocol::Tcp,
                    target_port: 0,
                }],
                settings: None,
            }
        )]
    );
    let Outcome::Observed { snapshot, last } = report_from_proto(observed).outcome else {
        panic!("an observe")
    };
    assert!(!last);
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(
        snapshot.locations,
        vec![(
            ip("10.0.0.1"),
            vec![(ip("10.1.0.1"), vec!["svc-a".to_string()])]
        )]
    );
}

#[test]
fn diffs_and_views_convert_to_proto() {
    let mut t = DiffTracker::new();
    apply_update(&mut t, &service(1, "svc-a", vec![]), 0).unwrap();
    apply_update(&mut t, &level("svc-a", vec![ep("10.1.0.1", "10.0.0.1")]), 1).unwrap();
    let diff = t.pending_diff();
    let tcp = Port {
        port: 443,
        protocol: Protocol::Tcp,
        target_port: 0,
    };
    let s = service_change(&diff.services[0], &LbSpec::ports(vec![tcp]), None);
    assert_eq!(s.service_id, "svc-a");
    assert_eq!(s.kind, v1::ServiceKind::Inbound as i32);
    assert_eq!(s.action, v1::ServiceAction::Create as i32);
    assert_eq!(s.ports, vec![port_to_proto(&tcp)]);
    t.record_service_applied(&diff.services[0]).unwrap();
    let loc = t.pending_diff().locations[0].clone();
    let l = location_change(&loc);
    assert_eq!(l.location, "10.0.0.1");
    assert_eq!(l.action, v1::AddressUpdateAction::FullUpdate as i32);
    assert_eq!(l.addresses[0].address, "10.1.0.1");
    assert_eq!(l.addresses[0].service_ids, vec!["svc-a"]);

    let view = t.location_view("10.0.0.1".parse().unwrap()).unwrap();
    let status = LocationStatus {
        view,
        refused: Default::default(),
    };
    let state = location_state("gw", &status);
    assert!(state.desired && !state.actual);
    assert_eq!(state.addresses[0].desired_service_ids, vec!["svc-a"]);
    assert!(!state.addresses[0].actual);
    assert_eq!(
        address_update_action(difftracker::AddressUpdateAction::Partial),
        v1::AddressUpdateAction::PartialUpdate
    );
    assert_eq!(
        service_kind(ServiceKind::Outbound),
        v1::ServiceKind::Outbound
    );
    assert_eq!(
        service_action(difftracker::ServiceAction::Delete),
        v1::ServiceAction::Delete
    );
}

#[test]
fn an_egress_change_carries_the_families_of_its_public_ips() {
    let change = |kind, ipv6| difftracker::ServiceChange {
        name: "eg".into(),
        kind,
        action: difftracker::ServiceAction::Create,
        nat_gateway: None,
        ipv6,
    };
    let v4 = v1::IpFamily::Ipv4 as i32;
    let v6 = v1::IpFamily::Ipv6 as i32;
    let s = service_change(
        &change(ServiceKind::Outbound, false),
        &LbSpec::default(),
        None,
    );
    assert_eq!(s.egress_families, vec![v4]);
    let s = service_change(
        &change(ServiceKind::Outbound, true),
        &LbSpec::default(),
        None,
    );
    assert_eq!(s.egress_families, vec![v4, v6]);
    // An inbound service's family is `ip_family`, never these.
    let s = service_change(
        &change(ServiceKind::Inbound, true),
        &LbSpec::default(),
        None,
    );
    assert!(s.egress_families.is_empty());
}
