//! Streaming a JSON tool call while the model writes it: the call's name once it
//! is known, then its arguments as text deltas ([`Piece::CallStart`],
//! [`Piece::CallArgs`]).
//!
//! [`JsonCallStream`] follows a call object `{"name": "…", "arguments": {…}}`
//! (Hermes style) character by character. It starts the call when the name is
//! complete and the arguments object has opened, and then streams the
//! arguments in the form the whole-call path gives them ([`super::arguments_text`]:
//! compact, serde_json's escapes and numbers), so that in the usual case the
//! streamed text is a prefix of the final arguments. Nothing that a later
//! character could invalidate goes out: a key and the comma before it wait for
//! their value to begin, a number or literal for its end, an escape for its last
//! character; what was streamed can always be closed to a JSON object
//! ([`close_json`]). Text that is not valid JSON stops the streaming (the rest
//! waits for the end of the call). A call object in another key order
//! (`arguments` before `name`) or with other keys first is not streamed at all.
//!
//! When the call ends, [`JsonCallStream::end`] says what it ends as (see there);
//! other parsers whose calls are JSON objects can adopt it the way
//! [`super::QwenParser`] does.

use serde_json::Value;

use super::{Piece, ToolCall};

/// The deepest nesting streamed inside the arguments (serde_json refuses more
/// than 128 levels in all): deeper text waits for the end of the call.
const MAX_DEPTH: usize = 64;

/// Where the scanner is inside the arguments object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arg {
    /// Just after `{`: a key or `}`.
    ObjFirst,
    /// After `,` in an object: a key.
    ObjKey,
    /// Inside a key (its raw text is in `tok`).
    Key { escaped: bool },
    /// After a key: `:`.
    Colon,
    /// Just after `[`: a value or `]`.
    ArrFirst,
    /// A value.
    Value,
    /// Inside a string value: streamed as it comes.
    Str,
    /// Inside an escape of a string value (its raw text is in `tok`).
    Escape,
    /// A number (its raw text is in `tok`).
    Number,
    /// `true`, `false` or `null` (its raw text is in `tok`).
    Literal,
    /// After a value: `,` or the end of its object or array.
    After,
}

/// Where the scanner is in the call object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before the call object's `{`.
    Open,
    /// A key of the call object: `"name"` first, then `"arguments"`.
    Key,
    /// Inside a key (`name` false) or the name (`name` true) of the call object;
    /// its raw text is in `tok`.
    TopStr { name: bool, escaped: bool },
    /// After a key of the call object: `:`.
    Colon,
    /// The name's string.
    NameValue,
    /// After the name: `,`.
    AfterName,
    /// The arguments' `{`.
    ArgsValue,
    /// Inside the arguments (the call has started).
    Args(Arg),
    /// The arguments object closed: all of it was streamed.
    Done,
    /// Not a call this stream follows: nothing was started.
    Off,
    /// Started, but the text that follows cannot be streamed safely: the rest
    /// waits for the end of the call.
    Stuck,
}

/// Follows one JSON tool call as it is written; see the module documentation.
#[derive(Debug, Clone)]
pub(crate) struct JsonCallStream {
    phase: Phase,
    /// The raw text of the token being read (a key, the name, an escape, a
    /// number or a literal).
    tok: String,
    /// The call's name, once complete.
    name: Option<String>,
    /// Whether [`Piece::CallStart`] went out.
    started: bool,
    /// The arguments text streamed so far.
    sent: String,
    /// A comma and key waiting for their value to begin.
    held: String,
    /// Open containers inside the arguments: `true` an object, `false` an array.
    stack: Vec<bool>,
}

impl Default for JsonCallStream {
    fn default() -> Self {
        JsonCallStream {
            phase: Phase::Open,
            tok: String::new(),
            name: None,
            started: false,
            sent: String::new(),
            held: String::new(),
            stack: Vec::new(),
        }
    }
}

/// JSON's insignificant whitespace.
fn is_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// The string a complete JSON string token (quotes included) stands for.
fn decode(tok: &str) -> Option<String> {
    serde_json::from_str::<String>(tok).ok()
}

