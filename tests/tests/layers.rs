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
