//! The HTTP API (docs/server.md): the same operations as the WebSocket
//! methods, errors as `{"error":{"code","message"}}`, and a run's events
//! as SSE.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{FromRequestParts, Query, RawQuery, State};
use axum::http::header::{AUTHORIZATION, RETRY_AFTER};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next as MiddlewareNext;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::Stream;
use serde_json::json;

use crate::auth::Principal;
use crate::body::JsonBody;
use crate::error::{ApiError, Code};
use crate::extract::{ApiPath, ApiQuery};
use crate::protocol::{
    Answer, DecisionBody, ListParams, PermissionListParams, Request, RespondParams, RunIdParams, StartRun, SteerBody,
    SteerParams,
};
use crate::requests::Caller;
use crate::service::Next;
use crate::App;

/// Answers `request` as JSON with `status`.
async fn answer(app: &App, caller: &Caller, request: Request, status: StatusCode) -> Result<Response, ApiError> {
    let (answer, _): (Answer, _) = crate::requests::answer(&app.service, caller, request).await?;
    Ok((status, Json(answer)).into_response())
}

/// The client's socket address, as the accept loop saw it.
pub(crate) fn client_address(parts: &Parts) -> Option<std::net::SocketAddr> {
    parts
        .extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|info| info.0)
}

impl FromRequestParts<Arc<App>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, Self::Rejection> {
        let principal = Principal::from_request_parts(parts, app).await?;
        Ok(Caller {
            principal,
            address: client_address(parts),
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.code.status();
        let retry = self.retry_after_ms;
        let mut response = (status, Json(json!({ "error": self }))).into_response();
        if let Some(after) = retry {
            // Whole seconds, rounded up: never earlier than asked.
            let secs = after.as_millis().div_ceil(1000).max(1);
            if let Ok(value) = HeaderValue::from_str(&secs.to_string()) {
                response.headers_mut().insert(RETRY_AFTER, value);
            }
        }
        response
    }
}

/// The token of a request: `Authorization: Bearer`, else `?token=`; both
/// trimmed alike (configured tokens are trimmed too).
fn presented(parts: &Parts) -> Option<String> {
    if let Some(value) = parts.headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        return value.strip_prefix("Bearer ").map(|t| t.trim().to_string());
    }
    let query: Query<HashMap<String, String>> = Query::try_from_uri(&parts.uri).ok()?;
    query.0.get("token").map(|t| t.trim().to_string())
}

impl FromRequestParts<Arc<App>> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, Self::Rejection> {
        // Signed in once already, by the API's layer (`admitted`).
        if let Some(SignedIn(principal)) = parts.extensions.get::<SignedIn>() {
            return Ok(principal.clone());
        }
        let tokens = &app.service.config().tokens;
        if tokens.is_empty() {
            // Open to whoever reaches the loopback address: not to a web
            // page of another site the operator happens to visit, nor to
            // a name rebound to 127.0.0.1.
            crate::web::check_local_request(parts, app)?;
        }
        let presented = presented(parts);
        if let Some(token) = &presented {
            if tokens.is_empty() {
                return Ok(Principal::local());
            }
            if let Some(principal) = tokens.check(token) {
                return Ok(principal);
            }
        }
        // The web page's session cookie (checked for the page's origin).
        match crate::web::cookie_principal(parts, app) {
            Ok(Some(principal)) => return Ok(principal),
            Ok(None) => {}
            Err(refused) => {
                app.service
                    .audit_refusal(client_address(parts), parts.uri.path(), &refused.message, refused.code)
                    .await;
                return Err(refused);
            }
        }
        if tokens.is_empty() {
            return Ok(Principal::local());
        }
        let reason = if presented.is_some() {
            "unknown token"
        } else {
            "no token"
        };
        app.service
            .audit_refusal(client_address(parts), parts.uri.path(), reason, Code::Unauthorized)
            .await;
        Err(ApiError::new(
            Code::Unauthorized,
            "a valid token is required (Authorization: Bearer TOKEN)",
        ))
    }
}

