//! From a Kubernetes change to the NRP call that programmed it: a writer's `Writer.Apply` sends its
//! trace context (`traceparent`), and the server's span of each work unit that carries the change
//! links to the server span that applied it (a unit mixes many writers' changes, so links, not
//! parents). The whole system runs in this process (emulator, state server, workers over loopback)
//! with an OpenTelemetry layer exporting to memory. The only wait is bounded by a patience guard.

use std::time::{Duration, Instant};

use clb_client::updates::{endpoint, endpoints_level, port, service_add};
use clb_proto::v1::Protocol;
use clb_tests::{Harness, Options, PATIENCE, WriterExt};
use opentelemetry::Value;
use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

/// The ancestors of `span` among `spans` (parent first), by span id.
fn ancestors(spans: &[SpanData], span: &SpanData) -> Vec<SpanId> {
    let mut out = Vec::new();
    let mut parent = span.parent_span_id;
    while parent != SpanId::INVALID {
        out.push(parent);
        match spans.iter().find(|s| s.span_context.span_id() == parent) {
            Some(p) => parent = p.parent_span_id,
            None => break,
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_units_span_links_to_the_writers_apply_span_whose_change_it_carries() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("info"))
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
        .try_init()
        .expect("the only subscriber of this test binary");

    let h = Harness::start(Options::e2e()).await;
    let mut writer = h.watcher().await;
    writer
        .apply_ok(vec![service_add("svc-traced", &[port(80, Protocol::Tcp)])])
        .await;
    writer
        .apply_ok(vec![endpoints_level(
            "svc-traced",
            vec![endpoint("10.9.0.1", "10.0.9.1")],
        )])
        .await;

    // The writer's client spans (one per Apply), and for each the server's spans in its trace.
    let deadline = Instant::now() + PATIENCE;
    let (client_traces, linked) = loop {
        let _ = provider.force_flush();
        let spans = exporter.get_finished_spans().unwrap();
        let clients: Vec<TraceId> = spans
            .iter()
            .filter(|s| s.name == "Writer.Apply" && attr(s, "writer").is_some())
            .map(|s| s.span_context.trace_id())
            .collect();
        // Server work_unit spans (the worker's own have a `revision` attribute) and their links
        // into a writer's trace.
        let linked: Vec<(String, SpanId)> = spans
            .iter()
            .filter(|s| s.name == "work_unit" && attr(s, "revision").is_none())
            .flat_map(|u| {
                let kind = attr(u, "kind").map(|v| v.to_string()).unwrap_or_default();
                u.links
                    .links
                    .iter()
                    .filter(|l| clients.contains(&l.span_context.trace_id()))
                    .map(move |l| (kind.clone(), l.span_context.span_id()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let kinds: Vec<&str> = linked.iter().map(|(k, _)| k.as_str()).collect();
        if clients.len() >= 2 && kinds.contains(&"services") && kinds.contains(&"locations") {
            // Every linked span is a server span under one of the writer's client spans.
            for (_, id) in &linked {
                let target = spans
                    .iter()
                    .find(|s| s.span_context.span_id() == *id)
                    .expect("the linked span was exported");
                let client = spans
                    .iter()
                    .find(|s| {
                        s.name == "Writer.Apply"
                            && s.span_context.trace_id() == target.span_context.trace_id()
                    })
                    .expect("its trace has the writer's span");
                assert!(
                    ancestors(&spans, target).contains(&client.span_context.span_id()),
                    "the linked span {} descends from the writer's Apply span",
                    target.name
                );
            }
            break (clients, linked);
        }
        assert!(
            Instant::now() < deadline,
            "no unit span linked to the writer's spans; {} spans exported",
            spans.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(client_traces.len() >= 2);
    assert!(!linked.is_empty());
}
