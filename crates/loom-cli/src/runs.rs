//! `loom runs list | show | events | resume | cancel`: the runs recorded in the store.

use std::process::ExitCode;

use anyhow::anyhow;
use loom::stores::SqliteStore;
use loom::{RunRecord, Store, StoreError};

use crate::cli::{RunsArgs, RunsCommand};
use crate::exit::Failure;
use crate::recorded_runs::RecordedIn;
use crate::text::clip;

pub(crate) async fn runs(args: Box<RunsArgs>) -> Result<ExitCode, Failure> {
    if !matches!(args.command, RunsCommand::Resume { .. } | RunsCommand::Fork { .. }) {
        // These only print: a closed stdout (`loom runs list | head -1`)
        // ends them quietly, as it ends any Unix tool, instead of a panic.
        restore_sigpipe();
    }
    let mut leases: Option<Box<dyn loom::RunLeases>> = None;
    let (store, recorded_in): (Box<dyn Store>, RecordedIn) = match &args.redis {
        Some(url) => {
            let redis = crate::store::open_redis(url).await.map_err(Failure::Usage)?;
            leases = Some(Box::new(redis.clone()));
            (Box::new(redis), RecordedIn::Redis(url.clone()))
        }
        None => {
            let path = sqlite_path(args.db.as_deref(), args.workspace.as_deref()).await?;
            (Box::new(open_sqlite(&path).await?), RecordedIn::Sqlite(path))
        }
    };
    // A run the cluster's workers execute is theirs to resume, and hears
    // a cancel through them.
    let on_workers = match (&leases, &args.command) {
        (Some(leases), RunsCommand::Resume { id, .. } | RunsCommand::Cancel { id }) => leases
            .on_workers(id)
            .await
            .map_err(|err| Failure::Runtime(anyhow!("{err}")))?,
        _ => false,
    };
    let store = store.as_ref();
    let usage_if_unknown = |err: StoreError| match err {
        StoreError::NotFound(_) => Failure::Usage(anyhow!("{err}")),
        other => Failure::Runtime(anyhow!("{other}")),
    };
    // Runs left RUNNING by a process that died are shown (and resumable)
    // as INTERRUPTED — but not those the cluster's workers execute: their
    // leases hand them on, and a run parked for a person outlives its worker.
    let mut on_workers_ids = std::collections::HashSet::new();
    if let Some(leases) = &leases {
        for run in store
            .active_runs()
            .await
            .map_err(|err| Failure::Runtime(anyhow!("{err}")))?
        {
            if leases
                .on_workers(&run.run_id)
                .await
                .map_err(|err| Failure::Runtime(anyhow!("{err}")))?
            {
                on_workers_ids.insert(run.run_id);
            }
        }
    }
    loom::recovery::recover_interrupted_runs_except(store, |run| on_workers_ids.contains(&run.run_id))
        .await
        .map_err(|err| Failure::Runtime(anyhow!("{err}")))?;
    match &args.command {
        RunsCommand::Resume { id, .. } if on_workers => {
            return Err(Failure::Usage(anyhow!(
                "run {id} is executed by the cluster's `loom worker` processes: they resume it themselves (docs/cluster.md)"
            )))
        }
        RunsCommand::Cancel { id } if on_workers => {
            if let Some(leases) = &leases {
                return crate::recorded_runs::cancel_on_workers(store, leases.as_ref(), id, args.json).await;
            }
        }
        _ => {}
    }
    match args.command {
        RunsCommand::Resume { id, agent } => {
            return crate::recorded_runs::resume(store, recorded_in, args.workspace, &id, &agent, args.json).await
        }
        RunsCommand::Cancel { id } => return crate::recorded_runs::cancel(store, &id, args.json).await,
        RunsCommand::Rewind {
            id,
            step,
            files,
            conversation,
            both: _,
            dry_run,
            force,
        } => {
            let request = loom::rewind::RewindRequest {
                run_id: id,
                step,
                files: !conversation,
                conversation: !files,
                dry_run,
                force,
            };
            return crate::rewind::rewind(store, &recorded_in, request, files, args.json).await;
        }
        RunsCommand::Fork {
            id,
            step,
            prompt,
            into,
            force,
            agent,
        } => {
            let request = loom::rewind::ForkRequest {
                run_id: id,
                step,
                into,
                force,
                files: true,
            };
            return crate::rewind::fork(store, recorded_in, request, prompt, &agent, args.json).await;
        }
        RunsCommand::List { limit, session } => {
            let runs = match session {
                Some(session) => {
                    let mut runs = store.session_runs(&session).await.map_err(usage_if_unknown)?;
                    runs.reverse();
                    runs.truncate(limit);
                    runs
                }
                None => store.list_runs(limit).await.map_err(usage_if_unknown)?,
            };
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string(&runs).map_err(|e| Failure::Runtime(e.into()))?
                );
            } else {
                print!("{}", table(&runs));
            }
        }
        RunsCommand::Show { id, tree: turns } => {
            let snapshot = store.load_run(&id).await.map_err(usage_if_unknown)?;
            let tree = run_tree(store, &id).await?;
            if args.json {
                let value = serde_json::json!({
                    "run": snapshot.run,
                    "children": tree.iter().map(|(depth, run)| serde_json::json!({"depth": depth, "run": run})).collect::<Vec<_>>(),
                    "messages": snapshot.messages,
                    "nextTurn": snapshot.next_turn().map(|t| t.turn_counter()),
                    "journal": snapshot.journal,
                    "suggestions": snapshot.run.metrics.suggestions(),
                });
                println!("{value}");
            } else {
                print!(
                    "{}",
                    show(&snapshot.run, snapshot.messages.len(), snapshot.journal.len())
                );
                if !tree.is_empty() {
                    print!("{}", tree_lines(&tree));
                }
                if turns {
                    let text = crate::turn_tree::render(store, &id)
                        .await
                        .map_err(|err| Failure::Runtime(anyhow!("{err}")))?;
                    print!("\nturns\n{text}");
                }
            }
        }
        RunsCommand::Events { id, after } => {
            for event in store.events(&id, after).await.map_err(usage_if_unknown)? {
                println!(
                    "{}",
                    serde_json::to_string(&event).map_err(|e| Failure::Runtime(e.into()))?
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The SQLite database `loom runs` reads: `--db`, else the workspace's.
/// The database `--db` names, else the workspace's; a usage error when
/// there is none.
pub(crate) async fn sqlite_path(
    db: Option<&std::path::Path>,
    workspace: Option<&std::path::Path>,
) -> Result<std::path::PathBuf, Failure> {
    let path = match (db, workspace) {
        (Some(db), _) => db.to_path_buf(),
        (None, workspace) => {
            let workspace = workspace.map_or_else(|| std::path::PathBuf::from("."), std::path::Path::to_path_buf);
            tokio::task::spawn_blocking(move || crate::state::workspace_dir(&workspace))
                .await
                .map_err(|err| Failure::Runtime(err.into()))?
                .map_err(Failure::Usage)?
                .join("loom.db")
        }
    };
    if !path.is_file() {
        return Err(Failure::Usage(anyhow!(
            "no run database at {}: runs are recorded by `loom run` in its workspace (or, with --redis or LOOM_REDIS_URL, read from a Redis)",
            path.display()
        )));
    }
    Ok(path)
}

pub(crate) async fn open_sqlite(path: &std::path::Path) -> Result<SqliteStore, Failure> {
    let shown = path.display().to_string();
    let opened = path.to_path_buf();
    let store = tokio::task::spawn_blocking(move || SqliteStore::open(opened))
        .await
        .map_err(|err| Failure::Runtime(anyhow!("opening {shown} failed: {err}")))?
        .map_err(|err| Failure::Usage(anyhow!("{err}")))?;
    Ok(store)
}

/// The sub-agents below `run_id`, depth first, each with its depth (1 for
/// a child). Bounded: a tree deeper than any nesting limit is cut.
async fn run_tree(store: &dyn Store, run_id: &str) -> Result<Vec<(u32, RunRecord)>, Failure> {
    const DEEPEST: u32 = 16;
    let mut tree = Vec::new();
    let mut pending = vec![(1_u32, run_id.to_string())];
    while let Some((depth, parent)) = pending.pop() {
        if depth > DEEPEST {
            continue;
        }
        let children = store
            .child_runs(&parent)
            .await
            .map_err(|err| Failure::Runtime(anyhow!("{err}")))?;
        // Depth first, oldest child first: the place to insert is right
        // after the parent, in reverse so the oldest ends up first.
        let at = tree
            .iter()
            .position(|(_, run): &(u32, RunRecord)| run.run_id == parent)
            .map_or(tree.len(), |index| index + 1);
        for child in children.into_iter().rev() {
            pending.push((depth + 1, child.run_id.clone()));
            tree.insert(at, (depth, child));
        }
    }
    Ok(tree)
}

/// `runs show`'s tree of sub-agents.
fn tree_lines(tree: &[(u32, RunRecord)]) -> String {
    let mut out = String::from("\nsub-agents\n");
    for (depth, run) in tree {
        let indent = "   ".repeat(*depth as usize - 1);
        let tokens = run.metrics.input_tokens + run.metrics.output_tokens;
        out.push_str(&format!(
            "  {indent}└─ {}  {}  {} turns  {tokens} tokens  {}\n",
            run.run_id,
            run.status.as_str(),
            run.metrics.iterations,
            clip(&run.prompt, 60)
        ));
    }
    out
}

fn table(runs: &[RunRecord]) -> String {
    let mut out = format!(
        "{:<36}  {:<10}  {:>5}  {:>7}  {:<24}  {}\n",
        "RUN", "STATUS", "TURNS", "SECS", "MODEL", "PROMPT"
    );
    for run in runs {
        let secs = run
            .ended_ms
            .map(|end| end.saturating_sub(run.started_ms) as f64 / 1000.0);
        out.push_str(&format!(
            "{:<36}  {:<10}  {:>5}  {:>7}  {:<24}  {}\n",
            run.run_id,
            run.status.as_str(),
            run.metrics.iterations,
            secs.map_or_else(|| "-".to_string(), |s| format!("{s:.1}")),
            clip(&run.model, 24),
            clip(&run.prompt.replace('\n', " "), 60)
        ));
    }
    out
}

fn show(run: &RunRecord, messages: usize, journaled: usize) -> String {
    let m = &run.metrics;
    let mut out = format!(
        "run       {}\nsession   {}\nstatus    {}\nmodel     {}\nowner     {}\nworkspace {}\nprompt    {}\n",
        run.run_id,
        run.session_id,
        run.status.as_str(),
        run.model,
        run.owner,
        run.workspace.as_deref().unwrap_or("-"),
        run.prompt
    );
    out.push_str(&format!(
        "turns     {}   model calls {}   tokens {} in / {} out   tool calls {} ({} failed)\nmessages  {messages} stored, {journaled} journaled tool calls\n",
        m.iterations, m.llm_calls, m.input_tokens, m.output_tokens, m.tool_calls, m.tool_failures
    ));
    if let Some(cost) = m.cost_usd {
        out.push_str(&format!("cost      ${cost:.4}\n"));
    }
    for (name, stats) in &m.tools {
        out.push_str(&format!(
            "tool      {name}: {} calls, {:.0}% ok, avg {:.0} ms\n",
            stats.calls,
            stats.success_rate * 100.0,
            stats.avg_ms
        ));
    }
    for suggestion in m.suggestions() {
        out.push_str(&format!("suggest   {suggestion}\n"));
    }
    if run.status == loom::RunStatus::Interrupted {
        out.push_str(&format!(
            "\nIts process died; continue it with `loom runs resume {}` (or close it with `loom runs cancel {}`).\n",
            run.run_id, run.run_id
        ));
    }
    if let Some(content) = &run.content {
        out.push_str(&format!("\n{content}\n"));
    }
    out
}

#[cfg(unix)]
pub(crate) fn restore_sigpipe() {
    // SAFETY: setting a signal's disposition to its default has no memory
    // effects; Rust's runtime set SIGPIPE to ignored at start-up.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
fn restore_sigpipe() {}
