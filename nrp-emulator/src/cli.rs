//! The `nrp-emulator` binary's flags, in the library so that the configuration reference
//! (docs/configuration.md) is generated from them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use crate::EmulatorConfig;
use clb_telemetry::flags::parse_duration;

/// Serve the NRP emulator.
#[derive(Debug, Parser)]
#[command(
    name = "nrp-emulator",
    version,
    about = "An emulator of Azure NRP's Service Gateway REST API (and the public IPs, load \
             balancers and NAT gateways it uses) over HTTP, with cost, throttling and fault models: \
             the NRP of the demo, benchmarks and end-to-end tests"
)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8600", env = "NRP_EMULATOR_LISTEN")]
    pub listen: SocketAddr,
    /// JSON configuration file (EmulatorConfig, snake_case fields); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Latency per call (e.g. 20ms; whole milliseconds).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub latency: Option<Duration>,
    /// Latency per address carried (e.g. 50us; whole microseconds).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub latency_per_address: Option<Duration>,
    /// Maximum concurrent mutating calls per gateway (beyond: 429 with Retry-After).
    #[arg(long)]
    pub max_concurrent_mutations: Option<usize>,
    /// Probability of an injected 500/503.
    #[arg(long)]
    pub fault_rate_5xx: Option<f64>,
    /// Probability of an injected 429.
    #[arg(long)]
    pub fault_rate_429: Option<f64>,
    /// Probability of an injected 409 AnotherOperationInProgress.
    #[arg(long)]
    pub fault_rate_409: Option<f64>,
    /// Probability of an injected timeout (held, then 504).
    #[arg(long)]
    pub fault_rate_timeout: Option<f64>,
    /// Seed of the fault-injection RNG (reproducible faults).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Answer mutating calls as ARM long-running operations.
    #[arg(long)]
    pub long_running_operations: bool,
    /// Create a gateway on first use instead of answering 404 for one never PUT (not Azure's
    /// behaviour; default: a gateway exists only once it is PUT).
    #[arg(long)]
    pub auto_create_gateways: bool,
    /// Azure's write budget per subscription: size of the token bucket in writes (ARM's: 200).
    /// Off when not given. Every mutating call takes one write; one that finds the bucket empty
    /// gets 429 SubscriptionRequestsThrottled with Retry-After.
    #[arg(long, value_name = "WRITES", value_parser = clap::value_parser!(u32).range(1..))]
    pub write_bucket_size: Option<u32>,
    /// Refill rate of the write bucket: writes per second (10), or per a duration (10/s, 600/m,
    /// 1/100ms). Default: 10/s (ARM's).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub write_refill: Option<f64>,
    /// Azure's write budget per subscription: the most writes in any --write-window (a sliding
    /// window; NRP's: 1000 per 5 minutes). Off when not given.
    #[arg(long, value_name = "WRITES", value_parser = clap::value_parser!(u32).range(1..))]
    pub writes_per_window: Option<u32>,
    /// The window of --writes-per-window (whole seconds). Default: 5m.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub write_window: Option<Duration>,
    /// Refuse addresses of both IP versions for one service with backend pools
    /// (`BackendPoolAddressesMustHaveSameIpVersion`, as Azure refuses a backend pool that mixes
    /// them), and addresses of the other version than the frontend their pool serves
    /// (`BackendAddressIpVersionDoesNotMatchFrontend`). On by default (the workers register one
    /// service per IP family); `--single-ip-version-pools=false` accepts both.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_value_t = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub single_ip_version_pools: bool,
    /// Address of the HTTP endpoint serving /metrics, /healthz and /readyz, e.g. 0.0.0.0:9090.
    /// Off when not given.
    #[arg(long, env = "CLB_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
}

