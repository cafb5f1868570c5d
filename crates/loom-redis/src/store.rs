//! `RedisStore`: Loom's [`Store`] on one Redis, for processes on several
//! machines to share (docs/cluster.md). Every write that checks before it
//! writes, or touches more than one key, is one Lua script (`scripts.rs`);
//! a run's snapshot and a page of its events are each read in one
//! `MULTI`/`EXEC`, so each sees one moment. Listings read an index, then
//! the runs in it: what changed in between is filtered by what was read.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use loom_core::{
    Admissions, AuditEntry, AuditLog, AuditQuery, Checkpoint, Event, JournalEntry, KeyedRequest, Message, ParentLink,
    QueuedRun, RunIndex, RunLog, RunMetrics, RunQuery, RunRecord, RunSnapshot, RunState, RunStatus, Store, StoreError,
    ToolCall, ToolResult,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::ScriptInvocation;
use redis::{Script, Value};

use crate::appender::{Append, Appender};
use crate::errors::backend;
use crate::scripts;

/// Every status, for the scripts' "may come from" lists.
const STATUSES: [RunStatus; 8] = [
    RunStatus::Queued,
    RunStatus::Running,
    RunStatus::WaitingPermission,
    RunStatus::Done,
    RunStatus::Error,
    RunStatus::Canceled,
    RunStatus::Timeout,
    RunStatus::Interrupted,
];

/// The statuses of a run someone executes or is about to.
const ACTIVE: [RunStatus; 3] = [RunStatus::Queued, RunStatus::Running, RunStatus::WaitingPermission];

/// How long idempotency keys are kept (as with SQLite: a day).
const REQUEST_KEY_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// Runs read per round trip when a query filters as it goes.
const QUERY_BATCH: isize = 200;

/// The scripts, loaded once per store (Redis keeps them by hash).
struct Scripts {
    create_run: Script,
    queue_run: Script,
    change_status: Script,
    checkpoint: Script,
    append_events: Script,
    journal_intent: Script,
    journal_result: Script,
    claim_next: Script,
    renew: Script,
    release: Script,
    send_control: Script,
    withdraw: Script,
    park: Script,
    forget_ended: Script,
    queue_position: Script,
    failed_start: Script,
}

/// The fence a leased run's store puts on every write (`scripts::FENCE`).
#[derive(Debug)]
pub(crate) struct Fence {
    /// The run the lease is on (a sub-agent's writes carry its root's).
    pub run_id: String,
    /// The epoch the lease was taken at.
    pub epoch: u64,
    /// `EPOCH RUNKEY`, as the scripts take it.
    pub arg: String,
    /// The worker's side of the lease: revoked, controls delivered.
    pub guard: std::sync::Arc<loom_core::LeaseGuard>,
    /// The leased run's controls list (acknowledged by its checkpoints).
    pub controls_key: String,
}

/// A [`Store`] on Redis.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: String,
    scripts: std::sync::Arc<Scripts>,
    /// The runs' events, sent to Redis together (`appender.rs`).
    appender: Appender,
    /// The most queued runs, when this store queues for workers
    /// (`queueing_for_workers`).
    queue_bound: Option<usize>,
    /// What opens further connections (`tail.rs`).
    client: redis::Client,
    /// The URL it was opened with (`Store::address`).
    url: String,
    /// The lease this store writes under (`RunLeases::fenced`), if any.
    pub(crate) fence: Option<std::sync::Arc<Fence>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").field("prefix", &self.prefix).finish()
    }
}

