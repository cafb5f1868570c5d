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

/// Every write script takes the fence of a leased run's writes as its
/// last argument: `''` for none, or `EPOCH RUNKEY` — the write is refused
/// (an error reply `FENCED`) unless the leased run's epoch is still
/// `EPOCH`, checked in the same atomic step as the write
/// (docs/cluster.md, leases). A sub-agent's writes carry its root's fence.
const FENCE: &str = r#"
local function fence_error()
  local fence = ARGV[#ARGV]
  if fence == '' then return nil end
  local epoch, key = string.match(fence, '^(%d+) (.+)$')
  if redis.call('HGET', key, 'epoch') ~= epoch then
    return redis.error_reply('FENCED ' .. key)
  end
  return nil
end
"#;

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
  -- An ended run has nothing left to lease, and is kept for a while.
  if to == 'DONE' or to == 'ERROR' or to == 'CANCELED' or to == 'TIMEOUT' then
    redis.call('ZREM', p .. 'leases', id)
    local t = redis.call('TIME')
    redis.call('ZADD', p .. 'ended', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), id)
  end
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
/// model, workspace, metrics, and its start time, by which its indexes
/// order it again; its acceptance time and request stay); any other
/// existing run is refused.
pub(crate) fn create_run() -> String {
    format!(
        "{FENCE}{APPEND_EVENTS}{NEW_RUN}{}",
        r#"
local fenced = fence_error(); if fenced then return fenced end
local run_key, p, id = KEYS[1], ARGV[1], ARGV[2]
if redis.call('EXISTS', run_key) == 1 then
  local status = redis.call('HGET', run_key, 'status')
  if status == 'QUEUED' and redis.call('HEXISTS', run_key, 'request') == 1 and ARGV[6] ~= 'QUEUED' then
    redis.call('HSET', run_key, 'owner', ARGV[7], 'model', ARGV[5], 'metrics', ARGV[9], 'started_ms', ARGV[8])
    move_status(p, run_key, id, status, ARGV[6])
    set_optional(run_key, 'workspace', ARGV[10])
    local stored = redis.call('HMGET', run_key, 'session_id', 'parent_run_id')
    local parent = ''
    if stored[2] then parent = '=' .. stored[2] end
    index(p, id, ARGV[8], {session_id = stored[1], parent_run_id = parent, status = ARGV[6]})
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
/// value and its lifetime in ms, then the most runs that may wait (`''`
/// for no bound: past it the run is refused, `'full'`), then `'1'` when
/// workers execute it (only such runs are claimed: a gateway that
/// executes its own runs may share the Redis; workers are nudged on
/// `{p}work`).
pub(crate) fn queue_run() -> String {
    format!(
        "{FENCE}{APPEND_EVENTS}{NEW_RUN}{}",
        r#"
local fenced = fence_error(); if fenced then return fenced end
local run_key, p, id = KEYS[1], ARGV[1], ARGV[2]
if redis.call('EXISTS', run_key) == 1 then return 'exists' end
if ARGV[18] ~= '' and redis.call('ZCARD', p .. 'status:QUEUED') >= tonumber(ARGV[18]) then return 'full' end
new_run(run_key, p, id)
redis.call('HSET', run_key, 'accepted_ms', ARGV[8])
if ARGV[15] ~= '' then redis.call('SET', ARGV[15], ARGV[16], 'NX', 'PX', ARGV[17]) end
if ARGV[19] == '1' then
  redis.call('HSET', run_key, 'for_workers', '1')
  redis.call('PUBLISH', p .. 'work', id)
end
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
        "{FENCE}{APPEND_EVENTS}{}",
        r#"
local fenced = fence_error(); if fenced then return fenced end
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
/// and messages, the events, the run's state and metrics, then the
/// controls list of a leased run (`''` for none) and the number of the
/// last control its worker applied: those are taken out of the list.
pub(crate) fn checkpoint() -> String {
    format!(
        "{FENCE}{APPEND_EVENTS}{}",
        r#"
local fenced = fence_error(); if fenced then return fenced end
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
-- The controls its worker had applied are in this checkpoint now.
local controls_key, acked = ARGV[i + 2], tonumber(ARGV[i + 3])
if controls_key ~= '' then
  while true do
    local head = redis.call('LINDEX', controls_key, 0)
    if not head or tonumber(string.match(head, '^(%d+) ')) > acked then break end
    redis.call('LPOP', controls_key)
  end
end
return 'ok'
"#
    )
}

/// `append_events`: KEYS run, events; ARGV the events.
pub(crate) fn append_events() -> String {
    format!(
        "{FENCE}{APPEND_EVENTS}{}",
        r#"
local fenced = fence_error(); if fenced then return fenced end
if redis.call('EXISTS', KEYS[1]) == 0 then return 'missing' end
append_events(KEYS[2], 1)
return 'ok'
"#
    )
}

/// `journal_intent`: KEYS run, journal, results; ARGV call id, start
/// time and call. A call journaled again starts without a result.
pub(crate) fn journal_intent() -> String {
    format!(
        "{FENCE}{}",
        r#"
local fenced = fence_error(); if fenced then return fenced end
if redis.call('EXISTS', KEYS[1]) == 0 then return 'missing' end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2] .. ' ' .. ARGV[3])
redis.call('HDEL', KEYS[3], ARGV[1])
return 'ok'
"#
    )
}

/// `journal_result`: KEYS journal, results; ARGV call id and result. A
/// result for a call never journaled is dropped (as an update of no row).
pub(crate) fn journal_result() -> String {
    format!(
        "{FENCE}{}",
        r#"
local fenced = fence_error(); if fenced then return fenced end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 'none' end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 'ok'
"#
    )
}

/// The time on Redis's clock, in ms: every lease is judged by one clock,
/// whichever machine its worker runs on.
const NOW: &str = r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"#;

/// `claim_next`: ARGV prefix, owner, lease in ms, the most runs of one
/// principal executing at once (0: no cap). Takes the oldest run
/// whose lease ended (`{p}leases`, lease ends by run) — a queued run to
/// start, or an active one to resume, moved to `INTERRUPTED` — else the
/// oldest queued run (with its request) that nobody leases and whose
/// session has no other run executing (queued for workers: see
/// `queue_run`). Raises the run's epoch. Returns `{'start', id, epoch,
/// request}`, `{'resume', id, epoch}` or `{}`.
pub(crate) fn claim_next() -> String {
    format!(
        "{APPEND_EVENTS}{NOW}{}",
        r#"
local p, owner, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local leases = p .. 'leases'
local function lease(key, id)
  local epoch = redis.call('HINCRBY', key, 'epoch', 1)
  redis.call('HSET', key, 'lease_owner', owner)
  redis.call('ZADD', leases, now + ttl, id)
  return epoch
end
-- A session executes one run at a time: one leased, parked (it goes on
-- once answered), or executing without a lease (a process of its own).
local busy = {}
local function session_busy(session, id)
  if busy[session] ~= nil then return busy[session] end
  busy[session] = false
  for _, other in ipairs(redis.call('ZRANGE', p .. 'session:' .. session, 0, -1)) do
    if other ~= id then
      local status = redis.call('HGET', p .. 'run:' .. other, 'status')
      if redis.call('ZSCORE', leases, other) or redis.call('ZSCORE', p .. 'parked', other)
        or status == 'RUNNING' or status == 'WAITING_PERMISSION' then
        busy[session] = true
        break
      end
    end
  end
  return busy[session]
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, 20)) do
  local key = p .. 'run:' .. id
  local status = redis.call('HGET', key, 'status')
  if status == 'QUEUED' then
    return {'start', id, lease(key, id), redis.call('HGET', key, 'request') or ''}
  elseif status == 'RUNNING' or status == 'WAITING_PERMISSION' or status == 'INTERRUPTED' then
    if status ~= 'INTERRUPTED' then move_status(p, key, id, status, 'INTERRUPTED') end
    return {'resume', id, lease(key, id)}
  else
    redis.call('ZREM', leases, id)
  end
end
-- Runs executing per principal, when a cap asks for them.
local cap = tonumber(ARGV[4])
local executing = {}
if cap > 0 then
  for _, other in ipairs(redis.call('ZRANGE', leases, 0, -1)) do
    local principal = redis.call('HGET', p .. 'run:' .. other, 'principal') or ''
    executing[principal] = (executing[principal] or 0) + 1
  end
end
for _, id in ipairs(redis.call('ZRANGE', p .. 'status:QUEUED', 0, 99)) do
  local key = p .. 'run:' .. id
  if not redis.call('ZSCORE', leases, id) and redis.call('HGET', key, 'for_workers') == '1' then
    local principal = redis.call('HGET', key, 'principal') or ''
    if (cap == 0 or (executing[principal] or 0) < cap)
      and not session_busy(redis.call('HGET', key, 'session_id'), id) then
      return {'start', id, lease(key, id), redis.call('HGET', key, 'request')}
    end
  end
end
return {}
"#
    )
}

