//! [`Recorder`]: an NRP client wrapper that logs every service deletion a worker sends (the
//! emulator's removal log covers addresses only), so that a test can check that no still-desired
//! load balancer or NAT gateway was deleted.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use clb_embedded::Expected;
use clb_nrp::wire::{
    AddressLocation, GatewayService, LoadBalancer, NatGateway, PublicIpAddress, ServiceGateway,
    UpdateAddressLocationsRequest, UpdateServicesRequest,
};
use clb_nrp::{CallOptions, Nrp, NrpError};
use clb_nrp_emulator::Removal;
use clb_sync_worker::worker::{load_balancer_name, nat_gateway_name, public_ip_name};

/// The removals (of the emulator's log) that took away a service an address still has in
/// `desired`: each one removed a live backend.
pub fn spurious(removals: &[Removal], desired: &Expected) -> Vec<Removal> {
    removals
        .iter()
        .filter(|r| {
            r.removed_services
                .iter()
                .any(|s| desired.wants(&r.location, &r.address, s))
        })
        .cloned()
        .collect()
}

/// One service deletion sent to NRP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    /// Order of the deletion over the whole log, from 1.
    pub seq: u64,
    /// What was deleted: the service's name for `updateServices` (`isDelete`), or the resource
    /// name for a load balancer, NAT gateway or public IP DELETE.
    pub name: String,
    /// `unregister`, `load_balancer`, `nat_gateway` or `public_ip`.
    pub what: &'static str,
}

/// The log shared by every [`Recorder`] made from it.
#[derive(Debug, Clone, Default)]
pub struct DeletionLog {
    entries: Arc<Mutex<Vec<Deletion>>>,
}

impl DeletionLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    fn push(&self, what: &'static str, name: &str) {
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let seq = e.len() as u64 + 1;
        e.push(Deletion {
            seq,
            name: name.to_owned(),
            what,
        });
    }

    /// Every deletion so far, oldest first.
    pub fn entries(&self) -> Vec<Deletion> {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Deletions after position `from` of a resource of a service `desired` still holds (the
    /// service itself, its load balancer, NAT gateway or public IP), as `what name`.
    pub fn deleted_desired(&self, from: u64, desired: &Expected) -> Vec<String> {
        let names: BTreeSet<String> = desired
            .services()
            .iter()
            .flat_map(|s| {
                [
                    s.clone(),
                    load_balancer_name(s),
                    nat_gateway_name(s),
                    public_ip_name(s),
                ]
            })
            .collect();
        self.entries()
            .into_iter()
            .filter(|d| d.seq > from && names.contains(&d.name))
            .map(|d| format!("{} {}", d.what, d.name))
            .collect()
    }

    /// The number of deletions so far (a position to compare later entries with).
    pub fn len(&self) -> u64 {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len() as u64
    }

    /// Whether nothing was deleted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wraps `inner` so that its deletions go to this log (for `Harness::spawn_worker_with`).
    pub fn wrap(&self, inner: Arc<dyn Nrp>) -> Arc<dyn Nrp> {
        Arc::new(Recorder {
            inner,
            log: self.clone(),
        })
    }
}

/// An NRP client that logs deletions to a [`DeletionLog`] before sending them on (the log holds
/// what was sent, whether or not NRP accepted it).
pub struct Recorder {
    inner: Arc<dyn Nrp>,
    log: DeletionLog,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").finish_non_exhaustive()
    }
}

#[async_trait]
impl Nrp for Recorder {
    fn remaining_subscription_writes(&self) -> Option<u32> {
        self.inner.remaining_subscription_writes()
    }

    async fn get_service_gateway(
        &self,
        gateway: &str,
        opts: CallOptions,
    ) -> Result<ServiceGateway, NrpError> {
        self.inner.get_service_gateway(gateway, opts).await
    }

    async fn put_service_gateway(
        &self,
        gateway: &str,
        body: &ServiceGateway,
        opts: CallOptions,
    ) -> Result<ServiceGateway, NrpError> {
        self.inner.put_service_gateway(gateway, body, opts).await
    }

    async fn list_services(
        &self,
        gateway: &str,
        opts: CallOptions,
    ) -> Result<Vec<GatewayService>, NrpError> {
        self.inner.list_services(gateway, opts).await
    }

