//! `loom runs rewind | fork`: back to a step of a recorded run, or a new
//! session from it (docs/rewind.md). The work is the library's
//! (`loom::rewind`); this finds the run's workspace and its snapshots,
//! prints what was done, and for a fork with a prompt runs it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::anyhow;
use loom::rewind::{ForkRequest, RewindError, RewindReport, RewindRequest};
use loom::{RestorePlan, SnapshotError, Store, StoreError, WorkspaceSnapshots};

use crate::cli::{AgentArgs, PlaceArgs};
use crate::exit::Failure;
use crate::recorded_runs::RecordedIn;
use crate::run::{build_agent, follow};

/// The snapshots of the workspace `run_id` worked in, kept beside the
/// store it is recorded in (a SQLite file's, or the cluster's Redis), and
/// that workspace. A run recorded in Redis by another machine's worker
/// worked in that machine's folder: its files are refused here.
async fn run_snapshots(
    store: &dyn Store,
    recorded_in: &RecordedIn,
    run_id: &str,
) -> Result<(Option<Arc<dyn WorkspaceSnapshots>>, Option<PathBuf>), Failure> {
    let record = store.load_run(run_id).await.map_err(usage_if_unknown)?.run;
    if let RecordedIn::Redis(_) = recorded_in {
        let machine = loom::owner::machine_of(&record.owner);
        if !record.owner.is_empty() && machine != loom::owner::this_machine() {
            return Err(Failure::Usage(anyhow!(
                "run {run_id} worked on another machine ({}): its files are there — rewind them through a gateway of the cluster (docs/rewind.md), or only the conversation here with --conversation",
                crate::text::shown(machine)
            )));
        }
    }
    let workspace = record.workspace.map(PathBuf::from).filter(|dir| dir.is_dir());
    let Some(dir) = &workspace else {
        return Ok((None, None));
    };
    // The workspace is judged by the filter its runs recorded with (kept
    // with the snapshots); loom.toml's `[snapshots]` only when none was.
    let config = crate::config::load(None).ok().and_then(|loaded| loaded.file.snapshots);
    let snapshots = crate::snapshots::open(config.as_ref(), Some(store), dir, crate::snapshots::Purpose::Rewind)
        .await
        .map_err(Failure::Runtime)?;
    Ok((snapshots.map(|s| s as Arc<dyn WorkspaceSnapshots>), workspace))
}

/// `loom runs rewind`.
/// Without snapshots (switched off) the default rewinds the conversation
/// alone; `--files` asked for them, and is refused.
pub(crate) async fn rewind(
    store: &dyn Store,
    recorded_in: &RecordedIn,
    mut request: RewindRequest,
    files_asked: bool,
    json: bool,
) -> Result<ExitCode, Failure> {
    let snapshots = match request.files {
        true => run_snapshots(store, recorded_in, &request.run_id).await?.0,
        false => None,
    };
    if snapshots.is_none() && request.files && !files_asked {
        request.files = false;
        if !json {
            say!("loom: no workspace snapshots here: only the conversation is rewound");
        }
    }
    let request = &request;
    let report = loom::rewind::rewind(store, snapshots.as_deref(), request)
        .await
        .map_err(refused)?;
    if json {
        println!("{}", report_json(&report, request.dry_run));
    } else {
        if request.files && !report.files_recorded {
            say!(
                "loom: run {} recorded no snapshots (it called no tool): its files are left as they are",
                request.run_id
            );
        }
        if report.closed {
            say!("loom: run {} was interrupted; it is closed (CANCELED), as it cannot go on past the point it went back to", request.run_id);
        }
        print_report(&request.run_id, &report, request.dry_run);
    }
    Ok(ExitCode::SUCCESS)
}

