//! The `loom` command as every CLI test starts it.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Stdio};

use assert_cmd::cargo::CommandCargoExt;

/// `loom`, with nothing from the developer's environment leaking in: no
/// model, no provider keys or addresses, a config directory that does not exist.
pub fn loom() -> Command {
    let mut cmd = Command::cargo_bin("loom").unwrap();
    isolate(&mut cmd);
    cmd
}

/// Removes the developer's model and provider settings from `cmd`.
fn isolate(cmd: &mut Command) {
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

/// `loom ARGS` on a pseudo-terminal (util-linux `script`), with nothing from
/// the developer's environment leaking in; `loom_args` is shell-quoted by the
/// caller. `script` starts the command through `$SHELL -c`, and a shell that
/// stays as loom's parent (dash does) shares its process group, so Ctrl-C
/// would kill the shell and `script` would report 130 whatever loom did:
/// `exec` makes loom the terminal's only process, whichever shell runs it.
pub fn loom_on_a_terminal(loom_args: &str, script_flags: &str) -> Command {
    let loom = assert_cmd::cargo::cargo_bin("loom");
    let mut cmd = Command::new("script");
    cmd.args([
        script_flags,
        &format!("exec {} {loom_args}", loom.display()),
        "/dev/null",
    ])
    // The shell CI machines have: reproduce it everywhere.
    .env("SHELL", "/bin/sh");
    isolate(&mut cmd);
    cmd
}
