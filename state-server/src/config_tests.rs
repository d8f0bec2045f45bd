//! Tests of `config.rs`: the flags, their defaults, their validation and where they go.

use super::*;
use crate::tls::TlsFiles;

fn parse(args: &[&str]) -> Args {
    Args::try_parse_from(std::iter::once("clb-state-server").chain(args.iter().copied())).unwrap()
}

#[test]
fn clap_definition_is_consistent() {
    Args::command().debug_assert();
}

#[test]
fn defaults_match_the_library_defaults() {
    // The defaults alone refuse to serve unchecked callers on 0.0.0.0.
    assert!(matches!(
        parse(&[]).validate(),
        Err(ConfigError::Unauthenticated { .. })
    ));
    let a = parse(&["--insecure-allow-unauthenticated"]);
    a.validate().unwrap();
    assert_eq!(a.listen, "0.0.0.0:50051".parse().unwrap());
    assert_eq!(a.metrics_listen, "0.0.0.0:9090".parse().unwrap());
    assert_eq!(a.gateways, ["default"]);
    assert!(a.expected_writers.is_empty());
    let c = a.to_server_config();
    let d = ServerConfig::default();
    assert_eq!(c.gateways, d.gateways);
    assert_eq!(c.max_items_per_batch, d.max_items_per_batch);
    assert_eq!(c.resync_wait, d.resync_wait);
    assert_eq!(c.max_message_bytes, d.max_message_bytes);
    assert_eq!(c.dispatch.lease, d.dispatch.lease);
    assert_eq!(
        c.dispatch.max_locations_per_unit,
        d.dispatch.max_locations_per_unit
    );
    assert_eq!(
        c.dispatch.max_addresses_per_unit,
        d.dispatch.max_addresses_per_unit
    );
    assert_eq!(
        c.dispatch.max_services_per_unit,
        d.dispatch.max_services_per_unit
    );
    assert_eq!(c.dispatch.retry_base, d.dispatch.retry_base);
    assert_eq!(c.dispatch.retry_max, d.dispatch.retry_max);
    assert_eq!(
        c.dispatch.anti_entropy_interval,
        d.dispatch.anti_entropy_interval
    );
}

#[test]
fn flags_reach_the_server_config() {
    let a = parse(&[
        "--listen=127.0.0.1:1",
        "--metrics-listen=[::1]:2",
        "--server-id=s1",
        "--gateways=east,west",
        "--expected-writers=watcher,node-agent/n1",
        "--lease=1500ms",
        "--max-locations-per-unit=3",
        "--max-addresses-per-unit=40",
        "--max-services-per-unit=5",
        "--max-items-per-batch=60",
        "--max-message-bytes=4096",
        "--retry-base=10ms",
        "--retry-max=20ms",
        "--anti-entropy-interval=7s",
        "--resync-wait=1m 30s",
        "--unit-headway=1.5",
    ]);
    a.validate().unwrap();
    assert_eq!(a.listen, "127.0.0.1:1".parse().unwrap());
    assert_eq!(a.metrics_listen, "[::1]:2".parse().unwrap());
    let c = a.to_server_config();
    assert_eq!(c.max_message_bytes, 4096);
    assert_eq!(c.server_id, "s1");
    assert_eq!(c.gateways, ["east", "west"]);
    assert_eq!(c.expected_writers, ["watcher", "node-agent/n1"]);
    assert_eq!(c.max_items_per_batch, 60);
    assert_eq!(c.dispatch.lease, Duration::from_millis(1500));
    assert_eq!(c.dispatch.max_locations_per_unit, 3);
    assert_eq!(c.dispatch.max_addresses_per_unit, 40);
    assert_eq!(c.dispatch.max_services_per_unit, 5);
    assert_eq!(c.dispatch.retry_base, Duration::from_millis(10));
    assert_eq!(c.dispatch.retry_max, Duration::from_millis(20));
    assert_eq!(c.dispatch.anti_entropy_interval, Duration::from_secs(7));
    assert_eq!(c.resync_wait, Duration::from_secs(90));
    assert_eq!(c.dispatch.unit_headway, 1.5);
}

#[test]
fn a_headway_is_off_or_at_least_one() {
    assert_eq!(headway_factor("0").unwrap().0, 0.0);
    assert_eq!(headway_factor("1").unwrap().0, 1.0);
    let e = headway_factor("0.5").unwrap_err();
    assert!(e.contains("\"0.5\": must be 0 (off) or at least 1"), "{e}");
    let e = headway_factor("soon").unwrap_err();
    assert!(e.contains("\"soon\" is not a number"), "{e}");
    assert!(headway_factor("inf").is_err());
    assert!(headway_factor("-1").is_err());
}

