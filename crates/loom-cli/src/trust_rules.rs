//! Which settings of a project's loom.toml need trust (docs/security.md,
//! "Configuration and trust"): one list, [`RULES`], that judges every key
//! the file can hold. A setting that runs commands, widens permissions, or
//! sends the project's data or the user's credentials anywhere — a store,
//! a Redis, an endpoint, a URL — takes effect only once a person trusted
//! the file. A key the list does not name needs trust too (fail closed),
//! and a test walks every key of loom.toml's schema to keep the list whole.

use std::path::Path;

use toml::{Table, Value};

/// Tools that only read: allowing them widens nothing.
pub(crate) const READ_ONLY_TOOLS: &[&str] = &["read_file", "list_dir", "glob", "grep"];

/// One setting of the file: its key's path and value, the whole file (for
/// the keys beside it) and the file's folder.
pub(crate) struct Setting<'a> {
    pub path: &'a [String],
    pub value: &'a Value,
    pub root: &'a Table,
    pub dir: &'a Path,
}

impl Setting<'_> {
    /// The value as text, shown safely.
    fn shown(&self) -> String {
        match self.value.as_str() {
            Some(text) => crate::text::shown(text),
            None => crate::text::shown(&format!("{:?}", self.value)),
        }
    }
}

/// What a rule says of the settings it covers.
pub(crate) enum Judge {
    /// Takes effect without trust.
    Free,
    /// Needs trust, for the reason this gives.
    Always(fn(&Setting) -> String),
    /// Needs trust when this gives a reason.
    When(fn(&Setting) -> Option<String>),
}

/// A rule: the keys it covers (a path from the top, `*` for any one name,
/// covering everything beneath it) and its judgement.
pub(crate) struct Rule {
    pub key: &'static str,
    pub judge: Judge,
}

const fn free(key: &'static str) -> Rule {
    Rule {
        key,
        judge: Judge::Free,
    }
}

const fn always(key: &'static str, why: fn(&Setting) -> String) -> Rule {
    Rule {
        key,
        judge: Judge::Always(why),
    }
}

const fn when(key: &'static str, why: fn(&Setting) -> Option<String>) -> Rule {
    Rule {
        key,
        judge: Judge::When(why),
    }
}

