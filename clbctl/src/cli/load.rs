//! `clbctl load`: a load generator. It declares `--services` LoadBalancer Services backed by
//! `--pods` pods on `--locations` nodes, then churns pods at `--churn-per-sec` for `--duration`,
//! as a Deployment rollout does, and reports:
//!
//! - **ingest rate**: updates acknowledged by the state server per second (and churn events per
//!   second, batches, the time from sending a batch to its acknowledgement);
//! - **convergence latency** p50/p99: for sampled churn events, the time from the acknowledgement
//!   of the batch that carried the event until the state server's *actual* state (what a worker
//!   reported NRP accepted) holds the new pod's address with its service at its location. Measured
//!   by polling `Admin.GetLocation` of that location every `--sample-poll` (so the figures are
//!   upper bounds, with that resolution); at most `--max-samples-in-flight` events are followed at
//!   once, so the polling stays light. A sampled pod that is churned away before it converged is
//!   counted as `abandoned`, not measured;
//! - **NRP calls**: on the embedded system, the emulator's counters over the churn and the drain
//!   after it; on an external state server, unavailable (NRP is not visible from here).
//!
//! One churn event replaces the oldest pod by a new pod of the same Service on a random node (new
//! IP): three updates in one batch — the new pod, the endpoints change `old → new` (an edge
//! update), the removal of the old pod. The generator is open-loop: every `--batch-window` it sends
//! the events that are due by then, waiting for each batch's acknowledgement before the next one,
//! so when the server is slower than the target rate the batches grow and the achieved rate shows
//! it.
//!
//! By default the whole system runs in this process (NRP emulator at a realistic cost — 100 ms per
//! call + 0.05 ms per address, 4 concurrent mutating calls — state server, 2 workers); the initial
//! population's Services are created with a free NRP, its pods are programmed at the cost model
//! (so the churn starts from the state server's estimates of what a call costs), and the write
//! budget, when asked for, applies to the churn only. With
//! `--state-server URL` the load goes to that server instead (as writer `--writer`, with `Apply`:
//! nothing else of its desired state is touched), and the load's services and pods are removed
//! again at the end unless `--keep`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use clb_core::dispatch::DispatchConfig;
use clb_nrp_emulator::EmulatorConfig;
use clb_proto::v1::{Protocol, Update};
use clb_state_server::state::ServerConfig;
use clb_sync_worker::worker::Limits;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

use super::load_report::{
    EmbeddedView, IngestView, LatencyView, LoadConfigView, LoadReport, NrpView, Percentiles,
    nrp_view, render, round, round3,
};
use super::load_samples::{Sample, Samples, poll_samples};
use super::{Global, emit, parse_duration};
use clb_client::client::{CHUNK, Client, Writer};
use clb_client::updates;
use clb_embedded::cluster::location_ip;
use clb_embedded::{Expected, Harness, Options};

use crate::system::{External, System};

/// Updates per churn event.
const UPDATES_PER_EVENT: usize = 3;
/// Pod IPs are `10.{64..=254}.x.y`: this many addresses.
const ADDRESS_SPACE: u64 = 191 << 16;

