//! A property of IP families (contract §3.1.5): whatever the sequence of service adds (with a
//! family, or none), removals, endpoint sets of both families and NRP rounds, no desired address
//! ever refers to a service of a stated family other than its own, nor does any address in NRP
//! unless the service was once of no stated family (a writer from before families: NRP may still
//! hold its other family's addresses until they are drained); a refused update changes nothing;
//! and once the updates stop, applying the difference converges.

use std::collections::BTreeSet;

use clb_core::difftracker::{DiffTracker, Endpoint, IpFamily, Operation, ServiceAction};
use proptest::prelude::*;

const SERVICES: [&str; 3] = ["svc-a", "svc-b", "svc-c"];
const V4: [(&str, &str); 3] = [
    ("10.1.0.1", "10.0.0.1"),
    ("10.1.0.2", "10.0.0.1"),
    ("10.1.0.3", "10.0.0.2"),
];
const V6: [(&str, &str); 3] = [
    ("fd01::1", "fd00::1"),
    ("fd01::2", "fd00::1"),
    ("fd01::3", "fd00::2"),
];
const LOCATIONS: [&str; 4] = ["10.0.0.1", "10.0.0.2", "fd00::1", "fd00::2"];

#[derive(Debug, Clone)]
enum Step {
    Add(usize, Option<IpFamily>),
    Remove(usize),
    /// Endpoints: indexes into V4 and V6.
    Level(usize, Vec<usize>, Vec<usize>),
    /// One NRP round: creations, then locations, then deletions.
    Sync,
}

fn family() -> impl Strategy<Value = Option<IpFamily>> {
    prop_oneof![
        Just(None),
        Just(Some(IpFamily::V4)),
        Just(Some(IpFamily::V6))
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let idx = || prop::collection::btree_set(0..3usize, 0..3).prop_map(|s| s.into_iter().collect());
    prop_oneof![
        2 => (0..SERVICES.len(), family()).prop_map(|(s, f)| Step::Add(s, f)),
        1 => (0..SERVICES.len()).prop_map(Step::Remove),
        3 => (0..SERVICES.len(), idx(), idx()).prop_map(|(s, a, b)| Step::Level(s, a, b)),
        2 => Just(Step::Sync),
    ]
}

fn sync(t: &mut DiffTracker) {
    let diff = t.pending_diff();
    for s in diff
        .services
        .iter()
        .filter(|s| s.action == ServiceAction::Create)
    {
        t.record_service_applied(s).unwrap();
    }
    for l in &t.pending_diff().locations {
        t.record_location_applied(l).unwrap();
    }
    for s in t.pending_diff().services {
        t.record_service_applied(&s).unwrap();
    }
}

/// Every address refers (desired; and in NRP, but to the services of `unstated`) only to services
/// of its family or of none stated.
fn families_hold(t: &DiffTracker, unstated: &BTreeSet<&str>) -> Result<(), String> {
    for l in LOCATIONS {
        let Some(view) = t.location_view(l.parse().unwrap()) else {
            continue;
        };
        for a in &view.addresses {
            let actual = a
                .actual
                .iter()
                .flatten()
                .filter(|s| !unstated.contains(s.as_str()));
            for s in a.desired.iter().flatten().chain(actual) {
                if let Some(f) = t.service_family(s)
                    && f != IpFamily::of(a.address)
                {
                    return Err(format!("{} refers to {s}, which is {f}", a.address));
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_address_ever_refers_to_a_service_of_the_other_family(
        steps in prop::collection::vec(step(), 1..40)
    ) {
        let mut t = DiffTracker::new();
        let mut unstated = BTreeSet::new();
        for step in &steps {
            let before = (t.revision(), t.pending_diff(), t.counts());
            let result = match step {
                Step::Add(s, f) => {
                    if f.is_none() {
                        unstated.insert(SERVICES[*s]);
                    }
                    t.update_service_family(Operation::Add, SERVICES[*s], *f)
                }
                Step::Remove(s) => t.update_service(Operation::Remove, SERVICES[*s]),
                Step::Level(s, a, b) => {
                    let eps: Vec<Endpoint<'_>> = a
                        .iter()
                        .map(|&i| V4[i])
                        .chain(b.iter().map(|&i| V6[i]))
                        .map(|(address, location)| Endpoint { address, location })
                        .collect();
                    t.set_endpoints(SERVICES[*s], &eps)
                }
                Step::Sync => {
                    sync(&mut t);
                    Ok(())
                }
            };
            if result.is_err() {
                prop_assert_eq!(&before, &(t.revision(), t.pending_diff(), t.counts()), "a refusal changed state");
            }
            prop_assert_eq!(families_hold(&t, &unstated), Ok(()));
        }
        for _ in 0..4 {
            sync(&mut t);
        }
        prop_assert!(t.pending_diff().is_empty(), "{:?}", t.pending_diff());
        prop_assert_eq!(families_hold(&t, &unstated), Ok(()));
    }
}
