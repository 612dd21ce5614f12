//! The chat formats llama.cpp renders through a dedicated handler
//! (`common/chat.cpp` and `common/parsers/*.cpp`) instead of its generic path:
//! they reshape OpenAI messages into the fields their template reads, write a
//! continued assistant turn themselves, and fix up the generation prompt.
//! Without this, multi-turn reasoning is dropped from the prompt (GPT-OSS
//! reads `thinking`, Ministral 3 `thinking` blocks) and a Gemma 4 turn after a
//! tool result gets no generation prompt at all.

use serde_json::{json, Value as Json};

/// Which llama.cpp handler a template gets, detected from its source by the
/// same tests and in the same order as `common_chat_templates_apply_jinja`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Handler {
    /// llama.cpp's generic path (template analysis).
    Generic,
    /// Ministral 3 / Magistral: `[SYSTEM_PROMPT]`, `[TOOL_CALLS]`…`[ARGS]`,
    /// no `[CALL_ID]` (Mistral Small 3.2 has one and stays generic).
    Ministral3,
    /// GPT-OSS (harmony): `<|channel|>`.
    GptOss,
    /// Gemma 4: `<|tool_call>call:`.
    Gemma4,
}

/// A trailing assistant message to continue (llama.cpp's `continue_msg`).
pub(crate) struct Continued<'a> {
    /// Its `reasoning_content` ("" when none).
    pub reasoning: &'a str,
    /// Its content as text (typed parts joined).
    pub content: String,
}

impl Continued<'_> {
    /// llama.cpp's `COMMON_CHAT_CONTINUATION_AUTO` resolved: a message with
    /// reasoning and no content continues its reasoning, else its content.
    pub fn content_mode(&self) -> bool {
        self.reasoning.is_empty() || !self.content.is_empty()
    }
}

impl Handler {
    pub fn detect(src: &str) -> Self {
        if src.contains("[SYSTEM_PROMPT]")
            && src.contains("[TOOL_CALLS]")
            && src.contains("[ARGS]")
            && !src.contains("[CALL_ID]")
        {
            Handler::Ministral3
        } else if src.contains("<|channel|>") {
            Handler::GptOss
        } else if src.contains("'<|tool_call>call:'") {
            Handler::Gemma4
        } else {
            Handler::Generic
        }
    }

    /// The messages as this handler hands them to the template (after
    /// llama.cpp's generic normalization).
    pub fn adjust(self, msgs: &mut [Json]) {
        match self {
            Handler::GptOss => {
                // The template reads an assistant turn's reasoning from
                // `thinking`; with tool calls it refuses both at once.
                for m in msgs {
                    let Some(r) = m.get("reasoning_content").and_then(Json::as_str) else {
                        continue;
                    };
                    m["thinking"] = json!(r);
                    if m["tool_calls"].as_array().is_some_and(|c| !c.is_empty()) {
                        if let Some(o) = m.as_object_mut() {
                            o.remove("content");
                        }
                    }
                }
            }
            Handler::Ministral3 => {
                // System and assistant content as typed blocks, reasoning first
                // as a `thinking` block.
                for m in msgs {
                    if m["role"] != "system" && m["role"] != "assistant" {
                        continue;
                    }
                    let Some(o) = m.as_object_mut() else {
                        continue;
                    };
                    let mut blocks = Vec::new();
                    if let Some(Json::String(r)) = o.remove("reasoning_content") {
                        blocks.push(json!({"type": "thinking", "thinking": r}));
                    }
                    match o.get("content") {
                        Some(Json::String(s)) => blocks.push(json!({"type": "text", "text": s})),
                        Some(Json::Array(parts)) => blocks.extend(parts.iter().cloned()),
                        _ => {}
                    }
                    o.insert("content".into(), Json::Array(blocks));
                }
            }
            Handler::Gemma4 | Handler::Generic => {}
        }
    }

    /// The end of a prompt rendered without a continued message.
    pub fn finish(self, prompt: &mut String, add_generation_prompt: bool) {
        match self {
            // After a turn with content and tool calls the template closes the
            // turn and adds no generation prompt of its own.
            Handler::Gemma4 if add_generation_prompt && prompt.ends_with(GEMMA4_TURN_END) => {
                prompt.push_str(GEMMA4_MODEL_TURN);
            }
            // A finished conversation's last answer ends in `<|return|>`, which
            // the model never sees in inference (llama.cpp issue 15417).
            Handler::GptOss if !add_generation_prompt => {
                if let Some(i) = prompt.rfind("<|return|>") {
                    prompt.replace_range(i..i + "<|return|>".len(), "<|end|>");
                }
            }
            _ => {}
        }
    }

