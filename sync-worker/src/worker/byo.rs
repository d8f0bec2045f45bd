//! Outbound services whose egress brings its NAT gateway (`ServiceChange.nat_gateway`, from the
//! pods' annotation `clb.azure.com/nat-gateway`). The NAT gateway lives in the gateway's NAT gateway
//! resource group (the gateways file's `natGatewayResourceGroup`, or the worker's
//! `--nat-gateway-resource-group`), and clb never creates, re-configures or deletes it:
//!
//! - create: GET it (missing: `NatGatewayNotFound`, not created), check that its SKU is
//!   `StandardV2` (else `NatGatewayNotStandardV2`), link it to the Service Gateway by setting
//!   `properties.serviceGateway` on what the GET returned (a read-modify-write: its public IPs,
//!   tags and every other field go back as they were; no PUT when it is linked already), then
//!   register the service with it. No public IP is created: the brought NAT gateway has its own.
//!   When the registration named another NAT gateway (the annotation changed while the state
//!   server was down: after a restart it knows only the egress's name and sends the creation
//!   again), that one is let go after the registration moved: unlinked when brought, deleted
//!   (with its public IP) when it is the one clb made.
//! - delete: unregister the service first (NRP refuses to unlink a NAT gateway a registration
//!   uses), then unlink it (`properties.serviceGateway` removed, nothing else); never DELETE. Which
//!   NAT gateway is read from the service's registration before unregistering (after a restart the
//!   server knows only the service's name from NRP); the change's name serves when the registration
//!   is already gone.
//!
//! Each refusal is its change's error (parked until the egress's desired state changes) with a
//! code of its own, counted by the state server in `clb_server_units_total{code}`.

use clb_nrp::wire::{GatewayService, NatGateway, ResourceId, ResourceKind, SubResource};
use clb_proto::v1::{self, ServiceChange};

use super::ctx::{UnitCtx, UnitError};
use super::registrar::Seat;
use super::services::{Progress, nat_gateway_name, registration};

/// The SKU a NAT gateway needs to be linked to a Service Gateway.
pub const STANDARD_V2: &str = "StandardV2";

/// A change refused for good with `code`: invalid whatever NRP holds (parked).
pub(super) fn refused(code: &'static str, message: String) -> UnitError {
    UnitError::Invalid { code, message }
}

/// `s` cut to 100 characters (a value quoted in a message).
pub(super) fn cut(s: &str) -> String {
    let mut c: String = s.chars().take(100).collect();
    if c.len() < s.len() {
        c.push('…');
    }
    c
}

/// The Service Gateway's ARM id, as NRP has it.
pub(crate) async fn gateway_id(ctx: &UnitCtx<'_>) -> Result<ResourceId, UnitError> {
    ctx.ensure_gateway().await?;
    let gw = ctx
        .read(|o| ctx.nrp().get_service_gateway(ctx.resource(), o))
        .await?;
    let id = gw.id.unwrap_or_default();
    ResourceId::parse(&id).map_err(|e| refused("InvalidResourceId", e.to_string()))
}

/// Whether `link` names the Service Gateway `gateway`.
fn links_to(link: Option<&SubResource>, gateway: &ResourceId) -> bool {
    link.is_some_and(|l| l.id.eq_ignore_ascii_case(&gateway.to_string()))
}

