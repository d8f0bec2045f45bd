//! The ARM client against a scripted fake ARM server on loopback: long-running operations, paging,
//! error mapping, `Retry-After`, authentication headers and deadlines.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use azure_core::credentials::{AccessToken, TokenCredential, TokenRequestOptions};
use clb_nrp::azure::{ArmClient, ArmConfig, DEFAULT_TOKEN_SCOPE};
use clb_nrp::wire::{
    API_VERSION, AddressLocationUpdate, GatewayAddress, PublicIpAddress, ServiceType, UpdateAction,
    UpdateAddressLocationsRequest, UpdateServicesRequest,
};
use clb_nrp::{CallOptions, Nrp, NrpError};
use serde_json::{Value, json};

/// One request as the fake server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    path: String,
    query: String,
    headers: HeaderMap,
    body: Bytes,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    /// `http://host:port` of the server, as the client addressed it.
    fn origin(&self) -> String {
        format!("http://{}", self.header("host").unwrap())
    }
}

/// A scripted reply.
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
}

impl Reply {
    fn json(status: u16, body: Value) -> Self {
        Self {
            status,
            headers: vec![("content-type", "application/json".into())],
            body: body.to_string(),
        }
    }
    fn text(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: vec![("content-type", "text/html".into())],
            body: body.into(),
        }
    }
    fn empty(status: u16) -> Self {
        Self::text(status, "")
    }
    fn arm_error(status: u16, code: &str, message: &str) -> Self {
        Self::json(status, json!({"error": {"code": code, "message": message}}))
    }
    fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
}

/// The script: the request and its index (0-based) among all requests seen.
type Script = Arc<dyn Fn(&Seen, usize) -> Reply + Send + Sync>;

#[derive(Clone)]
struct Fake {
    seen: Arc<Mutex<Vec<Seen>>>,
    script: Script,
}

async fn handle(
    State(fake): State<Fake>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let seen = Seen {
        method,
        path: uri.path().to_string(),
        query: uri.query().unwrap_or("").to_string(),
        headers,
        body,
    };
    let index = {
        let mut all = fake.seen.lock().unwrap();
        all.push(seen.clone());
        all.len() - 1
    };
    let reply = (fake.script)(&seen, index);
    let mut response = (StatusCode::from_u16(reply.status).unwrap(), reply.body).into_response();
    for (name, value) in reply.headers {
        response
            .headers_mut()
            .insert(name, value.parse().expect("header value"));
    }
    response
}

/// Starts a fake ARM server on `127.0.0.1:0`; returns its base URL and the log of requests.
async fn serve(
    script: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static,
) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let fake = Fake {
        seen: Arc::default(),
        script: Arc::new(script),
    };
    let seen = fake.seen.clone();
    let app = Router::new().fallback(handle).with_state(fake);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, seen)
}

fn config(base: &str) -> ArmConfig {
    let mut config = ArmConfig::new("sub-1", "rg-1").with_endpoint(base);
    config.poll_interval = Duration::from_millis(1);
    config.max_poll_interval = Duration::from_millis(10);
    config.request_timeout = Duration::from_secs(10);
    config
}

fn client(base: &str) -> ArmClient {
    ArmClient::new(config(base), None).unwrap()
}

fn client_at(base: &str, api_version: &str) -> ArmClient {
    ArmClient::new(config(base).with_api_version(api_version), None).unwrap()
}

/// The api-versions the client is tested against.
const VERSIONS: [&str; 2] = ["2025-05-01", "2026-03-01"];

const RG: &str = "/subscriptions/sub-1/resourceGroups/rg-1/providers/Microsoft.Network";

fn opts() -> CallOptions {
    CallOptions::with_timeout(Duration::from_secs(30))
}

fn requests(seen: &Arc<Mutex<Vec<Seen>>>) -> Vec<Seen> {
    seen.lock().unwrap().clone()
}

fn one_location() -> UpdateAddressLocationsRequest {
    UpdateAddressLocationsRequest {
        action: UpdateAction::PartialUpdate,
        address_locations: vec![AddressLocationUpdate {
            address_location: "10.0.0.4".into(),
            address_update_action: UpdateAction::FullUpdate,
            addresses: vec![GatewayAddress {
                address: "10.1.0.7".into(),
                services: vec!["svc-a".into()],
            }],
        }],
    }
}

