//! Command-line flags of `clb-sync-worker`, each with a `CLB_*` environment fallback (in the library so
//! that the deployment manifests can be checked against them).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::worker::{
    Backoff, GatewayTarget, Limits, NrpTargets, WorkerConfig, WorkerError, WorkerTls,
};
use clb_gateways::Gateways;
use clb_nrp::azure::{ArmClient, ArmConfig, CredentialConfig, DEFAULT_ENDPOINT};
use clb_nrp::wire::{API_VERSION, SUPPORTED_API_VERSIONS};
use clb_telemetry::flags::parse_duration;

/// Which Entra ID credential authenticates calls to ARM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Credential {
    /// No token (the NRP emulator).
    None,
    /// Entra Workload Identity (environment injected by the webhook).
    WorkloadIdentity,
    /// The VM's / scale set's managed identity (`--client-id` for a user-assigned one).
    ManagedIdentity,
    /// A service principal (`--tenant-id`, `--client-id`, secret from `AZURE_CLIENT_SECRET`).
    ClientSecret,
    /// The developer's `az` / `azd` login.
    DeveloperTools,
}

/// Execute clb work units against Azure NRP.
#[derive(Debug, Parser)]
#[command(name = "clb-sync-worker", version, about)]
pub struct Args {
    /// gRPC URL of the state server (`https://` for TLS).
    #[arg(long, env = "CLB_SERVER", default_value = "http://127.0.0.1:50051")]
    pub server: String,
    /// PEM CA certificate(s) that sign the state server's certificate; turns TLS on (an `http://`
    /// --server is then reached as `https://`). Read again for each connection when it changed
    /// (the mounted ConfigMap clb-ca-bundle during a CA rotation).
    #[arg(long, env = "CLB_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// PEM certificate of this worker, for mutual TLS (needs --tls-key; turns TLS on).
    #[arg(long, env = "CLB_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "CLB_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Name to verify in the state server's certificate (default: the host of --server; turns TLS
    /// on).
    #[arg(long, env = "CLB_TLS_DOMAIN", value_name = "NAME")]
    pub tls_domain: Option<String>,
    /// File of the bearer token sent to the state server (the projected ServiceAccount token with
    /// the audience `clb`), re-read when the kubelet rotates it. Default:
    /// /var/run/secrets/clb/token if it exists, else no token.
    #[arg(long, env = "CLB_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Send the bearer token over a plaintext (http://) connection to a host that is not loopback
    /// (refused otherwise: the token would cross the network in clear).
    #[arg(long, env = "CLB_INSECURE_PLAINTEXT", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub insecure_plaintext: bool,
    /// Name of this worker (default: hostname-pid).
    #[arg(long, env = "CLB_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Units executed concurrently.
    #[arg(long, env = "CLB_CAPACITY", default_value_t = 4)]
    pub capacity: u32,
    /// Gateways served (comma-separated; empty: all, or with --gateways-file every gateway of the
    /// file).
    #[arg(long, env = "CLB_GATEWAYS", value_delimiter = ',')]
    pub gateways: Vec<String>,
    /// The gateways file (YAML, shared with the state server): each gateway's calls go to its own
    /// subscription, resource group, endpoint and api-version, under its ARM name; the worker serves
    /// every gateway of the file unless --gateways narrows it. Without it, every gateway goes to
    /// --subscription/--resource-group under its own name.
    #[arg(long, env = "CLB_GATEWAYS_FILE", value_name = "FILE")]
    pub gateways_file: Option<PathBuf>,
    /// ARM endpoint: the NRP emulator's URL or `https://management.azure.com`.
    #[arg(long, env = "CLB_NRP_ENDPOINT", default_value = DEFAULT_ENDPOINT)]
    pub nrp_endpoint: String,
    /// ARM api-version of the NRP calls: 2025-05-01 or 2026-03-01 (the newest the project is tested
    /// against).
    #[arg(long, env = "CLB_NRP_API_VERSION", default_value = API_VERSION)]
    pub nrp_api_version: String,
    /// api-version of the calls on particular gateways, as GATEWAY=VERSION (comma-separated or
    /// repeated), overriding --nrp-api-version for them.
    #[arg(
        long,
        env = "CLB_NRP_GATEWAY_API_VERSIONS",
        value_delimiter = ',',
        value_name = "GATEWAY=VERSION"
    )]
    pub nrp_gateway_api_version: Vec<String>,
    /// Create a service gateway that NRP does not have when service work needs it (in
    /// --gateway-region); with false, such work fails with ResourceNotFound.
    #[arg(
        long,
        env = "CLB_CREATE_MISSING_GATEWAY",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub create_missing_gateway: bool,
    /// Azure subscription id of the resources (required without --gateways-file; ignored with it).
    #[arg(
        long,
        env = "CLB_SUBSCRIPTION",
        required_unless_present = "gateways_file"
    )]
    pub subscription: Option<String>,
    /// Resource group of the resources (required without --gateways-file; ignored with it).
    #[arg(
        long,
        env = "CLB_RESOURCE_GROUP",
        required_unless_present = "gateways_file"
    )]
    pub resource_group: Option<String>,
    /// Credential for ARM.
    #[arg(long, env = "CLB_CREDENTIAL", value_enum, default_value_t = Credential::WorkloadIdentity)]
    pub credential: Credential,
    /// Client id (client-secret, or a user-assigned managed identity).
    #[arg(long, env = "CLB_CLIENT_ID")]
    pub client_id: Option<String>,
    /// Tenant id (client-secret).
    #[arg(long, env = "CLB_TENANT_ID")]
    pub tenant_id: Option<String>,
    /// Azure region for a service gateway the worker has to create.
    #[arg(long, env = "CLB_GATEWAY_REGION", default_value = "eastus")]
    pub gateway_region: String,
    /// Virtual network id for a service gateway the worker has to create.
    #[arg(long, env = "CLB_VIRTUAL_NETWORK_ID")]
    pub virtual_network_id: Option<String>,
    /// Resource group where egresses may bring their own NAT gateway (pod annotation
    /// `clb.azure.com/nat-gateway`), for gateways the gateways file gives none
    /// (`natGatewayResourceGroup`); unset: bringing a NAT gateway is off.
    #[arg(long, env = "CLB_NAT_GATEWAY_RESOURCE_GROUP")]
    pub nat_gateway_resource_group: Option<String>,
    /// Most locations per updateAddressLocations call.
    #[arg(long, env = "CLB_MAX_LOCATIONS_PER_CALL", default_value_t = Limits::default().max_locations_per_call)]
    pub max_locations_per_call: usize,
    /// Most addresses per updateAddressLocations call.
    #[arg(long, env = "CLB_MAX_ADDRESSES_PER_CALL", default_value_t = Limits::default().max_addresses_per_call)]
    pub max_addresses_per_call: usize,
    /// Most addresses per Observed report part.
    #[arg(long, env = "CLB_MAX_ADDRESSES_PER_REPORT", default_value_t = Limits::default().max_addresses_per_report)]
    pub max_addresses_per_report: usize,
    /// Upper bound of concurrent mutating NRP calls per gateway.
    #[arg(long, env = "CLB_MAX_CONCURRENT_MUTATIONS", default_value_t = Limits::default().max_concurrent_mutations_per_gateway)]
    pub max_concurrent_mutations: usize,
    /// First reconnection delay (e.g. 200ms).
    #[arg(long, env = "CLB_BACKOFF_INITIAL", default_value = "200ms", value_name = "DURATION", value_parser = parse_duration)]
    pub backoff_initial: Duration,
    /// Cap of the reconnection delay (e.g. 10s). A session the server refused at once (no
    /// connection, or a standby's UNAVAILABLE during a fail-over) waits at most 2 s instead.
    #[arg(long, env = "CLB_BACKOFF_MAX", default_value = "10s", value_name = "DURATION", value_parser = parse_duration)]
    pub backoff_max: Duration,
    /// Time in-flight units get to finish at shutdown (e.g. 10s).
    #[arg(long, env = "CLB_SHUTDOWN_GRACE", default_value = "10s", value_name = "DURATION", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Address of the HTTP endpoint serving /metrics, /healthz and /readyz (ready while connected
    /// to the leading state server), e.g. 0.0.0.0:9090. Off when not given.
    #[arg(long, env = "CLB_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
}

