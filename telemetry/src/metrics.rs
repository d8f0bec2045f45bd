//! The HTTP endpoint every clb binary serves with `--metrics-listen`: `GET /metrics` (Prometheus text
//! 0.0.4 by default, OpenMetrics 1.0 when the `Accept` header asks for `application/openmetrics-text`),
//! `GET /healthz` (the process is alive) and `GET /readyz` (ready to do its job; 503 otherwise).
//!
//! Each binary keeps its own [`prometheus_client::registry::Registry`] (names prefixed `clb_`),
//! registers [`register_build_info`] in it, and passes [`router`] a closure that brings its gauges up
//! to date and encodes the registry ([`encode`]). The registry encodes OpenMetrics; the Prometheus
//! text format is derived from it by [`openmetrics_to_prometheus`] (counter families take their
//! `_total` name in `# HELP`/`# TYPE`, so that `promtool check metrics` finds the help of every
//! sample).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Content type of the OpenMetrics text format.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Content type of the Prometheus text exposition format 0.0.4.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The version label of `clb_build_info`: the workspace version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit label of `clb_build_info`: `CLB_GIT_COMMIT` at build time, or `unknown`.
pub const COMMIT: &str = match option_env!("CLB_GIT_COMMIT") {
    Some(c) if !c.is_empty() => c,
    _ => "unknown",
};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    commit: String,
}

/// Registers `build_info{version,commit}` (a gauge always 1) in `registry` (`clb_build_info` in a
/// registry prefixed `clb`).
pub fn register_build_info(registry: &mut Registry) {
    let family = Family::<BuildLabels, Gauge>::default();
    family
        .get_or_create(&BuildLabels {
            version: VERSION.to_owned(),
            commit: COMMIT.to_owned(),
        })
        .set(1);
    registry.register(
        "build_info",
        "Build of this binary: always 1, labelled with its version and git commit",
        family,
    );
}

/// `registry` in the OpenMetrics text format.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// Rewrites OpenMetrics text (as [`encode`] writes it) in the Prometheus text format 0.0.4: counter
/// families are named with their `_total` suffix, `info` families become gauges named `_info`,
/// `unknown` becomes `untyped`, `# UNIT` and `# EOF` lines, `_created` samples of counters and
/// exemplars are dropped.
pub fn openmetrics_to_prometheus(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    // The HELP line waiting for its family's TYPE (HELP comes first in what prometheus-client writes).
    let mut help: Option<(String, String)> = None;
    let mut counter: Option<String> = None;
    let flush_help = |out: &mut String, help: &mut Option<(String, String)>| {
        if let Some((name, text)) = help.take() {
            out.push_str(&format!("# HELP {name} {}\n", om_help_to_prom(&text)));
        }
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush_help(&mut out, &mut help);
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name.to_owned(), text.to_owned()));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let (prom_name, prom_kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "gauge" | "histogram" | "summary" => (name.to_owned(), kind),
                _ => (name.to_owned(), "untyped"),
            };
            counter = (kind == "counter").then(|| name.to_owned());
            if let Some((h_name, text)) = help.take() {
                let h_name = if h_name == name {
                    prom_name.clone()
                } else {
                    h_name
                };
                out.push_str(&format!("# HELP {h_name} {}\n", om_help_to_prom(&text)));
            }
            out.push_str(&format!("# TYPE {prom_name} {prom_kind}\n"));
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
        } else if line.starts_with('#') {
            flush_help(&mut out, &mut help);
            out.push_str(line);
            out.push('\n');
        } else {
            flush_help(&mut out, &mut help);
            let sample = match line.find(" # ") {
                Some(i) => &line[..i],
                None => line,
            };
            let name_end = sample.find(['{', ' ']).unwrap_or(sample.len());
            if counter
                .as_deref()
                .is_some_and(|c| sample[..name_end] == format!("{c}_created"))
            {
                continue;
            }
            out.push_str(sample);
            out.push('\n');
        }
    }
    flush_help(&mut out, &mut help);
    out
}

/// OpenMetrics escapes `\`, newline and `"` in HELP; the Prometheus text format only the first two.
fn om_help_to_prom(text: &str) -> String {
    text.replace("\\\"", "\"")
}

/// Whether an `Accept` header value asks for OpenMetrics.
pub fn wants_openmetrics(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|part| {
            let mut params = part.split(';').map(str::trim);
            let media = params.next().unwrap_or("");
            let q_zero = params.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f64>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            media.eq_ignore_ascii_case("application/openmetrics-text") && !q_zero
        })
}

