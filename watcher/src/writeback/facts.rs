//! What the write-back hears: the facts of a Service it needs ([`ServiceFacts`], taken from the
//! watch event by the kube side) and its inbox's messages ([`Msg`]).

use clb_proto::v1::IpFamily;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::ingress::{self, IngressEntry};
use crate::poolservice::PoolServiceFacts;
use crate::routing;
use crate::translate::{ObjKey, ServiceClass, TranslatorConfig, classify};
use clb_gateways::Gateways;

/// What the write-back needs to know of a Service.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ServiceFacts {
    pub key: ObjKey,
    pub uid: String,
    /// Its inbound identities, one per IP family, primary first, each with its family
    /// (`crate::families`).
    pub ids: Vec<(String, IpFamily)>,
    pub resource_version: String,
    /// A LoadBalancer Service of our class.
    pub ours: bool,
    pub deleting: bool,
    pub has_finalizer: bool,
    pub finalizers: Vec<String>,
    /// `status.loadBalancer.ingress`.
    pub ingress: Vec<IngressEntry>,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `status.conditions`, every type.
    pub conditions: Vec<Condition>,
    /// The gateways the Service is exposed in (`[""]`, the one of `--gateway`, without a gateways
    /// file), sorted.
    pub gateways: Vec<String>,
    /// Its gateway annotations cannot be used: why (the gateways stay as they were).
    pub selection_error: Option<String>,
    /// Why clb does not program it (`crate::settings::admit`), if it refuses it.
    pub refusal: Option<crate::settings::Refusal>,
    /// The Warning Event naming the settings clb ignores, if any.
    pub ignored: Option<String>,
}

impl ServiceFacts {
    /// The facts of a Service that concerns us (ours, or carrying our finalizer); `None` otherwise.
    pub(crate) fn of(
        key: &ObjKey,
        svc: &Service,
        config: &TranslatorConfig,
        gateways: Option<&Gateways>,
    ) -> Option<Self> {
        let finalizer = config.require_finalizer.as_deref()?;
        let ours = classify(svc, config) == ServiceClass::Ours;
        let finalizers = svc.metadata.finalizers.clone().unwrap_or_default();
        let has_finalizer = finalizers.iter().any(|f| f == finalizer);
        if !ours && !has_finalizer {
            return None;
        }
        // A Service without UID is skipped (the translator logs it): nothing to program or patch.
        let uid = svc.metadata.uid.clone().filter(|u| !u.trim().is_empty())?;
        let ingress = ingress::entries(svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()));
        let (gateways, selection_error) = match gateways {
            None => (vec![String::new()], None),
            Some(g) => match routing::selected(g, svc.metadata.annotations.as_ref()) {
                Ok(set) => (set.into_iter().collect(), None),
                Err(e) => (Vec::new(), Some(e.to_string())),
            },
        };
        let families = crate::families::of_service(key, svc);
        let ids = crate::families::identities(&uid, &families);
        let (refusal, ignored) = match crate::settings::admit(svc, &families) {
            Ok(a) => (None, a.ignored_message()),
            Err(r) => (Some(r), None),
        };
        Some(Self {
            refusal,
            ignored,
            gateways,
            selection_error,
            key: key.clone(),
            ids,
            uid,
            resource_version: svc.metadata.resource_version.clone().unwrap_or_default(),
            ours,
            deleting: svc.metadata.deletion_timestamp.is_some(),
            has_finalizer,
            finalizers,
            ingress,
            generation: svc.metadata.generation,
            conditions: svc
                .status
                .as_ref()
                .and_then(|s| s.conditions.clone())
                .unwrap_or_default(),
        })
    }
}

/// From the kube side.
#[derive(Debug)]
pub(crate) enum Msg {
    /// The Service stream starts a list.
    RelistStart,
    /// A Service that concerns us, seen at event `seq`.
    Seen { facts: ServiceFacts, seq: u64 },
    /// The Service is gone or does not concern us.
    Gone(ObjKey),
    /// The Service list is complete: records not seen since `RelistStart` are dropped.
    RelistDone,
    /// Updates about these inbound services (UIDs) were sent at event `seq` (their endpoints
    /// changed): something is pending for them again.
    Touched { uids: Vec<String>, seq: u64 },
    /// The translator found a port-name conflict of a Service (or its situation changed).
    PortConflict {
        key: ObjKey,
        port_name: String,
        message: String,
    },
    /// A PoolService of our class was seen.
    Pool(PoolServiceFacts),
    /// A PoolService is gone or no longer of our class.
    PoolGone(ObjKey),
    /// Something changed for this Service (a PoolService of someone else exposes it elsewhere).
    Poke(ObjKey),
}
