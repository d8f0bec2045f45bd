//! The gateways file: one YAML file, shared by the state server, the sync workers and the watcher,
//! that lists the Service Gateways a cluster uses (one per node pool, region or edge site), their
//! Azure coordinates, and the nodes each one serves.
//!
//! ```yaml
//! # Optional: the label that names a node's pool (OpenYurt's).
//! nodePoolLabel: apps.openyurt.io/nodepool
//! # Optional: the gateway of Services that select none; default the first listed.
//! defaultGateway: east
//! gateways:
//!   - name: east                 # clb's name: the `gateway` of every update, unit and read
//!     labels: {region: eastus}   # the pool's labels, for Services' pool selectors
//!     nodes: {pool: pool-east}   # nodes whose nodePoolLabel is pool-east
//!     azure:
//!       subscription: 00000000-0000-0000-0000-000000000000
//!       resourceGroup: rg-east
//!       region: eastus
//!       serviceGateway: sgw-east # the ARM resource name; default: name
//!       apiVersion: "2026-03-01" # optional; default: the worker's --nrp-api-version
//!       endpoint: https://management.azure.com   # optional; default: the worker's
//!       natGatewayResourceGroup: rg-vnet   # optional: egresses may bring their NAT gateway from here
//!   - name: west
//!     nodes: {matchLabels: {topology.kubernetes.io/region: westus}}
//!     azure: {subscription: "...", resourceGroup: rg-west, region: westus}
//! ```
//!
//! A node belongs to the first gateway, in file order, whose `nodes` match its labels; a gateway
//! without `nodes` serves every node no other gateway takes (at most one such gateway). This crate
//! knows nothing of Kubernetes or gRPC: node labels come in as a map.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Deserialize;

/// The label that names a node's pool when the file does not say: OpenYurt's.
pub const DEFAULT_NODE_POOL_LABEL: &str = "apps.openyurt.io/nodepool";

/// Values in error messages are cut to this many characters.
const MAX_QUOTED: usize = 100;

/// Labels of a node or a pool.
pub type Labels = BTreeMap<String, String>;

/// A gateways file, parsed and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gateways {
    node_pool_label: String,
    /// Default first, then the others in file order.
    gateways: Vec<Gateway>,
}

/// One gateway of the file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gateway {
    /// clb's name for the gateway: the `gateway` of updates, units and reads.
    pub name: String,
    /// The pool's labels, matched by Services' pool selectors.
    #[serde(default)]
    pub labels: Labels,
    /// The nodes it serves; `None`: every node no other gateway takes.
    #[serde(default)]
    pub nodes: Option<NodeSelector>,
    /// Where it lives in Azure.
    pub azure: Azure,
}

/// Which nodes a gateway serves: a pool name (the value of the file's `nodePoolLabel`), labels
/// the node must carry, or both (both must match).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSelector {
    /// The node pool's name.
    #[serde(default)]
    pub pool: Option<String>,
    /// Labels the node must carry, with these values.
    #[serde(default)]
    pub match_labels: Labels,
}

/// The Azure coordinates of a gateway's Service Gateway resource.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Azure {
    /// Subscription id.
    pub subscription: String,
    /// Resource group of the Service Gateway and of the load balancers, public IPs and NAT
    /// gateways the workers create for it.
    pub resource_group: String,
    /// Azure region (e.g. `eastus`), for resources the workers create.
    pub region: String,
    /// The Service Gateway's ARM resource name; `None`: the gateway's `name`.
    #[serde(default)]
    pub service_gateway: Option<String>,
    /// api-version of the calls on this gateway; `None`: the worker's default.
    #[serde(default)]
    pub api_version: Option<String>,
    /// ARM endpoint; `None`: the worker's default (`--nrp-endpoint`).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Virtual network id, for a Service Gateway the worker has to create.
    #[serde(default)]
    pub virtual_network_id: Option<String>,
    /// Resource group (in `subscription`) where egresses may bring their own NAT gateway (the
    /// VNet's resource group): an egress whose pods carry the annotation
    /// `clb.azure.com/nat-gateway: NAME` uses the existing NAT gateway `NAME` there (clb links it
    /// to the Service Gateway and never creates, changes or deletes it). `None`: bringing a NAT
    /// gateway is off for this gateway, and such an egress is refused.
    #[serde(default)]
    pub nat_gateway_resource_group: Option<String>,
}

