//! The settings of inbound services (`ServiceChange.settings`, issue 33) in the worker's sagas,
//! against the real NRP emulator: the rules' idle timeout, TCP reset, load distribution and floating
//! IP; clb's own `StandardV2` public IP with its DNS label; a brought public IP (by name, in the
//! gateway's resource group or another, and by address) linked and never written; each refusal of a
//! brought public IP leaving NRP as it was; the observe reporting all of it.

#[path = "worker/harness.rs"]
mod harness;

use clb_nrp::azure::{ArmClient, ArmConfig};
use clb_nrp::wire::{
    LoadBalancer, LoadDistribution, PublicIpAddress, ResourceId, ResourceKind, TransportProtocol,
};
use clb_nrp::{CallOptions, Nrp};
use clb_nrp_emulator::Dump;
use clb_proto::v1::{
    self, BroughtPublicIp, LoadBalancerSettings, NrpSnapshot, ObserveWork, Report, report,
    work_unit,
};
use harness::*;
use serde_json::json;

fn with_settings(name: &str, s: LoadBalancerSettings) -> v1::ServiceChange {
    let mut c = inbound(name, Create);
    c.settings = Some(s);
    c
}

fn brought(name: &str, resource_group: &str, address: &str) -> LoadBalancerSettings {
    LoadBalancerSettings {
        brought_public_ip: Some(BroughtPublicIp {
            name: name.into(),
            resource_group: resource_group.into(),
            address: address.into(),
        }),
        ..Default::default()
    }
}

fn arm(h: &Harness, resource_group: &str) -> ArmClient {
    ArmClient::new(
        ArmConfig::new("sub1", resource_group).with_endpoint(h.nrp.base_url()),
        None,
    )
    .unwrap()
}

/// Creates the public IP `name` in `resource_group` as an owner would (`sku`, allocation `method`,
/// `version`), and returns it as NRP has it.
async fn owner_pip(
    h: &Harness,
    resource_group: &str,
    name: &str,
    sku: &str,
    method: &str,
    version: &str,
) -> PublicIpAddress {
    let body: PublicIpAddress = serde_json::from_value(json!({
        "location": "eastus", "sku": {"name": sku}, "tags": {"owner": "me"},
        "properties": {"publicIPAllocationMethod": method, "publicIPAddressVersion": version}
    }))
    .unwrap();
    arm(h, resource_group)
        .put_public_ip(name, &body, CallOptions::none())
        .await
        .unwrap()
}

fn lb<'a>(dump: &'a Dump, name: &str) -> Option<&'a LoadBalancer> {
    dump.load_balancers
        .iter()
        .find(|l| l.name.as_deref() == Some(name))
}

fn pip<'a>(dump: &'a Dump, name: &str) -> Option<&'a PublicIpAddress> {
    dump.public_ip_addresses
        .iter()
        .find(|p| p.name.as_deref() == Some(name))
}

fn frontend_of(lb: &LoadBalancer) -> String {
    lb.properties.frontend_ip_configurations[0]
        .properties
        .public_ip_address
        .as_ref()
        .unwrap()
        .id
        .clone()
}

fn frontend_ip(r: &Report, service: &str) -> Option<String> {
    r.frontends
        .iter()
        .find(|f| f.service_id == service)
        .map(|f| f.ip.clone())
}

async fn observe(conn: &mut Conn, work_id: u64) -> NrpSnapshot {
    let r = conn
        .run(unit(work_id, work_unit::Work::Observe(ObserveWork {})))
        .await;
    let Some(report::Outcome::Observed(o)) = r.outcome else {
        panic!("expected observed, got {r:?}")
    };
    o.snapshot.unwrap()
}

fn observed_settings(s: &NrpSnapshot, service: &str) -> LoadBalancerSettings {
    s.rules
        .iter()
        .find(|r| r.service_id == service)
        .and_then(|r| r.settings.clone())
        .unwrap_or_else(|| panic!("no settings of {service}: {s:?}"))
}

