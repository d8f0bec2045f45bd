//! A change of who owns the pods of a location never strands state, over real gRPC on
//! 127.0.0.1:0 with a test worker and a fake NRP that logs every removal.
//!
//! The watcher first reports every pod; then it stops (`--pods=false`) and declares node agents as
//! the owners. The pods it wrote leave the desired state, but removals at each location wait for
//! that location's agent: one agent resyncs (a pod deleted meanwhile goes, nothing else), the other
//! never comes and its location is released after the bounded wait only. Then the watcher takes the
//! pods back, and its own resync covers every location. Nothing here asserts on time: a check that
//! something is still held samples NRP first and then confirms that the hold was still there.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clb_core::dispatch::DispatchConfig;
use clb_proto::v1::admin_client::AdminClient;
use clb_proto::v1::writer_client::WriterClient;
use clb_proto::v1::{
    self, ClusterNode, ClusterTopology, EndpointSet, EndpointsUpdate, PodUpdate, ResyncChunk,
    ResyncHeader, ResyncRequest, ResyncScope, ServiceUpdate, StatusRequest, Update,
    endpoints_update::Change, resync_request::Part, update::Kind,
};
use clb_state_server::state::ServerConfig;
use support::worker::{FakeNrp, TestServer, TestWorker};
use tonic::transport::Channel;

const IDLE: Duration = Duration::from_millis(300);
/// Bounds a hung test only.
const PATIENCE: Duration = Duration::from_secs(60);
const ADD: i32 = v1::Operation::Add as i32;
const N1: &str = "10.0.0.1";
const N2: &str = "10.0.0.2";

fn pod(address: &str, location: &str) -> Update {
    Update {
        kind: Some(Kind::Pod(PodUpdate {
            operation: ADD,
            address: address.into(),
            location: location.into(),
            egress_id: "eg-1".into(),
            pod_key: format!("ns/{address}"),
            pod_uid: format!("uid-{address}"),
            ..Default::default()
        })),
    }
}

/// svc-a (backed by one pod per node) and its endpoints.
fn cluster_view() -> Vec<Update> {
    vec![
        Update {
            kind: Some(Kind::Service(ServiceUpdate {
                operation: ADD,
                service_id: "svc-a".into(),
                ports: vec![],
                ..Default::default()
            })),
        },
        Update {
            kind: Some(Kind::Endpoints(EndpointsUpdate {
                service_id: "svc-a".into(),
                change: Some(Change::Level(EndpointSet {
                    endpoints: [("10.1.1.1", N1), ("10.1.2.1", N2)]
                        .iter()
                        .map(|(a, l)| v1::Endpoint {
                            address: (*a).into(),
                            location: (*l).into(),
                        })
                        .collect(),
                })),
            })),
        },
    ]
}

/// Two pods per node, with egress eg-1.
fn pods() -> Vec<Update> {
    vec![
        pod("10.1.1.1", N1),
        pod("10.1.1.2", N1),
        pod("10.1.2.1", N2),
        pod("10.1.2.2", N2),
    ]
}

fn topology(agents: bool) -> ClusterTopology {
    ClusterTopology {
        nodes: [("n1", N1), ("n2", N2)]
            .iter()
            .map(|(name, l)| ClusterNode {
                name: (*name).into(),
                locations: vec![(*l).into()],
                pods_writer: if agents {
                    format!("node-agent/{name}")
                } else {
                    "watcher".into()
                },
            })
            .collect(),
    }
}

