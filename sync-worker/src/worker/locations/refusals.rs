//! A refused call split down to what NRP refuses (docs/errors.md, "A refused call is split"): a
//! call of several location changes down to the location changes that cause the refusal, then each
//! of those down to its addresses. Only the addresses NRP refuses are left out
//! (`Report.refused_addresses`); the rest of their location change, and every other location change
//! of the call, goes through.
//!
//! [`Search`] is the splitting itself, without I/O and the same at both levels; [`contain`] drives it
//! with a function that sends one call.

use std::collections::VecDeque;
use std::net::IpAddr;

use clb_nrp::NrpError;
use clb_nrp::wire::{UpdateAction, UpdateAddressLocationsRequest};
use clb_proto::v1::{self, LocationChange, RefusedAddress};

use super::{Piece, request, update};
use crate::worker::ctx::UnitError;
use crate::worker::errors;

/// The most extra calls the worker sends to find what causes the refusal of a group of `n` items
/// (the location changes of a call, or the addresses of a location change): `2·⌈log2(n)⌉ + 2` (none
/// for one). A halving costs two calls per level and finds one culprit in `⌈log2(n)⌉` levels; the
/// two more leave room for a culprit named by NRP (one call) before a halving.
pub fn refusal_split_bound(n: usize) -> usize {
    if n < 2 {
        return 0;
    }
    let levels = (usize::BITS - (n - 1).leading_zeros()) as usize;
    2 * levels + 2
}

/// What a [`Search`] found out about the items of a refused group.
#[derive(Debug)]
struct Found<T> {
    /// Items that went through.
    applied: Vec<T>,
    /// Items found to cause a refusal, each with it: alone in a refused part, or the one item of a
    /// refused part that NRP's message names.
    culprits: Vec<(T, UnitError)>,
    /// Items not decided within the bound, with the refusal of the part they were in.
    undecided: Vec<(T, UnitError)>,
    /// Items of a part that failed with another error than a refusal, with it.
    failed: Vec<(T, UnitError)>,
    /// Items not sent because such an error stopped the search, with the refusal of their part.
    unsent: Vec<(T, UnitError)>,
    /// A retried or repaired error was met: nothing more is sent.
    stop: bool,
    /// Extra calls sent.
    calls: usize,
}

/// The search for the items of a refused group (the location changes of a call, or the addresses of
/// one location change) that cause its refusal, without I/O: [`Search::next`] gives the next part to
/// send, [`Search::answer`] takes NRP's answer to it. An item NRP's message names is left out and the
/// rest sent again; otherwise the group is halved, each half sent and, when refused, split again,
/// down to single items. At most `bound` parts are sent.
#[derive(Debug)]
struct Search<T> {
    bound: usize,
    /// Groups refused and not split yet, each with its refusal.
    refused: VecDeque<(Vec<T>, UnitError)>,
    /// Parts to send, each with the refusal of the group it comes from.
    parts: VecDeque<(Vec<T>, UnitError)>,
    /// The part sent and not answered yet.
    sent: Option<Vec<T>>,
    found: Found<T>,
}

/// Each of `items` with (a clone of) `e`.
fn with<T>(items: Vec<T>, e: &UnitError) -> impl Iterator<Item = (T, UnitError)> {
    let e = e.clone();
    items.into_iter().map(move |t| (t, e.clone()))
}

impl<T> Search<T> {
    /// The search for what causes `refusal` of `group` (not empty), in at most `bound` calls.
    fn new(group: Vec<T>, refusal: UnitError, bound: usize) -> Self {
        Self {
            bound,
            refused: VecDeque::from([(group, refusal)]),
            parts: VecDeque::new(),
            sent: None,
            found: Found {
                applied: Vec::new(),
                culprits: Vec::new(),
                undecided: Vec::new(),
                failed: Vec::new(),
                unsent: Vec::new(),
                stop: false,
                calls: 0,
            },
        }
    }

    /// The next part to send, or `None` when the search is over. `named` gives the position in a
    /// refused group of the one item NRP's message names, if any.
    fn next(&mut self, named: impl Fn(&[T], &str) -> Option<usize>) -> Option<&[T]> {
        debug_assert!(self.sent.is_none(), "the part sent is answered first");
        loop {
            if let Some((part, refusal)) = self.parts.pop_front() {
                let found = &mut self.found;
                if found.stop {
                    found.unsent.extend(with(part, &refusal));
                } else if found.calls >= self.bound {
                    found.undecided.extend(with(part, &refusal));
                } else {
                    found.calls += 1;
                    return Some(self.sent.insert(part));
                }
                continue;
            }
            let (mut group, refusal) = self.refused.pop_front()?;
            if group.len() <= 1 {
                self.found.culprits.extend(with(group, &refusal));
            } else if let Some(i) = named(&group, message_of(&refusal)) {
                let culprit = group.remove(i);
                self.found.culprits.push((culprit, refusal.clone()));
                self.parts.push_back((group, refusal));
            } else {
                let second = group.split_off(group.len().div_ceil(2));
                self.parts.push_back((group, refusal.clone()));
                self.parts.push_back((second, refusal));
            }
        }
    }

    /// NRP's answer to the part [`Search::next`] gave: it went through, it is refused (and split
    /// again), or it failed otherwise (its items fail with that error; one that is retried or
    /// repaired stops the search).
    fn answer(&mut self, result: Result<(), UnitError>) {
        let Some(part) = self.sent.take() else {
            return;
        };
        match result {
            Ok(()) => self.found.applied.extend(part),
            Err(UnitError::Nrp(e)) if errors::is_refusal(&e) => {
                self.refused.push_back((part, UnitError::Nrp(e)));
            }
            Err(other) => {
                tracing::warn!(items = part.len(), error = ?other, "updateAddressLocations failed while a refused call was split");
                self.found.stop |= other.is_retryable();
                self.found.failed.extend(with(part, &other));
            }
        }
    }

    /// Whether no part went through yet.
    fn nothing_applied(&self) -> bool {
        self.found.applied.is_empty()
    }
}

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
            return search.found;
        };
        let result = send.call(&body(part, first)).await;
        search.answer(result);
    }
}

/// The message of an NRP refusal.
fn message_of(e: &UnitError) -> &str {
    match e {
        UnitError::Nrp(NrpError::Validation { message, .. }) => message,
        _ => "",
    }
}

/// `text` as a canonical IP, if it is one.
fn ip(text: &str) -> Option<IpAddr> {
    text.trim()
        .parse::<IpAddr>()
        .ok()
        .map(|ip| ip.to_canonical())
}

/// The position in `group` of the one item `hit` holds for, if exactly one.
fn only_one<T>(group: &[T], hit: impl Fn(&T) -> bool) -> Option<usize> {
    let mut hits = (0..group.len()).filter(|&i| hit(&group[i]));
    match (hits.next(), hits.next()) {
        (Some(i), None) => Some(i),
        _ => None,
    }
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
