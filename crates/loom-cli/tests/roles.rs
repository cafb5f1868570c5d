//! Roles and the audit trail (docs/server.md, "Roles" and "Audit trail")
//! against a real `loom serve`: a viewer's every change is refused with
//! `FORBIDDEN` over WebSocket and HTTP and recorded; an admin sees and
//! cancels another token's run, and that is recorded; a token limited to
//! models and tools gets no other; the trail is read back over HTTP and
//! with `loom audit`, and holds no token.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use common::gateway::{config, http, run_id, Gateway, ALICE, BOB};
use common::loom_in;
use loom_testkit::{PromptModel, PromptModelOptions};
use serde_json::{json, Value};

const OPS: &str = "ops-admin-token-0123456789";
const WATCHER: &str = "watcher-token-0123456789";
const LIMITED: &str = "limited-token-0123456789";

fn tokens(watcher_role: &str) -> String {
    format!(
        r#"models = ["openai:other"]

[[server.tokens]]
name = "ops"
token = "{OPS}"
role = "admin"

[[server.tokens]]
name = "watcher"
token = "{WATCHER}"
role = "{watcher_role}"

[[server.tokens]]
name = "limited"
token = "{LIMITED}"
models = ["openai:other"]
tools = ["read_file"]
"#
    )
}

