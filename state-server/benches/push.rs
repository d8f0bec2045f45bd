//! Work delivery to sync workers (issue 22: per-session polling vs one pushing task per gateway),
//! over loopback gRPC with an in-process state server: 3 gateways, 4 fake workers (each serving
//! every gateway, capacity 4) that report every unit `Applied` (observes: `Observed`, an empty
//! snapshot) as soon as it arrives.
//!
//! * Phase 1, latency: N rounds (default 500, 10 ms apart) of one unary `Writer/Apply` of one pod
//!   (a new address with the bench's egress at a location that already exists: exactly one
//!   location unit), gateways round robin; the time from the `Apply` response to the arrival at a
//!   worker of the first location unit that carries that address. The figure is signed: a unit
//!   that reached a worker before the response reached the writer counts negative (the count of
//!   those is printed). The time from sending the `Apply` is printed too (always positive).
//! * Phase 2, idle CPU: once everything converged, the CPU time (user + sys, `/proc/self/stat`;
//!   the threads' `schedstat` beside it, ns-precise) of the whole process over 60 s of wall time
//!   with the 4 workers connected and nothing to do. The fake workers and the bench share the
//!   process, idle too (each waits on its stream): the figure is the server's idle cost.
//!
//! Only the public gRPC API (generated `clb-proto` clients) and the library's public entry points
//! (`StateServer::new`, `ServerConfig`, `grpc::serve`) are used, so that the same file builds
//! before and after the rewrite of the server's internals. No timing is asserted; every wait has
//! a timeout that fails loudly.
//!
//! Run: `cargo bench -p clb-state-server --bench push`. Rounds: `-- 1000` or `CLB_PUSH_ROUNDS`;
//! pause between rounds: `CLB_PUSH_GAP_MS` (default 10); idle window: `CLB_PUSH_IDLE_S` (default
//! 60). Prints a table and one JSON line (`{"bench":"push",...}`) for scripts.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use clb_proto::v1;
use clb_proto::v1::admin_client::AdminClient;
use clb_proto::v1::worker_client::WorkerClient;
use clb_proto::v1::writer_client::WriterClient;
use clb_state_server::state::{ServerConfig, StateServer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const GATEWAYS: [&str; 3] = ["gw-0", "gw-1", "gw-2"];
const WORKERS: usize = 4;
const CAPACITY: u32 = 4;
/// Locations (nodes) per gateway that exist before phase 1; rounds add pods to them in turn.
const NODES: usize = 50;
const EGRESS: &str = "bench-egress";
const WRITER: &str = "pushbench";
const DEFAULT_ROUNDS: usize = 500;
const DEFAULT_IDLE_S: u64 = 60;
/// Pause between rounds, so that each write finds the server idle (its threads parked), as a
/// write usually does, rather than still busy with the previous round.
const DEFAULT_GAP_MS: u64 = 10;
/// The longest wait for one step (a connection, an RPC, one round's unit).
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest wait for the server to converge (setup, after phase 1).
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long no unit may arrive for the server to count as quiet.
const QUIET: Duration = Duration::from_millis(500);

/// A unit as a fake worker received it.
#[derive(Debug)]
struct Arrival {
    at: Instant,
    worker: usize,
    gateway: String,
    work_id: u64,
    kind: &'static str,
    /// Each location of a location unit with the addresses it changes.
    locations: Vec<(String, Vec<String>)>,
}

impl Arrival {
    fn carries(&self, gateway: &str, location: &str, address: &str) -> bool {
        self.gateway == gateway
            && self
                .locations
                .iter()
                .any(|(l, a)| l == location && a.iter().any(|x| x == address))
    }
}

#[derive(Debug)]
enum Event {
    Unit(Arrival),
    Failed(String),
}

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("push bench FAILED: {msg}");
    std::process::exit(1);
}

async fn within<T>(what: &str, wait: Duration, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(wait, f).await {
        Ok(v) => v,
        Err(_) => fail(format_args!("timed out after {wait:?}: {what}")),
    }
}

