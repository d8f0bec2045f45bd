//! Command-line flags of `clb-watcher`, each with a `CLB_*` environment fallback (in the library so
//! that the deployment manifests can be checked against them), and what the binary runs with them
//! ([`bind`], [`run`]): a test runs exactly what `main` runs, with its own Kubernetes API and
//! shutdown.

use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use crate::config::{Mode, WatcherConfig};
use crate::translate::{DEFAULT_CLASS, FINALIZER};
use clb_client::client::{ConnectOptions, TlsOptions};
use clb_telemetry::flags::parse_duration;

/// Watch Services, EndpointSlices, Pods and Nodes; write clb's desired state.
#[derive(Debug, Parser)]
#[command(name = "clb-watcher", version)]
pub struct Args {
    /// The state server's URL (`https://` with TLS).
    #[arg(long, env = "CLB_SERVER", default_value = "http://127.0.0.1:50051")]
    pub server: String,
    /// The gateway to write to; empty is the server's default gateway.
    #[arg(long, env = "CLB_GATEWAY", default_value = "")]
    pub gateway: String,
    /// The gateways file (YAML, shared with the state server and the workers): several gateways,
    /// one per node pool or region. Each endpoint and pod goes to the gateway of its node, each
    /// Service to the gateways its annotations select (`service.openyurt.io/nodepool-labelselector`,
    /// `clb.azure.com/gateways`; default: the file's default gateway). Excludes `--gateway`.
    #[arg(long, env = "CLB_GATEWAYS_FILE", value_name = "FILE")]
    pub gateways_file: Option<std::path::PathBuf>,
    /// With `--gateways-file`: a node moved to another gateway leaves the old one once the new one
    /// has programmed its addresses, or after this long.
    #[arg(long, env = "CLB_NODE_MOVE_BOUND", default_value = "30s", value_name = "DURATION", value_parser = parse_duration)]
    pub node_move_bound: Duration,
    /// With `--gateways-file` (cluster mode, write-back on): create one OpenYurt PoolService
    /// (`network.openyurt.io/v1alpha1`) per Service and selected pool, program PoolServices of our
    /// class that others created at their pool's gateway, and write every one's status. Needs the
    /// PoolService CRD (deploy/components/poolservice).
    #[arg(long, env = "CLB_POOL_SERVICES", default_value_t = false, action = clap::ArgAction::Set)]
    pub pool_services: bool,
    /// Cluster mode: drive the pod readiness gate `clb.azure.com/programmed` of the pods labelled
    /// `clb.azure.com/readiness-gate=true` (docs/readiness-gate.md; needs `patch` on
    /// `pods/status`, granted by deploy/components/readiness-gate).
    #[arg(long, env = "CLB_READINESS_GATE", default_value_t = false, action = clap::ArgAction::Set)]
    pub readiness_gate: bool,
    /// A gated pod not programmed within this long gets its gate True anyway (reason Timeout, a
    /// Warning Event), e.g. `10m`, `90s`.
    #[arg(long, env = "CLB_READINESS_GATE_TIMEOUT", default_value = "10m", value_name = "DURATION", value_parser = parse_duration)]
    pub readiness_gate_timeout: Duration,
    /// Run as the node agent of this node: report only the egress pods on it (writer
    /// `node-agent/NAME`). In a DaemonSet: `--node=$(NODE_NAME)` from the downward API.
    #[arg(long, env = "CLB_NODE")]
    pub node: Option<String>,
    /// Cluster mode: also report egress-labelled pods. Set to false when node agents run.
    #[arg(long, env = "CLB_PODS", default_value_t = true, action = clap::ArgAction::Set)]
    pub pods: bool,
    /// The same as `--pods=false`.
    #[arg(long, conflicts_with = "pods")]
    pub no_pods: bool,
    /// The `spec.loadBalancerClass` served.
    #[arg(long, env = "CLB_LOAD_BALANCER_CLASS", default_value = DEFAULT_CLASS)]
    pub class: String,
    /// Whether LoadBalancer Services without a `loadBalancerClass` are served.
    #[arg(long, env = "CLB_CLAIM_UNCLASSED", default_value_t = true, action = clap::ArgAction::Set)]
    pub claim_unclassed: bool,
    /// Cluster mode: add the finalizer and write `status.loadBalancer.ingress` back.
    #[arg(long, env = "CLB_WRITE_BACK", default_value_t = true, action = clap::ArgAction::Set)]
    pub write_back: bool,
    /// The finalizer put on the Services programmed.
    #[arg(long, env = "CLB_FINALIZER", default_value = FINALIZER)]
    pub finalizer: String,
    /// How long updates are collected before one batch is sent.
    #[arg(long, env = "CLB_COALESCE", default_value = "50ms", value_name = "DURATION", value_parser = parse_duration)]
    pub coalesce: Duration,
    /// Largest delay before a failed watch is re-opened: a change made as the API server comes
    /// back after an outage is seen within about this long.
    #[arg(long, env = "CLB_WATCH_BACKOFF_MAX", default_value = "1s", value_name = "DURATION", value_parser = parse_duration)]
    pub watch_backoff_max: Duration,
    /// PEM file of the CA bundle that signs the state server's certificate (turns TLS on); re-read
    /// when it changes (the mounted ConfigMap clb-ca-bundle during a CA rotation).
    #[arg(long, env = "CLB_TLS_CA")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Send the bearer token over a plaintext (http://) connection to a host that is not loopback
    /// (refused otherwise: the token would cross the network in clear).
    #[arg(long, env = "CLB_INSECURE_PLAINTEXT", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub insecure_plaintext: bool,
    /// PEM certificate and key files of this client, for mutual TLS.
    #[arg(long, env = "CLB_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The key of `--tls-cert`.
    #[arg(long, env = "CLB_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// File of the bearer token sent with every call (the projected ServiceAccount token with the
    /// audience `clb`), re-read when the kubelet rotates it. Default:
    /// /var/run/secrets/clb/token if it exists, else no token.
    #[arg(long, env = "CLB_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// Address of the HTTP endpoint serving /metrics, /healthz and /readyz (ready once every watch
    /// has listed and the state server acknowledged the first resync), e.g. 0.0.0.0:9090. Off when
    /// not given.
    #[arg(long, env = "CLB_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
}

