//! Looking at runs: one, a page, the asks waiting.

use super::*;
use crate::auth::Role;

impl Service {
    /// `permission.list`.
    pub async fn pending(&self, principal: &Principal, run_id: Option<&str>) -> Result<Vec<PendingAsk>, ApiError> {
        {
            let registry = self.registry();
            match run_id {
                None => {
                    let mut asks: Vec<PendingAsk> = registry
                        .runs
                        .values()
                        .filter(|run| principal.reaches(&run.principal))
                        .flat_map(|run| run.state().pending_asks)
                        .collect();
                    asks.sort_by(|a, b| (&a.run_id, a.seq).cmp(&(&b.run_id, b.seq)));
                    return Ok(asks);
                }
                Some(id) => {
                    if let Some(run) = registry.run(principal, id) {
                        return Ok(run.state().pending_asks);
                    }
                    let root = registry
                        .sub_agents
                        .get(id)
                        .and_then(|root| registry.run(principal, root));
                    if let Some(run) = root {
                        let mut asks = run.state().pending_asks;
                        asks.retain(|ask| ask.run_id == id);
                        return Ok(asks);
                    }
                }
            }
        }
        // Ended (or unknown: NOT_FOUND).
        self.get(principal, run_id.unwrap_or_default()).await?;
        Ok(Vec::new())
    }

    /// `run.get`.
    pub async fn get(&self, principal: &Principal, run_id: &str) -> Result<RunView, ApiError> {
        let live = self
            .registry()
            .run(principal, run_id)
            .map(|run| run.view(self.inner.queue.position(run_id)));
        if let Some(mut view) = live {
            if self.on_workers() && view.status == RunStatus::Queued {
                view.queue_position = self.cluster_position(run_id).await;
            }
            return Ok(view);
        }
        {
            let registry = self.registry();
            if let Some((owner, view)) = registry.finished.get(run_id) {
                return if principal.reaches(owner) {
                    Ok(view.clone())
                } else {
                    Err(ApiError::no_run(run_id))
                };
            }
        }
        let Some(store) = &self.inner.store else {
            return Err(ApiError::no_run(run_id));
        };
        let snapshot = match store.load_run(run_id).await {
            Ok(snapshot) => snapshot,
            Err(StoreError::NotFound(_)) => return Err(ApiError::no_run(run_id)),
            Err(err) => return Err(store_error(err)),
        };
        if !principal.reaches_owner(snapshot.run.principal.as_deref()) {
            return Err(ApiError::no_run(run_id));
        }
        Ok(stored_view(snapshot.run, snapshot.last_seq))
    }

    /// `run.list`: this token's runs (an admin's: every token's), newest
    /// first.
    pub async fn list(&self, principal: &Principal, params: ListParams) -> Result<RunPage, ApiError> {
        let limit = params.limit.unwrap_or(50).clamp(1, 500);
        let before = match &params.cursor {
            Some(cursor) => Some(parse_cursor(cursor)?),
            None => None,
        };
        let admin = principal.role() == Role::Admin;
        let query = RunQuery {
            principal: (!admin).then(|| principal.name().to_string()),
            owned: admin,
            status: params.status,
            session_id: params.session_id.clone(),
            before: before.clone(),
            limit: limit + 1,
        };
        let mut runs: Vec<RunView> = Vec::new();
        let mut live_ids = Vec::new();
        {
            let registry = self.registry();
            for run in registry.runs.values().filter(|run| principal.reaches(&run.principal)) {
                live_ids.push(run.run_id.clone());
                let view = run.view(self.inner.queue.position(&run.run_id));
                if matches_view(&query, &view) {
                    runs.push(view);
                }
            }
            if self.inner.store.is_none() {
                for (owner, view) in registry.finished.values() {
                    if principal.reaches(owner) && matches_view(&query, view) {
                        runs.push(view.clone());
                    }
                }
            }
        }
        if let Some(store) = &self.inner.store {
            // Live runs' stored status may lag: the registry's view wins.
            let stored: Vec<RunRecord> = store
                .query_runs(&query)
                .await
                .map_err(store_error)?
                .into_iter()
                .filter(|record| !live_ids.contains(&record.run_id))
                .collect();
            let ids: Vec<String> = stored.iter().map(|record| record.run_id.clone()).collect();
            let last_seqs = store.last_seqs(&ids).await.map_err(store_error)?;
            runs.extend(
                stored
                    .into_iter()
                    .zip(last_seqs)
                    .map(|(record, seq)| stored_view(record, seq)),
            );
        }
        runs.sort_by(|a, b| (b.listed_ms(), &b.run_id).cmp(&(a.listed_ms(), &a.run_id)));
        runs.dedup_by(|a, b| a.run_id == b.run_id);
        let next_cursor = (runs.len() > limit).then(|| {
            let last = &runs[limit - 1];
            format!("{}:{}", last.listed_ms(), last.run_id)
        });
        runs.truncate(limit);
        Ok(RunPage { runs, next_cursor })
    }
}

