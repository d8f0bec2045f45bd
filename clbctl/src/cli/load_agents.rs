//! `clbctl load --node-agents N`: N simulated node agents against a state server (issue 36, "5,000
//! nodes cost what 50 do"), and what they cost the server.
//!
//! Each agent talks to the server exactly as the shipped node agent does (`load_agent.rs`, the
//! one place that knows the protocol): its connections, its `WatchSession`, a `Resync` of its
//! node's `--agent-pods` pods, then one pod replacement per `--agent-write-every`. The run goes
//! through phases, and for each reports the server's CPU (user + system time from
//! `/proc/PID/stat` over the phase, % of one core) and `VmRSS` (peak and end):
//!
//! 1. **connect + resync**: all N agents start at once; until every one has completed its first
//!    resync (the time is the figure; each agent's resyncs are counted, and the agents that
//!    resynced more than once are reported);
//! 2. **idle** (`--idle-phase`): nobody writes;
//! 3. **agents' writes** (`--writes-phase`): each agent replaces a pod every `--agent-write-every`,
//!    spread evenly, N ÷ that period writes per second in all;
//! 4. **agents' writes + churn** (unless `--churn-per-sec 0`): the load's own churn
//!    ([`super::load::measure_marked`], its usual flags) beside the agents' writes, as writer
//!    `--writer` to the same server; the phase is the churn itself (its initial population before
//!    it is not measured), and its convergence p50/p99 is reported as `clbctl load` reports it.
//!
//! The server is `--state-server URL` (its process `--server-pid PID`, else no CPU or memory
//! figure), or the embedded system, whose process is this one (so its figures include the agents).

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use clb_embedded::Harness;
use tokio::sync::watch;

use super::load::{LoadArgs, costly, embedded_options, lock};
use super::load_agent::{Agent, AgentCall, Counters, Phase, Talk};
use super::load_agents_report::{AgentsReport, PhaseView, render, row};
use super::load_procstat::{Sampler, raise_nofile, ticks_per_s};
use super::load_report::{Percentiles, round3};
use super::{Global, emit, parse_duration};

/// The flags of `--node-agents` (flattened into `clbctl load`'s).
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// Simulate this many node agents and report what they cost the server (phases: connect +
    /// resync, idle, the agents' writes, their writes + the churn); 0 measures the server alone.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub node_agents: Option<u64>,
    /// Pods per simulated node (its resync carries them).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1_000))]
    pub agent_pods: u64,
    /// Each agent replaces one pod this often (N ÷ this writes per second in all).
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = parse_duration)]
    pub agent_write_every: Duration,
    /// HTTP/2 connections per agent: 1 as the shipped node agent (its sender and its session
    /// follower share one), 2 as node agents before (one each: to load an older server the way
    /// its own node agents did).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub agent_connections: u8,
    /// What each of an agent's writes is: `apply`, the node agent's `Writer.Apply` of a pod
    /// replacement; `health-check`, a `grpc.health.v1.Health/Check` instead, which changes nothing:
    /// what the same number of unary calls costs the server by itself (HTTP/2, tonic, its layers),
    /// the floor under the agents' writes; `apply-stream`, the replacement as one message on a
    /// `Writer.ApplyStream` each agent holds open (what writes on a held stream would cost).
    #[arg(long, value_enum, default_value_t = AgentCall::Apply)]
    pub agent_call: AgentCall,
    /// The longest wait for every agent's first resync.
    #[arg(long, default_value = "2m", value_name = "DURATION", value_parser = parse_duration)]
    pub agent_resync_timeout: Duration,
    /// The idle phase (nobody writes); 0 skips it.
    #[arg(long, default_value = "20s", value_name = "DURATION", value_parser = parse_duration)]
    pub idle_phase: Duration,
    /// After the other phases, restart the embedded state server in place (same address, empty
    /// state; its workers with it) and follow the agents' resyncs for this long: when all had
    /// resynced again, and whether any did twice. 0 skips it; only with the embedded system.
    #[arg(long, default_value = "0s", value_name = "DURATION", value_parser = parse_duration)]
    pub restart_phase: Duration,
    /// The phase of the agents' own writes; 0 skips it.
    #[arg(long, default_value = "20s", value_name = "DURATION", value_parser = parse_duration)]
    pub writes_phase: Duration,
    /// The state server's process (with --state-server), for its CPU and memory.
    #[arg(long, value_name = "PID")]
    pub server_pid: Option<u32>,
}

