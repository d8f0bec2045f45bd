//! IP families end to end: the watcher against the fake Kubernetes API (which gives Services their
//! `ipFamilies` as the API server does), a real state server, workers and the NRP emulator (with
//! Azure's one-version rules on, its default). An IPv6-only Service and a dual-stack Service
//! converge with a frontend (public IP of the family's version), a load balancer and a backend pool
//! per family, each family's addresses registered to its own service; the ingress lists both IPs,
//! IPv4 first, each with `ipMode: VIP`; a Service switched from single- to dual-stack and back
//! converges each way and the emulator's removal log never shows its IPv4 backends removed. And
//! with the fake API's EndpointSlice controller: a dual-stack Service selecting dual-stack pods
//! gets one slice per family (`addressType` IPv4 and IPv6), and both families' addresses converge.
//!
//! Waits poll with a generous deadline that only bounds a hung test; nothing asserts timing.

use std::collections::BTreeMap;
use std::net::IpAddr;

use clb_nrp::wire::IpVersion;
use clb_tests::fake_kube::{ControllersConfig, FakeApi};
use clb_tests::kube_objects::{
    RunningWatcher, converge, endpoint as ep, eventually, node, pod, service as svc, slice,
    test_config,
};
use clb_tests::{Expected, Harness, Options, init_tracing};
use clb_watcher::{CONDITION_TYPE, Mode};
use serde_json::{Value, json};

const SIX: &str = "3b0c0d4e-0000-4000-8000-0000000000f6";
const DUAL: &str = "3b0c0d4e-0000-4000-8000-0000000000d2";
const WEB: &str = "3b0c0d4e-0000-4000-8000-0000000000e1";

/// Error codes that break no rule (see `tests/tests/e2e.rs`).
const BENIGN: [&str; 1] = ["ResourceNotFound"];

fn v6(uid: &str) -> String {
    format!("{uid}-v6")
}

