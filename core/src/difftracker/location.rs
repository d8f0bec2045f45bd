//! Per-location storage: each address holds its desired part and its actual (NRP) part side by side,
//! inline (no allocation of its own while it refers to at most four services).

use foldhash::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::num::NonZeroU64;

use smallvec::SmallVec;

use super::addrmap::AddrMap;
use super::identity::ServiceId;

/// Service ids on the stack (or inline in a slot), for refs without allocating.
pub(crate) type RefBuf = SmallVec<[ServiceId; 4]>;

/// A 64-bit fingerprint of a pod UID: enough to tell a replacement pod from the one it replaced
/// at the same address (two pods at one address colliding has probability 2^-64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PodUid(NonZeroU64);

impl PodUid {
    /// Fingerprints a UID; `None` for an empty UID.
    pub fn of(uid: &str) -> Option<Self> {
        if uid.is_empty() {
            return None;
        }
        let mut h = DefaultHasher::new();
        uid.hash(&mut h);
        Some(Self(NonZeroU64::new(h.finish()).unwrap_or(NonZeroU64::MIN)))
    }
}

/// What Kubernetes wants for one address, as a value taken out of a [`Slot`] to be changed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Desired {
    /// Inbound identities (Services whose endpoints include this address), sorted.
    pub inbound: RefBuf,
    /// The egress of the pod at this address.
    pub outbound: Option<ServiceId>,
    /// The pod that set `outbound`.
    pub pod: Option<PodUid>,
}

impl Desired {
    /// The full desired service ref: inbound identities plus the outbound one, sorted.
    pub fn refs(&self) -> RefBuf {
        merged(&self.inbound, self.outbound)
    }

    /// True when the address no longer belongs to anything.
    pub fn is_empty(&self) -> bool {
        self.inbound.is_empty() && self.outbound.is_none()
    }
}

/// `inbound` (sorted) with `outbound` added in its place.
fn merged(inbound: &[ServiceId], outbound: Option<ServiceId>) -> RefBuf {
    let mut buf = RefBuf::new();
    match outbound {
        None => buf.extend_from_slice(inbound),
        Some(o) => {
            let pos = inbound.partition_point(|id| *id < o);
            buf.extend_from_slice(&inbound[..pos]);
            if inbound.get(pos) != Some(&o) {
                buf.push(o);
            }
            buf.extend_from_slice(&inbound[pos..]);
        }
    }
    buf
}

/// Both states of one address at one location, inline. The address is desired when it has an
/// inbound or an outbound identity, and in NRP when its actual ref is not empty.
#[derive(Debug, Clone, Default)]
pub(crate) struct Slot {
    /// The desired inbound ids (sorted), then the ids NRP has confirmed (sorted).
    refs: RefBuf,
    /// How many of `refs` are desired inbound ids.
    inbound_len: u32,
    /// The egress of the pod at this address.
    pub outbound: Option<ServiceId>,
    /// The pod that set `outbound`.
    pub pod: Option<PodUid>,
}

impl Slot {
    /// The desired inbound ids, sorted.
    pub fn inbound(&self) -> &[ServiceId] {
        &self.refs[..self.inbound_len as usize]
    }

    /// The service ref NRP has confirmed, sorted; empty if NRP does not have the address here.
    pub fn actual(&self) -> &[ServiceId] {
        &self.refs[self.inbound_len as usize..]
    }

    /// Whether Kubernetes wants the address here.
    pub fn has_desired(&self) -> bool {
        self.inbound_len > 0 || self.outbound.is_some()
    }

    /// Whether NRP has the address here.
    pub fn has_actual(&self) -> bool {
        self.refs.len() > self.inbound_len as usize
    }

    /// True when neither side has the address.
    pub fn is_empty(&self) -> bool {
        self.refs.is_empty() && self.outbound.is_none()
    }

    /// The full desired ref (inbound plus outbound), sorted; empty if not desired.
    pub fn desired_refs(&self) -> RefBuf {
        merged(self.inbound(), self.outbound)
    }

    /// The desired part as a value.
    pub fn desired(&self) -> Desired {
        Desired {
            inbound: RefBuf::from_slice(self.inbound()),
            outbound: self.outbound,
            pod: self.pod,
        }
    }