pub(crate) async fn start_run(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(mut params): JsonBody<StartRun>,
) -> Result<Response, ApiError> {
    if let Some(key) = headers.get("idempotency-key") {
        let key = key
            .to_str()
            .map_err(|_| ApiError::new(Code::InvalidParams, "Idempotency-Key must be visible ASCII"))?;
        // The header and the body naming two keys: which one the client
        // meant cannot be guessed.
        if params.idempotency_key.as_deref().is_some_and(|own| own != key) {
            return Err(ApiError::new(
                Code::InvalidParams,
                "the Idempotency-Key header and the body's idempotencyKey differ",
            ));
        }
        params.idempotency_key = Some(key.to_string());
    }
    params.traceparent = params.traceparent.or_else(|| traceparent_header(&headers));
    answer(&app, &caller, Request::Run(params), StatusCode::ACCEPTED).await
}

pub(crate) async fn list_runs(
    State(app): State<Arc<App>>,
    caller: Caller,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params = list_params(query.as_deref().unwrap_or_default())?;
    answer(&app, &caller, Request::List(params), StatusCode::OK).await
}

/// The list's filters from a query string. `token` signs the request in
/// (see `presented`) and is not a filter; any other unknown name is an
/// error, as in `run.list`.
fn list_params(query: &str) -> Result<ListParams, ApiError> {
    let filters: Vec<&str> = query
        .split('&')
        .filter(|pair| !pair.is_empty() && pair.split('=').next() != Some("token"))
        .collect();
    let uri: axum::http::Uri = format!("/?{}", filters.join("&"))
        .parse()
        .map_err(|_| ApiError::new(Code::InvalidParams, "the query string is not valid"))?;
    let Query(params) = Query::try_from_uri(&uri).map_err(|err| ApiError::new(Code::InvalidParams, err.body_text()))?;
    Ok(params)
}

