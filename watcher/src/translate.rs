//! Kubernetes objects → clb updates. Pure and synchronous: no kube client, no tokio, no I/O.
//!
//! A [`Translator`] keeps indexes of what the watch streams have shown (Services, EndpointSlices,
//! egress-labelled Pods, Nodes) and a record of what it has *sent* (each inbound identity with its
//! ports and endpoint set, each pod with its addresses). Every `apply_*` / `delete_*` recomputes only
//! what the object can affect and returns the **delta**: the updates that take the state server from
//! what was sent to what is wanted now. [`Translator::full_view`] renders the sent record as a resync
//! view, so a resync after any sequence of calls equals the net effect of the deltas.
//!
//! Rules (docs/watcher.md has the long form):
//! - a Service is an inbound identity (its UID) when it is of type `LoadBalancer`, its
//!   `spec.loadBalancerClass` is ours (or unset, when unclassed Services are claimed), it has no
//!   `deletionTimestamp`, and — when a finalizer is required — it carries our finalizer;
//! - its ports are `spec.ports` (TCP, UDP; SCTP and out-of-range ports are skipped with a warning);
//! - its endpoints are the union of the endpoints of its EndpointSlices (label
//!   `kubernetes.io/service-name`): the ready ones (`ready` unset counts as ready); if none is ready,
//!   the serving-and-terminating ones (the fallback kube-proxy also applies); each at the location
//!   that is its node's InternalIP of the same IP family;
//! - a Pod with the egress label is a pod update (address per pod IP, outbound identity = the label
//!   value), located like an endpoint (its node's InternalIP of the family; the pod's `hostIPs` when
//!   the node is unknown). Terminal pods (`Succeeded`, `Failed`) and host-network pods are not
//!   reported;
//! - anything malformed (no UID, bad IP, unknown node, port out of range, …) is logged with the
//!   object's name and the reason and skipped; a malformed update of a known object keeps what was
//!   sent for it (a bad report never removes a live backend).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;

use clb_proto::v1::{Protocol, ServicePort, Update};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use clb_client::updates;

/// The pod label naming a pod's egress (its outbound identity).
pub const EGRESS_LABEL: &str = "kubernetes.azure.com/service-egress-gateway";

/// The EndpointSlice label naming the Service a slice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The `spec.loadBalancerClass` that clb serves by default.
pub const DEFAULT_CLASS: &str = "clb.azure.com/container-load-balancer";

/// The finalizer clb puts on the LoadBalancer Services it programs.
pub const FINALIZER: &str = "clb.azure.com/load-balancer-cleanup";

/// How the translator decides what is ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranslatorConfig {
    /// The `spec.loadBalancerClass` we serve.
    pub class: String,
    /// Whether a LoadBalancer Service with no `loadBalancerClass` is ours.
    pub claim_unclassed: bool,
    /// When set, a Service is programmed only once it carries this finalizer (the write-back adds
    /// it first), so that its deletion always waits for the load balancer's removal.
    pub require_finalizer: Option<String>,
    /// Node-agent mode: only pods on this node are reported.
    pub node: Option<String>,
}

impl Default for TranslatorConfig {
    /// Our default class, unclassed Services claimed, no finalizer required, every node.
    fn default() -> Self {
        Self {
            class: DEFAULT_CLASS.to_owned(),
            claim_unclassed: true,
            require_finalizer: None,
            node: None,
        }
    }
}

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

    fn index(self) -> usize {
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

/// The ports of a LoadBalancer Service as load balancer rules: TCP and UDP, deduplicated, sorted.
/// SCTP ports and ports out of range are skipped with a warning naming the Service.
pub fn service_ports(key: &ObjKey, svc: &Service) -> Vec<ServicePort> {
    let mut out = BTreeSet::new();
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
        out.insert((port, protocol as i32));
    }
    out.into_iter()
        .map(|(port, protocol)| ServicePort {
            port: u32::from(port),
            protocol,
        })
        .collect()
}

fn parse_ip(s: &str) -> Result<IpAddr, String> {
    s.trim()
        .parse::<IpAddr>()
        .map_err(|_| "not an IP address".to_owned())
}

fn family(ip: IpAddr) -> &'static str {
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
                    reason,
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

/// A desired inbound identity.
#[derive(Debug, Clone)]
struct SvcEntry {
    uid: String,
    ports: Vec<ServicePort>,
}

/// One endpoint of an EndpointSlice, validated.
#[derive(Debug, Clone)]
struct SliceEndpoint {
    address: IpAddr,
    node: String,
    ready: bool,
    serving_terminating: bool,
}

