//! The API side of workloads in the fake ([`super::FakeApi`]), as the API server serves them:
//! - Pods: create (`generateName` honoured), get (and of `status`), namespaced list and watch,
//!   merge and strategic merge PATCH of the object and of its `status` subresource (the same
//!   code path as Services: `metadata.resourceVersion` preconditions, `409 Conflict`), pod
//!   condition validation (`422`), and **graceful deletion** while a kubelet runs
//!   ([`FakeApi::graceful_pod_deletion`]): a pod bound to a node gets `deletionTimestamp` and
//!   `deletionGracePeriodSeconds`, and the kubelet (`controllers.rs`) removes it when its
//!   containers have stopped;
//! - `apps/v1` Deployments: create, get, list, watch, replace (PUT, `resourceVersion`
//!   precondition), merge and strategic merge PATCH, delete;
//! - strategic merge patch (`application/strategic-merge-patch+json`; built-in resources only,
//!   `415` for the PoolService CRD as for any custom resource): maps merge as a JSON merge patch;
//!   the lists Kubernetes declares `patchStrategy: merge` merge by their key (`conditions` by
//!   `type`, `podIPs`/`hostIPs` by `ip`, `containers` by `name`, `ownerReferences` by `uid`;
//!   `finalizers` as a set), with the `$patch: delete|replace`, `$setElementOrder/…`,
//!   `$deleteFromPrimitiveList/…` and `$retainKeys` directives; other lists are replaced.
//!   Server-side apply is not served (`415`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Map, Value, json};

use super::{FakeApi, Inner, finalizers, json_response, pointer_str, status_body};

/// The content type of a strategic merge patch.
pub const STRATEGIC_MERGE_PATCH: &str = "application/strategic-merge-patch+json";
/// The content type of a JSON merge patch (RFC 7386).
pub const MERGE_PATCH: &str = "application/merge-patch+json";

/// The pod condition types the API server does not require to be qualified names.
const SYSTEM_POD_CONDITIONS: [&str; 3] = ["PodScheduled", "Ready", "Initialized"];

/// The workload state of the API server.
#[derive(Debug, Default)]
pub(super) struct Workloads {
    /// Pods bound to a node are deleted gracefully (a kubelet runs and finishes the deletion).
    pub(super) graceful_pods: bool,
}

