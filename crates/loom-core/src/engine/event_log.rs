//! Durable before visible: a run's events reach its stream only once they
//! are in its stored log, so nobody — a gateway's client, `loom run
//! --json` — ever sees an event the log does not have, and a run resumed
//! after a crash numbers its events after the last one anybody saw.
//!
//! Each emitted event joins the run's waiting events; when no write of the
//! run is with the store, the waiting events go to it as one group. The
//! store answers through a callback ([`RunLog::append_events_then`]) that
//! makes the group visible and hands the store the events that gathered
//! meanwhile — so a busy run writes every few milliseconds rather than per
//! event, and no task has to be woken (and wait its turn on a busy
//! gateway) between a commit and the clients. A checkpoint first waits for
//! the log ([`EventLog::flush`]), so the log holds every event up to the
//! state it records.
//!
//! Until the run's record exists ([`EventLog::open`]) events wait: the log
//! belongs to the record. When the store refuses a write, nothing more is
//! shown: the refused group and every later event wait, and the run stops
//! at once (an ask nobody could see would wait for nobody) with a store
//! error. Its end is written with the
//! events that waited ([`EventLog::unwritten`], one more try in the same
//! transaction); only if that write holds do they and the end go out
//! ([`EventLog::end`]). A client never holds an event the log lacks.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::context::{RunContext, StopCause};
use crate::event::Event;
use crate::live_state::RunStream;
use crate::store::{RunLog, StoreError};

/// A run's event log, as the driver holds it.
pub(crate) struct EventLog {
    /// The writer; none without a store.
    writer: Option<Arc<LogWriter>>,
    /// The run's stream: where stored events go.
    visible: RunStream,
}

impl EventLog {
    /// Events go straight to `visible` (a run without a store); returns
    /// the log and the sink its emitter writes to.
    pub(crate) fn direct(visible: RunStream) -> (Self, EventSink) {
        let sink = EventSink::Stream(visible.clone());
        (Self { writer: None, visible }, sink)
    }

    /// The writer of the log of `ctx`'s run in `store`; returns the log and
    /// the sink its emitter writes to. Nothing is written before
    /// [`EventLog::open`]; a refused write stops the run.
    pub(crate) fn start(store: Arc<dyn RunLog>, ctx: RunContext, visible: RunStream) -> (Self, EventSink) {
        let writer = Arc::new(LogWriter {
            store,
            run_id: ctx.run_id_arc(),
            ctx,
            visible: visible.clone(),
            state: Mutex::new(LogState::default()),
        });
        (
            Self {
                writer: Some(writer.clone()),
                visible,
            },
            EventSink::Log(writer),
        )
    }

    /// The run's stream, where events arrive once stored: a sub-agent's
    /// stored events join it.
    pub(crate) fn visible(&self) -> RunStream {
        self.visible.clone()
    }

    /// The run's record exists: the events so far, and from now on, are written.
    pub(crate) fn open(&self) {
        if let Some(writer) = &self.writer {
            let group = {
                let mut state = writer.lock();
                state.opened = true;
                state.next_group()
            };
            writer.write(group);
        }
    }

