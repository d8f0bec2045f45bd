//! ARM request routing (path → operation) and the execution of operations against [`NrpState`].

use std::net::IpAddr;

use axum::http::{Method, StatusCode};
use serde::de::DeserializeOwned;

use crate::config::EmulatorConfig;
use crate::error::EmulatorError;
use crate::gateway::{NormLocations, NormServices, normalize_locations, normalize_services};
use crate::state::{NrpState, RemovalDraft, key_of};
use clb_nrp::wire::{
    ApiVersion, LoadBalancer, NatGateway, PROVIDER, PublicIpAddress, ResourceId, ResourceKind,
    ServiceGateway, TagsObject, UpdateAddressLocationsRequest, UpdateServicesRequest,
};

/// A sub-resource or action of a service gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GatewayAction {
    Services,
    AddressLocations,
    UpdateServices,
    UpdateAddressLocations,
}

/// What an ARM path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Resource(ResourceId),
    /// The public IP addresses of a resource group (subscription, resource group).
    PublicIps(String, String),
    /// The load balancers of a resource group (subscription, resource group).
    LoadBalancers(String, String),
    /// The service gateways of a subscription (subscription, `None`) or of one of its resource
    /// groups (subscription, resource group).
    Gateways(String, Option<String>),
    Gateway(ResourceId, GatewayAction),
    /// `Azure-AsyncOperation` status of an LRO.
    OperationStatus(String),
    /// `Location` result of an LRO.
    OperationResult(String),
}

/// A routed ARM request: its operation name (for statistics) and target.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    pub operation: &'static str,
    pub method: Method,
    pub target: Target,
}

/// A read.
#[derive(Debug, Clone)]
pub(crate) enum Read {
    Gateway(ResourceId),
    /// A page of service gateways: subscription, resource group (`None`: all), skip token.
    Gateways(String, Option<String>, Option<String>),
    Services(ResourceId, Option<String>),
    Locations(ResourceId, Option<IpAddr>),
    PublicIp(ResourceId),
    /// A page of a resource group's public IPs: subscription, resource group, skip token.
    PublicIps(String, String, Option<String>),
    /// A page of a resource group's load balancers: subscription, resource group, skip token.
    LoadBalancers(String, String, Option<String>),
    LoadBalancer(ResourceId),
    NatGateway(ResourceId),
}

/// A mutating call, with its body already parsed and normalised.
#[derive(Debug, Clone)]
pub(crate) enum Mutation {
    PutGateway(ResourceId, ServiceGateway),
    UpdateGatewayTags(ResourceId, TagsObject),
    DeleteGateway(ResourceId),
    UpdateServices(ResourceId, NormServices),
    UpdateLocations(ResourceId, NormLocations),
    PutPublicIp(ResourceId, PublicIpAddress),
    DeletePublicIp(ResourceId),
    PutLoadBalancer(ResourceId, LoadBalancer),
    DeleteLoadBalancer(ResourceId),
    PutNatGateway(ResourceId, NatGateway),
    DeleteNatGateway(ResourceId),
}

/// A parsed ARM request.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Read(Read),
    Mutate(Box<Mutation>),
}

fn mutate(m: Mutation) -> Op {
    Op::Mutate(Box::new(m))
}

/// The outcome of an applied operation.
#[derive(Debug, Clone)]
pub(crate) struct Applied {
    pub status: StatusCode,
    pub body: Option<serde_json::Value>,
    pub removals: Vec<RemovalDraft>,
    /// Value of the paging token for `nextLink`, when there is a next page.
    pub next_token: Option<String>,
}

