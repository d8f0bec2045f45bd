//! A state server with authentication and authorization on, as deploy/ runs it
//! (`--authentication=kubernetes --authorization=kubernetes`), its TokenReviews and
//! SubjectAccessReviews answered by the fake Kubernetes API ([`crate::fake_kube`]): for the
//! benchmarks that compare the system with and without the checks.

use std::path::PathBuf;

use clb_embedded::harness::HarnessAuth;
use clb_state_server::auth::{API_GROUP, Auth, AuthConfig, DEFAULT_AUDIENCE, Mode, RESOURCE};

use crate::fake_kube::{FakeApi, TokenUser};

/// Namespace of the project's ServiceAccounts (deploy/).
pub const NAMESPACE: &str = "clb-system";

/// The fake API, and the [`HarnessAuth`] of a harness whose writers and Admin readers are the
/// watcher's ServiceAccount (`write` and `get` on every gateway) and whose workers are the sync
/// worker's (`work`).
pub struct AuthOn {
    /// The fake API answering the reviews (its review counters show how many the server made).
    pub api: FakeApi,
    /// What the harness needs.
    pub harness: HarnessAuth,
    dir: PathBuf,
}

impl AuthOn {
    /// Starts the fake API with the two identities and writes their token files to a new
    /// temporary directory.
    pub async fn start() -> Self {
        let api = FakeApi::start().await;
        let resource = format!("{API_GROUP}/{RESOURCE}");
        let sa = |name: &str| format!("system:serviceaccount:{NAMESPACE}:{name}");
        let identities = [
            ("t-watcher", "clb-watcher", &["write", "get"][..]),
            ("t-worker", "clb-sync-worker", &["work"][..]),
        ];
        for (token, account, verbs) in identities {
            api.add_token(
                token,
                TokenUser::service_account(NAMESPACE, account, Some("node-w"), DEFAULT_AUDIENCE),
            );
            for verb in verbs {
                api.grant(&sa(account), verb, &resource, "*");
            }
        }
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
            client_token: file("t-watcher"),
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
