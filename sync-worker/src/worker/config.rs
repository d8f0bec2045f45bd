//! The worker's configuration: where the state server is, who the worker is, and the limits it applies
//! to NRP calls.

use std::time::Duration;

/// Everything [`run`](super::run) needs besides the NRP client and the shutdown signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// URL of the state server's gRPC endpoint, e.g. `http://127.0.0.1:50051`.
    pub server: String,
    /// A stable, unique name of the worker (its pod name), sent in `Hello`.
    pub worker_id: String,
    /// The largest number of units in flight at once (at least 1), sent in `Hello`.
    pub capacity: u32,
    /// The gateways this worker serves; empty means every gateway of the server.
    pub gateways: Vec<String>,
    /// Limits on NRP calls and reports.
    pub limits: Limits,
    /// Reconnection backoff after a failed connection or a broken stream.
    pub backoff: Backoff,
    /// Bound on establishing the TCP/HTTP2 connection to the state server.
    pub connect_timeout: Duration,
    /// Bound on waiting for `Welcome` after `Hello`.
    pub welcome_timeout: Duration,
    /// HTTP/2 keep-alive ping interval towards the state server (a dead peer is noticed after about
    /// twice this).
    pub keep_alive_interval: Duration,
    /// Lease used when a unit carries neither a lease deadline nor a lease duration, and the server's
    /// `Welcome` gave none either.
    pub default_lease: Duration,
    /// On shutdown, how long in-flight units may take to finish their current NRP call and report;
    /// they are abandoned after it.
    pub shutdown_grace: Duration,
    /// Azure region used when the worker has to create a missing service gateway (e.g. `eastus`).
    /// Resources of the sagas are created in the gateway's own region.
    pub gateway_region: String,
    /// ARM id of the virtual network to create a missing service gateway in (optional; Azure needs
    /// it, the emulator does not).
    pub virtual_network_id: Option<String>,
}

impl WorkerConfig {
    /// Defaults for a worker named `worker_id` talking to the state server at `server`.
    pub fn new(server: impl Into<String>, worker_id: impl Into<String>) -> Self {
        Self {
            server: server.into(),
            worker_id: worker_id.into(),
            capacity: 4,
            gateways: Vec::new(),
            limits: Limits::default(),
            backoff: Backoff::default(),
            connect_timeout: Duration::from_secs(5),
            welcome_timeout: Duration::from_secs(10),
            keep_alive_interval: Duration::from_secs(10),
            default_lease: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
            gateway_region: "eastus".into(),
            virtual_network_id: None,
        }
    }
}

/// Limits on what one NRP call or one report carries, and on concurrency per gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most locations in one `updateAddressLocations` call.
    pub max_locations_per_call: usize,
    /// Most addresses in one `updateAddressLocations` call. A partial update of one location that is
    /// larger is split into several calls; a full update of one location is never split (splitting
    /// it would remove live addresses in between), so it goes alone in a call of its own.
    pub max_addresses_per_call: usize,
    /// Most addresses in one `Observed` report part (a location is never split across parts).
    pub max_addresses_per_report: usize,
    /// Upper bound of concurrent mutating NRP calls per gateway; the adaptive limit moves between 1
    /// and this.
    pub max_concurrent_mutations_per_gateway: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_locations_per_call: 100,
            max_addresses_per_call: 5_000,
            max_addresses_per_report: 20_000,
            max_concurrent_mutations_per_gateway: 4,
        }
    }
}

impl Limits {
    /// The same limits with every bound at least 1.
    pub fn sanitized(self) -> Self {
        Self {
            max_locations_per_call: self.max_locations_per_call.max(1),
            max_addresses_per_call: self.max_addresses_per_call.max(1),
            max_addresses_per_report: self.max_addresses_per_report.max(1),
            max_concurrent_mutations_per_gateway: self.max_concurrent_mutations_per_gateway.max(1),
        }
    }
}

/// Capped exponential backoff with jitter between reconnection attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first retry.
    pub initial: Duration,
    /// Cap of the delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(10),
        }
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (0-based): `min(max, initial * 2^attempt)`, drawn
    /// uniformly from its upper half so that many workers do not reconnect in lockstep.
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = self
            .initial
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.max);
        let half = base / 2;
        let jitter_ns = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let extra = if jitter_ns == 0 {
            0
        } else {
            rand::random_range(0..=jitter_ns)
        };
        half + Duration::from_nanos(extra)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped_and_jittered() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        for attempt in 0..40 {
            let d = b.delay(attempt);
            let base = (Duration::from_millis(100) * 2u32.pow(attempt.min(10))).min(b.max);
            assert!(d >= base / 2 && d <= base, "{attempt}: {d:?}");
        }
    }

    #[test]
    fn limits_are_sanitized() {
        let l = Limits {
            max_locations_per_call: 0,
            max_addresses_per_call: 0,
            max_addresses_per_report: 0,
            max_concurrent_mutations_per_gateway: 0,
        }
        .sanitized();
        assert_eq!(l.max_locations_per_call, 1);
        assert_eq!(l.max_concurrent_mutations_per_gateway, 1);
    }
}
