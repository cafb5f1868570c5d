//! Trust in a project's agents and skills (docs/security.md): the files in
//! a workspace's `.loom/agents/` and `.loom/skills/` came with the project
//! and change what the model is told and may do, so they take effect only
//! once a person trusted them as they are — `loom trust`, or a yes at the
//! prompt of `loom run`/`loom chat` on a terminal — and again after any
//! change. Untrusted, they are left out with a warning. `loom serve` and
//! `loom worker` never read them: their agents and skills are the
//! operator's own (`~/.config/loom/`).

use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};

use anyhow::Result;
use loom::tools::definitions::Definitions;

use crate::trust_records::{is_trusted, record, sha256_hex, Trusted};

/// Where the trust of `workspace`'s definitions is recorded: its `.loom`,
/// the workspace resolved.
fn key(workspace: &Path) -> PathBuf {
    workspace
        .canonicalize()
        .unwrap_or_else(|_| workspace.to_path_buf())
        .join(".loom")
}

/// SHA-256 of what the project's definitions say — each file's path in the
/// project (however the workspace was named) and every field that takes
/// effect — or `None` when the project defines none.
pub(crate) fn digest(found: &Definitions) -> Option<String> {
    let mut text = String::new();
    for agent in found.agents.iter().filter(|agent| agent.place.is_workspace()) {
        let d = &agent.definition;
        text.push_str(&format!(
            "agent\0{}\0{}\0{}\0{:?}\0{:?}\0{:?}\0{}\0\0",
            agent
                .path
                .strip_prefix(&agent.place.root)
                .unwrap_or(&agent.path)
                .display(),
            d.name,
            d.description,
            d.tools,
            d.model,
            d.max_steps,
            d.instructions
        ));
    }
    for skill in found.skills.iter().filter(|skill| skill.place.is_workspace()) {
        let d = &skill.definition;
        text.push_str(&format!(
            "skill\0{}\0{}\0{}\0{}\0\0",
            skill
                .path
                .strip_prefix(&skill.place.root)
                .unwrap_or(&skill.path)
                .display(),
            d.name,
            d.description,
            d.body
        ));
    }
    (!text.is_empty()).then(|| sha256_hex(text.as_bytes()))
}

/// The project's names, for a person to read.
fn names(found: &Definitions) -> String {
    let agents: Vec<&str> = found
        .agents
        .iter()
        .filter(|agent| agent.place.is_workspace())
        .map(|agent| agent.definition.name.as_str())
        .collect();
    let skills: Vec<&str> = found
        .skills
        .iter()
        .filter(|skill| skill.place.is_workspace())
        .map(|skill| skill.definition.name.as_str())
        .collect();
    let mut parts = Vec::new();
    if !agents.is_empty() {
        parts.push(format!("agents {}", agents.join(", ")));
    }
    if !skills.is_empty() {
        parts.push(format!("skills {}", skills.join(", ")));
    }
    crate::text::shown(&parts.join("; "))
}

fn without_project(mut found: Definitions) -> Definitions {
    found.agents.retain(|agent| !agent.place.is_workspace());
    found.skills.retain(|skill| !skill.place.is_workspace());
    found
}

/// What of `found` takes effect for a run in `workspace`: everything from
/// the user's folder; the project's only when trusted as it is (asked on a
/// terminal) and never for a gateway (`serving`). Returns the trust given
/// at the prompt, for the audit trail.
pub(crate) fn admitted(found: Definitions, workspace: &Path, serving: bool) -> Result<(Definitions, Option<Trusted>)> {
    let Some(digest) = digest(&found) else {
        return Ok((found, None));
    };
    if serving {
        tracing::info!(
            "the workspace's .loom/agents and .loom/skills are not read by a gateway: its own are in ~/.config/loom"
        );
        return Ok((without_project(found), None));
    }
    let key = key(workspace);
    if is_trusted(&key, &digest)? {
        return Ok((found, None));
    }
    let names = names(&found);
    if std::io::stdin().is_terminal() && std::io::stderr().is_terminal() {
        say_partial!(
            "loom: the project's {names} (in {}) are not trusted yet; they change what the model is told and may do.\nTrust them as they are now? [y/N] ",
            key.display()
        );
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if matches!(answer.trim(), "y" | "Y" | "yes") {
            record(&key, &digest)?;
            let trusted = Trusted::new(key, digest, "prompt");
            return Ok((found, Some(trusted)));
        }
    } else {
        say!(
            "loom: warning: the project's {names} (in {}) are not trusted, so they are left out; read them, then run `loom trust` in {}",
            key.display(),
            workspace.display()
        );
    }
    Ok((without_project(found), None))
}

/// Whether what the project defines in `found` takes effect for `loom
/// run` in `workspace` as it is (true when it defines nothing).
pub(crate) fn trusted(found: &Definitions, workspace: &Path) -> Result<bool> {
    match digest(found) {
        Some(digest) => is_trusted(&key(workspace), &digest),
        None => Ok(true),
    }
}

/// `loom trust` in `dir`: records the project's definitions as they are
/// now; `None` when it has none.
pub(crate) fn trust(dir: &Path) -> Result<Option<(Trusted, String)>> {
    let found = loom::tools::definitions::discover(&[loom::tools::definitions::Place::workspace(dir)]);
    let Some(digest) = digest(&found) else {
        return Ok(None);
    };
    let key = key(dir);
    record(&key, &digest)?;
    Ok(Some((Trusted::new(key, digest, "loom trust"), names(&found))))
}
