//! Service work: each `ServiceChange` is a saga of idempotent steps (PUT is create-or-update, DELETE
//! of a missing resource is success), so that a saga interrupted anywhere can simply run again.
//!
//! - inbound create: public IP `pip-{name}` of the change's IP family (`publicIPAddressVersion`
//!   `IPv6` for an IPv6 service, else `IPv4`; a dual-stack Service is two services, the secondary
//!   named `{uid}-v4` / `{uid}-v6`, so its resources are `pip-{uid}-v6`, `lb-{uid}-v6`), load balancer `lb-{name}` (frontend on that IP, backend
//!   pool, one rule per port/protocol whose backend port is the port's target port), register the service with its backend pool; the public IP's
//!   address (NRP allocates it) goes back to the server as the service's frontend. The same saga
//!   re-programs the rules of an existing load balancer whose ports changed (PUT replaces them).
//!   The rules and the public IP follow the change's settings (idle timeout, TCP reset, load
//!   distribution; a `StandardV2` public IP with its DNS label, or a brought public IP linked
//!   instead, clb's own then deleted): see [`super::inbound`];
//! - outbound create: public IP `pip-{name}` (IPv4), and `pip-{name}-v6` (IPv6) when the change's
//!   `egress_families` include IPv6 (pods of the egress have IPv6 addresses), NAT gateway
//!   `natgw-{name}` (`StandardV2`, the NAT gateway SKU that takes IPv6 public IPs, with
//!   `StandardV2` public IPs) on them (`publicIpAddresses`, `publicIpAddressesV6`), register the
//!   service with the NAT gateway id. The IPv6 public IP is created and attached before the server
//!   lets any IPv6 address refer to the egress (it sends those only once this creation is
//!   recorded); a creation without IPv6 is never sent for an egress whose NAT gateway has one;
//! - outbound create of an egress that brings its NAT gateway: see [`super::byo`] (link, register;
//!   nothing created);
//! - delete (sent only after the drain): unregister, then the load balancer or NAT gateway, then the
//!   public IP (an egress's IPv6 one too, whether or not it has one); a brought NAT gateway is
//!   unlinked instead, never deleted.
//!
//! The changes of a unit run concurrently (bounded by the gateway's limiter and by the unit's
//! `side_by_side`), and their registrations go in one `updateServices` call ([`Registrar`]: a saga
//! hands its registration over and waits for the call). A saga that stops
//! part-way reports the step it reached ([`v1::ServiceStep`] in `Report.service_progress`), so that
//! the server's actual state follows what NRP accepted, never all or nothing: a creation that got
//! as far as a public IP or load balancer leaves resources that a later deletion must clean up,
//! and a deletion that removed the registration has taken the service out of NRP even if its load
//! balancer is still there.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI32, Ordering};

use clb_proto::v1::{self, Report, ServiceChange, ServiceFrontend, ServiceProgress, ServiceWork};

use super::ctx::{UnitCtx, UnitError, partial_report};
use super::inbound::{self, PUBLIC_IP_SKU, RuleSettings};
use super::registrar::{Registrar, Registry, Seat};
use clb_nrp::wire::{
    BackendAddressPool, FrontendIpConfiguration, FrontendIpConfigurationProperties, GatewayService,
    LoadBalancer, LoadBalancerProperties, LoadBalancingRule, LoadBalancingRuleProperties,
    NatGateway, NatGatewayProperties, PublicIpAddress, PublicIpAddressProperties,
    PublicIpDnsSettings, ResourceId, ResourceKind, ServiceRequest, Sku, SubResource,
    TransportProtocol, UpdateServicesRequest,
};

/// Name of the frontend IP configuration of every load balancer the worker creates.
pub const FRONTEND_NAME: &str = "frontend";
/// Name of the backend pool of every load balancer the worker creates.
pub const BACKEND_POOL_NAME: &str = "backend";

/// Name of the public IP address of service `name`.
pub fn public_ip_name(name: &str) -> String {
    format!("pip-{name}")
}

/// Name of the IPv6 public IP of the NAT gateway of outbound service `name`: its IPv4 public IP's
/// name plus `-v6`, as cloud-provider-azure names a NAT gateway's IPv6 public IP.
pub fn public_ip_v6_name(name: &str) -> String {
    format!("{}-v6", public_ip_name(name))
}