impl Args {
    /// The watcher configuration the flags describe (reads the TLS files).
    pub fn config(&self) -> anyhow::Result<WatcherConfig> {
        let mut server = ConnectOptions::new(&self.server);
        server.gateway = self.gateway.clone();
        server.token_file = clb_client::token::token_file_or_default(self.token_file.as_deref());
        server.insecure_plaintext = self.insecure_plaintext;
        // A token in clear over the network: refused at start, not at each reconnection.
        clb_client::tls::check_plaintext(
            &self.server,
            self.server.to_ascii_lowercase().starts_with("https://") || self.tls_ca.is_some(),
            server.token_file.as_deref(),
            self.insecure_plaintext,
        )
        .map_err(anyhow::Error::msg)?;
        if self.server.starts_with("https://") || self.tls_ca.is_some() {
            let read = |p: &std::path::PathBuf| {
                std::fs::read(p).with_context(|| format!("reading {}", p.display()))
            };
            server.tls = Some(TlsOptions {
                ca: self.tls_ca.clone().map(clb_client::tls::CaBundle::File),
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
        let gateways = match &self.gateways_file {
            None => None,
            Some(path) => {
                if !self.gateway.is_empty() {
                    anyhow::bail!(
                        "--gateway = {:?} and --gateways-file are exclusive: with a gateways file \
                         each object goes to the gateway of its node",
                        self.gateway
                    );
                }
                let g = clb_gateways::Gateways::load(path)
                    .with_context(|| format!("--gateways-file {}", path.display()))?;
                Some(std::sync::Arc::new(g))
            }
        };
        let mut c = WatcherConfig::new(server, mode);
        c.gateways = gateways;
        c.move_bound = self.node_move_bound;
        if self.pool_services && c.gateways.is_none() {
            anyhow::bail!(
                "--pool-services = true needs --gateways-file: PoolServices name node pools"
            );
        }
        c.pool_services = self.pool_services;
        c.readiness_gate = self.readiness_gate;
        c.readiness_gate_timeout = self.readiness_gate_timeout;
        c.class = self.class.clone();
        c.claim_unclassed = self.claim_unclassed;
        c.write_back = self.write_back;
        c.finalizer = self.finalizer.clone();
        let ms = Duration::from_millis(1);
        c.coalesce = self.coalesce;
        c.watch_backoff_max = self.watch_backoff_max.max(ms);
        Ok(c)
    }
}

/// A watcher configured from its flags, its metrics endpoint (if any) bound; [`Bound::serve`] runs
/// it.
#[derive(Debug)]
pub struct Bound {
    config: WatcherConfig,
    kube: crate::run::KubeClients,
    metrics_listener: Option<tokio::net::TcpListener>,
    metrics_addr: Option<std::net::SocketAddr>,
}

/// Binds the metrics endpoint at `metrics_listen` (`--metrics-listen`; `None`: none) of a watcher
/// configured with `config` ([`Args::config`]: it reads the TLS and gateways files, so a bad flag or
/// file fails before anything starts). `kube`: in the binary, from the in-cluster ServiceAccount
/// or the kubeconfig ([`crate::KubeClients::from_config`] of `kube::Config::infer`).
pub async fn bind(
    config: WatcherConfig,
    metrics_listen: Option<std::net::SocketAddr>,
    kube: crate::run::KubeClients,
) -> anyhow::Result<Bound> {
    let (metrics_listener, metrics_addr) = match metrics_listen {
        Some(addr) => {
            let listener = clb_telemetry::metrics::bind(addr).await?;
            let local = listener
                .local_addr()
                .context("the metrics listener's address")?;
            (Some(listener), Some(local))
        }
        None => (None, None),
    };
    Ok(Bound {
        config,
        kube,
        metrics_listener,
        metrics_addr,
    })
}

/// What the binary runs: [`Args::config`], [`bind`], then [`Bound::serve`] until `shutdown`
/// completes.
pub async fn run(
    args: &Args,
    kube: crate::run::KubeClients,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    bind(args.config()?, args.metrics_listen, kube)
        .await?
        .serve(shutdown)
        .await
}

impl Bound {
    /// Where `/metrics`, `/healthz` and `/readyz` are served (`None` without `--metrics-listen`).
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_addr
    }

    /// The configuration the flags gave (its `metrics` are the ones served).
    pub fn config(&self) -> &WatcherConfig {
        &self.config
    }

    /// Serves the metrics endpoint and runs the watcher ([`crate::run`]) until `shutdown`
    /// completes (`Ok`) or one of its tasks ends (the [`crate::supervise::WatcherError`], so that the binary
    /// exits non-zero); then the metrics endpoint stops too.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let http = match (self.metrics_listener, self.metrics_addr) {
            (Some(listener), Some(addr)) => {
                tracing::info!(metrics = %addr, "serving /metrics, /healthz and /readyz");
                Some(tokio::spawn(clb_telemetry::metrics::serve(
                    listener,
                    self.config.metrics.router(),
                    async move {
                        let _ = stopped.await;
                    },
                )))
            }
            _ => None,
        };
        let result = crate::run(self.config, self.kube, shutdown).await;
        let _ = stop.send(());
        if let Some(http) = http {
            let _ = http.await;
        }
        Ok(result?)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn a_token_to_a_remote_plaintext_server_refuses_to_start_unless_told() {
        let args = |extra: &[&str]| {
            let mut argv = vec![
                "clb-watcher",
                "--server=http://clb-state-server.clb-system.svc:50051",
                "--token-file=/var/run/secrets/clb/token",
            ];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv).unwrap()
        };
        let e = args(&[]).config().unwrap_err().to_string();
        assert!(e.contains("would cross the network in clear"), "{e}");
        args(&["--insecure-plaintext"]).config().unwrap();
    }

