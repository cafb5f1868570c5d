//! The web page (DESIGN 4.8): static files embedded in the binary, and the
//! session that lets a browser use the API. A browser cannot put a token
//! in an `EventSource`'s headers, so the page trades its token for an
//! HttpOnly, `SameSite=Strict` cookie; a request with that cookie that
//! changes anything must also come from the page's own origin.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, COOKIE, HOST, ORIGIN, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use crate::auth::Principal;
use crate::error::{ApiError, Code};
use crate::App;

/// The cookie's name.
const COOKIE_NAME: &str = "loom_session";

/// How long a session lasts without use.
const IDLE_LIMIT: Duration = Duration::from_secs(12 * 3600);

/// Only the page's own files: no inline script, no other origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; \
                   base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

const INDEX_HTML: &str = include_str!("../web/index.html");
const APP_JS: &str = include_str!("../web/app.js");
const APP_CSS: &str = include_str!("../web/app.css");
const ICON_SVG: &str = include_str!("../web/icon.svg");

/// Signed-in browsers: session id → who and when last seen.
#[derive(Default)]
pub(crate) struct Sessions {
    live: Mutex<HashMap<String, (Principal, Instant)>>,
}

impl Sessions {
    fn open(&self, principal: Principal) -> String {
        let id = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
        let mut live = self.live.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        live.retain(|_, (_, seen)| seen.elapsed() < IDLE_LIMIT);
        live.insert(id.clone(), (principal, Instant::now()));
        id
    }

    fn find(&self, id: &str) -> Option<Principal> {
        let mut live = self.live.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (principal, seen) = live.get_mut(id)?;
        if seen.elapsed() >= IDLE_LIMIT {
            live.remove(id);
            return None;
        }
        *seen = Instant::now();
        Some(principal.clone())
    }

    fn close(&self, id: &str) {
        self.live
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(id);
    }
}

/// The session id in a request's cookies.
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE_NAME)?.strip_prefix('='))
}

/// The principal of a request signed in with the page's cookie. A request
/// that changes something must carry an `Origin` that is this server's
/// own (`SameSite=Strict` already keeps the cookie off other sites'
/// requests; this also covers browsers and proxies that do not).
pub(crate) fn cookie_principal(parts: &Parts, app: &App) -> Result<Option<Principal>, ApiError> {
    let Some(id) = session_cookie(&parts.headers) else {
        return Ok(None);
    };
    let Some(principal) = app.sessions.find(id) else {
        return Ok(None);
    };
    let reads_only = parts.method == Method::GET || parts.method == Method::HEAD;
    if !reads_only && !same_origin(&parts.headers) {
        return Err(ApiError::new(
            Code::Forbidden,
            "a request with the page's session must come from the page itself (Origin)",
        ));
    }
    Ok(Some(principal))
}

/// Whether `Origin` names the host the request was sent to.
fn same_origin(headers: &HeaderMap) -> bool {
    let origin = headers.get(ORIGIN).and_then(|v| v.to_str().ok());
    let host = headers.get(HOST).and_then(|v| v.to_str().ok());
    match (origin, host) {
        (Some(origin), Some(host)) => {
            let authority = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                .unwrap_or("");
            authority.eq_ignore_ascii_case(host)
        }
        _ => false,
    }
}

#[derive(Deserialize)]
pub(crate) struct SignIn {
    token: String,
}

/// `POST /v1/session {token}`: a cookie for a valid token.
pub(crate) async fn sign_in(State(app): State<Arc<App>>, headers: HeaderMap, Json(body): Json<SignIn>) -> Response {
    if !same_origin(&headers) {
        return ApiError::new(Code::Forbidden, "sign in from the page itself").into_response();
    }
    let tokens = &app.service.config().tokens;
    let principal = if tokens.is_empty() {
        Some(Principal::local())
    } else {
        tokens.check(body.token.trim())
    };
    let Some(principal) = principal else {
        return ApiError::new(Code::Unauthorized, "that token is not valid on this server").into_response();
    };
    let id = app.sessions.open(principal.clone());
    let cookie = format!("{COOKIE_NAME}={id}; HttpOnly; SameSite=Strict; Path=/");
    let mut response = Json(json!({ "principal": principal.name() })).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(SET_COOKIE, value);
    }
    response
}

/// `DELETE /v1/session`: signs out.
pub(crate) async fn sign_out(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Some(id) = session_cookie(&headers) {
        app.sessions.close(id);
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    let expired = format!("{COOKIE_NAME}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
    if let Ok(value) = HeaderValue::from_str(&expired) {
        response.headers_mut().insert(SET_COOKIE, value);
    }
    response
}

/// `GET /v1/session`: who the page is signed in as.
pub(crate) async fn whoami(principal: Principal) -> Response {
    Json(json!({ "principal": principal.name() })).into_response()
}

pub(crate) async fn index() -> Response {
    asset(INDEX_HTML, "text/html; charset=utf-8")
}

pub(crate) async fn script() -> Response {
    asset(APP_JS, "text/javascript; charset=utf-8")
}

pub(crate) async fn style() -> Response {
    asset(APP_CSS, "text/css; charset=utf-8")
}

pub(crate) async fn icon() -> Response {
    asset(ICON_SVG, "image/svg+xml")
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = Response::new(Body::from(body));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("content-security-policy", HeaderValue::from_static(CSP));
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    headers.insert("x-frame-options", HeaderValue::from_static("DENY"));
    response
}
