//! The refusal budget: work NRP refused as invalid (a terminal outcome, or an unknown 4xx refused
//! again after its read-back) is held and sent again on a schedule of its own per piece of work —
//! `refusal_base` doubling to `refusal_max`, with jitter — and at once when its desired state, or
//! NRP's state of it, changes (docs/errors.md, "The refusal budget"). The parked map keeps it
//! visible while it is held; `refusals` counts the refusals in a row.

use super::*;

/// What a piece of refused work is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusedKind {
    /// One address of a location, refused on its own.
    Address,
    /// A location's whole change.
    Location,
    /// A service's creation or deletion.
    Service,
}

impl RefusedKind {
    /// Stable label: `address`, `location`, `service`.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusedKind::Address => "address",
            RefusedKind::Location => "location",
            RefusedKind::Service => "service",
        }
    }
}

/// One piece of work NRP refused, held on the refusal schedule (for status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedItem {
    /// What it is.
    pub kind: RefusedKind,
    /// The location of an address or a location.
    pub location: Option<IpAddr>,
    /// The address of an address.
    pub address: Option<IpAddr>,
    /// The ref NRP refused for an address; the service, for a service.
    pub services: Vec<String>,
    /// The refusal.
    pub record: ErrorRecord,
    /// Refusals in a row.
    pub refusals: u32,
    /// When it goes again unless it changes first (Unix ms); `None`: due now.
    pub retry_at_unix_ms: Option<i64>,
}

impl Dispatcher {
    /// Forgets that `key`'s work was refused (its desired state, or NRP's, changed; or it went
    /// through): it goes at once, and a new refusal starts the refusal delays over.
    pub(super) fn unpark(&mut self, key: &Key) {
        if self.parked.remove(key).is_some() {
            self.backoff.remove(key);
        }
        self.refusals.remove(key);
    }

    /// Holds `key`'s refused work back for its next refusal delay, then sends it again (a
    /// parked key stays parked, and visible, until it goes through or changes).
    pub(super) fn hold_refused(&mut self, key: Key, record: ErrorRecord, now: Instant) {
        let n = self.refusals.entry(key.clone()).or_default();
        *n += 1;
        let attempts = *n;
        let delay = self.refusal_delay(attempts);
        self.backoff.insert(
            key.clone(),
            Backoff {
                attempts,
                not_before: now + delay,
            },
        );
        self.parked.insert(key.clone(), record);
        match key {
            Key::Location(l) => self.pending_locations.push(l),
            Key::Service(s) => self.pending_services.push(s),
        }
    }

    /// The delay before refused work goes again after its `attempts`-th refusal: doubling from
    /// `refusal_base` to `refusal_max`, with jitter in [delay/2, delay].
    pub(super) fn refusal_delay(&mut self, attempts: u32) -> Duration {
        let exp = self
            .config
            .refusal_base
            .saturating_mul(1u32 << attempts.saturating_sub(1).min(16));
        exp.min(self.config.refusal_max)
            .mul_f64(self.jitter.next_factor())
    }

    /// Holds each address of `refused` (of location unit `work`, reported by `ids`) on its refusal
    /// schedule (`refused.rs`); returns what the report got wrong (an index or address the unit
    /// does not carry), which changes nothing.
    pub(super) fn hold_refused_addresses(
        &mut self,
        tracker: &DiffTracker,
        (work_id, worker): (u64, u64),
        work: &UnitWork,
        refused: &[AddressRefusal],
        now: Instant,
    ) -> Vec<String> {
        let mut wrong = Vec::new();
        let UnitWork::Locations(diffs) = work else {
            if !refused.is_empty() {
                wrong.push(format!(
                    "{} refused addresses reported for a unit that carries no location",
                    refused.len()
                ));
            }
            return wrong;
        };
        for r in refused {
            let Some(d) = diffs.get(r.index as usize) else {
                wrong.push(format!(
                    "refused address {}: no location change {}",
                    r.address, r.index
                ));
                continue;
            };
            let Some(a) = d.addresses.iter().find(|a| a.address == r.address) else {
                wrong.push(format!(
                    "refused address {}: not carried by the change of location {}",
                    r.address, d.location
                ));
                continue;
            };
            let actual = tracker.actual_ref(d.location, r.address);
            let refusals = self
                .refused
                .refusals_after(d.location, r.address, &a.services, &actual);
            let delay = self.refusal_delay(refusals);
            let record = ErrorRecord {
                at_unix_ms: self.wall.unix_ms(now),
                work_id,
                worker,
                unit: format!("address {} at location {}", r.address, d.location),
                code: r.code.clone(),
                message: r.message.clone(),
                terminal: true,
            };
            *self.stats.parked.entry(r.code.clone()).or_default() += 1;
            self.refused.hold(
                d.location,
                r.address,
                AddressHold {
                    services: a.services.clone(),
                    actual,
                    record,
                    refusals,
                    retry_at: Some(now + delay),
                },
            );
        }
        wrong
    }

