//! The metrics read from the state at each scrape (here, not in `metrics.rs`: the metrics know
//! nothing of the state).

use std::time::Instant;

use super::StateServer;
use crate::metrics::{self, Metrics};

impl Metrics {
    /// Sets every gateway's gauges from the server's current state.
    pub fn refresh_from(&self, state: &StateServer) {
        for s in gateway_snapshots(state, Instant::now()) {
            self.set_gateway(&s);
        }
    }
}

/// One [`metrics::GatewaySnapshot`] per gateway of `state` (default first), each taken under its gateway lock.
pub fn gateway_snapshots(state: &StateServer, now: Instant) -> Vec<metrics::GatewaySnapshot> {
    let workers = state.workers();
    state
        .gateways()
        .iter()
        .map(|handle| {
            let name = handle.name().to_owned();
            let (load, gate) = {
                let gw = handle.lock();
                (gw.load(now), gw.gate_view(now))
            };
            let c = load.counts;
            let serving = workers
                .iter()
                .filter(|w| w.gateways.is_empty() || w.gateways.contains(&name))
                .count();
            let held_back = gate
                .holds
                .into_iter()
                .map(|h| {
                    let held = metrics::HeldBack {
                        removals: h.addresses + h.services,
                        locations: h.locations,
                    };
                    (h.reason.label(), held)
                })
                .collect();
            metrics::GatewaySnapshot {
                revision: load.revision,
                desired_addresses: c.desired_addresses,
                actual_addresses: c.actual_addresses,
                desired_locations: c.desired_locations,
                actual_locations: c.actual_locations,
                desired_services: c.desired_services + c.desired_egresses,
                actual_services: c.actual_load_balancers + c.actual_nat_gateways,
                dirty_locations: c.dirty_locations,
                units_in_flight: load.units_in_flight as u64,
                parked_units: load.parked_units as u64,
                nat_gateways_missing: load.missing_nat_gateways as u64,
                staleness: load.oldest_pending_age,
                workers: serving as u64,
                write_budget: load.pacing.remaining_writes,
                batching_window: load.pacing.batching_window.unwrap_or_default(),
                unit_headway: load.pacing.unit_headway.unwrap_or_default(),
                held_back,
                refused: load.refused_by_code.into_iter().collect(),
                gateway: name,
            }
        })
        .collect()
}
