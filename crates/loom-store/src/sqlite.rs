//! `SqliteStore`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use loom_core::{
    Admissions, AuditEntry, AuditLog, AuditQuery, Checkpoint, Event, EventsStored, JournalEntry, KeyedRequest, Message,
    ParentLink, QueuedRun, RunIndex, RunLog, RunMetrics, RunQuery, RunRecord, RunSnapshot, RunState, RunStatus, Store,
    StoreError, ToolCall, ToolResult,
};
use rusqlite::{params, Connection, ErrorCode, OptionalExtension, TransactionBehavior};

use crate::group_commit::{Done, GroupCommit};
use crate::schema::{MIGRATIONS, SCHEMA_VERSION};
use crate::wal_checkpointer::WalCheckpointer;

/// The columns [`row_to_record`] reads, in its order.
const RUN_COLUMNS: &str =
    "id, session_id, prompt, model, status, owner, started_ms, ended_ms, content, metrics, workspace, principal, parent_run_id, parent_turn_id, accepted_ms";

/// How long idempotency keys are kept (Stripe's choice, and long enough
/// for any client's retries).
const REQUEST_KEY_RETENTION_MS: u64 = 24 * 60 * 60 * 1000;

/// How long a write waits for another process's lock.
const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The connection's page cache, in KiB (SQLite's default is 2 000).
const CACHE_KIB: i64 = 8 * 1024;

