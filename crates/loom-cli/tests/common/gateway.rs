//! `loom serve` as the gateway tests start it, and the clients they speak
//! to it with: a real WebSocket client (tokio-tungstenite) and a real HTTP
//! client (reqwest).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

pub(crate) const ALICE: &str = "alice-token-0123456789";
pub(crate) const BOB: &str = "bob-token-9876543210xx";

/// A gateway on `extra` (lines of `[server]`) and `args`, its model a
/// `PromptModel`, in a folder of its own.
pub(crate) fn gateway(extra: &str, args: &[&str]) -> (tempfile::TempDir, loom_testkit::PromptModel, Gateway) {
    let dir = tempfile::tempdir().unwrap();
    let model = loom_testkit::PromptModel::start(loom_testkit::PromptModelOptions::default());
    config(dir.path(), &model.url(), extra);
    let gateway = Gateway::start(dir.path(), args);
    (dir, model, gateway)
}

/// The run id of an accepted run (`agent.run`'s answer).
pub(crate) fn run_id(accepted: &Value) -> String {
    accepted["runId"].as_str().unwrap().to_string()
}

/// A `loom serve` process on 127.0.0.1 (a free port), killed on drop.
pub(crate) struct Gateway {
    pub child: Child,
    pub addr: String,
    pub dir: PathBuf,
    pub log: Arc<Mutex<Vec<String>>>,
}

