use loom_core::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

use std::io::Write;
use std::path::Path;

use super::{blocking, io_error, open_error, resolve, result_echo};
use crate::jail::{display, Jail, OpenError, WriteMode};

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
            let shown = display(&path);
            if let Some(copied) = result_echo::copied_result(&args.content) {
                return refuse_result(&jail, &args, &path, copied);
            }
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

/// `write_file` of content that is a result, not a file's text: nothing is
/// written. When it is the result of the very write the file still holds
/// (the same file, as many bytes), the model is confirming work that is
/// done, and hears so as a success; otherwise it is an error to fix.
fn refuse_result(jail: &Jail, args: &WriteFileArgs, path: &Path, copied: &str) -> Result<ToolOutput, ToolError> {
    let shown = display(path);
    let confirmed = result_echo::echoed_write(&args.content)
        .filter(|(named, _)| *named == shown)
        .map(|(_, bytes)| bytes);
    let holds = || {
        jail.open_read(&args.path, path)
            .ok()
            .and_then(|file| file.metadata().ok())
            .filter(std::fs::Metadata::is_file)
            .map(|metadata| metadata.len())
    };
    if let Some(bytes) = confirmed.filter(|bytes| holds() == Some(*bytes)) {
        return Ok(format!(
            "nothing written: that is the result of your earlier write, and '{shown}' already holds those \
{bytes} bytes, unchanged. Give your final answer if the task is done."
        )
        .into());
    }
    Err(ToolError::Failed(format!(
        "nothing written: the content is {copied}; '{shown}' is unchanged. Write the text the file should \
hold, or give your final answer if the task is done."
    )))
}
