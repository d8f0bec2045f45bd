//! The state server as the `clb-state-server` binary runs it, as a library: a test (or another
//! binary) runs exactly what `main` runs, with the same flags, on its own Kubernetes API and
//! shutdown. `main` only installs the crypto provider, parses the flags, starts the telemetry and
//! waits for SIGINT/SIGTERM.
//!
//! ```no_run
//! # async fn demo(kube: kube::Config) -> anyhow::Result<()> {
//! use clap::Parser as _;
//! use clb_state_server::config::Args;
//! use clb_state_server::run::{self, KubeClients, Options};
//! let args = Args::try_parse_from(["clb-state-server", "--listen=127.0.0.1:0",
//!                                  "--metrics-listen=127.0.0.1:0"])?;
//! let bound = run::bind(Options::from_args(args)?, Some(KubeClients::from_config(kube)?)).await?;
//! let started = bound.started(); // the bound addresses (port 0 above)
//! bound.serve(std::future::pending()).await
//! # }
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::{Auth, review_client};
use crate::config::Args;
use crate::grpc;
use crate::metrics::{router_with_readiness, serve_router};
use crate::state::StateServer;

/// How often `--tls-cert`/`--tls-key` are re-read (a renewed certificate is presented this late).
pub const TLS_FILES_RELOAD: std::time::Duration = std::time::Duration::from_secs(10);

/// The Kubernetes clients of the state server (both to one API server).
#[derive(Clone)]
pub struct KubeClients {
    /// For TokenReviews and SubjectAccessReviews (`--authentication`/`--authorization=kubernetes`):
    /// without kube's own retries ([`review_client`]), so that a call fails closed at once while
    /// the API server is down.
    pub reviews: kube::Client,
    /// For the Lease of `--leader-elect` (with kube's default retries).
    pub lease: kube::Client,
}

impl KubeClients {
    /// Both clients from one configuration.
    pub fn from_config(config: kube::Config) -> Result<Self, kube::Error> {
        Ok(Self {
            reviews: review_client(config.clone())?,
            lease: kube::Client::try_from(config)?,
        })
    }

    /// Both clients from the in-cluster ServiceAccount, or the kubeconfig (`KUBECONFIG`,
    /// `~/.kube/config`): what `kube::Client::try_default` reads.
    pub async fn infer() -> Result<Self, kube::Error> {
        let config = kube::Config::infer()
            .await
            .map_err(kube::Error::InferConfig)?;
        Self::from_config(config)
    }
}

impl std::fmt::Debug for KubeClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClients")
            .field("namespace", &self.lease.default_namespace())
            .finish_non_exhaustive()
    }
}

/// Validated flags with the TLS files read: everything that can fail before anything starts.
#[derive(Debug, Clone)]
pub struct Options {
    /// The flags, validated, with the gateways of `--gateways-file` loaded.
    pub args: Args,
    /// The gRPC port's TLS (`None`: plaintext), read from `--tls-cert`/`--tls-key`/`--tls-client-ca`,
    /// or made by the server itself (`--tls-self-managed`).
    pub tls: Option<crate::tls_listener::ServerTls>,
}

impl Options {
    /// Checks the flags ([`Args::validate`]; the binary has done so already, and exited with
    /// clap's status 2 on an error), reads `--gateways-file` ([`Args::load_gateways_file`]) and
    /// reads and checks the TLS files: a bad file is an error naming the flag and the file (its
    /// message holds the cause).
    pub fn from_args(mut args: Args) -> anyhow::Result<Self> {
        args.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        args.load_gateways_file()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let tls = args.server_tls().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(Self { args, tls })
    }

    /// The flags that need a Kubernetes API, for messages (`None`: no client is needed).
    pub fn needs_kubernetes(&self) -> Option<&'static str> {
        let auth = self.args.auth_config().needs_kubernetes();
        let flags = match (auth, self.args.leader_elect) {
            (true, true) => Some("--authentication/--authorization=kubernetes and --leader-elect"),
            (true, false) => Some("--authentication/--authorization=kubernetes"),
            (false, true) => Some("--leader-elect"),
            (false, false) => None,
        };
        match flags {
            None if self.args.self_managed.tls_self_managed => Some("--tls-self-managed"),
            flags => flags,
        }
    }
}

