//! Telling a run something: cancel, steer, answer an ask.

use super::*;

/// How long a cancel waits for a run to stop before it answers `INTERNAL`
/// (the engine stops a run within its tools' cancel grace; this only
/// guards against a run that never does).
const CANCEL_WAIT: Duration = Duration::from_secs(60);

/// How long an answer waits for the run to record it before it is
/// acknowledged anyway (a run records it within one write of its log).
const ANSWER_WAIT: Duration = Duration::from_secs(10);

impl Service {
    /// `agent.cancel`: answers once the run has stopped.
    pub async fn cancel(&self, principal: &Principal, run_id: &str) -> Result<Cancelled, ApiError> {
        principal.may_change("cancel runs")?;
        self.cancel_with(principal, run_id, "cancelled by the client").await
    }

    pub(super) async fn cancel_with(
        &self,
        principal: &Principal,
        run_id: &str,
        reason: &str,
    ) -> Result<Cancelled, ApiError> {
        self.adopt(principal, run_id).await?;
        self.refuse_sub_agent(principal, run_id, "cancel")?;
        if let Some(remote) = self.followed_run(principal, run_id) {
            // Stored for its worker (or the run withdrawn from the line)
            // before anything else; the answer waits for its end.
            let done = self.registry().runs.get(run_id).map(|run| run.done.subscribe());
            if let Some(done) = done {
                if done.borrow().is_none() {
                    remote
                        .deliver(Control::Cancel {
                            reason: reason.to_string(),
                        })
                        .await
                        .map_err(store_error)?;
                    return self.cancelled_when_stopped(run_id, done).await;
                }
            }
        }
        enum Found {
            Queued(Option<Box<LiveRun>>),
            Running(watch::Receiver<Option<(u64, RunStatus)>>),
            Ended,
        }
        let found = {
            let mut registry = self.registry();
            let found = match registry.run_mut(principal, run_id) {
                Some(run) if run.queued && run.stored => None,
                // Its record is being written: the admission cancels it
                // once it is (docs/server.md), and this waits for that.
                Some(run) if run.queued => {
                    run.cancel_requested = true;
                    Some(Found::Running(run.done.subscribe()))
                }
                // Its lifecycle.end is out: it ended before this cancel.
                Some(run) if run.status().is_terminal() => Some(Found::Ended),
                Some(run) => {
                    let done = run.done.subscribe();
                    let cancel = Control::Cancel {
                        reason: reason.to_string(),
                    };
                    match &run.controller {
                        // Cancelling a run that is ending is harmless.
                        Some(controller) => {
                            let _ = controller.send(cancel);
                        }
                        None => run.cancel_requested = true,
                    }
                    Some(Found::Running(done))
                }
                None => Some(Found::Ended),
            };
            found.unwrap_or_else(|| {
                // Queued in the registry, so waiting in the queue: nothing
                // starts a run without the registry's lock.
                self.inner.queue.withdraw(run_id);
                let run = registry.remove(run_id);
                self.publish_gauges(&registry);
                Found::Queued(run.map(Box::new))
            })
        };
        let waiting = match found {
            Found::Queued(Some(run)) => return self.cancel_queued(*run, reason).await,
            Found::Queued(None) => return Err(ApiError::no_run(run_id)),
            Found::Running(done) => Some(done),
            Found::Ended => None,
        };
        let Some(done) = waiting else {
            let view = self.get(principal, run_id).await?;
            // Interrupted and held by nobody (its store failed under it and
            // the gateway waits to take it back): closed as cancelled in
            // the store, which the taking back then finds.
            if let (RunStatus::Interrupted, Some(store), false) = (view.status, &self.inner.store, self.on_workers()) {
                // Taken back meanwhile: a live run is cancelled through it.
                if self.registry().runs.contains_key(run_id) {
                    return Err(ApiError::new(
                        Code::InvalidState,
                        format!("run {run_id} is being resumed; cancel it again"),
                    ));
                }
                if view.parent_run_id.is_none() {
                    let log = loom_core::recovery::close_cancelled(store.as_ref(), run_id, reason)
                        .await
                        .map_err(store_error)?;
                    return Ok(Cancelled {
                        run_id: run_id.to_string(),
                        cancelled: true,
                        final_seq: log.last().map_or(view.last_seq, |event| event.seq),
                    });
                }
            }
            return Err(ApiError::new(
                Code::InvalidState,
                format!("run {run_id} has already ended ({})", view.status.as_str()),
            ));
        };
        self.cancelled_when_stopped(run_id, done).await
    }

