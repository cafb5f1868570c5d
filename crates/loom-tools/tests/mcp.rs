//! MCP client tools against real servers: the pinned npm servers
//! (`server-everything`, `server-filesystem`), the Python `mcp-server-time`,
//! and the fixture server that hangs, crashes, floods and forks. Every test
//! starts its servers with a marker variable and checks at the end that no
//! process carrying it is left.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use loom_core::{CancellationToken, DynTool, ToolContext, ToolError, ToolSource};
use loom_testkit::mcp_servers::{self, processes_with_env, ServerCommand};
use loom_tools::mcp::ServerState;
use loom_tools::{McpClients, McpServerConfig};
use serde_json::{json, Value};

const MARKER: &str = "LOOM_MCP_TEST_MARKER";

/// Servers started for one test, all carrying one marker.
struct Servers {
    clients: Arc<McpClients>,
    marker: String,
    _workspace: tempfile::TempDir,
}

fn config(server: &ServerCommand, marker: &str, extra: &[(&str, String)]) -> McpServerConfig {
    let mut env: BTreeMap<String, String> = server.env.iter().cloned().collect();
    env.insert(MARKER.to_string(), marker.to_string());
    for (name, value) in extra {
        env.insert(name.to_string(), value.clone());
    }
    McpServerConfig {
        command: Some(server.command.clone()),
        args: server.args.clone(),
        env,
        startup_timeout_secs: Some(60),
        ..McpServerConfig::default()
    }
}

impl Servers {
    fn new(servers: Vec<(&str, McpServerConfig)>) -> Self {
        let workspace = tempfile::tempdir().unwrap();
        let configs: BTreeMap<String, McpServerConfig> = servers
            .into_iter()
            .map(|(name, config)| (name.to_string(), config))
            .collect();
        let marker = configs
            .values()
            .find_map(|config| config.env.get(MARKER).cloned())
            .unwrap_or_default();
        Self {
            clients: Arc::new(McpClients::new(&configs, workspace.path()).unwrap()),
            marker,
            _workspace: workspace,
        }
    }

    async fn start(&self) {
        for report in self.clients.start().await {
            assert!(
                report.outcome.is_ok(),
                "{} did not start: {:?}",
                report.server,
                report.outcome
            );
        }
    }

    fn tool(&self, name: &str) -> Arc<dyn DynTool> {
        self.clients
            .tools()
            .into_iter()
            .find(|tool| tool.name() == name)
            .unwrap_or_else(|| panic!("no tool {name} in {:?}", self.clients.tool_names()))
    }

    async fn call(&self, name: &str, args: Value) -> Result<String, ToolError> {
        self.call_with(name, args, CancellationToken::new()).await
    }

    async fn call_with(&self, name: &str, args: Value, cancel: CancellationToken) -> Result<String, ToolError> {
        let ctx = ToolContext::new("c1", "r1".into(), Arc::from(Path::new("/")), cancel);
        self.tool(name).call_json(args, ctx).await.map(|output| output.content)
    }

