//! The ARM/HTTP implementation of [`Nrp`]: one code path for real Azure and for the NRP emulator.
//!
//! ARM conventions followed: `api-version` on every URL, a bearer token from an Entra ID credential
//! (none for the emulator), an `x-ms-client-request-id` (UUID v4) on every request, long-running
//! operations (200/201/202/204, polling `Azure-AsyncOperation` or `Location` while honouring
//! `Retry-After`), `Retry-After` surfaced on 429 and 5xx, ARM error bodies mapped to [`NrpError`],
//! and the subscription's remaining write budget read from every mutating answer
//! (`x-ms-ratelimit-remaining-subscription-writes`, [`ArmClient::remaining_subscription_writes`]).
//! Mutating calls are never retried here (the worker decides); a GET is sent once more after a
//! connection failure.

mod credential;
mod http;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::TokenCredential;
use reqwest::{Method, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::warn;

pub use self::credential::CredentialConfig;
use self::http::FinalState;
use super::wire::{
    API_VERSION, AddressLocation, GatewayService, LoadBalancer, NatGateway, PROVIDER,
    PublicIpAddress, ResourceKind, SUPPORTED_API_VERSIONS, ServiceGateway, ServiceType,
    UpdateAddressLocationsRequest, UpdateServicesRequest,
};
use super::{CallOptions, Nrp, NrpError};

/// The public Azure Resource Manager endpoint.
pub const DEFAULT_ENDPOINT: &str = "https://management.azure.com";
/// The header ARM puts on the answer to a write: the writes left in the subscription's budget
/// (<https://learn.microsoft.com/azure/azure-resource-manager/management/request-limits-and-throttling>).
pub const REMAINING_WRITES_HEADER: &str = "x-ms-ratelimit-remaining-subscription-writes";
/// The token scope of the public Azure Resource Manager.
pub const DEFAULT_TOKEN_SCOPE: &str = "https://management.azure.com/.default";

/// Where and how the client talks to ARM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArmConfig {
    /// Base URL of ARM ([`DEFAULT_ENDPOINT`]) or of the emulator (e.g. `http://127.0.0.1:8080`).
    pub endpoint: String,
    /// Subscription of the resources.
    pub subscription_id: String,
    /// Resource group of the resources.
    pub resource_group: String,
    /// `api-version` of every call ([`API_VERSION`], the newest the project is tested against; one of
    /// [`SUPPORTED_API_VERSIONS`]).
    pub api_version: String,
    /// `api-version` of the calls on particular service gateways (by name, case-insensitive), instead
    /// of `api_version`: a gateway can stay on an older version while others move on.
    pub gateway_api_versions: BTreeMap<String, String>,
    /// Scope of the bearer token ([`DEFAULT_TOKEN_SCOPE`]; differs in sovereign clouds).
    pub token_scope: String,
    /// Upper bound of one HTTP request (further lowered by the call's deadline).
    pub request_timeout: Duration,
    /// Upper bound of establishing a connection.
    pub connect_timeout: Duration,
    /// Upper bound of waiting for a long-running operation when the call has no earlier deadline.
    pub operation_timeout: Duration,
    /// Delay between polls of a long-running operation when the server sends no `Retry-After`.
    pub poll_interval: Duration,
    /// Cap of the delay between polls, whatever `Retry-After` says.
    pub max_poll_interval: Duration,
    /// `User-Agent` of every request.
    pub user_agent: String,
}

impl ArmConfig {
    /// Defaults for public Azure, for the given subscription and resource group.
    pub fn new(subscription_id: impl Into<String>, resource_group: impl Into<String>) -> Self {
        Self {
            endpoint: DEFAULT_ENDPOINT.into(),
            subscription_id: subscription_id.into(),
            resource_group: resource_group.into(),
            api_version: API_VERSION.into(),
            gateway_api_versions: BTreeMap::new(),
            token_scope: DEFAULT_TOKEN_SCOPE.into(),
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            operation_timeout: Duration::from_secs(600),
            poll_interval: Duration::from_secs(1),
            max_poll_interval: Duration::from_secs(10),
            user_agent: concat!("clb-sync-worker/", env!("CARGO_PKG_VERSION")).into(),
        }
    }

