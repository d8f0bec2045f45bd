//! The Kubernetes manifests in `deploy/` are checked here, in CI, without a cluster: every document
//! parses as its typed Kubernetes object (k8s-openapi), and what would only fail at apply or run time
//! is checked statically — selectors select, ports and service accounts referred to exist, each
//! container's command line parses with its binary's own flag parser, the RBAC rules grant what the
//! watcher and the node agent call, and every pod runs as non-root with resource requests; each
//! component's ServiceAccount is bound to exactly the roles on gateways it needs, the clients mount
//! a projected token for the server's audience, and only the project's pods reach the gRPC port.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use clap::CommandFactory;
use clb_tests::deploy::{Rendered, deploy_dir, kustomization};
use clb_tests::rbac::{Attributes, Rbac, UserInfo};
use k8s_openapi::api::core::v1::{Container, PodTemplateSpec};
use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

const NAMESPACE: &str = clb_tests::deploy::NAMESPACE;

/// `deploy/` as `kubectl apply -k deploy/` renders it (`clb_tests::deploy`), after checking that
/// every YAML file of deploy/ is a resource of the kustomization (nothing is forgotten) and that
/// the base holds only kinds these checks know.
fn load() -> Rendered {
    let files: BTreeSet<String> = kustomization(&deploy_dir())["resources"]
        .as_sequence()
        .expect("kustomization lists resources")
        .iter()
        .map(|v| v.as_str().expect("resource is a file name").to_owned())
        .collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(deploy_dir())
        .expect("deploy/ exists")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(
        on_disk, files,
        "deploy/*.yaml and kustomization resources differ"
    );
    let m = Rendered::load(&[]);
    for d in &m.documents {
        assert!(
            Rendered::is_typed(d),
            "{}: unexpected {} {}",
            d.source,
            d.value["apiVersion"],
            d.kind()
        );
    }
    m
}

fn name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().expect("every object is named")
}

fn labels(template: &PodTemplateSpec) -> BTreeMap<String, String> {
    template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
}

fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[test]
fn every_manifest_parses_and_namespaced_objects_are_in_clb_system() {
    let m = load();
    assert_eq!(m.namespaces.len(), 1);
    assert_eq!(name(&m.namespaces[0].metadata), NAMESPACE);
    let namespaced = m
        .deployments
        .iter()
        .map(|o| &o.metadata)
        .chain(m.daemon_sets.iter().map(|o| &o.metadata))
        .chain(m.services.iter().map(|o| &o.metadata))
        .chain(m.service_accounts.iter().map(|o| &o.metadata))
        .chain(m.config_maps.iter().map(|o| &o.metadata))
        .chain(m.roles.iter().map(|o| &o.metadata))
        .chain(m.role_bindings.iter().map(|o| &o.metadata))
        .chain(m.pdbs.iter().map(|o| &o.metadata));
    for meta in namespaced {
        assert_eq!(
            meta.namespace.as_deref(),
            Some(NAMESPACE),
            "{} is not in {NAMESPACE}",
            name(meta)
        );
    }
}

#[test]
fn selectors_select_and_referred_objects_exist() {
    let m = load();
    for d in &m.deployments {
        let spec = d.spec.as_ref().expect("spec");
        let sel = spec.selector.match_labels.clone().unwrap_or_default();
        assert!(
            selects(&sel, &labels(&spec.template)),
            "Deployment {}: selector does not match its pod labels",
            name(&d.metadata)
        );
    }
    for d in &m.daemon_sets {
        let spec = d.spec.as_ref().expect("spec");
        let sel = spec.selector.match_labels.clone().unwrap_or_default();
        assert!(
            selects(&sel, &labels(&spec.template)),
            "DaemonSet {}: selector does not match its pod labels",
            name(&d.metadata)
        );
    }
    let accounts: BTreeSet<String> = m
        .service_accounts
        .iter()
        .map(|s| name(&s.metadata))
        .collect();
    for (w, t) in m.workloads() {
        let spec = t.spec.as_ref().expect("pod spec");
        let sa = spec.service_account_name.clone().unwrap_or_default();
        assert!(
            accounts.contains(&sa),
            "{w}: service account {sa:?} is not defined"
        );
        for c in &spec.containers {
            for from in c.env_from.iter().flatten() {
                if let Some(r) = &from.config_map_ref {
                    m.config_map(&r.name);
                }
            }
        }
    }
    for s in &m.services {
        let spec = s.spec.as_ref().expect("spec");
        let sel = spec.selector.clone().unwrap_or_default();
        let target = m
            .workloads()
            .into_iter()
            .find(|(_, t)| selects(&sel, &labels(t)))
            .unwrap_or_else(|| panic!("Service {} selects no workload", name(&s.metadata)));
        let ports: BTreeSet<String> = target
            .1
            .spec
            .as_ref()
            .expect("pod spec")
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| p.name.clone())
            .collect();
        for p in spec.ports.iter().flatten() {
            if let Some(IntOrString::String(port)) = &p.target_port {
                assert!(
                    ports.contains(port),
                    "Service {}: targetPort {port:?} is not a port of {}",
                    name(&s.metadata),
                    target.0
                );
            }
        }
    }
    for p in &m.pdbs {
        let sel = p
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .and_then(|s| s.match_labels.clone())
            .unwrap_or_default();
        assert!(
            m.workloads().iter().any(|(_, t)| selects(&sel, &labels(t))),
            "PodDisruptionBudget {} selects no workload",
            name(&p.metadata)
        );
    }
    let roles: BTreeSet<String> = m.cluster_roles.iter().map(|r| name(&r.metadata)).collect();
    for b in &m.cluster_role_bindings {
        assert!(
            roles.contains(&b.role_ref.name),
            "ClusterRoleBinding {}: ClusterRole {} is not defined",
            name(&b.metadata),
            b.role_ref.name
        );
        for s in b.subjects.iter().flatten() {
            assert_eq!(s.kind, "ServiceAccount");
            assert!(
                accounts.contains(&s.name) && s.namespace.as_deref() == Some(NAMESPACE),
                "ClusterRoleBinding {}: subject {}/{:?} is not defined",
                name(&b.metadata),
                s.name,
                s.namespace
            );
        }
    }
}

