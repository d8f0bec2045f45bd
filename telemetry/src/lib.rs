//! Logging and distributed tracing, shared by every clb binary (state server, sync worker, clients).
//!
//! [`init`] installs a `tracing` subscriber: an [`EnvFilter`] (`RUST_LOG`, default `info`) and a fmt
//! layer on stderr. When the standard `OTEL_EXPORTER_OTLP_ENDPOINT` variable is set (and not empty),
//! spans are also exported over OTLP/gRPC with a batch exporter, under the given `service.name`.
//!
//! Trace context crosses gRPC calls as W3C `traceparent`/`tracestate` metadata:
//! - clients add [`TraceContextInterceptor`] (or call [`inject`]) so each call carries the caller's span;
//! - a span that carries the work of many requests links to them ([`current_span_link`], [`add_links`]);
//! - servers pass [`grpc_server_span`] to `tonic::transport::Server::builder().trace_fn(..)`, which
//!   makes every incoming RPC's span a child of the incoming `traceparent` (see also [`extract_parent`]).
//!
//! The state server re-exports this crate as `clb_state_server::telemetry`. [`shutdown_signal`] and
//! the duration flags ([`flags`]) are the other pieces every binary shares.

pub mod flags;
pub mod metrics;

use std::collections::HashMap;
use std::io::IsTerminal as _;

use anyhow::Context as _;
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The standard variable naming the OTLP collector; span export is enabled only when it is set.
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// Keeps the span exporter alive; on drop it flushes pending spans and shuts the provider down.
///
/// Hold it for the life of the program (`let _guard = telemetry::init(..)?;`). Drop it inside a
/// multi-threaded Tokio runtime (or outside any runtime), since the final export uses the gRPC channel.
#[derive(Debug)]
#[must_use = "dropping the guard shuts span export down"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Whether spans are exported over OTLP.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(e) = provider.force_flush() {
                eprintln!("telemetry: flushing spans failed: {e}");
            }
            if let Err(e) = provider.shutdown() {
                eprintln!("telemetry: shutting the tracer provider down failed: {e}");
            }
        }
    }
}

/// Installs the global `tracing` subscriber and the W3C trace-context propagator.
///
/// `service_name` becomes the OTLP resource's `service.name`. Must be called inside a Tokio runtime
/// when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (the gRPC exporter's channel needs one). Fails if
/// `RUST_LOG` is invalid, the exporter cannot be built, or a global subscriber is already installed.
pub fn init(service_name: &str) -> anyhow::Result<TelemetryGuard> {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());

    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::INFO.into())
        .from_env()
        .context("invalid RUST_LOG")?;

    let provider = match std::env::var(OTLP_ENDPOINT_ENV) {
        Ok(endpoint) if !endpoint.trim().is_empty() => {
            Some(build_provider(service_name, &endpoint)?)
        }
        _ => None,
    };
    let otel_layer = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer(service_name.to_owned())));

    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .with(otel_layer)
        .try_init()
        .context("a global tracing subscriber is already installed")?;

    if let Some(p) = &provider {
        opentelemetry::global::set_tracer_provider(p.clone());
    }
    Ok(TelemetryGuard { provider })
}

fn build_provider(service_name: &str, endpoint: &str) -> anyhow::Result<SdkTracerProvider> {
    // The builder reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, _HEADERS and _TIMEOUT itself.
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .with_context(|| format!("building the OTLP/gRPC span exporter for {endpoint:?}"))?;
    let resource = Resource::builder()
        .with_service_name(service_name.to_owned())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// Reads W3C trace context from HTTP headers.
struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// Writes W3C trace context into HTTP headers.
struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        let name = http::HeaderName::from_bytes(key.as_bytes());
        let value = http::HeaderValue::from_str(&value);
        if let (Ok(name), Ok(value)) = (name, value) {
            self.0.insert(name, value);
        }
    }
}

