//! The watcher's translator (Kubernetes objects → clb updates), synchronously over k8s-openapi
//! objects: deltas, dual-stack, readiness, moves, egress changes, Service type and class, malformed
//! objects, relists, and that a resync view always equals the net effect of the deltas sent.

use std::collections::{BTreeMap, BTreeSet};

use clb_proto::v1::{Operation, Protocol, Update, endpoints_update::Change, update::Kind as UKind};
use clb_watcher::translate::{
    DEFAULT_CLASS, EGRESS_LABEL, FINALIZER, Kind, ObjKey, Translator, TranslatorConfig,
};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

// ---- object builders ----

fn service(name: &str, uid: &str, spec: Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": name, "uid": uid, "resourceVersion": "1"},
        "spec": spec,
    }))
    .unwrap()
}

fn lb(name: &str, uid: &str) -> Service {
    service(
        name,
        uid,
        json!({"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]}),
    )
}

/// `(address, node, ready, serving, terminating)`; `None` conditions are left out.
type Ep<'a> = (&'a str, &'a str, Option<bool>, Option<bool>, Option<bool>);

fn slice(name: &str, service: &str, family: &str, eps: &[Ep<'_>]) -> EndpointSlice {
    let endpoints: Vec<Value> = eps
        .iter()
        .map(|(a, n, r, s, t)| {
            let mut c = serde_json::Map::new();
            if let Some(r) = r {
                c.insert("ready".into(), json!(r));
            }
            if let Some(s) = s {
                c.insert("serving".into(), json!(s));
            }
            if let Some(t) = t {
                c.insert("terminating".into(), json!(t));
            }
            json!({"addresses": [a], "nodeName": n, "conditions": c})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": family,
        "endpoints": endpoints,
    }))
    .unwrap()
}

/// An [`Ep`] owning its address.
type OwnedEp = (
    String,
    &'static str,
    Option<bool>,
    Option<bool>,
    Option<bool>,
);

fn ready<'a>(a: &'a str, n: &'a str) -> Ep<'a> {
    (a, n, None, None, None)
}

fn node(name: &str, ips: &[&str]) -> Node {
    let addresses: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"type": "InternalIP", "address": ip}))
        .chain(std::iter::once(
            json!({"type": "Hostname", "address": name}),
        ))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {"addresses": addresses},
    }))
    .unwrap()
}

fn pod(name: &str, uid: &str, node: &str, ips: &[&str], egress: Option<&str>) -> Pod {
    let labels = match egress {
        Some(e) => json!({ EGRESS_LABEL: e, "app": "x" }),
        None => json!({"app": "x"}),
    };
    let pod_ips: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": name, "uid": uid, "labels": labels},
        "spec": {"nodeName": node, "containers": []},
        "status": {"phase": "Running", "podIP": ips.first(), "podIPs": pod_ips},
    }))
    .unwrap()
}

fn key(name: &str) -> ObjKey {
    ObjKey::new("default", name)
}

// ---- reading updates ----

/// A readable form of an update, for exact assertions.
fn show(u: &Update) -> String {
    match u.kind.as_ref().unwrap() {
        UKind::Service(s) if s.operation == Operation::Add as i32 => {
            let ports: Vec<String> = s
                .ports
                .iter()
                .map(|p| {
                    let proto = if p.protocol == Protocol::Udp as i32 {
                        "udp"
                    } else {
                        "tcp"
                    };
                    format!("{}/{proto}", p.port)
                })
                .collect();
            format!("+svc {} [{}]", s.service_id, ports.join(","))
        }
        UKind::Service(s) => format!("-svc {}", s.service_id),
        UKind::Egress(e) => format!("egress {} {}", e.operation, e.egress_id),
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
        UKind::Pod(p) if p.operation == Operation::Add as i32 => format!(
            "+pod {}@{} {} {} {}",
            p.address, p.location, p.egress_id, p.pod_key, p.pod_uid
        ),
        UKind::Pod(p) => format!(
            "-pod {}@{} {} {}",
            p.address, p.location, p.pod_key, p.pod_uid
        ),
    }
}

fn shows(us: &[Update]) -> Vec<String> {
    us.iter().map(show).collect()
}

/// The desired state a sequence of updates leaves on the server (the rules of `docs/contract.md` §3 that matter here).
#[derive(Debug, Default, PartialEq, Eq)]
struct Model {
    services: BTreeMap<String, Vec<(u32, i32, u32)>>,
    endpoints: BTreeMap<String, BTreeSet<(String, String)>>,
    /// address → (location, egress, key, uid)
    pods: BTreeMap<String, (String, String, String, String)>,
}

impl Model {
    fn of(updates: &[Update]) -> Self {
        let mut m = Self::default();
        for u in updates {
            m.apply(u);
        }
        m
    }

