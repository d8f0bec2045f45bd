//! Behaviour tests of the DiffTracker rules (`docs/contract.md` §3).

use std::net::IpAddr;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ep<'a>(address: &'a str, location: &'a str) -> Endpoint<'a> {
    Endpoint { address, location }
}

fn pod<'a>(address: &'a str, location: &'a str, outbound: &'a str, uid: &'a str) -> PodUpdate<'a> {
    PodUpdate {
        address,
        location,
        outbound_identity: outbound,
        uid,
        ..Default::default()
    }
}

/// Plays an NRP that accepts everything: services first, then locations, then deletions.
fn converge(t: &mut DiffTracker) {
    for _ in 0..4 {
        let diff = t.pending_diff();
        for s in diff
            .services
            .iter()
            .filter(|s| s.action == ServiceAction::Create)
        {
            t.record_service_applied(s).unwrap();
        }
        for l in &t.pending_diff().locations {
            t.record_location_applied(l).unwrap();
        }
        for s in t.pending_diff().services {
            t.record_service_applied(&s).unwrap();
        }
    }
    assert!(t.pending_diff().is_empty(), "{:?}", t.pending_diff());
}

fn actual_refs(t: &DiffTracker, location: &str, address: &str) -> Option<Vec<String>> {
    let view = t.location_view(ip(location))?;
    view.addresses
        .into_iter()
        .find(|a| a.address == ip(address))?
        .actual
}

fn one_service_cluster() -> DiffTracker {
    let mut t = DiffTracker::new();
    t.update_service(Operation::Add, "svc-a").unwrap();
    t.set_endpoints(
        "svc-a",
        &[ep("10.1.0.1", "10.0.0.1"), ep("10.1.0.2", "10.0.0.2")],
    )
    .unwrap();
    converge(&mut t);
    t
}

#[test]
fn an_address_moving_between_locations_is_removed_at_the_old_and_added_at_the_new() {
    let mut t = one_service_cluster();
    t.set_endpoints(
        "svc-a",
        &[ep("10.1.0.1", "10.0.0.3"), ep("10.1.0.2", "10.0.0.2")],
    )
    .unwrap();
    let diff = t.pending_diff();
    assert_eq!(diff.locations.len(), 2);
    // 10.0.0.1 is left with nothing desired: the whole location goes.
    assert!(diff.locations[0].deletes_location());
    assert_eq!(diff.locations[0].location, ip("10.0.0.1"));
    assert_eq!(diff.locations[1].location, ip("10.0.0.3"));
    assert_eq!(diff.locations[1].action, AddressUpdateAction::Full);
    assert_eq!(diff.locations[1].addresses[0].services, vec!["svc-a"]);
    converge(&mut t);
    assert_eq!(
        actual_refs(&t, "10.0.0.3", "10.1.0.1"),
        Some(vec!["svc-a".into()])
    );
    assert!(t.location_view(ip("10.0.0.1")).is_none());
}

#[test]
fn a_pod_moving_to_another_location_carries_its_refs() {
    let mut t = one_service_cluster();
    t.update_pod(Operation::Add, &pod("10.1.0.1", "10.0.0.9", "", "u1"))
        .unwrap();
    let v = t.location_view(ip("10.0.0.9")).unwrap();
    assert_eq!(v.addresses[0].desired, Some(vec!["svc-a".to_owned()]));
    assert!(
        t.location_view(ip("10.0.0.1")).unwrap().addresses[0]
            .desired
            .is_none()
    );
}

#[test]
fn changing_a_pods_outbound_identity_moves_its_count() {
    let mut t = DiffTracker::new();
    t.update_pod(
        Operation::Add,
        &pod("10.1.0.1", "10.0.0.1", "egress-a", "u1"),
    )
    .unwrap();
    t.update_pod(
        Operation::Add,
        &pod("10.1.0.2", "10.0.0.1", "egress-a", "u2"),
    )
    .unwrap();
    assert_eq!(t.service_view("egress-a").unwrap().egress_pods, 2);
    t.update_pod(
        Operation::Add,
        &pod("10.1.0.1", "10.0.0.1", "egress-b", "u1"),
    )
    .unwrap();
    assert_eq!(t.service_view("egress-a").unwrap().egress_pods, 1);
    assert_eq!(t.service_view("egress-b").unwrap().egress_pods, 1);
    t.update_pod(Operation::Remove, &pod("10.1.0.2", "10.0.0.1", "", "u2"))
        .unwrap();
    // The last pod of egress-a went: it is no longer desired.
    assert!(t.service_view("egress-a").is_none());
    assert_eq!(t.counts().desired_egresses, 1);
}

