//! Command-line flags of `clb-state-server`, each with a `CLB_*` environment fallback.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, Parser};

use crate::auth::{AuthConfig, Mode};
use crate::state::ServerConfig;
use clb_core::dispatch::DispatchConfig;
use clb_telemetry::flags::format_duration;

/// Server id used when neither `--server-id` nor `HOSTNAME` is set.
pub const DEFAULT_SERVER_ID: &str = "clb-state-server";

/// Flags of `clb-state-server`.
#[derive(Debug, Clone, PartialEq, Eq, Parser)]
#[command(
    name = "clb-state-server",
    version,
    about = "clb state server: DiffTracker, dispatcher and gRPC API"
)]
pub struct Args {
    /// Address of the gRPC API (Writer, Worker, Admin, health, reflection).
    #[arg(long, env = "CLB_LISTEN", default_value = "0.0.0.0:50051")]
    pub listen: SocketAddr,

    /// Address of the HTTP endpoint serving /metrics and /healthz.
    #[arg(long, env = "CLB_METRICS_LISTEN", default_value = "0.0.0.0:9090")]
    pub metrics_listen: SocketAddr,

    /// Identity of this server instance (default: $HOSTNAME, i.e. the pod name).
    #[arg(long, env = "CLB_SERVER_ID")]
    pub server_id: Option<String>,