#[tokio::test]
async fn put_polls_azure_async_operation_then_reads_the_resource() {
    let (base, seen) = serve(|req, i| match (i, req.method.as_str()) {
        (0, "PUT") => Reply::json(
            201,
            json!({"name": "pip-1", "properties": {"provisioningState": "Updating"}}),
        )
        .header(
            "azure-asyncoperation",
            format!("{}/operations/op-1?api-version=2025-05-01", req.origin()),
        )
        .header("retry-after", "0"),
        (1, "GET") => {
            Reply::json(200, json!({"status": "InProgress"})).header("retry-after", "3600")
        }
        (2, "GET") => Reply::json(200, json!({"status": "Succeeded"})),
        (3, "GET") => Reply::json(
            200,
            json!({"id": format!("{RG}/publicIPAddresses/pip-1"), "name": "pip-1",
                   "properties": {"provisioningState": "Succeeded"}}),
        ),
        _ => Reply::empty(500),
    })
    .await;
    let body = PublicIpAddress {
        location: Some("eastus".into()),
        ..Default::default()
    };
    let pip = client_at(&base, "2025-05-01")
        .put_public_ip("pip-1", &body, opts())
        .await
        .unwrap();
    assert_eq!(
        pip.properties.provisioning_state.as_deref(),
        Some("Succeeded")
    );
    assert_eq!(pip.id.unwrap(), format!("{RG}/publicIPAddresses/pip-1"));

    let reqs = requests(&seen);
    assert_eq!(reqs.len(), 4);
    assert_eq!(reqs[0].path, format!("{RG}/publicIPAddresses/pip-1"));
    assert!(reqs[0].query.contains("api-version=2025-05-01"));
    assert_eq!(reqs[0].header("content-type"), Some("application/json"));
    let sent: Value = serde_json::from_slice(&reqs[0].body).unwrap();
    assert_eq!(sent["location"], "eastus");
    assert_eq!(reqs[1].path, "/operations/op-1");
    assert_eq!(reqs[2].path, "/operations/op-1");
    assert_eq!(reqs[3].path, reqs[0].path);
    // Without a credential no Authorization header is sent.
    assert!(reqs.iter().all(|r| r.header("authorization").is_none()));
}

#[tokio::test]
async fn failed_async_operation_is_operation_failed() {
    let (base, _seen) = serve(|req, i| match i {
        0 => Reply::json(200, json!({}))
            .header("azure-asyncoperation", format!("{}/operations/op-2", req.origin())),
        _ => Reply::json(
            200,
            json!({"status": "Failed", "error": {"code": "InternalServerError", "message": "boom"}}),
        ),
    })
    .await;
    let err = client(&base)
        .update_address_locations("gw", &one_location(), opts())
        .await
        .unwrap_err();
    assert_eq!(
        err,
        NrpError::OperationFailed {
            status: "Failed".into(),
            code: "InternalServerError".into(),
            message: "boom".into()
        }
    );
    assert_eq!(err.code(), "InternalServerError");
    assert_eq!(err.metric_label(), "operation_failed");
}

#[tokio::test]
async fn post_polls_location_until_done() {
    let (base, seen) = serve(|_req, i| match i {
        // A relative Location is resolved against the request URL.
        0 => Reply::empty(202)
            .header("location", "/operationResults/r-1?api-version=2025-05-01")
            .header("retry-after", "1"),
        1 | 2 => Reply::empty(202).header("retry-after", "1"),
        _ => Reply::empty(204),
    })
    .await;
    client(&base)
        .update_address_locations("gw-1", &one_location(), opts())
        .await
        .unwrap();
    let reqs = requests(&seen);
    assert_eq!(reqs.len(), 4);
    assert_eq!(reqs[0].method, Method::POST);
    assert_eq!(
        reqs[0].path,
        format!("{RG}/serviceGateways/gw-1/updateAddressLocations")
    );
    let sent: Value = serde_json::from_slice(&reqs[0].body).unwrap();
    assert_eq!(sent["addressLocations"][0]["addressLocation"], "10.0.0.4");
    assert_eq!(
        sent["addressLocations"][0]["addresses"][0]["services"][0],
        "svc-a"
    );
    for poll in &reqs[1..] {
        assert_eq!(poll.method, Method::GET);
        assert_eq!(poll.path, "/operationResults/r-1");
    }
}

