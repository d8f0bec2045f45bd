//! `clb-watcher`: the kube watcher (cluster mode) or, with `--node NAME`, the node agent of one
//! node. Watches the Kubernetes API and writes the desired state to the clb state server
//! (docs/watcher.md).

use anyhow::Context;
use clap::Parser;
use clb_client::watcher::{self, cli::Args};

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let _telemetry = clb_state_server::telemetry::init("clb-watcher")?;
    let args = Args::parse();
    let config = args.config()?;
    // In-cluster service account, or the kubeconfig (KUBECONFIG / ~/.kube/config).
    let kube = kube::Client::try_default()
        .await
        .context("creating the Kubernetes client (in-cluster or kubeconfig)")?;
    watcher::run(config, kube, shutdown_signal()).await?;
    Ok(())
}
