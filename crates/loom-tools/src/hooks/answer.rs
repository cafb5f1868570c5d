//! What a hook's command answered (docs/extending.md): its exit status and,
//! on exit 0, optional JSON on stdout. Exit 2 denies (or blocks) with
//! stderr as the reason, as Claude Code's hooks do; any other exit, a
//! timeout, or stdout that is not the expected JSON is a failed hook.

use loom_core::hooks::{HookEvent, HookVerdict};
use serde::Deserialize;
use serde_json::Value;

use crate::shell::CommandRun;

/// Longest reason, context or error text kept from a hook, in bytes.
const MAX_TEXT: usize = 16 * 1024;

/// One hook's answer, or why it failed.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Answer {
    pub verdict: Option<HookVerdict>,
    pub reason: Option<String>,
    pub arguments: Option<Value>,
    pub context: Option<String>,
    pub error: Option<String>,
}

impl Answer {
    fn failed(error: String) -> Self {
        Self {
            error: Some(error),
            ..Self::default()
        }
    }
}

/// The JSON a hook may print: Loom's fields, and Claude Code's
/// `hookSpecificOutput` so its hooks work unchanged. Other fields are
/// ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Printed {
    decision: Option<String>,
    reason: Option<String>,
    arguments: Option<Value>,
    context: Option<String>,
    hook_specific_output: Option<ClaudeCodeOutput>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaudeCodeOutput {
    permission_decision: Option<String>,
    permission_decision_reason: Option<String>,
    updated_input: Option<Value>,
    additional_context: Option<String>,
}

/// Reads what `run` left, for a hook at `event` that was given `timeout_secs`.
pub(crate) fn read(run: &CommandRun, event: HookEvent, timeout_secs: u64) -> Answer {
    if run.cancelled {
        return Answer::failed("stopped: the run was cancelled".to_string());
    }
    if run.timed_out {
        return Answer::failed(format!(
            "did not finish within {timeout_secs} s; it was stopped with its process group"
        ));
    }
    match run.exit_code {
        Some(0) => read_printed(run, event),
        // A session's start cannot be refused: its exit 2 is no answer.
        Some(2) if event == HookEvent::SessionStart => Answer::default(),
        Some(2) => {
            let reason = bounded(run.stderr.trim());
            Answer {
                verdict: Some(HookVerdict::Deny),
                reason: Some(if reason.is_empty() {
                    "(the hook exited with status 2 and said nothing on stderr)".to_string()
                } else {
                    reason
                }),
                ..Answer::default()
            }
        }
        Some(code) => Answer::failed(with_stderr(format!("exited with status {code}"), &run.stderr)),
        None => Answer::failed(with_stderr("was killed by a signal".to_string(), &run.stderr)),
    }
}

fn read_printed(run: &CommandRun, event: HookEvent) -> Answer {
    if run.stdout_dropped > 0 {
        return Answer::failed(format!(
            "printed more than the {} bytes a hook's answer may have",
            super::MAX_ANSWER_BYTES
        ));
    }
    let text = run.stdout.trim();
    if text.is_empty() {
        return Answer::default();
    }
    // Strict: a key given twice (`{"decision": "deny", "decision":
    // "allow"}`) is no answer, not the last of them.
    let printed: Printed = match loom_core::json_strict::parse_strict(text) {
        Ok(value @ Value::Object(_)) => match serde_json::from_value(value) {
            Ok(printed) => printed,
            Err(err) => return Answer::failed(format!("printed JSON with a field of the wrong type: {err}")),
        },
        _ => {
            return Answer::failed(format!(
                "printed something that is not a JSON object: {}",
                bounded_to(text, 200)
            ))
        }
    };
    let specific = printed.hook_specific_output.unwrap_or_default();
    // Both names may be given: the stricter decision counts.
    let mut verdict = None;
    for decision in [printed.decision, specific.permission_decision].into_iter().flatten() {
        let read = match decision.as_str() {
            "allow" | "approve" => HookVerdict::Allow,
            "deny" | "block" => HookVerdict::Deny,
            "ask" => HookVerdict::Ask,
            other => {
                return Answer::failed(format!(
                    "printed the decision {:?}, which is none of allow, deny, ask",
                    bounded_to(other, 100)
                ))
            }
        };
        verdict = super::stricter(verdict, Some(read));
    }
    // Only a call can be allowed or asked about; elsewhere only a refusal means anything.
    let verdict = match (event, verdict) {
        (HookEvent::PreToolUse, verdict) => verdict,
        (_, Some(HookVerdict::Deny)) if event != HookEvent::SessionStart => Some(HookVerdict::Deny),
        _ => None,
    };
    let arguments = match printed.arguments.or(specific.updated_input) {
        Some(Value::Object(map)) if event == HookEvent::PreToolUse => Some(Value::Object(map)),
        Some(Value::Object(_)) | None => None,
        Some(_) => return Answer::failed("printed `arguments` that are not a JSON object".to_string()),
    };
    let context = [printed.context, specific.additional_context]
        .into_iter()
        .flatten()
        .map(|text| bounded(text.trim()))
        .filter(|text| !text.is_empty())
        .collect::<Vec<_>>();
    Answer {
        verdict,
        reason: printed
            .reason
            .or(specific.permission_decision_reason)
            .map(|reason| bounded(reason.trim())),
        arguments,
        context: (!context.is_empty()).then(|| context.join("\n")),
        error: None,
    }
}

