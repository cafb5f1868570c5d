//! The turn machine: a run's whole state and the decision of what happens
//! next, without IO — no model, no tools, no store, no clock, no channels.
//!
//! The driver (`engine`) asks `TurnMachine::next` what to do, does it (a
//! model call, the tool pipeline, a checkpoint) and reports the result
//! back; the machine updates its state and queues the events that explain
//! the change, which the driver emits. Because the machine owns nothing
//! but data, its state ([`RunState`] plus the history) is what a
//! checkpoint saves and what resume loads. See docs/architecture.md.

mod answer;
mod described;
mod echo;
mod guidance;
mod state;
mod untouched;

use std::sync::Arc;

use crate::event::{EventKind, TurnIds};
use crate::feedback::{GuidanceReason, MonitorConfig, TaskHandler};
use crate::memory::Memory;
use crate::message::{Message, ToolCall};
use crate::metrics::RunMetrics;
use crate::outcome::{StopReason, WarningCode};
use crate::tool_result::{ToolResult, ToolStatus};

pub(crate) use guidance::{block as guidance_block, GuidancePart};
pub use state::{Answering, Ending, FinalAnswer, NextCall, RunState, TurnPhase};
pub use untouched::NamedFiles;
pub(crate) use untouched::{candidates as named_file_candidates, may_be_made, MAX_NAMED_FILES};

/// What the driver must do next.
#[derive(Debug)]
pub(crate) enum Next {
    /// A turn begins: check for a cancel, the run's deadline and a pause,
    /// then [`TurnMachine::begin_turn`] (or [`TurnMachine::stop`]).
    BeginTurn,
    /// Call the model, then [`TurnMachine::answered`].
    CallModel(ModelCall),
    /// Run these calls (the last message's calls without results), then
    /// [`TurnMachine::tools_returned`].
    RunTools(Vec<ToolCall>),
    /// The model answered without calls: read the steering, then
    /// [`TurnMachine::end_turn`].
    EndTurn,
    /// Save the state and the unsaved history, then [`TurnMachine::saved`].
    Checkpoint,
    /// The run is over with this answer.
    Finish(String),
    /// The run is over without an answer.
    Stop(StopReason),
}

/// A model call the machine asks for.
#[derive(Debug)]
pub(crate) struct ModelCall {
    /// Whether tools are offered.
    pub tools: bool,
    /// Why not, on a final-answer call (for `llm.start`).
    pub final_answer: Option<&'static str>,
    /// Guidance for this request only, each part announced by the driver.
    pub guidance: Vec<GuidancePart>,
    /// The answer must call a tool: the retry of an answer sent back for
    /// work not done ([`GuidanceReason::asks_for_action`]).
    pub must_call: bool,
}

/// A model's complete answer, as the machine reads it.
#[derive(Debug, Default)]
pub(crate) struct Answer {
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    pub finish: Option<crate::llm::FinishReason>,
}

/// What the driver saw when a turn's work ended.
#[derive(Debug, Default)]
pub(crate) struct TurnEnd {
    /// The run must stop (cancel, deadline, interrupt).
    pub stop: Option<StopReason>,
    /// Messages a person sent meanwhile.
    pub steering: Vec<String>,
    /// Seconds since the run began.
    pub elapsed_seconds: f64,
}

/// The agent's settings the machine decides by.
#[derive(Clone)]
pub(crate) struct Settings {
    /// How many times an answer cut off by the output limit is continued.
    pub max_continuations: u32,
    /// Whether feedback and the monitor's warnings are written.
    pub feedback: bool,
    pub task_handlers: Arc<[Arc<dyn TaskHandler>]>,
    pub monitor: MonitorConfig,
    /// Whether the agent has tools (an answer that stops at an error is
    /// sent back only then).
    pub tools_offered: bool,
    /// Whether it has a tool that may change something: one not read-only,
    /// other than `task` (an answer that describes the work without doing
    /// it is sent back only then; plan mode and a read-only sub-agent have
    /// none).
    pub changing_tools_offered: bool,
    /// The tools that only look (a turn that calls only these has changed
    /// nothing; a tool not named here may have).
    pub read_only_tools: Arc<[String]>,
}

