//! The typed async client of the state server: one [`Client`] per server (a shared HTTP/2 channel,
//! cheap to clone), a [`Writer`] per writer of desired state (single updates, bulk streaming,
//! resync), and the Admin reads.
//!
//! ```no_run
//! # async fn demo() -> Result<(), clb_client::client::ClientError> {
//! use clb_client::client::{Client, ConnectOptions, scope};
//! use clb_client::updates;
//! let client = Client::connect(ConnectOptions::new("http://127.0.0.1:50051")).await?;
//! let mut writer = client.writer("watcher");
//! writer.resync(scope::all(), vec![updates::service_add("svc-a", &[])]).await?;
//! let outcome = writer
//!     .apply(vec![updates::pod_add("10.1.0.5", "10.0.0.1", "", "default/web-0", "")])
//!     .await?;
//! assert!(outcome.rejected.is_empty(), "{}", outcome.describe_rejected());
//! # Ok(()) }
//! ```

use std::time::Duration;

use crate::token::{CallInterceptor, TokenFile};
use clb_proto::v1::admin_client::AdminClient;
use clb_proto::v1::writer_client::WriterClient;
use clb_proto::v1::{
    ApplyRequest, ClusterTopology, DiffQuery, LocationQuery, LocationState, PendingDiffResponse,
    ResyncChunk, ResyncHeader, ResyncRequest, ResyncScope, ServiceQuery, ServiceState,
    ServiceStates, SessionRequest, StatusRequest, StatusResponse, Update, WatchServicesRequest,
    WriterSession, resync_request::Part,
};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::tls::{CaBundle, Dialer, TlsConnector};
use tracing::Instrument as _;

mod awaits;
mod error;
mod outcomes;
pub use error::ClientError;
pub use outcomes::{ApplyOutcome, Rejected, ResyncOutcome, scope};

/// The channel every call goes over: it sends the caller's trace context (W3C `traceparent`) and
/// its bearer token, if any ([`crate::token`]).
type Traced = InterceptedService<Channel, CallInterceptor>;

/// Updates per `Apply` batch and per resync chunk (below the server's default batch limit).
pub const CHUNK: usize = 2_000;

/// TLS to the state server ([`crate::tls`]).
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// The CA bundle that signs the server's certificate (a file is re-read when it changes).
    /// Required: this build trusts no system roots.
    pub ca: Option<CaBundle>,
    /// The name to check in the server's certificate; `None` uses the endpoint's host.
    pub domain: Option<String>,
    /// PEM certificate and key of this client, for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// How to reach the state server.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The server's URL, e.g. `http://127.0.0.1:50051` (`https://` with [`ConnectOptions::tls`]).
    pub endpoint: String,
    /// Connection attempts before giving up (at least 1).
    pub attempts: u32,
    /// Delay before the second attempt; doubled after each failure up to `max_backoff`, each delay
    /// drawn from the upper half of its step ([`crate::backoff`]).
    pub initial_backoff: Duration,
    /// The largest delay between attempts.
    pub max_backoff: Duration,
    /// Timeout of one connection attempt.
    pub connect_timeout: Duration,
    /// Deadline of each unary call (`None`: none).
    pub request_timeout: Option<Duration>,
    /// TLS settings; `None` is plaintext HTTP/2. With TLS, an `http://` endpoint is upgraded to
    /// `https://` (never plaintext by accident; [`clb_proto::endpoint_url`]).
    pub tls: Option<TlsOptions>,
    /// The gateway every call names; empty is the server's default gateway.
    pub gateway: String,
    /// The file of the bearer token every call sends (`authorization: Bearer <token>`), re-read
    /// when it changes; `None` sends none.
    pub token_file: Option<std::path::PathBuf>,
    /// `--insecure-plaintext`: send the token over plaintext to a host that is not loopback
    /// (refused otherwise: [`crate::tls::check_plaintext`]).
    pub insecure_plaintext: bool,
}

