//! Typed errors for input the DiffTracker refuses: every error names the field, the value and the reason.
//!
//! A value given by a client is never echoed in full: [`quote`] (in messages) and [`excerpt`] (as
//! a field's value) keep at most [`MAX_QUOTED_CHARS`] characters of it and mark the cut, so that a
//! huge value cannot make a huge error (a gRPC status message travels in a header, and a header
//! over the peer's limit turns the answer into `RESOURCE_EXHAUSTED`).

use std::borrow::Cow;
use std::fmt;

/// Most characters of a client's value that an error message quotes or an error echoes back.
pub const MAX_QUOTED_CHARS: usize = 100;

/// The first [`MAX_QUOTED_CHARS`] characters of `value` when it has more (cut on a character
/// boundary), `None` when it is short enough to be shown whole.
fn cut(value: &str) -> Option<&str> {
    value
        .char_indices()
        .nth(MAX_QUOTED_CHARS)
        .map(|(end, _)| &value[..end])
}

/// `value` for an error message, quoted and escaped as `{:?}` would. A value longer than
/// [`MAX_QUOTED_CHARS`] characters is cut to them, marked with `…` and followed by its length:
/// `"aaaa…" (1048576 bytes)`.
pub fn quote(value: &str) -> Quoted<'_> {
    Quoted(value)
}

/// A value as [`quote`] shows it (formats with `Display`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match cut(self.0) {
            None => write!(f, "{:?}", self.0),
            Some(head) => {
                let quoted = format!("{head:?}");
                let open = &quoted[..quoted.len() - 1];
                write!(f, "{open}…\" ({} bytes)", self.0.len())
            }
        }
    }
}

/// `value` to echo back as the value of a refused field (unquoted): whole when it has at most
/// [`MAX_QUOTED_CHARS`] characters, else those followed by `…` and its length:
/// `aaaa… (1048576 bytes)`.
pub fn excerpt(value: &str) -> Cow<'_, str> {
    match cut(value) {
        None => Cow::Borrowed(value),
        Some(head) => Cow::Owned(format!("{head}… ({} bytes)", value.len())),
    }
}

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
    /// An identity ends with a character an Azure resource name cannot end with.
    #[error(
        "ends with {0:?}; it must end with a letter, a digit or '_' (Azure's resource names made of it, such as lb-<identity>, end so)"
    )]
    InvalidEnd(char),
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
    /// An endpoint of an inbound service is of another IP family than the service.
    #[error("is {family} but service {} is {service_family}: an endpoint must be of its service's IP family (a service of no stated family is IPv4, as its frontend; a dual-stack Service is one service per family)", quote(.service))]
    FamilyMismatch {
        /// Family of the endpoint ("IPv4" or "IPv6").
        family: &'static str,
        /// The service (canonical name).
        service: String,
        /// Family of the service.
        service_family: &'static str,
    },
    /// An inbound service is added with endpoints of another family than the one it states.
    #[error(
        "cannot be {family}: it has {count} {other} endpoint(s) (the first {first}); an endpoint must be of its service's IP family"
    )]
    FamilyOfEndpoints {
        /// The family stated.
        family: &'static str,
        /// How many endpoints are of the other family.
        count: usize,
        /// The other family.
        other: &'static str,
        /// One of them.
        first: String,
    },
    /// An inbound service is added with another frontend family than it has.
    #[error(
        "has an {existing} frontend; it cannot become {requested} (a family change is a new service id)"
    )]
    FamilyChange {
        /// The family of its frontend.
        existing: &'static str,
        /// The family asked for.
        requested: &'static str,
    },
    /// A NAT gateway name that ARM does not allow.
    #[error("is not a NAT gateway name: it {0}")]
    InvalidNatGatewayName(&'static str),
    /// A pod names another NAT gateway than the one its egress is bound to.
    #[error(
        "differs from the NAT gateway of egress {} ({}): every pod of an egress must name the same NAT gateway, and an egress keeps its NAT gateway while it is desired or in NRP (to change it, take the pods off the egress until NRP no longer has it, or use another egress name)",
        quote(.egress),
        match .existing { Some(n) => format!("{}, brought", quote(n)), None => "none: clb owns its NAT gateway".to_owned() }
    )]
    NatGatewayConflict {
        /// The egress.
        egress: String,
        /// The NAT gateway it is bound to (`None`: one clb owns).
        existing: Option<String>,
    },
    /// A report names a service that NRP does not have in the actual state.
    #[error("refers to service {}, which is not in NRP's actual state", quote(.0))]
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
        write!(
            f,
            "{} = {}: {}",
            self.field,
            quote(&self.value),
            self.reason
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_shown_whole() {
        assert_eq!(quote("").to_string(), "\"\"");
        assert_eq!(quote("a\"b").to_string(), "\"a\\\"b\"");
        let limit = "x".repeat(MAX_QUOTED_CHARS);
        assert_eq!(quote(&limit).to_string(), format!("\"{limit}\""));
        assert_eq!(excerpt(&limit), limit.as_str());
    }

    #[test]
    fn long_values_are_cut_on_a_character_boundary_with_a_marker_and_their_length() {
        let big = "a".repeat(1 << 20);
        let head = "a".repeat(MAX_QUOTED_CHARS);
        assert_eq!(
            quote(&big).to_string(),
            format!("\"{head}…\" (1048576 bytes)")
        );
        assert_eq!(excerpt(&big), format!("{head}… (1048576 bytes)"));
        // Multi-byte characters: 101 of them, 2 bytes each; the cut keeps 100 whole ones.
        let wide = "é".repeat(MAX_QUOTED_CHARS + 1);
        assert_eq!(
            excerpt(&wide),
            format!("{}… (202 bytes)", "é".repeat(MAX_QUOTED_CHARS))
        );
        // Escapes stay escaped inside the quotes.
        let tabs = "\t".repeat(MAX_QUOTED_CHARS + 1);
        let shown = quote(&tabs).to_string();
        assert!(shown.starts_with("\"\\t\\t"), "{shown}");
        assert!(shown.ends_with("\\t…\" (101 bytes)"), "{shown}");
    }

    #[test]
    fn an_invalid_input_quotes_at_most_the_limit_of_its_value() {
        let err = InvalidInput::new(
            "id",
            "b".repeat(5000),
            Reason::TooLong { len: 5000, max: 80 },
        );
        let shown = err.to_string();
        assert!(shown.starts_with("id = \"bbb"), "{shown}");
        assert!(
            shown.contains("…\" (5000 bytes): is 5000 characters long"),
            "{shown}"
        );
        assert!(shown.len() < 200, "{shown}");
        let reason = Reason::UnknownActualService("c".repeat(300)).to_string();
        assert!(reason.contains("…\" (300 bytes), which"), "{reason}");
    }
}
