//! The `/metrics`, `/healthz` and `/readyz` endpoints of every binary (docs/metrics.md), over
//! loopback HTTP on ports chosen by the system: each `/metrics` parses as the Prometheus text format
//! (the default) and as OpenMetrics (when asked) with HELP and TYPE on every family; the worker's
//! NRP metrics move on a throttled and on a failed call; the state server's desired → programmed
//! histogram records the latency of the units that programmed a cluster; the worker's `/readyz`
//! follows its session with the leading state server; the watcher's follows its first sync.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clb_nrp::CallOptions;
use clb_nrp_emulator::{Emulator, EmulatorConfig};
use clb_state_server::metrics::router_with_readiness;
use clb_sync_worker::metrics::{MeteredNrp, WorkerMetrics};
use clb_sync_worker::worker::{Backoff, WorkerConfig, run_with_metrics};
use clb_tests::fake_kube::FakeApi;
use clb_tests::kube_objects::{RunningWatcher, endpoint, node, service, slice, test_config};
use clb_tests::metrics_check::{Exposition, Format};
use clb_tests::{
    Cluster, ClusterSpec, GATEWAY, Harness, Options, PATIENCE, WorkerProc, WriterExt, init_tracing,
};
use clb_watcher::Mode;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// A response: status, headers (lower-case names) and body.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `GET path` over HTTP/1.1 (connection: close), with an optional `Accept` header.
async fn get(addr: SocketAddr, path: &str, accept: Option<&str>) -> Response {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let accept = accept.map_or(String::new(), |a| format!("accept: {a}\r\n"));
    let req = format!("GET {path} HTTP/1.1\r\nhost: test\r\n{accept}connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read");
    let raw = String::from_utf8(raw).expect("UTF-8 response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a header block");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Response {
        status,
        headers,
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").expect("a chunk size");
        let size = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        s = &rest[size + 2..];
    }
}

/// Serves `router` on 127.0.0.1, port 0, until `stop`; the address.
async fn serve(router: axum::Router, stop: &CancellationToken) -> SocketAddr {
    let (addr, _task) = clb_telemetry::metrics::spawn(
        "127.0.0.1:0".parse().unwrap(),
        router,
        stop.clone().cancelled_owned(),
    )
    .await
    .expect("the metrics listener");
    addr
}