impl RedisStore {
    /// Connects to `url` (`redis://HOST:PORT/DB`), keeping its keys under
    /// `loom:`. The connection is re-made when it drops; a command waits
    /// at most 5 s for its answer.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with_prefix(url, "loom:").await
    }

    /// Like [`RedisStore::connect`], with the keys under `prefix` (several
    /// Looms, or tests, sharing one Redis database). Call it within a Tokio
    /// runtime: the task that sends the runs' events runs there.
    pub async fn connect_with_prefix(url: &str, prefix: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(backend)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(1));
        let mut conn = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(backend)?;
        let append = Script::new(&scripts::append_events());
        append.load_async(&mut conn).await.map_err(backend)?;
        Ok(Self {
            appender: Appender::start(conn.clone(), append),
            conn,
            prefix: prefix.to_string(),
            scripts: std::sync::Arc::new(Scripts {
                create_run: Script::new(&scripts::create_run()),
                queue_run: Script::new(&scripts::queue_run()),
                change_status: Script::new(&scripts::change_status()),
                checkpoint: Script::new(&scripts::checkpoint()),
                append_events: Script::new(&scripts::append_events()),
                journal_intent: Script::new(&scripts::journal_intent()),
                journal_result: Script::new(&scripts::journal_result()),
                claim_next: Script::new(&scripts::claim_next()),
                renew: Script::new(&scripts::renew()),
                release: Script::new(scripts::RELEASE),
                send_control: Script::new(scripts::SEND_CONTROL),
                withdraw: Script::new(&scripts::withdraw()),
                park: Script::new(&scripts::park()),
                forget_ended: Script::new(scripts::FORGET_ENDED),
                queue_position: Script::new(scripts::QUEUE_POSITION),
                failed_start: Script::new(scripts::FAILED_START),
            }),
            client,
            url: url.to_string(),
            queue_bound: None,
            fence: None,
        })
    }

    /// The fence argument every write script takes last: `''` for a store
    /// without a lease; refused here, before anything is sent, once the
    /// lease was given up or its time ran out.
    pub(crate) fn fence_arg(&self) -> Result<String, StoreError> {
        match &self.fence {
            None => Ok(String::new()),
            Some(fence) if fence.guard.refuses_writes() => {
                fence.guard.count_refused(false);
                Err(StoreError::Fenced(fence.run_id.clone()))
            }
            Some(fence) => Ok(fence.arg.clone()),
        }
    }

    /// The error of a write made through this store; a stale write's
    /// refusal counts on its lease's guard.
    pub(crate) fn write_error(&self, err: redis::RedisError) -> StoreError {
        let err = backend(err);
        if let (StoreError::Fenced(_), Some(fence)) = (&err, &self.fence) {
            fence.guard.count_refused(true);
        }
        err
    }

    /// Runs one of this store's write scripts and returns its answer: the
    /// fence goes last, where every write script reads it, and a refusal
    /// (a stale lease, Redis down) is typed by [`Self::write_error`].
    async fn write<T: redis::FromRedisValue>(&self, invocation: &mut ScriptInvocation<'_>) -> Result<T, StoreError> {
        invocation.arg(self.fence_arg()?);
        invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|err| self.write_error(err))
    }

    /// [`Self::write`] of a script that answers `ok`, or anything else
    /// when `run_id` is not stored.
    async fn write_to_run(&self, run_id: &str, invocation: &mut ScriptInvocation<'_>) -> Result<(), StoreError> {
        match self.write::<String>(invocation).await?.as_str() {
            "ok" => Ok(()),
            _ => Err(StoreError::NotFound(run_id.to_string())),
        }
    }

    pub(crate) fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    pub(crate) fn run_key_of(&self, run_id: &str) -> String {
        self.run_key(run_id)
    }

    pub(crate) fn controls_key(&self, run_id: &str) -> String {
        self.run_part(run_id, "controls")
    }

    pub(crate) fn failed_start_script(&self) -> &Script {
        &self.scripts.failed_start
    }

    pub(crate) fn queue_position_script(&self) -> &Script {
        &self.scripts.queue_position
    }

    /// The same store as a gateway whose runs `loom worker` processes
    /// execute uses it: the runs it queues are marked for workers (only
    /// those are claimed), and a queued run is refused once `max` wait
    /// ([`StoreError::QueueFull`]): the bound of the cluster's line.
    pub fn queueing_for_workers(mut self, max: usize) -> Self {
        self.queue_bound = Some(max);
        self
    }

    pub(crate) fn forget_ended_script(&self) -> &Script {
        &self.scripts.forget_ended
    }

    pub(crate) fn park_script(&self) -> &Script {
        &self.scripts.park
    }

    pub(crate) fn withdraw_script(&self) -> &Script {
        &self.scripts.withdraw
    }

    pub(crate) fn events_key(&self, run_id: &str) -> String {
        self.run_part(run_id, "events")
    }

    pub(crate) fn client(&self) -> &redis::Client {
        &self.client
    }

    pub(crate) fn lease_scripts(&self) -> (&Script, &Script, &Script, &Script) {
        (
            &self.scripts.claim_next,
            &self.scripts.renew,
            &self.scripts.release,
            &self.scripts.send_control,
        )
    }

    fn run_key(&self, run_id: &str) -> String {
        format!("{}run:{run_id}", self.prefix)
    }

    /// A run's `messages`, `events`, `journal` or `results`: each kind
    /// in its own namespace, so a run id with a `:` names no other key.
    fn run_part(&self, run_id: &str, part: &str) -> String {
        format!("{}{part}:{run_id}", self.prefix)
    }

    pub(crate) fn index(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// The key of an idempotency key: the owner's length first, so no
    /// owner and key pair reads as another.
    fn request_key(&self, owner: &str, key: &str) -> String {
        format!("{}key:{}:{owner}:{key}", self.prefix, owner.len())
    }

    /// The arguments after the run key of a new run (`scripts::NEW_RUN`).
    fn new_run_args(
        &self,
        run: &RunRecord,
        status: RunStatus,
        request: Option<&str>,
    ) -> Result<Vec<String>, StoreError> {
        let parent = run.parent.as_ref();
        Ok(vec![
            self.prefix.clone(),
            run.run_id.clone(),
            run.session_id.clone(),
            run.prompt.clone(),
            run.model.clone(),
            status.as_str().to_string(),
            run.owner.clone(),
            run.started_ms.to_string(),
            json(&run.metrics)?,
            optional(run.workspace.as_deref()),
            optional(run.principal.as_deref()),
            optional(parent.map(|parent| parent.run_id.as_str())),
            optional(parent.map(|parent| parent.turn_id.as_str())),
            optional(request),
        ])
    }

    /// A status change (see `scripts::change_status`).
    async fn change_status(&self, run_id: &str, change: StatusChange<'_>) -> Result<Changed, StoreError> {
        let from: Vec<&str> = change.from.iter().map(|status| status.as_str()).collect();
        let mut invocation = self.scripts.change_status.key(self.run_key(run_id));
        invocation
            .key(self.run_part(run_id, "events"))
            .arg(&self.prefix)
            .arg(run_id)
            .arg(from.join(" "))
            .arg(change.to.as_str())
            .arg(change.ended_ms.map(|ms| ms.to_string()).unwrap_or_default())
            .arg(change.new_owner.map(|owner| format!("={owner}")).unwrap_or_default())
            .arg(
                change
                    .owner_must_be
                    .map(|owner| format!("={owner}"))
                    .unwrap_or_default(),
            );
        if let Some(end) = &change.end {
            invocation
                .arg("1")
                .arg(if end.content.is_some() { "1" } else { "0" })
                .arg(end.content.unwrap_or_default())
                .arg(&end.metrics);
            event_args(&mut invocation, &end.events);
        }
        let reply: Vec<String> = self.write(&mut invocation).await?;
        match reply.first().map(String::as_str) {
            Some("ok") => Ok(Changed::Yes),
            Some("missing") => Err(StoreError::NotFound(run_id.to_string())),
            Some("other owner") => Ok(Changed::OtherOwner),
            Some("refused") => Ok(Changed::Refused(status_of(reply.get(1).map_or("", String::as_str))?)),
            other => Err(StoreError::Backend(format!("unexpected answer from Redis: {other:?}"))),
        }
    }

    /// The records of `ids`, in their order (ids whose run is gone are skipped).
    async fn records(&self, ids: &[String]) -> Result<Vec<RunRecord>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.hgetall(self.run_key(id));
        }
        let rows: Vec<HashMap<String, String>> = pipe.query_async(&mut self.conn.clone()).await.map_err(backend)?;
        rows.into_iter()
            .filter(|row| !row.is_empty())
            .map(|row| record(&row))
            .collect()
    }

    async fn ids(&self, key: &str) -> Result<Vec<String>, StoreError> {
        redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(backend)
    }
}