pub(crate) async fn get_run(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiPath(run_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    answer(&app, &caller, Request::Get(RunIdParams { run_id }), StatusCode::OK).await
}

pub(crate) async fn cancel_run(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiPath(run_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    answer(&app, &caller, Request::Cancel(RunIdParams { run_id }), StatusCode::OK).await
}

pub(crate) async fn steer_run(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiPath(run_id): ApiPath<String>,
    JsonBody(SteerBody { message }): JsonBody<SteerBody>,
) -> Result<Response, ApiError> {
    let request = Request::Steer(SteerParams { run_id, message });
    answer(&app, &caller, request, StatusCode::OK).await
}

/// `POST /v1/runs/{id}/rewind`: `run.rewind`'s fields but `runId`, which
/// is the path's.
pub(crate) async fn rewind_run(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiPath(run_id): ApiPath<String>,
    JsonBody(body): JsonBody<serde_json::Value>,
) -> Result<Response, ApiError> {
    answer(
        &app,
        &caller,
        Request::Rewind(run_params(body, run_id)?),
        StatusCode::OK,
    )
    .await
}

/// `POST /v1/runs/{id}/fork`: `run.fork`'s fields but `runId`. A prompt's
/// run is followed at `GET /v1/runs/{started.runId}/events`.
pub(crate) async fn fork_run(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    ApiPath(run_id): ApiPath<String>,
    JsonBody(body): JsonBody<serde_json::Value>,
) -> Result<Response, ApiError> {
    let mut params: crate::protocol::ForkParams = run_params(body, run_id)?;
    params.traceparent = params.traceparent.or_else(|| traceparent_header(&headers));
    answer(&app, &caller, Request::Fork(params), StatusCode::OK).await
}

/// The standard `traceparent` header, as any instrumented HTTP client sends
/// it (docs/telemetry.md). One that is not valid, or more than one, is
/// ignored, as the W3C recommendation asks; a body's own `traceparent`
/// wins over it (it was written on purpose).
fn traceparent_header(headers: &HeaderMap) -> Option<loom_core::TraceParent> {
    let mut given = headers.get_all("traceparent").iter();
    match (given.next(), given.next()) {
        (Some(value), None) => value.to_str().ok().and_then(|value| value.parse().ok()),
        _ => None,
    }
}

/// `GET /v1/runs/{id}/files?step=N&path=P`: `run.file`.
pub(crate) async fn snapshot_file(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiPath(run_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    if let Some(unknown) = query
        .keys()
        .find(|name| !["step", "path", "token"].contains(&name.as_str()))
    {
        return Err(ApiError::new(
            Code::InvalidParams,
            format!("unknown query parameter '{unknown}'"),
        ));
    }
    let step = query
        .get("step")
        .and_then(|step| step.trim().parse::<u32>().ok())
        .ok_or_else(|| ApiError::new(Code::InvalidParams, "step must be a step number"))?;
    let path = query
        .get("path")
        .cloned()
        .ok_or_else(|| ApiError::new(Code::InvalidParams, "path is missing"))?;
    let params = crate::protocol::FileParams { run_id, step, path };
    answer(&app, &caller, Request::File(params), StatusCode::OK).await
}

/// A method's params from a body (an object, or nothing) and the path's
/// run id, which the body may not name.
fn run_params<T: serde::de::DeserializeOwned>(body: serde_json::Value, run_id: String) -> Result<T, ApiError> {
    let mut fields = match body {
        serde_json::Value::Null => serde_json::Map::new(),
        serde_json::Value::Object(fields) => fields,
        _ => return Err(ApiError::new(Code::InvalidParams, "the payload must be a JSON object")),
    };
    if fields.contains_key("runId") {
        return Err(ApiError::new(
            Code::InvalidParams,
            "the run is the path's: leave runId out of the body",
        ));
    }
    fields.insert("runId".into(), run_id.into());
    crate::protocol::object_params(serde_json::Value::Object(fields))
}

pub(crate) async fn respond(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiPath((run_id, request_id)): ApiPath<(String, String)>,
    JsonBody(DecisionBody { decision }): JsonBody<DecisionBody>,
) -> Result<Response, ApiError> {
    let request = Request::Respond(RespondParams {
        run_id,
        request_id,
        decision,
    });
    answer(&app, &caller, request, StatusCode::OK).await
}

pub(crate) async fn list_permissions(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiQuery(query): ApiQuery<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let request = Request::Asks(PermissionListParams {
        run_id: query.get("runId").cloned(),
    });
    answer(&app, &caller, request, StatusCode::OK).await
}

/// `GET /v1/audit?sinceMs=&tokenName=&limit=`: the audit trail, oldest
/// first (the newest `limit`, default 100, at most 1000); admins only. A
/// refused read is itself recorded.
pub(crate) async fn audit(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiQuery(query): ApiQuery<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    // Who asks is judged before what is asked.
    if caller.principal.role() != crate::auth::Role::Admin {
        let refused = app.service.audit_entries(&caller.principal, &Default::default()).await;
        if let Err(refused) = refused {
            let mut audited = crate::service::Audited::by("audit.read", &caller.principal, caller.address);
            audited.outcome = Err(refused.code);
            app.service.audit(audited).await;
            return Err(refused);
        }
    }
    let mut filter = loom_core::AuditQuery {
        limit: 100,
        ..loom_core::AuditQuery::default()
    };
    for (name, value) in &query {
        let number = || {
            value
                .trim()
                .parse::<u64>()
                .map_err(|_| ApiError::new(Code::InvalidParams, format!("{name} must be a whole number")))
        };
        match name.as_str() {
            "sinceMs" => filter.since_ms = Some(number()?),
            "tokenName" => filter.token = Some(value.clone()),
            "limit" => filter.limit = (number()? as usize).clamp(1, 1000),
            // Signs the request in (see `presented`).
            "token" => {}
            other => {
                return Err(ApiError::new(
                    Code::InvalidParams,
                    format!("unknown parameter '{other}' (sinceMs, tokenName, limit)"),
                ))
            }
        }
    }
    let entries = app.service.audit_entries(&caller.principal, &filter).await?;
    Ok(Json(json!({ "entries": entries })).into_response())
}

/// `GET /v1/runs/{id}/events`: SSE, `id:` = seq, after `Last-Event-ID`
/// (or `?afterSeq=`); comment pings; the stream ends after `lifecycle.end`
/// (or when the subscriber fell behind: the client reconnects with its
/// last id, as `EventSource` does by itself).
pub(crate) async fn events(
    State(app): State<Arc<App>>,
    principal: Principal,
    ApiPath(run_id): ApiPath<String>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let last_event_id = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let after = match last_event_id.or(query.get("afterSeq").map(String::as_str)) {
        Some(text) => text
            .trim()
            .parse::<u64>()
            .map_err(|_| ApiError::new(Code::InvalidParams, "Last-Event-ID / afterSeq must be a seq number"))?,
        None => 0,
    };
    let subscription = app.service.subscribe(&principal, &run_id, after).await?;
    let closing = app.closing.clone();
    let stream = sse_stream(subscription, closing, run_id.as_str().into());
    // Pings keep a quiet stream under the idle timeout.
    let ping = Duration::from_secs(15).min(app.service.config().idle_timeout / 2);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(ping).text("ping"))
        .into_response())
}

/// Counts an open SSE stream while it lives.
struct SseGauge;

impl SseGauge {
    fn open() -> Self {
        metrics::gauge!("loom_sse_connections").increment(1.0);
        Self
    }
}

impl Drop for SseGauge {
    fn drop(&mut self) {
        metrics::gauge!("loom_sse_connections").decrement(1.0);
    }
}

/// The subscribed run's events (and, live, its sub-agents'); `subscribed`
/// is its id.
fn sse_stream(
    subscription: crate::service::Subscription,
    closing: tokio_util::sync::CancellationToken,
    subscribed: Arc<str>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send {
    let state = (subscription, closing, SseGauge::open(), false, subscribed);
    futures_util::stream::unfold(
        state,
        |(mut subscription, closing, gauge, ended, subscribed)| async move {
            if ended {
                return None;
            }
            let next = tokio::select! {
                next = subscription.next() => next,
                _ = closing.cancelled() => Next::End,
            };
            match next {
                Next::Event(event) => {
                    let last =
                        subscription.follows_live() && matches!(event.kind, loom_core::EventKind::LifecycleEnd { .. });
                    let data = serde_json::to_string(&*event).unwrap_or_default();
                    // A sub-agent's event carries no `id:`: the stream's cursor
                    // is the subscribed run's seq (the sub-agent has its own).
                    let own = event.run_id == subscribed;
                    let sse = if own {
                        SseEvent::default().id(event.seq.to_string())
                    } else {
                        SseEvent::default()
                    };
                    let sse = sse.event(event.kind.name()).data(data);
                    // Only the subscribed run's own end closes the stream.
                    let last = last && own;
                    Some((Ok(sse), (subscription, closing, gauge, last, subscribed)))
                }
                Next::Lagged => {
                    metrics::counter!("loom_subscribers_dropped_total").increment(1);
                    let sse = SseEvent::default().comment("dropped: too slow; reconnect with Last-Event-ID");
                    Some((Ok(sse), (subscription, closing, gauge, true, subscribed)))
                }
                Next::End => None,
            }
        },
    )
}

pub(crate) async fn healthz() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

pub(crate) async fn readyz(State(app): State<Arc<App>>) -> Response {
    match app.service.ready().await {
        Ok(()) => Json(json!({"status": "ready"})).into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "reason": why})),
        )
            .into_response(),
    }
}