#[tokio::test]
async fn the_rules_carry_the_settings() {
    let mut h = Harness::default().await;
    let mut conn = h.conn().await;
    let mut custom = LoadBalancerSettings {
        idle_timeout_minutes: 17,
        ..Default::default()
    };
    custom.set_load_distribution(v1::LoadDistribution::SourceIp);
    let no_reset = LoadBalancerSettings {
        disable_tcp_reset: true,
        ..Default::default()
    };
    let r = conn
        .run(services(
            1,
            vec![
                with_settings("svc-a", custom.clone()),
                inbound("svc-b", Create),
                with_settings("svc-c", no_reset),
            ],
        ))
        .await;
    assert_applied(&r);
    let dump = h.emulator().dump();
    let rule = |svc: &str, proto: TransportProtocol| {
        lb(&dump, &format!("lb-{svc}"))
            .unwrap()
            .properties
            .load_balancing_rules
            .iter()
            .find(|r| r.properties.protocol == Some(proto))
            .unwrap()
            .properties
            .clone()
    };
    let tcp = rule("svc-a", TransportProtocol::Tcp);
    assert_eq!(tcp.idle_timeout_in_minutes, Some(17));
    assert_eq!(tcp.enable_tcp_reset, Some(true));
    assert_eq!(tcp.enable_floating_ip, Some(false));
    assert_eq!(tcp.load_distribution, Some(LoadDistribution::SourceIp));
    let udp = rule("svc-a", TransportProtocol::Udp);
    assert_eq!(udp.idle_timeout_in_minutes, Some(17));
    assert_eq!(udp.enable_tcp_reset, None, "TCP reset is a TCP rule's");
    assert_eq!(udp.load_distribution, Some(LoadDistribution::SourceIp));
    // Unset settings: Azure's defaults, written out.
    let tcp = rule("svc-b", TransportProtocol::Tcp);
    assert_eq!(tcp.idle_timeout_in_minutes, Some(4));
    assert_eq!(tcp.enable_tcp_reset, Some(true));
    assert_eq!(tcp.enable_floating_ip, Some(false));
    assert_eq!(tcp.load_distribution, Some(LoadDistribution::Default));
    assert_eq!(
        rule("svc-c", TransportProtocol::Tcp).enable_tcp_reset,
        Some(false)
    );
    // clb's own public IPs are StandardV2 and static, as Azure's Container Load Balancer's.
    let own = pip(&dump, "pip-svc-a").unwrap();
    assert_eq!(own.sku.as_ref().unwrap().name, "StandardV2");
    assert_eq!(
        own.properties.public_ip_allocation_method.as_deref(),
        Some("Static")
    );
    // The observe reports the settings as they were asked for (the idle timeout written out).
    let s = observe(&mut conn, 2).await;
    assert_eq!(observed_settings(&s, "svc-a"), custom);
    assert_eq!(
        observed_settings(&s, "svc-b"),
        LoadBalancerSettings {
            idle_timeout_minutes: 4,
            ..Default::default()
        }
    );
    assert!(observed_settings(&s, "svc-c").disable_tcp_reset);
    // An idle timeout out of range is refused before any call.
    let before = h.emulator().dump();
    let r = conn
        .run(services(
            3,
            vec![with_settings(
                "svc-d",
                LoadBalancerSettings {
                    idle_timeout_minutes: 31,
                    ..Default::default()
                },
            )],
        ))
        .await;
    assert_eq!(terminal(&r).changes[0].code, "InvalidServiceChange");
    assert_eq!(h.emulator().dump(), before);
    h.shutdown().await;
}

