//! The ARM client against the project's NRP emulator over loopback HTTP: the inbound and outbound
//! sagas, drain-then-delete, paging and the emulator's validation errors, answered synchronously and as
//! long-running operations, at both api-versions (2025-05-01: the gateway actions are long-running,
//! `202`/`204`; 2026-03-01: they answer `200` with a JSON body).

use std::time::Duration;

use clb_nrp::azure::{ArmClient, ArmConfig};
use clb_nrp::wire::{
    API_VERSION, AddressLocationUpdate, BackendAddressPool, FrontendIpConfiguration,
    FrontendIpConfigurationProperties, GatewayAddress, GatewayService, LoadBalancer,
    LoadBalancerProperties, LoadBalancingRule, LoadBalancingRuleProperties, NatGateway,
    NatGatewayProperties, PublicIpAddress, ResourceId, ResourceKind, ServiceGateway,
    ServiceRequest, Sku, SubResource, TransportProtocol, UpdateAction,
    UpdateAddressLocationsRequest, UpdateServicesRequest,
};
use clb_nrp::{CallOptions, Nrp, NrpError};
use clb_nrp_emulator::{Emulator, EmulatorConfig, RunningEmulator};

const SUB: &str = "sub1";
const RG: &str = "rg1";
const GW: &str = "sg";

async fn start(config: EmulatorConfig) -> (RunningEmulator, ArmClient) {
    start_at(config, API_VERSION).await
}

async fn start_at(config: EmulatorConfig, api_version: &str) -> (RunningEmulator, ArmClient) {
    let emulator = Emulator::new(config).expect("valid emulator config");
    let server = RunningEmulator::start(emulator)
        .await
        .expect("bind loopback");
    let mut config = ArmConfig::new(SUB, RG)
        .with_endpoint(server.base_url())
        .with_api_version(api_version);
    config.poll_interval = Duration::from_millis(1);
    config.max_poll_interval = Duration::from_millis(10);
    let client = ArmClient::new(config, None).expect("client");
    (server, client)
}

fn opts() -> CallOptions {
    CallOptions::with_timeout(Duration::from_secs(30))
}

fn rid(kind: ResourceKind, name: &str) -> ResourceId {
    ResourceId::new(SUB, RG, kind, name)
}

fn public_ip() -> PublicIpAddress {
    PublicIpAddress {
        location: Some("eastus".into()),
        sku: Some(Sku::standard()),
        ..Default::default()
    }
}

/// The inbound saga's load balancer: one frontend on `pip`, one pool, TCP 80 → 8080.
fn load_balancer(lb: &ResourceId, pip: &str) -> LoadBalancer {
    LoadBalancer {
        location: Some("eastus".into()),
        sku: Some(Sku::standard()),
        properties: LoadBalancerProperties {
            frontend_ip_configurations: vec![FrontendIpConfiguration {
                name: "fe".into(),
                properties: FrontendIpConfigurationProperties {
                    public_ip_address: Some(SubResource::new(pip)),
                },
                ..Default::default()
            }],
            backend_address_pools: vec![BackendAddressPool {
                id: None,
                name: "pool".into(),
            }],
            load_balancing_rules: vec![LoadBalancingRule {
                id: None,
                name: "tcp-80".into(),
                properties: LoadBalancingRuleProperties {
                    frontend_ip_configuration: Some(SubResource::new(
                        lb.frontend_ip_configuration_id("fe"),
                    )),
                    backend_address_pool: Some(SubResource::new(lb.backend_pool_id("pool"))),
                    protocol: Some(TransportProtocol::Tcp),
                    frontend_port: 80,
                    backend_port: 8080,
                    ..Default::default()
                },
            }],
            provisioning_state: None,
        },
        ..Default::default()
    }
}

fn services(requests: Vec<ServiceRequest>) -> UpdateServicesRequest {
    UpdateServicesRequest {
        action: UpdateAction::PartialUpdate,
        service_requests: requests,
    }
}

/// An address and the services it belongs to.
type Address<'a> = (&'a str, &'a [&'a str]);

