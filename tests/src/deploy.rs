//! `deploy/` rendered as `kustomize build` (`kubectl apply -k`) renders it, for tests that must
//! check and run what is shipped: the base's resources, then optional components of
//! `deploy/components/<name>` (their resources, their JSON 6902 patches selected by `target`, their
//! `$patch: delete` patches), then the `images:` of every kustomization. Typed accessors
//! ([`Rendered::deployments`] …), the command line of a workload's container
//! ([`Rendered::container_argv`]), and its RBAC objects ([`Rendered::rbac`], evaluated by
//! [`crate::rbac`]). The flags of the state server and the watcher, parsed by the binaries' own
//! parsers: [`state_server_args`], [`watcher_args`].
//!
//! The renderer supports what deploy/ uses and refuses (panics on) anything else, rather than
//! render something kustomize would not.

use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};
use clb_state_server::config::Args;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodTemplateSpec, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::Deserialize;
use serde_json::Value;

use crate::rbac::Rbac;

/// The namespace deploy/ installs into.
pub const NAMESPACE: &str = "clb-system";

/// The value [`Rendered::container_argv`] gives a flag whose environment variable comes from the
/// downward API (`valueFrom`), e.g. the node agent's `--node`.
pub const DOWNWARD_API: &str = "from-the-downward-api";

/// `deploy/`.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The `kustomization.yaml` of `dir`.
pub fn kustomization(dir: &Path) -> yaml_serde::Value {
    let path = dir.join("kustomization.yaml");
    yaml_serde::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The documents of a YAML file (empty documents left out), as JSON values.
pub fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    documents_of(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The documents of YAML `text` (empty documents left out), as JSON values.
pub fn documents_of(text: &str) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for (i, de) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let doc = yaml_serde::Value::deserialize(de)
            .map_err(|e| format!("document {i}: invalid YAML: {e}"))?;
        if !doc.is_null() {
            out.push(serde_json::to_value(doc).map_err(|e| format!("document {i}: {e}"))?);
        }
    }
    Ok(out)
}

/// One object of a rendering, with the file it came from (relative to deploy/).
#[derive(Debug, Clone)]
pub struct Document {
    /// E.g. `watcher.yaml`, `components/poolservice/crd.yaml`.
    pub source: String,
    /// The object after patches and image transformations.
    pub value: Value,
}

impl Document {
    /// `kind`.
    pub fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or_default()
    }

    /// `metadata.namespace` (empty when cluster-scoped).
    pub fn namespace(&self) -> &str {
        self.value["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
    }
}

/// `deploy/` rendered with some components: every object, and typed views of the kinds the
/// project's workloads and RBAC use.
#[derive(Debug, Clone, Default)]
pub struct Rendered {
    /// The components rendered, in order.
    pub components: Vec<String>,
    /// Every object in kustomize's order (resources of the base, then of each component).
    pub documents: Vec<Document>,
    /// `v1` Namespaces.
    pub namespaces: Vec<Namespace>,
    /// `apps/v1` Deployments.
    pub deployments: Vec<Deployment>,
    /// `apps/v1` DaemonSets.
    pub daemon_sets: Vec<DaemonSet>,
    /// `v1` Services.
    pub services: Vec<Service>,
    /// `v1` ServiceAccounts.
    pub service_accounts: Vec<ServiceAccount>,
    /// `v1` ConfigMaps.
    pub config_maps: Vec<ConfigMap>,
    /// ClusterRoles.
    pub cluster_roles: Vec<ClusterRole>,
    /// ClusterRoleBindings.
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
    /// Roles.
    pub roles: Vec<Role>,
    /// RoleBindings.
    pub role_bindings: Vec<RoleBinding>,
    /// `policy/v1` PodDisruptionBudgets.
    pub pdbs: Vec<PodDisruptionBudget>,
    /// `networking.k8s.io/v1` NetworkPolicies.
    pub network_policies: Vec<NetworkPolicy>,
}

/// Top-level fields of a kustomization (or component) the renderer implements.
const SUPPORTED: [&str; 6] = [
    "apiVersion",
    "kind",
    "resources",
    "components",
    "patches",
    "images",
];

