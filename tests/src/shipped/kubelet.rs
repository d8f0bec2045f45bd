//! The kubelet's part in volumes of ConfigMaps and Secrets that the system makes while it runs
//! (the state server's CA bundle `clb-ca-bundle`, its Secret `clb-state-server-tls`): read from the
//! container's `volumeMounts` and the pod's `volumes` in deploy/, projected from the fake API into
//! a directory of the pod's own. As the kubelet: the container starts only once every such object
//! exists (the pod waits in `ContainerCreating`), each key is a file, and a changed object is
//! written again, atomically (a new file renamed over the old), so that a reader sees the old or
//! the new content, never a mix. Objects deploy/ ships itself (the gateways file) are not
//! projected: their flags are rewritten to the test's copy ([`super::Shipped`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::core::v1::{Container, PodTemplateSpec};
use serde_json::Value;
use tokio::task::JoinSet;

use crate::PATIENCE;
use crate::deploy::{NAMESPACE, Rendered};
use crate::fake_kube::FakeApi;

/// How often the simulated kubelet looks for changes (the real one: about a minute).
const SYNC: Duration = Duration::from_millis(100);

/// One projected volume: the object, where the container mounts it, where it is here.
#[derive(Debug, Clone)]
pub struct Projected {
    /// `configmaps` or `secrets`.
    pub plural: &'static str,
    /// The object's name.
    pub name: String,
    /// `items` of the volume: (key, path) pairs; empty means every key under its own name.
    pub items: Vec<(String, String)>,
    /// The container's `mountPath`.
    pub mount_path: String,
    /// The directory standing in for it.
    pub dir: PathBuf,
}

/// The volumes of `workload`'s container `c` whose ConfigMap or Secret deploy/ does not ship.
pub fn runtime_volumes(
    rendered: &Rendered,
    workload: &str,
    c: &Container,
    pod_dir: &Path,
) -> Vec<Projected> {
    let template: &PodTemplateSpec = rendered
        .workloads()
        .into_iter()
        .find(|(n, _)| n == workload)
        .map(|(_, t)| t)
        .unwrap_or_else(|| panic!("{workload} is not in deploy/"));
    let volumes = template
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default();
    let mut out = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let Some(v) = volumes.iter().find(|v| v.name == m.name) else {
            panic!("{workload}: volumeMount {} names no volume", m.name);
        };
        let items = |items: Option<&Vec<k8s_openapi::api::core::v1::KeyToPath>>| {
            items
                .map(|i| i.iter().map(|k| (k.key.clone(), k.path.clone())).collect())
                .unwrap_or_default()
        };
        let (plural, name, items) = match (&v.config_map, &v.secret) {
            (Some(cm), _) if rendered.find("ConfigMap", &cm.name).is_none() => {
                ("configmaps", cm.name.clone(), items(cm.items.as_ref()))
            }
            (_, Some(s)) => {
                let name = s.secret_name.clone().unwrap_or_default();
                if rendered.find("Secret", &name).is_some() {
                    continue;
                }
                ("secrets", name, items(s.items.as_ref()))
            }
            _ => continue,
        };
        out.push(Projected {
            plural,
            name,
            items,
            mount_path: m.mount_path.trim_end_matches('/').to_owned(),
            dir: pod_dir.join(&m.name),
        });
    }
    out
}

/// The files of `obj` as the volume shows them.
fn files(p: &Projected, obj: &Value) -> BTreeMap<String, Vec<u8>> {
    let mut all = BTreeMap::new();
    if let Some(data) = obj.get("data").and_then(Value::as_object) {
        for (k, v) in data {
            let text = v.as_str().unwrap_or_default();
            let bytes = if p.plural == "secrets" {
                base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .expect("a Secret's data is base64")
            } else {
                text.as_bytes().to_vec()
            };
            all.insert(k.clone(), bytes);
        }
    }
    if p.items.is_empty() {
        return all;
    }
    p.items
        .iter()
        .filter_map(|(key, path)| Some((path.clone(), all.get(key)?.clone())))
        .collect()
}

fn write_atomically(dir: &Path, files: &BTreeMap<String, Vec<u8>>) {
    std::fs::create_dir_all(dir).expect("volume dir");
    for (name, content) in files {
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, content).expect("volume file");
        std::fs::rename(&tmp, dir.join(name)).expect("volume file rename");
    }
}

/// Waits until every object of `volumes` exists (as the kubelet holds the pod until then), writes
/// their files, and keeps them up to date in `tasks` (ended with it).
pub async fn project(api: &FakeApi, volumes: &[Projected], tasks: &mut JoinSet<()>) {
    for p in volumes {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let obj = loop {
            if let Some(o) = api.get(p.plural, NAMESPACE, &p.name) {
                break o;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} {}/{} never appeared: a pod mounting it would not start",
                p.plural,
                NAMESPACE,
                p.name
            );
            tokio::time::sleep(SYNC).await;
        };
        let mut last = files(p, &obj);
        write_atomically(&p.dir, &last);
        let (api, p) = (api.clone(), p.clone());
        tasks.spawn(async move {
            loop {
                tokio::time::sleep(SYNC).await;
                let Some(obj) = api.get(p.plural, NAMESPACE, &p.name) else {
                    continue;
                };
                let now = files(&p, &obj);
                if now != last {
                    write_atomically(&p.dir, &now);
                    last = now;
                }
            }
        });
    }
}

/// `args` with every path under a projected volume's `mountPath` moved to its directory here.
pub fn rewrite_paths(args: &[String], volumes: &[Projected]) -> Vec<String> {
    args.iter()
        .map(|a| {
            let Some((flag, value)) = a.split_once('=') else {
                return a.clone();
            };
            for p in volumes {
                if let Some(rest) = value.strip_prefix(&format!("{}/", p.mount_path)) {
                    return format!("{flag}={}", p.dir.join(rest).display());
                }
            }
            a.clone()
        })
        .collect()
}
