//! Where a run's events are made and sent: the emitter stamps each with
//! the common fields (`seq`, `ts`, ids) and sends it, in `seq` order, to a
//! sink — the run's event log (stored, then visible), its stream, or a
//! channel (docs/events.md).

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::sync::mpsc;

use crate::engine::event_log::EventSink;
use crate::event::{Event, EventKind, TurnIds};

/// Stamps events with the common fields and sends them, in `seq` order, to
/// the run's stream. Shared by everything in a run that emits.
#[derive(Debug)]
pub struct EventEmitter {
    run_id: Arc<str>,
    depth: u32,
    parent_run_id: Option<Arc<str>>,
    // The lock makes "take the next seq" and "send" one step, so events
    // emitted from parallel tools still reach the stream in `seq` order.
    stamps: Mutex<Stamps>,
    tx: EventSink,
    /// Events kept for the store's event log until the next checkpoint.
    log: Option<Mutex<Vec<Event>>>,
}

/// The last `seq` given and the clock that times events.
#[derive(Debug, Default)]
struct Stamps {
    seq: u64,
    clock: crate::timestamp::Clock,
}

impl EventEmitter {
    /// An emitter for `run_id` writing to `tx`.
    pub fn new(run_id: Arc<str>, depth: u32, tx: mpsc::UnboundedSender<Box<Event>>) -> Self {
        Self::to_sink(run_id, depth, EventSink::Channel(tx))
    }

    pub(crate) fn to_sink(run_id: Arc<str>, depth: u32, tx: EventSink) -> Self {
        Self {
            run_id,
            depth,
            parent_run_id: None,
            stamps: Mutex::new(Stamps::default()),
            tx,
            log: None,
        }
    }

    /// Numbers the next event `last_seq + 1` (a resumed run continues its
    /// stored event log).
    pub fn continuing_after(self, last_seq: u64) -> Self {
        self.stamps.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).seq = last_seq;
        self
    }

    /// Stamps every event with the run that started this one (a sub-agent's).
    pub fn with_parent_run(mut self, parent_run_id: Arc<str>) -> Self {
        self.parent_run_id = Some(parent_run_id);
        self
    }

    /// Also keeps every event for [`EventEmitter::take_log`] (for a store).
    pub fn with_log(mut self) -> Self {
        self.log = Some(Mutex::new(Vec::new()));
        self
    }

    /// The events kept since the last call.
    pub fn take_log(&self) -> Vec<Event> {
        match &self.log {
            Some(log) => std::mem::take(&mut *log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())),
            None => Vec::new(),
        }
    }

    /// Emits one event for `turn`. A stream nobody listens to anymore is not an error.
    pub fn emit(&self, turn: &TurnIds, kind: EventKind) {
        let mut stamps = self.stamps.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let event = self.stamp_locked(&mut stamps, turn, kind);
        // Sent under the lock: parallel emitters reach the stream in `seq` order.
        self.tx.send(Box::new(event));
    }

    /// Numbers (and logs) one event without sending it, for an event that
    /// must reach the stream only after something else — `lifecycle.end`,
    /// sent once the store has recorded the end. Send it with
    /// [`EventEmitter::send`] before anything else is emitted.
    pub fn stamp(&self, turn: &TurnIds, kind: EventKind) -> Event {
        let mut stamps = self.stamps.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.stamp_locked(&mut stamps, turn, kind)
    }

    /// The run's depth.
    pub(crate) fn depth(&self) -> u32 {
        self.depth
    }

    /// Sends an event made by [`EventEmitter::stamp`].
    pub fn send(&self, event: Event) {
        self.tx.send(Box::new(event));
    }

    fn stamp_locked(&self, stamps: &mut Stamps, turn: &TurnIds, kind: EventKind) -> Event {
        stamps.seq += 1;
        let event = Event {
            run_id: self.run_id.clone(),
            turn_id: turn.turn_id.clone(),
            parent_turn_id: turn.parent_turn_id.clone(),
            depth: self.depth,
            parent_run_id: self.parent_run_id.clone(),
            seq: stamps.seq,
            ts: stamps.clock.format(SystemTime::now()),
            kind,
        };
        if let Some(log) = &self.log {
            log.lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(event.clone());
        }
        event
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventKind;

    #[test]
    fn event_serializes_common_fields_and_camel_case_kind_fields() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let emitter = EventEmitter::new("run-1".into(), 0, tx);
        let turn = TurnIds {
            turn_id: "t1".into(),
            parent_turn_id: None,
        };
        emitter.emit(
            &turn,
            EventKind::StepCompleted {
                step: 1,
                max_steps: 10,
                elapsed_seconds: 0.5,
            },
        );
        emitter.emit(&turn, EventKind::ToolCallsComplete { count: 2 });
        let first = *rx.try_recv().unwrap();
        let second = rx.try_recv().unwrap();
        let v = serde_json::to_value(&first).unwrap();
        assert_eq!(v["type"], "step.completed");
        assert_eq!(v["runId"], "run-1");
        assert_eq!(v["turnId"], "t1");
        assert!(v["parentTurnId"].is_null());
        assert_eq!(v["depth"], 0);
        assert_eq!(v["seq"], 1);
        assert_eq!(v["maxSteps"], 10);
        assert_eq!(v["elapsedSeconds"], 0.5);
        assert!(v["ts"].as_str().unwrap().ends_with('Z'));
        assert_eq!(second.seq, 2);
        let back: Event = serde_json::from_value(v).unwrap();
        assert_eq!(back, first);
    }

    #[test]
    fn a_stamped_event_is_numbered_and_logged_at_once_but_sent_only_when_asked() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let emitter = EventEmitter::new("run-1".into(), 0, tx).continuing_after(7).with_log();
        let turn = TurnIds {
            turn_id: "t1".into(),
            parent_turn_id: None,
        };
        let last = emitter.stamp(&turn, EventKind::ToolCallsComplete { count: 0 });
        assert_eq!(last.seq, 8);
        assert_eq!(emitter.take_log(), std::slice::from_ref(&last));
        assert!(rx.try_recv().is_err(), "not sent yet");
        emitter.send(last.clone());
        assert_eq!(*rx.try_recv().unwrap(), last);
    }
}