    /// The same configuration with another endpoint (e.g. the emulator's).
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = endpoint.into();
        self
    }

    /// The same configuration with another default api-version.
    pub fn with_api_version(mut self, api_version: impl Into<String>) -> Self {
        self.api_version = api_version.into();
        self
    }

    /// The api-version of the calls on the service gateway `gateway`.
    pub fn api_version_for(&self, gateway: &str) -> &str {
        self.gateway_api_versions
            .iter()
            .find(|(g, _)| g.eq_ignore_ascii_case(gateway))
            .map_or(self.api_version.as_str(), |(_, v)| v.as_str())
    }
}

/// Checks that `version` (the value of `what`) is one of [`SUPPORTED_API_VERSIONS`].
fn check_api_version(what: &str, version: &str) -> Result<(), NrpError> {
    if SUPPORTED_API_VERSIONS.contains(&version) {
        return Ok(());
    }
    Err(invalid_config(format!(
        "{what} {version:?} is not an api-version this client is tested against (supported: {})",
        SUPPORTED_API_VERSIONS.join(", ")
    )))
}

/// Enum values of NRP answers that this client does not know: kept (never an error), logged once per
/// field and value, and counted.
#[derive(Debug, Default)]
struct UnknownValues {
    seen: Mutex<BTreeMap<(&'static str, String), u64>>,
}

impl UnknownValues {
    fn note(&self, field: &'static str, value: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let n = seen.entry((field, value.to_string())).or_insert(0);
        if *n == 0 {
            warn!(
                field,
                value, "NRP answered an enum value this client does not know; kept as it is"
            );
        }
        *n += 1;
    }

    fn snapshot(&self) -> BTreeMap<(String, String), u64> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|((f, v), n)| ((f.to_string(), v.clone()), *n))
            .collect()
    }
}

/// The ARM/HTTP [`Nrp`] client (reqwest with rustls). Cheap to clone; clones share the connection pool.
#[derive(Clone)]
pub struct ArmClient {
    http: reqwest::Client,
    config: Arc<ArmConfig>,
    base: Url,
    credential: Option<Arc<dyn TokenCredential>>,
    unknown: Arc<UnknownValues>,
    /// The last `x-ms-ratelimit-remaining-subscription-writes` of a mutating answer
    /// ([`NO_REMAINING_WRITES`]: none seen yet).
    remaining_writes: Arc<AtomicU64>,
    /// Mutating answers that carried it so far.
    writes_answered: Arc<AtomicU64>,
}

/// [`ArmClient::remaining_writes`] before any mutating answer carried the header.
const NO_REMAINING_WRITES: u64 = u64::MAX;

impl fmt::Debug for ArmClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArmClient")
            .field("endpoint", &self.config.endpoint)
            .field("subscription_id", &self.config.subscription_id)
            .field("resource_group", &self.config.resource_group)
            .field("api_version", &self.config.api_version)
            .field("authenticated", &self.credential.is_some())
            .finish_non_exhaustive()
    }
}

fn invalid_config(message: String) -> NrpError {
    NrpError::Validation {
        code: "InvalidClientConfiguration".into(),
        message,
    }
}