#[test]
fn re_adding_an_identity_in_different_case_is_not_counted_twice() {
    let mut t = DiffTracker::new();
    t.update_service(Operation::Add, "Svc-A").unwrap();
    t.update_service(Operation::Add, "SVC-a").unwrap();
    t.update_egress(Operation::Add, "Eg").unwrap();
    t.update_egress(Operation::Add, "eG").unwrap();
    assert_eq!(t.counts().desired_services, 1);
    assert_eq!(t.counts().desired_egresses, 1);
    t.update_service(Operation::Remove, "svc-A").unwrap();
    assert_eq!(t.counts().desired_services, 0);
}

#[test]
fn removing_an_unknown_pod_is_a_no_op() {
    let mut t = one_service_cluster();
    let rev = t.revision();
    t.update_pod(Operation::Remove, &pod("10.9.9.9", "10.0.0.1", "", "x"))
        .unwrap();
    t.update_pod(Operation::Remove, &pod("10.1.0.1", "10.0.0.7", "", "x"))
        .unwrap();
    assert_eq!(t.revision(), rev);
    assert!(t.pending_diff().is_empty());
}

#[test]
fn removing_a_replaced_pod_by_its_old_uid_is_a_no_op() {
    let mut t = DiffTracker::new();
    t.update_pod(Operation::Add, &pod("10.1.0.1", "10.0.0.1", "eg", "old"))
        .unwrap();
    t.update_pod(Operation::Add, &pod("10.1.0.1", "10.0.0.1", "eg", "new"))
        .unwrap();
    t.update_pod(Operation::Remove, &pod("10.1.0.1", "10.0.0.1", "", "old"))
        .unwrap();
    assert_eq!(t.service_view("eg").unwrap().egress_pods, 1);
    t.update_pod(Operation::Remove, &pod("10.1.0.1", "10.0.0.1", "", "new"))
        .unwrap();
    assert!(t.service_view("eg").is_none());
}

#[test]
fn removing_a_pod_keeps_the_address_while_an_inbound_identity_uses_it() {
    let mut t = DiffTracker::new();
    t.update_service(Operation::Add, "svc").unwrap();
    t.set_endpoints("svc", &[ep("10.1.0.1", "10.0.0.1")])
        .unwrap();
    t.update_pod(Operation::Add, &pod("10.1.0.1", "10.0.0.1", "eg", "u"))
        .unwrap();
    converge(&mut t);
    assert_eq!(
        actual_refs(&t, "10.0.0.1", "10.1.0.1"),
        Some(vec!["eg".into(), "svc".into()])
    );
    t.update_pod(Operation::Remove, &pod("10.1.0.1", "10.0.0.1", "", "u"))
        .unwrap();
    converge(&mut t);
    assert_eq!(
        actual_refs(&t, "10.0.0.1", "10.1.0.1"),
        Some(vec!["svc".into()])
    );
    assert_eq!(
        t.counts().actual_nat_gateways,
        0,
        "the egress lost its last pod and was deleted"
    );
}

#[test]
fn empty_location_or_address_is_rejected_and_changes_nothing() {
    let mut t = one_service_cluster();
    let before = t.pending_diff();
    let rev = t.revision();
    let err = t
        .set_endpoints("svc-a", &[ep("10.1.0.5", "10.0.0.1"), ep("10.1.0.6", "")])
        .unwrap_err();
    assert_eq!(err.field, "endpoints[1].location");
    assert_eq!(err.reason, Reason::Empty);
    let err = t
        .update_pod(Operation::Add, &pod("", "10.0.0.1", "", ""))
        .unwrap_err();
    assert_eq!(err.field, "address");
    let err = t.update_service(Operation::Add, "").unwrap_err();
    assert_eq!(
        (err.field.as_str(), err.reason),
        ("service_id", Reason::Empty)
    );
    assert_eq!(t.revision(), rev);
    assert_eq!(t.pending_diff(), before);
}

