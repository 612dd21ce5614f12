//! Chat: options, the request's event stream (blocking and async), and the
//! JSON shapes the C and Python bindings exchange.
//!
//! Prompt rendering, tool-call grammars and output parsing are the server's
//! ([`tempo9_server::chat`]): a request here becomes the same engine request as
//! the same OpenAI chat completion sent to `tempo9 serve`.

use std::collections::VecDeque;
use std::sync::Arc;

use serde_json::{json, Value};
use tempo9_engine::SamplingParams;
use tempo9_server::chat::{Collected, GenEvent, Generation, Stop};
use tempo9_server::error::Family;
use tempo9_server::openai;
use tempo9_server::tools::ToolCall;
use tempo9_tokenizer::TemplateOptions;

use crate::block_on::block_on;
use crate::error::{Error, ErrorKind, Result};
use crate::EngineOwner;

pub use tempo9_server::chat::ToolChoice;

/// The OpenAI adapter's field parsers report errors in this family's shape; the
/// facade keeps only kind and message.
pub(crate) const FAMILY: Family = Family::OpenAi;

/// Options of one chat request. [`Default`] is what the server does for a
/// chat completion that sets nothing: llama-server's sampling defaults
/// (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), output up to the
/// context limit, tool choice `auto`, parallel tool calls.
#[derive(Debug, Clone)]
pub struct ChatOptions {
    /// Sampling; [`ChatOptions::greedy`] for argmax decoding.
    pub sampling: SamplingParams,
    /// Most tokens to generate (`None`: up to the context limit).
    pub max_tokens: Option<usize>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Whether and which tool the model must call.
    pub tool_choice: ToolChoice,
    /// Allow more than one tool call in an answer.
    pub parallel_tool_calls: bool,
    /// Constrain the answer: an OpenAI `response_format` object
    /// (`{"type": "json_object"}` or `{"type": "json_schema", "json_schema": {...}}`).
    pub response_format: Option<Value>,
    /// Template variables: thinking on/off, `chat_template_kwargs`.
    pub template: TemplateOptions,
    /// Allow speculative decoding when the model was loaded with it.
    pub speculation: bool,
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions {
            sampling: openai::sampling(&json!({}), FAMILY).unwrap_or_default(),
            max_tokens: None,
            stop: Vec::new(),
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: true,
            response_format: None,
            template: TemplateOptions::default(),
            speculation: true,
        }
    }
}

impl ChatOptions {
    /// Greedy decoding (temperature 0), at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> ChatOptions {
        ChatOptions {
            sampling: SamplingParams::default(),
            max_tokens: Some(max_tokens),
            ..ChatOptions::default()
        }
    }

    /// Options from the fields of an OpenAI chat completion request (what the
    /// C and Python bindings pass): `temperature`, `top_p`, `top_k`, `min_p`,
    /// penalties, `seed`, `max_tokens` / `max_completion_tokens`, `stop`,
    /// `tool_choice`, `parallel_tool_calls`, `response_format`,
    /// `chat_template_kwargs`, `reasoning_effort`, `speculation`; parsed by the
    /// server's own parsers, with its defaults. Other keys are ignored, as the
    /// server ignores them.
    ///
    /// ```
    /// use serde_json::json;
    /// let o = tempo9::ChatOptions::from_json(&json!({"temperature": 0, "max_tokens": 8}))?;
    /// assert!(o.sampling.is_greedy() && o.max_tokens == Some(8));
    /// // Unset fields take the server's defaults: sampling at temperature 0.8.
    /// let d = tempo9::ChatOptions::from_json(&json!({}))?;
    /// assert_eq!(d.sampling.temperature, 0.8);
    /// let bad = tempo9::ChatOptions::from_json(&json!({"temperature": "hot"}));
    /// assert_eq!(bad.unwrap_err().kind, tempo9::ErrorKind::BadRequest);
    /// # Ok::<(), tempo9::Error>(())
    /// ```
    pub fn from_json(v: &Value) -> Result<ChatOptions> {
        let v = match v {
            Value::Null => &json!({}),
            Value::Object(_) => v,
            _ => {
                return Err(Error::new(
                    ErrorKind::BadRequest,
                    "chat options must be a JSON object",
                ))
            }
        };
        let response_format = match v.get("response_format") {
            None | Some(Value::Null) => None,
            Some(rf) => Some(rf.clone()),
        };
        Ok(ChatOptions {
            sampling: openai::sampling(v, FAMILY)?,
            max_tokens: openai::uint(v, "max_completion_tokens", FAMILY)?.or(openai::uint(
                v,
                "max_tokens",
                FAMILY,
            )?),
            stop: openai::stop_strings(v, "stop", FAMILY)?,
            tool_choice: openai::tool_choice(v, FAMILY)?,
            parallel_tool_calls: openai::boolean(v, "parallel_tool_calls", FAMILY)?.unwrap_or(true),
            response_format,
            template: openai::template_options(v, FAMILY)?,
            speculation: openai::boolean(v, "speculation", FAMILY)? != Some(false),
        })
    }
}

