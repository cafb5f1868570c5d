//! `skill`: loads a skill's instructions when the model decides it needs
//! them (docs/agents.md, "Skills"). Only the skills' names and
//! descriptions are in the system prompt ([`Skill::system_section`]); the
//! body costs context only once loaded.
//!
//! A skill's other files: a workspace skill's are the file tools' to read
//! (`.loom/skills/NAME/…`, under the workspace's jail and its rules); a
//! user's skill lives outside the workspace, so `file` reads them here,
//! beneath the skill's own folder (cap-std: a link out of it is refused).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cap_std::fs::Dir;
use loom_core::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::definitions::{Found, SkillDefinition};

/// Files of a skill listed with its instructions, at most.
const MAX_LISTED: usize = 100;

/// Arguments of `skill`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillArgs {
    /// The skill's name, as the system prompt lists it.
    pub name: String,
    /// A file of the skill, relative to its folder (as its instructions
    /// or its file list name it); left out: the instructions.
    #[serde(default)]
    pub file: Option<String>,
}

/// Loads a skill's instructions, or one of its files.
#[derive(Debug, Clone)]
pub struct Skill {
    skills: Arc<[Found<SkillDefinition>]>,
}

impl Skill {
    /// The tool over `skills` (from `definitions::discover`).
    pub fn new(skills: Vec<Found<SkillDefinition>>) -> Self {
        Self { skills: skills.into() }
    }

    /// What the system prompt says of the skills: each one's name and
    /// description. `None` when there are none.
    pub fn system_section(&self) -> Option<String> {
        if self.skills.is_empty() {
            return None;
        }
        let mut text = String::from(
            "# Skills\n\nSkills you can load with the `skill` tool. When a task matches a skill's description, \
             load it first and follow its instructions:\n",
        );
        for skill in self.skills.iter() {
            text.push_str(&format!(
                "\n- {}: {}",
                skill.definition.name, skill.definition.description
            ));
        }
        Some(text)
    }
}

impl Tool for Skill {
    type Args = SkillArgs;

    fn name(&self) -> &str {
        "skill"
    }

    fn description(&self) -> &str {
        "Load a skill's instructions by name (the skills are listed in the system prompt). \
         With `file`, read one of the skill's files instead, relative to its folder."
    }

    fn concurrency_safe(&self) -> bool {
        true
    }

    fn read_only(&self) -> bool {
        true
    }

    async fn call(&self, args: SkillArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let Some(found) = self
            .skills
            .iter()
            .find(|skill| skill.definition.name == args.name)
            .cloned()
        else {
            let known: Vec<&str> = self.skills.iter().map(|skill| skill.definition.name.as_str()).collect();
            return Err(ToolError::InvalidArguments(format!(
                "there is no skill {:?}; the skills are: {}",
                args.name,
                known.join(", ")
            )));
        };
        let workspace_folder = found
            .place
            .is_workspace()
            .then(|| found.place.prefix.join("skills").join(&found.definition.name));
        match args.file {
            None => {
                let mut text = found.definition.body.clone();
                match &workspace_folder {
                    Some(folder) => text.push_str(&format!(
                        "\n\n(This skill's files are in {}/ in the workspace: read them with the file tools.)",
                        folder.display()
                    )),
                    None => {
                        let files = tokio::task::spawn_blocking(move || files_of(&found))
                            .await
                            .unwrap_or_default();
                        if !files.is_empty() {
                            text.push_str(&format!(
                                "\n\n(This skill's files, to read with `file`: {})",
                                files.join(", ")
                            ));
                        }
                    }
                }
                Ok(text.into())
            }
            Some(file) => {
                if let Some(folder) = workspace_folder {
                    return Err(ToolError::InvalidArguments(format!(
                        "this skill is in the workspace: read {}/{file} with read_file",
                        folder.display()
                    )));
                }
                let text = tokio::task::spawn_blocking(move || read_file_of(&found, &file))
                    .await
                    .map_err(|err| ToolError::Failed(format!("the tool's worker failed: {err}")))??;
                Ok(text.into())
            }
        }
    }
}

/// The skill's folder, opened beneath its place's `skills/` folder (so
/// neither the folder nor anything in it can lead out).
fn folder_of(found: &Found<SkillDefinition>) -> std::io::Result<Dir> {
    let skills = found.place.prefix.join("skills");
    let root = Dir::open_ambient_dir(found.place.root.join(skills), cap_std::ambient_authority())?;
    root.open_dir(&found.definition.name)
}

