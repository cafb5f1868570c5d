//! What a live run shows of itself — its status, the asks waiting for a
//! person (its sub-agents' included), its usage, its last `seq` — published
//! by the run through a `watch` ([`crate::RunController::state`]), so that
//! whoever holds the run (the CLI, a gateway) reads it instead of keeping
//! a copy.
//!
//! Everything here that comes from events is taken from them where they
//! become visible, after they are stored (`engine/event_log.rs`): the state
//! never shows an ask or a `seq` that the run's log does not have.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use crate::control::PermissionDecision;
use crate::event::{Event, EventKind};
use crate::metrics::RunMetrics;
use crate::status::RunStatus;

/// An ask waiting for a person's answer.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingAsk {
    /// The run that asks (the run itself, or one of its sub-agents).
    pub run_id: String,
    /// The ask, as in `permission.request`.
    pub request_id: String,
    /// The tool.
    pub tool: String,
    /// Its arguments.
    pub args: Value,
    /// The rule that asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The `seq` of its `permission.request` (in the asking run's log).
    pub seq: u64,
}

/// A live run as it shows itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LiveState {
    /// Its status: `WAITING_PERMISSION` while any ask of the run or its
    /// sub-agents waits (once the ask is in the log).
    pub status: RunStatus,
    /// The asks waiting, in the order they were asked.
    pub pending_asks: Vec<PendingAsk>,
    /// Its usage so far: iterations, model calls, tokens.
    pub metrics: RunMetrics,
    /// Its answer, once it has one.
    pub content: Option<String>,
    /// The `seq` of its last visible (so stored) event.
    pub last_seq: u64,
    /// The status the run's own loop is in (the shown one adds its
    /// sub-agents' asks).
    own_status: RunStatus,
    /// Asks a previous process left open: the resumed run asks them again
    /// under the same ids, and an answer may come before it does
    /// ([`crate::permission`]).
    asked_before_restart: HashSet<String>,
    /// Of those, the ones answered before the run asked again: asked again,
    /// they are not waiting for anyone.
    answered_early: HashSet<String>,
    /// What a person decided before a restart, by ask: a resumed run that
    /// asks again (its call was cut off before it ran) is not asked twice.
    decided_before_restart: HashMap<String, PermissionDecision>,
}

impl LiveState {
    /// The state of a stopped run from its stored log: the asks it left
    /// open (to be asked again), its usage, its last `seq`. Its status is
    /// `QUEUED` until its loop starts again.
    pub(crate) fn from_log(run_id: &str, log: &[Event]) -> Self {
        let mut state = Self::default();
        for event in log {
            state.observe(run_id, event);
            if let EventKind::PermissionResolved {
                request_id,
                decision,
                reason: None,
                ..
            } = &event.kind
            {
                state.decided_before_restart.insert(request_id.clone(), *decision);
            }
        }
        state.status = RunStatus::Queued;
        state.own_status = RunStatus::Queued;
        state.asked_before_restart = state.pending_asks.iter().map(|ask| ask.request_id.clone()).collect();
        state
    }

    /// Whether `request_id` was asked before a restart and not yet again.
    pub(crate) fn asked_before_restart(&self, request_id: &str) -> bool {
        self.asked_before_restart.contains(request_id)
    }

    /// What a person decided before a restart about `request_id`, if
    /// anything (a timeout or a cancel is no decision).
    pub(crate) fn decided_before_restart(&self, request_id: &str) -> Option<PermissionDecision> {
        self.decided_before_restart.get(request_id).copied()
    }

    /// An ask left open before a restart was answered before the run asked
    /// it again: it no longer waits for anyone (the run applies the answer
    /// when it asks).
    pub(crate) fn answered_early(&mut self, request_id: &str) {
        self.asked_before_restart.remove(request_id);
        self.answered_early.insert(request_id.to_string());
        self.pending_asks.retain(|ask| ask.request_id != request_id);
        self.show();
    }

    /// The run's loop is in `status` now; whether anything changed.
    pub(crate) fn set_own_status(&mut self, status: RunStatus) -> bool {
        let before = (self.own_status, self.status);
        self.own_status = status;
        self.show();
        before != (self.own_status, self.status)
    }

