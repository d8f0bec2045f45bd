//! Target ports end to end: the watcher against the scripted fake Kubernetes API
//! (`clb_tests::fake_kube`), a real state server with workers and the NRP emulator. A Service
//! `port: 80, targetPort: http` whose EndpointSlices say `http` is 8080 becomes the load-balancing
//! rule frontend 80 → backend 8080 (the pods' port, since the backend pool holds pod IPs); a numeric
//! targetPort and an unset one take effect too, and a rollout to another pod port re-programs the
//! rule.
//!
//! Waits poll with a generous deadline that only bounds a hung test; nothing asserts timing.

use std::collections::BTreeSet;

use clb_nrp::wire::TransportProtocol;
use clb_sync_worker::worker::load_balancer_name;
use clb_tests::fake_kube::FakeApi;
use clb_tests::kube_objects::{RunningWatcher, converge, endpoint, node, test_config};
use clb_tests::{Expected, Harness, Options, init_tracing};
use clb_watcher::Mode;
use serde_json::{Value, json};

const WEB: &str = "3b0c0d4e-0000-4000-8000-0000000000f1";

/// The slice of `web`: `http` on `http_port`, `dns` (UDP) on 53, and two ready endpoints.
fn web_slice(http_port: u16) -> Value {
    json!({
        "metadata": {"namespace": "default", "name": "web-v4",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [
            {"name": "http", "port": http_port, "protocol": "TCP"},
            {"name": "tls", "port": 8443, "protocol": "TCP"},
            {"name": "dns", "port": 53, "protocol": "UDP"},
        ],
        "endpoints": [endpoint("10.1.0.1", "node-a", true), endpoint("10.1.0.2", "node-b", true)],
    })
}

/// What NRP holds with `web`'s pods listening on `http_port` for `http`.
fn expected(http_port: u16) -> Expected {
    let mut e = Expected::default();
    e.inbound.insert(WEB.to_owned());
    for (loc, addr) in [("10.0.0.1", "10.1.0.1"), ("10.0.0.2", "10.1.0.2")] {
        e.addresses
            .insert((loc.into(), addr.into()), BTreeSet::from([WEB.to_owned()]));
    }
    e.rules.insert(
        WEB.to_owned(),
        BTreeSet::from([
            ("tcp".to_owned(), 80, http_port),
            ("tcp".to_owned(), 443, 8443),
            ("udp".to_owned(), 53, 53),
        ]),
    );
    e
}

/// `(protocol, frontend port, backend port)` of the rules of `web`'s load balancer in the emulator.
fn emulator_rules(h: &Harness) -> Vec<(String, u16, u16)> {
    let name = load_balancer_name(WEB);
    let dump = h.emulator().dump();
    let mut rules: Vec<(String, u16, u16)> = dump
        .load_balancers
        .iter()
        .filter(|lb| lb.name.as_deref() == Some(name.as_str()))
        .flat_map(|lb| lb.properties.load_balancing_rules.iter())
        .map(|r| {
            (
                match r.properties.protocol {
                    Some(TransportProtocol::Tcp) => "tcp".to_owned(),
                    Some(TransportProtocol::Udp) => "udp".to_owned(),
                    other => format!("{other:?}"),
                },
                r.properties.frontend_port,
                r.properties.backend_port,
            )
        })
        .collect();
    rules.sort();
    rules
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_named_target_port_becomes_the_rules_backend_port_through_the_endpoint_slices() {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    let fake = FakeApi::start().await;
    fake.put("nodes", node("node-a", &["10.0.0.1"]));
    fake.put("nodes", node("node-b", &["10.0.0.2"]));
    fake.put(
        "services",
        json!({
            "metadata": {"namespace": "default", "name": "web", "uid": WEB},
            "spec": {"type": "LoadBalancer", "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "targetPort": "http"},
                {"name": "tls", "port": 443, "protocol": "TCP", "targetPort": 8443},
                {"name": "dns", "port": 53, "protocol": "UDP"},
            ]},
        }),
    );
    fake.put("endpointslices", web_slice(8080));

    let w = RunningWatcher::start(
        test_config(&h.url(), Mode::Cluster { pods: false }),
        fake.watcher_clients(),
    );

    // The rule of port 80 goes to the pods' 8080 (named, through the slice), 443 to 8443
    // (numeric), 53 to 53 (unset).
    converge(&h, &expected(8080)).await;
    assert_eq!(
        emulator_rules(&h),
        vec![
            ("tcp".to_owned(), 80, 8080),
            ("tcp".to_owned(), 443, 8443),
            ("udp".to_owned(), 53, 53),
        ]
    );
    let shown = h.client().await.service(WEB).await.unwrap();
    let mut ports: Vec<(u32, u32)> = shown
        .ports
        .iter()
        .map(|p| (p.port, p.target_port))
        .collect();
    ports.sort();
    assert_eq!(ports, vec![(53, 0), (80, 8080), (443, 8443)]);

    // A rollout moves the pods' `http` to 8081: the watcher re-sends the Service and the rule is
    // programmed again, with the same frontend.
    fake.put("endpointslices", web_slice(8081));
    converge(&h, &expected(8081)).await;
    assert!(
        emulator_rules(&h).contains(&("tcp".to_owned(), 80, 8081)),
        "{:?}",
        emulator_rules(&h)
    );

    w.stop().await;
    h.shutdown().await;
}
