//! `updateServices` with many services in one call, as the REST specification's
//! `ServiceGatewayUpdateServicesRequest.serviceRequests` (a list) allows and as the worker sends a
//! service unit's registrations (issue 36): one write of the subscription's budget whatever the
//! number of services, and all or nothing — a request NRP refuses leaves every service as it was.

mod emulator_common;

use clb_nrp::wire::ResourceKind;
use clb_nrp_emulator::EmulatorConfig;
use emulator_common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

fn inbound(name: &str, pool: &str) -> Value {
    json!({"isDelete": false, "service": {"name": name,
        "properties": {"serviceType": "Inbound", "loadBalancerBackendPools": [{"id": pool}]}}})
}

fn registered(h: &Harness) -> Vec<String> {
    let mut names: Vec<String> = h.emu().dump().gateways[0]
        .services
        .iter()
        .map(|s| s.name.clone())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn many_services_register_in_one_call_for_one_write() {
    let h = Harness::start(EmulatorConfig {
        write_bucket_size: Some(200),
        ..EmulatorConfig::default()
    })
    .await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    let mut requests = Vec::new();
    for i in 0..5 {
        let pool = h.create_lb(&format!("lb-{i}")).await;
        requests.push(inbound(&format!("svc-{i}"), &pool));
    }
    h.emu().reset_stats();
    let r = h
        .post(
            &g,
            "updateServices",
            json!({"action": "PartialUpdate", "serviceRequests": requests}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(
        registered(&h),
        ["svc-0", "svc-1", "svc-2", "svc-3", "svc-4"]
    );
    let stats = h.emu().stats();
    assert_eq!(
        (stats.mutating_calls, stats.mutations_applied),
        (1, 1),
        "{stats:?}"
    );

    // One request NRP refuses (its pool does not exist): the whole call is refused, naming it,
    // and nothing changes — unregistering svc-0 and registering svc-5 included.
    let missing = id(ResourceKind::LoadBalancer, "nope").backend_pool_id("pool");
    let r = h
        .post(
            &g,
            "updateServices",
            json!({"action": "PartialUpdate", "serviceRequests": [
                {"isDelete": true, "service": {"name": "svc-0"}},
                inbound("svc-5", &h.create_lb("lb-5").await),
                inbound("svc-6", &missing),
            ]}),
        )
        .await;
    assert_eq!(r.code(), "InvalidResourceReference", "{r:?}");
    let message = r.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("'svc-6'"), "{r:?}");
    assert_eq!(
        registered(&h),
        ["svc-0", "svc-1", "svc-2", "svc-3", "svc-4"]
    );
}
