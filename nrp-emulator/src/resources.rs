//! Rules of the public IP address, load balancer and NAT gateway resources that the service sagas
//! create: required location, references that must exist, a public IP used by one resource only, and
//! no deletion of what a gateway service (or another resource) still uses.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::EmulatorError;
use crate::state::{NrpState, key_of, key_str, not_found};
use clb_nrp::wire::{
    IpVersion, LoadBalancer, LoadDistribution, NatGateway, PublicIpAddress, ResourceId,
    ResourceKind, Sku, TransportProtocol,
};

/// The range of a load-balancing rule's `idleTimeoutInMinutes` Azure takes: 4 to 30 minutes
/// (Azure Load Balancer's documented range for load-balancing and inbound NAT rules; outbound rules
/// take up to 100, and so does a public IP of its own, but a load-balancing rule does not).
pub(crate) const RULE_IDLE_TIMEOUT_MINUTES: std::ops::RangeInclusive<u32> = 4..=30;

fn require_location(id: &ResourceId, location: Option<&str>) -> Result<String, EmulatorError> {
    match location.map(str::trim).filter(|l| !l.is_empty()) {
        Some(l) => Ok(l.to_string()),
        None => Err(EmulatorError::bad_request(
            "LocationRequired",
            format!("{} '{}' needs a location", id.kind.arm_type(), id.name),
        )),
    }
}

fn check_same_location(id: &ResourceId, old: Option<&str>, new: &str) -> Result<(), EmulatorError> {
    match old {
        Some(old) if !old.eq_ignore_ascii_case(new) => Err(EmulatorError::bad_request(
            "InvalidResourceLocation",
            format!(
                "{} '{}' exists in location '{old}' and cannot be moved to '{new}'",
                id.kind.arm_type(),
                id.name
            ),
        )),
        _ => Ok(()),
    }
}

fn bad_ref(message: String) -> EmulatorError {
    EmulatorError::bad_request("InvalidResourceReference", message)
}

fn check_unique_names<'a>(
    id: &ResourceId,
    what: &str,
    names: impl Iterator<Item = &'a str>,
) -> Result<(), EmulatorError> {
    let mut seen = HashSet::new();
    for n in names {
        if n.trim().is_empty() {
            return Err(EmulatorError::bad_request(
                "InvalidResourceName",
                format!("a {what} of '{}' has an empty name", id.name),
            ));
        }
        if !seen.insert(n.to_ascii_lowercase()) {
            return Err(EmulatorError::bad_request(
                "DuplicateResourceName",
                format!("{what} '{n}' appears more than once in '{}'", id.name),
            ));
        }
    }
    Ok(())
}

/// The addresses the emulator gives public IPs (Azure assigns `ipAddress`; it is read-only):
/// IPv4 from `20.0.0.0/8`, IPv6 from `2001:db8:c1b::/48` (a documentation prefix), each counting up
/// from the first address of its range and skipping addresses in use, wrapping at the end. An
/// address is free again once its public IP is deleted. Deterministic: the same sequence of calls
/// gets the same addresses. One pool per emulator, so addresses are unique across its resource
/// groups and gateways.
#[derive(Debug, Clone, Default)]
pub(crate) struct IpPool {
    in_use: HashSet<IpAddr>,
    /// Offset of the next IPv4 address to try, from [`IpPool::V4_FIRST`].
    next_v4: u32,
    /// Offset of the next IPv6 address to try, from [`IpPool::V6_FIRST`].
    next_v6: u64,
}

impl IpPool {
    /// `20.0.0.1`.
    const V4_FIRST: u32 = (20 << 24) | 1;
    /// Addresses of the IPv4 range: `20.0.0.1` to `20.255.255.254`.
    const V4_SIZE: u32 = (1 << 24) - 2;
    /// `2001:db8:c1b::1`.
    const V6_FIRST: u128 = (0x2001_0db8_0c1b_u128 << 80) | 1;
    /// Addresses of the IPv6 range used (the low 64 bits of the /48, less one).
    const V6_SIZE: u64 = u64::MAX;

