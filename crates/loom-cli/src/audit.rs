//! `loom audit`: the audit trail a gateway keeps in its store (docs/server.md,
//! "Audit trail"), read straight from the database or the Redis.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::anyhow;
use loom::{AuditEntry, AuditQuery, Store};

use crate::cli::AuditArgs;
use crate::exit::Failure;
use crate::text::{shown, shown_json};

pub(crate) async fn audit(args: AuditArgs) -> Result<ExitCode, Failure> {
    crate::runs::restore_sigpipe();
    let since_ms = match &args.since {
        Some(when) => Some(since_ms(when, SystemTime::now()).map_err(Failure::Usage)?),
        None => None,
    };
    let store: Box<dyn Store> = match &args.redis {
        Some(url) => Box::new(crate::store::open_redis(url).await.map_err(Failure::Usage)?),
        None => {
            let path = crate::runs::sqlite_path(args.db.as_deref(), args.workspace.as_deref()).await?;
            Box::new(crate::runs::open_sqlite(&path).await?)
        }
    };
    let query = AuditQuery {
        since_ms,
        token: args.token.clone(),
        limit: args.limit.max(1),
    };
    let entries = store
        .audit_entries(&query)
        .await
        .map_err(|err| Failure::Runtime(anyhow!("{err}")))?;
    let mut out = String::new();
    for entry in &entries {
        if args.json {
            let json = serde_json::to_string(entry).map_err(|err| Failure::Runtime(err.into()))?;
            out.push_str(&shown_json(&json));
        } else {
            out.push_str(&line(entry));
        }
        out.push('\n');
    }
    print!("{out}");
    Ok(ExitCode::SUCCESS)
}

/// `--since`: a time ago (`90m`) or an RFC 3339 time, as milliseconds
/// since the epoch.
fn since_ms(when: &str, now: SystemTime) -> anyhow::Result<u64> {
    let when = when.trim();
    let moment = match humantime::parse_duration(when) {
        Ok(ago) => now.checked_sub(ago).unwrap_or(UNIX_EPOCH),
        Err(_) => humantime::parse_rfc3339_weak(when).map_err(|_| {
            anyhow!("--since {when}: give a time ago (90m, 2h, 7days) or an RFC 3339 time (2026-11-26T18:00:00Z)")
        })?,
    };
    Ok(moment.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as u64)
}

/// One record as a line: time, action, outcome, token, address, target,
/// and the detail as JSON. A client chose the target (a run id, a path)
/// and values of the detail (a model, a session id): in every field,
/// control and direction characters are shown escaped, so no record can
/// print a line that looks like another record or reorder its own.
fn line(entry: &AuditEntry) -> String {
    let time = humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(entry.time_ms));
    let mut line = format!(
        "{time}  {:<18} {:<13} token={} from={}",
        shown(&entry.action),
        shown(&entry.outcome),
        shown(entry.token.as_deref().unwrap_or("-")),
        shown(entry.address.as_deref().unwrap_or("-")),
    );
    if let Some(target) = &entry.target {
        line.push_str(&format!(" target={}", shown(target)));
    }
    if !entry.detail.is_null() {
        line.push_str(&format!(" {}", shown(&entry.detail.to_string())));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_cannot_print_a_second_record() {
        let entry = AuditEntry {
            time_ms: 0,
            action: "agent.cancel".into(),
            token: Some("vic".into()),
            address: None,
            target: Some("x\n1970-01-01T00:00:00.000Z  agent.cancel  ok  token=boss\u{1b}[8m\u{202e}".into()),
            outcome: "FORBIDDEN".into(),
            detail: serde_json::Value::Null,
        };
        let printed = line(&entry);
        assert_eq!(printed.lines().count(), 1, "{printed}");
        assert!(
            !printed.contains('\u{1b}') && !printed.contains('\u{202e}'),
            "{printed}"
        );
        assert!(printed.contains("\\u{a}") && printed.contains("\\u{1b}"), "{printed}");
    }

    #[test]
    fn a_detail_chosen_by_a_client_is_shown_escaped() {
        let entry = AuditEntry {
            time_ms: 0,
            action: "agent.run".into(),
            token: Some("vic".into()),
            address: None,
            target: None,
            outcome: "INVALID_PARAMS".into(),
            detail: serde_json::json!({"model": "gpt\u{202e}\u{9b}2J\u{2066}x", "sessionId": "s\u{61c}"}),
        };
        let printed = line(&entry);
        assert!(
            !printed.chars().any(|c| "\u{202e}\u{9b}\u{2066}\u{61c}".contains(c)),
            "{printed}"
        );
        assert!(
            printed.contains("\\u{202e}") && printed.contains("\\u{61c}"),
            "{printed}"
        );
    }

    #[test]
    fn since_takes_a_time_ago_or_a_moment() {
        let now = UNIX_EPOCH + Duration::from_secs(10_000);
        assert_eq!(since_ms("90m", now).unwrap(), (10_000 - 5_400) * 1000);
        assert_eq!(since_ms("1970-01-01T00:00:10Z", now).unwrap(), 10_000);
        assert_eq!(since_ms("100days", now).unwrap(), 0);
        assert!(since_ms("yesterday-ish", now).is_err());
    }
}
