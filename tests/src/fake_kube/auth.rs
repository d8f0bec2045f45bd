//! Authentication and authorization of the fake API ([`super::FakeApi`]), as the API server does
//! them:
//! - `TokenReview` (`authentication.k8s.io/v1`): a table token → user ([`FakeApi::add_token`]);
//! - `SubjectAccessReview` (`authorization.k8s.io/v1`): answered by evaluating RBAC objects
//!   ([`crate::rbac`]): deploy/'s roles and bindings ([`FakeApi::load_rbac`]), bindings a test
//!   creates as an operator would with kubectl ([`FakeApi::create_cluster_role_binding`],
//!   [`FakeApi::create_role_binding`]), any RBAC object ([`FakeApi::apply_rbac`]), and deletions
//!   ([`FakeApi::delete_rbac`]). Nothing is allowed that no binding grants;
//! - optionally ([`FakeApi::enforce_rbac`]) the fake's own requests: a bearer token from the
//!   same table (issued for [`API_AUDIENCE`]) or 401; the request's RBAC attributes evaluated as
//!   for a review, 403 `Forbidden` with the API server's message when denied.
//!
//! A switch makes both review APIs unavailable (503): [`FakeApi::reviews_down`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use k8s_openapi::api::rbac::v1::Subject;
use serde_json::{Value, json};

use super::{FakeApi, Inner, json_response, pointer_str, status_body};
use crate::deploy::Rendered;
use crate::rbac::{self, Attributes, Decision, Rbac, RoleKind, UserInfo};

/// The audience of tokens the fake API itself accepts (a pod's default ServiceAccount token).
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc";

/// The user a token of [`FakeApi::add_token`] belongs to.
#[derive(Debug, Clone, Default)]
pub struct TokenUser {
    /// `status.user.username`.
    pub username: String,
    /// `status.user.groups`.
    pub groups: Vec<String>,
    /// `status.user.extra` (e.g. `authentication.kubernetes.io/node-name`).
    pub extra: BTreeMap<String, Vec<String>>,
    /// The audiences the token was issued for.
    pub audiences: Vec<String>,
}

impl TokenUser {
    /// A ServiceAccount's pod-bound token for `audience`, on `node` if given.
    pub fn service_account(
        namespace: &str,
        name: &str,
        node: Option<&str>,
        audience: &str,
    ) -> Self {
        let mut extra = BTreeMap::new();
        if let Some(node) = node {
            extra.insert(
                "authentication.kubernetes.io/node-name".to_owned(),
                vec![node.to_owned()],
            );
        }
        let who = UserInfo::service_account(namespace, name);
        Self {
            username: who.name,
            groups: who.groups,
            extra,
            audiences: vec![audience.to_owned()],
        }
    }

    /// A person's token (an operator's, e.g. from the cluster's OIDC provider) for `audience`:
    /// user `name`, its `groups` and `system:authenticated`.
    pub fn user(name: &str, groups: &[&str], audience: &str) -> Self {
        let mut groups: Vec<String> = groups.iter().map(|g| (*g).to_owned()).collect();
        groups.push("system:authenticated".to_owned());
        Self {
            username: name.to_owned(),
            groups,
            extra: BTreeMap::new(),
            audiences: vec![audience.to_owned()],
        }
    }

    /// The user as RBAC sees it.
    pub fn info(&self) -> UserInfo {
        UserInfo {
            name: self.username.clone(),
            groups: self.groups.clone(),
        }
    }
}

#[derive(Default)]
pub(super) struct Reviews {
    tokens: HashMap<String, TokenUser>,
    rbac: Rbac,
    down: bool,
    enforce: bool,
    token_reviews: usize,
    access_reviews: usize,
    denials: Vec<String>,
}

impl FakeApi {
    /// TokenReviews authenticate `token` as `user` (for the audiences the user lists).
    pub fn add_token(&self, token: &str, user: TokenUser) {
        self.lock().reviews.tokens.insert(token.to_owned(), user);
    }

    /// TokenReviews no longer authenticate `token` (it expired or was revoked).
    pub fn revoke_token(&self, token: &str) {
        self.lock().reviews.tokens.remove(token);
    }

    /// Stores every ClusterRole, Role, ClusterRoleBinding and RoleBinding of a rendering of
    /// deploy/ (as `kubectl apply -k` would).
    pub fn load_rbac(&self, rendered: &Rendered) {
        for d in &rendered.documents {
            self.apply_rbac(&d.value);
        }
    }

