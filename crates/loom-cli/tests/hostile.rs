//! Attacks on a real `loom serve` (docs/server.md, "Security"): a hostile
//! page on another port of 127.0.0.1 holding the operator's cookie, and a
//! hostile network client without a token that opens connections and
//! never finishes them; plus the sessions and tokens they could abuse.
//! Each test here failed against the gateway before these were closed
//! (run them against an older build with `LOOM_BIN`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::gateway::{config, gateway, http, Gateway, ALICE};
use hmac::{Hmac, Mac};
use loom_testkit::{PromptModel, PromptModelOptions};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// Signs in as the page does (from its own origin); the `NAME=VALUE` cookie.
async fn sign_in(gateway: &Gateway) -> String {
    let answer = reqwest::Client::new()
        .post(gateway.url("/v1/session"))
        .header("origin", format!("http://{}", gateway.addr))
        .json(&json!({"token": ALICE}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let set = answer.headers().get("set-cookie").unwrap().to_str().unwrap();
    set.split(';').next().unwrap().to_string()
}

async fn whoami(gateway: &Gateway, cookie: &str) -> u16 {
    reqwest::Client::new()
        .get(gateway.url("/v1/session"))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn sign_out(gateway: &Gateway, cookie: &str) {
    let out = reqwest::Client::new()
        .delete(gateway.url("/v1/session"))
        .header("cookie", cookie)
        .header("origin", format!("http://{}", gateway.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), 204);
}

/// A WebSocket upgrade to `/ws` with `cookie` and `origin`: the HTTP
/// status of the refusal, or 101 and the socket.
async fn ws_with_cookie(
    gateway: &Gateway,
    cookie: &str,
    origin: &str,
) -> Result<tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>, u16> {
    let mut request = format!("ws://{}/ws", gateway.addr).into_client_request().unwrap();
    request.headers_mut().insert("cookie", cookie.parse().unwrap());
    request.headers_mut().insert("origin", origin.parse().unwrap());
    match tokio_tungstenite::connect_async(request).await {
        Ok((socket, _)) => Ok(socket),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => Err(response.status().as_u16()),
        Err(err) => panic!("upgrade failed otherwise: {err}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_another_port_or_scheme_cannot_use_the_cookie_over_websocket_or_http() {
    let (_dir, _model, gateway) = gateway("", &[]);
    let cookie = sign_in(&gateway).await;
    let port: u16 = gateway.addr.rsplit(':').next().unwrap().parse().unwrap();
    // Another port of the same host: the same site to a browser, which
    // sends the SameSite=Strict cookie along.
    let other = format!("http://127.0.0.1:{}", port.wrapping_add(1).max(1));
    assert_eq!(ws_with_cookie(&gateway, &cookie, &other).await.err(), Some(403));
    // The same host and port over https is another origin too.
    let https = format!("https://{}", gateway.addr);
    assert_eq!(ws_with_cookie(&gateway, &cookie, &https).await.err(), Some(403));
    // The page's own origin is welcome.
    let own = format!("http://{}", gateway.addr);
    let mut socket = ws_with_cookie(&gateway, &cookie, &own).await.unwrap();
    use futures_util::{SinkExt, StreamExt};
    let list = json!({"type": "request", "id": "1", "method": "run.list", "payload": {}});
    socket
        .send(tokio_tungstenite::tungstenite::Message::text(list.to_string()))
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), socket.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let answer: Value = serde_json::from_str(answer.to_text().unwrap()).unwrap();
    assert_eq!(answer["ok"], true, "{answer}");
    // Over HTTP, a change with the cookie from https://same-host:port is
    // refused as well; nothing was started by any of it.
    let posted = reqwest::Client::new()
        .post(gateway.url("/v1/runs"))
        .header("cookie", &cookie)
        .header("origin", &https)
        .json(&json!({"prompt": "from https"}))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 403);
    let runs: Value = http(ALICE)
        .get(gateway.url("/v1/runs"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(runs["runs"].as_array().unwrap().len(), 0, "{runs}");
    // A token needs no Origin (clients that are not browsers).
    let mut request = format!("ws://{}/ws?token={ALICE}", gateway.addr)
        .into_client_request()
        .unwrap();
    request.headers_mut().insert("origin", other.parse().unwrap());
    assert!(tokio_tungstenite::connect_async(request).await.is_ok());
}

/// Reads from `stream` until the server closes it (or `limit` passes):
/// what was read, and when the close came.
fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> (String, Option<Duration>) {
    let started = Instant::now();
    stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut text = Vec::new();
    let mut buffer = [0u8; 4096];
    while started.elapsed() < limit {
        match stream.read(&mut buffer) {
            Ok(0) => return (String::from_utf8_lossy(&text).into_owned(), Some(started.elapsed())),
            Ok(n) => text.extend_from_slice(&buffer[..n]),
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return (String::from_utf8_lossy(&text).into_owned(), Some(started.elapsed())),
        }
    }
    (String::from_utf8_lossy(&text).into_owned(), None)
}

/// Generous: the tests check that timeouts are enforced, not how fast.
const SLACK: Duration = Duration::from_secs(5);

#[test]
fn connections_that_never_finish_are_closed_within_their_timeouts() {
    let (_dir, _model, gateway) = gateway(
        "header_timeout_secs = 1\nidle_timeout_secs = 2\nbody_timeout_secs = 1\nping_interval_secs = 0.5",
        &[],
    );
    // Headers that never end.
    let mut headers = TcpStream::connect(&gateway.addr).unwrap();
    headers.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").unwrap();
    // A body shorter than its Content-Length, to the one route open to
    // anyone that reads a body.
    let mut short = TcpStream::connect(&gateway.addr).unwrap();
    let host = format!("http://{}", gateway.addr);
    short
        .write_all(
            format!(
                "POST /v1/session HTTP/1.1\r\nHost: {}\r\nOrigin: {host}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"tok",
                gateway.addr
            )
            .as_bytes(),
        )
        .unwrap();
    // A body shorter than its Content-Length to a route that does not
    // read it: the answer goes out, then nothing moves.
    let mut unread = TcpStream::connect(&gateway.addr).unwrap();
    unread
        .write_all(
            format!(
                "POST /healthz HTTP/1.1\r\nHost: {}\r\nContent-Length: 100\r\n\r\n{{\"a",
                gateway.addr
            )
            .as_bytes(),
        )
        .unwrap();
    // A keep-alive connection that asks once, then says nothing.
    let mut idle = TcpStream::connect(&gateway.addr).unwrap();
    idle.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n", gateway.addr).as_bytes())
        .unwrap();
    // A connection that sends nothing at all.
    let mut silent = TcpStream::connect(&gateway.addr).unwrap();

    let (text, closed) = read_until_closed(&mut headers, Duration::from_secs(1) + SLACK);
    assert!(closed.is_some(), "unfinished headers held open: {text:?}");
    let (text, closed) = read_until_closed(&mut short, Duration::from_secs(1) + SLACK);
    assert!(closed.is_some(), "a short body held open: {text:?}");
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("REQUEST_TIMEOUT"), "{text}");
    let (text, closed) = read_until_closed(&mut idle, Duration::from_secs(2) + SLACK);
    assert!(text.contains("\"ok\""), "{text}");
    assert!(closed.is_some(), "an idle keep-alive connection held open");
    let (_, closed) = read_until_closed(&mut silent, Duration::from_secs(1) + SLACK);
    assert!(closed.is_some(), "a silent connection held open");
    let (text, closed) = read_until_closed(&mut unread, Duration::from_secs(2) + SLACK);
    assert!(closed.is_some(), "a short unread body held open: {text:?}");
}

#[test]
fn a_connection_moving_no_byte_is_closed_after_the_idle_timeout() {
    // Headers may take long here: what closes these is the idle timeout.
    let (_dir, _model, gateway) = gateway("header_timeout_secs = 60\nidle_timeout_secs = 2", &[]);
    let mut idle = TcpStream::connect(&gateway.addr).unwrap();
    idle.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n", gateway.addr).as_bytes())
        .unwrap();
    let mut stalled = TcpStream::connect(&gateway.addr).unwrap();
    stalled.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").unwrap();
    let (text, closed) = read_until_closed(&mut idle, Duration::from_secs(2) + SLACK);
    assert!(text.contains("\"ok\""), "{text}");
    assert!(closed.is_some(), "an idle keep-alive connection held open");
    let (_, closed) = read_until_closed(&mut stalled, Duration::from_secs(2) + SLACK);
    assert!(closed.is_some(), "a stalled request held open");
}

/// A metric's value in `/metrics` (0 when it is not there yet).
async fn metric(gateway: &Gateway, name: &str) -> f64 {
    let metrics = gateway.metrics_text().await;
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .map_or(0.0, |value| value.trim().parse().unwrap())
}

/// Whether the server has closed `stream` (it is read without waiting).
fn is_closed(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    stream.set_nonblocking(true).unwrap();
    let closed = match stream.peek(&mut byte) {
        Ok(0) => true,
        // An answer (a 503 or 408) comes just before the close: drained
        // by the next look.
        Ok(_) => {
            let mut sink = [0u8; 4096];
            matches!((&*stream).read(&mut sink), Ok(0))
        }
        Err(err) => err.kind() != std::io::ErrorKind::WouldBlock,
    };
    stream.set_nonblocking(false).unwrap();
    closed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_does_not_deny_healthz() {
    // The black-box attack: one client without a token keeps three times
    // the cap of connections open that never send a request (half send
    // nothing, half start headers), reopening each one the server closes.
    let (_dir, _model, gateway) = gateway("header_timeout_secs = 3\nmax_connections = 20", &[]);
    let addr = gateway.addr.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooding = stop.clone();
    let flood = std::thread::spawn(move || {
        let open = |i: usize| {
            let mut stream = TcpStream::connect(&addr).ok()?;
            if i % 2 == 0 {
                let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n");
            }
            Some(stream)
        };
        let mut sockets: Vec<Option<TcpStream>> = (0..60).map(open).collect();
        let mut closed = 0usize;
        while !flooding.load(std::sync::atomic::Ordering::Relaxed) {
            for (i, socket) in sockets.iter_mut().enumerate() {
                if socket.as_ref().is_none_or(is_closed) {
                    closed += usize::from(socket.is_some());
                    *socket = open(i);
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        closed
    });
    // A prober: a new connection each time, a complete request at once.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let (mut asked, mut answered) = (0u32, 0u32);
    while started.elapsed() < Duration::from_secs(6) {
        asked += 1;
        match client.get(gateway.url("/healthz")).send().await {
            Ok(answer) if answer.status() == 200 => answered += 1,
            Ok(answer) => eprintln!("/healthz: {}", answer.status()),
            Err(err) => eprintln!("/healthz: {err:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let closed = tokio::task::spawn_blocking(move || flood.join().unwrap())
        .await
        .unwrap();
    let evicted = metric(&gateway, "loom_http_connections_evicted_total").await;
    eprintln!("/healthz: {answered} of {asked}; flood sockets closed: {closed}; evicted: {evicted}");
    // Before, it answered none (the flood held every slot); a probe may
    // still lose a race now and then on a loaded machine, which is no
    // denial of service: most must get through.
    assert!(
        answered * 3 >= asked * 2,
        "/healthz answered {answered} of {asked} times under the flood"
    );
    assert!(closed >= 40, "the flood's connections were not closed ({closed})");
    assert!(evicted >= 40.0, "evictions not counted: {evicted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_busy_connections_stay_and_a_newcomer_is_refused() {
    let (_dir, _model, gateway) = gateway(
        "header_timeout_secs = 2\nbody_timeout_secs = 30\nping_interval_secs = 30\nmax_connections = 4",
        &[],
    );
    // The cap filled with what must never be closed for a newcomer: two
    // WebSockets, and two sign-ins whose bodies are on their way.
    let mut first = gateway.ws(ALICE).await;
    let second = gateway.ws(ALICE).await;
    let sending: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut stream = TcpStream::connect(&gateway.addr).unwrap();
            stream
                .write_all(
                    format!(
                        "POST /v1/session HTTP/1.1\r\nHost: {0}\r\nOrigin: http://{0}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"tok",
                        gateway.addr
                    )
                    .as_bytes(),
                )
                .unwrap();
            stream
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Nothing idle to close: the newcomer is told so at once, and closed.
    let addr = gateway.addr.clone();
    let (text, closed) = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(&addr).unwrap();
        stream
            .write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
            .unwrap();
        read_until_closed(&mut stream, Duration::from_secs(2))
    })
    .await
    .unwrap();
    assert!(closed.is_some(), "{text}");
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("OVERLOADED"), "{text}");
    // The WebSocket still answers, and the sign-ins are still open, past
    // the header timeout.
    tokio::time::sleep(Duration::from_secs(2)).await;
    first.ok("run.list", json!({})).await;
    assert!(
        sending.iter().all(|stream| !is_closed(stream)),
        "a request in flight was closed"
    );
    // One WebSocket goes: a health check gets in again.
    drop(second);
    let started = Instant::now();
    loop {
        if let Ok(answer) = reqwest::get(gateway.url("/healthz")).await {
            if answer.status() == 200 {
                break;
            }
        }
        assert!(started.elapsed() < SLACK, "/healthz did not answer after a slot freed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(first);
    drop(sending);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(metric(&gateway, "loom_http_connections_refused_total").await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_out_survives_a_restart() {
    let (_dir, _model, mut gateway) = gateway("", &[]);
    let cookie = sign_in(&gateway).await;
    let kept = sign_in(&gateway).await;
    sign_out(&gateway, &cookie).await;
    assert_eq!(whoami(&gateway, &cookie).await, 401);
    let revoked = common::database_of(&gateway.dir).with_file_name("web-session.revoked");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&revoked).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", revoked.display());
    }
    assert!(gateway.terminate().success());
    let dir = gateway.dir.clone();
    gateway = Gateway::start(&dir, &[]);
    assert_eq!(whoami(&gateway, &cookie).await, 401, "the signed-out cookie came back");
    assert_eq!(whoami(&gateway, &kept).await, 200, "another session was lost");
}

/// The expiry field of a cookie (`vN.NAME.EXPIRY…`).
fn expiry_of(cookie: &str) -> &str {
    cookie.split('=').nth(1).unwrap().split('.').nth(2).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sign_ins_in_one_second_are_two_sessions() {
    let (_dir, _model, gateway) = gateway("", &[]);
    // Two sign-ins within the same second (a few tries: a second may turn
    // between them).
    let (first, second) = loop {
        let first = sign_in(&gateway).await;
        let second = sign_in(&gateway).await;
        if expiry_of(&first) == expiry_of(&second) {
            break (first, second);
        }
    };
    assert_ne!(first, second, "two sign-ins share one cookie");
    sign_out(&gateway, &first).await;
    assert_eq!(whoami(&gateway, &first).await, 401);
    assert_eq!(
        whoami(&gateway, &second).await,
        200,
        "a sign-out ended the other sign-in"
    );
    // Signed out and in again within the second: the new cookie lives.
    let third = sign_in(&gateway).await;
    assert_eq!(whoami(&gateway, &third).await, 200);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hmac_hex(key: &[u8], text: &str) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap();
    mac.update(text.as_bytes());
    hex(&mac.finalize().into_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_forged_with_the_key_for_years_ahead_is_refused() {
    let (_dir, _model, gateway) = gateway("", &[]);
    let genuine = sign_in(&gateway).await;
    // What one who stole the key file could sign (the cookie written in
    // the format the gateway writes).
    let key = std::fs::read(common::database_of(&gateway.dir).with_file_name("web-session.key")).unwrap();
    let name = genuine.split('=').next().unwrap();
    assert_eq!(name, format!("loom_session_{}", &hmac_hex(&key, "cookie name")[..8]));
    let version = genuine
        .split('=')
        .nth(1)
        .unwrap()
        .split('.')
        .next()
        .unwrap()
        .to_string();
    let token = hex(&Sha256::digest(ALICE.as_bytes()));
    let user = hex(b"alice");
    let forge = |expiry: u64| match version.as_str() {
        "v1" => {
            let mac = hmac_hex(&key, &format!("v1|{user}|{expiry}|{token}"));
            format!("{name}=v1.{user}.{expiry}.{mac}")
        }
        _ => {
            let nonce = "0123456789abcdef0123456789abcdef";
            let mac = hmac_hex(&key, &format!("v2|{user}|{expiry}|{nonce}|{token}"));
            format!("{name}=v2.{user}.{expiry}.{nonce}.{mac}")
        }
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // The forgery is right: an hour ahead is a session…
    assert_eq!(whoami(&gateway, &forge(now + 3600)).await, 200);
    // …ten years ahead is not.
    assert_eq!(whoami(&gateway, &forge(now + 10 * 365 * 86400)).await, 401);
}

/// `loom serve` on 0.0.0.0 with `LOOM_TOKEN` = `token` and loom.toml's
/// `extra`: its exit status and stderr (it must stop at start).
fn serve_refuses_to_start(token: &str, extra: &str) -> (std::process::ExitStatus, String) {
    let dir = tempfile::tempdir().unwrap();
    let model = PromptModel::start(PromptModelOptions::default());
    std::fs::write(
        dir.path().join("loom.toml"),
        format!(
            "model = \"openai:fake\"\n[provider]\nbase_url = \"{}\"\n[server]\n{extra}\n",
            model.url()
        ),
    )
    .unwrap();
    let mut child = common::loom_in(dir.path())
        .args(["serve", "--addr", "0.0.0.0:0", "--config"])
        .arg(dir.path().join("loom.toml"))
        .arg("--workspace")
        .arg(dir.path())
        .env("OPENAI_API_KEY", "test-key")
        .env("LOOM_TOKEN", token)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("LOOM_TOKEN {token:?} with {extra:?} opened the gateway on 0.0.0.0");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    (status, stderr)
}

#[test]
fn a_blank_loom_token_is_refused_and_a_query_token_is_trimmed() {
    let (status, stderr) = serve_refuses_to_start(&" ".repeat(20), "");
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("blank"), "{stderr}");

    // `?token=` is trimmed as the header is.
    let (_dir, _model, gateway) = gateway("", &[]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let padded = reqwest::get(gateway.url(&format!("/v1/runs?token=%20{ALICE}%20")))
            .await
            .unwrap();
        assert_eq!(padded.status(), 200);
        let header = reqwest::Client::new()
            .get(gateway.url("/v1/runs"))
            .header("authorization", format!("Bearer  {ALICE} "))
            .send()
            .await
            .unwrap();
        assert_eq!(header.status(), 200);
    });
}

#[test]
fn a_loom_token_of_invisible_or_non_ascii_characters_is_refused() {
    // Zero-width spaces are not blanks to `trim`, but no less invisible.
    let (status, stderr) = serve_refuses_to_start(&"\u{200b}".repeat(17), "");
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("blank"), "{stderr}");
    let (status, stderr) = serve_refuses_to_start("visible-token-0123456789\u{200b}", "");
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("visible ASCII"), "{stderr}");
    let (status, stderr) = serve_refuses_to_start("tökén-with-accents-0123456789", "");
    assert_eq!(status.code(), Some(2), "{stderr}");
}

#[test]
fn a_max_connections_beyond_reason_is_refused_at_start() {
    // Once a panic (tokio's semaphore has a maximum of permits).
    let (status, stderr) = serve_refuses_to_start(ALICE, "max_connections = 4611686018427387904");
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("max_connections"), "{stderr}");
}

/// `Max open files` of a process: (soft, hard), from /proc.
#[cfg(target_os = "linux")]
fn open_files_limit(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields[3].to_string(), fields[4].to_string())
}

/// `loom serve` in `dir` (with `dir/loom.toml`) started by a shell that
/// first runs `ulimit LIMIT`; stderr piped.
#[cfg(target_os = "linux")]
fn serve_under_ulimit(dir: &std::path::Path, limit: &str) -> std::process::Child {
    let mut cmd = common::loom_in(dir);
    cmd.args(["serve", "--addr", "127.0.0.1:0", "--config"])
        .arg(dir.join("loom.toml"))
        .arg("--workspace")
        .arg(dir)
        .env("OPENAI_API_KEY", "test-key")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    // The same program, arguments and environment, through the shell.
    let mut shell = std::process::Command::new("bash");
    shell
        .arg("-c")
        .arg(format!(r#"ulimit {limit} && exec "$0" "$@""#))
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    for (name, value) in cmd.get_envs() {
        match value {
            Some(value) => shell.env(name, value),
            None => shell.env_remove(name),
        };
    }
    shell.spawn().unwrap()
}

#[cfg(target_os = "linux")]
#[test]
fn serve_raises_its_descriptor_limit_to_the_hard_one() {
    let dir = tempfile::tempdir().unwrap();
    let model = PromptModel::start(PromptModelOptions::default());
    config(dir.path(), &model.url(), "");
    // Started with a soft limit of 256, as a 1024 default would be.
    let mut child = serve_under_ulimit(dir.path(), "-Sn 256");
    let stderr = child.stderr.take().unwrap();
    let listening = std::io::BufRead::lines(std::io::BufReader::new(stderr))
        .map_while(Result::ok)
        .any(|line| line.contains("listening on http://"));
    let (soft, hard) = open_files_limit(child.id());
    let _ = child.kill();
    let _ = child.wait();
    assert!(listening);
    assert_ne!(hard, "256", "the hard limit is 256 here: nothing to raise");
    assert_eq!(soft, hard, "the soft limit stayed at {soft}");
}

#[cfg(target_os = "linux")]
#[test]
fn a_configured_max_connections_is_held_under_the_descriptor_limit() {
    let dir = tempfile::tempdir().unwrap();
    let model = PromptModel::start(PromptModelOptions::default());
    config(dir.path(), &model.url(), "max_connections = 100000");
    // A hard limit of 256 descriptors: 100 000 connections cannot be.
    let mut child = serve_under_ulimit(dir.path(), "-n 256");
    let stderr = child.stderr.take().unwrap();
    let mut seen = Vec::new();
    for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
        let listening = line.contains("listening on http://");
        seen.push(line);
        if listening {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let seen = seen.join("\n");
    assert!(seen.contains("listening on http://"), "{seen}");
    assert!(
        seen.contains("max_connections = 100000") && seen.contains("using 192"),
        "no word of the cap being lowered: {seen}"
    );
}

/// A request that repeats a key — the last value a mode every token may
/// use — is refused with `INVALID_PARAMS` over WebSocket and HTTP, in the
/// payload, in the frame itself, or deeper in a body; no run is made from
/// it. Before, the last value was taken and the run started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_repeating_a_key_is_refused_and_makes_no_run() {
    let (_dir, _model, gateway) = gateway("", &[]);
    let mut client = gateway.ws(ALICE).await;
    for (id, frame) in [
        (
            "payload",
            r#"{"type":"request","id":"payload","method":"agent.run","payload":{"prompt":"hello answer=hi","mode":"bypass","mode":"default"}}"#,
        ),
        (
            "escaped",
            r#"{"type":"request","id":"escaped","method":"agent.run","payload":{"prompt":"hello answer=hi","mode":"bypass","mo\u0064e":"default"}}"#,
        ),
        (
            "frame",
            r#"{"type":"request","id":"frame","method":"agent.cancel","method":"agent.run","payload":{"prompt":"hello answer=hi"}}"#,
        ),
    ] {
        client.send_text(frame.to_string()).await;
        let answer = client.response(id).await;
        assert_eq!(
            (answer["ok"].as_bool(), answer["error"]["code"].as_str()),
            (Some(false), Some("INVALID_PARAMS")),
            "{frame}: {answer}"
        );
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("duplicate key"), "{message}");
    }
    for body in [
        r#"{"prompt":"hello answer=hi","mode":"bypass","mode":"default"}"#,
        r#"{"prompt":"hello answer=hi","traceparent":{"a":1,"a":2}}"#,
    ] {
        let answer = http(ALICE)
            .post(gateway.url("/v1/runs"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 400, "{body}");
        let error: Value = answer.json().await.unwrap();
        assert_eq!(error["error"]["code"], "INVALID_PARAMS", "{body}: {error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains("duplicate key"), "{body}: {message}");
    }
    let runs = client.ok("run.list", json!({})).await;
    assert_eq!(runs["runs"], json!([]), "{runs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_of_a_flood_on_one_websocket_is_answered_under_its_own_id() {
    let (_dir, _model, gateway) = gateway("", &[]);
    let mut client = gateway.ws(ALICE).await;
    // More than the 64 a connection may have in progress: those beyond are
    // refused OVERLOADED, each under its own id, and none goes unanswered.
    const SENT: usize = 400;
    for i in 0..SENT {
        let frame = json!({"type": "request", "id": format!("f{i}"), "method": "run.list", "payload": {}});
        client.send_text(frame.to_string()).await;
    }
    let mut answered = std::collections::HashMap::new();
    while answered.len() < SENT {
        let frame = client.frame().await.expect("the connection stayed open");
        assert_eq!(frame["type"], "response", "{frame}");
        let id = frame["id"]
            .as_str()
            .unwrap_or_else(|| panic!("an answer without its id: {frame}"));
        let outcome = match frame["error"]["code"].as_str() {
            Some(code) => code.to_string(),
            None => "ok".to_string(),
        };
        assert!(outcome == "ok" || outcome == "OVERLOADED", "{frame}");
        assert!(
            answered.insert(id.to_string(), outcome).is_none(),
            "{id} answered twice"
        );
    }
    let refused = answered.values().filter(|outcome| *outcome == "OVERLOADED").count();
    println!("{refused} of {SENT} refused OVERLOADED");
    // The connection still serves.
    assert_eq!(client.ok("run.list", json!({})).await["runs"], json!([]));
}