/// `now` as the API server writes timestamps (RFC 3339, seconds).
pub fn timestamp(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The current time as the API server writes timestamps.
pub fn now() -> String {
    timestamp(Timestamp::now())
}

impl FakeApi {
    /// While on, DELETE of a pod bound to a node (and [`FakeApi::delete`] of one) is graceful, as
    /// the API server does it: `deletionTimestamp` (now + grace) and `deletionGracePeriodSeconds`
    /// (the request's `gracePeriodSeconds`, else the pod's `terminationGracePeriodSeconds`, else
    /// 30) are set and the pod stays until the kubelet removes it. Off by default (pods then go at
    /// once, as with `--grace-period=0 --force`, since no kubelet would ever finish the deletion);
    /// [`FakeApi::start_controllers`] turns it on when it runs a kubelet.
    pub fn graceful_pod_deletion(&self, on: bool) {
        self.lock().workloads.graceful_pods = on;
    }
}

/// Whether a PATCH of this content type is served for `plural`: a JSON merge patch always, a
/// strategic merge patch for built-in resources (not for the PoolService CRD).
pub(super) fn patch_type_allowed(plural: &str, content_type: &str) -> bool {
    content_type == MERGE_PATCH
        || (content_type == STRATEGIC_MERGE_PATCH && plural != "poolservices")
}

/// Applies a patch of `content_type` (one [`patch_type_allowed`]) to `target`.
pub(super) fn apply_patch(content_type: &str, target: &mut Value, patch: &Value) {
    if content_type == STRATEGIC_MERGE_PATCH {
        strategic_merge(target, patch);
    } else {
        super::merge(target, patch);
    }
}

/// The key by which the elements of the list field `field` merge in a strategic merge patch.
enum ListStrategy {
    /// Merge elements with the same value of this key.
    ByKey(&'static str),
    /// A set of scalars: union.
    Set,
}

fn list_strategy(field: &str) -> Option<ListStrategy> {
    Some(match field {
        "conditions" => ListStrategy::ByKey("type"),
        "podIPs" | "hostIPs" => ListStrategy::ByKey("ip"),
        "containers" | "initContainers" | "ephemeralContainers" => ListStrategy::ByKey("name"),
        "ownerReferences" => ListStrategy::ByKey("uid"),
        "finalizers" => ListStrategy::Set,
        _ => return None,
    })
}

/// Removes the `$…` directives of a patch element that is added as it is.
fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A strategic merge patch of `target` (see the module docs for what is modelled).
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = strip_directives(patch);
        return;
    }
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("an object");
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let gone: Vec<&Value> = v.as_array().map(|a| a.iter().collect()).unwrap_or_default();
            if let Some(list) = t.get_mut(field).and_then(Value::as_array_mut) {
                list.retain(|x| !gone.contains(&x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match (list_strategy(k), v) {
            (Some(strategy), Value::Array(items)) => {
                let slot = t.entry(k.clone()).or_insert_with(|| json!([]));
                merge_list(slot, items, &strategy);
            }
            _ => strategic_merge(t.entry(k.clone()).or_insert(Value::Null), v),
        }
    }
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$setElementOrder/")
            && let (Some(ListStrategy::ByKey(key)), Some(order)) =
                (list_strategy(field), v.as_array())
            && let Some(list) = t.get_mut(field).and_then(Value::as_array_mut)
        {
            let rank = |x: &Value| {
                order
                    .iter()
                    .position(|o| o.get(key) == x.get(key))
                    .unwrap_or(usize::MAX)
            };
            list.sort_by_key(rank);
        }
    }
    if let Some(keep) = p.get("$retainKeys").and_then(Value::as_array) {
        t.retain(|k, _| keep.iter().any(|x| x.as_str() == Some(k)));
    }
}

fn merge_list(slot: &mut Value, items: &[Value], strategy: &ListStrategy) {
    let replace = items
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"));
    if replace || !slot.is_array() {
        *slot = json!([]);
    }
    let list = slot.as_array_mut().expect("a list");
    for item in items {
        match strategy {
            ListStrategy::Set => {
                if !list.contains(item) {
                    list.push(item.clone());
                }
            }
            ListStrategy::ByKey(key) => {
                let directive = item.get("$patch").and_then(Value::as_str);
                if directive == Some("replace") && item.as_object().is_some_and(|m| m.len() == 1) {
                    continue;
                }
                let id = item.get(*key);
                let at = list.iter().position(|x| x.get(*key) == id);
                match (directive, at) {
                    (Some("delete"), Some(i)) => {
                        list.remove(i);
                    }
                    (Some("delete"), None) => {}
                    (_, Some(i)) => strategic_merge(&mut list[i], item),
                    (_, None) => list.push(strip_directives(item)),
                }
            }
        }
    }
}

/// A qualified name (`[prefix/]name`), as `ValidateQualifiedName` checks it.
fn qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && l.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    name_ok && prefix_ok
}

/// The validation of a pod's `status.conditions` on a status update, as the API server's
/// `validatePodConditions`: a condition type other than `PodScheduled`, `Ready` and
/// `Initialized` must be a qualified name; `observedGeneration` may not be negative. (Unlike
/// `metav1.Condition`s, `reason`, `message` and `lastTransitionTime` are optional.)
pub(super) fn validate_pod_status(pod: &Value) -> Result<(), String> {
    let Some(list) = pod.pointer("/status/conditions") else {
        return Ok(());
    };
    let Some(list) = list.as_array() else {
        return Err("status.conditions: must be a list".into());
    };
    for (i, c) in list.iter().enumerate() {
        let type_ = c.get("type").and_then(Value::as_str).unwrap_or("");
        if !SYSTEM_POD_CONDITIONS.contains(&type_) && !qualified_name(type_) {
            return Err(format!(
                "status.conditions[{i}].Type: Invalid value: {type_:?}: a qualified name must \
                 consist of alphanumeric characters, '-', '_' or '.'"
            ));
        }
        if c.get("observedGeneration")
            .is_some_and(|g| g.as_i64().is_none_or(|g| g < 0))
        {
            return Err(format!(
                "status.conditions[{i}].observedGeneration: Invalid value"
            ));
        }
    }
    Ok(())
}

