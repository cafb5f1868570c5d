//! The "always" grants of every session an agent has run, by session id.
//!
//! A session's set is shared by its live runs and kept after they end, so
//! the session's next run has it too. A set nobody holds and that holds no
//! grant carries nothing: it is dropped at the next sweep. Without that, a
//! gateway whose agent serves many sessions kept an entry for every
//! session it ever ran — memory that grew with every run (bench/README.md,
//! "Soak").

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::SessionGrants;

/// Entries kept before the first sweep.
const FIRST_SWEEP_AT: usize = 64;

/// The grants by session, swept as they grow.
#[derive(Debug, Default)]
pub(crate) struct GrantsBySession {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    by_session: HashMap<String, SessionGrants>,
    /// The size at which the next sweep happens: twice what the last one
    /// kept, so sweeping costs O(1) per run over time.
    sweep_at: usize,
}

impl GrantsBySession {
    /// The session's grants, shared with its other live runs.
    pub(crate) fn of(&self, session_id: &str) -> SessionGrants {
        let mut inner = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if inner.by_session.len() >= inner.sweep_at.max(FIRST_SWEEP_AT) {
            // Clones are only made here, under this lock, or by a run
            // that holds one: a count of 1 means no run holds the set.
            inner
                .by_session
                .retain(|_, grants| Arc::strong_count(grants) > 1 || !super::gate::lock(grants).is_empty());
            inner.sweep_at = inner.by_session.len() * 2;
        }
        inner.by_session.entry(session_id.to_string()).or_default().clone()
    }

    /// Sessions with an entry now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .by_session
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_sessions_without_grants_are_not_kept() {
        let sessions = GrantsBySession::default();
        for n in 0..10_000 {
            drop(sessions.of(&format!("session-{n}")));
        }
        assert!(sessions.len() <= FIRST_SWEEP_AT + 1, "{} kept", sessions.len());
    }

    #[test]
    fn a_grant_or_a_live_run_keeps_its_session() {
        let sessions = GrantsBySession::default();
        let live = sessions.of("live");
        sessions
            .of("granted")
            .lock()
            .unwrap()
            .insert(crate::permission::SessionGrant::Tool("bash".into()));
        for n in 0..1_000 {
            drop(sessions.of(&format!("session-{n}")));
        }
        // The live run's set is the one the session's next run gets.
        assert!(Arc::ptr_eq(&live, &sessions.of("live")));
        assert!(sessions
            .of("granted")
            .lock()
            .unwrap()
            .contains(&crate::permission::SessionGrant::Tool("bash".into())));
    }
}
