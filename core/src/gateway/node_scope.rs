//! Node binding of a resync: a node agent resyncs only the pods at one of its own node's
//! locations, as the cluster watcher's topology declares them ([`GatewayCore::authorize_node_resync`]).
//! The writes of a node agent are bound the same way, item by item (`update::node_check`).

use std::net::IpAddr;

use super::{GatewayCore, Scope};

/// Why a node agent may not resync a scope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeScopeRefusal {
    /// The scope is not the pods at one location.
    #[error(
        "the node agent of node {node:?} may resync only `pods` at one of its node's locations \
         (scope.location)"
    )]
    NotPodsAtOneLocation {
        /// The agent's node.
        node: String,
    },
    /// No topology was declared since the state started: transient (right after a (re)start the
    /// watcher's resync, which declares the nodes, may come after the agents'); retry shortly.
    #[error(
        "the node agent of node {node:?} resyncs location {location} before the cluster watcher \
         has declared the node topology since this server started: retry shortly"
    )]
    TopologyNotDeclared {
        /// The agent's node.
        node: String,
        /// The location of the scope.
        location: IpAddr,
    },
    /// The location is another node's.
    #[error(
        "is a location of node {owner:?}: the node agent of node {node:?} may resync only its own \
         node's locations"
    )]
    OtherNode {
        /// The agent's node.
        node: String,
        /// The location of the scope.
        location: IpAddr,
        /// The node the topology gives it to.
        owner: String,
    },
    /// The topology gives the location to no node.
    #[error(
        "is not a location of node {node:?} in the topology the cluster watcher declared (none \
         declared yet, or another node's): retry after the watcher's resync"
    )]
    NoNode {
        /// The agent's node.
        node: String,
        /// The location of the scope.
        location: IpAddr,
    },
}

impl NodeScopeRefusal {
    /// Whether retrying shortly may succeed without anything else changing (the topology is
    /// about to be declared).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::TopologyNotDeclared { .. })
    }

    /// The location at fault, if the scope named one.
    pub fn location(&self) -> Option<IpAddr> {
        match self {
            Self::NotPodsAtOneLocation { .. } => None,
            Self::TopologyNotDeclared { location, .. }
            | Self::OtherNode { location, .. }
            | Self::NoNode { location, .. } => Some(*location),
        }
    }
}

impl GatewayCore {
    /// Whether the node agent of `node` may resync `scope`: only the pods at one location, which
    /// the cluster watcher's declared topology gives to `node`.
    pub fn authorize_node_resync(&self, node: &str, scope: &Scope) -> Result<(), NodeScopeRefusal> {
        let only_pods = scope.pods && !scope.services && !scope.egresses && !scope.endpoints;
        let Some(location) = scope.location.filter(|_| only_pods) else {
            return Err(NodeScopeRefusal::NotPodsAtOneLocation {
                node: node.to_owned(),
            });
        };
        if !self.gate.topology_declared() {
            return Err(NodeScopeRefusal::TopologyNotDeclared {
                node: node.to_owned(),
                location,
            });
        }
        match self.gate.node_of(location) {
            Some(owner) if owner == node => Ok(()),
            Some(owner) => Err(NodeScopeRefusal::OtherNode {
                node: node.to_owned(),
                location,
                owner: owner.to_owned(),
            }),
            None => Err(NodeScopeRefusal::NoNode {
                node: node.to_owned(),
                location,
            }),
        }
    }
}
