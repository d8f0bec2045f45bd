//! What the benchmarks in `tests/benches/` share: the rollout cluster and the costly emulator.

use clb_embedded::ClusterSpec;
use clb_nrp_emulator::EmulatorConfig;

/// Emulator cost of one call.
pub const LATENCY_MS: u64 = 100;
/// Emulator cost of one address in a call.
pub const LATENCY_PER_ADDRESS_US: u64 = 50;
/// Mutating calls NRP allows at once per gateway.
pub const CONCURRENCY: usize = 4;
/// Pods of one app.
pub const PODS_PER_APP: usize = 50;

/// `name` from the environment, or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The rollout cluster: 10,000 pods (200 apps × 50) over 500 locations, 10 egresses
/// (`CLB_BENCH_PODS` / `CLB_BENCH_LOCATIONS` for another size).
pub fn rollout_spec() -> ClusterSpec {
    let pods = env_usize("CLB_BENCH_PODS", 10_000);
    ClusterSpec {
        locations: env_usize("CLB_BENCH_LOCATIONS", 500),
        apps: pods.div_ceil(PODS_PER_APP),
        pods_per_app: PODS_PER_APP,
        egresses: 10,
        not_ready_every: 0,
        seed: 42,
    }
}

/// The emulator as the benchmarks' NRP: [`LATENCY_MS`] per call + [`LATENCY_PER_ADDRESS_US`] per
/// address, at most [`CONCURRENCY`] concurrent mutating calls per gateway (429 beyond).
pub fn costly() -> EmulatorConfig {
    EmulatorConfig {
        latency_ms: LATENCY_MS,
        latency_per_address_us: LATENCY_PER_ADDRESS_US,
        max_concurrent_mutations: Some(CONCURRENCY),
        ..EmulatorConfig::default()
    }
}