/// `clbctl load`.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Pods in the cluster (each backs one Service).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub pods: u64,
    /// Nodes (locations) the pods are spread over.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=50_000))]
    pub locations: u64,
    /// LoadBalancer Services (pod `i` backs Service `i mod services`).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub services: u64,
    /// Pod replacements per second (each: 3 updates).
    #[arg(long, default_value_t = 1000.0)]
    pub churn_per_sec: f64,
    /// How long to churn (e.g. 30s, 2m).
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Duration,
    /// Load an external state server at this URL instead of the embedded system (the global
    /// `--server`, when given, names it too).
    #[arg(long, value_name = "URL")]
    pub state_server: Option<String>,
    /// The writer's name.
    #[arg(long, default_value = "clbctl-load")]
    pub writer: String,
    /// How often the due churn events are sent as one batch.
    #[arg(long, default_value = "10ms", value_name = "DURATION", value_parser = parse_duration)]
    pub batch_window: Duration,
    /// Sync workers of the embedded system.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Embedded NRP emulator: latency per call (whole milliseconds).
    #[arg(long, default_value = "100ms", value_name = "DURATION", value_parser = parse_duration)]
    pub nrp_latency: Duration,
    /// Embedded NRP emulator: latency per address carried (whole microseconds).
    #[arg(long, default_value = "50us", value_name = "DURATION", value_parser = parse_duration)]
    pub nrp_latency_per_address: Duration,
    /// Embedded NRP emulator: concurrent mutating calls per gateway (more get 429).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    pub nrp_concurrency: u64,
    /// Embedded NRP emulator: Azure's write budget per subscription, token bucket size in writes
    /// (ARM's: 200). Off when not given. A write that finds it empty gets 429
    /// SubscriptionRequestsThrottled (retried by the system).
    #[arg(long, value_name = "WRITES", value_parser = clap::value_parser!(u32).range(1..))]
    pub nrp_write_bucket: Option<u32>,
    /// Embedded NRP emulator: refill of the write bucket, writes per second (10) or per a duration
    /// (10/s, 600/m).
    #[arg(long, default_value = "10/s", value_name = "RATE", value_parser = clb_nrp_emulator::cli::parse_rate)]
    pub nrp_write_refill: f64,
    /// Embedded NRP emulator: Azure's write budget per subscription, the most writes in any
    /// --nrp-write-window (NRP's: 1000 per 5 minutes). Off when not given.
    #[arg(long, value_name = "WRITES", value_parser = clap::value_parser!(u32).range(1..))]
    pub nrp_writes_per_window: Option<u32>,
    /// Embedded NRP emulator: the window of --nrp-writes-per-window (whole seconds).
    #[arg(long, default_value = "5m", value_name = "DURATION", value_parser = parse_duration)]
    pub nrp_write_window: Duration,
    /// Embedded NRP emulator: runs the write budget's clock this many times faster — the refill
    /// is multiplied and the window divided by it (at least 1 s), bucket size and cap unchanged —
    /// so that a run of a minute meets what Azure's budget does over minutes (10: the 5-minute
    /// window passes in 30 s).
    #[arg(long, default_value_t = 1.0, value_name = "FACTOR")]
    pub nrp_write_speedup: f64,
    /// Embedded state server: its --write-pace (writes per second per gateway while the write
    /// budget the workers report is below its reserve of 20; multiplied by --nrp-write-speedup,
    /// as the budget's clock is); 0 = no pacing (the calls meet the 429s instead).
    #[arg(long, default_value_t = 3.0, value_name = "WRITES_PER_SEC")]
    pub write_pace: f64,
    /// Embedded state server: its --batch-linger (the longest a burst of changes holds location
    /// units back; 0 = units cut as soon as a slot is free).
    #[arg(long, default_value = "100ms", value_name = "DURATION", value_parser = parse_duration)]
    pub batch_linger: Duration,
    /// Embedded state server: its --unit-headway (location units in steady churn start at least
    /// this × a unit's recent duration ÷ 4 apart; 0 = as soon as a slot is free).
    #[arg(long, default_value_t = 1.05, value_name = "FACTOR")]
    pub unit_headway: f64,
    /// Embedded system: most locations per work unit and per NRP call.
    #[arg(long, default_value_t = 1_000)]
    pub locations_per_call: usize,
    /// Churn events followed at once for the convergence latency.
    #[arg(long, default_value_t = 16)]
    pub max_samples_in_flight: usize,
    /// How often a followed event's location is read back.
    #[arg(long, default_value = "20ms", value_name = "DURATION", value_parser = parse_duration)]
    pub sample_poll: Duration,
    /// A followed event not converged after this long is given up (counted as not converged), so
    /// that a few stuck ones (a location refused for minutes) do not take every follow slot and
    /// end the measurement.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = parse_duration)]
    pub sample_timeout: Duration,
    /// The longest wait for the system to converge (after the initial population, after the
    /// churn).
    #[arg(long, default_value = "5m", value_name = "DURATION", value_parser = parse_duration)]
    pub patience: Duration,
    /// Seed of the placement of pods on nodes.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// External state server: leave the load's services and pods in place at the end.
    #[arg(long)]
    pub keep: bool,
    /// Simulated node agents (`--node-agents N`: [`super::load_agents`]).
    #[command(flatten)]
    pub agents: super::load_agents::AgentArgs,
}