#[test]
fn malformed_and_mixed_family_ips_are_rejected_and_change_nothing() {
    let mut t = one_service_cluster();
    let rev = t.revision();
    let err = t
        .set_endpoints(
            "svc-a",
            &[ep("10.1.0.9", "10.0.0.1"), ep("10.1.0.999", "10.0.0.1")],
        )
        .unwrap_err();
    assert_eq!(
        (err.field.as_str(), err.value.as_str()),
        ("endpoints[1].address", "10.1.0.999")
    );
    assert_eq!(err.reason, Reason::MalformedIp);
    let err = t
        .update_pod(Operation::Add, &pod("fd00::1", "10.0.0.1", "eg", "u"))
        .unwrap_err();
    assert!(matches!(err.reason, Reason::MixedFamily { .. }), "{err}");
    let err = t
        .update_endpoints(
            "svc-a",
            &[],
            &[ep("10.1.0.7", "10.0.0.1"), ep("10.1.0.7", "10.0.0.2")],
        )
        .unwrap_err();
    assert_eq!(err.field, "new_endpoints[1].address");
    assert!(matches!(err.reason, Reason::Duplicate { .. }));
    assert_eq!(t.revision(), rev);
    assert!(t.pending_diff().is_empty());
    assert!(
        t.service_view("eg").is_none(),
        "the rejected pod interned nothing"
    );
}

#[test]
fn dual_stack_addresses_live_in_their_own_family_location() {
    let mut t = DiffTracker::new();
    t.update_service(Operation::Add, "svc").unwrap();
    t.update_service_family(Operation::Add, "svc-v6", Some(super::IpFamily::V6))
        .unwrap();
    t.set_endpoints("svc", &[ep("10.1.0.1", "10.0.0.1")])
        .unwrap();
    t.set_endpoints("svc-v6", &[ep("FD00:0::1", "fd00::a")])
        .unwrap();
    converge(&mut t);
    assert_eq!(
        actual_refs(&t, "fd00::a", "fd00::1"),
        Some(vec!["svc-v6".into()])
    );
    assert_eq!(
        actual_refs(&t, "10.0.0.1", "10.1.0.1"),
        Some(vec!["svc".into()])
    );
}

#[test]
fn an_identity_used_as_both_kinds_is_rejected() {
    let mut t = DiffTracker::new();
    t.update_service(Operation::Add, "shared").unwrap();
    let err = t.update_egress(Operation::Add, "SHARED").unwrap_err();
    assert_eq!(
        err.reason,
        Reason::KindConflict {
            existing: "inbound"
        }
    );
    let err = t
        .update_pod(Operation::Add, &pod("10.1.0.1", "10.0.0.1", "shared", "u"))
        .unwrap_err();
    assert_eq!(err.field, "egress_id");
}

#[test]
fn a_vanished_address_is_sent_with_an_empty_ref() {
    let mut t = one_service_cluster();
    t.set_endpoints(
        "svc-a",
        &[ep("10.1.0.1", "10.0.0.1"), ep("10.1.0.3", "10.0.0.2")],
    )
    .unwrap();
    let diff = t.location_diff(ip("10.0.0.2")).unwrap();
    assert_eq!(diff.action, AddressUpdateAction::Partial);
    assert_eq!(
        diff.addresses,
        vec![
            AddressUpdate {
                address: ip("10.1.0.2"),
                services: vec![]
            },
            AddressUpdate {
                address: ip("10.1.0.3"),
                services: vec!["svc-a".into()]
            },
        ]
    );
}

