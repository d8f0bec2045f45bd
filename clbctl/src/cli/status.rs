//! `clbctl status [--watch [--interval D]]`.
//!
//! Once: one Admin Status call, printed as tables ([`crate::status::render`]) or JSON. With
//! `--watch`, the status is read again every interval until ctrl-c: on a terminal the screen is
//! redrawn in place; otherwise (a pipe, a file) each reading is printed after the previous one,
//! under a timestamp line (with `--output json`: one JSON document per line). A failed reading
//! during a watch is shown and the watch goes on; the first connection must succeed.

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use clb_proto::v1::StatusResponse;

use super::view::StatusView;
use super::{Global, Output, emit, parse_duration, time};

/// `clbctl status`.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Read the status again every interval until ctrl-c.
    #[arg(long, short = 'w')]
    pub watch: bool,
    /// The refresh interval of `--watch` (e.g. 2, 500ms, 5s).
    #[arg(long, short = 'n', default_value = "2s", value_name = "DURATION", value_parser = parse_duration, requires = "watch")]
    pub interval: Duration,
}

/// Keeps only the `--gateway` gateway, when one is named.
fn filtered(global: &Global, mut s: StatusResponse) -> StatusResponse {
    if !global.gateway.is_empty() {
        s.gateways
            .retain(|g| g.name.eq_ignore_ascii_case(&global.gateway));
    }
    s
}

/// Runs `clbctl status`.
pub async fn run(global: &Global, args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let client = global.connect().await.with_context(|| {
        format!(
            "status: cannot reach the state server at {}",
            global.server()
        )
    })?;
    let read = || async {
        client
            .status()
            .await
            .map(|s| filtered(global, s))
            .with_context(|| format!("status of {}", global.server()))
    };
    if !args.watch {
        let s = read().await?;
        if !global.gateway.is_empty() && s.gateways.is_empty() {
            anyhow::bail!(
                "status: the state server at {} drives no gateway {:?}",
                global.server(),
                global.gateway
            );
        }
        emit(global.output, &StatusView::from(&s), |_| {
            crate::status::render(&s)
        })?;
        return Ok(ExitCode::SUCCESS);
    }
    let tty = std::io::stdout().is_terminal();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let reading = read().await;
        let text = match (global.output, reading) {
            (Output::Json, Ok(s)) => {
                format!("{}\n", serde_json::to_string(&StatusView::from(&s))?)
            }
            (Output::Json, Err(e)) => {
                eprintln!("error: {}", super::describe(&e));
                String::new()
            }
            (Output::Table, reading) => {
                let body = match reading {
                    Ok(s) => crate::status::render(&s),
                    Err(e) => format!("error: {}\n", super::describe(&e)),
                };
                let header = format!(
                    "{}  ·  {} every {}  ·  ctrl-c to stop",
                    time::utc(time::now_unix_ms()),
                    global.server(),
                    time::short(args.interval),
                );
                if tty {
                    // Home, clear the screen, then draw: the table is redrawn in place.
                    format!("\x1b[H\x1b[2J{header}\n\n{body}")
                } else {
                    format!("--- {header}\n{body}\n")
                }
            }
        };
        let mut stdout = std::io::stdout().lock();
        match stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
        {
            Ok(()) => {}
            // The reader has gone (`clbctl status --watch | head`): the watch is over.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(ExitCode::SUCCESS),
            Err(e) => return Err(e).context("cannot write the status to stdout"),
        }
        drop(stdout);
        tokio::select! {
            r = &mut ctrl_c => {
                r.context("cannot listen for ctrl-c")?;
                return Ok(ExitCode::SUCCESS);
            }
            () = tokio::time::sleep(args.interval) => {}
        }
    }
}
