//! Parsing and canonicalisation of addresses and locations.

use std::net::IpAddr;

use super::error::{InvalidInput, Reason};

/// Parses an IP string into its canonical form (IPv4-mapped IPv6 becomes IPv4).
pub fn parse_ip(field: &str, value: &str) -> Result<IpAddr, InvalidInput> {
    if value.is_empty() {
        return Err(InvalidInput::new(field, value, Reason::Empty));
    }
    let ip: IpAddr = value
        .parse()
        .map_err(|_| InvalidInput::new(field, value, Reason::MalformedIp))?;
    let ip = ip.to_canonical();
    let unicast = match ip {
        IpAddr::V4(v4) => !(v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast()),
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_multicast()),
    };
    if !unicast {
        return Err(InvalidInput::new(field, value, Reason::NotUnicast));
    }
    Ok(ip)
}

/// The family name used in messages.
pub fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

/// Parses an address and its location (both canonical) and checks they are of one family.
pub fn parse_address_at(
    address_field: &str,
    address: &str,
    location_field: &str,
    location: &str,
) -> Result<(IpAddr, IpAddr), InvalidInput> {
    let loc = parse_ip(location_field, location)?;
    let addr = parse_ip(address_field, address)?;
    if addr.is_ipv4() != loc.is_ipv4() {
        return Err(InvalidInput::new(
            address_field,
            address,
            Reason::MixedFamily {
                family: family(addr),
                location: loc.to_string(),
                location_family: family(loc),
            },
        ));
    }
    Ok((addr, loc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonicalises_ipv6_and_mapped_ipv4() {
        assert_eq!(
            parse_ip("a", "2001:DB8:0:0::1").unwrap().to_string(),
            "2001:db8::1"
        );
        assert_eq!(
            parse_ip("a", "::ffff:10.0.0.1").unwrap().to_string(),
            "10.0.0.1"
        );
    }

    #[test]
    fn malformed_and_non_unicast_ips_are_rejected_with_the_field() {
        for bad in [
            "10.0.0",
            "10.0.0.256",
            " 10.0.0.1",
            "010.0.0.1",
            "fe80::1%eth0",
            "x",
        ] {
            let err = parse_ip("pod.address", bad).unwrap_err();
            assert_eq!(err.field, "pod.address");
            assert_eq!(err.value, bad);
            assert_eq!(err.reason, Reason::MalformedIp, "{bad}");
        }
        for bad in ["0.0.0.0", "224.0.0.1", "255.255.255.255", "::", "ff02::1"] {
            assert_eq!(parse_ip("a", bad).unwrap_err().reason, Reason::NotUnicast);
        }
        assert_eq!(parse_ip("a", "").unwrap_err().reason, Reason::Empty);
    }

    #[test]
    fn mixed_families_are_rejected() {
        let err = parse_address_at("address", "fd00::5", "location", "10.0.0.1").unwrap_err();
        assert_eq!(err.field, "address");
        assert!(matches!(err.reason, Reason::MixedFamily { .. }));
        assert!(
            err.to_string()
                .contains("IPv6 but its location 10.0.0.1 is IPv4")
        );
    }
}