/// The graceful deletion of a pod bound to a node while [`Workloads::graceful_pods`]: sets
/// `deletionTimestamp` (now + grace) and `deletionGracePeriodSeconds`, or shortens the grace of
/// a pod already terminating; returns the pod as answered. `None` when graceful deletion does not
/// apply (not a pod, off, not bound, grace 0, missing): the caller deletes at once.
pub(super) fn graceful_delete(
    inner: &mut Inner,
    plural: &str,
    key: &(String, String),
    grace: Option<i64>,
) -> Option<Value> {
    if plural != "pods" || !inner.workloads.graceful_pods {
        return None;
    }
    let pod = inner.resources["pods"].objects.get(key)?.clone();
    pointer_str(&pod, "/spec/nodeName").filter(|n| !n.is_empty())?;
    let grace = grace
        .or_else(|| {
            pod.pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
        })
        .unwrap_or(30);
    let current = pod
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64);
    if grace <= 0 && current.is_none() {
        return None;
    }
    if current.is_some_and(|c| c <= grace.max(0)) {
        return Some(pod);
    }
    let grace = grace.max(0);
    let at = Timestamp::now()
        .checked_add(SignedDuration::from_secs(grace))
        .expect("a time");
    let mut pod = pod;
    pod["metadata"]["deletionTimestamp"] = json!(timestamp(at));
    pod["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
    if grace == 0 && finalizers(&pod).is_empty() {
        inner.commit("pods", key.clone(), None);
        return Some(pod);
    }
    inner.commit("pods", key.clone(), Some(pod))
}

/// Whether an object with `deletionTimestamp` whose last finalizer is gone is removed now: unless
/// its graceful deletion (a pod's) is still under way.
pub(super) fn grace_over(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(0)
        == 0
}

/// `gracePeriodSeconds` of a DELETE (the query, else the DeleteOptions body).
fn grace_of(q: &HashMap<String, String>, body: &Bytes) -> Option<i64> {
    q.get("gracePeriodSeconds")
        .and_then(|g| g.parse().ok())
        .or_else(|| {
            serde_json::from_slice::<Value>(body)
                .ok()?
                .get("gracePeriodSeconds")?
                .as_i64()
        })
}

fn served(inner: &Arc<Mutex<Inner>>, plural: &str, api_version: &str) -> bool {
    inner
        .lock()
        .unwrap()
        .resources
        .get(plural)
        .is_some_and(|r| r.api_version == api_version)
}

fn not_found(plural: &str, name: &str) -> Response {
    json_response(
        404,
        &status_body(404, "NotFound", &format!("{plural} {name:?} not found")),
    )
}

