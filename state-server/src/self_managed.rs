//! `--tls-self-managed`: the state server keeps its own CA and serving certificate in a Secret
//! (`--tls-secret`) and publishes the CA bundle clients trust in a ConfigMap (`--tls-ca-bundle`,
//! key `ca.crt`), both in its own namespace. What is issued and when: [`crate::pki`].
//!
//! Every replica runs [`SelfManaged::run`]: it reads the Secret, creates it when it is missing,
//! renews what is due, makes the ConfigMap hold the bundle of the Secret, and presents the Secret's
//! certificate. Writes carry the `resourceVersion` they were decided on: when the other replica
//! wrote first, the API answers `409 Conflict` and the replica reads again (and finds the work
//! done). Each replica watches the Secret, so a certificate another replica issued (or an operator
//! replaced) is presented within moments, without a restart; open connections keep theirs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::WatchStreamExt as _;
use kube::{Api, Client};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::pki::{self, Lifetimes, Material, Plan};
use crate::tls_listener::ServingCertificate;
use clb_telemetry::flags::{format_duration, parse_duration};

/// Flags of the self-managed certificate (flattened into [`crate::config::Args`]).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct SelfManagedArgs {
    /// Serve TLS with a CA and certificate the server makes and renews itself, kept in the Secret
    /// --tls-secret, the CA bundle published in the ConfigMap --tls-ca-bundle for clients
    /// (needs a Kubernetes client; not with --tls-cert). docs/security.md.
    #[arg(
        long,
        env = "CLB_TLS_SELF_MANAGED",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        conflicts_with_all = ["tls_cert", "tls_key"]
    )]
    pub tls_self_managed: bool,

    /// The Secret (in the server's namespace) that holds the self-managed CA and certificate.
    #[arg(
        long,
        env = "CLB_TLS_SECRET",
        default_value = "clb-state-server-tls",
        value_name = "NAME"
    )]
    pub tls_secret: String,

    /// The ConfigMap (in the server's namespace) the self-managed CA bundle is published in (key
    /// ca.crt), for clients to mount.
    #[arg(
        long,
        env = "CLB_TLS_CA_BUNDLE",
        default_value = "clb-ca-bundle",
        value_name = "NAME"
    )]
    pub tls_ca_bundle: String,

    /// The Service clients reach the server by: the self-managed certificate names NAME,
    /// `NAME.<namespace>`, `NAME.<namespace>.svc` and `NAME.<namespace>.svc.cluster.local`.
    #[arg(
        long,
        env = "CLB_TLS_SERVICE",
        default_value = "clb-state-server",
        value_name = "NAME"
    )]
    pub tls_service: String,

    /// More DNS names or IP addresses the self-managed certificate names (comma-separated).
    #[arg(
        long,
        env = "CLB_TLS_EXTRA_NAMES",
        value_delimiter = ',',
        value_name = "NAME"
    )]
    pub tls_extra_names: Vec<String>,

    /// Lifetime of a self-managed CA; a new one is made at 2/3 of it.
    #[arg(long, env = "CLB_TLS_CA_VALIDITY", default_value = "3650d", value_name = "DURATION", value_parser = parse_duration)]
    pub tls_ca_validity: Duration,

    /// Lifetime of a self-managed serving certificate (at most the CA's rest); renewed at 2/3 of
    /// it.
    #[arg(long, env = "CLB_TLS_SERVING_VALIDITY", default_value = "365d", value_name = "DURATION", value_parser = parse_duration)]
    pub tls_serving_validity: Duration,
}

/// The shortest lifetime accepted for either.
pub const MIN_VALIDITY: Duration = Duration::from_secs(60);

/// Longest wait between two looks at the Secret (a missed watch event is caught up this late).
const RECHECK: Duration = Duration::from_secs(10 * 60);

impl SelfManagedArgs {
    /// Checks the flags: an error names the flag, the value and why.
    pub fn validate(&self) -> Result<(), String> {
        if !self.tls_self_managed {
            return Ok(());
        }
        for (flag, value) in [
            ("tls-secret", &self.tls_secret),
            ("tls-ca-bundle", &self.tls_ca_bundle),
            ("tls-service", &self.tls_service),
        ] {
            if value.trim().is_empty() {
                return Err(format!("--{flag} must not be empty"));
            }
        }
        for (flag, value) in [
            ("tls-ca-validity", self.tls_ca_validity),
            ("tls-serving-validity", self.tls_serving_validity),
        ] {
            if value < MIN_VALIDITY {
                return Err(format!(
                    "--{flag} {}: too short, at least {}",
                    days(value),
                    days(MIN_VALIDITY)
                ));
            }
        }
        if self.tls_serving_validity > self.tls_ca_validity {
            return Err(format!(
                "--tls-serving-validity {} is longer than --tls-ca-validity {}: a certificate never \
                 outlives its CA",
                days(self.tls_serving_validity),
                days(self.tls_ca_validity)
            ));
        }
        if let Some(bad) = self.tls_extra_names.iter().find(|n| {
            n.parse::<std::net::IpAddr>().is_err()
                && (n.is_empty()
                    || !n
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '*'))
        }) {
            return Err(format!(
                "--tls-extra-names {bad:?}: neither a DNS name nor an IP address"
            ));
        }
        Ok(())
    }

    /// The lifetimes the flags say.
    pub fn lifetimes(&self) -> Lifetimes {
        Lifetimes {
            ca: self.tls_ca_validity,
            serving: self.tls_serving_validity,
        }
    }
}

