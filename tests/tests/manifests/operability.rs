//! Operability: probes, scheduling, Pod Security, the image registry.

use super::*;

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
