//! IP families of inbound services (`family.rs`): the refusals, and a dual-stack Service as two
//! services whose families come and go without touching each other.

use std::net::IpAddr;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ep<'a>(address: &'a str, location: &'a str) -> Endpoint<'a> {
    Endpoint { address, location }
}

/// Plays an NRP that accepts everything, and returns every location change it was sent.
fn converge(t: &mut DiffTracker) -> Vec<LocationDiff> {
    let mut sent = Vec::new();
    for _ in 0..4 {
        for s in t
            .pending_diff()
            .services
            .iter()
            .filter(|s| s.action == ServiceAction::Create)
        {
            t.record_service_applied(s).unwrap();
        }
        for l in &t.pending_diff().locations {
            t.record_location_applied(l).unwrap();
            sent.push(l.clone());
        }
        for s in t.pending_diff().services {
            t.record_service_applied(&s).unwrap();
        }
    }
    assert!(t.pending_diff().is_empty(), "{:?}", t.pending_diff());
    sent
}

const V4: Option<IpFamily> = Some(IpFamily::V4);
const V6: Option<IpFamily> = Some(IpFamily::V6);

#[test]
fn an_endpoint_of_the_other_family_is_refused_and_changes_nothing() {
    let mut t = DiffTracker::new();
    t.update_service_family(Operation::Add, "svc", V4).unwrap();
    t.set_endpoints("svc", &[ep("10.1.0.1", "10.0.0.1")])
        .unwrap();
    let revision = t.revision();
    let e = t
        .set_endpoints(
            "svc",
            &[ep("10.1.0.2", "10.0.0.1"), ep("FD00::1:1", "fd00::a")],
        )
        .unwrap_err();
    assert_eq!(e.field, "endpoints[1].address");
    assert_eq!(e.value, "fd00::1:1");
    assert_eq!(
        e.reason.to_string(),
        "is IPv6 but service \"svc\" is IPv4: an endpoint must be of its service's IP family \
         (a service of no stated family is IPv4, as its frontend; a dual-stack Service is one \
         service per family)"
    );
    assert_eq!(t.revision(), revision, "nothing applied");
    assert!(t.location_view(ip("fd00::a")).is_none());
    assert!(
        t.location_view(ip("10.0.0.1"))
            .unwrap()
            .addresses
            .iter()
            .all(|a| a.address != ip("10.1.0.2")),
        "the valid endpoint of the refused update is not applied either"
    );

    // An edge update: only the new endpoints are checked.
    let e = t
        .update_endpoints("svc", &[], &[ep("fd00::1:2", "fd00::a")])
        .unwrap_err();
    assert_eq!(e.field, "new_endpoints[0].address");
    assert_eq!(t.revision(), revision);

    // IPv6 service: IPv4 endpoints refused.
    t.update_service_family(Operation::Add, "svc-v6", V6)
        .unwrap();
    let e = t
        .set_endpoints("svc-v6", &[ep("10.1.0.3", "10.0.0.1")])
        .unwrap_err();
    assert_eq!(e.field, "endpoints[0].address");
    assert!(
        e.reason
            .to_string()
            .starts_with("is IPv4 but service \"svc-v6\" is IPv6")
    );
    t.set_endpoints("svc-v6", &[ep("fd00::1:3", "fd00::a")])
        .unwrap();
    assert_eq!(t.service_family("SVC-V6"), V6);
    assert_eq!(t.service_family("svc"), V4);
}

#[test]
fn a_family_change_of_a_known_service_is_refused_until_it_is_gone() {
    let mut t = DiffTracker::new();
    t.update_service_family(Operation::Add, "svc", V4).unwrap();
    let revision = t.revision();
    let e = t
        .update_service_family(Operation::Add, "svc", V6)
        .unwrap_err();
    assert_eq!(e.field, "ip_family");
    assert_eq!(e.value, "IPv6");
    assert_eq!(
        e.reason.to_string(),
        "has an IPv4 frontend; it cannot become IPv6 (a family change is a new service id)"
    );
    // Unstated means an IPv4 frontend: also a change for an IPv6 service.
    t.update_service_family(Operation::Add, "six", V6).unwrap();
    let e = t.update_service(Operation::Add, "six").unwrap_err();
    assert_eq!(e.value, "");
    assert!(e.reason.to_string().contains("IPv6 frontend"));
    assert_eq!(t.revision(), revision + 1, "only the add of six applied");

    // Created in NRP, then withdrawn: NRP still has the IPv4 frontend, so still refused.
    converge(&mut t);
    t.update_service(Operation::Remove, "svc").unwrap();
    assert!(t.update_service_family(Operation::Add, "svc", V6).is_err());
    // Once NRP deleted it, the id is free for another family.
    converge(&mut t);
    assert!(t.service_view("svc").is_none());
    t.update_service_family(Operation::Add, "svc", V6).unwrap();
    assert_eq!(t.service_family("svc"), V6);
}