impl Args {
    /// The credential the flags select (client-secret reads `AZURE_CLIENT_SECRET`).
    pub fn credential(&self) -> anyhow::Result<CredentialConfig> {
        Ok(match self.credential {
            Credential::None => CredentialConfig::None,
            Credential::WorkloadIdentity => CredentialConfig::WorkloadIdentity,
            Credential::ManagedIdentity => CredentialConfig::ManagedIdentity {
                client_id: self.client_id.clone(),
            },
            Credential::ClientSecret => CredentialConfig::ClientSecret {
                tenant_id: self.tenant_id.clone().context("--tenant-id is required")?,
                client_id: self.client_id.clone().context("--client-id is required")?,
                secret: std::env::var("AZURE_CLIENT_SECRET")
                    .context("AZURE_CLIENT_SECRET is required for client-secret")?,
            },
            Credential::DeveloperTools => CredentialConfig::DeveloperTools,
        })
    }

    /// The ARM client configuration the flags describe (endpoint, subscription, resource group,
    /// api-versions), with a precise error for a malformed or unsupported api-version flag.
    pub fn arm_config(&self) -> Result<ArmConfig, WorkerError> {
        let supported = || SUPPORTED_API_VERSIONS.join(", ");
        let check = |flag: &str, v: &str| {
            if SUPPORTED_API_VERSIONS.contains(&v) {
                Ok(())
            } else {
                Err(WorkerError::InvalidConfig(format!(
                    "{flag} {v:?}: not an api-version this worker is tested against (supported: {})",
                    supported()
                )))
            }
        };
        check("--nrp-api-version", &self.nrp_api_version)?;
        let (Some(subscription), Some(resource_group)) = (&self.subscription, &self.resource_group)
        else {
            return Err(WorkerError::InvalidConfig(
                "--subscription and --resource-group are required without --gateways-file".into(),
            ));
        };
        let mut arm = ArmConfig::new(subscription, resource_group)
            .with_endpoint(&self.nrp_endpoint)
            .with_api_version(&self.nrp_api_version);
        for entry in self
            .nrp_gateway_api_version
            .iter()
            .filter(|e| !e.is_empty())
        {
            let Some((gateway, version)) = entry.split_once('=') else {
                return Err(WorkerError::InvalidConfig(format!(
                    "--nrp-gateway-api-version {entry:?}: expected GATEWAY=VERSION"
                )));
            };
            let (gateway, version) = (gateway.trim(), version.trim());
            if gateway.is_empty() {
                return Err(WorkerError::InvalidConfig(format!(
                    "--nrp-gateway-api-version {entry:?}: the gateway name is empty"
                )));
            }
            check(&format!("--nrp-gateway-api-version {gateway}"), version)?;
            // Gateway names are case-insensitive, as ARM's.
            if arm
                .gateway_api_versions
                .keys()
                .any(|g| g.eq_ignore_ascii_case(gateway))
            {
                return Err(WorkerError::InvalidConfig(format!(
                    "--nrp-gateway-api-version: gateway {gateway:?} is given twice"
                )));
            }
            arm.gateway_api_versions
                .insert(gateway.to_string(), version.to_string());
        }
        Ok(arm)
    }