#[test]
fn every_pod_runs_as_non_root_with_requests_and_no_privilege_escalation() {
    let m = load();
    for (w, t) in m.workloads() {
        let spec = t.spec.as_ref().expect("pod spec");
        let psc = spec.security_context.as_ref();
        assert_eq!(
            psc.and_then(|s| s.run_as_non_root),
            Some(true),
            "{w}: runAsNonRoot"
        );
        for c in &spec.containers {
            let requests = c
                .resources
                .as_ref()
                .and_then(|r| r.requests.clone())
                .unwrap_or_default();
            assert!(
                requests.contains_key("cpu") && requests.contains_key("memory"),
                "{w}/{}: cpu and memory requests",
                c.name
            );
            let sc = c.security_context.as_ref();
            assert_eq!(
                sc.and_then(|s| s.allow_privilege_escalation),
                Some(false),
                "{w}/{}: allowPrivilegeEscalation",
                c.name
            );
        }
    }
}

fn assert_parses(m: &Rendered, workload: &str, binary: &str, cmd: clap::Command) {
    let c = m.container(workload);
    assert_eq!(
        c.command.clone().unwrap_or_default(),
        vec![binary.to_owned()],
        "{workload}: runs {binary}"
    );
    let argv = m.command_line(c, &cmd);
    if let Err(e) = cmd.try_get_matches_from(&argv) {
        panic!("{workload}: {argv:?} does not parse: {e}");
    }
}

#[test]
fn each_container_command_line_parses_with_its_binary_flags() {
    let m = load();
    assert_parses(
        &m,
        "clb-state-server",
        "clb-state-server",
        clb_state_server::config::Args::command(),
    );
    assert_parses(
        &m,
        "clb-sync-worker",
        "clb-sync-worker",
        clb_sync_worker::cli::Args::command(),
    );
}

#[test]
fn the_watcher_and_node_agent_command_lines_parse() {
    let m = load();
    assert_parses(
        &m,
        "clb-watcher",
        "clb-watcher",
        clb_watcher::cli::Args::command(),
    );
    assert_parses(
        &m,
        "clb-node-agent",
        "clb-watcher",
        clb_watcher::cli::Args::command(),
    );
    // The node agent learns its node from the downward API.
    let agent = m.container("clb-node-agent");
    let node = agent
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "CLB_NODE")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.clone());
    assert_eq!(node.as_deref(), Some("spec.nodeName"));
}

/// Whether deploy/'s RBAC (evaluated as the API server does) lets ServiceAccount `account` make
/// the call `(group, resource[/subresource], verb)` as its binary makes it: list and watch
/// cluster-wide, create in a namespace (`ns`), the other verbs on a named object in `ns`.
fn may(rbac: &Rbac, account: &str, ns: &str, (group, resource, verb): (&str, &str, &str)) -> bool {
    let (resource, sub) = resource.split_once('/').unwrap_or((resource, ""));
    let mut attrs = Attributes::new(verb, group, resource).subresource(sub);
    if !matches!(verb, "list" | "watch") {
        attrs = attrs.namespace(ns);
    }
    if !matches!(verb, "list" | "watch" | "create") {
        attrs = attrs.name(if resource == "leases" {
            "clb-state-server"
        } else {
            "x"
        });
    }
    rbac.authorize(&UserInfo::service_account(NAMESPACE, account), &attrs)
        .allowed
}

/// The rules bound cluster-wide (ClusterRoleBindings) to `account`.
fn rules_of(m: &Rendered, account: &str) -> Vec<PolicyRule> {
    m.rbac()
        .rules_for(&UserInfo::service_account(NAMESPACE, account), "")
}

/// `(group, resource, verb)` of every rule in `rules`.
fn flat(rules: &[PolicyRule]) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in rules {
        for g in rule.api_groups.iter().flatten() {
            for r in rule.resources.iter().flatten() {
                for v in &rule.verbs {
                    out.insert((g.clone(), r.clone(), v.clone()));
                }
            }
        }
    }
    out
}

