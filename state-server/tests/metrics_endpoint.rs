//! The metrics HTTP endpoint, over real loopback HTTP/1.1.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clb_core::difftracker::Operation;
use clb_core::dispatch::DispatchConfig;
use clb_proto::v1;
use clb_state_server::metrics::{GatewaySnapshot, Metrics, UnitResult, serve_metrics};
use clb_state_server::state::ServerConfig;
use support::worker::{FakeNrp, TestServer, TestWorker};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// Sends `GET path` and returns (status line, headers, body).
async fn get(addr: std::net::SocketAddr, path: &str) -> (String, String, String) {
    get_accepting(addr, path, None).await
}

/// `GET path` with an `Accept` header when given.
async fn get_accepting(
    addr: std::net::SocketAddr,
    path: &str,
    accept: Option<&str>,
) -> (String, String, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("HTTP response");
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (
        status.to_owned(),
        headers.to_ascii_lowercase(),
        body.to_owned(),
    )
}

#[tokio::test]
async fn metrics_and_healthz_are_served() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = Arc::new(Metrics::new());
    let refreshes = Arc::new(AtomicUsize::new(0));
    let refresh = {
        let (metrics, refreshes) = (metrics.clone(), refreshes.clone());
        move || {
            let n = refreshes.fetch_add(1, Ordering::SeqCst) as u64 + 1;
            metrics.set_gateway(&GatewaySnapshot {
                gateway: "default".into(),
                revision: 40 + n,
                desired_addresses: 12,
                staleness: Duration::from_secs(3),
                workers: 2,
                ..GatewaySnapshot::default()
            });
        }
    };
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = tokio::spawn(serve_metrics(listener, metrics.clone(), refresh, async {
        let _ = stop_rx.await;
    }));

    metrics.update_rpc("apply");
    metrics.update_rpc("apply");
    metrics.update_rpc("resync");
    metrics.rejected(4);
    metrics.unit_outcome("locations", UnitResult::Applied, "");
    metrics.unit_outcome("locations", UnitResult::LeaseExpired, "LeaseExpired");
    metrics.lease_expired(1);
    metrics.late_report();

    // The Prometheus text format by default: counters are declared under their `_total` name.
    let (status, headers, body) = get(addr, "/metrics").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        headers.contains("content-type: text/plain; version=0.0.4"),
        "{headers}"
    );
    for line in [
        "# HELP clb_server_update_rpcs_total Writer RPCs received, by rpc.",
        "# TYPE clb_server_update_rpcs_total counter",
        "clb_server_update_rpcs_total{rpc=\"apply\"} 2",
    ] {
        assert!(
            body.lines().any(|l| l == line),
            "missing {line:?} in\n{body}"
        );
    }
    assert!(
        !body.contains("# EOF") && !body.contains("# UNIT"),
        "{body}"
    );

    // OpenMetrics when asked.
    let (status, headers, body) = get_accepting(
        addr,
        "/metrics",
        Some("application/openmetrics-text; version=1.0.0"),
    )
    .await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        headers.contains("content-type: application/openmetrics-text"),
        "{headers}"
    );
    for line in [
        "clb_server_update_rpcs_total{rpc=\"apply\"} 2",
        "clb_server_update_rpcs_total{rpc=\"resync\"} 1",
        "clb_server_rejected_items_total 4",
        "clb_server_units_total{kind=\"locations\",result=\"applied\",code=\"\"} 1",
        "clb_server_units_total{kind=\"locations\",result=\"lease_expired\",code=\"LeaseExpired\"} 1",
        "clb_server_lease_expiries_total 1",
        "clb_server_late_reports_total 1",
        // Set by `refresh`, which runs before each scrape (this is the second).
        "clb_server_revision{gateway=\"default\"} 42",
        "clb_server_desired_addresses{gateway=\"default\"} 12",
        "clb_server_staleness_seconds{gateway=\"default\"} 3.0",
        "clb_server_workers{gateway=\"default\"} 2",
    ] {
        assert!(
            body.lines().any(|l| l == line),
            "missing {line:?} in\n{body}"
        );
    }
    assert!(body.ends_with("# EOF\n"));

    // A second scrape refreshes again and sees new counts.
    metrics.update_rpc("apply");
    let (_, _, body) = get(addr, "/metrics").await;
    assert!(body.contains("clb_server_update_rpcs_total{rpc=\"apply\"} 3\n"));
    assert!(body.contains("clb_server_revision{gateway=\"default\"} 43\n"));
    assert_eq!(refreshes.load(Ordering::SeqCst), 3);

    let (status, _, body) = get(addr, "/healthz").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(body, "ok\n");

    let (status, _, _) = get(addr, "/nope").await;
    assert_eq!(status, "HTTP/1.1 404 Not Found");

    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("server stops after shutdown")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn units_a_worker_reports_are_counted_by_kind_and_result_on_the_endpoint() {
    let server = TestServer::start(ServerConfig {
        dispatch: DispatchConfig {
            retry_base: Duration::from_millis(10),
            retry_max: Duration::from_millis(50),
            ..DispatchConfig::default()
        },
        ..ServerConfig::default()
    })
    .await;
    {
        let g = server.state.gateway("").unwrap();
        g.lock()
            .tracker_mut()
            .update_service(Operation::Add, "svc-a")
            .unwrap();
    }
    server.state.notify_work();
    let nrp = Arc::new(Mutex::new(FakeNrp::default()));
    let mut w = TestWorker::connect(&server.url(), "w", 1).await;
    let wait = Duration::from_secs(10);
    let kind = |u: &v1::WorkUnit| match u.work {
        Some(v1::work_unit::Work::Observe(_)) => "observe",
        Some(v1::work_unit::Work::Services(_)) => "services",
        _ => "other",
    };
    // The observe first, read back from the fake NRP.
    let observe = w.next_unit(wait).await.expect("an observe");
    assert_eq!(kind(&observe), "observe");
    let report = nrp.lock().unwrap().apply_report(&observe);
    w.send_report(report).await;
    // The creation of svc-a: throttled once, then applied.
    let create = w.next_unit(wait).await.expect("a service unit");
    assert_eq!(kind(&create), "services");
    w.report(
        create.work_id,
        v1::report::Outcome::Retryable(v1::Retryable {
            retry_after_ms: 0,
            code: "TooManyRequests".into(),
            message: "slow down".into(),
        }),
    )
    .await;
    let again = w.next_unit(wait).await.expect("the service unit again");
    assert_eq!(kind(&again), "services");
    let report = nrp.lock().unwrap().apply_report(&again);
    w.send_report(report).await;
    // Wait (without a time bound on the server) until the last report has been folded.
    let folded = async {
        loop {
            let g = server.state.gateway("").unwrap();
            if g.lock()
                .tracker()
                .service_view("svc-a")
                .is_some_and(|v| v.actual)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(wait, folded)
        .await
        .expect("the creation is recorded");

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = server.state.clone();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let metrics_server = tokio::spawn(serve_metrics(
        listener,
        server.state.metrics().clone(),
        move || state.metrics().refresh_from(&state),
        async {
            let _ = stop_rx.await;
        },
    ));
    let (status, _, body) = get(addr, "/metrics").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    for line in [
        "clb_server_units_total{kind=\"observe\",result=\"observed\",code=\"\"} 1",
        "clb_server_units_total{kind=\"services\",result=\"retryable\",code=\"TooManyRequests\"} 1",
        "clb_server_units_total{kind=\"services\",result=\"applied\",code=\"\"} 1",
        "clb_server_actual_services{gateway=\"default\"} 1",
    ] {
        assert!(
            body.lines().any(|l| l == line),
            "missing {line:?} in\n{body}"
        );
    }
    stop_tx.send(()).unwrap();
    let _ = tokio::time::timeout(wait, metrics_server).await;
    drop(w);
    server.stop().await;
}