/// `renew`: KEYS run, controls; ARGV prefix, id, epoch, lease in ms, the
/// number of the last control the worker has. Returns `{'lost'}` when
/// the epoch moved on, `{'ended'}` when the run ended, else `{'held',
/// control...}` with the controls after that number (each `N JSON`, at
/// most 100). Controls stay in the list until a checkpoint of the run
/// acknowledges them (`checkpoint`): a worker that dies first leaves
/// them to the next.
pub(crate) fn renew() -> String {
    format!(
        "{NOW}{}",
        r#"
local run_key, controls_key, p, id = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
if redis.call('HGET', run_key, 'epoch') ~= ARGV[3] then return {'lost'} end
local status = redis.call('HGET', run_key, 'status')
if status ~= 'QUEUED' and status ~= 'RUNNING' and status ~= 'WAITING_PERMISSION' and status ~= 'INTERRUPTED' then
  redis.call('ZREM', p .. 'leases', id)
  return {'ended'}
end
redis.call('ZADD', p .. 'leases', now_ms() + tonumber(ARGV[4]), id)
local after = tonumber(ARGV[5])
local reply = {'held'}
for _, control in ipairs(redis.call('LRANGE', controls_key, 0, 199)) do
  if tonumber(string.match(control, '^(%d+) ')) > after and #reply <= 100 then
    table.insert(reply, control)
  end
end
return reply
"#
    )
}

