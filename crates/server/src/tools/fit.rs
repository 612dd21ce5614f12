//! Whether JSON arguments fit a tool's declared parameters.
//!
//! Used for *untagged* calls only (a bare or fenced `{"name", "arguments"}` object
//! without the template's call markup). Such text is ambiguous: small models write
//! it both to call a tool and to show what a call would look like when no offered
//! tool fits the question. An object whose arguments break the tool's schema
//! (a required parameter missing, one that is not declared, a wrong type or a
//! value outside an enum) is taken as text. Calls in the template's own markup are
//! never second-guessed.

use serde_json::Value;

/// Whether `v` fits `schema` (a JSON Schema subset: `type`, `enum`, `properties`,
/// `required`, `additionalProperties: false`, `items`, `anyOf`/`oneOf`). Keywords
/// outside that subset, and type names it does not know, accept anything; `null`
/// for an optional property counts as leaving it out.
pub(crate) fn fits(v: &Value, schema: &Value) -> bool {
    let Some(s) = schema.as_object() else {
        return true;
    };
    for key in ["anyOf", "oneOf"] {
        if let Some(alts) = s.get(key).and_then(Value::as_array) {
            if !alts.iter().any(|alt| fits(v, alt)) {
                return false;
            }
        }
    }
    if let Some(allowed) = s.get("enum").and_then(Value::as_array) {
        if !allowed.contains(v) {
            return false;
        }
    }
    let type_ok = match s.get("type") {
        Some(Value::String(t)) => is_type(v, t),
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).any(|t| is_type(v, t)),
        _ => true,
    };
    if !type_ok {
        return false;
    }
    match v {
        Value::Object(o) => {
            let props = s.get("properties").and_then(Value::as_object);
            let required = s.get("required").and_then(Value::as_array);
            if required
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .any(|r| !o.contains_key(r))
            {
                return false;
            }
            let closed = s.get("additionalProperties") == Some(&Value::Bool(false));
            let is_required = |k: &str| required.into_iter().flatten().any(|r| r == k);
            o.iter().all(|(k, val)| match props.and_then(|p| p.get(k)) {
                // Models often spell out optional parameters they leave unset as `null`:
                // that is an absent value, not a wrong type.
                Some(_) if val.is_null() && !is_required(k) => true,
                Some(ps) => fits(val, ps),
                None => !closed,
            })
        }
        Value::Array(items) => match s.get("items") {
            Some(is) if is.is_object() => items.iter().all(|x| fits(x, is)),
            _ => true,
        },
        _ => true,
    }
}

/// JSON Schema type names, plus the Python-style names some tool specs use.
fn is_type(v: &Value, t: &str) -> bool {
    match t {
        "string" | "str" => v.is_string(),
        "integer" | "int" => v.is_i64() || v.is_u64(),
        "number" | "float" => v.is_number(),
        "boolean" | "bool" => v.is_boolean(),
        "array" | "list" | "tuple" => v.is_array(),
        "object" | "dict" => v.is_object(),
        "null" => v.is_null(),
        _ => true,
    }
}

/// Whether untagged call arguments fit a tool's `parameters` schema: besides
/// [`fits`], parameters the schema does not declare are refused (a call that
/// invents parameters is more likely an illustration than a call).
pub(crate) fn call_fits(args: &Value, parameters: &Value) -> bool {
    if !fits(args, parameters) {
        return false;
    }
    let Some(a) = args.as_object() else {
        return false;
    };
    // No `properties` at all declares nothing to hold the keys against.
    match parameters.get("properties").and_then(Value::as_object) {
        Some(p) => a.keys().all(|k| p.contains_key(k)),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params() -> Value {
        json!({"type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "coords": {"type": "array", "items": {"type": "number"}},
                "opts": {"type": "dict", "properties": {"fast": {"type": "boolean"}}},
                "id": {"anyOf": [{"type": "string"}, {"type": "integer"}]}
            },
            "required": ["city"]})
    }

    #[test]
    fn valid_arguments_fit() {
        let p = params();
        for a in [
            json!({"city": "Oslo"}),
            json!({"city": "Oslo", "days": 3, "unit": "c"}),
            json!({"city": "Oslo", "coords": [1, 2.5], "opts": {"fast": true}}),
            json!({"city": "Oslo", "id": 7}),
            json!({"city": "Oslo", "id": "x7"}),
            json!({"city": "Oslo", "days": null, "unit": null}),
        ] {
            assert!(call_fits(&a, &p), "{a}");
        }
    }

    #[test]
    fn broken_arguments_do_not_fit() {
        let p = params();
        for a in [
            json!({}),
            json!({"days": 3}),
            json!({"city": 5}),
            json!({"city": "Oslo", "days": 2.5}),
            json!({"city": "Oslo", "unit": "kelvin"}),
            json!({"city": "Oslo", "coords": ["north"]}),
            json!({"city": "Oslo", "opts": {"fast": "yes"}}),
            json!({"city": "Oslo", "id": true}),
            json!({"city": "Oslo", "country": "NO"}),
            json!({"city": null}),
            json!(["Oslo"]),
        ] {
            assert!(!call_fits(&a, &p), "{a}");
        }
    }

    #[test]
    fn a_tool_without_parameters_takes_empty_arguments() {
        assert!(call_fits(
            &json!({}),
            &json!({"type": "object", "properties": {}})
        ));
        assert!(call_fits(&json!({}), &json!({})));
        assert!(call_fits(&json!({"free": 1}), &json!({"type": "object"})));
        assert!(!call_fits(
            &json!({"x": 1}),
            &json!({"type": "object", "properties": {}})
        ));
    }

    #[test]
    fn unknown_keywords_and_types_accept() {
        assert!(fits(
            &json!("2024-01-01"),
            &json!({"type": "string", "format": "date"})
        ));
        assert!(fits(&json!(3), &json!({"type": "any"})));
        assert!(fits(&json!(null), &json!({"type": ["string", "null"]})));
    }
}
