//! [`RunState`]: everything a run is between two steps of its driver, as
//! one serializable value. A checkpoint writes it (with the messages the
//! turn added); resume reads it back.

use serde::{Deserialize, Serialize};

use crate::feedback::{RecursionMonitor, Stop, MAX_ITERATIONS_MESSAGE};
use crate::message::Message;
use crate::metrics::RunMetrics;
use crate::outcome::StopReason;
use crate::turn_state::TurnState;

use super::guidance::{GuidancePart, FINAL_ANSWER_SUFFIX};
use super::untouched::NamedFiles;

/// A run's whole state except its history (which a store keeps as
/// messages, appended turn by turn) and its metrics (kept in their own
/// column, read back with [`RunState::with_metrics`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    /// The current turn: the immutable chain, each turn linked to
    /// the one before.
    pub(crate) turn: TurnState,
    /// Steps completed: turns whose tool calls ran.
    pub(crate) steps: u32,
    /// Whether tools are still offered (stored as `mode`, its name in
    /// checkpoints written before it had this one).
    #[serde(rename = "mode")]
    pub(crate) next_call: NextCall,
    /// Where the current turn stands.
    pub(crate) phase: TurnPhase,
    /// What the recursion monitor has seen.
    pub(crate) monitor: RecursionMonitor,
    /// Guidance for the next model request only.
    pub(crate) guidance: Vec<GuidancePart>,
    /// Whether the history was compressed in the current turn.
    pub(crate) compacted: bool,
    /// Whether the context warning was given since the last compression.
    pub(crate) context_warned: bool,
    /// The user's request (task handlers are chosen by it).
    pub(crate) task: String,
    /// How many times stop hooks sent the run back (bounded by
    /// `max_stop_refusals`; kept, so a resumed run does not start over).
    #[serde(default)]
    pub(crate) stop_refusals: u32,
    /// Whether an answer that only repeated an error was sent back (once a run).
    #[serde(default)]
    pub(crate) echo_sent_back: bool,
    /// Whether the run called a tool that may change something (one not
    /// read-only), successfully or not.
    #[serde(default)]
    pub(crate) may_have_changed: bool,
    /// Whether the last step called a tool that may change something and
    /// every call of it succeeded: an empty answer right after it ends the
    /// run as done ([`super::answer`]).
    #[serde(default)]
    pub(crate) last_step_changed: bool,
    /// Whether an answer that described the work without doing it was sent back (once a run).
    #[serde(default)]
    pub(crate) described_sent_back: bool,
    /// The files the task names, as found when the run began (an answer
    /// given without touching them is sent back, [`super::untouched`]).
    #[serde(default, skip_serializing_if = "NamedFiles::is_empty")]
    pub(crate) named_files: NamedFiles,
    /// How many of those files no call had touched when an answer was last
    /// sent back for them: one is sent back again only after the model
    /// touched one more (so at most once per file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) untouched_left: Option<usize>,
    /// How long the history was (system prompt included) as of each step:
    /// step 0 before the run's prompt, step N after its tool results —
    /// what a rewind or a fork keeps of the conversation. Cleared when the
    /// history is compressed, as those lengths then mean nothing.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub(crate) conversation_at: std::collections::BTreeMap<u32, usize>,
    #[serde(skip)]
    pub(crate) metrics: RunMetrics,
}

/// What the run's next model call is: one that offers tools, or the last
/// one, for the answer. (Not a permission mode: that is
/// [`crate::permission::Mode`].)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NextCall {
    /// Tools are offered.
    Working,
    /// One last call without tools, for the answer.
    FinalAnswer(FinalAnswer),
}

/// Why a run's last call offers no tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinalAnswer {
    /// The step limit was reached.
    MaxSteps,
    /// The recursion monitor ended the tool phase.
    Monitor(Stop),
}

