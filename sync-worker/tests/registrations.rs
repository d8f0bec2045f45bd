//! The registrations of a service unit in one `updateServices` call (issue 36), and the unit's bound
//! on its calls side by side, against the NRP emulator through the real worker (see `worker.rs`).

#[path = "worker/harness.rs"]
mod harness;

use clb_nrp_emulator::EmulatorConfig;
use clb_proto::v1::{self, ServiceWork, work_unit};
use clb_sync_worker::worker::Limits;
use harness::*;

const UPDATE_SERVICES: &str = "ServiceGateways_UpdateServices";

fn changes(action: v1::ServiceAction) -> Vec<v1::ServiceChange> {
    let mut all: Vec<_> = (0..6)
        .map(|i| inbound(&format!("svc-{i}"), action))
        .collect();
    all.extend((0..2).map(|i| outbound(&format!("egress-{i}"), action)));
    all
}

fn unit_of(work_id: u64, changes: Vec<v1::ServiceChange>, side_by_side: u32) -> v1::WorkUnit {
    unit(
        work_id,
        work_unit::Work::Services(ServiceWork {
            changes,
            side_by_side,
        }),
    )
}

fn registered(h: &Harness) -> usize {
    h.emulator()
        .dump()
        .gateway(GW)
        .map_or(0, |g| g.services.len())
}

#[tokio::test]
async fn the_creations_and_deletions_of_a_unit_register_in_one_update_services_call() {
    let mut h = Harness::default().await;
    let mut conn = h.conn().await;
    assert_applied(&conn.run(services(1, changes(Create))).await);
    let stats = h.emulator().stats();
    assert_eq!(stats.calls_of(UPDATE_SERVICES), 1, "{stats:?}");
    assert_eq!(registered(&h), 8);
    // Per service: a public IP and a load balancer or NAT gateway; one registration call in all.
    assert_eq!(stats.mutating_calls, 8 * 2 + 1, "{stats:?}");

    h.emulator().reset_stats();
    assert_applied(&conn.run(services(2, changes(Delete))).await);
    let stats = h.emulator().stats();
    assert_eq!(stats.calls_of(UPDATE_SERVICES), 1, "{stats:?}");
    assert_eq!(registered(&h), 0);
    let dump = h.emulator().dump();
    assert!(dump.load_balancers.is_empty() && dump.nat_gateways.is_empty());
    assert!(dump.public_ip_addresses.is_empty());
    h.shutdown().await;
}

#[tokio::test]
async fn a_unit_runs_at_most_side_by_side_calls_at_once() {
    let emulator = EmulatorConfig {
        // Long enough calls that the sagas would overlap if nothing held them back.
        latency_ms: 20,
        ..EmulatorConfig::default()
    };
    let limits = Limits {
        max_concurrent_mutations_per_gateway: 8,
        ..Limits::default()
    };
    let mut h = Harness::start(emulator, limits).await;
    let mut conn = h.conn().await;
    assert_applied(&conn.run(unit_of(1, changes(Create), 2)).await);
    let stats = h.emulator().stats();
    assert!(
        stats.max_concurrent_mutations <= 2,
        "at most 2 side by side: {stats:?}"
    );
    assert_eq!(stats.calls_of(UPDATE_SERVICES), 1);
    assert_eq!(registered(&h), 8);
    h.shutdown().await;
}
