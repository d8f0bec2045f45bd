//! The removal gate: which removals the tracker withholds, per location and per kind of service
//! deletion.
//!
//! A restarted state server knows NRP (once read back) but not yet the truth of every writer. Until
//! the writer that owns a piece of desired state has resynced, the diffs that could remove that
//! piece from NRP are withheld: at a withheld location the diff only adds (each address's ref is the
//! union of the filtered desired ref and NRP's, no full update, no location deletion), and a service
//! whose deletions are withheld is never sent for deletion. Adds and updates are never held back.

use std::collections::HashSet;
use std::net::IpAddr;

use super::DiffTracker;
use super::identity::ServiceKind;

/// Which locations' removals are withheld.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WithheldLocations {
    /// Every location, including those not known yet.
    All,
    /// Only these locations; removals at any other location are sent.
    Only(HashSet<IpAddr>),
}

/// The removals a [`DiffTracker`] withholds (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Withheld {
    /// Locations whose diffs only add.
    pub locations: WithheldLocations,
    /// Whether inbound services (load balancers) are kept from deletion.
    pub inbound_deletions: bool,
    /// Whether outbound services (NAT gateways) are kept from deletion.
    pub outbound_deletions: bool,
}

impl Default for Withheld {
    /// Nothing withheld.
    fn default() -> Self {
        Self::nothing()
    }
}

impl Withheld {
    /// Every removal withheld, at every location (known or not) and of every service.
    pub fn everything() -> Self {
        Self {
            locations: WithheldLocations::All,
            inbound_deletions: true,
            outbound_deletions: true,
        }
    }

    /// No removal withheld.
    pub fn nothing() -> Self {
        Self {
            locations: WithheldLocations::Only(HashSet::new()),
            inbound_deletions: false,
            outbound_deletions: false,
        }
    }

    /// True if no removal is withheld.
    pub fn is_nothing(&self) -> bool {
        !self.inbound_deletions
            && !self.outbound_deletions
            && matches!(&self.locations, WithheldLocations::Only(s) if s.is_empty())
    }

    /// Whether removals at `location` are withheld.
    pub fn location(&self, location: IpAddr) -> bool {
        match &self.locations {
            WithheldLocations::All => true,
            WithheldLocations::Only(set) => set.contains(&location),
        }
    }

    /// Whether deletions of services of `kind` are withheld.
    pub fn deletions_of(&self, kind: ServiceKind) -> bool {
        match kind {
            ServiceKind::Inbound => self.inbound_deletions,
            ServiceKind::Outbound => self.outbound_deletions,
        }
    }
}

impl DiffTracker {
    /// Whether diffs may remove anything from NRP (nothing is withheld).
    pub fn removals_allowed(&self) -> bool {
        self.withheld.is_nothing()
    }

    /// Withholds every removal (false) or none (true); see [`DiffTracker::set_withheld`].
    pub fn set_removals_allowed(&mut self, allowed: bool) {
        self.set_withheld(if allowed {
            Withheld::nothing()
        } else {
            Withheld::everything()
        });
    }

    /// The removals withheld now.
    pub fn withheld(&self) -> &Withheld {
        &self.withheld
    }

    /// Whether removals at `location` are withheld.
    pub fn location_removals_withheld(&self, location: IpAddr) -> bool {
        self.withheld.location(location)
    }

    /// Sets what is withheld: at a withheld location, diffs only add (no address removal, no ref
    /// dropped, partial instead of full updates since a full update would replace what NRP has, no
    /// location deletion); services of a kind whose deletions are withheld are not deleted. Every
    /// location and service whose removals this allows again is dirtied, so that what was withheld
    /// is sent. Costs O(locations) when the locations change, O(services) when a deletion flag
    /// drops.
    pub fn set_withheld(&mut self, withheld: Withheld) {
        if withheld == self.withheld {
            return;
        }
        let old = std::mem::replace(&mut self.withheld, withheld);
        if old.locations != self.withheld.locations {
            let released: Vec<IpAddr> = self
                .locations
                .iter()
                .map(|(l, _)| l)
                .filter(|l| old.location(*l) && !self.withheld.location(*l))
                .collect();
            for l in released {
                self.dirty_locations.push(l);
            }
        }
        let released_kinds: Vec<ServiceKind> = [ServiceKind::Inbound, ServiceKind::Outbound]
            .into_iter()
            .filter(|k| old.deletions_of(*k) && !self.withheld.deletions_of(*k))
            .collect();
        if !released_kinds.is_empty() {
            let names: Vec<Box<str>> = self
                .services
                .iter()
                .filter(|(_, e)| e.actual.is_some_and(|k| released_kinds.contains(&k)))
                .map(|(_, e)| e.name.clone())
                .collect();
            for n in names {
                self.dirty_services.push(n);
            }
        }
    }

    /// Addresses at `location` whose withheld diff keeps a ref (or the address itself) that the
    /// diff would otherwise drop from NRP: the removals held back there. 0 when the location's
    /// removals are not withheld. O(addresses of the location).
    pub fn withheld_removals_at(&self, location: IpAddr) -> usize {
        if !self.withheld.location(location) {
            return 0;
        }
        let Some(loc) = self.locations.get(&location) else {
            return 0;
        };
        loc.addresses
            .iter()
            .filter(|(address, slot)| {
                let want = self.filtered(*address, slot);
                slot.actual()
                    .iter()
                    .any(|id| want.binary_search(id).is_err())
            })
            .count()
    }