    fn apply(&mut self, u: &Update) {
        match u.kind.as_ref().unwrap() {
            UKind::Service(s) if s.operation == Operation::Add as i32 => {
                self.services.insert(
                    s.service_id.clone(),
                    s.ports
                        .iter()
                        .map(|p| (p.port, p.protocol, p.target_port))
                        .collect(),
                );
            }
            UKind::Service(s) => {
                self.services.remove(&s.service_id);
                self.endpoints.remove(&s.service_id);
            }
            UKind::Egress(_) => panic!("the watcher declares no egress: {u:?}"),
            UKind::Endpoints(e) => match e.change.as_ref().unwrap() {
                Change::Level(l) => {
                    let set: BTreeSet<_> = l
                        .endpoints
                        .iter()
                        .map(|e| (e.address.clone(), e.location.clone()))
                        .collect();
                    assert_eq!(set.len(), l.endpoints.len(), "duplicate address in {u:?}");
                    if set.is_empty() {
                        self.endpoints.remove(&e.service_id);
                    } else {
                        self.endpoints.insert(e.service_id.clone(), set);
                    }
                }
                Change::Edge(_) => panic!("the watcher sends levels only"),
            },
            UKind::Pod(p) if p.operation == Operation::Add as i32 => {
                self.pods.insert(
                    p.address.clone(),
                    (
                        p.location.clone(),
                        p.egress_id.clone(),
                        p.pod_key.clone(),
                        p.pod_uid.clone(),
                    ),
                );
            }
            UKind::Pod(p) => {
                let cur = self
                    .pods
                    .get(&p.address)
                    .unwrap_or_else(|| panic!("removal of a pod never added: {u:?}"));
                assert_eq!(
                    (&cur.0, &cur.3),
                    (&p.location, &p.pod_uid),
                    "removal names another location or pod"
                );
                self.pods.remove(&p.address);
            }
        }
    }
}

fn config() -> TranslatorConfig {
    TranslatorConfig::default()
}

/// Every delta returned, in order; for comparing with the view.
#[derive(Default)]
struct Log(Vec<Update>);

impl Log {
    fn take(&mut self, us: Vec<Update>) -> Vec<String> {
        let s = shows(&us);
        self.0.extend(us);
        s
    }
}

fn assert_view_is_net_effect(t: &Translator, log: &Log) {
    let view = t.full_view();
    for u in &view {
        let add = match u.kind.as_ref().unwrap() {
            UKind::Service(s) => s.operation == Operation::Add as i32,
            UKind::Pod(p) => p.operation == Operation::Add as i32,
            UKind::Endpoints(e) => matches!(e.change, Some(Change::Level(_))),
            UKind::Egress(_) => false,
        };
        assert!(add, "a view holds only additions and levels: {}", show(u));
    }
    assert_eq!(
        Model::of(&view),
        Model::of(&log.0),
        "view: {:#?}",
        shows(&view)
    );
}

// ---- tests ----

#[test]
fn a_load_balancer_service_with_slices_becomes_a_service_and_its_endpoints() {
    let mut t = Translator::new(config());
    let mut log = Log::default();
    assert!(
        log.take(t.apply_node(&node("n1", &["10.0.0.1"])))
            .is_empty()
    );
    assert!(
        log.take(t.apply_node(&node("n2", &["10.0.0.2"])))
            .is_empty()
    );
    // Endpoints of a Service not yet seen are kept, not sent.
    let s1 = slice(
        "web-1",
        "web",
        "IPv4",
        &[ready("10.1.0.1", "n1"), ready("10.1.0.2", "n2")],
    );
    assert!(log.take(t.apply_slice(&s1)).is_empty());
    assert_eq!(
        log.take(t.apply_service(&lb("web", "uid-web"))),
        vec![
            "+svc uid-web [53/udp,80/tcp]",
            "eps uid-web [10.1.0.1@10.0.0.1,10.1.0.2@10.0.0.2]"
        ]
    );
    // A second slice of the same Service: the level is the union.
    let s2 = slice("web-2", "web", "IPv4", &[ready("10.1.0.3", "n1")]);
    assert_eq!(
        log.take(t.apply_slice(&s2)),
        vec!["eps uid-web [10.1.0.1@10.0.0.1,10.1.0.2@10.0.0.2,10.1.0.3@10.0.0.1]"]
    );
    // The same object again: nothing.
    assert!(log.take(t.apply_slice(&s2)).is_empty());
    assert!(log.take(t.apply_service(&lb("web", "uid-web"))).is_empty());
    // Ports change: the service is added again with the new ports (NRP updates its rules).
    let web443 = service(
        "web",
        "uid-web",
        json!({"type": "LoadBalancer", "ports": [{"port": 443}]}),
    );
    assert_eq!(
        log.take(t.apply_service(&web443)),
        vec!["+svc uid-web [443/tcp]"]
    );
    // A slice goes.
    assert_eq!(
        log.take(t.delete_slice(&key("web-1"))),
        vec!["eps uid-web [10.1.0.3@10.0.0.1]"]
    );
    // The Service goes: one removal (it strips the endpoints on the server).
    assert_eq!(
        log.take(t.delete_service(&key("web"))),
        vec!["-svc uid-web"]
    );
    assert!(t.full_view().is_empty());
    assert_view_is_net_effect(&t, &log);
}