fn name_ok(name: &str, kind: ResourceKind) -> bool {
    let allowed = |c: char| {
        c.is_ascii_alphanumeric()
            || c == '-'
            || (kind != ResourceKind::ServiceGateway && (c == '.' || c == '_'))
    };
    // ARM's naming rules for these resources: start with a letter or digit, end with a letter,
    // a digit or '_'.
    !name.is_empty()
        && name.len() <= 80
        && name.chars().all(allowed)
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Routes an ARM path (case-insensitive segment names, as ARM).
pub(crate) fn route(method: &Method, path: &str) -> Result<Route, EmulatorError> {
    let no_route = || EmulatorError::NoRoute {
        method: method.to_string(),
        path: path.to_string(),
    };
    let segs: Vec<&str> = path
        .trim_start_matches('/')
        .trim_end_matches('/')
        .split('/')
        .collect();
    let eq = |i: usize, s: &str| segs.get(i).is_some_and(|x| x.eq_ignore_ascii_case(s));
    if segs.iter().any(|s| s.is_empty()) || !eq(0, "subscriptions") {
        return Err(no_route());
    }
    // /subscriptions/{sub}/providers/Microsoft.Network/locations/{loc}/operations|operationResults/{id}
    if segs.len() == 8 && eq(2, "providers") && eq(3, PROVIDER) && eq(4, "locations") {
        let id = segs[7].to_string();
        let target = if eq(6, "operations") {
            Target::OperationStatus(id)
        } else if eq(6, "operationResults") {
            Target::OperationResult(id)
        } else {
            return Err(no_route());
        };
        let operation = match target {
            Target::OperationStatus(_) => "AsyncOperations_Get",
            _ => "OperationResults_Get",
        };
        return check_method(method, path, &[Method::GET], operation, target);
    }
    // /subscriptions/{sub}/providers/Microsoft.Network/serviceGateways
    if segs.len() == 5 && eq(2, "providers") && eq(3, PROVIDER) {
        return match ResourceKind::from_segment(segs[4]) {
            Some(ResourceKind::ServiceGateway) => check_method(
                method,
                path,
                &[Method::GET],
                "ServiceGateways_ListAll",
                Target::Gateways(segs[1].to_string(), None),
            ),
            _ => Err(no_route()),
        };
    }
    // /subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/
    //   publicIPAddresses|loadBalancers|serviceGateways
    if segs.len() == 7 && eq(2, "resourceGroups") && eq(4, "providers") && eq(5, PROVIDER) {
        let (sub, rg) = (segs[1].to_string(), segs[3].to_string());
        let (operation, target) = match ResourceKind::from_segment(segs[6]) {
            Some(ResourceKind::ServiceGateway) => {
                ("ServiceGateways_List", Target::Gateways(sub, Some(rg)))
            }
            Some(ResourceKind::PublicIpAddress) => {
                ("PublicIPAddresses_List", Target::PublicIps(sub, rg))
            }
            Some(ResourceKind::LoadBalancer) => {
                ("LoadBalancers_List", Target::LoadBalancers(sub, rg))
            }
            _ => return Err(no_route()),
        };
        return check_method(method, path, &[Method::GET], operation, target);
    }
    if !(segs.len() == 8 || segs.len() == 9)
        || !eq(2, "resourceGroups")
        || !eq(4, "providers")
        || !eq(5, PROVIDER)
    {
        return Err(no_route());
    }
    let kind = ResourceKind::from_segment(segs[6]).ok_or_else(no_route)?;
    if !name_ok(segs[7], kind) {
        return Err(EmulatorError::bad_request(
            "InvalidResourceName",
            format!(
                "resource name '{}' is invalid for {}",
                segs[7],
                kind.arm_type()
            ),
        ));
    }
    let id = ResourceId::new(segs[1], segs[3], kind, segs[7]);
    if segs.len() == 8 {
        let operation = match (kind, method.as_str()) {
            (ResourceKind::ServiceGateway, "PUT") => "ServiceGateways_CreateOrUpdate",
            (ResourceKind::ServiceGateway, "DELETE") => "ServiceGateways_Delete",
            (ResourceKind::ServiceGateway, "PATCH") => "ServiceGateways_UpdateTags",
            (ResourceKind::ServiceGateway, _) => "ServiceGateways_Get",
            (ResourceKind::PublicIpAddress, "PUT") => "PublicIPAddresses_CreateOrUpdate",
            (ResourceKind::PublicIpAddress, "DELETE") => "PublicIPAddresses_Delete",
            (ResourceKind::PublicIpAddress, _) => "PublicIPAddresses_Get",
            (ResourceKind::LoadBalancer, "PUT") => "LoadBalancers_CreateOrUpdate",
            (ResourceKind::LoadBalancer, "DELETE") => "LoadBalancers_Delete",
            (ResourceKind::LoadBalancer, _) => "LoadBalancers_Get",
            (ResourceKind::NatGateway, "PUT") => "NatGateways_CreateOrUpdate",
            (ResourceKind::NatGateway, "DELETE") => "NatGateways_Delete",
            (ResourceKind::NatGateway, _) => "NatGateways_Get",
        };
        // Of the resources here, only service gateways have PATCH (update tags) in this emulator.
        let patch = kind == ResourceKind::ServiceGateway;
        let allowed: &[Method] = if patch {
            &[Method::GET, Method::PUT, Method::DELETE, Method::PATCH]
        } else {
            &[Method::GET, Method::PUT, Method::DELETE]
        };
        return check_method(method, path, allowed, operation, Target::Resource(id));
    }
    if kind != ResourceKind::ServiceGateway {
        return Err(no_route());
    }
    let (action, operation, allowed) = if eq(8, "services") {
        (
            GatewayAction::Services,
            "ServiceGateways_GetServices",
            Method::GET,
        )
    } else if eq(8, "addressLocations") {
        (
            GatewayAction::AddressLocations,
            "ServiceGateways_GetAddressLocations",
            Method::GET,
        )
    } else if eq(8, "updateServices") {
        (
            GatewayAction::UpdateServices,
            "ServiceGateways_UpdateServices",
            Method::POST,
        )
    } else if eq(8, "updateAddressLocations") {
        (
            GatewayAction::UpdateAddressLocations,
            "ServiceGateways_UpdateAddressLocations",
            Method::POST,
        )
    } else {
        return Err(no_route());
    };
    check_method(
        method,
        path,
        &[allowed],
        operation,
        Target::Gateway(id, action),
    )
}

fn check_method(
    method: &Method,
    path: &str,
    allowed: &[Method],
    operation: &'static str,
    target: Target,
) -> Result<Route, EmulatorError> {
    if !allowed.contains(method) {
        return Err(EmulatorError::MethodNotAllowed {
            method: method.to_string(),
            path: path.to_string(),
        });
    }
    Ok(Route {
        operation,
        method: method.clone(),
        target,
    })
}

/// The query parameters the emulator reads.
#[derive(Debug, Clone, Default)]
pub(crate) struct Query {
    pub api_version: Option<String>,
    pub skip_token: Option<String>,
}

/// Parses a raw query string.
pub(crate) fn parse_query(raw: Option<&str>) -> Query {
    let mut q = Query::default();
    for pair in raw.unwrap_or_default().split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k.eq_ignore_ascii_case("api-version") {
            q.api_version = Some(v.to_string());
        } else if k.eq_ignore_ascii_case("$skipToken") || k.eq_ignore_ascii_case("%24skipToken") {
            q.skip_token = Some(v.to_string());
        }
    }
    q
}

