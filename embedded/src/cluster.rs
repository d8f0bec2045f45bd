//! A synthetic Kubernetes cluster: apps (Deployments) of pods spread over nodes, a LoadBalancer
//! Service per app (and a second one for every third app), egresses, pods that are not ready, and
//! the changes a watcher would send for it (full view, rollouts, deletions). It also computes what NRP
//! must hold once converged ([`Expected`]).
//!
//! Everything is deterministic for a given [`ClusterSpec::seed`].

use std::collections::{BTreeMap, BTreeSet};

use clb_proto::v1::{
    self, EgressUpdate, Endpoint, EndpointSet, EndpointsUpdate, PodUpdate, ServicePort,
    ServiceUpdate, Update, endpoints_update::Change, update::Kind,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ADD: i32 = v1::Operation::Add as i32;
const REMOVE: i32 = v1::Operation::Remove as i32;

/// The shape of a synthetic cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSpec {
    /// Nodes (locations).
    pub locations: usize,
    /// Apps (Deployments); app `i` has the Service `svc-{i}`, and every third app also
    /// `svc-{i}-internal` (so some addresses belong to two inbound identities).
    pub apps: usize,
    /// Pods per app.
    pub pods_per_app: usize,
    /// Egresses (`egress-{j}`); app `i` uses `egress-{i % egresses}`, except every fifth app, which has
    /// no egress. 0 = no egresses at all.
    pub egresses: usize,
    /// Every n-th pod created is not ready (kept out of the endpoints; still a pod with its egress).
    /// 0 = every pod is ready.
    pub not_ready_every: usize,
    /// Seed of the placement of pods on nodes.
    pub seed: u64,
}

impl ClusterSpec {
    /// A small cluster for end-to-end tests: `locations` nodes, `apps` apps of `pods_per_app` pods,
    /// 3 egresses, every 10th pod not ready.
    pub fn small(locations: usize, apps: usize, pods_per_app: usize) -> Self {
        Self {
            locations,
            apps,
            pods_per_app,
            egresses: 3,
            not_ready_every: 10,
            seed: 7,
        }
    }

    /// Pods in the cluster.
    pub fn pods(&self) -> usize {
        self.apps * self.pods_per_app
    }
}

/// One pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    /// `namespace/name`.
    pub key: String,
    /// The pod's UID.
    pub uid: String,
    /// The app it belongs to.
    pub app: usize,
    /// Pod IP.
    pub address: String,
    /// Node IP (its location).
    pub location: String,
    /// Whether it is ready (in its Services' endpoints).
    pub ready: bool,
}

/// What NRP must hold once converged: the readiness-filtered desired state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expected {
    /// Inbound identities (load balancers).
    pub inbound: BTreeSet<String>,
    /// Outbound identities (NAT gateways).
    pub outbound: BTreeSet<String>,
    /// `(location, address) → services`; only addresses with at least one service.
    pub addresses: BTreeMap<(String, String), BTreeSet<String>>,
    /// The load-balancing rules of inbound services, as `(protocol, frontend port, backend port)`
    /// (protocol `"tcp"` or `"udp"`; the backend port is the pods' port, the target port). Only the
    /// services listed are checked: one not listed may have any rules.
    pub rules: BTreeMap<String, BTreeSet<Rule>>,
}

/// One load-balancing rule: `(protocol, frontend port, backend port)`, protocol `"tcp"` or `"udp"`.
pub type Rule = (String, u16, u16);

/// The rules the ports of a `ServiceUpdate` give: one per port, the backend port being the target
/// port (or the port when the target port is 0).
pub fn rules_of_ports(ports: &[ServicePort]) -> BTreeSet<Rule> {
    ports
        .iter()
        .map(|p| {
            let protocol = match p.protocol() {
                v1::Protocol::Udp => "udp",
                _ => "tcp",
            };
            let port = u16::try_from(p.port).unwrap_or(0);
            let backend = match p.target_port {
                0 => port,
                t => u16::try_from(t).unwrap_or(0),
            };
            (protocol.to_owned(), port, backend)
        })
        .collect()
}

