//! Wire types of the Service Gateway REST API (`Microsoft.Network/serviceGateways`, api-versions
//! [`SUPPORTED_API_VERSIONS`]) and of the resources the service sagas create (public IP addresses, load
//! balancers, NAT gateways), plus ARM resource-id helpers.
//!
//! JSON field names are camelCase as ARM uses them (checked against `serviceGateway.json` of the
//! `2025-05-01` stable Network spec and the models of Microsoft's Python SDK `azure-mgmt-network`
//! 33.1.0, generated for `2026-03-01`). Both the ARM client and the NRP emulator use these types, so the
//! client is exercised against exactly the shapes the emulator accepts.
//!
//! Deserialisation is lenient where ARM is: unknown fields are ignored; every field the API marks
//! optional may be absent (lists default to empty, strings to empty); enum values this crate does not
//! know ([`ServiceType::Other`], [`UpdateAction::Other`]) are kept as they came, never an error, as ARM
//! asks of clients (Azure adds enum values without a new api-version). Semantic validation (IPs,
//! references, known enum values) is the server's job.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

mod ids;
mod resources;

pub use ids::{ResourceId, ResourceIdError, ResourceKind};
pub use resources::{
    BackendAddressPool, FrontendIpConfiguration, FrontendIpConfigurationProperties, LoadBalancer,
    LoadBalancerProperties, LoadBalancingRule, LoadBalancingRuleProperties, NatGateway,
    NatGatewayProperties, PublicIpAddress, PublicIpAddressProperties, PublicIpDnsSettings,
    TransportProtocol,
};

/// api-version `2025-05-01`: `updateServices` and `updateAddressLocations` are long-running
/// operations (`202` + `Location`, or `204`).
pub const API_VERSION_2025_05_01: &str = "2025-05-01";
/// api-version `2026-03-01`: `updateServices` and `updateAddressLocations` are synchronous (`200` with
/// a [`ActionOkResponse`] body), as since `2025-09-01`.
pub const API_VERSION_2026_03_01: &str = "2026-03-01";
/// The api-versions this project is tested against (the client and the emulator speak these).
pub const SUPPORTED_API_VERSIONS: [&str; 2] = [API_VERSION_2025_05_01, API_VERSION_2026_03_01];
/// The default api-version: the newest one the project is tested against.
pub const API_VERSION: &str = API_VERSION_2026_03_01;

/// One of the [`SUPPORTED_API_VERSIONS`], with what differs between them. The default is the newest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ApiVersion {
    /// `2025-05-01`.
    V2025_05_01,
    /// `2026-03-01`.
    #[default]
    V2026_03_01,
}

impl ApiVersion {
    /// Every supported version, oldest first.
    pub const ALL: [ApiVersion; 2] = [Self::V2025_05_01, Self::V2026_03_01];

    /// The version named `s` (exactly as ARM spells it), if supported.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// The query-parameter value, e.g. `2026-03-01`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V2025_05_01 => API_VERSION_2025_05_01,
            Self::V2026_03_01 => API_VERSION_2026_03_01,
        }
    }

    /// Whether `updateServices` / `updateAddressLocations` answer synchronously (`200` with a JSON
    /// body, since `2025-09-01`) rather than as long-running operations (`202` + `Location`, or `204`).
    pub fn actions_are_synchronous(self) -> bool {
        self >= Self::V2026_03_01
    }
}

impl std::fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// ARM resource provider namespace of every resource here.
pub const PROVIDER: &str = "Microsoft.Network";

/// Serialises an extensible enum as its wire string (`as_str`) and reads any string (`from_wire`).
macro_rules! string_enum_serde {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Ok(Self::from_wire(&s))
            }
        }
    };
}

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
/// of the spec, which share the same two values). An extensible enum: a value this crate does not know
/// is kept in [`UpdateAction::Other`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum UpdateAction {
    /// Replace everything in scope with the given list (what is not listed is removed).
    FullUpdate,
    /// Change only the listed entries.
    #[default]
    PartialUpdate,
    /// A value this crate does not know, as it came.
    Other(String),
}

