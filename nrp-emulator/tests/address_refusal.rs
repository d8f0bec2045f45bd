//! The emulator's control that refuses one address (`EmulatorConfig::refused_addresses`), over real
//! HTTP on loopback: a call carrying it is refused whole, with the configured code and a message
//! that names the address or no IP at all; a call without it goes through.

mod emulator_common;

use clb_nrp_emulator::{AddressRefusal, EmulatorConfig};
use emulator_common::*;
use reqwest::{Method, StatusCode};
use serde_json::json;

fn refusing(refusals: Vec<AddressRefusal>) -> EmulatorConfig {
    EmulatorConfig {
        refused_addresses: refusals,
        ..Default::default()
    }
}

/// How many addresses gateway `sg` holds.
fn addresses(h: &Harness) -> usize {
    h.emu().dump().gateway("sg").unwrap().address_map().len()
}

/// The IP literals of `text` (any token that parses as one, quotes and punctuation trimmed).
fn ips_in(text: &str) -> Vec<std::net::IpAddr> {
    text.split(|c: char| c.is_whitespace() || c == '\'' || c == '"' || c == ',')
        .filter_map(|t| t.trim_end_matches(['.', ')', ':']).parse().ok())
        .collect()
}

#[tokio::test]
async fn a_call_carrying_a_refused_address_is_refused_whole_and_names_it() {
    let h = Harness::start(refusing(vec![AddressRefusal::new(
        "10.1.0.7".parse().unwrap(),
    )]))
    .await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    h.register_inbound(&g, "svc-a").await;
    h.register_inbound(&g, "svc-b").await;

    let body = partial(vec![
        loc("10.0.0.1", "FullUpdate", &[("10.1.0.1", &["svc-a"])]),
        loc(
            "10.0.0.2",
            "PartialUpdate",
            &[("10.1.0.2", &["svc-a"]), ("10.1.0.7", &["svc-b"])],
        ),
        loc("10.0.0.3", "PartialUpdate", &[("10.1.0.3", &["svc-b"])]),
    ]);
    let r = h.update_locations(&g, body).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
    assert_eq!(r.code(), "AddressRefusedByPolicy");
    let message = r.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("'10.1.0.7'"), "{message}");
    assert!(message.contains("'10.0.0.2'"), "the location: {message}");
    assert_eq!(addresses(&h), 0, "the whole call changed nothing");
    assert_eq!(h.emu().stats().rejected("AddressRefusedByPolicy"), 1);

    // In a full update or a partial one, with any services, a deletion (no services) included,
    // among other addresses or alone.
    for action in ["PartialUpdate", "FullUpdate"] {
        for services in [&["svc-a"][..], &[]] {
            for others in [&[][..], &[("10.1.0.8", &["svc-a"][..])]] {
                let mut addresses = others.to_vec();
                addresses.push(("10.1.0.7", services));
                let r = h
                    .update_locations(&g, partial(vec![loc("10.0.0.9", action, &addresses)]))
                    .await;
                assert_eq!(
                    r.status,
                    StatusCode::BAD_REQUEST,
                    "{action} {services:?}: {r:?}"
                );
                assert_eq!(
                    r.code(),
                    "AddressRefusedByPolicy",
                    "{action} {services:?}: {r:?}"
                );
            }
        }
    }
    assert_eq!(addresses(&h), 0, "none of them changed anything");

    // A call without it goes through.
    let r = h
        .update_locations(
            &g,
            partial(vec![
                loc("10.0.0.1", "FullUpdate", &[("10.1.0.1", &["svc-a"])]),
                loc("10.0.0.2", "PartialUpdate", &[("10.1.0.2", &["svc-a"])]),
            ]),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(addresses(&h), 2);

    // The control is run-time configuration: lifted, the refused call goes through.
    h.emu().set_config(EmulatorConfig::default()).unwrap();
    let r = h
        .update_locations(
            &g,
            partial(vec![loc(
                "10.0.0.2",
                "PartialUpdate",
                &[("10.1.0.7", &["svc-b"])],
            )]),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
}

#[tokio::test]
async fn a_refusal_may_name_no_address_and_carry_its_own_code() {
    let h = Harness::start(EmulatorConfig {
        single_ip_version_pools: false,
        ..refusing(vec![AddressRefusal {
            address: "fd01::1".parse().unwrap(),
            code: "BackendPoolAddressesMustHaveSameIpVersion".into(),
            name_address: false,
        }])
    })
    .await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    h.register_inbound(&g, "svc-a").await;
    for action in ["PartialUpdate", "FullUpdate"] {
        let r = h
            .update_locations(
                &g,
                partial(vec![
                    loc("10.0.0.1", "FullUpdate", &[("10.1.0.1", &["svc-a"])]),
                    // Written in another form: compared as an IP.
                    loc("fd00::1", action, &[("fd01:0::0001", &["svc-a"])]),
                ]),
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{action}: {r:?}");
        assert_eq!(r.code(), "BackendPoolAddressesMustHaveSameIpVersion");
        let message = r.body["error"]["message"].as_str().unwrap();
        assert!(ips_in(message).is_empty(), "names no IP: {message}");
    }
    assert_eq!(addresses(&h), 0, "the whole call changed nothing");
}

#[tokio::test]
async fn the_refusal_is_synchronous_for_a_long_running_call_and_set_through_the_control_api() {
    let h = Harness::start(EmulatorConfig::default()).await;
    let g = gw("sg");
    h.create_gateway(&g).await;
    h.register_inbound(&g, "svc-a").await;
    // Long-running from now on, and refusing 10.1.0.7.
    let r = h
        .control(
            Method::PUT,
            "config",
            Some(json!({"long_running_operations": true,
                        "refused_addresses": [{"address": "10.1.0.7", "code": "QuotaOfAddresses"}]})),
        )
        .await;
    assert!(r.status.is_success(), "{r:?}");
    let body = partial(vec![loc(
        "10.0.0.1",
        "PartialUpdate",
        &[("10.1.0.1", &["svc-a"]), ("10.1.0.7", &["svc-a"])],
    )]);
    // At 2025-05-01 the action is long-running: a refusal is still a synchronous 400.
    let r = h
        .post_at(&g, "updateAddressLocations", body, "2025-05-01")
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
    assert_eq!(r.code(), "QuotaOfAddresses");
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'10.1.0.7'")
    );
    // A configuration whose refusal has no code is refused.
    let r = h
        .control(
            Method::PUT,
            "config",
            Some(json!({"refused_addresses": [{"address": "10.1.0.7", "code": ""}]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
}