    /// The answer to a cancel, once the run has stopped.
    async fn cancelled_when_stopped(
        &self,
        run_id: &str,
        mut done: watch::Receiver<Option<(u64, RunStatus)>>,
    ) -> Result<Cancelled, ApiError> {
        let stopped = tokio::time::timeout(CANCEL_WAIT, done.wait_for(Option::is_some)).await;
        match stopped {
            Ok(Ok(ended)) => match *ended {
                Some((final_seq, RunStatus::Canceled)) => Ok(Cancelled {
                    run_id: run_id.to_string(),
                    cancelled: true,
                    final_seq,
                }),
                Some((_, RunStatus::Interrupted)) => Err(ApiError::new(
                    Code::InvalidState,
                    format!(
                        "run {run_id} was interrupted (a server shutdown, or its store failed) before the cancel reached it; cancel it again: an interrupted run this gateway holds is closed as cancelled"
                    ),
                )),
                Some((_, status)) => Err(ApiError::new(
                    Code::InvalidState,
                    format!("run {run_id} ended ({}) before it could be cancelled", status.as_str()),
                )),
                None => Err(ApiError::internal("the run did not stop in time", run_id)),
            },
            _ => Err(ApiError::internal("the run did not stop in time", run_id)),
        }
    }

    /// A queued run never started (or, taken back after a restart, has not
    /// resumed yet): its log ends with the cancel, recorded.
    pub(super) async fn cancel_queued(&self, run: LiveRun, reason: &str) -> Result<Cancelled, ApiError> {
        let log = match &self.inner.store {
            Some(store) if run.stored => loom_core::recovery::close_cancelled(store.as_ref(), &run.run_id, reason)
                .await
                .map_err(store_error)?,
            Some(store) => {
                // Cancelled before its record was written.
                let turn = TurnIds {
                    turn_id: run.run_id.as_str().into(),
                    parent_turn_id: None,
                };
                let log = loom_core::recovery::cancelled_log(&run.run_id, 0, &turn, reason, &RunMetrics::default());
                store
                    .create_run(&run.record(RunStatus::Queued))
                    .await
                    .map_err(store_error)?;
                store
                    .finish_run(&run.run_id, RunStatus::Canceled, None, &RunMetrics::default(), &log)
                    .await
                    .map_err(store_error)?;
                log
            }
            None => {
                let turn = TurnIds {
                    turn_id: run.run_id.as_str().into(),
                    parent_turn_id: None,
                };
                let log = loom_core::recovery::cancelled_log(&run.run_id, 0, &turn, reason, &RunMetrics::default());
                let mut view = run.view(None);
                view.status = RunStatus::Canceled;
                view.ended_ms = Some(now_ms());
                view.last_seq = log.len() as u64;
                self.registry()
                    .keep_finished(run.principal.clone(), view, self.inner.config.keep_finished_runs);
                log
            }
        };
        let final_seq = log.last().map_or(0, |event| event.seq);
        for event in log {
            self.inner.feed.publish(Arc::new(event));
        }
        self.inner.feed.close(&run.run_id);
        run.done.send_replace(Some((final_seq, RunStatus::Canceled)));
        metrics::counter!("loom_runs_finished_total", "status" => RunStatus::Canceled.as_str()).increment(1);
        Ok(Cancelled {
            run_id: run.run_id,
            cancelled: true,
            final_seq,
        })
    }

    /// `agent.steer`.
    pub async fn steer(&self, principal: &Principal, run_id: &str, message: String) -> Result<(), ApiError> {
        principal.may_change("steer runs")?;
        if message.trim().is_empty() {
            return Err(ApiError::new(Code::InvalidParams, "message must not be empty"));
        }
        self.adopt(principal, run_id).await?;
        self.refuse_sub_agent(principal, run_id, "steer")?;
        if let Some(remote) = self.followed_run(principal, run_id) {
            // Stored for its worker before the client hears it was taken.
            return remote.deliver(Control::Steer(message)).await.map_err(store_error);
        }
        let refused = {
            let registry = self.registry();
            match registry.run(principal, run_id) {
                Some(run) => match &run.controller {
                    Some(controller) if !run.queued => match controller.send(Control::Steer(message)) {
                        Ok(()) => return Ok(()),
                        Err(err) => err.to_string(),
                    },
                    _ => "the run has not started yet".to_string(),
                },
                None => String::new(),
            }
        };
        if refused.is_empty() {
            let view = self.get(principal, run_id).await?;
            return Err(ApiError::new(
                Code::InvalidState,
                format!("run {run_id} has already ended ({})", view.status.as_str()),
            ));
        }
        Err(ApiError::new(Code::InvalidState, refused))
    }

    /// A live sub-agent is controlled through the run that started it.
    pub(super) fn refuse_sub_agent(&self, principal: &Principal, run_id: &str, what: &str) -> Result<(), ApiError> {
        let registry = self.registry();
        match registry.sub_agents.get(run_id) {
            Some(root) if registry.run(principal, root).is_some() => Err(ApiError::new(
                Code::InvalidState,
                format!("run {run_id} is a sub-agent of run {root}: {what} {root} instead"),
            )),
            _ => Ok(()),
        }
    }

