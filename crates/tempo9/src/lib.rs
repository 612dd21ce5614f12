//! Tempo9 in-process: load a model and chat with it from your application —
//! no server, no port. The same engine as `tempo9 serve` (continuous batching,
//! the prefix cache shared by every request, the SSD tier for evicted prefix
//! pages) and the same chat pipeline (chat template, tool-call grammars and
//! parsers, reasoning split), so a request gets the answer the server gives.
//!
//! ```no_run
//! use serde_json::json;
//! use tempo9::{ChatOptions, Event, LoadOptions, Model};
//!
//! let model = Model::load("smollm2-135m-instruct-q4_1.gguf", &LoadOptions::default())?;
//! let messages = [json!({"role": "user", "content": "Say hi."})];
//! for event in model.chat(&messages, &[], &ChatOptions::greedy(32))? {
//!     match event {
//!         Event::Text(t) => print!("{t}"),
//!         Event::Done { usage, .. } => println!("\n{} cached prompt tokens", usage.cached_tokens),
//!         _ => {}
//!     }
//! }
//! # Ok::<(), tempo9::Error>(())
//! ```
//!
//! A [`Model`] is cheap to clone and shared by threads: requests from all of
//! them are batched together and share one prefix cache. Streams are consumed
//! blocking (they are [`Iterator`]s) or from any async runtime
//! ([`ChatStream::next_event`]); dropping a stream cancels its request.
//! Messages and tools are OpenAI chat-completion JSON ([`serde_json::Value`]),
//! as the server takes them.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod block_on;
pub mod chat;
pub mod complete;
mod error;
mod load;

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use tempo9_engine::{Request, StopConditions};
use tempo9_server::chat::{GenParams, Prompt};
use tempo9_server::{openai, AppState};

pub use chat::{ChatOptions, ChatStream, Event, ToolChoice};
pub use complete::{CompleteOptions, CompletionEvent, CompletionStream};
pub use error::{Error, ErrorKind, Result};
pub use load::LoadOptions;
pub use tempo9_engine::{EngineStats, SamplingParams, SsdConfig, Usage};
/// Which device a model runs on ([`LoadOptions::device`]).
pub use tempo9_ggml::DeviceChoice;
pub use tempo9_server::chat::{Collected, Stop};
pub use tempo9_server::tools::ToolCall;
pub use tempo9_tokenizer::TemplateOptions;

use crate::block_on::block_on;
use crate::chat::FAMILY;
use crate::error::ErrorKind as K;

/// A loaded model with its running engine. Clones share the engine; the engine
/// stops when the last clone and the last stream are dropped (or at
/// [`Model::shutdown`]).
#[derive(Clone)]
pub struct Model {
    state: Arc<AppState>,
    owner: Arc<EngineOwner>,
}

/// Held by every clone of a [`Model`] and by its streams: when the last one goes,
/// the engine is stopped and its thread has dropped its buffers before the drop
/// returns. Left to the engine thread alone, an application returning from `main`
/// right after tears the GPU runtime down under that thread (ggml-cuda aborted
/// freeing its compute buffers at exit on the H200).
pub(crate) struct EngineOwner(tempo9_engine::EngineHandle);

impl Drop for EngineOwner {
    fn drop(&mut self) {
        self.0.shutdown();
    }
}

impl Model {
    /// Loads a model — a GGUF file path, or the name of a model downloaded by
    /// Ollama (`qwen2.5-coder:0.5b`, found under `$OLLAMA_MODELS` or
    /// `~/.ollama/models`) — on the CPU, and starts its engine.
    pub fn load(source: &str, options: &LoadOptions) -> Result<Model> {
        let state = load::load(source, options)?;
        Ok(Model {
            owner: Arc::new(EngineOwner(state.engine.clone())),
            state,
        })
    }

    /// Starts a chat request: OpenAI-shaped `messages` (`role`, `content`,
    /// `tool_calls`, `tool_call_id`) and `tools` (`{"type": "function",
    /// "function": {"name", "description", "parameters"}}`). Renders and
    /// tokenizes the prompt on this thread, then returns while the engine works.
    pub fn chat(
        &self,
        messages: &[Value],
        tools: &[Value],
        options: &ChatOptions,
    ) -> Result<ChatStream> {
        let body = serde_json::json!({"messages": messages, "tools": tools});
        let messages = openai::check_messages(&body)?;
        // Malformed tool shapes are bad requests (the grammar compiler's refusals of
        // their schemas, later, are invalid schemas).
        let tools = openai::chat_tools(&body, FAMILY)
            .map_err(|e| Error::new(K::BadRequest, format!("tools: {}", e.message)))?;
        let grammar = match &options.response_format {
            None => None,
            Some(rf) => {
                openai::response_format(&serde_json::json!({"response_format": rf}), FAMILY)?
            }
        };
        let params = GenParams {
            max_tokens: options.max_tokens,
            sampling: options.sampling.clone(),
            stop: options.stop.clone(),
            logprobs: false,
            top_logprobs: 0,
            grammar,
            no_speculation: !options.speculation,
            prediction: None,
        };
        let prompt = Prompt::Chat {
            messages,
            tools,
            tool_choice: options.tool_choice.clone(),
            template: options.template.clone(),
        };
        let prepared =
            self.state
                .prepare_tools(FAMILY, prompt, params, options.parallel_tool_calls)?;
        let gen = block_on(self.state.start(FAMILY, prepared, Instant::now()))?;
        Ok(ChatStream::new(gen, self.owner.clone()))
    }

