use loom_core::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

use super::{blocking, default_dot, io_error, open_error_near, resolve};
use std::path::Path;

use crate::jail::{display, is_escape, Jail, OpenError};

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
        blocking(move || listing(&jail, &args.path, &path).map(Into::into)).await
    }
}

/// The listing of `path` (relative to the root; `requested` as the model
/// named it). A file is answered as `ls` answers it, with its entry (an
/// error a small model may echo as its answer helps it less) — not with
/// its content, which is read_file's, under read_file's permission rules.
pub(super) fn listing(jail: &Jail, requested: &str, path: &Path) -> Result<String, ToolError> {
    entries(jail, requested, path, true)
}

/// [`listing`], with a missing directory a plain error: the listing a
/// near-miss answer shows, which looks for the nearest existing directory itself.
pub(super) fn listing_only(jail: &Jail, requested: &str, path: &Path) -> Result<String, ToolError> {
    entries(jail, requested, path, false)
}

fn entries(jail: &Jail, requested: &str, path: &Path, near_misses: bool) -> Result<String, ToolError> {
    let shown = display(path);
    let dir = match jail.open_dir(requested, path) {
        Ok(dir) => dir,
        Err(OpenError::Io(err)) if err.kind() == std::io::ErrorKind::NotADirectory => {
            let file = jail
                .open_read(requested, path)
                .map_err(|err| super::open_error("list", &shown, err))?;
            let len = file.metadata().map_err(|err| io_error("list", &shown, err))?.len();
            return Ok(format!(
                "{shown} ({len} bytes)\n'{shown}' is a file, not a directory: read_file shows what it holds."
            ));
        }
        Err(err) if near_misses => return Err(open_error_near(jail, "list", &shown, path, err)),
        Err(err) => return Err(super::open_error("list", &shown, err)),
    };
    // Its entries are judged by their real path: when that cannot be
    // told, nothing is shown (as a refused open would), lest Loom's
    // state be listed.
    let real = jail.real_dir_path(&dir).map_err(|err| {
        ToolError::Failed(format!(
            "cannot list '{shown}': where it really is cannot be told ({err}), \
             so Loom's own state in it could not be left out"
        ))
    })?;
    let reader = dir.entries().map_err(|err| io_error("list", &shown, err))?;
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    for entry in reader {
        let entry = entry.map_err(|err| io_error("list", &shown, err))?;
        let name_os = entry.file_name();
        if real
            .as_ref()
            .is_some_and(|real| jail.is_protected(&real.join(&name_os)))
        {
            continue;
        }
        let name = name_os.to_string_lossy().into_owned();
        let is_link = entry.file_type().is_ok_and(|kind| kind.is_symlink());
        // A link is shown as what it leads to, followed beneath the
        // root only: what is outside is never looked at, and what is
        // Loom's state is not described at all (not even its size).
        let meta = if is_link {
            jail.target_metadata(&path.join(&name_os))
                .map(|meta| meta.map(|meta| Kind::new(meta.is_dir(), meta.len())))
        } else {
            entry.metadata().map(|meta| Some(Kind::new(meta.is_dir(), meta.len())))
        };
        match meta {
            Ok(Some(Kind::Dir)) => dirs.push(format!("{name}/")),
            Ok(Some(Kind::File(len))) => files.push(format!("{name} ({len} bytes)")),
            Ok(None) => files.push(format!("{name} (link to a path tools may not read)")),
            Err(err) if is_escape(&err) => files.push(format!("{name} (link outside the workspace)")),
            Err(_) => files.push(format!("{name} (broken link)")),
        }
    }
    dirs.sort();
    files.sort();
    let total = dirs.len() + files.len();
    if total == 0 {
        return Ok(format!("'{shown}' is empty."));
    }
    let mut out = format!("{shown}/ ({} directories, {} files)\n", dirs.len(), files.len());
    for entry in dirs.iter().chain(files.iter()).take(MAX_ENTRIES) {
        out.push_str(entry);
        out.push('\n');
    }
    if total > MAX_ENTRIES {
        out.push_str(&format!("[{} more entries not shown]\n", total - MAX_ENTRIES));
    }
    Ok(out)
}

/// What an entry is shown as.
enum Kind {
    Dir,
    /// Anything else, with its size in bytes.
    File(u64),
}

impl Kind {
    fn new(is_dir: bool, len: u64) -> Self {
        if is_dir {
            Self::Dir
        } else {
            Self::File(len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jail::UNREADABLE;

    #[test]
    fn refuses_when_where_the_directory_is_cannot_be_told() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret.db"), "s").unwrap();
        std::fs::write(dir.path().join("ok.txt"), "o").unwrap();
        let root = dir.path().canonicalize().unwrap();
        let jail = Jail::new(dir.path())
            .unwrap()
            .protecting(vec![root.join("secret.db")].into());
        // The open's own check reads the real path; every later read fails.
        let mut reads = 0;
        UNREADABLE.set(Some(Box::new(move |_| {
            reads += 1;
            reads > 1
        })));
        let listed = listing(&jail, ".", Path::new(""));
        UNREADABLE.set(None);
        match listed {
            Ok(out) => panic!("listed although where it is cannot be told: {out}"),
            Err(err) => assert!(err.to_string().contains("cannot be told"), "{err}"),
        }
    }
}
