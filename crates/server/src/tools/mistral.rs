//! Mistral tool calls: `[TOOL_CALLS]` followed by either a JSON array of
//! `{"name", "arguments"}` objects (v3 tokenizers) or, in newer templates,
//! `name[ARGS]{json}` (optionally `name[CALL_ID]id[ARGS]{json}`), repeated.

use serde_json::Value;

use super::{
    arguments_text, call_from_json, json_end, push_text, safe_len, Piece, ToolCall, ToolParser,
};

const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";
/// A function name this long or longer is not a call.
const MAX_NAME: usize = 256;

enum State {
    Text,
    /// After `[TOOL_CALLS]`: the calls so far.
    Calls,
}

/// Streaming parser for Mistral tool calls.
pub struct MistralParser {
    state: State,
    buf: String,
    /// The whitespace trimmed before the last `[TOOL_CALLS]`: given back as text
    /// when what follows is not a call.
    trimmed: String,
    /// Just after a call: leading whitespace is dropped, however it arrives.
    after_call: bool,
}

impl MistralParser {
    /// A parser for one response.
    pub fn new() -> Self {
        MistralParser {
            state: State::Text,
            buf: String::new(),
            trimmed: String::new(),
            after_call: false,
        }
    }

    /// Tries to take one call group off the front of `buf` (after `[TOOL_CALLS]`).
    /// `Ok(None)`: need more text; `Err(())`: not a call.
    fn take_calls(&mut self, at_end: bool) -> Result<Option<Vec<ToolCall>>, ()> {
        let t = self.buf.trim_start();
        let skipped = self.buf.len() - t.len();
        if t.is_empty() {
            return if at_end { Err(()) } else { Ok(None) };
        }
        if t.starts_with('[') || t.starts_with('{') {
            let Some(end) = json_end(t) else {
                return if at_end { Err(()) } else { Ok(None) };
            };
            let v: Value = serde_json::from_str(&t[..end]).map_err(|_| ())?;
            let items = match v {
                Value::Array(a) => a,
                o => vec![o],
            };
            let calls: Option<Vec<ToolCall>> = items.iter().map(call_from_json).collect();
            let calls = calls.filter(|c| !c.is_empty()).ok_or(())?;
            self.buf.drain(..skipped + end);
            return Ok(Some(calls));
        }
        // name[ARGS]{…} or name[CALL_ID]id[ARGS]{…}
        let Some(a) = t.find(ARGS) else {
            // Judged as the whole name is below (trailing whitespace is trimmed
            // there; the text may end in the start of `[ARGS]` or `[CALL_ID]`), so
            // that a name decides the same however the output arrives.
            let mut name_part = t.split(CALL_ID).next().unwrap_or(t);
            let partial = [ARGS, CALL_ID]
                .iter()
                .flat_map(|m| (1..m.len()).filter(|&k| name_part.ends_with(&m[..k])))
                .max()
                .unwrap_or(0);
            name_part = name_part[..name_part.len() - partial].trim_end();
            let plausible = !name_part.contains(char::is_whitespace) && name_part.len() < MAX_NAME;
            return if at_end || !plausible {
                Err(())
            } else {
                Ok(None)
            };
        };
        let head = &t[..a];
        let name = head.split(CALL_ID).next().unwrap_or(head).trim();
        if name.is_empty() || name.contains(char::is_whitespace) || name.len() >= MAX_NAME {
            return Err(());
        }
        let rest = &t[a + ARGS.len()..];
        let Some(end) = json_end(rest) else {
            return if at_end { Err(()) } else { Ok(None) };
        };
        let args: Value = serde_json::from_str(&rest[..end]).map_err(|_| ())?;
        let call = ToolCall {
            name: name.to_string(),
            arguments: arguments_text(args).ok_or(())?,
        };
        let consumed = skipped + a + ARGS.len() + end;
        self.buf.drain(..consumed);
        Ok(Some(vec![call]))
    }
}

impl MistralParser {
    /// At the end of an output cut off inside a `[{…}, {…}, …` array (the token
    /// limit): the calls whose objects are complete, and the unfinished rest as
    /// text. `None` when not even the first object is complete.
    fn take_array_prefix(&self) -> Option<(Vec<ToolCall>, String)> {
        let mut rest = self.buf.trim_start().strip_prefix('[')?;
        let mut calls = Vec::new();
        loop {
            let t = rest.trim_start();
            let Some(end) = t.starts_with('{').then(|| json_end(t)).flatten() else {
                break;
            };
            let v: Value = serde_json::from_str(&t[..end]).ok()?;
            calls.push(call_from_json(&v)?);
            rest = t[end..].trim_start();
            match rest.strip_prefix(',') {
                Some(r) => rest = r,
                None => break,
            }
        }
        (!calls.is_empty()).then(|| (calls, rest.to_string()))
    }
}

impl Default for MistralParser {
    fn default() -> Self {
        Self::new()
    }
}

