//! The `loom` binary on Redis (docs/cluster.md): `loom run --redis URL`
//! (or `LOOM_REDIS_URL`, or `[cluster] redis`) records its runs there,
//! `loom runs … --redis` reads them back from any directory, and `loom
//! serve` on Redis executing runs itself (`[cluster] execute = true`; the
//! gateway whose workers execute them is in `workers.rs`).
//! Against a real `redis-server`, started per test.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use common::gateway::{config, http, Gateway, ALICE};
use common::{json_lines, loom_in};
use loom_testkit::redis_server::RedisServer;
use loom_testkit::{PromptModel, PromptModelOptions};
use serde_json::{json, Value};

const SCRIPT: &str =
    r#"[{"tool_calls":[{"name":"write_file","arguments":{"path":"out.txt","content":"x"}}]},{"content":"written"}]"#;

/// A server keeping its files in `dir`/redis.
fn redis(dir: &std::path::Path) -> RedisServer {
    let files = dir.join("redis");
    std::fs::create_dir_all(&files).unwrap();
    RedisServer::start(&files).unwrap_or_else(|err| panic!("{err}"))
}

fn stdout_of(output: &std::process::Output) -> String {
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn a_run_recorded_in_redis_is_read_back_from_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let server = redis(dir.path());
    let workspace = dir.path().join("work");
    std::fs::create_dir(&workspace).unwrap();
    std::fs::write(workspace.join("s.json"), SCRIPT).unwrap();
    let ran = loom_in(&workspace)
        .args(["run", "--json", "--allow", "write_file", "--redis", &server.url(0)])
        .args(["--model", "scripted:s.json", "write"])
        .output()
        .unwrap();
    let seen = json_lines(stdout_of(&ran).as_bytes());
    let run_id = seen[0]["runId"].as_str().unwrap().to_string();
    assert_eq!(seen.last().unwrap()["type"], "lifecycle.end");
    // Nothing was written beside the workspace: no SQLite database.
    assert!(!common::database_of(&workspace).exists());

    // Another directory, the URL from the environment.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let listed = loom_in(&elsewhere)
        .env("LOOM_REDIS_URL", server.url(0))
        .args(["runs", "list", "--json"])
        .output()
        .unwrap();
    let runs: Value = serde_json::from_str(&stdout_of(&listed)).unwrap();
    assert_eq!(runs[0]["runId"], run_id.as_str());
    assert_eq!(runs[0]["status"], "DONE");
    assert_eq!(runs[0]["content"], "written");

    // The stored log is what the run printed, event for event.
    let events = loom_in(&elsewhere)
        .args(["runs", "events", &run_id, "--redis", &server.url(0)])
        .output()
        .unwrap();
    assert_eq!(json_lines(stdout_of(&events).as_bytes()), seen);

    let shown = loom_in(&elsewhere)
        .args(["runs", "show", &run_id, "--json", "--redis", &server.url(0)])
        .output()
        .unwrap();
    let shown: Value = serde_json::from_str(&stdout_of(&shown)).unwrap();
    assert_eq!(shown["journal"].as_array().unwrap().len(), 1, "the write was journaled");
    assert_eq!(
        shown["messages"].as_array().unwrap().last().unwrap()["content"],
        "written"
    );
}