/// Checks the api-version parameter: one of the supported versions, exactly as ARM spells it.
pub(crate) fn check_api_version(q: &Query) -> Result<ApiVersion, EmulatorError> {
    match q.api_version.as_deref() {
        None | Some("") => Err(EmulatorError::MissingApiVersion),
        Some(v) => ApiVersion::parse(v)
            .ok_or_else(|| EmulatorError::InvalidApiVersion(v.chars().take(64).collect())),
    }
}

fn json<T: DeserializeOwned>(body: &[u8]) -> Result<T, EmulatorError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(EmulatorError::MalformedBody(
            "the request body is empty".into(),
        ));
    }
    // serde accepts a JSON array for a struct; ARM bodies are objects.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(EmulatorError::MalformedBody(
            "the request body must be a JSON object".into(),
        ));
    }
    serde_json::from_slice(body).map_err(|e| EmulatorError::MalformedBody(e.to_string()))
}

/// Turns a routed request and its body into an operation (parsing and normalising the body).
pub(crate) fn parse_op(route: &Route, query: &Query, body: &[u8]) -> Result<Op, EmulatorError> {
    let put = route.method == Method::PUT;
    let delete = route.method == Method::DELETE;
    let patch = route.method == Method::PATCH;
    Ok(match &route.target {
        Target::OperationStatus(_) | Target::OperationResult(_) => {
            return Err(EmulatorError::Internal(
                "operation polls carry no body".into(),
            ));
        }
        Target::PublicIps(subscription, resource_group) => Op::Read(Read::PublicIps(
            subscription.clone(),
            resource_group.clone(),
            query.skip_token.clone(),
        )),
        Target::LoadBalancers(subscription, resource_group) => Op::Read(Read::LoadBalancers(
            subscription.clone(),
            resource_group.clone(),
            query.skip_token.clone(),
        )),
        Target::Gateways(subscription, resource_group) => Op::Read(Read::Gateways(
            subscription.clone(),
            resource_group.clone(),
            query.skip_token.clone(),
        )),
        Target::Resource(id) => {
            let id = id.clone();
            match id.kind {
                ResourceKind::ServiceGateway if put => {
                    mutate(Mutation::PutGateway(id, json(body)?))
                }
                ResourceKind::ServiceGateway if delete => mutate(Mutation::DeleteGateway(id)),
                ResourceKind::ServiceGateway if patch => {
                    mutate(Mutation::UpdateGatewayTags(id, json(body)?))
                }
                ResourceKind::ServiceGateway => Op::Read(Read::Gateway(id)),
                ResourceKind::PublicIpAddress if put => {
                    mutate(Mutation::PutPublicIp(id, json(body)?))
                }
                ResourceKind::PublicIpAddress if delete => mutate(Mutation::DeletePublicIp(id)),
                ResourceKind::PublicIpAddress => Op::Read(Read::PublicIp(id)),
                ResourceKind::LoadBalancer if put => {
                    mutate(Mutation::PutLoadBalancer(id, json(body)?))
                }
                ResourceKind::LoadBalancer if delete => mutate(Mutation::DeleteLoadBalancer(id)),
                ResourceKind::LoadBalancer => Op::Read(Read::LoadBalancer(id)),
                ResourceKind::NatGateway if put => mutate(Mutation::PutNatGateway(id, json(body)?)),
                ResourceKind::NatGateway if delete => mutate(Mutation::DeleteNatGateway(id)),
                ResourceKind::NatGateway => Op::Read(Read::NatGateway(id)),
            }
        }
        Target::Gateway(id, action) => {
            let id = id.clone();
            match action {
                GatewayAction::Services => Op::Read(Read::Services(id, query.skip_token.clone())),
                GatewayAction::AddressLocations => {
                    let after = match query.skip_token.as_deref() {
                        None => None,
                        Some(t) => Some(t.parse::<IpAddr>().map_err(|_| {
                            EmulatorError::bad_request(
                                "InvalidSkipToken",
                                format!("skip token '{t}' is invalid"),
                            )
                        })?),
                    };
                    Op::Read(Read::Locations(id, after))
                }
                GatewayAction::UpdateServices => {
                    let req: UpdateServicesRequest = json(body)?;
                    mutate(Mutation::UpdateServices(id, normalize_services(req)?))
                }
                GatewayAction::UpdateAddressLocations => {
                    let req: UpdateAddressLocationsRequest = json(body)?;
                    mutate(Mutation::UpdateLocations(id, normalize_locations(req)?))
                }
            }
        }
    })
}

