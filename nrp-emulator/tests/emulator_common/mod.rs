//! Helpers shared by the emulator integration tests: a tiny HTTP client over loopback.
#![allow(dead_code)]

use clb_nrp::wire::{API_VERSION, OperationState, OperationStatus, ResourceId, ResourceKind};
use clb_nrp_emulator::{Emulator, EmulatorConfig, RunningEmulator};
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

pub const SUB: &str = "sub1";
pub const RG: &str = "rg1";

pub fn id(kind: ResourceKind, name: &str) -> ResourceId {
    ResourceId::new(SUB, RG, kind, name)
}

pub fn gw(name: &str) -> ResourceId {
    id(ResourceKind::ServiceGateway, name)
}

/// A response: status, headers, JSON body (`Null` when empty or not JSON).
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Resp {
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }
}

pub struct Harness {
    pub server: RunningEmulator,
    pub http: reqwest::Client,
}

impl Harness {
    pub async fn start(config: EmulatorConfig) -> Self {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let emulator = Emulator::new(config).expect("valid config");
        let server = RunningEmulator::start(emulator)
            .await
            .expect("bind loopback");
        Self {
            server,
            http: reqwest::Client::new(),
        }
    }

    pub fn emu(&self) -> &Emulator {
        self.server.emulator()
    }

    pub fn url(&self, rid: &ResourceId, sub: Option<&str>) -> String {
        rid.url(&self.server.base_url(), sub)
    }

    pub async fn raw(&self, method: Method, url: &str, body: Option<Vec<u8>>) -> Resp {
        let mut req = self.http.request(method, url);
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.expect("body");
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Resp {
            status,
            headers,
            body,
        }
    }

    pub async fn call(&self, method: Method, url: &str, body: Option<Value>) -> Resp {
        let bytes = body.map(|b| serde_json::to_vec(&b).expect("json"));
        self.raw(method, url, bytes).await
    }

    pub async fn put(&self, rid: &ResourceId, body: Value) -> Resp {
        self.call(Method::PUT, &self.url(rid, None), Some(body))
            .await
    }

    pub async fn get(&self, rid: &ResourceId, sub: Option<&str>) -> Resp {
        self.call(Method::GET, &self.url(rid, sub), None).await
    }

    pub async fn delete(&self, rid: &ResourceId) -> Resp {
        self.call(Method::DELETE, &self.url(rid, None), None).await
    }

    pub async fn post(&self, rid: &ResourceId, action: &str, body: Value) -> Resp {
        self.call(Method::POST, &self.url(rid, Some(action)), Some(body))
            .await
    }

    /// PUTs the service gateway `g` (location `eastus`): a gateway exists only once it is PUT. In
    /// long-running-operation mode, waits for the operation.
    pub async fn create_gateway(&self, g: &ResourceId) {
        let r = self.put(g, json!({"location": "eastus"})).await;
        assert!(r.status.is_success(), "{r:?}");
        if let Some(status_url) = r.header("azure-asyncoperation") {
            let st = self.wait_for_operation(&status_url).await;
            assert_eq!(st.status, OperationState::Succeeded, "{st:?}");
        }
    }

    /// Polls the `Azure-AsyncOperation` URL `status_url` until the operation ends.
    pub async fn wait_for_operation(&self, status_url: &str) -> OperationStatus {
        loop {
            let r = self.call(Method::GET, status_url, None).await;
            assert_eq!(r.status, StatusCode::OK, "{r:?}");
            let st: OperationStatus = serde_json::from_value(r.body).unwrap();
            if st.status.is_terminal() {
                return st;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// `POST {g}/{action}` at api-version `version`.
    pub async fn post_at(&self, g: &ResourceId, action: &str, body: Value, version: &str) -> Resp {
        let url = g.url_at(&self.server.base_url(), Some(action), version);
        self.call(Method::POST, &url, Some(body)).await
    }

    pub async fn control(&self, method: Method, path: &str, body: Option<Value>) -> Resp {
        let url = format!("{}/_emulator/{path}", self.server.base_url());
        self.call(method, &url, body).await
    }

    /// Creates PIP `{name}-pip`, LB `{name}` (frontend `fe`, pool `pool`, TCP 80 → 8080) and returns
    /// the backend pool id.
    pub async fn create_lb(&self, name: &str) -> String {
        self.create_lb_of(name, Some("IPv4")).await
    }

    /// A load balancer `name` with one backend pool; with `version`, one rule (tcp 80 → 8080) to
    /// it from a frontend on a public IP of that version; without, no frontend and no rule.
    /// Returns the pool's id.
    pub async fn create_lb_of(&self, name: &str, version: Option<&str>) -> String {
        let lb = id(ResourceKind::LoadBalancer, name);
        let fe = lb.frontend_ip_configuration_id("fe");
        let pool = lb.backend_pool_id("pool");
        let mut properties = json!({"backendAddressPools": [{"name": "pool"}]});
        if let Some(version) = version {
            let pip = id(ResourceKind::PublicIpAddress, &format!("{name}-pip"));
            let r = self
                .put(
                    &pip,
                    json!({"location": "eastus", "sku": {"name": "Standard"},
                           "properties": {"publicIPAddressVersion": version}}),
                )
                .await;
            assert!(r.status.is_success(), "{r:?}");
            properties["frontendIPConfigurations"] =
                json!([{"name": "fe", "properties": {"publicIPAddress": {"id": pip.to_string()}}}]);
            properties["loadBalancingRules"] = json!([{"name": "tcp-80", "properties": {
                "frontendIPConfiguration": {"id": fe},
                "backendAddressPool": {"id": pool},
                "protocol": "Tcp", "frontendPort": 80, "backendPort": 8080}}]);
        }
        let r = self
            .put(&lb, json!({"location": "eastus", "properties": properties}))
            .await;
        assert!(r.status.is_success(), "{r:?}");
        pool
    }

    pub async fn register_inbound(&self, g: &ResourceId, service: &str) {
        self.register_inbound_of(g, service, Some("IPv4")).await;
    }

    /// Registers inbound `service` with the pool of a load balancer of [`Harness::create_lb_of`].
    pub async fn register_inbound_of(&self, g: &ResourceId, service: &str, version: Option<&str>) {
        let pool = self.create_lb_of(&format!("lb-{service}"), version).await;
        let r = self
            .post(
                g,
                "updateServices",
                json!({"action": "PartialUpdate", "serviceRequests": [{"isDelete": false, "service": {
                    "name": service,
                    "properties": {"serviceType": "Inbound", "loadBalancerBackendPools": [{"id": pool}]}}}]}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
    }

    pub async fn update_locations(&self, g: &ResourceId, body: Value) -> Resp {
        self.post(g, "updateAddressLocations", body).await
    }
}

/// One location entry of an `updateAddressLocations` body.
pub fn loc(location: &str, action: &str, addresses: &[(&str, &[&str])]) -> Value {
    json!({
        "addressLocation": location,
        "addressUpdateAction": action,
        "addresses": addresses.iter().map(|(a, s)| json!({"address": a, "services": s})).collect::<Vec<_>>(),
    })
}

pub fn partial(locations: Vec<Value>) -> Value {
    json!({"action": "PartialUpdate", "addressLocations": locations})
}

pub fn api_version() -> &'static str {
    API_VERSION
}
