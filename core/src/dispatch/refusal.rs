//! The refusal budget: work NRP refused as invalid (a terminal outcome, or an unknown 4xx refused
//! again after its read-back) is held and sent again on a schedule of its own per piece of work —
//! `refusal_base` doubling to `refusal_max`, with jitter — and at once when its desired state, or
//! NRP's state of it, changes (docs/errors.md, "The refusal budget"). The parked map keeps it
//! visible while it is held; `refusals` counts the refusals in a row.

use super::*;

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
    fn refusal_delay(&mut self, attempts: u32) -> Duration {
        let exp = self
            .config
            .refusal_base
            .saturating_mul(1u32 << attempts.saturating_sub(1).min(16));
        exp.min(self.config.refusal_max)
            .mul_f64(self.jitter.next_factor())
    }
}