/// A SQLite database file (WAL mode), shared safely by several processes.
///
/// Every write goes through one writer thread, which commits the writes
/// waiting in groups (`group_commit.rs`); reads have a connection of their
/// own, so a read never waits for a commit nor a commit for a read (in WAL
/// mode a reader sees the last commit before it began).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// The readers' connection (the writer's is its thread's).
    reader: Arc<Mutex<Connection>>,
    /// Every write of every run, committed in groups; it owns the
    /// checkpointer that moves the log into the database.
    group: Arc<GroupCommit>,
    path: PathBuf,
    busy: Duration,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`, migrating its
    /// schema forward. Blocking: call it off the async threads.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with_timeout(path, DEFAULT_BUSY_TIMEOUT)
    }

    /// Like [`SqliteStore::open`] with a busy timeout.
    pub fn open_with_timeout(path: impl AsRef<Path>, busy: Duration) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|err| StoreError::Backend(format!("{}: {err}", parent.display())))?;
        }
        let shown = path.display().to_string();
        let fail = |err: rusqlite::Error| map_error(err, &shown, busy);
        let mut conn = Connection::open(&path).map_err(fail)?;
        conn.busy_timeout(busy).map_err(fail)?;
        // Reading the version is the first touch of the file: a file that is
        // not a database fails here, before anything is written.
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(fail)?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        conn.pragma_update(None, "journal_mode", "WAL").map_err(fail)?;
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(fail)?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(fail)?;
        // The checkpointer's thread moves the log into the database
        // (wal_checkpointer.rs), never the writer.
        conn.pragma_update(None, "wal_autocheckpoint", 0).map_err(fail)?;
        // Runs write all over the events and messages tables (their rows
        // are ordered by run): with SQLite's 2 MB default the pages of a
        // thousand live runs do not fit, and every write reads its page
        // back from the log.
        conn.pragma_update(None, "cache_size", -CACHE_KIB).map_err(fail)?;
        // Every statement the writer runs stays compiled (rusqlite keeps 16
        // by default; the store has more, and the listings vary theirs).
        conn.set_prepared_statement_cache_capacity(64);
        if version < SCHEMA_VERSION {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(fail)?;
            // Another process may have migrated while we waited for the lock.
            let current: i64 = tx
                .query_row("PRAGMA user_version", [], |row| row.get(0))
                .map_err(fail)?;
            for migration in &MIGRATIONS[current.max(0) as usize..] {
                tx.execute_batch(migration).map_err(fail)?;
            }
            tx.pragma_update(None, "user_version", SCHEMA_VERSION).map_err(fail)?;
            tx.commit().map_err(fail)?;
        }
        let reader = Connection::open(&path).map_err(fail)?;
        reader.busy_timeout(busy).map_err(fail)?;
        reader.pragma_update(None, "query_only", "ON").map_err(fail)?;
        reader.pragma_update(None, "cache_size", -CACHE_KIB).map_err(fail)?;
        reader.set_prepared_statement_cache_capacity(64);
        let conn = Arc::new(Mutex::new(conn));
        let reader = Arc::new(Mutex::new(reader));
        let shown = path.display().to_string();
        let checkpointer = Arc::new(WalCheckpointer::start(&path, busy, conn.clone(), reader.clone())?);
        let group = GroupCommit::start(conn, checkpointer, move |err| map_error(err, &shown, busy))?;
        Ok(Self {
            reader,
            group: Arc::new(group),
            path,
            busy,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `read` on the blocking pool with the readers' connection, in
    /// one read transaction: what it reads is one moment's state, whatever
    /// the writer commits meanwhile.
    async fn read<T, F>(&self, read: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let reader = self.reader.clone();
        let fail = self.fail();
        tokio::task::spawn_blocking(move || {
            let mut conn = reader.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let snapshot = conn.transaction().map_err(&fail)?;
            let result = read(&snapshot);
            // Nothing to keep: ending it lets the log start over.
            let _ = snapshot.finish();
            result
        })
        .await
        .map_err(|err| StoreError::Backend(format!("the store's worker failed: {err}")))?
    }

    /// Runs `write` in the writer's next group and returns what it
    /// returned. It may run twice (see [`GroupCommit`]): the last run's
    /// value is the one committed.
    async fn write<T, F>(&self, op: &'static str, write: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Fn(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let written = Arc::new(Mutex::new(None));
        let slot = written.clone();
        self.group
            .write(
                op,
                Box::new(move |tx| {
                    let value = write(tx)?;
                    *slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(value);
                    Ok(())
                }),
            )
            .await?;
        let value = written.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        value.ok_or_else(|| StoreError::Backend("the store's writer answered without writing".into()))
    }

    async fn select_runs(&self, sql: String, param: Option<String>) -> Result<Vec<RunRecord>, StoreError> {
        let fail = self.fail();
        self.read(move |conn| {
            let mut select = conn.prepare_cached(&sql).map_err(&fail)?;
            let rows = match &param {
                Some(param) => select.query_map(params![param], row_to_record),
                None => select.query_map([], row_to_record),
            }
            .map_err(&fail)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(&fail)?;
            rows.into_iter().map(record).collect()
        })
        .await
    }

    fn fail(&self) -> impl Fn(rusqlite::Error) -> StoreError + Send + Clone + 'static {
        let shown = self.path.display().to_string();
        let busy = self.busy;
        move |err| map_error(err, &shown, busy)
    }
}

fn map_error(err: rusqlite::Error, path: &str, busy: Duration) -> StoreError {
    if let rusqlite::Error::SqliteFailure(failure, message) = &err {
        match failure.code {
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => {
                return StoreError::Locked {
                    waited_ms: busy.as_millis() as u64,
                }
            }
            // Space may come back (a log rotated, a file removed): the
            // write may succeed later, as when a server is back.
            ErrorCode::DiskFull => return StoreError::Unavailable(format!("the disk holding {path} is full")),
            ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt => {
                return StoreError::Corrupt {
                    path: path.to_string(),
                    message: message.clone().unwrap_or_else(|| failure.to_string()),
                }
            }
            _ => {}
        }
    }
    StoreError::Backend(err.to_string())
}

fn json<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|err| StoreError::Backend(format!("cannot encode: {err}")))
}

fn parse<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|err| StoreError::Backend(format!("cannot decode a stored row: {err}")))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn status_of(text: &str) -> Result<RunStatus, StoreError> {
    parse(&format!("\"{text}\""))
}

/// The run's status after a move to `to`, if docs/architecture.md allows it (read
/// inside the caller's write transaction, so no other writer interleaves).
fn checked_transition(
    tx: &Connection,
    run_id: &str,
    to: RunStatus,
    fail: &impl Fn(rusqlite::Error) -> StoreError,
) -> Result<RunStatus, StoreError> {
    let current: Option<String> = tx
        .prepare_cached("SELECT status FROM runs WHERE id = ?1")
        .and_then(|mut select| select.query_row(params![run_id], |row| row.get(0)).optional())
        .map_err(fail)?;
    let current = status_of(&current.ok_or_else(|| StoreError::NotFound(run_id.to_string()))?)?;
    Ok(current.transition(to)?)
}

/// The run's session, if it is new.
fn insert_session(tx: &Connection, run: &RunRecord) -> Result<usize, rusqlite::Error> {
    tx.prepare_cached("INSERT OR IGNORE INTO sessions (id, created_ms) VALUES (?1, ?2)")?
        .execute(params![run.session_id, run.started_ms as i64])
}

/// Remembers an idempotency key (the first answer for a key stays), and
/// forgets keys past their retention.
fn insert_request_key(tx: &Connection, owner: &str, key: &str, request: &KeyedRequest) -> Result<(), rusqlite::Error> {
    let now = now_ms();
    tx.prepare_cached("DELETE FROM request_keys WHERE created_ms < ?1")?
        .execute(params![now.saturating_sub(REQUEST_KEY_RETENTION_MS) as i64])?;
    // The digest is stored as the same 64 bits, signed: SQLite integers are.
    tx.prepare_cached(
        "INSERT INTO request_keys (owner, key, digest, run_id, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (owner, key) DO NOTHING",
    )?
    .execute(params![owner, key, request.digest as i64, request.run_id, now as i64])?;
    Ok(())
}

/// Where a checkpoint's new messages go in its run's history. `COLLATE
/// BINARY` (the column's own collation, so the index still serves): with a
/// bare `run_id = ?1` this SQLite build (STAT4) compiles the statement again
/// for every value bound to it — measured, an eighth of the writer's time
/// went to parsing this one line.
const NEXT_POSITION: &str = "SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE run_id = ?1 COLLATE BINARY";

