//! What the server keeps beside the DiffTracker for inbound services, over real gRPC on loopback
//! with a scripted worker: the frontend IP (from the report of a creation, replaced by observes,
//! dropped with the deletion) and the ports that `Admin.GetService` shows, and a ports change that
//! creates the service again with its new load balancer rules.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clb_core::dispatch::DispatchConfig;
use clb_proto::v1::admin_client::AdminClient;
use clb_proto::v1::writer_client::WriterClient;
use clb_proto::v1::{
    self, ApplyRequest, ServicePort, ServiceQuery, ServiceUpdate, Update, report::Outcome,
    update::Kind, work_unit::Work,
};
use clb_state_server::state::ServerConfig;
use support::worker::{FakeNrp, TestServer, TestWorker};
use tonic::Code;
use tonic::transport::Channel;

/// How long a test waits for a unit it expects (a guard against hangs, not a timing assertion).
const PATIENCE: Duration = Duration::from_secs(10);
/// How long a worker waits before concluding that no more units come.
const IDLE: Duration = Duration::from_millis(300);

const TCP: i32 = v1::Protocol::Tcp as i32;
const UDP: i32 = v1::Protocol::Udp as i32;

fn config() -> ServerConfig {
    ServerConfig {
        dispatch: DispatchConfig {
            lease: Duration::from_secs(60),
            ..DispatchConfig::default()
        },
        ..ServerConfig::default()
    }
}

struct Clients {
    writer: WriterClient<Channel>,
    admin: AdminClient<Channel>,
}

impl Clients {
    async fn connect(server: &TestServer) -> Self {
        Self {
            writer: WriterClient::connect(server.url()).await.unwrap(),
            admin: AdminClient::connect(server.url()).await.unwrap(),
        }
    }

    /// Adds (or updates) service `id` with `ports`, or removes it; returns the revision.
    async fn service(&mut self, op: v1::Operation, id: &str, ports: &[(i32, u32)]) -> u64 {
        let ports: Vec<(i32, u32, u32)> = ports.iter().map(|&(p, port)| (p, port, 0)).collect();
        self.service_to(op, id, &ports).await
    }

