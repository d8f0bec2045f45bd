//! The dispatcher against a modelled NRP, in simulated time: steady pod churn, four mutating
//! slots, calls that cost a fixed latency plus a per-address one. The real `DiffTracker` and
//! `Dispatcher` run; only the clock, the workers and NRP are modelled, so the figures show what
//! the dispatching rules do with no CPU contention, network or runtime in the way (the end-to-end
//! counterpart is `clbctl load`). Convergence latency: from a churn event to the report of the
//! unit that carried its new address.
//!
//! ```sh
//! cargo bench -p clb-core --bench dispatch_sim
//! CLB_SIM_HEADWAYS=0,1.05,1.2 CLB_SIM_RATES=2000,20000 CLB_SIM_OVERHEAD_MS=20 cargo bench -p clb-core --bench dispatch_sim
//! CLB_SIM_JITTER_MS=0,20 CLB_SIM_FREE_START=1 cargo bench -p clb-core --bench dispatch_sim
//! ```
//!
//! `CLB_SIM_JITTER_MS`: each unit's time gets a further 0 to that many ms, at random (a shared,
//! loaded machine). `CLB_SIM_FREE_START=1`: the initial cluster is programmed at no cost, as
//! `clbctl load` does, so the churn begins with a duration estimate from cheap calls.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use clb_core::difftracker::{ActualSnapshot, DiffTracker, Endpoint, Operation};
use clb_core::dispatch::{DispatchConfig, DispatchEnv, Dispatcher, Outcome, Report, UnitWork};

const PODS: usize = 10_000;
const LOCATIONS: usize = 500;
const SERVICES: usize = 50;
const SLOTS: usize = 4;
/// The modelled NRP: a call costs this plus `PER_ADDRESS_US` per address (as `clbctl load`'s
/// emulator does by default).
const CALL_MS: f64 = 100.0;
const PER_ADDRESS_US: f64 = 50.0;
const SECONDS: u64 = 10;

fn env_list(name: &str, default: &str) -> Vec<f64> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect()
}

/// A pod: its address and location, as strings the tracker takes.
#[derive(Clone)]
struct Pod {
    service: usize,
    address: String,
    location: String,
}

struct Model {
    pods: VecDeque<Pod>,
    next: u64,
    seed: u64,
}

impl Model {
    fn pod(&mut self, service: usize) -> Pod {
        self.next += 1;
        self.seed = self
            .seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        let l = (self.seed >> 33) as usize % LOCATIONS;
        let n = self.next;
        Pod {
            service,
            address: format!("10.{}.{}.{}", 64 + (n >> 16) % 64, (n >> 8) % 256, n % 256),
            location: format!("172.16.{}.{}", l / 256, l % 256),
        }
    }
}

fn service(i: usize) -> String {
    format!("svc-{i}")
}

fn ep(p: &Pod) -> Endpoint<'_> {
    Endpoint {
        address: &p.address,
        location: &p.location,
    }
}

struct Outcomes {
    latencies_ms: Vec<f64>,
    calls: u64,
    addresses: u64,
}

/// The shape of one simulated run.
#[derive(Clone, Copy)]
struct Shape {
    /// Churn events per second.
    rate: f64,
    /// `DispatchConfig::unit_headway`.
    headway: f64,
    /// A worker-side cost per unit (report, scheduling), ms.
    overhead_ms: f64,
    /// At most this many ms more per unit, uniformly at random.
    jitter_ms: f64,
    /// The initial cluster is programmed at no cost.
    free_start: bool,
}

