//! A scripted fake of the Kubernetes API server over loopback, for the watcher and node agent tests:
//! list and watch (`resourceVersion`, `410 Gone` after a compaction, label and field selectors),
//! deletion with finalizers (`deletionTimestamp`), merge and JSON patches with `resourceVersion`
//! preconditions (`409 Conflict`, scriptable with [`FakeApi::conflict_next`]), the `status`
//! subresource, `coordination.k8s.io/v1` Leases (get, create, and update with the
//! `resourceVersion` precondition: `409 Conflict`; for leader election), `events.k8s.io/v1`
//! Events (create and merge patch, namespaced, validated as the API server does: [`FakeApi::events`]),
//! OpenYurt's PoolService CRD (`network.openyurt.io/v1alpha1`: list, watch, create, delete, merge
//! patch of the object and of its `status` subresource; every write pruned against deploy/'s CRD
//! schema as the API server does: `fake_kube/prune.rs`, [`FakeApi::pruned`]),
//! `metadata.generation` (set on create, bumped when the spec changes), status conditions validated
//! as the API server does (`422 Invalid`), a Service's `status.loadBalancer.ingress` defaulted and
//! validated as the API server does (`ipMode`; or dropped: [`FakeApi::ip_mode_gate_off`]), clients that can be cut off from the API
//! ([`FakeApi::partitionable_client`]), and a log of every request (to check RBAC against deploy/).
//! TokenReviews, SubjectAccessReviews answered by evaluating RBAC objects (deploy/'s, and bindings
//! a test creates as an operator would), and optionally RBAC enforced on the fake's own requests:
//! `fake_kube/auth.rs`.
//! Pods (status subresource, strategic merge patch, graceful deletion), `apps/v1` Deployments, and
//! Secrets and ConfigMaps (create, get, list, watch, update with `resourceVersion`):
//! `fake_kube/workloads.rs`; simulated kubelet, EndpointSlice and Deployment controllers
//! ([`FakeApi::start_controllers`]): `fake_kube/controllers.rs`.
//! Binds 127.0.0.1:0.
//!
//! Kept in one place: every test that needs a Kubernetes API uses this one.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

mod auth;
pub mod controllers;
mod families;
pub mod prune;
mod workloads;
mod writes;

pub use auth::{API_AUDIENCE, TokenUser, forbidden_message, request_attributes, with_token};
pub use controllers::{ControllersConfig, ControllersHandle, KubeletConfig};
pub use workloads::{MERGE_PATCH, STRATEGIC_MERGE_PATCH, strategic_merge};

#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    old: Option<Value>,
    new: Option<Value>,
}

#[derive(Debug, Clone)]
enum Msg {
    Change(Change),
    /// The watch expired: 410 Gone.
    Gone,
}

struct Res {
    kind: &'static str,
    api_version: &'static str,
    objects: BTreeMap<(String, String), Value>,
    log: Vec<Change>,
    /// Watches from a resourceVersion below this get 410 Gone.
    compacted: u64,
    /// Changes are applied but not sent to watches (a disconnected watch).
    paused: bool,
    tx: broadcast::Sender<Msg>,
}

/// One PATCH the API received.
#[derive(Debug, Clone)]
pub struct PatchRecord {
    /// The request path.
    pub path: String,
    /// Its `Content-Type` (which patch flavour).
    pub content_type: String,
    /// The patch document.
    pub body: Value,
    /// What the probe said at the time of the PATCH (e.g. NRP's load balancers).
    pub probe: Value,
    /// The HTTP status answered.
    pub status: u16,
}

type Probe = Arc<dyn Fn() -> Value + Send + Sync>;

struct Inner {
    rv: u64,
    resources: HashMap<&'static str, Res>,
    patches: Vec<PatchRecord>,
    /// `METHOD path?query` of every request.
    requests: Vec<String>,
    probe: Option<Probe>,
    /// Services whose next PATCH with a resourceVersion meets a concurrent writer: the fake adds
    /// the finalizer given here to the object first (a MODIFIED event), so the PATCH gets 409.
    conflicts: HashMap<String, String>,
    /// Leases by (namespace, name).
    leases: BTreeMap<(String, String), Value>,
    /// `events.k8s.io/v1` Events by (namespace, name).
    events: BTreeMap<(String, String), Value>,
    /// TokenReview, SubjectAccessReview (from RBAC objects) and the enforcement of RBAC on
    /// requests (`fake_kube/auth.rs`).
    reviews: auth::Reviews,
    /// Graceful pod deletion (`fake_kube/workloads.rs`).
    workloads: workloads::Workloads,
    /// Whether the `LoadBalancerIPMode` feature gate is off ([`FakeApi::ip_mode_gate_off`]).
    ip_mode_gate_off: bool,
    /// The cluster's primary IP family (`fake_kube/families.rs`): `IPv4` unless
    /// [`FakeApi::set_primary_family`].
    primary_family: &'static str,
    /// Every field pruned from a PoolService (`fake_kube/prune.rs`): (namespace/name, path).
    pruned: Vec<(String, String)>,
    /// How long every write (any method but GET) takes before it is served
    /// ([`FakeApi::set_write_latency`]): a real API server's 10–20 ms (etcd's commit).
    write_latency: Duration,
    /// How long a list (a GET of a collection that is not a watch) of a resource takes before it
    /// is served ([`FakeApi::set_list_latency`]).
    list_latency: HashMap<String, Duration>,
    /// Writes being served now, and the most at once since the start.
    writes_in_flight: usize,
    max_writes_in_flight: usize,
    pod_writes_in_flight: usize,
    max_pod_writes_in_flight: usize,
}

