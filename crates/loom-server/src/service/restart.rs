//! Starting again and stopping: runs taken back after a restart (the
//! interrupted resumed, the queued started), and the shutdown.

use super::*;

/// Why a run left by a previous server was not taken back at start-up.
enum NotTaken {
    /// It can never start here: it is cancelled, with the reason.
    Never(String),
    /// Not now (its model cannot be set up): it stays queued.
    NotNow(String),
}

impl Service {
    /// Takes back what a previous server left: the runs it left
    /// `INTERRUPTED` (or whose process died), asks pending at the time
    /// included, and the runs it had accepted and not started. Both wait in
    /// the queue under its caps like any run. Returns how many.
    pub async fn resume_interrupted(&self) -> Result<usize, ApiError> {
        let Some(store) = self.inner.store.clone() else {
            return Ok(0);
        };
        loom_core::recovery::recover_interrupted_runs(store.as_ref())
            .await
            .map_err(store_error)?;
        let interrupted = store
            .query_runs(&RunQuery {
                status: Some(RunStatus::Interrupted),
                limit: usize::MAX,
                ..RunQuery::default()
            })
            .await
            .map_err(store_error)?;
        let mut taken = 0;
        for record in interrupted.into_iter().rev() {
            let Some(principal) = record.principal.clone() else {
                continue;
            };
            // A sub-agent resumes with its parent (its `task` call is made
            // again and finds it).
            if record.parent.is_some() {
                continue;
            }
            let run_id = record.run_id.clone();
            match self
                .take_back_interrupted(&record, Principal(principal.into()), store.as_ref())
                .await
            {
                Ok(()) => taken += 1,
                Err(NotTaken::Never(reason)) => self.never_taken(store.as_ref(), &run_id, &reason).await,
                Err(NotTaken::NotNow(reason)) => {
                    tracing::error!(run_id, error = %reason, "an interrupted run cannot resume now; it stays interrupted for the next start");
                }
            }
        }
        for queued in store.queued_runs().await.map_err(store_error)? {
            let run_id = queued.record.run_id.clone();
            match self.take_back_queued(queued).await {
                Ok(()) => taken += 1,
                Err(NotTaken::Never(reason)) => self.never_taken(store.as_ref(), &run_id, &reason).await,
                Err(NotTaken::NotNow(reason)) => {
                    tracing::error!(run_id, error = %reason, "a queued run cannot start now; it stays queued for the next start");
                }
            }
        }
        Ok(taken)
    }

    /// A run left by a previous server that can never run here: cancelled,
    /// with the reason in its log.
    async fn never_taken(&self, store: &dyn Store, run_id: &str, reason: &str) {
        tracing::error!(run_id, error = %reason, "a run left by the previous server can never run here; it is cancelled");
        let why = format!("the run cannot go on: {reason}");
        if let Err(err) = loom_core::recovery::close_cancelled(store, run_id, &why).await {
            tracing::error!(run_id, error = %err, "could not record the cancelled run");
        }
    }

    async fn take_back_interrupted(
        &self,
        record: &RunRecord,
        principal: Principal,
        store: &dyn Store,
    ) -> Result<(), NotTaken> {
        let events = store
            .events(&record.run_id, 0)
            .await
            .map_err(|err| NotTaken::NotNow(err.to_string()))?;
        let last_seq = events.last().map_or(0, |event| event.seq);
        let mut pending: Vec<PendingAsk> = Vec::new();
        for event in &events {
            match &event.kind {
                EventKind::PermissionRequest {
                    request_id,
                    tool,
                    args,
                    rule,
                } => pending.push(PendingAsk {
                    run_id: record.run_id.clone(),
                    request_id: request_id.clone(),
                    tool: tool.clone(),
                    args: args.clone(),
                    rule: rule.clone(),
                    seq: event.seq,
                }),
                EventKind::PermissionResolved { request_id, .. } => pending.retain(|ask| ask.request_id != *request_id),
                _ => {}
            }
        }
        let model = (record.model != self.inner.agents.default_model()
            && self.inner.config.models.contains(&record.model))
        .then(|| record.model.clone());
        // The tools its request was given, no more: a restart must not widen
        // what a client allowed its run.
        let request = store
            .run_request(&record.run_id)
            .await
            .map_err(|err| NotTaken::NotNow(err.to_string()))?;
        let tools = match request {
            Some(request) => {
                let params: StartRun = serde_json::from_str(&request)
                    .map_err(|err| NotTaken::Never(format!("its stored request is unreadable: {err}")))?;
                params.tools
            }
            None => None,
        };
        // A tool it was given that this server lacks now (an MCP server
        // down, a tool turned off): not now; it stays interrupted.
        let agent = self
            .inner
            .agents
            .get(model.as_deref(), tools.as_deref())
            .await
            .map_err(NotTaken::NotNow)?;
        let (done, _) = watch::channel(None);
        self.inner.feed.open(&record.run_id, last_seq);
        self.back_in_line(
            LiveRun {
                run_id: record.run_id.clone(),
                session_id: record.session_id.clone(),
                principal: principal.clone(),
                prompt: record.prompt.clone(),
                model: record.model.clone(),
                status: RunStatus::Queued,
                started_ms: record.started_ms,
                metrics: record.metrics.clone(),
                content: None,
                last_seq,
                start: Some((agent, Start::Resume)),
                stored: true,
                controller: None,
                cancel_requested: false,
                seeded: !pending.is_empty(),
                pending,
                early: HashMap::new(),
                done,
            },
            None,
        );
        Ok(())
    }

