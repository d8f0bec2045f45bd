//! The `Writer` gRPC service: watchers and node agents change the desired state with batches
//! (`Apply`), streams of batches (`ApplyStream`) and resyncs of their whole scope (`Resync`).

use std::pin::Pin;
use std::sync::Arc;

use clb_proto::v1::writer_server::{Writer, WriterServer};
use clb_proto::v1::{
    AddressesWatch, ApplyRequest, ApplyResponse, LocationsRequest, ResyncHeader, ResyncRequest,
    ResyncResponse, ServiceConditionsRequest, ServiceConditionsResponse, SessionRequest, Update,
    WatchServicesRequest, resync_request::Part,
};
use futures::Stream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use super::awaits::{self, AddressesStream, LocationsStream};
use super::convert::{
    invalid_argument, item_error_of, resync_scope, resync_topology, unknown_gateway,
    update_from_proto,
};
use super::resync::{ResyncOutcome, Scope};
use super::session::{self, ServiceStatesStream, SessionStream};
use crate::auth::{Caller, Verb, WriteRights};
use crate::gate::Topology;
use crate::state::{GatewayHandle, StateServer};
use clb_core::gateway::update::{Item, Rights};

/// The responses of `ApplyStream`, one per request, in request order.
pub type ApplyResponseStream = Pin<Box<dyn Stream<Item = Result<ApplyResponse, Status>> + Send>>;

/// Implements `clb.v1.Writer` on the shared [`StateServer`].
#[derive(Debug, Clone)]
pub struct WriterService {
    state: Arc<StateServer>,
    shutdown: session::Shutdown,
}

impl WriterService {
    /// A Writer service changing the gateways of `state`.
    pub fn new(state: Arc<StateServer>) -> Self {
        state.start_tasks();
        Self {
            state,
            shutdown: None,
        }
    }

    /// Like [`WriterService::new`]; its streams (`WatchSession`, `WatchServices`) end with
    /// `UNAVAILABLE` once `shutdown` turns true, so that they do not hold up a graceful shutdown.
    pub fn with_shutdown(
        state: Arc<StateServer>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        state.start_tasks();
        Self {
            state,
            shutdown: Some(shutdown),
        }
    }

    /// The service wrapped for a tonic server.
    pub fn into_server(self) -> WriterServer<Self> {
        WriterServer::new(self)
    }
}

/// Checks the name of a writer.
fn check_writer(field: &str, writer: &str) -> Result<(), Status> {
    if writer.is_empty() {
        return Err(invalid_argument(
            field,
            writer,
            "must not be empty: name the writer, such as `watcher` or `node-agent/<node>`",
        ));
    }
    Ok(())
}

/// Refuses a batch larger than the server accepts.
fn check_batch_size(state: &StateServer, field: &str, len: usize) -> Result<(), Status> {
    let max = state.config().max_items_per_batch;
    if len > max {
        return Err(invalid_argument(
            field,
            &format!("{len} updates"),
            &format!("holds {len} updates; at most {max} are allowed in one batch"),
        ));
    }
    Ok(())
}

/// What `caller` may write to the gateway `gateway` names as `writer` (everything without
/// authorization). An unknown gateway is `NOT_FOUND`.
async fn write_rights(
    state: &StateServer,
    caller: Option<&Caller>,
    gateway: &str,
    writer: &str,
) -> Result<WriteRights, Status> {
    let Some(caller) = caller else {
        return Ok(WriteRights::Any);
    };
    let handle = state.gateway(gateway).map_err(|e| unknown_gateway(&e))?;
    caller.writer(handle.name(), writer).await
}

/// The rights of the core for what the caller may write.
fn core_rights(rights: &WriteRights) -> Rights {
    match rights {
        WriteRights::Any => Rights::Any,
        WriteRights::Node(node) => Rights::Node(node.clone()),
    }
}

/// The items of a batch or a view as the gateway takes them (mapped outside the gateway's lock).
fn items(updates: &[Update]) -> Vec<Item<'_>> {
    updates
        .iter()
        .enumerate()
        .map(|(i, u)| update_from_proto(i, u))
        .collect()
}

