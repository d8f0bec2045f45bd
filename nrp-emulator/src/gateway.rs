//! Rules of the service gateway API: the gateway resource, `updateServices`, `updateAddressLocations`,
//! and the paged listings.
//!
//! Requests are first normalised without looking at the state ([`normalize_services`],
//! [`normalize_locations`]: IP syntax, duplicates, required fields), then checked against the state, then
//! applied. A rejected request changes nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use crate::error::EmulatorError;
use crate::state::{
    GatewayRec, NrpState, RemovalCause, RemovalDraft, ServiceRec, family, key_of, key_str,
    not_found,
};
use clb_nrp::wire::{
    AddressLocation, GatewayService, GatewayServiceProperties, IpVersion, ResourceId, ResourceKind,
    ServiceGateway, ServiceType, SubResource, TagsObject, UpdateAction,
    UpdateAddressLocationsRequest, UpdateServicesRequest,
};

/// A validated `updateServices` request: service name → new record (`None` = delete).
#[derive(Debug, Clone)]
pub(crate) struct NormServices {
    pub action: UpdateAction,
    pub requests: Vec<(String, Option<ServiceRec>)>,
}

/// A validated location of an `updateAddressLocations` request.
#[derive(Debug, Clone)]
pub(crate) struct NormLocation {
    pub location: IpAddr,
    pub action: UpdateAction,
    pub addresses: Vec<(IpAddr, BTreeSet<String>)>,
}

/// A validated `updateAddressLocations` request.
#[derive(Debug, Clone)]
pub(crate) struct NormLocations {
    pub action: UpdateAction,
    pub locations: Vec<NormLocation>,
}

impl NormLocations {
    /// Number of addresses carried.
    pub(crate) fn address_count(&self) -> usize {
        self.locations.iter().map(|l| l.addresses.len()).sum()
    }
}

fn parse_ip(what: &'static str, code: &'static str, s: &str) -> Result<IpAddr, EmulatorError> {
    s.trim().parse::<IpAddr>().map_err(|_| {
        EmulatorError::bad_request(
            code,
            format!("{what} '{s}' is not a valid IPv4 or IPv6 address"),
        )
    })
}

fn check_service_name(name: &str) -> Result<(), EmulatorError> {
    if name.is_empty() || name.len() > 256 || name.chars().any(|c| c.is_control()) {
        return Err(EmulatorError::bad_request(
            "InvalidServiceName",
            format!("service name {name:?} is invalid: it must have 1 to 256 printable characters"),
        ));
    }
    Ok(())
}

/// Checks that `action` (the value of `field`) is one the API defines.
fn check_action(field: &str, action: &UpdateAction, scope: &str) -> Result<(), EmulatorError> {
    match action {
        UpdateAction::Other(v) => Err(EmulatorError::bad_request(
            "InvalidUpdateAction",
            format!("{field} '{v}'{scope} is invalid: it must be FullUpdate or PartialUpdate"),
        )),
        _ => Ok(()),
    }
}

