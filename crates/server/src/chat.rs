//! The API-independent core of a generation request: prompt rendering and
//! tokenization, mapping parameters to an engine [`Request`], and turning the
//! engine's events into parsed output ([`GenEvent`]s) for the adapters.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use tempo9_engine::{
    Event, FinishReason, Request, RequestStream, SamplingParams, StopConditions, SubmitError, Usage,
};

use tokio::sync::OwnedSemaphorePermit;

use crate::error::{ApiError, ErrorKind, Family};
use crate::tools::{think, Piece, ThinkParser, ToolCall, ToolFormat, ToolParser};
use crate::AppState;

/// What the client asked about tool use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// No tool calls: tools are not shown to the model.
    None,
    /// The model must call some tool.
    Required,
    /// The model must call this function.
    Named(String),
}

/// Generation parameters common to every API.
#[derive(Debug, Clone, Default)]
pub struct GenParams {
    /// Most tokens to generate (`None`: up to the context limit / server cap).
    pub max_tokens: Option<usize>,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Report the chosen token's log-probability.
    pub logprobs: bool,
    /// Also report this many alternatives per token.
    pub top_logprobs: usize,
    /// Constrain the output to this grammar (JSON mode, JSON schema).
    pub grammar: Option<tempo9_grammar::Grammar>,
    /// The request opted out of speculative decoding (`"speculation": false`, a
    /// Tempo9 extension; Ollama: in `options`).
    pub no_speculation: bool,
    /// OpenAI's predicted output (`prediction.content`): text the answer is
    /// expected to largely repeat; with speculative decoding on, drafts come from it.
    pub prediction: Option<String>,
}

/// Where the prompt comes from.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// OpenAI-shaped messages and tools, rendered with the model's chat template.
    Chat {
        /// Messages (`role`, `content`, `tool_calls`, `tool_call_id`, …).
        messages: Vec<Value>,
        /// Tools (`{type: "function", function: {name, description, parameters}}`).
        tools: Vec<Value>,
        /// Tool-use policy.
        tool_choice: ToolChoice,
        /// Thinking on/off and other template variables of this request.
        template: TemplateOptions,
    },
    /// Raw text, tokenized as is (special-token text is parsed).
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
}

pub use tempo9_tokenizer::TemplateOptions;

/// A request ready to submit.
pub struct Prepared {
    /// Prompt token ids.
    pub tokens: Vec<u32>,
    /// Text already appended to the prompt that starts a forced tool call.
    pub forced_prefix: Option<String>,
    /// Whether tool calls are parsed out of the output.
    pub parse_calls: bool,
    /// The request's tools (for parameter types).
    pub tools: Vec<Value>,
    /// Parameters.
    pub params: GenParams,
    /// The most tokens that will be generated.
    pub max_tokens: usize,
    /// [`GenParams::prediction`] as plain-text tokens.
    pub prediction: Vec<u32>,
    /// The compiled grammar, when one was asked for (or built for tool calls).
    pub constraint: Option<tempo9_grammar::Constraint>,
    /// The tool-call syntax of this response (the model's, or Hermes when the
    /// model has none and a call is forced).
    pub format: ToolFormat,
    /// `Some(end)`: `<think>` reasoning is split off the output (a chat
    /// prompt, with a template that reasons in those tags), which follows a
    /// prompt ending `end` (inside reasoning or not).
    pub reasoning: Option<think::PromptEnd>,
    /// The prompt's images, over their placeholder tokens in `tokens`.
    pub images: Vec<tempo9_engine::PromptImage>,
}

/// A rendered, tokenized prompt.
struct Rendered {
    tokens: Vec<u32>,
    forced_prefix: Option<String>,
    parse_calls: bool,
    tools: Vec<Value>,
    format: ToolFormat,
    choice: ToolChoice,
    reasoning: Option<think::PromptEnd>,
    images: Vec<tempo9_engine::PromptImage>,
}

