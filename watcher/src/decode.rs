//! Kubernetes objects → plain records: the decoding half of the watcher's translation. Pure and
//! synchronous. Each function reads one k8s-openapi object (Service, EndpointSlice, Pod, Node),
//! validates what clb needs of it, logs what it skips (with the object's name, the field and the
//! reason) and returns a record of plain values; [`crate::translate::Translator`] keeps those
//! records and turns them into updates.
//!
//! The object vocabulary (labels, our `loadBalancerClass`, our finalizer), object keys and kinds,
//! Service classification and ports, and Node InternalIPs are public (and re-exported by
//! [`crate::translate`]); the records are the translator's.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use clb_proto::v1::{Protocol, ServicePort};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::translate::TranslatorConfig;

/// The pod label naming a pod's egress (its outbound identity).
pub const EGRESS_LABEL: &str = "kubernetes.azure.com/service-egress-gateway";

/// The pod annotation by which an egress brings its NAT gateway: the name of an existing
/// StandardV2 NAT gateway in the gateway's NAT gateway resource group (docs/watcher.md).
pub const NAT_GATEWAY_ANNOTATION: &str = "clb.azure.com/nat-gateway";

/// Why `name` is not a NAT gateway name ARM accepts (1–80 characters of letters, digits, `_`,
/// `.`, `-`; starting with a letter or digit; ending with a letter, a digit or `_`), if it is not.
pub fn nat_gateway_name_error(name: &str) -> Option<&'static str> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if name.chars().count() > 80 {
        Some("is longer than 80 characters")
    } else if !name.chars().all(ok) {
        Some("may hold only letters, digits, '_', '.' and '-'")
    } else if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        Some("must start with a letter or a digit")
    } else if !name.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
        Some("must end with a letter, a digit or '_'")
    } else {
        None
    }
}

/// `value` cut to 100 characters (then `…`), for a log line.
fn quoted(value: &str) -> String {
    let mut cut: String = value.chars().take(100).collect();
    if cut.len() < value.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}

/// The EndpointSlice label naming the Service a slice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The `spec.loadBalancerClass` that clb serves by default.
pub const DEFAULT_CLASS: &str = "clb.azure.com/container-load-balancer";

/// The finalizer clb puts on the LoadBalancer Services it programs.
pub const FINALIZER: &str = "clb.azure.com/load-balancer-cleanup";

/// The kinds of objects the watcher follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `v1/Service`.
    Service,
    /// `discovery.k8s.io/v1/EndpointSlice`.
    EndpointSlice,
    /// `v1/Pod` (egress-labelled).
    Pod,
    /// `v1/Node`.
    Node,
}

impl Kind {
    /// Every kind, in a fixed order.
    pub const ALL: [Kind; 4] = [Kind::Service, Kind::EndpointSlice, Kind::Pod, Kind::Node];

    /// The kind's position in [`Kind::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Pod => "Pod",
            Kind::Node => "Node",
        })
    }
}

/// The key of an object: `namespace/name` (the namespace is empty for Nodes).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjKey {
    /// The namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl ObjKey {
    /// A namespaced key.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    /// The key of a cluster-scoped object (a Node).
    pub fn cluster(name: &str) -> Self {
        Self::new("", name)
    }

    /// The key of an object from its metadata; `None` (with a warning) when the name, or for a
    /// namespaced kind the namespace, is missing.
    pub fn of(kind: Kind, meta: &ObjectMeta) -> Option<Self> {
        let Some(name) = meta.name.as_deref().filter(|n| !n.is_empty()) else {
            tracing::warn!(%kind, "object skipped: it has no metadata.name");
            return None;
        };
        if kind == Kind::Node {
            return Some(Self::cluster(name));
        }
        match meta.namespace.as_deref().filter(|n| !n.is_empty()) {
            Some(ns) => Some(Self::new(ns, name)),
            None => {
                tracing::warn!(%kind, name, "object skipped: it has no metadata.namespace");
                None
            }
        }
    }
}

impl fmt::Display for ObjKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// How a Service relates to clb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceClass {
    /// Not of type `LoadBalancer`.
    NotLoadBalancer,
    /// A LoadBalancer Service of another class (or unclassed, when unclassed ones are not claimed).
    OtherClass(Option<String>),
    /// A LoadBalancer Service of our class.
    Ours,
}