/// Validates an `updateServices` body without looking at the state.
pub(crate) fn normalize_services(
    req: UpdateServicesRequest,
) -> Result<NormServices, EmulatorError> {
    check_action("action", &req.action, "")?;
    let mut seen = HashSet::new();
    let mut requests = Vec::with_capacity(req.service_requests.len());
    for r in req.service_requests {
        let GatewayService { name, properties } = r.service;
        check_service_name(&name)?;
        if !seen.insert(name.clone()) {
            return Err(EmulatorError::bad_request(
                "DuplicateServicesInRequest",
                format!("service '{name}' appears more than once in the request"),
            ));
        }
        if r.is_delete {
            requests.push((name, None));
            continue;
        }
        let GatewayServiceProperties {
            service_type,
            is_default,
            load_balancer_backend_pools,
            public_nat_gateway_id,
        } = properties;
        let Some(service_type) = service_type else {
            return Err(EmulatorError::bad_request(
                "MissingServiceType",
                format!(
                    "service '{name}' has no serviceType (Inbound, Outbound or InboundOutbound)"
                ),
            ));
        };
        if let ServiceType::Other(v) = &service_type {
            return Err(EmulatorError::bad_request(
                "InvalidServiceType",
                format!(
                    "serviceType '{v}' of service '{name}' is invalid: it must be Inbound, Outbound \
                     or InboundOutbound"
                ),
            ));
        }
        if service_type.is_inbound() && load_balancer_backend_pools.is_empty() {
            return Err(EmulatorError::bad_request(
                "MissingLoadBalancerBackendPool",
                format!(
                    "inbound service '{name}' must name at least one loadBalancerBackendPools id"
                ),
            ));
        }
        if service_type.is_outbound() && public_nat_gateway_id.is_none() {
            return Err(EmulatorError::bad_request(
                "MissingPublicNatGatewayId",
                format!("outbound service '{name}' must name a publicNatGatewayId"),
            ));
        }
        for pool in &load_balancer_backend_pools {
            match ResourceId::parse_with_child(&pool.id) {
                Ok((lb, Some((child, _))))
                    if lb.kind == ResourceKind::LoadBalancer
                        && child.eq_ignore_ascii_case("backendAddressPools") => {}
                _ => {
                    return Err(EmulatorError::bad_request(
                        "InvalidResourceReference",
                        format!(
                            "service '{name}': '{}' is not a load balancer backend pool id \
                             (…/loadBalancers/{{lb}}/backendAddressPools/{{pool}})",
                            pool.id
                        ),
                    ));
                }
            }
        }
        if let Some(nat) = &public_nat_gateway_id {
            match ResourceId::parse(nat) {
                Ok(id) if id.kind == ResourceKind::NatGateway => {}
                _ => {
                    return Err(EmulatorError::bad_request(
                        "InvalidResourceReference",
                        format!("service '{name}': '{nat}' is not a NAT gateway id"),
                    ));
                }
            }
        }
        let rec = ServiceRec {
            service_type,
            is_default,
            backend_pools: load_balancer_backend_pools
                .into_iter()
                .map(|p| p.id)
                .collect(),
            nat_gateway_id: public_nat_gateway_id,
        };
        requests.push((name, Some(rec)));
    }
    Ok(NormServices {
        action: req.action,
        requests,
    })
}

/// Validates an `updateAddressLocations` body without looking at the state.
pub(crate) fn normalize_locations(
    req: UpdateAddressLocationsRequest,
) -> Result<NormLocations, EmulatorError> {
    check_action("action", &req.action, "")?;
    let mut seen = HashSet::new();
    let mut locations = Vec::with_capacity(req.address_locations.len());
    for l in req.address_locations {
        let location = parse_ip(
            "address location",
            "InvalidAddressLocation",
            &l.address_location,
        )?;
        check_action(
            "addressUpdateAction",
            &l.address_update_action,
            &format!(" of address location '{location}'"),
        )?;
        if !seen.insert(location) {
            return Err(EmulatorError::bad_request(
                "DuplicateLocationsInRequest",
                format!("address location '{location}' appears more than once in the request"),
            ));
        }
        let mut seen_addr = HashSet::new();
        let mut addresses = Vec::with_capacity(l.addresses.len());
        for a in l.addresses {
            let address = parse_ip("address", "InvalidAddress", &a.address)?;
            if address.is_ipv4() != location.is_ipv4() {
                return Err(EmulatorError::bad_request(
                    "AddressFamilyMismatch",
                    format!(
                        "address '{address}' and its location '{location}' are of different IP families"
                    ),
                ));
            }
            if !seen_addr.insert(address) {
                return Err(EmulatorError::bad_request(
                    "DuplicateAddressesInRequest",
                    format!("address '{address}' appears more than once in location '{location}'"),
                ));
            }
            for s in &a.services {
                check_service_name(s)?;
            }
            addresses.push((address, a.services.into_iter().collect()));
        }
        locations.push(NormLocation {
            location,
            action: l.address_update_action,
            addresses,
        });
    }
    Ok(NormLocations {
        action: req.action,
        locations,
    })
}

impl NrpState {
    /// The gateway `id`, if it exists.
    pub(crate) fn gateway(&self, id: &ResourceId) -> Option<&GatewayRec> {
        self.gateways.get(&key_of(id))
    }

