//! The six-stage tool pipeline (docs/library.md): discover → validate → authorize
//! → check cancel → execute → format.
//!
//! The first four stages run call by call in the model's order (so a person
//! is asked one question at a time, in order). Execution is scheduled:
//! consecutive concurrency-safe calls run in parallel up to
//! `max_concurrency`, any other call runs alone, and every call has a
//! timeout. Each result is formatted (hooks, secret redaction, truncation)
//! and announced as it finishes; the batch returns results in call order.
//! Every failure in any stage becomes a `ToolResult` the model reads on its
//! next turn; a tool never brings the run down.

mod authorize;
mod execute;
mod hooks;
mod redact;
mod scheduler;
mod stages;
mod stream_output;
mod truncate;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::context::{RunContext, StopCause};
use crate::emitter::EventEmitter;
use crate::event::{EventKind, TurnIds};
use crate::hooks::{LifecycleHooks, ToolHook};
use crate::message::ToolCall;
use crate::permission::{PermissionGate, PermissionPolicy};
use crate::tool::{RegisteredTool, ToolRegistry};
use crate::tool_result::{Authority, ErrorKind, StageTimings, ToolResult, ToolStatus};

pub use redact::{is_secret_name, remember_secrets, Redactor, REDACTED};

pub use truncate::truncate;

/// How tools are scheduled and their output shaped.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Concurrency-safe calls running at once (default 10).
    pub max_concurrency: usize,
    /// Limit of one call (default 120 s); `None` for none.
    pub tool_timeout: Option<Duration>,
    /// Per-tool limits that replace `tool_timeout`.
    pub tool_timeouts: HashMap<String, Duration>,
    /// Results longer than this many characters are cut (default 30 000).
    pub max_output_chars: usize,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            max_concurrency: 10,
            tool_timeout: Some(Duration::from_secs(120)),
            tool_timeouts: HashMap::new(),
            max_output_chars: 30_000,
        }
    }
}

impl PipelineConfig {
    /// A tool's timeout: the one set for it by name, else the default —
    /// unless the tool bounds its own time (a sub-agent has its run's).
    fn timeout_for(&self, tool: &str, bounds_own_time: bool) -> Option<Duration> {
        let default = if bounds_own_time { None } else { self.tool_timeout };
        self.tool_timeouts.get(tool).copied().or(default)
    }
}

/// Runs tool calls through the pipeline stages.
pub struct ToolPipeline {
    registry: Arc<ToolRegistry>,
    /// Library hooks, in registration order.
    hooks: Vec<Arc<dyn ToolHook>>,
    /// Decides after the hooks (see `authorize`).
    policy: PermissionPolicy,
    /// Asked before (`pre_tool_use`) and after (`post_tool_use`) each call.
    lifecycle: Option<Arc<dyn LifecycleHooks>>,
    config: PipelineConfig,
    redactor: Redactor,
}

impl std::fmt::Debug for ToolPipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolPipeline")
            .field("tools", &self.registry.len())
            .field("hooks", &self.hooks.len())
            .field("lifecycle_hooks", &self.lifecycle.is_some())
            .field("config", &self.config)
            .finish()
    }
}

/// What a batch needs from its run.
pub(crate) struct BatchEnv<'a> {
    pub ctx: &'a RunContext,
    pub workspace: &'a Arc<Path>,
    pub events: &'a EventEmitter,
    pub turn: &'a TurnIds,
    pub gate: &'a PermissionGate,
    /// Where calls of tools with side effects are journaled.
    pub store: &'a Arc<dyn crate::store::Store>,
    /// Paths tools must not touch (see [`crate::tool::ToolContext::protected`]).
    pub protected: &'a Arc<[std::path::PathBuf]>,
    /// Paths tools may read but not change (see [`crate::tool::ToolContext::read_only`]).
    pub read_only: &'a Arc<[std::path::PathBuf]>,
    /// Given to each call (see [`crate::tool::ToolContext::sub_agents`]).
    pub sub_agents: Option<Arc<dyn crate::delegate::SubAgents>>,
}