impl Expected {
    /// Every service, inbound and outbound.
    pub fn services(&self) -> BTreeSet<String> {
        self.inbound.union(&self.outbound).cloned().collect()
    }

    /// Whether `service` at `(location, address)` is desired.
    pub fn wants(&self, location: &str, address: &str, service: &str) -> bool {
        self.addresses
            .get(&(location.to_owned(), address.to_owned()))
            .is_some_and(|s| s.contains(service))
    }

    /// Distinct locations.
    pub fn locations(&self) -> BTreeSet<String> {
        self.addresses.keys().map(|(l, _)| l.clone()).collect()
    }
}

/// A synthetic cluster and the watcher's view of it.
#[derive(Debug, Clone)]
pub struct Cluster {
    spec: ClusterSpec,
    rng: StdRng,
    next_ip: u32,
    next_pod: u64,
    /// Inbound services → the app they select.
    services: BTreeMap<String, usize>,
    /// Declared egresses.
    egresses: BTreeSet<String>,
    /// The egress of each app.
    app_egress: Vec<Option<String>>,
    /// Pods by address.
    pods: BTreeMap<String, Pod>,
    /// Nodes deleted from the cluster (by index): no pod is placed there any more.
    deleted_nodes: BTreeSet<usize>,
}

/// Name of node `i` (the node at [`location_ip`]`(i)`).
pub fn node_name(i: usize) -> String {
    format!("node-{i}")
}

/// Writer name of the node agent of node `i`.
pub fn node_agent(i: usize) -> String {
    format!("node-agent/{}", node_name(i))
}

/// Which writer reports the pods in a split view ([`Cluster::watcher_view`] and
/// [`Cluster::pods_view_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodWriters {
    /// The watcher itself (one writer, scope all).
    Watcher,
    /// One node agent per node, `node-agent/node-<i>`.
    NodeAgents,
}

/// A batch of the watcher's changes split by writer: the watcher's part (services, egresses,
/// endpoints) and each location's pod changes (for that node's agent).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SplitBatch {
    /// Services, egresses and endpoints.
    pub watcher: Vec<Update>,
    /// Pod changes by location.
    pub pods: BTreeMap<String, Vec<Update>>,
}

impl SplitBatch {
    /// Splits `batch` by writer.
    pub fn of(batch: Vec<Update>) -> Self {
        let mut out = Self::default();
        for u in batch {
            match &u.kind {
                Some(Kind::Pod(p)) => out.pods.entry(p.location.clone()).or_default().push(u),
                _ => out.watcher.push(u),
            }
        }
        out
    }
}

/// Node IP of location `i`.
pub fn location_ip(i: usize) -> String {
    format!("10.0.{}.{}", i / 200, i % 200 + 1)
}

impl Cluster {
    /// Generates the cluster described by `spec`.
    pub fn generate(spec: ClusterSpec) -> Self {
        let mut services = BTreeMap::new();
        let mut app_egress = Vec::new();
        for app in 0..spec.apps {
            services.insert(format!("svc-{app}"), app);
            if app % 3 == 0 {
                services.insert(format!("svc-{app}-internal"), app);
            }
            let egress = (spec.egresses > 0 && app % 5 != 4)
                .then(|| format!("egress-{}", app % spec.egresses));
            app_egress.push(egress);
        }
        let egresses = (0..spec.egresses).map(|j| format!("egress-{j}")).collect();
        let mut cluster = Self {
            rng: StdRng::seed_from_u64(spec.seed),
            spec,
            next_ip: 0,
            next_pod: 0,
            services,
            egresses,
            app_egress,
            pods: BTreeMap::new(),
            deleted_nodes: BTreeSet::new(),
        };
        for app in 0..cluster.spec.apps {
            for _ in 0..cluster.spec.pods_per_app {
                let pod = cluster.new_pod(app);
                cluster.pods.insert(pod.address.clone(), pod);
            }
        }
        cluster
    }

