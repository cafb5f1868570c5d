// Loom's web page: the gateway's HTTP API, seen by a person. Everything a
// model, a tool or a prompt wrote is put on the page with textContent,
// never as HTML. One EventSource per tab: the open run's event stream.

const $ = (id) => document.getElementById(id);

/** An element with text (never HTML) and optional class and children. */
function el(tag, cls, text, ...children) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const child of children) if (child) node.append(child);
  return node;
}

async function api(method, path, body) {
  const init = { method, headers: {}, credentials: 'same-origin' };
  if (body !== undefined) {
    init.headers['content-type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (!response.ok) {
    const message = data && data.error ? data.error.message : response.statusText;
    const error = new Error(message);
    error.status = response.status;
    throw error;
  }
  return data;
}

// ---- Signing in ----------------------------------------------------------

async function checkSession() {
  try {
    const me = await api('GET', '/v1/session');
    signedIn(me.principal, me.role);
  } catch {
    $('sign-in').hidden = false;
    $('app').hidden = true;
    $('sign-out').hidden = true;
    $('who').textContent = '';
  }
}

function signedIn(principal, role) {
  // A viewer or an admin is told so: what the page lets them do differs.
  const shown = role && role !== 'operator' ? ` (${role})` : '';
  $('who').textContent = `signed in as ${principal}${shown}`;
  $('sign-in').hidden = true;
  $('app').hidden = false;
  $('sign-out').hidden = false;
  refreshRuns();
  const wanted = new URLSearchParams(location.hash.slice(1)).get('run');
  if (wanted) openRun(wanted);
}

$('sign-in-form').addEventListener('submit', async (event) => {
  event.preventDefault();
  $('sign-in-error').textContent = '';
  try {
    const me = await api('POST', '/v1/session', { token: $('token').value });
    $('token').value = '';
    signedIn(me.principal, me.role);
  } catch (error) {
    $('sign-in-error').textContent = error.status === 401 ? 'That token is not valid on this server.' : error.message;
  }
});

$('sign-out').addEventListener('click', async () => {
  await api('DELETE', '/v1/session').catch(() => {});
  closeStream();
  location.hash = '';
  location.reload();
});

// ---- The runs list (polled: it is not an event stream) -------------------

let listTimer = null;
let listGeneration = 0;

async function refreshRuns() {
  clearTimeout(listTimer);
  // Only the newest call draws and schedules the next: a slow answer to
  // an older filter never overwrites a newer one.
  const generation = ++listGeneration;
  const params = new URLSearchParams({ limit: '50' });
  if ($('filter-status').value) params.set('status', $('filter-status').value);
  if ($('filter-session').value.trim()) params.set('sessionId', $('filter-session').value.trim());
  try {
    const page = await api('GET', `/v1/runs?${params}`);
    if (generation !== listGeneration) return;
    renderRuns(page.runs);
  } catch (error) {
    if (generation !== listGeneration) return;
    if (error.status === 401) return checkSession();
  }
  listTimer = setTimeout(refreshRuns, 1500);
}

function renderRuns(runs) {
  const body = $('run-table').tBodies[0];
  body.replaceChildren();
  // A sub-agent shows in its parent's tree, not as a run of its own.
  for (const run of runs.filter((r) => !r.parentRunId)) {
    const m = run.metrics || {};
    const tokens = (m.inputTokens || 0) + (m.outputTokens || 0);
    const ended = run.endedMs || Date.now();
    const row = el('tr', run.runId === openRunId ? 'selected' : '',
      undefined,
      el('td', `status ${run.status}`, run.status),
      el('td', 'prompt-cell', run.prompt),
      el('td', '', run.model),
      // A queued run has not started: its time is when it was accepted.
      el('td', '', new Date(run.startedMs ?? run.acceptedMs).toLocaleTimeString()),
      el('td', '', run.startedMs ? seconds(ended - run.startedMs) : ''),
      el('td', '', m.iterations ?? ''),
      el('td', '', tokens || ''),
      el('td', '', m.costUsd != null ? `$${m.costUsd.toFixed(4)}` : ''));
    row.tabIndex = 0;
    row.dataset.runId = run.runId;
    row.addEventListener('click', () => openRun(run.runId));
    row.addEventListener('keydown', (event) => { if (event.key === 'Enter') openRun(run.runId); });
    body.append(row);
  }
}

$('filter-status').addEventListener('change', refreshRuns);
$('filter-session').addEventListener('input', refreshRuns);

$('start-form').addEventListener('submit', async (event) => {
  event.preventDefault();
  $('start-error').textContent = '';
  const body = { prompt: $('prompt').value };
  if ($('session').value.trim()) body.sessionId = $('session').value.trim();
  if ($('max-steps').value) body.maxSteps = Number($('max-steps').value);
  try {
    const accepted = await api('POST', '/v1/runs', body);
    $('prompt').value = '';
    refreshRuns();
    openRun(accepted.runId);
  } catch (error) {
    $('start-error').textContent = error.message;
  }
});

// ---- A run: its events folded into a tree ---------------------------------

let openRunId = null;
let stream = null;
let model = null;
let renderQueued = false;

/** An empty run as the events will fill it. */
function newRun(runId) {
  return { runId, status: 'QUEUED', prompt: '', model: '', turns: [], turnById: new Map(), asks: new Map(),
           notes: [], seen: new Set(), started: false, content: null, startTs: null, endTs: null,
           snapshots: new Map(), forkedFrom: null, links: [] };
}

let streamRunId = null;

function closeStream() {
  if (stream) stream.close();
  stream = null;
  streamRunId = null;
}

/** Follows one run's events from the start of its log (the tab's one stream). */
function follow(runId) {
  closeStream();
  streamRunId = runId;
  // The browser resumes a dropped stream with Last-Event-ID by itself.
  stream = new EventSource(`/v1/runs/${encodeURIComponent(runId)}/events?afterSeq=0`);
  for (const name of EVENT_NAMES) {
    stream.addEventListener(name, (message) => {
      // Loom's `error` event shares its name with EventSource's own
      // connection error, which carries no data.
      if (typeof message.data === 'string') onEvent(JSON.parse(message.data));
    });
  }
  stream.onerror = () => {
    const run = model && model.runs.get(streamRunId);
    // Ended, or refused for good (the browser gives up).
    if ((run && run.endTs) || stream.readyState === EventSource.CLOSED) { closeStream(); return; }
    // The browser retries by itself; a session the server no longer knows
    // (it restarted) means signing in again, then the same view rebuilds.
    api('GET', '/v1/session').catch((error) => {
      if (error.status === 401) { closeStream(); checkSession(); }
    });
  };
}

/**
 * A sub-agent's events reach its parent's stream live only: one that ran
 * while this page was not following (before a reload, before the page
 * opened the run, in a reconnect gap) is read from its own log as soon as
 * the parent's `task` result names it. The read is a plain fetch of the
 * finished sub-agent's stream, so the tab's one EventSource keeps following
 * the parent; one read at a time, and only for a sub-agent whose log the
 * page does not hold whole.
 */
function readChildLog(child) {
  if (!model || model.requested.has(child)) return;
  const known = model.runs.get(child);
  if (known && known.endSeq && known.seen.size >= known.endSeq) return;
  model.requested.add(child);
  model.toRead.push(child);
  if (!model.reading) readNextChildLog(model);
}

async function readNextChildLog(owner) {
  owner.reading = true;
  while (owner === model && owner.toRead.length) {
    const child = owner.toRead.shift();
    try {
      await readLog(child, owner);
    } catch {
      // The log could not be read (signed out, the gateway went away): the
      // live events already shown stay; a reload tries again.
    }
  }
  owner.reading = false;
}

/** Reads a run's event log to its end and hands each event to `onEvent`. */
async function readLog(runId, owner) {
  const response = await fetch(`/v1/runs/${encodeURIComponent(runId)}/events?afterSeq=0`,
    { credentials: 'same-origin', signal: owner.abort.signal });
  if (!response.ok || !response.body) return;
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffered = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done || owner !== model) break;
      buffered += value.replace(/\r\n?/g, '\n');
      let end;
      while ((end = buffered.indexOf('\n\n')) >= 0) {
        const data = buffered.slice(0, end).split('\n')
          .filter((line) => line.startsWith('data:')).map((line) => line.slice(5).trimStart()).join('\n');
        buffered = buffered.slice(end + 2);
        if (data) onEvent(JSON.parse(data));
      }
    }
  } finally {
    // Done, another run opened, or a bad event: let the connection go.
    reader.cancel().catch(() => {});
  }
}