#[test]
fn dual_stack_endpoints_and_pods_go_to_the_node_ip_of_their_family() {
    let mut t = Translator::new(config());
    let mut log = Log::default();
    log.take(t.apply_node(&node("n1", &["10.0.0.1", "fd00::1"])));
    log.take(t.apply_node(&node("v4only", &["10.0.0.2"])));
    let dual = service(
        "web",
        "uid-web",
        json!({"type": "LoadBalancer", "ipFamilyPolicy": "RequireDualStack",
               "ipFamilies": ["IPv4", "IPv6"], "ports": [{"port": 80, "protocol": "TCP"}]}),
    );
    log.take(t.apply_service(&dual));
    let v4 = slice("web-v4", "web", "IPv4", &[ready("10.1.0.1", "n1")]);
    let v6 = slice(
        "web-v6",
        "web",
        "IPv6",
        &[ready("FD01:0:0::1", "n1"), ready("fd01::2", "v4only")],
    );
    assert_eq!(
        log.take(t.apply_slice(&v4)),
        vec!["eps uid-web [10.1.0.1@10.0.0.1]"]
    );
    // IPv6 addresses are canonicalised; the one on a node without an IPv6 InternalIP is skipped.
    assert_eq!(
        log.take(t.apply_slice(&v6)),
        vec!["eps uid-web-v6 [fd01::1@fd00::1]"]
    );
    // A dual-stack egress pod: one pod update per family.
    let p = pod("p", "uid-p", "n1", &["10.1.0.9", "fd01::9"], Some("eg"));
    assert_eq!(
        log.take(t.apply_pod(&p)),
        vec![
            "+pod 10.1.0.9@10.0.0.1 eg default/p uid-p",
            "+pod fd01::9@fd00::1 eg default/p uid-p"
        ]
    );
    let locs: Vec<String> = t.pod_locations().iter().map(ToString::to_string).collect();
    assert_eq!(locs, vec!["10.0.0.1", "fd00::1"]);
    assert_eq!(
        shows(&t.sent().pods_at("fd00::1".parse().unwrap())),
        vec!["+pod fd01::9@fd00::1 eg default/p uid-p"]
    );
    // The node gains an IPv6 InternalIP: the skipped endpoint appears.
    assert_eq!(
        log.take(t.apply_node(&node("v4only", &["10.0.0.2", "fd00::2"]))),
        vec!["eps uid-web-v6 [fd01::1@fd00::1,fd01::2@fd00::2]"]
    );
    assert_view_is_net_effect(&t, &log);
}

#[test]
fn readiness_follows_the_endpoint_conditions() {
    let mut t = Translator::new(config());
    let mut log = Log::default();
    log.take(t.apply_node(&node("n1", &["10.0.0.1"])));
    log.take(t.apply_service(&lb("web", "uid-web")));
    let s = slice(
        "web-1",
        "web",
        "IPv4",
        &[
            ("10.1.0.1", "n1", None, None, None), // unset = ready
            ("10.1.0.2", "n1", Some(true), Some(true), Some(false)),
            ("10.1.0.3", "n1", Some(false), Some(false), Some(false)), // not ready
            ("10.1.0.4", "n1", Some(false), Some(true), Some(true)),   // terminating, still serving
            ("10.1.0.5", "n1", Some(false), None, Some(true)),         // serving unset = as ready
        ],
    );
    assert_eq!(
        log.take(t.apply_slice(&s)),
        vec!["eps uid-web [10.1.0.1@10.0.0.1,10.1.0.2@10.0.0.1]"]
    );
    // Every endpoint terminating: the serving ones keep the traffic (kube-proxy's fallback).
    let s = slice(
        "web-1",
        "web",
        "IPv4",
        &[
            ("10.1.0.3", "n1", Some(false), Some(false), Some(true)),
            ("10.1.0.4", "n1", Some(false), Some(true), Some(true)),
        ],
    );
    assert_eq!(
        log.take(t.apply_slice(&s)),
        vec!["eps uid-web [10.1.0.4@10.0.0.1]"]
    );
    // Nothing serving: an empty level.
    let s = slice(
        "web-1",
        "web",
        "IPv4",
        &[("10.1.0.4", "n1", Some(false), Some(false), Some(true))],
    );
    assert_eq!(log.take(t.apply_slice(&s)), vec!["eps uid-web []"]);
    assert_view_is_net_effect(&t, &log);
}