impl UpdateAction {
    /// The wire value.
    pub fn as_str(&self) -> &str {
        match self {
            Self::FullUpdate => "FullUpdate",
            Self::PartialUpdate => "PartialUpdate",
            Self::Other(s) => s,
        }
    }

    /// The action named `s` (known values compared case-insensitively, as the SDKs do).
    pub fn from_wire(s: &str) -> Self {
        if s.eq_ignore_ascii_case("FullUpdate") {
            Self::FullUpdate
        } else if s.eq_ignore_ascii_case("PartialUpdate") {
            Self::PartialUpdate
        } else {
            Self::Other(s.to_string())
        }
    }
}

string_enum_serde!(UpdateAction);

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
    /// Resource tags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<BTreeMap<String, String>>,
    /// Entity tag (read-only): changes whenever the resource is updated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// SKU (`Standard`/`Regional`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sku: Option<Sku>,
    /// Availability zones (`"1"`, `"2"`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zones: Option<Vec<String>>,
    /// Properties.
    #[serde(default)]
    pub properties: ServiceGatewayProperties,
}

/// `RouteTargetAddressPropertiesFormat`: a route target address of a service gateway.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteTargetAddress {
    /// The subnet of the address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<SubResource>,
    /// The private IPv4 or IPv6 address.
    #[serde(
        default,
        rename = "privateIPAddress",
        skip_serializing_if = "Option::is_none"
    )]
    pub private_ip_address: Option<String>,
    /// `Static` or `Dynamic`.
    #[serde(
        default,
        rename = "privateIPAllocationMethod",
        skip_serializing_if = "Option::is_none"
    )]
    pub private_ip_allocation_method: Option<String>,
}

/// `TagsObject`: the body of `PATCH …/serviceGateways/{name}` (update tags).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TagsObject {
    /// The new tags (replace the old ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<BTreeMap<String, String>>,
}

/// `ServiceGatewayActionOkResponseBody`: the `200` body of `updateServices` and
/// `updateAddressLocations` since api-version `2025-09-01` (`{}` in the published examples).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ActionOkResponse {
    /// The status of the operation (read-only, optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// `ServiceGatewayPropertiesFormat`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceGatewayProperties {
    /// The virtual network the gateway lives in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_network: Option<SubResource>,
    /// The IPv4 route target address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_target_address: Option<RouteTargetAddress>,
    /// The IPv6 route target address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_target_address_v6: Option<RouteTargetAddress>,
    /// Read-only GUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_guid: Option<String>,
    /// Read-only provisioning state, e.g. `Succeeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_state: Option<String>,
}

/// Kind of a gateway service. An extensible enum: a value this crate does not know is kept in
/// [`ServiceType::Other`] (neither inbound nor outbound), never a parse error.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ServiceType {
    /// Inbound: a load balancer backend pool.
    Inbound,
    /// Outbound: a NAT gateway.
    Outbound,
    /// Both.
    InboundOutbound,
    /// A value this crate does not know, as it came.
    Other(String),
}

impl ServiceType {
    /// Whether the service carries inbound traffic (needs a backend pool).
    pub fn is_inbound(&self) -> bool {
        matches!(self, Self::Inbound | Self::InboundOutbound)
    }
    /// Whether the service carries outbound traffic (needs a NAT gateway).
    pub fn is_outbound(&self) -> bool {
        matches!(self, Self::Outbound | Self::InboundOutbound)
    }

    /// The wire value.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Inbound => "Inbound",
            Self::Outbound => "Outbound",
            Self::InboundOutbound => "InboundOutbound",
            Self::Other(s) => s,
        }
    }

    /// The type named `s` (known values compared case-insensitively, as the SDKs do).
    pub fn from_wire(s: &str) -> Self {
        [Self::Inbound, Self::Outbound, Self::InboundOutbound]
            .into_iter()
            .find(|t| t.as_str().eq_ignore_ascii_case(s))
            .unwrap_or_else(|| Self::Other(s.to_string()))
    }
}

