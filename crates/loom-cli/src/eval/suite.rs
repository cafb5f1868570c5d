//! The suite file of `loom eval` (docs/eval.md): cases with a prompt, a
//! workspace copied fresh for every attempt, and checks on the outcome.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;

/// A suite as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SuiteFile {
    #[serde(default)]
    defaults: Settings,
    #[serde(default)]
    case: Vec<CaseFile>,
}

/// What a case may set, and `[defaults]` for every case.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    model: Option<String>,
    mode: Option<String>,
    max_steps: Option<u32>,
    timeout_secs: Option<u64>,
    tools: Option<Vec<String>>,
    min_pass_rate: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseFile {
    name: String,
    prompt: String,
    workspace: Option<PathBuf>,
    #[serde(flatten)]
    settings: Settings,
    #[serde(default)]
    check: Vec<Check>,
}

/// One check on an attempt's outcome: a table with exactly one key.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Check {
    /// The file exists in the final workspace.
    FileExists(String),
    /// The file does not exist in the final workspace.
    FileAbsent(String),
    /// The file contains the text.
    FileContains { path: String, text: String },
    /// The file matches the regular expression.
    FileMatches { path: String, regex: String },
    /// `bash -c COMMAND` in the final workspace exits 0.
    Command(String),
    /// The final answer contains the text.
    AnswerContains(String),
    /// The final answer matches the regular expression.
    AnswerMatches(String),
    /// The run called the tool at least once.
    ToolCalled(String),
    /// The run never called the tool.
    ToolNotCalled(String),
    /// The run took at most this many steps.
    MaxSteps(u32),
    /// Prompt and completion tokens over the run, at most.
    MaxTokens(u64),
    /// The run cost at most this many dollars.
    MaxCostUsd(f64),
    /// The run's final status (`DONE`, `MAX_STEPS`, `TIMEOUT`, …).
    Status(String),
}

impl Check {
    /// The check in a few words, for reports.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::FileExists(path) => format!("file_exists {path}"),
            Self::FileAbsent(path) => format!("file_absent {path}"),
            Self::FileContains { path, text } => format!("file_contains {path} {text:?}"),
            Self::FileMatches { path, regex } => format!("file_matches {path} /{regex}/"),
            Self::Command(command) => format!("command {command:?}"),
            Self::AnswerContains(text) => format!("answer_contains {text:?}"),
            Self::AnswerMatches(regex) => format!("answer_matches /{regex}/"),
            Self::ToolCalled(tool) => format!("tool_called {tool}"),
            Self::ToolNotCalled(tool) => format!("tool_not_called {tool}"),
            Self::MaxSteps(steps) => format!("max_steps {steps}"),
            Self::MaxTokens(tokens) => format!("max_tokens {tokens}"),
            Self::MaxCostUsd(dollars) => format!("max_cost_usd {dollars}"),
            Self::Status(status) => format!("status {status}"),
        }
    }

    /// The check's kind (its key in the suite), for grouping failures.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::FileExists(_) => "file_exists",
            Self::FileAbsent(_) => "file_absent",
            Self::FileContains { .. } => "file_contains",
            Self::FileMatches { .. } => "file_matches",
            Self::Command(_) => "command",
            Self::AnswerContains(_) => "answer_contains",
            Self::AnswerMatches(_) => "answer_matches",
            Self::ToolCalled(_) => "tool_called",
            Self::ToolNotCalled(_) => "tool_not_called",
            Self::MaxSteps(_) => "max_steps",
            Self::MaxTokens(_) => "max_tokens",
            Self::MaxCostUsd(_) => "max_cost_usd",
            Self::Status(_) => "status",
        }
    }
}

/// A case, with the suite's defaults applied.
#[derive(Debug, Clone)]
pub(crate) struct Case {
    pub name: String,
    pub prompt: String,
    /// The folder copied for every attempt (none: an empty workspace).
    pub workspace: Option<PathBuf>,
    pub model: Option<String>,
    pub mode: Option<loom::Mode>,
    pub max_steps: Option<u32>,
    pub timeout_secs: Option<u64>,
    /// The tools offered (none: Loom's defaults).
    pub tools: Option<Vec<String>>,
    pub min_pass_rate: f64,
    pub checks: Vec<Check>,
}

