//! The addresses of one location, as sorted vectors: for the many small maps of the tracker it holds
//! each entry in its own size with little slack, where a hash map would hold 1.2–2.5 buckets per
//! entry. Keys are kept apart from the values, split by family (an IPv4 key costs 4 bytes, not the
//! 17 of an `IpAddr`), so a lookup is a binary search over a dense array of keys. Inserts and
//! removals move the entries after the slot: proportional to the location, never the cluster.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A small map from address to `V`, ordered as `IpAddr` orders (every IPv4 before every IPv6).
#[derive(Debug, Clone)]
pub(crate) struct AddrMap<V> {
    v4: Vec<Ipv4Addr>,
    v6: Vec<Ipv6Addr>,
    /// The values of the IPv4 keys, then those of the IPv6 keys.
    values: Vec<V>,
}

impl<V> Default for AddrMap<V> {
    fn default() -> Self {
        Self {
            v4: Vec::new(),
            v6: Vec::new(),
            values: Vec::new(),
        }
    }
}

/// Room for one more entry, growing by an eighth, not double: memory matters more than insert
/// cost here.
fn reserve_one<T>(v: &mut Vec<T>) {
    if v.len() == v.capacity() {
        v.reserve_exact(1 + v.len() / 8);
    }
}

/// Gives back spare room once a vector is less than half full.
fn shrink<T>(v: &mut Vec<T>) {
    if v.capacity() > 8 && v.len() < v.capacity() / 2 {
        v.shrink_to(v.len() + v.len() / 8);
    }
}

impl<V> AddrMap<V> {
    /// The position of `key` in `values`, or where it would go.
    fn find(&self, key: &IpAddr) -> Result<usize, usize> {
        match key {
            IpAddr::V4(a) => self.v4.binary_search(a),
            IpAddr::V6(a) => {
                let base = self.v4.len();
                self.v6
                    .binary_search(a)
                    .map(|i| i + base)
                    .map_err(|i| i + base)
            }
        }
    }

    /// The value at `key`.
    pub fn get(&self, key: &IpAddr) -> Option<&V> {
        self.find(key).ok().map(|i| &self.values[i])
    }

    /// The value at `key`, inserted as `V::default()` if absent.
    pub fn get_or_insert_default(&mut self, key: IpAddr) -> &mut V
    where
        V: Default,
    {
        let i = match self.find(&key) {
            Ok(i) => i,
            Err(i) => {
                match key {
                    IpAddr::V4(a) => {
                        reserve_one(&mut self.v4);
                        self.v4.insert(i, a);
                    }
                    IpAddr::V6(a) => {
                        reserve_one(&mut self.v6);
                        self.v6.insert(i - self.v4.len(), a);
                    }
                }
                reserve_one(&mut self.values);
                self.values.insert(i, V::default());
                i
            }
        };
        &mut self.values[i]
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &IpAddr) -> Option<V> {
        let i = self.find(key).ok()?;
        match key {
            IpAddr::V4(_) => {
                self.v4.remove(i);
                shrink(&mut self.v4);
            }
            IpAddr::V6(_) => {
                self.v6.remove(i - self.v4.len());
                shrink(&mut self.v6);
            }
        }
        let v = self.values.remove(i);
        shrink(&mut self.values);
        Some(v)
    }

    /// Entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (IpAddr, &V)> {
        self.v4
            .iter()
            .map(|a| IpAddr::V4(*a))
            .chain(self.v6.iter().map(|a| IpAddr::V6(*a)))
            .zip(self.values.iter())
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::AddrMap;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    fn v4(i: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i))
    }

    fn v6(i: u32) -> IpAddr {
        IpAddr::V6(Ipv6Addr::from(0xfd00_u128 << 112 | u128::from(i)))
    }

    #[test]
    fn keeps_entries_sorted_across_families_and_slack_bounded() {
        let mut m: AddrMap<u32> = AddrMap::default();
        for k in (0..1000).rev() {
            *m.get_or_insert_default(v6(k)) += k;
            *m.get_or_insert_default(v4(k)) += k;
        }
        assert_eq!(m.values.len(), 2000);
        let keys: Vec<IpAddr> = m.iter().map(|(k, _)| k).collect();
        assert!(keys.is_sorted(), "IPv4 first, then IPv6, each sorted");
        let index = |k: IpAddr| match k {
            IpAddr::V4(a) => u32::from(a) - 0x0a00_0000,
            IpAddr::V6(a) => (u128::from(a) & 0xffff_ffff) as u32,
        };
        assert!(m.iter().all(|(k, v)| *v == index(k)));
        assert!(m.values.capacity() <= 2000 + 2000 / 8 + 1);
        for k in 0..900 {
            assert_eq!(m.remove(&v4(k)), Some(k));
            assert_eq!(m.remove(&v6(k)), Some(k));
        }
        assert_eq!(m.remove(&v4(5)), None);
        assert_eq!(m.get(&v4(950)), Some(&950));
        assert_eq!(m.get(&v6(950)), Some(&950));
        assert!(m.values.capacity() <= 400);
        assert!(m.v4.capacity() <= 200);
    }
}
