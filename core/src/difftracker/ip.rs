//! Parsing and canonicalisation of addresses and locations.

use std::net::{IpAddr, Ipv4Addr};

use super::error::{InvalidInput, Reason};

/// The common case, a dotted-quad IPv4 address, parsed without the standard parser's generality.
/// Accepts exactly what `Ipv4Addr::from_str` accepts of such strings (four decimal octets of one to
/// three digits, no leading zero, at most 255); `None` for anything else, which the standard parser
/// then decides.
#[inline]
fn parse_ipv4_fast(s: &[u8]) -> Option<Ipv4Addr> {
    if !(7..=15).contains(&s.len()) {
        return None;
    }
    let mut octets = [0u8; 4];
    let mut n = 0;
    let (mut value, mut digits) = (0u32, 0u32);
    for &b in s {
        if b == b'.' {
            if digits == 0 || n == 3 || value > 255 {
                return None;
            }
            octets[n] = value as u8;
            n += 1;
            (value, digits) = (0, 0);
        } else {
            let d = b.wrapping_sub(b'0');
            // A fourth digit, or a digit after a leading zero: not what the standard parser takes.
            if d > 9 || digits == 3 || (digits == 1 && value == 0) {
                return None;
            }
            value = value * 10 + u32::from(d);
            digits += 1;
        }
    }
    if digits == 0 || n != 3 || value > 255 {
        return None;
    }
    octets[3] = value as u8;
    Some(Ipv4Addr::from(octets))
}

/// Parses an IP string into its canonical form (IPv4-mapped IPv6 becomes IPv4).
pub fn parse_ip(field: &str, value: &str) -> Result<IpAddr, InvalidInput> {
    if value.is_empty() {
        return Err(InvalidInput::new(field, value, Reason::Empty));
    }
    let ip = match parse_ipv4_fast(value.as_bytes()) {
        Some(v4) => IpAddr::V4(v4),
        None => value
            .parse::<IpAddr>()
            .map_err(|_| InvalidInput::new(field, value, Reason::MalformedIp))?
            .to_canonical(),
    };
    if !is_unicast(ip) {
        return Err(InvalidInput::new(field, value, Reason::NotUnicast));
    }
    Ok(ip)
}

#[inline]
fn is_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !(v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast()),
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_multicast()),
    }
}

/// Checks an already parsed IP as [`parse_ip`] checks a string, returning its canonical form; an
/// error quotes the IP as given.
pub fn check_ip(field: &str, ip: IpAddr) -> Result<IpAddr, InvalidInput> {
    let canonical = ip.to_canonical();
    if !is_unicast(canonical) {
        return Err(InvalidInput::new(field, ip.to_string(), Reason::NotUnicast));
    }
    Ok(canonical)
}

/// The family name used in messages.
pub fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

/// A dotted-quad unicast IPv4 address, small enough to come back in a register (the common case
/// of [`parse_address_at`]); `None` for anything else.
#[inline]
fn unicast_ipv4_fast(s: &str) -> Option<Ipv4Addr> {
    parse_ipv4_fast(s.as_bytes()).filter(|a| is_unicast(IpAddr::V4(*a)))
}

/// Parses an address and its location (both canonical) and checks they are of one family.
pub fn parse_address_at(
    address_field: &str,
    address: &str,
    location_field: &str,
    location: &str,
) -> Result<(IpAddr, IpAddr), InvalidInput> {
    if let Some(loc) = unicast_ipv4_fast(location)
        && let Some(addr) = unicast_ipv4_fast(address)
    {
        return Ok((IpAddr::V4(addr), IpAddr::V4(loc)));
    }
    let loc = parse_ip(location_field, location)?;
    let addr = parse_ip(address_field, address)?;
    if addr.is_ipv4() != loc.is_ipv4() {
        return Err(mixed_family(address_field, address, addr, loc));
    }
    Ok((addr, loc))
}