/** The sub-agent a finished `task` call names in its result. */
function childNamed(call) {
  const named = call.name === 'task' && /^sub-agent (\S+) \(/.exec(call.content || '');
  return named ? named[1] : null;
}

function openRun(runId) {
  closeStream();
  $('rewind-result').replaceChildren();
  if (model) model.abort.abort();
  openRunId = runId;
  location.hash = `run=${encodeURIComponent(runId)}`;
  model = { root: newRun(runId), runs: new Map(), requested: new Set(), toRead: [], reading: false,
            abort: new AbortController() };
  model.runs.set(runId, model.root);
  $('run').hidden = false;
  for (const row of $('run-table').tBodies[0].rows) row.classList.toggle('selected', row.dataset.runId === runId);
  render();
  // From the start of the log: a reload rebuilds the same tree.
  follow(runId);
}

const EVENT_NAMES = ['lifecycle.start', 'iteration.start', 'phase.start', 'phase.end', 'retrieval.start',
  'retrieval.complete', 'context.warning', 'compression.applied', 'llm.start', 'llm.delta', 'llm.finish',
  'tool_calls.start', 'permission.request', 'permission.resolved', 'hook.result', 'tool.output', 'tool.result',
  'tool_calls.complete', 'guidance.injected', 'warning', 'recursion', 'step.completed', 'max_iterations.reached',
  'execution.cancelled', 'agent.finish', 'error', 'lifecycle.end', 'steer.applied', 'run.paused', 'run.resumed',
  'snapshot.recorded', 'run.rewound', 'run.forked'];

function turnOf(run, event) {
  let turn = run.turnById.get(event.turnId);
  if (!turn) {
    turn = { id: event.turnId, iteration: run.turns.length, text: '', calls: [], notes: [],
             llmStart: null, llmMs: null, usage: null, cost: null, finish: null, toolsMs: 0, waitMs: 0, toolsStart: null };
    run.turnById.set(event.turnId, turn);
    run.turns.push(turn);
  }
  return turn;
}

function runOf(event) {
  let run = model.runs.get(event.runId);
  if (!run) {
    run = newRun(event.runId);
    run.parentRunId = event.parentRunId;
    model.runs.set(event.runId, run);
  }
  return run;
}

function onEvent(event) {
  if (!model) return;
  const run = runOf(event);
  if (run.seen.has(event.seq)) return; // seen already (a resumed stream, a sub-agent's log)
  run.seen.add(event.seq);
  const ts = Date.parse(event.ts);
  const type = event.type;
  if (type === 'lifecycle.start') {
    run.prompt = event.prompt; run.model = event.model; run.startTs = ts; run.status = 'RUNNING'; run.started = true;
    run.forkedFrom = event.forkedFrom || null;
    if (event.parentRunId) linkChild(run, event);
  } else if (type === 'snapshot.recorded') {
    // The files each step changed go under the turn whose tools ran.
    run.snapshots.set(event.step, event);
    if (event.step > 0) turnOf(run, event).snapshot = event;
    if (event.skipped && event.skipped.length) {
      turnOf(run, event).notes.push(`left out of the snapshot for their size: ${event.skipped.map((f) => f.path).join(', ')}`);
    }
  } else if (type === 'run.rewound') {
    run.links.push({ text: `rewound to step ${event.toStep}` + (event.files.length ? ` (${event.files.join(', ')})` : '')
      + (event.continuedBy ? '; the session continues in' : ''), runId: event.continuedBy || null });
  } else if (type === 'run.forked') {
    run.links.push({ text: `forked at step ${event.step} into`, runId: event.forkRunId });
  } else if (type === 'iteration.start') {
    turnOf(run, event).iteration = event.iteration;
  } else if (type === 'llm.start') {
    turnOf(run, event).llmStart = ts;
  } else if (type === 'llm.delta') {
    turnOf(run, event).text += event.text;
  } else if (type === 'llm.finish') {
    const turn = turnOf(run, event);
    turn.text = event.content; turn.usage = event.usage; turn.cost = event.costUsd; turn.finish = event.finishReason;
    if (turn.llmStart) turn.llmMs = ts - turn.llmStart;
  } else if (type === 'tool_calls.start') {
    const turn = turnOf(run, event);
    turn.toolsStart = ts;
    for (const call of event.calls) {
      turn.calls.push({ callId: call.callId, name: call.name, args: call.args, status: 'running', content: '',
                        output: '', durationMs: null, stages: null, decidedBy: null, hooks: [], children: [] });
    }
  } else if (type === 'tool_calls.complete') {
    const turn = turnOf(run, event);
    if (turn.toolsStart) turn.toolsMs = ts - turn.toolsStart - turn.waitMs;
  } else if (type === 'tool.output') {
    const call = findCall(run, event.callId);
    if (call) call.output += event.text;
  } else if (type === 'tool.result') {
    const call = findCall(run, event.callId);
    if (call) {
      Object.assign(call, { status: event.status, content: event.content, durationMs: event.durationMs, stages: event.stages,
                            decidedBy: event.decidedBy ?? null });
      const child = childNamed(call);
      if (child) {
        // The result names its sub-agent: that link wins over a guess.
        for (const other of run.turns.flatMap((t) => t.calls)) {
          if (other !== call) other.children = other.children.filter((id) => id !== child);
        }
        if (!call.children.includes(child)) call.children.push(child);
        readChildLog(child);
      }
    }
  } else if (type === 'permission.request') {
    run.asks.set(event.requestId, { runId: run.runId, requestId: event.requestId, tool: event.tool, args: event.args, since: ts });
  } else if (type === 'permission.resolved') {
    const ask = run.asks.get(event.requestId);
    if (ask) turnOf(run, event).waitMs += ts - ask.since;
    run.asks.delete(event.requestId);
  } else if (type === 'hook.result') {
    // A tool call's hooks go under the call; the run's own (its start, its end) under the turn.
    const line = hookLine(event);
    const call = event.callId ? findCall(run, event.callId) : null;
    if (call) call.hooks.push(line); else turnOf(run, event).notes.push(line);
  } else if (type === 'compression.applied') {
    turnOf(run, event).notes.push(`history compressed (${event.method}): ${event.messagesBefore} → ${event.messagesAfter} messages, ${event.tokensBefore} → ${event.tokensAfter} tokens`);
  } else if (type === 'guidance.injected') {
    turnOf(run, event).notes.push(`guidance (${event.reason}): ${event.content}`);
  } else if (type === 'warning' || type === 'error') {
    run.notes.push(`${type} [${event.code}]: ${event.message}`);
  } else if (type === 'execution.cancelled') {
    run.notes.push(`cancelled: ${event.reason}`);
  } else if (type === 'lifecycle.end') {
    run.status = event.status; run.content = event.content; run.endTs = ts; run.endSeq = event.seq;
    run.asks.clear();
    if (run === model.root) refreshRuns();
    if (run.runId === streamRunId) {
      closeStream();
      // A rewind or a fork of an ended run is told after its end: read
      // the log to its end once (the events seen already are skipped).
      const owner = model;
      readLog(run.runId, owner).catch(() => {});
    }
  }
  queueRender();
}

/** One hook's run in words: where, which, what it decided or why it failed. */
function hookLine(event) {
  const what = [event.decision, event.argumentsRewritten ? 'rewrote the arguments' : null,
    event.context ? `added: ${event.context}` : null].filter(Boolean).join(', ');
  const outcome = event.error ? `failed: ${event.error}` : (what || 'no opinion') + (event.reason ? ` — ${event.reason}` : '');
  return `${event.hookEvent} hook ${event.hook}: ${outcome}`;
}

function findCall(run, callId) {
  for (const turn of run.turns) for (const call of turn.calls) if (call.callId === callId) return call;
  return null;
}

/** A sub-agent goes under the `task` call of its parent's turn that asked for it. */
function linkChild(child, event) {
  const parent = model.runs.get(event.parentRunId);
  if (!parent) return;
  const calls0 = parent.turns.flatMap((t) => t.calls);
  if (calls0.some((c) => c.children.includes(child.runId))) return;
  const turn = parent.turnById.get(event.parentTurnId);
  const calls = (turn ? [turn] : parent.turns).flatMap((t) => t.calls).filter((c) => c.name === 'task');
  const call = calls.find((c) => c.args && c.args.prompt === event.prompt && !c.children.length)
    || calls.find((c) => !c.children.length) || calls[0];
  if (call) call.children.push(child.runId);
}

function queueRender() {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => { renderQueued = false; render(); });
}

