//! Splitting a call NRP refused down to what it refuses (docs/errors.md, "A refused call is split"),
//! without I/O: [`Search`] halves a refused group of items (the location changes of an
//! `updateAddressLocations` call, the addresses of one location change, the service requests of an
//! `updateServices` call) down to the items that cause the refusal, or leaves out the one item NRP's
//! message names. Its users send each part it gives and hand back NRP's answer.

use std::collections::VecDeque;

use clb_nrp::NrpError;

use super::ctx::UnitError;
use super::errors;

/// The most extra calls the worker sends to find what causes the refusal of a group of `n` items
/// (the location changes of a call, the addresses of a location change, the service requests of
/// an `updateServices` call): `2·⌈log2(n)⌉ + 2` (none
/// for one). A halving costs two calls per level and finds one culprit in `⌈log2(n)⌉` levels; the
/// two more leave room for a culprit named by NRP (one call) before a halving. The fast path of a
/// refused `updateAddressLocations` call that names one of its addresses (the call sent once without
/// it) is one more call, before the bound of its location changes.
pub fn refusal_split_bound(n: usize) -> usize {
    if n < 2 {
        return 0;
    }
    let levels = (usize::BITS - (n - 1).leading_zeros()) as usize;
    2 * levels + 2
}

/// What a [`Search`] found out about the items of a refused group.
#[derive(Debug)]
pub(crate) struct Found<T> {
    /// Items that went through.
    pub applied: Vec<T>,
    /// Items found to cause a refusal, each with it: alone in a refused part, or the one item of a
    /// refused part that NRP's message names.
    pub culprits: Vec<(T, UnitError)>,
    /// Items not decided within the bound, with the refusal of the part they were in.
    pub undecided: Vec<(T, UnitError)>,
    /// Items of a part that failed with another error than a refusal, with it.
    pub failed: Vec<(T, UnitError)>,
    /// Items not sent because such an error stopped the search, with the refusal of their part.
    pub unsent: Vec<(T, UnitError)>,
    /// A retried or repaired error was met: nothing more is sent.
    pub stop: bool,
    /// Extra calls sent.
    pub calls: usize,
}

/// The search for the items of a refused group (the location changes of a call, or the addresses of
/// one location change) that cause its refusal, without I/O: [`Search::next`] gives the next part to
/// send, [`Search::answer`] takes NRP's answer to it. An item NRP's message names is left out and the
/// rest sent again; otherwise the group is halved, each half sent and, when refused, split again,
/// down to single items. At most `bound` parts are sent.
#[derive(Debug)]
pub(crate) struct Search<T> {
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
    pub(crate) fn new(group: Vec<T>, refusal: UnitError, bound: usize) -> Self {
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
    pub(crate) fn next(&mut self, named: impl Fn(&[T], &str) -> Option<usize>) -> Option<&[T]> {
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
    pub(crate) fn answer(&mut self, result: Result<(), UnitError>) {
        let Some(part) = self.sent.take() else {
            return;
        };
        match result {
            Ok(()) => self.found.applied.extend(part),
            Err(UnitError::Nrp(e)) if errors::is_refusal(&e) => {
                self.refused.push_back((part, UnitError::Nrp(e)));
            }
            Err(other) => {
                tracing::warn!(items = part.len(), error = ?other, "a part of a refused call failed otherwise while it was split");
                self.found.stop |= other.is_retryable();
                self.found.failed.extend(with(part, &other));
            }
        }
    }

    /// What the search found (once [`Search::next`] gave `None`).
    pub(crate) fn found(self) -> Found<T> {
        self.found
    }

    /// Whether no part went through yet.
    pub(crate) fn nothing_applied(&self) -> bool {
        self.found.applied.is_empty()
    }
}

/// The message of an NRP refusal.
pub(crate) fn message_of(e: &UnitError) -> &str {
    match e {
        UnitError::Nrp(NrpError::Validation { message, .. }) => message,
        _ => "",
    }
}

/// The position in `group` of the one item `hit` holds for, if exactly one.
pub(crate) fn only_one<T>(group: &[T], hit: impl Fn(&T) -> bool) -> Option<usize> {
    let mut hits = (0..group.len()).filter(|&i| hit(&group[i]));
    match (hits.next(), hits.next()) {
        (Some(i), None) => Some(i),
        _ => None,
    }
}
