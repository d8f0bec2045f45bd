//! The load balancer of an inbound service as the book keeps it: its rules' ports and settings and
//! its frontend's public IP ([`LbSpec`]), and when what NRP has satisfies what is desired
//! ([`LbSpec::differs_from`]). The desired spec comes from the writers (the state server validates
//! it at its edge); the programmed one from a creation's report (what the unit carried) or a
//! read-back (what NRP has, in the same terms).

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::{Port, Protocol};

/// The idle timeout of a rule when none is set, in minutes (Azure's default).
pub const DEFAULT_IDLE_TIMEOUT_MINUTES: u32 = 4;

/// Where the frontend's public IP comes from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Frontend {
    /// A public IP clb creates and owns (`pip-{name}`), with a DNS label or none.
    Own {
        /// Its `dnsSettings.domainNameLabel`.
        dns_label: Option<String>,
    },
    /// A public IP its owner brings: named by name (and resource group) or by address when desired;
    /// as read back, everything NRP told of it.
    Brought {
        /// Its name.
        name: Option<String>,
        /// Its resource group; `None`: the gateway's.
        resource_group: Option<String>,
        /// Its address.
        address: Option<IpAddr>,
    },
    /// Nothing stated (the default): as [`Frontend::Own`] without a label.
    #[default]
    Default,
}

impl Frontend {
    fn normalized(&self) -> Frontend {
        match self {
            Frontend::Default => Frontend::Own { dns_label: None },
            f => f.clone(),
        }
    }

    /// Whether the frontend `self` (as NRP has it) is the one `want` asks for.
    fn satisfies(&self, want: &Frontend) -> bool {
        let eq = |a: &Option<String>, b: &Option<String>| match (a, b) {
            (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
            (None, None) => true,
            _ => false,
        };
        match (self.normalized(), want.normalized()) {
            (Frontend::Own { dns_label: have }, Frontend::Own { dns_label: want }) => {
                eq(&have, &want)
            }
            (
                Frontend::Brought {
                    name: have_name,
                    resource_group: have_rg,
                    address: have_ip,
                },
                Frontend::Brought {
                    name: want_name,
                    resource_group: want_rg,
                    address: want_ip,
                },
            ) => match (&want_name, want_ip) {
                // A read-back names the gateway's resource group `None`: a desired group that is
                // named may be that one, which only the worker knows, so it is taken as matching
                // (a writer's change of it is still compared with what the creation carried).
                (Some(_), _) => {
                    eq(&have_name, &want_name) && (have_rg.is_none() || eq(&have_rg, &want_rg))
                }
                (None, Some(ip)) => have_ip == Some(ip),
                (None, None) => false,
            },
            _ => false,
        }
    }
}

/// The settings of an inbound service's load balancer beside its ports.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LbSettings {
    /// The rules' idle timeout in minutes; 0: the default ([`DEFAULT_IDLE_TIMEOUT_MINUTES`]).
    pub idle_timeout_minutes: u32,
    /// TCP reset on idle turned off (it is on by default).
    pub disable_tcp_reset: bool,
    /// Connections spread by source IP (client affinity) rather than by 5-tuple.
    pub source_ip_affinity: bool,
    /// The frontend's public IP.
    pub frontend: Frontend,
}

impl LbSettings {
    fn idle_timeout(&self) -> u32 {
        match self.idle_timeout_minutes {
            0 => DEFAULT_IDLE_TIMEOUT_MINUTES,
            n => n,
        }
    }

    /// Whether the settings `self` (as NRP has them) are those `want` asks for, with `ports` the
    /// rules: TCP reset is a setting of TCP rules only.
    fn satisfies(&self, want: &LbSettings, ports: &[Port]) -> bool {
        let has_tcp = ports.iter().any(|p| p.protocol == Protocol::Tcp);
        self.idle_timeout() == want.idle_timeout()
            && (!has_tcp || self.disable_tcp_reset == want.disable_tcp_reset)
            && self.source_ip_affinity == want.source_ip_affinity
            && self.frontend.satisfies(&want.frontend)
    }
}

/// An inbound service's load balancer: its ports and, where known, its settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LbSpec {
    /// The rules' ports.
    pub ports: Vec<Port>,
    /// The settings; `None`: not known (a read-back that did not report them), so only the ports
    /// are compared.
    pub settings: Option<LbSettings>,
}

/// Ports as a set of (protocol, port, backend port): the order and repetition of a list do not
/// change the rules, and a target port of 0 is the port itself, so a change of the target port
/// re-creates the rules as a port change does.
pub(super) fn port_set(ports: &[Port]) -> BTreeSet<(Protocol, u32, u32)> {
    ports
        .iter()
        .map(|p| (p.protocol, p.port, p.backend_port()))
        .collect()
}

impl LbSpec {
    /// A spec of ports with the default settings.
    pub fn ports(ports: Vec<Port>) -> Self {
        Self {
            ports,
            settings: Some(LbSettings::default()),
        }
    }