fn locations(entries: &[(&str, &[Address<'_>])]) -> UpdateAddressLocationsRequest {
    UpdateAddressLocationsRequest {
        action: UpdateAction::PartialUpdate,
        address_locations: entries
            .iter()
            .map(|(location, addresses)| AddressLocationUpdate {
                address_location: location.to_string(),
                address_update_action: UpdateAction::PartialUpdate,
                addresses: addresses
                    .iter()
                    .map(|(address, services)| GatewayAddress {
                        address: address.to_string(),
                        services: services.iter().map(|s| s.to_string()).collect(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

async fn saga_round_trip(config: EmulatorConfig, api_version: &str) {
    let lro = config.long_running_operations;
    let (server, client) = start_at(config, api_version).await;
    let nrp: &dyn Nrp = &client;

    // A gateway exists only once it is PUT.
    let err = nrp.get_service_gateway(GW, opts()).await.unwrap_err();
    assert_eq!(err.code(), "ResourceNotFound", "{err:?}");
    let gateway = ServiceGateway {
        location: Some("eastus".into()),
        sku: Some(Sku::standard()),
        zones: Some(vec!["1".into(), "2".into()]),
        tags: Some([("team".to_string(), "clb".to_string())].into()),
        ..Default::default()
    };
    let gw = nrp.put_service_gateway(GW, &gateway, opts()).await.unwrap();
    assert_eq!(gw.name.as_deref(), Some(GW));
    let read = nrp.get_service_gateway(GW, opts()).await.unwrap();
    assert_eq!(read.zones, gateway.zones);
    assert_eq!(read.tags, gateway.tags);
    assert!(read.etag.is_some());
    assert_eq!(
        read.properties.provisioning_state.as_deref(),
        Some("Succeeded")
    );

    // Inbound saga: public IP, load balancer, register the service with its backend pool.
    let pip = nrp
        .put_public_ip("pip-a", &public_ip(), opts())
        .await
        .unwrap();
    let pip_id = pip.id.clone().expect("public IP id");
    assert_eq!(
        pip_id,
        rid(ResourceKind::PublicIpAddress, "pip-a").to_string()
    );
    let lb_id = rid(ResourceKind::LoadBalancer, "lb-a");
    let lb = nrp
        .put_load_balancer("lb-a", &load_balancer(&lb_id, &pip_id), opts())
        .await
        .unwrap();
    assert_eq!(lb.properties.backend_address_pools.len(), 1);
    // One listing reads the load balancers back (with their rules); a missing name is left out.
    let lbs = ["LB-A", "lb-missing"].map(String::from);
    let found = nrp.find_load_balancers(&lbs, opts()).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].name.as_deref(), Some("lb-a"));
    assert_eq!(
        found[0].properties.load_balancing_rules,
        lb.properties.load_balancing_rules
    );
    let pool = lb_id.backend_pool_id("pool");
    let register = ServiceRequest {
        is_delete: false,
        service: GatewayService::inbound("svc-a", &pool),
    };
    nrp.update_services(GW, &services(vec![register.clone()]), opts())
        .await
        .unwrap();

    // Outbound saga: public IP, NAT gateway, register with the NAT gateway id.
    let nat_pip = nrp
        .put_public_ip("pip-nat", &public_ip(), opts())
        .await
        .unwrap();
    let nat = NatGateway {
        location: Some("eastus".into()),
        sku: Some(Sku::standard()),
        properties: NatGatewayProperties {
            public_ip_addresses: vec![SubResource::new(nat_pip.id.clone().unwrap())],
            ..Default::default()
        },
        ..Default::default()
    };
    let nat = nrp.put_nat_gateway("nat-e", &nat, opts()).await.unwrap();

    // NRP allocates the public IPs' addresses, and one listing (paged: three over pages of two)
    // reads them back; a name that does not exist is left out.
    let spare = nrp
        .put_public_ip("pip-spare", &public_ip(), opts())
        .await
        .unwrap();
    let allocated = |p: &PublicIpAddress| {
        p.properties
            .ip_address
            .clone()
            .expect("the PUT's result has the allocated address")
    };
    let ip_a = allocated(&pip);
    assert_ne!(ip_a, allocated(&nat_pip));
    let wanted = ["PIP-A", "pip-nat", "pip-spare", "pip-missing"].map(String::from);
    let mut found: Vec<(String, String)> = nrp
        .find_public_ips(&wanted, opts())
        .await
        .unwrap()
        .iter()
        .map(|p| (p.name.clone().unwrap(), allocated(p)))
        .collect();
    found.sort();
    assert_eq!(
        found,
        [
            ("pip-a".to_string(), ip_a.clone()),
            ("pip-nat".to_string(), allocated(&nat_pip)),
            ("pip-spare".to_string(), allocated(&spare)),
        ]
    );
    let egress = GatewayService::outbound("egress-e", nat.id.unwrap());
    nrp.update_services(
        GW,
        &services(vec![ServiceRequest {
            is_delete: false,
            service: egress,
        }]),
        opts(),
    )
    .await
    .unwrap();

    // Addresses on five locations, so that listing them takes three pages of two.
    let addresses: &[Address<'_>] = &[("10.1.0.1", &["svc-a", "egress-e"])];
    let request = locations(&[
        ("10.0.0.1", addresses),
        ("10.0.0.2", &[("10.1.0.2", &["svc-a"])]),
        ("10.0.0.3", &[("10.1.0.3", &["svc-a"])]),
        ("10.0.0.4", &[("10.1.0.4", &["egress-e"])]),
        ("10.0.0.5", &[("10.1.0.5", &["svc-a"])]),
    ]);
    nrp.update_address_locations(GW, &request, opts())
        .await
        .unwrap();
    let listed = nrp.list_address_locations(GW, opts()).await.unwrap();
    let mut names: Vec<_> = listed.iter().map(|l| l.address_location.clone()).collect();
    names.sort();
    assert_eq!(
        names,
        ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"]
    );
    let mut listed_services: Vec<_> = nrp
        .list_services(GW, opts())
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    listed_services.sort();
    assert_eq!(listed_services, ["egress-e", "svc-a"]);

    // The emulator enforces what Azure enforces, and the client maps it to typed errors.
    let duplicate = locations(&[("10.0.0.9", &[]), ("10.0.0.9", &[])]);
    let err = nrp
        .update_address_locations(GW, &duplicate, opts())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, NrpError::Validation { code, .. } if code == "DuplicateLocationsInRequest"),
        "{err:?}"
    );
    let delete = ServiceRequest {
        is_delete: true,
        ..register
    };
    let err = nrp
        .update_services(GW, &services(vec![delete.clone()]), opts())
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        "ServiceWithOverlayMappingsCannotBeDeleted",
        "{err:?}"
    );
    assert!(!err.is_retryable());

    // Drain svc-a (an empty ref removes the address, an empty list the location), then delete in the
    // reverse order of creation.
    let drain = locations(&[
        ("10.0.0.1", &[("10.1.0.1", &["egress-e"])]),
        ("10.0.0.2", &[("10.1.0.2", &[])]),
        ("10.0.0.3", &[]),
        ("10.0.0.5", &[]),
    ]);
    nrp.update_address_locations(GW, &drain, opts())
        .await
        .unwrap();
    nrp.update_services(GW, &services(vec![delete]), opts())
        .await
        .unwrap();
    nrp.delete_load_balancer("lb-a", opts()).await.unwrap();
    nrp.delete_public_ip("pip-a", opts()).await.unwrap();
    // Deleting again is a no-op; reading a deleted resource is NotFound.
    nrp.delete_public_ip("pip-a", opts()).await.unwrap();
    let err = nrp.get_load_balancer("lb-a", opts()).await.unwrap_err();
    assert!(matches!(err, NrpError::NotFound { .. }), "{err:?}");
    let found = nrp.find_public_ips(&wanted, opts()).await.unwrap();
    assert_eq!(found.len(), 2, "pip-a is gone: {found:?}");
    let found = nrp.find_load_balancers(&lbs, opts()).await.unwrap();
    assert!(found.is_empty(), "lb-a is gone: {found:?}");

    let dump = server.emulator().dump();
    let gw = dump.gateway(GW).unwrap();
    assert_eq!(gw.services.len(), 1);
    assert_eq!(gw.services[0].name, "egress-e");
    let mut left: Vec<_> = gw
        .address_locations
        .iter()
        .map(|l| l.address_location.as_str())
        .collect();
    left.sort();
    // 10.0.0.2 lost its only address, so the location went with it.
    assert_eq!(left, ["10.0.0.1", "10.0.0.4"]);
    assert!(dump.load_balancers.is_empty());

    // The actions were answered as the api-version defines them, and the client took every shape:
    // 200 with `{}` (2026-03-01, whatever the mode), 202 followed to its end (2025-05-01 in LRO
    // mode), 204 (2025-05-01 answered synchronously).
    let stats = server.emulator().stats();
    let status = match (api_version, lro) {
        ("2026-03-01", _) => 200,
        (_, true) => 202,
        _ => 204,
    };
    for op in [
        "ServiceGateways_UpdateServices",
        "ServiceGateways_UpdateAddressLocations",
    ] {
        assert!(stats.calls_with_status(op, status) >= 2, "{op} {status}");
        for other in [200, 202, 204].into_iter().filter(|s| *s != status) {
            assert_eq!(stats.calls_with_status(op, other), 0, "{op} {other}");
        }
    }

    // Deleting the gateway: then it is gone (NotFound), and deleting it again succeeds.
    let listed = client.list_service_gateways(opts()).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name.as_deref(), Some(GW));
    client.delete_service_gateway(GW, opts()).await.unwrap();
    let err = nrp.get_service_gateway(GW, opts()).await.unwrap_err();
    assert_eq!(err.code(), "ResourceNotFound", "{err:?}");
    client.delete_service_gateway(GW, opts()).await.unwrap();
    assert!(
        client
            .list_service_gateways(opts())
            .await
            .unwrap()
            .is_empty()
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn sagas_against_the_synchronous_emulator_at_2025_05_01() {
    let config = EmulatorConfig {
        page_size: 2,
        ..Default::default()
    };
    saga_round_trip(config, "2025-05-01").await;
}

#[tokio::test]
async fn sagas_against_the_synchronous_emulator_at_2026_03_01() {
    let config = EmulatorConfig {
        page_size: 2,
        ..Default::default()
    };
    saga_round_trip(config, "2026-03-01").await;
}

fn lro() -> EmulatorConfig {
    EmulatorConfig {
        page_size: 2,
        long_running_operations: true,
        lro_retry_after_secs: 0,
        ..Default::default()
    }
}

#[tokio::test]
async fn sagas_against_the_emulator_with_long_running_operations_at_2025_05_01() {
    saga_round_trip(lro(), "2025-05-01").await;
}

#[tokio::test]
async fn sagas_against_the_emulator_with_long_running_operations_at_2026_03_01() {
    saga_round_trip(lro(), "2026-03-01").await;
}

#[tokio::test]
async fn emulator_throttling_is_typed() {
    let (server, nrp) = start(EmulatorConfig {
        fault_rate_429: 1.0,
        retry_after_secs: 4,
        seed: Some(7),
        ..Default::default()
    })
    .await;
    let err = nrp
        .update_services(GW, &services(vec![]), opts())
        .await
        .unwrap_err();
    assert!(matches!(err, NrpError::Throttled { .. }), "{err:?}");
    assert_eq!(err.retry_after(), Some(Duration::from_secs(4)));
    assert_eq!(server.emulator().stats().calls, 1, "not retried");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_client_follows_the_emulated_write_budget() {
    let (server, nrp) = start(EmulatorConfig {
        write_bucket_size: Some(3),
        write_refill_per_sec: 0.01,
        auto_create_gateways: true,
        ..Default::default()
    })
    .await;
    assert_eq!(nrp.remaining_subscription_writes(), None);
    nrp.update_services(GW, &services(vec![]), opts())
        .await
        .unwrap();
    assert_eq!(nrp.remaining_subscription_writes(), Some(2));
    nrp.get_service_gateway(GW, opts()).await.unwrap();
    assert_eq!(
        nrp.remaining_subscription_writes(),
        Some(2),
        "reads are free"
    );
    for left in [1, 0] {
        nrp.update_services(GW, &services(vec![]), opts())
            .await
            .unwrap();
        assert_eq!(nrp.remaining_subscription_writes(), Some(left));
    }
    let err = nrp
        .update_services(GW, &services(vec![]), opts())
        .await
        .unwrap_err();
    assert!(matches!(err, NrpError::Throttled { .. }), "{err:?}");
    assert_eq!(err.code(), "SubscriptionRequestsThrottled");
    assert_eq!(err.retry_after(), Some(Duration::from_secs(100)));
    assert_eq!(nrp.remaining_subscription_writes(), Some(0));
    assert_eq!(server.emulator().stats().throttled_by_write_budget, 1);
    server.shutdown().await.unwrap();
}