/// Links the NAT gateway `change.nat_gateway` and registers the service with it.
pub(crate) async fn create(
    ctx: &UnitCtx<'_>,
    change: &ServiceChange,
    progress: &Progress,
    seat: &Seat<'_>,
) -> Result<(), UnitError> {
    let nat = change.nat_gateway.as_str();
    let Some(rg) = ctx.nat_gateway_resource_group() else {
        return Err(refused(
            "NatGatewayResourceGroupNotConfigured",
            format!(
                "egress {:?} brings NAT gateway {:?}, but gateway {:?} has no NAT gateway \
                 resource group (natGatewayResourceGroup in the gateways file, or \
                 --nat-gateway-resource-group): bringing a NAT gateway is off there",
                cut(&change.service_id),
                cut(nat),
                cut(ctx.gateway)
            ),
        ));
    };
    let gateway = gateway_id(ctx).await?;
    if rg.eq_ignore_ascii_case(&gateway.resource_group)
        && nat.eq_ignore_ascii_case(&nat_gateway_name(&change.service_id))
    {
        return Err(refused(
            "NatGatewayNameReserved",
            format!(
                "egress {:?} brings NAT gateway {:?} in {rg:?}: that is the name of the NAT \
                 gateway clb creates (and deletes) for the egress in the gateway's resource group",
                cut(&change.service_id),
                cut(nat)
            ),
        ));
    }
    let mut body = match ctx
        .read(|o| ctx.nrp().get_nat_gateway_in(&rg, nat, o))
        .await
    {
        Ok(n) => n,
        Err(e) if e.is_not_found() => {
            tracing::warn!(egress = %change.service_id, nat_gateway = %nat, resource_group = %rg,
                "the NAT gateway the egress brings does not exist; it is not created");
            return Err(refused(
                "NatGatewayNotFound",
                format!(
                    "egress {:?} brings NAT gateway {:?}, which does not exist in resource group \
                     {rg:?}: clb does not create a brought NAT gateway",
                    cut(&change.service_id),
                    cut(nat)
                ),
            ));
        }
        Err(e) => return Err(e),
    };
    let sku = body.sku.as_ref().map_or("", |s| s.name.as_str());
    if !sku.eq_ignore_ascii_case(STANDARD_V2) {
        return Err(refused(
            "NatGatewayNotStandardV2",
            format!(
                "egress {:?} brings NAT gateway {:?} of SKU {:?}: only a {STANDARD_V2} NAT \
                 gateway can be linked to a Service Gateway",
                cut(&change.service_id),
                cut(nat),
                cut(sku)
            ),
        ));
    }
    if let Some(other) = body.properties.service_gateway.as_ref()
        && !links_to(Some(other), &gateway)
    {
        return Err(refused(
            "NatGatewayLinkedElsewhere",
            format!(
                "egress {:?} brings NAT gateway {:?}, which is linked to another Service Gateway \
                 ({:?}): clb does not take it over",
                cut(&change.service_id),
                cut(nat),
                cut(&other.id)
            ),
        ));
    }
    let nat_id = body.id.clone().unwrap_or_else(|| {
        ResourceId::new(&gateway.subscription, &rg, ResourceKind::NatGateway, nat).to_string()
    });
    if body.properties.service_gateway.is_none() {
        body.properties.service_gateway = Some(SubResource::new(gateway.to_string()));
        let linked = ctx
            .mutate(|o| ctx.nrp().put_nat_gateway_in(&rg, nat, &body, o))
            .await;
        progress.reached(v1::ServiceStep::Resources, &linked);
        linked?;
    }
    // Registered already with another NAT gateway (its pods' annotation changed while the state
    // server was down, which knew only the name after its restart): the registration moves to this
    // one, then the other is let go: unlinked when brought, deleted when clb's own.
    let previous = registered_nat(ctx, &change.service_id)
        .await?
        .flatten()
        .filter(|old| !old.to_string().eq_ignore_ascii_case(&nat_id));
    seat.register(registration(
        false,
        GatewayService::outbound(&change.service_id, &nat_id),
    ))
    .await?;
    match previous {
        Some(old) if is_own(&old, &gateway, &change.service_id) => {
            tracing::info!(egress = %change.service_id, "the egress now brings its NAT gateway: deleting the one clb made");
            let gone = |r: Result<(), UnitError>| match r {
                Err(e) if e.is_not_found() => Ok(()),
                r => r,
            };
            gone(
                ctx.mutate(|o| ctx.nrp().delete_nat_gateway(&old.name, o))
                    .await,
            )?;
            let pip = super::services::public_ip_name(&change.service_id);
            gone(ctx.mutate(|o| ctx.nrp().delete_public_ip(&pip, o)).await)
        }
        Some(old) => unlink(ctx, &gateway, &old).await,
        None => Ok(()),
    }
}

/// Whether `nat` is the NAT gateway clb creates for egress `name` (`natgw-{name}` in the
/// gateway's resource group).
fn is_own(nat: &ResourceId, gateway: &ResourceId, name: &str) -> bool {
    nat.resource_group
        .eq_ignore_ascii_case(&gateway.resource_group)
        && nat.name.eq_ignore_ascii_case(&nat_gateway_name(name))
}

/// The NAT gateway of the registration of service `name`: `None` when it is not registered,
/// `Some(None)` when the registration names none that parses.
async fn registered_nat(
    ctx: &UnitCtx<'_>,
    name: &str,
) -> Result<Option<Option<ResourceId>>, UnitError> {
    let services: Vec<GatewayService> = ctx
        .read(|o| ctx.nrp().list_services(ctx.resource(), o))
        .await?;
    Ok(services
        .iter()
        .find(|s| s.name.eq_ignore_ascii_case(name))
        .map(|s| {
            s.properties
                .public_nat_gateway_id
                .as_deref()
                .and_then(|id| ResourceId::parse(id).ok())
        }))
}

