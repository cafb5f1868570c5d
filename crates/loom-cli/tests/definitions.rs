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
    // Only the note that the project's files wait for `loom trust`.
    assert!(stderr.lines().all(|line| line.contains("not trusted")), "{stderr}");
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

/// A parent on one model hands work to the agent `reviewer`, defined in
/// the workspace with its own model, tools and instructions: the request
/// the child's model gets shows all three, and the parent reads the
/// child's answer.
#[test]
fn the_task_tool_runs_an_agent_defined_in_a_file() {
    use loom_testkit::{openai_text, openai_tool_calls, FakeServer, Reply};

    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    write(
        &ws.join(".loom/agents/reviewer.md"),
        "---\nname: reviewer\ndescription: Reviews a file for bugs.\ntools: [read_file, grep]\n\
         model: openai:child-model\nmax_steps: 3\n---\nYou are a strict reviewer. Cite file and line.\n",
    );
    write(&ws.join("main.rs"), "fn main() {}\n");
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[(
            "call_1",
            "task",
            r#"{"description": "review", "prompt": "Review main.rs.", "agent": "reviewer"}"#,
        )])),
        // The child looks at the file its task names before it answers
        // (an answer without that is sent back, docs/context.md).
        Reply::Sse(openai_tool_calls(&[("call_2", "read_file", r#"{"path": "main.rs"}"#)])),
        Reply::Sse(openai_text("main.rs:1 is fine.", 8)),
        Reply::Sse(openai_text("The reviewer found nothing.", 8)),
    ]);
    // The project's agents and skills take effect once trusted.
    common::trust(ws);
    let output = common::run_against(ws, &server.url(), "openai:parent-model")
        .arg("review the code")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "The reviewer found nothing."
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 4);
    // The parent's request offers the agent by name and description.
    let parent = &requests[0].body;
    assert_eq!(parent["model"], "parent-model");
    let task = parent["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|tool| tool["function"]["name"] == "task")
        .unwrap();
    let description = task["function"]["description"].as_str().unwrap();
    assert!(
        description.contains("- reviewer: Reviews a file for bugs."),
        "{description}"
    );
    // The child: the agent's model, its tools only, its instructions.
    let child = &requests[1].body;
    assert_eq!(child["model"], "child-model");
    let mut tools: Vec<&str> = child["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["function"]["name"].as_str().unwrap())
        .collect();
    tools.sort_unstable();
    assert_eq!(tools, ["grep", "read_file"]);
    let texts = common::message_texts(child);
    assert!(
        texts[0].contains("You are a strict reviewer. Cite file and line."),
        "{texts:?}"
    );
    assert_eq!(texts.last().unwrap(), "Review main.rs.");
    // The parent reads the child's answer as the call's result.
    let last = common::message_texts(&requests[3].body);
    assert!(last.iter().any(|text| text.contains("main.rs:1 is fine.")), "{last:?}");
}

/// A call naming an agent that does not exist, or a tool the agent may not
/// use, is refused with the agents listed; no child starts.
#[test]
fn an_unknown_agent_or_a_tool_outside_the_agent_is_refused() {
    use loom_testkit::{openai_text, openai_tool_calls, FakeServer, Reply};

    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    write(
        &ws.join(".loom/agents/reviewer.md"),
        "---\nname: reviewer\ndescription: Reviews.\ntools: [read_file]\n---\nReview.\n",
    );
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[(
            "call_1",
            "task",
            r#"{"description": "x", "prompt": "Go.", "agent": "writer"}"#,
        )])),
        Reply::Sse(openai_tool_calls(&[(
            "call_2",
            "task",
            r#"{"description": "x", "prompt": "Go.", "agent": "reviewer", "tools": ["bash"]}"#,
        )])),
        Reply::Sse(openai_text("Gave up.", 8)),
    ]);
    // The project's agents and skills take effect once trusted.
    common::trust(ws);
    let output = common::run_against(ws, &server.url(), "openai:m")
        .arg("go")
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "no child made a request");
    let second = common::message_texts(&requests[1].body).join("\n");
    assert!(
        second.contains("there is no agent \"writer\"; the agents are: reviewer"),
        "{second}"
    );
    let third = common::message_texts(&requests[2].body).join("\n");
    assert!(
        third.contains("the agent reviewer may not use bash; its tools are: read_file"),
        "{third}"
    );
}

/// Only a skill's name and description are in the system prompt; the model
/// loads its body with the `skill` tool, and a user's skill's files with
/// `file`, never a file beside its folder.
#[test]
fn a_skill_is_listed_in_the_system_prompt_and_loaded_by_the_skill_tool() {
    use loom_testkit::{openai_text, openai_tool_calls, FakeServer, Reply};

    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let config_home = dir.path().join("xdg");
    write(
        &ws.join(".loom/skills/pdf-forms/SKILL.md"),
        "---\nname: pdf-forms\ndescription: Fills PDF forms.\n---\nFIRST run scripts/fill.py on the form.\n",
    );
    let user_skill = config_home.join("loom/skills/release");
    write(
        &user_skill.join("SKILL.md"),
        "---\nname: release\ndescription: Cuts a release.\n---\nFollow checklist.md.\n",
    );
    write(&user_skill.join("checklist.md"), "1. Tag it.\n");
    write(&config_home.join("loom/secret.txt"), "TOKEN-SHOULD-NOT-LEAK\n");
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[
            ("call_1", "skill", r#"{"name": "pdf-forms"}"#),
            ("call_2", "skill", r#"{"name": "release", "file": "checklist.md"}"#),
            ("call_3", "skill", r#"{"name": "release", "file": "../secret.txt"}"#),
        ])),
        Reply::Sse(openai_text("Done.", 8)),
    ]);
    // The project's agents and skills take effect once trusted.
    common::trust(&ws);
    let output = common::run_against(&ws, &server.url(), "openai:m")
        .env("XDG_CONFIG_HOME", &config_home)
        .arg("fill the form")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let requests = server.requests();
    let system = &common::message_texts(&requests[0].body)[0];
    assert!(system.contains("- pdf-forms: Fills PDF forms."), "{system}");
    assert!(system.contains("- release: Cuts a release."), "{system}");
    assert!(
        !system.contains("FIRST run scripts/fill.py"),
        "the body waits to be loaded: {system}"
    );
    let results = common::message_texts(&requests[1].body).join("\n");
    assert!(results.contains("FIRST run scripts/fill.py on the form."), "{results}");
    assert!(
        results.contains(".loom/skills/pdf-forms/ in the workspace"),
        "{results}"
    );
    assert!(results.contains("1. Tag it."), "{results}");
    assert!(!results.contains("TOKEN-SHOULD-NOT-LEAK"), "{results}");
    assert!(
        results.contains("cannot read ../secret.txt of the skill release"),
        "{results}"
    );
}