pub(super) fn stored_view(record: RunRecord, last_seq: u64) -> RunView {
    RunView {
        run_id: record.run_id,
        session_id: record.session_id,
        status: record.status,
        prompt: record.prompt,
        model: record.model,
        // Stored runs order by `started_ms`, the acceptance time while queued.
        started_ms: (record.status != RunStatus::Queued).then_some(record.started_ms),
        accepted_ms: record
            .accepted_ms
            .or((record.status == RunStatus::Queued).then_some(record.started_ms)),
        ended_ms: record.ended_ms,
        content: record.content,
        metrics: record.metrics,
        pending_asks: Vec::new(),
        queue_position: None,
        last_seq,
        parent_run_id: record.parent.map(|parent| parent.run_id),
    }
}

pub(super) fn matches_view(query: &RunQuery, view: &RunView) -> bool {
    query.status.is_none_or(|status| view.status == status)
        && query
            .session_id
            .as_deref()
            .is_none_or(|session| view.session_id == session)
        && query
            .before
            .as_ref()
            .is_none_or(|(ms, id)| (view.listed_ms(), view.run_id.as_str()) < (*ms, id.as_str()))
}

pub(super) fn parse_cursor(cursor: &str) -> Result<(u64, String), ApiError> {
    cursor
        .split_once(':')
        .and_then(|(ms, id)| Some((ms.parse().ok()?, id.to_string())))
        .ok_or_else(|| ApiError::new(Code::InvalidParams, "cursor: pass the nextCursor of the page before"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(run_id: &str, started_ms: u64, status: RunStatus) -> RunView {
        let record = RunRecord::new(run_id, "s1", "hi", "scripted:x", status, started_ms);
        stored_view(record, 7)
    }

    #[test]
    fn a_cursor_is_the_start_and_id_of_the_last_run_shown() {
        assert_eq!(parse_cursor("1700:run-a").unwrap(), (1700, "run-a".to_string()));
        for bad in ["", "1700", "soon:run-a"] {
            assert_eq!(parse_cursor(bad).unwrap_err().code, Code::InvalidParams, "{bad}");
        }
    }

    #[test]
    fn a_view_matches_the_filters_and_comes_before_the_cursor() {
        let done = view("run-b", 2000, RunStatus::Done);
        let all = RunQuery::default();
        assert!(matches_view(&all, &done));
        let running = RunQuery {
            status: Some(RunStatus::Running),
            ..RunQuery::default()
        };
        assert!(!matches_view(&running, &done));
        let other_session = RunQuery {
            session_id: Some("s2".into()),
            ..RunQuery::default()
        };
        assert!(!matches_view(&other_session, &done));
        // Newest first: a page after (2000, run-b) holds older runs only.
        let after = |ms: u64, id: &str| RunQuery {
            before: Some((ms, id.to_string())),
            ..RunQuery::default()
        };
        assert!(!matches_view(&after(2000, "run-b"), &done));
        assert!(matches_view(&after(2000, "run-c"), &done));
        assert!(matches_view(&after(2001, "run-a"), &done));
        assert_eq!(done.last_seq, 7);
    }
}
