//! Issue 33: a Service is programmed as its owner wrote it, or refused out loud. Each test runs
//! the real watcher against the scripted fake Kubernetes API, with a real state server, workers
//! and the NRP emulator (`clb_tests::Harness`), and reads what NRP holds from the emulator:
//!
//! - every honoured setting reaches NRP as the Service asks (rule fields, the DNS label) and
//!   follows a change of it; ignored settings are named in a Warning Event;
//! - a brought public IP (by name, in another resource group, or by address) is linked, is the
//!   ingress, and survives a state-server restart, read-backs and the Service's deletion untouched;
//! - each refused setting keeps everything public of its Service out of NRP, with a Warning Event
//!   and the condition naming it; a live Service that gains one is withdrawn (finalizer kept until
//!   NRP is clean) and programmed again once it is removed; the decision survives restarts of the
//!   watcher and of the state server.
//!
//! Waits poll with a generous deadline that only bounds a hung test; nothing asserts timing.

use std::sync::Arc;
use std::time::Duration;

use clb_nrp::azure::{ArmClient, ArmConfig};
use clb_nrp::wire::{
    LoadBalancer, LoadDistribution, PublicIpAddress, PublicIpAddressProperties, Sku,
};
use clb_nrp::{CallOptions, Nrp};
use clb_tests::fake_kube::FakeApi;
use clb_tests::kube_objects::{
    RunningWatcher as Running, condition_of, endpoint as ep, eventually, node, service as svc,
    slice, test_config, wait_condition,
};
use clb_tests::{Harness, Options, init_tracing};
use clb_watcher::{FINALIZER, Mode};
use serde_json::{Value, json};

const ANN: &str = "service.beta.kubernetes.io/";

fn uid(n: u32) -> String {
    format!("5e771265-0000-4000-8000-{n:012}")
}

async fn start() -> (Harness, FakeApi) {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut options = Options::e2e();
    options.server.dispatch.anti_entropy_interval = Duration::from_millis(300);
    let h = Harness::start(options).await;
    let fake = FakeApi::start().await;
    fake.put("nodes", node("node-a", &["10.0.0.1"]));
    (h, fake)
}

fn start_watcher(h: &Harness, fake: &FakeApi) -> Running {
    Running::start(
        test_config(&h.url(), Mode::Cluster { pods: false }),
        fake.watcher_clients(),
    )
}

/// A LoadBalancer Service `name` (UID `uid`) with `annotations` and extra `spec` fields, TCP 80 and
/// UDP 53, backed by one ready pod (`10.1.0.{n}` on node-a).
fn put_service(
    fake: &FakeApi,
    name: &str,
    uid: &str,
    n: u8,
    annotations: &[(&str, &str)],
    spec: Value,
) {
    let mut s = svc(
        name,
        uid,
        json!({"type": "LoadBalancer", "ports": [
            {"name": "http", "port": 80, "protocol": "TCP"},
            {"name": "dns", "port": 53, "protocol": "UDP"}
        ]}),
    );
    let ann: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (format!("{ANN}{k}"), json!(v)))
        .collect();
    s["metadata"]["annotations"] = Value::Object(ann);
    if let (Some(to), Some(from)) = (s["spec"].as_object_mut(), spec.as_object()) {
        for (k, v) in from {
            to.insert(k.clone(), v.clone());
        }
    }
    fake.put("services", s);
    fake.put(
        "endpointslices",
        slice(
            &format!("{name}-1"),
            name,
            "IPv4",
            vec![ep(&format!("10.1.0.{n}"), "node-a", true)],
        ),
    );
}

/// Changes Service `name` as `edit` says (on the object as the API holds it).
fn edit_service(fake: &FakeApi, name: &str, edit: impl FnOnce(&mut Value)) {
    let mut obj = fake.get("services", "default", name).expect("the Service");
    edit(&mut obj);
    fake.put("services", obj);
}

fn warnings_of(fake: &FakeApi, uid: &str, reason: &str) -> Vec<Value> {
    fake.events()
        .into_iter()
        .filter(|e| {
            e.pointer("/regarding/uid").and_then(Value::as_str) == Some(uid)
                && e["type"] == "Warning"
                && e["reason"] == reason
        })
        .collect()
}

fn ingress_of(fake: &FakeApi, name: &str) -> Vec<String> {
    fake.get("services", "default", name)
        .and_then(|s| s.pointer("/status/loadBalancer/ingress").cloned())
        .and_then(|i| i.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e["ip"].as_str().map(str::to_owned))
        .collect()
}

