//! The connection to the state server: one bidirectional `Sync` stream per session, reconnection with
//! capped exponential backoff and jitter, and the graceful end of a session at shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clb_client::tls::{Dialer, TlsConnector};
use clb_proto::v1::worker_client::WorkerClient;
use clb_proto::v1::{self, Hello, ServerMessage, WorkUnit, WorkerMessage, server_message};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;
use tonic::transport::{Channel, Endpoint};
use tracing::Instrument;

use super::WorkerError;
use super::config::WorkerConfig;
use super::ctx::{Env, GatewayCache, UnitError, report};
use super::limiter::GatewayLimiters;
use super::targets::NrpTargets;
use super::unit::{execute, lease_deadline};
use crate::metrics::WorkerMetrics;

/// How a session ended without an error worth a log line at warn level.
enum SessionEnd {
    /// The worker is shutting down; the stream was closed.
    Shutdown,
}

/// The largest reconnect delay after a session that cost the server nothing (no connection, or a
/// standby's `UNAVAILABLE`): a worker finds a new leader within about 2 s of its election instead of
/// up to `backoff.max` (10 s by default), as the writers do.
pub(crate) use clb_client::backoff::RECONNECT_MAX;

/// Why a session ended early; the supervisor reconnects after a backoff.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("connecting")]
    Connect(#[from] tonic::transport::Error),
    #[error("connecting: timed out")]
    ConnectTimeout,
    #[error("the server refused the stream: {0}")]
    Refused(tonic::Status),
    #[error("no Welcome within {0:?}")]
    NoWelcome(Duration),
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    #[error("the stream broke: {0}")]
    Broken(tonic::Status),
    #[error("the server closed the stream")]
    Closed,
}

impl SessionError {
    /// Whether the session cost the server nothing: no connection could be made (the Kubernetes
    /// Service has no ready endpoint during an election), the connection was closed under the
    /// stream (a server that died or stepped down), or the server refused the stream with
    /// `UNAVAILABLE` (a standby). A server that answered with another code keeps the long backoff.
    fn is_refusal(&self) -> bool {
        match self {
            SessionError::Connect(_) | SessionError::ConnectTimeout | SessionError::Closed => true,
            SessionError::Refused(status) | SessionError::Broken(status) => {
                status.code() == tonic::Code::Unavailable || is_transport_failure(status)
            }
            SessionError::NoWelcome(_) | SessionError::Protocol(_) => false,
        }
    }
}

/// Whether a call failed on the connection (reset, closed before an answer: tonic reports it as
/// `UNKNOWN` or `CANCELLED` with a transport error as the source), not with the server's answer.
fn is_transport_failure(status: &tonic::Status) -> bool {
    std::error::Error::source(status)
        .is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some())
}

/// How to reach the state server: the endpoint with the configured timeouts, and TLS
/// ([`clb_client::tls`]: the CA bundle file is re-read when it changes).
pub(crate) fn endpoint(config: &WorkerConfig) -> Result<Dialer, WorkerError> {
    let url = config.connect_url();
    let endpoint = Endpoint::from_shared(clb_client::tls::tonic_url(&url))
        .map_err(|e| WorkerError::InvalidConfig(format!("server URL {:?}: {e}", config.server)))?;
    let endpoint = endpoint
        .connect_timeout(config.connect_timeout)
        .http2_keep_alive_interval(config.keep_alive_interval)
        .keep_alive_timeout(config.keep_alive_interval)
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    let tls = match config.effective_tls() {
        Some(tls) => {
            let ca = tls.ca.clone().ok_or_else(|| {
                WorkerError::InvalidConfig(format!(
                    "TLS to {url:?} needs the CA bundle that signs the server's certificate \
                     (--tls-ca): this build trusts no system roots"
                ))
            })?;
            let host = endpoint.uri().host().unwrap_or_default().to_owned();
            Some(
                TlsConnector::new(ca, &host, tls.domain.as_deref(), tls.identity.as_ref())
                    .map_err(|e| WorkerError::InvalidConfig(format!("TLS to {url:?}: {e}")))?,
            )
        }
        None => None,
    };
    Ok(Dialer { endpoint, tls })
}

