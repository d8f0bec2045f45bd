//! Observe work (anti-entropy): read the gateway's services and address locations back from NRP and
//! report them as `Observed` parts, split when large. The rules and settings of the inbound
//! services' load balancers (`lb-{name}`, read with one listing), their frontends (the addresses of
//! the public IPs their load balancers' frontends name: clb's own `pip-{name}` and brought ones of
//! the gateway's resource group read with one listing, brought ones elsewhere with one GET each)
//! and the outbound services whose brought NAT gateway is gone (one GET each, `byo::missing`) go in
//! the first part.

use std::collections::HashMap;

use clb_proto::v1::{
    self, AddressChange, LocationChange, NrpSnapshot, Report, ServiceFrontend, ServicePort,
    ServiceRules, report,
};

use super::ctx::{UnitCtx, UnitError, report};
use super::inbound::observed_settings;
use super::services::{load_balancer_name, public_ip_name};
use clb_nrp::wire::{
    AddressLocation, GatewayService, LoadBalancer, PublicIpAddress, ResourceId, TransportProtocol,
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
                    service_ids: a.services,
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

/// The public IP of the frontend of each load balancer among `lbs` (by lower-cased load balancer
/// name): the id its first public frontend names.
fn frontend_ids(lbs: &[LoadBalancer]) -> HashMap<String, &str> {
    lbs.iter()
        .filter_map(|lb| {
            let pip = lb
                .properties
                .frontend_ip_configurations
                .iter()
                .find_map(|f| f.properties.public_ip_address.as_ref())?;
            Some((lb.name.as_deref()?.to_ascii_lowercase(), pip.id.as_str()))
        })
        .collect()
}

/// The public IP of service `service`'s frontend among `pips`: the one its load balancer's frontend
/// names (matched by id, case-insensitively), clb's own `pip-{service}` (by name) when its load
/// balancer is not among `lbs` or has no public frontend.
fn frontend_pip<'a>(
    service: &str,
    frontends: &HashMap<String, &str>,
    pips: &'a [PublicIpAddress],
) -> Option<&'a PublicIpAddress> {
    match frontends.get(&load_balancer_name(service).to_ascii_lowercase()) {
        Some(id) => pips.iter().find(|p| {
            p.id.as_deref()
                .is_some_and(|pid| pid.eq_ignore_ascii_case(id))
        }),
        None => {
            let own = public_ip_name(service);
            pips.iter().find(|p| {
                p.name
                    .as_deref()
                    .is_some_and(|n| n.eq_ignore_ascii_case(&own))
            })
        }
    }
}

