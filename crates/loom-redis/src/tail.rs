//! [`EventTail`] on Redis: one `XREAD BLOCK` over the streams of every run
//! a gateway follows, on a connection of its own (a blocking read would
//! hold up every other command on a shared one); past 512 runs, reads
//! without blocking, in turns, then a wait. The entry ids are `0-SEQ`, so
//! each run's cursor is its last `seq`.

use std::time::Duration;

use async_trait::async_trait;
use loom_core::{EventTail, StoreError, Tailed};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::store::{backend, events_of, seq_of, RedisStore};

/// Events read per run at most in one read.
const PER_RUN: usize = 256;

/// Streams named in one read at most; more are read in turns.
const PER_READ: usize = 512;

/// The reader of a gateway's followed runs.
pub struct RedisTail {
    conn: tokio::sync::Mutex<ConnectionManager>,
    store: RedisStore,
    /// Where the next read starts among the followed runs, when they are
    /// more than one read names.
    turn: std::sync::atomic::AtomicUsize,
}

impl RedisStore {
    /// A reader of run streams with a connection of its own.
    pub async fn tail(&self) -> Result<RedisTail, StoreError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(1));
        let conn = ConnectionManager::new_with_config(self.client().clone(), config)
            .await
            .map_err(backend)?;
        Ok(RedisTail {
            conn: tokio::sync::Mutex::new(conn),
            store: self.clone(),
            turn: std::sync::atomic::AtomicUsize::new(0),
        })
    }
}

type Entries = Vec<(String, Vec<(String, String)>)>;

#[async_trait]
impl EventTail for RedisTail {
    async fn read(&self, runs: &[(String, u64)], wait: Duration) -> Result<Vec<Tailed>, StoreError> {
        if runs.is_empty() {
            tokio::time::sleep(wait).await;
            return Ok(Vec::new());
        }
        if runs.len() <= PER_READ {
            return self.read_group(runs.iter().collect(), Some(wait)).await;
        }
        // More runs than one read names: a blocking read of one group
        // would keep every other group waiting for it (with 10 000 runs,
        // 20 groups × the wait). Each group is read without blocking, in
        // turn, until one has news; when none has, the wait is slept.
        for _ in 0..runs.len().div_ceil(PER_READ) {
            let start = self.turn.fetch_add(PER_READ, std::sync::atomic::Ordering::Relaxed) % runs.len();
            let named = runs.iter().cycle().skip(start).take(PER_READ).collect();
            let tailed = self.read_group(named, None).await?;
            if !tailed.is_empty() {
                return Ok(tailed);
            }
        }
        tokio::time::sleep(wait).await;
        Ok(Vec::new())
    }
}

impl RedisTail {
    /// One `XREAD` of `named` (each after its `seq`), blocking up to
    /// `block` for the first entry when given.
    async fn read_group(&self, named: Vec<&(String, u64)>, block: Option<Duration>) -> Result<Vec<Tailed>, StoreError> {
        let mut read = redis::cmd("XREAD");
        read.arg("COUNT").arg(PER_RUN);
        if let Some(block) = block {
            read.arg("BLOCK")
                .arg(u64::try_from(block.as_millis()).unwrap_or(u64::MAX).max(1));
        }
        read.arg("STREAMS");
        for (run_id, _) in &named {
            read.arg(self.store.events_key(run_id));
        }
        let run_of: std::collections::HashMap<String, &str> = named
            .iter()
            .map(|(run_id, _)| (self.store.events_key(run_id), run_id.as_str()))
            .collect();
        for (_, after) in &named {
            read.arg(format!("0-{after}"));
        }
        let reply: Option<Vec<(String, Entries)>> =
            read.query_async(&mut *self.conn.lock().await).await.map_err(backend)?;
        let mut tailed = Vec::new();
        for (key, entries) in reply.unwrap_or_default() {
            let run_id = run_of.get(&key).copied().unwrap_or_default();
            for (id, fields) in entries {
                // Each entry on its own: one that cannot be read is passed over.
                tailed.push(match events_of(vec![(id.clone(), fields)]) {
                    Ok(mut events) if events.len() == 1 => Tailed::Event(Box::new(events.remove(0))),
                    Ok(_) => Tailed::Unreadable {
                        run_id: run_id.to_string(),
                        seq: seq_of(&id),
                        error: "an entry without an event".into(),
                    },
                    Err(err) => Tailed::Unreadable {
                        run_id: run_id.to_string(),
                        seq: seq_of(&id),
                        error: err.to_string(),
                    },
                });
            }
        }
        Ok(tailed)
    }
}
