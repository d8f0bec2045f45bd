//! Emulator configuration: cost model, faults, throttling, long-running operations, paging.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// What the emulator answers when a gateway already has `max_concurrent_mutations` mutating calls in
/// flight.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThrottleResponse {
    /// `429 Too Many Requests` with `Retry-After`.
    #[default]
    TooManyRequests,
    /// `409 Conflict` with code `AnotherOperationInProgress` (and `Retry-After`).
    AnotherOperationInProgress,
}

/// A control for tests, not a rule of Azure's: `updateAddressLocations` refuses any call that
/// carries `address` (in any location, with any services, a deletion included) with `400 code`, as
/// Azure refuses a call for one address for reasons a client cannot foresee (a rule, a quota, a
/// policy). The whole call changes nothing. The message names the address (and its location) when
/// `name_address`, as Azure does when it can; otherwise it names no IP at all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddressRefusal {
    /// The address refused (compared as an IP: `fd00::01` is `fd00::1`).
    pub address: IpAddr,
    /// The ARM error code of the refusal; default [`AddressRefusal::DEFAULT_CODE`].
    #[serde(default = "AddressRefusal::default_code")]
    pub code: String,
    /// Whether the message names the address; default true.
    #[serde(default = "AddressRefusal::default_name_address")]
    pub name_address: bool,
}

impl AddressRefusal {
    /// The code of a refusal that names none.
    pub const DEFAULT_CODE: &'static str = "AddressRefusedByPolicy";

    /// A refusal of `address` with the default code, naming the address.
    pub fn new(address: IpAddr) -> Self {
        Self {
            address,
            code: Self::DEFAULT_CODE.to_string(),
            name_address: true,
        }
    }

    fn default_code() -> String {
        Self::DEFAULT_CODE.to_string()
    }

    fn default_name_address() -> bool {
        true
    }
}

