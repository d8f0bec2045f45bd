//! Observe work (anti-entropy): read the gateway's services and address locations back from NRP and
//! report them as `Observed` parts, split when large. The frontends of the inbound services (the
//! addresses of their public IPs `pip-{name}`, read with one listing), the rules of their load
//! balancers (`lb-{name}`, read with one listing) and the outbound services whose brought NAT
//! gateway is gone (one GET each, `byo::missing`) go in the first part.

use std::collections::HashMap;

use clb_proto::v1::{
    self, AddressChange, LocationChange, NrpSnapshot, Report, ServiceFrontend, ServicePort,
    ServiceRules, report,
};

use super::ctx::{UnitCtx, UnitError, report};
use super::services::{load_balancer_name, public_ip_name};
use clb_nrp::wire::{
    AddressLocation, GatewayService, LoadBalancer, PublicIpAddress, TransportProtocol,
};

/// Builds the snapshot parts: services in the first part, locations packed greedily so that a part
/// carries at most `max_addresses` addresses (a larger location goes alone), each location in exactly
/// one part. There is always at least one part.
pub fn snapshot_parts(
    services: Vec<GatewayService>,
    locations: Vec<AddressLocation>,
    max_addresses: usize,
) -> Vec<NrpSnapshot> {
    let max_addresses = max_addresses.max(1);
    let mut first = NrpSnapshot::default();
    for s in services {
        let t = s.properties.service_type;
        if t.as_ref().is_some_and(|t| t.is_inbound()) {
            first.load_balancers.push(s.name.clone());
        }
        if t.as_ref().is_some_and(|t| t.is_outbound()) {
            first.nat_gateways.push(s.name);
        }
    }
    let mut parts = vec![first];
    let mut addresses = 0usize;
    for l in locations {
        let n = l.addresses.len();
        let current = parts.last_mut().map_or(0, |p| p.locations.len());
        if current > 0 && addresses + n > max_addresses {
            parts.push(NrpSnapshot::default());
            addresses = 0;
        }
        addresses += n;
        let mut change = LocationChange {
            location: l.address_location,
            action: 0,
            addresses: l
                .addresses
                .into_iter()
                .map(|a| AddressChange {
                    address: a.address,
                    services: a.services,
                })
                .collect(),
        };
        change.set_action(v1::AddressUpdateAction::FullUpdate);
        if let Some(part) = parts.last_mut() {
            part.locations.push(change);
        }
    }
    parts
}

/// The frontends of the inbound services `inbound` among the public IPs `pips`: each service's public
/// IP `pip-{name}` (matched case-insensitively) with its address, sorted by service. A service whose
/// public IP is missing or has no address yet has no frontend.
pub fn frontends_of(inbound: &[String], pips: &[PublicIpAddress]) -> Vec<ServiceFrontend> {
    let by_pip: HashMap<String, &str> = inbound
        .iter()
        .map(|s| (public_ip_name(s).to_ascii_lowercase(), s.as_str()))
        .collect();
    let mut frontends: Vec<ServiceFrontend> = pips
        .iter()
        .filter_map(|p| {
            let service = by_pip.get(&p.name.as_deref()?.to_ascii_lowercase())?;
            let ip = p.properties.ip_address.as_deref()?.trim();
            (!ip.is_empty()).then(|| ServiceFrontend {
                service: (*service).to_owned(),
                ip: ip.to_owned(),
            })
        })
        .collect();
    frontends.sort_by(|a, b| a.service.cmp(&b.service));
    frontends.dedup_by(|a, b| a.service == b.service);
    frontends
}