    /// The next free address of the family.
    pub(crate) fn allocate(&mut self, v6: bool) -> Result<IpAddr, EmulatorError> {
        let size = if v6 {
            Self::V6_SIZE
        } else {
            u64::from(Self::V4_SIZE)
        };
        // Bounded: at worst every address of the range is in use.
        for _ in 0..=self.in_use.len() {
            let ip = if v6 {
                let n = self.next_v6;
                self.next_v6 = (n + 1) % size;
                IpAddr::V6(Ipv6Addr::from(Self::V6_FIRST + u128::from(n)))
            } else {
                let n = self.next_v4;
                self.next_v4 = (n + 1) % Self::V4_SIZE;
                IpAddr::V4(Ipv4Addr::from(Self::V4_FIRST + n))
            };
            if self.in_use.insert(ip) {
                return Ok(ip);
            }
        }
        Err(EmulatorError::bad_request(
            "PublicIPCountLimitReached",
            format!(
                "no free {} address is left",
                if v6 { "IPv6" } else { "IPv4" }
            ),
        ))
    }

    /// Returns `ip` to the pool.
    pub(crate) fn free(&mut self, ip: IpAddr) {
        self.in_use.remove(&ip);
    }
}

impl NrpState {
    /// Ids (lower-cased) of the load balancers and NAT gateways that use the public IP `pip_key`,
    /// except `except` (lower-cased).
    fn public_ip_users(&self, pip_key: &str, except: &str) -> Vec<String> {
        let lbs = self.load_balancers.iter().filter(|(k, lb)| {
            k.as_str() != except
                && lb.properties.frontend_ip_configurations.iter().any(|f| {
                    f.properties
                        .public_ip_address
                        .as_ref()
                        .is_some_and(|p| key_str(&p.id) == pip_key)
                })
        });
        let nats = self.nat_gateways.iter().filter(|(k, n)| {
            k.as_str() != except
                && n.properties
                    .public_ip_addresses
                    .iter()
                    .chain(&n.properties.public_ip_addresses_v6)
                    .any(|p| key_str(&p.id) == pip_key)
        });
        lbs.map(|(k, _)| k.clone())
            .chain(nats.map(|(k, _)| k.clone()))
            .collect()
    }