    /// The TLS settings the flags describe (reads and checks the files): `None` when no TLS flag is
    /// given (an `https://` --server still uses TLS, with default settings).
    pub fn tls(&self) -> Result<Option<WorkerTls>, WorkerError> {
        let identity = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
            (Some(_), None) => {
                return Err(WorkerError::InvalidConfig(
                    "--tls-cert requires --tls-key".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(WorkerError::InvalidConfig(
                    "--tls-key requires --tls-cert".into(),
                ));
            }
            (None, None) => None,
        };
        if self.tls_ca.is_none() && identity.is_none() && self.tls_domain.is_none() {
            return Ok(None);
        }
        WorkerTls::from_files(self.tls_ca.as_deref(), identity, self.tls_domain.clone()).map(Some)
    }

    /// The worker configuration the flags describe (reads the TLS files).
    pub fn worker_config(&self) -> Result<WorkerConfig, WorkerError> {
        let worker_id = self.worker_id.clone().unwrap_or_else(default_worker_id);
        let mut c = WorkerConfig::new(&self.server, worker_id);
        c.tls = self.tls()?;
        c.token_file = clb_client::token::token_file_or_default(self.token_file.as_deref());
        clb_client::tls::check_plaintext(
            &self.server,
            c.uses_tls(),
            c.token_file.as_deref(),
            self.insecure_plaintext,
        )
        .map_err(WorkerError::InvalidConfig)?;
        c.capacity = self.capacity;
        c.gateways = self.served_gateways(self.gateways_file()?.as_ref())?;
        c.limits = Limits {
            max_locations_per_call: self.max_locations_per_call,
            max_addresses_per_call: self.max_addresses_per_call,
            max_addresses_per_report: self.max_addresses_per_report,
            max_concurrent_mutations_per_gateway: self.max_concurrent_mutations,
        };
        c.backoff = Backoff {
            initial: self.backoff_initial,
            max: self.backoff_max,
        };
        c.shutdown_grace = self.shutdown_grace;
        c.gateway_region = self.gateway_region.clone();
        c.virtual_network_id = self.virtual_network_id.clone();
        c.nat_gateway_resource_group = self.nat_gateway_resource_group.clone();
        c.create_missing_gateway = self.create_missing_gateway;
        Ok(c)
    }
}

fn check_api_version(what: &str, v: &str) -> Result<(), WorkerError> {
    if SUPPORTED_API_VERSIONS.contains(&v) {
        Ok(())
    } else {
        Err(WorkerError::InvalidConfig(format!(
            "{what} {:?}: not an api-version this worker is tested against (supported: {})",
            v.chars().take(100).collect::<String>(),
            SUPPORTED_API_VERSIONS.join(", ")
        )))
    }
}

impl Args {
    /// Reads and checks `--gateways-file` (none without the flag).
    pub fn gateways_file(&self) -> Result<Option<Gateways>, WorkerError> {
        let Some(path) = &self.gateways_file else {
            return Ok(None);
        };
        Gateways::load(path)
            .map(Some)
            .map_err(|e| WorkerError::InvalidConfig(format!("--gateways-file: {e}")))
    }