    /// Creates or replaces one RBAC object given as JSON (panics if it is not one).
    pub fn apply_rbac(&self, object: &Value) {
        let applied = self.lock().reviews.rbac.apply(object);
        match applied {
            Ok(_) => {}
            Err(e) => panic!("not a valid RBAC object: {e}"),
        }
    }

    /// `kubectl create clusterrolebinding NAME --clusterrole=ROLE --user=…|--group=…|
    /// --serviceaccount=…`: one subject (see [`rbac::user`], [`rbac::group`],
    /// [`rbac::service_account`]). Panics if the binding exists, as kubectl fails.
    pub fn create_cluster_role_binding(&self, name: &str, cluster_role: &str, subject: Subject) {
        let b = rbac::cluster_role_binding(name, cluster_role, vec![subject]);
        let mut inner = self.lock();
        let rbac = &mut inner.reviews.rbac;
        assert!(
            !rbac
                .cluster_role_bindings()
                .any(|x| x.metadata.name.as_deref() == Some(name)),
            "clusterrolebindings {name:?} already exists"
        );
        rbac.add_cluster_role_binding(b);
    }

    /// `kubectl create rolebinding NAME -n NAMESPACE --clusterrole=ROLE|--role=ROLE --user=…`.
    /// Panics if the binding exists.
    pub fn create_role_binding(
        &self,
        namespace: &str,
        name: &str,
        kind: RoleKind,
        role: &str,
        subject: Subject,
    ) {
        let b = rbac::role_binding(namespace, name, kind, role, vec![subject]);
        let mut inner = self.lock();
        let rbac = &mut inner.reviews.rbac;
        assert!(
            !rbac.role_bindings().any(|x| {
                x.metadata.name.as_deref() == Some(name)
                    && x.metadata.namespace.as_deref() == Some(namespace)
            }),
            "rolebindings {name:?} already exists in {namespace}"
        );
        rbac.add_role_binding(b);
    }

    /// `kubectl delete KIND NAME [-n NAMESPACE]` of an RBAC object (`ClusterRole`, `Role`,
    /// `ClusterRoleBinding`, `RoleBinding`); whether it existed. Takes effect for the next
    /// review (the state server may still hold a cached answer).
    pub fn delete_rbac(&self, kind: &str, namespace: &str, name: &str) -> bool {
        self.lock().reviews.rbac.remove(kind, namespace, name)
    }

    /// The RBAC objects stored now.
    pub fn rbac(&self) -> Rbac {
        self.lock().reviews.rbac.clone()
    }

    /// What a SubjectAccessReview of `attrs` for `user` would answer now.
    pub fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Decision {
        self.lock().reviews.rbac.authorize(user, attrs)
    }

    /// While `down`, TokenReview and SubjectAccessReview answer 503.
    pub fn reviews_down(&self, down: bool) {
        self.lock().reviews.down = down;
    }

    /// TokenReviews and SubjectAccessReviews served so far.
    pub fn review_counts(&self) -> (usize, usize) {
        let r = &self.lock().reviews;
        (r.token_reviews, r.access_reviews)
    }

    /// Whether the fake authenticates and authorizes its own requests (off by default): then a
    /// request needs `Authorization: Bearer <token>` of a token added with [`FakeApi::add_token`]
    /// for [`API_AUDIENCE`] (else 401), and RBAC must allow it (else 403 Forbidden). Clients:
    /// [`FakeApi::kube_client_with_token`].
    pub fn enforce_rbac(&self, on: bool) {
        self.lock().reviews.enforce = on;
    }

    /// The messages of the 403s answered so far (`services "x" is forbidden: User …`).
    pub fn denials(&self) -> Vec<String> {
        self.lock().reviews.denials.clone()
    }

    /// A kube client of this server that sends `Authorization: Bearer <token>`.
    pub fn kube_client_with_token(&self, token: &str) -> kube::Client {
        kube::Client::try_from(self.kube_config_with_token(token)).expect("client")
    }

    /// The configuration of a [`FakeApi::kube_client_with_token`] (e.g. for
    /// `clb_watcher::KubeClients::from_config`).
    pub fn kube_config_with_token(&self, token: &str) -> kube::Config {
        with_token(self.kube_config(), token)
    }

    /// The clients a watcher makes, sending `token` (as the binary sends its ServiceAccount's).
    pub fn watcher_clients_with_token(&self, token: &str) -> clb_watcher::KubeClients {
        clb_watcher::KubeClients::from_config(self.kube_config_with_token(token)).unwrap()
    }
}