    /// Gateways this server drives, comma-separated; the first is the default gateway. Not with
    /// --gateways-file.
    #[arg(
        long,
        env = "CLB_GATEWAYS",
        value_delimiter = ',',
        default_value = "default"
    )]
    pub gateways: Vec<String>,

    /// The gateways file (YAML, shared with the workers and the watcher): the server drives its
    /// gateways, the default first. Read at start: a changed file takes effect on restart, and a
    /// gateway dropped from it is no longer driven (its backends in NRP are left as they are, not
    /// drained). Not with --gateways.
    #[arg(
        long,
        env = "CLB_GATEWAYS_FILE",
        value_name = "FILE",
        conflicts_with = "gateways"
    )]
    pub gateways_file: Option<PathBuf>,

    /// The Azure subscription of each gateway, from --gateways-file (not a flag): the gateways
    /// of one subscription share its write budget.
    #[arg(skip)]
    pub gateway_subscriptions: std::collections::BTreeMap<String, String>,

    /// Writers whose first resync must complete before removals are sent to NRP, comma-separated.
    /// Optional: without it the server still waits for the cluster watcher's resync and for each
    /// node's pod writer (the restart gate).
    #[arg(long, env = "CLB_EXPECTED_WRITERS", value_delimiter = ',')]
    pub expected_writers: Vec<String>,

    /// Longest wait for a writer after a restart (e.g. 3m, 90s): once NRP is read back and the
    /// cluster watcher resynced, removals at a node's locations wait at most this long for the
    /// resync of the node's pod writer (a node agent that never comes back), and removals wait at
    /// most this long for each --expected-writers entry. The watcher itself is waited for without
    /// bound.
    #[arg(long, env = "CLB_RESYNC_WAIT", default_value = "3m", value_name = "DURATION", value_parser = parse_duration)]
    pub resync_wait: Duration,

    /// Lease of a work unit (e.g. 30s, 1500ms).
    #[arg(long, env = "CLB_LEASE", default_value = "30s", value_name = "DURATION", value_parser = parse_duration)]
    pub lease: Duration,

    /// Most locations in one work unit (Azure bounds neither; --max-addresses-per-unit binds).
    #[arg(long, env = "CLB_MAX_LOCATIONS_PER_UNIT", default_value_t = 1_000)]
    pub max_locations_per_unit: usize,

    /// Most addresses in one work unit (a single larger location still goes, alone).
    #[arg(long, env = "CLB_MAX_ADDRESSES_PER_UNIT", default_value_t = 5_000)]
    pub max_addresses_per_unit: usize,

    /// Most service changes in one work unit, whatever the room for concurrent calls; the worker
    /// registers a unit's services in one updateServices call.
    #[arg(long, env = "CLB_MAX_SERVICES_PER_UNIT", default_value_t = 16)]
    pub max_services_per_unit: usize,

    /// Most concurrent mutating NRP calls the work units in flight per gateway may make, across all
    /// workers (a location unit counts 1, a service unit the changes it runs side by side: at most
    /// the room left when it was cut); 0 = no bound.
    #[arg(long, env = "CLB_MAX_MUTATING_UNITS_IN_FLIGHT", default_value_t = 4)]
    pub max_mutating_units_in_flight: usize,

    /// Pacing against Azure's write budget: while the subscription's remaining writes (as the
    /// workers last saw them in `x-ms-ratelimit-remaining-subscription-writes`) are estimated below
    /// --write-reserve, mutating units start at most at this many writes per second per gateway,
    /// each carrying what accumulated meanwhile; 0 = no pacing. The default stays under NRP's
    /// 1,000 writes per 5 minutes.
    #[arg(long, env = "CLB_WRITE_PACE", default_value = "3", value_name = "WRITES_PER_SEC", value_parser = non_negative_rate)]
    pub write_pace: Rate,

    /// The writes kept in reserve: pacing (--write-pace) starts below it.
    #[arg(long, env = "CLB_WRITE_RESERVE", default_value_t = 20)]
    pub write_reserve: u32,

    /// Once the workers reported a write budget (ARM throttles the subscription): the writes that
    /// may go at once before --write-pace binds (a bucket of this size refilled at the pace), so
    /// ARM's 5-minute cap is not reached (50 + 300 s × 3/s = 950 of its 1,000).
    #[arg(long, env = "CLB_WRITE_BURST", default_value_t = 50)]
    pub write_burst: u32,

    /// From idle, location units are held back while changes to locations keep arriving less
    /// than this apart (a burst: a rollout, a resync), so the burst goes out in one wave of wide
    /// units. An isolated change after a quiet time waits this long. 3 ms was too short on a
    /// loaded machine: a pause of a few ms in a rollout's stream of writes cut it into two waves.
    #[arg(long, env = "CLB_BATCH_QUIET", default_value = "10ms", value_name = "DURATION", value_parser = parse_duration)]
    pub batch_quiet: Duration,

    /// The longest a burst holds location units back, from its first change (a rollout's writes
    /// then go out in one wave of full units: 4 NRP calls instead of 8 on the rollout bench, see
    /// docs/benchmarks.md); 0 = no holding: units are cut as soon as a slot is free.
    #[arg(long, env = "CLB_BATCH_LINGER", default_value = "100ms", value_name = "DURATION", value_parser = parse_duration)]
    pub batch_linger: Duration,

    /// Staggering location units in steady churn: while some are in flight and the last one
    /// carried all that waited, the next starts no sooner than (a location unit's recent
    /// duration ÷ --max-mutating-units-in-flight) × this after the last one, so the slots take
    /// turns instead of calling in waves; a burst is not held. 0 = off (a unit goes as soon as
    /// a slot is free); otherwise at least 1.
    #[arg(long, env = "CLB_UNIT_HEADWAY", default_value = "1.05", value_name = "FACTOR", value_parser = headway_factor)]
    pub unit_headway: Rate,

    /// Most updates accepted in one batch (Apply, one ApplyStream message, one resync chunk).
    #[arg(long, env = "CLB_MAX_ITEMS_PER_BATCH", default_value_t = 10_000)]
    pub max_items_per_batch: usize,

    /// Largest gRPC message accepted or sent, in bytes.
    #[arg(long, env = "CLB_MAX_MESSAGE_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_message_bytes: usize,

    /// First retry delay of a failed unit (doubles per attempt, with jitter).
    #[arg(long, env = "CLB_RETRY_BASE", default_value = "200ms", value_name = "DURATION", value_parser = parse_duration)]
    pub retry_base: Duration,

    /// Longest retry delay.
    #[arg(long, env = "CLB_RETRY_MAX", default_value = "30s", value_name = "DURATION", value_parser = parse_duration)]
    pub retry_max: Duration,

    /// First delay before work NRP refused as invalid is sent again (doubles per refusal of the
    /// same work, with jitter; starts over when its desired state or NRP's state of it changes).
    #[arg(long, env = "CLB_REFUSAL_BASE", default_value = "30s", value_name = "DURATION", value_parser = parse_duration)]
    pub refusal_base: Duration,

    /// Longest delay between two attempts of work NRP refused as invalid: what bounds the writes a
    /// refusal costs (docs/errors.md, "The refusal budget").
    #[arg(long, env = "CLB_REFUSAL_MAX", default_value = "15m", value_name = "DURATION", value_parser = parse_duration)]
    pub refusal_max: Duration,

    /// How often NRP's actual state is read back to repair drift.
    #[arg(long, env = "CLB_ANTI_ENTROPY_INTERVAL", default_value = "5m", value_name = "DURATION", value_parser = parse_duration)]
    pub anti_entropy_interval: Duration,

    /// Run as one of several replicas, active/standby: only the holder of the Lease
    /// --leader-elect-resource-namespace/--leader-elect-resource-name leads (serves Writer, Worker
    /// and Admin and hands out work); the others report NOT_SERVING and not ready on /readyz until
    /// they acquire it. Needs a Kubernetes API (in-cluster service account or kubeconfig).
    #[arg(
        long,
        env = "CLB_LEADER_ELECT",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub leader_elect: bool,

    /// How long a standby waits after the last renewal it saw before it takes the Lease
    /// (e.g. 15s, 1500ms).
    #[arg(long, env = "CLB_LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_name = "DURATION", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader keeps leading without a successful renewal; then it stops handing out
    /// work and closes its streams (shorter than the lease duration).
    #[arg(long, env = "CLB_LEADER_ELECT_RENEW_DEADLINE", default_value = "10s", value_name = "DURATION", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,

    /// How often the leader renews the Lease and a standby tries to acquire it.
    #[arg(long, env = "CLB_LEADER_ELECT_RETRY_PERIOD", default_value = "2s", value_name = "DURATION", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,

    /// Name of the Lease.
    #[arg(
        long,
        env = "CLB_LEADER_ELECT_RESOURCE_NAME",
        default_value = "clb-state-server"
    )]
    pub leader_elect_resource_name: String,

    /// Namespace of the Lease (default: the namespace of the Kubernetes client, in a pod its own).
    #[arg(long, env = "CLB_LEADER_ELECT_RESOURCE_NAMESPACE")]
    pub leader_elect_resource_namespace: Option<String>,

    /// PEM certificate chain of the gRPC API: serves TLS instead of plaintext (needs --tls-key).
    /// The metrics endpoint stays plaintext.
    #[arg(long, env = "CLB_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "CLB_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificate(s): every client must present a certificate signed by one (mutual TLS;
    /// needs --tls-cert and --tls-key, or --tls-self-managed).
    #[arg(long, env = "CLB_TLS_CLIENT_CA", value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,

    #[command(flatten)]
    #[allow(missing_docs)]
    pub self_managed: crate::self_managed::SelfManagedArgs,

    /// How callers are identified: `kubernetes` validates each call's bearer token with a
    /// TokenReview (audience --token-audience); `none` trusts every caller (refused on a
    /// non-loopback --listen without --insecure-allow-unauthenticated). docs/security.md.
    #[arg(long, env = "CLB_AUTHENTICATION", value_enum, default_value_t = Mode::None)]
    pub authentication: Mode,

    /// What callers may do: `kubernetes` asks a SubjectAccessReview per gateway (API group
    /// clb.azure.com, resource gateways, verbs write, write-node, work, get; needs
    /// --authentication=kubernetes); `none` lets every caller do everything.
    #[arg(long, env = "CLB_AUTHORIZATION", value_enum, default_value_t = Mode::None)]
    pub authorization: Mode,

    /// Serve without authentication or authorization on a non-loopback address (a warning is
    /// logged at start).
    #[arg(
        long,
        env = "CLB_INSECURE_ALLOW_UNAUTHENTICATED",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub insecure_allow_unauthenticated: bool,

    /// The audience callers' tokens must be issued for (their projected token's audience).
    #[arg(long, env = "CLB_TOKEN_AUDIENCE", default_value = crate::auth::DEFAULT_AUDIENCE)]
    pub token_audience: String,

    /// How long a TokenReview or SubjectAccessReview answer is reused (a refusal: at most 5s).
    #[arg(long, env = "CLB_AUTH_CACHE_TTL", default_value = "30s", value_name = "DURATION", value_parser = parse_duration)]
    pub auth_cache_ttl: Duration,

    /// Most cached answers of each kind (tokens, access decisions).
    #[arg(long, env = "CLB_AUTH_CACHE_SIZE", default_value_t = crate::auth::DEFAULT_CACHE_CAPACITY)]
    pub auth_cache_size: usize,
}