/// Runs sessions until `stop` is cancelled.
pub(crate) async fn supervise(
    config: Arc<WorkerConfig>,
    endpoint: Dialer,
    targets: NrpTargets,
    metrics: Arc<WorkerMetrics>,
    stop: CancellationToken,
) {
    let limiters = Arc::new(GatewayLimiters::new(
        config
            .limits
            .sanitized()
            .max_concurrent_mutations_per_gateway,
    ));
    metrics.watch_limiters(Arc::clone(&limiters));
    let mut backoff = config.backoff.delays(RECONNECT_MAX);
    let mut attempt = 0u32;
    let mut sessions = 0u64;
    while !stop.is_cancelled() {
        sessions += 1;
        let started = Instant::now();
        let env = Arc::new(Env {
            targets: targets.clone(),
            config: Arc::clone(&config),
            limiters: Arc::clone(&limiters),
            gateways: GatewayCache::default(),
            cancel: stop.child_token(),
            metrics: Arc::clone(&metrics),
        });
        let span = tracing::info_span!("session", n = sessions, server = %config.server);
        let result = session(&config, &endpoint, env, &metrics, &stop)
            .instrument(span)
            .await;
        metrics.set_connected(false);
        let refused = match result {
            Ok(SessionEnd::Shutdown) => return,
            Err(e) => {
                tracing::warn!(error = %chain(&e), "session ended; reconnecting");
                e.is_refusal()
            }
        };
        if started.elapsed() >= config.backoff.max {
            // A session that lasted was a success: start over.
            attempt = 0;
            backoff.reset();
        }
        let delay = backoff.next_delay(refused);
        attempt = attempt.saturating_add(1);
        tracing::debug!(?delay, attempt, "backing off");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// `error: cause: cause…`, so that a log line says why (tonic's errors put the detail in sources).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = cause.source();
    }
    s
}

fn unit_message(r: v1::Report) -> WorkerMessage {
    WorkerMessage {
        kind: Some(v1::worker_message::Kind::Report(r)),
    }
}

/// One session: connect, Hello/Welcome, then units until the stream breaks or `stop` fires.
async fn session(
    config: &WorkerConfig,
    endpoint: &Dialer,
    env: Arc<Env>,
    metrics: &WorkerMetrics,
    stop: &CancellationToken,
) -> Result<SessionEnd, SessionError> {
    let channel: Channel = tokio::select! {
        r = tokio::time::timeout(config.connect_timeout, endpoint.connect()) => {
            r.map_err(|_| SessionError::ConnectTimeout)??
        }
        () = stop.cancelled() => return Ok(SessionEnd::Shutdown),
    };
    // The trace context and the bearer token (re-read from its file at each session).
    let calls = clb_client::token::CallInterceptor::new(
        config
            .token_file
            .clone()
            .map(clb_client::token::TokenFile::new),
    );
    let mut client = WorkerClient::with_interceptor(channel, calls);
    let capacity = config.capacity.max(1);
    let (tx, rx) = mpsc::channel::<WorkerMessage>(64 + 4 * capacity as usize);
    let hello = Hello {
        worker_id: config.worker_id.clone(),
        capacity,
        gateways: config.gateways.clone(),
    };
    // The channel is empty and large enough: this cannot wait.
    let _ = tx
        .send(WorkerMessage {
            kind: Some(v1::worker_message::Kind::Hello(hello)),
        })
        .await;
    let mut inbound: Streaming<ServerMessage> = tokio::select! {
        r = client.sync(ReceiverStream::new(rx)) => r.map_err(SessionError::Refused)?.into_inner(),
        () = stop.cancelled() => return Ok(SessionEnd::Shutdown),
    };
    let welcome = tokio::select! {
        r = tokio::time::timeout(config.welcome_timeout, inbound.message()) => {
            match r.map_err(|_| SessionError::NoWelcome(config.welcome_timeout))? {
                Ok(Some(ServerMessage { kind: Some(server_message::Kind::Welcome(w)) })) => w,
                Ok(Some(_)) => return Err(SessionError::Protocol("the first message is not Welcome")),
                Ok(None) => return Err(SessionError::Closed),
                Err(status) => return Err(SessionError::Refused(status)),
            }
        }
        () = stop.cancelled() => return Ok(SessionEnd::Shutdown),
    };
    tracing::info!(
        server_id = %welcome.server_id,
        lease_duration_ms = welcome.lease_duration_ms,
        worker_id = %config.worker_id,
        capacity,
        tls = config.uses_tls(),
        "connected to the state server"
    );
    metrics.set_connected(true);
    let fallback_lease = match welcome.lease_duration_ms {
        0 => config.default_lease,
        ms => Duration::from_millis(ms),
    };
    let slots = Arc::new(Semaphore::new(capacity as usize));
    let mut tasks = JoinSet::new();
    let end = loop {
        tokio::select! {
            () = stop.cancelled() => break None,
            msg = inbound.message() => match msg {
                Ok(Some(ServerMessage { kind: Some(server_message::Kind::Unit(unit)) })) => {
                    let received = Instant::now();
                    let deadline = lease_deadline(&unit, received, fallback_lease);
                    let (env, tx, slots) = (Arc::clone(&env), tx.clone(), Arc::clone(&slots));
                    tasks.spawn(async move {
                        let _slot = slots.acquire_owned().await;
                        for r in execute(env, unit, deadline).await {
                            if tx.send(unit_message(r)).await.is_err() {
                                break;
                            }
                        }
                    });
                }
                Ok(Some(other)) => tracing::warn!(message = ?other.kind, "ignoring an unexpected message"),
                Ok(None) => break Some(SessionError::Closed),
                Err(status) => break Some(SessionError::Broken(status)),
            },
            Some(done) = tasks.join_next() => {
                if let Err(e) = done && e.is_panic() {
                    tracing::error!(error = %e, "a unit task panicked");
                }
            }
        }
    };
    if let Some(err) = end {
        metrics.set_connected(false);
        // The server releases this worker's leases when the stream ends: stop at once, so that no
        // NRP call is made for a unit that may already be leased to another worker.
        env.cancel.cancel();
        tasks.abort_all();
        return Err(err);
    }
    // Draining at shutdown: no new unit is taken.
    metrics.set_connected(false);
    drain(config, &env, tasks, tx, inbound).await;
    Ok(SessionEnd::Shutdown)
}

