//! The splitting of a refused call, against a model of NRP: the addresses it holds per location, the
//! addresses it refuses (a call carrying one is refused whole and changes nothing), and the calls it
//! saw.

use std::collections::{BTreeMap, BTreeSet};

use super::super::request;
use super::super::tests::change_of as change;
use super::*;
use clb_nrp::NrpError;

const CODE: &str = "InvalidAddress";

/// NRP as a split sees it.
#[derive(Default)]
struct Model {
    /// location → address → services.
    held: BTreeMap<String, BTreeMap<String, Vec<String>>>,
    /// The addresses refused.
    refuses: BTreeSet<String>,
    /// Whether a refusal names its address.
    names: bool,
    /// The calls seen, each with whether it went through.
    calls: Vec<(UpdateAddressLocationsRequest, bool)>,
    /// The call (its position in `calls`) answered with a 503 instead.
    unavailable_at: Option<usize>,
}

impl Model {
    fn refusing(addresses: &[&str], names: bool) -> Self {
        Self {
            refuses: addresses.iter().map(|a| a.to_string()).collect(),
            names,
            ..Self::default()
        }
    }

    /// NRP holding `address` at `location` too.
    fn holding(mut self, location: &str, address: &str) -> Self {
        self.held
            .entry(location.into())
            .or_default()
            .insert(address.into(), vec!["old".into()]);
        self
    }

    fn answer(&mut self, body: &UpdateAddressLocationsRequest) -> Result<(), UnitError> {
        if self.unavailable_at == Some(self.calls.len()) {
            return Err(UnitError::Nrp(NrpError::Server {
                status: 503,
                code: "ServiceUnavailable".into(),
                message: "try later".into(),
                retry_after: None,
            }));
        }
        for l in &body.address_locations {
            if let Some(a) = l
                .addresses
                .iter()
                .find(|a| self.refuses.contains(&a.address))
            {
                let message = if self.names {
                    format!(
                        "Address '{}' at location '{}' is refused.",
                        a.address, l.address_location
                    )
                } else {
                    "An address of the request is refused.".to_string()
                };
                return Err(UnitError::Nrp(NrpError::Validation {
                    code: CODE.into(),
                    message,
                }));
            }
        }
        for l in &body.address_locations {
            let held = self.held.entry(l.address_location.clone()).or_default();
            if l.address_update_action == UpdateAction::FullUpdate {
                held.clear();
            }
            for a in &l.addresses {
                held.insert(a.address.clone(), a.services.clone());
            }
            if l.addresses.is_empty() {
                self.held.remove(&l.address_location);
            }
        }
        Ok(())
    }

    /// The addresses held at `location`.
    fn at(&self, location: &str) -> BTreeSet<String> {
        self.held
            .get(location)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }
}

#[async_trait::async_trait]
impl Caller for Model {
    async fn call(&mut self, body: &UpdateAddressLocationsRequest) -> Result<(), UnitError> {
        let result = self.answer(body);
        self.calls.push((body.clone(), result.is_ok()));
        result
    }
}

fn whole(locations: &[LocationChange]) -> Vec<Piece> {
    (0..locations.len())
        .map(|index| Piece {
            index,
            start: 0,
            end: locations[index].addresses.len(),
        })
        .collect()
}

/// Sends `call` to `nrp` and, when it is refused, contains the refusal (as `execute` does). `None`:
/// it went through.
fn send(nrp: &mut Model, locations: &[LocationChange], call: &[Piece]) -> Option<Contained> {
    let refusal = futures::executor::block_on(nrp.call(&request(locations, call))).err()?;
    Some(futures::executor::block_on(contain(
        nrp, locations, call, refusal,
    )))
}

/// Sends a location change at `10.0.0.1` of `n` addresses `10.1.0.{0..n}` to `nrp`, which refuses
/// it, and contains the refusal.
fn one_change(nrp: &mut Model, n: usize, full: bool) -> Contained {
    let locs = vec![change("10.0.0.1", "10.1.0", n, full)];
    send(nrp, &locs, &whole(&locs)).expect("refused")
}

/// The refused addresses as `(index, address, code)`, sorted.
fn refused(c: &Contained) -> Vec<(u32, String, String)> {
    let mut r: Vec<_> = c
        .refused
        .iter()
        .map(|r| (r.index, r.address.clone(), r.code.clone()))
        .collect();
    r.sort();
    r
}

fn entries(index: u32, addresses: &[&str]) -> Vec<(u32, String, String)> {
    addresses
        .iter()
        .map(|a| (index, a.to_string(), CODE.to_string()))
        .collect()
}

