//! The admission decision, pure and synchronous: one AdmissionReview request, the labels of the
//! pod's namespace and the Services of that namespace → the answer. No I/O, no clock.

use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::core::DynamicObject;
use kube::core::admission::{
    AdmissionRequest, AdmissionResponse, META_API_VERSION_V1, META_KIND, Operation,
};
use serde_json::{Value, json};

use super::{GATE_CONDITION_TYPE, GATE_LABEL, GATE_LABEL_VALUE, INJECT_LABEL, INJECT_LABEL_VALUE};
use crate::translate::{ServiceClass, TranslatorConfig, classify};

/// What [`admit`] did with a request; [`Outcome::result`] is the `result` label of
/// `clb_webhook_admissions_total`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The answer carries a patch (the gate, the label, or both). `services`: the names of the
    /// Services of clb that select the pod, sorted.
    Patched {
        /// The Services of clb's class that select the pod.
        services: Vec<String>,
    },
    /// Allowed without a patch, and why (the pod is not for clb, or already has the gate).
    Unchanged(String),
    /// Allowed without a patch because the request could not be used (for example its object is
    /// not a Pod); the reason.
    Error(String),
}

impl Outcome {
    /// `patched`, `unchanged` or `error`.
    pub fn result(&self) -> &'static str {
        match self {
            Outcome::Patched { .. } => "patched",
            Outcome::Unchanged(_) => "unchanged",
            Outcome::Error(_) => "error",
        }
    }
}

/// Whether a Service's `spec.selector` selects a pod with `labels`: the selector is not empty
/// and every one of its pairs is among the labels (an empty selector selects no pod: such a
/// Service has no EndpointSlices managed by Kubernetes).
pub fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The names (sorted) of the Services among `services` that are clb's and select a pod of
/// `namespace` with `labels` at its creation: in `namespace`, of type `LoadBalancer` and of clb's
/// class as the watcher decides it ([`classify`] with `config`: `config.class`, and unclassed
/// ones when `config.claim_unclassed`), not being deleted, with a `spec.selector` that
/// [`selects`] the labels.
pub fn selecting_services<'a>(
    namespace: &str,
    labels: &BTreeMap<String, String>,
    services: impl IntoIterator<Item = &'a Service>,
    config: &TranslatorConfig,
) -> Vec<String> {
    let mut names: Vec<String> = services
        .into_iter()
        .filter(|svc| svc.metadata.namespace.as_deref() == Some(namespace))
        .filter(|svc| svc.metadata.deletion_timestamp.is_none())
        .filter(|svc| classify(svc, config) == ServiceClass::Ours)
        .filter(|svc| {
            svc.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|sel| selects(sel, labels))
        })
        .map(|svc| svc.metadata.name.clone().unwrap_or_default())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// One token of a JSON pointer (RFC 6901): `~` is written `~0` and `/` is written `~1`, so that
/// the label key `clb.azure.com/readiness-gate` is the token `clb.azure.com~1readiness-gate`.
pub fn escape_pointer_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// The JSON patch (RFC 6902) operations that give `pod` the readiness gate and the label, as
/// JSON: nothing for what it already has. The gate is appended to `spec.readinessGates` (the list
/// is created when absent; never a second time); the label is added to `metadata.labels` (the map
/// is created when absent). A pod without `spec` gets nothing (the API server refuses it anyway).
pub fn gate_patch(pod: &Pod) -> Vec<Value> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let mut ops = Vec::new();
    let gate = json!({ "conditionType": GATE_CONDITION_TYPE });
    match &spec.readiness_gates {
        None => ops.push(json!({"op": "add", "path": "/spec/readinessGates", "value": [gate]})),
        Some(gates)
            if !gates
                .iter()
                .any(|g| g.condition_type == GATE_CONDITION_TYPE) =>
        {
            ops.push(json!({"op": "add", "path": "/spec/readinessGates/-", "value": gate}))
        }
        Some(_) => {}
    }
    match &pod.metadata.labels {
        None => ops.push(json!({
            "op": "add",
            "path": "/metadata/labels",
            "value": { GATE_LABEL: GATE_LABEL_VALUE },
        })),
        Some(labels) if !labels.contains_key(GATE_LABEL) => ops.push(json!({
            "op": "add",
            "path": format!("/metadata/labels/{}", escape_pointer_token(GATE_LABEL)),
            "value": GATE_LABEL_VALUE,
        })),
        Some(_) => {}
    }
    ops
}

