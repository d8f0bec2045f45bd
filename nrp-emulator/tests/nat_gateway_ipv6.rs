//! The emulator's rules for a NAT gateway's IPv6 public IPs (`publicIpAddressesV6`), over loopback
//! HTTP with the ARM client, as Azure has them: only a `StandardV2` NAT gateway takes them, each an
//! IPv6 `StandardV2` public IP; `publicIpAddresses` takes IPv4 ones only; at most 16 of each; a
//! public IP a NAT gateway uses cannot be deleted. A refused PUT changes nothing. And the Service
//! Gateway rule: an IPv6 address may refer to an outbound service only once its NAT gateway has an
//! IPv6 public IP.

use std::time::Duration;

use clb_nrp::azure::{ArmClient, ArmConfig};
use clb_nrp::wire::{
    AddressLocationUpdate, AddressUpdateAction, GatewayAddress, GatewayService, NatGateway,
    PublicIpAddress, PublicIpAddressProperties, ServiceGateway, ServiceRequest, Sku, SubResource,
    UpdateAction, UpdateAddressLocationsRequest, UpdateServicesRequest,
};
use clb_nrp::{CallOptions, Nrp, NrpError};
use clb_nrp_emulator::{Emulator, EmulatorConfig, RunningEmulator};

async fn start() -> (RunningEmulator, ArmClient) {
    let emulator = Emulator::new(EmulatorConfig::default()).expect("valid emulator config");
    let server = RunningEmulator::start(emulator)
        .await
        .expect("bind loopback");
    let mut config = ArmConfig::new("sub1", "rg1").with_endpoint(server.base_url());
    config.poll_interval = Duration::from_millis(1);
    let client = ArmClient::new(config, None).expect("client");
    (server, client)
}

fn opts() -> CallOptions {
    CallOptions::with_timeout(Duration::from_secs(30))
}

fn sku(name: &str) -> Option<Sku> {
    Some(Sku {
        name: name.into(),
        tier: None,
    })
}