/// [`parse_address_at`] for IPs already parsed: canonical forms, or an error quoting the IP given.
pub fn check_address_at(
    address_field: &str,
    address: IpAddr,
    location_field: &str,
    location: IpAddr,
) -> Result<(IpAddr, IpAddr), InvalidInput> {
    // The common case, decided without building a (large) result per IP.
    if let (IpAddr::V4(_), IpAddr::V4(_)) = (address, location)
        && is_unicast(address)
        && is_unicast(location)
    {
        return Ok((address, location));
    }
    let loc = check_ip(location_field, location)?;
    let addr = check_ip(address_field, address)?;
    if addr.is_ipv4() != loc.is_ipv4() {
        return Err(mixed_family(address_field, address.to_string(), addr, loc));
    }
    Ok((addr, loc))
}

fn mixed_family(field: &str, value: impl Into<String>, addr: IpAddr, loc: IpAddr) -> InvalidInput {
    InvalidInput::new(
        field,
        value,
        Reason::MixedFamily {
            family: family(addr),
            location: loc.to_string(),
            location_family: family(loc),
        },
    )
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
    fn the_ipv4_fast_path_accepts_exactly_what_the_standard_parser_accepts() {
        let mut cases: Vec<String> = [
            "",
            ".",
            "1.2.3",
            "1.2.3.4.",
            ".1.2.3.4",
            "1..2.3",
            "1.2.3.4.5",
            "01.2.3.4",
            "1.2.3.00",
            "0.0.0.0",
            "255.255.255.255",
            "256.1.1.1",
            "1.2.3.999",
            "1234.1.1.1",
            "1.2.3.-4",
            "+1.2.3.4",
            "1.2.3.4 ",
            "a.b.c.d",
            "10.0.0.1",
            "192.168.100.200",
            "1.2.3.4/8",
            "000.0.0.0",
            "1.02.3.4",
            "::1",
            "::ffff:10.0.0.1",
            "1.2.3.4:80",
            "١.2.3.4",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        // Every string of up to 5 characters over digits and dots, and some longer ones.
        let alphabet = ['0', '1', '2', '5', '9', '.'];
        let mut level = vec![String::new()];
        for _ in 0..5 {
            level = level
                .iter()
                .flat_map(|p| alphabet.iter().map(move |c| format!("{p}{c}")))
                .collect();
            cases.extend(level.iter().cloned());
        }
        // Every join of 3 to 5 tricky octets.
        let parts = [
            "", "0", "00", "01", "7", "10", "99", "100", "199", "249", "255", "256", "300", "999",
            "1000", "0255", "2a",
        ];
        let mut joins: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
        for n in 2..=5 {
            joins = joins
                .iter()
                .flat_map(|j| parts.iter().map(move |p| format!("{j}.{p}")))
                .collect();
            if n >= 3 {
                cases.extend(joins.iter().cloned());
            }
        }
        for c in &cases {
            let fast = parse_ipv4_fast(c.as_bytes());
            let std = c.parse::<Ipv4Addr>().ok();
            assert!(fast.is_none() || fast == std, "{c:?}: {fast:?} vs {std:?}");
            if c.len() <= 15 && c.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
                assert_eq!(fast, std, "{c:?}: the fast path decides every dotted-quad");
            }
        }
    }

    #[test]
    fn parsed_ips_are_checked_as_strings_are() {
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(check_ip("a", mapped).unwrap(), v4);
        let err = check_ip("a", "224.0.0.1".parse().unwrap()).unwrap_err();
        assert_eq!(
            (err.value.as_str(), err.reason),
            ("224.0.0.1", Reason::NotUnicast)
        );
        let err =
            check_address_at("address", "fd00::5".parse().unwrap(), "location", v4).unwrap_err();
        assert_eq!(
            err,
            parse_address_at("address", "fd00::5", "location", "10.0.0.1").unwrap_err()
        );
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
