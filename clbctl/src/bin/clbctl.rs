//! `clbctl`: the clb command line (status, state, diff, apply, demo, load, completions). The
//! commands live in [`clbctl::cli`]; this binary parses the arguments and runs them.

use std::process::ExitCode;

use clap::Parser as _;
use clbctl::cli::{self, Cli};

/// The allocator of the shipped binaries: glibc's spent about a third of the CPU under load
/// (docs/benchmarks.md, "The allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let args = Cli::parse();
    cli::run(args).await
}
