//! The optional components (watcher-pods, poolservice, monitoring), the CRDs and the image.

use super::*;

#[test]
fn the_watcher_pods_component_grants_pods_exactly_when_it_sets_pods_true() {
    let dir = deploy_dir().join("components/watcher-pods");
    let k = kustomization(&dir);
    assert_eq!(k["kind"].as_str(), Some("Component"));
    // Its RBAC: pods list/watch for the watcher, nothing else.
    assert_eq!(
        component_grants("watcher-pods"),
        extra_calls(
            watcher_calls(false, true, false),
            watcher_calls(true, true, false)
        )
    );
    // Its patch of the watcher tests the value it replaces, and the watcher's --pods=false
    // becomes --pods=true.
    let tests_first = k["patches"]
        .as_sequence()
        .expect("patches")
        .iter()
        .filter_map(|p| yaml_serde::from_str::<yaml_serde::Value>(p["patch"].as_str()?).ok())
        .filter_map(|patch| patch.as_sequence().cloned())
        .all(|ops| ops.iter().any(|o| o["op"].as_str() == Some("test")));
    assert!(tests_first, "the patch tests the value it replaces");
    let m = load();
    let with = Rendered::load(&["watcher-pods"]);
    assert!(!watcher_args(&m, "clb-watcher").pods);
    let args = watcher_args(&with, "clb-watcher");
    assert!(args.pods && !args.no_pods, "the component sets --pods=true");
    // The objects it deletes (the node agents, which would report the same pods) exist in the
    // base (a deletion of a missing object fails the rendering) and nothing else goes.
    let objects = |r: &Rendered| -> BTreeSet<(String, String)> {
        r.documents
            .iter()
            .map(|d| (d.kind().to_owned(), d.name().to_owned()))
            .collect()
    };
    let deleted: BTreeSet<_> = objects(&m).difference(&objects(&with)).cloned().collect();
    let node_agent_objects: BTreeSet<(String, String)> = [
        ("DaemonSet", "clb-node-agent"),
        ("ServiceAccount", "clb-node-agent"),
        ("ClusterRole", "clb-node-agent"),
        ("ClusterRoleBinding", "clb-node-agent"),
        ("ClusterRoleBinding", "clb-node-writer-node-agent"),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_owned(), n.to_owned()))
    .collect();
    assert_eq!(deleted, node_agent_objects);
}

