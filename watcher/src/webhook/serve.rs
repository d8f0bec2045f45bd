//! HTTPS serving: the `POST /mutate-pods` handler ([`Webhook`]), a TLS listener for axum
//! ([`TlsListener`]), [`serve`] and the whole process ([`run`]).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use kube::core::DynamicObject;
use kube::core::admission::{
    AdmissionRequest, AdmissionResponse, AdmissionReview, META_API_VERSION_V1, META_KIND,
};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::{
    Args, HANDSHAKE_TIMEOUT, MAX_BODY_BYTES, MUTATE_PATH, Outcome, ReloadingCertificate, Stores,
    WebhookMetrics, admit, review_json,
};
use crate::translate::TranslatorConfig;

struct Inner {
    stores: Stores,
    config: TranslatorConfig,
    metrics: Arc<WebhookMetrics>,
    /// Whether "not synced yet" was logged (it is logged once).
    told_not_ready: AtomicBool,
}

/// The webhook's request handling: AdmissionReview bodies in, AdmissionReview answers out. Cheap
/// to clone.
#[derive(Clone)]
pub struct Webhook {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("stores", &self.inner.stores)
            .field("config", &self.inner.config)
            .finish()
    }
}

/// Why a request body is not an `admission.k8s.io/v1` `AdmissionReview` with a request (answered
/// `400 Bad Request` with this text).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// Not JSON.
    #[error("the body is not JSON: {0}")]
    NotJson(serde_json::Error),
    /// JSON, but not an object.
    #[error("the body is not a JSON object (an AdmissionReview)")]
    NotAnObject,
    /// Another apiVersion or kind.
    #[error(
        "apiVersion {api_version} and kind {kind}: expected {META_API_VERSION_V1} {META_KIND} \
         (admissionReviewVersions: [\"v1\"])"
    )]
    WrongType {
        /// The apiVersion given, quoted, or `(none)`.
        api_version: String,
        /// The kind given, quoted, or `(none)`.
        kind: String,
    },
    /// No `request`.
    #[error("the AdmissionReview has no request object")]
    NoRequest,
    /// No `request.uid`.
    #[error("request.uid is missing or not a non-empty string")]
    NoUid,
    /// The request does not decode.
    #[error("the AdmissionReview's request does not decode: {0}")]
    Undecodable(String),
}

/// Parses a request body: an `admission.k8s.io/v1` `AdmissionReview` with a `request`. The error
/// says precisely what is wrong.
fn parse_review(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, ReviewError> {
    let value: Value = serde_json::from_slice(body).map_err(ReviewError::NotJson)?;
    let Some(obj) = value.as_object() else {
        return Err(ReviewError::NotAnObject);
    };
    let api_version = obj.get("apiVersion").and_then(Value::as_str);
    let kind = obj.get("kind").and_then(Value::as_str);
    if api_version != Some(META_API_VERSION_V1) || kind != Some(META_KIND) {
        let quoted = |v: Option<&str>| v.map_or("(none)".to_owned(), |v| format!("{v:?}"));
        return Err(ReviewError::WrongType {
            api_version: quoted(api_version),
            kind: quoted(kind),
        });
    }
    let Some(request) = obj.get("request").and_then(Value::as_object) else {
        return Err(ReviewError::NoRequest);
    };
    if request
        .get("uid")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(ReviewError::NoUid);
    }
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_value(value).map_err(|e| ReviewError::Undecodable(e.to_string()))?;
    review
        .try_into()
        .map_err(|e: kube::core::admission::ConvertAdmissionReviewError| {
            ReviewError::Undecodable(e.to_string())
        })
}

impl Webhook {
    /// The handler answering from `stores`, with the class rules of `config`, counting into
    /// `metrics`.
    pub fn new(stores: Stores, config: TranslatorConfig, metrics: Arc<WebhookMetrics>) -> Self {
        Self {
            inner: Arc::new(Inner {
                stores,
                config,
                metrics,
                told_not_ready: AtomicBool::new(false),
            }),
        }
    }

    /// The metrics counted into.
    pub fn metrics(&self) -> &Arc<WebhookMetrics> {
        &self.inner.metrics
    }

    /// The stores answered from.
    pub fn stores(&self) -> &Stores {
        &self.inner.stores
    }

    /// Whether the stores are synced (before that, every pod is allowed without a patch).
    pub fn is_ready(&self) -> bool {
        let ready = self.inner.stores.is_ready();
        self.inner.metrics.set_synced(ready);
        ready
    }

