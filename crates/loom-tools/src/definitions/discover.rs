//! Finding definition files: `agents/*.md` and `skills/*/SKILL.md` under
//! each [`Place`], read beneath the place's root (cap-std), so a link in a
//! cloned project that leads out of it — to `~/.ssh`, say — is refused, not
//! followed into a prompt.

use std::io::Read;
use std::path::{Path, PathBuf};

use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};

use super::{AgentDefinition, DefinitionError, SkillDefinition};

/// The largest definition file read: far above any real one; a bigger
/// file is a problem, not a prompt.
pub const MAX_FILE_BYTES: u64 = 256 * 1024;

/// A place definitions are found in: `agents/` and `skills/` in `prefix`
/// beneath `root`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// What nothing read may leave.
    pub root: PathBuf,
    /// The folder beneath it that holds `agents/` and `skills/`.
    pub prefix: PathBuf,
}

impl Place {
    /// Whether this is a workspace's place (its files are the file tools'
    /// to read) rather than the user's.
    pub fn is_workspace(&self) -> bool {
        !self.prefix.as_os_str().is_empty()
    }

    /// The workspace's own: `.loom/agents`, `.loom/skills`.
    pub fn workspace(workspace: &Path) -> Self {
        Self {
            root: workspace.to_path_buf(),
            prefix: PathBuf::from(".loom"),
        }
    }

    /// The user's: `agents/`, `skills/` in `~/.config/loom`.
    pub fn user(config_dir: &Path) -> Self {
        Self {
            root: config_dir.to_path_buf(),
            prefix: PathBuf::new(),
        }
    }
}

/// A definition and the file it came from.
#[derive(Debug, Clone)]
pub struct Found<T> {
    /// What the file defines.
    pub definition: T,
    /// The file.
    pub path: PathBuf,
    /// The place it was found in.
    pub place: Place,
}

/// What a file defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `agents/NAME.md`.
    Agent,
    /// `skills/NAME/SKILL.md`.
    Skill,
}

/// A file that was not loaded, and why.
#[derive(Debug, Clone)]
pub struct Problem {
    /// What it was to define.
    pub kind: Kind,
    /// The file.
    pub path: PathBuf,
    /// What is wrong, with its line and key when known.
    pub error: DefinitionError,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.error)
    }
}

/// What the places define, and what is wrong with the files that were not
/// loaded.
#[derive(Debug, Clone)]
pub struct Definitions {
    /// Agents by name; a name in an earlier place hides the same name in a
    /// later one (the workspace's before the user's).
    pub agents: Vec<Found<AgentDefinition>>,
    /// Skills by name, the same way.
    pub skills: Vec<Found<SkillDefinition>>,
    /// Files not loaded.
    pub problems: Vec<Problem>,
}

/// Reads every place, earliest first. A place without the folders has
/// nothing in it; that is no problem.
pub fn discover(places: &[Place]) -> Definitions {
    let mut definitions = Definitions {
        agents: Vec::new(),
        skills: Vec::new(),
        problems: Vec::new(),
    };
    for place in places {
        let Ok(root) = Dir::open_ambient_dir(&place.root, cap_std::ambient_authority()) else {
            continue;
        };
        let mut agents = Vec::new();
        for (path, text) in files(&root, place, Kind::Agent, &mut definitions.problems, |_, name| {
            name.ends_with(".md").then(|| PathBuf::from(name))
        }) {
            match AgentDefinition::parse(&text) {
                Ok(definition) => agents.push(Found {
                    definition,
                    path,
                    place: place.clone(),
                }),
                Err(error) => definitions.problems.push(Problem {
                    kind: Kind::Agent,
                    path,
                    error,
                }),
            }
        }
        let mut skills = Vec::new();
        // A skill is a folder, or a link to one: a link is followed, and
        // reading beneath the place's root refuses one that leads out
        // (listed as a problem, not skipped).
        for (path, text) in files(&root, place, Kind::Skill, &mut definitions.problems, |dir, name| {
            let kind = dir.symlink_metadata(name).ok()?.file_type();
            (!name.starts_with('.') && (kind.is_dir() || kind.is_symlink())).then(|| Path::new(name).join("SKILL.md"))
        }) {
            let folder = path
                .parent()
                .and_then(Path::file_name)
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default();
            match SkillDefinition::parse(&text, &folder) {
                Ok(definition) => skills.push(Found {
                    definition,
                    path,
                    place: place.clone(),
                }),
                Err(error) => definitions.problems.push(Problem {
                    kind: Kind::Skill,
                    path,
                    error,
                }),
            }
        }
        keep_new(
            &mut definitions.agents,
            agents,
            Kind::Agent,
            |agent| &agent.name,
            &mut definitions.problems,
        );
        keep_new(
            &mut definitions.skills,
            skills,
            Kind::Skill,
            |skill| &skill.name,
            &mut definitions.problems,
        );
    }
    // By file, as the files are listed.
    definitions.problems.sort_by(|a, b| a.path.cmp(&b.path));
    definitions
}