string_enum_serde!(ServiceType);

/// `LoadDistribution` of a load-balancing rule (`loadBalancer.json`): how new connections spread
/// over the backends. An extensible enum (`modelAsString`): a value this crate does not know is kept
/// in [`LoadDistribution::Other`], never a parse error; the server refuses it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LoadDistribution {
    /// `Default`: a hash of the 5-tuple (source IP and port, destination IP and port, protocol).
    Default,
    /// `SourceIP`: a hash of (source IP, destination IP): every connection of a client reaches the
    /// same backend.
    SourceIp,
    /// `SourceIPProtocol`: a hash of (source IP, destination IP, protocol).
    SourceIpProtocol,
    /// A value this crate does not know, as it came.
    Other(String),
}

impl LoadDistribution {
    /// The wire value.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Default => "Default",
            Self::SourceIp => "SourceIP",
            Self::SourceIpProtocol => "SourceIPProtocol",
            Self::Other(s) => s,
        }
    }

    /// The value named `s` (known values compared case-insensitively, as the SDKs do).
    pub fn from_wire(s: &str) -> Self {
        [Self::Default, Self::SourceIp, Self::SourceIpProtocol]
            .into_iter()
            .find(|d| d.as_str().eq_ignore_ascii_case(s))
            .unwrap_or_else(|| Self::Other(s.to_string()))
    }
}

string_enum_serde!(LoadDistribution);

impl std::fmt::Display for LoadDistribution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `IPVersion` of the Network spec (`network.json`): `publicIPAddressVersion` of a public IP address
/// (`publicIpAddress.json`; IPv4 when absent). An extensible enum (`modelAsString`): a value this
/// crate does not know is kept in [`IpVersion::Other`], never a parse error; the server refuses it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum IpVersion {
    /// `IPv4`.
    V4,
    /// `IPv6`.
    V6,
    /// A value this crate does not know, as it came.
    Other(String),
}

impl IpVersion {
    /// The wire value.
    pub fn as_str(&self) -> &str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
            Self::Other(s) => s,
        }
    }

    /// The version named `s` (known values compared case-insensitively, as the SDKs do).
    pub fn from_wire(s: &str) -> Self {
        [Self::V4, Self::V6]
            .into_iter()
            .find(|v| v.as_str().eq_ignore_ascii_case(s))
            .unwrap_or_else(|| Self::Other(s.to_string()))
    }

    /// The version of `ip`.
    pub fn of(ip: std::net::IpAddr) -> Self {
        if ip.is_ipv6() { Self::V6 } else { Self::V4 }
    }
}

impl From<&str> for IpVersion {
    fn from(s: &str) -> Self {
        Self::from_wire(s)
    }
}

impl std::fmt::Display for IpVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

string_enum_serde!(IpVersion);

/// `ServiceGatewayService`: one service registered on a gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayService {
    /// Service name (the identity: a Service UID or an egress name). Optional on the wire: absent
    /// reads as empty.
    #[serde(default)]
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
    /// The address (IPv4 or IPv6). Optional on the wire: absent reads as empty.
    #[serde(default)]
    pub address: String,
    /// Service names; empty in an update removes the address.
    #[serde(default)]
    pub services: Vec<String>,
}

/// `ServiceGatewayAddressLocation`: one location (node IP) of an update request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddressLocationUpdate {
    /// The location (node IP). Optional on the wire: absent reads as empty.
    #[serde(default)]
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
    /// The location (node IP). Optional on the wire: absent reads as empty.
    #[serde(default)]
    pub address_location: String,
    /// Its addresses.
    #[serde(default)]
    pub addresses: Vec<GatewayAddress>,
}

