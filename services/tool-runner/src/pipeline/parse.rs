//! Stage 2: parse the raw argument string as JSON, and repair a model's common
//! slips only where the tool's schema asks for something else: an array or
//! object sent as a JSON string, a number or boolean sent as a string, a lone
//! value where an array is expected. Anything else is left for validation to
//! refuse with the offending path.

use super::normalize::{Failure, Stage};
use serde_json::{Map, Value};

/// Parsed arguments and what was repaired to get them.
#[derive(Clone, Debug)]
pub struct Parsed {
    /// The arguments object.
    pub value: Value,
    /// One line per repair, naming the JSON pointer.
    pub repairs: Vec<String>,
}

/// Parses `raw` and repairs it against `schema`.
pub fn parse(raw: &str, schema: &Value) -> Result<Parsed, Failure> {
    let mut repairs = Vec::new();
    let trimmed = raw.trim();
    let mut value = if trimmed.is_empty() {
        // Models send "" for tools without parameters.
        repairs.push("/: empty argument string read as {}".to_owned());
        Value::Object(Map::new())
    } else {
        serde_json::from_str::<Value>(trimmed).map_err(|e| {
            Failure::new(
                Stage::Parse,
                format!(
                    "the arguments are not valid JSON ({e}): {}",
                    snippet(trimmed, 200)
                ),
            )
        })?
    };
    // An object sent as a JSON string of an object (double-encoded).
    if let Value::String(s) = &value
        && let Ok(inner @ Value::Object(_)) = serde_json::from_str::<Value>(s)
    {
        value = inner;
        repairs.push("/: the arguments object was sent as a JSON string".to_owned());
    }
    if !value.is_object() {
        return Err(Failure::new(
            Stage::Parse,
            format!(
                "the arguments must be a JSON object, got {}: {}",
                kind_of(&value),
                snippet(trimmed, 200)
            ),
        ));
    }
    repair(&mut value, schema, &mut String::new(), &mut repairs);
    Ok(Parsed { value, repairs })
}

fn snippet(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(max).collect::<String>())
    }
}

/// The JSON type name of a value, as JSON Schema spells it.
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn expected_types(schema: &Value) -> Vec<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

fn matches_type(v: &Value, t: &str) -> bool {
    match t {
        "integer" => match v {
            Value::Number(n) => {
                n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
            }
            _ => false,
        },
        "number" => v.is_number(),
        other => kind_of(v) == other || (other == "number" && v.is_number()),
    }
}

