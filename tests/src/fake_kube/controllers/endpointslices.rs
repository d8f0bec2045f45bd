//! The simulated EndpointSlice controller (see [`super`]).

use super::*;

// ---------------------------------------------------------------------------------------------
// EndpointSlice controller

pub(super) struct EndpointSlices;

fn labels_contain(obj: &Value, selector: &Map<String, Value>) -> bool {
    let labels = obj.pointer("/metadata/labels");
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// The IP families of a Service's slices, as Kubernetes' controller makes them: one slice per
/// family of `spec.ipFamilies` (IPv4 when absent, a Service from before dual-stack).
fn service_families(svc: &Value) -> Vec<&'static str> {
    let listed: Vec<&'static str> = svc
        .pointer("/spec/ipFamilies")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|f| match f.as_str() {
            Some("IPv4") => Some("IPv4"),
            Some("IPv6") => Some("IPv6"),
            _ => None,
        })
        .collect();
    if listed.is_empty() {
        vec!["IPv4"]
    } else {
        listed
    }
}

/// A pod's IP of `family` (`IPv4` or `IPv6`): from `status.podIPs`, else `status.podIP`.
fn pod_ip_of(pod: &Value, family: &str) -> Option<String> {
    let listed = pod
        .pointer("/status/podIPs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|i| i.get("ip").and_then(Value::as_str));
    listed
        .chain(pointer_str(pod, "/status/podIP"))
        .find(|ip| match family {
            "IPv6" => ip.parse::<std::net::Ipv6Addr>().is_ok(),
            _ => ip.parse::<Ipv4Addr>().is_ok(),
        })
        .map(str::to_owned)
}

/// The port of a pod's container named `name`.
fn named_port(pod: &Value, name: &str) -> Option<i64> {
    pod.pointer("/spec/containers")?
        .as_array()?
        .iter()
        .filter_map(|c| c.get("ports").and_then(Value::as_array))
        .flatten()
        .find(|p| p.get("name").and_then(Value::as_str) == Some(name))?
        .get("containerPort")?
        .as_i64()
}

/// The fields of a Service's slice of `family` the controller owns: labels, owner, address type,
/// endpoints (the pods' IPs of that family), ports.
fn desired_slice(
    svc: &Value,
    family: &str,
    selector: &Map<String, Value>,
    pods: &[&Value],
    zones: &HashMap<String, String>,
) -> Value {
    let ns = s(svc, "/metadata/namespace");
    let name = s(svc, "/metadata/name");
    let publish = svc.pointer("/spec/publishNotReadyAddresses") == Some(&json!(true));
    let mut members: Vec<(&Value, String)> = pods
        .iter()
        .filter(|p| {
            s(p, "/metadata/namespace") == ns && labels_contain(p, selector) && !terminal(p)
        })
        .filter_map(|p| pod_ip_of(p, family).map(|ip| (*p, ip)))
        .collect();
    members.sort_by_key(|(p, _)| s(p, "/metadata/name"));
    let endpoints: Vec<Value> = members
        .iter()
        .map(|(p, ip)| {
            let ready_pod = pod_ready(p);
            let deleting = terminating(p);
            let serving = publish || ready_pod;
            let mut e = json!({
                "addresses": [ip],
                "conditions": {
                    "ready": publish || (ready_pod && !deleting),
                    "serving": serving,
                    "terminating": deleting,
                },
                "targetRef": {
                    "kind": "Pod",
                    "namespace": ns,
                    "name": s(p, "/metadata/name"),
                    "uid": s(p, "/metadata/uid"),
                },
            });
            let node = s(p, "/spec/nodeName");
            if !node.is_empty() {
                if let Some(zone) = zones.get(&node) {
                    e["zone"] = json!(zone);
                }
                e["nodeName"] = json!(node);
            }
            e
        })
        .collect();
    let ports: Vec<Value> = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|sp| {
            let port = match sp.get("targetPort") {
                None | Some(Value::Null) => sp.get("port")?.as_i64()?,
                Some(Value::Number(n)) => n.as_i64()?,
                Some(Value::String(t)) => match t.parse::<i64>() {
                    Ok(n) => n,
                    Err(_) => members.iter().find_map(|(p, _)| named_port(p, t))?,
                },
                Some(_) => return None,
            };
            let mut out = json!({
                "name": sp.get("name").and_then(Value::as_str).unwrap_or(""),
                "port": port,
                "protocol": sp.get("protocol").and_then(Value::as_str).unwrap_or("TCP"),
            });
            if let Some(app) = sp.get("appProtocol") {
                out["appProtocol"] = app.clone();
            }
            Some(out)
        })
        .collect();
    let mut labels = string_map(svc.pointer("/metadata/labels"));
    labels.insert(SERVICE_NAME_LABEL.to_owned(), json!(name));
    labels.insert(MANAGED_BY_LABEL.to_owned(), json!(ENDPOINTSLICE_CONTROLLER));
    json!({
        "metadata": {
            "labels": labels,
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Service", "name": name,
                "uid": s(svc, "/metadata/uid"), "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "addressType": family,
        "endpoints": endpoints,
        "ports": ports,
    })
}

/// Whether slice `cur` differs from `desired` in the fields the controller owns.
fn slice_differs(cur: &Value, desired: &Value) -> bool {
    [
        "/metadata/labels",
        "/metadata/ownerReferences",
        "/addressType",
        "/endpoints",
        "/ports",
    ]
    .iter()
    .any(|p| cur.pointer(p) != desired.pointer(p))
}

impl Controller for EndpointSlices {
    const WATCHES: &'static [&'static str] = &["services", "pods", "endpointslices", "nodes"];

    fn reconcile(&mut self, inner: &mut Inner, _now: Instant) -> Option<Instant> {
        let services = snapshot(inner, "services");
        let pods: Vec<Value> = inner.resources["pods"].objects.values().cloned().collect();
        let pods: Vec<&Value> = pods.iter().collect();
        let zones: HashMap<String, String> = inner.resources["nodes"]
            .objects
            .values()
            .filter_map(|n| {
                let zone = pointer_str(n, "/metadata/labels/topology.kubernetes.io~1zone")?;
                Some((s(n, "/metadata/name"), zone.to_owned()))
            })
            .collect();
        let managed: Vec<(Key, Value)> = snapshot(inner, "endpointslices")
            .into_iter()
            .filter(|(_, sl)| {
                pointer_str(
                    sl,
                    &format!("/metadata/labels/{}", MANAGED_BY_LABEL.replace('/', "~1")),
                ) == Some(ENDPOINTSLICE_CONTROLLER)
            })
            .collect();
        let mut kept: HashSet<Key> = HashSet::new();
        for (key, svc) in services {
            let selector = string_map(svc.pointer("/spec/selector"));
            if selector.is_empty()
                || pointer_str(&svc, "/spec/type") == Some("ExternalName")
                || terminating(&svc)
            {
                continue;
            }
            for family in service_families(&svc) {
                let desired = desired_slice(&svc, family, &selector, &pods, &zones);
                let mine = managed.iter().find(|(k, sl)| {
                    k.0 == key.0
                        && pointer_str(sl, "/metadata/labels/kubernetes.io~1service-name")
                            == Some(key.1.as_str())
                        && pointer_str(sl, "/addressType") == Some(family)
                });
                match mine {
                    Some((k, cur)) => {
                        kept.insert(k.clone());
                        if slice_differs(cur, &desired) {
                            let mut next = cur.clone();
                            for f in ["addressType", "endpoints", "ports"] {
                                next[f] = desired[f].clone();
                            }
                            for f in ["labels", "ownerReferences"] {
                                next["metadata"][f] = desired["metadata"][f].clone();
                            }
                            inner.commit("endpointslices", k.clone(), Some(next));
                        }
                    }
                    None => {
                        // The IPv4 slice keeps the name it always had; another family's is
                        // hashed with the family.
                        let uid = s(&svc, "/metadata/uid");
                        let seed = match family {
                            "IPv4" => uid,
                            f => format!("{uid}-{f}"),
                        };
                        let mut name = format!("{}-{}", key.1, short_hash(&seed));
                        while inner.resources["endpointslices"]
                            .objects
                            .contains_key(&(key.0.clone(), name.clone()))
                        {
                            name = format!("{}-{}", key.1, random_suffix(5));
                        }
                        let mut slice = desired;
                        let n = inner.rv + 1;
                        slice["metadata"]["namespace"] = json!(key.0);
                        slice["metadata"]["name"] = json!(name);
                        slice["metadata"]["generateName"] = json!(format!("{}-", key.1));
                        slice["metadata"]["uid"] = json!(format!("uid-endpointslices-{n}"));
                        slice["metadata"]["creationTimestamp"] = json!(now());
                        let k = (key.0.clone(), name);
                        kept.insert(k.clone());
                        inner.commit("endpointslices", k, Some(slice));
                    }
                }
            }
        }
        for (k, _) in managed {
            if !kept.contains(&k) {
                inner.commit("endpointslices", k, None);
            }
        }
        None
    }
}
