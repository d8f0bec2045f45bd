//! The kube side: one `kube::runtime::watcher` stream per kind (and the PoolService watch),
//! merged; each object is decoded (a malformed one is logged and skipped, the stream goes on) and
//! fed to every lane's translator ([`Lane::change`]), whose deltas the lane queues for its sender.
//! The write-back hears of every Service event, of the services whose endpoints changed and of
//! port-name conflicts by message; node moves (`moves.rs`) and the PoolService side (`pools.rs`)
//! run inside this task.

use std::collections::BTreeMap;

use clb_proto::v1::Update;
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher::{self, Event};

use crate::config::{Mode, WatcherConfig};
use crate::lane::{Changed, Lane};
use crate::poolservice::PoolService;
use crate::supervise::{self, Ended, Tasks, fault_point};
use crate::translate::{EGRESS_LABEL, Kind, ObjKey, PortConflict, SERVICE_NAME_LABEL, Translator};
use crate::{moves, pools, relist, writeback};

pub(crate) type PoolEvent = Result<Event<DynamicObject>, watcher::Error>;

/// An event of one of the merged watch streams.
pub(crate) enum Item {
    Obj(Kind, Result<Event<DynamicObject>, watcher::Error>),
    Pool(PoolEvent),
    /// The watch of a kind ended (kube's watcher streams do not: the kube side stops).
    Ended(Kind),
    /// The PoolService watch ended (it does not: the PoolService side stops).
    PoolEnded,
}

/// One watch stream per kind, merged, each followed by [`Item::Ended`]. Failed connections are
/// retried with [`relist::connection_backoff`]; an expired watch (410 Gone) relists at once
/// ([`relist::paced`]).
pub(crate) fn streams(
    kube: &kube::Client,
    config: &WatcherConfig,
    kinds: &[Kind],
) -> futures::stream::SelectAll<BoxStream<'static, Item>> {
    let mut all = futures::stream::SelectAll::new();
    for &kind in kinds {
        let (resource, wc) = match kind {
            Kind::Service => (
                ApiResource::erase::<Service>(&()),
                watcher::Config::default(),
            ),
            Kind::EndpointSlice => (
                ApiResource::erase::<EndpointSlice>(&()),
                watcher::Config::default().labels(SERVICE_NAME_LABEL),
            ),
            Kind::Pod => {
                let wc = watcher::Config::default().labels(EGRESS_LABEL);
                let wc = match &config.mode {
                    Mode::NodeAgent { node } => wc.fields(&format!("spec.nodeName={node}")),
                    Mode::Cluster { .. } => wc,
                };
                (ApiResource::erase::<Pod>(&()), wc)
            }
            Kind::Node => {
                let wc = match &config.mode {
                    Mode::NodeAgent { node } => {
                        watcher::Config::default().fields(&format!("metadata.name={node}"))
                    }
                    Mode::Cluster { .. } => watcher::Config::default(),
                };
                (ApiResource::erase::<Node>(&()), wc)
            }
        };
        let api: Api<DynamicObject> = Api::all_with(kube.clone(), &resource);
        let s = relist::paced(
            watcher::watcher(api, wc),
            relist::connection_backoff(config.watch_backoff_max),
        )
        .map(move |e| Item::Obj(kind, e))
        .chain(futures::stream::once(async move { Item::Ended(kind) }))
        .boxed();
        all.push(s);
    }
    all
}

/// A decoded object of a watched kind.
enum Typed {
    Service(Box<Service>),
    Slice(Box<EndpointSlice>),
    Pod(Box<Pod>),
    Node(Box<Node>),
}

/// The PoolService watch (`--pool-services`), followed by [`Item::PoolEnded`]; without
/// PoolServices, a stream that never yields.
pub(crate) fn pool_stream(kube: &kube::Client, config: &WatcherConfig) -> BoxStream<'static, Item> {
    if !config.pool_services_on() {
        return futures::stream::pending().boxed();
    }
    let api: Api<DynamicObject> =
        Api::all_with(kube.clone(), &ApiResource::erase::<PoolService>(&()));
    relist::paced(
        watcher::watcher(api, watcher::Config::default()),
        relist::connection_backoff(config.watch_backoff_max),
    )
    .map(Item::Pool)
    .chain(futures::stream::once(async { Item::PoolEnded }))
    .boxed()
}

/// What the kube side runs with: its lanes, the write-back's inbox and where node moves spawn.
pub(crate) struct KubeSide {
    pub(crate) lanes: Vec<Lane>,
    pub(crate) write_back: Option<writeback::Inbox>,
    pub(crate) kinds: Vec<Kind>,
    pub(crate) config: WatcherConfig,
    pub(crate) tasks: Tasks,
}

