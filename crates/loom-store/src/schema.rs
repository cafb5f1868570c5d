//! The schema, as a list of migrations. `PRAGMA user_version` records how
//! many have been applied.

/// The newest schema this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Each entry moves the schema one version forward. Never edit a shipped
/// migration: add a new one.
pub const MIGRATIONS: &[&str] = &[
    // 1: sessions, runs, messages, checkpoints, events, tool journal.
    "CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        created_ms INTEGER NOT NULL
    );
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions(id),
        prompt TEXT NOT NULL,
        model TEXT NOT NULL,
        status TEXT NOT NULL,
        owner TEXT NOT NULL,
        started_ms INTEGER NOT NULL,
        ended_ms INTEGER,
        content TEXT,
        metrics TEXT NOT NULL,
        next_turn TEXT
    );
    CREATE INDEX runs_by_start ON runs(started_ms DESC);
    CREATE INDEX runs_by_session ON runs(session_id, started_ms);
    CREATE TABLE messages (
        run_id TEXT NOT NULL REFERENCES runs(id),
        position INTEGER NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (run_id, position)
    ) WITHOUT ROWID;
    CREATE TABLE events (
        run_id TEXT NOT NULL REFERENCES runs(id),
        seq INTEGER NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE journal (
        run_id TEXT NOT NULL REFERENCES runs(id),
        call_id TEXT NOT NULL,
        call TEXT NOT NULL,
        result TEXT,
        started_ms INTEGER NOT NULL,
        ended_ms INTEGER,
        PRIMARY KEY (run_id, call_id)
    ) WITHOUT ROWID;",
    // 2: the workspace a run's tools were confined to, so a run can be
    // resumed from anywhere. NULL for runs recorded before.
    "ALTER TABLE runs ADD COLUMN workspace TEXT;",
    // 3: who a run belongs to (a server token's name), for listing a
    // token's runs. NULL for runs of the command line and the library.
    "ALTER TABLE runs ADD COLUMN principal TEXT;
     CREATE INDEX runs_by_principal ON runs(principal, started_ms DESC);",
    // 4: what requests with an idempotency key led to, per owner (a server
    // token's name), so a retry after a restart gets the same run.
    "CREATE TABLE request_keys (
        owner TEXT NOT NULL,
        key TEXT NOT NULL,
        digest INTEGER NOT NULL,
        run_id TEXT NOT NULL,
        created_ms INTEGER NOT NULL,
        PRIMARY KEY (owner, key)
    ) WITHOUT ROWID;
    CREATE INDEX request_keys_by_age ON request_keys(created_ms);",
    // 5: sub-agents: the run that started a run, and the calling turn.
    "ALTER TABLE runs ADD COLUMN parent_run_id TEXT;
     ALTER TABLE runs ADD COLUMN parent_turn_id TEXT;
     CREATE INDEX runs_by_parent ON runs(parent_run_id);",
    // 6: what starts a run a gateway accepted and has not started (the
    // client's request, JSON), so a restart starts it. NULL otherwise.
    "ALTER TABLE runs ADD COLUMN request TEXT;
     CREATE INDEX runs_by_status ON runs(status, started_ms);",
    // 7: events and messages stored in the order they are written, found
    // by an index on (run, position). Ordered by run, as before, every
    // write of a thousand live runs dirtied a page of its own (and the
    // log copied each); in written order one group's rows share pages and
    // only the small index entries land apart. Reading a run back touches
    // more pages, and reads are rare. The rows keep their columns, so
    // every query stays as it was.
    "CREATE TABLE events_written (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs(id),
        seq INTEGER NOT NULL,
        body TEXT NOT NULL
    );
    INSERT INTO events_written (run_id, seq, body) SELECT run_id, seq, body FROM events ORDER BY run_id, seq;
    DROP TABLE events;
    ALTER TABLE events_written RENAME TO events;
    CREATE UNIQUE INDEX events_by_run ON events(run_id, seq);
    CREATE TABLE messages_written (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs(id),
        position INTEGER NOT NULL,
        body TEXT NOT NULL
    );
    INSERT INTO messages_written (run_id, position, body)
        SELECT run_id, position, body FROM messages ORDER BY run_id, position;
    DROP TABLE messages;
    ALTER TABLE messages_written RENAME TO messages;
    CREATE UNIQUE INDEX messages_by_run ON messages(run_id, position);",
    // 8: the audit trail (docs/server.md): one row per action, in the
    // order appended; the record as JSON, its time and token name beside
    // it for the filters of `loom audit`.
    "CREATE TABLE audit (
        id INTEGER PRIMARY KEY,
        time_ms INTEGER NOT NULL,
        token TEXT,
        body TEXT NOT NULL
    );
    CREATE INDEX audit_by_time ON audit(time_ms);
    CREATE INDEX audit_by_token ON audit(token, id);",
    // 9: when a gateway accepted a run into its line; `started_ms` is
    // when it began executing (until then, its acceptance time).
    "ALTER TABLE runs ADD COLUMN accepted_ms INTEGER;
     UPDATE runs SET accepted_ms = started_ms WHERE request IS NOT NULL;",
];
