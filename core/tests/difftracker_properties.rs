//! Property tests: random desired mutations interleaved with NRP accepting all, some or none of
//! the pending diff. The incremental DiffTracker must agree with the naive oracle at every step,
//! reach an empty diff once updates stop, never let NRP hold a ref to a service it lacks, and
//! never delete a service that is still referenced.

mod support;

use std::collections::BTreeSet;
use std::net::IpAddr;

use clb_core::difftracker::{DiffTracker, Endpoint, IpFamily, Operation, PodUpdate, ServiceAction};
use proptest::prelude::*;
use support::oracle::Oracle;

const V4_LOCATIONS: [&str; 4] = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"];
const V6_LOCATIONS: [&str; 2] = ["fd00::a", "fd00::b"];
const V4_ADDRESSES: [&str; 10] = [
    "10.1.0.1",
    "10.1.0.2",
    "10.1.0.3",
    "10.1.0.4",
    "10.1.0.5",
    "10.1.0.6",
    "10.1.0.7",
    "10.1.0.8",
    "10.1.0.9",
    "10.1.0.10",
];
const V6_ADDRESSES: [&str; 3] = ["fd00::1:1", "fd00::1:2", "fd00::1:3"];
const SERVICES: [&str; 4] = ["svc-a", "SVC-b", "svc-c", "svc-d"];
const EGRESSES: [&str; 3] = ["eg-a", "EG-b", "eg-c"];
const UIDS: [&str; 3] = ["", "uid-1", "uid-2"];

/// An address and a location of its family.
fn endpoint() -> impl Strategy<Value = (&'static str, &'static str)> {
    prop_oneof![
        3 => (0..V4_ADDRESSES.len(), 0..V4_LOCATIONS.len()).prop_map(|(a, l)| (V4_ADDRESSES[a], V4_LOCATIONS[l])),
        1 => (0..V6_ADDRESSES.len(), 0..V6_LOCATIONS.len()).prop_map(|(a, l)| (V6_ADDRESSES[a], V6_LOCATIONS[l])),
    ]
}

/// A duplicate-free endpoint set.
fn endpoint_set() -> impl Strategy<Value = Vec<(&'static str, &'static str)>> {
    prop::collection::vec(endpoint(), 0..6).prop_map(|v| {
        let mut seen = BTreeSet::new();
        v.into_iter().filter(|(a, _)| seen.insert(*a)).collect()
    })
}

fn op() -> impl Strategy<Value = Operation> {
    prop_oneof![3 => Just(Operation::Add), 1 => Just(Operation::Remove)]
}

#[derive(Debug, Clone)]
enum Accept {
    All,
    /// Bit i accepts the i-th change of each round.
    Some(u64),
    None,
}

#[derive(Debug, Clone)]
enum Step {
    Service(Operation, usize),
    /// The service's ports changed: create it again.
    Reprogram(usize),
    Egress(Operation, usize),
    Level(usize, Vec<(&'static str, &'static str)>),
    Edge(
        usize,
        Vec<(&'static str, &'static str)>,
        Vec<(&'static str, &'static str)>,
    ),
    Pod(
        Operation,
        (&'static str, &'static str),
        Option<usize>,
        usize,
    ),
    Invalid(usize),
    Sync(Accept),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (op(), 0..SERVICES.len()).prop_map(|(o, s)| Step::Service(o, s)),
        1 => (0..SERVICES.len()).prop_map(Step::Reprogram),
        1 => (op(), 0..EGRESSES.len()).prop_map(|(o, e)| Step::Egress(o, e)),
        3 => (0..SERVICES.len(), endpoint_set()).prop_map(|(s, e)| Step::Level(s, e)),
        1 => (0..SERVICES.len(), endpoint_set(), endpoint_set()).prop_map(|(s, o, n)| Step::Edge(s, o, n)),
        3 => (op(), endpoint(), prop::option::of(0..EGRESSES.len()), 0..UIDS.len())
            .prop_map(|(o, e, g, u)| Step::Pod(o, e, g, u)),
        1 => (0..4usize).prop_map(Step::Invalid),
        3 => prop_oneof![Just(Accept::All), any::<u64>().prop_map(Accept::Some), Just(Accept::None)].prop_map(Step::Sync),
    ]
}