/// `config` sending `Authorization: Bearer <token>` (e.g. a
/// [`FakeApi::partitionable_config`]'s).
pub fn with_token(mut config: kube::Config, token: &str) -> kube::Config {
    config.headers.push((
        axum::http::header::AUTHORIZATION,
        format!("Bearer {token}").parse().expect("a header value"),
    ));
    config
}

/// The RBAC attributes of a request, as the API server's `RequestInfoFactory` derives them;
/// `None` for a path that is not a resource path.
pub fn request_attributes(
    method: &Method,
    path: &str,
    query: &HashMap<String, String>,
) -> Option<Attributes> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, mut parts) = match segs.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let mut namespace = "";
    if parts.first() == Some(&"namespaces") && parts.len() > 1 {
        namespace = parts[1];
        if parts.len() > 2 {
            parts = &parts[2..];
        }
    }
    let mut verb = match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "get",
    };
    let mut attrs =
        Attributes::new("", group, parts.first().copied().unwrap_or_default()).namespace(namespace);
    if let Some(name) = parts.get(1) {
        attrs = attrs.name(name);
    }
    if let Some(sub) = parts.get(2) {
        attrs = attrs.subresource(sub);
    }
    if attrs.name.is_empty() {
        let watch = query.get("watch").is_some_and(|w| w == "true" || w == "1");
        verb = match verb {
            "get" if watch => "watch",
            "get" => "list",
            "delete" => "deletecollection",
            v => v,
        };
        // A list or watch of one object by its name is checked with that name.
        if let Some(name) = query
            .get("fieldSelector")
            .and_then(|f| f.split(',').find_map(|t| t.strip_prefix("metadata.name=")))
        {
            attrs = attrs.name(name);
        }
    }
    attrs.verb = verb.to_owned();
    Some(attrs)
}

/// The API server's 403 message for `user` denied `attrs`.
pub fn forbidden_message(user: &str, attrs: &Attributes) -> String {
    let qualified = if attrs.api_group.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}.{}", attrs.resource, attrs.api_group)
    };
    let what = if attrs.name.is_empty() {
        format!("{qualified} is forbidden")
    } else {
        format!("{qualified} {:?} is forbidden", attrs.name)
    };
    let scope = if attrs.namespace.is_empty() {
        "at the cluster scope".to_owned()
    } else {
        format!("in the namespace {:?}", attrs.namespace)
    };
    format!(
        "{what}: User {user:?} cannot {} resource {:?} in API group {:?} {scope}",
        attrs.verb,
        attrs.combined_resource(),
        attrs.api_group
    )
}

