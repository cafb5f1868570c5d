//! The event fan-out of live runs: every event reaches every subscriber of
//! its run, and a subscriber joins at any `seq` with no gap and no
//! duplicate — the events the store already holds come from the store,
//! the rest from the feed's buffer, then live.
//!
//! Behind the [`EventFeed`] trait so that a later step can fan out through
//! Redis (docs/server.md) without touching the protocol code.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use loom_core::Event;
use tokio::sync::mpsc;

/// One subscriber's share of a run: what to read from the store, the
/// buffered events after that, then the live ones.
#[derive(Debug)]
pub struct Joined {
    /// Read the store's events with `seq` in `(after, store_until]` first
    /// (`None`: nothing to read there).
    pub store_until: Option<u64>,
    /// Then these.
    pub buffered: Vec<Arc<Event>>,
    /// Then these, as they come; closed when the run ends (or, with
    /// [`Joined::lagged`] set, when the subscriber fell too far behind).
    pub live: mpsc::Receiver<Arc<Event>>,
    /// Set when the feed dropped this subscriber for being too slow.
    pub lagged: Arc<AtomicBool>,
}

/// The fan-out of live runs' events.
pub trait EventFeed: Send + Sync {
    /// A run starts (or is queued): its events will be numbered after `last_seq`.
    fn open(&self, run_id: &str, last_seq: u64);
    /// A sub-agent of `parent_run_id` starts (or resumes): like
    /// [`EventFeed::open`], and its events also reach the subscribers of
    /// its parent and every ancestor, live.
    fn open_under(&self, run_id: &str, parent_run_id: &str, last_seq: u64);
    /// One event of a live run, in `seq` order.
    fn publish(&self, event: Arc<Event>);
    /// The store holds the run's events up to `seq`: they may leave memory.
    fn persisted(&self, run_id: &str, seq: u64);
    /// The run ended (its store holds all its events, when it has a store):
    /// subscribers' streams end after what they have.
    fn close(&self, run_id: &str);
    /// The run never started (refused, or dropped from the queue): its
    /// entry goes without taking a finished run's place.
    fn forget(&self, run_id: &str);
    /// Joins a run after `after`; `None` when the feed does not hold it (a
    /// finished run: read the store).
    fn join(&self, run_id: &str, after: u64) -> Option<Joined>;
    /// Events buffered in memory over all runs (for the metrics).
    fn buffered(&self) -> usize;
}

struct Subscriber {
    tx: mpsc::Sender<Arc<Event>>,
    lagged: Arc<AtomicBool>,
}

#[derive(Default)]
struct RunFeed {
    /// Events not yet known to be in the store (all of them without a store).
    tail: VecDeque<Arc<Event>>,
    last_seq: u64,
    subscribers: Vec<Subscriber>,
    closed: bool,
    /// The run that started this one, for a sub-agent.
    parent: Option<String>,
}

/// Offers `event` to `subscribers`; one that cannot take it is dropped as
/// lagging (it resubscribes from the last seq it has), never buffered for.
fn deliver(subscribers: &mut Vec<Subscriber>, event: &Arc<Event>) {
    subscribers.retain(|subscriber| match subscriber.tx.try_send(event.clone()) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Full(_)) => {
            subscriber.lagged.store(true, Ordering::SeqCst);
            false
        }
        Err(mpsc::error::TrySendError::Closed(_)) => false,
    });
}

/// The in-process feed.
pub struct LocalFeed {
    runs: Mutex<HashMap<String, RunFeed>>,
    /// Without a store the feed is the only log: it keeps every event, and
    /// this many finished runs.
    keep_all: Option<usize>,
    finished: Mutex<VecDeque<String>>,
    buffer: usize,
}

impl LocalFeed {
    /// A feed whose subscribers may fall `buffer` events behind.
    /// `keep_finished` (without a store): keep every event, and this many
    /// finished runs' logs.
    pub fn new(buffer: usize, keep_finished: Option<usize>) -> Self {
        Self {
            runs: Mutex::default(),
            keep_all: keep_finished,
            finished: Mutex::default(),
            buffer: buffer.max(1),
        }
    }

