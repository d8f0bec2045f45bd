//! The typed client against a real state server over loopback: connection retries, per-item
//! rejections mapped to the caller's positions across chunks (unary batches and one stream), and
//! resync removing what a view no longer holds.

use std::time::Duration;

use clb_client::client::{ApplyOutcome, Client, ClientError, ConnectOptions, scope};
use clb_client::updates::{
    egress_add, endpoint, endpoints_level, pod_add, port, service_add, service_remove,
};
use clb_proto::v1::{Operation, PodUpdate, Protocol, Update, update::Kind};
use clb_tests::{Harness, Options};

fn init() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

#[tokio::test]
async fn connecting_to_a_closed_port_fails_after_the_configured_attempts() {
    init();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let url = format!("http://{addr}");
    let mut options = ConnectOptions::new(url.clone());
    options.attempts = 3;
    options.initial_backoff = Duration::from_millis(5);
    options.connect_timeout = Duration::from_secs(2);
    match Client::connect(options).await {
        Err(ClientError::Connect {
            endpoint, attempts, ..
        }) => {
            assert_eq!(endpoint, url);
            assert_eq!(attempts, 3);
        }
        other => panic!("expected a Connect error, got {other:?}"),
    }
    let bad = Client::connect(ConnectOptions::new("not a url")).await;
    assert!(
        matches!(bad, Err(ClientError::InvalidEndpoint { .. })),
        "{bad:?}"
    );
}

/// Eleven updates named with `tag`; positions 1, 5, 8 and 10 are invalid.
fn mixed(tag: u8) -> Vec<Update> {
    let a = format!("svc-a{tag}");
    let b = format!("svc-b{tag}");
    let ip = |host: u8| format!("10.{tag}.0.{host}");
    let node = |n: u8| format!("10.0.{tag}.{n}");
    vec![
        /* 0 */ service_add(&a, &[port(80, Protocol::Tcp)]),
        /* 1 */ pod_add(&format!("10.{tag}.0.300"), &node(1), "", "ns/bad-ip", ""),
        /* 2 */
        endpoints_level(
            &a,
            vec![endpoint(&ip(1), &node(1)), endpoint(&ip(2), &node(1))],
        ),
        /* 3 */ egress_add(&format!("eg{tag}")),
        /* 4 */ pod_add(&ip(3), &node(2), &format!("eg{tag}"), "ns/p3", "u3"),
        /* 5 */ service_add("", &[]),
        /* 6 */ service_add(&b, &[port(443, Protocol::Tcp)]),
        /* 7 */ endpoints_level(&b, vec![endpoint(&ip(4), &node(2))]),
        /* 8 */ pod_add(&ip(5), "fd00::1", "", "ns/mixed-family", ""),
        /* 9 */
        endpoints_level(
            &b,
            vec![endpoint(&ip(4), &node(2)), endpoint(&ip(6), &node(3))],
        ),
        /* 10 */ endpoints_level(&a, vec![endpoint(&ip(7), "")]),
    ]
}

fn assert_rejections(outcome: &ApplyOutcome) {
    let positions: Vec<usize> = outcome.rejected.iter().map(|r| r.position).collect();
    assert_eq!(positions, [1, 5, 8, 10], "{}", outcome.describe_rejected());
    assert_eq!(outcome.applied, 7);
    let fields: Vec<&str> = outcome
        .rejected
        .iter()
        .map(|r| r.error.field.as_str())
        .collect();
    assert!(fields[0].ends_with(".pod.address"), "{fields:?}");
    assert!(fields[1].ends_with(".service.service_id"), "{fields:?}");
    assert!(fields[2].contains(".pod."), "{fields:?}");
    assert!(
        fields[3].ends_with(".endpoints.level.endpoints[0].location"),
        "{fields:?}"
    );
    assert!(
        outcome.rejected[0].error.value.ends_with(".0.300"),
        "{:?}",
        outcome.rejected[0]
    );
    assert!(outcome.rejected.iter().all(|r| !r.error.reason.is_empty()));
}

