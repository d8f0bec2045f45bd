//! The HTTP front: ARM routes (served through one fallback handler that routes ARM paths itself,
//! case-insensitively as ARM does) and the `/_emulator/*` control endpoints.

use std::time::Duration;

use axum::body::{Body, Bytes, to_bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::sync::watch;

use crate::budget::{BudgetConfig, REMAINING_WRITES_HEADER, Take};
use crate::config::{EmulatorConfig, ThrottleResponse};
use crate::error::EmulatorError;
use crate::faults::{Fault, latency};
use crate::ops::{
    Applied, Mutation, Op, Route, Target, check_api_version, parse_op, parse_query, route,
};
use crate::{Emulator, lock};
use clb_nrp::wire::{ApiVersion, PROVIDER};

#[derive(Clone)]
pub(crate) struct AppState {
    pub emu: Emulator,
    pub shutdown: watch::Receiver<bool>,
}

/// The emulator's router.
pub(crate) fn router(emu: Emulator, shutdown: watch::Receiver<bool>) -> Router {
    Router::new()
        .route("/_emulator/stats", get(stats))
        .route("/_emulator/dump", get(dump))
        .route("/_emulator/removals", get(removals))
        .route("/_emulator/config", get(get_config).put(put_config))
        .route("/_emulator/reset-stats", post(reset_stats))
        .route("/_emulator/reset", post(reset))
        .fallback(arm)
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(AppState { emu, shutdown })
}

async fn stats(State(st): State<AppState>) -> Response {
    Json(st.emu.stats()).into_response()
}

async fn dump(State(st): State<AppState>) -> Response {
    Json(st.emu.dump()).into_response()
}

async fn removals(State(st): State<AppState>) -> Response {
    Json(st.emu.removals()).into_response()
}

async fn get_config(State(st): State<AppState>) -> Response {
    Json(st.emu.config()).into_response()
}

async fn put_config(State(st): State<AppState>, body: Bytes) -> Response {
    let cfg: EmulatorConfig = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => return EmulatorError::MalformedBody(e.to_string()).into_response(),
    };
    match st.emu.set_config(cfg) {
        Ok(()) => Json(st.emu.config()).into_response(),
        Err(e) => {
            EmulatorError::bad_request("InvalidEmulatorConfig", e.to_string()).into_response()
        }
    }
}

async fn reset_stats(State(st): State<AppState>) -> StatusCode {
    st.emu.reset_stats();
    StatusCode::NO_CONTENT
}

async fn reset(State(st): State<AppState>) -> StatusCode {
    st.emu.reset();
    StatusCode::NO_CONTENT
}

/// Every ARM call goes through here.
async fn arm(
    State(st): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let mut operation = "Unknown";
    let mut remaining_writes = None;
    let mut resp = match handle(
        &st,
        &method,
        &uri,
        &headers,
        body,
        &mut operation,
        &mut remaining_writes,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(%method, path = uri.path(), code = e.code(), "rejected: {e}");
            lock(&st.emu.inner.stats).record_rejection(e.code());
            e.into_response()
        }
    };
    if let Some(n) = remaining_writes {
        resp.headers_mut()
            .insert(REMAINING_WRITES_HEADER, HeaderValue::from(n));
    }
    lock(&st.emu.inner.stats).record_call(operation, resp.status().as_u16());
    resp
}

/// The subscription a route names (`None` for operation polls, which are reads).
fn subscription_of(route: &Route) -> Option<&str> {
    match &route.target {
        Target::Resource(id) | Target::Gateway(id, _) => Some(&id.subscription),
        Target::PublicIps(sub, _) | Target::LoadBalancers(sub, _) | Target::Gateways(sub, _) => {
            Some(sub)
        }
        Target::OperationStatus(_) | Target::OperationResult(_) => None,
    }
}

/// Takes one write from the budget of the subscription of a mutating call (when a budget is
/// configured): `Ok(Some(remaining))` when granted, the `429` when the budget is spent; `remaining`
/// also says what the answer's header carries.
fn take_write(
    st: &AppState,
    route: &Route,
    cfg: &EmulatorConfig,
    remaining: &mut Option<u32>,
) -> Result<(), EmulatorError> {
    let budget = BudgetConfig::of(cfg);
    if !budget.is_on() || route.method == Method::GET {
        return Ok(());
    }
    let Some(sub) = subscription_of(route) else {
        return Ok(());
    };
    let now = tokio::time::Instant::now().into_std();
    let taken = lock(&st.emu.inner.budgets).take(sub, budget, now);
    match taken {
        None => Ok(()),
        Some(Take::Granted { remaining: n }) => {
            *remaining = Some(n);
            Ok(())
        }
        Some(Take::Throttled {
            remaining: n,
            retry_after_secs,
            by,
        }) => {
            *remaining = Some(n);
            lock(&st.emu.inner.stats).throttled_by_write_budget += 1;
            Err(EmulatorError::SubscriptionRequestsThrottled {
                subscription: sub.to_string(),
                budget: by.as_str(),
                retry_after_secs,
            })
        }
    }
}