impl ToolParser for MistralParser {
    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.buf.push_str(text);
        loop {
            match self.state {
                State::Text if self.after_call => {
                    let t = self.buf.trim_start();
                    if t.is_empty() {
                        self.buf.clear();
                        return;
                    }
                    self.buf = t.to_string();
                    self.after_call = false;
                }
                State::Text => match self.buf.find(TOOL_CALLS) {
                    Some(p) => {
                        let before: String = self.buf.drain(..p).collect();
                        let kept = before.trim_end();
                        push_text(out, kept);
                        self.trimmed = before[kept.len()..].to_string();
                        self.buf.drain(..TOOL_CALLS.len());
                        self.state = State::Calls;
                    }
                    None => {
                        // Trailing whitespace waits: it is trimmed if `[TOOL_CALLS]`
                        // follows, as when the output arrives whole.
                        let n = safe_len(&self.buf, &[TOOL_CALLS]);
                        let n = self.buf[..n].trim_end().len();
                        let t: String = self.buf.drain(..n).collect();
                        push_text(out, &t);
                        return;
                    }
                },
                State::Calls => match self.take_calls(false) {
                    Ok(Some(calls)) => {
                        out.extend(calls.into_iter().map(Piece::Call));
                        // Newer templates repeat `[TOOL_CALLS]` before each call;
                        // the text state finds it again.
                        self.after_call = true;
                        self.state = State::Text;
                    }
                    Ok(None) => return,
                    Err(()) => {
                        // Only the marker is text: what follows is scanned again (a
                        // later `[TOOL_CALLS]` may start a call), as it would be had
                        // it not arrived yet.
                        let t = format!("{}{TOOL_CALLS}", std::mem::take(&mut self.trimmed));
                        push_text(out, &t);
                        self.state = State::Text;
                    }
                },
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        match self.state {
            State::Text => push_text(out, &std::mem::take(&mut self.buf)),
            State::Calls => match self.take_calls(true) {
                Ok(Some(calls)) => {
                    out.extend(calls.into_iter().map(Piece::Call));
                    push_text(out, self.buf.trim());
                }
                _ => match self.take_array_prefix() {
                    Some((calls, rest)) => {
                        out.extend(calls.into_iter().map(Piece::Call));
                        push_text(out, rest.trim());
                    }
                    None => {
                        let t = format!(
                            "{}{TOOL_CALLS}{}",
                            std::mem::take(&mut self.trimmed),
                            std::mem::take(&mut self.buf)
                        );
                        push_text(out, &t);
                    }
                },
            },
        }
        self.buf.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{call, parse_all_splits, text};
    use super::*;

    fn run(t: &str) -> Vec<Piece> {
        parse_all_splits(&|| Box::new(MistralParser::new()), t)
    }

    /// An output cut off by the token limit inside the array keeps its complete calls.
    #[test]
    fn cut_off_array_keeps_complete_calls() {
        let out = run(
            "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"argu",
        );
        assert_eq!(
            out,
            vec![call("a", "{\"x\":1}"), text("{\"name\": \"b\", \"argu")]
        );
        // Nothing complete: all of it is text, as before.
        let t = "[TOOL_CALLS][{\"name\": \"a\"";
        assert_eq!(run(t), vec![text(t)]);
    }

    #[test]
    fn json_array_calls() {
        assert_eq!(
            run("[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}, \"id\": \"abc123xyz\"}]"),
            vec![call("a", r#"{"x":1}"#), call("b", "{}")]
        );
    }

    #[test]
    fn args_form_calls() {
        assert_eq!(
            run("Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]other[CALL_ID]k1[ARGS]{}"),
            vec![
                text("Checking."),
                call("get_weather", r#"{"city":"Paris"}"#),
                call("other", "{}")
            ]
        );
    }

    #[test]
    fn malformed_is_text() {
        let t = "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": ";
        assert_eq!(run(t), vec![text(t)]);
        let t = "[TOOL_CALLS] this is not a call";
        assert_eq!(run(t), vec![text(t)]);
        let t = "a [TOOL_CALL b";
        assert_eq!(run(t), vec![text(t)]);
    }

    /// Found by libFuzzer (fuzz target `tool_parsers`), each whole vs in pieces:
    /// the whitespace before a `[TOOL_CALLS]` that starts no call was dropped
    /// whole but kept in pieces (kept now); everything after such a marker was
    /// text whole but a later call was a call in pieces (a call now); whitespace
    /// after a call was dropped whole but kept in pieces (dropped now); a name of
    /// 256 bytes or more was a call whole but not in pieces (not a call now), and
    /// so was a name followed by whitespace before `[ARGS]` (a call now).
    #[test]
    fn whitespace_before_a_failed_marker_stays_however_it_arrives() {
        let t = "ok \u{b}[TOOL_CALLS]get_w&ather[A x";
        assert_eq!(run(t), vec![text(t)]);
        // And a call after a marker that starts none is still a call.
        assert_eq!(
            run("a [TOOL_CALLS]f[ARGS]{\u{7f}} b [TOOL_CALLS]g[ARGS]{} c"),
            vec![
                text("a [TOOL_CALLS]f[ARGS]{\u{7f}} b"),
                call("g", "{}"),
                text("c")
            ]
        );
        // Whitespace between the name and `[ARGS]` is trimmed, whole or in pieces.
        assert_eq!(run("[TOOL_CALLS]f \n[ARGS]{}"), vec![call("f", "{}")]);
        // A name too long is no call, whole or in pieces.
        let t = format!("[TOOL_CALLS]{}[ARGS]{{}}", "n".repeat(300));
        assert_eq!(run(&t), vec![text(&t)]);
        assert_eq!(
            run("Checking. \n[TOOL_CALLS]f[ARGS]{}"),
            vec![text("Checking."), call("f", "{}")]
        );
    }
}
