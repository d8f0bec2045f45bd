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

use std::fmt;

use serde::{Deserialize, Serialize};

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

// ---------------------------------------------------------------------------------------------------
// Public IP addresses, load balancers, NAT gateways
// ---------------------------------------------------------------------------------------------------

/// A `Microsoft.Network/publicIPAddresses` resource.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicIpAddress {
    /// Full ARM id (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Name (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `Microsoft.Network/publicIPAddresses` (read-only).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub resource_type: Option<String>,
    /// Azure region (required on PUT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// SKU (`Standard`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sku: Option<Sku>,
    /// Properties.
    #[serde(default)]
    pub properties: PublicIpAddressProperties,
}

/// Properties of a public IP address.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicIpAddressProperties {
    /// `Static` or `Dynamic`.
    #[serde(
        default,
        rename = "publicIPAllocationMethod",
        skip_serializing_if = "Option::is_none"
    )]
    pub public_ip_allocation_method: Option<String>,
    /// `IPv4` or `IPv6`.
    #[serde(
        default,
        rename = "publicIPAddressVersion",
        skip_serializing_if = "Option::is_none"
    )]
    pub public_ip_address_version: Option<String>,
    /// The allocated address (read-only).
    #[serde(default, rename = "ipAddress", skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
    /// Read-only provisioning state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_state: Option<String>,
}

/// A `Microsoft.Network/loadBalancers` resource.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancer {
    /// Full ARM id (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Name (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `Microsoft.Network/loadBalancers` (read-only).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub resource_type: Option<String>,
    /// Azure region (required on PUT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// SKU (`Standard`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sku: Option<Sku>,
    /// Properties.
    #[serde(default)]
    pub properties: LoadBalancerProperties,
}

/// Properties of a load balancer.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerProperties {
    /// Frontends.
    #[serde(default, rename = "frontendIPConfigurations")]
    pub frontend_ip_configurations: Vec<FrontendIpConfiguration>,
    /// Backend pools (this project uses exactly one).
    #[serde(default)]
    pub backend_address_pools: Vec<BackendAddressPool>,
    /// One rule per port/protocol.
    #[serde(default)]
    pub load_balancing_rules: Vec<LoadBalancingRule>,
    /// Read-only provisioning state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_state: Option<String>,
}

/// A frontend IP configuration of a load balancer.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FrontendIpConfiguration {
    /// Full id (read-only; `{lb}/frontendIPConfigurations/{name}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Name, unique within the load balancer.
    pub name: String,
    /// Properties.
    #[serde(default)]
    pub properties: FrontendIpConfigurationProperties,
}

/// Properties of a frontend IP configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FrontendIpConfigurationProperties {
    /// The public IP address of this frontend.
    #[serde(
        default,
        rename = "publicIPAddress",
        skip_serializing_if = "Option::is_none"
    )]
    pub public_ip_address: Option<SubResource>,
}

/// A backend address pool of a load balancer.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendAddressPool {
    /// Full id (read-only; `{lb}/backendAddressPools/{name}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Name, unique within the load balancer.
    pub name: String,
}

/// Transport protocol of a load-balancing rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TransportProtocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// All protocols (HA ports).
    All,
}

/// A load-balancing rule.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancingRule {
    /// Full id (read-only; `{lb}/loadBalancingRules/{name}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Name, unique within the load balancer.
    pub name: String,
    /// Properties.
    pub properties: LoadBalancingRuleProperties,
}

