//! The sync worker end to end over loopback: a scripted fake state server (the `Worker` gRPC service,
//! implemented here) hands units to the real worker, which executes them against the real NRP emulator
//! through the ARM client. Every server binds port 0; nothing depends on timing.

#[path = "worker/harness.rs"]
mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use clb_nrp::azure::{ArmClient, ArmConfig};
use clb_nrp::wire::PublicIpAddress;
use clb_nrp::{CallOptions, Nrp};
use clb_nrp_emulator::EmulatorConfig;
use clb_proto::v1::{self, NrpSnapshot, ObserveWork, report, work_unit};
use clb_sync_worker::worker::Limits;
use harness::*;
use tokio::sync::Semaphore;

// ---- tests ----------------------------------------------------------------------------------------

#[tokio::test]
async fn a_service_unit_creates_and_registers_inbound_and_outbound_services() {
    let mut h = Harness::default().await;
    let mut conn = h.conn().await;
    assert_eq!(conn.hello.worker_id, "worker-under-test");
    assert_eq!(conn.hello.capacity, 3);
    create_services(&mut conn).await;

    let dump = h.emulator().dump();
    let gw = dump.gateway(GW).expect("the worker ensured the gateway");
    let svcs: BTreeMap<_, _> = gw.services.iter().map(|s| (s.name.as_str(), s)).collect();
    assert_eq!(
        svcs.keys().copied().collect::<Vec<_>>(),
        ["egress-e", "svc-a"]
    );
    assert!(svcs["svc-a"].service_type.is_inbound());
    assert!(
        svcs["svc-a"].backend_pools[0].contains("/loadBalancers/lb-svc-a/backendAddressPools/")
    );
    assert!(svcs["egress-e"].service_type.is_outbound());
    assert!(
        svcs["egress-e"]
            .nat_gateway_id
            .as_deref()
            .unwrap()
            .ends_with("/natGateways/natgw-egress-e")
    );
    let lb = &dump.load_balancers[0];
    assert_eq!(lb.name.as_deref(), Some("lb-svc-a"));
    assert_eq!(
        lb.properties.load_balancing_rules.len(),
        2,
        "one rule per port/protocol"
    );
    let pips: BTreeSet<_> = dump
        .public_ip_addresses
        .iter()
        .filter_map(|p| p.name.clone())
        .collect();
    assert_eq!(
        pips,
        BTreeSet::from(["pip-egress-e".to_string(), "pip-svc-a".to_string()])
    );
    assert_eq!(dump.nat_gateways.len(), 1);

    // The sagas are idempotent: running the same unit again changes nothing and succeeds.
    assert_applied(&conn.run(services(2, vec![inbound("svc-a", Create)])).await);
    assert_eq!(h.emulator().dump().load_balancers.len(), 1);
    h.shutdown().await;
}

#[tokio::test]
async fn a_location_unit_is_one_update_address_locations_call() {
    let mut h = Harness::default().await;
    let mut conn = h.conn().await;
    create_services(&mut conn).await;
    h.emulator().reset_stats();
    assert_applied(&conn.run(locations(2, three_locations())).await);

    let stats = h.emulator().stats();
    assert_eq!(stats.calls_of("ServiceGateways_UpdateAddressLocations"), 1);
    assert_eq!(stats.locations_carried, 3);
    assert_eq!(stats.addresses_carried, 4);
    let map = h.address_map();
    let refs = |l: &str, a: &str| map.get(&(l.to_string(), a.to_string())).cloned();
    assert_eq!(
        refs("10.0.0.1", "10.1.0.1"),
        Some(BTreeSet::from(["egress-e".into(), "svc-a".into()]))
    );
    assert_eq!(
        refs("10.0.0.2", "10.1.0.3"),
        Some(BTreeSet::from(["svc-a".into()]))
    );
    assert_eq!(map.len(), 4);
    h.shutdown().await;
}