/// The load balancing rules of the inbound services `inbound` among the load balancers `lbs`: for
/// each service whose load balancer `lb-{name}` (matched case-insensitively) is among them, its
/// rules as (frontend port, protocol, backend port as the target port), sorted by service. A rule of
/// protocol `All` (or none) has `PROTOCOL_UNSPECIFIED`. A service whose load balancer is missing has no entry.
pub fn rules_of(inbound: &[String], lbs: &[LoadBalancer]) -> Vec<ServiceRules> {
    let by_lb: HashMap<String, &str> = inbound
        .iter()
        .map(|s| (load_balancer_name(s).to_ascii_lowercase(), s.as_str()))
        .collect();
    let mut rules: Vec<ServiceRules> = lbs
        .iter()
        .filter_map(|lb| {
            let service = by_lb.get(&lb.name.as_deref()?.to_ascii_lowercase())?;
            let ports = lb
                .properties
                .load_balancing_rules
                .iter()
                .map(|r| {
                    let protocol = match r.properties.protocol {
                        Some(TransportProtocol::Tcp) => v1::Protocol::Tcp,
                        Some(TransportProtocol::Udp) => v1::Protocol::Udp,
                        Some(TransportProtocol::All) | None => v1::Protocol::Unspecified,
                    };
                    ServicePort {
                        port: u32::from(r.properties.frontend_port),
                        protocol: protocol as i32,
                        target_port: u32::from(r.properties.backend_port),
                    }
                })
                .collect();
            Some(ServiceRules {
                service: (*service).to_owned(),
                ports,
                settings: None,
            })
        })
        .collect();
    rules.sort_by(|a, b| a.service.cmp(&b.service));
    rules.dedup_by(|a, b| a.service == b.service);
    rules
}

/// A gateway that does not exist has no services and no locations.
fn empty_if_missing<T>(result: Result<Vec<T>, UnitError>) -> Result<Vec<T>, UnitError> {
    match result {
        Err(e) if e.is_not_found() => Ok(Vec::new()),
        r => r,
    }
}