/// A call after the first four stages.
pub(crate) enum Prepared<'a> {
    /// Ready to execute.
    Ready {
        call: &'a ToolCall,
        tool: &'a RegisteredTool,
        args: serde_json::Value,
        stages: StageTimings,
        /// Time spent in the first four stages (a person's answer included).
        prepared_in: Duration,
        /// Who let it run.
        decided_by: Authority,
    },
    /// Settled without running (unknown tool, invalid arguments, denied, cancelled).
    Settled {
        call: &'a ToolCall,
        result: ToolResult,
        stages: StageTimings,
        prepared_in: Duration,
    },
}

/// A call's clock once its turn comes: it counts the time the call spent
/// being prepared, not the time it then waited for the calls before it
/// (a call after a slow exclusive one reports its own duration).
pub(crate) fn call_clock(prepared_in: Duration) -> Instant {
    let now = Instant::now();
    now.checked_sub(prepared_in).unwrap_or(now)
}

impl ToolPipeline {
    /// The same pipeline (hooks, permissions, limits) over other tools.
    pub(crate) fn with_tools(&self, registry: ToolRegistry) -> Self {
        Self {
            registry: Arc::new(registry),
            hooks: self.hooks.clone(),
            policy: self.policy.clone(),
            lifecycle: self.lifecycle.clone(),
            config: self.config.clone(),
            redactor: self.redactor.clone(),
        }
    }

    /// A pipeline over `registry`: `hooks` decide in order, then `policy`
    /// (see docs/extending.md for the whole order).
    pub fn new(
        registry: Arc<ToolRegistry>,
        hooks: Vec<Arc<dyn ToolHook>>,
        policy: PermissionPolicy,
        config: PipelineConfig,
        redactor: Redactor,
    ) -> Self {
        Self {
            registry,
            hooks,
            policy,
            lifecycle: None,
            config,
            redactor,
        }
    }

    /// The same pipeline asking `hooks` before and after each call.
    pub fn with_lifecycle_hooks(mut self, hooks: Option<Arc<dyn LifecycleHooks>>) -> Self {
        self.lifecycle = hooks;
        self
    }

    /// The registry the pipeline runs.
    pub fn registry(&self) -> &ToolRegistry {
        &self.registry
    }

    /// The scheduling and output settings.
    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    /// A `cancelled` result for a call that never got to run. Its error kind
    /// is [`ErrorKind::NotStarted`]: a resumed run may run it (see [`crate::resume`]).
    pub fn cancelled(call: &ToolCall) -> ToolResult {
        ToolResult::new(
            &call.id,
            &call.name,
            ToolStatus::Cancelled,
            "The run was cancelled before this tool call could run.",
        )
        .with_error_kind(ErrorKind::NotStarted)
    }

    /// Runs a turn's calls and returns their results in call order.
    pub(crate) async fn run_batch(&self, calls: &[ToolCall], env: &BatchEnv<'_>) -> Vec<ToolResult> {
        let mut prepared = Vec::with_capacity(calls.len());
        for call in calls {
            prepared.push(self.prepare(call, env).await);
        }
        scheduler::run(self, prepared, env).await
    }

