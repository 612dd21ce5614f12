//! Gemma 4 tool calls: `<|tool_call>call:NAME{key:value,…}<tool_call|>`.
//!
//! The chat template writes arguments in its own notation, not JSON: keys are
//! bare, strings are wrapped in the `<|"|>` token (no escaping inside),
//! objects are `{k:v,…}`, arrays `[v,…]`, and numbers, `true`, `false` and
//! `null` are bare. Several calls follow one another directly. Gemma 4 also
//! thinks in a channel, `<|channel>thought\n…<channel|>`, which comes back as
//! reasoning. A call whose body does not parse comes back as text, markup
//! included; an unfinished call at the end of the output is a call only when
//! its argument object is complete.

use serde_json::{Map, Number, Value};

use super::{find_any, push_reasoning, push_text, safe_len, Piece, ToolCall, ToolParser};

/// Opens a call.
pub const OPEN: &str = "<|tool_call>";
/// Closes a call.
pub const CLOSE: &str = "<tool_call|>";
/// Delimits a string value (both ends).
pub const QUOTE: &str = "<|\"|>";
/// Opens the thinking channel.
pub const CHANNEL_OPEN: &str = "<|channel>";
/// Closes the thinking channel.
pub const CHANNEL_CLOSE: &str = "<channel|>";
/// The model starting to imagine the tool's answer: the turn is over.
pub const RESPONSE_OPEN: &str = "<|tool_response>";

enum State {
    /// Plain text.
    Text,
    /// Inside `<|channel>`: reasoning.
    Channel,
    /// Inside `<|tool_call>`: the body so far is in `buf`.
    Call,
    /// The output went on to `<|tool_response>`: the rest is dropped.
    Done,
}

/// Streaming parser for Gemma 4's tool-call and thinking-channel markup.
pub struct Gemma4Parser {
    state: State,
    buf: String,
    /// Whitespace held back after text: dropped if a call follows.
    pending_ws: String,
    /// The channel's leading `thought` label has been handled.
    channel_started: bool,
    /// A call was the last thing emitted: whitespace that follows is layout.
    after_call: bool,
    /// The newline after a closed channel is layout.
    skip_newline: bool,
    calls: usize,
    /// Tool calls are parsed (otherwise their markup is text; the thinking
    /// channel is still parsed).
    parse_calls: bool,
}

impl Gemma4Parser {
    /// A parser for one response; `parse_calls` false leaves call markup as text.
    pub fn new(parse_calls: bool) -> Self {
        Gemma4Parser {
            state: State::Text,
            buf: String::new(),
            pending_ws: String::new(),
            channel_started: false,
            after_call: false,
            skip_newline: false,
            calls: 0,
            parse_calls,
        }
    }

    fn emit_text(&mut self, text: &str, out: &mut Vec<Piece>) {
        let text = if self.after_call {
            text.trim_start()
        } else {
            text
        };
        if text.is_empty() {
            return;
        }
        self.after_call = false;
        let trimmed = text.trim_end();
        if trimmed.is_empty() {
            self.pending_ws.push_str(text);
            return;
        }
        push_text(out, &std::mem::take(&mut self.pending_ws));
        push_text(out, trimmed);
        self.pending_ws.push_str(&text[trimmed.len()..]);
    }

    fn emit_reasoning(&mut self, text: &str, out: &mut Vec<Piece>) {
        let mut text = text;
        if !self.channel_started {
            // The channel starts with its name (`thought`) and a newline.
            if text.is_empty() {
                return;
            }
            self.channel_started = true;
            text = text.strip_prefix("thought").unwrap_or(text);
            text = text.strip_prefix('\n').unwrap_or(text);
        }
        push_reasoning(out, text);
    }

    /// Ends a call with `body` (between the markers); a body that does not
    /// parse comes back as text.
    fn close_call(&mut self, body: &str, closed: bool, out: &mut Vec<Piece>) {
        match parse_call(body) {
            Some(c) => {
                self.pending_ws.clear();
                self.calls += 1;
                self.after_call = true;
                out.push(Piece::Call(c));
            }
            None => {
                push_text(out, &std::mem::take(&mut self.pending_ws));
                let close = if closed { CLOSE } else { "" };
                push_text(out, &format!("{OPEN}{body}{close}"));
            }
        }
    }
}

