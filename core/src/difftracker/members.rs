//! The desired addresses of one service, each with the location it is desired at: the index that
//! lets a level endpoints update compare the new set with the old one without scanning the
//! locations, and lets a service that changes dirty exactly the locations that use it.
//!
//! A service with few addresses (the usual Service: tens of endpoints) keeps them in sorted vectors,
//! 8 bytes an IPv4 entry; one with many in hash maps, so that an endpoint joining or leaving it costs
//! O(1), not a shift of the whole vector.
//!
//! An egress is set per pod, never as a whole, so it needs no address index: [`LocationBits`] marks
//! the locations where its pods may be (one bit per location, set when a pod there takes it, cleared
//! when a reader finds no pod there any more). A pod changing egress costs a bit, not an index update.

use foldhash::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::location::LocationId;

/// Above this many addresses the sorted vectors become hash maps (a handful in the crate's tests, so
/// that both forms meet the behaviour tests).
const MANY: usize = if cfg!(test) { 8 } else { 1024 };
/// Below this many, hash maps become sorted vectors again (not at `MANY`: no flapping).
const FEW: usize = MANY / 2;

/// The addresses of one service with their locations.
#[derive(Debug, Clone)]
pub(crate) enum ServiceAddresses {
    /// Sorted by address.
    Few {
        v4: Vec<(Ipv4Addr, LocationId)>,
        v6: Vec<(Ipv6Addr, LocationId)>,
    },
    /// Unordered.
    Many(Box<ManyAddresses>),
}

/// The hash maps of a service with many addresses.
#[derive(Debug, Clone, Default)]
pub(crate) struct ManyAddresses {
    v4: HashMap<Ipv4Addr, LocationId>,
    v6: HashMap<Ipv6Addr, LocationId>,
}

impl Default for ServiceAddresses {
    fn default() -> Self {
        Self::Few {
            v4: Vec::new(),
            v6: Vec::new(),
        }
    }
}

/// Inserts or replaces in a sorted vector, growing it by an eighth.
fn sorted_insert<K: Ord + Copy>(v: &mut Vec<(K, LocationId)>, key: K, location: LocationId) {
    match v.binary_search_by(|(k, _)| k.cmp(&key)) {
        Ok(i) => v[i].1 = location,
        Err(i) => {
            if v.len() == v.capacity() {
                v.reserve_exact(1 + v.len() / 8);
            }
            v.insert(i, (key, location));
        }
    }
}

fn sorted_remove<K: Ord + Copy>(v: &mut Vec<(K, LocationId)>, key: &K) -> Option<LocationId> {
    let i = v.binary_search_by(|(k, _)| k.cmp(key)).ok()?;
    let (_, location) = v.remove(i);
    if v.capacity() > 8 && v.len() < v.capacity() / 2 {
        v.shrink_to(v.len() + v.len() / 8);
    }
    Some(location)
}

fn sorted_get<K: Ord + Copy>(v: &[(K, LocationId)], key: &K) -> Option<LocationId> {
    v.binary_search_by(|(k, _)| k.cmp(key)).ok().map(|i| v[i].1)
}

impl ServiceAddresses {
    /// Number of addresses.
    pub fn len(&self) -> usize {
        match self {
            Self::Few { v4, v6 } => v4.len() + v6.len(),
            Self::Many(m) => m.v4.len() + m.v6.len(),
        }
    }

    /// The location `address` is desired at for this service.
    pub fn get(&self, address: &IpAddr) -> Option<LocationId> {
        match (self, address) {
            (Self::Few { v4, .. }, IpAddr::V4(a)) => sorted_get(v4, a),
            (Self::Few { v6, .. }, IpAddr::V6(a)) => sorted_get(v6, a),
            (Self::Many(m), IpAddr::V4(a)) => m.v4.get(a).copied(),
            (Self::Many(m), IpAddr::V6(a)) => m.v6.get(a).copied(),
        }
    }

    /// Records that `address` is desired at `location` for this service.
    pub fn insert(&mut self, address: IpAddr, location: LocationId) {
        match (&mut *self, address) {
            (Self::Few { v4, .. }, IpAddr::V4(a)) => sorted_insert(v4, a, location),
            (Self::Few { v6, .. }, IpAddr::V6(a)) => sorted_insert(v6, a, location),
            (Self::Many(m), IpAddr::V4(a)) => {
                m.v4.insert(a, location);
            }
            (Self::Many(m), IpAddr::V6(a)) => {
                m.v6.insert(a, location);
            }
        }
        if let Self::Few { v4, v6 } = self
            && v4.len() + v6.len() > MANY
        {
            *self = Self::Many(Box::new(ManyAddresses {
                v4: v4.iter().copied().collect(),
                v6: v6.iter().copied().collect(),
            }));
        }
    }

    /// Forgets `address`, returning the location it was desired at.
    pub fn remove(&mut self, address: &IpAddr) -> Option<LocationId> {
        let removed = match (&mut *self, address) {
            (Self::Few { v4, .. }, IpAddr::V4(a)) => sorted_remove(v4, a),
            (Self::Few { v6, .. }, IpAddr::V6(a)) => sorted_remove(v6, a),
            (Self::Many(m), IpAddr::V4(a)) => m.v4.remove(a),
            (Self::Many(m), IpAddr::V6(a)) => m.v6.remove(a),
        };
        if let Self::Many(m) = self
            && m.v4.len() + m.v6.len() < FEW
        {
            let mut v4: Vec<_> = m.v4.iter().map(|(a, l)| (*a, *l)).collect();
            let mut v6: Vec<_> = m.v6.iter().map(|(a, l)| (*a, *l)).collect();
            v4.sort_unstable_by_key(|(a, _)| *a);
            v6.sort_unstable_by_key(|(a, _)| *a);
            *self = Self::Few { v4, v6 };
        }
        removed
    }

