//! What the Writer service tells writers about themselves and their services, without the
//! operator's Admin API: the writer's session (does the server hold its resync? which epoch? the
//! sequence of its last recorded resync) in every answer and as a stream (`WatchSession`), the
//! programming state of the gateway's services as a stream (`WatchServices`). What writers wait for
//! (`WatchLocations`, `WatchAddresses`) is pushed by `awaits.rs`.
//!
//! Both streams are pushed and take no lock. A `WatchSession` task follows only its writer's
//! session channel ([`crate::state::sessions`]) and its replica's leadership: another writer's
//! resync or a change of services does not wake it. A `WatchServices` task follows its gateway's
//! services snapshot ([`crate::state::services`], published by the gateway's task after changes,
//! at most every [`crate::state::push::SNAPSHOT_SPACING`]) and applies each publication's delta,
//! so a change of services it does not follow costs it nothing. An idle server wakes none. A
//! stream ends with `UNAVAILABLE` when its replica stops leading or its state starts afresh (a new
//! epoch): the writer then reconnects to the leader and resyncs.

use std::pin::Pin;
use std::sync::Arc;

use clb_proto::v1::{ServiceState, ServiceStates, WriterSession};
use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::convert::{
    condition_to_proto, ip_family_to_proto, port_to_proto, service_kind, settings_to_proto,
};
use crate::state::services::{KindDelta, Records, ServiceRecord};
use crate::state::sessions::WriterState;
use crate::state::{Gateway, GatewayHandle, GatewaySnapshot, StateServer};

/// The stream of `WatchSession`.
pub type SessionStream = Pin<Box<dyn Stream<Item = Result<WriterSession, Status>> + Send>>;
/// The stream of `WatchServices`.
pub type ServiceStatesStream = Pin<Box<dyn Stream<Item = Result<ServiceStates, Status>> + Send>>;

/// Most inbound services in one `ServiceStates` message; a larger snapshot or change is split.
const MAX_SERVICES_PER_MESSAGE: usize = 1_000;

/// The session of a writer whose state in gateway `gateway` is `writer`.
fn session_of(state: &StateServer, gateway: &str, writer: WriterState) -> WriterSession {
    WriterSession {
        server_id: state.config().server_id.clone(),
        epoch: state.epoch(),
        resynced: writer.resynced,
        gateway: gateway.to_owned(),
        resync_sequence: writer.resync_sequence,
    }
}

/// Follows `handle`'s services snapshot: the receiver and the first snapshot built after this call.
async fn follow(
    handle: &GatewayHandle,
) -> Option<(
    tokio::sync::watch::Receiver<Arc<GatewaySnapshot>>,
    Arc<GatewaySnapshot>,
)> {
    let (mut rx, at) = handle.subscribe();
    let first = rx.wait_for(|s| s.changes >= at).await.ok()?.clone();
    Some((rx, first))
}

/// The session of writer `writer` in gateway `g`.
pub fn session(state: &StateServer, g: &Gateway, writer: &str) -> WriterSession {
    session_of(state, g.name(), g.writer_state(writer))
}

/// The status that ends a stream whose replica stopped leading or started afresh.
fn ended() -> Status {
    Status::unavailable(
        "the state server's state started afresh (a restart, a fail-over, or this replica stopped \
         leading): reconnect, resync, and watch again",
    )
}

/// Runs `body` as the producer of a bounded stream; the task ends when the receiver is dropped
/// (`tx.closed()` in `body`'s waits) or `body` returns.
pub(super) fn spawn_stream<T, F>(
    body: impl FnOnce(mpsc::Sender<Result<T, Status>>) -> F,
) -> ReceiverStream<Result<T, Status>>
where
    T: Send + 'static,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(body(tx));
    ReceiverStream::new(rx)
}

/// The server's shutdown signal (`None`: a service without one, never shut down).
pub type Shutdown = Option<tokio::sync::watch::Receiver<bool>>;