/// Validates and applies one batch under one lock of its gateway.
fn apply_batch(
    state: &StateServer,
    req: &ApplyRequest,
    rights: &WriteRights,
) -> Result<ApplyResponse, Status> {
    let span = tracing::info_span!(
        "apply_batch",
        gateway = %req.gateway,
        writer = %req.writer,
        batch_id = req.batch_id,
        updates = req.updates.len(),
        applied = tracing::field::Empty,
        rejected = tracing::field::Empty,
    );
    let _entered = span.enter();
    super::require_leader(state)?;
    check_writer("writer", &req.writer)?;
    check_batch_size(state, "updates", req.updates.len())?;
    let handle = state
        .gateway(&req.gateway)
        .map_err(|e| unknown_gateway(&e))?;
    let link = clb_telemetry::current_span_link();
    if req.dry_run {
        return Ok(dry_run(state, &handle, req, rights));
    }
    let items = items(&req.updates);
    let rights = core_rights(rights);
    let (revision, outcome, session) = {
        let mut gateway = handle.lock();
        let (outcome, applied) = gateway.apply(&req.writer, &rights, &items);
        gateway.link_applied(link.as_ref(), &req.updates, &applied);
        let session = session::session(state, &gateway, &req.writer);
        (gateway.revision(), outcome, session)
    };
    drop(items);
    let applied = outcome.applied;
    let rejected: Vec<_> = outcome.rejected.into_iter().map(item_error_of).collect();
    state.metrics().rejected(rejected.len() as u64);
    span.record("applied", applied);
    span.record("rejected", rejected.len());
    if applied > 0 {
        handle.changed();
    }
    if !rejected.is_empty() {
        tracing::debug!(first = ?rejected[0], "items rejected");
    }
    Ok(ApplyResponse {
        batch_id: req.batch_id,
        revision,
        applied,
        rejected,
        session: Some(session),
    })
}

/// A batch with `dry_run`: validated in order against a copy of the gateway's desired state, so
/// the answer is what applying it now would answer; the gateway itself is not changed (no revision,
/// no work, no write counts). The copy costs one clone of the tracker, under the gateway's lock.
fn dry_run(
    state: &StateServer,
    handle: &GatewayHandle,
    req: &ApplyRequest,
    rights: &WriteRights,
) -> ApplyResponse {
    let items = items(&req.updates);
    let gateway = handle.lock();
    let outcome = gateway.dry_run(&core_rights(rights), &items);
    let applied = outcome.applied;
    let rejected: Vec<_> = outcome.rejected.into_iter().map(item_error_of).collect();
    ApplyResponse {
        batch_id: req.batch_id,
        revision: gateway.revision(),
        applied,
        rejected,
        session: Some(session::session(state, &gateway, &req.writer)),
    }
}

/// Node binding of a resync ([`clb_core::gateway::GatewayCore::authorize_node_resync`]): a
/// refusal is `PERMISSION_DENIED` naming the field at fault, `UNAVAILABLE` while the topology is
/// not declared yet (the agent retries within 2 s).
fn check_node_scope(handle: &GatewayHandle, node: &str, scope: &Scope) -> Result<(), Status> {
    let refusal = match handle.lock().authorize_node_resync(node, scope) {
        Ok(()) => return Ok(()),
        Err(refusal) => refusal,
    };
    if refusal.is_transient() {
        return Err(Status::unavailable(refusal.to_string()));
    }
    let (field, value) = match refusal.location() {
        Some(location) => ("header.scope.location", location.to_string()),
        None => ("header.scope", scope.to_string()),
    };
    Err(Status::permission_denied(format!(
        "{field} = {}: {refusal}",
        clb_core::difftracker::quote(&value)
    )))
}

/// A resync read to its clean end.
struct ResyncRead {
    handle: Arc<GatewayHandle>,
    writer: String,
    scope: Scope,
    topology: Option<Topology>,
    /// The header's `resync_sequence`, echoed in the writer's session.
    sequence: u64,
    view: Vec<Update>,
}