/// Adds what one place defines: a name already defined by an earlier place
/// stays as it was; the same name twice in this place is a problem.
fn keep_new<T>(
    kept: &mut Vec<Found<T>>,
    found: Vec<Found<T>>,
    kind: Kind,
    name: impl Fn(&T) -> &String,
    problems: &mut Vec<Problem>,
) {
    let earlier = kept.len();
    for item in found {
        let this = name(&item.definition);
        if kept[..earlier].iter().any(|other| name(&other.definition) == this) {
            continue;
        }
        if let Some(twin) = kept[earlier..].iter().find(|other| name(&other.definition) == this) {
            problems.push(Problem {
                kind,
                error: DefinitionError::of_key(
                    "name",
                    format!("{this:?} is already defined by {}", twin.path.display()),
                ),
                path: item.path,
            });
            continue;
        }
        kept.push(item);
    }
}

/// The texts of the files `pick` chooses among the entries of `folder`
/// (in the place's prefix), sorted by name; unreadable ones are problems.
fn files(
    root: &Dir,
    place: &Place,
    kind: Kind,
    problems: &mut Vec<Problem>,
    pick: impl Fn(&Dir, &str) -> Option<PathBuf>,
) -> Vec<(PathBuf, String)> {
    let folder = match kind {
        Kind::Agent => "agents",
        Kind::Skill => "skills",
    };
    let relative = place.prefix.join(folder);
    let Ok(dir) = root.open_dir(&relative) else {
        return Vec::new();
    };
    let Ok(entries) = dir.entries() else {
        return Vec::new();
    };
    let mut names = Vec::new();
    for entry in entries.flatten() {
        match entry.file_name().into_string() {
            Ok(name) => names.push(name),
            Err(name) => problems.push(Problem {
                kind,
                path: place.root.join(&relative).join(&name),
                error: DefinitionError {
                    line: None,
                    key: None,
                    message: "its name is not UTF-8 text".to_string(),
                },
            }),
        }
    }
    names.sort();
    let mut texts = Vec::new();
    for name in names {
        let Some(file) = pick(&dir, &name) else { continue };
        let path = place.root.join(&relative).join(&file);
        // Beneath the place's root, not the folder: a link to a file
        // elsewhere in the project is fine; one out of it is refused.
        match read_beneath(root, &relative.join(&file)) {
            Ok(text) => texts.push((path, text)),
            Err(message) => problems.push(Problem {
                kind,
                path,
                error: DefinitionError {
                    line: None,
                    key: None,
                    message,
                },
            }),
        }
    }
    texts
}

