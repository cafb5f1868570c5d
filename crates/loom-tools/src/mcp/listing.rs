//! A server's tool listing as the tools Loom offers: `SERVER__tool` names,
//! schemas checked one by one (a bad one is skipped, not the server).

use serde_json::Value;

/// The longest tool name providers accept.
const MAX_NAME: usize = 64;

/// A tool as the server listed it, ready to offer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolInfo {
    /// `SERVER__tool`, as offered to the model.
    pub name: String,
    /// The name on the server.
    pub remote: String,
    pub description: String,
    pub schema: Value,
    /// The server says calls change nothing (`readOnlyHint`).
    pub read_only: bool,
}

/// The offerable tools of a listing, and a reason for each one skipped.
pub(crate) fn tool_infos(server: &str, tools: Vec<rmcp::model::Tool>) -> (Vec<ToolInfo>, Vec<String>) {
    let mut infos: Vec<ToolInfo> = Vec::new();
    let mut skipped = Vec::new();
    for tool in tools {
        let remote = tool.name.to_string();
        let name = offered_name(server, &remote);
        if infos.iter().any(|info| info.name == name) {
            skipped.push(format!(
                "tool '{remote}' skipped: its name '{name}' is taken by another tool"
            ));
            continue;
        }
        let schema = match offered_schema(Value::Object((*tool.input_schema).clone())) {
            Ok(schema) => schema,
            Err(why) => {
                skipped.push(format!("tool '{remote}' skipped: its input schema is invalid ({why})"));
                continue;
            }
        };
        let read_only = tool
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.read_only_hint)
            .unwrap_or(false);
        infos.push(ToolInfo {
            name,
            remote,
            description: tool.description.map(|text| text.to_string()).unwrap_or_default(),
            schema,
            read_only,
        });
    }
    (infos, skipped)
}

/// `SERVER__tool` with every character providers refuse made `_`, cut to
/// 64 characters.
pub(crate) fn offered_name(server: &str, tool: &str) -> String {
    format!("{server}__{tool}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(MAX_NAME)
        .collect()
}

/// The schema as offered: compiled on its own first (an invalid one is
/// refused), without `$schema`, and always an object schema.
fn offered_schema(mut schema: Value) -> Result<Value, String> {
    jsonschema::validator_for(&schema).map_err(|err| err.to_string())?;
    if let Some(object) = schema.as_object_mut() {
        object.remove("$schema");
        object
            .entry("type")
            .or_insert_with(|| Value::String("object".to_string()));
        if object.get("type") != Some(&Value::String("object".to_string())) {
            return Err("the arguments are not an object".to_string());
        }
        object
            .entry("properties")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
    }
    Ok(schema)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed_cleaned_and_capped() {
        assert_eq!(offered_name("fs", "read_file"), "fs__read_file");
        assert_eq!(offered_name("srv", "do.thing/now"), "srv__do_thing_now");
        assert_eq!(offered_name("s", &"x".repeat(100)).len(), 64);
    }

    #[test]
    fn a_bad_schema_is_refused_and_a_bare_one_becomes_an_object() {
        let bad = serde_json::json!({"type": "object", "properties": {"x": {"type": "not-a-type"}}});
        assert!(offered_schema(bad).is_err());
        let bare = offered_schema(serde_json::json!({"$schema": "http://json-schema.org/draft-07/schema#"})).unwrap();
        assert_eq!(bare, serde_json::json!({"type": "object", "properties": {}}));
    }
}