/// One event of a chat answer, in order: text and reasoning deltas, complete
/// tool calls, and last [`Event::Done`].
pub type Event = GenEvent;

/// A chat request in progress. Iterate it (blocking) or await
/// [`ChatStream::next_event`]; dropping it cancels the request, and the engine
/// frees its KV pages at its next step.
pub struct ChatStream {
    gen: Generation,
    ready: VecDeque<Event>,
    /// Keeps the engine running while the stream lives (after this field's
    /// request is cancelled: fields drop in order).
    _owner: Arc<EngineOwner>,
}

impl ChatStream {
    pub(crate) fn new(gen: Generation, owner: Arc<EngineOwner>) -> ChatStream {
        ChatStream {
            gen,
            ready: VecDeque::new(),
            _owner: owner,
        }
    }

    /// Prompt tokens of this request.
    pub fn prompt_tokens(&self) -> usize {
        self.gen.prompt_tokens()
    }

    /// The next event, waiting for it without blocking the thread (any async
    /// runtime); `None` after [`Event::Done`].
    pub async fn next_event(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Some(e);
            }
            self.ready.extend(self.gen.next().await?);
        }
    }

    /// The whole answer, waiting asynchronously.
    pub async fn collect_async(mut self) -> Collected {
        let mut c = Collected::default();
        while let Some(e) = self.next_event().await {
            c.add(e);
        }
        c
    }

    /// The whole answer, blocking the thread.
    pub fn collect_blocking(self) -> Collected {
        block_on(self.collect_async())
    }
}

/// Blocks the thread for each event (not for use on an async runtime's threads:
/// use [`ChatStream::next_event`] there).
impl Iterator for ChatStream {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        block_on(self.next_event())
    }
}

/// A stop reason's stable name: `end_turn`, `stop_string`, `tool_calls`,
/// `length`, `cancelled`, `error`, `grammar_dead_end`.
pub fn stop_name(s: &Stop) -> &'static str {
    match s {
        Stop::EndTurn => "end_turn",
        Stop::StopString(_) => "stop_string",
        Stop::ToolCalls => "tool_calls",
        Stop::Length => "length",
        Stop::Cancelled => "cancelled",
        Stop::Error(_) => "error",
        Stop::GrammarDeadEnd(_) => "grammar_dead_end",
    }
}

fn call_json(index: usize, call: &ToolCall) -> Value {
    json!({"type": "tool_call", "index": index, "name": call.name, "arguments": call.arguments})
}

/// An event as the C and Python bindings pass it: `{"type": "text", "text"}`,
/// `{"type": "reasoning", "text"}`, `{"type": "tool_call", "index", "name",
/// "arguments"}` (arguments: JSON text), `{"type": "done", "stop", "detail",
/// "usage": {"prompt_tokens", "cached_tokens", "completion_tokens",
/// "reasoning_tokens"}}`. `None` for events those bindings do not carry
/// (log-probabilities and streamed tool-call pieces, never asked for by them).
pub fn event_json(e: &Event) -> Option<Value> {
    Some(match e {
        GenEvent::Text(t) => json!({"type": "text", "text": t}),
        GenEvent::Reasoning(t) => json!({"type": "reasoning", "text": t}),
        GenEvent::ToolCall { index, call, .. } => call_json(*index, call),
        // Calls come whole here: the SDK never asks for them streamed.
        GenEvent::ToolCallStart { .. } | GenEvent::ToolCallDelta { .. } => return None,
        GenEvent::Logprobs(_) => return None,
        GenEvent::Done {
            stop,
            usage,
            reasoning_tokens,
        } => {
            let detail = match stop {
                Stop::StopString(s) | Stop::Error(s) | Stop::GrammarDeadEnd(s) => json!(s),
                _ => Value::Null,
            };
            json!({"type": "done", "stop": stop_name(stop), "detail": detail, "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "cached_tokens": usage.cached_tokens,
                "completion_tokens": usage.completion_tokens,
                "reasoning_tokens": reasoning_tokens,
            }})
        }
    })
}

/// A whole answer as JSON: `{"text", "reasoning", "tool_calls": [{"name",
/// "arguments"}], "stop", "detail", "usage"}`.
pub fn collected_json(c: &Collected) -> Value {
    let done = event_json(&GenEvent::Done {
        stop: c.stop.clone(),
        usage: c.usage,
        reasoning_tokens: c.reasoning_tokens,
    })
    .unwrap_or_default();
    json!({
        "text": c.text,
        "reasoning": c.reasoning,
        "tool_calls": c.calls.iter().map(|k| json!({"name": k.name, "arguments": k.arguments})).collect::<Vec<_>>(),
        "stop": done["stop"],
        "detail": done["detail"],
        "usage": done["usage"],
    })
}
