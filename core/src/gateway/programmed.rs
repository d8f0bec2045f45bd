//! Whether NRP has what writers wait for: every address desired at a location (the watcher's node
//! moves between gateways), or one address at its location with its service (the pod readiness
//! gate). [`Awaiting`] keeps, for one follower, what it waits for and the answers it was given, so
//! that it is told only what changed (the state server's `WatchLocations` and `WatchAddresses`
//! streams push them).

use std::collections::HashMap;
use std::net::IpAddr;

use super::GatewayCore;
use super::condition::Condition;
use crate::difftracker::ServiceKind;
use crate::difftracker::view::ServiceView;

/// What a writer waits for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Awaited {
    /// Every address desired at this location (true also where nothing is desired).
    Location(IpAddr),
    /// One address at its location with a service (as the writer named it; compared ignoring
    /// ASCII case).
    Address {
        /// The location (node IP).
        location: IpAddr,
        /// The address (pod IP).
        address: IpAddr,
        /// The service (inbound identity, or egress name).
        service: String,
    },
}

impl GatewayCore {
    /// Whether NRP has every address desired at `location` (also where nothing is desired).
    pub fn location_programmed(&self, location: IpAddr) -> bool {
        self.tracker.location_programmed(location)
    }

    /// Whether NRP has `address` at `location` with `service` (any case).
    pub fn address_programmed(&self, location: IpAddr, address: IpAddr, service: &str) -> bool {
        self.tracker.address_programmed(location, address, service)
    }

    /// The programming condition of service `name` (any case), as an operator's read of the
    /// service derives it (its frontend IP only while NRP has it); `None` when the gateway does not
    /// know the service. What a writer names when what it awaited did not come.
    pub fn condition_of(&self, name: &str) -> Option<Condition> {
        let view = self.tracker.service_view(name)?;
        let frontend = match self.frontend(&view.name) {
            Some(ip) if view.kind == ServiceKind::Inbound && view.actual => ip,
            _ => "",
        };
        Some(self.service_condition(&view, frontend))
    }

    /// The desired state's revision.
    pub fn revision(&self) -> u64 {
        self.tracker.revision()
    }

    /// Whether NRP was read back since the state started: only then does a service the gateway
    /// does not know mean that NRP does not have it.
    pub fn nrp_observed(&self) -> bool {
        self.gate.nrp_observed()
    }

    /// Both sides of every service of `kind` the gateway knows (desired or in NRP), in no
    /// particular order. O(services).
    pub fn service_views(&self, kind: ServiceKind) -> impl Iterator<Item = ServiceView> + '_ {
        self.tracker.service_views(kind)
    }

    /// The answer to `awaited` now.
    pub fn programmed(&self, awaited: &Awaited) -> bool {
        match awaited {
            Awaited::Location(location) => self.location_programmed(*location),
            Awaited::Address {
                location,
                address,
                service,
            } => self.address_programmed(*location, *address, service),
        }
    }
}

/// What one follower waits for, the answer it was last given for each (in the order it began to
/// wait), and the answers it is owed: new ones and changed ones.
#[derive(Debug, Default)]
pub struct Awaiting {
    /// Each awaited thing with the answer last given (`None`: not answered yet).
    answers: Vec<(Awaited, Option<bool>)>,
    /// Where each awaited thing is in `answers`.
    index: HashMap<Awaited, usize>,
    /// Positions in `answers` whose answer is owed (each once).
    owed: Vec<usize>,
}

impl Awaiting {
    /// Waits for `awaited` from now on (nothing if it is awaited already); its first answer is owed
    /// at the next [`Awaiting::refresh`].
    pub fn watch(&mut self, awaited: Awaited) {
        if self.index.contains_key(&awaited) {
            return;
        }
        self.index.insert(awaited.clone(), self.answers.len());
        self.answers.push((awaited, None));
    }

    /// Stops waiting for `awaited` (nothing if it is not awaited).
    pub fn unwatch(&mut self, awaited: &Awaited) {
        let Some(at) = self.index.remove(awaited) else {
            return;
        };
        self.answers.swap_remove(at);
        if let Some((moved, _)) = self.answers.get(at) {
            self.index.insert(moved.clone(), at);
        }
        // Owed answers are positions: drop the one removed, follow the one moved into its place.
        let last = self.answers.len();
        self.owed.retain(|p| *p != at);
        for p in &mut self.owed {
            if *p == last {
                *p = at;
            }
        }
    }

    /// How many things are awaited.
    pub fn len(&self) -> usize {
        self.answers.len()
    }

    /// Whether nothing is awaited.
    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }

    /// Answers everything awaited against `gateway`; returns whether any answer is owed (new or
    /// changed since it was last given). O(things awaited).
    pub fn refresh(&mut self, gateway: &GatewayCore) -> bool {
        for (at, (awaited, last)) in self.answers.iter_mut().enumerate() {
            let now = gateway.programmed(awaited);
            if *last != Some(now) {
                self.owed.push(at);
                *last = Some(now);
            }
        }
        self.owed.sort_unstable();
        self.owed.dedup();
        !self.owed.is_empty()
    }

    /// Takes the answers owed, in the order their things began to be awaited.
    pub fn take_owed(&mut self) -> Vec<(Awaited, bool)> {
        let owed = std::mem::take(&mut self.owed);
        owed.into_iter()
            .filter_map(|at| {
                let (awaited, answer) = self.answers.get(at)?;
                Some((awaited.clone(), (*answer)?))
            })
            .collect()
    }
}
