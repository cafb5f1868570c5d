//! The audit trail (docs/server.md, "Audit trail"): every action that
//! changes something, appended to the store beside the runs before the
//! client hears the answer; kept in memory, the newest ones only, when
//! there is no store. Read by admins (`GET /v1/audit`) and `loom audit`.

use std::net::SocketAddr;

use loom_core::{AuditEntry, AuditQuery};

use super::*;
use crate::auth::Role;

/// Records kept in memory without a store.
const KEPT_IN_MEMORY: usize = 10_000;

/// The longest text a record keeps of a field a client chose (a run id, a
/// path, a model, a session id): past it the field is cut (`…`), so a record
/// stays small whatever was sent.
const FIELD_CHARS: usize = 200;

/// Records of refused tokens per minute at most: a client that tries
/// tokens in a loop must not fill the disk. Those beyond are counted in
/// `loom_audit_refusals_dropped_total`.
const REFUSALS_PER_MINUTE: u32 = 600;

/// The records without a store, and the bound on refusal records.
pub(super) struct AuditMemory {
    kept: Mutex<VecDeque<AuditEntry>>,
    refusals: Mutex<Bucket>,
}

impl Default for AuditMemory {
    fn default() -> Self {
        Self {
            kept: Mutex::default(),
            refusals: Mutex::new(Bucket::full(REFUSALS_PER_MINUTE, Instant::now())),
        }
    }
}

/// What an action was and how it ended, for [`Service::audit`].
#[derive(Debug, Clone)]
pub struct Audited {
    /// See [`AuditEntry::action`].
    pub action: &'static str,
    /// The token's name, when one was accepted.
    pub token: Option<String>,
    /// The client's address.
    pub address: Option<SocketAddr>,
    /// The run (or other target).
    pub target: Option<String>,
    /// `Ok`, or the error the client was answered.
    pub outcome: Result<(), Code>,
    /// See [`AuditEntry::detail`].
    pub detail: serde_json::Value,
}

impl Audited {
    /// `action` by `principal`, without a target or detail yet.
    pub fn by(action: &'static str, principal: &Principal, address: Option<SocketAddr>) -> Self {
        Self {
            action,
            token: Some(principal.name().to_string()),
            address,
            target: None,
            outcome: Ok(()),
            detail: serde_json::Value::Null,
        }
    }
}

/// The name of `code` as the protocol writes it (`FORBIDDEN`, …).
fn code_name(code: Code) -> String {
    serde_json::to_value(code)
        .ok()
        .and_then(|value| value.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{code:?}"))
}

impl Service {
    /// `text` as a record keeps it: a configured token in it (a whole part
    /// between `/ ? & = ,` and blanks) replaced by `[a token]`, then cut to
    /// [`FIELD_CHARS`].
    fn kept(&self, text: &str) -> String {
        let tokens = &self.inner.config.tokens;
        let mut out = String::with_capacity(text.len().min(FIELD_CHARS + 3));
        let mut part = String::new();
        let flush = |part: &mut String, out: &mut String| {
            if !tokens.is_empty() && part.len() >= 16 && tokens.check(part).is_some() {
                out.push_str("[a token]");
            } else {
                out.push_str(part);
            }
            part.clear();
        };
        for c in text.chars() {
            if matches!(c, '/' | '?' | '&' | '=' | ',') || c.is_whitespace() {
                flush(&mut part, &mut out);
                out.push(c);
            } else {
                part.push(c);
            }
        }
        flush(&mut part, &mut out);
        if out.chars().count() > FIELD_CHARS {
            out = out.chars().take(FIELD_CHARS).chain(['…']).collect();
        }
        out
    }

    /// [`Service::kept`] for every text in `detail`.
    fn kept_detail(&self, detail: serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match detail {
            Value::String(text) => Value::String(self.kept(&text)),
            Value::Array(items) => Value::Array(items.into_iter().map(|item| self.kept_detail(item)).collect()),
            Value::Object(fields) => Value::Object(
                fields
                    .into_iter()
                    .map(|(name, value)| (name, self.kept_detail(value)))
                    .collect(),
            ),
            other => other,
        }
    }

    /// Appends `action` to the audit trail and returns once it is stored
    /// (a failing store is logged and counted in
    /// `loom_audit_write_errors_total`: the action has happened by then,
    /// and its answer is not withheld).
    pub async fn audit(&self, action: Audited) {
        let entry = AuditEntry {
            time_ms: now_ms(),
            action: action.action.to_string(),
            token: action.token,
            address: action.address.map(|address| address.to_string()),
            target: action.target.map(|target| self.kept(&target)),
            outcome: match action.outcome {
                Ok(()) => loom_core::audit::OUTCOME_OK.to_string(),
                Err(code) => code_name(code),
            },
            detail: self.kept_detail(action.detail),
        };
        metrics::counter!("loom_audit_records_total", "action" => action.action).increment(1);
        match &self.inner.store {
            Some(store) => {
                if let Err(err) = store.append_audit(&entry).await {
                    metrics::counter!("loom_audit_write_errors_total").increment(1);
                    tracing::error!(error = %err, action = %entry.action, "an audit record could not be stored");
                }
            }
            None => {
                let mut kept = self
                    .inner
                    .audit
                    .kept
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                if kept.len() == KEPT_IN_MEMORY {
                    kept.pop_front();
                }
                kept.push_back(entry);
            }
        }
    }

    /// Records a refused token, unless refusals already filled this
    /// minute's share (then it is only counted).
    pub async fn audit_refusal(&self, address: Option<SocketAddr>, target: &str, reason: &str, code: Code) {
        let admitted = self
            .inner
            .audit
            .refusals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take(REFUSALS_PER_MINUTE, Instant::now())
            .is_ok();
        if !admitted {
            metrics::counter!("loom_audit_refusals_dropped_total").increment(1);
            return;
        }
        self.audit(Audited {
            action: "token.refused",
            token: None,
            address,
            target: Some(target.to_string()),
            outcome: Err(code),
            detail: serde_json::json!({ "reason": reason }),
        })
        .await;
    }

    /// The audit records `query` asks for, oldest first: admins only.
    pub async fn audit_entries(&self, principal: &Principal, query: &AuditQuery) -> Result<Vec<AuditEntry>, ApiError> {
        if principal.role() != Role::Admin {
            return Err(ApiError::new(
                Code::Forbidden,
                format!(
                    "the token '{}' is not an admin: only admins read the audit trail",
                    principal.name()
                ),
            ));
        }
        match &self.inner.store {
            Some(store) => store.audit_entries(query).await.map_err(store_error),
            None => {
                let kept = self
                    .inner
                    .audit
                    .kept
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                Ok(query.select(kept.iter()))
            }
        }
    }
}