/// Reads the gateway back and returns the report parts (the last one with `last = true`), or one
/// failure report.
pub(crate) async fn execute(ctx: &UnitCtx<'_>, work_id: u64) -> Vec<Report> {
    let read = async {
        let services = empty_if_missing(
            ctx.read(|o| ctx.nrp().list_services(ctx.resource(), o))
                .await,
        )?;
        let locations = empty_if_missing(
            ctx.read(|o| ctx.nrp().list_address_locations(ctx.resource(), o))
                .await,
        )?;
        let inbound: Vec<String> = services
            .iter()
            .filter(|s| {
                s.properties
                    .service_type
                    .as_ref()
                    .is_some_and(|t| t.is_inbound())
            })
            .map(|s| s.name.clone())
            .collect();
        let (pips, lbs) = if inbound.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            let names: Vec<String> = inbound.iter().map(|s| public_ip_name(s)).collect();
            let pips = empty_if_missing(ctx.read(|o| ctx.nrp().find_public_ips(&names, o)).await)?;
            let names: Vec<String> = inbound.iter().map(|s| load_balancer_name(s)).collect();
            let lbs =
                empty_if_missing(ctx.read(|o| ctx.nrp().find_load_balancers(&names, o)).await)?;
            (pips, lbs)
        };
        let frontends = frontends_of(&inbound, &pips);
        let rules = rules_of(&inbound, &lbs);
        let missing = super::byo::missing(ctx, &services).await;
        Ok::<_, UnitError>((services, locations, frontends, rules, missing))
    };
    match read.await {
        Ok((services, locations, frontends, rules, missing)) => {
            let mut parts = snapshot_parts(
                services,
                locations,
                ctx.env.config.limits.max_addresses_per_report,
            );
            if let Some(first) = parts.first_mut() {
                first.frontends = frontends;
                first.rules = rules;
                first.missing_nat_gateways = missing;
            }
            let n = parts.len();
            tracing::debug!(parts = n, "observed");
            parts
                .into_iter()
                .enumerate()
                .map(|(i, snapshot)| {
                    report(
                        work_id,
                        Vec::new(),
                        report::Outcome::Observed(v1::Observed {
                            snapshot: Some(snapshot),
                            last: i + 1 == n,
                        }),
                    )
                })
                .collect()
        }
        Err(e) => {
            tracing::warn!(error = ?e, "observe failed");
            vec![report(work_id, Vec::new(), e.outcome())]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clb_nrp::wire::GatewayAddress;

    fn loc(name: &str, n: usize) -> AddressLocation {
        AddressLocation {
            address_location: name.into(),
            addresses: (0..n)
                .map(|i| GatewayAddress {
                    address: format!("10.1.0.{i}"),
                    services: vec!["a".into()],
                })
                .collect(),
        }
    }

    #[test]
    fn splits_by_addresses_without_splitting_locations() {
        let services = vec![
            GatewayService::inbound("a", "/x/backendAddressPools/p"),
            GatewayService::outbound("e", "/n"),
        ];
        let parts = snapshot_parts(
            services,
            vec![loc("1", 3), loc("2", 3), loc("3", 9), loc("4", 1)],
            6,
        );
        let shape: Vec<Vec<usize>> = parts
            .iter()
            .map(|p| p.locations.iter().map(|l| l.addresses.len()).collect())
            .collect();
        assert_eq!(shape, vec![vec![3, 3], vec![9], vec![1]]);
        assert_eq!(parts[0].load_balancers, vec!["a"]);
        assert_eq!(parts[0].nat_gateways, vec!["e"]);
        assert!(parts[1].load_balancers.is_empty());
        assert_eq!(
            parts[0].locations[0].action(),
            v1::AddressUpdateAction::FullUpdate
        );
        assert_eq!(snapshot_parts(Vec::new(), Vec::new(), 6).len(), 1);
    }

    fn pip(name: &str, ip: Option<&str>) -> PublicIpAddress {
        let mut p = PublicIpAddress {
            name: Some(name.into()),
            ..Default::default()
        };
        p.properties.ip_address = ip.map(str::to_owned);
        p
    }

    #[test]
    fn frontends_are_the_addresses_of_the_inbound_services_public_ips() {
        let inbound = vec![
            "svc-b".to_string(),
            "svc-a".to_string(),
            "svc-c".to_string(),
        ];
        let pips = vec![
            pip("PIP-svc-a", Some("20.0.0.1")),
            pip("pip-svc-b", Some("2001:db8:c1b::1")),
            pip("pip-svc-c", None),
            pip("pip-egress-e", Some("20.0.0.3")),
            pip("other", Some("20.0.0.4")),
        ];
        let got: Vec<(String, String)> = frontends_of(&inbound, &pips)
            .into_iter()
            .map(|f| (f.service, f.ip))
            .collect();
        assert_eq!(
            got,
            vec![
                ("svc-a".to_string(), "20.0.0.1".to_string()),
                ("svc-b".to_string(), "2001:db8:c1b::1".to_string()),
            ]
        );
        assert!(frontends_of(&[], &pips).is_empty());
    }

    #[test]
    fn rules_are_the_ports_of_the_inbound_services_load_balancers() {
        use clb_nrp::wire::{ResourceId, ResourceKind};
        let lb = |name: &str, rules: &[(&'static str, u16, u16)]| {
            let id = ResourceId::new("s", "rg", ResourceKind::LoadBalancer, name);
            let mut lb = super::super::services::load_balancer(&id, "eastus", "/p", rules.to_vec());
            lb.name = Some(name.into());
            lb
        };
        // A rule for all protocols (HA ports), which no desired port can match.
        let mut all = lb("lb-svc-c", &[("tcp", 1, 1)]);
        let rule = &mut all.properties.load_balancing_rules[0].properties;
        rule.protocol = Some(TransportProtocol::All);
        rule.frontend_port = 0;
        rule.backend_port = 0;
        let lbs = vec![
            lb("lb-svc-b", &[]),
            lb("LB-svc-a", &[("udp", 53, 53), ("tcp", 80, 8080)]),
            all,
            lb("lb-other", &[("tcp", 1, 1)]),
        ];
        let inbound = vec![
            "svc-a".to_string(),
            "svc-b".to_string(),
            "svc-c".to_string(),
            "svc-d".to_string(),
        ];
        // (service, (frontend port, protocol, backend port) of each rule)
        type Rules = (String, Vec<(u32, v1::Protocol, u32)>);
        let got: Vec<Rules> = rules_of(&inbound, &lbs)
            .into_iter()
            .map(|r| {
                let mut ports: Vec<_> = r
                    .ports
                    .iter()
                    .map(|p| (p.port, p.protocol(), p.target_port))
                    .collect();
                ports.sort();
                (r.service, ports)
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "svc-a".to_string(),
                    vec![(53, v1::Protocol::Udp, 53), (80, v1::Protocol::Tcp, 8080)]
                ),
                ("svc-b".to_string(), vec![]),
                ("svc-c".to_string(), vec![(0, v1::Protocol::Unspecified, 0)]),
            ],
            "svc-d has no load balancer: no entry"
        );
        assert!(rules_of(&[], &lbs).is_empty());
    }
}
