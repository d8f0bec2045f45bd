//! What the Writer service tells writers without the operator's Admin API (issue 20): the
//! writer's session in every Apply and Resync answer and as a stream (`WatchSession`), the
//! programming state of the gateway's services pushed (`WatchServices`), what writers wait for
//! pushed (`WatchLocations`, `WatchAddresses`) and `ServiceConditions` — against the real system (state server, workers, NRP emulator) over loopback.

use std::time::Duration;

use clb_client::client::Client;
use clb_client::updates;
use clb_proto::v1::{
    AddressQuery, AddressesState, AddressesWatch, LocationsState, ProgrammingReason, ServiceStates,
    WriterSession,
};
use clb_tests::{Harness, Options, PATIENCE};
use tonic::Code;

const WRITER: &str = "watcher";

/// Reads `stream` until `done` holds for a message (at most [`PATIENCE`]).
async fn until<T>(
    stream: &mut tonic::Streaming<T>,
    what: &str,
    mut done: impl FnMut(&T) -> bool,
) -> T {
    let read = async {
        loop {
            match stream.message().await {
                Ok(Some(m)) if done(&m) => return m,
                Ok(Some(_)) => {}
                other => panic!(
                    "{what}: the stream ended first: {other:?}",
                    other = other.err()
                ),
            }
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {PATIENCE:?}"))
}

fn eps(pairs: &[(&str, &str)]) -> Vec<clb_proto::v1::Endpoint> {
    pairs.iter().map(|(a, l)| updates::endpoint(a, l)).collect()
}

async fn client(h: &Harness) -> Client {
    h.client().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_and_the_session_stream_say_whether_the_server_holds_the_writers_resync() {
    clb_tests::init_tracing();
    let mut h = Harness::start(Options::e2e()).await;
    let c = client(&h).await;
    let mut w = c.writer(WRITER);

    // Before any resync: an apply is taken, and its answer says the server holds no resync.
    let a = w
        .apply(vec![updates::service_add("svc-a", &[])])
        .await
        .unwrap();
    let s0 = a
        .session
        .clone()
        .expect("an Apply answer carries the session");
    assert!(!s0.resynced, "{s0:?}");
    assert!(s0.epoch > 0 && !s0.server_id.is_empty() && !s0.gateway.is_empty());

    let mut session = w.watch_session().await.unwrap();
    let first = until(&mut session, "the first session message", |_| true).await;
    assert_eq!(first, s0);

    let r = w
        .resync(
            clb_client::client::scope::all(),
            vec![updates::service_add("svc-a", &[])],
        )
        .await
        .unwrap();
    let s1 = r.session.expect("a Resync answer carries the session");
    assert!(s1.resynced && s1.epoch == s0.epoch, "{s1:?}");
    // The stream pushes the change.
    let pushed = until(&mut session, "resynced pushed", |s: &WriterSession| {
        s.resynced
    })
    .await;
    assert_eq!(pushed, s1);
    let a = w
        .apply(vec![updates::service_add("svc-b", &[])])
        .await
        .unwrap();
    assert_eq!(a.session.as_ref(), Some(&s1));

    // A restart: the stream ends (or breaks), a new one and the next answer say: another epoch,
    // no resync of ours.
    h.restart_server().await;
    let ended = tokio::time::timeout(PATIENCE, async {
        loop {
            match session.message().await {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the session stream outlived the server");
    let c = client(&h).await;
    let mut w = c.writer(WRITER);
    let mut session = w.watch_session().await.unwrap();
    let s2 = until(&mut session, "the new server's session", |_| true).await;
    assert!(!s2.resynced && s2.epoch != s1.epoch, "{s2:?} after {s1:?}");
    let a = w
        .apply(vec![updates::service_add("svc-c", &[])])
        .await
        .unwrap();
    assert!(!a.session.unwrap().resynced);

    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_states_are_pushed_from_a_snapshot_to_programmed_and_gone() {
    clb_tests::init_tracing();
    let h = Harness::start(Options::e2e()).await;
    let c = client(&h).await;
    let mut w = c.writer(WRITER);
    w.resync(
        clb_client::client::scope::all(),
        vec![updates::service_add("svc-old", &[])],
    )
    .await
    .unwrap();
    let mut states = w.watch_services().await.unwrap();
    let snapshot = until(&mut states, "the snapshot", |_| true).await;
    assert!(snapshot.snapshot, "{snapshot:?}");
    assert_eq!(
        snapshot
            .services
            .iter()
            .map(|s| s.service_id.as_str())
            .collect::<Vec<_>>(),
        ["svc-old"]
    );
    assert!(snapshot.session.as_ref().is_some_and(|s| s.resynced));

    let pairs = [("10.1.0.5", "10.0.0.1"), ("10.1.0.6", "10.0.0.2")];
    w.apply(vec![
        updates::service_add("svc-new", &[]),
        updates::endpoints_level("svc-new", eps(&pairs)),
    ])
    .await
    .unwrap();
    let programmed = |m: &ServiceStates| {
        m.services.iter().any(|s| {
            s.service_id == "svc-new"
                && s.actual
                && !s.frontend_ip.is_empty()
                && s.actual_addresses == 2
                && s.condition
                    .as_ref()
                    .is_some_and(|c| c.reason == ProgrammingReason::Programmed as i32)
        })
    };
    let m = until(&mut states, "svc-new programmed", programmed).await;
    assert!(!m.snapshot && m.nrp_observed, "{m:?}");

    // Nothing changes: nothing is pushed (the next message, if any, is not about svc-new).
    let quiet = tokio::time::timeout(Duration::from_millis(1_500), states.message()).await;
    if let Ok(Ok(Some(m))) = &quiet {
        assert!(
            !m.services
                .iter()
                .any(|s| s.service_id == "svc-new" && s.actual),
            "an unchanged state was pushed again: {m:?}"
        );
    }

    w.apply(vec![
        updates::endpoints_level("svc-new", Vec::new()),
        updates::service_remove("svc-new"),
    ])
    .await
    .unwrap();
    until(&mut states, "svc-new gone", |m| {
        m.gone_service_ids.iter().any(|g| g == "svc-new")
    })
    .await;
    h.shutdown().await;
}

fn q(location: &str, address: &str, service: &str) -> AddressQuery {
    AddressQuery {
        location: location.into(),
        address: address.into(),
        service_id: service.into(),
    }
}

/// The answers of a `WatchAddresses` message, as (address, service, programmed).
fn answers(m: &AddressesState) -> Vec<(String, String, bool)> {
    m.addresses
        .iter()
        .map(|a| {
            let q = a.query.clone().unwrap_or_default();
            (q.address, q.service_id, a.programmed)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locations_and_addresses_are_pushed_first_then_on_change_and_bad_queries_are_refused() {
    clb_tests::init_tracing();
    let h = Harness::start(Options::e2e()).await;
    let c = client(&h).await;
    let mut w = c.writer(WRITER);
    w.resync(clb_client::client::scope::all(), Vec::new())
        .await
        .unwrap();
    // Nothing desired anywhere: every location programmed, in the request's order.
    let mut locations = w
        .watch_locations(vec!["10.0.0.1".into(), "10.0.0.9".into()])
        .await
        .unwrap();
    let first = until(&mut locations, "the first locations", |_| true).await;
    let of = |m: &LocationsState| {
        m.locations
            .iter()
            .map(|l| (l.location.clone(), l.programmed))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        of(&first),
        [("10.0.0.1".to_owned(), true), ("10.0.0.9".to_owned(), true)]
    );
    // One stream of addresses, its set changed as it goes.
    let (changes, rx) = futures::channel::mpsc::unbounded();
    let mut addresses = w
        .watch_addresses(vec![q("10.0.0.1", "10.1.0.5", "svc")], rx)
        .await
        .unwrap();
    let a0 = until(&mut addresses, "the first addresses", |_| true).await;
    assert_eq!(answers(&a0), [("10.1.0.5".into(), "svc".into(), false)]);

    w.apply(vec![
        updates::service_add("svc", &[]),
        updates::endpoints_level("svc", eps(&[("10.1.0.5", "10.0.0.1")])),
    ])
    .await
    .unwrap();
    // Pushed: the location programmed once NRP has it; 10.0.0.9 never changed, never sent again.
    until(&mut locations, "10.0.0.1 programmed", |m| {
        assert!(
            m.locations.iter().all(|l| l.location == "10.0.0.1"),
            "{m:?}"
        );
        m.locations.iter().any(|l| l.programmed)
    })
    .await;
    until(&mut addresses, "the address programmed", |m| {
        answers(m) == [("10.1.0.5".into(), "svc".into(), true)]
    })
    .await;
    // The set changes on the open stream: only the new addresses are answered.
    changes
        .unbounded_send(AddressesWatch {
            watch: vec![
                q("10.0.0.1", "10.1.0.5", "SVC"),
                q("10.0.0.1", "10.1.0.5", "other"),
                q("10.0.0.1", "10.1.0.6", "svc"),
                q("10.0.0.9", "10.1.0.5", "svc"),
            ],
            unwatch: vec![q("10.0.0.1", "10.1.0.5", "svc")],
            ..AddressesWatch::default()
        })
        .unwrap();
    let a1 = until(&mut addresses, "the new addresses", |_| true).await;
    let mut got = answers(&a1);
    got.sort();
    assert_eq!(
        got,
        [
            ("10.1.0.5".into(), "SVC".into(), true),
            ("10.1.0.5".into(), "other".into(), false),
            ("10.1.0.5".into(), "svc".into(), false),
            ("10.1.0.6".into(), "svc".into(), false),
        ]
    );
    // Why a service is (not) programmed: its condition; an unknown one, the default.
    let conditions = w
        .service_conditions(vec!["svc".into(), "unknown".into()])
        .await
        .unwrap();
    assert_eq!(conditions.len(), 2);
    assert_eq!(conditions[0].reason, ProgrammingReason::Programmed as i32);
    assert_eq!(conditions[1], clb_proto::v1::ServiceCondition::default());
    // A malformed change ends the stream, naming the field.
    changes
        .unbounded_send(AddressesWatch {
            unwatch: vec![q("not-an-ip", "10.1.0.5", "svc")],
            ..AddressesWatch::default()
        })
        .unwrap();
    let status = loop {
        match addresses.message().await {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("unwatch[0].location"),
        "{}",
        status.message()
    );
    // Malformed queries are refused at once, precisely.
    let err = w
        .watch_addresses(
            vec![q("10.0.0.1", "10.1.0.5", "")],
            futures::stream::pending(),
        )
        .await
        .unwrap_err();
    assert!(
        err.status().is_some_and(
            |s| s.code() == Code::InvalidArgument && s.message().contains("watch[0].service")
        ),
        "{err}"
    );
    let err = w
        .watch_locations(vec!["10.0.0.1".into(), "not-an-ip".into()])
        .await
        .unwrap_err();
    let status = err.status().expect("a gRPC status");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("locations[1]") && status.message().contains("not-an-ip"),
        "{}",
        status.message()
    );
    h.shutdown().await;
}

/// Issue 36: a writer's `WatchSession` stream follows that writer's session only. Another writer's
/// resync, a change of services and the gateway's publications neither wake its task (the server's
/// `clb_server_session_wakeups_total` does not move) nor send it anything; its own resync wakes it
/// once, and the session echoes the resync's sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_session_stream_is_woken_only_by_its_own_session() {
    clb_tests::init_tracing();
    let h = Harness::start(Options::e2e()).await;
    let c = client(&h).await;
    let state = h.server().state.clone();
    let mut agent = c.writer("node-agent/a");
    let mut session = agent.watch_session().await.unwrap();
    let first = until(&mut session, "the first session message", |_| true).await;
    assert!(!first.resynced && first.resync_sequence == 0, "{first:?}");
    // A `WatchServices` follower makes the gateway publish its services after every change.
    let mut services = c
        .writer(WRITER)
        .watch_services()
        .await
        .expect("WatchServices");
    until(
        &mut services,
        "the services snapshot",
        |m: &ServiceStates| m.snapshot,
    )
    .await;
    let woken = state.metrics().session_wakeups();

    // Another node agent resyncs its node; the watcher resyncs and changes services.
    let mut other = c.writer("node-agent/b").with_resync_sequence(7);
    let r = other
        .resync(clb_client::client::scope::pods_at("10.1.0.2"), Vec::new())
        .await
        .unwrap();
    let s = r.session.unwrap();
    assert!(s.resynced && s.resync_sequence == 7, "{s:?}");
    let mut w = c.writer(WRITER);
    w.resync(
        clb_client::client::scope::all(),
        vec![updates::service_add("svc-x", &[])],
    )
    .await
    .unwrap();
    w.apply(vec![updates::service_add("svc-y", &[])])
        .await
        .unwrap();
    until(&mut services, "svc-y pushed", |m: &ServiceStates| {
        m.services.iter().any(|s| s.service_id == "svc-y")
    })
    .await;
    let quiet = tokio::time::timeout(Duration::from_millis(300), session.message()).await;
    assert!(quiet.is_err(), "the agent's stream sent {quiet:?}");
    assert_eq!(
        state.metrics().session_wakeups(),
        woken,
        "another writer's resync or a change of services woke the agent's session stream"
    );

    // Its own resync wakes it once, with the sequence it gave.
    let mut agent = agent.with_resync_sequence(42);
    let r = agent
        .resync(clb_client::client::scope::pods_at("10.1.0.1"), Vec::new())
        .await
        .unwrap();
    let answered = r.session.unwrap();
    assert!(answered.resynced && answered.resync_sequence == 42);
    let pushed = until(&mut session, "its resync pushed", |s: &WriterSession| {
        s.resynced
    })
    .await;
    assert_eq!(pushed, answered);
    assert_eq!(state.metrics().session_wakeups(), woken + 1);
    h.shutdown().await;
}
