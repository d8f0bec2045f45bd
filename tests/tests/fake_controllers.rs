//! The simulated Kubernetes controllers of the fake API (`clb_tests::fake_kube::controllers`):
//! scheduler and kubelet (pod readiness with readiness gates, graceful termination), the
//! EndpointSlice controller and the Deployment controller (rolling updates with `maxSurge` and
//! `maxUnavailable`), and the API they rely on (the `pods/status` subresource with merge and
//! strategic merge patches, Deployments). No clb component runs here.
//!
//! Waits poll with a generous deadline that only bounds a hung test; nothing asserts timing.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clb_tests::fake_kube::controllers::{
    ENDPOINTSLICE_CONTROLLER, MANAGED_BY_LABEL, POD_TEMPLATE_HASH, SERVICE_NAME_LABEL, condition,
    pod_ready, terminating,
};
use clb_tests::fake_kube::{
    API_AUDIENCE, ControllersConfig, FakeApi, KubeletConfig, STRATEGIC_MERGE_PATCH, TokenUser,
};
use clb_tests::kube_objects::{
    deployment, eventually, node, selecting_service, unscheduled_pod, with_readiness_gate,
};
use clb_tests::rbac;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::{Value, json};

/// The readiness gate the tests' pods carry.
const GATE: &str = "clb.example.com/load-balancer-ready";

/// A fake API with two nodes.
async fn cluster() -> FakeApi {
    let fake = FakeApi::start().await;
    fake.put("nodes", node("node-a", &["10.0.0.1"]));
    fake.put("nodes", node("node-b", &["10.0.0.2"]));
    fake
}

