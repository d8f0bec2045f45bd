//! Brought NAT gateways (`natgw.rs`): binding, refusals that change nothing, the name on the
//! service changes (deletion included), and an identity only observed since a restart.

use super::super::*;

fn pod<'a>(address: &'a str, egress: &'a str, nat: &'a str) -> PodUpdate<'a> {
    PodUpdate {
        address,
        location: "10.0.0.1",
        outbound_identity: egress,
        uid: address,
        nat_gateway: nat,
    }
}

fn services(t: &DiffTracker) -> Vec<ServiceChange> {
    t.pending_diff().services
}

#[test]
fn the_first_pod_binds_the_egress_and_the_creation_carries_the_name() {
    let mut t = DiffTracker::new();
    t.update_pod(Operation::Add, &pod("10.1.0.1", "Eg", "my-natgw"))
        .unwrap();
    // The same name, in another case (ARM names are case-insensitive): accepted.
    t.update_pod(Operation::Add, &pod("10.1.0.2", "eg", "MY-NATGW"))
        .unwrap();
    let s = services(&t);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].action, ServiceAction::Create);
    assert_eq!(s[0].nat_gateway.as_deref(), Some("my-natgw"));
    assert_eq!(t.egress_nat_gateway("EG"), Some("my-natgw"));
}

#[test]
fn a_conflicting_pod_is_refused_precisely_and_changes_nothing() {
    let mut t = DiffTracker::new();
    t.update_pod(Operation::Add, &pod("10.1.0.1", "eg", "natgw-a"))
        .unwrap();
    let before = t.pending_diff();
    let revision = t.revision();
    let e = t
        .update_pod(Operation::Add, &pod("10.1.0.2", "eg", "natgw-b"))
        .unwrap_err();
    assert_eq!(e.field, "nat_gateway");
    assert_eq!(e.value, "natgw-b");
    let text = e.to_string();
    assert!(text.contains("\"natgw-a\", brought"), "{text}");
    assert!(text.contains("every pod of an egress"), "{text}");
    assert_eq!(t.pending_diff(), before);
    assert_eq!(t.revision(), revision);
    assert!(
        t.pods(None)
            .iter()
            .all(|(a, _)| a.to_string() != "10.1.0.2")
    );
    // A pod without the annotation conflicts too: the egress would be half clb's own.
    let e = t
        .update_pod(Operation::Add, &pod("10.1.0.3", "eg", ""))
        .unwrap_err();
    assert!(e.to_string().contains("brought"), "{e}");
    // And the reverse: an egress clb owns refuses a pod that brings one.
    t.update_pod(Operation::Add, &pod("10.1.0.4", "own", ""))
        .unwrap();
    let e = t
        .update_pod(Operation::Add, &pod("10.1.0.5", "own", "natgw-a"))
        .unwrap_err();
    assert!(e.to_string().contains("none: clb owns"), "{e}");
}

#[test]
fn a_bad_name_is_refused_with_a_short_quote() {
    let mut t = DiffTracker::new();
    for (name, why) in [
        ("-natgw", "must start"),
        ("natgw.", "must end"),
        ("nat gw", "may hold only"),
    ] {
        let e = t
            .update_pod(Operation::Add, &pod("10.1.0.1", "eg", name))
            .unwrap_err();
        assert!(e.to_string().contains(why), "{name}: {e}");
    }
    let long = "n".repeat(5000);
    let e = t
        .update_pod(Operation::Add, &pod("10.1.0.1", "eg", &long))
        .unwrap_err();
    assert!(e.to_string().len() < 400, "{e}");
    assert!(t.pending_diff().services.is_empty());
}

#[test]
fn the_binding_holds_while_nrp_has_the_egress_and_goes_with_it() {
    let mut t = DiffTracker::new();
    t.update_pod(Operation::Add, &pod("10.1.0.1", "eg", "natgw-a"))
        .unwrap();
    let create = services(&t).remove(0);
    t.record_service_applied(&create).unwrap();
    for l in t.pending_diff().locations {
        t.record_location_applied(&l).unwrap();
    }
    // The last pod goes: NRP still has the egress, whose deletion names the NAT gateway.
    t.update_pod(
        Operation::Remove,
        &PodUpdate {
            uid: "10.1.0.1",
            ..pod("10.1.0.1", "", "")
        },
    )
    .unwrap();
    let e = t
        .update_pod(Operation::Add, &pod("10.1.0.2", "eg", "natgw-b"))
        .unwrap_err();
    assert_eq!(e.field, "nat_gateway");
    for l in t.pending_diff().locations {
        t.record_location_applied(&l).unwrap();
    }
    let delete = services(&t).remove(0);
    assert_eq!(delete.action, ServiceAction::Delete);
    assert_eq!(delete.nat_gateway.as_deref(), Some("natgw-a"));
    t.record_service_applied(&delete).unwrap();
    // Gone from NRP: a new pod binds the egress anew.
    t.update_pod(Operation::Add, &pod("10.1.0.2", "eg", "natgw-b"))
        .unwrap();
    assert_eq!(services(&t)[0].nat_gateway.as_deref(), Some("natgw-b"));
}

#[test]
fn an_egress_only_observed_is_bound_by_its_first_pod() {
    let mut t = DiffTracker::new();
    t.observe(&ActualSnapshot {
        load_balancers: Vec::new(),
        nat_gateways: vec!["eg".into()],
        locations: Vec::new(),
    })
    .unwrap();
    t.update_pod(Operation::Add, &pod("10.1.0.1", "eg", "natgw-a"))
        .unwrap();
    assert_eq!(t.egress_nat_gateway("eg"), Some("natgw-a"));
    // NRP has it, with a NAT gateway the tracker does not know: created again (idempotent), once.
    let again = services(&t);
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].action, ServiceAction::Create);
    assert_eq!(again[0].nat_gateway.as_deref(), Some("natgw-a"));
    t.record_service_applied(&again[0]).unwrap();
    assert!(services(&t).is_empty(), "{:?}", services(&t));
    // Another pod of the same egress changes nothing more.
    t.update_pod(Operation::Add, &pod("10.1.0.2", "eg", "natgw-a"))
        .unwrap();
    assert!(services(&t).is_empty(), "{:?}", services(&t));
}

#[test]
fn an_egress_bound_before_it_is_observed_is_created_again_once() {
    let mut t = DiffTracker::new();
    t.update_pod(Operation::Add, &pod("10.1.0.1", "eg", "natgw-a"))
        .unwrap();
    let snapshot = ActualSnapshot {
        load_balancers: Vec::new(),
        nat_gateways: vec!["eg".into()],
        locations: Vec::new(),
    };
    t.observe(&snapshot).unwrap();
    let again = services(&t);
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].nat_gateway.as_deref(), Some("natgw-a"));
    t.record_service_applied(&again[0]).unwrap();
    t.observe(&snapshot).unwrap();
    assert!(services(&t).is_empty(), "{:?}", services(&t));
}

#[test]
fn an_egress_only_observed_without_a_brought_nat_gateway_is_not_created_again() {
    let mut t = DiffTracker::new();
    t.observe(&ActualSnapshot {
        load_balancers: Vec::new(),
        nat_gateways: vec!["eg".into()],
        locations: Vec::new(),
    })
    .unwrap();
    t.update_pod(Operation::Add, &pod("10.1.0.1", "eg", ""))
        .unwrap();
    assert!(services(&t).is_empty(), "{:?}", services(&t));
}