    /// The spec it was generated from.
    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// Every pod, by address.
    pub fn pods(&self) -> &BTreeMap<String, Pod> {
        &self.pods
    }

    /// Inbound services, by name, with the app each selects.
    pub fn services(&self) -> &BTreeMap<String, usize> {
        &self.services
    }

    /// The egress of `app`, if any.
    pub fn egress_of(&self, app: usize) -> Option<&str> {
        self.app_egress[app].as_deref()
    }

    fn new_pod(&mut self, app: usize) -> Pod {
        self.next_ip += 1;
        let n = self.next_ip;
        self.next_pod += 1;
        let serial = self.next_pod;
        let mut node = self.rng.random_range(0..self.spec.locations);
        while self.deleted_nodes.contains(&node) {
            node = self.rng.random_range(0..self.spec.locations);
        }
        let location = location_ip(node);
        let ready = self.spec.not_ready_every == 0
            || !serial.is_multiple_of(self.spec.not_ready_every as u64);
        Pod {
            key: format!("default/app-{app}-{serial:x}"),
            uid: format!("uid-{serial}"),
            app,
            address: format!("10.{}.{}.{}", 64 + (n >> 16), (n >> 8) & 255, n & 255),
            location,
            ready,
        }
    }

    /// The endpoints of `service`: the ready pods of its app.
    pub fn endpoints_of(&self, service: &str) -> Vec<Endpoint> {
        let app = self.services[service];
        self.pods
            .values()
            .filter(|p| p.app == app && p.ready)
            .map(|p| Endpoint {
                address: p.address.clone(),
                location: p.location.clone(),
            })
            .collect()
    }

    /// The ports of `service`: TCP 80 for each. The pods of app `i` listen on `8080 + i % 4`, the
    /// target port of `svc-{i}`; `svc-{i}-internal` leaves the target port unset (0: the pods' port
    /// is 80 too), so both forms go through every end-to-end test.
    pub fn ports_of(&self, service: &str) -> Vec<ServicePort> {
        let target_port = match self.services.get(service) {
            Some(_) if service.ends_with("-internal") => 0,
            Some(&app) => 8080 + (app % 4) as u32,
            None => 0,
        };
        vec![ServicePort {
            port: 80,
            protocol: v1::Protocol::Tcp as i32,
            target_port,
        }]
    }

    fn service_update(&self, op: i32, name: &str) -> Update {
        Update {
            kind: Some(Kind::Service(ServiceUpdate {
                operation: op,
                service_id: name.to_owned(),
                ports: if op == ADD {
                    self.ports_of(name)
                } else {
                    Vec::new()
                },
                ..Default::default()
            })),
        }
    }

    fn endpoints_update(&self, service: &str) -> Update {
        Update {
            kind: Some(Kind::Endpoints(EndpointsUpdate {
                service_id: service.to_owned(),
                change: Some(Change::Level(EndpointSet {
                    endpoints: self.endpoints_of(service),
                })),
            })),
        }
    }

    fn pod_update(&self, op: i32, pod: &Pod) -> Update {
        Update {
            kind: Some(Kind::Pod(PodUpdate {
                operation: op,
                address: pod.address.clone(),
                location: pod.location.clone(),
                egress_id: self.app_egress[pod.app].clone().unwrap_or_default(),
                pod_key: pod.key.clone(),
                pod_uid: pod.uid.clone(),
                ..Default::default()
            })),
        }
    }

    fn services_of(&self, app: usize) -> Vec<String> {
        self.services
            .iter()
            .filter(|(_, a)| **a == app)
            .map(|(s, _)| s.clone())
            .collect()
    }

