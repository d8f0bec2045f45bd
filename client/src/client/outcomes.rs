//! What the writes of a [`super::Writer`] answer: the updates the server rejected, and the
//! outcome of `Apply` and `Resync`; the resync scopes.

use std::fmt;

use clb_proto::v1::{ItemError, WriterSession};

/// One rejected update: its position in what the caller passed, and the server's reason.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    /// Position of the update in the caller's list (or in the whole stream).
    pub position: usize,
    /// The server's error (field, value, reason).
    pub error: ItemError,
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "update #{}: field {} = {:?}: {}",
            self.position, self.error.field, self.error.value, self.error.reason
        )
    }
}

/// What an `Apply` (single, batched or streamed) did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApplyOutcome {
    /// The state revision after the last batch.
    pub revision: u64,
    /// Updates applied.
    pub applied: u64,
    /// Updates rejected (nothing of them was applied).
    pub rejected: Vec<Rejected>,
    /// Batches sent.
    pub batches: u64,
    /// The writer's session as the last batch's answer stated it (see [`super::Writer::watch_session`]).
    pub session: Option<WriterSession>,
}

impl ApplyOutcome {
    /// The rejected items, one per line (empty when none).
    pub fn describe_rejected(&self) -> String {
        describe(&self.rejected)
    }

    pub(super) fn add(&mut self, offset: usize, r: clb_proto::v1::ApplyResponse) {
        let clb_proto::v1::ApplyResponse {
            revision,
            applied,
            rejected,
            session,
            ..
        } = r;
        if session.is_some() {
            self.session = session;
        }
        self.revision = self.revision.max(revision);
        self.applied += u64::from(applied);
        self.batches += 1;
        self.rejected
            .extend(rejected.into_iter().map(|error| Rejected {
                position: offset + error.index as usize,
                error,
            }));
    }
}

/// What a `Resync` did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResyncOutcome {
    /// The state revision after the resync.
    pub revision: u64,
    /// Updates applied.
    pub applied: u64,
    /// Entries of the scope that the view no longer held, removed.
    pub removed: u64,
    /// Updates rejected.
    pub rejected: Vec<Rejected>,
    /// The writer's session after the resync (its `epoch` is the one later answers should show).
    pub session: Option<WriterSession>,
}

impl ResyncOutcome {
    /// The rejected items, one per line (empty when none).
    pub fn describe_rejected(&self) -> String {
        describe(&self.rejected)
    }
}

fn describe(rejected: &[Rejected]) -> String {
    rejected
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Resync scopes.
pub mod scope {
    use clb_proto::v1::ResyncScope;

    /// Everything a cluster-wide watcher writes: services, egresses, endpoints and pods.
    pub fn all() -> ResyncScope {
        ResyncScope {
            services: true,
            egresses: true,
            endpoints: true,
            pods: true,
            location: String::new(),
        }
    }

    /// The pods of one location (a node agent's view of its node).
    pub fn pods_at(location: &str) -> ResyncScope {
        ResyncScope {
            pods: true,
            location: location.to_owned(),
            ..ResyncScope::default()
        }
    }

    /// The pods this writer wrote, at every location.
    pub fn pods() -> ResyncScope {
        ResyncScope {
            pods: true,
            ..ResyncScope::default()
        }
    }
}
