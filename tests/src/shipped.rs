//! The shipped system as one: every component is the real binary (`clb-state-server`,
//! `clb-sync-worker`, `clb-watcher`), started as a process with the args and environment of its
//! container in `deploy/` (rendered as kustomize would, [`crate::deploy::Rendered`]), each with its
//! own ServiceAccount tokens, against the fake Kubernetes API ([`crate::fake_kube`]) that enforces
//! `deploy/`'s RBAC on its own requests and answers every SubjectAccessReview by evaluating it, and
//! the NRP emulator as Azure.
//!
//! What is rewritten, and nothing else: addresses (`--listen`, `--metrics-listen` to
//! `127.0.0.1:0`; `--server` to the Service in front of the state servers, its scheme kept;
//! `--nrp-endpoint` to the emulator; the state server's `--tls-extra-names` to that Service's
//! address, which its self-managed certificate must name as it names the Service's DNS names in a
//! cluster), file paths (`--token-file`, `--gateways-file`, paths under the mounts of ConfigMaps
//! and Secrets made at run time, which [`kubelet`] projects from the fake API as the kubelet does,
//! and `KUBECONFIG` standing in for the in-cluster ServiceAccount mount), the downward API's values
//! (pod name, node name), and the sync worker's `--credential` (`none`: Entra ID cannot be reached
//! here; the emulator takes no token).
//!
//! The state servers sit behind [`ServiceProxy`], which routes like the Kubernetes Service
//! `clb-state-server`: to a replica whose `/readyz` answers 200 (the leader), probed every 100 ms.
//! The state servers reach the Kubernetes API through a [`TcpGate`] that can refuse connections
//! (an API server that is down).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clb_client::client::{Client, ConnectOptions, TlsOptions};
use clb_client::tls::CaBundle;
use clb_gateways::Gateways;
use clb_nrp_emulator::{Emulator, EmulatorConfig, RunningEmulator};
use k8s_openapi::api::core::v1::Container;

use crate::PATIENCE;
use crate::deploy::{NAMESPACE, Rendered};
use crate::fake_kube::{API_AUDIENCE, FakeApi, TokenUser};

pub mod kubelet;
mod net;
mod proc;
pub use net::{ServiceProxy, TcpGate};
use proc::addr_in;
pub use proc::{Proc, bin_dir};

/// A node of the simulated cluster.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// Its name.
    pub name: String,
    /// Its InternalIP.
    pub ip: String,
    /// The value of its node-pool label (`apps.openyurt.io/nodepool`), if any.
    pub pool: Option<String>,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct Options {
    /// kustomize components of `deploy/components` to enable.
    pub components: Vec<&'static str>,
    /// The content of the `clb-gateways` ConfigMap's `gateways.yaml` (as the operator edits it);
    /// `None`: `deploy/`'s own.
    pub gateways_yaml: Option<String>,
    /// The nodes (one node agent each).
    pub nodes: Vec<NodeSpec>,
    /// State server replicas (deploy/ runs 2).
    pub servers: usize,
    /// Sync workers.
    pub workers: usize,
}

impl Options {
    /// deploy/ as it is, `nodes` nodes without pools, 2 state servers, 3 sync workers.
    pub fn base(nodes: usize) -> Self {
        Self {
            components: Vec::new(),
            gateways_yaml: None,
            nodes: (0..nodes)
                .map(|i| NodeSpec {
                    name: format!("node-{i}"),
                    ip: format!("10.0.0.{}", i + 1),
                    pool: None,
                })
                .collect(),
            servers: 2,
            workers: 3,
        }
    }
}

/// One process to start: the workload of `deploy/` whose container it runs, its binary, its node,
/// the Kubernetes API its kubeconfig names, and the log line that says it listens.
struct Launch<'a> {
    workload: &'a str,
    bin: &'a str,
    node: &'a str,
    kube_server: String,
    ready_line: &'a str,
}

