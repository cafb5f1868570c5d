//! Hooks: code that decides about a run's steps (docs/extending.md).
//!
//! A [`ToolHook`] is Rust code around every tool call: `before_tool` runs in
//! the authorize stage, in registration order, and may let the call
//! through, allow it, ask a person, deny it, or rewrite its arguments;
//! `after_tool` may rewrite a result before it is formatted.
//! [`LifecycleHooks`] ([`lifecycle`]) are asked at six points of a run —
//! the `loom` binary's command hooks are one. The order in which hooks,
//! rules, the mode and a person decide is in `pipeline/authorize.rs`.

pub mod lifecycle;
mod report;

pub use lifecycle::{HookAnswer, HookEvent, HookInput, HookReport, HookRun, HookScope, HookVerdict, LifecycleHooks};
pub(crate) use report::report;

use std::path::Path;

use async_trait::async_trait;
use serde_json::Value;

use crate::message::ToolCall;
use crate::tool_result::ToolResult;

/// What a `before_tool` hook decides.
#[derive(Debug, Clone, PartialEq)]
pub enum HookDecision {
    /// No opinion: the next hook (finally the permission policy) decides.
    Continue,
    /// Run the call without asking; later hooks are skipped. An explicit
    /// `deny` rule still refuses it.
    Allow,
    /// Ask a person. An "always" answer grants `grant` for the session.
    Ask {
        /// What "always" grants, e.g. `SessionGrant::Tool("write_file".into())`.
        grant: crate::permission::SessionGrant,
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
