//! Every key loom.toml can hold, read from the keys' JSON Schema: what a
//! test walks to be sure that each one is judged (trust, docs), so a key
//! added later cannot slip past a list kept by hand.

use schemars::Schema;
use serde_json::{Map, Value};

use crate::FileConfig;

/// Stands for a name the user chooses (a table's key, an MCP server's
/// name, a tool rule) or for any entry of an array of tables.
pub const ANY: &str = "*";

/// The JSON Schema of loom.toml's keys.
pub fn schema() -> Schema {
    schemars::schema_for!(FileConfig)
}

/// Every key of loom.toml as its path from the top (`["tools", "bash",
/// "sandbox"]`), [`ANY`] where the user chooses the name. A table's keys
/// are listed, not the table; an array of values is one key, an array of
/// tables (`[[hooks]]`) is walked into.
pub fn keys() -> Vec<Vec<String>> {
    let schema = schema();
    let root = schema.as_value();
    let defs = root
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut keys = Vec::new();
    walk(root, &defs, &mut Vec::new(), &mut keys);
    keys
}

fn walk(schema: &Value, defs: &Map<String, Value>, path: &mut Vec<String>, keys: &mut Vec<Vec<String>>) {
    let schema = table_of(schema, defs).unwrap_or(schema);
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, value) in properties {
            path.push(name.clone());
            walk(value, defs, path, keys);
            path.pop();
        }
        return;
    }
    let named = schema.get("additionalProperties").filter(|value| value.is_object());
    let items = schema.get("items").filter(|items| table_of(items, defs).is_some());
    match named.or(items) {
        Some(inner) => {
            path.push(ANY.to_string());
            walk(inner, defs, path, keys);
            path.pop();
        }
        None => keys.push(path.clone()),
    }
}

/// The table `schema` describes — itself, the definition it refers to, or
/// the one that is not `null` of an optional one — if it is a table.
fn table_of<'a>(schema: &'a Value, defs: &'a Map<String, Value>) -> Option<&'a Value> {
    let is_table = |value: &Value| {
        value.get("properties").is_some() || value.get("additionalProperties").is_some_and(Value::is_object)
    };
    if is_table(schema) {
        return Some(schema);
    }
    if let Some(name) = schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
    {
        return defs.get(name).and_then(|def| table_of(def, defs));
    }
    schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))
        .and_then(Value::as_array)
        .and_then(|choices| choices.iter().find_map(|choice| table_of(choice, defs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn has(keys: &[Vec<String>], dotted: &str) -> bool {
        keys.iter().any(|key| key.join(".") == dotted)
    }

    #[test]
    fn every_section_is_walked_to_its_keys() {
        let keys = keys();
        for dotted in [
            "model",
            "store",
            "cluster.redis",
            "tools.bash.sandbox",
            "tools.bash.env.*",
            "mcp.servers.*.command",
            "mcp.servers.*.args",
            "mcp.servers.*.env.*",
            "hooks.*.command",
            "permissions.*",
            "prices.*.input_per_mtok",
            "provider.headers.*",
            "server.tokens.*.token",
            "server.allowed_origins",
            "telemetry.otlp_endpoint",
            "snapshots.exclude",
            "retrieval.dir",
            "scheduler.tool_timeouts.*",
        ] {
            assert!(has(&keys, dotted), "{dotted} missing from {keys:?}");
        }
        assert!(!has(&keys, "tools.bash"), "a table is not a key");
        assert!(!keys.iter().any(|key| key.is_empty()));
    }
}
