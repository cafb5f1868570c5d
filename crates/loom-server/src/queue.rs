//! Admission: which runs execute now and which wait, in order, under the
//! caps overall and per token, one run per session at a time, with a bound
//! on the waiting line.
//!
//! Behind the [`RunQueue`] trait: the seam of a process that starts the
//! runs it admits, without touching the protocol code or the service
//! around it. The queue knows run ids, tokens and sessions — never agents,
//! controls or events. A cluster's gateway starts nothing: its line is in
//! the store, and workers admit runs by claiming them (`RunLeases`,
//! docs/architecture.md, "On a cluster").

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};

use crate::auth::Principal;

/// A run as the queue sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// The run.
    pub run_id: String,
    /// Whose it is: the per-token cap counts it there.
    pub principal: Principal,
    /// Its session: a session executes one run at a time.
    pub session_id: String,
}

/// The limits a queue enforces.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// Runs executing at once, overall.
    pub max_runs: usize,
    /// Runs executing at once, per token.
    pub per_token: usize,
    /// Runs waiting at most; one more is refused.
    pub max_queued: usize,
}

/// The waiting line is full: the run was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many runs are waiting")]
pub struct QueueFull;

/// How many runs execute and wait (for the gauges).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounts {
    /// Runs executing.
    pub executing: usize,
    /// Runs waiting.
    pub waiting: usize,
}

/// The admission queue. Every method is one atomic step: an implementation
/// shared by many processes must keep each one indivisible.
pub trait RunQueue: Send + Sync {
    /// Puts a run at the back of the line and returns the runs that may
    /// start now, in line order (this one among them when there is room).
    /// Those returned count as executing from now on. When the run would
    /// have to wait and the line is full it is not taken: [`QueueFull`].
    fn push(&self, ticket: Ticket) -> Result<Vec<Ticket>, QueueFull>;
    /// 1 for the next run to start; `None` when the run is not waiting.
    fn position(&self, run_id: &str) -> Option<usize>;
    /// Takes a waiting run out of the line; `false` when it is not waiting
    /// (it started meanwhile, or was never here).
    fn withdraw(&self, run_id: &str) -> bool;
    /// Puts back in line a run accepted before a restart (one that was
    /// executing or waiting): like [`RunQueue::push`] under the caps, but
    /// never refused — it was accepted already.
    fn readmit(&self, ticket: Ticket) -> Vec<Ticket>;
    /// An executing run ended: its place is free. Returns the runs that may
    /// start now (none when `start_more` is false: the gateway is closing).
    fn finished(&self, run_id: &str, start_more: bool) -> Vec<Ticket>;
    /// Empties the line (the gateway is closing), oldest first.
    fn drain(&self) -> Vec<Ticket>;
    /// How many execute and wait.
    fn counts(&self) -> QueueCounts;
}

/// The in-process queue.
pub struct LocalQueue {
    caps: Caps,
    state: Mutex<LineState>,
}

#[derive(Default)]
struct LineState {
    /// Waiting runs, oldest first.
    waiting: VecDeque<Ticket>,
    /// Executing runs, by id.
    executing: HashMap<String, Ticket>,
    executing_by: HashMap<Principal, usize>,
    /// Sessions with a run executing.
    busy_sessions: HashSet<String>,
}

