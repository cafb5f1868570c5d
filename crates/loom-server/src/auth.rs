//! Bearer tokens: kept as SHA-256 digests and compared in constant time,
//! so neither the file nor the timing of a refusal tells a token.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::{ApiError, Code};

pub use loom_config::Role;

/// A token's role and its limits: the models its runs may use and the
/// tools they may have (none: whatever the server offers).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    /// What the token may do.
    pub role: Role,
    /// The only models its runs may name (the default model included only
    /// if listed).
    pub models: Option<Vec<String>>,
    /// The only tools its runs may have.
    pub tools: Option<Vec<String>>,
}

/// Who is calling: the name of the token they presented, with what it is
/// granted. Runs are recorded under the name; a principal sees its own
/// runs, an admin every token's. Two principals are the same when their
/// names are.
#[derive(Debug, Clone)]
pub struct Principal {
    name: Arc<str>,
    grant: Arc<Grant>,
}

impl PartialEq for Principal {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Principal {}

impl std::hash::Hash for Principal {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl Principal {
    /// The operator named `name`, without limits: a run's owner as stored.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self::granted(name, Grant::default())
    }

    /// `name` with `grant`.
    pub fn granted(name: impl Into<Arc<str>>, grant: Grant) -> Self {
        Self {
            name: name.into(),
            grant: Arc::new(grant),
        }
    }

    /// The principal of a gateway without tokens (loopback only): an
    /// operator.
    pub fn local() -> Self {
        Self::new("local")
    }

    /// The token's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the token is granted.
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// The token's role.
    pub fn role(&self) -> Role {
        self.grant.role
    }

    /// Whether this principal may see and control the runs of `owner`:
    /// its own, or every token's for an admin.
    pub fn reaches(&self, owner: &Principal) -> bool {
        self == owner || self.role() == Role::Admin
    }

    /// [`Principal::reaches`] for a stored run's owner: a run without one
    /// (started at the command line) belongs to no token, and no
    /// principal reaches it.
    pub fn reaches_owner(&self, owner: Option<&str>) -> bool {
        owner.is_some_and(|owner| owner == self.name() || self.role() == Role::Admin)
    }

    /// `FORBIDDEN` unless this principal may change runs (`what` says
    /// which change, for the message): a viewer may not.
    pub fn may_change(&self, what: &str) -> Result<(), ApiError> {
        if self.role() == Role::Viewer {
            return Err(ApiError::new(
                Code::Forbidden,
                format!("the token '{}' is a viewer: it may not {what}", self.name()),
            ));
        }
        Ok(())
    }
}

/// A token entry could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Neither or both of `token` and `token_sha256`.
    #[error("[[server.tokens]] '{0}': give exactly one of token and token_sha256")]
    OneOf(String),
    /// The digest is not 64 hex digits.
    #[error("[[server.tokens]] '{0}': token_sha256 must be 64 hex digits")]
    BadDigest(String),
    /// Two entries share a name.
    #[error("[[server.tokens]] '{0}': the name is used twice")]
    Duplicate(String),
    /// Two entries share a token: which one it signs in as (and so its
    /// role) could not be told.
    #[error(
        "[[server.tokens]] '{0}': the same token as '{1}' (LOOM_TOKEN is the token named 'default'); give each its own"
    )]
    SameToken(String, String),
    /// A token that is too short to be a secret.
    #[error("[[server.tokens]] '{0}': a token must have at least 16 characters (besides blanks around it)")]
    TooShort(String),
    /// A token of blanks or other invisible characters only (LOOM_TOKEN is
    /// named `default`).
    #[error("[[server.tokens]] '{0}': the token is blank: it has no visible character (LOOM_TOKEN is the token named 'default')")]
    Blank(String),
    /// A token with something other than visible ASCII inside.
    #[error("[[server.tokens]] '{0}': a token must consist of visible ASCII characters only ('!' to '~': no spaces, control characters or other Unicode)")]
    BadCharacter(String),
}

