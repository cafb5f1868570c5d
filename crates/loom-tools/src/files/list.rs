use loom_core::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

use super::{blocking, default_dot, io_error, open_error, resolve};
use crate::jail::{display, is_escape, OpenError};

const MAX_ENTRIES: usize = 1000;

/// Arguments of `list_dir`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDirArgs {
    /// Directory to list, relative to the workspace root (default: the root).
    #[serde(default = "default_dot")]
    pub path: String,
}

/// Lists a directory: subdirectories first (ending in `/`), then files with sizes.
#[derive(Debug, Clone, Copy, Default)]
pub struct ListDir;

impl Tool for ListDir {
    type Args = ListDirArgs;

    fn name(&self) -> &str {
        "list_dir"
    }

    fn description(&self) -> &str {
        "List the entries of a directory in the workspace: subdirectories (ending in /) and files with their sizes."
    }

    fn concurrency_safe(&self) -> bool {
        true
    }

    fn read_only(&self) -> bool {
        true
    }

    async fn call(&self, args: ListDirArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let (jail, path) = resolve(&ctx, &args.path)?;
        blocking(move || {
            let shown = display(&path);
            let dir = jail.open_dir(&args.path, &path).map_err(|err| match err {
                OpenError::Io(err) if err.kind() == std::io::ErrorKind::NotADirectory => {
                    ToolError::Failed(format!("'{shown}' is a file, not a directory; use read_file"))
                }
                err => open_error("list", &shown, err),
            })?;
            let real = jail.real_dir_path(&dir);
            let reader = dir.entries().map_err(|err| io_error("list", &shown, err))?;
            let mut dirs = Vec::new();
            let mut files = Vec::new();
            for entry in reader {
                let entry = entry.map_err(|err| io_error("list", &shown, err))?;
                let name_os = entry.file_name();
                if real
                    .as_ref()
                    .is_some_and(|real| jail.is_protected(&real.join(&name_os)))
                {
                    continue;
                }
                let name = name_os.to_string_lossy().into_owned();
                let is_link = entry.file_type().is_ok_and(|kind| kind.is_symlink());
                // A link is shown as what it leads to, followed beneath the
                // root only: what is outside is never looked at.
                let meta = if is_link {
                    jail.metadata(&path.join(&name_os))
                } else {
                    entry.metadata()
                };
                match meta {
                    Ok(meta) if meta.is_dir() => dirs.push(format!("{name}/")),
                    Ok(meta) => files.push(format!("{name} ({} bytes)", meta.len())),
                    Err(err) if is_escape(&err) => files.push(format!("{name} (link outside the workspace)")),
                    Err(_) => files.push(format!("{name} (broken link)")),
                }
            }
            dirs.sort();
            files.sort();
            let total = dirs.len() + files.len();
            if total == 0 {
                return Ok(format!("'{shown}' is empty.").into());
            }
            let mut out = format!("{shown}/ ({} directories, {} files)\n", dirs.len(), files.len());
            for entry in dirs.iter().chain(files.iter()).take(MAX_ENTRIES) {
                out.push_str(entry);
                out.push('\n');
            }
            if total > MAX_ENTRIES {
                out.push_str(&format!("[{} more entries not shown]\n", total - MAX_ENTRIES));
            }
            Ok(out.into())
        })
        .await
    }
}
