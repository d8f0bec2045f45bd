//! Location work: `LocationChange`s turned into as few `updateAddressLocations` calls as the limits
//! allow, each location at most once per call.

use std::collections::{HashSet, VecDeque};
use std::net::IpAddr;

use clb_nrp::NrpError;
use clb_proto::v1::{self, LocationChange, LocationWork, Report};

use super::config::Limits;
use super::ctx::{UnitCtx, UnitError, partial_report};
use super::errors;
use clb_nrp::wire::{
    AddressLocationUpdate, GatewayAddress, UpdateAction, UpdateAddressLocationsRequest,
};

/// A piece of one location change: `addresses[start..end]` of `locations[index]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Index into `LocationWork.locations`.
    pub index: usize,
    /// First address of the piece.
    pub start: usize,
    /// One past the last address of the piece.
    pub end: usize,
}

impl Piece {
    fn len(&self) -> usize {
        self.end - self.start
    }
}

/// Plans the calls for the location changes `indices` of `locations`: greedy packing in order, at most
/// `max_locations_per_call` locations and `max_addresses_per_call` addresses per call. A partial
/// update larger than the address limit is split into several pieces (its addresses are independent);
/// a full update is never split (the first piece would remove the addresses of the later ones), so an
/// oversized one goes alone in its call. No location appears twice in one call.
pub fn plan(locations: &[LocationChange], indices: &[usize], limits: Limits) -> Vec<Vec<Piece>> {
    let limits = limits.sanitized();
    let (max_loc, max_addr) = (limits.max_locations_per_call, limits.max_addresses_per_call);
    let mut calls: Vec<Vec<Piece>> = Vec::new();
    let mut current: Vec<Piece> = Vec::new();
    let mut addresses = 0usize;
    let mut push = |piece: Piece, current: &mut Vec<Piece>, addresses: &mut usize| {
        if !current.is_empty()
            && (current.len() + 1 > max_loc || *addresses + piece.len() > max_addr)
        {
            calls.push(std::mem::take(current));
            *addresses = 0;
        }
        *addresses += piece.len();
        current.push(piece);
    };
    for &index in indices {
        let change = &locations[index];
        let n = change.addresses.len();
        let splittable = change.action() == v1::AddressUpdateAction::PartialUpdate;
        if n <= max_addr || !splittable {
            push(
                Piece {
                    index,
                    start: 0,
                    end: n,
                },
                &mut current,
                &mut addresses,
            );
        } else {
            let mut start = 0;
            while start < n {
                let end = (start + max_addr).min(n);
                push(Piece { index, start, end }, &mut current, &mut addresses);
                start = end;
            }
        }
    }
    if !current.is_empty() {
        calls.push(current);
    }
    calls
}