impl Mutation {
    /// The resource this call is about.
    pub(crate) fn resource(&self) -> &ResourceId {
        match self {
            Self::PutGateway(id, _)
            | Self::UpdateGatewayTags(id, _)
            | Self::DeleteGateway(id)
            | Self::UpdateServices(id, _)
            | Self::UpdateLocations(id, _)
            | Self::PutPublicIp(id, _)
            | Self::DeletePublicIp(id)
            | Self::PutLoadBalancer(id, _)
            | Self::DeleteLoadBalancer(id)
            | Self::PutNatGateway(id, _)
            | Self::DeleteNatGateway(id) => id,
        }
    }

    /// The gateway whose concurrency limit this call counts against (gateway calls only).
    pub(crate) fn gateway_key(&self) -> Option<String> {
        let id = self.resource();
        (id.kind == ResourceKind::ServiceGateway).then(|| key_of(id))
    }

    /// Number of addresses carried.
    pub(crate) fn address_count(&self) -> usize {
        match self {
            Self::UpdateLocations(_, n) => n.address_count(),
            _ => 0,
        }
    }

    /// Number of locations carried.
    pub(crate) fn location_count(&self) -> usize {
        match self {
            Self::UpdateLocations(_, n) => n.locations.len(),
            _ => 0,
        }
    }

