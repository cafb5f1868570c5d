//! The environment a command sees: nothing of Loom's own but an allowlist
//! of harmless variables and what the configuration adds — never a variable
//! whose name looks secret, so an API key in Loom's environment cannot leak
//! through `env` or a crash dump.

use std::collections::BTreeMap;
use std::path::Path;

use loom_core::pipeline::is_secret_name;

/// Variables passed through from Loom's environment when set.
pub const INHERITED: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TERM",
    "USER",
    "LOGNAME",
    "SHELL",
    "TZ",
    "COLORTERM",
    "NO_COLOR",
];

/// The environment of one command: the allowlist, then `extra` (configured
/// values), then `TMPDIR` (the call's private temp dir) and `PWD`. Names
/// that look secret are left out wherever they come from.
pub fn command_env(extra: &BTreeMap<String, String>, tmpdir: &Path, workspace: &Path) -> Vec<(String, String)> {
    let mut env: BTreeMap<String, String> = INHERITED
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|value| (name.to_string(), value)))
        .collect();
    env.entry("PATH".to_string())
        .or_insert_with(|| "/usr/local/bin:/usr/bin:/bin".to_string());
    for (name, value) in extra {
        env.insert(name.clone(), value.clone());
    }
    env.insert("TMPDIR".to_string(), tmpdir.display().to_string());
    env.insert("PWD".to_string(), workspace.display().to_string());
    env.into_iter().filter(|(name, _)| !is_secret_name(name)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_never_pass_and_configured_values_do() {
        let extra = BTreeMap::from([
            ("CARGO_TERM_COLOR".to_string(), "never".to_string()),
            ("GITHUB_TOKEN".to_string(), "ghp_x".to_string()),
        ]);
        let env = command_env(&extra, Path::new("/tmp/t"), Path::new("/w"));
        let names: Vec<&str> = env.iter().map(|(name, _)| name.as_str()).collect();
        assert!(names.contains(&"CARGO_TERM_COLOR"));
        assert!(names.contains(&"PATH"));
        assert!(!names.contains(&"GITHUB_TOKEN"));
        assert!(env.contains(&("TMPDIR".to_string(), "/tmp/t".to_string())));
    }
}