/// `loom runs fork`.
pub(crate) async fn fork(
    store: &dyn Store,
    recorded_in: RecordedIn,
    mut request: ForkRequest,
    prompt: Option<String>,
    agent_args: &AgentArgs,
    json: bool,
) -> Result<ExitCode, Failure> {
    if let Some(into) = &request.into {
        refuse_unsafe_into(into)?;
    }
    let (snapshots, workspace) = run_snapshots(store, &recorded_in, &request.run_id).await?;
    request.files = snapshots.is_some();
    if request.into.is_some() && snapshots.is_none() {
        return Err(Failure::Usage(anyhow!(
            "run {} has no workspace snapshots here, so there is nothing to copy into {}",
            request.run_id,
            request
                .into
                .as_deref()
                .map(Path::display)
                .map(|d| d.to_string())
                .unwrap_or_default()
        )));
    }
    let works_in = request.into.clone().or(workspace);
    // With a prompt the agent is made first: a fork whose run cannot start
    // (a bad model, a bad flag) changes nothing and logs nothing.
    let agent = match &prompt {
        Some(_) => {
            if let Some(into) = &request.into {
                refuse_non_empty(into)?;
                std::fs::create_dir_all(into)
                    .map_err(|err| Failure::Runtime(anyhow!("cannot create {}: {err}", into.display())))?;
            }
            let record = store.load_run(&request.run_id).await.map_err(usage_if_unknown)?.run;
            let (db, redis) = match &recorded_in {
                RecordedIn::Sqlite(db) => (Some(db.clone()), None),
                RecordedIn::Redis(url) => (None, Some(url.clone())),
            };
            let place = PlaceArgs {
                workspace: works_in.clone(),
                db,
                redis,
            };
            let agent = build_agent(agent_args, &place, Some(&record.model))
                .await
                .map_err(Failure::Usage)?;
            Some(agent)
        }
        None => None,
    };
    let fork = loom::rewind::fork(store, snapshots.as_deref(), &request)
        .await
        .map_err(refused)?;
    let (Some(prompt), Some(agent)) = (prompt, agent) else {
        fork.seed(store)
            .await
            .map_err(|err| Failure::Runtime(anyhow!("{err}")))?;
        if json {
            println!(
                "{}",
                serde_json::json!({
                    "runId": fork.run_id,
                    "sessionId": fork.session_id,
                    "forkedFrom": fork.link,
                    "workspace": works_in,
                    "write": fork.plan.write,
                    "remove": fork.plan.remove,
                })
            );
        } else {
            say_plan(false, &fork.plan);
            let place = works_in
                .map(|dir| format!(" --workspace {}", dir.display()))
                .unwrap_or_default();
            println!(
                "forked run {} at step {} into session {}: continue it with `loom chat --session {}{place}`",
                fork.link.run_id, fork.link.step, fork.session_id, fork.session_id
            );
        }
        return Ok(ExitCode::SUCCESS);
    };
    if !json {
        say_plan(false, &fork.plan);
        say!(
            "loom: forked run {} at step {}: run {} in session {}",
            fork.link.run_id,
            fork.link.step,
            fork.run_id,
            fork.session_id
        );
    }
    follow(agent.run(fork.run_request(prompt)), json, agent_args).await
}

/// A fork's copy goes only into a folder named by its real path — no
/// component of it a symbolic link, which a run could have planted in the
/// workspace to send the copy wherever it points — and never into the
/// user's configuration or Loom's state, nor into a folder that holds them
/// (the copy's files would be read as the user's own agents and
/// instructions). Checked before anything is made; the restore itself
/// then opens the folder without following a link (docs/rewind.md).
fn refuse_unsafe_into(into: &Path) -> Result<(), Failure> {
    let given = into.display().to_string();
    let absolute = std::path::absolute(into)
        .map_err(|err| Failure::Usage(anyhow!("--into {}: {err}", crate::text::shown(&given))))?;
    let mut at = PathBuf::new();
    for component in absolute.components() {
        at.push(component);
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(Failure::Usage(anyhow!(
                    "--into {}: {} is a symbolic link; a fork's copy goes only into a folder named by its real path",
                    crate::text::shown(&given),
                    crate::text::shown(&at.display().to_string())
                )))
            }
            Ok(_) => {}
            // What does not exist yet is made by the fork, as folders.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => break,
            Err(err) => {
                return Err(Failure::Runtime(anyhow!(
                    "--into {}: {}: {err}",
                    crate::text::shown(&given),
                    crate::text::shown(&at.display().to_string())
                )))
            }
        }
    }
    // No link on the way: the path as written, its `..` taken away, is
    // where the kernel goes.
    let real = without_dot_dot(&absolute);
    let home_config = std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config").join("loom"));
    let protected = [
        ("your Loom configuration", crate::config::user_config_dir()),
        ("your Loom configuration", home_config),
        ("Loom's state", crate::state::base_dir().ok()),
    ];
    for (what, dir) in protected {
        let Some(dir) = dir else {
            continue;
        };
        let dir = resolved_as_far_as_it_exists(&dir);
        if real.starts_with(&dir) || dir.starts_with(&real) {
            return Err(Failure::Usage(anyhow!(
                "--into {}: {what} is there ({}); a fork's copy never goes into it",
                crate::text::shown(&given),
                crate::text::shown(&dir.display().to_string())
            )));
        }
    }
    Ok(())
}

