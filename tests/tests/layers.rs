//! The crate layers of docs/architecture.md ("Crates and their dependencies"), checked on the
//! manifests: the foundations depend on no clb crate and `clb-core` on no runtime, network or
//! Kubernetes crate; the sync worker and the watcher link neither the emulator nor the state server;
//! no crate depends on `clb-tests`. Cargo enforces that a crate uses only what its manifest lists, so
//! checking the manifests checks the code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One workspace member: its package name and the dependencies of each section.
#[derive(Debug)]
struct Manifest {
    name: String,
    /// `[dependencies]`.
    normal: BTreeSet<String>,
    /// `[dev-dependencies]` and `[build-dependencies]`.
    other: BTreeSet<String>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf()
}

/// The quoted strings of the root manifest's `members = [...]`.
fn members(root_manifest: &str) -> Vec<String> {
    let start = root_manifest
        .find("members = [")
        .expect("the root manifest lists its members");
    let list = &root_manifest[start..];
    let list = &list[..list.find(']').expect("members list ends")];
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Reads the sections of one member manifest that matter here. A dependency line is
/// `name = …` or `name.workspace = true`.
fn manifest(dir: &Path) -> Manifest {
    let text = std::fs::read_to_string(dir.join("Cargo.toml")).expect("member manifest");
    let mut m = Manifest {
        name: String::new(),
        normal: BTreeSet::new(),
        other: BTreeSet::new(),
    };
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.trim_matches(['[', ']']).to_owned();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        let dep = key.split('.').next().unwrap_or(key).to_owned();
        match section.as_str() {
            "package" if key == "name" => m.name = value.trim().trim_matches('"').to_owned(),
            "dependencies" => {
                m.normal.insert(dep);
            }
            "dev-dependencies" | "build-dependencies" => {
                m.other.insert(dep);
            }
            _ => {}
        }
    }
    assert!(!m.name.is_empty(), "{} has a package name", dir.display());
    m
}

fn workspace() -> BTreeMap<String, Manifest> {
    let root = root();
    let text = std::fs::read_to_string(root.join("Cargo.toml")).expect("root manifest");
    members(&text)
        .iter()
        .map(|member| {
            let m = manifest(&root.join(member));
            (m.name.clone(), m)
        })
        .collect()
}

/// Every clb crate `name` links (normal dependencies, transitively).
fn links(crates: &BTreeMap<String, Manifest>, name: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![name.to_owned()];
    while let Some(next) = todo.pop() {
        for dep in &crates[&next].normal {
            if crates.contains_key(dep) && seen.insert(dep.clone()) {
                todo.push(dep.clone());
            }
        }
    }
    seen
}

#[test]
fn the_manifests_are_read() {
    let crates = workspace();
    assert!(crates.len() >= 12, "{:?}", crates.keys());
    assert!(crates["clb-state-server"].normal.contains("clb-core"));
    assert!(crates["clb-sync-worker"].other.contains("clb-nrp-emulator"));
}

#[test]
fn the_foundations_depend_on_no_clb_crate() {
    let crates = workspace();
    for name in [
        "clb-proto",
        "clb-core",
        "clb-telemetry",
        "clb-nrp",
        "clb-gateways",
    ] {
        assert!(
            links(&crates, name).is_empty(),
            "{name} links {:?}",
            links(&crates, name)
        );
    }
}

#[test]
fn the_domain_depends_on_small_std_only_crates() {
    let crates = workspace();
    let allowed: BTreeSet<String> = ["smallvec", "thiserror", "foldhash"]
        .map(str::to_owned)
        .into();
    let extra: Vec<_> = crates["clb-core"].normal.difference(&allowed).collect();
    assert!(
        extra.is_empty(),
        "clb-core depends on {extra:?}: the domain takes no runtime, network or Kubernetes crate \
         (tokio, tonic, prost, kube, axum, reqwest, …)"
    );
}

#[test]
fn the_gateways_file_is_plain_data() {
    let crates = workspace();
    let allowed: BTreeSet<String> = ["serde", "yaml_serde", "thiserror"]
        .map(str::to_owned)
        .into();
    let extra: Vec<_> = crates["clb-gateways"].normal.difference(&allowed).collect();
    assert!(
        extra.is_empty(),
        "clb-gateways depends on {extra:?}: the file shared by server, workers and watcher takes \
         no runtime, network or Kubernetes crate"
    );
}

#[test]
fn workers_and_the_watcher_link_neither_the_emulator_nor_the_state_server() {
    let crates = workspace();
    for name in ["clb-sync-worker", "clb-watcher", "clb-client"] {
        let linked = links(&crates, name);
        for forbidden in ["clb-nrp-emulator", "clb-state-server", "clb-embedded"] {
            assert!(
                !linked.contains(forbidden),
                "{name} links {forbidden} ({linked:?})"
            );
        }
    }
    assert!(!links(&crates, "clb-watcher").contains("clb-nrp"));
    assert!(!links(&crates, "clb-state-server").contains("clb-nrp"));
}

#[test]
fn no_crate_depends_on_the_test_crate() {
    let crates = workspace();
    for m in crates.values() {
        assert!(
            !m.normal.contains("clb-tests") && !m.other.contains("clb-tests"),
            "{} depends on clb-tests",
            m.name
        );
    }
}

