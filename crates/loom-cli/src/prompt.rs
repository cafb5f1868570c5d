//! Where `loom run` gets its task: the argument, `-` or a stdin that is not
//! a terminal (`echo "…" | loom run`, `loom run - < task.md`), or
//! `--prompt-file PATH`. An empty task is a usage error.

use std::io::{IsTerminal, Read};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};

/// The task, read from where the arguments say.
pub(crate) fn task(argument: Option<&str>, file: Option<&Path>) -> Result<String> {
    let stdin = std::io::stdin();
    let text = match (argument, file) {
        (Some(_), Some(_)) => bail!("give the task either as an argument or with --prompt-file, not both"),
        (None, Some(path)) => {
            std::fs::read_to_string(path).with_context(|| format!("cannot read the prompt file {}", path.display()))?
        }
        (Some("-"), None) => read_all(stdin)?,
        (Some(text), None) => text.to_string(),
        (None, None) if !stdin.is_terminal() => read_all(stdin)?,
        (None, None) => {
            return Err(anyhow!(
                "no task given: write it as an argument (loom run \"…\"), pipe it to stdin, or use --prompt-file PATH"
            ))
        }
    };
    if text.trim().is_empty() {
        bail!("the task is empty: give loom something to do");
    }
    // `echo "…" | loom run` and files end with a newline that is not part of the task.
    let kept = text.trim_end_matches(['\n', '\r']).len();
    let mut text = text;
    text.truncate(kept);
    Ok(text)
}

fn read_all(stdin: std::io::Stdin) -> Result<String> {
    let mut text = String::new();
    stdin
        .lock()
        .read_to_string(&mut text)
        .context("cannot read the task from stdin")?;
    Ok(text)
}
