//! `clb-sync-worker`: connects to the clb state server, receives leased work units and executes them
//! against Azure NRP (or the NRP emulator), until SIGINT or SIGTERM ([`clb_sync_worker::run`]).

use clap::Parser;
use clb_sync_worker::cli::Args;

/// The allocator of the shipped binaries: glibc's spent about a third of the CPU under load
/// (docs/benchmarks.md, "The allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let _telemetry = clb_telemetry::init("clb-sync-worker")?;
    let args = Args::parse();
    clb_sync_worker::run(args, clb_telemetry::shutdown_signal()).await
}
