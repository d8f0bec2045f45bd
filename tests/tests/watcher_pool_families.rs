//! PoolServices of dual-stack Services end to end: the watcher (`--pool-services`, a gateways file)
//! against the fake Kubernetes API (which gives Services their `ipFamilies` and prunes PoolServices
//! against deploy/'s CRD schema, as the API server does), a real state server, workers and the NRP
//! emulator. A dual-stack Service's PoolService lists the frontend of each family — the primary's
//! (`{uid}`) and the secondary's (`{uid}-v6` / `{uid}-v4`) — IPv4 first, each `{ip, ipMode: VIP}`,
//! as the Service itself does, and is `Ready` once both are programmed; switched to single-stack,
//! the removed family leaves the PoolService's status. Nothing the watcher writes is pruned.
//!
//! Waits poll with a generous deadline that only bounds a hung test; nothing asserts timing.

use std::sync::Arc;

use clb_tests::fake_kube::FakeApi;
use clb_tests::kube_objects::{
    RunningWatcher, endpoint as ep, eventually, node, service as svc, slice, test_config,
};
use clb_tests::{Harness, Options, init_tracing};
use clb_watcher::Mode;
use serde_json::{Value, json};

/// IPv4 primary, dual stack.
const DUAL: &str = "6c0c0d4e-0000-4000-8000-0000000000d4";
/// IPv6 primary, dual stack.
const SIX_FIRST: &str = "6c0c0d4e-0000-4000-8000-0000000000d6";

fn lb_spec(extra: Value) -> Value {
    let mut spec = json!({"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}]});
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    spec
}

/// The frontend IP gateway `a` reports for identity `id` once NRP has it.
async fn frontend(h: &Harness, id: &str) -> String {
    let client = h.client().await;
    eventually(&format!("gateway a programs {id}"), || async {
        let s = client
            .with_gateway("a")
            .service(id)
            .await
            .map_err(|e| e.to_string())?;
        if s.actual && !s.frontend_ip.is_empty() {
            Ok(s.frontend_ip)
        } else {
            Err(format!("{s:?}"))
        }
    })
    .await
}

/// Waits until `status.loadBalancer.ingress` of `kind` `name` is exactly `ips`, each with
/// `ipMode: VIP`, and (for a PoolService) its `Ready` condition is `True`/`Programmed`.
async fn shows(fake: &FakeApi, plural: &str, name: &str, ips: &[&str]) {
    let want: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"ip": ip, "ipMode": "VIP"}))
        .collect();
    eventually(&format!("{plural} {name} shows {ips:?}"), || async {
        let o = fake.get(plural, "default", name).ok_or("missing")?;
        let got = o
            .pointer("/status/loadBalancer/ingress")
            .cloned()
            .unwrap_or(Value::Null);
        let ready = plural != "poolservices"
            || o.pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|l| l.iter().find(|c| c["type"] == "Ready"))
                .is_some_and(|c| c["status"] == "True" && c["reason"] == "Programmed");
        if got == json!(want) && ready {
            Ok(())
        } else {
            Err(format!("{}", o["status"]))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dual_stack_services_pool_service_lists_both_families_until_one_is_removed() {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start_gateways(Options::e2e(), &["a"]).await;
    let fake = FakeApi::start().await;
    fake.put("nodes", node("n-a", &["10.0.0.1", "fd00::1"]));
    fake.put(
        "services",
        svc(
            "dual",
            DUAL,
            lb_spec(json!({"ipFamilyPolicy": "PreferDualStack"})),
        ),
    );
    fake.put(
        "services",
        svc(
            "sixfirst",
            SIX_FIRST,
            lb_spec(json!({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6", "IPv4"]})),
        ),
    );
    for (name, service, family, ip) in [
        ("dual-4", "dual", "IPv4", "10.1.0.1"),
        ("dual-6", "dual", "IPv6", "fd01::1"),
        ("sixfirst-4", "sixfirst", "IPv4", "10.1.0.2"),
        ("sixfirst-6", "sixfirst", "IPv6", "fd01::2"),
    ] {
        fake.put(
            "endpointslices",
            slice(name, service, family, vec![ep(ip, "n-a", true)]),
        );
    }
    let mut c = test_config(&h.url(), Mode::Cluster { pods: false });
    c.gateways = Some(Arc::new(
        h.gateways_file().expect("a gateways file").clone(),
    ));
    c.pool_services = true;
    let w = RunningWatcher::start(c, fake.watcher_clients());

    // IPv4 primary: `{uid}` is IPv4, `{uid}-v6` IPv6.
    let dual4 = frontend(&h, DUAL).await;
    let dual6 = frontend(&h, &format!("{DUAL}-v6")).await;
    assert!(dual4.parse::<std::net::Ipv4Addr>().is_ok(), "{dual4}");
    assert!(dual6.parse::<std::net::Ipv6Addr>().is_ok(), "{dual6}");
    // IPv6 primary: `{uid}` is IPv6, `{uid}-v4` IPv4; IPv4 is listed first all the same.
    let six_first6 = frontend(&h, SIX_FIRST).await;
    let six_first4 = frontend(&h, &format!("{SIX_FIRST}-v4")).await;
    assert!(six_first6.parse::<std::net::Ipv6Addr>().is_ok());
    assert!(six_first4.parse::<std::net::Ipv4Addr>().is_ok());

    // The PoolService (one per pool) shows what the Service shows: both families, IPv4 first.
    shows(&fake, "services", "dual", &[&dual4, &dual6]).await;
    shows(&fake, "poolservices", "dual-a", &[&dual4, &dual6]).await;
    shows(&fake, "services", "sixfirst", &[&six_first4, &six_first6]).await;
    shows(
        &fake,
        "poolservices",
        "sixfirst-a",
        &[&six_first4, &six_first6],
    )
    .await;
    let ps = fake.get("poolservices", "default", "dual-a").unwrap();
    let ready = ps["status"]["conditions"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap();
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("{dual4} (IPv4)"))
            && message.contains(&format!("{dual6} (IPv6)")),
        "{message}"
    );

    // Dual → single stack: the IPv6 family leaves the Service and its PoolService.
    let mut single = fake.get("services", "default", "dual").unwrap();
    single["spec"]["ipFamilyPolicy"] = json!("SingleStack");
    fake.put("services", single);
    shows(&fake, "services", "dual", &[&dual4]).await;
    shows(&fake, "poolservices", "dual-a", &[&dual4]).await;
    // And the IPv6-primary one keeps its primary family, IPv6, only.
    let mut single = fake.get("services", "default", "sixfirst").unwrap();
    single["spec"]["ipFamilyPolicy"] = json!("SingleStack");
    fake.put("services", single);
    shows(&fake, "poolservices", "sixfirst-a", &[&six_first6]).await;
    shows(&fake, "services", "sixfirst", &[&six_first6]).await;

    // deploy/'s CRD schema specifies every field written: nothing was pruned.
    assert_eq!(fake.pruned(), Vec::<(String, String)>::new());
    w.stop().await;
}
