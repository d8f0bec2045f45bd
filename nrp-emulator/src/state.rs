//! The emulated NRP state (gateways with their services and address locations; public IPs, load
//! balancers, NAT gateways), the mutations that change it, and its dump.
//!
//! Every mutation is checked completely before anything is changed, so a rejected call changes nothing.
//! The rules themselves live in [`crate::gateway`] and [`crate::resources`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::error::EmulatorError;
use clb_nrp::wire::{
    AddressLocation, GatewayAddress, LoadBalancer, NatGateway, PublicIpAddress, ResourceId,
    ResourceKind, RouteTargetAddress, ServiceGateway, ServiceType, Sku, SubResource,
};

/// Case-insensitive map key of a resource id (ARM ids are case-insensitive).
pub(crate) fn key_of(id: &ResourceId) -> String {
    id.to_string().to_ascii_lowercase()
}

/// Case-insensitive key of any id string.
pub(crate) fn key_str(id: &str) -> String {
    id.to_ascii_lowercase()
}

/// A service registered on a gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServiceRec {
    pub service_type: ServiceType,
    pub is_default: Option<bool>,
    pub backend_pools: Vec<String>,
    pub nat_gateway_id: Option<String>,
}

/// One service gateway.
#[derive(Debug, Clone)]
pub(crate) struct GatewayRec {
    pub id: ResourceId,
    pub location: String,
    pub tags: Option<BTreeMap<String, String>>,
    pub zones: Option<Vec<String>>,
    pub sku: Option<Sku>,
    pub virtual_network: Option<SubResource>,
    pub route_target_address: Option<RouteTargetAddress>,
    pub route_target_address_v6: Option<RouteTargetAddress>,
    pub resource_guid: String,
    /// The entity tag, `W/"…"`: a new one on every PUT and PATCH.
    pub etag: String,
    pub services: BTreeMap<String, ServiceRec>,
    /// location → address → service names.
    pub locations: BTreeMap<IpAddr, BTreeMap<IpAddr, BTreeSet<String>>>,
    /// service name → number of addresses that refer to it, IPv4 and IPv6 ([`family`]).
    pub refs: HashMap<String, [usize; 2]>,
}

/// Why an address lost service refs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemovalCause {
    /// An `updateAddressLocations` entry for the address dropped services or removed it (empty list).
    AddressUpdate,
    /// A location-level `FullUpdate` did not list the address.
    AddressOmittedByFullUpdate,
    /// The location was sent with an empty address list.
    LocationDeleted,
    /// A top-level `FullUpdate` did not list the location.
    LocationOmittedByFullUpdate,
    /// The gateway was deleted.
    GatewayDeleted,
}

/// One entry of the removal log: an address lost service refs (or was removed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removal {
    /// Sequence number (increasing, from 1).
    pub seq: u64,
    /// Gateway name.
    pub gateway: String,
    /// Location (node IP, canonical).
    pub location: String,
    /// Address (pod IP, canonical).
    pub address: String,
    /// The services the address lost.
    pub removed_services: Vec<String>,
    /// Whether the address itself is gone.
    pub address_removed: bool,
    /// Why.
    pub cause: RemovalCause,
}

/// A removal before it gets its sequence number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RemovalDraft {
    pub gateway: String,
    pub location: IpAddr,
    pub address: IpAddr,
    pub removed_services: Vec<String>,
    pub address_removed: bool,
    pub cause: RemovalCause,
}

/// The index of `ip`'s family in per-family counts: 0 for IPv4, 1 for IPv6.
pub(crate) fn family(ip: IpAddr) -> usize {
    usize::from(ip.is_ipv6())
}

impl GatewayRec {
    pub(crate) fn new(id: ResourceId, location: String, guid: String, etag: String) -> Self {
        Self {
            id,
            location,
            tags: None,
            zones: None,
            sku: None,
            virtual_network: None,
            route_target_address: None,
            route_target_address_v6: None,
            resource_guid: guid,
            etag,
            services: BTreeMap::new(),
            locations: BTreeMap::new(),
            refs: HashMap::new(),
        }
    }