/// Where a bound server listens (the ports chosen when the flags said port 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    /// The gRPC API (`--listen`).
    pub grpc_addr: SocketAddr,
    /// `/metrics`, `/healthz`, `/readyz` (`--metrics-listen`).
    pub metrics_addr: SocketAddr,
}

/// A state server whose listeners are bound; [`Bound::serve`] runs it.
pub struct Bound {
    args: Args,
    tls: Option<crate::tls_listener::ServerTls>,
    self_managed: Option<crate::self_managed::SelfManaged>,
    auth: Option<Arc<Auth>>,
    lease: Option<kube::Client>,
    state: Arc<StateServer>,
    grpc_listener: TcpListener,
    metrics_listener: TcpListener,
    started: Started,
}

impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bound")
            .field("started", &self.started)
            .finish_non_exhaustive()
    }
}

/// The gRPC port's accept queue. Every node agent connects at once when the server starts, restarts
/// or fails over (5,000 on a large cluster), while the server is busy with their resyncs; the
/// standard library's 128 overflowed then, and a connection whose handshake the kernel dropped
/// failed its first call (tens to hundreds of failed resync calls per start at 5,000 agents,
/// `clbctl load --node-agents`). The kernel caps it at `net.core.somaxconn` (4,096 by default).
pub const GRPC_BACKLOG: u32 = 4096;

/// A listener on `addr` with an accept queue of `backlog`, reusing the address as tokio's own
/// `bind` does (the gRPC port: [`GRPC_BACKLOG`]; the embedded system binds its servers so too).
pub fn listen(addr: std::net::SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// Wires the state server as the flags say and binds its two listeners; nothing is served yet.
/// `kube` is needed when the flags ask for `kubernetes` checks or `--leader-elect`
/// ([`Options::needs_kubernetes`]).
pub async fn bind(options: Options, kube: Option<KubeClients>) -> anyhow::Result<Bound> {
    let Options { args, tls } = options;
    let config = args.to_server_config();
    tracing::info!(server_id = %config.server_id, gateways = ?config.gateways, "starting");
    // Caller checks (docs/security.md): a Kubernetes client for TokenReview/SubjectAccessReview.
    let auth_config = args.auth_config();
    if args.unchecked_callers() && !args.listen.ip().is_loopback() {
        tracing::warn!(
            listen = %args.listen,
            authentication = ?args.authentication,
            authorization = ?args.authorization,
            "--insecure-allow-unauthenticated: callers are not checked on a non-loopback address; \
             anyone who reaches it can change every gateway"
        );
    }
    let needs = |flag: &str| {
        anyhow::anyhow!("{flag}: needs a Kubernetes client (in-cluster or the kubeconfig)")
    };
    let auth = if auth_config.needs_kubernetes() {
        let client = kube
            .as_ref()
            .ok_or_else(|| needs("--authentication/--authorization=kubernetes"))?
            .reviews
            .clone();
        Some(Auth::new(auth_config, Some(client)).map_err(anyhow::Error::msg)?)
    } else {
        None
    };
    let self_managed = match (&tls, args.self_managed.tls_self_managed) {
        (Some(tls), true) => Some(crate::self_managed::SelfManaged::new(
            &args.self_managed,
            kube.as_ref()
                .ok_or_else(|| needs("--tls-self-managed"))?
                .lease
                .clone(),
            tls.certificate.clone(),
        )),
        _ => None,
    };
    let lease = if args.leader_elect {
        Some(
            kube.as_ref()
                .ok_or_else(|| needs("--leader-elect"))?
                .lease
                .clone(),
        )
    } else {
        None
    };
    let state = StateServer::new(config);

    let grpc_listener = listen(args.listen, GRPC_BACKLOG)
        .with_context(|| format!("binding the gRPC listener on {}", args.listen))?;
    let metrics_listener = TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("binding the metrics listener on {}", args.metrics_listen))?;
    let started = Started {
        grpc_addr: grpc_listener
            .local_addr()
            .context("the gRPC listener's address")?,
        metrics_addr: metrics_listener
            .local_addr()
            .context("the metrics listener's address")?,
    };
    tracing::info!(
        grpc = %started.grpc_addr,
        grpc_tls = tls.is_some(),
        mutual_tls = args.tls_client_ca.is_some(),
        metrics = %started.metrics_addr,
        "listening"
    );
    Ok(Bound {
        args,
        tls,
        self_managed,
        auth,
        lease,
        state,
        grpc_listener,
        metrics_listener,
        started,
    })
}

