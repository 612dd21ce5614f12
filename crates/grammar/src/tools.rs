//! Tool-call grammars: the model must (or, in auto mode, may) emit calls in its
//! family's format, each naming one of the offered tools with arguments valid
//! against that tool's parameter schema.
//!
//! All family-specific formatting lives in [`ToolCallFormat`]; everything else
//! is shared.

use serde_json::{json, Value};
use tempo9_tokenizer::Tokenizer;

pub use crate::call_syntax::CallSyntax;
use crate::call_syntax::{self, GEMMA4_QUOTE};
use crate::grammar::{check_meta_schema, validate, with_guidance_options};
use crate::{Grammar, GrammarError, GrammarKind, SchemaMode};
use llguidance::api::TopLevelGrammar;

/// How a model family writes tool calls: `begin`, then the calls joined by
/// `separator`, then `end`; each call is `open`, the call in its [`CallSyntax`]
/// (for most families a JSON object `{"<name_key>": "<tool>", "<arguments_key>":
/// <arguments>}`), then `close`.
///
/// Markup is read the way the model writes it: control tokens of the vocabulary
/// inside it (Mistral's `[TOOL_CALLS]`, Llama's `<|python_tag|>`) must be
/// produced as those tokens; the rest is text (Qwen's `<tool_call>` is a
/// user-defined token, i.e. text, so it may be produced as one token or several).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCallFormat {
    /// Text before the first call.
    pub begin: String,
    /// Text after the last call.
    pub end: String,
    /// Text before each call's JSON object.
    pub open: String,
    /// Text after each call's JSON object.
    pub close: String,
    /// Text between consecutive calls.
    pub separator: String,
    /// How the name and arguments of one call are written.
    pub syntax: CallSyntax,
    /// Key of the tool name in the call object.
    pub name_key: String,
    /// Key of the arguments object in the call object.
    pub arguments_key: String,
    /// Reasoning markup the model may write before it answers: with `auto`,
    /// opening markup inside reasoning that is not closed yet is reasoning
    /// text, not a call.
    pub reasoning: Option<ReasoningMarkup>,
}

/// The tags around a model's reasoning (`<think>`, `</think>`); used only
/// when both are text in the vocabulary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReasoningMarkup {
    /// Opens reasoning.
    pub open: String,
    /// Closes it.
    pub close: String,
    /// The prompt already opened it: the output starts as reasoning.
    pub starts_inside: bool,
}

impl ToolCallFormat {
    /// Hermes style, used by Qwen2.5 / Qwen3 and many fine-tunes:
    /// `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>`, one per call,
    /// joined by newlines.
    pub fn hermes() -> ToolCallFormat {
        ToolCallFormat {
            begin: String::new(),
            end: String::new(),
            open: "<tool_call>\n".into(),
            close: "\n</tool_call>".into(),
            separator: "\n".into(),
            syntax: CallSyntax::JsonObject,
            name_key: "name".into(),
            arguments_key: "arguments".into(),
            reasoning: None,
        }
    }

    /// Llama 3.1+ JSON tool calling: a bare `{"name": .., "parameters": {..}}`
    /// object.
    pub fn llama3_json() -> ToolCallFormat {
        ToolCallFormat {
            begin: String::new(),
            end: String::new(),
            open: String::new(),
            close: String::new(),
            separator: "; ".into(),
            syntax: CallSyntax::JsonObject,
            name_key: "name".into(),
            arguments_key: "parameters".into(),
            reasoning: None,
        }
    }

    /// Mistral: `[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]` (one JSON
    /// array after the `[TOOL_CALLS]` control token).
    pub fn mistral() -> ToolCallFormat {
        ToolCallFormat {
            begin: "[TOOL_CALLS][".into(),
            end: "]".into(),
            open: String::new(),
            close: String::new(),
            separator: ", ".into(),
            syntax: CallSyntax::JsonObject,
            name_key: "name".into(),
            arguments_key: "arguments".into(),
            reasoning: None,
        }
    }

    /// GPT-OSS harmony: `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{..}<|call|>`.
    /// One call per message: `<|call|>` ends the turn.
    pub fn harmony() -> ToolCallFormat {
        ToolCallFormat {
            open: "<|channel|>commentary to=functions.".into(),
            close: "<|call|>".into(),
            separator: String::new(),
            syntax: CallSyntax::NameThenJson {
                between: " <|constrain|>json<|message|>".into(),
            },
            ..ToolCallFormat::hermes()
        }
    }