#[test]
fn rbac_grants_what_the_watcher_and_node_agent_call_and_no_more() {
    let m = load();
    // What `clb-watcher` calls (docs/watcher.md) in cluster mode, with the deployed flags: pods
    // only with --pods=true (the base leaves them to the node agents), the write-back calls only
    // with --write-back=true.
    let args = watcher_args(&m, "clb-watcher");
    assert!(args.node.is_none(), "the watcher runs in cluster mode");
    let watcher = watcher_calls(
        args.pods && !args.no_pods,
        args.write_back,
        args.pool_services,
    );
    assert!(
        !watcher.contains(&("", "pods", "watch")),
        "the base runs node agents: the watcher must not watch pods (components/watcher-pods \
         does; the write-back only lists egress pods for a NAT gateway Event)"
    );
    let watcher = &watcher[..];
    let agent: &[(&str, &str, &str)] = &[
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
    ];
    let rbac = m.rbac();
    for (account, needed) in [("clb-watcher", watcher), ("clb-node-agent", agent)] {
        for call in needed {
            assert!(
                may(&rbac, account, "default", *call),
                "{account} may not {call:?}"
            );
        }
        // Least privilege: nothing that is not needed (no wildcards, no writes beyond the list).
        for (g, r, v) in flat(&kube_api_rules_of(&m, account)) {
            assert!(
                needed.contains(&(g.as_str(), r.as_str(), v.as_str())),
                "{account} is granted {v} {g}/{r}, which it does not use"
            );
        }
    }
    // Workers talk to no Kubernetes API at all, the state server to nothing cluster-wide.
    // (The roles on gateways and the reviews of callers: see
    // each_component_is_bound_to_exactly_the_gateway_roles_it_needs.)
    for account in ["clb-sync-worker", "clb-state-server"] {
        let rules = kube_api_rules_of(&m, account);
        assert!(rules.is_empty(), "{account} has RBAC rules");
    }
    assert!(namespaced_rules_of(&m, "clb-sync-worker").is_empty());
    // The state server: its Lease (leader election), in its own namespace, and nothing more.
    let lease: &[(&str, &str, &str)] = &[
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
    ];
    for call in lease {
        assert!(
            may(&rbac, "clb-state-server", NAMESPACE, *call),
            "clb-state-server may not {call:?}"
        );
        assert!(
            !may(&rbac, "clb-state-server", "default", *call),
            "clb-state-server may {call:?} outside {NAMESPACE}"
        );
    }
    let someone_elses = Attributes::new("update", "coordination.k8s.io", "leases")
        .namespace(NAMESPACE)
        .name("another-lease");
    let server = UserInfo::service_account(NAMESPACE, "clb-state-server");
    assert!(!rbac.authorize(&server, &someone_elses).allowed);
    let rules = namespaced_rules_of(&m, "clb-state-server");
    for (g, r, v) in flat(&rules) {
        assert!(
            lease.contains(&(g.as_str(), r.as_str(), v.as_str())),
            "clb-state-server is granted {v} {g}/{r}, which it does not use"
        );
    }
    for rule in &rules {
        // get and update only on its own Lease (create cannot be limited to a name).
        if rule.verbs.iter().any(|v| v != "create") {
            assert_eq!(
                rule.resource_names.as_deref(),
                Some(&["clb-state-server".to_owned()][..]),
                "{rule:?}"
            );
        }
    }
}

/// The rules bound by RoleBindings in clb-system to `account` (each of a Role).
fn namespaced_rules_of(m: &Rendered, account: &str) -> Vec<PolicyRule> {
    for b in &m.role_bindings {
        assert_eq!(
            b.role_ref.kind,
            "Role",
            "{}: a RoleBinding of a Role",
            name(&b.metadata)
        );
    }
    m.rbac()
        .namespaced_rules_for(&UserInfo::service_account(NAMESPACE, account), NAMESPACE)
}

#[test]
fn the_state_server_runs_two_replicas_active_standby() {
    let m = load();
    let d = m
        .deployments
        .iter()
        .find(|d| name(&d.metadata) == "clb-state-server")
        .expect("the state server's Deployment");
    let spec = d.spec.as_ref().expect("spec");
    assert_eq!(spec.replicas, Some(2));
    let strategy = spec.strategy.as_ref().expect("strategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let c = m.container("clb-state-server");
    let argv = m.command_line(c, &clb_state_server::config::Args::command());
    let args = <clb_state_server::config::Args as clap::Parser>::try_parse_from(&argv).unwrap();
    args.validate().expect("valid flags");
    assert!(args.leader_elect, "{argv:?}");
    assert!(
        args.expected_writers.is_empty(),
        "safety needs no --expected-writers"
    );
    assert_eq!(
        args.leader_elect_resource_namespace.as_deref(),
        Some(NAMESPACE)
    );
    // The identity is the pod name.
    assert!(c.env.iter().flatten().any(|e| {
        e.name == "CLB_SERVER_ID"
            && e.value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .is_some_and(|f| f.field_path == "metadata.name")
    }));
    // Ready = leads: readiness on /readyz.
    let probe = c.readiness_probe.as_ref().expect("a readiness probe");
    assert_eq!(
        probe.http_get.as_ref().and_then(|h| h.path.as_deref()),
        Some("/readyz")
    );
    let pod = spec.template.spec.as_ref().expect("pod spec");
    assert_ne!(pod.automount_service_account_token, Some(false));
    let anti = pod
        .affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .expect("pod anti-affinity");
    assert!(
        anti.preferred_during_scheduling_ignored_during_execution
            .iter()
            .flatten()
            .any(|t| t.pod_affinity_term.topology_key == "kubernetes.io/hostname")
    );
    let pdb = m
        .pdbs
        .iter()
        .find(|p| name(&p.metadata) == "clb-state-server")
        .expect("a PodDisruptionBudget");
    assert!(
        pdb.spec
            .as_ref()
            .is_some_and(|s| s.max_unavailable.is_some() || s.min_available.is_some())
    );
}

// ---- Authentication and authorization (docs/security.md) ----

/// The API groups of the caller checks: the project's roles on gateways, and the reviews.
const AUTH_GROUPS: [&str; 3] = [
    clb_state_server::auth::API_GROUP,
    "authentication.k8s.io",
    "authorization.k8s.io",
];

/// The rules bound to `account` that use the Kubernetes API itself (not the caller checks).
fn kube_api_rules_of(m: &Rendered, account: &str) -> Vec<PolicyRule> {
    rules_of(m, account)
        .into_iter()
        .filter(|r| {
            !r.api_groups
                .iter()
                .flatten()
                .all(|g| AUTH_GROUPS.contains(&g.as_str()))
        })
        .collect()
}

/// `(group, resource, verb, resourceNames)` of every rule of the caller-check groups bound to
/// `account`.
fn auth_grants_of(m: &Rendered, account: &str) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in rules_of(m, account) {
        for g in rule.api_groups.iter().flatten() {
            if !AUTH_GROUPS.contains(&g.as_str()) {
                continue;
            }
            assert!(rule.resource_names.is_none(), "{account}: {rule:?}");
            for r in rule.resources.iter().flatten() {
                for v in &rule.verbs {
                    out.insert((g.clone(), r.clone(), v.clone()));
                }
            }
        }
    }
    out
}

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