/// `release`: KEYS run; ARGV prefix, id, epoch. The lease ends now (if
/// it is still this epoch's), so the next claim takes the run (workers
/// are nudged on `{p}work`); the epoch moves on, so nothing more of the
/// releasing worker lands.
pub(crate) const RELEASE: &str = r#"
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[3] then return 'lost' end
-- A renewal or write of the releasing worker still on its way is stale.
redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('ZADD', ARGV[1] .. 'leases', 'XX', 0, ARGV[2])
redis.call('PUBLISH', ARGV[1] .. 'work', ARGV[2])
return 'ok'
"#;

/// `send_control`: KEYS run, controls; ARGV the control (JSON), how long
/// it is kept in ms, prefix, id. Each control is numbered (`N JSON`). A
/// parked run (see `PARK`) becomes claimable at once, so that a worker
/// takes it and hears the control (workers are nudged on `{p}work`); the
/// worker of a leased one is nudged on `{p}nudge:OWNER`. Returns `'ok'`, `'ended'` (nothing
/// kept) or `'missing'`.
pub(crate) const SEND_CONTROL: &str = r#"
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 'missing' end
if status ~= 'QUEUED' and status ~= 'RUNNING' and status ~= 'WAITING_PERMISSION' and status ~= 'INTERRUPTED' then
  return 'ended'