    /// Replaces the desired part (an empty one leaves no pod behind).
    pub fn set_desired(&mut self, d: &Desired) {
        if self.inbound() != &d.inbound[..] {
            let actual = RefBuf::from_slice(self.actual());
            self.refs.clear();
            self.refs.extend_from_slice(&d.inbound);
            self.refs.extend_from_slice(&actual);
            self.inbound_len = u32::try_from(d.inbound.len()).expect("fewer than 2^32 refs");
        }
        self.outbound = d.outbound;
        self.pod = if d.is_empty() { None } else { d.pod };
        if self.refs.spilled() && self.refs.len() <= self.refs.inline_size() {
            self.refs.shrink_to_fit();
        }
    }

    /// Replaces the actual ref (sorted; empty = NRP does not have the address here).
    pub fn set_actual(&mut self, refs: &[ServiceId]) {
        self.refs.truncate(self.inbound_len as usize);
        self.refs.extend_from_slice(refs);
        if self.refs.spilled() && self.refs.len() <= self.refs.inline_size() {
            self.refs.shrink_to_fit();
        }
    }
}

/// One location (node IP): its addresses and whether NRP has it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Location {
    pub addresses: AddrMap<Slot>,
    /// NRP has this location (possibly with no addresses).
    pub in_nrp: bool,
    /// Number of addresses with a desired part.
    pub desired_addresses: u32,
    /// Number of addresses with an actual part.
    pub actual_addresses: u32,
}

impl Location {
    /// True when neither side has anything here.
    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty() && !self.in_nrp
    }
}

/// Adds `id` to a sorted ref list; false if it was there.
pub(crate) fn insert_ref(refs: &mut RefBuf, id: ServiceId) -> bool {
    match refs.binary_search(&id) {
        Ok(_) => false,
        Err(pos) => {
            refs.insert(pos, id);
            true
        }
    }
}

/// Removes `id` from a sorted ref list; false if it was not there.
pub(crate) fn remove_ref(refs: &mut RefBuf, id: ServiceId) -> bool {
    match refs.binary_search(&id) {
        Ok(pos) => {
            refs.remove(pos);
            true
        }
        Err(_) => false,
    }
}

/// Calls `f(id, delta)` for every id whose membership differs between two sorted lists.
pub(crate) fn for_each_change(
    before: &[ServiceId],
    after: &[ServiceId],
    mut f: impl FnMut(ServiceId, i32),
) {
    let (mut i, mut j) = (0, 0);
    while i < before.len() || j < after.len() {
        match (before.get(i), after.get(j)) {
            (Some(b), Some(a)) if b == a => {
                i += 1;
                j += 1;
            }
            (Some(b), Some(a)) if b < a => {
                f(*b, -1);
                i += 1;
            }
            (Some(_), Some(a)) => {
                f(*a, 1);
                j += 1;
            }
            (Some(b), None) => {
                f(*b, -1);
                i += 1;
            }
            (None, Some(a)) => {
                f(*a, 1);
                j += 1;
            }
            (None, None) => unreachable!("loop condition"),
        }
    }
}

/// Interned location: the reverse index and the address index store this instead of an IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct LocationId(u32);

impl LocationId {
    #[cfg(test)]
    pub fn from_raw(raw: u32) -> Self {
        Self(raw)
    }

    /// Position in the location table.
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// The id at a position of the location table.
    pub fn from_index(index: usize) -> Self {
        Self(u32::try_from(index).expect("fewer than 2^32 locations"))
    }
}

/// Every location, addressable by IP or by id; an id is freed when its location empties.
#[derive(Debug, Clone, Default)]
pub(crate) struct LocationTable {
    by_ip: HashMap<IpAddr, LocationId>,
    slots: Vec<Option<(IpAddr, Location)>>,
    /// The IP of each id, packed (the IP of a free id is stale): `ip` reads 17 bytes, not a slot.
    ips: Vec<IpAddr>,
    free: Vec<LocationId>,
}

impl LocationTable {
    /// The id of a location, if known.
    pub fn id(&self, ip: &IpAddr) -> Option<LocationId> {
        self.by_ip.get(ip).copied()
    }

    /// The IP of a live id.
    pub fn ip(&self, id: LocationId) -> IpAddr {
        debug_assert!(self.slots[id.0 as usize].is_some(), "live location id");
        self.ips[id.0 as usize]
    }

    /// A live location by id, with its IP.
    pub fn by_id(&self, id: LocationId) -> Option<(IpAddr, &Location)> {
        self.slots
            .get(id.0 as usize)?
            .as_ref()
            .map(|(ip, l)| (*ip, l))
    }