impl ToolParser for Gemma4Parser {
    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.buf.push_str(text);
        loop {
            match self.state {
                State::Done => {
                    self.buf.clear();
                    return;
                }
                State::Text => {
                    if self.skip_newline {
                        if self.buf.is_empty() {
                            return;
                        }
                        if self.buf.starts_with('\n') {
                            self.buf.drain(..1);
                        }
                        self.skip_newline = false;
                    }
                    let all = [CHANNEL_OPEN, OPEN, RESPONSE_OPEN];
                    let markers = if self.parse_calls {
                        &all[..]
                    } else {
                        &all[..1]
                    };
                    let (pos, k) = match find_any(&self.buf, markers) {
                        Some(m) => m,
                        None => {
                            let n = safe_len(&self.buf, markers);
                            let t: String = self.buf.drain(..n).collect();
                            self.emit_text(&t, out);
                            return;
                        }
                    };
                    let before: String = self.buf.drain(..pos).collect();
                    self.buf.drain(..markers[k].len());
                    match k {
                        0 => {
                            self.emit_text(&before, out);
                            self.channel_started = false;
                            self.state = State::Channel;
                        }
                        1 => {
                            // Trailing whitespace stays pending: layout if a call follows.
                            self.emit_text(&before, out);
                            self.state = State::Call;
                        }
                        _ if self.calls > 0 => {
                            self.emit_text(&before, out);
                            self.state = State::Done;
                        }
                        _ => {
                            // Not after a call: nothing to end, keep it as text.
                            let t = format!("{before}{RESPONSE_OPEN}");
                            self.emit_text(&t, out);
                        }
                    }
                }
                State::Channel => match self.buf.find(CHANNEL_CLOSE) {
                    Some(pos) => {
                        let r: String = self.buf.drain(..pos).collect();
                        self.buf.drain(..CHANNEL_CLOSE.len());
                        if !self.channel_started && r.trim().is_empty() {
                            // An empty channel is the template's "no thinking" marker.
                            self.channel_started = true;
                        }
                        self.emit_reasoning(&r, out);
                        self.skip_newline = true;
                        self.state = State::Text;
                    }
                    None => {
                        // Hold back a possible marker start, and the channel name
                        // until it is known whole.
                        let mut n = safe_len(&self.buf, &[CHANNEL_CLOSE]);
                        if !self.channel_started && "thought\n".starts_with(&self.buf[..n]) {
                            n = 0;
                        }
                        let r: String = self.buf.drain(..n).collect();
                        self.emit_reasoning(&r, out);
                        return;
                    }
                },
                State::Call => {
                    let Some(pos) = find_close(&self.buf) else {
                        return;
                    };
                    let body: String = self.buf.drain(..pos).collect();
                    self.buf.drain(..CLOSE.len());
                    self.close_call(&body, true, out);
                    self.state = State::Text;
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        let buf = std::mem::take(&mut self.buf);
        match self.state {
            State::Done => {}
            State::Text => {
                self.emit_text(&buf, out);
                push_text(out, &std::mem::take(&mut self.pending_ws));
            }
            State::Channel => self.emit_reasoning(&buf, out),
            State::Call => self.close_call(&buf, false, out),
        }
        self.pending_ws.clear();
        self.after_call = false;
        self.skip_newline = false;
        self.state = State::Text;
    }
}

/// Where `CLOSE` starts in a call body, skipping `<|"|>`-quoted strings.
fn find_close(s: &str) -> Option<usize> {
    let mut i = 0;
    let mut in_str = false;
    while i < s.len() {
        let rest = &s[i..];
        if rest.starts_with(QUOTE) {
            in_str = !in_str;
            i += QUOTE.len();
        } else if !in_str && rest.starts_with(CLOSE) {
            return Some(i);
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
        }
    }
    None
}

/// `call:NAME{…}` → a call; `None` when it is not exactly that.
pub fn parse_call(body: &str) -> Option<ToolCall> {
    let b = body.trim();
    let b = b.strip_prefix("call:")?;
    let brace = b.find('{')?;
    let name = b[..brace].trim();
    let name_ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
    if !name_ok {
        return None;
    }
    let mut p = ValueParser {
        s: &b[brace..],
        i: 0,
        depth: 0,
    };
    let args = p.object()?;
    p.ws();
    if p.i != p.s.len() {
        return None;
    }
    Some(ToolCall {
        name: name.to_string(),
        arguments: Value::Object(args).to_string(),
    })
}

/// Deepest nesting of objects and arrays in a call's arguments (serde_json's
/// own limit): model output nested deeper is not a call, and recursing on it
/// would overflow the stack.
const MAX_DEPTH: usize = 128;

/// Recursive descent over the template's argument notation.
struct ValueParser<'a> {
    s: &'a str,
    i: usize,
    /// Objects and arrays open around the current position.
    depth: usize,
}

impl ValueParser<'_> {
    fn rest(&self) -> &str {
        &self.s[self.i..]
    }

