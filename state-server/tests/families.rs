//! IP families over real gRPC on loopback with a scripted worker: the family a writer states for an
//! inbound service reaches the worker in the creation's `ServiceChange.ip_family`; an unknown
//! family value, an endpoint of the other family and a family change are refused with their
//! field, value and reason, changing nothing; a service of no stated family is created as before.

mod support;

use std::time::Duration;

use clb_proto::v1::admin_client::AdminClient;
use clb_proto::v1::writer_client::WriterClient;
use clb_proto::v1::{
    self, ApplyRequest, Endpoint, EndpointSet, EndpointsUpdate, IpFamily, ItemError, ServiceUpdate,
    Update, endpoints_update::Change, report::Outcome, update::Kind, work_unit::Work,
};
use clb_state_server::state::ServerConfig;
use support::worker::{TestServer, TestWorker};
use tonic::transport::Channel;

const ADD: i32 = v1::Operation::Add as i32;

fn service(id: &str, family: i32) -> Update {
    Update {
        kind: Some(Kind::Service(ServiceUpdate {
            operation: ADD,
            service_id: id.into(),
            ports: vec![v1::ServicePort {
                port: 80,
                protocol: v1::Protocol::Tcp as i32,
                target_port: 0,
            }],
            ip_family: family,
            settings: None,
        })),
    }
}

fn level(id: &str, endpoints: &[(&str, &str)]) -> Update {
    Update {
        kind: Some(Kind::Endpoints(EndpointsUpdate {
            service_id: id.into(),
            change: Some(Change::Level(EndpointSet {
                endpoints: endpoints
                    .iter()
                    .map(|(a, l)| Endpoint {
                        address: (*a).into(),
                        location: (*l).into(),
                    })
                    .collect(),
            })),
        })),
    }
}

async fn apply(w: &mut WriterClient<Channel>, updates: Vec<Update>) -> v1::ApplyResponse {
    w.apply(ApplyRequest {
        gateway: String::new(),
        writer: "watcher".into(),
        batch_id: 1,
        dry_run: false,
        updates,
    })
    .await
    .unwrap()
    .into_inner()
}

#[tokio::test]
async fn the_stated_family_reaches_the_creation_and_contradictions_are_refused() {
    let server = TestServer::start(ServerConfig::default()).await;
    let mut writer = WriterClient::connect(server.url()).await.unwrap();
    let r = apply(
        &mut writer,
        vec![
            service("svc", IpFamily::Ipv4 as i32),
            service("svc-v6", IpFamily::Ipv6 as i32),
            service("legacy", IpFamily::Unspecified as i32),
            level("svc", &[("10.1.0.1", "10.0.0.1")]),
            level("svc-v6", &[("fd01::1", "fd00::1")]),
        ],
    )
    .await;
    assert_eq!((r.applied, r.rejected.len()), (5, 0), "{r:?}");
    let revision = r.revision;

    // Each refused, precisely, and nothing applied.
    #[rustfmt::skip]
    let cases: Vec<(Update, &str, &str, &str)> = vec![
        (service("other", 7), "updates[0].service.ip_family", "7", "unknown IP family"),
        (service("svc", IpFamily::Ipv6 as i32), "updates[0].service.ip_family", "IPv6",
         "has an IPv4 frontend; it cannot become IPv6 (a family change is a new service id)"),
        (service("svc-v6", IpFamily::Unspecified as i32), "updates[0].service.ip_family", "",
         "has an IPv6 frontend; it cannot become IPv4"),
        (level("svc-v6", &[("fd01::2", "fd00::1"), ("10.1.0.2", "10.0.0.1")]),
         "updates[0].endpoints.level.endpoints[1].address", "10.1.0.2",
         "is IPv4 but service \"svc-v6\" is IPv6"),
        // Issue 34: a service of no stated family is IPv4; NRP would refuse the mixed pool.
        (level("legacy", &[("10.1.0.3", "10.0.0.1"), ("fd01::3", "fd00::1")]),
         "updates[0].endpoints.level.endpoints[1].address", "fd01::3",
         "is IPv6 but service \"legacy\" is IPv4"),
    ];
    for (update, field, value, reason) in cases {
        let r = apply(&mut writer, vec![update]).await;
        assert_eq!(r.applied, 0, "{field}");
        let [e]: [ItemError; 1] = r.rejected.try_into().unwrap();
        assert_eq!((e.field.as_str(), e.value.as_str()), (field, value));
        assert!(e.reason.contains(reason), "{field}: {}", e.reason);
        assert_eq!(r.revision, revision, "{field}: nothing changed");
    }

    // Admin shows each service's family.
    let mut admin = AdminClient::connect(server.url()).await.unwrap();
    for (id, family) in [
        ("svc", IpFamily::Ipv4),
        ("svc-v6", IpFamily::Ipv6),
        ("legacy", IpFamily::Unspecified),
    ] {
        let st = admin
            .get_service(v1::ServiceQuery {
                gateway: String::new(),
                service_id: id.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(st.ip_family(), family, "{id}");
    }

    // The creations carry the families: IPv4, IPv6, and unspecified (an IPv4 frontend).
    let mut w = TestWorker::connect(&server.url(), "w", 4).await;
    let observe = w.next_unit(Duration::from_secs(10)).await.unwrap();
    assert!(matches!(observe.work, Some(Work::Observe(_))));
    w.report(
        observe.work_id,
        Outcome::Observed(v1::Observed {
            snapshot: Some(v1::NrpSnapshot::default()),
            last: true,
        }),
    )
    .await;
    let u = w.next_unit(Duration::from_secs(10)).await.unwrap();
    let Some(Work::Services(work)) = &u.work else {
        panic!("a services unit: {u:?}");
    };
    let mut got: Vec<(String, IpFamily)> = work
        .changes
        .iter()
        .map(|c| (c.service_id.clone(), c.ip_family()))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("legacy".to_owned(), IpFamily::Unspecified),
            ("svc".to_owned(), IpFamily::Ipv4),
            ("svc-v6".to_owned(), IpFamily::Ipv6),
        ]
    );
}