/// What a status change asks for.
struct StatusChange<'a> {
    from: Vec<RunStatus>,
    to: RunStatus,
    ended_ms: Option<u64>,
    new_owner: Option<&'a str>,
    owner_must_be: Option<&'a str>,
    end: Option<End<'a>>,
}

/// What a run's end writes besides its status.
struct End<'a> {
    content: Option<&'a str>,
    metrics: String,
    events: Vec<(u64, String)>,
}

enum Changed {
    Yes,
    Refused(RunStatus),
    OtherOwner,
}

impl<'a> StatusChange<'a> {
    /// A move to `to` from wherever docs/architecture.md allows it.
    fn to(to: RunStatus) -> Self {
        Self {
            from: STATUSES
                .into_iter()
                .filter(|from| from.transition(to).is_ok())
                .collect(),
            to,
            ended_ms: to.is_terminal().then(now_ms),
            new_owner: None,
            owner_must_be: None,
            end: None,
        }
    }
}

/// An optional field as the scripts take it: `=VALUE`, or `''` for none.
fn optional(value: Option<&str>) -> String {
    value.map(|value| format!("={value}")).unwrap_or_default()
}

pub(crate) fn event_args(invocation: &mut redis::ScriptInvocation<'_>, events: &[(u64, String)]) {
    invocation.arg(events.len());
    for (seq, body) in events {
        invocation.arg(seq).arg(body);
    }
}