#[test]
fn a_pod_that_moves_is_removed_at_the_old_location_and_added_at_the_new_one() {
    let mut t = Translator::new(config());
    let mut log = Log::default();
    log.take(t.apply_node(&node("n1", &["10.0.0.1"])));
    log.take(t.apply_node(&node("n2", &["10.0.0.2"])));
    log.take(t.apply_service(&lb("web", "uid-web")));
    log.take(t.apply_pod(&pod("p", "uid-1", "n1", &["10.1.0.9"], Some("eg"))));
    log.take(t.apply_slice(&slice("web-1", "web", "IPv4", &[ready("10.1.0.9", "n1")])));
    // The same pod (same UID) shows up on n2 (e.g. a restored snapshot): remove + add.
    assert_eq!(
        log.take(t.apply_pod(&pod("p", "uid-1", "n2", &["10.1.0.9"], Some("eg")))),
        vec![
            "-pod 10.1.0.9@10.0.0.1 default/p uid-1",
            "+pod 10.1.0.9@10.0.0.2 eg default/p uid-1"
        ]
    );
    // A replacement pod with the same name (new UID) on n1 and a new IP.
    assert_eq!(
        log.take(t.apply_pod(&pod("p", "uid-2", "n1", &["10.1.0.10"], Some("eg")))),
        vec![
            "-pod 10.1.0.9@10.0.0.2 default/p uid-1",
            "+pod 10.1.0.10@10.0.0.1 eg default/p uid-2"
        ]
    );
    // A node's InternalIP changes: its endpoints and pods are relocated.
    assert_eq!(
        log.take(t.apply_node(&node("n1", &["10.0.0.11"]))),
        vec![
            "eps uid-web [10.1.0.9@10.0.0.11]",
            "-pod 10.1.0.10@10.0.0.1 default/p uid-2",
            "+pod 10.1.0.10@10.0.0.11 eg default/p uid-2"
        ]
    );
    assert_view_is_net_effect(&t, &log);
    // The node is deleted: what was on it can no longer be located... but a pod keeps its hostIP.
    let mut with_host = pod("q", "uid-q", "n2", &["10.1.0.20"], Some("eg"));
    with_host.status.as_mut().unwrap().host_ip = Some("10.0.0.2".into());
    log.take(t.apply_pod(&with_host));
    assert_eq!(log.take(t.delete_node("n2")), Vec::<String>::new());
    assert_eq!(
        log.take(t.delete_node("n1")),
        vec!["eps uid-web []", "-pod 10.1.0.10@10.0.0.11 default/p uid-2"]
    );
    assert_view_is_net_effect(&t, &log);
}

#[test]
fn an_egress_label_change_re_adds_the_pod_with_its_new_outbound_identity() {
    let mut t = Translator::new(config());
    let mut log = Log::default();
    log.take(t.apply_node(&node("n1", &["10.0.0.1"])));
    assert_eq!(
        log.take(t.apply_pod(&pod("p", "uid-1", "n1", &["10.1.0.9"], Some("eg-a")))),
        vec!["+pod 10.1.0.9@10.0.0.1 eg-a default/p uid-1"]
    );
    assert_eq!(
        log.take(t.apply_pod(&pod("p", "uid-1", "n1", &["10.1.0.9"], Some("eg-b")))),
        vec!["+pod 10.1.0.9@10.0.0.1 eg-b default/p uid-1"]
    );
    // Label removed (or emptied): the pod is no longer reported.
    assert_eq!(
        log.take(t.apply_pod(&pod("p", "uid-1", "n1", &["10.1.0.9"], None))),
        vec!["-pod 10.1.0.9@10.0.0.1 default/p uid-1"]
    );
    log.take(t.apply_pod(&pod("p", "uid-1", "n1", &["10.1.0.9"], Some("eg-b"))));
    assert_eq!(
        log.take(t.apply_pod(&pod("p", "uid-1", "n1", &["10.1.0.9"], Some("  ")))),
        vec!["-pod 10.1.0.9@10.0.0.1 default/p uid-1"]
    );
    // A pod that finished releases its IP: removed.
    log.take(t.apply_pod(&pod("p", "uid-1", "n1", &["10.1.0.9"], Some("eg-b"))));
    let mut done = pod("p", "uid-1", "n1", &["10.1.0.9"], Some("eg-b"));
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    assert_eq!(
        log.take(t.apply_pod(&done)),
        vec!["-pod 10.1.0.9@10.0.0.1 default/p uid-1"]
    );
    // Host-network pods are not reported.
    let mut host = pod("h", "uid-h", "n1", &["10.0.0.1"], Some("eg-b"));
    host.spec.as_mut().unwrap().host_network = Some(true);
    assert!(log.take(t.apply_pod(&host)).is_empty());
    assert_view_is_net_effect(&t, &log);
}

