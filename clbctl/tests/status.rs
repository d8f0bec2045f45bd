//! `clbctl status` rendering and the Admin-based convergence test, against a state server running
//! in-process and on hand-made statuses.

use std::time::Duration;

use clb_embedded::{Cluster, ClusterSpec, Harness, Options, PATIENCE, WriterExt};
use clb_proto::v1::{
    ErrorRecord, GatewayStatus, HeldRemovals, InitGates, RefusedItem, StatusResponse, WorkerStatus,
    WriterStatus,
};
use clbctl::status;

fn init() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_renders_gateways_workers_and_writers() {
    init();
    let h = Harness::start(Options::e2e()).await;
    h.watcher().await.resync_ok(Vec::new()).await;
    let mut text = String::new();
    for _ in 0..500 {
        let s = status::fetch(&h.url()).await.expect("status");
        text = status::render(&s);
        if s.workers.len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(text.contains("gateway default"), "{text}");
    assert!(text.contains("w0"), "{text}");
    assert!(text.contains("watcher"), "{text}");
    assert!(text.contains("programmed (NRP)"), "{text}");
    h.shutdown().await;
}

fn sample_status() -> StatusResponse {
    StatusResponse {
        server_id: "srv-1".into(),
        gateways: vec![GatewayStatus {
            name: "gw-east".into(),
            revision: 42,
            desired_addresses: 10,
            actual_addresses: 8,
            desired_locations: 3,
            actual_locations: 3,
            desired_services: 2,
            actual_services: 2,
            desired_egresses: 1,
            actual_nat_gateways: 0,
            dirty_locations: 1,
            units_in_flight: 2,
            parked_units: 0,
            init: Some(InitGates {
                nrp_observed: true,
                pending_writers: vec!["watcher".into()],
                removals_allowed: false,
                held: vec![HeldRemovals {
                    reason: "pod_writer".into(),
                    writer: "node-agent/n2".into(),
                    locations: 1,
                    addresses: 4,
                    services: 0,
                    deadline_unix_ms: 1_700_000_000_000 + 123_000,
                }],
                ..InitGates::default()
            }),
            last_errors: vec![ErrorRecord {
                at_unix_ms: 1_700_000_000_000,
                work_id: 17,
                code: "TooManyRequests".into(),
                message: "throttled by NRP".into(),
                terminal: false,
                worker_id: "worker-b".into(),
                unit: "locations 10.0.0.7 +2 more".into(),
            }],
            oldest_pending_change_age_ms: 1_500,
            refused: vec![RefusedItem {
                kind: "address".into(),
                location: "10.0.0.7".into(),
                address: "10.1.0.9".into(),
                service_ids: vec!["svc-a".into()],
                code: "BackendPoolAddressesMustHaveSameIpVersion".into(),
                message: "refused by NRP".into(),
                at_unix_ms: 1_700_000_000_000 - 10_000,
                refusals: 2,
                retry_at_unix_ms: 1_700_000_000_000 + 50_000,
            }],
            refused_addresses: 1,
        }],
        workers: vec![WorkerStatus {
            worker_id: "worker-a".into(),
            capacity: 4,
            units_in_flight: 2,
            connected_at_unix_ms: 1_700_000_000_000 - 65_000,
            gateways: Vec::new(),
            last_report_unix_ms: 1_700_000_000_000 - 40_000,
            last_unit_unix_ms: 1_700_000_000_000 - 20_000,
            lease_expiries: 5,
            expiries_since_report: 3,
        }],
        writers: vec![WriterStatus {
            writer: "node-agent/n1".into(),
            last_resync_unix_ms: 0,
            updates_applied: 5,
            items_rejected: 1,
        }],
    }
}

#[test]
fn a_converging_status_shows_its_differences_gates_and_errors() {
    let s = sample_status();
    let g = &s.gateways[0];
    assert!(!status::converged(g));
    assert!(!status::counts_in_sync(g));
    let why = status::not_converged_because(g);
    assert!(why.contains("removals not allowed yet"), "{why}");
    assert!(why.contains("addresses: desired 10, programmed 8"), "{why}");
    assert!(why.contains("egresses: desired 1, programmed 0"), "{why}");
    assert!(why.contains("2 units in flight"), "{why}");
    assert!(
        why.contains("1 addresses held after NRP refused them"),
        "{why}"
    );
    assert!(!why.contains("locations: desired"), "{why}");

    let text = status::render_at(&s, 1_700_000_000_000 + 3_000);
    for want in [
        "server srv-1",
        "gateway gw-east  ·  revision 42  ·  converging",
        "+2",
        "oldest unconfirmed change 1.5 s",
        "pending writers watcher",
        "removals allowed no",
        "removals held back: waiting for node-agent/n2 (pod writer) at 1 location: 4 addresses, 0 \
         services; gives up in 2m 00s",
        "worker-a",
        "1m 08s ago",
        "node-agent/n1",
        "never",
        "2023-11-14 22:13:20",
        "3.0 s ago",
        "TooManyRequests",
        "retryable",
        "throttled by NRP",
        "worker-b",
        "#17 locations 10.0.0.7 +2 more",
        "43.0 s ago",
        "5 (! 3 since report)",
        "worker worker-a: 3 unit leases expired since its last report (43.0 s ago)",
        "held after NRP refused them (1 addresses, 0 locations and services",
        "address 10.1.0.9 at 10.0.0.7",
        "BackendPoolAddressesMustHaveSameIpVersion",
        "13.0 s ago",
        "in 47.0 s",
    ] {
        assert!(text.contains(want), "{want:?} missing in:\n{text}");
    }

    let mut synced = sample_status();
    let g = &mut synced.gateways[0];
    g.actual_addresses = 10;
    g.actual_nat_gateways = 1;
    g.dirty_locations = 0;
    g.units_in_flight = 0;
    g.refused.clear();
    g.refused_addresses = 0;
    g.init = Some(InitGates {
        nrp_observed: true,
        pending_writers: Vec::new(),
        removals_allowed: true,
        ..InitGates::default()
    });
    assert!(status::converged(g));
    assert_eq!(status::not_converged_because(g), "");
    assert!(status::render(&synced).contains("in sync"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wait_converged_follows_the_admin_api() {
    init();
    let h = Harness::start(Options::e2e()).await;
    let client = h.client().await;
    let cluster = Cluster::generate(ClusterSpec::small(6, 4, 5));

    // The expected writer ("watcher") has not resynced: removals are held back, so the gateway
    // cannot be converged, and the error says why.
    client
        .writer("someone-else")
        .apply_ok(cluster.full_view())
        .await;
    let e = status::wait_converged(
        &client,
        Duration::from_millis(300),
        Duration::from_millis(20),
    )
    .await
    .expect_err("gates closed");
    assert!(e.contains("removals not allowed yet"), "{e}");
    assert!(e.contains("pending writers: [\"watcher\"]"), "{e}");

    h.watcher().await.resync_ok(cluster.full_view()).await;
    let g = status::wait_converged(&client, PATIENCE, Duration::from_millis(20))
        .await
        .expect("converges");
    assert!(status::converged(&g));
    assert_eq!(
        g.actual_addresses,
        cluster.expected().addresses.len() as u64
    );
    h.compare(&cluster.expected())
        .expect("NRP agrees with the Admin API");

    let other = client.with_gateway("nope");
    let e = status::wait_converged(&other, PATIENCE, Duration::from_millis(20))
        .await
        .expect_err("unknown gateway");
    assert!(e.contains("no gateway \"nope\""), "{e}");
    h.shutdown().await;
}