/// The frontends of the inbound services `inbound`: each service's address is that of the public IP
/// its load balancer `lb-{name}` (among `lbs`) has on its frontend — clb's own `pip-{name}` or a
/// brought one — found among `pips`; a service whose load balancer is not among `lbs` falls back to
/// `pip-{name}`. Sorted by service. A service whose public IP is missing or has no address yet has
/// no frontend.
pub fn frontends_of(
    inbound: &[String],
    lbs: &[LoadBalancer],
    pips: &[PublicIpAddress],
) -> Vec<ServiceFrontend> {
    let frontends = frontend_ids(lbs);
    let mut out: Vec<ServiceFrontend> = inbound
        .iter()
        .filter_map(|s| {
            let p = frontend_pip(s, &frontends, pips)?;
            let ip = p.properties.ip_address.as_deref()?.trim();
            (!ip.is_empty()).then(|| ServiceFrontend {
                service_id: s.clone(),
                ip: ip.to_owned(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.service_id.cmp(&b.service_id));
    out.dedup_by(|a, b| a.service_id == b.service_id);
    out
}

/// The load balancing rules of the inbound services `inbound` among the load balancers `lbs`: for
/// each service whose load balancer `lb-{name}` (matched case-insensitively) is among them, its
/// rules as (frontend port, protocol, backend port as the target port), and its settings
/// ([`observed_settings`], with its frontend's public IP among `pips`), sorted by service. A rule of
/// protocol `All` (or none) has `PROTOCOL_UNSPECIFIED`. A service whose load balancer is missing has
/// no entry.
pub fn rules_of(
    inbound: &[String],
    lbs: &[LoadBalancer],
    pips: &[PublicIpAddress],
) -> Vec<ServiceRules> {
    let by_lb: HashMap<String, &str> = inbound
        .iter()
        .map(|s| (load_balancer_name(s).to_ascii_lowercase(), s.as_str()))
        .collect();
    let frontends = frontend_ids(lbs);
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
            let pip = frontend_pip(service, &frontends, pips);
            Some(ServiceRules {
                service_id: (*service).to_owned(),
                ports,
                settings: Some(observed_settings(service, lb, pip)),
            })
        })
        .collect();
    rules.sort_by(|a, b| a.service_id.cmp(&b.service_id));
    rules.dedup_by(|a, b| a.service_id == b.service_id);
    rules
}

/// The public IP a load balancer's frontend names, and whether it is in the load balancer's
/// resource group.
fn frontend_public_ip(lb: &LoadBalancer) -> Option<(ResourceId, bool)> {
    let lb_rg = ResourceId::parse(lb.id.as_deref()?).ok()?.resource_group;
    let pip = lb
        .properties
        .frontend_ip_configurations
        .iter()
        .find_map(|f| f.properties.public_ip_address.as_ref())?;
    let pip = ResourceId::parse(&pip.id).ok()?;
    let here = pip.resource_group.eq_ignore_ascii_case(&lb_rg);
    Some((pip, here))
}

/// The public IPs the frontends of `lbs` name outside the resource group of their load balancer
/// (brought ones), as `(resource group, name)`, deduplicated.
fn public_ips_elsewhere(lbs: &[LoadBalancer]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = lbs
        .iter()
        .filter_map(frontend_public_ip)
        .filter(|(_, here)| !here)
        .map(|(pip, _)| {
            (
                pip.resource_group.to_ascii_lowercase(),
                pip.name.to_ascii_lowercase(),
            )
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The names of the public IPs the frontends of `lbs` name in the resource group of their load
/// balancer (clb's own and brought ones there).
fn public_ips_here(lbs: &[LoadBalancer]) -> Vec<String> {
    lbs.iter()
        .filter_map(frontend_public_ip)
        .filter(|(_, here)| *here)
        .map(|(pip, _)| pip.name)
        .collect()
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
            let names: Vec<String> = inbound.iter().map(|s| load_balancer_name(s)).collect();
            let lbs =
                empty_if_missing(ctx.read(|o| ctx.nrp().find_load_balancers(&names, o)).await)?;
            // clb's own public IPs and those brought from the gateway's resource group: one
            // listing; brought ones elsewhere: one GET each.
            let mut names: Vec<String> = inbound.iter().map(|s| public_ip_name(s)).collect();
            names.extend(public_ips_here(&lbs));
            names.sort_by_key(|n| n.to_ascii_lowercase());
            names.dedup_by(|a, b| a.eq_ignore_ascii_case(b));
            let mut pips =
                empty_if_missing(ctx.read(|o| ctx.nrp().find_public_ips(&names, o)).await)?;
            for (rg, name) in public_ips_elsewhere(&lbs) {
                match ctx
                    .read(|o| ctx.nrp().get_public_ip_in(&rg, &name, o))
                    .await
                {
                    Ok(p) => pips.push(p),
                    Err(e) if e.is_not_found() => {}
                    Err(e) => {
                        // Its service's frontend and brought address are left out, not the
                        // whole observe.
                        tracing::warn!(public_ip = %name, resource_group = %rg, error = ?e,
                            "reading a brought public IP back failed");
                    }
                }
            }
            (pips, lbs)
        };
        let frontends = frontends_of(&inbound, &lbs, &pips);
        let rules = rules_of(&inbound, &lbs, &pips);
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
        let got: Vec<(String, String)> = frontends_of(&inbound, &[], &pips)
            .into_iter()
            .map(|f| (f.service_id, f.ip))
            .collect();
        assert_eq!(
            got,
            vec![
                ("svc-a".to_string(), "20.0.0.1".to_string()),
                ("svc-b".to_string(), "2001:db8:c1b::1".to_string()),
            ]
        );
        assert!(frontends_of(&[], &[], &pips).is_empty());
    }

    fn pip_in(rg: &str, name: &str, ip: &str) -> PublicIpAddress {
        let mut p = pip(name, Some(ip));
        p.id = Some(
            ResourceId::new("s", rg, clb_nrp::wire::ResourceKind::PublicIpAddress, name)
                .to_string(),
        );
        p
    }

    fn lb_on(
        service: &str,
        pip: &PublicIpAddress,
        rules: &[(&'static str, u16, u16)],
    ) -> LoadBalancer {
        use clb_nrp::wire::ResourceKind;
        let id = ResourceId::new(
            "s",
            "rg",
            ResourceKind::LoadBalancer,
            load_balancer_name(service),
        );
        let mut lb = super::super::services::load_balancer(
            &id,
            "eastus",
            pip.id.as_deref().unwrap(),
            rules.to_vec(),
            &super::super::inbound::RuleSettings::default(),
        );
        lb.id = Some(id.to_string());
        lb.name = Some(id.name.clone());
        lb
    }

    #[test]
    fn frontends_follow_the_load_balancer_s_public_ip() {
        // svc-a brought a public IP of another resource group; svc-b one of the gateway's; svc-c
        // has clb's own; svc-d's load balancer names a public IP that is gone (no frontend, even
        // though a pip-svc-d is there); svc-e has no load balancer (clb's own, by name).
        let brought_a = pip_in("rg-ip", "mine-a", "20.1.0.1");
        let brought_b = pip_in("rg", "mine-b", "20.1.0.2");
        let own_c = pip_in("rg", "pip-svc-c", "20.0.0.3");
        let gone_d = pip_in("rg", "gone-d", "20.9.9.9");
        let stale_d = pip_in("rg", "pip-svc-d", "20.0.0.4");
        let own_e = pip_in("rg", "pip-svc-e", "20.0.0.5");
        let lbs = vec![
            lb_on("svc-a", &brought_a, &[("tcp", 80, 80)]),
            lb_on("svc-b", &brought_b, &[]),
            lb_on("svc-c", &own_c, &[]),
            lb_on("svc-d", &gone_d, &[]),
        ];
        let pips = vec![
            own_c.clone(),
            brought_b.clone(),
            brought_a.clone(),
            stale_d,
            own_e,
        ];
        let inbound: Vec<String> = ["svc-a", "svc-b", "svc-c", "svc-d", "svc-e"]
            .map(String::from)
            .to_vec();
        let got: Vec<(String, String)> = frontends_of(&inbound, &lbs, &pips)
            .into_iter()
            .map(|f| (f.service_id, f.ip))
            .collect();
        let want: Vec<(String, String)> = [
            ("svc-a", "20.1.0.1"),
            ("svc-b", "20.1.0.2"),
            ("svc-c", "20.0.0.3"),
            ("svc-e", "20.0.0.5"),
        ]
        .map(|(s, ip)| (s.to_string(), ip.to_string()))
        .to_vec();
        assert_eq!(got, want);
        // What the observe reads: pip-{name} and the gateway's resource group's brought ones in
        // one listing, the others one by one.
        assert_eq!(public_ips_here(&lbs), ["mine-b", "pip-svc-c", "gone-d"]);
        assert_eq!(
            public_ips_elsewhere(&lbs),
            [("rg-ip".to_string(), "mine-a".to_string())]
        );
        // The settings say which public IP is brought, and clb's own's DNS label.
        let rules = rules_of(&inbound, &lbs, &pips);
        let settings = |s: &str| {
            rules
                .iter()
                .find(|r| r.service_id == s)
                .and_then(|r| r.settings.clone())
                .unwrap()
        };
        let a = settings("svc-a").brought_public_ip.unwrap();
        assert_eq!(
            (
                a.name.as_str(),
                a.resource_group.as_str(),
                a.address.as_str()
            ),
            ("mine-a", "rg-ip", "20.1.0.1")
        );
        let b = settings("svc-b").brought_public_ip.unwrap();
        assert_eq!(
            (
                b.name.as_str(),
                b.resource_group.as_str(),
                b.address.as_str()
            ),
            ("mine-b", "", "20.1.0.2"),
            "the gateway's resource group is empty"
        );
        assert!(settings("svc-c").brought_public_ip.is_none());
        let d = settings("svc-d").brought_public_ip.unwrap();
        assert_eq!((d.name.as_str(), d.address.as_str()), ("gone-d", ""));
    }

    #[test]
    fn rules_are_the_ports_of_the_inbound_services_load_balancers() {
        use clb_nrp::wire::{ResourceId, ResourceKind};
        let lb = |name: &str, rules: &[(&'static str, u16, u16)]| {
            let id = ResourceId::new("s", "rg", ResourceKind::LoadBalancer, name);
            let mut lb = super::super::services::load_balancer(
                &id,
                "eastus",
                "/p",
                rules.to_vec(),
                &super::super::inbound::RuleSettings::default(),
            );
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
        let got: Vec<Rules> = rules_of(&inbound, &lbs, &[])
            .into_iter()
            .map(|r| {
                let mut ports: Vec<_> = r
                    .ports
                    .iter()
                    .map(|p| (p.port, p.protocol(), p.target_port))
                    .collect();
                ports.sort();
                (r.service_id, ports)
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
        assert!(rules_of(&[], &lbs, &[]).is_empty());
    }
}