/// Classifies a Service: is it a LoadBalancer Service of our class?
pub fn classify(svc: &Service, config: &TranslatorConfig) -> ServiceClass {
    let Some(spec) = &svc.spec else {
        return ServiceClass::NotLoadBalancer;
    };
    if spec.type_.as_deref() != Some("LoadBalancer") {
        return ServiceClass::NotLoadBalancer;
    }
    match spec.load_balancer_class.as_deref() {
        None if config.claim_unclassed => ServiceClass::Ours,
        Some(c) if c == config.class => ServiceClass::Ours,
        other => ServiceClass::OtherClass(other.map(str::to_owned)),
    }
}

/// The ports of a LoadBalancer Service as load balancer rules: TCP and UDP, deduplicated, sorted,
/// each with its numeric `targetPort` (0 when it is unset: the same as the port). A *named*
/// targetPort gives 0 here: only the Service's EndpointSlices tell the number behind the name, which
/// [`crate::translate::Translator`] resolves. SCTP ports, ports out of range and target ports out
/// of range are skipped with a warning naming the Service.
pub fn service_ports(key: &ObjKey, svc: &Service) -> Vec<ServicePort> {
    port_records(key, svc)
        .into_iter()
        .map(|p| ServicePort {
            port: u32::from(p.port),
            protocol: p.protocol,
            target_port: match p.target {
                TargetPort::Number(n) => u32::from(n),
                TargetPort::Same | TargetPort::Named(_) => 0,
            },
        })
        .collect()
}

/// The ports of a Service as records (see [`service_ports`]): TCP and UDP, the first of each
/// (port, protocol), sorted by (port, protocol).
pub(crate) fn port_records(key: &ObjKey, svc: &Service) -> Vec<PortRecord> {
    let mut out: BTreeMap<(u16, i32), PortRecord> = BTreeMap::new();
    let ports = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or(&[]);
    for (i, p) in ports.iter().enumerate() {
        let protocol = match p.protocol.as_deref().unwrap_or("TCP") {
            "TCP" => Protocol::Tcp,
            "UDP" => Protocol::Udp,
            other => {
                tracing::warn!(
                    service = %key,
                    field = %format!("spec.ports[{i}].protocol"),
                    value = other,
                    "port skipped: Azure load balancer rules support only TCP and UDP"
                );
                continue;
            }
        };
        let Some(port) = u16::try_from(p.port).ok().filter(|p| *p != 0) else {
            tracing::warn!(
                service = %key,
                field = %format!("spec.ports[{i}].port"),
                value = p.port,
                "port skipped: not in 1..=65535"
            );
            continue;
        };
        let target = match &p.target_port {
            // Unset, or the zero value the API server defaults to the port.
            None | Some(IntOrString::Int(0)) => TargetPort::Same,
            Some(IntOrString::String(name)) if name.trim().is_empty() => TargetPort::Same,
            Some(IntOrString::Int(n)) => match u16::try_from(*n) {
                Ok(n) => TargetPort::Number(n),
                Err(_) => {
                    tracing::warn!(
                        service = %key,
                        field = %format!("spec.ports[{i}].targetPort"),
                        value = n,
                        "port skipped: its targetPort is not in 1..=65535"
                    );
                    continue;
                }
            },
            Some(IntOrString::String(name)) => TargetPort::Named(name.trim().to_owned()),
        };
        out.entry((port, protocol as i32)).or_insert(PortRecord {
            port,
            protocol: protocol as i32,
            name: p.name.clone().unwrap_or_default(),
            target,
        });
    }
    out.into_values().collect()
}

/// A value the API gave where an IP address belongs that is none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not an IP address")]
pub(crate) struct NotAnIp;

/// Parses an IP address given by the API (surrounding blanks ignored).
pub(crate) fn parse_ip(s: &str) -> Result<IpAddr, NotAnIp> {
    s.trim().parse::<IpAddr>().map_err(|_| NotAnIp)
}

/// `IPv4` or `IPv6`, for messages.
pub(crate) fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

/// A Node's InternalIPs: the first valid one of each family.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeIps {
    /// The IPv4 InternalIP.
    pub v4: Option<IpAddr>,
    /// The IPv6 InternalIP.
    pub v6: Option<IpAddr>,
}

