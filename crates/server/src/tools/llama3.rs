//! Llama 3.x tool calls: the whole answer is a JSON object
//! `{"name": …, "parameters": {…}}` (optionally after `<|python_tag|>`), possibly
//! several separated by `;` or newlines. Anything else is text.

use serde_json::Value;

use super::{call_from_json, json_end, push_text, Piece, ToolParser};

const PYTHON_TAG: &str = "<|python_tag|>";

enum State {
    /// Only whitespace (or the start of `<|python_tag|>`) so far.
    Start,
    /// Inside a JSON object that may be a call.
    Json,
    /// After a call: separators, then another call or the end.
    Between,
    /// Plain text to the end.
    Text,
}

/// Streaming parser for Llama 3.x JSON tool calls.
pub struct Llama3Parser {
    state: State,
    buf: String,
    /// Everything consumed so far, to return as text if a later object is not a call.
    raw: String,
    calls: usize,
}

impl Llama3Parser {
    /// A parser for one response.
    pub fn new() -> Self {
        Llama3Parser {
            state: State::Start,
            buf: String::new(),
            raw: String::new(),
            calls: 0,
        }
    }
}

impl Default for Llama3Parser {
    fn default() -> Self {
        Self::new()
    }
}

impl ToolParser for Llama3Parser {
    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.buf.push_str(text);
        loop {
            match self.state {
                State::Text => {
                    push_text(out, &std::mem::take(&mut self.buf));
                    return;
                }
                State::Start | State::Between => {
                    let t = self
                        .buf
                        .trim_start_matches(|c: char| c.is_whitespace() || c == ';');
                    if t.is_empty() || (PYTHON_TAG.starts_with(t) && t.len() < PYTHON_TAG.len()) {
                        return;
                    }
                    let t = t.strip_prefix(PYTHON_TAG).unwrap_or(t).trim_start();
                    if t.starts_with('{') {
                        let skipped = self.buf.len() - t.len();
                        self.raw.push_str(&self.buf[..skipped]);
                        self.buf.drain(..skipped);
                        self.state = State::Json;
                    } else if t.is_empty() {
                        return;
                    } else {
                        // Text after calls is kept as text; text first means no calls.
                        if self.calls > 0 {
                            self.buf = t.to_string();
                        }
                        self.state = State::Text;
                    }
                }
                State::Json => {
                    let Some(end) = json_end(&self.buf) else {
                        return;
                    };
                    let obj: String = self.buf.drain(..end).collect();
                    match serde_json::from_str::<Value>(&obj)
                        .ok()
                        .and_then(|v| call_from_json(&v))
                    {
                        Some(c) => {
                            out.push(Piece::Call(c));
                            self.calls += 1;
                            self.raw.clear();
                            self.state = State::Between;
                        }
                        None => {
                            let mut t = std::mem::take(&mut self.raw);
                            t.push_str(&obj);
                            t.push_str(&self.buf);
                            self.buf = t;
                            self.state = State::Text;
                        }
                    }
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        let buf = std::mem::take(&mut self.buf);
        match self.state {
            State::Text => push_text(out, &buf),
            State::Between => {}
            State::Start => push_text(out, &buf),
            State::Json => {
                // Truncated JSON: if it parses (e.g. trailing garbage trimmed) take it.
                match serde_json::from_str::<Value>(buf.trim())
                    .ok()
                    .and_then(|v| call_from_json(&v))
                {
                    Some(c) => out.push(Piece::Call(c)),
                    None => {
                        push_text(out, &std::mem::take(&mut self.raw));
                        push_text(out, &buf);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{call, parse_all_splits, text};
    use super::*;

    fn run(t: &str) -> Vec<Piece> {
        parse_all_splits(&|| Box::new(Llama3Parser::new()), t)
    }

    #[test]
    fn json_call() {
        assert_eq!(
            run("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"),
            vec![call("get_weather", r#"{"city":"Paris"}"#)]
        );
    }

    #[test]
    fn python_tag_and_several_calls() {
        assert_eq!(
            run("<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}"),
            vec![call("a", "{}"), call("b", r#"{"x":1}"#)]
        );
    }

    #[test]
    fn text_is_text() {
        let t = "The weather {is} fine; <|python";
        assert_eq!(run(t), vec![text(t)]);
        let t = "{\"not\": \"a call\"} really";
        assert_eq!(run(t), vec![text(t)]);
        let t = "  {\"name\": \"a\", \"parameters\": {";
        assert_eq!(run(t), vec![text(t)]);
    }
}
