//! Wrappers of the workers' NRP client for fault scenarios the emulator does not produce by itself.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use clb_nrp::wire::{
    AddressLocation, GatewayService, LoadBalancer, NatGateway, PublicIpAddress, ServiceGateway,
    UpdateAddressLocationsRequest, UpdateServicesRequest,
};
use clb_nrp::{CallOptions, Nrp, NrpError};

/// Runs every call of `inner` in a task of its own, so that a call that was sent completes even if
/// the worker that sent it dies: as with ARM, where a request that has reached the service is
/// carried out whether or not its client is still there to read the answer. (The emulator's HTTP
/// server instead drops a request whose connection closes; killing a worker with a plain client
/// therefore cancels its calls.)
#[derive(Clone)]
pub struct Detached {
    inner: Arc<dyn Nrp>,
}

impl std::fmt::Debug for Detached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detached").finish_non_exhaustive()
    }
}

impl Detached {
    /// Wraps `inner`.
    pub fn wrap(inner: Arc<dyn Nrp>) -> Arc<dyn Nrp> {
        Arc::new(Self { inner })
    }

    async fn run<T, F, Fut>(&self, call: F) -> Result<T, NrpError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<dyn Nrp>) -> Fut,
        Fut: Future<Output = Result<T, NrpError>> + Send + 'static,
    {
        tokio::spawn(call(self.inner.clone()))
            .await
            .expect("detached NRP call")
    }
}

#[async_trait]
impl Nrp for Detached {
    fn remaining_subscription_writes(&self) -> Option<u32> {
        self.inner.remaining_subscription_writes()
    }

    async fn get_service_gateway(
        &self,
        gateway: &str,
        opts: CallOptions,
    ) -> Result<ServiceGateway, NrpError> {
        let g = gateway.to_owned();
        self.run(|n| async move { n.get_service_gateway(&g, opts).await })
            .await
    }

    async fn put_service_gateway(
        &self,
        gateway: &str,
        body: &ServiceGateway,
        opts: CallOptions,
    ) -> Result<ServiceGateway, NrpError> {
        let (g, b) = (gateway.to_owned(), body.clone());
        self.run(|n| async move { n.put_service_gateway(&g, &b, opts).await })
            .await
    }

    async fn list_services(
        &self,
        gateway: &str,
        opts: CallOptions,
    ) -> Result<Vec<GatewayService>, NrpError> {
        let g = gateway.to_owned();
        self.run(|n| async move { n.list_services(&g, opts).await })
            .await
    }

    async fn list_address_locations(
        &self,
        gateway: &str,
        opts: CallOptions,
    ) -> Result<Vec<AddressLocation>, NrpError> {
        let g = gateway.to_owned();
        self.run(|n| async move { n.list_address_locations(&g, opts).await })
            .await
    }

    async fn update_services(
        &self,
        gateway: &str,
        request: &UpdateServicesRequest,
        opts: CallOptions,
    ) -> Result<(), NrpError> {
        let (g, r) = (gateway.to_owned(), request.clone());
        self.run(|n| async move { n.update_services(&g, &r, opts).await })
            .await
    }

    async fn update_address_locations(
        &self,
        gateway: &str,
        request: &UpdateAddressLocationsRequest,
        opts: CallOptions,
    ) -> Result<(), NrpError> {
        let (g, r) = (gateway.to_owned(), request.clone());
        self.run(|n| async move { n.update_address_locations(&g, &r, opts).await })
            .await
    }

    async fn get_public_ip(
        &self,
        name: &str,
        opts: CallOptions,
    ) -> Result<PublicIpAddress, NrpError> {
        let x = name.to_owned();
        self.run(|n| async move { n.get_public_ip(&x, opts).await })
            .await
    }

    async fn find_public_ips(
        &self,
        names: &[String],
        opts: CallOptions,
    ) -> Result<Vec<PublicIpAddress>, NrpError> {
        let x = names.to_vec();
        self.run(|n| async move { n.find_public_ips(&x, opts).await })
            .await
    }

