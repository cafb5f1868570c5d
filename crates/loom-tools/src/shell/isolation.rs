//! What every program Loom starts outside `bash` — a stdio MCP server —
//! is kept from, as `bash`'s commands are in their unsandboxed mode
//! ([`super::namespaces`]): its own PID namespace (Loom's process, and so
//! its environment and command line, is not there to read), Loom's state
//! and the operator's configuration hidden, Loom's project configuration
//! read-only, the kernel's settings read-only, and no privilege. The
//! network and the rest of the file system stay as they are: such a
//! program is the user's own choice, not the model's.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::namespaces::{namespaces_available, View};
use super::sandbox::SandboxMode;

/// Paths hidden from, or read-only to, the programs Loom starts, and the
/// bwrap that builds their namespaces.
#[derive(Debug, Clone, Default)]
pub struct Isolation {
    /// The bwrap program (default: /usr/bin/bwrap, …; never through PATH).
    pub bwrap: Option<PathBuf>,
    /// Loom's state and the operator's configuration: covered by an empty mount.
    pub protected: Vec<PathBuf>,
    /// Configuration Loom reads from the project: bound read-only.
    pub read_only: Vec<PathBuf>,
}

impl Isolation {
    /// bwrap and its arguments, up to and including `--`, to start a
    /// program in `dir`; or why the namespaces cannot be made here (the
    /// program then starts without them, its privileges still dropped).
    pub(crate) fn launcher(&self, dir: &Path) -> Result<Vec<OsString>, String> {
        let bwrap = namespaces_available(self.bwrap.as_deref())?;
        let view = View {
            mode: SandboxMode::None,
            workspace: dir,
            tmp: dir,
            protected: &self.protected,
            read_only: &self.read_only,
            home: None,
        };
        Ok(view.bwrap_args(&bwrap, None))
    }
}
