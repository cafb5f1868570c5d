//! The web page (docs/web.md): static files embedded in the binary, and the
//! session that lets a browser use the API. A browser cannot put a token
//! in an `EventSource`'s headers, so the page trades its token for an
//! HttpOnly, `SameSite=Strict` cookie; a request with that cookie that
//! changes anything, or opens a WebSocket, must also come from the page's
//! own origin (scheme, host and port: docs/web.md, "Safety").

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequest, Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, COOKIE, HOST, ORIGIN, SET_COOKIE, UPGRADE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::json;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::auth::Principal;
use crate::body::JsonBody;
use crate::error::{ApiError, Code};
use crate::service::Audited;
use crate::App;

/// The start of the cookie's name; the rest comes from the session key.
const COOKIE_PREFIX: &str = "loom_session_";

/// How long a session lasts.
const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// Only the page's own files: no inline script, no other origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; \
                   base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

const INDEX_HTML: &str = include_str!("../web/index.html");
const APP_JS: &str = include_str!("../web/app.js");
const APP_CSS: &str = include_str!("../web/app.css");
const ICON_SVG: &str = include_str!("../web/icon.svg");

/// Sign-outs remembered at once. Each is a line of the revocation file,
/// which every sign-out rewrites: past this many (not yet expired), new
/// sign-ins are refused until the oldest expire, rather than a sign-out
/// forgotten (docs/server.md, "Sessions").
const MAX_SIGNED_OUT: usize = 10_000;

/// How far ahead of the clock a cookie's expiry may be beyond the
/// lifetime: a clock stepped back a little must not end every session,
/// and a cookie forged with a leaked key must not live for years.
const CLOCK_SKEW: Duration = Duration::from_secs(300);

/// Signed-in browsers. A session is a cookie the server signed
/// (`v2.NAME.EXPIRY.NONCE.MAC`, HMAC-SHA256 with the session key; the
/// random nonce makes every sign-in its own session): nothing is kept per
/// session, so a gateway restarted with the same key (the binary keeps
/// it) still knows its pages. A session ends at its expiry, at sign-out
/// (remembered in the revocation file beside the key, so across restarts
/// too), or when its token is removed from the configuration.
pub(crate) struct Sessions {
    key: [u8; 32],
    /// `loom_session_` and 8 hex digits drawn from the key. Browsers keep
    /// cookies per host, not per port: with one name for all, signing in
    /// to a second gateway on the same host would sign the first one's
    /// page out. Each key (each workspace) names its own cookie.
    cookie_name: String,
    /// Signed-out sessions' MACs and their expiries.
    signed_out: Mutex<HashMap<String, u64>>,
    /// Where `signed_out` is kept; `None`: in memory only.
    revocations: Option<PathBuf>,
    /// One write of the revocation file at a time, each with the list as
    /// it is then: the last write holds every sign-out before it.
    writing: tokio::sync::Mutex<()>,
}

impl Sessions {
    /// Reads the revocation file once, at start (a few lines; before any
    /// connection is served).
    pub(crate) fn new(key: Option<[u8; 32]>, revocations: Option<PathBuf>) -> Self {
        let key = key.unwrap_or_else(crate::random_key);
        let now = now_secs();
        let signed_out = revocations
            .as_deref()
            .and_then(|path| std::fs::read_to_string(path).ok())
            .map(|text| parse_revocations(&text, now))
            .unwrap_or_default();
        let mut sessions = Self {
            key,
            cookie_name: String::new(),
            signed_out: Mutex::new(signed_out),
            revocations,
            writing: tokio::sync::Mutex::new(()),
        };
        let tag = sessions.mac_of("cookie name");
        sessions.cookie_name = format!("{COOKIE_PREFIX}{}", tag.get(..8).unwrap_or_default());
        sessions
    }

    /// HMAC-SHA256 of `text` under the session key, in hex.
    fn mac_of(&self, text: &str) -> String {
        // HMAC takes keys of any length: this never fails, and an empty
        // MAC would match no cookie.
        let Ok(mut mac) = <Hmac<Sha256> as Mac>::new_from_slice(&self.key) else {
            return String::new();
        };
        mac.update(text.as_bytes());
        hex(&mac.finalize().into_bytes())
    }

