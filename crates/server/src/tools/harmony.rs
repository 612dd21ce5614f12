//! GPT-OSS harmony output: a sequence of messages
//! `[<|start|>assistant]<|channel|>C[ to=functions.NAME][ <|constrain|>json]<|message|>BODY<|end|>`
//! where the last one ends with `<|return|>` (answer) or `<|call|>` (tool call).
//! Channel `analysis` is reasoning, `final` (and `commentary` without a
//! recipient) is answer text, a recipient `functions.NAME` makes a tool call.

use serde_json::Value;

use super::{arguments_text, push_reasoning, push_text, safe_len, Piece, ToolCall, ToolParser};

const MESSAGE: &str = "<|message|>";
const ENDS: [&str; 4] = ["<|end|>", "<|call|>", "<|return|>", "<|start|>"];
const HEADER_STARTS: [&str; 4] = ["<|channel|>", "<|start|>", "to=", "<|constrain|>"];

#[derive(Clone, Debug, PartialEq)]
enum Body {
    Reasoning,
    Text,
    Call(String),
}

enum State {
    /// Reading a message header up to `<|message|>`.
    Header,
    /// Inside a message body.
    Body(Body),
}

/// Streaming parser for harmony channels.
pub struct HarmonyParser {
    state: State,
    buf: String,
    parse_calls: bool,
}

impl HarmonyParser {
    /// A parser for one response; without `parse_calls`, tool-call messages
    /// come back as text.
    pub fn new(parse_calls: bool) -> Self {
        HarmonyParser {
            state: State::Header,
            buf: String::new(),
            parse_calls,
        }
    }

    /// What a header (the text before `<|message|>`) announces.
    fn classify(&self, header: &str) -> Body {
        let mut channel = "";
        if let Some(p) = header.find("<|channel|>") {
            channel = header[p + "<|channel|>".len()..]
                .split(|c: char| c.is_whitespace() || c == '<')
                .next()
                .unwrap_or("");
        }
        let recipient = header
            .split(|c: char| c.is_whitespace() || c == '<')
            .find_map(|w| w.strip_prefix("to="))
            .filter(|r| !r.is_empty());
        match recipient {
            Some(r) if self.parse_calls => {
                Body::Call(r.strip_prefix("functions.").unwrap_or(r).to_string())
            }
            _ if channel == "analysis" => Body::Reasoning,
            _ => Body::Text,
        }
    }

    fn emit(body: &Body, text: &str, out: &mut Vec<Piece>) {
        match body {
            Body::Reasoning => push_reasoning(out, text),
            Body::Text => push_text(out, text),
            Body::Call(_) => {}
        }
    }

    fn close_call(name: &str, args: &str, out: &mut Vec<Piece>) {
        let parsed = serde_json::from_str::<Value>(args.trim())
            .ok()
            .and_then(arguments_text);
        match parsed {
            Some(arguments) => out.push(Piece::Call(ToolCall {
                name: name.to_string(),
                arguments,
            })),
            None => push_text(out, args),
        }
    }
}

impl ToolParser for HarmonyParser {
    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.buf.push_str(text);
        loop {
            match &self.state {
                State::Header => {
                    let t = self.buf.trim_start();
                    if t.is_empty() {
                        return;
                    }
                    // Decided on how the header starts before looking for its end, so
                    // the answer does not depend on how much output has arrived (a
                    // later `<|message|>` would otherwise swallow leading text).
                    let header_like = HEADER_STARTS
                        .iter()
                        .any(|m| t.starts_with(m) || (m.starts_with(t)));
                    if !header_like {
                        // Not harmony markup (e.g. a model answering plainly): text.
                        self.state = State::Body(Body::Text);
                        continue;
                    }
                    if let Some(p) = self.buf.find(MESSAGE) {
                        let header: String = self.buf.drain(..p + MESSAGE.len()).collect();
                        self.state = State::Body(self.classify(&header));
                        continue;
                    }
                    return;
                }
                State::Body(body) => {
                    let body = body.clone();
                    match super::find_any(&self.buf, &ENDS) {
                        Some((p, k)) => {
                            let content: String = self.buf.drain(..p).collect();
                            // `<|start|>` opens the next message: keep it for the header.
                            if ENDS[k] != "<|start|>" {
                                self.buf.drain(..ENDS[k].len());
                            }
                            match &body {
                                Body::Call(name) => Self::close_call(name, &content, out),
                                b => Self::emit(b, &content, out),
                            }
                            self.state = State::Header;
                        }
                        None => {
                            if !matches!(body, Body::Call(_)) {
                                let n = safe_len(&self.buf, &ENDS);
                                let t: String = self.buf.drain(..n).collect();
                                Self::emit(&body, &t, out);
                            }
                            return;
                        }
                    }
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        let buf = std::mem::take(&mut self.buf);
        match &self.state {
            // An unfinished header is markup, not content.
            State::Header => {}
            State::Body(Body::Call(name)) => Self::close_call(&name.clone(), &buf, out),
            State::Body(b) => Self::emit(&b.clone(), &buf, out),
        }
        self.state = State::Header;
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{call, parse_all_splits, text};
    use super::*;

    fn run(t: &str) -> Vec<Piece> {
        parse_all_splits(&|| Box::new(HarmonyParser::new(true)), t)
    }

    #[test]
    fn reasoning_then_final() {
        assert_eq!(
            run("<|channel|>analysis<|message|>User greets.<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|return|>"),
            vec![Piece::Reasoning("User greets.".into()), text("Hello!")]
        );
    }

    #[test]
    fn tool_call_both_header_orders() {
        assert_eq!(
            run("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>"),
            vec![
                Piece::Reasoning("Need weather.".into()),
                call("get_weather", r#"{"city":"Paris"}"#)
            ]
        );
        assert_eq!(
            run("<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}"),
            vec![call("f", "{}")]
        );
    }

    #[test]
    fn text_before_a_later_header_stays_text_however_it_arrives() {
        // Found by fuzzing (crates/fuzz-targets, tool_parsers): whole, the later
        // `<|message|>` made everything before it one header and dropped the text;
        // in pieces the same text came out.
        assert_eq!(
            run("<|cha|message|>x<|end|><|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>"),
            vec![text("<|cha|message|>x"), call("f", "{}")]
        );
    }

    #[test]
    fn plain_text_and_bad_arguments() {
        assert_eq!(run("Just text < here"), vec![text("Just text < here")]);
        assert_eq!(
            run("<|channel|>commentary to=functions.f<|message|>{broken<|call|>"),
            vec![text("{broken")]
        );
        // Calls not parsed (tool_choice none): the call body is text.
        let mut p = HarmonyParser::new(false);
        let mut out = Vec::new();
        p.push(
            "<|channel|>commentary to=functions.f<|message|>{}<|call|>",
            &mut out,
        );
        p.finish(&mut out);
        assert_eq!(out, vec![text("{}")]);
    }

    #[test]
    fn unterminated_final_is_flushed() {
        assert_eq!(
            run("<|channel|>final<|message|>Partial ans<|"),
            vec![text("Partial ans<|")]
        );
    }
}