// ---- Operability: probes, scheduling, Pod Security, image, optional components ----

/// The Kubernetes API calls of `clb-watcher` in cluster mode (docs/watcher.md): Services,
/// EndpointSlices and Nodes are listed and watched; pods only with `--pods=true`; with
/// `--write-back=true` the finalizer (a patch of the Service), its status, egress pods listed for
/// the Events about brought NAT gateways, and Events on Services
/// (kube's recorder creates an Event, then patches it into a series); with `--pool-services=true`
/// (and write-back) PoolServices are listed, watched, created and deleted, and their status patched.
fn watcher_calls(
    pods: bool,
    write_back: bool,
    pool_services: bool,
) -> Vec<(&'static str, &'static str, &'static str)> {
    let mut calls = vec![
        ("", "services", "list"),
        ("", "services", "watch"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("discovery.k8s.io", "endpointslices", "list"),
        ("discovery.k8s.io", "endpointslices", "watch"),
    ];
    if pods {
        calls.extend([("", "pods", "list"), ("", "pods", "watch")]);
    }
    if write_back {
        calls.extend([
            // The egress pods an Event about a brought NAT gateway regards.
            ("", "pods", "list"),
            ("", "services", "patch"),
            ("", "services/status", "patch"),
            ("events.k8s.io", "events", "create"),
            ("events.k8s.io", "events", "patch"),
        ]);
    }
    if pool_services && write_back {
        calls.extend([
            ("network.openyurt.io", "poolservices", "list"),
            ("network.openyurt.io", "poolservices", "watch"),
            ("network.openyurt.io", "poolservices", "create"),
            ("network.openyurt.io", "poolservices", "delete"),
            ("network.openyurt.io", "poolservices/status", "patch"),
        ]);
    }
    calls
}

/// The flags `workload` runs `clb-watcher` with, parsed by the watcher's own parser.
fn watcher_args(m: &Rendered, workload: &str) -> clb_watcher::cli::Args {
    let cmd = clb_watcher::cli::Args::command();
    let mut argv = m.container_argv(workload, &cmd);
    // `--metrics-listen` is checked by every_component_is_probed_on_its_metrics_port and by
    // the_watcher_and_node_agent_command_lines_parse; it is set aside here only while the
    // watcher's parser does not know it yet, so that this test checks the RBAC alone.
    if !cmd
        .get_arguments()
        .any(|a| a.get_long() == Some("metrics-listen"))
    {
        argv.retain(|a| !a.starts_with("--metrics-listen"));
    }
    <clb_watcher::cli::Args as clap::Parser>::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("{workload}: {argv:?}: {e}"))
}

/// The port `--metrics-listen=HOST:PORT` of a container's args.
fn metrics_listen_port(c: &Container) -> Option<u16> {
    c.args
        .iter()
        .flatten()
        .find_map(|a| a.strip_prefix("--metrics-listen="))
        .map(|addr| {
            addr.parse::<std::net::SocketAddr>()
                .unwrap_or_else(|e| panic!("--metrics-listen={addr}: {e}"))
                .port()
        })
}

#[test]
fn every_component_is_probed_on_its_metrics_port() {
    let m = load();
    assert_eq!(
        m.workloads().len(),
        4,
        "state server, worker, watcher, node agent"
    );
    for (w, t) in m.workloads() {
        for c in &t.spec.as_ref().expect("pod spec").containers {
            // The metrics port: named `metrics`, the one --metrics-listen binds on every address.
            let port = c
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some("metrics"))
                .unwrap_or_else(|| panic!("{w}/{}: no port named metrics", c.name));
            let listen = c
                .args
                .iter()
                .flatten()
                .find(|a| a.starts_with("--metrics-listen="))
                .unwrap_or_else(|| panic!("{w}/{}: no --metrics-listen", c.name));
            assert!(
                listen.starts_with("--metrics-listen=0.0.0.0:"),
                "{w}/{}: {listen} is not reachable by the kubelet",
                c.name
            );
            assert_eq!(
                metrics_listen_port(c).map(i32::from),
                Some(port.container_port),
                "{w}/{}: --metrics-listen and the metrics port differ",
                c.name
            );
            for (kind, probe, path) in [
                ("liveness", &c.liveness_probe, "/healthz"),
                ("readiness", &c.readiness_probe, "/readyz"),
            ] {
                let probe = probe
                    .as_ref()
                    .unwrap_or_else(|| panic!("{w}/{}: no {kind} probe", c.name));
                match (&probe.http_get, &probe.grpc) {
                    (Some(h), None) => {
                        assert_eq!(h.path.as_deref(), Some(path), "{w}/{}: {kind}", c.name);
                        assert_eq!(
                            h.port,
                            IntOrString::String("metrics".to_owned()),
                            "{w}/{}: {kind} probe port",
                            c.name
                        );
                        assert_ne!(
                            h.scheme.as_deref(),
                            Some("HTTPS"),
                            "{w}/{}: the metrics port is plain HTTP",
                            c.name
                        );
                    }
                    (None, Some(g)) => assert!(
                        c.ports.iter().flatten().any(|p| p.container_port == g.port),
                        "{w}/{}: gRPC {kind} probe on port {} that the container does not expose",
                        c.name,
                        g.port
                    ),
                    _ => panic!("{w}/{}: {kind} probe is neither httpGet nor grpc", c.name),
                }
            }
            // A liveness probe more patient than readiness: a slow moment makes the pod
            // unready first, and only a long hang restarts it.
            let live = c.liveness_probe.as_ref().expect("liveness");
            let ready = c.readiness_probe.as_ref().expect("readiness");
            let window = |p: &k8s_openapi::api::core::v1::Probe| {
                p.period_seconds.unwrap_or(10) * p.failure_threshold.unwrap_or(3)
            };
            assert!(
                window(live) > window(ready),
                "{w}/{}: liveness window {} s <= readiness window {} s",
                c.name,
                window(live),
                window(ready)
            );
        }
    }
}

