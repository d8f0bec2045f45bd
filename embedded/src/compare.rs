//! Comparing what an NRP emulator holds with the desired state of a cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use clb_nrp_emulator::Emulator;
use clb_sync_worker::worker::{
    load_balancer_name, nat_gateway_name, public_ip_name, public_ip_v6_name,
};

use crate::cluster::Expected;
use crate::harness::GATEWAY;

/// Compares `emulator`'s state with `expected` (see `Harness::compare`).
pub fn compare_nrp(emulator: &Emulator, expected: &Expected) -> Result<(), String> {
    compare_gateway(emulator, GATEWAY, expected)
}

/// [`compare_nrp`] for the service gateway `gateway` (every load balancer, NAT gateway and public
/// IP of `emulator` counts: one emulator per gateway).
pub fn compare_gateway(
    emulator: &Emulator,
    gateway: &str,
    expected: &Expected,
) -> Result<(), String> {
    let dump = emulator.dump();
    let empty = Default::default();
    let gw = dump.gateway(gateway).unwrap_or(&empty);
    let mut errors = Vec::new();
    let mut inbound = BTreeSet::new();
    let mut outbound = BTreeSet::new();
    for s in &gw.services {
        if s.service_type.is_inbound() {
            inbound.insert(s.name.clone());
        }
        if s.service_type.is_outbound() {
            outbound.insert(s.name.clone());
        }
    }
    set_diff(&mut errors, "inbound service", &expected.inbound, &inbound);
    set_diff(
        &mut errors,
        "outbound service",
        &expected.outbound,
        &outbound,
    );
    // The readiness filter: an address refers only to services NRP has.
    let nrp_services = gw.service_names();
    let want: BTreeMap<(String, String), BTreeSet<String>> = expected
        .addresses
        .iter()
        .map(|(k, v)| {
            let ready: BTreeSet<String> = v.intersection(&nrp_services).cloned().collect();
            (k.clone(), ready)
        })
        .filter(|(_, v)| !v.is_empty())
        .collect();
    let have = gw.address_map();
    for (k, w) in &want {
        match have.get(k) {
            None => errors.push(format!("missing address {k:?} with {w:?}")),
            Some(h) if h != w => errors.push(format!("address {k:?}: has {h:?}, want {w:?}")),
            Some(_) => {}
        }
    }
    for (k, h) in &have {
        if !want.contains_key(k) {
            errors.push(format!("extra address {k:?} with {h:?}"));
        }
    }
    for l in &gw.address_locations {
        if l.addresses.is_empty() {
            errors.push(format!("empty location {}", l.address_location));
        }
    }
    let lbs: BTreeSet<String> = dump
        .load_balancers
        .iter()
        .filter_map(|r| r.name.clone())
        .collect();
    let want_lbs = expected
        .inbound
        .iter()
        .map(|s| load_balancer_name(s))
        .collect();
    set_diff(&mut errors, "load balancer", &want_lbs, &lbs);
    // The rules of each load balancer whose rules are expected: frontend port → the pods' port.
    for (service, want) in &expected.rules {
        let name = load_balancer_name(service);
        let Some(lb) = dump
            .load_balancers
            .iter()
            .find(|lb| lb.name.as_deref() == Some(name.as_str()))
        else {
            continue; // reported missing above, if it is expected
        };
        let have: BTreeSet<crate::cluster::Rule> = lb
            .properties
            .load_balancing_rules
            .iter()
            .map(|r| {
                let protocol = match r.properties.protocol {
                    Some(clb_nrp::wire::TransportProtocol::Udp) => "udp",
                    Some(clb_nrp::wire::TransportProtocol::Tcp) => "tcp",
                    _ => "other",
                };
                (
                    protocol.to_owned(),
                    r.properties.frontend_port,
                    r.properties.backend_port,
                )
            })
            .collect();
        if &have != want {
            errors.push(format!(
                "load balancer {name}: rules (protocol, frontend port, backend port) {have:?}, want {want:?}"
            ));
        }
    }
    let nats: BTreeSet<String> = dump
        .nat_gateways
        .iter()
        .filter_map(|r| r.name.clone())
        .collect();
    let want_nats = expected
        .outbound
        .iter()
        .map(|s| nat_gateway_name(s))
        .collect();
    set_diff(&mut errors, "NAT gateway", &want_nats, &nats);
    let mut pips: BTreeSet<String> = dump
        .public_ip_addresses
        .iter()
        .filter_map(|r| r.name.clone())
        .collect();
    let mut want_pips: BTreeSet<String> = expected
        .services()
        .iter()
        .map(|s| public_ip_name(s))
        .collect();
    // An egress with IPv6 addresses has an IPv6 public IP too; one without may keep the one it had
    // (it stays when the last IPv6 pod goes).
    let v6_egresses: BTreeSet<&String> = expected
        .addresses
        .iter()
        .filter(|((_, address), _)| address.contains(':'))
        .flat_map(|(_, services)| services)
        .collect();
    for e in &expected.outbound {
        let v6 = public_ip_v6_name(e);
        if v6_egresses.contains(e) {
            want_pips.insert(v6);
        } else {
            pips.remove(&v6);
        }
    }
    set_diff(&mut errors, "public IP", &want_pips, &pips);
    if errors.is_empty() {
        return Ok(());
    }
    let mut msg = format!(
        "NRP differs from the desired state in {} ways (first 30):\n",
        errors.len()
    );
    for e in errors.iter().take(30) {
        let _ = writeln!(msg, "  {e}");
    }
    Err(msg)
}

fn set_diff(
    errors: &mut Vec<String>,
    what: &str,
    want: &BTreeSet<String>,
    have: &BTreeSet<String>,
) {
    for m in want.difference(have) {
        errors.push(format!("missing {what} {m}"));
    }
    for x in have.difference(want) {
        errors.push(format!("extra {what} {x}"));
    }
}