/// Properties of a load-balancing rule.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancingRuleProperties {
    /// The frontend (id of a frontend IP configuration of the same load balancer).
    #[serde(rename = "frontendIPConfiguration")]
    pub frontend_ip_configuration: Option<SubResource>,
    /// The backend pool (id of a backend pool of the same load balancer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_address_pool: Option<SubResource>,
    /// `Tcp`, `Udp` or `All`.
    pub protocol: Option<TransportProtocol>,
    /// Frontend port (0 only with protocol `All`).
    pub frontend_port: u16,
    /// Backend port.
    #[serde(default)]
    pub backend_port: u16,
    /// Idle timeout in minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_in_minutes: Option<u32>,
    /// Floating IP (direct server return).
    #[serde(
        default,
        rename = "enableFloatingIP",
        skip_serializing_if = "Option::is_none"
    )]
    pub enable_floating_ip: Option<bool>,
    /// Whether outbound SNAT is disabled for this rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_outbound_snat: Option<bool>,
}

/// A `Microsoft.Network/natGateways` resource.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NatGateway {
    /// Full ARM id (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Name (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `Microsoft.Network/natGateways` (read-only).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub resource_type: Option<String>,
    /// Azure region (required on PUT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// SKU (`Standard`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sku: Option<Sku>,
    /// Properties.
    #[serde(default)]
    pub properties: NatGatewayProperties,
}

/// Properties of a NAT gateway.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NatGatewayProperties {
    /// Public IP addresses used for SNAT.
    #[serde(default, rename = "publicIpAddresses")]
    pub public_ip_addresses: Vec<SubResource>,
    /// Idle timeout in minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_in_minutes: Option<u32>,
    /// Read-only provisioning state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_state: Option<String>,
}

// ---------------------------------------------------------------------------------------------------
// Resource ids
// ---------------------------------------------------------------------------------------------------

/// The top-level resource types this project touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ResourceKind {
    /// `serviceGateways`.
    ServiceGateway,
    /// `publicIPAddresses`.
    PublicIpAddress,
    /// `loadBalancers`.
    LoadBalancer,
    /// `natGateways`.
    NatGateway,
}

impl ResourceKind {
    /// All kinds.
    pub const ALL: [ResourceKind; 4] = [
        Self::ServiceGateway,
        Self::PublicIpAddress,
        Self::LoadBalancer,
        Self::NatGateway,
    ];

    /// The path segment after `providers/Microsoft.Network/`, e.g. `loadBalancers`.
    pub fn segment(self) -> &'static str {
        match self {
            Self::ServiceGateway => "serviceGateways",
            Self::PublicIpAddress => "publicIPAddresses",
            Self::LoadBalancer => "loadBalancers",
            Self::NatGateway => "natGateways",
        }
    }

    /// The ARM `type`, e.g. `Microsoft.Network/loadBalancers`.
    pub fn arm_type(self) -> String {
        format!("{PROVIDER}/{}", self.segment())
    }

    /// The kind whose segment is `segment` (case-insensitive, as ARM).
    pub fn from_segment(segment: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.segment().eq_ignore_ascii_case(segment))
    }
}

/// A malformed ARM resource id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed resource id {id:?}: {reason}")]
pub struct ResourceIdError {
    /// The id as given.
    pub id: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// An ARM id `/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/{kind}/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceId {
    /// Subscription id.
    pub subscription: String,
    /// Resource group name.
    pub resource_group: String,
    /// Resource type.
    pub kind: ResourceKind,
    /// Resource name.
    pub name: String,
}

impl ResourceId {
    /// A resource id.
    pub fn new(
        subscription: impl Into<String>,
        resource_group: impl Into<String>,
        kind: ResourceKind,
        name: impl Into<String>,
    ) -> Self {
        Self {
            subscription: subscription.into(),
            resource_group: resource_group.into(),
            kind,
            name: name.into(),
        }
    }

    /// Parses a top-level id (segment names compared case-insensitively, as ARM).
    pub fn parse(id: &str) -> Result<Self, ResourceIdError> {
        let (rid, child) = Self::parse_with_child(id)?;
        match child {
            None => Ok(rid),
            Some(_) => Err(ResourceIdError {
                id: id.into(),
                reason: "expected a top-level resource, found a child resource",
            }),
        }
    }