/// The SKU of the NAT gateways clb creates and of their public IPs: `StandardV2`, the NAT gateway
/// SKU that takes IPv6 public IPs (a `Standard` one is IPv4-only and its SKU cannot change later).
pub const NAT_GATEWAY_SKU: &str = "StandardV2";

/// Name of the load balancer of inbound service `name`.
pub fn load_balancer_name(name: &str) -> String {
    format!("lb-{name}")
}

/// Name of the NAT gateway of outbound service `name`.
pub fn nat_gateway_name(name: &str) -> String {
    format!("natgw-{name}")
}

fn invalid(message: String) -> UnitError {
    UnitError::Invalid {
        code: "InvalidServiceChange",
        message,
    }
}

/// The load-balancing rules of `ports`: `(protocol, frontend port, backend port)`, deduplicated and
/// checked. The backend port is the port's target port (the pods' port), or the port itself when
/// the target port is 0.
fn rules(change: &ServiceChange) -> Result<Vec<(&'static str, u16, u16)>, UnitError> {
    let mut rules: BTreeMap<(&'static str, u16), u16> = BTreeMap::new();
    for p in &change.ports {
        let proto = match p.protocol() {
            v1::Protocol::Tcp => "tcp",
            v1::Protocol::Udp => "udp",
            v1::Protocol::Unspecified => {
                return Err(invalid(format!(
                    "service {}: port {} has no protocol ({})",
                    change.service_id, p.port, p.protocol
                )));
            }
        };
        let port = u16::try_from(p.port)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                invalid(format!(
                    "service {}: invalid port {}",
                    change.service_id, p.port
                ))
            })?;
        let backend = match p.target_port {
            0 => port,
            t => u16::try_from(t).map_err(|_| {
                invalid(format!(
                    "service {}: port {port}/{proto} has an invalid target port {t}",
                    change.service_id
                ))
            })?,
        };
        if let Some(other) = rules.insert((proto, port), backend)
            && other != backend
        {
            return Err(invalid(format!(
                "service {}: port {port}/{proto} is listed twice, with target ports {other} and {backend}",
                change.service_id
            )));
        }
    }
    Ok(rules
        .into_iter()
        .map(|((proto, port), backend)| (proto, port, backend))
        .collect())
}

/// The `publicIPAddressVersion` of an inbound service's public IP: `IPv6` for an IPv6 service, else
/// `IPv4` (an unspecified family is what every change meant before families: IPv4).
pub fn ip_version(family: v1::IpFamily) -> &'static str {
    match family {
        v1::IpFamily::Ipv6 => "IPv6",
        v1::IpFamily::Ipv4 | v1::IpFamily::Unspecified => "IPv4",
    }
}

