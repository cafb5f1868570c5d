//! Redaction of secrets in tool output (docs/cli.md, output safety),
//! before the model, the events or the store see it.
//!
//! Two passes. The first removes what is a secret by its shape alone —
//! provider keys, tokens, JWTs, private keys, the password in a connection
//! URL — and the values of this process's environment variables whose names
//! look secret. The second finds assignments whose *name* looks secret
//! (`DB_PASSWORD=…`, `password: …`, `"apiKey": "…"`, in env, INI, TOML, YAML
//! and JSON forms) and redacts the value only, unless the value is plainly
//! not a secret: a placeholder (`${DB_PASSWORD}`), a boolean, code
//! (`args.password`, `get_token()`), or — for names that are often innocent,
//! such as `*_KEY` or `*_TOKEN` — a short or word-like value (`sort_key: name`).

use std::borrow::Cow;
use std::sync::{Arc, Mutex, PoisonError};

use regex::{Captures, Regex};

/// What a secret is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// Shapes of credentials that must never reach the model or the logs. A
/// pattern with a `secret` group redacts that group only; one with a `cred`
/// group redacts it only when it looks like a credential (letters and
/// digits: "Bearer authentication" is prose); otherwise the whole match.
const SECRET_SHAPES: &[&str] = &[
    // OpenAI (sk-, sk-proj-) and Anthropic (sk-ant-) API keys.
    r"\bsk-[A-Za-z0-9_\-]{20,}",
    // GitHub tokens.
    r"gh[pousr]_[A-Za-z0-9]{36,}",
    r"github_pat_[A-Za-z0-9_]{22,}",
    // GitLab, npm and Hugging Face tokens.
    r"glpat-[A-Za-z0-9_\-]{20,}",
    r"\bnpm_[A-Za-z0-9]{36}\b",
    r"\bhf_[A-Za-z0-9]{30,}\b",
    // Stripe secret and restricted keys, webhook secrets.
    r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,}\b",
    r"\bwhsec_[A-Za-z0-9]{20,}\b",
    // AWS access key ids.
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    // Slack tokens and webhooks.
    r"xox[abprs]-[A-Za-z0-9\-]{10,}",
    r"https://hooks\.slack\.com/services/[A-Za-z0-9/_\-]+",
    // Google API keys.
    r"AIza[0-9A-Za-z_\-]{35}",
    // JSON Web Tokens (header and payload are base64url JSON: `eyJ`).
    r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
    // PEM private keys.
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
    // Bearer and Basic credentials in headers or logs (the credential only).
    r"\b(?i:bearer)[ \t]+(?P<cred>[A-Za-z0-9\-._~+/]{8,}=*)",
    r"(?i:authorization:[ \t]*basic)[ \t]+(?P<secret>[A-Za-z0-9+/]{8,}={0,2})",
    // The password of a URL: scheme://user:PASSWORD@host.
    r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@'\x22]*:(?P<secret>[^\s@/'\x22]+)@",
    // Credentials in a URL's query: ?password=…, &access_token=…, signed URLs.
    r"(?i)[?&](?:password|passwd|pwd|pass|secret|client_secret|token|access_token|refresh_token|id_token|api_key|apikey|sig|signature|x-amz-signature|x-amz-security-token|x-amz-credential)=(?P<secret>[^&\s#'\x22<>]+)",
    // XML elements: <password>…</password>.
    r"(?i)<(?:password|passwd|secret|token|api_?key|access_?key|secret_?key|client_?secret)>(?P<secret>[^<\n]+)</",
];

/// AWS secret access keys, bare: a run of exactly 40 base64 characters
/// (checked in `redact`: the run is that long, is not followed by `=`, and
/// mixes capitals, small letters and digits, so git SHAs — hex — and words
/// are not taken). A pass of its own, after the shapes: in their
/// alternation it would start one character earlier than a secret value or
/// a JWT and, leftmost, take that text and give it back unredacted.
const AWS_SECRET_SHAPE: &str = r"(?:^|[^A-Za-z0-9/+=])(?P<aws>[A-Za-z0-9/+]{40,})";

