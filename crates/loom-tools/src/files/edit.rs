use loom_core::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

use std::io::{Read, Seek, Write};

/// Characters of the file shown when `old_string` is not in it.
const SHOWN_CHARS: usize = 4000;

use super::{blocking, io_error, open_error_near, resolve};
use crate::jail::{display, WriteMode};

/// Arguments of `edit_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditFileArgs {
    /// File to edit, relative to the workspace root.
    pub path: String,
    /// Exact text to replace; it must occur exactly once in the file.
    pub old_string: String,
    /// Text to put in its place.
    pub new_string: String,
}

/// Replaces one exact, unique piece of text in a file.
#[derive(Debug, Clone, Copy, Default)]
pub struct EditFile;

impl Tool for EditFile {
    type Args = EditFileArgs;

    fn name(&self) -> &str {
        "edit_file"
    }

    fn description(&self) -> &str {
        "Replace an exact piece of text in a file. old_string must match the file exactly \
         (including whitespace) and occur exactly once; include surrounding lines to make it unique."
    }

    async fn call(&self, args: EditFileArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let (jail, path) = resolve(&ctx, &args.path)?;
        blocking(move || {
            let shown = display(&path);
            if args.old_string.is_empty() {
                return Err(ToolError::InvalidArguments(
                    "old_string is empty; to create or replace a whole file use write_file".into(),
                ));
            }
            if args.old_string == args.new_string {
                return Err(ToolError::InvalidArguments("old_string and new_string are the same; nothing would change".into()));
            }
            // Read and rewritten through the one handle that was judged.
            let (mut file, _) = jail
                .open_write(&args.path, &path, WriteMode::Edit)
                .map_err(|err| open_error_near(&jail, "edit", &shown, &path, err))?;
            let mut text = String::new();
            file.read_to_string(&mut text).map_err(|err| io_error("read", &shown, err))?;
            let count = text.matches(&args.old_string).count();
            match count {
                0 => {
                    // The file as it is, so the next call can copy the exact
                    // text (a small model rarely reads the file first).
                    let shown_text = loom_core::text::clip(&text, SHOWN_CHARS, "\n… [rest of the file not shown]");
                    return Err(ToolError::Failed(format!(
                        "old_string was not found in '{shown}'. Copy the exact text to replace, including indentation and line breaks, from its content:\n{shown_text}"
                    )));
                }
                1 => {}
                n => {
                    return Err(ToolError::Failed(format!(
                        "old_string occurs {n} times in '{shown}'; include more surrounding text so it matches exactly once"
                    )))
                }
            }
            let start = text.find(&args.old_string).unwrap_or(0);
            let first_line = text[..start].matches('\n').count() + 1;
            let updated = text.replacen(&args.old_string, &args.new_string, 1);
            file.rewind()
                .and_then(|()| file.set_len(0))
                .and_then(|()| file.write_all(updated.as_bytes()))
                .map_err(|err| io_error("write", &shown, err))?;
            let last_line = first_line + args.new_string.matches('\n').count();
            Ok(format!("Edited '{shown}': replaced 1 occurrence; the new text is on lines {first_line}-{last_line}.").into())
        })
        .await
    }
}
