//! What clb does with each setting a LoadBalancer Service's owner writes: every `spec` field and
//! every `service.beta.kubernetes.io/azure-*` annotation of cloud-provider-azure is **honoured**
//! (mapped to NRP), **refused** (the Service is not programmed, or withdrawn from NRP, with a
//! Warning Event and the `Programmed` condition saying why), **ignored** out loud (programmed, with
//! a Warning Event naming it: it widens nothing) or **not applicable** (why). [`TABLE`] is the
//! list; docs/watcher.md carries it, and a test checks that the two agree.
//!
//! [`admit`] is the one decision per Service, on the live path and after every restart (the
//! translator calls it on every version of the Service, and the write-back derives the same from
//! the same object): a Service is refused when it asks for something that restricts who may reach
//! it and that clb cannot enforce (an internal load balancer, source ranges, service tags), a
//! public IP from a prefix, a port without a rule, or a value of an honoured setting that Azure
//! would refuse. What it honours becomes each IP family's `LoadBalancerSettings`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use clb_proto::azure_names::{
    MAX_IDLE_TIMEOUT_MINUTES, MIN_IDLE_TIMEOUT_MINUTES, dns_label_error, resource_group_error,
    resource_name_error,
};
use clb_proto::v1::{BroughtPublicIp, IpFamily, LoadBalancerSettings, LoadDistribution};
use k8s_openapi::api::core::v1::Service;

/// The prefix of cloud-provider-azure's Service annotations.
pub const AZURE_PREFIX: &str = "service.beta.kubernetes.io/azure-";
/// The prefix of cloud-provider-azure's per-port annotations (`port_{port}_{parameter}`).
pub const PORT_PREFIX: &str = "service.beta.kubernetes.io/port_";

/// What clb does with a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    /// Mapped to NRP.
    Honoured,
    /// The Service is not programmed (or is withdrawn) while it is set.
    Refused,
    /// Programmed without it, with a Warning Event naming it.
    Ignored,
    /// Means nothing for a load balancer whose backends are pod IPs.
    NotApplicable,
}

impl Treatment {
    /// The word docs/watcher.md uses.
    pub fn word(self) -> &'static str {
        match self {
            Treatment::Honoured => "honoured",
            Treatment::Refused => "refused",
            Treatment::Ignored => "ignored",
            Treatment::NotApplicable => "not applicable",
        }
    }
}

/// One row of the table: a `spec` field (`spec.…`) or an annotation (its key; a key ending in `*`
/// is a family of keys), what clb does with it and how or why.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// `spec.sessionAffinity`, or an annotation key.
    pub setting: &'static str,
    /// What clb does with it.
    pub treatment: Treatment,
    /// How it maps to NRP, or why not.
    pub note: &'static str,
}

const fn row(setting: &'static str, treatment: Treatment, note: &'static str) -> Row {
    Row {
        setting,
        treatment,
        note,
    }
}

macro_rules! ann {
    ($name:literal) => {
        concat!("service.beta.kubernetes.io/", $name)
    };
}