impl LoadArgs {
    /// `--nrp-latency` in whole milliseconds.
    pub fn emulator_latency_ms(&self) -> u64 {
        u64::try_from(self.nrp_latency.as_millis()).unwrap_or(u64::MAX)
    }

    /// `--nrp-latency-per-address` in whole microseconds.
    pub fn emulator_latency_per_address_us(&self) -> u64 {
        u64::try_from(self.nrp_latency_per_address.as_micros()).unwrap_or(u64::MAX)
    }

    /// Whether the embedded emulator's write budget is on.
    pub fn write_budget_on(&self) -> bool {
        self.nrp_write_bucket.is_some() || self.nrp_writes_per_window.is_some()
    }

    /// The write budget's refill per second and window in whole seconds, sped up by
    /// `--nrp-write-speedup`.
    pub fn write_budget_clock(&self) -> (f64, u64) {
        let f = self.nrp_write_speedup;
        let window = (self.nrp_write_window.as_secs_f64() / f).round().max(1.0) as u64;
        (self.nrp_write_refill * f, window)
    }

    fn check(&self) -> anyhow::Result<()> {
        if !self.nrp_write_speedup.is_finite() || self.nrp_write_speedup <= 0.0 {
            bail!(
                "--nrp-write-speedup must be a positive number, got {}",
                self.nrp_write_speedup
            );
        }
        if self.nrp_write_window.as_secs() == 0 {
            bail!("--nrp-write-window must be at least 1s");
        }
        if !self.churn_per_sec.is_finite() || self.churn_per_sec < 0.0 {
            bail!(
                "--churn-per-sec must be a non-negative number, got {}",
                self.churn_per_sec
            );
        }
        if self.duration.is_zero() {
            bail!("--duration must be longer than 0");
        }
        if self.batch_window.is_zero() {
            bail!("--batch-window must be longer than 0");
        }
        if self.sample_poll.is_zero() {
            bail!("--sample-poll must be longer than 0");
        }
        let addresses = self.pods as f64 + self.churn_per_sec * self.duration.as_secs_f64() + 1.0;
        if addresses > ADDRESS_SPACE as f64 {
            bail!(
                "--pods + --churn-per-sec × --duration needs {addresses:.0} pod IPs, more than the \
                 {ADDRESS_SPACE} the generator has"
            );
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
struct LoadPod {
    serial: u64,
    address: String,
    location: String,
    service: usize,
}

impl LoadPod {
    fn key(&self) -> String {
        format!("load/pod-{}", self.serial)
    }

    fn uid(&self) -> String {
        format!("load-uid-{}", self.serial)
    }
}

/// The synthetic cluster of the load: services, pods in the order they will be replaced.
struct Model {
    rng: StdRng,
    locations: Vec<String>,
    services: Vec<String>,
    pods: VecDeque<LoadPod>,
    next_serial: u64,
}

impl Model {
    fn new(args: &LoadArgs) -> Self {
        let mut m = Self {
            rng: StdRng::seed_from_u64(args.seed),
            locations: (0..args.locations as usize).map(location_ip).collect(),
            services: (0..args.services)
                .map(|i| format!("load-svc-{i}"))
                .collect(),
            pods: VecDeque::new(),
            next_serial: 0,
        };
        for i in 0..args.pods as usize {
            let pod = m.new_pod(i % m.services.len());
            m.pods.push_back(pod);
        }
        m
    }

    fn new_pod(&mut self, service: usize) -> LoadPod {
        self.next_serial += 1;
        let n = self.next_serial;
        LoadPod {
            serial: n,
            address: format!("10.{}.{}.{}", 64 + (n >> 16), (n >> 8) & 255, n & 255),
            location: self.locations[self.rng.random_range(0..self.locations.len())].clone(),
            service,
        }
    }

    fn pod_add(p: &LoadPod) -> Update {
        updates::pod_add(&p.address, &p.location, "", &p.key(), &p.uid())
    }

    /// Services, pods, then each service's endpoints as a level.
    /// The initial population's Services.
    fn initial_services(&self) -> Vec<Update> {
        let port = [updates::port(80, Protocol::Tcp)];
        self.services
            .iter()
            .map(|s| updates::service_add(s, &port))
            .collect()
    }

    /// The initial population's pods and their Services' endpoints.
    fn initial_pods(&self) -> Vec<Update> {
        let mut out: Vec<Update> = self.pods.iter().map(Self::pod_add).collect();
        let mut endpoints: Vec<Vec<_>> = vec![Vec::new(); self.services.len()];
        for p in &self.pods {
            endpoints[p.service].push(updates::endpoint(&p.address, &p.location));
        }
        out.extend(
            self.services
                .iter()
                .zip(endpoints)
                .map(|(s, eps)| updates::endpoints_level(s, eps)),
        );
        out
    }

    /// Replaces the oldest pod; returns the updates and the new pod.
    fn churn(&mut self) -> (Vec<Update>, LoadPod) {
        let old = self.pods.pop_front().expect("at least one pod");
        let new = self.new_pod(old.service);
        let service = &self.services[old.service];
        let batch = vec![
            Self::pod_add(&new),
            updates::endpoints_edge(
                service,
                vec![updates::endpoint(&old.address, &old.location)],
                vec![updates::endpoint(&new.address, &new.location)],
            ),
            updates::pod_remove(&old.address, &old.location, &old.key(), &old.uid()),
        ];
        self.pods.push_back(new.clone());
        (batch, new)
    }

    /// What NRP must hold: every service, every pod's address with its service.
    /// What NRP holds once the Services alone are programmed.
    fn expected_services(&self) -> Expected {
        Expected {
            addresses: BTreeMap::new(),
            ..self.expected()
        }
    }

    fn expected(&self) -> Expected {
        Expected {
            inbound: self.services.iter().cloned().collect(),
            outbound: BTreeSet::new(),
            addresses: self
                .pods
                .iter()
                .map(|p| {
                    (
                        (p.location.clone(), p.address.clone()),
                        BTreeSet::from([self.services[p.service].clone()]),
                    )
                })
                .collect(),
            rules: self
                .services
                .iter()
                .map(|s| (s.clone(), BTreeSet::from([("tcp".to_owned(), 80, 80)])))
                .collect(),
        }
    }

    /// Updates that remove the load's pods and services.
    fn cleanup_updates(&self) -> Vec<Update> {
        let mut out: Vec<Update> = self
            .pods
            .iter()
            .map(|p| updates::pod_remove(&p.address, &p.location, &p.key(), &p.uid()))
            .collect();
        out.extend(self.services.iter().map(|s| updates::service_remove(s)));
        out
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn note(line: &str) {
    eprintln!("load: {line}");
}

/// Runs `clbctl load`: [`measure`], then prints the report.
pub async fn run(global: &Global, args: &LoadArgs) -> anyhow::Result<ExitCode> {
    if args.agents.node_agents.is_some() {
        return super::load_agents::run(global, args).await;
    }
    let report = measure(global, args).await?;
    emit(global.output, &report, render)?;
    if report.ingest.updates_rejected > 0 {
        bail!(
            "the state server rejected {} updates of the load",
            report.ingest.updates_rejected
        );
    }
    if let Some(e) = &report.convergence_error {
        bail!("the system did not converge after the load: {e}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs the load and returns what it measured (for benchmarks that compare runs).
pub async fn measure(global: &Global, args: &LoadArgs) -> anyhow::Result<LoadReport> {
    measure_marked(global, args, None).await
}

/// [`measure`], sending `true` on `marks` when the churn starts and `false` when its last batch
/// was acknowledged (for a caller that measures the server over the churn).
pub async fn measure_marked(
    global: &Global,
    args: &LoadArgs,
    marks: Option<tokio::sync::mpsc::UnboundedSender<bool>>,
) -> anyhow::Result<LoadReport> {
    args.check()?;
    let mut model = Model::new(args);
    // `--state-server`, else a server named with the global `--server`: that server is loaded.
    let external = args.state_server.as_ref().or(global.server.as_ref());
    let (system, client) = match external {
        None => {
            note(&format!(
                "starting the embedded system: NRP emulator, state server, {} workers",
                args.workers
            ));
            let h = Harness::start(embedded_options(args)).await;
            let client = h.client().await.with_gateway(global.gateway.clone());
            (System::Embedded(Box::new(h)), client)
        }
        Some(url) => {
            let client = global
                .connect_to(url)
                .await
                .with_context(|| format!("load: cannot reach the state server at {url}"))?;
            let system = System::External(External {
                client: client.clone(),
                poll: Duration::from_millis(50),
                locations: Vec::new(),
                services: Vec::new(),
            });
            (system, client)
        }
    };
    let result = drive(args, &mut model, &system, &client, marks).await;
    system.shutdown().await;
    result
}

/// The embedded system `clbctl load` starts for `args` (the emulator free until [`costly`] is set).
pub fn embedded_options(args: &LoadArgs) -> Options {
    Options {
        nat_gateway_resource_group: None,
        workers: args.workers.max(1),
        worker_capacity: 4,
        worker_limits: Limits {
            max_locations_per_call: args.locations_per_call.max(1),
            max_concurrent_mutations_per_gateway: args.nrp_concurrency as usize,
            ..Limits::default()
        },
        // Free while the initial Services are created; `costly` applies from their pods on.
        emulator: EmulatorConfig::default(),
        server: ServerConfig {
            server_id: "clbctl-load".into(),
            expected_writers: Vec::new(),
            dispatch: DispatchConfig {
                lease: Duration::from_secs(60),
                max_locations_per_unit: args.locations_per_call.max(1),
                write_pace: args.write_pace.max(0.0) * args.nrp_write_speedup,
                batch_linger: args.batch_linger,
                unit_headway: args.unit_headway.max(0.0),
                retry_base: Duration::from_millis(20),
                retry_max: Duration::from_secs(1),
                ..DispatchConfig::default()
            },
            ..ServerConfig::default()
        },
        auth: None,
    }
}

/// The emulator's cost model `args` ask for (the write budget included, when asked for).
pub fn costly(args: &LoadArgs) -> EmulatorConfig {
    let (refill, window) = args.write_budget_clock();
    EmulatorConfig {
        latency_ms: args.emulator_latency_ms(),
        latency_per_address_us: args.emulator_latency_per_address_us(),
        max_concurrent_mutations: Some(args.nrp_concurrency as usize),
        write_bucket_size: args.nrp_write_bucket,
        write_refill_per_sec: refill,
        writes_per_window: args.nrp_writes_per_window,
        write_window_secs: window,
        ..EmulatorConfig::default()
    }
}

/// The write budget `args` ask for, as the notes and the report say it.
fn write_budget_text(args: &LoadArgs) -> Option<String> {
    if !args.write_budget_on() {
        return None;
    }
    let (refill, window) = args.write_budget_clock();
    let mut parts = Vec::new();
    if let Some(b) = args.nrp_write_bucket {
        parts.push(format!("bucket {b} writes + {refill} /s"));
    }
    if let Some(n) = args.nrp_writes_per_window {
        parts.push(format!("{n} writes per {window} s"));
    }
    if args.nrp_write_speedup != 1.0 {
        parts.push(format!("clock ×{}", args.nrp_write_speedup));
    }
    parts.push(if args.write_pace > 0.0 {
        format!(
            "server paces at {} writes/s below 20 left",
            args.write_pace * args.nrp_write_speedup
        )
    } else {
        "server pacing off".to_owned()
    });
    Some(parts.join(", "))
}

async fn apply_all(writer: &mut Writer, updates: Vec<Update>, what: &str) -> anyhow::Result<()> {
    let chunks: Vec<Vec<Update>> = updates.chunks(CHUNK).map(<[Update]>::to_vec).collect();
    let outcome = writer
        .apply_stream(futures::stream::iter(chunks))
        .await
        .with_context(|| format!("load: {what}"))?;
    if !outcome.rejected.is_empty() {
        bail!(
            "load: the state server rejected {} updates of the {what}:\n{}",
            outcome.rejected.len(),
            outcome.describe_rejected()
        );
    }
    Ok(())
}

async fn drive(
    args: &LoadArgs,
    model: &mut Model,
    system: &System,
    client: &Client,
    marks: Option<tokio::sync::mpsc::UnboundedSender<bool>>,
) -> anyhow::Result<LoadReport> {
    let embedded = system.is_embedded();
    let mut writer = client.writer(args.writer.clone());

    // 1. The initial population: the Services at no NRP cost (their creation is a few calls one
    // after the other each, seconds in all), then the pods at the cost model, so that the churn
    // begins with the state server's estimates of location calls from calls that cost what the
    // churn's do. (Programmed at no cost, the pods left estimates from free calls: the first
    // churn units were spaced for 13 ms calls, bunched, and the first second or two of the churn
    // paid for it — p99 ≈ 520 ms there against ≈ 360 ms.)
    note(&format!(
        "initial population: {} services, {} pods on {} locations{}",
        args.services,
        args.pods,
        args.locations,
        if embedded {
            " (the services at no NRP cost, the pods at the cost model)"
        } else {
            ""
        }
    ));
    let start = Instant::now();
    apply_all(&mut writer, model.initial_services(), "initial population").await?;
    system
        .try_converge(&model.expected_services(), args.patience)
        .await
        .map_err(|e| anyhow::anyhow!("load: the initial services did not converge: {e}"))?;
    if let Some(emulator) = system.emulator() {
        // The write budget stays off until the churn: the population is not what it measures.
        let cost = EmulatorConfig {
            write_bucket_size: None,
            writes_per_window: None,
            ..costly(args)
        };
        emulator
            .set_config(cost)
            .context("load: invalid NRP emulator settings")?;
    }
    apply_all(&mut writer, model.initial_pods(), "initial population").await?;
    system
        .try_converge(&model.expected(), args.patience)
        .await
        .map_err(|e| anyhow::anyhow!("load: the initial population did not converge: {e}"))?;
    let initial_sync = start.elapsed();
    note(&format!(
        "initial population programmed in {:.2} s",
        initial_sync.as_secs_f64()
    ));
    if let Some(emulator) = system.emulator() {
        emulator
            .set_config(costly(args))
            .context("load: invalid NRP emulator settings")?;
        emulator.reset_stats();
    }

    // 2. The churn, with the latency sampler beside it.
    note(&format!(
        "churning {} pods/s for {:.1} s{}",
        args.churn_per_sec,
        args.duration.as_secs_f64(),
        if embedded {
            format!(
                " (NRP: {} ms per call + {} ms per address, {} concurrent mutating calls{})",
                args.emulator_latency_ms(),
                args.emulator_latency_per_address_us() as f64 / 1000.0,
                args.nrp_concurrency,
                write_budget_text(args)
                    .map(|t| format!("; write budget per subscription: {t}"))
                    .unwrap_or_default()
            )
        } else {
            String::new()
        }
    ));
    let samples = Arc::new(Mutex::new(Samples::default()));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let poller = tokio::spawn(poll_samples(
        client.clone(),
        samples.clone(),
        args.sample_poll,
        args.sample_timeout,
        stop_rx.clone(),
    ));
    let pacing = Arc::new(Mutex::new(super::load_pacing::PacingView::default()));
    let pacing_sampler = system.server_state().map(|server| {
        tokio::spawn(super::load_pacing::sample(
            server,
            Duration::from_millis(100),
            pacing.clone(),
            stop_rx.clone(),
        ))
    });
    let max_events = (CHUNK / UPDATES_PER_EVENT).max(1) as u64;
    let mut events = 0u64;
    let mut acked_updates = 0u64;
    let mut rejected = 0u64;
    let mut batches = 0u64;
    let mut ack_times = Vec::new();
    let mut first_rejection: Option<String> = None;
    let churn_start = Instant::now();
    if let Some(m) = &marks {
        let _ = m.send(true);
    }
    let deadline = churn_start + args.duration;
    let mut last_ack = churn_start;
    let mut last_note = churn_start;
    let mut tick = tokio::time::interval(args.batch_window);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let due = if now >= deadline {
            (args.duration.as_secs_f64() * args.churn_per_sec).floor() as u64
        } else {
            ((now - churn_start).as_secs_f64() * args.churn_per_sec).floor() as u64
        };
        let n = due.saturating_sub(events).min(max_events);
        if n > 0 {
            let mut batch = Vec::with_capacity(n as usize * UPDATES_PER_EVENT);
            let mut newest = None;
            for _ in 0..n {
                let (u, p) = model.churn();
                batch.extend(u);
                newest = Some(p);
            }
            let sent = Instant::now();
            let outcome = writer.apply(batch).await.context("load: churn batch")?;
            let acked_at = Instant::now();
            ack_times.push(acked_at - sent);
            events += n;
            batches += outcome.batches;
            acked_updates += outcome.applied;
            rejected += outcome.rejected.len() as u64;
            if first_rejection.is_none() && !outcome.rejected.is_empty() {
                first_rejection = Some(outcome.describe_rejected());
            }
            last_ack = acked_at;
            if let Some(p) = newest
                && outcome.rejected.is_empty()
            {
                let mut s = lock(&samples);
                if s.pending.len() < args.max_samples_in_flight {
                    s.pending.push(Sample {
                        service: model.services[p.service].clone(),
                        address: p.address,
                        location: p.location,
                        acked_at,
                    });
                }
            }
        }
        if last_note.elapsed() >= Duration::from_secs(5) {
            last_note = Instant::now();
            let s = lock(&samples);
            note(&format!(
                "{:>5.1} s: {events} events, {acked_updates} updates acknowledged, {} latency \
                 samples ({} followed now)",
                churn_start.elapsed().as_secs_f64(),
                s.latencies.len(),
                s.pending.len()
            ));
        }
        if now >= deadline && events >= due {
            break;
        }
    }
    if let Some(m) = &marks {
        let _ = m.send(false);
    }
    let ingest_elapsed = last_ack.saturating_duration_since(churn_start);
    if let Some(r) = &first_rejection {
        note(&format!("rejected updates (first batch with any):\n{r}"));
    }

    // 3. Drain: wait for the followed samples, then for the system to converge. In this order:
    // the convergence check compares every address of NRP with the desired state, tens of
    // milliseconds on the state server's and the emulator's locks, and the samples still followed
    // at the churn's end (≈ 3 % of them) measured that check instead of the system.
    note("churn done; waiting for the system to converge");
    let sample_deadline = Instant::now() + Duration::from_secs(5).max(args.sample_poll * 10);
    while !lock(&samples).pending.is_empty() && Instant::now() < sample_deadline {
        tokio::time::sleep(args.sample_poll).await;
    }
    let expected = model.expected();
    let outcome = system.try_converge(&expected, args.patience).await;
    let drain = last_ack.elapsed();
    let _ = stop_tx.send(true);
    let _ = poller.await;
    if let Some(s) = pacing_sampler {
        let _ = s.await;
    }
    let pacing = system.server_state().map(|_| lock(&pacing).clone());
    let samples = std::mem::take(&mut *lock(&samples));

    let nrp = match system.stats() {
        Some(stats) => nrp_view(&stats, events),
        None => NrpView {
            available: false,
            note: Some(
                "unavailable: an external state server's NRP is not visible to clbctl (see the \
                 workers' metrics)"
                    .to_owned(),
            ),
            calls: None,
            update_address_locations_calls: None,
            addresses_carried: None,
            addresses_per_call: None,
            events_per_location_call: None,
            throttled: None,
            throttled_by_write_budget: None,
            max_concurrent_mutations: None,
        },
    };

    if !embedded && !args.keep {
        note("removing the load's services and pods from the desired state (--keep to leave them)");
        apply_all(&mut writer, model.cleanup_updates(), "clean-up").await?;
    }

    let secs = ingest_elapsed.as_secs_f64().max(1e-9);
    Ok(LoadReport {
        mode: if embedded { "embedded" } else { "external" }.to_owned(),
        state_server: client.endpoint().to_owned(),
        config: LoadConfigView {
            pods: args.pods,
            locations: args.locations,
            services: args.services,
            churn_per_sec: args.churn_per_sec,
            duration_s: args.duration.as_secs_f64(),
            batch_window_ms: args.batch_window.as_secs_f64() * 1000.0,
            embedded: embedded.then(|| EmbeddedView {
                workers: args.workers.max(1),
                nrp_latency_ms: args.emulator_latency_ms(),
                nrp_latency_per_address_us: args.emulator_latency_per_address_us(),
                nrp_concurrency: args.nrp_concurrency,
                locations_per_call: args.locations_per_call.max(1),
                nrp_write_budget: write_budget_text(args),
            }),
        },
        initial_sync_s: round3(initial_sync.as_secs_f64()),
        ingest: IngestView {
            churn_events: events,
            updates_acknowledged: acked_updates,
            updates_rejected: rejected,
            elapsed_s: round3(ingest_elapsed.as_secs_f64()),
            updates_per_sec: round(acked_updates as f64 / secs),
            churn_events_per_sec: round(events as f64 / secs),
            target_churn_per_sec: args.churn_per_sec,
            batches,
            batch_ack: Percentiles::of(&ack_times),
        },
        convergence: LatencyView {
            method: format!(
                "per sampled churn event (at most {} followed at once): from the acknowledgement \
                 of its batch until Admin.GetLocation of the new pod's location shows the address \
                 in the actual state (what a worker reported NRP accepted) with its service; \
                 polled every {} ms, so the resolution is the poll interval",
                args.max_samples_in_flight,
                args.sample_poll.as_millis()
            ),
            latency: Percentiles::of(&samples.latencies),
            abandoned: samples.abandoned,
            not_converged: samples.pending.len() + samples.timed_out as usize,
            poll_errors: samples.poll_errors,
        },
        drain_s: round3(drain.as_secs_f64()),
        converged: outcome.is_ok(),
        convergence_error: outcome.err(),
        nrp,
        pacing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let p = Percentiles::of(&v);
        assert_eq!(p.count, 100);
        assert_eq!(p.p50_ms, Some(50.0));
        assert_eq!(p.p99_ms, Some(99.0));
        assert_eq!(p.max_ms, Some(100.0));
        assert_eq!(Percentiles::of(&[]).p50_ms, None);
    }

    #[derive(Debug, clap::Parser)]
    struct Wrapper {
        #[command(flatten)]
        load: LoadArgs,
    }

    #[test]
    fn write_budget_flags_reach_the_emulator() {
        use clap::Parser as _;
        let parse = |argv: &[&str]| {
            let args =
                Wrapper::parse_from(std::iter::once("load").chain(argv.iter().copied())).load;
            args.check().map(|()| args)
        };
        let off = parse(&[]).unwrap();
        assert!(!off.write_budget_on());
        let c = costly(&off);
        assert_eq!((c.write_bucket_size, c.writes_per_window), (None, None));
        assert_eq!(write_budget_text(&off), None);

        let on = parse(&[
            "--nrp-write-bucket=200",
            "--nrp-write-refill=10",
            "--nrp-writes-per-window=1000",
            "--nrp-write-speedup=10",
        ])
        .unwrap();
        let c = costly(&on);
        c.validate().unwrap();
        assert_eq!(c.write_bucket_size, Some(200));
        assert!((c.write_refill_per_sec - 100.0).abs() < 1e-9);
        assert_eq!(c.writes_per_window, Some(1000));
        assert_eq!(c.write_window_secs, 30, "5 minutes, 10 times faster");
        assert_eq!(
            write_budget_text(&on).as_deref(),
            Some(
                "bucket 200 writes + 100 /s, 1000 writes per 30 s, clock ×10, server paces at 30 writes/s below 20 left"
            )
        );
        assert!(parse(&["--nrp-write-speedup=0"]).is_err());
        assert!(parse(&["--nrp-write-window=0s"]).is_err());
    }

    #[test]
    fn churn_replaces_the_oldest_pod_with_a_new_address() {
        use clap::Parser as _;
        use std::collections::HashMap;
        let args = Wrapper::parse_from([
            "load",
            "--pods",
            "10",
            "--locations",
            "3",
            "--services",
            "2",
        ])
        .load;
        args.check().expect("valid");
        let mut m = Model::new(&args);
        let first = m.pods.front().cloned().expect("a pod");
        let (updates, new) = m.churn();
        assert_eq!(updates.len(), UPDATES_PER_EVENT);
        assert_eq!(m.pods.len(), 10);
        assert!(m.pods.iter().all(|p| p.address != first.address));
        assert_eq!(new.service, first.service);
        let addresses: HashMap<&str, usize> = m
            .pods
            .iter()
            .map(|p| (p.address.as_str(), p.service))
            .collect();
        assert_eq!(addresses.len(), 10, "addresses are unique");
        assert_eq!(m.expected().addresses.len(), 10);
    }
}
