//! What the answers are computed from: the cluster's Services and Namespaces, each in a
//! kube-runtime reflector store. An AdmissionReview carries the pod but neither the labels of its
//! namespace nor the Services that select it.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource, ResourceExt as _};

/// The Services and the Namespaces, as two reflector stores. Cheap to clone (the stores are
/// shared).
///
/// [`Stores::reflect`] keeps them with watches of the cluster; a caller (a test) may instead
/// create the stores with [`kube::runtime::reflector::store()`] and feed their writers itself
/// ([`kube::runtime::reflector::store::Writer::apply_watcher_event`]), then pass the readers to
/// [`Stores::new`].
#[derive(Clone)]
pub struct Stores {
    services: Store<Service>,
    namespaces: Store<Namespace>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores")
            .field("services", &self.services.len())
            .field("namespaces", &self.namespaces.len())
            .field("ready", &self.is_ready())
            .finish()
    }
}

/// Drops what the webhook does not read from an object before it is stored (managed fields and
/// annotations: often most of an object's size).
fn slim<K: Resource>(obj: &mut K) {
    obj.managed_fields_mut().clear();
    obj.annotations_mut().clear();
}

/// The stream that keeps `writer`'s store: a list, then a watch, re-opened with kube's default
/// backoff when it fails; every failure is logged.
fn keep<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    what: &'static str,
    strip: impl FnMut(&mut K) + Send + 'static,
) -> impl Future<Output = ()> + Send + 'static
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(strip)
        .reflect(writer);
    async move {
        let mut listed = false;
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::InitDone) if !listed => {
                    listed = true;
                    tracing::info!(kind = what, "listed");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(kind = what, error = %e, "watch failed; retrying"),
            }
        }
    }
}

impl Stores {
    /// Stores kept by the caller.
    pub fn new(services: Store<Service>, namespaces: Store<Namespace>) -> Self {
        Self {
            services,
            namespaces,
        }
    }

    /// Stores kept by watches of every Service and every Namespace of the cluster through
    /// `client` (`list` and `watch` on `services` and `namespaces`: [`reflect_services`] and
    /// [`reflect_namespaces`]), and the future that runs those watches (spawn it; it never ends).
    pub fn reflect(client: kube::Client) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (services, svc) = reflect_services(client.clone());
        let (namespaces, ns) = reflect_namespaces(client);
        let run = async move {
            futures::join!(svc, ns);
        };
        (Self::new(services, namespaces), run)
    }

    /// Whether both stores have completed their first list.
    pub fn is_ready(&self) -> bool {
        let ready =
            |r: Option<Result<(), reflector::store::WriterDropped>>| r.is_some_and(|r| r.is_ok());
        ready(self.services.wait_until_ready().now_or_never())
            && ready(self.namespaces.wait_until_ready().now_or_never())
    }

    /// Waits until both stores have completed their first list; an error if a store's writer is
    /// gone before that.
    pub async fn wait_until_ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.services.wait_until_ready().await?;
        self.namespaces.wait_until_ready().await
    }

    /// The labels of namespace `name`; `None` when the namespace is not in the store.
    pub fn namespace_labels(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.namespaces
            .get(&ObjectRef::new(name))
            .map(|n| n.labels().clone())
    }

    /// The Services of namespace `namespace`.
    pub fn services_in(&self, namespace: &str) -> Vec<Arc<Service>> {
        self.services
            .state_filter(|s| s.metadata.namespace.as_deref() == Some(namespace))
    }
}

/// A store of every Service of the cluster, kept by a watch through `client` (`list` and `watch`
/// on `services`; managed fields, annotations and status are not kept), and the future that runs
/// the watch (spawn it; it never ends).
pub fn reflect_services(
    client: kube::Client,
) -> (Store<Service>, impl Future<Output = ()> + Send + 'static) {
    let (store, writer) = reflector::store::<Service>();
    let run = keep(Api::all(client), writer, "Service", |s: &mut Service| {
        slim(s);
        s.status = None;
    });
    (store, run)
}

/// A store of every Namespace of the cluster, kept by a watch through `client` (`list` and
/// `watch` on `namespaces`; only the metadata without managed fields and annotations is kept),
/// and the future that runs the watch (spawn it; it never ends).
pub fn reflect_namespaces(
    client: kube::Client,
) -> (Store<Namespace>, impl Future<Output = ()> + Send + 'static) {
    let (store, writer) = reflector::store::<Namespace>();
    let run = keep(
        Api::all(client),
        writer,
        "Namespace",
        |n: &mut Namespace| {
            slim(n);
            n.spec = None;
            n.status = None;
        },
    );
    (store, run)
}
