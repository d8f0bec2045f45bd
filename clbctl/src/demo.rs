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
//!
//! With [`DemoConfig::external`] (`clbctl demo --state-server URL`) the same phases drive an
//! external state server (and whatever workers and NRP it has) instead: there is no emulator to
//! read, so a phase has converged when the Admin API says so — initialization gates open, desired
//! and programmed counts equal, nothing dirty or in flight, an empty pending diff — and then every
//! location and service of the cluster is read back with `Admin.GetLocation` / `Admin.GetService`
//! and compared with the expected state. NRP call counts are not available in that mode.

use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use clb_client::client::{Client, Writer, scope};
use clb_core::dispatch::DispatchConfig;
use clb_embedded::cluster::location_ip;
use clb_embedded::{Harness, Options, PodWriters, WATCHER};
use clb_nrp_emulator::{EmulatorConfig, Stats};
use clb_proto::v1::{ClusterTopology, Update};
use clb_state_server::state::ServerConfig;
use clb_sync_worker::worker::Limits;
use comfy_table::{Cell, CellAlignment, ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use clb_embedded::{Cluster, ClusterSpec, Expected};

use crate::system::{External, System};

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
    /// Progress and messages to stderr (stdout is left to a JSON summary).
    pub json: bool,
    /// Drive this external state server instead of the embedded system (the cluster spec applies;
    /// the emulator and worker settings do not).
    pub external: Option<Client>,
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
            json: false,
            external: None,
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
            nat_gateway_resource_group: None,
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
            auth: None,
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
    /// The emulator's statistics over the phase (`None` on an external state server: NRP is not
    /// visible).
    pub stats: Option<Stats>,
    /// Addresses desired at the end of the phase.
    pub desired_addresses: u64,
    /// `Ok` when NRP equals the desired state at the end of the phase; otherwise the differences.
    pub outcome: Result<(), String>,
}

impl PhaseReport {
    /// `updateAddressLocations` calls in the phase.
    pub fn location_calls(&self) -> Option<u64> {
        self.stats.as_ref().map(|s| s.calls_of(UAL))
    }

    /// Mutating calls NRP refused for throttling (429, the write budget's included, or another
    /// operation in progress); each is
    /// retried after its `Retry-After`.
    pub fn throttled(&self) -> Option<u64> {
        self.stats.as_ref().map(|s| {
            s.rejected("TooManyRequests")
                + s.rejected("SubscriptionRequestsThrottled")
                + s.rejected("AnotherOperationInProgress")
        })
    }

    /// Addresses carried per `updateAddressLocations` call.
    pub fn addresses_per_call(&self) -> Option<f64> {
        let s = self.stats.as_ref()?;
        Some(s.addresses_carried as f64 / s.calls_of(UAL).max(1) as f64)
    }
}

/// Every phase played, in order.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// One report per phase played (the demo stops at the first phase that does not converge).
    pub phases: Vec<PhaseReport>,
    /// Played on an external state server (NRP not visible).
    pub external: bool,
}

impl Summary {
    /// Whether every phase converged to NRP = desired state.
    pub fn ok(&self) -> bool {
        !self.phases.is_empty() && self.phases.iter().all(|p| p.outcome.is_ok())
    }

    /// The closing line of a successful demo: what was checked.
    pub fn verdict(&self) -> &'static str {
        if self.external {
            "every phase converged: the state server's actual state (what NRP confirmed) equals \
             the desired state, read back through the Admin API"
        } else {
            "every phase converged: NRP equals the desired state"
        }
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

    /// The summary table: phase, time to converge, NRP calls, addresses per call ([`LEGEND`]
    /// explains the columns).
    pub fn table(&self) -> Table {
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Disabled)
            .set_header(vec![
                "phase",
                "ok",
                "time",
                "calls",
                "UAL calls",
                "carried",
                "per call",
                "throttled",
                "desired",
            ]);
        for p in &self.phases {
            let right = |s: String| Cell::new(s).set_alignment(CellAlignment::Right);
            let na = |v: Option<String>| right(v.unwrap_or_else(|| "n/a".to_owned()));
            t.add_row(vec![
                Cell::new(&p.phase),
                Cell::new(if p.outcome.is_ok() { "yes" } else { "NO" }),
                right(format!("{:.2} s", p.elapsed.as_secs_f64())),
                na(p.stats.as_ref().map(|s| s.calls.to_string())),
                na(p.location_calls().map(|n| n.to_string())),
                na(p.stats.as_ref().map(|s| s.addresses_carried.to_string())),
                na(p.addresses_per_call().map(|a| format!("{a:.1}"))),
                na(p.throttled().map(|n| n.to_string())),
                right(p.desired_addresses.to_string()),
            ]);
        }
        t
    }
}

