//! Project instructions: `LOOM.md` or `AGENTS.md` at the workspace root and
//! in the user's config directory, as users of other coding agents expect.

use std::path::{Path, PathBuf};

/// File names looked for, in order; the first found in a directory is used.
pub const INSTRUCTION_FILES: [&str; 2] = ["LOOM.md", "AGENTS.md"];

/// Largest instruction file read.
const MAX_BYTES: u64 = 256 * 1024;

/// Instructions found, with where they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectInstructions {
    /// The file.
    pub path: PathBuf,
    /// Its text.
    pub content: String,
}

/// Reads the instruction file of each directory (user-wide first, then the
/// workspace, so the project's own words come last and weigh most).
pub fn load_project_instructions(dirs: &[PathBuf]) -> Vec<ProjectInstructions> {
    dirs.iter().filter_map(|dir| first_file(dir)).collect()
}

fn first_file(dir: &Path) -> Option<ProjectInstructions> {
    INSTRUCTION_FILES.iter().find_map(|name| {
        let path = dir.join(name);
        let meta = std::fs::metadata(&path).ok()?;
        if !meta.is_file() || meta.len() > MAX_BYTES {
            return None;
        }
        let content = std::fs::read_to_string(&path).ok()?;
        (!content.trim().is_empty()).then_some(ProjectInstructions { path, content })
    })
}