impl Rendered {
    /// `kustomize build` of deploy/ with `components` (names under `deploy/components/`) added
    /// as an overlay's `components:` would add them, in order. Panics on anything kustomize
    /// would refuse (a patch test that fails, a deletion of a missing object, an object that is
    /// not valid for its kind) and on features the renderer does not implement.
    pub fn load(components: &[&str]) -> Self {
        let base = deploy_dir();
        let mut docs = Vec::new();
        let mut images = Vec::new();
        let mut dirs: Vec<(String, PathBuf)> = vec![(String::new(), base.clone())];
        let base_k = kustomization(&base);
        for c in base_k["components"].as_sequence().into_iter().flatten() {
            let c = c.as_str().expect("a component path");
            dirs.push((format!("{c}/"), base.join(c)));
        }
        // The index in `dirs` after which the base's own patches apply.
        let base_components = dirs.len() - 1;
        for c in components {
            dirs.push((format!("components/{c}/"), base.join("components").join(c)));
        }
        for (i, (prefix, dir)) in dirs.iter().enumerate() {
            let k = kustomization(dir);
            let where_ = if prefix.is_empty() { "deploy/" } else { prefix };
            let want_kind = if i == 0 { "Kustomization" } else { "Component" };
            assert_eq!(
                k["kind"].as_str(),
                Some(want_kind),
                "{where_}kustomization.yaml"
            );
            for key in k.as_mapping().expect("a mapping").keys() {
                let key = key.as_str().unwrap_or_default();
                assert!(
                    SUPPORTED.contains(&key),
                    "{where_}kustomization.yaml: `{key}` is not supported by the test renderer"
                );
            }
            assert!(
                i == 0 || k["components"].is_null(),
                "{where_}kustomization.yaml: components of a component are not supported"
            );
            for file in k["resources"].as_sequence().into_iter().flatten() {
                let file = file.as_str().expect("a resource is a file name");
                let path = dir.join(file);
                assert!(path.is_file(), "{where_}{file}: only files are supported");
                for value in documents(&path) {
                    docs.push(Document {
                        source: format!("{prefix}{file}"),
                        value,
                    });
                }
            }
            // A component's patches apply to everything accumulated so far; the base's own, after
            // the components it lists itself (before an overlay's).
            let mut patches = Vec::new();
            if i > 0 {
                patches.push((dir, where_, &k));
            }
            if i == base_components {
                patches.push((&base, "deploy/", &base_k));
            }
            for (dir, where_, k) in patches {
                for p in k["patches"].as_sequence().into_iter().flatten() {
                    apply_patch(&mut docs, dir, p, where_);
                }
            }
            images.extend(k["images"].as_sequence().into_iter().flatten().cloned());
        }
        for d in &mut docs {
            for image in &images {
                set_image(&mut d.value, image);
            }
        }
        let mut r = Self {
            components: components.iter().map(|c| (*c).to_owned()).collect(),
            ..Self::default()
        };
        for d in &docs {
            r.add_typed(d);
        }
        r.documents = docs;
        r
    }

