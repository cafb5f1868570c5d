//! A Redis URL as Loom shows it (in logs, errors and the worker's start
//! line): every form that can carry a password — `redis://user:PASS@host`,
//! `redis://:PASS@host`, `rediss://…`, `redis+unix:///PATH?pass=PASS`,
//! `unix:///PATH?password=PASS` — with the password replaced by
//! `[REDACTED]` (docs/security.md). The one function every place that
//! prints a Redis URL goes through.

/// What a password is replaced with (as in tool output, loom-core's redactor).
const REDACTED: &str = loom_core::pipeline::REDACTED;

/// Query parameters shown as written: the database, the protocol, the
/// user name. Any other is hidden whole, its name too: a password holding
/// an unescaped `?` or `&` would otherwise show a piece of itself as a
/// parameter's name.
const SHOWN_PARAMETERS: [&str; 3] = ["db", "protocol", "user"];

/// Query parameters that carry a password: shown by name, the value hidden.
const SECRET_PARAMETERS: [&str; 2] = ["pass", "password"];

/// `url` without any password it carries: the password of its user info
/// (`redis://user:[REDACTED]@host`; user info without a `:` is hidden
/// whole, as a password written in the user's place would be), the value
/// of `pass=` / `password=` and of any parameter not known to be harmless,
/// a fragment other than `#insecure`. A text that is not a URL is judged by
/// the same rules: nothing that could be a password shows.
pub fn redacted_url(url: &str) -> String {
    let mut shown = String::with_capacity(url.len() + REDACTED.len());
    let rest = match url.split_once("://") {
        Some((scheme, rest)) => {
            shown.push_str(scheme);
            shown.push_str("://");
            rest
        }
        None => url,
    };
    // A socket's path (`redis+unix:///PATH`) comes with no user info. Else
    // the user info ends at the last `@` of all: a host, a port, a database
    // never hold one, and a password may hold an `@`, a `?`, an `&` or a
    // `#` of its own, unescaped.
    let rest = match rest.rfind('@').filter(|_| !rest.starts_with('/')) {
        Some(at) => {
            match rest[..at].split_once(':') {
                Some((user, _password)) => {
                    shown.push_str(user);
                    shown.push(':');
                    shown.push_str(REDACTED);
                }
                None => shown.push_str(REDACTED),
            }
            shown.push('@');
            &rest[at + 1..]
        }
        None => rest,
    };
    let (body, fragment) = match rest.split_once('#') {
        Some((body, fragment)) => (body, Some(fragment)),
        None => (rest, None),
    };
    let (place, query) = match body.split_once('?') {
        Some((place, query)) => (place, Some(query)),
        None => (body, None),
    };
    shown.push_str(place);
    if let Some(query) = query {
        shown.push('?');
        let parameters: Vec<String> = query.split('&').map(shown_parameter).collect();
        shown.push_str(&parameters.join("&"));
    }
    if let Some(fragment) = fragment {
        shown.push('#');
        shown.push_str(if fragment == "insecure" { fragment } else { REDACTED });
    }
    shown
}