impl ConnectOptions {
    /// Defaults: 5 attempts, 100 ms doubling to 5 s, 5 s connect timeout, 30 s per call, plaintext,
    /// the default gateway.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Some(Duration::from_secs(30)),
            tls: None,
            gateway: String::new(),
            token_file: None,
            insecure_plaintext: false,
        }
    }

    /// Retries the connection for as long as it takes (a long-running writer's start-up).
    pub fn retry_forever(mut self) -> Self {
        self.attempts = u32::MAX;
        self
    }

    fn dialer(&self) -> Result<Dialer, ClientError> {
        let invalid = |reason: String| ClientError::InvalidEndpoint {
            endpoint: self.endpoint.clone(),
            reason,
        };
        crate::tls::check_plaintext(
            &self.endpoint,
            self.tls.is_some() || self.endpoint.to_ascii_lowercase().starts_with("https://"),
            self.token_file.as_deref(),
            self.insecure_plaintext,
        )
        .map_err(invalid)?;
        // With TLS options an `http://` URL is dialled as `https://` (never plaintext by accident).
        let url = clb_proto::endpoint_url(&self.endpoint, self.tls.is_some());
        let secure = url.to_ascii_lowercase().starts_with("https://");
        let mut ep = Endpoint::from_shared(crate::tls::tonic_url(&url))
            .map_err(|e| invalid(e.to_string()))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(true);
        if let Some(t) = self.request_timeout {
            ep = ep.timeout(t);
        }
        let tls = if secure {
            let options = self.tls.clone().unwrap_or_default();
            let ca = options.ca.ok_or_else(|| {
                invalid(
                    "TLS needs the CA bundle that signs the server's certificate (--tls-ca): \
                     this build trusts no system roots"
                        .into(),
                )
            })?;
            let host = ep.uri().host().unwrap_or_default().to_owned();
            let connector = TlsConnector::new(
                ca,
                &host,
                options.domain.as_deref(),
                options.identity.as_ref(),
            )
            .map_err(invalid)?;
            Some(connector)
        } else {
            None
        };
        Ok(Dialer { endpoint: ep, tls })
    }
}

/// A connection to one state server.
#[derive(Debug, Clone)]
pub struct Client {
    channel: Channel,
    gateway: String,
    endpoint: String,
    calls: CallInterceptor,
}

impl Client {
    /// Connects, retrying with exponential backoff as `options` say.
    pub async fn connect(options: ConnectOptions) -> Result<Self, ClientError> {
        let endpoint = options.dialer()?;
        let attempts = options.attempts.max(1);
        let mut backoff =
            crate::backoff::Backoff::new(options.initial_backoff, options.max_backoff);
        let mut attempt = 1;
        loop {
            match endpoint.connect().await {
                Ok(channel) => {
                    return Ok(Self {
                        channel,
                        gateway: options.gateway,
                        endpoint: options.endpoint,
                        calls: CallInterceptor::new(options.token_file.map(TokenFile::new)),
                    });
                }
                Err(source) if attempt >= attempts => {
                    return Err(ClientError::Connect {
                        endpoint: options.endpoint,
                        attempts: attempt,
                        source,
                    });
                }
                Err(e) => {
                    tracing::debug!(endpoint = %options.endpoint, attempt, error = %e, "connect failed; retrying");
                    tokio::time::sleep(backoff.next_delay(false)).await;
                    attempt += 1;
                }
            }
        }
    }

    /// A client over an existing channel (e.g. a lazily connected one).
    pub fn from_channel(channel: Channel, gateway: impl Into<String>) -> Self {
        Self {
            channel,
            gateway: gateway.into(),
            endpoint: String::new(),
            calls: CallInterceptor::default(),
        }
    }

    /// The same connection, sending the bearer token of `token` with every call.
    pub fn with_token(self, token: TokenFile) -> Self {
        Self {
            calls: CallInterceptor::new(Some(token)),
            ..self
        }
    }

