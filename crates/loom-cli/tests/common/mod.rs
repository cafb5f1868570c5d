//! The `loom` command as every CLI test starts it.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Stdio};

use assert_cmd::cargo::CommandCargoExt;

/// `loom`, with nothing from the developer's environment leaking in: no
/// model, no provider keys or addresses, a config directory that does not exist.
pub fn loom() -> Command {
    let mut cmd = Command::cargo_bin("loom").unwrap();
    for var in [
        "LOOM_MODEL",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("XDG_CONFIG_HOME", "/nonexistent-loom-test");
    cmd
}

/// The same, run in `dir`, with `dir/xdg` as the user's config directory
/// and no standard input.
pub fn loom_in(dir: &Path) -> Command {
    let mut cmd = loom();
    cmd.current_dir(dir)
        .env("XDG_CONFIG_HOME", dir.join("xdg"))
        .stdin(Stdio::null());
    cmd
}