/// `azure-load-balancer-internal`.
pub const INTERNAL: &str = ann!("azure-load-balancer-internal");
/// `azure-load-balancer-internal-subnet`.
pub const INTERNAL_SUBNET: &str = ann!("azure-load-balancer-internal-subnet");
/// `azure-allowed-ip-ranges`.
pub const ALLOWED_IP_RANGES: &str = ann!("azure-allowed-ip-ranges");
/// `azure-allowed-service-tags`.
pub const ALLOWED_SERVICE_TAGS: &str = ann!("azure-allowed-service-tags");
/// `azure-deny-all-except-load-balancer-source-ranges`.
pub const DENY_ALL_EXCEPT: &str = ann!("azure-deny-all-except-load-balancer-source-ranges");
/// `azure-pip-prefix-id`.
pub const PIP_PREFIX: &str = ann!("azure-pip-prefix-id");
/// `azure-pip-prefix-id-ipv6`.
pub const PIP_PREFIX_V6: &str = ann!("azure-pip-prefix-id-ipv6");
/// `azure-load-balancer-tcp-idle-timeout`.
pub const IDLE_TIMEOUT: &str = ann!("azure-load-balancer-tcp-idle-timeout");
/// `azure-load-balancer-disable-tcp-reset`.
pub const DISABLE_TCP_RESET: &str = ann!("azure-load-balancer-disable-tcp-reset");
/// `azure-dns-label-name`.
pub const DNS_LABEL: &str = ann!("azure-dns-label-name");
/// `azure-pip-name`.
pub const PIP_NAME: &str = ann!("azure-pip-name");
/// `azure-pip-name-ipv6`.
pub const PIP_NAME_V6: &str = ann!("azure-pip-name-ipv6");
/// `azure-load-balancer-resource-group`.
pub const RESOURCE_GROUP: &str = ann!("azure-load-balancer-resource-group");
/// `azure-load-balancer-ipv4`.
pub const IPV4: &str = ann!("azure-load-balancer-ipv4");
/// `azure-load-balancer-ipv6`.
pub const IPV6: &str = ann!("azure-load-balancer-ipv6");

use Treatment::{Honoured, Ignored, NotApplicable, Refused};

