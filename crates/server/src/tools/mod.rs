//! Tool-call parsing of generated text, one parser per model family.
//!
//! Each parser is fed the text deltas the engine produces and splits them into
//! [`Piece`]s: plain text (safe to stream), reasoning, or complete tool calls.
//! Text that might be the start of tool-call markup is held back until it is
//! known not to be, so partial markup never reaches a client. Markup that does
//! not parse comes back as text, unchanged.
//!
//! A parser asked to [`ToolParser::stream_calls`] may also stream a call while
//! it is written ([`Piece::CallStart`], [`Piece::CallArgs`]); the Hermes JSON
//! form of [`QwenParser`] does (see `stream.rs`), the others keep their calls
//! whole.

mod fit;
mod gemma4;
mod harmony;
mod llama3;
mod mistral;
mod qwen;
mod stream;
pub mod think;

use serde_json::Value;

pub use gemma4::Gemma4Parser;
pub use harmony::HarmonyParser;
pub use llama3::Llama3Parser;
pub use mistral::MistralParser;
pub use qwen::QwenParser;
pub(crate) use stream::close_json;
pub use think::ThinkParser;

/// How a model family writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// Qwen2.5 / Qwen3 (Hermes style): `<tool_call>{"name":…,"arguments":…}</tool_call>`.
    Hermes,
    /// Qwen3-Coder / Qwen3.5: `<tool_call><function=NAME><parameter=P>v</parameter></function></tool_call>`.
    QwenXml,
    /// Llama 3.x: a bare `{"name":…,"parameters":…}` object (optionally after `<|python_tag|>`).
    Llama3,
    /// Mistral: `[TOOL_CALLS][{…}]` or `[TOOL_CALLS]name[ARGS]{…}`.
    Mistral,
    /// GPT-OSS harmony channels: `<|channel|>commentary to=functions.NAME … <|message|>{…}<|call|>`.
    Harmony,
    /// Gemma 4: `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>`.
    Gemma4,
    /// No known tool-call syntax: output is plain text.
    None,
}

impl ToolFormat {
    /// Picks the format from the chat template source (the markup it teaches the
    /// model) and the GGUF architecture name.
    pub fn detect(template: &str, arch: &str) -> ToolFormat {
        if template.contains("<|channel|>") || arch == "gpt-oss" {
            ToolFormat::Harmony
        } else if template.contains(gemma4::OPEN) {
            ToolFormat::Gemma4
        } else if template.contains("<function=") && template.contains("<parameter=") {
            ToolFormat::QwenXml
        } else if template.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if template.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if template.contains("<|start_header_id|>")
            && (template.contains("ipython") || template.contains("parameters"))
        {
            ToolFormat::Llama3
        } else {
            ToolFormat::None
        }
    }

    /// A streaming parser for one response. `tools` are the request's OpenAI-shaped
    /// tool definitions (their schemas type XML parameter values); `parse_calls`
    /// false (no tools, or `tool_choice: none`) passes text through, except for
    /// harmony whose channel markup always needs parsing.
    pub fn parser(self, tools: &[Value], parse_calls: bool) -> Box<dyn ToolParser> {
        match (self, parse_calls) {
            (ToolFormat::Harmony, _) => Box::new(HarmonyParser::new(parse_calls)),
            (ToolFormat::Gemma4, _) => Box::new(Gemma4Parser::new(parse_calls)),
            (_, false) | (ToolFormat::None, _) => Box::new(PlainParser),
            (ToolFormat::Hermes | ToolFormat::QwenXml, true) => Box::new(QwenParser::new(tools)),
            (ToolFormat::Llama3, true) => Box::new(Llama3Parser::new()),
            (ToolFormat::Mistral, true) => Box::new(MistralParser::new()),
        }
    }

