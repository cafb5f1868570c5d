//! `loom runs show ID --tree`: a recorded run's turns, read from its event
//! log — each model call with its time, tokens, cost and finish reason,
//! each tool call with its status, duration and stage timings, sub-agents
//! nested under the `task` call that started them, compression and
//! guidance where they happened.

use std::time::SystemTime;

use loom::{Event, EventKind, Store};

/// Levels of sub-agents shown at most.
const DEEPEST: usize = 8;

#[derive(Default)]
struct Turn {
    number: u32,
    model_ms: Option<u64>,
    llm_started: Option<SystemTime>,
    tokens: Option<(u64, u64)>,
    cost: Option<f64>,
    finish: Option<String>,
    notes: Vec<String>,
    calls: Vec<Call>,
    waited_ms: u64,
}

struct Call {
    id: String,
    name: String,
    args: String,
    status: String,
    duration_ms: Option<u64>,
    stages: String,
    child: Option<String>,
}

struct Folded {
    turns: Vec<Turn>,
    notes: Vec<String>,
    end: Option<String>,
}

/// The tree of `run_id` as lines of text.
pub(crate) async fn render(store: &dyn Store, run_id: &str) -> Result<String, loom::StoreError> {
    let mut out = String::new();
    let mut pending = vec![(0_usize, run_id.to_string())];
    // Each run once, whatever a result claims (a tool named `task` could
    // name any run).
    let mut visited = std::collections::HashSet::new();
    // Depth first: a child's lines go right under its call.
    let mut lines: Vec<(usize, String)> = Vec::new();
    while let Some((depth, id)) = pending.pop() {
        if !visited.insert(id.clone()) {
            continue;
        }
        let events = store.events(&id, 0).await?;
        let folded = fold(&events);
        let mut own = Vec::new();
        let mut children = Vec::new();
        for note in &folded.notes {
            own.push(format!("⚑ {note}"));
        }
        for turn in &folded.turns {
            let mut head = format!("turn {}", turn.number + 1);
            head.push_str(&match turn.model_ms {
                Some(ms) => format!("  model {}", duration(ms)),
                None => "  model …".to_string(),
            });
            if let Some((input, output)) = turn.tokens {
                head.push_str(&format!("  {input}+{output} tokens"));
            }
            if let Some(cost) = turn.cost {
                head.push_str(&format!("  ${cost:.5}"));
            }
            if let Some(finish) = &turn.finish {
                head.push_str(&format!("  finish {finish}"));
            }
            if turn.waited_ms > 0 {
                head.push_str(&format!("  waited {} for a person", duration(turn.waited_ms)));
            }
            own.push(head);
            for note in &turn.notes {
                own.push(format!("  ⚑ {note}"));
            }
            for call in &turn.calls {
                let took = call.duration_ms.map(duration).unwrap_or_else(|| "…".to_string());
                own.push(format!(
                    "  ├─ {} {}  {}  {took}  [{}]",
                    call.name, call.args, call.status, call.stages
                ));
                if let (Some(child), true) = (&call.child, depth < DEEPEST) {
                    own.push(format!("  │   └─ sub-agent {child}"));
                    children.push((own.len(), child.clone()));
                }
            }
        }
        if let Some(end) = &folded.end {
            own.push(format!("end: {end}"));
        }
        // Insert this run's lines where its parent call put a marker.
        let indent = "      ".repeat(depth);
        let at = lines
            .iter()
            .position(|(d, line)| *d + 1 == depth && line.ends_with(&format!("sub-agent {id}")))
            .map_or(lines.len(), |index| index + 1);
        for (offset, line) in own.into_iter().enumerate() {
            lines.insert(at + offset, (depth, format!("{indent}{line}")));
        }
        for (_, child) in children.into_iter().rev() {
            pending.push((depth + 1, child));
        }
    }
    for (_, line) in lines {
        out.push_str(&line);
        out.push('\n');
    }
    Ok(out)
}