/// The audit trail as an admin reads it over HTTP.
async fn audit(gateway: &Gateway, query: &str) -> Vec<Value> {
    let response = http(OPS)
        .get(gateway.url(&format!("/v1/audit{query}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    body["entries"].as_array().unwrap().clone()
}

fn find<'a>(entries: &'a [Value], action: &str, token: &str) -> Vec<&'a Value> {
    entries
        .iter()
        .filter(|e| e["action"] == action && e["token"] == token)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_changes_nothing_an_admin_cancels_any_run_and_every_action_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let model = PromptModel::start(PromptModelOptions {
        keep_bodies: true,
        ..PromptModelOptions::default()
    });
    config(dir.path(), &model.url(), &tokens("viewer"));
    let db = dir.path().join("gateway.db");
    let gateway = Gateway::start(dir.path(), &["--ask", "write_file", "--db", db.to_str().unwrap()]);

    // Alice's run waits for her answer.
    let mut alice = gateway.ws(ALICE).await;
    let run = run_id(
        &alice
            .ok(
                "agent.run",
                json!({"prompt": "write steps=1 tool=write_file", "sessionId": "s-alice"}),
            )
            .await,
    );
    let ask = alice.until(&run, "permission.request").await;
    let request_id = ask["payload"]["requestId"].as_str().unwrap().to_string();

    // The viewer: every change refused, over WebSocket …
    let mut watcher = gateway.ws(WATCHER).await;
    assert_eq!(
        watcher.error("agent.run", json!({"prompt": "hello"})).await,
        "FORBIDDEN"
    );
    assert_eq!(watcher.error("agent.cancel", json!({"runId": run})).await, "FORBIDDEN");
    assert_eq!(
        watcher
            .error("agent.steer", json!({"runId": run, "message": "stop"}))
            .await,
        "FORBIDDEN"
    );
    assert_eq!(
        watcher
            .error(
                "permission.respond",
                json!({"runId": run, "requestId": request_id, "decision": "allow"})
            )
            .await,
        "FORBIDDEN"
    );
    // … and over HTTP.
    let viewer = http(WATCHER);
    let refused = [
        viewer.post(gateway.url("/v1/runs")).json(&json!({"prompt": "hello"})),
        viewer.post(gateway.url(&format!("/v1/runs/{run}/cancel"))),
        viewer
            .post(gateway.url(&format!("/v1/runs/{run}/steer")))
            .json(&json!({"message": "stop"})),
        viewer
            .post(gateway.url(&format!("/v1/runs/{run}/permissions/{request_id}")))
            .json(&json!({"decision": "always"})),
        viewer.get(gateway.url("/v1/audit")),
    ];
    for request in refused {
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 403);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "FORBIDDEN", "{body}");
    }
    // What a client chose is kept short in the trail, and a token sent
    // where a run id goes is not kept at all.
    let huge = "m".repeat(100_000);
    let refused = viewer
        .post(gateway.url("/v1/runs"))
        .json(&json!({"prompt": "x", "model": huge, "sessionId": huge}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    assert_eq!(
        viewer
            .post(gateway.url(&format!("/v1/runs/{ALICE}/cancel")))
            .send()
            .await
            .unwrap()
            .status(),
        403
    );
    // It reads what is its own: nothing here, and not Alice's run.
    assert_eq!(watcher.ok("run.list", json!({})).await["runs"], json!([]));
    assert_eq!(watcher.error("run.get", json!({"runId": run})).await, "NOT_FOUND");
    // An operator does not read the audit trail either.
    assert_eq!(
        http(ALICE).get(gateway.url("/v1/audit")).send().await.unwrap().status(),
        403
    );

    // The admin sees Alice's run, its ask and its events …
    let mut ops = gateway.ws(OPS).await;
    let listed = ops.ok("run.list", json!({})).await;
    assert!(
        listed["runs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["runId"] == run.as_str()),
        "{listed}"
    );
    assert_eq!(
        ops.ok("run.get", json!({"runId": run})).await["status"],
        "WAITING_PERMISSION"
    );
    let asks = ops.ok("permission.list", json!({})).await;
    assert_eq!(asks["asks"][0]["requestId"], request_id.as_str());
    // … but is not let into her session: only her runs are reachable.
    assert_eq!(
        ops.error("agent.run", json!({"prompt": "x", "sessionId": "s-alice"}))
            .await,
        "CONFLICT"
    );
    // The admin cancels it over HTTP; Alice hears it end.
    let cancelled = http(OPS)
        .post(gateway.url(&format!("/v1/runs/{run}/cancel")))
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), 200);
    let end = alice.until(&run, "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "CANCELED");
    assert!(!gateway.dir.join("out_1.txt").exists());

    // A token limited to a model and a tool gets no other.
    let limited = http(LIMITED);
    let other_model = limited
        .post(gateway.url("/v1/runs"))
        .json(&json!({"prompt": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(other_model.status(), 403, "the default model is not granted");
    let other_tool = limited
        .post(gateway.url("/v1/runs"))
        .json(&json!({"prompt": "hi", "model": "openai:other", "tools": ["write_file"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(other_tool.status(), 403);
    let mut limited_ws = gateway.ws(LIMITED).await;
    let granted = run_id(
        &limited_ws
            .ok(
                "agent.run",
                json!({"prompt": "only granted tools answer=ok", "model": "openai:other"}),
            )
            .await,
    );
    assert_eq!(
        limited_ws.until(&granted, "lifecycle.end").await["payload"]["status"],
        "DONE"
    );
    // What the model was offered: read_file and nothing else.
    let body = model
        .bodies()
        .into_iter()
        .rev()
        .find(|body| body.to_string().contains("only granted tools"))
        .unwrap();
    let offered: Vec<&str> = body["tools"]
        .as_array()
        .map(|tools| tools.iter().filter_map(|t| t["function"]["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(offered, ["read_file"], "{body}");

    // A token that is not one, and a sign-in to the page.
    let unknown = http("not-a-token-at-all-000000")
        .get(gateway.url("/v1/runs"))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 401);
    let page = format!("http://{}", gateway.addr);
    let signed_in = reqwest::Client::new()
        .post(gateway.url("/v1/session"))
        .header("Origin", &page)
        .json(&json!({"token": BOB}))
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), 200);
    let who: Value = signed_in.json().await.unwrap();
    assert_eq!(
        (who["principal"].as_str(), who["role"].as_str()),
        (Some("bob"), Some("operator"))
    );

    // The trail, as the admin reads it.
    let entries = audit(&gateway, "").await;
    let text = serde_json::to_string(&entries).unwrap();
    for secret in [ALICE, BOB, OPS, WATCHER, LIMITED, "not-a-token-at-all-000000"] {
        assert!(!text.contains(secret), "a token is in the audit trail: {text}");
    }
    let started = find(&entries, "agent.run", "alice");
    assert_eq!(started.len(), 1, "{text}");
    assert_eq!(started[0]["target"], run.as_str());
    assert_eq!(started[0]["outcome"], "ok");
    assert!(
        started[0]["address"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{text}"
    );
    // Each of the viewer's refused changes, two of each (one per
    // transport), and the two sent to test what the trail keeps.
    for (action, count) in [
        ("agent.run", 3),
        ("agent.cancel", 3),
        ("agent.steer", 2),
        ("permission.respond", 2),
    ] {
        let refusals = find(&entries, action, "watcher");
        assert_eq!(refusals.len(), count, "{action}: {text}");
        assert!(refusals.iter().all(|e| e["outcome"] == "FORBIDDEN"), "{text}");
    }
    let long = find(&entries, "agent.run", "watcher")[2];
    assert!(
        long["detail"]["model"].as_str().unwrap().chars().count() <= 201,
        "{long}"
    );
    assert!(long.to_string().len() < 2_000, "{long}");
    assert_eq!(find(&entries, "agent.cancel", "watcher")[2]["target"], "[a token]");
    let answers = find(&entries, "permission.respond", "watcher");
    let always: Vec<&Value> = answers.iter().map(|e| &e["detail"]["always"]).collect();
    assert_eq!(always, [&json!(false), &json!(true)], "{text}");
    assert_eq!(answers[0]["target"], run.as_str());
    assert_eq!(find(&entries, "audit.read", "watcher")[0]["outcome"], "FORBIDDEN");
    assert_eq!(find(&entries, "audit.read", "alice")[0]["outcome"], "FORBIDDEN");
    let cancel = find(&entries, "agent.cancel", "ops");
    assert_eq!(cancel.len(), 1, "{text}");
    assert_eq!(
        (cancel[0]["target"].as_str(), cancel[0]["outcome"].as_str()),
        (Some(run.as_str()), Some("ok"))
    );
    assert_eq!(find(&entries, "agent.run", "ops")[0]["outcome"], "CONFLICT");
    assert_eq!(find(&entries, "agent.run", "limited").len(), 3);
    let refused_token: Vec<&Value> = entries.iter().filter(|e| e["action"] == "token.refused").collect();
    assert_eq!(refused_token.len(), 1, "{text}");
    assert_eq!(refused_token[0]["detail"]["reason"], "unknown token");
    assert!(refused_token[0].get("token").is_none());
    assert_eq!(find(&entries, "session.sign_in", "bob").len(), 1, "{text}");
    // Reads are not recorded.
    assert!(entries
        .iter()
        .all(|e| e["action"] != "run.list" && e["action"] != "run.get"));
    // Filters: one token's records.
    let only_ops = audit(&gateway, "?tokenName=ops").await;
    assert!(!only_ops.is_empty() && only_ops.iter().all(|e| e["token"] == "ops"));

    // `loom audit` reads the same trail from the gateway's database.
    let out = loom_in(dir.path())
        .args(["audit", "--json", "--token", "watcher", "--since", "1h", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 11, "{lines:?}");
    assert!(lines
        .iter()
        .all(|e| e["token"] == "watcher" && e["outcome"] == "FORBIDDEN"));
    let table = loom_in(dir.path())
        .args(["audit", "--token", "ops", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table
            .lines()
            .any(|line| line.contains("agent.cancel") && line.contains(&run) && line.contains("ok")),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_made_a_viewer_still_reads_its_runs_and_changes_none() {
    let dir = tempfile::tempdir().unwrap();
    let model = PromptModel::start(PromptModelOptions::default());
    config(dir.path(), &model.url(), &tokens("operator"));
    let mut gateway = Gateway::start(dir.path(), &[]);
    let mut watcher = gateway.ws(WATCHER).await;
    let run = run_id(&watcher.ok("agent.run", json!({"prompt": "hello answer=hi"})).await);
    assert_eq!(watcher.until(&run, "lifecycle.end").await["payload"]["status"], "DONE");
    drop(watcher);
    assert!(gateway.terminate().success());

    // The same token, now a viewer.
    config(dir.path(), &model.url(), &tokens("viewer"));
    let gateway = Gateway::start(dir.path(), &[]);
    let mut watcher = gateway.ws(WATCHER).await;
    let listed = watcher.ok("run.list", json!({})).await;
    assert_eq!(listed["runs"][0]["runId"], run.as_str());
    watcher.ok("run.subscribe", json!({"runId": run})).await;
    assert_eq!(watcher.until(&run, "lifecycle.end").await["payload"]["status"], "DONE");
    let events = http(WATCHER)
        .get(gateway.url(&format!("/v1/runs/{run}/events")))
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);
    assert_eq!(
        watcher
            .error("agent.run", json!({"prompt": "again", "sessionId": run}))
            .await,
        "FORBIDDEN"
    );
    let whoami: Value = http(WATCHER)
        .get(gateway.url("/v1/session"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(whoami["role"], "viewer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_is_recorded_even_when_its_client_hangs_up_before_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let model = PromptModel::start(PromptModelOptions::default());
    config(dir.path(), &model.url(), &tokens("viewer"));
    let db = dir.path().join("gateway.db");
    let gateway = Gateway::start(dir.path(), &["--ask", "write_file", "--db", db.to_str().unwrap()]);
    let mut alice = gateway.ws(ALICE).await;
    let run = run_id(
        &alice
            .ok("agent.run", json!({"prompt": "write steps=1 tool=write_file"}))
            .await,
    );
    let ask = alice.until(&run, "permission.request").await;
    let request_id = ask["payload"]["requestId"].as_str().unwrap().to_string();

    // Another process holds the database: the answer waits for it, and
    // the client gives up after half a second.
    let locked = rusqlite::Connection::open(&db).unwrap();
    locked.execute_batch("BEGIN IMMEDIATE").unwrap();
    let gave_up = http(ALICE)
        .post(gateway.url(&format!("/v1/runs/{run}/permissions/{request_id}")))
        .timeout(std::time::Duration::from_millis(500))
        .json(&json!({"decision": "always"}))
        .send()
        .await;
    assert!(gave_up.is_err(), "the answer came before the database was free");
    // Reading meanwhile (the connection answers the gateway's pings): the
    // run cannot end while the database is held.
    let early = tokio::time::timeout(std::time::Duration::from_secs(2), alice.until(&run, "lifecycle.end")).await;
    assert!(early.is_err(), "the run ended while the database was held");
    locked.execute_batch("COMMIT").unwrap();
    drop(locked);

    // The answer applied, and its record is there.
    assert_eq!(alice.until(&run, "lifecycle.end").await["payload"]["status"], "DONE");
    let mut recorded = Vec::new();
    for _ in 0..50 {
        recorded = audit(&gateway, "?tokenName=alice").await;
        if recorded.iter().any(|e| e["action"] == "permission.respond") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let answer = recorded
        .iter()
        .find(|e| e["action"] == "permission.respond")
        .unwrap_or_else(|| panic!("no record of the answer: {recorded:?}"));
    assert_eq!(answer["detail"]["always"], true);
    assert_eq!(answer["target"], run.as_str());
}

/// What a client chose is kept without any configured token in it, even
/// one glued to other text (`x:TOKEN`), given in clear or by its digest;
/// and `loom audit` shows every field with its control and direction
/// characters escaped, so U+202E cannot reorder a line of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trail_keeps_no_token_however_glued_and_loom_audit_prints_no_control_or_direction_character() {
    let dir = tempfile::tempdir().unwrap();
    let model = PromptModel::start(PromptModelOptions::default());
    config(dir.path(), &model.url(), &tokens("viewer"));
    let db = dir.path().join("gateway.db");
    let gateway = Gateway::start(dir.path(), &["--db", db.to_str().unwrap()]);
    let mut alice = gateway.ws(ALICE).await;
    // Bob's token is configured by its digest and not used yet: found
    // where punctuation sets it apart. Alice's own, and the others given
    // in clear, wherever they stand.
    let refused = alice
        .call(
            "agent.run",
            json!({
                "prompt": "hello",
                "model": format!("x:{BOB}\u{202e}gpt"),
                "sessionId": format!("s{OPS}s\u{9b}31m"),
            }),
        )
        .await;
    assert_eq!(refused["ok"], false, "{refused}");
    let refused = alice
        .call("agent.cancel", json!({"runId": format!("x:{ALICE}\u{2066}{WATCHER}")}))
        .await;
    assert_eq!(refused["error"]["code"], "NOT_FOUND", "{refused}");
    // Bob signs in: his token is now found glued to anything too.
    let mut bob = gateway.ws(BOB).await;
    let refused = bob.call("agent.cancel", json!({"runId": format!("q{BOB}q")})).await;
    assert_eq!(refused["error"]["code"], "NOT_FOUND", "{refused}");
    let secrets = [ALICE, BOB, OPS, WATCHER];

    // As stored: what was chosen, without the tokens.
    let stored: Vec<String> = {
        let db = rusqlite::Connection::open(&db).unwrap();
        let mut rows = db.prepare("SELECT body FROM audit").unwrap();
        rows.query_map([], |row| row.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let stored = stored.join("\n");
    for token in secrets {
        assert!(!stored.contains(token), "{token} is stored: {stored}");
    }
    assert!(stored.contains("x:[a token]\u{202e}gpt"), "{stored}");
    assert!(stored.contains("s[a token]s"), "{stored}");
    assert!(stored.contains("x:[a token]\u{2066}[a token]"), "{stored}");
    assert!(stored.contains("q[a token]q"), "{stored}");

    // As `loom audit` prints it, in lines and in JSON.
    for json in [false, true] {
        let mut command = loom_in(dir.path());
        command.arg("audit");
        if json {
            command.arg("--json");
        }
        let out = command.arg("--db").arg(&db).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let printed = String::from_utf8(out.stdout).unwrap();
        for hidden in ['\u{202e}', '\u{2066}', '\u{9b}', '\u{1b}'] {
            assert!(!printed.contains(hidden), "{hidden:?} printed raw: {printed}");
        }
        for token in secrets {
            assert!(!printed.contains(token), "{token} printed: {printed}");
        }
        if json {
            assert!(printed.contains(r"x:[a token]\u202egpt"), "{printed}");
            let models: Vec<Value> = printed
                .lines()
                .map(|line| serde_json::from_str::<Value>(line).unwrap()["detail"]["model"].clone())
                .collect();
            assert!(models.contains(&json!("x:[a token]\u{202e}gpt")), "{models:?}");
        } else {
            assert!(printed.contains(r"x:[a token]\u{202e}gpt"), "{printed}");
            assert!(printed.contains(r"x:[a token]\u{2066}[a token]"), "{printed}");
            assert!(printed.contains(r"s[a token]s\u{9b}31m"), "{printed}");
        }
    }
}