#[tokio::test]
async fn delete_polls_location_and_absent_resource_is_success() {
    let (base, seen) = serve(|req, i| match (i, req.path.ends_with("lb-gone")) {
        (_, true) => Reply::arm_error(404, "ResourceNotFound", "no such load balancer"),
        (0, false) => Reply::empty(202).header("location", format!("{}/results/d-1", req.origin())),
        (1, false) => Reply::empty(202),
        _ => Reply::empty(200),
    })
    .await;
    let client = client(&base);
    client.delete_load_balancer("lb-1", opts()).await.unwrap();
    client
        .delete_load_balancer("lb-gone", opts())
        .await
        .unwrap();
    let paths: Vec<_> = requests(&seen).into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        [
            format!("{RG}/loadBalancers/lb-1"),
            "/results/d-1".into(),
            "/results/d-1".into(),
            format!("{RG}/loadBalancers/lb-gone"),
        ]
    );
    // A GET of a missing resource is NotFound, not success.
    let err = client
        .get_load_balancer("lb-gone", opts())
        .await
        .unwrap_err();
    assert!(matches!(err, NrpError::NotFound { .. }), "{err:?}");
    assert_eq!(err.code(), "ResourceNotFound");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn throttling_surfaces_retry_after() {
    let (base, seen) = serve(|req, _| {
        if req.path.ends_with("updateServices") {
            Reply::arm_error(429, "TooManyRequests", "slow down").header("retry-after", "7")
        } else {
            let at = azure_core::time::OffsetDateTime::now_utc()
                + azure_core::time::Duration::seconds(120);
            Reply::text(429, "throttled").header("retry-after", azure_core::time::to_rfc7231(&at))
        }
    })
    .await;
    let client = client(&base);
    let err = client
        .update_services("gw", &Default::default(), opts())
        .await
        .unwrap_err();
    assert_eq!(
        err,
        NrpError::Throttled {
            code: "TooManyRequests".into(),
            message: "slow down".into(),
            retry_after: Some(Duration::from_secs(7)),
        }
    );
    assert!(err.is_retryable());
    assert!(err.is_throttling());
    assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
    assert_eq!(err.metric_label(), "throttled");
    // The mutating call is not retried by the client.
    assert_eq!(requests(&seen).len(), 1);

    // Retry-After as an HTTP date, with a non-JSON body.
    let err = client.get_service_gateway("gw", opts()).await.unwrap_err();
    let NrpError::Throttled { retry_after, .. } = &err else {
        panic!("{err:?}")
    };
    let retry_after = retry_after.expect("retry-after from the HTTP date");
    assert!(retry_after > Duration::from_secs(60) && retry_after <= Duration::from_secs(120));
    assert_eq!(err.code(), "Throttled");
}