#[test]
fn a_vanished_location_is_sent_with_an_empty_address_list() {
    let mut t = one_service_cluster();
    t.set_endpoints("svc-a", &[ep("10.1.0.1", "10.0.0.1")])
        .unwrap();
    let diff = t.location_diff(ip("10.0.0.2")).unwrap();
    assert!(diff.deletes_location());
    t.record_location_applied(&diff).unwrap();
    assert!(t.location_view(ip("10.0.0.2")).is_none());
    assert_eq!(t.counts().actual_locations, 1);
}

#[test]
fn an_address_is_withheld_until_its_service_exists_in_actual_state() {
    let mut t = DiffTracker::new();
    t.update_service(Operation::Add, "svc").unwrap();
    t.set_endpoints("svc", &[ep("10.1.0.1", "10.0.0.1")])
        .unwrap();
    let diff = t.pending_diff();
    assert!(diff.locations.is_empty());
    assert_eq!(diff.services[0].action, ServiceAction::Create);
    // A report that an address refers to a service NRP lacks cannot be true: refused.
    let bogus = LocationDiff {
        location: ip("10.0.0.1"),
        action: AddressUpdateAction::Full,
        addresses: vec![AddressUpdate {
            address: ip("10.1.0.1"),
            services: vec!["svc".into()],
        }],
    };
    assert!(matches!(
        t.record_location_applied(&bogus),
        Err(ReportError::UnknownService { .. })
    ));
    t.take_dirty();
    t.record_service_applied(&diff.services[0]).unwrap();
    assert_eq!(t.take_dirty().locations, vec![ip("10.0.0.1")]);
    assert_eq!(t.location_diff(ip("10.0.0.1")), Some(bogus));
}

#[test]
fn a_service_is_only_safe_to_delete_once_no_actual_address_refers_to_it() {
    let mut t = one_service_cluster();
    t.update_service(Operation::Remove, "svc-a").unwrap();
    assert_eq!(
        t.service_status("svc-a"),
        ServiceStatus::AwaitingDrain { actual_refs: 2 }
    );
    let diff = t.pending_diff();
    assert!(diff.services.is_empty());
    assert_eq!(diff.locations.len(), 2);
    let err = t
        .record_service_applied(&ServiceChange {
            name: "svc-a".into(),
            kind: ServiceKind::Inbound,
            action: ServiceAction::Delete,
            nat_gateway: None,
            ipv6: false,
        })
        .unwrap_err();
    assert!(matches!(err, ReportError::StillReferenced { count: 2, .. }));
    t.take_dirty();
    t.record_location_applied(&diff.locations[0]).unwrap();
    assert_eq!(
        t.service_status("svc-a"),
        ServiceStatus::AwaitingDrain { actual_refs: 1 }
    );
    t.record_location_applied(&diff.locations[1]).unwrap();
    assert!(t.take_dirty().services.contains(&"svc-a".to_owned()));
    assert!(matches!(
        t.service_status("svc-a"),
        ServiceStatus::Pending(ServiceChange {
            action: ServiceAction::Delete,
            ..
        })
    ));
}

#[test]
fn a_service_becoming_ready_dirties_only_the_locations_that_use_it() {
    let mut t = DiffTracker::new();
    for (svc, loc) in [("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3")] {
        t.update_service(Operation::Add, svc).unwrap();
        t.set_endpoints(svc, &[ep(&loc.replace("10.0.", "10.1."), loc)])
            .unwrap();
    }
    t.take_dirty();
    t.record_service_applied(&ServiceChange {
        name: "b".into(),
        kind: ServiceKind::Inbound,
        action: ServiceAction::Create,
        nat_gateway: None,
        ipv6: false,
    })
    .unwrap();
    let dirty = t.take_dirty();
    assert_eq!(dirty.locations, vec![ip("10.0.0.2")]);
    assert_eq!(dirty.services, vec!["b".to_owned()]);
}

