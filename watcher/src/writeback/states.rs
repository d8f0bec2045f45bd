//! The programming state of the Services, pushed by the state server: one `Writer.WatchServices`
//! stream per gateway the write-back follows, egresses included (`include_outbound`: the Events
//! about brought NAT gateways, `egress.rs`) (authorized by the watcher's verb `write`; no Admin
//! permission needed), kept in a local table that the write-back reads without a call. A change
//! pokes the Services it concerns ([`Pushed`], through a bounded channel: a write-back that falls
//! behind holds the stream back); a broken stream marks its gateway unknown (the write-back then
//! waits for it) and is re-opened after a short backoff, its first message a fresh snapshot, which
//! wakes every Service that waited.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use clb_proto::v1::{ServiceKind, ServiceState, ServiceStates};
use tokio::sync::mpsc;

use super::Config;
use crate::backoff::{RECONNECT_MAX, ServerBackoff};
use crate::sender::Conn;
use clb_client::client::ClientError;

/// What one gateway's stream said last.
#[derive(Debug, Default)]
struct GatewayStates {
    /// The stream is open and its snapshot arrived.
    live: bool,
    nrp_observed: bool,
    services: HashMap<String, ServiceState>,
    /// The outbound services (egresses), by name.
    egresses: HashMap<String, ServiceState>,
}

/// What one message of a gateway's stream changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Pushed {
    /// The services (UIDs, or egress names) whose state changed.
    pub(crate) ids: Vec<String>,
    /// A snapshot (the stream was opened anew) or a change of `nrp_observed`: what a Service
    /// waited for without a state of its own may have come.
    pub(crate) fresh: bool,
}

/// A gateway whose stream of service states is down: nothing can be said of its services.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the stream of service states of gateway {gateway:?} is down")]
pub(crate) struct StatesDown {
    pub(crate) gateway: String,
}

/// The table of every followed gateway (cheap to clone: one table).
#[derive(Debug, Clone, Default)]
pub(crate) struct States {
    inner: Arc<Mutex<HashMap<String, GatewayStates>>>,
}

impl States {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, GatewayStates>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Follows `gateways` (`""`: the server's default gateway), sending what each message
    /// changed to `changed`. The tasks end when `changed` is closed.
    pub(crate) fn follow(
        config: &Config,
        gateways: Vec<String>,
        changed: mpsc::Sender<Pushed>,
    ) -> Self {
        let states = Self::default();
        for g in gateways {
            states.lock().insert(g.clone(), GatewayStates::default());
            tokio::spawn(states.clone().run(config.clone(), g, changed.clone()));
        }
        states
    }

    /// The state of service `service_id` in `gateway`: `Ok(None)` when the gateway does not know
    /// it, an error while the gateway's stream is down (nothing can be said).
    pub(crate) fn get(
        &self,
        gateway: &str,
        service_id: &str,
    ) -> Result<Option<ServiceState>, StatesDown> {
        let table = self.lock();
        match table.get(gateway) {
            Some(g) if g.live => Ok(g.services.get(service_id).cloned()),
            _ => Err(StatesDown {
                gateway: gateway.to_owned(),
            }),
        }
    }

    /// The state of egress `name` in `gateway`, when its stream is live and knows it.
    pub(crate) fn egress(&self, gateway: &str, name: &str) -> Option<ServiceState> {
        let table = self.lock();
        table
            .get(gateway)
            .filter(|g| g.live)
            .and_then(|g| g.egresses.get(name).cloned())
    }

    /// Whether each of `gateways` has read NRP back (its stream live): only then does an
    /// unknown service mean that NRP does not have it.
    pub(crate) fn nrp_observed(&self, gateways: &[String]) -> bool {
        let table = self.lock();
        !gateways.is_empty()
            && gateways
                .iter()
                .all(|g| table.get(g).is_some_and(|g| g.live && g.nrp_observed))
    }

    /// Folds one message in; returns what it changed.
    fn fold(&self, gateway: &str, m: ServiceStates) -> Pushed {
        let mut table = self.lock();
        let g = table.entry(gateway.to_owned()).or_default();
        let fresh = m.snapshot || !g.live || g.nrp_observed != m.nrp_observed;
        let mut changed: Vec<String> = Vec::new();
        if m.snapshot {
            let listed: std::collections::HashSet<&str> =
                m.services.iter().map(|s| s.service_id.as_str()).collect();
            for map in [&mut g.services, &mut g.egresses] {
                changed.extend(map.keys().filter(|k| !listed.contains(k.as_str())).cloned());
                map.retain(|k, _| listed.contains(k.as_str()));
            }
        }
        g.live = true;
        g.nrp_observed = m.nrp_observed;
        for s in m.services {
            changed.push(s.service_id.clone());
            if s.kind == ServiceKind::Outbound as i32 {
                g.egresses.insert(s.service_id.clone(), s);
            } else {
                g.services.insert(s.service_id.clone(), s);
            }
        }
        for id in m.gone_service_ids {
            g.services.remove(&id);
            g.egresses.remove(&id);
            changed.push(id);
        }
        Pushed {
            ids: changed,
            fresh,
        }
    }

    fn down(&self, gateway: &str) {
        if let Some(g) = self.lock().get_mut(gateway) {
            g.live = false;
        }
    }

    async fn run(self, config: Config, gateway: String, changed: mpsc::Sender<Pushed>) {
        let mut conn = Conn::new(&config.server);
        let mut backoff = ServerBackoff::new(config.backoff_initial, RECONNECT_MAX);
        let writer = crate::config::WATCHER_WRITER;
        loop {
            let failure = match conn.get().await {
                Err(e) => e,
                Ok(client) => {
                    let client = if gateway.is_empty() {
                        client
                    } else {
                        client.with_gateway(&gateway)
                    };
                    match client.writer(writer).watch_services_with(true).await {
                        Err(e) => e,
                        Ok(mut stream) => loop {
                            match stream.message().await {
                                Ok(Some(m)) => {
                                    backoff.reset();
                                    let pushed = self.fold(&gateway, m);
                                    if (pushed.fresh || !pushed.ids.is_empty())
                                        && changed.send(pushed).await.is_err()
                                    {
                                        return;
                                    }
                                }
                                Ok(None) => {
                                    break ClientError::StreamClosed {
                                        rpc: "Writer.WatchServices",
                                        batch_id: 0,
                                    };
                                }
                                Err(status) => {
                                    break ClientError::Rpc {
                                        rpc: "Writer.WatchServices",
                                        status,
                                    };
                                }
                            }
                        },
                    }
                }
            };
            self.down(&gateway);
            if changed.is_closed() {
                return;
            }
            if let ClientError::InvalidEndpoint { .. } = failure {
                tracing::error!(error = %failure, "write-back cannot follow the service states");
                return;
            }
            tracing::warn!(gateway, error = %failure, "write-back: the stream of service states ended; reopening");
            conn.reset();
            tokio::time::sleep(backoff.next_delay(&failure)).await;
        }
    }
}

#[cfg(test)]
mod snapshot_timing;

#[cfg(test)]
mod tests {
    use super::*;

