//! Node binding needs a pod-bound token that names the node (docs/security.md, "Node binding"):
//! a node agent (`write-node` only) whose token names no node is refused, and the refusal says
//! what is needed — a projected ServiceAccount token of the agent's pod, from Kubernetes 1.30 or
//! later. Against the fake Kubernetes API; loopback and port 0 only.

use clb_client::client::{Client, ConnectOptions, scope};
use clb_client::updates::pod_add;
use clb_state_server::auth::{
    Auth, AuthConfig, MIN_NODE_BINDING_VERSION, Mode, NODE_NAME_EXTRA, review_client,
};
use clb_state_server::grpc::ServeOptions;
use clb_state_server::state::ServerConfig;
use clb_tests::ServerProc;
use clb_tests::fake_kube::{FakeApi, TokenUser};
use tonic::Code;

#[tokio::test]
async fn a_node_agent_whose_token_names_no_node_is_told_what_it_needs() {
    clb_tests::init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let api = FakeApi::start().await;
    // A token of the node agent's ServiceAccount that is not bound to a pod: no node in its extra.
    api.add_token(
        "t-unbound",
        TokenUser::service_account("clb-system", "clb-node-agent", None, "clb"),
    );
    // deploy/'s roles and bindings: the node agent's ServiceAccount has write-node.
    api.load_rbac(&clb_tests::deploy::Rendered::load(&[]));
    let auth = Auth::new(
        AuthConfig {
            authentication: Mode::Kubernetes,
            authorization: Mode::Kubernetes,
            ..AuthConfig::default()
        },
        Some(review_client(api.kube_config()).expect("client")),
    )
    .expect("auth");
    let server = ServerProc::start_with(
        ServerConfig::default(),
        ServeOptions {
            tls: None,
            auth: Some(auth),
        },
    )
    .await;
    let dir = std::env::temp_dir().join(format!(
        "clb-auth-node-binding-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let token = dir.join("token");
    std::fs::write(&token, "t-unbound").expect("token file");
    let mut options = ConnectOptions::new(server.url());
    options.token_file = Some(token);
    let client = Client::connect(options).await.expect("connect");
    let mut writer = client.writer("node-agent/node-a");
    let refusals = [
        writer
            .apply(vec![pod_add("10.244.0.5", "10.0.0.1", "eg", "ns/p", "")])
            .await
            .map(|_| ()),
        writer
            .resync(scope::pods_at("10.0.0.1"), vec![])
            .await
            .map(|_| ()),
    ];
    for r in refusals {
        let e = r.expect_err("refused");
        let s = e.status().expect("a status");
        assert_eq!(s.code(), Code::PermissionDenied, "{}", s.message());
        let m = s.message();
        for needed in [
            "its token names no node",
            NODE_NAME_EXTRA,
            "projected ServiceAccount token bound to the node agent's pod",
            &format!("Kubernetes {MIN_NODE_BINDING_VERSION} or later"),
            "ServiceAccountTokenPodNodeInfo",
        ] {
            assert!(m.contains(needed), "{needed:?} not in {m}");
        }
    }
    assert_eq!(MIN_NODE_BINDING_VERSION, "1.30");
    let _ = std::fs::remove_dir_all(&dir);
}