#[test]
fn a_duration_without_a_unit_is_refused() {
    for flag in ["--lease=30000", "--retry-base=200", "--resync-wait=180"] {
        let err = Args::try_parse_from(["clb-state-server", flag])
            .unwrap_err()
            .to_string();
        let value = flag.split_once('=').unwrap().1;
        assert!(
            err.contains(&format!("\"{value}\" has no unit"))
                && err.contains("us, ms, s, m, h, d (e.g. 30s, 500ms"),
            "{flag}: {err}"
        );
    }
    // No flag of the old names (`--lease-ms`) is left.
    let err = Args::try_parse_from(["clb-state-server", "--lease-ms=1500"]).unwrap_err();
    assert_eq!(err.kind(), clap::error::ErrorKind::UnknownArgument);
}

#[test]
fn every_flag_has_a_clb_env_fallback() {
    let cmd = Args::command();
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if id == "help" || id == "version" {
            continue;
        }
        let want = format!("CLB_{}", id.to_uppercase());
        assert_eq!(
            arg.get_env().and_then(|e| e.to_str()),
            Some(want.as_str()),
            "{id}"
        );
    }
}

#[test]
fn malformed_values_are_rejected_by_clap() {
    let bad = [
        &["--listen=nowhere"][..],
        &["--lease=-1s"],
        &["--lease=soon"],
        &["--max-locations-per-unit=many"],
    ];
    for args in bad {
        let argv = std::iter::once("clb-state-server").chain(args.iter().copied());
        assert!(Args::try_parse_from(argv).is_err(), "{args:?}");
    }
}

#[test]
fn validation_errors_are_precise() {
    let cases: [(&[&str], &str); 12] = [
        (&["--lease=0s"], "--lease must be at least 1ms, got 0s"),
        (&["--lease=0"], "--lease must be at least 1ms, got 0s"),
        (
            &["--max-locations-per-unit=0"],
            "--max-locations-per-unit must be at least 1, got 0",
        ),
        (
            &["--max-addresses-per-unit=0"],
            "--max-addresses-per-unit must be at least 1, got 0",
        ),
        (
            &["--max-services-per-unit=0"],
            "--max-services-per-unit must be at least 1, got 0",
        ),
        (
            &["--max-items-per-batch=0"],
            "--max-items-per-batch must be at least 1, got 0",
        ),
        (
            &["--max-message-bytes=10"],
            "--max-message-bytes must be at least 1024, got 10",
        ),
        (
            &["--retry-base=50ms", "--retry-max=10ms"],
            "--retry-base (50ms) must not exceed --retry-max (10ms)",
        ),
        (
            &["--anti-entropy-interval=500ms"],
            "--anti-entropy-interval must be at least 1s, got 500ms",
        ),
        (
            &["--anti-entropy-interval=0s"],
            "--anti-entropy-interval must be at least 1s, got 0s",
        ),
        (&["--gateways=a,,b"], "--gateways contains an empty name"),
        (
            &["--expected-writers=w,w"],
            "--expected-writers names \"w\" twice",
        ),
    ];
    for (args, want) in cases {
        let err = parse(args).validate().unwrap_err();
        assert_eq!(err.to_string(), want, "{args:?}");
    }
    assert_eq!(
        parse(&["--server-id="]).validate().unwrap_err(),
        ConfigError::EmptyServerId
    );
}

#[test]
fn tls_flags_come_as_a_pair_and_mutual_tls_needs_them() {
    let cases: [(&[&str], &str); 4] = [
        (&["--tls-cert=c.pem"], "--tls-cert requires --tls-key"),
        (&["--tls-key=k.pem"], "--tls-key requires --tls-cert"),
        (
            &["--tls-client-ca=ca.pem"],
            "--tls-client-ca requires --tls-cert and --tls-key, or --tls-self-managed",
        ),
        (
            &["--tls-cert=c.pem", "--tls-client-ca=ca.pem"],
            "--tls-cert requires --tls-key",
        ),
    ];
    for (args, want) in cases {
        let err = parse(args).validate().unwrap_err();
        assert_eq!(err.to_string(), want, "{args:?}");
    }
    let plain = parse(&[]);
    assert_eq!(plain.tls_files(), None);
    assert!(plain.server_tls().unwrap().is_none());
    let a = parse(&[
        "--listen=127.0.0.1:50051",
        "--tls-cert=/c.pem",
        "--tls-key=/k.pem",
        "--tls-client-ca=/ca.pem",
    ]);
    a.validate().unwrap();
    assert_eq!(
        a.tls_files(),
        Some(TlsFiles {
            cert: "/c.pem".into(),
            key: "/k.pem".into(),
            client_ca: Some("/ca.pem".into()),
        })
    );
}

