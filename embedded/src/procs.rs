//! The processes of the harness, each a task: the state server ([`ServerProc`]), a sync worker
//! ([`WorkerProc`]) and a worker that holds a unit and never reports it ([`StalledWorker`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clb_nrp::Nrp;
use clb_nrp::azure::{ArmClient, ArmConfig};
use clb_proto::v1::worker_client::WorkerClient;
use clb_proto::v1::{
    Hello, ServerMessage, WorkUnit, WorkerMessage, server_message, worker_message,
};
use clb_state_server::grpc::ServeOptions;
use clb_state_server::state::{ServerConfig, StateServer};
use clb_sync_worker::worker::{self, Backoff, NrpTargets, WorkerConfig, WorkerError};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

use crate::harness::{Options, PATIENCE};

/// A state server running in a task.
#[derive(Debug)]
pub struct ServerProc {
    /// Its shared state (for white-box checks).
    pub state: Arc<StateServer>,
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl ServerProc {
    /// Starts a state server with `config` on `127.0.0.1:0`.
    pub async fn start(config: ServerConfig) -> Self {
        Self::start_with(config, ServeOptions::default()).await
    }

    /// [`ServerProc::start`] serving with `options` (authentication, authorization).
    pub async fn start_with(config: ServerConfig, options: ServeOptions) -> Self {
        Self::start_on("127.0.0.1:0".parse().expect("an address"), config, options).await
    }

    /// [`ServerProc::start_with`] on `addr` (a restart in place binds the address its predecessor
    /// left).
    pub async fn start_on(
        addr: std::net::SocketAddr,
        config: ServerConfig,
        options: ServeOptions,
    ) -> Self {
        let listener = clb_state_server::run::listen(addr, clb_state_server::run::GRPC_BACKLOG)
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("bound");
        let state = StateServer::new(config);
        let (stop, stopped) = oneshot::channel::<()>();
        let s = state.clone();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(e) = clb_state_server::grpc::serve_with(listener, s, options, shutdown).await
            {
                eprintln!("state server ended: {e}");
            }
        });
        Self {
            state,
            addr,
            stop: Some(stop),
            task,
        }
    }

    /// `http://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Asks the server to shut down (streams end, sessions release their units).
    pub fn request_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Kills the server as a crash would, as far as one process can: it stops leading at once (no
    /// unit is cut any more, worker streams end) and its task is aborted without a graceful
    /// shutdown; a Lease it holds is not released.
    pub async fn kill(mut self) {
        self.state.set_leader(false);
        self.request_stop();
        self.task.abort();
        let _ = self.task.await;
    }

    /// Shuts the server down; if it has not ended within `grace`, it is aborted.
    pub async fn stop(mut self, grace: Duration) {
        self.halt(grace).await;
    }

    /// [`ServerProc::stop`] in place: when this returns, the server has let go of its address.
    pub async fn halt(&mut self, grace: Duration) {
        self.request_stop();
        if tokio::time::timeout(grace, &mut self.task).await.is_err() {
            self.task.abort();
            let _ = (&mut self.task).await;
        }
    }
}

/// A sync worker running in a task.
#[derive(Debug)]
pub struct WorkerProc {
    /// Its worker id.
    pub id: String,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), WorkerError>>,
}

impl WorkerProc {
    /// The ARM client of a worker talking to the NRP (emulator) at `nrp_url`.
    pub fn arm_client(nrp_url: &str) -> Arc<dyn Nrp> {
        let mut arm = ArmConfig::new("sub-e2e", "rg-e2e").with_endpoint(nrp_url);
        arm.poll_interval = Duration::from_millis(5);
        Arc::new(ArmClient::new(arm, None).expect("valid ARM config"))
    }

    /// Starts worker `id` against the state server at `server_url`, talking to NRP through `nrp`
    /// (one client for every gateway, or one per gateway: [`NrpTargets`]). Its reconnect backoff
    /// is short (20–200 ms), for tests.
    pub fn start(
        id: &str,
        server_url: &str,
        nrp: impl Into<NrpTargets>,
        options: &Options,
    ) -> Self {
        let backoff = Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
        };
        Self::start_with_backoff(id, server_url, nrp, options, backoff)
    }

    /// [`WorkerProc::start`] with the given reconnect backoff (`Backoff::default()` is the
    /// binary's).
    pub fn start_with_backoff(
        id: &str,
        server_url: &str,
        nrp: impl Into<NrpTargets>,
        options: &Options,
        backoff: Backoff,
    ) -> Self {
        let targets: NrpTargets = nrp.into();
        let mut config = WorkerConfig::new(server_url, id);
        config.capacity = options.worker_capacity;
        config.limits = options.worker_limits;
        config.backoff = backoff;
        config.token_file = options.auth.as_ref().map(|a| a.worker_token.clone());
        config.shutdown_grace = Duration::from_secs(5);
        config.nat_gateway_resource_group = options.nat_gateway_resource_group.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let metrics = Arc::new(clb_sync_worker::metrics::WorkerMetrics::new());
        let task = tokio::spawn(worker::run_targets(config, targets, metrics, async move {
            let _ = stopped.await;
        }));
        Self {
            id: id.to_owned(),
            stop: Some(stop),
            task,
        }
    }

    /// Kills the worker at once, as a crash would: its task is aborted mid-call, its stream and its
    /// HTTP connections are dropped without a goodbye.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    /// Shuts the worker down gracefully (in-flight calls may finish and report).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match tokio::time::timeout(PATIENCE, &mut self.task).await {
            Ok(r) => r.expect("worker task").expect("worker config"),
            Err(_) => panic!("worker {} did not stop", self.id),
        }
    }
}

/// A worker that takes one unit and never reports it: it holds the unit's lease until it is
/// dropped (then the server releases the unit at once, as for any disconnected worker).
#[derive(Debug)]
pub struct StalledWorker {
    /// The unit it holds.
    pub unit: WorkUnit,
    _to_server: mpsc::Sender<WorkerMessage>,
    _from_server: tonic::Streaming<ServerMessage>,
}

impl StalledWorker {
    /// Connects to the state server at `url` with a capacity of 1 and waits for its first unit.
    pub async fn connect(url: &str, id: &str) -> Self {
        let mut client = WorkerClient::connect(url.to_owned())
            .await
            .expect("worker connects");
        let (tx, rx) = mpsc::channel(4);
        tx.send(WorkerMessage {
            kind: Some(worker_message::Kind::Hello(Hello {
                worker_id: id.to_owned(),
                capacity: 1,
                gateways: Vec::new(),
            })),
        })
        .await
        .expect("stream open");
        let mut stream = client
            .sync(ReceiverStream::new(rx))
            .await
            .expect("sync accepted")
            .into_inner();
        loop {
            let msg = tokio::time::timeout(PATIENCE, stream.message())
                .await
                .expect("a unit comes")
                .expect("stream healthy")
                .expect("stream open");
            if let Some(server_message::Kind::Unit(unit)) = msg.kind {
                return Self {
                    unit,
                    _to_server: tx,
                    _from_server: stream,
                };
            }
        }
    }
}