impl NodeIps {
    /// The InternalIPs of `node` (malformed addresses are skipped with a warning).
    pub fn of(key: &ObjKey, node: &Node) -> Self {
        let mut ips = Self::default();
        let addresses = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_deref())
            .unwrap_or(&[]);
        for (i, a) in addresses.iter().enumerate() {
            if a.type_ != "InternalIP" {
                continue;
            }
            match parse_ip(&a.address) {
                Ok(ip @ IpAddr::V4(_)) => {
                    ips.v4.get_or_insert(ip);
                }
                Ok(ip @ IpAddr::V6(_)) => {
                    ips.v6.get_or_insert(ip);
                }
                Err(reason) => tracing::warn!(
                    node = %key,
                    field = %format!("status.addresses[{i}].address"),
                    value = %a.address,
                    %reason,
                    "node address skipped"
                ),
            }
        }
        ips
    }

    /// The InternalIP of the same family as `address`.
    pub fn for_address(&self, address: IpAddr) -> Option<IpAddr> {
        if address.is_ipv4() { self.v4 } else { self.v6 }
    }

    /// Both IPs that are known.
    pub fn all(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.v4.iter().chain(self.v6.iter()).copied()
    }
}

/// What decoding one object gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decoded<T> {
    /// The object as a record.
    Record(T),
    /// A valid object that clb does not report (not ours, being deleted, not ready to be
    /// reported): what was sent for it goes.
    Ignored,
    /// A malformed object (logged): what was sent for it stays, so that a bad report never
    /// removes a live backend.
    Malformed,
}

/// A desired inbound identity: a LoadBalancer Service of ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServiceRecord {
    /// The Service's UID (the inbound identity).
    pub uid: String,
    /// Its load balancer rules, sorted by (port, protocol).
    pub ports: Vec<PortRecord>,
    /// Its IP families, primary first (`crate::families::of_service`; empty: none stated).
    pub families: Vec<clb_proto::v1::IpFamily>,
    /// What clb programs of its settings (`crate::settings::admit`).
    pub admission: crate::settings::Admission,
}

/// Where a Service port's traffic goes on the pods: its `targetPort`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TargetPort {
    /// Unset (or 0): the port itself.
    Same,
    /// A port number.
    Number(u16),
    /// The name of a container port, resolved through the Service's EndpointSlices.
    Named(String),
}

/// One port of a Service (`spec.ports[]`), validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PortRecord {
    /// `port`: the load balancer's frontend port.
    pub port: u16,
    /// `protocol` as a [`Protocol`] (TCP or UDP).
    pub protocol: i32,
    /// `name` (empty when unset): the name of the matching EndpointSlice port.
    pub name: String,
    /// `targetPort`.
    pub target: TargetPort,
}

/// One port of an EndpointSlice (`ports[]`): named after the Service port it serves, with the
/// number the slice's endpoints listen on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlicePort {
    /// `name` (empty when unset).
    pub name: String,
    /// `port`.
    pub port: u16,
    /// `protocol` as a [`Protocol`] (TCP, the default, or UDP).
    pub protocol: i32,
}

/// One endpoint of an EndpointSlice, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SliceEndpoint {
    /// `addresses[0]`, of the slice's family.
    pub address: IpAddr,
    /// `nodeName`.
    pub node: String,
    /// `conditions.ready` (unset = ready).
    pub ready: bool,
    /// Serving and terminating (the fallback when no endpoint of the Service is ready).
    pub serving_terminating: bool,
    /// `conditions.terminating` (unset = false).
    pub terminating: bool,
}

/// An EndpointSlice: the Service it belongs to and its valid endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SliceRecord {
    /// The Service (label `kubernetes.io/service-name`, in the slice's namespace).
    pub service: ObjKey,
    /// The valid endpoints.
    pub endpoints: Vec<SliceEndpoint>,
    /// The valid TCP and UDP ports.
    pub ports: Vec<SlicePort>,
}