async fn resync(
    w: &mut WriterClient<Channel>,
    writer: &str,
    scope: ResyncScope,
    topology: Option<ClusterTopology>,
    updates: Vec<Update>,
) -> v1::ResyncResponse {
    let requests = vec![
        ResyncRequest {
            part: Some(Part::Header(ResyncHeader {
                gateway: String::new(),
                writer: writer.into(),
                scope: Some(scope),
                topology,
                resync_sequence: 0,
            })),
        },
        ResyncRequest {
            part: Some(Part::Chunk(ResyncChunk { updates })),
        },
    ];
    let r = w
        .resync(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    r
}

fn watcher_scope(pods: bool) -> ResyncScope {
    ResyncScope {
        services: true,
        endpoints: true,
        pods,
        ..ResyncScope::default()
    }
}

fn pods_at(location: &str) -> ResyncScope {
    ResyncScope {
        pods: true,
        location: location.into(),
        ..ResyncScope::default()
    }
}

async fn gates(admin: &mut AdminClient<Channel>) -> v1::InitGates {
    let s = admin
        .status(StatusRequest::default())
        .await
        .unwrap()
        .into_inner();
    s.gateways[0].init.clone().expect("gates")
}

/// NRP's addresses at `location`: address → services.
fn at(nrp: &Arc<Mutex<FakeNrp>>, location: &str) -> BTreeMap<String, BTreeSet<String>> {
    nrp.lock()
        .unwrap()
        .locations
        .get(location)
        .cloned()
        .unwrap_or_default()
}

fn set(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// Removals (after position `from` of the log) that took a service `desired` still has there.
fn spurious(
    nrp: &Arc<Mutex<FakeNrp>>,
    from: usize,
    desired: &[(&str, &str, &[&str])],
) -> Vec<support::worker::Removal> {
    nrp.lock().unwrap().removals[from..]
        .iter()
        .filter(|(l, a, lost)| {
            desired
                .iter()
                .any(|(dl, da, s)| dl == l && da == a && s.iter().any(|s| lost.contains(*s)))
        })
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_handed_to_node_agents_wait_for_each_agent_and_an_absent_one_only_for_the_bound() {
    let server = TestServer::start(ServerConfig {
        resync_wait: Duration::from_secs(3),
        dispatch: DispatchConfig {
            lease: Duration::from_secs(5),
            retry_base: Duration::from_millis(20),
            retry_max: Duration::from_millis(200),
            ..DispatchConfig::default()
        },
        ..ServerConfig::default()
    })
    .await;
    let channel = tonic::transport::Endpoint::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut writer = WriterClient::new(channel.clone());
    let mut admin = AdminClient::new(channel);
    let nrp = Arc::new(Mutex::new(FakeNrp::default()));
    let mut worker = TestWorker::connect(&server.url(), "w1", 4).await;

    // The watcher reports every pod.
    let mut view = cluster_view();
    view.extend(pods());
    resync(
        &mut writer,
        "watcher",
        watcher_scope(true),
        Some(topology(false)),
        view,
    )
    .await;
    worker.run_until_idle(&nrp, IDLE).await;
    let egress = set(&["eg-1"]);
    let both = set(&["eg-1", "svc-a"]);
    assert_eq!(
        at(&nrp, N2),
        BTreeMap::from([
            ("10.1.2.1".into(), both.clone()),
            ("10.1.2.2".into(), egress)
        ])
    );
    assert!(gates(&mut admin).await.removals_allowed);
    let from = nrp.lock().unwrap().removals.len();

    // The watcher stops reporting pods: node agents own them from now on. Pod 10.1.1.2 is
    // deleted meanwhile (nobody reports that: the watcher no longer does, the agent is not there).
    let r = resync(
        &mut writer,
        "watcher",
        watcher_scope(false),
        Some(topology(true)),
        cluster_view(),
    )
    .await;
    assert_eq!(r.removed, 0);
    worker.run_until_idle(&nrp, IDLE).await;
    // Sample NRP, then make sure both locations were still held when the sample was taken.
    let sampled = nrp.lock().unwrap().locations.clone();
    let removals: Vec<_> = nrp.lock().unwrap().removals[from..].to_vec();
    let init = gates(&mut admin).await;
    assert!(
        !init.held.is_empty(),
        "the handover holds nothing back: {init:?}"
    );
    if init.pending_writers == ["node-agent/n1", "node-agent/n2"] {
        assert!(
            init.held
                .iter()
                .all(|h| h.reason == "pod_writer" && h.locations == 1 && h.deadline_unix_ms > 0),
            "{init:?}"
        );
        assert_eq!(
            sampled[N1].len(),
            2,
            "removed before the agent had its chance"
        );
        assert_eq!(
            sampled[N2].len(),
            2,
            "removed before the agent had its chance"
        );
        assert!(removals.is_empty(), "{removals:?}");
    } else {
        eprintln!("the bound passed before the check: {init:?}");
    }

    // Agent n1 resyncs: its view is the truth at n1, the deleted pod goes, nothing else.
    resync(
        &mut writer,
        "node-agent/n1",
        pods_at(N1),
        None,
        vec![pod("10.1.1.1", N1)],
    )
    .await;
    worker.run_until_idle(&nrp, IDLE).await;
    // Sample NRP, then make sure n2 was still held when the sample was taken.
    let sampled_n2 = at(&nrp, N2);
    let removals: Vec<_> = nrp.lock().unwrap().removals[from..].to_vec();
    let init = gates(&mut admin).await;
    if init.pending_writers == ["node-agent/n2"] {
        assert_eq!(
            sampled_n2,
            BTreeMap::from([
                ("10.1.2.1".into(), both.clone()),
                ("10.1.2.2".into(), set(&["eg-1"]))
            ]),
            "n2 changed before its agent had its chance"
        );
        assert_eq!(
            removals,
            [(N1.to_owned(), "10.1.1.2".to_owned(), set(&["eg-1"]))]
        );
    } else {
        eprintln!("the bound passed before the check: {init:?}");
    }
    assert_eq!(
        at(&nrp, N1),
        BTreeMap::from([("10.1.1.1".into(), both.clone())])
    );

    // Agent n2 never comes: its location is released after the bounded wait.
    let deadline = Instant::now() + PATIENCE;
    while !gates(&mut admin).await.removals_allowed {
        assert!(
            Instant::now() < deadline,
            "the handover wait is not bounded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.run_until_idle(&nrp, IDLE).await;
    assert_eq!(
        at(&nrp, N2),
        BTreeMap::from([("10.1.2.1".into(), set(&["svc-a"]))]),
        "the pods the watcher wrote at n2 are nobody's: they go after the bound"
    );
    let bad = spurious(
        &nrp,
        from,
        &[
            (N1, "10.1.1.1", &["svc-a", "eg-1"]),
            (N2, "10.1.2.1", &["svc-a"]),
        ],
    );
    assert!(bad.is_empty(), "still-desired backends removed: {bad:?}");

    // The reverse: the watcher reports every pod again; its resync covers every location, so
    // nothing waits and nothing desired is removed.
    let from = nrp.lock().unwrap().removals.len();
    let mut view = cluster_view();
    view.extend(pods());
    resync(
        &mut writer,
        "watcher",
        watcher_scope(true),
        Some(topology(false)),
        view,
    )
    .await;
    let init = gates(&mut admin).await;
    assert!(init.removals_allowed && init.held.is_empty(), "{init:?}");
    worker.run_until_idle(&nrp, IDLE).await;
    assert_eq!(at(&nrp, N2).len(), 2);
    assert_eq!(at(&nrp, N1).len(), 2);
    assert!(nrp.lock().unwrap().removals[from..].is_empty());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_agent_whose_pods_come_back_is_asked_to_resync_and_loses_nothing() {
    let server = TestServer::start(ServerConfig {
        resync_wait: Duration::from_secs(600),
        ..ServerConfig::default()
    })
    .await;
    let channel = tonic::transport::Endpoint::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut writer = WriterClient::new(channel.clone());
    let mut admin = AdminClient::new(channel);
    let nrp = Arc::new(Mutex::new(FakeNrp::default()));
    let mut worker = TestWorker::connect(&server.url(), "w1", 4).await;

    // Agents own the pods and resynced; then the watcher takes them, then gives them back.
    resync(
        &mut writer,
        "watcher",
        watcher_scope(false),
        Some(topology(true)),
        cluster_view(),
    )
    .await;
    for (agent, l, p) in [
        ("node-agent/n1", N1, ["10.1.1.1", "10.1.1.2"]),
        ("node-agent/n2", N2, ["10.1.2.1", "10.1.2.2"]),
    ] {
        resync(
            &mut writer,
            agent,
            pods_at(l),
            None,
            p.iter().map(|a| pod(a, l)).collect(),
        )
        .await;
    }
    worker.run_until_idle(&nrp, IDLE).await;
    let converged = nrp.lock().unwrap().locations.clone();
    assert_eq!(converged.values().map(|a| a.len()).sum::<usize>(), 4);
    let mut view = cluster_view();
    view.extend(pods());
    resync(
        &mut writer,
        "watcher",
        watcher_scope(true),
        Some(topology(false)),
        view,
    )
    .await;
    resync(
        &mut writer,
        "watcher",
        watcher_scope(false),
        Some(topology(true)),
        cluster_view(),
    )
    .await;
    // The agents' resyncs from before they lost their pods no longer count: the server asks them
    // for a new one (Status lists no completed resync of theirs, which is what a writer checks).
    let s = admin
        .status(StatusRequest::default())
        .await
        .unwrap()
        .into_inner();
    for agent in ["node-agent/n1", "node-agent/n2"] {
        let w = s.writers.iter().find(|w| w.writer == agent).unwrap();
        assert_eq!(w.last_resync_unix_ms, 0, "{w:?}");
    }
    worker.run_until_idle(&nrp, IDLE).await;
    assert_eq!(nrp.lock().unwrap().locations, converged);
    for (agent, l, p) in [
        ("node-agent/n1", N1, ["10.1.1.1", "10.1.1.2"]),
        ("node-agent/n2", N2, ["10.1.2.1", "10.1.2.2"]),
    ] {
        resync(
            &mut writer,
            agent,
            pods_at(l),
            None,
            p.iter().map(|a| pod(a, l)).collect(),
        )
        .await;
    }
    assert!(gates(&mut admin).await.removals_allowed);
    worker.run_until_idle(&nrp, IDLE).await;
    assert_eq!(nrp.lock().unwrap().locations, converged);
    assert!(nrp.lock().unwrap().removals.is_empty());
    server.stop().await;
}