/// The parent context carried by `headers` (`traceparent`/`tracestate`); an empty context if none.
pub fn extract_parent_headers(headers: &http::HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// Writes `cx`'s span context into `headers` as `traceparent`/`tracestate`.
pub fn inject_headers(cx: &Context, headers: &mut http::HeaderMap) {
    TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
}

/// The parent context carried by gRPC `metadata`; an empty context if none.
pub fn extract_parent(metadata: &tonic::metadata::MetadataMap) -> Context {
    extract_parent_headers(metadata.as_ref())
}

/// Writes `cx`'s span context into gRPC `metadata` as `traceparent`/`tracestate`.
pub fn inject(cx: &Context, metadata: &mut tonic::metadata::MetadataMap) {
    inject_headers(cx, metadata.as_mut());
}

/// Writes `cx`'s span context into a plain string map (`traceparent`, `tracestate`), e.g. to carry it
/// in a protobuf `map<string, string>` field; the map is empty when `cx` has no valid span context.
pub fn inject_map(cx: &Context) -> HashMap<String, String> {
    let mut map = HashMap::new();
    TraceContextPropagator::new().inject_context(cx, &mut map);
    map
}

/// The parent context carried by a string map written by [`inject_map`]; an empty context if none.
pub fn extract_map(map: &HashMap<String, String>) -> Context {
    TraceContextPropagator::new().extract(map)
}

/// The OpenTelemetry context of the current `tracing` span (what a client call should carry).
pub fn current_context() -> Context {
    tracing::Span::current().context()
}

/// A link to a span that ended or goes on elsewhere: its trace and span id. The state server keeps
/// the links of the writer requests whose changes a work unit carries (a unit mixes many writers'
/// changes, so they are links, not parents), and [`add_links`] puts them on the unit's span.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanLink(opentelemetry::trace::SpanContext);

impl SpanLink {
    /// The linked span's trace id (hex).
    pub fn trace_id(&self) -> String {
        self.0.trace_id().to_string()
    }

    /// The linked span's id (hex).
    pub fn span_id(&self) -> String {
        self.0.span_id().to_string()
    }
}

/// A link to the current `tracing` span, or `None` when it has no valid OpenTelemetry context
/// (no OpenTelemetry layer installed, or the span is disabled).
pub fn current_span_link() -> Option<SpanLink> {
    use opentelemetry::trace::TraceContextExt as _;
    let cx = tracing::Span::current().context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then_some(SpanLink(sc))
}

/// Adds `links` to `span` (a no-op when no OpenTelemetry layer is installed).
pub fn add_links(span: &tracing::Span, links: impl IntoIterator<Item = SpanLink>) {
    for link in links {
        span.add_link(link.0);
    }
}

/// Makes `span` a child of the trace context carried by `metadata`, if any.
///
/// For handlers that create their own spans; a no-op when no OpenTelemetry layer is installed.
pub fn set_parent_from(span: &tracing::Span, metadata: &tonic::metadata::MetadataMap) {
    let _ = span.set_parent(extract_parent(metadata));
}

/// Makes `span` a child of the trace context carried by a string map written by [`inject_map`].
///
/// Leaves `span` alone when the map carries no valid context (tracing off on the sending side), so it
/// keeps its place under the current span; a no-op when no OpenTelemetry layer is installed.
pub fn set_parent_from_map(span: &tracing::Span, map: &HashMap<String, String>) {
    use opentelemetry::trace::TraceContextExt as _;
    let cx = extract_map(map);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// A span for one incoming gRPC request, child of its `traceparent`: pass it to
/// `tonic::transport::Server::builder().trace_fn(telemetry::grpc_server_span)`.
pub fn grpc_server_span(req: &http::Request<()>) -> tracing::Span {
    let path = req.uri().path();
    let (service, method) = split_grpc_path(path);
    let span = tracing::info_span!(
        "grpc",
        otel.name = %path.trim_start_matches('/'),
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = %service,
        rpc.method = %method,
    );
    let _ = span.set_parent(extract_parent_headers(req.headers()));
    span
}

/// `/pkg.Service/Method` → (`pkg.Service`, `Method`).
fn split_grpc_path(path: &str) -> (&str, &str) {
    path.trim_start_matches('/')
        .split_once('/')
        .unwrap_or((path, ""))
}

/// A client interceptor that sends the current span's trace context with every call:
/// `WriterClient::with_interceptor(channel, TraceContextInterceptor)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceContextInterceptor;

impl tonic::service::Interceptor for TraceContextInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        inject(&current_context(), req.metadata_mut());
        Ok(req)
    }
}

