//! Identities (inbound = Service UID, outbound = egress name) and the table that interns them.
//!
//! Every identity the tracker knows gets a small `ServiceId`; the entry also holds the reverse index
//! service → desired addresses (each with its location, see `members.rs`) and the count of
//! actual references, which make the diff incremental: a service that becomes ready, or is deleted,
//! dirties only the locations that use it, and a level endpoints update compares the new set with
//! the service's own addresses.

use foldhash::HashMap;
use std::borrow::Cow;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};

use super::error::{InvalidInput, Reason};
use super::family::IpFamily;
use super::location::LocationId;
use super::members::{LocationBits, ServiceAddresses};

/// Longest identity accepted: an Azure resource name has at most 80 characters, and the longest
/// name clb makes of an identity, its NAT gateway's IPv6 public IP `pip-{identity}-v6`, adds 7.
pub const MAX_IDENTITY_LEN: usize = 80 - "pip--v6".len();

/// Validates an identity and returns its canonical (lower-case) form, borrowed when it already is.
pub fn normalize_identity<'a>(field: &str, value: &'a str) -> Result<Cow<'a, str>, InvalidInput> {
    if value.is_empty() {
        return Err(InvalidInput::new(field, value, Reason::Empty));
    }
    if value.len() > MAX_IDENTITY_LEN {
        return Err(InvalidInput::new(
            field,
            value,
            Reason::TooLong {
                len: value.len(),
                max: MAX_IDENTITY_LEN,
            },
        ));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(InvalidInput::new(field, value, Reason::InvalidCharacter(c)));
    }
    // Azure resource names end with a letter, a digit or '_'; those clb makes of an identity
    // (`lb-{identity}`, `pip-{identity}`, `natgw-{identity}`) end with it.
    if let Some(c) = value
        .chars()
        .last()
        .filter(|c| !(c.is_ascii_alphanumeric() || *c == '_'))
    {
        return Err(InvalidInput::new(field, value, Reason::InvalidEnd(c)));
    }
    if value.bytes().any(|b| b.is_ascii_uppercase()) {
        Ok(Cow::Owned(value.to_ascii_lowercase()))
    } else {
        Ok(Cow::Borrowed(value))
    }
}

/// Whether an identity is a load balancer (inbound) or a NAT gateway (outbound) in NRP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServiceKind {
    /// A LoadBalancer Service: an NRP load balancer backend pool.
    Inbound,
    /// An egress: an NRP NAT gateway.
    Outbound,
}

impl ServiceKind {
    /// Lower-case name used in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceKind::Inbound => "inbound",
            ServiceKind::Outbound => "outbound",
        }
    }
}

/// Interned identity. Ids are reused after an identity is forgotten.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ServiceId(NonZeroU32);

impl ServiceId {
    fn index(self) -> usize {
        self.0.get() as usize - 1
    }

    #[cfg(test)]
    pub fn from_raw(raw: u32) -> Self {
        Self(NonZeroU32::new(raw).expect("non-zero"))
    }
}

/// Desired state of an egress: explicitly declared and/or used by pods.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct EgressState {
    pub declared: bool,
    pub pods: u32,
    /// How many of `pods` have an IPv6 address: the egress's NAT gateway needs an IPv6 public IP
    /// while there is one (`egress_family.rs`).
    pub v6_pods: u32,
}

/// Everything the tracker knows of one identity.
#[derive(Debug, Clone)]
pub(crate) struct ServiceEntry {
    pub name: Box<str>,
    /// Fixed when the identity is first used; using it as the other kind is refused.
    pub kind: ServiceKind,
    pub desired_inbound: bool,
    pub egress: Option<EgressState>,
    /// The kind NRP has it as, if NRP has it.
    pub actual: Option<ServiceKind>,
    /// A desired inbound identity that must be created again although NRP has it (its load
    /// balancer changed): set by `reprogram_service`, cleared when a creation is recorded or the
    /// identity stops being desired.
    pub reprogram: bool,
    /// NRP may hold resources of this identity (public IP, load balancer or NAT gateway) although
    /// its registration is gone or was never made: a creation or deletion saga stopped part-way,
    /// or an observe found the registration gone. Until a deletion is recorded (or a creation,
    /// which takes them over), an undesired identity is deleted again to clean them up.
    pub leftover: bool,
    /// The IP family a writer stated for an inbound identity: its endpoints must be of it. `None`:
    /// not stated (a writer from before families; endpoints of both families are accepted).
    pub family: Option<IpFamily>,
    /// The family of the frontend the identity was last desired with (the stated family, IPv4
    /// when none was stated), kept while the entry lives: an add of another frontend family is
    /// refused (a family change is a new identity). `None`: never desired (only observed, or
    /// named by endpoints first).
    pub frontend: Option<IpFamily>,
    /// The NAT gateway an outbound identity brings (`None`: one clb owns), once known:
    /// `nat_known` (see `natgw.rs`).
    pub nat_gateway: Option<Box<str>>,
    /// Whether `nat_gateway` was stated by a pod (false for an identity only observed in NRP).
    pub nat_known: bool,
    /// An outbound identity whose NAT gateway NRP has with an IPv6 public IP: a creation with
    /// `ServiceChange::ipv6` was recorded, or an observation found IPv6 addresses referring to it.
    /// Until then its IPv6 addresses are not sent with it (`egress_family.rs`).
    pub nat_v6: bool,
    /// Desired addresses referring to it.
    pub desired_refs: u32,
    pub actual_refs: u32,
    /// Reverse index of an inbound identity: its desired addresses, with their locations.
    pub addresses: ServiceAddresses,
    /// Reverse index of an outbound identity: the locations where desired addresses may refer to
    /// it (a superset; see `members.rs`).
    pub egress_locations: LocationBits,
    /// How many distinct locations the desired addresses are at, once a view asked (see [`Memo`]).
    pub locations_memo: Memo,
}

