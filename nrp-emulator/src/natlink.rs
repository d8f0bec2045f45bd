//! The link of a NAT gateway to a Service Gateway (`properties.serviceGateway`), as Azure has it:
//! only a `StandardV2` NAT gateway may be linked, the link names a Service Gateway that exists, a
//! NAT gateway's SKU cannot change, and a NAT gateway that a Service Gateway's outbound service
//! uses cannot be unlinked (or linked elsewhere) until that service is unregistered: the order is
//! register after link, unlink after unregister. A registration naming a NAT gateway linked to
//! another Service Gateway is refused. An unlinked NAT gateway may still be registered (clb's own
//! `Standard` NAT gateways are not linked; Azure's rule for them is not published).

use crate::error::EmulatorError;
use crate::state::{NrpState, key_of, key_str};
use clb_nrp::wire::{NatGateway, ResourceId, ResourceKind};

/// The SKU a NAT gateway needs to be linked to a Service Gateway.
pub(crate) const STANDARD_V2: &str = "StandardV2";

impl NrpState {
    /// The rules of the link and the SKU for a PUT of `body` at `id`.
    pub(crate) fn check_nat_gateway_link(
        &self,
        id: &ResourceId,
        body: &NatGateway,
    ) -> Result<(), EmulatorError> {
        let old = self.nat_gateways.get(&key_of(id));
        let old_sku = old.and_then(|o| o.sku.as_ref()).map(|s| s.name.as_str());
        let sku = body.sku.as_ref().map(|s| s.name.as_str()).or(old_sku);
        if let (Some(old_sku), Some(new)) = (old_sku, body.sku.as_ref())
            && !old_sku.eq_ignore_ascii_case(&new.name)
        {
            return Err(EmulatorError::bad_request(
                "NatGatewaySkuCannotBeChanged",
                format!(
                    "NAT gateway '{}' has SKU '{old_sku}'; it cannot be changed to '{}'",
                    id.name, new.name
                ),
            ));
        }
        let link = body
            .properties
            .service_gateway
            .as_ref()
            .map(|s| s.id.as_str());
        if let Some(link) = link {
            if !sku.is_some_and(|s| s.eq_ignore_ascii_case(STANDARD_V2)) {
                return Err(EmulatorError::bad_request(
                    "NatGatewaySkuNotSupportedForServiceGateway",
                    format!(
                        "NAT gateway '{}' has SKU '{}': only a {STANDARD_V2} NAT gateway can be \
                         linked to a service gateway",
                        id.name,
                        sku.unwrap_or("Standard")
                    ),
                ));
            }
            match ResourceId::parse(link) {
                Ok(g) if g.kind == ResourceKind::ServiceGateway => {
                    if !self.gateways.contains_key(&key_of(&g)) {
                        return Err(EmulatorError::bad_request(
                            "InvalidResourceReference",
                            format!(
                                "NAT gateway '{}': service gateway '{link}' does not exist",
                                id.name
                            ),
                        ));
                    }
                }
                _ => {
                    return Err(EmulatorError::bad_request(
                        "InvalidResourceReference",
                        format!(
                            "NAT gateway '{}': serviceGateway '{link}' is not a service gateway id",
                            id.name
                        ),
                    ));
                }
            }
        }
        // A NAT gateway a registration uses keeps the link to that registration's gateway.
        for g in self.gateways.values() {
            let Some(service) = g.services.iter().find_map(|(name, s)| {
                s.nat_gateway_id
                    .as_deref()
                    .filter(|n| key_str(n) == key_of(id))
                    .map(|_| name)
            }) else {
                continue;
            };
            let still_linked = link.is_some_and(|l| key_str(l) == key_of(&g.id));
            let was_linked = old
                .and_then(|o| o.properties.service_gateway.as_ref())
                .is_some_and(|l| key_str(&l.id) == key_of(&g.id));
            if was_linked && !still_linked {
                return Err(EmulatorError::bad_request(
                    "NatGatewayInUseByServiceGateway",
                    format!(
                        "NAT gateway '{}' is used by service '{service}' of service gateway '{}': \
                         unregister the service before unlinking the NAT gateway",
                        id.name, g.id.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A registration of `service` on the gateway `gateway` may use the NAT gateway `nat` (an id)
    /// unless it is linked to another Service Gateway.
    pub(crate) fn check_nat_gateway_registration(
        &self,
        gateway: &ResourceId,
        service: &str,
        nat: &str,
    ) -> Result<(), EmulatorError> {
        let Some(n) = self.nat_gateways.get(&key_str(nat)) else {
            return Ok(());
        };
        match &n.properties.service_gateway {
            Some(link) if key_str(&link.id) != key_of(gateway) => Err(EmulatorError::bad_request(
                "NatGatewayLinkedToAnotherServiceGateway",
                format!(
                    "service '{service}': NAT gateway '{nat}' is linked to service gateway \
                         '{}', not to '{}'",
                    link.id, gateway.name
                ),
            )),
            _ => Ok(()),
        }
    }
}