/// Scrapes `addr` in both formats, checks both strictly, checks `clb_build_info`, and returns the
/// Prometheus-text exposition.
async fn scrape(addr: SocketAddr, what: &str) -> Exposition {
    let prom = get(addr, "/metrics", None).await;
    assert_eq!(prom.status, 200, "{what}");
    assert_eq!(
        prom.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8"),
        "{what}"
    );
    let parsed = Exposition::parse(&prom.body, Format::Prometheus)
        .unwrap_or_else(|e| panic!("{what}: Prometheus text: {e}\n{}", prom.body));
    let om = get(
        addr,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"),
    )
    .await;
    assert_eq!(om.status, 200, "{what}");
    assert_eq!(
        om.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        "{what}"
    );
    // (Each format is checked on its own: the system keeps working between the two scrapes.)
    let om_parsed = Exposition::parse(&om.body, Format::OpenMetrics)
        .unwrap_or_else(|e| panic!("{what}: OpenMetrics: {e}\n{}", om.body));
    for f in &om_parsed.families {
        assert!(!f.help.is_empty(), "{what}: {} has an empty HELP", f.name);
    }
    for f in &parsed.families {
        assert!(!f.help.is_empty(), "{what}: {} has an empty HELP", f.name);
    }
    let build = parsed
        .family("clb_build_info")
        .unwrap_or_else(|| panic!("{what}: no clb_build_info"));
    assert_eq!(build.kind, "gauge");
    assert_eq!(build.samples.len(), 1, "{what}");
    let s = &build.samples[0];
    assert_eq!(s.value, 1.0);
    assert_eq!(
        s.labels,
        vec![
            ("version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
            (
                "commit".to_owned(),
                clb_telemetry::metrics::COMMIT.to_owned()
            ),
        ]
    );
    assert_eq!(get(addr, "/healthz", None).await.status, 200, "{what}");
    parsed
}

/// Polls `f` until it holds; panics after [`PATIENCE`] (a bound on a hung test).
async fn until<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + PATIENCE;
    while !f().await {
        assert!(Instant::now() < deadline, "{what}: not after {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn no_workers() -> Options {
    Options {
        nat_gateway_resource_group: None,
        workers: 0,
        ..Options::e2e()
    }
}

/// Starts a worker of `h` that records into `metrics`; stops with `stop`.
fn start_worker(h: &Harness, metrics: Arc<WorkerMetrics>, stop: &CancellationToken) {
    let mut config = WorkerConfig::new(h.url(), "metered-worker");
    config.capacity = 4;
    config.limits = h.options().worker_limits;
    config.backoff = Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(200),
    };
    let nrp = WorkerProc::arm_client(&h.nrp_url());
    let stop = stop.clone();
    tokio::spawn(async move {
        run_with_metrics(config, nrp, metrics, stop.cancelled_owned())
            .await
            .expect("the worker runs");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_and_worker_metrics_parse_and_the_latency_histogram_records_units() {
    init_tracing();
    let stop = CancellationToken::new();
    let h = Harness::start(no_workers()).await;
    let state = h.server().state.clone();
    let server_addr = {
        let (metrics, refresh_state, ready_state) =
            (state.metrics().clone(), state.clone(), state.clone());
        let m = metrics.clone();
        serve(
            router_with_readiness(
                metrics,
                move || m.refresh_from(&refresh_state),
                move || ready_state.is_leader(),
            ),
            &stop,
        )
        .await
    };
    let worker_metrics = Arc::new(WorkerMetrics::new());
    let worker_addr = serve(worker_metrics.router(), &stop).await;
    start_worker(&h, worker_metrics.clone(), &stop);

    let before = scrape(server_addr, "state server").await;
    assert_eq!(
        before.value(
            "clb_server_desired_to_programmed_seconds_count",
            &[("gateway", GATEWAY)]
        ),
        None,
        "nothing programmed yet"
    );

    let cluster = Cluster::generate(ClusterSpec::small(6, 4, 3));
    h.watcher().await.resync_ok(cluster.full_view()).await;
    h.converge(&cluster.expected(), PATIENCE).await;

    let server = scrape(server_addr, "state server").await;
    for kind in ["locations", "services"] {
        let labels = [("gateway", GATEWAY), ("kind", kind)];
        let count = server
            .value("clb_server_desired_to_programmed_seconds_count", &labels)
            .unwrap_or_else(|| panic!("no {kind} latency"));
        assert!(count >= 1.0, "{kind}: {count}");
        let sum = server
            .value("clb_server_desired_to_programmed_seconds_sum", &labels)
            .unwrap();
        assert!(sum > 0.0, "{kind}: a latency of 0");
        let inf = server
            .value(
                "clb_server_desired_to_programmed_seconds_bucket",
                &[("gateway", GATEWAY), ("kind", kind), ("le", "+Inf")],
            )
            .unwrap();
        assert_eq!(inf, count);
    }
    let applied = server
        .value(
            "clb_server_units_total",
            &[("kind", "locations"), ("result", "applied")],
        )
        .expect("applied location units are counted");
    assert!(applied >= 1.0);
    assert_eq!(
        server
            .family("clb_server_units_total")
            .map(|f| f.kind.as_str()),
        Some("counter")
    );

    let worker = scrape(worker_addr, "sync worker").await;
    let calls = worker
        .value(
            "clb_worker_nrp_requests_total",
            &[
                ("operation", "update_address_locations"),
                ("result", "ok"),
                ("code", ""),
            ],
        )
        .expect("updateAddressLocations calls are counted");
    assert!(calls >= 1.0);
    assert!(
        worker
            .value(
                "clb_worker_nrp_request_duration_seconds_count",
                &[("operation", "update_address_locations")]
            )
            .unwrap()
            >= calls
    );
    let limit = worker
        .value("clb_worker_concurrency_limit", &[("gateway", GATEWAY)])
        .expect("the gateway's limit is shown");
    assert!(limit >= 1.0);
    assert_eq!(worker.value("clb_worker_connected", &[]), Some(1.0));
    stop.cancel();
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nrp_metrics_move_on_a_throttled_and_a_failed_call() {
    init_tracing();
    let stop = CancellationToken::new();
    let emulator = Emulator::new(EmulatorConfig::default()).expect("emulator");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nrp_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(clb_nrp_emulator::serve(
        listener,
        emulator.clone(),
        stop.clone().cancelled_owned(),
    ));
    let emulator_addr = serve(clb_nrp_emulator::metrics::router(emulator.clone()), &stop).await;
    let metrics = Arc::new(WorkerMetrics::new());
    let addr = serve(metrics.router(), &stop).await;
    let nrp = MeteredNrp::new(WorkerProc::arm_client(&nrp_url), metrics.clone());
    let body = clb_nrp::wire::ServiceGateway {
        location: Some("eastus".into()),
        sku: Some(clb_nrp::wire::Sku::standard()),
        ..Default::default()
    };
    async fn put(
        nrp: &MeteredNrp,
        body: &clb_nrp::wire::ServiceGateway,
    ) -> Result<clb_nrp::wire::ServiceGateway, clb_nrp::NrpError> {
        clb_nrp::Nrp::put_service_gateway(
            nrp,
            "gw-metrics",
            body,
            CallOptions::with_timeout(Duration::from_secs(30)),
        )
        .await
    }
    let op = ("operation", "put_service_gateway");

    put(&nrp, &body).await.expect("a call without faults");
    let m = scrape(addr, "sync worker").await;
    assert_eq!(
        m.value(
            "clb_worker_nrp_requests_total",
            &[op, ("result", "ok"), ("code", "")]
        ),
        Some(1.0)
    );
    assert_eq!(m.value("clb_worker_nrp_throttles_total", &[op]), None);

    emulator
        .set_config(EmulatorConfig {
            fault_rate_429: 1.0,
            seed: Some(1),
            ..EmulatorConfig::default()
        })
        .unwrap();
    let e = put(&nrp, &body).await.expect_err("a throttled call");
    assert!(e.is_throttling(), "{e}");
    let m = scrape(addr, "sync worker").await;
    assert_eq!(
        m.value(
            "clb_worker_nrp_requests_total",
            &[op, ("result", "throttled"), ("code", e.code())]
        ),
        Some(1.0)
    );
    assert_eq!(m.value("clb_worker_nrp_throttles_total", &[op]), Some(1.0));

    emulator
        .set_config(EmulatorConfig {
            fault_rate_5xx: 1.0,
            seed: Some(1),
            ..EmulatorConfig::default()
        })
        .unwrap();
    let e = put(&nrp, &body).await.expect_err("a failed call");
    assert!(
        matches!(e, clb_nrp::NrpError::Server { .. }),
        "an injected 5xx: {e}"
    );
    let m = scrape(addr, "sync worker").await;
    assert_eq!(
        m.value(
            "clb_worker_nrp_requests_total",
            &[op, ("result", "server"), ("code", e.code())]
        ),
        Some(1.0)
    );
    assert_eq!(
        m.value("clb_worker_nrp_throttles_total", &[op]),
        Some(1.0),
        "a server error is no throttle"
    );
    assert_eq!(
        m.value("clb_worker_nrp_request_duration_seconds_count", &[op]),
        Some(3.0)
    );

    // The emulator's own endpoint saw the same three calls.
    let em = scrape(emulator_addr, "nrp-emulator").await;
    let answered: f64 = em
        .family("clb_emulator_calls_total")
        .expect("emulator calls")
        .samples
        .iter()
        .map(|s| s.value)
        .sum();
    assert!(answered >= 3.0, "{answered}");
    assert_eq!(get(emulator_addr, "/readyz", None).await.status, 200);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_is_ready_only_while_connected_to_the_leader() {
    init_tracing();
    let stop = CancellationToken::new();
    let h = Harness::start(no_workers()).await;
    let metrics = Arc::new(WorkerMetrics::new());
    let addr = serve(metrics.router(), &stop).await;
    assert_eq!(get(addr, "/readyz", None).await.status, 503, "not started");
    assert_eq!(get(addr, "/healthz", None).await.status, 200);
    start_worker(&h, metrics.clone(), &stop);
    until("the worker is ready", || async {
        get(addr, "/readyz", None).await.status == 200
    })
    .await;

    // The server steps down: the worker's session ends and a standby does not welcome it.
    h.server().state.set_leader(false);
    until("the worker is not ready without a leader", || async {
        get(addr, "/readyz", None).await.status == 503
    })
    .await;
    let m = scrape(addr, "sync worker").await;
    assert_eq!(m.value("clb_worker_connected", &[]), Some(0.0));

    h.server().state.set_leader(true);
    until("the worker is ready again", || async {
        get(addr, "/readyz", None).await.status == 200
    })
    .await;
    let m = scrape(addr, "sync worker").await;
    assert!(m.value("clb_worker_sessions_total", &[]).unwrap() >= 2.0);
    stop.cancel();
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_serves_metrics_and_is_ready_once_synced() {
    init_tracing();
    let stop = CancellationToken::new();
    let h = Harness::start(no_workers()).await;
    let fake = FakeApi::start().await;
    fake.put("nodes", node("node-a", &["10.0.0.1"]));
    fake.put(
        "services",
        service(
            "web",
            "3b0c0d4e-0000-4000-8000-0000000000f1",
            json!({"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}),
        ),
    );
    fake.put(
        "endpointslices",
        slice(
            "web-1",
            "web",
            "IPv4",
            vec![endpoint("10.1.0.1", "node-a", true)],
        ),
    );
    let config = test_config(&h.url(), Mode::Cluster { pods: false });
    let metrics = config.metrics.clone();
    let addr = serve(metrics.router(), &stop).await;
    assert_eq!(get(addr, "/readyz", None).await.status, 503, "not started");
    let w = RunningWatcher::start(config, fake.watcher_clients());
    until("the watcher is synced", || async {
        get(addr, "/readyz", None).await.status == 200
    })
    .await;
    let m = scrape(addr, "watcher").await;
    assert_eq!(m.value("clb_watcher_synced", &[]), Some(1.0));
    assert!(
        m.value("clb_watcher_resyncs_total", &[("result", "ok")])
            .unwrap()
            >= 1.0
    );
    for kind in ["service", "endpointslice", "node"] {
        assert!(
            m.value(
                "clb_watcher_events_total",
                &[("kind", kind), ("event", "init_done")]
            )
            .is_some_and(|v| v >= 1.0),
            "{kind}: no init_done event counted"
        );
    }
    assert!(
        m.value(
            "clb_watcher_events_total",
            &[("kind", "service"), ("event", "apply")]
        )
        .is_some_and(|v| v >= 1.0)
    );
    w.stop().await;
    stop.cancel();
    h.shutdown().await;
}
