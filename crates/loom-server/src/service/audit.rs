//! The audit trail (docs/server.md, "Audit trail"): every action that
//! changes something, appended to the store beside the runs before the
//! client hears the answer; kept in memory, the newest ones only, when
//! there is no store. Read by admins (`GET /v1/audit`) and `loom audit`.

use std::net::SocketAddr;

use loom_core::{AuditEntry, AuditQuery};

use super::*;
use crate::auth::{Role, Tokens};

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

/// What a configured token is replaced with in a record.
const A_TOKEN: &str = "[a token]";

/// `text` with each part that is a configured token replaced: a whole part
/// between `/ ? & = ,` and blanks, or a piece of one between characters no
/// common token holds (`x:TOKEN`). This finds a token given by its digest
/// that no client has used yet, whose length is not known. Parts past
/// what the record keeps are left out, unread: each part is whole, so no
/// piece of a token is kept at the cut.
fn whole_parts_kept(tokens: &Tokens, text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(FIELD_CHARS * 4 + 4));
    let mut part = String::new();
    for c in text.chars() {
        if matches!(c, '/' | '?' | '&' | '=' | ',') || c.is_whitespace() {
            part_kept(tokens, &part, &mut out);
            part.clear();
            out.push(c);
            // More bytes than four per character kept: more characters
            // than the record keeps.
            if out.len() > FIELD_CHARS * 4 {
                return out;
            }
        } else {
            part.push(c);
        }
    }
    part_kept(tokens, &part, &mut out);
    out
}

/// `part` onto `out`, replaced if it is a token, else each of its pieces
/// that is (pieces: runs of letters, digits and `-_.~+`).
fn part_kept(tokens: &Tokens, part: &str, out: &mut String) {
    let is_token = |text: &str| text.len() >= 16 && tokens.is_token(text.as_bytes());
    if is_token(part) {
        out.push_str(A_TOKEN);
        return;
    }
    let mut piece_start = 0;
    for (at, c) in part.char_indices() {
        if !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '~' | '+')) {
            let piece = &part[piece_start..at];
            out.push_str(if is_token(piece) { A_TOKEN } else { piece });
            out.push(c);
            piece_start = at + c.len_utf8();
        }
    }
    let piece = &part[piece_start..];
    out.push_str(if piece_start > 0 && is_token(piece) {
        A_TOKEN
    } else {
        piece
    });
}

/// `text` cut to [`FIELD_CHARS`], each token of a known length in what is
/// kept replaced wherever it stands, glued to other text or not
/// (`x:TOKEN`): at each place, the text as long as each known length is
/// compared with the tokens. A token that starts before the cut is
/// replaced whole, so no part of one is kept.
fn cut_without_tokens(tokens: &Tokens, text: &str) -> String {
    let lengths = tokens.known_lengths();
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len().min(FIELD_CHARS * 4 + 3));
    let (mut at, mut kept_chars) = (0, 0);
    while at < bytes.len() && kept_chars <= FIELD_CHARS {
        // Tokens are visible ASCII only: a token starts at such a byte (a
        // character's boundary) and holds no other.
        let token = lengths.iter().copied().find(|&length| {
            bytes
                .get(at..at + length)
                .is_some_and(|candidate| candidate.iter().all(u8::is_ascii_graphic) && tokens.is_token(candidate))
        });
        match token {
            Some(length) => {
                out.push_str(A_TOKEN);
                kept_chars += A_TOKEN.len();
                at += length;
            }
            None => {
                let Some(c) = text[at..].chars().next() else { break };
                out.push(c);
                kept_chars += 1;
                at += c.len_utf8();
            }
        }
    }
    cut(out)
}

/// `text` cut to [`FIELD_CHARS`] characters, `…` marking the cut.
fn cut(text: String) -> String {
    if text.chars().count() > FIELD_CHARS {
        text.chars().take(FIELD_CHARS).chain(['…']).collect()
    } else {
        text
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
    /// `text` as a record keeps it: every configured token in it replaced
    /// by `[a token]`, then cut to [`FIELD_CHARS`].
    fn kept(&self, text: &str) -> String {
        let tokens = &self.inner.config.tokens;
        if tokens.is_empty() {
            return cut(text.to_string());
        }
        cut_without_tokens(tokens, &whole_parts_kept(tokens, text))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::token_sha256;
    use crate::config::{tokens_of, TokenEntry};

    const CLEAR: &str = "clear-token-0123456789";
    const DIGEST: &str = "digest-token-9876543210";

    fn tokens() -> Tokens {
        tokens_of(&[
            TokenEntry {
                name: "clear".into(),
                token: Some(CLEAR.into()),
                ..TokenEntry::default()
            },
            TokenEntry {
                name: "digest".into(),
                token_sha256: Some(token_sha256(DIGEST)),
                ..TokenEntry::default()
            },
        ])
        .unwrap()
    }

    fn kept(tokens: &Tokens, text: &str) -> String {
        cut_without_tokens(tokens, &whole_parts_kept(tokens, text))
    }

    #[test]
    fn a_token_given_in_clear_is_found_wherever_it_stands() {
        let tokens = tokens();
        for (text, expected) in [
            (format!("x:{CLEAR}"), "x:[a token]".to_string()),
            (format!("ab{CLEAR}cd{CLEAR}"), "ab[a token]cd[a token]".to_string()),
            (
                format!("/v1/runs?token={CLEAR}"),
                "/v1/runs?token=[a token]".to_string(),
            ),
            (
                format!("\u{202e}{CLEAR}\u{202e}"),
                "\u{202e}[a token]\u{202e}".to_string(),
            ),
        ] {
            assert_eq!(kept(&tokens, &text), expected, "{text}");
        }
    }

    #[test]
    fn a_token_given_by_its_digest_is_found_apart_until_used_then_anywhere() {
        let tokens = tokens();
        assert_eq!(kept(&tokens, &format!("x:{DIGEST}")), "x:[a token]");
        assert_eq!(kept(&tokens, &format!("a {DIGEST} b")), "a [a token] b");
        // Its length is not known yet: glued to letters it is not found.
        assert_eq!(kept(&tokens, &format!("x{DIGEST}")), format!("x{DIGEST}"));
        assert!(tokens.check(DIGEST).is_some());
        assert_eq!(kept(&tokens, &format!("x{DIGEST}y")), "x[a token]y");
    }

    #[test]
    fn no_piece_of_a_token_is_kept_at_the_cut() {
        let tokens = tokens();
        let pad = "p".repeat(FIELD_CHARS - 5);
        let text = format!("{pad}{CLEAR}tail");
        let kept = kept(&tokens, &text);
        assert_eq!(kept, format!("{pad}[a to…"));
        let long = format!("{CLEAR} {}", "z".repeat(10_000));
        let kept = self::kept(&tokens, &long);
        assert_eq!(kept.chars().count(), FIELD_CHARS + 1);
        assert!(kept.starts_with("[a token] zzz") && kept.ends_with('…'), "{kept}");
    }
}
