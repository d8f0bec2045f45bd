//! A state server with authentication and authorization on, as deploy/ runs it
//! (`--authentication=kubernetes --authorization=kubernetes`), its TokenReviews and
//! SubjectAccessReviews answered by the fake Kubernetes API ([`crate::fake_kube`]) from deploy/'s
//! RBAC: for the benchmarks that compare the system with and without the checks.

use std::path::PathBuf;

use clb_embedded::harness::HarnessAuth;
use clb_state_server::auth::{Auth, AuthConfig, DEFAULT_AUDIENCE, Mode};

use crate::deploy::Rendered;
use crate::fake_kube::{FakeApi, TokenUser};
use crate::rbac;

/// Namespace of the project's ServiceAccounts (deploy/).
pub const NAMESPACE: &str = crate::deploy::NAMESPACE;

/// The user of the harness's writers and Admin readers: an operator (a person, not a
/// ServiceAccount of deploy/).
pub const OPERATOR: &str = "clb-operator@example.com";

/// The fake API, and the [`HarnessAuth`] of a harness whose writers and Admin readers are an
/// operator bound (as docs/operations.md tells operators, with `kubectl create
/// clusterrolebinding`) to `clb-writer` and `clb-reader`, and whose workers are the sync worker's
/// ServiceAccount, bound to `clb-worker` by deploy/'s own binding.
pub struct AuthOn {
    /// The fake API answering the reviews (its review counters show how many the server made).
    pub api: FakeApi,
    /// What the harness needs.
    pub harness: HarnessAuth,
    dir: PathBuf,
}

impl AuthOn {
    /// Starts the fake API with deploy/'s RBAC and the operator's bindings, and writes the two
    /// token files to a new temporary directory.
    pub async fn start() -> Self {
        let api = FakeApi::start().await;
        api.load_rbac(&Rendered::load(&[]));
        api.add_token(
            "t-operator",
            TokenUser::user(OPERATOR, &[], DEFAULT_AUDIENCE),
        );
        for role in ["clb-writer", "clb-reader"] {
            api.create_cluster_role_binding(
                &format!("{role}-operator"),
                role,
                rbac::user(OPERATOR),
            );
        }
        api.add_token(
            "t-worker",
            TokenUser::service_account(
                NAMESPACE,
                "clb-sync-worker",
                Some("node-w"),
                DEFAULT_AUDIENCE,
            ),
        );
        let dir = std::env::temp_dir().join(format!(
            "clb-auth-on-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = |token: &str| {
            let path = dir.join(token);
            std::fs::write(&path, format!("{token}\n")).expect("token file");
            path
        };
        let server = Auth::new(
            AuthConfig {
                authentication: Mode::Kubernetes,
                authorization: Mode::Kubernetes,
                ..AuthConfig::default()
            },
            // As the binary makes it (`run::KubeClients`): without kube's retries.
            Some(clb_state_server::auth::review_client(api.kube_config()).expect("kube client")),
        )
        .expect("auth config");
        let harness = HarnessAuth {
            server,
            client_token: file("t-operator"),
            worker_token: file("t-worker"),
        };
        Self { api, harness, dir }
    }
}

impl Drop for AuthOn {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