/// Connects a fake worker (hello with every gateway) and waits for its welcome.
async fn connect_worker(
    url: &str,
    index: usize,
) -> (
    tonic::Streaming<v1::ServerMessage>,
    mpsc::Sender<v1::WorkerMessage>,
) {
    let mut client = WorkerClient::connect(url.to_owned())
        .await
        .unwrap_or_else(|e| fail(format_args!("worker {index}: connect: {e}")));
    let (out, rx) = mpsc::channel(64);
    out.send(v1::WorkerMessage {
        kind: Some(v1::worker_message::Kind::Hello(v1::Hello {
            worker_id: format!("pushbench-worker-{index}"),
            capacity: CAPACITY,
            gateways: GATEWAYS.iter().map(|g| (*g).to_owned()).collect(),
        })),
    })
    .await
    .unwrap_or_else(|_| fail("worker hello: channel closed"));
    let mut units = client
        .sync(ReceiverStream::new(rx))
        .await
        .unwrap_or_else(|e| fail(format_args!("worker {index}: Sync: {e}")))
        .into_inner();
    match units.message().await {
        Ok(Some(v1::ServerMessage {
            kind: Some(v1::server_message::Kind::Welcome(_)),
        })) => {}
        other => fail(format_args!(
            "worker {index}: expected a welcome, got {other:?}"
        )),
    }
    (units, out)
}

/// Receives units, timestamps them, tells the bench, and reports each at once.
async fn run_worker(
    index: usize,
    mut units: tonic::Streaming<v1::ServerMessage>,
    out: mpsc::Sender<v1::WorkerMessage>,
    events: mpsc::UnboundedSender<Event>,
) {
    loop {
        let msg = match units.message().await {
            Ok(Some(m)) => m,
            Ok(None) => {
                let _ = events.send(Event::Failed(format!("worker {index}: stream ended")));
                return;
            }
            Err(status) => {
                let _ = events.send(Event::Failed(format!("worker {index}: stream: {status}")));
                return;
            }
        };
        let at = Instant::now();
        let Some(v1::server_message::Kind::Unit(unit)) = msg.kind else {
            continue;
        };
        let (kind, outcome, locations) = match &unit.work {
            Some(v1::work_unit::Work::Observe(_)) => (
                "observe",
                v1::report::Outcome::Observed(v1::Observed {
                    snapshot: Some(v1::NrpSnapshot::default()),
                    last: true,
                }),
                vec![],
            ),
            Some(v1::work_unit::Work::Services(_)) => (
                "services",
                v1::report::Outcome::Applied(v1::Applied {}),
                vec![],
            ),
            Some(v1::work_unit::Work::Locations(w)) => (
                "locations",
                v1::report::Outcome::Applied(v1::Applied {}),
                w.locations
                    .iter()
                    .map(|l| {
                        let a = l.addresses.iter().map(|a| a.address.clone()).collect();
                        (l.location.clone(), a)
                    })
                    .collect(),
            ),
            None => {
                let _ = events.send(Event::Failed(format!(
                    "worker {index}: unit {} without work",
                    unit.work_id
                )));
                return;
            }
        };
        let _ = events.send(Event::Unit(Arrival {
            at,
            worker: index,
            gateway: unit.gateway.clone(),
            work_id: unit.work_id,
            kind,
            locations,
        }));
        let report = v1::WorkerMessage {
            kind: Some(v1::worker_message::Kind::Report(v1::Report {
                work_id: unit.work_id,
                applied_indices: vec![],
                frontends: vec![],
                service_progress: vec![],
                remaining_subscription_writes: None,
                refused_addresses: Vec::new(),
                outcome: Some(outcome),
            })),
        };
        if out.send(report).await.is_err() {
            let _ = events.send(Event::Failed(format!(
                "worker {index}: report channel closed"
            )));
            return;
        }
    }
}

/// The location (node IP) `node` of gateway `g`.
fn location(g: usize, node: usize) -> String {
    Ipv4Addr::new(10, 0, g as u8, node as u8 + 1).to_string()
}

/// The pod address of round `k` of gateway `g` (0x000fffff rounds per gateway at most).
fn round_address(g: usize, k: usize) -> String {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + ((g as u32) << 20) + k as u32)
        .to_string()
}

