//! The command line's permission policy and its answers to `ask`.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};

use anyhow::{anyhow, Result};
use loom::{Decision, PermissionDecision, PermissionPolicy};

use crate::cli::AgentArgs;

/// Tools allowed unless a rule says otherwise: those that only read, and
/// `task`, which only delegates (every call its sub-agent makes is checked
/// by the same rules).
const ALLOWED_BY_DEFAULT: &[&str] = &[
    "read_file",
    "list_dir",
    "glob",
    "grep",
    "skill",
    loom::delegate::TASK_TOOL,
];

/// The policy: read-only tools and `task` allowed, everything else asks (in
/// `loom serve`: is denied); then the `[permissions]` of loom.toml; then
/// `--allow/--ask/--deny`, which come first.
pub(crate) fn policy(
    args: &AgentArgs,
    file: Option<&BTreeMap<String, String>>,
    server: bool,
) -> Result<PermissionPolicy> {
    let mut policy = PermissionPolicy::new(if server { Decision::Deny } else { Decision::Ask });
    for tool in ALLOWED_BY_DEFAULT {
        policy.add_rule(tool, Decision::Allow)?;
    }
    for (pattern, decision) in file.into_iter().flatten() {
        let decision: Decision = decision
            .parse()
            .map_err(|err| anyhow!("loom.toml [permissions] '{pattern}': {err}"))?;
        if pattern == "default" {
            policy.set_default(decision);
        } else {
            policy.add_rule(pattern, decision)?;
        }
    }
    for (patterns, decision) in [
        (&args.common.allow, Decision::Allow),
        (&args.common.ask, Decision::Ask),
        (&args.common.deny, Decision::Deny),
    ] {
        for pattern in patterns {
            policy.add_override(pattern, decision)?;
        }
    }
    Ok(policy)
}

/// Why nobody can answer this command's asks, when nobody can: `loom run`
/// or `chat` without a terminal on stdin (and without `--yes`).
pub(crate) fn nobody_to_ask(args: &AgentArgs, server: bool) -> Option<&'static str> {
    (!server && !args.yes && !std::io::stdin().is_terminal())
        .then_some("loom runs without a terminal to ask on; rerun with --yes or --allow TOOL to approve")
}

/// Prints the permission question for `shown` (a call as `tool(args)`).
pub(crate) fn ask(shown: &str) {
    // One write, so the question is never split by output on the same terminal.
    let question = format!("loom: allow {shown}? [y]es / [n]o / [a]lways: ");
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(question.as_bytes()).and_then(|_| stderr.flush());
}

/// An answer to the question; an empty line is "no".
pub(crate) fn parse_answer(line: &str) -> Result<PermissionDecision, String> {
    match line.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(PermissionDecision::Allow),
        "a" | "always" => Ok(PermissionDecision::Always),
        "n" | "no" | "" => Ok(PermissionDecision::Deny),
        other => Err(other.to_string()),
    }
}

/// MCP tools ask by default (docs/tools.md) — in `loom serve` too, where
/// other tools are denied. loom.toml decides instead when it says anything
/// that covers them: a `default`, a `*` rule, or a rule for the server's
/// tools (`NAME__…`).
pub(crate) fn ask_for_mcp_tools(
    policy: &mut PermissionPolicy,
    clients: &loom::tools::McpClients,
    file: Option<&BTreeMap<String, String>>,
) -> Result<()> {
    let rules: Vec<&String> = file.into_iter().flatten().map(|(pattern, _)| pattern).collect();
    if rules
        .iter()
        .any(|pattern| *pattern == "default" || pattern.starts_with('*'))
    {
        return Ok(());
    }
    for server in clients.servers() {
        let prefix = format!("{}__", server.name());
        if !rules.iter().any(|pattern| pattern.starts_with(&prefix)) {
            policy.add_rule(&format!("{prefix}*"), Decision::Ask)?;
        }
    }
    Ok(())
}