impl Args {
    /// The emulator configuration: the `--config` file (or the defaults), then the flags.
    pub fn config(&self) -> anyhow::Result<EmulatorConfig> {
        let mut c = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                serde_json::from_str(&text)
                    .with_context(|| format!("parsing {}", path.display()))?
            }
            None => EmulatorConfig::default(),
        };
        let whole = |n: u128| u64::try_from(n).unwrap_or(u64::MAX);
        if let Some(d) = self.latency {
            c.latency_ms = whole(d.as_millis());
        }
        if let Some(d) = self.latency_per_address {
            c.latency_per_address_us = whole(d.as_micros());
        }
        if let Some(v) = self.max_concurrent_mutations {
            c.max_concurrent_mutations = Some(v);
        }
        if let Some(v) = self.fault_rate_5xx {
            c.fault_rate_5xx = v;
        }
        if let Some(v) = self.fault_rate_429 {
            c.fault_rate_429 = v;
        }
        if let Some(v) = self.fault_rate_409 {
            c.fault_rate_409 = v;
        }
        if let Some(v) = self.fault_rate_timeout {
            c.fault_rate_timeout = v;
        }
        if self.seed.is_some() {
            c.seed = self.seed;
        }
        if self.long_running_operations {
            c.long_running_operations = true;
        }
        if self.auto_create_gateways {
            c.auto_create_gateways = true;
        }
        if self.write_bucket_size.is_some() {
            c.write_bucket_size = self.write_bucket_size;
        }
        if let Some(v) = self.write_refill {
            c.write_refill_per_sec = v;
        }
        if self.writes_per_window.is_some() {
            c.writes_per_window = self.writes_per_window;
        }
        if let Some(d) = self.write_window {
            c.write_window_secs = d.as_secs();
        }
        c.single_ip_version_pools = self.single_ip_version_pools;
        Ok(c)
    }
}

/// Parses a rate: a number of events per second (`10`, `0.5`), or events per a duration
/// (`10/s`, `600/m`, `1/100ms`, `1000/5m`); the result is per second, positive and finite.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (count, per) = match t.split_once('/') {
        Some((n, d)) => {
            let d = d.trim();
            // A bare unit (`s`, `m`) is one of it.
            let d = if d.starts_with(|c: char| c.is_ascii_digit()) {
                d.to_string()
            } else {
                format!("1{d}")
            };
            (n.trim(), parse_duration(&d)?)
        }
        None => (t, Duration::from_secs(1)),
    };
    let n: f64 = count
        .parse()
        .map_err(|_| format!("{s:?} is not a rate such as 10, 10/s, 600/m or 1/100ms"))?;
    let rate = n / per.as_secs_f64();
    if rate.is_finite() && rate > 0.0 {
        Ok(rate)
    } else {
        Err(format!("{s:?} is not a positive rate"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_need_a_unit() {
        let config = |argv: &[&str]| {
            let c =
                Args::try_parse_from(std::iter::once("nrp-emulator").chain(argv.iter().copied()))
                    .unwrap()
                    .config()
                    .unwrap();
            (c.latency_ms, c.latency_per_address_us)
        };
        assert_eq!(config(&[]), (0, 0));
        assert_eq!(
            config(&["--latency=20ms", "--latency-per-address=50us"]),
            (20, 50)
        );
        assert_eq!(config(&["--latency=1s"]), (1000, 0));
        let err = Args::try_parse_from(["nrp-emulator", "--latency=20"]).unwrap_err();
        assert!(err.to_string().contains("\"20\" has no unit"), "{err}");
    }

    #[test]
    fn write_budget_flags() {
        let config = |argv: &[&str]| {
            Args::try_parse_from(std::iter::once("nrp-emulator").chain(argv.iter().copied()))
                .unwrap()
                .config()
                .unwrap()
        };
        let off = config(&[]);
        assert_eq!((off.write_bucket_size, off.writes_per_window), (None, None));
        let on = config(&[
            "--write-bucket-size=200",
            "--write-refill=600/m",
            "--writes-per-window=1000",
            "--write-window=5m",
        ]);
        assert_eq!(on.write_bucket_size, Some(200));
        assert!((on.write_refill_per_sec - 10.0).abs() < 1e-9);
        assert_eq!(on.writes_per_window, Some(1000));
        assert_eq!(on.write_window_secs, 300);
        on.validate().unwrap();
        assert!(Args::try_parse_from(["nrp-emulator", "--write-bucket-size=0"]).is_err());
    }

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("10"), Ok(10.0));
        assert_eq!(parse_rate("10/s"), Ok(10.0));
        assert_eq!(parse_rate("0.5"), Ok(0.5));
        assert_eq!(parse_rate("1/100ms"), Ok(10.0));
        assert_eq!(parse_rate("1000/5m"), Ok(1000.0 / 300.0));
        for bad in ["", "fast", "0", "-1", "10/0s", "10/parsec", "1000/5", "NaN"] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
    }
}