pub(crate) fn event_rows(events: &[Event]) -> Result<Vec<(u64, String)>, StoreError> {
    events.iter().map(|event| Ok((event.seq, json(event)?))).collect()
}

pub(crate) fn json<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|err| StoreError::Backend(format!("cannot encode: {err}")))
}

pub(crate) fn parse<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|err| StoreError::Backend(format!("cannot decode a stored value: {err}")))
}

fn status_of(text: &str) -> Result<RunStatus, StoreError> {
    parse(&format!("\"{text}\""))
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A run's hash as its record.
fn record(row: &HashMap<String, String>) -> Result<RunRecord, StoreError> {
    let field = |name: &str| row.get(name).cloned().unwrap_or_default();
    let optional = |name: &str| row.get(name).cloned();
    let number = |name: &str| -> Result<Option<u64>, StoreError> {
        row.get(name)
            .map(|text| {
                text.parse::<u64>()
                    .map_err(|err| StoreError::Backend(format!("cannot decode {name} '{text}': {err}")))
            })
            .transpose()
    };
    Ok(RunRecord {
        run_id: field("id"),
        session_id: field("session_id"),
        prompt: field("prompt"),
        model: field("model"),
        status: status_of(&field("status"))?,
        owner: field("owner"),
        started_ms: number("started_ms")?.unwrap_or_default(),
        accepted_ms: number("accepted_ms")?,
        ended_ms: number("ended_ms")?,
        content: optional("content"),
        metrics: row
            .get("metrics")
            .map(|text| parse(text))
            .transpose()?
            .unwrap_or_default(),
        workspace: optional("workspace"),
        principal: optional("principal"),
        parent: match (optional("parent_run_id"), optional("parent_turn_id")) {
            (Some(run_id), Some(turn_id)) => Some(ParentLink { run_id, turn_id }),
            _ => None,
        },
    })
}

/// The events of a stream's entries (`0-SEQ` → field `e`).
pub(crate) fn events_of(entries: Vec<(String, Vec<(String, String)>)>) -> Result<Vec<Event>, StoreError> {
    entries
        .into_iter()
        .filter_map(|(_, fields)| fields.into_iter().find(|(name, _)| name == "e").map(|(_, body)| body))
        .map(|body| parse(&body))
        .collect()
}

/// The seq of a stream entry id `0-SEQ`.
pub(crate) fn seq_of(id: &str) -> u64 {
    id.strip_prefix("0-").and_then(|seq| seq.parse().ok()).unwrap_or(0)
}

#[async_trait]
impl RunLog for RedisStore {
    async fn create_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        let mut invocation = self.scripts.create_run.key(self.run_key(&run.run_id));
        for arg in self.new_run_args(run, run.status, None)? {
            invocation.arg(arg);
        }
        let reply: String = self.write(&mut invocation).await?;
        match reply.as_str() {
            "created" | "taken" => Ok(()),
            _ => Err(StoreError::Backend(format!(
                "a run with id '{}' already exists",
                run.run_id
            ))),
        }
    }

    async fn append_events(&self, run_id: &str, events: &[Event]) -> Result<(), StoreError> {
        let mut invocation = self.scripts.append_events.key(self.run_key(run_id));
        invocation.key(self.run_part(run_id, "events"));
        event_args(&mut invocation, &event_rows(events)?);
        self.write_to_run(run_id, &mut invocation).await
    }

    fn append_events_then(
        self: std::sync::Arc<Self>,
        run_id: std::sync::Arc<str>,
        events: Vec<Event>,
        then: loom_core::EventsStored,
    ) {
        let (rows, fence) = match event_rows(&events).and_then(|rows| Ok((rows, self.fence_arg()?))) {
            Ok(found) => found,
            Err(err) => return then(events, Err(err)),
        };
        self.appender.send(Append {
            run_key: self.run_key(&run_id),
            events_key: self.run_part(&run_id, "events"),
            run_id,
            rows,
            fence,
            guard: self.fence.as_ref().map(|fence| fence.guard.clone()),
            events,
            then,
        });
    }

    async fn set_status(&self, run_id: &str, to: RunStatus) -> Result<(), StoreError> {
        match self.change_status(run_id, StatusChange::to(to)).await? {
            Changed::Yes => Ok(()),
            Changed::Refused(from) => Err(loom_core::InvalidTransition { from, to }.into()),
            Changed::OtherOwner => Err(StoreError::Backend(format!("run '{run_id}' has another owner"))),
        }
    }

    async fn checkpoint(&self, checkpoint: &Checkpoint<'_>) -> Result<(), StoreError> {
        let run_id = checkpoint.run_id;
        let mut invocation = self.scripts.checkpoint.key(self.run_key(run_id));
        invocation
            .key(self.run_part(run_id, "messages"))
            .key(self.run_part(run_id, "events"));
        match checkpoint.replaced_history {
            Some(history) => {
                invocation.arg("1").arg(history.len());
                for message in history {
                    invocation.arg(json(message)?);
                }
            }
            None => {
                invocation.arg("0");
            }
        }
        invocation.arg(checkpoint.new_messages.len());
        for message in checkpoint.new_messages {
            invocation.arg(json(message)?);
        }
        event_args(&mut invocation, &event_rows(checkpoint.events)?);
        invocation
            .arg(json(checkpoint.state)?)
            .arg(json(checkpoint.state.metrics())?);
        // A leased run's own checkpoint acknowledges the controls applied.
        match self.fence.as_deref().filter(|fence| fence.run_id == run_id) {
            Some(fence) => {
                let guard = &fence.guard;
                let acked = if guard.acks_frozen.load(std::sync::atomic::Ordering::SeqCst) {
                    0
                } else {
                    guard.delivered.load(std::sync::atomic::Ordering::SeqCst)
                };
                invocation.arg(&fence.controls_key).arg(acked)
            }
            None => invocation.arg("").arg(0),
        };
        self.write_to_run(run_id, &mut invocation).await
    }

    async fn journal_intent(&self, run_id: &str, call: &ToolCall) -> Result<(), StoreError> {
        // Acknowledged by Redis before the tool runs; how durable that is
        // is Redis's `appendfsync` (docs/cluster.md).
        let mut invocation = self.scripts.journal_intent.key(self.run_key(run_id));
        invocation
            .key(self.run_part(run_id, "journal"))
            .key(self.run_part(run_id, "results"))
            .arg(&call.id)
            .arg(now_ms())
            .arg(json(call)?);
        self.write_to_run(run_id, &mut invocation).await
    }

    async fn journal_result(&self, run_id: &str, result: &ToolResult) -> Result<(), StoreError> {
        let mut invocation = self.scripts.journal_result.key(self.run_part(run_id, "journal"));
        invocation
            .key(self.run_part(run_id, "results"))
            .arg(&result.call_id)
            .arg(json(result)?);
        let _: String = self.write(&mut invocation).await?;
        Ok(())
    }

    async fn finish_run(
        &self,
        run_id: &str,
        status: RunStatus,
        content: Option<&str>,
        metrics: &RunMetrics,
        events: &[Event],
    ) -> Result<(), StoreError> {
        let mut change = StatusChange::to(status);
        change.ended_ms = Some(now_ms());
        change.end = Some(End {
            content,
            metrics: json(metrics)?,
            events: event_rows(events)?,
        });
        match self.change_status(run_id, change).await? {
            Changed::Yes => Ok(()),
            Changed::Refused(from) => Err(loom_core::InvalidTransition { from, to: status }.into()),
            Changed::OtherOwner => Err(StoreError::Backend(format!("run '{run_id}' has another owner"))),
        }
    }

    async fn load_run(&self, run_id: &str) -> Result<RunSnapshot, StoreError> {
        let (row, messages, journal, results, last): (
            HashMap<String, String>,
            Vec<String>,
            HashMap<String, String>,
            HashMap<String, String>,
            Vec<(String, Vec<(String, String)>)>,
        ) = redis::pipe()
            .atomic()
            .hgetall(self.run_key(run_id))
            .lrange(self.run_part(run_id, "messages"), 0, -1)
            .hgetall(self.run_part(run_id, "journal"))
            .hgetall(self.run_part(run_id, "results"))
            .cmd("XREVRANGE")
            .arg(self.run_part(run_id, "events"))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(backend)?;
        if row.is_empty() {
            return Err(StoreError::NotFound(run_id.to_string()));
        }
        let run = record(&row)?;
        let messages: Vec<Message> = messages.iter().map(|body| parse(body)).collect::<Result<_, _>>()?;
        let state = row
            .get("next_turn")
            .map(|text| {
                RunState::from_json(text, &messages)
                    .map_err(|err| StoreError::Backend(format!("cannot decode a stored value: {err}")))
            })
            .transpose()?
            .map(|state| state.with_metrics(run.metrics.clone()));
        let mut journal: Vec<(u64, String, JournalEntry)> = journal
            .into_iter()
            .map(|(call_id, value)| {
                let (started, call) = value
                    .split_once(' ')
                    .ok_or_else(|| StoreError::Backend(format!("cannot decode the journal of call '{call_id}'")))?;
                let entry = JournalEntry {
                    call: parse(call)?,
                    result: results.get(&call_id).map(|result| parse(result)).transpose()?,
                };
                Ok((started.parse().unwrap_or(0), call_id, entry))
            })
            .collect::<Result<_, StoreError>>()?;
        journal.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        Ok(RunSnapshot {
            run,
            messages,
            state,
            journal: journal.into_iter().map(|(_, _, entry)| entry).collect(),
            last_seq: last.first().map_or(0, |(id, _)| seq_of(id)),
        })
    }

    async fn events(&self, run_id: &str, after_seq: u64) -> Result<Vec<Event>, StoreError> {
        self.events_page(run_id, after_seq, usize::MAX).await
    }

    async fn events_page(&self, run_id: &str, after_seq: u64, limit: usize) -> Result<Vec<Event>, StoreError> {
        // Nothing comes after the largest seq (and the stream has no id past it).
        let after_seq = after_seq.min(u64::MAX - 1);
        let mut range = redis::cmd("XRANGE");
        // The seq is the cursor: entries after `0-after_seq`.
        range
            .arg(self.run_part(run_id, "events"))
            .arg(format!("(0-{after_seq}"))
            .arg("+");
        if limit != usize::MAX {
            range.arg("COUNT").arg(limit);
        }
        let (exists, entries): (bool, Vec<(String, Vec<(String, String)>)>) = redis::pipe()
            .atomic()
            .exists(self.run_key(run_id))
            .add_command(range)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(backend)?;
        if !exists {
            return Err(StoreError::NotFound(run_id.to_string()));
        }
        events_of(entries)
    }

    async fn last_seqs(&self, run_ids: &[String]) -> Result<Vec<u64>, StoreError> {
        if run_ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for run_id in run_ids {
            pipe.cmd("XREVRANGE")
                .arg(self.run_part(run_id, "events"))
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1);
        }
        let lasts: Vec<Vec<(String, Vec<(String, String)>)>> =
            pipe.query_async(&mut self.conn.clone()).await.map_err(backend)?;
        Ok(lasts
            .iter()
            .map(|last| last.first().map_or(0, |(id, _)| seq_of(id)))
            .collect())
    }

    async fn mark_interrupted(&self, run_id: &str, owner: &str) -> Result<bool, StoreError> {
        let change = StatusChange {
            from: ACTIVE.to_vec(),
            to: RunStatus::Interrupted,
            ended_ms: None,
            new_owner: None,
            owner_must_be: Some(owner),
            end: None,
        };
        match self.change_status(run_id, change).await {
            Ok(Changed::Yes) => Ok(true),
            Ok(Changed::Refused(_) | Changed::OtherOwner) | Err(StoreError::NotFound(_)) => Ok(false),
            Err(err) => Err(err),
        }
    }

    async fn reclaim_run(&self, run_id: &str, owner: &str) -> Result<(), StoreError> {
        let change = StatusChange {
            from: vec![RunStatus::Interrupted],
            to: RunStatus::Running,
            ended_ms: None,
            new_owner: Some(owner),
            owner_must_be: None,
            end: None,
        };
        match self.change_status(run_id, change).await? {
            Changed::Yes => Ok(()),
            Changed::Refused(from) => Err(loom_core::InvalidTransition {
                from,
                to: RunStatus::Running,
            }
            .into()),
            Changed::OtherOwner => Err(StoreError::Backend(format!("run '{run_id}' has another owner"))),
        }
    }

    fn write_fence(&self) -> Option<loom_core::WriteFence> {
        self.fence.as_ref().map(|fence| loom_core::WriteFence {
            run_id: fence.run_id.clone(),
            epoch: fence.epoch,
            guard: fence.guard.clone(),
        })
    }
}