end
local n = redis.call('HINCRBY', KEYS[1], 'control_seq', 1)
redis.call('RPUSH', KEYS[2], n .. ' ' .. ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
if redis.call('ZREM', ARGV[3] .. 'parked', ARGV[4]) == 1 then
  redis.call('ZADD', ARGV[3] .. 'leases', 0, ARGV[4])
  redis.call('PUBLISH', ARGV[3] .. 'work', ARGV[4])
else
  -- Its worker hears it now rather than at its next renewal.
  local owner = redis.call('HGET', KEYS[1], 'lease_owner')
  if owner then redis.call('PUBLISH', ARGV[3] .. 'nudge:' .. owner, ARGV[4]) end
end
return 'ok'
"#;

/// `park`: KEYS run, controls; ARGV prefix, id, epoch, the number of the
/// last control the worker heard, how long until a run with controls it
/// heard (and no checkpoint acknowledged) is tried again, in ms. A run its worker
/// interrupted while it waited for a person leaves the leases for
/// `{p}parked` (scored by when), where no worker takes it, until a
/// control comes (`SEND_CONTROL`); one the worker had not heard yet
/// makes it claimable at once (those it heard and no checkpoint
/// acknowledged stay in the list, for whoever resumes it). The epoch moves on (a late
/// renewal of the parking worker finds the lease lost). A parked run is
/// stored `WAITING_PERMISSION`, as the gateway shows it (its worker stopped
/// it `INTERRUPTED`; a claim moves it back to resume it). Returns
/// `'parked'`, `'claimable'`, `'later'` or `'lost'`.
pub(crate) fn park() -> String {
    format!(
        "{APPEND_EVENTS}{}",
        r#"
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[3] then return 'lost' end
redis.call('HINCRBY', KEYS[1], 'epoch', 1)
-- A control the worker has not heard yet: the run is wanted now. One it
-- heard and no checkpoint acknowledged may not have taken effect: the run
-- is tried again in a few seconds (not at once: it would be parked again
-- at once, for ever, if the control does not concern its ask).
local heard_only = false
for _, control in ipairs(redis.call('LRANGE', KEYS[2], 0, 199)) do
  if tonumber(string.match(control, '^(%d+) ')) > tonumber(ARGV[4]) then
    redis.call('ZADD', ARGV[1] .. 'leases', 0, ARGV[2])
    redis.call('PUBLISH', ARGV[1] .. 'work', ARGV[2])
    return 'claimable'
  end
  heard_only = true
end
if heard_only then
  local t = redis.call('TIME')
  redis.call('ZADD', ARGV[1] .. 'leases', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[5]), ARGV[2])
  return 'later'
end
redis.call('ZREM', ARGV[1] .. 'leases', ARGV[2])
local t = redis.call('TIME')
redis.call('ZADD', ARGV[1] .. 'parked', tonumber(t[1]), ARGV[2])
if redis.call('HGET', KEYS[1], 'status') == 'INTERRUPTED' then
  move_status(ARGV[1], KEYS[1], ARGV[2], 'INTERRUPTED', 'WAITING_PERMISSION')
end
return 'parked'
"#
    )
}

/// `withdraw`: KEYS run, events; ARGV prefix, id, end time, metrics,
/// then the events. Cancels a run still `QUEUED` that no worker leases;
/// returns `'ok'`, else `'taken'`.
pub(crate) fn withdraw() -> String {
    format!(
        "{APPEND_EVENTS}{}",
        r#"
local run_key, events_key, p, id = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
if redis.call('HGET', run_key, 'status') ~= 'QUEUED' or redis.call('ZSCORE', p .. 'leases', id) then
  return 'taken'
end
move_status(p, run_key, id, 'QUEUED', 'CANCELED')
redis.call('HSET', run_key, 'ended_ms', ARGV[3], 'metrics', ARGV[4])
append_events(events_key, 5)
return 'ok'
"#
    )
}

