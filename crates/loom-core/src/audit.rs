//! The audit trail's records (docs/server.md, "Audit trail"): who did
//! what to which run, from where, and how it ended. A store keeps them
//! beside the runs ([`crate::AuditLog::append_audit`]); they are never
//! changed or removed by Loom. A record never holds a token: only the
//! name of the token's entry.

use serde::{Deserialize, Serialize};

/// One action, as the audit trail keeps it. In JSON its fields are
/// camelCase, like every JSON Loom prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// When, milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// What was asked: a request method (`agent.run`, `agent.cancel`,
    /// `agent.steer`, `permission.respond`), `session.sign_in`,
    /// `session.sign_out`, `token.refused` or `config.trust`.
    pub action: String,
    /// The name of the token that asked (`local` on a gateway without
    /// tokens and at the command line); none when no token was accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The client's address (`ip:port`) as the gateway's socket saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// What it was done to: a run id, a file, a route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// `ok`, or the error code the client was answered (`FORBIDDEN`,
    /// `NOT_FOUND`, `UNAUTHORIZED`, …).
    pub outcome: String,
    /// What else matters for this action: an answer's decision and
    /// whether it was `always`, a refused token's reason, a trusted
    /// file's SHA-256. Never a token, a prompt or a steer's text.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub detail: serde_json::Value,
}

/// The outcome of an action that succeeded.
pub const OUTCOME_OK: &str = "ok";

/// Which records to read ([`crate::AuditLog::audit_entries`]), oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditQuery {
    /// Only records at or after this time (milliseconds since the epoch).
    pub since_ms: Option<u64>,
    /// Only the records of this token's name.
    pub token: Option<String>,
    /// At most this many: the newest ones, still in time order.
    pub limit: usize,
}

impl AuditQuery {
    /// Whether `entry` is one the query asks for (the limit aside).
    pub fn matches(&self, entry: &AuditEntry) -> bool {
        self.since_ms.is_none_or(|since| entry.time_ms >= since)
            && self
                .token
                .as_deref()
                .is_none_or(|token| entry.token.as_deref() == Some(token))
    }

    /// The records of `entries` (in time order) that the query asks for:
    /// the newest `limit` of them, still in time order.
    pub fn select<'a>(&self, entries: impl IntoIterator<Item = &'a AuditEntry>) -> Vec<AuditEntry> {
        let mut chosen: Vec<AuditEntry> = entries.into_iter().filter(|e| self.matches(e)).cloned().collect();
        let skip = chosen.len().saturating_sub(self.limit);
        chosen.drain(..skip);
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(time_ms: u64, token: Option<&str>) -> AuditEntry {
        AuditEntry {
            time_ms,
            action: "agent.cancel".into(),
            token: token.map(str::to_string),
            address: None,
            target: Some("run-1".into()),
            outcome: OUTCOME_OK.into(),
            detail: serde_json::Value::Null,
        }
    }

    #[test]
    fn a_query_keeps_the_newest_matching_records_in_time_order() {
        let entries = [
            entry(1, Some("alice")),
            entry(2, Some("bob")),
            entry(3, Some("alice")),
            entry(4, None),
            entry(5, Some("alice")),
        ];
        let alice = AuditQuery {
            token: Some("alice".into()),
            limit: 2,
            ..AuditQuery::default()
        };
        let times: Vec<u64> = alice.select(&entries).iter().map(|e| e.time_ms).collect();
        assert_eq!(times, [3, 5]);
        let since = AuditQuery {
            since_ms: Some(3),
            limit: 10,
            ..AuditQuery::default()
        };
        let times: Vec<u64> = since.select(&entries).iter().map(|e| e.time_ms).collect();
        assert_eq!(times, [3, 4, 5]);
    }

    #[test]
    fn a_record_reads_back_as_written_and_omits_what_it_lacks() {
        let written = entry(7, None);
        let json = serde_json::to_string(&written).unwrap();
        assert!(!json.contains("token") && !json.contains("detail"), "{json}");
        assert!(json.contains("\"timeMs\":7"), "{json}");
        assert_eq!(serde_json::from_str::<AuditEntry>(&json).unwrap(), written);
    }
}