/// A count computed on demand by a read and kept until the entry's references change: the read API
/// asks for every service's view on each change, while counting a service's locations walks its
/// index (or, for an egress, its locations). Reads through `&self` may fill it, from any thread:
/// the value is the same whoever computes it.
#[derive(Debug, Default)]
pub(crate) struct Memo(AtomicU32);

impl Memo {
    /// The count, computed by `f` unless known.
    pub fn get_or(&self, f: impl FnOnce() -> usize) -> usize {
        match self.0.load(Ordering::Relaxed) {
            0 => {
                let n = f();
                // 0 means unknown: store the count plus one (saturated, then never kept).
                if let Ok(v) = u32::try_from(n + 1)
                    && v < u32::MAX
                {
                    self.0.store(v, Ordering::Relaxed);
                }
                n
            }
            v => v as usize - 1,
        }
    }

    /// Forgets the count.
    pub fn clear(&mut self) {
        *self.0.get_mut() = 0;
    }
}

impl Clone for Memo {
    fn clone(&self) -> Self {
        Self(AtomicU32::new(self.0.load(Ordering::Relaxed)))
    }
}

impl ServiceEntry {
    /// Whether Kubernetes wants this identity to exist in NRP.
    pub fn is_desired(&self) -> bool {
        self.desired_inbound || self.egress.is_some()
    }

    fn unused(&self) -> bool {
        !self.desired_inbound
            && self.egress.is_none()
            && self.actual.is_none()
            && !self.leftover
            && self.desired_refs == 0
            && self.actual_refs == 0
    }
}

/// Interner and reverse index of identities.
#[derive(Debug, Clone, Default)]
pub(crate) struct ServiceTable {
    entries: Vec<Option<ServiceEntry>>,
    free: Vec<ServiceId>,
    by_name: HashMap<Box<str>, ServiceId>,
    /// Ids that may have become unused during the current operation; checked at its end, so an
    /// id is never freed (and reused) while the operation still holds it.
    maybe_unused: Vec<ServiceId>,
}

impl ServiceTable {
    /// Looks a canonical name up.
    pub fn id(&self, name: &str) -> Option<ServiceId> {
        self.by_name.get(name).copied()
    }