/// `s` as serde_json writes a string, quotes included.
fn encode(s: String) -> String {
    Value::String(s).to_string()
}

impl JsonCallStream {
    /// Whether the call was started ([`Piece::CallStart`] went out).
    pub fn started(&self) -> bool {
        self.started
    }

    /// Scans the next text of the call's body (everything after the opening
    /// markup, in order, none of the closing markup), appending a
    /// [`Piece::CallStart`] and [`Piece::CallArgs`] to `out` as they become safe.
    pub fn feed(&mut self, text: &str, out: &mut Vec<Piece>) {
        let from = self.sent.len();
        for c in text.chars() {
            if matches!(self.phase, Phase::Done | Phase::Off | Phase::Stuck) {
                break;
            }
            while self.step(c, out) {}
        }
        if self.sent.len() > from {
            out.push(Piece::CallArgs(self.sent[from..].to_string()));
        }
    }

    /// One character; true when it must be looked at again (it ended a number
    /// or literal).
    fn step(&mut self, c: char, out: &mut Vec<Piece>) -> bool {
        match self.phase {
            Phase::Open => match c {
                _ if is_ws(c) => {}
                '{' => self.phase = Phase::Key,
                _ => self.phase = Phase::Off,
            },
            Phase::Key => match c {
                _ if is_ws(c) => {}
                '"' => self.start_top_str(false),
                _ => self.phase = Phase::Off,
            },
            Phase::TopStr { name, escaped } => {
                self.tok.push(c);
                if escaped {
                    self.phase = Phase::TopStr {
                        name,
                        escaped: false,
                    };
                } else if c == '\\' {
                    self.phase = Phase::TopStr {
                        name,
                        escaped: true,
                    };
                } else if c == '"' {
                    self.end_top_str(name);
                }
            }
            Phase::Colon => match c {
                _ if is_ws(c) => {}
                ':' if self.name.is_none() => self.phase = Phase::NameValue,
                ':' => self.phase = Phase::ArgsValue,
                _ => self.phase = Phase::Off,
            },
            Phase::NameValue => match c {
                _ if is_ws(c) => {}
                '"' => self.start_top_str(true),
                _ => self.phase = Phase::Off,
            },
            Phase::AfterName => match c {
                _ if is_ws(c) => {}
                ',' => self.phase = Phase::Key,
                _ => self.phase = Phase::Off,
            },
            Phase::ArgsValue => match c {
                _ if is_ws(c) => {}
                '{' => {
                    let Some(name) = self.name.clone() else {
                        self.phase = Phase::Off;
                        return false;
                    };
                    out.push(Piece::CallStart(name));
                    self.started = true;
                    self.sent.push('{');
                    self.stack.push(true);
                    self.phase = Phase::Args(Arg::ObjFirst);
                }
                _ => self.phase = Phase::Off,
            },
            Phase::Args(a) => return self.step_args(a, c),
            Phase::Done | Phase::Off | Phase::Stuck => {}
        }
        false
    }

    fn start_top_str(&mut self, name: bool) {
        self.tok.clear();
        self.tok.push('"');
        self.phase = Phase::TopStr {
            name,
            escaped: false,
        };
    }

    /// A key or the name of the call object is complete (in `tok`).
    fn end_top_str(&mut self, is_name: bool) {
        let s = decode(&self.tok);
        self.tok.clear();
        self.phase = match (s, is_name) {
            (None, _) => Phase::Off,
            // As `call_from_json` takes it.
            (Some(n), true) if !n.trim().is_empty() => {
                self.name = Some(n.trim().to_string());
                Phase::AfterName
            }
            (Some(_), true) => Phase::Off,
            (Some(k), false) => {
                let expected = if self.name.is_none() {
                    "name"
                } else {
                    "arguments"
                };
                if k == expected {
                    Phase::Colon
                } else {
                    Phase::Off
                }
            }
        };
    }

    fn stuck(&mut self) -> bool {
        self.phase = Phase::Stuck;
        false
    }

