//! Authentication and authorization of the deployed components (docs/security.md).

use super::*;

#[test]
fn each_component_is_bound_to_exactly_the_gateway_roles_it_needs() {
    use clb_state_server::auth::{API_GROUP, RESOURCE, Verb};
    let m = load();
    let gateway = |verb: Verb| {
        (
            API_GROUP.to_owned(),
            RESOURCE.to_owned(),
            verb.as_str().to_owned(),
        )
    };
    let gateway_of = gateway;
    // The ClusterRole of each verb grants exactly that verb on gateways.
    for verb in [Verb::Write, Verb::WriteNode, Verb::Work, Verb::Get] {
        let role = m
            .cluster_roles
            .iter()
            .find(|r| name(&r.metadata) == verb.role())
            .unwrap_or_else(|| panic!("ClusterRole {} is missing", verb.role()));
        let rules = role.rules.clone().unwrap_or_default();
        assert_eq!(rules.len(), 1, "{}", verb.role());
        assert_eq!(
            rules[0].api_groups.as_deref(),
            Some(&[API_GROUP.to_owned()][..])
        );
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&[RESOURCE.to_owned()][..])
        );
        assert_eq!(rules[0].verbs, [verb.as_str().to_owned()]);
    }
    let reviews = BTreeSet::from([
        (
            "authentication.k8s.io".to_owned(),
            "tokenreviews".to_owned(),
            "create".to_owned(),
        ),
        (
            "authorization.k8s.io".to_owned(),
            "subjectaccessreviews".to_owned(),
            "create".to_owned(),
        ),
    ]);
    let expected = [
        ("clb-watcher", BTreeSet::from([gateway(Verb::Write)])),
        ("clb-node-agent", BTreeSet::from([gateway(Verb::WriteNode)])),
        ("clb-sync-worker", BTreeSet::from([gateway(Verb::Work)])),
        ("clb-state-server", reviews),
    ];
    for (account, want) in &expected {
        assert_eq!(&auth_grants_of(&m, account), want, "{account}");
    }
    // What the state server's SubjectAccessReviews ask, evaluated against deploy/'s RBAC: each
    // component may exactly its verb on a gateway (by any name), no other.
    let rbac = m.rbac();
    for (account, want) in &expected {
        let who = UserInfo::service_account(NAMESPACE, account);
        for verb in [Verb::Write, Verb::WriteNode, Verb::Work, Verb::Get] {
            for gateway in ["default", "", "another"] {
                let attrs = Attributes::new(verb.as_str(), API_GROUP, RESOURCE).name(gateway);
                assert_eq!(
                    rbac.authorize(&who, &attrs).allowed,
                    want.contains(&gateway_of(verb)),
                    "{account} {} gateway {gateway:?}",
                    verb.as_str()
                );
            }
        }
    }
    for review in ["tokenreviews", "subjectaccessreviews"] {
        let group = if review == "tokenreviews" {
            "authentication.k8s.io"
        } else {
            "authorization.k8s.io"
        };
        assert!(may(
            &rbac,
            "clb-state-server",
            "",
            (group, review, "create")
        ));
    }
    // Nobody else is bound to a role on gateways (operators bind clb-reader themselves).
    for b in &m.cluster_role_bindings {
        for s in b.subjects.iter().flatten() {
            if !expected.iter().any(|(a, _)| *a == s.name) {
                assert!(
                    auth_grants_of(&m, &s.name).is_empty(),
                    "{} is bound to {}",
                    s.name,
                    b.role_ref.name
                );
            }
        }
    }
}

