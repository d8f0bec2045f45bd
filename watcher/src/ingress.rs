//! `status.loadBalancer.ingress` as the watcher reads and writes it, on Services and PoolServices.
//!
//! Every entry the watcher writes is `{ip, ipMode: VIP}`. `ipMode` (KEP-1860, GA in Kubernetes 1.32)
//! tells kube-proxy what to do with in-cluster traffic to the load balancer's IP: `VIP` — take it to
//! the Service's endpoints itself (the behaviour before the field existed, and the API server's
//! default); `Proxy` — send it out to the load balancer. docs/watcher.md (ipMode) says why `VIP`. An API server with the `LoadBalancerIPMode` gate defaults a
//! missing `ipMode` of an entry with an `ip` to `VIP`; the watcher writes it anyway (older servers keep
//! no default; a status written by someone else may lack it), and compares the field: an entry without
//! it, or with another mode, is rewritten — once, since the entry then reads back as written. Where the
//! API server drops the field instead ([`drops_ip_mode`]), the write-back notices it in the answer to
//! its write and compares the IPs alone from then on, so it never patches in a loop.

use k8s_openapi::api::core::v1::LoadBalancerStatus;
use serde_json::{Value, json};

/// The `ipMode` of every ingress entry the watcher writes.
pub const IP_MODE: &str = "VIP";

/// One `status.loadBalancer.ingress` entry as read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IngressEntry {
    /// `ip`.
    pub ip: Option<String>,
    /// `hostname` (the watcher never writes one).
    pub hostname: Option<String>,
    /// `ipMode`.
    pub ip_mode: Option<String>,
}

impl IngressEntry {
    /// The entry the watcher writes for `ip`.
    pub fn vip(ip: &str) -> Self {
        Self {
            ip: Some(ip.to_owned()),
            hostname: None,
            ip_mode: Some(IP_MODE.to_owned()),
        }
    }
}

/// The entries of `status` (none without one).
pub fn entries(status: Option<&LoadBalancerStatus>) -> Vec<IngressEntry> {
    status
        .and_then(|l| l.ingress.as_ref())
        .map(|l| {
            l.iter()
                .map(|i| IngressEntry {
                    ip: i.ip.clone(),
                    hostname: i.hostname.clone(),
                    ip_mode: i.ip_mode.clone(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `current` is exactly what the watcher writes for `ips`: the IPs in that order, each with
/// `ipMode: VIP` — unless `ip_mode` is false (an API server that drops the field: see
/// [`drops_ip_mode`]), when the IPs alone are compared.
pub fn is_written(current: &[IngressEntry], ips: &[String], ip_mode: bool) -> bool {
    current.len() == ips.len()
        && current.iter().zip(ips).all(|(e, ip)| {
            let want = IngressEntry::vip(ip);
            if ip_mode {
                *e == want
            } else {
                e.ip == want.ip && e.hostname.is_none()
            }
        })
}

/// Whether `stored` — the ingress an API server answered a status write of [`to_json`] with — lacks
/// the `ipMode` written: a server with the `LoadBalancerIPMode` gate off (before Kubernetes 1.30, or
/// switched off) drops the field on write, or a PoolService CRD without it in its schema prunes it.
/// Comparing the field there would patch forever; the write-back compares the IPs alone from then on.
pub fn drops_ip_mode(stored: &[IngressEntry]) -> bool {
    stored.iter().any(|e| e.ip.is_some() && e.ip_mode.is_none())
}

/// Frontend IPs in the order the watcher writes them: IPv4 first (a dual-stack Service lists its
/// IPv4 frontend first, as `spec.ipFamilies` lists IPv4 first in a cluster whose primary family it
/// is, and as clients that take `ingress[0]` expect), then by address; duplicates dropped. An entry
/// that is not an IP (never from NRP) sorts last, as text.
pub fn ordered(ips: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = ips.into_iter().collect();
    out.sort_by_key(|ip| match ip.parse::<std::net::IpAddr>() {
        Ok(a) => (u8::from(a.is_ipv6()), Some(a), String::new()),
        Err(_) => (2, None, ip.clone()),
    });
    out.dedup();
    out
}

/// The `ingress` list the watcher writes for `ips` (a merge patch replaces the list as a whole).
pub fn to_json(ips: &[String]) -> Vec<Value> {
    ips.iter()
        .map(|ip| json!({ "ip": ip, "ipMode": IP_MODE }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_comes_first() {
        let got = ordered(
            [
                "2001:db8::1",
                "9.0.0.1",
                "20.0.0.2",
                "2001:db8::1",
                "20.0.0.10",
            ]
            .map(String::from),
        );
        assert_eq!(got, ["9.0.0.1", "20.0.0.2", "20.0.0.10", "2001:db8::1"]);
    }
    use k8s_openapi::api::core::v1::LoadBalancerIngress;

    fn status(entries: &[(&str, Option<&str>)]) -> LoadBalancerStatus {
        LoadBalancerStatus {
            ingress: Some(
                entries
                    .iter()
                    .map(|(ip, mode)| LoadBalancerIngress {
                        ip: Some((*ip).to_owned()),
                        ip_mode: mode.map(str::to_owned),
                        ..Default::default()
                    })
                    .collect(),
            ),
        }
    }

    #[test]
    fn an_entry_without_ip_mode_or_with_another_mode_is_not_as_written() {
        let ips = vec!["20.0.0.1".to_owned()];
        let read = |e: &[(&str, Option<&str>)]| entries(Some(&status(e)));
        assert!(is_written(&read(&[("20.0.0.1", Some("VIP"))]), &ips, true));
        assert!(!is_written(&read(&[("20.0.0.1", None)]), &ips, true));
        assert!(!is_written(
            &read(&[("20.0.0.1", Some("Proxy"))]),
            &ips,
            true
        ));
        assert!(!is_written(&read(&[("20.0.0.2", Some("VIP"))]), &ips, true));
        assert!(!is_written(&[], &ips, true));
        assert!(is_written(&entries(None), &[], true));
        // A server that drops the field: the IPs alone.
        assert!(drops_ip_mode(&read(&[("20.0.0.1", None)])));
        assert!(!drops_ip_mode(&read(&[("20.0.0.1", Some("VIP"))])));
        assert!(is_written(&read(&[("20.0.0.1", None)]), &ips, false));
        assert!(!is_written(&read(&[("20.0.0.2", None)]), &ips, false));
    }

    #[test]
    fn what_is_written_reads_back_as_written() {
        let ips = vec!["20.0.0.1".to_owned(), "2001:db8:c1b::1".to_owned()];
        let json = json!({ "ingress": to_json(&ips) });
        assert_eq!(
            json,
            json!({ "ingress": [
                { "ip": "20.0.0.1", "ipMode": "VIP" },
                { "ip": "2001:db8:c1b::1", "ipMode": "VIP" },
            ] })
        );
        let status: LoadBalancerStatus = serde_json::from_value(json).unwrap();
        assert!(is_written(&entries(Some(&status)), &ips, true));
    }
}
