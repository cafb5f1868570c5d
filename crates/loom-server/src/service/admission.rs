//! Taking a run in: checking the request, its idempotency key and its
//! session, storing the run before the answer, then starting it or
//! putting it in line.

use super::*;

/// What `admit` did with a start request.
enum Admitted {
    /// Started, queued, or joined (steer) a run — or found the live run of
    /// the same idempotency key.
    Run(RunAccepted),
    /// The run of the same idempotency key ended while this request was
    /// being checked: answer with where it is now.
    EndedMeanwhile,
    /// A steer of the session's run that a worker executes: stored for
    /// it before the answer (the prompt is the message).
    SteerOnWorker(RunAccepted, String),
}

/// What becomes of a run once its record is written.
pub(super) enum AfterStored {
    /// It starts, if the queue let it.
    Launch(Option<Box<Launch>>),
    /// A cancel came while it was written: it is cancelled now.
    Cancel(Box<LiveRun>),
}

impl Service {
    /// The agent a start request asks for: its model (the default when it
    /// names none, or names the default) and its tools.
    pub(super) async fn agent_for(&self, params: &StartRun) -> Result<Agent, String> {
        let model = params.model.clone().filter(|m| *m != self.inner.agents.default_model());
        self.inner
            .agents
            .get(
                model.as_deref(),
                params.tools.as_deref(),
                params.mode.unwrap_or_default(),
            )
            .await
    }

    /// `agent.run`.
    pub async fn start(&self, principal: &Principal, mut params: StartRun) -> Result<RunAccepted, ApiError> {
        principal.may_change("start runs")?;
        self.within_grant(principal, &mut params)?;
        let key = params.idempotency_key.clone();
        let digest = digest(&params);
        match self.admit(principal, params).await? {
            Admitted::SteerOnWorker(accepted, message) => {
                if let Err(err) = self.steer_on_worker(principal, &accepted.run_id, message).await {
                    if let Some(key) = &key {
                        self.registry().forget_key(principal, key);
                    }
                    return Err(err);
                }
                if let Some(key) = &key {
                    self.persist_key(principal, key, digest, &accepted.run_id).await;
                }
                Ok(accepted)
            }
            Admitted::Run(mut accepted) => {
                if self.on_workers() && accepted.status == RunStatus::Queued && !accepted.steered {
                    accepted.queue_position = self.cluster_position(&accepted.run_id).await;
                }
                // A new run's key was stored with it; a steer's is stored here.
                if let (Some(key), true) = (&key, accepted.steered) {
                    self.persist_key(principal, key, digest, &accepted.run_id).await;
                }
                Ok(accepted)
            }
            // A request with the same key started a run that ended while
            // this one was being checked: answer with that run.
            Admitted::EndedMeanwhile => match key {
                Some(key) => self
                    .idempotent(principal, &key, digest)
                    .await?
                    .ok_or_else(|| ApiError::internal("an idempotency key lost its run", key)),
                None => Err(ApiError::internal("an idempotency key lost its run", "no key")),
            },
        }
    }

    /// Stores a steer for the worker of the session's run.
    async fn steer_on_worker(&self, principal: &Principal, run_id: &str, message: String) -> Result<(), ApiError> {
        match self.followed_run(principal, run_id) {
            Some(remote) => remote.deliver(Control::Steer(message)).await.map_err(store_error),
            None => Err(ApiError::new(
                Code::Conflict,
                format!("the live run {run_id} cannot take a message now"),
            )),
        }
    }

