//! IP families in the translator: an IPv6-only Service is one IPv6 identity (its UID); a dual-stack
//! Service is two, the secondary `{uid}-v6` (or `-v4`), each with its family's endpoints only;
//! a family added to or removed from a live Service adds or removes its identity alone; a
//! Service without `spec.ipFamilies` is served as before families.

use clb_proto::v1::{IpFamily, Operation, Update, endpoints_update::Change, update::Kind as UKind};
use clb_watcher::translate::{Translator, TranslatorConfig};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

fn service(families: Option<&[&str]>, policy: Option<&str>) -> Service {
    let mut spec = json!({"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]});
    if let Some(f) = families {
        spec["ipFamilies"] = json!(f);
    }
    if let Some(p) = policy {
        spec["ipFamilyPolicy"] = json!(p);
    }
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": "web", "uid": "u1", "resourceVersion": "1"},
        "spec": spec,
    }))
    .unwrap()
}

fn slice(name: &str, family: &str, addresses: &[&str]) -> EndpointSlice {
    let endpoints: Vec<Value> = addresses
        .iter()
        .map(|a| json!({"addresses": [a], "nodeName": "n1", "conditions": {"ready": true}}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": name, "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": family,
        "endpoints": endpoints,
    }))
    .unwrap()
}

fn node() -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": "n1"},
        "status": {"addresses": [
            {"type": "InternalIP", "address": "10.0.0.1"},
            {"type": "InternalIP", "address": "fd00::1"}]},
    }))
    .unwrap()
}

/// A readable form: `add ID FAMILY`, `remove ID`, `level ID [address@location, …]`.
fn show(u: &Update) -> String {
    match u.kind.as_ref().unwrap() {
        UKind::Service(s) if s.operation == Operation::Add as i32 => {
            let family = IpFamily::try_from(s.ip_family).unwrap().as_str_name();
            format!("add {} {family}", s.service_id)
        }
        UKind::Service(s) => format!("remove {}", s.service_id),
        UKind::Endpoints(e) => match e.change.as_ref().unwrap() {
            Change::Level(set) => {
                let eps: Vec<String> = set
                    .endpoints
                    .iter()
                    .map(|ep| format!("{}@{}", ep.address, ep.location))
                    .collect();
                format!("level {} [{}]", e.service_id, eps.join(", "))
            }
            Change::Edge(_) => "edge".into(),
        },
        other => format!("{other:?}"),
    }
}

fn shown(updates: &[Update]) -> Vec<String> {
    updates.iter().map(show).collect()
}

/// A translator that knows the node and both slices of `web`.
fn with_slices() -> Translator {
    let mut t = Translator::new(TranslatorConfig::default());
    assert!(t.apply_node(&node()).is_empty());
    assert!(
        t.apply_slice(&slice("web-4", "IPv4", &["10.1.0.1"]))
            .is_empty()
    );
    assert!(
        t.apply_slice(&slice("web-6", "IPv6", &["fd01::1"]))
            .is_empty()
    );
    t
}

#[test]
fn an_ipv6_only_service_is_one_ipv6_identity_with_ipv6_endpoints() {
    let mut t = with_slices();
    let d = t.apply_service(&service(Some(&["IPv6"]), Some("SingleStack")));
    assert_eq!(
        shown(&d),
        ["add u1 IP_FAMILY_IPV6", "level u1 [fd01::1@fd00::1]"]
    );
}