#[derive(Clone)]
struct Entry {
    principal: Principal,
    digest: [u8; 32],
    /// The token's length in bytes, 0 until known: at once for a token
    /// given in clear, at its first use for one given by its digest. The
    /// audit trail looks for tokens of these lengths in what it keeps
    /// (`service/audit.rs`); the token's text is never kept.
    length: Arc<AtomicUsize>,
}

/// The tokens the gateway accepts.
#[derive(Clone, Default)]
pub struct Tokens {
    entries: Vec<Entry>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.entries.iter().map(|e| e.principal.name()).collect();
        f.debug_struct("Tokens").field("names", &names).finish()
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    /// Adds a token given by its SHA-256 (`token_sha256`: 64 hex digits).
    pub fn add_digest_for(&mut self, principal: Principal, hex: &str) -> Result<(), TokenError> {
        let digest = parse_hex(hex).ok_or_else(|| TokenError::BadDigest(principal.name().to_string()))?;
        self.add(principal, digest)
    }

    /// Adds a token given in clear. Blanks around it are not part of it
    /// (a presented token is trimmed the same way); a token must be at
    /// least 16 characters without them, all visible ASCII (`!` to `~`):
    /// tokens travel in HTTP headers, and a zero-width space or a
    /// look-alike letter would make a token that looks like another, or
    /// like nothing at all.
    pub fn add_clear(&mut self, name: &str, token: &str) -> Result<(), TokenError> {
        self.add_clear_for(Principal::new(name), token)
    }

    /// [`Tokens::add_clear`] for a principal with its grant.
    pub fn add_clear_for(&mut self, principal: Principal, token: &str) -> Result<(), TokenError> {
        let name = principal.name().to_string();
        let name = name.as_str();
        let token = token.trim();
        // `trim` keeps zero-width spaces and other format characters (they
        // are not White_Space): a token of those is as blank as spaces.
        if token.chars().all(is_invisible) {
            return Err(TokenError::Blank(name.to_string()));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::BadCharacter(name.to_string()));
        }
        if token.len() < 16 {
            return Err(TokenError::TooShort(name.to_string()));
        }
        self.add(principal, digest(token))?;
        if let Some(added) = self.entries.last() {
            added.length.store(token.len(), Ordering::Relaxed);
        }
        Ok(())
    }

    fn add(&mut self, principal: Principal, digest: [u8; 32]) -> Result<(), TokenError> {
        if self.entries.iter().any(|e| e.principal == principal) {
            return Err(TokenError::Duplicate(principal.name().to_string()));
        }
        if let Some(twin) = self.entries.iter().find(|e| e.digest == digest) {
            return Err(TokenError::SameToken(
                principal.name().to_string(),
                twin.principal.name().to_string(),
            ));
        }
        self.entries.push(Entry {
            principal,
            digest,
            length: Arc::new(AtomicUsize::new(0)),
        });
        Ok(())
    }

    /// Whether no token is configured (the gateway is open, loopback only).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The digest of the token named `name`, if it is configured.
    pub(crate) fn digest_of(&self, name: &str) -> Option<[u8; 32]> {
        self.entries
            .iter()
            .find(|entry| entry.principal.name() == name)
            .map(|entry| entry.digest)
    }

    /// The principal of the token named `name`, if it is configured.
    pub fn principal_named(&self, name: &str) -> Option<Principal> {
        self.entries
            .iter()
            .find(|entry| entry.principal.name() == name)
            .map(|entry| entry.principal.clone())
    }

    /// The principal `presented` belongs to. Every entry is compared, in
    /// constant time on fixed-length digests, whatever matches.
    pub fn check(&self, presented: &str) -> Option<Principal> {
        let presented = presented.trim();
        let presented_len = presented.len();
        let presented = digest(presented);
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.digest.ct_eq(&presented)) {
                found = Some(entry.principal.clone());
                entry.length.store(presented_len, Ordering::Relaxed);
            }
        }
        found
    }

    /// The lengths of the tokens whose length is known (`Entry::length`),
    /// longest first, each once.
    pub(crate) fn known_lengths(&self) -> Vec<usize> {
        let mut lengths: Vec<usize> = self
            .entries
            .iter()
            .map(|entry| entry.length.load(Ordering::Relaxed))
            .filter(|length| *length > 0)
            .collect();
        lengths.sort_unstable_by(|a, b| b.cmp(a));
        lengths.dedup();
        lengths
    }

    /// Whether `text` is one of the tokens, exactly (not for signing in:
    /// not in constant time).
    pub(crate) fn is_token(&self, text: &[u8]) -> bool {
        let candidate: [u8; 32] = Sha256::digest(text).into();
        self.entries.iter().any(|entry| entry.digest == candidate)
    }
}