// ---- Drawing ---------------------------------------------------------------

function render() {
  if (!model) return;
  const root = model.root;
  $('run-title').textContent = `Run ${root.runId}`;
  $('run-status').textContent = root.status;
  $('run-status').className = `status ${root.status}`;
  $('run-prompt').textContent = root.prompt;
  const live = !root.endTs;
  $('cancel').hidden = !live;
  $('steer-form').hidden = !live;
  renderLinks(root);
  renderRewind(root, live);
  renderAsks();
  renderTimeline(root);
  $('tree').replaceChildren(...runTree(root));
  $('answer').replaceChildren(...(root.content != null && root.endTs
    ? [el('h3', '', 'Answer'), el('div', 'text', root.content)] : []));
}

function renderAsks() {
  const asks = [...model.runs.values()].flatMap((run) => [...run.asks.values()]);
  $('asks').replaceChildren(...asks.map((ask) => {
    const box = el('div', 'ask', undefined,
      el('strong', '', `Allow ${ask.tool}?`),
      ask.runId !== model.root.runId ? el('span', 'muted', ` (sub-agent ${ask.runId})`) : null,
      el('pre', '', JSON.stringify(ask.args, null, 2)));
    const buttons = el('div', 'row');
    for (const decision of ['allow', 'deny', 'always']) {
      const button = el('button', '', decision[0].toUpperCase() + decision.slice(1));
      button.type = 'button';
      button.dataset.decision = decision;
      button.addEventListener('click', () => respond(ask, decision));
      buttons.append(button);
    }
    box.append(buttons);
    return box;
  }));
}

