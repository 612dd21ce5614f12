//! Grammar sources: JSON Schema, regex, Lark, and the API request shapes that
//! carry them (OpenAI `response_format`, Ollama `format`).

use llguidance::api::{GrammarInit, ParserLimits, TopLevelGrammar, ValidationResult};
use serde_json::{json, Map, Value};

use crate::bounds::{bound_strings, OutputBounds};
use crate::GrammarError;

/// Separator between JSON array items and object members (no other whitespace is
/// allowed by default: compact JSON, as OpenAI's strict mode).
pub const JSON_ITEM_SEPARATOR: &str = ", ";
/// Separator between an object key and its value.
pub const JSON_KEY_SEPARATOR: &str = ": ";

/// JSON whitespace allowed in tool-call arguments: one space, or a newline and up
/// to 20 indentation characters (bounded, so a model cannot emit whitespace
/// forever). Tool calls keep a flexible layout: with llguidance's compact mode a
/// token spanning two lexemes of an argument object (Qwen's ` {}` after
/// `"arguments": `) is refused.
pub const TOOL_JSON_WHITESPACE: &str = r"(?: |\n[ \t]{0,20})";

/// A grammar to constrain output with, checked but not yet bound to a vocabulary
/// (see [`crate::GrammarCompiler::compile`]).
#[derive(Clone, Debug)]
pub struct Grammar {
    top: TopLevelGrammar,
    kind: GrammarKind,
    bounds: OutputBounds,
}

/// What a [`Grammar`] was built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrammarKind {
    /// A JSON Schema (including "any JSON object").
    JsonSchema,
    /// A regular expression.
    Regex,
    /// A Lark grammar (including tool-call grammars).
    Lark,
}

/// How strictly a JSON Schema is followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemaMode {
    /// Every keyword must be supported; an unsupported keyword or `format` is an
    /// error (OpenAI `strict: true`).
    Strict,
    /// Unsupported keywords and formats are ignored (best effort), `oneOf` is
    /// treated as `anyOf` (OpenAI `strict: false`, Ollama).
    Lenient,
}

impl Grammar {
    /// Output must be a JSON value valid against `schema` (JSON Schema draft
    /// 2020-12, earlier drafts by `$schema`).
    ///
    /// The schema is checked against the JSON Schema meta-schema (so `"type":
    /// "strin"` or `"minItems": -1` are errors naming the place) and then
    /// compiled by llguidance (so unsatisfiable or, in [`SchemaMode::Strict`],
    /// unsupported constructs are errors too). Properties are generated in
    /// schema order. The output is compact JSON ([`JSON_ITEM_SEPARATOR`],
    /// [`JSON_KEY_SEPARATOR`], no other whitespace) unless the schema's top-level
    /// `x-guidance` options say otherwise, and bounded by [`OutputBounds::JSON`]
    /// (digit runs, string lengths) unless its top-level `x-tempo9` says otherwise.
    pub fn json_schema(schema: &Value, mode: SchemaMode) -> Result<Grammar, GrammarError> {
        let mut schema = schema.clone();
        let bounds = OutputBounds::take_from_schema(&mut schema)?;
        check_meta_schema(&schema)?;
        if let Some(max) = bounds.max_string_length {
            bound_strings(&mut schema, max);
        }
        let with_opts = with_guidance_options(&schema, mode, true);
        let top = TopLevelGrammar::from_json_schema(with_opts);
        validate(&top).map_err(GrammarError::InvalidSchema)?;
        Ok(Grammar {
            top,
            kind: GrammarKind::JsonSchema,
            bounds,
        })
    }

    /// Output must be one JSON object (any keys and values): OpenAI
    /// `response_format: {"type": "json_object"}`, Ollama `format: "json"`.
    pub fn json_object() -> Grammar {
        Grammar::json_schema(&json!({"type": "object"}), SchemaMode::Strict)
            .expect("the any-object schema is valid")
    }