    /// Waits until every event emitted so far is in the log (and on the
    /// stream). Fails from the first refused write on.
    pub(crate) async fn flush(&self) -> Result<(), StoreError> {
        let Some(writer) = &self.writer else { return Ok(()) };
        let caught_up = {
            let mut state = writer.lock();
            // Before the record exists nothing can be written; the events wait.
            if !state.opened || state.failed.is_some() || state.shown == state.emitted {
                return state.outcome();
            }
            let (caught_up, wait) = oneshot::channel();
            let target = state.emitted;
            state.flushes.push((target, caught_up));
            wait
        };
        caught_up.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// The events a refused write left waiting, for the run's end to
    /// write with it.
    pub(crate) fn unwritten(&self) -> Vec<Event> {
        match &self.writer {
            Some(writer) => {
                let state = writer.lock();
                if state.failed.is_some() {
                    state.waiting.clone()
                } else {
                    Vec::new()
                }
            }
            None => Vec::new(),
        }
    }

    /// Sends the run's last event (`lifecycle.end`, written with the run's
    /// end) to the stream after every event before it, if `stored` says the
    /// end's write holds (with [`EventLog::unwritten`]'s events, which then
    /// go out first); returns once it is there (a sub-agent's end is on the
    /// root's stream before its parent goes on). A run whose record never
    /// came to be has nothing to be stored with: its events go out anyway.
    pub(crate) async fn end(&self, last: Event, stored: bool) {
        let Some(writer) = &self.writer else {
            self.visible.send(Box::new(last));
            return;
        };
        let _ = self.flush().await;
        let mut state = writer.lock();
        if !state.opened || (stored && state.failed.is_some()) {
            writer.show_waiting(&mut state);
        }
        if stored || !state.opened {
            writer.visible.send(Box::new(last));
        }
    }
}

fn stopped() -> StoreError {
    StoreError::Backend("the event log writer has stopped".into())
}

/// What the emitter and the store's callbacks share.
pub(crate) struct LogWriter {
    store: Arc<dyn RunLog>,
    run_id: Arc<str>,
    /// The run, stopped when a write is refused.
    ctx: RunContext,
    visible: RunStream,
    state: Mutex<LogState>,
}

#[derive(Debug, Default)]
struct LogState {
    /// The run's record exists.
    opened: bool,
    /// Emitted, not yet with the store.
    waiting: Vec<Event>,
    /// A group is with the store.
    writing: bool,
    /// Events emitted, and events on the stream, so far.
    emitted: u64,
    shown: u64,
    /// Flushes waiting until `shown` reaches their count.
    flushes: Vec<(u64, oneshot::Sender<Result<(), StoreError>>)>,
    /// The store refused a group: it and every later event wait unshown,
    /// every flush fails and the run stops (its next checkpoint cannot be
    /// written).
    failed: Option<StoreError>,
}

impl LogState {
    /// The waiting events as the next group, if one may go to the store now.
    fn next_group(&mut self) -> Option<Vec<Event>> {
        if !self.opened || self.writing || self.failed.is_some() || self.waiting.is_empty() {
            return None;
        }
        self.writing = true;
        Some(std::mem::take(&mut self.waiting))
    }

    fn outcome(&self) -> Result<(), StoreError> {
        match &self.failed {
            // Of its kind, so the run stops as that kind asks.
            Some(err) if err.interrupts() => Err(err.clone()),
            Some(err) => Err(StoreError::Backend(format!(
                "an earlier write of the run's events failed: {err}"
            ))),
            None => Ok(()),
        }
    }

    /// Answers the flushes the stream has caught up with (all of them once
    /// writes fail).
    fn answer_flushes(&mut self) {
        let (shown, failed) = (self.shown, self.failed.is_some());
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.flushes)
            .into_iter()
            .partition(|(target, _)| failed || *target <= shown);
        self.flushes = waiting;
        for (_, caught_up) in done {
            let _ = caught_up.send(self.outcome());
        }
    }
}

impl std::fmt::Debug for LogWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogWriter")
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

