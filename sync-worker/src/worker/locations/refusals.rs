//! A refused call split down to what NRP refuses (docs/errors.md, "A refused call is split"): a
//! call of several location changes down to the location changes that cause the refusal, then each
//! of those down to its addresses. Only the addresses NRP refuses are left out
//! (`Report.refused_addresses`); the rest of their location change, and every other location change
//! of the call, goes through.
//!
//! [`Search`] is the splitting itself, without I/O and the same at both levels; [`contain`] drives it
//! with a function that sends one call.

use std::net::IpAddr;

use clb_nrp::wire::{UpdateAction, UpdateAddressLocationsRequest};
use clb_proto::v1::{self, LocationChange, RefusedAddress};

use super::{Piece, request, update};
use crate::worker::ctx::UnitError;
use crate::worker::errors;
use crate::worker::split::{Found, Search, message_of, only_one, refusal_split_bound};

/// What sends the extra calls of a split.
#[async_trait::async_trait]
pub(super) trait Caller: Send {
    /// Sends `body` to NRP.
    async fn call(&mut self, body: &UpdateAddressLocationsRequest) -> Result<(), UnitError>;
}

/// Runs `search`, sending each part as `body` makes it (given whether no part went through yet)
/// with `send`, and returns what it found.
async fn run<T, S>(
    mut search: Search<T>,
    send: &mut S,
    named: impl Fn(&[T], &str) -> Option<usize>,
    body: impl Fn(&[T], bool) -> UpdateAddressLocationsRequest,
) -> Found<T>
where
    S: Caller,
{
    loop {
        let first = search.nothing_applied();
        let Some(part) = search.next(&named) else {
            return search.found();
        };
        let result = send.call(&body(part, first)).await;
        search.answer(result);
    }
}

/// `text` as a canonical IP, if it is one.
fn ip(text: &str) -> Option<IpAddr> {
    text.trim()
        .parse::<IpAddr>()
        .ok()
        .map(|ip| ip.to_canonical())
}

/// The position in `call` of the one location change that an address named by `message` belongs
/// to (one of its addresses in the call, or its location), if exactly one has one.
fn culprit_named(locations: &[LocationChange], call: &[Piece], message: &str) -> Option<usize> {
    let named = errors::addresses_named(message);
    if named.is_empty() {
        return None;
    }
    only_one(call, |piece| {
        let change = &locations[piece.index];
        std::iter::once(change.location.as_str())
            .chain(
                change.addresses[piece.start..piece.end]
                    .iter()
                    .map(|a| a.address.as_str()),
            )
            .filter_map(ip)
            .any(|ip| named.contains(&ip))
    })
}

/// The position in `addresses` (indices into `change.addresses`) of the one address `message`
/// names, if exactly one of them is named (its location does not count).
fn address_named(change: &LocationChange, addresses: &[usize], message: &str) -> Option<usize> {
    let named = errors::addresses_named(message);
    if named.is_empty() {
        return None;
    }
    only_one(addresses, |&i| {
        ip(&change.addresses[i].address).is_some_and(|ip| named.contains(&ip))
    })
}

/// The call that sends `addresses` (indices into `change.addresses`) of `change` alone. A full
/// update is sent as one until a part of it has gone through (`first`), and as a partial update of
/// the same location after that: the parts that go through make a full replacement with their
/// union, as a refused call changes nothing in NRP.
fn addresses_request(
    change: &LocationChange,
    addresses: &[usize],
    first: bool,
) -> UpdateAddressLocationsRequest {
    let full = change.action() == v1::AddressUpdateAction::FullUpdate;
    let action = if full && first {
        UpdateAction::FullUpdate
    } else {
        UpdateAction::PartialUpdate
    };
    UpdateAddressLocationsRequest {
        action: UpdateAction::PartialUpdate,
        address_locations: vec![update(
            change,
            action,
            addresses.iter().map(|&i| &change.addresses[i]),
        )],
    }
}

/// What containing the refusal of one call found, in terms of the unit's location changes.
#[derive(Debug, Default)]
pub(super) struct Contained {
    /// The pieces that did not go through, each with its error.
    pub failed: Vec<(Piece, UnitError)>,
    /// The addresses NRP refused on their own, and those not decided within the bound.
    pub refused: Vec<RefusedAddress>,
    /// A retried or repaired error was met: the unit stops.
    pub stop: bool,
    /// Extra calls sent.
    pub calls: usize,
}