#[tokio::test]
async fn the_remaining_subscription_writes_of_mutating_answers_are_kept() {
    // Writes answer with a decreasing budget, reads with a read budget (never a write figure), the
    // fourth write is throttled.
    let (base, _seen) = serve(|req, index| {
        if req.method == Method::GET {
            return Reply::json(200, json!({"name": "gw", "properties": {}}))
                .header("x-ms-ratelimit-remaining-subscription-reads", "11999");
        }
        match index {
            0 => Reply::empty(200).header("x-ms-ratelimit-remaining-subscription-writes", "199"),
            2 => Reply::empty(200).header("x-ms-ratelimit-remaining-subscription-writes", " 7 "),
            3 => Reply::empty(200).header("x-ms-ratelimit-remaining-subscription-writes", "bogus"),
            _ => Reply::arm_error(429, "SubscriptionRequestsThrottled", "too many writes")
                .header("retry-after", "12")
                .header("x-ms-ratelimit-remaining-subscription-writes", "0"),
        }
    })
    .await;
    let client = client(&base);
    let nrp: &dyn Nrp = &client;
    assert_eq!(
        nrp.remaining_subscription_writes(),
        None,
        "nothing seen yet"
    );
    client
        .update_services("gw", &Default::default(), opts())
        .await
        .unwrap();
    assert_eq!(nrp.remaining_subscription_writes(), Some(199));
    // A read carries no write figure: the last one stays.
    client.get_service_gateway("gw", opts()).await.unwrap();
    assert_eq!(client.remaining_subscription_writes(), Some(199));
    client
        .update_services("gw", &Default::default(), opts())
        .await
        .unwrap();
    assert_eq!(nrp.remaining_subscription_writes(), Some(7));
    // A value that does not parse is ignored.
    client
        .update_services("gw", &Default::default(), opts())
        .await
        .unwrap();
    assert_eq!(nrp.remaining_subscription_writes(), Some(7));
    // A 429 is still the typed error with its Retry-After, and its figure is kept too; clones
    // share it.
    let err = client
        .update_services("gw", &Default::default(), opts())
        .await
        .unwrap_err();
    assert!(err.is_throttling(), "{err:?}");
    assert_eq!(err.code(), "SubscriptionRequestsThrottled");
    assert_eq!(err.retry_after(), Some(Duration::from_secs(12)));
    assert_eq!(client.clone().remaining_subscription_writes(), Some(0));
}

#[tokio::test]
async fn arm_errors_are_typed() {
    let (base, _seen) = serve(|req, _| match req.path.rsplit('/').next().unwrap() {
        "dup" => Reply::arm_error(400, "DuplicateLocationsInRequest", "10.0.0.4 twice"),
        "busy" => {
            Reply::arm_error(409, "AnotherOperationInProgress", "wait").header("retry-after", "2")
        }
        "missing" => Reply::arm_error(404, "NotFound", "gone"),
        "down" => Reply::arm_error(503, "ServiceUnavailable", "later").header("retry-after", "3"),
        "proxy" => Reply::text(502, "<html>Bad Gateway</html>"),
        "denied" => Reply::arm_error(403, "AuthorizationFailed", "no role"),
        "flat" => Reply::json(
            400,
            json!({"code": "InvalidRequestFormat", "message": "flat"}),
        ),
        _ => Reply::empty(500),
    })
    .await;
    let client = client(&base);
    let err = |name: &'static str| {
        let client = client.clone();
        async move { client.get_nat_gateway(name, opts()).await.unwrap_err() }
    };

    let e = err("dup").await;
    assert_eq!(
        e,
        NrpError::Validation {
            code: "DuplicateLocationsInRequest".into(),
            message: "10.0.0.4 twice".into()
        }
    );
    assert!(!e.is_retryable());
    assert_eq!(e.metric_label(), "validation");

    let e = err("busy").await;
    assert!(matches!(&e, NrpError::Conflict { code, .. } if code == "AnotherOperationInProgress"));
    assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
    assert!(e.is_retryable() && e.is_throttling());

    let e = err("missing").await;
    assert!(matches!(&e, NrpError::NotFound { code, .. } if code == "NotFound"));

    let e = err("down").await;
    assert_eq!(
        e,
        NrpError::Server {
            status: 503,
            code: "ServiceUnavailable".into(),
            message: "later".into(),
            retry_after: Some(Duration::from_secs(3))
        }
    );
    assert!(e.is_retryable());

    let e = err("proxy").await;
    assert!(
        matches!(&e, NrpError::Server { status: 502, code, message, retry_after: None }
            if code.is_empty() && message.contains("Bad Gateway")),
        "{e:?}"
    );
    assert_eq!(e.code(), "ServerError");

    let e = err("denied").await;
    assert!(matches!(&e, NrpError::Auth { code, .. } if code == "AuthorizationFailed"));

    let e = err("flat").await;
    assert_eq!(e.code(), "InvalidRequestFormat");
}

#[tokio::test]
async fn listing_follows_next_link_across_pages() {
    for version in VERSIONS {
        listing_follows_next_link_at(version).await;
    }
}

