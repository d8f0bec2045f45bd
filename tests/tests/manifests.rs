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
            lease.contains(&(g.as_str(), r.as_str(), v.as_str()))
                || tls::STATE_SERVER_TLS_CALLS.contains(&(g.as_str(), r.as_str(), v.as_str())),
            "clb-state-server is granted {v} {g}/{r}, which it does not use"
        );
    }
    // (Its TLS Secret and CA bundle, by name: tls::the_state_server_may_keep_only_its_own_certificate.)
    for rule in rules
        .iter()
        .filter(|r| r.resources.iter().flatten().any(|r| r == "leases"))
    {
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

#[path = "manifests/auth.rs"]
mod auth;
#[path = "manifests/components.rs"]
mod components;
#[path = "manifests/operability.rs"]
mod operability;
#[path = "manifests/tls.rs"]
mod tls;
