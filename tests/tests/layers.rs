//! The crate layers of docs/architecture.md ("Crates and their dependencies"), checked on the
//! manifests: the foundations depend on no clb crate and `clb-core` on no runtime, network or
//! Kubernetes crate; the sync worker and the watcher link neither the emulator nor the state server;
//! no crate depends on `clb-tests`. Cargo enforces that a crate uses only what its manifest lists, so
//! checking the manifests checks the code.
//!
//! Inside the crates, on the sources: the state server's modules import no circle and only grpc/
//! and the composition root (`lib.rs`, `bin/`, `run.rs`) name `crate::grpc`; grpc/ calls the
//! gateway's API and names neither its internals (`tracker()`, `dispatch()`, `gate()`) nor its
//! fields; no watcher module takes an item back from the watcher's crate root (`lib.rs` only
//! re-exports the public API).

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
    // Only grpc/ itself and the composition root name `crate::grpc`. The composition root is
    // `lib.rs`, `bin/` and `run.rs`: `run.rs` is the binary as a library (`run::bind` wires the
    // state, the caller checks, TLS, leader election and metrics and serves the gRPC services;
    // `bin/clb-state-server.rs` only parses flags and calls it), so it is the one place below the
    // binary that names every layer, the gRPC edge included.
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
        for (number, line) in code.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            if let Some(named) = core_internal_named(line) {
                panic!(
                    "{}:{}: names `{named}`: the gRPC layer converts requests to calls of the \
                     gateway's API (clb_core::gateway::GatewayCore, state::Gateway) and their \
                     results (the core's views) to responses; it never reaches into the tracker, \
                     the dispatcher, the restart gate or a field of the gateway\n{line}",
                    path.display(),
                    number + 1
                );
            }
        }
    }
}

/// The first accessor of the gateway's internals (`.tracker()`, `.dispatch()`, `.gate()`) or field
/// of it (`.tracker`, `.dispatch`, `.core`, `.trace_links`: `state::Gateway`'s and `GatewayCore`'s)
/// that `line` names, if any.
fn core_internal_named(line: &str) -> Option<&'static str> {
    const ACCESSORS: [&str; 3] = [".tracker()", ".dispatch()", ".gate()"];
    const FIELDS: [&str; 4] = [".tracker", ".dispatch", ".core", ".trace_links"];
    if let Some(a) = ACCESSORS.iter().find(|a| line.contains(**a)) {
        return Some(a);
    }
    FIELDS.into_iter().find(|field| {
        line.match_indices(field).any(|(at, _)| {
            let next = line[at + field.len()..].chars().next();
            !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    })
}

#[test]
fn the_core_internals_check_sees_accessors_and_fields() {
    assert_eq!(
        core_internal_named("g.tracker().counts()"),
        Some(".tracker()")
    );
    assert_eq!(
        core_internal_named("let d = g.dispatch();"),
        Some(".dispatch()")
    );
    assert_eq!(core_internal_named("g.gate().holds()"), Some(".gate()"));
    assert_eq!(core_internal_named("self.core.apply(x)"), Some(".core"));
    assert_eq!(
        core_internal_named("g.trace_links.take(w)"),
        Some(".trace_links")
    );
    assert_eq!(core_internal_named("g.gate_view(now)"), None);
    assert_eq!(core_internal_named("g.status(now, 100)"), None);
    assert_eq!(core_internal_named("clb_core::dispatch::RefusedItem"), None);
    assert_eq!(core_internal_named("g.dispatch_unit(x)"), None);
}

/// The names `watcher/src/lib.rs` declares: its modules, and the items it re-exports (`pub use
/// module::{A, b}` and `pub use module::A`, or `pub use clb_x::Y`).
fn watcher_root() -> (BTreeSet<String>, BTreeSet<String>) {
    let text = std::fs::read_to_string(root().join("watcher/src/lib.rs")).expect("watcher lib.rs");
    let mut modules = BTreeSet::new();
    let mut reexports = BTreeSet::new();
    let mut statement = String::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with("//") || line.starts_with("#[") {
            continue;
        }
        if let Some(m) = line
            .strip_prefix("pub mod ")
            .or_else(|| line.strip_prefix("mod "))
        {
            modules.insert(m.trim_end_matches(';').to_owned());
            continue;
        }
        if line.starts_with("pub use ") || !statement.is_empty() {
            statement.push_str(line);
            statement.push(' ');
            if !line.ends_with(';') {
                continue;
            }
            let body = statement
                .trim()
                .trim_start_matches("pub use ")
                .trim_end_matches(';');
            let names = match body.find('{') {
                Some(open) => body[open + 1..body.rfind('}').unwrap_or(body.len())].to_owned(),
                None => body.rsplit("::").next().unwrap_or(body).to_owned(),
            };
            for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                let name = name.rsplit(" as ").next().unwrap_or(name);
                reexports.insert(name.to_owned());
            }
            statement.clear();
        }
    }
    (modules, reexports)
}

/// The names `code` takes from the crate root: `crate::X` and each first segment of a
/// `crate::{X, y::Z}` group.
fn named_from_crate_root(code: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // A group, possibly over several lines and with nested groups: its top-level entries.
            let mut depth = 0usize;
            let mut entry = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.push(ident(entry.trim()));
                        entry.clear();
                        continue;
                    }
                    _ => {}
                }
                entry.push(c);
            }
            names.push(ident(entry.trim()));
        } else {
            names.push(ident(rest));
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

#[test]
fn no_watcher_module_imports_state_back_from_the_crate_root() {
    let (modules, reexports) = watcher_root();
    assert!(
        modules.contains("writeback") && reexports.contains("WatcherConfig"),
        "{modules:?} {reexports:?}"
    );
    assert_eq!(
        named_from_crate_root("use crate::{a, b::{C, d}, E};\nlet x = crate::F;"),
        ["a", "b", "E", "F"]
    );
    let src = root().join("watcher/src");
    let mut dirs = vec![src.clone()];
    let mut offenders = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("watcher/src is readable") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path == src.join("lib.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("source is readable");
            let code: String = text
                .split("#[cfg(test)]")
                .next()
                .unwrap_or_default()
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            for name in named_from_crate_root(&code) {
                // `run` is a module and a re-exported function: the module path is allowed.
                if reexports.contains(&name) && !modules.contains(&name) {
                    offenders.push(format!("{}: crate::{name}", path.display()));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "watcher modules name items through the crate root's re-exports (lib.rs is the crate \
         root only: its `pub use` is the public API; inside the crate, name the module that \
         defines the item, `crate::config::WatcherConfig`): {offenders:#?}"
    );
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
