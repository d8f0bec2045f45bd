//! The refused-address scenario of issue 34, shared by `tests/tests/refusals.rs` and the
//! `refusal_containment` benchmark: the emulator refuses every call that carries [`REFUSED`]
//! (`EmulatorConfig::refused_addresses`), naming it in its message or not; `svc-a` has one address
//! at each of 8 nodes plus [`REFUSED`] at node 3.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use clb_client::updates;
use clb_embedded::{GATEWAY, Harness, Options, PATIENCE};
use clb_nrp_emulator::AddressRefusal;

/// The address NRP refuses.
pub const REFUSED: &str = "10.1.0.77";
/// The code it refuses it with.
pub const CODE: &str = "AddressRefusedByPolicy";
/// The node (location) of [`REFUSED`].
pub const REFUSED_NODE: &str = "10.0.0.3";

/// Makes the emulator of `options` refuse every call that carries [`REFUSED`], naming it in its
/// message when `name_address`.
pub fn refuse(options: &mut Options, name_address: bool) {
    options.emulator.refused_addresses = vec![AddressRefusal {
        address: REFUSED.parse::<IpAddr>().expect("an address"),
        code: CODE.into(),
        name_address,
    }];
}

/// The addresses of `svc-a` NRP accepts: `10.1.0.{i}` at `10.0.0.{i}`, i in 1..=8.
pub fn good_addresses() -> Vec<String> {
    (1..=8).map(|i| format!("10.1.0.{i}")).collect()
}

/// `svc-a`'s endpoints: [`good_addresses`], with [`REFUSED`] at node 3 when `with_refused`.
pub fn endpoints(with_refused: bool) -> Vec<clb_proto::v1::Endpoint> {
    let mut endpoints: Vec<_> = (1..=8)
        .map(|i| updates::endpoint(&format!("10.1.0.{i}"), &format!("10.0.0.{i}")))
        .collect();
    if with_refused {
        endpoints.push(updates::endpoint(REFUSED, REFUSED_NODE));
    }
    endpoints
}

/// `svc-a` (IPv4) at 8 nodes, plus [`REFUSED`] at node 3.
pub fn view() -> Vec<clb_proto::v1::Update> {
    vec![
        updates::service_add_family("svc-a", &[], clb_proto::v1::IpFamily::Ipv4),
        updates::endpoints_level("svc-a", endpoints(true)),
    ]
}

/// `service` (IPv4) with one endpoint, `address` at [`REFUSED_NODE`].
pub fn at_refused_node(service: &str, address: &str) -> Vec<clb_proto::v1::Update> {
    vec![
        updates::service_add_family(service, &[], clb_proto::v1::IpFamily::Ipv4),
        updates::endpoints_level(service, vec![updates::endpoint(address, REFUSED_NODE)]),
    ]
}

/// The addresses NRP holds for `service`, sorted.
pub fn in_nrp(h: &Harness, service: &str) -> Vec<String> {
    let mut got: Vec<String> = h
        .emulator()
        .dump()
        .gateway(GATEWAY)
        .map(|g| {
            g.address_map()
                .into_iter()
                .filter(|(_, services)| services.contains(service))
                .map(|((_, address), _)| address)
                .collect()
        })
        .unwrap_or_default();
    got.sort();
    got
}

/// Calls NRP refused with [`CODE`] so far.
pub fn refused_calls(h: &Harness) -> u64 {
    h.emulator().stats().rejected(CODE)
}

/// Waits until NRP holds `want` for `service` (and more, maybe); panics after [`PATIENCE`].
pub async fn wait_in_nrp(h: &Harness, service: &str, want: &[String]) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let got = in_nrp(h, service);
        if want.iter().all(|a| got.contains(a)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "NRP never held {want:?} for {service}: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