    /// Qwen3-Coder / Qwen3.5: `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>`.
    pub fn qwen_xml() -> ToolCallFormat {
        ToolCallFormat {
            syntax: CallSyntax::QwenXml,
            close: "\n</tool_call>".into(),
            ..ToolCallFormat::hermes()
        }
    }

    /// Gemma 4: `<|tool_call>call:NAME{key:VALUE,..}<tool_call|>`, calls back to back.
    pub fn gemma4() -> ToolCallFormat {
        ToolCallFormat {
            open: "<|tool_call>".into(),
            close: "<tool_call|>".into(),
            separator: String::new(),
            syntax: CallSyntax::Gemma4,
            ..ToolCallFormat::hermes()
        }
    }
}

/// One callable tool.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    /// Function name.
    pub name: String,
    /// JSON Schema of the arguments object; `None` = no parameters (`{}`).
    pub parameters: Option<Value>,
    /// Follow the schema strictly (OpenAI `function.strict`); otherwise
    /// unsupported keywords are ignored, and a schema that cannot be enforced at
    /// all (one no value satisfies, such as an integer whose `enum` lists strings)
    /// holds the arguments to its property names and required list only.
    pub strict: bool,
}

/// Which calls the grammar demands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// Free text, or text followed by tool calls: the grammar engages once the
    /// model writes the opening markup (`tool_choice: "auto"`). Needs non-empty
    /// opening markup.
    Auto,
    /// At least one call, to any of the tools, and nothing else
    /// (`tool_choice: "required"`).
    Required,
    /// Calls to this tool only, and nothing else (`tool_choice: {"type":
    /// "function", "function": {"name": ..}}`).
    Named(String),
}

/// A tool-call grammar request.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCallGrammar {
    /// The model family's call format.
    pub format: ToolCallFormat,
    /// The offered tools.
    pub tools: Vec<ToolSpec>,
    /// What must be called.
    pub choice: ToolChoice,
    /// Allow more than one call (`parallel_tool_calls`, default true in OpenAI).
    pub parallel: bool,
}

