//! Who uses a public IP, as Azure shows it on a GET: `ipConfiguration` (the frontend IP
//! configuration of the load balancer that uses it) and `natGateway` (the NAT gateway that does),
//! read-only fields Azure fills and a request body cannot set.

use std::collections::HashSet;

use crate::state::{NrpState, key_str};
use clb_nrp::wire::{PublicIpAddress, SubResource};

/// What uses a public IP: a load balancer frontend (its id) or a NAT gateway (its id).
#[derive(Debug, Clone)]
pub(crate) enum PublicIpUser {
    Frontend(String),
    NatGateway(String),
}

impl NrpState {
    /// The public IP `p` as a GET answers it: `ipConfiguration` (the frontend IP configuration of
    /// the load balancer that uses it) and `natGateway` (the NAT gateway that does), read-only
    /// fields Azure fills. `users` is [`NrpState::public_ip_user_map`] or the users of `p` alone.
    pub(crate) fn with_users(
        &self,
        mut p: PublicIpAddress,
        users: &std::collections::HashMap<String, PublicIpUser>,
    ) -> PublicIpAddress {
        let key = p.id.as_deref().map(key_str).unwrap_or_default();
        p.properties.ip_configuration = None;
        p.properties.nat_gateway = None;
        match users.get(&key) {
            Some(PublicIpUser::Frontend(f)) => {
                p.properties.ip_configuration = Some(SubResource::new(f));
            }
            Some(PublicIpUser::NatGateway(n)) => {
                p.properties.nat_gateway = Some(SubResource::new(n));
            }
            None => {}
        }
        p
    }

    /// Who uses each public IP (by lower-cased id) among `only` (every one when `None`): one pass
    /// over the load balancers and NAT gateways.
    pub(crate) fn public_ip_user_map(
        &self,
        only: Option<&HashSet<String>>,
    ) -> std::collections::HashMap<String, PublicIpUser> {
        let wanted = |k: &String| only.is_none_or(|o| o.contains(k));
        let mut users = std::collections::HashMap::new();
        for lb in self.load_balancers.values() {
            for f in &lb.properties.frontend_ip_configurations {
                if let (Some(pip), Some(fid)) = (&f.properties.public_ip_address, &f.id) {
                    let k = key_str(&pip.id);
                    if wanted(&k) {
                        users.insert(k, PublicIpUser::Frontend(fid.clone()));
                    }
                }
            }
        }
        for n in self.nat_gateways.values() {
            let Some(nid) = &n.id else { continue };
            for pip in n
                .properties
                .public_ip_addresses
                .iter()
                .chain(&n.properties.public_ip_addresses_v6)
            {
                let k = key_str(&pip.id);
                if wanted(&k) {
                    users.insert(k, PublicIpUser::NatGateway(nid.clone()));
                }
            }
        }
        users
    }
}
