//! Kubernetes objects → clb updates. Pure and synchronous: no kube client, no tokio, no I/O.
//!
//! Decoding an object into a plain record (what is valid, what is ours, what is skipped and why) is
//! [`crate::decode`]'s; this module keeps the records and what was sent. A [`Translator`] keeps
//! indexes of what the watch streams have shown (Services, EndpointSlices, egress-labelled Pods,
//! Nodes) and a record of what it has *sent* (each inbound identity with its ports and endpoint set,
//! each pod with its addresses). Every `apply_*` / `delete_*` recomputes only what the object can
//! affect and returns the **delta**: the updates that take the state server from what was sent to
//! what is wanted now. [`Translator::full_view`] renders the sent record as a resync view, so a
//! resync after any sequence of calls equals the net effect of the deltas.
//!
//! Rules (docs/watcher.md has the long form):
//! - a Service is an inbound identity (its UID) when it is of type `LoadBalancer`, its
//!   `spec.loadBalancerClass` is ours (or unset, when unclassed Services are claimed), it has no
//!   `deletionTimestamp`, and — when a finalizer is required — it carries our finalizer;
//! - its ports are `spec.ports` (TCP, UDP; SCTP and out-of-range ports are skipped with a warning),
//!   each with the port its pods listen on (the load-balancing rule's backend port): a numeric
//!   `targetPort` is that number, an unset one the port itself (sent as target port 0), and a named
//!   one is resolved through the Service's EndpointSlices. A slice's `ports[]` entries are named after
//!   the *Service port's* `name` and carry the number its endpoints use; the number used by the most
//!   of the Service's endpoints (the same endpoints that are sent: ready, else serving-terminating;
//!   every slice, IPv4 and IPv6) wins, ties to the lowest number. With no such endpoint, the number
//!   the most slices state wins (ties lowest), so the rule stays while no pod is ready; with no
//!   slice stating one, the Service port's own number. Endpoints that disagree are a *port-name
//!   conflict*, reported once per change of the situation by [`Translator::take_port_conflicts`].
//!   A change of the resolved number re-sends the Service (`service_add` with the new ports);
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
use std::net::IpAddr;
use std::sync::Arc;

use clb_proto::v1::{IpFamily, ServicePort, Update};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use clb_client::updates;

use crate::decode::{
    self, Decoded, PodRecord, PortRecord, ServiceRecord, SliceRecord, TargetPort, family,
};
pub use crate::decode::{
    DEFAULT_CLASS, EGRESS_LABEL, FINALIZER, Kind, NAT_GATEWAY_ANNOTATION, NodeIps, ObjKey,
    SERVICE_NAME_LABEL, ServiceClass, classify, nat_gateway_name_error, service_ports,
};
use crate::families;
use crate::routing::GatewayScope;
pub use sent::SentView;
use sent::{EMPTY, Sent, SentPod, SentService, SentUnit, level, service_add};

mod sent;

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
    /// With several gateways (`--gateways-file`): the gateway this translator writes to. Only the
    /// Services exposed there are sent, and only endpoints and pods on nodes it serves.
    pub gateway: Option<GatewayScope>,
}

impl Default for TranslatorConfig {
    /// Our default class, unclassed Services claimed, no finalizer required, every node.
    fn default() -> Self {
        Self {
            class: DEFAULT_CLASS.to_owned(),
            claim_unclassed: true,
            require_finalizer: None,
            node: None,
            gateway: None,
        }
    }
}

/// The endpoints of a Service as [`Translator::endpoints_of`] finds them, per family (index 0:
/// IPv4, 1: IPv6): the ready ones, and the serving-and-terminating ones (the fallback).
#[derive(Debug, Default)]
struct FoundEndpoints {
    ready: [BTreeMap<IpAddr, IpAddr>; 2],
    fallback: [BTreeMap<IpAddr, IpAddr>; 2],
}

