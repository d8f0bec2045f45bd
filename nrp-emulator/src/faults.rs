//! Cost and faults: latency, reproducible fault injection, and the per-gateway limit of concurrent
//! mutating calls.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::config::{AddressRefusal, EmulatorConfig};
use crate::error::EmulatorError;
use crate::gateway::NormLocations;
use crate::lock;
use clb_nrp::wire::ResourceId;

/// A fault decided for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    Timeout,
    ServerError(u16),
    TooManyRequests,
    /// `409 AnotherOperationInProgress`.
    Conflict,
}

/// Seeded fault decisions: one uniform draw per call that is subject to faults.
#[derive(Debug)]
pub(crate) struct FaultInjector {
    rng: StdRng,
}

impl FaultInjector {
    pub(crate) fn new(seed: Option<u64>) -> Self {
        let rng = match seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        Self { rng }
    }

    /// Decides the fault of one call. Draws from the RNG only when faults are configured, so that the
    /// sequence depends only on the seed and the calls made while faults are on.
    pub(crate) fn draw(&mut self, cfg: &EmulatorConfig) -> Option<Fault> {
        if !cfg.has_faults() {
            return None;
        }
        let u: f64 = self.rng.random();
        let t = cfg.fault_rate_timeout;
        let s = t + cfg.fault_rate_5xx;
        let r = s + cfg.fault_rate_429;
        let c = r + cfg.fault_rate_409;
        if u < t {
            Some(Fault::Timeout)
        } else if u < s {
            // Split the 5xx band evenly between 500 and 503, still from the one draw.
            Some(Fault::ServerError(if u < t + cfg.fault_rate_5xx / 2.0 {
                500
            } else {
                503
            }))
        } else if u < r {
            Some(Fault::TooManyRequests)
        } else if u < c {
            Some(Fault::Conflict)
        } else {
            None
        }
    }
}

/// The latency of a call carrying `addresses` addresses.
pub(crate) fn latency(cfg: &EmulatorConfig, addresses: usize) -> Duration {
    Duration::from_millis(cfg.latency_ms)
        + Duration::from_micros(cfg.latency_per_address_us.saturating_mul(addresses as u64))
}

/// The emulator's own time to apply an `updateAddressLocations` call, per address carried,
/// smoothed. A call's modelled latency is its whole time in the emulator, as reading and parsing
/// its body already are: the apply starts about this much before the latency ends, so that what
/// the emulator itself spends (thousands of addresses on the state lock, milliseconds on a loaded
/// machine) is not added to the model. The change still becomes visible at the end of the call.
#[derive(Debug, Default)]
pub(crate) struct ApplyCost {
    ns_per_address: AtomicU64,
}

impl ApplyCost {
    /// The expected time to apply a call carrying `addresses` addresses.
    pub(crate) fn estimate(&self, addresses: usize) -> Duration {
        Duration::from_nanos(
            self.ns_per_address
                .load(Ordering::Relaxed)
                .saturating_mul(addresses as u64),
        )
    }

    /// A call carrying `addresses` addresses took `took` to apply.
    pub(crate) fn record(&self, addresses: usize, took: Duration) {
        if addresses == 0 {
            return;
        }
        let sample = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX) / addresses as u64;
        let old = self.ns_per_address.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            (old.saturating_mul(7) + sample) / 8
        };
        self.ns_per_address.store(new, Ordering::Relaxed);
    }
}

#[derive(Debug, Default)]
struct LimiterState {
    in_flight: HashMap<String, usize>,
    max_observed: usize,
}

/// Counts mutating calls in flight per gateway and enforces the configured limit.
#[derive(Debug, Default)]
pub(crate) struct Limiter {
    state: Mutex<LimiterState>,
}

/// A slot of a gateway's mutation limit; released on drop.
#[derive(Debug)]
pub(crate) struct Permit {
    limiter: Arc<Limiter>,
    key: String,
}

impl Limiter {
    /// Takes a slot for `key` unless `limit` slots are taken already (then returns how many are).
    pub(crate) fn try_acquire(
        self: &Arc<Self>,
        key: &str,
        limit: Option<usize>,
    ) -> Result<Permit, usize> {
        let mut st = lock(&self.state);
        let n = st.in_flight.get(key).copied().unwrap_or(0);
        if limit.is_some_and(|l| n >= l) {
            return Err(n);
        }
        st.in_flight.insert(key.to_string(), n + 1);
        st.max_observed = st.max_observed.max(n + 1);
        Ok(Permit {
            limiter: Arc::clone(self),
            key: key.to_string(),
        })
    }

