//! RBAC evaluated as the Kubernetes API server's RBAC authorizer evaluates it
//! (`k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac`), for the fake API's SubjectAccessReviews
//! and its own requests ([`crate::fake_kube`]) and for the checks of deploy/'s roles
//! (`tests/tests/manifests.rs`). Pure: no I/O.
//!
//! What counts, as in Kubernetes:
//! - ClusterRoleBindings grant everywhere (cluster-scoped requests and every namespace); a
//!   RoleBinding grants only requests in its own namespace, with the rules of a Role of that
//!   namespace or of a ClusterRole. A binding whose role does not exist grants nothing.
//! - Subjects: `User` (the user name), `Group` (one of the user's groups, e.g.
//!   `system:serviceaccounts`, `system:serviceaccounts:<ns>`, `system:authenticated`),
//!   `ServiceAccount` (`system:serviceaccount:<ns>:<name>`; in a RoleBinding a subject without a
//!   namespace means the binding's).
//! - A rule matches when its `verbs`, `apiGroups` and `resources` (`resource` or
//!   `resource/subresource`, `*/subresource`) contain the request's or `*`, and `resourceNames` is
//!   empty or contains the request's name (never an empty name: a list, a watch, a create).
//! - Members of `system:masters` are allowed everything (the API server's privileged group).
//!
//! Not modelled: `nonResourceURLs` (rules with only those grant no resource request), aggregated
//! ClusterRoles (`aggregationRule`).

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The API group of RBAC objects.
pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// The user name of ServiceAccount `namespace/name`.
pub fn service_account_username(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// Who asks: a user name and its groups (a TokenReview's user; a SubjectAccessReview's
/// `spec.user` and `spec.groups`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// The user name.
    pub name: String,
    /// Its groups.
    pub groups: Vec<String>,
}

impl UserInfo {
    /// A user with exactly these groups.
    pub fn new(name: &str, groups: &[&str]) -> Self {
        Self {
            name: name.to_owned(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    /// A person or another authenticated user (group `system:authenticated`).
    pub fn user(name: &str) -> Self {
        Self::new(name, &["system:authenticated"])
    }

    /// ServiceAccount `namespace/name` with the groups the API server gives it.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Self {
            name: service_account_username(namespace, name),
            groups: vec![
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".to_owned(),
            ],
        }
    }
}

/// What is asked: the resource attributes of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, or any custom verb.
    pub verb: String,
    /// The API group (`""`: the core group).
    pub api_group: String,
    /// The resource (plural).
    pub resource: String,
    /// The subresource (`status`), or empty.
    pub subresource: String,
    /// The namespace, empty for a cluster-scoped request.
    pub namespace: String,
    /// The object's name, empty for list, watch, create.
    pub name: String,
}

impl Attributes {
    /// `verb` on `resource` of `api_group`, cluster-wide, without a name.
    pub fn new(verb: &str, api_group: &str, resource: &str) -> Self {
        Self {
            verb: verb.to_owned(),
            api_group: api_group.to_owned(),
            resource: resource.to_owned(),
            ..Self::default()
        }
    }

    /// With a subresource (`status`).
    pub fn subresource(mut self, subresource: &str) -> Self {
        self.subresource = subresource.to_owned();
        self
    }

    /// In a namespace.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = namespace.to_owned();
        self
    }

    /// Of a named object.
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// `resource/subresource`, or `resource`: what RBAC rules name.
    pub fn combined_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

/// A subject `User` (as `kubectl create clusterrolebinding --user`).
pub fn user(name: &str) -> Subject {
    Subject {
        api_group: Some(RBAC_GROUP.to_owned()),
        kind: "User".to_owned(),
        name: name.to_owned(),
        namespace: None,
    }
}

/// A subject `Group` (`--group`).
pub fn group(name: &str) -> Subject {
    Subject {
        api_group: Some(RBAC_GROUP.to_owned()),
        kind: "Group".to_owned(),
        name: name.to_owned(),
        namespace: None,
    }
}