/// Sleeps for `d` unless the server shuts down first (then fails with 503).
async fn pause(st: &AppState, d: Duration) -> Result<(), EmulatorError> {
    pause_until(st, tokio::time::Instant::now() + d).await
}

/// Sleeps until `deadline` unless the server shuts down first (then fails with 503).
async fn pause_until(st: &AppState, deadline: tokio::time::Instant) -> Result<(), EmulatorError> {
    if deadline <= tokio::time::Instant::now() {
        return Ok(());
    }
    let mut rx = st.shutdown.clone();
    tokio::select! {
        () = tokio::time::sleep_until(deadline) => Ok(()),
        signalled = async { rx.wait_for(|down| *down).await.is_ok() } => {
            if signalled {
                return Err(EmulatorError::ShuttingDown);
            }
            // No shutdown signal any more (router used without `serve`): just wait.
            tokio::time::sleep_until(deadline).await;
            Ok(())
        }
    }
}

fn base_url(headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_graphic()))
        .unwrap_or("localhost");
    format!("http://{host}")
}

async fn handle(
    st: &AppState,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
    operation: &mut &'static str,
    remaining_writes: &mut Option<u32>,
) -> Result<Response, EmulatorError> {
    // A call's latency counts from its arrival: reading and parsing its body are part of it, as
    // they are of Azure's (on a loaded machine they would otherwise be added to the model).
    let arrived = tokio::time::Instant::now();
    let query = parse_query(uri.query());
    let route = route(method, uri.path())?;
    *operation = route.operation;
    let cfg = st.emu.config();
    // ARM throttles before anything else looks at the request.
    take_write(st, &route, &cfg, remaining_writes)?;
    let version = check_api_version(&query)?;
    let base = base_url(headers);
    let call = Call {
        base: &base,
        uri,
        version,
        arrived,
    };
    match &route.target {
        Target::OperationStatus(id) => return operation_status(st, id),
        Target::OperationResult(id) => return operation_result(st, &call, id, &cfg),
        _ => {}
    }
    let body = to_bytes(body, cfg.max_body_bytes)
        .await
        .map_err(|_| EmulatorError::BodyTooLarge(cfg.max_body_bytes))?;
    let mutating = *method != Method::GET;
    if mutating {
        lock(&st.emu.inner.stats).mutating_calls += 1;
    }
    let op = parse_op(&route, &query, &body)?;
    let fault = if mutating || cfg.faults_on_reads {
        lock(&st.emu.inner.faults).draw(&cfg)
    } else {
        None
    };
    match fault {
        Some(f) => inject(st, f, &route, op, &cfg, &call).await,
        None => execute(st, &route, op, &cfg, &call).await,
    }
}

/// What an answer depends on besides the operation: the base URL the client used (for `nextLink` and
/// operation URLs), the request URI and its api-version.
struct Call<'a> {
    base: &'a str,
    uri: &'a Uri,
    version: ApiVersion,
    /// When the request arrived: its latency counts from then.
    arrived: tokio::time::Instant,
}

impl Call<'_> {
    /// `{base}{path}?api-version={version}` plus `extra` query parameters.
    fn url(&self, path: &str, extra: &str) -> String {
        format!(
            "{}{path}?api-version={}{extra}",
            self.base,
            self.version.as_str()
        )
    }
}