/// The emulator's run-time configuration. `Default` is: no latency, no faults, no concurrency limit,
/// synchronous answers, and — as in Azure — a gateway exists only once it is PUT.
///
/// As JSON (the `--config` file and `PUT /_emulator/config`), every field is optional and snake_case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmulatorConfig {
    /// Latency of every ARM call, in milliseconds, counted from the request's arrival (reading and
    /// parsing it are part of it, as they are of Azure's, and so is applying it: the apply starts
    /// about its learnt duration before the latency ends, and the answer waits for the end).
    pub latency_ms: u64,
    /// Latency added per address carried by an `updateAddressLocations` call, in microseconds.
    pub latency_per_address_us: u64,
    /// Maximum concurrent mutating calls per service gateway (`None` = unlimited). In LRO mode an
    /// accepted operation counts until it completes.
    pub max_concurrent_mutations: Option<usize>,
    /// Answer to a call beyond `max_concurrent_mutations`.
    pub throttle_response: ThrottleResponse,
    /// `Retry-After` (seconds) sent with throttling answers (limit or injected 429) and 503s.
    pub retry_after_secs: u64,
    /// Probability (0..=1) that a call fails with an injected 500/503.
    pub fault_rate_5xx: f64,
    /// Probability (0..=1) that a call fails with an injected 429.
    pub fault_rate_429: f64,
    /// Probability (0..=1) that a call fails with an injected `409 AnotherOperationInProgress` (with
    /// `Retry-After`), as NRP answers a call that meets another operation on the same resource.
    pub fault_rate_409: f64,
    /// Probability (0..=1) that a call is held for `timeout_hold_ms` and then answered 504.
    pub fault_rate_timeout: f64,
    /// How long an injected timeout holds the request before answering 504; make it longer than the
    /// client's timeout to model a call that never answers.
    pub timeout_hold_ms: u64,
    /// Whether a call hit by an injected timeout is still applied (the ambiguous outcome of real
    /// timeouts: the client cannot know whether NRP committed the change).
    pub timeout_applies_change: bool,
    /// Whether faults are injected into reads (GET) too, not only into mutating calls.
    pub faults_on_reads: bool,
    /// Seed of the fault-injection RNG (`None` = from OS entropy). With a seed, the sequence of fault
    /// decisions for a given sequence of calls is reproducible.
    pub seed: Option<u64>,
    /// Answer mutating calls as ARM long-running operations (200/201/202 + `Azure-AsyncOperation`
    /// and `Location`) instead of synchronously, where the API makes them long-running: PUTs, DELETEs
    /// of what exists, and the gateway actions at api-version `2025-05-01` (from `2025-09-01` on
    /// they are synchronous, as is PATCH).
    pub long_running_operations: bool,
    /// `Retry-After` (seconds) sent with LRO answers and in-progress polls.
    pub lro_retry_after_secs: u64,
    /// Items per page of `GET …/addressLocations` and `GET …/services`.
    pub page_size: usize,
    /// Opt-in, not Azure's behaviour: accept calls on a gateway that was never PUT (it is created on
    /// first use, in location `local`). Off (the default), such calls get `404 ResourceNotFound`.
    pub auto_create_gateways: bool,
    /// Opt-in, not Azure's behaviour as the emulator models it: a DELETE of a NAT gateway that an
    /// outbound registration uses succeeds (`InUseNatGatewayCannotBeDeleted` otherwise), and the
    /// registration keeps naming the NAT gateway that is gone. It plays a NAT gateway deleted out of
    /// band while a Service Gateway uses it (Azure's rule for a registration's NAT gateway is not
    /// published).
    pub delete_nat_gateways_in_use: bool,
    /// Refuse an `updateAddressLocations` that would give a service with load balancer backend pools
    /// addresses of both IP versions (`400 BackendPoolAddressesMustHaveSameIpVersion`), as Azure
    /// refuses a backend pool that mixes them, or an address of the other version than the public
    /// frontend its pool serves (`400 BackendAddressIpVersionDoesNotMatchFrontend`: NAT44 and NAT66
    /// only) (docs/nrp-emulator.md, IPv6). On by default: the sync workers register one gateway
    /// service per IP family. Off accepts both (for writers that state no family).
    pub single_ip_version_pools: bool,
    /// Maximum request body size in bytes (larger bodies get 413).
    pub max_body_bytes: usize,
    /// Maximum entries kept in the removal log (older entries are dropped and counted).
    pub removal_log_capacity: usize,
    /// Azure's write budget per subscription, token bucket: its size in writes (`None`, the
    /// default: no bucket). ARM's is 200 writes refilled at 10 per second. Every mutating call
    /// (PUT, PATCH, DELETE, POST; not GETs, not operation polls) takes one write; one that finds
    /// the bucket empty gets `429 SubscriptionRequestsThrottled` with `Retry-After`.
    pub write_bucket_size: Option<u32>,
    /// Writes added to the bucket per second (fractions allowed).
    pub write_refill_per_sec: f64,
    /// Azure's write budget per subscription, window: the most writes in any `write_window_secs`
    /// (a sliding window; `None`, the default: no cap). NRP's is 1,000 writes per 5 minutes.
    pub writes_per_window: Option<u32>,
    /// The window of `writes_per_window`, in seconds.
    pub write_window_secs: u64,
    /// A control for tests, not Azure's behaviour: `updateAddressLocations` calls carrying one of
    /// these addresses are refused with `400` and the refusal's code ([`AddressRefusal`]). JSON
    /// configuration only (`--config`, `PUT /_emulator/config`). Empty by default.
    pub refused_addresses: Vec<AddressRefusal>,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        Self {
            latency_ms: 0,
            latency_per_address_us: 0,
            max_concurrent_mutations: None,
            throttle_response: ThrottleResponse::TooManyRequests,
            retry_after_secs: 1,
            fault_rate_5xx: 0.0,
            fault_rate_429: 0.0,
            fault_rate_409: 0.0,
            fault_rate_timeout: 0.0,
            timeout_hold_ms: 30_000,
            timeout_applies_change: false,
            faults_on_reads: false,
            seed: None,
            long_running_operations: false,
            lro_retry_after_secs: 0,
            page_size: 500,
            auto_create_gateways: false,
            delete_nat_gateways_in_use: false,
            single_ip_version_pools: true,
            max_body_bytes: 64 << 20,
            removal_log_capacity: 1_000_000,
            write_bucket_size: None,
            write_refill_per_sec: 10.0,
            writes_per_window: None,
            write_window_secs: 300,
            refused_addresses: Vec::new(),
        }
    }
}

/// An invalid [`EmulatorConfig`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A fault rate outside `0..=1` (or NaN).
    #[error("{field} must be between 0 and 1, got {value}")]
    RateOutOfRange {
        /// The field.
        field: &'static str,
        /// Its value, formatted.
        value: String,
    },
    /// The fault rates add up to more than 1.
    #[error("fault rates add up to {0}, more than 1")]
    RatesExceedOne(String),
    /// A field that must be positive is zero.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// A string that must not be empty is.
    #[error("{0} must not be empty")]
    Empty(&'static str),
    /// A rate that must be a positive number is not.
    #[error("{field} must be a positive number, got {value}")]
    NotPositive {
        /// The field.
        field: &'static str,
        /// Its value, formatted.
        value: String,
    },
}