fn note(line: &str) {
    eprintln!("load: {line}");
}

/// Runs `clbctl load --node-agents N` and prints the report.
pub async fn run(global: &Global, args: &LoadArgs) -> anyhow::Result<ExitCode> {
    let report = measure(global, args).await?;
    emit(global.output, &report, render)?;
    if let Some(e) = &report.churn_error {
        bail!("the churn failed: {e}");
    }
    if report.all_resynced_s.is_none() {
        bail!(
            "{} of {} agents resynced within --agent-resync-timeout",
            report.agents_resynced,
            report.node_agents
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The running phase's start: a reading of the server, and when.
struct Window {
    name: &'static str,
    start: Instant,
    from: Option<super::load_procstat::Reading>,
    tool_from: Option<super::load_procstat::Reading>,
}

/// Runs the agents and the phases; returns the figures (for benchmarks and the smoke test).
pub async fn measure(global: &Global, args: &LoadArgs) -> anyhow::Result<AgentsReport> {
    let a = &args.agents;
    let n = a.node_agents.unwrap_or(0);
    if a.agent_write_every.is_zero() {
        bail!("--agent-write-every must be longer than 0");
    }
    let loadavg = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_owned();
    let needed = n * u64::from(a.agent_connections) + 256;
    let nofile = match raise_nofile(needed) {
        Ok(l) => Some(l),
        Err(e) => bail!("load: {e}"),
    };
    let external = args.state_server.clone().or(global.server.clone());
    if !a.restart_phase.is_zero() && external.is_some() {
        bail!("--restart-phase restarts the embedded state server: not with --state-server");
    }
    let (mut harness, url, pid) = match external {
        Some(url) => (None, url, a.server_pid),
        None => {
            note("starting the embedded system: NRP emulator, state server, workers");
            let h = Harness::start(embedded_options(args)).await;
            let url = h.url();
            (Some(h), url, Some(std::process::id()))
        }
    };
    if pid.is_none() {
        note("no --server-pid: the server's CPU and memory are not measured");
    }
    let options = global
        .connect_options(&url)
        .context("load: the state server's URL")?;
    let tps = ticks_per_s();
    let sampler = pid.map(|p| Sampler::start(p, Duration::from_millis(250)));
    let own = std::process::id();
    let tool = (pid != Some(own)).then(|| Sampler::start(own, Duration::from_secs(1)));
    let mut phases = Vec::new();
    let begin = |name: &'static str| Window {
        name,
        start: Instant::now(),
        from: sampler.as_ref().and_then(Sampler::now),
        tool_from: tool.as_ref().and_then(Sampler::now),
    };
    let end = |w: Window, phases: &mut Vec<PhaseView>| {
        let to = sampler.as_ref().and_then(Sampler::now);
        let server = match (sampler.as_ref(), w.from, to) {
            (Some(s), Some(f), Some(t)) => Some(s.usage(f, t, tps).into()),
            _ => None,
        };
        let tool_to = tool.as_ref().and_then(Sampler::now);
        let load_tool = match (tool.as_ref(), w.tool_from, tool_to) {
            (Some(s), Some(f), Some(t)) => Some(s.usage(f, t, tps).into()),
            _ => None,
        };
        let v = PhaseView {
            phase: w.name.to_owned(),
            seconds: round3(w.start.elapsed().as_secs_f64()),
            server,
            load_tool,
        };
        note(&format!(
            "phase {}: {:.1} s{}",
            v.phase,
            v.seconds,
            v.server
                .map(|u| format!(
                    ", server CPU {:.2} % of a core, RSS peak {:.1} MB, end {:.1} MB",
                    u.cpu_percent, u.rss_peak_mb, u.rss_end_mb
                ))
                .unwrap_or_default()
        ));
        if let Some(u) = v.load_tool {
            note(&format!(
                "  (this load tool: CPU {:.1} % of a core)",
                u.cpu_percent
            ));
        }
        phases.push(v);
    };

    // 1. Connect + resync.
    let counters = Arc::new(Counters::default());
    let serial = Arc::new(AtomicU64::new(0));
    let (phase_tx, phase_rx) = watch::channel(Phase::Quiet);
    note(&format!(
        "{n} node agents ({} pods each, {} connection(s) each) connecting to {url}",
        a.agent_pods, a.agent_connections
    ));
    let agents: Vec<Arc<Agent>> = (0..n as usize)
        .map(|i| Arc::new(Agent::new(i, a.agent_pods as usize, &serial)))
        .collect();
    let w = begin("connect+resync");
    let started = w.start;
    let mut tasks = tokio::task::JoinSet::new();
    for agent in &agents {
        let offset = a
            .agent_write_every
            .mul_f64(agent.index as f64 / n.max(1) as f64);
        tasks.spawn(agent.clone().run(
            options.clone(),
            Talk {
                connections: a.agent_connections,
                call: a.agent_call,
            },
            offset,
            serial.clone(),
            counters.clone(),
            phase_rx.clone(),
        ));
    }
    let deadline = tokio::time::Instant::now() + a.agent_resync_timeout;
    let mut last_note = Instant::now();
    loop {
        let synced = counters.synced_agents.load(Ordering::Relaxed);
        if synced >= n {
            break;
        }
        if last_note.elapsed() >= Duration::from_secs(5) {
            last_note = Instant::now();
            note(&format!(
                "{:.1} s: {synced} of {n} agents resynced",
                started.elapsed().as_secs_f64()
            ));
        }
        let wait = counters.synced.notified();
        tokio::select! {
            () = wait => {}
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
            () = tokio::time::sleep_until(deadline) => break,
        }
    }
    let all_synced = (counters.synced_agents.load(Ordering::Relaxed) >= n).then(|| {
        agents
            .iter()
            .filter_map(|g| *lock(&g.first_synced))
            .max()
            .map_or(0.0, |t| round3((t - started).as_secs_f64()))
    });
    end(w, &mut phases);

    // 2. Idle.
    if !a.idle_phase.is_zero() {
        let w = begin("idle");
        tokio::time::sleep(a.idle_phase).await;
        end(w, &mut phases);
    }

    // 3. The agents' writes.
    let writing = Phase::Writing {
        start: Instant::now(),
        every: a.agent_write_every,
    };
    let _ = phase_tx.send(writing);
    if !a.writes_phase.is_zero() {
        let w = begin("writes");
        tokio::time::sleep(a.writes_phase).await;
        end(w, &mut phases);
    }

    // 4. Their writes + the churn.
    let mut churn_convergence = None;
    let mut churn_events_per_sec = None;
    let mut churn_error = None;
    if args.churn_per_sec > 0.0 {
        if let Some(h) = &harness {
            h.emulator()
                .set_config(costly(args))
                .context("load: invalid NRP emulator settings")?;
        }
        let mut churn_args = args.clone();
        churn_args.state_server = Some(url.clone());
        churn_args.agents.node_agents = None;
        let (marks_tx, mut marks_rx) = tokio::sync::mpsc::unbounded_channel();
        let churn = super::load::measure_marked(global, &churn_args, Some(marks_tx));
        let follow = async {
            let mut window = None;
            while let Some(m) = marks_rx.recv().await {
                if m {
                    window = Some(begin("writes+churn"));
                } else if let Some(w) = window.take() {
                    end(w, &mut phases);
                }
            }
        };
        let (churn, ()) = tokio::join!(churn, follow);
        match churn {
            Ok(r) => {
                churn_convergence = Some(r.convergence.latency.clone());
                churn_events_per_sec = Some(r.ingest.churn_events_per_sec);
                if let Some(e) = r.convergence_error {
                    churn_error = Some(e);
                }
            }
            Err(e) => churn_error = Some(format!("{e:#}")),
        }
    }

    // 5. A restart of the server in place.
    let mut restart_all_resynced_s = None;
    let mut restart_resynced_more_than_once = None;
    let mut before_restart: Option<Vec<u64>> = None;
    if let (false, Some(h)) = (a.restart_phase.is_zero(), harness.as_mut()) {
        let before: Vec<u64> = agents
            .iter()
            .map(|g| g.resyncs.load(Ordering::Relaxed))
            .collect();
        let again = |agents: &[Arc<Agent>]| {
            agents
                .iter()
                .zip(&before)
                .filter(|(g, b)| g.resyncs.load(Ordering::Relaxed) > **b)
                .count()
        };
        let w = begin("restart");
        note("restarting the state server in place");
        h.restart_server_in_place().await;
        let deadline = w.start + a.restart_phase;
        while Instant::now() < deadline {
            if restart_all_resynced_s.is_none() && again(&agents) == agents.len() {
                restart_all_resynced_s = Some(round3(w.start.elapsed().as_secs_f64()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        restart_resynced_more_than_once = Some(
            agents
                .iter()
                .zip(&before)
                .filter(|(g, b)| g.resyncs.load(Ordering::Relaxed) > **b + 1)
                .count() as u64,
        );
        note(&format!(
            "after the restart: {} of {n} agents resynced again{}, {} more than once",
            again(&agents),
            restart_all_resynced_s
                .map(|t| format!(" (all within {t} s)"))
                .unwrap_or_default(),
            restart_resynced_more_than_once.unwrap_or(0)
        ));
        end(w, &mut phases);
        before_restart = Some(before);
    }

    let _ = phase_tx.send(Phase::Stop);
    while tasks.join_next().await.is_some() {}
    let rss_peak_mb = sampler.as_ref().map(Sampler::rss_peak_mb);
    if let Some(h) = harness {
        h.shutdown().await;
    }

    let firsts: Vec<Duration> = agents
        .iter()
        .filter_map(|g| lock(&g.first_synced).map(|t| t - started))
        .collect();
    // Before a restart: the restart's own resyncs are counted apart.
    let more_than_once = agents
        .iter()
        .enumerate()
        .filter(|(i, g)| match &before_restart {
            Some(before) => before[*i] > 1,
            None => g.resyncs.load(Ordering::Relaxed) > 1,
        })
        .count() as u64;
    let c = &counters;
    let get = |x: &AtomicU64| x.load(Ordering::Relaxed);
    let mut report = AgentsReport {
        state_server: url,
        server_pid: pid,
        embedded: args.state_server.is_none() && global.server.is_none(),
        node_agents: n,
        agent_pods: a.agent_pods,
        agent_connections: a.agent_connections,
        agent_write_every_s: a.agent_write_every.as_secs_f64(),
        agent_call: a.agent_call,
        nofile,
        loadavg,
        all_resynced_s: all_synced,
        resynced_after: Percentiles::of(&firsts),
        agents_resynced: firsts.len() as u64,
        agents_resynced_more_than_once: more_than_once,
        resyncs: get(&c.resyncs),
        resync_failures: get(&c.resync_failures),
        restart_all_resynced_s,
        restart_resynced_more_than_once,
        connects: get(&c.connects),
        connect_failures: get(&c.connect_failures),
        session_messages: get(&c.session_messages),
        session_reopens: get(&c.session_reopens),
        applies: get(&c.applies),
        apply_failures: get(&c.apply_failures),
        apply_round_trip: Percentiles::of(&lock(&c.apply_times)),
        phases,
        rss_peak_mb,
        churn_convergence,
        churn_events_per_sec,
        churn_error,
        errors: lock(&c.errors).clone(),
        row: String::new(),
    };
    report.row = row(&report);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser as _;

    /// The code path in CI: 20 agents against the embedded server for 2 s, each resynced.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn twenty_agents_each_resync_once() {
        let cli = Cli::parse_from([
            "clbctl",
            "load",
            "--node-agents",
            "20",
            "--agent-write-every",
            "200ms",
            "--idle-phase",
            "500ms",
            "--writes-phase",
            "1500ms",
            "--churn-per-sec",
            "0",
        ]);
        let crate::cli::Command::Load(args) = cli.command else {
            panic!("load");
        };
        let r = measure(&cli.global, &args).await.expect("measured");
        assert_eq!(r.agents_resynced, 20, "{r:#?}");
        assert!(r.errors.is_empty(), "{r:#?}");
        // Exactly once: a session message built before an agent's resync landed echoes an older
        // `resync_sequence` and asks for nothing (before the echo, 5 of 20 agents resynced twice
        // in 7 of 12 runs).
        assert_eq!(r.resyncs, 20, "{r:#?}");
        assert_eq!(r.agents_resynced_more_than_once, 0, "{r:#?}");
        assert!(r.applies > 0, "{r:#?}");
        assert_eq!(r.phases.len(), 3, "{r:#?}");
    }
}