/// A page of `GET …/serviceGateways/{name}/addressLocations`.
pub type AddressLocationsPage = Page<AddressLocation>;
/// A page of `GET …/serviceGateways` (a resource group's or a subscription's gateways).
pub type ServiceGatewaysPage = Page<ServiceGateway>;
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

    #[test]
    fn rule_settings_and_dns_settings_use_arm_field_names() {
        let rule: LoadBalancingRuleProperties = serde_json::from_str(
            r#"{"protocol":"Tcp","frontendPort":80,"backendPort":80,"idleTimeoutInMinutes":10,
            "enableTcpReset":true,"enableFloatingIP":false,"loadDistribution":"sourceip"}"#,
        )
        .unwrap();
        assert_eq!(rule.enable_tcp_reset, Some(true));
        assert_eq!(rule.load_distribution, Some(LoadDistribution::SourceIp));
        let v = serde_json::to_value(&rule).unwrap();
        assert_eq!(v["loadDistribution"], "SourceIP");
        assert_eq!(v["enableTcpReset"], true);
        assert_eq!(v["enableFloatingIP"], false);
        let other: LoadDistribution = serde_json::from_str(r#""Sticky""#).unwrap();
        assert_eq!(other, LoadDistribution::Other("Sticky".into()));
        assert_eq!(serde_json::to_value(&other).unwrap(), "Sticky");
        assert_eq!(
            LoadDistribution::from_wire("SOURCEIPPROTOCOL").as_str(),
            "SourceIPProtocol"
        );

        let pip: PublicIpAddress = serde_json::from_str(
            r#"{"properties":{"dnsSettings":{"domainNameLabel":"shop","fqdn":"shop.eastus.cloudapp.azure.com",
            "domainNameLabelScope":"TenantReuse"},"ipConfiguration":{"id":"/f"},"natGateway":{"id":"/n"}}}"#,
        )
        .unwrap();
        assert_eq!(pip.properties.domain_name_label(), Some("shop"));
        assert_eq!(
            pip.properties.ip_configuration,
            Some(SubResource::new("/f"))
        );
        assert_eq!(pip.properties.nat_gateway, Some(SubResource::new("/n")));
        let v = serde_json::to_value(&pip).unwrap();
        assert_eq!(
            v["properties"]["dnsSettings"]["fqdn"],
            "shop.eastus.cloudapp.azure.com"
        );
        assert_eq!(
            v["properties"]["dnsSettings"]["domainNameLabelScope"], "TenantReuse",
            "kept"
        );
        let none: PublicIpAddress =
            serde_json::from_str(r#"{"properties":{"dnsSettings":{"domainNameLabel":""}}}"#)
                .unwrap();
        assert_eq!(none.properties.domain_name_label(), None);
        let bare = serde_json::to_value(PublicIpAddress::default()).unwrap();
        assert!(bare["properties"].get("dnsSettings").is_none());
    }

    #[test]
    fn public_ip_versions_are_read_leniently_and_written_as_arm_spells_them() {
        let pip: PublicIpAddress = serde_json::from_str(
            r#"{"location":"x","properties":{"publicIPAddressVersion":"ipv6",
            "publicIPAllocationMethod":"Static","ipAddress":"2001:db8:c1b::1"}}"#,
        )
        .unwrap();
        assert_eq!(
            pip.properties.public_ip_address_version,
            Some(IpVersion::V6)
        );
        let v = serde_json::to_value(&pip).unwrap();
        assert_eq!(v["properties"]["publicIPAddressVersion"], "IPv6");
        let other: PublicIpAddress =
            serde_json::from_str(r#"{"properties":{"publicIPAddressVersion":"IPv7"}}"#).unwrap();
        assert_eq!(
            other.properties.public_ip_address_version,
            Some(IpVersion::Other("IPv7".into()))
        );
        assert_eq!(
            serde_json::to_value(&other).unwrap()["properties"]["publicIPAddressVersion"],
            "IPv7"
        );
        let absent: PublicIpAddress = serde_json::from_str(r#"{"properties":{}}"#).unwrap();
        assert_eq!(absent.properties.public_ip_address_version, None);
        assert_eq!(IpVersion::from("IPv4"), IpVersion::V4);
        assert_eq!(IpVersion::of("::1".parse().unwrap()), IpVersion::V6);
    }
}