/// Every setting of a LoadBalancer Service, with what clb does with it (docs/watcher.md, "Service
/// settings", is this table).
pub const TABLE: &[Row] = &[
    // ---- spec ----
    row(
        "spec.type",
        Honoured,
        "only `LoadBalancer` Services are programmed",
    ),
    row(
        "spec.loadBalancerClass",
        Honoured,
        "selects clb (`--class`; unclassed ones with `--claim-unclassed`)",
    ),
    row(
        "spec.ports",
        Honoured,
        "one rule per TCP or UDP port (`frontendPort` = `port`, `backendPort` = `targetPort`, a named one resolved through the EndpointSlices); an SCTP port gets no rule, named in a Warning Event (Azure load balancers take TCP and UDP)",
    ),
    row(
        "spec.selector",
        Honoured,
        "through the Service's EndpointSlices: their ready pod IPs are the backends",
    ),
    row(
        "spec.publishNotReadyAddresses",
        Honoured,
        "through the EndpointSlices, which then mark every address ready",
    ),
    row(
        "spec.ipFamilies",
        Honoured,
        "one frontend (public IP, load balancer, backend pool) per family",
    ),
    row(
        "spec.ipFamilyPolicy",
        Honoured,
        "`PreferDualStack`/`RequireDualStack` with two families: both frontends",
    ),
    row(
        "spec.sessionAffinity",
        Honoured,
        "`ClientIP` → every rule's `loadDistribution: SourceIP`",
    ),
    row(
        "spec.sessionAffinityConfig",
        Ignored,
        "Azure's `SourceIP` distribution has no timeout: a client stays on its pod while the backends do not change; a `clientIP.timeoutSeconds` other than Kubernetes' default (10800) is named in a Warning Event",
    ),
    row(
        "spec.loadBalancerIP",
        Honoured,
        "the public IP of the gateway's resource group that holds this address is linked (brought, never changed or deleted)",
    ),
    row(
        "spec.loadBalancerSourceRanges",
        Refused,
        "clb programs no network security rules: the Service would be open to every source",
    ),
    row(
        "spec.externalTrafficPolicy",
        NotApplicable,
        "the backends are pod IPs: traffic reaches the pod with no second hop, so `Local` and `Cluster` behave alike",
    ),
    row(
        "spec.healthCheckNodePort",
        NotApplicable,
        "no node hop, no node health check",
    ),
    row(
        "spec.allocateLoadBalancerNodePorts",
        NotApplicable,
        "node ports are not used",
    ),
    row(
        "spec.internalTrafficPolicy",
        NotApplicable,
        "in-cluster traffic (kube-proxy's), not the load balancer's",
    ),
    row(
        "spec.trafficDistribution",
        NotApplicable,
        "in-cluster routing hint, not the load balancer's",
    ),
    row("spec.clusterIP", NotApplicable, "in-cluster address"),
    row("spec.clusterIPs", NotApplicable, "in-cluster addresses"),
    row(
        "spec.externalIPs",
        NotApplicable,
        "routed by kube-proxy or the CNI, not by the load balancer",
    ),
    row(
        "spec.externalName",
        NotApplicable,
        "only for `ExternalName` Services",
    ),
    // ---- annotations ----
    row(
        INTERNAL,
        Refused,
        "an internal (private) load balancer is not supported by Azure's Container Load Balancer: refused rather than exposed on a public IP (`\"true\"`, any case; another value is a public load balancer)",
    ),
    row(
        INTERNAL_SUBNET,
        Refused,
        "asks for an internal load balancer in that subnet",
    ),
    row(
        ALLOWED_IP_RANGES,
        Refused,
        "clb programs no network security rules",
    ),
    row(
        ALLOWED_SERVICE_TAGS,
        Refused,
        "clb programs no network security rules",
    ),
    row(
        DENY_ALL_EXCEPT,
        Refused,
        "clb programs no network security rules",
    ),
    row(
        PIP_PREFIX,
        Refused,
        "a public IP from a prefix cannot be had: refused rather than served on another IP",
    ),
    row(PIP_PREFIX_V6, Refused, "as azure-pip-prefix-id, for IPv6"),
    row(
        IDLE_TIMEOUT,
        Honoured,
        "every rule's `idleTimeoutInMinutes`: 4 to 30 (another value is refused)",
    ),
    row(
        DISABLE_TCP_RESET,
        Honoured,
        "`\"true\"` turns off the TCP rules' `enableTcpReset` (on by default); `\"true\"` or `\"false\"`, any case",
    ),
    row(
        DNS_LABEL,
        Honoured,
        "`dnsSettings.domainNameLabel` of the public IP clb creates (of the primary family); Azure's label rules; refused with a brought public IP",
    ),
    row(
        PIP_NAME,
        Honoured,
        "the public IP of that name (IPv4; of a single-stack Service, its family) is linked, never changed or deleted; it must exist, be StandardV2 and static and not be used by another frontend",
    ),
    row(
        PIP_NAME_V6,
        Honoured,
        "as azure-pip-name, for the IPv6 frontend of a dual-stack Service",
    ),
    row(
        RESOURCE_GROUP,
        Honoured,
        "the resource group of the public IP azure-pip-name names; without azure-pip-name ignored (clb creates its resources in the gateway's resource group)",
    ),
    row(
        IPV4,
        Honoured,
        "as spec.loadBalancerIP, for the IPv4 frontend",
    ),
    row(
        IPV6,
        Honoured,
        "as spec.loadBalancerIP, for the IPv6 frontend",
    ),
    row(
        ann!("azure-load-balancer-mode"),
        Ignored,
        "selects a VM set's load balancer; each Service has a load balancer of its own here",
    ),
    row(
        ann!("azure-load-balancer-configurations"),
        Ignored,
        "selects among several standard load balancers; each Service has a load balancer of its own here",
    ),
    row(
        ann!("azure-load-balancer-enable-high-availability-ports"),
        Ignored,
        "HA ports are for internal load balancers; only the Service's ports get rules",
    ),
    row(
        ann!("azure-load-balancer-health-probe-protocol"),
        Ignored,
        "Azure's Container Load Balancer has no health probes for pod IP backends: only ready pods are backends",
    ),
    row(
        ann!("azure-load-balancer-health-probe-interval"),
        Ignored,
        "no health probes for pod IP backends",
    ),
    row(
        ann!("azure-load-balancer-health-probe-num-of-probe"),
        Ignored,
        "no health probes for pod IP backends",
    ),
    row(
        ann!("azure-load-balancer-health-probe-request-path"),
        Ignored,
        "no health probes for pod IP backends",
    ),
    row(
        ann!("azure-pip-tags"),
        Ignored,
        "clb does not tag the public IPs it creates",
    ),
    row(
        ann!("azure-pip-ip-tags"),
        Ignored,
        "clb does not set IP tags on the public IPs it creates",
    ),
    row(
        ann!("azure-disable-load-balancer-floating-ip"),
        NotApplicable,
        "floating IP is always off for pod IP backends",
    ),
    row(
        ann!("azure-disable-load-balancer-nsg-rule"),
        NotApplicable,
        "clb programs no network security rules",
    ),
    row(
        ann!("azure-additional-public-ips"),
        Ignored,
        "consumed by kube-proxy on nodes; nothing of the load balancer",
    ),
    row(
        ann!("azure-shared-securityrule"),
        NotApplicable,
        "clb programs no network security rules",
    ),
    row(
        ann!("azure-pls-*"),
        Ignored,
        "a Private Link service is not created",
    ),
    row(
        ann!("port_*_no_lb_rule"),
        Refused,
        "asks for no rule on that port, which clb cannot leave out: the port would be exposed",
    ),
    row(
        ann!("port_*_no_probe_rule"),
        Ignored,
        "no health probes for pod IP backends",
    ),
    row(
        ann!("port_*_health-probe_*"),
        Ignored,
        "no health probes for pod IP backends",
    ),
    row(
        ann!("azure-*"),
        Ignored,
        "any other annotation of this prefix: not known to clb, named in a Warning Event",
    ),
];