/// Name endings that make an assignment's value a secret whatever it looks like.
const STRONG_NAME: &str = r"password|passwd|_pwd|_pass|passphrase|secret|secret_key_base|credentials?";
/// Name endings that are secret only with a value that looks like one
/// (`sort_key: name` is not; `API_KEY=8f3a…` is).
const WEAK_NAME: &str = r"token|_key|api[_\-]?key|access[_\-]?key|secret[_\-]?key|private[_\-]?key|auth[_\-]?key";

/// Environment variable names that look secret: values of such variables in
/// this process are redacted wherever they appear, and (from the shell tool
/// on) they are not passed to commands.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    const WORDS: &[&str] = &[
        "PASSWORD",
        "PASSWD",
        "PASSPHRASE",
        "SECRET",
        "TOKEN",
        "API_KEY",
        "APIKEY",
        "ACCESS_KEY",
        "PRIVATE_KEY",
        "CREDENTIAL",
    ];
    const ENDINGS: &[&str] = &["_KEY", "_KEY_BASE", "_PWD", "_PASS", "_PAT"];
    WORDS.iter().any(|word| upper.contains(word)) || ENDINGS.iter().any(|ending| upper.ends_with(ending))
}

/// Values shorter than this are not redacted by value (too likely to be ordinary text).
const MIN_SECRET_VALUE_LEN: usize = 8;

/// Values this process was given as secrets, whatever their names and
/// shapes: redacted by value wherever they appear ([`Redactor::from_env`]).
static GIVEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Remembers `values` as secrets of this process — what it was given to
/// pass on: tokens, headers sent with an API key, the environment of the
/// commands and MCP servers it starts — so that every redactor made from
/// now on ([`Redactor::from_env`]) masks them wherever they appear, a
/// value of any shape (a bare AWS secret key, `echo $KEY`) included.
/// Values too short to tell from ordinary text, absolute paths and text
/// with blanks are left out: an `env` entry such as `PATH` is no secret.
pub fn remember_secrets(values: impl IntoIterator<Item = String>) {
    let mut given = GIVEN.lock().unwrap_or_else(PoisonError::into_inner);
    for value in values {
        let plainly_not_secret = value.trim().len() < MIN_SECRET_VALUE_LEN
            || value.starts_with('/')
            || value.chars().any(char::is_whitespace);
        if !plainly_not_secret && !given.contains(&value) {
            given.push(value);
        }
    }
}

/// Replaces secrets in text with `[REDACTED]`.
///
/// Clones share the compiled patterns and their search caches: a `Regex`
/// cloned gets a new, empty cache, which its first search per run would
/// build again (a few hundred thousand instructions each).
#[derive(Debug, Clone)]
pub struct Redactor {
    passes: Option<Arc<Passes>>,
}

/// The patterns compiled for the latest set of secret values, so that an
/// agent built per request (the usual way to embed one) neither compiles
/// them again — milliseconds — nor starts with cold caches. One entry: a
/// process's secrets rarely change, and when they do the new set replaces
/// the old.
static COMPILED: Mutex<Option<(Vec<String>, Arc<Passes>)>> = Mutex::new(None);

#[derive(Debug, Clone)]
struct Passes {
    shapes: Regex,
    aws: Regex,
    assignments: Regex,
}

impl Default for Redactor {
    fn default() -> Self {
        Self::from_env()
    }
}

impl Redactor {
    /// Known secret shapes, secret-looking assignments, the values of
    /// this process's environment variables whose names look secret
    /// ([`is_secret_name`]), and every value this process was given as a
    /// secret ([`remember_secrets`]).
    pub fn from_env() -> Self {
        let values = std::env::vars().filter_map(|(name, value)| is_secret_name(&name).then_some(value));
        let given = GIVEN.lock().unwrap_or_else(PoisonError::into_inner).clone();
        Self::with_secrets(values.chain(given))
    }