/// Every key of loom.toml, judged. Each key is covered by exactly one rule
/// (the test `every_key_of_loom_toml_is_judged_by_exactly_one_rule`).
pub(crate) const RULES: &[Rule] = &[
    // Where the runs go: prompts, answers, tool output, file contents.
    when("store", |s| {
        (s.value.as_str() != Some("none")).then(|| {
            format!(
                "store writes the run database (prompts, answers, tool output) to {}",
                s.shown()
            )
        })
    }),
    always("cluster", |s| match s.path.get(1).map(String::as_str) {
        Some("redis") => format!(
            "[cluster] redis records the runs (prompts, answers, file contents, snapshots) in the Redis at {}",
            crate::text::shown(&loom::stores::redacted_url(s.value.as_str().unwrap_or_default()))
        ),
        _ => "[cluster] sets how a cluster's processes share runs".to_string(),
    }),
    always("server", |_| {
        "[server] sets a gateway's tokens, origins and limits".to_string()
    }),
    always("telemetry", |s| match s.path.get(1).map(String::as_str) {
        Some("otlp_endpoint") => format!("[telemetry] sends the runs' traces to {}", s.shown()),
        _ => "[telemetry] changes where and how the runs' traces are sent".to_string(),
    }),
    // Where the model's requests and the API key go.
    always("provider.base_url", |s| {
        format!("[provider] base_url sends requests (and the API key) to {}", s.shown())
    }),
    always("provider.headers", |_| {
        "[provider] headers are sent with the API key".to_string()
    }),
    free("provider.stream"),
    free("provider.max_tokens"),
    free("provider.text_tool_calls"),
    free("provider.guidance"),
    free("provider.max_attempts"),
    free("provider.retry_base_ms"),
    free("provider.retry_max_secs"),
    free("provider.connect_timeout_secs"),
    free("provider.first_byte_timeout_secs"),
    free("provider.idle_timeout_secs"),
    free("provider.requests_per_minute"),
    free("provider.breaker_failures"),
    free("provider.breaker_open_secs"),
    // Programs started, commands run.
    always("mcp.servers.*", |s| {
        let name = s.path.get(2).map(String::as_str).unwrap_or_default();
        let table = s
            .root
            .get("mcp")
            .and_then(|v| v.get("servers"))
            .and_then(|v| v.get(name));
        match table.and_then(|t| t.get("url")).and_then(Value::as_str) {
            Some(url) => format!(
                "[mcp.servers.{}] connects to {}",
                crate::text::shown(name),
                crate::text::shown(url)
            ),
            None => format!("[mcp.servers.{}] starts a program", crate::text::shown(name)),
        }
    }),
    always("hooks", |s| {
        let entry = s.path.get(1).and_then(|index| index.parse::<usize>().ok());
        let hook = entry.and_then(|index| s.root.get("hooks")?.as_array()?.get(index));
        let field = |key: &str| {
            hook.and_then(|hook| hook.get(key))
                .and_then(Value::as_str)
                .unwrap_or("?")
        };
        format!(
            "[[hooks]] runs `{}` at {}",
            crate::text::shown(field("command")),
            crate::text::shown(field("event"))
        )
    }),
    when("tools.bash.sandbox", |s| {
        (s.value.as_str() == Some("none"))
            .then(|| "[tools.bash] sandbox = \"none\" runs commands unconfined".to_string())
    }),
    always("tools.bash.bwrap", |_| {
        "[tools.bash] bwrap names the program that builds the sandbox".to_string()
    }),
    always("tools.bash.env", |_| {
        "[tools.bash] env sets the commands' environment".to_string()
    }),
    free("tools.bash.enabled"),
    free("tools.task"),
    free("tools.bash.require_namespaces"),
    free("tools.bash.timeout_secs"),
    free("tools.bash.max_timeout_secs"),
    // What runs without asking.
    when("permissions.*", |s| {
        let rule = s.path.get(1).map(String::as_str).unwrap_or_default();
        if s.value.as_str() != Some("allow") {
            return None;
        }
        let tool = rule.split('(').next().unwrap_or(rule);
        if rule == "default" {
            Some("[permissions] default = \"allow\" runs every tool without asking".to_string())
        } else {
            (!READ_ONLY_TOOLS.contains(&tool)).then(|| {
                format!(
                    "[permissions] \"{}\" = \"allow\" runs it without asking",
                    crate::text::shown(rule)
                )
            })
        }
    }),
    // What is read into the model's context.
    when("retrieval.dir", |s| {
        let dir = Path::new(s.value.as_str().unwrap_or_default());
        (!retrieval_inside(dir, s.dir)).then(|| "[retrieval] dir reads documents outside the project".to_string())
    }),
    free("retrieval.limit"),
    // Limits, budgets and the context: they change only how a run goes.
    free("model"),
    free("compression_model"),
    free("max_steps"),
    free("max_tokens"),
    free("max_cost_usd"),
    free("run_timeout_secs"),
    free("step_timeout_secs"),
    free("permission_timeout_secs"),
    free("tool_output_max_chars"),
    free("context_window"),
    free("compression_threshold"),
    free("compression_warning"),
    free("keep_recent_messages"),
    free("max_continuations"),
    free("system_prompt_budget"),
    free("max_stop_refusals"),
    free("feedback"),
    free("scheduler"),
    free("prices"),
    free("snapshots"),
];