fn with_stderr(what: String, stderr: &str) -> String {
    let stderr = stderr.trim();
    if stderr.is_empty() {
        what
    } else {
        format!("{what}: {}", bounded_to(stderr, 500))
    }
}

fn bounded(text: &str) -> String {
    bounded_to(text, MAX_TEXT)
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn bounded_to(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn exited(code: i32, stdout: &str, stderr: &str) -> CommandRun {
        CommandRun {
            exit_code: Some(code),
            timed_out: false,
            cancelled: false,
            stdout: stdout.to_string(),
            stderr: stderr.to_string(),
            stdout_dropped: 0,
        }
    }

    #[test]
    fn exit_two_denies_with_stderr_as_the_reason() {
        let answer = read(&exited(2, "", "no rm -rf here\n"), HookEvent::PreToolUse, 30);
        assert_eq!(answer.verdict, Some(HookVerdict::Deny));
        assert_eq!(answer.reason.as_deref(), Some("no rm -rf here"));
        assert_eq!(answer.error, None);
    }

    #[test]
    fn exit_zero_reads_every_field_and_claude_codes_names() {
        let printed = json!({"decision": "ask", "reason": "check it", "arguments": {"path": "b.txt"}, "context": "c"});
        let answer = read(&exited(0, &printed.to_string(), ""), HookEvent::PreToolUse, 30);
        assert_eq!(answer.verdict, Some(HookVerdict::Ask));
        assert_eq!(answer.reason.as_deref(), Some("check it"));
        assert_eq!(answer.arguments, Some(json!({"path": "b.txt"})));
        assert_eq!(answer.context.as_deref(), Some("c"));

        let claude = json!({"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
            "permissionDecisionReason": "no"}, "suppressOutput": true});
        let answer = read(&exited(0, &claude.to_string(), ""), HookEvent::PreToolUse, 30);
        assert_eq!(answer.verdict, Some(HookVerdict::Deny));
        assert_eq!(answer.reason.as_deref(), Some("no"));
    }

    #[test]
    fn conflicting_decisions_count_as_the_stricter_and_a_repeated_key_as_garbage() {
        let both = r#"{"decision": "allow", "hookSpecificOutput": {"permissionDecision": "deny"}}"#;
        assert_eq!(
            read(&exited(0, both, ""), HookEvent::PreToolUse, 30).verdict,
            Some(HookVerdict::Deny)
        );
        let ask = r#"{"decision": "allow", "hookSpecificOutput": {"permissionDecision": "ask"}}"#;
        assert_eq!(
            read(&exited(0, ask, ""), HookEvent::PreToolUse, 30).verdict,
            Some(HookVerdict::Ask)
        );
        let twice = read(
            &exited(0, r#"{"decision": "deny", "decision": "allow"}"#, ""),
            HookEvent::PreToolUse,
            30,
        );
        assert_eq!(twice.verdict, None);
        assert!(twice.error.is_some_and(|error| error.contains("not a JSON object")));
    }

    #[test]
    fn nothing_printed_is_no_opinion() {
        assert_eq!(read(&exited(0, " \n", ""), HookEvent::Stop, 30), Answer::default());
    }

    #[test]
    fn garbage_timeouts_and_other_exits_are_failures() {
        for (run, expected) in [
            (exited(0, "not json", ""), "not a JSON object"),
            (exited(0, "[1]", ""), "not a JSON object"),
            (exited(0, r#"{"decision": "maybe"}"#, ""), "none of allow, deny, ask"),
            (exited(0, r#"{"reason": 3}"#, ""), "wrong type"),
            (exited(0, r#"{"arguments": "x"}"#, ""), "not a JSON object"),
            (exited(1, "", "boom"), "exited with status 1: boom"),
            (
                CommandRun {
                    timed_out: true,
                    exit_code: None,
                    ..exited(0, "", "")
                },
                "did not finish within 5 s",
            ),
        ] {
            let answer = read(&run, HookEvent::PreToolUse, 5);
            assert_eq!(answer.verdict, None, "{run:?}");
            assert!(
                answer.error.as_deref().is_some_and(|e| e.contains(expected)),
                "{answer:?}"
            );
        }
    }

    #[test]
    fn decisions_mean_only_what_their_event_allows() {
        let allow = exited(0, r#"{"decision": "allow", "arguments": {"a": 1}}"#, "");
        assert_eq!(read(&allow, HookEvent::Stop, 30).verdict, None);
        assert_eq!(read(&allow, HookEvent::PostToolUse, 30).arguments, None);
        let block = exited(0, r#"{"decision": "block", "reason": "tests fail"}"#, "");
        assert_eq!(read(&block, HookEvent::Stop, 30).verdict, Some(HookVerdict::Deny));
        assert_eq!(read(&block, HookEvent::SessionStart, 30).verdict, None);
        assert_eq!(
            read(&exited(2, "", "no"), HookEvent::SessionStart, 30),
            Answer::default()
        );
    }
}