async fn listing_follows_next_link_at(version: &'static str) {
    let (base, seen) = serve(move |req, _| {
        let page = |n: u32, next: Option<String>| {
            let mut body = json!({"value": [
                {"addressLocation": format!("10.0.{n}.1"),
                 "addresses": [{"address": format!("10.1.{n}.1"), "services": ["svc"]}]},
                {"addressLocation": format!("10.0.{n}.2"), "addresses": []},
            ]});
            if let Some(next) = next {
                body["nextLink"] = next.into();
            }
            Reply::json(200, body)
        };
        if req.query.contains("skipToken=2") {
            // A nextLink without an api-version gets the listing's own.
            page(2, Some(format!("{}{}?skipToken=3", req.origin(), req.path)))
        } else if req.query.contains("skipToken=3") {
            page(3, None)
        } else {
            page(
                1,
                Some(format!(
                    "{}{}?api-version={version}&skipToken=2",
                    req.origin(),
                    req.path
                )),
            )
        }
    })
    .await;
    let locations = client_at(&base, version)
        .list_address_locations("gw-1", opts())
        .await
        .unwrap();
    let names: Vec<_> = locations
        .iter()
        .map(|l| l.address_location.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "10.0.1.1", "10.0.1.2", "10.0.2.1", "10.0.2.2", "10.0.3.1", "10.0.3.2"
        ]
    );
    assert_eq!(locations[0].addresses[0].services, ["svc"]);
    let reqs = requests(&seen);
    assert_eq!(reqs.len(), 3);
    assert!(
        reqs[0]
            .path
            .ends_with("/serviceGateways/gw-1/addressLocations")
    );
    for r in &reqs {
        let versions: Vec<_> = r
            .query
            .split('&')
            .filter(|p| p.starts_with("api-version="))
            .collect();
        assert_eq!(versions, [format!("api-version={version}")], "{r:?}");
    }
}

#[tokio::test]
async fn the_default_api_version_is_the_newest_tested_and_unknown_ones_are_refused() {
    assert_eq!(API_VERSION, "2026-03-01");
    assert_eq!(ArmConfig::new("s", "rg").api_version, API_VERSION);
    let err = ArmClient::new(
        config("http://127.0.0.1:1").with_api_version("2024-01-01"),
        None,
    )
    .unwrap_err();
    assert_eq!(err.code(), "InvalidClientConfiguration");
    assert!(
        err.to_string().contains(
            "api-version \"2024-01-01\" is not an api-version this client is tested against \
             (supported: 2025-05-01, 2026-03-01)"
        ),
        "{err}"
    );
    let mut c = config("http://127.0.0.1:1");
    c.gateway_api_versions
        .insert("gw-old".into(), "2025-13-01".into());
    let err = ArmClient::new(c, None).unwrap_err();
    assert!(
        err.to_string()
            .contains("api-version of gateway \"gw-old\" \"2025-13-01\""),
        "{err}"
    );
}

#[tokio::test]
async fn a_gateway_can_keep_its_own_api_version() {
    let (base, seen) = serve(|_, _| Reply::json(200, json!({"value": []}))).await;
    let mut c = config(&base);
    c.gateway_api_versions
        .insert("GW-OLD".into(), "2025-05-01".into());
    let client = ArmClient::new(c, None).unwrap();
    client.list_services("gw-old", opts()).await.unwrap();
    client.list_services("gw-new", opts()).await.unwrap();
    client.find_public_ips(&["p".into()], opts()).await.unwrap();
    let queries: Vec<_> = requests(&seen).into_iter().map(|r| r.query).collect();
    assert_eq!(
        queries,
        [
            "api-version=2025-05-01",
            "api-version=2026-03-01",
            "api-version=2026-03-01"
        ]
    );
}

