//! A refused call split down to what NRP refuses (docs/errors.md, "A refused call is split"): a
//! call of several location changes down to the location changes that cause the refusal, then each
//! of those down to its addresses. Only the addresses NRP refuses are left out
//! (`Report.refused_addresses`); the rest of their location change, and every other location change
//! of the call, goes through.
//!
//! [`Search`] is the splitting itself, without I/O and the same at both levels; [`contain`] drives it
//! with a function that sends one call. Before it, when NRP's message names one address of a call of
//! several location changes ([`named_alone`]), the call is sent once without that address (the fast
//! path): one extra call instead of two.

use std::net::IpAddr;

use clb_nrp::wire::{UpdateAction, UpdateAddressLocationsRequest};
use clb_proto::v1::{self, LocationChange, RefusedAddress};

use super::{Piece, action_of, update};
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

/// The one address of `call` that `message` names, as (position in `call`, index into its location
/// change's addresses), for the fast path of [`contain`]: when the call has several location changes,
/// `message` names addresses of exactly one of them ([`culprit_named`]) and exactly one of its
/// addresses in the call ([`address_named`]), and leaving it out leaves something to send (a full
/// update of that address alone would be sent empty: the deletion of its location).
fn named_alone(
    locations: &[LocationChange],
    call: &[Piece],
    message: &str,
) -> Option<(usize, usize)> {
    if call.len() < 2 {
        return None;
    }
    let p = culprit_named(locations, call, message)?;
    let piece = call[p];
    let change = &locations[piece.index];
    let addresses: Vec<usize> = (piece.start..piece.end).collect();
    let i = addresses[address_named(change, &addresses, message)?];
    let full = change.action() == v1::AddressUpdateAction::FullUpdate;
    (!full || piece.len() > 1).then_some((p, i))
}

/// The body of `call` without the address `left_out` (index into `locations`, index into its
/// addresses): its location change goes with the rest of its addresses, with its own action (a full
/// update is then a full replacement without it), or not at all when it had no other (a partial
/// update).
fn request_without(
    locations: &[LocationChange],
    call: &[Piece],
    left_out: Option<(usize, usize)>,
) -> UpdateAddressLocationsRequest {
    UpdateAddressLocationsRequest {
        action: UpdateAction::PartialUpdate,
        address_locations: call
            .iter()
            .filter_map(|p| {
                let change = &locations[p.index];
                let kept: Vec<usize> = (p.start..p.end)
                    .filter(|&i| left_out != Some((p.index, i)))
                    .collect();
                if kept.is_empty() && p.len() > 0 {
                    return None;
                }
                let addresses = kept.into_iter().map(|i| &change.addresses[i]);
                Some(update(change, action_of(change), addresses))
            })
            .collect(),
    }
}

/// The report of `address` of location change `index`, refused with `e`.
fn refused_address(index: usize, address: &str, e: &UnitError) -> RefusedAddress {
    RefusedAddress {
        index: u32::try_from(index).unwrap_or(u32::MAX),
        address: address.to_string(),
        code: e.code().to_string(),
        message: message_of(e).to_string(),
    }
}

