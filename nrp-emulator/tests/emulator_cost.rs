//! The NRP emulator's cost and fault model, long-running operations and control endpoints, over real
//! HTTP on loopback. No assertion depends on timing.

mod emulator_common;

use clb_nrp::wire::{OperationState, OperationStatus, ResourceKind};
use clb_nrp_emulator::{EmulatorConfig, Stats, ThrottleResponse};
use emulator_common::*;
use reqwest::{Method, StatusCode};
use serde_json::json;

#[tokio::test]
async fn concurrency_limit_throttles_parallel_mutations() {
    let h = Harness::start(EmulatorConfig {
        latency_ms: 500,
        max_concurrent_mutations: Some(1),
        retry_after_secs: 7,
        ..Default::default()
    })
    .await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    let calls = (0..8).map(|i| {
        let body = partial(vec![loc(&format!("10.0.0.{i}"), "PartialUpdate", &[])]);
        h.update_locations(&g, body)
    });
    let results = futures::future::join_all(calls).await;
    let throttled: Vec<_> = results
        .iter()
        .filter(|r| r.status == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    assert!(results.iter().any(|r| r.status == StatusCode::OK));
    assert!(
        !throttled.is_empty(),
        "8 parallel calls of 500 ms against a limit of 1"
    );
    for r in &throttled {
        assert_eq!(r.header("retry-after").as_deref(), Some("7"));
        assert_eq!(r.code(), "TooManyRequests");
    }
    let stats = h.emu().stats();
    assert_eq!(stats.max_concurrent_mutations, 1);
    assert_eq!(stats.throttled_by_limit, throttled.len() as u64);
    assert_eq!(stats.in_flight_mutations, 0);
}

#[tokio::test]
async fn concurrency_limit_counts_running_operations_and_can_answer_409() {
    // In LRO mode an accepted operation holds its gateway slot until it completes: with a long
    // latency, the next mutating call is refused deterministically.
    // The gateway actions are long-running operations at api-version 2025-05-01.
    let h = Harness::start(EmulatorConfig::default()).await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    h.create_gateway(&gw("other")).await;
    h.emu()
        .set_config(EmulatorConfig {
            latency_ms: 60_000,
            max_concurrent_mutations: Some(1),
            throttle_response: ThrottleResponse::AnotherOperationInProgress,
            long_running_operations: true,
            ..Default::default()
        })
        .unwrap();
    let v = "2025-05-01";
    let r = h
        .post_at(&g, "updateAddressLocations", partial(vec![]), v)
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
    let r = h
        .post_at(&g, "updateAddressLocations", partial(vec![]), v)
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.code(), "AnotherOperationInProgress");
    assert!(r.header("retry-after").is_some());
    // Another gateway is not affected.
    let r = h
        .post_at(&gw("other"), "updateAddressLocations", partial(vec![]), v)
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert_eq!(h.emu().stats().in_flight_mutations, 2);
}

async fn fault_sequence(h: &Harness, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for i in 0..n {
        let pip = id(ResourceKind::PublicIpAddress, &format!("pip{i}"));
        out.push(
            h.put(&pip, json!({"location": "eastus"}))
                .await
                .status
                .as_u16(),
        );
    }
    out
}

