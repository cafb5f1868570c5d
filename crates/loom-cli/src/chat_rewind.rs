//! `/undo` and `/rewind` in `loom chat` (docs/rewind.md): the session's
//! tasks still in its conversation, each with the steps it recorded and
//! the files each step changed; `/undo` takes the last task back to before
//! its prompt, `/rewind` to a point the person picks. Both rewind files and
//! conversation; the chat goes on from there.

use loom::rewind::{RewindError, RewindRequest};
use loom::{Agent, EventKind, RunRecord, Store, StoreError};

use crate::lines::Lines;

/// A point the chat can go back to: a step of one of its tasks.
struct Point {
    run_id: String,
    prompt: String,
    step: u32,
    /// What the step changed (empty for step 0, which is before the task).
    files: Vec<String>,
}

/// `/undo`: the last task of the session undone, files and conversation.
/// True when something was rewound.
pub(crate) async fn undo(agent: &Agent, session_id: &str) -> bool {
    let Some(store) = agent.store() else {
        say!("loom: /undo needs a store; runs are not recorded with store = \"none\"");
        return false;
    };
    let tasks = match tasks_in_conversation(store.as_ref(), session_id).await {
        Ok(tasks) => tasks,
        Err(err) => {
            say!("loom: cannot read the session: {err}");
            return false;
        }
    };
    let Some(last) = tasks.last() else {
        say!("loom: nothing to undo: the conversation has no task");
        return false;
    };
    go_back(agent, &last.run_id, 0, &last.prompt).await
}

/// `/rewind`: the points listed, the person's pick rewound to. True when
/// something was rewound.
pub(crate) async fn rewind(agent: &Agent, session_id: &str, lines: &mut Lines) -> bool {
    let Some(store) = agent.store() else {
        say!("loom: /rewind needs a store; runs are not recorded with store = \"none\"");
        return false;
    };
    let points = match points(agent, store.as_ref(), session_id).await {
        Ok(points) => points,
        Err(err) => {
            say!("loom: cannot read the session: {err}");
            return false;
        }
    };
    if points.is_empty() {
        say!("loom: nothing to rewind to: the conversation has no task");
        return false;
    }
    say!("Go back to which point? (files and conversation; Enter keeps everything as it is)");
    for (number, point) in points.iter().enumerate() {
        let task = crate::text::clip(&point.prompt, 60);
        if point.step == 0 {
            say!("  {:>2}) before «{task}»", number + 1);
        } else {
            let files = if point.files.is_empty() {
                "no file changed".to_string()
            } else {
                crate::text::shown(&crate::text::clip(&point.files.join(", "), 80))
            };
            say!("  {:>2}) «{task}» after step {}: {files}", number + 1, point.step);
        }
    }
    crate::lines::prompt();
    let Some(line) = lines.recv().await else {
        return false;
    };
    let chosen = line.trim();
    if chosen.is_empty() {
        say!("loom: nothing rewound");
        return false;
    }
    let picked = chosen
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| points.get(i));
    match picked {
        Some(point) => go_back(agent, &point.run_id, point.step, &point.prompt).await,
        None => {
            say!("loom: {chosen} is not one of the points; nothing rewound");
            false
        }
    }
}

/// Rewinds `run_id` to `step`, saying what it did or why not.
async fn go_back(agent: &Agent, run_id: &str, step: u32, prompt: &str) -> bool {
    let Some(store) = agent.store() else { return false };
    let request = RewindRequest {
        run_id: run_id.to_string(),
        step,
        files: agent.snapshots().is_some(),
        conversation: true,
        dry_run: false,
        force: false,
    };
    let snapshots = agent.snapshots().map(|snapshots| snapshots.as_ref());
    match loom::rewind::rewind(store.as_ref(), snapshots, &request).await {
        Ok(report) => {
            let task = crate::text::clip(prompt, 60);
            let point = if step == 0 {
                format!("before «{task}»")
            } else {
                format!("«{task}» after step {step}")
            };
            let mut changes = Vec::new();
            if !report.plan.write.is_empty() {
                changes.push(format!(
                    "restored {}",
                    crate::text::shown(&report.plan.write.join(", "))
                ));
            }
            if !report.plan.remove.is_empty() {
                changes.push(format!(
                    "removed {}",
                    crate::text::shown(&report.plan.remove.join(", "))
                ));
            }
            if changes.is_empty() {
                say!("loom: back to {point} (no file changed)");
            } else {
                say!("loom: back to {point}; {}", changes.join("; "));
            }
            true
        }
        Err(RewindError::ChangedOutside { files }) => {
            say!(
                "loom: not rewound: {} changed outside Loom since it last recorded them (`loom runs rewind {run_id} --step {step} --force` overrides)",
                files.join(", ")
            );
            false
        }
        Err(err) => {
            say!("loom: not rewound: {err}");
            false
        }
    }
}

/// The points of the session's tasks still in its conversation, oldest
/// first: step 0 (before the task) and each step whose snapshot was
/// recorded after it.
async fn points(agent: &Agent, store: &dyn Store, session_id: &str) -> Result<Vec<Point>, StoreError> {
    let mut points = Vec::new();
    for task in tasks_in_conversation(store, session_id).await? {
        let steps = match agent.snapshots() {
            Some(snapshots) => snapshots.steps(&task.run_id).await.unwrap_or_default(),
            None => Vec::new(),
        };
        let kept = store
            .load_run(&task.run_id)
            .await?
            .state
            .map(|state| state.steps())
            .unwrap_or(0);
        points.push(Point {
            run_id: task.run_id.clone(),
            prompt: task.prompt.clone(),
            step: 0,
            files: Vec::new(),
        });
        for step in steps.into_iter().filter(|step| (1..=kept).contains(step)) {
            let files = match agent.snapshots() {
                Some(snapshots) => snapshots
                    .step_files(&task.run_id, step)
                    .await
                    .map(|files| files.changed.into_iter().chain(files.removed).collect())
                    .unwrap_or_default(),
                None => Vec::new(),
            };
            points.push(Point {
                run_id: task.run_id.clone(),
                prompt: task.prompt.clone(),
                step,
                files,
            });
        }
    }
    Ok(points)
}

/// The session's tasks whose conversation the session still holds, oldest
/// first. A rewind's continuation (a run that did nothing and came from a
/// step of another) cuts the tasks after that step's task off — and that
/// task itself when it went back to before its prompt.
async fn tasks_in_conversation(store: &dyn Store, session_id: &str) -> Result<Vec<RunRecord>, StoreError> {
    let runs = store.session_runs(session_id).await?;
    let mut kept: Vec<RunRecord> = Vec::new();
    for run in runs {
        if run.metrics.iterations > 0 && run.parent.is_none() {
            kept.push(run);
            continue;
        }
        if let Some(link) = forked_from(store, &run.run_id).await? {
            if let Some(at) = kept.iter().position(|task| task.run_id == link.run_id) {
                kept.truncate(if link.step == 0 { at } else { at + 1 });
            }
        }
    }
    Ok(kept)
}

/// Where a run came from (its `lifecycle.start`'s `forkedFrom`).
async fn forked_from(store: &dyn Store, run_id: &str) -> Result<Option<loom::ForkLink>, StoreError> {
    let first = store.events_page(run_id, 0, 1).await?;
    Ok(first.into_iter().find_map(|event| match event.kind {
        EventKind::LifecycleStart { forked_from, .. } => forked_from,
        _ => None,
    }))
}
