//! Workspace jobs on Redis ([`loom_core::WorkspaceJobs`]): a gateway's
//! rewind of a run a worker executed, done by a worker of the machine that
//! holds its workspace (docs/rewind.md).
//!
//! Keys: `{p}jobs:{line}` a list of jobs waiting (`ID\nDEADLINE\nBODY`,
//! the deadline in ms by Redis's clock), taken from its head;
//! `{p}job-answer:{id}` a list holding the answer, kept five minutes;
//! `{p}job-seq` the last job id. A job not taken within the asker's
//! patience is removed from its line (`LREM`) — one a worker took
//! meanwhile is not there any more, and its answer is awaited instead —
//! and one still there past its deadline (its asker failed or went away
//! before it could remove it) is dropped by the worker that pops it: a job
//! the asker gave up on is never done later.

use std::time::{Duration, Instant};

use loom_core::{JobOutcome, StoreError, WorkspaceJob, WorkspaceJobs};

use crate::errors::backend;
use crate::store::RedisStore;

/// How often the asker looks for the answer.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// How long an answer nobody read is kept.
const ANSWER_KEPT_SECS: u64 = 300;

impl RedisStore {
    fn line_key(&self, line: &str) -> String {
        format!("{}jobs:{line}", self.prefix())
    }

    fn answer_key(&self, id: &str) -> String {
        format!("{}job-answer:{id}", self.prefix())
    }
}

/// `next_job`: ARGV the line. Pops jobs until one whose deadline has not
/// passed (by Redis's clock); `false` when none waits.
const NEXT_JOB: &str = r#"
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
while true do
  local entry = redis.call('LPOP', ARGV[1])
  if not entry then return false end
  local deadline = string.match(entry, '^[^\n]*\n(%d+)\n')
  if deadline and tonumber(deadline) >= now then return entry end
end
"#;

impl RedisStore {
    /// Waits for job `id`'s answer: at most `patience` for a worker to
    /// take it (then it is withdrawn), at most `patience` more for the answer.
    async fn await_answer(
        &self,
        line: &str,
        entry: &str,
        id: &str,
        patience: Duration,
    ) -> Result<JobOutcome, StoreError> {
        let mut conn = self.conn();
        let answer_key = self.answer_key(id);
        let asked = Instant::now();
        let mut taken = false;
        loop {
            let answer: Option<String> = redis::cmd("LPOP")
                .arg(&answer_key)
                .query_async(&mut conn)
                .await
                .map_err(backend)?;
            if let Some(answer) = answer {
                return Ok(JobOutcome::Answered(answer));
            }
            let waited = asked.elapsed();
            if !taken && waited >= patience {
                if self.withdraw_job(line, entry).await? {
                    return Ok(JobOutcome::NotTaken);
                }
                taken = true;
            }
            if waited >= patience * 2 {
                return Ok(JobOutcome::Unanswered);
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    /// Removes a job from its line; whether it was still there.
    async fn withdraw_job(&self, line: &str, entry: &str) -> Result<bool, StoreError> {
        let withdrawn: u64 = redis::cmd("LREM")
            .arg(line)
            .arg(1)
            .arg(entry)
            .query_async(&mut self.conn())
            .await
            .map_err(backend)?;
        Ok(withdrawn > 0)
    }
}

#[loom_core::async_trait]
impl WorkspaceJobs for RedisStore {
    async fn ask(&self, workspace: &str, body: &str, patience: Duration) -> Result<JobOutcome, StoreError> {
        let mut conn = self.conn();
        let (id, (seconds, micros)): (u64, (u64, u64)) = redis::pipe()
            .cmd("INCR")
            .arg(format!("{}job-seq", self.prefix()))
            .cmd("TIME")
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        let deadline = seconds * 1000 + micros / 1000 + u64::try_from(patience.as_millis()).unwrap_or(u64::MAX / 2);
        let id = id.to_string();
        let entry = format!("{id}\n{deadline}\n{body}");
        let line = self.line_key(workspace);
        redis::cmd("RPUSH")
            .arg(&line)
            .arg(&entry)
            .query_async::<()>(&mut conn)
            .await
            .map_err(backend)?;
        let outcome = self.await_answer(&line, &entry, &id, patience).await;
        if outcome.is_err() {
            // Best effort: its deadline keeps it from being done later anyway.
            let _ = self.withdraw_job(&line, &entry).await;
        }
        outcome
    }

    async fn next_job(&self, workspace: &str) -> Result<Option<WorkspaceJob>, StoreError> {
        let entry: Option<String> = redis::Script::new(NEXT_JOB)
            .arg(self.line_key(workspace))
            .invoke_async(&mut self.conn())
            .await
            .map_err(backend)?;
        Ok(entry.and_then(|entry| {
            let mut parts = entry.splitn(3, '\n');
            let (id, _deadline, body) = (parts.next()?, parts.next()?, parts.next()?);
            Some(WorkspaceJob {
                id: id.to_string(),
                body: body.to_string(),
            })
        }))
    }

    async fn answer(&self, id: &str, answer: &str) -> Result<(), StoreError> {
        let key = self.answer_key(id);
        redis::pipe()
            .atomic()
            .cmd("RPUSH")
            .arg(&key)
            .arg(answer)
            .ignore()
            .cmd("EXPIRE")
            .arg(&key)
            .arg(ANSWER_KEPT_SECS)
            .ignore()
            .query_async::<()>(&mut self.conn())
            .await
            .map_err(backend)
    }
}