/// `path` (absolute) with its `.` and `..` components taken away.
fn without_dot_dot(path: &Path) -> PathBuf {
    let mut plain = PathBuf::new();
    for component in path.components() {
        match component {
            std::path::Component::ParentDir => {
                plain.pop();
            }
            std::path::Component::CurDir => {}
            other => plain.push(other),
        }
    }
    plain
}

/// `path` with the part of it that exists resolved (links followed), the
/// rest as written.
fn resolved_as_far_as_it_exists(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = without_dot_dot(&absolute);
    let mut rest = Vec::new();
    while std::fs::symlink_metadata(&existing).is_err() {
        match (existing.file_name().map(|name| name.to_os_string()), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            _ => break,
        }
    }
    let mut resolved = std::fs::canonicalize(&existing).unwrap_or(existing);
    resolved.extend(rest.iter().rev());
    resolved
}

/// A fork's copy goes into a new or empty folder (checked before one is
/// made for the fork's agent).
fn refuse_non_empty(into: &Path) -> Result<(), Failure> {
    let holds_files = std::fs::read_dir(into).is_ok_and(|mut entries| entries.next().is_some());
    if holds_files {
        return Err(refused(RewindError::IntoNotEmpty(into.to_path_buf())));
    }
    Ok(())
}

/// A refusal is the person's to act on (exit 2); a failure is not.
fn refused(err: RewindError) -> Failure {
    match err {
        RewindError::Store(err) => usage_if_unknown(err),
        RewindError::Snapshot(err @ (SnapshotError::InUse | SnapshotError::Elsewhere { .. })) => {
            Failure::Usage(anyhow!("{err}"))
        }
        RewindError::Snapshot(err) => Failure::Runtime(anyhow!("{err}")),
        err @ RewindError::NotRecorded { .. } => Failure::Runtime(anyhow!("{err}")),
        other => Failure::Usage(anyhow!("{other}")),
    }
}

fn usage_if_unknown(err: StoreError) -> Failure {
    match err {
        StoreError::NotFound(_) => Failure::Usage(anyhow!("{err}")),
        other => Failure::Runtime(anyhow!("{other}")),
    }
}

fn report_json(report: &RewindReport, dry_run: bool) -> serde_json::Value {
    serde_json::json!({
        "toStep": report.to_step,
        "dryRun": dry_run,
        "write": report.plan.write,
        "remove": report.plan.remove,
        "changedOutside": report.plan.changed_outside,
        "continuedBy": report.continued_by,
        "messages": report.messages,
        "event": report.event,
    })
}

fn print_report(run_id: &str, report: &RewindReport, dry_run: bool) {
    if dry_run {
        say_plan(true, &report.plan);
        if !report.plan.changed_outside.is_empty() {
            println!(
                "changed outside Loom (a rewind needs --force): {}",
                crate::text::shown(&report.plan.changed_outside.join(", "))
            );
        }
        println!("dry run: nothing was changed");
        return;
    }
    say_plan(false, &report.plan);
    match &report.continued_by {
        Some(continuation) => println!(
            "rewound run {run_id} to step {}: the session continues from the conversation as of that step (run {continuation})",
            report.to_step
        ),
        None => println!("rewound the files of run {run_id} to step {}", report.to_step),
    }
}

/// One line per file: `restored: PATH`, `removed: PATH` (or, dry, `would
/// restore` / `would remove`).
fn say_plan(dry_run: bool, plan: &RestorePlan) {
    let (write, remove) = if dry_run {
        ("would restore", "would remove")
    } else {
        ("restored", "removed")
    };
    if plan.write.is_empty() && plan.remove.is_empty() {
        println!("no file changes");
        return;
    }
    for path in &plan.write {
        println!("{write}: {}", crate::text::shown(path));
    }
    for path in &plan.remove {
        println!("{remove}: {}", crate::text::shown(path));
    }
}