    async fn admit(&self, principal: &Principal, params: StartRun) -> Result<Admitted, ApiError> {
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return Err(
                ApiError::new(Code::Overloaded, "the server is shutting down").retry_after(Duration::from_secs(5))
            );
        }
        self.validate(&params)?;
        let digest = digest(&params);
        if let Some(key) = &params.idempotency_key {
            if let Some(accepted) = self.idempotent(principal, key, digest).await? {
                return Ok(Admitted::Run(accepted));
            }
        }
        if let Some(session) = &params.session_id {
            self.check_session_owner(principal, session).await?;
            // On a cluster, the session's live run may have come through
            // another gateway: followed here, `onBusy` applies to it too.
            self.adopt_session(principal, session).await?;
        }
        let agent = self
            .agent_for(&params)
            .await
            .map_err(|err| ApiError::new(Code::InvalidParams, err))?;
        let run_id = uuid::Uuid::new_v4().to_string();
        let session_id = params.session_id.clone().unwrap_or_else(|| run_id.clone());
        let on_busy = params.on_busy.unwrap_or_default();

        let queued;
        let (accepted, mut launches, to_cancel) = {
            let mut registry = self.registry();
            // A retry with the same key may have raced this one.
            if let Some(key) = &params.idempotency_key {
                if let Some((known, existing)) = registry.remembered(principal, key).cloned() {
                    if known != digest {
                        return Err(conflicting_key());
                    }
                    let position = self.inner.queue.position(&existing);
                    return match registry.run(principal, &existing) {
                        Some(run) if !run.stored => Err(being_accepted()),
                        Some(run) => Ok(Admitted::Run(accepted_of(run, position))),
                        // It ended meanwhile: where it is now.
                        None => Ok(Admitted::EndedMeanwhile),
                    };
                }
            }
            // Checked again under the lock: two tokens naming one new
            // session at once must not share it.
            if registry
                .on_session(&session_id)
                .iter()
                .any(|run| &run.principal != principal)
            {
                return Err(session_taken(&session_id));
            }
            let live: Vec<(String, bool)> = registry
                .on_session(&session_id)
                .iter()
                .map(|run| (run.run_id.clone(), run.queued))
                .collect();
            let mut to_cancel = Vec::new();
            if let Some((busy_id, busy_queued)) = live.first() {
                match on_busy {
                    OnBusy::Reject => {
                        return Err(ApiError::new(
                            Code::Conflict,
                            format!("session '{session_id}' has a live run ({busy_id})"),
                        ))
                    }
                    OnBusy::Steer => {
                        let busy = BusyRun {
                            run_id: busy_id,
                            queued: *busy_queued,
                            session_id: &session_id,
                        };
                        return steer_busy(&mut registry, principal, &params, digest, busy);
                    }
                    OnBusy::Interrupt => to_cancel = live.iter().map(|(id, _)| id.clone()).collect(),
                    OnBusy::Enqueue => {}
                }
            }
            let history = match &self.inner.store {
                None => Some(
                    registry
                        .histories
                        .get(&history_key(principal, &session_id))
                        .cloned()
                        .unwrap_or_default(),
                ),
                // A session this run begins has no conversation to read back.
                Some(_) if params.session_id.is_none() => Some(Vec::new()),
                Some(_) => None,
            };
            let run = self.queued_run(principal, &params, agent, &run_id, &session_id, now_ms(), history);
            // Stored before the answer, with its key, in one write (below).
            queued = match &self.inner.store {
                Some(_) => Some(QueuedRun {
                    record: run.record(RunStatus::Queued),
                    request: serde_json::to_string(&params)
                        .map_err(|err| ApiError::internal("the request could not be written", err))?,
                }),
                None => None,
            };
            registry.add(run);
            self.inner.feed.open(&run_id, 0);
            let ticket = Ticket {
                run_id: run_id.clone(),
                principal: principal.clone(),
                session_id,
            };
            let launches = match self.inner.queue.push(ticket) {
                Ok(started) => registry.starting(started),
                Err(QueueFull) => {
                    registry.remove(&run_id);
                    self.inner.feed.forget(&run_id);
                    return Err(
                        ApiError::new(Code::Overloaded, "too many runs are waiting; try again later")
                            .retry_after(Duration::from_secs(1)),
                    );
                }
            };
            if let Some(key) = &params.idempotency_key {
                registry.remember(principal, key.clone(), digest, run_id.clone());
            }
            self.publish_gauges(&registry);
            let position = self.inner.queue.position(&run_id);
            let run = registry.runs.get(&run_id).ok_or_else(|| ApiError::no_run(&run_id))?;
            (accepted_of(run, position), launches, to_cancel)
        };
        if let Some(queued) = queued {
            let key = params.idempotency_key.as_deref().map(|key| (key, digest));
            match self.store_accepted(principal, &queued, key, launches).await? {
                Some(more) => launches = more,
                // Cancelled while its record was written, and now.
                None => return Ok(Admitted::Run(accepted)),
            }
        }
        for launch in launches {
            self.launch(launch);
        }
        if !to_cancel.is_empty() {
            // The new run starts once the session's live runs have stopped.
            let service = self.clone();
            let principal = principal.clone();
            tokio::spawn(async move {
                for id in to_cancel {
                    let _ = service
                        .cancel_with(&principal, &id, "interrupted by a new run of the session")
                        .await;
                }
            });
        }
        Ok(Admitted::Run(accepted))
    }

    /// Writes an accepted run (with its idempotency key) before anyone
    /// hears of it. The launches to make once it is stored — `None` when a
    /// cancel came meanwhile (the run is cancelled now, and the launches
    /// made); a failed write takes the run back (the client gets no run id).
    async fn store_accepted(
        &self,
        principal: &Principal,
        queued: &QueuedRun,
        key: Option<(&str, u64)>,
        mut launches: Vec<Launch>,
    ) -> Result<Option<Vec<Launch>>, ApiError> {
        let Some(store) = &self.inner.store else {
            return Ok(Some(launches));
        };
        let run_id = &queued.record.run_id;
        let keyed = key.map(|(key, digest)| {
            (
                key,
                KeyedRequest {
                    digest,
                    run_id: run_id.clone(),
                },
            )
        });
        let written = store
            .queue_run(queued, keyed.as_ref().map(|(key, request)| (*key, request)))
            .await;
        match written {
            Ok(()) => match self.after_stored(run_id) {
                AfterStored::Launch(launch) => {
                    launches.extend(launch.map(|launch| *launch));
                    Ok(Some(launches))
                }
                AfterStored::Cancel(run) => {
                    for launch in launches {
                        self.launch(launch);
                    }
                    if let Err(err) = self.cancel_queued(*run, "cancelled by the client").await {
                        tracing::error!(run_id, error = %err, "could not record a cancelled run");
                    }
                    Ok(None)
                }
            },
            Err(err) => {
                launches.extend(self.unaccept(principal, run_id, key.map(|(key, _)| key)));
                for launch in launches {
                    self.launch(launch);
                }
                Err(store_error(err))
            }
        }
    }

    /// A new run of `params` as the registry holds it until it starts.
    #[allow(clippy::too_many_arguments)] // the parts of one run, each from its own place
    pub(super) fn queued_run(
        &self,
        principal: &Principal,
        params: &StartRun,
        agent: Agent,
        run_id: &str,
        session_id: &str,
        accepted_ms: u64,
        history: Option<Vec<Message>>,
    ) -> LiveRun {
        let request = RunRequest {
            prompt: params.prompt.clone(),
            run_id: Some(run_id.to_string()),
            session_id: Some(session_id.to_string()),
            history,
            max_steps: params.max_steps,
            principal: Some(principal.name().to_string()),
            forked_from: None,
            trace_parent: params.traceparent,
        };
        let (done, _) = watch::channel(None);
        LiveRun {
            run_id: run_id.to_string(),
            session_id: session_id.to_string(),
            principal: principal.clone(),
            prompt: params.prompt.clone(),
            model: params
                .model
                .clone()
                .unwrap_or_else(|| self.inner.agents.default_model()),
            started_ms: None,
            accepted_ms: Some(accepted_ms),
            queued: true,
            start: Some(Start::New(agent, Box::new(request))),
            stored: self.inner.store.is_none(),
            controller: None,
            cancel_requested: false,
            asks_counted: 0,
            on_worker: self.on_workers(),
            done,
        }
    }

    /// A run's record is written: it starts (if the queue let it), or — if a
    /// cancel came meanwhile — leaves to be cancelled; during a shutdown it
    /// stays queued in the store for the next start.
    pub(super) fn after_stored(&self, run_id: &str) -> AfterStored {
        let mut registry = self.registry();
        let cancelled = registry.runs.get(run_id).is_some_and(|run| run.cancel_requested);
        if !cancelled && !self.shutting_down() {
            return AfterStored::Launch(registry.stored(run_id).map(Box::new));
        }
        let started = if self.inner.queue.withdraw(run_id) {
            Vec::new()
        } else {
            self.inner.queue.finished(run_id, !self.shutting_down())
        };
        let launches = registry.starting(started);
        let run = registry.remove(run_id);
        self.publish_gauges(&registry);
        drop(registry);
        for launch in launches {
            self.launch(launch);
        }
        match run {
            Some(mut run) if cancelled => {
                run.stored = true;
                AfterStored::Cancel(Box::new(run))
            }
            _ => {
                self.inner.feed.close(run_id);
                AfterStored::Launch(None)
            }
        }
    }

    /// Takes back a run whose record could not be stored: it leaves the
    /// registry, the queue and the feed. Returns the runs its place lets start.
    pub(super) fn unaccept(&self, principal: &Principal, run_id: &str, key: Option<&str>) -> Vec<Launch> {
        let launches = {
            let mut registry = self.registry();
            registry.remove(run_id);
            if let Some(key) = key {
                registry.forget_key(principal, key);
            }
            let started = if self.inner.queue.withdraw(run_id) {
                Vec::new()
            } else {
                self.inner.queue.finished(run_id, !self.shutting_down())
            };
            let launches = registry.starting(started);
            self.publish_gauges(&registry);
            launches
        };
        self.inner.feed.forget(run_id);
        launches
    }
}

