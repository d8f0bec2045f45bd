//! A load balancer's settings (`LoadBalancerSettings`) to and from the domain's [`LbSettings`]:
//! a writer's are checked here, at the edge, so that what reaches NRP is what Azure takes
//! (a bad value is refused with its field, never sent to fail in a worker); a worker's read-back is
//! taken as it comes.

use std::net::IpAddr;

use clb_core::difftracker::IpFamily;
use clb_core::gateway::lb::DEFAULT_IDLE_TIMEOUT_MINUTES;
use clb_core::gateway::update::Fault;
use clb_core::gateway::{Frontend, LbSettings};
use clb_proto::azure_names::{
    MAX_IDLE_TIMEOUT_MINUTES, dns_label_error, resource_group_error, resource_name_error,
};
use clb_proto::v1;

fn fault(field: &str, value: impl Into<String>, reason: impl Into<String>) -> Fault {
    Fault::Field {
        field: format!("service.settings.{field}"),
        value: value.into(),
        reason: reason.into(),
    }
}

/// A writer's settings of an inbound service of `family` (`None`: unstated, an IPv4 frontend),
/// checked. Unset settings are the defaults.
pub fn settings_from_proto(
    settings: Option<&v1::LoadBalancerSettings>,
    family: Option<IpFamily>,
) -> Result<LbSettings, Fault> {
    let Some(s) = settings else {
        return Ok(LbSettings::default());
    };
    if s.idle_timeout_minutes != 0
        && !(DEFAULT_IDLE_TIMEOUT_MINUTES..=MAX_IDLE_TIMEOUT_MINUTES)
            .contains(&s.idle_timeout_minutes)
    {
        return Err(fault(
            "idle_timeout_minutes",
            s.idle_timeout_minutes.to_string(),
            format!(
                "out of range: Azure's Container Load Balancer takes {DEFAULT_IDLE_TIMEOUT_MINUTES} \
                 to {MAX_IDLE_TIMEOUT_MINUTES} minutes (or 0 for the default, \
                 {DEFAULT_IDLE_TIMEOUT_MINUTES})"
            ),
        ));
    }
    let source_ip_affinity = match v1::LoadDistribution::try_from(s.load_distribution) {
        Ok(v1::LoadDistribution::Unspecified) => false,
        Ok(v1::LoadDistribution::SourceIp) => true,
        Err(_) => {
            return Err(fault(
                "load_distribution",
                s.load_distribution.to_string(),
                "unknown load distribution: must be LOAD_DISTRIBUTION_SOURCE_IP (or unset)",
            ));
        }
    };
    let frontend = match (&s.brought_public_ip, s.dns_label.as_str()) {
        (None, "") => Frontend::Default,
        (None, label) => {
            if let Some(why) = dns_label_error(label) {
                return Err(fault("dns_label", label, why));
            }
            Frontend::Own {
                dns_label: Some(label.to_owned()),
            }
        }
        (Some(_), label) if !label.is_empty() => {
            return Err(fault(
                "dns_label",
                label,
                "cannot be set with brought_public_ip: clb changes nothing of a public IP its \
                 owner brings (set the label on that public IP in Azure)",
            ));
        }
        (Some(b), _) => brought(b, family)?,
    };
    Ok(LbSettings {
        idle_timeout_minutes: s.idle_timeout_minutes,
        disable_tcp_reset: s.disable_tcp_reset,
        source_ip_affinity,
        frontend,
    })
}

fn brought(b: &v1::BroughtPublicIp, family: Option<IpFamily>) -> Result<Frontend, Fault> {
    match (b.name.as_str(), b.address.as_str()) {
        ("", "") => Err(fault(
            "brought_public_ip",
            "",
            "names no public IP: set its name or its address",
        )),
        (name, address) if !name.is_empty() && !address.is_empty() => Err(fault(
            "brought_public_ip.address",
            address,
            format!("cannot be set with name {name:?}: name the public IP one way"),
        )),
        ("", address) => {
            if !b.resource_group.is_empty() {
                return Err(fault(
                    "brought_public_ip.resource_group",
                    &b.resource_group,
                    "only with name: a public IP named by its address is looked up in the \
                     gateway's resource group",
                ));
            }
            let ip: IpAddr = address.parse().map_err(|_| {
                fault(
                    "brought_public_ip.address",
                    address,
                    "is not an IPv4 or IPv6 address",
                )
            })?;
            let want_v6 = family == Some(IpFamily::V6);
            if ip.is_ipv6() != want_v6 {
                return Err(fault(
                    "brought_public_ip.address",
                    address,
                    format!(
                        "is an {} address, but the service is {}",
                        if ip.is_ipv6() { "IPv6" } else { "IPv4" },
                        if want_v6 { "IPv6" } else { "IPv4" }
                    ),
                ));
            }
            Ok(Frontend::Brought {
                name: None,
                resource_group: None,
                address: Some(ip),
            })
        }
        (name, _) => {
            if let Some(why) = resource_name_error(name) {
                return Err(fault("brought_public_ip.name", name, why));
            }
            let resource_group = match b.resource_group.as_str() {
                "" => None,
                rg => {
                    if let Some(why) = resource_group_error(rg) {
                        return Err(fault("brought_public_ip.resource_group", rg, why));
                    }
                    Some(rg.to_owned())
                }
            };
            Ok(Frontend::Brought {
                name: Some(name.to_owned()),
                resource_group,
                address: None,
            })
        }
    }
}

