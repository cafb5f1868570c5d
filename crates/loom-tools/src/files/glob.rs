use globset::GlobBuilder;
use loom_core::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

use super::walk::walk_files;
use super::{blocking, default_dot, resolve};
use crate::jail::display;

const MAX_MATCHES: usize = 1000;

/// Arguments of `glob`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobArgs {
    /// Glob pattern relative to `path`, e.g. `**/*.md` or `src/*`.
    pub pattern: String,
    /// Directory to search from, relative to the workspace root (default: the root).
    #[serde(default = "default_dot")]
    pub path: String,
}

/// Finds files by name pattern, honouring `.gitignore`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Glob;

impl Tool for Glob {
    type Args = GlobArgs;

    fn name(&self) -> &str {
        "glob"
    }

    fn description(&self) -> &str {
        "Find files whose path matches a glob pattern (`*` within a directory, `**` across directories), \
         skipping files ignored by .gitignore and hidden files. Returns paths relative to the workspace root."
    }

    fn concurrency_safe(&self) -> bool {
        true
    }

    fn read_only(&self) -> bool {
        true
    }

    async fn call(&self, args: GlobArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let (jail, base) = resolve(&ctx, &args.path)?;
        let matcher = GlobBuilder::new(&args.pattern)
            .literal_separator(true)
            .build()
            .map_err(|err| ToolError::InvalidArguments(format!("invalid glob pattern '{}': {err}", args.pattern)))?
            .compile_matcher();
        let cancel = ctx.cancel.clone();
        blocking(move || {
            let mut found = Vec::new();
            let mut more = 0usize;
            let walked = walk_files(&jail, &args.path, &base, &cancel, |file| {
                let Ok(relative) = file.relative.strip_prefix(&base) else {
                    return Ok(());
                };
                if matcher.is_match(relative) {
                    if found.len() < MAX_MATCHES {
                        found.push(display(file.relative));
                    } else {
                        more += 1;
                    }
                }
                Ok(())
            })?;
            let note = walked.note().unwrap_or_default();
            if found.is_empty() {
                return Ok(format!("No files match '{}' under '{}'.\n{note}", args.pattern, display(&base)).into());
            }
            found.sort();
            let mut out = found.join("\n");
            out.push('\n');
            if more > 0 {
                out.push_str(&format!("[{more} more matches not shown; narrow the pattern]\n"));
            }
            out.push_str(&note);
            Ok(out.into())
        })
        .await
    }
}
