//! The store as the gateway hands it to its agents: the same store, with
//! every write timed for `/metrics` and every append of events told to the
//! feed (the events it holds may leave memory).

use std::sync::Arc;
use std::time::Instant;

use loom_core::async_trait;
use loom_core::{
    Admissions, AuditLog, Checkpoint, Event, EventsStored, KeyedRequest, QueuedRun, RunIndex, RunLog, RunMetrics,
    RunQuery, RunRecord, RunSnapshot, RunStatus, Store, StoreError, ToolCall, ToolResult,
};

use crate::feed::EventFeed;

/// A store that reports its writes.
pub(crate) struct ObservedStore {
    inner: Arc<dyn Store>,
    feed: Arc<dyn EventFeed>,
}

impl ObservedStore {
    pub(crate) fn new(inner: Arc<dyn Store>, feed: Arc<dyn EventFeed>) -> Self {
        Self { inner, feed }
    }
}

async fn timed<T>(operation: &'static str, write: impl std::future::Future<Output = T>) -> T {
    let started = Instant::now();
    let result = write.await;
    metrics::histogram!("loom_store_write_seconds", "op" => operation).record(started.elapsed().as_secs_f64());
    result
}

#[async_trait]
impl RunLog for ObservedStore {
    async fn create_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        timed("create_run", self.inner.create_run(run)).await
    }

    async fn append_events(&self, run_id: &str, events: &[Event]) -> Result<(), StoreError> {
        timed("append_events", self.inner.append_events(run_id, events)).await?;
        if let Some(last) = events.last() {
            self.feed.persisted(run_id, last.seq);
        }
        Ok(())
    }

    fn append_events_then(self: Arc<Self>, run_id: Arc<str>, events: Vec<Event>, then: EventsStored) {
        let started = Instant::now();
        let feed = self.feed.clone();
        let id = run_id.clone();
        self.inner.clone().append_events_then(
            run_id,
            events,
            Box::new(move |events, result| {
                metrics::histogram!("loom_store_write_seconds", "op" => "append_events")
                    .record(started.elapsed().as_secs_f64());
                if let (Ok(()), Some(last)) = (&result, events.last()) {
                    feed.persisted(&id, last.seq);
                }
                then(events, result);
            }),
        );
    }

    async fn set_status(&self, run_id: &str, to: RunStatus) -> Result<(), StoreError> {
        timed("set_status", self.inner.set_status(run_id, to)).await
    }

    async fn checkpoint(&self, checkpoint: &Checkpoint<'_>) -> Result<(), StoreError> {
        timed("checkpoint", self.inner.checkpoint(checkpoint)).await?;
        if let Some(last) = checkpoint.events.last() {
            self.feed.persisted(checkpoint.run_id, last.seq);
        }
        Ok(())
    }

    async fn journal_intent(&self, run_id: &str, call: &ToolCall) -> Result<(), StoreError> {
        timed("journal", self.inner.journal_intent(run_id, call)).await
    }

    async fn journal_result(&self, run_id: &str, result: &ToolResult) -> Result<(), StoreError> {
        timed("journal", self.inner.journal_result(run_id, result)).await
    }

    async fn finish_run(
        &self,
        run_id: &str,
        status: RunStatus,
        content: Option<&str>,
        metrics: &RunMetrics,
        events: &[Event],
    ) -> Result<(), StoreError> {
        timed(
            "finish_run",
            self.inner.finish_run(run_id, status, content, metrics, events),
        )
        .await?;
        if let Some(last) = events.last() {
            self.feed.persisted(run_id, last.seq);
        }
        Ok(())
    }

    async fn load_run(&self, run_id: &str) -> Result<RunSnapshot, StoreError> {
        self.inner.load_run(run_id).await
    }

    async fn events(&self, run_id: &str, after_seq: u64) -> Result<Vec<Event>, StoreError> {
        self.inner.events(run_id, after_seq).await
    }

    async fn last_seqs(&self, run_ids: &[String]) -> Result<Vec<u64>, StoreError> {
        self.inner.last_seqs(run_ids).await
    }

    async fn events_page(&self, run_id: &str, after_seq: u64, limit: usize) -> Result<Vec<Event>, StoreError> {
        self.inner.events_page(run_id, after_seq, limit).await
    }

    async fn mark_interrupted(&self, run_id: &str, owner: &str) -> Result<bool, StoreError> {
        timed("set_status", self.inner.mark_interrupted(run_id, owner)).await
    }

    async fn reclaim_run(&self, run_id: &str, owner: &str) -> Result<(), StoreError> {
        timed("set_status", self.inner.reclaim_run(run_id, owner)).await
    }

    fn write_fence(&self) -> Option<loom_core::WriteFence> {
        self.inner.write_fence()
    }
}

#[async_trait]
impl RunIndex for ObservedStore {
    async fn list_runs(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.list_runs(limit).await
    }

    async fn query_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.query_runs(query).await
    }

    async fn active_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.active_runs().await
    }

    async fn session_runs(&self, session_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.session_runs(session_id).await
    }

    async fn child_runs(&self, parent_run_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.child_runs(parent_run_id).await
    }
}

#[async_trait]
impl Admissions for ObservedStore {
    async fn queue_run(&self, run: &QueuedRun, key: Option<(&str, &KeyedRequest)>) -> Result<(), StoreError> {
        timed("queue_run", self.inner.queue_run(run, key)).await
    }

    async fn queued_runs(&self) -> Result<Vec<QueuedRun>, StoreError> {
        self.inner.queued_runs().await
    }

    async fn run_request(&self, run_id: &str) -> Result<Option<String>, StoreError> {
        self.inner.run_request(run_id).await
    }

    async fn remember_request(&self, owner: &str, key: &str, request: &KeyedRequest) -> Result<(), StoreError> {
        timed("remember_request", self.inner.remember_request(owner, key, request)).await
    }

    async fn remembered_request(&self, owner: &str, key: &str) -> Result<Option<KeyedRequest>, StoreError> {
        self.inner.remembered_request(owner, key).await
    }
}

#[async_trait]
impl AuditLog for ObservedStore {
    async fn append_audit(&self, entry: &loom_core::AuditEntry) -> Result<(), StoreError> {
        timed("append_audit", self.inner.append_audit(entry)).await
    }

    async fn audit_entries(&self, query: &loom_core::AuditQuery) -> Result<Vec<loom_core::AuditEntry>, StoreError> {
        self.inner.audit_entries(query).await
    }
}

impl Store for ObservedStore {
    fn files(&self) -> Vec<std::path::PathBuf> {
        self.inner.files()
    }

    fn address(&self) -> Option<loom_core::StoreAddress> {
        self.inner.address()
    }
}