    async fn find_load_balancers(
        &self,
        names: &[String],
        opts: CallOptions,
    ) -> Result<Vec<LoadBalancer>, NrpError> {
        let x = names.to_vec();
        self.run(|n| async move { n.find_load_balancers(&x, opts).await })
            .await
    }

    async fn put_public_ip(
        &self,
        name: &str,
        body: &PublicIpAddress,
        opts: CallOptions,
    ) -> Result<PublicIpAddress, NrpError> {
        let (x, b) = (name.to_owned(), body.clone());
        self.run(|n| async move { n.put_public_ip(&x, &b, opts).await })
            .await
    }

    async fn delete_public_ip(&self, name: &str, opts: CallOptions) -> Result<(), NrpError> {
        let x = name.to_owned();
        self.run(|n| async move { n.delete_public_ip(&x, opts).await })
            .await
    }

    async fn get_load_balancer(
        &self,
        name: &str,
        opts: CallOptions,
    ) -> Result<LoadBalancer, NrpError> {
        let x = name.to_owned();
        self.run(|n| async move { n.get_load_balancer(&x, opts).await })
            .await
    }

    async fn put_load_balancer(
        &self,
        name: &str,
        body: &LoadBalancer,
        opts: CallOptions,
    ) -> Result<LoadBalancer, NrpError> {
        let (x, b) = (name.to_owned(), body.clone());
        self.run(|n| async move { n.put_load_balancer(&x, &b, opts).await })
            .await
    }

    async fn delete_load_balancer(&self, name: &str, opts: CallOptions) -> Result<(), NrpError> {
        let x = name.to_owned();
        self.run(|n| async move { n.delete_load_balancer(&x, opts).await })
            .await
    }

    async fn get_nat_gateway(&self, name: &str, opts: CallOptions) -> Result<NatGateway, NrpError> {
        let x = name.to_owned();
        self.run(|n| async move { n.get_nat_gateway(&x, opts).await })
            .await
    }

    async fn put_nat_gateway(
        &self,
        name: &str,
        body: &NatGateway,
        opts: CallOptions,
    ) -> Result<NatGateway, NrpError> {
        let (x, b) = (name.to_owned(), body.clone());
        self.run(|n| async move { n.put_nat_gateway(&x, &b, opts).await })
            .await
    }

    async fn delete_nat_gateway(&self, name: &str, opts: CallOptions) -> Result<(), NrpError> {
        let x = name.to_owned();
        self.run(|n| async move { n.delete_nat_gateway(&x, opts).await })
            .await
    }

    async fn get_public_ip_in(
        &self,
        resource_group: &str,
        name: &str,
        opts: CallOptions,
    ) -> Result<PublicIpAddress, NrpError> {
        let (g, x) = (resource_group.to_owned(), name.to_owned());
        self.run(|n| async move { n.get_public_ip_in(&g, &x, opts).await })
            .await
    }

    async fn find_public_ip_by_address(
        &self,
        address: &str,
        opts: CallOptions,
    ) -> Result<Option<PublicIpAddress>, NrpError> {
        let a = address.to_owned();
        self.run(|n| async move { n.find_public_ip_by_address(&a, opts).await })
            .await
    }

    async fn get_nat_gateway_in(
        &self,
        resource_group: &str,
        name: &str,
        opts: CallOptions,
    ) -> Result<NatGateway, NrpError> {
        let (g, x) = (resource_group.to_owned(), name.to_owned());
        self.run(|n| async move { n.get_nat_gateway_in(&g, &x, opts).await })
            .await
    }

    async fn put_nat_gateway_in(
        &self,
        resource_group: &str,
        name: &str,
        body: &NatGateway,
        opts: CallOptions,
    ) -> Result<NatGateway, NrpError> {
        let (g, x, b) = (resource_group.to_owned(), name.to_owned(), body.clone());
        self.run(|n| async move { n.put_nat_gateway_in(&g, &x, &b, opts).await })
            .await
    }
}