    /// Stages 1-4 for one call.
    async fn prepare<'a>(&'a self, call: &'a ToolCall, env: &BatchEnv<'_>) -> Prepared<'a> {
        let started = Instant::now();
        let mut stages = StageTimings::default();
        let settled = |result: ToolResult, stages: StageTimings| Prepared::Settled {
            call,
            result,
            stages,
            prepared_in: started.elapsed(),
        };
        if env.ctx.is_cancelled() {
            return settled(Self::cancelled(call), stages);
        }

        let t = Instant::now();
        let discovered = stages::discover(&self.registry, call);
        stages.discover_us = micros(t);
        let tool = match discovered {
            Ok(tool) => tool,
            Err(rejection) => return settled(rejection.into_result(call), stages),
        };

        let t = Instant::now();
        let validated = stages::validate(call, tool, &call.arguments);
        stages.validate_us = micros(t);
        let args = match validated {
            Ok(args) => args,
            Err(rejection) => return settled(rejection.into_result(call), stages),
        };

        let t = Instant::now();
        let authorized = authorize::authorize(self, call, tool, args, env).await;
        stages.authorize_us = micros(t);
        let (args, decided_by) = match authorized {
            Ok(allowed) => allowed,
            Err(result) => return settled(result, stages),
        };

        // Check cancel: nothing starts once the run is cancelled.
        if env.ctx.is_cancelled() {
            let mut result = Self::cancelled(call);
            result.metadata.decided_by = Some(decided_by);
            return settled(result, stages);
        }
        Prepared::Ready {
            call,
            tool,
            args,
            stages,
            prepared_in: started.elapsed(),
            decided_by,
        }
    }

    /// Stage 6 for a call that did not run: hooks, redaction, truncation,
    /// timing; then the event.
    async fn finish(
        &self,
        call: &ToolCall,
        result: ToolResult,
        stages: StageTimings,
        started: Instant,
        env: &BatchEnv<'_>,
    ) -> ToolResult {
        let result = self
            .settle(
                call,
                result,
                Settling {
                    stages,
                    started,
                    ran_with: None,
                },
                env,
            )
            .await;
        Self::tell(&result, env);
        result
    }

    /// Stage 6 without the event: the result as the model and the journal
    /// get it. `post_tool_use` hooks see only calls that ran.
    async fn settle(
        &self,
        call: &ToolCall,
        mut result: ToolResult,
        settling: Settling,
        env: &BatchEnv<'_>,
    ) -> ToolResult {
        let Settling {
            mut stages,
            started,
            ran_with,
        } = settling;
        let t = Instant::now();
        if result.status == ToolStatus::Cancelled {
            mark_deadline(&mut result, env.ctx);
        }
        for hook in &self.hooks {
            result = hook.after_tool(call, result).await;
        }
        if let Some(args) = ran_with {
            self.post_tool_use(call, &args, &mut result, env).await;
        }
        if let std::borrow::Cow::Owned(clean) = self.redactor.redact(&result.content) {
            result.content = clean;
        }
        if let Some(cut) = truncate(&result.content, self.config.max_output_chars) {
            result.content = cut;
        }
        stages.format_us = micros(t);
        result.metadata.stages = stages;
        result.metadata.duration_ms = started.elapsed().as_millis() as u64;
        result
    }

    /// The call's `tool.result` event.
    fn tell(result: &ToolResult, env: &BatchEnv<'_>) {
        env.events.emit(env.turn, EventKind::tool_result(result));
    }
}

/// A call stopped by a run or step deadline reads as `timeout`, not
/// `cancelled`; one stopped by an interrupt says so (the run goes on later).
fn mark_deadline(result: &mut ToolResult, ctx: &RunContext) {
    let limit = match ctx.stop_cause() {
        Some(StopCause::RunTimeout) => "the run's time limit",
        Some(StopCause::StepTimeout) => "the step's time limit",
        Some(StopCause::Interrupted(_)) => {
            result.content = "The run was interrupted (its process was stopping) before this tool call finished; \
                              if it had started, its effect is unknown."
                .to_string();
            return;
        }
        _ => return,
    };
    result.status = ToolStatus::Timeout;
    result.content = format!("The tool call was stopped because {limit} passed.");
    result.metadata.error_kind = Some(ErrorKind::Timeout);
}

/// What stage 6 needs besides the result.
pub(crate) struct Settling {
    pub stages: StageTimings,
    /// When the call's clock started.
    pub started: Instant,
    /// The arguments the tool ran with, when it ran (its result is its
    /// own, not a refusal).
    pub ran_with: Option<serde_json::Value>,
}

fn micros(since: Instant) -> u64 {
    since.elapsed().as_micros() as u64
}

/// The validate stage, for [`crate::fuzzing`].
pub(crate) fn validate_for_fuzzing(
    call: &crate::message::ToolCall,
    registered: &crate::tool::RegisteredTool,
    arguments: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    stages::validate(call, registered, arguments).map_err(|rejection| rejection.into_result(call).content)
}
