//! Loom's built-in tools.
//!
//! The file tools — `read_file`, `write_file`, `edit_file`, `list_dir`,
//! `glob`, `grep` — are confined to the run's workspace by [`Jail`]: every
//! file is opened through a handle of the workspace, beneath it, so absolute
//! paths outside it, `..` escapes and symlinks that lead out are refused,
//! when the file is opened, with an error the model can act on. `glob` and
//! `grep` honour `.gitignore`.

#![warn(missing_docs)]

pub mod definitions;
pub mod files;
pub mod hooks;
pub mod jail;
pub mod mcp;
pub mod retrieval;
pub mod shell;
pub mod skill;
pub mod task;

use std::sync::Arc;

use loom_core::DynTool;

pub use files::{EditFile, Glob, Grep, ListDir, ReadFile, WriteFile};
pub use hooks::{CommandHooks, HookCommand, HookConfigError};
pub use jail::{Jail, OpenError, PathError, WriteMode};
pub use mcp::{McpClients, McpServerConfig};
pub use retrieval::FolderRetriever;
pub use shell::{landlock_helper_main, make_process_undumpable, Bash, BashSettings, Isolation, SandboxMode};
pub use skill::Skill;
pub use task::Task;

/// Every file tool, ready for `AgentBuilder::tools`.
pub fn file_tools() -> Vec<Arc<dyn DynTool>> {
    vec![
        Arc::new(ReadFile),
        Arc::new(WriteFile),
        Arc::new(EditFile),
        Arc::new(ListDir),
        Arc::new(Glob),
        Arc::new(Grep),
    ]
}
