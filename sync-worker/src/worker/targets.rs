//! Where the NRP calls of each gateway go: one NRP client per gateway (its own subscription,
//! resource group, endpoint and api-version, as the gateways file describes it), the ARM name of its
//! Service Gateway, and the region and virtual network of a gateway the worker has to create.
//! Without a gateways file every gateway goes to one default client, under its own name.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use clb_nrp::Nrp;

/// Where the calls on one gateway go.
#[derive(Clone)]
pub struct GatewayTarget {
    /// The NRP client of the gateway's subscription and resource group.
    pub nrp: Arc<dyn Nrp>,
    /// The Service Gateway's ARM resource name; `None`: the gateway's clb name.
    pub resource_name: Option<String>,
    /// Region of a Service Gateway the worker creates; `None`: [`super::WorkerConfig::gateway_region`].
    pub region: Option<String>,
    /// Virtual network of a Service Gateway the worker creates; `None`:
    /// [`super::WorkerConfig::virtual_network_id`].
    pub virtual_network_id: Option<String>,
    /// Resource group of the NAT gateways egresses may bring (the gateways file's
    /// `natGatewayResourceGroup`); `None`: [`super::WorkerConfig::nat_gateway_resource_group`].
    pub nat_gateway_resource_group: Option<String>,
}

impl GatewayTarget {
    /// Calls go to `nrp`, under the gateway's own name, with the worker's defaults for creation.
    pub fn new(nrp: Arc<dyn Nrp>) -> Self {
        Self {
            nrp,
            resource_name: None,
            region: None,
            virtual_network_id: None,
            nat_gateway_resource_group: None,
        }
    }
}

impl fmt::Debug for GatewayTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatewayTarget")
            .field("resource_name", &self.resource_name)
            .field("region", &self.region)
            .field("virtual_network_id", &self.virtual_network_id)
            .field(
                "nat_gateway_resource_group",
                &self.nat_gateway_resource_group,
            )
            .finish_non_exhaustive()
    }
}

/// The NRP client of every gateway a worker serves.
#[derive(Clone, Debug, Default)]
pub struct NrpTargets {
    /// Gateways without an entry of their own (none: such a gateway's units fail, terminal).
    default: Option<GatewayTarget>,
    /// By lower-cased gateway name (names are case-insensitive, as ARM's).
    gateways: BTreeMap<String, (String, GatewayTarget)>,
}

impl From<Arc<dyn Nrp>> for NrpTargets {
    fn from(nrp: Arc<dyn Nrp>) -> Self {
        Self::single(nrp)
    }
}

impl NrpTargets {
    /// Every gateway goes to `nrp`, under its own name (the worker without a gateways file).
    pub fn single(nrp: Arc<dyn Nrp>) -> Self {
        Self {
            default: Some(GatewayTarget::new(nrp)),
            gateways: BTreeMap::new(),
        }
    }

    /// No gateway yet and no default: add each with [`NrpTargets::insert`].
    pub fn empty() -> Self {
        Self::default()
    }

    /// Calls on `gateway` go to `target` (replacing an earlier entry of the same name).
    pub fn insert(&mut self, gateway: &str, target: GatewayTarget) {
        self.gateways
            .insert(gateway.to_ascii_lowercase(), (gateway.to_owned(), target));
    }

    /// The gateways with an entry of their own, by name.
    pub fn gateways(&self) -> Vec<String> {
        self.gateways.values().map(|(n, _)| n.clone()).collect()
    }

    /// Where the calls on `gateway` go, if anywhere.
    pub fn get(&self, gateway: &str) -> Option<&GatewayTarget> {
        self.gateways
            .get(&gateway.to_ascii_lowercase())
            .map(|(_, t)| t)
            .or(self.default.as_ref())
    }

    /// The same targets with every client wrapped by `wrap` (e.g. metrics).
    pub fn map_clients(self, mut wrap: impl FnMut(Arc<dyn Nrp>) -> Arc<dyn Nrp>) -> Self {
        let mut rewrap = |t: GatewayTarget| GatewayTarget {
            nrp: wrap(t.nrp),
            ..t
        };
        Self {
            default: self.default.map(&mut rewrap),
            gateways: self
                .gateways
                .into_iter()
                .map(|(k, (n, t))| (k, (n, rewrap(t))))
                .collect(),
        }
    }
}