/// The public IP of a service. Its version makes the frontend's: a public frontend IP
/// configuration has no version of its own (the REST specification's `privateIPAddressVersion`
/// is that of a private frontend in a subnet), so an IPv6 service's load balancer is the same
/// body on an IPv6 public IP.
fn public_ip(region: &str, version: &str, sku: Sku) -> PublicIpAddress {
    PublicIpAddress {
        location: Some(region.into()),
        sku: Some(sku),
        properties: PublicIpAddressProperties {
            public_ip_allocation_method: Some("Static".into()),
            public_ip_address_version: Some(version.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The load balancer `lb` of an inbound service: one frontend on `pip_id`, one backend pool, one rule
/// per `(protocol, frontend port, backend port)`, named `{protocol}-{frontend port}`. The backends
/// are pod IPs, so the backend port is the pods' port (the Service's target port). Every rule has
/// the idle timeout and load distribution of `settings` and floating IP off; the TCP rules have TCP
/// reset as `settings` says (a UDP rule has none).
pub fn load_balancer(
    lb: &ResourceId,
    region: &str,
    pip_id: &str,
    rules: impl IntoIterator<Item = (&'static str, u16, u16)>,
    settings: &RuleSettings,
) -> LoadBalancer {
    let frontend = lb.frontend_ip_configuration_id(FRONTEND_NAME);
    let pool = lb.backend_pool_id(BACKEND_POOL_NAME);
    LoadBalancer {
        location: Some(region.into()),
        sku: Some(Sku::standard()),
        properties: LoadBalancerProperties {
            frontend_ip_configurations: vec![FrontendIpConfiguration {
                name: FRONTEND_NAME.into(),
                properties: FrontendIpConfigurationProperties {
                    public_ip_address: Some(SubResource::new(pip_id)),
                },
                ..Default::default()
            }],
            backend_address_pools: vec![BackendAddressPool {
                id: None,
                name: BACKEND_POOL_NAME.into(),
            }],
            load_balancing_rules: rules
                .into_iter()
                .map(|(proto, port, backend_port)| {
                    let tcp = proto != "udp";
                    LoadBalancingRule {
                        id: None,
                        name: format!("{proto}-{port}"),
                        properties: LoadBalancingRuleProperties {
                            frontend_ip_configuration: Some(SubResource::new(&frontend)),
                            backend_address_pool: Some(SubResource::new(&pool)),
                            protocol: Some(if tcp {
                                TransportProtocol::Tcp
                            } else {
                                TransportProtocol::Udp
                            }),
                            frontend_port: port,
                            backend_port,
                            idle_timeout_in_minutes: Some(settings.idle_timeout_minutes),
                            enable_floating_ip: Some(false),
                            enable_tcp_reset: tcp.then_some(settings.tcp_reset),
                            load_distribution: Some(settings.load_distribution.clone()),
                            ..Default::default()
                        },
                    }
                })
                .collect(),
            provisioning_state: None,
        },
        ..Default::default()
    }
}

/// The registration of `service` (`is_delete`: its unregistration), as a saga hands it to the
/// unit's [`Registrar`].
pub(crate) fn registration(is_delete: bool, service: GatewayService) -> ServiceRequest {
    ServiceRequest { is_delete, service }
}

/// The unit's registrations go to NRP through its context (gate, limiter, lease).
#[async_trait::async_trait]
impl Registry for UnitCtx<'_> {
    async fn update_services(&self, body: &UpdateServicesRequest) -> Result<(), UnitError> {
        self.mutate(|o| self.nrp().update_services(self.resource(), body, o))
            .await
    }
}

/// The step a saga has reached in NRP, as far as the worker knows: what it reports when it stops
/// part-way.
#[derive(Debug, Default)]
pub(crate) struct Progress(AtomicI32);

impl Progress {
    /// NRP accepted `step` (or may have: `result` is an error whose outcome is unknown).
    pub(crate) fn reached<T>(&self, step: v1::ServiceStep, result: &Result<T, UnitError>) {
        let accepted = match result {
            Ok(_) => true,
            Err(e) => e.outcome_unknown(),
        };
        if accepted {
            self.0.fetch_max(step as i32, Ordering::SeqCst);
        }
    }

    /// NRP may hold the change's resources (whatever the outcome of the calls so far).
    fn resources(&self) {
        self.0
            .fetch_max(v1::ServiceStep::Resources as i32, Ordering::SeqCst);
    }

    fn step(&self) -> Option<v1::ServiceStep> {
        v1::ServiceStep::try_from(self.0.load(Ordering::SeqCst))
            .ok()
            .filter(|s| *s != v1::ServiceStep::Unspecified)
    }
}

/// Treats NRP's `NotFound` as success (deleting what is gone).
fn gone_ok(result: Result<(), UnitError>) -> Result<(), UnitError> {
    match result {
        Err(e) if e.is_not_found() => Ok(()),
        r => r,
    }
}

/// A public IP as the saga needs it: its id, and its address when NRP has allocated one.
struct EnsuredIp {
    id: String,
    address: Option<String>,
}

/// Creates (or updates) the public IP `pip_name` as `body`. Its address is read-only and allocated by
/// NRP: taken from the PUT's result, or, when that lacks it, from a GET of the public IP.
async fn ensure_public_ip(
    ctx: &UnitCtx<'_>,
    pip_name: &str,
    body: &PublicIpAddress,
    progress: &Progress,
) -> Result<EnsuredIp, UnitError> {
    let pip_name = pip_name.to_owned();
    let body = body.clone();
    let pip = ctx
        .mutate(|o| ctx.nrp().put_public_ip(&pip_name, &body, o))
        .await;
    progress.reached(v1::ServiceStep::Resources, &pip);
    let pip = pip?;
    let id = pip.id.ok_or_else(|| {
        UnitError::Nrp(clb_nrp::NrpError::Server {
            status: 200,
            code: "MissingResourceId".into(),
            message: format!("public IP {pip_name} came back without an id"),
            retry_after: None,
        })
    })?;
    let address = match ip_address(&pip.properties) {
        Some(ip) => Some(ip),
        None => {
            let read = ctx.read(|o| ctx.nrp().get_public_ip(&pip_name, o)).await?;
            ip_address(&read.properties)
        }
    };
    if address.is_none() {
        tracing::warn!(public_ip = %pip_name, "NRP reports no address for the public IP yet");
    }
    Ok(EnsuredIp { id, address })
}

/// The allocated address of a public IP, if any.
fn ip_address(p: &PublicIpAddressProperties) -> Option<String> {
    p.ip_address
        .as_deref()
        .map(str::trim)
        .filter(|ip| !ip.is_empty())
        .map(str::to_owned)
}

/// The id of the top-level resource `name` of `kind` in the same subscription and resource group as
/// `sibling` (an id NRP returned).
fn sibling_id(sibling: &str, kind: ResourceKind, name: &str) -> Result<ResourceId, UnitError> {
    let id = ResourceId::parse(sibling).map_err(|e| UnitError::Invalid {
        code: "InvalidResourceId",
        message: e.to_string(),
    })?;
    Ok(ResourceId::new(
        id.subscription,
        id.resource_group,
        kind,
        name,
    ))
}

/// Creates an inbound service and returns its frontend, when NRP told its address. The settings
/// (`ServiceChange.settings`) are checked before any call; a brought public IP is found and checked
/// before anything is created or changed ([`super::inbound`]).
async fn create_inbound(
    ctx: &UnitCtx<'_>,
    change: &ServiceChange,
    progress: &Progress,
    seat: &Seat<'_>,
) -> Result<Option<ServiceFrontend>, UnitError> {
    let rules = rules(change)?;
    let settings = inbound::rule_settings(change)?;
    let choice = inbound::public_ip_choice(change)?;
    let region = ctx.ensure_gateway().await?;
    let own_name = public_ip_name(&change.service_id);
    let lb_name = load_balancer_name(&change.service_id);
    let frontend = match &choice {
        Ok(brought) => inbound::resolve(ctx, change, brought).await?,
        Err(label) => {
            let version = ip_version(change.ip_family());
            let sku = Sku {
                name: PUBLIC_IP_SKU.into(),
                tier: Some("Regional".into()),
            };
            let mut body = public_ip(&region, version, sku);
            body.properties.dns_settings = label.as_ref().map(|l| PublicIpDnsSettings {
                domain_name_label: Some(l.clone()),
                ..Default::default()
            });
            let pip = ensure_public_ip(ctx, &own_name, &body, progress).await?;
            let lb = sibling_id(&pip.id, ResourceKind::LoadBalancer, &lb_name)?;
            inbound::Frontend {
                id: pip.id,
                address: pip.address,
                lb,
            }
        }
    };
    let lb_id = &frontend.lb;
    let body = load_balancer(lb_id, &region, &frontend.id, rules, &settings);
    let lb = ctx
        .mutate(|o| ctx.nrp().put_load_balancer(&lb_name, &body, o))
        .await;
    progress.reached(v1::ServiceStep::Resources, &lb);
    let lb = lb?;
    let pool = lb
        .properties
        .backend_address_pools
        .iter()
        .find(|p| p.name == BACKEND_POOL_NAME)
        .and_then(|p| p.id.clone())
        .unwrap_or_else(|| lb_id.backend_pool_id(BACKEND_POOL_NAME));
    seat.register(registration(
        false,
        GatewayService::inbound(&change.service_id, pool),
    ))
    .await?;
    if choice.is_ok() {
        // The frontend moved off clb's own public IP (the service brought one since): clb owns it,
        // nothing uses it any more.
        match ctx.read(|o| ctx.nrp().get_public_ip(&own_name, o)).await {
            Ok(_) => {
                tracing::info!(service = %change.service_id, "the service now brings its public IP: deleting the one clb made");
                gone_ok(
                    ctx.mutate(|o| ctx.nrp().delete_public_ip(&own_name, o))
                        .await,
                )?;
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(frontend.address.map(|ip| ServiceFrontend {
        service_id: change.service_id.clone(),
        ip,
    }))
}

/// Whether the NAT gateway of an outbound change needs an IPv6 public IP (its `egress_families`).
pub fn egress_needs_ipv6(change: &ServiceChange) -> bool {
    change.egress_families().any(|f| f == v1::IpFamily::Ipv6)
}

async fn create_outbound(
    ctx: &UnitCtx<'_>,
    change: &ServiceChange,
    progress: &Progress,
    seat: &Seat<'_>,
) -> Result<(), UnitError> {
    if !change.nat_gateway.is_empty() {
        return super::byo::create(ctx, change, progress, seat).await;
    }
    let region = ctx.ensure_gateway().await?;
    let sku = Sku {
        name: NAT_GATEWAY_SKU.into(),
        tier: Some("Regional".into()),
    };
    let body = public_ip(&region, "IPv4", sku.clone());
    let pip_id = ensure_public_ip(ctx, &public_ip_name(&change.service_id), &body, progress)
        .await?
        .id;
    let mut v6 = Vec::new();
    if egress_needs_ipv6(change) {
        let body = public_ip(&region, "IPv6", sku);
        let id = ensure_public_ip(ctx, &public_ip_v6_name(&change.service_id), &body, progress)
            .await?
            .id;
        v6.push(SubResource::new(&id));
    }
    let nat_name = nat_gateway_name(&change.service_id);
    let body = NatGateway {
        location: Some(region.clone()),
        sku: Some(Sku {
            name: NAT_GATEWAY_SKU.into(),
            tier: None,
        }),
        properties: NatGatewayProperties {
            public_ip_addresses: vec![SubResource::new(&pip_id)],
            public_ip_addresses_v6: v6,
            ..Default::default()
        },
        ..Default::default()
    };
    let nat = ctx
        .mutate(|o| ctx.nrp().put_nat_gateway(&nat_name, &body, o))
        .await?;
    let nat_id = match nat.id {
        Some(id) => id,
        None => sibling_id(&pip_id, ResourceKind::NatGateway, &nat_name)?.to_string(),
    };
    seat.register(registration(
        false,
        GatewayService::outbound(&change.service_id, nat_id),
    ))
    .await
}

/// Deletes a service: unregister it, then its load balancer or NAT gateway, then its public IP.
/// Until the registration is known to be gone, the resources are there (they were before).
async fn delete(
    ctx: &UnitCtx<'_>,
    change: &ServiceChange,
    inbound: bool,
    progress: &Progress,
    seat: &Seat<'_>,
) -> Result<(), UnitError> {
    let unregister = registration(
        true,
        GatewayService {
            name: change.service_id.clone(),
            properties: Default::default(),
        },
    );
    progress.resources();
    // A brought NAT gateway is found before the registration that names it goes.
    let brought = if inbound {
        None
    } else {
        super::byo::brought(ctx, change).await?
    };
    let unregistered = gone_ok(seat.register(unregister).await);
    if unregistered.is_ok() {
        progress.reached(v1::ServiceStep::Unregistered, &unregistered);
    }
    unregistered?;
    if let Some((gateway, nat)) = brought {
        // Unlinked, never deleted; clb created no public IP for it.
        return super::byo::unlink(ctx, &gateway, &nat).await;
    }
    if inbound {
        let lb = load_balancer_name(&change.service_id);
        gone_ok(ctx.mutate(|o| ctx.nrp().delete_load_balancer(&lb, o)).await)?;
    } else {
        let nat = nat_gateway_name(&change.service_id);
        gone_ok(ctx.mutate(|o| ctx.nrp().delete_nat_gateway(&nat, o)).await)?;
    }
    let pip = public_ip_name(&change.service_id);
    gone_ok(ctx.mutate(|o| ctx.nrp().delete_public_ip(&pip, o)).await)?;
    if !inbound {
        // Whether or not the egress had one (a restarted server may not know).
        let pip = public_ip_v6_name(&change.service_id);
        gone_ok(ctx.mutate(|o| ctx.nrp().delete_public_ip(&pip, o)).await)?;
    }
    Ok(())
}

/// Runs the saga of one change, noting in `progress` how far it got; an inbound creation returns
/// the service's frontend.
async fn saga(
    ctx: &UnitCtx<'_>,
    change: &ServiceChange,
    progress: &Progress,
    seat: &Seat<'_>,
) -> Result<Option<ServiceFrontend>, UnitError> {
    if change.service_id.trim().is_empty() {
        return Err(invalid("a service change without a name".into()));
    }
    use v1::{ServiceAction as A, ServiceKind as K};
    match (change.kind(), change.action()) {
        (K::Inbound, A::Create) => create_inbound(ctx, change, progress, seat).await,
        (K::Outbound, A::Create) => create_outbound(ctx, change, progress, seat)
            .await
            .map(|()| None),
        (K::Inbound, A::Delete) => delete(ctx, change, true, progress, seat)
            .await
            .map(|()| None),
        (K::Outbound, A::Delete) => delete(ctx, change, false, progress, seat)
            .await
            .map(|()| None),
        _ => Err(invalid(format!(
            "service {}: unknown kind {} or action {}",
            change.service_id, change.kind, change.action
        ))),
    }
}

/// Runs every saga of `work` concurrently, at most `work.side_by_side` of them in an NRP call at
/// once (0: no bound), and their registrations in one `updateServices` call ([`Registrar`]). A
/// failure that is retried or repaired stops the sagas that have not started their next call yet;
/// one that parks fails only its own change. The report carries the frontends of the inbound
/// services created (whatever the outcome of the others), and the step each saga that did not go
/// through reached.
pub(crate) async fn execute(ctx: &UnitCtx<'_>, work_id: u64, work: &ServiceWork) -> Report {
    if let Ok(bound @ 1..) = usize::try_from(work.side_by_side) {
        ctx.bound_calls(bound);
    }
    let registrar = Registrar::new(work.changes.len());
    let sagas = futures::future::join_all(work.changes.iter().enumerate().map(|(i, change)| {
        let seat = registrar.seat();
        async move {
            let span = tracing::debug_span!("saga", service = %change.service_id, kind = change.kind, action = change.action);
            let progress = Progress::default();
            let result =
                tracing::Instrument::instrument(saga(ctx, change, &progress, &seat), span).await;
            // Ended: its registration, if it did not hand one over, is not waited for.
            drop(seat);
            if let Err(e) = &result {
                if e.is_retryable() {
                    ctx.abort();
                }
                if *e != UnitError::Aborted {
                    tracing::warn!(
                        service = %change.service_id,
                        error = ?e,
                        reached = ?progress.step(),
                        "service saga failed"
                    );
                }
            }
            (i, result, progress.step())
        }
    }));
    let (results, sent) = futures::join!(sagas, registrar.run(ctx));
    tracing::debug!(
        registrations = sent.requests,
        calls = sent.calls,
        "the unit's registrations went in one updateServices call"
    );
    let mut applied = Vec::new();
    let mut errors = Vec::new();
    let mut own = Vec::new();
    let mut frontends = Vec::new();
    let mut steps = Vec::new();
    for (i, r, step) in results {
        let index = u32::try_from(i).unwrap_or(u32::MAX);
        match r {
            Ok(frontend) => {
                applied.push(index);
                frontends.extend(frontend);
            }
            Err(e) => {
                if let v1::report::Outcome::Terminal(t) = e.outcome() {
                    own.push(v1::ChangeError {
                        index,
                        code: t.code,
                        message: t.message,
                    });
                }
                errors.push(e);
                if let Some(step) = step {
                    steps.push(ServiceProgress {
                        index,
                        step: step as i32,
                    });
                }
            }
        }
    }
    let mut report = partial_report(work_id, applied, errors);
    // Parked: each change that failed for good keeps its own error.
    if let Some(v1::report::Outcome::Terminal(t)) = &mut report.outcome {
        t.changes = own;
    }
    report.frontends = frontends;
    report.service_progress = steps;
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(ports: &[(v1::Protocol, u32, u32)]) -> ServiceChange {
        ServiceChange {
            service_id: "svc".into(),
            ports: ports
                .iter()
                .map(|&(protocol, port, target_port)| v1::ServicePort {
                    port,
                    protocol: protocol as i32,
                    target_port,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn rules_target_the_pods_port() {
        use v1::Protocol::{Tcp, Udp};
        let got = rules(&change(&[(Tcp, 80, 8080), (Udp, 53, 0), (Tcp, 80, 8080)])).unwrap();
        assert_eq!(got, vec![("tcp", 80, 8080), ("udp", 53, 53)]);
        let id = ResourceId::new("s", "rg", ResourceKind::LoadBalancer, "lb-svc");
        let lb = load_balancer(&id, "eastus", "/p", got, &RuleSettings::default());
        let ports: Vec<(u16, u16)> = lb
            .properties
            .load_balancing_rules
            .iter()
            .map(|r| (r.properties.frontend_port, r.properties.backend_port))
            .collect();
        assert_eq!(ports, vec![(80, 8080), (53, 53)]);

        let e = rules(&change(&[(Tcp, 80, 70_000)])).unwrap_err();
        assert!(
            format!("{e:?}").contains("invalid target port 70000"),
            "{e:?}"
        );
        let e = rules(&change(&[(Tcp, 80, 8080), (Tcp, 80, 8081)])).unwrap_err();
        assert!(format!("{e:?}").contains("listed twice"), "{e:?}");
    }
}
