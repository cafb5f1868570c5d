use loom_core::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

use std::io::Write;

use super::{blocking, io_error, open_error, resolve, result_echo};
use crate::jail::{display, OpenError, WriteMode};

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
        if let Some(copied) = result_echo::copied_result(&args.content) {
            return Err(ToolError::Failed(format!(
                "nothing written: the content is {copied}; '{}' is unchanged. Write the text the file should \
hold, or give your final answer if the task is done.",
                display(&path)
            )));
        }
        blocking(move || {
            let shown = display(&path);
            let mode = if args.append {
                WriteMode::Append
            } else {
                WriteMode::Replace
            };
            let (mut file, existed) = jail.open_write(&args.path, &path, mode).map_err(|err| match err {
                OpenError::Io(err) if err.kind() == std::io::ErrorKind::IsADirectory => {
                    ToolError::Failed(format!("'{shown}' is a directory; give a file path"))
                }
                err => open_error("write", &shown, err),
            })?;
            // The handle that was judged is the one written: no second open.
            let verb = if args.append {
                // One write to a file opened in append mode, so concurrent
                // appenders never interleave inside one call's text.
                file.write_all(args.content.as_bytes())
                    .and_then(|()| file.sync_data())
                    .map_err(|err| io_error("append to", &shown, err))?;
                if existed {
                    "Appended to"
                } else {
                    "Created"
                }
            } else {
                file.set_len(0)
                    .and_then(|()| file.write_all(args.content.as_bytes()))
                    .map_err(|err| io_error("write", &shown, err))?;
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
