//! The person's records of trust (docs/security.md): which exact text of a
//! project's `loom.toml` or `.loom/` they trusted (`trust.json` in the
//! user's own state, out of every tool's reach), and the audit trail entry
//! each new trust leaves. What needs trust and the asking are `trust.rs`'s.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

/// SHA-256 of `bytes` as 64 hex digits.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
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
    pub(crate) file: PathBuf,
    pub(crate) digest: String,
    /// `loom trust`, or a yes at the prompt.
    pub(crate) how: &'static str,
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
        loom::AuditLog::append_audit(&store, &entry).await?;
        anyhow::Ok(())
    };
    if let Err(err) = appended.await {
        say!("loom: warning: the trust was recorded, but not in the audit trail: {err:#}");
    }
}
