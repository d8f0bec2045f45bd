//! `clbctl demo`: the whole system in one process over loopback — the NRP emulator with a
//! realistic cost model, the state server, two sync workers — driven by a synthetic cluster through
//! the Writer gRPC API, as the kube watcher drives it, through the phases create → rollout → scale
//! down → delete a service → node drained.
//!
//! Each phase writes its changes, then waits until the server has nothing left to do and compares
//! NRP (the emulator's state) with the desired state. Progress (desired vs programmed addresses, NRP
//! calls, units in flight) is polled from the Admin API and the emulator every 100 ms and shown as
//! a spinner on a terminal, or as plain lines otherwise. [`run`] returns a [`Summary`] with one
//! [`PhaseReport`] per phase played; the demo succeeded when [`Summary::ok`].

use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use crate::client::{Writer, scope};
use crate::embedded::{Harness, Options, WATCHER};
use clb_proto::v1::Update;
use clb_state_server::dispatch::DispatchConfig;
use clb_state_server::state::ServerConfig;
use clb_sync_worker::nrp::emulator::{EmulatorConfig, Stats};
use clb_sync_worker::worker::Limits;
use comfy_table::{Cell, CellAlignment, ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::embedded::{Cluster, ClusterSpec, Expected};

const UAL: &str = "ServiceGateways_UpdateAddressLocations";

/// How the demo is played.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// The synthetic cluster.
    pub spec: ClusterSpec,
    /// Pods per app after the scale-down phase.
    pub scale_down_to: usize,
    /// Sync workers.
    pub workers: usize,
    /// Emulated NRP latency per call, in milliseconds.
    pub latency_ms: u64,
    /// Emulated NRP latency per address carried, in microseconds.
    pub latency_per_address_us: u64,
    /// Concurrent mutating NRP calls allowed per gateway.
    pub concurrency: usize,
    /// Most locations in one work unit and in one NRP call.
    pub locations_per_call: usize,
    /// Upper bound of one phase's convergence (a guard against a hang, not a target).
    pub patience: Duration,
    /// Print plain progress lines even on a terminal.
    pub plain: bool,
}

impl DemoConfig {
    /// The README's demo: 54 services (40 apps, every third with a second Service), 20 egresses,
    /// 2,000 pods on 100 nodes; NRP costs 20 ms per call + 0.01 ms per address, 4 concurrent
    /// mutating calls.
    pub fn full() -> Self {
        Self {
            spec: ClusterSpec {
                locations: 100,
                apps: 40,
                pods_per_app: 50,
                egresses: 20,
                not_ready_every: 25,
                seed: 42,
            },
            scale_down_to: 30,
            workers: 2,
            latency_ms: 20,
            latency_per_address_us: 10,
            concurrency: 4,
            locations_per_call: 50,
            patience: Duration::from_secs(600),
            plain: false,
        }
    }

    /// For CI: 11 services, 5 egresses, 200 pods on 20 nodes; 2 ms per call.
    pub fn quick() -> Self {
        Self {
            spec: ClusterSpec {
                locations: 20,
                apps: 8,
                pods_per_app: 25,
                egresses: 5,
                not_ready_every: 25,
                seed: 42,
            },
            scale_down_to: 15,
            latency_ms: 2,
            locations_per_call: 8,
            patience: Duration::from_secs(120),
            ..Self::full()
        }
    }

    fn options(&self) -> Options {
        Options {
            workers: self.workers,
            worker_capacity: 4,
            worker_limits: Limits {
                max_locations_per_call: self.locations_per_call,
                max_concurrent_mutations_per_gateway: self.concurrency,
                ..Limits::default()
            },
            emulator: EmulatorConfig {
                latency_ms: self.latency_ms,
                latency_per_address_us: self.latency_per_address_us,
                max_concurrent_mutations: Some(self.concurrency),
                ..EmulatorConfig::default()
            },
            server: ServerConfig {
                server_id: "clbctl-demo".into(),
                expected_writers: vec![WATCHER.into()],
                dispatch: DispatchConfig {
                    lease: Duration::from_secs(60),
                    max_locations_per_unit: self.locations_per_call,
                    retry_base: Duration::from_millis(20),
                    retry_max: Duration::from_secs(1),
                    ..DispatchConfig::default()
                },
                ..ServerConfig::default()
            },
        }
    }
}