impl FinalAnswer {
    /// As named in events: `max_steps`, or the monitor's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MaxSteps => "max_steps",
            Self::Monitor(stop) => stop.termination.reason(),
        }
    }

    /// Why, as a guidance reason.
    pub(crate) fn guidance_reason(&self) -> crate::feedback::GuidanceReason {
        match self {
            Self::MaxSteps => crate::feedback::GuidanceReason::MaxSteps,
            Self::Monitor(stop) => stop.termination.guidance_reason(),
        }
    }

    /// The instruction of a final-answer call.
    pub(crate) fn guidance(&self) -> GuidancePart {
        GuidancePart::new(
            self.guidance_reason(),
            format!("{}\n{FINAL_ANSWER_SUFFIX}", self.message()),
        )
    }

    /// What the model is told (docs/context.md).
    pub(crate) fn message(&self) -> &'static str {
        match self {
            Self::MaxSteps => MAX_ITERATIONS_MESSAGE,
            Self::Monitor(stop) => stop.termination.message(),
        }
    }

    /// Why the run stops when the last call gives no answer either.
    pub(crate) fn stop_reason(self) -> StopReason {
        match self {
            Self::MaxSteps => StopReason::MaxStepsWithoutAnswer,
            Self::Monitor(stop) => StopReason::Monitor(stop),
        }
    }
}

/// Where a turn stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnPhase {
    /// Between turns: the next one has not begun.
    Boundary,
    /// The model is being asked (perhaps again: a continued or retried answer).
    Answering(Answering),
    /// The model's calls are the last message of the history; their
    /// results are awaited.
    Tools,
    /// The model answered without calls; the turn ends with this answer
    /// unless a person steered meanwhile.
    Answered(String),
    /// The run is over.
    Ended(Ending),
}

/// An answer in the making.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Answering {
    /// What an answer cut off by the output limit said so far.
    pub(crate) so_far: String,
    /// Continuations asked for.
    pub(crate) continued: u32,
    /// Whether an empty answer was retried already.
    pub(crate) nudged: bool,
    /// Guidance for the next call of this turn only.
    pub(crate) extra: Option<GuidancePart>,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// The model's answer.
    Answer(String),
    /// No answer, and why.
    Stopped(StopReason),
}

impl RunState {
    /// A run about to begin its first turn (`turn`) for `task`.
    pub fn new(turn: TurnState, task: impl Into<String>) -> Self {
        Self {
            turn,
            steps: 0,
            next_call: NextCall::Working,
            phase: TurnPhase::Boundary,
            monitor: RecursionMonitor::default(),
            guidance: Vec::new(),
            compacted: false,
            context_warned: false,
            task: task.into(),
            stop_refusals: 0,
            echo_sent_back: false,
            described_sent_back: false,
            named_files: NamedFiles::default(),
            untouched_left: None,
            may_have_changed: false,
            last_step_changed: false,
            conversation_at: std::collections::BTreeMap::new(),
            metrics: RunMetrics::default(),
        }
    }

    /// Reads a stored state. A checkpoint written before states were
    /// stored whole holds only the turn: the steps are then counted from
    /// `messages`, and a monitor verdict is read from the turn's metadata.
    pub fn from_json(text: &str, messages: &[Message]) -> Result<Self, serde_json::Error> {
        match serde_json::from_str::<Self>(text) {
            Ok(state) => Ok(state),
            Err(err) => match serde_json::from_str::<TurnState>(text) {
                Ok(turn) => Ok(Self::from_turn(turn, messages)),
                Err(_) => Err(err),
            },
        }
    }

    /// The state of a run stored as its turn alone (older checkpoints).
    fn from_turn(turn: TurnState, messages: &[Message]) -> Self {
        let dangling = !crate::history::dangling_calls(messages).is_empty();
        let with_calls = messages.iter().filter(|m| !m.tool_calls().is_empty()).count();
        let verdict = turn
            .metadata()
            .get("loom.terminate")
            .and_then(|verdict| serde_json::from_value::<Stop>(rename_reason(verdict.clone())).ok());
        let mut state = Self::new(turn, String::new());
        state.steps = with_calls.saturating_sub(usize::from(dangling)) as u32;
        if let Some(stop) = verdict {
            state.next_call = NextCall::FinalAnswer(FinalAnswer::Monitor(stop));
        }
        state
    }

