//! How a run ends: its outcome, and why it stopped.

use crate::budget::BudgetKind;
pub use crate::codes::{ErrorCode, WarningCode};
use crate::feedback::Stop;
use crate::message::Message;
use crate::metrics::RunMetrics;
use crate::status::RunStatus;

/// Which deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeoutKind {
    /// The whole run's limit.
    Run,
    /// One turn's limit.
    Step,
}

/// Why a run ended without an answer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// Cancelled from outside (why, as given to the cancel).
    Cancelled(String),
    /// A deadline passed.
    Timeout(TimeoutKind),
    /// The step limit was reached and the final call gave no answer either.
    MaxStepsWithoutAnswer,
    /// The recursion monitor ended the tool phase (repetition, a loop, too
    /// many errors) and the final call gave no answer either.
    Monitor(Stop),
    /// A budget was used up (`BUDGET_EXHAUSTED`).
    BudgetExhausted(BudgetKind),
    /// The process is going away (SIGTERM, SIGHUP, its output closed): the
    /// run stopped and stays resumable (`INTERRUPTED`).
    Interrupted(String),
    /// A fatal error (the model failed, the store failed, …).
    Error {
        /// Machine-readable code.
        code: ErrorCode,
        /// What happened.
        message: String,
    },
}

impl StopReason {
    /// A fatal error.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::Error {
            code,
            message: message.into(),
        }
    }

    /// The status a run ends with for this reason.
    pub fn status(&self) -> RunStatus {
        match self {
            Self::Cancelled(_) => RunStatus::Canceled,
            Self::Timeout(_) => RunStatus::Timeout,
            Self::Interrupted(_) => RunStatus::Interrupted,
            Self::MaxStepsWithoutAnswer | Self::Monitor(_) | Self::BudgetExhausted(_) | Self::Error { .. } => {
                RunStatus::Error
            }
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The run's id.
    pub run_id: String,
    /// Its final status.
    pub status: RunStatus,
    /// The final answer, when there is one.
    pub content: Option<String>,
    /// Why it ended without an answer, when it did.
    pub stop_reason: Option<StopReason>,
    /// Turns used.
    pub turns: u32,
    /// What it did.
    pub metrics: RunMetrics,
    /// The full transcript, valid to send to any provider.
    pub messages: Vec<Message>,
}
