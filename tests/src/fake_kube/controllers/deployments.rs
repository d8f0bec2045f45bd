//! The simulated Deployment controller (see [`super`]).

use super::*;

// ---------------------------------------------------------------------------------------------
// Deployment controller

pub(super) struct Deployments;

/// `maxSurge` (rounded up) and `maxUnavailable` (rounded down) of a Deployment of `replicas`,
/// as Kubernetes resolves them (`ResolveFenceposts`: both 0 makes `maxUnavailable` 1).
pub(super) fn fenceposts(d: &Value, replicas: i64) -> (i64, i64) {
    let resolve = |v: Option<&Value>, up: bool| -> i64 {
        match v {
            Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
            Some(Value::String(p)) if p.ends_with('%') => {
                let pct: i64 = p.trim_end_matches('%').parse().unwrap_or(0);
                let x = pct * replicas;
                if up { (x + 99) / 100 } else { x / 100 }
            }
            Some(Value::String(n)) => n.parse().unwrap_or(0),
            _ => {
                let x = 25 * replicas;
                if up { (x + 99) / 100 } else { x / 100 }
            }
        }
    };
    let ru = d.pointer("/spec/strategy/rollingUpdate");
    let surge = resolve(ru.and_then(|r| r.get("maxSurge")), true).max(0);
    let mut unavailable = resolve(ru.and_then(|r| r.get("maxUnavailable")), false).max(0);
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    (surge, unavailable.min(replicas))
}

/// The order in which a ReplicaSet deletes pods (first deleted first): unscheduled, pending,
/// not ready, then the newest.
fn deletion_rank(pod: &Value) -> (bool, bool, bool, std::cmp::Reverse<u64>) {
    let created: u64 = s(pod, "/metadata/uid")
        .rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    (
        !s(pod, "/spec/nodeName").is_empty(),
        pointer_str(pod, "/status/phase") == Some("Running"),
        pod_ready(pod),
        std::cmp::Reverse(created),
    )
}

impl Deployments {
    fn create_pod(inner: &mut Inner, d: &Value, hash: &str) {
        let ns = s(d, "/metadata/namespace");
        let dname = s(d, "/metadata/name");
        let name = loop {
            let name = format!("{dname}-{hash}-{}", random_suffix(5));
            if !inner.resources["pods"]
                .objects
                .contains_key(&(ns.clone(), name.clone()))
            {
                break name;
            }
        };
        let template = &d["spec"]["template"];
        let mut labels = string_map(template.pointer("/metadata/labels"));
        labels.insert(POD_TEMPLATE_HASH.to_owned(), json!(hash));
        let mut metadata = json!({
            "namespace": ns,
            "name": name,
            "generateName": format!("{dname}-{hash}-"),
            "labels": labels,
            "uid": format!("uid-pods-{}", inner.rv + 1),
            "creationTimestamp": now(),
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "Deployment", "name": dname,
                "uid": s(d, "/metadata/uid"), "controller": true, "blockOwnerDeletion": true,
            }],
        });
        if let Some(a) = template
            .pointer("/metadata/annotations")
            .filter(|a| a.is_object())
        {
            metadata["annotations"] = a.clone();
        }
        let pod = json!({
            "metadata": metadata,
            "spec": template.get("spec").cloned().unwrap_or_else(|| json!({})),
            "status": {"phase": "Pending"},
        });
        inner.commit("pods", (ns, name), Some(pod));
    }

    /// Deletes the first `n` of `pods` in deletion order, through the API's deletion path.
    fn delete_pods(inner: &mut Inner, mut pods: Vec<&(Key, Value)>, n: usize) -> usize {
        pods.sort_by_key(|(_, p)| deletion_rank(p));
        let n = n.min(pods.len());
        for (key, _) in pods.into_iter().take(n) {
            inner.delete("pods", key.clone(), None);
        }
        n
    }

    /// One step of a rollout; whether it changed anything.
    fn step(
        inner: &mut Inner,
        d: &Value,
        hash: &str,
        new: &[&(Key, Value)],
        old: &[&(Key, Value)],
        any_old_left: bool,
    ) -> bool {
        let replicas = usize::try_from(
            d.pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(1)
                .max(0),
        )
        .unwrap_or(0);
        let recreate = pointer_str(d, "/spec/strategy/type") == Some("Recreate");
        if recreate {
            if !old.is_empty() {
                return Self::delete_pods(inner, old.to_vec(), old.len()) > 0;
            }
            if any_old_left {
                return false;
            }
        }
        if new.len() > replicas {
            return Self::delete_pods(inner, new.to_vec(), new.len() - replicas) > 0;
        }
        let (surge, unavailable) = fenceposts(d, i64::try_from(replicas).unwrap_or(0));
        let (surge, unavailable) = (
            usize::try_from(surge).unwrap_or(0),
            usize::try_from(unavailable).unwrap_or(0),
        );
        let total = new.len() + old.len();
        if new.len() < replicas {
            let allowed = if recreate { replicas } else { replicas + surge };
            let up = allowed.saturating_sub(total).min(replicas - new.len());
            if up > 0 {
                for _ in 0..up {
                    Self::create_pod(inner, d, hash);
                }
                return true;
            }
        }
        if old.is_empty() {
            return false;
        }
        // As `reconcileOldReplicaSets`: never below `replicas - maxUnavailable` available.
        let min_available = replicas.saturating_sub(unavailable);
        let new_unavailable = new.iter().filter(|(_, p)| !pod_ready(p)).count();
        let Some(max_scaled_down) = total
            .checked_sub(min_available + new_unavailable)
            .filter(|m| *m > 0)
        else {
            return false;
        };
        let unhealthy: Vec<&(Key, Value)> =
            old.iter().copied().filter(|(_, p)| !pod_ready(p)).collect();
        let mut deleted = Self::delete_pods(inner, unhealthy, max_scaled_down);
        let available = new.iter().chain(old).filter(|(_, p)| pod_ready(p)).count();
        if available > min_available {
            let healthy: Vec<&(Key, Value)> =
                old.iter().copied().filter(|(_, p)| pod_ready(p)).collect();
            deleted += Self::delete_pods(inner, healthy, available - min_available);
        }
        deleted > 0
    }

    fn status(d: &Value, new: &[&(Key, Value)], old: &[&(Key, Value)]) -> Value {
        let replicas = d
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1)
            .max(0);
        let (_, unavailable) = fenceposts(d, replicas);
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let ready = count(new.iter().chain(old).filter(|(_, p)| pod_ready(p)).count());
        let mut st = d.get("status").cloned().unwrap_or_default();
        if !st.is_object() {
            st = json!({});
        }
        st["observedGeneration"] = d
            .pointer("/metadata/generation")
            .cloned()
            .unwrap_or(json!(1));
        // As the API server serializes them: zero counts are omitted.
        for (f, v) in [
            ("replicas", count(new.len() + old.len())),
            ("updatedReplicas", count(new.len())),
            ("readyReplicas", ready),
            ("availableReplicas", ready),
            ("unavailableReplicas", (replicas - ready).max(0)),
        ] {
            if v == 0 {
                st.as_object_mut().expect("an object").remove(f);
            } else {
                st[f] = json!(v);
            }
        }
        let available = ready >= replicas - unavailable;
        set_condition(
            &mut st,
            json!({
                "type": "Available",
                "status": if available { "True" } else { "False" },
                "reason": if available { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
                "message": if available {
                    "Deployment has minimum availability."
                } else {
                    "Deployment does not have minimum availability."
                },
            }),
        );
        let complete = old.is_empty() && count(new.len()) == replicas && ready == replicas;
        let name = s(d, "/metadata/name");
        set_condition(
            &mut st,
            json!({
                "type": "Progressing",
                "status": "True",
                "reason": if complete { "NewReplicaSetAvailable" } else { "ReplicaSetUpdated" },
                "message": if complete {
                    format!("Deployment \"{name}\" has successfully progressed.")
                } else {
                    format!("Deployment \"{name}\" is progressing.")
                },
            }),
        );
        st
    }
}

