//! `clb-state-server`: parses flags and runs the state server ([`clb_state_server::run`]: its gRPC
//! API and its metrics endpoint) until SIGINT or SIGTERM.

use anyhow::Context as _;
use clb_state_server::config::Args;
use clb_state_server::run::{self, KubeClients, Options};
use clb_state_server::telemetry;

/// The allocator of the shipped binaries: glibc's spent about a third of the CPU under load
/// (docs/benchmarks.md, "The allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let args = Args::parse_and_validate();
    // Read and check the TLS files before anything else starts: a bad file is an error naming the
    // flag and the file (its message holds the cause, so no "Caused by" repeats it), exit status 1.
    let options = Options::from_args(args)?;
    let _telemetry = telemetry::init("clb-state-server")?;
    // In-cluster ServiceAccount, or the kubeconfig (KUBECONFIG / ~/.kube/config).
    let kube = match options.needs_kubernetes() {
        Some(flags) => Some(
            KubeClients::infer()
                .await
                .with_context(|| format!("{flags}: connecting to the Kubernetes API"))?,
        ),
        None => None,
    };
    run::bind(options, kube)
        .await?
        .serve(telemetry::shutdown_signal())
        .await
}