    /// The same state with the run's metrics (stored beside it).
    pub fn with_metrics(mut self, metrics: RunMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The current turn.
    pub fn turn(&self) -> &TurnState {
        &self.turn
    }

    /// Steps completed (turns whose tool calls ran).
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// How many messages of the stored history (its system prompt
    /// included) make the conversation as of `step`: step 0 ends before
    /// the run's prompt, step N after the tool results of step N. `None`
    /// when the history was compressed since (or the step is unknown).
    pub fn conversation_at(&self, step: u32) -> Option<usize> {
        self.conversation_at.get(&step).copied()
    }

    /// Whether tools are still offered.
    pub fn next_call(&self) -> &NextCall {
        &self.next_call
    }

    /// Where the current turn stands.
    pub fn phase(&self) -> &TurnPhase {
        &self.phase
    }

    /// The run's metrics.
    pub fn metrics(&self) -> &RunMetrics {
        &self.metrics
    }
}

/// Older checkpoints wrote the monitor's verdict as `{reason, detail}`.
fn rename_reason(mut verdict: serde_json::Value) -> serde_json::Value {
    if let Some(object) = verdict.as_object_mut() {
        if let Some(reason) = object.remove("reason") {
            object.insert("termination".into(), reason);
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;
    use serde_json::json;

    #[test]
    fn a_state_survives_a_round_trip() {
        let mut state = RunState::new(TurnState::initial(10).next_turn(false), "task");
        state.steps = 1;
        state.next_call = NextCall::FinalAnswer(FinalAnswer::MaxSteps);
        state.phase = TurnPhase::Ended(Ending::Stopped(StopReason::Cancelled("stop".into())));
        // What the answer rules remember, so a resumed run sends nothing back twice.
        state.echo_sent_back = true;
        state.described_sent_back = true;
        state.may_have_changed = true;
        state.last_step_changed = true;
        state.untouched_left = Some(1);
        state.named_files.existing = vec!["calc.py".into()];
        state.named_files.missing = vec!["SUMMARY.md".into()];
        let text = serde_json::to_string(&state).unwrap();
        assert_eq!(RunState::from_json(&text, &[]).unwrap(), state);
    }

    #[test]
    fn a_checkpoint_from_before_the_answer_rules_reads_as_nothing_sent_back() {
        let mut value = serde_json::to_value(RunState::new(TurnState::initial(10), "task")).unwrap();
        let object = value.as_object_mut().unwrap();
        for field in [
            "echo_sent_back",
            "described_sent_back",
            "may_have_changed",
            "last_step_changed",
            "untouched_left",
            "named_files",
        ] {
            object.remove(field);
        }
        let state = RunState::from_json(&value.to_string(), &[]).unwrap();
        assert!(!state.echo_sent_back && !state.described_sent_back && state.untouched_left.is_none());
        assert!(state.named_files.is_empty());
    }

    #[test]
    fn an_older_checkpoint_of_the_turn_alone_is_read() {
        let turn = TurnState::initial(10).next_turn(false).with_metadata(
            "loom.terminate",
            json!({"reason": "loop_detected", "detail": "the same 2 turns repeated back to back"}),
        );
        let call = |id: &str| ToolCall {
            id: id.into(),
            name: "read_file".into(),
            arguments: json!({}),
        };
        let messages = vec![
            Message::user("q"),
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![call("a")],
            },
            Message::tool("a", "read_file", "x"),
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![call("b")],
            },
        ];
        let state = RunState::from_json(&serde_json::to_string(&turn).unwrap(), &messages).unwrap();
        assert_eq!(state.turn(), &turn);
        assert_eq!(state.steps(), 1, "the dangling turn is not a step yet");
        assert!(
            matches!(state.next_call(), NextCall::FinalAnswer(FinalAnswer::Monitor(stop)) if stop.termination.reason() == "loop_detected")
        );
    }
}