async function respond(ask, decision) {
  try {
    await api('POST', `/v1/runs/${encodeURIComponent(ask.runId)}/permissions/${encodeURIComponent(ask.requestId)}`, { decision });
  } catch (error) {
    alertLine(error.message);
  }
}

function runTree(run) {
  const nodes = [];
  for (const note of run.notes) nodes.push(el('div', 'note', note));
  for (const turn of run.turns) {
    const usage = turn.usage ? `${turn.usage.inputTokens ?? 0} in / ${turn.usage.outputTokens ?? 0} out tokens` : '';
    const meta = [`turn ${turn.iteration + 1}`, turn.llmMs != null ? `model ${seconds(turn.llmMs)}` : 'model …',
      usage, turn.cost != null ? `$${turn.cost.toFixed(5)}` : '', turn.finish ? `finish: ${turn.finish}` : '']
      .filter(Boolean).join(' · ');
    const box = el('div', 'turn', undefined, el('div', 'meta', meta));
    for (const note of turn.notes) box.append(el('div', 'note', note));
    if (turn.text) box.append(el('div', 'text', turn.text));
    for (const call of turn.calls) box.append(callBox(call));
    if (turn.snapshot) box.append(stepFiles(run, turn.snapshot));
    nodes.push(box);
  }
  return nodes;
}

