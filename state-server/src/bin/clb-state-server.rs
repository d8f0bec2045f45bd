//! `clb-state-server`: parses flags, wires the state server, its gRPC API and its metrics endpoint,
//! and runs until SIGINT or SIGTERM.

use anyhow::Context as _;
use clb_state_server::config::Args;
use clb_state_server::metrics::{router_with_readiness, serve_router};
use clb_state_server::state::StateServer;
use clb_state_server::{grpc, telemetry};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let args = Args::parse_and_validate();
    // Read and check the TLS files before anything else starts: a bad file is an error naming the
    // flag and the file (its message holds the cause, so no "Caused by" repeats it), exit status 1.
    let tls = args.server_tls().map_err(|e| anyhow::anyhow!("{e}"))?;
    let _telemetry = telemetry::init("clb-state-server")?;

    let config = args.to_server_config();
    tracing::info!(server_id = %config.server_id, gateways = ?config.gateways, "starting");
    // Caller checks (docs/security.md): a Kubernetes client for TokenReview/SubjectAccessReview.
    let auth_config = args.auth_config();
    if args.unchecked_callers() && !args.listen.ip().is_loopback() {
        tracing::warn!(
            listen = %args.listen,
            authentication = ?args.authentication,
            authorization = ?args.authorization,
            "--insecure-allow-unauthenticated: callers are not checked on a non-loopback address; \
             anyone who reaches it can change every gateway"
        );
    }
    let auth = if auth_config.needs_kubernetes() {
        let client = kube::Client::try_default().await.context(
            "--authentication/--authorization=kubernetes: connecting to the Kubernetes API",
        )?;
        Some(
            clb_state_server::auth::Auth::new(auth_config, Some(client))
                .map_err(anyhow::Error::msg)?,
        )
    } else {
        None
    };
    let state = StateServer::new(config);
    let metrics = state.metrics().clone();

    let grpc_listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding the gRPC listener on {}", args.listen))?;
    let metrics_listener = TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("binding the metrics listener on {}", args.metrics_listen))?;
    tracing::info!(
        grpc = ?grpc_listener.local_addr().ok(),
        grpc_tls = tls.is_some(),
        mutual_tls = args.tls_client_ca.is_some(),
        metrics = ?metrics_listener.local_addr().ok(),
        "listening"
    );

    // Cancelled by SIGINT/SIGTERM, or when either server stops, so the other stops too.
    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            clb_state_server::telemetry::shutdown_signal().await;
            tracing::info!("shutting down");
            stop.cancel();
        }
    });

    let refresh = {
        let (metrics, state) = (metrics.clone(), state.clone());
        move || metrics.refresh_from(&state)
    };
    let grpc = async {
        let r = grpc::serve_with(
            grpc_listener,
            state.clone(),
            grpc::ServeOptions { tls, auth },
            stop.clone().cancelled_owned(),
        )
        .await;
        stop.cancel();
        r
    };
    // Active/standby: a standby serves nothing but health and metrics until it holds the Lease.
    let election = if args.leader_elect {
        let client = kube::Client::try_default()
            .await
            .context("--leader-elect: connecting to the Kubernetes API")?;
        let config = args.election_config(client.default_namespace());
        config.validate()?;
        let api = kube::Api::namespaced(client, &config.namespace);
        Some(tokio::spawn(clb_state_server::leader::run(
            api,
            config,
            state.clone(),
            stop.clone().cancelled_owned(),
        )))
    } else {
        None
    };
    let router = {
        let state = state.clone();
        router_with_readiness(metrics.clone(), refresh, move || state.is_leader())
    };
    let http = async {
        let r = serve_router(metrics_listener, router, stop.clone().cancelled_owned()).await;
        stop.cancel();
        r
    };
    let (grpc_result, metrics_result) = tokio::join!(grpc, http);
    if let Some(election) = election {
        // On shutdown the leader steps down and releases the Lease (bounded by the retry period).
        let _ = election.await;
    }
    grpc_result.context("gRPC server")?;
    metrics_result.context("metrics server")?;
    Ok(())
}