impl FoundEndpoints {
    /// Both families as one set: the ready ones, else the fallback; and whether they are the
    /// ready ones (what a Service of no stated family is sent, and what ports are resolved on).
    fn union(&self) -> (BTreeMap<IpAddr, IpAddr>, bool) {
        let join = |m: &[BTreeMap<IpAddr, IpAddr>; 2]| {
            let mut all = m[0].clone();
            all.extend(m[1].iter().map(|(a, l)| (*a, *l)));
            all
        };
        if self.ready.iter().all(BTreeMap::is_empty) {
            (join(&self.fallback), false)
        } else {
            (join(&self.ready), true)
        }
    }

    /// The set sent to an identity of `family`: per family, the ready endpoints, else the
    /// fallback (kube-proxy's rule, which it applies per family). No stated family (an API server
    /// from before dual stack) is IPv4, as its frontend: an IPv6 endpoint could never receive its
    /// traffic, and the state server refuses it.
    fn of_family(&self, family: IpFamily) -> BTreeMap<IpAddr, IpAddr> {
        let i = match family {
            IpFamily::Ipv4 | IpFamily::Unspecified => 0,
            IpFamily::Ipv6 => 1,
        };
        if self.ready[i].is_empty() {
            self.fallback[i].clone()
        } else {
            self.ready[i].clone()
        }
    }
}

/// A port-name conflict: the endpoints of a Service disagree on the number behind a named
/// `targetPort` (for example a rollout that renamed or renumbered a container port, or two
/// Deployments behind one Service), so one number was chosen for the load-balancing rule and the
/// endpoints that use another get no traffic on that port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortConflict {
    /// The Service.
    pub service: ObjKey,
    /// The Service port's `name` (empty for a Service's only, unnamed port): the name of the
    /// EndpointSlice ports whose numbers disagree.
    pub port_name: String,
    /// The number chosen: the one the most endpoints use, ties to the lowest.
    pub chosen: u16,
    /// Every number in use with how many endpoints use it, by number.
    pub numbers: Vec<(u16, usize)>,
    /// A sentence for a Kubernetes Warning Event on the Service.
    pub message: String,
}

/// A conflict as [`Translator::sync_service`] finds it: (Service port name, chosen, numbers).
type FoundConflict = (String, u16, Vec<(u16, usize)>);

