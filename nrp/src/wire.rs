//! Wire types of the Service Gateway REST API (`Microsoft.Network/serviceGateways`, api-version
//! [`API_VERSION`]) and of the resources the service sagas create (public IP addresses, load balancers,
//! NAT gateways), plus ARM resource-id helpers.
//!
//! JSON field names are camelCase as ARM uses them (checked against `serviceGateway.json` of the
//! `2025-05-01` stable Network spec). Both the ARM client and the NRP emulator use these types, so the
//! client is exercised against exactly the shapes the emulator accepts.
//!
//! Deserialisation is lenient where ARM is (unknown fields are ignored, optional lists default to empty);
//! semantic validation (IPs, references) is the server's job.

use serde::{Deserialize, Serialize};

mod ids;
mod resources;

pub use ids::{ResourceId, ResourceIdError, ResourceKind};
pub use resources::{
    BackendAddressPool, FrontendIpConfiguration, FrontendIpConfigurationProperties, LoadBalancer,
    LoadBalancerProperties, LoadBalancingRule, LoadBalancingRuleProperties, NatGateway,
    NatGatewayProperties, PublicIpAddress, PublicIpAddressProperties, TransportProtocol,
};

/// The ARM api-version of every call this project makes.
pub const API_VERSION: &str = "2025-05-01";

/// ARM resource provider namespace of every resource here.
pub const PROVIDER: &str = "Microsoft.Network";

// ---------------------------------------------------------------------------------------------------
// ARM envelopes
// ---------------------------------------------------------------------------------------------------

/// The ARM error body: `{"error": {"code": ..., "message": ...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArmErrorBody {
    /// The error.
    pub error: ArmError,
}

/// One ARM error (`CloudError.error`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArmError {
    /// Machine-readable code, e.g. `DuplicateLocationsInRequest`.
    pub code: String,
    /// Human-readable message.
    #[serde(default)]
    pub message: String,
    /// The offending field or item, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Nested errors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<ArmError>,
}

impl ArmErrorBody {
    /// An error body with `code` and `message`.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            error: ArmError {
                code: code.into(),
                message: message.into(),
                target: None,
                details: Vec::new(),
            },
        }
    }
}

/// An ARM list response page: `{"value": [...], "nextLink": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Page<T> {
    /// The items of this page.
    #[serde(default = "Vec::new")]
    pub value: Vec<T>,
    /// Absolute URL of the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_link: Option<String>,
}

/// State of an ARM long-running operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OperationState {
    /// Still running: poll again (after `Retry-After`).
    InProgress,
    /// Done.
    Succeeded,
    /// Done, with an error.
    Failed,
    /// Cancelled.
    Canceled,
}

impl OperationState {
    /// Whether the operation has finished (successfully or not).
    pub fn is_terminal(self) -> bool {
        !matches!(self, Self::InProgress)
    }
}

/// Body of the `Azure-AsyncOperation` status endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationStatus {
    /// Operation id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Operation name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Current state.
    pub status: OperationState,
    /// The error when `status` is `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ArmError>,
}

/// A reference to another resource or sub-resource: `{"id": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SubResource {
    /// Full ARM id.
    pub id: String,
}

impl SubResource {
    /// A reference to `id`.
    pub fn new(id: impl Into<String>) -> Self {
        Self { id: id.into() }
    }
}

/// A resource SKU: `{"name": "Standard", "tier": "Regional"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sku {
    /// SKU name, e.g. `Standard`.
    pub name: String,
    /// SKU tier, e.g. `Regional`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
}

