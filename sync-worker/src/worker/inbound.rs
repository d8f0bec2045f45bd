//! The settings of an inbound service's load balancer (`ServiceChange.settings`, issue 33) and the
//! public IP an owner brings.
//!
//! - **Rules**: every rule gets `idleTimeoutInMinutes` (4 to 30, 0 meaning 4), `enableFloatingIP`
//!   false, `loadDistribution` `SourceIP` for `LOAD_DISTRIBUTION_SOURCE_IP` else `Default`, and the TCP
//!   rules `enableTcpReset` true unless `disable_tcp_reset` (as Azure's Container Load Balancer code
//!   in cloud-provider-azure builds them).
//! - **clb's own public IP** (`pip-{name}`): `StandardV2`, static, with `dnsSettings.domainNameLabel`
//!   when `dns_label` is set; the PUT carries the whole body, so a label dropped from the settings is
//!   removed from the public IP.
//! - **A brought public IP** (`brought_public_ip`), named by `name` (+ `resource_group`, empty: the
//!   gateway's) or by `address` (the public IP of the gateway's resource group that holds it). It is
//!   read, never written, and checked before anything is created or changed; each refusal is the
//!   change's own error (parked until the Service's desired state changes) with a code of its own:
//!   `PublicIpNameReserved` (named as clb's own `pip-{name}` in the gateway's resource group),
//!   `PublicIpNotFound` (clb never creates a public IP its owner named), `PublicIpNotStandardV2`,
//!   `PublicIpNotStatic`, `PublicIpFamilyMismatch`, `PublicIpInUse` (used by another frontend than
//!   this service's load balancer's, or by a NAT gateway). Then the load balancer's frontend points
//!   at it, the service's frontend is its address, and clb's own `pip-{name}`, if a previous
//!   creation left it, is deleted once the load balancer moved off it.

use std::net::IpAddr;
use std::ops::RangeInclusive;

use clb_nrp::wire::{
    IpVersion, LoadBalancer, LoadDistribution, PublicIpAddress, ResourceId, ResourceKind,
    TransportProtocol,
};
use clb_proto::v1::{self, LoadBalancerSettings, ServiceChange};

use super::ctx::{UnitCtx, UnitError};
use super::services::{load_balancer_name, public_ip_name};

/// The SKU of the public IPs clb creates for inbound services, and the one a brought public IP must
/// have: `StandardV2`, as Azure's Container Load Balancer code creates them.
pub const PUBLIC_IP_SKU: &str = "StandardV2";

/// The rules' idle timeout when the settings give none (Azure's default).
pub const DEFAULT_IDLE_TIMEOUT_MINUTES: u32 = 4;

/// The idle timeouts a rule may have (those Azure's Container Load Balancer takes).
pub const IDLE_TIMEOUT_MINUTES: RangeInclusive<u32> = 4..=30;

/// What every rule of an inbound service's load balancer gets beside its ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSettings {
    /// `idleTimeoutInMinutes`.
    pub idle_timeout_minutes: u32,
    /// `enableTcpReset` of the TCP rules.
    pub tcp_reset: bool,
    /// `loadDistribution`.
    pub load_distribution: LoadDistribution,
}

impl Default for RuleSettings {
    fn default() -> Self {
        Self {
            idle_timeout_minutes: DEFAULT_IDLE_TIMEOUT_MINUTES,
            tcp_reset: true,
            load_distribution: LoadDistribution::Default,
        }
    }
}

fn invalid(message: String) -> UnitError {
    UnitError::Invalid {
        code: "InvalidServiceChange",
        message,
    }
}

use super::byo::{cut, refused};

/// The settings of `change`, or the defaults.
fn settings(change: &ServiceChange) -> LoadBalancerSettings {
    change.settings.clone().unwrap_or_default()
}