/// The service of `SERVICES` that is IPv6; the others state no family (IPv4).
const V6_SERVICE: usize = 3;

/// The endpoints of `set` of service `s`'s family (a service takes only its own: the tracker refuses
/// the others, as NRP would).
fn of_family(s: usize, set: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    set.iter()
        .copied()
        .filter(|(a, _)| a.contains(':') == (s == V6_SERVICE))
        .collect()
}

fn endpoints<'a>(v: &'a [(&'a str, &'a str)]) -> Vec<Endpoint<'a>> {
    v.iter()
        .map(|(address, location)| Endpoint { address, location })
        .collect()
}

/// The tracker, the oracle (whose actual state plays NRP) and what the worker model holds.
struct Harness {
    tracker: DiffTracker,
    oracle: Oracle,
    /// Locations taken from the dirty set and not yet applied (the dispatcher's in-flight set).
    pending_locations: BTreeSet<IpAddr>,
    pending_services: BTreeSet<String>,
}

impl Harness {
    fn new() -> Self {
        Self {
            tracker: DiffTracker::new(),
            oracle: Oracle::default(),
            pending_locations: BTreeSet::new(),
            pending_services: BTreeSet::new(),
        }
    }

    fn apply(&mut self, step: &Step) {
        let (t, o) = (&mut self.tracker, &mut self.oracle);
        match step {
            Step::Service(op, s) => {
                let family = (*s == V6_SERVICE).then_some(IpFamily::V6);
                t.update_service_family(*op, SERVICES[*s], family).unwrap();
                o.update_service(*op, SERVICES[*s]);
            }
            Step::Reprogram(s) => {
                t.reprogram_service(SERVICES[*s]).unwrap();
                o.reprogram_service(SERVICES[*s]);
            }
            Step::Egress(op, e) => {
                t.update_egress(*op, EGRESSES[*e]).unwrap();
                o.update_egress(*op, EGRESSES[*e]);
            }
            Step::Level(s, set) => {
                let set = of_family(*s, set);
                t.set_endpoints(SERVICES[*s], &endpoints(&set)).unwrap();
                o.set_endpoints(SERVICES[*s], &set);
            }
            Step::Edge(s, old, new) => {
                let (old, new) = (of_family(*s, old), of_family(*s, new));
                t.update_endpoints(SERVICES[*s], &endpoints(&old), &endpoints(&new))
                    .unwrap();
                o.update_endpoints(SERVICES[*s], &old, &new);
            }
            Step::Pod(op, (address, location), egress, uid) => {
                let outbound = egress.map_or("", |e| EGRESSES[e]);
                let pod = PodUpdate {
                    address,
                    location,
                    outbound_identity: outbound,
                    uid: UIDS[*uid],
                    ..Default::default()
                };
                t.update_pod(*op, &pod).unwrap();
                o.update_pod(*op, address, location, outbound, UIDS[*uid]);
            }
            Step::Invalid(kind) => {
                let before = (t.revision(), t.pending_diff(), t.counts());
                let result = match kind {
                    0 => t.set_endpoints(
                        "svc-a",
                        &[Endpoint {
                            address: "10.1.0.1",
                            location: "10.0.0.999",
                        }],
                    ),
                    1 => t.update_pod(
                        Operation::Add,
                        &PodUpdate {
                            address: "fd00::9",
                            location: "10.0.0.1",
                            outbound_identity: "eg-a",
                            uid: "",
                            ..Default::default()
                        },
                    ),
                    2 => t.update_service(Operation::Add, ""),
                    _ => t.update_endpoints(
                        "svc-b",
                        &[],
                        &[
                            Endpoint {
                                address: "10.1.0.1",
                                location: "10.0.0.1",
                            },
                            Endpoint {
                                address: "10.1.0.1",
                                location: "10.0.0.2",
                            },
                        ],
                    ),
                };
                assert!(result.is_err());
                assert_eq!(
                    before,
                    (t.revision(), t.pending_diff(), t.counts()),
                    "bad input changed state"
                );
            }
            Step::Sync(accept) => self.sync(accept),
        }
    }

    fn accepted(accept: &Accept, i: usize) -> bool {
        match accept {
            Accept::All => true,
            Accept::Some(bits) => bits >> (i % 64) & 1 == 1,
            Accept::None => false,
        }
    }

