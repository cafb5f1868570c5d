//! What a person (or a client) sends a live run: the controls, and the
//! answer to a permission request.

use serde::{Deserialize, Serialize};

/// A person's answer to a permission request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PermissionDecision {
    /// Run this call.
    Allow,
    /// Do not run it.
    Deny,
    /// Run it, and do not ask again for this tool (or this rule) in this session.
    Always,
}

impl PermissionDecision {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::Always => "always",
        }
    }
}

impl std::fmt::Display for PermissionDecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A command to a live run: the one way anything — the CLI, a gateway, an
/// embedding application — tells a run what to do
/// ([`crate::RunController::send`]). Serializable, so that a gateway can
/// hand it to the worker that executes the run (docs/cluster.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Control {
    /// Stop the run now: the model stream and running tools are aborted.
    Cancel {
        /// Why, as shown in `execution.cancelled`.
        reason: String,
    },
    /// Stop the run now but leave it resumable: it checkpoints and ends
    /// `INTERRUPTED` (a process going away).
    Interrupt {
        /// Why, as logged.
        reason: String,
    },
    /// Hold the run at the next turn boundary.
    Pause,
    /// Let a paused run go on (not the resume of a stopped run:
    /// [`crate::Agent::resume`]).
    Unpause,
    /// Add a user message at the next turn boundary.
    Steer(String),
    /// Answer a `permission.request`.
    PermissionReply {
        /// The request's id.
        request_id: String,
        /// The answer.
        decision: PermissionDecision,
    },
}