    /// The session id in a request's cookies.
    fn cookie<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        headers
            .get_all(COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(';'))
            .find_map(|pair| pair.trim().strip_prefix(self.cookie_name.as_str())?.strip_prefix('='))
    }

    /// The MAC of a session: the name, the expiry, the nonce, and which
    /// token it came from (a token given a new value ends its sessions).
    fn mac(&self, name_hex: &str, expiry: u64, nonce: &str, token: &str) -> String {
        self.mac_of(&format!("v2|{name_hex}|{expiry}|{nonce}|{token}"))
    }

    /// What binds a session to its token: the token's digest, or `open`
    /// for a gateway without tokens.
    fn token_of(app: &App, principal: &Principal) -> Option<String> {
        let tokens = &app.service.config().tokens;
        if tokens.is_empty() {
            return (principal.name() == Principal::local().name()).then(|| "open".to_string());
        }
        tokens.digest_of(principal.name()).map(|digest| hex(&digest))
    }

    fn open(&self, principal: &Principal, app: &App) -> Option<String> {
        let token = Self::token_of(app, principal)?;
        let name_hex = hex(principal.name().as_bytes());
        let expiry = now_secs() + SESSION_LIFETIME.as_secs();
        let nonce = hex(uuid::Uuid::new_v4().as_bytes());
        let mac = self.mac(&name_hex, expiry, &nonce, &token);
        Some(format!("v2.{name_hex}.{expiry}.{nonce}.{mac}"))
    }

    /// The principal a valid cookie names, its MAC and its expiry.
    fn find(&self, cookie: &str, app: &App) -> Option<(Principal, String, u64)> {
        let mut parts = cookie.split('.');
        let (Some("v2"), Some(name_hex), Some(expiry_text), Some(nonce), Some(mac), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        // Only the form the server writes: "+12" or "012" would parse to
        // the same number under another spelling.
        let expiry: u64 = expiry_text.parse().ok()?;
        let now = now_secs();
        let latest = now + SESSION_LIFETIME.as_secs() + CLOCK_SKEW.as_secs();
        if expiry.to_string() != expiry_text || expiry <= now || expiry > latest {
            return None;
        }
        if nonce.len() != 32 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let name = String::from_utf8(unhex(name_hex)?).ok()?;
        let principal = match app.service.config().tokens.principal_named(&name) {
            Some(principal) => principal,
            None if name == Principal::local().name() => Principal::local(),
            None => return None,
        };
        let token = Self::token_of(app, &principal)?;
        let expected = self.mac(name_hex, expiry, nonce, &token);
        let genuine = !expected.is_empty() && bool::from(expected.as_bytes().ct_eq(mac.as_bytes()));
        if !genuine || lock(&self.signed_out).contains_key(mac) {
            return None;
        }
        Some((principal, mac.to_string(), expiry))
    }

    /// `None` while a new session may be opened; when `MAX_SIGNED_OUT`
    /// sign-outs are remembered, how long until the first of them expires.
    /// Sessions opened before the list filled can still be signed out
    /// (and are remembered): it is the sign-ins, limited per token by
    /// `requests_per_minute`, that stop.
    fn full(&self) -> Option<Duration> {
        let mut signed_out = lock(&self.signed_out);
        let now = now_secs();
        signed_out.retain(|_, until| *until > now);
        if signed_out.len() < MAX_SIGNED_OUT {
            return None;
        }
        let first = signed_out.values().min().copied().unwrap_or(now);
        Some(Duration::from_secs(first.saturating_sub(now).max(1)))
    }

    /// Remembers a sign-out in memory, until the session's expiry.
    fn remember(&self, mac: String, expiry: u64) {
        let mut signed_out = lock(&self.signed_out);
        let now = now_secs();
        signed_out.retain(|_, until| *until > now);
        signed_out.insert(mac, expiry);
    }

    /// Forgets a session (a genuine one: see `sign_out`) until it expires,
    /// and writes the list to the revocation file before returning.
    async fn close(&self, mac: String, expiry: u64) -> std::io::Result<()> {
        self.remember(mac, expiry);
        let Some(path) = &self.revocations else {
            return Ok(());
        };
        let _writing = self.writing.lock().await;
        let text = {
            let signed_out = lock(&self.signed_out);
            let mut lines: Vec<String> = signed_out
                .iter()
                .map(|(mac, until)| format!("{mac} {until}\n"))
                .collect();
            lines.sort();
            lines.concat()
        };
        write_owner_only(path, text).await
    }
}

/// `MAC EXPIRY` lines, without the expired ones and anything malformed.
fn parse_revocations(text: &str, now: u64) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let (mac, expiry) = line.trim().split_once(' ')?;
            let expiry: u64 = expiry.parse().ok()?;
            (expiry > now && mac.len() == 64).then(|| (mac.to_string(), expiry))
        })
        .collect()
}

