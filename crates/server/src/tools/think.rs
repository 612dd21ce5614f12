//! Reasoning between `<think>` and `</think>` (Qwen3, Qwen3.5, DeepSeek-R1
//! style), split off before tool-call parsing: [`ThinkParser`] wraps the
//! response's tool-call parser and feeds it only the answer, so a
//! `<tool_call>` written while thinking stays reasoning text and a call after
//! `</think>` still parses. Partial tags are held back, never streamed.
//!
//! The reasoning is trimmed like llama.cpp's and vLLM's `reasoning_content`:
//! no whitespace right after `<think>` or before `</think>`, and the answer
//! starts after the whitespace that follows `</think>`.

use super::{push_reasoning, safe_len, Piece, ToolParser};

/// Opens reasoning.
pub const OPEN: &str = "<think>";
/// Closes reasoning.
pub const CLOSE: &str = "</think>";

/// Whether a chat template teaches `<think>…</think>` reasoning.
pub fn detect(template: &str) -> bool {
    template.contains(OPEN) && template.contains(CLOSE)
}

/// Where a prompt leaves the output with respect to reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptEnd {
    /// Outside reasoning: the output may open `<think>` itself (Qwen3).
    Outside,
    /// Right after an open `<think>` (Qwen3.5's generation prompt with
    /// thinking on): the output starts as reasoning.
    Opened,
    /// Inside reasoning the prompt already began (a prefilled assistant
    /// turn's reasoning): the output continues it as is.
    Continued,
}

/// Where `prompt` leaves the output: inside an open `<think>` when the text
/// after its last `<think>` holds no `</think>` and no turn markup (a
/// `<think>` quoted in an earlier message is followed by turn markup).
pub fn prompt_end(prompt: &str) -> PromptEnd {
    const TURN_MARKUP: [&str; 4] = [
        "<|im_start|>",
        "<|im_end|>",
        "<｜User｜>",
        "<｜Assistant｜>",
    ];
    let Some(i) = prompt.rfind(OPEN) else {
        return PromptEnd::Outside;
    };
    let tail = &prompt[i + OPEN.len()..];
    if tail.contains(CLOSE) || TURN_MARKUP.iter().any(|m| tail.contains(m)) {
        PromptEnd::Outside
    } else if tail.trim().is_empty() {
        PromptEnd::Opened
    } else {
        PromptEnd::Continued
    }
}

/// Closes the open `<think>` a prompt ends with, the way Qwen3 templates
/// write an empty (thinking-off) block: `<think>\n` becomes
/// `<think>\n\n</think>\n\n`.
pub fn close_reasoning(prompt: &mut String) {
    prompt.push('\n');
    prompt.push_str(CLOSE);
    prompt.push_str("\n\n");
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: the output may open with `<think>`.
    Start,
    /// Inside `<think>`.
    Reasoning,
    /// Just after `</think>`: whitespace before the answer is dropped.
    Closed,
    /// The answer: everything goes to the tool-call parser.
    Answer,
}

/// Splits `<think>…</think>` reasoning off the output and passes the answer
/// to a tool-call parser.
pub struct ThinkParser {
    inner: Box<dyn ToolParser>,
    state: State,
    buf: String,
    /// Whether any reasoning text was emitted (before that, leading
    /// whitespace and a repeated `<think>` are dropped).
    reasoned: bool,
}

impl ThinkParser {
    /// Wraps `inner`, for output that follows a prompt ending at `end`
    /// ([`prompt_end`]).
    pub fn new(inner: Box<dyn ToolParser>, end: PromptEnd) -> Self {
        ThinkParser {
            inner,
            state: match end {
                PromptEnd::Outside => State::Start,
                PromptEnd::Opened | PromptEnd::Continued => State::Reasoning,
            },
            buf: String::new(),
            // Continued reasoning keeps its whitespace from the first token.
            reasoned: end == PromptEnd::Continued,
        }
    }

    fn emit_reasoning(&mut self, text: &str, out: &mut Vec<Piece>) {
        if !text.is_empty() {
            self.reasoned = true;
            push_reasoning(out, text);
        }
    }
}

fn ws_prefix(s: &str) -> usize {
    s.len() - s.trim_start().len()
}