    #[test]
    fn metrics_listen_is_off_by_default_and_checked() {
        let a = Args::try_parse_from(["clb-watcher"]).unwrap();
        assert_eq!(a.metrics_listen, None);
        let a = Args::try_parse_from(["clb-watcher", "--metrics-listen=[::1]:9090"]).unwrap();
        assert_eq!(a.metrics_listen, Some("[::1]:9090".parse().unwrap()));
        let err = Args::try_parse_from(["clb-watcher", "--metrics-listen=localhost"]).unwrap_err();
        assert!(
            err.to_string()
                .contains("invalid value 'localhost' for '--metrics-listen <ADDR>'"),
            "{err}"
        );
    }

    #[test]
    fn durations_need_a_unit() {
        let config = |argv: &[&str]| Args::try_parse_from(argv).unwrap().config().unwrap();
        let c = config(&["clb-watcher"]);
        let d = |ms| Duration::from_millis(ms);
        assert_eq!(
            (c.move_bound, c.coalesce, c.watch_backoff_max),
            (d(30_000), d(50), d(1_000))
        );
        assert_eq!(c.readiness_gate_timeout, Duration::from_secs(600));
        let c = config(&[
            "clb-watcher",
            "--node-move-bound=1m",
            "--coalesce=20ms",
            "--watch-backoff-max=500ms",
            "--readiness-gate-timeout=90s",
        ]);
        assert_eq!(
            (c.move_bound, c.coalesce, c.watch_backoff_max),
            (d(60_000), d(20), d(500))
        );
        assert_eq!(c.readiness_gate_timeout, Duration::from_secs(90));
        let err = Args::try_parse_from(["clb-watcher", "--coalesce=20"]).unwrap_err();
        assert!(err.to_string().contains("\"20\" has no unit"), "{err}");
        // Nothing polls any more: the flag is gone.
        assert!(Args::try_parse_from(["clb-watcher", "--poll=1s"]).is_err());
    }