#[test]
fn withheld_removals_only_add_until_allowed() {
    let mut t = one_service_cluster();
    let mut restarted = DiffTracker::new();
    restarted.set_removals_allowed(false);
    // NRP read back: it has both addresses; Kubernetes so far reported only one of them.
    let snapshot = ActualSnapshot {
        load_balancers: vec!["svc-a".into()],
        nat_gateways: vec![],
        locations: t
            .locations()
            .map(|l| {
                let v = t.location_view(l).unwrap();
                (
                    l,
                    v.addresses
                        .into_iter()
                        .map(|a| (a.address, a.actual.unwrap()))
                        .collect(),
                )
            })
            .collect(),
    };
    restarted.observe(&snapshot).unwrap();
    restarted.update_service(Operation::Add, "svc-a").unwrap();
    restarted.update_service(Operation::Add, "svc-new").unwrap();
    restarted
        .set_endpoints("svc-a", &[ep("10.1.0.1", "10.0.0.1")])
        .unwrap();
    restarted
        .set_endpoints("svc-new", &[ep("10.1.0.2", "10.0.0.2")])
        .unwrap();
    restarted.update_egress(Operation::Add, "eg").unwrap();
    restarted
        .record_service_applied(&ServiceChange {
            name: "svc-new".into(),
            kind: ServiceKind::Inbound,
            action: ServiceAction::Create,
            nat_gateway: None,
            ipv6: false,
        })
        .unwrap();
    let diff = restarted.pending_diff();
    for l in &diff.locations {
        assert_eq!(l.action, AddressUpdateAction::Partial);
    }
    // 10.1.0.2 keeps svc-a (withheld removal) and gains svc-new.
    assert_eq!(diff.locations.len(), 1);
    assert_eq!(
        diff.locations[0].addresses[0].services,
        vec!["svc-a", "svc-new"]
    );
    restarted.take_dirty();
    restarted.set_removals_allowed(true);
    assert!(!restarted.take_dirty().locations.is_empty());
    let diff = restarted.pending_diff();
    assert_eq!(diff.locations[0].addresses[0].services, vec!["svc-new"]);
    t = restarted;
    converge(&mut t);
}

#[test]
fn observe_repairs_drift_made_outside_the_system() {
    let mut t = one_service_cluster();
    t.take_dirty();
    // Someone removed 10.1.0.2 from NRP by hand and added a stray location.
    let snapshot = ActualSnapshot {
        load_balancers: vec!["SVC-A".into()],
        nat_gateways: vec![],
        locations: vec![
            (ip("10.0.0.1"), vec![(ip("10.1.0.1"), vec!["svc-a".into()])]),
            (
                ip("10.0.0.99"),
                vec![(ip("10.1.0.99"), vec!["svc-a".into()])],
            ),
        ],
    };
    let summary = t.observe(&snapshot).unwrap();
    assert_eq!(summary.locations_changed, 2);
    let mut dirty = t.take_dirty().locations;
    dirty.sort();
    assert_eq!(dirty, vec![ip("10.0.0.2"), ip("10.0.0.99")]);
    let diff = t.pending_diff();
    assert_eq!(diff.locations[0].location, ip("10.0.0.2"));
    assert_eq!(diff.locations[0].action, AddressUpdateAction::Full);
    assert!(diff.locations[1].deletes_location());
    converge(&mut t);
    let bad = ActualSnapshot {
        locations: vec![(ip("10.0.0.1"), vec![(ip("10.1.0.1"), vec!["ghost".into()])])],
        ..snapshot
    };
    assert!(matches!(
        t.observe(&bad),
        Err(ReportError::UnknownService { .. })
    ));
    assert!(
        t.pending_diff().is_empty(),
        "a refused snapshot changes nothing"
    );
}

#[test]
fn removing_a_service_strips_it_and_drops_empty_addresses_and_locations() {
    let mut t = DiffTracker::new();
    t.update_service(Operation::Add, "a").unwrap();
    t.update_service(Operation::Add, "b").unwrap();
    t.set_endpoints(
        "a",
        &[ep("10.1.0.1", "10.0.0.1"), ep("10.1.0.2", "10.0.0.2")],
    )
    .unwrap();
    t.set_endpoints("b", &[ep("10.1.0.1", "10.0.0.1")]).unwrap();
    t.update_service(Operation::Remove, "a").unwrap();
    assert_eq!(t.counts().desired_addresses, 1);
    assert_eq!(t.counts().desired_locations, 1);
    assert!(t.location_view(ip("10.0.0.2")).is_none());
    assert_eq!(
        t.location_view(ip("10.0.0.1")).unwrap().addresses[0].desired,
        Some(vec!["b".to_owned()])
    );
}