async fn inject(
    st: &AppState,
    fault: Fault,
    route: &Route,
    op: Op,
    cfg: &EmulatorConfig,
    call: &Call<'_>,
) -> Result<Response, EmulatorError> {
    let kind = match fault {
        Fault::Timeout => "timeout".to_string(),
        Fault::ServerError(s) => s.to_string(),
        Fault::TooManyRequests => "429".to_string(),
        Fault::Conflict => "409".to_string(),
    };
    lock(&st.emu.inner.stats).record_fault(&kind);
    match fault {
        Fault::TooManyRequests => Err(EmulatorError::TooManyRequests {
            scope: "injected".into(),
            retry_after_secs: cfg.retry_after_secs,
        }),
        Fault::Conflict => Err(EmulatorError::AnotherOperationInProgress {
            gateway: target_name(route),
            retry_after_secs: cfg.retry_after_secs,
        }),
        Fault::ServerError(status) => Err(EmulatorError::InjectedServerError {
            status,
            retry_after_secs: cfg.retry_after_secs,
        }),
        Fault::Timeout => {
            if cfg.timeout_applies_change {
                // The outcome is deliberately lost, as with a real timeout.
                let _ = execute(st, route, op, cfg, call).await;
            }
            pause(st, Duration::from_millis(cfg.timeout_hold_ms)).await?;
            Err(EmulatorError::InjectedTimeout)
        }
    }
}

/// The name of the resource (or gateway) a route names, for messages.
fn target_name(route: &Route) -> String {
    match &route.target {
        Target::Resource(id) | Target::Gateway(id, _) => id.name.clone(),
        Target::PublicIps(_, rg) | Target::LoadBalancers(_, rg) => rg.clone(),
        Target::Gateways(sub, rg) => rg.clone().unwrap_or_else(|| sub.clone()),
        Target::OperationStatus(id) | Target::OperationResult(id) => id.clone(),
    }
}

fn respond(applied: Applied, next_link: Option<String>) -> Response {
    match applied.body {
        Some(mut body) => {
            if let (Some(link), Some(obj)) = (next_link, body.as_object_mut()) {
                obj.insert("nextLink".into(), serde_json::Value::String(link));
            }
            (applied.status, Json(body)).into_response()
        }
        None => applied.status.into_response(),
    }
}

async fn execute(
    st: &AppState,
    route: &Route,
    op: Op,
    cfg: &EmulatorConfig,
    call: &Call<'_>,
) -> Result<Response, EmulatorError> {
    let auto = cfg.auto_create_gateways;
    match op {
        Op::Read(r) => {
            pause_until(st, call.arrived + latency(cfg, 0)).await?;
            let applied = lock(&st.emu.inner.state).read(r, auto, cfg.page_size)?;
            // The next page is asked for at the api-version of this request.
            let next = applied
                .next_token
                .as_ref()
                .map(|t| call.url(call.uri.path(), &format!("&$skipToken={t}")));
            Ok(respond(applied, next))
        }
        Op::Mutate(m) => {
            let m = *m;
            {
                let mut s = lock(&st.emu.inner.stats);
                s.addresses_carried += m.address_count() as u64;
                s.locations_carried += m.location_count() as u64;
            }
            if cfg.long_running_operations && !m.always_synchronous(call.version) {
                // A DELETE of what does not exist is answered 204 at once, as ARM does.
                let gone = m.is_delete() && !lock(&st.emu.inner.state).exists(m.resource());
                if !gone {
                    return start_operation(st, route, m, cfg, call);
                }
            }
            let _permit = acquire(st, &m, cfg)?;
            // The emulator's own apply is part of the modelled latency (`ApplyCost`): it starts
            // so as to end with it — never before half the latency, so that a wrong estimate
            // cannot show a change much before its call ends — and the answer still waits for
            // the latency's end.
            let addresses = m.address_count();
            let modelled = latency(cfg, addresses);
            let end = call.arrived + modelled;
            let cost = &st.emu.inner.apply_cost;
            let start = end - cost.estimate(addresses).min(modelled / 2);
            pause_until(st, start).await?;
            let begun = tokio::time::Instant::now();
            let applied = st.emu.apply(m, cfg, call.version);
            cost.record(addresses, begun.elapsed());
            pause_until(st, end).await?;
            Ok(respond(applied?, None))
        }
    }
}

fn acquire(
    st: &AppState,
    m: &Mutation,
    cfg: &EmulatorConfig,
) -> Result<Option<crate::faults::Permit>, EmulatorError> {
    let Some(key) = m.gateway_key() else {
        return Ok(None);
    };
    match st
        .emu
        .inner
        .limiter
        .try_acquire(&key, cfg.max_concurrent_mutations)
    {
        Ok(p) => Ok(Some(p)),
        Err(_) => {
            lock(&st.emu.inner.stats).throttled_by_limit += 1;
            let gateway = m.resource().name.clone();
            Err(match cfg.throttle_response {
                ThrottleResponse::TooManyRequests => EmulatorError::TooManyRequests {
                    scope: gateway,
                    retry_after_secs: cfg.retry_after_secs,
                },
                ThrottleResponse::AnotherOperationInProgress => {
                    EmulatorError::AnotherOperationInProgress {
                        gateway,
                        retry_after_secs: cfg.retry_after_secs,
                    }
                }
            })
        }
    }
}