impl ArmClient {
    /// A client for `config`, authenticating with `credential` (`None`: no `Authorization` header, for
    /// the emulator). The token is requested for `config.token_scope` and sent only to the endpoint's
    /// own origin.
    pub fn new(
        config: ArmConfig,
        credential: Option<Arc<dyn TokenCredential>>,
    ) -> Result<Self, NrpError> {
        let base = Url::parse(&config.endpoint)
            .map_err(|e| invalid_config(format!("endpoint {:?}: {e}", config.endpoint)))?;
        if base.cannot_be_a_base() || !matches!(base.scheme(), "http" | "https") {
            return Err(invalid_config(format!(
                "endpoint {:?} is not an http(s) URL",
                config.endpoint
            )));
        }
        for (what, value) in [
            ("subscription id", &config.subscription_id),
            ("resource group", &config.resource_group),
        ] {
            if value.trim().is_empty() {
                return Err(invalid_config(format!("{what} is empty")));
            }
        }
        check_api_version("api-version", &config.api_version)?;
        for (gateway, version) in &config.gateway_api_versions {
            if gateway.trim().is_empty() {
                return Err(invalid_config(format!(
                    "api-version {version:?} is given for an empty gateway name"
                )));
            }
            check_api_version(&format!("api-version of gateway {gateway:?}"), version)?;
        }
        let http = reqwest::Client::builder()
            .user_agent(config.user_agent.clone())
            .connect_timeout(config.connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| NrpError::Transport {
                message: format!("building the HTTP client: {e}"),
                timeout: false,
            })?;
        Ok(Self {
            http,
            config: Arc::new(config),
            base,
            credential,
            unknown: Arc::default(),
            remaining_writes: Arc::new(AtomicU64::new(NO_REMAINING_WRITES)),
            writes_answered: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The enum values of NRP answers this client did not know (`(field, value)` → times seen), e.g.
    /// `("serviceType", "Transit")`. They are kept in the results (as `Other`), never an error; each is
    /// logged once.
    pub fn unknown_enum_values(&self) -> BTreeMap<(String, String), u64> {
        self.unknown.snapshot()
    }

    /// Notes the unknown service types of a listing.
    fn note_unknown_services(&self, services: &[GatewayService]) {
        for s in services {
            if let Some(ServiceType::Other(v)) = &s.properties.service_type {
                self.unknown.note("serviceType", v);
            }
        }
    }

    /// The writes left in the subscription's ARM write budget, as the last mutating answer said
    /// (`x-ms-ratelimit-remaining-subscription-writes`, a 429 included); `None` before any mutating
    /// answer carried it. Clones share it. One client serves one subscription, so this is the
    /// subscription's figure as this client last saw it.
    pub fn remaining_subscription_writes(&self) -> Option<u32> {
        match self.remaining_writes.load(Ordering::Relaxed) {
            NO_REMAINING_WRITES => None,
            n => Some(u32::try_from(n).unwrap_or(u32::MAX)),
        }
    }

    /// Notes the remaining writes of a mutating answer's headers, if they carry them.
    pub(super) fn note_remaining_writes(&self, headers: &reqwest::header::HeaderMap) {
        if let Some(n) = http::remaining_writes(headers) {
            self.remaining_writes.store(u64::from(n), Ordering::Relaxed);
            self.writes_answered.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Mutating answers that carried the remaining writes so far (see [`Nrp::writes_answered`]).
    pub fn writes_answered(&self) -> u64 {
        self.writes_answered.load(Ordering::Relaxed)
    }

    /// A client for `config` with the credential that `credential` selects.
    pub fn from_config(config: ArmConfig, credential: &CredentialConfig) -> Result<Self, NrpError> {
        Self::new(config, credential.build()?)
    }

    /// The configuration.
    pub fn config(&self) -> &ArmConfig {
        &self.config
    }

    /// The ARM id of the resource `name` of `kind` in the configured subscription and resource group.
    pub fn resource_id(&self, kind: ResourceKind, name: &str) -> String {
        super::wire::ResourceId::new(
            &self.config.subscription_id,
            &self.config.resource_group,
            kind,
            name,
        )
        .to_string()
    }

    /// URL of the resource `name` of `kind`, with an optional action/child path, and the api-version.
    fn url(&self, kind: ResourceKind, name: &str, sub_path: Option<&str>) -> Result<Url, NrpError> {
        if name.trim().is_empty() {
            return Err(NrpError::Validation {
                code: "InvalidResourceName".into(),
                message: format!("empty {} name", kind.segment()),
            });
        }
        let version = match kind {
            ResourceKind::ServiceGateway => self.config.api_version_for(name),
            _ => self.config.api_version.as_str(),
        };
        self.path_url(kind, &[Some(name), sub_path], version)
    }

    /// URL of the collection of `kind` in the configured resource group (`…/providers/{ns}/{kind}`),
    /// with the api-version.
    fn collection_url(&self, kind: ResourceKind) -> Result<Url, NrpError> {
        self.path_url(kind, &[], &self.config.api_version)
    }

    /// `…/subscriptions/{s}/resourceGroups/{rg}/providers/{ns}/{kind}` followed by `rest` (the
    /// `Some` parts), with the api-version `version`.
    fn path_url(
        &self,
        kind: ResourceKind,
        rest: &[Option<&str>],
        version: &str,
    ) -> Result<Url, NrpError> {
        self.path_url_in(&self.config.resource_group, kind, rest, version)
    }

    /// [`Self::path_url`] in the resource group `resource_group`.
    fn path_url_in(
        &self,
        resource_group: &str,
        kind: ResourceKind,
        rest: &[Option<&str>],
        version: &str,
    ) -> Result<Url, NrpError> {
        let mut url = self.base.clone();
        url.set_query(None);
        url.set_fragment(None);
        url.path_segments_mut()
            .map_err(|()| invalid_config("endpoint cannot be a base URL".into()))?
            .pop_if_empty()
            .extend([
                "subscriptions",
                &self.config.subscription_id,
                "resourceGroups",
                resource_group,
                "providers",
                PROVIDER,
                kind.segment(),
            ])
            .extend(rest.iter().flatten());
        url.query_pairs_mut().append_pair("api-version", version);
        Ok(url)
    }

    /// `GET …/resourceGroups/{rg}/providers/Microsoft.Network/publicIPAddresses`: every public IP of
    /// the configured resource group, following `nextLink` to the last page.
    pub async fn list_public_ips(
        &self,
        opts: CallOptions,
    ) -> Result<Vec<PublicIpAddress>, NrpError> {
        let url = self.collection_url(ResourceKind::PublicIpAddress)?;
        self.list_all(url, opts).await
    }

    /// `GET …/resourceGroups/{rg}/providers/Microsoft.Network/loadBalancers`: every load balancer of
    /// the configured resource group, following `nextLink` to the last page.
    pub async fn list_load_balancers(
        &self,
        opts: CallOptions,
    ) -> Result<Vec<LoadBalancer>, NrpError> {
        let url = self.collection_url(ResourceKind::LoadBalancer)?;
        self.list_all(url, opts).await
    }

    /// `GET …/resourceGroups/{rg}/providers/Microsoft.Network/serviceGateways`: every service gateway
    /// of the configured resource group, following `nextLink` to the last page.
    pub async fn list_service_gateways(
        &self,
        opts: CallOptions,
    ) -> Result<Vec<ServiceGateway>, NrpError> {
        let url = self.collection_url(ResourceKind::ServiceGateway)?;
        self.list_all(url, opts).await
    }

    /// `DELETE …/serviceGateways/{gateway}` (`202` followed to its end, or `204`); succeeds when the
    /// gateway does not exist. Not part of [`Nrp`]: the workers never delete a gateway.
    pub async fn delete_service_gateway(
        &self,
        gateway: &str,
        opts: CallOptions,
    ) -> Result<(), NrpError> {
        self.delete_resource(ResourceKind::ServiceGateway, gateway, opts)
            .await
    }

    async fn get_resource<T: DeserializeOwned>(
        &self,
        kind: ResourceKind,
        name: &str,
        opts: CallOptions,
    ) -> Result<T, NrpError> {
        let url = self.url(kind, name, None)?;
        self.get_json(&url, opts).await
    }

    async fn put_resource<T: Serialize + DeserializeOwned>(
        &self,
        kind: ResourceKind,
        name: &str,
        body: &T,
        opts: CallOptions,
    ) -> Result<T, NrpError> {
        let url = self.url(kind, name, None)?;
        self.put_url(&url, body, opts).await
    }

    /// The URL of the resource `name` of `kind` in the resource group `resource_group`.
    fn resource_url_in(
        &self,
        kind: ResourceKind,
        resource_group: &str,
        name: &str,
    ) -> Result<Url, NrpError> {
        let what = format!("{} name", kind.segment());
        for (what, v) in [("resource group", resource_group), (what.as_str(), name)] {
            if v.trim().is_empty() {
                return Err(NrpError::Validation {
                    code: "InvalidResourceName".into(),
                    message: format!("empty {what}"),
                });
            }
        }
        self.path_url_in(
            resource_group,
            kind,
            &[Some(name)],
            &self.config.api_version,
        )
    }

    async fn put_url<T: Serialize + DeserializeOwned>(
        &self,
        url: &Url,
        body: &T,
        opts: CallOptions,
    ) -> Result<T, NrpError> {
        let url = url.clone();
        let body = to_json(body)?;
        let done = self
            .long_running(
                Method::PUT,
                &url,
                Some(&body),
                opts,
                FinalState::OriginalUri,
            )
            .await?;
        match done {
            Some(done) => serde_json::from_slice(&done).map_err(|e| NrpError::Server {
                status: 200,
                code: "InvalidResponseBody".into(),
                message: format!("response body does not parse: {e}"),
                retry_after: None,
            }),
            // A PUT that returned nothing: read the resource back.
            None => self.get_json(&url, opts).await,
        }
    }

    async fn delete_resource(
        &self,
        kind: ResourceKind,
        name: &str,
        opts: CallOptions,
    ) -> Result<(), NrpError> {
        let url = self.url(kind, name, None)?;
        self.long_running(Method::DELETE, &url, None, opts, FinalState::Nothing)
            .await
            .map(drop)
    }

    /// `POST …/serviceGateways/{gateway}/{action}`. Every success the API allows is accepted: `200`
    /// with or without a body (synchronous, api-version `2025-09-01` and later), `202` followed to its
    /// end, `204`.
    async fn post_action<T: Serialize>(
        &self,
        gateway: &str,
        action: &str,
        body: &T,
        opts: CallOptions,
    ) -> Result<(), NrpError> {
        let url = self.url(ResourceKind::ServiceGateway, gateway, Some(action))?;
        let body = to_json(body)?;
        self.long_running(Method::POST, &url, Some(&body), opts, FinalState::Location)
            .await
            .map(drop)
    }
}

fn to_json<T: Serialize>(body: &T) -> Result<Vec<u8>, NrpError> {
    serde_json::to_vec(body).map_err(|e| NrpError::Validation {
        code: "InvalidRequestBody".into(),
        message: format!("request body does not serialise: {e}"),
    })
}

#[async_trait]
impl Nrp for ArmClient {
    fn remaining_subscription_writes(&self) -> Option<u32> {
        ArmClient::remaining_subscription_writes(self)
    }

    fn writes_answered(&self) -> u64 {
        ArmClient::writes_answered(self)
    }

    async fn get_service_gateway(
        &self,
        gateway: &str,
        opts: CallOptions,
    ) -> Result<ServiceGateway, NrpError> {
        self.get_resource(ResourceKind::ServiceGateway, gateway, opts)
            .await
    }

    async fn put_service_gateway(
        &self,
        gateway: &str,
        body: &ServiceGateway,
        opts: CallOptions,
    ) -> Result<ServiceGateway, NrpError> {
        self.put_resource(ResourceKind::ServiceGateway, gateway, body, opts)
            .await
    }

    async fn list_services(
        &self,
        gateway: &str,
        opts: CallOptions,
    ) -> Result<Vec<GatewayService>, NrpError> {
        let url = self.url(ResourceKind::ServiceGateway, gateway, Some("services"))?;
        let services: Vec<GatewayService> = self.list_all(url, opts).await?;
        self.note_unknown_services(&services);
        Ok(services)
    }

    async fn list_address_locations(
        &self,
        gateway: &str,
        opts: CallOptions,
    ) -> Result<Vec<AddressLocation>, NrpError> {
        let url = self.url(
            ResourceKind::ServiceGateway,
            gateway,
            Some("addressLocations"),
        )?;
        self.list_all(url, opts).await
    }

    async fn update_services(
        &self,
        gateway: &str,
        request: &UpdateServicesRequest,
        opts: CallOptions,
    ) -> Result<(), NrpError> {
        self.post_action(gateway, "updateServices", request, opts)
            .await
    }

    async fn update_address_locations(
        &self,
        gateway: &str,
        request: &UpdateAddressLocationsRequest,
        opts: CallOptions,
    ) -> Result<(), NrpError> {
        self.post_action(gateway, "updateAddressLocations", request, opts)
            .await
    }

    async fn get_public_ip(
        &self,
        name: &str,
        opts: CallOptions,
    ) -> Result<PublicIpAddress, NrpError> {
        self.get_resource(ResourceKind::PublicIpAddress, name, opts)
            .await
    }

    async fn put_public_ip(
        &self,
        name: &str,
        body: &PublicIpAddress,
        opts: CallOptions,
    ) -> Result<PublicIpAddress, NrpError> {
        self.put_resource(ResourceKind::PublicIpAddress, name, body, opts)
            .await
    }

    async fn delete_public_ip(&self, name: &str, opts: CallOptions) -> Result<(), NrpError> {
        self.delete_resource(ResourceKind::PublicIpAddress, name, opts)
            .await
    }

    async fn find_public_ips(
        &self,
        names: &[String],
        opts: CallOptions,
    ) -> Result<Vec<PublicIpAddress>, NrpError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let wanted: std::collections::HashSet<String> =
            names.iter().map(|n| n.to_ascii_lowercase()).collect();
        let mut all = self.list_public_ips(opts).await?;
        all.retain(|p| {
            p.name
                .as_deref()
                .is_some_and(|n| wanted.contains(&n.to_ascii_lowercase()))
        });
        Ok(all)
    }

    async fn get_public_ip_in(
        &self,
        resource_group: &str,
        name: &str,
        opts: CallOptions,
    ) -> Result<PublicIpAddress, NrpError> {
        let url = self.resource_url_in(ResourceKind::PublicIpAddress, resource_group, name)?;
        self.get_json(&url, opts).await
    }

    async fn find_public_ip_by_address(
        &self,
        address: &str,
        opts: CallOptions,
    ) -> Result<Option<PublicIpAddress>, NrpError> {
        let Ok(wanted) = address.trim().parse::<std::net::IpAddr>() else {
            return Ok(None);
        };
        let all = self.list_public_ips(opts).await?;
        Ok(all.into_iter().find(|p| {
            p.properties
                .ip_address
                .as_deref()
                .and_then(|ip| ip.trim().parse::<std::net::IpAddr>().ok())
                == Some(wanted)
        }))
    }

    async fn get_load_balancer(
        &self,
        name: &str,
        opts: CallOptions,
    ) -> Result<LoadBalancer, NrpError> {
        self.get_resource(ResourceKind::LoadBalancer, name, opts)
            .await
    }

    async fn find_load_balancers(
        &self,
        names: &[String],
        opts: CallOptions,
    ) -> Result<Vec<LoadBalancer>, NrpError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let wanted: std::collections::HashSet<String> =
            names.iter().map(|n| n.to_ascii_lowercase()).collect();
        let mut all = self.list_load_balancers(opts).await?;
        all.retain(|lb| {
            lb.name
                .as_deref()
                .is_some_and(|n| wanted.contains(&n.to_ascii_lowercase()))
        });
        Ok(all)
    }

    async fn put_load_balancer(
        &self,
        name: &str,
        body: &LoadBalancer,
        opts: CallOptions,
    ) -> Result<LoadBalancer, NrpError> {
        self.put_resource(ResourceKind::LoadBalancer, name, body, opts)
            .await
    }

    async fn delete_load_balancer(&self, name: &str, opts: CallOptions) -> Result<(), NrpError> {
        self.delete_resource(ResourceKind::LoadBalancer, name, opts)
            .await
    }

    async fn get_nat_gateway(&self, name: &str, opts: CallOptions) -> Result<NatGateway, NrpError> {
        self.get_resource(ResourceKind::NatGateway, name, opts)
            .await
    }

    async fn put_nat_gateway(
        &self,
        name: &str,
        body: &NatGateway,
        opts: CallOptions,
    ) -> Result<NatGateway, NrpError> {
        self.put_resource(ResourceKind::NatGateway, name, body, opts)
            .await
    }

    async fn delete_nat_gateway(&self, name: &str, opts: CallOptions) -> Result<(), NrpError> {
        self.delete_resource(ResourceKind::NatGateway, name, opts)
            .await
    }

    async fn get_nat_gateway_in(
        &self,
        resource_group: &str,
        name: &str,
        opts: CallOptions,
    ) -> Result<NatGateway, NrpError> {
        let url = self.resource_url_in(ResourceKind::NatGateway, resource_group, name)?;
        self.get_json(&url, opts).await
    }

    async fn put_nat_gateway_in(
        &self,
        resource_group: &str,
        name: &str,
        body: &NatGateway,
        opts: CallOptions,
    ) -> Result<NatGateway, NrpError> {
        let url = self.resource_url_in(ResourceKind::NatGateway, resource_group, name)?;
        self.put_url(&url, body, opts).await
    }
}