/// The pod's name for logs: its name, else its `generateName` followed by `*` (a pod of a
/// ReplicaSet has no name yet when it is admitted).
pub(super) fn pod_name(request: &AdmissionRequest<DynamicObject>) -> String {
    if !request.name.is_empty() {
        return request.name.clone();
    }
    let meta = request.object.as_ref().map(|o| &o.metadata);
    match (
        meta.and_then(|m| m.name.as_deref()),
        meta.and_then(|m| m.generate_name.as_deref()),
    ) {
        (Some(n), _) if !n.is_empty() => n.to_owned(),
        (_, Some(g)) => format!("{g}*"),
        _ => String::new(),
    }
}

/// The answer to one AdmissionReview request, and what was done.
///
/// Always `allowed: true` with the request's `uid`. A JSON patch ([`gate_patch`], `patchType:
/// JSONPatch`) only when all of these hold:
/// - the request is a `CREATE` of a `v1` Pod (no subresource) whose object decodes as a Pod;
/// - its namespace (`request.namespace`, else the pod's) carries
///   `clb.azure.com/readiness-gate-inject: enabled` in `namespace_labels` (`None`: the namespace
///   is unknown, so no patch);
/// - the pod does not carry `clb.azure.com/readiness-gate` with a value other than `"true"` (a
///   pod opts out with `"false"`);
/// - at least one Service of `services` selects it ([`selecting_services`] with `config`);
/// - it lacks the gate or the label.
///
/// `services` may hold the Services of every namespace: only those of the pod's count.
pub fn admit<'a>(
    request: &AdmissionRequest<DynamicObject>,
    namespace_labels: Option<&BTreeMap<String, String>>,
    services: impl IntoIterator<Item = &'a Service>,
    config: &TranslatorConfig,
) -> (AdmissionResponse, Outcome) {
    let response = AdmissionResponse::from(request);
    let unchanged = |why: String| (AdmissionResponse::from(request), Outcome::Unchanged(why));
    if request.operation != Operation::Create {
        return unchanged(format!("operation {:?}, not CREATE", request.operation));
    }
    let k = &request.kind;
    if !(k.group.is_empty() && k.version == "v1" && k.kind == "Pod") {
        return unchanged(format!(
            "kind {}/{} {}, not v1 Pod",
            k.group, k.version, k.kind
        ));
    }
    if let Some(sub) = request.sub_resource.as_deref().filter(|s| !s.is_empty()) {
        return unchanged(format!("subresource {sub}"));
    }
    let Some(object) = &request.object else {
        return (
            response,
            Outcome::Error("request.object is missing on a CREATE".to_owned()),
        );
    };
    let pod: Pod = match object.clone().try_parse() {
        Ok(p) => p,
        Err(e) => {
            return (
                response,
                Outcome::Error(format!("request.object is not a valid v1 Pod: {e}")),
            );
        }
    };
    let namespace = request
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| pod.metadata.namespace.clone())
        .unwrap_or_default();
    let name = pod_name(request);
    if namespace.is_empty() {
        return unchanged(format!("pod {name:?} has no namespace"));
    }
    let Some(ns_labels) = namespace_labels else {
        return unchanged(format!(
            "namespace {namespace} is not known (yet) to the webhook"
        ));
    };
    if ns_labels.get(INJECT_LABEL).map(String::as_str) != Some(INJECT_LABEL_VALUE) {
        return unchanged(format!(
            "namespace {namespace} is not labelled {INJECT_LABEL}={INJECT_LABEL_VALUE}"
        ));
    }
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    if let Some(v) = labels.get(GATE_LABEL).filter(|v| *v != GATE_LABEL_VALUE) {
        return unchanged(format!(
            "pod {namespace}/{name} opts out: {GATE_LABEL}={v:?}"
        ));
    }
    let selecting = selecting_services(&namespace, &labels, services, config);
    if selecting.is_empty() {
        return unchanged(format!(
            "no LoadBalancer Service of class {} selects pod {namespace}/{name}",
            config.class
        ));
    }
    let ops = gate_patch(&pod);
    if ops.is_empty() {
        let why = if pod.spec.is_none() {
            format!("pod {namespace}/{name} has no spec")
        } else {
            format!("pod {namespace}/{name} already has the gate and the label")
        };
        return unchanged(why);
    }
    let patch: json_patch::Patch = match serde_json::from_value(Value::Array(ops)) {
        Ok(p) => p,
        Err(e) => return (response, Outcome::Error(format!("building the patch: {e}"))),
    };
    match response.clone().with_patch(patch) {
        Ok(patched) => (
            patched,
            Outcome::Patched {
                services: selecting,
            },
        ),
        Err(e) => (response, Outcome::Error(e.to_string())),
    }
}