    /// The addresses held after NRP refused them on their own.
    pub fn refused_address_count(&self) -> usize {
        self.refused.len()
    }

    /// The hold of `address` at `location`, if NRP refused it on its own and it is held.
    pub fn refused_address(&self, location: IpAddr, address: IpAddr) -> Option<RefusedItem> {
        self.refused
            .get(location, address)
            .map(|hold| self.address_item(location, address, hold))
    }

    /// The held addresses whose refused ref names service `name` (canonical name), by location
    /// then address.
    pub fn refused_addresses_of(&self, name: &str) -> impl Iterator<Item = RefusedAddress<'_>> {
        self.refused.of_service(name)
    }

    fn address_item(&self, location: IpAddr, address: IpAddr, hold: &AddressHold) -> RefusedItem {
        RefusedItem {
            kind: RefusedKind::Address,
            location: Some(location),
            address: Some(address),
            services: hold.services.clone(),
            record: hold.record.clone(),
            refusals: hold.refusals,
            retry_at_unix_ms: hold.retry_at.map(|t| self.wall.unix_ms(t)),
        }
    }

    /// Every piece of refused work held: the addresses refused on their own, then the locations
    /// and services parked whole, each group by its oldest refusal first; at most `limit`.
    pub fn refused_items(&self, limit: usize) -> Vec<RefusedItem> {
        let mut addresses: Vec<RefusedItem> = self
            .refused
            .iter()
            .map(|r| self.address_item(r.location, r.address, r.hold))
            .collect();
        addresses.sort_by_key(|i| (i.record.at_unix_ms, i.location, i.address));
        let mut parked: Vec<RefusedItem> = self
            .parked
            .iter()
            .map(|(key, record)| {
                let (kind, location, services) = match key {
                    Key::Location(l) => (RefusedKind::Location, Some(*l), Vec::new()),
                    Key::Service(s) => (RefusedKind::Service, None, vec![s.clone()]),
                };
                RefusedItem {
                    kind,
                    location,
                    address: None,
                    services,
                    record: record.clone(),
                    refusals: self.refusals.get(key).copied().unwrap_or(0),
                    retry_at_unix_ms: self
                        .backoff
                        .get(key)
                        .map(|b| self.wall.unix_ms(b.not_before)),
                }
            })
            .collect();
        parked.sort_by(|a, b| {
            (a.record.at_unix_ms, a.location, &a.services).cmp(&(
                b.record.at_unix_ms,
                b.location,
                &b.services,
            ))
        });
        addresses.extend(parked);
        addresses.truncate(limit);
        addresses
    }

    /// How many pieces of refused work are held, by error code (addresses refused on their own,
    /// locations and services parked whole).
    pub fn refused_by_code(&self) -> HashMap<String, u64> {
        let mut by_code: HashMap<String, u64> = HashMap::default();
        let codes = self
            .refused
            .iter()
            .map(|r| r.hold.record.code.as_str())
            .chain(self.parked.values().map(|r| r.code.as_str()));
        for code in codes {
            *by_code.entry(code.to_owned()).or_default() += 1;
        }
        by_code
    }
}