#[derive(Debug, Clone)]
struct SliceEntry {
    service: ObjKey,
    endpoints: Vec<SliceEndpoint>,
}

#[derive(Debug, Clone)]
struct PodEntry {
    uid: String,
    node: String,
    addresses: Vec<IpAddr>,
    host_ips: Vec<IpAddr>,
    egress: String,
}

/// What was sent for one Service.
#[derive(Debug, Clone)]
struct SentService {
    uid: String,
    ports: Vec<ServicePort>,
    /// address → location.
    endpoints: BTreeMap<IpAddr, IpAddr>,
}

/// What was sent for one Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SentPod {
    uid: String,
    egress: String,
    /// address → location.
    at: BTreeMap<IpAddr, IpAddr>,
}

/// The incremental translator. See the module documentation.
#[derive(Debug)]
pub struct Translator {
    config: TranslatorConfig,
    services: HashMap<ObjKey, SvcEntry>,
    slices: HashMap<ObjKey, SliceEntry>,
    slices_of: HashMap<ObjKey, BTreeSet<ObjKey>>,
    nodes: HashMap<String, NodeIps>,
    pods: HashMap<ObjKey, PodEntry>,
    /// node → service → number of slice endpoints of that service on the node.
    services_on_node: HashMap<String, HashMap<ObjKey, usize>>,
    /// node → pods on it.
    pods_on_node: HashMap<String, BTreeSet<ObjKey>>,
    sent_services: BTreeMap<ObjKey, SentService>,
    sent_pods: BTreeMap<ObjKey, SentPod>,
    /// Per kind, during a relist: the keys listed so far.
    relist: [Option<HashSet<ObjKey>>; 4],
    /// Whether an endpoint or pod that cannot be located is logged as a warning (off during the
    /// first list, when nodes may simply not have been listed yet).
    warn_unlocated: bool,
}

