//! A test sync worker over the generated gRPC client, and a fake NRP it applies units to, with a
//! log of every removal (so tests can assert that no still-desired address was ever removed).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clb_proto::v1;
use clb_proto::v1::worker_client::WorkerClient;
use clb_state_server::state::{ServerConfig, StateServer};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

/// A running in-process state server on 127.0.0.1:0.
pub struct TestServer {
    pub state: Arc<StateServer>,
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    pub async fn start(config: ServerConfig) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = StateServer::new(config);
        let (tx, rx) = oneshot::channel::<()>();
        let s = state.clone();
        let task = tokio::spawn(async move {
            clb_state_server::grpc::serve(listener, s, async move {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        Self {
            state,
            addr,
            stop: Some(tx),
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
    }
}

/// One address removal NRP performed: (location, address, services it lost).
pub type Removal = (String, String, BTreeSet<String>);

/// NRP as a map, applying units as NRP would.
#[derive(Debug, Default)]
pub struct FakeNrp {
    pub services: BTreeMap<String, i32>,
    pub locations: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    pub removals: Vec<Removal>,
    pub calls: u64,
    /// The frontend IP of each inbound service, allocated at its first creation.
    pub frontends: BTreeMap<String, String>,
    /// The (protocol, port) rules of each inbound service's load balancer, as last created.
    pub rules: BTreeMap<String, BTreeSet<(i32, u32)>>,
    /// The backend port of each rule (protocol, frontend port) of each inbound service's load
    /// balancer that has another backend port than its frontend port (the target port).
    pub backend_ports: BTreeMap<String, BTreeMap<(i32, u32), u32>>,
    allocated: u32,
}

impl FakeNrp {
    fn remove(&mut self, location: &str, address: &str, lost: BTreeSet<String>) {
        if !lost.is_empty() {
            self.removals
                .push((location.to_owned(), address.to_owned(), lost));
        }
    }

    /// Applies one unit's work; returns the outcome NRP would give.
    pub fn apply(&mut self, unit: &v1::WorkUnit) -> v1::report::Outcome {
        self.calls += 1;
        match unit.work.as_ref().unwrap() {
            v1::work_unit::Work::Observe(_) => v1::report::Outcome::Observed(v1::Observed {
                snapshot: Some(self.snapshot()),
                last: true,
            }),
            v1::work_unit::Work::Services(w) => {
                for c in &w.changes {
                    let inbound = c.kind == v1::ServiceKind::Inbound as i32;
                    if c.action == v1::ServiceAction::Create as i32 {
                        self.services.insert(c.service_id.clone(), c.kind);
                        if inbound {
                            if !self.frontends.contains_key(&c.service_id) {
                                self.allocated += 1;
                                let ip = format!("20.0.0.{}", self.allocated);
                                self.frontends.insert(c.service_id.clone(), ip);
                            }
                            let rules = c.ports.iter().map(|p| (p.protocol, p.port)).collect();
                            self.rules.insert(c.service_id.clone(), rules);
                            let backends: BTreeMap<(i32, u32), u32> = c
                                .ports
                                .iter()
                                .filter(|p| p.target_port != 0 && p.target_port != p.port)
                                .map(|p| ((p.protocol, p.port), p.target_port))
                                .collect();
                            self.backend_ports.insert(c.service_id.clone(), backends);
                        }
                    } else {
                        let used = self
                            .locations
                            .values()
                            .any(|l| l.values().any(|s| s.contains(&c.service_id)));
                        assert!(
                            !used,
                            "NRP: service {} deleted while referenced",
                            c.service_id
                        );
                        self.services.remove(&c.service_id);
                        self.frontends.remove(&c.service_id);
                        self.rules.remove(&c.service_id);
                        self.backend_ports.remove(&c.service_id);
                    }
                }
                v1::report::Outcome::Applied(v1::Applied {})
            }
            v1::work_unit::Work::Locations(w) => {
                for l in &w.locations {
                    for a in &l.addresses {
                        for s in &a.service_ids {
                            assert!(
                                self.services.contains_key(s),
                                "NRP: address {} refers to unknown {s}",
                                a.address
                            );
                        }
                    }
                    let full = l.action == v1::AddressUpdateAction::FullUpdate as i32;
                    let old = self.locations.remove(&l.location).unwrap_or_default();
                    let mut new = if full { BTreeMap::new() } else { old.clone() };
                    for a in &l.addresses {
                        if a.service_ids.is_empty() {
                            new.remove(&a.address);
                        } else {
                            new.insert(a.address.clone(), a.service_ids.iter().cloned().collect());
                        }
                    }
                    for (addr, had) in &old {
                        let now = new.get(addr).cloned().unwrap_or_default();
                        self.remove(&l.location, addr, had.difference(&now).cloned().collect());
                    }
                    if !(full && l.addresses.is_empty()) {
                        self.locations.insert(l.location.clone(), new);
                    }
                }
                v1::report::Outcome::Applied(v1::Applied {})
            }
        }
    }

    /// Applies one unit's work and returns the whole report a worker would send: the outcome, and
    /// the frontends of the inbound services a service unit created.
    pub fn apply_report(&mut self, unit: &v1::WorkUnit) -> v1::Report {
        let outcome = self.apply(unit);
        let frontends = match unit.work.as_ref() {
            Some(v1::work_unit::Work::Services(w)) => w
                .changes
                .iter()
                .filter(|c| c.action == v1::ServiceAction::Create as i32)
                .filter_map(|c| {
                    Some(v1::ServiceFrontend {
                        service_id: c.service_id.clone(),
                        ip: self.frontends.get(&c.service_id)?.clone(),
                    })
                })
                .collect(),
            _ => vec![],
        };
        v1::Report {
            work_id: unit.work_id,
            applied_indices: vec![],
            frontends,
            service_progress: vec![],
            remaining_subscription_writes: None,
            refused_addresses: Vec::new(),
            outcome: Some(outcome),
        }
    }

    pub fn snapshot(&self) -> v1::NrpSnapshot {
        v1::NrpSnapshot {
            load_balancers: self
                .services
                .iter()
                .filter(|(_, k)| **k == v1::ServiceKind::Inbound as i32)
                .map(|(n, _)| n.clone())
                .collect(),
            nat_gateways: self
                .services
                .iter()
                .filter(|(_, k)| **k == v1::ServiceKind::Outbound as i32)
                .map(|(n, _)| n.clone())
                .collect(),
            locations: self
                .locations
                .iter()
                .map(|(l, a)| v1::LocationChange {
                    location: l.clone(),
                    action: v1::AddressUpdateAction::FullUpdate as i32,
                    addresses: a
                        .iter()
                        .map(|(addr, s)| v1::AddressChange {
                            address: addr.clone(),
                            service_ids: s.iter().cloned().collect(),
                        })
                        .collect(),
                })
                .collect(),
            frontends: self
                .frontends
                .iter()
                .map(|(service, ip)| v1::ServiceFrontend {
                    service_id: service.clone(),
                    ip: ip.clone(),
                })
                .collect(),
            rules: self
                .rules
                .iter()
                .map(|(service, rules)| v1::ServiceRules {
                    service_id: service.clone(),
                    ports: rules
                        .iter()
                        .map(|&(protocol, port)| v1::ServicePort {
                            port,
                            protocol,
                            target_port: self
                                .backend_ports
                                .get(service)
                                .and_then(|b| b.get(&(protocol, port)))
                                .copied()
                                .unwrap_or(port),
                        })
                        .collect(),
                    settings: None,
                })
                .collect(),
            missing_nat_gateways: Vec::new(),
        }
    }
}

/// A worker connection driven by the test.
pub struct TestWorker {
    pub units: tonic::Streaming<v1::ServerMessage>,
    pub out: mpsc::Sender<v1::WorkerMessage>,
}

impl TestWorker {
    pub async fn connect(url: &str, id: &str, capacity: u32) -> Self {
        let mut client = WorkerClient::connect(url.to_owned()).await.unwrap();
        let (out, rx) = mpsc::channel(64);
        out.send(v1::WorkerMessage {
            kind: Some(v1::worker_message::Kind::Hello(v1::Hello {
                worker_id: id.into(),
                capacity,
                gateways: vec![],
            })),
        })
        .await
        .unwrap();
        let mut units = client
            .sync(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        match units.message().await.unwrap().unwrap().kind {
            Some(v1::server_message::Kind::Welcome(_)) => {}
            other => panic!("expected a welcome, got {other:?}"),
        }
        Self { units, out }
    }

    /// The next unit, or `None` if none comes within `wait`.
    pub async fn next_unit(&mut self, wait: Duration) -> Option<v1::WorkUnit> {
        match tokio::time::timeout(wait, self.units.message()).await {
            Ok(Ok(Some(v1::ServerMessage {
                kind: Some(v1::server_message::Kind::Unit(u)),
            }))) => Some(u),
            _ => None,
        }
    }

    pub async fn report(&self, work_id: u64, outcome: v1::report::Outcome) {
        self.send_report(v1::Report {
            work_id,
            applied_indices: vec![],
            frontends: vec![],
            service_progress: vec![],
            remaining_subscription_writes: None,
            refused_addresses: Vec::new(),
            outcome: Some(outcome),
        })
        .await;
    }

    pub async fn send_report(&self, report: v1::Report) {
        self.out
            .send(v1::WorkerMessage {
                kind: Some(v1::worker_message::Kind::Report(report)),
            })
            .await
            .unwrap();
    }

    /// Applies units to `nrp` (the observe, the services) until a location unit arrives, and
    /// returns that one unanswered.
    pub async fn first_location_unit(
        &mut self,
        nrp: &Arc<Mutex<FakeNrp>>,
        idle: Duration,
    ) -> Option<v1::WorkUnit> {
        while let Some(u) = self.next_unit(idle).await {
            if !unit_locations(&u).is_empty() {
                return Some(u);
            }
            let report = nrp.lock().unwrap().apply_report(&u);
            self.send_report(report).await;
        }
        None
    }

    /// Applies units to `nrp` until none arrives for `idle`.
    pub async fn run_until_idle(&mut self, nrp: &Arc<Mutex<FakeNrp>>, idle: Duration) -> usize {
        let mut n = 0;
        while let Some(u) = self.next_unit(idle).await {
            let report = nrp.lock().unwrap().apply_report(&u);
            self.send_report(report).await;
            n += 1;
        }
        n
    }
}

/// Locations (IPs as strings) a unit carries.
pub fn unit_locations(u: &v1::WorkUnit) -> Vec<String> {
    match u.work.as_ref() {
        Some(v1::work_unit::Work::Locations(w)) => {
            w.locations.iter().map(|l| l.location.clone()).collect()
        }
        _ => vec![],
    }
}