impl Sku {
    /// The `Standard` SKU (tier `Regional`).
    pub fn standard() -> Self {
        Self {
            name: "Standard".into(),
            tier: Some("Regional".into()),
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Service gateway
// ---------------------------------------------------------------------------------------------------

/// Top-level or per-location update mode (`UpdateAction` / `AddressUpdateAction` / `ServiceUpdateAction`
/// of the spec, which share the same two values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UpdateAction {
    /// Replace everything in scope with the given list (what is not listed is removed).
    FullUpdate,
    /// Change only the listed entries.
    #[default]
    PartialUpdate,
}

/// Per-location update mode; same values as [`UpdateAction`].
pub type AddressUpdateAction = UpdateAction;

/// The `Microsoft.Network/serviceGateways` resource.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceGateway {
    /// Full ARM id (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Resource name (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `Microsoft.Network/serviceGateways` (read-only).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub resource_type: Option<String>,
    /// Azure region, e.g. `eastus` (required on PUT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Entity tag (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// SKU (`Standard`/`Regional`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sku: Option<Sku>,
    /// Properties.
    #[serde(default)]
    pub properties: ServiceGatewayProperties,
}

/// `ServiceGatewayPropertiesFormat`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceGatewayProperties {
    /// The virtual network the gateway lives in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_network: Option<SubResource>,
    /// Read-only GUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_guid: Option<String>,
    /// Read-only provisioning state, e.g. `Succeeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_state: Option<String>,
}

/// Kind of a gateway service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ServiceType {
    /// Inbound: a load balancer backend pool.
    Inbound,
    /// Outbound: a NAT gateway.
    Outbound,
    /// Both.
    InboundOutbound,
}

impl ServiceType {
    /// Whether the service carries inbound traffic (needs a backend pool).
    pub fn is_inbound(self) -> bool {
        matches!(self, Self::Inbound | Self::InboundOutbound)
    }
    /// Whether the service carries outbound traffic (needs a NAT gateway).
    pub fn is_outbound(self) -> bool {
        matches!(self, Self::Outbound | Self::InboundOutbound)
    }
}

/// `ServiceGatewayService`: one service registered on a gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayService {
    /// Service name (the identity: a Service UID or an egress name).
    pub name: String,
    /// Properties.
    #[serde(default)]
    pub properties: GatewayServiceProperties,
}

/// `ServiceGatewayServicePropertiesFormat`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayServiceProperties {
    /// Inbound, Outbound or InboundOutbound (required unless deleting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_type: Option<ServiceType>,
    /// Whether this is the default service for its direction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_default: Option<bool>,
    /// Backend pools (inbound): ids of `…/loadBalancers/{lb}/backendAddressPools/{pool}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub load_balancer_backend_pools: Vec<SubResource>,
    /// NAT gateway id (outbound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_nat_gateway_id: Option<String>,
}

impl GatewayService {
    /// An inbound service backed by the load balancer backend pool `backend_pool_id`.
    pub fn inbound(name: impl Into<String>, backend_pool_id: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            properties: GatewayServiceProperties {
                service_type: Some(ServiceType::Inbound),
                is_default: None,
                load_balancer_backend_pools: vec![SubResource::new(backend_pool_id)],
                public_nat_gateway_id: None,
            },
        }
    }

    /// An outbound service backed by the NAT gateway `nat_gateway_id`.
    pub fn outbound(name: impl Into<String>, nat_gateway_id: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            properties: GatewayServiceProperties {
                service_type: Some(ServiceType::Outbound),
                is_default: None,
                load_balancer_backend_pools: Vec::new(),
                public_nat_gateway_id: Some(nat_gateway_id.into()),
            },
        }
    }
}

/// `ServiceGatewayServiceRequest`: register/update (`isDelete: false`) or delete a service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceRequest {
    /// Delete the service instead of creating/updating it.
    #[serde(default)]
    pub is_delete: bool,
    /// The service.
    pub service: GatewayService,
}

/// Body of `POST …/serviceGateways/{name}/updateServices`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateServicesRequest {
    /// `PartialUpdate` (change only the listed services) or `FullUpdate` (unlisted services are removed).
    #[serde(default)]
    pub action: UpdateAction,
    /// The service changes.
    #[serde(default)]
    pub service_requests: Vec<ServiceRequest>,
}