/// The whole system, running.
pub struct Shipped {
    /// The fake Kubernetes API (RBAC enforced).
    pub api: FakeApi,
    /// deploy/, rendered.
    pub rendered: Rendered,
    /// The NRP emulator (every gateway, each in its resource group).
    pub nrp: RunningEmulator,
    /// The gateways file the components read.
    pub gateways: Gateways,
    /// The state server replicas (a killed one stays, dead, at its index).
    pub servers: Vec<Proc>,
    /// The Service in front of them.
    pub service: ServiceProxy,
    /// The state servers' way to the Kubernetes API.
    pub api_gate: TcpGate,
    /// The sync workers.
    pub workers: Vec<Proc>,
    /// `clb-watcher` (cluster mode).
    pub watcher: Proc,
    /// The node agents, one per node, in the order of [`Options::nodes`].
    pub agents: Vec<Proc>,
    dir: PathBuf,
    next_pod: u64,
    api_addr: SocketAddr,
    /// The simulated kubelet's projections of runtime ConfigMaps and Secrets ([`kubelet`]).
    kubelet: tokio::task::JoinSet<()>,
}

/// The environment of `c` as the kubelet sets it: literal values, ConfigMaps (`envFrom`), the
/// downward API (`metadata.name` → `pod`, `spec.nodeName` → `node`, `metadata.namespace`).
fn container_env(
    rendered: &Rendered,
    c: &Container,
    pod: &str,
    node: &str,
) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for from in c.env_from.iter().flatten() {
        if let Some(r) = &from.config_map_ref {
            env.extend(
                rendered
                    .config_map(&r.name)
                    .data
                    .clone()
                    .unwrap_or_default(),
            );
        }
    }
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) => v.clone(),
            (None, Some(from)) => match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                Some("metadata.name") => pod.to_owned(),
                Some("spec.nodeName") => node.to_owned(),
                Some("metadata.namespace") => NAMESPACE.to_owned(),
                other => panic!("{pod}: env {} from {other:?}: not simulated", e.name),
            },
            (None, None) => String::new(),
        };
        env.push((e.name.clone(), value));
    }
    env
}

/// `args` with each `--flag=value` of `rewrites` replaced (or added when absent).
fn rewrite(args: &[String], rewrites: &[(&str, String)]) -> Vec<String> {
    let mut out: Vec<String> = args
        .iter()
        .filter(|a| {
            !rewrites
                .iter()
                .any(|(flag, _)| *a == flag || a.starts_with(&format!("{flag}=")))
        })
        .cloned()
        .collect();
    out.extend(rewrites.iter().map(|(f, v)| format!("{f}={v}")));
    out
}