/// A subject `ServiceAccount` (`--serviceaccount=namespace:name`).
pub fn service_account(namespace: &str, name: &str) -> Subject {
    Subject {
        api_group: Some(String::new()),
        kind: "ServiceAccount".to_owned(),
        name: name.to_owned(),
        namespace: Some(namespace.to_owned()),
    }
}

/// A rule: `verbs` on `resources` of `api_groups`.
pub fn rule(api_groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(owned(api_groups)),
        resources: Some(owned(resources)),
        verbs: owned(verbs),
        ..PolicyRule::default()
    }
}

fn meta(namespace: Option<&str>, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        ..ObjectMeta::default()
    }
}

/// A ClusterRole with these rules.
pub fn cluster_role(name: &str, rules: Vec<PolicyRule>) -> ClusterRole {
    ClusterRole {
        metadata: meta(None, name),
        rules: Some(rules),
        ..ClusterRole::default()
    }
}

/// A Role of `namespace` with these rules.
pub fn role(namespace: &str, name: &str, rules: Vec<PolicyRule>) -> Role {
    Role {
        metadata: meta(Some(namespace), name),
        rules: Some(rules),
    }
}

/// What `kubectl create clusterrolebinding NAME --clusterrole=ROLE --user=…` creates.
pub fn cluster_role_binding(
    name: &str,
    cluster_role: &str,
    subjects: Vec<Subject>,
) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: meta(None, name),
        role_ref: role_ref(RoleKind::ClusterRole, cluster_role),
        subjects: Some(subjects),
    }
}

/// What `kubectl create rolebinding NAME -n NAMESPACE --clusterrole=ROLE|--role=ROLE …` creates.
pub fn role_binding(
    namespace: &str,
    name: &str,
    kind: RoleKind,
    role: &str,
    subjects: Vec<Subject>,
) -> RoleBinding {
    RoleBinding {
        metadata: meta(Some(namespace), name),
        role_ref: role_ref(kind, role),
        subjects: Some(subjects),
    }
}

/// The kind of role a binding refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleKind {
    /// A ClusterRole.
    ClusterRole,
    /// A Role of the binding's namespace (RoleBindings only).
    Role,
}

fn role_ref(kind: RoleKind, name: &str) -> RoleRef {
    RoleRef {
        api_group: RBAC_GROUP.to_owned(),
        kind: match kind {
            RoleKind::ClusterRole => "ClusterRole",
            RoleKind::Role => "Role",
        }
        .to_owned(),
        name: name.to_owned(),
    }
}

/// An authorization decision. `reason` names the binding and role that allowed it, worded as the
/// API server's RBAC authorizer does; empty when denied (RBAC has no opinion).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether some binding allows the request.
    pub allowed: bool,
    /// `RBAC: allowed by ClusterRoleBinding "b" of ClusterRole "r" to User "alice"`.
    pub reason: String,
}

/// Whether `rule` allows `attrs` (`PolicyRule` matching of the RBAC authorizer).
pub fn rule_allows(rule: &PolicyRule, attrs: &Attributes) -> bool {
    let any = |list: &Option<Vec<String>>, want: &str| {
        list.iter().flatten().any(|x| x == "*" || x == want)
    };
    let combined = attrs.combined_resource();
    let resource_matches = rule.resources.iter().flatten().any(|r| {
        r == "*"
            || *r == combined
            || (!attrs.subresource.is_empty()
                && r.strip_prefix("*/") == Some(attrs.subresource.as_str()))
    });
    let names = rule.resource_names.as_deref().unwrap_or_default();
    rule.verbs.iter().any(|v| v == "*" || *v == attrs.verb)
        && any(&rule.api_groups, &attrs.api_group)
        && resource_matches
        && (names.is_empty() || (!attrs.name.is_empty() && names.contains(&attrs.name)))
}

/// Whether `subject` of a binding in `binding_namespace` (empty for a ClusterRoleBinding) is
/// `user`.
pub fn applies_to(subject: &Subject, user: &UserInfo, binding_namespace: &str) -> bool {
    match subject.kind.as_str() {
        "User" => subject.name == user.name,
        "Group" => user.groups.contains(&subject.name),
        "ServiceAccount" => {
            let ns = subject
                .namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(binding_namespace);
            !ns.is_empty() && service_account_username(ns, &subject.name) == user.name
        }
        _ => false,
    }
}