#[test]
fn a_service_that_stops_being_a_load_balancer_is_removed_and_comes_back() {
    let mut t = Translator::new(config());
    let mut log = Log::default();
    log.take(t.apply_node(&node("n1", &["10.0.0.1"])));
    log.take(t.apply_slice(&slice("web-1", "web", "IPv4", &[ready("10.1.0.1", "n1")])));
    log.take(t.apply_service(&lb("web", "uid-web")));
    let cluster_ip = service(
        "web",
        "uid-web",
        json!({"type": "ClusterIP", "ports": [{"port": 80}]}),
    );
    assert_eq!(log.take(t.apply_service(&cluster_ip)), vec!["-svc uid-web"]);
    // Endpoint changes of a Service that is not ours send nothing.
    assert!(
        log.take(t.apply_slice(&slice("web-1", "web", "IPv4", &[ready("10.1.0.2", "n1")])))
            .is_empty()
    );
    assert_eq!(
        log.take(t.apply_service(&lb("web", "uid-web"))),
        vec![
            "+svc uid-web [53/udp,80/tcp]",
            "eps uid-web [10.1.0.2@10.0.0.1]"
        ]
    );
    // Deleted and re-created under the same name: a new UID, so a new inbound identity.
    assert_eq!(
        log.take(t.apply_service(&lb("web", "uid-web-2"))),
        vec![
            "-svc uid-web",
            "+svc uid-web-2 [53/udp,80/tcp]",
            "eps uid-web-2 [10.1.0.2@10.0.0.1]"
        ]
    );
    // Being deleted: removed at once.
    let mut deleting = lb("web", "uid-web-2");
    deleting.metadata.deletion_timestamp =
        Some(serde_json::from_value(json!("2025-01-01T00:00:00Z")).unwrap());
    assert_eq!(log.take(t.apply_service(&deleting)), vec!["-svc uid-web-2"]);
    assert_view_is_net_effect(&t, &log);
}

#[test]
fn only_load_balancers_of_our_class_are_served() {
    let mut t = Translator::new(config());
    let mut log = Log::default();
    let other = service(
        "other",
        "uid-other",
        json!({"type": "LoadBalancer", "loadBalancerClass": "example.com/other", "ports": [{"port": 80}]}),
    );
    assert!(log.take(t.apply_service(&other)).is_empty());
    let ours = service(
        "ours",
        "uid-ours",
        json!({"type": "LoadBalancer", "loadBalancerClass": DEFAULT_CLASS, "ports": [{"port": 80}]}),
    );
    assert_eq!(
        log.take(t.apply_service(&ours)),
        vec!["+svc uid-ours [80/tcp]"]
    );
    assert!(
        log.take(t.apply_service(&service("np", "uid-np", json!({"type": "NodePort"}))))
            .is_empty()
    );

    // With unclassed Services not claimed, only the explicit class is ours.
    let mut t = Translator::new(TranslatorConfig {
        claim_unclassed: false,
        class: "example.com/mine".into(),
        ..config()
    });
    assert!(t.apply_service(&lb("web", "uid-web")).is_empty());
    assert!(t.apply_service(&ours).is_empty());
    let mine = service(
        "mine",
        "uid-mine",
        json!({"type": "LoadBalancer", "loadBalancerClass": "example.com/mine", "ports": [{"port": 80}]}),
    );
    assert_eq!(
        shows(&t.apply_service(&mine)),
        vec!["+svc uid-mine [80/tcp]"]
    );
}

#[test]
fn a_required_finalizer_holds_programming_back_until_it_is_there() {
    let mut t = Translator::new(TranslatorConfig {
        require_finalizer: Some(FINALIZER.into()),
        ..config()
    });
    assert!(t.apply_service(&lb("web", "uid-web")).is_empty());
    let mut with = lb("web", "uid-web");
    with.metadata.finalizers = Some(vec!["other/x".into(), FINALIZER.into()]);
    assert_eq!(
        shows(&t.apply_service(&with)),
        vec!["+svc uid-web [53/udp,80/tcp]"]
    );
    with.metadata.deletion_timestamp =
        Some(serde_json::from_value(json!("2025-01-01T00:00:00Z")).unwrap());
    assert_eq!(shows(&t.apply_service(&with)), vec!["-svc uid-web"]);
}

