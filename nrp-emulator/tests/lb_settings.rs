//! The settings of a Container Load Balancer service as the emulator takes them, following Azure:
//! a load-balancing rule's `idleTimeoutInMinutes`, `loadDistribution` and `enableTcpReset`; a public
//! IP's `dnsSettings` and the read-only `ipConfiguration` / `natGateway` that tell who uses it; a
//! `StandardV2` public IP on a load balancer frontend.

mod emulator_common;

use clb_nrp::wire::{ResourceId, ResourceKind};
use clb_nrp_emulator::EmulatorConfig;
use emulator_common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// A load balancer `lb` with one frontend on `pip` and one TCP rule with the extra rule
/// `properties`.
fn lb_body(lb: &ResourceId, pip: &ResourceId, rule: Value) -> Value {
    let fe = lb.frontend_ip_configuration_id("fe");
    let pool = lb.backend_pool_id("pool");
    let mut props = json!({"frontendIPConfiguration": {"id": fe}, "backendAddressPool": {"id": pool},
        "protocol": "Tcp", "frontendPort": 80, "backendPort": 8080});
    for (k, v) in rule.as_object().cloned().unwrap_or_default() {
        props[k] = v;
    }
    json!({"location": "eastus", "sku": {"name": "Standard"}, "properties": {
        "frontendIPConfigurations": [{"name": "fe", "properties": {"publicIPAddress": {"id": pip.to_string()}}}],
        "backendAddressPools": [{"name": "pool"}],
        "loadBalancingRules": [{"name": "tcp-80", "properties": props}]}})
}