/// `{prefix}.{i}` for `i` in `range`, but `except`.
fn addresses(prefix: &str, range: std::ops::Range<usize>, except: &[usize]) -> BTreeSet<String> {
    range
        .filter(|i| !except.contains(i))
        .map(|i| format!("{prefix}.{i}"))
        .collect()
}

/// The extra calls of a split of a full update at `location`: sent as full updates until one goes
/// through, as partial updates after it, and never one that would drop a part applied before.
fn assert_full_then_partial(nrp: &Model, location: &str) {
    let mut through = false;
    for (body, ok) in &nrp.calls[1..] {
        let l = &body.address_locations[0];
        assert_eq!(body.address_locations.len(), 1, "{body:?}");
        assert_eq!(l.address_location, location);
        let expected = if through {
            UpdateAction::PartialUpdate
        } else {
            UpdateAction::FullUpdate
        };
        assert_eq!(l.address_update_action, expected, "{:?}", nrp.calls);
        through |= ok;
    }
}

#[test]
fn the_bound_on_extra_calls_is_two_per_halving_level_and_two() {
    let bounds: Vec<usize> = [0, 1, 2, 3, 4, 5, 8, 9, 16, 100, 1000]
        .into_iter()
        .map(refusal_split_bound)
        .collect();
    assert_eq!(bounds, vec![0, 0, 4, 6, 6, 8, 8, 10, 10, 16, 22]);
}

#[test]
fn a_named_address_is_left_out_in_one_extra_call() {
    let mut nrp = Model::refusing(&["10.1.0.2"], true);
    let c = one_change(&mut nrp, 4, false);
    assert_eq!(c.calls, 1);
    assert_eq!(nrp.calls.len(), 2);
    assert_eq!(refused(&c), entries(0, &["10.1.0.2"]));
    assert!(
        c.refused[0].message.contains("'10.1.0.2'"),
        "{:?}",
        c.refused
    );
    assert!(c.failed.is_empty() && !c.stop, "{c:?}");
    assert_eq!(nrp.at("10.0.0.1"), addresses("10.1.0", 0..4, &[2]));
}

#[test]
fn halving_finds_one_unnamed_culprit_among_16_within_the_bound() {
    let mut nrp = Model::refusing(&["10.1.0.11"], false);
    let c = one_change(&mut nrp, 16, false);
    // Halves of 8, 4, 2 and 1: two calls a level.
    assert_eq!(c.calls, 8);
    assert!(c.calls <= refusal_split_bound(16));
    assert_eq!(refused(&c), entries(0, &["10.1.0.11"]));
    assert!(c.failed.is_empty(), "{c:?}");
    assert_eq!(nrp.at("10.0.0.1"), addresses("10.1.0", 0..16, &[11]));
}

#[test]
fn two_culprits_are_found_named_or_halved() {
    let mut nrp = Model::refusing(&["10.1.0.1", "10.1.0.6"], true);
    let c = one_change(&mut nrp, 8, false);
    assert_eq!(c.calls, 2, "one left out per call");
    assert_eq!(refused(&c), entries(0, &["10.1.0.1", "10.1.0.6"]));
    assert_eq!(nrp.at("10.0.0.1"), addresses("10.1.0", 0..8, &[1, 6]));

    // Not named, in both halves of four: [0,1] and [2,3] refused, then each single.
    let mut nrp = Model::refusing(&["10.1.0.0", "10.1.0.3"], false);
    let c = one_change(&mut nrp, 4, false);
    assert_eq!(c.calls, refusal_split_bound(4));
    assert_eq!(refused(&c), entries(0, &["10.1.0.0", "10.1.0.3"]));
    assert!(c.failed.is_empty(), "{c:?}");
    assert_eq!(nrp.at("10.0.0.1"), addresses("10.1.0", 0..4, &[0, 3]));
}

#[test]
fn the_addresses_not_decided_within_the_bound_are_reported_refused() {
    let mut nrp = Model::refusing(&["10.1.0.3", "10.1.0.12"], false);
    let c = one_change(&mut nrp, 16, false);
    // [0..8) and [8..16) refused; [0..4) and [12..16) refused; [2,3] and [12,13] refused: 10
    // calls, the bound. The four addresses of the last two are not decided.
    assert_eq!(c.calls, refusal_split_bound(16));
    assert_eq!(
        refused(&c),
        entries(0, &["10.1.0.12", "10.1.0.13", "10.1.0.2", "10.1.0.3"])
    );
    assert!(
        c.refused.iter().all(|r| r.code == CODE),
        "the part's refusal"
    );
    assert!(
        c.failed.is_empty(),
        "the change went through without them: {c:?}"
    );
    assert_eq!(
        nrp.at("10.0.0.1"),
        addresses("10.1.0", 0..16, &[2, 3, 12, 13])
    );
}

