//! Target ports in the watcher's translation: a Service port's `targetPort` (numeric, unset, or named
//! and resolved through the Service's EndpointSlice ports) becomes the `target_port` sent with the
//! Service — the load-balancing rule's backend port — and port-name conflicts are reported once per
//! change of the situation.

use clb_proto::v1::{Operation, Protocol, Update, update::Kind as UKind};
use clb_watcher::translate::{ObjKey, PortConflict, Translator, TranslatorConfig};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

fn service(name: &str, uid: &str, ports: Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": name, "uid": uid},
        "spec": {"type": "LoadBalancer", "ports": ports},
    }))
    .unwrap()
}

/// An endpoint: (address, node, ready).
type Ep<'a> = (&'a str, &'a str, bool);

fn slice(name: &str, service: &str, family: &str, ports: Value, eps: &[Ep<'_>]) -> EndpointSlice {
    let endpoints: Vec<Value> = eps
        .iter()
        .map(|(a, n, r)| json!({"addresses": [a], "nodeName": n, "conditions": {"ready": r}}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": family,
        "endpoints": endpoints,
        "ports": ports,
    }))
    .unwrap()
}

fn node(name: &str, ips: &[&str]) -> Node {
    let addresses: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"type": "InternalIP", "address": ip}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {"addresses": addresses},
    }))
    .unwrap()
}

/// A translator that knows nodes `n1` (10.0.0.1, fd00::1) and `n2` (10.0.0.2, fd00::2).
fn translator() -> Translator {
    let mut t = Translator::new(TranslatorConfig::default());
    t.apply_node(&node("n1", &["10.0.0.1", "fd00::1"]));
    t.apply_node(&node("n2", &["10.0.0.2", "fd00::2"]));
    t
}

