//! The Worker stream and the dispatcher over real gRPC on 127.0.0.1:0, with test workers built on
//! the generated client: convergence, disconnect, hang and lease expiry, exclusivity of locations,
//! restart without spurious removals, retries and parking.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clb_core::difftracker::{Endpoint, Operation, PodUpdate};
use clb_core::dispatch::DispatchConfig;
use clb_proto::v1;
use clb_state_server::state::{ServerConfig, StateServer};
use support::worker::{FakeNrp, TestServer, TestWorker, unit_locations};

const IDLE: Duration = Duration::from_millis(300);

fn config(lease: Duration) -> ServerConfig {
    ServerConfig {
        dispatch: DispatchConfig {
            lease,
            max_locations_per_unit: 4,
            retry_base: Duration::from_millis(20),
            retry_max: Duration::from_millis(200),
            ..DispatchConfig::default()
        },
        ..ServerConfig::default()
    }
}

/// Two services over `locations` nodes with two pods each, one egress.
fn seed(state: &StateServer, locations: u8) {
    let g = state.gateway("").unwrap();
    let mut gw = g.lock();
    let t = gw.tracker_mut();
    t.update_service(Operation::Add, "svc-a").unwrap();
    t.update_service(Operation::Add, "svc-b").unwrap();
    let pods: Vec<(String, String)> = (1..=locations)
        .flat_map(|l| (1..=2).map(move |p| (format!("10.1.{l}.{p}"), format!("10.0.0.{l}"))))
        .collect();
    let eps: Vec<Endpoint> = pods
        .iter()
        .map(|(a, l)| Endpoint {
            address: a,
            location: l,
        })
        .collect();
    t.set_endpoints("svc-a", &eps).unwrap();
    t.set_endpoints("svc-b", &eps[..2]).unwrap();
    for (a, l) in &pods {
        t.update_pod(
            Operation::Add,
            &PodUpdate {
                address: a,
                location: l,
                outbound_identity: "egress-1",
                uid: a,
                ..Default::default()
            },
        )
        .unwrap();
    }
    drop(gw);
    state.notify_work();
}

fn converged(state: &StateServer) -> bool {
    let g = state.gateway("").unwrap();
    let gw = g.lock();
    gw.tracker().pending_diff().is_empty() && gw.dispatch().units_in_flight() == 0
}

fn nrp_address_count(nrp: &Arc<Mutex<FakeNrp>>) -> usize {
    nrp.lock()
        .unwrap()
        .locations
        .values()
        .map(|l| l.len())
        .sum()
}

