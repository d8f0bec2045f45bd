//! `clb-watcher`: the kube watcher (cluster mode) or, with `--node NAME`, the node agent of one
//! node. Watches the Kubernetes API and writes the desired state to the clb state server
//! (docs/watcher.md), until SIGINT or SIGTERM (what [`clb_watcher::cli::run`] runs), or until one of
//! its tasks ends or panics: then it exits with status 1 (docs/watcher.md, "When a task ends").

use anyhow::Context;
use clap::Parser;
use clb_watcher::{self as watcher, cli::Args};

/// The allocator of the shipped binaries: glibc's spent about a third of the CPU under load
/// (docs/benchmarks.md, "The allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let _telemetry = clb_telemetry::init("clb-watcher")?;
    let args = Args::parse();
    let config = args.config()?;
    // In-cluster service account, or the kubeconfig (KUBECONFIG / ~/.kube/config).
    let kube = kube::Config::infer()
        .await
        .map_err(anyhow::Error::from)
        .and_then(|c| Ok(watcher::KubeClients::from_config(c)?))
        .context("creating the Kubernetes client (in-cluster or kubeconfig)")?;
    watcher::cli::bind(config, args.metrics_listen, kube)
        .await?
        .serve(clb_telemetry::shutdown_signal())
        .await
}