    fn add_typed(&mut self, d: &Document) {
        fn parse<T: serde::de::DeserializeOwned>(d: &Document) -> T {
            serde_json::from_value(d.value.clone()).unwrap_or_else(|e| {
                panic!(
                    "{}: {} {}: not a valid object of its kind: {e}",
                    d.source,
                    d.kind(),
                    d.name()
                )
            })
        }
        let api = d.value["apiVersion"].as_str().unwrap_or_default();
        match (api, d.kind()) {
            ("v1", "Namespace") => self.namespaces.push(parse(d)),
            ("apps/v1", "Deployment") => self.deployments.push(parse(d)),
            ("apps/v1", "DaemonSet") => self.daemon_sets.push(parse(d)),
            ("v1", "Service") => self.services.push(parse(d)),
            ("v1", "ServiceAccount") => self.service_accounts.push(parse(d)),
            ("v1", "ConfigMap") => self.config_maps.push(parse(d)),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => self.cluster_roles.push(parse(d)),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                self.cluster_role_bindings.push(parse(d))
            }
            ("rbac.authorization.k8s.io/v1", "Role") => self.roles.push(parse(d)),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => self.role_bindings.push(parse(d)),
            ("policy/v1", "PodDisruptionBudget") => self.pdbs.push(parse(d)),
            ("networking.k8s.io/v1", "NetworkPolicy") => self.network_policies.push(parse(d)),
            _ => {}
        }
    }

    /// Whether [`Rendered`] has a typed view of this `apiVersion` and `kind`.
    pub fn is_typed(d: &Document) -> bool {
        let api = d.value["apiVersion"].as_str().unwrap_or_default();
        matches!(
            (api, d.kind()),
            (
                "v1",
                "Namespace" | "Service" | "ServiceAccount" | "ConfigMap"
            ) | ("apps/v1", "Deployment" | "DaemonSet")
                | (
                    "rbac.authorization.k8s.io/v1",
                    "ClusterRole" | "ClusterRoleBinding" | "Role" | "RoleBinding"
                )
                | ("policy/v1", "PodDisruptionBudget")
                | ("networking.k8s.io/v1", "NetworkPolicy")
        )
    }

    /// The documents of `kind`.
    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Document> + 'a {
        self.documents.iter().filter(move |d| d.kind() == kind)
    }

    /// The object of `kind` named `name`, if rendered.
    pub fn find(&self, kind: &str, name: &str) -> Option<&Document> {
        self.documents
            .iter()
            .find(|d| d.kind() == kind && d.name() == name)
    }

    /// The CustomResourceDefinitions, as JSON (their schemas are checked as the API server
    /// checks them, see `tests/tests/manifests.rs`).
    pub fn crds(&self) -> Vec<&Value> {
        self.of_kind("CustomResourceDefinition")
            .map(|d| &d.value)
            .collect()
    }

    /// `(name, pod template)` of every Deployment and DaemonSet.
    pub fn workloads(&self) -> Vec<(String, &PodTemplateSpec)> {
        let name = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            m.name.clone().expect("every object is named")
        };
        let d = self
            .deployments
            .iter()
            .map(|d| (name(&d.metadata), &d.spec.as_ref().expect("spec").template));
        let ds = self
            .daemon_sets
            .iter()
            .map(|d| (name(&d.metadata), &d.spec.as_ref().expect("spec").template));
        d.chain(ds).collect()
    }

    /// The ConfigMap `name`; panics if it is not rendered (it is referred to).
    pub fn config_map(&self, name: &str) -> &ConfigMap {
        self.config_maps
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("ConfigMap {name} is referred to but not defined"))
    }

    /// The first container of the Deployment or DaemonSet `workload`.
    pub fn container(&self, workload: &str) -> &Container {
        let (_, t) = self
            .workloads()
            .into_iter()
            .find(|(n, _)| n == workload)
            .unwrap_or_else(|| panic!("workload {workload} is not rendered"));
        &t.spec.as_ref().expect("pod spec").containers[0]
    }

    /// The command line the first container of `workload` runs with, for the binary whose flags
    /// are `cmd`: its name, its args, then (as `--flag=value`) the environment entries the binary
    /// reads (a flag's `env`), from referenced ConfigMaps (`envFrom`) and from `env` values;
    /// values from the downward API become [`DOWNWARD_API`].
    pub fn container_argv(&self, workload: &str, cmd: &clap::Command) -> Vec<String> {
        self.command_line(self.container(workload), cmd)
    }

    /// [`Rendered::container_argv`] of a given container.
    pub fn command_line(&self, c: &Container, cmd: &clap::Command) -> Vec<String> {
        let mut argv = vec![cmd.get_name().to_owned()];
        argv.extend(c.args.iter().flatten().cloned());
        let mut env: Vec<(String, String)> = Vec::new();
        for from in c.env_from.iter().flatten() {
            if let Some(r) = &from.config_map_ref {
                env.extend(self.config_map(&r.name).data.clone().unwrap_or_default());
            }
        }
        for e in c.env.iter().flatten() {
            let v = match (&e.value, &e.value_from) {
                (Some(v), _) => v.clone(),
                (None, Some(_)) => DOWNWARD_API.to_owned(),
                (None, None) => String::new(),
            };
            env.push((e.name.clone(), v));
        }
        for (k, v) in env {
            if let Some(arg) = cmd
                .get_arguments()
                .find(|a| a.get_env().and_then(|e| e.to_str()) == Some(k.as_str()))
            {
                let long = arg.get_long().expect("env-backed flags are long flags");
                argv.push(format!("--{long}={v}"));
            }
        }
        argv
    }

    /// The Deployment or DaemonSet defined in `file` (relative to deploy/).
    pub fn workload_of_file(&self, file: &str) -> String {
        self.documents
            .iter()
            .find(|d| d.source == file && matches!(d.kind(), "Deployment" | "DaemonSet"))
            .map(|d| d.name().to_owned())
            .unwrap_or_else(|| panic!("deploy/{file} defines no Deployment or DaemonSet"))
    }

    /// Every ClusterRole, Role, ClusterRoleBinding and RoleBinding rendered.
    pub fn rbac(&self) -> Rbac {
        let mut rbac = Rbac::new();
        for d in &self.documents {
            rbac.apply(&d.value)
                .unwrap_or_else(|e| panic!("{}: {e}", d.source));
        }
        rbac
    }
}