/// The system-prompt text that teaches Hermes-style tool calls to a model whose
/// chat template has no tool syntax (Qwen2.5's wording).
fn hermes_tool_prompt(tools: &[Value]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in tools {
        s.push('\n');
        s.push_str(&t.to_string());
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    s
}

/// Adds `text` to the system message (creating one first when there is none).
fn add_to_system(messages: &mut Vec<Value>, text: &str) {
    if let Some(m) = messages.first_mut() {
        if matches!(m["role"].as_str(), Some("system" | "developer")) {
            match &mut m["content"] {
                Value::String(s) => {
                    s.push_str("\n\n");
                    s.push_str(text);
                    return;
                }
                Value::Array(parts) => {
                    parts.push(json!({"type": "text", "text": format!("\n\n{text}")}));
                    return;
                }
                _ => {}
            }
        }
    }
    messages.insert(0, json!({"role": "system", "content": text}));
}

/// The grammar crate's description of a tool-call syntax, where it has one.
fn grammar_format(f: ToolFormat) -> Option<tempo9_grammar::ToolCallFormat> {
    match f {
        ToolFormat::Hermes => Some(tempo9_grammar::ToolCallFormat::hermes()),
        ToolFormat::Llama3 => Some(tempo9_grammar::ToolCallFormat::llama3_json()),
        ToolFormat::Mistral => Some(tempo9_grammar::ToolCallFormat::mistral()),
        ToolFormat::QwenXml => Some(tempo9_grammar::ToolCallFormat::qwen_xml()),
        ToolFormat::Harmony => Some(tempo9_grammar::ToolCallFormat::harmony()),
        ToolFormat::Gemma4 => Some(tempo9_grammar::ToolCallFormat::gemma4()),
        ToolFormat::None => None,
    }
}

/// The grammar over tool calls for this request: with `required` / a named
/// tool, the output is exactly the call(s) (one unless `parallel`); with
/// `auto`, free text until the model opens a call, then well-formed calls. The
/// name comes from the offered tools and the arguments follow that tool's
/// `parameters` schema (strictly when `function.strict` is true). `None` when
/// the syntax has no grammar (or, in auto mode, no opening markup to wait for).
/// `reasoning`: the output may reason in `<think>` tags first (`Some`, with
/// where the prompt leaves it), where opening markup does not start a call.
pub fn tool_call_grammar(
    tok: &tempo9_tokenizer::Tokenizer,
    format: ToolFormat,
    tools: &[Value],
    choice: &ToolChoice,
    parallel: bool,
    reasoning: Option<think::PromptEnd>,
) -> Result<Option<tempo9_grammar::Grammar>, tempo9_grammar::GrammarError> {
    use tempo9_grammar::ToolChoice as G;
    let Some(mut gformat) = grammar_format(format) else {
        return Ok(None);
    };
    gformat.reasoning = reasoning.map(|end| tempo9_grammar::ReasoningMarkup {
        open: think::OPEN.into(),
        close: think::CLOSE.into(),
        starts_inside: end != think::PromptEnd::Outside,
    });
    let gchoice = match choice {
        ToolChoice::None => return Ok(None),
        ToolChoice::Auto if gformat.begin.is_empty() && gformat.open.is_empty() => return Ok(None),
        // Auto mode is left to the parsers here for harmony and Gemma 4: their
        // free text (other channels, thinking) holds control tokens a text rule
        // cannot produce.
        ToolChoice::Auto if matches!(format, ToolFormat::Harmony | ToolFormat::Gemma4) => {
            return Ok(None)
        }
        ToolChoice::Auto => G::Auto,
        ToolChoice::Required => G::Required,
        ToolChoice::Named(n) => G::Named(n.clone()),
    };
    if tools.is_empty() {
        return Ok(None);
    }
    let specs = tools
        .iter()
        .map(|t| {
            let f = &t["function"];
            tempo9_grammar::ToolSpec {
                name: f["name"].as_str().unwrap_or_default().to_string(),
                parameters: f.get("parameters").filter(|p| !p.is_null()).cloned(),
                strict: f["strict"].as_bool().unwrap_or(false),
            }
        })
        .collect();
    tempo9_grammar::ToolCallGrammar {
        format: gformat,
        tools: specs,
        choice: gchoice,
        // Harmony's `<|call|>` ends the turn: one call per message.
        parallel: parallel && format != ToolFormat::Harmony,
    }
    .build(tok)
    .map(Some)
}

/// Lines clients put in system prompts that change on every request (billing
/// headers, request ids): removed so the prompt prefix stays cacheable.
pub fn strip_volatile(text: &str, prefixes: &[String]) -> String {
    if !prefixes
        .iter()
        .any(|p| text.to_ascii_lowercase().contains(&p.to_ascii_lowercase()))
    {
        return text.to_string();
    }
    let kept: Vec<&str> = text
        .split_inclusive('\n')
        .filter(|l| {
            let t = l.trim_start().to_ascii_lowercase();
            !prefixes
                .iter()
                .any(|p| t.starts_with(&p.to_ascii_lowercase()))
        })
        .collect();
    kept.concat()
}

/// Removes volatile lines from system messages; drops system messages left empty.
fn clean_system(messages: &mut Vec<Value>, prefixes: &[String]) {
    if prefixes.is_empty() {
        return;
    }
    messages.retain_mut(|m| {
        if !matches!(m["role"].as_str(), Some("system" | "developer")) {
            return true;
        }
        match &mut m["content"] {
            Value::String(s) => {
                *s = strip_volatile(s, prefixes);
                !s.trim().is_empty()
            }
            Value::Array(parts) => {
                for p in parts.iter_mut() {
                    if let Some(Value::String(t)) = p.get_mut("text") {
                        *t = strip_volatile(t, prefixes);
                    }
                }
                parts.retain(|p| p.get("text").and_then(Value::as_str) != Some(""));
                !parts.is_empty()
            }
            _ => true,
        }
    });
}

/// Set when a request's client went away while its prompt was being prepared:
/// [`AppState::prepare_tools`] then stops at its next stage.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// Marks the client gone.
    pub fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether the client went away.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn check(&self, family: Family) -> Result<(), ApiError> {
        if self.is_set() {
            Err(ApiError::bad(family, "the client went away"))
        } else {
            Ok(())
        }
    }
}

/// Sets its [`Cancel`] when dropped (with the handler of a client that left).
struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.set();
    }
}

impl AppState {
    /// Runs `f` (rendering, tokenizing: CPU-bound) on a blocking thread,
    /// holding `slot` until it is done, so a client that leaves does not free
    /// its slot while work for it still runs; `f` sees a [`Cancel`] set when
    /// the caller's future is dropped (the client went away).
    pub async fn blocking<T: Send + 'static>(
        self: &Arc<Self>,
        family: Family,
        slot: OwnedSemaphorePermit,
        f: impl FnOnce(&AppState, &Cancel) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<(T, OwnedSemaphorePermit), ApiError> {
        let cancel = Cancel::default();
        let _guard = CancelOnDrop(cancel.clone());
        let st = self.clone();
        let (r, slot) = tokio::task::spawn_blocking(move || (f(&st, &cancel), slot))
            .await
            .map_err(|e| ApiError::new(family, ErrorKind::Internal, e.to_string()))?;
        Ok((r?, slot))
    }

