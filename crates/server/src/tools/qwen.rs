//! Qwen tool calls: Hermes-style JSON (`<tool_call>{json}</tool_call>`, Qwen2.5 and
//! Qwen3) and the XML form of Qwen3-Coder / Qwen3.5
//! (`<tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>`).
//! One parser handles both bodies, since fine-tunes mix them. Small models also
//! answer with a bare `{"name":…,"arguments":…}` object and no tags, or with
//! that object in a Markdown code block (`` ```json ``); at the start of the
//! output (or right after another call) that is taken as a call too when it
//! names one of the offered tools and its arguments fit that tool's parameters
//! (see [`super::fit`]).
//!
//! Asked to stream calls, it streams a Hermes JSON call inside `<tool_call>`
//! while it is written ([`JsonCallStream`]); XML calls, bare and fenced JSON
//! calls stay whole.

use serde_json::{Map, Value};

use super::fit::call_fits;
use super::stream::JsonCallStream;
use super::{call_from_json, json_end, push_text, safe_len, Piece, ToolCall, ToolParser};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const FUNC_OPEN: &str = "<function=";
const FUNC_CLOSE: &str = "</function>";

enum State {
    /// Nothing but whitespace seen yet (a bare JSON call may follow).
    Start,
    /// Plain text.
    Text,
    /// Inside `<tool_call>` (or a bare `<function=`): the body so far.
    Call,
    /// A bare JSON object at the start of the output.
    BareJson,
    /// A Markdown code block at the start of the output that may hold a call.
    Fenced,
    /// Just after a call: a stray `</tool_call>` (after a bare `<function=`) is dropped.
    AfterCall,
}

/// Streaming parser for Qwen's tool-call markup.
pub struct QwenParser {
    state: State,
    buf: String,
    /// Whitespace held back after text: dropped if a call follows.
    pending_ws: String,
    /// The call began with `<function=` (no `<tool_call>` wrapper).
    bare_function: bool,
    /// Calls emitted so far.
    calls: usize,
    /// Each offered tool's `parameters` schema, by function name.
    schemas: Vec<(String, Value)>,
    /// Calls are streamed while written ([`ToolParser::stream_calls`]).
    streaming: bool,
    /// The current `<tool_call>` body as streamed so far.
    call_stream: JsonCallStream,
    /// How much of `buf` (the body, in [`State::Call`]) `call_stream` has seen.
    scanned: usize,
}

impl QwenParser {
    /// A parser for one response; `tools` are the request's OpenAI-shaped tools.
    pub fn new(tools: &[Value]) -> Self {
        let schemas = tools
            .iter()
            .filter_map(|t| {
                let f = t.get("function").unwrap_or(t);
                let name = f.get("name")?.as_str()?.to_string();
                let params = f.get("parameters").cloned().unwrap_or(Value::Null);
                Some((name, params))
            })
            .collect();
        QwenParser {
            state: State::Start,
            buf: String::new(),
            pending_ws: String::new(),
            bare_function: false,
            calls: 0,
            schemas,
            streaming: false,
            call_stream: JsonCallStream::default(),
            scanned: 0,
        }
    }

    fn emit_text(&mut self, text: &str, out: &mut Vec<Piece>) {
        if text.is_empty() {
            return;
        }
        let trimmed = text.trim_end();
        if trimmed.is_empty() {
            self.pending_ws.push_str(text);
            return;
        }
        push_text(out, &std::mem::take(&mut self.pending_ws));
        push_text(out, trimmed);
        self.pending_ws.push_str(&text[trimmed.len()..]);
    }

    /// Whether an untagged call names one of the offered tools and its arguments
    /// fit that tool's parameters (any call when the request offered no tools).
    fn fits_a_tool(&self, call: &ToolCall) -> bool {
        if self.schemas.is_empty() {
            return true;
        }
        let Some((_, params)) = self.schemas.iter().find(|(n, _)| *n == call.name) else {
            return false;
        };
        serde_json::from_str::<Value>(&call.arguments).is_ok_and(|a| call_fits(&a, params))
    }

