//! `clb-watcher`: the kube watcher (cluster mode) or, with `--node NAME`, the node agent of one
//! node. Watches the Kubernetes API and writes the desired state to the clb state server
//! (docs/watcher.md).

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use clb_client::client::{ConnectOptions, TlsOptions};
use clb_client::watcher::{self, DEFAULT_CLASS, FINALIZER, Mode, WatcherConfig};

/// Watch Services, EndpointSlices, Pods and Nodes; write clb's desired state.
#[derive(Debug, Parser)]
#[command(name = "clb-watcher", version)]
struct Args {
    /// The state server's URL (`https://` with TLS).
    #[arg(long, env = "CLB_SERVER", default_value = "http://127.0.0.1:50051")]
    server: String,
    /// The gateway to write to; empty is the server's default gateway.
    #[arg(long, env = "CLB_GATEWAY", default_value = "")]
    gateway: String,
    /// Run as the node agent of this node: report only the egress pods on it (source
    /// `node-agent/NAME`). In a DaemonSet: `--node=$(NODE_NAME)` from the downward API.
    #[arg(long, env = "CLB_NODE")]
    node: Option<String>,
    /// Cluster mode: also report egress-labelled pods. Set to false when node agents run.
    #[arg(long, env = "CLB_PODS", default_value_t = true, action = clap::ArgAction::Set)]
    pods: bool,
    /// The same as `--pods=false`.
    #[arg(long, conflicts_with = "pods")]
    no_pods: bool,
    /// The `spec.loadBalancerClass` served.
    #[arg(long, env = "CLB_LOAD_BALANCER_CLASS", default_value = DEFAULT_CLASS)]
    class: String,
    /// Whether LoadBalancer Services without a `loadBalancerClass` are served.
    #[arg(long, env = "CLB_CLAIM_UNCLASSED", default_value_t = true, action = clap::ArgAction::Set)]
    claim_unclassed: bool,
    /// Cluster mode: add the finalizer and write `status.loadBalancer.ingress` back.
    #[arg(long, env = "CLB_WRITE_BACK", default_value_t = true, action = clap::ArgAction::Set)]
    write_back: bool,
    /// The finalizer put on the Services programmed.
    #[arg(long, env = "CLB_FINALIZER", default_value = FINALIZER)]
    finalizer: String,
    /// How long updates are collected before one batch is sent, in milliseconds.
    #[arg(long, env = "CLB_COALESCE_MS", default_value_t = 50)]
    coalesce_ms: u64,
    /// How often the write-back polls the state server, in milliseconds.
    #[arg(long, env = "CLB_POLL_MS", default_value_t = 1_000)]
    poll_ms: u64,
    /// PEM file of the CA that signs the state server's certificate.
    #[arg(long, env = "CLB_TLS_CA")]
    tls_ca: Option<std::path::PathBuf>,
    /// PEM certificate and key files of this client, for mutual TLS.
    #[arg(long, env = "CLB_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The key of `--tls-cert`.
    #[arg(long, env = "CLB_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
}

impl Args {
    fn config(&self) -> anyhow::Result<WatcherConfig> {
        let mut server = ConnectOptions::new(&self.server);
        server.gateway = self.gateway.clone();
        if self.server.starts_with("https://") || self.tls_ca.is_some() {
            let read = |p: &std::path::PathBuf| {
                std::fs::read(p).with_context(|| format!("reading {}", p.display()))
            };
            server.tls = Some(TlsOptions {
                ca_pem: self.tls_ca.as_ref().map(read).transpose()?,
                domain: None,
                identity: match (&self.tls_cert, &self.tls_key) {
                    (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
                    _ => None,
                },
            });
        }
        let mode = match &self.node {
            Some(node) if !node.trim().is_empty() => Mode::NodeAgent {
                node: node.trim().to_owned(),
            },
            Some(_) => anyhow::bail!("--node is empty"),
            None => Mode::Cluster {
                pods: self.pods && !self.no_pods,
            },
        };
        let mut c = WatcherConfig::new(server, mode);
        c.class = self.class.clone();
        c.claim_unclassed = self.claim_unclassed;
        c.write_back = self.write_back;
        c.finalizer = self.finalizer.clone();
        c.coalesce = Duration::from_millis(self.coalesce_ms);
        c.poll_interval = Duration::from_millis(self.poll_ms.max(1));
        Ok(c)
    }
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
    let _telemetry = clb_state_server::telemetry::init("clb-watcher")?;
    let args = Args::parse();
    let config = args.config()?;
    // In-cluster service account, or the kubeconfig (KUBECONFIG / ~/.kube/config).
    let kube = kube::Client::try_default()
        .await
        .context("creating the Kubernetes client (in-cluster or kubeconfig)")?;
    watcher::run(config, kube, shutdown_signal()).await?;
    Ok(())
}
