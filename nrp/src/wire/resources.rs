//! Wire types of the resources the service sagas create: public IP addresses, load balancers (frontend,
//! backend pool, load-balancing rules) and NAT gateways.

use serde::{Deserialize, Serialize};

use super::{IpVersion, LoadDistribution, Sku, SubResource};

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
    /// `IPv4` or `IPv6` (`IPVersion`; Azure takes IPv4 when absent, and answers with the field set).
    /// The family of the address Azure allocates, and so of every load balancer frontend on it: a
    /// public frontend (`frontendIPConfigurations[].properties.publicIPAddress`) has no version of
    /// its own in the spec (`privateIPAddressVersion` is the private frontend's).
    #[serde(
        default,
        rename = "publicIPAddressVersion",
        skip_serializing_if = "Option::is_none"
    )]
    pub public_ip_address_version: Option<IpVersion>,
    /// The allocated address (read-only).
    #[serde(default, rename = "ipAddress", skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
    /// Read-only provisioning state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_state: Option<String>,
    /// The DNS name of the address (`dnsSettings`): a `domainNameLabel` makes Azure publish
    /// `{label}.{region}.cloudapp.azure.com` (`fqdn`, read-only). Absent: no DNS name (a PUT
    /// without it removes a label the public IP had).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_settings: Option<PublicIpDnsSettings>,
    /// The IP configuration that uses the public IP (read-only, set by Azure on GET): for a load
    /// balancer's public frontend, the frontend IP configuration's id
    /// (`…/loadBalancers/{lb}/frontendIPConfigurations/{frontend}`). Absent: no IP configuration
    /// uses it.
    #[serde(
        default,
        rename = "ipConfiguration",
        skip_serializing_if = "Option::is_none"
    )]
    pub ip_configuration: Option<SubResource>,
    /// The NAT gateway that uses the public IP (`natGateway`, set by Azure on GET when one does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nat_gateway: Option<SubResource>,
}

impl PublicIpAddressProperties {
    /// The DNS label (`dnsSettings.domainNameLabel`), if any (an empty one is none).
    pub fn domain_name_label(&self) -> Option<&str> {
        self.dns_settings
            .as_ref()
            .and_then(|d| d.domain_name_label.as_deref())
            .filter(|l| !l.is_empty())
    }
}

/// `PublicIPAddressDnsSettings`: the DNS name of a public IP.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicIpDnsSettings {
    /// The label: `{label}.{region}.cloudapp.azure.com` resolves to the address. Lower-case letters,
    /// digits and hyphens, 3 to 63 characters, starting with a letter and ending with a letter or
    /// digit (`^[a-z][a-z0-9-]{1,61}[a-z0-9]$`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_name_label: Option<String>,
    /// The fully qualified name Azure made of the label (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fqdn: Option<String>,
    /// Every other field as NRP sent it (`reverseFqdn`, `domainNameLabelScope`, …).
    #[serde(flatten, default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub other: serde_json::Map<String, serde_json::Value>,
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
    /// Whether a TCP reset goes to both ends of a connection that idles out (`enableTcpReset`; a
    /// TCP rule's setting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_tcp_reset: Option<bool>,
    /// How new connections spread over the backends (`loadDistribution`; Azure's default is
    /// `Default`, a 5-tuple hash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_distribution: Option<LoadDistribution>,
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
    /// Every other top-level field as NRP sent it (`tags`, `zones`, `etag`, …), kept so that a
    /// read-modify-write of a NAT gateway clb does not own (a brought one) sends it back unchanged.
    #[serde(flatten, default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// Properties of a NAT gateway.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NatGatewayProperties {
    /// Public IP addresses used for SNAT (IPv4).
    #[serde(default, rename = "publicIpAddresses")]
    pub public_ip_addresses: Vec<SubResource>,
    /// IPv6 public IP addresses used for SNAT (`publicIpAddressesV6`): a `StandardV2` NAT
    /// gateway's only (a `Standard` one is IPv4-only), each a `StandardV2` IPv6 public IP.
    #[serde(
        default,
        rename = "publicIpAddressesV6",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub public_ip_addresses_v6: Vec<SubResource>,
    /// Idle timeout in minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_in_minutes: Option<u32>,
    /// The Service Gateway the NAT gateway is linked to (`serviceGateway: {id}`, a StandardV2 NAT
    /// gateway's link): what lets a Service Gateway's outbound service use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_gateway: Option<SubResource>,
    /// Read-only provisioning state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_state: Option<String>,
    /// Every other property as NRP sent it (`publicIpPrefixes`, `subnets`, …), kept for a
    /// read-modify-write.
    #[serde(flatten, default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub other: serde_json::Map<String, serde_json::Value>,
}