    /// Output must match the regular expression `rx` as a whole (Rust `regex`
    /// syntax; no look-around or back-references).
    pub fn regex(rx: &str) -> Result<Grammar, GrammarError> {
        let top = TopLevelGrammar::from_regex(rx);
        validate(&top).map_err(GrammarError::InvalidRegex)?;
        Ok(Grammar {
            top,
            kind: GrammarKind::Regex,
            bounds: OutputBounds::NONE,
        })
    }

    /// Output must match the llguidance Lark grammar `src` (its `start` rule).
    /// Special tokens (`<|im_end|>`) are resolved when the grammar is compiled
    /// for a vocabulary.
    pub fn lark(src: &str) -> Result<Grammar, GrammarError> {
        let top = TopLevelGrammar::from_lark(src.to_string());
        validate(&top).map_err(GrammarError::InvalidLark)?;
        Ok(Grammar {
            top,
            kind: GrammarKind::Lark,
            bounds: OutputBounds::NONE,
        })
    }

    /// The grammar for an OpenAI `response_format` object, or `None` for
    /// `{"type": "text"}`.
    ///
    /// `{"type": "json_object"}` → any JSON object; `{"type": "json_schema",
    /// "json_schema": {"name": .., "schema": {..}, "strict": bool}}` → that
    /// schema, [`SchemaMode::Strict`] when `strict` is true, else lenient.
    pub fn from_openai_response_format(format: &Value) -> Result<Option<Grammar>, GrammarError> {
        let bad = |m: &str| GrammarError::InvalidFormat(format!("response_format: {m}"));
        let obj = format.as_object().ok_or_else(|| bad("must be an object"))?;
        let ty = obj
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("missing string field 'type'"))?;
        match ty {
            "text" => Ok(None),
            "json_object" => Ok(Some(Grammar::json_object())),
            "json_schema" => {
                let js = obj
                    .get("json_schema")
                    .and_then(Value::as_object)
                    .ok_or_else(|| bad("type 'json_schema' needs an object field 'json_schema'"))?;
                let strict = match js.get("strict") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(_) => return Err(bad("json_schema.strict must be a boolean")),
                };
                let schema = match js.get("schema") {
                    // OpenAI treats a missing schema as "any JSON object".
                    None => return Ok(Some(Grammar::json_object())),
                    Some(s @ Value::Object(_)) => s,
                    Some(_) => return Err(bad("json_schema.schema must be an object")),
                };
                let mode = if strict {
                    SchemaMode::Strict
                } else {
                    SchemaMode::Lenient
                };
                Grammar::json_schema(schema, mode).map(Some)
            }
            other => Err(bad(&format!(
                "unknown type '{other}' (expected text, json_object or json_schema)"
            ))),
        }
    }

    /// The grammar for an Ollama `format` field: `"json"` → any JSON object, a
    /// JSON Schema object → that schema (lenient); `null` or `""` → `None`.
    pub fn from_ollama_format(format: &Value) -> Result<Option<Grammar>, GrammarError> {
        match format {
            Value::Null => Ok(None),
            Value::String(s) if s.is_empty() => Ok(None),
            Value::String(s) if s == "json" => Ok(Some(Grammar::json_object())),
            Value::String(s) => Err(GrammarError::InvalidFormat(format!(
                "format: expected \"json\" or a JSON schema object, got \"{s}\""
            ))),
            Value::Object(_) => Grammar::json_schema(format, SchemaMode::Lenient).map(Some),
            _ => Err(GrammarError::InvalidFormat(
                "format: expected \"json\" or a JSON schema object".into(),
            )),
        }
    }

    /// What this grammar was built from.
    pub fn kind(&self) -> GrammarKind {
        self.kind
    }

    /// The llguidance grammar.
    pub fn top_level(&self) -> &TopLevelGrammar {
        &self.top
    }

    /// The bounds its constraint enforces beyond the grammar (see [`OutputBounds`]).
    pub fn bounds(&self) -> OutputBounds {
        self.bounds
    }

    pub(crate) fn from_top(top: TopLevelGrammar, kind: GrammarKind) -> Grammar {
        Grammar {
            top,
            kind,
            bounds: OutputBounds::NONE,
        }
    }
}

