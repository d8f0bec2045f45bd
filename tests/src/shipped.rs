//! The shipped system as one: every component is the real binary (`clb-state-server`,
//! `clb-sync-worker`, `clb-watcher`), started as a process with the args and environment of its
//! container in `deploy/` (rendered as kustomize would, [`crate::deploy::Rendered`]), each with its
//! own ServiceAccount tokens, against the fake Kubernetes API ([`crate::fake_kube`]) that enforces
//! `deploy/`'s RBAC on its own requests and answers every SubjectAccessReview by evaluating it, and
//! the NRP emulator as Azure.
//!
//! What is rewritten, and nothing else: addresses (`--listen`, `--metrics-listen` to
//! `127.0.0.1:0`; `--server` to the Service in front of the state servers; `--nrp-endpoint` to the
//! emulator), file paths (`--token-file`, `--gateways-file`, and `KUBECONFIG` standing in for the
//! in-cluster ServiceAccount mount), the downward API's values (pod name, node name), and the sync
//! worker's `--credential` (`none`: Entra ID cannot be reached here; the emulator takes no token).
//!
//! The state servers sit behind [`ServiceProxy`], which routes like the Kubernetes Service
//! `clb-state-server`: to a replica whose `/readyz` answers 200 (the leader), probed every 100 ms.
//! The state servers reach the Kubernetes API through a [`TcpGate`] that can refuse connections
//! (an API server that is down).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use clb_client::client::{Client, ConnectOptions};
use clb_gateways::Gateways;
use clb_nrp_emulator::{Emulator, EmulatorConfig, RunningEmulator};
use k8s_openapi::api::core::v1::Container;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};

use crate::PATIENCE;
use crate::deploy::{NAMESPACE, Rendered};
use crate::fake_kube::{API_AUDIENCE, FakeApi, TokenUser};

/// The binaries' directory (`target/<profile>`), built once per test process: `cargo build` of
/// the three binaries into the target directory the tests run from, so they are never stale.
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        // target/<profile>/deps/<test> → target/<profile>
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>/deps")
            .to_path_buf();
        let target_dir = profile_dir.parent().expect("target").to_path_buf();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let mut cmd = std::process::Command::new(cargo);
        cmd.args([
            "build",
            "--locked",
            "-p",
            "clb-state-server",
            "-p",
            "clb-sync-worker",
            "-p",
            "clb-watcher",
            "--bins",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("running cargo build");
        assert!(status.success(), "building the binaries failed: {status}");
        profile_dir
    })
}

/// A component's process: its stderr (the log) is kept line by line.
#[derive(Debug)]
pub struct Proc {
    /// The pod name it runs as.
    pub name: String,
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    /// Its gRPC address (state servers).
    pub grpc: Option<SocketAddr>,
    /// Its metrics address (`--metrics-listen`).
    pub metrics: Option<SocketAddr>,
}