/// The row of `key` (an annotation key, or a `spec.…` field), matching `*` patterns.
pub fn row_of(key: &str) -> Option<&'static Row> {
    TABLE
        .iter()
        .find(|r| r.setting == key)
        .or_else(|| TABLE.iter().find(|r| matches_pattern(r.setting, key)))
}

fn matches_pattern(pattern: &str, key: &str) -> bool {
    if !pattern.contains('*') {
        return false;
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    let mut rest = key;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            let Some(r) = rest.strip_prefix(part) else {
                return false;
            };
            rest = r;
        } else if i == parts.len() - 1 {
            return rest.ends_with(part) && !rest.is_empty();
        } else {
            let Some(at) = rest.find(part) else {
                return false;
            };
            if at == 0 {
                return false;
            }
            rest = &rest[at + part.len()..];
        }
    }
    true
}

/// Why a Service is not programmed: the Event and condition reason, the field and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The Event and condition reason (`Unsupported…` for a setting clb cannot honour,
    /// `Invalid…` for a value Azure would refuse).
    pub reason: &'static str,
    /// The field at fault: `spec.…` or `metadata.annotations["…"]`.
    pub field: String,
    /// Its value (quoted in the message, at most 100 characters).
    pub value: String,
    /// Why.
    pub why: String,
}

impl Refusal {
    fn new(reason: &'static str, field: String, value: &str, why: impl Into<String>) -> Self {
        Self {
            reason,
            field,
            value: value.to_owned(),
            why: why.into(),
        }
    }

    /// The message of the Event and condition.
    pub fn message(&self) -> String {
        format!(
            "{} {}: {}; the Service is not programmed (nothing of it is left in Azure) until the setting is removed or corrected",
            self.field,
            quote(&self.value),
            self.why
        )
    }
}

/// `value` quoted, cut to 100 characters.
fn quote(value: &str) -> String {
    let mut cut: String = value.chars().take(100).collect();
    if cut.len() < value.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}

fn annotation(key: &str) -> String {
    format!("metadata.annotations[{key:?}]")
}

/// What clb programs of an admitted Service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admission {
    /// The rules' settings, the same for every family.
    rules: LoadBalancerSettings,
    /// The DNS label (the primary family's public IP).
    dns_label: String,
    /// The brought public IP of each family (IPv4, IPv6).
    brought: BTreeMap<i32, BroughtPublicIp>,
    /// The settings set that clb ignores, each with why (sorted by setting).
    pub ignored: Vec<(String, &'static str)>,
}