#[test]
fn a_full_update_is_sent_full_until_a_part_goes_through_then_partial() {
    for culprit in [0, 3, 7] {
        // NRP holds an address the full update does not carry: it is replaced.
        let mut nrp = Model::refusing(&[&format!("10.1.0.{culprit}")], false)
            .holding("10.0.0.1", "10.1.0.99");
        let c = one_change(&mut nrp, 8, true);
        assert_full_then_partial(&nrp, "10.0.0.1");
        assert_eq!(c.calls, 6, "halves of 4, 2 and 1");
        assert_eq!(refused(&c), entries(0, &[&format!("10.1.0.{culprit}")]));
        assert!(c.failed.is_empty(), "{c:?}");
        assert_eq!(
            nrp.at("10.0.0.1"),
            addresses("10.1.0", 0..8, &[culprit]),
            "a full replacement without the culprit (culprit {culprit})"
        );
    }
}

#[test]
fn a_lone_refused_address_of_a_one_address_change_costs_no_extra_call() {
    let locs = vec![
        change("10.0.0.1", "10.1.0", 1, false),
        change("10.0.0.2", "10.1.1", 1, true),
    ];
    let mut nrp = Model::refusing(&["10.1.0.0", "10.1.1.0"], true).holding("10.0.0.2", "10.1.1.7");
    // A partial update: it goes through without its address (NRP keeps what it had for it).
    let c = send(&mut nrp, &locs, &whole(&locs)[..1]).expect("refused");
    assert_eq!((c.calls, nrp.calls.len()), (0, 1));
    assert_eq!(refused(&c), entries(0, &["10.1.0.0"]));
    assert!(c.failed.is_empty(), "{c:?}");
    // A full update none of whose addresses goes through fails whole: NRP holds what it had.
    let piece = whole(&locs)[1];
    let c = send(&mut nrp, &locs, &[piece]).expect("refused");
    assert_eq!((c.calls, nrp.calls.len()), (0, 2));
    assert_eq!(refused(&c), entries(1, &["10.1.1.0"]));
    assert_eq!(c.failed.len(), 1);
    assert_eq!((c.failed[0].0, c.failed[0].1.code()), (piece, CODE));
    assert_eq!(nrp.at("10.0.0.2"), BTreeSet::from(["10.1.1.7".to_string()]));
}

#[test]
fn a_refused_deletion_of_a_location_cannot_be_split() {
    let locs = vec![change("10.0.0.1", "10.1.0", 0, true)];
    let mut nrp = Model::default();
    let refusal = UnitError::Nrp(NrpError::Validation {
        code: CODE.into(),
        message: "Location '10.0.0.1' cannot be deleted.".into(),
    });
    let piece = whole(&locs)[0];
    let c = futures::executor::block_on(contain(&mut nrp, &locs, &[piece], refusal.clone()));
    assert!(nrp.calls.is_empty());
    assert_eq!(c.failed, vec![(piece, refusal)]);
    assert!(c.refused.is_empty() && c.calls == 0, "{c:?}");
}

#[test]
fn another_failure_while_splitting_fails_the_change_and_keeps_what_was_found() {
    let locs = vec![change("10.0.0.1", "10.1.0", 8, false)];
    let mut nrp = Model::refusing(&["10.1.0.1", "10.1.0.5"], true);
    // The call, refused for 10.1.0.1; without it, refused for 10.1.0.5; without both, a 503.
    nrp.unavailable_at = Some(2);
    let c = send(&mut nrp, &locs, &whole(&locs)).expect("refused");
    assert_eq!(c.calls, 2);
    assert!(c.stop, "a retried error stops the unit");
    assert_eq!(refused(&c), entries(0, &["10.1.0.1", "10.1.0.5"]));
    assert_eq!(c.failed.len(), 1);
    assert_eq!(c.failed[0].1.code(), "ServiceUnavailable");
    assert!(nrp.at("10.0.0.1").is_empty());
}