    /// Shuts down and asserts that no process of these servers is left.
    async fn finish(self) {
        self.clients.shutdown().await;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = processes_with_env(MARKER, &self.marker);
            if left.is_empty() {
                return;
            }
            assert!(Instant::now() < deadline, "server processes left behind: {left:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn marker() -> String {
    uuid::Uuid::new_v4().to_string()
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_lists_its_tools_and_answers_echo_and_get_sum() {
    let servers = Servers::new(vec![("everything", config(&mcp_servers::everything(), &marker(), &[]))]);
    servers.start().await;
    let names = servers.clients.tool_names();
    for name in ["everything__echo", "everything__get-sum", "everything__get-env"] {
        assert!(names.iter().any(|n| n == name), "{name} missing from {names:?}");
    }
    let echo = servers.tool("everything__echo");
    assert!(echo.parameters_schema()["properties"]["message"].is_object());
    assert!(echo.parameters_schema().get("$schema").is_none());
    assert_eq!(
        servers
            .call("everything__echo", json!({"message": "hi there"}))
            .await
            .unwrap(),
        "Echo: hi there"
    );
    let sum = servers
        .call("everything__get-sum", json!({"a": 2, "b": 40}))
        .await
        .unwrap();
    assert!(sum.contains("42"), "{sum}");
    servers.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_environment_holds_no_secret_of_loom() {
    // SAFETY (edition 2021: safe): set before the server starts; no other
    // test reads these names.
    std::env::set_var("LOOM_MCP_TEST_API_KEY", "sk-mcp-test-never-shown-1234567890");
    std::env::set_var("LOOM_MCP_TEST_UNLISTED", "not-on-the-allowlist");
    let servers = Servers::new(vec![(
        "everything",
        config(
            &mcp_servers::everything(),
            &marker(),
            &[("CONFIGURED_FOR_SERVER", "yes".to_string())],
        ),
    )]);
    servers.start().await;
    let env = servers.call("everything__get-env", json!({})).await.unwrap();
    assert!(env.contains("CONFIGURED_FOR_SERVER"), "{env}");
    assert!(env.contains("PATH"), "{env}");
    for absent in [
        "LOOM_MCP_TEST_API_KEY",
        "sk-mcp-test-never-shown",
        "LOOM_MCP_TEST_UNLISTED",
        "OPENAI_API_KEY",
    ] {
        assert!(!env.contains(absent), "{absent} reached the server:\n{env}");
    }
    servers.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_time_server_works_too() {
    let servers = Servers::new(vec![("time", config(&mcp_servers::time(), &marker(), &[]))]);
    servers.start().await;
    let now = servers
        .call("time__get_current_time", json!({"timezone": "UTC"}))
        .await
        .unwrap();
    assert!(now.contains("UTC"), "{now}");
    let bad = servers
        .call("time__get_current_time", json!({"timezone": "Nowhere/Atlantis"}))
        .await;
    assert!(matches!(bad, Err(ToolError::Failed(_))), "{bad:?}");
    servers.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_schema_skips_that_tool_only_and_is_error_results_are_errors() {
    let servers = Servers::new(vec![("fixture", config(&mcp_servers::fixture(), &marker(), &[]))]);
    servers.start().await;
    let names = servers.clients.tool_names();
    assert!(names.iter().any(|n| n == "fixture__echo"), "{names:?}");
    assert!(!names.iter().any(|n| n == "fixture__bad_schema"), "{names:?}");
    let server = &servers.clients.servers()[0];
    assert!(server.skipped_tools().iter().any(|why| why.contains("bad_schema")));
    assert_eq!(server.state(), ServerState::Ready);

    assert_eq!(
        servers.call("fixture__echo", json!({"text": "ok"})).await.unwrap(),
        "ok"
    );
    let failed = servers.call("fixture__error_result", json!({})).await;
    assert_eq!(failed, Err(ToolError::Failed("it failed".to_string())));
    servers.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_changed_refreshes_the_tools() {
    let servers = Servers::new(vec![("fixture", config(&mcp_servers::fixture(), &marker(), &[]))]);
    servers.start().await;
    let before = servers.clients.generation();
    assert!(!servers.clients.tool_names().iter().any(|n| n == "fixture__added"));
    servers.call("fixture__add_tool", json!({})).await.unwrap();
    eventually("the new tool", || servers.clients.generation() != before).await;
    assert!(servers.clients.tool_names().iter().any(|n| n == "fixture__added"));
    assert_eq!(servers.call("fixture__added", json!({})).await.unwrap(), "added works");
    servers.finish().await;
}

/// `tools/call` requests the fixture has received.
fn calls(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|line| *line == "method tools/call")
        .count()
}

fn cancellations(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|line| line.starts_with("cancelled "))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_times_out_is_cancelled_at_the_server() {
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("fixture.log");
    let mut fixture = config(
        &mcp_servers::fixture(),
        &marker(),
        &[("LOOM_FIXTURE_LOG", log.display().to_string())],
    );
    fixture.timeout_secs = Some(1);
    let servers = Servers::new(vec![("fixture", fixture)]);
    servers.start().await;
    assert!(servers.tool("fixture__hang").bounds_own_time());
    let started = Instant::now();
    let err = servers.call("fixture__hang", json!({})).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(
        matches!(&err, ToolError::Failed(text) if text.contains("did not answer within 1.0 s")),
        "{err:?}"
    );
    eventually("the cancellation", || !cancellations(&log).is_empty()).await;
    assert!(
        cancellations(&log)[0].contains("timed out"),
        "{:?}",
        cancellations(&log)
    );

    // Loom's own cancel is passed on the same way, once the server has
    // the call.
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    let log_seen = log.clone();
    tokio::spawn(async move {
        while calls(&log_seen) < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        trigger.cancel();
    });
    let err = servers.call_with("fixture__hang", json!({}), cancel).await.unwrap_err();
    assert_eq!(err, ToolError::Cancelled);
    eventually("the second cancellation", || cancellations(&log).len() == 2).await;
    assert!(cancellations(&log)[1].contains("cancelled by the client"));

    // A call whose future is dropped (the pipeline's own timeout) too.
    let mut call = Box::pin(servers.call("fixture__hang", json!({})));
    let received = async {
        while calls(&log) < 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        _ = &mut call => panic!("a hanging call answered"),
        _ = received => {}
    }
    drop(call);
    eventually("the third cancellation", || cancellations(&log).len() == 3).await;
    assert!(cancellations(&log)[2].contains("abandoned"));

    // The server still answers.
    assert_eq!(
        servers
            .call("fixture__echo", json!({"text": "still here"}))
            .await
            .unwrap(),
        "still here"
    );
    servers.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_mid_call_fails_it_at_once_and_restarts_on_next_use() {
    let servers = Servers::new(vec![("fixture", config(&mcp_servers::fixture(), &marker(), &[]))]);
    servers.start().await;
    let started = Instant::now();
    let err = servers.call("fixture__crash", json!({})).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the call waited for a dead server"
    );
    assert!(
        matches!(&err, ToolError::Failed(text) if text.contains("stopped during the call")),
        "{err:?}"
    );
    assert!(matches!(servers.clients.servers()[0].state(), ServerState::Down(_)));
    assert_eq!(
        servers.call("fixture__echo", json!({"text": "back"})).await.unwrap(),
        "back"
    );
    assert_eq!(servers.clients.servers()[0].state(), ServerState::Ready);
    servers.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_output_and_forked_children_do_not_hurt() {
    let servers = Servers::new(vec![("fixture", config(&mcp_servers::fixture(), &marker(), &[]))]);
    servers.start().await;
    // A megabyte on stderr while answering: stderr is drained, so the
    // server never blocks on it.
    let flood = servers.call("fixture__flood", json!({"bytes": 200000})).await.unwrap();
    assert_eq!(flood.len(), 200000);
    assert!(!servers.clients.servers()[0].stderr_tail().is_empty());
    let forked = servers.call("fixture__fork_child", json!({})).await.unwrap();
    assert!(forked.starts_with("child "), "{forked}");
    // `finish` checks that the forked child went with its server.
    servers.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_is_given_up_on_at_its_startup_limit() {
    let mut silent = config(
        &ServerCommand {
            command: "sleep".to_string(),
            args: vec!["300".to_string()],
            env: Vec::new(),
        },
        &marker(),
        &[],
    );
    silent.startup_timeout_secs = Some(1);
    let servers = Servers::new(vec![("silent", silent)]);
    let reports = servers.clients.start().await;
    let why = reports[0].outcome.clone().unwrap_err();
    assert!(why.contains("no answer to `initialize`"), "{why}");
    assert!(servers.clients.tool_names().is_empty());
    assert!(matches!(servers.clients.servers()[0].state(), ServerState::Down(_)));
    servers.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamable_http_server_works_like_a_stdio_one() {
    let everything = mcp_servers::everything();
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let mut server = tokio::process::Command::new(&everything.command)
        .arg(&everything.args[0])
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < deadline, "the HTTP server did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let config = McpServerConfig {
        url: Some(format!("http://127.0.0.1:{port}/mcp")),
        startup_timeout_secs: Some(30),
        ..McpServerConfig::default()
    };
    let workspace = tempfile::tempdir().unwrap();
    let clients = McpClients::new(&BTreeMap::from([("web".to_string(), config)]), workspace.path()).unwrap();
    let reports = clients.start().await;
    assert!(reports[0].outcome.is_ok(), "{:?}", reports[0].outcome);
    let echo = clients
        .tools()
        .into_iter()
        .find(|tool| tool.name() == "web__echo")
        .unwrap();
    let ctx = ToolContext::new("c1", "r1".into(), Arc::from(Path::new("/")), CancellationToken::new());
    let output = echo.call_json(json!({"message": "over http"}), ctx).await.unwrap();
    assert_eq!(output.content, "Echo: over http");
    clients.shutdown().await;
    server.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_failed_to_start_is_started_again_before_a_later_turn() {
    let place = tempfile::tempdir().unwrap();
    let script = place.path().join("late_server.py");
    let fixture = mcp_servers::fixture();
    let mut late = config(&fixture, &marker(), &[]);
    late.args = vec![script.display().to_string()];
    let servers = Servers::new(vec![("late", late)]);
    // The script is not there yet: the start fails, and no tool is offered.
    let reports = servers.clients.start().await;
    assert!(reports[0].outcome.is_err());
    assert!(servers.clients.tool_names().is_empty());
    // Once it can start, the run's wait before a model call starts it.
    std::fs::copy(&fixture.args[0], &script).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while servers.clients.tool_names().is_empty() {
        assert!(Instant::now() < deadline, "the server was not started again");
        servers.clients.settle().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(servers.call("late__echo", json!({"text": "up"})).await.unwrap(), "up");
    servers.finish().await;
}