/// Brings the gauges up to date and encodes the registry in OpenMetrics text.
pub type Encoder = Arc<dyn Fn() -> String + Send + Sync>;
/// Whether the binary is ready to do its job.
pub type Readiness = Arc<dyn Fn() -> bool + Send + Sync>;

#[derive(Clone)]
struct Endpoint {
    encode: Encoder,
    ready: Readiness,
}

async fn metrics_handler(State(e): State<Endpoint>, headers: HeaderMap) -> impl IntoResponse {
    let encode = e.encode.clone();
    // Refreshing gauges may take locks: off the async workers.
    let text = tokio::task::spawn_blocking(move || encode())
        .await
        .unwrap_or_default();
    if wants_openmetrics(&headers) {
        ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], text)
    } else {
        (
            [(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)],
            openmetrics_to_prometheus(&text),
        )
    }
}

async fn readyz_handler(State(e): State<Endpoint>) -> impl IntoResponse {
    if (e.ready)() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

/// The routes: `GET /metrics` (`encode()`, negotiated), `GET /healthz` (always 200) and
/// `GET /readyz` (200 while `ready()` holds, else 503).
pub fn router(
    encode: impl Fn() -> String + Send + Sync + 'static,
    ready: impl Fn() -> bool + Send + Sync + 'static,
) -> Router {
    let endpoint = Endpoint {
        encode: Arc::new(encode),
        ready: Arc::new(ready),
    };
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { (StatusCode::OK, "ok\n") }))
        .route("/readyz", get(readyz_handler))
        .with_state(endpoint)
}

/// Binds the metrics listener on `addr`, with an error that names the flag and the address.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics-listen {addr}: cannot bind the metrics listener"))
}

/// Serves `router` on `listener` until `shutdown` resolves, then finishes open requests.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Binds `addr` and serves `router` on it in a task until `shutdown` resolves; returns the bound
/// address (the port chosen when `addr` has port 0) and the task.
pub async fn spawn(
    addr: SocketAddr,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let listener = bind(addr).await?;
    let local = listener
        .local_addr()
        .context("the metrics listener's address")?;
    tracing::info!(metrics = %local, "serving /metrics, /healthz and /readyz");
    Ok((local, tokio::spawn(serve(listener, router, shutdown))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::histogram::Histogram;

    fn sample_registry() -> Registry {
        let mut r = Registry::with_prefix("clb");
        register_build_info(&mut r);
        let c = Counter::<u64>::default();
        c.inc_by(3);
        r.register("things", "Things \"done\"", c);
        let h = Histogram::new([0.5, 1.0]);
        h.observe(0.7);
        r.register_with_unit(
            "wait",
            "Waits",
            prometheus_client::registry::Unit::Seconds,
            h,
        );
        r
    }

    #[test]
    fn counters_take_their_total_name_and_om_only_lines_go() {
        let om = encode(&sample_registry());
        assert!(om.contains("# HELP clb_things Things"), "{om}");
        let prom = openmetrics_to_prometheus(&om);
        let lines: Vec<&str> = prom.lines().collect();
        for want in [
            "# HELP clb_things_total Things \"done\".",
            "# TYPE clb_things_total counter",
            "clb_things_total 3",
            "# TYPE clb_wait_seconds histogram",
            "clb_wait_seconds_bucket{le=\"1.0\"} 1",
            "# TYPE clb_build_info gauge",
        ] {
            assert!(lines.contains(&want), "missing {want:?} in\n{prom}");
        }
        assert!(
            !prom.contains("# EOF") && !prom.contains("# UNIT"),
            "{prom}"
        );
        assert!(
            prom.contains(&format!(
                "clb_build_info{{version=\"{VERSION}\",commit=\"{COMMIT}\"}} 1"
            )),
            "{prom}"
        );
    }

    #[test]
    fn accept_header_negotiation() {
        let mut h = HeaderMap::new();
        assert!(!wants_openmetrics(&h));
        h.insert(
            header::ACCEPT,
            "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;q=0.4"
                .parse()
                .unwrap(),
        );
        assert!(wants_openmetrics(&h));
        h.insert(header::ACCEPT, "text/plain;version=0.0.4".parse().unwrap());
        assert!(!wants_openmetrics(&h));
        h.insert(
            header::ACCEPT,
            "application/openmetrics-text;q=0".parse().unwrap(),
        );
        assert!(!wants_openmetrics(&h));
    }
}