    /// The answer to one request body: the AdmissionReview answer as JSON (always `allowed:
    /// true`), or, for a body that is not an `admission.k8s.io/v1` AdmissionReview with a request,
    /// the reason (answered `400 Bad Request`). Counts the answer in
    /// `clb_webhook_admissions_total` and logs what was done.
    pub fn answer(&self, body: &[u8]) -> Result<Value, ReviewError> {
        let metrics = &self.inner.metrics;
        let request = match parse_review(body) {
            Ok(r) => r,
            Err(e) => {
                metrics.admission("error");
                tracing::warn!(error = %e, "malformed AdmissionReview: answered 400");
                return Err(e);
            }
        };
        if !self.is_ready() {
            if !self.inner.told_not_ready.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "Services and Namespaces not listed yet: pods are allowed without the \
                     readiness gate until they are (fail open)"
                );
            }
            metrics.admission("unchanged");
            return Ok(review_json(AdmissionResponse::from(&request)));
        }
        let namespace = request.namespace.clone().unwrap_or_default();
        let stores = &self.inner.stores;
        let ns_labels = stores.namespace_labels(&namespace);
        let services = stores.services_in(&namespace);
        let (response, outcome) = admit(
            &request,
            ns_labels.as_ref(),
            services.iter().map(|s| &**s),
            &self.inner.config,
        );
        metrics.admission(outcome.result());
        let uid = &request.uid;
        match &outcome {
            Outcome::Patched { services } => tracing::info!(
                uid = %uid,
                namespace = %namespace,
                pod = %super::admission::pod_name(&request),
                services = ?services,
                dry_run = request.dry_run,
                "pod gets the readiness gate"
            ),
            Outcome::Unchanged(why) => {
                tracing::debug!(uid = %uid, namespace = %namespace, reason = %why, "pod unchanged")
            }
            Outcome::Error(why) => tracing::warn!(
                uid = %uid,
                namespace = %namespace,
                error = %why,
                "pod allowed without the readiness gate"
            ),
        }
        Ok(review_json(response))
    }

    /// The routes: `POST /mutate-pods` (bodies up to [`MAX_BODY_BYTES`]).
    pub fn router(&self) -> Router {
        Router::new()
            .route(MUTATE_PATH, post(mutate))
            .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
            .with_state(self.clone())
    }

    /// The `--metrics-listen` routes: `/metrics`, `/healthz`, `/readyz` (ready once the stores
    /// are synced).
    pub fn metrics_router(&self) -> Router {
        let (a, b) = (self.clone(), self.clone());
        clb_telemetry::metrics::router(
            move || {
                a.is_ready();
                a.inner.metrics.encode()
            },
            move || b.is_ready(),
        )
    }
}

async fn mutate(State(webhook): State<Webhook>, body: Bytes) -> Response {
    match webhook.answer(&body) {
        Ok(review) => axum::Json(review).into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    }
}

/// A TLS listener for [`axum::serve()`]: TCP connections are accepted and their handshakes run in
/// tasks of their own (each bounded by [`HANDSHAKE_TIMEOUT`]), so a slow or silent client holds
/// up nobody; established TLS streams are handed to axum.
#[derive(Debug)]
pub struct TlsListener {
    streams: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: tokio::task::AbortHandle,
}

