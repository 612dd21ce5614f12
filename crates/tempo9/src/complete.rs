//! Plain completion on token ids: no template, no parsing, the engine's own
//! token events.

use serde_json::{json, Value};
use tempo9_engine::{Event as EngineEvent, RequestStream, SamplingParams};
use tempo9_server::openai;

use crate::block_on::block_on;
use crate::chat::FAMILY;
use crate::error::{Error, ErrorKind, Result};

pub use tempo9_engine::{Finish, FinishReason, TokenEvent};

/// Options of a completion. [`Default`]: greedy, 16 tokens, stop at the
/// model's end-of-generation tokens.
#[derive(Debug, Clone)]
pub struct CompleteOptions {
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    /// Sampling (default greedy).
    pub sampling: SamplingParams,
    /// Stop at the model's end-of-generation tokens (off: generate exactly
    /// `max_tokens`, as `tempo9 bench` does).
    pub stop_at_eog: bool,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Allow speculative decoding when the model was loaded with it.
    pub speculation: bool,
}

impl Default for CompleteOptions {
    fn default() -> Self {
        CompleteOptions {
            max_tokens: 16,
            sampling: SamplingParams::default(),
            stop_at_eog: true,
            stop: Vec::new(),
            speculation: true,
        }
    }
}

/// A completion's events: [`TokenEvent`]s, then one [`Finish`] (usage with
/// cached tokens). Iterate it (blocking) or await
/// [`CompletionStream::next_event`]; dropping it cancels the request.
pub struct CompletionStream {
    pub(crate) stream: RequestStream,
    /// Keeps the engine running while the stream lives (dropped after `stream`).
    pub(crate) _owner: std::sync::Arc<crate::EngineOwner>,
}

/// One event of a completion.
pub type CompletionEvent = EngineEvent;

impl CompletionStream {
    /// The next event without blocking the thread; `None` after the finish.
    pub async fn next_event(&mut self) -> Option<CompletionEvent> {
        self.stream.recv().await
    }
}

/// Blocks the thread for each event.
impl Iterator for CompletionStream {
    type Item = CompletionEvent;

    fn next(&mut self) -> Option<CompletionEvent> {
        block_on(self.stream.recv())
    }
}

impl CompleteOptions {
    /// Options from a JSON object (the C and Python bindings' shape):
    /// `max_tokens` (default 16), `stop_at_eog` (default true), `stop`, and the
    /// OpenAI sampling fields (`temperature`, `top_k`, `top_p`, `min_p`,
    /// penalties, `seed`) — greedy unless `temperature` is given.
    pub fn from_json(v: &Value) -> Result<CompleteOptions> {
        let bad = |m: &str| Error::new(ErrorKind::BadRequest, m);
        let mut o = CompleteOptions::default();
        if v.is_null() {
            return Ok(o);
        }
        if !v.is_object() {
            return Err(bad("completion options must be a JSON object"));
        }
        let mut fields = v.clone();
        if fields.get("temperature").is_none_or(Value::is_null) {
            fields["temperature"] = json!(0);
        }
        o.sampling = openai::sampling(&fields, FAMILY)?;
        o.stop = openai::stop_strings(v, "stop", FAMILY)?;
        if let Some(n) = openai::uint(v, "max_tokens", FAMILY)? {
            o.max_tokens = n;
        }
        if let Some(b) = openai::boolean(v, "stop_at_eog", FAMILY)? {
            o.stop_at_eog = b;
        }
        if let Some(b) = openai::boolean(v, "speculation", FAMILY)? {
            o.speculation = b;
        }
        Ok(o)
    }
}

/// A finish reason's stable name (as [`crate::chat::stop_name`]).
pub fn finish_name(r: &FinishReason) -> &'static str {
    match r {
        FinishReason::StopToken(_) | FinishReason::ConstraintDone => "end_turn",
        FinishReason::StopString(_) => "stop_string",
        FinishReason::Length | FinishReason::ContextFull => "length",
        FinishReason::Cancelled => "cancelled",
        FinishReason::Error(_) => "error",
        FinishReason::ConstraintDeadEnd(_) => "grammar_dead_end",
    }
}

/// A completion event as the C and Python bindings pass it: `{"type": "token",
/// "id", "text"}`, then `{"type": "done", "stop", "usage": {"prompt_tokens",
/// "cached_tokens", "completion_tokens"}}`.
pub fn event_json(e: &CompletionEvent) -> Value {
    match e {
        EngineEvent::Token(t) => json!({"type": "token", "id": t.id, "text": t.text}),
        EngineEvent::Finished(f) => {
            json!({"type": "done", "stop": finish_name(&f.reason), "usage": {
                "prompt_tokens": f.usage.prompt_tokens,
                "cached_tokens": f.usage.cached_tokens,
                "completion_tokens": f.usage.completion_tokens,
            }})
        }
    }
}