/// Parses a duration flag: a number with a unit (`15s`, `1500ms`, `2m`, `1h 30m`); a bare number
/// is refused.
pub use clb_telemetry::flags::parse_duration;

/// A flag value that parses but makes no sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A number is below its minimum.
    #[error("--{flag} must be at least {min}, got {value}")]
    TooSmall {
        /// Flag name (without `--`).
        flag: &'static str,
        /// Smallest accepted value.
        min: u64,
        /// Value given.
        value: u64,
    },
    /// A duration is below its minimum.
    #[error(
        "--{flag} must be at least {}, got {}",
        format_duration(*min),
        format_duration(*value)
    )]
    DurationTooShort {
        /// Flag name (without `--`).
        flag: &'static str,
        /// Shortest accepted value.
        min: Duration,
        /// Value given.
        value: Duration,
    },
    /// `--retry-base` exceeds `--retry-max`.
    #[error(
        "--retry-base ({}) must not exceed --retry-max ({})",
        format_duration(*base),
        format_duration(*max)
    )]
    RetryBaseAboveMax {
        /// `--retry-base`.
        base: Duration,
        /// `--retry-max`.
        max: Duration,
    },
    /// A list holds an empty name (e.g. `a,,b`).
    #[error("--{flag} contains an empty name")]
    EmptyName {
        /// Flag name.
        flag: &'static str,
    },
    /// A list names the same thing twice.
    #[error("--{flag} names {name:?} twice")]
    Duplicate {
        /// Flag name.
        flag: &'static str,
        /// The repeated name.
        name: String,
    },
    /// `--server-id` is empty.
    #[error("--server-id must not be empty")]
    EmptyServerId,
    /// `--gateways-file` cannot be used.
    #[error("--gateways-file: {0}")]
    GatewaysFile(#[from] clb_gateways::GatewaysError),
    /// The leader election flags do not fit together.
    #[error("{0}")]
    LeaderElection(#[from] crate::leader::ElectionConfigError),
    /// Unchecked callers on an address other hosts can reach.
    #[error(
        "--authentication={authentication} and --authorization={authorization} on the non-loopback \
         address {listen}: every host that reaches it could change every gateway; use \
         --authentication=kubernetes --authorization=kubernetes, listen on loopback, or pass \
         --insecure-allow-unauthenticated"
    )]
    Unauthenticated {
        /// `--listen`.
        listen: SocketAddr,
        /// `--authentication`.
        authentication: &'static str,
        /// `--authorization`.
        authorization: &'static str,
    },
    /// `--authorization=kubernetes` without `--authentication=kubernetes`.
    #[error("--authorization=kubernetes requires --authentication=kubernetes")]
    AuthorizationWithoutAuthentication,
    /// `--token-audience` is empty.
    #[error("--token-audience must not be empty")]
    EmptyAudience,
    /// The self-managed TLS flags do not fit ([`crate::self_managed::SelfManagedArgs::validate`]).
    #[error("{0}")]
    SelfManaged(String),
    /// A TLS flag is given without the flag(s) it needs.
    #[error("--{given} requires {missing}")]
    TlsIncomplete {
        /// The flag given (without `--`).
        given: &'static str,
        /// The flag(s) it needs, e.g. `--tls-key`.
        missing: &'static str,
    },
}