impl ToolCallGrammar {
    /// Builds the Lark grammar for `tok`'s vocabulary (which markup is a control
    /// token depends on it). Errors name the offending tool or schema.
    pub fn build(&self, tok: &Tokenizer) -> Result<Grammar, GrammarError> {
        let bad = |m: String| GrammarError::InvalidTools(m);
        if self.tools.is_empty() {
            return Err(bad("no tools given".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for t in &self.tools {
            if t.name.is_empty() {
                return Err(bad("a tool has an empty name".into()));
            }
            if !seen.insert(t.name.as_str()) {
                return Err(bad(format!("tool '{}' is listed twice", t.name)));
            }
        }
        let selected: Vec<&ToolSpec> = match &self.choice {
            ToolChoice::Named(n) => {
                let t = self
                    .tools
                    .iter()
                    .find(|t| &t.name == n)
                    .ok_or_else(|| bad(format!("tool_choice names unknown tool '{n}'")))?;
                vec![t]
            }
            _ => self.tools.iter().collect(),
        };
        let mut schemas = Vec::new();
        for t in &selected {
            let schema = match &t.parameters {
                None | Some(Value::Null) => {
                    json!({"type": "object", "properties": {}, "additionalProperties": false})
                }
                Some(s) => s.clone(),
            };
            check_meta_schema(&schema)
                .map_err(|e| bad(format!("tool '{}': parameters: {e}", t.name)))?;
            let mode = if t.strict {
                SchemaMode::Strict
            } else {
                SchemaMode::Lenient
            };
            schemas.push(with_guidance_options(&schema, mode, false));
        }
        let top = self.lark(tok, &selected, &schemas)?;
        let Err(e) = validate(&top) else {
            return Ok(Grammar::from_top(top, GrammarKind::Lark));
        };
        // Clients pass tools on from elsewhere (MCP servers, old function specs): a
        // non-strict tool whose schema cannot be enforced does not fail the request.
        let mut relaxed = false;
        for (t, schema) in selected.iter().zip(schemas.iter_mut()) {
            match schema_error(schema) {
                None => {}
                Some(e) if t.strict => {
                    return Err(bad(format!("tool '{}': parameters: {e}", t.name)));
                }
                Some(_) => {
                    *schema = relax(schema);
                    relaxed = true;
                }
            }
        }
        if !relaxed {
            return Err(bad(format!("tool-call grammar: {e}")));
        }
        let top = self.lark(tok, &selected, &schemas)?;
        validate(&top).map_err(|e| bad(format!("tool-call grammar: {e}")))?;
        Ok(Grammar::from_top(top, GrammarKind::Lark))
    }

    /// The Lark grammar of the calls to `selected`, with these argument schemas.
    fn lark(
        &self,
        tok: &Tokenizer,
        selected: &[&ToolSpec],
        schemas: &[Value],
    ) -> Result<TopLevelGrammar, GrammarError> {
        let bad = |m: String| GrammarError::InvalidTools(m);
        let f = &self.format;
        let mut lark = String::from("%llguidance {}\n");
        let mode = |t: &ToolSpec| match t.strict {
            true => SchemaMode::Strict,
            false => SchemaMode::Lenient,
        };
        let quote = markup(tok, GEMMA4_QUOTE);
        if f.syntax == CallSyntax::Gemma4 {
            let is_token = matches!(pieces(tok, GEMMA4_QUOTE).as_slice(), [Piece::Control(_)]);
            lark.push_str(&call_syntax::gemma4_common(&quote, is_token));
        }
        // One alternative per tool: name fixed as literal text, arguments by schema.
        let mut alts = Vec::new();
        for (i, (t, schema)) in selected.iter().zip(schemas).enumerate() {
            let json = format!(
                "%json {}",
                serde_json::to_string(schema).expect("a JSON value serializes")
            );
            lark.push_str(&match &f.syntax {
                CallSyntax::JsonObject => {
                    let head = format!(
                        "{{{}: {}, {}: ",
                        json_str(&f.name_key),
                        json_str(&t.name),
                        json_str(&f.arguments_key)
                    );
                    format!(
                        "body_{i}: {} args_{i} \"}}\"\nargs_{i}: {json}\n",
                        json_str(&head)
                    )
                }
                CallSyntax::NameThenJson { between } => {
                    call_syntax::name_then_json(i, &t.name, &markup(tok, between), &json)
                }
                CallSyntax::QwenXml => call_syntax::qwen_xml(i, &t.name, schema, mode(t)),
                CallSyntax::Gemma4 => call_syntax::gemma4(i, &t.name, schema, &quote),
            });
            alts.push(format!("body_{i}"));
        }
        lark.push_str(&format!("body: {}\n", alts.join(" | ")));
        let open = markup(tok, &f.open);
        let close = markup(tok, &f.close);
        let sep = markup(tok, &f.separator);
        let end = markup(tok, &f.end);
        lark.push_str(&format!("call: {open} body {close}\n"));
        let more = if self.parallel {
            format!(" ({sep} call)*")
        } else {
            String::new()
        };
        match self.choice {
            ToolChoice::Required | ToolChoice::Named(_) => {
                let begin = markup(tok, &f.begin);
                lark.push_str(&format!("start: {begin} call{more} {end}\n"));
                if matches!(f.syntax, CallSyntax::QwenXml | CallSyntax::Gemma4) {
                    lark.push_str("TEXT: /(.|\\n)*/\n");
                }
            }
            ToolChoice::Auto => {
                // Free text until the model writes the trigger (the first piece of
                // the markup before the first call); from there on the calls must
                // be well-formed.
                let lead = format!("{}{}", f.begin, f.open);
                let pieces = pieces(tok, &lead);
                let head = match pieces.first() {
                    None => {
                        return Err(bad(
                            "auto tool choice needs a tool-call format with opening markup".into(),
                        ))
                    }
                    // A control token cannot occur inside text: no lazy matching needed.
                    Some(Piece::Control(id)) => format!("TEXT <[{id}]>"),
                    Some(Piece::Text(t)) => {
                        let trigger = t.trim_end();
                        if trigger.is_empty() {
                            return Err(bad(
                                "auto tool choice needs opening markup that is not whitespace"
                                    .into(),
                            ));
                        }
                        // With reasoning markup, the text before the trigger may
                        // not end inside an open reasoning block: a trigger
                        // written while thinking is reasoning text.
                        let before = match reasoning_text(tok, &f.reasoning) {
                            Some((open, close, inside)) => {
                                let (open, close) = (json_str(&open), json_str(&close));
                                let outside = format!("~(TEXT {open} ~(TEXT {close} TEXT))");
                                if inside {
                                    format!("TEXT {close} {outside}")
                                } else {
                                    outside
                                }
                            }
                            None => "TEXT".to_string(),
                        };
                        lark.push_str(&format!("head[lazy]: {before} {}\n", json_str(trigger)));
                        let ws = &t[trigger.len()..];
                        if ws.is_empty() {
                            "head".to_string()
                        } else {
                            format!("head {}", json_str(ws))
                        }
                    }
                };
                let rest: Vec<String> = pieces[1..].iter().map(Piece::lark).collect();
                lark.push_str(&format!(
                    "first_call: {head} {} body {close}\nstart: TEXT | first_call{more} {end}\nTEXT: /(.|\\n)*/\n",
                    rest.join(" ")
                ));
            }
        }
        Ok(TopLevelGrammar::from_lark(lark))
    }
}

/// Why llguidance cannot enforce the (argument) schema on its own, if it cannot.
fn schema_error(schema: &Value) -> Option<String> {
    let json = serde_json::to_string(schema).expect("a JSON value serializes");
    validate(&TopLevelGrammar::from_lark(format!(
        "%llguidance {{}}\nstart: %json {json}\n"
    )))
    .err()
}

/// A schema that cannot be enforced, relaxed to an object with its property names
/// and required list (any values), or to any object.
fn relax(schema: &Value) -> Value {
    let options = schema.get("x-guidance").cloned().unwrap_or(json!({}));
    if let Some(Value::Object(props)) = schema.get("properties") {
        let any: serde_json::Map<String, Value> =
            props.keys().map(|k| (k.clone(), json!({}))).collect();
        let mut names = json!({"type": "object", "properties": any, "x-guidance": options});
        if let Some(required) = schema.get("required") {
            names["required"] = required.clone();
        }
        if schema_error(&names).is_none() {
            return names;
        }
    }
    json!({"type": "object", "x-guidance": options})
}

/// `s` as a JSON (and Lark) string literal.
fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// A run of markup as the model writes it.
enum Piece {
    Text(String),
    Control(u32),
}

impl Piece {
    fn lark(&self) -> String {
        match self {
            Piece::Text(t) => json_str(t),
            Piece::Control(id) => format!("<[{id}]>"),
        }
    }
}

/// Splits markup into text runs and the control tokens the tokenizer finds in it.
fn pieces(tok: &Tokenizer, s: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    // Bytes, not per-token strings: a character may span tokens.
    let mut text: Vec<u8> = Vec::new();
    let flush = |text: &mut Vec<u8>, out: &mut Vec<Piece>| {
        if !text.is_empty() {
            out.push(Piece::Text(String::from_utf8_lossy(text).into_owned()));
            text.clear();
        }
    };
    for id in tok.encode(s, false, true) {
        if tok.is_control(id) {
            flush(&mut text, &mut out);
            out.push(Piece::Control(id));
        } else {
            text.extend_from_slice(tok.token_bytes(id));
        }
    }
    flush(&mut text, &mut out);
    out
}

/// The reasoning markup, when both tags are plain text in `tok`'s vocabulary
/// (a control token cannot occur inside the free text anyway).
fn reasoning_text(tok: &Tokenizer, r: &Option<ReasoningMarkup>) -> Option<(String, String, bool)> {
    let r = r.as_ref()?;
    let text = |s: &str| match pieces(tok, s).as_slice() {
        [Piece::Text(t)] => Some(t.clone()),
        _ => None,
    };
    Some((text(&r.open)?, text(&r.close)?, r.starts_inside))
}

/// Lark for a piece of markup (nothing for empty markup).
fn markup(tok: &Tokenizer, s: &str) -> String {
    pieces(tok, s)
        .iter()
        .map(Piece::lark)
        .collect::<Vec<_>>()
        .join(" ")
}