    /// Text appended to the prompt (after the generation prompt) that makes the
    /// model start a tool call: for `tool_choice` `required` (`name` None) or a
    /// named function. The parser is fed the same text first so it sees the
    /// whole call. `None` when the format has no such prefix.
    pub fn forced_prefix(self, name: Option<&str>) -> Option<String> {
        let quoted = |n: &str| Value::String(n.to_string()).to_string();
        match (self, name) {
            (ToolFormat::Hermes, None) => Some("<tool_call>\n{\"name\": \"".into()),
            (ToolFormat::Hermes, Some(n)) => Some(format!(
                "<tool_call>\n{{\"name\": {}, \"arguments\": ",
                quoted(n)
            )),
            (ToolFormat::QwenXml, None) => Some("<tool_call>\n<function=".into()),
            (ToolFormat::QwenXml, Some(n)) => Some(format!("<tool_call>\n<function={n}>\n")),
            (ToolFormat::Llama3, None) => Some("{\"name\": \"".into()),
            (ToolFormat::Llama3, Some(n)) => {
                Some(format!("{{\"name\": {}, \"parameters\": ", quoted(n)))
            }
            (ToolFormat::Mistral, None) => Some("[TOOL_CALLS]".into()),
            (ToolFormat::Mistral, Some(n)) => Some(format!(
                "[TOOL_CALLS][{{\"name\": {}, \"arguments\": ",
                quoted(n)
            )),
            (ToolFormat::Harmony, None) => Some("<|channel|>commentary to=functions.".into()),
            (ToolFormat::Harmony, Some(n)) => Some(format!(
                "<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>"
            )),
            (ToolFormat::Gemma4, None) => Some(format!("{}call:", gemma4::OPEN)),
            (ToolFormat::Gemma4, Some(n)) => Some(format!("{}call:{n}{{", gemma4::OPEN)),
            (ToolFormat::None, _) => None,
        }
    }

    /// Special-token texts this format's markup uses: when the engine reports such
    /// a token without text, the caller feeds the token's text to the parser.
    pub fn markup_tokens(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Harmony => &[
                "<|channel|>",
                "<|message|>",
                "<|end|>",
                "<|call|>",
                "<|return|>",
                "<|start|>",
                "<|constrain|>",
            ],
            ToolFormat::Mistral => &["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"],
            ToolFormat::Llama3 => &["<|python_tag|>"],
            ToolFormat::Gemma4 => &[
                gemma4::OPEN,
                gemma4::CLOSE,
                gemma4::QUOTE,
                gemma4::CHANNEL_OPEN,
                gemma4::CHANNEL_CLOSE,
                gemma4::RESPONSE_OPEN,
            ],
            ToolFormat::Hermes | ToolFormat::QwenXml => &["<tool_call>", "</tool_call>"],
            ToolFormat::None => &[],
        }
    }
}

/// One complete tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Function name.
    pub name: String,
    /// Arguments as JSON text (an object).
    pub arguments: String,
}

/// A piece of parsed output, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Answer text.
    Text(String),
    /// Reasoning ("thinking") text.
    Reasoning(String),
    /// A complete tool call. After a [`Piece::CallStart`] it is that call: the
    /// same name, and arguments that begin with the text of every
    /// [`Piece::CallArgs`] since.
    Call(ToolCall),
    /// A tool call began (only from a parser asked to
    /// [`ToolParser::stream_calls`]): its name. Its arguments follow as
    /// [`Piece::CallArgs`], and its [`Piece::Call`] comes before any other piece.
    CallStart(String),
    /// More of the started call's arguments: JSON text that, with what came
    /// before, is the beginning of its final arguments.
    CallArgs(String),
}

/// A streaming tool-call parser.
pub trait ToolParser: Send {
    /// Feeds the next text delta; appends what became final to `out`.
    fn push(&mut self, text: &str, out: &mut Vec<Piece>);
    /// End of output: flushes held text; unfinished markup that still parses
    /// becomes a call, otherwise it comes back as text.
    fn finish(&mut self, out: &mut Vec<Piece>);
    /// Whether the output is inside reasoning now (the next delta's tokens
    /// count as reasoning tokens).
    fn in_reasoning(&self) -> bool {
        false
    }
    /// Asks the parser to stream calls while they are written: from now on
    /// `push` and `finish` may put a [`Piece::CallStart`] and
    /// [`Piece::CallArgs`] before a call's [`Piece::Call`] (see [`Piece`] for
    /// the order). Returns whether this parser streams calls; the default
    /// keeps them whole and returns false.
    fn stream_calls(&mut self) -> bool {
        false
    }
}