#[async_trait]
impl RunIndex for RedisStore {
    async fn list_runs(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let stop = isize::try_from(limit).map_or(-1, |limit| limit - 1);
        let ids: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.index("runs"))
            .arg(0)
            .arg(stop)
            .arg("REV")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(backend)?;
        let mut runs = self.records(&ids).await?;
        // Newest first, ties by id as SQLite lists them (a tie at the page's
        // edge may differ).
        runs.sort_by(|a, b| b.started_ms.cmp(&a.started_ms).then_with(|| a.run_id.cmp(&b.run_id)));
        Ok(runs)
    }

    async fn active_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        let mut runs = Vec::new();
        for status in ACTIVE {
            let ids = self.ids(&self.index(&format!("status:{}", status.as_str()))).await?;
            runs.extend(self.records(&ids).await?);
        }
        // The indexes are read one after another: a run that moved between
        // them is read twice, or has ended since.
        runs.retain(|run| ACTIVE.contains(&run.status));
        runs.sort_by(|a, b| (a.started_ms, &a.run_id).cmp(&(b.started_ms, &b.run_id)));
        runs.dedup_by(|a, b| a.run_id == b.run_id);
        Ok(runs)
    }

    async fn session_runs(&self, session_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        let ids = self.ids(&self.index(&format!("session:{session_id}"))).await?;
        self.records(&ids).await
    }

    async fn child_runs(&self, parent_run_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        let ids = self.ids(&self.index(&format!("children:{parent_run_id}"))).await?;
        self.records(&ids).await
    }

    async fn query_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        // The smallest index that holds every run the query asks for,
        // newest first from the cursor on; the rest is filtered.
        let index = match (&query.session_id, query.status) {
            (Some(session), _) => self.index(&format!("session:{session}")),
            (None, Some(status)) => self.index(&format!("status:{}", status.as_str())),
            (None, None) => self.index("runs"),
        };
        let max = query
            .before
            .as_ref()
            .map_or_else(|| "+inf".to_string(), |(ms, _)| ms.to_string());
        let mut found = Vec::new();
        let mut offset: isize = 0;
        while found.len() < query.limit {
            let ids: Vec<String> = redis::cmd("ZRANGE")
                .arg(&index)
                .arg(&max)
                .arg("-inf")
                .arg("BYSCORE")
                .arg("REV")
                .arg("LIMIT")
                .arg(offset)
                .arg(QUERY_BATCH)
                .query_async(&mut self.conn.clone())
                .await
                .map_err(backend)?;
            if ids.is_empty() {
                break;
            }
            offset += ids.len() as isize;
            found.extend(self.records(&ids).await?.into_iter().filter(|run| query.matches(run)));
        }
        found.truncate(query.limit);
        Ok(found)
    }
}