#[tokio::test]
async fn updates_become_units_and_reports_converge_the_actual_state() {
    let server = TestServer::start(config(Duration::from_secs(30))).await;
    seed(&server.state, 6);
    let nrp = Arc::new(Mutex::new(FakeNrp::default()));
    let mut w = TestWorker::connect(&server.url(), "w1", 2).await;
    let units = w.run_until_idle(&nrp, IDLE).await;
    assert!(
        converged(&server.state),
        "pending: {:?}",
        server
            .state
            .gateway("")
            .unwrap()
            .lock()
            .tracker()
            .pending_diff()
    );
    assert_eq!(nrp_address_count(&nrp), 12);
    // Packing: 6 locations with a limit of 4 per unit need 2 location units, plus 1 observe and
    // the service units.
    assert!(units <= 6, "{units} units");
    {
        let g = server.state.gateway("").unwrap();
        let gw = g.lock();
        assert_eq!(gw.tracker().counts().actual_addresses, 12);
        assert!(
            gw.tracker().removals_allowed(),
            "gate opens after the observe with no expected writers"
        );
        // The creation reports told the server each inbound service's frontend.
        let frontends: BTreeMap<String, String> = gw
            .frontends()
            .iter()
            .map(|(s, ip)| (s.clone(), ip.clone()))
            .collect();
        assert_eq!(frontends, nrp.lock().unwrap().frontends);
        assert_eq!(
            frontends.keys().map(String::as_str).collect::<Vec<_>>(),
            ["svc-a", "svc-b"]
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_worker_that_disconnects_mid_unit_loses_its_units_at_once() {
    let server = TestServer::start(config(Duration::from_secs(600))).await;
    seed(&server.state, 2);
    let nrp = Arc::new(Mutex::new(FakeNrp::default()));
    let mut a = TestWorker::connect(&server.url(), "a", 1).await;
    // Let a do the observe and service work, then hold a location unit and vanish.
    let held = a
        .first_location_unit(&nrp, IDLE)
        .await
        .expect("a location unit");
    drop(a);
    let mut b = TestWorker::connect(&server.url(), "b", 1).await;
    // The lease is 10 minutes: b can only get the locations because the disconnect released them.
    let u = b
        .next_unit(Duration::from_secs(5))
        .await
        .expect("b gets the released unit");
    assert_eq!(unit_locations(&u), unit_locations(&held));
    let outcome = nrp.lock().unwrap().apply(&u);
    b.report(u.work_id, outcome).await;
    b.run_until_idle(&nrp, IDLE).await;
    assert!(converged(&server.state));
    server.stop().await;
}

#[tokio::test]
async fn a_unit_re_sent_after_its_worker_disconnected_carries_the_next_attempt() {
    let server = TestServer::start(config(Duration::from_secs(600))).await;
    seed(&server.state, 2);
    let nrp = Arc::new(Mutex::new(FakeNrp::default()));
    let mut a = TestWorker::connect(&server.url(), "a", 1).await;
    let held = a
        .first_location_unit(&nrp, IDLE)
        .await
        .expect("a location unit");
    assert_eq!(held.attempt, 1, "first hand-out");
    // a vanishes without reporting.
    drop(a);
    let mut b = TestWorker::connect(&server.url(), "b", 1).await;
    let again = b
        .next_unit(Duration::from_secs(5))
        .await
        .expect("b gets the released unit");
    assert_eq!(unit_locations(&again), unit_locations(&held));
    assert_ne!(again.work_id, held.work_id);
    assert_eq!(again.attempt, 2, "the same change handed out a second time");
    let outcome = nrp.lock().unwrap().apply(&again);
    b.report(again.work_id, outcome).await;
    b.run_until_idle(&nrp, IDLE).await;
    assert!(converged(&server.state));
    // Recorded: a new change of one of those locations starts at attempt 1 again.
    {
        let g = server.state.gateway("").unwrap();
        g.lock()
            .tracker_mut()
            .update_pod(
                Operation::Add,
                &PodUpdate {
                    address: "10.1.1.9",
                    location: "10.0.0.1",
                    outbound_identity: "egress-1",
                    uid: "new",
                    ..Default::default()
                },
            )
            .unwrap();
    }
    server.state.notify_work();
    let next = b
        .next_unit(Duration::from_secs(5))
        .await
        .expect("the new change");
    assert_eq!(unit_locations(&next), ["10.0.0.1"]);
    assert_eq!(next.attempt, 1);
    server.stop().await;
}

#[tokio::test]
async fn a_hung_worker_loses_its_units_when_the_lease_expires_and_its_late_report_is_ignored() {
    let server = TestServer::start(config(Duration::from_millis(400))).await;
    seed(&server.state, 2);
    let nrp = Arc::new(Mutex::new(FakeNrp::default()));
    let mut a = TestWorker::connect(&server.url(), "hung", 1).await;
    let held = a
        .first_location_unit(&nrp, IDLE)
        .await
        .expect("a location unit");
    // a hangs (keeps its stream open, says nothing). b arrives and gets the unit after expiry.
    let mut b = TestWorker::connect(&server.url(), "b", 1).await;
    let u = b
        .next_unit(Duration::from_secs(5))
        .await
        .expect("b gets the expired unit");
    assert_eq!(unit_locations(&u), unit_locations(&held));
    assert_ne!(u.work_id, held.work_id);
    // Status flags the hung worker, and the last errors name it and the unit.
    let hung = |state: &StateServer| {
        state
            .workers()
            .into_iter()
            .find(|w| w.worker_id == "hung")
            .expect("hung is connected")
    };
    let w = hung(&server.state);
    assert!(
        w.lease_expiries >= 1 && w.expiries_since_report >= 1,
        "{w:?}"
    );
    // (It reported the observe unit before it took the location unit and hung.)
    assert!(w.last_unit_unix_ms > 0, "{w:?}");
    let reported_before = w.last_report_unix_ms;
    {
        let g = server.state.gateway("").unwrap();
        let gw = g.lock();
        let status = clb_state_server::grpc::convert::gateway_status(
            gw.name(),
            gw.status(std::time::Instant::now(), 100),
            &|session| server.state.worker_id(session),
        );
        let e = status
            .last_errors
            .iter()
            .find(|e| e.work_id == held.work_id)
            .expect("the expiry is among the last errors");
        assert_eq!(
            (e.code.as_str(), e.worker_id.as_str()),
            ("LeaseExpired", "hung")
        );
        assert!(e.unit.starts_with("locations 10.0.0."), "{e:?}");
    }
    // a wakes up and reports success for what it held, claiming an address NRP never got.
    a.report(held.work_id, v1::report::Outcome::Applied(v1::Applied {}))
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    {
        let g = server.state.gateway("").unwrap();
        let gw = g.lock();
        assert!(gw.dispatch().stats().late_reports >= 1);
        assert!(gw.dispatch().stats().lease_expiries >= 1);
        assert_eq!(
            gw.tracker().counts().actual_addresses,
            0,
            "the late report recorded nothing"
        );
    }
    // A report, even a late one, shows the worker alive again.
    let w = hung(&server.state);
    assert!(
        w.expiries_since_report == 0 && w.last_report_unix_ms >= reported_before,
        "{w:?}"
    );
    let outcome = nrp.lock().unwrap().apply(&u);
    b.report(u.work_id, outcome).await;
    // The expiry left NRP uncertain: a read-back follows one lease (400 ms) after it, longer
    // than IDLE; b waits for it.
    b.run_until_idle(&nrp, IDLE + Duration::from_millis(400))
        .await;
    assert!(converged(&server.state));
    server.stop().await;
}

#[tokio::test]
async fn under_many_concurrent_workers_no_location_is_held_by_two_at_once() {
    let server = TestServer::start(config(Duration::from_secs(30))).await;
    seed(&server.state, 40);
    let nrp = Arc::new(Mutex::new(FakeNrp::default()));
    let held: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let mut tasks = Vec::new();
    for i in 0..6 {
        let url = server.url();
        let nrp = nrp.clone();
        let held = held.clone();
        tasks.push(tokio::spawn(async move {
            let mut w = TestWorker::connect(&url, &format!("w{i}"), 2).await;
            while let Some(u) = w.next_unit(IDLE).await {
                let locs = unit_locations(&u);
                for l in &locs {
                    assert!(
                        held.lock().unwrap().insert(l.clone()),
                        "location {l} held by two workers"
                    );
                }
                tokio::task::yield_now().await;
                let outcome = nrp.lock().unwrap().apply(&u);
                for l in &locs {
                    held.lock().unwrap().remove(l);
                }
                w.report(u.work_id, outcome).await;
            }
        }));
        // Keep changing the desired state while workers run, so locations are re-cut.
        let g = server.state.gateway("").unwrap();
        g.lock()
            .tracker_mut()
            .update_pod(
                Operation::Add,
                &PodUpdate {
                    address: "10.1.1.1",
                    location: "10.0.0.1",
                    outbound_identity: &format!("egress-{i}"),
                    uid: "x",
                    ..Default::default()
                },
            )
            .unwrap();
        server.state.notify_work();
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(converged(&server.state));
    server.stop().await;
}

#[tokio::test]
async fn after_a_restart_no_still_desired_address_is_ever_in_a_removal() {
    let nrp = Arc::new(Mutex::new(FakeNrp::default()));
    let first = TestServer::start(config(Duration::from_secs(30))).await;
    seed(&first.state, 5);
    let mut w = TestWorker::connect(&first.url(), "w", 2).await;
    w.run_until_idle(&nrp, IDLE).await;
    drop(w);
    first.stop().await;
    let before = nrp_address_count(&nrp);
    assert_eq!(before, 10);
    nrp.lock().unwrap().removals.clear();

    // The new server expects the watcher; the watcher's view arrives in parts (mid-rollout).
    let second = TestServer::start(ServerConfig {
        expected_writers: vec!["watcher".into()],
        ..config(Duration::from_secs(30))
    })
    .await;
    let mut w = TestWorker::connect(&second.url(), "w", 2).await;
    {
        let g = second.state.gateway("").unwrap();
        let mut gw = g.lock();
        gw.tracker_mut()
            .update_service(Operation::Add, "svc-a")
            .unwrap();
        gw.tracker_mut()
            .set_endpoints(
                "svc-a",
                &[Endpoint {
                    address: "10.1.1.1",
                    location: "10.0.0.1",
                }],
            )
            .unwrap();
    }
    second.state.notify_work();
    w.run_until_idle(&nrp, IDLE).await;
    assert!(
        nrp.lock().unwrap().removals.is_empty(),
        "removals before the watcher resynced: {:?}",
        nrp.lock().unwrap().removals
    );
    assert_eq!(nrp_address_count(&nrp), before);
    // The watcher finishes its resync: now the view is complete, and removals may flow.
    seed(&second.state, 4);
    {
        let g = second.state.gateway("").unwrap();
        g.lock()
            .resync_completed("watcher", std::time::Instant::now(), 1);
    }
    second.state.notify_work();
    w.run_until_idle(&nrp, IDLE).await;
    assert!(converged(&second.state));
    // The new server learnt the frontends from its observe of NRP.
    {
        let g = second.state.gateway("").unwrap();
        let frontends: BTreeMap<String, String> =
            g.lock().frontends().clone().into_iter().collect();
        let nrp = nrp.lock().unwrap();
        assert_eq!(frontends, nrp.frontends);
        assert_eq!(frontends.len(), 2);
    }
    let removals = nrp.lock().unwrap().removals.clone();
    assert!(
        !removals.is_empty(),
        "location 10.0.0.5 is no longer desired and was removed"
    );
    for (location, _, _) in &removals {
        assert_eq!(location, "10.0.0.5", "only the vanished node lost backends");
    }
    second.stop().await;
}

#[tokio::test]
async fn a_retryable_failure_comes_back_and_a_terminal_one_is_parked_and_reported() {
    let server = TestServer::start(config(Duration::from_secs(30))).await;
    seed(&server.state, 1);
    let nrp = Arc::new(Mutex::new(FakeNrp::default()));
    let mut w = TestWorker::connect(&server.url(), "w", 1).await;
    // Observe + services go through.
    let u = w
        .first_location_unit(&nrp, IDLE)
        .await
        .expect("a location unit");
    w.report(
        u.work_id,
        v1::report::Outcome::Retryable(v1::Retryable {
            retry_after_ms: 150,
            code: "TooManyRequests".into(),
            message: "throttled".into(),
        }),
    )
    .await;
    let again = w
        .next_unit(Duration::from_secs(5))
        .await
        .expect("the unit comes back");
    assert_eq!(unit_locations(&again), unit_locations(&u));
    w.report(
        again.work_id,
        v1::report::Outcome::Terminal(v1::Terminal {
            code: "InvalidResourceReference".into(),
            message: "no such pool".into(),
            changes: Vec::new(),
        }),
    )
    .await;
    assert!(
        w.next_unit(IDLE).await.is_none(),
        "a parked location is not retried"
    );
    {
        let g = server.state.gateway("").unwrap();
        let gw = g.lock();
        assert_eq!(gw.dispatch().parked_units(), 1);
        let errors = gw.dispatch().last_errors();
        assert_eq!(errors.len(), 2);
        assert!(!errors[0].terminal && errors[0].code == "TooManyRequests");
        assert!(errors[1].terminal && errors[1].code == "InvalidResourceReference");
    }
    // A change of the desired state unparks it.
    {
        let g = server.state.gateway("").unwrap();
        g.lock()
            .tracker_mut()
            .update_pod(
                Operation::Add,
                &PodUpdate {
                    address: "10.1.1.9",
                    location: "10.0.0.1",
                    outbound_identity: "egress-1",
                    uid: "n",
                    ..Default::default()
                },
            )
            .unwrap();
    }
    server.state.notify_work();
    w.run_until_idle(&nrp, IDLE).await;
    assert!(converged(&server.state));
    assert_eq!(
        server
            .state
            .gateway("")
            .unwrap()
            .lock()
            .dispatch()
            .parked_units(),
        0
    );
    server.stop().await;
}
