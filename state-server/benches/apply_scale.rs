//! The state server's work per `Apply` against the number of Services it holds (issue 36: "the
//! state server's work per update is independent of how many Services exist"). For each S in
//! `CLB_BENCH_SERVICES` (comma-separated, default `250,2500`): a fresh server in this process on
//! 127.0.0.1 (one gateway, no worker: nothing is programmed, so only the update path and what
//! follows every change — the published states — are measured), one `WatchServices` follower (the
//! watcher's write-back) drained beside it, S inbound Services of 10 endpoints over 100 nodes
//! loaded first; then `CLB_BENCH_CALLS` (default 3,000) unary `Apply` calls, one after another,
//! each replacing one endpoint of one Service (Services in turn). Reported per S: the calls' p50
//! and p99, and the process's CPU time per call (`/proc/self/stat`, utime + stime, client
//! included: the client's share is the same at every S).
//!
//! ```sh
//! cargo bench -p clb-state-server --bench apply_scale
//! ```

use std::time::{Duration, Instant};

use clb_proto::v1;
use clb_proto::v1::writer_client::WriterClient;
use clb_state_server::state::{ServerConfig, StateServer};

const ENDPOINTS: usize = 10;
const NODES: usize = 100;

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(|s| s.trim().parse().expect("a number"))
        .collect()
}

/// CPU time of this process so far (user + system), from `/proc/self/stat` (clock ticks of 10 ms).
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of stat(5), counted from the state (field 3) here.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

fn uid(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012}")
}

fn endpoint(n: usize) -> v1::Endpoint {
    v1::Endpoint {
        address: format!("10.{}.{}.{}", 2 + n / 62_500, (n / 250) % 250, n % 250 + 1),
        location: format!("10.0.0.{}", n % NODES + 1),
    }
}

fn update(kind: v1::update::Kind) -> v1::Update {
    v1::Update { kind: Some(kind) }
}

/// Service `i`'s endpoints, its first one replaced by pod number `first`.
fn endpoints(i: usize, first: usize) -> v1::Update {
    let mut eps: Vec<v1::Endpoint> = (0..ENDPOINTS)
        .map(|k| endpoint(i * ENDPOINTS + k))
        .collect();
    eps[0] = endpoint(first);
    update(v1::update::Kind::Endpoints(v1::EndpointsUpdate {
        service_id: uid(i),
        change: Some(v1::endpoints_update::Change::Level(v1::EndpointSet {
            endpoints: eps,
        })),
    }))
}

fn service(i: usize) -> v1::Update {
    update(v1::update::Kind::Service(v1::ServiceUpdate {
        operation: v1::Operation::Add as i32,
        service_id: uid(i),
        ports: vec![v1::ServicePort {
            port: 80,
            protocol: v1::Protocol::Tcp as i32,
            target_port: 0,
        }],
        ..Default::default()
    }))
}

fn request(batch_id: u64, updates: Vec<v1::Update>) -> v1::ApplyRequest {
    v1::ApplyRequest {
        gateway: String::new(),
        writer: "bench".into(),
        batch_id,
        dry_run: false,
        updates,
    }
}

/// The allocator of the shipped binaries.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

async fn run(services: usize, calls: usize) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let state = StateServer::new(ServerConfig::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        clb_state_server::grpc::serve(listener, state, async move {
            let _ = stop_rx.await;
        })
        .await
        .unwrap();
    });
    let mut client = WriterClient::connect(url)
        .await
        .unwrap()
        .max_decoding_message_size(64 << 20);
    let mut follower = client.clone();
    let follow = tokio::spawn(async move {
        let mut stream = follower
            .watch_services(v1::WatchServicesRequest {
                gateway: String::new(),
                writer: "bench".into(),
                include_outbound: false,
            })
            .await
            .unwrap()
            .into_inner();
        let mut messages = 0u64;
        while let Ok(Some(_)) = stream.message().await {
            messages += 1;
        }
        messages
    });

    for chunk in (0..services).collect::<Vec<_>>().chunks(100) {
        let updates = chunk
            .iter()
            .flat_map(|&i| [service(i), endpoints(i, i * ENDPOINTS)])
            .collect();
        let r = client
            .apply(request(chunk[0] as u64, updates))
            .await
            .unwrap()
            .into_inner();
        assert!(r.rejected.is_empty(), "{:?}", r.rejected.first());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut latencies = Vec::with_capacity(calls);
    let cpu0 = cpu();
    let wall0 = Instant::now();
    for k in 0..calls {
        let i = k % services;
        // A pod number no Service uses: 1,000,000 and up.
        let req = request((services + k) as u64, vec![endpoints(i, 1_000_000 + k)]);
        let start = Instant::now();
        let r = client.apply(req).await.unwrap().into_inner();
        latencies.push(start.elapsed());
        assert_eq!(r.applied, 1, "{:?}", r.rejected.first());
    }
    // What the last calls set off (the published states) is counted too.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cpu_per_call = (cpu() - cpu0).as_secs_f64() / calls as f64;
    let wall = wall0.elapsed();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    let _ = stop_tx.send(());
    let _ = task.await;
    let messages = follow.await.unwrap_or(0);
    println!(
        "| {services} | {calls} | {:.3} ms | {:.3} ms | {:.3} ms | {:.2} s | {messages} |",
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        cpu_per_call * 1e3,
        wall.as_secs_f64()
    );
}

#[tokio::main]
async fn main() {
    let sizes = env_list("CLB_BENCH_SERVICES", "250,2500");
    let calls = env_list("CLB_BENCH_CALLS", "3000")[0];
    println!(
        "| Services | calls | Apply p50 | Apply p99 | CPU per call (process) | wall | WatchServices messages |"
    );
    println!("|---|---|---|---|---|---|---|");
    for s in sizes {
        run(s, calls).await;
    }
}