/// Resolves once `shutdown` is signalled (never without one).
pub(super) async fn shut_down(shutdown: &mut Shutdown) {
    match shutdown {
        Some(rx) => {
            if rx.wait_for(|stop| *stop).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

/// Waits for a change worth a re-read: a new snapshot, the leadership; `false` when the stream is
/// to end: the reader is gone, or the server shuts down (the reader is told `UNAVAILABLE`, so
/// that a graceful shutdown is not held up by open streams).
async fn wait_for_change<T, S>(
    followed: &mut tokio::sync::watch::Receiver<S>,
    leadership: &mut tokio::sync::watch::Receiver<bool>,
    shutdown: &mut Shutdown,
    tx: &mpsc::Sender<Result<T, Status>>,
) -> bool {
    tokio::select! {
        r = followed.changed() => r.is_ok(),
        r = leadership.changed() => r.is_ok(),
        () = tx.closed() => false,
        () = shut_down(shutdown) => {
            tell_shutdown(tx, "resync").await;
            false
        }
    }
}

/// Tells the reader of a stream that the server shuts down (`UNAVAILABLE`): it reconnects to the
/// next leader and does `then` (resync, watch again).
pub(super) async fn tell_shutdown<T>(tx: &mpsc::Sender<Result<T, Status>>, then: &str) {
    let _ = tx
        .send(Err(Status::unavailable(format!(
            "the state server is shutting down: reconnect (to the next leader) and {then}"
        ))))
        .await;
}

/// Whether the stream may go on: this replica leads in the epoch the stream began in. If not, the
/// reader is told so ([`ended`]).
pub(super) async fn still_current<T>(
    state: &StateServer,
    epoch: u64,
    tx: &mpsc::Sender<Result<T, Status>>,
) -> bool {
    if state.is_leader() && state.epoch() == epoch {
        return true;
    }
    let _ = tx.send(Err(ended())).await;
    false
}

/// `WatchSession`: the session now, then each change, until the epoch changes. The task wakes
/// only when its writer's session changes or leadership does (each wake-up counted:
/// `clb_server_session_wakeups_total`).
pub fn watch_session(
    state: Arc<StateServer>,
    handle: Arc<GatewayHandle>,
    writer: String,
    mut shutdown: Shutdown,
) -> SessionStream {
    let stream = spawn_stream(move |tx| async move {
        let epoch = state.epoch();
        let mut leadership = state.leadership();
        let mut mine = handle.sessions().follow(&writer);
        let mut last: Option<WriterSession> = None;
        loop {
            if !still_current(&state, epoch, &tx).await {
                return;
            }
            let now = session_of(&state, handle.name(), *mine.borrow_and_update());
            if last.as_ref() != Some(&now) {
                if tx.send(Ok(now.clone())).await.is_err() {
                    return;
                }
                last = Some(now);
            }
            if !wait_for_change(&mut mine, &mut leadership, &mut shutdown, &tx).await {
                return;
            }
            state.metrics().session_woken();
        }
    });
    Box::pin(stream)
}

/// A service's record as the proto `ServiceState` of gateway `gateway` (`actual_locations` not
/// counted: 0).
fn record_to_proto(gateway: &str, r: &ServiceRecord) -> ServiceState {
    let v = &r.view;
    ServiceState {
        gateway: gateway.to_owned(),
        service_id: v.name.clone(),
        kind: service_kind(v.kind) as i32,
        desired: v.desired,
        actual: v.actual,
        desired_addresses: u64::from(v.desired_addresses),
        actual_addresses: u64::from(v.actual_addresses),
        desired_locations: v.locations as u64,
        actual_locations: 0,
        ports: r.ports.iter().map(port_to_proto).collect(),
        frontend_ip: r.frontend_ip.clone(),
        condition: Some(condition_to_proto(r.condition.clone())),
        ip_family: ip_family_to_proto(r.family) as i32,
        settings: r.settings.as_ref().map(settings_to_proto),
        nat_gateway: r.nat_gateway.clone(),
        nat_gateway_missing: r.nat_gateway_missing,
    }
}

/// What a follower sends for one publication: the delta when it is one publication behind
/// (`None`: nothing of what it follows changed), else (the first, or after missed publications) a
/// comparison of the full maps.
fn changes_of(
    sent: &GatewaySnapshot,
    now: &GatewaySnapshot,
    first: bool,
    include_outbound: bool,
) -> (Vec<Arc<ServiceRecord>>, Vec<String>) {
    let kinds = if include_outbound { 2 } else { 1 };
    let mut changed = Vec::new();
    let mut gone = Vec::new();
    if !first && now.seq == sent.seq + 1 {
        for delta in [&now.inbound_delta, &now.outbound_delta]
            .into_iter()
            .take(kinds)
        {
            changed.extend(delta.changed.iter().cloned());
            gone.extend(delta.gone.iter().cloned());
        }
    } else if !first && now.seq == sent.seq {
        return (changed, gone);
    } else {
        let empty = Records::default();
        for (n, before) in [
            (&now.inbound, &sent.inbound),
            (&now.outbound, &sent.outbound),
        ]
        .into_iter()
        .take(kinds)
        {
            let delta = KindDelta::between(if first { &empty } else { before }, n);
            changed.extend(delta.changed);
            gone.extend(delta.gone);
        }
    }
    changed.sort_by(|a, b| a.view.name.cmp(&b.view.name));
    gone.sort();
    (changed, gone)
}

/// `WatchServices`: a snapshot of the gateway's inbound services (and its outbound ones with
/// `include_outbound`), then their changes, until the epoch changes.
pub fn watch_services(
    state: Arc<StateServer>,
    handle: Arc<GatewayHandle>,
    writer: String,
    include_outbound: bool,
    mut shutdown: Shutdown,
) -> ServiceStatesStream {
    let stream = spawn_stream(move |tx| async move {
        let epoch = state.epoch();
        let mut leadership = state.leadership();
        let mut sent: Arc<GatewaySnapshot> = Arc::default();
        let mut sent_observed = false;
        let mut first = true;
        let Some((mut snapshots, _)) = follow(&handle).await else {
            return;
        };
        loop {
            if !still_current(&state, epoch, &tx).await {
                return;
            }
            let snapshot = snapshots.borrow_and_update().clone();
            let observed = snapshot.nrp_observed;
            let (changed, gone) = changes_of(&sent, &snapshot, first, include_outbound);
            if first || !changed.is_empty() || !gone.is_empty() || observed != sent_observed {
                let session = session_of(&state, handle.name(), handle.sessions().get(&writer));
                let changed = changed
                    .iter()
                    .map(|r| record_to_proto(handle.name(), r))
                    .collect();
                let messages = split(changed, gone, first, observed, &session);
                for m in messages {
                    if tx.send(Ok(m)).await.is_err() {
                        return;
                    }
                }
                sent_observed = observed;
                first = false;
            }
            sent = snapshot;
            if !wait_for_change(&mut snapshots, &mut leadership, &mut shutdown, &tx).await {
                return;
            }
        }
    });
    Box::pin(stream)
}

/// One change as messages of at most [`MAX_SERVICES_PER_MESSAGE`] services; only the first of a
/// snapshot says `snapshot`, the last carries `gone`.
fn split(
    changed: Vec<ServiceState>,
    gone: Vec<String>,
    snapshot: bool,
    nrp_observed: bool,
    session: &WriterSession,
) -> Vec<ServiceStates> {
    let mut out: Vec<ServiceStates> = changed
        .chunks(MAX_SERVICES_PER_MESSAGE)
        .enumerate()
        .map(|(i, chunk)| ServiceStates {
            session: Some(session.clone()),
            snapshot: snapshot && i == 0,
            nrp_observed,
            services: chunk.to_vec(),
            gone_service_ids: Vec::new(),
        })
        .collect();
    match out.last_mut() {
        Some(last) => last.gone_service_ids = gone,
        None => out.push(ServiceStates {
            session: Some(session.clone()),
            snapshot,
            nrp_observed,
            services: Vec::new(),
            gone_service_ids: gone,
        }),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(id: &str) -> ServiceState {
        ServiceState {
            service_id: id.to_owned(),
            ..ServiceState::default()
        }
    }

    #[test]
    fn a_large_change_is_split_and_only_its_first_message_is_the_snapshot() {
        let session = WriterSession::default();
        let changed: Vec<ServiceState> = (0..2_500).map(|i| st(&format!("s{i:05}"))).collect();
        let out = split(changed, vec!["old".into()], true, true, &session);
        assert_eq!(out.len(), 3);
        assert!(out[0].snapshot && !out[1].snapshot && !out[2].snapshot);
        assert_eq!(
            out.iter().map(|m| m.services.len()).collect::<Vec<_>>(),
            [1_000, 1_000, 500]
        );
        assert!(out[0].gone_service_ids.is_empty() && out[2].gone_service_ids == ["old"]);
        let only_gone = split(Vec::new(), vec!["x".into()], false, true, &session);
        assert_eq!(only_gone.len(), 1);
        assert_eq!(only_gone[0].gone_service_ids, ["x"]);
    }
}
