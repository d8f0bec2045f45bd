//! The gRPC edge: proto ↔ domain conversion, validation, and the Writer, Worker and Admin services,
//! plus standard health and reflection (`grpc.reflection.v1` and `v1alpha`). `serve` runs them on a
//! bound listener until `shutdown` (plaintext HTTP/2); `serve_tls` does the same behind TLS
//! ([`crate::tls_listener`]: the certificate can change while serving), optionally mutual.

pub mod admin;
pub mod awaits;
pub mod convert;
pub mod resync;
pub mod session;
pub mod worker;
pub mod writer;

use std::future::Future;
use std::sync::Arc;

use admin::AdminService;
use clb_proto::v1::admin_server::AdminServer;
use clb_proto::v1::worker_server::WorkerServer;
use clb_proto::v1::writer_server::WriterServer;
use tokio::net::TcpListener;
use tracing::info;
use writer::WriterService;

use crate::state::StateServer;
use crate::tls_listener::ServerTls;
use worker::WorkerService;

/// Runs the gRPC services on `listener`, plaintext, until `shutdown` resolves; streams are then ended
/// (worker sessions release their units) rather than cut.
pub async fn serve(
    listener: TcpListener,
    state: Arc<StateServer>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    serve_tls(listener, state, None, shutdown).await
}

/// Like [`serve`], behind TLS when `tls` is given (see [`crate::tls::TlsFiles::load`]; with a client
/// CA, connections without a certificate it signed are refused during the handshake). A handshake
/// that fails ends that connection only.
pub async fn serve_tls(
    listener: TcpListener,
    state: Arc<StateServer>,
    tls: Option<ServerTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let options = ServeOptions { tls, auth: None };
    serve_with(listener, state, options, shutdown).await
}

/// How [`serve_with`] serves: transport security and caller checks.
#[derive(Debug, Default)]
pub struct ServeOptions {
    /// TLS (see [`serve_tls`]); `None` is plaintext.
    pub tls: Option<ServerTls>,
    /// Authentication and authorization of every call but health and reflection
    /// ([`crate::auth`]); `None` checks nothing.
    pub auth: Option<Arc<crate::auth::Auth>>,
}

/// Like [`serve_tls`], with the caller checks of `options.auth`.
pub async fn serve_with(
    listener: TcpListener,
    state: Arc<StateServer>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let ServeOptions { tls, auth } = options;
    let secure = tls.is_some();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<WorkerServer<WorkerService>>().await;
    // Both reflection versions: grpcurl and most tools speak v1, older clients only v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(clb_proto::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection()
        .build_v1()
        .expect("the descriptor set is generated at build time");
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .expect("the descriptor set is generated at build time");
    state.start_tasks();
    let max = state.config().max_message_bytes;
    let worker = WorkerServer::new(WorkerService::new(state.clone(), stop_rx.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let writer = WriterServer::new(WriterService::with_shutdown(state.clone(), stop_rx.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let admin = AdminServer::new(AdminService::new(state.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    health.set_serving::<WriterServer<WriterService>>().await;
    health.set_serving::<AdminServer<AdminService>>().await;
    let health_task = tokio::spawn(health_follows_leadership(health, state.leadership()));
    info!(addr = ?listener.local_addr().ok(), tls = secure, "state server listening");
    let router = connection_settings(tonic::transport::Server::builder())
        .trace_fn(crate::telemetry::grpc_server_span)
        .layer(crate::auth::AuthLayer::new(auth).with_metrics(state.metrics().clone()))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(worker)
        .add_service(writer)
        .add_service(admin);
    let signal = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    let result = match tls {
        // The TLS listener sets TCP_NODELAY on each connection itself.
        Some(tls) => {
            let incoming = crate::tls_listener::incoming(listener, tls.config);
            router.serve_with_incoming_shutdown(incoming, signal).await
        }
        // TCP_NODELAY on every accepted connection: a unit (or an acknowledgement) is a small
        // write after a pause, which Nagle's algorithm would hold until the peer's delayed ACK —
        // ≈ 40 ms for one unit in ten at 20,000 pods/s. Tonic applies its own `tcp_nodelay` only to
        // listeners it binds itself.
        None => {
            let incoming = tonic::transport::server::TcpIncoming::from(listener)
                .with_nodelay(Some(true))
                .with_keepalive(Some(TCP_KEEPALIVE));
            router.serve_with_incoming_shutdown(incoming, signal).await
        }
    };
    health_task.abort();
    result
}

/// Idle time before the kernel probes a connection (TCP keepalive): a peer that vanished without a
/// FIN (a node powered off, a partition) is found by the kernel even if HTTP/2 pings are not sent.
pub const TCP_KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(60);

/// The HTTP/2 settings of the gRPC port, chosen for thousands of mostly idle writers (a node agent
/// per node: one connection each, a `WatchSession` stream open, a write now and then) beside a
/// few busy peers (the watcher's resyncs, the workers' streams):
///
/// - Flow-control windows are credit, not allocations, but they bound what one peer can make the
///   server buffer before a handler reads it: 512 KiB per stream and 1 MiB per connection (hyper's
///   default for the connection), so 5,000 agents can never pin 5,000 × the 16 MiB a grown window
///   allows. A resync chunk still streams at full speed on a LAN (1 MiB per round trip).
/// - Adaptive windows (BDP estimation) off: they grow windows per connection and ping with the
///   data; fixed windows keep every connection's cost the same and predictable.
/// - HTTP/2 keepalive every 60 s, 20 s to answer: a dead peer's connection, its streams and their
///   tasks (~36 KB each) are dropped within 80 s; an idle live one costs one ping a minute (the
///   clients ping every 30 s themselves, `clb_client`). TCP keepalive ([`TCP_KEEPALIVE`]) below it.
/// - At most 128 concurrent streams per connection: a node agent uses 2 or 3, the watcher a few
///   per gateway; the bound stops one peer from opening thousands of tasks.
fn connection_settings(builder: tonic::transport::Server) -> tonic::transport::Server {
    builder
        .initial_stream_window_size(512 * 1024)
        .initial_connection_window_size(1024 * 1024)
        .http2_adaptive_window(Some(false))
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(60)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
        .max_concurrent_streams(128)
        .tcp_keepalive(Some(TCP_KEEPALIVE))
}

/// Refuses a call on a standby replica (leader election): `UNAVAILABLE`, so that clients reconnect
/// (the Kubernetes Service routes new connections to the ready replica, the leader).
pub(crate) fn require_leader(state: &StateServer) -> Result<(), tonic::Status> {
    if state.is_leader() {
        Ok(())
    } else {
        Err(tonic::Status::unavailable(
            "this state server replica is a standby (it does not hold the leader lease): reconnect",
        ))
    }
}

/// Keeps the gRPC health statuses in step with leadership: a standby reports `NOT_SERVING` for the
/// server as a whole (`""`) and for Writer, Worker and Admin.
async fn health_follows_leadership(
    health: tonic_health::server::HealthReporter,
    mut leadership: tokio::sync::watch::Receiver<bool>,
) {
    use tonic_health::ServingStatus;
    loop {
        let status = if *leadership.borrow_and_update() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for service in [
            "",
            <WorkerServer<WorkerService> as tonic::server::NamedService>::NAME,
            <WriterServer<WriterService> as tonic::server::NamedService>::NAME,
            <AdminServer<AdminService> as tonic::server::NamedService>::NAME,
        ] {
            health.set_service_status(service, status).await;
        }
        if leadership.changed().await.is_err() {
            return;
        }
    }
}
