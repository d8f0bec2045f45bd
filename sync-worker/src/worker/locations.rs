//! Location work: `LocationChange`s turned into as few `updateAddressLocations` calls as the limits
//! allow, each location at most once per call. A call NRP refuses is split down to the addresses
//! that cause the refusal ([`refusals`]).

mod refusals;

use std::collections::HashSet;

use clb_proto::v1::{self, AddressChange, LocationChange, LocationWork, Report};

use super::config::Limits;
use super::ctx::{UnitCtx, UnitError, partial_report};
use super::errors;
use clb_nrp::wire::{
    AddressLocationUpdate, GatewayAddress, UpdateAction, UpdateAddressLocationsRequest,
};

pub use super::split::refusal_split_bound;

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

/// The wire action of `change`.
fn action_of(change: &LocationChange) -> UpdateAction {
    match change.action() {
        v1::AddressUpdateAction::FullUpdate => UpdateAction::FullUpdate,
        _ => UpdateAction::PartialUpdate,
    }
}

/// The update of `change`'s location in a call: `addresses` of it, with `action`.
fn update<'a>(
    change: &LocationChange,
    action: UpdateAction,
    addresses: impl IntoIterator<Item = &'a AddressChange>,
) -> AddressLocationUpdate {
    AddressLocationUpdate {
        address_location: change.location.clone(),
        address_update_action: action,
        addresses: addresses
            .into_iter()
            .map(|a| GatewayAddress {
                address: a.address.clone(),
                services: a.service_ids.clone(),
            })
            .collect(),
    }
}

/// The body of one planned call.
pub fn request(locations: &[LocationChange], call: &[Piece]) -> UpdateAddressLocationsRequest {
    UpdateAddressLocationsRequest {
        action: UpdateAction::PartialUpdate,
        address_locations: call
            .iter()
            .map(|p| {
                let change = &locations[p.index];
                update(change, action_of(change), &change.addresses[p.start..p.end])
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

/// Sends the extra calls of a split, counted in `clb_worker_refusal_split_calls_total`.
struct ExtraCalls<'a> {
    ctx: &'a UnitCtx<'a>,
}

#[async_trait::async_trait]
impl refusals::Caller for ExtraCalls<'_> {
    async fn call(&mut self, body: &UpdateAddressLocationsRequest) -> Result<(), UnitError> {
        let ctx = self.ctx;
        ctx.env.metrics.refusal_split_call();
        ctx.mutate(|o| ctx.nrp().update_address_locations(ctx.resource(), body, o))
            .await
    }
}

/// Runs the calls one after the other. A failure that is retried or repaired stops the unit (the
/// rest would most likely fail the same way, or be cut from the same wrong view of NRP); one that
/// parks only fails the locations of its call. A call refused deterministically
/// ([`errors::is_refusal`]) is split ([`refusals::contain`]): only the addresses that cause the
/// refusal are left out (`Report.refused_addresses`), the rest goes through, and the unit goes on.
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
    let mut extra = ExtraCalls { ctx };
    let mut refused = Vec::new();
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
            Err(UnitError::Nrp(e)) if errors::is_refusal(&e) => {
                tracing::warn!(call = n, locations = call.len(), addresses, error = ?e, "updateAddressLocations refused: splitting the call");
                let split = refusals::contain(&mut extra, locations, call, UnitError::Nrp(e)).await;
                tracing::info!(
                    call = n,
                    extra_calls = split.calls,
                    failed = split.failed.len(),
                    refused_addresses = split.refused.len(),
                    "refused call split"
                );
                for (p, e) in split.failed {
                    failed[p.index] = true;
                    errors.push(e);
                }
                refused.extend(split.refused);
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
    let mut report = partial_report(work_id, applied, errors);
    report.refused_addresses = refused;
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(location: &str, n: usize, full: bool) -> LocationChange {
        change_of(location, "10.1.0", n, full)
    }

    /// A location change at `location` with addresses `{prefix}.{0..n}`, all for service `s`.
    pub(super) fn change_of(location: &str, prefix: &str, n: usize, full: bool) -> LocationChange {
        let mut c = LocationChange {
            location: location.into(),
            action: 0,
            addresses: (0..n)
                .map(|i| AddressChange {
                    address: format!("{prefix}.{i}"),
                    service_ids: vec!["s".into()],
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
