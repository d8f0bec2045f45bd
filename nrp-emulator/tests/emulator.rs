//! The NRP emulator's rules, over real HTTP on loopback.

mod emulator_common;

use clb_nrp::wire::{
    AddressLocationsPage, LoadBalancersPage, PublicIpAddressesPage, ResourceId, ResourceKind,
    ServicesPage,
};
use clb_nrp_emulator::{EmulatorConfig, RemovalCause};
use emulator_common::*;
use reqwest::{Method, StatusCode};
use serde_json::json;

fn strict() -> EmulatorConfig {
    EmulatorConfig {
        auto_create_gateways: false,
        ..Default::default()
    }
}

#[tokio::test]
async fn api_version_is_required() {
    let h = Harness::start(EmulatorConfig::default()).await;
    h.create_gateway(&gw("sg")).await;
    let base = format!("{}{}", h.server.base_url(), gw("sg"));
    let r = h.call(Method::GET, &base, None).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.code(), "MissingApiVersionParameter");
    let r = h
        .call(Method::GET, &format!("{base}?api-version=2019-01-01"), None)
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.code(), "InvalidApiVersionParameter");
    assert_eq!(
        r.body["error"]["message"],
        "The api-version '2019-01-01' is invalid. The supported versions are \
         '2025-05-01,2026-03-01'."
    );
    for v in ["2025-05-01", "2026-03-01"] {
        let r = h
            .call(Method::GET, &format!("{base}?api-version={v}"), None)
            .await;
        assert_eq!(r.status, StatusCode::OK, "{v}: {r:?}");
    }
    let r = h
        .call(
            Method::GET,
            &format!("{base}?api-version={}", api_version()),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let stats = h.emu().stats();
    assert_eq!(stats.rejected("MissingApiVersionParameter"), 1);
    assert_eq!(stats.calls_with_status("ServiceGateways_Get", 400), 2);
    assert_eq!(stats.calls_with_status("ServiceGateways_Get", 200), 3);
}