/// Applies one entry of a kustomization's `patches:` of `dir` to `docs`.
fn apply_patch(docs: &mut Vec<Document>, dir: &Path, p: &yaml_serde::Value, where_: &str) {
    let text = match (p["patch"].as_str(), p["path"].as_str()) {
        (Some(t), None) => t.to_owned(),
        (None, Some(f)) => {
            std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("{where_}{f}: {e}"))
        }
        _ => panic!("{where_}: a patch has either `patch` or `path`"),
    };
    let patch: yaml_serde::Value =
        yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{where_}: patch: {e}"));
    let patch = serde_json::to_value(patch).expect("a patch as JSON");
    let target = &p["target"];
    if let Some(ops) = patch.as_array() {
        // JSON 6902: every object the target selects (kustomize accepts a target that selects
        // nothing, e.g. the node agents' DaemonSet deleted by another component).
        assert!(
            target.is_mapping(),
            "{where_}: a JSON 6902 patch needs a target"
        );
        for d in docs.iter_mut().filter(|d| selects(target, d)) {
            json_patch(&mut d.value, &Value::Array(ops.clone()))
                .unwrap_or_else(|e| panic!("{where_}: patch of {} {}: {e}", d.kind(), d.name()));
        }
        return;
    }
    assert_eq!(
        patch["$patch"].as_str(),
        Some("delete"),
        "{where_}: only JSON 6902 patches and `$patch: delete` are supported: {text}"
    );
    let before = docs.len();
    docs.retain(|d| {
        let same = d.kind() == patch["kind"].as_str().unwrap_or_default()
            && d.value["apiVersion"] == patch["apiVersion"]
            && d.name() == patch["metadata"]["name"].as_str().unwrap_or_default()
            && d.namespace() == patch["metadata"]["namespace"].as_str().unwrap_or_default();
        !same
    });
    assert_eq!(
        before - docs.len(),
        1,
        "{where_}: `$patch: delete` of {} {} must match exactly one object",
        patch["kind"],
        patch["metadata"]["name"]
    );
}

/// Whether a patch `target` (group, version, kind, name, namespace) selects `d`.
fn selects(target: &yaml_serde::Value, d: &Document) -> bool {
    for key in target.as_mapping().expect("target").keys() {
        let key = key.as_str().unwrap_or_default();
        assert!(
            ["group", "version", "kind", "name", "namespace"].contains(&key),
            "patch target field `{key}` is not supported by the test renderer"
        );
    }
    let api = d.value["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api.split_once('/').unwrap_or(("", api));
    let field = |k: &str| target[k].as_str();
    field("group").is_none_or(|g| g == group)
        && field("version").is_none_or(|v| v == version)
        && field("kind").is_none_or(|k| k == d.kind())
        && field("name").is_none_or(|n| n == d.name())
        && field("namespace").is_none_or(|n| n == d.namespace())
}

/// `name`, `tag`, `digest` of an image reference (`registry:port/name:tag@digest`).
fn split_image(image: &str) -> (&str, Option<&str>, Option<&str>) {
    let (rest, digest) = match image.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (image, None),
    };
    let slash = rest.rfind('/').map_or(0, |i| i + 1);
    match rest[slash..].rfind(':') {
        Some(i) => (&rest[..slash + i], Some(&rest[slash + i + 1..]), digest),
        None => (rest, None, digest),
    }
}