impl LocalQueue {
    /// A queue enforcing `caps`.
    pub fn new(caps: Caps) -> Self {
        Self {
            caps,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, LineState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl LineState {
    fn start(&mut self, ticket: Ticket) {
        self.busy_sessions.insert(ticket.session_id.clone());
        *self.executing_by.entry(ticket.principal.clone()).or_default() += 1;
        self.executing.insert(ticket.run_id.clone(), ticket);
    }

    /// Takes the waiting runs that may start now, in line order: within the
    /// caps, and one run per session (a session's runs start in the order
    /// they came, so one met earlier in this scan holds back its later ones).
    fn schedule(&mut self, caps: Caps) -> Vec<Ticket> {
        let mut passed: HashSet<String> = HashSet::new();
        let mut started = Vec::new();
        let mut index = 0;
        while index < self.waiting.len() && self.executing.len() < caps.max_runs {
            let ticket = &self.waiting[index];
            let first_of_session =
                !self.busy_sessions.contains(&ticket.session_id) && passed.insert(ticket.session_id.clone());
            let used = self.executing_by.get(&ticket.principal).copied().unwrap_or(0);
            if !first_of_session || used >= caps.per_token {
                index += 1;
                continue;
            }
            if let Some(ticket) = self.waiting.remove(index) {
                self.start(ticket.clone());
                started.push(ticket);
            }
        }
        started
    }
}

impl RunQueue for LocalQueue {
    fn push(&self, ticket: Ticket) -> Result<Vec<Ticket>, QueueFull> {
        let mut state = self.state();
        let run_id = ticket.run_id.clone();
        state.waiting.push_back(ticket);
        let started = state.schedule(self.caps);
        let waits = started.iter().all(|ticket| ticket.run_id != run_id);
        if waits && state.waiting.len() > self.caps.max_queued {
            state.waiting.retain(|ticket| ticket.run_id != run_id);
            return Err(QueueFull);
        }
        Ok(started)
    }

    fn position(&self, run_id: &str) -> Option<usize> {
        self.state()
            .waiting
            .iter()
            .position(|ticket| ticket.run_id == run_id)
            .map(|index| index + 1)
    }

    fn withdraw(&self, run_id: &str) -> bool {
        let mut state = self.state();
        let before = state.waiting.len();
        state.waiting.retain(|ticket| ticket.run_id != run_id);
        state.waiting.len() != before
    }

    fn readmit(&self, ticket: Ticket) -> Vec<Ticket> {
        let mut state = self.state();
        state.waiting.push_back(ticket);
        state.schedule(self.caps)
    }

    fn finished(&self, run_id: &str, start_more: bool) -> Vec<Ticket> {
        let mut state = self.state();
        if let Some(ticket) = state.executing.remove(run_id) {
            state.busy_sessions.remove(&ticket.session_id);
            if let Some(used) = state.executing_by.get_mut(&ticket.principal) {
                *used = used.saturating_sub(1);
                if *used == 0 {
                    state.executing_by.remove(&ticket.principal);
                }
            }
        }
        if start_more {
            state.schedule(self.caps)
        } else {
            Vec::new()
        }
    }

    fn drain(&self) -> Vec<Ticket> {
        self.state().waiting.drain(..).collect()
    }

    fn counts(&self) -> QueueCounts {
        let state = self.state();
        QueueCounts {
            executing: state.executing.len(),
            waiting: state.waiting.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(run: &str, token: &str, session: &str) -> Ticket {
        Ticket {
            run_id: run.into(),
            principal: Principal::new(token),
            session_id: session.into(),
        }
    }

    fn ids(tickets: &[Ticket]) -> Vec<&str> {
        tickets.iter().map(|ticket| ticket.run_id.as_str()).collect()
    }

    fn queue(max_runs: usize, per_token: usize, max_queued: usize) -> LocalQueue {
        LocalQueue::new(Caps {
            max_runs,
            per_token,
            max_queued,
        })
    }

    #[test]
    fn runs_start_within_the_caps_and_wait_in_order() {
        let queue = queue(2, 1, 10);
        assert_eq!(ids(&queue.push(ticket("a1", "a", "s1")).unwrap()), ["a1"]);
        assert!(queue.push(ticket("a2", "a", "s2")).unwrap().is_empty());
        assert!(queue.push(ticket("a3", "a", "s3")).unwrap().is_empty());
        // Another token is not held back by a's cap.
        assert_eq!(ids(&queue.push(ticket("b1", "b", "s4")).unwrap()), ["b1"]);
        assert_eq!(queue.position("a2"), Some(1));
        assert_eq!(queue.position("a3"), Some(2));
        assert_eq!(ids(&queue.finished("a1", true)), ["a2"]);
        assert_eq!(queue.position("a3"), Some(1));
        assert_eq!(
            queue.counts(),
            QueueCounts {
                executing: 2,
                waiting: 1
            }
        );
    }

    #[test]
    fn a_session_executes_one_run_at_a_time_in_the_order_they_came() {
        let queue = queue(10, 10, 10);
        assert_eq!(ids(&queue.push(ticket("r1", "a", "s")).unwrap()), ["r1"]);
        assert!(queue.push(ticket("r2", "a", "s")).unwrap().is_empty());
        assert!(queue.push(ticket("r3", "a", "s")).unwrap().is_empty());
        assert_eq!(ids(&queue.finished("r1", true)), ["r2"]);
        assert_eq!(ids(&queue.finished("r2", true)), ["r3"]);
    }

    #[test]
    fn a_full_line_refuses_without_taking_the_run() {
        let queue = queue(1, 1, 1);
        queue.push(ticket("r1", "a", "s1")).unwrap();
        queue.push(ticket("r2", "a", "s2")).unwrap();
        assert_eq!(queue.push(ticket("r3", "a", "s3")), Err(QueueFull));
        assert_eq!(queue.position("r3"), None);
        assert_eq!(queue.counts().waiting, 1);
    }

    #[test]
    fn withdrawn_and_drained_runs_never_start() {
        let queue = queue(1, 1, 10);
        queue.push(ticket("r1", "a", "s1")).unwrap();
        queue.push(ticket("r2", "a", "s2")).unwrap();
        queue.push(ticket("r3", "a", "s3")).unwrap();
        assert!(queue.withdraw("r2"));
        assert!(!queue.withdraw("r1"), "an executing run is not waiting");
        assert_eq!(ids(&queue.drain()), ["r3"]);
        assert!(queue.finished("r1", true).is_empty());
    }

    #[test]
    fn a_closing_gateway_starts_nothing_more() {
        let queue = queue(1, 1, 10);
        queue.push(ticket("r1", "a", "s1")).unwrap();
        queue.push(ticket("r2", "a", "s2")).unwrap();
        assert!(queue.finished("r1", false).is_empty());
        assert_eq!(queue.position("r2"), Some(1));
    }

    #[test]
    fn runs_taken_back_after_a_restart_count_against_the_caps_and_are_never_refused() {
        let queue = queue(1, 1, 1);
        assert_eq!(ids(&queue.readmit(ticket("old", "a", "s1"))), ["old"]);
        // Over the cap, and past the line's bound: they wait, in order.
        assert!(queue.readmit(ticket("older", "a", "s2")).is_empty());
        assert!(queue.readmit(ticket("oldest", "a", "s3")).is_empty());
        assert_eq!(queue.position("oldest"), Some(2));
        assert_eq!(queue.push(ticket("new", "a", "s4")), Err(QueueFull));
        assert_eq!(ids(&queue.finished("old", true)), ["older"]);
        assert_eq!(ids(&queue.finished("older", true)), ["oldest"]);
    }
}