fn pod(address: String, location: String) -> v1::Update {
    v1::Update {
        kind: Some(v1::update::Kind::Pod(v1::PodUpdate {
            operation: v1::Operation::Add as i32,
            pod_key: format!("bench/pod-{address}"),
            pod_uid: format!("uid-{address}"),
            address,
            location,
            egress_id: EGRESS.into(),
            ..Default::default()
        })),
    }
}

async fn apply(
    writer: &mut WriterClient<tonic::transport::Channel>,
    gateway: &str,
    batch_id: u64,
    updates: Vec<v1::Update>,
) {
    let n = updates.len() as u32;
    let req = v1::ApplyRequest {
        gateway: gateway.into(),
        writer: WRITER.into(),
        batch_id,
        dry_run: false,
        updates,
    };
    let r = within("Writer/Apply", STEP_TIMEOUT, writer.apply(req))
        .await
        .unwrap_or_else(|s| fail(format_args!("Apply to {gateway}: {s}")))
        .into_inner();
    if r.applied != n || !r.rejected.is_empty() {
        fail(format_args!(
            "Apply to {gateway}: applied {} of {n}, rejected {:?}",
            r.applied, r.rejected
        ));
    }
}

/// Waits until every gateway has read NRP back and holds no pending or in-flight work, draining
/// the workers' events meanwhile, then until no unit arrived for [`QUIET`]. Returns the units
/// that arrived.
async fn converge(
    what: &str,
    admin: &mut AdminClient<tonic::transport::Channel>,
    events: &mut mpsc::UnboundedReceiver<Event>,
    expect_addresses: [u64; GATEWAYS.len()],
) -> usize {
    let start = Instant::now();
    let mut units = 0;
    let mut last_unit = Instant::now();
    loop {
        while let Ok(e) = events.try_recv() {
            match e {
                Event::Unit(_) => {
                    units += 1;
                    last_unit = Instant::now();
                }
                Event::Failed(m) => fail(m),
            }
        }
        let status = within(
            "Admin/Status",
            STEP_TIMEOUT,
            admin.status(v1::StatusRequest {}),
        )
        .await
        .unwrap_or_else(|s| fail(format_args!("Admin/Status: {s}")))
        .into_inner();
        if status.gateways.len() != GATEWAYS.len() {
            fail(format_args!("{} gateways in status", status.gateways.len()));
        }
        let done = status.gateways.iter().all(|g| {
            let Some(index) = GATEWAYS.iter().position(|n| *n == g.name) else {
                fail(format_args!("unknown gateway {} in status", g.name));
            };
            let expect_addresses = expect_addresses[index];
            g.init.as_ref().is_some_and(|i| i.nrp_observed)
                && g.dirty_locations == 0
                && g.units_in_flight == 0
                && g.parked_units == 0
                && g.oldest_pending_change_age_ms == 0
                && g.desired_addresses == expect_addresses
                && g.actual_addresses == expect_addresses
                && g.desired_egresses == g.actual_nat_gateways
        });
        if done && last_unit.elapsed() >= QUIET {
            return units;
        }
        if start.elapsed() > CONVERGE_TIMEOUT {
            fail(format_args!(
                "{what}: not converged after {CONVERGE_TIMEOUT:?}: {:#?}",
                status.gateways
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// User + system CPU time of the whole process (every thread, live or exited), in clock ticks.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat")
        .unwrap_or_else(|e| fail(format_args!("/proc/self/stat: {e}")));
    // The fields after the command name (in parentheses): state is field 3, utime 14, stime 15.
    let rest = &stat[stat
        .rfind(')')
        .unwrap_or_else(|| fail("/proc/self/stat: no ')'"))
        + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> u64 {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .unwrap_or_else(|| fail(format_args!("/proc/self/stat: field {n}")))
    };
    field(14) + field(15)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100, Linux's USER_HZ, if that fails).
fn clock_ticks_per_s() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// Per live thread of the process: (CPU ns from `schedstat`, voluntary context switches,
/// involuntary context switches).
fn thread_counters() -> HashMap<String, [u64; 3]> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for task in dir.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        let get = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        let run_ns = std::fs::read_to_string(task.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        out.insert(
            task.file_name().to_string_lossy().into_owned(),
            [
                run_ns,
                get("voluntary_ctxt_switches:"),
                get("nonvoluntary_ctxt_switches:"),
            ],
        );
    }
    out
}

/// [`thread_counters`] between two samples, summed over the threads alive at the end (a thread
/// that exited in between is missed).
fn counters_between(
    before: &HashMap<String, [u64; 3]>,
    after: &HashMap<String, [u64; 3]>,
) -> [u64; 3] {
    let mut sum = [0; 3];
    for (tid, a) in after {
        let b = before.get(tid).copied().unwrap_or([0; 3]);
        for i in 0..3 {
            sum[i] += a[i].saturating_sub(b[i]);
        }
    }
    sum
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|| "?".into())
}

/// Signed milliseconds from `from` to `to`.
fn ms_between(from: Instant, to: Instant) -> f64 {
    if to >= from {
        (to - from).as_secs_f64() * 1e3
    } else {
        -((from - to).as_secs_f64() * 1e3)
    }
}

/// p50, p90, p99, max, mean of `v` (nearest rank).
struct Summary {
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
    mean: f64,
}

fn summary(mut v: Vec<f64>) -> Summary {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let pct = |p: f64| v[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
    Summary {
        p50: pct(0.50),
        p90: pct(0.90),
        p99: pct(0.99),
        max: v[n - 1],
        mean: v.iter().sum::<f64>() / n as f64,
    }
}

fn json_summary(s: &Summary) -> String {
    format!(
        "{{\"p50\":{:.3},\"p90\":{:.3},\"p99\":{:.3},\"max\":{:.3},\"mean\":{:.3}}}",
        s.p50, s.p90, s.p99, s.max, s.mean
    )
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| fail(format_args!("{name}={v}: not a number"))),
        Err(_) => default,
    }
}

/// The allocator of the shipped binaries: glibc's spent about a third of the CPU under load
/// (docs/benchmarks.md, "The allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; a bare number is the number of rounds.
    let rounds = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(|a| {
            a.parse::<usize>()
                .unwrap_or_else(|_| fail(format_args!("rounds: {a}: not a number")))
        })
        .unwrap_or_else(|| env_or("CLB_PUSH_ROUNDS", DEFAULT_ROUNDS));
    let idle_s: u64 = env_or("CLB_PUSH_IDLE_S", DEFAULT_IDLE_S);
    let gap = Duration::from_millis(env_or("CLB_PUSH_GAP_MS", DEFAULT_GAP_MS));
    if rounds == 0 || rounds / GATEWAYS.len() >= 0x000f_ffff || idle_s == 0 {
        fail("rounds must be 1 to 3,000,000 and CLB_PUSH_IDLE_S at least 1");
    }
    let load_start = load_average();

    // The server, in process, on loopback.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| fail(format_args!("bind: {e}")));
    let url = format!(
        "http://{}",
        listener
            .local_addr()
            .unwrap_or_else(|e| fail(format_args!("local_addr: {e}")))
    );
    let state = StateServer::new(ServerConfig {
        gateways: GATEWAYS.iter().map(|g| (*g).to_owned()).collect(),
        ..ServerConfig::default()
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        if let Err(e) = clb_state_server::grpc::serve(listener, state, async move {
            let _ = stop_rx.await;
        })
        .await
        {
            fail(format_args!("serve: {e}"));
        }
    });

    let mut writer = within(
        "Writer connect",
        STEP_TIMEOUT,
        WriterClient::connect(url.clone()),
    )
    .await
    .unwrap_or_else(|e| fail(format_args!("Writer connect: {e}")));
    let mut admin = within(
        "Admin connect",
        STEP_TIMEOUT,
        AdminClient::connect(url.clone()),
    )
    .await
    .unwrap_or_else(|e| fail(format_args!("Admin connect: {e}")));
    let (events_tx, mut events) = mpsc::unbounded_channel();
    for i in 0..WORKERS {
        let (units, out) = within("worker connect", STEP_TIMEOUT, connect_worker(&url, i)).await;
        tokio::spawn(run_worker(i, units, out, events_tx.clone()));
    }
    drop(events_tx);

    // Setup: per gateway the egress and one pod on each of NODES locations; the workers answer the
    // first observe, create the NAT gateway and program the locations.
    for (g, gateway) in GATEWAYS.iter().enumerate() {
        let mut updates = vec![v1::Update {
            kind: Some(v1::update::Kind::Egress(v1::EgressUpdate {
                operation: v1::Operation::Add as i32,
                egress_id: EGRESS.into(),
            })),
        }];
        updates.extend((0..NODES).map(|n| {
            pod(
                Ipv4Addr::new(10, 64 + g as u8, n as u8, 1).to_string(),
                location(g, n),
            )
        }));
        apply(&mut writer, gateway, 0, updates).await;
    }
    let setup_units = converge(
        "setup",
        &mut admin,
        &mut events,
        [NODES as u64; GATEWAYS.len()],
    )
    .await;

    // Phase 1: one pod per Apply, gateways round robin.
    let mut from_return = Vec::with_capacity(rounds);
    let mut from_send = Vec::with_capacity(rounds);
    let mut apply_rtt = Vec::with_capacity(rounds);
    let mut before_return = 0usize;
    let mut other_units = 0usize;
    let mut per_worker = [0usize; WORKERS];
    let phase1 = Instant::now();
    for i in 0..rounds {
        let g = i % GATEWAYS.len();
        let k = i / GATEWAYS.len();
        let gateway = GATEWAYS[g];
        let (loc, addr) = (location(g, k % NODES), round_address(g, k));
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
        let sent = Instant::now();
        apply(
            &mut writer,
            gateway,
            i as u64 + 1,
            vec![pod(addr.clone(), loc.clone())],
        )
        .await;
        let returned = Instant::now();
        let deadline = returned + STEP_TIMEOUT;
        let arrival = loop {
            match tokio::time::timeout_at(deadline.into(), events.recv()).await {
                Ok(Some(Event::Unit(a))) if a.carries(gateway, &loc, &addr) => break a,
                Ok(Some(Event::Unit(_))) => other_units += 1,
                Ok(Some(Event::Failed(m))) => fail(m),
                Ok(None) => fail("every worker is gone"),
                Err(_) => fail(format_args!(
                    "round {i}: no unit carrying {addr} at {loc} of {gateway} within \
                     {STEP_TIMEOUT:?} of the Apply response"
                )),
            }
        };
        from_return.push(ms_between(returned, arrival.at));
        from_send.push(ms_between(sent, arrival.at));
        apply_rtt.push(ms_between(sent, returned));
        before_return += usize::from(arrival.at < returned);
        per_worker[arrival.worker] += 1;
        if arrival.kind != "locations" {
            fail(format_args!(
                "round {i}: unit {} of kind {}",
                arrival.work_id, arrival.kind
            ));
        }
    }
    let phase1_s = phase1.elapsed().as_secs_f64();
    // Gateway g got the rounds i with i % 3 == g, one new address each.
    let expect: [u64; GATEWAYS.len()] = std::array::from_fn(|g| {
        (NODES + rounds / GATEWAYS.len() + usize::from(g < rounds % GATEWAYS.len())) as u64
    });
    let settle_units = converge("after phase 1", &mut admin, &mut events, expect).await;

    // Phase 2: idle.
    let ticks_per_s = clock_ticks_per_s();
    let threads0 = thread_counters();
    let cpu0 = cpu_ticks();
    let t0 = Instant::now();
    let idle_end = t0 + Duration::from_secs(idle_s);
    let mut idle_units = 0usize;
    loop {
        match tokio::time::timeout_at(idle_end.into(), events.recv()).await {
            Ok(Some(Event::Unit(_))) => idle_units += 1,
            Ok(Some(Event::Failed(m))) => fail(m),
            Ok(None) => fail("every worker is gone"),
            Err(_) => break,
        }
    }
    let cpu1 = cpu_ticks();
    let wall_s = t0.elapsed().as_secs_f64();
    let threads1 = thread_counters();
    let threads = threads1.len();
    let cpu_ms = (cpu1 - cpu0) as f64 * 1e3 / ticks_per_s as f64;
    let cpu_ms_per_s = cpu_ms / wall_s;
    let [run_ns, vol, invol] = counters_between(&threads0, &threads1);
    let sched_ms_per_s = run_ns as f64 / 1e6 / wall_s;
    let load_end = load_average();

    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(STEP_TIMEOUT, server).await;

    // Report.
    let r = summary(from_return);
    let s = summary(from_send);
    let a = summary(apply_rtt);
    let commit = git_commit();
    let mut t = String::new();
    let _ = writeln!(
        t,
        "push bench at {commit}: {} gateways, {WORKERS} workers (capacity {CAPACITY}, every \
         gateway), loopback gRPC, in process",
        GATEWAYS.len()
    );
    let _ = writeln!(
        t,
        "setup: {} pods on {NODES} locations per gateway + egress: {setup_units} units",
        NODES
    );
    let _ = writeln!(
        t,
        "phase 1: {rounds} rounds in {phase1_s:.2} s ({gap:?} apart), 1 pod per Apply; units per worker \
         {per_worker:?}; other units meanwhile {other_units}; units while settling {settle_units}"
    );
    let _ = writeln!(
        t,
        "| latency (ms)                         |     p50 |     p90 |     p99 |     max |    mean |"
    );
    let _ = writeln!(
        t,
        "|--------------------------------------|---------|---------|---------|---------|---------|"
    );
    for (name, x) in [
        ("Apply returned -> unit at a worker", &r),
        ("Apply sent -> unit at a worker", &s),
        ("Apply round trip", &a),
    ] {
        let _ = writeln!(
            t,
            "| {name:<36} | {:>7.3} | {:>7.3} | {:>7.3} | {:>7.3} | {:>7.3} |",
            x.p50, x.p90, x.p99, x.max, x.mean
        );
    }
    let _ = writeln!(
        t,
        "units that reached a worker before the Apply response reached the writer: {before_return} \
         of {rounds} (counted negative above)"
    );
    let _ = writeln!(
        t,
        "phase 2 idle: {wall_s:.1} s wall, CPU {cpu_ms:.0} ms = {cpu_ms_per_s:.3} ms/s = {:.3} % \
         of one core (/proc/self/stat, resolution {:.0} ms); threads' schedstat {sched_ms_per_s:.3} \
         ms/s; context switches {:.1}/s voluntary, {:.1}/s involuntary over {threads} threads; \
         units during idle {idle_units}",
        cpu_ms_per_s / 10.0,
        1e3 / ticks_per_s as f64,
        vol as f64 / wall_s,
        invol as f64 / wall_s
    );
    let _ = writeln!(
        t,
        "note: the CPU time is the whole process: the server's idle cost plus the 4 fake workers' \
         and the bench's own (idle too: they only wait on their streams, so negligible)"
    );
    let _ = writeln!(t, "load average: start {load_start}, end {load_end}");
    print!("{t}");
    println!(
        "{{\"bench\":\"push\",\"commit\":\"{commit}\",\"gateways\":{},\"workers\":{WORKERS},\
         \"capacity\":{CAPACITY},\"rounds\":{rounds},\"gap_ms\":{},\"latency_from_return_ms\":{},\
         \"latency_from_send_ms\":{},\"apply_rtt_ms\":{},\"before_return\":{before_return},\
         \"other_units\":{other_units},\"idle_s\":{wall_s:.3},\"idle_cpu_ms\":{cpu_ms:.1},\
         \"idle_cpu_ms_per_s\":{cpu_ms_per_s:.4},\"idle_cpu_pct_core\":{:.4},\
         \"idle_sched_cpu_ms_per_s\":{sched_ms_per_s:.4},\
         \"idle_voluntary_switches_per_s\":{:.2},\"idle_involuntary_switches_per_s\":{:.2},\
         \"idle_units\":{idle_units},\"clk_tck\":{ticks_per_s},\"load_start\":\"{load_start}\",\
         \"load_end\":\"{load_end}\"}}",
        GATEWAYS.len(),
        gap.as_millis(),
        json_summary(&r),
        json_summary(&s),
        json_summary(&a),
        cpu_ms_per_s / 10.0,
        vol as f64 / wall_s,
        invol as f64 / wall_s,
    );
}
