use super::*;
use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn service(annotations: &[(&str, &str)], spec: ServiceSpec) -> Service {
    Service {
        metadata: ObjectMeta {
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ..spec
        }),
        ..Service::default()
    }
}

fn refused(annotations: &[(&str, &str)], spec: ServiceSpec) -> Refusal {
    admit(&service(annotations, spec), &[IpFamily::Ipv4]).expect_err("refused")
}

fn admitted(annotations: &[(&str, &str)], spec: ServiceSpec, families: &[IpFamily]) -> Admission {
    admit(&service(annotations, spec), families).expect("admitted")
}

/// Annotations, spec, the refusal's reason, a part of its field.
type Case = (
    &'static [(&'static str, &'static str)],
    ServiceSpec,
    &'static str,
    &'static str,
);

#[test]
fn what_restricts_who_may_reach_the_service_is_refused_with_its_field() {
    let cases: Vec<Case> = vec![
        (
            &[(INTERNAL, "true")],
            ServiceSpec::default(),
            "UnsupportedInternalLoadBalancer",
            INTERNAL,
        ),
        (
            &[(INTERNAL, "TRUE")],
            ServiceSpec::default(),
            "UnsupportedInternalLoadBalancer",
            INTERNAL,
        ),
        (
            &[(INTERNAL_SUBNET, "apps")],
            ServiceSpec::default(),
            "UnsupportedInternalLoadBalancer",
            INTERNAL_SUBNET,
        ),
        (
            &[(ALLOWED_IP_RANGES, "10.0.0.0/8")],
            ServiceSpec::default(),
            "UnsupportedAllowedIpRanges",
            ALLOWED_IP_RANGES,
        ),
        (
            &[(ALLOWED_SERVICE_TAGS, "AzureCloud")],
            ServiceSpec::default(),
            "UnsupportedAllowedServiceTags",
            ALLOWED_SERVICE_TAGS,
        ),
        (
            &[(DENY_ALL_EXCEPT, "true")],
            ServiceSpec::default(),
            "UnsupportedDenyAllExceptLoadBalancerSourceRanges",
            DENY_ALL_EXCEPT,
        ),
        (
            &[(PIP_PREFIX, "/subscriptions/s/x")],
            ServiceSpec::default(),
            "UnsupportedPublicIpPrefix",
            PIP_PREFIX,
        ),
        (
            &[("service.beta.kubernetes.io/port_80_no_lb_rule", "true")],
            ServiceSpec::default(),
            "UnsupportedPortRuleAnnotation",
            "port_80_no_lb_rule",
        ),
        (
            &[(IDLE_TIMEOUT, "31")],
            ServiceSpec::default(),
            "InvalidIdleTimeout",
            IDLE_TIMEOUT,
        ),
        (
            &[(IDLE_TIMEOUT, "ten")],
            ServiceSpec::default(),
            "InvalidIdleTimeout",
            IDLE_TIMEOUT,
        ),
        (
            &[(DISABLE_TCP_RESET, "yes")],
            ServiceSpec::default(),
            "InvalidTcpReset",
            DISABLE_TCP_RESET,
        ),
        (
            &[(DNS_LABEL, "Shop")],
            ServiceSpec::default(),
            "InvalidDnsLabel",
            DNS_LABEL,
        ),
        (
            &[(DNS_LABEL, "shop"), (PIP_NAME, "mine")],
            ServiceSpec::default(),
            "InvalidDnsLabel",
            DNS_LABEL,
        ),
        (
            &[(PIP_NAME, "my ip")],
            ServiceSpec::default(),
            "InvalidPublicIpName",
            PIP_NAME,
        ),
        (
            &[(PIP_NAME, "mine"), (IPV4, "20.1.2.3")],
            ServiceSpec::default(),
            "InvalidLoadBalancerIP",
            IPV4,
        ),
        (
            &[(IPV4, "2001:db8::1")],
            ServiceSpec::default(),
            "InvalidLoadBalancerIP",
            IPV4,
        ),
    ];
    for (ann, spec, reason, field) in cases {
        let r = refused(ann, spec);
        assert_eq!(r.reason, reason, "{ann:?}: {r:?}");
        assert!(r.field.contains(field), "{ann:?}: {r:?}");
        assert!(
            r.message().contains(&format!("{:?}", r.value)),
            "{}",
            r.message()
        );
    }
    let r = refused(
        &[],
        ServiceSpec {
            load_balancer_source_ranges: Some(vec!["10.1.2.0/24".into()]),
            ..ServiceSpec::default()
        },
    );
    assert_eq!(r.reason, "UnsupportedLoadBalancerSourceRanges");
    assert_eq!(r.field, "spec.loadBalancerSourceRanges");
    assert_eq!(r.value, "10.1.2.0/24");
    let r = refused(
        &[(IPV4, "20.1.2.3")],
        ServiceSpec {
            load_balancer_ip: Some("20.1.2.4".into()),
            ..ServiceSpec::default()
        },
    );
    assert_eq!(
        (r.reason, r.field.as_str()),
        ("InvalidLoadBalancerIP", "spec.loadBalancerIP")
    );
}