impl Shipped {
    /// Starts the fake API (deploy/'s RBAC loaded and enforced), the emulator with every
    /// gateway's Service Gateway created (as an operator provisions them), the nodes, the state
    /// servers (waits for a leader), the sync workers, the watcher and one node agent per node.
    pub async fn start(options: Options) -> Self {
        let components: Vec<&str> = options.components.clone();
        let rendered = Rendered::load(&components);
        let api = FakeApi::start().await;
        api.load_rbac(&rendered);
        api.enforce_rbac(true);
        let api_addr: SocketAddr = api.url.trim_start_matches("http://").parse().expect("url");
        let api_gate = TcpGate::start(api_addr).await;
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "clb-shipped-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let yaml = options.gateways_yaml.clone().unwrap_or_else(|| {
            rendered
                .config_map("clb-gateways")
                .data
                .as_ref()
                .and_then(|d| d.get("gateways.yaml"))
                .expect("deploy/ ships gateways.yaml in ConfigMap clb-gateways")
                .clone()
        });
        std::fs::write(dir.join("gateways.yaml"), &yaml).expect("gateways file");
        let gateways = Gateways::parse(&yaml).expect("a valid gateways file");
        let nrp =
            RunningEmulator::start(Emulator::new(EmulatorConfig::default()).expect("emulator"))
                .await
                .expect("emulator starts");
        for g in gateways.all() {
            let mut arm =
                clb_nrp::azure::ArmConfig::new(&g.azure.subscription, &g.azure.resource_group)
                    .with_endpoint(nrp.base_url());
            arm.poll_interval = Duration::from_millis(5);
            let client = clb_nrp::azure::ArmClient::new(arm, None).expect("ARM config");
            let sgw = clb_nrp::wire::ServiceGateway {
                location: Some(g.azure.region.clone()),
                sku: Some(clb_nrp::wire::Sku::standard()),
                ..Default::default()
            };
            use clb_nrp::Nrp as _;
            client
                .put_service_gateway(
                    g.resource_name(),
                    &sgw,
                    clb_nrp::CallOptions::with_timeout(PATIENCE),
                )
                .await
                .expect("creating the Service Gateway");
        }
        for n in &options.nodes {
            let mut node = crate::kube_objects::node(&n.name, &[&n.ip]);
            if let Some(pool) = &n.pool {
                node["metadata"]["labels"] =
                    serde_json::json!({ "apps.openyurt.io/nodepool": pool });
            }
            api.put("nodes", node);
        }
        let service = ServiceProxy::start().await;
        let mut s = Self {
            api,
            rendered,
            nrp,
            gateways,
            servers: Vec::new(),
            service,
            api_gate,
            workers: Vec::new(),
            watcher: Proc::placeholder(),
            agents: Vec::new(),
            dir,
            next_pod: 0,
            api_addr,
            kubelet: tokio::task::JoinSet::new(),
        };
        for _ in 0..options.servers {
            s.start_server().await;
        }
        s.wait_leader().await;
        for _ in 0..options.workers {
            let w = s.start_worker().await;
            s.workers.push(w);
        }
        s.watcher = s.start_watcher("clb-watcher", "node-0").await;
        for n in options.nodes.clone() {
            let a = s.start_watcher("clb-node-agent", &n.name).await;
            s.agents.push(a);
        }
        s
    }

    fn pod_name(&mut self, workload: &str) -> String {
        self.next_pod += 1;
        format!("{workload}-{:05x}", self.next_pod)
    }

    /// Tokens of ServiceAccount `account` for a pod on `node`: the Kubernetes API's (in a
    /// kubeconfig for `server`) and clb's (a projected token file, audience `clb`).
    fn identity(&self, pod: &str, account: &str, node: &str, server: &str) -> (PathBuf, PathBuf) {
        let kube_token = format!("kube-{pod}");
        let clb_token = format!("clb-{pod}");
        self.api.add_token(
            &kube_token,
            TokenUser::service_account(NAMESPACE, account, Some(node), API_AUDIENCE),
        );
        self.api.add_token(
            &clb_token,
            TokenUser::service_account(NAMESPACE, account, Some(node), "clb"),
        );
        let kubeconfig = self.dir.join(format!("{pod}.kubeconfig"));
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {server}\n\
                 users:\n- name: sa\n  user:\n    token: {kube_token}\ncontexts:\n- name: c\n  context:\n    \
                 cluster: fake\n    user: sa\n    namespace: {NAMESPACE}\ncurrent-context: c\n"
            ),
        )
        .expect("kubeconfig");
        let token_file = self.dir.join(format!("{pod}.token"));
        std::fs::write(&token_file, &clb_token).expect("token file");
        (kubeconfig, token_file)
    }

    fn account_of(&self, workload: &str) -> String {
        let (_, t) = self
            .rendered
            .workloads()
            .into_iter()
            .find(|(n, _)| n == workload)
            .unwrap_or_else(|| panic!("{workload} is not in deploy/"));
        t.spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| panic!("{workload} names no ServiceAccount"))
    }

    async fn spawn(&mut self, l: Launch<'_>, rewrites: Vec<(&str, String)>) -> Proc {
        let Launch {
            workload,
            bin,
            node,
            kube_server,
            ready_line,
        } = l;
        let pod = self.pod_name(workload);
        let pod = pod.as_str();
        let kube_server = kube_server.as_str();
        let account = self.account_of(workload);
        let (kubeconfig, token) = self.identity(pod, &account, node, kube_server);
        let c = self.rendered.container(workload).clone();
        let mut env = container_env(&self.rendered, &c, pod, node);
        env.push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
        let mut rewrites = rewrites;
        if c.args
            .iter()
            .flatten()
            .any(|a| a.starts_with("--token-file"))
        {
            rewrites.push(("--token-file", token.display().to_string()));
        }
        if c.args
            .iter()
            .flatten()
            .any(|a| a.starts_with("--gateways-file"))
        {
            rewrites.push((
                "--gateways-file",
                self.dir.join("gateways.yaml").display().to_string(),
            ));
        }
        if c.args
            .iter()
            .flatten()
            .any(|a| a.starts_with("--metrics-listen"))
        {
            rewrites.push(("--metrics-listen", "127.0.0.1:0".into()));
        }
        let args = rewrite(c.args.as_deref().unwrap_or_default(), &rewrites);
        // As the kubelet: the pod starts once the ConfigMaps and Secrets it mounts exist.
        let volumes = kubelet::runtime_volumes(&self.rendered, workload, &c, &self.dir.join(pod));
        kubelet::project(&self.api, &volumes, &mut self.kubelet).await;
        let args = kubelet::rewrite_paths(&args, &volumes);
        let mut p = Proc::spawn(pod, bin, &args, &env).await;
        // The state server names both addresses in its "listening" line; the others log the
        // metrics listener when they start it.
        let line = p.wait_for_line(ready_line).await;
        p.grpc = addr_in(&line, "grpc");
        p.metrics = addr_in(&line, "metrics");
        assert!(p.metrics.is_some(), "{pod}: no metrics address in {line:?}");
        p
    }

    /// Starts one more state server replica (a new pod of the Deployment); returns its index.
    pub async fn start_server(&mut self) -> usize {
        let launch = Launch {
            workload: "clb-state-server",
            bin: "clb-state-server",
            node: "node-0",
            kube_server: self.api_gate.url.clone(),
            ready_line: "listening",
        };
        let mut rewrites = vec![("--listen", "127.0.0.1:0".to_owned())];
        if self
            .rendered
            .container("clb-state-server")
            .args
            .iter()
            .flatten()
            .any(|a| a == "--tls-self-managed" || a == "--tls-self-managed=true")
        {
            rewrites.push(("--tls-extra-names", self.service.ip().to_string()));
        }
        let p = self.spawn(launch, rewrites).await;
        assert!(p.grpc.is_some(), "{}: no gRPC address", p.name);
        self.servers.push(p);
        self.refresh_service();
        self.servers.len() - 1
    }

    fn refresh_service(&self) {
        self.service.set(
            self.servers
                .iter()
                .filter_map(|p| Some((p.grpc?, p.metrics?)))
                .collect(),
        );
    }

    /// `workload`'s `--server` in deploy/, pointed at the Service here (the scheme kept).
    pub fn server_url(&self, workload: &str) -> String {
        let shipped = self
            .rendered
            .container(workload)
            .args
            .iter()
            .flatten()
            .find_map(|a| a.strip_prefix("--server="))
            .unwrap_or_else(|| panic!("{workload} has no --server in deploy/"));
        let scheme = shipped.split_once("://").map_or("http", |(s, _)| s);
        format!("{scheme}://{}", self.service.addr())
    }

    async fn start_worker(&mut self) -> Proc {
        let rewrites = vec![
            ("--server", self.server_url("clb-sync-worker")),
            ("--nrp-endpoint", self.nrp.base_url()),
            ("--credential", "none".to_owned()),
        ];
        let launch = Launch {
            workload: "clb-sync-worker",
            bin: "clb-sync-worker",
            node: "node-0",
            kube_server: self.api.url.clone(),
            ready_line: "serving /metrics",
        };
        self.spawn(launch, rewrites).await
    }

    async fn start_watcher(&mut self, workload: &str, node: &str) -> Proc {
        let launch = Launch {
            workload,
            bin: "clb-watcher",
            node,
            kube_server: self.api.url.clone(),
            ready_line: "serving /metrics",
        };
        let rewrites = vec![("--server", self.server_url(workload))];
        self.spawn(launch, rewrites).await
    }

    /// The index of the replica that leads now (its `clb_server_leader` gauge is 1), if any.
    pub async fn leader(&self) -> Option<usize> {
        for (i, s) in self.servers.iter().enumerate() {
            if s.metric("clb_server_leader ").await == 1.0 {
                return Some(i);
            }
        }
        None
    }

    /// Waits until a replica leads and the Service routes to it.
    pub async fn wait_leader(&self) -> usize {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(i) = self.leader().await {
                return i;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no leader within {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the leader holds a completed resync of every writer (the watcher and each node
    /// agent), read with `operator`'s Admin access: after a fail-over, the writers found the new
    /// leader and its view is complete again.
    pub async fn wait_writers_resynced(&self, operator: &Client) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Ok(status) = operator.status().await {
                let done = status
                    .writers
                    .iter()
                    .filter(|w| w.last_resync_unix_ms > 0)
                    .count();
                if done > self.agents.len() {
                    return;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the writers did not resync with the leader within {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The sum of a metric over the live state servers.
    pub async fn server_metric(&self, prefix: &str) -> f64 {
        let mut sum = 0.0;
        for s in &self.servers {
            sum += s.metric(prefix).await;
        }
        sum
    }

    /// A client of the Service with a new operator identity bound (as docs/security.md tells
    /// operators) to `clb-reader` and `clb-writer`: for the test's own reads, never a component's.
    pub async fn operator(&mut self) -> Client {
        let mut options = self.operator_options();
        options.token_file = Some(self.operator_token());
        options.attempts = 20;
        Client::connect(options)
            .await
            .expect("the operator connects")
    }

    /// The token file of a new operator identity bound to `clb-reader` and `clb-writer`.
    pub fn operator_token(&mut self) -> PathBuf {
        let name = self.pod_name("operator");
        let token = format!("clb-{name}");
        self.api
            .add_token(&token, TokenUser::user(&name, &[], "clb"));
        for role in ["clb-reader", "clb-writer"] {
            self.api.create_cluster_role_binding(
                &format!("{role}-{name}"),
                role,
                crate::rbac::user(&name),
            );
        }
        let file = self.dir.join(format!("{name}.token"));
        std::fs::write(&file, &token).expect("token file");
        file
    }

    /// How an operator reaches the Service as deploy/ ships the server: over TLS, trusting the CA
    /// bundle the state server publishes (read now), by the Service's address.
    pub fn operator_options(&self) -> ConnectOptions {
        let mut options = ConnectOptions::new(self.server_url("clb-watcher"));
        if options.endpoint.starts_with("https://") {
            options.tls = Some(TlsOptions {
                ca: Some(CaBundle::Pem(self.ca_bundle().into_bytes())),
                ..TlsOptions::default()
            });
        }
        options
    }

    /// The CA bundle in the ConfigMap `clb-ca-bundle` (key `ca.crt`) now.
    pub fn ca_bundle(&self) -> String {
        self.api
            .get("configmaps", NAMESPACE, "clb-ca-bundle")
            .and_then(|cm| cm.pointer("/data/ca.crt")?.as_str().map(str::to_owned))
            .expect("the state server publishes its CA bundle in the ConfigMap clb-ca-bundle")
    }

    /// Every component's log lines that mention a refusal of the caller checks or of the
    /// Kubernetes API (`PermissionDenied`, `Unauthenticated`, `forbidden`), with the component.
    pub fn refusals_in_logs(&self) -> Vec<(String, String)> {
        let all = self
            .servers
            .iter()
            .chain(&self.workers)
            .chain(std::iter::once(&self.watcher))
            .chain(&self.agents);
        let mut out = Vec::new();
        for p in all {
            for l in p.log() {
                let lower = l.to_ascii_lowercase();
                if lower.contains("permissiondenied")
                    || lower.contains("permission denied")
                    || lower.contains("unauthenticated")
                    || lower.contains("forbidden")
                {
                    out.push((p.name.clone(), l));
                }
            }
        }
        out
    }

    /// `(component, writer resyncs counted by its own metrics)` of the watcher and node agents.
    pub async fn writer_resyncs(&self) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for p in std::iter::once(&self.watcher).chain(&self.agents) {
            out.insert(p.name.clone(), p.metric("clb_watcher_resyncs_total").await);
        }
        out
    }

    /// Restarts the API-facing gate of the state servers after [`TcpGate::close`].
    pub async fn api_back(&self) {
        self.api_gate.open(self.api_addr).await;
    }

    /// Stops everything (SIGTERM to every process; the fake API and emulator end with the test).
    pub async fn shutdown(mut self) {
        for p in self
            .agents
            .iter_mut()
            .chain(std::iter::once(&mut self.watcher))
            .chain(self.workers.iter_mut())
            .chain(self.servers.iter_mut())
        {
            p.terminate().await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
