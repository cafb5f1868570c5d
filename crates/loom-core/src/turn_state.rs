//! `TurnState`: the immutable state of one turn of the run (docs/architecture.md).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The state of one turn. Immutable: every change makes a new value, so a
/// turn's state can be saved, compared and resumed without surprises.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnState {
    turn_counter: u32,
    turn_id: String,
    max_iterations: u32,
    compacted: bool,
    parent_turn_id: Option<String>,
    metadata: Map<String, Value>,
}

impl TurnState {
    /// The first turn of a run: counter 0, a fresh id, no parent.
    pub fn initial(max_iterations: u32) -> Self {
        Self {
            turn_counter: 0,
            turn_id: new_id(),
            max_iterations,
            compacted: false,
            parent_turn_id: None,
            metadata: Map::new(),
        }
    }

    /// The first turn of a sub-run started by the turn `parent_turn_id`.
    pub fn initial_child(max_iterations: u32, parent_turn_id: impl Into<String>) -> Self {
        Self {
            parent_turn_id: Some(parent_turn_id.into()),
            ..Self::initial(max_iterations)
        }
    }

    /// The next turn: counter + 1, a fresh id, this turn as its parent,
    /// the same limit and metadata.
    pub fn next_turn(&self, compacted: bool) -> Self {
        Self {
            turn_counter: self.turn_counter + 1,
            turn_id: new_id(),
            max_iterations: self.max_iterations,
            compacted,
            parent_turn_id: Some(self.turn_id.clone()),
            metadata: self.metadata.clone(),
        }
    }

    /// The same turn with `key` set in its metadata.
    pub fn with_metadata(&self, key: impl Into<String>, value: Value) -> Self {
        let mut metadata = self.metadata.clone();
        metadata.insert(key.into(), value);
        Self {
            metadata,
            ..self.clone()
        }
    }

    /// How many turns came before this one (0-based recursion depth).
    pub fn turn_counter(&self) -> u32 {
        self.turn_counter
    }

    /// This turn's unique id.
    pub fn turn_id(&self) -> &str {
        &self.turn_id
    }

    /// The id of the turn that led to this one, if any.
    pub fn parent_turn_id(&self) -> Option<&str> {
        self.parent_turn_id.as_deref()
    }

    /// The turn limit of the run.
    pub fn max_iterations(&self) -> u32 {
        self.max_iterations
    }

    /// Whether the history was compacted at the start of this turn.
    pub fn compacted(&self) -> bool {
        self.compacted
    }

    /// Free-form data carried from turn to turn.
    pub fn metadata(&self) -> &Map<String, Value> {
        &self.metadata
    }

    /// Whether this is the first turn.
    pub fn is_initial(&self) -> bool {
        self.turn_counter == 0
    }

    /// Whether the turn limit has been reached: no more tool turns allowed.
    pub fn is_final(&self) -> bool {
        self.turn_counter >= self.max_iterations
    }
}

/// A new random id (a turn's, or a run's made outside a live run).
pub(crate) fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn next_turn_links_to_parent_and_leaves_original_untouched() {
        let state = TurnState::initial(10);
        let next = state.next_turn(false);
        assert_eq!(state.turn_counter(), 0);
        assert_eq!(next.turn_counter(), 1);
        assert_ne!(state.turn_id(), next.turn_id());
        assert_eq!(next.parent_turn_id(), Some(state.turn_id()));
        assert_eq!(state.parent_turn_id(), None);
        assert!(state.is_initial() && !next.is_initial());
    }

    #[test]
    fn chain_of_turns_is_traceable_and_reaches_final() {
        let mut states = vec![TurnState::initial(3)];
        for _ in 0..3 {
            let next = states.last().unwrap().next_turn(false);
            states.push(next);
        }
        for pair in states.windows(2) {
            assert_eq!(pair[1].parent_turn_id(), Some(pair[0].turn_id()));
        }
        assert!(!states[2].is_final());
        assert!(states[3].is_final());
    }

    #[test]
    fn metadata_is_copied_not_shared() {
        let state = TurnState::initial(5).with_metadata("task", json!("x"));
        let changed = state.with_metadata("task", json!("y"));
        assert_eq!(state.metadata()["task"], "x");
        assert_eq!(changed.metadata()["task"], "y");
        assert_eq!(changed.turn_id(), state.turn_id());
        assert_eq!(state.next_turn(true).metadata()["task"], "x");
        assert!(state.next_turn(true).compacted());
    }

    #[test]
    fn serde_round_trip_uses_seed_field_names() {
        let state = TurnState::initial(7).next_turn(true).with_metadata("k", json!(1));
        let value = serde_json::to_value(&state).unwrap();
        for key in [
            "turn_counter",
            "turn_id",
            "max_iterations",
            "compacted",
            "parent_turn_id",
            "metadata",
        ] {
            assert!(value.get(key).is_some(), "missing {key}");
        }
        let back: TurnState = serde_json::from_value(value).unwrap();
        assert_eq!(back, state);
    }
}