    /// The watcher's complete view (for a resync of services, egresses, endpoints and pods).
    pub fn full_view(&self) -> Vec<Update> {
        let mut view: Vec<Update> = self
            .services
            .keys()
            .map(|s| self.service_update(ADD, s))
            .collect();
        view.extend(self.egresses.iter().map(|e| Update {
            kind: Some(Kind::Egress(EgressUpdate {
                operation: ADD,
                egress_id: e.clone(),
            })),
        }));
        view.extend(self.services.keys().map(|s| self.endpoints_update(s)));
        view.extend(self.pods.values().map(|p| self.pod_update(ADD, p)));
        view
    }

    /// The watcher's part of the view when node agents report the pods: services, egresses,
    /// endpoints.
    pub fn watcher_view(&self) -> Vec<Update> {
        self.full_view()
            .into_iter()
            .filter(|u| !matches!(u.kind, Some(Kind::Pod(_))))
            .collect()
    }

    /// The pods at `location` (a node agent's view of its node).
    pub fn pods_view_at(&self, location: &str) -> Vec<Update> {
        self.pods
            .values()
            .filter(|p| p.location == location)
            .map(|p| self.pod_update(ADD, p))
            .collect()
    }

    /// Indices of the nodes of the cluster (deleted ones excluded).
    pub fn nodes(&self) -> Vec<usize> {
        (0..self.spec.locations)
            .filter(|i| !self.deleted_nodes.contains(i))
            .collect()
    }

    /// The topology the cluster-wide watcher declares: every node with its location, and who
    /// reports its pods.
    pub fn topology(&self, pods: PodWriters) -> v1::ClusterTopology {
        v1::ClusterTopology {
            nodes: self
                .nodes()
                .into_iter()
                .map(|i| v1::ClusterNode {
                    name: node_name(i),
                    locations: vec![location_ip(i)],
                    pods_writer: match pods {
                        PodWriters::Watcher => "watcher".to_owned(),
                        PodWriters::NodeAgents => node_agent(i),
                    },
                })
                .collect(),
        }
    }

    /// Deletes node `i` with its pods (as when a node is removed while they run): returns the
    /// watcher's batch, the endpoints without those pods and the removal of the pods. Needs
    /// another node.
    pub fn delete_node(&mut self, i: usize) -> Vec<Update> {
        assert!(
            self.nodes().len() > 1,
            "the cluster would have no node left"
        );
        self.deleted_nodes.insert(i);
        let location = location_ip(i);
        let gone: Vec<Pod> = self
            .pods
            .values()
            .filter(|p| p.location == location)
            .cloned()
            .collect();
        let apps: BTreeSet<usize> = gone.iter().map(|p| p.app).collect();
        for p in &gone {
            self.pods.remove(&p.address);
        }
        let mut batch: Vec<Update> = apps
            .iter()
            .flat_map(|a| self.services_of(*a))
            .map(|s| self.endpoints_update(&s))
            .collect();
        batch.extend(gone.iter().map(|p| self.pod_update(REMOVE, p)));
        batch
    }

    /// Replaces every pod of `app` by a new one (new IP, new node, same Services) as a Deployment
    /// rollout with surge does, and returns the watcher's batches, oldest first: (1) the new pods and
    /// the endpoints with old and new pods, (2) the endpoints with only the new pods and the removal
    /// of the old pods. The cluster is in its final state afterwards.
    pub fn roll_app(&mut self, app: usize) -> Vec<Vec<Update>> {
        let old: Vec<Pod> = self
            .pods
            .values()
            .filter(|p| p.app == app)
            .cloned()
            .collect();
        let services = self.services_of(app);
        let mut surge = Vec::new();
        for _ in 0..old.len() {
            let pod = self.new_pod(app);
            surge.push(self.pod_update(ADD, &pod));
            self.pods.insert(pod.address.clone(), pod);
        }
        surge.extend(services.iter().map(|s| self.endpoints_update(s)));
        for p in &old {
            self.pods.remove(&p.address);
        }
        let mut finish: Vec<Update> = services.iter().map(|s| self.endpoints_update(s)).collect();
        finish.extend(old.iter().map(|p| self.pod_update(REMOVE, p)));
        vec![surge, finish]
    }