/// `ServiceGatewayAddress`: one address (pod IP) and the services it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayAddress {
    /// The address (IPv4 or IPv6).
    pub address: String,
    /// Service names; empty in an update removes the address.
    #[serde(default)]
    pub services: Vec<String>,
}

/// `ServiceGatewayAddressLocation`: one location (node IP) of an update request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddressLocationUpdate {
    /// The location (node IP).
    pub address_location: String,
    /// `FullUpdate` replaces the location's addresses; `PartialUpdate` upserts the listed ones.
    #[serde(default)]
    pub address_update_action: AddressUpdateAction,
    /// Addresses; an empty list deletes the whole location.
    #[serde(default)]
    pub addresses: Vec<GatewayAddress>,
}

/// Body of `POST …/serviceGateways/{name}/updateAddressLocations`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateAddressLocationsRequest {
    /// `PartialUpdate` (change only the listed locations) or `FullUpdate` (unlisted locations are
    /// removed). This project always sends `PartialUpdate`.
    #[serde(default)]
    pub action: UpdateAction,
    /// The location changes; a location may appear at most once.
    #[serde(default)]
    pub address_locations: Vec<AddressLocationUpdate>,
}

/// `ServiceGatewayAddressLocationResponse`: one location as listed by `GET …/addressLocations`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddressLocation {
    /// The location (node IP).
    pub address_location: String,
    /// Its addresses.
    #[serde(default)]
    pub addresses: Vec<GatewayAddress>,
}

/// A page of `GET …/serviceGateways/{name}/addressLocations`.
pub type AddressLocationsPage = Page<AddressLocation>;
/// A page of `GET …/serviceGateways/{name}/services`.
pub type ServicesPage = Page<GatewayService>;
/// A page of `GET …/resourceGroups/{rg}/providers/Microsoft.Network/publicIPAddresses`.
pub type PublicIpAddressesPage = Page<PublicIpAddress>;
/// A page of `GET …/resourceGroups/{rg}/providers/Microsoft.Network/loadBalancers`.
pub type LoadBalancersPage = Page<LoadBalancer>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_requests_use_arm_field_names() {
        let req = UpdateServicesRequest {
            action: UpdateAction::PartialUpdate,
            service_requests: vec![ServiceRequest {
                is_delete: false,
                service: GatewayService::inbound("svc", "/x/backendAddressPools/p"),
            }],
        };
        let v = serde_json::to_value(&req).unwrap();
        assert_eq!(v["action"], "PartialUpdate");
        assert_eq!(v["serviceRequests"][0]["isDelete"], false);
        assert_eq!(
            v["serviceRequests"][0]["service"]["properties"]["serviceType"],
            "Inbound"
        );
        assert_eq!(
            v["serviceRequests"][0]["service"]["properties"]["loadBalancerBackendPools"][0]["id"],
            "/x/backendAddressPools/p"
        );
        let body = r#"{"action":"PartialUpdate","addressLocations":[{"addressLocation":"10.0.0.1",
            "addressUpdateAction":"FullUpdate","addresses":[{"address":"10.1.0.4","services":["a"]},
            {"address":"10.1.0.5"}]}]}"#;
        let req: UpdateAddressLocationsRequest = serde_json::from_str(body).unwrap();
        assert_eq!(
            req.address_locations[0].address_update_action,
            UpdateAction::FullUpdate
        );
        assert!(req.address_locations[0].addresses[1].services.is_empty());
        let lb: LoadBalancer = serde_json::from_str(
            r#"{"location":"x","properties":{"frontendIPConfigurations":[{"name":"f",
            "properties":{"publicIPAddress":{"id":"p"}}}],"loadBalancingRules":[{"name":"r",
            "properties":{"frontendIPConfiguration":{"id":"f"},"protocol":"Tcp","frontendPort":80,
            "backendPort":8080}}]}}"#,
        )
        .unwrap();
        assert_eq!(
            lb.properties.load_balancing_rules[0]
                .properties
                .backend_port,
            8080
        );
    }
}