/// Feeds watch events into the lanes' translators until a stream ends (none does: it returns
/// why), and the PoolService events into the PoolService side (a panic there is reported as the
/// PoolService side's). The write-back hears of each event once, before the lanes; its inbox is
/// bounded, so a write-back that falls behind holds the kube side back (never a dropped message).
pub(crate) async fn run(
    mut streams: impl futures::Stream<Item = Item> + Unpin,
    side: KubeSide,
) -> Ended {
    use crate::supervise::{KUBE_SIDE, POOL_SERVICE_SIDE};
    let KubeSide {
        lanes,
        write_back,
        kinds,
        config,
        tasks,
    } = side;
    let metrics = config.metrics.clone();
    let tconfig = config.translator_config();
    for lane in &lanes {
        lane.feed(|t| {
            t.set_warn_unlocated(false);
            Vec::new()
        });
    }
    let mut moves = moves::Moves::new(&lanes, config.move_bound, tasks);
    let mut seq = 0u64;
    let mut pools = pools::PoolSide::new(&config);
    let mut outbox: Vec<writeback::Msg> = Vec::new();
    while let Some(item) = streams.next().await {
        if fault_point!(config.faults, KUBE_SIDE) {
            return Ended::failed(KUBE_SIDE, "it returned");
        }
        let (kind, event) = match item {
            Item::Obj(kind, event) => (kind, event),
            Item::Pool(event) => {
                let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    if fault_point!(config.faults, POOL_SERVICE_SIDE) {
                        return None;
                    }
                    Some(pools.event(event, &lanes, seq))
                }));
                match handled {
                    Ok(Some(msgs)) => {
                        deliver(write_back.as_ref(), msgs).await;
                        continue;
                    }
                    Ok(None) => return Ended::failed(POOL_SERVICE_SIDE, "it returned"),
                    Err(panic) => {
                        return Ended::failed(
                            POOL_SERVICE_SIDE,
                            supervise::panic_message(panic.as_ref()),
                        );
                    }
                }
            }
            Item::Ended(kind) => {
                return Ended::failed(KUBE_SIDE, format!("the watch of {kind} ended"));
            }
            Item::PoolEnded => {
                return Ended::failed(POOL_SERVICE_SIDE, "the PoolService watch ended");
            }
        };
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                let gone = relist::is_gone(&e);
                metrics.watch_restart(kind_label(kind), if gone { "expired" } else { "failed" });
                if gone {
                    tracing::info!(%kind, error = %e, "watch expired; relisting");
                } else {
                    tracing::warn!(%kind, error = %e, "watch failed; retrying with backoff");
                }
                continue;
            }
        };
        metrics.event(
            kind_label(kind),
            match &event {
                Event::Init => "init",
                Event::InitApply(_) | Event::Apply(_) => "apply",
                Event::Delete(_) => "delete",
                Event::InitDone => "init_done",
            },
        );
        seq += 1;
        let wb = write_back.is_some();
        let services = kind == Kind::Service && wb;
        let mut conflicts = BTreeMap::new();
        match event {
            Event::Init => {
                if services {
                    outbox.push(writeback::Msg::RelistStart);
                }
                tracing::debug!(%kind, "listing");
                for lane in &lanes {
                    lane.begin_relist(seq, kind);
                }
            }
            Event::InitApply(obj) | Event::Apply(obj) => {
                let Some(key) = ObjKey::of(kind, &obj.metadata) else {
                    for lane in &lanes {
                        lane.change(Some(seq), |_| Vec::new());
                    }
                    continue;
                };
                let t = decode_object(kind, obj, &key);
                match &t {
                    Some(Typed::Service(svc)) => {
                        if wb {
                            outbox.push(
                                match writeback::ServiceFacts::of(
                                    &key,
                                    svc,
                                    &tconfig,
                                    config.gateways.as_deref(),
                                ) {
                                    Some(facts) => writeback::Msg::Seen { facts, seq },
                                    None => writeback::Msg::Gone(key.clone()),
                                },
                            );
                        }
                        pools.service_seen(&key, svc);
                    }
                    Some(Typed::Node(node)) => moves.node_seen(&key.name, node, seq),
                    _ => {}
                }
                for lane in &lanes {
                    let changed =
                        lane.change(Some(seq), |tr| apply_typed(tr, kind, &key, t.as_ref()));
                    collect(&mut outbox, &mut conflicts, changed, seq, wb);
                }
            }
            Event::Delete(obj) => {
                let Some(key) = ObjKey::of(kind, &obj.metadata) else {
                    for lane in &lanes {
                        lane.change(Some(seq), |_| Vec::new());
                    }
                    continue;
                };
                match kind {
                    Kind::Service => {
                        if wb {
                            outbox.push(writeback::Msg::Gone(key.clone()));
                        }
                        pools.service_gone(&key);
                    }
                    Kind::Node => moves.node_gone(&key.name),
                    Kind::EndpointSlice | Kind::Pod => {}
                }
                for lane in &lanes {
                    let changed = lane.change(Some(seq), |tr| delete_object(tr, kind, &key));
                    collect(&mut outbox, &mut conflicts, changed, seq, wb);
                }
            }
            Event::InitDone => {
                if services {
                    outbox.push(writeback::Msg::RelistDone);
                }
                for (i, lane) in lanes.iter().enumerate() {
                    let (first, found) = lane.end_relist(seq, kind, &kinds);
                    if let Some(f) = first {
                        if i == 0 {
                            metrics.lists_done();
                        }
                        tracing::info!(
                            gateway = %lane.gateway(),
                            services = f.services,
                            endpoints = f.endpoints,
                            pod_addresses = f.pods,
                            unlocated = f.unlocated,
                            "every stream listed; resyncing"
                        );
                    }
                    for c in found {
                        conflicts.insert((c.service.clone(), c.port_name.clone()), c);
                    }
                }
            }
        }
        report_conflicts(&mut outbox, conflicts, wb);
        deliver(write_back.as_ref(), std::mem::take(&mut outbox)).await;
    }
    Ended::failed(KUBE_SIDE, "its watch streams ended")
}