    async fn list_address_locations(
        &self,
        gateway: &str,
        opts: CallOptions,
    ) -> Result<Vec<AddressLocation>, NrpError> {
        self.inner.list_address_locations(gateway, opts).await
    }

    async fn update_services(
        &self,
        gateway: &str,
        request: &UpdateServicesRequest,
        opts: CallOptions,
    ) -> Result<(), NrpError> {
        for r in request.service_requests.iter().filter(|r| r.is_delete) {
            self.log.push("unregister", &r.service.name);
        }
        self.inner.update_services(gateway, request, opts).await
    }

    async fn update_address_locations(
        &self,
        gateway: &str,
        request: &UpdateAddressLocationsRequest,
        opts: CallOptions,
    ) -> Result<(), NrpError> {
        self.inner
            .update_address_locations(gateway, request, opts)
            .await
    }

    async fn get_public_ip(
        &self,
        name: &str,
        opts: CallOptions,
    ) -> Result<PublicIpAddress, NrpError> {
        self.inner.get_public_ip(name, opts).await
    }

    async fn put_public_ip(
        &self,
        name: &str,
        body: &PublicIpAddress,
        opts: CallOptions,
    ) -> Result<PublicIpAddress, NrpError> {
        self.inner.put_public_ip(name, body, opts).await
    }

    async fn delete_public_ip(&self, name: &str, opts: CallOptions) -> Result<(), NrpError> {
        self.log.push("public_ip", name);
        self.inner.delete_public_ip(name, opts).await
    }

    async fn find_public_ips(
        &self,
        names: &[String],
        opts: CallOptions,
    ) -> Result<Vec<PublicIpAddress>, NrpError> {
        self.inner.find_public_ips(names, opts).await
    }

    async fn get_load_balancer(
        &self,
        name: &str,
        opts: CallOptions,
    ) -> Result<LoadBalancer, NrpError> {
        self.inner.get_load_balancer(name, opts).await
    }

    async fn find_load_balancers(
        &self,
        names: &[String],
        opts: CallOptions,
    ) -> Result<Vec<LoadBalancer>, NrpError> {
        self.inner.find_load_balancers(names, opts).await
    }

    async fn put_load_balancer(
        &self,
        name: &str,
        body: &LoadBalancer,
        opts: CallOptions,
    ) -> Result<LoadBalancer, NrpError> {
        self.inner.put_load_balancer(name, body, opts).await
    }

    async fn delete_load_balancer(&self, name: &str, opts: CallOptions) -> Result<(), NrpError> {
        self.log.push("load_balancer", name);
        self.inner.delete_load_balancer(name, opts).await
    }

    async fn get_nat_gateway(&self, name: &str, opts: CallOptions) -> Result<NatGateway, NrpError> {
        self.inner.get_nat_gateway(name, opts).await
    }

    async fn put_nat_gateway(
        &self,
        name: &str,
        body: &NatGateway,
        opts: CallOptions,
    ) -> Result<NatGateway, NrpError> {
        self.inner.put_nat_gateway(name, body, opts).await
    }

    async fn delete_nat_gateway(&self, name: &str, opts: CallOptions) -> Result<(), NrpError> {
        self.log.push("nat_gateway", name);
        self.inner.delete_nat_gateway(name, opts).await
    }

    async fn get_public_ip_in(
        &self,
        rg: &str,
        n: &str,
        o: CallOptions,
    ) -> Result<PublicIpAddress, NrpError> {
        self.inner.get_public_ip_in(rg, n, o).await
    }
    async fn find_public_ip_by_address(
        &self,
        a: &str,
        o: CallOptions,
    ) -> Result<Option<PublicIpAddress>, NrpError> {
        self.inner.find_public_ip_by_address(a, o).await
    }
    async fn get_nat_gateway_in(
        &self,
        rg: &str,
        n: &str,
        o: CallOptions,
    ) -> Result<NatGateway, NrpError> {
        self.inner.get_nat_gateway_in(rg, n, o).await
    }
    async fn put_nat_gateway_in(
        &self,
        rg: &str,
        n: &str,
        b: &NatGateway,
        o: CallOptions,
    ) -> Result<NatGateway, NrpError> {
        self.inner.put_nat_gateway_in(rg, n, b, o).await
    }
}