fn has_finalizer(fake: &FakeApi, name: &str) -> bool {
    fake.get("services", "default", name).is_some_and(|s| {
        s["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
    })
}

fn lb(h: &Harness, uid: &str) -> Option<LoadBalancer> {
    let name = format!("lb-{uid}");
    h.emulator()
        .dump()
        .load_balancers
        .into_iter()
        .find(|l| l.name.as_deref() == Some(name.as_str()))
}

fn pip(h: &Harness, name: &str) -> Option<PublicIpAddress> {
    h.emulator()
        .dump()
        .public_ip_addresses
        .into_iter()
        .find(|p| p.name.as_deref() == Some(name))
}

/// Whether NRP holds anything public of the Service of `uid`: its load balancer, its public IP or
/// its registration on the gateway.
fn anything_public(h: &Harness, uid: &str) -> Option<String> {
    let dump = h.emulator().dump();
    if lb(h, uid).is_some() {
        return Some(format!("lb-{uid}"));
    }
    if pip(h, &format!("pip-{uid}")).is_some() {
        return Some(format!("pip-{uid}"));
    }
    let registered = dump
        .gateway(clb_tests::GATEWAY)
        .is_some_and(|g| g.services.iter().any(|s| s.name.eq_ignore_ascii_case(uid)));
    registered.then(|| format!("registration {uid}"))
}

/// The owner's client of resource group `rg`, as they would use it to make their public IPs.
fn owner(h: &Harness, rg: &str) -> Arc<dyn Nrp> {
    let mut arm = ArmConfig::new("sub-e2e", rg).with_endpoint(h.nrp_url());
    arm.poll_interval = Duration::from_millis(5);
    Arc::new(ArmClient::new(arm, None).expect("valid ARM config"))
}

/// Makes a static StandardV2 public IP `name` in `rg`; returns it as NRP has it.
async fn make_public_ip(h: &Harness, rg: &str, name: &str) -> PublicIpAddress {
    owner(h, rg)
        .put_public_ip(
            name,
            &PublicIpAddress {
                location: Some("eastus".into()),
                sku: Some(Sku {
                    name: "StandardV2".into(),
                    tier: Some("Regional".into()),
                }),
                properties: PublicIpAddressProperties {
                    public_ip_allocation_method: Some("Static".into()),
                    public_ip_address_version: Some(clb_nrp::wire::IpVersion::V4),
                    ..Default::default()
                },
                ..Default::default()
            },
            CallOptions::none(),
        )
        .await
        .expect("the owner's public IP")
}

/// A public IP as its owner made it: without what NRP fills in for its users.
fn as_owned(mut p: PublicIpAddress) -> PublicIpAddress {
    p.properties.ip_configuration = None;
    p.properties.nat_gateway = None;
    p
}

/// Waits for `n` more read-backs of NRP (each reads the address locations once).
async fn read_backs(h: &Harness, n: u64) {
    let lists = || {
        h.emulator()
            .stats()
            .calls_of("ServiceGateways_GetAddressLocations")
    };
    let before = lists();
    eventually(&format!("{n} read-backs"), || async {
        let now = lists();
        (now >= before + n)
            .then_some(())
            .ok_or_else(|| format!("{} so far", now - before))
    })
    .await;
}

/// A rule as NRP has it: (protocol, idle timeout, TCP reset, distribution).
type Rule = (String, Option<u32>, Option<bool>, Option<LoadDistribution>);

/// Every rule of Service `uid`'s load balancer: (protocol, idle timeout, TCP reset, distribution).
fn rules(h: &Harness, uid: &str) -> Vec<Rule> {
    lb(h, uid)
        .map(|l| {
            l.properties
                .load_balancing_rules
                .iter()
                .map(|r| {
                    (
                        format!("{:?}", r.properties.protocol),
                        r.properties.idle_timeout_in_minutes,
                        r.properties.enable_tcp_reset,
                        r.properties.load_distribution.clone(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The public IP id that Service `uid`'s load balancer frontend uses.
fn frontend(h: &Harness, uid: &str) -> Option<String> {
    lb(h, uid).and_then(|l| {
        l.properties.frontend_ip_configurations[0]
            .properties
            .public_ip_address
            .clone()
            .map(|p| p.id)
    })
}

/// Whether public IP `name` is as its owner made it.
fn untouched(h: &Harness, name: &str, made: &PublicIpAddress) -> Result<(), String> {
    let now = pip(h, name).map(as_owned);
    (now.as_ref() == Some(&as_owned(made.clone())))
        .then_some(())
        .ok_or_else(|| format!("{name}: {now:?}"))
}

/// What NRP holds of the refused Services (`uid(100 + i)`): nothing, or what is left.
fn nothing<A, B, C>(h: &Harness, refused: &[(&str, A, B, C)]) -> Vec<String> {
    refused
        .iter()
        .enumerate()
        .filter_map(|(i, (name, ..))| {
            anything_public(h, &uid(100 + i as u32)).map(|x| format!("{name}: {x}"))
        })
        .collect()
}

/// Every honoured rule setting and the DNS label reach NRP as the Service asks, and follow a
/// change; a setting clb ignores is named in one Warning Event, and the Service is programmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn honoured_settings_reach_nrp_as_the_service_asks_and_follow_its_changes() {
    let (h, fake) = start().await;
    let tuned = uid(1);
    put_service(
        &fake,
        "tuned",
        &tuned,
        1,
        &[
            ("azure-load-balancer-tcp-idle-timeout", "15"),
            ("azure-load-balancer-disable-tcp-reset", "true"),
            ("azure-dns-label-name", "shop-tuned"),
            ("azure-load-balancer-health-probe-request-path", "/healthz"),
        ],
        json!({"sessionAffinity": "ClientIP"}),
    );
    let plain = uid(2);
    put_service(&fake, "plain", &plain, 2, &[], json!({}));
    let w = start_watcher(&h, &fake);

    wait_condition(&fake, "tuned", "Programmed").await;
    wait_condition(&fake, "plain", "Programmed").await;
    let got = rules(&h, &tuned);
    assert_eq!(got.len(), 2, "{got:?}");
    for (protocol, idle, reset, distribution) in &got {
        assert_eq!(*idle, Some(15), "{got:?}");
        assert_eq!(
            distribution.as_ref(),
            Some(&LoadDistribution::SourceIp),
            "{got:?}"
        );
        if protocol.contains("Tcp") {
            assert_eq!(*reset, Some(false), "TCP reset turned off: {got:?}");
        }
    }
    let label = |name: &str| {
        pip(&h, name).and_then(|p| p.properties.dns_settings.and_then(|d| d.domain_name_label))
    };
    assert_eq!(
        label(&format!("pip-{tuned}")).as_deref(),
        Some("shop-tuned")
    );
    // The defaults: Azure's idle timeout, TCP reset on, a 5-tuple hash, no label.
    for (protocol, idle, reset, distribution) in rules(&h, &plain) {
        assert_eq!(idle, Some(4));
        assert_ne!(distribution, Some(LoadDistribution::SourceIp));
        if protocol.contains("Tcp") {
            assert_eq!(reset, Some(true));
        }
    }
    assert_eq!(label(&format!("pip-{plain}")), None);
    let ignored = warnings_of(&fake, &tuned, "IgnoredSettings");
    assert_eq!(ignored.len(), 1, "{ignored:?}");
    let note = ignored[0]["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("azure-load-balancer-health-probe-request-path"),
        "{note}"
    );
    assert!(warnings_of(&fake, &plain, "IgnoredSettings").is_empty());

    // A change: another idle timeout, no label, no affinity — NRP follows, the address stays.
    let address = ingress_of(&fake, "tuned");
    edit_service(&fake, "tuned", |s| {
        s["metadata"]["annotations"][format!("{ANN}azure-load-balancer-tcp-idle-timeout")] =
            json!("20");
        s["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(&format!("{ANN}azure-dns-label-name"));
        s["spec"]["sessionAffinity"] = json!("None");
    });
    eventually("NRP follows the changed settings", || async {
        let got = rules(&h, &tuned);
        let ok = !got.is_empty()
            && got.iter().all(|(_, idle, _, d)| {
                *idle == Some(20) && d.as_ref() != Some(&LoadDistribution::SourceIp)
            })
            && label(&format!("pip-{tuned}")).is_none();
        ok.then_some(()).ok_or_else(|| format!("{got:?}"))
    })
    .await;
    assert_eq!(ingress_of(&fake, "tuned"), address, "the same public IP");
    w.stop().await;
}

/// A brought public IP, by name in another resource group or by address in the gateway's, is
/// linked and is the ingress; a state-server restart, read-backs and the Services' deletion leave
/// both exactly as their owner made them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_brought_public_ip_is_linked_and_survives_restart_read_back_and_deletion_untouched() {
    let (mut h, fake) = start().await;
    let web_ip = make_public_ip(&h, "rg-ips", "web-ip").await;
    let api_ip = make_public_ip(&h, "rg-e2e", "api-ip").await;
    let web_address = web_ip.properties.ip_address.clone().expect("allocated");
    let api_address = api_ip.properties.ip_address.clone().expect("allocated");
    let (web, api) = (uid(11), uid(12));
    put_service(
        &fake,
        "web",
        &web,
        11,
        &[
            ("azure-pip-name", "web-ip"),
            ("azure-load-balancer-resource-group", "rg-ips"),
        ],
        json!({}),
    );
    put_service(
        &fake,
        "api",
        &api,
        12,
        &[],
        json!({"loadBalancerIP": api_address}),
    );
    let w = start_watcher(&h, &fake);

    wait_condition(&fake, "web", "Programmed").await;
    wait_condition(&fake, "api", "Programmed").await;
    eventually("the ingress is the brought address", || async {
        let got = (ingress_of(&fake, "web"), ingress_of(&fake, "api"));
        (got == (vec![web_address.clone()], vec![api_address.clone()]))
            .then_some(())
            .ok_or_else(|| format!("{got:?}"))
    })
    .await;
    assert_eq!(frontend(&h, &web), web_ip.id.clone());
    assert_eq!(frontend(&h, &api), api_ip.id.clone());
    assert!(
        pip(&h, &format!("pip-{web}")).is_none(),
        "no public IP of clb's own"
    );
    assert!(
        pip(&h, &format!("pip-{api}")).is_none(),
        "no public IP of clb's own"
    );
    untouched(&h, "web-ip", &web_ip).unwrap();
    untouched(&h, "api-ip", &api_ip).unwrap();

    // A restart of the state server (on a new port: the watcher is started again, pointed at
    // it), then read-backs: nothing of them changes.
    w.stop().await;
    h.restart_server().await;
    let w = start_watcher(&h, &fake);
    // Node-a's agent resyncs too: removals at a node wait for it after a restart.
    let agent = Running::start(
        test_config(
            &h.url(),
            Mode::NodeAgent {
                node: "node-a".into(),
            },
        ),
        fake.watcher_clients(),
    );
    read_backs(&h, 2).await;
    assert_eq!(frontend(&h, &web), web_ip.id.clone());
    untouched(&h, "web-ip", &web_ip).unwrap();
    untouched(&h, "api-ip", &api_ip).unwrap();
    assert_eq!(ingress_of(&fake, "web"), vec![web_address.clone()]);

    // Deleted: the load balancers go, the brought public IPs stay exactly as made.
    fake.delete("services", "default", "web");
    fake.delete("services", "default", "api");
    eventually("both Services are gone from NRP and Kubernetes", || async {
        let left: Vec<String> = [&web, &api]
            .iter()
            .filter_map(|u| anything_public(&h, u))
            .chain(
                ["web", "api"]
                    .iter()
                    .filter(|n| fake.get("services", "default", n).is_some())
                    .map(|n| n.to_string()),
            )
            .collect();
        left.is_empty()
            .then_some(())
            .ok_or_else(|| format!("{left:?}"))
    })
    .await;
    untouched(&h, "web-ip", &web_ip).unwrap();
    untouched(&h, "api-ip", &api_ip).unwrap();
    agent.stop().await;
    w.stop().await;
}

/// A Service with one refused setting: (name, annotations, spec fields, the reason).
type RefusedCase = (
    &'static str,
    Vec<(&'static str, &'static str)>,
    Value,
    &'static str,
);

/// One Service per refused row of the table, plus values Azure would refuse: none gets anything
/// public in NRP; each shows the condition and a Warning Event with the setting's reason and keeps
/// its finalizer. A live Service that gains such a setting is withdrawn and programmed again once
/// it goes; the decisions survive restarts of the watcher and the state server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_settings_keep_the_service_out_of_nrp_out_loud_and_withdraw_a_live_one() {
    let (mut h, fake) = start().await;
    let refused: Vec<RefusedCase> = vec![
        (
            "internal",
            vec![("azure-load-balancer-internal", "true")],
            json!({}),
            "UnsupportedInternalLoadBalancer",
        ),
        (
            "subnet",
            vec![("azure-load-balancer-internal-subnet", "apps")],
            json!({}),
            "UnsupportedInternalLoadBalancer",
        ),
        (
            "ranges",
            vec![],
            json!({"loadBalancerSourceRanges": ["10.1.2.0/24"]}),
            "UnsupportedLoadBalancerSourceRanges",
        ),
        (
            "allowed",
            vec![("azure-allowed-ip-ranges", "10.1.2.0/24")],
            json!({}),
            "UnsupportedAllowedIpRanges",
        ),
        (
            "tags",
            vec![("azure-allowed-service-tags", "AzureCloud")],
            json!({}),
            "UnsupportedAllowedServiceTags",
        ),
        (
            "denyall",
            vec![("azure-deny-all-except-load-balancer-source-ranges", "true")],
            json!({}),
            "UnsupportedDenyAllExceptLoadBalancerSourceRanges",
        ),
        (
            "prefix",
            vec![(
                "azure-pip-prefix-id",
                "/subscriptions/s/resourceGroups/r/providers/Microsoft.Network/publicIPPrefixes/p",
            )],
            json!({}),
            "UnsupportedPublicIpPrefix",
        ),
        (
            "prefix6",
            vec![(
                "azure-pip-prefix-id-ipv6",
                "/subscriptions/s/resourceGroups/r/providers/Microsoft.Network/publicIPPrefixes/p6",
            )],
            json!({}),
            "UnsupportedPublicIpPrefix",
        ),
        (
            "norule",
            vec![("port_80_no_lb_rule", "true")],
            json!({}),
            "UnsupportedPortRuleAnnotation",
        ),
        (
            "idle",
            vec![("azure-load-balancer-tcp-idle-timeout", "31")],
            json!({}),
            "InvalidIdleTimeout",
        ),
        (
            "reset",
            vec![("azure-load-balancer-disable-tcp-reset", "maybe")],
            json!({}),
            "InvalidTcpReset",
        ),
        (
            "label",
            vec![("azure-dns-label-name", "Not_A_Label")],
            json!({}),
            "InvalidDnsLabel",
        ),
        (
            "badip",
            vec![],
            json!({"loadBalancerIP": "20.1.2"}),
            "InvalidLoadBalancerIP",
        ),
    ];
    for (i, (name, ann, spec, _)) in refused.iter().enumerate() {
        put_service(
            &fake,
            name,
            &uid(100 + i as u32),
            100 + i as u8,
            ann,
            spec.clone(),
        );
    }
    let live = uid(1);
    put_service(&fake, "live", &live, 1, &[], json!({}));
    let w = start_watcher(&h, &fake);

    wait_condition(&fake, "live", "Programmed").await;
    for (i, (name, _, _, reason)) in refused.iter().enumerate() {
        let c = wait_condition(&fake, name, reason).await;
        assert_eq!(c["status"], "False", "{c}");
        let u = uid(100 + i as u32);
        let events = eventually(&format!("{name}'s Warning Event"), || async {
            let e = warnings_of(&fake, &u, reason);
            (!e.is_empty())
                .then_some(e.clone())
                .ok_or("none yet".to_string())
        })
        .await;
        assert_eq!(events.len(), 1, "one Event, not one per poll: {events:?}");
        assert!(has_finalizer(&fake, name), "{name} keeps its finalizer");
        assert!(ingress_of(&fake, name).is_empty(), "{name} has no ingress");
    }
    // The workers had every chance: the live Service went through.
    assert_eq!(nothing(&h, &refused), Vec::<String>::new());

    // The live Service asks to be internal: withdrawn from NRP, its ingress cleared, its
    // finalizer kept; then public again once the annotation goes.
    let address = ingress_of(&fake, "live");
    assert_eq!(address.len(), 1);
    edit_service(&fake, "live", |s| {
        s["metadata"]["annotations"][format!("{ANN}azure-load-balancer-internal")] = json!("true");
    });
    wait_condition(&fake, "live", "UnsupportedInternalLoadBalancer").await;
    eventually("the live Service is withdrawn from NRP", || async {
        match anything_public(&h, &live) {
            None if ingress_of(&fake, "live").is_empty() => Ok(()),
            left => Err(format!("{left:?}, ingress {:?}", ingress_of(&fake, "live"))),
        }
    })
    .await;
    assert!(has_finalizer(&fake, "live"));

    // Restarts of the watcher and of the state server decide the same.
    w.stop().await;
    h.restart_server().await;
    let w = start_watcher(&h, &fake);
    read_backs(&h, 2).await;
    assert_eq!(nothing(&h, &refused), Vec::<String>::new());
    assert_eq!(anything_public(&h, &live), None);
    assert_eq!(
        condition_of(&fake, "live").map(|c| c["reason"].clone()),
        Some(json!("UnsupportedInternalLoadBalancer"))
    );

    edit_service(&fake, "live", |s| {
        s["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(&format!("{ANN}azure-load-balancer-internal"));
    });
    wait_condition(&fake, "live", "Programmed").await;
    eventually("public again, with an ingress", || async {
        let ip = ingress_of(&fake, "live");
        (ip.len() == 1 && lb(&h, &live).is_some())
            .then_some(())
            .ok_or_else(|| format!("{ip:?}"))
    })
    .await;
    w.stop().await;
}