/// Passes text through unchanged.
pub struct PlainParser;

impl ToolParser for PlainParser {
    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        push_text(out, text);
    }
    fn finish(&mut self, _out: &mut Vec<Piece>) {}
}

/// Appends text, merging with a preceding text piece; empty text is dropped.
pub(crate) fn push_text(out: &mut Vec<Piece>, text: &str) {
    if text.is_empty() {
        return;
    }
    if let Some(Piece::Text(t)) = out.last_mut() {
        t.push_str(text);
    } else {
        out.push(Piece::Text(text.to_string()));
    }
}

/// Appends reasoning text, merging like [`push_text`].
pub(crate) fn push_reasoning(out: &mut Vec<Piece>, text: &str) {
    if text.is_empty() {
        return;
    }
    if let Some(Piece::Reasoning(t)) = out.last_mut() {
        t.push_str(text);
    } else {
        out.push(Piece::Reasoning(text.to_string()));
    }
}

/// The length of the longest prefix of `buf` that cannot be the beginning of
/// any of `markers` (all ASCII): the rest must be held back.
pub(crate) fn safe_len(buf: &str, markers: &[&str]) -> usize {
    let b = buf.as_bytes();
    for i in 0..b.len() {
        // Markers are ASCII, so a match can only start on an ASCII byte (a char boundary).
        if !b[i].is_ascii() {
            continue;
        }
        let tail = &b[i..];
        if markers
            .iter()
            .any(|m| m.len() > tail.len() && m.as_bytes().starts_with(tail))
        {
            return i;
        }
    }
    b.len()
}

/// Finds the earliest occurrence of any marker: (position, marker index).
pub(crate) fn find_any(buf: &str, markers: &[&str]) -> Option<(usize, usize)> {
    markers
        .iter()
        .enumerate()
        .filter_map(|(k, m)| buf.find(m).map(|p| (p, k)))
        .min()
}

/// If `s` (after leading whitespace) holds a complete JSON object or array,
/// the byte index just past it. Brackets inside strings are ignored; the
/// content is not validated.
pub(crate) fn json_end(s: &str) -> Option<usize> {
    let start = s.len() - s.trim_start().len();
    let mut depth = 0usize;
    let mut strings = JsonStrings::default();
    for (i, c) in s[start..].char_indices() {
        if !strings.structural(c) {
            continue;
        }
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(start + i + 1);
                }
            }
            _ if depth == 0 => return None,
            _ => {}
        }
    }
    None
}

/// Where a scan over JSON text stands with respect to string literals.
#[derive(Default)]
pub(crate) struct JsonStrings {
    /// Inside a string literal.
    pub in_str: bool,
    /// Just after a backslash inside one.
    pub escaped: bool,
}

impl JsonStrings {
    /// Takes the next character; true when it is outside every string literal and
    /// not a quote (a brace or bracket there opens or closes a container).
    pub fn structural(&mut self, c: char) -> bool {
        if self.in_str {
            match (self.escaped, c) {
                (true, _) => self.escaped = false,
                (false, '\\') => self.escaped = true,
                (false, '"') => self.in_str = false,
                _ => {}
            }
            return false;
        }
        self.in_str = c == '"';
        !self.in_str
    }
}

/// A tool call from a JSON object shaped like `{"name", "arguments"|"parameters"}`
/// (or OpenAI's `{"function": {…}}`). String arguments must hold JSON.
pub(crate) fn call_from_json(v: &Value) -> Option<ToolCall> {
    let o = v.as_object()?;
    if let Some(f) = o.get("function").filter(|f| f.is_object()) {
        return call_from_json(f);
    }
    let name = o.get("name")?.as_str()?.trim();
    if name.is_empty() {
        return None;
    }
    let args = o
        .get("arguments")
        .or_else(|| o.get("parameters"))
        .cloned()
        .unwrap_or(Value::Object(Default::default()));
    Some(ToolCall {
        name: name.to_string(),
        arguments: arguments_text(args)?,
    })
}

