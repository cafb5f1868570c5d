//! A model's arguments for a built-in tool, as text it streamed (parsed
//! strictly: a repeated key is refused) or as JSON, through the pipeline's
//! validate stage with the tool's schema. The stage passes on an object the
//! schema accepts, or answers the model in words; a text it passes parses
//! strictly to the same value.

use std::sync::{Arc, OnceLock};

use loom_core::tool::ToolRegistry;
use loom_core::DynTool;
use serde_json::Value;

fn registry() -> &'static ToolRegistry {
    static REGISTRY: OnceLock<ToolRegistry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut tools = loom_tools::file_tools();
        tools.push(Arc::new(loom_tools::Bash::new(loom_tools::BashSettings::default())) as Arc<dyn DynTool>);
        tools.push(Arc::new(loom_tools::Task::new()) as Arc<dyn DynTool>);
        let mut registry = ToolRegistry::new();
        for tool in tools {
            // The built-in schemas compile (a unit test of each tool says so).
            if registry.register(tool).is_err() {
                continue;
            }
        }
        registry
    })
}

pub fn run(data: &[u8]) {
    let Some((&choice, body)) = data.split_first() else {
        return;
    };
    let registry = registry();
    let names: Vec<&str> = registry.names().collect();
    let Some(name) = names.get(usize::from(choice) % names.len().max(1)) else {
        return;
    };
    let Some(registered) = registry.get(name) else {
        return;
    };
    let text = String::from_utf8_lossy(body).into_owned();
    // As streamed text (what a model sends when its JSON may be broken).
    let as_text = loom_core::fuzzing::validate_arguments(registered, &Value::String(text.clone()));
    if let Ok(passed) = &as_text {
        assert!(passed.is_object(), "{name}: passed a non-object {passed}");
        let strict = loom_core::json_strict::parse_strict(&text);
        assert_eq!(strict.as_ref().ok(), Some(passed), "{name}: {text:?}");
    }
    // As a JSON value (what a provider with native tool calls hands over).
    if let Ok(value) = serde_json::from_str::<Value>(&text) {
        if let Ok(passed) = loom_core::fuzzing::validate_arguments(registered, &value) {
            assert!(passed.is_object(), "{name}: passed a non-object {passed}");
        }
    }
}