    pub(crate) fn gateway_or_err(
        &self,
        id: &ResourceId,
        auto_create: bool,
    ) -> Result<Option<&GatewayRec>, EmulatorError> {
        match self.gateway(id) {
            Some(g) => Ok(Some(g)),
            None if auto_create => Ok(None),
            None => Err(not_found(id)),
        }
    }

    /// The gateway `id`, created on the spot (location `local`) when it is missing and `auto_create`.
    fn gateway_mut(
        &mut self,
        id: &ResourceId,
        auto_create: bool,
    ) -> Result<&mut GatewayRec, EmulatorError> {
        let key = key_of(id);
        if !self.gateways.contains_key(&key) {
            if !auto_create {
                return Err(not_found(id));
            }
            let guid = self.guid();
            let etag = self.etag();
            self.gateways.insert(
                key.clone(),
                GatewayRec::new(id.clone(), "local".into(), guid, etag),
            );
        }
        self.gateways
            .get_mut(&key)
            .ok_or_else(|| EmulatorError::Internal("gateway vanished".into()))
    }

    /// `PUT …/serviceGateways/{name}`: returns whether it was created, and the resource.
    pub(crate) fn put_gateway(
        &mut self,
        id: &ResourceId,
        body: ServiceGateway,
    ) -> Result<(bool, ServiceGateway), EmulatorError> {
        self.check_put_gateway(id, &body)?;
        let location = body.location.unwrap_or_default();
        let created = self.gateway(id).is_none();
        let etag = self.etag();
        if created {
            let guid = self.guid();
            self.gateways.insert(
                key_of(id),
                GatewayRec::new(id.clone(), location.clone(), guid, etag.clone()),
            );
        }
        // A PUT replaces what it may set (read-only fields in the body are ignored, as in ARM); the
        // services and address locations are not part of the resource and stay.
        let g = self.gateway_mut(id, true)?;
        if g.location == "local" {
            // Created on first use (auto-creation): the first PUT gives it its region.
            g.location = location;
        }
        g.etag = etag;
        g.tags = body.tags;
        g.zones = body.zones;
        g.sku = body.sku;
        g.virtual_network = body.properties.virtual_network;
        g.route_target_address = body.properties.route_target_address;
        g.route_target_address_v6 = body.properties.route_target_address_v6;
        Ok((created, g.to_wire()))
    }

    /// `PATCH …/serviceGateways/{name}` (update tags): replaces the tags, returns the resource.
    pub(crate) fn update_gateway_tags(
        &mut self,
        id: &ResourceId,
        auto_create: bool,
        body: TagsObject,
    ) -> Result<ServiceGateway, EmulatorError> {
        let etag = self.etag();
        let g = self.gateway_mut(id, auto_create)?;
        g.tags = body.tags;
        g.etag = etag;
        Ok(g.to_wire())
    }

    /// `GET …/serviceGateways` of a resource group (`resource_group`) or of the whole subscription
    /// (`None`): one page after `after` (a lower-cased `name`, or `resourceGroup/name` for the
    /// subscription), by resource group and name, and the token of the next page.
    pub(crate) fn list_gateways(
        &self,
        subscription: &str,
        resource_group: Option<&str>,
        after: Option<&str>,
        page: usize,
    ) -> (Vec<ServiceGateway>, Option<String>) {
        let sub = subscription.to_ascii_lowercase();
        let rg = resource_group.map(str::to_ascii_lowercase);
        // The token of a gateway: its name within a resource group, `rg/name` across them.
        let token = |g: &GatewayRec| {
            let name = g.id.name.to_ascii_lowercase();
            match rg {
                Some(_) => name,
                None => format!("{}/{name}", g.id.resource_group.to_ascii_lowercase()),
            }
        };
        let after = after.map(str::to_ascii_lowercase);
        let mut matching: Vec<(String, &GatewayRec)> = self
            .gateways
            .values()
            .filter(|g| g.id.subscription.eq_ignore_ascii_case(&sub))
            .filter(|g| {
                rg.as_deref()
                    .is_none_or(|rg| g.id.resource_group.eq_ignore_ascii_case(rg))
            })
            .map(|g| (token(g), g))
            .filter(|(t, _)| after.as_deref().is_none_or(|a| t.as_str() > a))
            .collect();
        matching.sort_by(|a, b| a.0.cmp(&b.0));
        let page = page.max(1);
        let next = (matching.len() > page).then(|| matching[page - 1].0.clone());
        let items = matching
            .into_iter()
            .take(page)
            .map(|(_, g)| g.to_wire())
            .collect();
        (items, next)
    }