    /// Renders and tokenizes a prompt and fixes the output budget; parallel
    /// tool calls allowed. CPU-bound: call it off the async runtime.
    pub fn prepare(
        &self,
        family: Family,
        prompt: Prompt,
        params: GenParams,
    ) -> Result<Prepared, ApiError> {
        self.prepare_tools(family, prompt, params, true)
    }

    /// [`Self::prepare`], with `parallel_tool_calls`: whether the tool-call
    /// grammar allows more than one call.
    pub fn prepare_tools(
        &self,
        family: Family,
        prompt: Prompt,
        params: GenParams,
        parallel_tool_calls: bool,
    ) -> Result<Prepared, ApiError> {
        self.prepare_cancellable(
            family,
            prompt,
            params,
            parallel_tool_calls,
            &Cancel::default(),
        )
    }

    /// [`Self::prepare_tools`], stopping between stages once `cancel` is set.
    pub fn prepare_cancellable(
        &self,
        family: Family,
        prompt: Prompt,
        mut params: GenParams,
        parallel_tool_calls: bool,
        cancel: &Cancel,
    ) -> Result<Prepared, ApiError> {
        cancel.check(family)?;
        let Rendered {
            tokens,
            forced_prefix,
            parse_calls,
            tools,
            format,
            choice,
            reasoning,
            images,
        } = self.render(family, prompt, params.grammar.is_some(), cancel)?;
        if tokens.is_empty() {
            return Err(ApiError::bad(family, "the prompt is empty"));
        }
        let ctx = self.engine.max_context();
        if tokens.len() >= ctx {
            return Err(ApiError::new(
                family,
                ErrorKind::ContextOverflow,
                format!(
                    "the prompt has {} tokens; this server's context limit is {ctx} tokens (prompt + output)",
                    tokens.len()
                ),
            ));
        }
        let mut room = ctx - tokens.len();
        if let Some(limit) = self.config.max_total_tokens {
            // Prompt plus output must fit the server-wide limit even when nothing
            // else runs; the output budget shrinks to fit, as it does to the context.
            if tokens.len() >= limit {
                return Err(ApiError::new(
                    family,
                    ErrorKind::ContextOverflow,
                    format!(
                        "the prompt has {} tokens; this server admits at most {limit} tokens \
                         (prompt + output) at once (--max-total-tokens)",
                        tokens.len()
                    ),
                ));
            }
            room = room.min(limit - tokens.len());
        }
        let cap = self.config.max_tokens.unwrap_or(usize::MAX);
        let max_tokens = output_budget(params.max_tokens, room, cap);
        if params.max_tokens == Some(0) {
            return Err(ApiError::bad_param(
                family,
                "max_tokens",
                "max_tokens must be at least 1",
            ));
        }
        // Tool calls: a forced call always follows its grammar; in auto mode the
        // grammar engages once the model opens a call, unless the client asked
        // for a response format (which then constrains the whole output).
        let forced = matches!(choice, ToolChoice::Required | ToolChoice::Named(_));
        let mut tool_grammar = false;
        if parse_calls && (forced || params.grammar.is_none()) {
            let g = tool_call_grammar(
                self.engine.tokenizer(),
                format,
                &tools,
                &choice,
                // A named function is called once: small models otherwise repeat it.
                parallel_tool_calls && !matches!(choice, ToolChoice::Named(_)),
                reasoning,
            )
            .map_err(|e| ApiError::bad_param(family, "tools", e.to_string()))?;
            if g.is_some() {
                params.grammar = g;
                tool_grammar = true;
            }
        }
        cancel.check(family)?;
        let constraint = match &params.grammar {
            None => None,
            Some(g) => {
                let compiler =
                    tempo9_grammar::GrammarCompiler::for_tokenizer(self.engine.tokenizer())
                        .map_err(|e| ApiError::new(family, ErrorKind::Internal, e.to_string()))?;
                let mut c = compiler.compile(g).map_err(|e| {
                    let param = if tool_grammar {
                        "tools"
                    } else {
                        "response_format"
                    };
                    ApiError::bad_param(family, param, e.to_string())
                })?;
                if let (true, Some(prefix)) = (tool_grammar, &forced_prefix) {
                    c.advance_text(prefix).map_err(|e| {
                        ApiError::new(
                            family,
                            ErrorKind::Internal,
                            format!("forced tool-call prefix does not fit the grammar: {e}"),
                        )
                    })?;
                }
                Some(c)
            }
        };
        // Plain text: a prediction cannot smuggle in control tokens.
        let prediction = params.prediction.as_deref().map_or_else(Vec::new, |t| {
            self.engine.tokenizer().encode(t, false, false)
        });
        Ok(Prepared {
            tokens,
            forced_prefix,
            parse_calls,
            tools,
            params,
            max_tokens,
            prediction,
            constraint,
            format,
            reasoning,
            images,
        })
    }

    /// Renders (chat) and tokenizes a prompt: (token ids, forced tool-call
    /// prefix, whether to parse calls, tools).
    #[allow(clippy::type_complexity)]
    pub fn tokenize(
        &self,
        family: Family,
        prompt: Prompt,
    ) -> Result<(Vec<u32>, Option<String>, bool, Vec<Value>), ApiError> {
        let r = self.render(family, prompt, false, &Cancel::default())?;
        Ok((r.tokens, r.forced_prefix, r.parse_calls, r.tools))
    }