impl Admission {
    /// The settings of the identity of `family` (`primary`: the Service's first family).
    pub fn settings(&self, family: IpFamily, primary: bool) -> LoadBalancerSettings {
        let brought = self.brought.get(&(family_key(family) as i32)).cloned();
        LoadBalancerSettings {
            dns_label: if primary && brought.is_none() {
                self.dns_label.clone()
            } else {
                String::new()
            },
            brought_public_ip: brought,
            ..self.rules.clone()
        }
    }

    /// The Warning Event's message naming every ignored setting (`None`: none).
    pub fn ignored_message(&self) -> Option<String> {
        if self.ignored.is_empty() {
            return None;
        }
        let list: Vec<String> = self
            .ignored
            .iter()
            .map(|(s, why)| format!("{s} ({why})"))
            .collect();
        Some(format!(
            "programmed without these settings, which clb does not apply: {}",
            list.join("; ")
        ))
    }
}

fn family_key(family: IpFamily) -> IpFamily {
    match family {
        IpFamily::Ipv6 => IpFamily::Ipv6,
        IpFamily::Ipv4 | IpFamily::Unspecified => IpFamily::Ipv4,
    }
}

fn is_true(value: &str) -> bool {
    value.trim().eq_ignore_ascii_case("true")
}

/// Decides what clb does with Service `svc` whose families are `families` (primary first; empty:
/// none stated, IPv4): what it programs, or why it refuses it.
pub fn admit(svc: &Service, families: &[IpFamily]) -> Result<Admission, Refusal> {
    let empty = BTreeMap::new();
    let ann = svc.metadata.annotations.as_ref().unwrap_or(&empty);
    let spec = svc.spec.clone().unwrap_or_default();
    let get = |key: &str| ann.get(key).map(String::as_str);

    // Refused: what restricts who may reach the Service, or what cannot be had.
    if let Some(v) = get(INTERNAL).filter(|v| is_true(v)) {
        return Err(Refusal::new(
            "UnsupportedInternalLoadBalancer",
            annotation(INTERNAL),
            v,
            "an internal load balancer is not supported by Azure's Container Load Balancer",
        ));
    }
    if let Some(v) = get(INTERNAL_SUBNET) {
        return Err(Refusal::new(
            "UnsupportedInternalLoadBalancer",
            annotation(INTERNAL_SUBNET),
            v,
            "asks for an internal load balancer, which Azure's Container Load Balancer does not support",
        ));
    }
    if let Some(ranges) = spec
        .load_balancer_source_ranges
        .as_ref()
        .filter(|r| !r.is_empty())
    {
        return Err(Refusal::new(
            "UnsupportedLoadBalancerSourceRanges",
            "spec.loadBalancerSourceRanges".into(),
            &ranges.join(","),
            "clb programs no network security rules, so the Service would be open to every source",
        ));
    }
    for (key, reason) in [
        (ALLOWED_IP_RANGES, "UnsupportedAllowedIpRanges"),
        (ALLOWED_SERVICE_TAGS, "UnsupportedAllowedServiceTags"),
        (
            DENY_ALL_EXCEPT,
            "UnsupportedDenyAllExceptLoadBalancerSourceRanges",
        ),
    ] {
        if let Some(v) = get(key) {
            return Err(Refusal::new(
                reason,
                annotation(key),
                v,
                "clb programs no network security rules, so the Service would be open to every source",
            ));
        }
    }
    for key in [PIP_PREFIX, PIP_PREFIX_V6] {
        if let Some(v) = get(key) {
            return Err(Refusal::new(
                "UnsupportedPublicIpPrefix",
                annotation(key),
                v,
                "a public IP from a prefix is not supported: the Service would get an IP outside it",
            ));
        }
    }
    for (key, v) in ann {
        if key.starts_with(PORT_PREFIX) && key.ends_with("_no_lb_rule") {
            return Err(Refusal::new(
                "UnsupportedPortRuleAnnotation",
                annotation(key),
                v,
                "clb makes a rule for every port of the Service and cannot leave one out: the port would be exposed",
            ));
        }
    }

    // Honoured, each checked as Azure would.
    let mut rules = LoadBalancerSettings::default();
    if let Some(v) = get(IDLE_TIMEOUT) {
        let minutes: u32 = v
            .trim()
            .parse()
            .ok()
            .filter(|m| (MIN_IDLE_TIMEOUT_MINUTES..=MAX_IDLE_TIMEOUT_MINUTES).contains(m))
            .ok_or_else(|| {
                Refusal::new(
                    "InvalidIdleTimeout",
                    annotation(IDLE_TIMEOUT),
                    v,
                    format!(
                        "must be a whole number of minutes from {MIN_IDLE_TIMEOUT_MINUTES} to \
                         {MAX_IDLE_TIMEOUT_MINUTES} (what Azure's Container Load Balancer takes)"
                    ),
                )
            })?;
        rules.idle_timeout_minutes = minutes;
    }
    if let Some(v) = get(DISABLE_TCP_RESET) {
        rules.disable_tcp_reset = match v.trim().to_ascii_lowercase().as_str() {
            "true" => true,
            "false" => false,
            _ => {
                return Err(Refusal::new(
                    "InvalidTcpReset",
                    annotation(DISABLE_TCP_RESET),
                    v,
                    "must be \"true\" or \"false\"",
                ));
            }
        };
    }
    if spec.session_affinity.as_deref() == Some("ClientIP") {
        rules.load_distribution = LoadDistribution::SourceIp as i32;
    }

    let families = if families.is_empty() {
        vec![IpFamily::Ipv4]
    } else {
        families.iter().map(|f| family_key(*f)).collect()
    };
    let dual = families.len() > 1;
    let mut brought = BTreeMap::new();
    for family in &families {
        if let Some(b) = brought_ip(&spec, ann, *family, dual)? {
            brought.insert(*family as i32, b);
        }
    }
    let dns_label = match get(DNS_LABEL) {
        None => String::new(),
        Some(v) => {
            if let Some(why) = dns_label_error(v) {
                return Err(Refusal::new(
                    "InvalidDnsLabel",
                    annotation(DNS_LABEL),
                    v,
                    why,
                ));
            }
            if brought.contains_key(&(families[0] as i32)) {
                return Err(Refusal::new(
                    "InvalidDnsLabel",
                    annotation(DNS_LABEL),
                    v,
                    "cannot be set with a brought public IP (azure-pip-name, loadBalancerIP): clb \
                     changes nothing of a public IP its owner brings; set the label on it in Azure",
                ));
            }
            v.to_owned()
        }
    };
    let mut ignored = ignored_settings(&spec, ann, !brought.is_empty());
    ignored.sort();
    Ok(Admission {
        rules,
        dns_label,
        brought,
        ignored,
    })
}