impl Azure {
    /// The Service Gateway's ARM resource name, given the gateway's name.
    pub fn resource_name<'a>(&'a self, gateway: &'a str) -> &'a str {
        self.service_gateway.as_deref().unwrap_or(gateway)
    }
}

impl Gateway {
    /// The node pool this gateway stands for: `nodes.pool`, or the gateway's name when it selects
    /// nodes by labels (or takes every node). PoolServices are named after it.
    pub fn pool(&self) -> &str {
        self.nodes
            .as_ref()
            .and_then(|n| n.pool.as_deref())
            .unwrap_or(&self.name)
    }

    /// The Service Gateway's ARM resource name.
    pub fn resource_name(&self) -> &str {
        self.azure.resource_name(&self.name)
    }

    /// Whether this gateway serves every node no other gateway takes.
    pub fn is_catch_all(&self) -> bool {
        self.nodes.is_none()
    }

    fn matches(&self, pool_label: &str, node: &Labels) -> bool {
        let Some(sel) = &self.nodes else {
            return false;
        };
        sel.pool
            .as_ref()
            .is_none_or(|p| node.get(pool_label) == Some(p))
            && sel.match_labels.iter().all(|(k, v)| node.get(k) == Some(v))
    }
}

/// A gateways file that cannot be used: where, what and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GatewaysError {
    /// The file cannot be read.
    #[error("cannot read the gateways file {path}: {reason}")]
    Read {
        /// The path.
        path: String,
        /// The OS error.
        reason: String,
    },
    /// The YAML does not describe gateways (syntax, unknown or missing field, wrong type).
    #[error("the gateways file is not valid: {0}")]
    Syntax(String),
    /// A field's value is refused.
    #[error("{field} = {value}: {reason}")]
    Invalid {
        /// The field's path, e.g. `gateways[1].name`.
        field: String,
        /// The value, quoted and cut to 100 characters.
        value: String,
        /// Why.
        reason: String,
    },
}

fn quote(value: &str) -> String {
    let mut cut: String = value.chars().take(MAX_QUOTED).collect();
    if cut.len() < value.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}

fn invalid(field: impl Into<String>, value: &str, reason: impl Into<String>) -> GatewaysError {
    GatewaysError::Invalid {
        field: field.into(),
        value: quote(value),
        reason: reason.into(),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct File {
    #[serde(default)]
    node_pool_label: Option<String>,
    #[serde(default)]
    default_gateway: Option<String>,
    gateways: Vec<Gateway>,
}

/// A gateway name: what ARM allows for a resource name (1–80 characters of letters, digits, `_`,
/// `.`, `-`; starting with a letter or digit, not ending with `.` or `-`).
fn check_name(field: &str, name: &str) -> Result<(), GatewaysError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    let reason = if name.is_empty() {
        Some("is empty")
    } else if name.chars().count() > 80 {
        Some("is longer than 80 characters")
    } else if !name.chars().all(ok_char) {
        Some("may hold only letters, digits, '_', '.' and '-'")
    } else if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        Some("must start with a letter or a digit")
    } else if name.ends_with(['.', '-']) {
        Some("must not end with '.' or '-'")
    } else {
        None
    };
    match reason {
        Some(r) => Err(invalid(field, name, r)),
        None => Ok(()),
    }
}