/// The end of a session at shutdown: no new NRP call starts (the units' gate is closed), units still
/// arriving are handed back at once, in-flight units get `shutdown_grace` to finish their current
/// call and report; then the stream is half-closed and the server's end awaited briefly.
async fn drain(
    config: &WorkerConfig,
    env: &Env,
    mut tasks: JoinSet<()>,
    tx: mpsc::Sender<WorkerMessage>,
    mut inbound: Streaming<ServerMessage>,
) {
    env.cancel.cancel();
    tracing::info!(
        in_flight = tasks.len(),
        "shutting down: finishing in-flight units"
    );
    let grace = tokio::time::sleep(config.shutdown_grace);
    tokio::pin!(grace);
    let mut inbound_open = true;
    loop {
        tokio::select! {
            () = &mut grace => {
                tracing::warn!(abandoned = tasks.len(), "shutdown grace elapsed: abandoning units");
                tasks.abort_all();
                break;
            }
            done = tasks.join_next() => if done.is_none() { break },
            msg = inbound.message(), if inbound_open => match msg {
                Ok(Some(ServerMessage { kind: Some(server_message::Kind::Unit(unit)) })) => {
                    hand_back(&tx, &unit);
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    inbound_open = false;
                }
            },
        }
    }
    drop(tx);
    if inbound_open {
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Ok(Some(msg)) = inbound.message().await {
                if let Some(server_message::Kind::Unit(unit)) = msg.kind {
                    tracing::debug!(
                        work_id = unit.work_id,
                        "unit received after the stream was closed"
                    );
                }
            }
        })
        .await;
    }
    tracing::info!("stream closed");
}

/// Reports a unit received during shutdown as retryable without touching NRP.
fn hand_back(tx: &mpsc::Sender<WorkerMessage>, unit: &WorkUnit) {
    tracing::debug!(
        work_id = unit.work_id,
        "handing back a unit received during shutdown"
    );
    let r = report(unit.work_id, Vec::new(), UnitError::Cancelled.outcome());
    // Never wait here: the lease expires anyway if the report cannot be queued.
    let _ = tx.try_send(unit_message(r));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sessions_that_cost_the_server_nothing_are_refusals() {
        assert!(SessionError::ConnectTimeout.is_refusal());
        assert!(SessionError::Refused(tonic::Status::unavailable("standby")).is_refusal());
        // A server that answered with another code, or a stream that broke while working, keeps
        // the long backoff.
        // The server closed the stream, or the connection went under it (a dead or stepped-down
        // leader): finding the next leader costs it nothing either.
        assert!(SessionError::Closed.is_refusal());
        // A server that answered with another code keeps the long backoff.
        assert!(!SessionError::Refused(tonic::Status::permission_denied("no")).is_refusal());
        assert!(!SessionError::Broken(tonic::Status::internal("boom")).is_refusal());
        assert!(!SessionError::NoWelcome(Duration::from_secs(1)).is_refusal());
        assert!(!SessionError::Protocol("no welcome first").is_refusal());
    }
}
