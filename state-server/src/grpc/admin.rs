//! The `Admin` gRPC service: read-only status, the state of a location or service, and the
//! pending diff, for operators (`clbctl`) and tests.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use clb_proto::v1::admin_server::{Admin, AdminServer};
use clb_proto::v1::{
    DiffQuery, LocationQuery, LocationState, PendingDiffResponse, ProgrammingReason,
    ServiceCondition, ServiceQuery, ServiceState, StatusRequest, StatusResponse, WriterStatus,
};
use tonic::{Request, Response, Status};

use super::convert::{
    gateway_status, invalid_argument, location_change, location_state, refused_item,
    service_change, service_state, unknown_gateway, worker_status,
};
use crate::state::{Gateway, StateServer};
use clb_core::difftracker::identity::normalize_identity;
use clb_core::difftracker::ip::parse_ip;
use clb_core::difftracker::quote;
use clb_core::difftracker::view::ServiceView;
use clb_core::gateway::LbSpec;
use clb_core::gateway::condition::{Condition, ConditionReason};

/// Entries of each `PendingDiff` list when the query leaves the limit to the server.
pub const DEFAULT_DIFF_LIMIT: usize = 1000;

/// Implements `clb.v1.Admin` on the shared [`StateServer`]. Never changes anything.
#[derive(Debug, Clone)]
pub struct AdminService {
    state: Arc<StateServer>,
}

impl AdminService {
    /// An Admin service reading the gateways of `state`.
    pub fn new(state: Arc<StateServer>) -> Self {
        Self { state }
    }

    /// The service wrapped for a tonic server.
    pub fn into_server(self) -> AdminServer<Self> {
        AdminServer::new(self)
    }
}

/// Adds a gateway's writers (and the expected writers it still waits for) to the server-wide
/// table: counts are summed over gateways, the latest resync wins.
fn merge_writers(g: &Gateway, writers: &mut BTreeMap<String, WriterStatus>) {
    let pending = g.pending_writers();
    for writer in &pending {
        writers
            .entry(writer.clone())
            .or_insert_with(|| WriterStatus {
                writer: writer.clone(),
                ..WriterStatus::default()
            });
    }
    for (writer, record) in g.writers() {
        let w = writers
            .entry(writer.clone())
            .or_insert_with(|| WriterStatus {
                writer: writer.clone(),
                ..WriterStatus::default()
            });
        w.updates_applied += record.updates_applied;
        w.items_rejected += record.items_rejected;
        if let Some(at) = record.last_resync_unix_ms {
            w.last_resync_unix_ms = w.last_resync_unix_ms.max(at);
        }
    }
}

impl AdminService {
    #[tracing::instrument(name = "Admin.Status", skip_all)]
    fn status(&self) -> StatusResponse {
        let now = Instant::now();
        let mut gateways = Vec::new();
        let mut writers = BTreeMap::new();
        for handle in self.state.gateways() {
            let g = handle.lock();
            gateways.push(gateway_status(&g, now, &|session| {
                self.state.worker_id(session)
            }));
            merge_writers(&g, &mut writers);
        }
        let workers = self
            .state
            .workers()
            .into_iter()
            .map(worker_status)
            .collect();
        StatusResponse {
            server_id: self.state.config().server_id.clone(),
            gateways,
            workers,
            writers: writers.into_values().collect(),
        }
    }

    #[tracing::instrument(name = "Admin.GetLocation", skip_all, fields(gateway = %q.gateway, location = %q.location))]
    fn get_location(&self, q: &LocationQuery) -> Result<LocationState, Status> {
        let ip = parse_ip("location", &q.location)
            .map_err(|e| invalid_argument(&e.field, &e.value, &e.reason.to_string()))?;
        let handle = self
            .state
            .gateway(&q.gateway)
            .map_err(|e| unknown_gateway(&e))?;
        let g = handle.lock();
        let view = g.tracker().location_view(ip).ok_or_else(|| {
            Status::not_found(format!(
                "location {ip} is neither desired nor in NRP in gateway {}",
                quote(g.name())
            ))
        })?;
        Ok(location_state(g.name(), &view, |a| {
            g.dispatch().refused_address(view.location, a)
        }))
    }

