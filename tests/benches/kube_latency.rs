//! Kubernetes → NRP latency: the watcher and one node agent per node, each with the flags of
//! `deploy/watcher.yaml` / `deploy/node-agent.yaml`, against the scripted fake Kubernetes API
//! (`tests/src/fake_kube.rs`); the state server with the flags of `deploy/state-server.yaml` (one
//! replica: leader election off), three sync workers, the NRP emulator at 0 latency. All over
//! loopback in one process.
//!
//! ```sh
//! cargo bench -p clb-tests --bench kube_latency
//! ```
//!
//! Measured, each from the write to the fake API until the emulator holds the result (polled
//! every 0.5 ms):
//! - **Service creation → NRP**: a LoadBalancer Service and its EndpointSlice (3 ready endpoints)
//!   are created; until NRP has the 3 addresses with the service. Also until
//!   `status.loadBalancer.ingress` is set on the Service.
//! - **endpoint added → NRP** and **endpoint removed → NRP**: one endpoint of a programmed
//!   Service's EndpointSlice becomes ready / is removed.
//! - **after an API-server outage**: every writer's API connection refuses requests (503) for 5 s
//!   and the watches expire (410 Gone once back); a new endpoint is written the moment the API
//!   serves again; until NRP has it.
//!
//! `CLB_BENCH_SERVICES` (default 200), `CLB_BENCH_CHANGES` (default 400), `CLB_BENCH_OUTAGES`
//! (default 5) set the sample sizes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use clb_embedded::GATEWAY;
use clb_nrp_emulator::{Emulator, EmulatorConfig};
use clb_tests::bench::env_usize;
use clb_tests::deploy::watcher_args;
use clb_tests::fake_kube::{FakeApi, Partition};
use clb_tests::ha::deploy_config;
use clb_tests::kube_objects::{RunningWatcher, endpoint, node, service, slice};
use clb_tests::{Harness, Options, PATIENCE};
use serde_json::{Value, json};

const NODES: usize = 5;

fn node_ip(i: usize) -> String {
    format!("10.0.0.{}", i + 1)
}

fn uid(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012}")
}

/// Pod IP number `n`.
fn pod_ip(n: usize) -> String {
    format!("10.2.{}.{}", n / 250, n % 250 + 1)
}

/// Whether NRP has `address` at `location` with `service` (`present`), or not (`!present`).
fn nrp_has(e: &Emulator, service: &str, at: &[(String, String)], present: bool) -> bool {
    let dump = e.dump();
    let Some(g) = dump.gateway(GATEWAY) else {
        return !present;
    };
    let map = g.address_map();
    at.iter().all(|k| {
        map.get(k)
            .is_some_and(|s: &BTreeSet<String>| s.contains(service))
            == present
    })
}