    pub(crate) fn check_put_gateway(
        &self,
        id: &ResourceId,
        body: &ServiceGateway,
    ) -> Result<(), EmulatorError> {
        let Some(location) = body.location.as_deref().filter(|l| !l.trim().is_empty()) else {
            return Err(EmulatorError::bad_request(
                "LocationRequired",
                format!("service gateway '{}' needs a location", id.name),
            ));
        };
        for z in body.zones.iter().flatten() {
            if z.is_empty() || z.len() > 2 || !z.chars().all(|c| c.is_ascii_digit()) {
                return Err(EmulatorError::bad_request(
                    "InvalidAvailabilityZone",
                    format!(
                        "zone '{z}' of service gateway '{}' is invalid: zones are numeric strings \
                         such as \"1\", \"2\", \"3\"",
                        id.name
                    ),
                ));
            }
        }
        if let Some(g) = self.gateway(id)
            && !g.location.eq_ignore_ascii_case(location)
            && g.location != "local"
        {
            return Err(EmulatorError::bad_request(
                "InvalidResourceLocation",
                format!(
                    "service gateway '{}' exists in location '{}' and cannot be moved to '{location}'",
                    id.name, g.location
                ),
            ));
        }
        Ok(())
    }

    /// `GET …/serviceGateways/{name}`.
    pub(crate) fn get_gateway(
        &mut self,
        id: &ResourceId,
        auto_create: bool,
    ) -> Result<ServiceGateway, EmulatorError> {
        Ok(self.gateway_mut(id, auto_create)?.to_wire())
    }

    /// `DELETE …/serviceGateways/{name}`: whether it existed, and the removals.
    pub(crate) fn delete_gateway(&mut self, id: &ResourceId) -> (bool, Vec<RemovalDraft>) {
        let Some(mut g) = self.gateways.remove(&key_of(id)) else {
            return (false, Vec::new());
        };
        let locs: Vec<IpAddr> = g.locations.keys().copied().collect();
        let removals = locs
            .into_iter()
            .flat_map(|l| g.delete_location(l, RemovalCause::GatewayDeleted))
            .collect();
        (true, removals)
    }

    /// `GET …/services`: one page after `after` (a service name).
    pub(crate) fn list_services(
        &mut self,
        id: &ResourceId,
        auto_create: bool,
        after: Option<&str>,
        page: usize,
    ) -> Result<(Vec<GatewayService>, Option<String>), EmulatorError> {
        use std::ops::Bound::{Excluded, Unbounded};
        let g = self.gateway_mut(id, auto_create)?;
        let lower = after.map_or(Unbounded, Excluded);
        let mut it = g.services.range::<str, _>((lower, Unbounded));
        let items: Vec<GatewayService> = it
            .by_ref()
            .take(page)
            .map(|(name, s)| GatewayService {
                name: name.clone(),
                properties: GatewayServiceProperties {
                    service_type: Some(s.service_type.clone()),
                    is_default: s.is_default,
                    load_balancer_backend_pools: s
                        .backend_pools
                        .iter()
                        .map(SubResource::new)
                        .collect(),
                    public_nat_gateway_id: s.nat_gateway_id.clone(),
                },
            })
            .collect();
        let next = if it.next().is_some() {
            items.last().map(|s| s.name.clone())
        } else {
            None
        };
        Ok((items, next))
    }

