//! `[[hooks]]` in loom.toml, made command hooks (docs/extending.md).

use std::time::Duration;

use anyhow::{anyhow, Result};
use loom::tools::{BashSettings, CommandHooks, HookCommand};
use loom::HookEvent;

use crate::config::FileConfig;

/// The hooks `file` (named `source` in errors) configures, run as `shell`
/// runs commands; `None` when it has none.
pub(crate) fn command_hooks(file: &FileConfig, source: &str, shell: BashSettings) -> Result<Option<CommandHooks>> {
    if file.hooks.is_empty() {
        return Ok(None);
    }
    let commands = file
        .hooks
        .iter()
        .enumerate()
        .map(|(index, hook)| {
            let event = HookEvent::parse(&hook.event).ok_or_else(|| {
                let known: Vec<&str> = HookEvent::ALL.iter().map(|event| event.as_str()).collect();
                anyhow!(
                    "{source} [[hooks]] #{}: event {:?} is none of {}",
                    index + 1,
                    hook.event,
                    known.join(", ")
                )
            })?;
            let command = HookCommand {
                event,
                matcher: hook.matcher.clone(),
                command: hook.command.clone(),
                timeout: hook
                    .timeout_secs
                    .map_or(loom::tools::hooks::DEFAULT_HOOK_TIMEOUT, Duration::from_secs),
            };
            // Checked one by one, so the error names the entry.
            CommandHooks::new(vec![command.clone()], shell.clone())
                .map_err(|err| anyhow!("{source} [[hooks]] #{}: {err}", index + 1))?;
            Ok(command)
        })
        .collect::<Result<Vec<_>>>()?;
    let hooks = CommandHooks::new(commands, shell).map_err(|err| anyhow!("{source} [[hooks]]: {err}"))?;
    Ok(Some(hooks))
}
