//! Command hooks (`[[hooks]]` in loom.toml, docs/extending.md): a shell
//! command run at a point of a run, told about it as JSON on stdin, that
//! answers with its exit status and JSON on stdout ([`answer`]). A hook
//! runs like the model's `bash` commands: in the workspace, with the
//! cleared environment, in namespaces and the sandbox when configured,
//! killed with its process group at its time limit.

mod answer;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use loom_core::hooks::{HookEvent, HookInput, HookReport, HookRun, HookScope, HookVerdict, LifecycleHooks};
use loom_core::ToolContext;
use regex::Regex;

use crate::shell::{run_with_input, BashSettings};

/// The most of a hook's stdout that is read: an answer is small.
pub(crate) const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// How long a hook may run when its entry gives no `timeout_secs`.
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(30);

/// One hook: when it runs and what.
#[derive(Debug, Clone)]
pub struct HookCommand {
    /// The point it runs at.
    pub event: HookEvent,
    /// For tool events: a regular expression the whole tool name must
    /// match (`write_file|edit_file`, `mcp__.*`); `None` or `*` for every tool.
    pub matcher: Option<String>,
    /// The command, run with `bash -c` in the workspace.
    pub command: String,
    /// Its time limit.
    pub timeout: Duration,
}

/// A hook entry that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum HookConfigError {
    /// The matcher is not a regular expression.
    #[error("matcher {matcher:?} is not a regular expression: {source}")]
    Matcher {
        /// The matcher as written.
        matcher: String,
        /// What the regex parser said.
        #[source]
        source: Box<regex::Error>,
    },
    /// A matcher on an event that is not about a tool call.
    #[error("matcher applies only to pre_tool_use and post_tool_use, not {0}")]
    MatcherOnRunEvent(HookEvent),
    /// An empty command.
    #[error("command is empty")]
    EmptyCommand,
    /// A zero time limit.
    #[error("timeout_secs must be at least 1")]
    ZeroTimeout,
}

struct Hook {
    command: HookCommand,
    /// `None`: every tool.
    matcher: Option<Regex>,
}

impl Hook {
    fn applies(&self, event: HookEvent, tool: Option<&str>) -> bool {
        self.command.event == event
            && match (&self.matcher, tool) {
                (Some(matcher), Some(tool)) => matcher.is_match(tool),
                _ => true,
            }
    }
}

/// Command hooks, run as `shell` says commands run.
pub struct CommandHooks {
    hooks: Vec<Hook>,
    shell: BashSettings,
}

impl std::fmt::Debug for CommandHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandHooks")
            .field("hooks", &self.hooks.len())
            .finish()
    }
}

impl CommandHooks {
    /// Hooks in the order given (the order they run in at each point).
    pub fn new(commands: Vec<HookCommand>, shell: BashSettings) -> Result<Self, HookConfigError> {
        let hooks = commands
            .into_iter()
            .map(|command| {
                if command.command.trim().is_empty() {
                    return Err(HookConfigError::EmptyCommand);
                }
                if command.timeout.is_zero() {
                    return Err(HookConfigError::ZeroTimeout);
                }
                let matcher =
                    match command.matcher.as_deref() {
                        None | Some("" | "*") => None,
                        Some(_) if !command.event.is_about_a_tool() => {
                            return Err(HookConfigError::MatcherOnRunEvent(command.event))
                        }
                        Some(pattern) => Some(Regex::new(&format!("^(?:{pattern})$")).map_err(|source| {
                            HookConfigError::Matcher {
                                matcher: pattern.to_string(),
                                source: Box::new(source),
                            }
                        })?),
                    };
                Ok(Hook { command, matcher })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { hooks, shell })
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.hooks.is_empty()
    }

    /// Runs one hook with `input` on its stdin.
    async fn run_one(&self, hook: &Hook, input: &HookInput, scope: HookScope<'_>) -> answer::Answer {
        let stdin = match serde_json::to_vec(input) {
            Ok(bytes) => bytes,
            Err(err) => return answer_failed(format!("its input could not be written: {err}")),
        };
        let mut ctx = ToolContext::new(
            "hook",
            Arc::from(input.run_id.as_str()),
            Arc::from(input.workspace.as_path()),
            scope.cancel.child_token(),
        );
        ctx.protected = scope.protected.clone();
        ctx.read_only = scope.read_only.clone();
        let timeout = hook.command.timeout;
        match run_with_input(
            &self.shell,
            &hook.command.command,
            stdin,
            &ctx,
            timeout,
            MAX_ANSWER_BYTES,
        )
        .await
        {
            Ok(run) => answer::read(&run, input.event, timeout.as_secs()),
            Err(err) => answer_failed(format!("could not run: {err}")),
        }
    }
}

fn answer_failed(error: String) -> answer::Answer {
    answer::Answer {
        error: Some(error),
        ..answer::Answer::default()
    }
}

/// How strongly a decision binds: deny over ask over allow.
fn weight(verdict: Option<HookVerdict>) -> u8 {
    match verdict {
        None => 0,
        Some(HookVerdict::Allow) => 1,
        Some(HookVerdict::Ask) => 2,
        Some(HookVerdict::Deny) => 3,
    }
}

/// The stricter of two decisions.
fn stricter(a: Option<HookVerdict>, b: Option<HookVerdict>) -> Option<HookVerdict> {
    if weight(b) > weight(a) {
        b
    } else {
        a
    }
}

#[async_trait]
impl LifecycleHooks for CommandHooks {
    fn wants(&self, event: HookEvent, tool: Option<&str>) -> bool {
        self.hooks.iter().any(|hook| hook.applies(event, tool))
    }

    async fn run(&self, input: &HookInput, scope: HookScope<'_>) -> HookRun {
        let mut input = input.clone();
        let mut run = HookRun::default();
        let mut contexts = Vec::new();
        for hook in &self.hooks {
            if !hook.applies(input.event, input.tool_name.as_deref()) {
                continue;
            }
            // A cancelled run starts no hook: it would only be killed.
            if scope.cancel.is_cancelled() {
                break;
            }
            let started = Instant::now();
            let answer = self.run_one(hook, &input, scope).await;
            let rewrote = answer.arguments.is_some();
            if let Some(arguments) = &answer.arguments {
                // Later hooks see the call as it will run.
                input.tool_input = Some(arguments.clone());
                run.answer.arguments = Some(arguments.clone());
            }
            contexts.extend(answer.context.clone());
            // The stricter decision wins, with its own reason.
            if stricter(run.answer.verdict, answer.verdict) != run.answer.verdict {
                run.answer.verdict = answer.verdict;
                run.answer.reason.clone_from(&answer.reason);
            }
            run.reports.push(HookReport {
                hook: shown(&hook.command.command),
                verdict: answer.verdict,
                reason: answer.reason,
                rewrote_arguments: rewrote,
                context: answer.context,
                error: answer.error,
                duration_ms: started.elapsed().as_millis() as u64,
            });
            if answer.verdict == Some(HookVerdict::Deny) {
                break;
            }
        }
        run.answer.context = (!contexts.is_empty()).then(|| contexts.join("\n"));
        run
    }
}

/// A hook as events name it: its command, shortened.
fn shown(command: &str) -> String {
    const MAX: usize = 200;
    let command = command.trim();
    if command.len() <= MAX {
        return command.to_string();
    }
    let mut end = MAX;
    while !command.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &command[..end])
}
