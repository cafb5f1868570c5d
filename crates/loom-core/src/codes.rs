//! The codes that name errors and warnings on the wire, each written once.

use crate::wire::wire_enum;

wire_enum! {
    /// The `code` of an `error` event, and of a run that ended `ERROR` or
    /// `TIMEOUT`.
    pub enum ErrorCode {
        /// The run's time limit passed.
        RunTimeout = "RUN_TIMEOUT",
        /// One turn's time limit passed.
        StepTimeout = "STEP_TIMEOUT",
        /// The step limit was reached and the final call gave no answer.
        MaxStepsNoAnswer = "MAX_STEPS_NO_ANSWER",
        /// The monitor ended the tool phase and the final call gave no answer.
        MonitorStopped = "MONITOR_STOPPED",
        /// The provider's content filter stopped the answer.
        ContentFiltered = "CONTENT_FILTERED",
        /// The model answered with nothing, twice.
        EmptyAnswer = "EMPTY_ANSWER",
        /// The store could not record the run.
        Store = "STORE",
        /// The run's task failed (a bug).
        Internal = "INTERNAL",
        /// The retriever failed (recoverable).
        Retrieval = "RETRIEVAL",
        /// Shown only if a suspended run were reported (it is not).
        Interrupted = "INTERRUPTED",
        /// The provider kept refusing: too many requests.
        LlmRateLimited = "LLM_RATE_LIMITED",
        /// The request did not fit the model's context window.
        LlmContextLength = "LLM_CONTEXT_LENGTH",
        /// The provider refused the credentials.
        LlmAuth = "LLM_AUTH",
        /// The provider refused the request.
        LlmBadRequest = "LLM_BAD_REQUEST",
        /// The provider failed.
        LlmServer = "LLM_SERVER",
        /// The provider did not answer in time.
        LlmTimeout = "LLM_TIMEOUT",
        /// The provider could not be reached.
        LlmConnection = "LLM_CONNECTION",
        /// The provider's answer could not be read.
        LlmProtocol = "LLM_PROTOCOL",
        /// A scripted model ran out of turns.
        ScriptExhausted = "SCRIPT_EXHAUSTED",
        /// The request could not be built.
        LlmInvalidRequest = "LLM_INVALID_REQUEST",
        /// The run used up its token or cost budget.
        BudgetExhausted = "BUDGET_EXHAUSTED",
        /// A `user_prompt_submit` hook blocked the prompt.
        PromptBlocked = "PROMPT_BLOCKED",
    }
}

wire_enum! {
    /// The `code` of a `warning` event: something that does not end the run.
    pub enum WarningCode {
        /// The answer reached the output token limit.
        OutputLimit = "OUTPUT_LIMIT",
        /// The model answered with nothing; it is asked once more.
        EmptyAnswer = "EMPTY_ANSWER",
        /// The monitor ended the tool phase; a final answer is asked for.
        MonitorStop = "MONITOR_STOP",
        /// The run stopped and can be resumed.
        Interrupted = "INTERRUPTED",
        /// A token or cost budget is 80 % used.
        BudgetLow = "BUDGET_LOW",
        /// A hook failed, timed out or answered garbage; the run went on
        /// as if it had not run.
        HookFailed = "HOOK_FAILED",
        /// The workspace could not be recorded after a step: that step
        /// cannot be rewound to; the run goes on.
        SnapshotFailed = "SNAPSHOT_FAILED",
        /// The model wrote tool calls as text (a fenced JSON block, a
        /// `<tool_call>` tag) that its server passed on as text; they
        /// were made as calls.
        CallsFromText = "CALLS_FROM_TEXT",
        /// The model's answer stopped at an error (repeated it, or came
        /// right after a failed call); it was asked once more.
        ErrorEcho = "ERROR_ECHO",
        /// The model answered with the work written out (code, steps)
        /// before calling any tool that changes something; it was asked
        /// once more.
        DescribedWork = "DESCRIBED_WORK",
        /// The model answered while a file the task names — one to read
        /// or one to write — appeared in none of its tool calls; it was
        /// asked once more (and is again after it touched one more).
        UntouchedFiles = "UNTOUCHED_FILES",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_serialize_as_their_wire_names() {
        for code in ErrorCode::ALL {
            assert_eq!(serde_json::to_value(code).unwrap(), code.as_str());
            let back: ErrorCode = serde_json::from_value(code.as_str().into()).unwrap();
            assert_eq!(back, *code);
        }
        assert_eq!(WarningCode::MonitorStop.to_string(), "MONITOR_STOP");
    }
}
