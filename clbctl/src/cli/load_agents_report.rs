//! What `clbctl load --node-agents N` reports ([`super::load_agents`]): the phases' figures, the
//! report, its table and its row of docs/benchmarks.md's table.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{Cell, CellAlignment, ContentArrangement, Table};
use serde::Serialize;

use super::load_agent::AgentCall;
use super::load_procstat::Usage;
use super::load_report::Percentiles;

/// One phase's figures.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseView {
    /// `connect+resync`, `idle`, `writes`, `writes+churn`.
    pub phase: String,
    /// Its length.
    pub seconds: f64,
    /// The server's CPU and memory over it (`None`: no process to read).
    pub server: Option<UsageView>,
    /// This process's (the agents', the churn's) over it, when the server is another process: a
    /// load tool near a core's worth is what limits the figures.
    pub load_tool: Option<UsageView>,
}

/// A process's CPU and memory over a phase.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct UsageView {
    /// % of one core.
    pub cpu_percent: f64,
    /// Peak `VmRSS`, MB.
    pub rss_peak_mb: f64,
    /// `VmRSS` at the end, MB.
    pub rss_end_mb: f64,
}

impl From<Usage> for UsageView {
    fn from(u: Usage) -> Self {
        Self {
            cpu_percent: u.cpu_percent,
            rss_peak_mb: u.rss_peak_mb,
            rss_end_mb: u.rss_end_mb,
        }
    }
}

/// What `clbctl load --node-agents` measured.
#[derive(Debug, Clone, Serialize)]
pub struct AgentsReport {
    /// The state server.
    pub state_server: String,
    /// Its process (the embedded system: this one).
    pub server_pid: Option<u32>,
    /// Whether the server ran in this process (its figures then include the agents').
    pub embedded: bool,
    /// Simulated node agents.
    pub node_agents: u64,
    /// Pods per node.
    pub agent_pods: u64,
    /// Connections per agent.
    pub agent_connections: u8,
    /// Seconds between one agent's writes.
    pub agent_write_every_s: f64,
    /// What each write is (`--agent-call`).
    pub agent_call: AgentCall,
    /// `RLIMIT_NOFILE` of this process (soft, hard) after raising it.
    pub nofile: Option<(u64, u64)>,
    /// `/proc/loadavg` at the start.
    pub loadavg: String,
    /// From the agents' start until every one had resynced (`None`: not all did).
    pub all_resynced_s: Option<f64>,
    /// Per agent, from the start to its first resync.
    pub resynced_after: Percentiles,
    /// Agents whose first resync completed.
    pub agents_resynced: u64,
    /// Agents that resynced more than once.
    pub agents_resynced_more_than_once: u64,
    /// Resyncs in all.
    pub resyncs: u64,
    /// Failed resync calls.
    pub resync_failures: u64,
    /// `--restart-phase`: from the restart until every agent had resynced again (`None`: not all
    /// did within the phase).
    pub restart_all_resynced_s: Option<f64>,
    /// `--restart-phase`: agents that resynced more than once after the restart.
    pub restart_resynced_more_than_once: Option<u64>,
    /// Connections made / failed.
    pub connects: u64,
    /// Failed connection attempts.
    pub connect_failures: u64,
    /// `WatchSession` messages received / streams reopened.
    pub session_messages: u64,
    /// Session streams reopened after a failure or an end.
    pub session_reopens: u64,
    /// The agents' `Apply` calls that succeeded / failed, and their round trips.
    pub applies: u64,
    /// Failed `Apply` calls.
    pub apply_failures: u64,
    /// Round trips of the agents' `Apply` calls.
    pub apply_round_trip: Percentiles,
    /// The phases.
    pub phases: Vec<PhaseView>,
    /// Peak `VmRSS` of the server over the run, MB.
    pub rss_peak_mb: Option<f64>,
    /// The churn's convergence latency (`clbctl load`'s), when it ran.
    pub churn_convergence: Option<Percentiles>,
    /// Churn events per second achieved.
    pub churn_events_per_sec: Option<f64>,
    /// The churn's error, if it failed.
    pub churn_error: Option<String>,
    /// The agents' distinct failures (the first 10), each with its count.
    pub errors: Vec<(String, u64)>,
    /// The figures as one row of docs/benchmarks.md's table.
    pub row: String,
}