fn repair(value: &mut Value, schema: &Value, path: &mut String, repairs: &mut Vec<String>) {
    let types = expected_types(schema);
    if !types.is_empty() && !types.iter().any(|t| matches_type(value, t)) {
        try_repair(value, schema, &types, path, repairs);
    }
    match value {
        Value::Object(map) => {
            if let Some(Value::Object(props)) = schema.get("properties") {
                for (k, sub) in props {
                    if let Some(child) = map.get_mut(k) {
                        let len = path.len();
                        path.push('/');
                        path.push_str(&escape_pointer(k));
                        repair(child, sub, path, repairs);
                        path.truncate(len);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items").filter(|s| s.is_object()) {
                for (i, child) in items.iter_mut().enumerate() {
                    let len = path.len();
                    path.push('/');
                    path.push_str(&i.to_string());
                    repair(child, item_schema, path, repairs);
                    path.truncate(len);
                }
            }
        }
        _ => {}
    }
}

fn try_repair(
    value: &mut Value,
    schema: &Value,
    types: &[&str],
    path: &str,
    repairs: &mut Vec<String>,
) {
    let at = if path.is_empty() { "/" } else { path };
    if let Value::String(s) = &*value {
        let text = s.trim();
        for t in types {
            let fixed = match *t {
                "array" | "object" => serde_json::from_str::<Value>(text)
                    .ok()
                    .filter(|v| matches_type(v, t)),
                "integer" => text.parse::<i64>().ok().map(Value::from),
                "number" => text.parse::<i64>().ok().map(Value::from).or_else(|| {
                    text.parse::<f64>()
                        .ok()
                        .filter(|f| f.is_finite())
                        .and_then(serde_json::Number::from_f64)
                        .map(Value::Number)
                }),
                "boolean" => match text.to_ascii_lowercase().as_str() {
                    "true" => Some(Value::Bool(true)),
                    "false" => Some(Value::Bool(false)),
                    _ => None,
                },
                _ => None,
            };
            if let Some(v) = fixed {
                repairs.push(format!("{at}: {t} sent as a string was read as {t}"));
                *value = v;
                return;
            }
        }
    }
    if types.contains(&"array") && !value.is_null() && !value.is_array() {
        // A lone value where an array is expected; keep it only if it fits the items.
        let item_types = schema.get("items").map(expected_types).unwrap_or_default();
        let mut item = value.clone();
        if !item_types.is_empty() && !item_types.iter().any(|t| matches_type(&item, t)) {
            let mut sub = Vec::new();
            try_repair(
                &mut item,
                schema.get("items").unwrap_or(&Value::Null),
                &item_types,
                path,
                &mut sub,
            );
            if !item_types.iter().any(|t| matches_type(&item, t)) {
                return;
            }
        }
        repairs.push(format!(
            "{at}: a lone {} where an array is expected was wrapped in an array",
            kind_of(value)
        ));
        *value = Value::Array(vec![item]);
    }
}

fn escape_pointer(k: &str) -> String {
    k.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "packages": {"type": "array", "items": {"type": "string"}},
                "upgrade": {"type": "boolean"},
                "count": {"type": "integer"},
                "ratio": {"type": "number"},
                "opts": {"type": "object", "properties": {"depth": {"type": "integer"}}},
                "name": {"type": "string"}
            }
        })
    }

    #[test]
    fn well_formed_arguments_are_untouched() {
        let p = parse(r#"{"packages":["a"],"upgrade":true,"count":3}"#, &schema()).unwrap();
        assert!(p.repairs.is_empty());
        assert_eq!(p.value, json!({"packages":["a"],"upgrade":true,"count":3}));
    }

    #[test]
    fn common_slips_are_repaired_and_reported() {
        let raw = r#"{"packages":"[\"numpy\",\"scipy\"]","upgrade":"true","count":"7","ratio":"0.5","opts":"{\"depth\":\"2\"}"}"#;
        let p = parse(raw, &schema()).unwrap();
        assert_eq!(
            p.value,
            json!({"packages":["numpy","scipy"],"upgrade":true,"count":7,"ratio":0.5,"opts":{"depth":2}})
        );
        let all = p.repairs.join("\n");
        for path in [
            "/packages",
            "/upgrade",
            "/count",
            "/ratio",
            "/opts",
            "/opts/depth",
        ] {
            assert!(all.contains(&format!("{path}:")), "{path} missing in {all}");
        }
    }

    #[test]
    fn lone_value_is_wrapped() {
        let p = parse(r#"{"packages":"numpy"}"#, &schema()).unwrap();
        assert_eq!(p.value, json!({"packages":["numpy"]}));
        assert!(p.repairs[0].contains("/packages") && p.repairs[0].contains("wrapped"));
        // Object args sent double-encoded.
        let p = parse(r#""{\"name\":\"x\"}""#, &schema()).unwrap();
        assert_eq!(p.value, json!({"name":"x"}));
    }

    #[test]
    fn limits_of_repair() {
        // A string where a string is expected is never touched, even if it looks like JSON.
        let p = parse(r#"{"name":"[1,2]"}"#, &schema()).unwrap();
        assert_eq!(p.value, json!({"name":"[1,2]"}));
        // Not a number: left alone for validation to refuse.
        let p = parse(
            r#"{"count":"seven","upgrade":"yes","packages":[1]}"#,
            &schema(),
        )
        .unwrap();
        assert_eq!(
            p.value,
            json!({"count":"seven","upgrade":"yes","packages":[1]})
        );
        assert!(p.repairs.is_empty());
        // A lone object where an array of strings is expected is not wrapped.
        let p = parse(r#"{"packages":{"a":1}}"#, &schema()).unwrap();
        assert_eq!(p.value, json!({"packages":{"a":1}}));
        // Not JSON, or not an object: clear errors.
        let e = parse(r#"{"packages": ["a",}"#, &schema()).unwrap_err();
        assert_eq!(e.stage, Stage::Parse);
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        let e = parse("[1,2]", &schema()).unwrap_err();
        assert!(
            e.message.contains("must be a JSON object, got array"),
            "{}",
            e.message
        );
        // Empty string → {}.
        assert_eq!(parse("  ", &schema()).unwrap().value, json!({}));
    }
}
