//! Tests of the indexes behind the endpoint and pod paths: the per-service address index (in both
//! its sorted and its hashed form: the crate's tests switch to hash maps above 8 addresses), the
//! egresses' location marks, the checking of endpoint sets by sorting, and the `_ip` methods.

#[path = "../../tests/support/oracle.rs"]
mod oracle;

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use super::ip::parse_address_at;
use super::*;
use oracle::Oracle;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ep<'a>(address: &'a str, location: &'a str) -> Endpoint<'a> {
    Endpoint { address, location }
}

/// The endpoint check as it was before the index (one by one, duplicates found with a map): the
/// errors of the sorting check must be exactly these.
fn check_one_by_one(field: &str, endpoints: &[Endpoint<'_>]) -> Result<(), InvalidInput> {
    let mut seen: HashMap<IpAddr, usize> = HashMap::new();
    for (i, e) in endpoints.iter().enumerate() {
        let (addr, _) = parse_address_at("address", e.address, "location", e.location)
            .map_err(|err| err.within(&format!("{field}[{i}]")))?;
        if let Some(first) = seen.insert(addr, i) {
            return Err(InvalidInput::new(
                format!("{field}[{i}].address"),
                e.address,
                Reason::Duplicate {
                    first: format!("{field}[{first}].address"),
                },
            ));
        }
    }
    Ok(())
}

/// The family rule of a service of no stated family (IPv4) over a list that passed the other
/// checks: its first IPv6 endpoint is refused.
fn ipv4_only(endpoints: &[Endpoint<'_>]) -> Result<(), InvalidInput> {
    match endpoints
        .iter()
        .enumerate()
        .find(|(_, e)| ip(e.address).is_ipv6() && !ip(e.address).to_canonical().is_ipv4())
    {
        None => Ok(()),
        Some((i, e)) => Err(InvalidInput::new(
            format!("endpoints[{i}].address"),
            ip(e.address).to_string(),
            Reason::FamilyMismatch {
                family: "IPv6",
                service: "svc".into(),
                service_family: "IPv4",
            },
        )),
    }
}

/// Every list of up to 4 endpoints over valid ones, spellings of one address, and each way of
/// being refused.
fn endpoint_lists() -> Vec<Vec<Endpoint<'static>>> {
    let alphabet = [
        ep("10.1.0.1", "10.0.0.1"),
        ep("10.1.0.2", "10.0.0.1"),
        ep("::ffff:10.1.0.1", "10.0.0.2"),
        ep("10.1.0.999", "10.0.0.1"),
        ep("10.1.0.3", ""),
        ep("fd00::1", "10.0.0.1"),
        ep("fd00::2", "fd00::a"),
        ep("224.0.0.1", "10.0.0.1"),
    ];
    let mut lists = vec![Vec::new()];
    let mut level = vec![Vec::new()];
    for _ in 0..4 {
        level = level
            .iter()
            .flat_map(|l: &Vec<Endpoint<'static>>| {
                alphabet.iter().map(move |e| {
                    let mut l = l.clone();
                    l.push(*e);
                    l
                })
            })
            .collect();
        lists.extend(level.iter().cloned());
    }
    lists
}

