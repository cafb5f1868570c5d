//! The redaction corpus (`loom_testkit::redaction`) through the pipeline's
//! redactor: every secret goes, every look-alike stays. The same corpus is
//! checked end to end — in the events and in what the provider receives —
//! by `loom-cli/tests/redaction.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use loom::Redactor;
use loom_testkit::redaction::CORPUS;

#[test]
fn the_corpus_is_large_and_has_both_kinds() {
    let secrets = CORPUS.iter().filter(|case| case.secret.is_some()).count();
    assert!(CORPUS.len() >= 40, "{} cases", CORPUS.len());
    assert!(secrets >= 25 && CORPUS.len() - secrets >= 15, "{secrets} secrets");
}

#[test]
fn every_secret_goes_and_every_look_alike_stays() {
    let redactor = Redactor::with_secrets(Vec::new());
    let mut failures = Vec::new();
    for case in CORPUS {
        let out = redactor.redact(case.text);
        let ok = match case.secret {
            Some(secret) => !out.contains(secret) && out.contains(case.kept) && out.contains("[REDACTED]"),
            None => out == case.text,
        };
        if !ok {
            failures.push(format!("{}: {:?} -> {:?}", case.name, case.text, out));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