function callBox(call) {
  const stages = call.stages ? Object.entries(call.stages).map(([k, v]) => `${k.replace(/Us$/, '')} ${v} µs`).join(', ') : '';
  const decided = call.decidedBy ? ` · decided by ${call.decidedBy}` : '';
  const meta = el('div', 'meta', undefined, el('span', 'st', call.status), el('span', '',
    ` · ${call.durationMs != null ? seconds(call.durationMs) : '…'}${decided}${stages ? ' · ' + stages : ''}`));
  const box = el('div', `call ${call.status}`, undefined, el('strong', '', call.name), meta,
    el('pre', 'args', JSON.stringify(call.args, null, 2)));
  for (const hook of call.hooks) box.append(el('div', 'note hook', hook));
  if (call.output) box.append(el('pre', 'output', call.output));
  if (call.content) box.append(el('pre', 'result', call.content));
  for (const childId of call.children) {
    const child = model.runs.get(childId);
    if (!child) continue;
    box.append(el('div', 'child', undefined,
      el('div', 'meta', `sub-agent ${child.runId} · ${child.status}`), ...runTree(child)));
  }
  return box;
}

/** Where the run came from, and the rewinds and forks made from it: links both ways. */
function renderLinks(run) {
  const lines = [];
  const link = (runId) => {
    const button = el('button', 'run-link', runId);
    button.type = 'button';
    button.addEventListener('click', () => openRun(runId));
    return button;
  };
  if (run.forkedFrom) {
    lines.push(el('div', 'links', `forked from step ${run.forkedFrom.step} of run `, link(run.forkedFrom.runId)));
  }
  for (const item of run.links) lines.push(el('div', 'links', `${item.text} `, item.runId ? link(item.runId) : null));
  $('run-links').replaceChildren(...lines);
}