    /// [`Cluster::roll_app`] for every app, in order: all the batches of a rollout of every pod.
    pub fn roll_all(&mut self) -> Vec<Vec<Update>> {
        (0..self.spec.apps).flat_map(|a| self.roll_app(a)).collect()
    }
    /// Scales every app down to `keep` pods (the newest are deleted first, as a ReplicaSet does
    /// not guarantee, but any choice will do) and returns the watcher's batch: the endpoints
    /// without the deleted pods, then the removal of those pods.
    pub fn scale_down(&mut self, keep: usize) -> Vec<Vec<Update>> {
        let mut batches = Vec::new();
        for app in 0..self.spec.apps {
            let gone: Vec<Pod> = self
                .pods
                .values()
                .filter(|p| p.app == app)
                .skip(keep)
                .cloned()
                .collect();
            if gone.is_empty() {
                continue;
            }
            for p in &gone {
                self.pods.remove(&p.address);
            }
            let mut batch: Vec<Update> = self
                .services_of(app)
                .iter()
                .map(|s| self.endpoints_update(s))
                .collect();
            batch.extend(gone.iter().map(|p| self.pod_update(REMOVE, p)));
            batches.push(batch);
        }
        batches
    }

    /// Drains node `location`: every pod on it is replaced by a new one (new IP) on another node,
    /// and the watcher's batches are returned, oldest first: (1) the new pods and the endpoints
    /// with old and new pods, (2) the endpoints with only the new pods and the removal of the old
    /// pods. Needs at least two nodes.
    pub fn drain_node(&mut self, location: &str) -> Vec<Vec<Update>> {
        assert!(self.spec.locations > 1, "nowhere to move the pods to");
        let old: Vec<Pod> = self
            .pods
            .values()
            .filter(|p| p.location == location)
            .cloned()
            .collect();
        let apps: BTreeSet<usize> = old.iter().map(|p| p.app).collect();
        let services: Vec<String> = apps.iter().flat_map(|a| self.services_of(*a)).collect();
        let mut surge = Vec::new();
        for p in &old {
            let mut pod = self.new_pod(p.app);
            while pod.location == location {
                pod = self.new_pod(p.app);
            }
            surge.push(self.pod_update(ADD, &pod));
            self.pods.insert(pod.address.clone(), pod);
        }
        surge.extend(services.iter().map(|s| self.endpoints_update(s)));
        for p in &old {
            self.pods.remove(&p.address);
        }
        let mut finish: Vec<Update> = services.iter().map(|s| self.endpoints_update(s)).collect();
        finish.extend(old.iter().map(|p| self.pod_update(REMOVE, p)));
        vec![surge, finish]
    }

    /// The node with the most pods (the one the demo drains).
    pub fn busiest_node(&self) -> Option<String> {
        let mut count: BTreeMap<&str, usize> = BTreeMap::new();
        for p in self.pods.values() {
            *count.entry(&p.location).or_default() += 1;
        }
        count
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .map(|(l, _)| l.to_owned())
    }

    /// Deletes inbound service `name` (the watcher sees the Service disappear).
    pub fn remove_service(&mut self, name: &str) -> Vec<Update> {
        assert!(self.services.remove(name).is_some(), "no service {name}");
        vec![self.service_update(REMOVE, name)]
    }

    /// Moves every pod of `app` to egress `to` (a label change on the pods).
    pub fn set_app_egress(&mut self, app: usize, to: Option<&str>) -> Vec<Update> {
        self.app_egress[app] = to.map(str::to_owned);
        self.pods
            .values()
            .filter(|p| p.app == app)
            .map(|p| self.pod_update(ADD, p))
            .collect()
    }

    /// Removes the declaration of egress `name` (it stays desired while pods use it).
    pub fn remove_egress(&mut self, name: &str) -> Vec<Update> {
        assert!(self.egresses.remove(name), "no egress {name}");
        vec![Update {
            kind: Some(Kind::Egress(EgressUpdate {
                operation: REMOVE,
                egress_id: name.to_owned(),
            })),
        }]
    }

