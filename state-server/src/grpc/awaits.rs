//! What writers wait for, pushed: `WatchLocations` (the watcher's node moves) and `WatchAddresses`
//! (the pod readiness gate), and `ServiceConditions` (why a service is not programmed, which the
//! gate names when a pod's gate times out).
//!
//! A stream registers what it awaits with its gateway ([`AwaitFollower`]); the gateway's task
//! answers every follower after each change and wakes only those whose answers are new or
//! changed ([`crate::state::awaits`]). The stream converts: requests to [`Awaited`], answers to
//! messages. An idle gateway wakes no stream. Streams end like `WatchSession`'s: `UNAVAILABLE`
//! when the replica stops leading or starts afresh, or when the server shuts down.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

use clb_core::difftracker::ip::parse_ip;
use clb_core::gateway::programmed::Awaited;
use clb_proto::v1::{
    AddressProgrammed, AddressQuery, AddressesState, AddressesWatch, LocationProgrammed,
    LocationsRequest, LocationsState, ServiceConditionsRequest, ServiceConditionsResponse,
};
use futures::Stream;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::convert::condition_to_proto;
use super::convert::invalid_argument;
use super::session::{Shutdown, shut_down, spawn_stream, still_current, tell_shutdown};
use crate::state::awaits::AwaitFollower;
use crate::state::{GatewayHandle, StateServer};

/// The stream of `WatchLocations`.
pub type LocationsStream = Pin<Box<dyn Stream<Item = Result<LocationsState, Status>> + Send>>;
/// The stream of `WatchAddresses`.
pub type AddressesStream = Pin<Box<dyn Stream<Item = Result<AddressesState, Status>> + Send>>;

fn ip(field: &str, value: &str) -> Result<IpAddr, Status> {
    parse_ip(field, value).map_err(|e| invalid_argument(&e.field, &e.value, &e.reason.to_string()))
}

/// The locations of a `LocationsRequest`, each with its text as the request named it.
pub fn locations(req: &LocationsRequest) -> Result<Vec<(IpAddr, String)>, Status> {
    req.locations
        .iter()
        .enumerate()
        .map(|(i, l)| Ok((ip(&format!("locations[{i}]"), l)?, l.clone())))
        .collect()
}

/// One address query as the gateway awaits it.
fn address(field: &str, q: &AddressQuery) -> Result<Awaited, Status> {
    if q.service_id.is_empty() {
        return Err(invalid_argument(
            &format!("{field}.service"),
            "",
            "must name the service the address should carry",
        ));
    }
    Ok(Awaited::Address {
        location: ip(&format!("{field}.location"), &q.location)?,
        address: ip(&format!("{field}.address"), &q.address)?,
        service: q.service_id.clone(),
    })
}

