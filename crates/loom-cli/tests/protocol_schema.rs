//! The protocol's JSON Schema (`loom serve --print-schema`): the copy in
//! docs/ is current, and every frame a real gateway sends fits it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::gateway::{config, http, Gateway, ALICE};
use loom_testkit::{PromptModel, PromptModelOptions};
use serde_json::{json, Value};

fn printed_schema() -> Value {
    let output = common::loom().args(["serve", "--print-schema"]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn the_schema_in_docs_is_the_one_the_binary_prints() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/protocol.schema.json");
    let published: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(
        published == printed_schema(),
        "docs/protocol.schema.json is out of date: cargo run -p loom-cli -- serve --print-schema > docs/protocol.schema.json"
    );
}

/// A validator for one of the schema's definitions.
fn validator(schema: &Value, definition: &str) -> jsonschema::Validator {
    let mut rooted = schema.clone();
    let root = rooted.as_object_mut().unwrap();
    root.retain(|key, _| key == "$defs" || key == "$schema");
    root.insert("$ref".into(), json!(format!("#/$defs/{definition}")));
    jsonschema::validator_for(&rooted).unwrap()
}

fn assert_fits(validator: &jsonschema::Validator, frame: &Value) {
    let errors: Vec<String> = validator.iter_errors(frame).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{frame}\ndoes not fit the schema: {errors:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_frame_and_body_a_client_gets_fits_the_schema() {
    let schema = printed_schema();
    let (responses, events, http_errors) = (
        validator(&schema, "ResponseFrame"),
        validator(&schema, "EventFrame"),
        validator(&schema, "HttpError"),
    );
    let dir = tempfile::tempdir().unwrap();
    let model = PromptModel::start(PromptModelOptions::default());
    config(dir.path(), &model.url(), "");
    let gateway = Gateway::start(dir.path(), &["--ask", "write_file"]);
    let mut client = gateway.ws(ALICE).await;

    // A run with tool calls, an ask, a steer and its answer.
    let mut frames = Vec::new();
    let accepted = client
        .call("agent.run", json!({"prompt": "work steps=2 tool=write_file"}))
        .await;
    let run = accepted["payload"]["runId"].as_str().unwrap().to_string();
    frames.push(accepted);
    let ask = client.until(&run, "permission.request").await;
    frames.push(client.call("permission.list", json!({})).await);
    frames.push(client.call("run.get", json!({"runId": run})).await);
    frames.push(
        client
            .call("agent.steer", json!({"runId": run, "message": "and then stop"}))
            .await,
    );
    let request_id = ask["payload"]["requestId"].clone();
    frames.push(
        client
            .call(
                "permission.respond",
                json!({"runId": run, "requestId": request_id, "decision": "always"}),
            )
            .await,
    );
    client.until(&run, "lifecycle.end").await;
    frames.push(client.call("run.list", json!({"limit": 1})).await);
    frames.push(client.call("run.subscribe", json!({"runId": run, "afterSeq": 3})).await);
    frames.push(client.call("run.unsubscribe", json!({"runId": run})).await);
    frames.push(client.call("agent.cancel", json!({"runId": run})).await);
    // Errors of every kind a frame can have.
    frames.push(client.call("agent.fly", json!({})).await);
    frames.push(client.call("run.get", json!({"runId": "nope"})).await);
    frames.push(client.call("agent.run", json!(["a list"])).await);
    client.send_text("{not json".into()).await;
    frames.push(client.frame().await.unwrap());
    for frame in &frames {
        assert_fits(&responses, frame);
    }
    assert!(client.events.len() > 10, "{:?}", client.events);
    // What a client may send, and what the server refuses.
    let requests = validator(&schema, "RequestFrame");
    let frame =
        |method: &str, payload: Value| json!({"type": "request", "id": 1, "method": method, "payload": payload});
    assert_fits(&requests, &frame("run.list", json!({"limit": 1})));
    assert_fits(
        &requests,
        &frame("agent.run", json!({"prompt": "hi", "onBusy": "steer"})),
    );
    for refused in [
        frame("agent.fly", json!({})),
        frame("agent.run", json!({"prompt": "hi", "colour": "red"})),
        frame("agent.run", json!(["hi"])),
        json!({"type": "request", "id": 1, "method": "run.list", "payload": {}, "extra": true}),
    ] {
        assert!(!requests.is_valid(&refused), "the schema takes {refused}");
    }
    for event in &client.events {
        assert_fits(&events, event);
    }

    // The HTTP answers are the same types; errors are {"error": …}.
    let body =
        |request: reqwest::RequestBuilder| async move { request.send().await.unwrap().json::<Value>().await.unwrap() };
    let client = http(ALICE);
    let started = body(
        client
            .post(gateway.url("/v1/runs"))
            .json(&json!({"prompt": "hello steps=0"})),
    )
    .await;
    assert_fits(&validator(&schema, "Answer"), &started);
    let missing = body(client.get(gateway.url("/v1/runs/nope"))).await;
    assert_fits(&http_errors, &missing);
}
