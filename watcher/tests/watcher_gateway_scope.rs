//! The translator scoped to one gateway of a gateways file (`--gateways-file`): only the Services
//! exposed there, only endpoints and pods on its nodes, refused annotations change nothing, a
//! held node stays until released, and the topology names only its nodes.

use std::sync::Arc;

use clb_proto::v1::{Update, endpoints_update::Change, update::Kind as UKind};
use clb_watcher::Gateways;
use clb_watcher::routing::{GATEWAYS_ANNOTATION, GatewayScope, NODEPOOL_SELECTOR_ANNOTATION};
use clb_watcher::translate::{EGRESS_LABEL, Translator, TranslatorConfig};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

const FILE: &str = r#"
gateways:
  - name: a
    labels: {region: east, tier: edge}
    nodes: {pool: pool-a}
    azure: {subscription: s, resourceGroup: rg-a, region: eastus}
  - name: b
    labels: {region: west, tier: edge}
    nodes: {pool: pool-b}
    azure: {subscription: s, resourceGroup: rg-b, region: westus}
"#;

fn translator(gateway: &str) -> Translator {
    Translator::new(TranslatorConfig {
        gateway: Some(GatewayScope {
            gateways: Arc::new(Gateways::parse(FILE).unwrap()),
            name: gateway.into(),
        }),
        ..TranslatorConfig::default()
    })
}

fn service(name: &str, annotations: Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": name, "uid": format!("uid-{name}"),
                     "annotations": annotations},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]},
    }))
    .unwrap()
}

fn node(name: &str, pool: &str, ip: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"apps.openyurt.io/nodepool": pool}},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
    }))
    .unwrap()
}

fn slice(service: &str, eps: &[(&str, &str)]) -> EndpointSlice {
    let endpoints: Vec<Value> = eps
        .iter()
        .map(|(a, n)| json!({"addresses": [a], "nodeName": n}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": format!("{service}-1"),
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": endpoints,
    }))
    .unwrap()
}

fn pod(name: &str, node: &str, ip: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": name, "uid": format!("uid-{name}"),
                     "labels": {EGRESS_LABEL: "eg"}},
        "spec": {"nodeName": node, "containers": []},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    }))
    .unwrap()
}

/// `+svc UID`, `-svc UID`, `eps UID [a@l,…]`, `+pod a@l`, `-pod a@l`.
fn show(us: &[Update]) -> Vec<String> {
    us.iter()
        .map(|u| match u.kind.as_ref().unwrap() {
            UKind::Service(s) if s.operation == clb_proto::v1::Operation::Add as i32 => {
                format!("+svc {}", s.service_id)
            }
            UKind::Service(s) => format!("-svc {}", s.service_id),
            UKind::Endpoints(e) => match e.change.as_ref().unwrap() {
                Change::Level(l) => {
                    let eps: Vec<String> = l
                        .endpoints
                        .iter()
                        .map(|e| format!("{}@{}", e.address, e.location))
                        .collect();
                    format!("eps {} [{}]", e.service_id, eps.join(","))
                }
                Change::Edge(_) => "edge".into(),
            },
            UKind::Pod(p) if p.operation == clb_proto::v1::Operation::Add as i32 => {
                format!("+pod {}@{}", p.address, p.location)
            }
            UKind::Pod(p) => format!("-pod {}@{}", p.address, p.location),
            UKind::Egress(_) => "egress".into(),
        })
        .collect()
}

/// Both translators fed the same cluster: web (default gateway a), both (tier=edge: a and b).
fn cluster() -> (Translator, Translator) {
    let (mut a, mut b) = (translator("a"), translator("b"));
    for t in [&mut a, &mut b] {
        t.apply_node(&node("n-a", "pool-a", "10.0.0.1"));
        t.apply_node(&node("n-b", "pool-b", "10.0.0.2"));
        t.apply_service(&service("web", json!({})));
        t.apply_service(&service(
            "both",
            json!({NODEPOOL_SELECTOR_ANNOTATION: "tier=edge"}),
        ));
        t.apply_slice(&slice("web", &[("10.1.0.1", "n-a"), ("10.1.0.2", "n-b")]));
        t.apply_slice(&slice("both", &[("10.2.0.1", "n-a"), ("10.2.0.2", "n-b")]));
        t.apply_pod(&pod("p1", "n-a", "10.1.0.5"));
        t.apply_pod(&pod("p2", "n-b", "10.1.0.6"));
    }
    (a, b)
}

#[test]
fn each_gateway_gets_its_services_and_its_nodes_endpoints_and_pods() {
    let (a, b) = cluster();
    assert_eq!(
        show(&a.full_view()),
        [
            "+svc uid-both",
            "eps uid-both [10.2.0.1@10.0.0.1]",
            "+svc uid-web",
            "eps uid-web [10.1.0.1@10.0.0.1]",
            "+pod 10.1.0.5@10.0.0.1",
        ]
    );
    assert_eq!(
        show(&b.full_view()),
        [
            "+svc uid-both",
            "eps uid-both [10.2.0.2@10.0.0.2]",
            "+pod 10.1.0.6@10.0.0.2",
        ]
    );
    // The topology of each gateway: its nodes only.
    let names = |t: &Translator| t.nodes().into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    assert_eq!(names(&a), ["n-a"]);
    assert_eq!(names(&b), ["n-b"]);
    // A pod on a node not known yet is not sent anywhere (its gateway is unknown).
    let mut a = a;
    assert!(a.apply_pod(&pod("p3", "n-new", "10.1.0.9")).is_empty());
}