#[tokio::test]
async fn seeded_fault_injection_is_reproducible() {
    let cfg = EmulatorConfig {
        fault_rate_5xx: 0.25,
        fault_rate_429: 0.25,
        seed: Some(1234),
        ..Default::default()
    };
    let h = Harness::start(cfg.clone()).await;
    let first = fault_sequence(&h, 60).await;
    assert!(first.contains(&429));
    assert!(first.iter().any(|s| *s == 500 || *s == 503));
    assert!(first.iter().any(|s| *s == 200 || *s == 201));
    // Re-seeding through the control endpoint replays the same decisions.
    h.emu().reset();
    let r = h
        .control(
            Method::PUT,
            "config",
            Some(serde_json::to_value(&cfg).unwrap()),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let second = fault_sequence(&h, 60).await;
    assert_eq!(first, second);
    // A fresh emulator with the same seed too.
    let h2 = Harness::start(cfg).await;
    assert_eq!(fault_sequence(&h2, 60).await, first);
    let stats = h2.emu().stats();
    let injected: u64 = stats.faults_injected.values().sum();
    assert_eq!(
        injected as usize,
        first.iter().filter(|s| **s >= 429).count()
    );
    // Failed calls changed nothing: exactly the successful PUTs exist.
    let ok = first.iter().filter(|s| **s < 300).count();
    assert_eq!(h2.emu().dump().public_ip_addresses.len(), ok);
}

#[tokio::test]
async fn injected_timeouts_answer_504_and_may_apply() {
    let h = Harness::start(EmulatorConfig {
        fault_rate_timeout: 1.0,
        timeout_hold_ms: 10,
        ..Default::default()
    })
    .await;
    let pip = id(ResourceKind::PublicIpAddress, "p");
    let r = h.put(&pip, json!({"location": "eastus"})).await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(r.code(), "GatewayTimeout");
    assert!(h.emu().dump().public_ip_addresses.is_empty());
    // Reads are spared unless asked.
    assert_eq!(h.get(&pip, None).await.status, StatusCode::NOT_FOUND);
    let mut cfg = h.emu().config();
    cfg.timeout_applies_change = true;
    h.emu().set_config(cfg).unwrap();
    let r = h.put(&pip, json!({"location": "eastus"})).await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        h.emu().dump().public_ip_addresses.len(),
        1,
        "the change landed although the call timed out"
    );
    assert_eq!(h.emu().stats().faults_injected.get("timeout"), Some(&2));
}