    /// [`Model::chat`] with JSON text, as the C and Python bindings pass it:
    /// `messages` a JSON array, `tools` a JSON array or empty, `options` the
    /// fields of an OpenAI chat completion request ([`ChatOptions::from_json`])
    /// or empty.
    pub fn chat_json(&self, messages: &str, tools: &str, options: &str) -> Result<ChatStream> {
        let parse = |what: &str, s: &str| -> Result<Value> {
            if s.trim().is_empty() {
                return Ok(Value::Null);
            }
            serde_json::from_str(s)
                .map_err(|e| Error::new(K::BadRequest, format!("{what}: invalid JSON: {e}")))
        };
        let messages = match parse("messages", messages)? {
            Value::Array(m) => m,
            _ => return Err(Error::new(K::BadRequest, "messages must be a JSON array")),
        };
        let tools = match parse("tools", tools)? {
            Value::Null => Vec::new(),
            Value::Array(t) => t,
            _ => return Err(Error::new(K::BadRequest, "tools must be a JSON array")),
        };
        let options = ChatOptions::from_json(&parse("options", options)?)?;
        self.chat(&messages, &tools, &options)
    }

    /// Starts a plain completion of `tokens` (no template, no parsing).
    pub fn complete(&self, tokens: &[u32], options: &CompleteOptions) -> Result<CompletionStream> {
        let tok = self.state.engine.tokenizer();
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= tok.vocab_size()) {
            return Err(Error::new(
                K::BadRequest,
                format!(
                    "token id {t} is outside the vocabulary ({} tokens)",
                    tok.vocab_size()
                ),
            ));
        }
        if tokens.is_empty() || options.max_tokens == 0 {
            return Err(Error::new(
                K::BadRequest,
                "a completion needs at least one prompt token and max_tokens >= 1",
            ));
        }
        let mut req = Request::new(tokens.to_vec(), options.max_tokens);
        req.sampling = options.sampling.clone();
        req.stop = StopConditions {
            eog: options.stop_at_eog,
            strings: options.stop.clone(),
            token_ids: Vec::new(),
        };
        req.speculation = options.speculation;
        let stream = self
            .state
            .engine
            .submit(req)
            .map_err(|e| Error::from(tempo9_server::chat::submit_error(FAMILY, e)))?;
        Ok(CompletionStream {
            stream,
            _owner: self.owner.clone(),
        })
    }

    /// Token ids of `text` (special-token text parsed; the tokenizer's BOS added
    /// when the model wants one).
    pub fn tokenize(&self, text: &str) -> Vec<u32> {
        self.state.engine.tokenizer().encode(text, true, true)
    }

    /// The text of token ids (special tokens skipped).
    pub fn detokenize(&self, tokens: &[u32]) -> String {
        self.state.engine.tokenizer().decode(tokens, true)
    }

    /// The engine's counters as of its last step: requests, KV pages (used,
    /// cached, free), prefix-cache hits, SSD tier.
    pub fn stats(&self) -> EngineStats {
        self.state.engine.stats()
    }

    /// Per-request context limit in tokens (prompt plus output).
    pub fn max_context(&self) -> usize {
        self.state.engine.max_context()
    }

    /// The model's architecture (`general.architecture`, e.g. `llama`).
    pub fn architecture(&self) -> &str {
        &self.state.info.arch
    }

    /// Stops the engine now: running requests end, the SSD tier flushes (and,
    /// with persistence, saves the prefix cache). Later requests fail with
    /// [`ErrorKind::Engine`]. Optional: dropping every clone stops it too.
    pub fn shutdown(&self) {
        self.state.engine.shutdown();
    }
}

/// Clones of a model are used from many threads.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<Model>();
    const fn sendable<T: Send>() {}
    sendable::<ChatStream>();
    sendable::<CompletionStream>();
};

/// Engine counters as the C and Python bindings report them (a JSON object;
/// the SSD tier's under `ssd`).
pub fn stats_json(s: &EngineStats) -> Value {
    serde_json::json!({
        "running": s.running,
        "waiting": s.waiting,
        "loading": s.loading,
        "kv_pages_total": s.kv_pages_total,
        "kv_pages_used": s.kv_pages_used,
        "kv_pages_cached": s.kv_pages_cached,
        "kv_pages_free": s.kv_pages_free,
        "page_tokens": s.page_tokens,
        "prefix_query_tokens": s.prefix_query_tokens,
        "prefix_hit_tokens": s.prefix_hit_tokens,
        "evicted_pages": s.evicted_pages,
        "prompt_tokens_total": s.prompt_tokens_total,
        "generated_tokens_total": s.generated_tokens_total,
        "preemptions_total": s.preemptions_total,
        "steps_total": s.steps_total,
        "ssd": {
            "pages": s.ssd.pages,
            "bytes": s.ssd.bytes,
            "budget_bytes": s.ssd.budget_bytes,
            "hit_tokens": s.ssd.hit_tokens,
            "write_pages": s.ssd.write_pages,
            "read_pages": s.ssd.read_pages,
        },
    })
}