/// Logs the port-name conflicts an event brought, and tells the write-back (`wb`: there is one).
pub(crate) fn report_conflicts(
    outbox: &mut Vec<writeback::Msg>,
    conflicts: BTreeMap<(ObjKey, String), PortConflict>,
    wb: bool,
) {
    for c in conflicts.into_values() {
        tracing::warn!(service = %c.service, port = %c.port_name, chosen = c.chosen, "{}", c.message);
        if wb {
            outbox.push(writeback::Msg::PortConflict {
                key: c.service,
                port_name: c.port_name,
                message: c.message,
            });
        }
    }
}

/// Folds what a lane's change brought into the write-back's messages (`wb`: there is a
/// write-back) and the event's port-name conflicts (one per Service and port over every lane).
pub(crate) fn collect(
    outbox: &mut Vec<writeback::Msg>,
    conflicts: &mut BTreeMap<(ObjKey, String), PortConflict>,
    changed: Changed,
    seq: u64,
    wb: bool,
) {
    if wb && !changed.endpoints_of.is_empty() {
        outbox.push(writeback::Msg::Touched {
            uids: changed.endpoints_of,
            seq,
        });
    }
    for c in changed.conflicts {
        conflicts.insert((c.service.clone(), c.port_name.clone()), c);
    }
}

/// Hands `msgs` to the write-back, waiting while its inbox is full. A write-back that is gone
/// is its own task's end to report (the supervisor does), so a failed send is not an error here.
async fn deliver(write_back: Option<&writeback::Inbox>, msgs: Vec<writeback::Msg>) {
    let Some(wb) = write_back else {
        return;
    };
    for m in msgs {
        if wb.send(m).await.is_err() {
            return;
        }
    }
}

/// The `kind` label of a resource kind.
fn kind_label(kind: Kind) -> &'static str {
    match kind {
        Kind::Service => "service",
        Kind::EndpointSlice => "endpointslice",
        Kind::Pod => "pod",
        Kind::Node => "node",
    }
}

/// Decodes a watched object (`None`: it does not decode; what was sent for it stays).
fn decode_object(kind: Kind, obj: DynamicObject, key: &ObjKey) -> Option<Typed> {
    let r = match kind {
        Kind::Service => obj
            .try_parse::<Service>()
            .map(|o| Typed::Service(Box::new(o))),
        Kind::EndpointSlice => obj
            .try_parse::<EndpointSlice>()
            .map(|o| Typed::Slice(Box::new(o))),
        Kind::Pod => obj.try_parse::<Pod>().map(|o| Typed::Pod(Box::new(o))),
        Kind::Node => obj.try_parse::<Node>().map(|o| Typed::Node(Box::new(o))),
    };
    match r {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(%kind, object = %key, error = %e, "object skipped: it does not decode");
            None
        }
    }
}

fn apply_typed(t: &mut Translator, kind: Kind, key: &ObjKey, obj: Option<&Typed>) -> Vec<Update> {
    match obj {
        None => {
            t.keep(kind, key);
            Vec::new()
        }
        Some(Typed::Service(svc)) => t.apply_service(svc),
        Some(Typed::Slice(s)) => t.apply_slice(s),
        Some(Typed::Pod(p)) => t.apply_pod(p),
        Some(Typed::Node(n)) => t.apply_node(n),
    }
}

fn delete_object(t: &mut Translator, kind: Kind, key: &ObjKey) -> Vec<Update> {
    match kind {
        Kind::Service => t.delete_service(key),
        Kind::EndpointSlice => t.delete_slice(key),
        Kind::Pod => t.delete_pod(key),
        Kind::Node => t.delete_node(&key.name),
    }
}
