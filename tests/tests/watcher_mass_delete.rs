//! A mass delete (issue 36): Services deleted at once are cleaned up without sending a patch
//! again at a version the API already refused. The watcher against the scripted fake Kubernetes API
//! (`clb_tests::fake_kube`), whose writes take a real API server's time, and a real state server
//! with workers and the NRP emulator (`clb_tests::Harness`).
//!
//! Before, a status patch refused with 409 Conflict was sent again at the same version on the
//! next pushed state of the Service, until the delete's event arrived: 360 refused patches for 250
//! Services in `benches/kube_cold_start.rs` (`CLB_BENCH_DELETE_AT=ingress`).

use std::collections::BTreeMap;
use std::time::Duration;

use clb_tests::deploy::watcher_args;
use clb_tests::fake_kube::FakeApi;
use clb_tests::kube_objects::{RunningWatcher, endpoint, node, service, slice};
use clb_tests::{Harness, Options, init_tracing};
use serde_json::{Value, json};

const SERVICES: usize = 250;
const NODES: usize = 100;
const ENDPOINTS: usize = 10;
const BOUND: Duration = Duration::from_secs(600);

fn uid(i: usize) -> String {
    format!("5e1e7e00-0000-4000-8000-{i:012}")
}

fn has_ingress(s: &Value) -> bool {
    s.pointer("/status/loadBalancer/ingress/0/ip")
        .and_then(Value::as_str)
        .is_some_and(|ip| !ip.is_empty())
}

/// Polls `done`; panics naming `what` after [`BOUND`] (a bound on a hung test: a cold start of
/// 2,500 addresses in a debug build on a loaded machine, not a timing assertion).
async fn wait(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + BOUND;
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not after {BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn services_deleted_at_once_get_no_patch_that_cannot_succeed() {
    init_tracing();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let h = Harness::start(Options::e2e()).await;
    let fake = FakeApi::start().await;
    for n in 0..NODES {
        fake.put(
            "nodes",
            node(&format!("node-{n}"), &[&format!("10.0.0.{}", n + 1)]),
        );
    }
    for i in 0..SERVICES {
        let spec = json!({"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]});
        fake.put("services", service(&format!("svc-{i}"), &uid(i), spec));
        let eps = (0..ENDPOINTS)
            .map(|k| {
                let n = ENDPOINTS * i + k;
                endpoint(
                    &format!("10.1.{}.{}", n / 250, n % 250 + 1),
                    &format!("node-{}", n % NODES),
                    true,
                )
            })
            .collect();
        fake.put(
            "endpointslices",
            slice(&format!("svc-{i}-x"), &format!("svc-{i}"), "IPv4", eps),
        );
    }
    // Writes take what a real API server's do: the write-back's calls overlap the next events.
    fake.set_write_latency(Duration::from_millis(15));
    // The watcher as deploy/ runs it (its coalescing and batching), over plain HTTP on loopback.
    let token = std::env::temp_dir().join(format!("clb-mass-delete-{}", std::process::id()));
    std::fs::write(&token, "test-token").expect("token file");
    let mut args = watcher_args(
        "watcher.yaml",
        &[
            format!("--server={}", h.url()),
            format!("--token-file={}", token.display()),
        ],
    );
    args.tls_ca = None;
    args.insecure_plaintext = true;
    let watcher = RunningWatcher::start(args.config().expect("flags"), fake.watcher_clients());
    // Deleted as soon as every ingress is written: conditions are still being written then.
    wait("every Service has its ingress", || {
        fake.objects("services")
            .iter()
            .filter(|s| has_ingress(s))
            .count()
            == SERVICES
    })
    .await;

    let before = fake.patches().len();
    for i in 0..SERVICES {
        fake.delete("services", "default", &format!("svc-{i}"));
    }
    wait("every Service gone", || fake.objects("services").is_empty()).await;
    // A patch sent before the watcher saw the delete meets 409 (the watch is behind; a real API
    // server's too): that costs one refused patch per version at most. A patch sent again at a
    // version already refused, or built from facts older than what the write-back had received,
    // is one that could not succeed.
    let patches = fake.patches();
    let mut refused: BTreeMap<(String, String), usize> = BTreeMap::new();
    for p in patches[before..].iter().filter(|p| p.status == 409) {
        let rv = p
            .body
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        *refused.entry((p.path.clone(), rv)).or_default() += 1;
    }
    let again: Vec<_> = refused.iter().filter(|(_, n)| **n > 1).collect();
    eprintln!(
        "{} of {} patches after the delete met 409 Conflict",
        refused.values().sum::<usize>(),
        patches.len() - before
    );
    assert!(
        again.is_empty(),
        "{} patches after the delete met 409 Conflict; sent again at a version already refused: {again:?}",
        refused.values().sum::<usize>()
    );
    watcher.stop().await;
    h.shutdown().await;
}