/// `updateServices` answered in each way the API allows, at each api-version: the client succeeds
/// and sends the call exactly once.
#[tokio::test]
async fn actions_accept_every_success_shape_at_both_api_versions() {
    type Script = fn(&Seen, usize) -> Reply;
    let shapes: [(&str, Script, usize); 5] = [
        // 2026-03-01: synchronous, ServiceGatewayActionOkResponseBody.
        ("200 with {}", |_, _| Reply::json(200, json!({})), 1),
        (
            "200 with a status",
            |_, _| Reply::json(200, json!({"status": "Succeeded"})),
            1,
        ),
        ("200 without a body", |_, _| Reply::empty(200), 1),
        // 2025-05-01: long-running, 202 + Location then 204, or 204 at once.
        (
            "202 then 204",
            |req, i| match i {
                0 => Reply::empty(202)
                    .header("location", format!("{}/operationResults/u-1", req.origin()))
                    .header("retry-after", "0"),
                1 => Reply::empty(202).header("retry-after", "0"),
                _ => Reply::empty(204),
            },
            3,
        ),
        ("204", |_, _| Reply::empty(204), 1),
    ];
    for version in VERSIONS {
        for (shape, script, calls) in shapes {
            let (base, seen) = serve(script).await;
            client_at(&base, version)
                .update_services("gw-1", &UpdateServicesRequest::default(), opts())
                .await
                .unwrap_or_else(|e| panic!("{version} {shape}: {e:?}"));
            let reqs = requests(&seen);
            assert_eq!(reqs.len(), calls, "{version} {shape}");
            assert_eq!(reqs[0].method, Method::POST);
            assert!(
                reqs[0]
                    .path
                    .ends_with("/serviceGateways/gw-1/updateServices")
            );
            assert_eq!(reqs[0].query, format!("api-version={version}"));
            assert!(reqs[1..].iter().all(|r| r.method == Method::GET));
        }
    }
}

/// A listing holding a service type this client does not know (Azure adds enum values): kept as
/// `Other`, counted, never an error; optional fields may be absent.
#[tokio::test]
async fn a_listing_with_an_unknown_service_type_keeps_it() {
    let (base, _seen) = serve(|_, _| {
        Reply::json(
            200,
            json!({"value": [
                {"name": "svc-a", "properties": {"serviceType": "Inbound",
                    "loadBalancerBackendPools": [{"id": "/x/backendAddressPools/p"}]}},
                {"name": "svc-t", "properties": {"serviceType": "Transit", "isDefault": false}},
                {"name": "svc-o", "properties": {"serviceType": "outbound",
                    "publicNatGatewayId": "/n"}},
                {"name": "svc-bare"},
                {"properties": {"serviceType": "Transit"}},
            ]}),
        )
    })
    .await;
    let client = client(&base);
    let services = client.list_services("gw-1", opts()).await.unwrap();
    let types: Vec<_> = services
        .iter()
        .map(|s| (s.name.as_str(), s.properties.service_type.clone()))
        .collect();
    assert_eq!(
        types,
        [
            ("svc-a", Some(ServiceType::Inbound)),
            ("svc-t", Some(ServiceType::Other("Transit".into()))),
            ("svc-o", Some(ServiceType::Outbound)),
            ("svc-bare", None),
            ("", Some(ServiceType::Other("Transit".into()))),
        ]
    );
    let transit = services[1].properties.service_type.as_ref().unwrap();
    assert!(!transit.is_inbound() && !transit.is_outbound());
    // Written back as it came.
    assert_eq!(serde_json::to_value(transit).unwrap(), "Transit");
    let counted = client.unknown_enum_values();
    assert_eq!(
        counted.get(&("serviceType".to_string(), "Transit".to_string())),
        Some(&2)
    );
    assert_eq!(counted.len(), 1);
    client.list_services("gw-1", opts()).await.unwrap();
    assert_eq!(
        client.unknown_enum_values()[&("serviceType".to_string(), "Transit".to_string())],
        4
    );
}

/// A credential that hands out a fixed token and records the scopes asked for.
#[derive(Debug, Default)]
struct FixedToken {
    scopes: Mutex<Vec<String>>,
    fail: bool,
}

#[async_trait::async_trait]
impl TokenCredential for FixedToken {
    async fn get_token(
        &self,
        scopes: &[&str],
        _options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        self.scopes
            .lock()
            .unwrap()
            .extend(scopes.iter().map(|s| s.to_string()));
        if self.fail {
            return Err(azure_core::Error::with_message(
                azure_core::error::ErrorKind::Credential,
                "no identity here",
            ));
        }
        let expires =
            azure_core::time::OffsetDateTime::now_utc() + azure_core::time::Duration::hours(1);
        Ok(AccessToken::new("test-token", expires))
    }
}

