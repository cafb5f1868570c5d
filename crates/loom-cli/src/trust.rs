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

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::config::{FileConfig, LoadedConfig, Origin};

/// SHA-256 of `bytes` as 64 hex digits.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

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

/// The user's trust records: canonical path → SHA-256 of the trusted text.
fn records_path() -> Result<PathBuf> {
    Ok(crate::state::base_dir()?.join("trust.json"))
}

/// The records, none when the file does not exist. A file that cannot be
/// read is an error: writing over it would drop every other record.
fn read_records(path: &Path) -> Result<BTreeMap<String, String>> {
    match std::fs::read(path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).with_context(|| format!("{} is damaged; fix or remove it", path.display()))
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(err) => Err(err).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Whether the text of `file` with `digest` is trusted.
pub(crate) fn is_trusted(file: &Path, digest: &str) -> Result<bool> {
    let records = read_records(&records_path()?)?;
    Ok(records.get(&file.display().to_string()).map(String::as_str) == Some(digest))
}

/// Records `digest` as the trusted text of `file` (canonical), owner-only.
pub(crate) fn record(file: &Path, digest: &str) -> Result<()> {
    let path = records_path()?;
    if let Some(dir) = path.parent() {
        crate::state::private_dir(dir)?;
    }
    // One writer at a time (two `loom trust` at once would each write the
    // records they read, and one record would be lost): a lock file
    // beside them, held until this function returns.
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path.with_extension("json.lock"))
        .with_context(|| format!("cannot lock {}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("cannot lock {}", path.display()));
    }
    let mut records = read_records(&path)?;
    records.insert(file.display().to_string(), digest.to_string());
    let text = serde_json::to_string_pretty(&records)?;
    // Written whole to a new file, then renamed: a crash leaves the old
    // records, never half of them.
    let partial = path.with_extension("json.partial");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut out = options
        .open(&partial)
        .with_context(|| format!("cannot write {}", partial.display()))?;
    out.write_all(text.as_bytes())?;
    out.sync_all()?;
    std::fs::rename(&partial, &path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// A file trusted just now, for the audit trail ([`audit`]).
#[derive(Debug)]
pub(crate) struct Trusted {
    file: PathBuf,
    digest: String,
    /// `loom trust`, or a yes at the prompt.
    how: &'static str,
}

impl Trusted {
    /// `file` (or a project's `.loom`) trusted with `digest`, `how`.
    pub(crate) fn new(file: PathBuf, digest: String, how: &'static str) -> Self {
        Self { file, digest, how }
    }
}

/// Appends `trusted` to the audit trail of its project's database
/// (docs/server.md, "Audit trail"); a failure is a warning, the trust
/// stands.
pub(crate) async fn audit(trusted: Trusted) {
    let project = trusted.file.parent().unwrap_or(Path::new(".")).to_path_buf();
    let entry = loom::AuditEntry {
        time_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        action: "config.trust".into(),
        token: Some("local".into()),
        address: None,
        target: Some(trusted.file.display().to_string()),
        outcome: "ok".into(),
        detail: serde_json::json!({ "sha256": trusted.digest, "how": trusted.how }),
    };
    let appended = async {
        let dir = tokio::task::spawn_blocking(move || crate::state::workspace_dir(&project)).await??;
        let path = dir.join("loom.db");
        let store = tokio::task::spawn_blocking(move || loom::stores::SqliteStore::open(path)).await??;
        loom::Store::append_audit(&store, &entry).await?;
        anyhow::Ok(())
    };
    if let Err(err) = appended.await {
        say!("loom: warning: the trust was recorded, but not in the audit trail: {err:#}");
    }
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