/// Normalizes arguments to the JSON text of an object; a string must itself
/// hold a JSON object.
pub(crate) fn arguments_text(args: Value) -> Option<String> {
    match args {
        Value::Object(_) => Some(args.to_string()),
        Value::String(s) => match serde_json::from_str::<Value>(&s) {
            Ok(v @ Value::Object(_)) => Some(v.to_string()),
            _ => None,
        },
        Value::Null => Some("{}".into()),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod testutil {
    use super::*;

    /// Merges adjacent text, reasoning and call-argument pieces (streaming splits
    /// them arbitrarily).
    pub fn merged(pieces: Vec<Piece>) -> Vec<Piece> {
        let mut out = Vec::new();
        for p in pieces {
            match p {
                Piece::Text(t) => push_text(&mut out, &t),
                Piece::Reasoning(t) => push_reasoning(&mut out, &t),
                Piece::CallArgs(t) => match out.last_mut() {
                    Some(Piece::CallArgs(a)) => a.push_str(&t),
                    _ => out.push(Piece::CallArgs(t)),
                },
                c => out.push(c),
            }
        }
        out
    }

    /// Runs a parser over `text` fed whole, then split at every char boundary and
    /// one char at a time; all must agree. Returns the merged pieces.
    pub fn parse_all_splits(make: &dyn Fn() -> Box<dyn ToolParser>, text: &str) -> Vec<Piece> {
        let whole = {
            let mut p = make();
            let mut out = Vec::new();
            p.push(text, &mut out);
            p.finish(&mut out);
            merged(out)
        };
        let bounds: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for &i in &bounds {
            let mut p = make();
            let mut out = Vec::new();
            p.push(&text[..i], &mut out);
            p.push(&text[i..], &mut out);
            p.finish(&mut out);
            assert_eq!(merged(out), whole, "split at {i} of {text:?}");
        }
        let mut p = make();
        let mut out = Vec::new();
        for w in bounds.windows(2) {
            p.push(&text[w[0]..w[1]], &mut out);
        }
        p.finish(&mut out);
        assert_eq!(merged(out), whole, "char by char: {text:?}");
        whole
    }

    /// [`parse_all_splits`] with calls streamed ([`ToolParser::stream_calls`]):
    /// every split must give the same merged pieces, and they must keep the
    /// streaming contract: a `CallStart` is followed by its `CallArgs` and then
    /// its `Call`, with the same name and arguments that begin with the streamed
    /// text and are a JSON object.
    pub fn parse_all_splits_streaming(
        make: &dyn Fn() -> Box<dyn ToolParser>,
        text: &str,
    ) -> Vec<Piece> {
        let streaming = || {
            let mut p = make();
            p.stream_calls();
            p
        };
        let out = parse_all_splits(&streaming, text);
        check_stream_contract(&out);
        out
    }

    /// Panics unless `pieces` keep the streaming contract (see
    /// [`parse_all_splits_streaming`]).
    pub fn check_stream_contract(pieces: &[Piece]) {
        let mut open: Option<(String, String)> = None;
        for p in pieces {
            match (p, &mut open) {
                (Piece::CallStart(n), None) => open = Some((n.clone(), String::new())),
                (Piece::CallArgs(a), Some((_, sent))) => sent.push_str(a),
                (Piece::Call(c), Some((name, sent))) => {
                    assert_eq!(&c.name, name, "{pieces:?}");
                    assert!(c.arguments.starts_with(sent.as_str()), "{pieces:?}");
                    let v: Value = serde_json::from_str(&c.arguments).expect("JSON arguments");
                    assert!(v.is_object(), "{pieces:?}");
                    open = None;
                }
                (Piece::Call(_) | Piece::Text(_) | Piece::Reasoning(_), None) => {}
                (p, o) => panic!("{p:?} with {o:?} open in {pieces:?}"),
            }
        }
        assert!(open.is_none(), "unfinished call in {pieces:?}");
    }

    /// The pieces without the streaming ones: what a client gets whole.
    pub fn whole(pieces: &[Piece]) -> Vec<Piece> {
        merged(
            pieces
                .iter()
                .filter(|p| !matches!(p, Piece::CallStart(_) | Piece::CallArgs(_)))
                .cloned()
                .collect(),
        )
    }

    /// The (name, streamed arguments) of each streamed call.
    pub fn streamed(pieces: &[Piece]) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for p in pieces {
            match p {
                Piece::CallStart(n) => out.push((n.clone(), String::new())),
                Piece::CallArgs(a) => {
                    if let Some((_, s)) = out.last_mut() {
                        s.push_str(a);
                    }
                }
                _ => {}
            }
        }
        out
    }

    pub fn call(name: &str, args: &str) -> Piece {
        Piece::Call(ToolCall {
            name: name.into(),
            arguments: args.into(),
        })
    }

    pub fn text(t: &str) -> Piece {
        Piece::Text(t.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_len_holds_marker_prefixes() {
        assert_eq!(safe_len("hello <tool", &["<tool_call>"]), 6);
        assert_eq!(safe_len("hello", &["<tool_call>"]), 5);
        assert_eq!(safe_len("a<", &["<tool_call>", "<function="]), 1);
        assert_eq!(safe_len("é<f", &["<function="]), 2);
        // A whole marker is not a proper prefix: the caller finds it with `find`.
        assert_eq!(safe_len("<tool_call>", &["<tool_call>"]), 11);
    }

    #[test]
    fn json_end_ignores_brackets_in_strings() {
        assert_eq!(json_end(r#" {"a": "}{"} tail"#), Some(12));
        assert_eq!(json_end(r#"{"a": "\"}"#), None);
        assert_eq!(json_end(r#"[{"a":1},{"b":[2]}]x"#), Some(19));
        assert_eq!(json_end("abc"), None);
        assert_eq!(json_end("}"), None);
    }

    #[test]
    fn call_from_json_shapes() {
        let v: Value = serde_json::from_str(r#"{"name":"f","arguments":{"x":1}}"#).unwrap();
        assert_eq!(call_from_json(&v).unwrap().arguments, r#"{"x":1}"#);
        let v: Value = serde_json::from_str(r#"{"name":"f","parameters":"{\"x\": 1}"}"#).unwrap();
        assert_eq!(call_from_json(&v).unwrap().arguments, r#"{"x":1}"#);
        let v: Value = serde_json::from_str(r#"{"name":"f","arguments":"not json"}"#).unwrap();
        assert!(call_from_json(&v).is_none());
        let v: Value = serde_json::from_str(r#"{"name":"","arguments":{}}"#).unwrap();
        assert!(call_from_json(&v).is_none());
        let v: Value = serde_json::from_str(r#"{"name":"f"}"#).unwrap();
        assert_eq!(call_from_json(&v).unwrap().arguments, "{}");
    }

    #[test]
    fn detects_formats_from_templates() {
        assert_eq!(
            ToolFormat::detect("... <tool_call>\n{{ tool_call | tojson }}", "qwen2"),
            ToolFormat::Hermes
        );
        assert_eq!(
            ToolFormat::detect("<tool_call>\n<function={{name}}>\n<parameter=", "qwen3"),
            ToolFormat::QwenXml
        );
        assert_eq!(
            ToolFormat::detect("[AVAILABLE_TOOLS] [TOOL_CALLS]", "llama"),
            ToolFormat::Mistral
        );
        assert_eq!(
            ToolFormat::detect("<|start_header_id|>ipython<|end_header_id|>", "llama"),
            ToolFormat::Llama3
        );
        assert_eq!(
            ToolFormat::detect("<|start|>assistant<|channel|>final", "gpt-oss"),
            ToolFormat::Harmony
        );
        assert_eq!(
            ToolFormat::detect(
                "<|turn>model\n<|tool_call>call:{{ name }}{{ '{' }}<tool_call|>",
                "gemma4"
            ),
            ToolFormat::Gemma4
        );
        assert_eq!(
            ToolFormat::detect("<|im_start|>", "llama"),
            ToolFormat::None
        );
    }
}
