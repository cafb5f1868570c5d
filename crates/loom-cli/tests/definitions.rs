//! `loom agents list` and `loom skills list` through the binary: what the
//! workspace's `.loom/` and the user's config folder define, broken files
//! named with their line and key, and links out of the project never read.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use std::path::Path;

use common::loom;
use serde_json::Value;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A workspace, a user config folder (as `XDG_CONFIG_HOME`), and a secret
/// beside them that a link in the workspace points at.
struct Places {
    workspace: tempfile::TempDir,
    config_home: tempfile::TempDir,
    outside: tempfile::TempDir,
}

fn places() -> Places {
    let places = Places {
        workspace: tempfile::tempdir().unwrap(),
        config_home: tempfile::tempdir().unwrap(),
        outside: tempfile::tempdir().unwrap(),
    };
    let ws = places.workspace.path();
    let user = places.config_home.path().join("loom");
    write(
        &ws.join(".loom/agents/reviewer.md"),
        "---\nname: reviewer\ndescription: The project's reviewer.\ntools: read_file, grep\ncolor: blue\n---\nReview.\n",
    );
    write(
        &ws.join(".loom/agents/broken.md"),
        "---\nname: broken\ndescription: d\nmax_steps: lots\n---\nGo.\n",
    );
    write(
        &user.join("agents/reviewer.md"),
        "---\nname: reviewer\ndescription: The user's reviewer.\n---\nReview.\n",
    );
    write(
        &user.join("agents/writer.md"),
        "---\nname: writer\ndescription: \"Writes\\u001b[2J docs\"\nmodel: openai:gpt-4o-mini\nmax_steps: 4\n---\nWrite.\n",
    );
    write(
        &ws.join(".loom/skills/pdf-forms/SKILL.md"),
        "---\nname: pdf-forms\ndescription: Fills PDF forms.\nlicense: MIT\n---\nRun scripts/fill.py.\n",
    );
    let secret = places.outside.path().join("id_rsa.md");
    write(&secret, "---\nname: stolen\ndescription: d\n---\nBEGIN PRIVATE KEY\n");
    std::os::unix::fs::symlink(&secret, ws.join(".loom/agents/stolen.md")).unwrap();
    places
}

fn list(places: &Places, what: &str, json: bool) -> (Option<i32>, String, String) {
    let mut cmd = loom();
    cmd.args([what, "list", "--workspace"]).arg(places.workspace.path());
    if json {
        cmd.arg("--json");
    }
    let out = cmd.env("XDG_CONFIG_HOME", places.config_home.path()).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn agents_are_listed_with_what_is_wrong_in_a_broken_file() {
    let places = places();
    let (code, stdout, stderr) = list(&places, "agents", false);
    assert_eq!(code, Some(1), "a file did not load: {stdout}{stderr}");
    // The workspace's reviewer hides the user's; the user's writer is there.
    assert!(stdout.contains("reviewer  The project's reviewer."), "{stdout}");
    assert!(!stdout.contains("The user's reviewer"), "{stdout}");
    assert!(
        stdout.contains("tools: read_file, grep") && stdout.contains("ignored keys: color"),
        "{stdout}"
    );
    assert!(stdout.contains("writer  Writes\\u{1b}[2J docs"), "escaped: {stdout}");
    assert!(
        stdout.contains("model: openai:gpt-4o-mini") && stdout.contains("max_steps: 4"),
        "{stdout}"
    );
    // The broken file: its line and key.
    assert!(
        stderr.contains("broken.md: line 4: ") && stderr.contains("(key `max_steps`)"),
        "{stderr}"
    );
    // The link out of the project: named, never read.
    assert!(stderr.contains("stolen.md: cannot be read"), "{stderr}");
    assert!(!stdout.contains("PRIVATE KEY") && !stderr.contains("PRIVATE KEY"));
    assert!(!stdout.contains("stolen"), "{stdout}");
}

#[test]
fn the_json_listing_has_each_agent_and_each_problem() {
    let places = places();
    let (code, stdout, _) = list(&places, "agents", true);
    assert_eq!(code, Some(1));
    let listing: Value = serde_json::from_str(&stdout).unwrap();
    let names: Vec<_> = listing["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["reviewer", "writer"]);
    assert_eq!(listing["agents"][0]["tools"], serde_json::json!(["read_file", "grep"]));
    assert_eq!(listing["agents"][1]["maxSteps"], 4);
    let problems = listing["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert_eq!(problems[0]["line"], 4);
    assert_eq!(problems[0]["key"], "max_steps");
}

#[test]
fn skills_are_listed_and_a_clean_listing_exits_0() {
    let places = places();
    let (code, stdout, stderr) = list(&places, "skills", false);
    // The broken agents are the agents listing's business, not this one's.
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    assert!(stdout.contains("pdf-forms  Fills PDF forms."), "{stdout}");
    assert!(stdout.contains(".loom/skills/pdf-forms/SKILL.md"), "{stdout}");
    let empty = tempfile::tempdir().unwrap();
    let out = loom()
        .args(["skills", "list", "--workspace"])
        .arg(empty.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("no skills"));
}
