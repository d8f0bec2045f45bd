//! Talking to Azure's network resource provider (NRP): the wire types of the Service Gateway REST API
//! and the `Nrp` client trait with its ARM/HTTP implementation. The project's own NRP emulator, which
//! speaks the same API, is the `clb-nrp-emulator` crate.
//!
//! The worker talks to NRP only through [`Nrp`] (usually as `Arc<dyn Nrp>`). The one production
//! implementation is [`azure::ArmClient`], which speaks ARM over HTTPS to either real Azure or the
//! emulator. Every call takes a [`CallOptions`] whose deadline is the lease of the work unit: a call
//! whose deadline has passed is refused with [`NrpError::DeadlineExceeded`] before anything is sent.

pub mod azure;
pub mod wire;

use std::time::{Duration, Instant};

use async_trait::async_trait;

use self::wire::{
    AddressLocation, GatewayService, LoadBalancer, NatGateway, PublicIpAddress, ServiceGateway,
    UpdateAddressLocationsRequest, UpdateServicesRequest,
};

/// A client of NRP: the Service Gateway operations and the resources that the service sagas create.
///
/// Object safe (`Arc<dyn Nrp>`); implement it with `#[async_trait::async_trait]`. Every call:
/// - names its gateway or resource by name (the subscription and resource group are the client's);
/// - is refused with [`NrpError::DeadlineExceeded`] before anything is sent once `opts.deadline` has
///   passed, and does not outlive the deadline;
/// - sends a mutating request at most once (retrying is the caller's decision); a long-running
///   operation is awaited to its end, so `Ok` means NRP has applied the change.
#[async_trait]
pub trait Nrp: Send + Sync {
    /// The writes left in the ARM write budget of the client's subscription, as the last mutating
    /// answer said (`x-ms-ratelimit-remaining-subscription-writes`); `None` when no answer carried
    /// it yet, or for a client that does not know (the default). A throttled call (429) is still
    /// an error of its own ([`NrpError::Throttled`], with its `Retry-After`); this is only the
    /// figure, for pacing.
    fn remaining_subscription_writes(&self) -> Option<u32> {
        None
    }

    /// How many mutating answers carried the remaining writes so far (a counter, 0 for a client
    /// that does not know): a caller compares it before and after its calls to tell a fresh
    /// [`Nrp::remaining_subscription_writes`] from one left by earlier calls.
    fn writes_answered(&self) -> u64 {
        0
    }

    /// `GET …/serviceGateways/{gateway}`.
    async fn get_service_gateway(
        &self,
        gateway: &str,
        opts: CallOptions,
    ) -> Result<ServiceGateway, NrpError>;

    /// `PUT …/serviceGateways/{gateway}` (create or update); returns the resource as NRP has it.
    async fn put_service_gateway(
        &self,
        gateway: &str,
        body: &ServiceGateway,
        opts: CallOptions,
    ) -> Result<ServiceGateway, NrpError>;

    /// `GET …/serviceGateways/{gateway}/services`, every page.
    async fn list_services(
        &self,
        gateway: &str,
        opts: CallOptions,
    ) -> Result<Vec<GatewayService>, NrpError>;

    /// `GET …/serviceGateways/{gateway}/addressLocations`, following `nextLink` to the last page.
    async fn list_address_locations(
        &self,
        gateway: &str,
        opts: CallOptions,
    ) -> Result<Vec<AddressLocation>, NrpError>;

    /// `POST …/serviceGateways/{gateway}/updateServices`.
    async fn update_services(
        &self,
        gateway: &str,
        request: &UpdateServicesRequest,
        opts: CallOptions,
    ) -> Result<(), NrpError>;

    /// `POST …/serviceGateways/{gateway}/updateAddressLocations`.
    async fn update_address_locations(
        &self,
        gateway: &str,
        request: &UpdateAddressLocationsRequest,
        opts: CallOptions,
    ) -> Result<(), NrpError>;

    /// `GET …/publicIPAddresses/{name}`.
    async fn get_public_ip(
        &self,
        name: &str,
        opts: CallOptions,
    ) -> Result<PublicIpAddress, NrpError>;