/// kustomize's image transformer: containers whose image's name is `entry.name` get `newName`,
/// `newTag` or `digest`.
fn set_image(doc: &mut Value, entry: &yaml_serde::Value) {
    let Some(spec) = doc.pointer_mut("/spec/template/spec") else {
        return;
    };
    for list in ["containers", "initContainers"] {
        for c in spec[list].as_array_mut().into_iter().flatten() {
            let Some(image) = c["image"].as_str() else {
                continue;
            };
            let (name, tag, digest) = split_image(image);
            if Some(name) != entry["name"].as_str() {
                continue;
            }
            let mut new = entry["newName"].as_str().unwrap_or(name).to_owned();
            if let Some(d) = entry["digest"].as_str() {
                new = format!("{new}@{d}");
            } else if let Some(t) = entry["newTag"].as_str() {
                new = format!("{new}:{t}");
            } else if let Some(d) = digest {
                new = format!("{new}@{d}");
            } else if let Some(t) = tag {
                new = format!("{new}:{t}");
            }
            c["image"] = Value::String(new);
        }
    }
}

/// The tokens of a JSON pointer (`~1` is `/`, `~0` is `~`).
fn pointer_tokens(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| format!("{path}: a JSON pointer starts with /"))?;
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

/// Applies an RFC 6902 JSON patch (`add`, `remove`, `replace`, `test`) to `doc`; an error names
/// the operation that failed (a `test` that does not hold, a path that does not exist).
pub fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), String> {
    for (i, op) in ops
        .as_array()
        .ok_or("a JSON patch is a list")?
        .iter()
        .enumerate()
    {
        let path = op["path"].as_str().ok_or(format!("op {i}: no path"))?;
        let kind = op["op"].as_str().unwrap_or_default();
        let err = |m: &str| format!("op {i} ({kind} {path}): {m}");
        match kind {
            "test" => {
                let v = doc.pointer(path).ok_or_else(|| err("no such path"))?;
                if *v != op["value"] {
                    return Err(err(&format!("the value is {v}, not {}", op["value"])));
                }
            }
            "replace" => {
                *doc.pointer_mut(path).ok_or_else(|| err("no such path"))? = op["value"].clone();
            }
            "add" | "remove" => {
                let mut tokens = pointer_tokens(path).map_err(|e| err(&e))?;
                let last = tokens
                    .pop()
                    .ok_or_else(|| err("cannot add or remove the root"))?;
                let parent_path: String = tokens
                    .iter()
                    .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
                    .collect();
                let parent = doc
                    .pointer_mut(&parent_path)
                    .ok_or_else(|| err("the parent does not exist"))?;
                match (parent, kind) {
                    (Value::Array(a), "add") => {
                        let at = if last == "-" {
                            a.len()
                        } else {
                            last.parse().map_err(|_| err("not an index"))?
                        };
                        if at > a.len() {
                            return Err(err("index out of bounds"));
                        }
                        a.insert(at, op["value"].clone());
                    }
                    (Value::Array(a), _) => {
                        let at: usize = last.parse().map_err(|_| err("not an index"))?;
                        if at >= a.len() {
                            return Err(err("index out of bounds"));
                        }
                        a.remove(at);
                    }
                    (Value::Object(o), "add") => {
                        o.insert(last, op["value"].clone());
                    }
                    (Value::Object(o), _) => {
                        o.remove(&last).ok_or_else(|| err("no such member"))?;
                    }
                    _ => return Err(err("the parent is not a list or an object")),
                }
            }
            other => return Err(err(&format!("operation {other:?} is not supported"))),
        }
    }
    Ok(())
}

/// The arguments of `workload`'s container without the flags the downward API sets.
fn argv_without_downward_api(r: &Rendered, workload: &str, cmd: &clap::Command) -> Vec<String> {
    let mut argv = r.container_argv(workload, cmd);
    argv.retain(|a| !a.ends_with(&format!("={DOWNWARD_API}")));
    argv
}

/// The state server's arguments as `deploy/state-server.yaml` runs it, parsed and validated by
/// `clb-state-server`'s own parser (flags from the downward API left out).
pub fn state_server_args() -> Args {
    let r = Rendered::load(&[]);
    let workload = r.workload_of_file("state-server.yaml");
    let argv = argv_without_downward_api(&r, &workload, &Args::command());
    let args = Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    args.validate().expect("valid flags");
    args
}

