//! IP families of inbound services.
//!
//! Azure serves a dual-stack Service as one unit per family: each its own public IP, load balancer,
//! backend pool and Service Gateway service, and a backend pool holds addresses of one IP version.
//! A writer therefore states the family of each inbound identity it adds (a dual-stack Service is
//! two identities); the tracker keeps it and refuses what cannot be served:
//!
//! - an endpoint of the other family than its service's (field, value, why; nothing applied);
//! - an add that states another family than the service's desired endpoints have;
//! - an add that would change the family of the service's frontend while the tracker still knows
//!   the service (desired, or NRP may have it): a family change is a new identity.
//!
//! A service added without a family is IPv4, as its frontend is: an IPv6 endpoint of it is refused
//! like any endpoint of the other family (NRP refuses a backend pool whose addresses have another
//! version than its frontend, and the refusal would hold up every change at the endpoint's
//! location).

use std::fmt;
use std::net::IpAddr;

use super::DiffTracker;
use super::error::{InvalidInput, Reason};
use super::identity::{ServiceId, ServiceKind};

/// An IP family: the version of a frontend and of the addresses of its backend pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamily {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl IpFamily {
    /// The family of an address.
    pub fn of(ip: IpAddr) -> Self {
        if ip.is_ipv4() { Self::V4 } else { Self::V6 }
    }

    /// `IPv4` or `IPv6`, as Kubernetes and Azure spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }

    fn other(self) -> Self {
        match self {
            Self::V4 => Self::V6,
            Self::V6 => Self::V4,
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The value of a stated family in an error (empty when none was stated).
fn value(family: Option<IpFamily>) -> &'static str {
    family.map_or("", IpFamily::as_str)
}

impl DiffTracker {
    /// The IP family stated for inbound identity `name` (any case), if it is known as one and a
    /// family was stated: what its creation in NRP is made of (`None`: an IPv4 frontend).
    pub fn service_family(&self, name: &str) -> Option<IpFamily> {
        let sid = self.services.id(&name.to_ascii_lowercase())?;
        let e = self.services.get(sid);
        (e.kind == ServiceKind::Inbound)
            .then_some(e.family)
            .flatten()
    }

    /// Checks that inbound identity `sid` may be added with `family` (see the module
    /// documentation); `field` is the family's field path.
    pub(super) fn check_add_family(
        &self,
        sid: ServiceId,
        family: Option<IpFamily>,
    ) -> Result<(), InvalidInput> {
        let e = self.services.get(sid);
        let frontend = family.unwrap_or(IpFamily::V4);
        if let Some(existing) = e.frontend
            && existing != frontend
        {
            return Err(InvalidInput::new(
                "ip_family",
                value(family),
                Reason::FamilyChange {
                    existing: existing.as_str(),
                    requested: frontend.as_str(),
                },
            ));
        }
        {
            let f = frontend;
            let mut others = e
                .addresses
                .iter()
                .filter(|(a, _)| IpFamily::of(*a) != f)
                .map(|(a, _)| a);
            if let Some(first) = others.next() {
                return Err(InvalidInput::new(
                    "ip_family",
                    value(family),
                    Reason::FamilyOfEndpoints {
                        family: f.as_str(),
                        count: 1 + others.count(),
                        other: f.other().as_str(),
                        first: first.to_string(),
                    },
                ));
            }
        }
        Ok(())
    }

    /// Records the family inbound identity `sid` was added with.
    pub(super) fn set_add_family(&mut self, sid: ServiceId, family: Option<IpFamily>) {
        let e = self.services.get_mut(sid);
        e.family = family;
        e.frontend = Some(family.unwrap_or(IpFamily::V4));
    }

    /// Checks a checked endpoint set (address, location, position in the input) of inbound
    /// identity `sid` against its family: the first endpoint in input order of another family is
    /// refused as `{field}[{position}].address`.
    pub(super) fn check_endpoint_families(
        &self,
        sid: ServiceId,
        field: &str,
        checked: &[(IpAddr, IpAddr, u32)],
    ) -> Result<(), InvalidInput> {
        let e = self.services.get(sid);
        // A service of no stated family is IPv4 (its frontend); one only named by endpoints so far
        // is checked when it is added.
        let Some(f) = e.family.or(e.frontend) else {
            return Ok(());
        };
        let wrong = checked
            .iter()
            .filter(|(a, _, _)| IpFamily::of(*a) != f)
            .min_by_key(|(_, _, i)| *i);
        match wrong {
            None => Ok(()),
            Some(&(address, _, i)) => Err(InvalidInput::new(
                format!("{field}[{i}].address"),
                address.to_string(),
                Reason::FamilyMismatch {
                    family: IpFamily::of(address).as_str(),
                    service: e.name.to_string(),
                    service_family: f.as_str(),
                },
            )),
        }
    }
}