/// One `name=value` of a query, as [`redacted_url`] shows it.
fn shown_parameter(parameter: &str) -> String {
    match parameter.split_once('=') {
        Some((name, _)) if SHOWN_PARAMETERS.contains(&name) => parameter.to_string(),
        Some((name, _)) if SECRET_PARAMETERS.iter().any(|secret| name.eq_ignore_ascii_case(secret)) => {
            format!("{name}={REDACTED}")
        }
        _ if parameter.is_empty() => String::new(),
        _ => REDACTED.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every form a Redis URL takes, each with a password: `SECRETPW`, or
    /// `SECRET` and `PW` with a character between that the URL's syntax
    /// uses.
    const FORMS: [(&str, &str); 17] = [
        (
            "redis://:SECRETPW@10.0.0.1:6379/0",
            "redis://:[REDACTED]@10.0.0.1:6379/0",
        ),
        (
            "redis://loom:SECRETPW@cache:6379/2",
            "redis://loom:[REDACTED]@cache:6379/2",
        ),
        (
            "rediss://loom:SECRETPW@cache:6380/1",
            "rediss://loom:[REDACTED]@cache:6380/1",
        ),
        (
            "rediss://:SECRETPW@cache:6380/1#insecure",
            "rediss://:[REDACTED]@cache:6380/1#insecure",
        ),
        // A password written where the user goes.
        ("redis://SECRETPW@cache:6379", "redis://[REDACTED]@cache:6379"),
        // A password holding an `@`, `?`, `&`, `#` or `/`, unescaped.
        ("redis://:SECRET@PW@cache:6379/0", "redis://:[REDACTED]@cache:6379/0"),
        ("redis://:SECRET?PW@cache:6379", "redis://:[REDACTED]@cache:6379"),
        ("redis://:SE&CRET?P&W@cache/1", "redis://:[REDACTED]@cache/1"),
        ("redis://:SECRET#PW@cache", "redis://:[REDACTED]@cache"),
        ("redis://:SECRET/PW@cache", "redis://:[REDACTED]@cache"),
        (
            "redis+unix:///run/redis.sock?pass=SECRETPW",
            "redis+unix:///run/redis.sock?pass=[REDACTED]",
        ),
        (
            "redis+unix:///run/a@b.sock?db=3&user=loom&pass=SECRETPW&protocol=resp3",
            "redis+unix:///run/a@b.sock?db=3&user=loom&pass=[REDACTED]&protocol=resp3",
        ),
        (
            "unix:///run/redis.sock?password=SECRETPW",
            "unix:///run/redis.sock?password=[REDACTED]",
        ),
        (
            "valkey+unix:///run/redis.sock?PASS=SECRETPW",
            "valkey+unix:///run/redis.sock?PASS=[REDACTED]",
        ),
        (
            "redis+unix:///run/redis.sock?pass=SECRET&PW&db=1",
            "redis+unix:///run/redis.sock?pass=[REDACTED]&[REDACTED]&db=1",
        ),
        (
            "redis+unix:///run/redis.sock?pass=SECRET#PW",
            "redis+unix:///run/redis.sock?pass=[REDACTED]#[REDACTED]",
        ),
        // A parameter not known to be harmless is hidden, its name too.
        (
            "redis://cache:6379/0?SECRETPW=1&db=1",
            "redis://cache:6379/0?[REDACTED]&db=1",
        ),
    ];

    #[test]
    fn no_form_of_redis_url_shows_its_password() {
        for (url, shown) in FORMS {
            let redacted = redacted_url(url);
            assert_eq!(redacted, shown, "{url}");
            assert!(
                !redacted.contains("SECRET") && !redacted.contains("PW"),
                "{url} showed as {redacted}"
            );
        }
    }

    /// Tool output (loom-core's redactor, with patterns of its own for any
    /// URL) hides the password of every form too.
    #[test]
    fn the_tool_output_redactor_hides_the_same_passwords() {
        let redactor = loom_core::Redactor::with_secrets(Vec::new());
        for url in [
            "redis://:SECRETPW@10.0.0.1:6379/0",
            "rediss://loom:SECRETPW@cache:6380/1",
            "redis+unix:///run/redis.sock?pass=SECRETPW",
            "redis+unix:///run/redis.sock?db=3&pass=SECRETPW",
            "unix:///run/redis.sock?password=SECRETPW",
        ] {
            let redacted = redactor.redact(url);
            assert!(!redacted.contains("SECRETPW"), "{url} showed as {redacted}");
        }
    }

    #[test]
    fn a_url_without_a_password_shows_whole() {
        for url in [
            "redis://127.0.0.1:6379/0",
            "rediss://cache:6380/1#insecure",
            "redis+unix:///run/redis.sock?db=2",
            "unix:///run/redis.sock",
            "redis://[::1]:6379/?protocol=resp3",
        ] {
            assert_eq!(redacted_url(url), url);
        }
    }
}