    /// The gateways this worker serves: `--gateways` (each must be in the file, if one is given),
    /// else every gateway of the file, else all (empty).
    pub fn served_gateways(&self, file: Option<&Gateways>) -> Result<Vec<String>, WorkerError> {
        let flag: Vec<String> = self
            .gateways
            .iter()
            .map(|g| g.trim())
            .filter(|g| !g.is_empty())
            .map(str::to_owned)
            .collect();
        let Some(file) = file else {
            return Ok(flag);
        };
        if flag.is_empty() {
            return Ok(file.names());
        }
        for g in &flag {
            if file.get(g).is_none() {
                return Err(WorkerError::InvalidConfig(format!(
                    "--gateways {:?}: not a gateway of --gateways-file (it has: {})",
                    g.chars().take(100).collect::<String>(),
                    file.names().join(", ")
                )));
            }
        }
        Ok(flag)
    }

    /// The NRP client of every gateway: with `--gateways-file`, one per gateway of the file (its
    /// subscription, resource group, endpoint or `--nrp-endpoint`, api-version or
    /// `--nrp-gateway-api-version` or `--nrp-api-version`); without it, one client for all.
    pub fn nrp_targets(&self, credential: &CredentialConfig) -> Result<NrpTargets, WorkerError> {
        let file = self.gateways_file()?;
        let Some(file) = file else {
            let nrp = ArmClient::from_config(self.arm_config()?, credential)
                .map_err(|e| WorkerError::InvalidConfig(format!("the NRP client: {e}")))?;
            return Ok(NrpTargets::single(Arc::new(nrp)));
        };
        let mut targets = NrpTargets::empty();
        for (gateway, arm) in self.gateway_arm_configs(&file)? {
            let g = file.get(&gateway).expect("a gateway of the file");
            let nrp = ArmClient::from_config(arm, credential).map_err(|e| {
                WorkerError::InvalidConfig(format!("the NRP client of gateway {gateway:?}: {e}"))
            })?;
            targets.insert(
                &gateway,
                GatewayTarget {
                    nrp: Arc::new(nrp),
                    resource_name: Some(g.resource_name().to_owned()),
                    region: Some(g.azure.region.clone()),
                    virtual_network_id: g
                        .azure
                        .virtual_network_id
                        .clone()
                        .or_else(|| self.virtual_network_id.clone()),
                    nat_gateway_resource_group: g.azure.nat_gateway_resource_group.clone(),
                },
            );
        }
        Ok(targets)
    }

