//! The Lua scripts of every write that touches more than one key or
//! checks before it writes: Redis runs a script whole, with no other
//! command between its steps, so each is one atomic step.
//!
//! Keys (docs/cluster.md): `{p}run:{id}` a hash of the run's fields;
//! `{p}messages:{id}` a list, `{p}events:{id}` a stream whose entry ids
//! are `0-SEQ`, `{p}journal:{id}` and `{p}results:{id}` hashes by call id
//! (each kind its own namespace, so no run id names another run's key); `{p}runs`, `{p}session:{id}`, `{p}children:{id}` and
//! `{p}status:{STATUS}` sorted sets of run ids by start time. The index
//! keys a script derives from what it reads are built inside it from the
//! prefix, so they are not declared: one Redis, not Redis Cluster.

/// Appends events (`n`, then `seq body` pairs, from `ARGV[i]`) to the
/// stream `key`, skipping any seq not above the last one: a retried write
/// keeps each event once. Returns the index after the pairs.
const APPEND_EVENTS: &str = r#"
local function append_events(key, i)
  local n = tonumber(ARGV[i]); i = i + 1
  local last = 0
  local top = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
  if #top > 0 then last = tonumber(string.match(top[1][1], '^0%-(%d+)$')) end
  for _ = 1, n do
    local seq = tonumber(ARGV[i]); local body = ARGV[i + 1]; i = i + 2
    if seq > last then
      redis.call('XADD', key, '0-' .. ARGV[i - 2], 'e', body)
      last = seq
    end
  end
  return i
end

local function index(p, id, started, run)
  redis.call('ZADD', p .. 'runs', started, id)
  redis.call('ZADD', p .. 'session:' .. run.session_id, started, id)
  if run.parent_run_id ~= '' then
    redis.call('ZADD', p .. 'children:' .. string.sub(run.parent_run_id, 2), started, id)
  end
  redis.call('ZADD', p .. 'status:' .. run.status, started, id)
end

local function move_status(p, run_key, id, from, to)
  local started = redis.call('HGET', run_key, 'started_ms')
  redis.call('HSET', run_key, 'status', to)
  redis.call('ZREM', p .. 'status:' .. from, id)
  redis.call('ZADD', p .. 'status:' .. to, started, id)
end

-- An optional field comes as '=VALUE', or '' for none (so an empty value
-- is kept apart from none).
local function set_optional(key, field, value)
  if value == '' then redis.call('HDEL', key, field) else redis.call('HSET', key, field, string.sub(value, 2)) end
end
"#;

/// The fields of a new run, in `ARGV[3..=14]`: the order [`crate`]'s
/// `new_run_args` writes them in; the optional ones (workspace on) as
/// `=VALUE`, or `''` for none.
const NEW_RUN: &str = r#"
local function new_run(run_key, p, id)
  local run = {
    session_id = ARGV[3], prompt = ARGV[4], model = ARGV[5], status = ARGV[6], owner = ARGV[7],
    started_ms = ARGV[8], metrics = ARGV[9], workspace = ARGV[10], principal = ARGV[11],
    parent_run_id = ARGV[12], parent_turn_id = ARGV[13], request = ARGV[14],
  }
  redis.call('HSET', run_key, 'id', id, 'session_id', run.session_id, 'prompt', run.prompt, 'model', run.model,
    'status', run.status, 'owner', run.owner, 'started_ms', run.started_ms, 'metrics', run.metrics)
  for _, field in ipairs({'workspace', 'principal', 'parent_run_id', 'parent_turn_id', 'request'}) do
    set_optional(run_key, field, run[field])
  end
  index(p, id, run.started_ms, run)
end
"#;

/// `create_run`: KEYS run; ARGV prefix, id, then the new run's fields.
/// A run stored `QUEUED` with its request is taken over (status, owner,
/// model, workspace, metrics; its start time stays); any other existing
/// run is refused.
pub(crate) fn create_run() -> String {
    format!(
        "{APPEND_EVENTS}{NEW_RUN}{}",
        r#"
local run_key, p, id = KEYS[1], ARGV[1], ARGV[2]
if redis.call('EXISTS', run_key) == 1 then
  local status = redis.call('HGET', run_key, 'status')
  if status == 'QUEUED' and redis.call('HEXISTS', run_key, 'request') == 1 and ARGV[6] ~= 'QUEUED' then
    move_status(p, run_key, id, status, ARGV[6])
    redis.call('HSET', run_key, 'owner', ARGV[7], 'model', ARGV[5], 'metrics', ARGV[9])
    set_optional(run_key, 'workspace', ARGV[10])
    return 'taken'
  end
  return 'exists'
end
new_run(run_key, p, id)
return 'created'
"#
    )
}