/// A resource group name: what ARM allows (1–90 characters of letters, digits, `_`, `.`, `-`,
/// `(`, `)`; not ending with `.`).
fn check_resource_group(field: &str, name: &str) -> Result<(), GatewaysError> {
    let ok_char = |c: char| c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | '(' | ')');
    let reason = if name.is_empty() {
        Some("is empty")
    } else if name.chars().count() > 90 {
        Some("is longer than 90 characters (ARM's limit for a resource group)")
    } else if !name.chars().all(ok_char) {
        Some("may hold only letters, digits, '_', '.', '-', '(' and ')'")
    } else if name.ends_with('.') {
        Some("must not end with '.'")
    } else {
        None
    };
    match reason {
        Some(r) => Err(invalid(field, name, r)),
        None => Ok(()),
    }
}

impl Gateways {
    /// Reads and checks a gateways file.
    pub fn load(path: &Path) -> Result<Self, GatewaysError> {
        let text = std::fs::read_to_string(path).map_err(|e| GatewaysError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::parse(&text)
    }

    /// Parses and checks the text of a gateways file.
    pub fn parse(text: &str) -> Result<Self, GatewaysError> {
        let file: File =
            yaml_serde::from_str(text).map_err(|e| GatewaysError::Syntax(e.to_string()))?;
        Self::from_parts(file)
    }

    /// One gateway named `name` that serves every node, in subscription `subscription` and
    /// resource group `resource_group`: what the single-gateway flags describe.
    pub fn single(name: &str, subscription: &str, resource_group: &str, region: &str) -> Self {
        Self {
            node_pool_label: DEFAULT_NODE_POOL_LABEL.to_owned(),
            gateways: vec![Gateway {
                name: name.to_owned(),
                labels: Labels::new(),
                nodes: None,
                azure: Azure {
                    subscription: subscription.to_owned(),
                    resource_group: resource_group.to_owned(),
                    region: region.to_owned(),
                    service_gateway: None,
                    api_version: None,
                    endpoint: None,
                    virtual_network_id: None,
                    nat_gateway_resource_group: None,
                },
            }],
        }
    }

    fn from_parts(file: File) -> Result<Self, GatewaysError> {
        if file.gateways.is_empty() {
            return Err(invalid(
                "gateways",
                "",
                "lists no gateway: at least one is needed",
            ));
        }
        let node_pool_label = file
            .node_pool_label
            .unwrap_or_else(|| DEFAULT_NODE_POOL_LABEL.to_owned());
        if node_pool_label.trim().is_empty() {
            return Err(invalid("nodePoolLabel", &node_pool_label, "is empty"));
        }
        let mut catch_all: Option<&str> = None;
        for (i, g) in file.gateways.iter().enumerate() {
            check_name(&format!("gateways[{i}].name"), &g.name)?;
            if let Some(j) = file.gateways[..i]
                .iter()
                .position(|o| o.name.eq_ignore_ascii_case(&g.name))
            {
                return Err(invalid(
                    format!("gateways[{i}].name"),
                    &g.name,
                    format!("gateways[{j}] has the same name (names are case-insensitive)"),
                ));
            }
            for (field, value) in [
                ("subscription", &g.azure.subscription),
                ("resourceGroup", &g.azure.resource_group),
                ("region", &g.azure.region),
            ] {
                if value.trim().is_empty() {
                    return Err(invalid(
                        format!("gateways[{i}].azure.{field}"),
                        value,
                        "is empty",
                    ));
                }
            }
            if let Some(rg) = &g.azure.nat_gateway_resource_group {
                check_resource_group(&format!("gateways[{i}].azure.natGatewayResourceGroup"), rg)?;
            }
            if let Some(sgw) = &g.azure.service_gateway {
                check_name(&format!("gateways[{i}].azure.serviceGateway"), sgw)?;
            }
            match &g.nodes {
                None => {
                    if let Some(other) = catch_all {
                        return Err(invalid(
                            format!("gateways[{i}].nodes"),
                            "",
                            format!(
                                "is missing, and gateway {other:?} already serves every node no \
                                 other gateway takes: at most one gateway may omit nodes"
                            ),
                        ));
                    }
                    catch_all = Some(&g.name);
                }
                Some(sel) => {
                    if sel.pool.is_none() && sel.match_labels.is_empty() {
                        return Err(invalid(
                            format!("gateways[{i}].nodes"),
                            "{}",
                            "selects nothing: give pool or matchLabels (or omit nodes to serve \
                             every node no other gateway takes)",
                        ));
                    }
                    if let Some(p) = &sel.pool
                        && p.trim().is_empty()
                    {
                        return Err(invalid(format!("gateways[{i}].nodes.pool"), p, "is empty"));
                    }
                }
            }
        }
        // Pools name PoolServices: two gateways standing for one pool would fight over them.
        for (i, g) in file.gateways.iter().enumerate() {
            if let Some(j) = file.gateways[..i].iter().position(|o| o.pool() == g.pool()) {
                return Err(invalid(
                    format!("gateways[{i}].nodes.pool"),
                    g.pool(),
                    format!("gateways[{j}] stands for the same node pool"),
                ));
            }
        }
        let mut gateways = file.gateways;
        if let Some(default) = &file.default_gateway {
            let Some(at) = gateways
                .iter()
                .position(|g| g.name.eq_ignore_ascii_case(default))
            else {
                return Err(invalid(
                    "defaultGateway",
                    default,
                    "is not the name of a listed gateway",
                ));
            };
            let g = gateways.remove(at);
            gateways.insert(0, g);
        }
        Ok(Self {
            node_pool_label,
            gateways,
        })
    }

    /// Every gateway, the default first, then the others in file order.
    pub fn all(&self) -> &[Gateway] {
        &self.gateways
    }

    /// Every gateway's name, the default first (what the state server's `--gateways` takes).
    pub fn names(&self) -> Vec<String> {
        self.gateways.iter().map(|g| g.name.clone()).collect()
    }

    /// The default gateway: Services that select no pool are exposed there.
    pub fn default_gateway(&self) -> &Gateway {
        &self.gateways[0]
    }

    /// The gateway named `name` (case-insensitive, as ARM's names); the default for `""`.
    pub fn get(&self, name: &str) -> Option<&Gateway> {
        if name.is_empty() {
            return Some(self.default_gateway());
        }
        self.gateways
            .iter()
            .find(|g| g.name.eq_ignore_ascii_case(name))
    }

    /// The gateway of the node pool `pool`.
    pub fn by_pool(&self, pool: &str) -> Option<&Gateway> {
        self.gateways.iter().find(|g| g.pool() == pool)
    }

    /// The label that names a node's pool.
    pub fn node_pool_label(&self) -> &str {
        &self.node_pool_label
    }

    /// The gateway that serves a node with these labels: the first, in file order, whose `nodes`
    /// match; else the gateway without `nodes`; else none (the node is served by no gateway).
    pub fn gateway_of_node(&self, labels: &Labels) -> Option<&Gateway> {
        self.gateways
            .iter()
            .find(|g| g.matches(&self.node_pool_label, labels))
            .or_else(|| self.gateways.iter().find(|g| g.is_catch_all()))
    }

    /// The gateways whose pool labels carry every `key=value` of `selector` (an empty selector
    /// selects every gateway).
    pub fn with_labels(&self, selector: &Labels) -> Vec<&Gateway> {
        self.gateways
            .iter()
            .filter(|g| selector.iter().all(|(k, v)| g.labels.get(k) == Some(v)))
            .collect()
    }
}

impl fmt::Display for Gateways {
    /// One line per gateway: `name (pool P) -> subscription/resourceGroup/serviceGateway`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for g in &self.gateways {
            writeln!(
                f,
                "{} (pool {}) -> {}/{}/{}",
                g.name,
                g.pool(),
                g.azure.subscription,
                g.azure.resource_group,
                g.resource_name()
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
