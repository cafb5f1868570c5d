//! `loom serve` from outside: a real server process on 127.0.0.1, a real
//! WebSocket client and a real HTTP client, the fake model answering from
//! directives in each prompt (loom_testkit::PromptModel).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::gateway::{config, gateway, http, run_id, Gateway, ALICE, BOB};
use loom_testkit::{PromptModel, PromptModelOptions};
use serde_json::{json, Value};

fn model() -> PromptModel {
    PromptModel::start(PromptModelOptions::default())
}

/// A whole SSE response (the stream ends after the run's `lifecycle.end`).
async fn sse_text(response: reqwest::Response) -> String {
    tokio::time::timeout(Duration::from_secs(20), response.text())
        .await
        .unwrap()
        .unwrap()
}

/// The `id:` lines of an SSE text, as seqs.
fn sse_ids(text: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|line| line.strip_prefix("id:"))
        .map(|id| id.trim().parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_scenarios_multi_step_plain_answer_and_cancel_from_another_connection() {
    let (_dir, _model, gateway) = gateway("", &[]);
    let mut client = gateway.ws(ALICE).await;

    // A multi-step run: one step.completed per tool turn.
    let run = run_id(&client.ok("agent.run", json!({"prompt": "look around steps=2"})).await);
    let end = client.until(&run, "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "DONE");
    let names = client.names(&run);
    assert_eq!(names.first().unwrap(), "lifecycle.start");
    assert_eq!(names.iter().filter(|n| *n == "step.completed").count(), 2, "{names:?}");
    assert_eq!(names.last().unwrap(), "lifecycle.end");
    let seqs = client.seqs(&run);
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());

    // A plain answer: no step.completed.
    let plain = run_id(&client.ok("agent.run", json!({"prompt": "just answer steps=0"})).await);
    client.until(&plain, "lifecycle.end").await;
    assert!(!client.names(&plain).contains(&"step.completed".to_string()));

    // A long run cancelled from a second connection: the answer comes once
    // it has stopped, with the seq of its last event.
    let long = run_id(
        &client
            .ok("agent.run", json!({"prompt": "work steps=50 delay_ms=150"}))
            .await,
    );
    client.until(&long, "step.completed").await;
    let mut other = gateway.ws(ALICE).await;
    let cancelled = other.ok("agent.cancel", json!({"runId": long})).await;
    assert_eq!(cancelled["cancelled"], true);
    let end = client.until(&long, "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "CANCELED");
    assert_eq!(cancelled["finalSeq"], end["seq"]);
    let view = other.ok("run.get", json!({"runId": long})).await;
    assert_eq!(view["status"], "CANCELED");
    // A finished run cannot be cancelled.
    assert_eq!(
        other.error("agent.cancel", json!({"runId": long})).await,
        "INVALID_STATE"
    );
}

/// A run that waits in the gateway's line shows when it was accepted and,
/// once it begins, when it began (docs/server.md, `run.get`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_run_shows_when_it_was_accepted_and_when_it_began() {
    let (_dir, _model, gateway) = gateway("max_runs_per_token = 1", &[]);
    let mut client = gateway.ws(ALICE).await;
    let first = run_id(
        &client
            .ok("agent.run", json!({"prompt": "slow steps=2 delay_ms=300"}))
            .await,
    );
    let second = run_id(&client.ok("agent.run", json!({"prompt": "wait steps=0"})).await);
    let queued = client.ok("run.get", json!({"runId": second})).await;
    assert_eq!(queued["status"], "QUEUED");
    let accepted = queued["acceptedMs"].as_u64().unwrap();
    assert!(queued.get("startedMs").is_none(), "not started yet: {queued}");
    let listed = client.ok("run.list", json!({})).await;
    let in_list = listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|run| run["runId"] == second.as_str())
        .unwrap();
    assert!(
        in_list.get("startedMs").is_none() && in_list["acceptedMs"] == accepted,
        "{in_list}"
    );

    // The live view and the stored record agree on when it began (the
    // record keeps the time of its `lifecycle.start`).
    client.until(&first, "step.completed").await;
    let first_live = client.ok("run.get", json!({"runId": first})).await;
    assert_eq!(first_live["status"], "RUNNING", "{first_live}");
    client.until(&first, "lifecycle.end").await;
    client.until(&second, "lifecycle.end").await;
    let first_view = client.ok("run.get", json!({"runId": first})).await;
    assert_eq!(
        first_live["startedMs"], first_view["startedMs"],
        "{first_live} {first_view}"
    );
    let view = client.ok("run.get", json!({"runId": second})).await;
    assert_eq!(view["status"], "DONE");
    assert_eq!(view["acceptedMs"], accepted, "{view}");
    // It began once the first run had ended and freed alice's one place.
    let began = view["startedMs"].as_u64().unwrap();
    assert!(began >= first_view["endedMs"].as_u64().unwrap(), "{first_view} {view}");
    assert!(began > accepted, "{view}");
    // A run that did not wait began when it was accepted.
    assert!(first_view["startedMs"].as_u64().unwrap() >= first_view["acceptedMs"].as_u64().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_code_from_a_real_bad_frame_or_request() {
    let (_dir, _model, gateway) = gateway("max_frame_bytes = 2048\nmax_queued = 1\nmax_runs_per_token = 1", &[]);
    let mut client = gateway.ws(ALICE).await;
    let code = |frame: &Value| frame["error"]["code"].as_str().unwrap().to_string();

    client.send_text("{not json".into()).await;
    let frame = client.frame().await.unwrap();
    assert_eq!(code(&frame), "PARSE_ERROR");
    client.send_text(json!({"type": "nonsense"}).to_string()).await;
    assert_eq!(code(&client.frame().await.unwrap()), "INVALID_REQUEST");
    assert_eq!(client.error("no.such", json!({})).await, "METHOD_NOT_FOUND");
    assert_eq!(client.error("agent.run", json!({"prompt": 5})).await, "INVALID_PARAMS");
    assert_eq!(
        client.error("agent.run", json!({"prompt": "x", "maxSteps": 0})).await,
        "INVALID_PARAMS"
    );
    assert_eq!(client.error("run.get", json!({"runId": "nope"})).await, "NOT_FOUND");
    client
        .send_text(
            json!({"type": "request", "id": "big", "method": "run.list", "payload": {"x": "y".repeat(5000)}})
                .to_string(),
        )
        .await;
    assert_eq!(code(&client.frame().await.unwrap()), "PAYLOAD_TOO_LARGE");
    // The connection is still usable.
    client.ok("run.list", json!({})).await;

    // One run at a time for alice, one waiting: the third is refused.
    let first = run_id(
        &client
            .ok("agent.run", json!({"prompt": "slow steps=3 delay_ms=300"}))
            .await,
    );
    let second = client.ok("agent.run", json!({"prompt": "wait steps=0"})).await;
    assert_eq!(second["status"], "QUEUED");
    assert_eq!(second["queuePosition"], 1);
    let response = client.call("agent.run", json!({"prompt": "too many"})).await;
    assert_eq!(code(&response), "OVERLOADED");
    assert!(response["error"]["retryAfterMs"].as_u64().unwrap() > 0);
    let post = http(ALICE)
        .post(gateway.url("/v1/runs"))
        .json(&json!({"prompt": "too many"}))
        .send()
        .await
        .unwrap();
    assert_eq!(post.status(), 429);
    assert!(post.headers().get("retry-after").is_some());

    // An idempotency key reused with another payload.
    let key = json!({"prompt": "keyed steps=0", "idempotencyKey": "k1"});
    client.ok("agent.cancel", json!({"runId": first})).await;
    client.until(&run_id(&second), "lifecycle.end").await;
    let a = client.ok("agent.run", key.clone()).await;
    let b = client.ok("agent.run", key).await;
    assert_eq!(a["runId"], b["runId"]);
    assert_eq!(
        client
            .error("agent.run", json!({"prompt": "other", "idempotencyKey": "k1"}))
            .await,
        "CONFLICT"
    );
    client.until(&run_id(&a), "lifecycle.end").await;
    assert_eq!(
        client.error("agent.cancel", json!({"runId": run_id(&a)})).await,
        "INVALID_STATE"
    );
    assert_eq!(
        client
            .error(
                "permission.respond",
                json!({"runId": run_id(&a), "requestId": "perm_x", "decision": "allow"})
            )
            .await,
        "INVALID_STATE"
    );

    // No token, a wrong token: 401, on HTTP and on the upgrade.
    let plain = reqwest::Client::new();
    assert_eq!(plain.get(gateway.url("/v1/runs")).send().await.unwrap().status(), 401);
    let wrong = http("wrong-token-0000000000")
        .get(gateway.url("/v1/runs"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    assert_eq!(wrong.json::<Value>().await.unwrap()["error"]["code"], "UNAUTHORIZED");
    let upgrade = tokio_tungstenite::connect_async(format!("ws://{}/ws", gateway.addr)).await;
    assert!(upgrade.is_err(), "an upgrade without a token must be refused");
    assert_eq!(plain.get(gateway.url("/healthz")).send().await.unwrap().status(), 200);
    assert_eq!(plain.get(gateway.url("/readyz")).send().await.unwrap().status(), 200);
    // HTTP's own codes.
    let bad = http(ALICE)
        .post(gateway.url("/v1/runs"))
        .body("{oops")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.json::<Value>().await.unwrap()["error"]["code"], "PARSE_ERROR");
    // The log never shows a token.
    assert!(!gateway.log_text().contains(ALICE), "{}", gateway.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_sees_and_controls_only_its_own_runs() {
    let (_dir, _model, gateway) = gateway("", &["--ask", "write_file"]);
    let mut alice = gateway.ws(ALICE).await;
    let mut bob = gateway.ws(BOB).await;
    let run = run_id(
        &alice
            .ok(
                "agent.run",
                json!({"prompt": "write steps=1 tool=write_file", "sessionId": "s-alice"}),
            )
            .await,
    );
    let ask = alice.until(&run, "permission.request").await;
    let request_id = ask["payload"]["requestId"].as_str().unwrap();

    assert_eq!(bob.error("run.get", json!({"runId": run})).await, "NOT_FOUND");
    assert_eq!(bob.error("run.subscribe", json!({"runId": run})).await, "NOT_FOUND");
    assert_eq!(bob.error("agent.cancel", json!({"runId": run})).await, "NOT_FOUND");
    assert_eq!(
        bob.error("agent.steer", json!({"runId": run, "message": "hi"})).await,
        "NOT_FOUND"
    );
    assert_eq!(
        bob.error(
            "permission.respond",
            json!({"runId": run, "requestId": request_id, "decision": "allow"})
        )
        .await,
        "NOT_FOUND"
    );
    assert_eq!(bob.ok("permission.list", json!({})).await["asks"], json!([]));
    assert_eq!(bob.ok("run.list", json!({})).await["runs"], json!([]));
    assert_eq!(
        bob.error("agent.run", json!({"prompt": "x", "sessionId": "s-alice"}))
            .await,
        "CONFLICT"
    );
    let get = http(BOB)
        .get(gateway.url(&format!("/v1/runs/{run}")))
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 404);
    let events = http(BOB)
        .get(gateway.url(&format!("/v1/runs/{run}/events")))
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 404);

    // Alice answers over HTTP.
    let answer = http(ALICE)
        .post(gateway.url(&format!("/v1/runs/{run}/permissions/{request_id}")))
        .json(&json!({"decision": "allow"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let end = alice.until(&run, "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "DONE");
    assert!(gateway.dir.join("out_1.txt").exists());
    let list = alice.ok("run.list", json!({})).await;
    assert_eq!(list["runs"][0]["runId"], run.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_waits_through_a_disconnect_and_is_answered_by_the_next_connection() {
    let (_dir, _model, gateway) = gateway("", &["--ask", "write_file"]);
    let mut first = gateway.ws(ALICE).await;
    let run = run_id(
        &first
            .ok("agent.run", json!({"prompt": "write steps=1 tool=write_file"}))
            .await,
    );
    let ask = first.until(&run, "permission.request").await;
    let request_id = ask["payload"]["requestId"].as_str().unwrap().to_string();
    drop(first);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut second = gateway.ws(ALICE).await;
    let view = second.ok("run.get", json!({"runId": run})).await;
    assert_eq!(view["status"], "WAITING_PERMISSION");
    assert_eq!(view["pendingAsks"][0]["requestId"], request_id.as_str());
    let asks = second.ok("permission.list", json!({})).await;
    assert_eq!(asks["asks"][0]["tool"], "write_file");
    second
        .ok("run.subscribe", json!({"runId": run, "afterSeq": ask["seq"]}))
        .await;
    second
        .ok(
            "permission.respond",
            json!({"runId": run, "requestId": request_id, "decision": "allow"}),
        )
        .await;
    assert_eq!(
        second
            .error(
                "permission.respond",
                json!({"runId": run, "requestId": request_id, "decision": "allow"})
            )
            .await,
        "INVALID_STATE"
    );
    let end = second.until(&run, "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "DONE");
    assert!(gateway.dir.join("out_1.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_pending_across_a_restart_is_asked_again_and_answered() {
    let dir = tempfile::tempdir().unwrap();
    let model = model();
    config(dir.path(), &model.url(), "");
    let mut gateway = Gateway::start(dir.path(), &["--ask", "write_file"]);
    let mut client = gateway.ws(ALICE).await;
    let run = run_id(
        &client
            .ok("agent.run", json!({"prompt": "write steps=1 tool=write_file"}))
            .await,
    );
    let ask = client.until(&run, "permission.request").await;
    let request_id = ask["payload"]["requestId"].as_str().unwrap().to_string();
    let seen = client.seqs(&run).last().copied().unwrap();
    assert!(gateway.terminate().success(), "{}", gateway.log_text());
    // The connection was closed with a reason.
    while client.frame().await.is_some() {}
    assert_eq!(client.closed.as_ref().map(|c| c.0), Some(1001), "{:?}", client.closed);
    drop(gateway);

    let gateway = Gateway::start(dir.path(), &["--ask", "write_file"]);
    assert!(gateway.log_text().contains("resumed 1"), "{}", gateway.log_text());
    let mut client = gateway.ws(ALICE).await;
    let asks = client.ok("permission.list", json!({"runId": run})).await;
    assert_eq!(asks["asks"][0]["requestId"], request_id.as_str(), "{asks}");
    client
        .ok("run.subscribe", json!({"runId": run, "afterSeq": seen}))
        .await;
    client
        .ok(
            "permission.respond",
            json!({"runId": run, "requestId": request_id, "decision": "allow"}),
        )
        .await;
    let end = client.until(&run, "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "DONE");
    assert_eq!(std::fs::read_to_string(dir.path().join("out_1.txt")).unwrap(), "step 1");
    // Every event after the one seen before the restart, exactly once.
    let seqs = client.seqs(&run);
    assert_eq!(seqs, (seen + 1..=seqs.last().copied().unwrap()).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reattaches_sees_every_event_once_over_websocket_and_sse() {
    let (_dir, _model, gateway) = gateway("", &[]);
    let mut client = gateway.ws(ALICE).await;
    let run = run_id(
        &client
            .ok("agent.run", json!({"prompt": "go steps=6 delay_ms=100"}))
            .await,
    );
    client.until(&run, "step.completed").await;
    let seen = client.seqs(&run);
    drop(client);
    tokio::time::sleep(Duration::from_millis(250)).await;

    let mut again = gateway.ws(ALICE).await;
    let last = *seen.last().unwrap();
    again.ok("run.subscribe", json!({"runId": run, "afterSeq": last})).await;
    again.until(&run, "lifecycle.end").await;
    let mut union = seen.clone();
    union.extend(again.seqs(&run));
    let end_seq = *union.last().unwrap();
    assert_eq!(union, (1..=end_seq).collect::<Vec<_>>(), "no gap, no duplicate");

    // The stored log is the same, for a run that has ended; the answer to
    // the subscribe comes before its first event.
    let mut late = gateway.ws(ALICE).await;
    late.send_text(
        json!({"type": "request", "id": "s1", "method": "run.subscribe", "payload": {"runId": run}}).to_string(),
    )
    .await;
    let first = late.frame().await.unwrap();
    assert_eq!(
        (first["type"].as_str(), first["id"].as_str()),
        (Some("response"), Some("s1")),
        "{first}"
    );
    late.until(&run, "lifecycle.end").await;
    assert_eq!(late.seqs(&run), union);

    // SSE, resumed after Last-Event-ID, ends after lifecycle.end.
    let sse = http(ALICE)
        .get(gateway.url(&format!("/v1/runs/{run}/events")))
        .header("Last-Event-ID", "3")
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 200);
    let text = sse_text(sse).await;
    let ids = sse_ids(&text);
    assert_eq!(ids, (4..=end_seq).collect::<Vec<_>>());
    assert!(text.contains("event: lifecycle.end"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribing_again_on_one_connection_replaces_the_stream_and_sends_each_event_once() {
    let (_dir, _model, gateway) = gateway("", &[]);
    let mut client = gateway.ws(ALICE).await;
    let run = run_id(
        &client
            .ok("agent.run", json!({"prompt": "go steps=8 delay_ms=100"}))
            .await,
    );
    client.until(&run, "step.completed").await;
    // Eight subscriptions to the run sent at once, while it runs: each
    // replaces the one before (and the stream agent.run started).
    let ids: Vec<String> = (0..8).map(|n| format!("again{n}")).collect();
    for id in &ids {
        let frame =
            json!({"type": "request", "id": id, "method": "run.subscribe", "payload": {"runId": run, "afterSeq": 1}});
        client.send_text(frame.to_string()).await;
    }
    // The answers come in the order the subscriptions took over.
    let mut answers = 0;
    while answers < ids.len() {
        let frame = client.frame().await.unwrap();
        if frame["type"] == "response" {
            assert_eq!(frame["ok"], true, "{frame}");
            answers += 1;
        }
    }
    let answered = client.events.len();
    // The end as the last stream sends it (the run may have ended before
    // the last answer: the streams replaced sent it too).
    while !client.events[answered..]
        .iter()
        .any(|e| e["runId"] == run.as_str() && e["event"] == "lifecycle.end")
    {
        client.frame().await.unwrap();
    }
    let end_seq = client.seqs(&run).into_iter().max().unwrap();
    // After the last answer, one stream: every event after seq 1 once, in order.
    let after: Vec<u64> = client.events[answered..]
        .iter()
        .filter(|e| e["runId"] == run.as_str())
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(after, (2..=end_seq).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_follow_on_busy_and_queues_report_positions() {
    let (_dir, model, gateway) = gateway("max_runs_per_token = 2", &[]);
    let mut client = gateway.ws(ALICE).await;
    let live = |session: &str| json!({"prompt": "long steps=4 delay_ms=200", "sessionId": session});

    // enqueue (default): starts after the first, with its conversation.
    let first = run_id(&client.ok("agent.run", live("s1")).await);
    let queued = client
        .ok(
            "agent.run",
            json!({"prompt": "then steps=0 answer=second", "sessionId": "s1"}),
        )
        .await;
    assert_eq!(queued["status"], "QUEUED");
    client.until(&first, "lifecycle.end").await;
    let end = client.until(&run_id(&queued), "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "DONE");
    let last = model.request_count();
    assert!(last > 0);

    // reject.
    let busy = run_id(&client.ok("agent.run", live("s2")).await);
    assert_eq!(
        client
            .error(
                "agent.run",
                json!({"prompt": "x", "sessionId": "s2", "onBusy": "reject"})
            )
            .await,
        "CONFLICT"
    );
    // steer: the prompt joins the live run.
    let steered = client
        .ok(
            "agent.run",
            json!({"prompt": "also this", "sessionId": "s2", "onBusy": "steer"}),
        )
        .await;
    assert_eq!(steered["runId"], busy.as_str());
    assert_eq!(steered["steered"], true);
    // interrupt: the live run is cancelled, then the new one starts.
    let next = client
        .ok(
            "agent.run",
            json!({"prompt": "instead steps=0", "sessionId": "s2", "onBusy": "interrupt"}),
        )
        .await;
    let end = client.until(&busy, "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "CANCELED");
    let end = client.until(&run_id(&next), "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "DONE");

    // Per-token cap 2: the third waits, in order.
    let a = client.ok("agent.run", live("q1")).await;
    let b = client.ok("agent.run", live("q2")).await;
    let c = client.ok("agent.run", live("q3")).await;
    let d = client.ok("agent.run", live("q4")).await;
    assert_eq!(
        (a["status"].as_str(), b["status"].as_str()),
        (Some("RUNNING"), Some("RUNNING"))
    );
    assert_eq!(
        (c["queuePosition"].as_u64(), d["queuePosition"].as_u64()),
        (Some(1), Some(2))
    );
    let view = client.ok("run.get", json!({"runId": run_id(&d)})).await;
    assert_eq!(view["status"], "QUEUED");
    // Cancelling a queued run removes it from the queue.
    let cancelled = client.ok("agent.cancel", json!({"runId": run_id(&d)})).await;
    assert_eq!(cancelled["finalSeq"], 2);
    let end = client.until(&run_id(&c), "lifecycle.end").await;
    assert_eq!(
        end["payload"]["status"],
        "DONE",
        "{:?}",
        client
            .events
            .iter()
            .filter(|e| e["runId"] == run_id(&c) && (e["event"] == "error" || e["event"] == "warning"))
            .collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_subscriber_is_dropped_while_the_run_and_the_others_go_on() {
    // Pings far apart: the client that stops reading is dropped for
    // falling behind, not for missing a pong.
    let (_dir, _model, gateway) = gateway("subscriber_buffer = 1024\nping_interval_secs = 60", &[]);
    let mut reader = gateway.ws(ALICE).await;
    // 4000 llm.delta frames (about 1.3 MB), one a millisecond.
    let run = run_id(
        &reader
            .ok(
                "agent.run",
                json!({"prompt": "flood long=4000 chunk_ms=1 delay_ms=300"}),
            )
            .await,
    );
    // A second client subscribes, with a small socket buffer, and does not read.
    let mut slow = common::gateway::Client::connect_with_buffer(&gateway.addr, ALICE, Some(4096)).await;
    slow.ok("run.subscribe", json!({"runId": run})).await;
    let end = reader.until(&run, "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "DONE");
    assert_eq!(
        reader.seqs(&run).len() as u64,
        end["seq"].as_u64().unwrap(),
        "the reader got every event"
    );
    // Now the slow one reads: it finds its close frame with a reason.
    while slow.frame().await.is_some() {}
    let (code, reason) = slow.closed.clone().expect("a close frame");
    assert_eq!(code, 1013);
    assert!(reason.contains("resubscribe"), "{reason}");
    let seen = slow.seqs(&run);
    assert!(seen.len() < reader.seqs(&run).len());
    // It resubscribes after its last seq and gets the rest.
    let mut again = gateway.ws(ALICE).await;
    let last = seen.last().copied().unwrap_or(0);
    again.ok("run.subscribe", json!({"runId": run, "afterSeq": last})).await;
    again.until(&run, "lifecycle.end").await;
    let mut union = seen;
    union.extend(again.seqs(&run));
    assert_eq!(union, reader.seqs(&run));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_change_as_runs_finish() {
    let (_dir, _model, gateway) = gateway("", &[]);
    let metrics = || gateway.metrics_text();
    let value = |text: &str, name: &str| -> f64 {
        text.lines()
            .find(|line| line.starts_with(name))
            .and_then(|line| line.rsplit(' ').next())
            .map_or(0.0, |v| v.parse().unwrap())
    };
    let before = metrics().await;
    let mut client = gateway.ws(ALICE).await;
    let run = run_id(&client.ok("agent.run", json!({"prompt": "go steps=2"})).await);
    client.until(&run, "lifecycle.end").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = metrics().await;
    let done = "loom_runs_finished_total{status=\"DONE\"}";
    assert_eq!(value(&after, done), value(&before, done) + 1.0, "{after}");
    assert!(value(&after, "loom_turns_total") >= value(&before, "loom_turns_total") + 3.0);
    assert!(
        after.contains("loom_tool_calls_total{tool=\"list_dir\",status=\"success\"}"),
        "{after}"
    );
    assert!(after.contains("loom_model_duration_seconds_bucket"));
    assert!(after.contains("loom_store_write_seconds_bucket"));
    for op in ["append_events", "checkpoint", "finish_run"] {
        let series = format!("loom_store_commit_seconds_count{{op=\"{op}\"}}");
        assert!(value(&after, &series) >= 1.0, "{series} in {after}");
    }
    assert_eq!(value(&after, "loom_ws_connections"), 1.0);
    assert!(after.contains("loom_tokens_total{kind=\"input\"}"));
    assert_eq!(
        reqwest::Client::new()
            .get(gateway.url("/metrics"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
}

/// Starts `payload` on a gateway in `dir` (its loom.toml written, `args`
/// on its command line), waits for the run's first completed step, then
/// stops the gateway with SIGTERM: the run, and the last seq its client saw.
async fn stopped_after_a_step(dir: &std::path::Path, args: &[&str], payload: Value) -> (String, u64) {
    let mut gateway = Gateway::start(dir, args);
    let mut client = gateway.ws(ALICE).await;
    let run = run_id(&client.ok("agent.run", payload).await);
    client.until(&run, "step.completed").await;
    let seen = client.seqs(&run).last().copied().unwrap();
    assert!(gateway.terminate().success());
    (run, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_run_then_restart_resumes_it_without_repeating_a_side_effect() {
    let dir = tempfile::tempdir().unwrap();
    let model = model();
    config(dir.path(), &model.url(), "");
    let (run, seen) = stopped_after_a_step(
        dir.path(),
        &["--allow", "write_file"],
        json!({"prompt": "write steps=3 tool=write_file delay_ms=400"}),
    )
    .await;

    let gateway = Gateway::start(dir.path(), &["--allow", "write_file"]);
    let mut client = gateway.ws(ALICE).await;
    client
        .ok("run.subscribe", json!({"runId": run, "afterSeq": seen}))
        .await;
    let end = client.until(&run, "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "DONE");
    let seqs = client.seqs(&run);
    assert_eq!(seqs, (seen + 1..=*seqs.last().unwrap()).collect::<Vec<_>>());
    // Each write ran once: one successful tool.result per call in the log.
    let mut log = gateway.ws(ALICE).await;
    log.ok("run.subscribe", json!({"runId": run})).await;
    log.until(&run, "lifecycle.end").await;
    let mut writes: Vec<String> = log
        .events
        .iter()
        .filter(|e| e["event"] == "tool.result" && e["payload"]["status"] == "success")
        .map(|e| e["payload"]["callId"].as_str().unwrap().to_string())
        .collect();
    let total = writes.len();
    writes.dedup();
    assert_eq!((total, writes.len()), (3, 3), "{:?}", log.names(&run));
    for step in 1..=3 {
        assert!(dir.path().join(format!("out_{step}.txt")).exists());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_database_is_held_past_the_busy_timeout_is_taken_back_once_it_is_free() {
    let dir = tempfile::tempdir().unwrap();
    let model = model();
    config(dir.path(), &model.url(), "");
    let db = dir.path().join("gateway.db");
    let gateway = Gateway::start(dir.path(), &["--allow", "bash", "--db", db.to_str().unwrap()]);
    let mut client = gateway.ws(ALICE).await;
    let run = run_id(
        &client
            .ok(
                "agent.run",
                json!({"prompt": "held steps=4 tool=bash bash=echo+step+STEP+>>+effects.txt delay_ms=300"}),
            )
            .await,
    );
    client.until(&run, "step.completed").await;
    // Another process takes the write lock for longer than the store's
    // busy timeout (5 s): the run's next write fails, and it stops
    // INTERRUPTED rather than ERROR.
    let locked = rusqlite::Connection::open(&db).unwrap();
    locked.execute_batch("BEGIN IMMEDIATE").unwrap();
    let held = tokio::time::timeout(Duration::from_secs(7), client.until(&run, "lifecycle.end")).await;
    assert!(held.is_err(), "the run ended while its database was held: {held:?}");
    locked.execute_batch("COMMIT").unwrap();
    drop(locked);
    drop(client);

    // Once the database is free the gateway takes the run back from its
    // last checkpoint, by itself, and it ends DONE.
    let http = http(ALICE);
    let mut status = String::new();
    for _ in 0..300 {
        let view: Value = http
            .get(gateway.url(&format!("/v1/runs/{run}")))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        status = view["status"].as_str().unwrap_or_default().to_string();
        if status == "DONE" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, "DONE", "{}", gateway.log_text());
    assert!(gateway.log_text().contains("taken back"), "{}", gateway.log_text());
    // Every step's side effect ran, each once.
    let effects = std::fs::read_to_string(dir.path().join("effects.txt")).unwrap();
    let lines: Vec<&str> = effects.lines().collect();
    let mut unique = lines.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(lines.len(), unique.len(), "a step ran twice: {effects}");
    assert_eq!(unique, ["step 1", "step 2", "step 3", "step 4"], "{effects}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_stops_answering_pings_is_closed() {
    let (_dir, _model, gateway) = gateway("", &[]);
    // A client that reads every frame but answers no ping (a WebSocket
    // library would answer them): the upgrade by hand, then raw bytes.
    let mut silent = std::net::TcpStream::connect(&gateway.addr).unwrap();
    let upgrade = format!(
        "GET /ws HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {ALICE}\r\n\r\n",
        gateway.addr
    );
    std::io::Write::write_all(&mut silent, upgrade.as_bytes()).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = std::io::Read::read_to_end(&mut silent, &mut bytes);
        bytes
    });
    let mut other = gateway.ws(ALICE).await;
    // Pings every second; the silent one is closed after two intervals.
    // The other connection keeps answering.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        other.ok("run.list", json!({})).await;
    }
    // A peer that answers no ping will not answer the close either: its
    // connection is freed at once, not held for the 35 s a close may take.
    let open = |metrics: &str| {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix("loom_ws_connections "))
            .map_or(0.0, |value| value.trim().parse::<f64>().unwrap())
    };
    let mut connections = open(&gateway.metrics_text().await);
    for _ in 0..30 {
        if connections <= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        connections = open(&gateway.metrics_text().await);
    }
    assert_eq!(connections, 1.0, "the silent connection is still held");
    // What it read: the upgrade, pings, then the close saying why.
    let bytes = reader.join().unwrap();
    let start = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an upgrade answer")
        + 4;
    let mut frames = &bytes[start..];
    let mut closed = None;
    while frames.len() >= 2 {
        let (opcode, length) = (frames[0] & 0x0f, usize::from(frames[1] & 0x7f));
        assert!(length < 126, "a control frame: {:?}", &frames[..2]);
        let payload = &frames[2..2 + length];
        if opcode == 0x8 {
            let code = u16::from_be_bytes([payload[0], payload[1]]);
            closed = Some((code, String::from_utf8_lossy(&payload[2..]).to_string()));
            break;
        }
        frames = &frames[2 + length..];
    }
    let (code, reason) = closed.expect("a close frame");
    assert_eq!((code, reason.as_str()), (1008, "no answer to ping"));
    other.ok("run.list", json!({})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_rate_are_refused_and_writes_are_denied_unless_configured() {
    // 8 a minute: a burst of 2, then one every 7.5 s.
    let (_dir, _model, gateway) = gateway("requests_per_minute = 8", &[]);
    let mut client = gateway.ws(ALICE).await;
    let run = run_id(
        &client
            .ok("agent.run", json!({"prompt": "write steps=1 tool=write_file"}))
            .await,
    );
    let response = client.call("run.list", json!({})).await;
    assert_eq!(response["ok"], true, "{response}");
    let response = client.call("run.list", json!({})).await;
    assert_eq!(response["error"]["code"], "RATE_LIMITED", "{response}");
    assert!(response["error"]["retryAfterMs"].as_u64().unwrap() > 1000);
    // Another token has its own rate.
    let mut bob = gateway.ws(BOB).await;
    bob.ok("run.list", json!({})).await;
    let http_limited = http(ALICE).get(gateway.url("/v1/runs")).send().await.unwrap();
    assert_eq!(http_limited.status(), 429);
    assert!(http_limited.headers().get("retry-after").is_some());

    // Server mode: write_file is denied without a rule that allows or asks.
    let result = client.until(&run, "tool.result").await;
    assert_eq!(result["payload"]["status"], "denied", "{result}");
    client.until(&run, "lifecycle.end").await;
    assert!(!gateway.dir.join("out_1.txt").exists());
}

#[test]
fn serve_refuses_a_public_address_without_a_token_and_takes_loom_token() {
    let dir = tempfile::tempdir().unwrap();
    let model = model();
    std::fs::write(
        dir.path().join("loom.toml"),
        format!("model = \"openai:fake\"\n[provider]\nbase_url = \"{}\"\n", model.url()),
    )
    .unwrap();
    let output = common::loom_in(dir.path())
        .args(["serve", "--config", "loom.toml", "--addr", "0.0.0.0:0", "--workspace"])
        .arg(dir.path())
        .env("OPENAI_API_KEY", "test-key")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0 without a token"),
        "{stderr}"
    );

    // With LOOM_TOKEN it listens, and that token is the one it accepts. Its
    // stderr is closed after the first line: the server goes on.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Killed(
        common::loom_in(dir.path())
            .args(["serve", "--config", "loom.toml", "--addr", "127.0.0.1:0", "--workspace"])
            .arg(dir.path())
            .env("OPENAI_API_KEY", "test-key")
            .env("LOOM_TOKEN", "env-token-0123456789abc")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.0.stderr.take().unwrap();
    let addr = std::io::BufRead::lines(std::io::BufReader::new(stderr))
        .map_while(Result::ok)
        .find_map(|line| {
            line.split("listening on http://")
                .nth(1)
                .map(|rest| rest.split_whitespace().next().unwrap().to_string())
        })
        .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let ok = http("env-token-0123456789abc")
            .get(format!("http://{addr}/v1/runs"))
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status(), 200);
        let wrong = http(ALICE).get(format!("http://{addr}/v1/runs")).send().await.unwrap();
        assert_eq!(wrong.status(), 401);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_outlives_a_restart_and_a_broken_store_answers_internal() {
    let dir = tempfile::tempdir().unwrap();
    let model = model();
    config(dir.path(), &model.url(), "");
    let mut gateway = Gateway::start(dir.path(), &[]);
    let post = |gateway: &Gateway, prompt: &str| {
        http(ALICE)
            .post(gateway.url("/v1/runs"))
            .header("Idempotency-Key", "order-42")
            .json(&json!({"prompt": prompt}))
            .send()
    };
    let first: Value = post(&gateway, "keyed steps=0").await.unwrap().json().await.unwrap();
    let run = run_id(&first);
    let mut client = gateway.ws(ALICE).await;
    client.ok("run.subscribe", json!({"runId": run, "afterSeq": 0})).await;
    client.until(&run, "lifecycle.end").await;
    assert!(gateway.terminate().success(), "{}", gateway.log_text());
    drop(gateway);

    // After the restart the key still names the run (and its payload).
    let gateway = Gateway::start(dir.path(), &[]);
    let again = post(&gateway, "keyed steps=0").await.unwrap();
    assert_eq!(again.status(), 202);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["runId"], run.as_str(), "{again}");
    assert_eq!(again["status"], "DONE");
    // The list reads the run from the store, and says where its log ends
    // as `run.get` does; `?token=` signs the list in like any other route.
    let got: Value = http(ALICE)
        .get(gateway.url(&format!("/v1/runs/{run}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(got["lastSeq"].as_u64().unwrap() >= 5, "{got}");
    let listed: Value = reqwest::get(gateway.url(&format!("/v1/runs?token={ALICE}&limit=10")))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let row = listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["runId"] == run.as_str())
        .cloned()
        .unwrap_or_default();
    assert_eq!(row["lastSeq"], got["lastSeq"], "{listed}");
    let unknown = reqwest::get(gateway.url(&format!("/v1/runs?token={ALICE}&colour=red")))
        .await
        .unwrap();
    assert_eq!(unknown.status(), 400);
    let other = post(&gateway, "another payload").await.unwrap();
    assert_eq!(other.status(), 409);
    assert_eq!(other.json::<Value>().await.unwrap()["error"]["code"], "CONFLICT");
    // Keys are per token: bob's same key is a new run.
    let bobs: Value = http(BOB)
        .post(gateway.url("/v1/runs"))
        .header("Idempotency-Key", "order-42")
        .json(&json!({"prompt": "keyed steps=0"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_ne!(bobs["runId"], run.as_str());

    // The database breaks under the server (its runs table is gone): what
    // needs the store answers INTERNAL, and the server is no longer ready.
    let db = rusqlite::Connection::open(common::database_of(dir.path())).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db.execute_batch("ALTER TABLE runs RENAME TO runs_gone").unwrap();
    let mut client = gateway.ws(ALICE).await;
    assert_eq!(client.error("run.list", json!({})).await, "INTERNAL");
    let listed = http(ALICE).get(gateway.url("/v1/runs")).send().await.unwrap();
    assert_eq!(listed.status(), 500);
    let body: Value = listed.json().await.unwrap();
    assert_eq!(body["error"]["code"], "INTERNAL");
    // The message says what failed without the backend's details.
    assert!(!body.to_string().contains("runs_gone"), "{body}");
    let ready = reqwest::Client::new().get(gateway.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    // The connection stays usable, and the store comes back with its table.
    db.execute_batch("ALTER TABLE runs_gone RENAME TO runs").unwrap();
    let page = client.ok("run.list", json!({})).await;
    assert!(page["runs"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["runId"] == run.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agents_events_and_ask_reach_the_parents_subscribers() {
    let (_dir, _model, gateway) = gateway("[tools]\ntask = true", &["--ask", "write_file"]);
    let mut client = gateway.ws(ALICE).await;
    let run = run_id(
        &client
            .ok(
                "agent.run",
                json!({"prompt": "delegate steps=1 tool=task child=steps:1+tool:write_file"}),
            )
            .await,
    );
    // The child's ask arrives on the parent's subscription, as the child's.
    let ask = client.until_any("permission.request").await;
    let child = ask["runId"].as_str().unwrap().to_string();
    assert_ne!(child, run);
    assert_eq!(ask["payload"]["parentRunId"], run.as_str());
    assert_eq!(ask["payload"]["depth"], 1);
    let request_id = ask["payload"]["requestId"].as_str().unwrap().to_string();
    let listed = client.ok("permission.list", json!({"runId": run})).await;
    assert_eq!(listed["asks"][0]["runId"], child.as_str(), "{listed}");
    let listed = client.ok("permission.list", json!({"runId": child})).await;
    assert_eq!(listed["asks"][0]["requestId"], request_id.as_str(), "{listed}");
    // Another token sees neither the child nor its ask.
    let mut bob = gateway.ws(BOB).await;
    assert_eq!(bob.error("run.get", json!({"runId": child})).await, "NOT_FOUND");
    assert_eq!(
        bob.error(
            "permission.respond",
            json!({"runId": child, "requestId": request_id, "decision": "allow"})
        )
        .await,
        "NOT_FOUND"
    );
    // A live sub-agent is controlled through its parent.
    assert_eq!(
        client.error("agent.cancel", json!({"runId": child})).await,
        "INVALID_STATE"
    );
    client
        .ok(
            "permission.respond",
            json!({"runId": child, "requestId": request_id, "decision": "allow"}),
        )
        .await;
    let end = client.until(&run, "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "DONE");
    assert!(gateway.dir.join("out_1.txt").exists());
    // The child's events came with their own seq, and ended before the parent.
    let names = client.names(&child);
    assert_eq!(names.first().unwrap(), "lifecycle.start", "{names:?}");
    assert_eq!(names.last().unwrap(), "lifecycle.end");
    // Its whole log is its own, the same token's: replayed from the store.
    let mut again = gateway.ws(ALICE).await;
    again.ok("run.subscribe", json!({"runId": child, "afterSeq": 0})).await;
    let child_end = again.until(&child, "lifecycle.end").await;
    assert_eq!(child_end["payload"]["status"], "DONE");
    let seqs = again.seqs(&child);
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert_eq!(again.names(&child)[0], "lifecycle.start");

    // Over SSE: the child's events come without `id:` (the cursor is the
    // parent's seq), and only the parent's own end closes the stream.
    let started: Value = http(ALICE)
        .post(gateway.url("/v1/runs"))
        .json(&json!({"prompt": "again steps=1 tool=task delay_ms=300 child=steps:1"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let parent = run_id(&started);
    let sse = http(ALICE)
        .get(gateway.url(&format!("/v1/runs/{parent}/events")))
        .send()
        .await
        .unwrap();
    let text = sse_text(sse).await;
    let ids = sse_ids(&text);
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>());
    assert!(text.contains("\"depth\":1"), "the child's events: {text}");
    assert_eq!(text.matches("event: lifecycle.end").count(), 2, "{text}");
    let last_data = text.lines().rev().find(|line| line.starts_with("data:")).unwrap();
    assert!(last_data.contains(&format!("\"runId\":\"{parent}\"")), "{last_data}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shell_is_denied_mcp_tools_ask_and_mcp_servers_stop_with_the_gateway() {
    use loom_testkit::mcp_servers::{fixture, processes_with_env};
    const MARKER: &str = "LOOM_MCP_TEST_MARKER";
    // Digits: a value that looks like no key, which redaction leaves.
    let marker = format!("{}-{}", std::process::id(), fastrand::u64(..));
    let (_dir, _model, mut gateway) = gateway(&fixture().toml("fixture", &[(MARKER, &marker)], ""), &[]);
    assert!(
        !processes_with_env(MARKER, &marker).is_empty(),
        "the MCP server starts with the gateway"
    );
    let mut client = gateway.ws(ALICE).await;

    // Nothing in loom.toml allows the shell: in server mode it is denied.
    let run = run_id(&client.ok("agent.run", json!({"prompt": "steps=1 tool=bash"})).await);
    let result = client.until(&run, "tool.result").await;
    assert_eq!(result["payload"]["status"], "denied", "{result}");
    client.until(&run, "lifecycle.end").await;

    // An MCP tool asks the run's clients; allowed, it runs on the server.
    let run = run_id(
        &client
            .ok("agent.run", json!({"prompt": "steps=1 tool=fixture__env"}))
            .await,
    );
    let ask = client.until(&run, "permission.request").await;
    assert_eq!(ask["payload"]["tool"], "fixture__env");
    let request_id = ask["payload"]["requestId"].as_str().unwrap();
    client
        .ok(
            "permission.respond",
            json!({"runId": run, "requestId": request_id, "decision": "allow"}),
        )
        .await;
    let result = client.until(&run, "tool.result").await;
    assert_eq!(result["payload"]["status"], "success", "{result}");
    assert!(result["payload"]["content"].as_str().unwrap().contains(&marker));
    assert_eq!(client.until(&run, "lifecycle.end").await["payload"]["status"], "DONE");

    // Stopping the gateway stops the server.
    assert!(gateway.terminate().success());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !processes_with_env(MARKER, &marker).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the MCP server outlived loom serve"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_gauge_and_known_counter_is_exported_at_zero_from_start_up() {
    // Before any run, connection or request: an alert needs the series.
    let (_dir, _model, gateway) = gateway("", &[]);
    let text = gateway.metrics_text().await;
    for series in [
        "loom_runs_active 0",
        "loom_runs_queued 0",
        "loom_permission_pending 0",
        "loom_ws_connections 0",
        "loom_sse_connections 0",
        "loom_turns_total 0",
        "loom_subscribers_dropped_total 0",
        "loom_runs_finished_total{status=\"DONE\"} 0",
        "loom_runs_finished_total{status=\"CANCELED\"} 0",
        "loom_tokens_total{kind=\"input\"} 0",
        "loom_http_timeouts_total{kind=\"header\"} 0",
        "loom_http_connections_refused_total 0",
    ] {
        assert!(text.lines().any(|line| line == series), "{series} in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_route_and_a_wrong_method_answer_with_a_json_error() {
    let (_dir, _model, gateway) = gateway("", &[]);
    let unknown = http(ALICE).get(gateway.url("/v1/nothing")).send().await.unwrap();
    assert_eq!(unknown.status(), 404);
    let body: Value = unknown.json().await.unwrap();
    assert_eq!(body["error"]["code"], "METHOD_NOT_FOUND", "{body}");
    let wrong = http(ALICE).delete(gateway.url("/v1/runs")).send().await.unwrap();
    assert_eq!(wrong.status(), 405);
    let body: Value = wrong.json().await.unwrap();
    assert_eq!(body["error"]["code"], "METHOD_NOT_FOUND", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("DELETE"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_parsed_strictly() {
    let (_dir, _model, gateway) = gateway("", &[]);
    let mut client = gateway.ws(ALICE).await;
    // A payload is an object: a positional list is refused.
    assert_eq!(client.error("agent.run", json!(["hello"])).await, "INVALID_PARAMS");
    // A frame has type, id, method and payload: nothing else.
    client
        .send_text(json!({"type": "request", "id": "x1", "method": "run.list", "payload": {}, "extra": 1}).to_string())
        .await;
    let answer = client.frame().await.unwrap();
    assert_eq!(answer["error"]["code"], "INVALID_REQUEST", "{answer}");
    assert!(
        answer["error"]["message"].as_str().unwrap().contains("extra"),
        "{answer}"
    );
    // The connection is still usable.
    client.ok("run.list", json!({})).await;

    // A body without Content-Type: application/json is refused.
    for content_type in [None, Some("text/plain")] {
        let mut request = http(ALICE)
            .post(gateway.url("/v1/runs"))
            .body(r#"{"prompt": "hello steps=0"}"#);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let refused = request.send().await.unwrap();
        assert_eq!(refused.status(), 400, "{content_type:?}");
        let body: Value = refused.json().await.unwrap();
        assert_eq!(body["error"]["code"], "INVALID_REQUEST", "{body}");
    }
    let fine = http(ALICE)
        .post(gateway.url("/v1/runs"))
        .header("content-type", "application/json; charset=utf-8")
        .body(r#"{"prompt": "hello steps=0"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(fine.status(), 202);
    // The header's key and the body's must agree.
    let conflict = http(ALICE)
        .post(gateway.url("/v1/runs"))
        .header("Idempotency-Key", "one")
        .json(&json!({"prompt": "hello steps=0", "idempotencyKey": "two"}))
        .send()
        .await
        .unwrap();
    assert_eq!(conflict.status(), 400);
    assert_eq!(
        conflict.json::<Value>().await.unwrap()["error"]["code"],
        "INVALID_PARAMS"
    );
    let agree = http(ALICE)
        .post(gateway.url("/v1/runs"))
        .header("Idempotency-Key", "same")
        .json(&json!({"prompt": "hello steps=0", "idempotencyKey": "same"}))
        .send()
        .await
        .unwrap();
    assert_eq!(agree.status(), 202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_client_that_never_answers_the_close_does_not_stretch_the_shutdown_grace() {
    let (_dir, _model, mut gateway) = gateway("shutdown_grace_secs = 1", &[]);
    // Connected, then deaf: it never reads, so never answers the close frame.
    let mut client = gateway.ws(ALICE).await;
    client.ok("run.list", json!({})).await;
    let started = std::time::Instant::now();
    let status = gateway.terminate();
    let took = started.elapsed();
    assert!(status.success(), "{}", gateway.log_text());
    // The grace is 1 s; before, the connection alone was waited for 2 s.
    assert!(
        took < Duration::from_millis(1700),
        "the shutdown took {took:?} with a grace of 1 s"
    );
    drop(client);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_that_breaks_the_websocket_protocol_closes_with_its_status_code() {
    let (_dir, _model, gateway) = gateway("", &[]);
    // Text that is not UTF-8: 1007.
    let mut client = gateway.ws(ALICE).await;
    client.send_raw_text(vec![b'{', 0xff, 0xfe, b'}']).await;
    while client.frame().await.is_some() {}
    let (code, reason) = client.closed.clone().expect("a close frame");
    assert_eq!(code, 1007, "{reason}");
    assert!(!reason.is_empty());
    // A frame that is not JSON is answered, and the connection stays.
    let mut client = gateway.ws(ALICE).await;
    client.send_text("{not json".into()).await;
    assert_eq!(client.frame().await.unwrap()["error"]["code"], "PARSE_ERROR");
    client.ok("run.list", json!({})).await;
}

/// `mode` over both transports: `accept-edits` lets a served run write
/// where the gateway would deny; `plan` offers no tool that writes;
/// `bypass` is refused unless `allowed_modes` lists it, and what the list
/// leaves out is refused alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_asks_for_a_mode_that_the_server_allows() {
    let (_dir, _model, gateway) = gateway("allowed_modes = [\"default\", \"plan\", \"accept-edits\"]", &[]);
    let mut client = gateway.ws(ALICE).await;
    let run = run_id(
        &client
            .ok(
                "agent.run",
                json!({"prompt": "write steps=1 tool=write_file", "mode": "accept-edits"}),
            )
            .await,
    );
    let result = client.until(&run, "tool.result").await;
    assert_eq!(result["payload"]["status"], "success", "{result}");
    client.until(&run, "lifecycle.end").await;
    assert!(gateway.dir.join("out_1.txt").exists());

    let run = run_id(
        &client
            .ok(
                "agent.run",
                json!({"prompt": "write steps=1 tool=write_file", "mode": "plan"}),
            )
            .await,
    );
    let result = client.until(&run, "tool.result").await;
    assert_ne!(result["payload"]["status"], "success", "{result}");
    assert!(
        result["payload"]["content"].as_str().unwrap().contains("write_file"),
        "{result}"
    );
    client.until(&run, "lifecycle.end").await;

    let refused = client
        .error("agent.run", json!({"prompt": "x", "mode": "bypass"}))
        .await;
    assert_eq!(refused, "FORBIDDEN");
    let response = http(ALICE)
        .post(gateway.url("/v1/runs"))
        .json(&json!({"prompt": "x", "mode": "bypass"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("mode 'bypass' is not allowed"),
        "{body}"
    );
    let unknown = client.error("agent.run", json!({"prompt": "x", "mode": "yolo"})).await;
    assert_eq!(unknown, "INVALID_PARAMS");

    let (_other_dir, _other_model, other) = self::gateway("allowed_modes = [\"default\", \"bypass\"]", &[]);
    let mut client = other.ws(ALICE).await;
    let refused = client
        .error("agent.run", json!({"prompt": "x", "mode": "accept-edits"}))
        .await;
    assert_eq!(refused, "FORBIDDEN");
    let run = run_id(
        &client
            .ok(
                "agent.run",
                json!({"prompt": "write steps=1 tool=write_file", "mode": "bypass"}),
            )
            .await,
    );
    let result = client.until(&run, "tool.result").await;
    assert_eq!(result["payload"]["status"], "success", "{result}");
    let refused = client.error("agent.run", json!({"prompt": "x", "mode": "plan"})).await;
    assert_eq!(refused, "FORBIDDEN");
}

/// The mode is stored with the run: a run in `accept-edits` stopped by
/// SIGTERM and taken back by the next gateway still writes without asking
/// (the gateway itself would deny `write_file`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_taken_back_after_a_restart_keeps_its_mode() {
    let dir = tempfile::tempdir().unwrap();
    let model = model();
    config(
        dir.path(),
        &model.url(),
        "allowed_modes = [\"default\", \"accept-edits\"]",
    );
    let (run, _) = stopped_after_a_step(
        dir.path(),
        &[],
        json!({"prompt": "write steps=3 tool=write_file delay_ms=400", "mode": "accept-edits"}),
    )
    .await;

    let gateway = Gateway::start(dir.path(), &[]);
    let mut log = gateway.ws(ALICE).await;
    log.ok("run.subscribe", json!({"runId": run})).await;
    let end = log.until(&run, "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "DONE", "{end}");
    let statuses: Vec<&str> = log
        .events
        .iter()
        .filter(|e| e["event"] == "tool.result")
        .filter_map(|e| e["payload"]["status"].as_str())
        .collect();
    assert!(!statuses.contains(&"denied"), "{statuses:?}");
    for step in 1..=3 {
        assert!(dir.path().join(format!("out_{step}.txt")).exists(), "write {step}");
    }
}

/// The gateway's own `[[hooks]]` run for its runs: a `pre_tool_use` hook
/// denies a command and the client sees which hook decided; a
/// `sub_agent_stop` hook sends a sub-agent back once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateways_hooks_decide_and_clients_see_each_decision() {
    let dir = tempfile::tempdir().unwrap();
    let model = model();
    let hooks = dir.path().join(".loom/hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    std::fs::write(
        hooks.join("guard.sh"),
        "grep -q 'rm -rf' && { echo 'no rm -rf on this server' >&2; exit 2; }\nexit 0\n",
    )
    .unwrap();
    std::fs::write(
        hooks.join("child-stop.sh"),
        "jq -c 'if .stop_hook_active then {} else {decision: \"block\", reason: \"check your work\"} end'\n",
    )
    .unwrap();
    config(
        dir.path(),
        &model.url(),
        r#"
[tools]
task = true

[[hooks]]
event = "pre_tool_use"
matcher = "bash"
command = "bash .loom/hooks/guard.sh"

[[hooks]]
event = "sub_agent_stop"
command = "bash .loom/hooks/child-stop.sh"
"#,
    );
    let gateway = Gateway::start(dir.path(), &[]);
    let mut client = gateway.ws(ALICE).await;

    let run = run_id(
        &client
            .ok("agent.run", json!({"prompt": "go steps=1 tool=bash bash=rm+-rf+data"}))
            .await,
    );
    let hook = client.until(&run, "hook.result").await;
    assert_eq!(hook["payload"]["hookEvent"], "pre_tool_use", "{hook}");
    assert_eq!(hook["payload"]["decision"], "deny", "{hook}");
    assert_eq!(hook["payload"]["reason"], "no rm -rf on this server", "{hook}");
    let result = client.until(&run, "tool.result").await;
    assert_eq!(result["payload"]["status"], "denied", "{result}");
    assert_eq!(result["payload"]["decidedBy"], "hook", "{result}");
    client.until(&run, "lifecycle.end").await;

    let requests_before = model.request_count();
    let run = run_id(
        &client
            .ok(
                "agent.run",
                json!({"prompt": "delegate steps=1 tool=task child=steps:0"}),
            )
            .await,
    );
    let end = client.until(&run, "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "DONE", "{end}");
    // The parent's two calls, the child's answer twice (sent back once).
    assert_eq!(model.request_count() - requests_before, 4);
    // The sub-agent's events join its parent's stream.
    let child_stops: Vec<&Value> = client
        .events
        .iter()
        .filter(|e| e["event"] == "hook.result" && e["payload"]["hookEvent"] == "sub_agent_stop")
        .collect();
    assert_eq!(child_stops.len(), 2, "asked at both of the child's endings");
    assert_eq!(child_stops[0]["payload"]["decision"], "deny");
    assert_eq!(child_stops[0]["payload"]["reason"], "check your work");
    assert_eq!(child_stops[0]["payload"]["depth"], 1, "{}", child_stops[0]);
    assert_eq!(child_stops[1]["payload"]["decision"], Value::Null);
}

/// Agents and skills in the served workspace's `.loom/` (which a run's
/// model may have written) never reach a gateway's runs: its own are the
/// operator's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_takes_no_agents_or_skills_from_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let model = PromptModel::start(PromptModelOptions {
        keep_bodies: true,
        ..PromptModelOptions::default()
    });
    let agents = dir.path().join(".loom/agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::write(
        agents.join("planted.md"),
        "---\nname: planted\ndescription: Planted by a model.\n---\nDo harm.\n",
    )
    .unwrap();
    let skill = dir.path().join(".loom/skills/planted-skill");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: planted-skill\ndescription: Planted too.\n---\nBody.\n",
    )
    .unwrap();
    config(dir.path(), &model.url(), "");
    let gateway = Gateway::start(dir.path(), &[]);
    let mut client = gateway.ws(ALICE).await;
    let run = run_id(&client.ok("agent.run", json!({"prompt": "hi"})).await);
    let end = client.until(&run, "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "DONE", "{end}");
    let bodies = model.bodies();
    // No agent was admitted, so the `task` tool is not offered at all
    // (an admitted one would be listed in it).
    assert!(!bodies[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|tool| tool["function"]["name"] == "task"));
    for body in bodies {
        let text = body.to_string();
        assert!(!text.contains("planted"), "{text}");
    }
}

/// Rewind and fork over the wire (docs/rewind.md): `run.rewind` on the
/// WebSocket (a dry run, then refused for a run that is executing),
/// `POST /v1/runs/{id}/rewind` restoring the files, `run.fork` with a
/// prompt whose run continues from the step, and another token refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewind_and_fork_over_websocket_and_http() {
    let dir = tempfile::tempdir().unwrap();
    let model = PromptModel::start(PromptModelOptions {
        keep_bodies: true,
        ..PromptModelOptions::default()
    });
    config(dir.path(), &model.url(), "");
    let gateway = Gateway::start(dir.path(), &["--allow", "write_file"]);
    let mut client = gateway.ws(ALICE).await;
    let run = run_id(
        &client
            .ok("agent.run", json!({"prompt": "write steps=2 tool=write_file"}))
            .await,
    );
    let end = client.until(&run, "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "DONE", "{end}");
    let recorded: Vec<u64> = client
        .events
        .iter()
        .filter(|e| e["runId"] == run.as_str() && e["event"] == "snapshot.recorded")
        .map(|e| e["payload"]["step"].as_u64().unwrap())
        .collect();
    assert_eq!(recorded, [0, 1, 2]);
    assert!(dir.path().join("out_2.txt").exists());

    // A dry run says what would change, and changes nothing.
    let dry = client
        .ok("run.rewind", json!({"runId": run, "step": 1, "dryRun": true}))
        .await;
    assert_eq!(dry["remove"], json!(["out_2.txt"]), "{dry}");
    assert_eq!(dry["continuedBy"], Value::Null);
    assert!(dir.path().join("out_2.txt").exists());
    // Another token does not see the run.
    let mut bob = gateway.ws(BOB).await;
    assert_eq!(
        bob.error("run.rewind", json!({"runId": run, "step": 1})).await,
        "NOT_FOUND"
    );
    // A run that is executing is refused.
    let busy = run_id(
        &client
            .ok("agent.run", json!({"prompt": "slow steps=3 delay_ms=400"}))
            .await,
    );
    assert_eq!(
        client.error("run.rewind", json!({"runId": busy, "step": 0})).await,
        "INVALID_STATE"
    );
    client.until(&busy, "lifecycle.end").await;

    // Over HTTP: the files of step 1, and the session continues from it.
    let rewound: Value = http(ALICE)
        .post(gateway.url(&format!("/v1/runs/{run}/rewind")))
        .json(&json!({"step": 1}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(rewound["remove"], json!(["out_2.txt"]), "{rewound}");
    assert!(!dir.path().join("out_2.txt").exists());
    assert!(dir.path().join("out_1.txt").exists());
    let continuation = rewound["continuedBy"].as_str().unwrap().to_string();
    // The run's log shows it.
    let log = sse_text(
        http(ALICE)
            .get(gateway.url(&format!("/v1/runs/{run}/events")))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(log.contains("run.rewound") && log.contains(&continuation), "{log}");
    // A body naming another run is refused.
    let refused = http(ALICE)
        .post(gateway.url(&format!("/v1/runs/{run}/rewind")))
        .json(&json!({"runId": "other", "step": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);

    // A fork with a prompt: a new session whose first request holds the
    // conversation up to step 1 (one write_file call and its result).
    let forked = client
        .ok(
            "run.fork",
            json!({"runId": run, "step": 1, "prompt": "carry on steps=0 answer=forked"}),
        )
        .await;
    let started = forked["started"]["runId"]
        .as_str()
        .unwrap_or_else(|| panic!("{forked}"))
        .to_string();
    let end = client.until(&started, "lifecycle.end").await;
    assert_eq!(end["payload"]["status"], "DONE", "{end}");
    assert_ne!(forked["sessionId"], Value::Null);
    // The fork's first request (the fake model then goes by the older
    // prompt's directives, which this server gets as the last user message).
    let messages = model
        .bodies()
        .iter()
        .map(|body| body["messages"].to_string())
        .find(|messages| messages.contains("carry on"))
        .unwrap();
    assert!(
        messages.contains("write steps=2") && messages.contains("carry on"),
        "{messages}"
    );
    assert_eq!(
        messages.matches("\"write_file\"").count(),
        1,
        "step 2's call is not there: {messages}"
    );
    let view = client.ok("run.get", json!({"runId": forked["forkRunId"]})).await;
    assert_eq!(view["sessionId"], forked["sessionId"]);

    // Another token worked in the workspace since: going back to a step of
    // alice's run would undo (and name) bob's work, so it is refused.
    let bob_run = run_id(&bob.ok("agent.run", json!({"prompt": "bob's turn steps=0"})).await);
    bob.until(&bob_run, "lifecycle.end").await;
    assert_eq!(
        client
            .error("run.rewind", json!({"runId": run, "step": 1, "dryRun": true}))
            .await,
        "INVALID_STATE"
    );
}

/// `--db` wins over the file's `[cluster]`, and the gateway says so rather
/// than leaving the operator to find out from runs that never reach a
/// worker; runs are kept in the file and executed here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_db_on_the_command_line_says_the_files_cluster_is_not_used() {
    let dir = tempfile::tempdir().unwrap();
    let model = model();
    config(
        dir.path(),
        &model.url(),
        "\n[cluster]\nredis = \"redis://127.0.0.1:1/0\"\n",
    );
    let db = dir.path().join("runs.db");
    let gateway = Gateway::start(dir.path(), &["--db", db.to_str().unwrap()]);
    let mut client = gateway.ws(ALICE).await;
    let accepted = client.ok("agent.run", json!({"prompt": "hello answer=hi"})).await;
    let run = run_id(&accepted);
    client.until(&run, "lifecycle.end").await;
    assert!(
        gateway.log_text().contains("[cluster] section is not used"),
        "{}",
        gateway.log_text()
    );
    assert!(db.exists(), "the run is kept in --db");
}
