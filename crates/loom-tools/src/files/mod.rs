//! The file tools. Each runs its file work on tokio's blocking pool.

mod edit;
mod glob;
mod grep;
mod list;
mod read;
mod write;

use std::path::{Path, PathBuf};

use loom_core::{ToolContext, ToolError};

use crate::jail::Jail;

pub use edit::EditFile;
pub use glob::Glob;
pub use grep::Grep;
pub use list::ListDir;
pub use read::ReadFile;
pub use write::WriteFile;

/// Bytes inspected to decide whether a file is binary.
const BINARY_SNIFF_BYTES: usize = 8192;

/// Runs blocking file work off the async threads.
async fn blocking<T, F>(work: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ToolError> + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| ToolError::Failed(format!("the tool's worker failed: {err}")))?
}

/// The jail of the call's workspace and the resolved `path`.
fn resolve(ctx: &ToolContext, path: &str) -> Result<(Jail, PathBuf), ToolError> {
    let jail = Jail::new(&ctx.workspace)
        .map_err(|err| {
            ToolError::Failed(format!(
                "the workspace {} is not usable: {err}",
                ctx.workspace.display()
            ))
        })?
        .protecting(ctx.protected.clone());
    let resolved = jail.resolve(path)?;
    Ok((jail, resolved))
}

/// An I/O error worded for the model.
fn io_error(action: &str, shown: &str, err: std::io::Error) -> ToolError {
    let hint = match err.kind() {
        std::io::ErrorKind::NotFound => " (it does not exist; list the directory or use glob to find the right path)",
        std::io::ErrorKind::PermissionDenied => " (permission denied)",
        std::io::ErrorKind::IsADirectory => " (it is a directory; use list_dir)",
        _ => "",
    };
    ToolError::Failed(format!("cannot {action} '{shown}': {err}{hint}"))
}

fn looks_binary(bytes: &[u8]) -> bool {
    bytes[..bytes.len().min(BINARY_SNIFF_BYTES)].contains(&0)
}

fn is_dir(path: &Path) -> bool {
    path.metadata().map(|m| m.is_dir()).unwrap_or(false)
}

/// Cuts `line` to at most `max` characters, marking the cut.
fn clip_line(line: &str, max: usize) -> String {
    match line.char_indices().nth(max) {
        Some((cut, _)) => format!("{}… [line cut at {max} characters]", &line[..cut]),
        None => line.to_string(),
    }
}

/// The files under `base`, honouring `.gitignore` (also outside git
/// repositories) and skipping hidden files and Loom's own state. Stops with
/// `Cancelled` as soon as `cancel` fires; unreadable entries are skipped.
fn walk_files(
    base: &Path,
    jail: &Jail,
    cancel: loom_core::CancellationToken,
) -> impl Iterator<Item = Result<ignore::DirEntry, ToolError>> {
    let mut stopped = false;
    let jail = jail.clone();
    ignore::WalkBuilder::new(base)
        .require_git(false)
        .filter_entry(move |entry| !jail.is_protected(entry.path()))
        .build()
        .filter_map(move |entry| {
            if stopped {
                return None;
            }
            if cancel.is_cancelled() {
                stopped = true;
                return Some(Err(ToolError::Cancelled));
            }
            let entry = entry.ok()?;
            entry.file_type().is_some_and(|t| t.is_file()).then_some(Ok(entry))
        })
}

fn default_dot() -> String {
    ".".to_string()
}
