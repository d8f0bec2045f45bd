//! Update ingest over loopback gRPC: bulk `ApplyStream` with batches of 1,000 pod updates, and the
//! latency of unary `Apply` (one pod update per call). Prints a table; figures go to
//! docs/benchmarks.md. Run: `cargo bench -p clb-state-server --bench ingest`.

use std::time::{Duration, Instant};

use clb_proto::v1;
use clb_proto::v1::writer_client::WriterClient;
use clb_state_server::state::{ServerConfig, StateServer};

const BATCH: usize = 1_000;
const BATCHES: usize = 300;
const UNARY_CALLS: usize = 5_000;

fn pod(i: usize, egress: usize) -> v1::Update {
    let location = i % 2_000;
    v1::Update {
        kind: Some(v1::update::Kind::Pod(v1::PodUpdate {
            operation: v1::Operation::Add as i32,
            address: format!("10.{}.{}.{}", 128 + i / 65_536, (i / 256) % 256, i % 256),
            location: format!("10.0.{}.{}", location / 250, location % 250 + 1),
            egress_id: format!("egress-{}", egress % 200),
            pod_key: format!("default/pod-{i}"),
            pod_uid: format!("uid-{i}"),
            ..Default::default()
        })),
    }
}

fn batch(n: usize, round: usize) -> v1::ApplyRequest {
    v1::ApplyRequest {
        gateway: String::new(),
        writer: "bench".into(),
        batch_id: n as u64,
        dry_run: false,
        updates: (0..BATCH)
            .map(|j| pod((n * BATCH + j) % 100_000, n + j + round))
            .collect(),
    }
}

/// The allocator of the shipped binaries: glibc's spent about a third of the CPU under load
/// (docs/benchmarks.md, "The allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let state = StateServer::new(ServerConfig::default());
    let server = state.clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        clb_state_server::grpc::serve(listener, server, async move {
            let _ = stop_rx.await;
        })
        .await
        .unwrap();
    });
    let mut client = WriterClient::connect(url)
        .await
        .unwrap()
        .max_decoding_message_size(64 << 20);

    // Bulk: pre-build the batches so the client's formatting is not measured.
    for round in 0..2 {
        let batches: Vec<v1::ApplyRequest> = (0..BATCHES).map(|n| batch(n, round)).collect();
        let start = Instant::now();
        let mut responses = client
            .apply_stream(tokio_stream::iter(batches))
            .await
            .unwrap()
            .into_inner();
        let mut applied = 0u64;
        while let Some(r) = responses.message().await.unwrap() {
            assert!(r.rejected.is_empty(), "{:?}", r.rejected.first());
            applied += u64::from(r.applied);
        }
        let elapsed = start.elapsed();
        println!(
            "bulk ApplyStream round {round}: {applied} pod updates in {:.3} s = {:.0} updates/s",
            elapsed.as_secs_f64(),
            applied as f64 / elapsed.as_secs_f64()
        );
    }

    // Unary latency.
    let mut latencies = Vec::with_capacity(UNARY_CALLS);
    for i in 0..UNARY_CALLS {
        let req = v1::ApplyRequest {
            gateway: String::new(),
            writer: "bench".into(),
            batch_id: i as u64,
            dry_run: false,
            updates: vec![pod(i * 17 % 100_000, i + 7)],
        };
        let start = Instant::now();
        let r = client.apply(req).await.unwrap().into_inner();
        latencies.push(start.elapsed());
        assert_eq!(r.applied, 1);
    }
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    println!(
        "unary Apply ({UNARY_CALLS} calls, 1 pod each): p50 {:?}, p99 {:?}, max {:?}",
        pct(0.50),
        pct(0.99),
        latencies.last().copied().unwrap_or(Duration::ZERO)
    );
    let _ = stop_tx.send(());
    let _ = task.await;
}