/// The public IP the owner brings for `family`, if any: by name (`azure-pip-name`, or
/// `azure-pip-name-ipv6` for the IPv6 frontend of a dual-stack Service, in the group
/// `azure-load-balancer-resource-group` names) or by address (`azure-load-balancer-ipv4`/`-ipv6`,
/// or `spec.loadBalancerIP` of that family).
fn brought_ip(
    spec: &k8s_openapi::api::core::v1::ServiceSpec,
    ann: &BTreeMap<String, String>,
    family: IpFamily,
    dual: bool,
) -> Result<Option<BroughtPublicIp>, Refusal> {
    let v6 = family == IpFamily::Ipv6;
    let name_key = if v6 && dual { PIP_NAME_V6 } else { PIP_NAME };
    let address_key = if v6 { IPV6 } else { IPV4 };
    let mut address: Option<(String, String)> = None;
    if let Some(v) = ann.get(address_key) {
        address = Some((annotation(address_key), v.clone()));
    }
    if let Some(ip) = spec.load_balancer_ip.as_deref().filter(|s| !s.is_empty()) {
        let parsed: Result<IpAddr, _> = ip.trim().parse();
        match parsed {
            Err(_) => {
                return Err(Refusal::new(
                    "InvalidLoadBalancerIP",
                    "spec.loadBalancerIP".into(),
                    ip,
                    "is not an IPv4 or IPv6 address",
                ));
            }
            Ok(p) if p.is_ipv6() == v6 => match &address {
                Some((field, other)) if other.trim() != ip.trim() => {
                    return Err(Refusal::new(
                        "InvalidLoadBalancerIP",
                        "spec.loadBalancerIP".into(),
                        ip,
                        format!("differs from {field} ({other:?}): name one address"),
                    ));
                }
                Some(_) => {}
                None => address = Some(("spec.loadBalancerIP".into(), ip.to_owned())),
            },
            Ok(_) => {}
        }
    }
    let name = ann.get(name_key);
    match (name, address) {
        (Some(n), Some((field, a))) => Err(Refusal::new(
            "InvalidLoadBalancerIP",
            field,
            &a,
            format!(
                "cannot be set with {} ({n:?}): name the public IP one way",
                annotation(name_key)
            ),
        )),
        (Some(n), None) => {
            if let Some(why) = resource_name_error(n) {
                return Err(Refusal::new(
                    "InvalidPublicIpName",
                    annotation(name_key),
                    n,
                    why,
                ));
            }
            let resource_group = match ann.get(RESOURCE_GROUP) {
                None => String::new(),
                Some(g) => {
                    if let Some(why) = resource_group_error(g) {
                        return Err(Refusal::new(
                            "InvalidPublicIpName",
                            annotation(RESOURCE_GROUP),
                            g,
                            why,
                        ));
                    }
                    g.clone()
                }
            };
            Ok(Some(BroughtPublicIp {
                name: n.clone(),
                resource_group,
                address: String::new(),
            }))
        }
        (None, Some((field, a))) => {
            let ip: IpAddr = a.trim().parse().map_err(|_| {
                Refusal::new(
                    "InvalidLoadBalancerIP",
                    field.clone(),
                    &a,
                    "is not an IPv4 or IPv6 address",
                )
            })?;
            if ip.is_ipv6() != v6 {
                return Err(Refusal::new(
                    "InvalidLoadBalancerIP",
                    field,
                    &a,
                    format!("is not an {} address", if v6 { "IPv6" } else { "IPv4" }),
                ));
            }
            Ok(Some(BroughtPublicIp {
                name: String::new(),
                resource_group: String::new(),
                address: ip.to_string(),
            }))
        }
        (None, None) => Ok(None),
    }
}

