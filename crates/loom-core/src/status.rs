//! Run status and its legal transitions (docs/architecture.md, run status).

use serde::{Deserialize, Serialize};

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RunStatus {
    /// Accepted, not started.
    #[default]
    Queued,
    /// The loop is working.
    Running,
    /// Waiting for a person to answer a permission request.
    WaitingPermission,
    /// Finished with an answer.
    Done,
    /// Ended by an error.
    Error,
    /// Cancelled from outside.
    Canceled,
    /// A run or step deadline passed.
    Timeout,
    /// The process running it died; it can resume.
    Interrupted,
}

/// A transition that docs/architecture.md does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("INVALID_STATE: a run cannot go from {from:?} to {to:?}")]
pub struct InvalidTransition {
    /// The current status.
    pub from: RunStatus,
    /// The requested status.
    pub to: RunStatus,
}

impl RunStatus {
    /// The wire name (`DONE`, `WAITING_PERMISSION`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "QUEUED",
            Self::Running => "RUNNING",
            Self::WaitingPermission => "WAITING_PERMISSION",
            Self::Done => "DONE",
            Self::Error => "ERROR",
            Self::Canceled => "CANCELED",
            Self::Timeout => "TIMEOUT",
            Self::Interrupted => "INTERRUPTED",
        }
    }

    /// Whether the status can never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Done | Self::Error | Self::Canceled | Self::Timeout)
    }

    /// Moves to `to` if docs/architecture.md allows it.
    pub fn transition(self, to: RunStatus) -> Result<RunStatus, InvalidTransition> {
        use RunStatus::*;
        let allowed = match (self, to) {
            (from, _) if from.is_terminal() => false,
            (Queued, Running) => true,
            (Running, WaitingPermission) | (WaitingPermission, Running) => true,
            // A run whose process died, whether or not it had started.
            (Queued | Running | WaitingPermission, Interrupted) => true,
            (Interrupted, Running) => true,
            (Queued | Running | WaitingPermission | Interrupted, Canceled) => true,
            (Running | WaitingPermission, Done | Error | Timeout) => true,
            (Queued | Interrupted, Error) => true,
            _ => false,
        };
        if allowed {
            Ok(to)
        } else {
            Err(InvalidTransition { from: self, to })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RunStatus::*;

    #[test]
    fn terminal_states_never_change() {
        for terminal in [Done, Error, Canceled, Timeout] {
            for to in [Queued, Running, Done, Error, Canceled, Timeout, Interrupted] {
                assert!(terminal.transition(to).is_err());
            }
        }
    }

    #[test]
    fn normal_life_and_illegal_jumps() {
        assert_eq!(Queued.transition(Running), Ok(Running));
        assert_eq!(Running.transition(WaitingPermission), Ok(WaitingPermission));
        assert_eq!(WaitingPermission.transition(Running), Ok(Running));
        assert_eq!(Interrupted.transition(Running), Ok(Running));
        assert_eq!(Queued.transition(Interrupted), Ok(Interrupted));
        assert!(Interrupted.transition(Interrupted).is_err());
        assert!(Queued.transition(Done).is_err());
        assert!(Running.transition(Queued).is_err());
        assert_eq!(
            serde_json::to_string(&WaitingPermission).unwrap(),
            "\"WAITING_PERMISSION\""
        );
    }
}
