//! The IPv6 public IP of an egress (`egress_family.rs`): asked for with the first IPv6 pod, sent
//! again to an egress NRP has, IPv6 addresses held back until NRP's NAT gateway has it, kept when
//! the last IPv6 pod goes, and known again after a restart from what NRP holds.

use super::super::*;

fn pod<'a>(address: &'a str, location: &'a str) -> PodUpdate<'a> {
    PodUpdate {
        address,
        location,
        outbound_identity: "eg",
        uid: address,
        nat_gateway: "",
    }
}

fn creation(t: &DiffTracker) -> Option<ServiceChange> {
    t.pending_diff()
        .services
        .into_iter()
        .find(|c| c.name == "eg" && c.action == ServiceAction::Create)
}

/// Applies every pending location change as NRP would.
fn apply_locations(t: &mut DiffTracker) {
    for l in t.pending_diff().locations {
        t.record_location_applied(&l).unwrap();
    }
}

/// The services NRP's `address` refers to after the pending location changes are applied.
fn refs_sent(t: &DiffTracker, address: &str) -> Option<Vec<String>> {
    let address: std::net::IpAddr = address.parse().unwrap();
    t.pending_diff()
        .locations
        .into_iter()
        .flat_map(|l| l.addresses)
        .find(|a| a.address == address)
        .map(|a| a.services)
}

#[test]
fn an_ipv4_egress_needs_no_ipv6_public_ip() {
    let mut t = DiffTracker::new();
    t.update_pod(Operation::Add, &pod("10.1.0.1", "10.0.0.1"))
        .unwrap();
    let c = creation(&t).expect("creation");
    assert!(!c.ipv6, "{c:?}");
    assert_eq!(t.egress_ipv6("EG"), Some((false, false)));
}

#[test]
fn the_first_ipv6_pod_sends_the_creation_again_and_its_address_waits_for_it() {
    let mut t = DiffTracker::new();
    t.update_pod(Operation::Add, &pod("10.1.0.1", "10.0.0.1"))
        .unwrap();
    let c = creation(&t).unwrap();
    t.record_service_applied(&c).unwrap();
    apply_locations(&mut t);
    assert!(t.pending_diff().is_empty());

    let revision = t.revision();
    t.update_pod(Operation::Add, &pod("fd00::1:1", "fd00::1"))
        .unwrap();
    assert!(t.revision() > revision);
    let again = creation(&t).expect("the creation is sent again");
    assert!(again.ipv6, "{again:?}");
    assert_eq!(t.egress_ipv6("eg"), Some((true, false)));
    assert!(t.take_dirty().services.contains(&"eg".to_string()));
    // Not sent with the egress before NRP's NAT gateway has its IPv6 public IP.
    assert_eq!(refs_sent(&t, "fd00::1:1"), None);

    t.record_service_applied(&again).unwrap();
    assert_eq!(creation(&t), None);
    assert_eq!(t.egress_ipv6("eg"), Some((true, true)));
    assert_eq!(refs_sent(&t, "fd00::1:1"), Some(vec!["eg".to_string()]));
    apply_locations(&mut t);
    assert!(t.pending_diff().is_empty());
}

#[test]
fn a_creation_in_flight_without_ipv6_is_sent_again() {
    let mut t = DiffTracker::new();
    t.update_pod(Operation::Add, &pod("10.1.0.1", "10.0.0.1"))
        .unwrap();
    let leased = creation(&t).unwrap();
    assert!(!leased.ipv6);
    // The IPv6 pod comes while the IPv4-only creation is in flight.
    t.update_pod(Operation::Add, &pod("fd00::1:1", "fd00::1"))
        .unwrap();
    t.record_service_applied(&leased).unwrap();
    let again = creation(&t).expect("sent again with ipv6");
    assert!(again.ipv6);
    assert_eq!(refs_sent(&t, "fd00::1:1"), None);
    assert_eq!(refs_sent(&t, "10.1.0.1"), Some(vec!["eg".to_string()]));
}

#[test]
fn the_ipv6_public_ip_is_kept_when_the_last_ipv6_pod_goes() {
    let mut t = DiffTracker::new();
    t.update_pod(Operation::Add, &pod("10.1.0.1", "10.0.0.1"))
        .unwrap();
    t.update_pod(Operation::Add, &pod("fd00::1:1", "fd00::1"))
        .unwrap();
    let c = creation(&t).unwrap();
    assert!(c.ipv6, "the first creation already asks for it");
    t.record_service_applied(&c).unwrap();
    apply_locations(&mut t);
    t.update_pod(Operation::Remove, &pod("fd00::1:1", "fd00::1"))
        .unwrap();
    assert_eq!(creation(&t), None, "no change for the public IP");
    assert_eq!(t.egress_ipv6("eg"), Some((true, true)));
    // A creation sent again later (a restart's re-program) still carries it.
    t.update_pod(Operation::Add, &pod("fd00::1:2", "fd00::1"))
        .unwrap();
    assert_eq!(creation(&t), None, "NRP's NAT gateway has it");
    apply_locations(&mut t);
    // The deletion (after the drain) carries it too, and forgets it.
    t.update_pod(Operation::Remove, &pod("fd00::1:2", "fd00::1"))
        .unwrap();
    t.update_pod(Operation::Remove, &pod("10.1.0.1", "10.0.0.1"))
        .unwrap();
    apply_locations(&mut t);
    let del = t.pending_diff().services;
    assert_eq!(del.len(), 1);
    assert_eq!(del[0].action, ServiceAction::Delete);
    assert!(del[0].ipv6);
    t.record_service_applied(&del[0]).unwrap();
    assert_eq!(t.egress_ipv6("eg"), None);
}

#[test]
fn after_a_restart_ipv6_refs_in_nrp_tell_the_public_ip_is_there() {
    let snapshot = |v6: bool| {
        let mut addresses = vec![(
            "10.0.0.1".parse().unwrap(),
            vec![("10.1.0.1".parse().unwrap(), vec!["eg".to_string()])],
        )];
        if v6 {
            addresses.push((
                "fd00::1".parse().unwrap(),
                vec![("fd00::1:1".parse().unwrap(), vec!["eg".to_string()])],
            ));
        }
        ActualSnapshot {
            nat_gateways: vec!["eg".into()],
            locations: addresses,
            ..Default::default()
        }
    };
    // NRP's IPv6 address refers to the egress: its NAT gateway has the IPv6 public IP; nothing to
    // send, and the address keeps its ref.
    let mut t = DiffTracker::new();
    t.observe(&snapshot(true)).unwrap();
    t.update_pod(Operation::Add, &pod("10.1.0.1", "10.0.0.1"))
        .unwrap();
    t.update_pod(Operation::Add, &pod("fd00::1:1", "fd00::1"))
        .unwrap();
    assert!(t.pending_diff().is_empty(), "{:?}", t.pending_diff());

    // No IPv6 address refers to it, and IPv6 pods need it: created again, whatever came first.
    for pods_first in [false, true] {
        let mut t = DiffTracker::new();
        if !pods_first {
            t.observe(&snapshot(false)).unwrap();
        }
        t.update_pod(Operation::Add, &pod("10.1.0.1", "10.0.0.1"))
            .unwrap();
        t.update_pod(Operation::Add, &pod("fd00::1:1", "fd00::1"))
            .unwrap();
        if pods_first {
            t.observe(&snapshot(false)).unwrap();
        }
        let c = creation(&t).expect("created again");
        assert!(c.ipv6);
        assert_eq!(refs_sent(&t, "fd00::1:1"), None);
    }
}
