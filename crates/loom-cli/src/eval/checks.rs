//! The checks of a case, judged on an attempt's final workspace and run.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::attempt::Ran;
use super::suite::Check;

/// How long a `command` check may run.
const COMMAND_LIMIT: Duration = Duration::from_secs(120);

/// Characters of a failed command's output kept in the report.
const OUTPUT_SHOWN: usize = 400;

/// One check's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct CheckResult {
    /// The check in a few words.
    pub check: String,
    /// Its kind (its key in the suite).
    pub kind: String,
    pub passed: bool,
    /// What was found, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Judges every check, in the suite's order.
pub(crate) async fn judge(checks: &[Check], workspace: &Path, ran: &Ran) -> Vec<CheckResult> {
    let mut results = Vec::with_capacity(checks.len());
    for check in checks {
        let failure = match check {
            Check::Command(command) => run_command(command, workspace).await,
            other => judge_one(other, workspace, ran),
        };
        results.push(CheckResult {
            check: check.describe(),
            kind: check.kind().to_string(),
            passed: failure.is_none(),
            detail: failure,
        });
    }
    results
}

/// `None` when the check passes, else what was found.
fn judge_one(check: &Check, workspace: &Path, ran: &Ran) -> Option<String> {
    let answer = ran.answer.as_deref().unwrap_or_default();
    let fail = |passed: bool, detail: String| (!passed).then_some(detail);
    match check {
        Check::FileExists(path) => fail(workspace.join(path).exists(), format!("{path} does not exist")),
        Check::FileAbsent(path) => fail(
            workspace.join(path).symlink_metadata().is_err(),
            format!("{path} exists"),
        ),
        Check::FileContains { path, text } => match std::fs::read_to_string(workspace.join(path)) {
            Ok(content) => fail(
                content.contains(text.as_str()),
                format!("{path} does not contain {text:?}"),
            ),
            Err(err) => Some(format!("cannot read {path}: {err}")),
        },
        Check::FileMatches { path, regex } => match std::fs::read_to_string(workspace.join(path)) {
            Ok(content) => fail(matches(regex, &content), format!("{path} does not match /{regex}/")),
            Err(err) => Some(format!("cannot read {path}: {err}")),
        },
        Check::AnswerContains(text) => fail(
            answer.contains(text.as_str()),
            format!("the answer does not contain {text:?}"),
        ),
        Check::AnswerMatches(regex) => fail(matches(regex, answer), format!("the answer does not match /{regex}/")),
        Check::ToolCalled(tool) => fail(
            ran.tools_called.iter().any(|called| called == tool),
            format!("{tool} was not called"),
        ),
        Check::ToolNotCalled(tool) => {
            let times = ran.tools_called.iter().filter(|called| *called == tool).count();
            fail(times == 0, format!("{tool} was called {times} times"))
        }
        Check::MaxSteps(most) => fail(ran.steps <= *most, format!("{} steps", ran.steps)),
        Check::MaxTokens(most) => {
            let used = ran.prompt_tokens + ran.completion_tokens;
            fail(used <= *most, format!("{used} tokens"))
        }
        Check::MaxCostUsd(most) => fail(ran.cost_usd <= *most, format!("${:.4}", ran.cost_usd)),
        Check::Status(status) => fail(
            ran.status.eq_ignore_ascii_case(status),
            format!("the run ended {}", ran.status),
        ),
        // Judged by `run_command`.
        Check::Command(_) => None,
    }
}

/// Whether `text` matches `regex` (checked when the suite was read).
fn matches(regex: &str, text: &str) -> bool {
    regex::Regex::new(regex).is_ok_and(|regex| regex.is_match(text))
}