/// The watcher's arguments as `deploy/watcher.yaml` (cluster mode) or `deploy/node-agent.yaml`
/// runs it, parsed by `clb-watcher`'s own parser; flags from the downward API are left out and
/// `overrides` (`--flag=value`, e.g. the server's URL or the node) replace the manifest's value
/// of the same flag.
pub fn watcher_args(file: &str, overrides: &[String]) -> clb_watcher::cli::Args {
    let r = Rendered::load(&[]);
    let workload = r.workload_of_file(file);
    let mut argv = argv_without_downward_api(&r, &workload, &clb_watcher::cli::Args::command());
    for o in overrides {
        let flag = o.split_once('=').map_or(o.as_str(), |(f, _)| f);
        argv.retain(|a| a != flag && !a.starts_with(&format!("{flag}=")));
        argv.push(o.clone());
    }
    clb_watcher::cli::Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_patches_add_remove_replace_and_test() {
        let mut doc = json!({"a": {"list": [1, 2]}, "b": "x"});
        let ops = json!([
            {"op": "test", "path": "/b", "value": "x"},
            {"op": "add", "path": "/a/list/-", "value": 3},
            {"op": "add", "path": "/a/list/0", "value": 0},
            {"op": "add", "path": "/a/new", "value": {"k": 1}},
            {"op": "replace", "path": "/b", "value": "y"},
            {"op": "remove", "path": "/a/list/1"},
        ]);
        json_patch(&mut doc, &ops).expect("applies");
        assert_eq!(
            doc,
            json!({"a": {"list": [0, 2, 3], "new": {"k": 1}}, "b": "y"})
        );
        let failing = json!([{"op": "test", "path": "/b", "value": "x"}]);
        let e = json_patch(&mut doc, &failing).expect_err("the test fails");
        assert!(e.contains("op 0 (test /b)"), "{e}");
        let missing = json!([{"op": "replace", "path": "/nope", "value": 1}]);
        assert!(json_patch(&mut doc, &missing).is_err());
        let missing_parent = json!([{"op": "add", "path": "/x/y", "value": 1}]);
        assert!(json_patch(&mut doc, &missing_parent).is_err());
    }

    #[test]
    fn images_are_split_and_rewritten_as_kustomize_does() {
        assert_eq!(split_image("clb:0.1.0"), ("clb", Some("0.1.0"), None));
        assert_eq!(
            split_image("host:5000/a/clb@sha256:ab"),
            ("host:5000/a/clb", None, Some("sha256:ab"))
        );
        let mut doc = json!({"spec": {"template": {"spec": {"containers": [
            {"image": "clb:0.1.0"}, {"image": "other:1"}
        ]}}}});
        let entry: yaml_serde::Value =
            yaml_serde::from_str("{name: clb, newName: r.io/clb, newTag: '2.0'}").unwrap();
        set_image(&mut doc, &entry);
        assert_eq!(
            doc["spec"]["template"]["spec"]["containers"],
            json!([{"image": "r.io/clb:2.0"}, {"image": "other:1"}])
        );
    }

    #[test]
    fn the_base_and_every_component_render() {
        let base = Rendered::load(&[]);
        assert_eq!(base.workloads().len(), 4);
        // monitoring: a PodMonitor; poolservice: the CRD, a ClusterRole and its binding;
        // watcher-pods: a ClusterRole and its binding, and five objects of the node agents gone.
        for (c, added, deleted) in [
            ("monitoring", 1, 0),
            ("poolservice", 3, 0),
            ("watcher-pods", 2, 5),
        ] {
            let r = Rendered::load(&[c]);
            assert_eq!(
                r.documents.len(),
                base.documents.len() + added - deleted,
                "{c}"
            );
            assert_eq!(r.components, [c]);
        }
        // The images are the kustomization's.
        assert!(
            base.container("clb-watcher")
                .image
                .as_deref()
                .is_some_and(|i| i.starts_with("myregistry.azurecr.io/clb:"))
        );
        // watcher-pods removes the node agents; poolservice's patch of them then selects nothing.
        let r = Rendered::load(&["watcher-pods", "poolservice"]);
        assert!(r.daemon_sets.is_empty());
        let argv = r.container_argv("clb-watcher", &clb_watcher::cli::Args::command());
        assert!(argv.contains(&"--pods=true".to_owned()), "{argv:?}");
        assert!(
            argv.contains(&"--pool-services=true".to_owned()),
            "{argv:?}"
        );
    }
}