#[test]
fn clients_send_a_projected_token_and_the_server_checks_it() {
    let m = load();
    let args = clb_tests::deploy::state_server_args();
    assert_eq!(
        (args.authentication, args.authorization),
        (
            clb_state_server::auth::Mode::Kubernetes,
            clb_state_server::auth::Mode::Kubernetes
        )
    );
    assert_eq!(
        args.token_audience,
        clb_state_server::auth::DEFAULT_AUDIENCE
    );
    let token_file = Path::new(clb_client::token::DEFAULT_TOKEN_FILE);
    for workload in ["clb-watcher", "clb-node-agent", "clb-sync-worker"] {
        let (_, template) = m
            .workloads()
            .into_iter()
            .find(|(n, _)| n == workload)
            .unwrap_or_else(|| panic!("{workload} is missing"));
        let pod = template.spec.as_ref().expect("pod spec");
        let c = &pod.containers[0];
        assert!(
            c.args
                .iter()
                .flatten()
                .any(|a| a == &format!("--token-file={}", token_file.display())),
            "{workload}: {:?}",
            c.args
        );
        // The volume mounted at the token's directory projects the token for the audience.
        let mount = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|v| Some(Path::new(&v.mount_path)) == token_file.parent())
            .unwrap_or_else(|| panic!("{workload}: nothing mounted at the token's directory"));
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .unwrap_or_else(|| panic!("{workload}: volume {} is missing", mount.name));
        let sources = volume
            .projected
            .as_ref()
            .and_then(|p| p.sources.clone())
            .unwrap_or_default();
        let token = sources
            .iter()
            .find_map(|s| s.service_account_token.as_ref())
            .unwrap_or_else(|| panic!("{workload}: no projected ServiceAccount token"));
        assert_eq!(
            Some(token.path.as_str()),
            token_file.file_name().and_then(|f| f.to_str()),
            "{workload}"
        );
        assert_eq!(
            token.audience.as_deref(),
            Some(clb_state_server::auth::DEFAULT_AUDIENCE),
            "{workload}"
        );
    }
}

#[test]
fn only_the_projects_pods_reach_the_grpc_port() {
    let m = load();
    let policy = m
        .network_policies
        .iter()
        .find(|p| name(&p.metadata) == "clb-state-server")
        .expect("NetworkPolicy clb-state-server");
    let spec = policy.spec.as_ref().expect("spec");
    let (_, server) = m
        .workloads()
        .into_iter()
        .find(|(n, _)| n == "clb-state-server")
        .expect("state server");
    let selector = spec
        .pod_selector
        .as_ref()
        .and_then(|s| s.match_labels.clone())
        .unwrap_or_default();
    assert!(!selector.is_empty() && selects(&selector, &labels(server)));
    assert_eq!(
        spec.policy_types.as_deref(),
        Some(&["Ingress".to_owned()][..])
    );
    let port_of = |p: &k8s_openapi::api::networking::v1::NetworkPolicyPort| match &p.port {
        Some(IntOrString::Int(n)) => *n,
        other => panic!("a numeric port: {other:?}"),
    };
    let mut grpc_from = None;
    let mut metrics_open = false;
    for rule in spec.ingress.iter().flatten() {
        for p in rule.ports.iter().flatten() {
            match port_of(p) {
                50051 => grpc_from = Some(rule.from.clone().unwrap_or_default()),
                9090 => metrics_open = rule.from.as_ref().is_none_or(|f| f.is_empty()),
                other => panic!("unexpected port {other}"),
            }
        }
    }
    let from = grpc_from.expect("a rule for the gRPC port");
    assert_eq!(from.len(), 1, "{from:?}");
    assert!(
        from[0].namespace_selector.is_none(),
        "the project's namespace only"
    );
    let peers = from[0]
        .pod_selector
        .as_ref()
        .and_then(|s| s.match_labels.clone())
        .expect("a pod selector");
    // Every workload of the project is admitted; the selector is not empty (not every pod).
    assert!(!peers.is_empty());
    for (workload, template) in m.workloads() {
        assert!(
            selects(&peers, &labels(template)),
            "{workload} is not admitted"
        );
    }
    assert!(
        metrics_open,
        "the metrics port is open to the scraper and the probes"
    );
}