#[test]
fn internal_false_is_a_public_load_balancer() {
    let a = admitted(
        &[(INTERNAL, "false")],
        ServiceSpec::default(),
        &[IpFamily::Ipv4],
    );
    assert_eq!(
        a.settings(IpFamily::Ipv4, true),
        LoadBalancerSettings::default()
    );
    assert!(a.ignored.is_empty());
}

#[test]
fn honoured_settings_become_each_familys_load_balancer_settings() {
    let spec = ServiceSpec {
        session_affinity: Some("ClientIP".into()),
        load_balancer_ip: Some("20.1.2.3".into()),
        ..ServiceSpec::default()
    };
    let a = admitted(
        &[
            (IDLE_TIMEOUT, "15"),
            (DISABLE_TCP_RESET, "True"),
            (IPV6, "2001:db8::7"),
        ],
        spec,
        &[IpFamily::Ipv4, IpFamily::Ipv6],
    );
    let v4 = a.settings(IpFamily::Ipv4, true);
    assert_eq!(v4.idle_timeout_minutes, 15);
    assert!(v4.disable_tcp_reset);
    assert_eq!(v4.load_distribution, LoadDistribution::SourceIp as i32);
    assert_eq!(v4.brought_public_ip.as_ref().unwrap().address, "20.1.2.3");
    let v6 = a.settings(IpFamily::Ipv6, false);
    assert_eq!(v6.idle_timeout_minutes, 15);
    assert_eq!(
        v6.brought_public_ip.as_ref().unwrap().address,
        "2001:db8::7"
    );

    // A name (with its resource group) for IPv4, the -ipv6 one for the IPv6 frontend.
    let a = admitted(
        &[
            (PIP_NAME, "web-v4"),
            (PIP_NAME_V6, "web-v6"),
            (RESOURCE_GROUP, "rg-ips"),
        ],
        ServiceSpec::default(),
        &[IpFamily::Ipv4, IpFamily::Ipv6],
    );
    let b = a.settings(IpFamily::Ipv4, true).brought_public_ip.unwrap();
    assert_eq!(
        (b.name.as_str(), b.resource_group.as_str()),
        ("web-v4", "rg-ips")
    );
    let b = a.settings(IpFamily::Ipv6, false).brought_public_ip.unwrap();
    assert_eq!(b.name, "web-v6");

    // The DNS label goes on the primary family's public IP only.
    let a = admitted(
        &[(DNS_LABEL, "shop")],
        ServiceSpec::default(),
        &[IpFamily::Ipv4, IpFamily::Ipv6],
    );
    assert_eq!(a.settings(IpFamily::Ipv4, true).dns_label, "shop");
    assert_eq!(a.settings(IpFamily::Ipv6, false).dns_label, "");
}