/// The modules of the state server and what each names of the others, from its source without its
/// test module: a module is a top-level file or directory of `state-server/src` (`state` with
/// `state/push.rs`), except `grpc/`, whose files are modules of their own (`grpc::writer`); a
/// child naming its parent (`super::require_leader` in `grpc/`) is not counted.
fn state_server_modules() -> BTreeMap<String, BTreeSet<String>> {
    let src = root().join("state-server/src");
    let mut files = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("state-server/src is readable") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let grpc_files: BTreeSet<String> = files
        .iter()
        .filter(|p| p.parent().is_some_and(|d| d.ends_with("grpc")))
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    let module_of = |path: &Path| -> String {
        let rel = path.strip_prefix(&src).expect("inside src");
        let parts: Vec<String> = rel
            .iter()
            .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_owned())
            .collect();
        match parts.as_slice() {
            [grpc, file] if grpc == "grpc" => format!("grpc::{file}"),
            [first, ..] => first.clone(),
            [] => unreachable!("a file has a name"),
        }
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in &files {
        let module = module_of(path);
        if module == "lib" || module == "bin" || module == "grpc::mod" {
            continue;
        }
        let text = std::fs::read_to_string(path).expect("source is readable");
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let deps = graph.entry(module.clone()).or_default();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (prefix, in_grpc) in [("crate::", false), ("super::", true)] {
                for (at, _) in line.match_indices(prefix) {
                    let rest = &line[at + prefix.len()..];
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    let target = if in_grpc {
                        if !module.starts_with("grpc::") || !grpc_files.contains(&name) {
                            continue;
                        }
                        format!("grpc::{name}")
                    } else if name == "grpc" {
                        let sub: String = rest["grpc::".len().min(rest.len())..]
                            .chars()
                            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                            .collect();
                        if grpc_files.contains(&sub) {
                            format!("grpc::{sub}")
                        } else {
                            "grpc".to_owned()
                        }
                    } else {
                        name
                    };
                    if target != module && !target.is_empty() {
                        deps.insert(target);
                    }
                }
            }
        }
    }
    graph
}

#[test]
fn the_state_server_s_modules_import_no_circle_and_only_the_composition_root_imports_grpc() {
    let graph = state_server_modules();
    assert!(
        graph.contains_key("state") && graph.contains_key("grpc::writer"),
        "{graph:?}"
    );
    // Only `run` (what the binary runs: it serves the gRPC services) names `crate::grpc`.
    for (module, deps) in &graph {
        if module.starts_with("grpc::") || module == "run" {
            continue;
        }
        let into_grpc: Vec<_> = deps.iter().filter(|d| d.starts_with("grpc")).collect();
        assert!(
            into_grpc.is_empty(),
            "{module} imports {into_grpc:?}: the gRPC layer is an edge, nothing beneath it names it"
        );
    }
    // No circle: a depth-first search finds no back edge.
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if done.contains(node) {
            return;
        }
        if let Some(at) = path.iter().position(|n| n == node) {
            panic!("import circle: {} -> {node}", path[at..].join(" -> "));
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            visit(next, graph, path, done);
        }
        path.pop();
        done.insert(node.to_owned());
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        visit(node, &graph, &mut Vec::new(), &mut done);
    }
}

#[test]
fn the_grpc_layer_changes_gateways_only_through_the_core() {
    // Every source file under grpc/, its modules' directories (grpc/convert/) included.
    let mut dirs = vec![root().join("state-server/src/grpc")];
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("grpc/ is readable") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    for path in files {
        let text = std::fs::read_to_string(&path).expect("source is readable");
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for forbidden in [
            "tracker_mut(",
            "dispatch_mut(",
            ".next_unit(",
            ".on_report(",
        ] {
            assert!(
                !code.contains(forbidden),
                "{} calls {forbidden}: the gRPC layer maps proto to the gateway's API \
                 (clb_core::gateway::GatewayCore) and never changes its tracker or dispatcher",
                path.display()
            );
        }
    }
}

/// The short name docs/architecture.md uses for a clb crate: `clb-core` is `core`, `clbctl` stays.
fn short(name: &str) -> String {
    name.strip_prefix("clb-").unwrap_or(name).to_owned()
}

#[test]
fn the_crate_table_of_the_architecture_matches_the_manifests() {
    let crates = workspace();
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).expect("architecture");
    let mut rows = BTreeMap::new();
    for line in doc.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split(" | ").collect();
        let Some(name) = cells[0]
            .strip_prefix("| `")
            .and_then(|c| c.strip_suffix('`'))
        else {
            continue;
        };
        // The crate table's rows give the crate's directory second (`core/`); other tables that
        // start with a crate name do not.
        let is_path = cells[1].starts_with('`') && cells[1].ends_with("/`");
        if !crates.contains_key(name) || cells.len() < 4 || !is_path {
            continue;
        }
        let listed: BTreeSet<String> = match cells[2].trim() {
            "—" => BTreeSet::new(),
            deps => deps.split(", ").map(str::to_owned).collect(),
        };
        rows.insert(name.to_owned(), listed);
    }
    for (name, manifest) in &crates {
        let direct: BTreeSet<String> = manifest
            .normal
            .iter()
            .filter(|d| crates.contains_key(*d))
            .map(|d| short(d))
            .collect();
        let listed = rows
            .get(name)
            .unwrap_or_else(|| panic!("docs/architecture.md has no row for {name}"));
        assert_eq!(
            listed, &direct,
            "docs/architecture.md lists {name} as depending on {listed:?}; its manifest says \
             {direct:?}"
        );
    }
}
