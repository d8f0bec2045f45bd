//! Egresses that bring their NAT gateway (issue 24), end to end: the state server, workers and the
//! NRP emulator over loopback. A StandardV2 NAT gateway made beforehand in another resource group
//! (the VNet's) is linked to the Service Gateway and the egress's pods registered with it; nothing
//! else of it changes; it survives a state-server restart and anti-entropy read-backs untouched;
//! when the egress goes it is unregistered, then unlinked, never deleted. A Standard one is
//! refused, a missing one reported and not created.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clb_client::updates;
use clb_nrp::azure::{ArmClient, ArmConfig};
use clb_nrp::wire::{
    NatGateway, NatGatewayProperties, PublicIpAddress, PublicIpAddressProperties, Sku, SubResource,
};
use clb_nrp::{CallOptions, Nrp};
use clb_proto::v1::Update;
use clb_tests::recorder::DeletionLog;
use clb_tests::{GATEWAY, Harness, Options, PATIENCE, WriterExt};

/// The VNet's resource group, where egresses bring their NAT gateways from.
const VNET_RG: &str = "rg-vnet";
/// The harness's subscription and resource group (`WorkerProc::arm_client`).
const SUB: &str = "sub-e2e";

async fn start(log: &DeletionLog) -> Harness {
    clb_tests::init_tracing();
    let mut options = Options::e2e();
    options.workers = 0;
    options.nat_gateway_resource_group = Some(VNET_RG.into());
    options.server.dispatch.anti_entropy_interval = Duration::from_millis(200);
    let mut h = Harness::start(options).await;
    for i in 0..2 {
        h.spawn_worker_with(&format!("w{i}"), |n| log.wrap(n));
    }
    h
}

/// A client of the VNet's resource group, as its owner would use it.
fn owner(h: &Harness) -> Arc<dyn Nrp> {
    let mut arm = ArmConfig::new(SUB, VNET_RG).with_endpoint(h.nrp_url());
    arm.poll_interval = Duration::from_millis(5);
    Arc::new(ArmClient::new(arm, None).expect("valid ARM config"))
}