/// Events as the rows the writer inserts: written out by the caller, so
/// the one writer thread gets text, not events to serialize (except a run's
/// next group of events, handed over by the callback of its last one on
/// the writer thread).
fn event_rows(events: &[Event]) -> Result<Vec<(i64, String)>, StoreError> {
    events
        .iter()
        .map(|event| Ok((event.seq as i64, json(event)?)))
        .collect()
}

fn insert_events(tx: &Connection, run_id: &str, rows: &[(i64, String)]) -> Result<(), rusqlite::Error> {
    let mut insert = tx.prepare_cached("INSERT OR IGNORE INTO events (run_id, seq, body) VALUES (?1, ?2, ?3)")?;
    for (seq, body) in rows {
        insert.execute(params![run_id, seq, body])?;
    }
    Ok(())
}

fn read_run(conn: &Connection, run_id: &str) -> Result<Option<RawRun>, rusqlite::Error> {
    conn.prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"))?
        .query_row(params![run_id], row_to_record)
        .optional()
}

/// A `runs` row as SQLite holds it, before its status and metrics are parsed.
struct RawRun {
    run_id: String,
    session_id: String,
    prompt: String,
    model: String,
    status: String,
    owner: String,
    started_ms: i64,
    ended_ms: Option<i64>,
    content: Option<String>,
    metrics: String,
    workspace: Option<String>,
    principal: Option<String>,
    parent_run_id: Option<String>,
    parent_turn_id: Option<String>,
    accepted_ms: Option<i64>,
}

/// Reads a row selected with [`RUN_COLUMNS`].
fn row_to_record(row: &rusqlite::Row<'_>) -> Result<RawRun, rusqlite::Error> {
    Ok(RawRun {
        run_id: row.get(0)?,
        session_id: row.get(1)?,
        prompt: row.get(2)?,
        model: row.get(3)?,
        status: row.get(4)?,
        owner: row.get(5)?,
        started_ms: row.get(6)?,
        ended_ms: row.get(7)?,
        content: row.get(8)?,
        metrics: row.get(9)?,
        workspace: row.get(10)?,
        principal: row.get(11)?,
        parent_run_id: row.get(12)?,
        parent_turn_id: row.get(13)?,
        accepted_ms: row.get(14)?,
    })
}

fn record(raw: RawRun) -> Result<RunRecord, StoreError> {
    Ok(RunRecord {
        run_id: raw.run_id,
        session_id: raw.session_id,
        prompt: raw.prompt,
        model: raw.model,
        status: status_of(&raw.status)?,
        owner: raw.owner,
        started_ms: raw.started_ms as u64,
        accepted_ms: raw.accepted_ms.map(|ms| ms as u64),
        ended_ms: raw.ended_ms.map(|e| e as u64),
        content: raw.content,
        metrics: parse::<RunMetrics>(&raw.metrics)?,
        workspace: raw.workspace,
        principal: raw.principal,
        parent: match (raw.parent_run_id, raw.parent_turn_id) {
            (Some(run_id), Some(turn_id)) => Some(ParentLink { run_id, turn_id }),
            _ => None,
        },
    })
}

