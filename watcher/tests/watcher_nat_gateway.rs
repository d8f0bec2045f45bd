//! Egresses that bring their NAT gateway: the pod annotation `clb.azure.com/nat-gateway` travels
//! in `PodUpdate.nat_gateway` (adds, resync views, a changed annotation); a value that is not a
//! NAT gateway name leaves the pod as it was (nothing sent).

use clb_proto::v1::{Operation, Update, update::Kind as UKind};
use clb_watcher::translate::{
    EGRESS_LABEL, NAT_GATEWAY_ANNOTATION, ObjKey, Translator, TranslatorConfig,
    nat_gateway_name_error,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

fn node(name: &str, ip: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
    }))
    .unwrap()
}

fn pod(name: &str, ip: &str, nat: Option<&str>) -> Pod {
    let annotations = match nat {
        Some(n) => json!({ NAT_GATEWAY_ANNOTATION: n }),
        None => json!({}),
    };
    serde_json::from_value(json!({
        "metadata": {"namespace": "apps", "name": name, "uid": format!("uid-{name}"),
            "labels": { EGRESS_LABEL: "egress-a" }, "annotations": annotations},
        "spec": {"nodeName": "n1", "containers": []},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "10.0.0.1"},
    }))
    .unwrap()
}

/// `+pod ADDRESS egress NAT` of each pod add, `-pod ADDRESS` of each removal.
fn pods(us: &[Update]) -> Vec<String> {
    us.iter()
        .filter_map(|u| match u.kind.as_ref()? {
            UKind::Pod(p) if p.operation == Operation::Add as i32 => Some(format!(
                "+pod {} {} {:?}",
                p.address, p.egress_id, p.nat_gateway
            )),
            UKind::Pod(p) => Some(format!("-pod {}", p.address)),
            _ => None,
        })
        .collect()
}

#[test]
fn the_annotation_travels_with_the_pod_and_in_the_view() {
    let mut t = Translator::new(TranslatorConfig::default());
    t.apply_node(&node("n1", "10.0.0.1"));
    assert_eq!(
        pods(&t.apply_pod(&pod("p1", "10.1.0.1", Some(" my-natgw ")))),
        ["+pod 10.1.0.1 egress-a \"my-natgw\""]
    );
    assert_eq!(
        pods(&t.apply_pod(&pod("p2", "10.1.0.2", None))),
        ["+pod 10.1.0.2 egress-a \"\""]
    );
    assert_eq!(
        pods(&t.full_view()),
        [
            "+pod 10.1.0.1 egress-a \"my-natgw\"",
            "+pod 10.1.0.2 egress-a \"\""
        ]
    );
    // A changed annotation is sent again (the state server decides whether it may change).
    assert_eq!(
        pods(&t.apply_pod(&pod("p2", "10.1.0.2", Some("my-natgw")))),
        ["+pod 10.1.0.2 egress-a \"my-natgw\""]
    );
    // Unchanged: nothing sent.
    assert!(
        t.apply_pod(&pod("p2", "10.1.0.2", Some("my-natgw")))
            .is_empty()
    );
    assert_eq!(
        pods(&t.delete_pod(&ObjKey::new("apps", "p2"))),
        ["-pod 10.1.0.2"]
    );
}

#[test]
fn a_value_that_is_not_a_nat_gateway_name_changes_nothing() {
    let mut t = Translator::new(TranslatorConfig::default());
    t.apply_node(&node("n1", "10.0.0.1"));
    assert_eq!(
        pods(&t.apply_pod(&pod("p1", "10.1.0.1", Some("good")))).len(),
        1
    );
    let long = "n".repeat(81);
    for bad in ["-natgw", "nat gw", "natgw.", long.as_str()] {
        assert!(nat_gateway_name_error(bad).is_some(), "{bad}");
        assert!(
            t.apply_pod(&pod("p1", "10.1.0.1", Some(bad))).is_empty(),
            "{bad}: the pod stays as it was sent"
        );
        assert!(
            t.apply_pod(&pod("p9", "10.1.0.9", Some(bad))).is_empty(),
            "{bad}"
        );
    }
    assert_eq!(pods(&t.full_view()), ["+pod 10.1.0.1 egress-a \"good\""]);
    assert_eq!(nat_gateway_name_error("nat_gw-1.x_"), None);
}