#[tokio::test]
async fn a_dns_label_is_set_changed_and_removed() {
    let mut h = Harness::default().await;
    let mut conn = h.conn().await;
    let label = |l: &str| LoadBalancerSettings {
        dns_label: l.into(),
        ..Default::default()
    };
    let dns = |h: &Harness| {
        pip(&h.emulator().dump(), "pip-svc-a")
            .unwrap()
            .properties
            .dns_settings
            .clone()
    };
    assert_applied(
        &conn
            .run(services(1, vec![with_settings("svc-a", label("shop-a"))]))
            .await,
    );
    let d = dns(&h).expect("a label");
    assert_eq!(d.domain_name_label.as_deref(), Some("shop-a"));
    assert_eq!(d.fqdn.as_deref(), Some("shop-a.eastus.cloudapp.azure.com"));
    assert_eq!(
        observed_settings(&observe(&mut conn, 2).await, "svc-a").dns_label,
        "shop-a"
    );
    let address = pip(&h.emulator().dump(), "pip-svc-a")
        .unwrap()
        .properties
        .ip_address
        .clone();

    assert_applied(
        &conn
            .run(services(3, vec![with_settings("svc-a", label("shop-b"))]))
            .await,
    );
    assert_eq!(
        dns(&h).and_then(|d| d.domain_name_label).as_deref(),
        Some("shop-b")
    );
    assert_eq!(
        observed_settings(&observe(&mut conn, 4).await, "svc-a").dns_label,
        "shop-b"
    );

    assert_applied(&conn.run(services(5, vec![inbound("svc-a", Create)])).await);
    assert_eq!(
        dns(&h),
        None,
        "the label dropped from the settings is removed"
    );
    assert_eq!(
        observed_settings(&observe(&mut conn, 6).await, "svc-a").dns_label,
        ""
    );
    assert_eq!(
        pip(&h.emulator().dump(), "pip-svc-a")
            .unwrap()
            .properties
            .ip_address,
        address,
        "the address stays"
    );
    // A label another public IP of the region has: NRP refuses it (DnsRecordInUse, retried).
    owner_pip(&h, "rg-other", "taken", "StandardV2", "Static", "IPv4").await;
    let taken: PublicIpAddress = serde_json::from_value(json!({"location": "eastus",
        "sku": {"name": "StandardV2"}, "properties": {"dnsSettings": {"domainNameLabel": "taken-label"}}}))
    .unwrap();
    arm(&h, "rg-other")
        .put_public_ip("taken", &taken, CallOptions::none())
        .await
        .unwrap();
    let r = conn
        .run(services(
            7,
            vec![with_settings("svc-b", label("taken-label"))],
        ))
        .await;
    assert_eq!(retryable(&r).code, "DnsRecordInUse");
    // An invalid label is refused before any call.
    let before = h.emulator().dump();
    let r = conn
        .run(services(
            8,
            vec![with_settings("svc-c", label("Not_A_Label"))],
        ))
        .await;
    assert_eq!(terminal(&r).changes[0].code, "InvalidServiceChange");
    assert_eq!(h.emulator().dump(), before);
    h.shutdown().await;
}