/// The routes of this module; `None` for a request it does not serve (the fake's other routes
/// then answer it).
pub(super) fn route(
    inner: &Arc<Mutex<Inner>>,
    (method, path, segs): (&Method, &str, &[&str]),
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Option<Response> {
    let (api_version, rest) = match segs {
        ["api", "v1", rest @ ..] => ("v1".to_owned(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return None,
    };
    let workload = |p: &str| matches!(p, "pods" | "deployments");
    // Created with POST and replaced with PUT (the state server's TLS Secret and CA bundle too).
    let created = |p: &str| workload(p) || matches!(p, "secrets" | "configmaps");
    let answer = match (method, rest) {
        (&Method::GET, ["deployments"]) if served(inner, "deployments", &api_version) => {
            list_or_watch(inner, "deployments", q.clone())
        }
        (&Method::GET, ["namespaces", ns, plural]) if served(inner, plural, &api_version) => {
            let mut q = q.clone();
            let field = q.entry("fieldSelector".to_owned()).or_default();
            if !field.is_empty() {
                field.push(',');
            }
            field.push_str(&format!("metadata.namespace={ns}"));
            list_or_watch(inner, plural, q)
        }
        (
            &Method::GET,
            ["namespaces", ns, plural, name] | ["namespaces", ns, plural, name, "status"],
        ) if served(inner, plural, &api_version) => get(inner, plural, ns, name),
        (&Method::GET, [plural @ "nodes", name]) if served(inner, plural, &api_version) => {
            get(inner, plural, "", name)
        }
        (&Method::POST, ["namespaces", ns, plural])
            if created(plural) && served(inner, plural, &api_version) =>
        {
            create(inner, plural, ns, body)
        }
        (&Method::PUT, ["namespaces", ns, plural, name])
            if created(plural) && *plural != "pods" && served(inner, plural, &api_version) =>
        {
            replace(inner, plural, (ns, name), body)
        }
        (&Method::PATCH, ["namespaces", ns, plural, name, sub @ ..])
            if workload(plural) && served(inner, plural, &api_version) =>
        {
            super::patch_object(inner, plural, path, headers, (ns, name), sub, body)
        }
        (&Method::DELETE, ["namespaces", ns, plural, name])
            if workload(plural) && served(inner, plural, &api_version) =>
        {
            let key = ((*ns).to_owned(), (*name).to_owned());
            let deleted = inner.lock().unwrap().delete(plural, key, grace_of(q, body));
            match deleted {
                Some(answer) => json_response(200, &answer),
                None => not_found(plural, name),
            }
        }
        _ => return None,
    };
    Some(answer)
}

fn list_or_watch(inner: &Arc<Mutex<Inner>>, plural: &str, q: HashMap<String, String>) -> Response {
    if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
        super::watch(inner.clone(), plural, q)
    } else {
        super::list(inner, plural, &q)
    }
}

fn get(inner: &Arc<Mutex<Inner>>, plural: &str, ns: &str, name: &str) -> Response {
    let inner = inner.lock().unwrap();
    match inner.resources[plural]
        .objects
        .get(&(ns.to_owned(), name.to_owned()))
    {
        Some(o) => json_response(200, o),
        None => not_found(plural, name),
    }
}

/// POST: `metadata.generateName` gives a name with a random suffix; then as the fake's create.
fn create(inner: &Arc<Mutex<Inner>>, plural: &str, ns: &str, body: &Bytes) -> Response {
    let Ok(mut obj) = serde_json::from_slice::<Value>(body) else {
        return json_response(400, &status_body(400, "BadRequest", "the body is not JSON"));
    };
    if pointer_str(&obj, "/metadata/name").is_none()
        && let Some(prefix) = pointer_str(&obj, "/metadata/generateName").map(str::to_owned)
    {
        obj["metadata"]["name"] = json!(format!("{prefix}{}", random_suffix(5)));
    }
    super::create(inner, plural, ns, &Bytes::from(obj.to_string()))
}

/// PUT of an object: 404 if missing, 409 if the body's `resourceVersion` is not the current one;
/// `status`, `uid`, `creationTimestamp` and `deletionTimestamp` are kept (the status is a
/// subresource).
fn replace(
    inner: &Arc<Mutex<Inner>>,
    plural: &str,
    (ns, name): (&str, &str),
    body: &Bytes,
) -> Response {
    let mut inner = inner.lock().unwrap();
    let Ok(mut obj) = serde_json::from_slice::<Value>(body) else {
        return json_response(400, &status_body(400, "BadRequest", "the body is not JSON"));
    };
    if pointer_str(&obj, "/metadata/name").is_some_and(|n| n != name)
        || pointer_str(&obj, "/metadata/namespace").is_some_and(|n| n != ns)
    {
        return json_response(
            400,
            &status_body(400, "BadRequest", "the name or namespace differs"),
        );
    }
    let key = (ns.to_owned(), name.to_owned());
    let Some(current) = inner.resources[plural].objects.get(&key).cloned() else {
        return not_found(plural, name);
    };
    let want = pointer_str(&obj, "/metadata/resourceVersion");
    if want.is_some() && want != pointer_str(&current, "/metadata/resourceVersion") {
        return json_response(
            409,
            &status_body(
                409,
                "Conflict",
                &format!(
                    "Operation cannot be fulfilled on {plural} {name:?}: the object has been \
                     modified; please apply your changes to the latest version and try again"
                ),
            ),
        );
    }
    obj["metadata"]["name"] = json!(name);
    obj["metadata"]["namespace"] = json!(ns);
    for f in ["uid", "creationTimestamp", "deletionTimestamp"] {
        match current["metadata"].get(f) {
            Some(v) => obj["metadata"][f] = v.clone(),
            None => {
                if let Some(m) = obj["metadata"].as_object_mut() {
                    m.remove(f);
                }
            }
        }
    }
    match current.get("status") {
        Some(st) => obj["status"] = st.clone(),
        None => {
            if let Some(o) = obj.as_object_mut() {
                o.remove("status");
            }
        }
    }
    let answer = inner.commit(plural, key, Some(obj)).unwrap_or_default();
    json_response(200, &answer)
}

/// The alphabet of Kubernetes' generated name suffixes (no vowels, no confusable characters).
pub(super) const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// `n` random characters of [`ALPHANUMS`], as `generateName` appends.
pub(super) fn random_suffix(n: usize) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..n)
        .map(|_| ALPHANUMS[rng.random_range(0..ALPHANUMS.len())] as char)
        .collect()
}