#[async_trait]
impl Admissions for RedisStore {
    async fn queue_run(&self, queued: &QueuedRun, key: Option<(&str, &KeyedRequest)>) -> Result<(), StoreError> {
        let run = &queued.record;
        let mut invocation = self.scripts.queue_run.key(self.run_key(&run.run_id));
        for arg in self.new_run_args(run, RunStatus::Queued, Some(&queued.request))? {
            invocation.arg(arg);
        }
        match (key, &run.principal) {
            (Some((key, keyed)), Some(owner)) => invocation
                .arg(self.request_key(owner, key))
                .arg(format!("{} {}", keyed.digest, keyed.run_id))
                .arg(REQUEST_KEY_RETENTION.as_millis() as u64),
            _ => invocation.arg("").arg("").arg(0),
        };
        invocation
            .arg(self.queue_bound.map(|max| max.to_string()).unwrap_or_default())
            .arg(if self.queue_bound.is_some() { "1" } else { "" });
        let reply: String = self.write(&mut invocation).await?;
        match reply.as_str() {
            "queued" => Ok(()),
            "full" => Err(StoreError::QueueFull {
                limit: self.queue_bound.unwrap_or_default(),
            }),
            _ => Err(StoreError::Backend(format!(
                "a run with id '{}' already exists",
                run.run_id
            ))),
        }
    }