async fn until(what: &str, from: Instant, mut f: impl FnMut() -> bool) -> Duration {
    let deadline = from + PATIENCE;
    loop {
        if f() {
            return from.elapsed();
        }
        assert!(Instant::now() < deadline, "{what}: not after {PATIENCE:?}");
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn row(name: &str, mut xs: Vec<Duration>) {
    xs.sort();
    println!(
        "| {name} | {} | {} | {} | {} | {} |",
        xs.len(),
        ms(percentile(&xs, 0.5)),
        ms(percentile(&xs, 0.9)),
        ms(percentile(&xs, 0.99)),
        ms(xs[xs.len() - 1])
    );
}

/// Starts a writer with its own link to the API.
async fn start(config: clb_watcher::WatcherConfig, api: &FakeApi) -> (RunningWatcher, Partition) {
    let (kube, link) = api.partitionable_config().await;
    let clients = clb_watcher::KubeClients::from_config(kube).expect("kube clients");
    (RunningWatcher::start(config, clients), link)
}

struct Cluster {
    h: Harness,
    api: FakeApi,
    links: Vec<Partition>,
    writers: Vec<RunningWatcher>,
    next_ip: usize,
}

impl Cluster {
    async fn start() -> Self {
        let mut server = deploy_config();
        server.leader_elect = false;
        server.server_id = "bench".into();
        let options = Options {
            emulator: EmulatorConfig::default(),
            server,
            ..Options::e2e()
        };
        let h = Harness::start(options).await;
        let api = FakeApi::start().await;
        for i in 0..NODES {
            api.put("nodes", node(&format!("node-{i}"), &[&node_ip(i)]));
        }
        let url = format!("--server={}", h.url());
        // The pods' projected token (the in-process server checks no token; the clients read and
        // send it as deployed).
        let token = std::env::temp_dir().join(format!("clb-bench-token-{}", std::process::id()));
        std::fs::write(&token, "bench-token").expect("token file");
        let token = format!("--token-file={}", token.display());
        let mut links = Vec::new();
        let mut writers = Vec::new();
        // The in-process server speaks plain HTTP on loopback (deploy/'s TLS is the shipped
        // suite's).
        let plaintext = |mut a: clb_watcher::cli::Args| {
            a.tls_ca = None;
            a.insecure_plaintext = true;
            a
        };
        let watcher = plaintext(watcher_args("watcher.yaml", &[url.clone(), token.clone()]))
            .config()
            .expect("watcher flags");
        let (w, l) = start(watcher, &api).await;
        writers.push(w);
        links.push(l);
        for i in 0..NODES {
            let agent = plaintext(watcher_args(
                "node-agent.yaml",
                &[url.clone(), token.clone(), format!("--node=node-{i}")],
            ))
            .config()
            .expect("node agent flags");
            let (w, l) = start(agent, &api).await;
            writers.push(w);
            links.push(l);
        }
        Self {
            h,
            api,
            links,
            writers,
            next_ip: 0,
        }
    }

    fn new_ip(&mut self) -> String {
        self.next_ip += 1;
        pod_ip(self.next_ip)
    }

    /// The slice of service `i` with these (address, node index) endpoints.
    fn put_slice(&self, i: usize, eps: &[(String, usize)]) {
        let endpoints = eps
            .iter()
            .map(|(a, n)| endpoint(a, &format!("node-{n}"), true))
            .collect();
        self.api.put(
            "endpointslices",
            slice(
                &format!("svc-{i}-abcde"),
                &format!("svc-{i}"),
                "IPv4",
                endpoints,
            ),
        );
    }

    fn located(eps: &[(String, usize)]) -> Vec<(String, String)> {
        eps.iter().map(|(a, n)| (node_ip(*n), a.clone())).collect()
    }
}

fn ingress_set(api: &FakeApi, name: &str) -> bool {
    api.get("services", "default", name)
        .and_then(|s| {
            s.pointer("/status/loadBalancer/ingress/0/ip")
                .and_then(Value::as_str)
                .map(|ip| !ip.is_empty())
        })
        .unwrap_or(false)
}

async fn run(services: usize, changes: usize, outages: usize) {
    let mut c = Cluster::start().await;
    // Every writer has resynced (the state server knows all six).
    let client = c.h.client().await;
    let writers = NODES + 1;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let s = client.status().await.expect("status");
        let resynced = s.writers.iter().filter(|w| w.last_resync_unix_ms > 0);
        if resynced.count() >= writers {
            break;
        }
        assert!(Instant::now() < deadline, "the writers did not resync");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let mut create = Vec::new();
    let mut ingress = Vec::new();
    let mut endpoints: Vec<Vec<(String, usize)>> = Vec::new();
    for i in 0..services {
        let eps: Vec<(String, usize)> = (0..3).map(|k| (c.new_ip(), (i + k) % NODES)).collect();
        let spec = json!({"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]});
        let t0 = Instant::now();
        c.api
            .put("services", service(&format!("svc-{i}"), &uid(i), spec));
        c.put_slice(i, &eps);
        let at = Cluster::located(&eps);
        let e = c.h.emulator();
        create.push(until("service in NRP", t0, || nrp_has(e, &uid(i), &at, true)).await);
        let name = format!("svc-{i}");
        ingress.push(until("ingress", t0, || ingress_set(&c.api, &name)).await);
        endpoints.push(eps);
    }

    let mut added = Vec::new();
    let mut removed = Vec::new();
    for k in 0..changes {
        let i = k % services;
        let ip = c.new_ip();
        let n = (k * 7) % NODES;
        let mut eps = endpoints[i].clone();
        eps.push((ip.clone(), n));
        let at = vec![(node_ip(n), ip.clone())];
        let t0 = Instant::now();
        c.put_slice(i, &eps);
        let e = c.h.emulator();
        added.push(until("endpoint added", t0, || nrp_has(e, &uid(i), &at, true)).await);
        eps.pop();
        let t0 = Instant::now();
        c.put_slice(i, &eps);
        removed.push(until("endpoint removed", t0, || nrp_has(e, &uid(i), &at, false)).await);
    }

    let mut after_outage = Vec::new();
    for k in 0..outages {
        for l in &c.links {
            l.down();
        }
        for plural in ["services", "endpointslices", "pods", "nodes"] {
            c.api.expire(plural);
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let i = k % services;
        let ip = c.new_ip();
        let n = k % NODES;
        let mut eps = endpoints[i].clone();
        eps.push((ip.clone(), n));
        let at = vec![(node_ip(n), ip)];
        let t0 = Instant::now();
        for l in &c.links {
            l.up();
        }
        c.put_slice(i, &eps);
        let e = c.h.emulator();
        after_outage
            .push(until("change after outage", t0, || nrp_has(e, &uid(i), &at, true)).await);
        endpoints[i] = eps;
    }

    println!();
    println!("| Kubernetes → NRP | samples | p50 | p90 | p99 | max |");
    println!("|---|---|---|---|---|---|");
    row("Service created (with 3 ready endpoints) → NRP", create);
    row("Service created → `status.loadBalancer.ingress`", ingress);
    row("endpoint added → NRP", added);
    row("endpoint removed → NRP", removed);
    row(
        "endpoint added as the API returns from a 5 s outage → NRP",
        after_outage,
    );
    for w in std::mem::take(&mut c.writers) {
        w.stop().await;
    }
    c.h.shutdown().await;
}

fn main() {
    clb_tests::init_tracing();
    rustls::crypto::aws_lc_rs::default_provider()
        .install_default()
        .ok();
    let services = env_usize("CLB_BENCH_SERVICES", 200);
    let changes = env_usize("CLB_BENCH_CHANGES", 400);
    let outages = env_usize("CLB_BENCH_OUTAGES", 5);
    println!(
        "Kubernetes → NRP latency: {NODES} nodes, 1 watcher + {NODES} node agents (deploy/ flags), \
         state server (deploy/ flags, one replica), 3 workers, emulator at 0 latency; {services} \
         services, {changes} endpoint changes each way, {outages} outages"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(services, changes, outages));
}
