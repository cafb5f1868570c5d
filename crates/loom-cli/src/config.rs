//! `loom.toml` (docs/cli.md): found, parsed and merged under the command line.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
pub(crate) use loom_config::{FileConfig, ProviderConfig};

/// Where a configuration came from: what decides whether it must be
/// trusted before it can run commands (docs/security.md).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// No file: built-in defaults.
    #[default]
    None,
    /// Named with `--config`: the person's own choice.
    Explicit,
    /// Found as `./loom.toml`: it came with the project, and anyone who
    /// could write the project (a model included) may have written it.
    Project,
    /// The user's own `~/.config/loom/loom.toml`.
    User,
}

/// A loaded configuration and where it came from.
#[derive(Debug, Default, Clone)]
pub(crate) struct LoadedConfig {
    pub file: FileConfig,
    /// The file's directory, for paths written in it.
    pub dir: Option<PathBuf>,
    /// The file's keys as written, which trust judges one by one
    /// (`trust_rules.rs`).
    pub table: toml::Table,
    /// The file itself.
    pub path: Option<PathBuf>,
    pub origin: Origin,
    /// The SHA-256 of the text that was parsed, in hex (what trust records).
    pub digest: String,
    pub notes: Vec<String>,
}

/// Loads `explicit`, or else `./loom.toml`, or else the user's config file.
pub(crate) fn load(explicit: Option<&Path>) -> Result<LoadedConfig> {
    let found = match explicit {
        Some(path) => {
            if !path.is_file() {
                bail!("config file {} does not exist", path.display());
            }
            Some((path.to_path_buf(), Origin::Explicit))
        }
        None => [
            Some((PathBuf::from("loom.toml"), Origin::Project)),
            user_config_file().map(|path| (path, Origin::User)),
        ]
        .into_iter()
        .flatten()
        .find(|(candidate, _)| candidate.is_file()),
    };
    let Some((path, origin)) = found else {
        return Ok(LoadedConfig::default());
    };
    load_file(&path, origin)
}

/// Loads only `explicit` (`loom serve`: never a file found in a workspace).
pub(crate) fn load_explicit(explicit: Option<&Path>) -> Result<LoadedConfig> {
    match explicit {
        Some(_) => load(explicit),
        None => Ok(LoadedConfig::default()),
    }
}

fn load_file(path: &Path, origin: Origin) -> Result<LoadedConfig> {
    let path = path.to_path_buf();
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let digest = crate::trust_records::sha256_hex(text.as_bytes());
    // One line that says where: the file, the line, the key when known.
    let (file, table) = parse(&text).map_err(|err| {
        let gap = if err.line.is_some() { "" } else { " " };
        anyhow::anyhow!("{}:{gap}{err}", path.display())
    })?;
    remember_secrets(&file);
    let notes = Vec::new();
    let dir = path.parent().map(|dir| {
        if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir.to_path_buf()
        }
    });
    let path = resolved_dir(&path);
    Ok(LoadedConfig {
        file,
        table,
        dir,
        path: Some(path),
        origin,
        digest,
        notes,
    })
}

/// The values `file` gives Loom to pass on — tokens, headers sent with an
/// API key or to a collector, the environment of commands, hooks and MCP
/// servers — redacted by value wherever they appear from now on, whatever
/// their shape (docs/cli.md, "Output safety").
fn remember_secrets(file: &FileConfig) {
    let mut given: Vec<String> = Vec::new();
    // An environment holds settings as well as keys (`NODE_ENV =
    // "production"`): a value is taken when its name looks secret or it
    // looks like a key itself.
    let env = file
        .tools
        .iter()
        .flat_map(|tools| tools.bash.iter())
        .flat_map(|bash| bash.env.iter())
        .chain(
            file.mcp
                .iter()
                .flat_map(|mcp| mcp.servers.values())
                .flat_map(|server| server.env.iter()),
        );
    for (name, value) in env {
        if loom::is_secret_name(name) || looks_like_a_key(value) {
            given.push(value.clone());
        }
    }
    // Headers and tokens are credentials whatever they look like; a
    // header's scheme (`Bearer KEY`) is not, its words are.
    let headers = file
        .provider
        .iter()
        .flat_map(|provider| provider.headers.values())
        .chain(file.telemetry.iter().flat_map(|telemetry| telemetry.headers.values()));
    for value in headers {
        given.push(value.clone());
        given.extend(value.split_whitespace().skip(1).map(str::to_string));
    }
    for token in file.server.iter().flat_map(|server| server.tokens.iter()) {
        given.extend(token.token.clone());
    }
    loom::remember_secrets(given);
}

/// Whether `value` looks like a key rather than a setting: 16 characters
/// or more without blanks, mixing letters with digits or capitals with
/// small letters (`wJalrXUtnFEMI…`, a UUID), which words and paths do not.
fn looks_like_a_key(value: &str) -> bool {
    let has = |test: fn(&char) -> bool| value.chars().any(|c| test(&c));
    let letters = has(char::is_ascii_alphabetic);
    value.chars().count() >= 16
        && !has(|c| c.is_whitespace())
        && ((letters && has(char::is_ascii_digit)) || (has(char::is_ascii_uppercase) && has(char::is_ascii_lowercase)))
}

/// `text` as loom.toml's keys, and as the table of what it says (the same
/// text, so trust judges what takes effect).
pub(crate) fn parse(text: &str) -> Result<(FileConfig, toml::Table), loom_config::ParseError> {
    let file = loom_config::parse(text)?;
    // It parsed as keys, so it is a table; were it not, a key no rule
    // judges makes trust fail closed rather than see nothing.
    let table = text
        .parse::<toml::Table>()
        .unwrap_or_else(|_| toml::Table::from_iter([("unreadable".to_string(), toml::Value::Boolean(true))]));
    Ok((file, table))
}

/// `path` with its directory resolved and its own name kept: a
/// `loom.toml` that is a link is known by where it was found, not by what
/// it points to (trust given to one project's file does not follow a link
/// to it from another project).
pub(crate) fn resolved_dir(path: &Path) -> PathBuf {
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            dir.canonicalize()
                .map(|dir| dir.join(name))
                .unwrap_or_else(|_| path.to_path_buf())
        }
        _ => path.to_path_buf(),
    }
}

pub(crate) fn user_config_file() -> Option<PathBuf> {
    Some(user_config_dir()?.join("loom.toml"))
}

/// `$XDG_CONFIG_HOME/loom`, else `~/.config/loom`.
pub(crate) fn user_config_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))?;
    Some(base.join("loom"))
}

/// A model string from the config file, with a relative script path taken
/// relative to the file's directory.
pub(crate) fn model_from_file(model: &str, dir: Option<&Path>) -> String {
    match (model.strip_prefix("scripted:"), dir) {
        (Some(path), Some(dir)) if Path::new(path).is_relative() => {
            format!("scripted:{}", dir.join(path).display())
        }
        _ => model.to_string(),
    }
}
