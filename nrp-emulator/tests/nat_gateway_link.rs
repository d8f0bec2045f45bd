//! The emulator's rules for a NAT gateway's link to a Service Gateway (`properties.serviceGateway`),
//! over loopback HTTP with the ARM client: only a StandardV2 NAT gateway may be linked, to a Service
//! Gateway that exists; its SKU cannot change; a NAT gateway a registration uses cannot be unlinked
//! until the registration goes (nor deleted, unless `delete_nat_gateways_in_use` plays an
//! out-of-band deletion); a registration naming a NAT gateway linked elsewhere is refused.
//! NAT gateways live in any resource group (the VNet's), and every other field is kept.

use std::time::Duration;

use clb_nrp::azure::{ArmClient, ArmConfig};
use clb_nrp::wire::{
    GatewayService, NatGateway, ResourceId, ResourceKind, ServiceGateway, ServiceRequest, Sku,
    SubResource, UpdateAction, UpdateServicesRequest,
};
use clb_nrp::{CallOptions, Nrp, NrpError};
use clb_nrp_emulator::{Emulator, EmulatorConfig, RunningEmulator};

const SUB: &str = "sub1";
const RG: &str = "rg1";
const VNET_RG: &str = "rg-vnet";

async fn start() -> (RunningEmulator, ArmClient) {
    let emulator = Emulator::new(EmulatorConfig::default()).expect("valid emulator config");
    let server = RunningEmulator::start(emulator)
        .await
        .expect("bind loopback");
    let mut config = ArmConfig::new(SUB, RG).with_endpoint(server.base_url());
    config.poll_interval = Duration::from_millis(1);
    let client = ArmClient::new(config, None).expect("client");
    (server, client)
}

fn opts() -> CallOptions {
    CallOptions::with_timeout(Duration::from_secs(30))
}

fn nat(sku: &str, link: Option<&str>) -> NatGateway {
    let mut other = serde_json::Map::new();
    other.insert("tags".into(), serde_json::json!({"owner": "net"}));
    let mut n = NatGateway {
        location: Some("eastus".into()),
        sku: Some(Sku {
            name: sku.into(),
            tier: None,
        }),
        other,
        ..Default::default()
    };
    n.properties.idle_timeout_in_minutes = Some(9);
    n.properties.service_gateway = link.map(SubResource::new);
    n
}

fn code(e: NrpError) -> String {
    e.code().to_owned()
}

async fn register(
    c: &ArmClient,
    gw: &str,
    name: &str,
    nat_id: &str,
    delete: bool,
) -> Result<(), NrpError> {
    let req = UpdateServicesRequest {
        action: UpdateAction::PartialUpdate,
        service_requests: vec![ServiceRequest {
            is_delete: delete,
            service: GatewayService::outbound(name, nat_id),
        }],
    };
    c.update_services(gw, &req, opts()).await
}

async fn gateway(c: &ArmClient, name: &str) -> String {
    let body = ServiceGateway {
        location: Some("eastus".into()),
        sku: Some(Sku::standard()),
        ..Default::default()
    };
    c.put_service_gateway(name, &body, opts())
        .await
        .expect("gateway")
        .id
        .expect("id")
}