    /// Locations (known to the tracker) whose removals are withheld and that hold back at least
    /// one removal, with the number held back (see [`DiffTracker::withheld_removals_at`]).
    /// O(locations) with `WithheldLocations::All`, O(withheld locations) otherwise.
    pub fn withheld_removals(&self) -> Vec<(IpAddr, usize)> {
        let held = |l: IpAddr| (l, self.withheld_removals_at(l));
        let mut out: Vec<(IpAddr, usize)> = match &self.withheld.locations {
            WithheldLocations::All => self.locations.iter().map(|(l, _)| held(l)).collect(),
            WithheldLocations::Only(set) => set.iter().map(|l| held(*l)).collect(),
        };
        out.retain(|(_, n)| *n > 0);
        out.sort_unstable();
        out
    }

    /// Services NRP has that are no longer desired and whose deletion is withheld.
    pub fn withheld_deletions(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .services
            .iter()
            .filter(|(_, e)| {
                !e.is_desired() && e.actual.is_some_and(|k| self.withheld.deletions_of(k))
            })
            .map(|(_, e)| e.name.to_string())
            .collect();
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::difftracker::{
        ActualSnapshot, AddressUpdateAction, Endpoint, Operation, ServiceAction, ServiceStatus,
    };

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// NRP as a previous server left it: svc-a at two locations (one address also with egress
    /// eg), a third location of a node that is gone, and two services nobody wants any more.
    fn restarted(withheld: Withheld) -> DiffTracker {
        let mut t = DiffTracker::new();
        t.set_withheld(withheld);
        t.observe(&ActualSnapshot {
            load_balancers: names(&["svc-a", "svc-old"]),
            nat_gateways: names(&["eg", "eg-old"]),
            locations: vec![
                (
                    ip("10.0.0.1"),
                    vec![(ip("10.1.0.1"), names(&["eg", "svc-a"]))],
                ),
                (ip("10.0.0.2"), vec![(ip("10.1.0.2"), names(&["svc-a"]))]),
                (ip("10.0.0.3"), vec![(ip("10.1.0.3"), names(&["svc-a"]))]),
            ],
        })
        .unwrap();
        // The watcher resynced: svc-a is backed by 10.1.0.1 only. Nobody reported pods yet.
        t.update_service(Operation::Add, "svc-a").unwrap();
        t.set_endpoints(
            "svc-a",
            &[Endpoint {
                address: "10.1.0.1",
                location: "10.0.0.1",
            }],
        )
        .unwrap();
        t
    }

    #[test]
    fn only_the_withheld_locations_and_kinds_keep_what_nrp_has() {
        let mut t = restarted(Withheld {
            locations: WithheldLocations::Only([ip("10.0.0.1"), ip("10.0.0.2")].into()),
            inbound_deletions: false,
            outbound_deletions: true,
        });
        assert!(!t.removals_allowed());
        let diff = t.pending_diff();
        // 10.0.0.1 and 10.0.0.2 wait for their pod owners: the egress ref and svc-a stay.
        assert_eq!(diff.locations.len(), 1, "{diff:?}");
        assert!(diff.locations[0].deletes_location());
        assert_eq!(diff.locations[0].location, ip("10.0.0.3"));
        assert_eq!(t.withheld_removals_at(ip("10.0.0.1")), 1);
        assert_eq!(t.withheld_removals_at(ip("10.0.0.2")), 1);
        assert_eq!(t.withheld_removals_at(ip("10.0.0.3")), 0, "not withheld");
        assert_eq!(
            t.withheld_removals(),
            vec![(ip("10.0.0.1"), 1), (ip("10.0.0.2"), 1)]
        );
        // Inbound deletions are allowed (svc-old drained already), outbound ones are not.
        assert!(matches!(
            t.service_status("svc-old"),
            ServiceStatus::Pending(c) if c.action == ServiceAction::Delete
        ));
        assert_eq!(t.service_status("eg-old"), ServiceStatus::Withheld);
        assert_eq!(t.withheld_deletions(), names(&["eg", "eg-old"]));

        // The owner of 10.0.0.2 resynced (no pods there): only that location is released.
        t.take_dirty();
        t.set_withheld(Withheld {
            locations: WithheldLocations::Only([ip("10.0.0.1")].into()),
            inbound_deletions: false,
            outbound_deletions: true,
        });
        assert_eq!(t.take_dirty().locations, vec![ip("10.0.0.2")]);
        let d = t.location_diff(ip("10.0.0.2")).expect("released");
        assert!(d.deletes_location(), "{d:?}");
        assert!(t.location_diff(ip("10.0.0.1")).is_none());

        // Everything released: the egress ref goes, then the NAT gateways may.
        t.set_withheld(Withheld::nothing());
        let dirty = t.take_dirty();
        assert_eq!(dirty.locations, vec![ip("10.0.0.1")]);
        assert_eq!(dirty.services, names(&["eg", "eg-old"]));
        let d = t.location_diff(ip("10.0.0.1")).expect("released");
        assert_eq!(d.action, AddressUpdateAction::Partial);
        assert_eq!(d.addresses[0].services, names(&["svc-a"]));
        assert!(t.removals_allowed());
        assert!(t.withheld_removals().is_empty());
    }

    #[test]
    fn withholding_everything_covers_locations_not_known_yet() {
        let mut t = restarted(Withheld::everything());
        let diff = t.pending_diff();
        assert!(diff.locations.is_empty(), "{diff:?}");
        assert!(diff.services.is_empty(), "{diff:?}");
        assert_eq!(t.service_status("svc-old"), ServiceStatus::Withheld);
        // A location first seen now is withheld too.
        t.update_service(Operation::Add, "svc-b").unwrap();
        assert!(t.location_removals_withheld(ip("10.9.9.9")));
        t.set_removals_allowed(true);
        assert_eq!(t.withheld(), &Withheld::nothing());
        assert_eq!(t.pending_diff().locations.len(), 3);
    }
}