    /// A run a previous server accepted and never started: back in line,
    /// if this server can still run it as it was asked for.
    async fn take_back_queued(&self, queued: QueuedRun) -> Result<(), NotTaken> {
        let record = queued.record;
        let owner = record
            .principal
            .clone()
            .ok_or_else(|| NotTaken::Never("the run has no owner".into()))?;
        let principal = Principal(owner.into());
        let params: StartRun = serde_json::from_str(&queued.request)
            .map_err(|err| NotTaken::Never(format!("its stored request is unreadable: {err}")))?;
        // The configuration may have changed since (a model no longer offered, a lower step limit).
        self.validate(&params).map_err(|err| NotTaken::Never(err.to_string()))?;
        let agent = self.agent_for(&params).await.map_err(NotTaken::NotNow)?;
        let mut run = self.queued_run(
            &principal,
            &params,
            agent,
            &record.run_id,
            &record.session_id,
            record.started_ms,
            None,
        );
        run.stored = true;
        self.inner.feed.open(&record.run_id, 0);
        let key = params
            .idempotency_key
            .clone()
            .map(|key| (key, super::admission::digest(&params)));
        self.back_in_line(run, key);
        Ok(())
    }

    /// A run taken back after a restart joins the registry (with the
    /// idempotency key that names it) and waits in line under the caps.
    pub(super) fn back_in_line(&self, run: LiveRun, key: Option<(String, u64)>) {
        let ticket = Ticket {
            run_id: run.run_id.clone(),
            principal: run.principal.clone(),
            session_id: run.session_id.clone(),
        };
        let launches = {
            let mut registry = self.registry();
            if let Some((key, digest)) = key {
                registry.remember(&ticket.principal, key, digest, ticket.run_id.clone());
            }
            registry.add(run);
            let started = self.inner.queue.readmit(ticket);
            let launches = registry.starting(started);
            self.publish_gauges(&registry);
            launches
        };
        for launch in launches {
            self.launch(launch);
        }
    }

    /// Stops taking runs, interrupts the live ones (each checkpoints and
    /// stays `INTERRUPTED`, for the next start to resume) and waits for
    /// them, at most the shutdown grace. Queued runs stay `QUEUED` in the
    /// store for the next start; without a store they end `CANCELED`.
    pub async fn shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        let queued: Vec<LiveRun> = {
            let mut registry = self.registry();
            let queued = self
                .inner
                .queue
                .drain()
                .iter()
                .filter_map(|ticket| registry.remove(&ticket.run_id))
                .collect();
            for run in registry.runs.values() {
                if let Some(controller) = &run.controller {
                    controller.interrupt("the server is shutting down");
                }
            }
            self.publish_gauges(&registry);
            queued
        };
        if self.inner.store.is_some() {
            // Their clients' streams end here; the next start takes them.
            if !queued.is_empty() {
                tracing::info!(count = queued.len(), "queued runs stay queued for the next start");
            }
            for run in &queued {
                self.inner.feed.close(&run.run_id);
            }
        } else if !queued.is_empty() {
            // Nothing outlives this process: they end CANCELED, with a reason.
            tracing::warn!(count = queued.len(), "queued runs that never started are cancelled");
        }
        for run in queued.into_iter().filter(|_| self.inner.store.is_none()) {
            let run_id = run.run_id.clone();
            if let Err(err) = self
                .cancel_queued(run, "the server shut down before the run started")
                .await
            {
                tracing::error!(run_id, error = %err, "could not record a cancelled queued run");
            }
        }
        self.inner.pumps.close();
        if tokio::time::timeout(self.inner.config.shutdown_grace, self.inner.pumps.wait())
            .await
            .is_err()
        {
            tracing::warn!("some runs did not stop within the shutdown grace");
        }
    }
}