/// A run's state with its history, and the rules that move it.
pub(crate) struct TurnMachine {
    state: RunState,
    memory: Memory,
    settings: Settings,
    /// Ids of the current turn, for its events.
    ids: TurnIds,
    /// Events explaining the last change, for the driver to emit.
    outbox: Vec<(TurnIds, EventKind)>,
    /// A checkpoint is due before anything else.
    save_due: bool,
    /// The turn that just ended, until the checkpoint of the tail call is
    /// written: a run that cannot save it ends as of that turn.
    ended_turn: Option<crate::turn_state::TurnState>,
}

impl TurnMachine {
    /// A machine at `state` with `memory` as its history.
    pub(crate) fn new(mut state: RunState, memory: Memory, settings: Settings) -> Self {
        state.monitor = std::mem::take(&mut state.monitor).with_config(settings.monitor.clone());
        let ids = TurnIds::of(&state.turn);
        Self {
            state,
            memory,
            settings,
            ids,
            outbox: Vec::new(),
            save_due: false,
            ended_turn: None,
        }
    }

    /// Re-enters a stored run where it stopped. The history decides where
    /// the turn stands: calls without results are run (or settled from the
    /// journal) and announced again for whoever follows the resumed run; a
    /// saved answer is where the turn ends ([`Next::EndTurn`]); otherwise
    /// the next turn begins.
    pub(crate) fn resume(state: RunState, memory: Memory, settings: Settings) -> Self {
        let mut machine = Self::new(state, memory, settings);
        let dangling = crate::history::dangling_calls(machine.memory.messages());
        machine.state.phase = if !dangling.is_empty() {
            machine.note(EventKind::tool_calls_start(&dangling));
            TurnPhase::Tools
        } else {
            match machine.memory.messages().last() {
                // The answer was saved but the run did not end with it (the
                // end was not recorded, or the run was stopped while its
                // stop hooks judged it): it ends as any answer does, the
                // stop hooks asked (again).
                Some(Message::Assistant { content, tool_calls })
                    if tool_calls.is_empty() && !content.trim().is_empty() =>
                {
                    TurnPhase::Answered(content.clone())
                }
                _ => TurnPhase::Boundary,
            }
        };
        machine
    }

    /// What the driver must do next.
    pub(crate) fn next(&mut self) -> Next {
        if self.save_due {
            return Next::Checkpoint;
        }
        match &mut self.state.phase {
            TurnPhase::Boundary => Next::BeginTurn,
            TurnPhase::Answering(answering) => {
                let mut guidance = std::mem::take(&mut self.state.guidance);
                let sent_back = answering
                    .extra
                    .as_ref()
                    .is_some_and(|part| part.reason.asks_for_action());
                guidance.extend(answering.extra.take());
                let final_answer = match &self.state.next_call {
                    NextCall::Working => None,
                    NextCall::FinalAnswer(why) => Some(why.reason()),
                };
                Next::CallModel(ModelCall {
                    tools: final_answer.is_none(),
                    final_answer,
                    guidance,
                    must_call: sent_back && final_answer.is_none(),
                })
            }
            TurnPhase::Tools => Next::RunTools(crate::history::dangling_calls(self.memory.messages())),
            TurnPhase::Answered(_) => Next::EndTurn,
            TurnPhase::Ended(Ending::Answer(content)) => Next::Finish(content.clone()),
            TurnPhase::Ended(Ending::Stopped(reason)) => Next::Stop(reason.clone()),
        }
    }