    /// What every call of this client adds (trace context, bearer token): for other clients over
    /// the same channel.
    pub fn interceptor(&self) -> CallInterceptor {
        self.calls.clone()
    }

    /// The endpoint this client was connected to (empty for [`Client::from_channel`]).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The gateway the calls name (empty: the server's default).
    pub fn gateway(&self) -> &str {
        &self.gateway
    }

    /// The same connection, naming another gateway.
    pub fn with_gateway(&self, gateway: impl Into<String>) -> Self {
        Self {
            gateway: gateway.into(),
            ..self.clone()
        }
    }

    /// A writer of desired state named `writer` (e.g. `watcher`, `node-agent/<node>`).
    pub fn writer(&self, writer: impl Into<String>) -> Writer {
        Writer {
            client: WriterClient::with_interceptor(self.channel.clone(), self.calls.clone()),
            gateway: self.gateway.clone(),
            name: writer.into(),
            next_batch: 1,
            chunk: CHUNK,
            resync_sequence: 0,
        }
    }

    fn admin(&self) -> AdminClient<Traced> {
        AdminClient::with_interceptor(self.channel.clone(), self.calls.clone())
    }

    /// `grpc.health.v1.Health/Check` of the server as a whole (`""`): whether it serves (a
    /// standby answers `NOT_SERVING`). One unary call that does nothing else, which `clbctl load
    /// --agent-call health-check` uses to measure what a call costs the server by itself.
    pub async fn health_check(&self) -> Result<bool, ClientError> {
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::health_client::HealthClient;
        let mut health = HealthClient::with_interceptor(self.channel.clone(), self.calls.clone());
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map_err(ClientError::rpc("Health.Check"))?
            .into_inner()
            .status;
        Ok(status == ServingStatus::Serving as i32)
    }

    /// `Admin.Status`: gateways, workers, writers.
    pub async fn status(&self) -> Result<StatusResponse, ClientError> {
        Ok(self
            .admin()
            .status(StatusRequest {})
            .await
            .map_err(ClientError::rpc("Admin.Status"))?
            .into_inner())
    }

    /// `Admin.GetLocation`: desired and actual addresses of one location (a node IP).
    pub async fn location(&self, location: &str) -> Result<LocationState, ClientError> {
        Ok(self
            .admin()
            .get_location(LocationQuery {
                gateway: self.gateway.clone(),
                location: location.to_owned(),
            })
            .await
            .map_err(ClientError::rpc("Admin.GetLocation"))?
            .into_inner())
    }

    /// `Admin.GetService`: desired and actual state of one service (an inbound service's `id`, its
    /// Service UID, or an egress's).
    pub async fn service(&self, id: &str) -> Result<ServiceState, ClientError> {
        Ok(self
            .admin()
            .get_service(ServiceQuery {
                gateway: self.gateway.clone(),
                service_id: id.to_owned(),
            })
            .await
            .map_err(ClientError::rpc("Admin.GetService"))?
            .into_inner())
    }

    /// `Admin.PendingDiff`: what is desired but not yet confirmed by NRP (at most `limit` entries
    /// per list; 0 lets the server choose).
    pub async fn pending_diff(&self, limit: u32) -> Result<PendingDiffResponse, ClientError> {
        Ok(self
            .admin()
            .pending_diff(DiffQuery {
                gateway: self.gateway.clone(),
                limit,
            })
            .await
            .map_err(ClientError::rpc("Admin.PendingDiff"))?
            .into_inner())
    }
}

/// A writer of desired state (`watcher`, `node-agent/<node>`, …) in one gateway.
#[derive(Debug, Clone)]
pub struct Writer {
    client: WriterClient<Traced>,
    gateway: String,
    name: String,
    next_batch: u64,
    chunk: usize,
    /// The `resync_sequence` of the next resync's header (0: none).
    resync_sequence: u64,
}