#[tokio::test]
async fn a_brought_public_ip_is_linked_reported_and_never_written() {
    let mut h = Harness::default().await;
    let mut conn = h.conn().await;
    let elsewhere = owner_pip(&h, "rg-ip", "mine-a", "StandardV2", "Static", "IPv4").await;
    let here = owner_pip(&h, "rg1", "mine-b", "StandardV2", "Static", "IPv4").await;
    let by_address = owner_pip(&h, "rg1", "mine-c", "StandardV2", "Static", "IPv4").await;
    let address_c = by_address.properties.ip_address.clone().unwrap();
    h.emulator().reset_stats();
    let r = conn
        .run(services(
            1,
            vec![
                with_settings("svc-a", brought("mine-a", "rg-ip", "")),
                with_settings("svc-b", brought("mine-b", "", "")),
                with_settings("svc-c", brought("", "", &address_c)),
            ],
        ))
        .await;
    assert_applied(&r);
    let dump = h.emulator().dump();
    for (svc, p) in [
        ("svc-a", &elsewhere),
        ("svc-b", &here),
        ("svc-c", &by_address),
    ] {
        assert!(
            pip(&dump, &format!("pip-{svc}")).is_none(),
            "no public IP created for {svc}"
        );
        let lb = lb(&dump, &format!("lb-{svc}")).unwrap();
        assert!(
            frontend_of(lb).eq_ignore_ascii_case(p.id.as_deref().unwrap()),
            "{svc}'s frontend is on the brought public IP"
        );
        assert_eq!(frontend_ip(&r, svc), p.properties.ip_address, "{svc}");
    }
    let pips_before: Vec<PublicIpAddress> = dump.public_ip_addresses.clone();
    // The observe follows the load balancers' frontends and says what is brought.
    let s = observe(&mut conn, 2).await;
    for (svc, p) in [
        ("svc-a", &elsewhere),
        ("svc-b", &here),
        ("svc-c", &by_address),
    ] {
        let f = s.frontends.iter().find(|f| f.service_id == svc).unwrap();
        assert_eq!(Some(&f.ip), p.properties.ip_address.as_ref(), "{svc}");
    }
    let a = observed_settings(&s, "svc-a").brought_public_ip.unwrap();
    assert_eq!(
        (a.name.as_str(), a.resource_group.as_str()),
        ("mine-a", "rg-ip")
    );
    assert_eq!(Some(&a.address), elsewhere.properties.ip_address.as_ref());
    let b = observed_settings(&s, "svc-b").brought_public_ip.unwrap();
    assert_eq!((b.name.as_str(), b.resource_group.as_str()), ("mine-b", ""));
    let c = observed_settings(&s, "svc-c").brought_public_ip.unwrap();
    assert_eq!(
        (c.name.as_str(), c.address.as_str()),
        ("mine-c", address_c.as_str())
    );
    // Created again (a settings change, a retry): the same, nothing written to the public IPs.
    assert_applied(
        &conn
            .run(services(
                3,
                vec![with_settings("svc-a", brought("mine-a", "rg-ip", ""))],
            ))
            .await,
    );
    // Deleted (as after a restart, by name only): the load balancers go, the brought public IPs
    // stay exactly as they were.
    let r = conn
        .run(services(
            4,
            ["svc-a", "svc-b", "svc-c"]
                .map(|s| inbound(s, Delete))
                .to_vec(),
        ))
        .await;
    assert_applied(&r);
    let dump = h.emulator().dump();
    assert!(dump.load_balancers.is_empty());
    assert_eq!(dump.public_ip_addresses, pips_before);
    // No PUT of a public IP at all; the deletions sent were of clb's own `pip-{name}` (absent, a
    // success), which is why every brought public IP is as it was.
    let stats = h.emulator().stats();
    assert_eq!(stats.calls_of("PublicIPAddresses_CreateOrUpdate"), 0);
    assert_eq!(stats.calls_of("PublicIPAddresses_Delete"), 3);
    h.shutdown().await;
}

#[tokio::test]
async fn each_refusal_of_a_brought_public_ip_leaves_nrp_unchanged() {
    let mut h = Harness::default().await;
    let mut conn = h.conn().await;
    owner_pip(&h, "rg1", "standard", "Standard", "Static", "IPv4").await;
    owner_pip(&h, "rg1", "dynamic", "StandardV2", "Dynamic", "IPv4").await;
    let v6 = owner_pip(&h, "rg1", "six", "StandardV2", "Static", "IPv6").await;
    let used = owner_pip(&h, "rg1", "used", "StandardV2", "Static", "IPv4").await;
    owner_pip(&h, "rg1", "pip-svc-r", "StandardV2", "Static", "IPv4").await;
    // "used" is another load balancer's frontend.
    let other = ResourceId::new("sub1", "rg1", ResourceKind::LoadBalancer, "lb-else");
    let body: LoadBalancer = serde_json::from_value(json!({"location": "eastus", "properties": {
        "frontendIPConfigurations": [{"name": "fe", "properties": {"publicIPAddress": {"id": used.id}}}]}}))
    .unwrap();
    arm(&h, "rg1")
        .put_load_balancer(&other.name, &body, CallOptions::none())
        .await
        .unwrap();
    let v6_address = v6.properties.ip_address.clone().unwrap();
    let cases = [
        ("svc-1", brought("nope", "", ""), "PublicIpNotFound"),
        ("svc-2", brought("nope", "rg-else", ""), "PublicIpNotFound"),
        ("svc-3", brought("", "", "20.255.0.1"), "PublicIpNotFound"),
        (
            "svc-4",
            brought("standard", "", ""),
            "PublicIpNotStandardV2",
        ),
        ("svc-5", brought("dynamic", "", ""), "PublicIpNotStatic"),
        ("svc-6", brought("six", "", ""), "PublicIpFamilyMismatch"),
        (
            "svc-7",
            brought("", "", &v6_address),
            "PublicIpFamilyMismatch",
        ),
        ("svc-8", brought("used", "", ""), "PublicIpInUse"),
        (
            "svc-r",
            brought("pip-svc-r", "", ""),
            "PublicIpNameReserved",
        ),
        (
            "svc-r",
            brought("PIP-svc-r", "rg1", ""),
            "PublicIpNameReserved",
        ),
        ("svc-9", brought("", "", "2001:db8::1"), "PublicIpNotFound"),
    ];
    for (i, (svc, settings, code)) in cases.into_iter().enumerate() {
        let before = h.emulator().dump();
        let r = conn
            .run(services(i as u64 + 1, vec![with_settings(svc, settings)]))
            .await;
        let t = terminal(&r);
        assert_eq!(t.changes.len(), 1, "{svc}: {r:?}");
        assert_eq!(t.changes[0].code, code, "{svc}: {}", t.changes[0].message);
        assert!(r.service_progress.is_empty(), "{svc}: nothing reached");
        assert_eq!(h.emulator().dump(), before, "{svc} ({code}) changed NRP");
    }
    // The same address by name is not reserved when it is in another resource group.
    owner_pip(&h, "rg-ip", "pip-svc-r", "StandardV2", "Static", "IPv4").await;
    assert_applied(
        &conn
            .run(services(
                50,
                vec![with_settings("svc-r", brought("pip-svc-r", "rg-ip", ""))],
            ))
            .await,
    );
    h.shutdown().await;
}