    /// `PUT …/publicIPAddresses/{name}` (create or update); returns the resource as NRP has it.
    async fn put_public_ip(
        &self,
        name: &str,
        body: &PublicIpAddress,
        opts: CallOptions,
    ) -> Result<PublicIpAddress, NrpError>;

    /// `DELETE …/publicIPAddresses/{name}`; succeeds when it does not exist.
    async fn delete_public_ip(&self, name: &str, opts: CallOptions) -> Result<(), NrpError>;

    /// The public IP addresses among `names` that exist (names compared case-insensitively; a name
    /// that does not exist is left out), in no particular order. For reading many at once, such as
    /// the frontends of every inbound service in an observe.
    ///
    /// [`azure::ArmClient`] reads them with one listing of the resource group
    /// (`GET …/publicIPAddresses`, following `nextLink` to the last page). This default, meant for
    /// wrappers, GETs each name in turn.
    async fn find_public_ips(
        &self,
        names: &[String],
        opts: CallOptions,
    ) -> Result<Vec<PublicIpAddress>, NrpError> {
        let mut found = Vec::with_capacity(names.len());
        for name in names {
            match self.get_public_ip(name, opts).await {
                Ok(pip) => found.push(pip),
                Err(NrpError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(found)
    }

    /// `GET …/resourceGroups/{resource_group}/…/publicIPAddresses/{name}`: a public IP of the
    /// client's subscription in any resource group (a brought one, which may live outside the
    /// gateway's). Read only: clb never writes a public IP it does not own.
    async fn get_public_ip_in(
        &self,
        resource_group: &str,
        name: &str,
        opts: CallOptions,
    ) -> Result<PublicIpAddress, NrpError>;

    /// The public IP of the client's resource group whose allocated address is `address` (compared
    /// as IP addresses, so that `2001:DB8::1` finds `2001:db8::1`), if any: a brought public IP named
    /// by its address. [`azure::ArmClient`] reads one listing of the resource group
    /// (`GET …/publicIPAddresses`, following `nextLink` to the last page). An `address` that is not
    /// an IP address finds nothing.
    async fn find_public_ip_by_address(
        &self,
        address: &str,
        opts: CallOptions,
    ) -> Result<Option<PublicIpAddress>, NrpError>;

    /// `GET …/loadBalancers/{name}`.
    async fn get_load_balancer(
        &self,
        name: &str,
        opts: CallOptions,
    ) -> Result<LoadBalancer, NrpError>;

    /// The load balancers among `names` that exist (names compared case-insensitively; a name that
    /// does not exist is left out), in no particular order. For reading many at once, such as the
    /// rules of every inbound service in an observe.
    ///
    /// [`azure::ArmClient`] reads them with one listing of the resource group
    /// (`GET …/loadBalancers`, following `nextLink` to the last page). This default, meant for
    /// wrappers, GETs each name in turn.
    async fn find_load_balancers(
        &self,
        names: &[String],
        opts: CallOptions,
    ) -> Result<Vec<LoadBalancer>, NrpError> {
        let mut found = Vec::with_capacity(names.len());
        for name in names {
            match self.get_load_balancer(name, opts).await {
                Ok(lb) => found.push(lb),
                Err(NrpError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(found)
    }

    /// `PUT …/loadBalancers/{name}` (create or update); returns the resource as NRP has it.
    async fn put_load_balancer(
        &self,
        name: &str,
        body: &LoadBalancer,
        opts: CallOptions,
    ) -> Result<LoadBalancer, NrpError>;

    /// `DELETE …/loadBalancers/{name}`; succeeds when it does not exist.
    async fn delete_load_balancer(&self, name: &str, opts: CallOptions) -> Result<(), NrpError>;

    /// `GET …/natGateways/{name}`.
    async fn get_nat_gateway(&self, name: &str, opts: CallOptions) -> Result<NatGateway, NrpError>;

    /// `PUT …/natGateways/{name}` (create or update); returns the resource as NRP has it.
    async fn put_nat_gateway(
        &self,
        name: &str,
        body: &NatGateway,
        opts: CallOptions,
    ) -> Result<NatGateway, NrpError>;

    /// `DELETE …/natGateways/{name}`; succeeds when it does not exist.
    async fn delete_nat_gateway(&self, name: &str, opts: CallOptions) -> Result<(), NrpError>;

    /// `GET …/resourceGroups/{resource_group}/…/natGateways/{name}`: a NAT gateway of the client's
    /// subscription in another resource group (a brought NAT gateway, in the VNet's resource group).
    async fn get_nat_gateway_in(
        &self,
        resource_group: &str,
        name: &str,
        opts: CallOptions,
    ) -> Result<NatGateway, NrpError>;

    /// `PUT …/resourceGroups/{resource_group}/…/natGateways/{name}`: the update of a brought NAT
    /// gateway (its `serviceGateway` link only; the body is what a GET returned, so nothing else
    /// changes). There is no delete in another resource group: clb never deletes a brought one.
    async fn put_nat_gateway_in(
        &self,
        resource_group: &str,
        name: &str,
        body: &NatGateway,
        opts: CallOptions,
    ) -> Result<NatGateway, NrpError>;
}

/// Options of one NRP call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallOptions {
    /// The call must not send any request at or after this instant (typically the expiry of the lease of
    /// the work unit being executed). It also bounds the timeout of every request and of long-running
    /// operation polling. `None`: only the client's own timeouts apply.
    pub deadline: Option<Instant>,
}

impl CallOptions {
    /// Options without a deadline.
    pub fn none() -> Self {
        Self::default()
    }

    /// Options with the given deadline.
    pub fn with_deadline(deadline: Instant) -> Self {
        Self {
            deadline: Some(deadline),
        }
    }

    /// Options with a deadline `timeout` from now.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self::with_deadline(Instant::now() + timeout)
    }

    /// Time left until the deadline: `Ok(None)` without a deadline, `Err(DeadlineExceeded)` once it has
    /// passed (a call must not send anything then).
    pub fn remaining(&self) -> Result<Option<Duration>, NrpError> {
        match self.deadline {
            None => Ok(None),
            Some(deadline) => {
                let now = Instant::now();
                if deadline <= now {
                    Err(NrpError::DeadlineExceeded)
                } else {
                    Ok(Some(deadline - now))
                }
            }
        }
    }

    /// Whether the deadline has passed.
    pub fn expired(&self) -> bool {
        self.remaining().is_err()
    }
}

/// A failed NRP call, classified so that the worker can decide between retrying (and when) and
/// reporting a terminal error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NrpError {
    /// 429: the caller is throttled; retry after `retry_after` (from `Retry-After`) or with backoff.
    #[error("throttled by NRP ({code}): {message}")]
    Throttled {
        /// ARM error code (e.g. `TooManyRequests`); empty when the body carried none.
        code: String,
        /// ARM error message.
        message: String,
        /// The server's `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// 409: a conflicting operation, e.g. `AnotherOperationInProgress` on the same gateway.
    #[error("conflict ({code}): {message}")]
    Conflict {
        /// ARM error code.
        code: String,
        /// ARM error message.
        message: String,
        /// The server's `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// 404: the resource (or its parent) does not exist.
    #[error("not found ({code}): {message}")]
    NotFound {
        /// ARM error code (e.g. `ResourceNotFound`); empty when the body carried none.
        code: String,
        /// ARM error message.
        message: String,
    },
    /// 400 (or another 4xx): NRP rejected the request as invalid, e.g. `DuplicateLocationsInRequest`
    /// or `ServiceWithOverlayMappingsCannotBeDeleted`. Sending it again will fail again.
    #[error("rejected by NRP ({code}): {message}")]
    Validation {
        /// ARM error code.
        code: String,
        /// ARM error message.
        message: String,
    },
    /// 5xx (or an unexpected status): a server-side failure.
    #[error("NRP server error {status} ({code}): {message}")]
    Server {
        /// HTTP status.
        status: u16,
        /// ARM error code, or `HttpStatus<status>` when the body carried none.
        code: String,
        /// ARM error message, or the start of a non-JSON body.
        message: String,
        /// The server's `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// The request could not be sent or its response not received (connect error, reset, timeout,
    /// unreadable body). For a mutating call the outcome is unknown.
    #[error("transport error{}: {message}", if *.timeout { " (timeout)" } else { "" })]
    Transport {
        /// What went wrong.
        message: String,
        /// Whether it was a timeout.
        timeout: bool,
    },
    /// No token could be acquired (`code` = `CredentialUnavailable`), or ARM refused it (401/403 with
    /// the ARM code, e.g. `AuthorizationFailed`).
    #[error("authentication failed ({code}): {message}")]
    Auth {
        /// ARM error code or `CredentialUnavailable`.
        code: String,
        /// What went wrong.
        message: String,
    },
    /// The call's deadline passed: either nothing was sent, or the outcome of what was sent is unknown.
    #[error("deadline exceeded")]
    DeadlineExceeded,
    /// A long-running operation was accepted, but following it to its end failed: a poll was
    /// answered with an error (`code`, `message`). NRP may still complete the change, or not: for
    /// the caller its outcome is unknown. (A poll that times out is a [`NrpError::Transport`], one
    /// cut off by the deadline [`NrpError::DeadlineExceeded`]: unknown outcomes too.)
    #[error("operation accepted but not followed to its end ({code}): {message}")]
    Unconfirmed {
        /// ARM error code of the failed poll, or `HttpStatus<status>` when it carried none.
        code: String,
        /// ARM error message of the failed poll.
        message: String,
    },
    /// A long-running operation was accepted but ended `Failed` or `Canceled`.
    #[error("operation {status} ({code}): {message}")]
    OperationFailed {
        /// Terminal status of the operation (`Failed` or `Canceled`).
        status: String,
        /// ARM error code of the operation's error, if any.
        code: String,
        /// ARM error message of the operation's error, if any.
        message: String,
    },
}

impl NrpError {
    /// The ARM error code when NRP returned one, otherwise a stable label of the error kind.
    pub fn code(&self) -> &str {
        fn or<'a>(code: &'a str, fallback: &'a str) -> &'a str {
            if code.is_empty() { fallback } else { code }
        }
        match self {
            NrpError::Throttled { code, .. } => or(code, "Throttled"),
            NrpError::Conflict { code, .. } => or(code, "Conflict"),
            NrpError::NotFound { code, .. } => or(code, "NotFound"),
            NrpError::Validation { code, .. } => or(code, "BadRequest"),
            NrpError::Server { code, .. } => or(code, "ServerError"),
            NrpError::Transport { timeout: true, .. } => "Timeout",
            NrpError::Transport { .. } => "Transport",
            NrpError::Auth { code, .. } => or(code, "AuthenticationFailed"),
            NrpError::DeadlineExceeded => "DeadlineExceeded",
            NrpError::Unconfirmed { .. } => "OperationUnconfirmed",
            NrpError::OperationFailed { code, status, .. } => or(code, status),
        }
    }

    /// The delay the server asked for (`Retry-After`), if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            NrpError::Throttled { retry_after, .. }
            | NrpError::Conflict { retry_after, .. }
            | NrpError::Server { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether sending the same call again later may succeed. Validation errors, missing resources and
    /// 501 are terminal; everything else (throttling, conflicts, server and transport failures, expired
    /// deadlines, failed asynchronous operations, and authentication, which an operator fixes outside
    /// the system) is worth retrying with backoff.
    pub fn is_retryable(&self) -> bool {
        match self {
            NrpError::Validation { .. } | NrpError::NotFound { .. } => false,
            NrpError::Server { status, .. } => *status != 501,
            _ => true,
        }
    }

    /// Whether this error means NRP is pushing back on load (429, or a 409 for a concurrent operation),
    /// so the caller should lower its concurrency.
    pub fn is_throttling(&self) -> bool {
        matches!(self, NrpError::Throttled { .. })
            || matches!(self, NrpError::Conflict { code, .. } if code == "AnotherOperationInProgress")
    }

    /// A short, stable, low-cardinality label of the error kind for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            NrpError::Throttled { .. } => "throttled",
            NrpError::Conflict { .. } => "conflict",
            NrpError::NotFound { .. } => "not_found",
            NrpError::Validation { .. } => "validation",
            NrpError::Server { .. } => "server",
            NrpError::Transport { timeout: true, .. } => "timeout",
            NrpError::Transport { .. } => "transport",
            NrpError::Auth { .. } => "auth",
            NrpError::DeadlineExceeded => "deadline_exceeded",
            NrpError::Unconfirmed { .. } => "unconfirmed",
            NrpError::OperationFailed { .. } => "operation_failed",
        }
    }
}