#[test]
fn every_workload_runs_on_linux_nodes_only() {
    let m = load();
    for (w, t) in m.workloads() {
        let selector = t
            .spec
            .as_ref()
            .expect("pod spec")
            .node_selector
            .clone()
            .unwrap_or_default();
        assert_eq!(
            selector.get("kubernetes.io/os").map(String::as_str),
            Some("linux"),
            "{w}: no kubernetes.io/os=linux node selector"
        );
    }
}

#[test]
fn the_node_agent_tolerates_node_conditions_not_every_taint() {
    let m = load();
    let (_, t) = m
        .workloads()
        .into_iter()
        .find(|(n, _)| n == "clb-node-agent")
        .expect("the node agent's DaemonSet");
    let tolerations = t
        .spec
        .as_ref()
        .expect("pod spec")
        .tolerations
        .clone()
        .unwrap_or_default();
    for tol in &tolerations {
        // An empty key with Exists tolerates every taint (Windows pools, dedicated pools...).
        assert!(
            tol.key.as_deref().is_some_and(|k| !k.is_empty()),
            "a toleration without a key tolerates every taint: {tol:?}"
        );
        // A toleration of every effect of a key only for CriticalAddonsOnly (whose effect varies).
        if tol.effect.is_none() {
            assert_eq!(tol.key.as_deref(), Some("CriticalAddonsOnly"), "{tol:?}");
        }
    }
    let tolerates = |key: &str, effect: &str| {
        tolerations.iter().any(|t| {
            t.key.as_deref() == Some(key)
                && t.operator.as_deref() == Some("Exists")
                && t.effect.as_deref().is_none_or(|e| e == effect)
        })
    };
    // The node agent stays on a node that is not ready or unreachable (its pods are still there)
    // and is scheduled on nodes under pressure, cordoned, or reserved for critical add-ons.
    for (key, effect) in [
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
        ("CriticalAddonsOnly", "NoSchedule"),
    ] {
        assert!(
            tolerates(key, effect),
            "the node agent does not tolerate {key}:{effect}"
        );
    }
    // It is not meant for nodes without a pod network or for Windows nodes.
    assert!(!tolerates(
        "node.kubernetes.io/network-unavailable",
        "NoSchedule"
    ));
    assert!(!tolerates("os", "NoSchedule"));
}

/// Volume types the `restricted` Pod Security profile allows.
const RESTRICTED_VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

#[test]
fn the_namespace_enforces_restricted_pod_security_and_every_pod_satisfies_it() {
    let m = load();
    let ns_labels = m.namespaces[0].metadata.labels.clone().unwrap_or_default();
    for mode in ["enforce", "audit", "warn"] {
        assert_eq!(
            ns_labels
                .get(&format!("pod-security.kubernetes.io/{mode}"))
                .map(String::as_str),
            Some("restricted"),
            "namespace label pod-security.kubernetes.io/{mode}"
        );
    }
    for (w, t) in m.workloads() {
        let spec = t.spec.as_ref().expect("pod spec");
        assert_ne!(spec.host_network, Some(true), "{w}: hostNetwork");
        assert_ne!(spec.host_pid, Some(true), "{w}: hostPID");
        assert_ne!(spec.host_ipc, Some(true), "{w}: hostIPC");
        let psc = spec.security_context.clone().unwrap_or_default();
        assert_ne!(psc.run_as_user, Some(0), "{w}: runAsUser 0");
        for v in spec.volumes.iter().flatten() {
            let json = serde_json::to_value(v).expect("volume serialises");
            let kinds: Vec<&String> = json
                .as_object()
                .expect("volume object")
                .keys()
                .filter(|k| *k != "name")
                .collect();
            assert!(
                kinds
                    .iter()
                    .all(|k| RESTRICTED_VOLUMES.contains(&k.as_str())),
                "{w}: volume {} of type {kinds:?} is not allowed by restricted",
                v.name
            );
        }
        let containers = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten());
        for c in containers {
            let sc = c.security_context.clone().unwrap_or_default();
            let who = format!("{w}/{}", c.name);
            assert_ne!(sc.privileged, Some(true), "{who}: privileged");
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{who}");
            assert!(
                sc.run_as_non_root.or(psc.run_as_non_root) == Some(true),
                "{who}: runAsNonRoot"
            );
            assert_ne!(sc.run_as_user, Some(0), "{who}: runAsUser 0");
            let seccomp = sc
                .seccomp_profile
                .as_ref()
                .or(psc.seccomp_profile.as_ref())
                .map(|p| p.type_.as_str());
            assert!(
                matches!(seccomp, Some("RuntimeDefault" | "Localhost")),
                "{who}: seccompProfile {seccomp:?}"
            );
            let caps = sc.capabilities.clone().unwrap_or_default();
            assert!(
                caps.drop.iter().flatten().any(|d| d == "ALL"),
                "{who}: capabilities.drop ALL"
            );
            assert!(
                caps.add.iter().flatten().all(|a| a == "NET_BIND_SERVICE"),
                "{who}: capabilities.add {:?}",
                caps.add
            );
            for p in c.ports.iter().flatten() {
                assert!(p.host_port.is_none_or(|h| h == 0), "{who}: hostPort");
            }
        }
    }
}