    /// Checks that each of `pips` exists, is listed once, and is used by no resource other than `owner`.
    fn check_public_ip_refs<'a>(
        &self,
        owner: &ResourceId,
        pips: impl Iterator<Item = &'a str>,
    ) -> Result<(), EmulatorError> {
        let owner_key = key_of(owner);
        let mut seen = HashSet::new();
        for pip in pips {
            let k = key_str(pip);
            match ResourceId::parse(pip) {
                Ok(pid) if pid.kind == ResourceKind::PublicIpAddress => {}
                _ => return Err(bad_ref(format!("'{pip}' is not a public IP address id"))),
            }
            if !self.public_ips.contains_key(&k) {
                return Err(bad_ref(format!("public IP address '{pip}' does not exist")));
            }
            let users = self.public_ip_users(&k, &owner_key);
            if !seen.insert(k) || !users.is_empty() {
                return Err(EmulatorError::bad_request(
                    "PublicIPAddressInUse",
                    format!(
                        "public IP address '{pip}' is already used by {}",
                        if users.is_empty() {
                            owner.to_string()
                        } else {
                            users.join(", ")
                        }
                    ),
                ));
            }
        }
        Ok(())
    }

    // ---- public IP addresses ----------------------------------------------------------------------

    pub(crate) fn check_put_public_ip(
        &self,
        id: &ResourceId,
        body: &PublicIpAddress,
    ) -> Result<(), EmulatorError> {
        let loc = require_location(id, body.location.as_deref())?;
        let old = self.public_ips.get(&key_of(id));
        check_same_location(id, old.and_then(|o| o.location.as_deref()), &loc)?;
        if let Some(v @ IpVersion::Other(_)) = &body.properties.public_ip_address_version {
            return Err(EmulatorError::bad_request(
                "InvalidPublicIPAddressVersion",
                format!(
                    "publicIPAddressVersion '{v}' of '{}' must be IPv4 or IPv6",
                    id.name
                ),
            ));
        }
        if let Some(label) = body.properties.domain_name_label() {
            self.check_dns_label(id, &loc, label)?;
        }
        Ok(())
    }

    pub(crate) fn put_public_ip(
        &mut self,
        id: &ResourceId,
        mut body: PublicIpAddress,
    ) -> Result<(bool, PublicIpAddress), EmulatorError> {
        self.check_put_public_ip(id, &body)?;
        let key = key_of(id);
        // Absent: IPv4, as in Azure (and the answer says so).
        let v6 = body.properties.public_ip_address_version == Some(IpVersion::V6);
        // `ipAddress` is read-only, as in Azure: what the body says is ignored. A public IP keeps
        // its address across updates unless its version changes.
        let old_ip = self
            .public_ips
            .get(&key)
            .and_then(|o| o.properties.ip_address.as_deref())
            .and_then(|ip| ip.parse::<IpAddr>().ok());
        let ip = match old_ip {
            Some(ip) if ip.is_ipv6() == v6 => ip,
            old => {
                let ip = self.ip_pool.allocate(v6)?;
                if let Some(old) = old {
                    self.ip_pool.free(old);
                }
                ip
            }
        };
        body.id = Some(id.to_string());
        body.name = Some(id.name.clone());
        body.resource_type = Some(id.kind.arm_type());
        body.sku.get_or_insert_with(Sku::standard);
        let p = &mut body.properties;
        p.ip_address = Some(ip.to_string());
        p.public_ip_allocation_method
            .get_or_insert_with(|| "Static".into());
        p.public_ip_address_version = Some(if v6 { IpVersion::V6 } else { IpVersion::V4 });
        p.provisioning_state = Some("Succeeded".into());
        // Read-only: Azure fills them on the way out.
        p.ip_configuration = None;
        p.nat_gateway = None;
        // `fqdn` is Azure's, made of the label; without a label, no DNS name.
        let region = body.location.clone().unwrap_or_default();
        let p = &mut body.properties;
        if let Some(dns) = &mut p.dns_settings {
            dns.domain_name_label = dns.domain_name_label.take().filter(|l| !l.is_empty());
            dns.fqdn = dns
                .domain_name_label
                .as_deref()
                .map(|l| crate::dns::fqdn(l, &region));
            if dns.domain_name_label.is_none() && dns.other.is_empty() {
                p.dns_settings = None;
            }
        }
        let created = self.public_ips.insert(key.clone(), body.clone()).is_none();
        let only = HashSet::from([key]);
        Ok((
            created,
            self.with_users(body, &self.public_ip_user_map(Some(&only))),
        ))
    }

    pub(crate) fn get_public_ip(&self, id: &ResourceId) -> Result<PublicIpAddress, EmulatorError> {
        let key = key_of(id);
        let p = self
            .public_ips
            .get(&key)
            .cloned()
            .ok_or_else(|| not_found(id))?;
        let only = HashSet::from([key]);
        Ok(self.with_users(p, &self.public_ip_user_map(Some(&only))))
    }

    pub(crate) fn check_delete_public_ip(&self, id: &ResourceId) -> Result<(), EmulatorError> {
        let users = self.public_ip_users(&key_of(id), "");
        if !users.is_empty() {
            return Err(EmulatorError::bad_request(
                "InUsePublicIpAddressCannotBeDeleted",
                format!(
                    "public IP address '{}' is used by {}",
                    id.name,
                    users.join(", ")
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn delete_public_ip(&mut self, id: &ResourceId) -> Result<bool, EmulatorError> {
        self.check_delete_public_ip(id)?;
        let removed = self.public_ips.remove(&key_of(id));
        if let Some(ip) = removed
            .as_ref()
            .and_then(|p| p.properties.ip_address.as_deref())
            .and_then(|ip| ip.parse::<IpAddr>().ok())
        {
            self.ip_pool.free(ip);
        }
        Ok(removed.is_some())
    }

    /// `GET …/resourceGroups/{rg}/providers/Microsoft.Network/publicIPAddresses`: one page of the
    /// resource group's public IPs, by name, after `after` (a lower-cased name).
    pub(crate) fn list_public_ips(
        &self,
        subscription: &str,
        resource_group: &str,
        after: Option<&str>,
        page: usize,
    ) -> (Vec<PublicIpAddress>, Option<String>) {
        let any = ResourceId::new(
            subscription,
            resource_group,
            ResourceKind::PublicIpAddress,
            "",
        );
        let (items, next) = list_page(&self.public_ips, &any, after, page);
        let only: HashSet<String> = items
            .iter()
            .filter_map(|p| p.id.as_deref().map(key_str))
            .collect();
        let users = self.public_ip_user_map(Some(&only));
        let items = items
            .into_iter()
            .map(|p| self.with_users(p, &users))
            .collect();
        (items, next)
    }

    // ---- load balancers ---------------------------------------------------------------------------

    pub(crate) fn check_put_load_balancer(
        &self,
        id: &ResourceId,
        body: &LoadBalancer,
    ) -> Result<(), EmulatorError> {
        let loc = require_location(id, body.location.as_deref())?;
        let key = key_of(id);
        let old = self.load_balancers.get(&key);
        check_same_location(id, old.and_then(|o| o.location.as_deref()), &loc)?;
        let p = &body.properties;
        check_unique_names(
            id,
            "frontend IP configuration",
            p.frontend_ip_configurations.iter().map(|f| f.name.as_str()),
        )?;
        check_unique_names(
            id,
            "backend address pool",
            p.backend_address_pools.iter().map(|b| b.name.as_str()),
        )?;
        check_unique_names(
            id,
            "load-balancing rule",
            p.load_balancing_rules.iter().map(|r| r.name.as_str()),
        )?;
        self.check_public_ip_refs(
            id,
            p.frontend_ip_configurations.iter().filter_map(|f| {
                f.properties
                    .public_ip_address
                    .as_ref()
                    .map(|s| s.id.as_str())
            }),
        )?;
        let frontends: HashSet<String> = p
            .frontend_ip_configurations
            .iter()
            .map(|f| key_str(&id.frontend_ip_configuration_id(&f.name)))
            .collect();
        let pools: HashSet<String> = p
            .backend_address_pools
            .iter()
            .map(|b| key_str(&id.backend_pool_id(&b.name)))
            .collect();
        let mut used = HashSet::new();
        for r in &p.load_balancing_rules {
            let rp = &r.properties;
            let bad_rule = |m: String| {
                EmulatorError::bad_request(
                    "InvalidLoadBalancingRule",
                    format!("rule '{}' of '{}': {m}", r.name, id.name),
                )
            };
            let Some(fe) = &rp.frontend_ip_configuration else {
                return Err(bad_rule("frontendIPConfiguration is required".into()));
            };
            if !frontends.contains(&key_str(&fe.id)) {
                return Err(bad_ref(format!(
                    "rule '{}' refers to frontend '{}', which is not a frontend of '{}'",
                    r.name, fe.id, id.name
                )));
            }
            if let Some(pool) = &rp.backend_address_pool
                && !pools.contains(&key_str(&pool.id))
            {
                return Err(bad_ref(format!(
                    "rule '{}' refers to backend pool '{}', which is not a pool of '{}'",
                    r.name, pool.id, id.name
                )));
            }
            let Some(proto) = rp.protocol else {
                return Err(bad_rule("protocol (Tcp, Udp or All) is required".into()));
            };
            if let Some(minutes) = rp.idle_timeout_in_minutes
                && !RULE_IDLE_TIMEOUT_MINUTES.contains(&minutes)
            {
                return Err(EmulatorError::bad_request(
                    "LoadBalancingRuleIdleTimeoutOutOfRange",
                    format!(
                        "rule '{}' of '{}': idleTimeoutInMinutes {minutes} is out of range: a \
                         load-balancing rule takes {} to {} minutes",
                        r.name,
                        id.name,
                        RULE_IDLE_TIMEOUT_MINUTES.start(),
                        RULE_IDLE_TIMEOUT_MINUTES.end()
                    ),
                ));
            }
            if let Some(LoadDistribution::Other(v)) = &rp.load_distribution {
                return Err(EmulatorError::bad_request(
                    "InvalidLoadDistribution",
                    format!(
                        "rule '{}' of '{}': loadDistribution '{v}' must be Default, SourceIP or \
                         SourceIPProtocol",
                        r.name, id.name
                    ),
                ));
            }
            let ports_ok = match proto {
                TransportProtocol::All => rp.frontend_port == 0 && rp.backend_port == 0,
                _ => rp.frontend_port >= 1 && rp.backend_port >= 1,
            };
            if !ports_ok {
                return Err(bad_rule(format!(
                    "ports {} -> {} are invalid for protocol {proto:?} (1-65535; 0 only with All)",
                    rp.frontend_port, rp.backend_port
                )));
            }
            if !used.insert((key_str(&fe.id), proto, rp.frontend_port)) {
                return Err(EmulatorError::bad_request(
                    "RulesUseSameFrontendIpAndPort",
                    format!(
                        "rule '{}' of '{}' uses frontend port {} / {proto:?} of the same frontend as another rule",
                        r.name, id.name, rp.frontend_port
                    ),
                ));
            }
        }
        // A backend pool still registered on a gateway cannot disappear.
        let prefix = format!("{key}/backendaddresspools/");
        for (pool, who) in self.service_references() {
            if pool.starts_with(&prefix) && !pools.contains(&pool) {
                return Err(EmulatorError::bad_request(
                    "InUseBackendAddressPoolCannotBeDeleted",
                    format!("backend pool '{pool}' is used by service gateway service '{who}'"),
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn put_load_balancer(
        &mut self,
        id: &ResourceId,
        mut body: LoadBalancer,
    ) -> Result<(bool, LoadBalancer), EmulatorError> {
        self.check_put_load_balancer(id, &body)?;
        body.id = Some(id.to_string());
        body.name = Some(id.name.clone());
        body.resource_type = Some(id.kind.arm_type());
        body.sku.get_or_insert_with(Sku::standard);
        let p = &mut body.properties;
        for f in &mut p.frontend_ip_configurations {
            f.id = Some(id.frontend_ip_configuration_id(&f.name));
        }
        for b in &mut p.backend_address_pools {
            b.id = Some(id.backend_pool_id(&b.name));
        }
        for r in &mut p.load_balancing_rules {
            r.id = Some(id.child("loadBalancingRules", &r.name));
        }
        p.provisioning_state = Some("Succeeded".into());
        let created = self
            .load_balancers
            .insert(key_of(id), body.clone())
            .is_none();
        Ok((created, body))
    }

    /// `GET …/resourceGroups/{rg}/providers/Microsoft.Network/loadBalancers`: one page of the
    /// resource group's load balancers, by name, after `after` (a lower-cased name).
    pub(crate) fn list_load_balancers(
        &self,
        subscription: &str,
        resource_group: &str,
        after: Option<&str>,
        page: usize,
    ) -> (Vec<LoadBalancer>, Option<String>) {
        let any = ResourceId::new(subscription, resource_group, ResourceKind::LoadBalancer, "");
        list_page(&self.load_balancers, &any, after, page)
    }

    pub(crate) fn get_load_balancer(&self, id: &ResourceId) -> Result<LoadBalancer, EmulatorError> {
        self.load_balancers
            .get(&key_of(id))
            .cloned()
            .ok_or_else(|| not_found(id))
    }

    pub(crate) fn check_delete_load_balancer(&self, id: &ResourceId) -> Result<(), EmulatorError> {
        let prefix = format!("{}/", key_of(id));
        if let Some((pool, who)) = self
            .service_references()
            .into_iter()
            .find(|(p, _)| p.starts_with(&prefix))
        {
            return Err(EmulatorError::bad_request(
                "InUseLoadBalancerCannotBeDeleted",
                format!(
                    "load balancer '{}' cannot be deleted: its backend pool '{pool}' is used by service \
                     gateway service '{who}'",
                    id.name
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn delete_load_balancer(&mut self, id: &ResourceId) -> Result<bool, EmulatorError> {
        self.check_delete_load_balancer(id)?;
        Ok(self.load_balancers.remove(&key_of(id)).is_some())
    }

    // ---- NAT gateways -----------------------------------------------------------------------------

    pub(crate) fn check_put_nat_gateway(
        &self,
        id: &ResourceId,
        body: &NatGateway,
    ) -> Result<(), EmulatorError> {
        let loc = require_location(id, body.location.as_deref())?;
        let old = self.nat_gateways.get(&key_of(id));
        check_same_location(id, old.and_then(|o| o.location.as_deref()), &loc)?;
        self.check_nat_gateway_link(id, body)?;
        self.check_public_ip_refs(
            id,
            body.properties
                .public_ip_addresses
                .iter()
                .chain(&body.properties.public_ip_addresses_v6)
                .map(|p| p.id.as_str()),
        )?;
        self.check_nat_gateway_versions(id, body)
    }

    pub(crate) fn put_nat_gateway(
        &mut self,
        id: &ResourceId,
        mut body: NatGateway,
    ) -> Result<(bool, NatGateway), EmulatorError> {
        self.check_put_nat_gateway(id, &body)?;
        body.id = Some(id.to_string());
        body.name = Some(id.name.clone());
        body.resource_type = Some(id.kind.arm_type());
        let old_sku = self
            .nat_gateways
            .get(&key_of(id))
            .and_then(|o| o.sku.clone());
        body.sku = body.sku.or(old_sku).or_else(|| {
            Some(Sku {
                name: "Standard".into(),
                tier: None,
            })
        });
        body.properties.provisioning_state = Some("Succeeded".into());
        let created = self.nat_gateways.insert(key_of(id), body.clone()).is_none();
        Ok((created, body))
    }

    pub(crate) fn get_nat_gateway(&self, id: &ResourceId) -> Result<NatGateway, EmulatorError> {
        self.nat_gateways
            .get(&key_of(id))
            .cloned()
            .ok_or_else(|| not_found(id))
    }

    /// A NAT gateway an outbound registration uses cannot be deleted, unless
    /// `cfg.delete_nat_gateways_in_use` (a NAT gateway deleted out of band: its registrations keep
    /// naming it).
    pub(crate) fn check_delete_nat_gateway(
        &self,
        id: &ResourceId,
        cfg: &crate::config::EmulatorConfig,
    ) -> Result<(), EmulatorError> {
        if cfg.delete_nat_gateways_in_use {
            return Ok(());
        }
        if let Some(who) = self.service_references().get(&key_of(id)) {
            return Err(EmulatorError::bad_request(
                "InUseNatGatewayCannotBeDeleted",
                format!(
                    "NAT gateway '{}' is used by service gateway service '{who}'",
                    id.name
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn delete_nat_gateway(
        &mut self,
        id: &ResourceId,
        cfg: &crate::config::EmulatorConfig,
    ) -> Result<bool, EmulatorError> {
        self.check_delete_nat_gateway(id, cfg)?;
        Ok(self.nat_gateways.remove(&key_of(id)).is_some())
    }
}

/// One page of the resources of `map` (keyed by lower-cased id) in the resource group and of the
/// kind of `any` (a nameless id), by name, after `after` (a lower-cased name), and the paging token
/// of the next page when there is one.
fn list_page<T: Clone>(
    map: &std::collections::BTreeMap<String, T>,
    any: &ResourceId,
    after: Option<&str>,
    page: usize,
) -> (Vec<T>, Option<String>) {
    use std::ops::Bound::{Excluded, Included, Unbounded};
    // Keys are lower-cased ids, so the resource group's resources of one kind share this prefix.
    let prefix = key_of(any);
    let lower = match after {
        Some(name) => Excluded(format!("{prefix}{}", name.to_ascii_lowercase())),
        None => Included(prefix.clone()),
    };
    let mut it = map
        .range::<String, _>((lower, Unbounded))
        .take_while(|(k, _)| k.starts_with(&prefix));
    let items: Vec<(&String, &T)> = it.by_ref().take(page.max(1)).collect();
    let next = match (it.next(), items.last()) {
        (Some(_), Some((k, _))) => Some(k[prefix.len()..].to_string()),
        _ => None,
    };
    (items.into_iter().map(|(_, p)| p.clone()).collect(), next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_counts_up_skips_addresses_in_use_and_reuses_freed_ones() {
        let mut pool = IpPool::default();
        let v4 = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(pool.allocate(false).unwrap(), v4("20.0.0.1"));
        assert_eq!(pool.allocate(false).unwrap(), v4("20.0.0.2"));
        assert_eq!(pool.allocate(true).unwrap(), v4("2001:db8:c1b::1"));
        // Back at the start of the range (as after a wrap): 20.0.0.1 is in use and is skipped ...
        pool.next_v4 = 0;
        assert_eq!(pool.allocate(false).unwrap(), v4("20.0.0.3"));
        // ... until it is freed.
        pool.free(v4("20.0.0.1"));
        pool.next_v4 = 0;
        assert_eq!(pool.allocate(false).unwrap(), v4("20.0.0.1"));
        // The last address of the range is followed by the first.
        pool.next_v4 = IpPool::V4_SIZE - 1;
        assert_eq!(pool.allocate(false).unwrap(), v4("20.255.255.254"));
        assert_eq!(pool.allocate(false).unwrap(), v4("20.0.0.4"));
    }
}