    /// `GET …/addressLocations`: one page after `after` (a location).
    pub(crate) fn list_locations(
        &mut self,
        id: &ResourceId,
        auto_create: bool,
        after: Option<IpAddr>,
        page: usize,
    ) -> Result<(Vec<AddressLocation>, Option<IpAddr>), EmulatorError> {
        use std::ops::Bound::{Excluded, Unbounded};
        let g = self.gateway_mut(id, auto_create)?;
        let lower = after.map_or(Unbounded, Excluded);
        let mut it = g.locations.range((lower, Unbounded));
        let items: Vec<AddressLocation> = it
            .by_ref()
            .take(page)
            .map(|(l, a)| GatewayRec::location_to_wire(l, a))
            .collect();
        let next = if it.next().is_some() {
            items.last().and_then(|l| l.address_location.parse().ok())
        } else {
            None
        };
        Ok((items, next))
    }

    /// Checks a normalised `updateServices` request against the state.
    pub(crate) fn check_services(
        &self,
        id: &ResourceId,
        auto_create: bool,
        req: &NormServices,
    ) -> Result<(), EmulatorError> {
        let g = self.gateway_or_err(id, auto_create)?;
        let gw_name = &id.name;
        let mut deletes: Vec<&str> = req
            .requests
            .iter()
            .filter(|(_, r)| r.is_none())
            .map(|(n, _)| n.as_str())
            .collect();
        if req.action == UpdateAction::FullUpdate
            && let Some(g) = g
        {
            let listed: HashSet<&str> = req.requests.iter().map(|(n, _)| n.as_str()).collect();
            deletes.extend(
                g.services
                    .keys()
                    .map(String::as_str)
                    .filter(|n| !listed.contains(n)),
            );
        }
        if let Some(g) = g {
            for name in deletes {
                let n = g.ref_count(name);
                if n > 0 {
                    return Err(EmulatorError::bad_request(
                        "ServiceWithOverlayMappingsCannotBeDeleted",
                        format!(
                            "service '{name}' cannot be deleted from service gateway '{gw_name}': \
                             {n} address(es) still refer to it"
                        ),
                    ));
                }
            }
        }
        for (name, rec) in &req.requests {
            let Some(rec) = rec else { continue };
            for pool in &rec.backend_pools {
                self.check_backend_pool(name, pool)?;
            }
            if let Some(nat) = &rec.nat_gateway_id
                && !self.nat_gateways.contains_key(&key_str(nat))
            {
                return Err(EmulatorError::bad_request(
                    "InvalidResourceReference",
                    format!("service '{name}': NAT gateway '{nat}' does not exist"),
                ));
            }
            if let Some(nat) = &rec.nat_gateway_id {
                self.check_nat_gateway_registration(id, name, nat)?;
            }
        }
        Ok(())
    }

    fn check_backend_pool(&self, service: &str, pool_id: &str) -> Result<(), EmulatorError> {
        let bad = |what: String| {
            EmulatorError::bad_request(
                "InvalidResourceReference",
                format!("service '{service}': {what}"),
            )
        };
        let Ok((lb_id, Some((_, pool)))) = ResourceId::parse_with_child(pool_id) else {
            return Err(bad(format!("'{pool_id}' is not a backend pool id")));
        };
        let Some(lb) = self.load_balancers.get(&key_of(&lb_id)) else {
            return Err(bad(format!("load balancer '{lb_id}' does not exist")));
        };
        if !lb
            .properties
            .backend_address_pools
            .iter()
            .any(|p| p.name.eq_ignore_ascii_case(&pool))
        {
            return Err(bad(format!(
                "load balancer '{}' has no backend pool '{pool}'",
                lb_id.name
            )));
        }
        Ok(())
    }

    /// Applies a normalised `updateServices` request (checked first).
    pub(crate) fn update_services(
        &mut self,
        id: &ResourceId,
        auto_create: bool,
        req: NormServices,
    ) -> Result<(), EmulatorError> {
        self.check_services(id, auto_create, &req)?;
        let g = self.gateway_mut(id, auto_create)?;
        if req.action == UpdateAction::FullUpdate {
            let listed: HashSet<&str> = req.requests.iter().map(|(n, _)| n.as_str()).collect();
            g.services.retain(|n, _| listed.contains(n.as_str()));
        }
        for (name, rec) in req.requests {
            match rec {
                Some(rec) => {
                    g.services.insert(name, rec);
                }
                None => {
                    g.services.remove(&name);
                }
            }
        }
        Ok(())
    }