#[test]
fn the_kustomization_points_every_image_at_a_registry() {
    // Rendered, every container's image is the kustomization's `images:` entry for it: an image
    // without an entry keeps its bare name (`clb:…`), which names no registry.
    let m = load();
    for (w, t) in m.workloads() {
        for c in &t.spec.as_ref().expect("pod spec").containers {
            let image = c.image.clone().unwrap_or_default();
            let (name, pinned) = match image.split_once('@') {
                Some((n, _)) => (n, true),
                None => match image.rsplit_once(':').filter(|(_, t)| !t.contains('/')) {
                    Some((n, t)) => (n, !t.is_empty()),
                    None => (image.as_str(), false),
                },
            };
            let registry = name.split('/').next().unwrap_or_default();
            assert!(
                name.contains('/') && (registry.contains('.') || registry.contains(':')),
                "{w}/{}: image {image} names no registry (no images: entry for it?)",
                c.name
            );
            assert!(
                pinned,
                "{w}/{}: image {image} pins no tag or digest",
                c.name
            );
        }
    }
}

/// The ClusterRoleBindings and ClusterRoles that `component` adds (bound only to the watcher),
/// and what they grant the watcher as deploy/'s RBAC evaluates it: `(group, resource, verb)`
/// allowed with the component and not without.
fn component_grants(component: &str) -> BTreeSet<(String, String, String)> {
    let with = Rendered::load(&[component]);
    let prefix = format!("components/{component}/");
    for d in with
        .documents
        .iter()
        .filter(|d| d.source.starts_with(&prefix))
    {
        match d.kind() {
            "ClusterRole" | "CustomResourceDefinition" => {}
            "ClusterRoleBinding" => {
                let subjects: Vec<_> = d.value["subjects"]
                    .as_array()
                    .expect("subjects")
                    .iter()
                    .map(|s| (&s["kind"], &s["name"], &s["namespace"]))
                    .collect();
                assert_eq!(
                    subjects,
                    [(
                        &serde_json::json!("ServiceAccount"),
                        &serde_json::json!("clb-watcher"),
                        &serde_json::json!(NAMESPACE)
                    )],
                    "{}",
                    d.source
                );
            }
            other => panic!("unexpected {other} in {}", d.source),
        }
    }
    let base = flat(&rules_of(&load(), "clb-watcher"));
    let extra: BTreeSet<_> = flat(&rules_of(&with, "clb-watcher"))
        .difference(&base)
        .cloned()
        .collect();
    // Evaluated: the watcher may make each call the rules list (and could not without).
    let (rbac, before) = (with.rbac(), load().rbac());
    for (g, r, v) in &extra {
        let call = (g.as_str(), r.as_str(), v.as_str());
        assert!(may(&rbac, "clb-watcher", "default", call), "{call:?}");
        assert!(!may(&before, "clb-watcher", "default", call), "{call:?}");
    }
    extra
}

/// The watcher's calls that `with` adds to the base's (write-back on), as strings.
fn extra_calls(
    base: Vec<(&str, &str, &str)>,
    with: Vec<(&str, &str, &str)>,
) -> BTreeSet<(String, String, String)> {
    let base: BTreeSet<_> = base.into_iter().collect();
    with.into_iter()
        .filter(|c| !base.contains(c))
        .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
        .collect()
}

#[test]
fn the_watcher_pods_component_grants_pods_exactly_when_it_sets_pods_true() {
    let dir = deploy_dir().join("components/watcher-pods");
    let k = kustomization(&dir);
    assert_eq!(k["kind"].as_str(), Some("Component"));
    // Its RBAC: pods list/watch for the watcher, nothing else.
    assert_eq!(
        component_grants("watcher-pods"),
        extra_calls(
            watcher_calls(false, true, false),
            watcher_calls(true, true, false)
        )
    );
    // Its patch of the watcher tests the value it replaces, and the watcher's --pods=false
    // becomes --pods=true.
    let tests_first = k["patches"]
        .as_sequence()
        .expect("patches")
        .iter()
        .filter_map(|p| yaml_serde::from_str::<yaml_serde::Value>(p["patch"].as_str()?).ok())
        .filter_map(|patch| patch.as_sequence().cloned())
        .all(|ops| ops.iter().any(|o| o["op"].as_str() == Some("test")));
    assert!(tests_first, "the patch tests the value it replaces");
    let m = load();
    let with = Rendered::load(&["watcher-pods"]);
    assert!(!watcher_args(&m, "clb-watcher").pods);
    let args = watcher_args(&with, "clb-watcher");
    assert!(args.pods && !args.no_pods, "the component sets --pods=true");
    // The objects it deletes (the node agents, which would report the same pods) exist in the
    // base (a deletion of a missing object fails the rendering) and nothing else goes.
    let objects = |r: &Rendered| -> BTreeSet<(String, String)> {
        r.documents
            .iter()
            .map(|d| (d.kind().to_owned(), d.name().to_owned()))
            .collect()
    };
    let deleted: BTreeSet<_> = objects(&m).difference(&objects(&with)).cloned().collect();
    let node_agent_objects: BTreeSet<(String, String)> = [
        ("DaemonSet", "clb-node-agent"),
        ("ServiceAccount", "clb-node-agent"),
        ("ClusterRole", "clb-node-agent"),
        ("ClusterRoleBinding", "clb-node-agent"),
        ("ClusterRoleBinding", "clb-node-writer-node-agent"),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_owned(), n.to_owned()))
    .collect();
    assert_eq!(deleted, node_agent_objects);
}