/// The loom.toml of a gateway with two tokens, the fake model, and `extra`.
pub(crate) fn config(dir: &Path, model_url: &str, extra: &str) -> PathBuf {
    let path = dir.join("loom.toml");
    let text = format!(
        r#"model = "openai:fake"
[provider]
base_url = "{model_url}"
max_attempts = 1

# Scripted runs repeat one call on purpose.
[feedback]
monitor = false

[server]
{grace}
{ping}
{extra}

[[server.tokens]]
name = "alice"
token = "{ALICE}"

[[server.tokens]]
name = "bob"
token_sha256 = "{bob}"
"#,
        bob = sha256_hex(BOB),
        grace = if extra.contains("shutdown_grace_secs") {
            ""
        } else {
            "shutdown_grace_secs = 10"
        },
        ping = if extra.contains("ping_interval_secs") {
            ""
        } else {
            "ping_interval_secs = 1"
        },
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn sha256_hex(text: &str) -> String {
    // The test computes the digest the way an operator would.
    let out = std::process::Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(text.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

impl Gateway {
    /// Starts `loom serve` in `dir` with `dir/loom.toml` and `args`.
    pub(crate) fn start(dir: &Path, args: &[&str]) -> Self {
        let mut cmd = super::loom_in(dir);
        cmd.args(["serve", "--addr", "127.0.0.1:0", "--config"])
            .arg(dir.join("loom.toml"))
            .args(["--workspace"])
            .arg(dir)
            .args(args)
            .env("OPENAI_API_KEY", "test-key")
            .env("LOOM_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // Logged before the address is handed over, so the log a
                // test reads holds the line that announced it.
                let addr = line
                    .split("listening on http://")
                    .nth(1)
                    .map(|rest| rest.split_whitespace().next().unwrap_or_default().to_string());
                lines.lock().unwrap().push(line);
                if let Some(addr) = addr {
                    let _ = tx.send(addr);
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addr) => addr,
            Err(_) => panic!("loom serve did not start: {:?}", log.lock().unwrap()),
        };
        Self {
            child,
            addr,
            dir: dir.to_path_buf(),
            log,
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub(crate) fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// SIGTERM, then waits for the exit (at most 30 s).
    pub(crate) fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..300 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("loom serve did not stop after SIGTERM: {}", self.log_text());
    }

    /// The text of `/metrics`.
    pub(crate) async fn metrics_text(&self) -> String {
        http(ALICE)
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub(crate) async fn ws(&self, token: &str) -> Client {
        Client::connect(&self.addr, token).await
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A WebSocket JSON-RPC client that keeps the events it reads while it
/// waits for a response.
pub(crate) struct Client {
    socket: Socket,
    next_id: u64,
    pub events: Vec<Value>,
    pub closed: Option<(u16, String)>,
}

impl Client {
    pub(crate) async fn connect(addr: &str, token: &str) -> Self {
        Self::connect_with_buffer(addr, token, None).await
    }

    /// With a small socket receive buffer: a client that reads slowly
    /// fills it soon.
    pub(crate) async fn connect_with_buffer(addr: &str, token: &str, receive_buffer: Option<usize>) -> Self {
        let mut request = format!("ws://{addr}/ws").into_client_request().unwrap();
        request
            .headers_mut()
            .insert("Authorization", format!("Bearer {token}").parse().unwrap());
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        if let Some(size) = receive_buffer {
            socket.set_recv_buffer_size(size).unwrap();
        }
        let target: std::net::SocketAddr = addr.parse().unwrap();
        socket.connect(&target.into()).unwrap();
        socket.set_nonblocking(true).unwrap();
        let stream = tokio::net::TcpStream::from_std(std::net::TcpStream::from(socket)).unwrap();
        let (socket, _) = tokio_tungstenite::client_async(request, tokio_tungstenite::MaybeTlsStream::Plain(stream))
            .await
            .unwrap();
        Self {
            socket,
            next_id: 0,
            events: Vec::new(),
            closed: None,
        }
    }

    pub(crate) async fn send_text(&mut self, text: String) {
        self.socket.send(Message::text(text)).await.unwrap();
    }

    /// A text frame of any bytes (not necessarily UTF-8), as a broken client sends.
    pub(crate) async fn send_raw_text(&mut self, bytes: Vec<u8>) {
        use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
        use tokio_tungstenite::tungstenite::protocol::frame::Frame;
        let frame = Frame::message(bytes, OpCode::Data(Data::Text), true);
        self.socket.send(Message::Frame(frame)).await.unwrap();
    }

    /// The next frame (events are kept in `events` too); `None` once closed.
    pub(crate) async fn frame(&mut self) -> Option<Value> {
        loop {
            let message = tokio::time::timeout(Duration::from_secs(30), self.socket.next())
                .await
                .expect("no frame within 30 s")?;
            match message {
                Ok(Message::Text(text)) => {
                    let frame: Value = serde_json::from_str(text.as_str()).unwrap();
                    if frame["type"] == "event" {
                        self.events.push(frame.clone());
                    }
                    return Some(frame);
                }
                Ok(Message::Close(close)) => {
                    self.closed = close.map(|c| (u16::from(c.code), c.reason.to_string()));
                    return None;
                }
                Ok(_) => continue,
                Err(err) => {
                    eprintln!("websocket error: {err}");
                    return None;
                }
            }
        }
    }

    /// Sends a request and returns its response frame.
    pub(crate) async fn call(&mut self, method: &str, payload: Value) -> Value {
        self.next_id += 1;
        let id = format!("r{}", self.next_id);
        let frame = json!({"type": "request", "id": id, "method": method, "payload": payload});
        self.send_text(frame.to_string()).await;
        self.response(&id).await
    }

    pub(crate) async fn response(&mut self, id: &str) -> Value {
        loop {
            let frame = self
                .frame()
                .await
                .unwrap_or_else(|| panic!("closed while waiting for {id}"));
            if frame["type"] == "response" && frame["id"] == id {
                return frame;
            }
        }
    }

    /// The payload of a successful call.
    pub(crate) async fn ok(&mut self, method: &str, payload: Value) -> Value {
        let response = self.call(method, payload).await;
        assert_eq!(response["ok"], true, "{method}: {response}");
        response["payload"].clone()
    }

    /// The error code of a failed call.
    pub(crate) async fn error(&mut self, method: &str, payload: Value) -> String {
        let response = self.call(method, payload).await;
        assert_eq!(response["ok"], false, "{method}: {response}");
        response["error"]["code"].as_str().unwrap().to_string()
    }

    /// Reads until the event `name` of `run_id` arrives; returns it.
    pub(crate) async fn until(&mut self, run_id: &str, name: &str) -> Value {
        if let Some(found) = self.events.iter().find(|e| e["runId"] == run_id && e["event"] == name) {
            return found.clone();
        }
        loop {
            let frame = self.frame().await.unwrap_or_else(|| panic!("closed before {name}"));
            if frame["type"] == "event" && frame["runId"] == run_id && frame["event"] == name {
                return frame;
            }
        }
    }

    /// Reads until an event `name` of any run arrives; returns it.
    pub(crate) async fn until_any(&mut self, name: &str) -> Value {
        if let Some(found) = self.events.iter().find(|e| e["event"] == name) {
            return found.clone();
        }
        loop {
            let frame = self.frame().await.unwrap_or_else(|| panic!("closed before {name}"));
            if frame["type"] == "event" && frame["event"] == name {
                return frame;
            }
        }
    }

    /// The seqs of the events received for `run_id`.
    pub(crate) fn seqs(&self, run_id: &str) -> Vec<u64> {
        self.events
            .iter()
            .filter(|e| e["runId"] == run_id)
            .map(|e| e["seq"].as_u64().unwrap())
            .collect()
    }

    pub(crate) fn names(&self, run_id: &str) -> Vec<String> {
        self.events
            .iter()
            .filter(|e| e["runId"] == run_id)
            .map(|e| e["event"].as_str().unwrap().to_string())
            .collect()
    }
}

/// A reqwest client with `token`.
pub(crate) fn http(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("Authorization", format!("Bearer {token}").parse().unwrap());
    reqwest::Client::builder().default_headers(headers).build().unwrap()
}