async fn standard_v2_pip(h: &Harness, name: &str) -> ResourceId {
    let pip = id(ResourceKind::PublicIpAddress, name);
    let r = h
        .put(
            &pip,
            json!({"location": "eastus", "sku": {"name": "StandardV2", "tier": "Regional"},
                   "properties": {"publicIPAllocationMethod": "Static"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    pip
}

#[tokio::test]
async fn rule_idle_timeout_is_4_to_30_minutes() {
    let h = Harness::start(EmulatorConfig::default()).await;
    let pip = standard_v2_pip(&h, "pip-a").await;
    let lb = id(ResourceKind::LoadBalancer, "lb-a");
    for bad in [0, 3, 31, 100] {
        let r = h
            .put(
                &lb,
                lb_body(&lb, &pip, json!({"idleTimeoutInMinutes": bad})),
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {r:?}");
        assert_eq!(r.code(), "LoadBalancingRuleIdleTimeoutOutOfRange", "{bad}");
        let msg = r.body["error"]["message"].as_str().unwrap();
        assert!(msg.contains("4 to 30"), "{msg}");
    }
    assert_eq!(
        h.get(&lb, None).await.status,
        StatusCode::NOT_FOUND,
        "nothing created"
    );
    for ok in [4, 17, 30] {
        let r = h
            .put(&lb, lb_body(&lb, &pip, json!({"idleTimeoutInMinutes": ok})))
            .await;
        assert!(r.status.is_success(), "{ok}: {r:?}");
        let rule = &h.get(&lb, None).await.body["properties"]["loadBalancingRules"][0];
        assert_eq!(rule["properties"]["idleTimeoutInMinutes"], ok);
    }
}

#[tokio::test]
async fn rule_load_distribution_is_checked_and_tcp_reset_kept() {
    let h = Harness::start(EmulatorConfig::default()).await;
    let pip = standard_v2_pip(&h, "pip-a").await;
    let lb = id(ResourceKind::LoadBalancer, "lb-a");
    let r = h
        .put(
            &lb,
            lb_body(&lb, &pip, json!({"loadDistribution": "RoundRobin"})),
        )
        .await;
    assert_eq!(r.code(), "InvalidLoadDistribution", "{r:?}");
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'RoundRobin'")
    );
    for (sent, kept) in [
        ("sourceip", "SourceIP"),
        ("SourceIPProtocol", "SourceIPProtocol"),
        ("Default", "Default"),
    ] {
        let r = h
            .put(
                &lb,
                lb_body(
                    &lb,
                    &pip,
                    json!({"loadDistribution": sent, "enableTcpReset": true, "enableFloatingIP": false,
                           "idleTimeoutInMinutes": 10}),
                ),
            )
            .await;
        assert!(r.status.is_success(), "{r:?}");
        let rule = h.get(&lb, None).await.body["properties"]["loadBalancingRules"][0]["properties"]
            .clone();
        assert_eq!(rule["loadDistribution"], kept);
        assert_eq!(rule["enableTcpReset"], true);
        assert_eq!(rule["enableFloatingIP"], false);
        assert_eq!(rule["idleTimeoutInMinutes"], 10);
    }
    let r = h
        .put(&lb, lb_body(&lb, &pip, json!({"enableTcpReset": false})))
        .await;
    assert!(r.status.is_success(), "{r:?}");
    let rule =
        h.get(&lb, None).await.body["properties"]["loadBalancingRules"][0]["properties"].clone();
    assert_eq!(rule["enableTcpReset"], false);
    assert!(rule.get("loadDistribution").is_none(), "{rule}");
}

#[tokio::test]
async fn a_standard_v2_public_ip_serves_a_frontend_and_says_who_uses_it() {
    let h = Harness::start(EmulatorConfig::default()).await;
    let pip = standard_v2_pip(&h, "pip-a").await;
    let got = h.get(&pip, None).await.body;
    assert_eq!(got["sku"]["name"], "StandardV2");
    assert!(got["properties"].get("ipConfiguration").is_none(), "{got}");
    let lb = id(ResourceKind::LoadBalancer, "lb-a");
    let r = h.put(&lb, lb_body(&lb, &pip, json!({}))).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let fe = lb.frontend_ip_configuration_id("fe");
    let got = h.get(&pip, None).await.body;
    assert_eq!(got["properties"]["ipConfiguration"]["id"], fe.as_str());
    // The listing says it too, and a PUT of the public IP cannot set it.
    let list = h
        .call(
            Method::GET,
            &format!(
                "{}/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/publicIPAddresses?api-version={}",
                h.server.base_url(),
                api_version()
            ),
            None,
        )
        .await;
    assert_eq!(
        list.body["value"][0]["properties"]["ipConfiguration"]["id"],
        fe.as_str()
    );
    let r = h
        .put(
            &pip,
            json!({"location": "eastus", "sku": {"name": "StandardV2"},
                   "properties": {"ipConfiguration": {"id": "/elsewhere"}}}),
        )
        .await;
    assert_eq!(r.body["properties"]["ipConfiguration"]["id"], fe.as_str());
    // Another load balancer cannot use it (PublicIPAddressInUse), and nothing changes.
    let other = id(ResourceKind::LoadBalancer, "lb-b");
    let r = h.put(&other, lb_body(&other, &pip, json!({}))).await;
    assert_eq!(r.code(), "PublicIPAddressInUse", "{r:?}");
    assert_eq!(h.get(&other, None).await.status, StatusCode::NOT_FOUND);
    // Once the load balancer moved to another public IP, nothing uses it.
    let pip_b = standard_v2_pip(&h, "pip-b").await;
    assert!(
        h.put(&lb, lb_body(&lb, &pip_b, json!({})))
            .await
            .status
            .is_success()
    );
    let got = h.get(&pip, None).await.body;
    assert!(got["properties"].get("ipConfiguration").is_none(), "{got}");
    assert_eq!(
        h.get(&pip_b, None).await.body["properties"]["ipConfiguration"]["id"],
        fe.as_str()
    );
    // A NAT gateway's public IP says so in natGateway.
    let nat = id(ResourceKind::NatGateway, "nat-a");
    let r = h
        .put(
            &nat,
            json!({"location": "eastus", "sku": {"name": "StandardV2"},
                   "properties": {"publicIpAddresses": [{"id": pip.to_string()}]}}),
        )
        .await;
    assert!(r.status.is_success(), "{r:?}");
    let got = h.get(&pip, None).await.body;
    assert_eq!(
        got["properties"]["natGateway"]["id"]
            .as_str()
            .map(str::to_ascii_lowercase),
        Some(nat.to_string().to_ascii_lowercase())
    );
}

#[tokio::test]
async fn a_dns_label_follows_azure_s_rules_and_makes_the_fqdn() {
    let h = Harness::start(EmulatorConfig::default()).await;
    let pip = |name: &str| id(ResourceKind::PublicIpAddress, name);
    let body = |label: &str, location: &str| {
        json!({"location": location, "sku": {"name": "StandardV2"},
               "properties": {"publicIPAllocationMethod": "Static",
                              "dnsSettings": {"domainNameLabel": label, "fqdn": "ignored.example"}}})
    };
    for bad in ["ab", "1shop", "shop-", "Shop", "sh_op", &"a".repeat(64)] {
        let r = h.put(&pip("pip-a"), body(bad, "eastus")).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {r:?}");
        assert_eq!(r.code(), "InvalidDomainNameLabel", "{bad}");
    }
    assert_eq!(
        h.get(&pip("pip-a"), None).await.status,
        StatusCode::NOT_FOUND
    );
    let r = h.put(&pip("pip-a"), body("shop", "eastus")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(
        r.body["properties"]["dnsSettings"]["fqdn"],
        "shop.eastus.cloudapp.azure.com"
    );
    let got = h.get(&pip("pip-a"), None).await.body;
    assert_eq!(got["properties"]["dnsSettings"]["domainNameLabel"], "shop");
    assert_eq!(
        got["properties"]["dnsSettings"]["fqdn"],
        "shop.eastus.cloudapp.azure.com"
    );
    // The same label in the same region is taken (even in another resource group)...
    let elsewhere = ResourceId::new(SUB, "rg-other", ResourceKind::PublicIpAddress, "pip-b");
    let r = h.put(&elsewhere, body("shop", "eastus")).await;
    assert_eq!(r.code(), "DnsRecordInUse", "{r:?}");
    assert_eq!(
        r.body["error"]["message"],
        "DNS record shop.eastus.cloudapp.azure.com is already used by another public IP."
    );
    assert_eq!(h.get(&elsewhere, None).await.status, StatusCode::NOT_FOUND);
    // ... but not in another region, and a PUT of the public IP that has it keeps it.
    let r = h.put(&elsewhere, body("shop", "westeurope")).await;
    assert_eq!(
        r.body["properties"]["dnsSettings"]["fqdn"],
        "shop.westeurope.cloudapp.azure.com"
    );
    assert!(
        h.put(&pip("pip-a"), body("shop", "eastus"))
            .await
            .status
            .is_success()
    );
    // A PUT without dnsSettings removes the label, and frees it.
    let r = h
        .put(
            &pip("pip-a"),
            json!({"location": "eastus", "sku": {"name": "StandardV2"}}),
        )
        .await;
    assert!(r.status.is_success(), "{r:?}");
    assert!(
        h.get(&pip("pip-a"), None).await.body["properties"]
            .get("dnsSettings")
            .is_none()
    );
    let r = h.put(&pip("pip-c"), body("shop", "eastus")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
}