/// Settings as the proto carries them (to a worker, or in a service's state).
pub fn settings_to_proto(s: &LbSettings) -> v1::LoadBalancerSettings {
    let (brought_public_ip, dns_label) = match &s.frontend {
        Frontend::Default => (None, String::new()),
        Frontend::Own { dns_label } => (None, dns_label.clone().unwrap_or_default()),
        Frontend::Brought {
            name,
            resource_group,
            address,
        } => (
            Some(v1::BroughtPublicIp {
                name: name.clone().unwrap_or_default(),
                resource_group: resource_group.clone().unwrap_or_default(),
                address: address.map(|a| a.to_string()).unwrap_or_default(),
            }),
            String::new(),
        ),
    };
    v1::LoadBalancerSettings {
        idle_timeout_minutes: s.idle_timeout_minutes,
        disable_tcp_reset: s.disable_tcp_reset,
        load_distribution: if s.source_ip_affinity {
            v1::LoadDistribution::SourceIp
        } else {
            v1::LoadDistribution::Unspecified
        } as i32,
        brought_public_ip,
        dns_label,
    }
}

/// Settings as a worker read them back (`ServiceRules.settings`), in the domain's terms; `None`
/// when the worker did not report them (only the ports are compared then). Taken as read: an
/// unknown load distribution is a 5-tuple one, an address that does not parse is none.
pub fn observed_settings_from_proto(s: Option<&v1::LoadBalancerSettings>) -> Option<LbSettings> {
    let s = s?;
    let frontend = match &s.brought_public_ip {
        Some(b) => Frontend::Brought {
            name: Some(b.name.clone()).filter(|n| !n.is_empty()),
            resource_group: Some(b.resource_group.clone()).filter(|g| !g.is_empty()),
            address: b.address.parse().ok(),
        },
        None => Frontend::Own {
            dns_label: Some(s.dns_label.clone()).filter(|l| !l.is_empty()),
        },
    };
    Some(LbSettings {
        idle_timeout_minutes: s.idle_timeout_minutes,
        disable_tcp_reset: s.disable_tcp_reset,
        source_ip_affinity: s.load_distribution == v1::LoadDistribution::SourceIp as i32,
        frontend,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(s: v1::LoadBalancerSettings) -> Result<LbSettings, (String, String, String)> {
        settings_from_proto(Some(&s), Some(IpFamily::V4)).map_err(|f| match f {
            Fault::Field {
                field,
                value,
                reason,
            } => (field, value, reason),
            other => panic!("{other:?}"),
        })
    }

    #[test]
    fn every_bad_setting_is_refused_with_its_field_and_value() {
        let bad = [
            (
                v1::LoadBalancerSettings {
                    idle_timeout_minutes: 3,
                    ..Default::default()
                },
                "service.settings.idle_timeout_minutes",
                "3",
            ),
            (
                v1::LoadBalancerSettings {
                    idle_timeout_minutes: 31,
                    ..Default::default()
                },
                "service.settings.idle_timeout_minutes",
                "31",
            ),
            (
                v1::LoadBalancerSettings {
                    load_distribution: 7,
                    ..Default::default()
                },
                "service.settings.load_distribution",
                "7",
            ),
            (
                v1::LoadBalancerSettings {
                    dns_label: "Shop".into(),
                    ..Default::default()
                },
                "service.settings.dns_label",
                "Shop",
            ),
            (
                v1::LoadBalancerSettings {
                    dns_label: "shop".into(),
                    brought_public_ip: Some(v1::BroughtPublicIp {
                        name: "mine".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                "service.settings.dns_label",
                "shop",
            ),
            (
                v1::LoadBalancerSettings {
                    brought_public_ip: Some(v1::BroughtPublicIp::default()),
                    ..Default::default()
                },
                "service.settings.brought_public_ip",
                "",
            ),
            (
                v1::LoadBalancerSettings {
                    brought_public_ip: Some(v1::BroughtPublicIp {
                        address: "2001:db8::1".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                "service.settings.brought_public_ip.address",
                "2001:db8::1",
            ),
            (
                v1::LoadBalancerSettings {
                    brought_public_ip: Some(v1::BroughtPublicIp {
                        address: "20.1.2.3".into(),
                        resource_group: "rg".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                "service.settings.brought_public_ip.resource_group",
                "rg",
            ),
            (
                v1::LoadBalancerSettings {
                    brought_public_ip: Some(v1::BroughtPublicIp {
                        name: "my ip".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                "service.settings.brought_public_ip.name",
                "my ip",
            ),
        ];
        for (s, field, value) in bad {
            let (f, v, reason) = check(s).unwrap_err();
            assert_eq!((f.as_str(), v.as_str()), (field, value), "{reason}");
            assert!(!reason.is_empty());
        }
    }

    #[test]
    fn good_settings_round_trip() {
        let good = [
            v1::LoadBalancerSettings {
                idle_timeout_minutes: 30,
                disable_tcp_reset: true,
                load_distribution: v1::LoadDistribution::SourceIp as i32,
                dns_label: "shop-1".into(),
                ..Default::default()
            },
            v1::LoadBalancerSettings {
                brought_public_ip: Some(v1::BroughtPublicIp {
                    name: "my-ip".into(),
                    resource_group: "rg-ips".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            v1::LoadBalancerSettings {
                brought_public_ip: Some(v1::BroughtPublicIp {
                    address: "20.1.2.3".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ];
        for s in good {
            let domain = check(s.clone()).unwrap();
            assert_eq!(settings_to_proto(&domain), s);
            assert_eq!(
                observed_settings_from_proto(Some(&s)).as_ref(),
                Some(&domain)
            );
        }
        assert_eq!(
            settings_from_proto(None, None).unwrap(),
            LbSettings::default()
        );
    }
}