    /// Whether the load balancer `self` (programmed: as NRP has it, or as a creation carried it)
    /// differs from `want` (desired), so that the service must be created again. Settings are
    /// compared only when both sides know them.
    pub fn differs_from(&self, want: &LbSpec) -> bool {
        if port_set(&self.ports) != port_set(&want.ports) {
            return true;
        }
        match (&self.settings, &want.settings) {
            (Some(have), Some(want_settings)) => !have.satisfies(want_settings, &want.ports),
            _ => false,
        }
    }

    /// Whether a worker can program it (every port programmable).
    pub fn programmable(&self) -> bool {
        self.ports.iter().all(Port::programmable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(port: u32) -> Port {
        Port {
            protocol: Protocol::Tcp,
            port,
            target_port: 0,
        }
    }

    fn spec(settings: LbSettings) -> LbSpec {
        LbSpec {
            ports: vec![tcp(80)],
            settings: Some(settings),
        }
    }

    #[test]
    fn the_defaults_are_what_nrp_reports_for_them() {
        let desired = spec(LbSettings::default());
        let read = spec(LbSettings {
            idle_timeout_minutes: 4,
            frontend: Frontend::Own { dns_label: None },
            ..LbSettings::default()
        });
        assert!(!read.differs_from(&desired));
        assert!(!desired.differs_from(&desired));
    }

    #[test]
    fn each_setting_that_changed_differs() {
        let base = LbSettings::default();
        let changed = [
            LbSettings {
                idle_timeout_minutes: 15,
                ..base.clone()
            },
            LbSettings {
                disable_tcp_reset: true,
                ..base.clone()
            },
            LbSettings {
                source_ip_affinity: true,
                ..base.clone()
            },
            LbSettings {
                frontend: Frontend::Own {
                    dns_label: Some("shop".into()),
                },
                ..base.clone()
            },
            LbSettings {
                frontend: Frontend::Brought {
                    name: Some("mine".into()),
                    resource_group: None,
                    address: None,
                },
                ..base.clone()
            },
        ];
        for want in changed {
            assert!(
                spec(base.clone()).differs_from(&spec(want.clone())),
                "{want:?}"
            );
            assert!(
                spec(want.clone()).differs_from(&spec(base.clone())),
                "{want:?}"
            );
        }
    }

    #[test]
    fn tcp_reset_is_not_compared_for_udp_rules_only() {
        let udp = |settings| LbSpec {
            ports: vec![Port {
                protocol: Protocol::Udp,
                port: 53,
                target_port: 0,
            }],
            settings: Some(settings),
        };
        let on = udp(LbSettings::default());
        let off = udp(LbSettings {
            disable_tcp_reset: true,
            ..LbSettings::default()
        });
        assert!(!on.differs_from(&off));
    }

    #[test]
    fn a_brought_ip_is_matched_by_name_or_by_address() {
        let read = spec(LbSettings {
            frontend: Frontend::Brought {
                name: Some("Mine".into()),
                resource_group: Some("RG-IPs".into()),
                address: Some("20.1.2.3".parse().unwrap()),
            },
            ..LbSettings::default()
        });
        let by_name = |rg: Option<&str>| {
            spec(LbSettings {
                frontend: Frontend::Brought {
                    name: Some("mine".into()),
                    resource_group: rg.map(str::to_owned),
                    address: None,
                },
                ..LbSettings::default()
            })
        };
        let by_address = |ip: &str| {
            spec(LbSettings {
                frontend: Frontend::Brought {
                    name: None,
                    resource_group: None,
                    address: Some(ip.parse().unwrap()),
                },
                ..LbSettings::default()
            })
        };
        assert!(!read.differs_from(&by_name(Some("rg-ips"))));
        assert!(read.differs_from(&by_name(None)), "another resource group");
        let in_gateway_group = spec(LbSettings {
            frontend: Frontend::Brought {
                name: Some("mine".into()),
                resource_group: None,
                address: Some("20.1.2.3".parse().unwrap()),
            },
            ..LbSettings::default()
        });
        assert!(
            !in_gateway_group.differs_from(&by_name(Some("mc-rg"))),
            "the gateway's own group, named: cannot tell, taken as the same"
        );
        assert!(!read.differs_from(&by_address("20.1.2.3")));
        assert!(read.differs_from(&by_address("20.1.2.4")));
        // clb's own public IP is not a brought one.
        assert!(spec(LbSettings::default()).differs_from(&by_address("20.1.2.3")));
    }

    #[test]
    fn unknown_settings_compare_only_the_ports() {
        let unknown = LbSpec {
            ports: vec![tcp(80)],
            settings: None,
        };
        let want = spec(LbSettings {
            idle_timeout_minutes: 30,
            ..LbSettings::default()
        });
        assert!(!unknown.differs_from(&want));
        let other_ports = LbSpec {
            ports: vec![tcp(81)],
            settings: None,
        };
        assert!(other_ports.differs_from(&want));
    }
}