/** The steps a run that is not executing can be rewound to or forked from. */
function renderRewind(run, live) {
  const steps = [...run.snapshots.keys()].sort((a, b) => a - b);
  $('rewind-form').hidden = live || !run.started || steps.length === 0;
  const select = $('rewind-step');
  const wanted = steps.map(String).join(',');
  if (select.dataset.steps !== wanted) {
    select.dataset.steps = wanted;
    select.replaceChildren(...steps.map((step) => {
      const option = el('option', '', step === 0 ? '0 (before any tool)' : String(step));
      option.value = String(step);
      return option;
    }));
    if (steps.length) select.value = String(steps[steps.length - 1]);
  }
}

/** A step's changed files; a click shows the file's diff from the step before. */
function stepFiles(run, snapshot) {
  const box = el('div', 'files', `step ${snapshot.step} changed: `);
  const diff = el('div', 'diff-box');
  const files = [...snapshot.changed.map((path) => [path, '']), ...snapshot.removed.map((path) => [path, ' (removed)'])];
  if (!files.length) box.append(el('span', 'muted', 'no file'));
  for (const [path, suffix] of files) {
    const button = el('button', 'file', path + suffix);
    button.type = 'button';
    button.dataset.path = path;
    button.addEventListener('click', () => showDiff(run.runId, snapshot.step, path, diff));
    box.append(button);
  }
  box.append(diff);
  return box;
}

async function fileAt(runId, step, path) {
  const query = `step=${step}&path=${encodeURIComponent(path)}`;
  return api('GET', `/v1/runs/${encodeURIComponent(runId)}/files?${query}`);
}

async function showDiff(runId, step, path, into) {
  try {
    const [before, after] = await Promise.all([fileAt(runId, step - 1, path), fileAt(runId, step, path)]);
    const lines = diffLines(before.exists ? before.content ?? '(not text)' : '', after.exists ? after.content ?? '(not text)' : '');
    const pre = el('pre', 'diff');
    pre.setAttribute('aria-label', `diff of ${path} at step ${step}`);
    for (const [mark, line] of lines) pre.append(el('span', mark === '+' ? 'add' : mark === '-' ? 'del' : '', `${mark} ${line}\n`));
    into.replaceChildren(el('div', 'meta', `${path}: step ${step - 1} → ${step}`), pre);
  } catch (error) {
    into.replaceChildren(el('div', 'error', error.message));
  }
}

