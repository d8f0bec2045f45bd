//! clb's domain, with no runtime, no network and no Kubernetes (Cargo enforces it: this crate depends
//! on std and small data-structure crates only).
//!
//! - [`difftracker`]: desired state (from Kubernetes) beside actual state (confirmed by NRP), per
//!   location and address, and the incremental difference between them.
//! - [`dispatch`]: turns that difference into leased work units (packing, one unit in flight per key,
//!   backoff, parking, read-back); time, jitter and the observer of outcomes are passed in.
//! - [`gateway`]: one gateway's rules around both: the restart gate, the writers, the port book
//!   of inbound services; what the state server's task per gateway drives.

// The oracle of the integration tests also serves the unit tests, which name the crate as they do.
#[cfg(test)]
extern crate self as clb_core;

pub mod difftracker;
pub mod dispatch;
pub mod gateway;

/// Milliseconds since the Unix epoch of `t` (0 before it).
pub fn unix_ms(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