fn lb_spec(extra: Value) -> Value {
    let mut spec = json!({"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}]});
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    spec
}

async fn start() -> (Harness, FakeApi, RunningWatcher) {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    let fake = FakeApi::start().await;
    fake.put("nodes", node("node-a", &["10.0.0.1", "fd00::1"]));
    fake.put("nodes", node("node-b", &["10.0.0.2", "fd00::2"]));
    let w = RunningWatcher::start(
        test_config(&h.url(), Mode::Cluster { pods: false }),
        fake.watcher_clients(),
    );
    (h, fake, w)
}

fn expected(entries: &[(&str, &str, &str)], inbound: &[&str]) -> Expected {
    let mut e = Expected::default();
    e.inbound.extend(inbound.iter().map(|s| s.to_string()));
    for (loc, addr, service) in entries {
        e.addresses
            .entry((loc.to_string(), addr.to_string()))
            .or_default()
            .insert(service.to_string());
    }
    e
}

/// The emulator's view of inbound service `name`: its public IP's version and address, and its
/// backend pool id (checked to be what its registration names).
fn unit_of(h: &Harness, name: &str) -> (IpVersion, IpAddr, String) {
    let dump = h.emulator().dump();
    let pip = dump
        .public_ip_addresses
        .iter()
        .find(|p| p.name.as_deref() == Some(&format!("pip-{name}")))
        .unwrap_or_else(|| panic!("no public IP of {name}"));
    let lb = dump
        .load_balancers
        .iter()
        .find(|l| l.name.as_deref() == Some(&format!("lb-{name}")))
        .unwrap_or_else(|| panic!("no load balancer of {name}"));
    let fe = &lb.properties.frontend_ip_configurations;
    assert_eq!(fe.len(), 1, "one frontend per family's load balancer");
    assert_eq!(
        fe[0].properties.public_ip_address.as_ref().unwrap().id,
        pip.id.clone().unwrap()
    );
    let registered = dump
        .gateway(clb_tests::GATEWAY)
        .unwrap()
        .services
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} is not registered"))
        .backend_pools
        .clone();
    assert_eq!(registered.len(), 1, "{registered:?}");
    (
        pip.properties.public_ip_address_version.clone().unwrap(),
        pip.properties
            .ip_address
            .as_deref()
            .unwrap()
            .parse()
            .unwrap(),
        registered[0].clone(),
    )
}

fn no_rule_broken(h: &Harness) {
    let broken: BTreeMap<_, _> = h
        .emulator()
        .stats()
        .rejected_by_code
        .into_iter()
        .filter(|(code, _)| !BENIGN.contains(&code.as_str()))
        .collect();
    assert!(broken.is_empty(), "NRP rejected calls: {broken:?}");
}

/// Waits until Service `name`'s ingress is exactly `ips`, each with `ipMode: VIP`, and its
/// condition is Programmed.
async fn ingress_is(fake: &FakeApi, name: &str, ips: &[IpAddr]) {
    let want: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"ip": ip.to_string(), "ipMode": "VIP"}))
        .collect();
    eventually(&format!("the ingress of {name} is {want:?}"), || async {
        let o = fake.get("services", "default", name).unwrap();
        let got = &o["status"]["loadBalancer"]["ingress"];
        let programmed = o["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == CONDITION_TYPE && c["status"] == "True");
        if *got == json!(want) && programmed {
            Ok(())
        } else {
            Err(format!("ingress {got}, programmed {programmed}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ipv6_only_and_a_dual_stack_service_get_a_frontend_and_a_pool_per_family() {
    let (h, fake, _w) = start().await;
    fake.put(
        "services",
        svc("six", SIX, lb_spec(json!({"ipFamilies": ["IPv6"]}))),
    );
    fake.put(
        "services",
        svc(
            "dual",
            DUAL,
            lb_spec(json!({"ipFamilyPolicy": "PreferDualStack"})),
        ),
    );
    assert_eq!(
        fake.get("services", "default", "dual").unwrap()["spec"]["ipFamilies"],
        json!(["IPv4", "IPv6"]),
        "the API server gives a PreferDualStack Service both families, its primary first"
    );
    fake.put(
        "endpointslices",
        slice(
            "six-1",
            "six",
            "IPv6",
            vec![ep("fd01::1", "node-a", true), ep("fd01::2", "node-b", true)],
        ),
    );
    fake.put(
        "endpointslices",
        slice(
            "dual-4",
            "dual",
            "IPv4",
            vec![ep("10.1.0.1", "node-a", true)],
        ),
    );
    fake.put(
        "endpointslices",
        slice(
            "dual-6",
            "dual",
            "IPv6",
            vec![ep("fd01::3", "node-b", true)],
        ),
    );
    let dual6 = v6(DUAL);
    converge(
        &h,
        &expected(
            &[
                ("fd00::1", "fd01::1", SIX),
                ("fd00::2", "fd01::2", SIX),
                ("10.0.0.1", "10.1.0.1", DUAL),
                ("fd00::2", "fd01::3", &dual6),
            ],
            &[SIX, DUAL, &dual6],
        ),
    )
    .await;

    // IPv6-only: one IPv6 frontend, its own pool.
    let (version, six_ip, six_pool) = unit_of(&h, SIX);
    assert_eq!(version, IpVersion::V6);
    assert!(six_ip.is_ipv6());
    // Dual stack: an IPv4 and an IPv6 unit, each its own public IP, load balancer and pool.
    let (v4_version, dual_ip4, pool4) = unit_of(&h, DUAL);
    let (v6_version, dual_ip6, pool6) = unit_of(&h, &dual6);
    assert_eq!((v4_version, v6_version), (IpVersion::V4, IpVersion::V6));
    assert!(dual_ip4.is_ipv4() && dual_ip6.is_ipv6());
    assert!(
        pool4 != pool6 && pool6 != six_pool,
        "{pool4} {pool6} {six_pool}"
    );

    ingress_is(&fake, "six", &[six_ip]).await;
    ingress_is(&fake, "dual", &[dual_ip4, dual_ip6]).await;
    no_rule_broken(&h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_switched_to_dual_stack_and_back_never_loses_its_ipv4_backends() {
    let (h, fake, _w) = start().await;
    let single = svc("web", WEB, lb_spec(json!({})));
    fake.put("services", single.clone());
    fake.put(
        "endpointslices",
        slice(
            "web-4",
            "web",
            "IPv4",
            vec![
                ep("10.1.0.1", "node-a", true),
                ep("10.1.0.2", "node-b", true),
            ],
        ),
    );
    // Kubernetes makes the IPv6 slice once the Service is dual-stack; here it is there from the
    // start, and the watcher must not send it while the Service is IPv4 only.
    fake.put(
        "endpointslices",
        slice("web-6", "web", "IPv6", vec![ep("fd01::1", "node-a", true)]),
    );
    let v4_only = expected(
        &[("10.0.0.1", "10.1.0.1", WEB), ("10.0.0.2", "10.1.0.2", WEB)],
        &[WEB],
    );
    converge(&h, &v4_only).await;
    let (_, ip4, _) = unit_of(&h, WEB);
    ingress_is(&fake, "web", &[ip4]).await;

    // SingleStack → PreferDualStack: the API server adds IPv6.
    let mut dual = fake.get("services", "default", "web").unwrap();
    dual["spec"]["ipFamilyPolicy"] = json!("PreferDualStack");
    fake.put("services", dual);
    let web6 = v6(WEB);
    converge(
        &h,
        &expected(
            &[
                ("10.0.0.1", "10.1.0.1", WEB),
                ("10.0.0.2", "10.1.0.2", WEB),
                ("fd00::1", "fd01::1", &web6),
            ],
            &[WEB, &web6],
        ),
    )
    .await;
    let (version, ip6, _) = unit_of(&h, &web6);
    assert_eq!(version, IpVersion::V6);
    assert_eq!(unit_of(&h, WEB).1, ip4, "the IPv4 frontend is untouched");
    ingress_is(&fake, "web", &[ip4, ip6]).await;

    // And back to SingleStack: the API server keeps the primary family only.
    let mut back = fake.get("services", "default", "web").unwrap();
    back["spec"]["ipFamilyPolicy"] = json!("SingleStack");
    fake.put("services", back);
    assert_eq!(
        fake.get("services", "default", "web").unwrap()["spec"]["ipFamilies"],
        json!(["IPv4"])
    );
    converge(&h, &v4_only).await;
    ingress_is(&fake, "web", &[ip4]).await;
    let dump = h.emulator().dump();
    let names = |v: Vec<Option<String>>| v.into_iter().flatten().collect::<Vec<_>>();
    assert!(
        !names(dump.load_balancers.iter().map(|l| l.name.clone()).collect())
            .contains(&format!("lb-{web6}")),
        "the IPv6 load balancer is deleted"
    );
    assert!(
        !names(
            dump.public_ip_addresses
                .iter()
                .map(|p| p.name.clone())
                .collect()
        )
        .contains(&format!("pip-{web6}")),
        "and its public IP"
    );

    // At no moment was an IPv4 backend removed: the only removal is the IPv6 address's, from
    // the IPv6 service.
    let removals = h.emulator().removals();
    assert!(!removals.is_empty(), "the IPv6 address was drained");
    for r in &removals {
        assert!(
            !r.removed_services.iter().any(|s| s == WEB) && r.location == "fd00::1",
            "an IPv4 backend was removed: {r:?}"
        );
        assert_eq!(r.removed_services, vec![web6.clone()]);
    }
    no_rule_broken(&h);
}

/// A running, ready pod labelled `app=dual-app` with one IP of each family (as a dual-stack CNI
/// sets `status.podIPs`).
fn dual_stack_pod(name: &str, node: &str, ips: &[&str]) -> Value {
    let mut p = pod(name, node, ips, None);
    p["metadata"]["labels"]["app"] = json!("dual-app");
    p["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_endpoint_slice_controller_makes_a_slice_per_family_and_both_converge() {
    let (h, fake, _w) = start().await;
    let _controllers = fake.start_controllers(ControllersConfig {
        kubelet: None,
        deployments: false,
        ..ControllersConfig::default()
    });
    fake.put(
        "pods",
        dual_stack_pod("web-a", "node-a", &["10.1.0.1", "fd01::1"]),
    );
    fake.put(
        "pods",
        dual_stack_pod("web-b", "node-b", &["10.1.0.2", "fd01::2"]),
    );
    // An IPv4-only pod: in the IPv4 slice only.
    fake.put("pods", dual_stack_pod("web-c", "node-b", &["10.1.0.3"]));
    fake.put(
        "services",
        svc(
            "dual",
            DUAL,
            lb_spec(json!({"ipFamilyPolicy": "RequireDualStack", "selector": {"app": "dual-app"}})),
        ),
    );
    let slices = eventually("a slice per family", || async {
        let mut by_family = BTreeMap::new();
        for sl in fake.objects("endpointslices") {
            if sl["metadata"]["labels"]["kubernetes.io/service-name"] != "dual" {
                continue;
            }
            let mut addresses: Vec<String> = sl["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["addresses"][0].as_str().map(str::to_owned))
                .collect();
            addresses.sort();
            by_family.insert(
                sl["addressType"].as_str().unwrap_or("").to_owned(),
                addresses,
            );
        }
        match by_family.len() {
            2 => Ok(by_family),
            n => Err(format!("{n} slices: {by_family:?}")),
        }
    })
    .await;
    assert_eq!(slices["IPv4"], ["10.1.0.1", "10.1.0.2", "10.1.0.3"]);
    assert_eq!(slices["IPv6"], ["fd01::1", "fd01::2"]);

    let dual6 = v6(DUAL);
    converge(
        &h,
        &expected(
            &[
                ("10.0.0.1", "10.1.0.1", DUAL),
                ("10.0.0.2", "10.1.0.2", DUAL),
                ("10.0.0.2", "10.1.0.3", DUAL),
                ("fd00::1", "fd01::1", &dual6),
                ("fd00::2", "fd01::2", &dual6),
            ],
            &[DUAL, &dual6],
        ),
    )
    .await;
    let (_, ip4, _) = unit_of(&h, DUAL);
    let (_, ip6, _) = unit_of(&h, &dual6);
    ingress_is(&fake, "dual", &[ip4, ip6]).await;

    // Back to single-stack IPv4: the controller deletes the IPv6 slice.
    let mut s = fake.get("services", "default", "dual").unwrap();
    s["spec"]["ipFamilyPolicy"] = json!("SingleStack");
    s["spec"]["ipFamilies"] = json!(["IPv4"]);
    fake.put("services", s);
    eventually("the IPv6 slice is gone", || async {
        let families: Vec<Value> = fake
            .objects("endpointslices")
            .into_iter()
            .filter(|sl| sl["metadata"]["labels"]["kubernetes.io/service-name"] == "dual")
            .map(|sl| sl["addressType"].clone())
            .collect();
        if families == [json!("IPv4")] {
            Ok(())
        } else {
            Err(format!("{families:?}"))
        }
    })
    .await;
    no_rule_broken(&h);
}