/// A `resync_sequence` for this process's next resync ([`Writer::with_resync_sequence`]):
/// increasing, and in practice across restarts too (it starts from the wall clock in
/// microseconds), so that the server's echo of a resync sent before a restart never looks newer
/// than one sent after it.
pub fn next_resync_sequence() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX / 2));
    LAST.fetch_max(wall, Ordering::Relaxed);
    LAST.fetch_add(1, Ordering::Relaxed) + 1
}

impl Writer {
    /// Gives the next resyncs the sequence `sequence` (`ResyncHeader.resync_sequence`): the server
    /// echoes the last one it recorded in `WriterSession.resync_sequence`, so that the writer can
    /// tell a session message built before its resync landed (docs/protocol.md).
    pub fn with_resync_sequence(mut self, sequence: u64) -> Self {
        self.resync_sequence = sequence;
        self
    }

    /// The writer's name (the `writer` of its requests).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sets the number of updates per batch and per resync chunk (at least 1).
    pub fn with_chunk(mut self, chunk: usize) -> Self {
        self.chunk = chunk.max(1);
        self
    }

    fn request(&mut self, updates: Vec<Update>) -> ApplyRequest {
        let batch_id = self.next_batch;
        self.next_batch += 1;
        ApplyRequest {
            gateway: self.gateway.clone(),
            writer: self.name.clone(),
            batch_id,
            updates,
            dry_run: false,
        }
    }

    /// The client span of one call (its context travels as `traceparent`): the server's request span
    /// is its child, and the work units that carry the call's changes link to that.
    fn call_span(&self, rpc: &'static str, updates: usize) -> tracing::Span {
        tracing::info_span!(
            "clb.writer",
            otel.name = rpc,
            otel.kind = "client",
            rpc.system = "grpc",
            writer = %self.name,
            gateway = %self.gateway,
            updates,
        )
    }

    /// Applies one update (`Writer.Apply`).
    pub async fn apply_one(&mut self, update: Update) -> Result<ApplyOutcome, ClientError> {
        self.apply(vec![update]).await
    }

    /// Asks the server to validate `updates` without applying them (`Writer.Apply` with `dry_run`):
    /// one call, checked in order against a copy of the gateway's desired state, so an update may
    /// rely on an earlier one. The outcome says what would be applied and rejected; nothing
    /// changes. A list longer than the server's batch limit is refused whole (INVALID_ARGUMENT).
    pub async fn validate(&mut self, updates: Vec<Update>) -> Result<ApplyOutcome, ClientError> {
        let mut outcome = ApplyOutcome::default();
        let r = self.call_apply(updates, true).await?;
        outcome.add(0, r);
        Ok(outcome)
    }

    /// One unary `Writer.Apply` call of `updates`, in its client span.
    async fn call_apply(
        &mut self,
        updates: Vec<Update>,
        dry_run: bool,
    ) -> Result<clb_proto::v1::ApplyResponse, ClientError> {
        let n = updates.len();
        let mut request = self.request(updates);
        request.dry_run = dry_run;
        let span = self.call_span("Writer.Apply", n);
        Ok(self
            .client
            .apply(request)
            .instrument(span)
            .await
            .map_err(ClientError::rpc("Writer.Apply"))?
            .into_inner())
    }

    /// Applies `updates` with unary `Writer.Apply` calls of at most the chunk size, in order.
    /// Stops at the first failed call; what earlier calls applied stays applied.
    pub async fn apply(&mut self, updates: Vec<Update>) -> Result<ApplyOutcome, ClientError> {
        let mut outcome = ApplyOutcome::default();
        let mut offset = 0;
        let mut rest = updates;
        loop {
            let tail = rest.split_off(rest.len().min(self.chunk));
            let n = rest.len();
            let r = self.call_apply(rest, false).await?;
            outcome.add(offset, r);
            offset += n;
            if tail.is_empty() {
                return Ok(outcome);
            }
            rest = tail;
        }
    }