    /// Sets the services of `address` at `location` (empty = remove the address; a location left
    /// without addresses is removed), keeping reference counts, and returns the removal, if any.
    pub(crate) fn set_address(
        &mut self,
        location: IpAddr,
        address: IpAddr,
        services: BTreeSet<String>,
        cause: RemovalCause,
    ) -> Option<RemovalDraft> {
        let f = family(address);
        let loc = self.locations.entry(location).or_default();
        // The reference counts and the removal are taken from the old set before the new one
        // replaces it (no copy of either).
        let mut removed = Vec::new();
        if let Some(old) = loc.get(&address) {
            for s in old.difference(&services) {
                if let Some(n) = self.refs.get_mut(s) {
                    n[f] = n[f].saturating_sub(1);
                    if *n == [0, 0] {
                        self.refs.remove(s);
                    }
                }
                removed.push(s.clone());
            }
        }
        let old = loc.get(&address);
        for s in services
            .iter()
            .filter(|s| !old.is_some_and(|o| o.contains(*s)))
        {
            match self.refs.get_mut(s) {
                Some(n) => n[f] += 1,
                None => {
                    let mut n = [0, 0];
                    n[f] = 1;
                    self.refs.insert(s.clone(), n);
                }
            }
        }
        let address_removed = services.is_empty();
        if address_removed {
            loc.remove(&address);
        } else {
            loc.insert(address, services);
        }
        if loc.is_empty() {
            self.locations.remove(&location);
        }
        (!removed.is_empty()).then(|| RemovalDraft {
            gateway: self.id.name.clone(),
            location,
            address,
            removed_services: removed,
            address_removed,
            cause,
        })
    }

    /// Removes a whole location.
    pub(crate) fn delete_location(
        &mut self,
        location: IpAddr,
        cause: RemovalCause,
    ) -> Vec<RemovalDraft> {
        let addrs: Vec<IpAddr> = self
            .locations
            .get(&location)
            .map(|m| m.keys().copied().collect())
            .unwrap_or_default();
        addrs
            .into_iter()
            .filter_map(|a| self.set_address(location, a, BTreeSet::new(), cause))
            .collect()
    }

    /// Number of addresses that refer to `service`.
    pub(crate) fn ref_count(&self, service: &str) -> usize {
        self.family_refs(service).iter().sum()
    }

    /// Number of IPv4 and of IPv6 addresses that refer to `service` (indexed by [`family`]).
    pub(crate) fn family_refs(&self, service: &str) -> [usize; 2] {
        self.refs.get(service).copied().unwrap_or_default()
    }

    pub(crate) fn to_wire(&self) -> ServiceGateway {
        ServiceGateway {
            id: Some(self.id.to_string()),
            name: Some(self.id.name.clone()),
            resource_type: Some(self.id.kind.arm_type()),
            location: Some(self.location.clone()),
            tags: self.tags.clone(),
            etag: Some(self.etag.clone()),
            sku: self.sku.clone(),
            zones: self.zones.clone(),
            properties: clb_nrp::wire::ServiceGatewayProperties {
                virtual_network: self.virtual_network.clone(),
                route_target_address: self.route_target_address.clone(),
                route_target_address_v6: self.route_target_address_v6.clone(),
                resource_guid: Some(self.resource_guid.clone()),
                provisioning_state: Some("Succeeded".into()),
            },
        }
    }

    pub(crate) fn location_to_wire(
        location: &IpAddr,
        addrs: &BTreeMap<IpAddr, BTreeSet<String>>,
    ) -> AddressLocation {
        AddressLocation {
            address_location: location.to_string(),
            addresses: addrs
                .iter()
                .map(|(a, s)| GatewayAddress {
                    address: a.to_string(),
                    services: s.iter().cloned().collect(),
                })
                .collect(),
        }
    }
}

/// The whole emulated NRP.
#[derive(Debug, Clone, Default)]
pub(crate) struct NrpState {
    pub gateways: BTreeMap<String, GatewayRec>,
    pub public_ips: BTreeMap<String, PublicIpAddress>,
    pub load_balancers: BTreeMap<String, LoadBalancer>,
    pub nat_gateways: BTreeMap<String, NatGateway>,
    /// The addresses of the public IPs.
    pub ip_pool: crate::resources::IpPool,
    pub next_serial: u64,
}

impl NrpState {
    /// A fresh serial number (for GUIDs).
    pub(crate) fn serial(&mut self) -> u64 {
        self.next_serial += 1;
        self.next_serial
    }

