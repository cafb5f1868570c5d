use loom_core::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

use super::{blocking, io_error, is_dir, resolve};

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// File to write, relative to the workspace root. Missing directories are created.
    pub path: String,
    /// The whole new content of the file (with `append`, the text to add at its end).
    pub content: String,
    /// Add `content` at the end of the file instead of replacing it (a log, a
    /// list); the file is created when missing.
    #[serde(default)]
    pub append: bool,
}

/// Creates or replaces a file with the given content.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteFile;

impl Tool for WriteFile {
    type Args = WriteFileArgs;

    fn name(&self) -> &str {
        "write_file"
    }

    fn description(&self) -> &str {
        "Create a file in the workspace, or replace its whole content (or, with append, add \
         to its end). Missing parent directories are created. To change part of a file, use edit_file."
    }

    async fn call(&self, args: WriteFileArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let (jail, path) = resolve(&ctx, &args.path)?;
        blocking(move || {
            let shown = jail.display(&path);
            if is_dir(&path) {
                return Err(ToolError::Failed(format!("'{shown}' is a directory; give a file path")));
            }
            let existed = path.exists();
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|err| io_error("create the directory for", &shown, err))?;
            }
            let verb = if args.append {
                append(&path, args.content.as_bytes()).map_err(|err| io_error("append to", &shown, err))?;
                if existed {
                    "Appended to"
                } else {
                    "Created"
                }
            } else {
                std::fs::write(&path, args.content.as_bytes()).map_err(|err| io_error("write", &shown, err))?;
                if existed {
                    "Replaced"
                } else {
                    "Created"
                }
            };
            let lines = args.content.lines().count();
            Ok(format!("{verb} '{shown}': {} bytes, {lines} lines.", args.content.len()).into())
        })
        .await
    }
}

/// Appends in one write to a file opened in append mode, so concurrent
/// appenders never interleave inside one call's text.
fn append(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    file.write_all(bytes)?;
    file.sync_data()
}
