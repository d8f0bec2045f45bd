//! `clb-sync-worker`: connects to the clb state server, receives leased work units and executes them
//! against Azure NRP (or the NRP emulator).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use clb_sync_worker::nrp::azure::{ArmClient, ArmConfig, CredentialConfig, DEFAULT_ENDPOINT};
use clb_sync_worker::worker::{Backoff, Limits, WorkerConfig, run};
use tracing_subscriber::EnvFilter;

/// Which Entra ID credential authenticates calls to ARM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Credential {
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
struct Args {
    /// gRPC URL of the state server.
    #[arg(long, env = "CLB_SERVER", default_value = "http://127.0.0.1:50051")]
    server: String,
    /// Name of this worker (default: hostname-pid).
    #[arg(long, env = "CLB_WORKER_ID")]
    worker_id: Option<String>,
    /// Units executed concurrently.
    #[arg(long, env = "CLB_CAPACITY", default_value_t = 4)]
    capacity: u32,
    /// Gateways served (comma-separated; empty: all).
    #[arg(long, env = "CLB_GATEWAYS", value_delimiter = ',')]
    gateways: Vec<String>,
    /// ARM endpoint: the NRP emulator's URL or https://management.azure.com.
    #[arg(long, env = "CLB_NRP_ENDPOINT", default_value = DEFAULT_ENDPOINT)]
    nrp_endpoint: String,
    /// Azure subscription id of the resources.
    #[arg(long, env = "CLB_SUBSCRIPTION")]
    subscription: String,
    /// Resource group of the resources.
    #[arg(long, env = "CLB_RESOURCE_GROUP")]
    resource_group: String,
    /// Credential for ARM.
    #[arg(long, env = "CLB_CREDENTIAL", value_enum, default_value_t = Credential::WorkloadIdentity)]
    credential: Credential,
    /// Client id (client-secret, or a user-assigned managed identity).
    #[arg(long, env = "CLB_CLIENT_ID")]
    client_id: Option<String>,
    /// Tenant id (client-secret).
    #[arg(long, env = "CLB_TENANT_ID")]
    tenant_id: Option<String>,
    /// Azure region for a service gateway the worker has to create.
    #[arg(long, env = "CLB_GATEWAY_REGION", default_value = "eastus")]
    gateway_region: String,
    /// Virtual network id for a service gateway the worker has to create.
    #[arg(long, env = "CLB_VIRTUAL_NETWORK_ID")]
    virtual_network_id: Option<String>,
    /// Most locations per updateAddressLocations call.
    #[arg(long, env = "CLB_MAX_LOCATIONS_PER_CALL", default_value_t = Limits::default().max_locations_per_call)]
    max_locations_per_call: usize,
    /// Most addresses per updateAddressLocations call.
    #[arg(long, env = "CLB_MAX_ADDRESSES_PER_CALL", default_value_t = Limits::default().max_addresses_per_call)]
    max_addresses_per_call: usize,
    /// Most addresses per Observed report part.
    #[arg(long, env = "CLB_MAX_ADDRESSES_PER_REPORT", default_value_t = Limits::default().max_addresses_per_report)]
    max_addresses_per_report: usize,
    /// Upper bound of concurrent mutating NRP calls per gateway.
    #[arg(long, env = "CLB_MAX_CONCURRENT_MUTATIONS", default_value_t = Limits::default().max_concurrent_mutations_per_gateway)]
    max_concurrent_mutations: usize,
    /// First reconnection delay, in milliseconds.
    #[arg(long, env = "CLB_BACKOFF_INITIAL_MS", default_value_t = 200)]
    backoff_initial_ms: u64,
    /// Cap of the reconnection delay, in milliseconds.
    #[arg(long, env = "CLB_BACKOFF_MAX_MS", default_value_t = 10_000)]
    backoff_max_ms: u64,
    /// Time in-flight units get to finish at shutdown, in milliseconds.
    #[arg(long, env = "CLB_SHUTDOWN_GRACE_MS", default_value_t = 10_000)]
    shutdown_grace_ms: u64,
}

impl Args {
    fn credential(&self) -> anyhow::Result<CredentialConfig> {
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

    fn worker_config(&self) -> WorkerConfig {
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
fn default_worker_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "clb-sync-worker".into());
    format!("{host}-{}", std::process::id())
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let credential = args.credential()?;
    let arm =
        ArmConfig::new(&args.subscription, &args.resource_group).with_endpoint(&args.nrp_endpoint);
    let nrp = ArmClient::from_config(arm, &credential).context("creating the NRP client")?;
    let config = args.worker_config();
    tracing::info!(
        server = %config.server,
        worker_id = %config.worker_id,
        capacity = config.capacity,
        nrp_endpoint = %args.nrp_endpoint,
        credential = credential.kind(),
        "starting clb-sync-worker"
    );
    run(config, Arc::new(nrp), shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}