    /// Looks a canonical name up, interning it as `kind` if new; an identity already known as
    /// the other kind is refused with the kind it has.
    pub fn intern(&mut self, name: &str, kind: ServiceKind) -> Result<ServiceId, ServiceKind> {
        if let Some(id) = self.by_name.get(name) {
            let existing = self.get(*id).kind;
            return if existing == kind {
                Ok(*id)
            } else {
                Err(existing)
            };
        }
        let entry = ServiceEntry {
            name: name.into(),
            kind,
            desired_inbound: false,
            egress: None,
            actual: None,
            reprogram: false,
            leftover: false,
            family: None,
            frontend: None,
            nat_gateway: None,
            nat_known: false,
            nat_v6: false,
            desired_refs: 0,
            actual_refs: 0,
            addresses: ServiceAddresses::default(),
            egress_locations: LocationBits::default(),
            locations_memo: Memo::default(),
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.entries[id.index()] = Some(entry);
                id
            }
            None => {
                self.entries.push(Some(entry));
                let raw = u32::try_from(self.entries.len()).expect("fewer than 2^32 identities");
                ServiceId(NonZeroU32::new(raw).expect("len >= 1"))
            }
        };
        self.by_name.insert(name.into(), id);
        Ok(id)
    }

    /// The entry of a live id.
    pub fn get(&self, id: ServiceId) -> &ServiceEntry {
        self.entries[id.index()].as_ref().expect("live service id")
    }

    /// The entry of a live id, mutably.
    pub fn get_mut(&mut self, id: ServiceId) -> &mut ServiceEntry {
        self.entries[id.index()].as_mut().expect("live service id")
    }

    /// The canonical name of a live id.
    pub fn name(&self, id: ServiceId) -> &str {
        &self.get(id).name
    }

    /// Notes that an identity may no longer be used; see [`ServiceTable::collect_unused`].
    pub fn release_if_unused(&mut self, id: ServiceId) {
        self.maybe_unused.push(id);
    }

    /// Forgets the noted identities that nothing refers to any more, so their ids can be reused.
    /// Called at the end of every public operation.
    pub fn collect_unused(&mut self) {
        while let Some(id) = self.maybe_unused.pop() {
            if self.entries[id.index()]
                .as_ref()
                .is_some_and(ServiceEntry::unused)
            {
                let entry = self.entries[id.index()].take().expect("checked live");
                self.by_name.remove(&entry.name);
                self.free.push(id);
            }
        }
    }

    /// Every live entry.
    pub fn iter(&self) -> impl Iterator<Item = (ServiceId, &ServiceEntry)> {
        self.entries.iter().enumerate().filter_map(|(i, e)| {
            let raw = NonZeroU32::new(u32::try_from(i + 1).ok()?)?;
            e.as_ref().map(|e| (ServiceId(raw), e))
        })
    }

    /// Adds (`delta` 1) or removes (-1) the desired reference of `address` at `location` to `id`.
    pub fn add_desired_ref(
        &mut self,
        id: ServiceId,
        location: LocationId,
        address: IpAddr,
        delta: i32,
    ) {
        let entry = self.get_mut(id);
        entry.desired_refs = entry
            .desired_refs
            .checked_add_signed(delta)
            .expect("refcount");
        entry.locations_memo.clear();
        match (entry.kind, delta > 0) {
            (ServiceKind::Inbound, true) => {
                debug_assert!(entry.addresses.get(&address).is_none(), "one location");
                entry.addresses.insert(address, location);
            }
            (ServiceKind::Inbound, false) => {
                let removed = entry.addresses.remove(&address);
                debug_assert_eq!(removed, Some(location), "refcount");
            }
            // Cleared when a reader finds no pod of the egress there any more.
            (ServiceKind::Outbound, true) => entry.egress_locations.insert(location),
            (ServiceKind::Outbound, false) => {}
        }
        debug_assert!(
            entry.kind == ServiceKind::Outbound
                || entry.addresses.len() == entry.desired_refs as usize
        );
    }

    /// Adjusts the actual (NRP) references of `id` by `delta`.
    pub fn add_actual_ref(&mut self, id: ServiceId, delta: i32) {
        let entry = self.get_mut(id);
        entry.actual_refs = entry
            .actual_refs
            .checked_add_signed(delta)
            .expect("refcount");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_lower_cased_and_validated() {
        assert_eq!(normalize_identity("id", "AbC-1.x_y").unwrap(), "abc-1.x_y");
        assert_eq!(
            normalize_identity("id", "").unwrap_err().reason,
            Reason::Empty
        );
        assert_eq!(
            normalize_identity("id", "a b").unwrap_err().reason,
            Reason::InvalidCharacter(' ')
        );
        // The longest name made of it, `pip-{identity}-v6`, fits Azure's 80 characters.
        assert_eq!(MAX_IDENTITY_LEN, 73);
        assert!(normalize_identity("id", &"a".repeat(73)).is_ok());
        assert_eq!(
            normalize_identity("id", &"a".repeat(74))
                .unwrap_err()
                .reason,
            Reason::TooLong { len: 74, max: 73 }
        );
        for bad in ["web-", "web.", "-"] {
            let e = normalize_identity("id", bad).unwrap_err();
            assert!(matches!(e.reason, Reason::InvalidEnd(_)), "{bad}: {e}");
            assert!(
                e.to_string()
                    .contains("must end with a letter, a digit or '_'"),
                "{e}"
            );
        }
        assert!(normalize_identity("id", "web_").is_ok());
    }

    #[test]
    fn released_ids_are_reused() {
        let mut t = ServiceTable::default();
        let a = t.intern("a", ServiceKind::Inbound).unwrap();
        t.release_if_unused(a);
        t.collect_unused();
        assert!(t.id("a").is_none());
        let b = t.intern("b", ServiceKind::Outbound).unwrap();
        assert_eq!(
            t.intern("b", ServiceKind::Inbound),
            Err(ServiceKind::Outbound)
        );
        assert_eq!(a, b);
        assert_eq!(t.name(b), "b");
    }
}