/// The NAT gateway an outbound service's deletion must unlink, if it is brought: the one its
/// registration names when that is not the NAT gateway clb creates for it (`natgw-{name}` in the
/// gateway's resource group) — what NRP holds wins, so an annotation changed while the state server
/// was down does not leave the registered one linked — else, with no registration left (a retry
/// after the unregistration), the change's (in the configured resource group). `None`: clb's own,
/// or nothing to unlink.
pub(crate) async fn brought(
    ctx: &UnitCtx<'_>,
    change: &ServiceChange,
) -> Result<Option<(ResourceId, ResourceId)>, UnitError> {
    let gateway = gateway_id(ctx).await?;
    let registered = registered_nat(ctx, &change.service_id).await?;
    let nat = match registered {
        Some(Some(id)) => Some(id).filter(|id| !is_own(id, &gateway, &change.service_id)),
        Some(None) => None,
        None if change.nat_gateway.is_empty() => None,
        None => ctx.nat_gateway_resource_group().map(|rg| {
            ResourceId::new(
                &gateway.subscription,
                rg,
                ResourceKind::NatGateway,
                &change.nat_gateway,
            )
        }),
    };
    Ok(nat.map(|id| (gateway, id)))
}

/// Removes the link of the brought NAT gateway `nat` to `gateway` (nothing else of it changes);
/// nothing when it is gone or not linked there.
pub(crate) async fn unlink(
    ctx: &UnitCtx<'_>,
    gateway: &ResourceId,
    nat: &ResourceId,
) -> Result<(), UnitError> {
    let mut body: NatGateway = match ctx
        .read(|o| {
            ctx.nrp()
                .get_nat_gateway_in(&nat.resource_group, &nat.name, o)
        })
        .await
    {
        Ok(n) => n,
        Err(e) if e.is_not_found() => {
            tracing::warn!(nat_gateway = %nat, "the brought NAT gateway is gone: nothing to unlink");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    if !links_to(body.properties.service_gateway.as_ref(), gateway) {
        return Ok(());
    }
    body.properties.service_gateway = None;
    ctx.mutate(|o| {
        ctx.nrp()
            .put_nat_gateway_in(&nat.resource_group, &nat.name, &body, o)
    })
    .await
    .map(drop)
}

/// Whether the registration's NAT gateway `nat` is a brought one: bringing is on for the gateway
/// and it is not the `natgw-{service}` clb creates for the egress.
fn brought_id(nat: &ResourceId, service: &str) -> bool {
    !nat.name.eq_ignore_ascii_case(&nat_gateway_name(service))
}

/// The outbound services among `services` whose registration names a brought NAT gateway that a
/// GET does not find (deleted out of band after it was linked): what an observe reports
/// (`NrpSnapshot.missing_nat_gateways`). One GET per such service, only where bringing a NAT
/// gateway is on. A NAT gateway that cannot be read for another reason is not listed (logged): the
/// read-back says nothing of it. Nothing is created or changed here.
pub(crate) async fn missing(ctx: &UnitCtx<'_>, services: &[GatewayService]) -> Vec<String> {
    if ctx.nat_gateway_resource_group().is_none() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for s in services {
        if !s
            .properties
            .service_type
            .as_ref()
            .is_some_and(|t| t.is_outbound())
        {
            continue;
        }
        let Some(nat) = s
            .properties
            .public_nat_gateway_id
            .as_deref()
            .and_then(|id| ResourceId::parse(id).ok())
            .filter(|id| brought_id(id, &s.name))
        else {
            continue;
        };
        match ctx
            .read(|o| {
                ctx.nrp()
                    .get_nat_gateway_in(&nat.resource_group, &nat.name, o)
            })
            .await
        {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {
                tracing::warn!(egress = %s.name, nat_gateway = %nat,
                    "the brought NAT gateway the egress is registered with is gone (deleted out of \
                     band); it is not created again");
                out.push(s.name.clone());
            }
            Err(e) => {
                tracing::warn!(egress = %s.name, nat_gateway = %nat, error = ?e,
                    "reading the brought NAT gateway back failed");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_nat_gateway_not_named_as_clbs_own_is_brought() {
        let id = |name: &str| ResourceId::new("s", "rg", ResourceKind::NatGateway, name);
        assert!(!brought_id(&id("natgw-eg"), "eg"));
        assert!(!brought_id(&id("NATGW-eg"), "eg"));
        assert!(brought_id(&id("natgw-shared-v2"), "eg"));
    }
}