/// The session's live run a prompt with `onBusy: steer` joins.
struct BusyRun<'a> {
    run_id: &'a str,
    queued: bool,
    session_id: &'a str,
}

/// Gives the prompt to the session's live run as a message (`onBusy:
/// steer`), under the registry's lock: sent to a run executing here, or
/// stored for its worker after the lock (`Admitted::SteerOnWorker`).
fn steer_busy(
    registry: &mut Registry,
    principal: &Principal,
    params: &StartRun,
    digest: u64,
    busy: BusyRun<'_>,
) -> Result<Admitted, ApiError> {
    let run = registry.runs.get(busy.run_id);
    let on_worker = run.is_some_and(|run| run.on_worker);
    let steered = match run.and_then(|run| run.controller.as_ref()) {
        // Stored for its worker after this lock (`start`).
        Some(_) if on_worker => true,
        Some(controller) if !busy.queued => controller.send(Control::Steer(params.prompt.clone())).is_ok(),
        _ => false,
    };
    if !steered {
        return Err(ApiError::new(
            Code::Conflict,
            format!(
                "the live run {} of session '{}' cannot take a message now",
                busy.run_id, busy.session_id
            ),
        ));
    }
    let run = registry
        .runs
        .get(busy.run_id)
        .ok_or_else(|| ApiError::no_run(busy.run_id))?;
    let mut accepted = accepted_of(run, None);
    accepted.steered = true;
    // A retry of this request must not steer twice.
    if let Some(key) = &params.idempotency_key {
        registry.remember(principal, key.clone(), digest, busy.run_id.to_string());
    }
    if on_worker {
        return Ok(Admitted::SteerOnWorker(accepted, params.prompt.clone()));
    }
    Ok(Admitted::Run(accepted))
}

pub(super) fn accepted_of(run: &LiveRun, queue_position: Option<usize>) -> RunAccepted {
    RunAccepted {
        run_id: run.run_id.clone(),
        session_id: run.session_id.clone(),
        status: run.status(),
        queue_position,
        steered: false,
    }
}