    /// Whether this is a DELETE.
    pub(crate) fn is_delete(&self) -> bool {
        matches!(
            self,
            Self::DeleteGateway(..)
                | Self::DeletePublicIp(..)
                | Self::DeleteLoadBalancer(..)
                | Self::DeleteNatGateway(..)
        )
    }

    /// Whether this is a `updateServices` or `updateAddressLocations` action.
    pub(crate) fn is_action(&self) -> bool {
        matches!(self, Self::UpdateServices(..) | Self::UpdateLocations(..))
    }

    /// Whether ARM answers this call synchronously even in long-running-operation mode: PATCH (update
    /// tags) always, the gateway actions from api-version `2025-09-01` on.
    pub(crate) fn always_synchronous(&self, version: ApiVersion) -> bool {
        matches!(self, Self::UpdateGatewayTags(..))
            || (self.is_action() && version.actions_are_synchronous())
    }

    /// Whether this is a PUT.
    pub(crate) fn is_put(&self) -> bool {
        matches!(
            self,
            Self::PutGateway(..)
                | Self::PutPublicIp(..)
                | Self::PutLoadBalancer(..)
                | Self::PutNatGateway(..)
        )
    }
}

fn to_value<T: serde::Serialize>(v: &T) -> Result<serde_json::Value, EmulatorError> {
    serde_json::to_value(v).map_err(|e| EmulatorError::Internal(e.to_string()))
}

fn put_result<T: serde::Serialize>((created, v): (bool, T)) -> Result<Applied, EmulatorError> {
    Ok(Applied {
        status: if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        body: Some(to_value(&v)?),
        removals: Vec::new(),
        next_token: None,
    })
}

/// A DELETE's answer: `200` for a resource that existed (public IPs, load balancers and NAT gateways
/// allow it), `204` for one that did not.
fn delete_result(existed: bool, removals: Vec<RemovalDraft>) -> Applied {
    Applied {
        status: if existed {
            StatusCode::OK
        } else {
            StatusCode::NO_CONTENT
        },
        body: None,
        removals,
        next_token: None,
    }
}

/// A completed gateway action: `200` with `ServiceGatewayActionOkResponseBody` (`{}`) when the
/// api-version answers actions synchronously, else `204` (the `2025-05-01` contract: `202` or `204`).
fn action_result(version: ApiVersion, removals: Vec<RemovalDraft>) -> Applied {
    let (status, body) = if version.actions_are_synchronous() {
        (StatusCode::OK, Some(serde_json::json!({})))
    } else {
        (StatusCode::NO_CONTENT, None)
    };
    Applied {
        status,
        body,
        removals,
        next_token: None,
    }
}

impl NrpState {
    /// Checks a mutation against the state without applying it.
    pub(crate) fn check(&self, m: &Mutation, cfg: &EmulatorConfig) -> Result<(), EmulatorError> {
        let auto_create = cfg.auto_create_gateways;
        match m {
            Mutation::PutGateway(id, b) => self.check_put_gateway(id, b),
            Mutation::UpdateGatewayTags(id, _) => self.gateway_or_err(id, auto_create).map(drop),
            Mutation::DeleteGateway(_) => Ok(()),
            Mutation::UpdateServices(id, n) => self.check_services(id, auto_create, n),
            Mutation::UpdateLocations(id, n) => {
                crate::faults::check_refused_addresses(&cfg.refused_addresses, id, n)?;
                self.check_locations(id, auto_create, cfg.single_ip_version_pools, n)
            }
            Mutation::PutPublicIp(id, b) => self.check_put_public_ip(id, b),
            Mutation::DeletePublicIp(id) => self.check_delete_public_ip(id),
            Mutation::PutLoadBalancer(id, b) => self.check_put_load_balancer(id, b),
            Mutation::DeleteLoadBalancer(id) => self.check_delete_load_balancer(id),
            Mutation::PutNatGateway(id, b) => self.check_put_nat_gateway(id, b),
            Mutation::DeleteNatGateway(id) => self.check_delete_nat_gateway(id, cfg),
        }
    }