/// `queue_run`: KEYS run; ARGV prefix, id, the new run's fields (status
/// `QUEUED`, its request), then the idempotency key (`''` for none), its
/// value and its lifetime in ms.
pub(crate) fn queue_run() -> String {
    format!(
        "{APPEND_EVENTS}{NEW_RUN}{}",
        r#"
local run_key, p, id = KEYS[1], ARGV[1], ARGV[2]
if redis.call('EXISTS', run_key) == 1 then return 'exists' end
new_run(run_key, p, id)
if ARGV[15] ~= '' then redis.call('SET', ARGV[15], ARGV[16], 'NX', 'PX', ARGV[17]) end
return 'queued'
"#
    )
}

/// A status change: KEYS run, events; ARGV prefix, id, the statuses it
/// may come from (space-separated), the new status, the end time (`''`
/// keeps it), `=OWNER` to set a new owner (`''` keeps it), `=OWNER` the
/// owner it must have (`''` for any: the `=` keeps an empty owner apart
/// from none), then — when the run ends — `1`, its answer flag and answer,
/// its metrics and events. Returns `{'ok'}`, `{'missing'}`, `{'refused',
/// current}` or `{'other owner'}`.
pub(crate) fn change_status() -> String {
    format!(
        "{APPEND_EVENTS}{}",
        r#"
local run_key, events_key, p, id = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local current = redis.call('HGET', run_key, 'status')
if not current then return {'missing'} end
if ARGV[7] ~= '' and '=' .. (redis.call('HGET', run_key, 'owner') or '') ~= ARGV[7] then return {'other owner'} end
local allowed = false
for from in string.gmatch(ARGV[3], '%S+') do
  if from == current then allowed = true end
end
if not allowed then return {'refused', current} end
move_status(p, run_key, id, current, ARGV[4])
if ARGV[5] ~= '' then redis.call('HSET', run_key, 'ended_ms', ARGV[5]) end
if ARGV[6] ~= '' then redis.call('HSET', run_key, 'owner', string.sub(ARGV[6], 2)) end
if ARGV[8] == '1' then
  if ARGV[9] == '1' then redis.call('HSET', run_key, 'content', ARGV[10]) else redis.call('HDEL', run_key, 'content') end
  redis.call('HSET', run_key, 'metrics', ARGV[11])
  append_events(events_key, 12)
end
return {'ok'}
"#
    )
}

/// `checkpoint`: KEYS run, messages, events; ARGV `1` to replace the
/// history (then its length and messages) or `0`, the new messages' count
/// and messages, the events, the run's state and metrics.
pub(crate) fn checkpoint() -> String {
    format!(
        "{APPEND_EVENTS}{}",
        r#"
local run_key, messages_key, events_key = KEYS[1], KEYS[2], KEYS[3]
if redis.call('EXISTS', run_key) == 0 then return 'missing' end
local i = 1
if ARGV[i] == '1' then
  redis.call('DEL', messages_key)
  local n = tonumber(ARGV[i + 1]); i = i + 2
  for _ = 1, n do redis.call('RPUSH', messages_key, ARGV[i]); i = i + 1 end
else
  i = i + 1
end
local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do redis.call('RPUSH', messages_key, ARGV[i]); i = i + 1 end
i = append_events(events_key, i)
redis.call('HSET', run_key, 'next_turn', ARGV[i], 'metrics', ARGV[i + 1])
return 'ok'
"#
    )
}

/// `append_events`: KEYS run, events; ARGV the events.
pub(crate) fn append_events() -> String {
    format!(
        "{APPEND_EVENTS}{}",
        r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 'missing' end
append_events(KEYS[2], 1)
return 'ok'
"#
    )
}

/// `journal_intent`: KEYS run, journal, results; ARGV call id, start
/// time and call. A call journaled again starts without a result.
pub(crate) const JOURNAL_INTENT: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 'missing' end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2] .. ' ' .. ARGV[3])
redis.call('HDEL', KEYS[3], ARGV[1])
return 'ok'
"#;

/// `journal_result`: KEYS journal, results; ARGV call id and result. A
/// result for a call never journaled is dropped (as an update of no row).
pub(crate) const JOURNAL_RESULT: &str = r#"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 'none' end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 'ok'
"#;
