//! `clbctl load` against a state server with authentication and authorization off and on.
//!
//! ```sh
//! cargo bench -p clb-tests --bench load_auth
//! ```
//!
//! Each run starts the system `clbctl load` embeds (NRP emulator with its cost model from the start,
//! state server, 2 workers: `clbctl::cli::load::embedded_options`) and drives it with clbctl's own
//! load generator as an external state server (`clbctl --token-file F load --state-server URL`):
//! every `Apply` and every `Admin.GetLocation` read-back goes through the server's checks. "On" is
//! the server as deploy/ runs it (`--authentication=kubernetes --authorization=kubernetes`: a
//! TokenReview per token and a SubjectAccessReview per (user, verb, gateway), both cached), the
//! reviews answered by the fake Kubernetes API over loopback; the workers send their own token.
//! Runs alternate off / on, `CLB_BENCH_AUTH_PAIRS` pairs (default 3); the load is
//! `CLB_BENCH_LOAD_ARGS` (default: 10,000 pods, 500 nodes, 50 Services, 2,000 churn events/s for
//! 10 s).

use clap::Parser as _;
use clb_tests::Harness;
use clb_tests::auth_setup::AuthOn;
use clb_tests::bench::env_usize;
use clbctl::cli::load::{costly, embedded_options, measure};
use clbctl::cli::load_report::LoadReport;
use clbctl::cli::{Cli, Command};

const DEFAULT_LOAD: &str =
    "--pods 10000 --locations 500 --services 50 --churn-per-sec 2000 --duration 10s";

async fn run(load: &[String], auth: bool) -> (LoadReport, Option<(usize, usize)>) {
    let on = if auth {
        Some(AuthOn::start().await)
    } else {
        None
    };
    let parse = |url: &str| {
        let mut argv = vec!["clbctl".to_owned()];
        if let Some(a) = &on {
            argv.push("--token-file".into());
            argv.push(a.harness.client_token.display().to_string());
        }
        argv.extend(["load".into(), "--state-server".into(), url.to_owned()]);
        argv.extend(load.iter().cloned());
        let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("CLB_BENCH_LOAD_ARGS: {e}"));
        match cli.command {
            Command::Load(args) => (cli.global, args),
            _ => unreachable!("parsed as load"),
        }
    };
    let (_, args) = parse("http://127.0.0.1:1");
    let mut options = embedded_options(&args);
    options.emulator = costly(&args);
    options.auth = on.as_ref().map(|a| a.harness.clone());
    let h = Harness::start(options).await;
    let (global, args) = parse(&h.url());
    let report = measure(&global, &args).await.expect("load ran");
    h.shutdown().await;
    (report, on.map(|a| a.api.review_counts()))
}

/// The allocator of the shipped binaries: glibc's spent about a third of the CPU under load
/// (docs/benchmarks.md, "The allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let load: Vec<String> = std::env::var("CLB_BENCH_LOAD_ARGS")
        .unwrap_or_else(|_| DEFAULT_LOAD.into())
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let pairs = env_usize("CLB_BENCH_AUTH_PAIRS", 3).max(1);
    println!(
        "clbctl load {} against an external state server, {pairs} pairs",
        load.join(" ")
    );
    let mut rows = Vec::new();
    for i in 0..pairs {
        for auth in [false, true] {
            let (r, reviews) = rt.block_on(run(&load, auth));
            eprintln!(
                "pair {}/{pairs}, authentication {}: {:.0} updates/s, p50 {:?} ms",
                i + 1,
                if auth { "on" } else { "off" },
                r.ingest.updates_per_sec,
                r.convergence.latency.p50_ms
            );
            assert_eq!(r.ingest.updates_rejected, 0, "updates rejected");
            rows.push((auth, r, reviews));
        }
    }
    println!();
    println!(
        "| authentication | updates/s | batch ack p50 / p99 | convergence p50 / p99 | drain | \
         TokenReviews | SubjectAccessReviews |"
    );
    println!("|---|---|---|---|---|---|---|");
    let ms = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.1} ms"));
    for (auth, r, reviews) in &rows {
        let (t, a) = reviews.map_or(("–".into(), "–".into()), |(t, a)| {
            (t.to_string(), a.to_string())
        });
        println!(
            "| {} | {:.0} | {} / {} | {} / {} | {:.2} s | {t} | {a} |",
            if *auth { "on" } else { "off" },
            r.ingest.updates_per_sec,
            ms(r.ingest.batch_ack.p50_ms),
            ms(r.ingest.batch_ack.p99_ms),
            ms(r.convergence.latency.p50_ms),
            ms(r.convergence.latency.p99_ms),
            r.drain_s,
        );
    }
    let median = |auth: bool, f: fn(&LoadReport) -> Option<f64>| {
        let mut v: Vec<f64> = rows
            .iter()
            .filter(|(a, _, _)| *a == auth)
            .filter_map(|(_, r, _)| f(r))
            .collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let change = |f: fn(&LoadReport) -> Option<f64>| match (median(false, f), median(true, f)) {
        (Some(off), Some(on)) if off > 0.0 => format!("{:+.1}%", 100.0 * (on / off - 1.0)),
        _ => "n/a".into(),
    };
    println!();
    println!(
        "on vs off (medians): ingest {}, batch ack p50 {}, convergence p50 {}, p99 {}",
        change(|r| Some(r.ingest.updates_per_sec)),
        change(|r| r.ingest.batch_ack.p50_ms),
        change(|r| r.convergence.latency.p50_ms),
        change(|r| r.convergence.latency.p99_ms),
    );
}