    /// Applies a mutation (checking it first; a rejected mutation changes nothing).
    pub(crate) fn apply(
        &mut self,
        m: Mutation,
        cfg: &EmulatorConfig,
        version: ApiVersion,
    ) -> Result<Applied, EmulatorError> {
        let auto_create = cfg.auto_create_gateways;
        match m {
            Mutation::PutGateway(id, b) => put_result(self.put_gateway(&id, b)?),
            Mutation::UpdateGatewayTags(id, t) => Ok(Applied {
                status: StatusCode::OK,
                body: Some(to_value(&self.update_gateway_tags(&id, auto_create, t)?)?),
                removals: Vec::new(),
                next_token: None,
            }),
            Mutation::DeleteGateway(id) => {
                // The gateway's DELETE answers 202 or 204 only: done at once, the gateway is gone.
                let (_, removals) = self.delete_gateway(&id);
                let mut applied = delete_result(false, removals);
                applied.status = StatusCode::NO_CONTENT;
                Ok(applied)
            }
            Mutation::UpdateServices(id, n) => {
                self.update_services(&id, auto_create, n)?;
                Ok(action_result(version, Vec::new()))
            }
            Mutation::UpdateLocations(id, n) => {
                crate::faults::check_refused_addresses(&cfg.refused_addresses, &id, &n)?;
                Ok(action_result(
                    version,
                    self.update_locations(&id, auto_create, cfg.single_ip_version_pools, n)?,
                ))
            }
            Mutation::PutPublicIp(id, b) => put_result(self.put_public_ip(&id, b)?),
            Mutation::DeletePublicIp(id) => {
                Ok(delete_result(self.delete_public_ip(&id)?, Vec::new()))
            }
            Mutation::PutLoadBalancer(id, b) => put_result(self.put_load_balancer(&id, b)?),
            Mutation::DeleteLoadBalancer(id) => {
                Ok(delete_result(self.delete_load_balancer(&id)?, Vec::new()))
            }
            Mutation::PutNatGateway(id, b) => put_result(self.put_nat_gateway(&id, b)?),
            Mutation::DeleteNatGateway(id) => Ok(delete_result(
                self.delete_nat_gateway(&id, cfg)?,
                Vec::new(),
            )),
        }
    }

    /// Executes a read; list reads return one page of `page_size`.
    pub(crate) fn read(
        &mut self,
        r: Read,
        auto_create: bool,
        page_size: usize,
    ) -> Result<Applied, EmulatorError> {
        let (body, next_token) = match r {
            Read::Gateway(id) => (to_value(&self.get_gateway(&id, auto_create)?)?, None),
            Read::Gateways(subscription, resource_group, after) => {
                let (items, next) = self.list_gateways(
                    &subscription,
                    resource_group.as_deref(),
                    after.as_deref(),
                    page_size,
                );
                (serde_json::json!({ "value": to_value(&items)? }), next)
            }
            Read::Services(id, after) => {
                let (items, next) =
                    self.list_services(&id, auto_create, after.as_deref(), page_size)?;
                (serde_json::json!({ "value": to_value(&items)? }), next)
            }
            Read::Locations(id, after) => {
                let (items, next) = self.list_locations(&id, auto_create, after, page_size)?;
                (
                    serde_json::json!({ "value": to_value(&items)? }),
                    next.map(|ip| ip.to_string()),
                )
            }
            Read::PublicIp(id) => (to_value(&self.get_public_ip(&id)?)?, None),
            Read::PublicIps(subscription, resource_group, after) => {
                let (items, next) = self.list_public_ips(
                    &subscription,
                    &resource_group,
                    after.as_deref(),
                    page_size,
                );
                (serde_json::json!({ "value": to_value(&items)? }), next)
            }
            Read::LoadBalancers(subscription, resource_group, after) => {
                let (items, next) = self.list_load_balancers(
                    &subscription,
                    &resource_group,
                    after.as_deref(),
                    page_size,
                );
                (serde_json::json!({ "value": to_value(&items)? }), next)
            }
            Read::LoadBalancer(id) => (to_value(&self.get_load_balancer(&id)?)?, None),
            Read::NatGateway(id) => (to_value(&self.get_nat_gateway(&id)?)?, None),
        };
        Ok(Applied {
            status: StatusCode::OK,
            body: Some(body),
            removals: Vec::new(),
            next_token,
        })
    }
}

#[cfg(test)]
#[path = "ops_tests.rs"]
mod tests;