    /// Sends the held comma and key: a value begins.
    fn release(&mut self) {
        self.sent.push_str(&self.held);
        self.held.clear();
    }

    /// The first character of a value.
    fn value_start(&mut self, c: char) -> bool {
        match c {
            _ if is_ws(c) => {}
            '{' | '[' => {
                if self.stack.len() >= MAX_DEPTH {
                    return self.stuck();
                }
                self.release();
                self.sent.push(c);
                self.stack.push(c == '{');
                self.phase = Phase::Args(if c == '{' {
                    Arg::ObjFirst
                } else {
                    Arg::ArrFirst
                });
            }
            '"' => {
                self.release();
                self.sent.push('"');
                self.phase = Phase::Args(Arg::Str);
            }
            '-' | '0'..='9' => {
                self.tok.clear();
                self.tok.push(c);
                self.phase = Phase::Args(Arg::Number);
            }
            't' | 'f' | 'n' => {
                self.tok.clear();
                self.tok.push(c);
                self.phase = Phase::Args(Arg::Literal);
            }
            _ => return self.stuck(),
        }
        false
    }

    /// Closes the innermost container with `c`.
    fn close(&mut self, c: char) {
        self.stack.pop();
        self.sent.push(c);
        self.phase = if self.stack.is_empty() {
            Phase::Done
        } else {
            Phase::Args(Arg::After)
        };
    }

    /// The number or literal in `tok` as the whole-call path writes it, when
    /// it is a complete one.
    fn scalar(&self) -> Option<String> {
        let v: Value = serde_json::from_str(&self.tok).ok()?;
        (v.is_number() || v.is_boolean() || v.is_null()).then(|| v.to_string())
    }

    fn step_args(&mut self, a: Arg, c: char) -> bool {
        match a {
            Arg::ObjFirst | Arg::ObjKey => match c {
                _ if is_ws(c) => {}
                '}' if a == Arg::ObjFirst => self.close('}'),
                '"' => {
                    self.tok.clear();
                    self.tok.push('"');
                    self.phase = Phase::Args(Arg::Key { escaped: false });
                }
                _ => return self.stuck(),
            },
            Arg::Key { escaped } => {
                self.tok.push(c);
                if escaped {
                    self.phase = Phase::Args(Arg::Key { escaped: false });
                } else if c == '\\' {
                    self.phase = Phase::Args(Arg::Key { escaped: true });
                } else if c == '"' {
                    let Some(k) = decode(&self.tok) else {
                        return self.stuck();
                    };
                    self.held.push_str(&encode(k));
                    self.phase = Phase::Args(Arg::Colon);
                }
            }
            Arg::Colon => match c {
                _ if is_ws(c) => {}
                ':' => {
                    self.held.push(':');
                    self.phase = Phase::Args(Arg::Value);
                }
                _ => return self.stuck(),
            },
            Arg::ArrFirst if c == ']' => self.close(']'),
            Arg::ArrFirst | Arg::Value => return self.value_start(c),
            Arg::Str => match c {
                '"' => {
                    self.sent.push('"');
                    self.phase = Phase::Args(Arg::After);
                }
                '\\' => {
                    self.tok.clear();
                    self.tok.push('\\');
                    self.phase = Phase::Args(Arg::Escape);
                }
                // serde_json refuses raw control characters in strings.
                _ if c < ' ' => return self.stuck(),
                _ => self.sent.push(c),
            },
            Arg::Escape => return self.step_escape(c),
            Arg::Number => {
                if matches!(c, '0'..='9' | '+' | '-' | '.' | 'e' | 'E') {
                    self.tok.push(c);
                } else {
                    return self.end_scalar();
                }
            }
            Arg::Literal => {
                if c.is_ascii_lowercase() && self.tok.len() < 5 {
                    self.tok.push(c);
                } else {
                    return self.end_scalar();
                }
            }
            Arg::After => {
                let in_object = self.stack.last() == Some(&true);
                match c {
                    _ if is_ws(c) => {}
                    ',' => {
                        self.held.push(',');
                        self.phase = Phase::Args(if in_object { Arg::ObjKey } else { Arg::Value });
                    }
                    '}' if in_object => self.close('}'),
                    ']' if !in_object => self.close(']'),
                    _ => return self.stuck(),
                }
            }
        }
        false
    }

