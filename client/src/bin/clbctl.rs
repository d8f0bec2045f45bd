//! `clbctl`: the clb command line. `clbctl demo` plays the embedded demo (see
//! [`clb_client::demo`]); `clbctl status` prints a state server's Admin Status.

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use clb_client::demo::{self, DemoConfig};
use clb_client::status;

/// clb command line.
#[derive(Debug, Parser)]
#[command(name = "clbctl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs the whole system in this process (NRP emulator, state server, two workers) on a
    /// synthetic cluster through create → rollout → scale down → delete a service → node drained.
    Demo(DemoArgs),
    /// Prints the state server's Admin Status (gateways, workers, writers, last errors).
    Status(StatusArgs),
}

#[derive(Debug, Args)]
struct StatusArgs {
    /// The state server's gRPC URL.
    #[arg(long, env = "CLB_SERVER", default_value = "http://127.0.0.1:50051")]
    server: String,
}

#[derive(Debug, Args)]
struct DemoArgs {
    /// A smaller cluster and ~2 ms NRP latency (for CI).
    #[arg(long)]
    quick: bool,
    /// Plain progress lines instead of progress bars.
    #[arg(long)]
    plain: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cli = Cli::parse();
    match cli.command {
        Command::Status(args) => match status::fetch(&args.server).await {
            Ok(s) => {
                print!("{}", status::render(&s));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: status of {}: {e:#}", args.server);
                ExitCode::FAILURE
            }
        },
        Command::Demo(args) => {
            let mut config = if args.quick {
                DemoConfig::quick()
            } else {
                DemoConfig::full()
            };
            config.plain = args.plain;
            let summary = demo::run(&config).await;
            println!();
            println!("{}", summary.table());
            match summary.failure() {
                None if summary.ok() => {
                    println!("every phase converged: NRP equals the desired state");
                    ExitCode::SUCCESS
                }
                None => {
                    eprintln!("error: no phase was played");
                    ExitCode::FAILURE
                }
                Some(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