impl ToolParser for ThinkParser {
    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.buf.push_str(text);
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if t.starts_with(OPEN) {
                        let n = self.buf.len() - t.len() + OPEN.len();
                        self.buf.drain(..n);
                        self.state = State::Reasoning;
                    } else if t.is_empty() || OPEN.starts_with(t) {
                        return;
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Reasoning => {
                    if !self.reasoned {
                        let n = ws_prefix(&self.buf);
                        self.buf.drain(..n);
                        // A model that repeats the prompt's `<think>`.
                        if self.buf.starts_with(OPEN) {
                            self.buf.drain(..OPEN.len());
                            continue;
                        }
                        if self.buf.is_empty() || OPEN.starts_with(self.buf.as_str()) {
                            return;
                        }
                    }
                    if let Some(p) = self.buf.find(CLOSE) {
                        let r = self.buf[..p].trim_end().to_string();
                        self.emit_reasoning(&r, out);
                        self.buf.drain(..p + CLOSE.len());
                        self.state = State::Closed;
                        continue;
                    }
                    // Hold a possible partial `</think>` and trailing whitespace
                    // (dropped if `</think>` follows).
                    let n = safe_len(&self.buf, &[CLOSE]);
                    let n = self.buf[..n].trim_end().len();
                    let r: String = self.buf.drain(..n).collect();
                    self.emit_reasoning(&r, out);
                    return;
                }
                State::Closed => {
                    let n = ws_prefix(&self.buf);
                    self.buf.drain(..n);
                    if self.buf.is_empty() {
                        return;
                    }
                    self.state = State::Answer;
                }
                State::Answer => {
                    let t = std::mem::take(&mut self.buf);
                    if !t.is_empty() {
                        self.inner.push(&t, out);
                    }
                    return;
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        let buf = std::mem::take(&mut self.buf);
        match self.state {
            // Whitespace or a lone partial `<think>`: that was the answer.
            State::Start | State::Answer => {
                if !buf.is_empty() {
                    self.inner.push(&buf, out);
                }
            }
            // Cut off while thinking: what was held is reasoning too.
            State::Reasoning => {
                let r = buf.trim_end();
                // Before any reasoning, a lone (partial) `<think>` is markup.
                if self.reasoned || !OPEN.starts_with(r.trim_start()) {
                    let r = if self.reasoned { r } else { r.trim_start() };
                    self.emit_reasoning(r, out);
                }
            }
            State::Closed => {}
        }
        self.inner.finish(out);
    }

    fn in_reasoning(&self) -> bool {
        self.state == State::Reasoning
    }

    fn stream_calls(&mut self) -> bool {
        self.inner.stream_calls()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{call, parse_all_splits, parse_all_splits_streaming, text};
    use super::super::{PlainParser, QwenParser};
    use super::*;
    use serde_json::json;

    fn plain(end: PromptEnd) -> impl Fn() -> Box<dyn ToolParser> {
        move || Box::new(ThinkParser::new(Box::new(PlainParser), end))
    }

    fn reasoning(t: &str) -> Piece {
        Piece::Reasoning(t.into())
    }

    #[test]
    fn splits_reasoning_from_the_answer() {
        assert_eq!(
            parse_all_splits(
                &plain(PromptEnd::Outside),
                "<think>\nThe user greets me.\n\nBe brief.\n</think>\n\nHello!"
            ),
            vec![
                reasoning("The user greets me.\n\nBe brief."),
                text("Hello!")
            ]
        );
        // No `<think>`: all answer, leading whitespace kept.
        assert_eq!(
            parse_all_splits(&plain(PromptEnd::Outside), "\nHi <think>there</think>"),
            vec![text("\nHi <think>there</think>")]
        );
        // Empty reasoning block.
        assert_eq!(
            parse_all_splits(&plain(PromptEnd::Outside), "<think>\n\n</think>\n\nOK"),
            vec![text("OK")]
        );
        // A lone partial tag at the end is answer text.
        assert_eq!(
            parse_all_splits(&plain(PromptEnd::Outside), " <thi"),
            vec![text(" <thi")]
        );
    }

    #[test]
    fn prompt_opened_reasoning() {
        // Qwen3.5: the prompt ends with `<think>\n`.
        assert_eq!(
            parse_all_splits(&plain(PromptEnd::Opened), "Think a bit.\n</think>\n\nDone."),
            vec![reasoning("Think a bit."), text("Done.")]
        );
        // A repeated `<think>` is dropped.
        assert_eq!(
            parse_all_splits(&plain(PromptEnd::Opened), "\n<think>\nHm.</think>Done."),
            vec![reasoning("Hm."), text("Done.")]
        );
        // Continuing a prefilled reasoning keeps the first token's space.
        assert_eq!(
            parse_all_splits(&plain(PromptEnd::Continued), " more.</think>OK"),
            vec![reasoning(" more."), text("OK")]
        );
        // Cut off while thinking (length limit): reasoning only, no answer.
        assert_eq!(
            parse_all_splits(&plain(PromptEnd::Opened), "Step 1, step 2 </thi"),
            vec![reasoning("Step 1, step 2 </thi")]
        );
    }

    #[test]
    fn split_tags_are_held_back_while_streaming() {
        let mut p = ThinkParser::new(Box::new(PlainParser), PromptEnd::Outside);
        let mut out = Vec::new();
        p.push("<thi", &mut out);
        assert!(out.is_empty(), "partial <think> leaked: {out:?}");
        assert!(!p.in_reasoning());
        p.push("nk>\nabc \n</th", &mut out);
        assert_eq!(out, vec![reasoning("abc")], "partial </think> leaked");
        // The token that completes `</think>` is still a reasoning token.
        assert!(p.in_reasoning());
        p.push("ink>\n\n", &mut out);
        assert_eq!(out, vec![reasoning("abc")]);
        assert!(!p.in_reasoning());
        p.push("Answer", &mut out);
        p.finish(&mut out);
        assert_eq!(out, vec![reasoning("abc"), text("Answer")]);
    }

    #[test]
    fn composes_with_tool_calls() {
        let tools = vec![json!({"type": "function", "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})];
        let make = || -> Box<dyn ToolParser> {
            Box::new(ThinkParser::new(
                Box::new(QwenParser::new(&tools)),
                PromptEnd::Outside,
            ))
        };
        // A call written while thinking is reasoning; the one after `</think>` parses.
        let out = parse_all_splits(
            &make,
            "<think>\nMaybe <tool_call>{\"name\": \"x\"}</tool_call>?\n</think>\n\n\
             <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
        );
        assert_eq!(
            out,
            vec![
                reasoning("Maybe <tool_call>{\"name\": \"x\"}</tool_call>?"),
                call("get_weather", "{\"city\":\"Oslo\"}")
            ]
        );
        // Qwen3.5 XML calls after prompt-opened reasoning.
        let make = || -> Box<dyn ToolParser> {
            Box::new(ThinkParser::new(
                Box::new(QwenParser::new(&tools)),
                PromptEnd::Opened,
            ))
        };
        let out = parse_all_splits(
            &make,
            "Need weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n\
             <parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>",
        );
        assert_eq!(
            out,
            vec![
                reasoning("Need weather."),
                call("get_weather", "{\"city\":\"Oslo\"}")
            ]
        );
    }

    #[test]
    fn streams_calls_after_reasoning_only() {
        let tools = vec![json!({"type": "function", "function": {"name": "get_weather"}})];
        let make = || -> Box<dyn ToolParser> {
            Box::new(ThinkParser::new(
                Box::new(QwenParser::new(&tools)),
                PromptEnd::Outside,
            ))
        };
        let out = parse_all_splits_streaming(
            &make,
            "<think>\n<tool_call>{\"name\": \"x\", \"arguments\": {\"a\": 1}}</tool_call>\n</think>\n\n\
             <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
        );
        assert_eq!(
            out,
            vec![
                reasoning("<tool_call>{\"name\": \"x\", \"arguments\": {\"a\": 1}}</tool_call>"),
                Piece::CallStart("get_weather".into()),
                Piece::CallArgs("{\"city\":\"Oslo\"}".into()),
                call("get_weather", "{\"city\":\"Oslo\"}")
            ]
        );
    }

    #[test]
    fn prompt_ends_inside_think() {
        use PromptEnd::*;
        assert_eq!(prompt_end("<|im_start|>assistant\n<think>\n"), Opened);
        assert_eq!(
            prompt_end("<|im_start|>assistant\n<think>\nprefilled reasoning"),
            Continued
        );
        assert_eq!(
            prompt_end("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
            Outside
        );
        assert_eq!(
            prompt_end("<|im_start|>user\nwhat is <think>?<|im_end|>\n<|im_start|>assistant\n"),
            Outside
        );
        assert_eq!(prompt_end("<|im_start|>assistant\n"), Outside);
    }

    #[test]
    fn detects_think_templates() {
        assert!(detect("{{- '<think>\\n' }} ... '</think>'"));
        assert!(!detect("<|im_start|>assistant\n"));
    }
}