/// The outcome of one phase.
#[derive(Debug, Clone)]
pub struct PhaseReport {
    /// The phase's name.
    pub phase: String,
    /// From the first write of the phase to convergence (or to the failure).
    pub elapsed: Duration,
    /// The emulator's statistics over the phase.
    pub stats: Stats,
    /// Addresses desired at the end of the phase.
    pub desired_addresses: u64,
    /// `Ok` when NRP equals the desired state at the end of the phase; otherwise the differences.
    pub outcome: Result<(), String>,
}

impl PhaseReport {
    /// `updateAddressLocations` calls in the phase.
    pub fn location_calls(&self) -> u64 {
        self.stats.calls_of(UAL)
    }

    /// Mutating calls NRP refused for throttling (429 or another operation in progress); each is
    /// retried after its `Retry-After`.
    pub fn throttled(&self) -> u64 {
        self.stats.rejected("TooManyRequests") + self.stats.rejected("AnotherOperationInProgress")
    }

    /// Addresses carried per `updateAddressLocations` call.
    pub fn addresses_per_call(&self) -> f64 {
        self.stats.addresses_carried as f64 / self.location_calls().max(1) as f64
    }
}

/// Every phase played, in order.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// One report per phase played (the demo stops at the first phase that does not converge).
    pub phases: Vec<PhaseReport>,
}

impl Summary {
    /// Whether every phase converged to NRP = desired state.
    pub fn ok(&self) -> bool {
        !self.phases.is_empty() && self.phases.iter().all(|p| p.outcome.is_ok())
    }

    /// The first failure, if any: `phase: differences`.
    pub fn failure(&self) -> Option<String> {
        self.phases.iter().find_map(|p| {
            p.outcome
                .as_ref()
                .err()
                .map(|e| format!("phase {:?} did not converge: {e}", p.phase))
        })
    }

    /// The summary table: phase, time to converge, NRP calls, addresses per call.
    pub fn table(&self) -> Table {
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Disabled)
            .set_header(vec![
                "phase",
                "converged",
                "time to converge",
                "NRP calls",
                "updateAddressLocations calls",
                "addresses carried",
                "addresses per call",
                "throttled",
                "desired addresses",
            ]);
        for p in &self.phases {
            let right = |s: String| Cell::new(s).set_alignment(CellAlignment::Right);
            t.add_row(vec![
                Cell::new(&p.phase),
                Cell::new(if p.outcome.is_ok() { "yes" } else { "NO" }),
                right(format!("{:.2} s", p.elapsed.as_secs_f64())),
                right(p.stats.calls.to_string()),
                right(p.location_calls().to_string()),
                right(p.stats.addresses_carried.to_string()),
                right(format!("{:.1}", p.addresses_per_call())),
                right(p.throttled().to_string()),
                right(p.desired_addresses.to_string()),
            ]);
        }
        t
    }
}

/// One phase's change to the cluster, returning what the watcher writes for it.
type Step = Box<dyn FnOnce(&mut Cluster) -> Writes>;

enum Writes {
    Resync(Vec<Update>),
    Apply(Vec<Vec<Update>>),
}

/// Progress output: an indicatif spinner on a terminal, plain lines otherwise.
struct Progress {
    bar: Option<ProgressBar>,
    last_line: Instant,
}

impl Progress {
    fn start(phase: &str, plain: bool) -> Self {
        let bar = (!plain && std::io::stdout().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stdout());
            bar.set_style(
                ProgressStyle::with_template("{spinner:.cyan} {prefix:.bold:<16} {msg}")
                    .expect("valid template"),
            );
            bar.set_prefix(phase.to_owned());
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        });
        if bar.is_none() {
            println!("== {phase}");
        }
        Self {
            bar,
            last_line: Instant::now(),
        }
    }

    fn update(&mut self, msg: String) {
        match &self.bar {
            Some(bar) => bar.set_message(msg),
            None if self.last_line.elapsed() >= Duration::from_secs(1) => {
                self.last_line = Instant::now();
                println!("   {msg}");
            }
            None => {}
        }
    }

    fn finish(self, msg: String) {
        match self.bar {
            Some(bar) => bar.finish_with_message(msg),
            None => println!("   {msg}"),
        }
    }
}