/// `forget_ended`: ARGV prefix, cutoff (ms since the epoch), how many at
/// most. Removes the runs that ended before the cutoff (`{p}ended`, by
/// end time): their keys and their places in every index; their ids join
/// `{p}snap-forget`, whose workspace snapshots are forgotten next
/// (`snapshots.rs`). Returns how many.
pub(crate) const FORGET_ENDED: &str = r#"
local p = ARGV[1]
local ids = redis.call('ZRANGEBYSCORE', p .. 'ended', '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do
  local key = p .. 'run:' .. id
  local run = redis.call('HMGET', key, 'session_id', 'parent_run_id', 'status')
  if run[1] then redis.call('ZREM', p .. 'session:' .. run[1], id) end
  if run[2] then redis.call('ZREM', p .. 'children:' .. run[2], id) end
  if run[3] then redis.call('ZREM', p .. 'status:' .. run[3], id) end
  redis.call('ZREM', p .. 'runs', id)
  redis.call('ZREM', p .. 'ended', id)
  redis.call('DEL', key, p .. 'messages:' .. id, p .. 'events:' .. id, p .. 'journal:' .. id,
    p .. 'results:' .. id, p .. 'controls:' .. id)
  redis.call('SADD', p .. 'snap-forget', id)
end
return #ids
"#;

/// `queue_position`: ARGV prefix, id. 1 for the oldest queued run that no
/// worker took yet; `false` when the run does not wait.
pub(crate) const QUEUE_POSITION: &str = r#"
local p, id = ARGV[1], ARGV[2]
if redis.call('HGET', p .. 'run:' .. id, 'status') ~= 'QUEUED' or redis.call('ZSCORE', p .. 'leases', id) then
  return false
end
local rank = redis.call('ZRANK', p .. 'status:QUEUED', id)
if not rank then return false end
-- Runs a worker took are still QUEUED until they start: not ahead.
local position = 0
for _, other in ipairs(redis.call('ZRANGE', p .. 'status:QUEUED', 0, rank)) do
  if not redis.call('ZSCORE', p .. 'leases', other) then position = position + 1 end
end
return position
"#;

/// `failed_start`: KEYS run; ARGV epoch. Counts a start that failed on a
/// worker (its model or a tool could not be set up); returns the count,
/// or `-1` when the lease was lost.
pub(crate) const FAILED_START: &str = r#"
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
return redis.call('HINCRBY', KEYS[1], 'failed_starts', 1)
"#;

/// `put_snapshot_point` (`snapshots.rs`): ARGV prefix, run, step, the
/// point's record, its base (`RUN\nSTEP` or `''`), the workspace it is the
/// head of (or `''`) and the head's value, the number of content hashes
/// the point needs and those, the number of contents sent and `hash data`
/// pairs, the fence. Refused (`MISSING`) when its base was forgotten (a
/// sweep removed the run) or a content it needs is neither kept nor sent:
/// the writer reads the files again.
pub(crate) fn put_snapshot_point() -> String {
    format!(
        "{FENCE}{}",
        r#"
local refused = fence_error()
if refused then return refused end
local p, run, step = ARGV[1], ARGV[2], ARGV[3]
if ARGV[5] ~= '' then
  local base_run, base_step = string.match(ARGV[5], '^(.*)\n(%d+)$')
  if not base_run or redis.call('HEXISTS', p .. 'snap-point:' .. base_run, base_step) == 0 then
    return redis.error_reply('MISSING the snapshot it is based on was forgotten: ' .. ARGV[5])
  end
end
local i = 8
local needed = {}
local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do needed[#needed + 1] = ARGV[i]; i = i + 1 end
local sent = {}
local first_sent = i + 1
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do sent[ARGV[i]] = true; i = i + 2 end
-- Checked before anything is written: a refused point leaves nothing.
for _, hash in ipairs(needed) do
  if not sent[hash] and redis.call('EXISTS', p .. 'snap-content:' .. hash) == 0 then
    return redis.error_reply('MISSING a content of the snapshot is not kept: ' .. hash)
  end
end
i = first_sent
for _ = 1, n do
  redis.call('SET', p .. 'snap-content:' .. ARGV[i], ARGV[i + 1], 'NX')
  i = i + 2
end
for _, hash in ipairs(needed) do
  redis.call('SADD', p .. 'snap-uses:' .. run, hash)
  redis.call('SADD', p .. 'snap-users:' .. hash, run)
end
redis.call('HSET', p .. 'snap-point:' .. run, step, ARGV[4])
if ARGV[5] ~= '' then
  local base_run = string.match(ARGV[5], '^(.*)\n')
  redis.call('SADD', p .. 'snap-based:' .. base_run, run .. '\n' .. step)
end
if ARGV[6] ~= '' then redis.call('HSET', p .. 'snap-heads', ARGV[6], ARGV[7]) end
return 'OK'
"#
    )
}

/// `rebase_snapshots`: ARGV prefix, how many points, then per point: its
/// run, its step, its new record, its new base (`RUN\nSTEP` or `''`), the
/// number of content hashes its new delta needs and those; the fence last.
/// A point gone meanwhile stays gone; a new base gone meanwhile refuses
/// the whole (`RACED`: computed again, it goes through).
pub(crate) fn rebase_snapshots() -> String {
    format!(
        "{FENCE}{}",
        r#"
local refused = fence_error()
if refused then return refused end
local p = ARGV[1]
local points = {}
local i = 3
for _ = 1, tonumber(ARGV[2]) do
  local point = {run = ARGV[i], step = ARGV[i + 1], record = ARGV[i + 2], base = ARGV[i + 3], hashes = {}}
  local n = tonumber(ARGV[i + 4]); i = i + 5
  for _ = 1, n do point.hashes[#point.hashes + 1] = ARGV[i]; i = i + 1 end
  points[#points + 1] = point
end
-- Checked before anything is written.
for _, point in ipairs(points) do
  if point.base ~= '' then
    local base_run, base_step = string.match(point.base, '^(.*)\n(%d+)$')
    if not base_run or redis.call('HEXISTS', p .. 'snap-point:' .. base_run, base_step) == 0 then
      return redis.error_reply('RACED the base ' .. point.base .. ' was forgotten')
    end
  end
end
for _, point in ipairs(points) do
  if redis.call('HEXISTS', p .. 'snap-point:' .. point.run, point.step) == 1 then
    redis.call('HSET', p .. 'snap-point:' .. point.run, point.step, point.record)
    if point.base ~= '' then
      local base_run = string.match(point.base, '^(.*)\n')
      redis.call('SADD', p .. 'snap-based:' .. base_run, point.run .. '\n' .. point.step)
    end
    for _, hash in ipairs(point.hashes) do
      redis.call('SADD', p .. 'snap-uses:' .. point.run, hash)
      redis.call('SADD', p .. 'snap-users:' .. hash, point.run)
    end
  end
end
return 'OK'
"#
    )
}

/// `forget_snapshots`: ARGV prefix, run. Removes the run's points (those
/// based on them were rebased first), the heads at them, its place in its
/// bases' sets, and every content no other run needs. Refused (`RACED`)
/// when a point of another run was recorded from one of them since they
/// were rebased: the caller rebases again.
pub(crate) const FORGET_SNAPSHOTS: &str = r#"
local p, run = ARGV[1], ARGV[2]
for _, member in ipairs(redis.call('SMEMBERS', p .. 'snap-based:' .. run)) do
  local other, step = string.match(member, '^(.*)\n(%d+)$')
  if other and other ~= run then
    local text = redis.call('HGET', p .. 'snap-point:' .. other, step)
    if text then
      local ok, record = pcall(cjson.decode, text)
      if ok and type(record.base) == 'table' and record.base[1] == run then
        return redis.error_reply('RACED a snapshot was recorded from it meanwhile: ' .. member)
      end
    end
  end
end
local points = redis.call('HGETALL', p .. 'snap-point:' .. run)
for k = 1, #points, 2 do
  local ok, record = pcall(cjson.decode, points[k + 1])
  if ok and type(record.base) == 'table' then
    redis.call('SREM', p .. 'snap-based:' .. record.base[1], run .. '\n' .. points[k])
  end
end
local heads = redis.call('HGETALL', p .. 'snap-heads')
for k = 1, #heads, 2 do
  local ok, head = pcall(cjson.decode, heads[k + 1])
  if ok and head[1] == run then redis.call('HDEL', p .. 'snap-heads', heads[k]) end
end
for _, hash in ipairs(redis.call('SMEMBERS', p .. 'snap-uses:' .. run)) do
  redis.call('SREM', p .. 'snap-users:' .. hash, run)
  if redis.call('SCARD', p .. 'snap-users:' .. hash) == 0 then
    redis.call('DEL', p .. 'snap-content:' .. hash)
  end
end
redis.call('DEL', p .. 'snap-point:' .. run, p .. 'snap-uses:' .. run, p .. 'snap-based:' .. run)
return 'OK'
"#;
