//! Events about brought NAT gateways (issue 24), end to end: the fake Kubernetes API, the cluster
//! watcher (which reports the egress pods itself, `--pods=true`) with its write-back, the state
//! server, workers and the NRP emulator over loopback. A StandardV2 NAT gateway gives `Linked` on
//! one pod per namespace of the egress, a Standard one `Rejected`, a missing one `Unreadable`; a
//! linked one its owner deletes out of band gives `Deleted` and the gauge
//! `clb_server_nat_gateways_missing`, and is never created again by clb; re-created by its owner,
//! it is linked again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clb_nrp::azure::{ArmClient, ArmConfig};
use clb_nrp::wire::{NatGateway, Sku};
use clb_nrp::{CallOptions, Nrp};
use clb_tests::fake_kube::FakeApi;
use clb_tests::kube_objects::{RunningWatcher, node, pod, test_config};
use clb_tests::metrics_check::{Exposition, Format};
use clb_tests::{GATEWAY, Harness, Options, PATIENCE, init_tracing};
use clb_watcher::{Mode, NAT_GATEWAY_ANNOTATION, REPORTING_CONTROLLER};
use serde_json::{Value, json};

/// The VNet's resource group, where egresses bring their NAT gateways from.
const VNET_RG: &str = "rg-vnet";
/// The harness's subscription (`WorkerProc::arm_client`).
const SUB: &str = "sub-e2e";
const NODE_IP: &str = "10.0.0.1";

async fn start() -> (Harness, FakeApi, RunningWatcher) {
    init_tracing();
    let mut options = Options::e2e();
    options.nat_gateway_resource_group = Some(VNET_RG.into());
    options.server.dispatch.anti_entropy_interval = Duration::from_millis(200);
    let h = Harness::start(options).await;
    let fake = FakeApi::start().await;
    fake.put("nodes", node("n1", &[NODE_IP]));
    let config = test_config(&h.url(), Mode::Cluster { pods: true });
    let w = RunningWatcher::start(config, fake.watcher_clients());
    (h, fake, w)
}

/// A client of the VNet's resource group, as the NAT gateways' owner uses it.
fn owner(h: &Harness) -> Arc<dyn Nrp> {
    let mut arm = ArmConfig::new(SUB, VNET_RG).with_endpoint(h.nrp_url());
    arm.poll_interval = Duration::from_millis(5);
    Arc::new(ArmClient::new(arm, None).expect("valid ARM config"))
}

async fn make_nat_gateway(h: &Harness, name: &str, sku: &str) {
    let body = NatGateway {
        location: Some("eastus".into()),
        sku: Some(Sku {
            name: sku.into(),
            tier: None,
        }),
        ..Default::default()
    };
    owner(h)
        .put_nat_gateway(name, &body, CallOptions::none())
        .await
        .expect("NAT gateway");
}

/// Pod `namespace/name` of egress `egress` bringing NAT gateway `nat`, created at second `created`.
fn egress_pod(
    namespace: &str,
    name: &str,
    ip: &str,
    egress: &str,
    nat: &str,
    created: i64,
) -> Value {
    let mut p = pod(name, "n1", &[ip], Some(egress));
    p["metadata"]["namespace"] = json!(namespace);
    p["metadata"]["annotations"] = json!({ NAT_GATEWAY_ANNOTATION: nat });
    p["metadata"]["creationTimestamp"] = json!(format!("2026-01-01T00:00:{created:02}Z"));
    p["status"]["hostIP"] = json!(NODE_IP);
    p
}

