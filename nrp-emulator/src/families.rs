//! The IP-version rule of load balancer frontends and the Service Gateway's addresses: Azure's load
//! balancer translates IPv4 to IPv4 and IPv6 to IPv6 only (NAT44, NAT66; no NAT46 or NAT64, as
//! NRP's team states in azure-cli issue 27013, where a load-balancing rule between a frontend and
//! backends of different versions is refused). A public frontend has the version of its public IP
//! (`publicIPAddressVersion`), so an address registered to a service whose backend pool is the
//! backend of a rule with a frontend of the other version could never receive traffic: refused.
//! Checked with the one-version pool rule ([`crate::EmulatorConfig::single_ip_version_pools`]).

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use crate::error::EmulatorError;
use crate::gateway::NormLocations;
use crate::state::{GatewayRec, NrpState, family, key_of, key_str};
use clb_nrp::wire::{IpVersion, ResourceId};

/// The error code of [`NrpState::check_frontend_versions`] (the emulator's: the Service Gateway
/// specification publishes no error codes).
pub(crate) const FRONTEND_VERSION: &str = "BackendAddressIpVersionDoesNotMatchFrontend";

/// A frontend whose rules send to a pool: its public IP's id and version index (0 IPv4, 1 IPv6).
struct Frontend {
    public_ip: String,
    version: usize,
}

impl NrpState {
    /// The public frontends of the load-balancing rules whose backend is `pool` (a backend pool
    /// id), each with its public IP's version. A pool of no rule, or a frontend whose public IP is
    /// gone, gives nothing.
    fn pool_frontends(&self, pool: &str) -> Vec<Frontend> {
        let Ok((lb_id, Some(_))) = ResourceId::parse_with_child(pool) else {
            return Vec::new();
        };
        let Some(lb) = self.load_balancers.get(&key_of(&lb_id)) else {
            return Vec::new();
        };
        let pool = key_str(pool);
        let frontends: BTreeSet<String> = lb
            .properties
            .load_balancing_rules
            .iter()
            .filter(|r| {
                r.properties
                    .backend_address_pool
                    .as_ref()
                    .is_some_and(|p| key_str(&p.id) == pool)
            })
            .filter_map(|r| r.properties.frontend_ip_configuration.as_ref())
            .map(|f| key_str(&f.id))
            .collect();
        lb.properties
            .frontend_ip_configurations
            .iter()
            .filter(|f| frontends.contains(&key_str(&lb_id.frontend_ip_configuration_id(&f.name))))
            .filter_map(|f| f.properties.public_ip_address.as_ref())
            .filter_map(|pip| {
                let p = self.public_ips.get(&key_str(&pip.id))?;
                let v6 = p.properties.public_ip_address_version == Some(IpVersion::V6);
                Some(Frontend {
                    public_ip: pip.id.clone(),
                    version: usize::from(v6),
                })
            })
            .collect()
    }

    /// Refuses the first address of `req` (in its order) that refers to a service of `g` whose
    /// backend pool serves a public frontend of the other IP version (module documentation), or an
    /// IPv6 address referring to an outbound service whose NAT gateway has no IPv6 public IP
    /// (`natfamilies.rs`).
    pub(crate) fn check_frontend_versions(
        &self,
        g: &GatewayRec,
        req: &NormLocations,
    ) -> Result<(), EmulatorError> {
        // A service's pools and their frontends are read once per request, not once per address
        // (a call carries thousands of addresses for a few services).
        let mut pools_of: HashMap<&str, Vec<(&str, Vec<Frontend>)>> = HashMap::new();
        for l in &req.locations {
            for (a, services) in &l.addresses {
                for s in services {
                    let Some(rec) = g.services.get(s) else {
                        continue;
                    };
                    let pools = pools_of.entry(s.as_str()).or_insert_with(|| {
                        rec.backend_pools
                            .iter()
                            .map(|pool| (pool.as_str(), self.pool_frontends(pool)))
                            .collect()
                    });
                    for (pool, frontends) in pools.iter() {
                        if let Some(f) = frontends.iter().find(|f| f.version != family(*a)) {
                            return Err(mismatch(*a, l.location, s, pool, f));
                        }
                    }
                }
            }
        }
        // And an outbound service's NAT gateway must have a public IP of the address's version.
        self.check_outbound_versions(g, req)
    }
}

fn mismatch(a: IpAddr, location: IpAddr, service: &str, pool: &str, f: &Frontend) -> EmulatorError {
    let version = |v: usize| if v == 1 { "IPv6" } else { "IPv4" };
    EmulatorError::bad_request(
        FRONTEND_VERSION,
        format!(
            "address '{a}' at location '{location}' is {} and refers to service '{service}', whose \
             backend pool '{pool}' serves a load-balancing rule with an {} frontend (public IP \
             '{}'): a load balancer translates IPv4 to IPv4 and IPv6 to IPv6 only",
            version(family(a)),
            version(f.version),
            f.public_ip
        ),
    )
}