    /// The sorted entries by family, if kept sorted.
    #[allow(clippy::type_complexity)]
    pub fn sorted(&self) -> Option<(&[(Ipv4Addr, LocationId)], &[(Ipv6Addr, LocationId)])> {
        match self {
            Self::Few { v4, v6 } => Some((v4, v6)),
            Self::Many(_) => None,
        }
    }

    /// Every address with its location; in address order when kept sorted
    /// ([`ServiceAddresses::sorted`]).
    pub fn iter(&self) -> impl Iterator<Item = (IpAddr, LocationId)> + '_ {
        let (few4, few6, many4, many6) = match self {
            Self::Few { v4, v6 } => (Some(v4.iter()), Some(v6.iter()), None, None),
            Self::Many(m) => (None, None, Some(m.v4.iter()), Some(m.v6.iter())),
        };
        few4.into_iter()
            .flatten()
            .map(|(a, l)| (IpAddr::V4(*a), *l))
            .chain(
                few6.into_iter()
                    .flatten()
                    .map(|(a, l)| (IpAddr::V6(*a), *l)),
            )
            .chain(
                many4
                    .into_iter()
                    .flatten()
                    .map(|(a, l)| (IpAddr::V4(*a), *l)),
            )
            .chain(
                many6
                    .into_iter()
                    .flatten()
                    .map(|(a, l)| (IpAddr::V6(*a), *l)),
            )
    }

    /// Number of distinct locations: for the read API, which asks for every service's view. A usual
    /// Service's are compared pairwise on the stack; a larger one's sorted in a copy.
    pub fn distinct_locations(&self) -> usize {
        const SMALL: usize = 64;
        if let Self::Few { v4, v6 } = self
            && v4.len() + v6.len() <= SMALL
        {
            let mut ids = [LocationId::from_index(0); SMALL];
            let all = v4.iter().map(|e| e.1).chain(v6.iter().map(|e| e.1));
            let mut n = 0;
            for (slot, id) in ids.iter_mut().zip(all) {
                *slot = id;
                n += 1;
            }
            let ids = &ids[..n];
            return (0..n).filter(|&i| !ids[..i].contains(&ids[i])).count();
        }
        let mut ids: Vec<LocationId> = self.iter().map(|(_, l)| l).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }
}

/// A set of locations, one bit each (location ids are dense).
#[derive(Debug, Clone, Default)]
pub(crate) struct LocationBits(Vec<u64>);

impl LocationBits {
    /// Adds a location.
    pub fn insert(&mut self, location: LocationId) {
        let i = location.index();
        if i / 64 >= self.0.len() {
            self.0.resize(i / 64 + 1, 0);
        }
        self.0[i / 64] |= 1 << (i % 64);
    }

    /// Removes a location.
    pub fn remove(&mut self, location: LocationId) {
        let i = location.index();
        if let Some(word) = self.0.get_mut(i / 64) {
            *word &= !(1 << (i % 64));
        }
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
    }

    /// Every location in the set, by id.
    pub fn iter(&self) -> impl Iterator<Item = LocationId> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &word)| {
            let mut bits = word;
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                Some(LocationId::from_index(w * 64 + b))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(i: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i))
    }

    fn v6(i: u32) -> IpAddr {
        IpAddr::V6(Ipv6Addr::from(0xfd00_u128 << 112 | u128::from(i)))
    }

    #[test]
    fn grows_into_hash_maps_and_back_keeping_every_entry() {
        let mut s = ServiceAddresses::default();
        let n = MANY as u32 + 10;
        for i in (0..n).rev() {
            s.insert(v4(i), LocationId::from_raw(i % 7));
            s.insert(v6(i), LocationId::from_raw(i % 5));
            if s.len() <= MANY {
                assert!(s.sorted().is_some());
            }
        }
        assert!(s.sorted().is_none(), "many addresses: hashed");
        assert_eq!(s.len(), 2 * n as usize);
        assert_eq!(s.get(&v4(12)), Some(LocationId::from_raw(5)));
        assert_eq!(s.distinct_locations(), 7);
        // Down to fewer than FEW: sorted vectors again, every kept entry there.
        let keep = FEW as u32 - 1;
        for i in 0..n {
            assert_eq!(s.remove(&v6(i)), Some(LocationId::from_raw(i % 5)));
            if i >= keep {
                assert_eq!(s.remove(&v4(i)), Some(LocationId::from_raw(i % 7)));
            }
        }
        assert!(s.sorted().is_some(), "few again");
        let listed: Vec<IpAddr> = s.iter().map(|(a, _)| a).collect();
        assert_eq!(listed, (0..keep).map(v4).collect::<Vec<_>>());
        assert_eq!(s.get(&v4(2)), Some(LocationId::from_raw(2)));
        assert_eq!(s.get(&v6(2)), None);
        assert_eq!(s.remove(&v6(2)), None);
    }

    #[test]
    fn location_bits_hold_a_set_of_ids() {
        let mut b = LocationBits::default();
        for i in [0, 3, 63, 64, 130, 3] {
            b.insert(LocationId::from_raw(i));
        }
        let ids = |b: &LocationBits| b.iter().map(|l| l.index()).collect::<Vec<_>>();
        assert_eq!(ids(&b), vec![0, 3, 63, 64, 130]);
        b.remove(LocationId::from_raw(130));
        b.remove(LocationId::from_raw(3));
        b.remove(LocationId::from_raw(999));
        assert_eq!(ids(&b), vec![0, 63, 64]);
        assert_eq!(b.0.len(), 2, "trailing empty words dropped");
    }
}