#[test]
fn a_family_that_its_endpoints_contradict_is_refused() {
    let mut t = DiffTracker::new();
    // Endpoints before their service (a writer may send them first): no family to check yet.
    t.set_endpoints(
        "svc",
        &[ep("10.1.0.1", "10.0.0.1"), ep("fd00::1:1", "fd00::a")],
    )
    .unwrap();
    let revision = t.revision();
    let e = t
        .update_service_family(Operation::Add, "svc", V4)
        .unwrap_err();
    assert_eq!(e.field, "ip_family");
    assert_eq!(
        e.reason.to_string(),
        "cannot be IPv4: it has 1 IPv6 endpoint(s) (the first fd00::1:1); an endpoint must be of \
         its service's IP family"
    );
    assert_eq!(t.revision(), revision);
    assert_eq!(t.service_family("svc"), None);
    t.set_endpoints("svc", &[ep("10.1.0.1", "10.0.0.1")])
        .unwrap();
    t.update_service_family(Operation::Add, "svc", V4).unwrap();
}

/// Issue 34: a service of no stated family is IPv4, as its frontend is — an IPv6 endpoint of it
/// is refused at the edge (NRP would refuse the location's call for it, holding up every other
/// change at that location), precisely and changing nothing.
#[test]
fn a_service_of_no_stated_family_is_ipv4() {
    let mut t = DiffTracker::new();
    t.update_service(Operation::Add, "svc").unwrap();
    let revision = t.revision();
    let e = t
        .set_endpoints(
            "svc",
            &[ep("10.1.0.1", "10.0.0.1"), ep("fd00::1:1", "fd00::a")],
        )
        .unwrap_err();
    assert_eq!(
        (e.field.as_str(), e.value.as_str()),
        ("endpoints[1].address", "fd00::1:1")
    );
    assert!(
        e.reason
            .to_string()
            .contains("is IPv6 but service \"svc\" is IPv4"),
        "{}",
        e.reason
    );
    assert_eq!(t.revision(), revision, "nothing applied");
    t.set_endpoints("svc", &[ep("10.1.0.1", "10.0.0.1")])
        .unwrap();
    assert_eq!(t.service_family("svc"), None);
    converge(&mut t);
    // Stating IPv4 for it is no change of family; IPv6 is.
    t.update_service_family(Operation::Add, "svc", V4).unwrap();
    assert!(t.update_service_family(Operation::Add, "svc", V6).is_err());
    // Endpoints named before their service: checked when the service comes.
    t.set_endpoints("early", &[ep("fd00::1:2", "fd00::a")])
        .unwrap();
    assert!(t.update_service(Operation::Add, "early").is_err());
}

/// A dual-stack Service is two services; its IPv6 family removed (dual → single stack) drains the
/// IPv6 addresses before the IPv6 service goes, and never sends a change of an IPv4 address.
#[test]
fn removing_one_family_drains_it_and_never_touches_the_other() {
    let mut t = DiffTracker::new();
    t.update_service_family(Operation::Add, "uid", V4).unwrap();
    t.set_endpoints("uid", &[ep("10.1.0.1", "10.0.0.1")])
        .unwrap();
    converge(&mut t);

    // Single → dual stack: the new family's service is created before any address refers to it.
    t.update_service_family(Operation::Add, "uid-v6", V6)
        .unwrap();
    t.set_endpoints("uid-v6", &[ep("fd00::1:1", "fd00::a")])
        .unwrap();
    let diff = t.pending_diff();
    assert_eq!(diff.services.len(), 1);
    assert_eq!(diff.services[0].name, "uid-v6");
    assert!(
        diff.locations
            .iter()
            .all(|l| l.addresses.iter().all(|a| a.services.is_empty())),
        "no address refers to uid-v6 before NRP has it: {diff:?}"
    );
    let sent = converge(&mut t);
    assert!(sent.iter().all(|l| l.location == ip("fd00::a")), "{sent:?}");

    // Dual → single stack: the IPv6 address goes first, then the IPv6 service.
    t.update_service(Operation::Remove, "uid-v6").unwrap();
    let diff = t.pending_diff();
    assert!(diff.services.is_empty(), "drain first: {diff:?}");
    assert_eq!(diff.locations.len(), 1);
    assert_eq!(diff.locations[0].location, ip("fd00::a"));
    let sent = converge(&mut t);
    assert!(
        sent.iter().all(|l| l.location == ip("fd00::a")),
        "no IPv4 location is touched: {sent:?}"
    );
    assert!(t.service_view("uid-v6").is_none());
    let v4 = t.location_view(ip("10.0.0.1")).unwrap();
    assert_eq!(v4.addresses[0].actual, Some(vec!["uid".to_owned()]));
}
