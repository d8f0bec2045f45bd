//! A FIFO set: each key once, oldest first, so the dispatcher serves changes in arrival order.

use std::borrow::Borrow;
use std::collections::VecDeque;

use foldhash::HashSet;
use std::hash::Hash;

/// Keys waiting to be re-diffed.
#[derive(Debug, Clone)]
pub(crate) struct DirtyQueue<K> {
    order: VecDeque<K>,
    members: HashSet<K>,
}

impl<K> Default for DirtyQueue<K> {
    fn default() -> Self {
        Self {
            order: VecDeque::new(),
            members: HashSet::default(),
        }
    }
}

impl<K: Hash + Eq + Clone> DirtyQueue<K> {
    /// Adds a key unless it is already waiting.
    pub fn push(&mut self, key: K) {
        if self.members.insert(key.clone()) {
            self.order.push_back(key);
        }
    }

    /// Whether a key is waiting.
    pub fn contains<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.members.contains(key)
    }

    /// Puts a key at the front (work taken out and given back keeps its place), unless waiting.
    pub fn push_front(&mut self, key: K) {
        if self.members.insert(key.clone()) {
            self.order.push_front(key);
        }
    }

    /// Takes the oldest key.
    pub fn pop(&mut self) -> Option<K> {
        let key = self.order.pop_front()?;
        self.members.remove(&key);
        Some(key)
    }

    /// Number of keys waiting.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether no key waits.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The keys waiting, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &K> + '_ {
        self.order.iter()
    }

    /// Takes every key, oldest first.
    pub fn drain(&mut self) -> impl Iterator<Item = K> + '_ {
        self.members.clear();
        self.order.drain(..)
    }
}
