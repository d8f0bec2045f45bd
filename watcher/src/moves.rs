//! A node moved to another pool (its labels now route it to another gateway): make before break.
//!
//! The old gateway's translator *holds* the node (it keeps its endpoints and pods there) while the
//! new gateway's translator adds them; once the new gateway's lane has sent the move and the state
//! server pushes that every address desired at the node's IPs in the new gateway is actual
//! (`Writer.WatchLocations`, authorized by the watcher's verb `write`), or after
//! `--node-move-bound`, the hold is released and the old gateway drops
//! them. Both lanes resync after their share changed, so that each gateway's declared topology
//! follows the node.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use clb_client::ClientError;
use clb_gateways::Gateways;
use k8s_openapi::api::core::v1::Node;

use crate::backoff::ServerBackoff;
use crate::config::WATCHER_WRITER;
use crate::lane::Lane;
use crate::sender::Conn;
use crate::supervise::{Ended, NODE_MOVE, Tasks, fault_point};
use crate::translate::{NodeIps, ObjKey};

/// Follows which gateway each node belongs to and holds nodes that move.
pub(crate) struct Moves {
    lanes: Vec<Lane>,
    gateways: Option<Arc<Gateways>>,
    bound: Duration,
    /// node → its gateway, as last seen.
    gateway_of: HashMap<String, String>,
    /// Where each move's task is spawned (supervised: a panic stops the watcher).
    tasks: Tasks,
}

impl Moves {
    pub(crate) fn new(lanes: &[Lane], bound: Duration, tasks: Tasks) -> Self {
        Self {
            tasks,
            gateways: lanes.first().and_then(|l| l.config().gateways.clone()),
            lanes: lanes.to_vec(),
            bound,
            gateway_of: HashMap::new(),
        }
    }

    fn lane(&self, gateway: &str) -> Option<&Lane> {
        self.lanes.iter().find(|l| l.gateway() == gateway)
    }

    /// Node `name` was seen at event `seq` (before the lanes apply it).
    pub(crate) fn node_seen(&mut self, name: &str, node: &Node, seq: u64) {
        let Some(gateways) = &self.gateways else {
            return;
        };
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let Some(new) = gateways.gateway_of_node(&labels).map(|g| g.name.clone()) else {
            self.gateway_of.remove(name);
            return;
        };
        let old = self.gateway_of.insert(name.to_owned(), new.clone());
        let Some(old) = old.filter(|o| *o != new) else {
            return;
        };
        let (Some(old_lane), Some(new_lane)) = (self.lane(&old).cloned(), self.lane(&new).cloned())
        else {
            return;
        };
        let ips: Vec<IpAddr> = NodeIps::of(&ObjKey::cluster(name), node).all().collect();
        old_lane.feed(|t| t.hold_node(name, true));
        // The new gateway's topology gains the node: its next resync declares it (node agents'
        // writes at the node's IPs are checked against it).
        new_lane.resync_soon();
        tracing::info!(
            node = name,
            from = %old,
            to = %new,
            bound = ?self.bound,
            "node moved to another gateway: kept at the old one until the new one has programmed it"
        );
        let name = name.to_owned();
        let bound = self.bound;
        self.tasks.spawn(NODE_MOVE, async move {
            if fault_point!(new_lane.config().faults, NODE_MOVE) {
                return Ended::failed(NODE_MOVE, "it returned before releasing its node");
            }
            let programmed = tokio::time::timeout(bound, programmed(&new_lane, &ips, seq)).await;
            if programmed.is_err() {
                tracing::warn!(node = %name, from = %old, to = %new, ?bound, "the new gateway has not programmed the moved node in time; releasing it from the old one anyway");
            }
            let mut n = 0;
            old_lane.feed(|t| {
                let d = t.hold_node(&name, false);
                n = d.len();
                d
            });
            // The old gateway's topology loses the node.
            old_lane.resync_soon();
            tracing::info!(node = %name, from = %old, to = %new, updates = n, "moved node released from the old gateway");
            Ended::Done
        });
    }

    /// Node `name` was deleted.
    pub(crate) fn node_gone(&mut self, name: &str) {
        self.gateway_of.remove(name);
    }
}

/// Waits until `lane` has sent event `seq` and its gateway has every address desired at `ips`
/// actual, following `Writer.WatchLocations` (verb `write`, no Admin permission): the server
/// pushes the answers, nothing polls. A stream that fails or ends is opened again after the
/// server backoff.
async fn programmed(lane: &Lane, ips: &[IpAddr], seq: u64) {
    let mut acked = lane.acked();
    if acked.wait_for(|a| *a >= seq).await.is_err() {
        std::future::pending::<()>().await;
    }
    let config = lane.config();
    let mut conn = Conn::new(&config.server);
    let mut backoff = ServerBackoff::new(config.backoff_initial, config.backoff_max);
    let locations: Vec<String> = ips.iter().map(ToString::to_string).collect();
    loop {
        match follow(&mut conn, &locations).await {
            Ok(()) => return,
            Err(e) => {
                tracing::debug!(error = %e, "WatchLocations failed; watching again");
                conn.reset();
                tokio::time::sleep(backoff.next_delay(&e)).await;
            }
        }
    }
}

/// Follows `Writer.WatchLocations` until every location of `locations` is programmed.
async fn follow(conn: &mut Conn, locations: &[String]) -> Result<(), ClientError> {
    const RPC: &str = "Writer.WatchLocations";
    let client = conn.get().await?;
    let mut stream = client
        .writer(WATCHER_WRITER)
        .watch_locations(locations.to_vec())
        .await?;
    let mut programmed: HashMap<String, bool> = HashMap::new();
    loop {
        match stream.message().await {
            Ok(Some(m)) => {
                programmed.extend(m.locations.into_iter().map(|l| (l.location, l.programmed)));
                if locations.iter().all(|l| programmed.get(l) == Some(&true)) {
                    return Ok(());
                }
            }
            Ok(None) => {
                return Err(ClientError::StreamClosed {
                    rpc: RPC,
                    batch_id: 0,
                });
            }
            Err(status) => return Err(ClientError::Rpc { rpc: RPC, status }),
        }
    }
}
