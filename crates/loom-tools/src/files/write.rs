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
    /// The whole new content of the file.
    pub content: String,
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
        "Create a file in the workspace, or replace its whole content. Missing parent \
         directories are created. To change part of a file, use edit_file."
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
            std::fs::write(&path, args.content.as_bytes()).map_err(|err| io_error("write", &shown, err))?;
            let lines = args.content.lines().count();
            Ok(format!(
                "{} '{shown}': {} bytes, {lines} lines.",
                if existed { "Replaced" } else { "Created" },
                args.content.len()
            )
            .into())
        })
        .await
    }
}