#[async_trait]
impl RunLog for SqliteStore {
    async fn create_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        let run = run.clone();
        let metrics = json(&run.metrics)?;
        let fail = self.fail();
        self.write("create_run", move |tx| {
            insert_session(tx, &run).map_err(&fail)?;
            // A run a gateway queued is taken over by whoever starts it,
            // from now on; its acceptance time and its request stay.
            let written = tx
                .prepare_cached(
                    "INSERT INTO runs (id, session_id, prompt, model, status, owner, started_ms, metrics, workspace, principal,
                                       parent_run_id, parent_turn_id)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
                     ON CONFLICT (id) DO UPDATE SET status = excluded.status, owner = excluded.owner,
                         model = excluded.model, workspace = excluded.workspace, metrics = excluded.metrics,
                         started_ms = excluded.started_ms
                     WHERE runs.status = 'QUEUED' AND runs.request IS NOT NULL AND excluded.status != 'QUEUED'",
                )
                .and_then(|mut insert| {
                    insert.execute(params![
                        run.run_id,
                        run.session_id,
                        run.prompt,
                        run.model,
                        run.status.as_str(),
                        run.owner,
                        run.started_ms as i64,
                        metrics,
                        run.workspace,
                        run.principal,
                        run.parent.as_ref().map(|parent| parent.run_id.as_str()),
                        run.parent.as_ref().map(|parent| parent.turn_id.as_str())
                    ])
                })
                .map_err(&fail)?;
            if written == 0 {
                return Err(StoreError::Backend(format!("a run with id '{}' already exists", run.run_id)));
            }
            Ok(())
        })
        .await
    }

    async fn append_events(&self, run_id: &str, events: &[Event]) -> Result<(), StoreError> {
        let run_id = run_id.to_string();
        let rows = event_rows(events)?;
        let fail = self.fail();
        self.group
            .write(
                "append_events",
                Box::new(move |conn| insert_events(conn, &run_id, &rows).map_err(&fail)),
            )
            .await
    }

    fn append_events_then(self: Arc<Self>, run_id: Arc<str>, events: Vec<Event>, then: EventsStored) {
        let rows = match event_rows(&events) {
            Ok(rows) => rows,
            Err(err) => return then(events, Err(err)),
        };
        let fail = self.fail();
        // Answered on the writer thread, right after the commit.
        self.group.write_then(
            "append_events",
            Box::new(move |conn| insert_events(conn, &run_id, &rows).map_err(&fail)),
            Done::Call(Box::new(move |result| then(events, result))),
        );
    }

    async fn set_status(&self, run_id: &str, to: RunStatus) -> Result<(), StoreError> {
        let run_id = run_id.to_string();
        let fail = self.fail();
        self.write("set_status", move |tx| {
            let next = checked_transition(tx, &run_id, to, &fail)?;
            let ended = next.is_terminal().then(|| now_ms() as i64);
            tx.prepare_cached("UPDATE runs SET status = ?2, ended_ms = COALESCE(?3, ended_ms) WHERE id = ?1")
                .and_then(|mut update| update.execute(params![run_id, next.as_str(), ended]))
                .map_err(&fail)?;
            Ok(())
        })
        .await
    }

    async fn checkpoint(&self, checkpoint: &Checkpoint<'_>) -> Result<(), StoreError> {
        let run_id = checkpoint.run_id.to_string();
        let next = json(checkpoint.state)?;
        let metrics = json(checkpoint.state.metrics())?;
        let replaced = checkpoint
            .replaced_history
            .map(|messages| messages.iter().map(json).collect::<Result<Vec<_>, _>>())
            .transpose()?;
        let new: Vec<String> = checkpoint.new_messages.iter().map(json).collect::<Result<_, _>>()?;
        let events = event_rows(checkpoint.events)?;
        let fail = self.fail();
        self.group
            .write(
                "checkpoint",
                Box::new(move |tx| {
                    let mut position: i64 = if let Some(history) = &replaced {
                        tx.prepare_cached("DELETE FROM messages WHERE run_id = ?1")
                            .and_then(|mut delete| delete.execute(params![run_id]))
                            .map_err(&fail)?;
                        let mut insert = tx
                            .prepare_cached("INSERT INTO messages (run_id, position, body) VALUES (?1, ?2, ?3)")
                            .map_err(&fail)?;
                        for (index, body) in history.iter().enumerate() {
                            insert.execute(params![run_id, index as i64, body]).map_err(&fail)?;
                        }
                        history.len() as i64
                    } else {
                        tx.prepare_cached(NEXT_POSITION)
                            .and_then(|mut select| select.query_row(params![run_id], |row| row.get(0)))
                            .map_err(&fail)?
                    };
                    {
                        let mut insert = tx
                            .prepare_cached("INSERT INTO messages (run_id, position, body) VALUES (?1, ?2, ?3)")
                            .map_err(&fail)?;
                        for body in &new {
                            insert.execute(params![run_id, position, body]).map_err(&fail)?;
                            position += 1;
                        }
                    }
                    insert_events(tx, &run_id, &events).map_err(&fail)?;
                    let updated = tx
                        .prepare_cached("UPDATE runs SET next_turn = ?2, metrics = ?3 WHERE id = ?1")
                        .and_then(|mut update| update.execute(params![run_id, next, metrics]))
                        .map_err(&fail)?;
                    if updated == 0 {
                        return Err(StoreError::NotFound(run_id.clone()));
                    }
                    Ok(())
                }),
            )
            .await
    }

    async fn journal_intent(&self, run_id: &str, call: &ToolCall) -> Result<(), StoreError> {
        let (run_id, call_id, body) = (run_id.to_string(), call.id.clone(), json(call)?);
        let fail = self.fail();
        // The intent is the one write that must survive even a power cut:
        // once the tool runs, forgetting that it started could run its side
        // effect twice. So its group's commit syncs the log to disk (and
        // with it every earlier commit); the rest use NORMAL, where a power
        // cut can only lose the last checkpoints, which are then replayed.
        self.group
            .write_synced(
                "journal_intent",
                Box::new(move |tx| {
                    tx.prepare_cached(
                        "INSERT OR REPLACE INTO journal (run_id, call_id, call, started_ms) VALUES (?1, ?2, ?3, ?4)",
                    )
                    .and_then(|mut insert| insert.execute(params![run_id, call_id, body, now_ms() as i64]))
                    .map(|_| ())
                    .map_err(&fail)
                }),
            )
            .await
    }

    async fn journal_result(&self, run_id: &str, result: &ToolResult) -> Result<(), StoreError> {
        let (run_id, call_id, body) = (run_id.to_string(), result.call_id.clone(), json(result)?);
        let fail = self.fail();
        self.write("journal_result", move |tx| {
            tx.prepare_cached("UPDATE journal SET result = ?3, ended_ms = ?4 WHERE run_id = ?1 AND call_id = ?2")
                .and_then(|mut update| update.execute(params![run_id, call_id, body, now_ms() as i64]))
                .map(|_| ())
                .map_err(&fail)
        })
        .await
    }

    async fn finish_run(
        &self,
        run_id: &str,
        status: RunStatus,
        content: Option<&str>,
        metrics: &RunMetrics,
        events: &[Event],
    ) -> Result<(), StoreError> {
        let run_id = run_id.to_string();
        let content = content.map(str::to_string);
        let metrics = json(metrics)?;
        let events = event_rows(events)?;
        let fail = self.fail();
        self.group
            .write(
                "finish_run",
                Box::new(move |tx| {
                    let next = checked_transition(tx, &run_id, status, &fail)?;
                    insert_events(tx, &run_id, &events).map_err(&fail)?;
                    tx.prepare_cached(
                        "UPDATE runs SET status = ?2, ended_ms = ?3, content = ?4, metrics = ?5 WHERE id = ?1",
                    )
                    .and_then(|mut update| {
                        update.execute(params![run_id, next.as_str(), now_ms() as i64, content, metrics])
                    })
                    .map_err(&fail)?;
                    Ok(())
                }),
            )
            .await
    }

    async fn load_run(&self, run_id: &str) -> Result<RunSnapshot, StoreError> {
        let run_id = run_id.to_string();
        let fail = self.fail();
        self.read(move |conn| {
            let raw = read_run(conn, &run_id)
                .map_err(&fail)?
                .ok_or_else(|| StoreError::NotFound(run_id.clone()))?;
            let run = record(raw)?;
            let mut select = conn
                .prepare_cached("SELECT body FROM messages WHERE run_id = ?1 ORDER BY position")
                .map_err(&fail)?;
            let messages = select
                .query_map(params![run_id], |row| row.get::<_, String>(0))
                .map_err(&fail)?
                .map(|body| parse::<Message>(&body.map_err(&fail)?))
                .collect::<Result<Vec<_>, _>>()?;
            let next: Option<String> = conn
                .prepare_cached("SELECT next_turn FROM runs WHERE id = ?1")
                .and_then(|mut select| select.query_row(params![run_id], |row| row.get(0)))
                .map_err(&fail)?;
            // The run's state; a checkpoint older than whole states holds its turn alone.
            let state = next
                .map(|text| {
                    RunState::from_json(&text, &messages)
                        .map_err(|err| StoreError::Backend(format!("cannot decode a stored row: {err}")))
                })
                .transpose()?
                .map(|state| state.with_metrics(run.metrics.clone()));
            let mut select = conn
                .prepare_cached("SELECT call, result FROM journal WHERE run_id = ?1 ORDER BY started_ms, call_id")
                .map_err(&fail)?;
            let journal = select
                .query_map(params![run_id], |row| {
                    Ok((row.get::<_, String>(0)?, row.get::<_, Option<String>>(1)?))
                })
                .map_err(&fail)?
                .map(|row| {
                    let (call, result) = row.map_err(&fail)?;
                    Ok(JournalEntry {
                        call: parse(&call)?,
                        result: result.map(|r| parse(&r)).transpose()?,
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            let last_seq: i64 = conn
                .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = ?1")
                .and_then(|mut select| select.query_row(params![run_id], |row| row.get(0)))
                .map_err(&fail)?;
            Ok(RunSnapshot {
                run,
                messages,
                state,
                journal,
                last_seq: last_seq.max(0) as u64,
            })
        })
        .await
    }

    async fn events(&self, run_id: &str, after_seq: u64) -> Result<Vec<Event>, StoreError> {
        self.events_page(run_id, after_seq, usize::MAX).await
    }

    async fn events_page(&self, run_id: &str, after_seq: u64, limit: usize) -> Result<Vec<Event>, StoreError> {
        let run_id = run_id.to_string();
        let fail = self.fail();
        self.read(move |conn| {
            let exists: Option<i64> = conn
                .prepare_cached("SELECT 1 FROM runs WHERE id = ?1")
                .and_then(|mut select| select.query_row(params![run_id], |row| row.get(0)))
                .optional()
                .map_err(&fail)?;
            if exists.is_none() {
                return Err(StoreError::NotFound(run_id));
            }
            let mut select = conn
                .prepare_cached("SELECT body FROM events WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3")
                .map_err(&fail)?;
            let bodies = select
                .query_map(
                    params![
                        run_id,
                        // Past the largest seq SQLite holds: nothing (not a wrap to -1, the whole log).
                        i64::try_from(after_seq).unwrap_or(i64::MAX),
                        limit.min(i64::MAX as usize) as i64
                    ],
                    |row| row.get::<_, String>(0),
                )
                .map_err(&fail)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(&fail)?;
            bodies.iter().map(|body| parse(body)).collect()
        })
        .await
    }

    async fn last_seqs(&self, run_ids: &[String]) -> Result<Vec<u64>, StoreError> {
        let run_ids = run_ids.to_vec();
        let fail = self.fail();
        self.read(move |conn| {
            // The primary key (run_id, seq) answers each MAX from the index.
            let mut select = conn
                .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = ?1")
                .map_err(&fail)?;
            run_ids
                .iter()
                .map(|run_id| {
                    let seq: i64 = select.query_row(params![run_id], |row| row.get(0)).map_err(&fail)?;
                    Ok(seq.max(0) as u64)
                })
                .collect()
        })
        .await
    }

    async fn mark_interrupted(&self, run_id: &str, owner: &str) -> Result<bool, StoreError> {
        let (run_id, owner) = (run_id.to_string(), owner.to_string());
        let fail = self.fail();
        self.write("mark_interrupted", move |tx| {
            // Compare-and-set on the owner: a run another process took over
            // meanwhile is left alone.
            let changed = tx
                .prepare_cached(
                    "UPDATE runs SET status = 'INTERRUPTED'
                     WHERE id = ?1 AND owner = ?2 AND status IN ('QUEUED', 'RUNNING', 'WAITING_PERMISSION')",
                )
                .and_then(|mut update| update.execute(params![run_id, owner]))
                .map_err(&fail)?;
            Ok(changed > 0)
        })
        .await
    }

    async fn reclaim_run(&self, run_id: &str, owner: &str) -> Result<(), StoreError> {
        let (run_id, owner) = (run_id.to_string(), owner.to_string());
        let fail = self.fail();
        self.write("reclaim_run", move |tx| {
            let current: Option<String> = tx
                .prepare_cached("SELECT status FROM runs WHERE id = ?1")
                .and_then(|mut select| select.query_row(params![run_id], |row| row.get(0)).optional())
                .map_err(&fail)?;
            let current = status_of(&current.ok_or_else(|| StoreError::NotFound(run_id.clone()))?)?;
            // Only an interrupted run can be taken over; a running one has a
            // live owner (or one not yet known to be dead).
            if current != RunStatus::Interrupted {
                return Err(loom_core::InvalidTransition {
                    from: current,
                    to: RunStatus::Running,
                }
                .into());
            }
            tx.prepare_cached("UPDATE runs SET status = 'RUNNING', owner = ?2 WHERE id = ?1")
                .and_then(|mut update| update.execute(params![run_id, owner]))
                .map_err(&fail)?;
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl RunIndex for SqliteStore {
    async fn list_runs(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let fail = self.fail();
        self.read(move |conn| {
            let mut select = conn
                .prepare_cached(&format!(
                    "SELECT {RUN_COLUMNS} FROM runs ORDER BY started_ms DESC, id LIMIT ?1"
                ))
                .map_err(&fail)?;
            let rows = select
                .query_map(params![limit as i64], row_to_record)
                .map_err(&fail)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(&fail)?;
            rows.into_iter().map(record).collect()
        })
        .await
    }

    async fn query_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        let query = query.clone();
        let fail = self.fail();
        self.read(move |conn| {
            // NULL parameters switch a condition off, so one statement (and
            // one cached plan) serves every combination of filters.
            let mut select = conn
                .prepare_cached(&format!(
                    "SELECT {RUN_COLUMNS} FROM runs
                     WHERE (?1 IS NULL OR principal = ?1)
                       AND (?2 IS NULL OR status = ?2)
                       AND (?3 IS NULL OR session_id = ?3)
                       AND (?4 IS NULL OR started_ms < ?4 OR (started_ms = ?4 AND id < ?5))
                       AND (?7 = 0 OR principal IS NOT NULL)
                     ORDER BY started_ms DESC, id DESC LIMIT ?6"
                ))
                .map_err(&fail)?;
            let (before_ms, before_id) = match &query.before {
                Some((ms, id)) => (Some(*ms as i64), Some(id.clone())),
                None => (None, None),
            };
            let rows = select
                .query_map(
                    params![
                        query.principal,
                        query.status.map(|s| s.as_str()),
                        query.session_id,
                        before_ms,
                        before_id,
                        query.limit.min(i64::MAX as usize) as i64,
                        query.owned
                    ],
                    row_to_record,
                )
                .map_err(&fail)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(&fail)?;
            rows.into_iter().map(record).collect()
        })
        .await
    }

    async fn active_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.select_runs(
            format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE status IN ('QUEUED', 'RUNNING', 'WAITING_PERMISSION') ORDER BY started_ms"
            ),
            None,
        )
        .await
    }

    async fn session_runs(&self, session_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        self.select_runs(
            format!("SELECT {RUN_COLUMNS} FROM runs WHERE session_id = ?1 ORDER BY started_ms, rowid"),
            Some(session_id.to_string()),
        )
        .await
    }

    async fn child_runs(&self, parent_run_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        self.select_runs(
            format!("SELECT {RUN_COLUMNS} FROM runs WHERE parent_run_id = ?1 ORDER BY started_ms, id"),
            Some(parent_run_id.to_string()),
        )
        .await
    }
}

#[async_trait]
impl Admissions for SqliteStore {
    async fn queue_run(&self, queued: &QueuedRun, key: Option<(&str, &KeyedRequest)>) -> Result<(), StoreError> {
        let run = queued.record.clone();
        let request = queued.request.clone();
        let key = key.map(|(key, request)| (key.to_string(), request.clone()));
        let metrics = json(&run.metrics)?;
        let fail = self.fail();
        self.write("queue_run", move |tx| {
            insert_session(tx, &run).map_err(&fail)?;
            tx.prepare_cached(
                "INSERT INTO runs (id, session_id, prompt, model, status, owner, started_ms, accepted_ms, metrics, principal,
                                   request)
                 VALUES (?1, ?2, ?3, ?4, 'QUEUED', '', ?5, ?5, ?6, ?7, ?8)",
            )
            .and_then(|mut insert| {
                insert.execute(params![
                    run.run_id,
                    run.session_id,
                    run.prompt,
                    run.model,
                    run.started_ms as i64,
                    metrics,
                    run.principal,
                    request
                ])
            })
            .map_err(&fail)?;
            if let (Some((key, keyed)), Some(owner)) = (&key, &run.principal) {
                insert_request_key(tx, owner, key, keyed).map_err(&fail)?;
            }
            Ok(())
        })
        .await
    }

    async fn run_request(&self, run_id: &str) -> Result<Option<String>, StoreError> {
        let run_id = run_id.to_string();
        let fail = self.fail();
        self.read(move |conn| {
            let found: Option<Option<String>> = conn
                .prepare_cached("SELECT request FROM runs WHERE id = ?1")
                .and_then(|mut select| select.query_row(params![run_id], |row| row.get(0)))
                .optional()
                .map_err(&fail)?;
            found.ok_or(StoreError::NotFound(run_id))
        })
        .await
    }

    async fn queued_runs(&self) -> Result<Vec<QueuedRun>, StoreError> {
        let fail = self.fail();
        let rows = self
            .read(move |conn| {
                let mut select = conn
                    .prepare_cached(&format!(
                        "SELECT {RUN_COLUMNS}, request FROM runs
                         WHERE status = 'QUEUED' AND request IS NOT NULL ORDER BY started_ms, id"
                    ))
                    .map_err(&fail)?;
                let rows = select
                    .query_map([], |row| Ok((row_to_record(row)?, row.get::<_, String>(15)?)))
                    .map_err(&fail)?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(&fail)?;
                Ok(rows)
            })
            .await?;
        rows.into_iter()
            .map(|(raw, request)| {
                Ok(QueuedRun {
                    record: record(raw)?,
                    request,
                })
            })
            .collect()
    }

    async fn remember_request(&self, owner: &str, key: &str, request: &KeyedRequest) -> Result<(), StoreError> {
        let (owner, key, request) = (owner.to_string(), key.to_string(), request.clone());
        let fail = self.fail();
        self.write("remember_request", move |tx| {
            insert_request_key(tx, &owner, &key, &request).map_err(&fail)
        })
        .await
    }

    async fn remembered_request(&self, owner: &str, key: &str) -> Result<Option<KeyedRequest>, StoreError> {
        let (owner, key) = (owner.to_string(), key.to_string());
        let fail = self.fail();
        self.read(move |conn| {
            let oldest = now_ms().saturating_sub(REQUEST_KEY_RETENTION_MS) as i64;
            conn.prepare_cached(
                "SELECT digest, run_id FROM request_keys WHERE owner = ?1 AND key = ?2 AND created_ms >= ?3",
            )
            .and_then(|mut select| {
                select
                    .query_row(params![owner, key, oldest], |row| {
                        Ok(KeyedRequest {
                            digest: row.get::<_, i64>(0)? as u64,
                            run_id: row.get(1)?,
                        })
                    })
                    .optional()
            })
            .map_err(&fail)
        })
        .await
    }
}

#[async_trait]
impl AuditLog for SqliteStore {
    async fn append_audit(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        let body = serde_json::to_string(entry).map_err(|err| StoreError::Backend(err.to_string()))?;
        let (time_ms, token) = (entry.time_ms.min(i64::MAX as u64) as i64, entry.token.clone());
        let fail = self.fail();
        self.write("append_audit", move |tx| {
            tx.prepare_cached("INSERT INTO audit (time_ms, token, body) VALUES (?1, ?2, ?3)")
                .and_then(|mut insert| insert.execute(params![time_ms, token, body]))
                .map_err(&fail)?;
            Ok(())
        })
        .await
    }

    async fn audit_entries(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        let query = query.clone();
        let fail = self.fail();
        self.read(move |conn| {
            // The newest `limit` by the order they were appended (a clock
            // that jumped back does not reorder them), then oldest first.
            let mut select = conn
                .prepare_cached(
                    "SELECT body FROM audit
                     WHERE (?1 IS NULL OR time_ms >= ?1) AND (?2 IS NULL OR token = ?2)
                     ORDER BY id DESC LIMIT ?3",
                )
                .map_err(&fail)?;
            let since = query.since_ms.map(|ms| ms.min(i64::MAX as u64) as i64);
            let limit = query.limit.min(i64::MAX as usize) as i64;
            let bodies = select
                .query_map(params![since, query.token, limit], |row| row.get::<_, String>(0))
                .map_err(&fail)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(&fail)?;
            bodies
                .iter()
                .rev()
                .map(|body| {
                    serde_json::from_str(body)
                        .map_err(|err| StoreError::Backend(format!("an audit record is not readable: {err}")))
                })
                .collect()
        })
        .await
    }
}

impl Store for SqliteStore {
    fn files(&self) -> Vec<PathBuf> {
        // The database and SQLite's companions (WAL, shared memory, journal).
        let mut files = vec![self.path.clone()];
        for suffix in ["-wal", "-shm", "-journal"] {
            let mut name = self.path.as_os_str().to_owned();
            name.push(suffix);
            files.push(PathBuf::from(name));
        }
        files
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

    use super::*;

    #[test]
    fn the_next_position_is_compiled_once_and_read_from_the_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("loom.db")).unwrap();
        let conn = store.reader.lock().unwrap();
        for run in ["a", "b", "c"] {
            let mut select = conn.prepare_cached(NEXT_POSITION).unwrap();
            let next: i64 = select.query_row(params![run], |row| row.get(0)).unwrap();
            assert_eq!(next, 0);
            assert_eq!(
                select.get_status(rusqlite::StatementStatus::RePrepare),
                0,
                "compiled again for {run}"
            );
        }
        let plan: String = conn
            .query_row(&format!("EXPLAIN QUERY PLAN {NEXT_POSITION}"), params!["a"], |row| {
                row.get(3)
            })
            .unwrap();
        assert!(plan.contains("USING COVERING INDEX messages_by_run"), "{plan}");
    }
}