fn at_least(flag: &'static str, value: u64, min: u64) -> Result<(), ConfigError> {
    if value < min {
        return Err(ConfigError::TooSmall { flag, min, value });
    }
    Ok(())
}

fn at_least_duration(
    flag: &'static str,
    value: Duration,
    min: Duration,
) -> Result<(), ConfigError> {
    if value < min {
        return Err(ConfigError::DurationTooShort { flag, min, value });
    }
    Ok(())
}

fn names(flag: &'static str, list: &[String]) -> Result<(), ConfigError> {
    let mut seen = HashSet::new();
    for name in list {
        if name.trim().is_empty() {
            return Err(ConfigError::EmptyName { flag });
        }
        if !seen.insert(name.as_str()) {
            return Err(ConfigError::Duplicate {
                flag,
                name: name.clone(),
            });
        }
    }
    Ok(())
}

impl Args {
    /// Parses the process's flags and environment and validates them; on error prints a clap-style
    /// message and exits with status 2.
    pub fn parse_and_validate() -> Self {
        let mut args = Self::parse();
        if let Err(e) = args.validate().and_then(|()| args.load_gateways_file()) {
            Self::command()
                .error(clap::error::ErrorKind::ValueValidation, e)
                .exit();
        }
        args
    }

    /// Reads `--gateways-file` (if given) and takes its gateways, the default first, as the
    /// gateways to drive (in place of `--gateways`).
    pub fn load_gateways_file(&mut self) -> Result<(), ConfigError> {
        if let Some(path) = &self.gateways_file {
            let file = clb_gateways::Gateways::load(path)?;
            self.gateways = file.names();
            self.gateway_subscriptions = file
                .all()
                .iter()
                .map(|g| (g.name.clone(), g.azure.subscription.to_ascii_lowercase()))
                .collect();
        }
        Ok(())
    }

