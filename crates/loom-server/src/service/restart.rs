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
    /// `INTERRUPTED` (or whose process died), with the asks they left open
    /// (each run shows them), and the runs it had accepted and not started. Both wait in
    /// the queue under its caps like any run. Returns how many.
    pub async fn resume_interrupted(&self) -> Result<usize, ApiError> {
        let Some(store) = self.inner.store.clone() else {
            return Ok(0);
        };
        // On a cluster the workers take runs back; clients' requests bring
        // the runs they ask for to this gateway (`remote.rs`).
        if self.on_workers() {
            return Ok(0);
        }
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
                .take_back_interrupted(&record, Principal::new(principal.as_str()), store.as_ref())
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

    /// A run this gateway executed stopped `INTERRUPTED` while it still
    /// serves: its store failed under it (down, its disk full, its database
    /// held past the busy timeout). It is taken back, from its last
    /// checkpoint, as a restart would, once the store answers again — tried
    /// after 1 s, then twice as long each time up to 30 s, until the
    /// shutdown. A run whose interruption could not be written either is
    /// still `RUNNING` under this process's name: it is marked interrupted
    /// first. A run another process holds, or that ended, is left alone.
    pub(super) fn take_back_when_stored(&self, run_id: String, principal: Principal) {
        if self.inner.store.is_none() || self.on_workers() {
            return;
        }
        let service = self.clone();
        tokio::spawn(async move {
            // It reads /proc and the machine id: off the async threads.
            let Ok(me) = tokio::task::spawn_blocking(loom_core::owner::this_process).await else {
                return;
            };
            let mut wait = Duration::from_secs(1);
            loop {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(30));
                let Some(store) = service.inner.store.clone().filter(|_| !service.shutting_down()) else {
                    return;
                };
                if service.registry().runs.contains_key(&run_id) {
                    return;
                }
                let record = match store.load_run(&run_id).await {
                    Ok(snapshot) => snapshot.run,
                    Err(StoreError::NotFound(_)) => return,
                    Err(err) => {
                        tracing::warn!(run_id, error = %err, "an interrupted run waits for its store");
                        continue;
                    }
                };
                let taken = match record.status {
                    // Its start could not be written: still in line, as a
                    // restart would find it.
                    RunStatus::Queued => match store.run_request(&run_id).await {
                        Ok(Some(request)) => service.take_back_queued(QueuedRun { record, request }).await,
                        Ok(None) => return,
                        Err(err) => {
                            tracing::warn!(run_id, error = %err, "an interrupted run waits for its store");
                            continue;
                        }
                    },
                    RunStatus::Interrupted => {
                        if let Err(err) = interrupt_children(store.as_ref(), &run_id, &me).await {
                            tracing::warn!(run_id, error = %err, "an interrupted run waits for its store");
                            continue;
                        }
                        service
                            .take_back_interrupted(&record, principal.clone(), store.as_ref())
                            .await
                    }
                    RunStatus::Running | RunStatus::WaitingPermission if record.owner == me => {
                        let marked = match store.mark_interrupted(&run_id, &me).await {
                            Ok(marked) => interrupt_children(store.as_ref(), &run_id, &me).await.map(|()| marked),
                            Err(err) => Err(err),
                        };
                        match marked {
                            Ok(true) => {
                                service
                                    .take_back_interrupted(&record, principal.clone(), store.as_ref())
                                    .await
                            }
                            Ok(false) => return,
                            Err(err) => {
                                tracing::warn!(run_id, error = %err, "an interrupted run waits for its store");
                                continue;
                            }
                        }
                    }
                    _ => return,
                };
                match taken {
                    Ok(()) => {
                        tracing::info!(run_id, "the store answers again: the interrupted run is taken back");
                        return;
                    }
                    Err(NotTaken::Never(reason)) => {
                        service.never_taken(store.as_ref(), &run_id, &reason).await;
                        return;
                    }
                    Err(NotTaken::NotNow(reason)) => {
                        tracing::warn!(run_id, error = %reason, "an interrupted run cannot be taken back yet");
                    }
                }
            }
        });
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
        let model = (record.model != self.inner.agents.default_model()
            && self.inner.config.models.contains(&record.model))
        .then(|| record.model.clone());
        // The tools and the mode its request was given, no more: a restart
        // must not widen what a client allowed its run.
        let request = store
            .run_request(&record.run_id)
            .await
            .map_err(|err| NotTaken::NotNow(err.to_string()))?;
        let (tools, mode) = match request {
            Some(request) => {
                let params: StartRun = serde_json::from_str(&request)
                    .map_err(|err| NotTaken::Never(format!("its stored request is unreadable: {err}")))?;
                (params.tools, params.mode.unwrap_or_default())
            }
            None => (None, loom_core::Mode::Default),
        };
        // A mode this server no longer allows (the operator took it off
        // `allowed_modes`): never resumed here.
        if !self.inner.config.allowed_modes.contains(&mode) {
            return Err(NotTaken::Never(format!(
                "its mode {mode} is no longer allowed by this server"
            )));
        }
        // A tool it was given that this server lacks now (an MCP server
        // down, a tool turned off): not now; it stays interrupted.
        let agent = self
            .inner
            .agents
            .get(model.as_deref(), tools.as_deref(), mode)
            .await
            .map_err(NotTaken::NotNow)?;
        // Its controls exist from now on, showing the asks it left open:
        // an answer sent while it waits for a slot applies when it asks again.
        // Whatever stops it now (its status changed meanwhile, the store
        // failed) leaves it as it is: never a cancel written into a log
        // another process may own.
        let resuming = agent
            .prepare_resume(&record.run_id)
            .await
            .map_err(|err| NotTaken::NotNow(err.to_string()))?;
        let controller: Arc<dyn RunControl> = Arc::new(resuming.controller());
        let state = controller.state();
        let (done, _) = watch::channel(None);
        self.inner.feed.open(&record.run_id, state.last_seq);
        self.back_in_line(
            LiveRun {
                run_id: record.run_id.clone(),
                session_id: record.session_id.clone(),
                principal: principal.clone(),
                prompt: record.prompt.clone(),
                model: record.model.clone(),
                // An interrupted run has begun: it keeps its start.
                started_ms: Some(record.started_ms),
                accepted_ms: record.accepted_ms,
                queued: true,
                start: Some(Start::Resume(Box::new(resuming))),
                stored: true,
                controller: Some(controller),
                cancel_requested: false,
                asks_counted: state.pending_asks.len(),
                on_worker: false,
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
        let principal = Principal::new(owner.as_str());
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
            record.accepted_ms.unwrap_or(record.started_ms),
            None,
        );
        run.stored = true;
        self.inner.feed.open(&record.run_id, 0);
        let key = params
            .idempotency_key
            .clone()
            .map(|key| (key, super::admission_checks::digest(&params)));
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
                    let _ = controller.send(Control::Interrupt {
                        reason: "the server is shutting down".into(),
                    });
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

/// Marks the sub-agents of `run_id` that this process (`me`) still shows
/// executing — their own interruption could not be written either —
/// `INTERRUPTED`, depth first, so that the root's resumed `task` calls take
/// them over rather than find them held by a live process.
async fn interrupt_children(store: &dyn Store, run_id: &str, me: &str) -> Result<(), StoreError> {
    let mut pending = vec![run_id.to_string()];
    // A run tree is bounded by the nesting limit; this bounds a broken one.
    let mut visited = 0;
    while let Some(parent) = pending.pop() {
        visited += 1;
        if visited > 10_000 {
            break;
        }
        for child in store.child_runs(&parent).await? {
            if matches!(child.status, RunStatus::Running | RunStatus::WaitingPermission) && child.owner == me {
                store.mark_interrupted(&child.run_id, me).await?;
            }
            pending.push(child.run_id);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::AgentSpec;
    use loom_core::{async_trait, Decision, PermissionPolicy, Tool, ToolContext, ToolError, ToolOutput};
    use loom_llm::{ScriptToolCall, ScriptTurn, ScriptedModel};
    use std::sync::atomic::AtomicUsize;

    /// A tool with a side effect: it counts its calls.
    #[derive(Clone, Default)]
    struct Mark(Arc<AtomicUsize>);

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct NoArgs {}

    impl Tool for Mark {
        type Args = NoArgs;
        fn name(&self) -> &str {
            "mark"
        }
        fn description(&self) -> &str {
            "Leaves a mark."
        }
        async fn call(&self, _args: NoArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok("marked".into())
        }
    }

    /// Agents whose one call asks a person first. The runs of a gateway
    /// share its agent and so its script: the first agent built calls the
    /// tool in each of two runs, later ones answer.
    struct Asking(Mark, AtomicUsize);

    #[async_trait]
    impl AgentFactory for Asking {
        fn default_model(&self) -> String {
            "scripted:inline".into()
        }

        async fn build(&self, spec: AgentSpec) -> Result<Agent, String> {
            let call = ScriptTurn {
                tool_calls: vec![ScriptToolCall {
                    name: "mark".into(),
                    arguments: serde_json::json!({}),
                    id: Some("c_mark".into()),
                }],
                ..ScriptTurn::default()
            };
            let answer = ScriptTurn {
                content: Some("done".into()),
                ..ScriptTurn::default()
            };
            let script = if self.1.fetch_add(1, Ordering::SeqCst) == 0 {
                vec![call.clone(), call]
            } else {
                vec![answer; 10]
            };
            let mut builder = Agent::builder()
                .model(ScriptedModel::new(script))
                .tool(self.0.clone())
                .permissions(PermissionPolicy::new(Decision::Ask))
                .permission_timeout(Some(Duration::from_secs(10)));
            if let Some(store) = spec.store {
                builder = builder.store(store);
            }
            builder.build().map_err(|err| err.to_string())
        }
    }

    fn service(store: &Arc<dyn Store>, max_runs: usize, factory: &Arc<Asking>) -> Service {
        let settings: crate::config::ServerSettings = serde_json::from_value(serde_json::json!({
            "tokens": [{"name": "alice", "token": "alice-token-0123"}],
            "max_runs": max_runs,
        }))
        .unwrap_or_default();
        let config = ServerConfig::from_settings(&settings, None).unwrap_or_default();
        Service::new(config, factory.clone(), Some(store.clone()))
    }

    async fn asks_of(service: &Service, run_id: &str, count: usize) -> Vec<PendingAsk> {
        for _ in 0..500 {
            let asks = service.pending(&testing::alice(), Some(run_id)).await.unwrap();
            if asks.len() >= count {
                return asks;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let view = service.get(&testing::alice(), run_id).await;
        panic!("run {run_id} never showed {count} ask(s): {view:?}");
    }

    async fn allow(service: &Service, run_id: &str, ask: &PendingAsk) -> Result<(), ApiError> {
        service
            .respond(&testing::alice(), run_id, &ask.request_id, PermissionDecision::Allow)
            .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runs_taken_back_show_the_asks_they_left_open_and_take_answers_while_they_wait_in_line() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(loom_store::SqliteStore::open(dir.path().join("loom.db")).unwrap());
        let mark = Mark::default();
        let factory = Arc::new(Asking(mark.clone(), AtomicUsize::new(0)));
        let first = service(&store, 4, &factory);
        let a = first
            .start(&testing::alice(), testing::start("a"))
            .await
            .unwrap()
            .run_id;
        let b = first
            .start(&testing::alice(), testing::start("b"))
            .await
            .unwrap()
            .run_id;
        let asked_a = asks_of(&first, &a, 1).await.remove(0);
        let asked_b = asks_of(&first, &b, 1).await.remove(0);
        first.shutdown().await;
        drop(first);

        // One slot: one run resumes, the other waits in line.
        let second = service(&store, 1, &factory);
        assert_eq!(second.resume_interrupted().await.unwrap(), 2);
        let (live, waiting, asked_waiting, asked_live) = {
            let view_a = second.get(&testing::alice(), &a).await.unwrap();
            if view_a.status == RunStatus::Queued {
                (b.clone(), a.clone(), asked_a, asked_b)
            } else {
                (a.clone(), b.clone(), asked_b, asked_a)
            }
        };
        let view = second.get(&testing::alice(), &waiting).await.unwrap();
        assert_eq!(view.status, RunStatus::Queued, "{view:?}");
        assert_eq!(
            view.pending_asks,
            std::slice::from_ref(&asked_waiting),
            "the run in line shows its own ask"
        );
        // Answered while it waits: the run keeps the answer for when it asks again.
        allow(&second, &waiting, &asked_waiting).await.unwrap();
        let listed = second.pending(&testing::alice(), Some(&waiting)).await.unwrap();
        assert!(listed.is_empty(), "answered, it is no longer listed: {listed:?}");
        let again = allow(&second, &waiting, &asked_waiting).await.unwrap_err();
        assert_eq!(again.code, Code::InvalidState, "answered once");
        // The live one asks again under its id (a later seq), and is answered.
        let mut asked = asks_of(&second, &live, 1).await;
        for _ in 0..500 {
            if asked.first().is_some_and(|ask| ask.seq > asked_live.seq) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            asked = asks_of(&second, &live, 1).await;
        }
        assert!(asked[0].seq > asked_live.seq, "asked again: {asked:?}");
        assert_eq!(asked[0].request_id, asked_live.request_id);
        allow(&second, &live, &asked_live).await.unwrap();
        // Acknowledged only once the decision is in the run's log.
        let log = store.events(&live, 0).await.unwrap();
        let recorded = log.iter().any(|event| {
            matches!(&event.kind, EventKind::PermissionResolved { request_id, .. } if *request_id == asked_live.request_id)
        });
        assert!(recorded, "the answer is stored before it is acknowledged");
        for run_id in [&live, &waiting] {
            let mut status = RunStatus::Queued;
            for _ in 0..500 {
                status = second.get(&testing::alice(), run_id).await.unwrap().status;
                if status.is_terminal() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(status, RunStatus::Done, "{run_id}");
        }
        assert_eq!(mark.0.load(Ordering::SeqCst), 2, "each run's call ran once");
        second.shutdown().await;
    }
}