    /// A bare JSON call (untagged): it must fit an offered tool.
    fn bare_call(&self, json: &str) -> Option<ToolCall> {
        serde_json::from_str::<Value>(json)
            .ok()
            .and_then(|v| call_from_json(&v))
            .filter(|c| self.fits_a_tool(c))
    }

    fn emit_call(&mut self, call: ToolCall, out: &mut Vec<Piece>) {
        self.pending_ws.clear();
        self.calls += 1;
        out.push(Piece::Call(call));
    }

    /// Parses a call body (between the tags): JSON or XML functions.
    fn parse_body(&self, body: &str) -> Option<Vec<ToolCall>> {
        let b = body.trim();
        if b.starts_with('{') {
            let v: Value = serde_json::from_str(b).ok()?;
            return call_from_json(&v).map(|c| vec![c]);
        }
        if b.starts_with(FUNC_OPEN) {
            return self.parse_xml(b);
        }
        None
    }

    /// `<function=NAME>(<parameter=P>value</parameter>)*</function>`, repeated.
    fn parse_xml(&self, mut s: &str) -> Option<Vec<ToolCall>> {
        let mut calls = Vec::new();
        loop {
            s = s.trim_start();
            if s.is_empty() {
                break;
            }
            let rest = s.strip_prefix(FUNC_OPEN)?;
            let gt = rest.find('>')?;
            let name = rest[..gt].trim();
            if name.is_empty() || name.contains(['<', '\n']) {
                return None;
            }
            let mut body = &rest[gt + 1..];
            // A missing `</function>` is tolerated at the end of the output.
            let end = body.find(FUNC_CLOSE).unwrap_or(body.len());
            let after = body[end..].strip_prefix(FUNC_CLOSE).unwrap_or("");
            body = &body[..end];
            let props = self
                .schemas
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, p)| p.get("properties"))
                .and_then(Value::as_object);
            let mut args = Map::new();
            loop {
                body = body.trim_start();
                if body.is_empty() {
                    break;
                }
                let r = body.strip_prefix("<parameter=")?;
                let gt = r.find('>')?;
                let pname = r[..gt].trim().to_string();
                let r = &r[gt + 1..];
                let (raw, next) = match r.find("</parameter>") {
                    Some(e) => (&r[..e], &r[e + "</parameter>".len()..]),
                    // Tolerate a missing close before the next parameter or the end.
                    None => match r.find("<parameter=") {
                        Some(e) => (&r[..e], &r[e..]),
                        None => (r, ""),
                    },
                };
                let raw = raw.strip_prefix('\n').unwrap_or(raw);
                let raw = raw.strip_suffix('\n').unwrap_or(raw);
                let ty = props
                    .and_then(|p| p.get(&pname))
                    .and_then(|p| p.get("type"))
                    .and_then(Value::as_str);
                args.insert(pname, xml_value(raw, ty));
                body = next;
            }
            calls.push(ToolCall {
                name: name.to_string(),
                arguments: Value::Object(args).to_string(),
            });
            s = after;
        }
        (!calls.is_empty()).then_some(calls)
    }

    /// Ends the current call with `body`; malformed markup becomes text, unless
    /// the call was started while streaming: it then ends as
    /// [`JsonCallStream::end`] says.
    fn close_call(&mut self, body: &str, closed: bool, out: &mut Vec<Piece>) {
        let parsed = self.parse_body(body);
        let mut stream = std::mem::take(&mut self.call_stream);
        self.scanned = 0;
        if stream.started() {
            let one = parsed.and_then(|mut calls| match calls.len() {
                1 => calls.pop(),
                _ => None,
            });
            if let Some(c) = stream.end(one) {
                self.emit_call(c, out);
            }
            return;
        }
        match parsed {
            Some(calls) => calls.into_iter().for_each(|c| self.emit_call(c, out)),
            None => {
                let open = if self.bare_function { "" } else { OPEN };
                let close = match (closed, self.bare_function) {
                    (false, _) => "",
                    (true, false) => CLOSE,
                    (true, true) => FUNC_CLOSE,
                };
                let t = format!("{open}{body}{close}");
                push_text(out, &std::mem::take(&mut self.pending_ws));
                push_text(out, &t);
            }
        }
    }
}

const FENCE: &str = "```";

