//! `nrp-emulator`: serves the project's NRP emulator (Service Gateway REST API, api-versions 2025-05-01
//! and 2026-03-01) over HTTP, for the demo, benchmarks and end-to-end tests.

use anyhow::Context;
use clap::Parser;
use clb_nrp_emulator::cli::Args;
use clb_nrp_emulator::{Emulator, serve};

/// The allocator of the shipped binaries: glibc's spent about a third of the CPU under load
/// (docs/benchmarks.md, "The allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The TLS stack of reqwest/rustls is in the dependency tree: pick its provider explicitly.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let config = args.config()?;
    let emulator = Emulator::new(config.clone()).context("invalid emulator configuration")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(addr = %listener.local_addr()?, ?config, "NRP emulator listening");
    if let Some(addr) = args.metrics_listen {
        let router = clb_nrp_emulator::metrics::router(emulator.clone());
        // Stops with the process.
        clb_telemetry::metrics::spawn(addr, router, std::future::pending()).await?;
    }
    serve(listener, emulator, async {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down");
    })
    .await
    .context("serving")
}
