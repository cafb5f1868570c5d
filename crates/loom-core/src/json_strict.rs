//! Strict JSON for tool arguments and the gateway's requests: like
//! `serde_json`, but an object with a repeated key is an error instead of
//! silently keeping the last value — a model that sends `{"path": "a",
//! "path": "b"}`, or a client that sends `{"mode": "bypass", "mode":
//! "default"}`, must be told, not guessed.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Parses `text` as one JSON value, refusing duplicate object keys.
pub fn parse_strict(text: &str) -> Result<Value, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = Strict.deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(value)
}

/// [`parse_strict`] for bytes (an HTTP body): text that is not UTF-8 is
/// an error, as with `serde_json::from_slice`.
pub fn parse_strict_slice(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = Strict.deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(value)
}

struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number that JSON cannot hold"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Strict)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format!("duplicate key \"{key}\"")));
            }
            let value = map.next_value_seed(Strict)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_like_serde_json_but_refuses_duplicates() {
        let text = r#"{"a": [1, 2.5, "x", null, true], "b": {"c": {}}}"#;
        assert_eq!(
            parse_strict(text).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );
        let err = parse_strict(r#"{"path": "a", "path": "b"}"#).unwrap_err();
        assert!(err.to_string().contains("duplicate key \"path\""), "{err}");
        assert!(parse_strict(r#"{"a": {"b": 1, "b": 2}}"#).is_err());
        assert!(parse_strict(r#"{"path": "a""#).is_err(), "truncated");
        assert!(parse_strict(r#"{} trailing"#).is_err());
        assert_eq!(parse_strict("{}").unwrap(), json!({}));
        assert_eq!(
            parse_strict_slice(text.as_bytes()).unwrap(),
            parse_strict(text).unwrap()
        );
        assert!(parse_strict_slice(br#"[{"a": 1, "a": 1}]"#).is_err());
        assert!(parse_strict_slice(b"\"\xff\"").is_err(), "not UTF-8");
    }
}