#[tokio::test]
async fn a_unit_whose_lease_has_expired_makes_no_nrp_call() {
    let mut h = Harness::default().await;
    let mut conn = h.conn().await;
    let mut expired = services(1, vec![inbound("svc-a", Create)]);
    expired.lease_deadline_unix_ms = now_ms() - 1_000;
    let r = conn.run(expired).await;
    assert_eq!(repair(&r).code, "LeaseExpired");
    assert!(r.applied_indices.is_empty());
    assert_eq!(h.emulator().stats().calls, 0, "no NRP call after the lease");
    h.shutdown().await;
}

#[tokio::test]
async fn no_call_starts_after_the_lease_ends_even_once_the_unit_has_begun() {
    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
    let release = Arc::new(Semaphore::new(0));
    let gate = Arc::clone(&release);
    let mut h = Harness::start_with(EmulatorConfig::default(), Limits::default(), move |inner| {
        Arc::new(GatedNrp {
            inner,
            entered: entered_tx,
            release: gate,
        })
    })
    .await;
    let mut conn = h.conn().await;
    let mut short = locations(1, vec![location("10.0.0.1", true, &[])]);
    short.lease_duration_ms = 100;
    conn.send(short).await;
    entered.recv().await.expect("the unit reached its call");
    // Hold the call past the lease (measured from receipt, before the call was entered).
    tokio::time::sleep(Duration::from_millis(200)).await;
    release.add_permits(1);
    let r = conn.report().await;
    // A call cut off by the lease may or may not have landed: the server reads NRP back.
    assert_eq!(repair(&r).code, "LeaseExpired");
    assert!(r.applied_indices.is_empty());
    let stats = h.emulator().stats();
    assert_eq!(
        stats.calls, 0,
        "the client refused the call after the lease"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn invalid_requests_are_terminal_drift_is_repaired_and_throttling_is_retryable_with_retry_after()
 {
    let mut h = Harness::default().await;
    let mut conn = h.conn().await;
    let r = conn
        .run(locations(
            1,
            vec![location("10.0.0.1", true, &[("10.1.0.1", &["nobody"])])],
        ))
        .await;
    let x = repair(&r);
    assert_eq!(x.code, "ServiceNotRegistered", "{x:?}");
    assert!(r.applied_indices.is_empty());
    let r = conn
        .run(locations(
            2,
            vec![location("10.0.0.1", true, &[("2001:db8::1", &["nobody"])])],
        ))
        .await;
    let t = terminal(&r);
    assert_eq!(t.code, "AddressFamilyMismatch", "{t:?}");

    h.emulator()
        .set_config(EmulatorConfig {
            fault_rate_429: 1.0,
            retry_after_secs: 3,
            seed: Some(1),
            ..Default::default()
        })
        .unwrap();
    let r = conn
        .run(locations(3, vec![location("10.0.0.1", true, &[])]))
        .await;
    let x = retryable(&r);
    assert_eq!(x.retry_after_ms, 3_000, "{x:?}");
    assert!(!x.code.is_empty());
    h.shutdown().await;
}

#[tokio::test]
async fn reports_carry_the_remaining_writes_of_the_gateways_subscription() {
    // Without a write budget NRP sends no figure, and reports carry none.
    let mut h = Harness::default().await;
    let mut conn = h.conn().await;
    let r = conn
        .run(services(
            1,
            vec![inbound("svc-a", Create), outbound("egress-e", Create)],
        ))
        .await;
    assert_applied(&r);
    assert_eq!(r.remaining_subscription_writes, None);
    h.shutdown().await;

    // With one (nothing refills during the test), each report carries what the last write left.
    let mut h = Harness::start(
        EmulatorConfig {
            write_bucket_size: Some(1000),
            write_refill_per_sec: 0.001,
            ..Default::default()
        },
        Limits::default(),
    )
    .await;
    let mut conn = h.conn().await;
    let r = conn
        .run(services(
            1,
            vec![inbound("svc-a", Create), outbound("egress-e", Create)],
        ))
        .await;
    assert_applied(&r);
    // The harness's PUT of the gateway, then the unit's writes (the counters start after the PUT).
    let spent = 1 + h.emulator().stats().mutating_calls as u32;
    assert!(spent > 1);
    assert_eq!(r.remaining_subscription_writes, Some(1000 - spent));
    let r = conn.run(locations(2, three_locations())).await;
    assert_applied(&r);
    assert_eq!(r.remaining_subscription_writes, Some(999 - spent));
    // An observe only reads: it carries no figure (the last one, left by earlier writes, could
    // be stale by then).
    let r = conn
        .run(unit(9, work_unit::Work::Observe(ObserveWork {})))
        .await;
    assert_eq!(r.remaining_subscription_writes, None, "{r:?}");

    // A spent budget: the unit is retryable after the Retry-After, and the report says 0.
    h.emulator()
        .set_config(EmulatorConfig {
            write_bucket_size: Some(1),
            write_refill_per_sec: 0.001,
            ..Default::default()
        })
        .unwrap();
    let r = conn
        .run(locations(3, vec![location("10.0.0.1", true, &[])]))
        .await;
    assert_applied(&r);
    assert_eq!(r.remaining_subscription_writes, Some(0));
    let r = conn
        .run(locations(4, vec![location("10.0.0.2", true, &[])]))
        .await;
    let x = retryable(&r);
    assert_eq!(x.code, "SubscriptionRequestsThrottled", "{x:?}");
    assert_eq!(x.retry_after_ms, 1_000_000, "one write per 1000 s");
    assert_eq!(r.remaining_subscription_writes, Some(0));
    assert_eq!(h.emulator().stats().throttled_by_write_budget, 1);
    h.shutdown().await;
}

#[tokio::test]
async fn observe_reports_what_nrp_holds_in_parts() {
    let limits = Limits {
        max_addresses_per_report: 2,
        ..Limits::default()
    };
    let mut h = Harness::start(EmulatorConfig::default(), limits).await;
    let mut conn = h.conn().await;
    create_services(&mut conn).await;
    assert_applied(&conn.run(locations(2, three_locations())).await);

    conn.send(unit(3, work_unit::Work::Observe(ObserveWork {})))
        .await;
    let mut merged = NrpSnapshot::default();
    let mut parts = 0;
    loop {
        let r = conn.report().await;
        assert_eq!(r.work_id, 3);
        let Some(report::Outcome::Observed(o)) = r.outcome else {
            panic!("expected observed, got {r:?}")
        };
        parts += 1;
        let s = o.snapshot.unwrap();
        merged.load_balancers.extend(s.load_balancers);
        merged.nat_gateways.extend(s.nat_gateways);
        merged.locations.extend(s.locations);
        merged.frontends.extend(s.frontends);
        if o.last {
            break;
        }
    }
    assert!(parts >= 2, "split at 2 addresses per part: {parts}");
    assert_eq!(merged.load_balancers, ["svc-a"]);
    assert_eq!(merged.nat_gateways, ["egress-e"]);
    // The inbound service's frontend (its public IP's address), not the egress's.
    assert_eq!(
        frontends(&merged.frontends),
        BTreeMap::from([("svc-a".to_string(), pip_address(&h, "pip-svc-a"))])
    );
    let mut observed = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for l in &merged.locations {
        assert!(
            seen.insert(l.location.clone()),
            "a location in one part only"
        );
        assert_eq!(l.action(), v1::AddressUpdateAction::FullUpdate);
        for a in &l.addresses {
            let refs: BTreeSet<String> = a.service_ids.iter().cloned().collect();
            observed.insert((l.location.clone(), a.address.clone()), refs);
        }
    }
    assert_eq!(observed, h.address_map());
    h.shutdown().await;
}

/// Frontends as `service → IP`, checking that no service is listed twice.
fn frontends(list: &[v1::ServiceFrontend]) -> BTreeMap<String, String> {
    let map: BTreeMap<String, String> = list
        .iter()
        .map(|f| (f.service_id.clone(), f.ip.clone()))
        .collect();
    assert_eq!(map.len(), list.len(), "a service listed twice: {list:?}");
    map
}

/// The address the emulator allocated to the public IP `name`.
fn pip_address(h: &Harness, name: &str) -> String {
    h.emulator()
        .dump()
        .public_ip_addresses
        .iter()
        .find(|p| p.name.as_deref() == Some(name))
        .and_then(|p| p.properties.ip_address.clone())
        .unwrap_or_else(|| panic!("public IP {name} with an address"))
}

async fn create_reports_carry_frontends(emulator: EmulatorConfig) {
    let mut h = Harness::start(emulator, Limits::default()).await;
    let mut conn = h.conn().await;
    let r = conn
        .run(services(
            1,
            vec![
                inbound("svc-a", Create),
                outbound("egress-e", Create),
                inbound("svc-b", Create),
            ],
        ))
        .await;
    assert_applied(&r);
    let (a, b) = (pip_address(&h, "pip-svc-a"), pip_address(&h, "pip-svc-b"));
    assert_ne!(a, b);
    assert_eq!(
        frontends(&r.frontends),
        BTreeMap::from([("svc-a".to_string(), a.clone()), ("svc-b".to_string(), b)])
    );

    // Running the creation again (as after a ports change) keeps the address.
    let r = conn.run(services(2, vec![inbound("svc-a", Create)])).await;
    assert_applied(&r);
    assert_eq!(
        frontends(&r.frontends),
        BTreeMap::from([("svc-a".to_string(), a)])
    );

    // A unit that only partly went through carries the frontends of what did.
    let broken = service(
        "svc-x",
        v1::ServiceKind::Inbound,
        Create,
        &[(80, v1::Protocol::Unspecified)],
    );
    let r = conn
        .run(services(3, vec![broken, inbound("svc-c", Create)]))
        .await;
    assert_eq!(terminal(&r).code, "InvalidServiceChange");
    assert_eq!(r.applied_indices, vec![1]);
    assert_eq!(
        frontends(&r.frontends),
        BTreeMap::from([("svc-c".to_string(), pip_address(&h, "pip-svc-c"))])
    );

    // Location units and deletions carry none.
    let r = conn
        .run(locations(4, vec![location("10.0.0.1", true, &[])]))
        .await;
    assert_applied(&r);
    assert!(r.frontends.is_empty());
    let r = conn.run(services(5, vec![inbound("svc-c", Delete)])).await;
    assert_applied(&r);
    assert!(r.frontends.is_empty());
    h.shutdown().await;
}

#[tokio::test]
async fn the_report_of_a_create_unit_carries_the_frontend_of_each_inbound_service() {
    create_reports_carry_frontends(EmulatorConfig::default()).await;
}

#[tokio::test]
async fn the_frontend_is_read_back_when_the_public_ip_is_created_as_a_long_running_operation() {
    // The first answer of the PUT has no address yet; the client reads the resource at the end.
    create_reports_carry_frontends(EmulatorConfig {
        long_running_operations: true,
        lro_retry_after_secs: 0,
        ..Default::default()
    })
    .await;
}

#[tokio::test]
async fn an_observe_reports_the_frontends_of_the_inbound_services_with_one_paged_listing() {
    let mut h = Harness::start(
        EmulatorConfig {
            page_size: 1,
            ..Default::default()
        },
        Limits::default(),
    )
    .await;
    let mut conn = h.conn().await;
    let created = conn
        .run(services(
            1,
            vec![
                inbound("svc-a", Create),
                inbound("svc-b", Create),
                inbound("svc-c", Create),
                outbound("egress-e", Create),
            ],
        ))
        .await;
    assert_applied(&created);
    // A public IP of a service that is not registered on the gateway (an interrupted saga): listed,
    // but not a frontend.
    let arm = ArmClient::new(
        ArmConfig::new("sub1", "rg1").with_endpoint(h.nrp.base_url()),
        None,
    )
    .unwrap();
    let orphan = PublicIpAddress {
        location: Some("eastus".into()),
        ..Default::default()
    };
    arm.put_public_ip("pip-svc-orphan", &orphan, CallOptions::none())
        .await
        .unwrap();
    h.emulator().reset_stats();
    let r = conn
        .run(unit(2, work_unit::Work::Observe(ObserveWork {})))
        .await;
    let Some(report::Outcome::Observed(o)) = r.outcome else {
        panic!("expected observed, got {r:?}")
    };
    assert!(o.last);
    let s = o.snapshot.unwrap();
    let expected: BTreeMap<String, String> = ["svc-a", "svc-b", "svc-c"]
        .iter()
        .map(|n| (n.to_string(), pip_address(&h, &format!("pip-{n}"))))
        .collect();
    assert_eq!(frontends(&s.frontends), expected);
    assert_eq!(
        frontends(&created.frontends),
        expected,
        "the same as created"
    );
    let stats = h.emulator().stats();
    // Five public IPs over pages of one: one listing of five pages, no GET per service.
    assert_eq!(stats.calls_of("PublicIPAddresses_List"), 5);
    assert_eq!(stats.calls_of("PublicIPAddresses_Get"), 0);
    h.shutdown().await;
}

/// Rules as `service → {(port, protocol)}`, checking that no service is listed twice.
fn rules(list: &[v1::ServiceRules]) -> BTreeMap<String, BTreeSet<(u32, v1::Protocol)>> {
    let map: BTreeMap<String, BTreeSet<(u32, v1::Protocol)>> = list
        .iter()
        .map(|r| {
            let ports = r.ports.iter().map(|p| (p.port, p.protocol())).collect();
            (r.service_id.clone(), ports)
        })
        .collect();
    assert_eq!(map.len(), list.len(), "a service listed twice: {list:?}");
    map
}

#[tokio::test]
async fn an_observe_reports_the_rules_of_the_inbound_services_with_one_paged_listing() {
    use clb_nrp::wire::TransportProtocol;
    let mut h = Harness::start(
        EmulatorConfig {
            page_size: 1,
            ..Default::default()
        },
        Limits::default(),
    )
    .await;
    let mut conn = h.conn().await;
    let tcp_443 = service(
        "svc-b",
        v1::ServiceKind::Inbound,
        Create,
        &[(443, v1::Protocol::Tcp)],
    );
    let created = conn
        .run(services(
            1,
            vec![
                inbound("svc-a", Create),
                tcp_443,
                inbound("svc-c", Create),
                outbound("egress-e", Create),
            ],
        ))
        .await;
    assert_applied(&created);
    // Someone edits svc-c's load balancer in NRP: its UDP rule becomes TCP 8080.
    let arm = ArmClient::new(
        ArmConfig::new("sub1", "rg1").with_endpoint(h.nrp.base_url()),
        None,
    )
    .unwrap();
    let mut lb = arm
        .get_load_balancer("lb-svc-c", CallOptions::none())
        .await
        .unwrap();
    let edited = lb
        .properties
        .load_balancing_rules
        .iter_mut()
        .find(|r| r.properties.protocol == Some(TransportProtocol::Udp))
        .expect("a UDP rule");
    edited.properties.protocol = Some(TransportProtocol::Tcp);
    edited.properties.frontend_port = 8080;
    edited.properties.backend_port = 8080;
    arm.put_load_balancer("lb-svc-c", &lb, CallOptions::none())
        .await
        .unwrap();
    h.emulator().reset_stats();
    let r = conn
        .run(unit(2, work_unit::Work::Observe(ObserveWork {})))
        .await;
    let Some(report::Outcome::Observed(o)) = r.outcome else {
        panic!("expected observed, got {r:?}")
    };
    assert!(o.last);
    let s = o.snapshot.unwrap();
    let (tcp, udp) = (v1::Protocol::Tcp, v1::Protocol::Udp);
    assert_eq!(
        rules(&s.rules),
        BTreeMap::from([
            ("svc-a".to_string(), BTreeSet::from([(80, tcp), (53, udp)])),
            ("svc-b".to_string(), BTreeSet::from([(443, tcp)])),
            (
                "svc-c".to_string(),
                BTreeSet::from([(80, tcp), (8080, tcp)])
            ),
        ]),
        "the inbound services' rules as NRP has them, none for the egress"
    );
    let stats = h.emulator().stats();
    // Three load balancers over pages of one: one listing of three pages, no GET per service.
    assert_eq!(stats.calls_of("LoadBalancers_List"), 3);
    assert_eq!(stats.calls_of("LoadBalancers_Get"), 0);
    h.shutdown().await;
}

#[tokio::test]
async fn the_worker_reconnects_and_says_hello_again_when_the_stream_drops() {
    let mut h = Harness::default().await;
    let first = h.conn().await;
    drop(first);
    let mut second = h.conn().await;
    assert_eq!(second.hello.worker_id, "worker-under-test");
    // The new session works.
    let r = second
        .run(locations(7, vec![location("10.0.0.1", true, &[])]))
        .await;
    assert_applied(&r);
    h.shutdown().await;
}

#[tokio::test]
async fn the_delete_saga_runs_after_the_drain_and_removes_everything() {
    let mut h = Harness::default().await;
    let mut conn = h.conn().await;
    create_services(&mut conn).await;
    assert_applied(&conn.run(locations(2, three_locations())).await);

    // Still referenced: NRP refuses, and nothing is deleted.
    let r = conn
        .run(services(
            3,
            vec![inbound("svc-a", Delete), outbound("egress-e", Delete)],
        ))
        .await;
    assert_eq!(repair(&r).code, "ServiceWithOverlayMappingsCannotBeDeleted");
    assert!(r.applied_indices.is_empty());
    assert_eq!(h.emulator().dump().load_balancers.len(), 1);

    // Drain: an empty list deletes a location.
    let drain = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
        .iter()
        .map(|l| location(l, true, &[]))
        .collect();
    assert_applied(&conn.run(locations(4, drain)).await);
    let r = conn
        .run(services(
            5,
            vec![inbound("svc-a", Delete), outbound("egress-e", Delete)],
        ))
        .await;
    assert_applied(&r);
    let dump = h.emulator().dump();
    assert!(
        dump.gateway(GW).unwrap().services.is_empty(),
        "unregistered"
    );
    assert!(dump.load_balancers.is_empty());
    assert!(dump.nat_gateways.is_empty());
    assert!(dump.public_ip_addresses.is_empty());
    // Deleting again is a no-op.
    assert_applied(&conn.run(services(6, vec![inbound("svc-a", Delete)])).await);
    h.shutdown().await;
}

#[tokio::test]
async fn shutdown_lets_the_call_under_way_finish_but_starts_no_new_one() {
    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
    let release = Arc::new(Semaphore::new(0));
    let gate = Arc::clone(&release);
    let limits = Limits {
        max_locations_per_call: 1,
        ..Limits::default()
    };
    let mut h = Harness::start_with(EmulatorConfig::default(), limits, move |inner| {
        Arc::new(GatedNrp {
            inner,
            entered: entered_tx,
            release: gate,
        })
    })
    .await;
    let mut conn = h.conn().await;
    let three = ["10.0.0.1", "10.0.0.2", "10.0.0.3"];
    let drain = three.iter().map(|l| location(l, true, &[])).collect();
    conn.send(locations(1, drain)).await;
    entered.recv().await.expect("the first call is under way");

    h.request_shutdown();
    // Units arriving during shutdown are handed back without touching NRP; an empty unit that is
    // still executed (shutdown not seen yet) is applied. Once one is handed back, the worker's gate
    // is closed.
    for work_id in 100.. {
        let r = conn.run(locations(work_id, Vec::new())).await;
        if r.outcome
            .as_ref()
            .is_some_and(|o| matches!(o, report::Outcome::Retryable(_)))
        {
            assert_eq!(retryable(&r).code, "WorkerCancelled");
            break;
        }
        assert_applied(&r);
    }
    release.add_permits(10);
    let r = conn.report().await;
    assert_eq!(r.work_id, 1);
    assert_eq!(retryable(&r).code, "WorkerCancelled");
    assert_eq!(r.applied_indices, vec![0], "the call under way finished");
    let stats = h.emulator().stats();
    assert_eq!(stats.calls_of("ServiceGateways_UpdateAddressLocations"), 1);
    h.shutdown().await;
    assert!(conn.next_report().await.is_none(), "stream closed");
}

#[tokio::test]
async fn shutdown_closes_the_stream() {
    let mut h = Harness::default().await;
    let mut conn = h.conn().await;
    h.shutdown().await;
    assert!(
        conn.next_report().await.is_none(),
        "the worker half-closed its stream"
    );
}
