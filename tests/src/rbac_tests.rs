//! Unit tests of [`super`]: the RBAC authorizer's rules, one by one.

use super::*;

fn alice() -> UserInfo {
    UserInfo::user("alice")
}

fn gateways(verb: &str, name: &str) -> Attributes {
    Attributes::new(verb, "clb.azure.com", "gateways").name(name)
}

fn with(roles: Vec<ClusterRole>, bindings: Vec<ClusterRoleBinding>) -> Rbac {
    let mut rbac = Rbac::new();
    roles.into_iter().for_each(|r| rbac.add_cluster_role(r));
    bindings
        .into_iter()
        .for_each(|b| rbac.add_cluster_role_binding(b));
    rbac
}

#[test]
fn nothing_is_allowed_without_a_binding() {
    let rbac = with(
        vec![cluster_role("w", vec![rule(&["*"], &["*"], &["*"])])],
        vec![],
    );
    assert!(!rbac.authorize(&alice(), &gateways("write", "x")).allowed);
}

#[test]
fn a_cluster_role_binding_to_a_user_allows_the_roles_verbs_and_names_itself() {
    let rbac = with(
        vec![cluster_role(
            "clb-reader",
            vec![rule(&["clb.azure.com"], &["gateways"], &["get"])],
        )],
        vec![cluster_role_binding(
            "clb-reader-alice",
            "clb-reader",
            vec![user("alice")],
        )],
    );
    let d = rbac.authorize(&alice(), &gateways("get", ""));
    assert!(d.allowed);
    assert_eq!(
        d.reason,
        "RBAC: allowed by ClusterRoleBinding \"clb-reader-alice\" of ClusterRole \
         \"clb-reader\" to User \"alice\""
    );
    // Namespaced requests too: a ClusterRoleBinding grants in every namespace.
    assert!(
        rbac.authorize(&alice(), &gateways("get", "a").namespace("ns"))
            .allowed
    );
    for (u, a) in [
        (UserInfo::user("bob"), gateways("get", "")),
        (alice(), gateways("write", "")),
        (alice(), Attributes::new("get", "", "gateways")),
        (alice(), Attributes::new("get", "clb.azure.com", "services")),
    ] {
        assert!(!rbac.authorize(&u, &a).allowed, "{u:?} {a:?}");
    }
}

#[test]
fn wildcards_match_every_verb_group_and_resource_including_subresources() {
    let r = rule(&["*"], &["*"], &["*"]);
    let attrs = Attributes::new("patch", "", "services")
        .subresource("status")
        .namespace("default")
        .name("x");
    assert!(rule_allows(&r, &attrs));
    let r = rule(&[""], &["*/status"], &["patch"]);
    assert!(rule_allows(&r, &attrs));
    assert!(!rule_allows(
        &r,
        &Attributes::new("patch", "", "services").name("x")
    ));
}

#[test]
fn subresources_are_matched_as_resource_slash_subresource_only() {
    let status = Attributes::new("patch", "", "services").subresource("status");
    let plain = Attributes::new("patch", "", "services");
    let services = rule(&[""], &["services"], &["patch"]);
    let statuses = rule(&[""], &["services/status"], &["patch"]);
    assert!(rule_allows(&services, &plain));
    assert!(
        !rule_allows(&services, &status),
        "services does not cover services/status"
    );
    assert!(rule_allows(&statuses, &status));
    assert!(!rule_allows(&statuses, &plain));
}

#[test]
fn resource_names_limit_to_those_names_and_never_match_an_empty_name() {
    let mut r = rule(&["clb.azure.com"], &["gateways"], &["write"]);
    r.resource_names = Some(vec!["blue".to_owned()]);
    assert!(rule_allows(&r, &gateways("write", "blue")));
    assert!(!rule_allows(&r, &gateways("write", "green")));
    assert!(
        !rule_allows(&r, &gateways("write", "")),
        "a request without a name"
    );
    let unlimited = rule(&["clb.azure.com"], &["gateways"], &["write"]);
    assert!(rule_allows(&unlimited, &gateways("write", "")));
    assert!(rule_allows(&unlimited, &gateways("write", "green")));
}