#[tokio::test]
async fn switching_between_clb_s_public_ip_and_a_brought_one() {
    let mut h = Harness::default().await;
    let mut conn = h.conn().await;
    let r = conn.run(services(1, vec![inbound("svc-a", Create)])).await;
    assert_applied(&r);
    let own = pip(&h.emulator().dump(), "pip-svc-a").unwrap().clone();
    assert_eq!(frontend_ip(&r, "svc-a"), own.properties.ip_address);
    let mine = owner_pip(&h, "rg-ip", "mine", "StandardV2", "Static", "IPv4").await;

    // Own → brought: the load balancer moves, then clb's own public IP is deleted.
    let r = conn
        .run(services(
            2,
            vec![with_settings("svc-a", brought("mine", "rg-ip", ""))],
        ))
        .await;
    assert_applied(&r);
    assert_eq!(frontend_ip(&r, "svc-a"), mine.properties.ip_address);
    let dump = h.emulator().dump();
    assert!(
        pip(&dump, "pip-svc-a").is_none(),
        "clb's own public IP is deleted"
    );
    assert!(
        frontend_of(lb(&dump, "lb-svc-a").unwrap())
            .eq_ignore_ascii_case(mine.id.as_deref().unwrap())
    );
    let s = observe(&mut conn, 3).await;
    assert_eq!(
        s.frontends
            .iter()
            .find(|f| f.service_id == "svc-a")
            .map(|f| &f.ip),
        mine.properties.ip_address.as_ref()
    );

    // Brought → own: clb's own is created again, the brought one is left as it is.
    let r = conn.run(services(4, vec![inbound("svc-a", Create)])).await;
    assert_applied(&r);
    let dump = h.emulator().dump();
    let again = pip(&dump, "pip-svc-a").expect("created again");
    assert!(
        frontend_of(lb(&dump, "lb-svc-a").unwrap())
            .eq_ignore_ascii_case(again.id.as_deref().unwrap())
    );
    assert_eq!(frontend_ip(&r, "svc-a"), again.properties.ip_address);
    let kept = arm(&h, "rg-ip")
        .get_public_ip("mine", CallOptions::none())
        .await
        .unwrap();
    assert_eq!(kept.properties.ip_address, mine.properties.ip_address);
    assert!(
        kept.properties.ip_configuration.is_none(),
        "nothing uses it any more"
    );
    assert!(
        observed_settings(&observe(&mut conn, 5).await, "svc-a")
            .brought_public_ip
            .is_none()
    );
    h.shutdown().await;
}