    async fn queued_runs(&self) -> Result<Vec<QueuedRun>, StoreError> {
        let ids = self.ids(&self.index("status:QUEUED")).await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.hgetall(self.run_key(id));
        }
        let rows: Vec<HashMap<String, String>> = pipe.query_async(&mut self.conn.clone()).await.map_err(backend)?;
        rows.into_iter()
            .filter_map(|row| {
                let request = row.get("request").cloned()?;
                Some(record(&row).map(|record| QueuedRun { record, request }))
            })
            // Read after the index: a run started meanwhile is not queued.
            .filter(|queued| !matches!(queued, Ok(queued) if queued.record.status != RunStatus::Queued))
            .collect()
    }

    async fn run_request(&self, run_id: &str) -> Result<Option<String>, StoreError> {
        let (exists, request): (bool, Option<String>) = redis::pipe()
            .atomic()
            .exists(self.run_key(run_id))
            .hget(self.run_key(run_id), "request")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(backend)?;
        if !exists {
            return Err(StoreError::NotFound(run_id.to_string()));
        }
        Ok(request)
    }

    async fn remember_request(&self, owner: &str, key: &str, request: &KeyedRequest) -> Result<(), StoreError> {
        // The first answer for a key stays (`NX`).
        let _: Value = redis::cmd("SET")
            .arg(self.request_key(owner, key))
            .arg(format!("{} {}", request.digest, request.run_id))
            .arg("NX")
            .arg("PX")
            .arg(REQUEST_KEY_RETENTION.as_millis() as u64)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn remembered_request(&self, owner: &str, key: &str) -> Result<Option<KeyedRequest>, StoreError> {
        let value: Option<String> = redis::cmd("GET")
            .arg(self.request_key(owner, key))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(backend)?;
        value
            .map(|value| {
                let (digest, run_id) = value
                    .split_once(' ')
                    .ok_or_else(|| StoreError::Backend(format!("cannot decode idempotency key '{key}'")))?;
                Ok(KeyedRequest {
                    digest: digest
                        .parse()
                        .map_err(|err| StoreError::Backend(format!("cannot decode idempotency key '{key}': {err}")))?,
                    run_id: run_id.to_string(),
                })
            })
            .transpose()
    }
}

