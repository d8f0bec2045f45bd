//! Per-location storage: each address holds its desired part and its actual (NRP) part side by side.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::IpAddr;
use std::num::NonZeroU64;

use smallvec::SmallVec;

use super::identity::ServiceId;

/// A sorted, duplicate-free list of services; the empty list costs no allocation.
pub(crate) type Refs = Box<[ServiceId]>;

/// Service ids on the stack, for computing refs without allocating.
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

/// What Kubernetes wants for one address.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Desired {
    /// Inbound identities (Services whose endpoints include this address), sorted.
    pub inbound: Refs,
    /// The egress of the pod at this address.
    pub outbound: Option<ServiceId>,
    /// The pod that set `outbound`.
    pub pod: Option<PodUid>,
}

impl Desired {
    /// The full desired service ref: inbound identities plus the outbound one, sorted.
    pub fn refs(&self) -> RefBuf {
        let mut buf: RefBuf = self.inbound.iter().copied().collect();
        if let Some(o) = self.outbound
            && let Err(pos) = buf.binary_search(&o)
        {
            buf.insert(pos, o);
        }
        buf
    }

    /// True when the address no longer belongs to anything.
    pub fn is_empty(&self) -> bool {
        self.inbound.is_empty() && self.outbound.is_none()
    }
}

/// Both states of one address at one location.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    pub desired: Option<Desired>,
    /// The service ref NRP has confirmed; `None` if NRP does not have this address here.
    pub actual: Option<Refs>,
}

/// One location (node IP): its addresses and whether NRP has it.
#[derive(Debug, Default)]
pub(crate) struct Location {
    pub addresses: HashMap<IpAddr, Slot>,
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

/// Inserts `id` into a sorted ref list, returning the new list (unchanged if present).
pub(crate) fn with_ref(refs: &[ServiceId], id: ServiceId) -> Refs {
    match refs.binary_search(&id) {
        Ok(_) => refs.into(),
        Err(pos) => {
            let mut v = Vec::with_capacity(refs.len() + 1);
            v.extend_from_slice(&refs[..pos]);
            v.push(id);
            v.extend_from_slice(&refs[pos..]);
            v.into_boxed_slice()
        }
    }
}

/// Removes `id` from a sorted ref list.
pub(crate) fn without_ref(refs: &[ServiceId], id: ServiceId) -> Refs {
    refs.iter().copied().filter(|r| *r != id).collect()
}

/// Calls `f(id, delta)` for every id whose membership differs between two sorted lists.
pub(crate) fn for_each_change(before: &[ServiceId], after: &[ServiceId], mut f: impl FnMut(ServiceId, i32)) {
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
