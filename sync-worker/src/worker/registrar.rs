//! The registrations of a service unit in one `updateServices` call (issue 36): `serviceRequests` is
//! a list (the REST specification's `ServiceGatewayUpdateServicesRequest`), so the worker registers
//! or unregisters every service of a unit that reached that step in one call instead of one call
//! per service.
//!
//! Each saga of the unit holds a [`Seat`]. At its registration step (after the public IP and load
//! balancer or NAT gateway of a creation, first thing for a deletion) it hands its
//! `ServiceRequest` over ([`Seat::register`]) and waits for the answer; a saga that ends without
//! getting there (it failed before, or it has nothing to register) gives its seat up by ending.
//! [`Registrar::run`] sends the call once every seat has handed a request over or been given up,
//! and answers each request with the call's outcome. A saga registers at most once, so a unit
//! makes at most one such call, and the unit's bound on service changes
//! (`DispatchConfig::max_services_per_unit`) bounds its size.
//!
//! A call NRP refuses deterministically ([`errors::is_refusal`]) is split ([`Search`], as a refused
//! `updateAddressLocations` call is): the requests that cause the refusal get it, the others go
//! through. Any other failure (throttling, a conflict, a lease that ran out, …) is every request's
//! answer, as each saga's own call would have been before; the saga reports it as it did.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use clb_nrp::wire::{ServiceRequest, UpdateAction, UpdateServicesRequest};
use tokio::sync::{Notify, oneshot};

use super::ctx::UnitError;
use super::errors;
use super::split::{Search, message_of, only_one, refusal_split_bound};

/// What sends an `updateServices` call (the unit's context; a model of NRP in tests).
#[async_trait::async_trait]
pub(crate) trait Registry: Sync {
    /// Sends `body` to NRP.
    async fn update_services(&self, body: &UpdateServicesRequest) -> Result<(), UnitError>;
}

/// A request handed over, with where its answer goes.
type Handed = (ServiceRequest, oneshot::Sender<Result<(), UnitError>>);

#[derive(Debug, Default)]
struct State {
    /// Seats that have neither handed a request over nor been given up.
    open: usize,
    /// The requests handed over and not sent yet.
    handed: Vec<Handed>,
}

/// Gathers the registrations of one unit's sagas into one `updateServices` call.
#[derive(Debug)]
pub(crate) struct Registrar {
    state: Mutex<State>,
    changed: Notify,
}

/// A saga's place at the registrar: it hands one request over, or gives the seat up by dropping it.
#[derive(Debug)]
pub(crate) struct Seat<'a> {
    registrar: &'a Registrar,
    open: AtomicBool,
}

/// What one run of the registrar did (for logs and tests).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Sent {
    /// Requests sent.
    pub requests: usize,
    /// `updateServices` calls sent, the extra calls of a split included.
    pub calls: usize,
}