    #[tracing::instrument(name = "Admin.GetService", skip_all, fields(gateway = %q.gateway, id = %q.id))]
    fn get_service(&self, q: &ServiceQuery) -> Result<ServiceState, Status> {
        normalize_identity("id", &q.id)
            .map_err(|e| invalid_argument(&e.field, &e.value, &e.reason.to_string()))?;
        let handle = self
            .state
            .gateway(&q.gateway)
            .map_err(|e| unknown_gateway(&e))?;
        let g = handle.lock();
        let view = g.tracker().service_view(&q.id).ok_or_else(|| {
            Status::not_found(format!(
                "service {} is unknown in gateway {}",
                quote(&q.id),
                quote(g.name())
            ))
        })?;
        let mut state = service_state(&g, &view);
        state.condition = Some(service_condition(&g, &view, &state.frontend_ip));
        nat_gateway_of(&g, &mut state);
        Ok(state)
    }

    #[tracing::instrument(name = "Admin.PendingDiff", skip_all, fields(gateway = %q.gateway, limit = q.limit))]
    fn pending_diff(&self, q: &DiffQuery) -> Result<PendingDiffResponse, Status> {
        let limit = match q.limit {
            0 => DEFAULT_DIFF_LIMIT,
            n => n as usize,
        };
        let handle = self
            .state
            .gateway(&q.gateway)
            .map_err(|e| unknown_gateway(&e))?;
        let g = handle.lock();
        let diff = g.tracker().pending_diff();
        let truncated = diff.services.len() > limit || diff.locations.len() > limit;
        Ok(PendingDiffResponse {
            gateway: g.name().to_owned(),
            revision: g.tracker().revision(),
            services: diff
                .services
                .iter()
                .take(limit)
                .map(|s| service_change(s, &LbSpec::default(), g.tracker().service_family(&s.name)))
                .collect(),
            locations: diff
                .locations
                .iter()
                .take(limit)
                .map(location_change)
                .collect(),
            truncated,
            refused: g
                .dispatch()
                .refused_items(limit)
                .into_iter()
                .map(refused_item)
                .collect(),
        })
    }
}

/// The programming condition of a service (`ServiceState.condition`): the core's
/// [`clb_core::gateway::condition::Condition`] as proto.
pub(crate) fn service_condition(
    g: &Gateway,
    view: &ServiceView,
    frontend_ip: &str,
) -> ServiceCondition {
    condition_to_proto(g.service_condition(view, frontend_ip))
}

/// The brought NAT gateway of an outbound service's `state` and whether the last read-back found
/// it missing (`GatewayCore::nat_gateway_missing`).
pub(crate) fn nat_gateway_of(g: &Gateway, state: &mut clb_proto::v1::ServiceState) {
    if state.kind == clb_proto::v1::ServiceKind::Outbound as i32 {
        state.nat_gateway = g
            .tracker()
            .egress_nat_gateway(&state.id)
            .unwrap_or_default()
            .to_owned();
        state.nat_gateway_missing = g.nat_gateway_missing(&state.id);
    }
}

/// A condition as proto.
pub(crate) fn condition_to_proto(c: Condition) -> ServiceCondition {
    let reason = match c.reason {
        ConditionReason::Pending => ProgrammingReason::Pending,
        ConditionReason::Programmed => ProgrammingReason::Programmed,
        ConditionReason::Removed => ProgrammingReason::Removed,
        ConditionReason::Rejected => ProgrammingReason::Rejected,
        ConditionReason::Throttled => ProgrammingReason::Throttled,
        ConditionReason::Retrying => ProgrammingReason::Retrying,
        ConditionReason::HeldBack => ProgrammingReason::HeldBack,
    };
    ServiceCondition {
        reason: reason as i32,
        message: c.message,
        error_code: c.error_code,
        error_message: c.error_message,
        location: c.location,
        held_for: c.held_for,
        held_for_writer: c.held_for_writer,
        error_at_unix_ms: c.error_at_unix_ms,
        address: c.address,
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        super::require_leader(&self.state)?;
        Ok(Response::new(AdminService::status(self)))
    }

    async fn get_location(
        &self,
        request: Request<LocationQuery>,
    ) -> Result<Response<LocationState>, Status> {
        super::require_leader(&self.state)?;
        AdminService::get_location(self, request.get_ref()).map(Response::new)
    }

    async fn get_service(
        &self,
        request: Request<ServiceQuery>,
    ) -> Result<Response<ServiceState>, Status> {
        super::require_leader(&self.state)?;
        AdminService::get_service(self, request.get_ref()).map(Response::new)
    }

    async fn pending_diff(
        &self,
        request: Request<DiffQuery>,
    ) -> Result<Response<PendingDiffResponse>, Status> {
        super::require_leader(&self.state)?;
        AdminService::pending_diff(self, request.get_ref()).map(Response::new)
    }
}
