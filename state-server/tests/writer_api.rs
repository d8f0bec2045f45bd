//! The Writer API over real gRPC on loopback: per-item errors, request-level errors, ordering of
//! `ApplyStream`, and resync semantics (scope replacement, atomicity).

use std::sync::Arc;

use clb_proto::v1::admin_client::AdminClient;
use clb_proto::v1::writer_client::WriterClient;
use clb_proto::v1::writer_server::{Writer, WriterServer};
use clb_proto::v1::{
    self, ApplyRequest, ApplyResponse, DiffQuery, EgressUpdate, EndpointEdge, EndpointSet,
    EndpointsUpdate, ItemError, LocationQuery, PodUpdate, ResyncChunk, ResyncHeader, ResyncRequest,
    ResyncResponse, ResyncScope, ServicePort, ServiceQuery, ServiceUpdate, StatusRequest, Update,
    endpoints_update::Change, resync_request::Part, update::Kind,
};
use clb_state_server::grpc::admin::AdminService;
use clb_state_server::grpc::writer::WriterService;
use clb_state_server::state::{ServerConfig, StateServer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status, Streaming};

const MAX_BATCH: usize = 8;

/// Delegates to [`WriterService`] and reports when a `Resync` handler has ended, whether it
/// returned or was dropped (a cancelled stream), so tests can check the state afterwards without
/// sleeping.
struct Observed {
    inner: WriterService,
    resync_started: mpsc::UnboundedSender<()>,
    resync_ended: mpsc::UnboundedSender<()>,
}

struct EndGuard(mpsc::UnboundedSender<()>);

impl Drop for EndGuard {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

#[tonic::async_trait]
impl Writer for Observed {
    async fn apply(&self, r: Request<ApplyRequest>) -> Result<Response<ApplyResponse>, Status> {
        self.inner.apply(r).await
    }

    type ApplyStreamStream = <WriterService as Writer>::ApplyStreamStream;

    async fn apply_stream(
        &self,
        r: Request<Streaming<ApplyRequest>>,
    ) -> Result<Response<Self::ApplyStreamStream>, Status> {
        self.inner.apply_stream(r).await
    }

    async fn resync(
        &self,
        r: Request<Streaming<ResyncRequest>>,
    ) -> Result<Response<ResyncResponse>, Status> {
        let _guard = EndGuard(self.resync_ended.clone());
        let _ = self.resync_started.send(());
        self.inner.resync(r).await
    }

    type WatchSessionStream = <WriterService as Writer>::WatchSessionStream;

    async fn watch_session(
        &self,
        r: Request<clb_proto::v1::SessionRequest>,
    ) -> Result<Response<Self::WatchSessionStream>, Status> {
        self.inner.watch_session(r).await
    }

    type WatchServicesStream = <WriterService as Writer>::WatchServicesStream;

    async fn watch_services(
        &self,
        r: Request<clb_proto::v1::WatchServicesRequest>,
    ) -> Result<Response<Self::WatchServicesStream>, Status> {
        self.inner.watch_services(r).await
    }

    type WatchLocationsStream = <WriterService as Writer>::WatchLocationsStream;

    async fn watch_locations(
        &self,
        r: Request<clb_proto::v1::LocationsRequest>,
    ) -> Result<Response<Self::WatchLocationsStream>, Status> {
        self.inner.watch_locations(r).await
    }

    type WatchAddressesStream = <WriterService as Writer>::WatchAddressesStream;

    async fn watch_addresses(
        &self,
        r: Request<Streaming<clb_proto::v1::AddressesWatch>>,
    ) -> Result<Response<Self::WatchAddressesStream>, Status> {
        self.inner.watch_addresses(r).await
    }