/// The valid updates of `mixed(tag)` are in the desired state, the invalid ones changed nothing.
async fn assert_applied(client: &Client, tag: u8) {
    let services = |l: &clb_proto::v1::LocationState, address: &str| -> Vec<String> {
        l.addresses
            .iter()
            .find(|a| a.address == address && a.desired)
            .map(|a| a.desired_service_ids.clone())
            .unwrap_or_else(|| panic!("no desired address {address} in {l:?}"))
    };
    let n1 = client
        .location(&format!("10.0.{tag}.1"))
        .await
        .expect("location 1");
    assert_eq!(
        n1.addresses.iter().filter(|a| a.desired).count(),
        2,
        "the rejected level update (position 10) did not replace svc-a's endpoints: {n1:?}"
    );
    assert_eq!(
        services(&n1, &format!("10.{tag}.0.1")),
        [format!("svc-a{tag}")]
    );
    let n2 = client
        .location(&format!("10.0.{tag}.2"))
        .await
        .expect("location 2");
    assert_eq!(
        services(&n2, &format!("10.{tag}.0.3")),
        [format!("eg{tag}")]
    );
    assert_eq!(
        services(&n2, &format!("10.{tag}.0.4")),
        [format!("svc-b{tag}")]
    );
    let b = client.service(&format!("svc-b{tag}")).await.expect("svc-b");
    assert!(b.desired);
    assert_eq!(b.desired_addresses, 2);
    assert_eq!(b.desired_locations, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apply_maps_rejections_to_positions_across_chunks_and_applies_the_rest() {
    init();
    let h = Harness::start(Options::e2e()).await;
    let client = h.client().await;
    let mut writer = client.writer("client-test").with_chunk(4);
    let outcome = writer.apply(mixed(1)).await.expect("apply");
    assert_eq!(outcome.batches, 3, "11 updates in chunks of 4");
    assert_rejections(&outcome);
    for r in &outcome.rejected {
        // The server's index is relative to its batch; the position is relative to the list.
        assert_eq!(r.error.index as usize, r.position % 4, "{r}");
    }
    assert_applied(&client, 1).await;

    // One update, and a call-level failure: an unknown gateway.
    let one = writer
        .apply_one(service_remove("svc-b1"))
        .await
        .expect("apply one");
    assert_eq!((one.applied, one.batches), (1, 1));
    let e = client
        .with_gateway("no-such-gateway")
        .writer("client-test")
        .apply_one(service_add("svc-x", &[]))
        .await
        .expect_err("unknown gateway");
    assert_eq!(
        e.status().map(tonic::Status::code),
        Some(tonic::Code::NotFound),
        "{e}"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apply_stream_maps_rejections_to_positions_in_the_whole_stream() {
    init();
    let h = Harness::start(Options::e2e()).await;
    let client = h.client().await;
    let mut writer = client.writer("client-test").with_chunk(2);
    let all = mixed(2);
    let batches = vec![all[0..3].to_vec(), all[3..8].to_vec(), all[8..].to_vec()];
    let outcome = writer
        .apply_stream(futures::stream::iter(batches))
        .await
        .expect("apply stream");
    // [3, 5, 3] updates in chunks of at most 2: 2 + 3 + 2 requests.
    assert_eq!(outcome.batches, 7);
    assert_rejections(&outcome);
    assert_applied(&client, 2).await;

    // A second stream on the same writer counts positions from 0 again.
    let again = writer
        .apply_stream(futures::stream::iter(vec![vec![
            egress_add("eg-ok"),
            service_add("", &[]),
        ]]))
        .await
        .expect("second stream");
    assert_eq!(
        again
            .rejected
            .iter()
            .map(|r| r.position)
            .collect::<Vec<_>>(),
        [1]
    );
    h.shutdown().await;
}

fn remove_pod_update(address: &str, location: &str) -> Update {
    Update {
        kind: Some(Kind::Pod(PodUpdate {
            operation: Operation::Remove as i32,
            address: address.into(),
            location: location.into(),
            ..PodUpdate::default()
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resync_removes_what_the_view_no_longer_holds() {
    init();
    let h = Harness::start(Options::e2e()).await;
    let client = h.client().await;
    let mut watcher = client.writer("watcher").with_chunk(2);
    let node = "10.0.7.1";
    let first = vec![
        service_add("svc-keep", &[port(80, Protocol::Tcp)]),
        service_add("svc-gone", &[port(80, Protocol::Tcp)]),
        endpoints_level("svc-keep", vec![endpoint("10.7.0.1", node)]),
        endpoints_level(
            "svc-gone",
            vec![endpoint("10.7.0.1", node), endpoint("10.7.0.2", node)],
        ),
        egress_add("eg-gone"),
    ];
    let r = watcher.resync(scope::all(), first).await.expect("resync 1");
    assert!(r.rejected.is_empty(), "{}", r.describe_rejected());
    assert_eq!(r.applied, 5);
    assert!(client.service("svc-gone").await.expect("svc-gone").desired);

    // The second view drops svc-gone and eg-gone, and carries a removal, which a view may not.
    let second = vec![
        service_add("svc-keep", &[port(80, Protocol::Tcp)]),
        endpoints_level("svc-keep", vec![endpoint("10.7.0.1", node)]),
        remove_pod_update("10.7.0.9", node),
    ];
    let r = watcher
        .resync(scope::all(), second)
        .await
        .expect("resync 2");
    assert_eq!(r.applied, 2);
    assert!(r.removed >= 2, "svc-gone and eg-gone removed: {r:?}");
    assert_eq!(
        r.rejected.iter().map(|x| x.position).collect::<Vec<_>>(),
        [2],
        "the position counts across chunks of 2"
    );
    for gone in ["svc-gone", "eg-gone"] {
        match client.service(gone).await {
            Ok(s) => assert!(!s.desired, "{gone} still desired: {s:?}"),
            Err(e) => assert_eq!(
                e.status().map(tonic::Status::code),
                Some(tonic::Code::NotFound),
                "{e}"
            ),
        }
    }
    let l = client.location(node).await.expect("location");
    let desired: Vec<&str> = l
        .addresses
        .iter()
        .filter(|a| a.desired)
        .map(|a| a.address.as_str())
        .collect();
    assert_eq!(
        desired,
        ["10.7.0.1"],
        "10.7.0.2 only backed svc-gone: {l:?}"
    );
    assert!(client.service("svc-keep").await.expect("svc-keep").desired);

    // A node agent's scope: the pods of one location.
    let mut agent = client.writer("node-agent/n8");
    let at = "10.0.8.1";
    let pods = vec![
        pod_add("10.8.0.1", at, "eg-a", "ns/a", "ua"),
        pod_add("10.8.0.2", at, "eg-a", "ns/b", "ub"),
    ];
    let r = agent
        .resync(scope::pods_at(at), pods)
        .await
        .expect("agent 1");
    assert_eq!((r.applied, r.removed), (2, 0), "{r:?}");
    let r = agent
        .resync(
            scope::pods_at(at),
            vec![pod_add("10.8.0.1", at, "eg-a", "ns/a", "ua")],
        )
        .await
        .expect("agent 2");
    assert_eq!((r.applied, r.removed), (1, 1), "{r:?}");
    let l = client.location(at).await.expect("node agent's location");
    let desired: Vec<&str> = l
        .addresses
        .iter()
        .filter(|a| a.desired)
        .map(|a| a.address.as_str())
        .collect();
    assert_eq!(desired, ["10.8.0.1"]);
    h.shutdown().await;
}
