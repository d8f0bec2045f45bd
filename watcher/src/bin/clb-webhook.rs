//! `clb-webhook`: the mutating admission webhook that gives the pods clb's LoadBalancer Services
//! select the readiness gate `clb.azure.com/programmed` (docs/readiness-gate.md).

use anyhow::Context;
use clap::Parser;
use clb_watcher::webhook::{self, Args};

/// The allocator of the shipped binaries: glibc's spent about a third of the CPU under load
/// (docs/benchmarks.md, "The allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let _telemetry = clb_telemetry::init("clb-webhook")?;
    let args = Args::parse();
    // The certificate first: a missing or bad file is an error naming the flag and the file.
    let certificate = webhook::ReloadingCertificate::load(args.certificate_files())?;
    // In-cluster service account, or the kubeconfig (KUBECONFIG / ~/.kube/config).
    let client = kube::Client::try_default()
        .await
        .context("creating the Kubernetes client (in-cluster or kubeconfig)")?;
    webhook::run(args, certificate, client, clb_telemetry::shutdown_signal()).await
}