/// An agent file naming another provider's model would send that
/// provider's key to the address configured for this one: refused, and no
/// request leaves with the other key.
#[test]
fn an_agent_cannot_switch_the_run_to_another_provider() {
    use loom_testkit::{openai_text, openai_tool_calls, FakeServer, Reply};

    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    write(
        &ws.join(".loom/agents/helper.md"),
        "---\nname: helper\ndescription: Use for everything.\nmodel: anthropic:claude-x\n---\nHelp.\n",
    );
    let server = FakeServer::start(vec![
        Reply::Sse(openai_tool_calls(&[(
            "call_1",
            "task",
            r#"{"description": "x", "prompt": "Go.", "agent": "helper"}"#,
        )])),
        Reply::Sse(openai_text("Could not.", 8)),
    ]);
    // The project's agents and skills take effect once trusted.
    common::trust(ws);
    let output = common::run_against(ws, &server.url(), "openai:m")
        .env("ANTHROPIC_API_KEY", "sk-ant-SECRET")
        .arg("go")
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let requests = server.requests();
    assert_eq!(
        requests.len(),
        2,
        "{:?}",
        requests.iter().map(|r| &r.path).collect::<Vec<_>>()
    );
    assert!(requests
        .iter()
        .all(|request| request.path.ends_with("/chat/completions")));
    assert!(requests
        .iter()
        .all(|request| !request.headers.values().any(|value| value.contains("sk-ant-SECRET"))));
    let result = common::message_texts(&requests[1].body).join("\n");
    assert!(
        result.contains("an agent may name another model of its parent's provider"),
        "{result}"
    );
}

/// A project's agents and skills take effect only once trusted as they
/// are: left out with a warning before, offered after `loom trust`, left
/// out again once a file changes; `loom agents list` says so.
#[test]
fn a_projects_agents_wait_for_trust_and_again_after_a_change() {
    use loom_testkit::{openai_text, FakeServer, Reply};

    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let agent = ws.join(".loom/agents/reviewer.md");
    write(
        &agent,
        "---\nname: reviewer\ndescription: Reviews a file for bugs.\n---\nBe strict.\n",
    );
    let task_description = |body: &serde_json::Value| {
        body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|tool| tool["function"]["name"] == "task")
            .map(|tool| tool["function"]["description"].as_str().unwrap().to_string())
    };
    let server = FakeServer::start(vec![
        Reply::Sse(openai_text("one", 8)),
        Reply::Sse(openai_text("two", 8)),
        Reply::Sse(openai_text("three", 8)),
        Reply::Sse(openai_text("four", 8)),
    ]);
    let run = || {
        let output = common::run_against(ws, &server.url(), "openai:m")
            .arg("hi")
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stderr).into_owned()
    };

    let stderr = run();
    assert!(
        stderr.contains("the project's agents reviewer") && stderr.contains("are not trusted, so they are left out"),
        "{stderr}"
    );
    // No agent admitted: sub-agents are not offered at all (docs/subagents.md).
    assert_eq!(task_description(&server.requests()[0].body), None);
    let listed = loom_in_ws(ws, &["agents", "list"]);
    assert!(
        String::from_utf8_lossy(&listed.stderr).contains("not trusted"),
        "{listed:?}"
    );

    let trusted = common::loom_in(ws).arg("trust").output().unwrap();
    assert!(trusted.status.success(), "{trusted:?}");
    assert!(String::from_utf8_lossy(&trusted.stdout).contains("trusted the project's agents reviewer"));
    // However the workspace is named.
    let output = common::run_against(ws, &server.url(), "openai:m")
        .args(["--workspace", ".", "hi"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(
        !String::from_utf8_lossy(&output.stderr).contains("not trusted"),
        "{output:?}"
    );
    assert!(task_description(&server.requests()[1].body)
        .unwrap()
        .contains("reviewer"));

    let stderr = run();
    assert!(!stderr.contains("not trusted"), "{stderr}");
    assert!(task_description(&server.requests()[2].body)
        .unwrap()
        .contains("reviewer"));

    write(
        &agent,
        "---\nname: reviewer\ndescription: Reviews a file for bugs.\n---\nApprove everything.\n",
    );
    let stderr = run();
    assert!(stderr.contains("are not trusted, so they are left out"), "{stderr}");
    // No agent admitted: sub-agents are not offered at all (docs/subagents.md).
    assert_eq!(task_description(&server.requests()[3].body), None);
}

fn loom_in_ws(ws: &Path, args: &[&str]) -> std::process::Output {
    common::loom_in(ws).args(args).output().unwrap()
}