/// A character that shows nothing: a blank, a control character, or a
/// zero-width or other format character (Unicode category Cf, the common
/// ones).
fn is_invisible(c: char) -> bool {
    c.is_whitespace()
        || c.is_control()
        || matches!(
            c,
            '\u{00ad}' | '\u{034f}' | '\u{061c}' | '\u{115f}' | '\u{1160}' | '\u{17b4}' | '\u{17b5}'
                | '\u{180b}'..='\u{180f}'
                | '\u{200b}'..='\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{3164}'
                | '\u{fe00}'..='\u{fe0f}'
                | '\u{feff}'
                | '\u{ffa0}'
                | '\u{fff0}'..='\u{fff8}'
        )
}

fn parse_hex(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The SHA-256 of a token as 64 hex digits, for `token_sha256`.
pub fn token_sha256(token: &str) -> String {
    digest(token).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_trimmed_and_blank_or_spaced_ones_refused() {
        let mut tokens = Tokens::default();
        assert!(matches!(
            tokens.add_clear("default", &" ".repeat(20)),
            Err(TokenError::Blank(_))
        ));
        assert!(matches!(
            tokens.add_clear("default", "\t\n  \r "),
            Err(TokenError::Blank(_))
        ));
        assert!(matches!(
            tokens.add_clear("default", "  short-token   "),
            Err(TokenError::TooShort(_))
        ));
        assert!(matches!(
            tokens.add_clear("default", "a token with spaces inside"),
            Err(TokenError::BadCharacter(_))
        ));
        assert!(matches!(
            tokens.add_clear("default", "token-with\u{7}-bell-inside"),
            Err(TokenError::BadCharacter(_))
        ));
        // Invisible, though not blanks to `trim`: zero-width spaces, a
        // byte-order mark, a non-breaking space.
        for blank in [
            "\u{200b}".repeat(17),
            "\u{feff}\u{200b}\u{2060}".repeat(8),
            "\u{a0}".repeat(20),
        ] {
            assert!(
                matches!(tokens.add_clear("default", &blank), Err(TokenError::Blank(_))),
                "{blank:?}"
            );
        }
        // Anything but visible ASCII inside, or around.
        for odd in [
            "visible-token-0123456789\u{200b}",
            "\u{200b}visible-token-0123456789",
            "visible\u{200b}token-0123456789",
            "tökén-with-accents-0123456789",
            "visible-token-0123456789\u{a0}x",
        ] {
            assert!(
                matches!(tokens.add_clear("default", odd), Err(TokenError::BadCharacter(_))),
                "{odd:?}"
            );
        }
        tokens.add_clear("default", "  padded-token-0123456789 \n").unwrap();
        // One token under two names (two roles): refused, however written.
        assert!(matches!(
            tokens.add(Principal::new("admin"), digest("padded-token-0123456789")),
            Err(TokenError::SameToken(name, twin)) if name == "admin" && twin == "default"
        ));
        assert_eq!(tokens.check("padded-token-0123456789").unwrap().name(), "default");
        assert_eq!(tokens.check(" padded-token-0123456789 ").unwrap().name(), "default");
        assert!(tokens.check("").is_none());
        assert!(tokens.check("   ").is_none());
    }
}