    /// `constrained`: a response-format grammar will constrain the whole output.
    fn render(
        &self,
        family: Family,
        prompt: Prompt,
        constrained: bool,
        cancel: &Cancel,
    ) -> Result<Rendered, ApiError> {
        let tok = self.engine.tokenizer();
        let plain = |tokens| Rendered {
            tokens,
            forced_prefix: None,
            parse_calls: false,
            tools: Vec::new(),
            format: self.tool_format,
            choice: ToolChoice::None,
            reasoning: None,
            images: Vec::new(),
        };
        Ok(match prompt {
            Prompt::Chat {
                mut messages,
                tools,
                tool_choice,
                template,
            } => {
                if messages.is_empty() {
                    return Err(ApiError::bad_param(
                        family,
                        "messages",
                        "messages must not be empty",
                    ));
                }
                clean_system(&mut messages, &self.config.volatile_prefixes);
                // Images: a marker in the text for each; decoded and preprocessed
                // here (400 naming the problem), tokenized around below.
                let marker = crate::vision::marker();
                let urls = crate::vision::take_image_parts(&mut messages, &marker);
                let images = match (&self.vision, urls.is_empty()) {
                    (_, true) => Vec::new(),
                    (None, false) => {
                        return Err(ApiError::bad_param(
                            family,
                            "messages",
                            "this model takes no images (a vision-language model served with --mmproj does)",
                        ))
                    }
                    (Some(v), false) => urls
                        .iter()
                        .enumerate()
                        .map(|(i, u)| {
                            cancel.check(family)?;
                            v.load(family, i, u)
                        })
                        .collect::<Result<Vec<_>, _>>()?,
                };
                let show_tools = !tools.is_empty() && tool_choice != ToolChoice::None;
                if let ToolChoice::Named(n) = &tool_choice {
                    let known = tools
                        .iter()
                        .any(|t| t["function"]["name"].as_str() == Some(n.as_str()));
                    if !known {
                        return Err(ApiError::bad_param(
                            family,
                            "tool_choice",
                            format!("tool_choice names '{n}', which is not among the tools"),
                        ));
                    }
                }
                if matches!(tool_choice, ToolChoice::Required) && tools.is_empty() {
                    return Err(ApiError::bad_param(
                        family,
                        "tool_choice",
                        "tool_choice 'required' needs at least one tool",
                    ));
                }
                // A model without tool-call syntax still gets a forced call: in
                // Hermes style, taught in the system prompt.
                let mut format = self.tool_format;
                let forcing = matches!(tool_choice, ToolChoice::Required | ToolChoice::Named(_));
                if show_tools && forcing && format == ToolFormat::None {
                    format = ToolFormat::Hermes;
                    add_to_system(&mut messages, &hermes_tool_prompt(&tools));
                }
                let mut text = self
                    .template
                    .render_with(&messages, show_tools.then_some(&tools[..]), true, &template)
                    .map_err(|e| ApiError::bad(family, e.to_string()))?;
                let forced = match (&tool_choice, show_tools) {
                    (ToolChoice::Required, true) => format.forced_prefix(None),
                    (ToolChoice::Named(n), true) => format.forced_prefix(Some(n)),
                    _ => None,
                };
                let mut end = think::prompt_end(&text);
                // A grammar-constrained output (forced call, response format)
                // cannot think first: close the prompt's open `<think>` like the
                // template's own thinking-off form does.
                if self.think
                    && end != think::PromptEnd::Outside
                    && (forced.is_some() || constrained)
                {
                    think::close_reasoning(&mut text);
                    end = think::PromptEnd::Outside;
                }
                if let Some(f) = &forced {
                    text.push_str(f);
                }
                tracing::debug!(prompt = %text, "rendered chat prompt");
                cancel.check(family)?;
                // Message text stays text: only the template's markup becomes
                // control tokens (no role spoofing).
                let (ids, images) = match &self.vision {
                    Some(v) if !images.is_empty() => {
                        v.tokenize(family, tok, &text, &marker, images)?
                    }
                    _ => (tok.encode_prompt(&text, true), Vec::new()),
                };
                Rendered {
                    tokens: ids,
                    forced_prefix: forced,
                    parse_calls: show_tools,
                    tools,
                    format,
                    choice: tool_choice,
                    reasoning: self.think.then_some(end),
                    images,
                }
            }
            Prompt::Text(t) => plain(tok.encode(&t, true, true)),
            Prompt::Tokens(ids) => {
                let n = tok.vocab_size();
                if let Some(t) = ids.iter().find(|&&t| t as usize >= n) {
                    return Err(ApiError::bad_param(
                        family,
                        "prompt",
                        format!("token id {t} is outside the vocabulary ({n} tokens)"),
                    ));
                }
                plain(ids)
            }
        })
    }