/// `key=Some(ADDR)` or `key=ADDR` in a log line.
fn addr_in(line: &str, key: &str) -> Option<SocketAddr> {
    let at = line.find(&format!("{key}="))? + key.len() + 1;
    let rest = line[at..].trim_start_matches("Some(");
    let end = rest
        .find(|c: char| {
            !(c.is_ascii_alphanumeric() || c == '.' || c == ':' || c == '[' || c == ']')
        })
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

impl Proc {
    async fn spawn(name: &str, bin: &str, args: &[String], env: &[(String, String)]) -> Self {
        let mut cmd = Command::new(bin_dir().join(bin));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {bin} as {name}: {e}"));
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("piped");
        let sink = log.clone();
        let echo = std::env::var("CLB_SHIPPED_LOGS").is_ok();
        let who = name.to_owned();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if echo {
                    eprintln!("[{who}] {line}");
                }
                sink.lock().unwrap().push(line);
            }
        });
        Self {
            name: name.to_owned(),
            child,
            log,
            grpc: None,
            metrics: None,
        }
    }

    /// Waits for a log line containing `needle` (at most [`PATIENCE`]).
    pub async fn wait_for_line(&self, needle: &str) -> String {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(l) = self.log().into_iter().find(|l| l.contains(needle)) {
                return l;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: no log line with {needle:?} within {PATIENCE:?}; log:\n{}",
                self.name,
                self.log().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Its log so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// SIGKILL, as a node failure or an OOM kill: no shutdown of any kind.
    pub async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// SIGTERM, as the kubelet does on a rollout, then waits for the exit (at most
    /// [`PATIENCE`], then SIGKILL).
    pub async fn terminate(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        if tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .is_err()
        {
            self.kill().await;
        }
    }

    /// `GET path` on its metrics port: the status and the body.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        let addr = self.metrics?;
        let r = reqwest::Client::new()
            .get(format!("http://{addr}{path}"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        let status = r.status().as_u16();
        Some((status, r.text().await.ok()?))
    }

    /// The value of the first sample whose line starts with `prefix` in its `/metrics` (0 when
    /// absent; the Prometheus text is parsed by [`crate::metrics_check`]'s rules elsewhere).
    pub async fn metric(&self, prefix: &str) -> f64 {
        let Some((_, text)) = self.get("/metrics").await else {
            return 0.0;
        };
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

/// The Kubernetes Service `clb-state-server`: forwards each connection to a replica whose
/// `/readyz` answers 200 (probed every 100 ms); with none ready, the connection is closed at once.
#[derive(Debug)]
pub struct ServiceProxy {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    backends: Arc<Mutex<Vec<(SocketAddr, SocketAddr)>>>,
}

impl ServiceProxy {
    async fn start() -> Self {
        let backends: Arc<Mutex<Vec<(SocketAddr, SocketAddr)>>> = Arc::default();
        let ready: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
        let (b, r) = (backends.clone(), ready.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            loop {
                let list = b.lock().unwrap().clone();
                let mut found = None;
                for (grpc, metrics) in list {
                    let ok = http
                        .get(format!("http://{metrics}/readyz"))
                        .timeout(Duration::from_millis(500))
                        .send()
                        .await
                        .is_ok_and(|r| r.status().is_success());
                    if ok {
                        found = Some(grpc);
                        break;
                    }
                }
                *r.lock().unwrap() = found;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let Some(target) = *ready.lock().unwrap() else {
                    continue; // no ready endpoint: dropped
                };
                tokio::spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
            }
        });
        Self { url, backends }
    }

    fn set(&self, backends: Vec<(SocketAddr, SocketAddr)>) {
        *self.backends.lock().unwrap() = backends;
    }
}

/// A TCP forwarder to `target` that can refuse connections (its listener closed) and accept
/// them again on the same port: an API server that is down, then back.
#[derive(Debug, Clone)]
pub struct TcpGate {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    open: Arc<AtomicBool>,
    epoch: Arc<AtomicU64>,
}

impl TcpGate {
    async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let gate = Self {
            url: format!("http://{addr}"),
            open: Arc::new(AtomicBool::new(true)),
            epoch: Arc::default(),
        };
        gate.serve(listener, target);
        gate
    }

    fn serve(&self, listener: TcpListener, target: SocketAddr) {
        let (open, epoch) = (self.open.clone(), self.epoch.clone());
        let mine = epoch.load(Ordering::SeqCst);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((mut inbound, _)) = accepted else { return };
                        let open = open.clone();
                        tokio::spawn(async move {
                            if let Ok(mut out) = tokio::net::TcpStream::connect(target).await {
                                // A server that goes down closes its connections too.
                                let closed = async {
                                    while open.load(Ordering::SeqCst) {
                                        tokio::time::sleep(Duration::from_millis(10)).await;
                                    }
                                };
                                tokio::select! {
                                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut out) => {}
                                    () = closed => {}
                                }
                            }
                        });
                    }
                    () = tokio::time::sleep(Duration::from_millis(10)) => {
                        if !open.load(Ordering::SeqCst) || epoch.load(Ordering::SeqCst) != mine {
                            return; // the listener is dropped: connections are refused
                        }
                    }
                }
            }
        });
    }

    /// Closes every connection and refuses new ones until [`TcpGate::open`].
    pub async fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
        // The listener and every forwarder look at the flag every 10 ms: once this returns, no
        // connection is left and none is accepted.
        tokio::time::sleep(Duration::from_millis(60)).await;
    }

    /// Accepts connections again, on the same port.
    pub async fn open(&self, target: SocketAddr) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.open.store(true, Ordering::SeqCst);
        let addr: SocketAddr = self
            .url
            .trim_start_matches("http://")
            .parse()
            .expect("addr");
        let listener = TcpListener::bind(addr)
            .await
            .expect("re-bind the gate's port");
        self.serve(listener, target);
    }
}

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
            watcher: Proc {
                name: String::new(),
                child: Command::new("true")
                    .kill_on_drop(true)
                    .spawn()
                    .expect("true"),
                log: Arc::default(),
                grpc: None,
                metrics: None,
            },
            agents: Vec::new(),
            dir,
            next_pod: 0,
            api_addr,
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
        let p = self
            .spawn(launch, vec![("--listen", "127.0.0.1:0".into())])
            .await;
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

    async fn start_worker(&mut self) -> Proc {
        let rewrites = vec![
            ("--server", self.service.url.clone()),
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
        let rewrites = vec![("--server", self.service.url.clone())];
        self.spawn(launch, rewrites).await
    }

    /// The index of the replica that leads now (its `clb_leader` gauge is 1), if any.
    pub async fn leader(&self) -> Option<usize> {
        for (i, s) in self.servers.iter().enumerate() {
            if s.metric("clb_leader ").await == 1.0 {
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
        let mut options = ConnectOptions::new(&self.service.url);
        options.token_file = Some(file);
        options.attempts = 20;
        Client::connect(options)
            .await
            .expect("the operator connects")
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