    /// Known secret shapes, secret-looking assignments, and the given literal values.
    pub fn with_secrets(values: impl IntoIterator<Item = String>) -> Self {
        let mut values: Vec<String> = values
            .into_iter()
            .filter(|value| value.trim().len() >= MIN_SECRET_VALUE_LEN)
            .collect();
        // Longest first, so a value containing another is removed whole.
        values.sort_by_key(|value| std::cmp::Reverse(value.len()));
        values.dedup();
        if let Some((known, passes)) = COMPILED.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
            if *known == values {
                return Self {
                    passes: Some(Arc::clone(passes)),
                };
            }
        }
        // Compiled without the lock (milliseconds): agents built at once
        // on other threads do not wait for it.
        let passes = Self::compile(&values).map(Arc::new);
        if let Some(passes) = &passes {
            *COMPILED.lock().unwrap_or_else(PoisonError::into_inner) = Some((values, Arc::clone(passes)));
        }
        Self { passes }
    }

    /// The three passes for `values` (sorted longest first), or `None` —
    /// logged — should a pattern fail to build.
    fn compile(values: &[String]) -> Option<Passes> {
        let mut shapes: Vec<String> = values.iter().map(|value| regex::escape(value)).collect();
        // Each shape's group gets its own name in the alternation.
        shapes.extend(SECRET_SHAPES.iter().enumerate().map(|(index, shape)| {
            shape
                .replace("(?P<secret>", &format!("(?P<secret{index}>"))
                .replace("(?P<cred>", &format!("(?P<cred{index}>"))
        }));
        let name = format!(r"[A-Za-z0-9_.\-]*?(?:{STRONG_NAME}|{WEAK_NAME})");
        // A bare value and the character after it: `,`, `;` or `)` after a
        // word is code (`password: String,`), not a setting.
        let value = r#""(?P<dq>[^"\n]*)"|'(?P<sq>[^'\n]*)'|(?P<bare>[^\s#;,"']+)(?P<after>[,;)])?"#;
        let assignments = [
            // env, INI, TOML, YAML: at the start of a line (after `export`,
            // `set` or a YAML list dash), `NAME = value` or `NAME: value`.
            // A line may carry read_file's number (`    12\t`) or grep's
            // place (`path:12: `) first.
            format!(
                r#"(?im)^(?:[ \t]*\d+\t|\S+?:\d+:[ \t]?)?[ \t]*(?:export[ \t]+|set[ \t]+|-[ \t]+)?["']?(?P<name>{name})["']?[ \t]*[:=][ \t]*(?:{value})"#
            ),
            // JSON anywhere: "name": "value".
            format!(r#"(?i)"(?P<jname>{name})"[ \t]*:[ \t]*"(?P<jvalue>[^"\n]*)""#),
        ]
        .join("|");
        match (
            Regex::new(&shapes.join("|")),
            Regex::new(AWS_SECRET_SHAPE),
            Regex::new(&assignments),
        ) {
            (Ok(shapes), Ok(aws), Ok(assignments)) => Some(Passes {
                shapes,
                aws,
                assignments,
            }),
            // The patterns are fixed and the values escaped; should a
            // pattern ever fail to build, say so rather than leak quietly.
            (shapes, aws, assignments) => {
                tracing::error!(shapes = ?shapes.err(), aws = ?aws.err(), assignments = ?assignments.err(), "cannot build the secret patterns; redaction is off");
                None
            }
        }
    }

    /// A redactor that changes nothing.
    pub fn disabled() -> Self {
        Self { passes: None }
    }

    /// `text` with every secret replaced.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let Some(passes) = &self.passes else {
            return Cow::Borrowed(text);
        };
        let shaped = passes.shapes.replace_all(text, |caps: &Captures<'_>| {
            let Some(whole) = caps.get(0) else {
                return String::new();
            };
            // The one group that took part, if the shape has one.
            let group = passes
                .shapes
                .capture_names()
                .flatten()
                .find_map(|name| caps.name(name).map(|found| (name, found)));
            match group {
                Some((name, cred)) if name.starts_with("cred") && !looks_like_credential(cred.as_str()) => {
                    whole.as_str().to_string()
                }
                Some((_, secret)) => splice(whole.as_str(), whole.start(), secret.range()),
                None => REDACTED.to_string(),
            }
        });
        let keyed = match passes.aws.replace_all(&shaped, |caps: &Captures<'_>| {
            let (Some(whole), Some(key)) = (caps.get(0), caps.name("aws")) else {
                return String::new();
            };
            let padded = shaped.get(key.end()..).is_some_and(|rest| rest.starts_with('='));
            if looks_like_aws_secret(key.as_str()) && !padded {
                splice(whole.as_str(), whole.start(), key.range())
            } else {
                whole.as_str().to_string()
            }
        }) {
            Cow::Borrowed(_) => shaped,
            Cow::Owned(done) => Cow::Owned(done),
        };
        match passes.assignments.replace_all(&keyed, redact_assignment) {
            Cow::Borrowed(_) => keyed,
            Cow::Owned(done) => Cow::Owned(done),
        }
    }
}

