//! A started run's life in the gateway: its handle attached, its events
//! pumped to the feed, its end recorded and the runs waiting behind it
//! started.

use super::*;

impl Service {
    /// Starts a run the registry let go.
    pub(super) fn launch(&self, launch: Launch) {
        let Launch { run_id, start } = launch;
        if self.on_workers() {
            // A worker takes it from the store; this gateway follows it.
            drop(start);
            self.follow(&run_id, loom_core::LiveState::default());
            return;
        }
        // A root span: a run launched when another ends is not part of it.
        // Its log lines carry the ids of the run's trace and span.
        let span = tracing::info_span!(
            parent: None,
            "run",
            run_id = %run_id,
            trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty
        );
        let trace_parent = match &start {
            Start::New(_, request) => request.trace_parent,
            Start::Resume(resuming) => resuming.trace_parent(),
        };
        loom_telemetry::record_ids(&span, &run_id, trace_parent.as_ref());
        match start {
            Start::New(agent, request) => {
                let handle = {
                    let _entered = span.enter();
                    agent.run(*request)
                };
                self.attach(run_id, handle, span);
            }
            Start::Resume(resuming) => {
                let service = self.clone();
                // Tracked with the pumps: a shutdown waits for it too.
                self.inner.pumps.spawn(async move {
                    match resuming.start().instrument(span.clone()).await {
                        Ok(handle) => {
                            tracing::info!(parent: &span, "resuming the run");
                            service.attach(run_id, handle, span);
                        }
                        Err(err) => {
                            tracing::error!(parent: &span, error = %err, "could not resume the run");
                            service.not_resumed(&run_id);
                        }
                    }
                });
            }
        }
    }

    /// A run taken back could not resume: its place frees. While the
    /// gateway serves, it is tried again once its store answers (the store
    /// failing again is the likely cause).
    pub(super) fn not_resumed(&self, run_id: &str) {
        let (launches, removed) = {
            let mut registry = self.registry();
            let removed = registry.remove(run_id);
            let started = self.inner.queue.finished(run_id, !self.shutting_down());
            self.publish_gauges(&registry);
            (registry.starting(started), removed)
        };
        self.inner.feed.close(run_id);
        for launch in launches {
            self.launch(launch);
        }
        if let Some(run) = removed.filter(|_| !self.shutting_down()) {
            self.take_back_when_stored(run_id.to_string(), run.principal);
        }
    }

    /// Follows a started run: its controls join the registry, and its
    /// events go to the feed until it ends.
    pub(super) fn attach(&self, run_id: String, handle: RunHandle, span: tracing::Span) {
        let controller: Arc<dyn RunControl> = Arc::new(handle.controller());
        {
            let mut registry = self.registry();
            if let Some(run) = registry.runs.get_mut(&run_id) {
                if run.cancel_requested {
                    let _ = controller.send(Control::Cancel {
                        reason: "cancelled by the client".into(),
                    });
                } else if self.shutting_down() {
                    // Started while the gateway closes (a resume that was
                    // still loading): it checkpoints and waits for the next start.
                    let _ = controller.send(Control::Interrupt {
                        reason: "the server is shutting down".into(),
                    });
                }
                run.controller = Some(controller);
            }
        }
        tracing::info!(parent: &span, "run started");
        let service = self.clone();
        self.inner.pumps.spawn(
            async move {
                service.pump(run_id, handle).await;
            }
            .instrument(span),
        );
    }

    /// Passes a run's events (its sub-agents' included) to the feed, and
    /// counts its asks for the gauge; the run's state is the run's own.
    pub(super) async fn pump(&self, run_id: String, mut handle: RunHandle) {
        let mut model_started = None;
        let state = handle.controller().watch_state();
        let mut asks_counted = state.borrow().pending_asks.len();
        {
            // Asks shown before this pump started count from now.
            let mut registry = self.registry();
            registry.count_asks(&run_id, asks_counted);
            self.publish_gauges(&registry);
        }
        while let Some(event) = handle.next_event().await {
            crate::metrics::observe(&event, &mut model_started);
            let event = Arc::new(event);
            if *event.run_id == *run_id && matches!(event.kind, EventKind::LifecycleStart { .. }) {
                if let Some(run) = self.registry().runs.get_mut(&run_id) {
                    run.began(&event);
                }
            }
            if *event.run_id == *run_id {
                self.inner.feed.publish(event);
            } else {
                self.on_sub_agent_event(&run_id, event);
            }
            let asks = state.borrow().pending_asks.len();
            if asks != asks_counted {
                asks_counted = asks;
                let mut registry = self.registry();
                registry.count_asks(&run_id, asks);
                self.publish_gauges(&registry);
            }
        }
        let last_seq = state.borrow().last_seq;
        let outcome = handle.outcome().await;
        self.on_end(&run_id, outcome, last_seq);
    }