impl Controller for Deployments {
    const WATCHES: &'static [&'static str] = &["deployments", "pods"];

    fn reconcile(&mut self, inner: &mut Inner, _now: Instant) -> Option<Instant> {
        let deployments = snapshot(inner, "deployments");
        let pods = snapshot(inner, "pods");
        let uids: HashSet<String> = deployments
            .iter()
            .map(|(_, d)| s(d, "/metadata/uid"))
            .collect();
        // Garbage collection: the pods of a Deployment that is gone.
        for (key, pod) in &pods {
            let owner_is_deployment = pod
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|refs| {
                    refs.iter().any(|r| {
                        r.get("kind").and_then(Value::as_str) == Some("Deployment")
                            && r.get("controller").and_then(Value::as_bool) == Some(true)
                    })
                });
            if owner_is_deployment
                && !terminating(pod)
                && controller_uid(pod).is_some_and(|u| !uids.contains(&u))
            {
                inner.delete("pods", key.clone(), None);
            }
        }
        for (key, d) in deployments {
            if terminating(&d) || d.pointer("/spec/paused") == Some(&json!(true)) {
                continue;
            }
            let uid = s(&d, "/metadata/uid");
            let hash = template_hash(&d["spec"]["template"]);
            let owned: Vec<&(Key, Value)> = pods
                .iter()
                .filter(|(k, p)| k.0 == key.0 && controller_uid(p).as_deref() == Some(uid.as_str()))
                .collect();
            let is_new = |p: &Value| {
                pointer_str(p, &format!("/metadata/labels/{POD_TEMPLATE_HASH}"))
                    == Some(hash.as_str())
            };
            let active = |p: &Value| !terminating(p) && !terminal(p);
            let new: Vec<&(Key, Value)> = owned
                .iter()
                .copied()
                .filter(|(_, p)| active(p) && is_new(p))
                .collect();
            let old: Vec<&(Key, Value)> = owned
                .iter()
                .copied()
                .filter(|(_, p)| active(p) && !is_new(p))
                .collect();
            let any_old_left = owned.iter().any(|(_, p)| !is_new(p) && !terminal(p));
            if Self::step(inner, &d, &hash, &new, &old, any_old_left) {
                // The next pass (woken by these changes) writes the status.
                continue;
            }
            let st = Self::status(&d, &new, &old);
            if d.get("status") != Some(&st) {
                let mut d = d;
                d["status"] = st;
                inner.commit("deployments", key, Some(d));
            }
        }
        None
    }
}
