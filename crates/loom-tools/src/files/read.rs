use std::io::{BufRead, BufReader, Read};

use loom_core::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

use std::path::Path;

use super::{blocking, clip_line, io_error, looks_binary, open_error_near, resolve};
use crate::jail::{display, Jail};

const DEFAULT_LIMIT: usize = 2000;
const MAX_LINE_CHARS: usize = 2000;

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// File to read, relative to the workspace root.
    pub path: String,
    /// First line to return, counting from 1 (default 1).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub offset: Option<usize>,
    /// Most lines to return (default 2000).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub limit: Option<usize>,
}

/// Reads a text file, with line numbers; `offset`/`limit` page through large files.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadFile;

impl Tool for ReadFile {
    type Args = ReadFileArgs;

    fn name(&self) -> &str {
        "read_file"
    }

    fn description(&self) -> &str {
        "Read a text file from the workspace. Lines are numbered. For large files, \
         pass offset (first line, from 1) and limit (number of lines) to read a part."
    }

    fn concurrency_safe(&self) -> bool {
        true
    }

    fn read_only(&self) -> bool {
        true
    }

    async fn call(&self, args: ReadFileArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let (jail, path) = resolve(&ctx, &args.path)?;
        blocking(move || read_text(&jail, &args.path, &path, args.offset, args.limit).map(Into::into)).await
    }
}

/// The numbered lines of the file at `path` (relative to the root;
/// `requested` as the model named it). A directory is answered with its
/// listing: a model that reads `.` wants to know what is there, and an
/// error it may echo as its answer helps it less.
pub(super) fn read_text(
    jail: &Jail,
    requested: &str,
    path: &Path,
    offset: Option<usize>,
    limit: Option<usize>,
) -> Result<String, ToolError> {
    let shown = display(path);
    let mut file = jail
        .open_read(requested, path)
        .map_err(|err| open_error_near(jail, "read", &shown, path, err))?;
    let meta = file.metadata().map_err(|err| io_error("read", &shown, err))?;
    if meta.is_dir() {
        drop(file);
        let listing = super::list::listing(jail, requested, path)?;
        return Ok(format!(
            "'{shown}' is a directory, not a file (read_file reads files). It holds:\n{listing}"
        ));
    }
    if !meta.is_file() {
        return Err(ToolError::Failed(format!(
            "'{shown}' is not a regular file (a pipe, socket or device); read_file reads files only"
        )));
    }
    let mut head = vec![0u8; super::BINARY_SNIFF_BYTES];
    let read = file.read(&mut head).map_err(|err| io_error("read", &shown, err))?;
    head.truncate(read);
    if looks_binary(&head) {
        return Err(ToolError::Failed(format!(
            "'{shown}' looks like a binary file; read_file shows text files only"
        )));
    }
    let reader = BufReader::new(std::io::Cursor::new(head).chain(file));
    let first = offset.unwrap_or(1).max(1);
    let limit = limit.unwrap_or(DEFAULT_LIMIT).max(1);
    let mut out = String::new();
    let mut total = 0usize;
    let mut last_shown = 0usize;
    for (index, line) in reader.split(b'\n').enumerate() {
        let line = line.map_err(|err| io_error("read", &shown, err))?;
        total = index + 1;
        let number = index + 1;
        if number >= first && number < first.saturating_add(limit) {
            let text = String::from_utf8_lossy(&line);
            let text = text.strip_suffix('\r').unwrap_or(&text);
            out.push_str(&format!("{number:>6}\t{}\n", clip_line(text, MAX_LINE_CHARS)));
            last_shown = number;
        }
    }
    if total == 0 {
        return Ok(format!("'{shown}' is empty (0 lines)."));
    }
    if first > total {
        return Err(ToolError::InvalidArguments(format!(
            "offset {first} is past the end of '{shown}', which has {total} lines"
        )));
    }
    if first > 1 || last_shown < total {
        out.push_str(&format!(
            "[lines {first}-{last_shown} of {total} in '{shown}'{}]\n",
            if last_shown < total {
                format!("; call read_file with offset={} to read more", last_shown + 1)
            } else {
                String::new()
            }
        ));
    }
    Ok(out)
}