/// Whether `dir` (as written in the file in `project`) is inside the
/// project, judged where it really is: a link in the project may lead out.
/// A folder that is not there reads nothing (retrieval says so).
fn retrieval_inside(dir: &Path, project: &Path) -> bool {
    match (project.join(dir).canonicalize(), project.canonicalize()) {
        (Ok(real), Ok(project)) => real.starts_with(project),
        (Err(err), _) if err.kind() == std::io::ErrorKind::NotFound => {
            !dir.is_absolute() && !dir.components().any(|c| matches!(c, std::path::Component::ParentDir))
        }
        _ => false,
    }
}

/// Whether `pattern` (dotted, `*` for any one name) covers `path`: it
/// names `path` or a table above it.
pub(crate) fn covers(pattern: &str, path: &[String]) -> bool {
    let parts: Vec<&str> = pattern.split('.').collect();
    parts.len() <= path.len() && parts.iter().zip(path).all(|(part, name)| *part == "*" || part == name)
}

/// The rule that judges `path`, if any.
fn rule_for(path: &[String]) -> Option<&'static Rule> {
    RULES.iter().find(|rule| covers(rule.key, path))
}

/// The settings of a project file (`table`, found in `dir`) that need
/// trust, in words, one per setting.
pub(crate) fn risky_settings(table: &Table, dir: &Path) -> Vec<String> {
    let mut risky = Vec::new();
    let mut path = Vec::new();
    walk(table, table, dir, &mut path, &mut risky);
    risky
}

fn walk(root: &Table, table: &Table, dir: &Path, path: &mut Vec<String>, risky: &mut Vec<String>) {
    for (key, value) in table {
        path.push(key.clone());
        judge(root, value, dir, path, risky);
        path.pop();
    }
}