/// With [`FakeApi::enforce_rbac`] on: the 401 or 403 answer of a request that may not pass;
/// `None` when it may.
pub(super) fn gate(
    inner: &Arc<Mutex<Inner>>,
    method: &Method,
    path: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Option<Response> {
    let mut inner = inner.lock().unwrap();
    let reviews = &mut inner.reviews;
    if !reviews.enforce {
        return None;
    }
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    let user = reviews
        .tokens
        .get(token)
        .filter(|u| u.audiences.iter().any(|a| a == API_AUDIENCE));
    let Some(user) = user else {
        return Some(json_response(
            401,
            &status_body(401, "Unauthorized", "Unauthorized"),
        ));
    };
    let attrs = request_attributes(method, path, query)?;
    if reviews.rbac.authorize(&user.info(), &attrs).allowed {
        return None;
    }
    let message = forbidden_message(&user.username, &attrs);
    reviews.denials.push(message.clone());
    let mut body = status_body(403, "Forbidden", &message);
    body["details"] = json!({
        "name": attrs.name,
        "group": attrs.api_group,
        "kind": attrs.resource,
    });
    Some(json_response(403, &body))
}

/// Answers a TokenReview or SubjectAccessReview; `None` for any other request.
pub(super) fn review(
    inner: &Arc<Mutex<Inner>>,
    method: &Method,
    segs: &[&str],
    body: &Bytes,
) -> Option<Response> {
    let kind = match (method, segs) {
        (&Method::POST, ["apis", "authentication.k8s.io", "v1", "tokenreviews"]) => "TokenReview",
        (&Method::POST, ["apis", "authorization.k8s.io", "v1", "subjectaccessreviews"]) => {
            "SubjectAccessReview"
        }
        _ => return None,
    };
    let mut inner = inner.lock().unwrap();
    let reviews = &mut inner.reviews;
    if reviews.down {
        return Some(json_response(
            503,
            &status_body(503, "ServiceUnavailable", "the API server is down"),
        ));
    }
    let Ok(mut obj) = serde_json::from_slice::<Value>(body) else {
        return Some(json_response(
            400,
            &status_body(400, "BadRequest", "not JSON"),
        ));
    };
    let status = if kind == "TokenReview" {
        reviews.token_reviews += 1;
        token_review(reviews, &obj)
    } else {
        reviews.access_reviews += 1;
        access_review(&reviews.rbac, &obj)
    };
    obj["status"] = status;
    obj["kind"] = json!(kind);
    Some(json_response(201, &obj))
}

fn token_review(reviews: &Reviews, obj: &Value) -> Value {
    let token = pointer_str(obj, "/spec/token").unwrap_or("");
    let wanted: Vec<String> = obj
        .pointer("/spec/audiences")
        .and_then(|a| serde_json::from_value(a.clone()).ok())
        .unwrap_or_default();
    let Some(user) = reviews.tokens.get(token) else {
        return json!({"authenticated": false, "error": "invalid bearer token"});
    };
    let audiences: Vec<&String> = wanted
        .iter()
        .filter(|a| user.audiences.contains(a))
        .collect();
    if !wanted.is_empty() && audiences.is_empty() {
        return json!({
            "authenticated": false,
            "error": "token audiences are invalid for the target audiences",
        });
    }
    json!({
        "authenticated": true,
        "audiences": if wanted.is_empty() { json!(user.audiences) } else { json!(audiences) },
        "user": {
            "username": user.username,
            "uid": format!("uid-{}", user.username),
            "groups": user.groups,
            "extra": user.extra,
        },
    })
}

/// The status of a SubjectAccessReview: RBAC's decision for `spec.user` and `spec.groups`
/// (non-resource requests are denied: no rule of deploy/ is about URLs).
fn access_review(rbac: &Rbac, obj: &Value) -> Value {
    let spec = &obj["spec"];
    let user = UserInfo {
        name: spec["user"].as_str().unwrap_or_default().to_owned(),
        groups: spec["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g.as_str().map(str::to_owned))
            .collect(),
    };
    let Some(ra) = spec.get("resourceAttributes").filter(|r| r.is_object()) else {
        return json!({"allowed": false, "reason": "non-resource requests are not modelled"});
    };
    let attr = |f: &str| ra[f].as_str().unwrap_or_default();
    let attrs = Attributes::new(attr("verb"), attr("group"), attr("resource"))
        .subresource(attr("subresource"))
        .namespace(attr("namespace"))
        .name(attr("name"));
    let d = rbac.authorize(&user, &attrs);
    if d.reason.is_empty() {
        json!({"allowed": d.allowed})
    } else {
        json!({"allowed": d.allowed, "reason": d.reason})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(method: Method, path: &str, query: &str) -> Attributes {
        let q = query
            .split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                (k.to_owned(), v.to_owned())
            })
            .collect();
        request_attributes(&method, path, &q).expect("a resource path")
    }

    #[test]
    fn requests_map_to_rbac_attributes_as_the_api_server_maps_them() {
        let a = attrs(Method::GET, "/api/v1/services", "watch=true");
        assert_eq!(a, Attributes::new("watch", "", "services"));
        let a = attrs(Method::GET, "/apis/discovery.k8s.io/v1/endpointslices", "");
        assert_eq!(
            a,
            Attributes::new("list", "discovery.k8s.io", "endpointslices")
        );
        let a = attrs(
            Method::PATCH,
            "/api/v1/namespaces/default/services/x/status",
            "",
        );
        assert_eq!(
            a,
            Attributes::new("patch", "", "services")
                .namespace("default")
                .name("x")
                .subresource("status")
        );
        let a = attrs(
            Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/clb-system/leases/l",
            "",
        );
        assert_eq!(a.verb, "get");
        assert_eq!((a.name.as_str(), a.namespace.as_str()), ("l", "clb-system"));
        let a = attrs(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/ns/events",
            "",
        );
        assert_eq!(
            a,
            Attributes::new("create", "events.k8s.io", "events").namespace("ns")
        );
        let a = attrs(
            Method::GET,
            "/api/v1/pods",
            "fieldSelector=metadata.name=p1",
        );
        assert_eq!(a, Attributes::new("list", "", "pods").name("p1"));
        assert!(request_attributes(&Method::GET, "/version", &HashMap::new()).is_none());
    }

    #[test]
    fn the_forbidden_message_is_the_api_servers() {
        let a = Attributes::new("patch", "", "services")
            .subresource("status")
            .namespace("default")
            .name("x");
        assert_eq!(
            forbidden_message("system:serviceaccount:clb-system:clb-watcher", &a),
            "services \"x\" is forbidden: User \"system:serviceaccount:clb-system:clb-watcher\" \
             cannot patch resource \"services/status\" in API group \"\" in the namespace \
             \"default\""
        );
        let a = Attributes::new("list", "network.openyurt.io", "poolservices");
        assert_eq!(
            forbidden_message("u", &a),
            "poolservices.network.openyurt.io is forbidden: User \"u\" cannot list resource \
             \"poolservices\" in API group \"network.openyurt.io\" at the cluster scope"
        );
    }

    fn api_status<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> (u16, String, String) {
        match r {
            Err(kube::Error::Api(s)) => (s.code, s.reason.clone(), s.message.clone()),
            other => panic!("expected an error answer of the API, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn with_enforcement_requests_need_a_token_and_deploys_rbac() {
        use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
        use k8s_openapi::api::core::v1::{Pod, Service};
        use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
        let api = FakeApi::start().await;
        api.load_rbac(&Rendered::load(&[]));
        api.put(
            "services",
            json!({"metadata": {"namespace": "default", "name": "x"}, "spec": {}}),
        );
        let sa = |name: &str, audience: &str| {
            TokenUser::service_account(crate::deploy::NAMESPACE, name, None, audience)
        };
        api.add_token("t-watcher", sa("clb-watcher", API_AUDIENCE));
        api.add_token("t-server", sa("clb-state-server", API_AUDIENCE));
        api.add_token("t-clb", sa("clb-watcher", "clb"));
        let list = ListParams::default();
        // Off (the default): no token needed.
        Api::<Service>::all(api.kube_client())
            .list(&list)
            .await
            .expect("open");
        api.enforce_rbac(true);
        // No token, a token for another audience, an unknown token: 401.
        for client in [
            api.kube_client(),
            api.kube_client_with_token("t-clb"),
            api.kube_client_with_token("t-unknown"),
        ] {
            let (code, reason, _) = api_status(Api::<Service>::all(client).list(&list).await);
            assert_eq!((code, reason.as_str()), (401, "Unauthorized"));
        }
        // The watcher's ServiceAccount: what deploy/ grants it, nothing else.
        let watcher = api.kube_client_with_token("t-watcher");
        let services = Api::<Service>::namespaced(watcher.clone(), "default");
        Api::<Service>::all(watcher.clone())
            .list(&list)
            .await
            .expect("deploy/ lets the watcher list services");
        let status = json!({"status": {"loadBalancer": {"ingress": [{"ip": "10.1.2.3"}]}}});
        let (params, merge) = (PatchParams::default(), Patch::Merge(&status));
        let patch = || services.patch_status("x", &params, &merge);
        patch().await.expect("and patch their status");
        // Pods: listed (the egress pods a NAT gateway Event regards), never changed by the base.
        let pods = Api::<Pod>::namespaced(watcher.clone(), "default");
        let (code, reason, message) =
            api_status(pods.delete("x", &DeleteParams::default()).await.map(drop));
        assert_eq!((code, reason.as_str()), (403, "Forbidden"));
        assert_eq!(
            message,
            "pods \"x\" is forbidden: User \"system:serviceaccount:clb-system:clb-watcher\" \
             cannot delete resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        // The state server reviews tokens (clb-state-server-auth); the watcher may not.
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some("t-clb".to_owned()),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let server = api.kube_client_with_token("t-server");
        let answer = Api::<TokenReview>::all(server)
            .create(&PostParams::default(), &review)
            .await
            .expect("the state server creates TokenReviews");
        assert!(answer.status.is_some_and(|s| s.authenticated == Some(true)));
        let denied = Api::<TokenReview>::all(watcher)
            .create(&PostParams::default(), &review)
            .await;
        assert_eq!(api_status(denied).0, 403);
        // Without deploy/'s binding of the watcher, its status patch is forbidden.
        assert!(api.delete_rbac("ClusterRoleBinding", "", "clb-watcher"));
        let (code, _, message) = api_status(patch().await);
        assert_eq!(code, 403);
        assert_eq!(
            message,
            "services \"x\" is forbidden: User \"system:serviceaccount:clb-system:clb-watcher\" \
             cannot patch resource \"services/status\" in API group \"\" in the namespace \
             \"default\""
        );
        assert_eq!(api.denials().len(), 3);
    }
}