/** A line diff (longest common subsequence; whole texts past 2000 lines each). */
function diffLines(before, after) {
  const a = before === '' ? [] : before.replace(/\n$/, '').split('\n');
  const b = after === '' ? [] : after.replace(/\n$/, '').split('\n');
  if (a.length > 2000 || b.length > 2000) return [...a.map((l) => ['-', l]), ...b.map((l) => ['+', l])];
  const common = Array.from({ length: a.length + 1 }, () => new Array(b.length + 1).fill(0));
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      common[i][j] = a[i] === b[j] ? common[i + 1][j + 1] + 1 : Math.max(common[i + 1][j], common[i][j + 1]);
    }
  }
  const out = [];
  let i = 0, j = 0;
  while (i < a.length || j < b.length) {
    if (i < a.length && j < b.length && a[i] === b[j]) { out.push([' ', a[i]]); i++; j++; }
    else if (j < b.length && (i === a.length || common[i][j + 1] >= common[i + 1][j])) { out.push(['+', b[j]]); j++; }
    else { out.push(['-', a[i]]); i++; }
  }
  return out;
}

async function rewindTo(force) {
  const runId = openRunId;
  const step = Number($('rewind-step').value);
  try {
    const done = await api('POST', `/v1/runs/${encodeURIComponent(runId)}/rewind`, { step, force });
    const files = [...done.write, ...done.remove.map((path) => `${path} (removed)`)];
    openRun(runId);
    $('rewind-result').replaceChildren(el('div', 'note',
      `rewound to step ${done.toStep}: ${files.length ? files.join(', ') : 'no file changed'}`));
  } catch (error) {
    const again = el('button', '', 'Rewind anyway');
    again.type = 'button';
    again.addEventListener('click', () => rewindTo(true));
    $('rewind-result').replaceChildren(el('div', 'error', error.message), error.status === 409 && !force ? again : null);
  }
}

$('rewind').addEventListener('click', () => rewindTo(false));

$('fork').addEventListener('click', async () => {
  const step = Number($('rewind-step').value);
  const prompt = $('fork-prompt').value.trim();
  try {
    const forked = await api('POST', `/v1/runs/${encodeURIComponent(openRunId)}/fork`,
      prompt ? { step, prompt } : { step });
    $('fork-prompt').value = '';
    openRun(forked.started ? forked.started.runId : forked.forkRunId);
    refreshRuns();
  } catch (error) {
    $('rewind-result').replaceChildren(el('div', 'error', error.message));
  }
});

function renderTimeline(run) {
  const rows = [el('div', 'legend', undefined,
    el('span', '', undefined, el('i', 'seg-llm'), 'model'), el('span', '', undefined, el('i', 'seg-tools'), 'tools'),
    el('span', '', undefined, el('i', 'seg-wait'), 'waiting for a person'))];
  const total = Math.max(1, run.turns.reduce((sum, t) => sum + (t.llmMs || 0) + (t.toolsMs || 0) + (t.waitMs || 0), 0));
  for (const turn of run.turns) {
    const bar = el('div', 'bar');
    bar.title = `turn ${turn.iteration + 1}`;
    for (const [cls, ms] of [['seg-llm', turn.llmMs], ['seg-tools', turn.toolsMs], ['seg-wait', turn.waitMs]]) {
      if (!ms) continue;
      const seg = el('span', cls);
      seg.style.width = `${(100 * ms) / total}%`;
      seg.title = `${cls.slice(4)} ${seconds(ms)}`;
      bar.append(seg);
    }
    rows.push(bar);
  }
  $('timeline').replaceChildren(...rows);
}

$('cancel').addEventListener('click', async () => {
  try { await api('POST', `/v1/runs/${encodeURIComponent(openRunId)}/cancel`, {}); } catch (error) { alertLine(error.message); }
});

$('steer-form').addEventListener('submit', async (event) => {
  event.preventDefault();
  const message = $('steer').value.trim();
  if (!message) return;
  try {
    await api('POST', `/v1/runs/${encodeURIComponent(openRunId)}/steer`, { message });
    $('steer').value = '';
  } catch (error) { alertLine(error.message); }
});

function alertLine(message) {
  model && model.root.notes.push(`error: ${message}`);
  queueRender();
}

function seconds(ms) { return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(1)} s`; }

checkSession();