async fn progress_line(h: &Harness, start: Instant) -> String {
    let g = h.gateway_status().await;
    let s = h.emulator().stats();
    format!(
        "{:>6.1} s  addresses desired {} / programmed {}  ·  NRP calls {} ({} in flight)  ·  units in \
         flight {}",
        start.elapsed().as_secs_f64(),
        g.desired_addresses,
        g.actual_addresses,
        s.calls,
        s.in_flight_mutations,
        g.units_in_flight,
    )
}

/// Sends a phase's writes; any failed call or rejected item fails the phase.
async fn write(watcher: &mut Writer, writes: Writes) -> Result<(), String> {
    let rejected = match writes {
        Writes::Resync(view) => {
            let r = watcher
                .resync(scope::all(), view)
                .await
                .map_err(|e| e.to_string())?;
            r.describe_rejected()
        }
        Writes::Apply(batches) => {
            let mut rejected = String::new();
            for b in batches {
                let r = watcher.apply(b).await.map_err(|e| e.to_string())?;
                rejected.push_str(&r.describe_rejected());
            }
            rejected
        }
    };
    if rejected.is_empty() {
        Ok(())
    } else {
        Err(format!("the state server rejected updates:\n{rejected}"))
    }
}

async fn phase(
    h: &Harness,
    watcher: &mut Writer,
    name: &str,
    writes: Writes,
    expected: &Expected,
    config: &DemoConfig,
) -> PhaseReport {
    let mut progress = Progress::start(name, config.plain);
    h.emulator().reset_stats();
    let start = Instant::now();
    let work = async {
        write(watcher, writes).await?;
        h.try_converge(expected, config.patience).await
    };
    tokio::pin!(work);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let outcome = loop {
        tokio::select! {
            r = &mut work => break r,
            _ = tick.tick() => progress.update(progress_line(h, start).await),
        }
    };
    let elapsed = start.elapsed();
    let stats = h.emulator().stats();
    let desired_addresses = h.gateway_status().await.desired_addresses;
    let verdict = match &outcome {
        Ok(()) => "NRP = desired state",
        Err(_) => "NRP DIFFERS from the desired state",
    };
    progress.finish(format!(
        "{verdict} after {:.2} s  ·  {desired_addresses} addresses  ·  {} NRP calls",
        elapsed.as_secs_f64(),
        stats.calls
    ));
    PhaseReport {
        phase: name.to_owned(),
        elapsed,
        stats,
        desired_addresses,
        outcome,
    }
}

/// Plays the demo with `config` and returns what each phase did. Stops at the first phase that
/// does not converge (see [`Summary::ok`]).
pub async fn run(config: &DemoConfig) -> Summary {
    let spec = &config.spec;
    println!(
        "clb demo: {} services, {} egresses, {} pods on {} nodes; {} workers; NRP emulator: {} ms \
         per call + {} ms per address, {} concurrent mutating calls",
        spec.apps + spec.apps.div_ceil(3),
        spec.egresses,
        spec.pods(),
        spec.locations,
        config.workers,
        config.latency_ms,
        config.latency_per_address_us as f64 / 1000.0,
        config.concurrency,
    );
    let h = Harness::start(config.options()).await;
    let mut watcher = h.watcher().await;
    let mut cluster = Cluster::generate(spec.clone());
    let mut summary = Summary::default();

    let view = cluster.full_view();
    let mut steps: Vec<(&str, Step)> = vec![
        ("create", Box::new(move |_| Writes::Resync(view))),
        ("rollout", Box::new(|c| Writes::Apply(c.roll_all()))),
    ];
    let keep = config.scale_down_to;
    steps.push((
        "scale down",
        Box::new(move |c| Writes::Apply(c.scale_down(keep))),
    ));
    steps.push((
        "delete a service",
        Box::new(|c| {
            let name = c.services().keys().next().cloned().unwrap_or_default();
            Writes::Apply(vec![c.remove_service(&name)])
        }),
    ));
    steps.push((
        "node drained",
        Box::new(|c| {
            let node = c.busiest_node().unwrap_or_default();
            Writes::Apply(c.drain_node(&node))
        }),
    ));
    for (name, step) in steps {
        let writes = step(&mut cluster);
        let expected = cluster.expected();
        let report = phase(&h, &mut watcher, name, writes, &expected, config).await;
        let failed = report.outcome.is_err();
        summary.phases.push(report);
        if failed {
            break;
        }
    }
    h.shutdown().await;
    summary
}