/// Runs `command` with `bash -c` in the workspace: `None` when it exits 0.
async fn run_command(command: &str, workspace: &Path) -> Option<String> {
    let child = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(command)
        .current_dir(workspace)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let child = match child {
        Ok(child) => child,
        Err(err) => return Some(format!("cannot start bash: {err}")),
    };
    match tokio::time::timeout(COMMAND_LIMIT, child.wait_with_output()).await {
        Err(_) => Some(format!("still running after {} s", COMMAND_LIMIT.as_secs())),
        Ok(Err(err)) => Some(format!("failed: {err}")),
        Ok(Ok(output)) if output.status.success() => None,
        Ok(Ok(output)) => {
            let mut shown = String::from_utf8_lossy(&output.stdout).into_owned();
            shown.push_str(&String::from_utf8_lossy(&output.stderr));
            let shown = shown.trim();
            let tail: String = {
                let count = shown.chars().count();
                shown.chars().skip(count.saturating_sub(OUTPUT_SHOWN)).collect()
            };
            if tail.is_empty() {
                Some(describe_exit(output.status))
            } else {
                Some(format!("{}: {tail}", describe_exit(output.status)))
            }
        }
    }
}

fn describe_exit(status: std::process::ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exit code {code}"),
        None => "killed by a signal".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ran() -> Ran {
        Ran {
            status: "DONE".into(),
            answer: Some("There are 12 pages.".into()),
            steps: 3,
            prompt_tokens: 900,
            completion_tokens: 100,
            tools_called: vec!["read_file".into(), "write_file".into()],
            ..Ran::default()
        }
    }

    #[tokio::test]
    async fn each_kind_of_check_passes_and_fails_as_documented() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("out.txt"), "total: 42\n").unwrap();
        let cases = [
            (Check::FileExists("out.txt".into()), true),
            (Check::FileExists("nope.txt".into()), false),
            (Check::FileAbsent("nope.txt".into()), true),
            (Check::FileAbsent("out.txt".into()), false),
            (
                Check::FileContains {
                    path: "out.txt".into(),
                    text: "42".into(),
                },
                true,
            ),
            (
                Check::FileContains {
                    path: "out.txt".into(),
                    text: "43".into(),
                },
                false,
            ),
            (
                Check::FileContains {
                    path: "nope.txt".into(),
                    text: "".into(),
                },
                false,
            ),
            (
                Check::FileMatches {
                    path: "out.txt".into(),
                    regex: r"total:\s*\d+".into(),
                },
                true,
            ),
            (
                Check::FileMatches {
                    path: "out.txt".into(),
                    regex: "^none$".into(),
                },
                false,
            ),
            (Check::Command("grep -q 42 out.txt".into()), true),
            (Check::Command("exit 3".into()), false),
            (Check::AnswerContains("12".into()), true),
            (Check::AnswerContains("13".into()), false),
            (Check::AnswerMatches(r"\b12\b".into()), true),
            (Check::AnswerMatches(r"^\d+$".into()), false),
            (Check::ToolCalled("write_file".into()), true),
            (Check::ToolCalled("bash".into()), false),
            (Check::ToolNotCalled("bash".into()), true),
            (Check::ToolNotCalled("read_file".into()), false),
            (Check::MaxSteps(3), true),
            (Check::MaxSteps(2), false),
            (Check::MaxTokens(1000), true),
            (Check::MaxTokens(999), false),
            (Check::MaxCostUsd(0.0), true),
            (Check::Status("done".into()), true),
            (Check::Status("ERROR".into()), false),
        ];
        let checks: Vec<Check> = cases.iter().map(|(check, _)| check.clone()).collect();
        let results = judge(&checks, dir.path(), &ran()).await;
        for ((check, expected), result) in cases.iter().zip(&results) {
            assert_eq!(result.passed, *expected, "{check:?}: {result:?}");
            assert_eq!(result.detail.is_some(), !expected, "{result:?}");
        }
        let exit = results.iter().find(|v| v.check == "command \"exit 3\"").unwrap();
        assert_eq!(exit.detail.as_deref(), Some("exit code 3"));
    }
}
