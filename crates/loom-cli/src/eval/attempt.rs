//! One attempt of a case: a fresh copy of its workspace, one run of the
//! agent built as `loom run` builds it, and what the checks need.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use loom::{EventKind, PermissionDecision, RunStatus};

use super::suite::Case;
use crate::cli::{AgentArgs, CommonAgentArgs, PlaceArgs};
use crate::config::LoadedConfig;

/// The tools a case that names none allows: every tool `loom run` offers
/// (an attempt has nobody to ask).
const EVERY_TOOL: [&str; 9] = [
    "read_file",
    "write_file",
    "edit_file",
    "list_dir",
    "glob",
    "grep",
    "bash",
    "task",
    "skill",
];

/// Grace after a case's own time limit before the attempt is abandoned
/// (the run's deadline ends it first; this only guards against a hang).
const GRACE: Duration = Duration::from_secs(30);

/// What every attempt shares.
pub(crate) struct Bench {
    pub loaded: LoadedConfig,
    pub model: Option<String>,
    pub base_url: Option<String>,
    /// The database every attempt's run is recorded in.
    pub db: PathBuf,
    /// Keep each attempt's workspace here instead of deleting it.
    pub keep: Option<PathBuf>,
}

/// What a run did, as the checks and the reports read it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ran {
    pub run_id: Option<String>,
    pub status: String,
    pub answer: Option<String>,
    /// Why the run ended without an answer, or why it could not start.
    pub error: Option<String>,
    pub steps: u32,
    pub model_calls: u32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost_usd: f64,
    pub wall_secs: f64,
    /// The top-level run's calls, in order.
    pub tools_called: Vec<String>,
}

/// A finished attempt: its run and its final workspace (deleted on drop
/// unless kept).
pub(crate) struct Attempt {
    pub ran: Ran,
    pub workspace: Workspace,
}

/// An attempt's workspace.
pub(crate) enum Workspace {
    Temporary(tempfile::TempDir),
    Kept(PathBuf),
}

impl Workspace {
    pub(crate) fn path(&self) -> &Path {
        match self {
            Self::Temporary(dir) => dir.path(),
            Self::Kept(path) => path,
        }
    }
}

/// Runs attempt `number` of `case`.
pub(crate) async fn attempt(bench: &Bench, case: &Case, number: u32) -> Result<Attempt> {
    let workspace = fresh_workspace(bench, case, number).await?;
    let started = Instant::now();
    let mut ran = match run(bench, case, workspace.path()).await {
        Ok(ran) => ran,
        Err(err) => Ran {
            status: "ERROR".to_string(),
            error: Some(format!("{err:#}")),
            ..Ran::default()
        },
    };
    ran.wall_secs = started.elapsed().as_secs_f64();
    Ok(Attempt { ran, workspace })
}

async fn fresh_workspace(bench: &Bench, case: &Case, number: u32) -> Result<Workspace> {
    let workspace = match &bench.keep {
        Some(root) => {
            let dir = root.join(format!("{}-{number}", case.folder_name()));
            if dir.exists() {
                tokio::fs::remove_dir_all(&dir)
                    .await
                    .with_context(|| format!("cannot clear {}", dir.display()))?;
            }
            tokio::fs::create_dir_all(&dir)
                .await
                .with_context(|| format!("cannot create {}", dir.display()))?;
            Workspace::Kept(dir)
        }
        None => Workspace::Temporary(
            tempfile::Builder::new()
                .prefix("loom-eval-")
                .tempdir()
                .context("cannot create a temporary workspace")?,
        ),
    };
    if let Some(source) = &case.workspace {
        let (source, target) = (source.clone(), workspace.path().to_path_buf());
        tokio::task::spawn_blocking(move || copy_tree(&source, &target))
            .await
            .map_err(|err| anyhow!("copying the workspace failed: {err}"))??;
    }
    Ok(workspace)
}