    fn runs(&self) -> MutexGuard<'_, HashMap<String, RunFeed>> {
        self.runs.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl EventFeed for LocalFeed {
    fn open(&self, run_id: &str, last_seq: u64) {
        self.runs().entry(run_id.to_string()).or_insert_with(|| RunFeed {
            last_seq,
            ..RunFeed::default()
        });
    }

    fn open_under(&self, run_id: &str, parent_run_id: &str, last_seq: u64) {
        let mut runs = self.runs();
        let run = runs.entry(run_id.to_string()).or_default();
        run.last_seq = last_seq;
        run.closed = false;
        run.parent = Some(parent_run_id.to_string());
    }

    fn publish(&self, event: Arc<Event>) {
        let mut runs = self.runs();
        let Some(run) = runs.get_mut(&*event.run_id) else {
            return;
        };
        run.last_seq = event.seq;
        deliver(&mut run.subscribers, &event);
        let mut ancestor = run.parent.clone();
        run.tail.push_back(event.clone());
        // A sub-agent's events reach its ancestors' subscribers live, with
        // their own run id and seq (each run's own cursor resumes it).
        while let Some(id) = ancestor {
            let Some(run) = runs.get_mut(&id) else { break };
            deliver(&mut run.subscribers, &event);
            ancestor = run.parent.clone();
        }
    }

    fn persisted(&self, run_id: &str, seq: u64) {
        if self.keep_all.is_some() {
            return;
        }
        if let Some(run) = self.runs().get_mut(run_id) {
            while run.tail.front().is_some_and(|event| event.seq <= seq) {
                run.tail.pop_front();
            }
        }
    }

    fn close(&self, run_id: &str) {
        let mut runs = self.runs();
        match self.keep_all {
            None => {
                runs.remove(run_id);
            }
            Some(keep) => {
                if let Some(run) = runs.get_mut(run_id) {
                    run.closed = true;
                    run.subscribers.clear();
                    run.tail.shrink_to_fit();
                }
                let mut finished = self.finished.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                finished.push_back(run_id.to_string());
                while finished.len() > keep {
                    if let Some(old) = finished.pop_front() {
                        runs.remove(&old);
                    }
                }
            }
        }
    }

    fn forget(&self, run_id: &str) {
        self.runs().remove(run_id);
    }

    fn join(&self, run_id: &str, after: u64) -> Option<Joined> {
        let mut runs = self.runs();
        let run = runs.get_mut(run_id)?;
        let buffered: Vec<Arc<Event>> = run.tail.iter().filter(|e| e.seq > after).cloned().collect();
        // The store holds everything before the buffer's first event.
        let boundary = run
            .tail
            .front()
            .map_or(run.last_seq, |first| first.seq.saturating_sub(1));
        let store_until = (self.keep_all.is_none() && boundary > after).then_some(boundary);
        let (tx, live) = mpsc::channel(self.buffer);
        let lagged = Arc::new(AtomicBool::new(false));
        if !run.closed {
            run.subscribers.push(Subscriber {
                tx,
                lagged: lagged.clone(),
            });
        }
        Some(Joined {
            store_until,
            buffered,
            live,
            lagged,
        })
    }

    fn buffered(&self) -> usize {
        self.runs().values().map(|run| run.tail.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loom_core::EventKind;

    fn event(seq: u64) -> Arc<Event> {
        Arc::new(Event {
            run_id: "r".into(),
            turn_id: "t".into(),
            parent_turn_id: None,
            depth: 0,
            parent_run_id: None,
            seq,
            ts: String::new(),
            kind: EventKind::IterationStart { iteration: seq as u32 },
        })
    }

    #[test]
    fn a_joiner_reads_the_store_then_the_buffer_then_live_events() {
        let feed = LocalFeed::new(8, None);
        feed.open("r", 0);
        for seq in 1..=5 {
            feed.publish(event(seq));
        }
        feed.persisted("r", 3);
        let mut joined = feed.join("r", 1).unwrap();
        assert_eq!(joined.store_until, Some(3));
        assert_eq!(joined.buffered.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![4, 5]);
        feed.publish(event(6));
        assert_eq!(joined.live.try_recv().unwrap().seq, 6);
        feed.close("r");
        assert!(joined.live.try_recv().is_err());
        assert!(feed.join("r", 0).is_none());
    }

    #[test]
    fn a_subscriber_that_falls_behind_is_dropped_and_told() {
        let feed = LocalFeed::new(2, None);
        feed.open("r", 0);
        let joined = feed.join("r", 0).unwrap();
        for seq in 1..=3 {
            feed.publish(event(seq));
        }
        assert!(joined.lagged.load(Ordering::SeqCst));
    }
}