#[tokio::test]
async fn unknown_resources_are_404() {
    let h = Harness::start(strict()).await;
    let r = h.get(&gw("nope"), None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.code(), "ResourceNotFound");
    let r = h.get(&gw("nope"), Some("addressLocations")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = h
        .update_locations(
            &gw("nope"),
            partial(vec![loc("10.0.0.1", "FullUpdate", &[])]),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = h.get(&id(ResourceKind::LoadBalancer, "lb"), None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let url = format!(
        "{}/subscriptions/x/whatever?api-version={}",
        h.server.base_url(),
        api_version()
    );
    let r = h.call(Method::GET, &url, None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.code(), "NotFound");
    // Deleting what does not exist is idempotent.
    assert_eq!(h.delete(&gw("nope")).await.status, StatusCode::NO_CONTENT);
    // A PUT gateway works and then it exists.
    let r = h.put(&gw("sg"), json!({"location": "eastus"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["type"], "Microsoft.Network/serviceGateways");
    assert_eq!(h.get(&gw("SG"), None).await.status, StatusCode::OK);
    let r = h.put(&gw("sg2"), json!({})).await;
    assert_eq!(r.code(), "LocationRequired");
}

#[tokio::test]
async fn malformed_bodies_get_arm_errors_and_change_nothing() {
    let h = Harness::start(EmulatorConfig::default()).await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    h.register_inbound(&g, "svc").await;
    let url = h.url(&g, Some("updateAddressLocations"));
    for body in [
        &b"{not json"[..],
        b"",
        b"[]",
        b"{\"addressLocations\": 5}",
        b"\xff\xfe",
    ] {
        let r = h.raw(Method::POST, &url, Some(body.to_vec())).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body:?}");
        assert_eq!(r.code(), "InvalidRequestFormat", "{body:?}");
    }
    // Enum values the API does not define are read, then refused by name.
    let r = h
        .raw(
            Method::POST,
            &url,
            Some(b"{\"action\": \"Sideways\"}".to_vec()),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.code(), "InvalidUpdateAction");
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("action 'Sideways' is invalid"),
        "{r:?}"
    );
    let body = partial(vec![loc("10.0.0.1", "Sideways", &[("10.1.0.1", &["svc"])])]);
    let r = h.update_locations(&g, body).await;
    assert_eq!(r.code(), "InvalidUpdateAction", "{r:?}");
    let body = json!({"serviceRequests": [{"service": {"name": "t",
        "properties": {"serviceType": "Transit"}}}]});
    let r = h.post(&g, "updateServices", body).await;
    assert_eq!(r.code(), "InvalidServiceType", "{r:?}");
    let r = h
        .raw(
            Method::PUT,
            &h.url(&id(ResourceKind::LoadBalancer, "x"), None),
            Some(b"{".to_vec()),
        )
        .await;
    assert_eq!(r.code(), "InvalidRequestFormat");
    // Invalid IPs and mixed families.
    for (location, address, code) in [
        ("10.0.0.300", "10.1.0.1", "InvalidAddressLocation"),
        ("10.0.0.1", "pod", "InvalidAddress"),
        ("10.0.0.1", "fd00::1", "AddressFamilyMismatch"),
    ] {
        let r = h
            .update_locations(
                &g,
                partial(vec![loc(location, "PartialUpdate", &[(address, &["svc"])])]),
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert_eq!(r.code(), code);
    }
    assert!(
        h.emu()
            .dump()
            .gateway("sg")
            .unwrap()
            .address_locations
            .is_empty()
    );
}

#[tokio::test]
async fn addresses_may_only_refer_to_registered_services() {
    let h = Harness::start(EmulatorConfig::default()).await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    h.register_inbound(&g, "svc-a").await;
    let r = h
        .update_locations(
            &g,
            partial(vec![
                loc("10.0.0.1", "PartialUpdate", &[("10.1.0.1", &["svc-a"])]),
                loc(
                    "10.0.0.2",
                    "PartialUpdate",
                    &[("10.2.0.1", &["svc-a", "svc-b"])],
                ),
            ]),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.code(), "ServiceNotRegistered");
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("svc-b") && msg.contains("10.2.0.1"), "{msg}");
    // The whole request was rejected, including the valid location.
    assert!(
        h.emu()
            .dump()
            .gateway("sg")
            .unwrap()
            .address_locations
            .is_empty()
    );
    // Registering an inbound service whose load balancer does not exist fails too.
    let missing = id(ResourceKind::LoadBalancer, "ghost").backend_pool_id("pool");
    let r = h
        .post(&g, "updateServices", json!({"serviceRequests": [{"service": {"name": "svc-b",
            "properties": {"serviceType": "Inbound", "loadBalancerBackendPools": [{"id": missing}]}}}]}))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.code(), "InvalidResourceReference");
    assert_eq!(h.emu().dump().gateway("sg").unwrap().services.len(), 1);
}

#[tokio::test]
async fn duplicate_locations_are_rejected() {
    let h = Harness::start(EmulatorConfig::default()).await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    h.register_inbound(&g, "svc").await;
    let r = h
        .update_locations(
            &g,
            partial(vec![
                loc("fd00::1", "PartialUpdate", &[("fd01::1", &["svc"])]),
                loc("fd00:0::1", "PartialUpdate", &[("fd01::2", &["svc"])]),
            ]),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.code(), "DuplicateLocationsInRequest");
    assert_eq!(h.emu().stats().rejected("DuplicateLocationsInRequest"), 1);
}

#[tokio::test]
async fn referenced_services_and_their_resources_cannot_be_deleted() {
    let h = Harness::start(EmulatorConfig::default()).await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    h.register_inbound(&g, "svc").await;
    let r = h
        .update_locations(
            &g,
            partial(vec![loc(
                "10.0.0.1",
                "PartialUpdate",
                &[("10.1.0.1", &["svc"])],
            )]),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let delete = json!({"action": "PartialUpdate", "serviceRequests": [{"isDelete": true,
        "service": {"name": "svc", "properties": {"serviceType": "Inbound"}}}]});
    let r = h.post(&g, "updateServices", delete.clone()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.code(), "ServiceWithOverlayMappingsCannotBeDeleted");
    // A FullUpdate that omits it is refused as well.
    let r = h
        .post(
            &g,
            "updateServices",
            json!({"action": "FullUpdate", "serviceRequests": []}),
        )
        .await;
    assert_eq!(r.code(), "ServiceWithOverlayMappingsCannotBeDeleted");
    // The load balancer behind a registered service cannot go, nor its public IP.
    let lb = id(ResourceKind::LoadBalancer, "lb-svc");
    assert_eq!(
        h.delete(&lb).await.code(),
        "InUseLoadBalancerCannotBeDeleted"
    );
    let pip = id(ResourceKind::PublicIpAddress, "lb-svc-pip");
    assert_eq!(
        h.delete(&pip).await.code(),
        "InUsePublicIpAddressCannotBeDeleted"
    );
    // Drain, then delete in order: service, load balancer, public IP.
    let r = h
        .update_locations(
            &g,
            partial(vec![loc("10.0.0.1", "PartialUpdate", &[("10.1.0.1", &[])])]),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        h.post(&g, "updateServices", delete).await.status,
        StatusCode::OK
    );
    assert_eq!(h.delete(&lb).await.status, StatusCode::OK);
    assert_eq!(h.delete(&pip).await.status, StatusCode::OK);
    let dump = h.emu().dump();
    assert!(dump.gateway("sg").unwrap().services.is_empty());
    assert!(dump.load_balancers.is_empty() && dump.public_ip_addresses.is_empty());
}

#[tokio::test]
async fn outbound_services_need_an_existing_nat_gateway() {
    let h = Harness::start(EmulatorConfig::default()).await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    let nat = id(ResourceKind::NatGateway, "nat1");
    let body = json!({"serviceRequests": [{"service": {"name": "egress",
        "properties": {"serviceType": "Outbound", "publicNatGatewayId": nat.to_string()}}}]});
    assert_eq!(
        h.post(&g, "updateServices", body.clone()).await.code(),
        "InvalidResourceReference"
    );
    let pip = id(ResourceKind::PublicIpAddress, "nat-pip");
    assert!(
        h.put(&pip, json!({"location": "eastus"}))
            .await
            .status
            .is_success()
    );
    let r = h
        .put(&nat, json!({"location": "eastus", "properties": {"publicIpAddresses": [{"id": pip.to_string()}]}}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(
        h.post(&g, "updateServices", body).await.status,
        StatusCode::OK
    );
    // The public IP is now taken: another load balancer cannot use it.
    let lb = id(ResourceKind::LoadBalancer, "lb2");
    let r = h
        .put(
            &lb,
            json!({"location": "eastus", "properties": {"frontendIPConfigurations": [
            {"name": "fe", "properties": {"publicIPAddress": {"id": pip.to_string()}}}]}}),
        )
        .await;
    assert_eq!(r.code(), "PublicIPAddressInUse");
    assert_eq!(
        h.delete(&nat).await.code(),
        "InUseNatGatewayCannotBeDeleted"
    );
    let svc = &h.emu().dump().gateways[0].services[0];
    assert_eq!(
        svc.nat_gateway_id.as_deref(),
        Some(nat.to_string().as_str())
    );
}

#[tokio::test]
async fn full_and_partial_updates_and_the_removal_log() {
    let h = Harness::start(EmulatorConfig::default()).await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    h.register_inbound(&g, "a").await;
    h.register_inbound(&g, "b").await;
    let r = h
        .update_locations(
            &g,
            partial(vec![
                loc(
                    "10.0.0.1",
                    "FullUpdate",
                    &[("10.1.0.1", &["a"]), ("10.1.0.2", &["a", "b"])],
                ),
                loc("10.0.0.2", "FullUpdate", &[("10.2.0.1", &["b"])]),
            ]),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert!(h.emu().removals().is_empty());
    // Partial: upsert 10.1.0.3, narrow 10.1.0.2 to b, leave 10.1.0.1 alone.
    let r = h
        .update_locations(
            &g,
            partial(vec![loc(
                "10.0.0.1",
                "PartialUpdate",
                &[("10.1.0.3", &["b"]), ("10.1.0.2", &["b"])],
            )]),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let map = h.emu().dump().gateway("sg").unwrap().address_map();
    let svc = |l: &str, a: &str| {
        map.get(&(l.to_string(), a.to_string()))
            .map(|s| s.iter().cloned().collect::<Vec<_>>())
    };
    assert_eq!(svc("10.0.0.1", "10.1.0.1"), Some(vec!["a".to_string()]));
    assert_eq!(svc("10.0.0.1", "10.1.0.2"), Some(vec!["b".to_string()]));
    assert_eq!(svc("10.0.0.1", "10.1.0.3"), Some(vec!["b".to_string()]));
    let log = h.emu().removals();
    assert_eq!(log.len(), 1);
    assert_eq!(
        (log[0].address.as_str(), log[0].removed_services.clone()),
        ("10.1.0.2", vec!["a".to_string()])
    );
    assert!(!log[0].address_removed);
    // Full: only 10.1.0.3 stays at 10.0.0.1; 10.0.0.2 is deleted with an empty list.
    let r = h
        .update_locations(
            &g,
            partial(vec![
                loc("10.0.0.1", "FullUpdate", &[("10.1.0.3", &["b"])]),
                loc("10.0.0.2", "PartialUpdate", &[]),
            ]),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let dump = h.emu().dump();
    let gwd = dump.gateway("sg").unwrap();
    assert_eq!(gwd.address_locations.len(), 1);
    assert_eq!(gwd.address_map().len(), 1);
    let log = h.emu().removals();
    let causes: Vec<_> = log.iter().map(|r| (r.address.as_str(), r.cause)).collect();
    assert!(causes.contains(&("10.1.0.1", RemovalCause::AddressOmittedByFullUpdate)));
    assert!(causes.contains(&("10.1.0.2", RemovalCause::AddressOmittedByFullUpdate)));
    assert!(causes.contains(&("10.2.0.1", RemovalCause::LocationDeleted)));
    assert!(log.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(
        gwd.services
            .iter()
            .find(|s| s.name == "b")
            .unwrap()
            .address_count,
        1
    );
    // An address with an empty service list is removed; the emptied location goes too.
    let r = h
        .update_locations(
            &g,
            partial(vec![loc("10.0.0.1", "PartialUpdate", &[("10.1.0.3", &[])])]),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        h.emu()
            .dump()
            .gateway("sg")
            .unwrap()
            .address_locations
            .is_empty()
    );
    let last = h.emu().removals().pop().unwrap();
    assert!(last.address_removed && last.cause == RemovalCause::AddressUpdate);
    // The log is also served over HTTP.
    let r = h.control(Method::GET, "removals", None).await;
    assert_eq!(r.body.as_array().unwrap().len(), h.emu().removals().len());
}

#[tokio::test]
async fn address_locations_and_services_are_paged() {
    let h = Harness::start(EmulatorConfig {
        page_size: 3,
        ..Default::default()
    })
    .await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    for s in ["s1", "s2", "s3", "s4"] {
        h.register_inbound(&g, s).await;
    }
    let locations: Vec<_> = (1..=10)
        .map(|i| {
            let l = format!("10.0.0.{i}");
            let a = format!("10.{i}.0.1");
            json!({"addressLocation": l, "addressUpdateAction": "FullUpdate",
                   "addresses": [{"address": a, "services": ["s1"]}]})
        })
        .collect();
    assert_eq!(
        h.update_locations(&g, partial(locations)).await.status,
        StatusCode::OK
    );
    let mut url = h.url(&g, Some("addressLocations"));
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let r = h.call(Method::GET, &url, None).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        let page: AddressLocationsPage = serde_json::from_value(r.body).unwrap();
        pages += 1;
        seen.extend(page.value.into_iter().map(|l| l.address_location));
        match page.next_link {
            Some(next) => url = next,
            None => break,
        }
    }
    assert_eq!(pages, 4);
    assert_eq!(seen.len(), 10);
    let mut sorted = seen.clone();
    sorted.sort_by_key(|s| s.parse::<std::net::IpAddr>().unwrap());
    sorted.dedup();
    assert_eq!(sorted, seen);
    // Services: 4 over pages of 3.
    let r = h.get(&g, Some("services")).await;
    let first: ServicesPage = serde_json::from_value(r.body).unwrap();
    assert_eq!(first.value.len(), 3);
    let r = h.call(Method::GET, &first.next_link.unwrap(), None).await;
    let second: ServicesPage = serde_json::from_value(r.body).unwrap();
    assert_eq!(second.value.len(), 1);
    assert_eq!(second.value[0].name, "s4");
    assert!(second.next_link.is_none());
}

#[tokio::test]
async fn garbage_never_crashes_the_emulator() {
    let h = Harness::start(EmulatorConfig::default()).await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    let base = h.server.base_url();
    let paths = [
        h.url(&g, None),
        h.url(&g, Some("updateServices")),
        h.url(&g, Some("updateAddressLocations")),
        h.url(&g, Some("addressLocations")) + "&$skipToken=zzz",
        h.url(&id(ResourceKind::LoadBalancer, "lb"), None),
        h.url(&id(ResourceKind::NatGateway, "n"), None),
        format!(
            "{base}/subscriptions/s/resourceGroups/r/providers/Microsoft.Network/serviceGateways/a%2Fb?api-version=x"
        ),
        format!(
            "{base}/subscriptions/s/providers/Microsoft.Network/locations/l/operations/nope?api-version={}",
            api_version()
        ),
    ];
    let bodies: [&[u8]; 5] = [
        b"null",
        b"{\"addressLocations\":[{\"addressLocation\":\"\",\"addresses\":[{\"address\":null}]}]}",
        b"{\"serviceRequests\":[{\"service\":{\"name\":\"\"}}]}",
        b"{\"location\":\"x\",\"properties\":{\"loadBalancingRules\":[{\"name\":\"r\",\"properties\":{\"frontendPort\":70000}}]}}",
        &[0u8; 64],
    ];
    for p in &paths {
        for m in [
            Method::GET,
            Method::PUT,
            Method::POST,
            Method::DELETE,
            Method::PATCH,
        ] {
            for b in bodies {
                let r = h.raw(m.clone(), p, Some(b.to_vec())).await;
                assert!(r.status.as_u16() < 500, "{m} {p}: {r:?}");
                if !r.status.is_success() {
                    assert!(!r.code().is_empty(), "{m} {p}: {r:?}");
                }
            }
        }
    }
    // The garbage deleted the gateway at some point: it is gone, and can be PUT again.
    assert_eq!(h.get(&g, None).await.code(), "ResourceNotFound");
    h.create_gateway(&g).await;
    assert_eq!(h.get(&g, None).await.status, StatusCode::OK);
}

#[tokio::test]
async fn public_ips_get_stable_distinct_addresses_and_are_listed_by_resource_group() {
    let h = Harness::start(EmulatorConfig {
        page_size: 2,
        ..Default::default()
    })
    .await;
    let ip_of = |r: &Resp| {
        r.body["properties"]["ipAddress"]
            .as_str()
            .map(str::to_string)
    };
    let a = id(ResourceKind::PublicIpAddress, "pip-a");
    let r = h.put(&a, json!({"location": "eastus"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let ip_a = ip_of(&r).expect("the PUT's answer has the allocated address");
    let v4: std::net::Ipv4Addr = ip_a.parse().expect("an IPv4 address by default");
    assert_eq!(v4.octets()[0], 20, "{ip_a}");
    assert_eq!(r.body["properties"]["publicIPAddressVersion"], "IPv4");

    // A re-PUT keeps it, even one that names another address (ipAddress is read-only); so does GET.
    let r = h
        .put(
            &a,
            json!({"location": "eastus", "properties": {"ipAddress": "1.2.3.4"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(ip_of(&r), Some(ip_a.clone()));
    assert_eq!(ip_of(&h.get(&a, None).await), Some(ip_a.clone()));

    // Another public IP gets another address; an IPv6 one an address of the IPv6 range.
    let b = id(ResourceKind::PublicIpAddress, "pip-b");
    let ip_b = ip_of(&h.put(&b, json!({"location": "eastus"})).await).unwrap();
    assert_ne!(ip_b, ip_a);
    let c = id(ResourceKind::PublicIpAddress, "pip-c");
    let r = h
        .put(
            &c,
            json!({"location": "eastus", "properties": {"publicIPAddressVersion": "IPv6"}}),
        )
        .await;
    let ip_c: std::net::Ipv6Addr = ip_of(&r).unwrap().parse().expect("an IPv6 address");
    assert_eq!(ip_c.segments()[..3], [0x2001, 0xdb8, 0xc1b]);
    // A public IP in another resource group, which the listing below must not show.
    let elsewhere = ResourceId::new(SUB, "rg-other", ResourceKind::PublicIpAddress, "pip-z");
    let ip_z = ip_of(&h.put(&elsewhere, json!({"location": "eastus"})).await).unwrap();
    assert!(![&ip_a, &ip_b].contains(&&ip_z), "unique across groups");

    // GET …/publicIPAddresses lists the resource group's public IPs by name, paged.
    let mut url = format!(
        "{}/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/publicIPAddresses?api-version={}",
        h.server.base_url(),
        api_version()
    );
    let mut listed = Vec::new();
    let mut pages = 0;
    loop {
        let r = h.call(Method::GET, &url, None).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        pages += 1;
        let page: PublicIpAddressesPage = serde_json::from_value(r.body).unwrap();
        listed.extend(
            page.value
                .into_iter()
                .map(|p| (p.name.unwrap(), p.properties.ip_address.unwrap())),
        );
        match page.next_link {
            Some(next) => url = next,
            None => break,
        }
    }
    assert_eq!(pages, 2);
    assert_eq!(
        listed,
        [
            ("pip-a".to_string(), ip_a.clone()),
            ("pip-b".to_string(), ip_b.clone()),
            ("pip-c".to_string(), ip_c.to_string()),
        ]
    );
    assert_eq!(h.emu().stats().calls_of("PublicIPAddresses_List"), 2);

    // Deleted, it is gone (its address goes back to the pool); created again, it gets an address.
    assert_eq!(h.delete(&a).await.status, StatusCode::OK);
    assert_eq!(h.get(&a, None).await.status, StatusCode::NOT_FOUND);
    let again = ip_of(&h.put(&a, json!({"location": "eastus"})).await).unwrap();
    assert!(![&ip_b, &ip_z].contains(&&again), "{again}");
}

#[tokio::test]
async fn load_balancers_are_listed_by_resource_group_with_their_rules_paged() {
    let h = Harness::start(EmulatorConfig {
        page_size: 2,
        ..Default::default()
    })
    .await;
    for name in ["lb-c", "LB-a", "lb-b"] {
        h.create_lb(name).await;
    }
    // A load balancer in another resource group, which the listing below must not show.
    let elsewhere = ResourceId::new(SUB, "rg-other", ResourceKind::LoadBalancer, "lb-z");
    let r = h.put(&elsewhere, json!({"location": "eastus"})).await;
    assert!(r.status.is_success(), "{r:?}");

    let list = async || {
        let mut url = format!(
            "{}/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/loadBalancers?api-version={}",
            h.server.base_url(),
            api_version()
        );
        let (mut listed, mut pages) = (Vec::new(), 0);
        loop {
            let r = h.call(Method::GET, &url, None).await;
            assert_eq!(r.status, StatusCode::OK, "{r:?}");
            pages += 1;
            let page: LoadBalancersPage = serde_json::from_value(r.body).unwrap();
            listed.extend(page.value.into_iter().map(|lb| {
                let rules: Vec<(u16, u16)> = lb
                    .properties
                    .load_balancing_rules
                    .iter()
                    .map(|r| (r.properties.frontend_port, r.properties.backend_port))
                    .collect();
                (lb.name.unwrap(), rules)
            }));
            match page.next_link {
                Some(next) => url = next,
                None => break,
            }
        }
        (listed, pages)
    };
    let (listed, pages) = list().await;
    assert_eq!(pages, 2);
    assert_eq!(
        listed,
        [
            ("LB-a".to_string(), vec![(80, 8080)]),
            ("lb-b".to_string(), vec![(80, 8080)]),
            ("lb-c".to_string(), vec![(80, 8080)]),
        ]
    );
    assert_eq!(h.emu().stats().calls_of("LoadBalancers_List"), 2);
    let r = h
        .call(
            Method::PUT,
            &format!(
                "{}/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/loadBalancers?api-version={}",
                h.server.base_url(),
                api_version()
            ),
            Some(json!({})),
        )
        .await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{r:?}");

    // Deleted, it is no longer listed; the rest fits one page.
    assert_eq!(
        h.delete(&id(ResourceKind::LoadBalancer, "lb-b"))
            .await
            .status,
        StatusCode::OK
    );
    let (listed, pages) = list().await;
    assert_eq!(pages, 1);
    let names: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["LB-a", "lb-c"]);
}

/// IPv6 public IPs as `publicIPAddress.json` defines them (`publicIPAddressVersion`, an `IPVersion`:
/// IPv4 or IPv6), and load balancer frontends on them: the frontend takes the family of its public IP
/// (the spec gives a public frontend no version of its own), so one load balancer may have a frontend
/// of each family.
#[tokio::test]
async fn ipv6_public_ips_and_frontends_on_them() {
    let h = Harness::start(strict()).await;
    let v6 = id(ResourceKind::PublicIpAddress, "pip-v6");
    let r = h
        .put(
            &v6,
            json!({"location": "eastus", "sku": {"name": "Standard"}, "properties": {
                "publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv6"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let ip: std::net::Ipv6Addr = r.body["properties"]["ipAddress"]
        .as_str()
        .unwrap()
        .parse()
        .expect("an IPv6 address");
    // From the documentation prefix 2001:db8::/32 (RFC 3849).
    assert_eq!(ip.segments()[..2], [0x2001, 0xdb8], "{ip}");
    assert_eq!(r.body["properties"]["publicIPAddressVersion"], "IPv6");
    let got = h.get(&v6, None).await;
    assert_eq!(got.body["properties"]["ipAddress"], ip.to_string());
    assert_eq!(got.body["properties"]["publicIPAddressVersion"], "IPv6");

    // Enum values are compared case-insensitively and answered as ARM spells them.
    let lower = id(ResourceKind::PublicIpAddress, "pip-lower");
    let r = h
        .put(
            &lower,
            json!({"location": "eastus", "properties": {"publicIPAddressVersion": "ipv6"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["properties"]["publicIPAddressVersion"], "IPv6");
    assert!(
        r.body["properties"]["ipAddress"]
            .as_str()
            .unwrap()
            .contains(':')
    );

    // A version the spec does not define is refused, naming it; nothing is created.
    let bad = id(ResourceKind::PublicIpAddress, "pip-bad");
    let r = h
        .put(
            &bad,
            json!({"location": "eastus", "properties": {"publicIPAddressVersion": "IPv7"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.code(), "InvalidPublicIPAddressVersion");
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("'IPv7'") && msg.contains("pip-bad"), "{msg}");
    assert_eq!(h.get(&bad, None).await.status, StatusCode::NOT_FOUND);

    // A load balancer with a frontend of each family (dual stack), each with its own pool and rule.
    let v4 = id(ResourceKind::PublicIpAddress, "pip-v4");
    assert!(
        h.put(&v4, json!({"location": "eastus"}))
            .await
            .status
            .is_success()
    );
    let lb = id(ResourceKind::LoadBalancer, "lb-dual");
    let rule = |name: &str, fe: &str, pool: &str| {
        json!({"name": name, "properties": {
            "frontendIPConfiguration": {"id": lb.frontend_ip_configuration_id(fe)},
            "backendAddressPool": {"id": lb.backend_pool_id(pool)},
            "protocol": "Tcp", "frontendPort": 80, "backendPort": 8080}})
    };
    let r = h
        .put(
            &lb,
            json!({"location": "eastus", "properties": {
                "frontendIPConfigurations": [
                    {"name": "fe", "properties": {"publicIPAddress": {"id": v4.to_string()}}},
                    {"name": "fe-v6", "properties": {"publicIPAddress": {"id": v6.to_string()}}}],
                "backendAddressPools": [{"name": "pool"}, {"name": "pool-v6"}],
                "loadBalancingRules": [rule("tcp-80", "fe", "pool"), rule("tcp-80-v6", "fe-v6", "pool-v6")]}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let fes = &r.body["properties"]["frontendIPConfigurations"];
    assert_eq!(
        fes[1]["properties"]["publicIPAddress"]["id"],
        v6.to_string()
    );
    // The IPv6 public IP is in use now: it cannot be deleted.
    let r = h.delete(&v6).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.code(), "InUsePublicIpAddressCannotBeDeleted");
}

/// With `single_ip_version_pools`, a backend pool holds addresses of one IP version: an address of one
/// family that refers to a service whose addresses are all of the other is refused
/// (`BackendPoolAddressesMustHaveSameIpVersion`),
/// and so is a request that would give a service addresses of both; the whole request changes
/// nothing. A request that moves a service's addresses to the other family whole is accepted.
#[tokio::test]
async fn a_service_s_addresses_are_of_one_ip_version() {
    const CODE: &str = "BackendPoolAddressesMustHaveSameIpVersion";
    let h = Harness::start(strict()).await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    // Pools that serve no rule yet: the frontend rule (below) has nothing to say about them.
    h.register_inbound_of(&g, "svc-a", None).await;
    h.register_inbound_of(&g, "svc-b", None).await;
    let r = h
        .update_locations(
            &g,
            partial(vec![loc(
                "10.0.0.1",
                "PartialUpdate",
                &[("10.1.0.1", &["svc-a"])],
            )]),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");

    // An IPv6 address for svc-a, which holds IPv4 addresses only.
    let r = h
        .update_locations(
            &g,
            partial(vec![
                loc("10.0.0.2", "PartialUpdate", &[("10.1.0.2", &["svc-b"])]),
                loc("fd00::1", "PartialUpdate", &[("fd01::1", &["svc-a"])]),
            ]),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
    assert_eq!(r.code(), CODE);
    assert_eq!(
        r.body["error"]["message"],
        "address 'fd01::1' at location 'fd00::1' is IPv6 and refers to service 'svc-a', whose \
         backend pool holds IPv4 address(es) only (1 on service gateway 'sg'): a backend pool \
         holds addresses of one IP version"
    );
    let locations = |h: &Harness| {
        h.emu()
            .dump()
            .gateway("sg")
            .unwrap()
            .address_locations
            .len()
    };
    assert_eq!(locations(&h), 1, "the whole request was refused");

    // Both families for svc-b (which has no address yet) in one request.
    let r = h
        .update_locations(
            &g,
            partial(vec![
                loc("10.0.0.2", "PartialUpdate", &[("10.1.0.2", &["svc-b"])]),
                loc("fd00::1", "PartialUpdate", &[("fd01::2", &["svc-b"])]),
            ]),
        )
        .await;
    assert_eq!(r.code(), CODE);
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("'fd01::2'") && msg.contains("would also hold IPv4 address '10.1.0.2'"),
        "{msg}"
    );
    assert_eq!(locations(&h), 1);

    // One address of each family for two services of one family each is fine, as is an IPv6
    // address for svc-a once its IPv4 address is gone in the same request (a top-level FullUpdate
    // that omits its location).
    let r = h
        .update_locations(
            &g,
            json!({"action": "FullUpdate", "addressLocations": [
                loc("10.0.0.2", "PartialUpdate", &[("10.1.0.2", &["svc-b"])]),
                loc("fd00::1", "PartialUpdate", &[("fd01::1", &["svc-a"])]),
            ]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    // svc-a now holds IPv6 addresses only: IPv4 is refused for it.
    let r = h
        .update_locations(
            &g,
            partial(vec![loc(
                "10.0.0.2",
                "PartialUpdate",
                &[("10.1.0.3", &["svc-a"])],
            )]),
        )
        .await;
    assert_eq!(r.code(), CODE);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("holds IPv6 address(es) only"),
        "{r:?}"
    );
    // A location-level FullUpdate that drops svc-b's IPv4 address and gives it an IPv6 one.
    let r = h
        .update_locations(
            &g,
            partial(vec![
                loc("10.0.0.2", "FullUpdate", &[("10.1.0.2", &[])]),
                loc("fd00::1", "PartialUpdate", &[("fd01::2", &["svc-b"])]),
            ]),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(h.emu().stats().rejected(CODE), 3);

    // Off (for writers that state no family), both are accepted.
    let h = Harness::start(EmulatorConfig {
        single_ip_version_pools: false,
        ..strict()
    })
    .await;
    h.create_gateway(&g).await;
    h.register_inbound(&g, "svc-a").await;
    let r = h
        .update_locations(
            &g,
            partial(vec![
                loc("10.0.0.1", "PartialUpdate", &[("10.1.0.1", &["svc-a"])]),
                loc("fd00::1", "PartialUpdate", &[("fd01::1", &["svc-a"])]),
            ]),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
}

/// A load balancer translates IPv4 to IPv4 and IPv6 to IPv6 only: an address of the other version
/// than the public frontend its service's pool serves is refused
/// (`BackendAddressIpVersionDoesNotMatchFrontend`), changing nothing; the same address for the
/// service of its own version is accepted. Off with `single_ip_version_pools: false`.
#[tokio::test]
async fn an_address_must_be_of_its_pool_s_frontend_version() {
    const CODE: &str = "BackendAddressIpVersionDoesNotMatchFrontend";
    let h = Harness::start(strict()).await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    h.register_inbound_of(&g, "svc", Some("IPv4")).await;
    h.register_inbound_of(&g, "svc-v6", Some("IPv6")).await;
    let r = h
        .update_locations(
            &g,
            partial(vec![loc(
                "fd00::1",
                "PartialUpdate",
                &[("fd01::1", &["svc"])],
            )]),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
    assert_eq!(r.code(), CODE);
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with(
            "address 'fd01::1' at location 'fd00::1' is IPv6 and refers to service 'svc'"
        ) && msg.contains("with an IPv4 frontend (public IP '")
            && msg.contains("lb-svc-pip"),
        "{msg}"
    );
    // And an IPv4 address for the IPv6 service.
    let r = h
        .update_locations(
            &g,
            partial(vec![loc(
                "10.0.0.1",
                "PartialUpdate",
                &[("10.1.0.1", &["svc-v6"])],
            )]),
        )
        .await;
    assert_eq!(r.code(), CODE);
    assert!(
        h.emu()
            .dump()
            .gateway("sg")
            .unwrap()
            .address_locations
            .is_empty(),
        "nothing changed"
    );
    // Each family to its own service: accepted.
    let r = h
        .update_locations(
            &g,
            partial(vec![
                loc("10.0.0.1", "PartialUpdate", &[("10.1.0.1", &["svc"])]),
                loc("fd00::1", "PartialUpdate", &[("fd01::1", &["svc-v6"])]),
            ]),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(h.emu().stats().rejected(CODE), 2);

    let h = Harness::start(EmulatorConfig {
        single_ip_version_pools: false,
        ..strict()
    })
    .await;
    h.create_gateway(&g).await;
    h.register_inbound(&g, "svc").await;
    let r = h
        .update_locations(
            &g,
            partial(vec![loc(
                "fd00::1",
                "PartialUpdate",
                &[("fd01::1", &["svc"])],
            )]),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
}