    /// Parses an id that may name one child resource (`…/{kind}/{name}/{childType}/{childName}`),
    /// returning the parent and `(childType, childName)`.
    pub fn parse_with_child(id: &str) -> Result<(Self, Option<(String, String)>), ResourceIdError> {
        let err = |reason| ResourceIdError {
            id: id.into(),
            reason,
        };
        let rest = id
            .strip_prefix('/')
            .ok_or_else(|| err("must start with '/'"))?;
        let parts: Vec<&str> = rest.split('/').collect();
        if parts.len() != 8 && parts.len() != 10 {
            return Err(err("wrong number of path segments"));
        }
        if parts.iter().any(|p| p.is_empty()) {
            return Err(err("empty path segment"));
        }
        if !parts[0].eq_ignore_ascii_case("subscriptions")
            || !parts[2].eq_ignore_ascii_case("resourceGroups")
            || !parts[4].eq_ignore_ascii_case("providers")
            || !parts[5].eq_ignore_ascii_case(PROVIDER)
        {
            return Err(err(
                "expected /subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/…",
            ));
        }
        let kind =
            ResourceKind::from_segment(parts[6]).ok_or_else(|| err("unknown resource type"))?;
        let rid = Self::new(parts[1], parts[3], kind, parts[7]);
        let child = (parts.len() == 10).then(|| (parts[8].to_string(), parts[9].to_string()));
        Ok((rid, child))
    }

    /// The id as a path (no host, no query).
    pub fn path(&self) -> String {
        self.to_string()
    }

    /// The id of a child resource, e.g. `child("backendAddressPools", "pool")`.
    pub fn child(&self, child_type: &str, child_name: &str) -> String {
        format!("{self}/{child_type}/{child_name}")
    }

    /// Id of the backend pool `pool` of this load balancer.
    pub fn backend_pool_id(&self, pool: &str) -> String {
        self.child("backendAddressPools", pool)
    }

    /// Id of the frontend IP configuration `frontend` of this load balancer.
    pub fn frontend_ip_configuration_id(&self, frontend: &str) -> String {
        self.child("frontendIPConfigurations", frontend)
    }

    /// Full URL of this resource (optionally with a sub-path such as `updateServices`) under the ARM
    /// endpoint `base` (e.g. `https://management.azure.com` or the emulator's address), with the
    /// api-version query parameter.
    pub fn url(&self, base: &str, sub_path: Option<&str>) -> String {
        let base = base.trim_end_matches('/');
        match sub_path {
            Some(sub) => format!("{base}{self}/{sub}?api-version={API_VERSION}"),
            None => format!("{base}{self}?api-version={API_VERSION}"),
        }
    }
}

impl fmt::Display for ResourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "/subscriptions/{}/resourceGroups/{}/providers/{PROVIDER}/{}/{}",
            self.subscription,
            self.resource_group,
            self.kind.segment(),
            self.name
        )
    }
}

impl std::str::FromStr for ResourceId {
    type Err = ResourceIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_id_roundtrip() {
        let id = ResourceId::new("sub", "rg", ResourceKind::LoadBalancer, "lb1");
        let s = id.to_string();
        assert_eq!(
            s,
            "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/lb1"
        );
        assert_eq!(ResourceId::parse(&s).unwrap(), id);
        let pool = id.backend_pool_id("be");
        let (parent, child) = ResourceId::parse_with_child(&pool).unwrap();
        assert_eq!(parent, id);
        assert_eq!(child, Some(("backendAddressPools".into(), "be".into())));
        assert!(ResourceId::parse(&pool).is_err());
        assert!(ResourceId::parse("/subscriptions/s/resourceGroups/r/providers/X/y/z").is_err());
        assert!(ResourceId::parse("").is_err());
        let lower = s.to_ascii_lowercase();
        assert_eq!(
            ResourceId::parse(&lower).unwrap().kind,
            ResourceKind::LoadBalancer
        );
        assert_eq!(
            id.url("http://h:1/", Some("x")),
            format!("http://h:1{s}/x?api-version=2025-05-01")
        );
    }

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
