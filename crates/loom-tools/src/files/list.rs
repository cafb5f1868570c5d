use loom_core::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

use super::{blocking, default_dot, io_error, resolve};

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
            let shown = jail.display(&path);
            let reader = std::fs::read_dir(&path).map_err(|err| io_error("list", &shown, err))?;
            let mut dirs = Vec::new();
            let mut files = Vec::new();
            for entry in reader {
                let entry = entry.map_err(|err| io_error("list", &shown, err))?;
                if jail.is_protected(&entry.path()) {
                    continue;
                }
                let name = entry.file_name().to_string_lossy().into_owned();
                // Follow links for the kind, but never list what is outside.
                match entry.path().metadata() {
                    Ok(meta) if meta.is_dir() => dirs.push(format!("{name}/")),
                    Ok(meta) => files.push(format!("{name} ({} bytes)", meta.len())),
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
