//! The file tools. Each runs its file work on tokio's blocking pool, and
//! every file it touches is opened through the call's [`Jail`] handle.

mod edit;
mod glob;
mod grep;
mod list;
mod read;
mod result_echo;
mod walk;
mod write;

use std::path::PathBuf;

use loom_core::{ToolContext, ToolError};

use crate::jail::{Jail, OpenError};

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

/// The jail of the call's workspace and `path` relative to its root.
fn resolve(ctx: &ToolContext, path: &str) -> Result<(Jail, PathBuf), ToolError> {
    let jail = Jail::new(&ctx.workspace)
        .map_err(|err| {
            ToolError::Failed(format!(
                "the workspace {} is not usable: {err}",
                ctx.workspace.display()
            ))
        })?
        .protecting(ctx.protected.clone())
        .keeping_read_only(ctx.read_only.clone());
    let relative = jail.relative(path)?;
    Ok((jail, relative))
}

/// A failed open through the jail, worded for the model.
fn open_error(action: &str, shown: &str, err: OpenError) -> ToolError {
    match err {
        OpenError::Refused(refused) => refused.into(),
        OpenError::Io(err) => io_error(action, shown, err),
    }
}

/// Entries of a directory shown with a missing path, at most.
const NEARBY_LINES: usize = 30;

/// [`open_error`], except that a path that does not exist is answered
/// with what its nearest existing directory holds: a small model that
/// guessed a path (`src/calc.rs` in a Python project) needs the real
/// names to go on, not advice to look for them.
fn open_error_near(jail: &Jail, action: &str, shown: &str, path: &std::path::Path, err: OpenError) -> ToolError {
    let missing = matches!(&err, OpenError::Io(io) if io.kind() == std::io::ErrorKind::NotFound);
    if missing {
        let mut parent = path.parent();
        while let Some(dir) = parent {
            let requested = if dir.as_os_str().is_empty() {
                ".".to_string()
            } else {
                dir.to_string_lossy().into_owned()
            };
            if let Ok(relative) = jail.relative(&requested) {
                if let Ok(listing) = list::listing_only(jail, &requested, &relative) {
                    let mut lines: Vec<&str> = listing.lines().take(NEARBY_LINES + 1).collect();
                    if lines.len() > NEARBY_LINES {
                        lines[NEARBY_LINES] = "…";
                    }
                    return ToolError::Failed(format!(
                        "cannot {action} '{shown}': it does not exist. What '{requested}' holds:\n{}",
                        lines.join("\n")
                    ));
                }
            }
            parent = dir.parent();
        }
    }
    open_error(action, shown, err)
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

/// Cuts `line` to at most `max` characters, marking the cut.
fn clip_line(line: &str, max: usize) -> String {
    loom_core::text::clip(line, max, &format!("… [line cut at {max} characters]"))
}

fn default_dot() -> String {
    ".".to_string()
}