#[test]
fn the_self_managed_certificate_flags_are_checked_and_exclude_a_certificate_file() {
    let a = parse(&["--listen=127.0.0.1:1", "--tls-self-managed"]);
    a.validate().unwrap();
    assert_eq!(a.self_managed.tls_secret, "clb-state-server-tls");
    assert_eq!(a.self_managed.tls_ca_bundle, "clb-ca-bundle");
    assert_eq!(a.self_managed.tls_service, "clb-state-server");
    assert_eq!(
        a.self_managed.tls_ca_validity,
        Duration::from_secs(3650 * 86_400)
    );
    assert_eq!(
        a.self_managed.tls_serving_validity,
        Duration::from_secs(365 * 86_400)
    );
    let tls = a.server_tls().unwrap().expect("TLS");
    assert!(
        !tls.certificate.is_ready(),
        "no certificate before the Secret is read"
    );
    assert!(tls.files.is_none());
    // Mutual TLS with the self-managed certificate.
    parse(&[
        "--listen=127.0.0.1:1",
        "--tls-self-managed",
        "--tls-client-ca=ca.pem",
    ])
    .validate()
    .unwrap();
    let e = Args::try_parse_from(["clb-state-server", "--tls-self-managed", "--tls-cert=c.pem"])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--tls-cert") && e.contains("cannot be used with"),
        "{e}"
    );
    let cases: [(&[&str], &str); 4] = [
        (
            &["--tls-ca-validity=30s"],
            "--tls-ca-validity 30s: too short, at least 1m",
        ),
        (
            &["--tls-ca-validity=100d"],
            "--tls-serving-validity 365d is longer than --tls-ca-validity 100d: a certificate never outlives its CA",
        ),
        (
            &["--tls-extra-names=10.0.0.1,bad name"],
            "--tls-extra-names \"bad name\": neither a DNS name nor an IP address",
        ),
        (&["--tls-secret= "], "--tls-secret must not be empty"),
    ];
    for (args, want) in cases {
        let mut argv = vec!["--listen=127.0.0.1:1", "--tls-self-managed"];
        argv.extend_from_slice(args);
        assert_eq!(
            parse(&argv).validate().unwrap_err().to_string(),
            want,
            "{args:?}"
        );
    }
    // Without --tls-self-managed the others are not looked at.
    parse(&["--listen=127.0.0.1:1", "--tls-ca-validity=1s"])
        .validate()
        .unwrap();
}

#[test]
fn leader_election_flags_use_kubernetes_names_and_defaults() {
    let a = parse(&[]);
    assert!(!a.leader_elect);
    let e = a.election_config("ns");
    assert_eq!(e.lease_duration, Duration::from_secs(15));
    assert_eq!(e.renew_deadline, Duration::from_secs(10));
    assert_eq!(e.retry_period, Duration::from_secs(2));
    assert_eq!(
        (e.namespace.as_str(), e.name.as_str()),
        ("ns", "clb-state-server")
    );
    for on in [&["--leader-elect"][..], &["--leader-elect=true"]] {
        assert!(parse(on).leader_elect, "{on:?}");
    }
    assert!(!parse(&["--leader-elect=false"]).leader_elect);
    let a = parse(&[
        "--leader-elect",
        "--leader-elect-lease-duration=4s",
        "--leader-elect-renew-deadline=2500ms",
        "--leader-elect-retry-period=0.5s",
        "--leader-elect-resource-name=l",
        "--leader-elect-resource-namespace=clb-system",
        "--server-id=pod-a",
        "--listen=127.0.0.1:50051",
    ]);
    a.validate().unwrap();
    let e = a.election_config("ignored");
    assert_eq!(e.namespace, "clb-system");
    assert_eq!(e.identity, "pod-a");
    assert_eq!(e.renew_deadline, Duration::from_millis(2500));
    assert_eq!(e.retry_period, Duration::from_millis(500));
    let bad = parse(&["--leader-elect", "--leader-elect-renew-deadline=20s"]);
    assert!(
        bad.validate()
            .unwrap_err()
            .to_string()
            .contains("must be shorter than --leader-elect-lease-duration")
    );
    assert!(Args::try_parse_from(["clb-state-server", "--leader-elect-retry-period=2x"]).is_err());
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
}