    /// The status of the run's own loop.
    pub(crate) fn own_status(&self) -> RunStatus {
        self.own_status
    }

    /// What a visible event of the run `root` (or of one of its sub-agents)
    /// changes; whether that includes what a watcher waits for — its status,
    /// its asks or its answer (usage and the last `seq` change with nearly
    /// every event and wake nobody: the events are that signal).
    pub(crate) fn observe(&mut self, root: &str, event: &Event) -> bool {
        let own = *event.run_id == *root;
        let status = self.status;
        let mut changed = false;
        if own {
            self.last_seq = event.seq;
        }
        match &event.kind {
            EventKind::PermissionRequest {
                request_id,
                tool,
                args,
                rule,
            } => {
                self.pending_asks.retain(|ask| ask.request_id != *request_id);
                self.asked_before_restart.remove(request_id);
                // Its answer came first: asked for the record, answered at once.
                if !self.answered_early.remove(request_id) {
                    self.pending_asks.push(PendingAsk {
                        run_id: event.run_id.to_string(),
                        request_id: request_id.clone(),
                        tool: tool.clone(),
                        args: args.clone(),
                        rule: rule.clone(),
                        seq: event.seq,
                    });
                }
                changed = true;
            }
            EventKind::PermissionResolved { request_id, .. } => {
                self.pending_asks.retain(|ask| ask.request_id != *request_id);
                changed = true;
            }
            EventKind::ToolCallsComplete { .. } if own && !self.asked_before_restart.is_empty() => {
                // The batch that asked before the restart is settled: what
                // it did not ask again is no longer asked.
                let stale = std::mem::take(&mut self.asked_before_restart);
                self.pending_asks.retain(|ask| !stale.contains(&ask.request_id));
                self.answered_early.clear();
                changed = true;
            }
            EventKind::IterationStart { iteration } if own => self.metrics.iterations = iteration + 1,
            EventKind::LlmFinish { usage: Some(usage), .. } if own => {
                self.metrics.input_tokens += usage.input_tokens;
                self.metrics.output_tokens += usage.output_tokens;
                self.metrics.llm_calls += 1;
            }
            EventKind::AgentFinish { content, metrics, .. } if own => {
                self.content = Some(content.clone());
                self.metrics = metrics.clone();
                changed = true;
            }
            EventKind::LifecycleEnd {
                status,
                content,
                metrics,
            } if own => {
                self.own_status = *status;
                self.content.clone_from(content);
                self.metrics = metrics.clone();
                self.pending_asks.clear();
                changed = true;
            }
            _ => {}
        }
        self.show();
        changed || status != self.status
    }

    /// Follows a run executed in another process through its stored log
    /// (a gateway whose runs execute on workers, docs/cluster.md): `event`,
    /// of the run `root` and already stored, is observed as the run's own
    /// stream would; any event of the run but its end shows it executing
    /// (a run a worker handed back shows `INTERRUPTED` until another
    /// resumes it). Returns whether its status, asks or answer changed.
    pub fn follow(&mut self, root: &str, event: &Event) -> bool {
        let own = *event.run_id == *root;
        let before = self.status;
        // An ask waiting shows through `pending_asks`, as for a run here.
        if own
            && !matches!(event.kind, EventKind::LifecycleEnd { .. })
            && matches!(self.own_status, RunStatus::Queued | RunStatus::Interrupted)
        {
            self.own_status = RunStatus::Running;
        }
        let changed = self.observe(root, event);
        changed || before != self.status
    }

    /// The shown status: `WAITING_PERMISSION` exactly while an ask is
    /// visible (the loop says it waits a moment before its ask is stored).
    fn show(&mut self) {
        self.status = match self.own_status {
            RunStatus::Running | RunStatus::WaitingPermission if !self.pending_asks.is_empty() => {
                RunStatus::WaitingPermission
            }
            RunStatus::WaitingPermission => RunStatus::Running,
            status => status,
        };
    }
}