/// One run of `shape`.
fn run(shape: Shape) -> Outcomes {
    let Shape {
        rate,
        headway,
        overhead_ms,
        jitter_ms,
        free_start,
    } = shape;
    let mut noise = 0x9e37_79b9_7f4a_7c15u64;
    let t0 = Instant::now();
    let mut t = DiffTracker::new();
    let mut m = Model {
        pods: VecDeque::new(),
        next: 0,
        seed: 7,
    };
    let mut by_service: Vec<Vec<Pod>> = vec![Vec::new(); SERVICES];
    for i in 0..PODS {
        let p = m.pod(i % SERVICES);
        by_service[i % SERVICES].push(p.clone());
        m.pods.push_back(p);
    }
    for (s, pods) in by_service.iter().enumerate() {
        t.update_service(Operation::Add, &service(s)).unwrap();
        let eps: Vec<Endpoint> = pods.iter().map(ep).collect();
        t.set_endpoints(&service(s), &eps).unwrap();
    }
    let config = DispatchConfig {
        max_mutating_units_in_flight: SLOTS,
        unit_headway: headway,
        ..DispatchConfig::default()
    };
    let mut d = Dispatcher::new(config, DispatchEnv::new(t0, 1_700_000_000_000, 42));
    let mut id = 0u64;
    // Reports due: at (µs) → work id.
    let mut due: BTreeMap<(u64, u64), ()> = BTreeMap::new();
    let mut carried: HashMap<u64, Vec<IpAddr>> = HashMap::new();
    // The arrival (µs) of each address change still to be carried.
    let mut arrived: HashMap<IpAddr, u64> = HashMap::new();
    let mut out = Outcomes {
        latencies_ms: Vec::new(),
        calls: 0,
        addresses: 0,
    };
    // Churn starts once the initial cluster is programmed, and runs for SECONDS.
    let mut warm_up = u64::MAX;
    let mut owed = 0.0f64;
    let mut now_us = 0u64;
    // Steps of 1 ms: churn arrives, reports land, units are cut.
    while now_us < warm_up.saturating_add((SECONDS + 5) * 1_000_000) {
        let now = t0 + Duration::from_micros(now_us);
        if warm_up == u64::MAX && due.is_empty() && now_us > 0 && t.pending_diff().is_empty() {
            warm_up = now_us;
            out = Outcomes {
                latencies_ms: Vec::new(),
                calls: 0,
                addresses: 0,
            };
        }
        if now_us >= warm_up && now_us < warm_up + SECONDS * 1_000_000 {
            owed += rate / 1000.0;
            while owed >= 1.0 {
                owed -= 1.0;
                let old = m.pods.pop_front().expect("pods");
                let new = m.pod(old.service);
                t.update_endpoints(&service(old.service), &[ep(&old)], &[ep(&new)])
                    .unwrap();
                arrived.insert(new.address.parse().unwrap(), now_us);
                m.pods.push_back(new);
            }
        }
        let landed: Vec<(u64, u64)> = due.range(..(now_us + 1, 0)).map(|(k, _)| *k).collect();
        for key in landed {
            due.remove(&key);
            let work_id = key.1;
            let report = Report {
                work_id,
                applied: vec![],
                progress: vec![],
                refused: Vec::new(),
                outcome: Outcome::Applied,
            };
            d.on_report(&mut t, 1, report, now);
            for a in carried.remove(&work_id).unwrap_or_default() {
                if let Some(at) = arrived.remove(&a) {
                    out.latencies_ms.push((now_us - at) as f64 / 1000.0);
                }
            }
        }
        while let Some(unit) = {
            id += 1;
            d.next_unit(&mut t, 1, id, now)
        } {
            let took_us = match &unit.work {
                UnitWork::Observe => {
                    let report = Report {
                        work_id: unit.work_id,
                        applied: vec![],
                        progress: vec![],
                        refused: Vec::new(),
                        outcome: Outcome::Observed {
                            snapshot: ActualSnapshot::default(),
                            last: true,
                        },
                    };
                    d.on_report(&mut t, 1, report, now);
                    continue;
                }
                // A service's creation is a few calls one after the other; side by side.
                UnitWork::Services(_) => (3.0 * CALL_MS * 1000.0) as u64,
                UnitWork::Locations(diffs) => {
                    let addresses: Vec<IpAddr> = diffs
                        .iter()
                        .flat_map(|d| d.addresses.iter().map(|a| a.address))
                        .collect();
                    out.calls += 1;
                    out.addresses += addresses.len() as u64;
                    let us = if free_start && warm_up == u64::MAX {
                        0.0
                    } else {
                        CALL_MS * 1000.0 + PER_ADDRESS_US * addresses.len() as f64
                    };
                    carried.insert(unit.work_id, addresses);
                    us as u64
                }
            };
            noise ^= noise << 13;
            noise ^= noise >> 7;
            noise ^= noise << 17;
            let jitter_us = (noise % 1_000_000) as f64 / 1_000_000.0 * jitter_ms * 1000.0;
            due.insert(
                (
                    now_us + took_us + (overhead_ms * 1000.0 + jitter_us) as u64,
                    unit.work_id,
                ),
                (),
            );
        }
        now_us += 1_000;
    }
    out
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken.
    let rates = env_list("CLB_SIM_RATES", "2000,20000");
    let headways = env_list("CLB_SIM_HEADWAYS", "0,1.05,1.2");
    let overheads = env_list("CLB_SIM_OVERHEAD_MS", "5");
    let jitters = env_list("CLB_SIM_JITTER_MS", "0");
    let free_start = std::env::var("CLB_SIM_FREE_START").is_ok_and(|v| v == "1");
    println!(
        "dispatch_sim: {PODS} pods, {LOCATIONS} locations, {SERVICES} services, {SLOTS} slots, \
         calls of {CALL_MS} ms + {} ms per address, {SECONDS} s of churn once the cluster is programmed",
        PER_ADDRESS_US / 1000.0
    );
    println!();
    println!(
        "| churn/s | overhead per unit | jitter | headway | p50 | p90 | p99 | max | calls | addresses per call |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for &rate in &rates {
        for &overhead_ms in &overheads {
            for &jitter_ms in &jitters {
                for &headway in &headways {
                    let mut o = run(Shape {
                        rate,
                        headway,
                        overhead_ms,
                        jitter_ms,
                        free_start,
                    });
                    o.latencies_ms.sort_by(f64::total_cmp);
                    let l = &o.latencies_ms;
                    println!(
                        "| {rate} | {overhead_ms} ms | {jitter_ms} ms | {headway} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {} | {:.0} |",
                        percentile(l, 50.0),
                        percentile(l, 90.0),
                        percentile(l, 99.0),
                        l.last().copied().unwrap_or(f64::NAN),
                        o.calls,
                        o.addresses as f64 / o.calls.max(1) as f64
                    );
                }
            }
        }
    }
}