/// The settings set on the Service that clb ignores (out loud), each with why.
fn ignored_settings(
    spec: &k8s_openapi::api::core::v1::ServiceSpec,
    ann: &BTreeMap<String, String>,
    brought: bool,
) -> Vec<(String, &'static str)> {
    let mut out = Vec::new();
    for key in ann.keys() {
        if !(key.starts_with(AZURE_PREFIX) || key.starts_with(PORT_PREFIX)) {
            continue;
        }
        match row_of(key) {
            Some(r) if r.treatment == Treatment::Ignored => out.push((key.clone(), r.note)),
            // Honoured only with a name: without it, ignored.
            Some(r) if r.setting == RESOURCE_GROUP && !brought => out.push((
                key.clone(),
                "names the resource group of a public IP named by azure-pip-name, and none is",
            )),
            _ => {}
        }
    }
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        if p.protocol.as_deref() == Some("SCTP") {
            out.push((
                format!("spec.ports[{i}] ({}/SCTP)", p.port),
                "Azure's load balancers take TCP and UDP: no rule for it",
            ));
        }
    }
    let timeout = spec
        .session_affinity_config
        .as_ref()
        .and_then(|c| c.client_ip.as_ref())
        .and_then(|c| c.timeout_seconds);
    if let Some(t) = timeout
        && t != 10_800
    {
        out.push((
            format!("spec.sessionAffinityConfig.clientIP.timeoutSeconds ({t})"),
            "Azure's SourceIP distribution has no timeout: a client stays on its pod while the backends do not change",
        ));
    }
    out
}

#[cfg(test)]
#[path = "settings_tests.rs"]
mod tests;