/// Logs `address` of `change` found refused (once per culprit).
fn warn_refused(change: &LocationChange, address: &str, e: &UnitError) {
    tracing::warn!(
        location = %change.location,
        address = %address,
        code = e.code(),
        "NRP refuses this address: its location change goes through without it, and the server holds it on its refusal schedule"
    );
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
/// with `send`.
///
/// The fast path: when `refusal` names one address of a call of several location changes
/// ([`named_alone`]), the call is sent once without it. It goes through: the address is the culprit,
/// every location change is applied (1 extra call). It is refused again: the address is a culprit
/// all the same (as a named item is in [`Search`]), and the search below splits the call without it,
/// with that second refusal. It fails otherwise: every location change of the call fails with that
/// error (a retried or repaired one stops the unit), as a part of a split does.
///
/// The search: a call of several location changes is split down to the ones that cause the refusal
/// (at most [`refusal_split_bound`]`(call.len())` extra calls; those not decided fail with the
/// refusal); each of those, or the one location change of the call, is split down to its addresses
/// ([`contain_change`]).
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
    let mut call = call.to_vec();
    let mut refusal = refusal;
    let mut left_out = None;
    if let Some((p, i)) = named_alone(locations, &call, message_of(&refusal)) {
        let piece = call[p];
        let change = &locations[piece.index];
        let address = &change.addresses[i].address;
        out.calls += 1;
        let result = send
            .call(&request_without(locations, &call, Some((piece.index, i))))
            .await;
        match result {
            Err(UnitError::Nrp(e)) if errors::is_refusal(&e) => {
                tracing::debug!(location = %change.location, %address, code = e.code(), "the call without the address NRP names is refused too: splitting it");
                warn_refused(change, address, &refusal);
                out.refused
                    .push(refused_address(piece.index, address, &refusal));
                left_out = Some((piece.index, i));
                if piece.len() == 1 {
                    call.remove(p);
                }
                refusal = UnitError::Nrp(e);
            }
            Ok(()) => {
                warn_refused(change, address, &refusal);
                out.refused
                    .push(refused_address(piece.index, address, &refusal));
                return out;
            }
            Err(other) => {
                tracing::warn!(locations = call.len(), error = ?other, "the call without the address NRP names failed otherwise");
                out.stop = other.is_retryable();
                out.failed
                    .extend(call.into_iter().map(|p| (p, other.clone())));
                return out;
            }
        }
    }
    let culprits = if let [piece] = call[..] {
        vec![(piece, refusal)]
    } else {
        let bound = refusal_split_bound(call.len());
        let search = Search::new(call.clone(), refusal, bound);
        let found = run(
            search,
            send,
            |group, message| culprit_named(locations, group, message),
            |part, _| request_without(locations, part, left_out),
        )
        .await;
        if !found.undecided.is_empty() {
            tracing::warn!(
                bound,
                undecided = found.undecided.len(),
                "the bound on extra calls is reached: the location changes not decided fail with the refusal"
            );
        }
        out.calls += found.calls;
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
            let without = left_out
                .filter(|&(index, _)| index == piece.index)
                .map(|(_, i)| i);
            contain_change(send, change, piece, without, refusal, &mut out).await;
        }
    }
    out
}

/// Splits `piece` of `change` (but the address `left_out`, already found refused), refused with
/// `refusal`, down to the addresses that cause the refusal, in at most
/// [`refusal_split_bound`]`(n)` extra calls, `n` the addresses split. The addresses refused
/// alone, and those not decided within the bound (with the refusal of the part they were in), go to
/// `out.refused`; the change goes through without them, unless a part failed otherwise (the change
/// fails with that error) or it is a full update none of whose parts went through (it fails with
/// the refusal: NRP still holds what it had there).
async fn contain_change<S>(
    send: &mut S,
    change: &LocationChange,
    piece: Piece,
    left_out: Option<usize>,
    refusal: UnitError,
    out: &mut Contained,
) where
    S: Caller,
{
    let addresses: Vec<usize> = (piece.start..piece.end)
        .filter(|&i| Some(i) != left_out)
        .collect();
    let bound = refusal_split_bound(addresses.len());
    let search = Search::new(addresses, refusal.clone(), bound);
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
        warn_refused(change, &change.addresses[*i].address, e);
    }
    if !found.undecided.is_empty() {
        tracing::warn!(
            location = %change.location,
            bound,
            undecided = found.undecided.len(),
            "the bound on extra calls is reached: the addresses not decided are reported refused, and the server sends them again on its refusal schedule"
        );
    }
    out.refused.extend(
        found
            .culprits
            .iter()
            .chain(&found.undecided)
            .map(|(i, e)| refused_address(piece.index, &change.addresses[*i].address, e)),
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