    #[test]
    fn the_gateways_file_is_read_and_checked() {
        let dir = std::env::temp_dir().join(format!("clb-watcher-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.yaml");
        std::fs::write(
            &good,
            "gateways:\n  - name: a\n    azure: {subscription: s, resourceGroup: r, region: x}\n",
        )
        .unwrap();
        let arg = format!("--gateways-file={}", good.display());
        let c = Args::try_parse_from(["clb-watcher", arg.as_str(), "--pool-services=true"])
            .unwrap()
            .config()
            .unwrap();
        assert_eq!(
            c.gateways.as_ref().map(|g| g.names()),
            Some(vec!["a".to_owned()])
        );
        assert!(c.pool_services);
        assert_eq!(c.lanes().len(), 1);
        assert_eq!(c.lanes()[0].0.server.gateway, "a");
        // Without a file: one lane, to --gateway.
        let c = Args::try_parse_from(["clb-watcher", "--gateway=x"])
            .unwrap()
            .config()
            .unwrap();
        assert_eq!(c.lanes().len(), 1);
        assert_eq!(c.lanes()[0].0.server.gateway, "x");
        assert!(c.lanes()[0].1.gateway.is_none());
        // Refused: both --gateway and a file; PoolServices without a file; a bad file.
        let err = |argv: &[&str]| {
            format!(
                "{:#}",
                Args::try_parse_from(argv).unwrap().config().unwrap_err()
            )
        };
        let e = err(&["clb-watcher", "--gateway=x", arg.as_str()]);
        assert!(e.contains("exclusive"), "{e}");
        let e = err(&["clb-watcher", "--pool-services=true"]);
        assert!(e.contains("needs --gateways-file"), "{e}");
        let bad = dir.join("bad.yaml");
        std::fs::write(&bad, "gateways: []\n").unwrap();
        let bad_arg = format!("--gateways-file={}", bad.display());
        let e = err(&["clb-watcher", bad_arg.as_str()]);
        assert!(e.contains("bad.yaml") && e.contains("at least one"), "{e}");
        let missing = format!("--gateways-file={}", dir.join("missing.yaml").display());
        let e = err(&["clb-watcher", missing.as_str()]);
        assert!(
            e.contains("missing.yaml") && e.contains("cannot read"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