#[tokio::test]
async fn injected_conflicts_answer_409_another_operation_in_progress_and_change_nothing() {
    let h = Harness::start(EmulatorConfig {
        fault_rate_409: 1.0,
        retry_after_secs: 2,
        ..Default::default()
    })
    .await;
    let pip = id(ResourceKind::PublicIpAddress, "p");
    let r = h.put(&pip, json!({"location": "eastus"})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    assert_eq!(r.code(), "AnotherOperationInProgress");
    assert_eq!(r.header("retry-after").as_deref(), Some("2"));
    assert!(h.emu().dump().public_ip_addresses.is_empty());
    // Reads are spared unless asked.
    assert_eq!(h.get(&pip, None).await.status, StatusCode::NOT_FOUND);
    assert_eq!(h.emu().stats().faults_injected.get("409"), Some(&1));
}

async fn wait_for_operation(h: &Harness, status_url: &str) -> OperationStatus {
    h.wait_for_operation(status_url).await
}

#[tokio::test]
async fn long_running_operations() {
    let h = Harness::start(EmulatorConfig {
        long_running_operations: true,
        latency_ms: 20,
        ..Default::default()
    })
    .await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    let pip = id(ResourceKind::PublicIpAddress, "p");
    let r = h.put(&pip, json!({"location": "eastus"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["properties"]["provisioningState"], "Updating");
    let status_url = r
        .header("azure-asyncoperation")
        .expect("Azure-AsyncOperation");
    let result_url = r.header("location").expect("Location");
    assert!(r.header("retry-after").is_some());
    let st = wait_for_operation(&h, &status_url).await;
    assert_eq!(st.status, OperationState::Succeeded);
    let r = h.call(Method::GET, &result_url, None).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["properties"]["provisioningState"], "Succeeded");
    assert!(r.body["properties"]["ipAddress"].is_string());
    // At 2025-05-01 the POST actions answer 202 (their operation URLs at the same api-version);
    // rule violations are still synchronous 400s.
    let v = "2025-05-01";
    let bad = partial(vec![loc(
        "10.0.0.1",
        "PartialUpdate",
        &[("10.1.0.1", &["nope"])],
    )]);
    let r = h.post_at(&g, "updateAddressLocations", bad, v).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.code(), "ServiceNotRegistered");
    let empty = partial(vec![loc("10.0.0.1", "PartialUpdate", &[])]);
    let r = h
        .post_at(&g, "updateAddressLocations", empty.clone(), v)
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    let status_url = r.header("azure-asyncoperation").unwrap();
    let location = r.header("location").unwrap();
    assert!(
        status_url.ends_with("?api-version=2025-05-01"),
        "{status_url}"
    );
    assert!(location.ends_with("?api-version=2025-05-01"), "{location}");
    let st = wait_for_operation(&h, &status_url).await;
    assert_eq!(st.status, OperationState::Succeeded);
    let r = h.call(Method::GET, &location, None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    // From 2025-09-01 on (here 2026-03-01) they are synchronous even in LRO mode: 200 with `{}`.
    let r = h
        .post_at(&g, "updateAddressLocations", empty, "2026-03-01")
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body, json!({}));
    assert!(r.header("azure-asyncoperation").is_none());
    // DELETE answers 202 as well; a DELETE of what does not exist 204 at once.
    let r = h.delete(&pip).await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    wait_for_operation(&h, &r.header("azure-asyncoperation").unwrap()).await;
    assert!(h.emu().dump().public_ip_addresses.is_empty());
    assert_eq!(h.delete(&pip).await.status, StatusCode::NO_CONTENT);
    let r = h.delete(&g).await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    let location = r.header("location").unwrap();
    wait_for_operation(&h, &r.header("azure-asyncoperation").unwrap()).await;
    assert_eq!(
        h.call(Method::GET, &location, None).await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(h.get(&g, None).await.code(), "ResourceNotFound");
    assert_eq!(h.delete(&g).await.status, StatusCode::NO_CONTENT);
    // The gateway's PUT, the PIP's PUT, one action at 2025-05-01, two DELETEs.
    assert_eq!(h.emu().stats().operations_started, 5);
}

#[tokio::test]
async fn control_endpoints() {
    let h = Harness::start(EmulatorConfig::default()).await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    h.register_inbound(&g, "svc").await;
    let body = partial(vec![loc(
        "10.0.0.1",
        "FullUpdate",
        &[("10.1.0.1", &["svc"]), ("10.1.0.2", &["svc"])],
    )]);
    assert_eq!(h.update_locations(&g, body).await.status, StatusCode::OK);
    let r = h.control(Method::GET, "stats", None).await;
    let stats: Stats = serde_json::from_value(r.body).unwrap();
    assert_eq!(stats.addresses_carried, 2);
    assert_eq!(stats.locations_carried, 1);
    assert_eq!(
        stats.calls_with_status("ServiceGateways_UpdateAddressLocations", 200),
        1
    );
    // Gateway, PIP, LB, updateServices, updateAddressLocations.
    assert_eq!(stats.mutating_calls, 5);
    let r = h.control(Method::GET, "dump", None).await;
    let gwd = &r.body["gateways"][0];
    assert_eq!(gwd["name"], "sg");
    assert_eq!(gwd["services"][0]["name"], "svc");
    assert_eq!(gwd["services"][0]["service_type"], "Inbound");
    assert_eq!(
        gwd["address_locations"][0]["addresses"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(r.body["load_balancers"].as_array().unwrap().len(), 1);
    let r = h
        .control(Method::PUT, "config", Some(json!({"fault_rate_5xx": 2.0})))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.code(), "InvalidEmulatorConfig");
    let r = h
        .control(
            Method::PUT,
            "config",
            Some(json!({"latency_ms": 1, "page_size": 2})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(h.emu().config().page_size, 2);
    let r = h.control(Method::GET, "config", None).await;
    assert_eq!(r.body["latency_ms"], 1);
    let r = h.control(Method::POST, "reset-stats", None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(h.emu().stats().calls, 0);
    assert_eq!(
        h.emu().dump().gateways.len(),
        1,
        "reset-stats keeps the state"
    );
    assert_eq!(
        h.control(Method::POST, "reset", None).await.status,
        StatusCode::NO_CONTENT
    );
    assert!(h.emu().dump().gateways.is_empty());
}

#[tokio::test]
async fn shutdown_does_not_wait_for_held_requests() {
    let h = Harness::start(EmulatorConfig {
        fault_rate_timeout: 1.0,
        timeout_hold_ms: 3_600_000,
        ..Default::default()
    })
    .await;
    let url = h.url(&id(ResourceKind::PublicIpAddress, "p"), None);
    let http = h.http.clone();
    let held = tokio::spawn(async move {
        http.put(url)
            .header("content-type", "application/json")
            .body(r#"{"location":"eastus"}"#)
            .send()
            .await
            .map(|r| r.status())
    });
    // Wait until the request is being held.
    while h.emu().stats().faults_injected.is_empty() {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    h.server.shutdown().await.unwrap();
    let status = held.await.unwrap().unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

const WRITES: &str = "x-ms-ratelimit-remaining-subscription-writes";

#[tokio::test]
async fn write_bucket_throttles_the_subscription_and_every_write_answer_says_what_is_left() {
    // A bucket of 4 writes refilled at one per 100 s: nothing refills during the test.
    let h = Harness::start(EmulatorConfig {
        write_bucket_size: Some(4),
        write_refill_per_sec: 0.01,
        ..Default::default()
    })
    .await;
    let g = gw("sg");
    let r = h.put(&g, json!({"location": "eastus"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.header(WRITES).as_deref(), Some("3"));
    // Reads are free and carry no write header.
    let r = h.get(&g, None).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header(WRITES), None);
    let r = h.update_locations(&g, partial(vec![])).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.header(WRITES).as_deref(), Some("2"));
    // Any write spends a write, whatever its outcome (here a DELETE of what does not exist).
    let r = h.delete(&id(ResourceKind::PublicIpAddress, "nope")).await;
    assert!(!r.status.is_server_error(), "{r:?}");
    assert_eq!(r.header(WRITES).as_deref(), Some("1"));
    let r = h.update_locations(&g, partial(vec![])).await;
    assert_eq!(r.header(WRITES).as_deref(), Some("0"));
    // Spent: 429 SubscriptionRequestsThrottled, Retry-After until the next token (100 s).
    let r = h.update_locations(&g, partial(vec![])).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.code(), "SubscriptionRequestsThrottled");
    assert_eq!(r.header("retry-after").as_deref(), Some("100"));
    assert_eq!(r.header(WRITES).as_deref(), Some("0"));
    // Another subscription has its own budget.
    let other = clb_nrp::wire::ResourceId::new("sub2", RG, ResourceKind::ServiceGateway, "sg");
    let r = h.put(&other, json!({"location": "eastus"})).await;
    assert!(r.status.is_success(), "{r:?}");
    assert_eq!(r.header(WRITES).as_deref(), Some("3"));
    let stats: Stats = h.emu().stats();
    assert_eq!(stats.throttled_by_write_budget, 1);
    assert_eq!(stats.rejected("SubscriptionRequestsThrottled"), 1);
    // The throttled call reached nothing behind ARM: 2 PUTs, 2 updates and the DELETE (of what
    // does not exist: 204) were applied, not the refused update.
    assert_eq!(stats.mutations_applied, 5);
    // A reset fills the budgets again.
    h.emu().reset();
    let r = h.put(&g, json!({"location": "eastus"})).await;
    assert_eq!(r.header(WRITES).as_deref(), Some("3"));
}

#[tokio::test]
async fn write_window_caps_writes_and_polls_are_free() {
    let h = Harness::start(EmulatorConfig {
        writes_per_window: Some(2),
        write_window_secs: 300,
        long_running_operations: true,
        ..Default::default()
    })
    .await;
    let g = gw("sg");
    let r = h.put(&g, json!({"location": "eastus"})).await;
    assert!(r.status.is_success(), "{r:?}");
    assert_eq!(r.header(WRITES).as_deref(), Some("1"));
    // Polling the operation is a read: free.
    let status_url = r.header("azure-asyncoperation").expect("an LRO");
    h.wait_for_operation(&status_url).await;
    let r = h.put(&gw("sg2"), json!({"location": "eastus"})).await;
    assert!(r.status.is_success(), "{r:?}");
    assert_eq!(r.header(WRITES).as_deref(), Some("0"));
    let r = h.delete(&g).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert_eq!(r.code(), "SubscriptionRequestsThrottled");
    // The first write leaves the 300 s window in (just under) 300 s.
    assert_eq!(r.header("retry-after").as_deref(), Some("300"));
    assert_eq!(r.header(WRITES).as_deref(), Some("0"));
    assert_eq!(h.emu().stats().throttled_by_write_budget, 1);
}

#[tokio::test]
async fn without_a_write_budget_no_answer_carries_the_header() {
    let h = Harness::start(EmulatorConfig::default()).await;
    let g = gw("sg");
    let r = h.put(&g, json!({"location": "eastus"})).await;
    assert!(r.status.is_success());
    assert_eq!(r.header(WRITES), None);
    for _ in 0..300 {
        let r = h.update_locations(&g, partial(vec![])).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header(WRITES), None);
    }
    assert_eq!(h.emu().stats().throttled_by_write_budget, 0);
}