    /// Checks what clap cannot: minimums, orderings, names.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let usize_flags = [
            ("max-locations-per-unit", self.max_locations_per_unit),
            ("max-addresses-per-unit", self.max_addresses_per_unit),
            ("max-services-per-unit", self.max_services_per_unit),
            ("max-items-per-batch", self.max_items_per_batch),
        ];
        let ms = Duration::from_millis(1);
        at_least_duration("lease", self.lease, ms)?;
        for (flag, v) in usize_flags {
            at_least(flag, v as u64, 1)?;
        }
        // Room for at least a small batch plus gRPC framing.
        at_least("max-message-bytes", self.max_message_bytes as u64, 1024)?;
        let (base, max) = (self.retry_base, self.retry_max);
        at_least_duration("retry-base", base, ms)?;
        at_least_duration("retry-max", max, ms)?;
        if base > max {
            return Err(ConfigError::RetryBaseAboveMax { base, max });
        }
        at_least_duration(
            "anti-entropy-interval",
            self.anti_entropy_interval,
            Duration::from_secs(1),
        )?;
        if self.gateways.is_empty() {
            return Err(ConfigError::EmptyName { flag: "gateways" });
        }
        names("gateways", &self.gateways)?;
        names("expected-writers", &self.expected_writers)?;
        if self
            .server_id
            .as_deref()
            .is_some_and(|s| s.trim().is_empty())
        {
            return Err(ConfigError::EmptyServerId);
        }
        if self.leader_elect {
            self.election_config("namespace-checked-later").validate()?;
        }
        self.validate_tls()?;
        self.validate_auth()
    }

    fn validate_auth(&self) -> Result<(), ConfigError> {
        let name = |m: Mode| match m {
            Mode::None => "none",
            Mode::Kubernetes => "kubernetes",
        };
        if self.authorization == Mode::Kubernetes && self.authentication != Mode::Kubernetes {
            return Err(ConfigError::AuthorizationWithoutAuthentication);
        }
        if self.token_audience.trim().is_empty() {
            return Err(ConfigError::EmptyAudience);
        }
        at_least("auth-cache-size", self.auth_cache_size as u64, 1)?;
        if !self.listen.ip().is_loopback()
            && self.unchecked_callers()
            && !self.insecure_allow_unauthenticated
        {
            return Err(ConfigError::Unauthenticated {
                listen: self.listen,
                authentication: name(self.authentication),
                authorization: name(self.authorization),
            });
        }
        Ok(())
    }

    /// Whether some caller goes unchecked (authentication or authorization `none`).
    pub fn unchecked_callers(&self) -> bool {
        self.authentication == Mode::None || self.authorization == Mode::None
    }

    /// The caller checks the flags ask for (call [`Args::validate`] first).
    pub fn auth_config(&self) -> AuthConfig {
        AuthConfig {
            authentication: self.authentication,
            authorization: self.authorization,
            audience: self.token_audience.trim().to_owned(),
            cache_ttl: self.auth_cache_ttl,
            negative_ttl: crate::auth::NEGATIVE_TTL.min(self.auth_cache_ttl),
            cache_capacity: self.auth_cache_size,
            review_timeout: crate::auth::REVIEW_TIMEOUT,
        }
    }

    /// `--server-id`, else `$HOSTNAME` (the pod name in Kubernetes), else [`DEFAULT_SERVER_ID`].
    pub fn resolved_server_id(&self) -> String {
        self.server_id
            .clone()
            .or_else(|| {
                std::env::var("HOSTNAME")
                    .ok()
                    .filter(|h| !h.trim().is_empty())
            })
            .unwrap_or_else(|| DEFAULT_SERVER_ID.to_owned())
    }

    /// The leader election of this replica (with `--leader-elect`): the Lease in
    /// `--leader-elect-resource-namespace`, else in `default_namespace` (the Kubernetes client's);
    /// the identity is the server id (the pod name).
    pub fn election_config(&self, default_namespace: &str) -> crate::leader::ElectionConfig {
        crate::leader::ElectionConfig {
            namespace: self
                .leader_elect_resource_namespace
                .clone()
                .unwrap_or_else(|| default_namespace.to_owned()),
            name: self.leader_elect_resource_name.clone(),
            identity: self.resolved_server_id(),
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        }
    }

    /// The server core's configuration (call [`Args::validate`] first).
    pub fn to_server_config(&self) -> ServerConfig {
        ServerConfig {
            server_id: self.resolved_server_id(),
            gateways: self.gateways.iter().map(|g| g.trim().to_owned()).collect(),
            subscriptions: self.gateway_subscriptions.clone(),
            expected_writers: self
                .expected_writers
                .iter()
                .map(|w| w.trim().to_owned())
                .collect(),
            resync_wait: self.resync_wait,
            max_items_per_batch: self.max_items_per_batch,
            max_message_bytes: self.max_message_bytes,
            dispatch: DispatchConfig {
                lease: self.lease,
                max_locations_per_unit: self.max_locations_per_unit,
                max_addresses_per_unit: self.max_addresses_per_unit,
                max_services_per_unit: self.max_services_per_unit,
                retry_base: self.retry_base,
                retry_max: self.retry_max,
                refusal_base: self.refusal_base,
                refusal_max: self.refusal_max.max(self.refusal_base),
                anti_entropy_interval: self.anti_entropy_interval,
                max_mutating_units_in_flight: self.max_mutating_units_in_flight,
                write_pace: self.write_pace.0,
                write_reserve: self.write_reserve,
                write_burst: self.write_burst,
                batch_quiet: self.batch_quiet,
                batch_linger: self.batch_linger,
                unit_headway: self.unit_headway.0,
            },
            leader_elect: self.leader_elect,
        }
    }
}

/// A rate in events per second (compared bit for bit, so the flags stay `Eq`).
#[derive(Debug, Clone, Copy)]
pub struct Rate(pub f64);

impl PartialEq for Rate {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Rate {}

/// Parses --write-pace: writes per second, a finite number of at least 0.
fn non_negative_rate(s: &str) -> Result<Rate, String> {
    let v: f64 = s
        .trim()
        .trim_end_matches("/s")
        .parse()
        .map_err(|_| format!("{s:?} is not a number of writes per second (e.g. 3 or 3/s)"))?;
    if v.is_finite() && v >= 0.0 {
        Ok(Rate(v))
    } else {
        Err(format!(
            "{s:?}: must be 0 (no pacing) or more writes per second"
        ))
    }
}

/// Parses --unit-headway: 0 (off) or a finite factor of at least 1.
fn headway_factor(s: &str) -> Result<Rate, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number (e.g. 1.2, or 0 for off)"))?;
    if v == 0.0 || (v.is_finite() && v >= 1.0) {
        Ok(Rate(v))
    } else {
        Err(format!(
            "{s:?}: must be 0 (off) or at least 1 (below 1 a slot's turn comes before it is free)"
        ))
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