fn name(obj: &Value) -> String {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

fn label(obj: &Value, key: &str) -> Option<String> {
    obj.pointer("/metadata/labels")?
        .get(key)?
        .as_str()
        .map(str::to_owned)
}

/// The slice the controller maintains for Service `default/service`.
fn slice_of(fake: &FakeApi, service: &str) -> Result<Value, String> {
    let mut slices: Vec<Value> = fake
        .objects("endpointslices")
        .into_iter()
        .filter(|s| label(s, SERVICE_NAME_LABEL).as_deref() == Some(service))
        .collect();
    match slices.len() {
        1 => Ok(slices.remove(0)),
        n => Err(format!("{n} slices of {service}")),
    }
}

fn endpoints(slice: &Value) -> Vec<Value> {
    slice["endpoints"].as_array().cloned().unwrap_or_default()
}

/// The endpoint of pod `pod` in `slice`.
fn endpoint_of(slice: &Value, pod: &str) -> Option<Value> {
    endpoints(slice)
        .into_iter()
        .find(|e| e.pointer("/targetRef/name").and_then(Value::as_str) == Some(pod))
}

/// (ready, serving, terminating) of an endpoint.
fn conditions(e: &Value) -> (bool, bool, bool) {
    let c = |f: &str| e["conditions"][f].as_bool().unwrap_or(false);
    (c("ready"), c("serving"), c("terminating"))
}

fn pods_api(fake: &FakeApi) -> Api<Pod> {
    Api::namespaced(fake.kube_client(), "default")
}

/// Sets the gate condition of pod `pod` to `status` with a strategic merge patch of
/// `pods/status` (as client-go's controllers send it: only the condition).
async fn set_gate(fake: &FakeApi, pod: &str, status: &str) {
    let patch = json!({"status": {"conditions": [
        {"type": GATE, "status": status, "reason": "LoadBalancer"}
    ]}});
    pods_api(fake)
        .patch_status(pod, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("the strategic merge patch of pods/status");
}

fn ready_count(pods: &[Value]) -> usize {
    pods.iter()
        .filter(|p| pod_ready(p) && !terminating(p))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deployment_becomes_ready_pods_behind_an_endpoint_slice() {
    let fake = cluster().await;
    let _controllers = fake.start_controllers(ControllersConfig::default());
    fake.put("services", selecting_service("web", "uid-web", "web"));
    // Over HTTP, as kubectl would create it.
    let deployments: Api<Deployment> = Api::namespaced(fake.kube_client(), "default");
    let d: Deployment = serde_json::from_value(deployment("web", 4, "web")).unwrap();
    deployments
        .create(&PostParams::default(), &d)
        .await
        .expect("create the deployment");

    eventually("4 ready pods, a slice of 4 ready endpoints", || async {
        let pods = fake.deployment_pods("web");
        let slice = slice_of(&fake, "web")?;
        let ready = endpoints(&slice)
            .iter()
            .filter(|e| conditions(e) == (true, true, false))
            .count();
        if ready_count(&pods) == 4 && ready == 4 && fake.rolled_out("web") {
            Ok(())
        } else {
            Err(format!(
                "{} ready pods, {ready} ready endpoints",
                ready_count(&pods)
            ))
        }
    })
    .await;

    let pods = fake.deployment_pods("web");
    assert_eq!(pods.len(), 4);
    let hash = label(&pods[0], POD_TEMPLATE_HASH).expect("pod-template-hash");
    // The API server gave the Deployment its uid.
    let uid = fake.get("deployments", "default", "web").unwrap()["metadata"]["uid"].clone();
    let mut ips = HashSet::new();
    let mut per_node = std::collections::BTreeMap::<String, usize>::new();
    for p in &pods {
        let n = name(p);
        assert!(n.starts_with(&format!("web-{hash}-")), "{n}");
        assert_eq!(n.len(), format!("web-{hash}-").len() + 5, "{n}");
        assert_eq!(label(p, "app").as_deref(), Some("web"));
        assert_eq!(label(p, POD_TEMPLATE_HASH).as_deref(), Some(hash.as_str()));
        assert_eq!(p["metadata"]["ownerReferences"][0]["kind"], "Deployment");
        assert_eq!(p["metadata"]["ownerReferences"][0]["uid"], uid);
        assert_eq!(p["status"]["phase"], "Running");
        for c in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
            assert_eq!(condition(p, c), Some("True"), "{c} of {n}");
        }
        let node = p["spec"]["nodeName"].as_str().unwrap().to_owned();
        let (i, host) = if node == "node-a" {
            (0, "10.0.0.1")
        } else {
            (1, "10.0.0.2")
        };
        assert_eq!(p["status"]["hostIP"], host);
        assert_eq!(p["status"]["hostIPs"], json!([{"ip": host}]));
        let ip = p["status"]["podIP"].as_str().unwrap().to_owned();
        assert!(ip.starts_with(&format!("10.244.{i}.")), "{ip} on {node}");
        assert_eq!(p["status"]["podIPs"], json!([{"ip": ip}]));
        assert!(ips.insert(ip), "unique pod IPs");
        *per_node.entry(node).or_default() += 1;
    }
    assert_eq!(
        per_node.into_values().collect::<Vec<_>>(),
        [2, 2],
        "round-robin"
    );

    let slice = slice_of(&fake, "web").unwrap();
    assert!(name(&slice).starts_with("web-"));
    assert_eq!(
        label(&slice, MANAGED_BY_LABEL).as_deref(),
        Some(ENDPOINTSLICE_CONTROLLER)
    );
    assert_eq!(slice["addressType"], "IPv4");
    assert_eq!(
        slice["ports"],
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}])
    );
    assert_eq!(slice["metadata"]["ownerReferences"][0]["uid"], "uid-web");
    for p in &pods {
        let e = endpoint_of(&slice, &name(p)).expect("an endpoint per pod");
        assert_eq!(e["addresses"], json!([p["status"]["podIP"]]));
        assert_eq!(e["nodeName"], p["spec"]["nodeName"]);
        assert_eq!(
            e["targetRef"],
            json!({"kind": "Pod", "namespace": "default", "name": name(p), "uid": p["metadata"]["uid"]})
        );
    }

    // The API serves what the controllers wrote, typed.
    let d = deployments.get("web").await.expect("get the deployment");
    let status = d.status.expect("a status");
    assert_eq!(
        (status.ready_replicas, status.updated_replicas),
        (Some(4), Some(4))
    );
    let listed = pods_api(&fake)
        .list(&ListParams::default().labels("app=web"))
        .await
        .expect("list the pods of the namespace");
    assert_eq!(listed.items.len(), 4);
    let one = pods_api(&fake)
        .get(&name(&pods[0]))
        .await
        .expect("get a pod");
    assert_eq!(
        one.status.and_then(|s| s.pod_ip),
        pods[0]["status"]["podIP"].as_str().map(str::to_owned)
    );

    // A slice change is a MODIFIED event with a new resourceVersion; a deleted pod is replaced.
    let slices: Api<EndpointSlice> = Api::all(fake.kube_client());
    let rv = slice["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut events = slices
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch the slices")
        .boxed();
    let deleted = name(&pods[0]);
    fake.delete("pods", "default", &deleted);
    let modified = tokio::time::timeout(clb_tests::PATIENCE, async {
        loop {
            match events.next().await {
                Some(Ok(WatchEvent::Modified(s))) => break s,
                Some(Ok(_)) => {}
                other => panic!("the watch ended: {other:?}"),
            }
        }
    })
    .await
    .expect("a MODIFIED slice");
    assert_ne!(
        modified.metadata.resource_version.as_deref(),
        Some(rv.as_str())
    );
    eventually("a replacement pod, ready", || async {
        let pods = fake.deployment_pods("web");
        let gone = !pods.iter().any(|p| name(p) == deleted);
        if gone && ready_count(&pods) == 4 && pods.len() == 4 && fake.rolled_out("web") {
            Ok(())
        } else {
            Err(format!("{} pods, {} ready", pods.len(), ready_count(&pods)))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_readiness_gate_holds_a_pod_unready_until_its_condition_is_true() {
    let fake = cluster().await;
    let _controllers = fake.start_controllers(ControllersConfig::default());
    fake.put("services", selecting_service("web", "uid-web", "web"));
    let pods = pods_api(&fake);
    for p in ["g1", "g2"] {
        let pod: Pod =
            serde_json::from_value(with_readiness_gate(unscheduled_pod(p, "web"), GATE)).unwrap();
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create a pod");
    }
    eventually(
        "containers ready, pods not ready: the gate is missing",
        || async {
            let slice = slice_of(&fake, "web")?;
            for p in ["g1", "g2"] {
                let pod = fake.get("pods", "default", p).ok_or("no pod")?;
                let e = endpoint_of(&slice, p).ok_or("no endpoint")?;
                if condition(&pod, "ContainersReady") != Some("True")
                    || condition(&pod, "Ready") != Some("False")
                    || conditions(&e) != (false, false, false)
                {
                    return Err(format!("{p}: {pod}"));
                }
            }
            Ok(())
        },
    )
    .await;
    let g1 = fake.get("pods", "default", "g1").unwrap();
    let ready = g1["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready["reason"], "ReadinessGatesNotReady");
    assert_eq!(
        ready["message"],
        format!("corresponding condition of pod readiness gate \"{GATE}\" does not exist.")
    );

    // Strategic merge patch: the gate condition alone merges into the list by its type.
    set_gate(&fake, "g1", "True").await;
    eventually("g1 ready, its endpoint ready", || async {
        let pod = fake.get("pods", "default", "g1").ok_or("no pod")?;
        let e = endpoint_of(&slice_of(&fake, "web")?, "g1").ok_or("no endpoint")?;
        if pod_ready(&pod) && conditions(&e) == (true, true, false) {
            Ok(pod)
        } else {
            Err(format!("{pod}"))
        }
    })
    .await;
    let g1 = fake.get("pods", "default", "g1").unwrap();
    let types: HashSet<&str> = g1["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["type"].as_str())
        .collect();
    let want: HashSet<&str> = [
        "PodScheduled",
        "Initialized",
        "ContainersReady",
        "Ready",
        GATE,
    ]
    .into();
    assert_eq!(types, want, "the kubelet keeps the gate condition");
    let typed = pods.get_status("g1").await.expect("get pods/status");
    let typed_ready = typed
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten();
    assert!(
        typed_ready
            .into_iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    );
    assert!(
        endpoint_of(&slice_of(&fake, "web").unwrap(), "g2")
            .is_some_and(|e| conditions(&e) == (false, false, false)),
        "g2 still waits for its gate"
    );

    // JSON merge patch: the whole list, with the resourceVersion it was read at. A stale one
    // is refused with 409 Conflict, as for Services.
    let stale = fake.get("pods", "default", "g2").unwrap();
    let bump = json!({"metadata": {"labels": {"touched": "yes"}}});
    pods.patch("g2", &PatchParams::default(), &Patch::Merge(&bump))
        .await
        .expect("a merge patch of the pod");
    let with_gate = |pod: &Value| {
        let mut list = pod["status"]["conditions"].as_array().cloned().unwrap();
        list.push(json!({"type": GATE, "status": "True", "reason": "LoadBalancer"}));
        json!({
            "metadata": {"resourceVersion": pod["metadata"]["resourceVersion"]},
            "status": {"conditions": list},
        })
    };
    let refused = pods
        .patch_status(
            "g2",
            &PatchParams::default(),
            &Patch::Merge(&with_gate(&stale)),
        )
        .await;
    match refused {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (409, "Conflict")),
        other => panic!("a stale resourceVersion must conflict: {other:?}"),
    }
    eventually("the merge patch of g2's status lands", || async {
        let current = fake.get("pods", "default", "g2").ok_or("no pod")?;
        pods.patch_status(
            "g2",
            &PatchParams::default(),
            &Patch::Merge(&with_gate(&current)),
        )
        .await
        .map_err(|e| e.to_string())
    })
    .await;
    eventually("g2 ready, its endpoint ready", || async {
        let pod = fake.get("pods", "default", "g2").ok_or("no pod")?;
        let e = endpoint_of(&slice_of(&fake, "web")?, "g2").ok_or("no endpoint")?;
        if pod_ready(&pod) && conditions(&e) == (true, true, false) {
            Ok(())
        } else {
            Err(format!("{pod}"))
        }
    })
    .await;
    let flavours: HashSet<String> = fake
        .patches()
        .iter()
        .filter(|p| p.path.ends_with("/status") && p.status == 200)
        .map(|p| p.content_type.clone())
        .collect();
    assert!(flavours.contains(STRATEGIC_MERGE_PATCH), "{flavours:?}");
    assert!(
        flavours.contains("application/merge-patch+json"),
        "{flavours:?}"
    );

    // The kubelet keeps Ready up to date when the gate turns False again.
    set_gate(&fake, "g1", "False").await;
    eventually("g1 not ready again", || async {
        let pod = fake.get("pods", "default", "g1").ok_or("no pod")?;
        let e = endpoint_of(&slice_of(&fake, "web")?, "g1").ok_or("no endpoint")?;
        if !pod_ready(&pod) && conditions(&e) == (false, false, false) {
            Ok(())
        } else {
            Err(format!("{pod}"))
        }
    })
    .await;

    // A condition type that is not a qualified name is invalid (422), as the API server says.
    let bad = json!({"status": {"conditions": [{"type": "not a name", "status": "True"}]}});
    match pods
        .patch_status("g1", &PatchParams::default(), &Patch::Strategic(&bad))
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 422),
        other => panic!("an invalid condition type must be refused: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_update_keeps_every_replica_ready() {
    let fake = cluster().await;
    let _controllers = fake.start_controllers(ControllersConfig::default());
    fake.put("services", selecting_service("web", "uid-web", "web"));
    fake.put("deployments", deployment("web", 4, "web"));
    eventually("the first rollout, in the slice", || async {
        let pods = fake.deployment_pods("web");
        let slice = slice_of(&fake, "web")?;
        let ready = endpoints(&slice).iter().filter(|e| conditions(e).0).count();
        (fake.rolled_out("web") && ready_count(&pods) == 4 && ready == 4)
            .then_some(())
            .ok_or(format!(
                "{} ready, {ready} ready endpoints",
                ready_count(&pods)
            ))
    })
    .await;
    let old_hash = label(&fake.deployment_pods("web")[0], POD_TEMPLATE_HASH).unwrap();

    // Sample every 10 ms: ready pods, and ready endpoints of the slice, never below 4; never
    // more than 4 + 1 (maxSurge 25 %) pods that are not terminating.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (fake, stop) = (fake.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut min_ready, mut min_endpoints, mut max_active, mut samples) =
                (usize::MAX, usize::MAX, 0, 0);
            while !stop.load(Ordering::SeqCst) {
                let pods = fake.deployment_pods("web");
                min_ready = min_ready.min(ready_count(&pods));
                max_active = max_active.max(pods.iter().filter(|p| !terminating(p)).count());
                if let Ok(slice) = slice_of(&fake, "web") {
                    let ready = endpoints(&slice).iter().filter(|e| conditions(e).0).count();
                    min_endpoints = min_endpoints.min(ready);
                }
                samples += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (min_ready, min_endpoints, max_active, samples)
        })
    };
    let new_hash = fake.rollout("web");
    assert_ne!(new_hash, old_hash);
    eventually("every pod of the new template, ready", || async {
        let pods = fake.deployment_pods("web");
        let all_new = pods
            .iter()
            .all(|p| label(p, POD_TEMPLATE_HASH).as_deref() == Some(new_hash.as_str()));
        if all_new && pods.len() == 4 && ready_count(&pods) == 4 && fake.rolled_out("web") {
            Ok(())
        } else {
            Err(format!("{} pods, {} ready", pods.len(), ready_count(&pods)))
        }
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let (min_ready, min_endpoints, max_active, samples) = sampler.await.unwrap();
    assert!(samples > 10, "{samples} samples");
    assert!(min_ready >= 4, "{min_ready} ready pods at one moment");
    assert!(
        min_endpoints >= 4,
        "{min_endpoints} ready endpoints at one moment"
    );
    assert_eq!(max_active, 5, "the surge is one pod");
    let d = fake.get("deployments", "default", "web").unwrap();
    assert_eq!(d["status"]["updatedReplicas"], 4);
    assert_eq!(
        d["status"]["observedGeneration"],
        d["metadata"]["generation"]
    );
    let slice = slice_of(&fake, "web").unwrap();
    assert_eq!(endpoints(&slice).len(), 4, "the old pods left the slice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_gates_never_true_the_rollout_stops_at_the_surge() {
    let fake = cluster().await;
    let _controllers = fake.start_controllers(ControllersConfig::default());
    fake.put("services", selecting_service("web", "uid-web", "web"));
    fake.put(
        "deployments",
        with_readiness_gate(deployment("web", 4, "web"), GATE),
    );
    // Stands in for clb's watcher: sets the gate of the pods whose containers are ready.
    let open_gates = |only: Option<String>| {
        let fake = fake.clone();
        async move {
            for p in fake.deployment_pods("web") {
                let wanted = only
                    .as_deref()
                    .is_none_or(|h| label(&p, POD_TEMPLATE_HASH).as_deref() == Some(h));
                if wanted
                    && !terminating(&p)
                    && condition(&p, "ContainersReady") == Some("True")
                    && condition(&p, GATE).is_none()
                {
                    set_gate(&fake, &name(&p), "True").await;
                }
            }
        }
    };
    eventually("the first rollout, gates opened", || async {
        open_gates(None).await;
        fake.rolled_out("web")
            .then_some(())
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    let old: HashSet<String> = fake.deployment_pods("web").iter().map(name).collect();
    assert_eq!(old.len(), 4);

    let new_hash = fake.rollout("web");
    let is_new = |p: &Value| label(p, POD_TEMPLATE_HASH).as_deref() == Some(new_hash.as_str());
    eventually("the surge pod, its containers ready", || async {
        let pods = fake.deployment_pods("web");
        let surge: Vec<&Value> = pods.iter().filter(|p| is_new(p)).collect();
        (surge.len() == 1 && condition(surge[0], "ContainersReady") == Some("True"))
            .then_some(())
            .ok_or(format!("{} new pods", surge.len()))
    })
    .await;
    // Far longer than the controllers need to act: nothing moves while the new pod is not Ready.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pods = fake.deployment_pods("web");
    let new: Vec<&Value> = pods.iter().filter(|p| is_new(p)).collect();
    assert_eq!(new.len(), 1, "no pod beyond the surge");
    assert!(!pod_ready(new[0]));
    let still: HashSet<String> = pods.iter().filter(|p| !is_new(p)).map(name).collect();
    assert_eq!(still, old, "no old pod deleted");
    assert!(
        pods.iter()
            .filter(|p| !is_new(p))
            .all(|p| pod_ready(p) && !terminating(p))
    );
    assert!(!fake.rolled_out("web"));
    let d = fake.get("deployments", "default", "web").unwrap();
    assert_eq!(d["status"]["updatedReplicas"], 1);
    assert_eq!(d["status"]["readyReplicas"], 4);

    // Opening the new pods' gates lets the rollout go on, to the end.
    eventually("the rollout completes as gates open", || async {
        open_gates(Some(new_hash.clone())).await;
        let pods = fake.deployment_pods("web");
        let done = fake.rolled_out("web") && pods.iter().all(is_new) && pods.len() == 4;
        done.then_some(()).ok_or(format!("{} pods", pods.len()))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_pod_terminates_then_disappears() {
    let fake = cluster().await;
    let kubelet = KubeletConfig {
        termination_grace: Duration::from_secs(2),
        ..KubeletConfig::default()
    };
    let controllers = fake.start_controllers(ControllersConfig {
        kubelet: Some(kubelet),
        ..ControllersConfig::default()
    });
    fake.put("services", selecting_service("web", "uid-web", "web"));
    let pods = pods_api(&fake);
    for p in ["p1", "p2"] {
        let pod: Pod = serde_json::from_value(unscheduled_pod(p, "web")).unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    eventually("both endpoints ready", || async {
        let slice = slice_of(&fake, "web")?;
        let ready = endpoints(&slice)
            .iter()
            .filter(|e| conditions(e) == (true, true, false))
            .count();
        (ready == 2).then_some(()).ok_or(format!("{ready} ready"))
    })
    .await;

    // DELETE over HTTP: graceful (the pod's default grace, 30 s, capped by the kubelet's 2 s: long enough to be seen terminating).
    let answer = pods
        .delete("p1", &DeleteParams::default())
        .await
        .expect("delete");
    let deleted = answer.left().expect("the pod, being deleted");
    assert!(deleted.metadata.deletion_timestamp.is_some());
    assert_eq!(deleted.metadata.deletion_grace_period_seconds, Some(30));
    eventually("p1 terminating: not ready, not serving", || async {
        let e = endpoint_of(&slice_of(&fake, "web")?, "p1").ok_or("no endpoint")?;
        let pod = fake.get("pods", "default", "p1").ok_or("gone too soon")?;
        (conditions(&e) == (false, false, true) && !pod_ready(&pod) && terminating(&pod))
            .then_some(())
            .ok_or(format!("{e}"))
    })
    .await;
    eventually("p1 gone, from the API and the slice", || async {
        let slice = slice_of(&fake, "web")?;
        let gone =
            fake.get("pods", "default", "p1").is_none() && endpoint_of(&slice, "p1").is_none();
        gone.then_some(())
            .ok_or_else(|| "p1 still there".to_owned())
    })
    .await;
    let e = endpoint_of(&slice_of(&fake, "web").unwrap(), "p2").unwrap();
    assert_eq!(conditions(&e), (true, true, false));

    // A finalizer holds the pod after its grace; it goes when the finalizer is removed.
    let hold = json!({"metadata": {"finalizers": ["example.com/hold"]}});
    pods.patch("p2", &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .unwrap();
    fake.delete("pods", "default", "p2");
    eventually("p2 ended, held by its finalizer", || async {
        let pod = fake
            .get("pods", "default", "p2")
            .ok_or("gone despite the finalizer")?;
        let ended = pod["status"]["phase"] == "Succeeded"
            && pod["metadata"]["deletionGracePeriodSeconds"] == 0;
        ended.then_some(()).ok_or(format!("{pod}"))
    })
    .await;
    let release = json!({"metadata": {"finalizers": null}});
    pods.patch("p2", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();
    assert!(fake.get("pods", "default", "p2").is_none());
    controllers.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_terminating_pod_can_keep_serving_until_it_goes() {
    let fake = cluster().await;
    let kubelet = KubeletConfig {
        termination_grace: Duration::from_secs(2),
        // Longer than the grace: its readiness holds until the pod is removed.
        ready_while_terminating: Duration::from_secs(60),
        ..KubeletConfig::default()
    };
    let _controllers = fake.start_controllers(ControllersConfig {
        kubelet: Some(kubelet),
        ..ControllersConfig::default()
    });
    fake.put("services", selecting_service("web", "uid-web", "web"));
    fake.put("pods", unscheduled_pod("p1", "web"));
    eventually("p1 ready", || async {
        let e = endpoint_of(&slice_of(&fake, "web")?, "p1").ok_or("no endpoint")?;
        (conditions(&e) == (true, true, false))
            .then_some(())
            .ok_or(format!("{e}"))
    })
    .await;
    fake.delete("pods", "default", "p1");
    eventually("p1 terminating and serving", || async {
        let e = endpoint_of(&slice_of(&fake, "web")?, "p1").ok_or("gone too soon")?;
        (conditions(&e) == (false, true, true))
            .then_some(())
            .ok_or(format!("{e}"))
    })
    .await;
    eventually("p1 gone", || async {
        let slice = slice_of(&fake, "web")?;
        endpoint_of(&slice, "p1")
            .is_none()
            .then_some(())
            .ok_or_else(|| "still there".to_owned())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deployments_are_served_as_apps_v1() {
    let fake = cluster().await;
    let _controllers = fake.start_controllers(ControllersConfig::default());
    let deployments: Api<Deployment> = Api::namespaced(fake.kube_client(), "default");
    let d: Deployment = serde_json::from_value(deployment("web", 2, "web")).unwrap();
    let created = deployments
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    eventually("2 pods", || async {
        fake.rolled_out("web")
            .then_some(())
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    // Replace with a stale resourceVersion: 409; a merge patch of the spec scales it.
    let mut stale = created.clone();
    stale.spec.as_mut().unwrap().replicas = Some(3);
    match deployments
        .replace("web", &PostParams::default(), &stale)
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 409),
        other => panic!("a stale replace must conflict: {other:?}"),
    }
    let patch = json!({"spec": {"replicas": 3}});
    let patched = deployments
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(patched.metadata.generation, Some(2));
    eventually("3 pods", || async {
        let n = ready_count(&fake.deployment_pods("web"));
        (n == 3 && fake.rolled_out("web"))
            .then_some(())
            .ok_or(format!("{n}"))
    })
    .await;
    let current = deployments.get("web").await.unwrap();
    let mut fresh = current.clone();
    fresh.spec.as_mut().unwrap().replicas = Some(1);
    deployments
        .replace("web", &PostParams::default(), &fresh)
        .await
        .expect("a replace at the current resourceVersion");
    eventually("1 pod left", || async {
        let pods = fake.deployment_pods("web");
        (pods.len() == 1 && fake.rolled_out("web"))
            .then_some(())
            .ok_or(format!("{}", pods.len()))
    })
    .await;
    let listed = Api::<Deployment>::all(fake.kube_client())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    // Deleting the Deployment deletes its pods.
    deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("its pods gone", || async {
        let left = fake.objects("pods").len();
        (left == 0).then_some(()).ok_or(format!("{left} pods"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pod_status_patches_are_authorized_as_pods_status() {
    let fake = cluster().await;
    fake.put("pods", unscheduled_pod("p1", "web"));
    let role = rbac::cluster_role(
        "gatekeeper",
        vec![rbac::rule(&[""], &["pods/status"], &["patch"])],
    );
    fake.apply_rbac(&serde_json::to_value(role).unwrap());
    fake.create_cluster_role_binding("gatekeeper", "gatekeeper", rbac::user("gatekeeper"));
    fake.add_token("t-gk", TokenUser::user("gatekeeper", &[], API_AUDIENCE));
    fake.enforce_rbac(true);
    let pods: Api<Pod> = Api::namespaced(fake.kube_client_with_token("t-gk"), "default");
    let patch = json!({"status": {"conditions": [{"type": GATE, "status": "True"}]}});
    pods.patch_status("p1", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("patch pods/status");
    assert_eq!(
        condition(&fake.get("pods", "default", "p1").unwrap(), GATE),
        Some("True")
    );
    let labels = json!({"metadata": {"labels": {"x": "y"}}});
    match pods
        .patch("p1", &PatchParams::default(), &Patch::Merge(&labels))
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 403);
            assert!(
                s.message.contains("cannot patch resource \"pods\""),
                "{}",
                s.message
            );
        }
        other => panic!("the pod itself is not granted: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recreate_rollout_stops_every_old_pod_before_starting_new_ones() {
    let fake = cluster().await;
    let _controllers = fake.start_controllers(ControllersConfig::default());
    let mut d = deployment("web", 2, "web");
    d["spec"]["strategy"] = json!({"type": "Recreate"});
    fake.put("deployments", d);
    eventually("the first rollout", || async {
        fake.rolled_out("web")
            .then_some(())
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    let new_hash = fake.rollout("web");
    let overlap = AtomicBool::new(false);
    eventually("the rollout completes", || async {
        let pods = fake.deployment_pods("web");
        let is_new = |p: &&Value| label(p, POD_TEMPLATE_HASH).as_deref() == Some(new_hash.as_str());
        let both = pods.iter().any(|p| is_new(&p)) && pods.iter().any(|p| !is_new(&p));
        overlap.fetch_or(both, Ordering::SeqCst);
        let done = fake.rolled_out("web") && pods.len() == 2 && pods.iter().all(|p| is_new(&p));
        done.then_some(())
            .ok_or_else(|| format!("{} pods", pods.len()))
    })
    .await;
    assert!(
        !overlap.load(Ordering::SeqCst),
        "an old pod (even terminating) and a new one at once"
    );
}