#[test]
fn what_widens_nothing_is_ignored_out_loud() {
    let a = admitted(
        &[
            (
                "service.beta.kubernetes.io/azure-load-balancer-health-probe-request-path",
                "/healthz",
            ),
            ("service.beta.kubernetes.io/azure-pls-create", "true"),
            ("service.beta.kubernetes.io/azure-something-new", "x"),
            (RESOURCE_GROUP, "rg"),
            ("example.com/other", "not ours"),
        ],
        ServiceSpec {
            ports: Some(vec![ServicePort {
                port: 9,
                protocol: Some("SCTP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        },
        &[IpFamily::Ipv4],
    );
    let names: Vec<&str> = a.ignored.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "service.beta.kubernetes.io/azure-load-balancer-health-probe-request-path",
            "service.beta.kubernetes.io/azure-load-balancer-resource-group",
            "service.beta.kubernetes.io/azure-pls-create",
            "service.beta.kubernetes.io/azure-something-new",
            "spec.ports[0] (9/SCTP)",
        ]
    );
    let message = a.ignored_message().unwrap();
    assert!(message.contains("health probes"), "{message}");
    // Nothing ignored: no message.
    assert!(
        admitted(&[], ServiceSpec::default(), &[])
            .ignored_message()
            .is_none()
    );
}

#[test]
fn patterns_match_families_of_keys() {
    assert_eq!(
        row_of("service.beta.kubernetes.io/port_443_no_lb_rule")
            .unwrap()
            .treatment,
        Treatment::Refused
    );
    assert_eq!(
        row_of("service.beta.kubernetes.io/port_443_health-probe_interval")
            .unwrap()
            .treatment,
        Treatment::Ignored
    );
    assert_eq!(row_of(IDLE_TIMEOUT).unwrap().treatment, Treatment::Honoured);
    assert_eq!(
        row_of("service.beta.kubernetes.io/azure-x")
            .unwrap()
            .setting,
        "service.beta.kubernetes.io/azure-*"
    );
    assert!(row_of("service.beta.kubernetes.io/port_").is_none());
}

/// The table as docs/watcher.md carries it: `| setting | clb | how or why |`, one row per
/// [`TABLE`] row, in order.
fn docs_table() -> String {
    let mut out = String::from("| setting | clb | how, or why |\n|---|---|---|\n");
    for r in TABLE {
        let setting = r
            .setting
            .strip_prefix(PORT_PREFIX.trim_end_matches("port_"))
            .unwrap_or(r.setting);
        out.push_str(&format!(
            "| `{setting}` | {} | {} |\n",
            r.treatment.word(),
            r.note.replace('|', "\\|")
        ));
    }
    out
}

#[test]
fn the_docs_table_is_the_code_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/watcher.md");
    let docs = std::fs::read_to_string(path).expect("docs/watcher.md");
    let want = docs_table();
    assert!(
        docs.contains(&want),
        "docs/watcher.md must carry the settings table exactly as watcher/src/settings.rs has it \
         (TABLE); put this under \"## Service settings\":\n\n{want}"
    );
}

#[test]
fn every_setting_is_listed_once() {
    let mut seen = std::collections::BTreeSet::new();
    for r in TABLE {
        assert!(seen.insert(r.setting), "{} twice", r.setting);
        assert!(
            r.setting.starts_with("spec.") || r.setting.starts_with("service.beta.kubernetes.io/"),
            "{}",
            r.setting
        );
    }
    // Every annotation key the admission reads has its row.
    for key in [
        INTERNAL,
        INTERNAL_SUBNET,
        ALLOWED_IP_RANGES,
        ALLOWED_SERVICE_TAGS,
        DENY_ALL_EXCEPT,
        PIP_PREFIX,
        PIP_PREFIX_V6,
        IDLE_TIMEOUT,
        DISABLE_TCP_RESET,
        DNS_LABEL,
        PIP_NAME,
        PIP_NAME_V6,
        RESOURCE_GROUP,
        IPV4,
        IPV6,
    ] {
        assert_eq!(row_of(key).map(|r| r.setting), Some(key));
    }
}
