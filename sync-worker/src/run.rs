//! The sync worker as the `clb-sync-worker` binary runs it, as a library: a test (or another
//! binary) runs exactly what `main` runs, with the same flags, until its own shutdown. `main` only
//! installs the crypto provider, starts the telemetry, parses the flags and waits for
//! SIGINT/SIGTERM.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use clap::Parser as _;
//! use clb_sync_worker::cli::Args;
//! let args = Args::try_parse_from(["clb-sync-worker", "--server=http://127.0.0.1:50051",
//!     "--nrp-endpoint=http://127.0.0.1:8600", "--subscription=sub", "--resource-group=rg",
//!     "--credential=none", "--metrics-listen=127.0.0.1:0"])?;
//! let bound = clb_sync_worker::run::bind(args).await?;
//! let metrics = bound.metrics_addr(); // the port chosen for port 0
//! bound.serve(std::future::pending()).await
//! # }
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::cli::Args;
use crate::metrics::WorkerMetrics;
use crate::worker::{NrpTargets, WorkerConfig, run_targets};

/// A worker configured from its flags, its metrics endpoint (if any) bound; [`Bound::serve`] runs
/// it.
pub struct Bound {
    config: WorkerConfig,
    targets: NrpTargets,
    metrics: Arc<WorkerMetrics>,
    metrics_listener: Option<tokio::net::TcpListener>,
    metrics_addr: Option<SocketAddr>,
}

impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bound")
            .field("worker_id", &self.config.worker_id)
            .field("metrics_addr", &self.metrics_addr)
            .finish_non_exhaustive()
    }
}

/// Builds the worker as the flags say (its configuration, TLS files, credential and NRP clients:
/// a bad flag or file fails here, before anything starts) and binds `--metrics-listen`.
pub async fn bind(args: Args) -> anyhow::Result<Bound> {
    // First the configuration (it reads the TLS files): a bad flag or file fails before anything starts.
    let config = args.worker_config()?;
    let credential = args.credential()?;
    let targets = args
        .nrp_targets(&credential)
        .context("creating the NRP clients")?;
    tracing::info!(
        server = %config.server,
        worker_id = %config.worker_id,
        capacity = config.capacity,
        tls = config.uses_tls(),
        nrp_endpoint = %args.nrp_endpoint,
        nrp_api_version = %args.nrp_api_version,
        gateways_file = ?args.gateways_file,
        gateways = ?config.gateways,
        create_missing_gateway = config.create_missing_gateway,
        credential = credential.kind(),
        "starting clb-sync-worker"
    );
    let metrics = Arc::new(WorkerMetrics::new());
    let (metrics_listener, metrics_addr) = match args.metrics_listen {
        Some(addr) => {
            let listener = clb_telemetry::metrics::bind(addr).await?;
            let local = listener
                .local_addr()
                .context("the metrics listener's address")?;
            (Some(listener), Some(local))
        }
        None => (None, None),
    };
    Ok(Bound {
        config,
        targets,
        metrics,
        metrics_listener,
        metrics_addr,
    })
}

/// [`bind`], then [`Bound::serve`] until `shutdown` completes.
pub async fn run(args: Args, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    bind(args).await?.serve(shutdown).await
}

impl Bound {
    /// Where `/metrics`, `/healthz` and `/readyz` are served (`None` without `--metrics-listen`).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The worker's metrics.
    pub fn metrics(&self) -> &Arc<WorkerMetrics> {
        &self.metrics
    }

    /// Serves the metrics endpoint and works for the state server until `shutdown` completes (then
    /// in-flight units get `--shutdown-grace` to finish and the metrics endpoint stops).
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let stop = CancellationToken::new();
        let http = match (self.metrics_listener, self.metrics_addr) {
            (Some(listener), Some(addr)) => {
                tracing::info!(metrics = %addr, "serving /metrics, /healthz and /readyz");
                Some(tokio::spawn(clb_telemetry::metrics::serve(
                    listener,
                    self.metrics.router(),
                    stop.clone().cancelled_owned(),
                )))
            }
            _ => None,
        };
        let result = run_targets(self.config, self.targets, self.metrics, shutdown).await;
        stop.cancel();
        if let Some(http) = http {
            let _ = http.await;
        }
        result?;
        tracing::info!("stopped");
        Ok(())
    }
}