    /// Checks a normalised `updateAddressLocations` request against the state.
    pub(crate) fn check_locations(
        &self,
        id: &ResourceId,
        auto_create: bool,
        single_ip_version_pools: bool,
        req: &NormLocations,
    ) -> Result<(), EmulatorError> {
        let g = self.gateway_or_err(id, auto_create)?;
        for l in &req.locations {
            for (addr, services) in &l.addresses {
                for s in services {
                    if !g.is_some_and(|g| g.services.contains_key(s)) {
                        return Err(EmulatorError::bad_request(
                            "ServiceNotRegistered",
                            format!(
                                "address '{addr}' at location '{}' refers to service '{s}', which is not \
                                 registered on service gateway '{}'",
                                l.location, id.name
                            ),
                        ));
                    }
                }
            }
        }
        match g {
            Some(g) if single_ip_version_pools => {
                check_families(g, req).and_then(|()| self.check_frontend_versions(g, req))
            }
            _ => Ok(()),
        }
    }

    /// Applies a normalised `updateAddressLocations` request (checked first); returns the removals.
    pub(crate) fn update_locations(
        &mut self,
        id: &ResourceId,
        auto_create: bool,
        single_ip_version_pools: bool,
        req: NormLocations,
    ) -> Result<Vec<RemovalDraft>, EmulatorError> {
        self.check_locations(id, auto_create, single_ip_version_pools, &req)?;
        let g = self.gateway_mut(id, auto_create)?;
        let mut removals = Vec::new();
        if req.action == UpdateAction::FullUpdate {
            let listed: HashSet<IpAddr> = req.locations.iter().map(|l| l.location).collect();
            let omitted: Vec<IpAddr> = g
                .locations
                .keys()
                .filter(|l| !listed.contains(l))
                .copied()
                .collect();
            for l in omitted {
                removals.extend(g.delete_location(l, RemovalCause::LocationOmittedByFullUpdate));
            }
        }
        for l in req.locations {
            if l.addresses.is_empty() {
                removals.extend(g.delete_location(l.location, RemovalCause::LocationDeleted));
                continue;
            }
            if l.action == UpdateAction::FullUpdate {
                let listed: HashSet<IpAddr> = l
                    .addresses
                    .iter()
                    .filter(|(_, s)| !s.is_empty())
                    .map(|(a, _)| *a)
                    .collect();
                let omitted: Vec<IpAddr> = g
                    .locations
                    .get(&l.location)
                    .map(|m| m.keys().filter(|a| !listed.contains(a)).copied().collect())
                    .unwrap_or_default();
                for a in omitted {
                    removals.extend(g.set_address(
                        l.location,
                        a,
                        BTreeSet::new(),
                        RemovalCause::AddressOmittedByFullUpdate,
                    ));
                }
            }
            for (a, services) in l.addresses {
                removals.extend(g.set_address(
                    l.location,
                    a,
                    services,
                    RemovalCause::AddressUpdate,
                ));
            }
        }
        Ok(removals)
    }

    /// Backend pool ids and NAT gateway ids referenced by any gateway service (lower-cased), with the
    /// referring `gateway/service`.
    pub(crate) fn service_references(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for g in self.gateways.values() {
            for (name, s) in &g.services {
                let who = format!("{}/{name}", g.id.name);
                for p in &s.backend_pools {
                    out.insert(key_str(p), who.clone());
                }
                if let Some(n) = &s.nat_gateway_id {
                    out.insert(key_str(n), who.clone());
                }
            }
        }
        out
    }
}

/// The error code of [`check_families`]. The Service Gateway specification publishes no error codes;
/// this one is named after Azure's published refusal of a NIC-based backend pool that would mix IP
/// versions (`AllNicIpConfigurationsOfLbBackendPoolOnVMScaleSetMustHaveSamePrivateIpAddressVersion`).
pub(crate) const MIXED_FAMILIES: &str = "BackendPoolAddressesMustHaveSameIpVersion";