    /// The continued turn this handler writes after `prompt` (the earlier
    /// messages rendered without a generation prompt), or `None` for the
    /// generic continuation.
    pub fn continuation(self, prompt: &str, last: &Continued) -> Option<String> {
        let (open, close, mut text) = match self {
            Handler::Generic => return None,
            Handler::Ministral3 => ("[THINK]", "[/THINK]", String::new()),
            Handler::GptOss => (
                "<|start|>assistant<|channel|>analysis<|message|>",
                "<|end|><|start|>assistant<|channel|>final<|message|>",
                String::new(),
            ),
            Handler::Gemma4 => {
                let turn = if prompt.ends_with(GEMMA4_TURN_END) {
                    GEMMA4_MODEL_TURN
                } else {
                    ""
                };
                ("<|channel>thought\n", "<channel|>", turn.to_string())
            }
        };
        text.push_str(open);
        text.push_str(last.reasoning);
        if last.content_mode() {
            text.push_str(close);
            text.push_str(&last.content);
        }
        Some(text)
    }
}

const GEMMA4_TURN_END: &str = "<turn|>\n";
const GEMMA4_MODEL_TURN: &str = "<|turn>model\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_like_llama_cpp() {
        assert_eq!(
            Handler::detect("[SYSTEM_PROMPT] [TOOL_CALLS] [ARGS]"),
            Handler::Ministral3
        );
        // Mistral Small 3.2 carries call ids: generic.
        assert_eq!(
            Handler::detect("[SYSTEM_PROMPT] [TOOL_CALLS] [ARGS] [CALL_ID]"),
            Handler::Generic
        );
        assert_eq!(Handler::detect("<|start|><|channel|>"), Handler::GptOss);
        assert_eq!(
            Handler::detect("{{- '<|tool_call>call:' + name }}"),
            Handler::Gemma4
        );
        assert_eq!(Handler::detect("<|im_start|>"), Handler::Generic);
    }

    #[test]
    fn gpt_oss_moves_reasoning_to_thinking() {
        let mut m = vec![
            json!({"role": "assistant", "content": "7", "reasoning_content": "r"}),
            json!({"role": "assistant", "content": "", "reasoning_content": "s",
                   "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}),
        ];
        Handler::GptOss.adjust(&mut m);
        assert_eq!(m[0]["thinking"], "r");
        assert_eq!(m[0]["content"], "7");
        assert_eq!(m[1]["thinking"], "s");
        assert!(m[1].get("content").is_none());
    }

    #[test]
    fn ministral3_writes_blocks() {
        let mut m = vec![
            json!({"role": "assistant", "content": "7", "reasoning_content": "r"}),
            json!({"role": "user", "content": "u"}),
        ];
        Handler::Ministral3.adjust(&mut m);
        assert_eq!(
            m[0]["content"],
            json!([{"type": "thinking", "thinking": "r"}, {"type": "text", "text": "7"}])
        );
        assert!(m[0].get("reasoning_content").is_none());
        assert_eq!(m[1]["content"], "u");
    }

    #[test]
    fn continuations() {
        let last = Continued {
            reasoning: "r",
            content: String::new(),
        };
        assert_eq!(
            Handler::Gemma4.continuation("x<turn|>\n", &last).unwrap(),
            "<|turn>model\n<|channel>thought\nr"
        );
        let last = Continued {
            reasoning: "",
            content: "c".into(),
        };
        assert_eq!(
            Handler::Ministral3.continuation("", &last).unwrap(),
            "[THINK][/THINK]c"
        );
        assert!(Handler::Generic.continuation("", &last).is_none());
    }

    #[test]
    fn gemma4_turn_after_tool_results() {
        let mut p = "<tool_response|>ok<turn|>\n".to_string();
        Handler::Gemma4.finish(&mut p, true);
        assert!(p.ends_with("<turn|>\n<|turn>model\n"));
        let mut q = "a<|return|>".to_string();
        Handler::GptOss.finish(&mut q, false);
        assert_eq!(q, "a<|end|>");
    }
}