    /// Streams batches over one `Writer.ApplyStream` call (the bulk path: no round trip per
    /// batch). Positions of rejected items count across the whole stream.
    pub async fn apply_stream<S>(&mut self, batches: S) -> Result<ApplyOutcome, ClientError>
    where
        S: Stream<Item = Vec<Update>> + Send + 'static,
    {
        const RPC: &str = "Writer.ApplyStream";
        let (tx, rx) = mpsc::channel::<ApplyRequest>(16);
        let (offsets_tx, mut offsets_rx) = mpsc::unbounded_channel::<(u64, usize)>();
        let gateway = self.gateway.clone();
        let writer = self.name.clone();
        let first_batch = self.next_batch;
        let chunk = self.chunk;
        let (count_tx, count_rx) = tokio::sync::oneshot::channel::<u64>();
        let send = tokio::spawn(async move {
            let mut batches = std::pin::pin!(batches);
            let mut batch_id = first_batch;
            let mut offset = 0usize;
            while let Some(mut updates) = batches.next().await {
                loop {
                    let tail = updates.split_off(updates.len().min(chunk));
                    let n = updates.len();
                    let _ = offsets_tx.send((batch_id, offset));
                    let request = ApplyRequest {
                        gateway: gateway.clone(),
                        writer: writer.clone(),
                        batch_id,
                        dry_run: false,
                        updates,
                    };
                    if tx.send(request).await.is_err() {
                        let _ = count_tx.send(batch_id - first_batch);
                        return;
                    }
                    batch_id += 1;
                    offset += n;
                    if tail.is_empty() {
                        break;
                    }
                    updates = tail;
                }
            }
            let _ = count_tx.send(batch_id - first_batch);
        });
        let span = self.call_span(RPC, 0);
        let mut responses = self
            .client
            .apply_stream(ReceiverStream::new(rx))
            .instrument(span)
            .await
            .map_err(ClientError::rpc(RPC))?
            .into_inner();
        let mut outcome = ApplyOutcome::default();
        let mut offsets = std::collections::HashMap::new();
        while let Some(r) = responses.message().await.map_err(ClientError::rpc(RPC))? {
            while let Ok((id, off)) = offsets_rx.try_recv() {
                offsets.insert(id, off);
            }
            let offset = offsets.remove(&r.batch_id).unwrap_or_default();
            outcome.add(offset, r);
        }
        let _ = send.await;
        let sent = count_rx.await.unwrap_or(outcome.batches);
        self.next_batch = first_batch + sent;
        if outcome.batches < sent {
            return Err(ClientError::StreamClosed {
                rpc: RPC,
                batch_id: first_batch + outcome.batches,
            });
        }
        Ok(outcome)
    }

    /// Sends `view` as this writer's complete view of `scope` (`Writer.Resync`), in chunks: the
    /// server replaces the scope's desired state with it, so what the view no longer holds is
    /// removed.
    pub async fn resync(
        &mut self,
        scope: ResyncScope,
        view: Vec<Update>,
    ) -> Result<ResyncOutcome, ClientError> {
        self.resync_with_topology(scope, None, view).await
    }

