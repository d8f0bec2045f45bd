//! A map kept as a sorted vector: for the many small maps of the tracker (addresses of one
//! location, locations of one service) it holds each entry in its own size with little slack,
//! where a hash map would hold 1.2–2.5 buckets per entry. Lookups are binary searches, inserts
//! and removals move the entries after the slot: both proportional to the map, which is one
//! location or one service, never the cluster.

/// A small ordered map with bounded spare capacity.
#[derive(Debug, Clone)]
pub(crate) struct VecMap<K, V> {
    entries: Vec<(K, V)>,
}

impl<K, V> Default for VecMap<K, V> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<K: Ord + Copy, V> VecMap<K, V> {
    fn find(&self, key: &K) -> Result<usize, usize> {
        self.entries.binary_search_by(|(k, _)| k.cmp(key))
    }

    /// The value at `key`.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.find(key).ok().map(|i| &self.entries[i].1)
    }

    /// The value at `key`, inserted as `V::default()` if absent.
    pub fn get_or_insert_default(&mut self, key: K) -> &mut V
    where
        V: Default,
    {
        let i = match self.find(&key) {
            Ok(i) => i,
            Err(i) => {
                if self.entries.len() == self.entries.capacity() {
                    // Grow by an eighth, not double: memory matters more than insert cost here.
                    self.entries.reserve_exact(1 + self.entries.len() / 8);
                }
                self.entries.insert(i, (key, V::default()));
                i
            }
        };
        &mut self.entries[i].1
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let i = self.find(key).ok()?;
        let (_, v) = self.entries.remove(i);
        if self.entries.capacity() > 8 && self.entries.len() < self.entries.capacity() / 2 {
            self.entries
                .shrink_to(self.entries.len() + self.entries.len() / 8);
        }
        Some(v)
    }

    /// Entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::VecMap;

    #[test]
    fn keeps_entries_sorted_and_slack_bounded() {
        let mut m: VecMap<u32, u32> = VecMap::default();
        for k in (0..1000).rev() {
            *m.get_or_insert_default(k) += k;
        }
        assert_eq!(m.entries.len(), 1000);
        assert!(m.iter().map(|(k, _)| *k).eq(0..1000));
        assert!(m.entries.capacity() <= 1000 + 1000 / 8 + 1);
        for k in 0..900 {
            assert_eq!(m.remove(&k), Some(k));
        }
        assert_eq!(m.get(&950), Some(&950));
        assert!(m.entries.capacity() <= 200);
    }
}