/// Reads a resync stream to its clean end and returns the header's gateway, writer, scope and
/// topology, and the whole view. Any error (a broken stream included) means nothing is applied.
async fn read_resync(
    state: &StateServer,
    caller: Option<&Caller>,
    stream: &mut Streaming<ResyncRequest>,
) -> Result<ResyncRead, Status> {
    super::require_leader(state)?;
    let header: ResyncHeader = match stream.message().await? {
        Some(ResyncRequest {
            part: Some(Part::Header(h)),
        }) => h,
        Some(_) => {
            return Err(invalid_argument(
                "header",
                "",
                "the first message of a resync must be its header",
            ));
        }
        None => {
            return Err(invalid_argument(
                "header",
                "",
                "the resync stream ended before its header",
            ));
        }
    };
    let span = tracing::Span::current();
    span.record("gateway", header.gateway.as_str());
    span.record("writer", header.writer.as_str());
    check_writer("header.writer", &header.writer)?;
    let scope = resync_scope(header.scope.as_ref())
        .map_err(|e| invalid_argument(&e.field, &e.value, &e.reason))?;
    let topology = resync_topology(header.topology.as_ref(), &scope)
        .map_err(|e| invalid_argument(&e.field, &e.value, &e.reason))?;
    let handle = state
        .gateway(&header.gateway)
        .map_err(|e| unknown_gateway(&e))?;
    if let Some(caller) = caller
        && let WriteRights::Node(node) = caller.writer(handle.name(), &header.writer).await?
    {
        check_node_scope(&handle, &node, &scope)?;
    }
    let mut view = Vec::new();
    let mut chunks = 0usize;
    while let Some(msg) = stream.message().await? {
        match msg.part {
            Some(Part::Chunk(chunk)) => {
                check_batch_size(
                    state,
                    &format!("chunk[{chunks}].updates"),
                    chunk.updates.len(),
                )?;
                chunks += 1;
                view.extend(chunk.updates);
            }
            Some(Part::Header(_)) => {
                return Err(invalid_argument(
                    "header",
                    "",
                    "a resync has exactly one header, as its first message",
                ));
            }
            None => {
                return Err(invalid_argument(
                    "part",
                    "",
                    "neither header nor chunk is set",
                ));
            }
        }
    }
    Ok(ResyncRead {
        handle,
        writer: header.writer,
        scope,
        topology,
        sequence: header.resync_sequence,
        view,
    })
}

impl WriterService {
    #[tracing::instrument(name = "Writer.Apply", skip_all)]
    async fn apply(
        &self,
        caller: Option<&Caller>,
        req: &ApplyRequest,
    ) -> Result<ApplyResponse, Status> {
        let rights = write_rights(&self.state, caller, &req.gateway, &req.writer).await?;
        apply_batch(&self.state, req, &rights)
    }

    fn apply_stream(
        &self,
        caller: Option<Caller>,
        incoming: Streaming<ApplyRequest>,
    ) -> ApplyResponseStream {
        let span = tracing::info_span!("Writer.ApplyStream");
        let state = self.state.clone();
        // Each request is answered before the next is read: responses keep request order, and a
        // slow reader slows the writer down. A request-level error ends the stream.
        let stream = futures::stream::unfold(
            (incoming, state, caller, span, false),
            |(mut incoming, state, caller, span, done)| async move {
                if done {
                    return None;
                }
                let next = incoming.message().instrument(span.clone()).await;
                match next {
                    Ok(Some(req)) => {
                        // Reviews are cached: a stream of batches costs one review per TTL.
                        let rights =
                            write_rights(&state, caller.as_ref(), &req.gateway, &req.writer)
                                .instrument(span.clone())
                                .await;
                        let result = rights.and_then(|rights| {
                            span.in_scope(|| apply_batch(&state, &req, &rights))
                        });
                        let done = result.is_err();
                        Some((result, (incoming, state, caller, span, done)))
                    }
                    Ok(None) => None,
                    Err(status) => {
                        span.in_scope(|| tracing::debug!(%status, "apply stream broke"));
                        None
                    }
                }
            },
        );
        Box::pin(stream)
    }