#[test]
fn unchecked_callers_are_refused_off_loopback_unless_insecure_is_asked_for() {
    let refused = [
        &["--listen=0.0.0.0:50051"][..],
        &["--listen=[::]:50051"],
        &["--listen=10.0.0.5:50051"],
        &["--listen=0.0.0.0:50051", "--authentication=kubernetes"],
    ];
    for args in refused {
        let err = parse(args).validate().unwrap_err();
        assert!(
            matches!(err, ConfigError::Unauthenticated { .. }),
            "{args:?}: {err}"
        );
        assert!(
            err.to_string().contains("--insecure-allow-unauthenticated"),
            "{err}"
        );
    }
    assert_eq!(
        parse(&["--listen=0.0.0.0:1"])
            .validate()
            .unwrap_err()
            .to_string(),
        "--authentication=none and --authorization=none on the non-loopback address \
         0.0.0.0:1: every host that reaches it could change every gateway; use \
         --authentication=kubernetes --authorization=kubernetes, listen on loopback, or pass \
         --insecure-allow-unauthenticated"
    );
    let allowed = [
        &["--listen=127.0.0.1:0"][..],
        &["--listen=[::1]:0"],
        &["--listen=0.0.0.0:1", "--insecure-allow-unauthenticated"],
        &[
            "--listen=0.0.0.0:1",
            "--authentication=kubernetes",
            "--authorization=kubernetes",
        ],
    ];
    for args in allowed {
        parse(args)
            .validate()
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    }
    assert_eq!(
        parse(&["--listen=127.0.0.1:0", "--authorization=kubernetes"])
            .validate()
            .unwrap_err(),
        ConfigError::AuthorizationWithoutAuthentication
    );
    assert_eq!(
        parse(&["--listen=127.0.0.1:0", "--token-audience="])
            .validate()
            .unwrap_err(),
        ConfigError::EmptyAudience
    );
    assert!(Args::try_parse_from(["clb-state-server", "--authentication=maybe"]).is_err());
    let a = parse(&[
        "--authentication=kubernetes",
        "--authorization=kubernetes",
        "--token-audience=aud",
        "--auth-cache-ttl=45s",
        "--auth-cache-size=7",
    ]);
    a.validate().unwrap();
    let c = a.auth_config();
    assert_eq!(c.audience, "aud");
    assert_eq!(c.cache_ttl, Duration::from_secs(45));
    assert_eq!(c.cache_capacity, 7);
    assert_eq!(c.authorization, Mode::Kubernetes);
    assert!(!a.unchecked_callers());
}

#[test]
fn the_gateways_file_names_the_gateways_and_excludes_the_flag() {
    let path = std::env::temp_dir().join(format!("clb-server-gw-{}.yaml", std::process::id()));
    std::fs::write(
        &path,
        "defaultGateway: west\ngateways:\n\
         - name: east\n  nodes: {pool: e}\n  azure: {subscription: s, resourceGroup: a, region: eastus}\n\
         - name: west\n  azure: {subscription: s, resourceGroup: b, region: westus}\n",
    )
    .unwrap();
    let flag = format!("--gateways-file={}", path.display());
    let mut a = parse(&["--listen=127.0.0.1:0", flag.as_str()]);
    a.validate().unwrap();
    a.load_gateways_file().unwrap();
    assert_eq!(a.to_server_config().gateways, ["west", "east"]);
    let subscriptions = a.to_server_config().subscriptions;
    assert_eq!(subscriptions["west"], "s");
    assert_eq!(subscriptions["east"], "s");
    let both = Args::try_parse_from(["clb-state-server", "--gateways=a,b", flag.as_str()])
        .unwrap_err()
        .to_string();
    assert!(
        both.contains(
            "the argument '--gateways <GATEWAYS>' cannot be used with '--gateways-file <FILE>'"
        ),
        "{both}"
    );
    std::fs::write(&path, "gateways: []\n").unwrap();
    let mut a = parse(&[flag.as_str()]);
    assert_eq!(
        a.load_gateways_file().unwrap_err().to_string(),
        "--gateways-file: gateways = \"\": lists no gateway: at least one is needed"
    );
    std::fs::remove_file(&path).unwrap();
    let mut a = parse(&["--gateways-file=/no/such/gateways.yaml"]);
    assert!(
        a.load_gateways_file()
            .unwrap_err()
            .to_string()
            .starts_with("--gateways-file: cannot read the gateways file /no/such/gateways.yaml: "),
    );
}