#[test]
fn edge_updates_apply_only_the_difference() {
    let mut t = one_service_cluster();
    t.update_endpoints(
        "svc-a",
        &[ep("10.1.0.2", "10.0.0.2")],
        &[ep("10.1.0.2", "10.0.0.2"), ep("10.1.0.3", "10.0.0.2")],
    )
    .unwrap();
    t.update_endpoints("svc-a", &[ep("10.1.0.1", "10.0.0.1")], &[])
        .unwrap();
    converge(&mut t);
    let v = t.location_view(ip("10.0.0.2")).unwrap();
    assert_eq!(v.addresses.len(), 2);
    assert!(t.location_view(ip("10.0.0.1")).is_none());
}

#[test]
fn a_reprogrammed_service_is_created_again_while_it_stays_in_nrp() {
    let mut t = one_service_cluster();
    converge(&mut t);
    t.take_dirty();
    let create = ServiceChange {
        name: "svc-a".into(),
        kind: ServiceKind::Inbound,
        action: ServiceAction::Create,
        nat_gateway: None,
        ipv6: false,
    };
    let revision = t.revision();
    assert_eq!(t.reprogram_service("SVC-A"), Ok(true));
    assert!(t.revision() > revision, "a desired change");
    assert_eq!(
        t.service_status("svc-a"),
        ServiceStatus::Pending(create.clone())
    );
    assert_eq!(t.pending_diff().services, vec![create.clone()]);
    assert!(t.is_service_dirty("svc-a"));
    // Meanwhile its addresses keep it: nothing else changes.
    let dirty = t.take_dirty();
    assert!(dirty.locations.is_empty(), "{dirty:?}");
    assert!(t.pending_diff().locations.is_empty());
    assert_eq!(
        actual_refs(&t, "10.0.0.1", "10.1.0.1"),
        Some(vec!["svc-a".into()])
    );
    // An observe that finds it in NRP does not settle it; only a recorded creation does.
    t.observe(&ActualSnapshot {
        load_balancers: vec!["svc-a".into()],
        nat_gateways: vec![],
        locations: vec![
            (ip("10.0.0.1"), vec![(ip("10.1.0.1"), vec!["svc-a".into()])]),
            (ip("10.0.0.2"), vec![(ip("10.1.0.2"), vec!["svc-a".into()])]),
        ],
    })
    .unwrap();
    assert_eq!(
        t.service_status("svc-a"),
        ServiceStatus::Pending(create.clone())
    );
    t.record_service_applied(&create).unwrap();
    assert_eq!(t.service_status("svc-a"), ServiceStatus::InSync);
    assert!(t.pending_diff().is_empty());
}

#[test]
fn only_desired_inbound_identities_are_reprogrammed() {
    let mut t = one_service_cluster();
    t.update_egress(Operation::Add, "eg").unwrap();
    converge(&mut t);
    assert_eq!(t.reprogram_service("eg"), Ok(false));
    assert_eq!(t.reprogram_service("unknown"), Ok(false));
    assert!(t.reprogram_service("").is_err());
    assert!(t.pending_diff().is_empty());
    // A request that the service's removal overtakes is dropped with it: re-adding the service
    // does not create it again.
    t.take_dirty();
    assert_eq!(t.reprogram_service("svc-a"), Ok(true));
    t.update_service(Operation::Remove, "svc-a").unwrap();
    t.update_service(Operation::Add, "svc-a").unwrap();
    assert_eq!(t.service_status("svc-a"), ServiceStatus::InSync);
    // Not in NRP yet: the pending creation is the one that was due anyway.
    let mut fresh = one_service_cluster();
    assert_eq!(fresh.reprogram_service("svc-a"), Ok(true));
    assert!(matches!(
        fresh.service_status("svc-a"),
        ServiceStatus::Pending(ServiceChange {
            action: ServiceAction::Create,
            ..
        })
    ));
    converge(&mut fresh);
}