impl TlsListener {
    /// Accepts on `listener` with the rustls `config` (in a task, until this is dropped).
    pub fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let (tx, streams) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        let accepting = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors and the like: do not spin.
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(peer = %peer, error = %e, "TLS handshake failed")
                        }
                        Err(_) => tracing::warn!(
                            peer = %peer,
                            "TLS handshake not done within {HANDSHAKE_TIMEOUT:?}: connection closed"
                        ),
                    }
                });
            }
        })
        .abort_handle();
        Ok(Self {
            streams,
            local,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.streams.recv().await {
            Some(s) => s,
            // The accepting task is gone only once this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Serves `webhook` over HTTPS on `listener`, presenting `certificate` (whatever it holds at each
/// handshake), until `shutdown` resolves; then finishes the open requests.
pub async fn serve(
    listener: TcpListener,
    certificate: Arc<ReloadingCertificate>,
    webhook: Webhook,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let config = certificate.server_config()?;
    let tls = TlsListener::new(listener, config)?;
    tracing::info!(
        listen = %tls.local,
        path = MUTATE_PATH,
        "serving the readiness-gate admission webhook (HTTPS)"
    );
    axum::serve(tls, webhook.router())
        .with_graceful_shutdown(shutdown)
        .await
        .context("serving the webhook")
}

/// The whole of `clb-webhook`, with `certificate` loaded from `--tls-cert` and `--tls-key`
/// ([`ReloadingCertificate::load`]): binds `--listen`, watches Services and Namespaces through
/// `client`, serves the metrics on `--metrics-listen`, re-reads the certificate every
/// `--tls-reload-interval`, and serves the webhook until `shutdown` resolves.
pub async fn run(
    args: Args,
    certificate: Arc<ReloadingCertificate>,
    client: kube::Client,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("--listen {}: cannot bind the webhook listener", args.listen))?;
    let (stores, watches) = Stores::reflect(client);
    let webhook = Webhook::new(
        stores.clone(),
        args.class_config(),
        Arc::new(WebhookMetrics::new()),
    );
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(watches);
    tasks.spawn(certificate.clone().run_reloads(args.tls_reload_interval));
    tasks.spawn({
        let webhook = webhook.clone();
        async move {
            if stores.wait_until_ready().await.is_ok() {
                webhook.is_ready();
                tracing::info!("Services and Namespaces listed: pods get the readiness gate");
            }
        }
    });
    if let Some(addr) = args.metrics_listen {
        // Stops with the process.
        clb_telemetry::metrics::spawn(addr, webhook.metrics_router(), std::future::pending())
            .await?;
    }
    let served = serve(listener, certificate, webhook, shutdown).await;
    tasks.abort_all();
    served
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Namespace, Service};
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn review(object: Value) -> Value {
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "shop",
                "operation": "CREATE",
                "userInfo": {"username": "alice"},
                "object": object,
                "oldObject": null,
                "dryRun": false
            }
        })
    }

    fn pod() -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "web-1", "namespace": "shop", "labels": {"app": "web"}},
               "spec": {"containers": [{"name": "app", "image": "nginx"}]}})
    }

    /// A webhook whose stores are fed here; `listed`: whether their first list is complete.
    fn webhook(listed: bool) -> Webhook {
        let (services, mut sw) = reflector::store::<Service>();
        let (namespaces, mut nw) = reflector::store::<Namespace>();
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"type": "LoadBalancer", "selector": {"app": "web"}}
        }))
        .unwrap();
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": "shop",
                         "labels": {"clb.azure.com/readiness-gate-inject": "enabled"}}
        }))
        .unwrap();
        sw.apply_watcher_event(&Event::Init);
        sw.apply_watcher_event(&Event::InitApply(svc));
        nw.apply_watcher_event(&Event::Init);
        nw.apply_watcher_event(&Event::InitApply(ns));
        if listed {
            sw.apply_watcher_event(&Event::InitDone);
            nw.apply_watcher_event(&Event::InitDone);
        }
        // The stores stay readable once their writers are gone.
        Webhook::new(
            Stores::new(services, namespaces),
            TranslatorConfig::default(),
            Arc::new(WebhookMetrics::new()),
        )
    }

    #[test]
    fn malformed_bodies_are_refused_with_a_precise_reason() {
        let w = webhook(true);
        let cases: [(Vec<u8>, &str); 6] = [
            (b"{not json".to_vec(), "the body is not JSON"),
            (b"[1]".to_vec(), "not a JSON object"),
            (
                serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1beta1",
                                           "kind": "AdmissionReview", "request": {}}))
                .unwrap(),
                "apiVersion \"admission.k8s.io/v1beta1\" and kind \"AdmissionReview\": expected",
            ),
            (
                serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1",
                                           "kind": "AdmissionReview"}))
                .unwrap(),
                "no request object",
            ),
            (
                serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1",
                                           "kind": "AdmissionReview", "request": {"uid": ""}}))
                .unwrap(),
                "request.uid is missing",
            ),
            (
                {
                    let mut r = review(pod());
                    r["request"]["operation"] = json!("EXPLODE");
                    serde_json::to_vec(&r).unwrap()
                },
                "the AdmissionReview's request does not decode",
            ),
        ];
        for (body, want) in cases {
            let e = w.answer(&body).expect_err("refused").to_string();
            assert!(e.contains(want), "{e:?} does not contain {want:?}");
        }
        assert_eq!(w.metrics().admissions("error"), 6);
    }

    #[test]
    fn before_the_stores_are_listed_pods_are_allowed_unchanged() {
        let w = webhook(false);
        assert!(!w.is_ready());
        let answer = w
            .answer(&serde_json::to_vec(&review(pod())).unwrap())
            .unwrap();
        assert_eq!(answer["response"]["allowed"], true);
        assert_eq!(answer["response"]["uid"], "u-1");
        assert!(answer["response"].get("patch").is_none(), "{answer}");
        assert_eq!(w.metrics().admissions("unchanged"), 1);
        let w = webhook(true);
        assert!(w.is_ready());
        let answer = w
            .answer(&serde_json::to_vec(&review(pod())).unwrap())
            .unwrap();
        assert_eq!(answer["response"]["patchType"], "JSONPatch", "{answer}");
        assert!(answer["response"]["patch"].is_string(), "{answer}");
        assert_eq!(w.metrics().admissions("patched"), 1);
        // An object that is not a Pod: allowed, counted as an error.
        let mut bad = pod();
        bad["spec"]["containers"] = json!(3);
        let answer = w
            .answer(&serde_json::to_vec(&review(bad)).unwrap())
            .unwrap();
        assert_eq!(answer["response"]["allowed"], true);
        assert_eq!(w.metrics().admissions("error"), 1);
    }
}