#[test]
fn a_call_is_split_by_location_change_then_the_culprit_by_address() {
    // Four location changes of four addresses each; the third is a full update over an old address.
    let locs: Vec<_> = (0..4)
        .map(|i| change(&format!("10.0.0.{i}"), &format!("10.1.{i}"), 4, i == 2))
        .collect();
    for names in [true, false] {
        let mut nrp = Model::refusing(&["10.1.2.1"], names).holding("10.0.0.2", "10.1.2.99");
        let c = send(&mut nrp, &locs, &whole(&locs)).expect("refused");
        assert_eq!(refused(&c), entries(2, &["10.1.2.1"]), "named: {names}");
        assert!(c.failed.is_empty() && !c.stop, "{c:?}");
        for i in 0..4 {
            let except: &[usize] = if i == 2 { &[1] } else { &[] };
            assert_eq!(
                nrp.at(&format!("10.0.0.{i}")),
                addresses(&format!("10.1.{i}"), 0..4, except)
            );
        }
        // Named: the call without the address (the fast path; a full replacement at 10.0.0.2).
        // Halved: [0,1] and [2,3], [2] and [3]; then [1.0,1.1] and [1.2,1.3], [1.0] and [1.1].
        let expected = if names { 1 } else { 4 + 4 };
        assert_eq!(c.calls, expected, "named: {names}");
        assert!(c.calls <= refusal_split_bound(4) + refusal_split_bound(4));
    }
}

#[test]
fn the_culprit_is_the_one_change_a_named_address_belongs_to() {
    let locs: Vec<_> = (0..4)
        .map(|i| change(&format!("10.0.0.{i}"), &format!("10.1.{i}"), 2, false))
        .collect();
    let call = whole(&locs);
    let culprit = |m: &str| culprit_named(&locs, &call, m);
    assert_eq!(culprit("Address '10.1.2.1' is refused"), Some(2));
    assert_eq!(culprit("address 10.1.3.0 at location 10.0.0.3."), Some(3));
    assert_eq!(culprit("location '10.0.0.1' is full"), Some(1));
    assert_eq!(culprit("no address at all"), None);
    assert_eq!(culprit("address '10.9.9.9' is not in the call"), None);
    assert_eq!(
        culprit("addresses '10.1.0.0' and '10.1.1.1'"),
        None,
        "two changes"
    );
    assert_eq!(
        culprit("'10.9.9.9' and '10.1.1.1'"),
        Some(1),
        "an address not in the call does not count"
    );
    // Only the addresses of the piece in the call count.
    let piece = vec![
        Piece {
            index: 0,
            start: 0,
            end: 1,
        },
        Piece {
            index: 1,
            start: 0,
            end: 2,
        },
    ];
    assert_eq!(culprit_named(&locs, &piece, "'10.1.0.1'"), None);
    assert_eq!(culprit_named(&locs, &piece, "'10.1.0.0'"), Some(0));
    // IPv6, compared as IPs.
    let mut v6 = change("fd00::1", "x", 1, false);
    v6.addresses[0].address = "fd01:0:0::1".into();
    let locs = vec![locs[0].clone(), v6];
    let call = whole(&locs);
    assert_eq!(
        culprit_named(&locs, &call, "address 'fd01::0001' at location 'FD00::1'"),
        Some(1)
    );
}

#[test]
fn the_address_named_is_one_of_the_part_and_not_its_location() {
    let mut c = change("10.0.0.1", "10.1.0", 4, false);
    c.addresses[3].address = "fd01::0:7".into();
    let all = [0, 1, 2, 3];
    assert_eq!(
        address_named(&c, &all, "Address '10.1.0.2' at location '10.0.0.1'"),
        Some(2)
    );
    assert_eq!(address_named(&c, &all, "location '10.0.0.1'"), None);
    assert_eq!(
        address_named(&c, &all, "'10.1.0.1' and '10.1.0.2'"),
        None,
        "two"
    );
    assert_eq!(
        address_named(&c, &[0, 1], "Address '10.1.0.2'"),
        None,
        "not in the part"
    );
    assert_eq!(address_named(&c, &[1, 3], "address 'FD01::7'"), Some(1));
}

#[test]
fn addresses_of_a_change_are_sent_alone_in_their_call() {
    let full = change("10.0.0.1", "10.1.0", 4, true);
    let body = addresses_request(&full, &[3, 1], true);
    assert_eq!(body.action, UpdateAction::PartialUpdate);
    assert_eq!(body.address_locations.len(), 1);
    let l = &body.address_locations[0];
    assert_eq!(l.address_location, "10.0.0.1");
    assert_eq!(l.address_update_action, UpdateAction::FullUpdate);
    let sent: Vec<_> = l.addresses.iter().map(|a| a.address.as_str()).collect();
    assert_eq!(sent, vec!["10.1.0.3", "10.1.0.1"]);
    let later = addresses_request(&full, &[0], false);
    assert_eq!(
        later.address_locations[0].address_update_action,
        UpdateAction::PartialUpdate
    );
    let partial = change("10.0.0.1", "10.1.0", 4, false);
    assert_eq!(
        addresses_request(&partial, &[0], true).address_locations[0].address_update_action,
        UpdateAction::PartialUpdate
    );
}

