//! A cluster split over several gateways (one per region): each gateway gets every Service and
//! egress, and the endpoints and pods on its own nodes, as a watcher that routes nodes to gateways
//! writes them. What each gateway's NRP must hold follows the same split.

use std::collections::BTreeSet;

use clb_embedded::cluster::location_ip;
use clb_embedded::{Cluster, Expected};
use clb_proto::v1::{ClusterTopology, Update, endpoints_update::Change, update::Kind};

/// The locations (node IPs) one gateway serves.
pub type Locations = BTreeSet<String>;

/// The nodes of `cluster` cut in `n` contiguous parts of (nearly) equal size, as locations: part
/// `i` is gateway `i`'s.
pub fn split_nodes(cluster: &Cluster, n: usize) -> Vec<Locations> {
    assert!(n > 0, "at least one part");
    let nodes = cluster.nodes();
    let per = nodes.len().div_ceil(n).max(1);
    let mut parts: Vec<Locations> = nodes
        .chunks(per)
        .map(|c| c.iter().map(|i| location_ip(*i)).collect())
        .collect();
    parts.resize(n, Locations::new());
    parts
}

/// The part of `updates` that goes to the gateway serving `locations`: Services and egresses as
/// they are; endpoints and pods only at `locations` (an update left with none is dropped, except a
/// level, which then says "no endpoint here").
pub fn view_for(updates: &[Update], locations: &Locations) -> Vec<Update> {
    updates
        .iter()
        .filter_map(|u| match &u.kind {
            Some(Kind::Pod(p)) => locations.contains(&p.location).then(|| u.clone()),
            Some(Kind::Endpoints(e)) => {
                let mut e = e.clone();
                match &mut e.change {
                    Some(Change::Level(set)) => {
                        set.endpoints.retain(|x| locations.contains(&x.location));
                    }
                    Some(Change::Edge(edge)) => {
                        edge.old_endpoints
                            .retain(|x| locations.contains(&x.location));
                        edge.new_endpoints
                            .retain(|x| locations.contains(&x.location));
                        if edge.old_endpoints.is_empty() && edge.new_endpoints.is_empty() {
                            return None;
                        }
                    }
                    None => {}
                }
                Some(Update {
                    kind: Some(Kind::Endpoints(e)),
                })
            }
            _ => Some(u.clone()),
        })
        .collect()
}

/// What the NRP of the gateway serving `locations` holds once converged: every Service and egress,
/// and the addresses at `locations`.
pub fn expected_for(expected: &Expected, locations: &Locations) -> Expected {
    let mut e = expected.clone();
    e.addresses.retain(|(l, _), _| locations.contains(l));
    e
}

/// The topology the watcher declares to the gateway serving `locations`: its nodes only.
pub fn topology_for(topology: &ClusterTopology, locations: &Locations) -> ClusterTopology {
    let mut t = topology.clone();
    t.nodes
        .retain(|n| n.locations.iter().any(|l| locations.contains(l)));
    t
}