/// A running fake API server (cheap to clone; every clone is the same server).
#[derive(Clone)]
pub struct FakeApi {
    inner: Arc<Mutex<Inner>>,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

const RESOURCES: [(&str, &str, &str); 8] = [
    ("services", "Service", "v1"),
    // The state server's TLS Secret and CA bundle (--tls-self-managed): get, list and watch (by
    // name), create, and update with the resourceVersion precondition (`409 Conflict`).
    ("secrets", "Secret", "v1"),
    ("configmaps", "ConfigMap", "v1"),
    ("endpointslices", "EndpointSlice", "discovery.k8s.io/v1"),
    ("pods", "Pod", "v1"),
    ("nodes", "Node", "v1"),
    ("deployments", "Deployment", "apps/v1"),
    // OpenYurt's CRD: list, watch, create, delete, merge patch (and of `status`).
    (
        "poolservices",
        "PoolService",
        "network.openyurt.io/v1alpha1",
    ),
];

/// The API group and version of the PoolService CRD.
const POOL_GROUP: &str = "network.openyurt.io";

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code
    })
}

fn json_response(code: u16, body: &Value) -> Response {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let h = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(h, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(uri: &Uri) -> HashMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn pointer_str<'a>(obj: &'a Value, path: &str) -> Option<&'a str> {
    obj.pointer(path).and_then(Value::as_str)
}

/// `key`, `key=value`, `key!=value`, comma-separated.
fn labels_match(obj: &Value, selector: Option<&String>) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    let labels = obj.pointer("/metadata/labels");
    selector.split(',').all(|term| {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        if let Some((k, v)) = term.split_once("!=") {
            get(k) != Some(v)
        } else if let Some((k, v)) = term.split_once('=') {
            get(k.trim_end_matches('=')) == Some(v)
        } else {
            get(term).is_some()
        }
    })
}

fn fields_match(obj: &Value, selector: Option<&String>) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    selector.split(',').all(|term| {
        let (k, v) = term.split_once('=').expect("field selector key=value");
        let path = match k {
            "spec.nodeName" => "/spec/nodeName",
            "metadata.name" => "/metadata/name",
            "metadata.namespace" => "/metadata/namespace",
            other => panic!("field selector {other} not supported by the fake"),
        };
        pointer_str(obj, path).unwrap_or("") == v
    })
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn obj_key(obj: &Value) -> (String, String) {
    (
        pointer_str(obj, "/metadata/namespace")
            .unwrap_or("")
            .to_owned(),
        pointer_str(obj, "/metadata/name").unwrap().to_owned(),
    )
}

/// The finalizers of `obj`.
pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

impl Inner {
    /// Stores `new` (None: deletes `key`), bumps the resourceVersion, logs and broadcasts.
    fn commit(&mut self, plural: &str, key: (String, String), new: Option<Value>) -> Option<Value> {
        self.rv += 1;
        let rv = self.rv;
        let res = self.resources.get_mut(plural).unwrap();
        let old = res.objects.get(&key).cloned();
        let new = new.map(|mut o| {
            // As the API server: generation 1 on create, +1 whenever the spec changes.
            let old_generation = old
                .as_ref()
                .and_then(|o| o.pointer("/metadata/generation"))
                .and_then(Value::as_i64);
            let spec_changed = old.as_ref().map(|o| o.get("spec")) != Some(o.get("spec"));
            let generation = match old_generation {
                None => 1,
                Some(g) if spec_changed => g + 1,
                Some(g) => g,
            };
            o["metadata"]["generation"] = json!(generation);
            o["metadata"]["resourceVersion"] = json!(rv.to_string());
            if plural == "poolservices" {
                // A custom resource: pruned against its CRD's structural schema (deploy/'s).
                let name = format!("{}/{}", key.0, key.1);
                for path in prune::prune_object(prune::pool_service_schema(), &mut o) {
                    tracing::warn!(poolservice = %name, %path, "the fake API pruned a field the CRD's schema does not specify");
                    self.pruned.push((name.clone(), path));
                }
            }
            o["kind"] = json!(res.kind);
            o["apiVersion"] = json!(res.api_version);
            o
        });
        match &new {
            Some(o) => {
                res.objects.insert(key, o.clone());
            }
            None => {
                res.objects.remove(&key);
            }
        }
        let change = Change {
            rv,
            old,
            new: new.clone(),
        };
        if !res.paused {
            res.log.push(change.clone());
            let _ = res.tx.send(Msg::Change(change));
        }
        new
    }