    /// A number or literal ended (the character after it is looked at again).
    fn end_scalar(&mut self) -> bool {
        match self.scalar() {
            Some(v) => {
                self.release();
                self.sent.push_str(&v);
                self.tok.clear();
                self.phase = Phase::Args(Arg::After);
                true
            }
            None => self.stuck(),
        }
    }

    /// The next character of an escape in a string value (`tok` holds it from
    /// the backslash): a complete escape goes out as serde_json writes what it
    /// stands for.
    fn step_escape(&mut self, c: char) -> bool {
        self.tok.push(c);
        let n = self.tok.len();
        let complete = match n {
            2 if c == 'u' => false,
            2 => matches!(c, '"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't'),
            3..=6 | 9..=12 if !c.is_ascii_hexdigit() => return self.stuck(),
            6 => {
                // A high surrogate needs its low one (serde_json refuses a lone one).
                let high = u16::from_str_radix(&self.tok[2..6], 16)
                    .is_ok_and(|u| (0xD800..=0xDBFF).contains(&u));
                !high
            }
            7 if c != '\\' => return self.stuck(),
            8 if c != 'u' => return self.stuck(),
            12 => true,
            _ => false,
        };
        if n == 2 && !complete && c != 'u' {
            return self.stuck();
        }
        if complete {
            let Some(s) = decode(&format!("\"{}\"", self.tok)) else {
                return self.stuck();
            };
            let e = encode(s);
            self.sent.push_str(&e[1..e.len() - 1]);
            self.tok.clear();
            self.phase = Phase::Args(Arg::Str);
        }
        false
    }

    /// What the started call ends as, given `parsed`, the call its whole text
    /// gives (`None` when it does not parse as one call); `None` when no call
    /// was started (the caller goes on as without streaming). The result has
    /// the streamed name, and its arguments begin with everything streamed:
    /// - `parsed` itself when it has that name and its arguments begin so (the
    ///   usual case: the same call as without streaming);
    /// - else, when the whole arguments object was streamed and means the same
    ///   JSON value as `parsed`'s (other escapes or numbers than serde_json
    ///   writes, a repeated key), the streamed text;
    /// - else (the call turned out malformed, was cut off, or says something
    ///   else than what was streamed) the streamed text closed as a JSON object,
    ///   a number or literal still being read included when complete.
    pub fn end(&mut self, parsed: Option<ToolCall>) -> Option<ToolCall> {
        if !self.started {
            return None;
        }
        let name = self.name.clone().unwrap_or_default();
        if let Some(c) = parsed.filter(|c| c.name == name) {
            if c.arguments.starts_with(&self.sent) {
                return Some(c);
            }
            if self.phase == Phase::Done {
                let same = |t: &str| serde_json::from_str::<Value>(t).ok();
                if same(&self.sent).is_some() && same(&self.sent) == same(&c.arguments) {
                    return Some(ToolCall {
                        name,
                        arguments: self.sent.clone(),
                    });
                }
            }
        }
        let mut args = self.sent.clone();
        if matches!(self.phase, Phase::Args(Arg::Number | Arg::Literal)) {
            if let Some(v) = self.scalar() {
                args.push_str(&self.held);
                args.push_str(&v);
            }
        }
        Some(ToolCall {
            name,
            arguments: close_json(&args),
        })
    }
}

/// Closes `prefix`, the beginning of a JSON object cut at a clean point (after
/// `{`, `[` or a whole value, or inside a string after a whole character or
/// escape, as [`JsonCallStream`] streams), into a whole object: the open string
/// and every open container are closed. An empty prefix becomes `{}`.
pub(crate) fn close_json(prefix: &str) -> String {
    if prefix.trim().is_empty() {
        return format!("{prefix}{{}}");
    }
    let mut closers = Vec::new();
    let mut strings = super::JsonStrings::default();
    for c in prefix.chars() {
        if !strings.structural(c) {
            continue;
        }
        match c {
            '{' => closers.push('}'),
            '[' => closers.push(']'),
            '}' | ']' => {
                closers.pop();
            }
            _ => {}
        }
    }
    let mut s = prefix.to_string();
    if strings.in_str {
        if strings.escaped {
            s.pop();
        }
        s.push('"');
    }
    s.extend(closers.iter().rev());
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streams `body` one char at a time: (start name, streamed text, stream).
    fn stream(body: &str) -> (Option<String>, String, JsonCallStream) {
        let mut s = JsonCallStream::default();
        let mut out = Vec::new();
        let mut b = [0u8; 4];
        for c in body.chars() {
            s.feed(c.encode_utf8(&mut b), &mut out);
        }
        let mut name = None;
        let mut args = String::new();
        for p in out {
            match p {
                Piece::CallStart(n) => {
                    assert!(name.is_none() && args.is_empty());
                    name = Some(n);
                }
                Piece::CallArgs(a) => {
                    assert!(name.is_some());
                    args.push_str(&a);
                }
                p => panic!("{p:?}"),
            }
        }
        assert_eq!(args, s.sent);
        (name, args, s)
    }

    /// The whole-call path's arguments.
    fn normalized(body: &str) -> String {
        let v: Value = serde_json::from_str(body).unwrap();
        super::super::call_from_json(&v).unwrap().arguments
    }

    #[test]
    fn streams_the_normalized_arguments() {
        for body in [
            r#"{"name": "f", "arguments": {"a": 1, "b": [true, null, -2.5e3, {}], "c": {"d": "x\ny"}}}"#,
            "\n{\"name\":\"f\",\"arguments\":{\"path\":\"a/b.rs\",\"text\":\"fn main() {\\n    println!(\\\"hi \\u00e9 \\ud83d\\ude00 \\/\\\");\\n}\\n\"}}\n",
            r#"{ "name" : " spaced " , "arguments" : { } }"#,
            r#"{"name": "f", "arguments": {"n": 100000000000000000000, "z": -0, "e": 1E2, "s": "\u001F\b"}}"#,
        ] {
            let (name, args, s) = stream(body);
            let v: Value = serde_json::from_str(body.trim()).unwrap();
            let whole = super::super::call_from_json(&v).unwrap();
            assert_eq!(name, Some(whole.name), "{body}");
            assert_eq!(args, whole.arguments, "{body}");
            assert_eq!(s.phase, Phase::Done);
        }
    }

    #[test]
    fn holds_what_may_still_change() {
        // A key and its comma wait for the value; a number for its end.
        let (_, args, _) = stream(r#"{"name": "f", "arguments": {"a": 12"#);
        assert_eq!(args, "{");
        let (_, args, _) = stream(r#"{"name": "f", "arguments": {"a": 12, "b""#);
        assert_eq!(args, r#"{"a":12"#);
        let (_, args, _) = stream(r#"{"name": "f", "arguments": {"a": "x\u00"#);
        assert_eq!(args, r#"{"a":"x"#);
        let (_, args, _) = stream(r#"{"name": "f", "arguments": {"a": "x\ud83d\u"#);
        assert_eq!(args, r#"{"a":"x"#);
        let (_, args, _) = stream(r#"{"name": "f", "arguments": {"a": [tru"#);
        assert_eq!(args, r#"{"a":["#);
    }

    #[test]
    fn starts_only_with_the_name_first_and_an_object() {
        for body in [
            r#"{"arguments": {"a": 1}, "name": "f"}"#,
            r#"{"name": "f", "parameters": {"a": 1}}"#,
            r#"{"name": "f", "arguments": "{\"a\": 1}"}"#,
            r#"{"name": "  ", "arguments": {}}"#,
            r#"{"name": "f"}"#,
            r#"[{"name": "f", "arguments": {}}]"#,
            r#"<function=f>"#,
        ] {
            let (name, args, _) = stream(body);
            assert_eq!((name, args), (None, String::new()), "{body}");
        }
    }

    #[test]
    fn invalid_text_stops_the_stream() {
        for (body, sent) in [
            (
                "{\"name\": \"f\", \"arguments\": {\"a\": \"x\ny\"}}",
                r#"{"a":"x"#,
            ),
            (r#"{"name": "f", "arguments": {"a": 1 2}}"#, r#"{"a":1"#),
            (r#"{"name": "f", "arguments": {"a": 01}}"#, "{"),
            (r#"{"name": "f", "arguments": {"a": [1,]}}"#, r#"{"a":[1"#),
            (
                r#"{"name": "f", "arguments": {"a": "\ud800x"}}"#,
                r#"{"a":""#,
            ),
            (r#"{"name": "f", "arguments": {"a": "\q"}}"#, r#"{"a":""#),
            (r#"{"name": "f", "arguments": {"a": truth}}"#, "{"),
        ] {
            let (name, args, s) = stream(body);
            assert_eq!(name.as_deref(), Some("f"));
            assert_eq!(args, sent, "{body}");
            assert_eq!(s.phase, Phase::Stuck, "{body}");
        }
    }

    #[test]
    fn end_prefers_the_whole_call() {
        let body = r#"{"name": "f", "arguments": {"a": "\u00e9", "a": 2}}"#;
        let (_, args, mut s) = stream(body);
        assert_eq!(args, r#"{"a":"é","a":2}"#);
        let parsed = ToolCall {
            name: "f".into(),
            arguments: normalized(body),
        };
        assert_eq!(parsed.arguments, r#"{"a":2}"#);
        // The same value: the streamed text stands.
        assert_eq!(s.clone().end(Some(parsed.clone())).unwrap().arguments, args);
        // A malformed call: what was streamed, closed.
        assert_eq!(s.end(None).unwrap().arguments, args);
        let (_, _, mut s) = stream(r#"{"name": "f", "arguments": {"a": ["x", {"b": "y\"z"#);
        let c = s.end(None).unwrap();
        assert_eq!(
            (c.name.as_str(), c.arguments.as_str()),
            ("f", r#"{"a":["x",{"b":"y\"z"}]}"#)
        );
        // A number being read is kept when complete.
        let (_, _, mut s) = stream(r#"{"name": "f", "arguments": {"a": 1, "b": 2.5"#);
        assert_eq!(s.end(None).unwrap().arguments, r#"{"a":1,"b":2.5}"#);
        // Another name than streamed: the streamed call stands.
        let (_, _, mut s) = stream(r#"{"name": "f", "arguments": {}, "name": "g"}"#);
        let other = ToolCall {
            name: "g".into(),
            arguments: "{}".into(),
        };
        assert_eq!(s.end(Some(other)).unwrap().name, "f");
        // Nothing started: the caller decides.
        let (_, _, mut s) = stream(r#"{"arguments": {}, "name": "f"}"#);
        assert!(s.end(None).is_none());
    }

    #[test]
    fn close_json_closes_clean_prefixes() {
        assert_eq!(close_json(""), "{}");
        assert_eq!(close_json(" "), " {}");
        assert_eq!(close_json("{"), "{}");
        assert_eq!(
            close_json(r#"{"a":[1,{"b":"x]}"#),
            r#"{"a":[1,{"b":"x]}"}]}"#
        );
        assert_eq!(close_json(r#"{"a":"\""#), r#"{"a":"\""}"#);
        assert_eq!(close_json(r#"{"a":{}}"#), r#"{"a":{}}"#);
    }

    #[test]
    fn deep_nesting_waits() {
        let body = format!(
            r#"{{"name": "f", "arguments": {{"a": {}1{}}}}}"#,
            "[".repeat(100),
            "]".repeat(100)
        );
        let (_, args, s) = stream(&body);
        assert_eq!(s.phase, Phase::Stuck);
        assert_eq!(args, format!(r#"{{"a":{}"#, "[".repeat(MAX_DEPTH - 1)));
        assert!(normalized(&body).starts_with(&args));
    }
}