/// Replaces `path` with `text`, readable by the owner only: written
/// beside it, then renamed, so a crash leaves the old list or the new one.
async fn write_owner_only(path: &Path, text: String) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let mut options = tokio::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(0o600);
    let mut file = options.open(&partial).await?;
    file.write_all(text.as_bytes()).await?;
    file.sync_all().await?;
    drop(file);
    tokio::fs::rename(&partial, path).await
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The principal of a request signed in with the page's cookie. A request
/// that changes something, and every WebSocket upgrade (a GET that opens
/// a connection that can change anything), must carry an `Origin` that is
/// this server's own; so must any request that carries an `Origin` at all.
/// `SameSite=Strict` does not help here: browsers count every port of a
/// host as the same site, so a page served from another port of
/// 127.0.0.1 gets the cookie sent along (docs/web.md, "Origin").
pub(crate) fn cookie_principal(parts: &Parts, app: &App) -> Result<Option<Principal>, ApiError> {
    let Some(id) = app.sessions.cookie(&parts.headers) else {
        return Ok(None);
    };
    let Some((principal, _, _)) = app.sessions.find(id, app) else {
        return Ok(None);
    };
    let upgrade = parts.headers.contains_key(UPGRADE);
    let reads_only = (parts.method == Method::GET || parts.method == Method::HEAD) && !upgrade;
    let says_origin = parts.headers.contains_key(ORIGIN);
    if (!reads_only || says_origin) && !same_origin(&parts.headers, app) {
        return Err(ApiError::new(
            Code::Forbidden,
            "a request with the page's session must come from the page itself (Origin)",
        ));
    }
    Ok(Some(principal))
}

/// On a gateway without tokens (loopback only): the `Host` must be a
/// loopback name — a DNS name rebound to 127.0.0.1 is not — and a request
/// from a browser must come from this server's own page.
pub(crate) fn check_local_request(parts: &Parts, app: &App) -> Result<(), ApiError> {
    let forbidden = |why: &str| Err(ApiError::new(Code::Forbidden, why));
    if let Some(host) = parts.headers.get(HOST).and_then(|v| v.to_str().ok()) {
        let name = match host.strip_prefix('[') {
            Some(bracketed) => bracketed.split(']').next().unwrap_or(""),
            None => host.rsplit_once(':').map_or(host, |(name, _)| name),
        };
        let loopback =
            name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            return forbidden("without tokens the gateway answers only to a loopback Host");
        }
    }
    if parts.headers.contains_key(ORIGIN) && !same_origin(&parts.headers, app) {
        return forbidden("a request from another site's page");
    }
    Ok(())
}

/// Whether `Origin` is the page's own: scheme, host and port. The gateway
/// speaks plain HTTP, so its page's origin is `http://` + the `Host` the
/// request was sent to; `https://` on the same host and port is another
/// origin. A gateway behind a TLS proxy lists its public origin in
/// `[server] allowed_origins`.
fn same_origin(headers: &HeaderMap, app: &App) -> bool {
    let origin = headers.get(ORIGIN).and_then(|v| v.to_str().ok());
    let Some(origin) = origin else {
        return false;
    };
    let allowed = &app.service.config().allowed_origins;
    if allowed.iter().any(|known| known.eq_ignore_ascii_case(origin)) {
        return true;
    }
    let host = headers.get(HOST).and_then(|v| v.to_str().ok());
    match (origin.get(..7), origin.get(7..), host) {
        (Some(scheme), Some(authority), Some(host)) => {
            scheme.eq_ignore_ascii_case("http://") && !host.is_empty() && authority.eq_ignore_ascii_case(host)
        }
        _ => false,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SignIn {
    token: String,
}

/// `POST /v1/session {token}`: a cookie for a valid token.
/// Its body was read within the size limit and the body timeout by the
/// layer every body goes through (this route is open to anyone).
pub(crate) async fn sign_in(State(app): State<Arc<App>>, headers: HeaderMap, request: Request) -> Response {
    if !same_origin(&headers, &app) {
        return ApiError::new(Code::Forbidden, "sign in from the page itself").into_response();
    }
    let address = request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|info| info.0);
    let body: SignIn = match JsonBody::from_request(request, &app).await {
        Ok(JsonBody(body)) => body,
        Err(err) => return err.into_response(),
    };
    let tokens = &app.service.config().tokens;
    let principal = if tokens.is_empty() {
        Some(Principal::local())
    } else {
        tokens.check(body.token.trim())
    };
    let Some(principal) = principal else {
        app.service
            .audit_refusal(address, "/v1/session", "unknown token", Code::Unauthorized)
            .await;
        return ApiError::new(Code::Unauthorized, "that token is not valid on this server").into_response();
    };
    // A sign-in counts against its token's rate like any call: a loop of
    // sign-ins and sign-outs is one of rewrites of the revocation file.
    if let Err(err) = app.service.admit_request(&principal) {
        return err.into_response();
    }
    if let Some(wait) = app.sessions.full() {
        return ApiError::new(
            Code::Overloaded,
            "too many sessions were signed out lately; sign in again later or use the token",
        )
        .retry_after(wait)
        .into_response();
    }
    let Some(id) = app.sessions.open(&principal, &app) else {
        return ApiError::new(Code::Unauthorized, "that token is not valid on this server").into_response();
    };
    app.service
        .audit(Audited::by("session.sign_in", &principal, address))
        .await;
    let cookie = format!("{}={id}; HttpOnly; SameSite=Strict; Path=/", app.sessions.cookie_name);
    let mut response = Json(json!({ "principal": principal.name(), "role": principal.role() })).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(SET_COOKIE, value);
    }
    response
}

