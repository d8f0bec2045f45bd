//! The followers of what writers wait for (`WatchLocations`, `WatchAddresses`): each registers
//! what it awaits ([`Awaiting`]) with its gateway; the gateway's task answers every follower of the
//! gateway after each change, under the lock it holds anyway (at most every
//! [`super::push::SNAPSHOT_SPACING`]), and wakes only the followers owed an answer. A follower's
//! stream takes its owed answers without the gateway's lock. No follower: nothing is answered.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use clb_core::gateway::GatewayCore;
use clb_core::gateway::programmed::{Awaited, Awaiting};
use tokio::sync::Notify;

use super::GatewayHandle;

/// One follower: what it awaits, and the signal that it is owed answers.
#[derive(Debug, Default)]
struct Follower {
    awaiting: Mutex<Awaiting>,
    owed: Notify,
}

impl Follower {
    fn lock(&self) -> MutexGuard<'_, Awaiting> {
        self.awaiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The followers of one gateway.
#[derive(Debug, Default)]
pub struct Awaits {
    followers: Mutex<HashMap<u64, Arc<Follower>>>,
    next: AtomicU64,
    count: AtomicUsize,
}

impl Awaits {
    fn followers(&self) -> MutexGuard<'_, HashMap<u64, Arc<Follower>>> {
        self.followers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any follower is registered.
    pub fn followed(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    /// Answers every follower against `gateway`, waking those owed an answer (the gateway's task
    /// calls it under the gateway's lock). O(things awaited).
    pub fn refresh(&self, gateway: &GatewayCore) {
        for follower in self.followers().values() {
            if follower.lock().refresh(gateway) {
                follower.owed.notify_one();
            }
        }
    }

    fn register(&self) -> (u64, Arc<Follower>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let follower = Arc::new(Follower::default());
        self.followers().insert(id, follower.clone());
        self.count.fetch_add(1, Ordering::Relaxed);
        (id, follower)
    }

    fn remove(&self, id: u64) {
        if self.followers().remove(&id).is_some() {
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A registered follower of a gateway; dropping it unregisters it.
#[derive(Debug)]
pub struct AwaitFollower {
    handle: Arc<GatewayHandle>,
    id: u64,
    follower: Arc<Follower>,
}

impl AwaitFollower {
    /// Registers a follower of `handle` that awaits nothing yet.
    pub fn new(handle: Arc<GatewayHandle>) -> Self {
        let (id, follower) = handle.awaits().register();
        Self {
            handle,
            id,
            follower,
        }
    }

    /// Awaits `watch` from now on and no longer `unwatch`; the first answers of what is new come
    /// at the gateway task's next step, which this wakes.
    pub fn change(&self, watch: Vec<Awaited>, unwatch: &[Awaited]) {
        {
            let mut awaiting = self.follower.lock();
            for a in unwatch {
                awaiting.unwatch(a);
            }
            for a in watch {
                awaiting.watch(a);
            }
        }
        self.handle.changed();
    }

    /// The answers owed (new or changed, in the order their things began to be awaited), once
    /// there are any.
    pub async fn owed(&self) -> Vec<(Awaited, bool)> {
        loop {
            let owed = self.follower.lock().take_owed();
            if !owed.is_empty() {
                return owed;
            }
            self.follower.owed.notified().await;
        }
    }
}

impl Drop for AwaitFollower {
    fn drop(&mut self) {
        self.handle.awaits().remove(self.id);
    }
}
