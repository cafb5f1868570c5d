//! What the tools, and every program Loom starts (`bash`, hooks, stdio MCP
//! servers), never see or never change (docs/security.md): Loom's state
//! and the operator's configuration are hidden, wherever they are — this
//! Loom's and every other's of the machine (`places.rs`); the project's
//! configuration is read-only.

use std::path::{Path, PathBuf};

use crate::config::{self, LoadedConfig};

/// Paths hidden from the tools and the programs Loom starts, and paths
/// they may read but never change.
#[derive(Debug, Default)]
pub(crate) struct Hidden {
    pub protected: Vec<PathBuf>,
    pub read_only: Vec<PathBuf>,
}

impl Hidden {
    /// For a run in `workspace` under `loaded`, whose store keeps `kept`.
    /// Folders are made now if missing, so that a command gets an empty
    /// mount there rather than a place to plant trust records or a config
    /// file. Blocking: files, and the places' list.
    pub(crate) fn of(loaded: &LoadedConfig, workspace: &Path, kept: Vec<PathBuf>) -> Self {
        let mut hidden = Self {
            protected: kept,
            ..Self::default()
        };
        // A project's configuration in the workspace may be read but
        // never changed.
        hidden.read_only.push(workspace.join("loom.toml"));
        hidden.read_only.push(workspace.join(".loom"));
        if let (Some(path), config::Origin::Project) = (&loaded.path, loaded.origin) {
            hidden.read_only.push(path.clone());
        }
        // Loom's state (every workspace's database, session keys, the
        // trust records) and the operator's file; and every other Loom's
        // of this machine: its state base may be anywhere, its gateway's
        // file hold tokens.
        let own = own_places(loaded);
        for place in own.into_iter().chain(crate::places::known(workspace)) {
            if !hidden.protected.contains(&place) {
                hidden.protected.push(place);
            }
        }
        if let Some(dir) = config::user_config_dir() {
            // Made if missing (when its parent exists, or is the default
            // `~/.config` of an existing home), and pinned with its parents
            // (a mount point cannot be renamed aside).
            if let Some(parent) = dir.parent() {
                let default_base = std::env::var_os("XDG_CONFIG_HOME").is_none_or(|v| v.is_empty());
                let makeable = parent.is_dir() || (default_base && parent.parent().is_some_and(Path::is_dir));
                if makeable && std::fs::create_dir_all(parent).is_ok() {
                    let _ = crate::state::private_dir(&dir);
                }
            }
            hidden.protected.push(dir);
        }
        // As the kernel will find them: a link among them is covered where
        // it leads (bwrap cannot mount over a link to a folder), and
        // moving the link later uncovers nothing.
        for path in hidden.protected.iter_mut().chain(hidden.read_only.iter_mut()) {
            *path = crate::places::resolved(path);
        }
        hidden
    }

    /// What a stdio MCP server is kept from, with `bwrap` (`[tools.bash]
    /// bwrap`) building its namespaces.
    pub(crate) fn isolation(&self, bwrap: Option<PathBuf>) -> loom::tools::Isolation {
        loom::tools::Isolation {
            bwrap,
            protected: self.protected.clone(),
            read_only: self.read_only.clone(),
        }
    }
}

/// This Loom's places: its state base (made now if missing, so that a
/// command gets an empty mount there rather than a place to plant trust
/// records) and the operator's own file (named with --config, or the
/// user's), which may hold tokens. Recorded for the other Looms of the
/// machine to hide too (`places.rs`).
pub(crate) fn own_places(loaded: &LoadedConfig) -> Vec<PathBuf> {
    let mut own = Vec::new();
    if let Ok(base) = crate::state::base_dir() {
        let _ = crate::state::private_dir(&base);
        own.push(base);
    }
    if let (Some(path), config::Origin::Explicit | config::Origin::User) = (&loaded.path, loaded.origin) {
        own.push(path.clone());
    }
    crate::places::register(&own);
    own
}