    /// DELETE as the API server does it (`grace`: the request's `gracePeriodSeconds`): a pod
    /// gracefully (`fake_kube/workloads.rs`), else with finalizers only `deletionTimestamp` is set;
    /// the object as answered, `None` if it does not exist.
    fn delete(&mut self, plural: &str, key: (String, String), grace: Option<i64>) -> Option<Value> {
        if let Some(pod) = workloads::graceful_delete(self, plural, &key, grace) {
            return Some(pod);
        }
        let obj = self.resources[plural].objects.get(&key).cloned()?;
        if finalizers(&obj).is_empty() {
            self.commit(plural, key, None);
            Some(obj)
        } else {
            let mut obj = obj;
            obj["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
            self.commit(plural, key, Some(obj))
        }
    }
}

impl FakeApi {
    /// Starts an empty API server on 127.0.0.1:0.
    pub async fn start() -> Self {
        let resources = RESOURCES
            .iter()
            .map(|(plural, kind, api_version)| {
                (
                    *plural,
                    Res {
                        kind,
                        api_version,
                        objects: BTreeMap::new(),
                        log: Vec::new(),
                        compacted: 0,
                        paused: false,
                        tx: broadcast::channel(1024).0,
                    },
                )
            })
            .collect();
        let inner = Arc::new(Mutex::new(Inner {
            rv: 1,
            resources,
            patches: Vec::new(),
            conflicts: HashMap::new(),
            requests: Vec::new(),
            probe: None,
            leases: BTreeMap::new(),
            events: BTreeMap::new(),
            reviews: auth::Reviews::default(),
            workloads: workloads::Workloads::default(),
            ip_mode_gate_off: false,
            primary_family: "IPv4",
            pruned: Vec::new(),
            write_latency: Duration::ZERO,
            list_latency: HashMap::new(),
            writes_in_flight: 0,
            max_writes_in_flight: 0,
            pod_writes_in_flight: 0,
            max_pod_writes_in_flight: 0,
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = Router::new().fallback(handle).with_state(inner.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { inner, url }
    }

    /// A kube client of this server (plain HTTP, no credentials).
    pub fn kube_client(&self) -> kube::Client {
        kube::Client::try_from(self.kube_config()).unwrap()
    }

    /// The configuration of a client of this server (plain HTTP, no credentials).
    pub fn kube_config(&self) -> kube::Config {
        kube::Config::new(self.url.parse().unwrap())
    }

    /// The clients a watcher makes of [`FakeApi::kube_config`], as the binary does.
    pub fn watcher_clients(&self) -> clb_watcher::KubeClients {
        clb_watcher::KubeClients::from_config(self.kube_config()).unwrap()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap()
    }

    /// Creates or replaces an object (ADDED / MODIFIED). A Service gets its IP families as the API
    /// server gives them (`fake_kube/families.rs`); one the API server would refuse panics.
    pub fn put(&self, plural: &str, obj: Value) {
        self.try_put(plural, obj)
            .unwrap_or_else(|e| panic!("the API server refuses the object: {e}"));
    }

    /// [`FakeApi::put`], answering what the API server would refuse (422) instead of storing it.
    pub fn try_put(&self, plural: &str, mut obj: Value) -> Result<(), String> {
        let key = obj_key(&obj);
        let mut inner = self.lock();
        if plural == "services" {
            let old = inner.resources[plural].objects.get(&key).cloned();
            families::admit_service(old.as_ref(), &mut obj, inner.primary_family)?;
        }
        inner.commit(plural, key, Some(obj));
        Ok(())
    }

    /// The cluster's primary IP family (`IPv4`, the default, or `IPv6`): what a Service created
    /// without `spec.ipFamilies` gets first.
    pub fn set_primary_family(&self, family: &'static str) {
        self.lock().primary_family = family;
    }

    /// Deletes like the API server: with finalizers, only sets `deletionTimestamp`; a pod bound
    /// to a node gracefully while [`FakeApi::graceful_pod_deletion`].
    pub fn delete(&self, plural: &str, namespace: &str, name: &str) {
        let key = (namespace.to_owned(), name.to_owned());
        self.lock()
            .delete(plural, key, None)
            .expect("the object to delete exists");
    }

    /// Removes an object whatever its finalizers (e.g. someone removed them while we were away).
    pub fn vanish(&self, plural: &str, namespace: &str, name: &str) {
        self.lock()
            .commit(plural, (namespace.to_owned(), name.to_owned()), None);
    }

    /// Every object of `plural`, by (namespace, name).
    pub fn objects(&self, plural: &str) -> Vec<Value> {
        self.lock().resources[plural]
            .objects
            .values()
            .cloned()
            .collect()
    }

    /// The object `namespace/name` of `plural`, if it exists.
    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        self.lock().resources[plural]
            .objects
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Watches of `plural` stop receiving changes (the watch is "disconnected").
    pub fn pause(&self, plural: &str) {
        self.lock().resources.get_mut(plural).unwrap().paused = true;
    }

    /// The history of `plural` is compacted: open watches get 410 Gone, and so does any watch from
    /// an older resourceVersion; the watcher must list again.
    pub fn expire(&self, plural: &str) {
        let mut inner = self.lock();
        let rv = inner.rv;
        let res = inner.resources.get_mut(plural).unwrap();
        res.paused = false;
        res.compacted = rv;
        res.log.clear();
        let _ = res.tx.send(Msg::Gone);
    }

    /// What each PATCH records as [`PatchRecord::probe`] (e.g. NRP's load balancers at the time).
    pub fn set_probe(&self, probe: impl Fn() -> Value + Send + Sync + 'static) {
        self.lock().probe = Some(Arc::new(probe));
    }

    /// The next PATCH with a resourceVersion of service `name` (of the object, not of its status)
    /// races with a writer adding `finalizer`.
    pub fn conflict_next(&self, name: &str, finalizer: &str) {
        self.lock()
            .conflicts
            .insert(name.to_owned(), finalizer.to_owned());
    }

    /// Every field pruned from a PoolService on a write, as (namespace/name, path): what
    /// deploy/'s CRD schema does not specify (`fake_kube/prune.rs`).
    pub fn pruned(&self) -> Vec<(String, String)> {
        self.lock().pruned.clone()
    }

    /// The API server runs with the `LoadBalancerIPMode` feature gate off (Kubernetes 1.29 and
    /// before, or switched off): a status write drops `status.loadBalancer.ingress[].ipMode` of a
    /// Service instead of keeping, defaulting and validating it.
    pub fn ip_mode_gate_off(&self) {
        self.lock().ip_mode_gate_off = true;
    }

    /// Every later write (any method but GET) takes `latency` before it is served, as on a real
    /// API server where a write waits for etcd's commit; concurrent writes wait side by side.
    pub fn set_write_latency(&self, latency: Duration) {
        self.lock().write_latency = latency;
    }

    /// Every later list of `plural` (`endpointslices`, …; not a watch) takes `latency` before it
    /// is read and served: a large cluster's list, seconds long.
    pub fn set_list_latency(&self, plural: &str, latency: Duration) {
        self.lock().list_latency.insert(plural.to_owned(), latency);
    }

    /// The most writes the API served at once since it started.
    pub fn max_writes_in_flight(&self) -> usize {
        self.lock().max_writes_in_flight
    }

    /// The most writes of pods (their status: the readiness gate's conditions) the API served at
    /// once since it started. The simulated controllers change pods without a request.
    pub fn max_pod_writes_in_flight(&self) -> usize {
        self.lock().max_pod_writes_in_flight
    }

    /// Every PATCH received, in order.
    pub fn patches(&self) -> Vec<PatchRecord> {
        self.lock().patches.clone()
    }

    /// `METHOD path?query` of every request received, in order.
    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    /// Every `events.k8s.io/v1` Event stored, by namespace and name.
    pub fn events(&self) -> Vec<Value> {
        self.lock().events.values().cloned().collect()
    }

    /// The Lease `namespace/name`, if it exists.
    pub fn lease(&self, namespace: &str, name: &str) -> Option<Value> {
        self.lock()
            .leases
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// The holder of the Lease `namespace/name` (empty when free or missing).
    pub fn lease_holder(&self, namespace: &str, name: &str) -> String {
        self.lease(namespace, name)
            .and_then(|l| {
                l.pointer("/spec/holderIdentity")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .unwrap_or_default()
    }

    /// A kube client of this server through a link of its own that [`Partition::cut`] can cut:
    /// while cut, its requests get no answer (they hang until the link heals, and are then refused
    /// with 503 without being carried out), as across a network partition. While
    /// [`Partition::down`], every request is refused at once with 503, as by an API server that is
    /// restarting.
    pub async fn partitionable_client(&self) -> (kube::Client, Partition) {
        let (config, link) = self.partitionable_config().await;
        (kube::Client::try_from(config).unwrap(), link)
    }

    /// The configuration of a [`FakeApi::partitionable_client`] (e.g. for
    /// `clb_watcher::KubeClients::from_config`).
    pub async fn partitionable_config(&self) -> (kube::Config, Partition) {
        let partition = Partition {
            cut: Arc::new(AtomicBool::new(false)),
            down: Arc::new(AtomicBool::new(false)),
        };
        let link = partition.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = Router::new()
            .fallback(handle)
            .with_state(self.inner.clone())
            .layer(axum::middleware::from_fn(
                move |req: axum::extract::Request, next: axum::middleware::Next| {
                    let link = link.clone();
                    async move {
                        let refused =
                            || json_response(503, &status_body(503, "ServiceUnavailable", "down"));
                        if link.down.load(Ordering::SeqCst) {
                            return refused();
                        }
                        if link.cut.load(Ordering::SeqCst) {
                            while link.cut.load(Ordering::SeqCst) {
                                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                            }
                            return refused();
                        }
                        next.run(req).await
                    }
                },
            ));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (kube::Config::new(url.parse().unwrap()), partition)
    }
}

/// The link of a [`FakeApi::partitionable_client`].
#[derive(Debug, Clone)]
pub struct Partition {
    cut: Arc<AtomicBool>,
    down: Arc<AtomicBool>,
}

impl Partition {
    /// Cuts the client off the API.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    /// Heals the link.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// The API refuses every request of this client at once (503), as while it restarts.
    pub fn down(&self) {
        self.down.store(true, Ordering::SeqCst);
    }

    /// The API serves this client again.
    pub fn up(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
}

fn watch_line(kind: &str, object: &Value) -> Bytes {
    Bytes::from(format!("{}\n", json!({"type": kind, "object": object})))
}

/// The event a watch with these selectors sees for a change, if any.
fn event_for(c: &Change, q: &HashMap<String, String>) -> Option<Bytes> {
    let sel = |o: &Option<Value>| {
        o.as_ref().is_some_and(|o| {
            labels_match(o, q.get("labelSelector")) && fields_match(o, q.get("fieldSelector"))
        })
    };
    match (sel(&c.old), sel(&c.new)) {
        (false, true) => Some(watch_line("ADDED", c.new.as_ref().unwrap())),
        (true, true) => Some(watch_line("MODIFIED", c.new.as_ref().unwrap())),
        (true, false) => {
            let mut o = c.new.clone().or_else(|| c.old.clone()).unwrap();
            o["metadata"]["resourceVersion"] = json!(c.rv.to_string());
            Some(watch_line("DELETED", &o))
        }
        (false, false) => None,
    }
}

fn gone_line() -> Bytes {
    watch_line(
        "ERROR",
        &status_body(410, "Expired", "too old resource version"),
    )
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let q = query(&uri);
    inner.lock().unwrap().requests.push(format!(
        "{method} {path}?{}",
        percent_decode(uri.query().unwrap_or(""))
    ));
    if let Some(denied) = auth::gate(&inner, &method, &path, &q, &headers) {
        return denied;
    }
    let in_flight = (method != Method::GET).then(|| writes::WriteInFlight::enter(&inner, &path));
    if let Some(w) = &in_flight
        && !w.latency.is_zero()
    {
        tokio::time::sleep(w.latency).await;
    }
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    if let Some(answer) = auth::review(&inner, &method, &segs, &body) {
        return answer;
    }
    if let Some(answer) = workloads::route(&inner, (&method, &path, &segs), &q, &headers, &body) {
        return answer;
    }
    match (method.clone(), segs.as_slice()) {
        (Method::GET, ["api", "v1", plural])
        | (Method::GET, ["apis", "discovery.k8s.io", "v1", plural])
        | (Method::GET, ["apis", POOL_GROUP, "v1alpha1", plural]) => {
            let plural = (*plural).to_owned();
            if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
                watch(inner, &plural, q)
            } else {
                let latency = inner.lock().unwrap().list_latency.get(&plural).copied();
                if let Some(latency) = latency {
                    tokio::time::sleep(latency).await;
                }
                list(&inner, &plural, &q)
            }
        }
        (
            Method::GET,
            [
                "apis",
                "coordination.k8s.io",
                "v1",
                "namespaces",
                ns,
                "leases",
                name,
            ],
        ) => {
            let inner = inner.lock().unwrap();
            match inner.leases.get(&((*ns).to_owned(), (*name).to_owned())) {
                Some(l) => json_response(200, l),
                None => json_response(
                    404,
                    &status_body(404, "NotFound", &format!("leases {name:?} not found")),
                ),
            }
        }
        (
            Method::POST,
            [
                "apis",
                "coordination.k8s.io",
                "v1",
                "namespaces",
                ns,
                "leases",
            ],
        ) => lease_write(&inner, ns, None, &body),
        (
            Method::PUT,
            [
                "apis",
                "coordination.k8s.io",
                "v1",
                "namespaces",
                ns,
                "leases",
                name,
            ],
        ) => lease_write(&inner, ns, Some(name), &body),
        (Method::POST, ["apis", "events.k8s.io", "v1", "namespaces", ns, "events"]) => {
            event_create(&inner, ns, &body)
        }
        (
            Method::PATCH,
            [
                "apis",
                "events.k8s.io",
                "v1",
                "namespaces",
                ns,
                "events",
                name,
            ],
        ) => {
            let ct = headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            event_patch(&inner, ns, name, ct, &body)
        }
        (
            Method::POST,
            [
                "apis",
                POOL_GROUP,
                "v1alpha1",
                "namespaces",
                ns,
                "poolservices",
            ],
        ) => create(&inner, "poolservices", ns, &body),
        (
            Method::DELETE,
            [
                "apis",
                POOL_GROUP,
                "v1alpha1",
                "namespaces",
                ns,
                "poolservices",
                name,
            ],
        ) => delete(&inner, "poolservices", ns, name),
        (
            Method::PATCH,
            [
                "apis",
                POOL_GROUP,
                "v1alpha1",
                "namespaces",
                ns,
                "poolservices",
                name,
                rest @ ..,
            ],
        ) => patch_object(
            &inner,
            "poolservices",
            &path,
            &headers,
            (ns, name),
            rest,
            &body,
        ),
        (Method::PATCH, ["api", "v1", "namespaces", ns, "services", name, rest @ ..]) => {
            patch_object(&inner, "services", &path, &headers, (ns, name), rest, &body)
        }
        _ => json_response(
            404,
            &status_body(
                404,
                "NotFound",
                &format!("the fake does not serve {method} {path}"),
            ),
        ),
    }
}

/// Creates (`name` None: POST, 409 if it exists) or replaces (PUT: 404 if missing, 409 if the body's
/// `resourceVersion` is not the current one) a Lease.
fn lease_write(inner: &Arc<Mutex<Inner>>, ns: &str, name: Option<&str>, body: &Bytes) -> Response {
    let mut inner = inner.lock().unwrap();
    let Ok(mut lease) = serde_json::from_slice::<Value>(body) else {
        return json_response(400, &status_body(400, "BadRequest", "not JSON"));
    };
    let Some(lease_name) = name
        .map(str::to_owned)
        .or_else(|| pointer_str(&lease, "/metadata/name").map(str::to_owned))
    else {
        return json_response(400, &status_body(400, "BadRequest", "no name"));
    };
    let key = (ns.to_owned(), lease_name.clone());
    let current = inner.leases.get(&key).cloned();
    match (name, &current) {
        (None, Some(_)) => {
            return json_response(
                409,
                &status_body(
                    409,
                    "AlreadyExists",
                    &format!("leases {lease_name:?} already exists"),
                ),
            );
        }
        (Some(_), None) => {
            return json_response(
                404,
                &status_body(404, "NotFound", &format!("leases {lease_name:?} not found")),
            );
        }
        (Some(_), Some(cur)) => {
            let want = pointer_str(&lease, "/metadata/resourceVersion");
            if want.is_some() && want != pointer_str(cur, "/metadata/resourceVersion") {
                return json_response(
                    409,
                    &status_body(
                        409,
                        "Conflict",
                        "Operation cannot be fulfilled on leases: the object has been modified",
                    ),
                );
            }
        }
        (None, None) => {}
    }
    inner.rv += 1;
    let rv = inner.rv;
    lease["apiVersion"] = json!("coordination.k8s.io/v1");
    lease["kind"] = json!("Lease");
    lease["metadata"]["name"] = json!(lease_name);
    lease["metadata"]["namespace"] = json!(ns);
    lease["metadata"]["resourceVersion"] = json!(rv.to_string());
    inner.leases.insert(key, lease.clone());
    json_response(if name.is_none() { 201 } else { 200 }, &lease)
}

fn list(inner: &Arc<Mutex<Inner>>, plural: &str, q: &HashMap<String, String>) -> Response {
    let inner = inner.lock().unwrap();
    let Some(res) = inner.resources.get(plural) else {
        return json_response(404, &status_body(404, "NotFound", plural));
    };
    let items: Vec<Value> = res
        .objects
        .values()
        .filter(|o| {
            labels_match(o, q.get("labelSelector")) && fields_match(o, q.get("fieldSelector"))
        })
        .cloned()
        .collect();
    json_response(
        200,
        &json!({
            "kind": format!("{}List", res.kind),
            "apiVersion": res.api_version,
            "metadata": {"resourceVersion": inner.rv.to_string()},
            "items": items,
        }),
    )
}

fn watch(inner: Arc<Mutex<Inner>>, plural: &str, q: HashMap<String, String>) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let (backlog, mut live, expired, rv, kind, api_version) = {
        let inner = inner.lock().unwrap();
        let res = &inner.resources[plural];
        (
            res.log
                .iter()
                .filter(|c| c.rv > from)
                .cloned()
                .collect::<Vec<_>>(),
            res.tx.subscribe(),
            from < res.compacted,
            inner.rv,
            res.kind,
            res.api_version,
        )
    };
    tokio::spawn(async move {
        if expired {
            let _ = tx.send(Ok(gone_line())).await;
            return;
        }
        let mut last = from;
        for c in backlog {
            last = c.rv;
            if let Some(line) = event_for(&c, &q)
                && tx.send(Ok(line)).await.is_err()
            {
                return;
            }
        }
        let bookmark = json!({"kind": kind, "apiVersion": api_version,
                              "metadata": {"resourceVersion": rv.max(last).to_string()}});
        if tx
            .send(Ok(watch_line("BOOKMARK", &bookmark)))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let msg = tokio::select! {
                m = live.recv() => m,
                () = tx.closed() => return,
            };
            match msg {
                Ok(Msg::Change(c)) if c.rv > last => {
                    last = c.rv;
                    if let Some(line) = event_for(&c, &q)
                        && tx.send(Ok(line)).await.is_err()
                    {
                        return;
                    }
                }
                Ok(Msg::Change(_)) => {}
                Ok(Msg::Gone) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    let _ = tx.send(Ok(gone_line())).await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Body::from_stream(ReceiverStream::new(rx)))
        .unwrap()
}

/// POST of a namespaced object: `uid` and `creationTimestamp` set, `status` dropped (a
/// subresource), 409 AlreadyExists if the name is taken, 400 if the body's namespace differs.
fn create(inner: &Arc<Mutex<Inner>>, plural: &str, ns: &str, body: &Bytes) -> Response {
    let mut inner = inner.lock().unwrap();
    let Ok(mut obj) = serde_json::from_slice::<Value>(body) else {
        return json_response(400, &status_body(400, "BadRequest", "the body is not JSON"));
    };
    let Some(name) = pointer_str(&obj, "/metadata/name").map(str::to_owned) else {
        return json_response(
            400,
            &status_body(400, "BadRequest", "metadata.name is missing"),
        );
    };
    if pointer_str(&obj, "/metadata/namespace").is_some_and(|n| n != ns) {
        return json_response(
            400,
            &status_body(400, "BadRequest", "the namespace differs"),
        );
    }
    let key = (ns.to_owned(), name.clone());
    if inner.resources[plural].objects.contains_key(&key) {
        return json_response(
            409,
            &status_body(
                409,
                "AlreadyExists",
                &format!("{plural} {name:?} already exists"),
            ),
        );
    }
    let n = inner.rv + 1;
    obj["metadata"]["namespace"] = json!(ns);
    obj["metadata"]["uid"] = json!(format!("uid-{plural}-{n}"));
    obj["metadata"]["creationTimestamp"] = json!("2025-01-01T00:00:00Z");
    if let Some(o) = obj.as_object_mut() {
        o.remove("status");
    }
    if plural == "pods" {
        // As the API server's pod strategy: a new pod is Pending.
        obj["status"] = json!({"phase": "Pending"});
    }
    let created = inner.commit(plural, key, Some(obj)).unwrap_or(Value::Null);
    json_response(201, &created)
}

/// DELETE of a namespaced object: with finalizers, only `deletionTimestamp` is set.
fn delete(inner: &Arc<Mutex<Inner>>, plural: &str, ns: &str, name: &str) -> Response {
    let key = (ns.to_owned(), name.to_owned());
    match inner.lock().unwrap().delete(plural, key, None) {
        Some(answer) => json_response(200, &answer),
        None => json_response(
            404,
            &status_body(404, "NotFound", &format!("{plural} {name:?} not found")),
        ),
    }
}

/// A PATCH of an object (`rest` empty) or of its status subresource (`rest` = `["status"]`).
fn patch_object(
    inner: &Arc<Mutex<Inner>>,
    plural: &str,
    path: &str,
    headers: &HeaderMap,
    (ns, name): (&str, &str),
    rest: &[&str],
    body: &Bytes,
) -> Response {
    let status_sub = match rest {
        [] => false,
        ["status"] => true,
        _ => return json_response(404, &status_body(404, "NotFound", "no such path")),
    };
    let ct = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    patch(inner, plural, path, ct, ns, name, status_sub, body)
}

#[allow(clippy::too_many_arguments)]
fn patch(
    inner: &Arc<Mutex<Inner>>,
    plural: &str,
    path: &str,
    content_type: &str,
    ns: &str,
    name: &str,
    status_sub: bool,
    body: &Bytes,
) -> Response {
    let mut inner = inner.lock().unwrap();
    let probe = inner.probe.as_ref().map(|p| p()).unwrap_or(Value::Null);
    let patch: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let mut record = PatchRecord {
        path: path.to_owned(),
        content_type: content_type.to_owned(),
        body: patch.clone(),
        probe,
        status: 200,
    };
    let key = (ns.to_owned(), name.to_owned());
    let current = inner.resources[plural].objects.get(&key).cloned();
    let response = match current {
        None => {
            record.status = 404;
            json_response(
                404,
                &status_body(404, "NotFound", &format!("{plural} not found")),
            )
        }
        Some(_) if !workloads::patch_type_allowed(plural, content_type) => {
            record.status = 415;
            json_response(415, &status_body(415, "UnsupportedMediaType", content_type))
        }
        Some(cur)
            if !status_sub
                && plural == "services"
                && pointer_str(&patch, "/metadata/resourceVersion").is_some()
                && inner.conflicts.contains_key(name) =>
        {
            // Someone else wrote first: their finalizer lands, ours meets a stale resourceVersion.
            let theirs = inner.conflicts.remove(name).unwrap();
            let mut obj = cur;
            let mut list = finalizers(&obj);
            list.push(theirs);
            obj["metadata"]["finalizers"] = json!(list);
            inner.commit("services", key, Some(obj));
            record.status = 409;
            json_response(
                409,
                &status_body(409, "Conflict", "the object has been modified"),
            )
        }
        Some(cur) => {
            let want_rv = pointer_str(&patch, "/metadata/resourceVersion");
            let have_rv = pointer_str(&cur, "/metadata/resourceVersion");
            if want_rv.is_some() && want_rv != have_rv {
                record.status = 409;
                json_response(
                    409,
                    &status_body(409, "Conflict", "the object has been modified"),
                )
            } else {
                let mut obj = cur;
                let mut p = patch.clone();
                if let Some(m) = p.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                if status_sub {
                    if let Some(s) = p.get("status") {
                        workloads::apply_patch(content_type, &mut obj["status"], s);
                    }
                    let valid = if plural == "pods" {
                        workloads::validate_pod_status(&obj)
                    } else if plural == "services" {
                        service_ingress(&mut obj, inner.ip_mode_gate_off)
                            .and_then(|()| validate_conditions(&obj))
                    } else {
                        validate_conditions(&obj)
                    };
                    if let Err(m) = valid {
                        record.status = 422;
                        inner.patches.push(record);
                        return json_response(422, &status_body(422, "Invalid", &m));
                    }
                } else {
                    if let Some(o) = p.as_object_mut() {
                        o.remove("status");
                    }
                    workloads::apply_patch(content_type, &mut obj, &p);
                }
                let gone = obj.pointer("/metadata/deletionTimestamp").is_some()
                    && finalizers(&obj).is_empty()
                    && workloads::grace_over(&obj);
                // As the API server: the object as stored (its new resourceVersion, generation).
                let answer = obj.clone();
                let stored = inner.commit(plural, key, (!gone).then_some(obj));
                json_response(200, &stored.unwrap_or(answer))
            }
        }
    };
    inner.patches.push(record);
    response
}

/// `status.loadBalancer.ingress` of a Service as the API server writes it. With the
/// `LoadBalancerIPMode` gate on (the default since Kubernetes 1.30, GA in 1.32): an entry with an
/// `ip` and no `ipMode` gets `ipMode: VIP` (defaulting); `ip` must be an IP address; `ipMode` is
/// `VIP` or `Proxy`, and only beside an `ip`. With the gate off: `ipMode` is dropped.
fn service_ingress(obj: &mut Value, gate_off: bool) -> Result<(), String> {
    let Some(list) = obj
        .pointer_mut("/status/loadBalancer/ingress")
        .and_then(Value::as_array_mut)
    else {
        return Ok(());
    };
    for (i, e) in list.iter_mut().enumerate() {
        let field = |f: &str| format!("status.loadBalancer.ingress[{i}].{f}");
        let Some(e) = e.as_object_mut() else {
            return Err(format!(
                "status.loadBalancer.ingress[{i}]: must be an object"
            ));
        };
        if gate_off {
            e.remove("ipMode");
            continue;
        }
        let ip = e.get("ip").and_then(Value::as_str).unwrap_or("").to_owned();
        if !ip.is_empty() && ip.parse::<std::net::IpAddr>().is_err() {
            return Err(format!(
                "{}: Invalid value: {ip:?}: must be a valid IP address",
                field("ip")
            ));
        }
        match e.get("ipMode").and_then(Value::as_str) {
            None if !ip.is_empty() => {
                e.insert("ipMode".into(), json!("VIP"));
            }
            None => {}
            Some(_) if ip.is_empty() => {
                return Err(format!(
                    "{}: Forbidden: may not be specified when `ip` is not set",
                    field("ipMode")
                ));
            }
            Some("VIP" | "Proxy") => {}
            Some(m) => {
                return Err(format!(
                    "{}: Unsupported value: {m:?}: supported values: \"Proxy\", \"VIP\"",
                    field("ipMode")
                ));
            }
        }
    }
    Ok(())
}

/// `metav1.Condition` validation of `status.conditions`, as the API server does it for a Service:
/// a qualified `type`, unique per list; `status` True, False or Unknown; a CamelCase `reason`
/// (1–1024 characters); a `message` of at most 32768 characters; a `lastTransitionTime`; a
/// non-negative `observedGeneration`.
fn validate_conditions(obj: &Value) -> Result<(), String> {
    let Some(list) = obj.pointer("/status/conditions") else {
        return Ok(());
    };
    let Some(list) = list.as_array() else {
        return Err("status.conditions: must be a list".into());
    };
    let mut types = std::collections::HashSet::new();
    for (i, c) in list.iter().enumerate() {
        let field = |f: &str| format!("status.conditions[{i}].{f}");
        let str_of = |f: &str| c.get(f).and_then(Value::as_str).unwrap_or("");
        let type_ = str_of("type");
        let qualified = !type_.is_empty()
            && type_.len() <= 316
            && type_
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "-_./".contains(ch));
        if !qualified {
            return Err(format!("{}: Invalid value: {type_:?}", field("type")));
        }
        if !types.insert(type_.to_owned()) {
            return Err(format!("{}: Duplicate value: {type_:?}", field("type")));
        }
        if !matches!(str_of("status"), "True" | "False" | "Unknown") {
            return Err(format!("{}: Unsupported value", field("status")));
        }
        let reason = str_of("reason");
        let reason_ok = !reason.is_empty()
            && reason.len() <= 1024
            && reason.starts_with(|ch: char| ch.is_ascii_alphabetic())
            && reason
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "_,:".contains(ch))
            && !reason.ends_with([',', ':']);
        if !reason_ok {
            return Err(format!("{}: Invalid value: {reason:?}", field("reason")));
        }
        if str_of("message").len() > 32768 {
            return Err(format!("{}: Too long", field("message")));
        }
        if str_of("lastTransitionTime").is_empty() {
            return Err(format!("{}: Required value", field("lastTransitionTime")));
        }
        if c.get("observedGeneration")
            .is_some_and(|g| g.as_i64().is_none_or(|g| g < 0))
        {
            return Err(format!("{}: Invalid value", field("observedGeneration")));
        }
    }
    Ok(())
}

/// The validation of an `events.k8s.io/v1` Event (the API server's for new Events): a name, the
/// namespace of the request, `eventTime`, `reportingController`, `reportingInstance`, `action`
/// and `reason` (at most 128 characters), `type` Normal or Warning, `regarding` in the same
/// namespace, a `note` of at most 1 kB.
fn validate_event(ns: &str, e: &Value) -> Result<(), String> {
    let s = |p: &str| pointer_str(e, p).unwrap_or("");
    if s("/metadata/name").is_empty() {
        return Err("metadata.name: Required value".into());
    }
    if !s("/metadata/namespace").is_empty() && s("/metadata/namespace") != ns {
        return Err("metadata.namespace: does not match the namespace of the request".into());
    }
    for (f, max) in [
        ("eventTime", usize::MAX),
        ("reportingController", 253),
        ("reportingInstance", 128),
        ("action", 128),
        ("reason", 128),
    ] {
        let v = s(&format!("/{f}"));
        if v.is_empty() {
            return Err(format!("{f}: Required value"));
        }
        if v.len() > max {
            return Err(format!("{f}: Too long: may not be longer than {max}"));
        }
    }
    if !matches!(s("/type"), "Normal" | "Warning") {
        return Err(format!("type: Unsupported value: {:?}", s("/type")));
    }
    if e.get("regarding").is_none_or(Value::is_null) {
        return Err("regarding: Required value".into());
    }
    let regarding_ns = s("/regarding/namespace");
    if !regarding_ns.is_empty() && regarding_ns != ns {
        return Err("regarding.namespace: does not match the event namespace".into());
    }
    if s("/note").len() > 1024 {
        return Err("note: Too long: must have at most 1024 bytes".into());
    }
    Ok(())
}

/// POST of an Event: validated, 409 AlreadyExists if the name is taken.
fn event_create(inner: &Arc<Mutex<Inner>>, ns: &str, body: &Bytes) -> Response {
    let mut inner = inner.lock().unwrap();
    let Ok(mut event) = serde_json::from_slice::<Value>(body) else {
        return json_response(400, &status_body(400, "BadRequest", "not JSON"));
    };
    if let Err(m) = validate_event(ns, &event) {
        return json_response(
            422,
            &status_body(422, "Invalid", &format!("Event is invalid: {m}")),
        );
    }
    let key = (ns.to_owned(), s_owned(&event, "/metadata/name"));
    if inner.events.contains_key(&key) {
        return json_response(
            409,
            &status_body(
                409,
                "AlreadyExists",
                &format!("events {:?} already exists", key.1),
            ),
        );
    }
    inner.rv += 1;
    event["apiVersion"] = json!("events.k8s.io/v1");
    event["kind"] = json!("Event");
    event["metadata"]["namespace"] = json!(ns);
    event["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
    inner.events.insert(key, event.clone());
    json_response(201, &event)
}

/// Merge PATCH of an Event (a series): 404 if it does not exist; the result is validated.
fn event_patch(
    inner: &Arc<Mutex<Inner>>,
    ns: &str,
    name: &str,
    content_type: &str,
    body: &Bytes,
) -> Response {
    let mut inner = inner.lock().unwrap();
    if content_type != "application/merge-patch+json" {
        return json_response(415, &status_body(415, "UnsupportedMediaType", content_type));
    }
    let Ok(patch) = serde_json::from_slice::<Value>(body) else {
        return json_response(400, &status_body(400, "BadRequest", "not JSON"));
    };
    let key = (ns.to_owned(), name.to_owned());
    let Some(mut event) = inner.events.get(&key).cloned() else {
        return json_response(
            404,
            &status_body(404, "NotFound", &format!("events {name:?} not found")),
        );
    };
    let mut p = patch;
    if let Some(m) = p.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("name");
        m.remove("namespace");
    }
    merge(&mut event, &p);
    if let Err(m) = validate_event(ns, &event) {
        return json_response(
            422,
            &status_body(422, "Invalid", &format!("Event is invalid: {m}")),
        );
    }
    inner.rv += 1;
    event["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
    inner.events.insert(key, event.clone());
    json_response(200, &event)
}

fn s_owned(v: &Value, pointer: &str) -> String {
    pointer_str(v, pointer).unwrap_or("").to_owned()
}
