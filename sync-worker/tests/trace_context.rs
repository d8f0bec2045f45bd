//! Trace context crosses the worker stream: a real state server and a real worker (against the NRP
//! emulator) over loopback, with an OpenTelemetry layer exporting to memory. The worker's execution
//! span of a unit must be a child of the server's `work_unit` span of that unit (same trace id, and
//! its parent span id is the server span's id). Every server binds port 0; the only wait is bounded
//! by a patience guard against hangs, never a timing assertion.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clb_nrp::azure::{ArmClient, ArmConfig};
use clb_nrp_emulator::{Emulator, EmulatorConfig, RunningEmulator};
use clb_state_server::state::{ServerConfig, StateServer};
use clb_sync_worker::worker::{self, WorkerConfig};
use opentelemetry::Value;
use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Upper bound of the wait: a guard against a hung test, not a timing assertion.
const PATIENCE: Duration = Duration::from_secs(60);

fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

/// The server's `work_unit` span (a trace root, recording the outcome) and the worker's execution
/// span of the same unit (it carries the unit's `revision`), once both have ended.
fn unit_spans(spans: &[SpanData]) -> Option<(&SpanData, &SpanData)> {
    spans
        .iter()
        .filter(|s| s.name == "work_unit" && attr(s, "revision").is_none())
        .find_map(|server| {
            let work_id = attr(server, "work_id")?;
            let worker = spans.iter().find(|s| {
                s.name == "work_unit"
                    && attr(s, "revision").is_some()
                    && attr(s, "work_id") == Some(work_id)
            })?;
            Some((server, worker))
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_unit_span_is_a_child_of_the_servers_work_unit_span() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
        .try_init()
        .expect("the only subscriber of this test binary");

    let emulator = RunningEmulator::start(Emulator::new(EmulatorConfig::default()).unwrap())
        .await
        .expect("start the NRP emulator");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = StateServer::new(ServerConfig::default());
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(clb_state_server::grpc::serve(listener, state, async move {
        let _ = server_stopped.await;
    }));
    let arm = ArmConfig::new("sub-trace", "rg-trace").with_endpoint(emulator.base_url());
    let nrp = Arc::new(ArmClient::new(arm, None).expect("valid ARM config"));
    let (stop_worker, worker_stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(worker::run(
        WorkerConfig::new(format!("http://{addr}"), "w-trace"),
        nrp,
        async move {
            let _ = worker_stopped.await;
        },
    ));

    // A fresh server first hands out an observe unit; wait until it has been executed and reported.
    let started = Instant::now();
    let spans = loop {
        let spans = exporter.get_finished_spans().unwrap();
        if unit_spans(&spans).is_some() {
            break spans;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "no executed unit; finished spans: {:?}",
            spans.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (server_span, worker_span) = unit_spans(&spans).unwrap();

    assert_eq!(server_span.parent_span_id, SpanId::INVALID, "a trace root");
    assert_eq!(attr(server_span, "kind"), Some(&Value::from("observe")));
    assert_eq!(attr(server_span, "outcome"), Some(&Value::from("observed")));
    assert_eq!(
        worker_span.span_context.trace_id(),
        server_span.span_context.trace_id(),
        "the worker's span joins the server's trace"
    );
    assert_eq!(
        worker_span.parent_span_id,
        server_span.span_context.span_id(),
        "the worker's span is a child of the server's work_unit span"
    );
    assert!(worker_span.parent_span_is_remote);

    let _ = stop_worker.send(());
    worker.await.unwrap().unwrap();
    let _ = stop_server.send(());
    server.await.unwrap().unwrap();
    emulator.shutdown().await.unwrap();
}
