//! The kube side of PoolServices (`--pool-services`): the PoolService stream feeds the write-back
//! (which creates, deletes and writes the status of PoolServices) and, for PoolServices of our
//! class that someone else created (OpenYurt's first layer), exposes their Service at their pool's
//! gateway in the lanes' translators (the second layer).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use clb_gateways::Gateways;
use k8s_openapi::api::core::v1::Service;
use kube::api::DynamicObject;
use kube::runtime::watcher::{self, Event};

use crate::config::WatcherConfig;
use crate::lane::Lane;
use crate::poolservice::{PoolService, PoolServiceFacts};
use crate::translate::ObjKey;
use crate::writeback::Msg;

/// What the kube side keeps for PoolServices.
pub(crate) struct PoolSide {
    on: bool,
    class: String,
    gateways: Option<Arc<Gateways>>,
    /// Our Services as last seen (to apply again when a PoolService exposes one elsewhere).
    services: HashMap<ObjKey, Service>,
    /// Someone else's PoolServices of our class: PoolService → (its Service, its gateway).
    foreign: HashMap<ObjKey, (ObjKey, String)>,
    /// Every PoolService of our class known.
    known: HashSet<ObjKey>,
    /// During a relist: the PoolServices listed so far.
    relist: Option<HashSet<ObjKey>>,
    /// The watch is failing (a failure is logged as a warning once, until it works again).
    failing: bool,
}

impl PoolSide {
    pub(crate) fn new(config: &WatcherConfig) -> Self {
        Self {
            on: config.pool_services_on(),
            class: config.class.clone(),
            gateways: config.gateways.clone(),
            services: HashMap::new(),
            foreign: HashMap::new(),
            known: HashSet::new(),
            relist: None,
            failing: false,
        }
    }

    pub(crate) fn service_seen(&mut self, key: &ObjKey, svc: &Service) {
        if self.on {
            self.services.insert(key.clone(), svc.clone());
        }
    }

    pub(crate) fn service_gone(&mut self, key: &ObjKey) {
        self.services.remove(key);
    }

    /// Folds in one event of the PoolService watch; returns the write-back's messages.
    pub(crate) fn event(
        &mut self,
        event: Result<Event<DynamicObject>, watcher::Error>,
        lanes: &[Lane],
        seq: u64,
    ) -> Vec<Msg> {
        let mut out = Vec::new();
        let event = match event {
            Ok(e) => {
                if std::mem::take(&mut self.failing) {
                    tracing::info!("PoolService watch works again");
                }
                e
            }
            Err(e) => {
                if std::mem::replace(&mut self.failing, true) {
                    tracing::debug!(error = %e, "PoolService watch failed again; retrying with backoff");
                } else {
                    tracing::warn!(error = %e, "PoolService watch failed (is the PoolService CRD installed?); retrying with backoff");
                }
                return out;
            }
        };
        let mut affected = BTreeSet::new();
        match event {
            Event::Init => self.relist = Some(HashSet::new()),
            Event::InitApply(obj) | Event::Apply(obj) => {
                let Some(key) = ObjKey::of(crate::translate::Kind::Service, &obj.metadata) else {
                    return out;
                };
                if let Some(seen) = &mut self.relist {
                    seen.insert(key.clone());
                }
                let facts = match obj.try_parse::<PoolService>() {
                    Ok(ps) => PoolServiceFacts::of(&ps, &self.class),
                    Err(e) => {
                        tracing::warn!(poolservice = %key, error = %e, "PoolService skipped: it does not decode");
                        return out;
                    }
                };
                affected.extend(self.forget(&key, &mut out));
                if let Some(f) = facts {
                    affected.extend(self.learn(f, &mut out));
                }
            }
            Event::Delete(obj) => {
                if let Some(key) = ObjKey::of(crate::translate::Kind::Service, &obj.metadata) {
                    affected.extend(self.forget(&key, &mut out));
                }
            }
            Event::InitDone => {
                if let Some(seen) = self.relist.take() {
                    let gone: Vec<ObjKey> = self
                        .known
                        .iter()
                        .filter(|k| !seen.contains(*k))
                        .cloned()
                        .collect();
                    for k in gone {
                        affected.extend(self.forget(&k, &mut out));
                    }
                }
            }
        }
        for svc in affected {
            self.expose(&svc, lanes, seq, &mut out);
        }
        out
    }

    /// Drops PoolService `key`; returns the Service it exposed elsewhere, if any.
    fn forget(&mut self, key: &ObjKey, out: &mut Vec<Msg>) -> Option<ObjKey> {
        if self.known.remove(key) {
            out.push(Msg::PoolGone(key.clone()));
        }
        self.foreign.remove(key).map(|(s, _)| s)
    }

    fn learn(&mut self, mut f: PoolServiceFacts, out: &mut Vec<Msg>) -> Option<ObjKey> {
        self.known.insert(f.key.clone());
        let mut affected = None;
        if f.owner_uid.is_none() {
            let gateway = f
                .pool
                .as_deref()
                .and_then(|p| self.gateways.as_ref().and_then(|g| g.by_pool(p)))
                .map(|g| g.name.clone());
            match (&f.service, gateway) {
                (Some(svc), Some(g)) => {
                    self.foreign.insert(f.key.clone(), (svc.clone(), g));
                    affected = Some(svc.clone());
                }
                (None, _) => {
                    f.problem = Some(format!(
                        "metadata.labels[{:?}] is missing: the PoolService names no Service, so \
                         it is not programmed",
                        crate::poolservice::LABEL_SERVICE_NAME
                    ));
                }
                (Some(_), None) => {
                    let pools: Vec<String> = self
                        .gateways
                        .iter()
                        .flat_map(|g| g.all().iter().map(|g| g.pool().to_owned()))
                        .collect();
                    f.problem = Some(match &f.pool {
                        Some(p) => format!(
                            "spec.nodepoolName = {}: no gateway of the gateways file stands for \
                             this node pool (pools: {}), so it is not programmed",
                            crate::routing::quote(p),
                            pools.join(", ")
                        ),
                        None => format!(
                            "spec.nodepoolName and metadata.labels[{:?}] are missing: the \
                             PoolService names no node pool, so it is not programmed",
                            crate::poolservice::LABEL_POOL_NAME
                        ),
                    });
                }
            }
            if let Some(p) = &f.problem {
                tracing::warn!(poolservice = %f.key, "{p}");
            }
        }
        out.push(Msg::Pool(f));
        affected
    }

    /// Exposes Service `svc` in each lane where a PoolService of someone else asks for it (or no
    /// longer), and applies it again there.
    fn expose(&self, svc: &ObjKey, lanes: &[Lane], seq: u64, out: &mut Vec<Msg>) {
        let mut conflicts = BTreeMap::new();
        for lane in lanes {
            let want = self
                .foreign
                .values()
                .any(|(s, g)| s == svc && g == lane.gateway());
            let changed = lane.change(None, |t| {
                t.set_extra(svc, want);
                match self.services.get(svc) {
                    Some(obj) => t.apply_service(obj),
                    None => Vec::new(),
                }
            });
            crate::kube_side::collect(out, &mut conflicts, changed, seq, true);
        }
        crate::kube_side::report_conflicts(out, conflicts, true);
        out.push(Msg::Poke(svc.clone()));
    }
}