/// The changes of one `AddressesWatch` message: what to watch, what to unwatch.
fn addresses_change(m: &AddressesWatch) -> Result<(Vec<Awaited>, Vec<Awaited>), Status> {
    let each = |name: &str, qs: &[AddressQuery]| {
        qs.iter()
            .enumerate()
            .map(|(i, q)| address(&format!("{name}[{i}]"), q))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok((each("watch", &m.watch)?, each("unwatch", &m.unwatch)?))
}

/// Checks that a later `AddressesWatch` message names the stream's gateway and writer or none.
fn same_stream(m: &AddressesWatch, gateway: &str, writer: &str) -> Result<(), Status> {
    for (field, value, first) in [
        ("gateway", &m.gateway, gateway),
        ("writer", &m.writer, writer),
    ] {
        if !value.is_empty() && value != first {
            return Err(invalid_argument(
                field,
                value,
                &format!("differs from the stream's first message ({first:?}): leave it empty"),
            ));
        }
    }
    Ok(())
}

/// Waits for the answers `follower` is owed; `None` when the stream is to end: the reader is gone,
/// the leadership changed (the caller checks whether the stream is still current), or the server
/// shuts down (the reader is told `UNAVAILABLE`).
async fn next_owed<T>(
    follower: &AwaitFollower,
    leadership: &mut tokio::sync::watch::Receiver<bool>,
    shutdown: &mut Shutdown,
    tx: &mpsc::Sender<Result<T, Status>>,
) -> Option<Option<Vec<(Awaited, bool)>>> {
    tokio::select! {
        owed = follower.owed() => Some(Some(owed)),
        r = leadership.changed() => r.is_ok().then_some(None),
        () = tx.closed() => None,
        () = shut_down(shutdown) => {
            tell_shutdown(tx, "watch again").await;
            None
        }
    }
}

/// `WatchLocations`: every location's answer, then each change, until the epoch changes.
pub fn watch_locations(
    state: Arc<StateServer>,
    handle: Arc<GatewayHandle>,
    locations: Vec<(IpAddr, String)>,
    mut shutdown: Shutdown,
) -> LocationsStream {
    let stream = spawn_stream(move |tx| async move {
        let epoch = state.epoch();
        let mut leadership = state.leadership();
        let follower = AwaitFollower::new(handle);
        let names: HashMap<IpAddr, String> = locations.iter().cloned().collect();
        follower.change(
            locations
                .iter()
                .map(|(ip, _)| Awaited::Location(*ip))
                .collect(),
            &[],
        );
        loop {
            if !still_current(&state, epoch, &tx).await {
                return;
            }
            let Some(owed) = next_owed(&follower, &mut leadership, &mut shutdown, &tx).await else {
                return;
            };
            let Some(owed) = owed else { continue };
            let locations = owed
                .into_iter()
                .filter_map(|(a, programmed)| match a {
                    Awaited::Location(ip) => Some(LocationProgrammed {
                        location: names.get(&ip).cloned().unwrap_or_else(|| ip.to_string()),
                        programmed,
                    }),
                    Awaited::Address { .. } => None,
                })
                .collect();
            if tx.send(Ok(LocationsState { locations })).await.is_err() {
                return;
            }
        }
    });
    Box::pin(stream)
}

/// What [`watch_addresses`] reads next: the client's message, or the answers owed.
enum Next {
    Client(Result<Option<AddressesWatch>, Status>),
    Owed(Option<Option<Vec<(Awaited, bool)>>>),
}

/// `WatchAddresses`: the answers of what `first` watches, then each change, while the client's
/// messages change the set; ends once the client ends its half, or like `WatchSession`.
pub fn watch_addresses(
    state: Arc<StateServer>,
    handle: Arc<GatewayHandle>,
    first: AddressesWatch,
    mut incoming: Streaming<AddressesWatch>,
    mut shutdown: Shutdown,
) -> Result<AddressesStream, Status> {
    let (watch, unwatch) = addresses_change(&first)?;
    let stream = spawn_stream(move |tx| async move {
        let epoch = state.epoch();
        let mut leadership = state.leadership();
        let follower = AwaitFollower::new(handle);
        follower.change(watch, &unwatch);
        loop {
            if !still_current(&state, epoch, &tx).await {
                return;
            }
            let next = tokio::select! {
                m = incoming.message() => Next::Client(m),
                owed = next_owed(&follower, &mut leadership, &mut shutdown, &tx) => Next::Owed(owed),
            };
            match next {
                Next::Client(Ok(Some(m))) => {
                    let change = same_stream(&m, &first.gateway, &first.writer)
                        .and_then(|()| addresses_change(&m));
                    match change {
                        Ok((watch, unwatch)) => follower.change(watch, &unwatch),
                        Err(status) => {
                            let _ = tx.send(Err(status)).await;
                            return;
                        }
                    }
                }
                // The client ended its half, or its stream broke: nothing more to answer.
                Next::Client(Ok(None) | Err(_)) | Next::Owed(None) => return,
                Next::Owed(Some(None)) => {}
                Next::Owed(Some(Some(owed))) => {
                    let addresses = owed
                        .into_iter()
                        .filter_map(|(a, programmed)| match a {
                            Awaited::Address {
                                location,
                                address,
                                service,
                            } => Some(AddressProgrammed {
                                query: Some(AddressQuery {
                                    location: location.to_string(),
                                    address: address.to_string(),
                                    service_id: service,
                                }),
                                programmed,
                            }),
                            Awaited::Location(_) => None,
                        })
                        .collect();
                    if tx.send(Ok(AddressesState { addresses })).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    Ok(Box::pin(stream))
}

/// `ServiceConditions`: each service's condition, the default one for a service the gateway does
/// not know.
pub fn service_conditions(
    handle: &GatewayHandle,
    req: &ServiceConditionsRequest,
) -> ServiceConditionsResponse {
    let g = handle.lock();
    let conditions = req
        .service_ids
        .iter()
        .map(|s| {
            g.condition_of(s)
                .map(condition_to_proto)
                .unwrap_or_default()
        })
        .collect();
    ServiceConditionsResponse { conditions }
}
