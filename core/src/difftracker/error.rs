//! Typed errors for input the DiffTracker refuses: every error names the field, the value and the reason.

use std::fmt;

/// Why a value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reason {
    /// The field was empty but must hold a value.
    #[error("must not be empty")]
    Empty,
    /// The value does not parse as an IPv4 or IPv6 address.
    #[error("is not an IPv4 or IPv6 address")]
    MalformedIp,
    /// The address is unspecified, multicast or broadcast, which no pod or node can have.
    #[error("is not a unicast address")]
    NotUnicast,
    /// An address and its location are of different IP families.
    #[error("is {family} but its location {location} is {location_family}")]
    MixedFamily {
        /// Family of the address ("IPv4" or "IPv6").
        family: &'static str,
        /// The location the address was given with.
        location: String,
        /// Family of the location.
        location_family: &'static str,
    },
    /// An identity is longer than NRP accepts.
    #[error("is {len} characters long; at most {max} are allowed")]
    TooLong {
        /// The length given.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// An identity holds a character outside `[A-Za-z0-9._-]`.
    #[error("holds {0:?}; only letters, digits, '.', '_' and '-' are allowed")]
    InvalidCharacter(char),
    /// The same address appears twice in one set.
    #[error("appears twice (first at {first})")]
    Duplicate {
        /// Field path of the first occurrence.
        first: String,
    },
    /// The identity is already used with the other kind (inbound vs outbound).
    #[error("is already a {existing} identity")]
    KindConflict {
        /// The kind the identity already has.
        existing: &'static str,
    },
    /// A report names a service that NRP does not have in the actual state.
    #[error("refers to service {0:?}, which is not in NRP's actual state")]
    UnknownActualService(String),
    /// A report deletes a service that addresses in NRP still refer to.
    #[error("is still referred to by {0} addresses in NRP")]
    StillReferenced(u32),
}

/// Input that was refused; nothing of the update it belongs to was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct InvalidInput {
    /// Path of the offending field, e.g. `endpoints[3].address`.
    pub field: String,
    /// The offending value as given.
    pub value: String,
    /// Why it was refused.
    pub reason: Reason,
}

impl InvalidInput {
    /// Builds an error for `field` holding `value`.
    pub fn new(field: impl Into<String>, value: impl Into<String>, reason: Reason) -> Self {
        Self {
            field: field.into(),
            value: value.into(),
            reason,
        }
    }

    /// Prefixes the field path, e.g. `address` within `pod` becomes `pod.address`.
    #[must_use]
    pub fn within(mut self, prefix: &str) -> Self {
        self.field = if self.field.is_empty() {
            prefix.to_owned()
        } else {
            format!("{prefix}.{}", self.field)
        };
        self
    }
}

impl fmt::Display for InvalidInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {:?}: {}", self.field, self.value, self.reason)
    }
}
