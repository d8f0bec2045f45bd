//! IP families in the worker's sagas, against the real NRP emulator (Azure's one-version rules on,
//! its default): an IPv6 inbound service gets an IPv6 public IP (`publicIPAddressVersion: IPv6`)
//! under its load balancer's frontend and reports an IPv6 frontend; an IPv4 or unspecified one an
//! IPv4 public IP, as before; each family's addresses then register to their own service.

#[path = "worker/harness.rs"]
mod harness;

use std::collections::BTreeMap;
use std::net::IpAddr;

use clb_nrp::wire::IpVersion;
use clb_proto::v1::{self, IpFamily};
use harness::*;

fn of_family(name: &str, family: IpFamily) -> v1::ServiceChange {
    let mut c = inbound(name, Create);
    c.set_ip_family(family);
    c
}

#[tokio::test]
async fn each_family_s_service_gets_a_public_ip_of_its_version() {
    let mut h = Harness::default().await;
    let mut conn = h.conn().await;
    let r = conn
        .run(services(
            1,
            vec![
                of_family("svc", IpFamily::Ipv4),
                of_family("svc-v6", IpFamily::Ipv6),
                of_family("legacy", IpFamily::Unspecified),
            ],
        ))
        .await;
    assert_applied(&r);
    let dump = h.emulator().dump();
    let versions: BTreeMap<String, IpVersion> = dump
        .public_ip_addresses
        .iter()
        .map(|p| {
            (
                p.name.clone().unwrap(),
                p.properties.public_ip_address_version.clone().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        versions,
        BTreeMap::from([
            ("pip-legacy".to_owned(), IpVersion::V4),
            ("pip-svc".to_owned(), IpVersion::V4),
            ("pip-svc-v6".to_owned(), IpVersion::V6),
        ])
    );
    let lb6 = dump
        .load_balancers
        .iter()
        .find(|l| l.name.as_deref() == Some("lb-svc-v6"))
        .unwrap();
    assert!(
        lb6.properties.frontend_ip_configurations[0]
            .properties
            .public_ip_address
            .as_ref()
            .unwrap()
            .id
            .ends_with("/publicIPAddresses/pip-svc-v6")
    );
    let frontends: BTreeMap<String, IpAddr> = r
        .frontends
        .iter()
        .map(|f| (f.service_id.clone(), f.ip.parse().unwrap()))
        .collect();
    assert!(frontends["svc-v6"].is_ipv6(), "{frontends:?}");
    assert!(frontends["svc"].is_ipv4() && frontends["legacy"].is_ipv4());

    // Each family's addresses to its own service: NRP accepts them.
    let r = conn
        .run(locations(
            2,
            vec![
                location("10.0.0.1", true, &[("10.1.0.1", &["svc"])]),
                location("fd00::1", true, &[("fd01::1", &["svc-v6"])]),
            ],
        ))
        .await;
    assert_applied(&r);
    // An IPv4 address for the IPv6 service is what Azure refuses (NAT44/NAT66 only; here the
    // pool's own IPv6 address makes the one-version pool rule answer first).
    let r = conn
        .run(locations(
            3,
            vec![location("10.0.0.2", true, &[("10.1.0.2", &["svc-v6"])])],
        ))
        .await;
    assert_eq!(repair(&r).code, "BackendPoolAddressesMustHaveSameIpVersion");
    // The deletion saga needs no family: it removes what the name says.
    assert_applied(&conn.run(services(4, vec![inbound("legacy", Delete)])).await);
    assert!(
        h.emulator()
            .dump()
            .public_ip_addresses
            .iter()
            .all(|p| p.name.as_deref() != Some("pip-legacy"))
    );
    h.shutdown().await;
}

fn egress(name: &str, families: &[IpFamily]) -> v1::ServiceChange {
    let mut c = outbound(name, Create);
    c.egress_families = families.iter().map(|f| *f as i32).collect();
    c
}

/// The public IPs of NAT gateway `natgw-{name}`: (IPv4 ids, IPv6 ids).
fn nat_ips(h: &Harness, name: &str) -> (Vec<String>, Vec<String>) {
    let dump = h.emulator().dump();
    let nat = dump
        .nat_gateways
        .iter()
        .find(|n| n.name.as_deref() == Some(&format!("natgw-{name}")))
        .expect("NAT gateway");
    assert_eq!(nat.sku.as_ref().unwrap().name, "StandardV2");
    let ids = |l: &[clb_nrp::wire::SubResource]| l.iter().map(|s| s.id.clone()).collect();
    (
        ids(&nat.properties.public_ip_addresses),
        ids(&nat.properties.public_ip_addresses_v6),
    )
}

#[tokio::test]
async fn an_egress_with_ipv6_pods_gets_an_ipv6_public_ip_on_its_nat_gateway() {
    let mut h = Harness::default().await;
    let mut conn = h.conn().await;
    // IPv4 only (or a server from before the field): one IPv4 public IP.
    let r = conn
        .run(services(
            1,
            vec![egress("eg", &[]), egress("eg4", &[IpFamily::Ipv4])],
        ))
        .await;
    assert_applied(&r);
    let (v4, v6) = nat_ips(&h, "eg");
    assert!(v4[0].ends_with("/publicIPAddresses/pip-eg") && v6.is_empty());
    // An IPv6 address of the egress is refused while its NAT gateway has no IPv6 public IP.
    let r = conn
        .run(locations(
            2,
            vec![location("fd00::1", true, &[("fd01::1", &["eg"])])],
        ))
        .await;
    assert_eq!(repair(&r).code, "OutboundServiceHasNoIpv6PublicIp");

    // The creation sent again with IPv6: `pip-eg-v6`, attached as publicIpAddressesV6.
    let r = conn
        .run(services(
            3,
            vec![egress("eg", &[IpFamily::Ipv4, IpFamily::Ipv6])],
        ))
        .await;
    assert_applied(&r);
    let (v4, v6) = nat_ips(&h, "eg");
    assert_eq!(v4.len(), 1);
    assert!(v6[0].ends_with("/publicIPAddresses/pip-eg-v6"), "{v6:?}");
    let dump = h.emulator().dump();
    let pip6 = dump
        .public_ip_addresses
        .iter()
        .find(|p| p.name.as_deref() == Some("pip-eg-v6"))
        .unwrap();
    assert_eq!(
        pip6.properties.public_ip_address_version,
        Some(IpVersion::V6)
    );
    assert_eq!(pip6.sku.as_ref().unwrap().name, "StandardV2");
    let r = conn
        .run(locations(
            4,
            vec![
                location("fd00::1", true, &[("fd01::1", &["eg"])]),
                location("10.0.0.1", true, &[("10.1.0.1", &["eg"])]),
            ],
        ))
        .await;
    assert_applied(&r);

    // The deletion (after the drain) removes both public IPs.
    let r = conn
        .run(locations(
            5,
            vec![
                location("fd00::1", true, &[]),
                location("10.0.0.1", true, &[]),
            ],
        ))
        .await;
    assert_applied(&r);
    assert_applied(
        &conn
            .run(services(
                6,
                vec![outbound("eg", Delete), outbound("eg4", Delete)],
            ))
            .await,
    );
    let dump = h.emulator().dump();
    assert!(dump.nat_gateways.is_empty());
    assert!(
        dump.public_ip_addresses.is_empty(),
        "{:?}",
        dump.public_ip_addresses
    );
    h.shutdown().await;
}
