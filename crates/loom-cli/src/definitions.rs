//! `loom agents list` and `loom skills list` (docs/agents.md): what the
//! workspace's `.loom/` and the user's `~/.config/loom/` define, and what
//! is wrong with each file that did not load, by line and key.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use loom::tools::definitions::{discover, Definitions, Kind, Place, Problem};
use serde_json::json;

use crate::cli::{DefinitionsArgs, DefinitionsCommand};
use crate::exit::{self, Failure};
use crate::text::{clip, shown};

/// The places read, the workspace's first (its names hide the user's).
pub(crate) fn places(workspace: &Path) -> Vec<Place> {
    let mut places = vec![Place::workspace(workspace)];
    if let Some(dir) = crate::config::user_config_dir() {
        places.push(Place::user(&dir));
    }
    places
}

/// `loom agents …` or `loom skills …`.
pub(crate) async fn run(kind: Kind, args: DefinitionsArgs) -> Result<ExitCode, Failure> {
    match args.command {
        DefinitionsCommand::List { workspace, json } => list(kind, workspace.as_deref(), json).await,
    }
}

/// Lists them; exits 1 when a file did not load, so a check in CI fails.
async fn list(kind: Kind, workspace: Option<&Path>, json: bool) -> Result<ExitCode, Failure> {
    let workspace = match workspace {
        Some(dir) => dir.to_path_buf(),
        None => std::env::current_dir().map_err(|err| Failure::Usage(err.into()))?,
    };
    let places = places(&workspace);
    let found = tokio::task::spawn_blocking(move || discover(&places))
        .await
        .map_err(|err| Failure::Runtime(err.into()))?;
    let problems: Vec<&Problem> = found.problems.iter().filter(|problem| problem.kind == kind).collect();
    if json {
        println!("{}", listing_json(kind, &found, &problems));
    } else {
        print!("{}", listing_text(kind, &found));
    }
    for problem in &problems {
        eprintln!("loom: error: {}", shown(&problem.to_string()));
    }
    let trusted = {
        let (found, workspace) = (found.clone(), workspace.clone());
        tokio::task::spawn_blocking(move || crate::project_definitions::trusted(&found, &workspace))
            .await
            .map_err(|err| Failure::Runtime(err.into()))?
            .map_err(Failure::Runtime)?
    };
    if !trusted {
        eprintln!(
            "loom: note: the project's agents and skills are not trusted: runs leave them out until `loom trust` in {}",
            workspace.display()
        );
    }
    Ok(if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(exit::ERROR)
    })
}

fn listing_json(kind: Kind, found: &Definitions, problems: &[&Problem]) -> serde_json::Value {
    let problems: Vec<_> = problems
        .iter()
        .map(|problem| {
            json!({
                "file": problem.path,
                "line": problem.error.line,
                "key": problem.error.key,
                "message": problem.error.message,
            })
        })
        .collect();
    let defined: Vec<_> = match kind {
        Kind::Agent => found
            .agents
            .iter()
            .map(|agent| {
                let definition = &agent.definition;
                json!({
                    "name": definition.name,
                    "description": definition.description,
                    "tools": definition.tools,
                    "model": definition.model,
                    "maxSteps": definition.max_steps,
                    "file": agent.path,
                    "ignoredKeys": definition.ignored,
                })
            })
            .collect(),
        Kind::Skill => found
            .skills
            .iter()
            .map(|skill| {
                json!({
                    "name": skill.definition.name,
                    "description": skill.definition.description,
                    "file": skill.path,
                    "ignoredKeys": skill.definition.ignored,
                })
            })
            .collect(),
    };
    let key = match kind {
        Kind::Agent => "agents",
        Kind::Skill => "skills",
    };
    json!({ key: defined, "problems": problems })
}

/// One block per definition: its name, description, what it uses, and
/// its file. A file's text is shown escaped: it may come from a cloned
/// project.
fn listing_text(kind: Kind, found: &Definitions) -> String {
    let mut out = String::new();
    let mut block = |name: &str, description: &str, more: Vec<String>, file: &PathBuf, ignored: &[String]| {
        out.push_str(&format!("{}  {}\n", shown(name), shown(&clip(description, 100))));
        for line in more {
            out.push_str(&format!("    {}\n", shown(&line)));
        }
        if !ignored.is_empty() {
            out.push_str(&format!("    ignored keys: {}\n", shown(&ignored.join(", "))));
        }
        out.push_str(&format!("    file: {}\n", shown(&file.display().to_string())));
    };
    match kind {
        Kind::Agent => {
            for agent in &found.agents {
                let definition = &agent.definition;
                let tools = match &definition.tools {
                    Some(tools) => tools.join(", "),
                    None => "the parent's".to_string(),
                };
                let mut more = vec![format!("tools: {tools}")];
                if let Some(model) = &definition.model {
                    more.push(format!("model: {model}"));
                }
                if let Some(steps) = definition.max_steps {
                    more.push(format!("max_steps: {steps}"));
                }
                block(
                    &definition.name,
                    &definition.description,
                    more,
                    &agent.path,
                    &definition.ignored,
                );
            }
            if found.agents.is_empty() {
                out.push_str("no agents (.loom/agents/NAME.md, ~/.config/loom/agents/NAME.md)\n");
            }
        }
        Kind::Skill => {
            for skill in &found.skills {
                let definition = &skill.definition;
                block(
                    &definition.name,
                    &definition.description,
                    Vec::new(),
                    &skill.path,
                    &definition.ignored,
                );
            }
            if found.skills.is_empty() {
                out.push_str("no skills (.loom/skills/NAME/SKILL.md, ~/.config/loom/skills/NAME/SKILL.md)\n");
            }
        }
    }
    out
}
