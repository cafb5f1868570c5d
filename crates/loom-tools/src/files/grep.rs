use std::io::{BufRead, BufReader, Read};

use globset::GlobBuilder;
use loom_core::{Tool, ToolContext, ToolError, ToolOutput};
use regex::RegexBuilder;
use schemars::JsonSchema;
use serde::Deserialize;

use super::walk::walk_files;
use super::{blocking, clip_line, default_dot, looks_binary, resolve};
use crate::jail::display;

const DEFAULT_MAX_RESULTS: usize = 200;
const MAX_LINE_CHARS: usize = 300;

/// Arguments of `grep`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepArgs {
    /// Regular expression to search for.
    pub pattern: String,
    /// File or directory to search, relative to the workspace root (default: the root).
    #[serde(default = "default_dot")]
    pub path: String,
    /// Only search files whose path matches this glob, e.g. `*.md` or `src/**`.
    #[serde(default)]
    pub glob: Option<String>,
    /// Match without regard to case.
    #[serde(default)]
    pub case_insensitive: bool,
    /// Most matching lines to return (default 200).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_results: Option<usize>,
}

/// Searches file contents with a regular expression, honouring `.gitignore`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Grep;

impl Tool for Grep {
    type Args = GrepArgs;

    fn name(&self) -> &str {
        "grep"
    }

    fn description(&self) -> &str {
        "Search file contents for a regular expression. Returns matching lines as path:line: text. \
         Skips binary files, hidden files and files ignored by .gitignore."
    }

    fn concurrency_safe(&self) -> bool {
        true
    }

    fn read_only(&self) -> bool {
        true
    }

    async fn call(&self, args: GrepArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let (jail, base) = resolve(&ctx, &args.path)?;
        let regex = RegexBuilder::new(&args.pattern)
            .case_insensitive(args.case_insensitive)
            .build()
            .map_err(|err| ToolError::InvalidArguments(format!("invalid regular expression: {err}")))?;
        let filter = match &args.glob {
            Some(pattern) => Some(
                GlobBuilder::new(pattern)
                    .build()
                    .map_err(|err| ToolError::InvalidArguments(format!("invalid glob '{pattern}': {err}")))?
                    .compile_matcher(),
            ),
            None => None,
        };
        let max = args.max_results.unwrap_or(DEFAULT_MAX_RESULTS).max(1);
        let cancel = ctx.cancel.clone();
        blocking(move || {
            let mut out = String::new();
            let mut shown = 0usize;
            let mut more = 0usize;
            let mut files_with_matches = 0usize;
            let walked = walk_files(&jail, &args.path, &base, &cancel, |found| {
                let path = found.relative;
                if let Some(filter) = &filter {
                    let relative = path.strip_prefix(&base).unwrap_or(path);
                    if !filter.is_match(relative) && !path.file_name().is_some_and(|name| filter.is_match(name)) {
                        return Ok(());
                    }
                }
                let Some(mut file) = found.open() else {
                    return Ok(());
                };
                let mut head = vec![0u8; super::BINARY_SNIFF_BYTES];
                let Ok(read) = file.read(&mut head) else {
                    return Ok(());
                };
                head.truncate(read);
                if looks_binary(&head) {
                    return Ok(());
                }
                let display = display(path);
                let mut matched = false;
                let reader = BufReader::new(std::io::Cursor::new(head).chain(file));
                for (index, line) in reader.split(b'\n').enumerate() {
                    let Ok(line) = line else { break };
                    let text = String::from_utf8_lossy(&line);
                    if !regex.is_match(&text) {
                        continue;
                    }
                    matched = true;
                    if shown < max {
                        let text = text.trim_end_matches('\r');
                        out.push_str(&format!(
                            "{display}:{}: {}\n",
                            index + 1,
                            clip_line(text, MAX_LINE_CHARS)
                        ));
                        shown += 1;
                    } else {
                        more += 1;
                    }
                }
                files_with_matches += usize::from(matched);
                Ok(())
            })?;
            let note = walked.note().unwrap_or_default();
            if shown == 0 {
                return Ok(format!("No matches for /{}/ under '{}'.\n{note}", args.pattern, display(&base)).into());
            }
            out.push_str(&format!(
                "[{} matching lines in {files_with_matches} files",
                shown + more
            ));
            if more > 0 {
                out.push_str(&format!("; {more} not shown, narrow the search or raise max_results"));
            }
            out.push_str("]\n");
            out.push_str(&note);
            Ok(out.into())
        })
        .await
    }
}