/// The length of the longest end of `buf` that is a proper beginning of
/// `marker` (ASCII).
fn partial_tail(buf: &str, marker: &str) -> usize {
    (1..marker.len().min(buf.len() + 1))
        .rev()
        .find(|&k| buf.as_bytes().ends_with(&marker.as_bytes()[..k]))
        .unwrap_or(0)
}

/// Where the JSON object inside a Markdown code block starting `s` begins:
/// `` ```json\n{ `` or `` ```\n{ `` → `Some(Some(offset of '{'))`; not such a
/// block → `Some(None)`; too short to tell → `None`.
fn fence_body(s: &str) -> Option<Option<usize>> {
    if !s.starts_with(FENCE) {
        return if FENCE.starts_with(s) {
            None
        } else {
            Some(None)
        };
    }
    let rest = &s[FENCE.len()..];
    let lang_len = rest
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(rest.len());
    let lang = &rest[..lang_len];
    if lang_len == rest.len() {
        // Still inside the language tag.
        return if "json".starts_with(&lang.to_ascii_lowercase()) {
            None
        } else {
            Some(None)
        };
    }
    if !(lang.is_empty() || lang.eq_ignore_ascii_case("json")) {
        return Some(None);
    }
    let after = &rest[lang_len..];
    let body = after.trim_start();
    if body.is_empty() {
        return None;
    }
    if !body.starts_with('{') {
        return Some(None);
    }
    Some(Some(FENCE.len() + lang_len + (after.len() - body.len())))
}

/// A parameter value: strings stay raw; other schema types (or no schema) are
/// parsed as JSON when they can be.
fn xml_value(raw: &str, ty: Option<&str>) -> Value {
    if ty == Some("string") {
        return Value::String(raw.to_string());
    }
    match serde_json::from_str::<Value>(raw.trim()) {
        Ok(v) if ty.is_some() || !v.is_string() => v,
        _ => Value::String(raw.to_string()),
    }
}

