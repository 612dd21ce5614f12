//! Invalid grammars and request shapes are refused with errors naming the
//! problem (the server answers them with HTTP 400).

use serde_json::{json, Value};
use tempo9_grammar::{Grammar, GrammarError, SchemaMode};

fn schema_err(schema: Value, mode: SchemaMode) -> String {
    match Grammar::json_schema(&schema, mode) {
        Ok(_) => panic!("schema {schema} accepted"),
        Err(e @ GrammarError::InvalidSchema(_)) => e.to_string(),
        Err(e) => panic!("schema {schema}: wrong error kind {e:?}"),
    }
}

fn assert_names(msg: &str, words: &[&str]) {
    for w in words {
        assert!(msg.contains(w), "error {msg:?} does not mention {w:?}");
    }
}

#[test]
fn invalid_schemas_name_the_problem() {
    let cases: Vec<(Value, Vec<&str>)> = vec![
        (json!({"type": "strin"}), vec!["strin"]),
        (
            json!({"type": "object", "properties": {"n": {"type": "array", "minItems": -1}}}),
            vec!["/properties/n/minItems", "-1"],
        ),
        (json!({"type": "string", "pattern": "[a-"}), vec!["[a-"]),
        (
            json!({"type": "object", "properties": {"x": {"type": "string", "pattern": "(unclosed"}}}),
            vec!["/properties/x", "(unclosed", "regex"],
        ),
        (json!({"$ref": "#/$defs/missing"}), vec!["/$defs/missing"]),
        (
            json!({"type": "object", "required": "name"}),
            vec!["/required", "\"name\""],
        ),
        (
            json!({"type": "integer", "minimum": 5, "maximum": 1}),
            vec!["minimum", "maximum"],
        ),
        (json!("just a string"), vec!["object or a boolean"]),
        (
            json!({"type": "string", "format": "no-such-format"}),
            vec!["no-such-format"],
        ),
        (
            json!({"type": "object", "properties": {"a": {"enum": []}}, "required": ["a"]}),
            vec!["nsatisfiable", "'a'"],
        ),
    ];
    for (schema, words) in cases {
        let msg = schema_err(schema, SchemaMode::Strict);
        eprintln!("{msg}");
        assert!(msg.starts_with("invalid JSON schema: "), "{msg}");
        assert_names(&msg, &words);
    }
}

#[test]
fn lenient_mode_ignores_what_strict_refuses() {
    let schema = json!({"type": "string", "format": "no-such-format"});
    assert!(Grammar::json_schema(&schema, SchemaMode::Lenient).is_ok());
    let msg = schema_err(schema, SchemaMode::Strict);
    assert_names(&msg, &["no-such-format"]);
}

#[test]
fn invalid_regex_and_lark() {
    let e = Grammar::regex("(ab").unwrap_err();
    assert!(matches!(e, GrammarError::InvalidRegex(_)), "{e:?}");
    let e = Grammar::lark("start: undefined_rule").unwrap_err();
    assert!(matches!(e, GrammarError::InvalidLark(_)), "{e:?}");
    assert_names(&e.to_string(), &["undefined_rule"]);
    let e = Grammar::lark("start \"a\"").unwrap_err();
    assert!(matches!(e, GrammarError::InvalidLark(_)), "{e:?}");
}

#[test]
fn openai_response_format() {
    let f = |v: Value| Grammar::from_openai_response_format(&v);
    assert!(f(json!({"type": "text"})).unwrap().is_none());
    assert!(f(json!({"type": "json_object"})).unwrap().is_some());
    let ok = f(json!({"type": "json_schema", "json_schema": {
        "name": "p", "strict": true,
        "schema": {"type": "object", "properties": {"a": {"type": "integer"}},
                   "required": ["a"], "additionalProperties": false}}}));
    assert!(ok.unwrap().is_some());
    let bad: Vec<(Value, Vec<&str>)> = vec![
        (json!({"type": "xml"}), vec!["xml"]),
        (json!({"type": "json_schema"}), vec!["json_schema"]),
        (json!("json"), vec!["response_format", "object"]),
        (
            json!({"type": "json_schema", "json_schema": {"schema": [1]}}),
            vec!["json_schema.schema"],
        ),
        (
            json!({"type": "json_schema", "json_schema": {"strict": "yes", "schema": {}}}),
            vec!["strict"],
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true,
                   "schema": {"type": "object", "properties": {"a": {"type": "numbr"}}}}}),
            vec!["invalid JSON schema", "numbr"],
        ),
    ];
    for (v, words) in bad {
        let msg = f(v.clone())
            .err()
            .unwrap_or_else(|| panic!("{v} accepted"))
            .to_string();
        assert_names(&msg, &words);
    }
}

#[test]
fn ollama_format() {
    let f = |v: Value| Grammar::from_ollama_format(&v);
    assert!(f(Value::Null).unwrap().is_none());
    assert!(f(json!("")).unwrap().is_none());
    assert!(f(json!("json")).unwrap().is_some());
    assert!(
        f(json!({"type": "object", "properties": {"a": {"type": "string"}}}))
            .unwrap()
            .is_some()
    );
    assert_names(&f(json!("yaml")).unwrap_err().to_string(), &["yaml"]);
    assert_names(&f(json!(3)).unwrap_err().to_string(), &["format"]);
    assert_names(
        &f(json!({"type": "objekt"})).unwrap_err().to_string(),
        &["objekt"],
    );
}
