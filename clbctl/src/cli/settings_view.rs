//! A load balancer's settings (`LoadBalancerSettings`) in short, as `clbctl state service` shows
//! them: the defaults left out.

/// The settings of a load balancer in short, the defaults left out.
pub(crate) fn settings_labels(s: Option<&clb_proto::v1::LoadBalancerSettings>) -> Vec<String> {
    let Some(s) = s else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if s.idle_timeout_minutes != 0 {
        out.push(format!("idle timeout {} min", s.idle_timeout_minutes));
    }
    if s.disable_tcp_reset {
        out.push("TCP reset off".to_owned());
    }
    if s.load_distribution == clb_proto::v1::LoadDistribution::SourceIp as i32 {
        out.push("affinity client IP".to_owned());
    }
    if !s.dns_label.is_empty() {
        out.push(format!("DNS label {}", s.dns_label));
    }
    if let Some(b) = &s.brought_public_ip {
        out.push(match (b.name.as_str(), b.resource_group.as_str()) {
            ("", _) => format!("public IP {} (brought)", b.address),
            (name, "") => format!("public IP {name} (brought)"),
            (name, rg) => format!("public IP {rg}/{name} (brought)"),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_shown_in_short_without_the_defaults() {
        use clb_proto::v1::{BroughtPublicIp, LoadBalancerSettings, LoadDistribution};
        assert!(settings_labels(None).is_empty());
        assert!(settings_labels(Some(&LoadBalancerSettings::default())).is_empty());
        let s = LoadBalancerSettings {
            idle_timeout_minutes: 15,
            disable_tcp_reset: true,
            load_distribution: LoadDistribution::SourceIp as i32,
            brought_public_ip: Some(BroughtPublicIp {
                name: "web-ip".into(),
                resource_group: "rg-ips".into(),
                address: String::new(),
            }),
            dns_label: String::new(),
        };
        assert_eq!(
            settings_labels(Some(&s)),
            [
                "idle timeout 15 min",
                "TCP reset off",
                "affinity client IP",
                "public IP rg-ips/web-ip (brought)"
            ]
        );
    }
}