/// A suite read and checked: every case valid, names unique.
#[derive(Debug, Clone)]
pub(crate) struct Suite {
    pub cases: Vec<Case>,
}

impl Suite {
    /// Reads the suite at `path`; workspaces are relative to its folder.
    pub(crate) fn load(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read the suite {}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, base).with_context(|| format!("suite {}", path.display()))
    }

    pub(crate) fn parse(text: &str, base: &Path) -> Result<Self> {
        let file: SuiteFile = toml::from_str(text).map_err(|err| anyhow!("{err}"))?;
        if file.case.is_empty() {
            bail!("no [[case]]: a suite needs at least one case");
        }
        let mut cases = Vec::with_capacity(file.case.len());
        for case in file.case {
            let name = case.name.trim().to_string();
            if name.is_empty() {
                bail!("a case has an empty name");
            }
            if cases.iter().any(|known: &Case| known.name == name) {
                bail!("two cases are named '{name}'");
            }
            if let Some(known) = cases
                .iter()
                .find(|known: &&Case| known.folder_name() == folder_name(&name))
            {
                bail!(
                    "cases '{}' and '{name}' would keep their workspaces (--keep) in one folder, '{}': rename one",
                    known.name,
                    folder_name(&name)
                );
            }
            let case = resolve(case, &file.defaults, base).with_context(|| format!("case '{name}'"))?;
            cases.push(case);
        }
        Ok(Self { cases })
    }
}

fn resolve(case: CaseFile, defaults: &Settings, base: &Path) -> Result<Case> {
    let own = case.settings;
    let pick = |own: &Option<String>, default: &Option<String>| own.clone().or_else(|| default.clone());
    let mode = match pick(&own.mode, &defaults.mode) {
        Some(mode) => Some(
            mode.parse::<loom::Mode>()
                .map_err(|err| anyhow!("mode '{mode}': {err}"))?,
        ),
        None => None,
    };
    let min_pass_rate = own.min_pass_rate.or(defaults.min_pass_rate).unwrap_or(1.0);
    if !(0.0..=1.0).contains(&min_pass_rate) {
        bail!("min_pass_rate must be between 0 and 1 (got {min_pass_rate})");
    }
    let max_steps = own.max_steps.or(defaults.max_steps);
    if max_steps == Some(0) {
        bail!("max_steps must be at least 1");
    }
    let timeout_secs = own.timeout_secs.or(defaults.timeout_secs);
    if timeout_secs == Some(0) {
        bail!("timeout_secs must be at least 1");
    }
    let workspace = match case.workspace {
        Some(dir) => {
            let dir = if dir.is_relative() { base.join(dir) } else { dir };
            if !dir.is_dir() {
                bail!("workspace {} is not a folder", dir.display());
            }
            Some(dir)
        }
        None => None,
    };
    if case.prompt.trim().is_empty() {
        bail!("the prompt is empty");
    }
    for check in &case.check {
        validate(check)?;
    }
    Ok(Case {
        name: case.name.trim().to_string(),
        prompt: case.prompt,
        workspace,
        model: pick(&own.model, &defaults.model).map(|model| beside_the_suite(model, base)),
        mode,
        max_steps,
        timeout_secs,
        tools: own.tools.or_else(|| defaults.tools.clone()),
        min_pass_rate,
        checks: case.check,
    })
}

/// A case name as a folder name (`--keep DIR/NAME-N`).
pub(crate) fn folder_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl Case {
    pub(crate) fn folder_name(&self) -> String {
        folder_name(&self.name)
    }
}

/// A scripted model's file, like a workspace, is found relative to the
/// suite file (the suite then runs from any directory).
fn beside_the_suite(model: String, base: &Path) -> String {
    match model.strip_prefix("scripted:") {
        Some(path) if Path::new(path).is_relative() => format!("scripted:{}", base.join(path).display()),
        _ => model,
    }
}