    fn st(id: &str, actual: bool) -> ServiceState {
        ServiceState {
            service_id: id.to_owned(),
            actual,
            ..ServiceState::default()
        }
    }

    #[test]
    fn a_snapshot_replaces_the_table_and_changes_and_gone_follow() {
        let states = States::default();
        let down = Err(StatesDown {
            gateway: String::new(),
        });
        assert_eq!(
            states.get("", "a"),
            down,
            "unknown before the first snapshot"
        );
        let changed = states.fold(
            "",
            ServiceStates {
                snapshot: true,
                nrp_observed: false,
                services: vec![st("a", false), st("b", false)],
                ..ServiceStates::default()
            },
        );
        assert_eq!(changed.ids, ["a", "b"]);
        assert!(changed.fresh, "a snapshot");
        assert!(!states.nrp_observed(&[String::new()]));
        let changed = states.fold(
            "",
            ServiceStates {
                nrp_observed: true,
                services: vec![st("a", true)],
                gone_service_ids: vec!["b".into()],
                ..ServiceStates::default()
            },
        );
        assert_eq!(changed.ids, ["a", "b"]);
        assert!(changed.fresh, "NRP observed now");
        assert!(states.get("", "a").unwrap().unwrap().actual);
        assert_eq!(states.get("", "b"), Ok(None));
        assert!(states.nrp_observed(&[String::new()]));
        // A new snapshot (a re-opened stream) drops what it does not list.
        let changed = states.fold(
            "",
            ServiceStates {
                snapshot: true,
                services: vec![st("c", false)],
                ..ServiceStates::default()
            },
        );
        assert_eq!(changed.ids, ["a", "c"]);
        assert_eq!(states.get("", "a"), Ok(None));
        // Egresses are kept apart (by name), dropped by `gone` like the others.
        let egress = ServiceState {
            kind: ServiceKind::Outbound as i32,
            nat_gateway: "natgw-v2".into(),
            ..st("eg", true)
        };
        let changed = states.fold(
            "",
            ServiceStates {
                services: vec![egress.clone()],
                ..ServiceStates::default()
            },
        );
        assert_eq!(changed.ids, ["eg"]);
        assert!(!changed.fresh, "nothing new but the egress");
        assert_eq!(states.egress("", "eg"), Some(egress));
        assert_eq!(states.get("", "eg"), Ok(None), "not an inbound service");
        let changed = states.fold(
            "",
            ServiceStates {
                gone_service_ids: vec!["eg".into()],
                ..ServiceStates::default()
            },
        );
        assert_eq!(changed.ids, ["eg"]);
        assert_eq!(states.egress("", "eg"), None);
        states.down("");
        assert_eq!(states.get("", "c"), down);
        assert!(!states.nrp_observed(&[String::new()]));
    }
}