/// Resolves on the first SIGINT (Ctrl-C) or SIGTERM (Kubernetes pod termination).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tonic::metadata::MetadataMap;

    fn remote_context() -> (Context, TraceId, SpanId) {
        let trace_id = TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
        let span_id = SpanId::from_hex("00f067aa0ba902b7").unwrap();
        let sc = SpanContext::new(
            trace_id,
            span_id,
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        (
            Context::new().with_remote_span_context(sc),
            trace_id,
            span_id,
        )
    }

    #[test]
    fn inject_then_extract_keeps_trace_and_span_id() {
        let (cx, trace_id, span_id) = remote_context();
        let mut md = MetadataMap::new();
        inject(&cx, &mut md);
        assert_eq!(
            md.get("traceparent").unwrap().to_str().unwrap(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        let back = extract_parent(&md);
        let span = back.span();
        let sc = span.span_context();
        assert!(sc.is_valid());
        assert!(sc.is_remote());
        assert_eq!(sc.trace_id(), trace_id);
        assert_eq!(sc.span_id(), span_id);
        assert!(sc.is_sampled());
    }

    #[test]
    fn inject_map_then_extract_map_round_trips() {
        let (cx, trace_id, span_id) = remote_context();
        let map = inject_map(&cx);
        assert_eq!(
            map.get("traceparent").map(String::as_str),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        let back = extract_map(&map);
        let span = back.span();
        let sc = span.span_context();
        assert!(sc.is_valid());
        assert!(sc.is_remote());
        assert_eq!(sc.trace_id(), trace_id);
        assert_eq!(sc.span_id(), span_id);
        assert!(sc.is_sampled());
    }

    #[test]
    fn map_carrier_is_empty_without_a_span() {
        assert!(inject_map(&Context::new()).is_empty());
        assert!(
            !extract_map(&HashMap::new())
                .span()
                .span_context()
                .is_valid()
        );
    }

    #[test]
    fn extract_without_traceparent_is_empty() {
        let cx = extract_parent(&MetadataMap::new());
        assert!(!cx.span().span_context().is_valid());
    }

    #[test]
    fn extract_ignores_malformed_traceparent() {
        let mut md = MetadataMap::new();
        md.insert("traceparent", "00-zz-00f067aa0ba902b7-01".parse().unwrap());
        assert!(!extract_parent(&md).span().span_context().is_valid());
    }

    #[test]
    fn interceptor_without_span_adds_nothing() {
        use tonic::service::Interceptor;
        let req = TraceContextInterceptor
            .call(tonic::Request::new(()))
            .unwrap();
        assert!(req.metadata().get("traceparent").is_none());
    }

    #[test]
    fn server_span_reads_http_headers() {
        let (cx, trace_id, _) = remote_context();
        let mut req = http::Request::builder()
            .uri("http://x/clb.v1.Writer/Apply")
            .body(())
            .unwrap();
        inject_headers(&cx, req.headers_mut());
        assert_eq!(
            extract_parent_headers(req.headers())
                .span()
                .span_context()
                .trace_id(),
            trace_id
        );
        // No subscriber here: the span is disabled, but building it must not panic.
        let _ = grpc_server_span(&req);
        assert_eq!(
            split_grpc_path("/clb.v1.Writer/Apply"),
            ("clb.v1.Writer", "Apply")
        );
    }

    #[test]
    fn server_span_is_a_child_of_the_incoming_traceparent() {
        let (cx, trace_id, parent_span_id) = remote_context();
        let mut req = http::Request::builder()
            .uri("http://x/clb.v1.Admin/Status")
            .body(())
            .unwrap();
        inject_headers(&cx, req.headers_mut());
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let span = grpc_server_span(&req);
            let _entered = span.enter();
            let own = current_context();
            let own = own.span();
            let own = own.span_context();
            assert_eq!(own.trace_id(), trace_id);
            assert_ne!(own.span_id(), parent_span_id);
            // A client call made inside the handler carries the same trace onwards.
            use tonic::service::Interceptor;
            let out = TraceContextInterceptor
                .call(tonic::Request::new(()))
                .unwrap();
            let next = extract_parent(out.metadata());
            assert_eq!(next.span().span_context().trace_id(), trace_id);
            assert_eq!(next.span().span_context().span_id(), own.span_id());
        });
    }
}