fn fold(events: &[Event]) -> Folded {
    let mut turns: Vec<Turn> = Vec::new();
    let mut notes = Vec::new();
    let mut end = None;
    let mut asked: Vec<(String, SystemTime)> = Vec::new();
    for event in events {
        let at = humantime::parse_rfc3339_weak(&event.ts).ok();
        // Events belong to the turn begun last.
        let turn_index = turns.len().saturating_sub(1);
        match &event.kind {
            EventKind::IterationStart { iteration } => turns.push(Turn {
                number: *iteration,
                ..Turn::default()
            }),
            EventKind::LlmStart { .. } => {
                if let Some(turn) = turns.get_mut(turn_index) {
                    turn.llm_started = at;
                }
            }
            EventKind::LlmFinish {
                usage,
                cost_usd,
                finish_reason,
                ..
            } => {
                if let Some(turn) = turns.get_mut(turn_index) {
                    turn.model_ms = elapsed_ms(turn.llm_started, at);
                    turn.tokens = usage.as_ref().map(|u| (u.input_tokens, u.output_tokens));
                    turn.cost = *cost_usd;
                    turn.finish = finish_reason.clone();
                }
            }
            EventKind::ToolCallsStart { calls } => {
                if let Some(turn) = turns.get_mut(turn_index) {
                    for call in calls {
                        turn.calls.push(Call {
                            id: call.call_id.clone(),
                            name: call.name.clone(),
                            args: clip(&call.args.to_string(), 60),
                            status: "running".to_string(),
                            duration_ms: None,
                            stages: String::new(),
                            child: None,
                        });
                    }
                }
            }
            EventKind::ToolResult {
                call_id,
                status,
                content,
                duration_ms,
                stages,
                ..
            } => {
                let call = turns
                    .iter_mut()
                    .rev()
                    .flat_map(|turn| turn.calls.iter_mut())
                    .find(|call| &call.id == call_id);
                if let Some(call) = call {
                    call.status = status.as_str().to_string();
                    call.duration_ms = Some(*duration_ms);
                    call.stages = format!(
                        "discover {} µs, validate {} µs, authorize {} µs, execute {} µs, format {} µs",
                        stages.discover_us,
                        stages.validate_us,
                        stages.authorize_us,
                        stages.execute_us,
                        stages.format_us
                    );
                    if call.name == loom::delegate::TASK_TOOL {
                        call.child = content
                            .strip_prefix("sub-agent ")
                            .and_then(|rest| rest.split_whitespace().next())
                            .map(str::to_string);
                    }
                }
            }
            EventKind::PermissionRequest { request_id, .. } => {
                if let Some(at) = at {
                    asked.push((request_id.clone(), at));
                }
            }
            EventKind::PermissionResolved { request_id, .. } => {
                if let Some(index) = asked.iter().position(|(id, _)| id == request_id) {
                    let (_, since) = asked.remove(index);
                    if let (Some(turn), Some(ms)) = (turns.get_mut(turn_index), elapsed_ms(Some(since), at)) {
                        turn.waited_ms += ms;
                    }
                }
            }
            kind @ EventKind::CompressionApplied { .. } => {
                let note = crate::render::compression_note(kind).unwrap_or_default();
                match turns.get_mut(turn_index) {
                    Some(turn) => turn.notes.push(note),
                    None => notes.push(note),
                }
            }
            EventKind::GuidanceInjected { reason, content } => {
                let note = format!("guidance ({reason}): {}", clip(content, 80));
                match turns.get_mut(turn_index) {
                    Some(turn) => turn.notes.push(note),
                    None => notes.push(note),
                }
            }
            EventKind::Error { code, message, .. } => notes.push(format!("error [{code}]: {}", clip(message, 100))),
            EventKind::LifecycleEnd { status, metrics, .. } => {
                end = Some(format!(
                    "{}  {} turns  {}+{} tokens  {}",
                    status.as_str(),
                    metrics.iterations,
                    metrics.input_tokens,
                    metrics.output_tokens,
                    duration(metrics.duration_ms)
                ));
            }
            _ => {}
        }
    }
    Folded { turns, notes, end }
}

fn elapsed_ms(from: Option<SystemTime>, to: Option<SystemTime>) -> Option<u64> {
    let (from, to) = (from?, to?);
    to.duration_since(from).ok().map(|d| d.as_millis() as u64)
}

fn duration(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// One line of at most `max` characters.
fn clip(text: &str, max: usize) -> String {
    crate::text::clip(&text.replace('\n', " "), max - 1)
}