#[test]
fn deselection_removes_from_that_gateway_only_and_refused_annotations_change_nothing() {
    let (mut a, mut b) = cluster();
    let only_b = service("both", json!({GATEWAYS_ANNOTATION: "b"}));
    assert_eq!(show(&a.apply_service(&only_b)), ["-svc uid-both"]);
    assert!(b.apply_service(&only_b).is_empty());
    for bad in [
        json!({NODEPOOL_SELECTOR_ANNOTATION: "tier in (edge)"}),
        json!({GATEWAYS_ANNOTATION: "c"}),
        json!({NODEPOOL_SELECTOR_ANNOTATION: "tier=none"}),
    ] {
        let svc = service("both", bad.clone());
        assert!(a.apply_service(&svc).is_empty(), "{bad}");
        assert!(b.apply_service(&svc).is_empty(), "{bad}");
    }
    assert!(!show(&a.full_view()).contains(&"+svc uid-both".to_owned()));
    assert!(show(&b.full_view()).contains(&"+svc uid-both".to_owned()));
}

#[test]
fn a_moved_node_is_held_at_its_old_gateway_until_released() {
    let (mut a, mut b) = cluster();
    let moved = node("n-b", "pool-a", "10.0.0.2");
    // Held at b (the old gateway) before the move is applied: nothing changes there.
    assert!(b.hold_node("n-b", true).is_empty());
    assert!(b.apply_node(&moved).is_empty());
    // (The Services on a node come in no particular order.)
    let mut added = show(&a.apply_node(&moved));
    added.sort();
    assert_eq!(
        added,
        [
            "+pod 10.1.0.6@10.0.0.2",
            "eps uid-both [10.2.0.1@10.0.0.1,10.2.0.2@10.0.0.2]",
            "eps uid-web [10.1.0.1@10.0.0.1,10.1.0.2@10.0.0.2]",
        ]
    );
    assert!(b.serves_node("n-b"), "still declared by b while held");
    // Released: b drops the node.
    assert_eq!(
        show(&b.hold_node("n-b", false)),
        ["eps uid-both []", "-pod 10.1.0.6@10.0.0.2"]
    );
    assert!(!b.serves_node("n-b"));
    assert!(b.nodes().is_empty());
}

/// A pod as the kubelet reports it, with `status.hostIPs` (its node's IP).
fn hosted_pod(name: &str, node: &str, ip: &str, host: &str) -> Pod {
    let mut p = pod(name, node, ip);
    let status = p.status.as_mut().unwrap();
    status.host_ip = Some(host.into());
    status.host_ips = Some(vec![k8s_openapi::api::core::v1::HostIP { ip: host.into() }]);
    p
}

/// A pod's `hostIPs` do not say which gateway it belongs to: a pod on a node another gateway serves
/// is not located through them, in the cluster watcher's lanes and in a node agent's alike (the
/// agent writes its pods to its node's gateway only); when its node moves here, it comes along.
#[test]
fn a_pod_on_a_node_of_another_gateway_is_not_sent_through_its_host_ips() {
    let (mut a, mut b) = cluster();
    assert!(
        b.apply_pod(&hosted_pod("p1", "n-a", "10.1.0.5", "10.0.0.1"))
            .is_empty()
    );
    assert!(
        show(&a.apply_pod(&hosted_pod("p1", "n-a", "10.1.0.5", "10.0.0.1"))).is_empty(),
        "unchanged at a"
    );
    // A node agent of n-a: one translator per gateway, fed its Node and its pods.
    let agent = |gateway: &str| {
        let mut t = Translator::new(TranslatorConfig {
            node: Some("n-a".into()),
            ..translator(gateway).config().clone()
        });
        t.apply_node(&node("n-a", "pool-a", "10.0.0.1"));
        t.apply_pod(&hosted_pod("p1", "n-a", "10.1.0.5", "10.0.0.1"));
        t
    };
    let (mut at_a, mut at_b) = (agent("a"), agent("b"));
    assert_eq!(show(&at_a.full_view()), ["+pod 10.1.0.5@10.0.0.1"]);
    assert!(at_b.full_view().is_empty(), "{:?}", show(&at_b.full_view()));
    assert!(at_b.pod_locations().is_empty());
    assert!(at_b.node_ips("n-a").is_none());
    // n-a moves to pool-b: b takes its pod, a lets it go.
    let moved = node("n-a", "pool-b", "10.0.0.1");
    assert_eq!(show(&at_b.apply_node(&moved)), ["+pod 10.1.0.5@10.0.0.1"]);
    assert_eq!(show(&at_a.apply_node(&moved)), ["-pod 10.1.0.5@10.0.0.1"]);
}