/// One backend pool holds addresses of one IP version (a load-balancing rule maps a frontend of one
/// version to backends of the same one: NAT44 or NAT66): after `req`, no service of `g` with backend
/// pools may be referred to by addresses of both families ([`crate::EmulatorConfig::single_ip_version_pools`]). Counts the request's effect per service and family with the
/// same semantics as [`NrpState::update_locations`] (omitted locations and addresses, deletions),
/// so a request that moves a service's addresses from one family to the other whole is accepted.
fn check_families<'a>(g: &'a GatewayRec, req: &'a NormLocations) -> Result<(), EmulatorError> {
    // service → change of its [IPv4, IPv6] reference counts.
    let mut delta: HashMap<&'a str, [isize; 2]> = HashMap::new();
    let mut change = |services: &'a BTreeSet<String>, ip: IpAddr, by: isize| {
        for s in services {
            delta.entry(s.as_str()).or_default()[family(ip)] += by;
        }
    };
    if req.action == UpdateAction::FullUpdate {
        let listed: HashSet<IpAddr> = req.locations.iter().map(|l| l.location).collect();
        for (loc, addrs) in &g.locations {
            if !listed.contains(loc) {
                for (a, s) in addrs {
                    change(s, *a, -1);
                }
            }
        }
    }
    for l in &req.locations {
        let current = g.locations.get(&l.location);
        if l.addresses.is_empty() {
            for (a, s) in current.into_iter().flatten() {
                change(s, *a, -1);
            }
            continue;
        }
        let full = l.action == UpdateAction::FullUpdate;
        if full {
            let listed: HashSet<IpAddr> = l
                .addresses
                .iter()
                .filter(|(_, s)| !s.is_empty())
                .map(|(a, _)| *a)
                .collect();
            for (a, s) in current.into_iter().flatten() {
                if !listed.contains(a) {
                    change(s, *a, -1);
                }
            }
        }
        for (a, services) in &l.addresses {
            // An address a location-level FullUpdate sends without services was counted as omitted.
            if !(full && services.is_empty())
                && let Some(old) = current.and_then(|m| m.get(a))
            {
                change(old, *a, -1);
            }
            change(services, *a, 1);
        }
    }
    let after = |s: &str| {
        let (cur, d) = (g.family_refs(s), delta.get(s).copied().unwrap_or_default());
        [0, 1].map(|f| cur[f] as isize + d[f])
    };
    // The first address of the request (in its order) whose service would end up mixed, and the
    // family that service holds (before the request, or by the request's first address for it).
    let mut first_family: HashMap<&str, IpAddr> = HashMap::new();
    for l in &req.locations {
        for (a, services) in &l.addresses {
            for s in services {
                // Outbound services (a NAT gateway) have no backend pool.
                let pooled = g
                    .services
                    .get(s)
                    .is_some_and(|r| !r.backend_pools.is_empty());
                let mixed = after(s).iter().all(|n| *n > 0);
                if !pooled || !mixed {
                    continue;
                }
                let cur = g.family_refs(s);
                let held = match cur {
                    [n, 0] if n > 0 => Some(0),
                    [0, n] if n > 0 => Some(1),
                    _ => None,
                };
                let first = *first_family.entry(s.as_str()).or_insert(*a);
                let held = held.unwrap_or(family(first));
                if family(*a) == held {
                    continue;
                }
                let mine = IpVersion::of(*a);
                let holds = if cur[held] > 0 {
                    format!(
                        "holds {} address(es) only ({} on service gateway '{}')",
                        if held == 0 { "IPv4" } else { "IPv6" },
                        cur[held],
                        g.id.name
                    )
                } else {
                    format!(
                        "would also hold {} address '{first}' of this request",
                        IpVersion::of(first)
                    )
                };
                return Err(EmulatorError::bad_request(
                    MIXED_FAMILIES,
                    format!(
                        "address '{a}' at location '{}' is {mine} and refers to service '{s}', whose \
                         backend pool {holds}: a backend pool holds addresses of one IP version",
                        l.location
                    ),
                ));
            }
        }
    }
    Ok(())
}