    /// [`Clients::service`] with (protocol, port, target port) ports.
    async fn service_to(&mut self, op: v1::Operation, id: &str, ports: &[(i32, u32, u32)]) -> u64 {
        let update = Update {
            kind: Some(Kind::Service(ServiceUpdate {
                operation: op as i32,
                service_id: id.into(),
                ports: ports
                    .iter()
                    .map(|&(protocol, port, target_port)| ServicePort {
                        port,
                        protocol,
                        target_port,
                    })
                    .collect(),
                ..Default::default()
            })),
        };
        let r = self
            .writer
            .apply(ApplyRequest {
                gateway: String::new(),
                writer: "watcher".into(),
                batch_id: 1,
                dry_run: false,
                updates: vec![update],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((r.applied, r.rejected.len()), (1, 0), "{r:?}");
        r.revision
    }

    async fn get_service(&mut self, id: &str) -> Result<v1::ServiceState, tonic::Status> {
        self.admin
            .get_service(ServiceQuery {
                gateway: String::new(),
                service_id: id.into(),
            })
            .await
            .map(tonic::Response::into_inner)
    }

    async fn frontend_ip(&mut self, id: &str) -> String {
        self.get_service(id).await.unwrap().frontend_ip
    }
}

fn frontend(service: &str, ip: &str) -> v1::ServiceFrontend {
    v1::ServiceFrontend {
        service_id: service.into(),
        ip: ip.into(),
    }
}

/// (protocol, port) of each port.
fn port_list(ports: &[ServicePort]) -> Vec<(i32, u32)> {
    ports.iter().map(|p| (p.protocol, p.port)).collect()
}

/// One service change as (name, action, (protocol, port) of each port).
type Change = (String, v1::ServiceAction, Vec<(i32, u32)>);

/// The unit's service changes.
fn service_changes(u: &v1::WorkUnit) -> Vec<Change> {
    match u.work.as_ref() {
        Some(Work::Services(w)) => w
            .changes
            .iter()
            .map(|c| (c.service_id.clone(), c.action(), port_list(&c.ports)))
            .collect(),
        other => panic!("expected a service unit, got {other:?}"),
    }
}

async fn expect_unit(w: &mut TestWorker) -> v1::WorkUnit {
    w.next_unit(PATIENCE).await.expect("a unit")
}

/// Answers the start-up observe: NRP is empty.
async fn observe_empty(w: &mut TestWorker) {
    let u = expect_unit(w).await;
    assert!(matches!(u.work, Some(Work::Observe(_))), "{u:?}");
    w.report(
        u.work_id,
        Outcome::Observed(v1::Observed {
            snapshot: Some(v1::NrpSnapshot::default()),
            last: true,
        }),
    )
    .await;
}

async fn report_observed(w: &TestWorker, work_id: u64, snapshot: v1::NrpSnapshot, last: bool) {
    w.report(
        work_id,
        Outcome::Observed(v1::Observed {
            snapshot: Some(snapshot),
            last,
        }),
    )
    .await;
}

/// Waits (bounded) until the server has folded what it was sent, as seen through `check`.
async fn eventually<F: AsyncFnMut() -> bool>(mut check: F) {
    for _ in 0..200 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the server never got there");
}

#[tokio::test]
async fn get_service_shows_the_frontend_of_the_creation_then_of_each_observe_until_deletion() {
    let server = TestServer::start(config()).await;
    let mut c = Clients::connect(&server).await;
    c.service(v1::Operation::Add, "Svc-F", &[(TCP, 80), (UDP, 53)])
        .await;
    c.service(v1::Operation::Add, "svc-g", &[(TCP, 443)]).await;
    let mut w = TestWorker::connect(&server.url(), "w", 1).await;
    observe_empty(&mut w).await;

    // Not in NRP yet: no frontend, but the desired ports.
    let f = c.get_service("svc-f").await.unwrap();
    assert!(f.desired && !f.actual);
    assert_eq!(f.frontend_ip, "");
    assert_eq!(port_list(&f.ports), [(TCP, 80), (UDP, 53)]);

    // The creation's report carries the frontends (any case, any textual IP form); a frontend of
    // a service the unit did not create, and a malformed one, are ignored.
    let u = expect_unit(&mut w).await;
    let mut created: Vec<_> = service_changes(&u);
    created.sort();
    assert_eq!(
        created,
        [
            (
                "svc-f".to_string(),
                v1::ServiceAction::Create,
                vec![(TCP, 80), (UDP, 53)]
            ),
            (
                "svc-g".to_string(),
                v1::ServiceAction::Create,
                vec![(TCP, 443)]
            ),
        ]
    );
    w.send_report(v1::Report {
        work_id: u.work_id,
        applied_indices: vec![],
        frontends: vec![
            frontend("SVC-F", "20.0.0.7"),
            frontend("svc-g", "2001:DB8:0::9"),
            frontend("svc-other", "20.0.0.8"),
            frontend("svc-f", "not-an-ip"),
        ],
        service_progress: vec![],
        remaining_subscription_writes: None,
        refused_addresses: Vec::new(),
        outcome: Some(Outcome::Applied(v1::Applied {})),
    })
    .await;
    eventually(async || c.frontend_ip("svc-f").await == "20.0.0.7").await;
    let f = c.get_service("SVC-F").await.unwrap();
    assert!(f.desired && f.actual);
    assert_eq!(port_list(&f.ports), [(TCP, 80), (UDP, 53)]);
    assert_eq!(c.frontend_ip("svc-g").await, "2001:db8::9");
    {
        let g = server.state.gateway("").unwrap();
        let gw = g.lock();
        let known: BTreeSet<&str> = gw.frontends().keys().map(String::as_str).collect();
        assert_eq!(known, BTreeSet::from(["svc-f", "svc-g"]));
    }

    // An observe in two parts: their union replaces the frontends at the last part (svc-f's,
    // reported in the first part, moved; svc-g has none any more). That nothing changes before
    // the last part is checked by the unit tests of `state`.
    server.state.gateway("").unwrap().lock().request_observe();
    server.state.notify_work();
    let u = expect_unit(&mut w).await;
    assert!(matches!(u.work, Some(Work::Observe(_))), "{u:?}");
    let first = v1::NrpSnapshot {
        load_balancers: vec!["svc-f".into(), "svc-g".into()],
        frontends: vec![frontend("svc-f", "20.0.0.10")],
        ..Default::default()
    };
    report_observed(&w, u.work_id, first, false).await;
    report_observed(&w, u.work_id, v1::NrpSnapshot::default(), true).await;
    eventually(async || c.frontend_ip("svc-f").await == "20.0.0.10").await;
    assert_eq!(c.frontend_ip("svc-g").await, "");
    assert!(c.get_service("svc-g").await.unwrap().actual);

    // Deleting svc-f drops its frontend.
    c.service(v1::Operation::Remove, "svc-f", &[]).await;
    let u = expect_unit(&mut w).await;
    assert_eq!(
        service_changes(&u),
        [("svc-f".to_string(), v1::ServiceAction::Delete, vec![])]
    );
    w.report(u.work_id, Outcome::Applied(v1::Applied {})).await;
    eventually(async || {
        c.get_service("svc-f")
            .await
            .is_err_and(|e| e.code() == Code::NotFound)
    })
    .await;
    {
        let g = server.state.gateway("").unwrap();
        let gw = g.lock();
        assert!(
            !gw.frontends().contains_key("svc-f"),
            "{:?}",
            gw.frontends()
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_ports_change_creates_the_service_again_with_the_new_rules() {
    let server = TestServer::start(config()).await;
    let mut c = Clients::connect(&server).await;
    let nrp = Arc::new(Mutex::new(FakeNrp::default()));
    let mut w = TestWorker::connect(&server.url(), "w", 1).await;
    c.service(v1::Operation::Add, "svc-p", &[(TCP, 80)]).await;
    w.run_until_idle(&nrp, IDLE).await;
    let rules = |nrp: &Arc<Mutex<FakeNrp>>| nrp.lock().unwrap().rules.get("svc-p").cloned();
    assert_eq!(rules(&nrp), Some(BTreeSet::from([(TCP, 80)])));
    let ip = nrp.lock().unwrap().frontends["svc-p"].clone();
    assert_eq!(c.frontend_ip("svc-p").await, ip);

    // New ports: the service is created again, with them; it stays in NRP meanwhile.
    let before = server
        .state
        .gateway("")
        .unwrap()
        .lock()
        .tracker()
        .revision();
    let revision = c
        .service(v1::Operation::Add, "svc-p", &[(TCP, 80), (TCP, 443)])
        .await;
    assert!(revision > before, "a ports change is a desired change");
    let u = expect_unit(&mut w).await;
    assert_eq!(
        service_changes(&u),
        [(
            "svc-p".to_string(),
            v1::ServiceAction::Create,
            vec![(TCP, 80), (TCP, 443)]
        )]
    );
    assert!(c.get_service("svc-p").await.unwrap().actual);
    let report = nrp.lock().unwrap().apply_report(&u);
    w.send_report(report).await;
    assert_eq!(w.run_until_idle(&nrp, IDLE).await, 0, "nothing else to do");
    assert_eq!(rules(&nrp), Some(BTreeSet::from([(TCP, 80), (TCP, 443)])));
    assert_eq!(c.frontend_ip("svc-p").await, ip, "the frontend stays");

    // The same ports in another order are no change.
    c.service(v1::Operation::Add, "svc-p", &[(TCP, 443), (TCP, 80)])
        .await;
    assert!(
        w.next_unit(IDLE).await.is_none(),
        "no unit for the same ports"
    );

    // Ports changed while the creation is under way: once it is applied, the service is created
    // again with the newest ports.
    c.service(v1::Operation::Add, "svc-p", &[(UDP, 53)]).await;
    let u = expect_unit(&mut w).await;
    assert_eq!(service_changes(&u)[0].2, vec![(UDP, 53)]);
    c.service(v1::Operation::Add, "svc-p", &[(UDP, 5353)]).await;
    let report = nrp.lock().unwrap().apply_report(&u);
    w.send_report(report).await;
    let again = expect_unit(&mut w).await;
    assert_eq!(
        service_changes(&again),
        [(
            "svc-p".to_string(),
            v1::ServiceAction::Create,
            vec![(UDP, 5353)]
        )]
    );
    let report = nrp.lock().unwrap().apply_report(&again);
    w.send_report(report).await;
    assert_eq!(w.run_until_idle(&nrp, IDLE).await, 0);
    assert_eq!(rules(&nrp), Some(BTreeSet::from([(UDP, 5353)])));
    let shown: BTreeMap<i32, u32> = c
        .get_service("svc-p")
        .await
        .unwrap()
        .ports
        .iter()
        .map(|p| (p.protocol, p.port))
        .collect();
    assert_eq!(shown, BTreeMap::from([(UDP, 5353)]));
    server.stop().await;
}

/// Asks the server for an observe and returns its unit.
async fn observe_unit(server: &TestServer, w: &mut TestWorker) -> v1::WorkUnit {
    server.state.gateway("").unwrap().lock().request_observe();
    server.state.notify_work();
    let u = expect_unit(w).await;
    assert!(matches!(u.work, Some(Work::Observe(_))), "{u:?}");
    u
}

/// The snapshot of `nrp` with the rules of `service` replaced by `ports` (`None`: no entry, as when
/// the load balancer listing missed it).
fn with_rules(
    nrp: &Arc<Mutex<FakeNrp>>,
    service: &str,
    ports: Option<&[(i32, u32)]>,
) -> v1::NrpSnapshot {
    let mut snapshot = nrp.lock().unwrap().snapshot();
    snapshot.rules.retain(|r| r.service_id != service);
    if let Some(ports) = ports {
        snapshot.rules.push(v1::ServiceRules {
            service_id: service.into(),
            ports: ports
                .iter()
                .map(|&(protocol, port)| ServicePort {
                    port,
                    protocol,
                    target_port: 0,
                })
                .collect(),
            settings: None,
        });
    }
    snapshot
}

/// A service change as (name, (protocol, port, target port) of each port).
type TargetChange = (String, Vec<(i32, u32, u32)>);

/// (protocol, port, target port) of each port of the unit's service changes.
fn change_targets(u: &v1::WorkUnit) -> Vec<TargetChange> {
    match u.work.as_ref() {
        Some(Work::Services(w)) => w
            .changes
            .iter()
            .map(|c| {
                let ports = c
                    .ports
                    .iter()
                    .map(|p| (p.protocol, p.port, p.target_port))
                    .collect();
                (c.service_id.clone(), ports)
            })
            .collect(),
        other => panic!("expected a service unit, got {other:?}"),
    }
}

#[tokio::test]
async fn a_target_port_change_or_a_drifted_backend_port_creates_the_service_again() {
    let server = TestServer::start(config()).await;
    let mut c = Clients::connect(&server).await;
    let nrp = Arc::new(Mutex::new(FakeNrp::default()));
    let mut w = TestWorker::connect(&server.url(), "w", 1).await;
    c.service_to(v1::Operation::Add, "svc-b", &[(TCP, 80, 8080)])
        .await;
    c.service_to(v1::Operation::Add, "svc-c", &[(TCP, 80, 0)])
        .await;
    w.run_until_idle(&nrp, IDLE).await;
    let backends = |nrp: &Arc<Mutex<FakeNrp>>| nrp.lock().unwrap().backend_ports.clone();
    assert_eq!(
        backends(&nrp),
        BTreeMap::from([
            ("svc-b".to_string(), BTreeMap::from([((TCP, 80), 8080)])),
            ("svc-c".to_string(), BTreeMap::new()),
        ])
    );

    // Read back as created (svc-c's backend port 80 is its target port 0): nothing to do.
    let u = observe_unit(&server, &mut w).await;
    let report = nrp.lock().unwrap().apply_report(&u);
    w.send_report(report).await;
    assert!(
        w.next_unit(IDLE).await.is_none(),
        "no unit for the same rules"
    );
    // The target port given as the port itself is no change either.
    c.service_to(v1::Operation::Add, "svc-c", &[(TCP, 80, 80)])
        .await;
    assert!(w.next_unit(IDLE).await.is_none(), "80 → 80 is 80 → 0");

    // Someone pointed svc-b's rule at port 80 in NRP: the observe reads the backend port back,
    // and the service is created again with its target port.
    nrp.lock().unwrap().backend_ports.remove("svc-b");
    let u = observe_unit(&server, &mut w).await;
    let report = nrp.lock().unwrap().apply_report(&u);
    w.send_report(report).await;
    let u = expect_unit(&mut w).await;
    assert_eq!(
        change_targets(&u),
        [("svc-b".to_string(), vec![(TCP, 80, 8080)])]
    );
    assert_eq!(service_changes(&u)[0].1, v1::ServiceAction::Create);
    let report = nrp.lock().unwrap().apply_report(&u);
    w.send_report(report).await;
    assert_eq!(w.run_until_idle(&nrp, IDLE).await, 0, "nothing else to do");
    assert_eq!(backends(&nrp)["svc-b"], BTreeMap::from([((TCP, 80), 8080)]));

    // The pods moved to another port (same frontend port): the rule is created again.
    c.service_to(v1::Operation::Add, "svc-b", &[(TCP, 80, 9090)])
        .await;
    let u = expect_unit(&mut w).await;
    assert_eq!(
        change_targets(&u),
        [("svc-b".to_string(), vec![(TCP, 80, 9090)])]
    );
    let report = nrp.lock().unwrap().apply_report(&u);
    w.send_report(report).await;
    assert_eq!(w.run_until_idle(&nrp, IDLE).await, 0);
    assert_eq!(backends(&nrp)["svc-b"], BTreeMap::from([((TCP, 80), 9090)]));
    let shown: Vec<(u32, u32)> = c
        .get_service("svc-b")
        .await
        .unwrap()
        .ports
        .iter()
        .map(|p| (p.port, p.target_port))
        .collect();
    assert_eq!(shown, vec![(80, 9090)]);
    server.stop().await;
}

#[tokio::test]
async fn an_observe_with_other_rules_than_the_desired_ports_creates_the_service_again() {
    let server = TestServer::start(config()).await;
    let mut c = Clients::connect(&server).await;
    let nrp = Arc::new(Mutex::new(FakeNrp::default()));
    let mut w = TestWorker::connect(&server.url(), "w", 1).await;
    c.service(v1::Operation::Add, "svc-r", &[(TCP, 80), (UDP, 53)])
        .await;
    w.run_until_idle(&nrp, IDLE).await;
    assert!(c.get_service("svc-r").await.unwrap().actual);

    // The same rules in another order (and over two parts): nothing to do.
    let u = observe_unit(&server, &mut w).await;
    let snapshot = with_rules(&nrp, "svc-r", Some(&[(UDP, 53), (TCP, 80), (UDP, 53)]));
    let (mut first, mut second) = (snapshot.clone(), v1::NrpSnapshot::default());
    second.rules = std::mem::take(&mut first.rules);
    report_observed(&w, u.work_id, first, false).await;
    report_observed(&w, u.work_id, second, true).await;
    assert!(
        w.next_unit(IDLE).await.is_none(),
        "no unit for the same rules"
    );

    // Someone edited the load balancer in NRP: the observe reads other rules back, and the service
    // is created again with the desired ports.
    nrp.lock()
        .unwrap()
        .rules
        .insert("svc-r".into(), BTreeSet::from([(TCP, 8080)]));
    let before = server
        .state
        .gateway("")
        .unwrap()
        .lock()
        .tracker()
        .revision();
    let u = observe_unit(&server, &mut w).await;
    let report = nrp.lock().unwrap().apply_report(&u);
    w.send_report(report).await;
    let u = expect_unit(&mut w).await;
    assert_eq!(
        service_changes(&u),
        [(
            "svc-r".to_string(),
            v1::ServiceAction::Create,
            vec![(TCP, 80), (UDP, 53)]
        )]
    );
    assert!(
        server
            .state
            .gateway("")
            .unwrap()
            .lock()
            .tracker()
            .revision()
            > before
    );
    let report = nrp.lock().unwrap().apply_report(&u);
    w.send_report(report).await;
    assert_eq!(w.run_until_idle(&nrp, IDLE).await, 0, "nothing else to do");
    assert_eq!(
        nrp.lock().unwrap().rules.get("svc-r"),
        Some(&BTreeSet::from([(TCP, 80), (UDP, 53)]))
    );

    server.stop().await;
}

#[tokio::test]
async fn after_a_restart_an_observe_repairs_stale_rules_but_not_a_load_balancer_it_did_not_read() {
    let nrp = Arc::new(Mutex::new(FakeNrp::default()));
    // A first server creates the services with their first ports.
    {
        let server = TestServer::start(config()).await;
        let mut c = Clients::connect(&server).await;
        let mut w = TestWorker::connect(&server.url(), "w", 1).await;
        c.service(v1::Operation::Add, "svc-s", &[(TCP, 80)]).await;
        c.service(v1::Operation::Add, "svc-t", &[(TCP, 80)]).await;
        w.run_until_idle(&nrp, IDLE).await;
        server.stop().await;
    }
    assert_eq!(nrp.lock().unwrap().rules.len(), 2);

    // The ports changed while no server ran: the new server has never seen the old ones.
    let server = TestServer::start(config()).await;
    let mut c = Clients::connect(&server).await;
    c.service(v1::Operation::Add, "svc-s", &[(TCP, 443)]).await;
    c.service(v1::Operation::Add, "svc-t", &[(TCP, 8443)]).await;
    let mut w = TestWorker::connect(&server.url(), "w", 1).await;
    // The start-up observe reads svc-s's stale rules; svc-t's load balancer was not read back.
    let u = expect_unit(&mut w).await;
    assert!(matches!(u.work, Some(Work::Observe(_))), "{u:?}");
    report_observed(&w, u.work_id, with_rules(&nrp, "svc-t", None), true).await;
    let u = expect_unit(&mut w).await;
    assert_eq!(
        service_changes(&u),
        [(
            "svc-s".to_string(),
            v1::ServiceAction::Create,
            vec![(TCP, 443)]
        )],
        "only the service whose rules were read back and differ"
    );
    let report = nrp.lock().unwrap().apply_report(&u);
    w.send_report(report).await;
    assert_eq!(w.run_until_idle(&nrp, IDLE).await, 0, "nothing for svc-t");
    assert_eq!(
        nrp.lock().unwrap().rules.get("svc-t"),
        Some(&BTreeSet::from([(TCP, 80)]))
    );

    // The next observe reads svc-t's rules: it is created again too.
    let u = observe_unit(&server, &mut w).await;
    let report = nrp.lock().unwrap().apply_report(&u);
    w.send_report(report).await;
    let u = expect_unit(&mut w).await;
    assert_eq!(
        service_changes(&u),
        [(
            "svc-t".to_string(),
            v1::ServiceAction::Create,
            vec![(TCP, 8443)]
        )]
    );
    let report = nrp.lock().unwrap().apply_report(&u);
    w.send_report(report).await;
    assert_eq!(w.run_until_idle(&nrp, IDLE).await, 0);
    let rules = nrp.lock().unwrap().rules.clone();
    assert_eq!(
        rules,
        BTreeMap::from([
            ("svc-s".to_string(), BTreeSet::from([(TCP, 443)])),
            ("svc-t".to_string(), BTreeSet::from([(TCP, 8443)])),
        ])
    );
    server.stop().await;
}