/// The rule settings of `change`, checked: an idle timeout outside 4 to 30 (other than 0, the
/// default) is refused.
pub fn rule_settings(change: &ServiceChange) -> Result<RuleSettings, UnitError> {
    let s = settings(change);
    let idle_timeout_minutes = match s.idle_timeout_minutes {
        0 => DEFAULT_IDLE_TIMEOUT_MINUTES,
        m if IDLE_TIMEOUT_MINUTES.contains(&m) => m,
        m => {
            return Err(invalid(format!(
                "service {}: idle timeout {m} minutes is out of range ({} to {}, or 0 for {})",
                cut(&change.service_id),
                IDLE_TIMEOUT_MINUTES.start(),
                IDLE_TIMEOUT_MINUTES.end(),
                DEFAULT_IDLE_TIMEOUT_MINUTES
            )));
        }
    };
    let load_distribution = match s.load_distribution() {
        v1::LoadDistribution::SourceIp => LoadDistribution::SourceIp,
        v1::LoadDistribution::Unspecified => LoadDistribution::Default,
    };
    Ok(RuleSettings {
        idle_timeout_minutes,
        tcp_reset: !s.disable_tcp_reset,
        load_distribution,
    })
}

/// Whether `label` is a DNS label Azure takes (`^[a-z][a-z0-9-]{1,61}[a-z0-9]$`).
pub fn is_dns_label(label: &str) -> bool {
    let b = label.as_bytes();
    (3..=63).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && (b[b.len() - 1].is_ascii_lowercase() || b[b.len() - 1].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// A brought public IP as the change names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Brought {
    /// By name, in a resource group (`None`: the gateway's).
    Name {
        /// The resource group, when not the gateway's.
        resource_group: Option<String>,
        /// Its name.
        name: String,
    },
    /// By address, in the gateway's resource group.
    Address(IpAddr),
}

/// What the public IP of an inbound change is: clb's own, with its DNS label, or a brought one. A
/// malformed choice is refused (`InvalidServiceChange`): a brought public IP named by neither or
/// both of name and address, a resource group without a name, an address that is not an IP, a DNS
/// label Azure would refuse, or a DNS label with a brought public IP (clb changes nothing of it).
pub fn public_ip_choice(
    change: &ServiceChange,
) -> Result<Result<Brought, Option<String>>, UnitError> {
    let s = settings(change);
    let name = cut(&change.service_id);
    let label = s.dns_label.trim();
    let Some(b) = s.brought_public_ip else {
        if label.is_empty() {
            return Ok(Err(None));
        }
        if !is_dns_label(label) {
            return Err(invalid(format!(
                "service {name}: DNS label {:?} is invalid: 3 to 63 lower-case letters, digits and \
                 hyphens, starting with a letter and ending with a letter or digit",
                cut(label)
            )));
        }
        return Ok(Err(Some(label.to_string())));
    };
    if !label.is_empty() {
        return Err(invalid(format!(
            "service {name}: a DNS label and a brought public IP together: clb changes nothing of \
             a brought public IP"
        )));
    }
    let (pip, rg, address) = (b.name.trim(), b.resource_group.trim(), b.address.trim());
    match (pip.is_empty(), address.is_empty()) {
        (false, true) if pip.len() <= 80 => Ok(Ok(Brought::Name {
            resource_group: (!rg.is_empty()).then(|| rg.to_string()),
            name: pip.to_string(),
        })),
        (true, false) if rg.is_empty() => match address.parse::<IpAddr>() {
            Ok(ip) => Ok(Ok(Brought::Address(ip))),
            Err(_) => Err(invalid(format!(
                "service {name}: the brought public IP's address {:?} is not an IP address",
                cut(address)
            ))),
        },
        _ => Err(invalid(format!(
            "service {name}: a brought public IP is named by its name (1 to 80 characters, with an \
             optional resource group) or by its address, not both or neither (name {:?}, resource \
             group {:?}, address {:?})",
            cut(pip),
            cut(rg),
            cut(address)
        ))),
    }
}

/// The public IP a load balancer frontend will use: its id, its address, and the load balancer's id.
pub(crate) struct Frontend {
    pub id: String,
    pub address: Option<String>,
    pub lb: ResourceId,
}

/// Whether `ip_configuration` (a public IP's `ipConfiguration`) is the frontend of the load balancer
/// `lb`.
fn is_frontend_of(ip_configuration: &str, lb: &ResourceId) -> bool {
    match ResourceId::parse_with_child(ip_configuration) {
        Ok((parent, Some((child, _)))) => {
            child.eq_ignore_ascii_case("frontendIPConfigurations")
                && parent.kind == ResourceKind::LoadBalancer
                && parent.subscription.eq_ignore_ascii_case(&lb.subscription)
                && parent
                    .resource_group
                    .eq_ignore_ascii_case(&lb.resource_group)
                && parent.name.eq_ignore_ascii_case(&lb.name)
        }
        _ => false,
    }
}

/// Finds the brought public IP and checks it (see the module's documentation). Reads only.
pub(crate) async fn resolve(
    ctx: &UnitCtx<'_>,
    change: &ServiceChange,
    brought: &Brought,
) -> Result<Frontend, UnitError> {
    let gateway = super::byo::gateway_id(ctx).await?;
    let name = cut(&change.service_id);
    let own = public_ip_name(&change.service_id);
    let lb = ResourceId::new(
        &gateway.subscription,
        &gateway.resource_group,
        ResourceKind::LoadBalancer,
        load_balancer_name(&change.service_id),
    );
    let reserved = |what: String| {
        refused(
            "PublicIpNameReserved",
            format!(
                "service {name} brings public IP {what}: that is the public IP clb creates (and \
                 deletes) for the service in the gateway's resource group"
            ),
        )
    };
    let not_found = |what: String| {
        tracing::warn!(service = %change.service_id, public_ip = %what,
            "the public IP the service brings does not exist; it is not created");
        refused(
            "PublicIpNotFound",
            format!(
                "service {name} brings public IP {what}, which does not exist: clb does not create \
                 a public IP its owner names"
            ),
        )
    };
    let (pip, what) = match brought {
        Brought::Name {
            resource_group,
            name: pip,
        } => {
            let rg = resource_group
                .clone()
                .unwrap_or_else(|| gateway.resource_group.clone());
            let what = format!("{:?} in resource group {:?}", cut(pip), cut(&rg));
            if rg.eq_ignore_ascii_case(&gateway.resource_group) && pip.eq_ignore_ascii_case(&own) {
                return Err(reserved(what));
            }
            match ctx.read(|o| ctx.nrp().get_public_ip_in(&rg, pip, o)).await {
                Ok(p) => (p, what),
                Err(e) if e.is_not_found() => return Err(not_found(what)),
                Err(e) => return Err(e),
            }
        }
        Brought::Address(ip) => {
            let what = format!(
                "with address {ip} in resource group {:?}",
                cut(&gateway.resource_group)
            );
            let address = ip.to_string();
            match ctx
                .read(|o| ctx.nrp().find_public_ip_by_address(&address, o))
                .await?
            {
                Some(p)
                    if p.name
                        .as_deref()
                        .is_some_and(|n| n.eq_ignore_ascii_case(&own)) =>
                {
                    return Err(reserved(what));
                }
                Some(p) => (p, what),
                None => return Err(not_found(what)),
            }
        }
    };
    check(change, &pip, &what, &lb)?;
    let id = pip.id.clone().ok_or_else(|| {
        UnitError::Nrp(clb_nrp::NrpError::Server {
            status: 200,
            code: "MissingResourceId".into(),
            message: format!("public IP {what} came back without an id"),
            retry_after: None,
        })
    })?;
    let address = pip
        .properties
        .ip_address
        .as_deref()
        .map(str::trim)
        .filter(|ip| !ip.is_empty())
        .map(str::to_owned);
    Ok(Frontend { id, address, lb })
}

/// The checks of a brought public IP `pip` (described by `what`) for `change`, whose load balancer is
/// `lb`.
fn check(
    change: &ServiceChange,
    pip: &PublicIpAddress,
    what: &str,
    lb: &ResourceId,
) -> Result<(), UnitError> {
    let name = cut(&change.service_id);
    let sku = pip.sku.as_ref().map_or("", |s| s.name.as_str());
    if !sku.eq_ignore_ascii_case(PUBLIC_IP_SKU) {
        return Err(refused(
            "PublicIpNotStandardV2",
            format!(
                "service {name} brings public IP {what} of SKU {:?}: a Container Load Balancer's \
                 frontend takes a {PUBLIC_IP_SKU} public IP",
                cut(sku)
            ),
        ));
    }
    let method = pip
        .properties
        .public_ip_allocation_method
        .as_deref()
        .unwrap_or("");
    if !method.eq_ignore_ascii_case("Static") {
        return Err(refused(
            "PublicIpNotStatic",
            format!(
                "service {name} brings public IP {what}, allocated {:?}: it must be Static",
                cut(method)
            ),
        ));
    }
    let version = pip
        .properties
        .public_ip_address_version
        .clone()
        .unwrap_or(IpVersion::V4);
    let wanted = IpVersion::from(super::services::ip_version(change.ip_family()));
    if version != wanted {
        return Err(refused(
            "PublicIpFamilyMismatch",
            format!("service {name} is {wanted} and brings public IP {what}, which is {version}"),
        ));
    }
    let user = match (
        &pip.properties.ip_configuration,
        &pip.properties.nat_gateway,
    ) {
        (Some(c), _) if !is_frontend_of(&c.id, lb) => Some(c.id.as_str()),
        (_, Some(n)) => Some(n.id.as_str()),
        _ => None,
    };
    if let Some(user) = user {
        return Err(refused(
            "PublicIpInUse",
            format!(
                "service {name} brings public IP {what}, which {:?} uses: a public IP serves one \
                 frontend",
                cut(user)
            ),
        ));
    }
    Ok(())
}

/// Whether the public IP `pip_id` is clb's own for service `service`: `pip-{service}` in the
/// resource group of its load balancer `lb_id` (the gateway's); without the load balancer's id, by
/// name alone.
pub fn is_own_public_ip(pip_id: &str, lb_id: Option<&str>, service: &str) -> bool {
    let Ok(pip) = ResourceId::parse(pip_id) else {
        return false;
    };
    let same_rg = lb_id
        .and_then(|id| ResourceId::parse_with_child(id).ok())
        .is_none_or(|(lb, _)| lb.resource_group.eq_ignore_ascii_case(&pip.resource_group));
    same_rg && pip.name.eq_ignore_ascii_case(&public_ip_name(service))
}

/// The settings of the load balancer `lb` of `service` as NRP has them, in the terms of
/// `ServiceUpdate.settings` (see `ServiceRules.settings`): the rule settings of its first TCP rule,
/// else of its first rule (unset without a rule: 0, false, unspecified; an idle timeout a rule lacks
/// is Azure's default, 4; a TCP rule without `enableTcpReset` has it off, Azure's default, and a
/// rule of another protocol reports it on unless it says `false`); `brought_public_ip` when its
/// frontend's public IP is not clb's own (with `pip`'s address when `pip` is that public IP), else
/// `dns_label` of clb's own (`pip`).
pub fn observed_settings(
    service: &str,
    lb: &LoadBalancer,
    pip: Option<&PublicIpAddress>,
) -> LoadBalancerSettings {
    let rules = &lb.properties.load_balancing_rules;
    let rule = rules
        .iter()
        .find(|r| r.properties.protocol == Some(TransportProtocol::Tcp))
        .or_else(|| rules.first());
    let mut s = LoadBalancerSettings::default();
    if let Some(r) = rule {
        let p = &r.properties;
        s.idle_timeout_minutes = p
            .idle_timeout_in_minutes
            .unwrap_or(DEFAULT_IDLE_TIMEOUT_MINUTES);
        s.disable_tcp_reset = match p.protocol {
            Some(TransportProtocol::Tcp) => !p.enable_tcp_reset.unwrap_or(false),
            _ => p.enable_tcp_reset == Some(false),
        };
        if p.load_distribution == Some(LoadDistribution::SourceIp) {
            s.set_load_distribution(v1::LoadDistribution::SourceIp);
        }
    }
    let frontend = lb
        .properties
        .frontend_ip_configurations
        .iter()
        .find_map(|f| f.properties.public_ip_address.as_ref());
    let Some(frontend) = frontend else {
        return s;
    };
    let pip = pip.filter(|p| {
        p.id.as_deref()
            .is_some_and(|id| id.eq_ignore_ascii_case(&frontend.id))
    });
    if is_own_public_ip(&frontend.id, lb.id.as_deref(), service) {
        s.dns_label = pip
            .and_then(|p| p.properties.domain_name_label())
            .unwrap_or_default()
            .to_string();
        return s;
    }
    let lb_rg = lb
        .id
        .as_deref()
        .and_then(|id| ResourceId::parse_with_child(id).ok())
        .map(|(id, _)| id.resource_group);
    let (name, resource_group) = match ResourceId::parse(&frontend.id) {
        Ok(id)
            if lb_rg
                .as_deref()
                .is_some_and(|rg| rg.eq_ignore_ascii_case(&id.resource_group)) =>
        {
            (id.name, String::new())
        }
        Ok(id) => (id.name, id.resource_group),
        Err(_) => (frontend.id.clone(), String::new()),
    };
    s.brought_public_ip = Some(v1::BroughtPublicIp {
        name,
        resource_group,
        address: pip
            .and_then(|p| p.properties.ip_address.clone())
            .unwrap_or_default(),
    });
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(settings: Option<LoadBalancerSettings>) -> ServiceChange {
        ServiceChange {
            service_id: "svc".into(),
            settings,
            ..Default::default()
        }
    }

    fn with(f: impl FnOnce(&mut LoadBalancerSettings)) -> ServiceChange {
        let mut s = LoadBalancerSettings::default();
        f(&mut s);
        change(Some(s))
    }

    #[test]
    fn rule_settings_default_to_azure_s() {
        assert_eq!(
            rule_settings(&change(None)).unwrap(),
            RuleSettings::default()
        );
        let d = rule_settings(&with(|_| {})).unwrap();
        assert_eq!(d.idle_timeout_minutes, 4);
        assert!(d.tcp_reset);
        assert_eq!(d.load_distribution, LoadDistribution::Default);
    }

    #[test]
    fn idle_timeout_is_4_to_30_and_0_is_4() {
        for (given, used) in [(0, 4), (4, 4), (17, 17), (30, 30)] {
            let s = rule_settings(&with(|s| s.idle_timeout_minutes = given)).unwrap();
            assert_eq!(s.idle_timeout_minutes, used);
        }
        for bad in [1, 3, 31, 100] {
            let e = rule_settings(&with(|s| s.idle_timeout_minutes = bad)).unwrap_err();
            assert_eq!(e.code(), "InvalidServiceChange");
            assert!(format!("{e:?}").contains("out of range"), "{e:?}");
        }
    }

    #[test]
    fn tcp_reset_and_distribution_follow_the_settings() {
        let s = rule_settings(&with(|s| {
            s.disable_tcp_reset = true;
            s.set_load_distribution(v1::LoadDistribution::SourceIp);
        }))
        .unwrap();
        assert!(!s.tcp_reset);
        assert_eq!(s.load_distribution, LoadDistribution::SourceIp);
    }

    #[test]
    fn dns_labels_follow_azure_s_expression() {
        for ok in ["abc", "shop-1", &format!("a{}", "b".repeat(62))] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in [
            "ab",
            "1ab",
            "-ab",
            "ab-",
            "aBc",
            "a_b",
            &format!("a{}", "b".repeat(63)),
        ] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }

    #[test]
    fn the_public_ip_is_clb_s_own_with_its_label_or_a_brought_one() {
        assert_eq!(public_ip_choice(&change(None)).unwrap(), Err(None));
        assert_eq!(
            public_ip_choice(&with(|s| s.dns_label = "shop".into())).unwrap(),
            Err(Some("shop".into()))
        );
        let e = public_ip_choice(&with(|s| s.dns_label = "Shop!".into())).unwrap_err();
        assert_eq!(e.code(), "InvalidServiceChange");
        let brought = |name: &str, rg: &str, address: &str| {
            with(|s| {
                s.brought_public_ip = Some(v1::BroughtPublicIp {
                    name: name.into(),
                    resource_group: rg.into(),
                    address: address.into(),
                })
            })
        };
        assert_eq!(
            public_ip_choice(&brought("mine", "", "")).unwrap(),
            Ok(Brought::Name {
                resource_group: None,
                name: "mine".into()
            })
        );
        assert_eq!(
            public_ip_choice(&brought("mine", "rg-ip", "")).unwrap(),
            Ok(Brought::Name {
                resource_group: Some("rg-ip".into()),
                name: "mine".into()
            })
        );
        assert_eq!(
            public_ip_choice(&brought("", "", "20.0.0.9")).unwrap(),
            Ok(Brought::Address("20.0.0.9".parse().unwrap()))
        );
        for bad in [
            brought("", "", ""),
            brought("mine", "", "20.0.0.9"),
            brought("", "rg-ip", "20.0.0.9"),
            brought("", "", "not-an-ip"),
            brought(&"n".repeat(81), "", ""),
        ] {
            let e = public_ip_choice(&bad).unwrap_err();
            assert_eq!(e.code(), "InvalidServiceChange", "{bad:?}");
        }
        let mut both = brought("mine", "", "");
        if let Some(s) = &mut both.settings {
            s.dns_label = "shop".into();
        }
        let e = public_ip_choice(&both).unwrap_err();
        assert!(
            format!("{e:?}").contains("DNS label and a brought"),
            "{e:?}"
        );
    }

    fn pip(sku: &str, method: &str, version: &str, user: Option<&str>) -> PublicIpAddress {
        let mut p: PublicIpAddress = serde_json::from_value(serde_json::json!({
            "id": "/subscriptions/s/resourceGroups/rg-ip/providers/Microsoft.Network/publicIPAddresses/mine",
            "sku": {"name": sku},
            "properties": {"publicIPAllocationMethod": method, "publicIPAddressVersion": version,
                           "ipAddress": "20.0.0.9"}
        }))
        .unwrap();
        p.properties.ip_configuration = user.map(clb_nrp::wire::SubResource::new);
        p
    }

    #[test]
    fn a_brought_public_ip_is_checked() {
        let lb = ResourceId::new("s", "rg", ResourceKind::LoadBalancer, "lb-svc");
        let c = change(None);
        let code = |p: &PublicIpAddress| check(&c, p, "x", &lb).err().map(|e| e.code().to_string());
        assert_eq!(code(&pip("StandardV2", "Static", "IPv4", None)), None);
        assert_eq!(code(&pip("standardv2", "static", "ipv4", None)), None);
        assert_eq!(
            code(&pip("Standard", "Static", "IPv4", None)).as_deref(),
            Some("PublicIpNotStandardV2")
        );
        assert_eq!(
            code(&pip("StandardV2", "Dynamic", "IPv4", None)).as_deref(),
            Some("PublicIpNotStatic")
        );
        assert_eq!(
            code(&pip("StandardV2", "Static", "IPv6", None)).as_deref(),
            Some("PublicIpFamilyMismatch")
        );
        let mut v6 = change(None);
        v6.set_ip_family(v1::IpFamily::Ipv6);
        assert!(check(&v6, &pip("StandardV2", "Static", "IPv6", None), "x", &lb).is_ok());
        // Used by this service's load balancer's frontend: fine (a creation run again).
        let ours = lb.frontend_ip_configuration_id("frontend");
        assert_eq!(
            code(&pip("StandardV2", "Static", "IPv4", Some(&ours))),
            None
        );
        let other = ResourceId::new("s", "rg", ResourceKind::LoadBalancer, "lb-other")
            .frontend_ip_configuration_id("frontend");
        assert_eq!(
            code(&pip("StandardV2", "Static", "IPv4", Some(&other))).as_deref(),
            Some("PublicIpInUse")
        );
        let nic = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/n/ipConfigurations/c";
        assert_eq!(
            code(&pip("StandardV2", "Static", "IPv4", Some(nic))).as_deref(),
            Some("PublicIpInUse")
        );
        let mut nat = pip("StandardV2", "Static", "IPv4", None);
        nat.properties.nat_gateway = Some(clb_nrp::wire::SubResource::new("/n"));
        assert_eq!(code(&nat).as_deref(), Some("PublicIpInUse"));
    }

    #[test]
    fn clb_s_own_public_ip_is_pip_name_in_the_load_balancer_s_resource_group() {
        let id = |rg: &str, name: &str| {
            ResourceId::new("s", rg, ResourceKind::PublicIpAddress, name).to_string()
        };
        let lb = ResourceId::new("s", "rg", ResourceKind::LoadBalancer, "lb-svc").to_string();
        assert!(is_own_public_ip(&id("rg", "pip-svc"), Some(&lb), "svc"));
        assert!(is_own_public_ip(&id("RG", "PIP-svc"), Some(&lb), "svc"));
        assert!(!is_own_public_ip(&id("rg-ip", "pip-svc"), Some(&lb), "svc"));
        assert!(!is_own_public_ip(&id("rg", "mine"), Some(&lb), "svc"));
        assert!(is_own_public_ip(&id("rg-ip", "pip-svc"), None, "svc"));
    }

    #[test]
    fn observed_settings_are_those_of_the_first_tcp_rule_and_the_own_public_ip_s_label() {
        use super::super::services::load_balancer;
        let lb_id = ResourceId::new("s", "rg", ResourceKind::LoadBalancer, "lb-svc");
        let own = ResourceId::new("s", "rg", ResourceKind::PublicIpAddress, "pip-svc").to_string();
        let settings = RuleSettings {
            idle_timeout_minutes: 17,
            tcp_reset: false,
            load_distribution: LoadDistribution::SourceIp,
        };
        let mut lb = load_balancer(
            &lb_id,
            "eastus",
            &own,
            [("udp", 53, 53), ("tcp", 80, 8080)],
            &settings,
        );
        lb.id = Some(lb_id.to_string());
        let mut pip = PublicIpAddress {
            id: Some(own.clone()),
            ..Default::default()
        };
        pip.properties.dns_settings = Some(clb_nrp::wire::PublicIpDnsSettings {
            domain_name_label: Some("shop".into()),
            ..Default::default()
        });
        let s = observed_settings("svc", &lb, Some(&pip));
        assert_eq!(s.idle_timeout_minutes, 17);
        assert!(s.disable_tcp_reset);
        assert_eq!(s.load_distribution(), v1::LoadDistribution::SourceIp);
        assert_eq!(s.dns_label, "shop");
        assert!(s.brought_public_ip.is_none());
        // The defaults, as the worker writes them, read back as the default settings.
        let mut lb = load_balancer(
            &lb_id,
            "eastus",
            &own,
            [("tcp", 80, 8080)],
            &RuleSettings::default(),
        );
        lb.id = Some(lb_id.to_string());
        let s = observed_settings("svc", &lb, None);
        assert_eq!(
            s,
            LoadBalancerSettings {
                idle_timeout_minutes: 4,
                ..Default::default()
            }
        );
        // A rule without the fields: Azure's defaults (4 minutes, TCP reset off).
        for r in &mut lb.properties.load_balancing_rules {
            r.properties.idle_timeout_in_minutes = None;
            r.properties.enable_tcp_reset = None;
            r.properties.load_distribution = None;
        }
        let s = observed_settings("svc", &lb, None);
        assert_eq!((s.idle_timeout_minutes, s.disable_tcp_reset), (4, true));
        // A UDP-only service's rule has no TCP reset to report: the default.
        let mut udp = load_balancer(&lb_id, "eastus", &own, [("udp", 53, 53)], &settings);
        udp.id = Some(lb_id.to_string());
        assert!(!observed_settings("svc", &udp, None).disable_tcp_reset);
        // No rule: nothing of the rules.
        let mut none = load_balancer(&lb_id, "eastus", &own, [], &settings);
        none.id = Some(lb_id.to_string());
        assert_eq!(
            observed_settings("svc", &none, None).idle_timeout_minutes,
            0
        );
    }
}