/// A lifetime as the flags' defaults write it: whole days as `365d`, else as the other duration
/// flags print (humantime's months would make a year `11months 30days 3h 50m 24s`).
fn days(d: Duration) -> String {
    const DAY: u64 = 86_400;
    match d.as_secs() {
        s if s >= DAY && s % DAY == 0 && d.subsec_nanos() == 0 => format!("{}d", s / DAY),
        _ => format_duration(d),
    }
}

/// Why a look at the Secret failed (it is retried).
#[derive(Debug, thiserror::Error)]
pub enum SelfManagedError {
    /// The Kubernetes API refused or could not be reached.
    #[error("{what} {namespace}/{name}: {source}")]
    Kube {
        /// What was done, e.g. `reading the Secret`.
        what: &'static str,
        /// The namespace.
        namespace: String,
        /// The object's name.
        name: String,
        /// The API's answer.
        #[source]
        source: Box<kube::Error>,
    },
    /// A certificate could not be made.
    #[error(transparent)]
    Issue(#[from] pki::IssueError),
    /// The Secret's certificate does not load into rustls.
    #[error("the certificate of Secret {0} does not load: {1}")]
    Unusable(String, String),
    /// Others kept writing first.
    #[error("{0} kept changing under this replica's writes (409 Conflict each time)")]
    Contended(String),
}

/// The self-managed certificate of one replica.
#[derive(Debug, Clone)]
pub struct SelfManaged {
    secrets: Api<Secret>,
    config_maps: Api<ConfigMap>,
    namespace: String,
    secret: String,
    bundle: String,
    names: Vec<String>,
    lifetimes: Lifetimes,
    certificate: Arc<ServingCertificate>,
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "clb-state-server".into()),
        ("app.kubernetes.io/part-of".into(), "clb".into()),
    ])
}

/// What a write ended in.
enum Wrote {
    Done,
    /// Someone else wrote first: read again.
    Conflict,
}

impl SelfManaged {
    /// For the flags `args`, in the namespace of `client` (the server's own in a pod), presenting
    /// through `certificate`.
    pub fn new(
        args: &SelfManagedArgs,
        client: Client,
        certificate: Arc<ServingCertificate>,
    ) -> Self {
        let namespace = client.default_namespace().to_owned();
        Self {
            secrets: Api::namespaced(client.clone(), &namespace),
            config_maps: Api::namespaced(client, &namespace),
            names: pki::service_names(args.tls_service.trim(), &namespace, &args.tls_extra_names),
            namespace,
            secret: args.tls_secret.trim().to_owned(),
            bundle: args.tls_ca_bundle.trim().to_owned(),
            lifetimes: args.lifetimes(),
            certificate,
        }
    }