    /// What NRP must hold once converged: every service and egress in use or declared; every
    /// address with the Services whose endpoints hold it (ready pods only) and its pod's egress.
    pub fn expected(&self) -> Expected {
        let mut e = Expected {
            inbound: self.services.keys().cloned().collect(),
            outbound: self.egresses.clone(),
            addresses: BTreeMap::new(),
            rules: self
                .services
                .keys()
                .map(|s| (s.clone(), rules_of_ports(&self.ports_of(s))))
                .collect(),
        };
        let mut by_app: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
        for (s, app) in &self.services {
            by_app.entry(*app).or_default().push(s);
        }
        for p in self.pods.values() {
            let mut refs = BTreeSet::new();
            if p.ready {
                refs.extend(
                    by_app
                        .get(&p.app)
                        .into_iter()
                        .flatten()
                        .map(|s| s.to_string()),
                );
            }
            if let Some(egress) = &self.app_egress[p.app] {
                e.outbound.insert(egress.clone());
                refs.insert(egress.clone());
            }
            if !refs.is_empty() {
                e.addresses
                    .insert((p.location.clone(), p.address.clone()), refs);
            }
        }
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_deterministic_and_shaped_as_asked() {
        let spec = ClusterSpec::small(20, 10, 8);
        let a = Cluster::generate(spec.clone());
        let b = Cluster::generate(spec);
        assert_eq!(a.pods(), b.pods());
        assert_eq!(a.pods().len(), 80);
        // 10 apps, 4 of them (0, 3, 6, 9) with an internal Service.
        assert_eq!(a.services().len(), 14);
        let e = a.expected();
        assert!(e.locations().len() <= 20);
        // Every 10th pod is not ready; app 4 and 9 have no egress: their not-ready pods are absent.
        assert!(e.addresses.len() < 80);
        assert!(e.addresses.values().any(|s| s.len() == 3));
        assert_eq!(e.outbound.len(), 3);
        // The pods listen on another port than the Service's (the rule's backend port).
        assert_eq!(
            e.rules["svc-1"],
            BTreeSet::from([("tcp".to_owned(), 80, 8081)])
        );
        assert_eq!(
            e.rules["svc-3-internal"],
            BTreeSet::from([("tcp".to_owned(), 80, 80)])
        );
    }

    #[test]
    fn a_rollout_replaces_every_address_and_keeps_the_services() {
        let mut c = Cluster::generate(ClusterSpec::small(20, 10, 8));
        let before = c.expected();
        let batches = c.roll_all();
        assert_eq!(batches.len(), 20);
        let after = c.expected();
        assert_eq!(before.services(), after.services());
        let old: BTreeSet<_> = before.addresses.keys().map(|(_, a)| a).collect();
        assert!(after.addresses.keys().all(|(_, a)| !old.contains(a)));
        assert_eq!(c.pods().len(), 80);
    }

    #[test]
    fn scaling_down_keeps_the_asked_pods_per_app() {
        let mut c = Cluster::generate(ClusterSpec::small(20, 10, 8));
        let batches = c.scale_down(3);
        assert_eq!(batches.len(), 10);
        assert_eq!(c.pods().len(), 30);
        assert!(c.scale_down(3).is_empty());
    }

    #[test]
    fn draining_a_node_moves_its_pods_elsewhere() {
        let mut c = Cluster::generate(ClusterSpec::small(20, 10, 8));
        let node = c.busiest_node().expect("a node");
        let before = c.pods().values().filter(|p| p.location == node).count();
        assert!(before > 0);
        let batches = c.drain_node(&node);
        assert_eq!(batches.len(), 2);
        assert_eq!(c.pods().len(), 80);
        assert!(c.pods().values().all(|p| p.location != node));
        assert!(c.expected().locations().iter().all(|l| *l != node));
    }
}
