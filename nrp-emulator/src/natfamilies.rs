//! The IP versions of a NAT gateway's public IPs, as Azure has them (REST specification
//! `natGateway.json`, api-version 2025-05-01 and later: `publicIpAddresses` and
//! `publicIpAddressesV6`; Azure's "NAT gateway SKUs" page: a `Standard` NAT gateway is IPv4-only, a
//! `StandardV2` one takes up to 16 IPv4 and 16 IPv6 public IPs, and its public IPs are `StandardV2`):
//!
//! * `publicIpAddresses` holds IPv4 public IPs only, `publicIpAddressesV6` IPv6 ones only
//!   (`NatGatewayPublicIpAddressVersionMismatch`);
//! * `publicIpAddressesV6` is refused on a NAT gateway that is not `StandardV2`
//!   (`NatGatewaySkuDoesNotSupportIpv6`), and each IPv6 public IP must be `StandardV2`
//!   (`NatGatewayIpv6PublicIpSkuMismatch`);
//! * at most 16 of each (`NatGatewayTooManyPublicIpAddresses`).
//!
//! The SKU of the IPv4 public IPs of a `StandardV2` NAT gateway is not checked (the emulator has
//! always accepted `Standard` ones there). Error codes are the emulator's (Azure publishes none for
//! these).
//!
//! And for the Service Gateway (an emulator rule, with [`crate::EmulatorConfig::single_ip_version_pools`],
//! like the load balancers' frontend rule in `families.rs`): an IPv6 address may refer to an
//! outbound service only when its NAT gateway has an IPv6 public IP
//! (`OutboundServiceHasNoIpv6PublicIp`): without one, the NAT gateway gives IPv6 pods no outbound
//! address, which is what clb's ordering (public IP first, then addresses) exists to prevent.

use crate::error::EmulatorError;
use crate::gateway::NormLocations;
use crate::state::{GatewayRec, NrpState, key_str};
use clb_nrp::wire::{IpVersion, NatGateway, ResourceId, SubResource};

/// The most public IPs of each version a NAT gateway takes.
pub(crate) const MAX_PUBLIC_IPS: usize = 16;

const STANDARD_V2: &str = crate::natlink::STANDARD_V2;

impl NrpState {
    /// The version rules of a PUT of NAT gateway `body` at `id` (module documentation); its public
    /// IPs are known to exist (`check_public_ip_refs`).
    pub(crate) fn check_nat_gateway_versions(
        &self,
        id: &ResourceId,
        body: &NatGateway,
    ) -> Result<(), EmulatorError> {
        let p = &body.properties;
        let old_sku = self
            .nat_gateways
            .get(&crate::state::key_of(id))
            .and_then(|o| o.sku.as_ref());
        let sku = body
            .sku
            .as_ref()
            .or(old_sku)
            .map_or("Standard", |s| &s.name);
        for (field, list) in [
            ("publicIpAddresses", &p.public_ip_addresses),
            ("publicIpAddressesV6", &p.public_ip_addresses_v6),
        ] {
            if list.len() > MAX_PUBLIC_IPS {
                return Err(EmulatorError::bad_request(
                    "NatGatewayTooManyPublicIpAddresses",
                    format!(
                        "NAT gateway '{}': {field} lists {} public IP addresses; at most \
                         {MAX_PUBLIC_IPS} are allowed",
                        id.name,
                        list.len()
                    ),
                ));
            }
        }
        if !p.public_ip_addresses_v6.is_empty() && !sku.eq_ignore_ascii_case(STANDARD_V2) {
            return Err(EmulatorError::bad_request(
                "NatGatewaySkuDoesNotSupportIpv6",
                format!(
                    "NAT gateway '{}' has SKU '{sku}', which supports IPv4 only: \
                     publicIpAddressesV6 needs a {STANDARD_V2} NAT gateway",
                    id.name
                ),
            ));
        }
        for (field, list, v6) in [
            ("publicIpAddresses", &p.public_ip_addresses, false),
            ("publicIpAddressesV6", &p.public_ip_addresses_v6, true),
        ] {
            for r in list {
                self.check_nat_public_ip(id, field, r, v6)?;
            }
        }
        Ok(())
    }

    fn check_nat_public_ip(
        &self,
        id: &ResourceId,
        field: &str,
        r: &SubResource,
        v6: bool,
    ) -> Result<(), EmulatorError> {
        let Some(pip) = self.public_ips.get(&key_str(&r.id)) else {
            return Ok(());
        };
        let is_v6 = pip.properties.public_ip_address_version == Some(IpVersion::V6);
        let version = |v6: bool| if v6 { "IPv6" } else { "IPv4" };
        if is_v6 != v6 {
            return Err(EmulatorError::bad_request(
                "NatGatewayPublicIpAddressVersionMismatch",
                format!(
                    "NAT gateway '{}': {field} takes {} public IP addresses only; '{}' is {}",
                    id.name,
                    version(v6),
                    r.id,
                    version(is_v6)
                ),
            ));
        }
        let pip_sku = pip.sku.as_ref().map_or("Basic", |s| s.name.as_str());
        if v6 && !pip_sku.eq_ignore_ascii_case(STANDARD_V2) {
            return Err(EmulatorError::bad_request(
                "NatGatewayIpv6PublicIpSkuMismatch",
                format!(
                    "NAT gateway '{}': IPv6 public IP address '{}' has SKU '{pip_sku}'; a NAT \
                     gateway's IPv6 public IPs must be {STANDARD_V2}",
                    id.name, r.id
                ),
            ));
        }
        Ok(())
    }

    /// Whether the NAT gateway `nat_id` (an id) has an IPv6 public IP.
    fn nat_gateway_has_ipv6(&self, nat_id: &str) -> bool {
        self.nat_gateways
            .get(&key_str(nat_id))
            .is_some_and(|n| !n.properties.public_ip_addresses_v6.is_empty())
    }

    /// Refuses the first IPv6 address of `req` that refers to an outbound service of `g` whose NAT
    /// gateway has no IPv6 public IP (module documentation).
    pub(crate) fn check_outbound_versions(
        &self,
        g: &GatewayRec,
        req: &NormLocations,
    ) -> Result<(), EmulatorError> {
        for l in &req.locations {
            for (a, services) in &l.addresses {
                if !a.is_ipv6() {
                    continue;
                }
                for s in services {
                    let Some(nat) = g.services.get(s).and_then(|r| r.nat_gateway_id.as_deref())
                    else {
                        continue;
                    };
                    if !self.nat_gateway_has_ipv6(nat) {
                        return Err(EmulatorError::bad_request(
                            "OutboundServiceHasNoIpv6PublicIp",
                            format!(
                                "address '{a}' at location '{}' is IPv6 and refers to outbound \
                                 service '{s}', whose NAT gateway '{nat}' has no IPv6 public IP \
                                 (publicIpAddressesV6)",
                                l.location
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}
