//! One HTTP exchange with ARM and the conventions around it: bearer token, client request id, deadline,
//! error bodies, `Retry-After`, long-running operations and `nextLink` paging.

use std::time::{Duration, Instant};

use reqwest::header::{self, HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tracing::{debug, warn};

use super::ArmClient;
use crate::wire::Page;
use crate::{CallOptions, NrpError};

/// Header carrying the id the client gives each request (echoed in ARM logs).
const CLIENT_REQUEST_ID: &str = "x-ms-client-request-id";
/// Upper bound of a `Retry-After` taken from a response (a bogus value must not park work for days).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// Upper bound of the pages of one listing (a server looping on `nextLink` must not hang a worker).
const MAX_PAGES: usize = 100_000;
/// How much of a non-JSON error body ends up in an error message.
const MAX_BODY_IN_MESSAGE: usize = 300;

/// A response read to the end.
#[derive(Debug)]
pub(super) struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// What the result of a long-running operation is, once it has succeeded (ARM `final-state-via`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FinalState {
    /// GET the URL of the original request (PUT).
    OriginalUri,
    /// GET the `Location` of the original response, if it had one (POST actions).
    Location,
    /// Nothing to fetch (DELETE).
    Nothing,
}

/// An error body: `{"error":{"code","message"}}`, tolerating the flat `{"code","message"}` some services
/// send and missing fields.
#[derive(Debug, Default, Deserialize)]
struct ErrorEnvelope {
    #[serde(default)]
    error: Option<ErrorDetail>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct ErrorDetail {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// The body of an `Azure-AsyncOperation` status resource, read leniently: any status other than the
/// terminal ones (`Succeeded`, `Failed`, `Canceled`) counts as still running.
#[derive(Debug, Deserialize)]
struct OperationStatusBody {
    status: String,
    #[serde(default)]
    error: Option<ErrorDetail>,
}

/// How `properties.provisioningState` of a resource body reads.
#[derive(Debug, Default, Deserialize)]
struct ProvisioningBody {
    #[serde(default)]
    properties: Option<ProvisioningProperties>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProvisioningProperties {
    #[serde(default)]
    provisioning_state: Option<String>,
}

/// Outcome of a status string of a long-running operation.
enum OpState {
    Running,
    Succeeded,
    Failed(String),
}

fn op_state(status: &str) -> OpState {
    match status.to_ascii_lowercase().as_str() {
        "succeeded" => OpState::Succeeded,
        "failed" => OpState::Failed("Failed".into()),
        "canceled" | "cancelled" => OpState::Failed("Canceled".into()),
        _ => OpState::Running,
    }
}

/// The delay a response asks for: `retry-after-ms` / `x-ms-retry-after-ms` (milliseconds), else
/// `Retry-After` (delta-seconds or an HTTP date), capped at an hour.
pub(super) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    for name in ["retry-after-ms", "x-ms-retry-after-ms"] {
        if let Some(ms) = text(name).and_then(|v| v.parse::<u64>().ok()) {
            return Some(Duration::from_millis(ms).min(MAX_RETRY_AFTER));
        }
    }
    let value = text("retry-after")?;
    let delay = if let Ok(secs) = value.parse::<u64>() {
        Duration::from_secs(secs)
    } else if let Ok(secs) = value.parse::<f64>() {
        Duration::try_from_secs_f64(secs).ok()?
    } else {
        let at = azure_core::time::parse_rfc7231(value).ok()?;
        let left = at - azure_core::time::OffsetDateTime::now_utc();
        Duration::try_from(left).unwrap_or(Duration::ZERO)
    };
    Some(delay.min(MAX_RETRY_AFTER))
}

/// The remaining writes a response's headers carry (`None`: absent or not a number).
pub(super) fn remaining_writes(headers: &HeaderMap) -> Option<u32> {
    let v = headers
        .get(super::REMAINING_WRITES_HEADER)?
        .to_str()
        .ok()?
        .trim();
    // A value beyond u32 (never seen) is kept as the largest.
    v.parse::<u64>()
        .ok()
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// Maps a non-success response to the typed error.
pub(super) fn error_from_response(resp: &Response) -> NrpError {
    let status = resp.status;
    let (code, message) = match serde_json::from_slice::<ErrorEnvelope>(&resp.body) {
        Ok(env) => match env.error {
            Some(detail) => (detail.code, detail.message),
            None => (
                env.code.unwrap_or_default(),
                env.message.unwrap_or_default(),
            ),
        },
        Err(_) => (String::new(), body_excerpt(&resp.body)),
    };
    let message = if message.is_empty() {
        status.canonical_reason().unwrap_or("").to_string()
    } else {
        message
    };
    let retry_after = retry_after(&resp.headers);
    match status.as_u16() {
        429 => NrpError::Throttled {
            code,
            message,
            retry_after,
        },
        409 => NrpError::Conflict {
            code,
            message,
            retry_after,
        },
        404 => NrpError::NotFound { code, message },
        401 | 403 => NrpError::Auth { code, message },
        400..=499 => NrpError::Validation { code, message },
        s => NrpError::Server {
            status: s,
            code,
            message,
            retry_after,
        },
    }
}

fn body_excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(MAX_BODY_IN_MESSAGE) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

fn invalid_body(status: StatusCode, err: serde_json::Error) -> NrpError {
    NrpError::Server {
        status: status.as_u16(),
        code: "InvalidResponseBody".into(),
        message: format!("response body does not parse: {err}"),
        retry_after: None,
    }
}

/// The message of an error and of its sources.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

/// `opts` with its deadline lowered to `now + limit`.
fn bounded(opts: CallOptions, limit: Duration) -> CallOptions {
    let cap = Instant::now() + limit;
    CallOptions {
        deadline: Some(opts.deadline.map_or(cap, |d| d.min(cap))),
    }
}

impl ArmClient {
    /// Whether `url` is on the configured endpoint (only there does the bearer token go).
    fn same_origin(&self, url: &Url) -> bool {
        url.scheme() == self.base.scheme()
            && url.host_str() == self.base.host_str()
            && url.port_or_known_default() == self.base.port_or_known_default()
    }

    /// A bearer token, if a credential is configured; acquisition is bounded by the deadline.
    async fn token(&self, opts: CallOptions) -> Result<Option<String>, NrpError> {
        let Some(credential) = &self.credential else {
            return Ok(None);
        };
        let limit = opts.remaining()?.map_or(self.config.request_timeout, |r| {
            r.min(self.config.request_timeout)
        });
        let scopes = [self.config.token_scope.as_str()];
        match tokio::time::timeout(limit, credential.get_token(&scopes, None)).await {
            Err(_) if opts.expired() => Err(NrpError::DeadlineExceeded),
            Err(_) => Err(NrpError::Auth {
                code: "CredentialUnavailable".into(),
                message: format!("no token within {limit:?}"),
            }),
            Ok(Err(err)) => Err(NrpError::Auth {
                code: "CredentialUnavailable".into(),
                message: error_chain(&err),
            }),
            Ok(Ok(token)) => Ok(Some(token.token.secret().to_string())),
        }
    }

    /// Sends one request and reads its response, whatever its status. Refuses with `DeadlineExceeded`
    /// before sending when the deadline has passed; the request timeout is bounded by the deadline.
    /// A GET (idempotent) is sent once more after a transport error other than a timeout.
    pub(super) async fn send(
        &self,
        method: Method,
        url: &Url,
        body: Option<&[u8]>,
        opts: CallOptions,
    ) -> Result<Response, NrpError> {
        let attempts = if method == Method::GET { 2 } else { 1 };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let token = self.token(opts).await?;
            // Checked after token acquisition, which may have taken a while: nothing leaves once the
            // deadline has passed, and the request cannot outlive it.
            let remaining = opts.remaining()?;
            let timeout = remaining.map_or(self.config.request_timeout, |r| {
                r.min(self.config.request_timeout)
            });
            let request_id = uuid::Uuid::new_v4().to_string();
            let mut request = self
                .http
                .request(method.clone(), url.clone())
                .timeout(timeout)
                .header(CLIENT_REQUEST_ID, &request_id)
                .header(header::ACCEPT, HeaderValue::from_static("application/json"));
            if let Some(token) = token.filter(|_| self.same_origin(url)) {
                request = request.bearer_auth(token);
            }
            if let Some(body) = body {
                request = request
                    .header(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    )
                    .body(body.to_vec());
            }
            let started = Instant::now();
            let result = match request.send().await {
                Ok(resp) => {
                    let status = resp.status();
                    let headers = resp.headers().clone();
                    resp.bytes().await.map(|body| Response {
                        status,
                        headers,
                        body: body.to_vec(),
                    })
                }
                Err(err) => Err(err),
            };
            match result {
                Ok(resp) => {
                    if method != Method::GET {
                        self.note_remaining_writes(&resp.headers);
                    }
                    debug!(
                        %method,
                        path = url.path(),
                        status = resp.status.as_u16(),
                        client_request_id = %request_id,
                        arm_request_id = resp.headers.get("x-ms-request-id").and_then(|v| v.to_str().ok()),
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "ARM request"
                    );
                    return Ok(resp);
                }
                Err(err) => {
                    let timeout = err.is_timeout();
                    let message = error_chain(&err);
                    warn!(%method, path = url.path(), client_request_id = %request_id, timeout, error = %message, "ARM request failed");
                    if timeout && opts.expired() {
                        return Err(NrpError::DeadlineExceeded);
                    }
                    if timeout || attempt >= attempts {
                        return Err(NrpError::Transport { message, timeout });
                    }
                }
            }
        }
    }

    /// GET `url` and parse its JSON body (any non-2xx status is an error).
    pub(super) async fn get_json<T: DeserializeOwned>(
        &self,
        url: &Url,
        opts: CallOptions,
    ) -> Result<T, NrpError> {
        let resp = self.send(Method::GET, url, None, opts).await?;
        if !resp.status.is_success() {
            return Err(error_from_response(&resp));
        }
        serde_json::from_slice(&resp.body).map_err(|e| invalid_body(resp.status, e))
    }

    /// GET every page of a listing, following `nextLink` to the end.
    pub(super) async fn list_all<T: DeserializeOwned>(
        &self,
        url: Url,
        opts: CallOptions,
    ) -> Result<Vec<T>, NrpError> {
        let mut items = Vec::new();
        // A nextLink without an api-version gets the listing's own.
        let api_version = url
            .query_pairs()
            .find(|(k, _)| k == "api-version")
            .map_or_else(|| self.config.api_version.clone(), |(_, v)| v.into_owned());
        let mut next = Some(url);
        let mut pages = 0;
        while let Some(url) = next.take() {
            pages += 1;
            if pages > MAX_PAGES {
                return Err(NrpError::Server {
                    status: 200,
                    code: "TooManyPages".into(),
                    message: format!("listing did not end after {MAX_PAGES} pages"),
                    retry_after: None,
                });
            }
            let page: Page<T> = self.get_json(&url, opts).await?;
            items.extend(page.value);
            if let Some(link) = page.next_link.filter(|l| !l.trim().is_empty()) {
                let mut link = url.join(link.trim()).map_err(|e| NrpError::Server {
                    status: 200,
                    code: "InvalidNextLink".into(),
                    message: format!("nextLink {link:?} is not a URL: {e}"),
                    retry_after: None,
                })?;
                if !link.query_pairs().any(|(k, _)| k == "api-version") {
                    link.query_pairs_mut()
                        .append_pair("api-version", &api_version);
                }
                if link == url {
                    return Err(NrpError::Server {
                        status: 200,
                        code: "InvalidNextLink".into(),
                        message: "nextLink points at the page itself".into(),
                        retry_after: None,
                    });
                }
                next = Some(link);
            }
        }
        Ok(items)
    }

    /// Runs a mutating request as an ARM long-running operation and returns the final body, if any.
    /// A DELETE of a resource that does not exist succeeds. The mutating request itself is sent at most
    /// once; only polls are repeated (each bounded by the deadline and by `operation_timeout`).
    pub(super) async fn long_running(
        &self,
        method: Method,
        url: &Url,
        body: Option<&[u8]>,
        opts: CallOptions,
        final_state: FinalState,
    ) -> Result<Option<Vec<u8>>, NrpError> {
        let resp = self.send(method.clone(), url, body, opts).await?;
        if method == Method::DELETE && resp.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !resp.status.is_success() {
            return Err(error_from_response(&resp));
        }
        // Accepted: from here on, a failure to follow the operation leaves its outcome unknown.
        self.follow(method, url, resp, opts, final_state)
            .await
            .map_err(unconfirmed)
    }

    /// Follows an accepted long-running operation (`resp` is the answer to the mutating request) to
    /// its end and returns the final body, if any.
    async fn follow(
        &self,
        method: Method,
        url: &Url,
        resp: Response,
        opts: CallOptions,
        final_state: FinalState,
    ) -> Result<Option<Vec<u8>>, NrpError> {
        let poll_opts = bounded(opts, self.config.operation_timeout);
        let header_url = |name: &str| {
            resp.headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| url.join(v.trim()).ok())
        };
        let async_operation = header_url("azure-asyncoperation");
        let location = header_url(header::LOCATION.as_str());
        let first_delay = retry_after(&resp.headers);

        if let Some(operation) = async_operation {
            self.poll_async_operation(&operation, first_delay, poll_opts)
                .await?;
            return match (final_state, location) {
                (FinalState::OriginalUri, _) => {
                    let done = self.send(Method::GET, url, None, poll_opts).await?;
                    if !done.status.is_success() {
                        return Err(error_from_response(&done));
                    }
                    Ok(non_empty(done))
                }
                (FinalState::Location, Some(location)) => {
                    self.poll_location(location, Some(Duration::ZERO), poll_opts)
                        .await
                }
                _ => Ok(None),
            };
        }
        if resp.status == StatusCode::ACCEPTED {
            return match location {
                Some(location) => self.poll_location(location, first_delay, poll_opts).await,
                None => {
                    warn!(%method, path = url.path(), "202 Accepted without Azure-AsyncOperation or Location: cannot track the operation");
                    Ok(None)
                }
            };
        }
        if final_state == FinalState::OriginalUri && provisioning_running(&resp.body) {
            return self
                .poll_provisioning_state(url, first_delay, poll_opts)
                .await;
        }
        Ok(non_empty(resp))
    }

    /// Sleeps before the next poll: the server's `Retry-After`, else the configured interval, capped.
    /// Returns `DeadlineExceeded` at once when the poll would come after the deadline.
    async fn wait_before_poll(
        &self,
        delay: Option<Duration>,
        opts: CallOptions,
    ) -> Result<(), NrpError> {
        let delay = delay
            .unwrap_or(self.config.poll_interval)
            .min(self.config.max_poll_interval);
        if let Some(remaining) = opts.remaining()?
            && delay >= remaining
        {
            return Err(NrpError::DeadlineExceeded);
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Ok(())
    }

    async fn poll_async_operation(
        &self,
        operation: &Url,
        mut delay: Option<Duration>,
        opts: CallOptions,
    ) -> Result<(), NrpError> {
        loop {
            self.wait_before_poll(delay, opts).await?;
            let resp = self.send(Method::GET, operation, None, opts).await?;
            if !resp.status.is_success() {
                return Err(error_from_response(&resp));
            }
            let body: OperationStatusBody =
                serde_json::from_slice(&resp.body).map_err(|e| invalid_body(resp.status, e))?;
            match op_state(&body.status) {
                OpState::Succeeded => return Ok(()),
                OpState::Failed(status) => {
                    let error = body.error.unwrap_or_default();
                    return Err(NrpError::OperationFailed {
                        status,
                        code: error.code,
                        message: error.message,
                    });
                }
                OpState::Running => delay = retry_after(&resp.headers),
            }
        }
    }

    async fn poll_location(
        &self,
        mut location: Url,
        mut delay: Option<Duration>,
        opts: CallOptions,
    ) -> Result<Option<Vec<u8>>, NrpError> {
        loop {
            self.wait_before_poll(delay, opts).await?;
            let resp = self.send(Method::GET, &location, None, opts).await?;
            if resp.status == StatusCode::ACCEPTED {
                delay = retry_after(&resp.headers);
                if let Some(next) = resp
                    .headers
                    .get(header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| location.join(v.trim()).ok())
                {
                    location = next;
                }
                continue;
            }
            if !resp.status.is_success() {
                return Err(error_from_response(&resp));
            }
            return Ok(non_empty(resp));
        }
    }

    async fn poll_provisioning_state(
        &self,
        url: &Url,
        mut delay: Option<Duration>,
        opts: CallOptions,
    ) -> Result<Option<Vec<u8>>, NrpError> {
        loop {
            self.wait_before_poll(delay, opts).await?;
            let resp = self.send(Method::GET, url, None, opts).await?;
            if !resp.status.is_success() {
                return Err(error_from_response(&resp));
            }
            let state = provisioning_state(&resp.body).unwrap_or_else(|| "Succeeded".into());
            match op_state(&state) {
                OpState::Succeeded => return Ok(non_empty(resp)),
                OpState::Failed(status) => {
                    return Err(NrpError::OperationFailed {
                        status,
                        code: "ProvisioningFailed".into(),
                        message: format!("provisioningState is {state}"),
                    });
                }
                OpState::Running => delay = retry_after(&resp.headers),
            }
        }
    }
}

/// An error met while following an accepted operation: one that answers for the operation itself
/// (it failed, or the poll could not tell: a timeout, the deadline) is kept; an error answer to a
/// poll says nothing of the operation, whose outcome is then unknown.
fn unconfirmed(e: NrpError) -> NrpError {
    match e {
        NrpError::Throttled { code, message, .. }
        | NrpError::Conflict { code, message, .. }
        | NrpError::NotFound { code, message }
        | NrpError::Validation { code, message }
        | NrpError::Auth { code, message }
        | NrpError::Server { code, message, .. } => NrpError::Unconfirmed { code, message },
        e => e,
    }
}

fn non_empty(resp: Response) -> Option<Vec<u8>> {
    (!resp.body.iter().all(u8::is_ascii_whitespace)).then_some(resp.body)
}

fn provisioning_state(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<ProvisioningBody>(body)
        .ok()?
        .properties?
        .provisioning_state
}

/// Whether a resource body says its provisioning is still under way (`Creating`, `Updating`, …).
fn provisioning_running(body: &[u8]) -> bool {
    provisioning_state(body).is_some_and(|s| matches!(op_state(&s), OpState::Running))
}
