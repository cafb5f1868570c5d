//! How `loom` ends: its exit codes (docs/cli.md) and why a command could
//! not do its job.

use loom::{RunOutcome, RunStatus, StopReason};

pub(crate) const ERROR: u8 = 1;
pub(crate) const USAGE: u8 = 2;
pub(crate) const NO_ANSWER: u8 = 3;
pub(crate) const TIMEOUT: u8 = 4;
pub(crate) const CANCELLED: u8 = 130;
/// The output was closed (as a process killed by SIGPIPE would end).
pub(crate) const OUTPUT_CLOSED: u8 = 141;

/// Why a command could not do its job.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Bad flags, config or script: one line, exit code 2.
    Usage(anyhow::Error),
    /// Anything else: exit code 1.
    Runtime(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(err: anyhow::Error) -> Self {
        Self::Runtime(err)
    }
}

/// The exit code of a run that ended with `outcome`.
pub(crate) fn for_outcome(outcome: &RunOutcome) -> u8 {
    match (outcome.status, &outcome.stop_reason) {
        (RunStatus::Done, _) => 0,
        (RunStatus::Canceled, _) => CANCELLED,
        (RunStatus::Timeout, _) => TIMEOUT,
        (RunStatus::Interrupted, _) => OUTPUT_CLOSED,
        (_, Some(StopReason::MaxStepsWithoutAnswer)) => NO_ANSWER,
        _ => ERROR,
    }
}