/// A regular file beneath `dir`, as UTF-8 text of at most [`MAX_FILE_BYTES`].
/// Opened without blocking, so a FIFO cannot hang the listing (it is
/// then refused as not a regular file).
pub(crate) fn read_beneath(dir: &Dir, file: &Path) -> Result<String, String> {
    let mut options = OpenOptions::new();
    options.read(true).custom_flags(libc::O_NONBLOCK);
    let opened = dir.open_with(file, &options).map_err(|err| {
        if crate::jail::is_escape(&err) {
            "cannot be read: it is a link that leads out of the folder it was found in".to_string()
        } else {
            format!("cannot be read: {err}")
        }
    })?;
    let meta = opened.metadata().map_err(|err| format!("cannot be read: {err}"))?;
    if !meta.is_file() {
        return Err("is not a regular file".to_string());
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!("is {} bytes; at most {MAX_FILE_BYTES} are read", meta.len()));
    }
    let mut bytes = Vec::new();
    opened
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| format!("cannot be read: {err}"))?;
    String::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn the_workspace_hides_the_users_and_problems_are_kept() {
        let workspace = tempfile::tempdir().unwrap();
        let user = tempfile::tempdir().unwrap();
        let ws = workspace.path();
        write(
            &ws.join(".loom/agents/reviewer.md"),
            "---\nname: reviewer\ndescription: project's\n---\nReview.",
        );
        write(
            &ws.join(".loom/agents/broken.md"),
            "---\nname: broken\ndescription: d\nmax_steps: lots\n---\nGo.",
        );
        write(&ws.join(".loom/agents/notes.txt"), "not an agent");
        write(
            &user.path().join("agents/reviewer.md"),
            "---\nname: reviewer\ndescription: user's\n---\nReview.",
        );
        write(
            &user.path().join("agents/writer.md"),
            "---\nname: writer\ndescription: writes\n---\nWrite.",
        );
        write(
            &ws.join(".loom/skills/pdf/SKILL.md"),
            "---\nname: pdf\ndescription: PDFs\n---\nUse it.",
        );
        write(&ws.join(".loom/skills/empty/README.md"), "no SKILL.md here");
        let found = discover(&[Place::workspace(ws), Place::user(user.path())]);
        let agents: Vec<_> = found
            .agents
            .iter()
            .map(|agent| (agent.definition.name.as_str(), agent.definition.description.as_str()))
            .collect();
        assert_eq!(agents, [("reviewer", "project's"), ("writer", "writes")]);
        assert_eq!(found.skills.len(), 1);
        assert_eq!(found.skills[0].path, ws.join(".loom/skills/pdf/SKILL.md"));
        let problems: Vec<_> = found.problems.iter().map(ToString::to_string).collect();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].contains("broken.md: line 4") && problems[0].contains("max_steps"),
            "{problems:?}"
        );
        assert!(problems[1].contains("empty/SKILL.md: cannot be read"), "{problems:?}");
    }

    #[test]
    fn a_link_that_leads_out_of_the_workspace_is_not_read() {
        let workspace = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret.md");
        write(
            &secret,
            "---\nname: secret\ndescription: the user's key\n---\nPRIVATE KEY",
        );
        let agents = workspace.path().join(".loom/agents");
        std::fs::create_dir_all(&agents).unwrap();
        std::os::unix::fs::symlink(&secret, agents.join("secret.md")).unwrap();
        // And `.loom` itself a link out, in a second workspace.
        let other = tempfile::tempdir().unwrap();
        write(
            &outside.path().join("agents/secret.md"),
            "---\nname: secret\ndescription: d\n---\nPRIVATE KEY",
        );
        std::os::unix::fs::symlink(outside.path(), other.path().join(".loom")).unwrap();
        let found = discover(&[Place::workspace(workspace.path())]);
        assert!(found.agents.is_empty(), "{:?}", found.agents);
        assert!(
            found.problems[0].to_string().contains("secret.md: cannot be read"),
            "{:?}",
            found.problems
        );
        let found = discover(&[Place::workspace(other.path())]);
        assert!(found.agents.is_empty() && found.problems.is_empty(), "{found:?}");
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_and_links_inside_the_project_are_followed() {
        let workspace = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let ws = workspace.path();
        let agents = ws.join(".loom/agents");
        std::fs::create_dir_all(&agents).unwrap();
        let fifo = std::ffi::CString::new(agents.join("fifo.md").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        write(&ws.join("docs/inner.md"), "---\nname: inner\ndescription: d\n---\nGo.");
        std::os::unix::fs::symlink("../../docs/inner.md", agents.join("inner.md")).unwrap();
        write(
            &outside.path().join("s/SKILL.md"),
            "---\nname: s\ndescription: d\n---\nSECRET",
        );
        std::fs::create_dir_all(ws.join(".loom/skills")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("s"), ws.join(".loom/skills/s")).unwrap();
        let found = discover(&[Place::workspace(ws)]);
        assert_eq!(found.agents.len(), 1, "{found:?}");
        assert_eq!(found.agents[0].definition.name, "inner");
        assert!(found.skills.is_empty(), "{found:?}");
        let problems: Vec<_> = found.problems.iter().map(ToString::to_string).collect();
        assert!(problems[0].contains("fifo.md: is not a regular file"), "{problems:?}");
        assert!(
            problems[1].contains("skills/s/SKILL.md: cannot be read: it is a link that leads out"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_name_twice_in_one_place_is_a_problem() {
        let workspace = tempfile::tempdir().unwrap();
        let ws = workspace.path();
        write(
            &ws.join(".loom/agents/a.md"),
            "---\nname: same\ndescription: d\n---\nGo.",
        );
        write(
            &ws.join(".loom/agents/b.md"),
            "---\nname: same\ndescription: d\n---\nGo.",
        );
        let found = discover(&[Place::workspace(ws)]);
        assert_eq!(found.agents.len(), 1);
        assert_eq!(found.problems[0].path, ws.join(".loom/agents/b.md"));
    }
}