#[test]
fn malformed_objects_are_skipped_and_never_remove_what_was_sent() {
    let mut t = Translator::new(config());
    let mut log = Log::default();
    log.take(t.apply_node(&node("n1", &["10.0.0.1"])));
    // A node with a malformed InternalIP keeps its valid one.
    log.take(t.apply_node(&node("n2", &["not-an-ip", "10.0.0.2"])));
    assert_eq!(
        t.node_ips("n2").unwrap().v4,
        Some("10.0.0.2".parse().unwrap())
    );

    // No UID: skipped.
    let mut no_uid = lb("nouid", "x");
    no_uid.metadata.uid = None;
    assert!(log.take(t.apply_service(&no_uid)).is_empty());
    // No name / no namespace: skipped.
    let mut no_name = lb("x", "uid-x");
    no_name.metadata.name = None;
    assert!(log.take(t.apply_service(&no_name)).is_empty());
    let mut no_ns = lb("x", "uid-x");
    no_ns.metadata.namespace = None;
    assert!(log.take(t.apply_service(&no_ns)).is_empty());

    // SCTP, port 0 and a port out of range are skipped; the valid ports remain.
    let odd = service(
        "odd",
        "uid-odd",
        json!({"type": "LoadBalancer", "ports": [
            {"port": 80, "protocol": "SCTP"}, {"port": 0}, {"port": 70000}, {"port": -1},
            {"port": 8080, "protocol": "TCP"}, {"port": 8080}
        ]}),
    );
    assert_eq!(
        log.take(t.apply_service(&odd)),
        vec!["+svc uid-odd [8080/tcp]"]
    );

    // Bad endpoints: malformed IP, family differing from addressType, no nodeName, unknown node.
    let bad: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": "odd-1", "labels": {"kubernetes.io/service-name": "odd"}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": ["10.1.0.300"], "nodeName": "n1"},
            {"addresses": ["fd01::1"], "nodeName": "n1"},
            {"addresses": ["10.1.0.2"]},
            {"addresses": ["10.1.0.3"], "nodeName": "nowhere"},
            {"addresses": [], "nodeName": "n1"},
            {"addresses": ["10.1.0.4"], "nodeName": "n2"}
        ]
    }))
    .unwrap();
    assert_eq!(
        log.take(t.apply_slice(&bad)),
        vec!["eps uid-odd [10.1.0.4@10.0.0.2]"]
    );
    assert_eq!(t.warn_unlocated(), 1, "10.1.0.3 on an unknown node");
    // Unknown address types are ignored, FQDN slices too.
    let fqdn = slice("odd-2", "odd", "FQDN", &[ready("example.com", "n1")]);
    assert!(log.take(t.apply_slice(&fqdn)).is_empty());

    // A pod sent once, then reported with only malformed IPs, or without UID: what was sent stays.
    log.take(t.apply_pod(&pod("p", "uid-p", "n1", &["10.1.0.9"], Some("eg"))));
    assert!(
        log.take(t.apply_pod(&pod("p", "uid-p", "n1", &["10.1.0.999"], Some("eg"))))
            .is_empty()
    );
    let mut no_uid = pod("p", "uid-p", "n1", &["10.1.0.9"], Some("eg"));
    no_uid.metadata.uid = None;
    assert!(log.take(t.apply_pod(&no_uid)).is_empty());
    // Partly malformed: the valid address is kept.
    assert!(
        log.take(t.apply_pod(&pod("p", "uid-p", "n1", &["bad", "10.1.0.9"], Some("eg"))))
            .is_empty()
    );
    // A service whose UID vanished (malformed) keeps what was sent.
    let mut odd_no_uid = odd.clone();
    odd_no_uid.metadata.uid = None;
    assert!(log.take(t.apply_service(&odd_no_uid)).is_empty());
    assert_eq!(t.sent_uid(&key("odd")), Some("uid-odd"));
    // Pending pod (no node, no IP): nothing.
    let pending: Pod = serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": "pending", "uid": "u", "labels": {EGRESS_LABEL: "eg"}},
        "spec": {"containers": []},
        "status": {"phase": "Pending"}
    }))
    .unwrap();
    assert!(log.take(t.apply_pod(&pending)).is_empty());
    assert_view_is_net_effect(&t, &log);
}