/// Tokenizer-independent llguidance check (special-token names are checked at
/// compile time, when the vocabulary is known).
pub(crate) fn validate(top: &TopLevelGrammar) -> Result<(), String> {
    match GrammarInit::Serialized(top.clone()).validate(None, ParserLimits::default()) {
        ValidationResult::Error(e) => Err(e),
        ValidationResult::Valid | ValidationResult::Warnings(_) => Ok(()),
    }
}

/// Checks `schema` against its meta-schema, and that its regex patterns compile
/// and its local `$ref`s resolve.
pub(crate) fn check_meta_schema(schema: &Value) -> Result<(), GrammarError> {
    if !matches!(schema, Value::Object(_) | Value::Bool(_)) {
        return Err(GrammarError::InvalidSchema(
            "a JSON schema must be an object or a boolean".into(),
        ));
    }
    if let Err(e) = jsonschema::meta::validate(schema) {
        let path = e.instance_path.to_string();
        let at = if path.is_empty() { "/".into() } else { path };
        return Err(GrammarError::InvalidSchema(format!("at {at}: {e}")));
    }
    jsonschema::validator_for(schema).map(|_| ()).map_err(|e| {
        let path = e.instance_path.to_string();
        let at = if path.is_empty() { "/".into() } else { path };
        GrammarError::InvalidSchema(format!("at {at}: {e}"))
    })
}

/// Adds Tempo9's defaults to the schema's top-level `x-guidance` options (compact
/// JSON, or [`TOOL_JSON_WHITESPACE`] when not `compact`; leniency by mode) without
/// overriding the caller's.
pub(crate) fn with_guidance_options(schema: &Value, mode: SchemaMode, compact: bool) -> Value {
    let Value::Object(obj) = schema else {
        // `true` / `false`: nowhere to put options; nothing to relax either.
        return schema.clone();
    };
    let mut obj = obj.clone();
    let mut opts = match obj.remove("x-guidance") {
        Some(Value::Object(o)) => o,
        _ => Map::new(),
    };
    if !compact
        && !opts.contains_key("whitespace_pattern")
        && !opts.contains_key("whitespace_flexible")
    {
        opts.insert("whitespace_pattern".into(), TOOL_JSON_WHITESPACE.into());
    }
    if !opts.contains_key("whitespace_pattern") && !opts.contains_key("whitespace_flexible") {
        opts.insert("whitespace_flexible".into(), Value::Bool(false));
        opts.entry("item_separator")
            .or_insert(JSON_ITEM_SEPARATOR.into());
        opts.entry("key_separator")
            .or_insert(JSON_KEY_SEPARATOR.into());
    }
    if mode == SchemaMode::Lenient {
        opts.entry("lenient").or_insert(Value::Bool(true));
    }
    obj.insert("x-guidance".into(), Value::Object(opts));
    Value::Object(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guidance_defaults_never_override_the_caller() {
        let s = json!({"type": "object"});
        let strict = with_guidance_options(&s, SchemaMode::Strict, true);
        assert_eq!(
            strict["x-guidance"],
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
        );
        let lenient = with_guidance_options(&s, SchemaMode::Lenient, true);
        assert_eq!(lenient["x-guidance"]["lenient"], json!(true));
        let own = json!({"type": "object",
                         "x-guidance": {"whitespace_flexible": false, "lenient": false}});
        let kept = with_guidance_options(&own, SchemaMode::Lenient, true);
        assert_eq!(
            kept["x-guidance"],
            json!({"whitespace_flexible": false, "lenient": false})
        );
        assert_eq!(
            with_guidance_options(&json!(true), SchemaMode::Strict, true),
            json!(true)
        );
    }
}