/// [`bind`], then [`Bound::serve`] until `shutdown` completes.
pub async fn run(
    args: Args,
    kube: Option<KubeClients>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    bind(Options::from_args(args)?, kube)
        .await?
        .serve(shutdown)
        .await
}

impl Bound {
    /// Where it listens.
    pub fn started(&self) -> Started {
        self.started
    }

    /// Its state (for white-box checks).
    pub fn state(&self) -> &Arc<StateServer> {
        &self.state
    }

    /// Serves the gRPC API and the metrics endpoint (and runs the leader election with
    /// `--leader-elect`) until `shutdown` completes or either server stops; on shutdown the
    /// leader steps down and releases the Lease.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let Bound {
            args,
            tls,
            self_managed,
            auth,
            lease,
            state,
            grpc_listener,
            metrics_listener,
            started: _,
        } = self;
        let metrics = state.metrics().clone();
        // Cancelled by `shutdown`, or when either server stops, so the other stops too.
        let stop = CancellationToken::new();
        let signal = async {
            tokio::select! {
                () = shutdown => {
                    tracing::info!("shutting down");
                    stop.cancel();
                }
                () = stop.cancelled() => {}
            }
        };

        let refresh = {
            let (metrics, state) = (metrics.clone(), state.clone());
            move || metrics.refresh_from(&state)
        };
        // The certificate: issued and renewed by the server (--tls-self-managed), or re-read from
        // --tls-cert/--tls-key when they change. Not ready before a certificate is presented.
        let certificate = tls.as_ref().map(|t| t.certificate.clone());
        let tls_tasks = {
            let mut tasks = tokio::task::JoinSet::new();
            if let Some(managed) = self_managed {
                tasks.spawn(managed.run(stop.clone()));
            } else if let Some(tls) = tls.clone().filter(|t| t.files.is_some()) {
                tasks.spawn(crate::tls::reload_files(tls, TLS_FILES_RELOAD));
            }
            tasks
        };
        let grpc = async {
            let r = grpc::serve_with(
                grpc_listener,
                state.clone(),
                grpc::ServeOptions { tls, auth },
                stop.clone().cancelled_owned(),
            )
            .await;
            stop.cancel();
            r
        };
        // Active/standby: a standby serves nothing but health and metrics until it holds the Lease.
        let election = match lease {
            Some(client) => {
                let config = args.election_config(client.default_namespace());
                config.validate()?;
                let api = kube::Api::namespaced(client, &config.namespace);
                Some(tokio::spawn(crate::leader::run(
                    api,
                    config,
                    state.clone(),
                    stop.clone().cancelled_owned(),
                )))
            }
            None => None,
        };
        let router = {
            let state = state.clone();
            router_with_readiness(metrics.clone(), refresh, move || {
                state.is_leader() && certificate.as_ref().is_none_or(|c| c.is_ready())
            })
        };
        let http = async {
            let r = serve_router(metrics_listener, router, stop.clone().cancelled_owned()).await;
            stop.cancel();
            r
        };
        let (grpc_result, metrics_result, ()) = tokio::join!(grpc, http, signal);
        drop(tls_tasks);
        if let Some(election) = election {
            // On shutdown the leader steps down and releases the Lease (bounded by the retry period).
            let _ = election.await;
        }
        grpc_result.context("gRPC server")?;
        metrics_result.context("metrics server")?;
        Ok(())
    }
}