    /// Submits a prepared request to the engine.
    pub async fn start(
        self: &Arc<Self>,
        family: Family,
        p: Prepared,
        received: Instant,
    ) -> Result<Generation, ApiError> {
        let prompt_tokens = p.tokens.len();
        // Kept only for the status page's prompt preview.
        let tokens = if self.config.status_prompts {
            p.tokens[..p.tokens.len().min(2 * crate::status::PROMPT_PREVIEW_CHARS)].to_vec()
        } else {
            Vec::new()
        };
        let mut req = Request::new(p.tokens, p.max_tokens);
        req.sampling = p.params.sampling.clone();
        req.stop = StopConditions {
            eog: true,
            strings: p.params.stop.clone(),
            token_ids: Vec::new(),
        };
        req.logprobs = p.params.logprobs;
        req.top_logprobs = p.params.top_logprobs;
        req.speculation = !p.params.no_speculation;
        req.prediction = p.prediction;
        req.images = p.images;
        if let Some(c) = p.constraint {
            req.constraint = Some(Box::new(c));
        }
        let tokens_held = self.reserve_tokens(family, prompt_tokens + p.max_tokens)?;
        // Submitting only queues the request (it never waits for the engine thread).
        let stream = self
            .engine
            .submit(req)
            .map_err(|e| submit_error(family, e))?;
        let prompt = self
            .config
            .status_prompts
            .then(|| crate::status::prompt_preview(self.engine.tokenizer(), &tokens));
        let status = self.status.register(crate::status::NewEntry {
            engine_id: stream.id(),
            client: crate::status::ClientInfo::current().unwrap_or(crate::status::ClientInfo {
                api: match family {
                    Family::OpenAi => "openai",
                    Family::Anthropic => "anthropic",
                    Family::Ollama => "ollama",
                },
                user_agent: None,
            }),
            prompt,
            prompt_tokens,
            max_tokens: p.max_tokens,
            received,
        });
        let mut parser = p.format.parser(&p.tools, p.parse_calls);
        if let Some(end) = p.reasoning {
            parser = Box::new(ThinkParser::new(parser, end));
        }
        let mut pending = Vec::new();
        if let Some(prefix) = &p.forced_prefix {
            parser.push(prefix, &mut pending);
        }
        Ok(Generation {
            state: self.clone(),
            stream,
            parser,
            pending,
            received,
            last_token: None,
            prompt_tokens,
            calls: Calls::default(),
            done: false,
            want_logprobs: p.params.logprobs,
            reasoning_tokens: 0,
            format: p.format,
            think: p.reasoning.is_some(),
            status,
            _tokens_held: tokens_held,
        })
    }
}

/// The most tokens a request may generate: what it asked for, else
/// [`crate::DEFAULT_OUTPUT_TOKENS`] (a request naming no limit must not hold
/// its slot and KV pages for a whole context of output, as a looping small
/// model would), within the context left (`room`) and `--max-tokens` (`cap`).
pub fn output_budget(requested: Option<usize>, room: usize, cap: usize) -> usize {
    requested
        .unwrap_or(crate::DEFAULT_OUTPUT_TOKENS)
        .min(room)
        .min(cap)
}

/// Maps an engine refusal to an API error.
pub fn submit_error(family: Family, e: SubmitError) -> ApiError {
    let kind = match e {
        SubmitError::QueueFull { .. } => ErrorKind::QueueFull,
        SubmitError::PromptTooLong { .. } => ErrorKind::ContextOverflow,
        SubmitError::BadRequest(_) => ErrorKind::BadRequest,
        SubmitError::Stopped => ErrorKind::Unavailable,
    };
    ApiError::new(family, kind, e.to_string())
}

/// How a generation ended, in API-neutral terms.
#[derive(Debug, Clone, PartialEq)]
pub enum Stop {
    /// The model ended its answer (end-of-generation token).
    EndTurn,
    /// A stop string matched.
    StopString(String),
    /// The output ended with tool calls.
    ToolCalls,
    /// The token budget or the context ran out.
    Length,
    /// The client went away.
    Cancelled,
    /// The engine failed.
    Error(String),
    /// The grammar (response format, tool calls) allowed no further token: the
    /// output is cut where it dead-ended (the reason says why).
    GrammarDeadEnd(String),
}

/// One token's log-probability data.
#[derive(Debug, Clone)]
pub struct TokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its bytes (may be a partial UTF-8 sequence).
    pub bytes: Vec<u8>,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely alternatives: (text, bytes, logprob).
    pub top: Vec<(String, Vec<u8>, f32)>,
}

impl TokenLogprob {
    /// OpenAI's `logprobs.content[i]` object.
    pub fn to_openai(&self) -> Value {
        json!({
            "token": self.token,
            "logprob": self.logprob,
            "bytes": self.bytes,
            "top_logprobs": self.top.iter().map(|(t, b, l)| json!({
                "token": t, "logprob": l, "bytes": b})).collect::<Vec<_>>(),
        })
    }
}

/// Parsed output, in order.
#[derive(Debug, Clone)]
pub enum GenEvent {
    /// Answer text.
    Text(String),
    /// Reasoning text.
    Reasoning(String),
    /// A complete tool call (`index` counts calls of this response from 0).
    ToolCall {
        /// Position among this response's calls.
        index: usize,
        /// The call.
        call: ToolCall,
        /// `Some(n)`: the call was streamed ([`Generation::stream_calls`]): its
        /// [`GenEvent::ToolCallStart`] and the first `n` bytes of its arguments
        /// ([`GenEvent::ToolCallDelta`]) came before, and a streaming adapter
        /// sends only the rest. `None`: nothing of it came before.
        streamed: Option<usize>,
    },
    /// A tool call began, its name known (only after
    /// [`Generation::stream_calls`], with a parser that streams calls). Its
    /// arguments follow as [`GenEvent::ToolCallDelta`]s, and the call ends with
    /// its [`GenEvent::ToolCall`] (same index and name), before any other text,
    /// reasoning or call.
    ToolCallStart {
        /// Position among this response's calls.
        index: usize,
        /// The function name.
        name: String,
    },
    /// More of a started call's arguments: with the deltas before it, the
    /// beginning of the [`GenEvent::ToolCall`]'s `arguments` text.
    ToolCallDelta {
        /// Position among this response's calls.
        index: usize,
        /// The next piece of the arguments' JSON text.
        arguments: String,
    },
    /// Log-probabilities of generated tokens.
    Logprobs(Vec<TokenLogprob>),
    /// The end, always last.
    Done {
        /// Why.
        stop: Stop,
        /// Token counts.
        usage: Usage,
        /// Generated tokens that were reasoning.
        reasoning_tokens: usize,
    },
}