/// The text of an assignment match, with its value redacted if it is a secret.
fn redact_assignment(caps: &Captures<'_>) -> String {
    let Some(whole) = caps.get(0) else {
        return String::new();
    };
    let name = caps
        .name("name")
        .or_else(|| caps.name("jname"))
        .map_or("", |m| m.as_str());
    let value = ["dq", "sq", "bare", "jvalue"].iter().find_map(|group| caps.name(group));
    let bare = caps.name("bare").is_some();
    let code_after = caps.name("after").is_some() && value.is_some_and(|v| is_identifier(v.as_str()));
    match value {
        Some(value) if !code_after && is_secret_value(name, value.as_str(), bare) => {
            splice(whole.as_str(), whole.start(), value.range())
        }
        _ => whole.as_str().to_string(),
    }
}

/// `whole` (starting at `offset` in the text) with `secret` replaced.
fn splice(whole: &str, offset: usize, secret: std::ops::Range<usize>) -> String {
    let (start, end) = (secret.start - offset, secret.end - offset);
    format!("{}{REDACTED}{}", &whole[..start], &whole[end..])
}

/// Whether `text` is a word of code: a letter or `_`, then letters, digits, `_`.
fn is_identifier(text: &str) -> bool {
    text.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether the word after `Bearer` is a credential rather than prose
/// ("Bearer authentication"): long enough, and not a plain word — it has a
/// digit, a sign, or capitals past its first letter.
fn looks_like_credential(text: &str) -> bool {
    let plain_word =
        text.chars().all(|c| c.is_ascii_alphabetic()) && text.chars().skip(1).all(|c| c.is_ascii_lowercase());
    text.len() >= 8 && !plain_word
}

/// Whether a run of base64 characters is shaped like an AWS secret access
/// key: exactly 40 of them, with capitals, small letters and digits (a git
/// SHA is hex in one case; a path or a word lacks digits or capitals).
fn looks_like_aws_secret(run: &str) -> bool {
    run.len() == 40
        && run.bytes().any(|b| b.is_ascii_uppercase())
        && run.bytes().any(|b| b.is_ascii_lowercase())
        && run.bytes().any(|b| b.is_ascii_digit())
}

/// Type names that follow a field's name in code (`secret: str`).
const TYPE_NAMES: &[&str] = &[
    "string", "str", "bytes", "int", "integer", "number", "bool", "boolean", "any", "object", "float", "double",
    "char", "unknown", "i32", "i64", "u32", "u64", "usize", "f64",
];

/// Whether the value assigned to `name` is a secret (see the module docs).
fn is_secret_value(name: &str, value: &str, bare: bool) -> bool {
    let value = value.trim();
    let lower = value.to_ascii_lowercase();
    let placeholder = value.is_empty()
        || value == REDACTED
        || value.starts_with('$')
        // `password := …` (Go), `password == …`: not a value.
        || value.starts_with('=')
        || value.starts_with("%(")
        || value.starts_with("{{")
        || (value.starts_with('<') && value.ends_with('>'))
        || value.chars().all(|c| c == '*' || c == 'x' || c == 'X');
    let literal = matches!(
        lower.as_str(),
        "true" | "false" | "null" | "none" | "nil" | "yes" | "no" | "on" | "off" | "~"
    );
    // Code on the right of `=`: a call, an index, a dotted name, a type.
    let code = bare
        && (value.contains(['(', ')', '[', ']', '{', '}', '<', '>'])
            || value.starts_with(['&', '*'])
            || value.ends_with(['!', '?'])
            || TYPE_NAMES.contains(&lower.as_str())
            || (value.contains('.')
                && value.split('.').all(|part| {
                    part.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                        && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                })));
    if placeholder || literal || code {
        return false;
    }
    let lower_name = name.to_ascii_lowercase();
    let strong = [
        "password",
        "passwd",
        "_pwd",
        "passphrase",
        "secret",
        "credential",
        "credentials",
    ]
    .iter()
    .any(|ending| lower_name.ends_with(ending));
    if strong {
        return true;
    }
    // A weak name: the value must look like a key, not a word or a number.
    let has_digit = value.chars().any(|c| c.is_ascii_digit());
    let has_letter = value.chars().any(|c| c.is_ascii_alphabetic());
    let long = value.len() >= 20 && !value.contains(char::is_whitespace);
    value.len() >= MIN_SECRET_VALUE_LEN && ((has_digit && has_letter) || long)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redactors_for_the_same_secrets_share_their_patterns() {
        let passes = |redactor: &Redactor| redactor.passes.clone().expect("the patterns build");
        let first = Redactor::with_secrets(vec!["shared-secret-one".to_string()]);
        // Other tests compile other sets meanwhile; the cache keeps the
        // latest, so only a clone is sure to share.
        assert!(Arc::ptr_eq(&passes(&first), &passes(&first.clone())));
        let other = Redactor::with_secrets(vec!["another-secret-two".to_string()]);
        assert!(!Arc::ptr_eq(&passes(&first), &passes(&other)));
        assert_eq!(other.redact("x another-secret-two y"), format!("x {REDACTED} y"));
        assert_eq!(first.redact("x shared-secret-one y"), format!("x {REDACTED} y"));
        let again = Redactor::with_secrets(vec!["another-secret-two".to_string(), "ab".to_string()]);
        assert_eq!(again.redact("another-secret-two ab"), format!("{REDACTED} ab"));
    }

    #[test]
    fn redacts_known_shapes_and_given_values() {
        let redactor = Redactor::with_secrets(vec!["hunter2-but-longer".to_string(), "short".to_string()]);
        let text = format!(
            "openai sk-{} github ghp_{} auth: Bearer abc.def-gh1== aws AKIAABCDEFGHIJKLMNOP pw hunter2-but-longer short",
            "a1".repeat(24),
            "b".repeat(36)
        );
        let out = redactor.redact(&text);
        assert!(!out.contains("sk-a1a1"), "{out}");
        assert!(!out.contains("ghp_bbbb"), "{out}");
        assert!(!out.contains("abc.def"), "{out}");
        assert!(out.contains("Bearer [REDACTED]"), "the scheme stays: {out}");
        assert!(!out.contains("AKIAABCD"), "{out}");
        assert!(!out.contains("hunter2"), "{out}");
        assert!(out.contains("short"), "short values are left alone: {out}");
        assert_eq!(out.matches(REDACTED).count(), 5, "{out}");
        let pem = "x\n-----BEGIN RSA PRIVATE KEY-----\nMIIabc\n-----END RSA PRIVATE KEY-----\ny";
        assert_eq!(redactor.redact(pem), format!("x\n{REDACTED}\ny"));
        assert_eq!(redactor.redact("nothing secret"), "nothing secret");
    }

    #[test]
    fn assignments_lose_their_values_and_keep_their_names() {
        let redactor = Redactor::with_secrets(Vec::new());
        for (text, expected) in [
            ("DB_PASSWORD=hunter2", "DB_PASSWORD=[REDACTED]"),
            ("export API_TOKEN=\"a1b2c3d4e5f6\"", "export API_TOKEN=\"[REDACTED]\""),
            ("  password: 'correct horse'", "  password: '[REDACTED]'"),
            (
                "{\"clientSecret\": \"s3cr3t\", \"id\": 4}",
                "{\"clientSecret\": \"[REDACTED]\", \"id\": 4}",
            ),
            (
                "postgres://app:pa55w0rd@db:5432/x",
                "postgres://app:[REDACTED]@db:5432/x",
            ),
            // A Redis URL: a password alone, or an ACL user's.
            (
                "LOOM_REDIS_URL=redis://:hunter2-pass@10.0.0.1:6379/0",
                "LOOM_REDIS_URL=redis://:[REDACTED]@10.0.0.1:6379/0",
            ),
            (
                "rediss://loom:s3cr3t-acl@cache:6380/1",
                "rediss://loom:[REDACTED]@cache:6380/1",
            ),
            // Left alone: placeholders, code, words, numbers.
            ("password: ${DB_PASSWORD}", "password: ${DB_PASSWORD}"),
            ("    password = args.password", "    password = args.password"),
            ("    token = lexer.next_token()", "    token = lexer.next_token()"),
            ("sort_key: name", "sort_key: name"),
            ("max_token = 4096", "max_token = 4096"),
            ("cache_key = user_profile_cache", "cache_key = user_profile_cache"),
            ("    password: String,", "    password: String,"),
            (
                "    password := r.FormValue(\"p\")",
                "    password := r.FormValue(\"p\")",
            ),
            (
                "scheme: bearer\n  bearerFormat: JWT",
                "scheme: bearer\n  bearerFormat: JWT",
            ),
            (
                "It provides basic functionality here.",
                "It provides basic functionality here.",
            ),
            // As read_file and grep show lines.
            ("     3\tDB_PASSWORD=hunter2", "     3\tDB_PASSWORD=[REDACTED]"),
            (
                "config/.env:7: SECRET_KEY=9f8e7d6c5b4a",
                "config/.env:7: SECRET_KEY=[REDACTED]",
            ),
        ] {
            assert_eq!(redactor.redact(text), expected, "{text}");
        }
    }

    #[test]
    fn a_bare_base64_run_never_shields_a_secret_value_or_a_jwt() {
        let value = "0123456789abcdef".repeat(4);
        let redactor = Redactor::with_secrets(vec![value.clone()]);
        let jwt = format!("eyJ{}.eyJ{}.{}", "a".repeat(49), "b".repeat(20), "c".repeat(20));
        for text in [
            format!("token: {value}"),
            format!("{value}\n"),
            format!("x {jwt}"),
            format!("\n{jwt}"),
        ] {
            let out = redactor.redact(&text);
            assert!(!out.contains(&value) && !out.contains(&jwt), "{text} -> {out}");
            assert!(out.contains(REDACTED), "{out}");
        }
    }

    #[test]
    fn bare_aws_secret_keys_are_redacted_and_look_alikes_are_not() {
        let redactor = Redactor::with_secrets(Vec::new());
        let key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
        for text in [
            format!(r#"{{"value": "{key}"}}"#),
            key.to_string(),
            format!("aws {key} in the middle"),
            format!("'{key}',"),
            format!("keys: {key} {key}"),
            format!("line one\n{key}\nline three"),
        ] {
            let out = redactor.redact(&text);
            assert!(!out.contains(key), "{text} -> {out}");
            assert!(!out.contains("EXAMPLEKEY"), "{text} -> {out}");
        }
        assert_eq!(
            redactor.redact(&format!(r#"{{"value": "{key}"}}"#)),
            r#"{"value": "[REDACTED]"}"#
        );
        for kept in [
            // A git SHA (hex), in either case.
            "commit 3f786850e387550fdab836ed7e6dc881de23001b".to_string(),
            "3F786850E387550FDAB836ED7E6DC881DE23001B".to_string(),
            // Words and paths without digits or capitals.
            "abcdefghijklmnopqrstuvwxyzabcdefghijklmn".to_string(),
            "/usr/local/share/applications/something/else".to_string(),
            // 39 and 41 characters, and base64 padded with `=`.
            key[..39].to_string(),
            format!("{key}A"),
            format!("{key}=="),
            // Longer base64 (a PEM body line, a blob).
            "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7".to_string(),
        ] {
            assert_eq!(redactor.redact(&kept), kept, "{kept}");
        }
    }

    #[test]
    fn secret_names() {
        for name in [
            "DB_PASSWORD",
            "GITHUB_TOKEN",
            "AWS_SECRET_ACCESS_KEY",
            "OPENAI_API_KEY",
            "MY_PWD",
            "GH_PAT",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in [
            "PATH",
            "HOME",
            "PWD",
            "OLDPWD",
            "KEYBOARD",
            "LANG",
            "TERM",
            "SSH_AUTH_SOCK",
        ] {
            assert!(!is_secret_name(name), "{name}");
        }
    }
}