    /// Highest number of concurrent mutating calls seen on one gateway.
    pub(crate) fn max_observed(&self) -> usize {
        lock(&self.state).max_observed
    }

    /// Mutating calls in flight now, over all gateways.
    pub(crate) fn in_flight(&self) -> usize {
        lock(&self.state).in_flight.values().sum()
    }

    /// Resets the maximum to the current level.
    pub(crate) fn reset_max(&self) {
        let mut st = lock(&self.state);
        st.max_observed = st.in_flight.values().copied().max().unwrap_or(0);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut st = lock(&self.limiter.state);
        if let Some(n) = st.in_flight.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                st.in_flight.remove(&self.key);
            }
        }
    }
}

/// Refuses a request that carries an address of `refusals` (the first one met, in the request's
/// order), with the refusal's code; a message that names the address and its location, or no IP
/// at all ([`crate::config::AddressRefusal`]).
pub(crate) fn check_refused_addresses(
    refusals: &[AddressRefusal],
    id: &ResourceId,
    req: &NormLocations,
) -> Result<(), EmulatorError> {
    if refusals.is_empty() {
        return Ok(());
    }
    for l in &req.locations {
        for (addr, _) in &l.addresses {
            if let Some(r) = refusals.iter().find(|r| r.address == *addr) {
                let message = if r.name_address {
                    format!(
                        "Address '{addr}' at location '{}' of service gateway '{}' is refused by a \
                         policy of the subscription.",
                        l.location, id.name
                    )
                } else {
                    format!(
                        "An address of the request is refused by a policy of the subscription \
                         (service gateway '{}').",
                        id.name
                    )
                };
                return Err(EmulatorError::Refused {
                    code: r.code.clone(),
                    message,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_faults_are_reproducible() {
        let cfg = EmulatorConfig {
            fault_rate_5xx: 0.2,
            fault_rate_429: 0.2,
            fault_rate_409: 0.1,
            fault_rate_timeout: 0.1,
            seed: Some(42),
            ..Default::default()
        };
        let seq = |seed| {
            let mut f = FaultInjector::new(Some(seed));
            (0..200).map(|_| f.draw(&cfg)).collect::<Vec<_>>()
        };
        assert_eq!(seq(42), seq(42));
        assert_ne!(seq(42), seq(43));
        let s = seq(42);
        assert!(s.iter().any(|f| f.is_none()));
        assert!(s.contains(&Some(Fault::TooManyRequests)));
        assert!(s.contains(&Some(Fault::Timeout)));
        assert!(s.contains(&Some(Fault::Conflict)));
        assert!(
            FaultInjector::new(None)
                .draw(&EmulatorConfig::default())
                .is_none()
        );
    }

    #[test]
    fn limiter_counts_and_limits() {
        let l = Arc::new(Limiter::default());
        let a = l.try_acquire("g", Some(2)).unwrap();
        let _b = l.try_acquire("g", Some(2)).unwrap();
        assert_eq!(l.try_acquire("g", Some(2)).unwrap_err(), 2);
        let _other = l.try_acquire("h", Some(2)).unwrap();
        drop(a);
        let _c = l.try_acquire("g", Some(2)).unwrap();
        assert_eq!(l.max_observed(), 2);
        assert_eq!(l.in_flight(), 3);
    }

    #[test]
    fn the_apply_cost_is_learnt_per_address_and_smoothed() {
        let c = ApplyCost::default();
        assert_eq!(c.estimate(1_000), Duration::ZERO, "nothing learnt yet");
        c.record(1_000, Duration::from_millis(2));
        assert_eq!(
            c.estimate(2_500),
            Duration::from_millis(5),
            "2 µs an address"
        );
        c.record(0, Duration::from_secs(1));
        assert_eq!(
            c.estimate(1),
            Duration::from_micros(2),
            "a call without addresses"
        );
        // A slower call moves the estimate an eighth of the way: (7 × 2,000 + 10,000) / 8 ns.
        c.record(100, Duration::from_millis(1));
        assert_eq!(c.estimate(1), Duration::from_nanos(3_000));
    }
}
