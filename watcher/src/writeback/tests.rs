use super::*;
use clb_proto::v1::{ProgrammingReason, ServiceCondition};

fn state(reason: ProgrammingReason, ip: &str, code: &str) -> ServiceState {
    ServiceState {
        actual: !ip.is_empty(),
        frontend_ip: ip.to_owned(),
        actual_addresses: 2,
        condition: Some(ServiceCondition {
            reason: reason as i32,
            message: "server says".into(),
            error_code: code.into(),
            error_message: format!("{code} text"),
            ..ServiceCondition::default()
        }),
        ..ServiceState::default()
    }
}

fn facts(conditions: Vec<Condition>) -> ServiceFacts {
    ServiceFacts {
        key: ObjKey {
            namespace: "default".into(),
            name: "web".into(),
        },
        uid: "u".into(),
        ids: vec![("u".into(), IpFamily::Unspecified)],
        resource_version: "7".into(),
        ours: true,
        deleting: false,
        has_finalizer: true,
        finalizers: vec![],
        ingress: vec![],
        generation: Some(3),
        conditions,
        gateways: vec![String::new()],
        selection_error: None,
        refusal: None,
        ignored: None,
    }
}

fn other() -> Condition {
    Condition {
        type_: "example.com/Other".into(),
        status: "True".into(),
        reason: "Fine".into(),
        message: "theirs".into(),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

#[test]
fn the_server_reason_maps_to_the_condition_and_the_event() {
    let w = Wanted::of(
        Some(&state(ProgrammingReason::Programmed, "20.0.0.1", "")),
        &[],
    );
    assert_eq!((w.status, w.reason), ("True", "Programmed"));
    assert!(w.message.contains("20.0.0.1"));
    assert_eq!(w.event, Some(EventType::Normal));
    let w = Wanted::of(
        Some(&state(
            ProgrammingReason::Rejected,
            "",
            "InvalidResourceName",
        )),
        &[],
    );
    assert_eq!((w.status, w.reason), ("False", "RejectedByAzure"));
    assert!(
        w.message
            .contains("InvalidResourceName: InvalidResourceName text")
    );
    assert_eq!(w.error_code, "InvalidResourceName");
    assert_eq!(w.event, Some(EventType::Warning));
    assert!(
        w.message.contains("Azure rejected the load balancer"),
        "{}",
        w.message
    );
    // An address refused on its own is named with its location.
    let mut refused = state(ProgrammingReason::Rejected, "", "AddressRefusedByPolicy");
    if let Some(c) = refused.condition.as_mut() {
        c.location = "10.0.0.1".into();
        c.address = "10.1.0.7".into();
    }
    let w = Wanted::of(Some(&refused), &[]);
    assert_eq!((w.status, w.reason), ("False", "RejectedByAzure"));
    assert!(
        w.message
            .contains("backend address 10.1.0.7 at location 10.0.0.1"),
        "{}",
        w.message
    );
    assert!(
        w.message.contains("AddressRefusedByPolicy"),
        "{}",
        w.message
    );
    let w = Wanted::of(
        Some(&state(ProgrammingReason::Throttled, "", "TooManyRequests")),
        &[],
    );
    assert_eq!(w.reason, "Throttled");
    assert_eq!(w.event, Some(EventType::Warning));
    let w = Wanted::of(Some(&state(ProgrammingReason::HeldBack, "", "")), &[]);
    assert_eq!((w.reason, w.message.as_str()), ("HeldBack", "server says"));
    assert_eq!(w.event, Some(EventType::Normal));
    for w in [
        Wanted::of(None, &[]),
        Wanted::of(Some(&state(ProgrammingReason::Pending, "", "")), &[]),
        // Programmed without a frontend IP is not programmed for Kubernetes.
        Wanted::of(Some(&state(ProgrammingReason::Programmed, "", "")), &[]),
    ] {
        assert_eq!((w.status, w.reason, w.event), ("False", "Pending", None));
    }
    let w = Wanted::of(
        Some(&state(ProgrammingReason::Programmed, "20.0.0.1", "")),
        &["port http: 8080 or 9090".to_owned()],
    );
    assert_eq!((w.status, w.reason), ("True", "PortNameConflict"));
    assert!(w.message.contains("port http: 8080 or 9090"));
}

#[test]
fn the_condition_replaces_ours_keeps_theirs_and_moves_its_time_only_with_the_status() {
    let w = Wanted::of(
        Some(&state(ProgrammingReason::Programmed, "20.0.0.1", "")),
        &[],
    );
    let list = w.condition(&facts(vec![other()])).expect("ours is missing");
    assert_eq!(list.len(), 2);
    assert_eq!(list[0], other());
    let ours = &list[1];
    assert_eq!(ours.type_, CONDITION_TYPE);
    assert_eq!(ours.observed_generation, Some(3));
    // Written as shown: nothing to patch.
    assert_eq!(w.condition(&facts(list.clone())), None);
    // Same status, another message: patched, the transition time kept.
    let mut older = list.clone();
    older[1].message = "before".into();
    older[1].last_transition_time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let again = w.condition(&facts(older)).unwrap();
    assert_eq!(
        again[1].last_transition_time,
        Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    );
    // Another status: a new transition time.
    let mut was_false = list.clone();
    was_false[1].status = "False".into();
    was_false[1].last_transition_time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let flipped = w.condition(&facts(was_false)).unwrap();
    assert_ne!(
        flipped[1].last_transition_time,
        Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    );
    assert_eq!(flipped.len(), 2);
}
