//! Bearer tokens: kept as SHA-256 digests and compared in constant time,
//! so neither the file nor the timing of a refusal tells a token.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::TokenEntry;

/// Who is calling: the name of the token they presented. Runs are
/// recorded under it, and a principal sees only its own runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal(pub Arc<str>);

impl Principal {
    /// The principal of a gateway without tokens (loopback only).
    pub fn local() -> Self {
        Self("local".into())
    }

    /// The token's name.
    pub fn name(&self) -> &str {
        &self.0
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
    /// A token that is too short to be a secret.
    #[error("[[server.tokens]] '{0}': a token must have at least 16 characters (besides blanks around it)")]
    TooShort(String),
    /// A token of blanks only (LOOM_TOKEN is named `default`).
    #[error("[[server.tokens]] '{0}': the token is blank (LOOM_TOKEN is the token named 'default')")]
    Blank(String),
    /// A token with a blank or a control character inside.
    #[error("[[server.tokens]] '{0}': a token must not contain spaces or control characters")]
    BadCharacter(String),
}

#[derive(Clone)]
struct Entry {
    principal: Principal,
    digest: [u8; 32],
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
    /// The tokens of `[[server.tokens]]`.
    pub fn from_entries(entries: &[TokenEntry]) -> Result<Self, TokenError> {
        let mut tokens = Self::default();
        for entry in entries {
            match (&entry.token, &entry.token_sha256) {
                (Some(token), None) => tokens.add_clear(&entry.name, token)?,
                (None, Some(hex)) => {
                    let digest = parse_hex(hex).ok_or_else(|| TokenError::BadDigest(entry.name.clone()))?;
                    tokens.add(&entry.name, digest)?;
                }
                _ => return Err(TokenError::OneOf(entry.name.clone())),
            }
        }
        Ok(tokens)
    }

    /// Adds a token given in clear. Blanks around it are not part of it
    /// (a presented token is trimmed the same way); a token must be at
    /// least 16 characters without them, and nothing inside it may be a
    /// blank or a control character (a header could not carry it).
    pub fn add_clear(&mut self, name: &str, token: &str) -> Result<(), TokenError> {
        let token = token.trim();
        if token.is_empty() {
            return Err(TokenError::Blank(name.to_string()));
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(TokenError::BadCharacter(name.to_string()));
        }
        if token.chars().count() < 16 {
            return Err(TokenError::TooShort(name.to_string()));
        }
        self.add(name, digest(token))
    }

    fn add(&mut self, name: &str, digest: [u8; 32]) -> Result<(), TokenError> {
        if self.entries.iter().any(|e| e.principal.name() == name) {
            return Err(TokenError::Duplicate(name.to_string()));
        }
        self.entries.push(Entry {
            principal: Principal(name.into()),
            digest,
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
        let presented = digest(presented.trim());
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.digest.ct_eq(&presented)) {
                found = Some(entry.principal.clone());
            }
        }
        found
    }
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
    fn a_token_is_found_by_its_clear_text_or_its_digest() {
        let entries = vec![
            TokenEntry {
                name: "alice".into(),
                token: Some("alice-secret-token-1".into()),
                token_sha256: None,
            },
            TokenEntry {
                name: "bob".into(),
                token: None,
                token_sha256: Some(token_sha256("bob-secret-token-22")),
            },
        ];
        let tokens = Tokens::from_entries(&entries).unwrap();
        assert_eq!(tokens.check("alice-secret-token-1").unwrap().name(), "alice");
        assert_eq!(tokens.check("bob-secret-token-22").unwrap().name(), "bob");
        assert!(tokens.check("bob-secret-token-2").is_none());
        assert!(tokens.check("").is_none());
        assert!(matches!(
            Tokens::from_entries(&[TokenEntry {
                name: "x".into(),
                token: Some("short".into()),
                token_sha256: None
            }]),
            Err(TokenError::TooShort(_))
        ));
    }

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
        tokens.add_clear("default", "  padded-token-0123456789 \n").unwrap();
        assert_eq!(tokens.check("padded-token-0123456789").unwrap().name(), "default");
        assert_eq!(tokens.check(" padded-token-0123456789 ").unwrap().name(), "default");
        assert!(tokens.check("").is_none());
        assert!(tokens.check("   ").is_none());
    }
}