fn describe(subject: &Subject) -> String {
    match subject.kind.as_str() {
        "ServiceAccount" => format!(
            "ServiceAccount \"{}/{}\"",
            subject.name,
            subject.namespace.as_deref().unwrap_or("")
        ),
        kind => format!("{kind} \"{}\"", subject.name),
    }
}

/// A set of RBAC objects (what the API server stores), keyed by name (and namespace).
#[derive(Debug, Clone, Default)]
pub struct Rbac {
    cluster_roles: BTreeMap<String, ClusterRole>,
    roles: BTreeMap<(String, String), Role>,
    cluster_role_bindings: BTreeMap<String, ClusterRoleBinding>,
    role_bindings: BTreeMap<(String, String), RoleBinding>,
}

fn name_of(m: &ObjectMeta) -> String {
    m.name.clone().unwrap_or_default()
}

fn key_of(m: &ObjectMeta) -> (String, String) {
    (m.namespace.clone().unwrap_or_default(), name_of(m))
}

impl Rbac {
    /// No roles, no bindings: everything is denied.
    pub fn new() -> Self {
        Self::default()
    }

    /// Creates or replaces an RBAC object given as JSON (`apiVersion`
    /// `rbac.authorization.k8s.io/v1`, one of the four kinds); `Ok(false)` for any other object.
    pub fn apply(&mut self, object: &serde_json::Value) -> Result<bool, String> {
        if object["apiVersion"].as_str() != Some("rbac.authorization.k8s.io/v1") {
            return Ok(false);
        }
        let parse_err = |e: serde_json::Error| format!("{}: {e}", object["kind"]);
        let o = object.clone();
        match object["kind"].as_str() {
            Some("ClusterRole") => {
                self.add_cluster_role(serde_json::from_value(o).map_err(parse_err)?)
            }
            Some("Role") => self.add_role(serde_json::from_value(o).map_err(parse_err)?),
            Some("ClusterRoleBinding") => {
                self.add_cluster_role_binding(serde_json::from_value(o).map_err(parse_err)?)
            }
            Some("RoleBinding") => {
                self.add_role_binding(serde_json::from_value(o).map_err(parse_err)?)
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Creates or replaces a ClusterRole.
    pub fn add_cluster_role(&mut self, r: ClusterRole) {
        self.cluster_roles.insert(name_of(&r.metadata), r);
    }

    /// Creates or replaces a Role.
    pub fn add_role(&mut self, r: Role) {
        self.roles.insert(key_of(&r.metadata), r);
    }

    /// Creates or replaces a ClusterRoleBinding.
    pub fn add_cluster_role_binding(&mut self, b: ClusterRoleBinding) {
        self.cluster_role_bindings.insert(name_of(&b.metadata), b);
    }

    /// Creates or replaces a RoleBinding.
    pub fn add_role_binding(&mut self, b: RoleBinding) {
        self.role_bindings.insert(key_of(&b.metadata), b);
    }

    /// Deletes the object of `kind` (`ClusterRole`, `Role`, `ClusterRoleBinding`, `RoleBinding`)
    /// named `name` (in `namespace` for the namespaced kinds); whether it existed.
    pub fn remove(&mut self, kind: &str, namespace: &str, name: &str) -> bool {
        let key = (namespace.to_owned(), name.to_owned());
        match kind {
            "ClusterRole" => self.cluster_roles.remove(name).is_some(),
            "ClusterRoleBinding" => self.cluster_role_bindings.remove(name).is_some(),
            "Role" => self.roles.remove(&key).is_some(),
            "RoleBinding" => self.role_bindings.remove(&key).is_some(),
            other => panic!("{other} is not an RBAC kind"),
        }
    }

    /// The ClusterRole `name`.
    pub fn cluster_role(&self, name: &str) -> Option<&ClusterRole> {
        self.cluster_roles.get(name)
    }

    /// Every ClusterRoleBinding.
    pub fn cluster_role_bindings(&self) -> impl Iterator<Item = &ClusterRoleBinding> {
        self.cluster_role_bindings.values()
    }

    /// Every RoleBinding.
    pub fn role_bindings(&self) -> impl Iterator<Item = &RoleBinding> {
        self.role_bindings.values()
    }

    /// The rules of the role `role_ref` refers to from a binding in `namespace` (empty: a
    /// ClusterRoleBinding); none when the role does not exist or the reference is invalid.
    fn rules_of_ref(&self, role_ref: &RoleRef, namespace: &str) -> &[PolicyRule] {
        let rules = match role_ref.kind.as_str() {
            "ClusterRole" => self
                .cluster_roles
                .get(&role_ref.name)
                .and_then(|r| r.rules.as_deref()),
            "Role" if !namespace.is_empty() => self
                .roles
                .get(&(namespace.to_owned(), role_ref.name.clone()))
                .and_then(|r| r.rules.as_deref()),
            _ => None,
        };
        rules.unwrap_or_default()
    }

    /// Every (binding, rules) that applies to `user` for a request in `namespace` (empty: a
    /// cluster-scoped request): the ClusterRoleBindings, then the RoleBindings of `namespace`.
    /// Each item: the description of the binding and role as RBAC's reason words it, the subject,
    /// and the rules.
    fn visit(&self, user: &UserInfo, namespace: &str) -> Vec<(String, &Subject, &[PolicyRule])> {
        let mut out = Vec::new();
        for b in self.cluster_role_bindings.values() {
            if let Some(s) = b
                .subjects
                .iter()
                .flatten()
                .find(|s| applies_to(s, user, ""))
            {
                let what = format!(
                    "ClusterRoleBinding \"{}\" of {} \"{}\"",
                    name_of(&b.metadata),
                    b.role_ref.kind,
                    b.role_ref.name
                );
                out.push((what, s, self.rules_of_ref(&b.role_ref, "")));
            }
        }
        if namespace.is_empty() {
            return out;
        }
        for ((ns, name), b) in &self.role_bindings {
            if ns != namespace {
                continue;
            }
            if let Some(s) = b
                .subjects
                .iter()
                .flatten()
                .find(|s| applies_to(s, user, ns))
            {
                let what = format!(
                    "RoleBinding \"{name}/{ns}\" of {} \"{}\"",
                    b.role_ref.kind, b.role_ref.name
                );
                out.push((what, s, self.rules_of_ref(&b.role_ref, ns)));
            }
        }
        out
    }

    /// Whether `user` may do `attrs`.
    pub fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Decision {
        if user.groups.iter().any(|g| g == "system:masters") {
            return Decision {
                allowed: true,
                reason: "allowed: member of system:masters".to_owned(),
            };
        }
        for (what, subject, rules) in self.visit(user, &attrs.namespace) {
            if rules.iter().any(|r| rule_allows(r, attrs)) {
                return Decision {
                    allowed: true,
                    reason: format!("RBAC: allowed by {what} to {}", describe(subject)),
                };
            }
        }
        Decision {
            allowed: false,
            reason: String::new(),
        }
    }

    /// The rules that apply to `user` in `namespace` (empty: only the cluster-wide ones), as a
    /// SelfSubjectRulesReview lists them.
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> Vec<PolicyRule> {
        self.visit(user, namespace)
            .into_iter()
            .flat_map(|(_, _, rules)| rules.iter().cloned())
            .collect()
    }

    /// The rules that RoleBindings of `namespace` bind to `user` (not the cluster-wide ones).
    pub fn namespaced_rules_for(&self, user: &UserInfo, namespace: &str) -> Vec<PolicyRule> {
        let cluster = self.visit(user, "").len();
        self.visit(user, namespace)
            .into_iter()
            .skip(cluster)
            .flat_map(|(_, _, rules)| rules.iter().cloned())
            .collect()
    }
}

#[cfg(test)]
#[path = "rbac_tests.rs"]
mod tests;
