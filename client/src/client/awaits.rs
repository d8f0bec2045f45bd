//! What a writer waits for, pushed by the server: whether NRP has every address desired at some
//! locations (`Writer.WatchLocations`), whether it has some addresses with their services
//! (`Writer.WatchAddresses`, a set the writer changes as it goes), and why services are not
//! programmed (`Writer.ServiceConditions`). Each needs verb `write`.

use clb_proto::v1::{
    AddressQuery, AddressesState, AddressesWatch, LocationsRequest, LocationsState,
    ServiceCondition, ServiceConditionsRequest,
};
use futures::{Stream, StreamExt};
use tracing::Instrument as _;

use super::{ClientError, Writer};

impl Writer {
    /// `Writer.WatchLocations`: per location, whether NRP has every address desired there; the
    /// first message answers every location, later ones the changes.
    pub async fn watch_locations(
        &mut self,
        locations: Vec<String>,
    ) -> Result<tonic::Streaming<LocationsState>, ClientError> {
        const RPC: &str = "Writer.WatchLocations";
        let request = LocationsRequest {
            gateway: self.gateway.clone(),
            writer: self.name.clone(),
            locations,
        };
        let span = self.call_span(RPC, 0);
        Ok(self
            .client
            .watch_locations(request)
            .instrument(span)
            .await
            .map_err(ClientError::rpc(RPC))?
            .into_inner())
    }

    /// `Writer.WatchAddresses`: watches `watch` at once, then what each message of `changes` adds
    /// and takes out (its `gateway` and `writer` left empty); the server answers each address
    /// watched, then each change of an answer. The stream ends when `changes` ends.
    pub async fn watch_addresses(
        &mut self,
        watch: Vec<AddressQuery>,
        changes: impl Stream<Item = AddressesWatch> + Send + 'static,
    ) -> Result<tonic::Streaming<AddressesState>, ClientError> {
        const RPC: &str = "Writer.WatchAddresses";
        let first = AddressesWatch {
            gateway: self.gateway.clone(),
            writer: self.name.clone(),
            watch,
            unwatch: Vec::new(),
        };
        let span = self.call_span(RPC, 0);
        Ok(self
            .client
            .watch_addresses(futures::stream::iter([first]).chain(changes))
            .instrument(span)
            .await
            .map_err(ClientError::rpc(RPC))?
            .into_inner())
    }

    /// `Writer.ServiceConditions`: per service, its programming condition (the default one for a
    /// service the gateway does not know).
    pub async fn service_conditions(
        &mut self,
        services: Vec<String>,
    ) -> Result<Vec<ServiceCondition>, ClientError> {
        const RPC: &str = "Writer.ServiceConditions";
        let request = ServiceConditionsRequest {
            gateway: self.gateway.clone(),
            writer: self.name.clone(),
            service_ids: services,
        };
        let span = self.call_span(RPC, 0);
        Ok(self
            .client
            .service_conditions(request)
            .instrument(span)
            .await
            .map_err(ClientError::rpc(RPC))?
            .into_inner()
            .conditions)
    }
}
