//! Durable before visible: a run's events reach its stream only once they
//! are in its stored log, so nobody — a gateway's client, `loom run
//! --json` — ever sees an event the log does not have, and a run resumed
//! after a crash numbers its events after the last one anybody saw.
//!
//! The emitter sends each event to a writer task; the writer appends
//! everything that has arrived in one write (a group: while one write is
//! in flight the next group gathers, so a busy run writes every few
//! milliseconds rather than per event), then passes the group on. A
//! checkpoint first waits for the writer ([`EventLog::flush`]), so the log
//! holds every event up to the state it records.
//!
//! Until the run's record exists ([`EventLog::open`]) events wait: the log
//! belongs to the record. When the store refuses a write the events still
//! go on, so the run's client learns why the run stops: the next checkpoint
//! fails and the run ends with a store error.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::event::{Event, EventSink};
use crate::live_state::RunStream;
use crate::store::{Store, StoreError};

/// A run's event log writer, as the driver holds it.
pub(crate) struct EventLog {
    /// Commands to the writer; none without a store.
    writer: Option<mpsc::UnboundedSender<Command>>,
    /// The run's stream: where stored events go.
    visible: RunStream,
}

enum Command {
    /// The run's record exists: events may be written.
    Open,
    /// Answer once every event sent so far is written.
    Flush(oneshot::Sender<Result<(), StoreError>>),
    /// An event the store recorded already, after every event before it;
    /// answered once it is on the stream.
    Stored(Box<Event>, oneshot::Sender<()>),
}

impl EventLog {
    /// Events go straight to `visible` (a run without a store); returns
    /// the log and the sink its emitter writes to.
    pub(crate) fn direct(visible: RunStream) -> (Self, EventSink) {
        let sink = EventSink::Stream(visible.clone());
        (Self { writer: None, visible }, sink)
    }

    /// Starts the writer of `run_id`'s log in `store`; returns the log and
    /// the sink its emitter writes to. Nothing is written before
    /// [`EventLog::open`].
    pub(crate) fn start(store: Arc<dyn Store>, run_id: Arc<str>, visible: RunStream) -> (Self, EventSink) {
        let (events_tx, events) = mpsc::unbounded_channel();
        let (commands_tx, commands) = mpsc::unbounded_channel();
        let writer = Writer {
            store,
            run_id,
            visible: visible.clone(),
            opened: false,
            group: Vec::new(),
            failed: None,
        };
        tokio::spawn(writer.run(events, commands));
        (
            Self {
                writer: Some(commands_tx),
                visible,
            },
            EventSink::Channel(events_tx),
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
            let _ = writer.send(Command::Open);
        }
    }

    /// Waits until every event emitted so far is in the log.
    pub(crate) async fn flush(&self) -> Result<(), StoreError> {
        let Some(writer) = &self.writer else { return Ok(()) };
        let (ack, done) = oneshot::channel();
        if writer.send(Command::Flush(ack)).is_err() {
            return Err(StoreError::Backend("the event log writer has stopped".into()));
        }
        done.await
            .unwrap_or_else(|_| Err(StoreError::Backend("the event log writer has stopped".into())))
    }

    /// Sends an event the store has already recorded (`lifecycle.end`,
    /// written with the run's end) to the stream, after every event before
    /// it; returns once it is there (a sub-agent's end is on the root's
    /// stream before its parent goes on).
    pub(crate) async fn send_stored(&self, event: Event) {
        let Some(writer) = &self.writer else {
            self.visible.send(Box::new(event));
            return;
        };
        let (ack, sent) = oneshot::channel();
        match writer.send(Command::Stored(Box::new(event), ack)) {
            Ok(()) => {
                let _ = sent.await;
            }
            Err(mpsc::error::SendError(Command::Stored(event, _))) => self.visible.send(event),
            Err(_) => {}
        }
    }
}

struct Writer {
    store: Arc<dyn Store>,
    run_id: Arc<str>,
    visible: RunStream,
    opened: bool,
    /// Events received and not written yet.
    group: Vec<Event>,
    /// The store refused a group: the log has a gap from then on, so every
    /// flush fails and the run stops (its next checkpoint cannot be written).
    failed: Option<String>,
}

impl Writer {
    async fn run(
        mut self,
        mut events: mpsc::UnboundedReceiver<Box<Event>>,
        mut commands: mpsc::UnboundedReceiver<Command>,
    ) {
        let (mut events_done, mut commands_done) = (false, false);
        loop {
            tokio::select! {
                // Commands first: a flush must see every event sent before it,
                // and those are in `events` already (sending is synchronous).
                biased;
                command = commands.recv(), if !commands_done => match command {
                    Some(Command::Open) => {
                        self.opened = true;
                        self.gather(&mut events);
                        let _ = self.write().await;
                    }
                    Some(Command::Flush(ack)) => {
                        self.gather(&mut events);
                        let _ = ack.send(self.write().await);
                    }
                    Some(Command::Stored(event, ack)) => {
                        self.gather(&mut events);
                        let _ = self.write().await;
                        if !self.opened {
                            self.pass_on();
                        }
                        self.visible.send(event);
                        let _ = ack.send(());
                    }
                    None => commands_done = true,
                },
                event = events.recv(), if !events_done => match event {
                    Some(event) => {
                        self.group.push(*event);
                        self.gather(&mut events);
                        let _ = self.write().await;
                    }
                    None => events_done = true,
                },
                else => break,
            }
        }
        // The run is over. Events of a run whose record never came to be
        // (it failed before) cannot be stored; they still go out.
        if self.opened {
            let _ = self.write().await;
        } else {
            self.pass_on();
        }
    }

    /// Takes every event that has arrived.
    fn gather(&mut self, events: &mut mpsc::UnboundedReceiver<Box<Event>>) {
        while let Ok(event) = events.try_recv() {
            self.group.push(*event);
        }
    }

    /// Writes the group (once the record exists) and passes it on. Fails
    /// from the first refused write on.
    async fn write(&mut self) -> Result<(), StoreError> {
        if self.opened && !self.group.is_empty() && self.failed.is_none() {
            if let Err(err) = self.store.append_events(&self.run_id, &self.group).await {
                tracing::error!(run_id = %self.run_id, error = %err, "the run's events could not be stored");
                self.failed = Some(err.to_string());
            }
        }
        if self.opened {
            self.pass_on();
        }
        match &self.failed {
            Some(err) => Err(StoreError::Backend(format!(
                "an earlier write of the run's events failed: {err}"
            ))),
            None => Ok(()),
        }
    }

    fn pass_on(&mut self) {
        for event in self.group.drain(..) {
            self.visible.send(Box::new(event));
        }
    }
}