#[async_trait]
impl AuditLog for RedisStore {
    async fn append_audit(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        // A stream: appended in order, never trimmed by Loom.
        let _: Value = redis::cmd("XADD")
            .arg(self.index("audit"))
            .arg("*")
            .arg("e")
            .arg(json(entry)?)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn audit_entries(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        // Newest first, a batch at a time, until the query has its limit.
        // The stream's ids are Redis's clock, which may differ from the
        // gateway's by a little: a `since` reads a minute further back and
        // the records' own times decide.
        let oldest = query
            .since_ms
            .map_or_else(|| "-".to_string(), |ms| ms.saturating_sub(60_000).to_string());
        let mut newest = "+".to_string();
        let mut found: Vec<AuditEntry> = Vec::new();
        while found.len() < query.limit {
            let batch: Vec<(String, Vec<(String, String)>)> = redis::cmd("XREVRANGE")
                .arg(self.index("audit"))
                .arg(&newest)
                .arg(&oldest)
                .arg("COUNT")
                .arg(QUERY_BATCH)
                .query_async(&mut self.conn.clone())
                .await
                .map_err(backend)?;
            let Some((last_id, _)) = batch.last() else { break };
            newest = format!("({last_id}");
            let full = batch.len() as isize == QUERY_BATCH;
            for (_, fields) in &batch {
                for (_, body) in fields.iter().filter(|(name, _)| name == "e") {
                    let entry: AuditEntry = serde_json::from_str(body)
                        .map_err(|err| StoreError::Backend(format!("an audit record is not readable: {err}")))?;
                    if query.matches(&entry) {
                        found.push(entry);
                    }
                }
            }
            if !full {
                break;
            }
        }
        found.truncate(query.limit);
        found.reverse();
        Ok(found)
    }
}

impl Store for RedisStore {
    fn address(&self) -> Option<loom_core::StoreAddress> {
        Some(loom_core::StoreAddress {
            url: self.url.clone(),
            prefix: self.prefix.clone(),
        })
    }
}