    fn ws(&mut self) {
        let r = self.rest();
        self.i += r.len() - r.trim_start().len();
    }

    fn eat(&mut self, t: &str) -> bool {
        if self.rest().starts_with(t) {
            self.i += t.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self) -> Option<Value> {
        self.ws();
        let r = self.rest();
        if r.starts_with(QUOTE) {
            return self.quoted().map(Value::String);
        }
        match r.chars().next()? {
            '{' | '[' if self.depth >= MAX_DEPTH => None,
            '{' => {
                self.depth += 1;
                let v = self.object().map(Value::Object);
                self.depth -= 1;
                v
            }
            '[' => {
                self.depth += 1;
                let v = self.array();
                self.depth -= 1;
                v
            }
            '"' => {
                // Plain JSON strings are tolerated.
                let mut de = serde_json::Deserializer::from_str(r).into_iter::<String>();
                let s = de.next()?.ok()?;
                self.i += de.byte_offset();
                Some(Value::String(s))
            }
            _ => self.scalar(),
        }
    }

    fn quoted(&mut self) -> Option<String> {
        self.i += QUOTE.len();
        let end = self.rest().find(QUOTE)?;
        let s = self.rest()[..end].to_string();
        self.i += end + QUOTE.len();
        Some(s)
    }

    /// A bare number, boolean or null.
    fn scalar(&mut self) -> Option<Value> {
        let r = self.rest();
        let end = r.find([',', '}', ']']).unwrap_or(r.len());
        let tok = r[..end].trim();
        let v = match tok {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            "null" | "None" => Value::Null,
            _ => {
                if let Ok(n) = tok.parse::<i64>() {
                    Value::Number(n.into())
                } else {
                    let f = tok.parse::<f64>().ok()?;
                    Value::Number(Number::from_f64(f)?)
                }
            }
        };
        self.i += end;
        Some(v)
    }

    fn key(&mut self) -> Option<String> {
        self.ws();
        if self.rest().starts_with(QUOTE) {
            return self.quoted();
        }
        if self.rest().starts_with('"') {
            return match self.value()? {
                Value::String(s) => Some(s),
                _ => None,
            };
        }
        let r = self.rest();
        let end = r.find(':')?;
        let k = r[..end].trim().to_string();
        if k.is_empty() || k.contains(['{', '}', '[', ']', ',', '<', '\n']) {
            return None;
        }
        self.i += end;
        Some(k)
    }

    fn object(&mut self) -> Option<Map<String, Value>> {
        self.ws();
        if !self.eat("{") {
            return None;
        }
        let mut m = Map::new();
        self.ws();
        if self.eat("}") {
            return Some(m);
        }
        loop {
            let k = self.key()?;
            self.ws();
            if !self.eat(":") {
                return None;
            }
            let v = self.value()?;
            m.insert(k, v);
            self.ws();
            if self.eat(",") {
                continue;
            }
            if self.eat("}") {
                return Some(m);
            }
            return None;
        }
    }

    fn array(&mut self) -> Option<Value> {
        if !self.eat("[") {
            return None;
        }
        let mut a = Vec::new();
        self.ws();
        if self.eat("]") {
            return Some(Value::Array(a));
        }
        loop {
            a.push(self.value()?);
            self.ws();
            if self.eat(",") {
                continue;
            }
            if self.eat("]") {
                return Some(Value::Array(a));
            }
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{call, parse_all_splits, text};
    use super::*;

    fn run(t: &str) -> Vec<Piece> {
        parse_all_splits(&|| Box::new(Gemma4Parser::new(true)), t)
    }

    #[test]
    fn without_tools_calls_stay_text_but_thinking_is_parsed() {
        let t = "<|channel>thought\nhm<channel|>\n<|tool_call>call:f{}<tool_call|>";
        let out = parse_all_splits(&|| Box::new(Gemma4Parser::new(false)), t);
        assert_eq!(
            out,
            vec![
                Piece::Reasoning("hm".into()),
                text("<|tool_call>call:f{}<tool_call|>")
            ]
        );
    }

    #[test]
    fn single_call_with_typed_values() {
        let out = run(
            r#"<|tool_call>call:get_weather{city:<|"|>Paris, "FR"<|"|>,days:3,metric:true,ratio:0.5,x:null}<tool_call|>"#,
        );
        assert_eq!(
            out,
            vec![call(
                "get_weather",
                r#"{"city":"Paris, \"FR\"","days":3,"metric":true,"ratio":0.5,"x":null}"#
            )]
        );
    }

    #[test]
    fn text_then_parallel_calls_then_turn_end() {
        let out = run(concat!(
            "Let me check.\n",
            r#"<|tool_call>call:a{}<tool_call|><|tool_call>call:b{xs:[1,<|"|>two<|"|>,[]],o:{k:<|"|>v<|"|>}}<tool_call|>"#,
            "<|tool_response>response:a{ok:true}"
        ));
        assert_eq!(
            out,
            vec![
                text("Let me check."),
                call("a", "{}"),
                call("b", r#"{"xs":[1,"two",[]],"o":{"k":"v"}}"#),
            ]
        );
    }

    #[test]
    fn markup_inside_strings_is_opaque() {
        let out = run(
            r#"<|tool_call>call:shell.exec{cmd:<|"|>echo {a}, [b] <tool_call|> done<|"|>}<tool_call|>"#,
        );
        assert_eq!(
            out,
            vec![call(
                "shell.exec",
                r#"{"cmd":"echo {a}, [b] <tool_call|> done"}"#
            )]
        );
    }

    #[test]
    fn plain_text_passes_unchanged() {
        let t = "a <| b |> c <tool x> and call:f{a:1} and <|\"|> quote\n";
        assert_eq!(run(t), vec![text(t)]);
    }

    #[test]
    fn trailing_text_after_call_is_kept() {
        let out = run("<|tool_call>call:a{}<tool_call|>\nDone.");
        assert_eq!(out, vec![call("a", "{}"), text("Done.")]);
        let out = run("<|tool_call>call:a{}<tool_call|>\n\n");
        assert_eq!(out, vec![call("a", "{}")]);
    }

    #[test]
    fn malformed_calls_come_back_as_text() {
        for t in [
            r#"<|tool_call>get_weather{city:1}<tool_call|>"#,
            r#"<|tool_call>call:bad name{a:1}<tool_call|>"#,
            r#"<|tool_call>call:f{a:<|"|>x}<tool_call|>"#,
            r#"<|tool_call>call:f{a:1} trailing<tool_call|>"#,
            r#"<|tool_call>call:f{a:word}<tool_call|>"#,
            "Sure <|tool_call>call:f{a:1",
            "<|tool_call>",
        ] {
            assert_eq!(run(t), vec![text(t)], "{t}");
        }
        let out = run(r#"ok <|tool_call>call:f{a:<|"|>x<|"|>}"#);
        assert_eq!(out, vec![text("ok"), call("f", r#"{"a":"x"}"#)]);
    }

    #[test]
    fn thinking_channel_is_reasoning() {
        let out = run("<|channel>thought\nUser wants X.<channel|>\nAnswer.");
        assert_eq!(
            out,
            vec![Piece::Reasoning("User wants X.".into()), text("Answer.")]
        );
        // Empty channel (thinking off), then a call.
        let out = run("<|channel><channel|><|tool_call>call:f{}<tool_call|>");
        assert_eq!(out, vec![call("f", "{}")]);
        // Cut off mid-thought.
        let out = run("<|channel>thought\nhmm");
        assert_eq!(out, vec![Piece::Reasoning("hmm".into())]);
    }

    #[test]
    fn deep_nesting_is_refused_without_overflowing_the_stack() {
        let nested = |n: usize| format!("call:f{{a:{}1{}}}", "[".repeat(n), "]".repeat(n));
        assert!(parse_call(&nested(100)).is_some());
        // Recursing once per bracket would overflow a 2 MiB stack here.
        assert!(parse_call(&nested(1_000_000)).is_none());
        let objects = format!("call:f{{{}}}", "a:{".repeat(200_000));
        assert!(parse_call(&objects).is_none());
    }

    #[test]
    fn json_style_values_are_tolerated() {
        let out = run(r#"<|tool_call>call:f{"path": "a b.txt", n: -2.5e1}<tool_call|>"#);
        assert_eq!(out, vec![call("f", r#"{"path":"a b.txt","n":-25.0}"#)]);
    }
}