#[test]
fn cluster_redis_in_loom_toml_and_its_conflicts() {
    let dir = tempfile::tempdir().unwrap();
    let server = redis(dir.path());
    let workspace = dir.path().join("work");
    std::fs::create_dir(&workspace).unwrap();
    std::fs::write(workspace.join("s.json"), r#"[{"content":"hi"}]"#).unwrap();
    std::fs::write(
        workspace.join("loom.toml"),
        format!("[cluster]\nredis = \"{}\"\n", server.url(0)),
    )
    .unwrap();
    // A project's [cluster] sends the runs elsewhere: it waits for trust
    // (tests/attacks.rs tries it untrusted).
    common::trust(&workspace);
    let ran = loom_in(&workspace)
        .args(["run", "--model", "scripted:s.json", "x"])
        .output()
        .unwrap();
    assert_eq!(stdout_of(&ran).trim(), "hi");
    let listed = loom_in(&workspace)
        .args(["runs", "list", "--json", "--redis", &server.url(0)])
        .output()
        .unwrap();
    let runs: Value = serde_json::from_str(&stdout_of(&listed)).unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 1);

    // `--db` wins over a Redis URL from the environment (or the flag):
    // the run is in the database, not in Redis.
    let both = loom_in(&workspace)
        .env("LOOM_REDIS_URL", server.url(0))
        .args(["run", "--db", "x.db", "--model", "scripted:s.json", "x"])
        .output()
        .unwrap();
    assert_eq!(stdout_of(&both).trim(), "hi");
    assert!(workspace.join("x.db").is_file());
    let listed = loom_in(&workspace)
        .args(["runs", "list", "--json", "--redis", &server.url(0)])
        .output()
        .unwrap();
    let runs: Value = serde_json::from_str(&stdout_of(&listed)).unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 1, "still only the first run");
    // `--redis` wins over `store` in loom.toml; `[cluster] redis` beside
    // `store` in one file is refused.
    std::fs::write(workspace.join("loom.toml"), "store = \"none\"\n").unwrap();
    let flag = loom_in(&workspace)
        .args(["run", "--redis", &server.url(0), "--model", "scripted:s.json", "x"])
        .output()
        .unwrap();
    assert_eq!(stdout_of(&flag).trim(), "hi");
    std::fs::write(
        workspace.join("loom.toml"),
        format!("store = \"none\"\n[cluster]\nredis = \"{}\"\n", server.url(0)),
    )
    .unwrap();
    common::trust(&workspace);
    let contradiction = loom_in(&workspace)
        .args(["run", "--model", "scripted:s.json", "x"])
        .output()
        .unwrap();
    assert_eq!(contradiction.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&contradiction.stderr).contains("keep one"));
    std::fs::remove_file(workspace.join("loom.toml")).unwrap();
    // The URL's value never shows in help, even from the environment.
    let help = loom_in(&workspace)
        .env("LOOM_REDIS_URL", "redis://:hunter2-secret@127.0.0.1:6379/0")
        .args(["run", "--help"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&help.stdout).contains("hunter2"));

    // A Redis nobody answers at: a clear error, not a hang.
    let gone = loom_in(&workspace)
        .args([
            "run",
            "--redis",
            "redis://127.0.0.1:1/0",
            "--model",
            "scripted:s.json",
            "x",
        ])
        .output()
        .unwrap();
    assert_eq!(gone.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&gone.stderr);
    assert!(
        stderr.contains("cannot use the Redis at redis://127.0.0.1:1/0"),
        "{stderr}"
    );
}

#[test]
fn a_gateway_whose_redis_cannot_be_reached_at_start_says_which() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("loom.toml");
    std::fs::write(&config, "[cluster]\nredis = \"redis://127.0.0.1:1/0\"\n").unwrap();
    let refused = loom_in(dir.path())
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--model",
            "scripted:s.json",
            "--config",
        ])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("cannot use the Redis at redis://127.0.0.1:1/0"),
        "{stderr}"
    );
}