#[tokio::test]
async fn a_standard_v2_nat_gateway_in_another_resource_group_links_and_unlinks_in_order() {
    let (_server, c) = start().await;
    let sg = gateway(&c, "sg").await;
    let other = gateway(&c, "sg-other").await;
    let id = ResourceId::new(SUB, VNET_RG, ResourceKind::NatGateway, "byo").to_string();

    // Made unlinked, then linked by a read-modify-write: everything else is kept.
    let made = c
        .put_nat_gateway_in(VNET_RG, "byo", &nat("StandardV2", None), opts())
        .await
        .expect("made");
    assert_eq!(made.id.as_deref(), Some(id.as_str()));
    let mut body = c.get_nat_gateway_in(VNET_RG, "byo", opts()).await.unwrap();
    body.properties.service_gateway = Some(SubResource::new(&sg));
    let linked = c
        .put_nat_gateway_in(VNET_RG, "byo", &body, opts())
        .await
        .expect("linked");
    assert_eq!(
        linked.other.get("tags"),
        Some(&serde_json::json!({"owner": "net"}))
    );
    assert_eq!(linked.properties.idle_timeout_in_minutes, Some(9));
    // Not found in the gateway's resource group: it lives in the VNet's.
    assert!(matches!(
        c.get_nat_gateway("byo", opts()).await.unwrap_err(),
        NrpError::NotFound { .. }
    ));

    // Registered on another gateway than it is linked to: refused.
    let e = register(&c, "sg-other", "eg", &id, false)
        .await
        .unwrap_err();
    assert_eq!(code(e), "NatGatewayLinkedToAnotherServiceGateway");
    register(&c, "sg", "eg", &id, false)
        .await
        .expect("registered");

    // Unlinked (or linked elsewhere) while registered: refused; after unregistering: accepted.
    let mut unlink = linked.clone();
    unlink.properties.service_gateway = None;
    let e = c
        .put_nat_gateway_in(VNET_RG, "byo", &unlink, opts())
        .await
        .unwrap_err();
    assert_eq!(code(e), "NatGatewayInUseByServiceGateway");
    let mut moved = linked.clone();
    moved.properties.service_gateway = Some(SubResource::new(&other));
    let e = c
        .put_nat_gateway_in(VNET_RG, "byo", &moved, opts())
        .await
        .unwrap_err();
    assert_eq!(code(e), "NatGatewayInUseByServiceGateway");
    register(&c, "sg", "eg", &id, true)
        .await
        .expect("unregistered");
    let back = c
        .put_nat_gateway_in(VNET_RG, "byo", &unlink, opts())
        .await
        .expect("unlinked");
    assert_eq!(back.properties.service_gateway, None);
    assert_eq!(
        back.other.get("tags"),
        Some(&serde_json::json!({"owner": "net"}))
    );
}

#[tokio::test]
async fn only_a_standard_v2_nat_gateway_links_to_a_gateway_that_exists_and_skus_do_not_change() {
    let (_server, c) = start().await;
    let sg = gateway(&c, "sg").await;
    let e = c
        .put_nat_gateway_in(VNET_RG, "std", &nat("Standard", Some(&sg)), opts())
        .await
        .unwrap_err();
    assert_eq!(code(e), "NatGatewaySkuNotSupportedForServiceGateway");
    c.put_nat_gateway_in(VNET_RG, "std", &nat("Standard", None), opts())
        .await
        .expect("an unlinked Standard NAT gateway");
    let e = c
        .put_nat_gateway_in(VNET_RG, "std", &nat("StandardV2", None), opts())
        .await
        .unwrap_err();
    assert_eq!(code(e), "NatGatewaySkuCannotBeChanged");
    let missing = ResourceId::new(SUB, RG, ResourceKind::ServiceGateway, "nope").to_string();
    let e = c
        .put_nat_gateway_in(VNET_RG, "v2", &nat("StandardV2", Some(&missing)), opts())
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidResourceReference");
    let e = c
        .put_nat_gateway_in(
            VNET_RG,
            "v2",
            &nat("StandardV2", Some("/not/an/id")),
            opts(),
        )
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidResourceReference");
    // Nothing was made by the refused calls.
    assert!(matches!(
        c.get_nat_gateway_in(VNET_RG, "v2", opts())
            .await
            .unwrap_err(),
        NrpError::NotFound { .. }
    ));
}

#[tokio::test]
async fn a_nat_gateway_in_use_is_deleted_only_when_the_emulator_plays_an_out_of_band_deletion() {
    let (server, c) = start().await;
    let sg = gateway(&c, "sg").await;
    let id = ResourceId::new(SUB, RG, ResourceKind::NatGateway, "byo").to_string();
    c.put_nat_gateway("byo", &nat("StandardV2", Some(&sg)), opts())
        .await
        .expect("made linked");
    register(&c, "sg", "eg", &id, false)
        .await
        .expect("registered");
    let e = c.delete_nat_gateway("byo", opts()).await.unwrap_err();
    assert_eq!(code(e), "InUseNatGatewayCannotBeDeleted");

    let mut config = server.emulator().config();
    config.delete_nat_gateways_in_use = true;
    server.emulator().set_config(config).expect("valid config");
    c.delete_nat_gateway("byo", opts())
        .await
        .expect("deleted out of band");
    assert!(matches!(
        c.get_nat_gateway("byo", opts()).await.unwrap_err(),
        NrpError::NotFound { .. }
    ));
    // The registration still names it.
    let dump = server.emulator().dump();
    let svc = &dump.gateways[0].services[0];
    assert_eq!(svc.nat_gateway_id.as_deref(), Some(id.as_str()));
}