impl ToolParser for QwenParser {
    fn stream_calls(&mut self) -> bool {
        self.streaming = true;
        true
    }

    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.buf.push_str(text);
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if t.is_empty() {
                        return;
                    }
                    self.state = if t.starts_with('{') {
                        State::BareJson
                    } else if t.starts_with(FENCE) || FENCE.starts_with(t) {
                        match fence_body(t) {
                            None => return,
                            Some(Some(_)) => State::Fenced,
                            Some(None) => State::Text,
                        }
                    } else {
                        State::Text
                    };
                    if self.calls > 0 {
                        // Whitespace between calls and after the last one is layout.
                        self.buf = self.buf.trim_start().to_string();
                    }
                }
                State::Fenced => {
                    let lead = self.buf.len() - self.buf.trim_start().len();
                    let Some(Some(body)) = fence_body(&self.buf[lead..]) else {
                        self.state = State::Text;
                        continue;
                    };
                    let start = lead + body;
                    let Some(end) = json_end(&self.buf[start..]) else {
                        return;
                    };
                    let end = start + end;
                    // The closing fence (tolerated when missing at the end).
                    let rest = self.buf[end..].trim_start();
                    if rest.len() < FENCE.len() && FENCE.starts_with(rest) {
                        return;
                    }
                    match self.bare_call(&self.buf[start..end]) {
                        Some(c) => {
                            let rest = rest.strip_prefix(FENCE).unwrap_or(rest).to_string();
                            self.buf = rest;
                            self.emit_call(c, out);
                            self.state = State::Start;
                        }
                        None => self.state = State::Text,
                    }
                }
                State::BareJson => {
                    let Some(end) = json_end(&self.buf) else {
                        return;
                    };
                    let obj = self.buf[..end].to_string();
                    let call = self.bare_call(&obj);
                    match call {
                        Some(c) => {
                            self.buf.drain(..end);
                            self.emit_call(c, out);
                            // More calls may follow, bare or tagged.
                            self.state = State::Start;
                        }
                        None => self.state = State::Text,
                    }
                }
                State::Text => {
                    let markers = [OPEN, FUNC_OPEN];
                    match super::find_any(&self.buf, &markers) {
                        Some((pos, k)) => {
                            let before = self.buf[..pos].to_string();
                            self.emit_text(&before, out);
                            self.bare_function = k == 1;
                            let skip = if self.bare_function { 0 } else { OPEN.len() };
                            self.buf.drain(..pos + skip);
                            self.state = State::Call;
                            self.call_stream = JsonCallStream::default();
                            self.scanned = 0;
                        }
                        None => {
                            let n = safe_len(&self.buf, &markers);
                            let t: String = self.buf.drain(..n).collect();
                            self.emit_text(&t, out);
                            return;
                        }
                    }
                }
                State::AfterCall => {
                    let t = self.buf.trim_start();
                    if t.len() < CLOSE.len() && CLOSE.starts_with(t) {
                        return;
                    }
                    if let Some(r) = t.strip_prefix(CLOSE) {
                        self.buf = r.to_string();
                    }
                    self.state = State::Start;
                }
                State::Call => {
                    let close = if self.bare_function {
                        FUNC_CLOSE
                    } else {
                        CLOSE
                    };
                    let found = self.buf.find(close);
                    if self.streaming && !self.bare_function {
                        // Up to the closing tag, or to what may begin it.
                        let end = found.unwrap_or(self.buf.len() - partial_tail(&self.buf, close));
                        if let Some(t) = self.buf.get(self.scanned..end) {
                            self.call_stream.feed(t, out);
                            self.scanned = end;
                        }
                        if self.call_stream.started() {
                            // As `emit_call` does: whitespace before a call is layout.
                            self.pending_ws.clear();
                        }
                    }
                    let Some(pos) = found else {
                        return;
                    };
                    let mut body = self.buf[..pos].to_string();
                    if self.bare_function {
                        body.push_str(FUNC_CLOSE);
                    }
                    self.buf.drain(..pos + close.len());
                    let closed = !self.bare_function;
                    self.close_call(&body, closed, out);
                    self.state = State::AfterCall;
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        let buf = std::mem::take(&mut self.buf);
        match self.state {
            State::AfterCall => {}
            // Whitespace after the last call is layout, not an answer.
            State::Start if self.calls > 0 && buf.trim().is_empty() => {}
            State::Start | State::Text => {
                push_text(out, &std::mem::take(&mut self.pending_ws));
                push_text(out, &buf);
            }
            State::Fenced => {
                let lead = buf.len() - buf.trim_start().len();
                let call = match fence_body(&buf[lead..]) {
                    Some(Some(b)) => {
                        let body = buf[lead + b..].trim_end();
                        let body = body.strip_suffix(FENCE).unwrap_or(body);
                        self.bare_call(body)
                    }
                    _ => None,
                };
                match call {
                    Some(c) => self.emit_call(c, out),
                    None => {
                        push_text(out, &std::mem::take(&mut self.pending_ws));
                        push_text(out, &buf);
                    }
                }
            }
            State::BareJson => {
                let call = self.bare_call(&buf);
                match call {
                    Some(c) => self.emit_call(c, out),
                    None => {
                        push_text(out, &std::mem::take(&mut self.pending_ws));
                        push_text(out, &buf);
                    }
                }
            }
            State::Call => self.close_call(&buf, false, out),
        }
        self.state = State::Start;
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{
        call, check_stream_contract, parse_all_splits, parse_all_splits_streaming, streamed, text,
        whole,
    };
    use super::super::ToolFormat;
    use super::*;
    use serde_json::json;

    fn tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"]}}}),
        ]
    }

    fn run(t: &str) -> Vec<Piece> {
        let tools = tools();
        parse_all_splits(&|| Box::new(QwenParser::new(&tools)), t)
    }

    /// `t` parsed with calls streamed, at every split.
    fn run_streaming(t: &str) -> Vec<Piece> {
        let tools = tools();
        parse_all_splits_streaming(&|| Box::new(QwenParser::new(&tools)), t)
    }

    fn calls(pieces: &[Piece]) -> Vec<ToolCall> {
        pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Call(c) => Some(c.clone()),
                _ => None,
            })
            .collect()
    }

    /// Streams `t` one char at a time and returns, after each push, how much
    /// of the first call's arguments had gone out (None before its start).
    fn progress(t: &str) -> Vec<Option<String>> {
        let mut p = QwenParser::new(&tools());
        assert!(p.stream_calls());
        let mut out = Vec::new();
        let mut seen = Vec::new();
        let mut b = [0u8; 4];
        for c in t.chars() {
            p.push(c.encode_utf8(&mut b), &mut out);
            seen.push(streamed(&out).first().map(|(_, a)| a.clone()));
        }
        p.finish(&mut out);
        check_stream_contract(&out);
        seen
    }

    #[test]
    fn hermes_single_call() {
        let out = run(
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        );
        assert_eq!(out, vec![call("get_weather", r#"{"city":"Paris"}"#)]);
    }

    #[test]
    fn hermes_text_then_parallel_calls() {
        let out = run("Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, \"}\"]}}\n</tool_call>");
        assert_eq!(
            out,
            vec![
                text("Let me check."),
                call("a", "{}"),
                call("b", r#"{"x":[1,"}"]}"#)
            ]
        );
    }

    #[test]
    fn plain_text_with_angle_brackets_passes() {
        let t = "if a < b and <tool is a word> then x<y\n";
        assert_eq!(run(t), vec![text(t)]);
    }

    #[test]
    fn malformed_call_comes_back_as_text() {
        let t = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {oops}\n</tool_call>";
        assert_eq!(run(t), vec![text(t)]);
        // Unterminated and unparsable.
        let t = "ok <tool_call>\n{\"name\": \"get_w";
        assert_eq!(run(t), vec![text(t)]);
    }

    #[test]
    fn unterminated_but_complete_json_is_a_call() {
        let out =
            run("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}");
        assert_eq!(out, vec![call("get_weather", r#"{"city":"Oslo"}"#)]);
    }

    #[test]
    fn bare_json_at_start_is_a_call() {
        let out = run("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}");
        assert_eq!(out, vec![call("get_weather", r#"{"city":"Rome"}"#)]);
        // JSON that is not a call stays text.
        let t = "{\"answer\": 42} is the result";
        assert_eq!(run(t), vec![text(t)]);
    }

    #[test]
    fn untagged_calls_must_name_an_offered_tool() {
        let t = "{\"name\": \"Joke about Rome\", \"arguments\": {\"message\": \"hi\"}}";
        assert_eq!(run(t), vec![text(t)]);
        let t = "```json\n{\"name\": \"tell_joke\", \"arguments\": {}}\n```";
        assert_eq!(run(t), vec![text(t)]);
    }

    #[test]
    fn untagged_calls_must_fit_the_parameters() {
        // A missing required parameter, a wrong type, an undeclared parameter.
        for t in [
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 2}}\n```",
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"days\": \"two\"}}",
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"hotel\": \"Ritz\"}}",
        ] {
            assert_eq!(run(t), vec![text(t)], "{t:?}");
        }
        // The template's own markup is a call whatever its arguments.
        let out = run(
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"hotel\": 1}}\n</tool_call>",
        );
        assert_eq!(out, vec![call("get_weather", r#"{"hotel":1}"#)]);
    }

    #[test]
    fn fenced_json_calls() {
        let out = run("```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\"city\": \"Paris\"}\n}\n```");
        assert_eq!(out, vec![call("get_weather", r#"{"city":"Paris"}"#)]);
        let out = run("```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}\n```\n\n```\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"B\"}}\n```\n");
        assert_eq!(
            out,
            vec![
                call("get_weather", r#"{"city":"A"}"#),
                call("get_weather", r#"{"city":"B"}"#)
            ]
        );
        // Unterminated block: still a call.
        let out = run("```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"C\"}}");
        assert_eq!(out, vec![call("get_weather", r#"{"city":"C"}"#)]);
        // Code blocks that are not calls stay text.
        for t in [
            "```python\nprint(1)\n```",
            "```json\n[1, 2]\n```",
            "```json\n{\"a\": 1}\n``` done",
            "``not a fence",
        ] {
            assert_eq!(run(t), vec![text(t)], "{t:?}");
        }
    }

    #[test]
    fn xml_calls_typed_by_schema() {
        let out = run("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>");
        assert_eq!(
            out,
            vec![call("get_weather", r#"{"city":"New York","days":3}"#)]
        );
        // Without the `<tool_call>` wrapper, and a string that looks like a number.
        let out =
            run("Sure.\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n</function>");
        assert_eq!(
            out,
            vec![text("Sure."), call("get_weather", r#"{"city":"42"}"#)]
        );
    }

    #[test]
    fn xml_unknown_function_parses_json_values() {
        let out = run("<tool_call>\n<function=other>\n<parameter=obj>\n{\"a\": 1}\n</parameter>\n<parameter=s>\nhi\n</parameter>\n</function>\n</tool_call>");
        assert_eq!(out, vec![call("other", r#"{"obj":{"a":1},"s":"hi"}"#)]);
    }

    #[test]
    fn trailing_text_after_call_is_kept() {
        let out = run("<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\nDone.");
        assert_eq!(out, vec![call("a", "{}"), text("Done.")]);
    }

    #[test]
    fn streamed_calls_are_the_whole_calls() {
        let file = "fn main() {\n    let s = \"a \\\\ b\";\n\tprintln!(\"{s} é 😀\");\n}\n";
        let file_json = serde_json::to_string(file).unwrap();
        for t in [
            // One call, as Qwen2.5 writes it.
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>".to_string(),
            // A long string argument with escapes (a whole file).
            format!("<tool_call>\n{{\"name\": \"write_file\", \"arguments\": {{\"path\": \"src/main.rs\", \"content\": {file_json}}}}}\n</tool_call>"),
            // Nested objects and arrays, numbers and literals, odd spacing.
            "<tool_call>\n{ \"name\" : \"edit\" ,\n  \"arguments\" : {\"ops\": [{\"at\": [1, 2], \"del\": true}, {\"ins\": null, \"n\": -3.5e2}], \"meta\": {\"a\": {}}} }\n</tool_call>".to_string(),
            // Text, then two calls.
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"B\", \"days\": 2}}\n</tool_call>".to_string(),
            // `arguments` before `name`: whole, nothing streamed.
            "<tool_call>\n{\"arguments\": {\"city\": \"Rome\"}, \"name\": \"get_weather\"}\n</tool_call>".to_string(),
            // XML, bare and fenced JSON calls stay whole.
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>".to_string(),
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}".to_string(),
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"C\"}}\n```".to_string(),
            // Malformed before the name is complete: text, nothing streamed.
            "ok <tool_call>\n{\"name\": \"get_w".to_string(),
            "<tool_call>\n{\"name\": get_weather, \"arguments\": {}}\n</tool_call>".to_string(),
            // Unterminated but complete.
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}".to_string(),
            "Done.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\nMore text.".to_string(),
        ] {
            let plain = run(&t);
            let pieces = run_streaming(&t);
            // The client gets the same text and calls...
            assert_eq!(whole(&pieces), plain, "{t:?}");
            // ...and every streamed call's deltas are its whole arguments (the
            // arguments object closed before the closing tag).
            let finals = calls(&pieces);
            for (name, args) in streamed(&pieces) {
                let c = finals.iter().find(|c| c.name == name && c.arguments == args);
                assert!(c.is_some(), "{name} {args} in {t:?}");
            }
        }
        let n_streamed = |t: &str| streamed(&run_streaming(t)).len();
        assert_eq!(n_streamed("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"B\", \"days\": 2}}\n</tool_call>"), 2);
        assert_eq!(n_streamed("<tool_call>\n{\"arguments\": {\"city\": \"Rome\"}, \"name\": \"get_weather\"}\n</tool_call>"), 0);
        assert_eq!(
            n_streamed("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}"),
            0
        );
        assert_eq!(n_streamed("ok <tool_call>\n{\"name\": \"get_w"), 0);
    }

    #[test]
    fn arguments_stream_while_written() {
        let t = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rio de Janeiro\", \"days\": 12}}\n</tool_call>";
        let seen = progress(t);
        let at = |s: &str| t.find(s).unwrap() + s.len() - 1;
        // Nothing before the arguments object opens; then it grows with the text.
        assert_eq!(seen[at("\"arguments\": ")], None);
        assert_eq!(seen[at("\"arguments\": {")].as_deref(), Some("{"));
        assert_eq!(seen[at("\"Rio de")].as_deref(), Some("{\"city\":\"Rio de"));
        // The number waits for its end, the key for its value.
        assert_eq!(
            seen[at("\"days\": 1")].as_deref(),
            Some("{\"city\":\"Rio de Janeiro\"")
        );
        assert_eq!(
            seen[at("12}")].as_deref(),
            Some("{\"city\":\"Rio de Janeiro\",\"days\":12}")
        );
        // All of it before the closing tag.
        assert_eq!(
            seen[at("</tool_call")].as_deref(),
            Some("{\"city\":\"Rio de Janeiro\",\"days\":12}")
        );
    }

    #[test]
    fn forced_prefix_streams_after_it() {
        // The server feeds a forced call's prefix before asking for streaming.
        let mut p = QwenParser::new(&tools());
        let mut out = Vec::new();
        p.push(
            &ToolFormat::Hermes
                .forced_prefix(Some("get_weather"))
                .unwrap(),
            &mut out,
        );
        assert!(out.is_empty());
        assert!(p.stream_calls());
        for t in [
            "{\"",
            "city",
            "\": \"",
            "Paris",
            "\"}",
            "}\n",
            "</tool_call>",
        ] {
            p.push(t, &mut out);
        }
        p.finish(&mut out);
        check_stream_contract(&out);
        assert_eq!(
            whole(&out),
            vec![call("get_weather", "{\"city\":\"Paris\"}")]
        );
        assert_eq!(
            streamed(&out),
            vec![(
                "get_weather".to_string(),
                "{\"city\":\"Paris\"}".to_string()
            )]
        );
        assert!(
            out.iter()
                .filter(|p| matches!(p, Piece::CallArgs(_)))
                .count()
                > 1
        );
    }

    #[test]
    fn streamed_escapes_keep_the_value() {
        // Escapes serde_json writes otherwise, and a repeated key: the streamed
        // arguments stand (the same JSON value; they differ from the whole call's
        // text).
        let t = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Z\\u00fcrich\\/A\", \"days\": 1.0e1, \"days\": 3}}\n</tool_call>";
        assert_eq!(
            run(t),
            vec![call("get_weather", r#"{"city":"Zürich/A","days":3}"#)]
        );
        let pieces = run_streaming(t);
        let args = r#"{"city":"Zürich/A","days":10.0,"days":3}"#;
        assert_eq!(whole(&pieces), vec![call("get_weather", args)]);
        assert_eq!(
            serde_json::from_str::<Value>(args).unwrap(),
            json!({"city": "Zürich/A", "days": 3})
        );
    }

    #[test]
    fn a_started_call_that_turns_out_malformed_ends_closed() {
        // Once started, a call cannot be taken back: a body that does not parse
        // (here a missing `}`, then a cut-off output) ends as what was streamed,
        // closed, where the whole-call path gives text.
        let t = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}\n</tool_call>";
        assert_eq!(run(t), vec![text(t)]);
        let pieces = run_streaming(t);
        assert_eq!(
            whole(&pieces),
            vec![call("get_weather", r#"{"city":"Paris"}"#)]
        );
        let t = "I will.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par";
        assert_eq!(run(t), vec![text(t)]);
        let pieces = run_streaming(t);
        assert_eq!(
            whole(&pieces),
            vec![text("I will."), call("get_weather", r#"{"city":"Par"}"#)]
        );
        // Invalid JSON inside the arguments: streaming stops there.
        let t = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa\nris\"}}\n</tool_call>";
        assert_eq!(run(t), vec![text(t)]);
        let pieces = run_streaming(t);
        assert_eq!(streamed(&pieces)[0].1, r#"{"city":"Pa"#);
        assert_eq!(
            whole(&pieces),
            vec![call("get_weather", r#"{"city":"Pa"}"#)]
        );
        // A `</tool_call>` inside a string cuts the body, as without streaming;
        // the rest is text.
        let t =
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"</tool_call>\"}}";
        assert_eq!(run(t), vec![text(t)]);
        let pieces = run_streaming(t);
        assert_eq!(
            whole(&pieces),
            vec![call("get_weather", r#"{"city":""}"#), text("\"}}")]
        );
    }
}