impl LogWriter {
    fn lock(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An emitted event (called under the emitter's lock, in `seq` order).
    pub(crate) fn push(self: &Arc<Self>, event: Box<Event>) {
        let group = {
            let mut state = self.lock();
            state.emitted += 1;
            state.waiting.push(*event);
            state.next_group()
        };
        self.write(group);
    }

    /// Hands `group` to the store. Outside the state's lock: the store may
    /// answer before it returns.
    fn write(self: &Arc<Self>, group: Option<Vec<Event>>) {
        let Some(group) = group else { return };
        let mut answer = AwaitedWrite(Some(self.clone()));
        self.store.clone().append_events_then(
            self.run_id.clone(),
            group,
            Box::new(move |group, result| {
                if let Some(writer) = answer.0.take() {
                    writer.written(group, result);
                }
            }),
        );
    }

    /// The store answered for `group`: stored, it becomes visible and what
    /// gathered meanwhile goes to the store; refused, it waits (unshown)
    /// before what gathered.
    fn written(self: &Arc<Self>, group: Vec<Event>, result: Result<(), StoreError>) {
        let mut refused = None;
        let next = {
            let mut state = self.lock();
            state.writing = false;
            match result {
                Ok(()) => {
                    state.shown += group.len() as u64;
                    for event in group {
                        self.visible.send(Box::new(event));
                    }
                }
                Err(err) => {
                    tracing::error!(run_id = %self.run_id, error = %err, "the run's events could not be stored");
                    state.failed = Some(err.clone());
                    refused = Some(err);
                    state.waiting.splice(0..0, group);
                }
            }
            state.answer_flushes();
            state.next_group()
        };
        if let Some(err) = refused {
            // Outside the lock: stopping wakes whatever waits on the run.
            // A store out of reach (or a run another process took over)
            // leaves the run resumable; any other refusal fails it.
            self.ctx.stop(if err.interrupts() {
                StopCause::Interrupted(format!("its events could not be stored: {err}"))
            } else {
                StopCause::StoreFailed(err.to_string())
            });
        }
        self.write(next);
    }

    /// Sends the waiting events to the stream (stored with the run's end,
    /// or a run without a record).
    fn show_waiting(&self, state: &mut LogState) {
        state.shown += state.waiting.len() as u64;
        for event in state.waiting.drain(..) {
            self.visible.send(Box::new(event));
        }
    }
}

/// The writer, until the store answers. A store that drops the answer
/// instead (its writer thread panicked, say) fails the log rather than
/// leaving every later flush waiting for ever; that group's events are
/// gone with it (never shown).
struct AwaitedWrite(Option<Arc<LogWriter>>);

impl Drop for AwaitedWrite {
    fn drop(&mut self) {
        if let Some(writer) = self.0.take() {
            writer.written(
                Vec::new(),
                Err(StoreError::Backend("the store dropped a write of events".into())),
            );
        }
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        // The run is over. Events of a run whose record never came to be
        // (it failed before) cannot be stored; they still go out.
        let state = self.state.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !state.opened {
            for event in state.waiting.drain(..) {
                self.visible.send(Box::new(event));
            }
        }
    }
}

/// Where an emitter's events go: a channel (a test), a run's event log
/// (stored, then visible), or straight to a run's stream (a run without a
/// store).
#[derive(Debug, Clone)]
pub(crate) enum EventSink {
    // Boxed: the channel allocates its slots in blocks of 32, and 32 whole
    // events (~9 KB) per block held by every live run was a gateway's
    // largest cost per run after its model connections.
    Channel(tokio::sync::mpsc::UnboundedSender<Box<Event>>),
    Log(Arc<LogWriter>),
    Stream(RunStream),
}

impl EventSink {
    /// A sink nobody reads any more is not an error.
    pub(crate) fn send(&self, event: Box<Event>) {
        match self {
            Self::Channel(tx) => {
                let _ = tx.send(event);
            }
            Self::Log(log) => log.push(event),
            Self::Stream(stream) => stream.send(event),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

    use std::time::Duration;

    use async_trait::async_trait;
    use tokio::sync::{mpsc, watch};

    use super::*;
    use crate::event::EventKind;
    use crate::live_state::LiveState;
    use crate::message::ToolCall;
    use crate::metrics::RunMetrics;
    use crate::status::RunStatus;
    use crate::store::{Checkpoint, EventsStored, NoStore, RunRecord, RunSnapshot};
    use crate::tool_result::ToolResult;

    /// A store that holds every group of events until the test answers it.
    #[derive(Default)]
    struct HeldStore {
        held: std::sync::Mutex<Vec<(Vec<Event>, EventsStored)>>,
    }

    impl HeldStore {
        /// Seqs of the groups with the store.
        fn held(&self) -> Vec<Vec<u64>> {
            let held = self.held.lock().unwrap();
            held.iter()
                .map(|(events, _)| events.iter().map(|event| event.seq).collect())
                .collect()
        }

        /// Drops the oldest group unanswered, as a dying store would.
        fn drop_oldest(&self) {
            let dropped = self.held.lock().unwrap().remove(0);
            drop(dropped);
        }

        /// Answers the oldest group.
        fn answer(&self, result: Result<(), StoreError>) {
            let (events, then) = self.held.lock().unwrap().remove(0);
            then(events, result);
        }
    }

    #[async_trait]
    impl RunLog for HeldStore {
        fn append_events_then(self: Arc<Self>, _run_id: Arc<str>, events: Vec<Event>, then: EventsStored) {
            self.held.lock().unwrap().push((events, then));
        }

        async fn append_events(&self, _run_id: &str, _events: &[Event]) -> Result<(), StoreError> {
            unreachable!("the event log appends with append_events_then")
        }

        async fn create_run(&self, run: &RunRecord) -> Result<(), StoreError> {
            NoStore.create_run(run).await
        }

        async fn set_status(&self, run_id: &str, to: RunStatus) -> Result<(), StoreError> {
            NoStore.set_status(run_id, to).await
        }

        async fn checkpoint(&self, checkpoint: &Checkpoint<'_>) -> Result<(), StoreError> {
            NoStore.checkpoint(checkpoint).await
        }

        async fn journal_intent(&self, run_id: &str, call: &ToolCall) -> Result<(), StoreError> {
            NoStore.journal_intent(run_id, call).await
        }

        async fn journal_result(&self, run_id: &str, result: &ToolResult) -> Result<(), StoreError> {
            NoStore.journal_result(run_id, result).await
        }

        async fn finish_run(
            &self,
            run_id: &str,
            status: RunStatus,
            content: Option<&str>,
            metrics: &RunMetrics,
            events: &[Event],
        ) -> Result<(), StoreError> {
            NoStore.finish_run(run_id, status, content, metrics, events).await
        }

        async fn load_run(&self, run_id: &str) -> Result<RunSnapshot, StoreError> {
            NoStore.load_run(run_id).await
        }

        async fn events(&self, run_id: &str, after_seq: u64) -> Result<Vec<Event>, StoreError> {
            NoStore.events(run_id, after_seq).await
        }

        async fn mark_interrupted(&self, run_id: &str, owner: &str) -> Result<bool, StoreError> {
            NoStore.mark_interrupted(run_id, owner).await
        }

        async fn reclaim_run(&self, run_id: &str, owner: &str) -> Result<(), StoreError> {
            NoStore.reclaim_run(run_id, owner).await
        }
    }

    struct Run {
        store: Arc<HeldStore>,
        log: EventLog,
        sink: EventSink,
        stream: mpsc::UnboundedReceiver<Box<Event>>,
        ctx: RunContext,
    }

    impl Run {
        fn new() -> Self {
            let store = Arc::new(HeldStore::default());
            let (events, stream) = mpsc::unbounded_channel();
            let visible = RunStream::new(
                "r".into(),
                Arc::new(watch::Sender::new(LiveState::default())),
                events,
                None,
            );
            let ctx = RunContext::new(
                Some("r".into()),
                None,
                std::env::temp_dir(),
                crate::context::Limits::default(),
                tokio_util::sync::CancellationToken::new(),
            );
            let (log, sink) = EventLog::start(store.clone(), ctx.clone(), visible);
            Self {
                store,
                log,
                sink,
                stream,
                ctx,
            }
        }

        fn emit(&self, seq: u64) {
            self.sink.send(Box::new(event(seq)));
        }

        /// Seqs that reached the stream since the last look.
        fn seen(&mut self) -> Vec<u64> {
            seen(&mut self.stream)
        }
    }

    fn seen(stream: &mut mpsc::UnboundedReceiver<Box<Event>>) -> Vec<u64> {
        let mut seen = Vec::new();
        while let Ok(event) = stream.try_recv() {
            seen.push(event.seq);
        }
        seen
    }

    fn event(seq: u64) -> Event {
        Event {
            run_id: "r".into(),
            turn_id: "t".into(),
            parent_turn_id: None,
            depth: 0,
            parent_run_id: None,
            seq,
            ts: String::new(),
            kind: EventKind::IterationStart { iteration: 1 },
        }
    }

    fn refused() -> Result<(), StoreError> {
        Err(StoreError::Backend("disk full".into()))
    }

    #[test]
    fn events_show_once_stored_and_gather_while_a_write_is_out() {
        let mut run = Run::new();
        run.log.open();
        run.emit(1);
        assert_eq!(run.store.held(), [vec![1]]);
        run.emit(2);
        run.emit(3);
        assert_eq!(run.store.held(), [vec![1]], "one write of the run at a time");
        assert_eq!(run.seen(), Vec::<u64>::new(), "nothing shows before it is stored");
        run.store.answer(Ok(()));
        assert_eq!(run.seen(), [1]);
        assert_eq!(run.store.held(), [vec![2, 3]], "what gathered goes next, as one group");
        run.store.answer(Ok(()));
        assert_eq!(run.seen(), [2, 3]);
        assert!(run.store.held().is_empty());
    }

    #[test]
    fn events_before_the_record_wait_and_go_out_unstored_if_it_never_comes() {
        let Run {
            store,
            log,
            sink,
            mut stream,
            ..
        } = Run::new();
        sink.send(Box::new(event(1)));
        sink.send(Box::new(event(2)));
        assert!(store.held().is_empty());
        drop(log);
        drop(sink);
        assert_eq!(seen(&mut stream), [1, 2]);

        let run = Run::new();
        run.emit(1);
        run.log.open();
        assert_eq!(run.store.held(), [vec![1]], "opening writes what waited");
    }

    #[tokio::test]
    async fn a_flush_waits_for_the_events_emitted_before_it_only() {
        let Run {
            store,
            log,
            sink,
            mut stream,
            ..
        } = Run::new();
        log.open();
        sink.send(Box::new(event(1)));
        let flush = log.flush();
        tokio::pin!(flush);
        let pending = tokio::time::timeout(Duration::from_millis(20), &mut flush).await;
        assert!(pending.is_err(), "event 1 is not stored yet");
        sink.send(Box::new(event(2)));
        store.answer(Ok(()));
        flush.await.unwrap();
        assert_eq!(
            seen(&mut stream),
            [1],
            "flushed: event 1 is on the stream; 2 is still being written"
        );
        assert_eq!(store.held(), [vec![2]]);
    }

    #[tokio::test]
    async fn a_store_out_of_reach_or_a_run_taken_over_leaves_the_run_resumable() {
        for err in [
            StoreError::Unavailable("redis: broken pipe".into()),
            StoreError::Fenced("r".into()),
        ] {
            let run = Run::new();
            run.log.open();
            run.emit(1);
            run.store.answer(Err(err.clone()));
            assert!(
                matches!(run.ctx.stop_cause(), Some(StopCause::Interrupted(why)) if why.contains(&err.to_string())),
                "{err}: {:?}",
                run.ctx.stop_cause()
            );
            // Of its kind still, for the checkpoint and the end that follow.
            assert_eq!(run.log.flush().await.err().map(|e| e.interrupts()), Some(true));
        }
    }

    #[tokio::test]
    async fn after_a_refused_write_nothing_more_shows_until_the_end_is_stored_with_it() {
        let mut run = Run::new();
        run.log.open();
        run.emit(1);
        run.emit(2);
        assert!(!run.ctx.is_cancelled());
        run.store.answer(refused());
        assert!(
            matches!(run.ctx.stop_cause(), Some(StopCause::StoreFailed(why)) if why.contains("disk full")),
            "the run stops at once: {:?}",
            run.ctx.stop_cause()
        );
        assert_eq!(
            run.seen(),
            Vec::<u64>::new(),
            "neither the refused group nor what waited"
        );
        assert!(run.log.flush().await.is_err());
        run.emit(3);
        assert_eq!(run.seen(), Vec::<u64>::new());
        assert!(run.store.held().is_empty(), "nothing is written after a refusal");
        assert!(run.log.flush().await.is_err());
        // The end's write carries them; once it holds, they and the end go out.
        assert_eq!(
            run.log.unwritten().iter().map(|event| event.seq).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        run.log.end(event(4), true).await;
        assert_eq!(run.seen(), [1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn an_end_that_could_not_be_stored_is_not_shown() {
        let mut run = Run::new();
        run.log.open();
        run.emit(1);
        run.store.answer(refused());
        run.log.end(event(2), false).await;
        assert_eq!(run.seen(), Vec::<u64>::new());

        let mut run = Run::new();
        run.log.open();
        run.emit(1);
        run.store.answer(Ok(()));
        run.log.end(event(2), false).await;
        assert_eq!(run.seen(), [1], "the stored events, not the end");
    }

    #[tokio::test]
    async fn a_write_the_store_drops_unanswered_fails_the_log_instead_of_hanging() {
        let mut run = Run::new();
        run.log.open();
        run.emit(1);
        run.emit(2);
        run.store.drop_oldest();
        let flushed = tokio::time::timeout(Duration::from_secs(5), run.log.flush()).await;
        assert!(flushed.expect("the flush hung").is_err());
        assert_eq!(run.seen(), Vec::<u64>::new(), "nothing the store did not take shows");
        assert_eq!(
            run.log.unwritten().iter().map(|event| event.seq).collect::<Vec<_>>(),
            [2]
        );
    }

    #[tokio::test]
    async fn a_stored_end_follows_every_event_before_it() {
        let mut run = Run::new();
        run.log.open();
        run.emit(1);
        let store = run.store.clone();
        let answer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            store.answer(Ok(()));
        });
        run.log.end(event(2), true).await;
        answer.await.unwrap();
        assert_eq!(run.seen(), [1, 2]);
    }
}
