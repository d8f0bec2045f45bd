//! Command-line flags of `clb-sync-worker`, each with a `CLB_*` environment fallback (in the library so
//! that the deployment manifests can be checked against them).

use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};

use crate::nrp::azure::{CredentialConfig, DEFAULT_ENDPOINT};
use crate::worker::{Backoff, Limits, WorkerConfig};

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
    /// gRPC URL of the state server.
    #[arg(long, env = "CLB_SERVER", default_value = "http://127.0.0.1:50051")]
    pub server: String,
    /// Name of this worker (default: hostname-pid).
    #[arg(long, env = "CLB_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Units executed concurrently.
    #[arg(long, env = "CLB_CAPACITY", default_value_t = 4)]
    pub capacity: u32,
    /// Gateways served (comma-separated; empty: all).
    #[arg(long, env = "CLB_GATEWAYS", value_delimiter = ',')]
    pub gateways: Vec<String>,
    /// ARM endpoint: the NRP emulator's URL or https://management.azure.com.
    #[arg(long, env = "CLB_NRP_ENDPOINT", default_value = DEFAULT_ENDPOINT)]
    pub nrp_endpoint: String,
    /// Azure subscription id of the resources.
    #[arg(long, env = "CLB_SUBSCRIPTION")]
    pub subscription: String,
    /// Resource group of the resources.
    #[arg(long, env = "CLB_RESOURCE_GROUP")]
    pub resource_group: String,
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
    /// First reconnection delay, in milliseconds.
    #[arg(long, env = "CLB_BACKOFF_INITIAL_MS", default_value_t = 200)]
    pub backoff_initial_ms: u64,
    /// Cap of the reconnection delay, in milliseconds.
    #[arg(long, env = "CLB_BACKOFF_MAX_MS", default_value_t = 10_000)]
    pub backoff_max_ms: u64,
    /// Time in-flight units get to finish at shutdown, in milliseconds.
    #[arg(long, env = "CLB_SHUTDOWN_GRACE_MS", default_value_t = 10_000)]
    pub shutdown_grace_ms: u64,
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

    /// The worker configuration the flags describe.
    pub fn worker_config(&self) -> WorkerConfig {
        let worker_id = self.worker_id.clone().unwrap_or_else(default_worker_id);
        let mut c = WorkerConfig::new(&self.server, worker_id);
        c.capacity = self.capacity;
        c.gateways = self
            .gateways
            .iter()
            .filter(|g| !g.is_empty())
            .cloned()
            .collect();
        c.limits = Limits {
            max_locations_per_call: self.max_locations_per_call,
            max_addresses_per_call: self.max_addresses_per_call,
            max_addresses_per_report: self.max_addresses_per_report,
            max_concurrent_mutations_per_gateway: self.max_concurrent_mutations,
        };
        c.backoff = Backoff {
            initial: Duration::from_millis(self.backoff_initial_ms),
            max: Duration::from_millis(self.backoff_max_ms),
        };
        c.shutdown_grace = Duration::from_millis(self.shutdown_grace_ms);
        c.gateway_region = self.gateway_region.clone();
        c.virtual_network_id = self.virtual_network_id.clone();
        c
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