/// What the summary table's columns mean, a line each (the table itself stays within 100
/// columns).
pub const LEGEND: &str = "\
ok         the phase converged: NRP holds exactly the desired state
time       from the phase's first write to convergence
calls      every call made to NRP (Azure's network resource provider) in the phase
UAL calls  updateAddressLocations calls: the batched call that sets the pod IPs of many
           locations (nodes) at once
carried    addresses sent in those calls; per call: carried / UAL calls
throttled  calls NRP refused for throttling (429, another operation in progress), retried
desired    addresses (pod IPs) desired at the end of the phase";

/// One phase's change to the cluster, returning what the watcher writes for it.
type Step = Box<dyn FnOnce(&mut Cluster) -> Writes>;

enum Writes {
    /// The watcher's view, with the nodes it declares (the restart gate's topology).
    Resync(Vec<Update>, ClusterTopology),
    Apply(Vec<Vec<Update>>),
}

/// Prints a line on stdout, or on stderr when stdout is kept for a JSON summary.
fn say(config: &DemoConfig, line: &str) {
    if config.json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

/// Progress output: an indicatif spinner on a terminal, plain lines otherwise.
struct Progress {
    bar: Option<ProgressBar>,
    phase: String,
    last_line: Instant,
    json: bool,
}

impl Progress {
    fn start(phase: &str, config: &DemoConfig) -> Self {
        let terminal = if config.json {
            std::io::stderr().is_terminal()
        } else {
            std::io::stdout().is_terminal()
        };
        let bar = (!config.plain && terminal).then(|| {
            let target = if config.json {
                ProgressDrawTarget::stderr()
            } else {
                ProgressDrawTarget::stdout()
            };
            let bar = ProgressBar::with_draw_target(None, target);
            bar.set_style(
                // wide_msg: cut to the terminal's width, so a redraw never wraps (a wrapped line
                // is not cleared and the phases' lines would run together).
                ProgressStyle::with_template("{spinner:.cyan} {prefix:.bold:<16} {wide_msg}")
                    .expect("valid template"),
            );
            bar.set_prefix(phase.to_owned());
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        });
        if bar.is_none() {
            say(config, &format!("== {phase}"));
        }
        Self {
            bar,
            phase: phase.to_owned(),
            last_line: Instant::now(),
            json: config.json,
        }
    }

    fn line(&self, msg: &str) {
        if self.json {
            eprintln!("   {msg}");
        } else {
            println!("   {msg}");
        }
    }

    fn update(&mut self, msg: String) {
        match &self.bar {
            Some(bar) => bar.set_message(msg),
            None if self.last_line.elapsed() >= Duration::from_secs(1) => {
                self.last_line = Instant::now();
                self.line(&msg);
            }
            None => {}
        }
    }

    fn finish(self, msg: String) {
        // The spinner's line is cleared and the outcome printed as a line of its own, under the
        // phase's name (plain output has the name on the line above).
        match &self.bar {
            Some(bar) => {
                bar.finish_and_clear();
                self.line(&format!("{:<16} {msg}", self.phase));
            }
            None => self.line(&msg),
        }
    }
}

/// A writer connected as the watcher, to the system the demo drives.
async fn watcher_of(system: &System) -> Writer {
    match system {
        System::Embedded(h) => h.watcher().await,
        System::External(x) => x.client.writer(WATCHER),
    }
}

/// One line of progress: desired vs programmed addresses, NRP calls (or dirty locations when NRP is
/// not visible), units in flight.
async fn progress_line(system: &System, start: Instant) -> String {
    let g = match system.gateway_status().await {
        Ok(g) => g,
        Err(e) => return format!("{:>6.1} s  status: {e}", start.elapsed().as_secs_f64()),
    };
    let nrp = match system.stats() {
        Some(s) => format!(
            "NRP calls {} ({} in flight)",
            s.calls, s.in_flight_mutations
        ),
        None => format!("dirty locations {}", g.dirty_locations),
    };
    format!(
        "{:>6.1} s  addresses desired {} / programmed {}  ·  {nrp}  ·  units in flight {}",
        start.elapsed().as_secs_f64(),
        g.desired_addresses,
        g.actual_addresses,
        g.units_in_flight,
    )
}

/// Sends a phase's writes; any failed call or rejected item fails the phase.
async fn write(watcher: &mut Writer, writes: Writes) -> Result<(), String> {
    let rejected = match writes {
        Writes::Resync(view, topology) => {
            let r = watcher
                .resync_with_topology(scope::all(), Some(topology), view)
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
    system: &System,
    watcher: &mut Writer,
    name: &str,
    writes: Writes,
    expected: &Expected,
    config: &DemoConfig,
) -> PhaseReport {
    let mut progress = Progress::start(name, config);
    system.reset_stats();
    let start = Instant::now();
    let work = async {
        write(watcher, writes).await?;
        system.try_converge(expected, config.patience).await
    };
    tokio::pin!(work);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let outcome = loop {
        tokio::select! {
            r = &mut work => break r,
            _ = tick.tick() => progress.update(progress_line(system, start).await),
        }
    };
    let elapsed = start.elapsed();
    let stats = system.stats();
    let desired_addresses = system
        .gateway_status()
        .await
        .map_or(0, |g| g.desired_addresses);
    let (verdict, calls) = match (&outcome, &stats) {
        (Ok(()), Some(s)) => ("NRP = desired state", format!("{} NRP calls", s.calls)),
        (Err(_), Some(s)) => (
            "NRP DIFFERS from the desired state",
            format!("{} NRP calls", s.calls),
        ),
        (Ok(()), None) => (
            "actual = desired state",
            "checked through the Admin API".to_owned(),
        ),
        (Err(_), None) => (
            "actual state DIFFERS from the desired state",
            "checked through the Admin API".to_owned(),
        ),
    };
    progress.finish(format!(
        "{verdict} after {:.2} s  ·  {desired_addresses} addresses  ·  {calls}",
        elapsed.as_secs_f64(),
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
    let shape = format!(
        "{} services, {} egresses, {} pods on {} nodes",
        spec.apps + spec.apps.div_ceil(3),
        spec.egresses,
        spec.pods(),
        spec.locations,
    );
    let mut cluster = Cluster::generate(spec.clone());
    let system = match &config.external {
        None => {
            say(
                config,
                &format!(
                    "clb demo: {shape}; {} workers; NRP emulator: {} ms per call + {} ms per \
                     address, {} concurrent mutating calls",
                    config.workers,
                    config.latency_ms,
                    config.latency_per_address_us as f64 / 1000.0,
                    config.concurrency,
                ),
            );
            System::Embedded(Box::new(Harness::start(config.options()).await))
        }
        Some(client) => {
            say(
                config,
                &format!(
                    "clb demo: {shape}; external state server {} (gateway {}): its workers and \
                     NRP do the work. The demo replaces the server's desired state (a resync of \
                     every kind as {WATCHER:?}). No emulator here: a phase has converged when the \
                     Admin API shows the gates open, desired = programmed counts, nothing dirty \
                     or in flight and an empty pending diff; then every location and service is \
                     read back (Admin.GetLocation / GetService) and compared with the expected \
                     state. NRP call counts are not available.",
                    client.endpoint(),
                    if client.gateway().is_empty() {
                        "default"
                    } else {
                        client.gateway()
                    },
                ),
            );
            let mut services: Vec<String> = cluster.services().keys().cloned().collect();
            services.extend(cluster.expected().outbound);
            System::External(External {
                client: client.clone(),
                poll: Duration::from_millis(100),
                locations: (0..spec.locations).map(location_ip).collect(),
                services,
            })
        }
    };
    let mut watcher = watcher_of(&system).await;
    let mut summary = Summary {
        external: config.external.is_some(),
        ..Summary::default()
    };

    let view = cluster.full_view();
    let topology = cluster.topology(PodWriters::Watcher);
    let mut steps: Vec<(&str, Step)> = vec![
        ("create", Box::new(move |_| Writes::Resync(view, topology))),
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
        let report = phase(&system, &mut watcher, name, writes, &expected, config).await;
        let failed = report.outcome.is_err();
        summary.phases.push(report);
        if failed {
            break;
        }
    }
    system.shutdown().await;
    summary
}