    /// One round of the worker model: creations, then locations, then deletions that are safe.
    fn sync(&mut self, accept: &Accept) {
        let mut i = 0;
        self.take_dirty();
        for name in self.pending_services.clone() {
            if let clb_core::difftracker::ServiceStatus::Pending(c) =
                self.tracker.service_status(&name)
                && c.action == ServiceAction::Create
            {
                i += 1;
                if Self::accepted(accept, i) {
                    self.tracker.record_service_applied(&c).unwrap();
                    self.oracle.record_service(&c);
                    self.pending_services.remove(&name);
                }
            }
        }
        self.take_dirty();
        for location in self.pending_locations.clone() {
            match self.tracker.location_diff(location) {
                None => {
                    self.pending_locations.remove(&location);
                }
                Some(d) => {
                    i += 1;
                    if Self::accepted(accept, i) {
                        self.tracker.record_location_applied(&d).unwrap();
                        self.oracle.record_location(&d);
                        self.pending_locations.remove(&location);
                    }
                }
            }
            assert!(
                self.oracle.actual_refs_are_known(),
                "NRP refers to a service it lacks"
            );
        }
        self.take_dirty();
        for name in self.pending_services.clone() {
            match self.tracker.service_status(&name) {
                clb_core::difftracker::ServiceStatus::Pending(c)
                    if c.action == ServiceAction::Delete =>
                {
                    i += 1;
                    if Self::accepted(accept, i) {
                        let referenced = self
                            .oracle
                            .actual
                            .values()
                            .any(|l| l.values().any(|refs| refs.contains(&c.name)));
                        assert!(!referenced, "service {} deleted while referenced", c.name);
                        self.tracker.record_service_applied(&c).unwrap();
                        self.oracle.record_service(&c);
                        self.pending_services.remove(&name);
                    }
                }
                clb_core::difftracker::ServiceStatus::Pending(_) => {}
                _ => {
                    self.pending_services.remove(&name);
                }
            }
        }
    }

    fn take_dirty(&mut self) {
        let dirty = self.tracker.take_dirty();
        self.pending_locations.extend(dirty.locations);
        self.pending_services.extend(dirty.services);
    }

    /// Property 1: the tracker's diff equals the oracle's, and every location or service with a
    /// pending change is tracked (dirty, or taken and not yet applied).
    fn check_agrees_with_oracle(&self) {
        let expected = self.oracle.diff();
        assert_eq!(self.tracker.pending_diff(), expected);
        for l in &expected.locations {
            assert!(
                self.tracker.is_location_dirty(l.location)
                    || self.pending_locations.contains(&l.location),
                "location {} has a pending change but is not tracked",
                l.location
            );
        }
        for s in &expected.services {
            assert!(
                self.tracker.is_service_dirty(&s.name) || self.pending_services.contains(&s.name),
                "service {} has a pending change but is not tracked",
                s.name
            );
        }
        assert!(self.oracle.actual_refs_are_known());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn incremental_diff_always_equals_the_oracle(steps in prop::collection::vec(step(), 1..60)) {
        let mut h = Harness::new();
        for s in &steps {
            h.apply(s);
            h.check_agrees_with_oracle();
        }
    }

    #[test]
    fn once_updates_stop_applying_diffs_reaches_an_empty_diff(steps in prop::collection::vec(step(), 1..60)) {
        let mut h = Harness::new();
        for s in &steps {
            h.apply(s);
        }
        for _ in 0..4 {
            h.sync(&Accept::All);
        }
        prop_assert!(h.tracker.pending_diff().is_empty(), "{:?}", h.tracker.pending_diff());
        prop_assert!(h.oracle.nrp_equals_desired(), "NRP differs from desired: {:?}", h.oracle);
    }

    #[test]
    fn diffs_are_the_same_with_removals_withheld_then_allowed(steps in prop::collection::vec(step(), 1..40)) {
        let mut h = Harness::new();
        h.tracker.set_removals_allowed(false);
        h.oracle.removals_allowed = false;
        let split = steps.len() / 2;
        for s in &steps[..split] {
            h.apply(s);
            h.check_agrees_with_oracle();
        }
        h.tracker.set_removals_allowed(true);
        h.oracle.removals_allowed = true;
        for s in &steps[split..] {
            h.apply(s);
            h.check_agrees_with_oracle();
        }
    }
}
