//! The readiness gate's view of the state servers: per lane, one `Writer.WatchAddresses` stream
//! over the addresses its pending pods wait for. The set changes on the open stream (`watch`,
//! `unwatch` messages): a pod that becomes pending or opens costs one small message, not a new
//! stream. The stream is opened when the lane's set first holds something and kept while it
//! lives; one that fails or ends is opened again after the server backoff, with the whole set.
//! The server pushes an answer for each address watched, then each change; nothing polls.

use std::collections::HashMap;
use std::time::Duration;

use clb_client::{ClientError, ConnectOptions};
use clb_proto::v1::{AddressQuery, AddressesState, AddressesWatch};
use futures::channel::mpsc::{UnboundedSender, unbounded};
use tokio::sync::mpsc;

use crate::backoff::ServerBackoff;
use crate::config::{WATCHER_WRITER, WatcherConfig};
use crate::sender::Conn;

/// One address a pod waits for: (location, address, service), as the server echoes it.
pub(super) type AddressKey = (String, String, String);

/// What a lane's stream tells the gate: answers, or its end.
pub(super) struct Pushed {
    /// The lane.
    pub(super) lane: usize,
    /// The stream it came from ([`LaneStream`] opens a new generation each time).
    generation: u64,
    /// Answers, or why the stream ended.
    answer: Result<AddressesState, ClientError>,
}

fn query((location, address, service): &AddressKey) -> AddressQuery {
    AddressQuery {
        location: location.clone(),
        address: address.clone(),
        service_id: service.clone(),
    }
}

/// One lane's stream and the addresses it watches.
pub(super) struct LaneStream {
    server: ConnectOptions,
    /// Each address the lane's pending pods wait for: how many pods, and the server's answer once
    /// the open stream gave it.
    wanted: HashMap<AddressKey, (usize, Option<bool>)>,
    /// Changes of `wanted` not sent yet.
    added: Vec<AddressKey>,
    removed: Vec<AddressKey>,
    /// The open stream's changes (`None`: closed).
    changes: Option<UnboundedSender<AddressesWatch>>,
    /// The reader of the open stream.
    task: Option<tokio::task::JoinHandle<()>>,
    generation: u64,
    backoff: ServerBackoff,
    /// A failed stream is opened again only once this passes (the gate's timer wakes it).
    closed_until: Option<tokio::time::Instant>,
}

impl Drop for LaneStream {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl LaneStream {
    pub(super) fn new(config: &WatcherConfig) -> Self {
        Self {
            server: config.server.clone(),
            wanted: HashMap::new(),
            added: Vec::new(),
            removed: Vec::new(),
            changes: None,
            task: None,
            generation: 0,
            backoff: ServerBackoff::new(config.backoff_initial, config.backoff_max),
            closed_until: None,
        }
    }

    /// One more pod waits for `key`.
    pub(super) fn want(&mut self, key: AddressKey) {
        let entry = self.wanted.entry(key.clone()).or_insert((0, None));
        entry.0 += 1;
        if entry.0 == 1 {
            self.added.push(key);
        }
    }

    /// One pod fewer waits for `key`.
    pub(super) fn unwant(&mut self, key: &AddressKey) {
        let Some(entry) = self.wanted.get_mut(key) else {
            return;
        };
        entry.0 -= 1;
        if entry.0 == 0 {
            self.wanted.remove(key);
            self.removed.push(key.clone());
        }
    }

    /// Whether the server said NRP has `key` (false while unanswered).
    pub(super) fn programmed(&self, key: &AddressKey) -> bool {
        self.wanted.get(key).is_some_and(|(_, a)| *a == Some(true))
    }

    /// Sends the changes of the set on the open stream; opens one when there is none and the set
    /// holds something (unless a failed one waits for its backoff). Pushes go to `pushed`.
    pub(super) fn sync(&mut self, lane: usize, pushed: &mpsc::UnboundedSender<Pushed>) {
        let added = std::mem::take(&mut self.added);
        let removed = std::mem::take(&mut self.removed);
        if let Some(changes) = &self.changes {
            if added.is_empty() && removed.is_empty() {
                return;
            }
            let message = AddressesWatch {
                watch: added
                    .iter()
                    .filter(|k| self.wanted.contains_key(*k))
                    .map(query)
                    .collect(),
                unwatch: removed.iter().map(query).collect(),
                ..AddressesWatch::default()
            };
            if changes.unbounded_send(message).is_ok() {
                return;
            }
        }
        let waiting = self
            .closed_until
            .is_some_and(|t| tokio::time::Instant::now() < t);
        if self.wanted.is_empty() || waiting {
            self.close();
            return;
        }
        self.open(lane, pushed);
    }

    fn close(&mut self) {
        self.changes = None;
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Opens a stream over the whole set; answers start afresh.
    fn open(&mut self, lane: usize, pushed: &mpsc::UnboundedSender<Pushed>) {
        self.close();
        self.generation += 1;
        self.closed_until = None;
        for (_, answer) in self.wanted.values_mut() {
            *answer = None;
        }
        let watch: Vec<AddressQuery> = self.wanted.keys().map(query).collect();
        let (tx, rx) = unbounded();
        self.changes = Some(tx);
        let generation = self.generation;
        let server = self.server.clone();
        let pushed = pushed.clone();
        self.task = Some(tokio::spawn(async move {
            let send = |answer| {
                let _ = pushed.send(Pushed {
                    lane,
                    generation,
                    answer,
                });
            };
            if let Err(e) = follow(&server, watch, rx, &send).await {
                send(Err(e));
            }
        }));
    }

    /// Takes what a stream pushed; `Some(delay)` when the stream ended: it is opened again once
    /// `delay` passed (arm a timer, then [`LaneStream::sync`]). Pushes of an older stream are
    /// ignored.
    pub(super) fn pushed(&mut self, p: Pushed) -> Option<Duration> {
        if p.generation != self.generation {
            return None;
        }
        match p.answer {
            Ok(state) => {
                self.backoff.reset();
                for a in state.addresses {
                    let Some(q) = a.query else { continue };
                    if let Some(entry) = self.wanted.get_mut(&(q.location, q.address, q.service_id))
                    {
                        entry.1 = Some(a.programmed);
                    }
                }
                None
            }
            Err(e) => {
                tracing::debug!(error = %e, "readiness gate: WatchAddresses ended; watching again");
                self.close();
                let delay = self.backoff.next_delay(&e);
                self.closed_until = Some(tokio::time::Instant::now() + delay);
                Some(delay)
            }
        }
    }
}

/// Opens `Writer.WatchAddresses` over `watch` with `changes` and forwards what it pushes to
/// `send`, until it fails or ends.
async fn follow(
    server: &ConnectOptions,
    watch: Vec<AddressQuery>,
    changes: futures::channel::mpsc::UnboundedReceiver<AddressesWatch>,
    send: &impl Fn(Result<AddressesState, ClientError>),
) -> Result<(), ClientError> {
    const RPC: &str = "Writer.WatchAddresses";
    let client = Conn::new(server).get().await?;
    let mut stream = client
        .writer(WATCHER_WRITER)
        .watch_addresses(watch, changes)
        .await?;
    loop {
        match stream.message().await {
            Ok(Some(state)) => send(Ok(state)),
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