    /// The events explaining the last changes, oldest first.
    pub(crate) fn take_events(&mut self) -> std::vec::Drain<'_, (TurnIds, EventKind)> {
        self.outbox.drain(..)
    }

    /// A turn begins: at the step limit, or after a verdict of the
    /// monitor, its model call offers no tools.
    pub(crate) fn begin_turn(&mut self) {
        self.state.compacted = false;
        self.state.metrics.iterations += 1;
        self.note(EventKind::IterationStart {
            iteration: self.state.turn.turn_counter(),
        });
        // The hard step limit comes first (one reason, not two).
        if self.state.turn.is_final() {
            self.note(EventKind::MaxIterationsReached {
                turn_counter: self.state.turn.turn_counter(),
                max_iterations: self.state.turn.max_iterations(),
            });
            self.state.next_call = NextCall::FinalAnswer(FinalAnswer::MaxSteps);
        }
        let extra = match &self.state.next_call {
            NextCall::Working => None,
            NextCall::FinalAnswer(why) => Some(why.guidance()),
        };
        self.state.phase = TurnPhase::Answering(Answering {
            extra,
            ..Answering::default()
        });
    }

    /// The run must stop now. Its history stays valid: an answer in the
    /// making is taken back.
    pub(crate) fn stop(&mut self, reason: StopReason) {
        self.leave_answering();
        if let StopReason::Interrupted(why) = &reason {
            self.warn(
                WarningCode::Interrupted,
                format!("{why}: the run stopped and can be resumed from its last checkpoint"),
            );
        }
        self.end(Ending::Stopped(reason));
    }

    /// A run that could not even start (its record or its conversation
    /// could not be loaded): over, with nothing to save.
    pub(crate) fn fail_to_start(&mut self, reason: StopReason) {
        self.state.phase = TurnPhase::Ended(Ending::Stopped(reason));
    }

    /// The turn's work is over without calls; steering decides whether
    /// the run ends with the answer or a person's message gets a turn.
    pub(crate) fn end_turn(&mut self, end: TurnEnd) {
        let TurnPhase::Answered(content) = std::mem::replace(&mut self.state.phase, TurnPhase::Boundary) else {
            return;
        };
        if end.steering.is_empty() {
            self.end(Ending::Answer(content));
            return;
        }
        self.memory.extend(end.steering.into_iter().map(Message::user));
        self.recurse();
    }

    /// The turn's calls returned, one result each in call order: the
    /// results join the history, the step is counted, the monitor and the
    /// feedback look at them, and the next turn follows — unless the run
    /// must stop.
    /// `calls` are those of [`Next::RunTools`].
    pub(crate) fn tools_returned(&mut self, calls: &[ToolCall], results: Vec<ToolResult>, end: TurnEnd) {
        let content = match self.memory.messages().last() {
            Some(Message::Assistant { content, .. }) => content.clone(),
            _ => String::new(),
        };
        let tool_messages = results
            .iter()
            .map(|result| Message::tool(&result.call_id, &result.name, &result.content));
        // A person's message is no change the model answers by saying nothing.
        if !end.steering.is_empty() {
            self.state.last_step_changed = false;
        }
        if let Some(reason) = end.stop {
            // An interrupted turn leaves its calls as a crash would: the
            // resumed run settles them from the journal (a call that never
            // started runs then), so nothing is lost or repeated.
            if !matches!(reason, StopReason::Interrupted(_)) {
                self.memory.extend(tool_messages);
            }
            self.stop(reason);
            return;
        }
        self.memory.extend(tool_messages);
        self.state.steps += 1;
        let changing = calls
            .iter()
            .any(|call| !self.settings.read_only_tools.contains(&call.name));
        self.state.may_have_changed |= changing;
        self.state.last_step_changed =
            changing && end.steering.is_empty() && results.iter().all(|result| result.status == ToolStatus::Success);
        self.state
            .conversation_at
            .insert(self.state.steps, self.memory.messages().len());
        let (counter, max) = (self.state.turn.turn_counter(), self.state.turn.max_iterations());
        self.note(EventKind::StepCompleted {
            step: self.state.steps,
            max_steps: max,
            elapsed_seconds: end.elapsed_seconds,
        });

        // Guidance for the next request only (never stored).
        self.state.monitor.observe(&content, calls, &results);
        let report = self.state.monitor.check(counter + 1, max);
        if self.settings.feedback {
            let warned_of_errors = report
                .warnings
                .iter()
                .any(|(reason, _)| *reason == GuidanceReason::ErrorRateWarning);
            let part = guidance::feedback(&self.settings.task_handlers, &self.state.task, &results, counter + 1)
                .filter(|part| !(warned_of_errors && part.reason == GuidanceReason::Error));
            self.state.guidance.extend(part);
            self.state.guidance.extend(
                report
                    .warnings
                    .into_iter()
                    .map(|(reason, content)| GuidancePart::new(reason, content)),
            );
        }
        self.memory.extend(end.steering.into_iter().map(Message::user));
        let ending_turn = self.ids.clone();
        self.recurse();
        // At the step limit the tools end anyway: the limit says so, and a
        // monitor's stop would only contradict it.
        if let Some(stop) = report.terminate.filter(|_| counter + 1 < max) {
            self.outbox.push((
                ending_turn,
                EventKind::Warning {
                    code: WarningCode::MonitorStop,
                    message: format!(
                        "the recursion monitor ended the tool phase ({}: {}); the model is asked for its final answer without tools",
                        stop.termination.reason(),
                        stop.detail
                    ),
                },
            ));
            self.state.next_call = NextCall::FinalAnswer(FinalAnswer::Monitor(stop));
        }
    }

    /// A checkpoint was written (or failed: the run stops, and a stop in
    /// the middle of a turn is saved once more).
    pub(crate) fn saved(&mut self, written: Result<(), StopReason>) {
        self.save_due = false;
        let ended_turn = self.ended_turn.take();
        let Err(reason) = written else {
            return;
        };
        if let Some(turn) = ended_turn {
            // The tail call was not saved: the run ends as of the turn that
            // ended, and there is nothing more to save.
            self.state.turn = turn;
            self.ids = TurnIds::of(&self.state.turn);
            self.state.phase = TurnPhase::Ended(Ending::Stopped(reason));
            return;
        }
        let mid_turn = !matches!(self.state.phase, TurnPhase::Ended(_));
        self.state.phase = TurnPhase::Ended(Ending::Stopped(reason));
        self.save_due = mid_turn;
    }

    /// Whether a turn is under way (its deadlines apply).
    pub(crate) fn in_turn(&self) -> bool {
        matches!(
            self.state.phase,
            TurnPhase::Answering(_) | TurnPhase::Tools | TurnPhase::Answered(_)
        )
    }

    /// The history was compressed during this turn.
    pub(crate) fn compressed(&mut self) {
        self.state.compacted = true;
        // The steps' places in the history are gone with it.
        self.state.conversation_at.clear();
    }

    /// The run's prompt is about to join the history: what the history
    /// holds now is the conversation as of step 0.
    pub(crate) fn mark_conversation_start(&mut self) {
        self.state.conversation_at.insert(0, self.memory.messages().len());
    }

    /// The state.
    pub(crate) fn state(&self) -> &RunState {
        &self.state
    }

    /// The history.
    pub(crate) fn memory(&self) -> &Memory {
        &self.memory
    }

    /// The history, for the driver's context work (compression) and checkpoints.
    pub(crate) fn memory_mut(&mut self) -> &mut Memory {
        &mut self.memory
    }

    /// The metrics, for what the driver measures (model calls, tools).
    pub(crate) fn metrics_mut(&mut self) -> &mut RunMetrics {
        &mut self.state.metrics
    }

    /// Whether the context warning was given since the last compression.
    pub(crate) fn context_warned_mut(&mut self) -> &mut bool {
        &mut self.state.context_warned
    }

    /// Ids of the current turn.
    pub(crate) fn ids(&self) -> &TurnIds {
        &self.ids
    }

    /// How many times stop hooks sent the run back.
    pub(crate) fn stop_refusals(&self) -> u32 {
        self.state.stop_refusals
    }

    /// Counts one more time stop hooks sent the run back.
    pub(crate) fn count_stop_refusal(&mut self) {
        self.state.stop_refusals += 1;
    }

    /// The answer the run is about to end with, while the driver reads the
    /// steering ([`Next::EndTurn`]).
    pub(crate) fn pending_answer(&self) -> Option<&str> {
        match &self.state.phase {
            TurnPhase::Answered(content) => Some(content),
            _ => None,
        }
    }

    /// The state and the history, once the run is over.
    pub(crate) fn into_parts(self) -> (RunState, Memory) {
        (self.state, self.memory)
    }

    /// Tail call: the next turn, linked to this one.
    fn recurse(&mut self) {
        let next = self.state.turn.next_turn(self.state.compacted);
        self.note(EventKind::Recursion {
            from_turn: self.state.turn.turn_counter(),
            to_turn: next.turn_counter(),
            recursion_depth: next.turn_counter(),
        });
        self.ended_turn = Some(std::mem::replace(&mut self.state.turn, next));
        self.ids = TurnIds::of(&self.state.turn);
        self.state.phase = TurnPhase::Boundary;
        self.save_due = true;
    }

    fn end(&mut self, ending: Ending) {
        self.state.phase = TurnPhase::Ended(ending);
        self.save_due = true;
    }

    fn note(&mut self, kind: EventKind) {
        self.outbox.push((self.ids.clone(), kind));
    }

    fn warn(&mut self, code: WarningCode, message: String) {
        self.note(EventKind::Warning { code, message });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::ErrorCode;
    use crate::tool_result::ToolStatus;
    use crate::turn_state::TurnState;

    fn machine() -> TurnMachine {
        machine_offering(true)
    }

    /// A machine whose agent has a tool that may change something, or only
    /// tools that look.
    fn machine_offering(changing_tools: bool) -> TurnMachine {
        let mut memory = Memory::new(Arc::new(crate::tokens::TiktokenCounter::for_model("gpt-4o")));
        memory.push(Message::system("s"));
        memory.push(Message::user("q"));
        let settings = Settings {
            max_continuations: 3,
            feedback: true,
            task_handlers: Arc::new([]),
            monitor: MonitorConfig::default(),
            tools_offered: true,
            changing_tools_offered: changing_tools,
            read_only_tools: Arc::new([]),
        };
        TurnMachine::new(RunState::new(TurnState::initial(10), "q"), memory, settings)
    }

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "read_file".into(),
            arguments: serde_json::json!({}),
        }
    }

    #[test]
    fn a_tool_turn_asks_for_each_step_and_saves_before_the_calls_and_the_tail_call() {
        let mut m = machine();
        assert!(matches!(m.next(), Next::BeginTurn));
        m.begin_turn();
        let Next::CallModel(request) = m.next() else {
            panic!("expected a model call");
        };
        assert!(request.tools && request.final_answer.is_none());
        m.answered(Answer {
            tool_calls: vec![call("a")],
            ..Answer::default()
        });
        assert!(
            matches!(m.next(), Next::Checkpoint),
            "the calls are saved before they run"
        );
        m.saved(Ok(()));
        let Next::RunTools(calls) = m.next() else {
            panic!("expected the calls");
        };
        assert_eq!(calls, vec![call("a")]);
        let result = ToolResult::new("a", "read_file", ToolStatus::Success, "text");
        m.tools_returned(&calls, vec![result], TurnEnd::default());
        assert_eq!(m.state().steps(), 1);
        assert_eq!(m.state().turn().turn_counter(), 1);
        assert!(matches!(m.next(), Next::Checkpoint), "the tail call is saved");
        m.saved(Ok(()));
        assert!(matches!(m.next(), Next::BeginTurn));
        let names: Vec<&str> = m.take_events().map(|(_, kind)| kind.name()).collect();
        assert_eq!(
            names,
            ["iteration.start", "tool_calls.start", "step.completed", "recursion"]
        );
    }

    /// One step of `call("a")` ending with `status`, then an empty answer.
    fn empty_answer_after_a_step(status: ToolStatus) -> TurnMachine {
        let mut m = machine();
        m.begin_turn();
        m.answered(Answer {
            tool_calls: vec![call("a")],
            ..Answer::default()
        });
        m.saved(Ok(()));
        let result = ToolResult::new("a", "read_file", status, "text");
        m.tools_returned(&[call("a")], vec![result], TurnEnd::default());
        m.saved(Ok(()));
        m.begin_turn();
        m.answered(Answer::default());
        m
    }

    #[test]
    fn an_empty_answer_ends_the_run_only_right_after_changes_that_succeeded() {
        // (No tool is read-only here, so `read_file` counts as a change.)
        let mut m = empty_answer_after_a_step(ToolStatus::Success);
        assert!(matches!(m.next(), Next::EndTurn));
        m.end_turn(TurnEnd::default());
        m.saved(Ok(()));
        assert!(matches!(m.next(), Next::Finish(answer) if answer.is_empty()));

        let mut m = empty_answer_after_a_step(ToolStatus::Error);
        let Next::CallModel(request) = m.next() else {
            panic!("expected the model asked again");
        };
        assert!(request
            .guidance
            .iter()
            .any(|part| part.reason == GuidanceReason::EmptyAnswer));
    }

    #[test]
    fn a_tail_call_that_cannot_be_saved_ends_the_run_as_of_the_turn_that_ended() {
        let mut m = machine();
        m.begin_turn();
        m.answered(Answer {
            content: "hi".into(),
            ..Answer::default()
        });
        assert!(matches!(m.next(), Next::EndTurn));
        m.end_turn(TurnEnd {
            steering: vec!["one more thing".into()],
            ..TurnEnd::default()
        });
        assert_eq!(m.state().turn().turn_counter(), 1);
        assert!(matches!(m.next(), Next::Checkpoint));
        m.saved(Err(StopReason::error(ErrorCode::Store, "disk full")));
        let Next::Stop(StopReason::Error { code, .. }) = m.next() else {
            panic!("expected a stop");
        };
        assert_eq!(code, ErrorCode::Store);
        assert_eq!(m.state().turn().turn_counter(), 0, "the turn that ended");
    }

    #[test]
    fn a_cut_off_answer_is_continued_and_stored_once() {
        let mut m = machine();
        m.begin_turn();
        m.answered(Answer {
            content: "Hello, ".into(),
            finish: Some(crate::llm::FinishReason::Length),
            ..Answer::default()
        });
        let Next::CallModel(request) = m.next() else {
            panic!("expected a continuation");
        };
        assert_eq!(request.guidance[0].reason, GuidanceReason::ContinueAnswer);
        assert!(!request.must_call, "a continuation is text");
        m.answered(Answer {
            content: "world.".into(),
            ..Answer::default()
        });
        m.end_turn(TurnEnd::default());
        assert!(matches!(m.next(), Next::Checkpoint));
        m.saved(Ok(()));
        assert!(matches!(m.next(), Next::Finish(answer) if answer == "Hello, world."));
        let last: Vec<&Message> = m.memory().messages().iter().skip(2).collect();
        assert_eq!(last, [&Message::assistant("Hello, world.")]);
    }

    /// The history gains a `read_file` call of `path` and its result.
    fn read_in_history(m: &mut TurnMachine, path: &str, result: &str) {
        m.memory_mut().push(Message::Assistant {
            content: String::new(),
            tool_calls: vec![crate::message::ToolCall {
                id: "c1".into(),
                name: "read_file".into(),
                arguments: serde_json::json!({ "path": path }),
            }],
        });
        m.memory_mut().push(Message::tool("c1", "read_file", result));
    }

    /// The model answers `text`; the guidance it is sent back with, if any.
    fn sent_back(m: &mut TurnMachine, text: &str) -> Option<GuidanceReason> {
        m.answered(Answer {
            content: text.into(),
            ..Answer::default()
        });
        match m.next() {
            Next::CallModel(request) => Some(request.guidance[0].reason),
            Next::EndTurn => None,
            _ => panic!("expected a model call or the turn's end"),
        }
    }

    const STEPS: &str = "1. Open calc.py.\n2. Change `-` to `+` in add.";

    #[test]
    fn work_described_before_anything_changed_is_sent_back_once() {
        let mut m = machine();
        m.begin_turn();
        assert_eq!(sent_back(&mut m, STEPS), Some(GuidanceReason::DescribedWork));
        assert_eq!(sent_back(&mut m, STEPS), None, "once per run");
        let codes: Vec<String> = m
            .take_events()
            .filter_map(|(_, kind)| match kind {
                EventKind::Warning { code, .. } => Some(code.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(codes, ["DESCRIBED_WORK"]);
    }

    #[test]
    fn an_agent_that_can_only_look_may_answer_with_a_list() {
        let mut m = machine_offering(false);
        m.begin_turn();
        assert_eq!(sent_back(&mut m, STEPS), None, "a plan is plan mode's answer");
    }

    #[test]
    fn an_answer_given_without_touching_the_named_files_is_sent_back_once() {
        let mut m = machine();
        m.state.named_files.existing = vec!["shapes.py".into()];
        m.begin_turn();
        m.answered(Answer {
            content: "get_area".into(),
            ..Answer::default()
        });
        let Next::CallModel(request) = m.next() else {
            panic!("expected the retry");
        };
        assert_eq!(request.guidance[0].reason, GuidanceReason::UntouchedFiles);
        assert!(request.must_call, "the retry must call a tool");
        assert!(
            request.guidance[0].content.contains("`shapes.py`"),
            "{}",
            request.guidance[0].content
        );
        assert_eq!(
            sent_back(&mut m, "get_area"),
            None,
            "the same files: the model meant it"
        );
    }

    #[test]
    fn an_answer_is_sent_back_again_after_the_model_touched_one_more_file() {
        let mut m = machine();
        m.state.named_files.existing = vec!["inventory.py".into()];
        m.state.named_files.missing = vec!["SUMMARY.md".into()];
        m.begin_turn();
        assert_eq!(
            sent_back(&mut m, "It sells things."),
            Some(GuidanceReason::UntouchedFiles)
        );
        read_in_history(&mut m, "inventory.py", "def add_item(): ...");
        assert_eq!(
            sent_back(&mut m, "It sells things."),
            Some(GuidanceReason::UntouchedFiles),
            "SUMMARY.md is still not written"
        );
        assert_eq!(sent_back(&mut m, "It sells things."), None, "no more progress");
    }

    #[test]
    fn a_file_to_write_is_asked_for_only_where_the_agent_can_write() {
        for (can_write, expected) in [(true, Some(GuidanceReason::UntouchedFiles)), (false, None)] {
            let mut m = machine_offering(can_write);
            m.state.named_files.missing = vec!["SUMMARY.md".into()];
            m.begin_turn();
            assert_eq!(
                sent_back(&mut m, "The project sells things."),
                expected,
                "can write: {can_write}"
            );
        }
    }

    #[test]
    fn an_answer_after_a_call_that_named_the_file_is_taken() {
        let mut m = machine();
        m.state.named_files.existing = vec!["shapes.py".into()];
        read_in_history(&mut m, "shapes.py", "def get_area(): ...");
        m.begin_turn();
        assert_eq!(sent_back(&mut m, "get_area"), None);
    }

    #[test]
    fn an_answer_is_sent_back_once_even_when_two_rules_see_it() {
        let mut m = machine();
        m.memory_mut().push(Message::tool(
            "c1",
            "bash",
            "Error: exit code 1 (0.4 s)\n--- stderr ---\nFAILED (failures=1)",
        ));
        m.begin_turn();
        let fix = "Here is the fix:\n```python\ndef add(a, b):\n    return a + b\n```";
        assert_eq!(sent_back(&mut m, fix), Some(GuidanceReason::ErrorEcho));
        assert_eq!(sent_back(&mut m, fix), None, "not again as work described");
    }
}