async fn pip(c: &ArmClient, name: &str, version: &str, sku_name: &str) -> String {
    let body = PublicIpAddress {
        location: Some("eastus".into()),
        sku: sku(sku_name),
        properties: PublicIpAddressProperties {
            public_ip_allocation_method: Some("Static".into()),
            public_ip_address_version: Some(version.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    c.put_public_ip(name, &body, opts())
        .await
        .expect("public IP")
        .id
        .expect("id")
}

fn nat(sku_name: &str, v4: &[&str], v6: &[&str]) -> NatGateway {
    let mut n = NatGateway {
        location: Some("eastus".into()),
        sku: sku(sku_name),
        ..Default::default()
    };
    n.properties.public_ip_addresses = v4.iter().map(|id| SubResource::new(*id)).collect();
    n.properties.public_ip_addresses_v6 = v6.iter().map(|id| SubResource::new(*id)).collect();
    n
}

fn refused(r: Result<NatGateway, NrpError>, code: &str, says: &str) {
    let e = r.expect_err("refused");
    assert_eq!(e.code(), code, "{e}");
    assert!(e.to_string().contains(says), "{e}");
}

#[tokio::test]
async fn a_standard_v2_nat_gateway_takes_standard_v2_ipv6_public_ips() {
    let (server, c) = start().await;
    let v4 = pip(&c, "pip-eg", "IPv4", "StandardV2").await;
    let v6 = pip(&c, "pip-eg-v6", "IPv6", "StandardV2").await;
    let v6_standard = pip(&c, "pip-std-v6", "IPv6", "Standard").await;

    // A Standard NAT gateway is IPv4-only.
    refused(
        c.put_nat_gateway("nat", &nat("Standard", &[&v4], &[&v6]), opts())
            .await,
        "NatGatewaySkuDoesNotSupportIpv6",
        "SKU 'Standard', which supports IPv4 only",
    );
    // Each list holds its own version.
    refused(
        c.put_nat_gateway("nat", &nat("StandardV2", &[&v6], &[]), opts())
            .await,
        "NatGatewayPublicIpAddressVersionMismatch",
        "publicIpAddresses takes IPv4 public IP addresses only",
    );
    refused(
        c.put_nat_gateway("nat", &nat("StandardV2", &[], &[&v4]), opts())
            .await,
        "NatGatewayPublicIpAddressVersionMismatch",
        "publicIpAddressesV6 takes IPv6 public IP addresses only",
    );
    // An IPv6 public IP of the wrong SKU.
    refused(
        c.put_nat_gateway("nat", &nat("StandardV2", &[&v4], &[&v6_standard]), opts())
            .await,
        "NatGatewayIpv6PublicIpSkuMismatch",
        "has SKU 'Standard'",
    );
    // Nothing of the refused PUTs was kept.
    assert!(server.emulator().dump().nat_gateways.is_empty());

    let made = c
        .put_nat_gateway("nat", &nat("StandardV2", &[&v4], &[&v6]), opts())
        .await
        .expect("accepted");
    assert_eq!(made.properties.public_ip_addresses_v6[0].id, v6);
    let read = c.get_nat_gateway("nat", opts()).await.unwrap();
    assert_eq!(read.properties.public_ip_addresses_v6.len(), 1);
    // In use: the IPv6 public IP cannot be deleted, nor given to another NAT gateway.
    let e = c.delete_public_ip("pip-eg-v6", opts()).await.unwrap_err();
    assert_eq!(e.code(), "InUsePublicIpAddressCannotBeDeleted", "{e}");
    refused(
        c.put_nat_gateway("nat2", &nat("StandardV2", &[], &[&v6]), opts())
            .await,
        "PublicIPAddressInUse",
        "pip-eg-v6",
    );
    // Detached by a PUT without it, then deletable.
    c.put_nat_gateway("nat", &nat("StandardV2", &[&v4], &[]), opts())
        .await
        .unwrap();
    c.delete_public_ip("pip-eg-v6", opts()).await.unwrap();
}

#[tokio::test]
async fn at_most_sixteen_ipv6_public_ips() {
    let (_server, c) = start().await;
    let mut ids = Vec::new();
    for i in 0..17 {
        ids.push(pip(&c, &format!("p{i}"), "IPv6", "StandardV2").await);
    }
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    refused(
        c.put_nat_gateway("nat", &nat("StandardV2", &[], &refs), opts())
            .await,
        "NatGatewayTooManyPublicIpAddresses",
        "publicIpAddressesV6 lists 17",
    );
    c.put_nat_gateway("nat", &nat("StandardV2", &[], &refs[..16]), opts())
        .await
        .expect("16 is the limit");
}

#[tokio::test]
async fn an_ipv6_address_refers_to_an_egress_only_once_its_nat_gateway_has_an_ipv6_public_ip() {
    let (_server, c) = start().await;
    let gw = ServiceGateway {
        location: Some("eastus".into()),
        sku: Some(Sku::standard()),
        ..Default::default()
    };
    c.put_service_gateway("sg", &gw, opts()).await.unwrap();
    let v4 = pip(&c, "pip-eg", "IPv4", "StandardV2").await;
    let nat_id = c
        .put_nat_gateway("natgw-eg", &nat("StandardV2", &[&v4], &[]), opts())
        .await
        .unwrap()
        .id
        .unwrap();
    let req = UpdateServicesRequest {
        action: UpdateAction::PartialUpdate,
        service_requests: vec![ServiceRequest {
            is_delete: false,
            service: GatewayService::outbound("eg", &nat_id),
        }],
    };
    c.update_services("sg", &req, opts()).await.unwrap();
    let addresses = |address: &str, location: &str| UpdateAddressLocationsRequest {
        action: UpdateAction::PartialUpdate,
        address_locations: vec![AddressLocationUpdate {
            address_location: location.into(),
            address_update_action: AddressUpdateAction::FullUpdate,
            addresses: vec![GatewayAddress {
                address: address.into(),
                services: vec!["eg".into()],
            }],
        }],
    };
    c.update_address_locations("sg", &addresses("10.1.0.1", "10.0.0.1"), opts())
        .await
        .expect("IPv4 is served");
    let e = c
        .update_address_locations("sg", &addresses("fd01::1", "fd00::1"), opts())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "OutboundServiceHasNoIpv6PublicIp", "{e}");
    assert!(e.to_string().contains("'fd01::1'"), "{e}");

    let v6 = pip(&c, "pip-eg-v6", "IPv6", "StandardV2").await;
    c.put_nat_gateway("natgw-eg", &nat("StandardV2", &[&v4], &[&v6]), opts())
        .await
        .unwrap();
    c.update_address_locations("sg", &addresses("fd01::1", "fd00::1"), opts())
        .await
        .expect("IPv6 is served now");
}
