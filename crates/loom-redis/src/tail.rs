//! [`EventTail`] on Redis: one `XREAD BLOCK` over the streams of every run
//! a gateway follows, on a connection of its own (a blocking read would
//! hold up every other command on a shared one); past 512 runs, groups
//! read without blocking in one round trip, then a wait. The entry ids are `0-SEQ`, so
//! each run's cursor is its last `seq`.

use std::time::Duration;

use async_trait::async_trait;
use loom_core::{EventTail, StoreError, Tailed};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::errors::backend;
use crate::store::{events_of, seq_of, RedisStore};

/// Events read per run at most in one read.
const PER_RUN: usize = 256;

/// Streams named in one read at most; more are read in groups of this many.
const PER_READ: usize = 512;

/// The reader of a gateway's followed runs.
pub struct RedisTail {
    conn: tokio::sync::Mutex<ConnectionManager>,
    store: RedisStore,
    /// When the last round over every group began, when the followed runs
    /// are more than one read names.
    last_round: std::sync::Mutex<Option<tokio::time::Instant>>,
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
            last_round: std::sync::Mutex::new(None),
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
            let read = self.xread(&runs.iter().collect::<Vec<_>>(), Some(wait));
            let reply: Option<Vec<(String, Entries)>> =
                read.query_async(&mut *self.conn.lock().await).await.map_err(backend)?;
            return Ok(tailed(&self.store.events_key(""), reply.unwrap_or_default()));
        }
        // More runs than one read names: a blocking read of one group
        // would keep every other group waiting for it (with 10 000 runs,
        // 20 groups × the wait). Every group is read at once, without
        // blocking, in one round trip; with no news anywhere the wait is
        // slept. Rounds are at least a quarter of the wait apart, so a
        // gateway busy with a few runs does not spin over the quiet rest.
        let pace = wait / 4;
        let last_round = *self.last_round.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(last_round) = last_round {
            tokio::time::sleep_until(last_round + pace).await;
        }
        *self.last_round.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(tokio::time::Instant::now());
        let mut round = redis::pipe();
        for group in runs.chunks(PER_READ) {
            round.add_command(self.xread(&group.iter().collect::<Vec<_>>(), None));
        }
        let replies: Vec<Option<Vec<(String, Entries)>>> =
            round.query_async(&mut *self.conn.lock().await).await.map_err(backend)?;
        let news = tailed(
            &self.store.events_key(""),
            replies.into_iter().flatten().flatten().collect(),
        );
        if news.is_empty() {
            tokio::time::sleep(wait).await;
        }
        Ok(news)
    }
}

impl RedisTail {
    /// `XREAD` of `named` (each after its `seq`), blocking up to `block`
    /// for the first entry when given.
    fn xread(&self, named: &[&(String, u64)], block: Option<Duration>) -> redis::Cmd {
        let mut read = redis::cmd("XREAD");
        read.arg("COUNT").arg(PER_RUN);
        if let Some(block) = block {
            read.arg("BLOCK")
                .arg(u64::try_from(block.as_millis()).unwrap_or(u64::MAX).max(1));
        }
        read.arg("STREAMS");
        for (run_id, _) in named {
            read.arg(self.store.events_key(run_id));
        }
        for (_, after) in named {
            read.arg(format!("0-{after}"));
        }
        read
    }
}

/// The entries of an `XREAD`'s reply, each on its own: one that cannot be
/// read is passed over.
fn tailed(events_prefix: &str, reply: Vec<(String, Entries)>) -> Vec<Tailed> {
    let mut tailed = Vec::new();
    for (key, entries) in reply {
        let run_id = key.strip_prefix(events_prefix).unwrap_or(&key);
        for (id, fields) in entries {
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
    tailed
}
