//! The `Admin` gRPC service: read-only status, the state of a location or service, and the
//! pending diff, for operators (`clbctl`) and tests.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use clb_proto::v1::admin_server::{Admin, AdminServer};
use clb_proto::v1::{
    DiffQuery, LocationQuery, LocationState, PendingDiffResponse, ServiceQuery, ServiceState,
    StatusRequest, StatusResponse, WriterStatus,
};
use tonic::{Request, Response, Status};

use super::convert::{
    STATUS_REFUSED_ITEMS, gateway_status, invalid_argument, location_change, location_state,
    refused_item, service_change, service_state_of, unknown_gateway, worker_status,
};
use crate::state::{Gateway, StateServer};
use clb_core::difftracker::identity::normalize_identity;
use clb_core::difftracker::ip::parse_ip;
use clb_core::difftracker::quote;
use clb_core::gateway::LbSpec;

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
            let status = g.status(now, STATUS_REFUSED_ITEMS);
            gateways.push(gateway_status(g.name(), status, &|session| {
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
        let status = g.location_status(ip).ok_or_else(|| {
            Status::not_found(format!(
                "location {ip} is neither desired nor in NRP in gateway {}",
                quote(g.name())
            ))
        })?;
        Ok(location_state(g.name(), &status))
    }

    #[tracing::instrument(name = "Admin.GetService", skip_all, fields(gateway = %q.gateway, id = %q.service_id))]
    fn get_service(&self, q: &ServiceQuery) -> Result<ServiceState, Status> {
        normalize_identity("service_id", &q.service_id)
            .map_err(|e| invalid_argument(&e.field, &e.value, &e.reason.to_string()))?;
        let handle = self
            .state
            .gateway(&q.gateway)
            .map_err(|e| unknown_gateway(&e))?;
        let g = handle.lock();
        let status = g.service_status(&q.service_id).ok_or_else(|| {
            Status::not_found(format!(
                "service {} is unknown in gateway {}",
                quote(&q.service_id),
                quote(g.name())
            ))
        })?;
        Ok(service_state_of(g.name(), status))
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
        let pending = handle.lock().pending(limit);
        Ok(PendingDiffResponse {
            gateway: handle.name().to_owned(),
            revision: pending.revision,
            services: pending
                .services
                .iter()
                .map(|(s, family)| service_change(s, &LbSpec::default(), *family))
                .collect(),
            locations: pending.locations.iter().map(location_change).collect(),
            truncated: pending.truncated,
            refused: pending.refused.into_iter().map(refused_item).collect(),
        })
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
