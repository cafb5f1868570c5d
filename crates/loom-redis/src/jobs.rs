//! Workspace jobs on Redis ([`loom_core::WorkspaceJobs`]): a gateway's
//! rewind of a run a worker executed, done by a worker of the machine that
//! holds its workspace (docs/rewind.md).
//!
//! Keys: `{p}jobs:{line}` a list of jobs waiting (`ID\nBODY`), taken
//! from its head; `{p}job-answer:{id}` a list holding the answer, kept
//! five minutes; `{p}job-seq` the last job id. A job not taken within the
//! asker's patience is removed from its line (`LREM`) — one a worker took
//! meanwhile is not there any more, and its answer is awaited instead — so
//! a job the asker gave up on is never done later.

use std::time::{Duration, Instant};

use loom_core::{JobOutcome, StoreError, WorkspaceJob, WorkspaceJobs};

use crate::store::{backend, RedisStore};

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

#[loom_core::async_trait]
impl WorkspaceJobs for RedisStore {
    async fn ask(&self, workspace: &str, body: &str, patience: Duration) -> Result<JobOutcome, StoreError> {
        let mut conn = self.conn();
        let id: u64 = redis::cmd("INCR")
            .arg(format!("{}job-seq", self.prefix()))
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        let id = id.to_string();
        let entry = format!("{id}\n{body}");
        let line = self.line_key(workspace);
        redis::cmd("RPUSH")
            .arg(&line)
            .arg(&entry)
            .query_async::<()>(&mut conn)
            .await
            .map_err(backend)?;
        let answer_key = self.answer_key(&id);
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
                let withdrawn: u64 = redis::cmd("LREM")
                    .arg(&line)
                    .arg(1)
                    .arg(&entry)
                    .query_async(&mut conn)
                    .await
                    .map_err(backend)?;
                if withdrawn > 0 {
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

    async fn next_job(&self, workspace: &str) -> Result<Option<WorkspaceJob>, StoreError> {
        let entry: Option<String> = redis::cmd("LPOP")
            .arg(self.line_key(workspace))
            .query_async(&mut self.conn())
            .await
            .map_err(backend)?;
        Ok(entry.and_then(|entry| {
            let (id, body) = entry.split_once('\n')?;
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