/// Redis killed (SIGKILL) while a run's `bash` call runs: the run stops
/// with an error, it does not hang; once Redis is back from its
/// append-only file the run is `INTERRUPTED`, and resumed it does not run
/// the cut-off call again (its effect is unknown) but runs the next one.
#[test]
fn a_run_whose_redis_died_is_resumed_without_repeating_its_cut_off_call() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = redis(dir.path());
    let workspace = dir.path().join("work");
    std::fs::create_dir(&workspace).unwrap();
    std::fs::write(
        workspace.join("s.json"),
        r#"[{"tool_calls":[{"name":"bash","arguments":{"command":"echo one >> log.txt; sleep 3"}}]},
            {"tool_calls":[{"name":"bash","arguments":{"command":"echo two >> log.txt"}}]},
            {"content":"done"}]"#,
    )
    .unwrap();
    let mut run = loom_in(&workspace)
        .args([
            "run",
            "--allow",
            "bash",
            "--redis",
            &server.url(0),
            "--model",
            "scripted:s.json",
            "go",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let log = workspace.join("log.txt");
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("one") {
        assert!(started.elapsed().as_secs() < 30, "the first call never ran");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    server.kill();
    // The run stops on its own: its next write fails.
    let stopped = std::time::Instant::now();
    let status = loop {
        if let Some(status) = run.try_wait().unwrap() {
            break status;
        }
        assert!(stopped.elapsed().as_secs() < 30, "the run hangs without its Redis");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(!status.success());
    server.restart().unwrap();

    let listed = loom_in(&workspace)
        .args(["runs", "list", "--json", "--redis", &server.url(0)])
        .output()
        .unwrap();
    let runs: Value = serde_json::from_str(&stdout_of(&listed)).unwrap();
    assert_eq!(runs[0]["status"], "INTERRUPTED", "{runs}");
    let run_id = runs[0]["runId"].as_str().unwrap().to_string();
    let resumed = loom_in(&workspace)
        .args(["runs", "resume", &run_id, "--allow", "bash", "--redis", &server.url(0)])
        .args(["--model", "scripted:s.json"])
        .output()
        .unwrap();
    assert_eq!(stdout_of(&resumed).trim(), "done");
    // The cut-off call ran once (before the crash), the next one once.
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "one\ntwo\n");
    let events = loom_in(&workspace)
        .args(["runs", "events", &run_id, "--redis", &server.url(0)])
        .output()
        .unwrap();
    let events = json_lines(stdout_of(&events).as_bytes());
    let cut_off = events
        .iter()
        .find(|event| event["type"] == "tool.result" && event["status"] == "error")
        .unwrap_or_else(|| panic!("no result for the cut-off call: {events:?}"));
    assert!(
        cut_off["content"].as_str().unwrap().contains("interrupted"),
        "{cut_off}"
    );
    assert_eq!(events.last().unwrap()["type"], "lifecycle.end");
    let seqs: Vec<u64> = events.iter().map(|event| event["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "{seqs:?}");
}

/// A gateway on Redis while Redis is down: not ready, and a new run is
/// refused `UNAVAILABLE` (503, with a retry time) — not an internal error,
/// not a hang; once Redis is back the gateway reconnects by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_whose_redis_is_down_answers_unavailable_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = redis(dir.path());
    let workspace = dir.path().join("gateway");
    std::fs::create_dir(&workspace).unwrap();
    let model = PromptModel::start(PromptModelOptions::default());
    let extra = format!("\n[cluster]\nredis = \"{}\"\nexecute = true\n", server.url(0));
    config(&workspace, &model.url(), &extra);
    let gateway = Gateway::start(&workspace, &[]);
    let ready = || async { reqwest::get(gateway.url("/readyz")).await.unwrap().status().as_u16() };
    let start = || async {
        http(ALICE)
            .post(gateway.url("/v1/runs"))
            .json(&json!({"prompt": "hello steps=0"}))
            .send()
            .await
            .unwrap()
    };
    let ends_done = |run: String| {
        let gateway = &gateway;
        async move {
            for _ in 0..300 {
                let view: Value = http(ALICE)
                    .get(gateway.url(&format!("/v1/runs/{run}")))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                if view["status"] == "DONE" {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            panic!("run {run} did not end: {}", gateway.log_text());
        }
    };
    assert_eq!(ready().await, 200);
    let accepted: Value = start().await.json().await.unwrap();
    ends_done(accepted["runId"].as_str().unwrap().to_string()).await;

    server.kill();
    assert_eq!(ready().await, 503);
    let refused = start().await;
    assert_eq!(refused.status().as_u16(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "UNAVAILABLE", "{body}");

    server.restart().unwrap();
    let mut waited = 0;
    while ready().await != 200 {
        waited += 1;
        assert!(waited < 200, "the gateway did not reconnect: {}", gateway.log_text());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let accepted = start().await;
    assert_eq!(accepted.status().as_u16(), 202);
    let accepted: Value = accepted.json().await.unwrap();
    ends_done(accepted["runId"].as_str().unwrap().to_string()).await;
}

/// The password of a Redis URL, in every form it takes (user info, `pass=`
/// and `password=` of a socket's URL, `rediss`), is never printed: not by
/// `loom run`, `loom runs`, `loom audit` or `loom worker` when the Redis
/// cannot be used, nor by a worker's start line and log.
#[test]
fn no_command_prints_the_password_of_a_redis_url() {
    const PASSWORD: &str = "SECRETPW";
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("work");
    std::fs::create_dir(&workspace).unwrap();
    std::fs::write(workspace.join("s.json"), r#"[{"content":"hi"}]"#).unwrap();
    let gone = dir.path().join("gone.sock");
    let gone = gone.display();
    let printed = |args: &[&str]| {
        let out = loom_in(&workspace).args(args).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let unusable = [
        format!("redis+unix://{gone}?pass={PASSWORD}"),
        format!("redis+unix://{gone}?db=1&pass={PASSWORD}"),
        format!("unix://{gone}?password={PASSWORD}"),
        format!("redis://:{PASSWORD}@127.0.0.1:1/0"),
        format!("redis://loom:{PASSWORD}@127.0.0.1:1/0"),
        format!("rediss://loom:{PASSWORD}@127.0.0.1:1/0"),
    ];
    for url in &unusable {
        for args in [
            vec!["run", "--redis", url, "--model", "scripted:s.json", "x"],
            vec!["runs", "list", "--redis", url],
            vec!["audit", "--redis", url],
            vec!["worker", "--redis", url, "--model", "scripted:s.json"],
        ] {
            let (code, text) = printed(&args);
            assert_eq!(code, Some(2), "{args:?}: {text}");
            assert!(text.contains("cannot use the Redis at"), "{args:?}: {text}");
            assert!(!text.contains(PASSWORD), "{args:?}: {text}");
        }
    }

    // A Redis on a socket behind the password: the URL works, and the
    // worker's start line and log show it without the password.
    let files = dir.path().join("redis");
    std::fs::create_dir_all(&files).unwrap();
    let server = RedisServer::start_with_password(&files, PASSWORD).unwrap_or_else(|err| panic!("{err}"));
    let url = format!("redis+unix://{}?pass={PASSWORD}", server.socket().display());
    let (code, text) = printed(&["run", "--redis", &url, "--model", "scripted:s.json", "x"]);
    assert_eq!((code, text.trim()), (Some(0), "hi"));
    let (code, text) = printed(&["runs", "list", "--redis", &url]);
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains(PASSWORD), "{text}");
    let mut worker = loom_in(&workspace)
        .args(["worker", "--redis", &url, "--model", "scripted:s.json"])
        .env("LOOM_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(worker.stderr.take().unwrap());
    let mut seen = Vec::new();
    for line in std::io::BufRead::lines(stderr).map_while(Result::ok) {
        let started = line.contains("taking runs from");
        seen.push(line);
        if started {
            break;
        }
    }
    let _ = worker.kill();
    let _ = worker.wait();
    let log = seen.join("\n");
    assert!(log.contains("taking runs from redis+unix://"), "{log}");
    assert!(log.contains("pass=[REDACTED]"), "{log}");
    assert!(!log.contains(PASSWORD), "{log}");
}
