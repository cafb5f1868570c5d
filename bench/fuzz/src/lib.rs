//! Loom's fuzz targets (bench/fuzz/README.md): each takes any bytes and
//! drives one parser or gate of Loom as a run or the gateway drives it,
//! panicking only when a property of that code breaks — never because the
//! input is odd. The AFL++ entry (`src/bin/afl.rs`) runs one for as long as
//! it is told; `tests/regressions.rs` replays every input kept in
//! `corpus/` and `crashes/` on each `cargo test`.

pub mod mutate;
pub mod pieces;
pub mod targets;

/// A fuzz target: a name (its folder in `corpus/` and `crashes/`) and the
/// function that takes one input.
#[derive(Clone, Copy)]
pub struct Target {
    /// Its name.
    pub name: &'static str,
    /// What it drives.
    pub about: &'static str,
    /// Takes one input.
    pub run: fn(&[u8]),
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "openai_stream",
        about: "an OpenAI chat-completions SSE body, cut anywhere, through the SSE decoder and the chunk parser",
        run: targets::streams::openai,
    },
    Target {
        name: "anthropic_stream",
        about: "an Anthropic Messages SSE body, cut anywhere, through the SSE decoder and the event parser",
        run: targets::streams::anthropic,
    },
    Target {
        name: "text_tool_calls",
        about: "a text-only model's answer, cut anywhere, read for <tool_call> blocks",
        run: targets::text_calls::run,
    },
    Target {
        name: "ws_frame",
        about: "a WebSocket text frame read as a request frame, then its method's typed params",
        run: targets::ws_frame::run,
    },
    Target {
        name: "http_request",
        about: "an HTTP request (method, path and query, headers, body) through the gateway's router in process",
        run: targets::http_request::run,
    },
    Target {
        name: "server_config",
        about: "[server] of loom.toml (TOML) into the gateway's settings and limits",
        run: targets::server_config::run,
    },
    Target {
        name: "loom_toml",
        about: "a whole loom.toml as the loom command parses it, and its [server] section into limits",
        run: targets::loom_toml::run,
    },
    Target {
        name: "definition_files",
        about: "an agent file and a SKILL.md: YAML front matter and a body",
        run: targets::definitions::run,
    },
    Target {
        name: "scripted_model",
        about: "a scripted-model file, JSON or YAML",
        run: targets::scripted_model::run,
    },
    Target {
        name: "tool_arguments",
        about: "a model's tool arguments (text or JSON) through the strict parser and the tool's schema",
        run: targets::tool_arguments::run,
    },
    Target {
        name: "path_jail",
        about: "a path a model names, opened through the workspace jail, which holds symlinks that lead out",
        run: targets::path_jail::run,
    },
];

/// The target named `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().copied().find(|target| target.name == name)
}