/// The list as parsed IPs, if every string parses.
fn parsed(list: &[Endpoint<'_>]) -> Option<Vec<EndpointIp>> {
    list.iter()
        .map(|e| {
            Some(EndpointIp {
                address: e.address.parse().ok()?,
                location: e.location.parse().ok()?,
            })
        })
        .collect()
}

#[test]
fn endpoint_errors_are_those_of_checking_one_by_one() {
    let mut t = DiffTracker::new();
    t.update_service(Operation::Add, "svc").unwrap();
    for list in endpoint_lists() {
        let expected = check_one_by_one("endpoints", &list).and_then(|()| ipv4_only(&list));
        let rev = t.revision();
        let got = t.set_endpoints("svc", &list);
        assert_eq!(got, expected, "{list:?}");
        if got.is_err() {
            assert_eq!(t.revision(), rev, "a refused set changed nothing: {list:?}");
        }
        // The same list parsed: the same field and reason, the IP as given for the value.
        if let Some(ips) = parsed(&list) {
            let got_ip = t.set_endpoints_ip("svc", &ips);
            match (&expected, got_ip) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(g)) => {
                    assert_eq!((&g.field, &g.reason), (&e.field, &e.reason), "{list:?}");
                    let i: usize = e.field["endpoints[".len()..]
                        .split(']')
                        .next()
                        .unwrap()
                        .parse()
                        .unwrap();
                    let given = if e.field.ends_with(".location") {
                        ips[i].location
                    } else {
                        ips[i].address
                    };
                    assert_eq!(g.value, given.to_string(), "{list:?}");
                }
                (e, g) => panic!("{list:?}: strings {e:?}, parsed {g:?}"),
            }
        }
    }
    // An edge update checks the old list first, then the new one.
    let bad_old = [ep("10.1.0.1", "10.0.0.1"), ep("10.1.0.1", "10.0.0.2")];
    let bad_new = [ep("10.1.0.999", "10.0.0.1")];
    let err = t.update_endpoints("svc", &bad_old, &bad_new).unwrap_err();
    assert_eq!(
        err,
        check_one_by_one("old_endpoints", &bad_old).unwrap_err()
    );
    let err = t
        .update_endpoints("svc", &bad_old[..1], &bad_new)
        .unwrap_err();
    assert_eq!(
        err,
        check_one_by_one("new_endpoints", &bad_new).unwrap_err()
    );
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const LOCATIONS4: [&str; 4] = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"];
const LOCATIONS6: [&str; 2] = ["fd00::a", "fd00::b"];
const SERVICES: [&str; 3] = ["svc-a", "svc-b", "svc-c"];
const EGRESSES: [&str; 2] = ["eg-a", "eg-b"];
const UIDS: [&str; 3] = ["", "uid-1", "uid-2"];

/// 30 IPv4 and 12 IPv6 addresses, as strings that live for the test.
fn addresses() -> Vec<&'static str> {
    (1..=30)
        .map(|i| format!("10.1.0.{i}"))
        .chain((1..=12).map(|i| format!("fd00::1:{i}")))
        .map(|s| &*Box::leak(s.into_boxed_str()))
        .collect()
}

