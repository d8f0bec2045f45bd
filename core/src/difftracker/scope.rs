//! Read access to what a writer's scope holds now, so that a resync can remove what the writer no
//! longer reports. Each listing is sorted and canonical (lower-case identities, canonical IPs).

use std::net::IpAddr;

use super::DiffTracker;
use super::identity::ServiceKind;

impl DiffTracker {
    /// Inbound identities (LoadBalancer Services) that Kubernetes wants, canonical names, sorted.
    pub fn desired_inbound_identities(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .services
            .iter()
            .filter(|(_, e)| e.desired_inbound)
            .map(|(_, e)| e.name.to_string())
            .collect();
        out.sort_unstable();
        out
    }

    /// Outbound identities declared explicitly (by an egress update), canonical names, sorted.
    /// An egress that exists only because pods use it is not listed.
    pub fn declared_egresses(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .services
            .iter()
            .filter(|(_, e)| e.egress.is_some_and(|g| g.declared))
            .map(|(_, e)| e.name.to_string())
            .collect();
        out.sort_unstable();
        out
    }

    /// Inbound identities with at least one desired endpoint, canonical names, sorted.
    pub fn services_with_endpoints(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .services
            .iter()
            .filter(|(_, e)| e.kind == ServiceKind::Inbound && e.desired_refs > 0)
            .map(|(_, e)| e.name.to_string())
            .collect();
        out.sort_unstable();
        out
    }

    /// Pods, as `(address, location)`, sorted: desired addresses that carry an outbound identity
    /// (the part of an address that a pod update sets). With `Some(location)`, only the pods at
    /// that location, in time proportional to it.
    pub fn pods(&self, location: Option<IpAddr>) -> Vec<(IpAddr, IpAddr)> {
        let mut out = Vec::new();
        let mut collect = |ip: IpAddr, loc: &super::location::Location| {
            for (address, slot) in loc.addresses.iter() {
                if slot.outbound.is_some() {
                    out.push((address, ip));
                }
            }
        };
        match location {
            Some(ip) => {
                if let Some(loc) = self.locations.get(&ip) {
                    collect(ip, loc);
                }
            }
            None => {
                for (ip, loc) in self.locations.iter() {
                    collect(ip, loc);
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// The number of locations where NRP has at least one address referring to the service (any
    /// case). A full scan (O(cluster)), for the read API only.
    pub fn actual_locations_of(&self, name: &str) -> u64 {
        let Some(sid) = self.services.id(&name.to_ascii_lowercase()) else {
            return 0;
        };
        let count = self
            .locations
            .iter()
            .filter(|(_, loc)| {
                loc.addresses
                    .iter()
                    .any(|(_, slot)| slot.actual().binary_search(&sid).is_ok())
            })
            .count();
        count as u64
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use crate::difftracker::{DiffTracker, Endpoint, Operation, PodUpdate};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn pod<'a>(address: &'a str, location: &'a str, egress: &'a str) -> PodUpdate<'a> {
        PodUpdate {
            address,
            location,
            outbound_identity: egress,
            uid: "",
            ..Default::default()
        }
    }

    #[test]
    fn listings_reflect_the_desired_state() {
        let mut t = DiffTracker::new();
        t.update_service(Operation::Add, "Svc-B").unwrap();
        t.update_service(Operation::Add, "svc-a").unwrap();
        t.set_endpoints(
            "svc-c",
            &[Endpoint {
                address: "10.1.0.1",
                location: "10.0.0.1",
            }],
        )
        .unwrap();
        t.update_egress(Operation::Add, "Eg-1").unwrap();
        t.update_pod(Operation::Add, &pod("10.1.0.2", "10.0.0.1", "eg-2"))
            .unwrap();
        t.update_pod(Operation::Add, &pod("10.1.0.3", "10.0.0.2", "eg-1"))
            .unwrap();
        // A pod without an egress leaves no record.
        t.update_pod(Operation::Add, &pod("10.1.0.4", "10.0.0.2", ""))
            .unwrap();

        assert_eq!(t.desired_inbound_identities(), vec!["svc-a", "svc-b"]);
        assert_eq!(t.declared_egresses(), vec!["eg-1"]);
        assert_eq!(t.services_with_endpoints(), vec!["svc-c"]);
        assert_eq!(
            t.pods(None),
            vec![
                (ip("10.1.0.2"), ip("10.0.0.1")),
                (ip("10.1.0.3"), ip("10.0.0.2"))
            ]
        );
        assert_eq!(
            t.pods(Some(ip("10.0.0.2"))),
            vec![(ip("10.1.0.3"), ip("10.0.0.2"))]
        );
        assert!(t.pods(Some(ip("10.0.0.9"))).is_empty());
    }

    #[test]
    fn removed_objects_leave_the_listings() {
        let mut t = DiffTracker::new();
        t.update_service(Operation::Add, "svc-a").unwrap();
        t.set_endpoints(
            "svc-a",
            &[Endpoint {
                address: "10.1.0.1",
                location: "10.0.0.1",
            }],
        )
        .unwrap();
        t.update_pod(Operation::Add, &pod("10.1.0.1", "10.0.0.1", "eg"))
            .unwrap();
        t.set_endpoints("svc-a", &[]).unwrap();
        assert!(t.services_with_endpoints().is_empty());
        assert_eq!(t.pods(None).len(), 1);
        t.update_pod(Operation::Remove, &pod("10.1.0.1", "10.0.0.1", ""))
            .unwrap();
        assert!(t.pods(None).is_empty());
        t.update_service(Operation::Remove, "svc-a").unwrap();
        assert!(t.desired_inbound_identities().is_empty());
    }

    #[test]
    fn actual_locations_count_what_nrp_confirmed() {
        let mut t = DiffTracker::new();
        t.update_service(Operation::Add, "svc-a").unwrap();
        t.set_endpoints(
            "svc-a",
            &[
                Endpoint {
                    address: "10.1.0.1",
                    location: "10.0.0.1",
                },
                Endpoint {
                    address: "10.1.0.2",
                    location: "10.0.0.2",
                },
            ],
        )
        .unwrap();
        assert_eq!(t.actual_locations_of("SVC-A"), 0);
        for s in t.pending_diff().services {
            t.record_service_applied(&s).unwrap();
        }
        let diff = t.pending_diff();
        t.record_location_applied(&diff.locations[0]).unwrap();
        assert_eq!(t.actual_locations_of("SVC-A"), 1);
        assert_eq!(t.actual_locations_of("unknown"), 0);
    }
}
