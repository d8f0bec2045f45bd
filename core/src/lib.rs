//! clb's domain, with no runtime, no network and no Kubernetes (Cargo enforces it: this crate depends
//! on std and small data-structure crates only).
//!
//! - [`difftracker`]: desired state (from Kubernetes) beside actual state (confirmed by NRP), per
//!   location and address, and the incremental difference between them.
//! - [`dispatch`]: turns that difference into leased work units (packing, one unit in flight per key,
//!   backoff, parking, read-back); time, jitter and the observer of outcomes are passed in.

// The oracle of the integration tests also serves the unit tests, which name the crate as they do.
#[cfg(test)]
extern crate self as clb_core;

pub mod difftracker;
pub mod dispatch;