/// The `(port, protocol, target port)` of every `service_add` among `updates`, in order.
fn service_adds(updates: &[Update]) -> Vec<Vec<(u32, &'static str, u32)>> {
    updates
        .iter()
        .filter_map(|u| match u.kind.as_ref()? {
            UKind::Service(s) if s.operation == Operation::Add as i32 => Some(
                s.ports
                    .iter()
                    .map(|p| {
                        let proto = if p.protocol == Protocol::Udp as i32 {
                            "udp"
                        } else {
                            "tcp"
                        };
                        (p.port, proto, p.target_port)
                    })
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

/// Whether `updates` carry an endpoints update.
fn has_endpoints(updates: &[Update]) -> bool {
    updates
        .iter()
        .any(|u| matches!(u.kind, Some(UKind::Endpoints(_))))
}

fn key(name: &str) -> ObjKey {
    ObjKey::new("default", name)
}

fn http_port(port: u16) -> Value {
    json!([{"name": "http", "port": port, "protocol": "TCP"}])
}

#[test]
fn numeric_and_unset_target_ports() {
    let mut t = translator();
    let out = t.apply_service(&service(
        "web",
        "uid-web",
        json!([
            {"name": "http", "port": 80, "targetPort": 8080},
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "https", "port": 443, "targetPort": 443},
        ]),
    ));
    assert_eq!(
        service_adds(&out),
        vec![vec![(53, "udp", 0), (80, "tcp", 8080), (443, "tcp", 443)]]
    );
    // A changed number re-sends the Service.
    let out = t.apply_service(&service(
        "web",
        "uid-web",
        json!([{"port": 80, "targetPort": 9090}]),
    ));
    assert_eq!(service_adds(&out), vec![vec![(80, "tcp", 9090)]]);
    // A target port out of range skips the port (with a warning), as a bad port does.
    let out = t.apply_service(&service(
        "web",
        "uid-web",
        json!([{"port": 80, "targetPort": 70000}, {"port": 81, "targetPort": 8081}]),
    ));
    assert_eq!(service_adds(&out), vec![vec![(81, "tcp", 8081)]]);
    assert!(t.take_port_conflicts().is_empty());
}

#[test]
fn a_named_target_port_is_resolved_through_the_endpoint_slice_ports() {
    let mut t = translator();
    let svc = service(
        "web",
        "uid-web",
        json!([{"name": "http", "port": 80, "targetPort": "web"}]),
    );
    // No slice yet: nothing tells the number, so the port itself.
    let out = t.apply_service(&svc);
    assert_eq!(service_adds(&out), vec![vec![(80, "tcp", 80)]]);

    // The slice says `http` is 8080 for its endpoints: the Service is sent again with 8080.
    let eps = [("10.1.0.1", "n1", true), ("10.1.0.2", "n2", true)];
    let out = t.apply_slice(&slice("web-a", "web", "IPv4", http_port(8080), &eps));
    assert_eq!(service_adds(&out), vec![vec![(80, "tcp", 8080)]]);
    assert!(has_endpoints(&out));

    // The pods moved to 8081 (same endpoints): only the Service is sent again.
    let out = t.apply_slice(&slice("web-a", "web", "IPv4", http_port(8081), &eps));
    assert_eq!(service_adds(&out), vec![vec![(80, "tcp", 8081)]]);
    assert!(!has_endpoints(&out), "{out:?}");
    // The same again: nothing.
    assert!(
        t.apply_slice(&slice("web-a", "web", "IPv4", http_port(8081), &eps))
            .is_empty()
    );

    // Matching is by the Service port's name and protocol: another name or protocol says nothing.
    let other = json!([{"name": "metrics", "port": 9100}, {"name": "http", "port": 7000, "protocol": "UDP"}]);
    let out = t.apply_slice(&slice(
        "web-b",
        "web",
        "IPv4",
        other,
        &[("10.1.0.3", "n1", true)],
    ));
    assert!(service_adds(&out).is_empty(), "{out:?}");

    // No endpoint is ready: the number the slices state stays (the rule does not flap to 80).
    let not_ready = [("10.1.0.1", "n1", false), ("10.1.0.2", "n2", false)];
    t.apply_slice(&slice("web-b", "web", "IPv4", http_port(8081), &[]));
    let out = t.apply_slice(&slice("web-a", "web", "IPv4", http_port(8081), &not_ready));
    assert!(service_adds(&out).is_empty(), "{out:?}");
    assert!(t.take_port_conflicts().is_empty());

    // The full view carries the resolved number.
    assert_eq!(service_adds(&t.full_view()), vec![vec![(80, "tcp", 8081)]]);
    // An unnamed single port matches the slice port without a name.
    let out = t.apply_service(&service(
        "one",
        "uid-one",
        json!([{"port": 80, "targetPort": "web"}]),
    ));
    assert_eq!(service_adds(&out), vec![vec![(80, "tcp", 80)]]);
    let out = t.apply_slice(&slice(
        "one-a",
        "one",
        "IPv4",
        json!([{"port": 8443}]),
        &[("10.1.0.9", "n1", true)],
    ));
    assert_eq!(service_adds(&out), vec![vec![(80, "tcp", 8443)]]);
}

#[test]
fn conflicting_numbers_pick_the_majority_and_are_reported_once() {
    let mut t = translator();
    t.apply_service(&service(
        "web",
        "uid-web",
        json!([{"name": "http", "port": 80, "targetPort": "web"}]),
    ));
    let three = [
        ("10.1.0.1", "n1", true),
        ("10.1.0.2", "n2", true),
        ("10.1.0.3", "n1", true),
    ];
    t.apply_slice(&slice("web-a", "web", "IPv4", http_port(9090), &three));
    let out = t.apply_slice(&slice(
        "web-b",
        "web",
        "IPv4",
        http_port(8080),
        &[("10.1.0.4", "n2", true)],
    ));
    assert!(service_adds(&out).is_empty(), "9090 stays: 3 against 1");
    let conflicts = t.take_port_conflicts();
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    let PortConflict {
        service: of,
        port_name,
        chosen,
        numbers,
        message,
    } = &conflicts[0];
    assert_eq!(of, &key("web"));
    assert_eq!(port_name, "http");
    assert_eq!(*chosen, 9090);
    assert_eq!(numbers, &vec![(8080, 1), (9090, 3)]);
    assert!(message.contains("default/web"), "{message}");
    assert!(message.contains("8080 (1 endpoint)"), "{message}");
    assert!(message.contains("9090 (3 endpoints)"), "{message}");
    assert!(message.contains("port 9090"), "{message}");

    // The same situation recomputed (a node changes, a slice is re-applied, counts move): not
    // reported again.
    t.apply_node(&node("n2", &["10.0.0.22", "fd00::2"]));
    t.apply_slice(&slice("web-a", "web", "IPv4", http_port(9090), &three));
    t.apply_slice(&slice("web-a", "web", "IPv4", http_port(9090), &three[..2]));
    assert!(t.take_port_conflicts().is_empty());

    // A tie goes to the lowest number: the Service is sent again, and the situation changed.
    let out = t.apply_slice(&slice("web-a", "web", "IPv4", http_port(9090), &three[..1]));
    assert_eq!(service_adds(&out), vec![vec![(80, "tcp", 8080)]]);
    let conflicts = t.take_port_conflicts();
    assert_eq!(conflicts.len(), 1);
    assert_eq!(
        (conflicts[0].chosen, conflicts[0].numbers.clone()),
        (8080, vec![(8080, 1), (9090, 1)])
    );

    // Not-ready endpoints do not count while some are ready: no conflict.
    let out = t.apply_slice(&slice(
        "web-a",
        "web",
        "IPv4",
        http_port(9090),
        &[("10.1.0.1", "n1", false)],
    ));
    assert!(service_adds(&out).is_empty(), "8080 stays");
    assert!(t.take_port_conflicts().is_empty());
    // The conflict comes back: reported again.
    t.apply_slice(&slice("web-a", "web", "IPv4", http_port(9090), &three));
    assert_eq!(t.take_port_conflicts().len(), 1);
    assert!(t.take_port_conflicts().is_empty(), "taken");

    // Conflicts not taken are kept once per Service and port, the latest; and dropped with the
    // Service.
    t.apply_slice(&slice("web-a", "web", "IPv4", http_port(9091), &three));
    t.apply_slice(&slice("web-a", "web", "IPv4", http_port(9092), &three));
    let conflicts = t.take_port_conflicts();
    assert_eq!(conflicts.len(), 1);
    assert_eq!(conflicts[0].chosen, 9092);
    t.apply_slice(&slice("web-a", "web", "IPv4", http_port(9093), &three));
    t.delete_service(&key("web"));
    assert!(t.take_port_conflicts().is_empty());
    // Also when the conflict was over before the Service went.
    t.apply_service(&service(
        "web",
        "uid-web",
        json!([{"name": "http", "port": 80, "targetPort": "web"}]),
    ));
    t.delete_slice(&key("web-b"));
    t.delete_service(&key("web"));
    assert!(t.take_port_conflicts().is_empty());
}

#[test]
fn dual_stack_resolves_over_every_slice_of_the_service() {
    let mut t = translator();
    t.apply_service(&service(
        "web",
        "uid-web",
        json!([{"name": "http", "port": 80, "targetPort": "web"}, {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns"}]),
    ));
    let ports = |http: u16, dns: u16| json!([{"name": "http", "port": http}, {"name": "dns", "port": dns, "protocol": "UDP"}]);
    t.apply_slice(&slice(
        "web-v4",
        "web",
        "IPv4",
        ports(8080, 5353),
        &[("10.1.0.1", "n1", true), ("10.1.0.2", "n2", true)],
    ));
    let out = t.apply_slice(&slice(
        "web-v6",
        "web",
        "IPv6",
        ports(8080, 5353),
        &[("fd01::1", "n1", true), ("fd01::2", "n2", true)],
    ));
    assert!(service_adds(&out).is_empty(), "already 8080 and 5353");
    assert_eq!(
        service_adds(&t.full_view()),
        vec![vec![(53, "udp", 5353), (80, "tcp", 8080)]]
    );
    assert!(t.take_port_conflicts().is_empty());

    // The IPv6 pods say 9090 for http, and there are more of them: 9090 wins over both families.
    let out = t.apply_slice(&slice(
        "web-v6",
        "web",
        "IPv6",
        ports(9090, 5353),
        &[
            ("fd01::1", "n1", true),
            ("fd01::2", "n2", true),
            ("fd01::3", "n2", true),
        ],
    ));
    assert_eq!(
        service_adds(&out),
        vec![vec![(53, "udp", 5353), (80, "tcp", 9090)]]
    );
    let conflicts = t.take_port_conflicts();
    assert_eq!(conflicts.len(), 1, "only http disagrees: {conflicts:?}");
    assert_eq!(conflicts[0].port_name, "http");
    assert_eq!(conflicts[0].numbers, vec![(8080, 2), (9090, 3)]);
}