#[test]
fn service_accounts_match_by_namespace_and_name_and_by_their_groups() {
    let sa = UserInfo::service_account("clb-system", "clb-watcher");
    assert_eq!(sa.name, "system:serviceaccount:clb-system:clb-watcher");
    let role = cluster_role("r", vec![rule(&[""], &["pods"], &["list"])]);
    let list = Attributes::new("list", "", "pods");
    for (subject, allowed) in [
        (service_account("clb-system", "clb-watcher"), true),
        (service_account("other", "clb-watcher"), false),
        (service_account("clb-system", "clb-worker"), false),
        (user("system:serviceaccount:clb-system:clb-watcher"), true),
        (group("system:serviceaccounts"), true),
        (group("system:serviceaccounts:clb-system"), true),
        (group("system:serviceaccounts:other"), false),
        (group("system:authenticated"), true),
        (group("system:unauthenticated"), false),
    ] {
        let rbac = with(
            vec![role.clone()],
            vec![cluster_role_binding("b", "r", vec![subject.clone()])],
        );
        assert_eq!(rbac.authorize(&sa, &list).allowed, allowed, "{subject:?}");
    }
    // A ServiceAccount subject of a ClusterRoleBinding needs its namespace.
    let mut nameless = service_account("", "clb-watcher");
    nameless.namespace = None;
    let rbac = with(
        vec![role],
        vec![cluster_role_binding("b", "r", vec![nameless])],
    );
    assert!(!rbac.authorize(&sa, &list).allowed);
}

#[test]
fn a_role_binding_grants_only_in_its_namespace() {
    let mut rbac = Rbac::new();
    rbac.add_role(role(
        "clb-system",
        "leases",
        vec![rule(&["coordination.k8s.io"], &["leases"], &["get"])],
    ));
    rbac.add_cluster_role(cluster_role(
        "reader",
        vec![rule(&[""], &["pods"], &["get"])],
    ));
    let mut sa = service_account("clb-system", "clb-state-server");
    sa.namespace = None; // a RoleBinding's subject defaults to the binding's namespace
    rbac.add_role_binding(role_binding(
        "clb-system",
        "leases",
        RoleKind::Role,
        "leases",
        vec![sa.clone()],
    ));
    rbac.add_role_binding(role_binding(
        "clb-system",
        "pods",
        RoleKind::ClusterRole,
        "reader",
        vec![sa],
    ));
    let who = UserInfo::service_account("clb-system", "clb-state-server");
    let lease = Attributes::new("get", "coordination.k8s.io", "leases").name("l");
    let pod = Attributes::new("get", "", "pods").name("p");
    assert!(
        rbac.authorize(&who, &lease.clone().namespace("clb-system"))
            .allowed
    );
    assert!(
        rbac.authorize(&who, &pod.clone().namespace("clb-system"))
            .allowed
    );
    let d = rbac.authorize(&who, &lease.clone().namespace("clb-system"));
    assert_eq!(
        d.reason,
        "RBAC: allowed by RoleBinding \"leases/clb-system\" of Role \"leases\" to \
         ServiceAccount \"clb-state-server/\""
    );
    for other in ["default", ""] {
        assert!(
            !rbac
                .authorize(&who, &lease.clone().namespace(other))
                .allowed
        );
        assert!(!rbac.authorize(&who, &pod.clone().namespace(other)).allowed);
    }
    assert_eq!(rbac.rules_for(&who, "").len(), 0);
    assert_eq!(rbac.rules_for(&who, "clb-system").len(), 2);
    assert_eq!(rbac.namespaced_rules_for(&who, "clb-system").len(), 2);
}

#[test]
fn a_binding_of_a_missing_role_grants_nothing_and_removal_takes_effect() {
    let mut rbac = with(
        vec![cluster_role("r", vec![rule(&[""], &["pods"], &["get"])])],
        vec![cluster_role_binding("b", "r", vec![user("alice")])],
    );
    let get = Attributes::new("get", "", "pods").name("p");
    assert!(rbac.authorize(&alice(), &get).allowed);
    assert!(rbac.remove("ClusterRole", "", "r"));
    assert!(!rbac.authorize(&alice(), &get).allowed);
    rbac.add_cluster_role(cluster_role("r", vec![rule(&[""], &["pods"], &["get"])]));
    assert!(rbac.authorize(&alice(), &get).allowed);
    assert!(rbac.remove("ClusterRoleBinding", "", "b"));
    assert!(!rbac.remove("ClusterRoleBinding", "", "b"));
    assert!(!rbac.authorize(&alice(), &get).allowed);
    // A ClusterRoleBinding cannot refer to a Role.
    let mut b = cluster_role_binding("b", "r", vec![user("alice")]);
    b.role_ref.kind = "Role".to_owned();
    rbac.add_cluster_role_binding(b);
    assert!(!rbac.authorize(&alice(), &get).allowed);
}

#[test]
fn objects_are_read_from_json_and_system_masters_may_do_anything() {
    let mut rbac = Rbac::new();
    let role = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "r"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}],
    });
    assert_eq!(rbac.apply(&role), Ok(true));
    let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap"});
    assert_eq!(rbac.apply(&cm), Ok(false));
    assert!(rbac.cluster_role("r").is_some());
    let admin = UserInfo::new("admin", &["system:masters"]);
    assert!(
        rbac.authorize(&admin, &Attributes::new("delete", "x", "y"))
            .allowed
    );
}
