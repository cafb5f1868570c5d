//! The `loom` command's whole loom.toml: text into `FileConfig` through
//! `loom_config::parse` (the parser the command uses), or an error that
//! says where. A file that parses has its `[server]` section turned into
//! the gateway's limits as `loom serve` would.

use loom_server::ServerConfig;

pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match loom_config::parse(text) {
        Ok(file) => {
            if let Some(settings) = &file.server {
                if let Ok(config) = ServerConfig::from_settings(settings, None) {
                    assert!(config.max_runs >= 1 && config.max_connections >= 1, "{config:?}");
                }
            }
        }
        Err(err) => {
            // The line named is one of the text's (or the one after its
            // last newline, where an unfinished table ends), and the key
            // is written on it.
            if let Some(line) = err.line {
                assert!(line >= 1 && line <= text.split('\n').count(), "line {line}: {err}");
                if let Some(key) = &err.key {
                    let written = text.split('\n').nth(line - 1).unwrap_or_default();
                    assert!(
                        written.contains(key.as_str()),
                        "key {key:?} not on line {line}: {written:?}"
                    );
                }
            }
            assert!(!err.message.is_empty(), "an error without a message");
        }
    }
}