    /// The names the serving certificate holds.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    fn kube(&self, what: &'static str, name: &str) -> impl FnOnce(kube::Error) -> SelfManagedError {
        let (namespace, name) = (self.namespace.clone(), name.to_owned());
        move |source| SelfManagedError::Kube {
            what,
            namespace,
            name,
            source: Box::new(source),
        }
    }

    /// Keeps the certificate issued, renewed, published and presented until `stop`: looks again
    /// when the Secret changes, when something is due, or every 10 minutes; a failure is logged
    /// and retried with a growing delay (1 s to 30 s).
    pub async fn run(self, stop: CancellationToken) {
        let wake = Arc::new(Notify::new());
        let watch = {
            let (wake, secrets) = (wake.clone(), self.secrets.clone());
            let config = kube::runtime::watcher::Config::default()
                .fields(&format!("metadata.name={}", self.secret));
            tokio::spawn(async move {
                let mut events = kube::runtime::watcher(secrets, config)
                    .default_backoff()
                    .boxed();
                while let Some(event) = events.next().await {
                    match event {
                        Ok(_) => wake.notify_one(),
                        Err(e) => tracing::debug!(error = %e, "watching the TLS Secret"),
                    }
                }
            })
        };
        let mut failures = 0u32;
        loop {
            let wait = match self.reconcile().await {
                Ok(wait) => {
                    failures = 0;
                    wait.min(RECHECK)
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    tracing::warn!(error = %e, "self-managed TLS certificate: retrying");
                    Duration::from_secs(1 << failures.min(5)).min(Duration::from_secs(30))
                }
            };
            tokio::select! {
                () = wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
                () = stop.cancelled() => break,
            }
        }
        watch.abort();
    }

    /// One look: makes the Secret right, the bundle right, presents the certificate; returns how
    /// long until something is due.
    pub async fn reconcile(&self) -> Result<Duration, SelfManagedError> {
        for _ in 0..10 {
            let now = SystemTime::now();
            let current = self
                .secrets
                .get_opt(&self.secret)
                .await
                .map_err(self.kube("reading the Secret", &self.secret))?;
            let material = match &current {
                None => Err("the Secret does not exist".to_owned()),
                Some(s) => {
                    let data = s.data.clone().unwrap_or_default();
                    Material::from_data(&data.into_iter().map(|(k, v)| (k, v.0)).collect())
                }
            };
            let inspected = material
                .as_ref()
                .map_err(Clone::clone)
                .and_then(pki::inspect);
            let plan = pki::plan(&inspected, &self.names, now);
            let Some(new) = pki::execute(
                &plan,
                material.as_ref().ok(),
                &self.names,
                self.lifetimes,
                now,
            )?
            else {
                let Plan::Keep { until } = plan else {
                    unreachable!("only Keep issues nothing")
                };
                let material = material.expect("a kept Secret was read");
                if let Wrote::Conflict = self.publish(&material.bundle(now)).await? {
                    continue;
                }
                self.present(&material)?;
                return Ok(until.duration_since(SystemTime::now()).unwrap_or_default());
            };
            match self.write(current, &new).await? {
                Wrote::Done => match &plan {
                    Plan::RotateCa { reason } => {
                        tracing::info!(secret = %self.secret, %reason, "issued a new CA and serving certificate")
                    }
                    Plan::RenewServing { reason } => {
                        tracing::info!(secret = %self.secret, %reason, "renewed the serving certificate")
                    }
                    Plan::DropPrevious => {
                        tracing::info!(secret = %self.secret, "dropped the expired previous CA")
                    }
                    Plan::Keep { .. } => {}
                },
                Wrote::Conflict => {
                    tracing::debug!(secret = %self.secret, "another replica wrote the Secret first")
                }
            }
        }
        Err(SelfManagedError::Contended(format!(
            "Secret {}/{}",
            self.namespace, self.secret
        )))
    }

    async fn write(
        &self,
        current: Option<Secret>,
        new: &Material,
    ) -> Result<Wrote, SelfManagedError> {
        let data = new
            .to_data()
            .into_iter()
            .map(|(k, v)| (k, ByteString(v)))
            .collect();
        let result = match current {
            None => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(self.secret.clone()),
                        namespace: Some(self.namespace.clone()),
                        labels: Some(labels()),
                        ..ObjectMeta::default()
                    },
                    type_: Some("kubernetes.io/tls".into()),
                    data: Some(data),
                    ..Secret::default()
                };
                self.secrets.create(&PostParams::default(), &secret).await
            }
            Some(mut secret) => {
                // Replaced with the resourceVersion it was read at: 409 if another wrote since.
                secret.data = Some(data);
                self.secrets
                    .replace(&self.secret, &PostParams::default(), &secret)
                    .await
            }
        };
        match result {
            Ok(_) => Ok(Wrote::Done),
            Err(e) if conflict(&e) => Ok(Wrote::Conflict),
            Err(e) => Err(self.kube("writing the Secret", &self.secret)(e)),
        }
    }

    /// Makes the ConfigMap hold `bundle`.
    async fn publish(&self, bundle: &str) -> Result<Wrote, SelfManagedError> {
        let current = self
            .config_maps
            .get_opt(&self.bundle)
            .await
            .map_err(self.kube("reading the ConfigMap", &self.bundle))?;
        let data = BTreeMap::from([(pki::keys::BUNDLE.to_owned(), bundle.to_owned())]);
        let result = match current {
            Some(cm) if cm.data.as_ref() == Some(&data) => return Ok(Wrote::Done),
            Some(mut cm) => {
                cm.data = Some(data);
                self.config_maps
                    .replace(&self.bundle, &PostParams::default(), &cm)
                    .await
            }
            None => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(self.bundle.clone()),
                        namespace: Some(self.namespace.clone()),
                        labels: Some(labels()),
                        ..ObjectMeta::default()
                    },
                    data: Some(data),
                    ..ConfigMap::default()
                };
                self.config_maps.create(&PostParams::default(), &cm).await
            }
        };
        match result {
            Ok(_) => {
                tracing::info!(config_map = %self.bundle, "published the CA bundle");
                Ok(Wrote::Done)
            }
            Err(e) if conflict(&e) => Ok(Wrote::Conflict),
            Err(e) => Err(self.kube("writing the ConfigMap", &self.bundle)(e)),
        }
    }

    /// Presents the Secret's certificate, if it is not the one presented already.
    fn present(&self, material: &Material) -> Result<(), SelfManagedError> {
        let unusable = |e: String| SelfManagedError::Unusable(self.secret.clone(), e);
        let (chain, key) = material.serving().map_err(unusable)?;
        if self.certificate.chain().as_ref() == Some(&chain) {
            return Ok(());
        }
        let key = rustls::sign::CertifiedKey::from_der(
            chain,
            key,
            &rustls::crypto::aws_lc_rs::default_provider(),
        )
        .map_err(|e| unusable(e.to_string()))?;
        self.certificate.set(key);
        tracing::info!(secret = %self.secret, names = ?self.names, "presenting the serving certificate");
        Ok(())
    }
}