impl Registrar {
    /// A registrar for `sagas` sagas, each of which takes one [`Registrar::seat`].
    pub(crate) fn new(sagas: usize) -> Self {
        Self {
            state: Mutex::new(State {
                open: sagas,
                handed: Vec::new(),
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The seat of one saga (each of the sagas counted in [`Registrar::new`] takes exactly one).
    pub(crate) fn seat(&self) -> Seat<'_> {
        Seat {
            registrar: self,
            open: AtomicBool::new(true),
        }
    }

    /// Closes a seat, with the request it hands over if any.
    fn close(&self, handed: Option<Handed>) {
        let mut state = self.lock();
        state.open = state.open.saturating_sub(1);
        state.handed.extend(handed);
        drop(state);
        // A permit is stored when `run` is not waiting yet: no wake-up is lost.
        self.changed.notify_one();
    }

    /// Waits until every seat has handed its request over or been given up, then registers the
    /// requests handed over in one call through `registry` (split when refused), and answers each.
    pub(crate) async fn run(&self, registry: &dyn Registry) -> Sent {
        let batch = loop {
            {
                let mut state = self.lock();
                if state.open == 0 {
                    break std::mem::take(&mut state.handed);
                }
            }
            self.changed.notified().await;
        };
        if batch.is_empty() {
            return Sent::default();
        }
        let (requests, answers): (Vec<ServiceRequest>, Vec<_>) = batch.into_iter().unzip();
        let (results, calls) = register(registry, &requests).await;
        for (answer, result) in answers.into_iter().zip(results) {
            // A saga that stopped waiting (its unit ended) needs no answer.
            let _ = answer.send(result);
        }
        Sent {
            requests: requests.len(),
            calls,
        }
    }
}

impl Seat<'_> {
    /// Hands `request` over and waits for the outcome of the call that carries it. A saga
    /// registers once: a second request is a bug, answered as invalid.
    pub(crate) async fn register(&self, request: ServiceRequest) -> Result<(), UnitError> {
        if !self.open.swap(false, Ordering::SeqCst) {
            return Err(UnitError::Invalid {
                code: "InvalidServiceChange",
                message: format!(
                    "service {}: a saga registers once per unit",
                    request.service.name
                ),
            });
        }
        let (tx, rx) = oneshot::channel();
        self.registrar.close(Some((request, tx)));
        // The registrar runs as long as the unit: no answer means it stopped with the unit.
        rx.await.unwrap_or(Err(UnitError::Aborted))
    }
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        if self.open.swap(false, Ordering::SeqCst) {
            self.registrar.close(None);
        }
    }
}

/// The call that carries `requests` (a partial update: the gateway's other services stay).
fn call_of<'a>(requests: impl IntoIterator<Item = &'a ServiceRequest>) -> UpdateServicesRequest {
    UpdateServicesRequest {
        action: UpdateAction::PartialUpdate,
        service_requests: requests.into_iter().cloned().collect(),
    }
}

/// The position in `part` (indices into `requests`) of the one request whose service NRP's
/// `message` names (quoted, as NRP quotes names), if exactly one.
fn named(requests: &[ServiceRequest], part: &[usize], message: &str) -> Option<usize> {
    only_one(part, |&i| {
        let name = &requests[i].service.name;
        message.contains(&format!("'{name}'")) || message.contains(&format!("\"{name}\""))
    })
}

/// Sends `requests` in one call; when NRP refuses it deterministically, splits it down to the
/// requests that cause the refusal (at most [`refusal_split_bound`] extra calls). Returns each
/// request's outcome, in order, and the calls sent.
async fn register(
    registry: &dyn Registry,
    requests: &[ServiceRequest],
) -> (Vec<Result<(), UnitError>>, usize) {
    let first = registry.update_services(&call_of(requests)).await;
    let refusal = match first {
        Err(UnitError::Nrp(e)) if requests.len() > 1 && errors::is_refusal(&e) => UnitError::Nrp(e),
        other => return (vec![other; requests.len()], 1),
    };
    tracing::debug!(
        services = requests.len(),
        code = refusal.code(),
        "NRP refuses the unit's updateServices call: splitting it by service"
    );
    let bound = refusal_split_bound(requests.len());
    let mut search = Search::new((0..requests.len()).collect(), refusal, bound);
    while let Some(part) = search.next(|part, message| named(requests, part, message)) {
        let result = registry
            .update_services(&call_of(part.iter().map(|&i| &requests[i])))
            .await;
        search.answer(result);
    }
    let found = search.found();
    let mut results: Vec<Result<(), UnitError>> = vec![Ok(()); requests.len()];
    for (i, e) in found.culprits.into_iter().chain(found.undecided) {
        tracing::warn!(service = %requests[i].service.name, code = e.code(), message = message_of(&e), "NRP refuses this service's registration");
        results[i] = Err(e);
    }
    for (i, e) in found.failed {
        results[i] = Err(e);
    }
    for (i, _) in found.unsent {
        results[i] = Err(UnitError::Aborted);
    }
    (results, 1 + found.calls)
}

#[cfg(test)]
#[path = "registrar_tests.rs"]
mod tests;
