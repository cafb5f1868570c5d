//! The model's answer, checked: an answer cut off by the output limit is
//! continued (up to `max_continuations` times, each with a `warning`), a
//! filtered one ends the run (`CONTENT_FILTERED`), and an empty one is
//! retried once with a nudge, then ends the run (`EMPTY_ANSWER`) — except
//! on a final-answer call, whose emptiness means "no answer", and right
//! after a step whose changes all succeeded, where it means "done". An answer
//! that only repeats an error is sent back once ([`super::echo`]), and so
//! is one that describes the work without using a tool ([`super::described`]),
//! and one given without touching the files the task names ([`super::untouched`]).

use crate::event::EventKind;
use crate::feedback::GuidanceReason;
use crate::llm::FinishReason;
use crate::message::Message;
use crate::outcome::{ErrorCode, StopReason, WarningCode};

use super::described::{describes_work, DESCRIBED_WORK_NUDGE};
use super::echo::{echoes_an_error, ERROR_ECHO_NUDGE};
use super::guidance::{with_task, GuidancePart, CONTINUE_ANSWER, EMPTY_ANSWER_NUDGE};
use super::state::{Ending, NextCall, TurnPhase};
use super::untouched::{untouched, untouched_files_nudge};
use super::{Answer, TurnMachine};

impl TurnMachine {
    /// The model answered the call the machine asked for.
    pub(crate) fn answered(&mut self, mut answer: Answer) {
        let done_with_changes = self.state.next_call == NextCall::Working && self.done_with_changes();
        let TurnPhase::Answering(answering) = &mut self.state.phase else {
            return;
        };
        let final_answer = matches!(self.state.next_call, NextCall::FinalAnswer(_));
        let max_continuations = self.settings.max_continuations;
        let cut_off = answer.finish == Some(FinishReason::Length);
        let has_text = !answer.content.trim().is_empty();
        if cut_off && has_text && answer.tool_calls.is_empty() && answering.continued < max_continuations {
            answering.continued += 1;
            let continued = answering.continued;
            // What the answer said so far is the last message, so the model
            // sees it (one message: a chat template may insist that turns
            // alternate). It leaves the history on every way out: the whole
            // answer is stored once, or nothing.
            let had_partial = is_partial(self.memory.messages(), &answering.so_far);
            answering.so_far.push_str(&answer.content);
            answering.extra = Some(GuidancePart::new(GuidanceReason::ContinueAnswer, CONTINUE_ANSWER));
            let so_far = answering.so_far.clone();
            if had_partial {
                self.memory.pop();
            }
            self.memory.push(Message::assistant(so_far));
            self.warn(
                WarningCode::OutputLimit,
                format!(
                    "the answer reached the model's output token limit (finish reason: length); asking the model to continue ({continued} of at most {max_continuations})"
                ),
            );
            return;
        }
        if answer.finish == Some(FinishReason::ContentFilter) {
            self.stop(StopReason::error(
                ErrorCode::ContentFiltered,
                "the provider's content filter stopped the model's answer (finish reason: content_filter, or an Anthropic refusal); what streamed before it is not kept",
            ));
            return;
        }
        let so_far_empty = answering.so_far.is_empty();
        if !so_far_empty {
            answer.content = format!("{}{}", answering.so_far, answer.content);
        }
        let empty = answer.content.trim().is_empty() && answer.tool_calls.is_empty();
        let nudged = answering.nudged;
        if empty && !cut_off && done_with_changes {
            // An agent that stops talking right after its changes succeeded
            // has finished (Codex and Claude Code end a turn on any answer
            // without calls); asked again with the task, a small model
            // redoes the work it has done.
            self.warn(
                WarningCode::EmptyAnswer,
                "the model answered with nothing right after its changes succeeded; taken as the end of the task"
                    .to_string(),
            );
            self.leave_answering();
            self.memory.push(Message::assistant(String::new()));
            self.state.phase = TurnPhase::Answered(String::new());
            return;
        }
        if empty && !final_answer && !nudged {
            answering.nudged = true;
            answering.extra = Some(GuidancePart::new(
                GuidanceReason::EmptyAnswer,
                with_task(EMPTY_ANSWER_NUDGE, &self.state.task),
            ));
        }
        if cut_off && (has_text || !so_far_empty) {
            self.warn(
                WarningCode::OutputLimit,
                if answer.tool_calls.is_empty() {
                    "the answer reached the model's output token limit and may be incomplete".to_string()
                } else {
                    "the answer reached the model's output token limit; its last tool call may be cut short".to_string()
                },
            );
        }
        if empty && !final_answer {
            // A model that spent its whole output limit before writing
            // anything (thinking, say) needs a higher limit, not a nudge.
            let why = if cut_off {
                "the model reached its output token limit before writing anything (finish reason: length); raise max_tokens"
            } else {
                "the model answered with nothing (no text, no tool call)"
            };
            if !nudged {
                self.warn(WarningCode::EmptyAnswer, format!("{why}; asking once more"));
            } else {
                self.stop(StopReason::error(ErrorCode::EmptyAnswer, format!("{why}, twice")));
            }
            return;
        }
        self.leave_answering();
        let working = self.state.next_call == NextCall::Working;
        // The retries below are guidance: off with the feedback.
        let working = working && self.settings.feedback;
        if working && answer.tool_calls.is_empty() && self.settings.tools_offered {
            let (unread, unwritten) = self.untouched_named_files();
            let left = unread.len() + unwritten.len();
            // Again only after the model touched one more of them: a model
            // that keeps an answer without touching a file meant it.
            let progressed = self.state.untouched_left.is_none_or(|before| left < before);
            if left > 0 && progressed {
                let nudge = with_task(&untouched_files_nudge(&unread, &unwritten), &self.state.task);
                let files = unread.iter().chain(&unwritten).copied().collect::<Vec<_>>().join(", ");
                self.state.untouched_left = Some(left);
                if let TurnPhase::Answering(answering) = &mut self.state.phase {
                    answering.extra = Some(GuidancePart::new(GuidanceReason::UntouchedFiles, nudge));
                }
                self.warn(
                    WarningCode::UntouchedFiles,
                    format!("the model answered while no tool call touched {files}, which the task names; asking once more, with guidance"),
                );
                return;
            }
        }
        if working
            && answer.tool_calls.is_empty()
            && self.settings.tools_offered
            && !self.state.echo_sent_back
            && echoes_an_error(&answer.content, self.memory.messages())
        {
            self.state.echo_sent_back = true;
            // The same answer is not sent back a second time as work described.
            self.state.described_sent_back |= describes_work(&answer.content);
            let nudge = with_task(ERROR_ECHO_NUDGE, &self.state.task);
            if let TurnPhase::Answering(answering) = &mut self.state.phase {
                answering.extra = Some(GuidancePart::new(GuidanceReason::ErrorEcho, nudge));
            }
            self.warn(
                WarningCode::ErrorEcho,
                "the model's answer stops at an error; asking once more, with guidance".to_string(),
            );
            return;
        }
        if working
            && answer.tool_calls.is_empty()
            && !self.state.may_have_changed
            && self.settings.changing_tools_offered
            && !self.state.described_sent_back
            && describes_work(&answer.content)
        {
            self.state.described_sent_back = true;
            let nudge = with_task(DESCRIBED_WORK_NUDGE, &self.state.task);
            if let TurnPhase::Answering(answering) = &mut self.state.phase {
                answering.extra = Some(GuidancePart::new(GuidanceReason::DescribedWork, nudge));
            }
            self.warn(
                WarningCode::DescribedWork,
                "the model described the work (code or steps) without doing it with a tool; asking once more, with guidance"
                    .to_string(),
            );
            return;
        }
        match self.state.next_call.clone() {
            NextCall::FinalAnswer(why) => {
                if answer.content.trim().is_empty() {
                    self.stop(why.stop_reason());
                } else {
                    self.memory.push(Message::assistant(answer.content.clone()));
                    self.end(Ending::Answer(answer.content));
                }
            }
            NextCall::Working if answer.tool_calls.is_empty() => {
                self.memory.push(Message::assistant(answer.content.clone()));
                self.state.phase = TurnPhase::Answered(answer.content);
            }
            NextCall::Working => {
                self.note(EventKind::tool_calls_start(&answer.tool_calls));
                self.state.named_files.touched_by(&answer.tool_calls);
                // The calls are saved before any of them runs, so a crash
                // mid-tools leaves the calls (and the journal) to resume from.
                self.memory.push(Message::Assistant {
                    content: answer.content,
                    tool_calls: answer.tool_calls,
                });
                self.state.phase = TurnPhase::Tools;
                self.save_due = true;
            }
        }
    }