/// Four location changes `10.0.0.{i}` of `n` addresses `10.1.{i}.{0..n}`; `full` the full updates.
fn four(n: usize, full: &[usize]) -> Vec<LocationChange> {
    (0..4)
        .map(|i| {
            change(
                &format!("10.0.0.{i}"),
                &format!("10.1.{i}"),
                n,
                full.contains(&i),
            )
        })
        .collect()
}

/// The addresses each location of `body` carries, with its action.
fn carried(body: &UpdateAddressLocationsRequest) -> Vec<(String, UpdateAction, usize)> {
    body.address_locations
        .iter()
        .map(|l| {
            (
                l.address_location.clone(),
                l.address_update_action.clone(),
                l.addresses.len(),
            )
        })
        .collect()
}

#[test]
fn a_named_address_of_a_call_of_several_changes_costs_one_extra_call() {
    let locs = four(4, &[]);
    let mut nrp = Model::refusing(&["10.1.2.1"], true);
    let c = send(&mut nrp, &locs, &whole(&locs)).expect("refused");
    assert_eq!((c.calls, nrp.calls.len()), (1, 2));
    assert_eq!(refused(&c), entries(2, &["10.1.2.1"]));
    assert!(c.refused[0].message.contains("'10.1.2.1'"), "{c:?}");
    assert!(c.failed.is_empty() && !c.stop, "{c:?}");
    // The whole call but the address.
    let sizes: Vec<usize> = carried(&nrp.calls[1].0).iter().map(|l| l.2).collect();
    assert_eq!(sizes, vec![4, 4, 3, 4]);
    for i in 0..4 {
        let except: &[usize] = if i == 2 { &[1] } else { &[] };
        let prefix = format!("10.1.{i}");
        assert_eq!(
            nrp.at(&format!("10.0.0.{i}")),
            addresses(&prefix, 0..4, except)
        );
    }

    // The named address alone in its (partial) location change: the call goes without that location.
    let locs = four(1, &[]);
    let mut nrp = Model::refusing(&["10.1.1.0"], true);
    let c = send(&mut nrp, &locs, &whole(&locs)).expect("refused");
    assert_eq!((c.calls, nrp.calls.len()), (1, 2));
    assert_eq!(refused(&c), entries(1, &["10.1.1.0"]));
    assert!(c.failed.is_empty() && !c.stop, "{c:?}");
    assert_eq!(nrp.calls[1].0.address_locations.len(), 3);
    assert!(nrp.at("10.0.0.1").is_empty());
}

#[test]
fn a_call_refused_again_without_the_named_address_is_split_without_it() {
    // A second culprit in another location change, in the same one, in a full update.
    let cases: [(&[usize], [&str; 2], usize); 3] = [
        (&[], ["10.1.1.2", "10.1.3.0"], 1),
        (&[], ["10.1.1.0", "10.1.1.3"], 1),
        (&[2], ["10.1.2.0", "10.1.2.3"], 2),
    ];
    for (full, culprits, at) in cases {
        let locs = four(4, full);
        let mut nrp = Model::refusing(&culprits, true);
        if full.contains(&2) {
            nrp = nrp.holding("10.0.0.2", "10.1.2.99");
        }
        let c = send(&mut nrp, &locs, &whole(&locs)).expect("refused");
        // The call without the first, refused naming the second; without the location change of
        // the second, through; that change without both (or without the second), through.
        assert_eq!(c.calls, 3, "{culprits:?}: {:?}", nrp.calls);
        assert!(c.calls <= 1 + refusal_split_bound(4) + refusal_split_bound(4));
        assert!(c.failed.is_empty() && !c.stop, "{c:?}");
        let mut expected = entries(at as u32, &culprits[..1]);
        let second = if culprits[1].starts_with("10.1.3") {
            3
        } else {
            at
        };
        expected.extend(entries(second as u32, &culprits[1..]));
        expected.sort();
        assert_eq!(refused(&c), expected);
        for i in 0..4 {
            let prefix = format!("10.1.{i}");
            let except: Vec<usize> = (0..4)
                .filter(|k| culprits.contains(&format!("{prefix}.{k}").as_str()))
                .collect();
            assert_eq!(
                nrp.at(&format!("10.0.0.{i}")),
                addresses(&prefix, 0..4, &except)
            );
        }
        // A full update: each call carries it as one, without the named address: a full
        // replacement (the old address is gone), never sent empty.
        for (body, _) in &nrp.calls[1..] {
            for l in carried(body) {
                if l.0 == "10.0.0.2" && full.contains(&2) {
                    assert_eq!(l.1, UpdateAction::FullUpdate, "{body:?}");
                    assert!(l.2 > 0);
                }
            }
        }
    }
}