/// Copies the folder `from` into `to`: files, folders and links as they are.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    for entry in std::fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            std::fs::create_dir_all(&target)?;
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target).with_context(|| format!("cannot copy {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// One run of the case's prompt in `workspace`.
async fn run(bench: &Bench, case: &Case, workspace: &Path) -> Result<Ran> {
    let tools = case.tools.clone().unwrap_or_default();
    let allow: Vec<String> = match &case.tools {
        Some(tools) => tools.clone(),
        None => EVERY_TOOL.iter().map(|tool| tool.to_string()).collect(),
    };
    let args = AgentArgs {
        common: CommonAgentArgs {
            model: case.model.clone().or_else(|| bench.model.clone()),
            base_url: bench.base_url.clone(),
            max_steps: case.max_steps,
            timeout: case.timeout_secs,
            allow,
            ask: Vec::new(),
            deny: Vec::new(),
            config: None,
        },
        record: None,
        max_tokens: None,
        max_cost: None,
        tools,
        yes: false,
        mode: case.mode.unwrap_or_default(),
        verbose: false,
    };
    let place = PlaceArgs {
        workspace: Some(workspace.to_path_buf()),
        db: Some(bench.db.clone()),
        redis: None,
    };
    // The case's time limit is the attempt's: no single step may end it
    // sooner (a slow local model spends more than the default step limit
    // on one long prompt). A tighter step limit in loom.toml stays.
    let mut loaded = bench.loaded.clone();
    if let Some(limit) = case.timeout_secs {
        let step = &mut loaded.file.step_timeout_secs;
        *step = Some(step.map_or(limit, |own| own.min(limit)));
    }
    let agent = crate::run::configure_agent(&args, &place, None, &loaded, None).await?;
    let mut handle = agent.run(loom::RunRequest {
        prompt: case.prompt.clone(),
        ..loom::RunRequest::default()
    });
    let run_id = handle.run_id().to_string();
    let controller = handle.controller();
    let mut tools_called = Vec::new();
    let limit = Duration::from_secs(case.timeout_secs.unwrap_or(3600)) + GRACE;
    let followed = tokio::time::timeout(limit, async {
        while let Some(event) = handle.next_event().await {
            match &event.kind {
                EventKind::ToolCallsStart { calls } if event.depth == 0 => {
                    tools_called.extend(calls.iter().map(|call| call.name.clone()));
                }
                // Nobody is there to ask: what the suite did not allow is refused.
                EventKind::PermissionRequest { request_id, .. } => {
                    let _ = controller.respond_permission(request_id, PermissionDecision::Deny);
                }
                _ => {}
            }
        }
    })
    .await;
    if followed.is_err() {
        controller.cancel("the attempt outlived its time limit");
    }
    let outcome = handle.outcome().await;
    let metrics = &outcome.metrics;
    Ok(Ran {
        run_id: Some(run_id),
        status: outcome.status.as_str().to_string(),
        answer: outcome.content.clone(),
        error: match (&outcome.stop_reason, outcome.status) {
            (_, RunStatus::Done) => None,
            (Some(reason), _) => Some(why(reason)),
            (None, _) => None,
        },
        steps: outcome.turns,
        model_calls: metrics.llm_calls,
        prompt_tokens: metrics.input_tokens,
        completion_tokens: metrics.output_tokens,
        cost_usd: metrics.cost_usd.unwrap_or(0.0),
        wall_secs: 0.0,
        tools_called,
    })
}

/// Why a run stopped, in a line.
fn why(reason: &loom::StopReason) -> String {
    match reason {
        loom::StopReason::Error { code, message } => format!("{}: {message}", code.as_str()),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_is_copied_whole() {
        let from = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(from.path().join("src/deep")).unwrap();
        std::fs::write(from.path().join("src/deep/a.py"), "x = 1\n").unwrap();
        std::fs::write(from.path().join("README"), "hi").unwrap();
        std::os::unix::fs::symlink("README", from.path().join("link")).unwrap();
        let to = tempfile::tempdir().unwrap();
        copy_tree(from.path(), to.path()).unwrap();
        assert_eq!(
            std::fs::read_to_string(to.path().join("src/deep/a.py")).unwrap(),
            "x = 1\n"
        );
        assert_eq!(std::fs::read_link(to.path().join("link")).unwrap(), Path::new("README"));
    }
}