    /// An event of a sub-agent, from its root run's stream: it gets a feed
    /// of its own (joined under its parent's, so the root's subscribers see
    /// it live); its asks are in its root's state, for the root to answer.
    pub(super) fn on_sub_agent_event(&self, root: &str, event: Arc<Event>) {
        let child = event.run_id.to_string();
        if matches!(event.kind, EventKind::LifecycleStart { .. }) {
            let parent = event.parent_run_id.as_deref().unwrap_or(root);
            self.inner.feed.open_under(&child, parent, event.seq.saturating_sub(1));
            self.registry().sub_agents.insert(child.clone(), root.to_string());
        }
        let ended = matches!(event.kind, EventKind::LifecycleEnd { .. });
        self.inner.feed.publish(event);
        if ended {
            self.inner.feed.close(&child);
            self.registry().sub_agents.remove(&child);
        }
    }

    /// A run stopped, its last event `last_seq`: it leaves the registry,
    /// the queue moves on.
    pub(super) fn on_end(&self, run_id: &str, outcome: RunOutcome, last_seq: u64) {
        let (run, launches) = {
            let mut registry = self.registry();
            let Some(run) = registry.remove(run_id) else { return };
            if self.inner.store.is_none() && outcome.status != RunStatus::Interrupted {
                let mut view = run.view(None);
                view.status = outcome.status;
                view.metrics = outcome.metrics.clone();
                view.content.clone_from(&outcome.content);
                view.pending_asks.clear();
                view.last_seq = last_seq;
                view.ended_ms = Some(now_ms());
                registry.keep_finished(run.principal.clone(), view, self.inner.config.keep_finished_runs);
                let history = loom_core::history::without_system_prompt(outcome.messages);
                if !history.is_empty() {
                    let key = history_key(&run.principal, &run.session_id);
                    registry.remember_history(key, history, self.inner.config.keep_finished_runs);
                }
            }
            let start_more = !self.inner.shutting_down.load(Ordering::SeqCst);
            let started = self.inner.queue.finished(run_id, start_more);
            let launches = registry.starting(started);
            self.publish_gauges(&registry);
            (run, launches)
        };
        metrics::counter!("loom_runs_finished_total", "status" => outcome.status.as_str()).increment(1);
        tracing::info!(run_id, status = outcome.status.as_str(), seq = last_seq, "run ended");
        // Sub-agents an interrupt left open end with their root's stream.
        let orphans: Vec<String> = {
            let mut registry = self.registry();
            let ids: Vec<String> = registry
                .sub_agents
                .iter()
                .filter(|(_, root)| root.as_str() == run_id)
                .map(|(child, _)| child.clone())
                .collect();
            for id in &ids {
                registry.sub_agents.remove(id);
            }
            ids
        };
        for child in orphans {
            self.inner.feed.close(&child);
        }
        self.inner.feed.close(run_id);
        run.done.send_replace(Some((last_seq, outcome.status)));
        for launch in launches {
            self.launch(launch);
        }
        // Interrupted while this gateway serves: its store failed under it.
        if outcome.status == RunStatus::Interrupted && !self.shutting_down() {
            self.take_back_when_stored(run_id.to_string(), run.principal);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{alice, service, start};
    use super::*;

    #[tokio::test]
    async fn a_started_runs_events_reach_a_subscriber_and_its_end_is_recorded() {
        let service = service(0);
        let accepted = service.start(&alice(), start("hello")).await.unwrap();
        let mut subscription = service.subscribe(&alice(), &accepted.run_id, 0).await.unwrap();
        let mut seqs = Vec::new();
        let mut last = None;
        loop {
            match tokio::time::timeout(Duration::from_secs(10), subscription.next()).await {
                Ok(Next::Event(event)) => {
                    seqs.push(event.seq);
                    last = Some(event.kind.name());
                }
                Ok(Next::End) => break,
                Ok(Next::Lagged) | Err(_) => panic!("the run's events did not all come: {seqs:?}"),
            }
        }
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "every seq, in order");
        assert_eq!(last, Some("lifecycle.end"));
        let view = service.get(&alice(), &accepted.run_id).await.unwrap();
        assert_eq!((view.status, view.content.as_deref()), (RunStatus::Done, Some("done")));
        assert_eq!(view.last_seq, *seqs.last().unwrap_or(&0));
    }
}