/// Contains `refusal` of `call` (docs/errors.md, "A refused call is split"), sending each extra call
/// with `send`. A call of several location changes is split down to the ones that cause the
/// refusal (at most [`refusal_split_bound`]`(call.len())` extra calls; those not decided fail with
/// the refusal); each of those, or the one location change of the call, is split down to its
/// addresses ([`contain_change`]).
pub(super) async fn contain<S>(
    send: &mut S,
    locations: &[LocationChange],
    call: &[Piece],
    refusal: UnitError,
) -> Contained
where
    S: Caller,
{
    let mut out = Contained::default();
    let culprits = if let [piece] = call {
        vec![(*piece, refusal)]
    } else {
        let bound = refusal_split_bound(call.len());
        let search = Search::new(call.to_vec(), refusal, bound);
        let found = run(
            search,
            send,
            |group, message| culprit_named(locations, group, message),
            |part, _| request(locations, part),
        )
        .await;
        if !found.undecided.is_empty() {
            tracing::warn!(
                bound,
                undecided = found.undecided.len(),
                "the bound on extra calls is reached: the location changes not decided fail with the refusal"
            );
        }
        out.calls = found.calls;
        out.stop = found.stop;
        out.failed.extend(found.undecided);
        out.failed.extend(found.failed);
        out.failed.extend(found.unsent);
        found.culprits
    };
    for (piece, refusal) in culprits {
        let change = &locations[piece.index];
        if out.stop || piece.len() == 0 {
            tracing::warn!(location = %change.location, code = refusal.code(), addresses = piece.len(), "NRP refuses this location change; it is not split by address");
            out.failed.push((piece, refusal));
        } else {
            tracing::debug!(location = %change.location, code = refusal.code(), "NRP refuses this location change: splitting it by address");
            contain_change(send, change, piece, refusal, &mut out).await;
        }
    }
    out
}

/// Splits `piece` of `change`, refused with `refusal`, down to the addresses that cause the
/// refusal, in at most [`refusal_split_bound`]`(piece.len())` extra calls. The addresses refused
/// alone, and those not decided within the bound (with the refusal of the part they were in), go to
/// `out.refused`; the change goes through without them, unless a part failed otherwise (the change
/// fails with that error) or it is a full update none of whose parts went through (it fails with
/// the refusal: NRP still holds what it had there).
async fn contain_change<S>(
    send: &mut S,
    change: &LocationChange,
    piece: Piece,
    refusal: UnitError,
    out: &mut Contained,
) where
    S: Caller,
{
    let bound = refusal_split_bound(piece.len());
    let search = Search::new((piece.start..piece.end).collect(), refusal.clone(), bound);
    let found = run(
        search,
        send,
        |group, message| address_named(change, group, message),
        |part, first| addresses_request(change, part, first),
    )
    .await;
    out.calls += found.calls;
    out.stop |= found.stop;
    for (i, e) in &found.culprits {
        tracing::warn!(
            location = %change.location,
            address = %change.addresses[*i].address,
            code = e.code(),
            "NRP refuses this address: its location change goes through without it, and the server holds it on its refusal schedule"
        );
    }
    if !found.undecided.is_empty() {
        tracing::warn!(
            location = %change.location,
            bound,
            undecided = found.undecided.len(),
            "the bound on extra calls is reached: the addresses not decided are reported refused, and the server sends them again on its refusal schedule"
        );
    }
    let index = u32::try_from(piece.index).unwrap_or(u32::MAX);
    out.refused
        .extend(
            found
                .culprits
                .iter()
                .chain(&found.undecided)
                .map(|(i, e)| RefusedAddress {
                    index,
                    address: change.addresses[*i].address.clone(),
                    code: e.code().to_string(),
                    message: message_of(e).to_string(),
                }),
        );
    let full = change.action() == v1::AddressUpdateAction::FullUpdate;
    if let Some((_, e)) = found.failed.into_iter().next() {
        out.failed.push((piece, e));
    } else if full && found.applied.is_empty() {
        tracing::warn!(location = %change.location, code = refusal.code(), "NRP refuses every address of this full update: the location fails as a whole");
        out.failed.push((piece, refusal));
    }
}

#[cfg(test)]
#[path = "refusals_tests.rs"]
mod tests;
