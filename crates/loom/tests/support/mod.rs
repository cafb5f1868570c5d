//! Helpers shared by the engine tests: tools with observable behaviour and
//! checks that every run's event stream keeps the contract.

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use loom::models::{ScriptToolCall, ScriptTurn, ScriptedModel};
use loom::{Event, EventKind, Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

/// A scripted model that plays `turns` in order.
pub(crate) fn scripted(turns: Vec<ScriptTurn>) -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::new(turns))
}

/// A turn that answers with text.
pub(crate) fn answer(text: &str) -> ScriptTurn {
    ScriptTurn {
        content: Some(text.to_string()),
        ..ScriptTurn::default()
    }
}

/// A turn that calls one tool.
pub(crate) fn call(name: &str, arguments: Value) -> ScriptTurn {
    calls(&[(name, arguments)])
}

/// A turn that calls several tools.
pub(crate) fn calls(list: &[(&str, Value)]) -> ScriptTurn {
    ScriptTurn {
        tool_calls: list
            .iter()
            .map(|(name, arguments)| ScriptToolCall {
                name: name.to_string(),
                arguments: arguments.clone(),
                id: None,
            })
            .collect(),
        ..ScriptTurn::default()
    }
}

/// The same turn, started after `ms` milliseconds.
pub(crate) fn delayed(mut turn: ScriptTurn, ms: u64) -> ScriptTurn {
    turn.delay_ms = Some(ms);
    turn
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct EchoArgs {
    /// Text to return.
    pub text: String,
}

/// Returns its argument; counts its calls.
#[derive(Default, Clone)]
pub(crate) struct Echo {
    pub calls: Arc<AtomicUsize>,
}

impl Tool for Echo {
    type Args = EchoArgs;
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "Returns the text it is given."
    }
    fn concurrency_safe(&self) -> bool {
        true
    }
    fn read_only(&self) -> bool {
        true
    }
    async fn call(&self, args: EchoArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(args.text.into())
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct NoArgs {}

/// Sleeps until cancelled (or 60 s); records that it saw its token.
#[derive(Default, Clone)]
pub(crate) struct Slow {
    pub started: Arc<AtomicBool>,
    pub saw_cancel: Arc<AtomicBool>,
}

impl Tool for Slow {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "slow"
    }
    fn description(&self) -> &str {
        "Takes a long time."
    }
    async fn call(&self, _args: NoArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        self.started.store(true, Ordering::SeqCst);
        tokio::select! {
            _ = ctx.cancel.cancelled() => {
                self.saw_cancel.store(true, Ordering::SeqCst);
                Err(ToolError::Cancelled)
            }
            _ = tokio::time::sleep(Duration::from_secs(60)) => Ok("finished".into()),
        }
    }
}

/// Fails, panics or returns nothing, depending on `mode`.
pub(crate) struct Faulty;

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct FaultyArgs {
    /// `fail`, `panic` or `empty`.
    pub mode: String,
}

impl Tool for Faulty {
    type Args = FaultyArgs;
    fn name(&self) -> &str {
        "faulty"
    }
    fn description(&self) -> &str {
        "Misbehaves on purpose."
    }
    async fn call(&self, args: FaultyArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        match args.mode.as_str() {
            "fail" => Err(ToolError::Failed("disk on fire".into())),
            "panic" => panic!("tool bug"),
            _ => Ok(ToolOutput::default()),
        }
    }
}

/// Names of the events, in order.
pub(crate) fn names(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind.name()).collect()
}

/// The contract every run keeps: common fields present, `seq` strictly
/// increasing from 1, `lifecycle.start` first and `lifecycle.end` last, and
/// every event survives a JSON round trip.
pub(crate) fn assert_contract(events: &[Event]) {
    assert!(!events.is_empty(), "no events");
    assert_eq!(events[0].kind.name(), "lifecycle.start");
    assert_eq!(events.last().map(|e| e.kind.name()), Some("lifecycle.end"));
    assert_eq!(events.iter().filter(|e| e.kind.name() == "lifecycle.end").count(), 1);
    let run_id = &events[0].run_id;
    for (index, event) in events.iter().enumerate() {
        assert_eq!(event.seq, index as u64 + 1, "seq gap at {index}");
        assert_eq!(&event.run_id, run_id);
        let json = serde_json::to_value(event).unwrap();
        for key in ["type", "runId", "turnId", "parentTurnId", "depth", "seq", "ts"] {
            assert!(json.get(key).is_some(), "{key} missing in {json}");
        }
        let back: Event = serde_json::from_value(json).unwrap();
        assert_eq!(&back, event);
    }
}

/// All `tool.result` events as (name, status, content).
pub(crate) fn tool_results(events: &[Event]) -> Vec<(String, String, String)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult {
                name, status, content, ..
            } => Some((name.clone(), status.as_str().to_string(), content.clone())),
            _ => None,
        })
        .collect()
}

/// A JSON object literal helper for arguments.
pub(crate) fn obj(value: Value) -> Value {
    if value.is_null() {
        json!({})
    } else {
        value
    }
}