/// Where a run's events become visible: its stream, after they update its
/// [`LiveState`]. A sub-agent's events join its root's stream here too.
#[derive(Debug, Clone)]
pub(crate) struct RunStream {
    root: Arc<str>,
    state: Arc<watch::Sender<LiveState>>,
    events: mpsc::UnboundedSender<Box<Event>>,
    /// Sees every event made visible (`observe.rs`), with the run's session.
    observer: Option<(Arc<dyn crate::observe::EventObserver>, Arc<str>)>,
}

impl std::fmt::Debug for dyn crate::observe::EventObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventObserver")
    }
}

impl RunStream {
    pub(crate) fn new(
        root: Arc<str>,
        state: Arc<watch::Sender<LiveState>>,
        events: mpsc::UnboundedSender<Box<Event>>,
        observer: Option<(Arc<dyn crate::observe::EventObserver>, Arc<str>)>,
    ) -> Self {
        Self {
            root,
            state,
            events,
            observer,
        }
    }

    /// Makes `event` visible. A stream nobody reads any more is not an error.
    pub(crate) fn send(&self, event: Box<Event>) {
        // Waking the state's watchers costs more than the rest of an
        // event's way to the stream: only a change they wait for does.
        self.state.send_if_modified(|state| state.observe(&self.root, &event));
        if let Some((observer, session_id)) = &self.observer {
            observer.observe(session_id, &event);
        }
        let _ = self.events.send(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::Usage;
    use crate::PermissionDecision;

    fn event(run_id: &str, seq: u64, kind: EventKind) -> Event {
        Event {
            run_id: run_id.into(),
            turn_id: "t".into(),
            parent_turn_id: None,
            depth: 0,
            parent_run_id: None,
            seq,
            ts: String::new(),
            kind,
        }
    }

    fn ask(run_id: &str, seq: u64, id: &str) -> Event {
        event(
            run_id,
            seq,
            EventKind::PermissionRequest {
                request_id: id.into(),
                tool: "write_file".into(),
                args: Value::Null,
                rule: None,
            },
        )
    }

    fn resolved(run_id: &str, seq: u64, id: &str) -> Event {
        event(
            run_id,
            seq,
            EventKind::PermissionResolved {
                request_id: id.into(),
                tool: "write_file".into(),
                decision: PermissionDecision::Allow,
                reason: None,
            },
        )
    }

    #[test]
    fn a_persons_decisions_before_a_restart_are_kept_not_a_timeouts() {
        let timed_out = event(
            "root",
            4,
            EventKind::PermissionResolved {
                request_id: "perm_b".into(),
                tool: "write_file".into(),
                decision: PermissionDecision::Deny,
                reason: Some(crate::event::Unanswered::Timeout),
            },
        );
        let log = vec![
            ask("root", 1, "perm_a"),
            resolved("root", 2, "perm_a"),
            ask("root", 3, "perm_b"),
            timed_out,
        ];
        let state = LiveState::from_log("root", &log);
        assert_eq!(state.decided_before_restart("perm_a"), Some(PermissionDecision::Allow));
        assert_eq!(state.decided_before_restart("perm_b"), None, "nobody decided");
        assert!(state.pending_asks.is_empty());
    }

    #[test]
    fn watchers_wake_for_a_change_of_status_asks_or_answer_not_for_every_event() {
        let mut state = LiveState::default();
        state.set_own_status(RunStatus::Running);
        assert!(!state.observe("root", &event("root", 1, EventKind::IterationStart { iteration: 0 })));
        assert_eq!(
            (state.last_seq, state.metrics.iterations),
            (1, 1),
            "read current all the same"
        );
        assert!(
            state.observe("root", &ask("child", 2, "perm_c")),
            "an ask (and the status it makes)"
        );
        assert!(state.observe("root", &resolved("child", 3, "perm_c")), "its answer");
        let finish = EventKind::AgentFinish {
            content: "done".into(),
            turns: 1,
            metrics: RunMetrics::default(),
        };
        assert!(state.observe("root", &event("root", 4, finish)), "the answer");
    }

    #[test]
    fn a_sub_agents_ask_makes_its_root_wait_and_its_answer_lets_it_go_on() {
        let mut state = LiveState::default();
        state.set_own_status(RunStatus::Running);
        state.observe("root", &event("root", 1, EventKind::IterationStart { iteration: 0 }));
        state.observe("root", &ask("child", 4, "perm_c"));
        assert_eq!(state.status, RunStatus::WaitingPermission);
        assert_eq!(state.pending_asks[0].run_id, "child");
        // A child's seq is its own: the root's last seq is the root's.
        assert_eq!((state.last_seq, state.metrics.iterations), (1, 1));
        state.observe("root", &resolved("child", 5, "perm_c"));
        assert_eq!((state.status, state.pending_asks.len()), (RunStatus::Running, 0));
    }

    #[test]
    fn usage_and_the_end_come_from_the_runs_own_events() {
        let mut state = LiveState::default();
        state.set_own_status(RunStatus::Running);
        let usage = Usage {
            input_tokens: 10,
            output_tokens: 3,
            ..Usage::default()
        };
        let finish = |run_id: &str, seq| {
            event(
                run_id,
                seq,
                EventKind::LlmFinish {
                    content: String::new(),
                    usage: Some(usage),
                    finish_reason: None,
                    cost_usd: None,
                    tool_call_count: 0,
                    response_model: None,
                },
            )
        };
        state.observe("root", &finish("root", 2));
        state.observe("root", &finish("child", 3));
        assert_eq!((state.metrics.input_tokens, state.metrics.llm_calls), (10, 1));
        let metrics = RunMetrics {
            llm_calls: 2,
            ..RunMetrics::default()
        };
        state.observe(
            "root",
            &event(
                "root",
                9,
                EventKind::LifecycleEnd {
                    status: RunStatus::Done,
                    content: Some("ok".into()),
                    metrics,
                },
            ),
        );
        assert_eq!(state.status, RunStatus::Done);
        assert_eq!(
            (state.content.as_deref(), state.metrics.llm_calls, state.last_seq),
            (Some("ok"), 2, 9)
        );
    }

    #[test]
    fn asks_left_open_by_a_stopped_run_wait_until_it_asks_again_or_its_batch_is_settled() {
        let log = vec![
            event("root", 1, EventKind::IterationStart { iteration: 0 }),
            ask("root", 2, "perm_a"),
            ask("root", 3, "perm_b"),
            resolved("root", 4, "perm_b"),
            ask("root", 5, "perm_c"),
            ask("root", 6, "perm_d"),
        ];
        let mut state = LiveState::from_log("root", &log);
        assert_eq!(state.status, RunStatus::Queued);
        assert_eq!(state.last_seq, 6);
        let open: Vec<&str> = state.pending_asks.iter().map(|a| a.request_id.as_str()).collect();
        assert_eq!(open, ["perm_a", "perm_c", "perm_d"]);
        assert!(state.asked_before_restart("perm_a") && !state.asked_before_restart("perm_b"));
        state.set_own_status(RunStatus::Running);
        assert_eq!(state.status, RunStatus::WaitingPermission);
        // Asked again under its id: a live ask now.
        state.observe("root", &ask("root", 7, "perm_a"));
        assert!(!state.asked_before_restart("perm_a"));
        state.observe("root", &resolved("root", 8, "perm_a"));
        // perm_c, answered before it is asked again, waits for nobody, and
        // asked again it is answered at once (the log has both).
        state.answered_early("perm_c");
        assert!(!state.asked_before_restart("perm_c"), "answered once");
        assert_eq!(state.pending_asks.len(), 1, "perm_d still waits");
        state.observe("root", &ask("root", 9, "perm_c"));
        assert_eq!(
            state.pending_asks.len(),
            1,
            "perm_c not shown again: {:?}",
            state.pending_asks
        );
        state.observe("root", &resolved("root", 10, "perm_c"));
        // perm_d's call was settled without asking (its result was journaled).
        state.observe("root", &event("root", 11, EventKind::ToolCallsComplete { count: 1 }));
        assert!(state.pending_asks.is_empty());
        assert_eq!(state.status, RunStatus::Running);
    }
}