#[test]
fn a_relist_deletes_exactly_what_was_not_listed() {
    let mut t = Translator::new(config());
    let mut log = Log::default();
    log.take(t.apply_node(&node("n1", &["10.0.0.1"])));
    log.take(t.apply_service(&lb("a", "uid-a")));
    log.take(t.apply_service(&lb("b", "uid-b")));
    log.take(t.apply_slice(&slice("a-1", "a", "IPv4", &[ready("10.1.0.1", "n1")])));
    log.take(t.apply_slice(&slice("b-1", "b", "IPv4", &[ready("10.1.0.2", "n1")])));
    log.take(t.apply_pod(&pod("p", "uid-p", "n1", &["10.1.0.3"], Some("eg"))));
    log.take(t.apply_pod(&pod("q", "uid-q", "n1", &["10.1.0.4"], Some("eg"))));

    t.begin_relist(Kind::Service);
    log.take(t.apply_service(&lb("a", "uid-a")));
    // "b" failed to decode in this list: kept as it was.
    t.keep(Kind::Service, &key("b"));
    assert!(log.take(t.end_relist(Kind::Service)).is_empty());

    t.begin_relist(Kind::EndpointSlice);
    log.take(t.apply_slice(&slice("a-1", "a", "IPv4", &[ready("10.1.0.1", "n1")])));
    assert_eq!(
        log.take(t.end_relist(Kind::EndpointSlice)),
        vec!["eps uid-b []"]
    );

    t.begin_relist(Kind::Pod);
    log.take(t.apply_pod(&pod("q", "uid-q", "n1", &["10.1.0.4"], Some("eg"))));
    assert_eq!(
        log.take(t.end_relist(Kind::Pod)),
        vec!["-pod 10.1.0.3@10.0.0.1 default/p uid-p"]
    );

    t.begin_relist(Kind::Service);
    log.take(t.apply_service(&lb("b", "uid-b")));
    assert_eq!(log.take(t.end_relist(Kind::Service)), vec!["-svc uid-a"]);

    t.begin_relist(Kind::Node);
    assert_eq!(
        log.take(t.end_relist(Kind::Node)),
        vec!["-pod 10.1.0.4@10.0.0.1 default/q uid-q"]
    );
    // end_relist without begin: nothing.
    assert!(t.end_relist(Kind::Node).is_empty());
    assert_view_is_net_effect(&t, &log);
}

#[test]
fn a_node_agent_reports_only_the_pods_of_its_node() {
    let mut t = Translator::new(TranslatorConfig {
        node: Some("n1".into()),
        ..config()
    });
    t.apply_node(&node("n1", &["10.0.0.1"]));
    t.apply_node(&node("n2", &["10.0.0.2"]));
    assert_eq!(
        shows(&t.apply_pod(&pod("p", "u1", "n1", &["10.1.0.1"], Some("eg")))),
        vec!["+pod 10.1.0.1@10.0.0.1 eg default/p u1"]
    );
    assert!(
        t.apply_pod(&pod("q", "u2", "n2", &["10.1.0.2"], Some("eg")))
            .is_empty()
    );
    // A pod that left the node (seen with another nodeName) is withdrawn.
    assert_eq!(
        shows(&t.apply_pod(&pod("p", "u1", "n2", &["10.1.0.1"], Some("eg")))),
        vec!["-pod 10.1.0.1@10.0.0.1 default/p u1"]
    );
}

