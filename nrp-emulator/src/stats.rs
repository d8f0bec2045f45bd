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

/// The bounded log of removals.
#[derive(Debug, Default)]
pub(crate) struct RemovalLog {
    entries: VecDeque<Removal>,
    next_seq: u64,
    dropped: u64,
}

impl RemovalLog {
    pub(crate) fn push(&mut self, drafts: Vec<RemovalDraft>, capacity: usize) {
        for d in drafts {
            self.next_seq += 1;
            self.entries.push_back(Removal {
                seq: self.next_seq,
                gateway: d.gateway,
                location: d.location.to_string(),
                address: d.address.to_string(),
                removed_services: d.removed_services,
                address_removed: d.address_removed,
                cause: d.cause,
            });
        }
        while self.entries.len() > capacity {
            self.entries.pop_front();
            self.dropped += 1;
        }
    }

    pub(crate) fn entries(&self) -> Vec<Removal> {
        self.entries.iter().cloned().collect()
    }

    pub(crate) fn total(&self) -> u64 {
        self.next_seq
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.dropped = 0;
        self.next_seq = 0;
    }
}