    /// A deterministic GUID-shaped string.
    pub(crate) fn guid(&mut self) -> String {
        let n = self.serial();
        format!("00000000-0000-4000-8000-{n:012x}")
    }

    /// Whether the resource `id` exists.
    pub(crate) fn exists(&self, id: &ResourceId) -> bool {
        let key = key_of(id);
        match id.kind {
            ResourceKind::ServiceGateway => self.gateways.contains_key(&key),
            ResourceKind::PublicIpAddress => self.public_ips.contains_key(&key),
            ResourceKind::LoadBalancer => self.load_balancers.contains_key(&key),
            ResourceKind::NatGateway => self.nat_gateways.contains_key(&key),
        }
    }

    /// A fresh weak entity tag, as NRP writes them: `W/"<guid>"`.
    pub(crate) fn etag(&mut self) -> String {
        format!("W/\"{}\"", self.guid())
    }

    pub(crate) fn dump(&self) -> Dump {
        Dump {
            gateways: self
                .gateways
                .values()
                .map(|g| GatewayDump {
                    id: g.id.to_string(),
                    name: g.id.name.clone(),
                    location: g.location.clone(),
                    services: g
                        .services
                        .iter()
                        .map(|(name, s)| ServiceDump {
                            name: name.clone(),
                            service_type: s.service_type.clone(),
                            backend_pools: s.backend_pools.clone(),
                            nat_gateway_id: s.nat_gateway_id.clone(),
                            address_count: g.ref_count(name),
                        })
                        .collect(),
                    address_locations: g
                        .locations
                        .iter()
                        .map(|(l, a)| GatewayRec::location_to_wire(l, a))
                        .collect(),
                })
                .collect(),
            public_ip_addresses: self.public_ips.values().cloned().collect(),
            load_balancers: self.load_balancers.values().cloned().collect(),
            nat_gateways: self.nat_gateways.values().cloned().collect(),
        }
    }
}

/// A not-found error for `id`.
pub(crate) fn not_found(id: &ResourceId) -> EmulatorError {
    EmulatorError::ResourceNotFound {
        kind: id.kind.arm_type(),
        name: id.name.clone(),
        resource_group: id.resource_group.clone(),
    }
}

/// The full emulated state, for tests and benchmarks (`GET /_emulator/dump`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dump {
    /// Service gateways.
    pub gateways: Vec<GatewayDump>,
    /// Public IP addresses.
    pub public_ip_addresses: Vec<PublicIpAddress>,
    /// Load balancers.
    pub load_balancers: Vec<LoadBalancer>,
    /// NAT gateways.
    pub nat_gateways: Vec<NatGateway>,
}

/// One gateway in a [`Dump`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayDump {
    /// Full ARM id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Azure region.
    pub location: String,
    /// Registered services, by name.
    pub services: Vec<ServiceDump>,
    /// Locations (sorted) → addresses (sorted) → services (sorted).
    pub address_locations: Vec<AddressLocation>,
}

/// One registered service in a [`GatewayDump`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceDump {
    /// Service name.
    pub name: String,
    /// Inbound / Outbound / InboundOutbound.
    pub service_type: ServiceType,
    /// Backend pool ids (inbound).
    pub backend_pools: Vec<String>,
    /// NAT gateway id (outbound).
    pub nat_gateway_id: Option<String>,
    /// Number of addresses that refer to the service.
    pub address_count: usize,
}

impl Dump {
    /// The gateway named `name` (case-insensitive).
    pub fn gateway(&self, name: &str) -> Option<&GatewayDump> {
        self.gateways
            .iter()
            .find(|g| g.name.eq_ignore_ascii_case(name))
    }
}

impl GatewayDump {
    /// Every address as `(location, address) → services`.
    pub fn address_map(&self) -> BTreeMap<(String, String), BTreeSet<String>> {
        self.address_locations
            .iter()
            .flat_map(|l| {
                l.addresses.iter().map(move |a| {
                    (
                        (l.address_location.clone(), a.address.clone()),
                        a.services.iter().cloned().collect(),
                    )
                })
            })
            .collect()
    }

    /// The names of the registered services.
    pub fn service_names(&self) -> BTreeSet<String> {
        self.services.iter().map(|s| s.name.clone()).collect()
    }
}