/// The AdmissionReview (`admission.k8s.io/v1`) that answers with `response`, as JSON, as the API
/// server reads it: the patch, when there is one, base64-encoded (a Go `[]byte`; kube's type
/// would write it as a list of numbers, kube-rs/kube#1781).
pub fn review_json(mut response: AdmissionResponse) -> Value {
    let patch = response.patch.take();
    if response.types.api_version.is_empty() {
        response.types.api_version = META_API_VERSION_V1.to_owned();
        response.types.kind = META_KIND.to_owned();
    }
    let (uid, allowed) = (response.uid.clone(), response.allowed);
    let mut review = serde_json::to_value(response.into_review()).unwrap_or_else(|e| {
        // Not reached (every field serialises); the minimal answer keeps the pod admitted.
        tracing::error!(error = %e, "serialising the AdmissionReview answer");
        json!({
            "apiVersion": META_API_VERSION_V1,
            "kind": META_KIND,
            "response": { "uid": uid, "allowed": allowed },
        })
    });
    if let Some(bytes) = patch {
        review["response"]["patch"] =
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    review
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::admission::AdmissionReview;

    const NS: &str = "shop";

    fn config() -> TranslatorConfig {
        TranslatorConfig::default()
    }

    fn pod(labels: Value, readiness_gates: Option<Value>) -> Value {
        let mut spec = json!({"containers": [{"name": "app", "image": "nginx"}]});
        if let Some(g) = readiness_gates {
            spec["readinessGates"] = g;
        }
        let mut meta = json!({"generateName": "web-7d9f-", "namespace": NS});
        if !labels.is_null() {
            meta["labels"] = labels;
        }
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
    }

    fn request(object: Value) -> AdmissionRequest<DynamicObject> {
        let review: AdmissionReview<DynamicObject> = serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": NS,
                "operation": "CREATE",
                "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                "object": object,
                "oldObject": null,
                "dryRun": false,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
            }
        }))
        .expect("an AdmissionReview");
        review.try_into().expect("a request")
    }

    fn service(name: &str, class: Option<&str>, type_: &str, selector: Value) -> Service {
        let mut spec = json!({"type": type_, "selector": selector, "ports": [{"port": 80}]});
        if let Some(c) = class {
            spec["loadBalancerClass"] = json!(c);
        }
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}")},
            "spec": spec
        }))
        .unwrap()
    }

    fn ours(name: &str, selector: Value) -> Service {
        service(name, None, "LoadBalancer", selector)
    }

    fn injected() -> BTreeMap<String, String> {
        BTreeMap::from([(INJECT_LABEL.to_owned(), INJECT_LABEL_VALUE.to_owned())])
    }

    /// `admit`, then the answer's patch applied to the pod (or the pod itself without a patch).
    fn run(
        pod: &Value,
        ns: Option<&BTreeMap<String, String>>,
        services: &[Service],
    ) -> (Value, Outcome, Value) {
        let (response, outcome) = admit(&request(pod.clone()), ns, services, &config());
        let review = review_json(response);
        let mut patched = pod.clone();
        if let Some(b64) = review["response"]["patch"].as_str() {
            assert_eq!(review["response"]["patchType"], "JSONPatch");
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .expect("base64");
            let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("a JSON patch");
            json_patch::patch(&mut patched, &patch).expect("the patch applies");
        } else {
            assert!(review["response"].get("patchType").is_none(), "{review}");
        }
        assert_eq!(review["response"]["allowed"], true, "{review}");
        assert_eq!(
            review["response"]["uid"],
            "705ab4f5-6393-11e8-b7cc-42010a800002"
        );
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(review["kind"], "AdmissionReview");
        (review, outcome, patched)
    }

    #[test]
    fn a_selected_pod_in_an_injected_namespace_gets_the_gate_and_the_label() {
        let p = pod(json!({"app": "web", "tier": "front"}), None);
        let svcs = [ours("web", json!({"app": "web"}))];
        let (_, outcome, patched) = run(&p, Some(&injected()), &svcs);
        assert_eq!(
            outcome,
            Outcome::Patched {
                services: vec!["web".to_owned()]
            }
        );
        assert_eq!(
            patched["spec"]["readinessGates"],
            json!([{"conditionType": "clb.azure.com/programmed"}])
        );
        assert_eq!(
            patched["metadata"]["labels"],
            json!({"app": "web", "tier": "front", "clb.azure.com/readiness-gate": "true"})
        );
        // Nothing else changed.
        let mut back = patched.clone();
        back["spec"]
            .as_object_mut()
            .unwrap()
            .remove("readinessGates");
        back["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove(GATE_LABEL);
        assert_eq!(back, p);
    }

    #[test]
    fn the_patch_is_exactly_two_adds_with_the_label_key_escaped() {
        let p = pod(json!({"app": "web"}), None);
        let (review, _, _) = run(&p, Some(&injected()), &[ours("web", json!({"app": "web"}))]);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(review["response"]["patch"].as_str().unwrap())
            .unwrap();
        let ops: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            ops,
            json!([
                {"op": "add", "path": "/spec/readinessGates",
                 "value": [{"conditionType": "clb.azure.com/programmed"}]},
                {"op": "add", "path": "/metadata/labels/clb.azure.com~1readiness-gate",
                 "value": "true"},
            ])
        );
    }

    #[test]
    fn pointer_tokens_are_escaped() {
        assert_eq!(
            escape_pointer_token("clb.azure.com/readiness-gate"),
            "clb.azure.com~1readiness-gate"
        );
        assert_eq!(escape_pointer_token("a~b/c"), "a~0b~1c");
        assert_eq!(escape_pointer_token("~1"), "~01");
    }

    #[test]
    fn labels_are_created_when_the_pod_has_none() {
        // No Service selects a pod without labels, so `admit` never patches one; the patch
        // itself still creates the map.
        let p: Pod = serde_json::from_value(pod(Value::Null, None)).unwrap();
        assert_eq!(
            gate_patch(&p),
            vec![
                json!({"op": "add", "path": "/spec/readinessGates",
                       "value": [{"conditionType": "clb.azure.com/programmed"}]}),
                json!({"op": "add", "path": "/metadata/labels",
                       "value": {"clb.azure.com/readiness-gate": "true"}}),
            ]
        );
        let mut doc = pod(Value::Null, None);
        let patch: json_patch::Patch =
            serde_json::from_value(Value::Array(gate_patch(&p))).unwrap();
        json_patch::patch(&mut doc, &patch).unwrap();
        assert_eq!(
            doc["metadata"]["labels"],
            json!({"clb.azure.com/readiness-gate": "true"})
        );
    }

    #[test]
    fn an_existing_readiness_gate_list_is_appended_to() {
        let p = pod(
            json!({"app": "web"}),
            Some(json!([{"conditionType": "example.com/feature"}])),
        );
        let (_, outcome, patched) =
            run(&p, Some(&injected()), &[ours("web", json!({"app": "web"}))]);
        assert_eq!(outcome.result(), "patched");
        assert_eq!(
            patched["spec"]["readinessGates"],
            json!([
                {"conditionType": "example.com/feature"},
                {"conditionType": "clb.azure.com/programmed"}
            ])
        );
        // An empty list too.
        let p = pod(json!({"app": "web"}), Some(json!([])));
        let (_, _, patched) = run(&p, Some(&injected()), &[ours("web", json!({"app": "web"}))]);
        assert_eq!(
            patched["spec"]["readinessGates"],
            json!([{"conditionType": "clb.azure.com/programmed"}])
        );
    }

    #[test]
    fn the_gate_is_not_added_twice() {
        // The gate written by hand, no label: only the label is added.
        let p = pod(
            json!({"app": "web"}),
            Some(json!([{"conditionType": "clb.azure.com/programmed"}])),
        );
        let svcs = [ours("web", json!({"app": "web"}))];
        let (_, outcome, patched) = run(&p, Some(&injected()), &svcs);
        assert_eq!(outcome.result(), "patched");
        assert_eq!(
            patched["spec"]["readinessGates"],
            json!([{"conditionType": "clb.azure.com/programmed"}])
        );
        assert_eq!(patched["metadata"]["labels"][GATE_LABEL], "true");
        // Both by hand: nothing to do.
        let p = pod(
            json!({"app": "web", GATE_LABEL: "true"}),
            Some(json!([{"conditionType": "clb.azure.com/programmed"}])),
        );
        let (review, outcome, patched) = run(&p, Some(&injected()), &svcs);
        assert_eq!(outcome.result(), "unchanged", "{outcome:?}");
        assert!(review["response"].get("patch").is_none());
        assert_eq!(patched, p);
        // The label by hand, no gate: the gate only.
        let p = pod(json!({"app": "web", GATE_LABEL: "true"}), None);
        let (_, outcome, patched) = run(&p, Some(&injected()), &svcs);
        assert_eq!(outcome.result(), "patched");
        assert_eq!(
            patched["spec"]["readinessGates"],
            json!([{"conditionType": "clb.azure.com/programmed"}])
        );
        assert_eq!(patched["metadata"]["labels"], p["metadata"]["labels"]);
    }

    #[test]
    fn no_patch_in_a_namespace_without_the_inject_label() {
        let p = pod(json!({"app": "web"}), None);
        let svcs = [ours("web", json!({"app": "web"}))];
        for ns in [
            Some(BTreeMap::new()),
            Some(BTreeMap::from([(
                INJECT_LABEL.to_owned(),
                "disabled".to_owned(),
            )])),
            None,
        ] {
            let (review, outcome, patched) = run(&p, ns.as_ref(), &svcs);
            assert_eq!(outcome.result(), "unchanged", "{ns:?}: {outcome:?}");
            assert!(review["response"].get("patch").is_none());
            assert_eq!(patched, p);
        }
    }

    #[test]
    fn no_patch_for_a_pod_no_clb_service_selects() {
        let p = pod(json!({"app": "web"}), None);
        let mut elsewhere = ours("web-other-ns", json!({"app": "web"}));
        elsewhere.metadata.namespace = Some("other".to_owned());
        let mut deleting = ours("web-going", json!({"app": "web"}));
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2025-01-01T00:00:00Z".parse().unwrap(),
            ));
        for svcs in [
            vec![],
            // Another selector, a selector with more labels than the pod has, an empty one.
            vec![ours("api", json!({"app": "api"}))],
            vec![ours("web-canary", json!({"app": "web", "track": "canary"}))],
            vec![ours("no-selector", json!({}))],
            vec![elsewhere],
            vec![deleting],
            // Not a LoadBalancer.
            vec![service("web", None, "ClusterIP", json!({"app": "web"}))],
        ] {
            let (review, outcome, _) = run(&p, Some(&injected()), &svcs);
            assert_eq!(outcome.result(), "unchanged", "{svcs:?}: {outcome:?}");
            assert!(review["response"].get("patch").is_none());
        }
    }

    #[test]
    fn only_services_of_clbs_class_count() {
        let p = pod(json!({"app": "web"}), None);
        let other = service(
            "web",
            Some("service.k8s.aws/nlb"),
            "LoadBalancer",
            json!({"app": "web"}),
        );
        let (_, outcome, _) = run(&p, Some(&injected()), std::slice::from_ref(&other));
        assert_eq!(outcome.result(), "unchanged", "{outcome:?}");
        // Our class by name.
        let classed = service(
            "web",
            Some(crate::translate::DEFAULT_CLASS),
            "LoadBalancer",
            json!({"app": "web"}),
        );
        let (_, outcome, _) = run(&p, Some(&injected()), &[other.clone(), classed]);
        assert_eq!(outcome.result(), "patched");
        // Unclassed Services are ours only when claimed (the watcher's --claim-unclassed).
        let unclassed = ours("web", json!({"app": "web"}));
        let strict = TranslatorConfig {
            claim_unclassed: false,
            ..TranslatorConfig::default()
        };
        let (_, outcome) = admit(
            &request(p.clone()),
            Some(&injected()),
            [&unclassed],
            &strict,
        );
        assert_eq!(outcome.result(), "unchanged", "{outcome:?}");
        // Another class configured: ours is then another's.
        let custom = TranslatorConfig {
            class: "example.com/lb".to_owned(),
            ..TranslatorConfig::default()
        };
        let mine = service(
            "web",
            Some("example.com/lb"),
            "LoadBalancer",
            json!({"app": "web"}),
        );
        let (_, outcome) = admit(&request(p.clone()), Some(&injected()), [&mine], &custom);
        assert_eq!(outcome.result(), "patched");
    }

    #[test]
    fn several_selecting_services_are_named_once_sorted() {
        let p = pod(json!({"app": "web", "tier": "front"}), None);
        let svcs = [
            ours("web-b", json!({"app": "web"})),
            ours("web-a", json!({"tier": "front"})),
            ours("api", json!({"app": "api"})),
        ];
        let (_, outcome, patched) = run(&p, Some(&injected()), &svcs);
        assert_eq!(
            outcome,
            Outcome::Patched {
                services: vec!["web-a".to_owned(), "web-b".to_owned()]
            }
        );
        assert_eq!(
            patched["spec"]["readinessGates"].as_array().map(Vec::len),
            Some(1)
        );
    }

    #[test]
    fn a_pod_labelled_false_opts_out() {
        let p = pod(json!({"app": "web", GATE_LABEL: "false"}), None);
        let (_, outcome, patched) =
            run(&p, Some(&injected()), &[ours("web", json!({"app": "web"}))]);
        assert_eq!(outcome.result(), "unchanged", "{outcome:?}");
        assert_eq!(patched, p);
    }

    #[test]
    fn other_operations_kinds_and_bad_objects_are_allowed_unchanged() {
        let p = pod(json!({"app": "web"}), None);
        let svcs = [ours("web", json!({"app": "web"}))];
        let mut update = request(p.clone());
        update.operation = Operation::Update;
        let (r, outcome) = admit(&update, Some(&injected()), &svcs, &config());
        assert!(r.allowed && r.patch.is_none());
        assert_eq!(outcome.result(), "unchanged");
        let mut binding = request(p.clone());
        binding.sub_resource = Some("binding".to_owned());
        let (_, outcome) = admit(&binding, Some(&injected()), &svcs, &config());
        assert_eq!(outcome.result(), "unchanged");
        let mut deployment = request(p.clone());
        deployment.kind.group = "apps".to_owned();
        deployment.kind.kind = "Deployment".to_owned();
        let (_, outcome) = admit(&deployment, Some(&injected()), &svcs, &config());
        assert_eq!(outcome.result(), "unchanged");
        // An object that is not a Pod (a container list that is a string): allowed, an error.
        let mut bad = p.clone();
        bad["spec"]["containers"] = json!("nginx");
        let (r, outcome) = admit(&request(bad), Some(&injected()), &svcs, &config());
        assert!(r.allowed && r.patch.is_none());
        match outcome {
            Outcome::Error(e) => assert!(e.contains("not a valid v1 Pod"), "{e}"),
            other => panic!("{other:?}"),
        }
        let mut none = request(p);
        none.object = None;
        let (r, outcome) = admit(&none, Some(&injected()), &svcs, &config());
        assert!(r.allowed);
        assert_eq!(outcome.result(), "error");
    }

    #[test]
    fn selectors_select_subsets_and_never_when_empty() {
        let labels = BTreeMap::from([
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), "2".to_owned()),
        ]);
        let sel = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>()
        };
        assert!(selects(&sel(&[("a", "1")]), &labels));
        assert!(selects(&sel(&[("a", "1"), ("b", "2")]), &labels));
        assert!(!selects(&sel(&[("a", "2")]), &labels));
        assert!(!selects(&sel(&[("a", "1"), ("c", "3")]), &labels));
        assert!(!selects(&sel(&[]), &labels));
    }

    #[test]
    fn a_request_without_types_is_answered_as_v1() {
        let mut req = request(pod(json!({"app": "web"}), None));
        req.types = Default::default();
        let (r, _) = admit(&req, Some(&injected()), &[], &config());
        let review = review_json(r);
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(review["kind"], "AdmissionReview");
        assert_eq!(review["response"]["allowed"], true);
    }
}