    /// `permission.respond`.
    pub async fn respond(
        &self,
        principal: &Principal,
        run_id: &str,
        request_id: &str,
        decision: PermissionDecision,
    ) -> Result<(), ApiError> {
        principal.may_change("answer asks")?;
        self.adopt(principal, run_id).await?;
        let root = answering_root(&self.registry(), run_id);
        if let Some(remote) = self.followed_run(principal, &root) {
            if !remote.asks(request_id) {
                return Err(ApiError::new(
                    Code::InvalidState,
                    format!("no ask '{request_id}' is waiting for an answer"),
                ));
            }
            let reply = Control::PermissionReply {
                request_id: request_id.to_string(),
                decision,
            };
            // Stored for its worker before the client hears it was taken
            // (the run applies it within a renewal, or as it resumes).
            return remote.deliver(reply).await.map_err(store_error);
        }
        let recorded = {
            let registry = self.registry();
            // A sub-agent's ask is answered by its root, whose state holds it.
            let answering = answering_root(&registry, run_id);
            match registry.run(principal, &answering) {
                Some(run) => {
                    let reply = Control::PermissionReply {
                        request_id: request_id.to_string(),
                        decision,
                    };
                    // The run decides: an ask it waits on, or one it left
                    // open before a restart (answered when it asks again).
                    let delivered = run
                        .controller
                        .as_ref()
                        .filter(|controller| controller.send(reply).is_ok());
                    match delivered {
                        Some(controller) => Some(controller.watch_state()),
                        None => {
                            return Err(ApiError::new(
                                Code::InvalidState,
                                format!("no ask '{request_id}' is waiting for an answer"),
                            ))
                        }
                    }
                }
                None => None,
            }
        };
        if let Some(mut state) = recorded {
            {
                // An ask answered before the resumed run asks it again leaves
                // the run's asks at once: the gauge follows.
                let asks = state.borrow().pending_asks.len();
                let mut registry = self.registry();
                let root = answering_root(&registry, run_id);
                registry.count_asks(&root, asks);
                self.publish_gauges(&registry);
            }
            // Acknowledged once the decision is in the run's log (its
            // `permission.resolved` visible, so stored) — or, for an ask
            // left open before a restart, kept by the run for when it asks
            // again. A run that stops first has not recorded it.
            let waiting =
                |state: &loom_core::LiveState| state.pending_asks.iter().any(|ask| ask.request_id == request_id);
            let settled = state.wait_for(|state| {
                !waiting(state) || state.status.is_terminal() || state.status == RunStatus::Interrupted
            });
            let outcome = tokio::time::timeout(ANSWER_WAIT, settled)
                .await
                .map(|settled| settled.map(|state| !waiting(&state)));
            let recorded = match outcome {
                Ok(Ok(recorded)) => recorded,
                // The run is gone (its controls dropped) or too slow.
                _ => !waiting(&state.borrow()),
            };
            if recorded {
                return Ok(());
            }
            return Err(ApiError::new(
                Code::InvalidState,
                format!("run {run_id} stopped before it recorded the answer to '{request_id}'; answer again when it asks again"),
            ));
        }
        self.get(principal, run_id).await?;
        Err(ApiError::new(
            Code::InvalidState,
            format!("no ask '{request_id}' is waiting for an answer: the run has ended"),
        ))
    }
}

/// The run that answers `run_id`'s asks: its root, for a sub-agent.
fn answering_root(registry: &Registry, run_id: &str) -> String {
    registry
        .sub_agents
        .get(run_id)
        .cloned()
        .unwrap_or_else(|| run_id.to_string())
}

#[cfg(test)]
mod tests {
    use super::super::testing::{alice, service, start};
    use super::*;

    #[tokio::test]
    async fn a_live_run_is_cancelled_and_answers_with_its_last_seq() {
        let service = service(5_000);
        let accepted = service.start(&alice(), start("wait")).await.unwrap();
        let cancelled = service.cancel(&alice(), &accepted.run_id).await.unwrap();
        assert!(cancelled.cancelled);
        assert!(cancelled.final_seq > 0);
        assert_eq!(
            service.get(&alice(), &accepted.run_id).await.unwrap().status,
            RunStatus::Canceled
        );
        // Once ended, a run cannot be steered.
        let late = service
            .steer(&alice(), &accepted.run_id, "more".into())
            .await
            .unwrap_err();
        assert_eq!(late.code, Code::InvalidState, "{late:?}");
    }

    #[tokio::test]
    async fn another_tokens_run_or_no_run_is_not_found() {
        let service = service(5_000);
        let accepted = service.start(&alice(), start("wait")).await.unwrap();
        let bob = Principal::new("bob");
        for err in [
            service.cancel(&bob, &accepted.run_id).await.unwrap_err(),
            service.steer(&bob, &accepted.run_id, "x".into()).await.unwrap_err(),
            service
                .respond(&bob, &accepted.run_id, "perm_1", PermissionDecision::Allow)
                .await
                .unwrap_err(),
            service.cancel(&alice(), "nope").await.unwrap_err(),
        ] {
            assert_eq!(err.code, Code::NotFound, "{err:?}");
        }
        // The run is there, but no such ask waits: a state the run is not in.
        let unknown = service
            .respond(&alice(), &accepted.run_id, "perm_none", PermissionDecision::Allow)
            .await
            .unwrap_err();
        assert_eq!(unknown.code, Code::InvalidState, "{unknown:?}");
        service.cancel(&alice(), &accepted.run_id).await.unwrap();
    }
}