/// A map of strings from a JSON object (labels, a selector's `matchLabels`).
pub(super) fn string_map(v: Option<&Value>) -> Map<String, Value> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter(|(_, v)| v.is_string())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_strategic_merge_patch_merges_conditions_by_type() {
        let mut status = json!({
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady"},
                {"type": "ContainersReady", "status": "True"},
            ],
            "podIPs": [{"ip": "10.244.0.2"}],
        });
        strategic_merge(
            &mut status,
            &json!({"conditions": [{"type": "example.com/gate", "status": "True"}]}),
        );
        let types: Vec<&str> = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["Ready", "ContainersReady", "example.com/gate"]);
        strategic_merge(
            &mut status,
            &json!({
                "$setElementOrder/conditions": [
                    {"type": "example.com/gate"}, {"type": "Ready"}, {"type": "ContainersReady"}
                ],
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": null},
                    {"type": "ContainersReady", "$patch": "delete"},
                ],
            }),
        );
        assert_eq!(
            status["conditions"],
            json!([
                {"type": "example.com/gate", "status": "True"},
                {"type": "Ready", "status": "True"},
            ])
        );
        // A list without a merge strategy is replaced, as by a merge patch.
        strategic_merge(&mut status, &json!({"containerStatuses": [{"name": "c"}]}));
        strategic_merge(&mut status, &json!({"containerStatuses": [{"name": "d"}]}));
        assert_eq!(status["containerStatuses"], json!([{"name": "d"}]));
        // `$patch: replace` of a list.
        strategic_merge(
            &mut status,
            &json!({"conditions": [{"$patch": "replace"}, {"type": "Ready", "status": "False"}]}),
        );
        assert_eq!(
            status["conditions"],
            json!([{"type": "Ready", "status": "False"}])
        );
        assert_eq!(status["phase"], "Running");
    }

    #[test]
    fn finalizers_merge_as_a_set() {
        let mut meta = json!({"finalizers": ["a"]});
        strategic_merge(&mut meta, &json!({"finalizers": ["b", "a"]}));
        assert_eq!(meta["finalizers"], json!(["a", "b"]));
        strategic_merge(
            &mut meta,
            &json!({"$deleteFromPrimitiveList/finalizers": ["a"]}),
        );
        assert_eq!(meta["finalizers"], json!(["b"]));
    }

    #[test]
    fn pod_condition_types_other_than_the_systems_are_qualified_names() {
        let pod = |t: &str| json!({"status": {"conditions": [{"type": t, "status": "True"}]}});
        for ok in [
            "Ready",
            "ContainersReady",
            "example.com/lb-ready",
            "clb.io/x_y.z",
        ] {
            assert!(validate_pod_status(&pod(ok)).is_ok(), "{ok}");
        }
        for bad in ["", "-x", "Example.com/x", "a/b/c", "x!"] {
            assert!(validate_pod_status(&pod(bad)).is_err(), "{bad}");
        }
    }
}
