//! A started run's life in the gateway: its handle attached, its events
//! pumped to the feed (the registry kept up to date on the way), its end
//! recorded and the runs waiting behind it started.

use super::*;

impl Service {
    /// Starts a run the registry let go.
    pub(super) fn launch(&self, launch: Launch) {
        let Launch { run_id, agent, start } = launch;
        let span = tracing::info_span!("run", run_id = %run_id);
        match start {
            Start::New(request) => {
                let handle = {
                    let _entered = span.enter();
                    agent.run(request)
                };
                self.attach(run_id, handle, span);
            }
            Start::Resume => {
                let service = self.clone();
                // Tracked with the pumps: a shutdown waits for it too.
                self.inner.pumps.spawn(async move {
                    match agent.resume(&run_id).instrument(span.clone()).await {
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

    /// A run taken back after a restart could not resume: its place frees.
    pub(super) fn not_resumed(&self, run_id: &str) {
        let launches = {
            let mut registry = self.registry();
            registry.remove(run_id);
            let started = self.inner.queue.finished(run_id, !self.shutting_down());
            self.publish_gauges(&registry);
            registry.starting(started)
        };
        self.inner.feed.close(run_id);
        for launch in launches {
            self.launch(launch);
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
                    controller.cancel("cancelled by the client");
                } else if self.shutting_down() {
                    // Started while the gateway closes (a resume that was
                    // still loading): it checkpoints and waits for the next start.
                    controller.interrupt("the server is shutting down");
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

    pub(super) async fn pump(&self, run_id: String, mut handle: RunHandle) {
        let mut model_started = None;
        while let Some(event) = handle.next_event().await {
            crate::metrics::observe(&event, &mut model_started);
            let event = Arc::new(event);
            if *event.run_id == *run_id {
                self.on_event(&event);
                self.inner.feed.publish(event);
            } else {
                self.on_sub_agent_event(&run_id, event);
            }
        }
        let outcome = handle.outcome().await;
        self.on_end(&run_id, outcome);
    }

    /// An event of a sub-agent, from its root run's stream: it gets a feed
    /// of its own (joined under its parent's, so the root's subscribers see
    /// it live), and its asks are the root's to answer.
    pub(super) fn on_sub_agent_event(&self, root: &str, event: Arc<Event>) {
        let child = event.run_id.to_string();
        if matches!(event.kind, EventKind::LifecycleStart { .. }) {
            let parent = event.parent_run_id.as_deref().unwrap_or(root);
            self.inner.feed.open_under(&child, parent, event.seq.saturating_sub(1));
            self.registry().sub_agents.insert(child.clone(), root.to_string());
        }
        if let EventKind::PermissionRequest { .. } | EventKind::PermissionResolved { .. } = &event.kind {
            let mut registry = self.registry();
            if let Some(run) = registry.runs.get_mut(root) {
                let before = run.pending.len();
                match pending_ask(&event) {
                    Some(ask) => {
                        run.pending.retain(|known| known.request_id != ask.request_id);
                        run.pending.push(ask);
                        run.status = RunStatus::WaitingPermission;
                    }
                    None => {
                        if let EventKind::PermissionResolved { request_id, .. } = &event.kind {
                            run.pending.retain(|known| known.request_id != *request_id);
                            if run.pending.is_empty() {
                                run.status = RunStatus::Running;
                            }
                        }
                    }
                }
                registry.pending_changed(root, before);
                self.publish_gauges(&registry);
            }
        }
        let ended = matches!(event.kind, EventKind::LifecycleEnd { .. });
        self.inner.feed.publish(event);
        if ended {
            self.inner.feed.close(&child);
            self.registry().sub_agents.remove(&child);
        }
    }

    /// What an event changes in the registry.
    pub(super) fn on_event(&self, event: &Event) {
        let mut registry = self.registry();
        let Some(run) = registry.runs.get_mut(&*event.run_id) else {
            return;
        };
        run.last_seq = event.seq;
        let asks_before = run.pending.len();
        let mut asks_changed = false;
        match &event.kind {
            EventKind::IterationStart { iteration } => run.metrics.iterations = iteration + 1,
            EventKind::LlmFinish { usage: Some(usage), .. } => {
                run.metrics.input_tokens += usage.input_tokens;
                run.metrics.output_tokens += usage.output_tokens;
                run.metrics.llm_calls += 1;
            }
            EventKind::PermissionRequest { request_id, .. } => {
                run.pending.retain(|ask| ask.request_id != *request_id);
                run.pending.extend(pending_ask(event));
                run.status = RunStatus::WaitingPermission;
                if let (Some(decision), Some(controller)) = (run.early.remove(request_id), &run.controller) {
                    // Answered before the restarted run asked again.
                    if let Err(err) = controller.respond_permission(request_id, decision) {
                        tracing::warn!(request_id, error = %err, "an early answer could not be applied");
                    }
                }
                asks_changed = true;
            }
            EventKind::PermissionResolved { request_id, .. } => {
                run.pending.retain(|ask| ask.request_id != *request_id);
                if run.pending.is_empty() {
                    run.status = RunStatus::Running;
                }
                asks_changed = true;
            }
            EventKind::ToolCallsComplete { .. } if run.seeded => {
                // The batch that asked before the restart is settled.
                run.seeded = false;
                run.pending.clear();
                run.early.clear();
                run.status = RunStatus::Running;
                asks_changed = true;
            }
            EventKind::AgentFinish { content, metrics, .. } => {
                run.content = Some(content.clone());
                run.metrics = metrics.clone();
            }
            EventKind::LifecycleEnd {
                status,
                content,
                metrics,
            } => {
                run.status = *status;
                run.content.clone_from(content);
                run.metrics = metrics.clone();
            }
            _ => {}
        }
        if asks_changed {
            registry.pending_changed(&event.run_id, asks_before);
            self.publish_gauges(&registry);
        }
    }

    /// A run stopped: it leaves the registry, the queue moves on.
    pub(super) fn on_end(&self, run_id: &str, outcome: RunOutcome) {
        let (run, launches) = {
            let mut registry = self.registry();
            let Some(mut run) = registry.remove(run_id) else { return };
            run.status = outcome.status;
            run.metrics = outcome.metrics.clone();
            run.content.clone_from(&outcome.content);
            if self.inner.store.is_none() && outcome.status != RunStatus::Interrupted {
                let mut view = run.view(None);
                view.pending_asks.clear();
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
        tracing::info!(
            run_id,
            status = outcome.status.as_str(),
            seq = run.last_seq,
            "run ended"
        );
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
        run.done.send_replace(Some((run.last_seq, outcome.status)));
        for launch in launches {
            self.launch(launch);
        }
    }
}

/// The ask a `permission.request` event makes (of its own run, which may
/// be a sub-agent of the run that answers it).
pub(super) fn pending_ask(event: &Event) -> Option<PendingAsk> {
    let EventKind::PermissionRequest {
        request_id,
        tool,
        args,
        rule,
    } = &event.kind
    else {
        return None;
    };
    Some(PendingAsk {
        run_id: event.run_id.to_string(),
        request_id: request_id.clone(),
        tool: tool.clone(),
        args: args.clone(),
        rule: rule.clone(),
        seq: event.seq,
    })
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