    /// A location by IP.
    pub fn get(&self, ip: &IpAddr) -> Option<&Location> {
        let id = self.id(ip)?;
        self.slots[id.0 as usize].as_ref().map(|(_, l)| l)
    }

    /// A location by IP, mutably.
    pub fn get_mut(&mut self, ip: &IpAddr) -> Option<&mut Location> {
        let id = self.id(ip)?;
        self.slots[id.0 as usize].as_mut().map(|(_, l)| l)
    }

    /// A location by IP, created empty if unknown.
    pub fn get_or_create(&mut self, ip: IpAddr) -> (LocationId, &mut Location) {
        let id = match self.by_ip.get(&ip) {
            Some(id) => *id,
            None => {
                let id = match self.free.pop() {
                    Some(id) => id,
                    None => {
                        self.slots.push(None);
                        self.ips.push(ip);
                        LocationId(
                            u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 locations"),
                        )
                    }
                };
                self.slots[id.0 as usize] = Some((ip, Location::default()));
                self.ips[id.0 as usize] = ip;
                self.by_ip.insert(ip, id);
                id
            }
        };
        (
            id,
            &mut self.slots[id.0 as usize].as_mut().expect("just ensured").1,
        )
    }

    /// Forgets a location that holds nothing.
    pub fn remove_if_empty(&mut self, ip: &IpAddr) {
        if let Some(id) = self.id(ip)
            && self.slots[id.0 as usize]
                .as_ref()
                .is_some_and(|(_, l)| l.is_empty())
        {
            self.slots[id.0 as usize] = None;
            self.by_ip.remove(ip);
            self.free.push(id);
        }
    }

    /// Every location with its IP.
    pub fn iter(&self) -> impl Iterator<Item = (IpAddr, &Location)> {
        self.slots.iter().flatten().map(|(ip, l)| (*ip, l))
    }
}

/// Where each desired address lives, split by family so an IPv4 entry costs 8 bytes, not 24.
#[derive(Debug, Clone, Default)]
pub(crate) struct AddressIndex {
    v4: HashMap<Ipv4Addr, LocationId>,
    v6: HashMap<Ipv6Addr, LocationId>,
}

impl AddressIndex {
    /// The location an address is desired at.
    pub fn get(&self, address: &IpAddr) -> Option<LocationId> {
        match address {
            IpAddr::V4(a) => self.v4.get(a).copied(),
            IpAddr::V6(a) => self.v6.get(a).copied(),
        }
    }

    /// Records where an address is desired.
    pub fn insert(&mut self, address: IpAddr, location: LocationId) {
        match address {
            IpAddr::V4(a) => self.v4.insert(a, location),
            IpAddr::V6(a) => self.v6.insert(a, location),
        };
    }

    /// Forgets an address.
    pub fn remove(&mut self, address: &IpAddr) {
        match address {
            IpAddr::V4(a) => self.v4.remove(a),
            IpAddr::V6(a) => self.v6.remove(a),
        };
    }

    /// Number of desired addresses.
    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_holds_up_to_four_refs_inline_in_40_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 40);
        let ids: Vec<ServiceId> = (1..=6).map(ServiceId::from_raw).collect();
        let mut slot = Slot::default();
        slot.set_desired(&Desired {
            inbound: ids[..2].into(),
            outbound: Some(ids[5]),
            pod: PodUid::of("u"),
        });
        slot.set_actual(&ids[2..4]);
        assert!(!slot.refs.spilled());
        assert_eq!(slot.inbound(), &ids[..2]);
        assert_eq!(slot.actual(), &ids[2..4]);
        assert_eq!(&slot.desired_refs()[..], &[ids[0], ids[1], ids[5]]);
        // A fifth ref spills to the heap, and comes back inline when one goes.
        slot.set_actual(&ids[2..5]);
        assert!(slot.refs.spilled());
        assert_eq!(slot.actual(), &ids[2..5]);
        slot.set_actual(&ids[2..3]);
        assert!(!slot.refs.spilled());
        assert_eq!(slot.inbound(), &ids[..2]);
        // Emptied desired part: no pod left behind.
        slot.set_desired(&Desired::default());
        assert!(!slot.has_desired() && slot.pod.is_none() && slot.has_actual());
        slot.set_actual(&[]);
        assert!(slot.is_empty());
    }
}
