//! The runs' events on their way to Redis, gathered: one task takes every
//! append waiting — each run has at most one in flight — sends them as one
//! pipeline (one round trip, one write to Redis's log for all of them),
//! the next batch going out while the last is answered, and calls each
//! run's callback itself when its answer is in. A task per
//! append, as the `Store` trait's default does, paid a round trip each and,
//! on a busy gateway, a wait for its turn to run after every answer.

use std::sync::Arc;

use futures_util::stream::{FuturesUnordered, StreamExt};
use loom_core::{Event, EventsStored, StoreError};
use redis::aio::ConnectionManager;
use redis::{RedisResult, Script};
use tokio::sync::mpsc;

/// Appends sent in one pipeline at most (a pipeline's answer is read whole).
const MAX_BATCH: usize = 256;

/// Pipelines sent and not yet answered, at most.
const MAX_IN_FLIGHT: usize = 16;

/// One run's events to append.
pub(crate) struct Append {
    pub run_id: Arc<str>,
    pub run_key: String,
    pub events_key: String,
    pub rows: Vec<(u64, String)>,
    /// The fence argument (`scripts::FENCE`).
    pub fence: String,
    /// The lease's guard, which counts a refusal (`RedisStore::write_error`).
    pub guard: Option<Arc<loom_core::LeaseGuard>>,
    pub events: Vec<Event>,
    pub then: EventsStored,
}

/// The handle of the appending task; the task ends when every handle is dropped.
#[derive(Clone)]
pub(crate) struct Appender {
    appends: mpsc::UnboundedSender<Append>,
}

impl Appender {
    /// Starts the task on the current runtime, appending with `script`
    /// (`scripts::append_events`) over `conn`.
    pub(crate) fn start(conn: ConnectionManager, script: Script) -> Self {
        let (appends, waiting) = mpsc::unbounded_channel();
        tokio::spawn(run(conn, script, waiting));
        Self { appends }
    }

    /// Queues `append`; its callback hears of the outcome (at once if the
    /// task has ended).
    pub(crate) fn send(&self, append: Append) {
        if let Err(mpsc::error::SendError(append)) = self.appends.send(append) {
            (append.then)(
                append.events,
                Err(StoreError::Backend("the store's appender has stopped".into())),
            );
        }
    }
}

async fn run(conn: ConnectionManager, script: Script, mut waiting: mpsc::UnboundedReceiver<Append>) {
    let script = Arc::new(script);
    // Batches in flight at once: the next goes out while the last is
    // answered (one connection, answered in order), so a batch waits for
    // its own round trip only. Their callbacks run here, on this task.
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    while open || !in_flight.is_empty() {
        tokio::select! {
            taken = async {
                let mut batch = Vec::with_capacity(MAX_BATCH);
                let taken = waiting.recv_many(&mut batch, MAX_BATCH).await;
                (taken, batch)
            }, if open && in_flight.len() < MAX_IN_FLIGHT => match taken {
                (0, _) => open = false,
                (_, batch) => {
                    let batch = without_stale(batch);
                    if !batch.is_empty() {
                        in_flight.push(send(conn.clone(), script.clone(), batch));
                    }
                }
            },
            Some((batch, answers)) = in_flight.next() => answer(batch, answers),
        }
    }
}

/// The appends of `batch` that may still go out: one whose lease was
/// given up (or whose time ran out, the worker frozen while it waited
/// here) is refused now, unsent.
fn without_stale(batch: Vec<Append>) -> Vec<Append> {
    let (stale, fresh): (Vec<Append>, Vec<Append>) = batch
        .into_iter()
        .partition(|append| append.guard.as_ref().is_some_and(|guard| guard.refuses_writes()));
    for append in stale {
        if let Some(guard) = &append.guard {
            guard.count_refused(false);
        }
        let refused = StoreError::Fenced(append.run_id.to_string());
        (append.then)(append.events, Err(refused));
    }
    fresh
}

/// Sends `batch` as one pipeline; the batch back with each call's answer.
async fn send(
    mut conn: ConnectionManager,
    script: Arc<Script>,
    batch: Vec<Append>,
) -> (Vec<Append>, RedisResult<Vec<RedisResult<String>>>) {
    // Built before the await: the callbacks in the batch stay put.
    let pipe = pipeline(&script, &batch);
    let answers = match pipe.query_async::<Vec<RedisResult<String>>>(&mut conn).await {
        // Redis restarted and forgot its scripts: load it, once more.
        Ok(answers) if answers.iter().any(is_no_script) => match script.load_async(&mut conn).await {
            Ok(_) => pipe.query_async(&mut conn).await,
            Err(err) => Err(err),
        },
        other => other,
    };
    (batch, answers)
}

/// Tells each run of `batch` how its append went.
fn answer(batch: Vec<Append>, answers: RedisResult<Vec<RedisResult<String>>>) {
    match answers {
        Ok(answers) => {
            for (append, answer) in batch.into_iter().zip(answers) {
                let result = match answer.as_deref() {
                    Ok("ok") => Ok(()),
                    Ok(_) => Err(StoreError::NotFound(append.run_id.to_string())),
                    Err(err) => Err(crate::errors::backend(err.clone())),
                };
                if let (Err(StoreError::Fenced(_)), Some(guard)) = (&result, &append.guard) {
                    guard.count_refused(true);
                }
                (append.then)(append.events, result);
            }
        }
        Err(err) => {
            let err = crate::errors::backend(err);
            for append in batch {
                (append.then)(append.events, Err(err.clone()));
            }
        }
    }
}

/// The batch as one pipeline of the script's calls, each answered apart.
fn pipeline(script: &Script, batch: &[Append]) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for append in batch {
        let call = pipe
            .cmd("EVALSHA")
            .arg(script.get_hash())
            .arg(2)
            .arg(&append.run_key)
            .arg(&append.events_key)
            .arg(append.rows.len());
        for (seq, body) in &append.rows {
            call.arg(seq).arg(body);
        }
        call.arg(&append.fence);
    }
    pipe
}

fn is_no_script(answer: &RedisResult<String>) -> bool {
    matches!(answer, Err(err) if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript))
}