/// Our Events of `reason` as (namespace, regarded pod), sorted.
fn events(fake: &FakeApi, reason: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = fake
        .events()
        .into_iter()
        .filter(|e| e["reason"] == reason && e["reportingController"] == REPORTING_CONTROLLER)
        .map(|e| {
            assert_eq!(e["regarding"]["kind"], "Pod", "{e}");
            assert_eq!(
                e["regarding"]["namespace"], e["metadata"]["namespace"],
                "in the pod's namespace: {e}"
            );
            (
                e["regarding"]["namespace"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
                e["regarding"]["name"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

fn note(fake: &FakeApi, reason: &str, pod: &str) -> String {
    fake.events()
        .into_iter()
        .find(|e| e["reason"] == reason && e["regarding"]["name"] == pod)
        .and_then(|e| e["note"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

async fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let end = Instant::now() + PATIENCE;
    while !ok() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn list_calls(h: &Harness) -> u64 {
    h.emulator()
        .stats()
        .calls_by_operation
        .get("ServiceGateways_GetServices")
        .map_or(0, |by| by.values().sum())
}

fn nat_puts(h: &Harness) -> u64 {
    h.emulator()
        .stats()
        .calls_by_operation
        .get("NatGateways_CreateOrUpdate")
        .map_or(0, |by| by.values().sum())
}

fn nat_exists(h: &Harness, name: &str) -> bool {
    h.emulator()
        .dump()
        .nat_gateways
        .iter()
        .any(|n| n.name.as_deref() == Some(name))
}

/// `clb_server_nat_gateways_missing{gateway}` as the server's Prometheus text shows it.
fn missing_gauge(h: &Harness) -> f64 {
    let state = &h.server().state;
    state.metrics().refresh_from(state);
    let text = state.metrics().encode_prometheus();
    let parsed = Exposition::parse(&text, Format::Prometheus).expect("Prometheus text parses");
    parsed
        .value("clb_server_nat_gateways_missing", &[("gateway", GATEWAY)])
        .unwrap_or(-1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn linked_rejected_and_unreadable_events_regard_one_pod_per_namespace() {
    let (h, fake, w) = start().await;
    make_nat_gateway(&h, "natgw-v2", "StandardV2").await;
    make_nat_gateway(&h, "natgw-std", "Standard").await;
    for p in [
        egress_pod("apps", "crawler-b", "10.1.0.2", "crawler", "natgw-v2", 1),
        egress_pod("apps", "crawler-a", "10.1.0.3", "crawler", "natgw-v2", 2),
        egress_pod("jobs", "batch-0", "10.1.0.4", "crawler", "natgw-v2", 3),
        egress_pod("apps", "legacy-0", "10.1.0.5", "legacy", "natgw-std", 4),
    ] {
        fake.put("pods", p);
    }
    // Linked: in each namespace with pods of the egress, on the oldest one there.
    wait_for("Linked events", || events(&fake, "Linked").len() >= 2).await;
    wait_for("Rejected event", || !events(&fake, "Rejected").is_empty()).await;
    // (A unit reports one error, which every change of it that failed is parked with: the missing
    // one comes once the other is parked, in a unit of its own.)
    fake.put(
        "pods",
        egress_pod("apps", "lost-0", "10.1.0.6", "lost", "no-such-natgw", 5),
    );
    wait_for("Unreadable event", || {
        !events(&fake, "Unreadable").is_empty()
    })
    .await;
    // A few read-backs later: still one Event per state change, not one per push or read-back.
    let lists = list_calls(&h);
    wait_for("two read-backs", || list_calls(&h) >= lists + 2).await;
    assert_eq!(
        events(&fake, "Linked"),
        [
            ("apps".to_owned(), "crawler-b".to_owned()),
            ("jobs".to_owned(), "batch-0".to_owned())
        ]
    );
    let linked = note(&fake, "Linked", "crawler-b");
    assert!(
        linked.contains("natgw-v2") && linked.contains("crawler"),
        "{linked}"
    );
    assert_eq!(
        events(&fake, "Rejected"),
        [("apps".to_owned(), "legacy-0".to_owned())]
    );
    let rejected = note(&fake, "Rejected", "legacy-0");
    assert!(
        rejected.contains("NatGatewayNotStandardV2") && rejected.contains("natgw-std"),
        "{rejected}"
    );
    assert_eq!(
        events(&fake, "Unreadable"),
        [("apps".to_owned(), "lost-0".to_owned())]
    );
    let unreadable = note(&fake, "Unreadable", "lost-0");
    assert!(
        unreadable.contains("NatGatewayNotFound") && unreadable.contains("no-such-natgw"),
        "{unreadable}"
    );
    for e in fake.events() {
        let warning = matches!(e["reason"].as_str(), Some("Rejected" | "Unreadable"));
        assert_eq!(e["type"], if warning { "Warning" } else { "Normal" }, "{e}");
    }
    assert!(
        !nat_exists(&h, "no-such-natgw"),
        "a missing NAT gateway is not created"
    );
    w.stop().await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_nat_gateway_deleted_out_of_band_is_reported_never_created_again_and_relinked_when_back()
{
    let (h, fake, w) = start().await;
    make_nat_gateway(&h, "natgw-v2", "StandardV2").await;
    fake.put(
        "pods",
        egress_pod("apps", "crawler-0", "10.1.0.2", "crawler", "natgw-v2", 1),
    );
    wait_for("Linked", || events(&fake, "Linked").len() == 1).await;
    assert_eq!(missing_gauge(&h), 0.0);

    // Its owner deletes it while the egress uses it (the emulator lets that happen).
    let mut config = h.emulator().config();
    config.delete_nat_gateways_in_use = true;
    h.emulator().set_config(config).expect("valid config");
    owner(&h)
        .delete_nat_gateway("natgw-v2", CallOptions::none())
        .await
        .expect("deleted out of band");
    let puts = nat_puts(&h);
    wait_for("Deleted", || !events(&fake, "Deleted").is_empty()).await;
    assert_eq!(
        events(&fake, "Deleted"),
        [("apps".to_owned(), "crawler-0".to_owned())]
    );
    let deleted = note(&fake, "Deleted", "crawler-0");
    assert!(
        deleted.contains("natgw-v2") && deleted.contains("does not create"),
        "{deleted}"
    );
    wait_for("the gauge", || missing_gauge(&h) == 1.0).await;
    // Read-backs go on: nothing creates it again.
    let lists = list_calls(&h);
    wait_for("three read-backs", || list_calls(&h) >= lists + 3).await;
    assert!(!nat_exists(&h, "natgw-v2"), "not created again");
    assert_eq!(nat_puts(&h), puts, "no PUT of a NAT gateway");
    assert_eq!(
        events(&fake, "Deleted").len(),
        1,
        "one Event, not one per read-back"
    );

    // Its owner makes it again: clb links the new one and says so.
    make_nat_gateway(&h, "natgw-v2", "StandardV2").await;
    wait_for("linked again", || {
        h.emulator().dump().nat_gateways.iter().any(|n| {
            n.name.as_deref() == Some("natgw-v2") && n.properties.service_gateway.is_some()
        })
    })
    .await;
    wait_for("the gauge back to 0", || missing_gauge(&h) == 0.0).await;
    wait_for("a second Linked", || {
        fake.events()
            .iter()
            .filter(|e| e["reason"] == "Linked")
            .map(|e| e["series"]["count"].as_u64().unwrap_or(1))
            .sum::<u64>()
            >= 2
    })
    .await;
    w.stop().await;
    h.shutdown().await;
}