/// The skill's files beside `SKILL.md`, relative to its folder, sorted,
/// at most [`MAX_LISTED`] (three levels deep).
fn files_of(found: &Found<SkillDefinition>) -> Vec<String> {
    let Ok(folder) = folder_of(found) else {
        return Vec::new();
    };
    let mut files = Vec::new();
    let mut stack: Vec<(Dir, PathBuf)> = vec![(folder, PathBuf::new())];
    while let Some((dir, at)) = stack.pop() {
        let Ok(entries) = dir.entries() else { continue };
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let path = at.join(&name);
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_dir() && at.components().count() < 2 && !name.starts_with('.') {
                if let Ok(inner) = dir.open_dir(&name) {
                    stack.push((inner, path));
                }
            } else if kind.is_file() && path != Path::new("SKILL.md") {
                files.push(path.display().to_string());
            }
            if files.len() >= MAX_LISTED {
                break;
            }
        }
    }
    files.sort();
    files.truncate(MAX_LISTED);
    files
}

/// One of a user skill's files, as text.
fn read_file_of(found: &Found<SkillDefinition>, file: &str) -> Result<String, ToolError> {
    let refused = |why: String| {
        ToolError::Failed(format!(
            "cannot read {file} of the skill {}: {why}",
            found.definition.name
        ))
    };
    let folder = folder_of(found).map_err(|err| refused(err.to_string()))?;
    // As a definition file is read: no FIFO waited on, no link out.
    crate::definitions::read_beneath(&folder, Path::new(file)).map_err(refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definitions::{discover, Place};

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn context(workspace: &Path) -> ToolContext {
        ToolContext::new(
            "call_1",
            Arc::from("run"),
            Arc::from(workspace),
            tokio_util::sync::CancellationToken::new(),
        )
    }

    #[tokio::test]
    async fn a_user_skill_is_loaded_and_its_files_read_beneath_its_folder() {
        let workspace = tempfile::tempdir().unwrap();
        let user = tempfile::tempdir().unwrap();
        let skill = user.path().join("skills/pdf");
        write(
            &skill.join("SKILL.md"),
            "---\nname: pdf\ndescription: PDFs.\n---\nRun scripts/fill.py.\n",
        );
        write(&skill.join("scripts/fill.py"), "print('filled')\n");
        write(&user.path().join("loom.toml"), "[server]\n# a token lives here\n");
        std::os::unix::fs::symlink(user.path().join("loom.toml"), skill.join("config.toml")).unwrap();
        let found = discover(&[Place::workspace(workspace.path()), Place::user(user.path())]);
        let tool = Skill::new(found.skills);
        assert!(tool.system_section().unwrap().contains("- pdf: PDFs."));
        let ctx = context(workspace.path());
        let loaded = tool
            .call(
                SkillArgs {
                    name: "pdf".into(),
                    file: None,
                },
                ctx.clone(),
            )
            .await
            .unwrap()
            .content;
        assert!(loaded.starts_with("Run scripts/fill.py."), "{loaded}");
        assert!(loaded.contains("scripts/fill.py"), "{loaded}");
        let script = tool
            .call(
                SkillArgs {
                    name: "pdf".into(),
                    file: Some("scripts/fill.py".into()),
                },
                ctx.clone(),
            )
            .await
            .unwrap()
            .content;
        assert_eq!(script, "print('filled')\n");
        let fifo = std::ffi::CString::new(skill.join("pipe.txt").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        for outside in ["../../loom.toml", "/etc/passwd", "config.toml", "pipe.txt"] {
            let err = tool
                .call(
                    SkillArgs {
                        name: "pdf".into(),
                        file: Some(outside.into()),
                    },
                    ctx.clone(),
                )
                .await
                .unwrap_err();
            assert!(err.to_string().contains("cannot read"), "{outside}: {err}");
        }
    }

    #[tokio::test]
    async fn a_workspace_skill_points_at_the_file_tools() {
        let workspace = tempfile::tempdir().unwrap();
        write(
            &workspace.path().join(".loom/skills/notes/SKILL.md"),
            "---\nname: notes\ndescription: Notes.\n---\nWrite notes.\n",
        );
        let tool = Skill::new(discover(&[Place::workspace(workspace.path())]).skills);
        let ctx = context(workspace.path());
        let loaded = tool
            .call(
                SkillArgs {
                    name: "notes".into(),
                    file: None,
                },
                ctx.clone(),
            )
            .await
            .unwrap()
            .content;
        assert!(loaded.contains(".loom/skills/notes/ in the workspace"), "{loaded}");
        let err = tool
            .call(
                SkillArgs {
                    name: "notes".into(),
                    file: Some("x".into()),
                },
                ctx.clone(),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("read_file"), "{err}");
        let err = tool
            .call(
                SkillArgs {
                    name: "nope".into(),
                    file: None,
                },
                ctx,
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("the skills are: notes"), "{err}");
    }
}
