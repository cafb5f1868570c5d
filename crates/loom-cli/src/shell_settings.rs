//! `[tools.bash]` as the shell's settings: how commands (the `bash` tool's
//! and hooks') run, and the warning an operator gets for running them
//! unconfined (docs/security.md).

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Result};

use crate::config;

/// `[tools.bash]` as settings, and whether the tool is on. A served
/// gateway's commands are sandboxed unless the operator wrote `sandbox =
/// "none"` ([`default_sandbox`]).
pub(crate) fn bash_settings(
    file: &config::FileConfig,
    workspace: &Path,
    serving: bool,
) -> Result<(loom::tools::BashSettings, bool)> {
    let config = file.tools.as_ref().and_then(|tools| tools.bash.as_ref());
    // This binary applies Landlock inside the sandbox's namespaces — unless
    // it lies in the workspace (`cargo run` there), where a command could
    // replace it before the next call binds and starts it.
    let helper = std::env::current_exe()
        .ok()
        .filter(|exe| !workspace.canonicalize().is_ok_and(|root| exe.starts_with(root)));
    let Some(config) = config else {
        let settings = loom::tools::BashSettings {
            landlock_helper: helper,
            sandbox: default_sandbox(serving),
            // Served: Landlock alone reads every file (tokens, other
            // tenants' runs); refused unless the operator says otherwise.
            require_namespaces: serving,
            ..Default::default()
        };
        return Ok((settings, true));
    };
    let mut settings = loom::tools::BashSettings {
        landlock_helper: helper,
        sandbox: default_sandbox(serving),
        require_namespaces: config.require_namespaces.unwrap_or(serving),
        bwrap: config.bwrap.clone(),
        ..Default::default()
    };
    if let Some(mode) = &config.sandbox {
        settings.sandbox = mode
            .parse()
            .map_err(|err| anyhow!("loom.toml [tools.bash] sandbox: {err}"))?;
    }
    if let Some(secs) = config.max_timeout_secs {
        settings.max_timeout = Duration::from_secs(secs.max(1));
    }
    if let Some(secs) = config.timeout_secs {
        settings.default_timeout = Duration::from_secs(secs.max(1)).min(settings.max_timeout);
    }
    settings.env = config.env.clone();
    Ok((settings, config.enabled != Some(false)))
}

/// The sandbox when `[tools.bash] sandbox` says none: `loom serve` runs
/// commands for whoever holds a token, so they are sandboxed
/// (namespaces + Landlock, no network); `loom run` and `loom chat` ask a
/// person before each command and run it as the user would
/// (docs/security.md, "Defaults").
fn default_sandbox(serving: bool) -> loom::tools::SandboxMode {
    if serving {
        loom::tools::SandboxMode::Landlock
    } else {
        loom::tools::SandboxMode::None
    }
}

/// Warns, at a gateway's or a worker's start, when its operator wrote
/// `[tools.bash] sandbox = "none"` with the tool on: what that gives
/// away to whoever holds a token.
pub(crate) fn warn_if_unconfined(file: &config::FileConfig) {
    let bash = file.tools.as_ref().and_then(|tools| tools.bash.as_ref());
    // Hooks run as the shell's commands do, whether or not the tool is on.
    let unconfined = bash.is_some_and(|bash| {
        bash.sandbox.as_deref() == Some("none") && (bash.enabled != Some(false) || !file.hooks.is_empty())
    });
    if unconfined {
        // SAFETY: a plain system call.
        let uid = unsafe { libc::geteuid() };
        say!(
            "loom: warning: [tools.bash] sandbox = \"none\": commands (bash, hooks) run unconfined as uid {uid}: they read and change whatever that user can outside the workspace and reach the network; only Loom's state and other processes are hidden. Without that line they are sandboxed (namespaces + Landlock, no network; docs/security.md)"
        );
    }
}
