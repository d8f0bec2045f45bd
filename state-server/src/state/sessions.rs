//! Each writer's session in a gateway on a channel of its own, so that a writer's `WatchSession`
//! stream wakes only when *its* session changes (its resync recorded or forgotten, and the
//! leadership, which the stream follows itself), never for another writer's resync or a change
//! of services: 5,000 node agents cost what their own changes cost (issue 36).
//!
//! The core lists the writers whose session changed ([`GatewayCore::take_session_changes`]); the
//! state layer moves those, and only those, onto their channels under the gateway's lock
//! ([`Gateway::sync_sessions`](super::Gateway::sync_sessions)): the set of resynced writers is
//! kept incrementally, never rebuilt.
//!
//! [`GatewayCore::take_session_changes`]: clb_core::gateway::GatewayCore::take_session_changes

use std::collections::HashMap;
use std::sync::Mutex;

use clb_core::gateway::GatewayCore;
use tokio::sync::watch;

/// One writer's session as the server holds it in a gateway, in this epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterState {
    /// The server holds a completed resync of the writer.
    pub resynced: bool,
    /// The sequence the writer gave its last recorded resync (0: none).
    pub resync_sequence: u64,
}

impl WriterState {
    /// The session of `writer` as `core` holds it.
    pub fn of(core: &GatewayCore, writer: &str) -> Self {
        core.writers()
            .get(writer)
            .map(|w| Self {
                resynced: w.last_resync_unix_ms.is_some(),
                resync_sequence: w.resync_sequence,
            })
            .unwrap_or_default()
    }
}

/// The writers' session channels of one gateway, by writer name. An entry exists for each writer
/// followed or with a session; a writer nobody follows and with nothing held is dropped.
#[derive(Debug, Default)]
pub struct WriterSessions {
    writers: Mutex<HashMap<String, watch::Sender<WriterState>>>,
}

impl WriterSessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<WriterState>>> {
        self.writers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Follows `writer`'s session: the receiver holds its current state.
    pub fn follow(&self, writer: &str) -> watch::Receiver<WriterState> {
        self.lock()
            .entry(writer.to_owned())
            .or_insert_with(|| watch::Sender::new(WriterState::default()))
            .subscribe()
    }

    /// `writer`'s session now.
    pub fn get(&self, writer: &str) -> WriterState {
        self.lock()
            .get(writer)
            .map(|tx| *tx.borrow())
            .unwrap_or_default()
    }

    /// Sets `writer`'s session; wakes its followers only when it changed.
    pub fn set(&self, writer: &str, state: WriterState) {
        let mut writers = self.lock();
        match writers.get(writer) {
            Some(tx) => {
                tx.send_if_modified(|now| {
                    let changed = *now != state;
                    *now = state;
                    changed
                });
                if state == WriterState::default() && tx.receiver_count() == 0 {
                    writers.remove(writer);
                }
            }
            None if state != WriterState::default() => {
                writers.insert(writer.to_owned(), watch::Sender::new(state));
            }
            None => {}
        }
    }

    /// Every writer's session starts afresh (a new epoch: nothing held). Wakes only the
    /// followers of writers that had a session.
    pub fn reset(&self) {
        let mut writers = self.lock();
        for tx in writers.values() {
            tx.send_if_modified(|now| std::mem::take(now) != WriterState::default());
        }
        writers.retain(|_, tx| tx.receiver_count() > 0);
    }

    /// The writers whose resync the server holds (for status and tests; O(writers)).
    pub fn resynced(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .lock()
            .iter()
            .filter(|(_, tx)| tx.borrow().resynced)
            .map(|(w, _)| w.clone())
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_writer_whose_session_changed_is_woken() {
        let sessions = WriterSessions::default();
        let mut a = sessions.follow("node-agent/a");
        let b = sessions.follow("node-agent/b");
        let held = WriterState {
            resynced: true,
            resync_sequence: 7,
        };
        sessions.set("node-agent/a", held);
        assert!(a.has_changed().unwrap());
        assert!(!b.has_changed().unwrap());
        assert_eq!(*a.borrow_and_update(), held);
        // The same state again wakes nobody.
        sessions.set("node-agent/a", held);
        assert!(!a.has_changed().unwrap());
        // A writer nobody follows is kept while it has a session.
        sessions.set("watcher", held);
        assert_eq!(sessions.get("watcher"), held);
        assert_eq!(sessions.resynced(), ["node-agent/a", "watcher"]);
        sessions.reset();
        assert!(a.has_changed().unwrap());
        assert!(!b.has_changed().unwrap());
        assert_eq!(sessions.get("watcher"), WriterState::default());
    }
}