pub(crate) async fn metrics(State(app): State<Arc<App>>, principal: Principal) -> Result<Response, ApiError> {
    let _ = principal;
    let Some(handle) = &app.metrics else {
        return Err(ApiError::new(
            Code::Internal,
            "metrics are not recorded in this process",
        ));
    };
    Ok((
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
        .into_response())
}

pub(crate) async fn not_found() -> ApiError {
    ApiError::new(Code::MethodNotFound, "no such route")
}

/// A route asked with a method it does not take: 405, with the JSON error
/// body every other answer has (axum's own 405 has none).
pub(crate) async fn method_not_allowed(method: axum::http::Method) -> Response {
    let error = ApiError::new(Code::MethodNotFound, format!("this route does not take {method}"));
    (StatusCode::METHOD_NOT_ALLOWED, Json(json!({ "error": error }))).into_response()
}

/// The layer in front of every API route: who is asking (the token, or the
/// web page's cookie) and whether their request rate allows one more, for
/// every route alike; the principal is left in the request for the route.
pub(crate) async fn admitted(
    State(app): State<Arc<App>>,
    request: axum::extract::Request,
    next: MiddlewareNext,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let principal = match Principal::from_request_parts(&mut parts, &app).await {
        Ok(principal) => principal,
        Err(refused) => return refused.into_response(),
    };
    if let Err(refused) = app.service.admit_request(&principal) {
        return refused.into_response();
    }
    parts.extensions.insert(SignedIn(principal));
    next.run(axum::extract::Request::from_parts(parts, body)).await
}

/// Who `admitted` signed in, as it leaves them in the request: a type of
/// this module, so nothing else (an embedder's layer) can put one there.
#[derive(Clone)]
struct SignedIn(Principal);

/// One log line per request: method, path (never the query: it may hold a
/// token), status and latency.
pub(crate) async fn log_request(request: axum::extract::Request, next: MiddlewareNext) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16();
    tracing::info!(%method, path, status, latency_ms = started.elapsed().as_secs_f64() * 1000.0, "request");
    let class = match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    metrics::counter!("loom_http_requests_total", "class" => class).increment(1);
    response
}