/// A long pseudo-random sequence over a small universe: after every step, the resync view equals
/// the net effect of every delta so far.
#[test]
fn the_full_view_always_equals_the_net_effect_of_the_deltas() {
    let mut t = Translator::new(config());
    let mut log = Log::default();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let nodes = ["n0", "n1", "n2"];
    for step in 0..3_000 {
        match next(9) {
            0 => {
                let n = nodes[next(3) as usize];
                let i = next(4);
                let ips = match i {
                    0 => vec![],
                    1 => vec![format!("10.0.{}.1", next(2))],
                    _ => vec![format!("10.0.{}.1", next(2)), format!("fd00::{}", next(3))],
                };
                let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
                if i == 0 && next(2) == 0 {
                    log.take(t.delete_node(n));
                } else {
                    log.take(t.apply_node(&node(n, &ips)));
                }
            }
            1 | 2 => {
                let s = next(3);
                let name = format!("s{s}");
                let uid = format!("uid-{s}-{}", next(2));
                let svc = match next(4) {
                    0 => service(&name, &uid, json!({"type": "ClusterIP"})),
                    1 => {
                        log.take(t.delete_service(&key(&name)));
                        continue;
                    }
                    _ => service(
                        &name,
                        &uid,
                        json!({"type": "LoadBalancer", "ports": [{"port": 80 + next(2)}]}),
                    ),
                };
                log.take(t.apply_service(&svc));
            }
            3..=5 => {
                let s = next(3);
                let name = format!("s{s}-{}", next(2));
                if next(5) == 0 {
                    log.take(t.delete_slice(&key(&name)));
                    continue;
                }
                let v6 = next(3) == 0;
                let eps: Vec<OwnedEp> = (0..next(4))
                    .map(|_| {
                        let a = if v6 {
                            format!("fd01::{}", next(6))
                        } else {
                            format!("10.1.0.{}", next(6))
                        };
                        let cond = match next(4) {
                            0 => (Some(false), Some(false), Some(false)),
                            1 => (Some(false), Some(true), Some(true)),
                            _ => (None, None, None),
                        };
                        (a, nodes[next(3) as usize], cond.0, cond.1, cond.2)
                    })
                    .collect();
                let eps: Vec<Ep<'_>> = eps
                    .iter()
                    .map(|(a, n, r, s, t)| (a.as_str(), *n, *r, *s, *t))
                    .collect();
                let family = if v6 { "IPv6" } else { "IPv4" };
                log.take(t.apply_slice(&slice(&name, &format!("s{s}"), family, &eps)));
            }
            _ => {
                let p = next(4);
                let name = format!("p{p}");
                if next(6) == 0 {
                    log.take(t.delete_pod(&key(&name)));
                    continue;
                }
                // Pod IPs are unique to a pod (two live pods never share one).
                let ips = match next(3) {
                    0 => vec![format!("10.1.{p}.{}", next(3))],
                    1 => vec![
                        format!("10.1.{p}.{}", next(3)),
                        format!("fd01::{p}:{}", next(3)),
                    ],
                    _ => vec![format!("10.1.{p}.9")],
                };
                let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
                let egress = ["eg-a", "eg-b", ""][next(3) as usize];
                let egress = (!egress.is_empty()).then_some(egress);
                let uid = format!("uid-p{p}-{}", next(2));
                log.take(t.apply_pod(&pod(&name, &uid, nodes[next(3) as usize], &ips, egress)));
            }
        }
        if step % 50 == 0 {
            assert_view_is_net_effect(&t, &log);
        }
    }
    assert_view_is_net_effect(&t, &log);
    assert!(!t.full_view().is_empty());
}

#[test]
fn a_gated_pod_whose_only_unmet_condition_is_the_gate_is_programmed_as_ready() {
    let mut t = Translator::new(config());
    let mut log = Log::default();
    log.take(t.apply_node(&node("n1", &["10.0.0.1"])));
    log.take(t.apply_service(&lb("web", "uid-web")));
    let gated: std::net::IpAddr = "10.1.0.2".parse().unwrap();
    // The gated pod's endpoint is not ready (the pod is not Ready: its gate is not True yet).
    let s = slice(
        "web-1",
        "web",
        "IPv4",
        &[
            ("10.1.0.1", "n1", None, None, None),
            ("10.1.0.2", "n1", Some(false), Some(false), Some(false)),
        ],
    );
    assert_eq!(
        log.take(t.apply_slice(&s)),
        vec!["eps uid-web [10.1.0.1@10.0.0.1]"]
    );
    assert!(t.lists_address(gated) && t.ours_lists_address(gated));
    assert_eq!(
        t.gate_services(gated),
        vec![("uid-web".to_owned(), "10.0.0.1".parse().unwrap())]
    );
    // Its containers are ready and only the gate is unmet: programmed as if ready.
    assert_eq!(
        log.take(t.set_gate_ready(gated, true)),
        vec!["eps uid-web [10.1.0.1@10.0.0.1,10.1.0.2@10.0.0.1]"]
    );
    assert!(
        t.set_gate_ready(gated, true).is_empty(),
        "no change, no update"
    );
    // Terminating: no longer counted, whatever the gate.
    let s = slice(
        "web-1",
        "web",
        "IPv4",
        &[
            ("10.1.0.1", "n1", None, None, None),
            ("10.1.0.2", "n1", Some(false), Some(false), Some(true)),
        ],
    );
    assert_eq!(
        log.take(t.apply_slice(&s)),
        vec!["eps uid-web [10.1.0.1@10.0.0.1]"]
    );
    // No longer eligible: nothing to send (it was not counted).
    assert!(log.take(t.set_gate_ready(gated, false)).is_empty());
    // A Service of another class lists an address: not ours.
    let mut other = lb("other", "uid-other");
    other.spec.as_mut().unwrap().load_balancer_class = Some("example.com/other".into());
    log.take(t.apply_service(&other));
    let s = slice(
        "other-1",
        "other",
        "IPv4",
        &[("10.1.0.9", "n1", Some(false), None, None)],
    );
    log.take(t.apply_slice(&s));
    let foreign: std::net::IpAddr = "10.1.0.9".parse().unwrap();
    assert!(t.lists_address(foreign) && !t.ours_lists_address(foreign));
    assert!(t.gate_services(foreign).is_empty());
    assert_view_is_net_effect(&t, &log);
}