#[test]
fn the_poolservice_component_installs_the_crd_and_grants_what_the_watcher_then_calls() {
    let dir = deploy_dir().join("components/poolservice");
    let k = kustomization(&dir);
    assert_eq!(k["kind"].as_str(), Some("Component"));
    let with = Rendered::load(&["poolservice"]);
    // The CRD: OpenYurt's group, version, kind and plural (what the watcher's types say), with
    // the status subresource the watcher patches.
    let crds = with.crds();
    assert_eq!(crds.len(), 1);
    let crd = crds[0];
    use kube::Resource;
    type Ps = clb_watcher::poolservice::PoolService;
    assert_eq!(
        crd["metadata"]["name"].as_str(),
        Some(format!("{}.{}", Ps::plural(&()), Ps::group(&())).as_str())
    );
    assert_eq!(crd["spec"]["group"].as_str(), Some(&*Ps::group(&())));
    assert_eq!(crd["spec"]["names"]["kind"].as_str(), Some(&*Ps::kind(&())));
    assert_eq!(crd["spec"]["scope"].as_str(), Some("Namespaced"));
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"].as_str(), Some(&*Ps::version(&())));
    assert!(version["subresources"]["status"].is_object(), "{version:?}");
    let props = &version["schema"]["openAPIV3Schema"]["properties"];
    for field in ["loadBalancerClass", "nodepoolName"] {
        assert!(
            props["spec"]["properties"][field].is_object(),
            "spec.{field}"
        );
    }
    for field in ["loadBalancer", "conditions"] {
        assert!(
            props["status"]["properties"][field].is_object(),
            "status.{field}"
        );
    }
    // Its RBAC: exactly what --pool-services adds to the watcher's calls.
    assert_eq!(
        component_grants("poolservice"),
        extra_calls(
            watcher_calls(false, true, false),
            watcher_calls(false, true, true)
        )
    );
    // Its patches: the watcher gets the gateways file (mounted from the clb-gateways ConfigMap)
    // and --pool-services=true, the node agents the same file; both command lines still parse.
    let targets: BTreeSet<(String, String)> = k["patches"]
        .as_sequence()
        .expect("patches")
        .iter()
        .map(|p| {
            (
                p["target"]["kind"].as_str().expect("kind").to_owned(),
                p["target"]["name"].as_str().expect("name").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        targets,
        [
            ("DaemonSet".to_owned(), "clb-node-agent".to_owned()),
            ("Deployment".to_owned(), "clb-watcher".to_owned()),
        ]
        .into()
    );
    let watcher = watcher_args(&with, "clb-watcher");
    assert!(
        watcher.pool_services,
        "the component sets --pool-services=true"
    );
    for workload in ["clb-watcher", "clb-node-agent"] {
        let args = watcher_args(&with, workload);
        let file = args
            .gateways_file
            .unwrap_or_else(|| panic!("{workload}: the component sets --gateways-file"));
        let (_, template) = with
            .workloads()
            .into_iter()
            .find(|(n, _)| n == workload)
            .expect("rendered");
        let pod = template.spec.as_ref().expect("pod spec");
        let mount = pod.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .find(|v| file.starts_with(&v.mount_path))
            .unwrap_or_else(|| panic!("{workload}: the gateways file is mounted"));
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .expect("the mount's volume");
        assert_eq!(
            volume.config_map.as_ref().map(|c| c.name.as_str()),
            Some("clb-gateways"),
            "{workload}: the gateways file the state server and the workers read"
        );
    }
}

#[test]
fn every_crd_under_deploy_is_a_structural_schema_the_api_server_accepts() {
    // Every component (and the base), rendered; each CRD once.
    let mut components: Vec<String> = std::fs::read_dir(deploy_dir().join("components"))
        .expect("deploy/components")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    components.sort();
    let mut checked = BTreeSet::new();
    let renderings =
        std::iter::once(load()).chain(components.iter().map(|c| Rendered::load(&[c.as_str()])));
    for r in renderings {
        for d in r.of_kind("CustomResourceDefinition") {
            if !checked.insert(d.source.clone()) {
                continue;
            }
            let errors = clb_tests::crd_schema::check_crd(&d.value);
            assert!(
                errors.is_empty(),
                "{}: the API server would refuse this CRD:\n{}",
                d.source,
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
    assert!(
        checked.contains("components/poolservice/crd.yaml"),
        "{checked:?}"
    );
}

#[test]
fn the_monitoring_component_scrapes_every_components_metrics_port() {
    let m = load();
    let k = kustomization(&deploy_dir().join("components/monitoring"));
    assert_eq!(k["kind"].as_str(), Some("Component"));
    let with = Rendered::load(&["monitoring"]);
    let mut monitors = 0;
    for d in with
        .documents
        .iter()
        .filter(|d| d.source.starts_with("components/monitoring/"))
    {
        let doc = &d.value;
        assert_eq!(doc["apiVersion"].as_str(), Some("monitoring.coreos.com/v1"));
        assert_eq!(doc["kind"].as_str(), Some("PodMonitor"));
        assert_eq!(doc["metadata"]["namespace"].as_str(), Some(NAMESPACE));
        monitors += 1;
        let selector: BTreeMap<String, String> =
            serde_json::from_value(doc["spec"]["selector"]["matchLabels"].clone())
                .expect("spec.selector.matchLabels");
        let endpoints = doc["spec"]["podMetricsEndpoints"]
            .as_array()
            .expect("podMetricsEndpoints");
        for (w, t) in m.workloads() {
            assert!(selects(&selector, &labels(t)), "{w} is not scraped");
            let ports: BTreeSet<String> = t
                .spec
                .as_ref()
                .expect("pod spec")
                .containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .filter_map(|p| p.name.clone())
                .collect();
            for e in endpoints {
                let port = e["port"].as_str().expect("a named port");
                assert!(ports.contains(port), "{w} has no port {port}");
                assert_eq!(e["path"].as_str().unwrap_or("/metrics"), "/metrics");
            }
        }
    }
    assert_eq!(monitors, 1);
}

/// The lines of the `[section]` of a TOML file, up to the next section.
fn toml_section<'a>(text: &'a str, section: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| l.trim() != section)
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

#[test]
fn the_image_caches_dependencies_and_ships_stripped_binaries_as_non_root() {
    let root = deploy_dir().join("..");
    let dockerfile = std::fs::read_to_string(deploy_dir().join("Dockerfile")).expect("Dockerfile");
    let ignore = std::fs::read_to_string(root.join(".dockerignore")).expect(".dockerignore");
    let ignored: BTreeSet<&str> = ignore
        .lines()
        .map(|l| l.trim().trim_end_matches('/'))
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for must in ["target", ".git"] {
        assert!(
            ignored.contains(must),
            ".dockerignore does not exclude {must}"
        );
    }
    // One instruction a line: continuation lines joined.
    let joined = dockerfile.replace("\\\n", " ");
    let instructions: Vec<&str> = joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    // The build stage: dependencies (cargo chef cook) are compiled before the sources are copied.
    let stage_start = instructions
        .iter()
        .position(|l| l.starts_with("FROM") && l.ends_with("AS build"))
        .expect("a build stage");
    let build_stage = &instructions[stage_start..];
    let cook = build_stage
        .iter()
        .position(|l| l.contains("cargo chef cook"))
        .expect("a dependency layer (cargo chef cook)");
    let copy_sources = build_stage
        .iter()
        .position(|l| *l == "COPY . .")
        .expect("the sources are copied");
    let build = build_stage
        .iter()
        .position(|l| l.contains("cargo build"))
        .expect("cargo build");
    assert!(cook < copy_sources && copy_sources < build);
    // The commit reaches clb_build_info{commit}: a build argument turned into the environment
    // of the build (after the dependency layer, so a new commit does not rebuild dependencies).
    let commit_env = build_stage
        .iter()
        .position(|l| l.starts_with("ENV CLB_GIT_COMMIT="))
        .expect("ENV CLB_GIT_COMMIT in the build stage");
    assert!(
        build_stage[..commit_env]
            .iter()
            .any(|l| l.starts_with("ARG CLB_GIT_COMMIT")),
        "CLB_GIT_COMMIT is a build argument"
    );
    assert!(cook < commit_env && commit_env < build);
    assert!(
        build_stage[cook].contains("--profile dist")
            && build_stage[build].contains("--profile dist"),
        "the dependency layer and the build use the same (dist) profile"
    );
    assert!(
        !dockerfile.contains("COPY target"),
        "no prebuilt binaries from the context"
    );
    // The dist profile: release, stripped.
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let dist = toml_section(&cargo, "[profile.dist]");
    assert!(dist.contains(&"inherits = \"release\""), "{dist:?}");
    assert!(dist.contains(&"strip = true"), "{dist:?}");
    // Every binary the manifests run is built and copied.
    let m = load();
    for (w, t) in m.workloads() {
        for c in &t.spec.as_ref().expect("pod spec").containers {
            for bin in c.command.iter().flatten() {
                assert!(
                    build_stage[build].contains(&format!("--bin {bin}"))
                        && dockerfile.contains(&format!("target/dist/{bin}")),
                    "{w}: {bin} is not in the image"
                );
            }
        }
    }
    // The runtime stage: distroless, as the non-root user the pods run as.
    let last_from = instructions
        .iter()
        .rposition(|l| l.starts_with("FROM"))
        .expect("FROM");
    assert!(
        instructions[last_from].contains("gcr.io/distroless/"),
        "{}",
        instructions[last_from]
    );
    let user = instructions[last_from..]
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("USER in the runtime stage");
    let uid: i64 = user
        .split(':')
        .next()
        .and_then(|u| u.parse().ok())
        .expect("a numeric USER (runAsNonRoot verifies it)");
    assert_ne!(uid, 0);
    for (w, t) in m.workloads() {
        let psc = t.spec.as_ref().expect("pod spec").security_context.clone();
        assert_eq!(
            psc.and_then(|s| s.run_as_user),
            Some(uid),
            "{w}: runAsUser is not the image's user"
        );
    }
}