/// Turns a parser's pieces into events: numbers the calls and holds a
/// streamed call to the parser's promise (see [`Piece`]).
#[derive(Debug, Default)]
struct Calls {
    /// Calls so far.
    count: usize,
    /// The call being streamed: its name and the arguments sent so far (boxed:
    /// a generation stays small while no call streams).
    open: Option<Box<(String, String)>>,
}

impl Calls {
    /// Appends the events of `pieces`.
    fn convert(&mut self, pieces: Vec<Piece>, out: &mut Vec<GenEvent>) {
        for p in pieces {
            match p {
                Piece::Text(t) => {
                    self.end_open(out);
                    out.push(GenEvent::Text(t));
                }
                Piece::Reasoning(t) => {
                    self.end_open(out);
                    out.push(GenEvent::Reasoning(t));
                }
                Piece::CallStart(name) => {
                    self.end_open(out);
                    out.push(GenEvent::ToolCallStart {
                        index: self.count,
                        name: name.clone(),
                    });
                    self.open = Some(Box::new((name, String::new())));
                }
                Piece::CallArgs(t) => match self.open.as_deref_mut() {
                    Some((_, sent)) => {
                        sent.push_str(&t);
                        out.push(GenEvent::ToolCallDelta {
                            index: self.count,
                            arguments: t,
                        });
                    }
                    None => tracing::error!("tool-call arguments streamed before the call started"),
                },
                Piece::Call(mut call) => {
                    let streamed = self.open.take().map(|open| {
                        let (name, sent) = *open;
                        if call.name != name || !call.arguments.starts_with(&sent) {
                            // The parser broke its promise: the streamed call stands.
                            tracing::error!("a streamed tool call ended as another call");
                            call = ToolCall {
                                name,
                                arguments: crate::tools::close_json(&sent),
                            };
                        }
                        sent.len()
                    });
                    out.push(GenEvent::ToolCall {
                        index: self.count,
                        call,
                        streamed,
                    });
                    self.count += 1;
                }
            }
        }
    }

    /// Ends a started call whose parser did not end it (it must): as streamed,
    /// closed into a JSON object.
    fn end_open(&mut self, out: &mut Vec<GenEvent>) {
        if let Some(open) = self.open.take() {
            let (name, sent) = *open;
            tracing::error!("a streamed tool call was not finished by its parser");
            out.push(GenEvent::ToolCall {
                index: self.count,
                call: ToolCall {
                    name,
                    arguments: crate::tools::close_json(&sent),
                },
                streamed: Some(sent.len()),
            });
            self.count += 1;
        }
    }
}

/// A running generation: pulls engine events and parses them.
pub struct Generation {
    state: Arc<AppState>,
    stream: RequestStream,
    parser: Box<dyn ToolParser>,
    pending: Vec<Piece>,
    received: Instant,
    last_token: Option<Instant>,
    prompt_tokens: usize,
    calls: Calls,
    done: bool,
    want_logprobs: bool,
    /// Tokens generated inside reasoning so far.
    reasoning_tokens: usize,
    format: ToolFormat,
    /// `<think>` tags are parsed (their tokens' text is needed).
    think: bool,
    /// Its entry on the status page, removed when the generation is dropped.
    status: crate::status::StatusGuard,
    /// Its share of `--max-total-tokens`, given back when the generation is dropped.
    _tokens_held: crate::TokenReservation,
}

impl Generation {
    /// Prompt tokens of this request.
    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// Asks for tool calls while they are written (streaming responses): from
    /// now on a call may come as [`GenEvent::ToolCallStart`] and
    /// [`GenEvent::ToolCallDelta`]s before its [`GenEvent::ToolCall`]. Only
    /// parsers that stream calls do (the Hermes JSON form); with the others,
    /// and without this, every call comes whole.
    pub fn stream_calls(&mut self) {
        self.parser.stream_calls();
    }