/// The body of one planned call.
pub fn request(locations: &[LocationChange], call: &[Piece]) -> UpdateAddressLocationsRequest {
    UpdateAddressLocationsRequest {
        action: UpdateAction::PartialUpdate,
        address_locations: call
            .iter()
            .map(|p| {
                let change = &locations[p.index];
                AddressLocationUpdate {
                    address_location: change.location.clone(),
                    address_update_action: match change.action() {
                        v1::AddressUpdateAction::FullUpdate => UpdateAction::FullUpdate,
                        _ => UpdateAction::PartialUpdate,
                    },
                    addresses: change.addresses[p.start..p.end]
                        .iter()
                        .map(|a| GatewayAddress {
                            address: a.address.clone(),
                            services: a.services.clone(),
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

/// Splits the changes into the valid ones and the errors of the others (no location, no action, a
/// location listed twice).
fn validate(locations: &[LocationChange]) -> (Vec<usize>, Vec<UnitError>) {
    let mut seen = HashSet::new();
    let mut valid = Vec::new();
    let mut errors = Vec::new();
    for (i, change) in locations.iter().enumerate() {
        let invalid = |message: String| UnitError::Invalid {
            code: "InvalidLocationChange",
            message: format!("locations[{i}]: {message}"),
        };
        if change.location.trim().is_empty() {
            errors.push(invalid("empty location".into()));
        } else if !matches!(
            change.action(),
            v1::AddressUpdateAction::FullUpdate | v1::AddressUpdateAction::PartialUpdate
        ) {
            errors.push(invalid(format!(
                "unknown address update action {}",
                change.action
            )));
        } else if !seen.insert(change.location.as_str()) {
            errors.push(invalid(format!(
                "location {} is listed twice",
                change.location
            )));
        } else {
            valid.push(i);
        }
    }
    (valid, errors)
}

/// The most extra calls the worker sends to find what causes the refusal of one call of `n`
/// location changes: `2·⌈log2(n)⌉ + 2` (none for one change). A halving costs two calls per level
/// and finds one culprit in `⌈log2(n)⌉` levels; the two more leave room for a culprit named by NRP
/// (one call) before a halving.
pub fn refusal_split_bound(n: usize) -> usize {
    if n < 2 {
        return 0;
    }
    let levels = (usize::BITS - (n - 1).leading_zeros()) as usize;
    2 * levels + 2
}

/// The position in `call` of the one location change that an address named by `message` belongs
/// to (one of its addresses in the call, or its location), if exactly one has one.
pub fn culprit_named(locations: &[LocationChange], call: &[Piece], message: &str) -> Option<usize> {
    let named = errors::addresses_named(message);
    if named.is_empty() {
        return None;
    }
    let mut hits = (0..call.len()).filter(|&i| named_in(locations, call[i], &named).is_some());
    match (hits.next(), hits.next()) {
        (Some(i), None) => Some(i),
        _ => None,
    }
}

/// The first of `named` that is `piece`'s location or one of its addresses.
fn named_in(locations: &[LocationChange], piece: Piece, named: &[IpAddr]) -> Option<IpAddr> {
    let change = &locations[piece.index];
    let ips: Vec<IpAddr> = std::iter::once(change.location.as_str())
        .chain(
            change.addresses[piece.start..piece.end]
                .iter()
                .map(|a| a.address.as_str()),
        )
        .filter_map(|a| a.trim().parse::<IpAddr>().ok())
        .map(|ip| ip.to_canonical())
        .collect();
    named.iter().copied().find(|ip| ips.contains(ip))
}

/// The message of an NRP refusal.
fn message_of(e: &UnitError) -> &str {
    match e {
        UnitError::Nrp(NrpError::Validation { message, .. }) => message,
        _ => "",
    }
}

/// What splitting a refused call found out.
#[derive(Debug, Default)]
struct Split {
    /// Pieces that went through.
    applied: Vec<Piece>,
    /// Pieces that failed, with their error: the culprits with their refusal, those not decided
    /// within the bound with the refusal of the part they were in, those met by another error
    /// with it.
    failed: Vec<(Piece, UnitError)>,
    /// A retryable or repair error met while splitting: the unit stops.
    stop: bool,
    /// Extra calls sent.
    calls: usize,
}

/// Finds the location changes of `call`, refused with `refusal`, that cause the refusal, and sends
/// the others (docs/errors.md, "A refused call is split"): a location change NRP's message names an
/// address of is left out and the rest sent again; otherwise the call is halved, each half sent and
/// halved again on a refusal, down to single location changes. At most
/// [`refusal_split_bound`]`(call.len())` extra calls.
async fn split_refused(
    ctx: &UnitCtx<'_>,
    locations: &[LocationChange],
    call: &[Piece],
    refusal: UnitError,
) -> Split {
    let bound = refusal_split_bound(call.len());
    let mut split = Split::default();
    let mut undecided = 0usize;
    let mut refused: VecDeque<(Vec<Piece>, UnitError)> = VecDeque::new();
    refused.push_back((call.to_vec(), refusal));
    while let Some((group, e)) = refused.pop_front() {
        let parts: Vec<Vec<Piece>> = if let [single] = group[..] {
            culprit(locations, single, &e);
            split.failed.push((single, e));
            continue;
        } else if let Some(i) = culprit_named(locations, &group, message_of(&e)) {
            culprit(locations, group[i], &e);
            split.failed.push((group[i], e.clone()));
            let mut rest = group;
            rest.remove(i);
            vec![rest]
        } else {
            let mid = group.len().div_ceil(2);
            vec![group[..mid].to_vec(), group[mid..].to_vec()]
        };
        for part in parts {
            if split.stop || split.calls >= bound {
                if !split.stop {
                    undecided += part.len();
                }
                split
                    .failed
                    .extend(part.into_iter().map(|p| (p, e.clone())));
                continue;
            }
            split.calls += 1;
            ctx.env.metrics.refusal_split_call();
            let body = request(locations, &part);
            let result = ctx
                .mutate(|o| ctx.nrp().update_address_locations(ctx.resource(), &body, o))
                .await;
            match result {
                Ok(()) => split.applied.extend(part),
                Err(UnitError::Nrp(n)) if errors::is_refusal(&n) => {
                    refused.push_back((part, UnitError::Nrp(n)));
                }
                Err(other) => {
                    tracing::warn!(locations = part.len(), error = ?other, "updateAddressLocations failed while a refused call was split");
                    split.stop |= other.is_retryable();
                    split
                        .failed
                        .extend(part.into_iter().map(|p| (p, other.clone())));
                }
            }
        }
    }
    if undecided > 0 {
        tracing::warn!(
            bound,
            undecided,
            "the bound on extra calls is reached: the location changes not decided fail with the refusal"
        );
    }
    split
}

/// Logs a location change found to cause a refusal.
fn culprit(locations: &[LocationChange], piece: Piece, e: &UnitError) {
    let named = named_in(locations, piece, &errors::addresses_named(message_of(e)));
    let address = named.map_or_else(|| "not named".to_string(), |a| a.to_string());
    tracing::warn!(
        location = %locations[piece.index].location,
        code = e.code(),
        address,
        "NRP refuses this location change: the rest of its call is sent without it"
    );
}

/// Runs the calls one after the other. A failure that is retried or repaired stops the unit (the
/// rest would most likely fail the same way, or be cut from the same wrong view of NRP); one that
/// parks only fails the locations of its call. A call of several location changes refused
/// deterministically ([`errors::is_refusal`]) is split: only the location changes that cause the
/// refusal fail, the others go through, and the unit goes on.
pub(crate) async fn execute(ctx: &UnitCtx<'_>, work_id: u64, work: &LocationWork) -> Report {
    let locations = &work.locations;
    let (valid, mut errors) = validate(locations);
    let calls = plan(locations, &valid, ctx.env.config.limits);
    let mut failed = vec![true; locations.len()];
    for &i in &valid {
        failed[i] = false;
    }
    for e in &errors {
        tracing::warn!(error = ?e, "invalid location change");
    }
    for (n, call) in calls.iter().enumerate() {
        let body = request(locations, call);
        let addresses: usize = call.iter().map(Piece::len).sum();
        let result = ctx
            .mutate(|o| ctx.nrp().update_address_locations(ctx.resource(), &body, o))
            .await;
        let stop = match result {
            Ok(()) => {
                tracing::debug!(
                    call = n,
                    locations = call.len(),
                    addresses,
                    "locations updated"
                );
                false
            }
            Err(UnitError::Nrp(e)) if call.len() > 1 && errors::is_refusal(&e) => {
                tracing::warn!(call = n, locations = call.len(), error = ?e, "updateAddressLocations refused: splitting the call");
                let split = split_refused(ctx, locations, call, UnitError::Nrp(e)).await;
                tracing::info!(
                    call = n,
                    extra_calls = split.calls,
                    applied = split.applied.len(),
                    failed = split.failed.len(),
                    "refused call split"
                );
                for (p, e) in split.failed {
                    failed[p.index] = true;
                    errors.push(e);
                }
                split.stop
            }
            Err(e) => {
                tracing::warn!(call = n, locations = call.len(), error = ?e, "updateAddressLocations failed");
                for p in call {
                    failed[p.index] = true;
                }
                let stop = e.is_retryable();
                errors.push(e);
                stop
            }
        };
        if stop {
            for later in &calls[n + 1..] {
                for p in later {
                    failed[p.index] = true;
                }
            }
            break;
        }
    }
    let applied = (0..locations.len())
        .filter(|&i| !failed[i])
        .map(|i| u32::try_from(i).unwrap_or(u32::MAX))
        .collect();
    partial_report(work_id, applied, errors)
}

#[cfg(test)]
mod tests {
    use clb_proto::v1::AddressChange;

    use super::*;

    fn change(location: &str, n: usize, full: bool) -> LocationChange {
        let mut c = LocationChange {
            location: location.into(),
            action: 0,
            addresses: (0..n)
                .map(|i| AddressChange {
                    address: format!("10.1.0.{i}"),
                    services: vec!["s".into()],
                })
                .collect(),
        };
        c.set_action(if full {
            v1::AddressUpdateAction::FullUpdate
        } else {
            v1::AddressUpdateAction::PartialUpdate
        });
        c
    }

    fn limits(locations: usize, addresses: usize) -> Limits {
        Limits {
            max_locations_per_call: locations,
            max_addresses_per_call: addresses,
            ..Limits::default()
        }
    }

    fn shape(calls: &[Vec<Piece>]) -> Vec<Vec<(usize, usize)>> {
        calls
            .iter()
            .map(|c| c.iter().map(|p| (p.index, p.len())).collect())
            .collect()
    }

    #[test]
    fn packs_up_to_the_location_and_address_limits() {
        let locs: Vec<_> = (0..5)
            .map(|i| change(&format!("10.0.0.{i}"), 2, true))
            .collect();
        let all: Vec<usize> = (0..5).collect();
        assert_eq!(plan(&locs, &all, limits(100, 100)).len(), 1);
        assert_eq!(
            shape(&plan(&locs, &all, limits(2, 100))),
            vec![vec![(0, 2), (1, 2)], vec![(2, 2), (3, 2)], vec![(4, 2)]]
        );
        assert_eq!(
            shape(&plan(&locs, &all, limits(100, 5))),
            vec![vec![(0, 2), (1, 2)], vec![(2, 2), (3, 2)], vec![(4, 2)]]
        );
    }

    #[test]
    fn splits_partial_updates_but_never_full_ones() {
        let locs = vec![
            change("10.0.0.1", 1, false),
            change("10.0.0.2", 7, false),
            change("10.0.0.3", 7, true),
            change("10.0.0.4", 0, true),
        ];
        let calls = plan(&locs, &[0, 1, 2, 3], limits(100, 3));
        assert_eq!(
            shape(&calls),
            vec![
                vec![(0, 1)],
                vec![(1, 3)],
                vec![(1, 3)],
                vec![(1, 1)],
                vec![(2, 7)],
                vec![(3, 0)]
            ]
        );
        for call in &calls {
            let mut seen = HashSet::new();
            assert!(call.iter().all(|p| seen.insert(p.index)), "{call:?}");
        }
        let body = request(&locs, &calls[4]);
        assert_eq!(body.action, UpdateAction::PartialUpdate);
        assert_eq!(
            body.address_locations[0].address_update_action,
            UpdateAction::FullUpdate
        );
        assert_eq!(body.address_locations[0].addresses.len(), 7);
        assert!(
            request(&locs, &calls[5]).address_locations[0]
                .addresses
                .is_empty()
        );
    }

    #[test]
    fn the_bound_on_extra_calls_is_two_per_halving_level_and_two() {
        let bounds: Vec<usize> = [1, 2, 3, 4, 5, 8, 9, 100, 1000]
            .into_iter()
            .map(refusal_split_bound)
            .collect();
        assert_eq!(bounds, vec![0, 4, 6, 6, 8, 8, 10, 16, 22]);
    }

    fn whole(calls: &[usize], locations: &[LocationChange]) -> Vec<Piece> {
        calls
            .iter()
            .map(|&index| Piece {
                index,
                start: 0,
                end: locations[index].addresses.len(),
            })
            .collect()
    }

    #[test]
    fn the_culprit_is_the_one_change_a_named_address_belongs_to() {
        // Locations 10.0.0.{0..3}, each with addresses 10.1.0.{0,1}: make them distinct.
        let locs: Vec<_> = (0..4)
            .map(|i| {
                let mut c = change(&format!("10.0.0.{i}"), 2, false);
                for (k, a) in c.addresses.iter_mut().enumerate() {
                    a.address = format!("10.1.{i}.{k}");
                }
                c
            })
            .collect();
        let call = whole(&[0, 1, 2, 3], &locs);
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
        let mut v6 = change("fd00::1", 1, false);
        v6.addresses[0].address = "fd01:0:0::1".into();
        let locs = vec![locs[0].clone(), v6];
        let call = whole(&[0, 1], &locs);
        assert_eq!(
            culprit_named(&locs, &call, "address 'fd01::0001' at location 'FD00::1'"),
            Some(1)
        );
    }

    #[test]
    fn rejects_duplicates_and_unknown_actions() {
        let mut bad = change("10.0.0.2", 1, true);
        bad.action = 0;
        let locs = vec![
            change("10.0.0.1", 1, true),
            bad,
            change("10.0.0.1", 1, true),
        ];
        let (valid, errors) = validate(&locs);
        assert_eq!(valid, vec![0]);
        assert_eq!(errors.len(), 2);
    }
}