/// The incremental translator. See the module documentation.
#[derive(Debug)]
pub struct Translator {
    config: TranslatorConfig,
    services: HashMap<ObjKey, ServiceRecord>,
    slices: HashMap<ObjKey, SliceRecord>,
    slices_of: HashMap<ObjKey, BTreeSet<ObjKey>>,
    nodes: HashMap<String, NodeIps>,
    /// Known nodes served by another gateway (or none): with a [`GatewayScope`] only.
    foreign: HashSet<String>,
    /// Nodes moving to another gateway, still served here until the new gateway has them.
    held: HashSet<String>,
    /// Services exposed here besides their annotations' selection (PoolServices of others).
    extra: HashSet<ObjKey>,
    pods: HashMap<ObjKey, PodRecord>,
    /// node → service → number of slice endpoints of that service on the node.
    services_on_node: HashMap<String, HashMap<ObjKey, usize>>,
    /// node → pods on it.
    pods_on_node: HashMap<String, BTreeSet<ObjKey>>,
    /// What was sent (copy on write: [`SentView`]).
    sent: Arc<Sent>,
    /// Per kind, during a relist: the keys listed so far.
    relist: [Option<HashSet<ObjKey>>; 4],
    /// Whether an endpoint or pod that cannot be located is logged as a warning (off during the
    /// first list, when nodes may simply not have been listed yet).
    warn_unlocated: bool,
    /// Service → Service port name → the port-name conflict now: (chosen, numbers in use). A
    /// conflict is reported when this changes, not on every recompute.
    conflicts: HashMap<ObjKey, BTreeMap<String, (u16, Vec<u16>)>>,
    /// Conflicts found and not taken yet, the latest per (Service, port name): bounded by the
    /// named ports of the Services that exist.
    new_conflicts: BTreeMap<(ObjKey, String), PortConflict>,
    /// Addresses of pods whose only unmet readiness condition is clb's gate
    /// (`clb.azure.com/programmed`, [`crate::gate`]): their endpoints are programmed as if ready,
    /// or the gate could never turn true (the pod is not Ready, so its endpoint is not either).
    gate_ready: HashSet<IpAddr>,
    /// address → the slices that list it (for the gate: which Services list a pod).
    address_slices: HashMap<IpAddr, BTreeSet<ObjKey>>,
    /// Services of our class (whatever their finalizer or exposure): a pod one of them lists
    /// waits for its gate even before the Service is programmed.
    ours: HashSet<ObjKey>,
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
            foreign: HashSet::new(),
            held: HashSet::new(),
            extra: HashSet::new(),
            pods: HashMap::new(),
            services_on_node: HashMap::new(),
            pods_on_node: HashMap::new(),
            sent: Arc::default(),
            relist: Default::default(),
            warn_unlocated: true,
            conflicts: HashMap::new(),
            new_conflicts: BTreeMap::new(),
            gate_ready: HashSet::new(),
            address_slices: HashMap::new(),
            ours: HashSet::new(),
        }
    }

    /// Port-name conflicts found since the last call: one per Service and port whose ready
    /// endpoints disagree on the number behind a named targetPort. A conflict is found again only
    /// when its situation changes (the numbers in use or the one chosen), or after it was gone; one
    /// whose Service went before it was taken is not returned.
    pub fn take_port_conflicts(&mut self) -> Vec<PortConflict> {
        std::mem::take(&mut self.new_conflicts)
            .into_values()
            .collect()
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
                if self.node_ip(&ep.node, ep.address).is_none() && !self.is_foreign(&ep.node) {
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
                if self.pod_location(pod, a).is_none() && !self.is_foreign(&pod.node) {
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
        if self.is_foreign(node) {
            return None;
        }
        self.nodes.get(node).and_then(|n| n.for_address(address))
    }

    /// Whether node `node` is known and served by another gateway (not held here).
    fn is_foreign(&self, node: &str) -> bool {
        self.foreign.contains(node) && !self.held.contains(node)
    }

    /// Whether a node with these labels is served by this translator's gateway (always without
    /// a [`GatewayScope`]).
    fn serves(&self, node: &Node) -> bool {
        let Some(scope) = &self.config.gateway else {
            return true;
        };
        let labels = node.metadata.labels.clone().unwrap_or_default();
        scope.serves_node(&labels)
    }

    fn unlocated_reason(&self, node: &str, address: IpAddr) -> String {
        match self.nodes.get(node) {
            None => format!("node {node:?} is unknown"),
            Some(_) => format!("node {node:?} has no {} InternalIP", family(address)),
        }
    }

    /// A pod address's location: its node's InternalIP of the family, else the pod's hostIP of
    /// the family (kubelet's view of where the pod is). With a [`GatewayScope`], only for a node
    /// this gateway serves (or holds): a pod's hostIPs do not say which gateway it belongs to.
    fn pod_location(&self, pod: &PodRecord, address: IpAddr) -> Option<IpAddr> {
        if self.config.gateway.is_some()
            && (!self.nodes.contains_key(&pod.node) || self.is_foreign(&pod.node))
        {
            // Which gateway an unknown node belongs to is not known; a node another gateway
            // serves is that gateway's (its pods must not reach this one through their hostIPs).
            return None;
        }
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
                    .chain(self.sent.services.keys())
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
                    .chain(self.sent.pods.keys())
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
        if classify(svc, &self.config) == ServiceClass::Ours {
            self.ours.insert(key.clone());
        } else {
            self.ours.remove(&key);
        }
        match decode::service(&key, svc, &self.config) {
            Decoded::Record(record) => match self.exposed_here(&key, svc) {
                Ok(true) => {
                    self.services.insert(key.clone(), record);
                }
                Ok(false) => {
                    self.services.remove(&key);
                }
                // Refused annotations change nothing (the write-back publishes a Warning Event).
                Err(e) => {
                    tracing::debug!(service = %key, error = %e, "gateway selection refused");
                    return Vec::new();
                }
            },
            Decoded::Ignored => {
                self.services.remove(&key);
            }
            Decoded::Malformed => return Vec::new(),
        }
        let mut out = Vec::new();
        self.sync_service(&key, &mut out);
        out
    }

    /// Whether Service `key` is exposed at this translator's gateway: always without a
    /// [`GatewayScope`]; else when its annotations select it or a PoolService of someone else
    /// ([`Translator::set_extra`]) asks for it.
    fn exposed_here(
        &self,
        key: &ObjKey,
        svc: &Service,
    ) -> Result<bool, crate::routing::SelectionError> {
        let Some(scope) = &self.config.gateway else {
            return Ok(true);
        };
        if self.extra.contains(key) {
            return Ok(true);
        }
        scope.exposes(svc.metadata.annotations.as_ref())
    }

    /// Exposes Service `key` here whatever its annotations select (`on`), or no longer; the
    /// Service must be applied again for this to take effect.
    pub fn set_extra(&mut self, key: &ObjKey, on: bool) {
        if on {
            self.extra.insert(key.clone());
        } else {
            self.extra.remove(key);
        }
    }

    /// A Service was deleted.
    pub fn delete_service(&mut self, key: &ObjKey) -> Vec<Update> {
        self.services.remove(key);
        self.ours.remove(key);
        let mut out = Vec::new();
        self.sync_service(key, &mut out);
        out
    }

    /// The endpoints of Service `key` now, per family, ready and fallback (address → location).
    fn endpoints_of(&self, key: &ObjKey) -> FoundEndpoints {
        let mut found = FoundEndpoints::default();
        for sk in self.slices_of.get(key).into_iter().flatten() {
            let Some(slice) = self.slices.get(sk) else {
                continue;
            };
            for ep in &slice.endpoints {
                let ep_ready = self.counts_ready(ep);
                if !ep_ready && !ep.serving_terminating {
                    continue;
                }
                let Some(loc) = self.node_ip(&ep.node, ep.address) else {
                    if self.warn_unlocated && !self.is_foreign(&ep.node) {
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
                let family = usize::from(ep.address.is_ipv6());
                let set = if ep_ready {
                    &mut found.ready[family]
                } else {
                    &mut found.fallback[family]
                };
                set.entry(ep.address).or_insert(loc);
            }
        }
        found
    }

    /// The ports to send for Service `key`: each with its target port, a named one resolved
    /// through the slices (see the module documentation); and the port-name conflicts found.
    /// `endpoints` and `ready` are [`Translator::endpoints_of`]'s.
    fn ports_of(
        &self,
        key: &ObjKey,
        records: &[PortRecord],
        endpoints: &BTreeMap<IpAddr, IpAddr>,
        ready: bool,
    ) -> (Vec<ServicePort>, Vec<FoundConflict>) {
        let mut conflicts = Vec::new();
        let ports = records
            .iter()
            .map(|r| {
                let target_port = match &r.target {
                    TargetPort::Same => 0,
                    TargetPort::Number(n) => *n,
                    TargetPort::Named(_) => {
                        let (chosen, numbers) = self.resolve_named(key, r, endpoints, ready);
                        if numbers.len() > 1 {
                            conflicts.push((r.name.clone(), chosen, numbers));
                        }
                        chosen
                    }
                };
                ServicePort {
                    port: u32::from(r.port),
                    protocol: r.protocol,
                    target_port: u32::from(target_port),
                }
            })
            .collect();
        (ports, conflicts)
    }

    /// The number behind the named targetPort of `port`, and every number the used endpoints
    /// use with how many use it (by number; more than one is a conflict).
    fn resolve_named(
        &self,
        key: &ObjKey,
        port: &PortRecord,
        endpoints: &BTreeMap<IpAddr, IpAddr>,
        ready: bool,
    ) -> (u16, Vec<(u16, usize)>) {
        // number → the used endpoints whose slice says it; number → slices that say it.
        let mut used: BTreeMap<u16, BTreeSet<IpAddr>> = BTreeMap::new();
        let mut stated: BTreeMap<u16, usize> = BTreeMap::new();
        for sk in self.slices_of.get(key).into_iter().flatten() {
            let Some(slice) = self.slices.get(sk) else {
                continue;
            };
            let Some(sp) = slice
                .ports
                .iter()
                .find(|p| p.name == port.name && p.protocol == port.protocol)
            else {
                continue;
            };
            *stated.entry(sp.port).or_default() += 1;
            for ep in &slice.endpoints {
                let counted = if ready {
                    self.counts_ready(ep)
                } else {
                    ep.serving_terminating
                };
                if counted && endpoints.contains_key(&ep.address) {
                    used.entry(sp.port).or_default().insert(ep.address);
                }
            }
        }
        let numbers: Vec<(u16, usize)> = used.into_iter().map(|(n, s)| (n, s.len())).collect();
        let chosen = most_used(&numbers)
            .or_else(|| most_used(&stated.into_iter().collect::<Vec<_>>()))
            .unwrap_or(port.port);
        (chosen, numbers)
    }

    /// Records the port-name conflicts of Service `key` now (none when it is gone): each one whose
    /// situation changed is reported by [`Translator::take_port_conflicts`].
    fn conflicts_now(&mut self, key: &ObjKey, found: Vec<FoundConflict>) {
        if found.is_empty() {
            self.conflicts.remove(key);
            if !self.services.contains_key(key) && !self.new_conflicts.is_empty() {
                self.new_conflicts.retain(|(s, _), _| s != key);
            }
            return;
        }
        let before = self.conflicts.remove(key).unwrap_or_default();
        let mut now = BTreeMap::new();
        for (name, chosen, numbers) in found {
            let situation = (chosen, numbers.iter().map(|&(n, _)| n).collect::<Vec<_>>());
            if before.get(&name) != Some(&situation) {
                let conflict = PortConflict {
                    message: conflict_message(key, &name, chosen, &numbers),
                    service: key.clone(),
                    port_name: name.clone(),
                    chosen,
                    numbers,
                };
                self.new_conflicts
                    .insert((key.clone(), name.clone()), conflict);
            }
            now.insert(name, situation);
        }
        self.conflicts.insert(key.clone(), now);
    }

    fn sync_service(&mut self, key: &ObjKey, out: &mut Vec<Update>) {
        let want = self.services.get(key).cloned();
        if let Some(sent) = self.sent.services.get(key)
            && want.as_ref().is_none_or(|w| w.uid != sent.uid)
        {
            for u in &sent.units {
                out.push(updates::service_remove(&u.service_id));
            }
            Arc::make_mut(&mut self.sent).services.remove(key);
        }
        let Some(want) = want else {
            self.conflicts_now(key, Vec::new());
            return;
        };
        let found = self.endpoints_of(key);
        let (endpoints, ready) = found.union();
        let (ports, conflicts) = self.ports_of(key, &want.ports, &endpoints, ready);
        self.conflicts_now(key, conflicts);
        let units: Vec<SentUnit> = families::identities(&want.uid, &want.families)
            .into_iter()
            .enumerate()
            .map(|(i, (service_id, family))| SentUnit {
                endpoints: found.of_family(family),
                settings: want.admission.settings(family, i == 0),
                service_id,
                family,
            })
            .collect();
        let sent = Arc::make_mut(
            Arc::make_mut(&mut self.sent)
                .services
                .entry(key.clone())
                .or_insert_with(|| {
                    Arc::new(SentService {
                        uid: want.uid.clone(),
                        ports: ports.clone(),
                        units: Vec::new(),
                    })
                }),
        );
        let ports_changed = sent.ports != ports;
        sent.ports = ports;
        // A family no longer asked for goes (the server drains its addresses, then deletes it;
        // the other family is untouched); a family asked for anew is added before its endpoints.
        // (A family stated anew for the same identity is an add: the server refuses a change of
        // its frontend family.)
        for old in &sent.units {
            if !units.iter().any(|u| u.service_id == old.service_id) {
                out.push(updates::service_remove(&old.service_id));
            }
        }
        for unit in &units {
            let before = sent.units.iter().find(|u| u.service_id == unit.service_id);
            let add = before.is_none_or(|b| b.family != unit.family || b.settings != unit.settings)
                || ports_changed;
            let was = before.map_or(&EMPTY, |u| &u.endpoints);
            let set = *was != unit.endpoints && !(before.is_none() && unit.endpoints.is_empty());
            // A family stated for an identity sent without one (the Service got `ipFamilies`):
            // its endpoints first, so that the server holds none of the other family when the
            // family comes (it refuses a family that the service's endpoints contradict).
            let endpoints_first = before.is_some_and(|b| b.family != unit.family);
            if set && endpoints_first {
                out.push(level(&unit.service_id, &unit.endpoints));
            }
            if add {
                out.push(service_add(unit, &sent.ports));
            }
            if set && !endpoints_first {
                out.push(level(&unit.service_id, &unit.endpoints));
            }
        }
        sent.units = units;
    }

    // ---- EndpointSlices ----

    /// An EndpointSlice was added or changed.
    pub fn apply_slice(&mut self, slice: &EndpointSlice) -> Vec<Update> {
        let Some(key) = ObjKey::of(Kind::EndpointSlice, &slice.metadata) else {
            return Vec::new();
        };
        self.seen(Kind::EndpointSlice, &key);
        match decode::slice(&key, slice) {
            Decoded::Record(record) => self.replace_slice(&key, Some(record)),
            Decoded::Ignored | Decoded::Malformed => self.delete_slice(&key),
        }
    }

    /// An EndpointSlice was deleted.
    pub fn delete_slice(&mut self, key: &ObjKey) -> Vec<Update> {
        self.replace_slice(key, None)
    }

    fn replace_slice(&mut self, key: &ObjKey, new: Option<SliceRecord>) -> Vec<Update> {
        let mut affected = BTreeSet::new();
        if let Some(old) = self.slices.remove(key) {
            for ep in &old.endpoints {
                if let Some(set) = self.address_slices.get_mut(&ep.address) {
                    set.remove(key);
                    if set.is_empty() {
                        self.address_slices.remove(&ep.address);
                    }
                }
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
                self.address_slices
                    .entry(ep.address)
                    .or_default()
                    .insert(key.clone());
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

    // ---- The readiness gate ----

    /// Whether endpoint `ep` counts as ready: the slice says so, or its pod's only unmet
    /// readiness condition is clb's gate (and it is not terminating).
    fn counts_ready(&self, ep: &crate::decode::SliceEndpoint) -> bool {
        ep.ready || (!ep.terminating && self.gate_ready.contains(&ep.address))
    }

    /// The pod at `address` has every container ready and every readiness gate but clb's met
    /// (`on`), or no longer: its endpoints are programmed as if ready. Returns the updates.
    pub fn set_gate_ready(&mut self, address: IpAddr, on: bool) -> Vec<Update> {
        let changed = if on {
            self.gate_ready.insert(address)
        } else {
            self.gate_ready.remove(&address)
        };
        let mut out = Vec::new();
        if !changed {
            return out;
        }
        let services: BTreeSet<ObjKey> = self
            .address_slices
            .get(&address)
            .into_iter()
            .flatten()
            .filter_map(|k| self.slices.get(k).map(|s| s.service.clone()))
            .collect();
        for s in services {
            self.sync_service(&s, &mut out);
        }
        out
    }

    /// The Services of ours (exposed in this translator's gateway) whose EndpointSlices list
    /// `address`, each as `(inbound identity, location)`: what the gate waits for. A Service whose endpoint
    /// cannot be located here (its node is another gateway's) is left out.
    pub fn gate_services(&self, address: IpAddr) -> Vec<(String, IpAddr)> {
        let mut out = Vec::new();
        for k in self.address_slices.get(&address).into_iter().flatten() {
            let Some(slice) = self.slices.get(k) else {
                continue;
            };
            // Sent to this gateway: ours, exposed here, with the finalizer when one is required.
            let Some(svc) = self.sent.services.get(&slice.service) else {
                continue;
            };
            // The identity of the address's family.
            let Some(unit) = svc
                .units
                .iter()
                .find(|u| families::takes(u.family, address.is_ipv4()))
            else {
                continue;
            };
            for ep in slice.endpoints.iter().filter(|e| e.address == address) {
                if let Some(loc) = self.node_ip(&ep.node, address) {
                    out.push((unit.service_id.clone(), loc));
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// Whether some EndpointSlice of any Service lists `address` (ours or not, in any gateway).
    pub fn lists_address(&self, address: IpAddr) -> bool {
        self.address_slices.contains_key(&address)
    }

    /// Whether an EndpointSlice of a Service of our class lists `address` (programmed yet or
    /// not: its finalizer may still be coming).
    pub fn ours_lists_address(&self, address: IpAddr) -> bool {
        self.address_slices
            .get(&address)
            .into_iter()
            .flatten()
            .filter_map(|k| self.slices.get(k))
            .any(|slice| self.ours.contains(&slice.service))
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
        let foreign = !self.serves(node);
        if ips == NodeIps::default() && !foreign {
            tracing::warn!(node = %key, "node has no valid InternalIP: endpoints and pods on it cannot be located");
        }
        if self.nodes.get(&key.name) == Some(&ips) && self.foreign.contains(&key.name) == foreign {
            return Vec::new();
        }
        self.nodes.insert(key.name.clone(), ips);
        if foreign {
            self.foreign.insert(key.name.clone());
        } else {
            self.foreign.remove(&key.name);
        }
        self.node_changed(&key.name)
    }

    /// A Node was deleted.
    pub fn delete_node(&mut self, name: &str) -> Vec<Update> {
        self.foreign.remove(name);
        self.held.remove(name);
        if self.nodes.remove(name).is_none() {
            return Vec::new();
        }
        self.node_changed(name)
    }

    /// Keeps node `name` served here while it moves to another gateway (`on`), or lets it go:
    /// returns the delta.
    pub fn hold_node(&mut self, name: &str, on: bool) -> Vec<Update> {
        let changed = if on {
            self.held.insert(name.to_owned())
        } else {
            self.held.remove(name)
        };
        if changed && self.foreign.contains(name) {
            self.node_changed(name)
        } else {
            Vec::new()
        }
    }

    /// Whether node `name` is known and served here (or held here while it moves).
    pub fn serves_node(&self, name: &str) -> bool {
        self.nodes.contains_key(name) && !self.is_foreign(name)
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
        if self.is_foreign(name) {
            return None;
        }
        self.nodes.get(name).copied()
    }

    /// Every known node with its InternalIPs, by name.
    pub fn nodes(&self) -> Vec<(String, NodeIps)> {
        let mut nodes: Vec<(String, NodeIps)> = self
            .nodes
            .iter()
            .filter(|(n, _)| !self.is_foreign(n))
            .map(|(n, ips)| (n.clone(), *ips))
            .collect();
        nodes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        nodes
    }

    // ---- Pods ----

    /// A Pod was added or changed.
    pub fn apply_pod(&mut self, pod: &Pod) -> Vec<Update> {
        let Some(key) = ObjKey::of(Kind::Pod, &pod.metadata) else {
            return Vec::new();
        };
        self.seen(Kind::Pod, &key);
        match decode::pod(&key, pod, self.config.node.as_deref()) {
            Decoded::Record(record) => self.replace_pod(&key, Some(record)),
            Decoded::Ignored => self.replace_pod(&key, None),
            Decoded::Malformed => Vec::new(),
        }
    }

    /// A Pod was deleted.
    pub fn delete_pod(&mut self, key: &ObjKey) -> Vec<Update> {
        self.replace_pod(key, None)
    }

    fn replace_pod(&mut self, key: &ObjKey, new: Option<PodRecord>) -> Vec<Update> {
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
                    None if self.warn_unlocated && !self.is_foreign(&p.node) => tracing::warn!(
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
                nat_gateway: p.nat_gateway.clone(),
                at,
            }
        });
        let want = want.filter(|w| !w.at.is_empty());
        let sent = self.sent.pods.get(key).map(|p| &**p);
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
                        s.uid == w.uid
                            && s.egress == w.egress
                            && s.nat_gateway == w.nat_gateway
                            && s.at.get(a) == Some(l)
                    });
                    if !unchanged {
                        out.push(updates::pod_add_bringing(
                            &a.to_string(),
                            &l.to_string(),
                            &w.egress,
                            &pod_key,
                            &w.uid,
                            &w.nat_gateway,
                        ));
                    }
                }
                Arc::make_mut(&mut self.sent)
                    .pods
                    .insert(key.clone(), Arc::new(w));
            }
            None => {
                Arc::make_mut(&mut self.sent).pods.remove(key);
            }
        }
    }

    // ---- views ----

    /// A snapshot of everything sent so far (O(1): see [`SentView`]).
    pub fn sent(&self) -> SentView {
        SentView(self.sent.clone())
    }

    /// Everything sent so far, as a resync view ([`SentView::full_view`]).
    pub fn full_view(&self) -> Vec<Update> {
        self.sent().full_view()
    }

    /// Every location at which a pod was sent ([`SentView::pod_locations`]).
    pub fn pod_locations(&self) -> BTreeSet<IpAddr> {
        self.sent().pod_locations()
    }

    /// The UID sent as inbound identity for Service `key`, if any.
    pub fn sent_uid(&self, key: &ObjKey) -> Option<&str> {
        self.sent.services.get(key).map(|s| s.uid.as_str())
    }

    /// The inbound identities sent for Service `key`, primary family first, each with its family
    /// (`crate::families`).
    pub fn sent_identities(&self, key: &ObjKey) -> Vec<(String, IpFamily)> {
        self.sent
            .services
            .get(key)
            .map(|s| {
                s.units
                    .iter()
                    .map(|u| (u.service_id.clone(), u.family))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Counts for logs: inbound identities sent, endpoints sent, pod addresses sent.
    pub fn counts(&self) -> (usize, usize, usize) {
        (
            self.sent.services.values().map(|s| s.units.len()).sum(),
            self.sent
                .services
                .values()
                .flat_map(|s| &s.units)
                .map(|u| u.endpoints.len())
                .sum(),
            self.sent.pods.values().map(|p| p.at.len()).sum(),
        )
    }
}

/// The number with the largest count, ties to the lowest number (`counts` sorted by number).
fn most_used(counts: &[(u16, usize)]) -> Option<u16> {
    let mut best: Option<(u16, usize)> = None;
    for &(n, c) in counts {
        if best.is_none_or(|(_, b)| c > b) {
            best = Some((n, c));
        }
    }
    best.map(|(n, _)| n)
}

/// The Warning Event sentence of a port-name conflict.
fn conflict_message(service: &ObjKey, name: &str, chosen: u16, numbers: &[(u16, usize)]) -> String {
    let port = if name.is_empty() {
        "the Service's port".to_owned()
    } else {
        format!("Service port {name:?}")
    };
    let list: Vec<String> = numbers
        .iter()
        .map(|&(n, c)| format!("{n} ({c} endpoint{})", if c == 1 { "" } else { "s" }))
        .collect();
    format!(
        "the endpoints of {port} of Service {service} disagree on the number behind its named \
         targetPort: {}; the load balancer sends traffic to port {chosen}, so the endpoints on \
         other numbers get none on this port",
        list.join(", ")
    )
}
