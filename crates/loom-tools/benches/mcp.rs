//! What an MCP call through Loom costs over talking to the same server
//! directly, and what starting a stdio server costs.
//!
//! `cargo bench -p loom-tools --bench mcp` (after `bash tests/mcp/install.sh`).
//! Against `@modelcontextprotocol/server-everything`'s `echo`:
//!
//! - direct: newline-delimited JSON-RPC written and read by hand on the
//!   pipes of a server of its own, one call at a time;
//! - through Loom: the `everything__echo` tool's `call_json` (rmcp client,
//!   request bookkeeping, cancellation guard, result rendering);
//! - the two alternate call by call, so both see the same load, and the
//!   overhead is the median (and p99) of each pair's difference;
//! - start-up: spawn + `initialize` + `tools/list`, through Loom and by hand.
//!
//! Each figure is the median and p99 over the calls; machines are shared,
//! so compare figures of one run.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a failed unwrap is a failed run

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use loom_core::{CancellationToken, ToolContext, ToolSource};
use loom_testkit::mcp_servers;
use loom_tools::{McpClients, McpServerConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const CALLS: usize = 1000;
const STARTS: usize = 10;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = mcp_servers::everything();
        let (direct, through_loom) = paired_calls(&server).await;
        report("echo, direct (by hand on the pipes)", &direct);
        report("echo, through Loom's MCP tool", &through_loom);
        // Calls alternate, so both ways see the same load on a shared
        // machine; the overhead is the distribution of the pairs' differences.
        let differences: Vec<f64> = direct
            .iter()
            .zip(&through_loom)
            .map(|(direct, loom)| micros(*loom) - micros(*direct))
            .collect();
        println!(
            "overhead per call (paired): median {:.1} µs, p99 {:.1} µs",
            percentile_f64(&differences, 50),
            percentile_f64(&differences, 99)
        );
        let (loom_starts, direct_starts) = starts(&server).await;
        report("start-up: spawn + initialize + tools/list, by hand", &direct_starts);
        report("start-up: spawn + initialize + tools/list, through Loom", &loom_starts);
    });
}

/// `CALLS` echo calls each way, alternating: one by hand on a session of
/// its own, one through the `everything__echo` tool.
async fn paired_calls(server: &mcp_servers::ServerCommand) -> (Vec<Duration>, Vec<Duration>) {
    let (mut child, mut stdin, mut stdout) = spawn(server);
    handshake(&mut stdin, &mut stdout).await;
    let clients = clients(server);
    assert!(clients.start().await[0].outcome.is_ok());
    let echo = clients
        .tools()
        .into_iter()
        .find(|tool| tool.name() == "everything__echo")
        .unwrap();
    let mut direct = Vec::with_capacity(CALLS);
    let mut through_loom = Vec::with_capacity(CALLS);
    for id in 0..CALLS {
        let request = json!({"jsonrpc": "2.0", "id": id + 10, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": "bench"}}});
        let started = Instant::now();
        let answer = round_trip(&mut stdin, &mut stdout, &request).await;
        direct.push(started.elapsed());
        assert_eq!(answer["result"]["content"][0]["text"], "Echo: bench");

        let ctx = ToolContext::new("c", "r".into(), Arc::from(Path::new("/")), CancellationToken::new());
        let started = Instant::now();
        let output = echo.call_json(json!({"message": "bench"}), ctx).await.unwrap();
        through_loom.push(started.elapsed());
        assert_eq!(output.content, "Echo: bench");
    }
    clients.shutdown().await;
    drop(stdin);
    let _ = child.wait().await;
    (direct, through_loom)
}

/// `STARTS` start-ups each way.
async fn starts(server: &mcp_servers::ServerCommand) -> (Vec<Duration>, Vec<Duration>) {
    let mut through_loom = Vec::new();
    let mut direct = Vec::new();
    for _ in 0..STARTS {
        let clients = clients(server);
        let started = Instant::now();
        assert!(clients.start().await[0].outcome.is_ok());
        through_loom.push(started.elapsed());
        clients.shutdown().await;

        let started = Instant::now();
        let (mut child, mut stdin, mut stdout) = spawn(server);
        handshake(&mut stdin, &mut stdout).await;
        let listed = round_trip(
            &mut stdin,
            &mut stdout,
            &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        )
        .await;
        direct.push(started.elapsed());
        assert!(listed["result"]["tools"].is_array());
        drop(stdin);
        let _ = child.wait().await;
    }
    (through_loom, direct)
}

fn clients(server: &mcp_servers::ServerCommand) -> McpClients {
    let config = McpServerConfig {
        command: Some(server.command.clone()),
        args: server.args.clone(),
        env: server.env.iter().cloned().collect(),
        ..McpServerConfig::default()
    };
    McpClients::new(&BTreeMap::from([("everything".to_string(), config)]), Path::new(".")).unwrap()
}

type Pipes = (
    tokio::process::Child,
    tokio::process::ChildStdin,
    BufReader<tokio::process::ChildStdout>,
);

fn spawn(server: &mcp_servers::ServerCommand) -> Pipes {
    let mut child = tokio::process::Command::new(&server.command)
        .args(&server.args)
        .envs(server.env.iter().cloned())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    (child, stdin, stdout)
}

async fn handshake(stdin: &mut tokio::process::ChildStdin, stdout: &mut BufReader<tokio::process::ChildStdout>) {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}});
    round_trip(stdin, stdout, &init).await;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    stdin.write_all(format!("{initialized}\n").as_bytes()).await.unwrap();
}

/// Writes `request` and reads lines until its answer (notifications the
/// server sends meanwhile are skipped).
async fn round_trip(
    stdin: &mut tokio::process::ChildStdin,
    stdout: &mut BufReader<tokio::process::ChildStdout>,
    request: &Value,
) -> Value {
    stdin.write_all(format!("{request}\n").as_bytes()).await.unwrap();
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            stdout.read_line(&mut line).await.unwrap() > 0,
            "the server closed its output"
        );
        let message: Value = serde_json::from_str(&line).unwrap();
        if message.get("id") == request.get("id") && message.get("method").is_none() {
            return message;
        }
    }
}

fn percentile(times: &[Duration], p: usize) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort();
    sorted[((sorted.len() - 1) * p) / 100]
}

fn percentile_f64(values: &[f64], p: usize) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[((sorted.len() - 1) * p) / 100]
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

fn report(what: &str, times: &[Duration]) {
    println!(
        "{what}: n={} median {:.1} µs, p99 {:.1} µs",
        times.len(),
        micros(percentile(times, 50)),
        micros(percentile(times, 99))
    );
}