#[tokio::test]
async fn bearer_token_and_client_request_id_on_every_request() {
    let (base, seen) = serve(|_, _| {
        Reply::json(
            200,
            json!({"name": "gw-1", "location": "eastus", "properties": {}}),
        )
    })
    .await;
    let credential = Arc::new(FixedToken::default());
    let client = ArmClient::new(config(&base), Some(credential.clone())).unwrap();
    let gw = client.get_service_gateway("gw-1", opts()).await.unwrap();
    assert_eq!(gw.location.as_deref(), Some("eastus"));
    client.get_service_gateway("gw-1", opts()).await.unwrap();

    let reqs = requests(&seen);
    assert_eq!(reqs.len(), 2);
    let mut ids = Vec::new();
    for req in &reqs {
        assert_eq!(req.header("authorization"), Some("Bearer test-token"));
        let id = req
            .header("x-ms-client-request-id")
            .expect("client request id");
        let id = uuid::Uuid::parse_str(id).expect("a UUID");
        assert_eq!(id.get_version_num(), 4);
        ids.push(id);
    }
    assert_ne!(ids[0], ids[1], "a fresh id per request");
    assert_eq!(credential.scopes.lock().unwrap()[0], DEFAULT_TOKEN_SCOPE);
}

#[tokio::test]
async fn credential_failure_is_auth_and_sends_nothing() {
    let (base, seen) = serve(|_, _| Reply::json(200, json!({}))).await;
    let credential = Arc::new(FixedToken {
        fail: true,
        ..Default::default()
    });
    let client = ArmClient::new(config(&base), Some(credential)).unwrap();
    let err = client
        .get_service_gateway("gw-1", opts())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, NrpError::Auth { code, .. } if code == "CredentialUnavailable"),
        "{err:?}"
    );
    assert_eq!(err.metric_label(), "auth");
    assert!(requests(&seen).is_empty());
}

#[tokio::test]
async fn call_after_deadline_is_refused_before_sending() {
    let (base, seen) = serve(|_, _| Reply::json(200, json!({}))).await;
    let client = ArmClient::new(config(&base), Some(Arc::new(FixedToken::default()))).unwrap();
    let expired = CallOptions::with_deadline(Instant::now());
    let err = client
        .update_address_locations("gw-1", &one_location(), expired)
        .await
        .unwrap_err();
    assert_eq!(err, NrpError::DeadlineExceeded);
    assert!(err.is_retryable());
    assert_eq!(err.code(), "DeadlineExceeded");
    let err = client.list_services("gw-1", expired).await.unwrap_err();
    assert_eq!(err, NrpError::DeadlineExceeded);
    assert!(requests(&seen).is_empty(), "nothing reached the server");
}

#[tokio::test]
async fn polling_stops_at_the_deadline() {
    let (base, seen) = serve(|req, i| match i {
        0 => Reply::empty(202).header(
            "azure-asyncoperation",
            format!("{}/operations/slow", req.origin()),
        ),
        _ => Reply::json(200, json!({"status": "InProgress"})),
    })
    .await;
    let err = client(&base)
        .update_services(
            "gw",
            &Default::default(),
            CallOptions::with_timeout(Duration::from_millis(150)),
        )
        .await
        .unwrap_err();
    assert_eq!(err, NrpError::DeadlineExceeded);
    assert!(requests(&seen).len() >= 2, "the operation was polled");
}

#[tokio::test]
async fn a_poll_answered_with_an_error_leaves_the_operation_unconfirmed() {
    let (base, seen) = serve(|req, i| match i {
        0 => Reply::empty(202).header(
            "azure-asyncoperation",
            format!("{}/operations/op", req.origin()),
        ),
        _ => Reply::json(
            500,
            json!({"error": {"code": "InternalServerError", "message": "boom"}}),
        ),
    })
    .await;
    let err = client(&base)
        .update_services("gw", &Default::default(), opts())
        .await
        .unwrap_err();
    // The operation was accepted: it may complete whatever the poll said.
    assert!(
        matches!(&err, NrpError::Unconfirmed { code, .. } if code == "InternalServerError"),
        "{err:?}"
    );
    assert_eq!(err.code(), "OperationUnconfirmed");
    assert_eq!(err.metric_label(), "unconfirmed");
    assert!(err.is_retryable());
    assert_eq!(requests(&seen).len(), 2, "the request, then one poll");
}

