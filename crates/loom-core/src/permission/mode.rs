//! Permission modes (docs/cli.md, "Permission modes"): how much a run may
//! do without asking, chosen per run.
//!
//! - `default`: the policy as configured;
//! - `plan`: the run is offered only tools that read (the `loom` command
//!   filters them), investigates, and answers with a plan a person approves
//!   before anything changes;
//! - `accept-edits`: the file-writing tools run without asking;
//! - `bypass`: every tool runs without asking.
//!
//! A mode only changes what the policy's *default* decides. A rule that
//! matches — `deny` above all, but also an explicit `ask` — still decides.

use std::fmt;
use std::str::FromStr;

/// The tools `accept-edits` lets run without asking: they change files,
/// and only inside the workspace (the jail).
pub const FILE_WRITING_TOOLS: &[&str] = &["write_file", "edit_file"];

/// A permission mode.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The policy as configured.
    #[default]
    Default,
    /// Read-only tools; the answer is a plan for a person to approve.
    Plan,
    /// The file-writing tools run without asking.
    AcceptEdits,
    /// Every tool runs without asking; explicit rules still hold.
    Bypass,
}

impl Mode {
    /// Every mode, in the order the docs list them.
    pub const ALL: [Mode; 4] = [Mode::Default, Mode::Plan, Mode::AcceptEdits, Mode::Bypass];

    /// The name as written on the command line and the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Plan => "plan",
            Self::AcceptEdits => "accept-edits",
            Self::Bypass => "bypass",
        }
    }

    /// Whether the mode lets `tool` run where the policy's default would
    /// ask (or deny).
    pub fn allows_by_default(self, tool: &str) -> bool {
        match self {
            Self::AcceptEdits => FILE_WRITING_TOOLS.contains(&tool),
            Self::Bypass => true,
            Self::Default | Self::Plan => false,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mode name that is none of the four.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown mode '{0}' (default, plan, accept-edits or bypass)")]
pub struct UnknownMode(pub String);

impl FromStr for Mode {
    type Err = UnknownMode;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|mode| mode.as_str() == text)
            .ok_or_else(|| UnknownMode(text.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back() {
        for mode in Mode::ALL {
            assert_eq!(mode.as_str().parse::<Mode>().unwrap(), mode);
            assert_eq!(serde_json::to_value(mode).unwrap(), mode.as_str());
        }
        assert!("acceptEdits".parse::<Mode>().is_err());
    }
}