/// A random endpoint: an address with a location of its family.
fn endpoint(rng: &mut Rng, addresses: &[&'static str]) -> (&'static str, &'static str) {
    let a = addresses[rng.below(addresses.len())];
    let l = if a.contains(':') {
        LOCATIONS6[rng.below(LOCATIONS6.len())]
    } else {
        LOCATIONS4[rng.below(LOCATIONS4.len())]
    };
    (a, l)
}

/// The service of `SERVICES` that is IPv6 (the others state no family: IPv4).
const V6_SERVICE: &str = "svc-c";

/// The addresses of `service`'s family among `addresses`.
fn of_family(service: &str, addresses: &[&'static str]) -> Vec<&'static str> {
    let v6 = service == V6_SERVICE;
    addresses
        .iter()
        .copied()
        .filter(|a| a.contains(':') == v6)
        .collect()
}

/// Adds or removes `service` (of its family) in `t`.
fn update_service(t: &mut DiffTracker, op: Operation, service: &str) {
    let family = (service == V6_SERVICE).then_some(IpFamily::V6);
    t.update_service_family(op, service, family).unwrap();
}

/// A random duplicate-free set of up to 24 endpoints (often more than the 8 of the sorted form).
fn endpoint_set(rng: &mut Rng, addresses: &[&'static str]) -> Vec<(&'static str, &'static str)> {
    let n = rng.below(25);
    let mut seen = BTreeSet::new();
    (0..n)
        .map(|_| endpoint(rng, addresses))
        .filter(|(a, _)| seen.insert(*a))
        .collect()
}

fn as_endpoints<'a>(v: &'a [(&'a str, &'a str)]) -> Vec<Endpoint<'a>> {
    v.iter().map(|(a, l)| ep(a, l)).collect()
}

fn as_ips(v: &[(&str, &str)]) -> Vec<EndpointIp> {
    v.iter()
        .map(|(a, l)| EndpointIp {
            address: ip(a),
            location: ip(l),
        })
        .collect()
}

/// The tracker fed strings, its twin fed parsed IPs, and the oracle.
struct Trio {
    t: DiffTracker,
    twin: DiffTracker,
    o: Oracle,
    pending_locations: BTreeSet<IpAddr>,
    pending_services: BTreeSet<String>,
}

impl Trio {
    fn step(&mut self, rng: &mut Rng, addresses: &[&'static str]) {
        let (t, twin, o) = (&mut self.t, &mut self.twin, &mut self.o);
        match rng.below(10) {
            0 => {
                let (op, s) = (op(rng), SERVICES[rng.below(SERVICES.len())]);
                update_service(t, op, s);
                update_service(twin, op, s);
                o.update_service(op, s);
            }
            1 => {
                let (op, e) = (op(rng), EGRESSES[rng.below(EGRESSES.len())]);
                t.update_egress(op, e).unwrap();
                twin.update_egress(op, e).unwrap();
                o.update_egress(op, e);
            }
            2..=4 => {
                let s = SERVICES[rng.below(SERVICES.len())];
                let set = endpoint_set(rng, &of_family(s, addresses));
                t.set_endpoints(s, &as_endpoints(&set)).unwrap();
                twin.set_endpoints_ip(s, &as_ips(&set)).unwrap();
                o.set_endpoints(s, &set);
            }
            5 => {
                let s = SERVICES[rng.below(SERVICES.len())];
                let family = of_family(s, addresses);
                let (old, new) = (endpoint_set(rng, &family), endpoint_set(rng, &family));
                t.update_endpoints(s, &as_endpoints(&old), &as_endpoints(&new))
                    .unwrap();
                twin.update_endpoints_ip(s, &as_ips(&old), &as_ips(&new))
                    .unwrap();
                o.update_endpoints(s, &old, &new);
            }
            6 | 7 => {
                let op = op(rng);
                let (address, location) = endpoint(rng, addresses);
                let egress = match rng.below(3) {
                    0 => "",
                    k => EGRESSES[k - 1],
                };
                let uid = UIDS[rng.below(UIDS.len())];
                let pod = PodUpdate {
                    address,
                    location,
                    outbound_identity: egress,
                    uid,
                    ..Default::default()
                };
                t.update_pod(op, &pod).unwrap();
                twin.update_pod_ip(
                    op,
                    &PodIpUpdate {
                        address: ip(address),
                        location: ip(location),
                        outbound_identity: egress,
                        uid,
                        nat_gateway: "",
                    },
                )
                .unwrap();
                o.update_pod(op, address, location, egress, uid);
            }
            _ => self.sync(rng.below(3) > 0),
        }
    }

    fn take_dirty(&mut self) {
        let dirty = self.t.take_dirty();
        self.twin.take_dirty();
        self.pending_locations.extend(dirty.locations);
        self.pending_services.extend(dirty.services);
    }

    /// NRP accepts everything (or nothing): creations, then locations, then deletions.
    fn sync(&mut self, accept: bool) {
        self.take_dirty();
        for action in [ServiceAction::Create, ServiceAction::Delete] {
            if action == ServiceAction::Delete {
                self.take_dirty();
                for location in std::mem::take(&mut self.pending_locations) {
                    match self.t.location_diff(location) {
                        Some(d) if accept => {
                            self.t.record_location_applied(&d).unwrap();
                            self.twin.record_location_applied(&d).unwrap();
                            self.o.record_location(&d);
                        }
                        Some(_) => {
                            self.pending_locations.insert(location);
                        }
                        None => {}
                    }
                }
                self.take_dirty();
            }
            for name in self.pending_services.clone() {
                match self.t.service_status(&name) {
                    ServiceStatus::Pending(c) if c.action == action && accept => {
                        self.t.record_service_applied(&c).unwrap();
                        self.twin.record_service_applied(&c).unwrap();
                        self.o.record_service(&c);
                        self.pending_services.remove(&name);
                    }
                    ServiceStatus::Pending(_) => {}
                    _ => {
                        self.pending_services.remove(&name);
                    }
                }
            }
        }
    }

    fn check(&self) {
        let expected = self.o.diff();
        assert_eq!(self.t.pending_diff(), expected);
        assert_eq!(self.twin.pending_diff(), expected, "the _ip twin");
        assert_eq!(self.twin.revision(), self.t.revision());
        assert_eq!(self.twin.counts(), self.t.counts());
        for l in &expected.locations {
            assert!(
                self.t.is_location_dirty(l.location)
                    || self.pending_locations.contains(&l.location),
                "location {} has a pending change but is not tracked",
                l.location
            );
        }
        for s in &expected.services {
            assert!(
                self.t.is_service_dirty(&s.name) || self.pending_services.contains(&s.name),
                "service {} has a pending change but is not tracked",
                s.name
            );
        }
        // The index agrees with the slots: a service's desired addresses and locations.
        for s in SERVICES.iter().chain(&EGRESSES) {
            let Some(view) = self.t.service_view(s) else {
                continue;
            };
            let mut addresses = 0;
            let mut locations = BTreeSet::new();
            for l in self.t.locations() {
                for a in self.t.location_view(l).unwrap().addresses {
                    if a.desired
                        .is_some_and(|d| d.contains(&s.to_ascii_lowercase()))
                    {
                        addresses += 1;
                        locations.insert(l);
                    }
                }
            }
            assert_eq!(view.desired_addresses, addresses, "{s}");
            assert_eq!(view.locations, locations.len(), "{s}");
            assert_eq!(self.twin.service_view(s), Some(view), "{s}");
        }
    }
}

fn op(rng: &mut Rng) -> Operation {
    if rng.below(4) == 0 {
        Operation::Remove
    } else {
        Operation::Add
    }
}

#[test]
fn large_services_and_the_ip_methods_agree_with_the_oracle() {
    let addresses = addresses();
    for seed in 0..300 {
        let mut rng = Rng(seed);
        let mut trio = Trio {
            t: DiffTracker::new(),
            twin: DiffTracker::new(),
            o: Oracle::default(),
            pending_locations: BTreeSet::new(),
            pending_services: BTreeSet::new(),
        };
        for _ in 0..40 {
            trio.step(&mut rng, &addresses);
            trio.check();
        }
        for _ in 0..4 {
            trio.sync(true);
        }
        assert!(trio.t.pending_diff().is_empty(), "seed {seed}");
        assert!(trio.o.nrp_equals_desired(), "seed {seed}");
    }
}

#[test]
fn an_egress_dirties_only_the_locations_its_pods_are_at_now() {
    let mut t = DiffTracker::new();
    let pod = |address, location, egress| PodUpdate {
        address,
        location,
        outbound_identity: egress,
        uid: "",
        ..Default::default()
    };
    t.update_pod(Operation::Add, &pod("10.1.0.1", "10.0.0.1", "eg"))
        .unwrap();
    t.update_pod(Operation::Add, &pod("10.1.0.2", "10.0.0.2", "eg"))
        .unwrap();
    t.update_pod(Operation::Add, &pod("10.1.0.3", "10.0.0.3", "eg"))
        .unwrap();
    // The pods at 10.0.0.2 and 10.0.0.3 leave the egress (another egress; no egress).
    t.update_pod(Operation::Add, &pod("10.1.0.2", "10.0.0.2", "other"))
        .unwrap();
    t.update_pod(Operation::Remove, &pod("10.1.0.3", "10.0.0.3", ""))
        .unwrap();
    assert_eq!(t.service_view("eg").unwrap().locations, 1);
    assert_eq!(t.service_view("eg").unwrap().desired_addresses, 1);
    t.take_dirty();
    t.record_service_applied(&ServiceChange {
        name: "eg".into(),
        kind: ServiceKind::Outbound,
        action: ServiceAction::Create,
        nat_gateway: None,
        ipv6: false,
    })
    .unwrap();
    let dirty = t.take_dirty();
    assert_eq!(dirty.locations, vec![ip("10.0.0.1")]);
    // The pod comes back to the egress at another location: marked again.
    t.update_pod(Operation::Add, &pod("10.1.0.2", "10.0.0.4", "eg"))
        .unwrap();
    t.take_dirty();
    t.update_egress(Operation::Add, "eg").unwrap();
    t.update_egress(Operation::Remove, "eg").unwrap();
    let mut dirty = t.take_dirty().locations;
    dirty.sort();
    assert_eq!(dirty, vec![ip("10.0.0.1"), ip("10.0.0.4")]);
    // Removing the egress stripped it from both pods, which held nothing else: gone, with their
    // locations (NRP never had them).
    for l in ["10.0.0.1", "10.0.0.4"] {
        assert_eq!(t.location_view(ip(l)), None);
    }
    assert_eq!(t.counts().desired_addresses, 0);
}