    /// The next batch of events (possibly empty); `None` after [`GenEvent::Done`].
    pub async fn next(&mut self) -> Option<Vec<GenEvent>> {
        if self.done {
            return None;
        }
        let mut out = Vec::new();
        let pending = std::mem::take(&mut self.pending);
        self.calls.convert(pending, &mut out);
        let event = self.stream.recv().await;
        let tok = self.state.engine.tokenizer().clone();
        match event {
            Some(Event::Token(t)) => {
                let now = Instant::now();
                match self.last_token {
                    None => self.state.metrics.first_token(now - self.received),
                    Some(prev) => self.state.metrics.next_token(now - prev),
                }
                self.last_token = Some(now);
                self.status.token(now);
                let mut text = t.text;
                if text.is_empty() {
                    // Special tokens are detokenized without text; markup tokens
                    // of this model's tool format are needed by the parser.
                    if let Some(piece) = tok.token_text(t.id) {
                        let think_tag =
                            self.think && (piece == think::OPEN || piece == think::CLOSE);
                        if (think_tag || self.format.markup_tokens().contains(&piece))
                            && !tok.is_eog(t.id)
                        {
                            text = piece.to_string();
                        }
                    }
                }
                if self.parser.in_reasoning() {
                    self.reasoning_tokens += 1;
                }
                let mut pieces = Vec::new();
                self.parser.push(&text, &mut pieces);
                self.calls.convert(pieces, &mut out);
                if self.want_logprobs {
                    if let Some(lp) = t.logprob {
                        let piece = |id: u32| {
                            let b = tok.token_piece(id, true).to_vec();
                            (String::from_utf8_lossy(&b).into_owned(), b)
                        };
                        let (token, bytes) = piece(t.id);
                        let top = t
                            .top_logprobs
                            .iter()
                            .map(|&(id, l)| {
                                let (s, b) = piece(id);
                                (s, b, l)
                            })
                            .collect();
                        out.push(GenEvent::Logprobs(vec![TokenLogprob {
                            token,
                            bytes,
                            logprob: lp,
                            top,
                        }]));
                    }
                }
            }
            Some(Event::Finished(f)) => {
                let mut pieces = Vec::new();
                self.parser.finish(&mut pieces);
                self.calls.convert(pieces, &mut out);
                self.calls.end_open(&mut out);
                let stop = match f.reason {
                    FinishReason::Length | FinishReason::ContextFull => Stop::Length,
                    FinishReason::StopString(s) => Stop::StopString(s),
                    FinishReason::Cancelled => Stop::Cancelled,
                    FinishReason::Error(e) => Stop::Error(e),
                    FinishReason::StopToken(_) | FinishReason::ConstraintDone => Stop::EndTurn,
                    FinishReason::ConstraintDeadEnd(e) => {
                        // The reason may quote the output: only at debug level.
                        tracing::warn!("grammar dead end");
                        tracing::debug!(reason = %e, "grammar dead end");
                        Stop::GrammarDeadEnd(e)
                    }
                };
                // Calls end the turn unless the budget cut the output.
                let stop = match stop {
                    Stop::EndTurn | Stop::StopString(_) if self.calls.count > 0 => Stop::ToolCalls,
                    s => s,
                };
                let reason = match &stop {
                    Stop::EndTurn | Stop::StopString(_) => "stop",
                    Stop::ToolCalls => "tool_calls",
                    Stop::Length => "length",
                    Stop::Cancelled => "cancelled",
                    Stop::Error(_) => "error",
                    Stop::GrammarDeadEnd(_) => "grammar_dead_end",
                };
                self.state.metrics.finished(
                    reason,
                    f.usage.prompt_tokens,
                    f.usage.cached_tokens,
                    f.usage.completion_tokens,
                    self.received.elapsed(),
                );
                self.done = true;
                out.push(GenEvent::Done {
                    stop,
                    usage: f.usage,
                    reasoning_tokens: self.reasoning_tokens,
                });
            }
            None => {
                self.done = true;
                self.calls.end_open(&mut out);
                out.push(GenEvent::Done {
                    stop: Stop::Error("the engine dropped the request".into()),
                    usage: Usage {
                        prompt_tokens: self.prompt_tokens,
                        ..Usage::default()
                    },
                    reasoning_tokens: self.reasoning_tokens,
                });
            }
        }
        Some(out)
    }

    /// Runs to the end, collecting everything.
    pub async fn collect(mut self) -> Collected {
        let mut c = Collected::default();
        while let Some(events) = self.next().await {
            for e in events {
                c.add(e);
            }
        }
        c
    }
}

/// A whole generation's output.
#[derive(Debug, Clone)]
pub struct Collected {
    /// Answer text.
    pub text: String,
    /// Reasoning text.
    pub reasoning: String,
    /// Tool calls.
    pub calls: Vec<ToolCall>,
    /// Per-token log-probabilities (when asked for).
    pub logprobs: Vec<TokenLogprob>,
    /// Why it ended.
    pub stop: Stop,
    /// Token counts.
    pub usage: Usage,
    /// Generated tokens that were reasoning.
    pub reasoning_tokens: usize,
}

impl Collected {
    /// Adds one event of the generation.
    pub fn add(&mut self, e: GenEvent) {
        match e {
            GenEvent::Text(t) => self.text.push_str(&t),
            GenEvent::Reasoning(t) => self.reasoning.push_str(&t),
            GenEvent::ToolCall { call, .. } => self.calls.push(call),
            GenEvent::ToolCallStart { .. } | GenEvent::ToolCallDelta { .. } => {}
            GenEvent::Logprobs(l) => self.logprobs.extend(l),
            GenEvent::Done {
                stop,
                usage,
                reasoning_tokens,
            } => {
                self.stop = stop;
                self.usage = usage;
                self.reasoning_tokens = reasoning_tokens;
            }
        }
    }
}

impl Default for Collected {
    fn default() -> Self {
        Collected {
            text: String::new(),
            reasoning: String::new(),
            calls: Vec::new(),
            logprobs: Vec::new(),
            stop: Stop::EndTurn,
            usage: Usage::default(),
            reasoning_tokens: 0,
        }
    }
}

/// Random id suffix (alphanumeric), for response and tool-call ids.
pub fn random_id(len: usize) -> String {
    use rand::Rng;
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut r = rand::rng();
    (0..len)
        .map(|_| CHARS[r.random_range(0..CHARS.len())] as char)
        .collect()
}