    /// Like [`Writer::resync`], declaring the cluster's nodes and their pod writers in the header
    /// (the cluster-wide watcher, with a scope that covers services): a restarted server then
    /// removes nothing at a node's locations before that node's pod writer has resynced them.
    pub async fn resync_with_topology(
        &mut self,
        scope: ResyncScope,
        topology: Option<ClusterTopology>,
        view: Vec<Update>,
    ) -> Result<ResyncOutcome, ClientError> {
        const RPC: &str = "Writer.Resync";
        let (tx, rx) = mpsc::channel(4);
        let header = ResyncRequest {
            part: Some(Part::Header(ResyncHeader {
                gateway: self.gateway.clone(),
                writer: self.name.clone(),
                scope: Some(scope),
                topology,
                resync_sequence: self.resync_sequence,
            })),
        };
        let chunk = self.chunk;
        let span = self.call_span(RPC, view.len());
        let send = async move {
            if tx.send(header).await.is_err() {
                return;
            }
            let mut view = view;
            while !view.is_empty() {
                let rest = view.split_off(view.len().min(chunk));
                let part = ResyncRequest {
                    part: Some(Part::Chunk(ResyncChunk { updates: view })),
                };
                if tx.send(part).await.is_err() {
                    return;
                }
                view = rest;
            }
        };
        let mut client = self.client.clone();
        let call = async move { client.resync(ReceiverStream::new(rx)).await }.instrument(span);
        let ((), response) = tokio::join!(send, call);
        let r = response.map_err(ClientError::rpc(RPC))?.into_inner();
        Ok(ResyncOutcome {
            revision: r.revision,
            applied: u64::from(r.applied),
            removed: u64::from(r.removed),
            rejected: r
                .rejected
                .into_iter()
                .map(|error| Rejected {
                    position: error.index as usize,
                    error,
                })
                .collect(),
            session: r.session,
        })
    }

    /// `Writer.WatchSession`: this writer's session now, then each change; the stream ends (or
    /// breaks) when the server's state starts afresh, which means: resync.
    pub async fn watch_session(&mut self) -> Result<tonic::Streaming<WriterSession>, ClientError> {
        const RPC: &str = "Writer.WatchSession";
        let request = SessionRequest {
            gateway: self.gateway.clone(),
            writer: self.name.clone(),
        };
        let span = self.call_span(RPC, 0);
        Ok(self
            .client
            .watch_session(request)
            .instrument(span)
            .await
            .map_err(ClientError::rpc(RPC))?
            .into_inner())
    }

    /// `Writer.WatchServices`: a snapshot of the gateway's inbound services' states, then their
    /// changes (needs verb `write`).
    pub async fn watch_services(&mut self) -> Result<tonic::Streaming<ServiceStates>, ClientError> {
        self.watch_services_with(false).await
    }

    /// [`Self::watch_services`], with the gateway's outbound services too when `include_outbound`
    /// (each with the NAT gateway its egress brings).
    pub async fn watch_services_with(
        &mut self,
        include_outbound: bool,
    ) -> Result<tonic::Streaming<ServiceStates>, ClientError> {
        const RPC: &str = "Writer.WatchServices";
        let request = WatchServicesRequest {
            gateway: self.gateway.clone(),
            writer: self.name.clone(),
            include_outbound,
        };
        let span = self.call_span(RPC, 0);
        Ok(self
            .client
            .watch_services(request)
            .instrument(span)
            .await
            .map_err(ClientError::rpc(RPC))?
            .into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_tls_options_an_http_endpoint_is_dialled_over_tls_which_needs_a_ca() {
        let plain = ConnectOptions::new("http://127.0.0.1:50051");
        assert!(plain.dialer().unwrap().tls.is_none());
        let mut tls = ConnectOptions::new("http://127.0.0.1:50051");
        tls.tls = Some(TlsOptions::default());
        let e = tls.dialer().unwrap_err().to_string();
        assert!(
            e.contains("needs the CA bundle") && e.contains("--tls-ca"),
            "{e}"
        );
        let https = ConnectOptions::new("https://127.0.0.1:50051");
        assert!(https.dialer().unwrap_err().to_string().contains("--tls-ca"));
    }

    #[test]
    fn a_token_to_a_remote_plaintext_server_is_refused_before_connecting() {
        let mut o = ConnectOptions::new("http://clb-state-server.clb-system.svc:50051");
        o.token_file = Some("/var/run/secrets/clb/token".into());
        let e = o.dialer().unwrap_err().to_string();
        assert!(e.contains("would cross the network in clear"), "{e}");
        o.insecure_plaintext = true;
        assert!(o.dialer().is_ok());
    }
}
