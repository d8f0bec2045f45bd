//! Tests of `metrics.rs`: the gauges and counters as Prometheus text.
use super::*;
use crate::state::{ServerConfig, StateServer, gateway_snapshots};

#[test]
fn counters_are_encoded_with_labels() {
    let m = Metrics::new();
    m.update_rpc("apply");
    m.update_rpc("apply");
    m.update_rpc("resync");
    m.rejected(3);
    m.unit_outcome("locations", UnitResult::Retryable, "TooManyRequests");
    m.unit_outcome("services", "applied", "");
    m.lease_expired(2);
    m.late_report();
    let text = m.encode();
    for line in [
        "clb_server_update_rpcs_total{rpc=\"apply\"} 2",
        "clb_server_update_rpcs_total{rpc=\"resync\"} 1",
        "clb_server_rejected_items_total 3",
        "clb_server_units_total{kind=\"locations\",result=\"retryable\",code=\"TooManyRequests\"} 1",
        "clb_server_units_total{kind=\"services\",result=\"applied\",code=\"\"} 1",
        "clb_server_lease_expiries_total 2",
        "clb_server_late_reports_total 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn gauges_are_set_per_gateway() {
    let m = Metrics::new();
    let mut s = GatewaySnapshot {
        gateway: "east".into(),
        revision: 7,
        desired_addresses: 10,
        actual_addresses: 9,
        desired_locations: 2,
        actual_locations: 1,
        desired_services: 3,
        actual_services: 3,
        dirty_locations: 1,
        units_in_flight: 1,
        parked_units: 0,
        nat_gateways_missing: 1,
        staleness: Duration::from_millis(1500),
        workers: 2,
        write_budget: Some(17),
        batching_window: Duration::from_millis(333),
        unit_headway: Duration::from_millis(52),
        held_back: vec![
            (
                "pod_writer",
                HeldBack {
                    removals: 3,
                    locations: 1,
                },
            ),
            (
                "pod_writer",
                HeldBack {
                    removals: 2,
                    locations: 1,
                },
            ),
        ],
        refused: vec![
            ("BackendPoolAddressesMustHaveSameIpVersion".into(), 2),
            ("InvalidResourceName".into(), 1),
        ],
    };
    m.set_gateway(&s);
    // A code no longer held goes to 0.
    s.refused.pop();
    m.set_gateway(&s);
    s.gateway = "west".into();
    s.revision = 1;
    m.set_gateway(&s);
    let text = m.encode();
    for line in [
        "clb_server_revision{gateway=\"east\"} 7",
        "clb_server_revision{gateway=\"west\"} 1",
        "clb_server_desired_addresses{gateway=\"east\"} 10",
        "clb_server_actual_addresses{gateway=\"east\"} 9",
        "clb_server_desired_locations{gateway=\"east\"} 2",
        "clb_server_actual_locations{gateway=\"east\"} 1",
        "clb_server_desired_services{gateway=\"east\"} 3",
        "clb_server_actual_services{gateway=\"east\"} 3",
        "clb_server_dirty_locations{gateway=\"east\"} 1",
        "clb_server_units_in_flight{gateway=\"east\"} 1",
        "clb_server_parked_units{gateway=\"east\"} 0",
        "clb_server_nat_gateways_missing{gateway=\"east\"} 1",
        "clb_server_staleness_seconds{gateway=\"east\"} 1.5",
        "clb_server_workers{gateway=\"east\"} 2",
        "clb_server_write_budget_remaining{gateway=\"east\"} 17",
        "clb_server_batching_window_seconds{gateway=\"east\"} 0.333",
        "clb_server_unit_headway_seconds{gateway=\"east\"} 0.052",
        "clb_server_removals_held_back{gateway=\"east\",reason=\"pod_writer\"} 5",
        "clb_server_locations_held_back{gateway=\"east\",reason=\"pod_writer\"} 2",
        "clb_server_removals_held_back{gateway=\"east\",reason=\"cluster_view\"} 0",
        "clb_server_refused_items{gateway=\"east\",code=\"BackendPoolAddressesMustHaveSameIpVersion\"} 2",
        "clb_server_refused_items{gateway=\"east\",code=\"InvalidResourceName\"} 0",
        "clb_server_refused_items{gateway=\"west\",code=\"BackendPoolAddressesMustHaveSameIpVersion\"} 2",
        "# UNIT clb_server_staleness_seconds seconds",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
}

#[test]
fn snapshots_cover_every_gateway() {
    let state = StateServer::new(ServerConfig {
        gateways: vec!["a".into(), "b".into()],
        ..ServerConfig::default()
    });
    let snaps = gateway_snapshots(&state, std::time::Instant::now());
    let names: Vec<_> = snaps.iter().map(|s| s.gateway.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert!(
        snaps
            .iter()
            .all(|s| s.desired_addresses == 0 && s.workers == 0)
    );
    let m = Metrics::new();
    m.refresh_from(&state);
    assert!(m.encode().contains("clb_server_revision{gateway=\"b\"}"));
}

#[test]
fn latency_is_observed_per_gateway_and_counters_have_help_in_prometheus_text() {
    let m = Arc::new(Metrics::new());
    let east = gateway_observer(m.clone(), "east");
    east.programmed("locations", Duration::from_millis(30));
    east.unit_outcome("locations", "applied", "");
    let text = m.encode();
    for line in [
        "clb_server_desired_to_programmed_seconds_count{gateway=\"east\",kind=\"locations\"} 1",
        "clb_server_desired_to_programmed_seconds_bucket{le=\"0.02\",gateway=\"east\",kind=\"locations\"} 0",
        "clb_server_desired_to_programmed_seconds_bucket{le=\"0.04\",gateway=\"east\",kind=\"locations\"} 1",
        "clb_server_units_total{kind=\"locations\",result=\"applied\",code=\"\"} 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    let prom = m.encode_prometheus();
    assert!(
        prom.lines()
            .any(|l| l.starts_with("# HELP clb_server_units_total ")),
        "{prom}"
    );
    assert!(prom.contains("clb_build_info{"), "{prom}");
}

/// `GET path` over plain HTTP/1.1; the status code.
async fn get_status(addr: std::net::SocketAddr, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.split(' ').nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn readyz_follows_readiness_and_healthz_does_not() {
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r = ready.clone();
    let app = router_with_readiness(
        Arc::new(Metrics::new()),
        || {},
        move || r.load(std::sync::atomic::Ordering::SeqCst),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve_router(listener, app, std::future::pending()));
    assert_eq!(
        get_status(addr, "/readyz").await,
        503,
        "a standby is not ready"
    );
    assert_eq!(get_status(addr, "/healthz").await, 200);
    ready.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(get_status(addr, "/readyz").await, 200);
}