    async fn service_conditions(
        &self,
        r: Request<clb_proto::v1::ServiceConditionsRequest>,
    ) -> Result<Response<clb_proto::v1::ServiceConditionsResponse>, Status> {
        self.inner.service_conditions(r).await
    }
}

struct Harness {
    writer: WriterClient<Channel>,
    admin: AdminClient<Channel>,
    resync_started: mpsc::UnboundedReceiver<()>,
    resync_ended: mpsc::UnboundedReceiver<()>,
}

async fn start() -> Harness {
    let state = StateServer::new(ServerConfig {
        max_items_per_batch: MAX_BATCH,
        expected_writers: vec!["watcher".into()],
        ..ServerConfig::default()
    });
    let (started, resync_started) = mpsc::unbounded_channel();
    let (ended, resync_ended) = mpsc::unbounded_channel();
    let observed = Observed {
        inner: WriterService::new(Arc::clone(&state)),
        resync_started: started,
        resync_ended: ended,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(WriterServer::new(observed))
            .add_service(AdminService::new(state).into_server())
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Harness {
        writer: WriterClient::new(channel.clone()),
        admin: AdminClient::new(channel),
        resync_started,
        resync_ended,
    }
}

// ---- update builders ----

fn service(op: i32, id: &str) -> Update {
    Update {
        kind: Some(Kind::Service(ServiceUpdate {
            operation: op,
            service_id: id.into(),
            ports: vec![],
            ..Default::default()
        })),
    }
}

fn egress(op: i32, id: &str) -> Update {
    Update {
        kind: Some(Kind::Egress(EgressUpdate {
            operation: op,
            egress_id: id.into(),
        })),
    }
}

fn eps(list: &[(&str, &str)]) -> Vec<v1::Endpoint> {
    list.iter()
        .map(|(a, l)| v1::Endpoint {
            address: (*a).into(),
            location: (*l).into(),
        })
        .collect()
}

fn level(id: &str, list: &[(&str, &str)]) -> Update {
    Update {
        kind: Some(Kind::Endpoints(EndpointsUpdate {
            service_id: id.into(),
            change: Some(Change::Level(EndpointSet {
                endpoints: eps(list),
            })),
        })),
    }
}

fn pod(op: i32, address: &str, location: &str, egress: &str) -> Update {
    Update {
        kind: Some(Kind::Pod(PodUpdate {
            operation: op,
            address: address.into(),
            location: location.into(),
            egress_id: egress.into(),
            pod_key: format!("ns/{address}"),
            pod_uid: format!("uid-{address}"),
            ..Default::default()
        })),
    }
}

const ADD: i32 = v1::Operation::Add as i32;

fn batch(writer: &str, batch_id: u64, updates: Vec<Update>) -> ApplyRequest {
    ApplyRequest {
        gateway: String::new(),
        writer: writer.into(),
        batch_id,
        dry_run: false,
        updates,
    }
}

// ---- state observation ----

/// Everything the desired state shows through Admin (revision, counts, pending diff), without
/// time-dependent fields.
async fn snapshot(h: &mut Harness) -> String {
    let status = h.admin.status(StatusRequest {}).await.unwrap().into_inner();
    let mut g = status.gateways[0].clone();
    g.oldest_pending_change_age_ms = 0;
    let diff = h
        .admin
        .pending_diff(DiffQuery {
            gateway: String::new(),
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner();
    format!("{g:?}\n{diff:?}")
}

/// Services a, b; endpoints of a at node 10.0.0.1 and of b at node 10.0.0.2; pods with egress
/// `eg` at both nodes.
async fn seed(h: &mut Harness) {
    let r = h
        .writer
        .apply(batch(
            "watcher",
            1,
            vec![
                service(ADD, "svc-a"),
                service(ADD, "svc-b"),
                level("svc-a", &[("10.1.1.1", "10.0.0.1")]),
                level("svc-b", &[("10.1.2.1", "10.0.0.2")]),
                pod(ADD, "10.1.1.2", "10.0.0.1", "eg"),
                pod(ADD, "10.1.1.3", "10.0.0.1", "eg"),
                pod(ADD, "10.1.2.2", "10.0.0.2", "eg"),
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.applied, r.rejected.len()), (7, 0), "{:?}", r.rejected);
}

/// The desired addresses of a location as `address=service,service`.
async fn addresses_at(h: &mut Harness, location: &str) -> Vec<String> {
    match h
        .admin
        .get_location(LocationQuery {
            gateway: String::new(),
            location: location.into(),
        })
        .await
    {
        Ok(r) => r
            .into_inner()
            .addresses
            .into_iter()
            .filter(|a| a.desired)
            .map(|a| format!("{}={}", a.address, a.desired_service_ids.join(",")))
            .collect(),
        Err(s) if s.code() == Code::NotFound => Vec::new(),
        Err(s) => panic!("{s}"),
    }
}

async fn service_desired(h: &mut Harness, id: &str) -> bool {
    match h
        .admin
        .get_service(ServiceQuery {
            gateway: String::new(),
            service_id: id.into(),
        })
        .await
    {
        Ok(r) => r.into_inner().desired,
        Err(s) if s.code() == Code::NotFound => false,
        Err(s) => panic!("{s}"),
    }
}

// ---- tests ----

#[tokio::test]
async fn each_bad_update_gets_its_precise_error_and_changes_nothing() {
    let mut h = start().await;
    seed(&mut h).await;
    let edge_empty_location = Update {
        kind: Some(Kind::Endpoints(EndpointsUpdate {
            service_id: "svc-a".into(),
            change: Some(Change::Edge(EndpointEdge {
                old_endpoints: vec![],
                new_endpoints: eps(&[("10.1.1.9", "")]),
            })),
        })),
    };
    let bad_protocol = Update {
        kind: Some(Kind::Service(ServiceUpdate {
            operation: ADD,
            service_id: "svc-new".into(),
            ports: vec![ServicePort {
                port: 80,
                protocol: 42,
                target_port: 0,
            }],
            ..Default::default()
        })),
    };
    // (case, update, field, value, words of the reason)
    #[rustfmt::skip]
    let cases: Vec<(&str, Update, &str, &str, &str)> = vec![
        ("malformed pod IP", pod(ADD, "10.0.0.300", "10.0.0.1", "eg"),
         "updates[0].pod.address", "10.0.0.300", "not an IPv4 or IPv6 address"),
        ("malformed location", level("svc-a", &[("10.1.1.1", "10.0.0.1"), ("10.1.1.8", "node-1")]),
         "updates[0].endpoints.level.endpoints[1].location", "node-1", "not an IPv4 or IPv6 address"),
        ("empty location", edge_empty_location,
         "updates[0].endpoints.edge.new_endpoints[0].location", "", "must not be empty"),
        ("empty service id", service(ADD, ""), "updates[0].service.service_id", "", "must not be empty"),
        ("empty egress id", egress(ADD, ""), "updates[0].egress.egress_id", "", "must not be empty"),
        ("empty endpoints service id", level("", &[]),
         "updates[0].endpoints.service_id", "", "must not be empty"),
        ("unknown operation value", pod(9, "10.1.1.2", "10.0.0.1", ""),
         "updates[0].pod.operation", "9", "unknown operation"),
        ("OPERATION_UNSPECIFIED", service(0, "svc-a"),
         "updates[0].service.operation", "OPERATION_UNSPECIFIED", "unknown operation"),
        ("unknown protocol value", bad_protocol,
         "updates[0].service.ports[0].protocol", "42", "unknown protocol"),
        ("mixed families", pod(ADD, "fd00::7", "10.0.0.1", "eg"),
         "updates[0].pod.address", "fd00::7", "IPv6 but its location 10.0.0.1 is IPv4"),
        ("duplicate endpoints", level("svc-a", &[("10.1.1.1", "10.0.0.1"), ("10.1.1.1", "10.0.0.2")]),
         "updates[0].endpoints.level.endpoints[1].address", "10.1.1.1",
         "appears twice (first at updates[0].endpoints.level.endpoints[0].address)"),
        ("missing kind", Update { kind: None }, "updates[0].kind", "", "no kind set"),
        ("missing change",
         Update { kind: Some(Kind::Endpoints(EndpointsUpdate { service_id: "svc-a".into(), change: None })) },
         "updates[0].endpoints.change", "", "neither level nor edge"),
        ("identity of the other kind", pod(ADD, "10.1.1.2", "10.0.0.1", "SVC-A"),
         "updates[0].pod.egress_id", "SVC-A", "already a inbound identity"),
        ("invalid identity character", egress(ADD, "eg/1"),
         "updates[0].egress.egress_id", "eg/1", "only letters, digits"),
    ];
    for (case, update, field, value, reason) in cases {
        let before = snapshot(&mut h).await;
        let r = h
            .writer
            .apply(batch("watcher", 7, vec![update]))
            .await
            .unwrap_or_else(|s| panic!("{case}: call failed: {s}"))
            .into_inner();
        assert_eq!(r.applied, 0, "{case}");
        assert_eq!(r.batch_id, 7, "{case}");
        let [e]: [ItemError; 1] = r
            .rejected
            .try_into()
            .unwrap_or_else(|v| panic!("{case}: {v:?}"));
        assert_eq!(
            (e.index, e.field.as_str(), e.value.as_str()),
            (0, field, value),
            "{case}"
        );
        assert!(e.reason.contains(reason), "{case}: reason {:?}", e.reason);
        assert_eq!(snapshot(&mut h).await, before, "{case}: state changed");
    }
}

#[tokio::test]
async fn request_level_problems_fail_the_call_and_change_nothing() {
    let mut h = start().await;
    seed(&mut h).await;
    let before = snapshot(&mut h).await;

    // One update more than the limit: none of them (all valid) is applied.
    let oversized: Vec<Update> = (0..=MAX_BATCH)
        .map(|i| service(ADD, &format!("svc-x{i}")))
        .collect();
    let err = h
        .writer
        .apply(batch("watcher", 1, oversized))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().starts_with("updates = "), "{}", err.message());
    assert!(
        err.message().contains(&format!(
            "holds {} updates; at most {MAX_BATCH}",
            MAX_BATCH + 1
        )),
        "{}",
        err.message()
    );

    let err = h
        .writer
        .apply(batch("", 1, vec![service(ADD, "svc-x")]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().starts_with("writer = \"\""),
        "{}",
        err.message()
    );

    let mut other = batch("watcher", 1, vec![service(ADD, "svc-x")]);
    other.gateway = "no-such-gateway".into();
    let err = h.writer.apply(other).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("no-such-gateway"));

    assert_eq!(snapshot(&mut h).await, before);
}

#[tokio::test]
async fn a_mixed_batch_applies_exactly_its_valid_updates() {
    let mut h = start().await;
    let r = h
        .writer
        .apply(batch(
            "watcher",
            42,
            vec![
                service(ADD, "Svc-M"),
                pod(ADD, "10.1.0.1", "10.0.0.999", "eg"),
                level(
                    "svc-m",
                    &[("10.1.0.2", "10.0.0.1"), ("10.1.0.3", "10.0.0.2")],
                ),
                Update { kind: None },
                egress(ADD, "eg-m"),
                service(v1::Operation::Remove as i32, "svc-never-added"),
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.batch_id, 42);
    assert_eq!(r.applied, 4);
    let indices: Vec<u32> = r.rejected.iter().map(|e| e.index).collect();
    assert_eq!(indices, vec![1, 3]);
    assert_eq!(r.rejected[0].field, "updates[1].pod.location");
    assert!(r.revision > 0);

    assert!(service_desired(&mut h, "svc-m").await);
    assert!(service_desired(&mut h, "EG-M").await);
    assert_eq!(
        addresses_at(&mut h, "10.0.0.1").await,
        vec!["10.1.0.2=svc-m"]
    );
    assert_eq!(
        addresses_at(&mut h, "10.0.0.2").await,
        vec!["10.1.0.3=svc-m"]
    );
    let status = h.admin.status(StatusRequest {}).await.unwrap().into_inner();
    // The invalid pod left no trace: the two endpoints are the only addresses.
    assert_eq!(status.gateways[0].desired_addresses, 2);
    let w = status
        .writers
        .iter()
        .find(|w| w.writer == "watcher")
        .unwrap();
    assert_eq!((w.updates_applied, w.items_rejected), (4, 2));
}

#[tokio::test]
async fn a_dry_run_answers_as_the_apply_would_and_changes_nothing() {
    let mut h = start().await;
    seed(&mut h).await;
    let before = snapshot(&mut h).await;
    let updates = vec![
        service(ADD, "svc-n"),
        // Relies on the service added just above, in the same batch.
        level("svc-n", &[("10.1.3.1", "10.0.0.3")]),
        pod(ADD, "10.1.0.1", "10.0.0.999", "eg"),
        service(v1::Operation::Remove as i32, "svc-never-added"),
        service(v1::Operation::Remove as i32, "svc-a"),
    ];
    let mut request = batch("watcher", 7, updates.clone());
    request.dry_run = true;
    let dry = h.writer.apply(request).await.unwrap().into_inner();
    assert_eq!(snapshot(&mut h).await, before, "a dry run changes nothing");
    assert!(!service_desired(&mut h, "svc-n").await);
    assert!(service_desired(&mut h, "svc-a").await);
    let status = h.admin.status(StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(dry.revision, status.gateways[0].revision);

    // The real apply of the same batch answers the same items.
    let real = h
        .writer
        .apply(batch("watcher", 8, updates))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (dry.applied, dry.rejected.len()),
        (4, 1),
        "{:?}",
        dry.rejected
    );
    assert_eq!(dry.applied, real.applied);
    assert_eq!(dry.rejected, real.rejected);
    assert!(real.revision > dry.revision);
    assert!(service_desired(&mut h, "svc-n").await);
}

#[tokio::test]
async fn apply_stream_answers_every_batch_in_order_and_stops_at_a_request_error() {
    let mut h = start().await;
    let mut requests: Vec<ApplyRequest> = (0..20u64)
        .map(|i| {
            let updates = if i % 3 == 0 {
                vec![service(ADD, &format!("svc-{i}")), Update { kind: None }]
            } else {
                vec![service(ADD, &format!("svc-{i}"))]
            };
            batch("watcher", 1000 + i, updates)
        })
        .collect();
    // A request-level error ends the stream; what follows is never answered.
    requests.push(batch("", 5000, vec![service(ADD, "svc-after-error")]));
    requests.push(batch("watcher", 6000, vec![service(ADD, "svc-never")]));
    let mut responses = h
        .writer
        .apply_stream(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    let mut last_revision = 0;
    for i in 0..20u64 {
        let r = responses
            .message()
            .await
            .unwrap()
            .expect("a response per request");
        assert_eq!(r.batch_id, 1000 + i);
        assert_eq!(r.applied, 1);
        assert_eq!(r.rejected.len(), usize::from(i % 3 == 0));
        assert!(r.revision > last_revision, "revisions grow");
        last_revision = r.revision;
    }
    let err = responses.message().await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(service_desired(&mut h, "svc-19").await);
    assert!(!service_desired(&mut h, "svc-after-error").await);
    assert!(!service_desired(&mut h, "svc-never").await);
}

fn header(writer: &str, scope: ResyncScope) -> ResyncRequest {
    ResyncRequest {
        part: Some(Part::Header(ResyncHeader {
            gateway: String::new(),
            writer: writer.into(),
            topology: None,
            resync_sequence: 0,
            scope: Some(scope),
        })),
    }
}

fn node(location: &str) -> ResyncScope {
    ResyncScope {
        pods: true,
        location: location.into(),
        ..ResyncScope::default()
    }
}

async fn resync(h: &mut Harness, requests: Vec<ResyncRequest>) -> ResyncResponse {
    let r = h.writer.resync(tokio_stream::iter(requests)).await;
    r.unwrap().into_inner()
}

fn chunk(updates: Vec<Update>) -> ResyncRequest {
    ResyncRequest {
        part: Some(Part::Chunk(ResyncChunk { updates })),
    }
}

#[tokio::test]
async fn a_resync_removes_exactly_what_the_source_no_longer_reports() {
    let mut h = start().await;
    seed(&mut h).await;

    // The watcher's view of services and endpoints: svc-b is gone, svc-a moved one endpoint.
    let scope = ResyncScope {
        services: true,
        endpoints: true,
        ..ResyncScope::default()
    };
    let view = vec![
        header("watcher", scope),
        chunk(vec![service(ADD, "SVC-A")]),
        chunk(vec![
            level(
                "svc-a",
                &[("10.1.1.1", "10.0.0.1"), ("10.1.1.3", "10.0.0.1")],
            ),
            pod(ADD, "10.1.9.9", "10.0.0.1", "eg"),
        ]),
    ];
    let r = resync(&mut h, view).await;
    assert_eq!((r.applied, r.removed), (2, 1));
    let [e]: [ItemError; 1] = r.rejected.try_into().unwrap();
    assert_eq!((e.index, e.field.as_str()), (2, "updates[2].pod"));
    assert!(e.reason.contains("outside the resync scope"));
    assert!(service_desired(&mut h, "svc-a").await);
    assert!(!service_desired(&mut h, "svc-b").await);
    assert_eq!(
        addresses_at(&mut h, "10.0.0.1").await,
        vec!["10.1.1.1=svc-a", "10.1.1.2=eg", "10.1.1.3=eg,svc-a"]
    );
    // svc-b's endpoint went with it; the pod at that node is outside the scope and stays.
    assert_eq!(addresses_at(&mut h, "10.0.0.2").await, vec!["10.1.2.2=eg"]);

    // The node agent of 10.0.0.1 no longer reports 10.1.1.3: only that pod goes, the other node
    // is untouched, and svc-a keeps the address as an endpoint.
    let view = vec![
        header("node-agent/n1", node("10.0.0.1")),
        chunk(vec![pod(ADD, "10.1.1.2", "10.0.0.1", "eg")]),
    ];
    let r = resync(&mut h, view).await;
    assert_eq!((r.applied, r.removed, r.rejected.len()), (1, 1, 0));
    assert_eq!(
        addresses_at(&mut h, "10.0.0.1").await,
        vec!["10.1.1.1=svc-a", "10.1.1.2=eg", "10.1.1.3=svc-a"]
    );
    assert_eq!(addresses_at(&mut h, "10.0.0.2").await, vec!["10.1.2.2=eg"]);

    // An empty view of a node removes all its pods, still leaving the other node alone.
    let r = resync(&mut h, vec![header("node-agent/n1", node("10.0.0.1"))]).await;
    assert_eq!((r.applied, r.removed), (0, 1));
    assert_eq!(addresses_at(&mut h, "10.0.0.2").await, vec!["10.1.2.2=eg"]);

    let status = h.admin.status(StatusRequest {}).await.unwrap().into_inner();
    assert!(
        status.gateways[0]
            .init
            .as_ref()
            .unwrap()
            .pending_writers
            .is_empty()
    );
    let agent = status
        .writers
        .iter()
        .find(|w| w.writer == "node-agent/n1")
        .unwrap();
    assert!(agent.last_resync_unix_ms > 0);
    assert_eq!(agent.updates_applied, 1);
}

#[tokio::test]
async fn a_resync_that_fails_or_breaks_changes_nothing() {
    let mut h = start().await;
    seed(&mut h).await;
    let before = snapshot(&mut h).await;
    let everything = ResyncScope {
        services: true,
        egresses: true,
        endpoints: true,
        pods: true,
        location: String::new(),
    };

    // Request-level problems: no header, a chunk first, an empty scope, a second header after a
    // chunk, an oversized chunk, an unknown gateway.
    let mut unknown = header("watcher", everything.clone());
    if let Some(Part::Header(h)) = &mut unknown.part {
        h.gateway = "elsewhere".into();
    }
    let oversized: Vec<Update> = (0..=MAX_BATCH)
        .map(|i| service(ADD, &format!("x{i}")))
        .collect();
    let invalid = Code::InvalidArgument;
    #[rustfmt::skip]
    let cases: Vec<(&str, Vec<ResyncRequest>, Code, &str)> = vec![
        ("no header", vec![], invalid, "header = "),
        ("chunk first", vec![chunk(vec![service(ADD, "svc-a")])], invalid, "header = "),
        ("empty scope", vec![header("watcher", ResyncScope::default())], invalid, "header.scope = "),
        ("empty writer", vec![header("", everything.clone())], invalid, "header.writer = "),
        ("second header", vec![header("watcher", everything.clone()), chunk(vec![service(ADD, "svc-a")]),
                               header("watcher", everything.clone())], invalid, "header = "),
        ("oversized chunk", vec![header("watcher", everything.clone()), chunk(oversized)],
         invalid, "chunk[0].updates = "),
        ("unknown gateway", vec![unknown], Code::NotFound, "elsewhere"),
    ];
    for (case, requests, code, message) in cases {
        let err = h
            .writer
            .resync(tokio_stream::iter(requests))
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "{case}: {}", err.message());
        assert!(err.message().contains(message), "{case}: {}", err.message());
        h.resync_started.recv().await.unwrap();
        h.resync_ended.recv().await.unwrap();
        assert_eq!(snapshot(&mut h).await, before, "{case}: state changed");
    }

    // A stream cancelled by its client after a chunk that (completed) would remove almost all.
    // The server has started handling it when it is cancelled; it must not apply the view.
    let (tx, rx) = mpsc::channel(4);
    let mut writer = h.writer.clone();
    let call = tokio::spawn(async move { writer.resync(ReceiverStream::new(rx)).await });
    tx.send(header("watcher", everything)).await.unwrap();
    tx.send(chunk(vec![service(ADD, "svc-a")])).await.unwrap();
    h.resync_started.recv().await.unwrap();
    call.abort();
    let _ = call.await;
    h.resync_ended.recv().await.unwrap();
    drop(tx);
    assert_eq!(
        snapshot(&mut h).await,
        before,
        "a broken stream changed the state"
    );
    let status = h.admin.status(StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(
        status.gateways[0].init.as_ref().unwrap().pending_writers,
        vec!["watcher"]
    );
}

#[tokio::test]
async fn huge_values_come_back_cut_in_item_errors_and_status_messages() {
    const MIB: usize = 1 << 20;
    let mut h = start().await;
    seed(&mut h).await;
    let before = snapshot(&mut h).await;
    let huge = "a".repeat(MIB);
    let cut = format!("{}… (1048576 bytes)", "a".repeat(100));
    let short = |s: &Status| s.message().len() < 300;

    // A 1 MiB gateway name: NOT_FOUND (not RESOURCE_EXHAUSTED), with a short message.
    let mut unknown = batch("watcher", 1, vec![service(ADD, "svc-x")]);
    unknown.gateway = huge.clone();
    let err = h.writer.apply(unknown).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());
    assert!(short(&err), "{} bytes", err.message().len());
    assert!(
        err.message().contains("…\" (1048576 bytes)"),
        "{}",
        err.message()
    );

    // Over-long values of items: each ItemError echoes an excerpt of the value. (One batch
    // each: the pod builder repeats its address in the pod's key and UID.)
    let items = [
        (pod(ADD, &huge, "10.0.0.1", "eg"), "updates[0].pod.address"),
        (service(ADD, &huge), "updates[0].service.service_id"),
        (
            level("svc-a", &[("10.1.1.1", &huge)]),
            "updates[0].endpoints.level.endpoints[0].location",
        ),
    ];
    for (update, field) in items {
        let r = h
            .writer
            .apply(batch("watcher", 2, vec![update]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.applied, 0, "{field}");
        let [e]: [ItemError; 1] = r.rejected.try_into().unwrap();
        assert_eq!((e.field.as_str(), e.value.as_str()), (field, cut.as_str()));
        if field.ends_with(".service_id") {
            assert!(e.reason.contains("1048576 characters long"), "{}", e.reason);
        }
    }

    // A resync's header: a 1 MiB gateway, a 1 MiB location.
    let mut far = header("watcher", node("10.0.0.1"));
    if let Some(Part::Header(hd)) = &mut far.part {
        hd.gateway = huge.clone();
    }
    let err = h
        .writer
        .resync(tokio_stream::iter(vec![far]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());
    assert!(short(&err), "{} bytes", err.message().len());
    let err = h
        .writer
        .resync(tokio_stream::iter(vec![header("watcher", node(&huge))]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(short(&err), "{} bytes", err.message().len());
    assert!(
        err.message().starts_with("header.scope.location = \"aaa"),
        "{}",
        err.message()
    );

    assert_eq!(snapshot(&mut h).await, before);
}
