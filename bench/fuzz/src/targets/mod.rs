//! One file per target; each `run` takes any bytes.

pub mod definitions;
pub mod http_request;
pub mod loom_toml;
pub mod path_jail;
pub mod scripted_model;
pub mod server_config;
pub mod streams;
pub mod text_calls;
pub mod tool_arguments;
pub mod ws_frame;