#[test]
fn the_poolservice_component_installs_the_crd_and_grants_what_the_watcher_then_calls() {
    let dir = deploy_dir().join("components/poolservice");
    let k = kustomization(&dir);
    assert_eq!(k["kind"].as_str(), Some("Component"));
    let with = Rendered::load(&["poolservice"]);
    // The CRD: OpenYurt's group, version, kind and plural (what the watcher's types say), with
    // the status subresource the watcher patches.
    let crds = with.crds();
    assert_eq!(crds.len(), 1);
    let crd = crds[0];
    use kube::Resource;
    type Ps = clb_watcher::poolservice::PoolService;
    assert_eq!(
        crd["metadata"]["name"].as_str(),
        Some(format!("{}.{}", Ps::plural(&()), Ps::group(&())).as_str())
    );
    assert_eq!(crd["spec"]["group"].as_str(), Some(&*Ps::group(&())));
    assert_eq!(crd["spec"]["names"]["kind"].as_str(), Some(&*Ps::kind(&())));
    assert_eq!(crd["spec"]["scope"].as_str(), Some("Namespaced"));
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"].as_str(), Some(&*Ps::version(&())));
    assert!(version["subresources"]["status"].is_object(), "{version:?}");
    let props = &version["schema"]["openAPIV3Schema"]["properties"];
    for field in ["loadBalancerClass", "nodepoolName"] {
        assert!(
            props["spec"]["properties"][field].is_object(),
            "spec.{field}"
        );
    }
    for field in ["loadBalancer", "conditions"] {
        assert!(
            props["status"]["properties"][field].is_object(),
            "status.{field}"
        );
    }
    // Its RBAC: exactly what --pool-services adds to the watcher's calls.
    assert_eq!(
        component_grants("poolservice"),
        extra_calls(
            watcher_calls(false, true, false),
            watcher_calls(false, true, true)
        )
    );
    // Its patches: the watcher gets the gateways file (mounted from the clb-gateways ConfigMap)
    // and --pool-services=true, the node agents the same file; both command lines still parse.
    let targets: BTreeSet<(String, String)> = k["patches"]
        .as_sequence()
        .expect("patches")
        .iter()
        .map(|p| {
            (
                p["target"]["kind"].as_str().expect("kind").to_owned(),
                p["target"]["name"].as_str().expect("name").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        targets,
        [
            ("DaemonSet".to_owned(), "clb-node-agent".to_owned()),
            ("Deployment".to_owned(), "clb-watcher".to_owned()),
        ]
        .into()
    );
    let watcher = watcher_args(&with, "clb-watcher");
    assert!(
        watcher.pool_services,
        "the component sets --pool-services=true"
    );
    for workload in ["clb-watcher", "clb-node-agent"] {
        let args = watcher_args(&with, workload);
        let file = args
            .gateways_file
            .unwrap_or_else(|| panic!("{workload}: the component sets --gateways-file"));
        let (_, template) = with
            .workloads()
            .into_iter()
            .find(|(n, _)| n == workload)
            .expect("rendered");
        let pod = template.spec.as_ref().expect("pod spec");
        let mount = pod.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .find(|v| file.starts_with(&v.mount_path))
            .unwrap_or_else(|| panic!("{workload}: the gateways file is mounted"));
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .expect("the mount's volume");
        assert_eq!(
            volume.config_map.as_ref().map(|c| c.name.as_str()),
            Some("clb-gateways"),
            "{workload}: the gateways file the state server and the workers read"
        );
    }
}

#[test]
fn every_crd_under_deploy_is_a_structural_schema_the_api_server_accepts() {
    // Every component (and the base), rendered; each CRD once.
    let mut components: Vec<String> = std::fs::read_dir(deploy_dir().join("components"))
        .expect("deploy/components")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    components.sort();
    let mut checked = BTreeSet::new();
    let renderings =
        std::iter::once(load()).chain(components.iter().map(|c| Rendered::load(&[c.as_str()])));
    for r in renderings {
        for d in r.of_kind("CustomResourceDefinition") {
            if !checked.insert(d.source.clone()) {
                continue;
            }
            let errors = clb_tests::crd_schema::check_crd(&d.value);
            assert!(
                errors.is_empty(),
                "{}: the API server would refuse this CRD:\n{}",
                d.source,
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
    assert!(
        checked.contains("components/poolservice/crd.yaml"),
        "{checked:?}"
    );
}

#[test]
fn the_monitoring_component_scrapes_every_components_metrics_port() {
    let m = load();
    let k = kustomization(&deploy_dir().join("components/monitoring"));
    assert_eq!(k["kind"].as_str(), Some("Component"));
    let with = Rendered::load(&["monitoring"]);
    let mut monitors = 0;
    for d in with
        .documents
        .iter()
        .filter(|d| d.source.starts_with("components/monitoring/"))
    {
        let doc = &d.value;
        assert_eq!(doc["apiVersion"].as_str(), Some("monitoring.coreos.com/v1"));
        assert_eq!(doc["kind"].as_str(), Some("PodMonitor"));
        assert_eq!(doc["metadata"]["namespace"].as_str(), Some(NAMESPACE));
        monitors += 1;
        let selector: BTreeMap<String, String> =
            serde_json::from_value(doc["spec"]["selector"]["matchLabels"].clone())
                .expect("spec.selector.matchLabels");
        let endpoints = doc["spec"]["podMetricsEndpoints"]
            .as_array()
            .expect("podMetricsEndpoints");
        for (w, t) in m.workloads() {
            assert!(selects(&selector, &labels(t)), "{w} is not scraped");
            let ports: BTreeSet<String> = t
                .spec
                .as_ref()
                .expect("pod spec")
                .containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .filter_map(|p| p.name.clone())
                .collect();
            for e in endpoints {
                let port = e["port"].as_str().expect("a named port");
                assert!(ports.contains(port), "{w} has no port {port}");
                assert_eq!(e["path"].as_str().unwrap_or("/metrics"), "/metrics");
            }
        }
    }
    assert_eq!(monitors, 1);
}

#[test]
fn the_image_caches_dependencies_and_ships_stripped_binaries_as_non_root() {
    let root = deploy_dir().join("..");
    let dockerfile = std::fs::read_to_string(deploy_dir().join("Dockerfile")).expect("Dockerfile");
    let ignore = std::fs::read_to_string(root.join(".dockerignore")).expect(".dockerignore");
    let ignored: BTreeSet<&str> = ignore
        .lines()
        .map(|l| l.trim().trim_end_matches('/'))
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for must in ["target", ".git"] {
        assert!(
            ignored.contains(must),
            ".dockerignore does not exclude {must}"
        );
    }
    // One instruction a line: continuation lines joined.
    let joined = dockerfile.replace("\\\n", " ");
    let instructions: Vec<&str> = joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    // The build stage: dependencies (cargo chef cook) are compiled before the sources are copied.
    let stage_start = instructions
        .iter()
        .position(|l| l.starts_with("FROM") && l.ends_with("AS build"))
        .expect("a build stage");
    let build_stage = &instructions[stage_start..];
    let cook = build_stage
        .iter()
        .position(|l| l.contains("cargo chef cook"))
        .expect("a dependency layer (cargo chef cook)");
    let copy_sources = build_stage
        .iter()
        .position(|l| *l == "COPY . .")
        .expect("the sources are copied");
    let build = build_stage
        .iter()
        .position(|l| l.contains("cargo build"))
        .expect("cargo build");
    assert!(cook < copy_sources && copy_sources < build);
    // The commit reaches clb_build_info{commit}: a build argument turned into the environment
    // of the build (after the dependency layer, so a new commit does not rebuild dependencies).
    let commit_env = build_stage
        .iter()
        .position(|l| l.starts_with("ENV CLB_GIT_COMMIT="))
        .expect("ENV CLB_GIT_COMMIT in the build stage");
    assert!(
        build_stage[..commit_env]
            .iter()
            .any(|l| l.starts_with("ARG CLB_GIT_COMMIT")),
        "CLB_GIT_COMMIT is a build argument"
    );
    assert!(cook < commit_env && commit_env < build);
    assert!(
        build_stage[cook].contains("--profile dist")
            && build_stage[build].contains("--profile dist"),
        "the dependency layer and the build use the same (dist) profile"
    );
    assert!(
        !dockerfile.contains("COPY target"),
        "no prebuilt binaries from the context"
    );
    // The dist profile: release, stripped.
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let dist = toml_section(&cargo, "[profile.dist]");
    assert!(dist.contains(&"inherits = \"release\""), "{dist:?}");
    assert!(dist.contains(&"strip = true"), "{dist:?}");
    // Every binary the manifests run is built and copied.
    let m = load();
    for (w, t) in m.workloads() {
        for c in &t.spec.as_ref().expect("pod spec").containers {
            for bin in c.command.iter().flatten() {
                assert!(
                    build_stage[build].contains(&format!("--bin {bin}"))
                        && dockerfile.contains(&format!("target/dist/{bin}")),
                    "{w}: {bin} is not in the image"
                );
            }
        }
    }
    // The runtime stage: distroless, as the non-root user the pods run as.
    let last_from = instructions
        .iter()
        .rposition(|l| l.starts_with("FROM"))
        .expect("FROM");
    assert!(
        instructions[last_from].contains("gcr.io/distroless/"),
        "{}",
        instructions[last_from]
    );
    let user = instructions[last_from..]
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("USER in the runtime stage");
    let uid: i64 = user
        .split(':')
        .next()
        .and_then(|u| u.parse().ok())
        .expect("a numeric USER (runAsNonRoot verifies it)");
    assert_ne!(uid, 0);
    for (w, t) in m.workloads() {
        let psc = t.spec.as_ref().expect("pod spec").security_context.clone();
        assert_eq!(
            psc.and_then(|s| s.run_as_user),
            Some(uid),
            "{w}: runAsUser is not the image's user"
        );
    }
}

/// The lines of the `[section]` of a TOML file, up to the next section.
fn toml_section<'a>(text: &'a str, section: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| l.trim() != section)
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}
