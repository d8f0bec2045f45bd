//! The dispatcher's settings.

use std::time::Duration;

/// Dispatcher settings.
#[derive(Debug, Clone)]
pub struct DispatchConfig {
    /// How long a worker holds a unit.
    pub lease: Duration,
    /// Most locations in one unit. The REST specification bounds neither the locations nor the
    /// addresses of an `updateAddressLocations` call; the address bound keeps a request small
    /// (≈ 0.5 MB at 5,000 addresses) and is the one that binds.
    pub max_locations_per_unit: usize,
    /// Most addresses in one unit (a single larger location still goes, alone).
    pub max_addresses_per_unit: usize,
    /// Most service changes in one unit, whatever the room for concurrent calls: the worker
    /// registers (or unregisters) a unit's services in one `updateServices` call, so a cold start
    /// costs NRP 2 writes per Service and 1 per unit, not 3 per Service (issue 36). It also bounds
    /// that call's size (the REST specification bounds none).
    pub max_services_per_unit: usize,
    /// First retry delay; doubles per attempt, with jitter.
    pub retry_base: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
    /// First delay before work NRP refused as invalid (a terminal outcome: a 4xx that is not
    /// throttling, a conflict or a repairable state) is sent again; doubles per refusal of the
    /// same work, with jitter, and starts over when its desired state or NRP's state of it
    /// changes. The refusal budget: docs/errors.md.
    pub refusal_base: Duration,
    /// Longest delay between two attempts of refused work (at least 10 minutes by default, so a
    /// refusal costs a few writes an hour, not a share of the subscription's write budget).
    pub refusal_max: Duration,
    /// How often NRP is read back to repair drift.
    pub anti_entropy_interval: Duration,
    /// Most concurrent mutating NRP calls the units in flight for this gateway may make, whatever
    /// the number of workers: a location unit's calls go one after the other (it counts 1), a service
    /// unit's changes go side by side as far as the room allowed when it was cut (it counts that
    /// many, at most one per change: `ServiceWork.side_by_side`, which the worker keeps to). 0 means
    /// no bound. Observes are not counted.
    pub max_mutating_units_in_flight: usize,
    /// Pacing against the subscription's write budget (ARM's
    /// `x-ms-ratelimit-remaining-subscription-writes`, reported by the workers): while the budget
    /// is estimated below [`DispatchConfig::write_reserve`], mutating units start at most at this
    /// many writes per second, and each carries what accumulated meanwhile (the batching window
    /// widens instead of calls being refused). 0: no pacing. The default, 3/s, stays under NRP's
    /// 1,000 writes per 5 minutes (3.33/s).
    pub write_pace: f64,
    /// The writes kept in reserve: pacing starts when the budget is estimated below it.
    pub write_reserve: u32,
    /// Once a budget was reported, the writes that may go at once before the long-run pace
    /// (`write_pace`) binds: a bucket of this size refilled at the pace. ARM's 5-minute cap
    /// (1,000 writes) is then not reached: 50 + 300 s × 3/s = 950 at the defaults, a margin for
    /// the estimate and for other writers of the subscription (with 100 it was exactly 1,000,
    /// and a 5-minute run met one 429).
    pub write_burst: u32,
    /// From idle, location units are held back while changes to locations keep arriving less
    /// than this apart (a burst: a rollout, a resync), so the burst goes out in one wave of wide
    /// units rather than thin ones that each pay a call's fixed cost. An isolated change after a
    /// quiet time waits this long (default 10 ms: at 3 ms a pause of a few ms in a rollout's
    /// stream of writes on a loaded machine cut it into two waves, 6–8 calls instead of 4).
    pub batch_quiet: Duration,
    /// The longest a burst holds location units back, from its first change (default 100 ms).
    /// Zero: no holding, units are cut as soon as a slot is free — then the first writes of a
    /// rollout take every slot for a call with a few addresses each, and the rest waits for them
    /// (8 calls and 0.56–0.63 s on the rollout bench, against 4 calls and 0.45–0.50 s at 100 ms).
    pub batch_linger: Duration,
    /// Staggering (`stagger.rs`): while location units are in flight and the last one carried all
    /// that waited, the next starts no sooner than a location unit's recent duration ÷
    /// [`DispatchConfig::max_mutating_units_in_flight`] × this after the last start, so the slots
    /// take turns instead of calling in waves. Above 1 so a slot is free again before its turn.
    /// 0: units go as soon as a slot is free.
    pub unit_headway: f64,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            max_locations_per_unit: 1_000,
            max_addresses_per_unit: 5_000,
            max_services_per_unit: 16,
            retry_base: Duration::from_millis(200),
            retry_max: Duration::from_secs(30),
            refusal_base: Duration::from_secs(30),
            refusal_max: Duration::from_secs(15 * 60),
            anti_entropy_interval: Duration::from_secs(300),
            max_mutating_units_in_flight: 4,
            write_pace: 3.0,
            write_reserve: 20,
            write_burst: 50,
            batch_quiet: Duration::from_millis(10),
            batch_linger: Duration::from_millis(100),
            unit_headway: 1.05,
        }
    }
}

#[cfg(test)]
impl DispatchConfig {
    /// The defaults with batching and staggering off: units are cut as soon as a slot is free
    /// (for tests of other behaviour, which cut at one instant).
    pub(crate) fn unbatched() -> Self {
        Self {
            batch_linger: Duration::ZERO,
            unit_headway: 0.0,
            ..Self::default()
        }
    }
}