    #[tracing::instrument(
        name = "Writer.Resync",
        skip_all,
        fields(gateway, writer, updates, applied, removed, rejected, handed_over)
    )]
    async fn resync(
        &self,
        caller: Option<Caller>,
        mut incoming: Streaming<ResyncRequest>,
    ) -> Result<ResyncResponse, Status> {
        let ResyncRead {
            handle,
            writer,
            scope,
            topology,
            sequence,
            view,
        } = match read_resync(&self.state, caller.as_ref(), &mut incoming).await {
            Ok(read) => read,
            Err(status) => {
                tracing::info!(%status, "resync abandoned; nothing changed");
                return Err(status);
            }
        };
        // tonic ends a request stream cleanly both on the client's half-close and when the client
        // cancels the call (RST_STREAM CANCEL: `Streaming` maps a cancelled request body to its
        // end), so the end of the stream alone does not prove a complete view. Yielding once lets
        // the HTTP/2 server check for a reset stream (it does whenever the handler is pending),
        // which drops this handler before anything is applied: a cancelled resync changes nothing.
        tokio::task::yield_now().await;
        // A replica that stepped down meanwhile applies nothing: the writer resyncs with the leader.
        super::require_leader(&self.state)?;
        let link = clb_telemetry::current_span_link();
        let items = items(&view);
        let (revision, outcome, session) = {
            let mut gateway = handle.lock();
            let done = gateway.resync(
                &writer,
                &scope,
                topology.as_ref(),
                &items,
                sequence,
                std::time::Instant::now(),
                crate::state::unix_ms(std::time::SystemTime::now()),
            );
            gateway.link_applied(link.as_ref(), &view, &done.applied);
            gateway.log_gate_notes();
            // A resync that changed who owns the pods of some locations dropped the old owner's
            // pods there; removals wait for the new owner's resync (see `gateway/gate.rs`).
            if !done.handover.drop_pods_at.is_empty() {
                tracing::info!(
                    gateway = %gateway.name(),
                    writer,
                    locations = done.handover.drop_pods_at.len(),
                    pods = done.dropped,
                    asked = ?done.handover.resync_asked,
                    "pods changed owner: the old owner's pods left the desired state"
                );
            }
            tracing::Span::current().record("handed_over", done.dropped);
            (
                gateway.revision(),
                ResyncOutcome::from(done.outcome),
                session::session(&self.state, &gateway, &writer),
            )
        };
        drop(items);
        self.state.metrics().rejected(outcome.rejected.len() as u64);
        handle.changed();
        let span = tracing::Span::current();
        span.record("updates", view.len());
        span.record("applied", outcome.applied);
        span.record("removed", outcome.removed);
        span.record("rejected", outcome.rejected.len());
        tracing::info!(%scope, "resync completed");
        Ok(ResyncResponse {
            revision,
            applied: outcome.applied,
            removed: outcome.removed,
            rejected: outcome.rejected,
            session: Some(session),
        })
    }

    /// The gateway of a session or state request, once the caller may follow it: `WatchSession`
    /// as the writer's writes are authorized, the others by verb `write`.
    async fn follow(
        &self,
        caller: Option<&Caller>,
        gateway: &str,
        writer: &str,
        verb: Option<Verb>,
    ) -> Result<Arc<GatewayHandle>, Status> {
        super::require_leader(&self.state)?;
        check_writer("writer", writer)?;
        let handle = self
            .state
            .gateway(gateway)
            .map_err(|e| unknown_gateway(&e))?;
        if let Some(caller) = caller {
            match verb {
                Some(verb) => caller.require(verb, handle.name()).await?,
                None => {
                    caller.writer(handle.name(), writer).await?;
                }
            }
        }
        Ok(handle)
    }
}

#[tonic::async_trait]
impl Writer for WriterService {
    async fn apply(
        &self,
        request: Request<ApplyRequest>,
    ) -> Result<Response<ApplyResponse>, Status> {
        self.state.metrics().update_rpc("apply");
        let caller = Caller::of(request.extensions());
        WriterService::apply(self, caller, request.get_ref())
            .await
            .map(Response::new)
    }