#[test]
fn a_full_update_of_the_named_address_alone_takes_no_fast_path() {
    let mut locs = four(2, &[]);
    locs[1] = change("10.0.0.1", "10.1.1", 1, true);
    let mut nrp = Model::refusing(&["10.1.1.0"], true).holding("10.0.0.1", "10.1.1.7");
    let call = whole(&locs);
    let c = send(&mut nrp, &locs, &call).expect("refused");
    // As before the fast path: the call without that location change, which fails whole.
    assert_eq!((c.calls, nrp.calls.len()), (1, 2));
    assert_eq!(refused(&c), entries(1, &["10.1.1.0"]));
    assert_eq!(c.failed.len(), 1);
    assert_eq!((c.failed[0].0, c.failed[0].1.code()), (call[1], CODE));
    assert!(
        nrp.calls
            .iter()
            .all(|(b, _)| b.address_locations.iter().all(|l| !l.addresses.is_empty())),
        "never an empty full update: {:?}",
        nrp.calls
    );
    assert_eq!(nrp.at("10.0.0.1"), BTreeSet::from(["10.1.1.7".to_string()]));
    assert_eq!(nrp.at("10.0.0.3"), addresses("10.1.3", 0..2, &[]));

    // A full update with more: a full replacement without the named address, in one extra call.
    let locs = four(3, &[1]);
    let mut nrp = Model::refusing(&["10.1.1.2"], true).holding("10.0.0.1", "10.1.1.7");
    let c = send(&mut nrp, &locs, &whole(&locs)).expect("refused");
    assert_eq!(c.calls, 1);
    assert_eq!(refused(&c), entries(1, &["10.1.1.2"]));
    assert!(c.failed.is_empty(), "{c:?}");
    assert_eq!(
        carried(&nrp.calls[1].0)[1],
        ("10.0.0.1".to_string(), UpdateAction::FullUpdate, 2)
    );
    assert_eq!(nrp.at("10.0.0.1"), addresses("10.1.1", 0..3, &[2]));
}

#[test]
fn the_fast_path_failing_otherwise_fails_the_call() {
    let locs = four(2, &[]);
    let mut nrp = Model::refusing(&["10.1.0.1"], true);
    nrp.unavailable_at = Some(1);
    let c = send(&mut nrp, &locs, &whole(&locs)).expect("refused");
    assert_eq!((c.calls, nrp.calls.len()), (1, 2));
    assert!(c.stop, "a retried error stops the unit");
    assert!(c.refused.is_empty(), "{c:?}");
    assert_eq!(c.failed.len(), 4);
    assert!(
        c.failed
            .iter()
            .all(|(_, e)| e.code() == "ServiceUnavailable")
    );
}

#[test]
fn the_fast_path_needs_one_named_address_of_a_call_of_several_changes() {
    let mut locs = four(2, &[3]);
    locs[2] = change("10.0.0.2", "10.1.2", 1, true);
    let call = whole(&locs);
    let named = |m: &str| named_alone(&locs, &call, m);
    assert_eq!(
        named("Address '10.1.1.1' at location '10.0.0.1'"),
        Some((1, 1))
    );
    assert_eq!(
        named("Address '10.1.3.0'"),
        Some((3, 0)),
        "a full update with more"
    );
    assert_eq!(
        named("Address '10.1.2.0'"),
        None,
        "a full update of it alone"
    );
    assert_eq!(named("location '10.0.0.1'"), None, "no address");
    assert_eq!(named("'10.1.1.0' and '10.1.1.1'"), None, "two addresses");
    assert_eq!(named("'10.1.1.0' and '10.1.0.1'"), None, "two changes");
    assert_eq!(
        named_alone(&locs, &call[..1], "'10.1.0.1'"),
        None,
        "one change"
    );
}