#[tokio::test]
async fn connection_refused_is_a_transport_error() {
    // Bind and drop a listener to get a loopback port nobody listens on.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let client = client(&format!("http://127.0.0.1:{port}"));
    let err = client.get_public_ip("pip", opts()).await.unwrap_err();
    assert!(
        matches!(err, NrpError::Transport { timeout: false, .. }),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert_eq!(err.metric_label(), "transport");
    let err = client.get_public_ip("", opts()).await.unwrap_err();
    assert!(matches!(err, NrpError::Validation { .. }), "{err:?}");
}

#[tokio::test]
async fn a_public_ip_is_read_in_another_resource_group() {
    let (base, seen) = serve(|req, _| {
        if req.path.contains("/resourceGroups/rg-other/") && req.path.ends_with("/pip-brought") {
            Reply::json(
                200,
                json!({"name": "pip-brought", "sku": {"name": "StandardV2"},
                       "properties": {"ipAddress": "20.1.2.3", "publicIPAllocationMethod": "Static",
                       "ipConfiguration": {"id": "/x/frontendIPConfigurations/f"}}}),
            )
        } else {
            Reply::arm_error(404, "ResourceNotFound", "no")
        }
    })
    .await;
    let client = client(&base);
    let pip = client
        .get_public_ip_in("rg-other", "pip-brought", opts())
        .await
        .unwrap();
    assert_eq!(pip.properties.ip_address.as_deref(), Some("20.1.2.3"));
    assert_eq!(
        pip.properties.ip_configuration.map(|c| c.id),
        Some("/x/frontendIPConfigurations/f".to_string())
    );
    let missing = client
        .get_public_ip_in("rg-1", "pip-brought", opts())
        .await
        .unwrap_err();
    assert!(matches!(missing, NrpError::NotFound { .. }), "{missing:?}");
    let empty = client.get_public_ip_in("", "pip-brought", opts()).await;
    assert!(
        matches!(&empty, Err(NrpError::Validation { code, .. }) if code == "InvalidResourceName"),
        "{empty:?}"
    );
    let reqs = requests(&seen);
    assert_eq!(reqs.len(), 2, "nothing is sent for an empty resource group");
    assert_eq!(
        reqs[0].path,
        "/subscriptions/sub-1/resourceGroups/rg-other/providers/Microsoft.Network/publicIPAddresses/pip-brought"
    );
    assert_eq!(reqs[0].method, Method::GET);
}

#[tokio::test]
async fn a_public_ip_is_found_by_its_address_across_pages() {
    let (base, seen) = serve(|req, _| {
        let pip = |name: &str, ip: &str| json!({"name": name, "properties": {"ipAddress": ip}});
        if req.query.contains("skipToken=2") {
            Reply::json(
                200,
                json!({"value": [pip("c", "2001:db8:c1b::7"), pip("d", "20.0.0.4")]}),
            )
        } else {
            Reply::json(
                200,
                json!({"value": [pip("a", "20.0.0.1"), {"name": "b", "properties": {}}],
                       "nextLink": format!("{}{}?api-version=2026-03-01&skipToken=2", req.origin(), req.path)}),
            )
        }
    })
    .await;
    let client = client(&base);
    let found = client
        .find_public_ip_by_address("2001:DB8:C1B:0::7", opts())
        .await
        .unwrap();
    assert_eq!(found.and_then(|p| p.name).as_deref(), Some("c"));
    let found = client
        .find_public_ip_by_address(" 20.0.0.1", opts())
        .await
        .unwrap();
    assert_eq!(found.and_then(|p| p.name).as_deref(), Some("a"));
    assert_eq!(
        client
            .find_public_ip_by_address("20.0.0.9", opts())
            .await
            .unwrap(),
        None
    );
    let sent = requests(&seen).len();
    assert_eq!(
        client
            .find_public_ip_by_address("not-an-ip", opts())
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        requests(&seen).len(),
        sent,
        "nothing is listed for a non-address"
    );
    let reqs = requests(&seen);
    assert_eq!(reqs[0].path, format!("{RG}/publicIPAddresses"));
}