    /// The ARM client configuration of each gateway of `file` this worker serves, checked: a
    /// supported api-version, and no two gateways in one subscription and resource group (the load
    /// balancers, public IPs and NAT gateways the worker creates are named after the Service only:
    /// two gateways exposing one Service there would share them).
    pub fn gateway_arm_configs(
        &self,
        file: &Gateways,
    ) -> Result<Vec<(String, ArmConfig)>, WorkerError> {
        check_api_version("--nrp-api-version", &self.nrp_api_version)?;
        let mut overrides = BTreeMap::new();
        for entry in self
            .nrp_gateway_api_version
            .iter()
            .filter(|e| !e.is_empty())
        {
            let Some((gateway, version)) = entry.split_once('=') else {
                return Err(WorkerError::InvalidConfig(format!(
                    "--nrp-gateway-api-version {entry:?}: expected GATEWAY=VERSION"
                )));
            };
            overrides.insert(
                gateway.trim().to_ascii_lowercase(),
                version.trim().to_owned(),
            );
        }
        let served = self.served_gateways(Some(file))?;
        let mut out: Vec<(String, ArmConfig)> = Vec::new();
        for (i, g) in file.all().iter().enumerate() {
            if !served.iter().any(|s| s.eq_ignore_ascii_case(&g.name)) {
                continue;
            }
            let version = match (
                &g.azure.api_version,
                overrides.get(&g.name.to_ascii_lowercase()),
            ) {
                (Some(v), _) => {
                    check_api_version(
                        &format!("gateways file: gateway {:?} apiVersion", g.name),
                        v,
                    )?;
                    v.clone()
                }
                (None, Some(v)) => {
                    check_api_version(&format!("--nrp-gateway-api-version {}", g.name), v)?;
                    v.clone()
                }
                (None, None) => self.nrp_api_version.clone(),
            };
            let endpoint = g.azure.endpoint.as_deref().unwrap_or(&self.nrp_endpoint);
            if let Some((other, _)) = out.iter().find(|(_, a)| {
                a.endpoint == endpoint
                    && a.subscription_id
                        .eq_ignore_ascii_case(&g.azure.subscription)
                    && a.resource_group
                        .eq_ignore_ascii_case(&g.azure.resource_group)
            }) {
                return Err(WorkerError::InvalidConfig(format!(
                    "--gateways-file: gateway {:?} (gateways[{i}]) is in subscription {:?} and \
                     resource group {:?}, as gateway {other:?}: each gateway needs a resource group \
                     of its own (the load balancers, public IPs and NAT gateways the workers create \
                     are named after the Service only)",
                    g.name, g.azure.subscription, g.azure.resource_group
                )));
            }
            let arm = ArmConfig::new(&g.azure.subscription, &g.azure.resource_group)
                .with_endpoint(endpoint)
                .with_api_version(&version);
            out.push((g.name.clone(), arm));
        }
        Ok(out)
    }
}

/// `hostname-pid`, the hostname from `HOSTNAME` or `/etc/hostname`.
pub fn default_worker_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "clb-sync-worker".into());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Args {
        let base = ["clb-sync-worker", "--subscription=s", "--resource-group=rg"];
        Args::try_parse_from(base.iter().chain(args)).unwrap()
    }

    #[test]
    fn a_token_to_a_remote_plaintext_server_refuses_to_start_unless_told() {
        let token = "--token-file=/var/run/secrets/clb/token";
        let remote = "--server=http://clb-state-server.clb-system.svc:50051";
        let e = parse(&[remote, token])
            .worker_config()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("would cross the network in clear") && e.contains("--insecure-plaintext"),
            "{e}"
        );
        parse(&[remote, token, "--insecure-plaintext"])
            .worker_config()
            .unwrap();
        parse(&["--server=http://127.0.0.1:50051", token])
            .worker_config()
            .unwrap();
    }

    #[test]
    fn metrics_listen_is_off_by_default_and_checked() {
        assert_eq!(parse(&[]).metrics_listen, None);
        assert_eq!(
            parse(&["--metrics-listen=127.0.0.1:9090"]).metrics_listen,
            Some("127.0.0.1:9090".parse().unwrap())
        );
        let base = ["clb-sync-worker", "--subscription=s", "--resource-group=rg"];
        let err = Args::try_parse_from(base.iter().chain(&["--metrics-listen=9090"])).unwrap_err();
        assert!(
            err.to_string()
                .contains("invalid value '9090' for '--metrics-listen <ADDR>'"),
            "{err}"
        );
    }

    #[test]
    fn durations_need_a_unit() {
        let c = parse(&[]).worker_config().unwrap();
        assert_eq!(c.backoff, Backoff::default());
        assert_eq!(c.shutdown_grace, Duration::from_secs(10));
        let c = parse(&[
            "--backoff-initial=50ms",
            "--backoff-max=3s",
            "--shutdown-grace=1m",
        ])
        .worker_config()
        .unwrap();
        assert_eq!(
            (c.backoff.initial, c.backoff.max, c.shutdown_grace),
            (
                Duration::from_millis(50),
                Duration::from_secs(3),
                Duration::from_secs(60)
            )
        );
        let base = ["clb-sync-worker", "--subscription=s", "--resource-group=rg"];
        let err = Args::try_parse_from(base.iter().chain(&["--shutdown-grace=10000"])).unwrap_err();
        assert!(err.to_string().contains("\"10000\" has no unit"), "{err}");
    }

    #[test]
    fn clap_definition_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn nrp_api_versions_and_gateway_creation() {
        let a = parse(&[]);
        let arm = a.arm_config().unwrap();
        assert_eq!(arm.api_version, "2026-03-01");
        assert!(arm.gateway_api_versions.is_empty());
        assert!(a.worker_config().unwrap().create_missing_gateway);
        let a = parse(&[
            "--nrp-api-version=2025-05-01",
            "--nrp-gateway-api-version=gw-a=2026-03-01,gw-b=2025-05-01",
            "--create-missing-gateway=false",
        ]);
        let arm = a.arm_config().unwrap();
        assert_eq!(arm.api_version, "2025-05-01");
        assert_eq!(arm.api_version_for("GW-A"), "2026-03-01");
        assert_eq!(arm.api_version_for("gw-c"), "2025-05-01");
        assert!(!a.worker_config().unwrap().create_missing_gateway);
        for (args, want) in [
            (
                "--nrp-api-version=2024-01-01",
                "--nrp-api-version \"2024-01-01\": not an api-version this worker is tested \
                 against (supported: 2025-05-01, 2026-03-01)",
            ),
            (
                "--nrp-gateway-api-version=gw-a",
                "--nrp-gateway-api-version \"gw-a\": expected GATEWAY=VERSION",
            ),
            (
                "--nrp-gateway-api-version==2025-05-01",
                "--nrp-gateway-api-version \"=2025-05-01\": the gateway name is empty",
            ),
            (
                "--nrp-gateway-api-version=gw-a=2025-05-01,GW-A=2025-05-01",
                "--nrp-gateway-api-version: gateway \"GW-A\" is given twice",
            ),
        ] {
            let err = parse(&[args]).arm_config().unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("invalid worker configuration: {want}")
            );
        }
    }

    #[test]
    fn tls_is_off_by_default_and_a_cert_needs_its_key() {
        let c = parse(&[]).worker_config().unwrap();
        assert_eq!(c.tls, None);
        assert!(!c.uses_tls());
        let c = parse(&["--server=https://clb:50051"])
            .worker_config()
            .unwrap();
        assert!(c.uses_tls(), "https:// alone turns TLS on");

        for (args, want) in [
            (["--tls-cert=c.pem"], "--tls-cert requires --tls-key"),
            (["--tls-key=k.pem"], "--tls-key requires --tls-cert"),
        ] {
            let err = parse(&args).worker_config().unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("invalid worker configuration: {want}")
            );
        }
        let err = parse(&["--tls-ca=/no/such/ca.pem"])
            .worker_config()
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("--tls-ca /no/such/ca.pem: cannot read the file"),
            "{err}"
        );
    }

    #[test]
    fn a_tls_flag_turns_tls_on_for_an_http_url() {
        let c = parse(&[
            "--server=http://10.0.0.1:50051",
            "--tls-domain=clb-state-server",
        ])
        .worker_config()
        .unwrap();
        assert!(c.uses_tls());
        assert_eq!(c.connect_url(), "https://10.0.0.1:50051");
        assert_eq!(
            c.tls.and_then(|t| t.domain).as_deref(),
            Some("clb-state-server")
        );
    }

    fn file(name: &str, text: &str) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("clb-worker-{}-{name}.yaml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    const TWO: &str = "gateways:\n\
        - name: east\n  nodes: {pool: e}\n  azure: {subscription: s1, resourceGroup: rg-e, region: eastus, serviceGateway: sgw-east, endpoint: 'http://127.0.0.1:1'}\n\
        - name: west\n  azure: {subscription: s1, resourceGroup: rg-w, region: westus, apiVersion: '2025-05-01'}\n";

    #[test]
    fn a_gateways_file_gives_each_gateway_its_own_client() {
        let path = file("two", TWO);
        let flag = format!("--gateways-file={}", path.display());
        // Subscription and resource group are not needed with a file.
        let a = Args::try_parse_from(["clb-sync-worker", flag.as_str()]).unwrap();
        assert_eq!(a.worker_config().unwrap().gateways, ["east", "west"]);
        let g = a.gateways_file().unwrap().unwrap();
        let arms = a.gateway_arm_configs(&g).unwrap();
        assert_eq!(arms.len(), 2);
        assert_eq!(arms[0].0, "east");
        assert_eq!(arms[0].1.endpoint, "http://127.0.0.1:1");
        assert_eq!(arms[0].1.resource_group, "rg-e");
        assert_eq!(arms[0].1.api_version, API_VERSION);
        assert_eq!(arms[1].1.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(arms[1].1.api_version, "2025-05-01");
        let targets = a.nrp_targets(&CredentialConfig::None).unwrap();
        assert_eq!(targets.gateways(), ["east", "west"]);
        let east = targets.get("EAST").unwrap();
        assert_eq!(east.resource_name.as_deref(), Some("sgw-east"));
        assert_eq!(east.region.as_deref(), Some("eastus"));
        assert!(targets.get("north").is_none(), "no default with a file");
        // --gateways narrows the file, and names only its gateways.
        let b =
            Args::try_parse_from(["clb-sync-worker", flag.as_str(), "--gateways=west"]).unwrap();
        assert_eq!(b.worker_config().unwrap().gateways, ["west"]);
        assert_eq!(b.gateway_arm_configs(&g).unwrap().len(), 1);
        let c =
            Args::try_parse_from(["clb-sync-worker", flag.as_str(), "--gateways=north"]).unwrap();
        assert_eq!(
            c.worker_config().unwrap_err().to_string(),
            "invalid worker configuration: --gateways \"north\": not a gateway of \
             --gateways-file (it has: east, west)"
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn gateways_file_errors_are_precise() {
        let missing = Args::try_parse_from(["clb-sync-worker"]).unwrap_err();
        assert!(missing.to_string().contains("--subscription"), "{missing}");
        let a =
            Args::try_parse_from(["clb-sync-worker", "--gateways-file=/no/such/gw.yaml"]).unwrap();
        let err = a.worker_config().unwrap_err().to_string();
        assert!(
            err.contains("--gateways-file: cannot read the gateways file /no/such/gw.yaml"),
            "{err}"
        );
        let shared = file(
            "shared",
            "gateways:\n- name: a\n  nodes: {pool: a}\n  azure: {subscription: s, resourceGroup: rg, region: r}\n\
             - name: b\n  azure: {subscription: s, resourceGroup: RG, region: r}\n",
        );
        let flag = format!("--gateways-file={}", shared.display());
        let a = Args::try_parse_from(["clb-sync-worker", flag.as_str()]).unwrap();
        let err = a
            .nrp_targets(&CredentialConfig::None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("gateway \"b\" (gateways[1]) is in subscription \"s\" and resource group \"RG\", as gateway \"a\""),
            "{err}"
        );
        let old = file(
            "old",
            "gateways:\n- name: a\n  azure: {subscription: s, resourceGroup: rg, region: r, apiVersion: '2020-01-01'}\n",
        );
        let flag = format!("--gateways-file={}", old.display());
        let a = Args::try_parse_from(["clb-sync-worker", flag.as_str()]).unwrap();
        assert_eq!(
            a.nrp_targets(&CredentialConfig::None)
                .unwrap_err()
                .to_string(),
            "invalid worker configuration: gateways file: gateway \"a\" apiVersion \"2020-01-01\": \
             not an api-version this worker is tested against (supported: 2025-05-01, 2026-03-01)"
        );
        std::fs::remove_file(shared).unwrap();
        std::fs::remove_file(old).unwrap();
    }
}