    /// The files the task names that no call has touched: those that
    /// existed when the run began, and those it may make (asked of an agent
    /// that can write only).
    fn untouched_named_files(&self) -> (Vec<&str>, Vec<&str>) {
        let named = &self.state.named_files;
        let unread = untouched(&named.existing, self.memory.messages());
        let unwritten = if self.settings.changing_tools_offered {
            untouched(&named.missing, self.memory.messages())
        } else {
            Vec::new()
        };
        (unread, unwritten)
    }

    /// Whether the last step's changes all succeeded and left no file the
    /// task names untouched.
    fn done_with_changes(&self) -> bool {
        self.state.last_step_changed && {
            let (unread, unwritten) = self.untouched_named_files();
            unread.is_empty() && unwritten.is_empty()
        }
    }

    /// Takes an answer in the making back out of the history.
    pub(super) fn leave_answering(&mut self) {
        if let TurnPhase::Answering(answering) = &mut self.state.phase {
            if is_partial(self.memory.messages(), &answering.so_far) {
                self.memory.pop();
            }
            answering.so_far.clear();
        }
    }
}

/// Whether the last message is the answer so far of a continued answer.
fn is_partial(messages: &[Message], so_far: &str) -> bool {
    !so_far.is_empty()
        && matches!(
            messages.last(),
            Some(Message::Assistant { content, tool_calls }) if content == so_far && tool_calls.is_empty()
        )
}
