//! Hooks around every tool call (docs/library.md).
//!
//! `before_tool` runs in the authorize stage, in registration order, and may
//! let the call through, allow it outright, ask a person, deny it, or rewrite
//! its arguments. The permission policy is itself the last `before_tool`
//! hook. `after_tool` may rewrite a result before it is formatted.

use std::path::Path;

use async_trait::async_trait;
use serde_json::Value;

use crate::message::ToolCall;
use crate::permission::{Decision, PermissionPolicy};
use crate::tool_result::ToolResult;

/// What a `before_tool` hook decides.
#[derive(Debug, Clone, PartialEq)]
pub enum HookDecision {
    /// No opinion: the next hook (finally the permission policy) decides.
    Continue,
    /// Run the call; later hooks and the policy are skipped.
    Allow,
    /// Ask a person. An "always" answer grants `grant_key` for the session.
    Ask {
        /// What "always" grants, e.g. `tool:write_file`.
        grant_key: String,
        /// Why the question is asked, shown to the person.
        reason: Option<String>,
    },
    /// Do not run the call; the model reads `reason`.
    Deny(String),
    /// Replace the arguments (they are validated again) and continue.
    Rewrite(Value),
}

/// The call a hook is asked about.
#[derive(Debug, Clone, Copy)]
pub struct HookCall<'a> {
    /// The call as the model made it.
    pub call: &'a ToolCall,
    /// Its arguments after validation and earlier rewrites.
    pub args: &'a Value,
    /// The run.
    pub run_id: &'a str,
    /// The workspace root.
    pub workspace: &'a Path,
}

/// Code that runs before and after each tool call.
#[async_trait]
pub trait ToolHook: Send + Sync + 'static {
    /// Decides about a call before it runs.
    async fn before_tool(&self, _call: HookCall<'_>) -> HookDecision {
        HookDecision::Continue
    }

    /// Sees (and may replace) a call's result before it is formatted.
    async fn after_tool(&self, _call: &ToolCall, result: ToolResult) -> ToolResult {
        result
    }
}

/// The permission policy as the last `before_tool` hook.
#[derive(Debug, Clone)]
pub struct PermissionHook {
    policy: PermissionPolicy,
}

impl PermissionHook {
    /// A hook enforcing `policy`.
    pub fn new(policy: PermissionPolicy) -> Self {
        Self { policy }
    }

    /// The policy.
    pub fn policy(&self) -> &PermissionPolicy {
        &self.policy
    }
}

#[async_trait]
impl ToolHook for PermissionHook {
    async fn before_tool(&self, call: HookCall<'_>) -> HookDecision {
        let verdict = self.policy.evaluate(&call.call.name, call.args, call.workspace);
        match verdict.decision {
            Decision::Allow => HookDecision::Allow,
            Decision::Deny => HookDecision::Deny(match &verdict.rule {
                Some(rule) => format!(
                    "Permission denied: the rule '{rule}' forbids this call of '{}'. Do not retry it; find another way or tell the user what you need.",
                    call.call.name
                ),
                None => format!(
                    "Permission denied: '{}' is not allowed in this session. Do not retry it; find another way or tell the user what you need.",
                    call.call.name
                ),
            }),
            Decision::Ask => HookDecision::Ask {
                // "always" grants the rule that asked when it constrains
                // arguments, otherwise the whole tool.
                grant_key: match (&verdict.rule, verdict.rule_has_arguments) {
                    (Some(rule), true) => format!("rule:{rule}"),
                    _ => format!("tool:{}", call.call.name),
                },
                reason: verdict.rule,
            },
        }
    }
}