/// A check that could never be judged is an error before anything runs.
fn validate(check: &Check) -> Result<()> {
    let regex = match check {
        Check::FileMatches { regex, .. } | Check::AnswerMatches(regex) => Some(regex),
        _ => None,
    };
    if let Some(regex) = regex {
        regex::Regex::new(regex).map_err(|err| anyhow!("{}: bad regex: {err}", check.describe()))?;
    }
    let path = match check {
        Check::FileExists(path)
        | Check::FileAbsent(path)
        | Check::FileContains { path, .. }
        | Check::FileMatches { path, .. } => Some(path),
        _ => None,
    };
    if let Some(path) = path {
        let relative = Path::new(path);
        if relative.is_absolute()
            || relative
                .components()
                .any(|part| matches!(part, std::path::Component::ParentDir))
        {
            bail!("{}: the path must stay inside the workspace", check.describe());
        }
    }
    if let Check::MaxCostUsd(dollars) = check {
        if !dollars.is_finite() || *dollars < 0.0 {
            bail!("max_cost_usd must be a number of dollars, at least 0");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_case_name_is_a_folder_name_no_other_case_shares() {
        assert_eq!(folder_name("fix the/test"), "fix_the_test");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("suite.toml");
        std::fs::write(
            &path,
            "[[case]]\nname = \"a b\"\nprompt = \"p\"\n[[case]]\nname = \"a_b\"\nprompt = \"p\"\n",
        )
        .unwrap();
        let err = Suite::load(&path).unwrap_err();
        assert!(format!("{err:#}").contains("in one folder, 'a_b'"), "{err:#}");
    }

    #[test]
    fn defaults_apply_and_a_case_overrides_them() {
        let suite = Suite::parse(
            r#"
[defaults]
max_steps = 10
tools = ["read_file", "write_file"]
min_pass_rate = 0.5

[[case]]
name = "one"
prompt = "do it"

  [[case.check]]
  file_contains = { path = "out.txt", text = "42" }
  [[case.check]]
  status = "DONE"

[[case]]
name = "two"
prompt = "answer"
max_steps = 3
tools = ["bash"]
mode = "accept-edits"
  [[case.check]]
  answer_matches = "\\b12\\b"
"#,
            Path::new("."),
        )
        .unwrap();
        let [one, two] = &suite.cases[..] else {
            panic!("two cases")
        };
        assert_eq!(one.max_steps, Some(10));
        assert_eq!(
            one.tools.as_deref(),
            Some(&["read_file".to_string(), "write_file".to_string()][..])
        );
        assert_eq!(one.min_pass_rate, 0.5);
        assert_eq!(
            one.checks,
            vec![
                Check::FileContains {
                    path: "out.txt".into(),
                    text: "42".into()
                },
                Check::Status("DONE".into())
            ]
        );
        assert_eq!(two.max_steps, Some(3));
        assert_eq!(two.tools.as_deref(), Some(&["bash".to_string()][..]));
        assert_eq!(two.mode, Some(loom::Mode::AcceptEdits));
        assert_eq!(two.checks, vec![Check::AnswerMatches("\\b12\\b".into())]);
    }

    #[test]
    fn mistakes_are_named_before_anything_runs() {
        for (suite, expected) in [
            ("", "no [[case]]"),
            (
                "[[case]]\nname = \"a\"\nprompt = \"p\"\n[[case]]\nname = \"a\"\nprompt = \"q\"",
                "two cases are named 'a'",
            ),
            (
                "[[case]]\nname = \"a\"\nprompt = \"p\"\n[[case.check]]\nanswer_matches = \"(\"",
                "bad regex",
            ),
            (
                "[[case]]\nname = \"a\"\nprompt = \"p\"\n[[case.check]]\nfile_exists = \"../x\"",
                "inside the workspace",
            ),
            (
                "[[case]]\nname = \"a\"\nprompt = \"p\"\n[[case.check]]\nfile_exists = \"x\"\nstatus = \"DONE\"",
                "wanted exactly 1 element",
            ),
            (
                "[[case]]\nname = \"a\"\nprompt = \"p\"\n[[case.check]]\nfile_smells = \"x\"",
                "file_smells",
            ),
            (
                "[[case]]\nname = \"a\"\nprompt = \"p\"\nmin_pass_rate = 2.0",
                "min_pass_rate",
            ),
            (
                "[[case]]\nname = \"a\"\nprompt = \"p\"\nworkspace = \"no/such/dir\"",
                "not a folder",
            ),
            ("[[case]]\nname = \"a\"\nprompt = \"p\"\nmode = \"yolo\"", "mode 'yolo'"),
        ] {
            let err = format!("{:#}", Suite::parse(suite, Path::new("/nonexistent")).unwrap_err());
            assert!(err.contains(expected), "{suite:?}: {err}");
        }
    }
}
