//! `clb-sync-worker`: connects to the clb state server, receives leased work units and executes them
//! against Azure NRP (or the NRP emulator).

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use clb_sync_worker::cli::Args;
use clb_sync_worker::metrics::WorkerMetrics;
use clb_sync_worker::worker::run_targets;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let _telemetry = clb_telemetry::init("clb-sync-worker")?;
    let args = Args::parse();
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
    if let Some(addr) = args.metrics_listen {
        // Stops with the process.
        clb_telemetry::metrics::spawn(addr, metrics.router(), std::future::pending()).await?;
    }
    run_targets(config, targets, metrics, clb_telemetry::shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}