/// An egress-labelled Pod to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodRecord {
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.nodeName`.
    pub node: String,
    /// The pod's IPs (`status.podIPs`, else `status.podIP`), deduplicated.
    pub addresses: Vec<IpAddr>,
    /// The node's IPs as the kubelet reported them (`status.hostIPs`, else `status.hostIP`).
    pub host_ips: Vec<IpAddr>,
    /// The egress (the value of the egress label).
    pub egress: String,
    /// The NAT gateway the egress brings (annotation [`NAT_GATEWAY_ANNOTATION`]); empty: none.
    pub nat_gateway: String,
}

/// Decodes a Service. [`Decoded::Ignored`]: not a LoadBalancer Service of ours, being deleted, or
/// (when the configuration requires our finalizer) not finalized yet; [`Decoded::Malformed`]: one
/// of ours without a UID.
pub(crate) fn service(
    key: &ObjKey,
    svc: &Service,
    config: &TranslatorConfig,
) -> Decoded<ServiceRecord> {
    let class = classify(svc, config);
    let deleting = svc.metadata.deletion_timestamp.is_some();
    let wanted = class == ServiceClass::Ours && !deleting;
    let uid = svc.metadata.uid.as_deref().unwrap_or("");
    if wanted && uid.trim().is_empty() {
        tracing::warn!(service = %key, "Service skipped: it has no metadata.uid");
        return Decoded::Malformed;
    }
    let finalized = match &config.require_finalizer {
        None => true,
        Some(f) => svc
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|l| l.iter().any(|x| x == f)),
    };
    if wanted && !finalized {
        tracing::debug!(service = %key, "Service waits for its finalizer before it is programmed");
    }
    if wanted && finalized {
        let families = crate::families::of_service(key, svc);
        // A refused Service is not programmed: what was sent for it goes (the write-back says why).
        let admission = match crate::settings::admit(svc, &families) {
            Ok(a) => a,
            Err(refusal) => {
                tracing::debug!(service = %key, reason = refusal.reason, "Service refused: {}", refusal.message());
                return Decoded::Ignored;
            }
        };
        Decoded::Record(ServiceRecord {
            uid: uid.to_owned(),
            ports: port_records(key, svc),
            families,
            admission,
        })
    } else {
        Decoded::Ignored
    }
}

/// Decodes an EndpointSlice. [`Decoded::Ignored`]: it has no `kubernetes.io/service-name` label
/// (it belongs to no Service); malformed endpoints are skipped one by one.
pub(crate) fn slice(key: &ObjKey, slice: &EndpointSlice) -> Decoded<SliceRecord> {
    let service = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL))
        .filter(|s| !s.is_empty());
    let Some(service) = service else {
        tracing::debug!(slice = %key, "EndpointSlice without label {SERVICE_NAME_LABEL}: no Service");
        return Decoded::Ignored;
    };
    let endpoints = slice_endpoints(key, slice);
    let ports = if matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
        slice_ports(key, slice)
    } else {
        Vec::new()
    };
    Decoded::Record(SliceRecord {
        service: ObjKey::new(&key.namespace, service),
        endpoints,
        ports,
    })
}

/// The TCP and UDP ports of a slice that have a number; others are skipped (a port without a number
/// means "all ports" and names none; a malformed one is logged).
pub(crate) fn slice_ports(key: &ObjKey, slice: &EndpointSlice) -> Vec<SlicePort> {
    let mut out = Vec::new();
    for (i, p) in slice.ports.iter().flatten().enumerate() {
        let protocol = match p.protocol.as_deref().unwrap_or("TCP") {
            "TCP" => Protocol::Tcp,
            "UDP" => Protocol::Udp,
            _ => continue, // no load balancer rule can have it
        };
        let Some(raw) = p.port else {
            continue;
        };
        let Some(port) = u16::try_from(raw).ok().filter(|p| *p != 0) else {
            tracing::warn!(
                slice = %key,
                field = %format!("ports[{i}].port"),
                value = raw,
                "EndpointSlice port skipped: not in 1..=65535"
            );
            continue;
        };
        out.push(SlicePort {
            name: p.name.clone().unwrap_or_default(),
            port,
            protocol: protocol as i32,
        });
    }
    out
}

/// Decodes an egress-labelled Pod. [`Decoded::Ignored`]: the pod is not reported (no egress, on
/// another node than `only_node`, terminal, host network, not scheduled or no IP yet);
/// [`Decoded::Malformed`]: no UID, or none of its IPs parses (logged).
pub(crate) fn pod(key: &ObjKey, pod: &Pod, only_node: Option<&str>) -> Decoded<PodRecord> {
    let egress = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(EGRESS_LABEL))
        .map(|e| e.trim())
        .unwrap_or("");
    if egress.is_empty() {
        tracing::debug!(pod = %key, "pod not reported: no {EGRESS_LABEL} label value");
        return Decoded::Ignored;
    }
    let spec = pod.spec.as_ref();
    let node = spec.and_then(|s| s.node_name.as_deref()).unwrap_or("");
    if only_node.is_some_and(|only| node != only) {
        return Decoded::Ignored;
    }
    let nat_gateway = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NAT_GATEWAY_ANNOTATION))
        .map(|n| n.trim())
        .unwrap_or("");
    if !nat_gateway.is_empty()
        && let Some(why) = nat_gateway_name_error(nat_gateway)
    {
        tracing::warn!(
            pod = %key,
            field = %format!("metadata.annotations[{NAT_GATEWAY_ANNOTATION}]"),
            value = %quoted(nat_gateway),
            "pod not reported (nothing of it changes): the value is not a NAT gateway name: it {why}"
        );
        return Decoded::Malformed;
    }
    if spec.and_then(|s| s.host_network).unwrap_or(false) {
        tracing::debug!(pod = %key, "pod not reported: it uses the host network");
        return Decoded::Ignored;
    }
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return Decoded::Ignored;
    }
    let uid = pod.metadata.uid.as_deref().unwrap_or("").trim();
    if uid.is_empty() {
        tracing::warn!(pod = %key, "pod skipped: it has no metadata.uid");
        return Decoded::Malformed;
    }
    if node.is_empty() {
        // Not scheduled yet: it has no IP either.
        return Decoded::Ignored;
    }
    let mut raw: Vec<(String, String)> = Vec::new();
    if let Some(ips) = status.and_then(|s| s.pod_ips.as_ref()) {
        raw.extend(
            ips.iter()
                .enumerate()
                .map(|(i, p)| (format!("status.podIPs[{i}].ip"), p.ip.clone())),
        );
    }
    if raw.is_empty()
        && let Some(ip) = status.and_then(|s| s.pod_ip.as_ref())
    {
        raw.push(("status.podIP".to_owned(), ip.clone()));
    }
    let mut addresses = Vec::new();
    for (field, value) in &raw {
        match parse_ip(value) {
            Ok(ip) if !addresses.contains(&ip) => addresses.push(ip),
            Ok(_) => {}
            Err(reason) => {
                tracing::warn!(pod = %key, field = %field, value = %value, %reason, "pod address skipped");
            }
        }
    }
    if addresses.is_empty() && !raw.is_empty() {
        return Decoded::Malformed;
    }
    let mut host_ips = Vec::new();
    let host_raw: Vec<&str> = match status.and_then(|s| s.host_ips.as_ref()) {
        Some(h) if !h.is_empty() => h.iter().map(|h| h.ip.as_str()).collect(),
        _ => status
            .and_then(|s| s.host_ip.as_deref())
            .into_iter()
            .collect(),
    };
    for h in host_raw {
        match parse_ip(h) {
            Ok(ip) => host_ips.push(ip),
            Err(reason) => {
                tracing::warn!(pod = %key, field = "status.hostIPs", value = h, %reason, "pod host IP ignored");
            }
        }
    }
    Decoded::Record(PodRecord {
        uid: uid.to_owned(),
        node: node.to_owned(),
        addresses,
        host_ips,
        egress: egress.to_owned(),
        nat_gateway: nat_gateway.to_owned(),
    })
}

/// The valid endpoints of a slice; malformed ones are skipped with a warning.
pub(crate) fn slice_endpoints(key: &ObjKey, slice: &EndpointSlice) -> Vec<SliceEndpoint> {
    let want_v4 = match slice.address_type.as_str() {
        "IPv4" => true,
        "IPv6" => false,
        "FQDN" => {
            tracing::debug!(slice = %key, "FQDN EndpointSlice ignored: no IP endpoints");
            return Vec::new();
        }
        other => {
            tracing::warn!(slice = %key, field = "addressType", value = other, "EndpointSlice skipped: unknown address type");
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (i, ep) in slice.endpoints.iter().enumerate() {
        // Only the first address has a meaning (the API says consumers use addresses[0]).
        let Some(raw) = ep.addresses.first() else {
            tracing::warn!(slice = %key, field = %format!("endpoints[{i}].addresses"), "endpoint skipped: no address");
            continue;
        };
        let address = match parse_ip(raw) {
            Ok(a) => a,
            Err(reason) => {
                tracing::warn!(slice = %key, field = %format!("endpoints[{i}].addresses[0]"), value = %raw, %reason, "endpoint skipped");
                continue;
            }
        };
        if address.is_ipv4() != want_v4 {
            tracing::warn!(
                slice = %key,
                field = %format!("endpoints[{i}].addresses[0]"),
                value = %raw,
                address_type = %slice.address_type,
                "endpoint skipped: its IP family differs from the slice's addressType"
            );
            continue;
        }
        let Some(node) = ep.node_name.as_deref().filter(|n| !n.is_empty()) else {
            tracing::warn!(slice = %key, field = %format!("endpoints[{i}].nodeName"), address = %address, "endpoint skipped: no nodeName, its location is unknown");
            continue;
        };
        let c = ep.conditions.as_ref();
        // API semantics: ready unset = ready; serving unset = as ready; terminating unset = false.
        let ready = c.and_then(|c| c.ready).unwrap_or(true);
        let serving = c.and_then(|c| c.serving).unwrap_or(ready);
        let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
        out.push(SliceEndpoint {
            address,
            node: node.to_owned(),
            ready,
            serving_terminating: serving && terminating,
            terminating,
        });
    }
    out
}