#[test]
fn a_dual_stack_service_is_one_identity_per_family() {
    let mut t = with_slices();
    let d = t.apply_service(&service(Some(&["IPv4", "IPv6"]), Some("PreferDualStack")));
    assert_eq!(
        shown(&d),
        [
            "add u1 IP_FAMILY_IPV4",
            "level u1 [10.1.0.1@10.0.0.1]",
            "add u1-v6 IP_FAMILY_IPV6",
            "level u1-v6 [fd01::1@fd00::1]",
        ]
    );
    // An IPv6 endpoint change reaches the IPv6 identity only.
    let d = t.apply_slice(&slice("web-6", "IPv6", &["fd01::1", "fd01::2"]));
    assert_eq!(
        shown(&d),
        ["level u1-v6 [fd01::1@fd00::1, fd01::2@fd00::1]"]
    );
    // IPv6 primary: the secondary is `-v4`.
    let mut t = with_slices();
    let d = t.apply_service(&service(Some(&["IPv6", "IPv4"]), Some("RequireDualStack")));
    assert_eq!(
        shown(&d),
        [
            "add u1 IP_FAMILY_IPV6",
            "level u1 [fd01::1@fd00::1]",
            "add u1-v4 IP_FAMILY_IPV4",
            "level u1-v4 [10.1.0.1@10.0.0.1]",
        ]
    );
    // The resync view: what was sent, each identity's endpoints before it (a server that holds the
    // identity without a family, from a watcher before families, takes the endpoints first).
    assert_eq!(
        shown(&t.full_view()),
        [
            "level u1 [fd01::1@fd00::1]",
            "add u1 IP_FAMILY_IPV6",
            "level u1-v4 [10.1.0.1@10.0.0.1]",
            "add u1-v4 IP_FAMILY_IPV4",
        ]
    );
}

#[test]
fn a_family_added_and_removed_touches_that_family_only() {
    let mut t = with_slices();
    let d = t.apply_service(&service(Some(&["IPv4"]), Some("SingleStack")));
    assert_eq!(
        shown(&d),
        ["add u1 IP_FAMILY_IPV4", "level u1 [10.1.0.1@10.0.0.1]"]
    );
    // SingleStack → PreferDualStack: the API server adds IPv6 to ipFamilies.
    let d = t.apply_service(&service(Some(&["IPv4", "IPv6"]), Some("PreferDualStack")));
    assert_eq!(
        shown(&d),
        ["add u1-v6 IP_FAMILY_IPV6", "level u1-v6 [fd01::1@fd00::1]"]
    );
    // And back: only the IPv6 identity goes; nothing is sent for the IPv4 one.
    let d = t.apply_service(&service(Some(&["IPv4"]), Some("SingleStack")));
    assert_eq!(shown(&d), ["remove u1-v6"]);
    // The Service deleted: both of its identities go (here the one left).
    let d = t.delete_service(&clb_watcher::translate::ObjKey::new("default", "web"));
    assert_eq!(shown(&d), ["remove u1"]);
}

/// A Service without `spec.ipFamilies` (an API server from before dual stack) is one identity of
/// no stated family: IPv4, as its frontend — its IPv6 endpoints could never get its traffic, and
/// the state server refuses them (issue 34), so they are not sent.
#[test]
fn a_service_without_ip_families_is_ipv4() {
    let mut t = with_slices();
    let d = t.apply_service(&service(None, None));
    assert_eq!(
        shown(&d),
        [
            "add u1 IP_FAMILY_UNSPECIFIED",
            "level u1 [10.1.0.1@10.0.0.1]"
        ]
    );
    // The API server filled ipFamilies in (an upgrade): the same identity, now stated IPv4, with
    // the same endpoints.
    let d = t.apply_service(&service(Some(&["IPv4"]), None));
    assert_eq!(shown(&d), ["add u1 IP_FAMILY_IPV4"]);
}

/// Readiness falls back to serving-and-terminating endpoints per family, as kube-proxy does: a
/// family whose endpoints are all terminating keeps them while the other family has ready ones.
#[test]
fn the_terminating_fallback_is_per_family() {
    let mut t = with_slices();
    t.apply_service(&service(Some(&["IPv4", "IPv6"]), Some("PreferDualStack")));
    let terminating: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": "web-6", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv6",
        "endpoints": [{"addresses": ["fd01::1"], "nodeName": "n1",
                       "conditions": {"ready": false, "serving": true, "terminating": true}}],
    }))
    .unwrap();
    assert!(
        t.apply_slice(&terminating).is_empty(),
        "fd01::1 stays while it serves"
    );
}