/// `DELETE /v1/session`: signs out.
pub(crate) async fn sign_out(State(app): State<Arc<App>>, request: Request) -> Response {
    let headers = request.headers();
    let address = request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|info| info.0);
    // Like every change made with the cookie, only from the page itself:
    // another site must not be able to sign a person out.
    if app.sessions.cookie(headers).is_some() && !same_origin(headers, &app) {
        return ApiError::new(Code::Forbidden, "sign out from the page itself").into_response();
    }
    // Only a genuine session is remembered as signed out: made-up cookies
    // cannot fill the list.
    // It is on disk before the answer: a restart right after the
    // sign-out does not bring the session back.
    if let Some(id) = app.sessions.cookie(headers) {
        if let Some((principal, mac, expiry)) = app.sessions.find(id, &app) {
            if let Err(err) = app.service.admit_request(&principal) {
                return err.into_response();
            }
            if let Err(err) = app.sessions.close(mac, expiry).await {
                return ApiError::internal("could not record the sign-out", err).into_response();
            }
            app.service
                .audit(Audited::by("session.sign_out", &principal, address))
                .await;
        }
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    let expired = format!(
        "{}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0",
        app.sessions.cookie_name
    );
    if let Ok(value) = HeaderValue::from_str(&expired) {
        response.headers_mut().insert(SET_COOKIE, value);
    }
    response
}

/// `GET /v1/session`: who the page is signed in as.
pub(crate) async fn whoami(principal: Principal) -> Response {
    Json(json!({ "principal": principal.name(), "role": principal.role() })).into_response()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_revocation_list_keeps_live_well_formed_entries_only() {
        let live = "a".repeat(64);
        let expired = "b".repeat(64);
        let text = format!("{live} 2000\n{expired} 999\nshort 3000\n{live}x 3000\n{live} soon\n\n");
        let list = parse_revocations(&text, 1000);
        assert_eq!(list.len(), 1, "{list:?}");
        assert_eq!(list.get(&live), Some(&2000));
    }

    #[test]
    fn past_the_cap_of_sign_outs_sign_ins_stop_and_no_sign_out_is_forgotten() {
        let sessions = Sessions::new(None, None);
        let later = now_secs() + 3600;
        for i in 0..MAX_SIGNED_OUT - 1 {
            sessions.remember(format!("{i:064x}"), later + i as u64);
        }
        assert_eq!(sessions.full(), None);
        sessions.remember("f".repeat(64), later);
        let wait = sessions.full().unwrap();
        assert!(
            wait > Duration::from_secs(3500) && wait <= Duration::from_secs(3600),
            "{wait:?}"
        );
        // A session opened before the list filled is still signed out.
        sessions.remember("e".repeat(64), later);
        assert_eq!(lock(&sessions.signed_out).len(), MAX_SIGNED_OUT + 1);
        assert!(lock(&sessions.signed_out).contains_key(&"e".repeat(64)));
        // Expired ones make room.
        {
            let mut signed_out = lock(&sessions.signed_out);
            for until in signed_out.values_mut().take(2) {
                *until = 1;
            }
        }
        assert_eq!(sessions.full(), None);
    }
}