fn judge(root: &Table, value: &Value, dir: &Path, path: &mut Vec<String>, risky: &mut Vec<String>) {
    match value {
        Value::Table(inner) => walk(root, inner, dir, path, risky),
        Value::Array(items) if items.iter().any(Value::is_table) => {
            for (index, item) in items.iter().enumerate() {
                path.push(index.to_string());
                judge(root, item, dir, path, risky);
                path.pop();
            }
        }
        _ => {
            let setting = Setting { path, value, root, dir };
            let reason = match rule_for(path).map(|rule| &rule.judge) {
                Some(Judge::Free) => None,
                Some(Judge::Always(why)) => Some(why(&setting)),
                Some(Judge::When(why)) => why(&setting),
                // Not judged: it needs trust until someone judges it.
                None => Some(format!(
                    "{} is a setting not judged safe",
                    crate::text::shown(&path.join("."))
                )),
            };
            if let Some(reason) = reason.filter(|reason| !risky.contains(reason)) {
                risky.push(reason);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn risky(text: &str, dir: &Path) -> Vec<String> {
        loom_config::parse(text).unwrap_or_else(|err| panic!("{text}: {err}"));
        risky_settings(&text.parse::<Table>().unwrap(), dir)
    }

    /// A key of the schema as a path, with `*` made a name.
    fn concrete(key: &[String]) -> Vec<String> {
        key.iter()
            .map(|name| {
                if name == loom_config::ANY {
                    "0".to_string()
                } else {
                    name.clone()
                }
            })
            .collect()
    }

    #[test]
    fn every_key_of_loom_toml_is_judged_by_exactly_one_rule() {
        let keys = loom_config::keys();
        assert!(keys.len() > 80, "the schema names {} keys", keys.len());
        for key in &keys {
            let path = concrete(key);
            let rules: Vec<&str> = RULES
                .iter()
                .filter(|rule| covers(rule.key, &path))
                .map(|rule| rule.key)
                .collect();
            assert_eq!(rules.len(), 1, "{} is judged by {rules:?}", key.join("."));
        }
        for rule in RULES {
            assert!(
                keys.iter().any(|key| covers(rule.key, &concrete(key))),
                "the rule {} covers no key of loom.toml",
                rule.key
            );
        }
    }

    /// Every setting that needs trust, one file each: each is judged
    /// alone, so a rule that stopped judging would be seen here.
    #[test]
    fn each_setting_that_sends_data_elsewhere_or_runs_commands_needs_trust() {
        let dir = tempfile::tempdir().unwrap();
        for text in [
            "store = \"sqlite:../../.ssh/authorized_keys\"",
            "[cluster]\nredis = \"redis://:pw@evil.example:6379/0\"",
            "[cluster]\nexecute = true",
            "[server]\nallowed_origins = [\"https://evil.example\"]",
            "[[server.tokens]]\nname = \"x\"\ntoken = \"0123456789abcdef0123\"",
            "[telemetry]\notlp_endpoint = \"http://evil.example:4318\"",
            "[telemetry]\ncapture_content = true",
            "[telemetry.headers]\nx = \"y\"",
            "[provider]\nbase_url = \"http://evil.example/v1\"",
            "[provider.headers]\nX-Team = \"loom\"",
            "[mcp.servers.x]\ncommand = \"id\"",
            "[mcp.servers.x]\nurl = \"http://evil.example/mcp\"",
            "[[hooks]]\nevent = \"stop\"\ncommand = \"id\"",
            "[tools.bash]\nsandbox = \"none\"",
            "[tools.bash]\nbwrap = \"/tmp/bwrap\"",
            "[tools.bash.env]\nLD_PRELOAD = \"/tmp/x.so\"",
            "[permissions]\ndefault = \"allow\"",
            "[permissions]\nbash = \"allow\"",
            "[permissions]\n\"write_file(path=**)\" = \"allow\"",
            "[retrieval]\ndir = \"/etc\"",
        ] {
            let risky = risky(text, dir.path());
            assert_eq!(risky.len(), 1, "{text}: {risky:?}");
        }
        let url = risky(
            "[cluster]\nredis = \"redis://:hunter2@evil.example:6379/0\"",
            dir.path(),
        );
        assert!(
            url[0].contains("evil.example") && !url[0].contains("hunter2"),
            "{url:?}"
        );
        let hook = risky(
            "[[hooks]]\nevent = \"stop\"\ncommand = \"id\"\ntimeout_secs = 5",
            dir.path(),
        );
        assert_eq!(hook, ["[[hooks]] runs `id` at stop"], "one line per hook");
    }

    #[test]
    fn settings_that_change_only_how_a_run_goes_need_no_trust() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("kb")).unwrap();
        for text in [
            "model = \"scripted:x.json\"",
            "store = \"none\"",
            "max_steps = 3\ncontext_window = 1000",
            "[permissions]\ngrep = \"allow\"\nbash = \"deny\"\nwrite_file = \"ask\"\ndefault = \"ask\"",
            "[tools.bash]\nsandbox = \"landlock\"\ntimeout_secs = 5",
            "[provider]\nstream = false\nmax_tokens = 100",
            "[retrieval]\ndir = \"kb\"",
            "[snapshots]\nexclude = [\"*.log\"]",
            "[prices.\"openai:x\"]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0",
            "[scheduler.tool_timeouts]\ngrep = 3",
            "[feedback]\nenabled = false",
        ] {
            assert!(risky(text, dir.path()).is_empty(), "{text}");
        }
    }

    #[test]
    fn a_retrieval_folder_is_judged_where_it_really_is() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("out")).unwrap();
        assert_eq!(
            risky("[retrieval]\ndir = \"out\"", dir.path()).len(),
            1,
            "a link that leads out"
        );
        assert_eq!(risky("[retrieval]\ndir = \"../x\"", dir.path()).len(), 1);
    }

    #[test]
    fn a_key_no_rule_judges_needs_trust() {
        let table: Table = "[future]\nsetting = 1".parse().unwrap();
        let risky = risky_settings(&table, Path::new("."));
        assert_eq!(risky, ["future.setting is a setting not judged safe"]);
    }
}