/// Makes NAT gateway `name` of SKU `sku` in the VNet's resource group, with a public IP, tags and
/// an idle timeout of its own; returns it as NRP has it.
async fn make_nat_gateway(h: &Harness, name: &str, sku: &str) -> NatGateway {
    let nrp = owner(h);
    let o = CallOptions::none();
    let pip = nrp
        .put_public_ip(
            &format!("{name}-pip"),
            &PublicIpAddress {
                location: Some("eastus".into()),
                sku: Some(Sku::standard()),
                properties: PublicIpAddressProperties {
                    public_ip_allocation_method: Some("Static".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
            o,
        )
        .await
        .expect("public IP");
    let mut other = serde_json::Map::new();
    other.insert("tags".into(), serde_json::json!({"owner": "network-team"}));
    let body = NatGateway {
        location: Some("eastus".into()),
        sku: Some(Sku {
            name: sku.into(),
            tier: None,
        }),
        properties: NatGatewayProperties {
            public_ip_addresses: vec![SubResource::new(pip.id.expect("pip id"))],
            idle_timeout_in_minutes: Some(7),
            ..Default::default()
        },
        other,
        ..Default::default()
    };
    nrp.put_nat_gateway(name, &body, o)
        .await
        .expect("NAT gateway")
}

fn nat_in_emulator(h: &Harness, name: &str) -> Option<NatGateway> {
    h.emulator()
        .dump()
        .nat_gateways
        .into_iter()
        .find(|n| n.name.as_deref() == Some(name))
}

/// The NAT gateway as its owner sees it, without the link.
fn unlinked(mut n: NatGateway) -> NatGateway {
    n.properties.service_gateway = None;
    n
}

fn pods(egress: &str, nat: &str, ips: &[&str]) -> Vec<Update> {
    ips.iter()
        .map(|ip| updates::pod_add_bringing(ip, "10.0.0.1", egress, &format!("apps/{ip}"), ip, nat))
        .collect()
}

/// The registrations of the gateway: name → NAT gateway id.
fn registered(h: &Harness) -> BTreeMap<String, String> {
    h.emulator()
        .dump()
        .gateway(&h.resource_name(GATEWAY))
        .map(|g| {
            g.services
                .iter()
                .map(|s| (s.name.clone(), s.nat_gateway_id.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

/// The addresses registered with `service`.
fn addresses_of(h: &Harness, service: &str) -> Vec<String> {
    let dump = h.emulator().dump();
    let Some(g) = dump.gateway(&h.resource_name(GATEWAY)) else {
        return Vec::new();
    };
    g.address_map()
        .into_iter()
        .filter(|(_, s)| s.contains(service))
        .map(|((_, a), _)| a)
        .collect()
}

async fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let end = Instant::now() + PATIENCE;
    while !ok() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_error(h: &Harness, code: &str) -> String {
    let end = Instant::now() + PATIENCE;
    loop {
        let status = h.gateway_status().await;
        if let Some(e) = status.last_errors.iter().find(|e| e.code == code) {
            return e.message.clone();
        }
        assert!(
            Instant::now() < end,
            "timed out waiting for {code}: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn list_calls(h: &Harness) -> u64 {
    h.emulator()
        .stats()
        .calls_by_operation
        .get("ServiceGateways_GetServices")
        .map_or(0, |by| by.values().sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brought_nat_gateway_is_linked_kept_and_unlinked_never_deleted() {
    let log = DeletionLog::new();
    let mut h = start(&log).await;
    let before = make_nat_gateway(&h, "byo-natgw", "StandardV2").await;
    let mut watcher = h.watcher().await;
    let ips = ["10.1.0.1", "10.1.0.2"];
    watcher.resync_ok(pods("egress-a", "byo-natgw", &ips)).await;

    wait_for("the egress registered with its addresses", || {
        registered(&h).contains_key("egress-a") && addresses_of(&h, "egress-a").len() == 2
    })
    .await;
    let nat_id = before.id.clone().expect("id");
    assert!(
        registered(&h)["egress-a"].eq_ignore_ascii_case(&nat_id),
        "{:?}",
        registered(&h)
    );
    let linked = nat_in_emulator(&h, "byo-natgw").expect("still there");
    let gateway = h
        .emulator()
        .dump()
        .gateway(&h.resource_name(GATEWAY))
        .unwrap()
        .id
        .clone();
    assert_eq!(
        linked
            .properties
            .service_gateway
            .as_ref()
            .map(|s| s.id.to_ascii_lowercase()),
        Some(gateway.to_ascii_lowercase())
    );
    assert_eq!(unlinked(linked.clone()), before, "only the link changed");
    // clb made nothing of its own for the egress.
    let dump = h.emulator().dump();
    assert!(
        dump.nat_gateways
            .iter()
            .all(|n| n.name.as_deref() != Some("natgw-egress-a"))
    );
    assert!(
        dump.public_ip_addresses
            .iter()
            .all(|p| p.name.as_deref() != Some("pip-egress-a"))
    );

    // A restart of the state server and anti-entropy read-backs: nothing of it changes.
    let puts = |h: &Harness| {
        h.emulator()
            .stats()
            .calls_by_operation
            .get("NatGateways_CreateOrUpdate")
            .map_or(0, |by| by.values().sum::<u64>())
    };
    let puts_linked = puts(&h);
    for id in h.restart_server_without_workers().await {
        h.spawn_worker_with(&id, |n| log.wrap(n));
    }
    let mut watcher = h.watcher().await;
    watcher.resync_ok(pods("egress-a", "byo-natgw", &ips)).await;
    let lists = list_calls(&h);
    wait_for("three read-backs", || list_calls(&h) >= lists + 3).await;
    h.wait_idle(PATIENCE).await.expect("idle");
    assert_eq!(nat_in_emulator(&h, "byo-natgw"), Some(linked.clone()));
    assert_eq!(puts(&h), puts_linked, "no PUT of a NAT gateway since");
    assert_eq!(addresses_of(&h, "egress-a").len(), 2);
    assert!(log.entries().is_empty(), "{:?}", log.entries());

    // The egress goes: drained, unregistered, then unlinked; never deleted.
    let removals: Vec<Update> = ips
        .iter()
        .map(|ip| updates::pod_remove(ip, "10.0.0.1", &format!("apps/{ip}"), ip))
        .collect();
    watcher.apply_ok(removals).await;
    wait_for(
        "the egress unregistered and its NAT gateway unlinked",
        || {
            !registered(&h).contains_key("egress-a")
                && nat_in_emulator(&h, "byo-natgw")
                    .is_some_and(|n| n.properties.service_gateway.is_none())
        },
    )
    .await;
    h.wait_idle(PATIENCE).await.expect("idle");
    assert_eq!(nat_in_emulator(&h, "byo-natgw"), Some(before));
    let deleted: Vec<String> = log
        .entries()
        .iter()
        .map(|d| format!("{} {}", d.what, d.name))
        .collect();
    assert_eq!(
        deleted,
        ["unregister egress-a"],
        "no DELETE of the NAT gateway"
    );
    assert_eq!(
        h.emulator()
            .stats()
            .rejected_by_code
            .get("NatGatewayInUseByServiceGateway"),
        None,
        "unregistered before unlinked"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standard_nat_gateway_is_refused_and_a_missing_one_is_reported_not_created() {
    let log = DeletionLog::new();
    let h = start(&log).await;
    let before = make_nat_gateway(&h, "old-natgw", "Standard").await;
    let mut watcher = h.watcher().await;
    watcher
        .resync_ok(pods("egress-std", "old-natgw", &["10.1.0.1"]))
        .await;
    let message = wait_error(&h, "NatGatewayNotStandardV2").await;
    assert!(
        message.contains("old-natgw") && message.contains("StandardV2"),
        "{message}"
    );
    // (A unit reports one error: the missing one comes in a unit of its own.)
    watcher
        .apply_ok(pods("egress-gone", "no-such-natgw", &["10.1.0.2"]))
        .await;
    let message = wait_error(&h, "NatGatewayNotFound").await;
    assert!(
        message.contains("no-such-natgw") && message.contains(VNET_RG),
        "{message}"
    );
    // Parked (not idle): a few read-backs later, still nothing registered or created.
    let lists = list_calls(&h);
    wait_for("two read-backs", || list_calls(&h) >= lists + 2).await;
    assert_eq!(h.gateway_status().await.parked_units, 2);
    // Counted by code in the state server's metrics.
    let metrics = h.server().state.metrics().encode_prometheus();
    for code in ["NatGatewayNotStandardV2", "NatGatewayNotFound"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("clb_server_units_total")
                    && l.contains(&format!("code=\"{code}\""))
                    && !l.ends_with(" 0")),
            "{code}: {metrics}"
        );
    }
    let reg = registered(&h);
    assert!(
        !reg.contains_key("egress-std") && !reg.contains_key("egress-gone"),
        "{reg:?}"
    );
    assert_eq!(nat_in_emulator(&h, "old-natgw"), Some(before), "untouched");
    let dump = h.emulator().dump();
    let names: Vec<_> = dump
        .nat_gateways
        .iter()
        .filter_map(|n| n.name.clone())
        .collect();
    assert_eq!(names, ["old-natgw"], "nothing created");
    assert!(
        dump.public_ip_addresses
            .iter()
            .all(|p| p.name.as_deref() == Some("old-natgw-pip"))
    );
    h.shutdown().await;
}

/// The egress went while the state server was down: the new server knows the service only from
/// NRP (not which NAT gateway it uses); the worker reads it from the registration, and unlinks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_egress_gone_during_a_restart_is_unlinked_from_what_nrp_says() {
    let log = DeletionLog::new();
    let mut h = start(&log).await;
    let before = make_nat_gateway(&h, "byo-natgw", "StandardV2").await;
    let mut watcher = h.watcher().await;
    watcher
        .resync_ok(pods("egress-a", "byo-natgw", &["10.1.0.1"]))
        .await;
    wait_for("the egress registered", || {
        addresses_of(&h, "egress-a").len() == 1
    })
    .await;
    for id in h.restart_server_without_workers().await {
        h.spawn_worker_with(&id, |n| log.wrap(n));
    }
    let mut watcher = h.watcher().await;
    watcher.resync_ok(Vec::new()).await;
    wait_for(
        "the egress unregistered and its NAT gateway unlinked",
        || {
            !registered(&h).contains_key("egress-a")
                && nat_in_emulator(&h, "byo-natgw")
                    .is_some_and(|n| n.properties.service_gateway.is_none())
        },
    )
    .await;
    h.wait_idle(PATIENCE).await.expect("idle");
    assert_eq!(nat_in_emulator(&h, "byo-natgw"), Some(before));
    let deleted: Vec<String> = log
        .entries()
        .iter()
        .map(|d| format!("{} {}", d.what, d.name))
        .collect();
    assert_eq!(
        deleted,
        ["unregister egress-a"],
        "no DELETE of the NAT gateway"
    );
    h.shutdown().await;
}

/// The annotation changed while the state server was down: the new server, which knows only the
/// egress's name from NRP, binds it to the new name and sends its creation again: the registration
/// moves to the new NAT gateway and the old one is unlinked (neither is deleted); when the egress
/// goes, the NAT gateway NRP's registration names is the one unlinked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registered_nat_gateway_is_the_one_unlinked() {
    let log = DeletionLog::new();
    let mut h = start(&log).await;
    let first = make_nat_gateway(&h, "byo-first", "StandardV2").await;
    let second = make_nat_gateway(&h, "byo-second", "StandardV2").await;
    let mut watcher = h.watcher().await;
    watcher
        .resync_ok(pods("egress-a", "byo-first", &["10.1.0.1"]))
        .await;
    wait_for("the egress registered", || {
        addresses_of(&h, "egress-a").len() == 1
    })
    .await;
    for id in h.restart_server_without_workers().await {
        h.spawn_worker_with(&id, |n| log.wrap(n));
    }
    let mut watcher = h.watcher().await;
    watcher
        .resync_ok(pods("egress-a", "byo-second", &["10.1.0.1"]))
        .await;
    wait_for("the registration moved and the first unlinked", || {
        registered(&h)
            .get("egress-a")
            .is_some_and(|id| id.ends_with("/byo-second"))
            && nat_in_emulator(&h, "byo-first").as_ref() == Some(&first)
    })
    .await;
    h.wait_idle(PATIENCE).await.expect("idle");
    assert_eq!(addresses_of(&h, "egress-a").len(), 1);
    watcher
        .apply_ok(vec![updates::pod_remove(
            "10.1.0.1",
            "10.0.0.1",
            "apps/10.1.0.1",
            "10.1.0.1",
        )])
        .await;
    wait_for("the registered NAT gateway unlinked", || {
        !registered(&h).contains_key("egress-a")
            && nat_in_emulator(&h, "byo-second")
                .is_some_and(|n| n.properties.service_gateway.is_none())
    })
    .await;
    h.wait_idle(PATIENCE).await.expect("idle");
    assert_eq!(nat_in_emulator(&h, "byo-first"), Some(first));
    assert_eq!(nat_in_emulator(&h, "byo-second"), Some(second));
    let deleted: Vec<String> = log
        .entries()
        .iter()
        .map(|d| format!("{} {}", d.what, d.name))
        .collect();
    assert_eq!(
        deleted,
        ["unregister egress-a"],
        "no DELETE of a NAT gateway"
    );
    h.shutdown().await;
}

/// Two egresses refused in the same service unit (the first unit a worker gets carries both
/// creations): each is parked with its own code and message, not the unit's decisive one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egresses_refused_in_one_unit_each_keep_their_own_error() {
    clb_tests::init_tracing();
    let log = DeletionLog::new();
    let mut options = Options::e2e();
    options.workers = 0;
    options.nat_gateway_resource_group = Some(VNET_RG.into());
    let mut h = Harness::start(options).await;
    make_nat_gateway(&h, "old-natgw", "Standard").await;
    let mut watcher = h.watcher().await;
    let mut both = pods("egress-std", "old-natgw", &["10.1.0.1"]);
    both.extend(pods("egress-gone", "no-such-natgw", &["10.1.0.2"]));
    watcher.resync_ok(both).await;
    // Only now a worker: both creations wait, and go in one unit.
    h.spawn_worker_with("w0", |n| log.wrap(n));
    let client = h.client().await;
    let condition = |s: clb_proto::v1::ServiceState| s.condition.unwrap_or_default();
    let end = Instant::now() + PATIENCE;
    let (std, gone) = loop {
        let std = condition(client.service("egress-std").await.expect("known"));
        let gone = condition(client.service("egress-gone").await.expect("known"));
        if !std.error_code.is_empty() && !gone.error_code.is_empty() {
            break (std, gone);
        }
        assert!(Instant::now() < end, "timed out: {std:?} {gone:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(std.error_code, "NatGatewayNotStandardV2", "{std:?}");
    assert!(std.error_message.contains("old-natgw"), "{std:?}");
    assert_eq!(gone.error_code, "NatGatewayNotFound", "{gone:?}");
    assert!(gone.error_message.contains("no-such-natgw"), "{gone:?}");
    h.shutdown().await;
}
