//! `[server]` of loom.toml: TOML into `ServerSettings`, then into the
//! limits the gateway runs with — or a typed error. Whatever the file says,
//! the limits that follow stay in their bounds.

use loom_server::{ServerConfig, ServerSettings};

pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(settings) = toml::from_str::<ServerSettings>(text) else {
        return;
    };
    if let Ok(config) = ServerConfig::from_settings(&settings, None) {
        assert!(config.max_runs >= 1 && config.max_runs_per_token >= 1, "{config:?}");
        assert!(config.max_connections >= 1, "{config:?}");
        assert!(config.max_frame_bytes >= 1, "{config:?}");
    }
}