impl Translator {
    /// An empty translator.
    pub fn new(config: TranslatorConfig) -> Self {
        Self {
            config,
            services: HashMap::new(),
            slices: HashMap::new(),
            slices_of: HashMap::new(),
            nodes: HashMap::new(),
            pods: HashMap::new(),
            services_on_node: HashMap::new(),
            pods_on_node: HashMap::new(),
            sent_services: BTreeMap::new(),
            sent_pods: BTreeMap::new(),
            relist: Default::default(),
            warn_unlocated: true,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &TranslatorConfig {
        &self.config
    }

    /// Turns warnings about endpoints and pods that cannot be located (unknown node, no InternalIP
    /// of the family) on or off. The runtime turns them off until every stream has been listed
    /// once, then calls [`Translator::warn_unlocated`] to report what is still unlocated.
    pub fn set_warn_unlocated(&mut self, on: bool) {
        self.warn_unlocated = on;
    }

    /// Logs a warning for every endpoint and pod address that cannot be located now; returns how
    /// many there are.
    pub fn warn_unlocated(&self) -> usize {
        let mut n = 0;
        for (key, slice) in &self.slices {
            for ep in &slice.endpoints {
                if self.node_ip(&ep.node, ep.address).is_none() {
                    n += 1;
                    tracing::warn!(
                        slice = %key,
                        address = %ep.address,
                        node = %ep.node,
                        reason = self.unlocated_reason(&ep.node, ep.address),
                        "endpoint skipped"
                    );
                }
            }
        }
        for (key, pod) in &self.pods {
            for &a in &pod.addresses {
                if self.pod_location(pod, a).is_none() {
                    n += 1;
                    tracing::warn!(
                        pod = %key,
                        address = %a,
                        node = %pod.node,
                        reason = self.unlocated_reason(&pod.node, a),
                        "pod address skipped"
                    );
                }
            }
        }
        n
    }

    fn node_ip(&self, node: &str, address: IpAddr) -> Option<IpAddr> {
        self.nodes.get(node).and_then(|n| n.for_address(address))
    }

    fn unlocated_reason(&self, node: &str, address: IpAddr) -> String {
        match self.nodes.get(node) {
            None => format!("node {node:?} is unknown"),
            Some(_) => format!("node {node:?} has no {} InternalIP", family(address)),
        }
    }

    /// A pod address's location: its node's InternalIP of the family, else the pod's hostIP of
    /// the family (kubelet's view of where the pod is).
    fn pod_location(&self, pod: &PodEntry, address: IpAddr) -> Option<IpAddr> {
        self.node_ip(&pod.node, address).or_else(|| {
            pod.host_ips
                .iter()
                .copied()
                .find(|h| h.is_ipv4() == address.is_ipv4())
        })
    }

    // ---- relists ----

    /// A watch stream of `kind` restarted its list: objects of that kind not listed (or
    /// [kept](Translator::keep)) before [`Translator::end_relist`] are deleted then.
    pub fn begin_relist(&mut self, kind: Kind) {
        self.relist[kind.index()] = Some(HashSet::new());
    }

    /// Marks `key` as listed without changing it (an object that could not be decoded: what was
    /// sent for it stays).
    pub fn keep(&mut self, kind: Kind, key: &ObjKey) {
        if let Some(seen) = &mut self.relist[kind.index()] {
            seen.insert(key.clone());
        }
    }

    /// The list of `kind` is complete: deletes every object of that kind that was not listed, and
    /// returns the delta.
    pub fn end_relist(&mut self, kind: Kind) -> Vec<Update> {
        let Some(seen) = self.relist[kind.index()].take() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        match kind {
            Kind::Service => {
                // Every Service ever sent or desired: non-desired Services are not indexed.
                let keys: BTreeSet<ObjKey> = self
                    .services
                    .keys()
                    .chain(self.sent_services.keys())
                    .filter(|k| !seen.contains(*k))
                    .cloned()
                    .collect();
                for k in keys {
                    self.services.remove(&k);
                    self.sync_service(&k, &mut out);
                }
            }
            Kind::EndpointSlice => {
                let keys: Vec<ObjKey> = self
                    .slices
                    .keys()
                    .filter(|k| !seen.contains(*k))
                    .cloned()
                    .collect();
                for k in keys {
                    out.extend(self.delete_slice(&k));
                }
            }
            Kind::Pod => {
                let keys: BTreeSet<ObjKey> = self
                    .pods
                    .keys()
                    .chain(self.sent_pods.keys())
                    .filter(|k| !seen.contains(*k))
                    .cloned()
                    .collect();
                for k in keys {
                    out.extend(self.delete_pod(&k));
                }
            }
            Kind::Node => {
                let names: Vec<String> = self
                    .nodes
                    .keys()
                    .filter(|n| !seen.contains(&ObjKey::cluster(n)))
                    .cloned()
                    .collect();
                for n in names {
                    out.extend(self.delete_node(&n));
                }
            }
        }
        out
    }

    fn seen(&mut self, kind: Kind, key: &ObjKey) {
        self.keep(kind, key);
    }

    // ---- Services ----

    /// A Service was added or changed.
    pub fn apply_service(&mut self, svc: &Service) -> Vec<Update> {
        let Some(key) = ObjKey::of(Kind::Service, &svc.metadata) else {
            return Vec::new();
        };
        self.seen(Kind::Service, &key);
        let class = classify(svc, &self.config);
        let deleting = svc.metadata.deletion_timestamp.is_some();
        let wanted = class == ServiceClass::Ours && !deleting;
        let uid = svc.metadata.uid.as_deref().unwrap_or("");
        if wanted && uid.trim().is_empty() {
            tracing::warn!(service = %key, "Service skipped: it has no metadata.uid");
            return Vec::new();
        }
        let finalized = match &self.config.require_finalizer {
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
            let ports = service_ports(&key, svc);
            self.services.insert(
                key.clone(),
                SvcEntry {
                    uid: uid.to_owned(),
                    ports,
                },
            );
        } else {
            self.services.remove(&key);
        }
        let mut out = Vec::new();
        self.sync_service(&key, &mut out);
        out
    }

    /// A Service was deleted.
    pub fn delete_service(&mut self, key: &ObjKey) -> Vec<Update> {
        self.services.remove(key);
        let mut out = Vec::new();
        self.sync_service(key, &mut out);
        out
    }

    /// The endpoint set of Service `key` now: address → location.
    fn endpoints_of(&self, key: &ObjKey) -> BTreeMap<IpAddr, IpAddr> {
        let mut ready = BTreeMap::new();
        let mut fallback = BTreeMap::new();
        for sk in self.slices_of.get(key).into_iter().flatten() {
            let Some(slice) = self.slices.get(sk) else {
                continue;
            };
            for ep in &slice.endpoints {
                if !ep.ready && !ep.serving_terminating {
                    continue;
                }
                let Some(loc) = self.node_ip(&ep.node, ep.address) else {
                    if self.warn_unlocated {
                        tracing::warn!(
                            slice = %sk,
                            address = %ep.address,
                            node = %ep.node,
                            reason = self.unlocated_reason(&ep.node, ep.address),
                            "endpoint skipped"
                        );
                    }
                    continue;
                };
                let set = if ep.ready { &mut ready } else { &mut fallback };
                set.entry(ep.address).or_insert(loc);
            }
        }
        if ready.is_empty() { fallback } else { ready }
    }

    fn sync_service(&mut self, key: &ObjKey, out: &mut Vec<Update>) {
        let want = self.services.get(key).cloned();
        if let Some(sent) = self.sent_services.get(key)
            && want.as_ref().is_none_or(|w| w.uid != sent.uid)
        {
            out.push(updates::service_remove(&sent.uid));
            self.sent_services.remove(key);
        }
        let Some(want) = want else {
            return;
        };
        let endpoints = self.endpoints_of(key);
        match self.sent_services.get_mut(key) {
            None => {
                out.push(updates::service_add(&want.uid, &want.ports));
                if !endpoints.is_empty() {
                    out.push(level(&want.uid, &endpoints));
                }
                self.sent_services.insert(
                    key.clone(),
                    SentService {
                        uid: want.uid,
                        ports: want.ports,
                        endpoints,
                    },
                );
            }
            Some(sent) => {
                if sent.ports != want.ports {
                    out.push(updates::service_add(&want.uid, &want.ports));
                    sent.ports = want.ports;
                }
                if sent.endpoints != endpoints {
                    out.push(level(&want.uid, &endpoints));
                    sent.endpoints = endpoints;
                }
            }
        }
    }

    // ---- EndpointSlices ----

    /// An EndpointSlice was added or changed.
    pub fn apply_slice(&mut self, slice: &EndpointSlice) -> Vec<Update> {
        let Some(key) = ObjKey::of(Kind::EndpointSlice, &slice.metadata) else {
            return Vec::new();
        };
        self.seen(Kind::EndpointSlice, &key);
        let service = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
            .filter(|s| !s.is_empty());
        let Some(service) = service else {
            tracing::debug!(slice = %key, "EndpointSlice without label {SERVICE_NAME_LABEL}: no Service");
            return self.delete_slice(&key);
        };
        let entry = SliceEntry {
            service: ObjKey::new(&key.namespace, service),
            endpoints: slice_endpoints(&key, slice),
        };
        self.replace_slice(&key, Some(entry))
    }

    /// An EndpointSlice was deleted.
    pub fn delete_slice(&mut self, key: &ObjKey) -> Vec<Update> {
        self.replace_slice(key, None)
    }

    fn replace_slice(&mut self, key: &ObjKey, new: Option<SliceEntry>) -> Vec<Update> {
        let mut affected = BTreeSet::new();
        if let Some(old) = self.slices.remove(key) {
            for ep in &old.endpoints {
                if let Some(m) = self.services_on_node.get_mut(&ep.node) {
                    if let Some(c) = m.get_mut(&old.service) {
                        *c -= 1;
                        if *c == 0 {
                            m.remove(&old.service);
                        }
                    }
                    if m.is_empty() {
                        self.services_on_node.remove(&ep.node);
                    }
                }
            }
            if let Some(s) = self.slices_of.get_mut(&old.service) {
                s.remove(key);
                if s.is_empty() {
                    self.slices_of.remove(&old.service);
                }
            }
            affected.insert(old.service);
        }
        if let Some(new) = new {
            for ep in &new.endpoints {
                *self
                    .services_on_node
                    .entry(ep.node.clone())
                    .or_default()
                    .entry(new.service.clone())
                    .or_default() += 1;
            }
            self.slices_of
                .entry(new.service.clone())
                .or_default()
                .insert(key.clone());
            affected.insert(new.service.clone());
            self.slices.insert(key.clone(), new);
        }
        let mut out = Vec::new();
        for s in affected {
            self.sync_service(&s, &mut out);
        }
        out
    }

    // ---- Nodes ----

    /// A Node was added or changed: the endpoints and pods on it are re-located if its
    /// InternalIPs changed.
    pub fn apply_node(&mut self, node: &Node) -> Vec<Update> {
        let Some(key) = ObjKey::of(Kind::Node, &node.metadata) else {
            return Vec::new();
        };
        self.seen(Kind::Node, &key);
        let ips = NodeIps::of(&key, node);
        if ips == NodeIps::default() {
            tracing::warn!(node = %key, "node has no valid InternalIP: endpoints and pods on it cannot be located");
        }
        if self.nodes.get(&key.name) == Some(&ips) {
            return Vec::new();
        }
        self.nodes.insert(key.name.clone(), ips);
        self.node_changed(&key.name)
    }

    /// A Node was deleted.
    pub fn delete_node(&mut self, name: &str) -> Vec<Update> {
        if self.nodes.remove(name).is_none() {
            return Vec::new();
        }
        self.node_changed(name)
    }

    fn node_changed(&mut self, name: &str) -> Vec<Update> {
        let mut out = Vec::new();
        let services: Vec<ObjKey> = self
            .services_on_node
            .get(name)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        for s in services {
            self.sync_service(&s, &mut out);
        }
        let pods: Vec<ObjKey> = self
            .pods_on_node
            .get(name)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for p in pods {
            self.sync_pod(&p, &mut out);
        }
        out
    }

    /// The InternalIPs of node `name`, if the node is known.
    pub fn node_ips(&self, name: &str) -> Option<NodeIps> {
        self.nodes.get(name).copied()
    }

    // ---- Pods ----

    /// A Pod was added or changed.
    pub fn apply_pod(&mut self, pod: &Pod) -> Vec<Update> {
        let Some(key) = ObjKey::of(Kind::Pod, &pod.metadata) else {
            return Vec::new();
        };
        self.seen(Kind::Pod, &key);
        match self.pod_entry(&key, pod) {
            Ok(Some(entry)) => self.replace_pod(&key, Some(entry)),
            Ok(None) => self.replace_pod(&key, None),
            Err(()) => Vec::new(),
        }
    }

    /// A Pod was deleted.
    pub fn delete_pod(&mut self, key: &ObjKey) -> Vec<Update> {
        self.replace_pod(key, None)
    }

    /// `Ok(None)`: the pod is not reported (no egress, other node, terminal, host network, no IP
    /// yet); `Err`: malformed (logged), what was sent stays.
    fn pod_entry(&self, key: &ObjKey, pod: &Pod) -> Result<Option<PodEntry>, ()> {
        let egress = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(EGRESS_LABEL))
            .map(|e| e.trim())
            .unwrap_or("");
        if egress.is_empty() {
            tracing::debug!(pod = %key, "pod not reported: no {EGRESS_LABEL} label value");
            return Ok(None);
        }
        let spec = pod.spec.as_ref();
        let node = spec.and_then(|s| s.node_name.as_deref()).unwrap_or("");
        if let Some(only) = &self.config.node
            && node != only
        {
            return Ok(None);
        }
        if spec.and_then(|s| s.host_network).unwrap_or(false) {
            tracing::debug!(pod = %key, "pod not reported: it uses the host network");
            return Ok(None);
        }
        let status = pod.status.as_ref();
        if matches!(
            status.and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        ) {
            return Ok(None);
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or("").trim();
        if uid.is_empty() {
            tracing::warn!(pod = %key, "pod skipped: it has no metadata.uid");
            return Err(());
        }
        if node.is_empty() {
            // Not scheduled yet: it has no IP either.
            return Ok(None);
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
                    tracing::warn!(pod = %key, field = %field, value = %value, reason, "pod address skipped");
                }
            }
        }
        if addresses.is_empty() && !raw.is_empty() {
            return Err(());
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
                    tracing::warn!(pod = %key, field = "status.hostIPs", value = h, reason, "pod host IP ignored");
                }
            }
        }
        Ok(Some(PodEntry {
            uid: uid.to_owned(),
            node: node.to_owned(),
            addresses,
            host_ips,
            egress: egress.to_owned(),
        }))
    }

    fn replace_pod(&mut self, key: &ObjKey, new: Option<PodEntry>) -> Vec<Update> {
        if let Some(old) = self.pods.remove(key)
            && let Some(s) = self.pods_on_node.get_mut(&old.node)
        {
            s.remove(key);
            if s.is_empty() {
                self.pods_on_node.remove(&old.node);
            }
        }
        if let Some(new) = new {
            self.pods_on_node
                .entry(new.node.clone())
                .or_default()
                .insert(key.clone());
            self.pods.insert(key.clone(), new);
        }
        let mut out = Vec::new();
        self.sync_pod(key, &mut out);
        out
    }

    fn sync_pod(&mut self, key: &ObjKey, out: &mut Vec<Update>) {
        let want = self.pods.get(key).map(|p| {
            let mut at = BTreeMap::new();
            for &a in &p.addresses {
                match self.pod_location(p, a) {
                    Some(loc) => {
                        at.insert(a, loc);
                    }
                    None if self.warn_unlocated => tracing::warn!(
                        pod = %key,
                        address = %a,
                        node = %p.node,
                        reason = self.unlocated_reason(&p.node, a),
                        "pod address skipped"
                    ),
                    None => {}
                }
            }
            SentPod {
                uid: p.uid.clone(),
                egress: p.egress.clone(),
                at,
            }
        });
        let want = want.filter(|w| !w.at.is_empty());
        let sent = self.sent_pods.get(key);
        if sent == want.as_ref() {
            return;
        }
        let pod_key = key.to_string();
        if let Some(s) = sent {
            let same_pod = want.as_ref().is_some_and(|w| w.uid == s.uid);
            for (a, l) in &s.at {
                let kept = same_pod && want.as_ref().is_some_and(|w| w.at.get(a) == Some(l));
                if !kept {
                    out.push(updates::pod_remove(
                        &a.to_string(),
                        &l.to_string(),
                        &pod_key,
                        &s.uid,
                    ));
                }
            }
        }
        match want {
            Some(w) => {
                for (a, l) in &w.at {
                    let unchanged = sent.is_some_and(|s| {
                        s.uid == w.uid && s.egress == w.egress && s.at.get(a) == Some(l)
                    });
                    if !unchanged {
                        out.push(updates::pod_add(
                            &a.to_string(),
                            &l.to_string(),
                            &w.egress,
                            &pod_key,
                            &w.uid,
                        ));
                    }
                }
                self.sent_pods.insert(key.clone(), w);
            }
            None => {
                self.sent_pods.remove(key);
            }
        }
    }

    // ---- views ----

    /// Everything sent so far, as a resync view: every inbound identity with its ports and its
    /// endpoints (as a level, when not empty), then every pod. Deterministic order.
    pub fn full_view(&self) -> Vec<Update> {
        let mut out = Vec::new();
        for s in self.sent_services.values() {
            out.push(updates::service_add(&s.uid, &s.ports));
            if !s.endpoints.is_empty() {
                out.push(level(&s.uid, &s.endpoints));
            }
        }
        for (key, p) in &self.sent_pods {
            out.extend(pod_adds(key, p, None));
        }
        out
    }

    /// The pods sent at one location, as a node agent's resync view of it.
    pub fn pods_at(&self, location: IpAddr) -> Vec<Update> {
        let mut out = Vec::new();
        for (key, p) in &self.sent_pods {
            out.extend(pod_adds(key, p, Some(location)));
        }
        out
    }

    /// Every location at which a pod was sent.
    pub fn pod_locations(&self) -> BTreeSet<IpAddr> {
        self.sent_pods
            .values()
            .flat_map(|p| p.at.values().copied())
            .collect()
    }

    /// The UID sent as inbound identity for Service `key`, if any.
    pub fn sent_uid(&self, key: &ObjKey) -> Option<&str> {
        self.sent_services.get(key).map(|s| s.uid.as_str())
    }

    /// Counts for logs: inbound identities sent, endpoints sent, pod addresses sent.
    pub fn counts(&self) -> (usize, usize, usize) {
        (
            self.sent_services.len(),
            self.sent_services.values().map(|s| s.endpoints.len()).sum(),
            self.sent_pods.values().map(|p| p.at.len()).sum(),
        )
    }
}

fn pod_adds(key: &ObjKey, p: &SentPod, only: Option<IpAddr>) -> Vec<Update> {
    let pod_key = key.to_string();
    p.at.iter()
        .filter(|(_, l)| only.is_none_or(|o| o == **l))
        .map(|(a, l)| updates::pod_add(&a.to_string(), &l.to_string(), &p.egress, &pod_key, &p.uid))
        .collect()
}

fn level(uid: &str, endpoints: &BTreeMap<IpAddr, IpAddr>) -> Update {
    updates::endpoints_level(
        uid,
        endpoints
            .iter()
            .map(|(a, l)| updates::endpoint(&a.to_string(), &l.to_string()))
            .collect(),
    )
}

/// The valid endpoints of a slice; malformed ones are skipped with a warning.
fn slice_endpoints(key: &ObjKey, slice: &EndpointSlice) -> Vec<SliceEndpoint> {
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
                tracing::warn!(slice = %key, field = %format!("endpoints[{i}].addresses[0]"), value = %raw, reason, "endpoint skipped");
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
        });
    }
    out
}