/// Seconds since the Unix epoch.
pub fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_budget_is_bounded_without_max_tokens() {
        let d = crate::DEFAULT_OUTPUT_TOKENS;
        // No limit asked: the default, not the whole context.
        assert_eq!(output_budget(None, 1_000_000, usize::MAX), d);
        assert_eq!(output_budget(None, 100, usize::MAX), 100);
        assert_eq!(output_budget(None, 1_000_000, 50), 50);
        // An explicit limit is honoured above the default, within room and cap.
        assert_eq!(output_budget(Some(d * 2), 1_000_000, usize::MAX), d * 2);
        assert_eq!(output_budget(Some(d * 2), 1000, usize::MAX), 1000);
        assert_eq!(output_budget(Some(10), 1000, 5), 5);
    }

    #[test]
    fn tool_prompt_goes_into_the_system_message() {
        let tools = vec![json!({"type": "function", "function": {"name": "f"}})];
        let p = hermes_tool_prompt(&tools);
        assert!(
            p.contains("<tools>\n{") && p.contains("\"name\":\"f\"}") && p.contains("}\n</tools>")
        );
        let mut msgs = vec![json!({"role": "user", "content": "hi"})];
        add_to_system(&mut msgs, "T");
        assert_eq!(msgs[0], json!({"role": "system", "content": "T"}));
        add_to_system(&mut msgs, "U");
        assert_eq!(msgs[0]["content"], "T\n\nU");
        let mut msgs = vec![json!({"role": "system", "content": [{"type": "text", "text": "S"}]})];
        add_to_system(&mut msgs, "T");
        assert_eq!(msgs[0]["content"][1]["text"], "\n\nT");
    }

    #[test]
    fn formats_with_grammars() {
        assert!(grammar_format(ToolFormat::Hermes).is_some());
        assert!(grammar_format(ToolFormat::Mistral).is_some());
        assert!(grammar_format(ToolFormat::Llama3).is_some());
        assert!(grammar_format(ToolFormat::Harmony).is_some());
        assert!(grammar_format(ToolFormat::QwenXml).is_some());
        assert!(grammar_format(ToolFormat::Gemma4).is_some());
        assert!(grammar_format(ToolFormat::None).is_none());
    }

    fn tool_call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// The events' debug form, for comparing.
    fn shown(events: &[GenEvent]) -> Vec<String> {
        events.iter().map(|e| format!("{e:?}")).collect()
    }

    #[test]
    fn streamed_calls_become_start_delta_and_call_events() {
        let mut calls = Calls::default();
        let mut out = Vec::new();
        calls.convert(
            vec![
                Piece::Text("Sure.".into()),
                Piece::CallStart("f".into()),
                Piece::CallArgs("{\"a\":".into()),
                Piece::CallArgs("1".into()),
                Piece::Call(tool_call("f", "{\"a\":1}")),
                Piece::Call(tool_call("g", "{}")),
            ],
            &mut out,
        );
        let expected = vec![
            GenEvent::Text("Sure.".into()),
            GenEvent::ToolCallStart {
                index: 0,
                name: "f".into(),
            },
            GenEvent::ToolCallDelta {
                index: 0,
                arguments: "{\"a\":".into(),
            },
            GenEvent::ToolCallDelta {
                index: 0,
                arguments: "1".into(),
            },
            GenEvent::ToolCall {
                index: 0,
                call: tool_call("f", "{\"a\":1}"),
                streamed: Some(6),
            },
            GenEvent::ToolCall {
                index: 1,
                call: tool_call("g", "{}"),
                streamed: None,
            },
        ];
        assert_eq!(shown(&out), shown(&expected));
        assert_eq!(calls.count, 2);
    }

    #[test]
    fn a_broken_streaming_promise_keeps_the_streamed_call() {
        // A call that is not the streamed one, text before the call's end, the
        // output's end with a call open, arguments without a start: the streamed
        // call ends closed as sent, nothing panics.
        for pieces in [
            vec![
                Piece::CallStart("f".into()),
                Piece::CallArgs("{\"a\":[\"x".into()),
                Piece::Call(tool_call("f", "{\"b\":2}")),
            ],
            vec![
                Piece::CallStart("f".into()),
                Piece::CallArgs("{\"a\":[\"x".into()),
                Piece::Text("oops".into()),
            ],
            vec![
                Piece::CallArgs("{}".into()),
                Piece::CallStart("f".into()),
                Piece::CallArgs("{\"a\":[\"x".into()),
            ],
        ] {
            let mut calls = Calls::default();
            let mut out = Vec::new();
            calls.convert(pieces, &mut out);
            calls.end_open(&mut out);
            let ended = out.iter().find_map(|e| match e {
                GenEvent::ToolCall {
                    index: 0,
                    call,
                    streamed: Some(n),
                } => Some((call.clone(), *n)),
                _ => None,
            });
            let (call, n) = ended.expect("the streamed call ends");
            assert_eq!(call, tool_call("f", "{\"a\":[\"x\"]}"));
            assert_eq!(&call.arguments[..n], "{\"a\":[\"x");
            assert_eq!(calls.count, 1);
        }
    }

    #[test]
    fn volatile_lines_are_removed() {
        let p = vec!["x-anthropic-billing-header:".to_string()];
        assert_eq!(
            strip_volatile(
                "x-anthropic-billing-header: cc_version=1.0.1; cc_entrypoint=cli\nYou are Claude Code.",
                &p
            ),
            "You are Claude Code."
        );
        assert_eq!(strip_volatile("plain system", &p), "plain system");
        let mut msgs = vec![
            json!({"role": "system", "content": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2"},
                {"type": "text", "text": "Stable part"}]}),
            json!({"role": "system", "content": "X-Anthropic-Billing-Header: abc"}),
            json!({"role": "user", "content": "x-anthropic-billing-header: kept in user turns"}),
        ];
        clean_system(&mut msgs, &p);
        assert_eq!(msgs.len(), 2);
        assert_eq!(
            msgs[0]["content"],
            json!([{"type": "text", "text": "Stable part"}])
        );
        assert_eq!(msgs[1]["role"], "user");
    }
}