/// The figures as one row under [`ROW_HEADER`].
pub(super) fn row(r: &AgentsReport) -> String {
    let phase = |name: &str| {
        r.phases
            .iter()
            .find(|p| p.phase == name)
            .and_then(|p| p.server.map(|u| (p.seconds, u)))
    };
    let cpu = |name: &str| {
        phase(name).map_or("–".to_owned(), |(_, u)| format!("{:.1} %", u.cpu_percent))
    };
    let ms = |x: Option<f64>| x.map_or("–".to_owned(), |v| format!("{v:.0}"));
    let churn = r.churn_convergence.as_ref().map_or("–".to_owned(), |l| {
        format!("{} / {} ms", ms(l.p50_ms), ms(l.p99_ms))
    });
    let rss = match (phase("connect+resync"), r.rss_peak_mb) {
        (Some((_, u)), Some(peak)) => format!("{:.0} / {peak:.0} MB", u.rss_end_mb),
        _ => "–".to_owned(),
    };
    let connect = phase("connect+resync").map_or("–".to_owned(), |(secs, u)| {
        format!("{:.1} % ({secs:.1} s)", u.cpu_percent)
    });
    let resynced = r
        .all_resynced_s
        .map_or("not all".to_owned(), |s| format!("{s:.2} s"));
    let twice = r.agents_resynced_more_than_once;
    let failed = r.resync_failures;
    format!(
        "| {} | {rss} | {connect} | {} | {} | {} | {churn} | {resynced} | {twice} ({failed}) |",
        r.node_agents,
        cpu("idle"),
        cpu("writes"),
        cpu("writes+churn"),
    )
}

/// The header of the table whose rows are [`AgentsReport::row`].
pub const ROW_HEADER: &str = "| node agents | server RSS after connect / peak | CPU \
connect+resync | CPU, nobody writing | CPU, agents' writes | CPU, writes + churn | churn p50 / p99 \
| all connected + resynced | agents resynced > once (failed resync calls) |\n\
|---|---|---|---|---|---|---|---|---|";

pub(super) fn render(r: &AgentsReport) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(vec!["figure", "value"]);
    let mut add = |k: &str, v: String| {
        t.add_row(vec![
            Cell::new(k),
            Cell::new(v).set_alignment(CellAlignment::Right),
        ]);
    };
    add(
        "server",
        format!(
            "{}{}",
            r.state_server,
            r.server_pid
                .map(|p| format!(" (pid {p}{})", if r.embedded { ", embedded" } else { "" }))
                .unwrap_or_default()
        ),
    );
    add(
        "node agents",
        format!(
            "{} × {} pods, {} connection(s), a write every {} s",
            r.node_agents, r.agent_pods, r.agent_connections, r.agent_write_every_s
        ),
    );
    add("load average at start", r.loadavg.clone());
    add(
        "all connected + resynced",
        r.all_resynced_s
            .map_or("not all".to_owned(), |s| format!("{s:.3} s")),
    );
    if let Some(twice) = r.restart_resynced_more_than_once {
        add(
            "after a restart in place: all resynced again / agents twice",
            format!(
                "{} / {twice}",
                r.restart_all_resynced_s
                    .map_or("not all".to_owned(), |s| format!("{s:.3} s"))
            ),
        );
    }
    let p = &r.resynced_after;
    add(
        "first resync after (p50 / p99 / max)",
        format!(
            "{:?} / {:?} / {:?} ms",
            p.p50_ms.unwrap_or_default(),
            p.p99_ms.unwrap_or_default(),
            p.max_ms.unwrap_or_default()
        ),
    );
    add(
        "resyncs (agents resynced / more than once)",
        format!(
            "{} ({} / {})",
            r.resyncs, r.agents_resynced, r.agents_resynced_more_than_once
        ),
    );
    add(
        "failures: connect / resync / apply",
        format!(
            "{} / {} / {}",
            r.connect_failures, r.resync_failures, r.apply_failures
        ),
    );
    add(
        "connections made; session messages; reopens",
        format!(
            "{}; {}; {}",
            r.connects, r.session_messages, r.session_reopens
        ),
    );
    let ap = &r.apply_round_trip;
    add(
        "agents' applies (round trip p50 / p99)",
        format!(
            "{} ({:?} / {:?} ms)",
            r.applies,
            ap.p50_ms.unwrap_or_default(),
            ap.p99_ms.unwrap_or_default()
        ),
    );
    for ph in &r.phases {
        add(
            &format!("phase {} ({:.1} s)", ph.phase, ph.seconds),
            ph.server.map_or("–".to_owned(), |u| {
                format!(
                    "CPU {:.2} %, RSS peak {:.1} MB, end {:.1} MB{}",
                    u.cpu_percent,
                    u.rss_peak_mb,
                    u.rss_end_mb,
                    ph.load_tool
                        .map(|t| format!(" (load tool: CPU {:.1} %)", t.cpu_percent))
                        .unwrap_or_default()
                )
            }),
        );
    }
    if let Some(l) = &r.churn_convergence {
        add(
            "churn convergence p50 / p99 / max",
            format!(
                "{:?} / {:?} / {:?} ms ({} samples, {:.0} events/s)",
                l.p50_ms.unwrap_or_default(),
                l.p99_ms.unwrap_or_default(),
                l.max_ms.unwrap_or_default(),
                l.count,
                r.churn_events_per_sec.unwrap_or_default()
            ),
        );
    }
    if let Some(e) = &r.churn_error {
        add("churn error", e.clone());
    }
    for (e, count) in &r.errors {
        add(&format!("agents' failure ×{count}"), e.clone());
    }
    format!("{t}\n{ROW_HEADER}\n{}", r.row)
}
