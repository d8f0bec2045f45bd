//! The Admin API over real gRPC on loopback: status, the state of a location and of a service, and
//! the pending diff reflect what writers applied (and what NRP confirmed).

use std::sync::Arc;

use clb_proto::v1::admin_client::AdminClient;
use clb_proto::v1::writer_client::WriterClient;
use clb_proto::v1::{
    self, ApplyRequest, DiffQuery, EgressUpdate, EndpointSet, EndpointsUpdate, LocationQuery,
    PodUpdate, ResyncChunk, ResyncHeader, ResyncRequest, ResyncScope, ServiceQuery, ServiceUpdate,
    StatusRequest, Update, endpoints_update::Change, resync_request::Part, update::Kind,
};
use clb_state_server::grpc::admin::AdminService;
use clb_state_server::grpc::writer::WriterService;
use clb_state_server::state::{ServerConfig, StateServer};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Code;
use tonic::transport::Channel;

const ADD: i32 = v1::Operation::Add as i32;

struct Harness {
    state: Arc<StateServer>,
    writer: WriterClient<Channel>,
    admin: AdminClient<Channel>,
}

async fn start() -> Harness {
    let state = StateServer::new(ServerConfig {
        server_id: "admin-test".into(),
        gateways: vec!["gw-main".into(), "gw-other".into()],
        expected_writers: vec!["watcher".into(), "node-agent/n1".into()],
        ..ServerConfig::default()
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(WriterService::new(Arc::clone(&state)).into_server())
            .add_service(AdminService::new(Arc::clone(&state)).into_server())
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Harness {
        state,
        writer: WriterClient::new(channel.clone()),
        admin: AdminClient::new(channel),
    }
}

fn service(id: &str) -> Update {
    Update {
        kind: Some(Kind::Service(ServiceUpdate {
            operation: ADD,
            service_id: id.into(),
            ports: vec![],
            ..Default::default()
        })),
    }
}

fn level(id: &str, list: &[(&str, &str)]) -> Update {
    Update {
        kind: Some(Kind::Endpoints(EndpointsUpdate {
            service_id: id.into(),
            change: Some(Change::Level(EndpointSet {
                endpoints: list
                    .iter()
                    .map(|(a, l)| v1::Endpoint {
                        address: (*a).into(),
                        location: (*l).into(),
                    })
                    .collect(),
            })),
        })),
    }
}

fn pod(address: &str, location: &str, egress: &str) -> Update {
    Update {
        kind: Some(Kind::Pod(PodUpdate {
            operation: ADD,
            address: address.into(),
            location: location.into(),
            egress_id: egress.into(),
            pod_key: String::new(),
            pod_uid: String::new(),
            ..Default::default()
        })),
    }
}

/// svc-a with endpoints at one node, svc-b with one, a declared egress and two of its pods (one
/// IPv6, at another node: an IPv6 endpoint of svc-a, a service of no stated family, would be
/// refused).
async fn seed(h: &mut Harness) -> u64 {
    let r = h
        .writer
        .apply(ApplyRequest {
            gateway: "gw-main".into(),
            writer: "watcher".into(),
            batch_id: 1,
            dry_run: false,
            updates: vec![
                service("SVC-A"),
                service("svc-b"),
                level(
                    "svc-a",
                    &[("10.1.0.1", "10.0.0.1"), ("10.1.0.2", "10.0.0.1")],
                ),
                level("svc-b", &[("10.1.0.1", "10.0.0.1")]),
                Update {
                    kind: Some(Kind::Egress(EgressUpdate {
                        operation: ADD,
                        egress_id: "eg".into(),
                    })),
                },
                pod("10.1.0.2", "10.0.0.1", "eg"),
                pod("FD00:0:0::5", "fd00::1", "eg"),
                Update { kind: None },
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.applied, r.rejected.len()), (7, 1));
    r.revision
}

#[tokio::test]
async fn status_reflects_applied_updates_gates_and_writers() {
    let mut h = start().await;
    let revision = seed(&mut h).await;
    let status = h.admin.status(StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(status.server_id, "admin-test");
    assert!(status.workers.is_empty());
    let names: Vec<&str> = status.gateways.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, vec!["gw-main", "gw-other"]);

    let g = &status.gateways[0];
    assert_eq!(g.revision, revision);
    assert_eq!(
        (
            g.desired_services,
            g.desired_egresses,
            g.desired_addresses,
            g.desired_locations
        ),
        (2, 1, 3, 2)
    );
    assert_eq!(
        (g.actual_services, g.actual_addresses, g.actual_locations),
        (0, 0, 0)
    );
    assert_eq!((g.units_in_flight, g.parked_units), (0, 0));
    assert!(g.last_errors.is_empty());
    let init = g.init.as_ref().unwrap();
    assert!(!init.nrp_observed && !init.removals_allowed);
    assert_eq!(init.pending_writers, vec!["watcher", "node-agent/n1"]);

    let other = &status.gateways[1];
    assert_eq!((other.revision, other.desired_addresses), (0, 0));

    // Writers: the one heard from with its counts, the expected one not heard from yet.
    let writers: Vec<(&str, u64, u64, bool)> = status
        .writers
        .iter()
        .map(|w| {
            (
                w.writer.as_str(),
                w.updates_applied,
                w.items_rejected,
                w.last_resync_unix_ms > 0,
            )
        })
        .collect();
    assert_eq!(
        writers,
        vec![("node-agent/n1", 0, 0, false), ("watcher", 7, 1, false)]
    );

    // A completed resync shows up and closes that writer's gate.
    let requests = vec![
        ResyncRequest {
            part: Some(Part::Header(ResyncHeader {
                gateway: "gw-main".into(),
                writer: "node-agent/n1".into(),
                topology: None,
                resync_sequence: 0,
                scope: Some(ResyncScope {
                    pods: true,
                    location: "10.0.0.1".into(),
                    ..ResyncScope::default()
                }),
            })),
        },
        ResyncRequest {
            part: Some(Part::Chunk(ResyncChunk {
                updates: vec![pod("10.1.0.2", "10.0.0.1", "eg")],
            })),
        },
    ];
    let r = h
        .writer
        .resync(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.applied, r.removed), (1, 0));
    let status = h.admin.status(StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(
        status.gateways[0].init.as_ref().unwrap().pending_writers,
        vec!["watcher"]
    );
    let agent = status
        .writers
        .iter()
        .find(|w| w.writer == "node-agent/n1")
        .unwrap();
    assert!(agent.last_resync_unix_ms > 0);
}

#[tokio::test]
async fn get_location_shows_both_sides_in_canonical_form() {
    let mut h = start().await;
    seed(&mut h).await;
    let loc = h
        .admin
        .get_location(LocationQuery {
            gateway: "gw-main".into(),
            location: "::ffff:10.0.0.1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (loc.gateway.as_str(), loc.location.as_str()),
        ("gw-main", "10.0.0.1")
    );
    assert!(loc.desired && !loc.actual);
    let addresses: Vec<(&str, Vec<&str>, bool)> = loc
        .addresses
        .iter()
        .map(|a| {
            (
                a.address.as_str(),
                a.desired_service_ids.iter().map(String::as_str).collect(),
                a.actual,
            )
        })
        .collect();
    assert_eq!(
        addresses,
        vec![
            ("10.1.0.1", vec!["svc-a", "svc-b"], false),
            ("10.1.0.2", vec!["eg", "svc-a"], false),
        ]
    );

    let v6 = h
        .admin
        .get_location(LocationQuery {
            gateway: "gw-main".into(),
            location: "FD00:0::1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v6.location, "fd00::1");
    assert_eq!(v6.addresses[0].address, "fd00::5");

    let err = h
        .admin
        .get_location(LocationQuery {
            gateway: "gw-main".into(),
            location: "10.0.0.256".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("location = \"10.0.0.256\""),
        "{}",
        err.message()
    );

    for (gateway, location, code) in [
        ("gw-main", "10.0.0.77", Code::NotFound),
        ("gw-other", "10.0.0.1", Code::NotFound),
        ("gw-none", "10.0.0.1", Code::NotFound),
    ] {
        let err = h
            .admin
            .get_location(LocationQuery {
                gateway: gateway.into(),
                location: location.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "{gateway} {location}");
    }
}

#[tokio::test]
async fn get_service_counts_desired_and_actual_references() {
    let mut h = start().await;
    seed(&mut h).await;
    let query = |id: &str| ServiceQuery {
        gateway: "gw-main".into(),
        service_id: id.into(),
    };
    let a = h
        .admin
        .get_service(query("Svc-A"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(a.service_id, "svc-a");
    assert_eq!(a.kind, v1::ServiceKind::Inbound as i32);
    assert!(a.desired && !a.actual);
    assert_eq!((a.desired_addresses, a.desired_locations), (2, 1));
    assert_eq!((a.actual_addresses, a.actual_locations), (0, 0));

    let eg = h.admin.get_service(query("eg")).await.unwrap().into_inner();
    assert_eq!(eg.kind, v1::ServiceKind::Outbound as i32);
    assert_eq!((eg.desired_addresses, eg.desired_locations), (2, 2));

    // NRP confirms svc-a and location 10.0.0.1 (as a worker's report would record it).
    {
        let handle = h.state.gateway("gw-main").unwrap();
        let mut g = handle.lock();
        let diff = g.tracker().pending_diff();
        for s in &diff.services {
            g.tracker_mut().record_service_applied(s).unwrap();
        }
        let diff = g.tracker().pending_diff();
        let loc = diff
            .locations
            .iter()
            .find(|l| l.location.to_string() == "10.0.0.1")
            .unwrap();
        g.tracker_mut().record_location_applied(loc).unwrap();
    }
    let a = h
        .admin
        .get_service(query("svc-a"))
        .await
        .unwrap()
        .into_inner();
    assert!(a.desired && a.actual);
    assert_eq!((a.actual_addresses, a.actual_locations), (2, 1));

    let err = h.admin.get_service(query("unknown")).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = h.admin.get_service(query("")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("id = \"\""), "{}", err.message());
    let err = h
        .admin
        .get_service(ServiceQuery {
            gateway: "gw-none".into(),
            service_id: "svc-a".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn pending_diff_lists_what_would_be_sent_within_the_limit() {
    let mut h = start().await;
    let revision = seed(&mut h).await;
    let diff = |limit: u32| DiffQuery {
        gateway: "gw-main".into(),
        limit,
    };
    // Nothing is in NRP yet: the services must be created first, so no address is sendable.
    let d = h.admin.pending_diff(diff(0)).await.unwrap().into_inner();
    assert_eq!(
        (d.gateway.as_str(), d.revision, d.truncated),
        ("gw-main", revision, false)
    );
    let services: Vec<(&str, i32, i32)> = d
        .services
        .iter()
        .map(|s| (s.service_id.as_str(), s.kind, s.action))
        .collect();
    let (inbound, outbound, create) = (
        v1::ServiceKind::Inbound as i32,
        v1::ServiceKind::Outbound as i32,
        v1::ServiceAction::Create as i32,
    );
    assert_eq!(
        services,
        vec![
            ("eg", outbound, create),
            ("svc-a", inbound, create),
            ("svc-b", inbound, create)
        ]
    );
    assert!(d.locations.is_empty());

    let d = h.admin.pending_diff(diff(2)).await.unwrap().into_inner();
    assert_eq!(d.services.len(), 2);
    assert!(d.truncated);

    // Once NRP has the services, both locations are due; while the initialization gates are
    // closed they go as partial updates, which remove nothing.
    {
        let handle = h.state.gateway("gw-main").unwrap();
        let mut g = handle.lock();
        for s in g.tracker().pending_diff().services {
            g.tracker_mut().record_service_applied(&s).unwrap();
        }
    }
    let d = h.admin.pending_diff(diff(0)).await.unwrap().into_inner();
    assert!(d.services.is_empty());
    let locations: Vec<(&str, i32, usize)> = d
        .locations
        .iter()
        .map(|l| (l.location.as_str(), l.action, l.addresses.len()))
        .collect();
    let partial = v1::AddressUpdateAction::PartialUpdate as i32;
    assert_eq!(
        locations,
        vec![("10.0.0.1", partial, 2), ("fd00::1", partial, 1)]
    );
    assert_eq!(d.locations[0].addresses[1].service_ids, vec!["eg", "svc-a"]);

    let d = h.admin.pending_diff(diff(1)).await.unwrap().into_inner();
    assert_eq!((d.locations.len(), d.truncated), (1, true));

    let err = h
        .admin
        .pending_diff(DiffQuery {
            gateway: "gw-none".into(),
            limit: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

fn service_with_ports(id: &str, ports: &[u32]) -> Update {
    Update {
        kind: Some(Kind::Service(ServiceUpdate {
            operation: ADD,
            service_id: id.into(),
            ports: ports
                .iter()
                .map(|&port| v1::ServicePort {
                    port,
                    protocol: v1::Protocol::Tcp as i32,
                    target_port: 0,
                })
                .collect(),
            ..Default::default()
        })),
    }
}

fn port_numbers(s: &v1::ServiceState) -> Vec<u32> {
    s.ports.iter().map(|p| p.port).collect()
}

#[tokio::test]
async fn the_ports_of_a_service_that_stops_being_desired_are_forgotten() {
    let mut h = start().await;
    let r = h
        .writer
        .apply(ApplyRequest {
            gateway: "gw-main".into(),
            writer: "watcher".into(),
            batch_id: 1,
            dry_run: false,
            updates: vec![
                service_with_ports("svc-p", &[80]),
                service_with_ports("svc-q", &[443]),
                service_with_ports("svc-r", &[8080]),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.applied, r.rejected.len()), (3, 0), "{:?}", r.rejected);
    // NRP has svc-p and svc-q (as a worker's report would record it); svc-r only is desired.
    {
        let handle = h.state.gateway("gw-main").unwrap();
        let mut g = handle.lock();
        for s in g.tracker().pending_diff().services {
            if s.name != "svc-r" {
                g.tracker_mut().record_service_applied(&s).unwrap();
            }
        }
    }
    let query = |id: &str| ServiceQuery {
        gateway: "gw-main".into(),
        service_id: id.into(),
    };
    let p = h
        .admin
        .get_service(query("svc-p"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(port_numbers(&p), [80]);

    // The watcher resyncs its services: svc-p and svc-r are no longer in its view.
    let requests = vec![
        ResyncRequest {
            part: Some(Part::Header(ResyncHeader {
                gateway: "gw-main".into(),
                writer: "watcher".into(),
                topology: None,
                resync_sequence: 0,
                scope: Some(ResyncScope {
                    services: true,
                    ..ResyncScope::default()
                }),
            })),
        },
        ResyncRequest {
            part: Some(Part::Chunk(ResyncChunk {
                updates: vec![service_with_ports("svc-q", &[443])],
            })),
        },
    ];
    let r = h
        .writer
        .resync(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.applied, r.removed), (1, 2));
    // svc-p: still in NRP until it is deleted, no longer desired, and without stale ports.
    let p = h
        .admin
        .get_service(query("svc-p"))
        .await
        .unwrap()
        .into_inner();
    assert!(!p.desired && p.actual);
    assert!(p.ports.is_empty(), "stale ports: {:?}", p.ports);
    // svc-r: in NRP never, desired no more: unknown, and nothing of it is kept.
    let err = h.admin.get_service(query("svc-r")).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(
        h.state
            .gateway("gw-main")
            .unwrap()
            .lock()
            .service_ports("svc-r")
            .is_none()
    );
    let q = h
        .admin
        .get_service(query("svc-q"))
        .await
        .unwrap()
        .into_inner();
    assert!(q.desired);
    assert_eq!(port_numbers(&q), [443]);

    // Removed by Apply: the same.
    let r = h
        .writer
        .apply(ApplyRequest {
            gateway: "gw-main".into(),
            writer: "watcher".into(),
            batch_id: 2,
            dry_run: false,
            updates: vec![Update {
                kind: Some(Kind::Service(ServiceUpdate {
                    operation: v1::Operation::Remove as i32,
                    service_id: "SVC-Q".into(),
                    ports: vec![],
                    ..Default::default()
                })),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.applied, 1);
    let q = h
        .admin
        .get_service(query("svc-q"))
        .await
        .unwrap()
        .into_inner();
    assert!(!q.desired && q.actual);
    assert!(q.ports.is_empty(), "stale ports: {:?}", q.ports);
}

#[tokio::test]
async fn a_huge_gateway_name_or_value_gets_its_proper_code_and_a_short_message() {
    let mut h = start().await;
    seed(&mut h).await;
    let huge = "g".repeat(1 << 20);
    let check = |err: tonic::Status, code: Code| {
        assert_eq!(err.code(), code, "{}", err.message());
        assert!(err.message().len() < 300, "{} bytes", err.message().len());
        assert!(
            err.message().contains("…\" (1048576 bytes)"),
            "{}",
            err.message()
        );
    };
    let err = h
        .admin
        .get_service(ServiceQuery {
            gateway: huge.clone(),
            service_id: "svc-a".into(),
        })
        .await
        .unwrap_err();
    check(err, Code::NotFound);
    let err = h
        .admin
        .get_location(LocationQuery {
            gateway: huge.clone(),
            location: "10.0.0.1".into(),
        })
        .await
        .unwrap_err();
    check(err, Code::NotFound);
    let err = h
        .admin
        .pending_diff(DiffQuery {
            gateway: huge.clone(),
            limit: 0,
        })
        .await
        .unwrap_err();
    check(err, Code::NotFound);
    // Huge values of a known gateway: INVALID_ARGUMENT, also short.
    let err = h
        .admin
        .get_service(ServiceQuery {
            gateway: "gw-main".into(),
            service_id: huge.clone(),
        })
        .await
        .unwrap_err();
    check(err, Code::InvalidArgument);
    let err = h
        .admin
        .get_location(LocationQuery {
            gateway: "gw-main".into(),
            location: huge,
        })
        .await
        .unwrap_err();
    check(err, Code::InvalidArgument);
}

/// Issue 33: a service's load balancer settings, as the server holds them, are in its state.
#[tokio::test]
async fn get_service_shows_the_settings_of_its_load_balancer() {
    let mut h = start().await;
    let settings = v1::LoadBalancerSettings {
        idle_timeout_minutes: 15,
        load_distribution: v1::LoadDistribution::SourceIp as i32,
        dns_label: "shop".into(),
        ..Default::default()
    };
    let r = h
        .writer
        .apply(ApplyRequest {
            gateway: "gw-main".into(),
            writer: "watcher".into(),
            batch_id: 1,
            dry_run: false,
            updates: vec![
                Update {
                    kind: Some(Kind::Service(ServiceUpdate {
                        operation: ADD,
                        service_id: "tuned".into(),
                        settings: Some(settings.clone()),
                        ..Default::default()
                    })),
                },
                service("plain"),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.applied, r.rejected.len()), (2, 0), "{r:?}");
    let query = |id: &str| v1::ServiceQuery {
        gateway: "gw-main".into(),
        service_id: id.into(),
    };
    let tuned = h
        .admin
        .get_service(query("tuned"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(tuned.settings, Some(settings));
    let plain = h
        .admin
        .get_service(query("plain"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(plain.settings, Some(v1::LoadBalancerSettings::default()));
}