    type ApplyStreamStream = ApplyResponseStream;

    async fn apply_stream(
        &self,
        request: Request<Streaming<ApplyRequest>>,
    ) -> Result<Response<Self::ApplyStreamStream>, Status> {
        self.state.metrics().update_rpc("apply_stream");
        let caller = Caller::of(request.extensions()).cloned();
        Ok(Response::new(WriterService::apply_stream(
            self,
            caller,
            request.into_inner(),
        )))
    }

    async fn resync(
        &self,
        request: Request<Streaming<ResyncRequest>>,
    ) -> Result<Response<ResyncResponse>, Status> {
        self.state.metrics().update_rpc("resync");
        let caller = Caller::of(request.extensions()).cloned();
        WriterService::resync(self, caller, request.into_inner())
            .await
            .map(Response::new)
    }

    type WatchSessionStream = SessionStream;

    async fn watch_session(
        &self,
        request: Request<SessionRequest>,
    ) -> Result<Response<SessionStream>, Status> {
        self.state.metrics().update_rpc("watch_session");
        let req = request.get_ref();
        let caller = Caller::of(request.extensions());
        let handle = self.follow(caller, &req.gateway, &req.writer, None).await?;
        Ok(Response::new(session::watch_session(
            self.state.clone(),
            handle,
            req.writer.clone(),
            self.shutdown.clone(),
        )))
    }

    type WatchServicesStream = ServiceStatesStream;

    async fn watch_services(
        &self,
        request: Request<WatchServicesRequest>,
    ) -> Result<Response<ServiceStatesStream>, Status> {
        self.state.metrics().update_rpc("watch_services");
        let req = request.get_ref();
        let caller = Caller::of(request.extensions());
        let handle = self
            .follow(caller, &req.gateway, &req.writer, Some(Verb::Write))
            .await?;
        Ok(Response::new(session::watch_services(
            self.state.clone(),
            handle,
            req.writer.clone(),
            req.include_outbound,
            self.shutdown.clone(),
        )))
    }

    type WatchLocationsStream = LocationsStream;

    async fn watch_locations(
        &self,
        request: Request<LocationsRequest>,
    ) -> Result<Response<LocationsStream>, Status> {
        self.state.metrics().update_rpc("watch_locations");
        let req = request.get_ref();
        let caller = Caller::of(request.extensions());
        let locations = awaits::locations(req)?;
        let handle = self
            .follow(caller, &req.gateway, &req.writer, Some(Verb::Write))
            .await?;
        Ok(Response::new(awaits::watch_locations(
            self.state.clone(),
            handle,
            locations,
            self.shutdown.clone(),
        )))
    }

    type WatchAddressesStream = AddressesStream;

    async fn watch_addresses(
        &self,
        request: Request<Streaming<AddressesWatch>>,
    ) -> Result<Response<AddressesStream>, Status> {
        self.state.metrics().update_rpc("watch_addresses");
        let caller = Caller::of(request.extensions()).cloned();
        let mut incoming = request.into_inner();
        let Some(first) = incoming.message().await? else {
            return Err(invalid_argument(
                "writer",
                "",
                "the stream ended before its first message, which names the writer",
            ));
        };
        let handle = self
            .follow(
                caller.as_ref(),
                &first.gateway,
                &first.writer,
                Some(Verb::Write),
            )
            .await?;
        awaits::watch_addresses(
            self.state.clone(),
            handle,
            first,
            incoming,
            self.shutdown.clone(),
        )
        .map(Response::new)
    }

    async fn service_conditions(
        &self,
        request: Request<ServiceConditionsRequest>,
    ) -> Result<Response<ServiceConditionsResponse>, Status> {
        self.state.metrics().update_rpc("service_conditions");
        let req = request.get_ref();
        let caller = Caller::of(request.extensions());
        let handle = self
            .follow(caller, &req.gateway, &req.writer, Some(Verb::Write))
            .await?;
        Ok(Response::new(awaits::service_conditions(&handle, req)))
    }
}
