//! Trust in project configuration (docs/security.md). A `loom.toml`
//! found in the current directory came with the project: whoever could
//! write the project — a model with `write_file` included — may have
//! written it. Its settings that run commands or widen permissions take
//! effect only once a person has trusted that exact text: `loom trust`, or
//! a yes at the prompt of `loom run`/`loom chat` on a terminal. The record
//! is the file's SHA-256 in the user's own state (`trust.json` in the
//! state base, out of every tool's reach); a changed file needs trust
//! again. A file named with `--config` and the user's own config file are
//! the person's choice and need no trust.

use std::io::{BufRead, IsTerminal};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};

use crate::config::{FileConfig, LoadedConfig, Origin};
use crate::trust_records::{audit, is_trusted, record, sha256_hex, Trusted};

/// Programs that `file`'s MCP servers and hooks would run from the
/// project itself: files a tool may have written, which trusting the
/// configuration does not vouch for.
fn project_programs(file: &FileConfig, dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for (name, server) in file.mcp.iter().flat_map(|mcp| mcp.servers.iter()) {
        let words = server.command.iter().chain(server.args.iter());
        for word in words.filter(|word| project_file(word, dir)) {
            found.push(format!(
                "[mcp.servers.{}] runs {}, a file of the project",
                crate::text::shown(name),
                crate::text::shown(word)
            ));
        }
    }
    for hook in &file.hooks {
        // `bash -c` reads the words between the shell's operators and quotes.
        let words = hook
            .command
            .split(|c: char| c.is_whitespace() || "'\";|&()<>`$".contains(c));
        for word in words.filter(|word| project_file(word, dir)) {
            found.push(format!(
                "[[hooks]] at {} runs {}, a file of the project",
                crate::text::shown(&hook.event),
                crate::text::shown(word)
            ));
        }
    }
    found
}

/// Whether `word` names a file of the project in `dir` that tools may
/// change. Files in `.loom/` are read-only to every tool (docs/security.md).
fn project_file(word: &str, dir: &Path) -> bool {
    let candidate = Path::new(word);
    let named = candidate.is_relative() && (word.contains('/') || dir.join(candidate).is_file());
    let in_loom = candidate
        .components()
        .find(|c| !matches!(c, std::path::Component::CurDir))
        .is_some_and(|first| first.as_os_str() == ".loom");
    named && !in_loom && dir.join(candidate).exists()
}

/// Lets `loaded` take effect, or says why not: a project file with risky
/// settings must be trusted as it is now. On a terminal (`ask`), the
/// person is asked once and the answer recorded (and returned, for
/// [`audit`]).
pub(crate) fn require(loaded: &LoadedConfig, ask: bool) -> Result<Option<Trusted>> {
    let (Origin::Project, Some(path)) = (loaded.origin, &loaded.path) else {
        return Ok(None);
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut risky = crate::trust_rules::risky_settings(&loaded.table, dir);
    // Found first, it is read instead of the user's own file, whose
    // sandbox and deny rules it would quietly drop.
    if let Some(own) = crate::config::user_config_file().filter(|own| own.is_file()) {
        risky.push(format!("it is read instead of your own {}", own.display()));
    }
    if risky.is_empty() || is_trusted(path, &loaded.digest)? {
        return Ok(None);
    }
    let list = risky
        .iter()
        .map(|line| format!("  - {line}"))
        .collect::<Vec<_>>()
        .join("\n");
    if ask && std::io::stdin().is_terminal() && std::io::stderr().is_terminal() {
        say_partial!(
            "loom: {} is not trusted yet, and it has settings that run commands or widen permissions:\n{list}\nTrust this file as it is now? [y/N] ",
            path.display()
        );
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if matches!(answer.trim(), "y" | "Y" | "yes") {
            record(path, &loaded.digest)?;
            return Ok(Some(Trusted {
                file: path.clone(),
                digest: loaded.digest.clone(),
                how: "prompt",
            }));
        }
        bail!("{} is not trusted; nothing was run", path.display());
    }
    bail!(
        "{} is not trusted, and it has settings that run commands or widen permissions ({}). Read it, then run `loom trust {}` (or name it with --config)",
        path.display(),
        risky.join("; "),
        path.display()
    )
}

/// `loom trust [PATH]`: records the file as trusted and says what it
/// allows, and the agents and skills of its project's `.loom/` as they
/// are now (docs/security.md).
pub(crate) async fn trust(path: Option<&Path>) -> Result<std::process::ExitCode> {
    let path = path.unwrap_or(Path::new("loom.toml"));
    let real = crate::config::resolved_dir(path);
    let project = real.parent().unwrap_or(Path::new(".")).to_path_buf();
    // A loom.toml that does not parse is refused before anything is trusted.
    let text = match std::fs::read_to_string(&real) {
        Ok(text) => Some(text),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound && path == Path::new("loom.toml") => None,
        Err(err) => return Err(err).with_context(|| format!("cannot read {}", real.display())),
    };
    let file = match &text {
        Some(text) => Some(crate::config::parse(text).map_err(|err| anyhow!("{}: {err}", real.display()))?),
        None => None,
    };
    let definitions = {
        let project = project.clone();
        tokio::task::spawn_blocking(move || crate::project_definitions::trust(&project)).await??
    };
    let found_definitions = definitions.is_some();
    if let Some((trusted, names)) = definitions {
        println!("trusted the project's {names} (in {})", trusted.file.display());
        audit(trusted).await;
    }
    let (Some(text), Some((file, table))) = (text, file) else {
        if found_definitions {
            return Ok(std::process::ExitCode::SUCCESS);
        }
        bail!(
            "cannot read {}: no such file, and no agents or skills in .loom/ beside it",
            real.display()
        );
    };
    let digest = sha256_hex(text.as_bytes());
    {
        // Files and a lock: off the async thread.
        let (real, digest) = (real.clone(), digest.clone());
        tokio::task::spawn_blocking(move || record(&real, &digest)).await??;
    }
    audit(Trusted {
        file: real.clone(),
        digest: digest.clone(),
        how: "loom trust",
    })
    .await;
    let dir = real.parent().unwrap_or(Path::new("."));
    let risky = crate::trust_rules::risky_settings(&table, dir);
    for note in project_programs(&file, dir) {
        println!("note: {note}: a tool may change it, and trust does not cover it (review it, and keep it where tools cannot write, such as .loom/)");
    }
    println!("trusted {} (sha256 {})", real.display(), &digest[..16]);
    if risky.is_empty() {
        println!("it has no settings that run commands or widen permissions");
    } else {
        println!("it may now:");
        for line in risky {
            println!("  - {line}");
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}
