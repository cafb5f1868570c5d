//! A tool's argument schema as offered to a model: without `null`.
//!
//! Derived schemas say an optional parameter is `{"type": ["integer",
//! "null"]}` (or `anyOf: [X, {"type": "null"}]`), and MCP servers send the
//! same. Local servers render `tools` through the model's chat template,
//! and several widely used templates (Hermes 2 Pro / 3, Command-R+, Seed-OSS,
//! GigaChat) fail on a type that is a list: every request that offers tools
//! is refused. An optional parameter needs no `null` — it is simply absent
//! from `required` — so the offered schema drops it, while the tool's
//! validator keeps the schema as written and still accepts a model that
//! sends an explicit `null` (see docs/tools.md).
//!
//! It also leaves out what tells a model nothing and costs prompt tokens on
//! every request: the description of the arguments object as a whole (the
//! tool's own description says it) and the integer widths derived schemas
//! add as `format` (`uint`, `int64`, …; not JSON Schema formats).

use serde_json::{Map, Value};

/// `schema` with `null` taken out of every `type` list, `enum`, `anyOf` and
/// `oneOf`; a list left with one entry becomes that entry.
pub fn offered(schema: &Value) -> Value {
    let mut schema = schema.clone();
    strip_null(&mut schema);
    strip_integer_widths(&mut schema);
    if let Some(object) = schema.as_object_mut() {
        object.remove("description");
    }
    schema
}

/// The `format` values derived schemas give Rust integers.
const INTEGER_WIDTHS: [&str; 12] = [
    "uint", "uint8", "uint16", "uint32", "uint64", "uint128", "int", "int8", "int16", "int32", "int64", "int128",
];

fn strip_integer_widths(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            if object
                .get("format")
                .and_then(Value::as_str)
                .is_some_and(|format| INTEGER_WIDTHS.contains(&format))
            {
                object.remove("format");
            }
            // `properties` maps names to schemas: a parameter named
            // `format` is a schema, never a width, so recursion is safe.
            object.values_mut().for_each(strip_integer_widths);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_integer_widths),
        _ => {}
    }
}

fn strip_null(schema: &mut Value) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    let mut removed_null = false;
    if let Some(Value::Array(types)) = object.get_mut("type") {
        let before = types.len();
        types.retain(|kind| kind != "null");
        removed_null = types.len() < before;
        match types.len() {
            // Only `null` was allowed: say so with a single type.
            0 => {
                object.insert("type".into(), Value::from("null"));
                removed_null = false;
            }
            1 => {
                let only = types.remove(0);
                object.insert("type".into(), only);
            }
            _ => {}
        }
    }
    if let Some(Value::Array(values)) = object.get_mut("enum") {
        if values.len() > 1 {
            let before = values.len();
            values.retain(|value| !value.is_null());
            removed_null |= values.len() < before;
        }
    }
    for key in ["anyOf", "oneOf"] {
        removed_null |= drop_null_alternative(object, key);
    }
    if removed_null && object.get("default").is_some_and(Value::is_null) {
        object.remove("default");
    }
    for (key, value) in object.iter_mut() {
        match key.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" => {
                if let Some(children) = value.as_object_mut() {
                    children.values_mut().for_each(strip_null);
                }
            }
            "items" | "additionalProperties" | "not" | "contains" | "propertyNames" | "if" | "then" | "else" => {
                match value {
                    Value::Array(children) => children.iter_mut().for_each(strip_null),
                    other => strip_null(other),
                }
            }
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => {
                if let Some(children) = value.as_array_mut() {
                    children.iter_mut().for_each(strip_null);
                }
            }
            _ => {}
        }
    }
}

/// Removes `{"type": "null"}` from the alternatives under `key`; one
/// alternative left is merged into `object` (its own words, such as a
/// description, win). Whether a `null` was removed.
fn drop_null_alternative(object: &mut Map<String, Value>, key: &str) -> bool {
    let Some(Value::Array(alternatives)) = object.get_mut(key) else {
        return false;
    };
    let before = alternatives.len();
    alternatives.retain(|alternative| !is_null_only(alternative));
    if alternatives.len() == before || alternatives.is_empty() {
        return false;
    }
    if alternatives.len() == 1 {
        if let Some(Value::Object(only)) = object.remove(key).and_then(|mut list| list.as_array_mut()?.pop()) {
            for (name, value) in only {
                object.entry(name).or_insert(value);
            }
        }
    }
    true
}

fn is_null_only(schema: &Value) -> bool {
    schema.get("type").is_some_and(|kind| kind == "null")
        && schema
            .as_object()
            .is_some_and(|object| object.keys().all(|key| key == "type" || key == "description"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_tells_a_model_nothing_is_left_out() {
        let schema = json!({
            "description": "Arguments of `read_file`.",
            "type": "object",
            "properties": {
                "limit": {"type": "integer", "format": "uint64", "minimum": 1, "description": "Most lines."},
                "when": {"type": "string", "format": "date-time"},
                "format": {"type": "string", "enum": ["uint", "json"]},
            },
        });
        assert_eq!(
            offered(&schema),
            json!({
                "type": "object",
                "properties": {
                    "limit": {"type": "integer", "minimum": 1, "description": "Most lines."},
                    "when": {"type": "string", "format": "date-time"},
                    "format": {"type": "string", "enum": ["uint", "json"]},
                },
            })
        );
    }

    #[test]
    fn optional_parameters_lose_their_null_type() {
        let schema = json!({
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "limit": {"type": ["integer", "null"], "format": "uint", "minimum": 1, "default": null},
                "either": {"type": ["string", "integer", "null"]},
                "tools": {"type": ["array", "null"], "items": {"type": ["string", "null"]}},
                "mode": {"enum": ["fast", "slow", null]},
            },
            "required": ["path"],
        });
        assert_eq!(
            offered(&schema),
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "limit": {"type": "integer", "minimum": 1},
                    "either": {"type": ["string", "integer"]},
                    "tools": {"type": "array", "items": {"type": "string"}},
                    "mode": {"enum": ["fast", "slow"]},
                },
                "required": ["path"],
            })
        );
    }

    #[test]
    fn a_null_alternative_is_dropped_and_a_single_one_left_merged() {
        let schema = json!({
            "type": "object",
            "properties": {
                "options": {
                    "description": "Extra options.",
                    "anyOf": [{"$ref": "#/$defs/Options", "description": "inner"}, {"type": "null"}],
                },
                "value": {"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
            },
            "$defs": {"Options": {"type": "object", "properties": {"deep": {"type": ["boolean", "null"]}}}},
        });
        assert_eq!(
            offered(&schema),
            json!({
                "type": "object",
                "properties": {
                    "options": {"description": "Extra options.", "$ref": "#/$defs/Options"},
                    "value": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                },
                "$defs": {"Options": {"type": "object", "properties": {"deep": {"type": "boolean"}}}},
            })
        );
    }

    #[test]
    fn a_schema_that_allows_only_null_is_kept_readable() {
        assert_eq!(offered(&json!({"type": ["null"]})), json!({"type": "null"}));
        assert_eq!(offered(&json!({"enum": [null]})), json!({"enum": [null]}));
        assert_eq!(offered(&json!(true)), json!(true));
    }
}