impl EmulatorConfig {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let rates = [
            ("fault_rate_5xx", self.fault_rate_5xx),
            ("fault_rate_429", self.fault_rate_429),
            ("fault_rate_409", self.fault_rate_409),
            ("fault_rate_timeout", self.fault_rate_timeout),
        ];
        for (field, value) in rates {
            if !(0.0..=1.0).contains(&value) {
                return Err(ConfigError::RateOutOfRange {
                    field,
                    value: value.to_string(),
                });
            }
        }
        let sum: f64 = rates.iter().map(|(_, v)| v).sum();
        if sum > 1.0 + 1e-9 {
            return Err(ConfigError::RatesExceedOne(sum.to_string()));
        }
        if self.page_size == 0 {
            return Err(ConfigError::Zero("page_size"));
        }
        if self.max_concurrent_mutations == Some(0) {
            return Err(ConfigError::Zero("max_concurrent_mutations"));
        }
        if self.max_body_bytes == 0 {
            return Err(ConfigError::Zero("max_body_bytes"));
        }
        if self.write_bucket_size == Some(0) {
            return Err(ConfigError::Zero("write_bucket_size"));
        }
        if self.writes_per_window == Some(0) {
            return Err(ConfigError::Zero("writes_per_window"));
        }
        if self.write_window_secs == 0 {
            return Err(ConfigError::Zero("write_window_secs"));
        }
        if self
            .refused_addresses
            .iter()
            .any(|r| r.code.trim().is_empty())
        {
            return Err(ConfigError::Empty("refused_addresses[].code"));
        }
        if !(self.write_refill_per_sec.is_finite() && self.write_refill_per_sec > 0.0) {
            return Err(ConfigError::NotPositive {
                field: "write_refill_per_sec",
                value: self.write_refill_per_sec.to_string(),
            });
        }
        Ok(())
    }

    /// Whether any fault injection is configured.
    pub fn has_faults(&self) -> bool {
        self.fault_rate_5xx > 0.0
            || self.fault_rate_429 > 0.0
            || self.fault_rate_409 > 0.0
            || self.fault_rate_timeout > 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_partial_json_fills_defaults() {
        EmulatorConfig::default().validate().unwrap();
        let c: EmulatorConfig = serde_json::from_str(r#"{"latency_ms": 5, "seed": 7}"#).unwrap();
        assert_eq!(c.latency_ms, 5);
        assert_eq!(c.seed, Some(7));
        assert!(!c.auto_create_gateways, "Azure-like by default");
        assert!(serde_json::from_str::<EmulatorConfig>(r#"{"latncy_ms": 5}"#).is_err());
    }

    #[test]
    fn write_budget_is_off_by_default_and_checked() {
        let c = EmulatorConfig::default();
        assert_eq!((c.write_bucket_size, c.writes_per_window), (None, None));
        let c: EmulatorConfig = serde_json::from_str(
            r#"{"write_bucket_size": 200, "write_refill_per_sec": 10, "writes_per_window": 1000}"#,
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.write_window_secs, 300);
        for bad in [
            EmulatorConfig {
                write_bucket_size: Some(0),
                ..c.clone()
            },
            EmulatorConfig {
                writes_per_window: Some(0),
                ..c.clone()
            },
            EmulatorConfig {
                write_window_secs: 0,
                ..c.clone()
            },
            EmulatorConfig {
                write_refill_per_sec: 0.0,
                ..c.clone()
            },
            EmulatorConfig {
                write_refill_per_sec: f64::NAN,
                ..c.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn refused_addresses_fill_their_defaults_and_need_a_code() {
        let c: EmulatorConfig = serde_json::from_str(
            r#"{"refused_addresses": [{"address": "10.1.0.7"},
                {"address": "fd01::0001", "code": "Nope", "name_address": false}]}"#,
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(
            c.refused_addresses,
            vec![
                AddressRefusal::new("10.1.0.7".parse().unwrap()),
                AddressRefusal {
                    address: "fd01::1".parse().unwrap(),
                    code: "Nope".into(),
                    name_address: false,
                },
            ]
        );
        assert!(EmulatorConfig::default().refused_addresses.is_empty());
        let mut bad = c.clone();
        bad.refused_addresses[0].code = " ".into();
        assert_eq!(
            bad.validate(),
            Err(ConfigError::Empty("refused_addresses[].code"))
        );
        assert!(
            serde_json::from_str::<EmulatorConfig>(r#"{"refused_addresses": [{"address": "x"}]}"#)
                .is_err()
        );
    }

    #[test]
    fn rejects_bad_rates() {
        let mut c = EmulatorConfig {
            fault_rate_5xx: 1.5,
            ..Default::default()
        };
        assert!(c.validate().is_err());
        c.fault_rate_5xx = f64::NAN;
        assert!(c.validate().is_err());
        c.fault_rate_5xx = 0.6;
        c.fault_rate_429 = 0.6;
        assert!(matches!(c.validate(), Err(ConfigError::RatesExceedOne(_))));
        c.fault_rate_429 = 0.2;
        c.fault_rate_409 = 0.3;
        assert!(matches!(c.validate(), Err(ConfigError::RatesExceedOne(_))));
        c.fault_rate_409 = -0.1;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::RateOutOfRange { .. })
        ));
    }
}
