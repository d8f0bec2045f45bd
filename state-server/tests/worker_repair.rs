//! Reports that say more than "applied" or "failed", over real gRPC on 127.0.0.1:0
//! (docs/errors.md): a `Repair` outcome is read back and retried, never parked; a service saga that
//! stopped part-way is recorded step by step (`Report.service_progress`).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clb_core::difftracker::{Endpoint, Operation};
use clb_core::dispatch::DispatchConfig;
use clb_proto::v1;
use clb_state_server::state::{ServerConfig, StateServer};
use support::worker::{FakeNrp, TestServer, TestWorker, unit_locations};

const IDLE: Duration = Duration::from_millis(300);
const WAIT: Duration = Duration::from_secs(5);

fn config() -> ServerConfig {
    ServerConfig {
        dispatch: DispatchConfig {
            lease: Duration::from_secs(30),
            retry_base: Duration::from_millis(20),
            retry_max: Duration::from_millis(50),
            ..DispatchConfig::default()
        },
        ..ServerConfig::default()
    }
}

/// `svc-a` and `svc-b`, each with one pod at 10.0.0.1.
fn seed(state: &StateServer) {
    let g = state.gateway("").unwrap();
    let mut gw = g.lock();
    let t = gw.tracker_mut();
    for (s, a) in [("svc-a", "10.1.0.1"), ("svc-b", "10.1.0.2")] {
        t.update_service(Operation::Add, s).unwrap();
        t.set_endpoints(
            s,
            &[Endpoint {
                address: a,
                location: "10.0.0.1",
            }],
        )
        .unwrap();
    }
    drop(gw);
    state.notify_work();
}

fn is_observe(u: &v1::WorkUnit) -> bool {
    matches!(u.work, Some(v1::work_unit::Work::Observe(_)))
}

fn service_changes(u: &v1::WorkUnit) -> Vec<(String, i32)> {
    match &u.work {
        Some(v1::work_unit::Work::Services(w)) => w
            .changes
            .iter()
            .map(|c| (c.service_id.clone(), c.action))
            .collect(),
        _ => vec![],
    }
}

#[tokio::test]
async fn a_repair_is_read_back_then_retried_and_never_parked() {
    let server = TestServer::start(config()).await;
    seed(&server.state);
    let nrp = Arc::new(Mutex::new(FakeNrp::default()));
    let mut w = TestWorker::connect(&server.url(), "w", 1).await;
    let u = w
        .first_location_unit(&nrp, IDLE)
        .await
        .expect("a location unit");
    w.report(
        u.work_id,
        v1::report::Outcome::Repair(v1::Repair {
            retry_after_ms: 0,
            code: "ServiceNotRegistered".into(),
            message: "refers to a service NRP does not have".into(),
            refused: false,
        }),
    )
    .await;
    // NRP is read back first; only then does the location come again.
    let o = w.next_unit(WAIT).await.expect("the read-back");
    assert!(is_observe(&o), "{o:?}");
    {
        let g = server.state.gateway("").unwrap();
        let gw = g.lock();
        assert_eq!(gw.dispatch().parked_units(), 0);
        assert_eq!(gw.dispatch().awaiting_read_back(), 1);
        let errors = gw.dispatch().last_errors();
        let last = errors.last().expect("recorded");
        assert_eq!(last.code, "ServiceNotRegistered");
        assert!(!last.terminal);
    }
    let report = nrp.lock().unwrap().apply_report(&o);
    w.send_report(report).await;
    let again = w.next_unit(WAIT).await.expect("the location again");
    assert_eq!(unit_locations(&again), unit_locations(&u));
    let report = nrp.lock().unwrap().apply_report(&again);
    w.send_report(report).await;
    w.run_until_idle(&nrp, IDLE).await;
    {
        let g = server.state.gateway("").unwrap();
        let gw = g.lock();
        assert!(gw.tracker().pending_diff().is_empty());
        assert_eq!(gw.dispatch().awaiting_read_back(), 0);
    }
    server.stop().await;
}

#[tokio::test]
async fn a_deletion_that_unregistered_before_it_failed_takes_the_service_out_of_nrp() {
    // Retries wait long enough for the test to bring the Service back first.
    let mut slow = config();
    slow.dispatch.retry_base = Duration::from_secs(3);
    slow.dispatch.retry_max = Duration::from_secs(3);
    let server = TestServer::start(slow).await;
    seed(&server.state);
    let nrp = Arc::new(Mutex::new(FakeNrp::default()));
    let mut w = TestWorker::connect(&server.url(), "w", 1).await;
    w.run_until_idle(&nrp, IDLE).await;
    // svc-b goes: its address is drained, then its deletion is sent.
    {
        let g = server.state.gateway("").unwrap();
        g.lock()
            .tracker_mut()
            .update_service(Operation::Remove, "svc-b")
            .unwrap();
    }
    server.state.notify_work();
    let deletion = loop {
        let u = w
            .next_unit(WAIT)
            .await
            .expect("the drain, then the deletion");
        if service_changes(&u) == [("svc-b".to_string(), v1::ServiceAction::Delete as i32)] {
            break u;
        }
        let report = nrp.lock().unwrap().apply_report(&u);
        w.send_report(report).await;
    };
    // NRP removed the registration, then the load balancer's deletion failed.
    nrp.lock().unwrap().services.remove("svc-b");
    w.send_report(v1::Report {
        work_id: deletion.work_id,
        applied_indices: vec![],
        frontends: vec![],
        service_progress: vec![v1::ServiceProgress {
            index: 0,
            step: v1::ServiceStep::Unregistered as i32,
        }],
        remaining_subscription_writes: None,
        refused_addresses: Vec::new(),
        outcome: Some(v1::report::Outcome::Retryable(v1::Retryable {
            retry_after_ms: 0,
            code: "InternalServerError".into(),
            message: "deleting lb-svc-b".into(),
        })),
    })
    .await;
    // The registration's removal is recorded (the service is no longer in NRP's actual state).
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let g = server.state.gateway("").unwrap();
        if !g
            .lock()
            .tracker()
            .service_view("svc-b")
            .expect("known")
            .actual
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "report not folded");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The Service comes back before the clean-up: it must be created again, not assumed in NRP.
    {
        let g = server.state.gateway("").unwrap();
        let mut gw = g.lock();
        gw.tracker_mut()
            .update_service(Operation::Add, "svc-b")
            .unwrap();
        gw.tracker_mut()
            .set_endpoints(
                "svc-b",
                &[Endpoint {
                    address: "10.1.0.2",
                    location: "10.0.0.1",
                }],
            )
            .unwrap();
    }
    server.state.notify_work();
    let create = w.next_unit(WAIT).await.expect("the creation");
    assert_eq!(
        service_changes(&create),
        [("svc-b".to_string(), v1::ServiceAction::Create as i32)]
    );
    let report = nrp.lock().unwrap().apply_report(&create);
    w.send_report(report).await;
    // FakeNrp asserts that no address refers to a service it does not have.
    w.run_until_idle(&nrp, IDLE).await;
    {
        let g = server.state.gateway("").unwrap();
        let gw = g.lock();
        assert!(gw.tracker().pending_diff().is_empty());
        assert_eq!(gw.dispatch().parked_units(), 0);
        let nrp = nrp.lock().unwrap();
        assert!(nrp.services.contains_key("svc-b"));
        assert_eq!(nrp.locations["10.0.0.1"].len(), 2);
    }
    server.stop().await;
}
