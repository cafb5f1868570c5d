//! Watching a process's runs from beside them (traces for an
//! OpenTelemetry backend, `loom-telemetry`): an [`EventObserver`] sees
//! every event of every run an agent executes — its sub-agents' included —
//! once, as it becomes visible (after it is stored, where runs are).
//! Observers are called on the run's path: they must return at once.

use crate::event::Event;

/// Sees each event as it becomes visible.
pub trait EventObserver: Send + Sync {
    /// `event`, of a run of session `session_id`, became visible. Must
    /// not block.
    fn observe(&self, session_id: &str, event: &Event);
}