/// The `Azure-AsyncOperation` (status) and `Location` (result) URLs of operation `id`, at the
/// api-version of the request that started it.
fn operation_urls(call: &Call<'_>, sub: &str, id: &str) -> (String, String) {
    let prefix = format!("/subscriptions/{sub}/providers/{PROVIDER}/locations/local");
    (
        call.url(&format!("{prefix}/operations/{id}"), ""),
        call.url(&format!("{prefix}/operationResults/{id}"), ""),
    )
}

fn set_header(resp: &mut Response, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        resp.headers_mut().insert(name, v);
    }
}

/// Accepts a mutation as a long-running operation: checked now (400s are synchronous), applied after
/// the latency by a background task that holds the gateway's concurrency slot until it completes.
fn start_operation(
    st: &AppState,
    route: &Route,
    m: Mutation,
    cfg: &EmulatorConfig,
    call: &Call<'_>,
) -> Result<Response, EmulatorError> {
    let existed = {
        let state = lock(&st.emu.inner.state);
        state.check(&m, cfg)?;
        state.exists(m.resource())
    };
    let permit = acquire(st, &m, cfg)?;
    let id = lock(&st.emu.inner.operations).start();
    lock(&st.emu.inner.stats).operations_started += 1;
    let resource = m.resource().clone();
    let is_put = m.is_put();
    let (status_url, result_url) = operation_urls(call, &resource.subscription, &id);
    let done_at = call.arrived + latency(cfg, m.address_count());
    let emu = st.emu.clone();
    let cfg2 = cfg.clone();
    let op_id = id.clone();
    let version = call.version;
    tokio::spawn(async move {
        tokio::time::sleep_until(done_at).await;
        let outcome = emu.apply(m, &cfg2, version).map(|a| (a.status, a.body));
        lock(&emu.inner.operations).finish(&op_id, outcome);
        drop(permit);
    });
    let mut resp = if is_put {
        let body = serde_json::json!({
            "id": resource.to_string(),
            "name": resource.name,
            "type": resource.kind.arm_type(),
            "properties": { "provisioningState": "Updating" },
        });
        // 201 for a resource the PUT creates, 200 for one it updates.
        let status = if existed {
            StatusCode::OK
        } else {
            StatusCode::CREATED
        };
        (status, Json(body)).into_response()
    } else {
        StatusCode::ACCEPTED.into_response()
    };
    set_header(&mut resp, "azure-asyncoperation", &status_url);
    set_header(&mut resp, "location", &result_url);
    set_header(
        &mut resp,
        "retry-after",
        &cfg.lro_retry_after_secs.to_string(),
    );
    tracing::debug!(operation = route.operation, %id, "started long-running operation");
    Ok(resp)
}

fn operation_status(st: &AppState, id: &str) -> Result<Response, EmulatorError> {
    let ops = lock(&st.emu.inner.operations);
    let op = ops
        .get(id)
        .ok_or_else(|| EmulatorError::OperationNotFound(id.to_string()))?;
    Ok(Json(op.status(id)).into_response())
}

fn operation_result(
    st: &AppState,
    call: &Call<'_>,
    id: &str,
    cfg: &EmulatorConfig,
) -> Result<Response, EmulatorError> {
    let outcome = {
        let ops = lock(&st.emu.inner.operations);
        let op = ops
            .get(id)
            .ok_or_else(|| EmulatorError::OperationNotFound(id.to_string()))?;
        op.outcome.clone()
    };
    match outcome {
        None => {
            let mut resp = StatusCode::ACCEPTED.into_response();
            let url = call.url(call.uri.path(), "");
            set_header(&mut resp, "location", &url);
            set_header(
                &mut resp,
                "retry-after",
                &cfg.lro_retry_after_secs.to_string(),
            );
            Ok(resp)
        }
        Some(Ok((_, Some(body)))) => Ok((StatusCode::OK, Json(body)).into_response()),
        Some(Ok((_, None))) => Ok(StatusCode::NO_CONTENT.into_response()),
        Some(Err(e)) => Err(e),
    }
}
