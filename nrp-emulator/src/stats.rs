//! Counters for tests and benchmarks, and the removal log.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::state::{Removal, RemovalDraft};

/// A snapshot of the emulator's counters (`GET /_emulator/stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// ARM calls answered (control endpoints excluded).
    pub calls: u64,
    /// Calls by ARM operation id (e.g. `ServiceGateways_UpdateAddressLocations`) and HTTP status.
    pub calls_by_operation: BTreeMap<String, BTreeMap<u16, u64>>,
    /// Mutating calls received (PUT, POST, DELETE), whatever their outcome.
    pub mutating_calls: u64,
    /// Mutating calls that were applied.
    pub mutations_applied: u64,
    /// Addresses carried by `updateAddressLocations` calls that were parsed.
    pub addresses_carried: u64,
    /// Locations carried by `updateAddressLocations` calls that were parsed.
    pub locations_carried: u64,
    /// Error answers by ARM error code (rule violations, throttling, injected faults, …).
    pub rejected_by_code: BTreeMap<String, u64>,
    /// Injected faults by kind (`timeout`, `500`, `503`, `429`, `409`).
    pub faults_injected: BTreeMap<String, u64>,
    /// Calls refused by the per-gateway concurrency limit.
    pub throttled_by_limit: u64,
    /// Mutating calls refused because their subscription's write budget was spent
    /// (`429 SubscriptionRequestsThrottled`).
    #[serde(default)]
    pub throttled_by_write_budget: u64,
    /// Highest number of concurrent mutating calls observed on one gateway.
    pub max_concurrent_mutations: usize,
    /// Mutating gateway calls in flight now (including running long-running operations).
    pub in_flight_mutations: usize,
    /// Long-running operations started.
    pub operations_started: u64,
    /// Entries ever added to the removal log.
    pub removals: u64,
    /// Entries dropped from the removal log because of its capacity.
    pub removals_dropped: u64,
}

impl Stats {
    /// Calls of `operation` with any status.
    pub fn calls_of(&self, operation: &str) -> u64 {
        self.calls_by_operation
            .get(operation)
            .map_or(0, |m| m.values().sum())
    }

    /// Calls of `operation` answered with `status`.
    pub fn calls_with_status(&self, operation: &str, status: u16) -> u64 {
        self.calls_by_operation
            .get(operation)
            .and_then(|m| m.get(&status))
            .copied()
            .unwrap_or(0)
    }

    /// Error answers with ARM code `code`.
    pub fn rejected(&self, code: &str) -> u64 {
        self.rejected_by_code.get(code).copied().unwrap_or(0)
    }

    pub(crate) fn record_call(&mut self, operation: &str, status: u16) {
        self.calls += 1;
        *self
            .calls_by_operation
            .entry(operation.to_string())
            .or_default()
            .entry(status)
            .or_default() += 1;
    }

    pub(crate) fn record_rejection(&mut self, code: &str) {
        *self.rejected_by_code.entry(code.to_string()).or_default() += 1;
    }

    pub(crate) fn record_fault(&mut self, kind: &str) {
        *self.faults_injected.entry(kind.to_string()).or_default() += 1;
    }
}

/// Entries per chunk of the removal log.
const CHUNK: usize = 4_096;

/// The bounded log of removals. Kept as drafts (addresses as `IpAddr`) in chunks of [`CHUNK`]
/// and formatted when read: a call that removes thousands of addresses appends without an
/// allocation per address, and the log never moves its entries to grow (one contiguous buffer of
/// up to a million entries did, inside the call that crossed a power of two — milliseconds on the
/// state lock, added to that call's modelled latency).
#[derive(Debug, Default)]
pub(crate) struct RemovalLog {
    chunks: VecDeque<Vec<(u64, RemovalDraft)>>,
    len: usize,
    next_seq: u64,
    dropped: u64,
}

impl RemovalLog {
    pub(crate) fn push(&mut self, drafts: Vec<RemovalDraft>, capacity: usize) {
        for d in drafts {
            self.next_seq += 1;
            match self.chunks.back_mut() {
                Some(chunk) if chunk.len() < CHUNK => chunk.push((self.next_seq, d)),
                _ => {
                    let mut chunk = Vec::with_capacity(CHUNK);
                    chunk.push((self.next_seq, d));
                    self.chunks.push_back(chunk);
                }
            }
            self.len += 1;
        }
        while self.len > capacity {
            let excess = self.len - capacity;
            let Some(front) = self.chunks.front_mut() else {
                break;
            };
            let n = excess.min(front.len());
            if n == front.len() {
                self.chunks.pop_front();
            } else {
                front.drain(..n);
            }
            self.len -= n;
            self.dropped += n as u64;
        }
    }

    pub(crate) fn entries(&self) -> Vec<Removal> {
        self.chunks
            .iter()
            .flatten()
            .map(|(seq, d)| Removal {
                seq: *seq,
                gateway: d.gateway.clone(),
                location: d.location.to_string(),
                address: d.address.to_string(),
                removed_services: d.removed_services.clone(),
                address_removed: d.address_removed,
                cause: d.cause,
            })
            .collect()
    }

    pub(crate) fn total(&self) -> u64 {
        self.next_seq
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    pub(crate) fn clear(&mut self) {
        self.chunks.clear();
        self.len = 0;
        self.dropped = 0;
        self.next_seq = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::RemovalCause;

    fn drafts(n: u32) -> Vec<RemovalDraft> {
        (0..n)
            .map(|i| RemovalDraft {
                gateway: "gw".into(),
                location: "10.0.0.1".parse().unwrap(),
                address: std::net::IpAddr::from(std::net::Ipv4Addr::from(0x0a01_0000 + i)),
                removed_services: vec!["svc".into()],
                address_removed: true,
                cause: RemovalCause::AddressUpdate,
            })
            .collect()
    }

    #[test]
    fn the_log_keeps_the_newest_entries_up_to_its_capacity_across_chunks() {
        let mut log = RemovalLog::default();
        log.push(drafts(3 * CHUNK as u32), 10_000);
        log.push(drafts(CHUNK as u32 + 7), 10_000);
        let total = 4 * CHUNK as u64 + 7;
        assert_eq!(log.total(), total);
        assert_eq!(log.dropped(), total - 10_000);
        let entries = log.entries();
        assert_eq!(entries.len(), 10_000);
        let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, ((total - 9_999)..=total).collect::<Vec<_>>());
        assert_eq!(
            entries[9_999].address, "10.1.16.6",
            "the last of the second push"
        );
        assert_eq!(entries[0].location, "10.0.0.1");
        log.clear();
        assert!(log.entries().is_empty());
        log.push(drafts(2), 1);
        assert_eq!((log.entries().len(), log.dropped(), log.total()), (1, 1, 2));
    }
}
