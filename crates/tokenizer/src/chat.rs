//! Chat templates: the model's Jinja template rendered the way llama.cpp's
//! `/apply-template` (jinja mode) renders it.
//!
//! llama.cpp normalizes OpenAI-shaped messages before rendering (content
//! always a string, typed parts joined, tool calls reduced to
//! `{type, function: {name, arguments}, id}`, arguments parsed into objects
//! for templates that use them as objects, `developer` → `system`, system
//! prompts merged into the first user turn for templates without a system
//! role), probes the template for those capabilities, and continues a
//! trailing assistant message (prefill). This module does the same on top of
//! minijinja with HF/llama.cpp's environment: `trim_blocks`,
//! `lstrip_blocks`, Python string methods, `tojson` with Python's separators,
//! `raise_exception`, `strftime_now`, `namespace`, loop controls.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::Duration;

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, Rest, ValueKind};
use minijinja::{Environment, Error, ErrorKind, UndefinedBehavior, Value};
use serde_json::{json, Map, Value as Json};
use tempo9_gguf::GgufFile;

use crate::deadline::{self, TEMPLATE_DEADLINE};
use crate::handler::{Continued, Handler};
use crate::{Literals, Tokenizer, TokenizerError};

const TEMPLATE_NAME: &str = "chat_template";

/// Steps (minijinja "fuel": one per instruction) one render may take. A chat
/// template is code from a downloaded file: this bounds an endless or
/// quadratic loop of cheap steps to well under a second of CPU (measured in
/// `tests/template_limits.rs`), far above what real templates use on long
/// conversations with many tools. Costly steps are bounded by
/// [`TEMPLATE_DEADLINE`].
pub const TEMPLATE_FUEL: u64 = 10_000_000;

/// Largest rendered prompt in bytes (far above any context window's text).
pub const TEMPLATE_MAX_OUTPUT: usize = 64 << 20;

/// Deepest macro / include nesting of one render: real templates nest a few
/// levels (JSON-schema printers); a recursion bomb stops here, well within a
/// 2 MiB thread stack.
pub const TEMPLATE_RECURSION: usize = 64;

/// llama.cpp's fallback for models without a chat template.
const CHATML_SOURCE: &str = "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\\n' -}}\n{%- endif -%}";

/// What the template does with its inputs (llama.cpp's `caps`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Caps {
    string_content: bool,
    typed_content: bool,
    system_role: bool,
    tool_calls: bool,
    object_arguments: bool,
}

/// Per-request template inputs beyond the messages and tools.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TemplateOptions {
    /// The template's `enable_thinking`; `None` renders with llama-server's
    /// default for a template that supports thinking (`true`).
    pub enable_thinking: Option<bool>,
    /// More template variables (`chat_template_kwargs`): set after the
    /// standard ones, so they override them, as llama.cpp does.
    pub kwargs: Map<String, Json>,
}

/// A compiled chat template plus the BOS/EOS strings it sees.
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    /// Renders given up on at their deadline and still running (see [`deadline`]).
    overrunning: Arc<AtomicUsize>,
    source: String,
    bos_token: String,
    eos_token: String,
    /// Strip a leading BOS / trailing EOS from the output (the tokenizer adds them).
    strip_bos: bool,
    strip_eos: bool,
    caps: Caps,
    /// The markup around an assistant turn's reasoning, e.g. `("<think>\n",
    /// "\n</think>\n\n")`, when the template renders `reasoning_content`.
    reasoning: Option<(String, String)>,
    /// llama.cpp's dedicated handler for this template, if it has one.
    handler: Handler,
    /// The tokenizer's control-token strings: escaped in message and tool
    /// text before rendering (see [`crate::literal`]); none for a template
    /// made without a tokenizer.
    literals: Literals,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("caps", &self.caps)
            .field("source_len", &self.source.len())
            .finish()
    }
}

impl ChatTemplate {
    /// The template in `tokenizer.chat_template`, with the tokenizer's BOS/EOS
    /// text; `None` if the file has no template (use [`ChatTemplate::chatml`]).
    pub fn from_gguf(f: &GgufFile, tok: &Tokenizer) -> Result<Option<Self>, TokenizerError> {
        let Some(src) = f.metadata().get_str("tokenizer.chat_template")? else {
            return Ok(None);
        };
        if src.is_empty() {
            return Ok(None);
        }
        Self::for_tokenizer(src, tok).map(Some)
    }

    /// Compiles `source` with `tok`'s BOS/EOS text (a template given in place
    /// of the model's, like llama-server's `--chat-template-file`).
    pub fn for_tokenizer(source: &str, tok: &Tokenizer) -> Result<Self, TokenizerError> {
        let piece = |id: Option<u32>| {
            id.map(|i| String::from_utf8_lossy(tok.token_piece(i, true)).into_owned())
                .unwrap_or_default()
        };
        let mut t = Self::new(source, &piece(tok.bos()), &piece(tok.eos()))?;
        t.strip_bos = tok.add_bos();
        t.strip_eos = tok.add_eos();
        t.literals = tok.literals().clone();
        Ok(t)
    }

    /// Compiles `source`; syntax errors carry the template line.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TokenizerError> {
        // Like llama.cpp: normalize line endings; a single trailing newline is
        // dropped by minijinja's default `keep_trailing_newline = false`.
        let source = source.replace("\r\n", "\n").replace('\r', "\n");
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_undefined_behavior(UndefinedBehavior::Chainable);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_recursion_limit(TEMPLATE_RECURSION);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson_filter);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_function("range", deadline::range);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| TokenizerError::TemplateSyntax {
                line: e.line().unwrap_or(0),
                message: error_message(&e),
            })?;
        let handler = Handler::detect(&source);
        let mut t = ChatTemplate {
            env: Arc::new(env),
            overrunning: Arc::default(),
            source,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            strip_bos: false,
            strip_eos: false,
            caps: Caps {
                string_content: true,
                typed_content: false,
                system_role: true,
                tool_calls: true,
                object_arguments: false,
            },
            reasoning: None,
            handler,
            literals: Literals::default(),
        };
        t.caps = t.probe_caps();
        t.reasoning = t.probe_reasoning();
        Ok(t)
    }

    /// The model's template, or llama.cpp's ChatML fallback when it has none
    /// (either way with the model's BOS/EOS text).
    pub fn for_model(f: &GgufFile, tok: &Tokenizer) -> Result<Self, TokenizerError> {
        if let Some(t) = Self::from_gguf(f, tok)? {
            return Ok(t);
        }
        Self::for_tokenizer(CHATML_SOURCE, tok)
    }

    /// The ChatML template llama.cpp falls back to when a model has none.
    pub fn chatml() -> Self {
        Self::new(CHATML_SOURCE, "", "").expect("built-in ChatML template compiles")
    }

    /// The (line-ending normalized) template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The BOS text the template sees as `bos_token`.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The EOS text the template sees as `eos_token`.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Whether the template reads tool-call arguments as an object (they are
    /// then parsed from their JSON string before rendering).
    pub fn uses_object_arguments(&self) -> bool {
        self.caps.object_arguments
    }

    /// Whether the template renders a system message (otherwise the system
    /// prompt is merged into the next message).
    pub fn supports_system_role(&self) -> bool {
        self.caps.system_role
    }

    /// Renders a conversation exactly as llama-server's `/apply-template`:
    ///
    /// `messages` and `tools` are OpenAI-shaped JSON (`role`; `content` as a
    /// string, `null` or an array of `{type: "text", text}` parts;
    /// `tool_calls` with `function.arguments` as a JSON string or object; tool
    /// results with `tool_call_id` / `name`). A trailing assistant message is
    /// continued: the prompt ends with the generation prompt followed by its
    /// content, whatever `add_generation_prompt` says.
    ///
    /// Control-token strings inside messages and tools come out escaped (for
    /// a template made with a tokenizer): tokenize the prompt with
    /// [`Tokenizer::encode_prompt`], which keeps them text.
    pub fn render(
        &self,
        messages: &[Json],
        tools: Option<&[Json]>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.render_with(
            messages,
            tools,
            add_generation_prompt,
            &TemplateOptions::default(),
        )
    }

    /// [`Self::render`] with per-request template options (thinking on/off,
    /// `chat_template_kwargs`).
    pub fn render_with(
        &self,
        messages: &[Json],
        tools: Option<&[Json]>,
        add_generation_prompt: bool,
        opts: &TemplateOptions,
    ) -> Result<String, TokenizerError> {
        let (messages, tools) = self.escape_inputs(messages, tools);
        let mut msgs = self.normalize_messages(&messages)?;
        let tools = tools
            .as_deref()
            .map(normalize_tools)
            .transpose()?
            .unwrap_or_default();
        let continued = match msgs.last() {
            Some(m) if m["role"] == "assistant" => msgs.pop(),
            _ => None,
        };
        self.handler.adjust(&mut msgs);
        match continued {
            None => {
                let mut out = self.apply(&msgs, &tools, add_generation_prompt, opts)?;
                self.handler.finish(&mut out, add_generation_prompt);
                Ok(out)
            }
            Some(last) => {
                let mut without = self.apply(&msgs, &tools, false, opts)?;
                let own = Continued {
                    reasoning: last["reasoning_content"].as_str().unwrap_or(""),
                    content: content_text(&last["content"], "\n\n"),
                };
                if let Some(turn) = self.handler.continuation(&without, &own) {
                    self.handler.finish(&mut without, false);
                    without.push_str(&turn);
                    return Ok(without);
                }
                let with = self.apply(&msgs, &tools, true, opts)?;
                let common = without
                    .bytes()
                    .zip(with.bytes())
                    .take_while(|(a, b)| a == b)
                    .count();
                let mut out = without;
                let generation = String::from_utf8_lossy(&with.as_bytes()[common..]);
                let reasoning = last["reasoning_content"].as_str().unwrap_or("");
                let reasoning_only =
                    last["content"].as_str().is_some_and(str::is_empty) && !reasoning.is_empty();
                match &self.reasoning {
                    // llama.cpp rebuilds the turn's start: the generation prompt up
                    // to its reasoning markup, then the message's own reasoning
                    // (left open when there is nothing else to continue).
                    Some((start, end)) => {
                        let cut = generation.find(start.as_str()).unwrap_or(generation.len());
                        out.push_str(&generation[..cut]);
                        out.push_str(start);
                        out.push_str(reasoning);
                        if !reasoning_only {
                            out.push_str(end);
                        }
                    }
                    None => out.push_str(&generation),
                }
                if !reasoning_only {
                    out.push_str(&content_text(&last["content"], "\n\n"));
                }
                Ok(out)
            }
        }
    }

    /// Renders the template on the normalized `messages` as they are (no
    /// prefill handling of a trailing assistant message).
    pub fn render_plain(
        &self,
        messages: &[Json],
        tools: Option<&[Json]>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let (messages, tools) = self.escape_inputs(messages, tools);
        let mut msgs = self.normalize_messages(&messages)?;
        let tools = tools
            .as_deref()
            .map(normalize_tools)
            .transpose()?
            .unwrap_or_default();
        self.handler.adjust(&mut msgs);
        let mut out = self.apply(
            &msgs,
            &tools,
            add_generation_prompt,
            &TemplateOptions::default(),
        )?;
        self.handler.finish(&mut out, add_generation_prompt);
        Ok(out)
    }

    /// Messages and tools with control-token strings escaped in all their
    /// text (roles aside, which templates compare with fixed names).
    fn escape_inputs(
        &self,
        messages: &[Json],
        tools: Option<&[Json]>,
    ) -> (Vec<Json>, Option<Vec<Json>>) {
        let msgs = messages
            .iter()
            .map(|m| match m {
                Json::Object(o) => Json::Object(
                    o.iter()
                        .map(|(k, v)| {
                            let v = if k == "role" {
                                v.clone()
                            } else {
                                escape_json(&self.literals, v)
                            };
                            (k.clone(), v)
                        })
                        .collect(),
                ),
                other => escape_json(&self.literals, other),
            })
            .collect();
        let tools = tools.map(|t| t.iter().map(|v| escape_json(&self.literals, v)).collect());
        (msgs, tools)
    }

    /// One template run (llama.cpp's `common_chat_template_direct_apply`).
    fn apply(
        &self,
        messages: &[Json],
        tools: &[Json],
        add_generation_prompt: bool,
        opts: &TemplateOptions,
    ) -> Result<String, TokenizerError> {
        let mut ctx = Map::new();
        ctx.insert("messages".into(), Json::Array(messages.to_vec()));
        ctx.insert("bos_token".into(), Json::String(self.bos_token.clone()));
        ctx.insert("eos_token".into(), Json::String(self.eos_token.clone()));
        ctx.insert(
            "enable_thinking".into(),
            Json::Bool(opts.enable_thinking.unwrap_or(true)),
        );
        if !tools.is_empty() {
            ctx.insert("tools".into(), Json::Array(tools.to_vec()));
        }
        let now = now_utc();
        ctx.insert("datetime".into(), Json::String(strftime(&now, "%b %d %Y")));
        ctx.insert(
            "date_string".into(),
            Json::String(strftime(&now, "%d %b %Y")),
        );
        for (k, v) in &opts.kwargs {
            ctx.insert(k.clone(), v.clone());
        }
        if add_generation_prompt {
            ctx.insert("add_generation_prompt".into(), Json::Bool(true));
        }
        let mut out = self.run(Value::from_serialize(Json::Object(ctx)))?;
        if self.strip_bos && !self.bos_token.is_empty() && out.starts_with(&self.bos_token) {
            out.drain(..self.bos_token.len());
        }
        if self.strip_eos && !self.eos_token.is_empty() && out.ends_with(&self.eos_token) {
            out.truncate(out.len() - self.eos_token.len());
        }
        Ok(out)
    }

    /// Renders on a thread of its own, waiting at most [`TEMPLATE_DEADLINE`] and
    /// a second: the deadline checks inside a render (see [`deadline`]) cannot
    /// see every costly step, so a render that misses them is left to finish
    /// alone, and until it has, the template renders nothing else (one core
    /// lost, not one per request).
    fn run(&self, ctx: Value) -> Result<String, TokenizerError> {
        if self.overrunning.load(Ordering::Acquire) > 0 {
            return Err(TokenizerError::TemplateRender {
                line: None,
                message: format!(
                    "an earlier render of this chat template is still running past its \
                     {} s deadline (TEMPLATE_DEADLINE): the template does costly work; \
                     serve the model with another one (--chat-template-file)",
                    TEMPLATE_DEADLINE.as_secs()
                ),
            });
        }
        // A rendezvous: the render's result is either taken by the waiter or,
        // once the waiter has given up and dropped its end, refused.
        let (tx, rx) = std::sync::mpsc::sync_channel(0);
        let (env, overrunning) = (self.env.clone(), self.overrunning.clone());
        std::thread::Builder::new()
            .name("chat-template".into())
            .stack_size(RENDER_STACK)
            .spawn(move || {
                if tx.send(render(&env, ctx)).is_err() {
                    overrunning.fetch_sub(1, Ordering::AcqRel);
                }
            })
            .map_err(|e| TokenizerError::TemplateRender {
                line: None,
                message: format!("cannot start a render thread: {e}"),
            })?;
        match rx.recv_timeout(TEMPLATE_DEADLINE + Duration::from_secs(1)) {
            Ok(r) => r,
            Err(RecvTimeoutError::Timeout) => {
                self.overrunning.fetch_add(1, Ordering::AcqRel);
                drop(rx);
                Err(over_time())
            }
            Err(RecvTimeoutError::Disconnected) => Err(TokenizerError::TemplateRender {
                line: None,
                message: "the chat template's render thread failed".into(),
            }),
        }
    }

    /// OpenAI-shaped messages → what llama.cpp hands the template.
    fn normalize_messages(&self, messages: &[Json]) -> Result<Vec<Json>, TokenizerError> {
        let mut out = Vec::with_capacity(messages.len());
        for m in messages {
            out.push(normalize_message(m, &self.caps)?);
        }
        if !self.source.contains("<|channel|>") {
            for m in &mut out {
                if m["role"] == "developer" {
                    m["role"] = json!("system");
                }
            }
        }
        if !self.caps.system_role && out.first().is_some_and(|m| m["role"] == "system") {
            let first = out.remove(0);
            if let Some(next) = out.first_mut() {
                let merged = format!(
                    "{}\n{}",
                    content_text(&first["content"], "\n"),
                    content_text(&next["content"], "\n")
                );
                next["content"] = Json::String(merged);
            }
        }
        if self.caps.object_arguments {
            for m in &mut out {
                let Some(calls) = m.get_mut("tool_calls").and_then(Json::as_array_mut) else {
                    continue;
                };
                for call in calls {
                    if let Some(args) = call.pointer_mut("/function/arguments") {
                        if let Json::String(s) = args {
                            *args = serde_json::from_str(s).map_err(|e| {
                                TokenizerError::InvalidMessage(format!(
                                    "failed to parse tool call arguments as JSON: {e}"
                                ))
                            })?;
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// The markup the template puts around an assistant turn's
    /// `reasoning_content` (what llama.cpp's template analysis calls the
    /// reasoning start and end): found by rendering a reasoned answer and
    /// taking the text from the opening tag (the closing tag without its `/`)
    /// to the reasoning, and from the reasoning to the answer.
    fn probe_reasoning(&self) -> Option<(String, String)> {
        const R: &str = "REASONING_MARKER_c9f1";
        const C: &str = "CONTENT_MARKER_c9f1";
        let s = self
            .run(Value::from_serialize(json!({
                "messages": [
                    {"role": "user", "content": "User message"},
                    {"role": "assistant", "content": C, "reasoning_content": R},
                ],
                "bos_token": "",
                "eos_token": "",
                "enable_thinking": true,
            })))
            .ok()?;
        let (r, c) = (s.find(R)?, s.find(C)?);
        let end = s.get(r + R.len()..c)?;
        let close = end.trim();
        let open = format!("<{}", close.strip_prefix("</")?);
        let start = &s[s[..r].rfind(&open)?..r];
        Some((start.to_string(), end.to_string()))
    }

    /// The markup around an assistant turn's reasoning when the template
    /// renders `reasoning_content`: (start, end), e.g. `("<think>\n",
    /// "\n</think>\n\n")`.
    pub fn reasoning_markup(&self) -> Option<(&str, &str)> {
        self.reasoning
            .as_ref()
            .map(|(s, e)| (s.as_str(), e.as_str()))
    }

    /// Finds out how the template uses its inputs by rendering probes
    /// (llama.cpp does the same with usage statistics).
    fn probe_caps(&self) -> Caps {
        let mut caps = self.caps;
        let base = |messages: Value, tools: Value| {
            Value::from_iter([
                ("messages", messages),
                ("tools", tools),
                ("bos_token", Value::from("")),
                ("eos_token", Value::from("")),
                ("add_generation_prompt", Value::from(true)),
            ])
        };
        let no_tools = || Value::from(Vec::<Value>::new());

        // Content as a string / as typed parts.
        const STR_MARK: &str = "STRING_MARKER_c9f1";
        const TYPED_MARK: &str = "TYPED_MARKER_c9f1";
        let as_string = self.run(base(
            Value::from_serialize(json!([{"role": "user", "content": STR_MARK}])),
            no_tools(),
        ));
        let typed_used = Arc::new(AtomicBool::new(false));
        let typed = Value::from_object(Tracked {
            inner: Value::from_serialize(json!([{"type": "text", "text": TYPED_MARK}])),
            used: typed_used.clone(),
        });
        let as_typed = self.run(base(
            Value::from(vec![Value::from_iter([
                ("role", Value::from("user")),
                ("content", typed),
            ])]),
            no_tools(),
        ));
        caps.typed_content = as_typed.is_ok() && typed_used.load(Ordering::Relaxed);
        caps.string_content = match &as_string {
            Ok(s) => s.contains(STR_MARK) || !caps.typed_content,
            Err(_) => !caps.typed_content,
        };

        // System role.
        const SYS_MARK: &str = "SYSTEM_MARKER_c9f1";
        if let Ok(s) = self.run(base(
            Value::from_serialize(json!([
                {"role": "system", "content": SYS_MARK},
                {"role": "user", "content": "User message"}
            ])),
            no_tools(),
        )) {
            caps.system_role = s.contains(SYS_MARK);
        }

        // Tool calls, with arguments as an object that records being read.
        let used = Arc::new(AtomicBool::new(false));
        let args = Value::from_object(Tracked {
            inner: Value::from_iter([("arg", Value::from("value"))]),
            used: used.clone(),
        });
        let call = Value::from_iter([
            ("id", Value::from("call00001")),
            ("type", Value::from("function")),
            (
                "function",
                Value::from_iter([("name", Value::from("tool1")), ("arguments", args)]),
            ),
        ]);
        let messages = Value::from(vec![
            Value::from_serialize(json!({"role": "user", "content": "User message"})),
            Value::from_iter([
                ("role", Value::from("assistant")),
                ("content", Value::from("")),
                ("tool_calls", Value::from(vec![call])),
            ]),
            Value::from_serialize(
                json!({"role": "tool", "content": "Tool response", "tool_call_id": "call00001"}),
            ),
            Value::from_serialize(
                json!({"role": "assistant", "content": "The tool response was 'tool response'"}),
            ),
            Value::from_serialize(json!({"role": "user", "content": "User message"})),
        ]);
        let tools = Value::from_serialize(json!([{
            "name": "tool",
            "type": "function",
            "function": {
                "name": "tool1",
                "description": "Tool description",
                "parameters": {
                    "type": "object",
                    "properties": {"arg": {"type": "string", "description": "Arg description"}},
                    "required": ["arg"]
                }
            }
        }]));
        if let Ok(s) = self.run(base(messages, tools)) {
            caps.tool_calls = s.contains("tool1");
            caps.object_arguments = used.load(Ordering::Relaxed);
        }
        caps
    }
}

/// Text of a message's content: a string as is, typed parts' text joined.
fn content_text(content: &Json, delimiter: &str) -> String {
    match content {
        Json::String(s) => s.clone(),
        Json::Array(parts) => {
            let mut text = String::new();
            for p in parts {
                if p["type"] == "text" {
                    if !text.is_empty() {
                        text.push_str(delimiter);
                    }
                    text.push_str(p["text"].as_str().unwrap_or(""));
                }
            }
            text
        }
        _ => String::new(),
    }
}

fn str_field(m: &Json, key: &str) -> Result<Option<String>, TokenizerError> {
    match m.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(TokenizerError::InvalidMessage(format!(
            "'{key}' must be a string, got {other}"
        ))),
    }
}

/// One OpenAI message → `{role, content, reasoning_content?, name?,
/// tool_call_id?, tool_calls?}` (llama.cpp's `to_json_oaicompat` plus the
/// content normalization for the template's capabilities).
fn normalize_message(m: &Json, caps: &Caps) -> Result<Json, TokenizerError> {
    let Some(obj) = m.as_object() else {
        return Err(TokenizerError::InvalidMessage(format!(
            "expected a message object, got {m}"
        )));
    };
    let role = str_field(m, "role")?
        .ok_or_else(|| TokenizerError::InvalidMessage(format!("missing 'role' in message: {m}")))?;
    if !obj.contains_key("content") && !obj.contains_key("tool_calls") {
        return Err(TokenizerError::InvalidMessage(format!(
            "expected 'content' or 'tool_calls' in message: {m}"
        )));
    }
    let mut parts: Option<Vec<Json>> = None;
    let mut content = String::new();
    match obj.get("content") {
        None | Some(Json::Null) => {}
        Some(Json::String(s)) => content = s.clone(),
        Some(Json::Array(items)) => {
            let mut v = Vec::new();
            for p in items {
                let ty = p.get("type").and_then(Json::as_str).ok_or_else(|| {
                    TokenizerError::InvalidMessage(format!("missing content part type: {p}"))
                })?;
                if ty == "text" {
                    let text = p.get("text").and_then(Json::as_str).unwrap_or("");
                    v.push(json!({"type": "text", "text": text}));
                }
            }
            parts = Some(v);
        }
        Some(other) => {
            return Err(TokenizerError::InvalidMessage(format!(
                "invalid 'content': expected string or array, got {other}"
            )))
        }
    }

    let mut out = Map::new();
    out.insert("role".into(), Json::String(role));
    let content_value = match parts {
        Some(parts) if !parts.is_empty() => {
            if caps.string_content && !caps.typed_content {
                Json::String(content_text(&Json::Array(parts), "\n"))
            } else {
                Json::Array(parts)
            }
        }
        _ => {
            if caps.typed_content && !caps.string_content {
                json!([{"type": "text", "text": content}])
            } else {
                Json::String(content)
            }
        }
    };
    out.insert("content".into(), content_value);
    if let Some(r) = str_field(m, "reasoning_content")?.filter(|r| !r.is_empty()) {
        out.insert("reasoning_content".into(), Json::String(r));
    }
    if let Some(n) = str_field(m, "name")?.filter(|n| !n.is_empty()) {
        out.insert("name".into(), Json::String(n));
    }
    if let Some(id) = str_field(m, "tool_call_id")?.filter(|i| !i.is_empty()) {
        out.insert("tool_call_id".into(), Json::String(id));
    }
    if let Some(calls) = obj.get("tool_calls").filter(|c| !c.is_null()) {
        let calls = calls.as_array().ok_or_else(|| {
            TokenizerError::InvalidMessage(format!("'tool_calls' must be an array, got {calls}"))
        })?;
        let mut v = Vec::with_capacity(calls.len());
        for c in calls {
            let ty = c.get("type").and_then(Json::as_str).unwrap_or("function");
            if ty != "function" {
                return Err(TokenizerError::InvalidMessage(format!(
                    "unsupported tool call type: {c}"
                )));
            }
            let f = c.get("function").ok_or_else(|| {
                TokenizerError::InvalidMessage(format!("missing tool call function: {c}"))
            })?;
            let name = str_field(f, "name")?.ok_or_else(|| {
                TokenizerError::InvalidMessage(format!("missing tool call name: {c}"))
            })?;
            let arguments = match f.get("arguments") {
                Some(Json::String(s)) => s.clone(),
                None | Some(Json::Null) => String::new(),
                Some(other) => other.to_string(),
            };
            let mut tc = Map::new();
            tc.insert("type".into(), json!("function"));
            tc.insert(
                "function".into(),
                json!({"name": name, "arguments": arguments}),
            );
            if let Some(id) = str_field(c, "id")?.filter(|i| !i.is_empty()) {
                tc.insert("id".into(), Json::String(id));
            }
            v.push(Json::Object(tc));
        }
        if !v.is_empty() {
            out.insert("tool_calls".into(), Json::Array(v));
        }
    }
    Ok(Json::Object(out))
}

/// OpenAI tools → `{type: "function", function: {name, description, parameters}}`.
fn normalize_tools(tools: &[Json]) -> Result<Vec<Json>, TokenizerError> {
    tools
        .iter()
        .map(|t| {
            if t.get("type").and_then(Json::as_str) != Some("function") {
                return Err(TokenizerError::InvalidMessage(format!(
                    "unsupported tool type: {t}"
                )));
            }
            let f = t.get("function").filter(|f| f.is_object()).ok_or_else(|| {
                TokenizerError::InvalidMessage(format!("missing tool function: {t}"))
            })?;
            let name = str_field(f, "name")?
                .ok_or_else(|| TokenizerError::InvalidMessage(format!("missing tool name: {t}")))?;
            let description = str_field(f, "description")?.unwrap_or_default();
            let parameters = match f.get("parameters") {
                None | Some(Json::Null) => json!({}),
                Some(p) => p.clone(),
            };
            Ok(json!({
                "type": "function",
                "function": {"name": name, "description": description, "parameters": parameters}
            }))
        })
        .collect()
}

/// `v` with every string (keys too) escaped by `lit`.
fn escape_json(lit: &Literals, v: &Json) -> Json {
    match v {
        Json::String(s) => Json::String(lit.escape(s).into_owned()),
        Json::Array(a) => Json::Array(a.iter().map(|x| escape_json(lit, x)).collect()),
        Json::Object(o) => Json::Object(
            o.iter()
                .map(|(k, x)| (lit.escape(k).into_owned(), escape_json(lit, x)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Stack of a render thread: deep enough for [`TEMPLATE_RECURSION`] levels of
/// macros and minijinja's own recursion with room to spare.
const RENDER_STACK: usize = 8 << 20;

/// One render of the template, bounded by its fuel, output size and deadline.
fn render(env: &Environment<'static>, ctx: Value) -> Result<String, TokenizerError> {
    let tmpl = env
        .get_template(TEMPLATE_NAME)
        .map_err(|e| render_error(&e))?;
    let mut out = CappedOutput {
        buf: Vec::new(),
        full: false,
    };
    match deadline::within_deadline(|| tmpl.render_captured_to(ctx, &mut out)) {
        Err(_) => return Err(over_time()),
        Ok(Ok(_)) => {}
        Ok(Err(_)) if out.full => {
            return Err(TokenizerError::TemplateRender {
                line: None,
                message: format!(
                    "the rendered prompt exceeds {} MiB (TEMPLATE_MAX_OUTPUT)",
                    TEMPLATE_MAX_OUTPUT >> 20
                ),
            })
        }
        Ok(Err(e)) if e.kind() == ErrorKind::OutOfFuel => {
            return Err(TokenizerError::TemplateRender {
                line: e.line(),
                message: format!(
                    "the chat template ran more than {TEMPLATE_FUEL} steps \
                     (TEMPLATE_FUEL): an endless loop?"
                ),
            })
        }
        Ok(Err(e)) => return Err(render_error(&e)),
    }
    String::from_utf8(out.buf).map_err(|_| TokenizerError::TemplateRender {
        line: None,
        message: "the chat template produced invalid UTF-8".into(),
    })
}

fn over_time() -> TokenizerError {
    TokenizerError::TemplateRender {
        line: None,
        message: format!(
            "the chat template ran longer than {} s (TEMPLATE_DEADLINE)",
            TEMPLATE_DEADLINE.as_secs()
        ),
    }
}

/// The render's output, refusing to grow past [`TEMPLATE_MAX_OUTPUT`].
struct CappedOutput {
    buf: Vec<u8>,
    full: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if deadline::past_deadline() {
            return Err(std::io::Error::other("chat template over time"));
        }
        if self.buf.len() + b.len() > TEMPLATE_MAX_OUTPUT {
            self.full = true;
            return Err(std::io::Error::other("chat template output too large"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn error_message(e: &Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

fn render_error(e: &Error) -> TokenizerError {
    TokenizerError::TemplateRender {
        line: e.line(),
        message: error_message(e),
    }
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// A map or list that records whether the template looked inside it
/// (indexing, attribute lookup, iteration, `tojson`); printing it, testing
/// it for truth or taking its length does not count.
#[derive(Debug)]
struct Tracked {
    inner: Value,
    used: Arc<AtomicBool>,
}

impl Object for Tracked {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        match self.inner.kind() {
            ValueKind::Seq => ObjectRepr::Seq,
            _ => ObjectRepr::Map,
        }
    }
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.used.store(true, Ordering::Relaxed);
        self.inner.get_item(key).ok().filter(|v| !v.is_undefined())
    }
    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.used.store(true, Ordering::Relaxed);
        match self.inner.try_iter() {
            // Keys of a map, items of a list.
            Ok(items) => Enumerator::Values(items.collect()),
            Err(_) => Enumerator::Empty,
        }
    }
    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        self.inner.len()
    }
    fn is_true(self: &Arc<Self>) -> bool {
        self.inner.is_true()
    }
    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

/// `tojson` as llama.cpp implements it (Python `json.dumps` layout:
/// `", "` / `": "` separators, `","` between items when indenting, keys in
/// insertion order, non-ASCII kept unless `ensure_ascii`). Positional
/// arguments: `ensure_ascii, indent, separators, sort_keys`.
fn tojson_filter(value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let arg = |name: &str, pos: usize| -> Result<Option<Value>, Error> {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            return Ok(Some(v));
        }
        Ok(args.get(pos).cloned())
    };
    let ensure_ascii = arg("ensure_ascii", 0)?.is_some_and(|v| v.is_true());
    let indent = match arg("indent", 1)? {
        Some(v) if v.kind() == ValueKind::Number => i64::try_from(v).ok(),
        _ => None,
    };
    let separators = arg("separators", 2)?;
    let sort_keys = arg("sort_keys", 3)?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let item_sep_default = if indent.is_some() { "," } else { ", " };
    let (mut item_sep, mut key_sep) = (item_sep_default.to_string(), ": ".to_string());
    if let Some(seps) = separators.filter(|s| s.kind() == ValueKind::Seq) {
        if let Ok(v) = seps.get_item_by_index(0) {
            if let Some(s) = v.as_str() {
                item_sep = s.to_string();
            }
        }
        if let Ok(v) = seps.get_item_by_index(1) {
            if let Some(s) = v.as_str() {
                key_sep = s.to_string();
            }
        }
    }
    let opts = JsonOpts {
        indent,
        item_sep,
        key_sep,
        ensure_ascii,
        sort_keys,
    };
    let mut out = String::new();
    write_json(&value, &opts, 0, &mut out);
    Ok(Value::from(out))
}

struct JsonOpts {
    indent: Option<i64>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

fn write_json(v: &Value, o: &JsonOpts, level: usize, out: &mut String) {
    let newline = o.indent.is_some();
    let width = o.indent.unwrap_or(0).max(0) as usize;
    let pad = |out: &mut String, lvl: usize| {
        out.extend(std::iter::repeat_n(' ', lvl * width));
    };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else if let Ok(f) = f64::try_from(v.clone()) {
                out.push_str(&format_g6(f));
            } else {
                out.push_str(&v.to_string());
            }
        }
        ValueKind::String => write_json_str(v.as_str().unwrap_or(""), o.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter().map(|i| i.collect()).unwrap_or_default();
            out.push('[');
            if !items.is_empty() {
                if newline {
                    out.push('\n');
                }
                for (i, item) in items.iter().enumerate() {
                    pad(out, level + 1);
                    write_json(item, o, level + 1, out);
                    if i + 1 < items.len() {
                        out.push_str(&o.item_sep);
                    }
                    if newline {
                        out.push('\n');
                    }
                }
                pad(out, level);
            }
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter().map(|i| i.collect()).unwrap_or_default();
            if o.sort_keys {
                keys.sort();
            }
            out.push('{');
            if !keys.is_empty() {
                if newline {
                    out.push('\n');
                }
                for (i, k) in keys.iter().enumerate() {
                    pad(out, level + 1);
                    let key = match k.as_str() {
                        Some(s) => s.to_string(),
                        None => k.to_string(),
                    };
                    write_json_str(&key, o.ensure_ascii, out);
                    out.push_str(&o.key_sep);
                    let val = v.get_item(k).unwrap_or(Value::UNDEFINED);
                    write_json(&val, o, level + 1, out);
                    if i + 1 < keys.len() {
                        out.push_str(&o.item_sep);
                    }
                    if newline {
                        out.push('\n');
                    }
                }
                pad(out, level);
            }
            out.push('}');
        }
        _ => out.push_str("null"),
    }
}

fn write_json_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// C++ `ostream << double` with default flags: `%g` with 6 significant digits.
fn format_g6(f: f64) -> String {
    if f.is_nan() {
        return if f.is_sign_negative() { "-nan" } else { "nan" }.to_string();
    }
    if f.is_infinite() {
        return if f < 0.0 { "-inf" } else { "inf" }.to_string();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    const P: i32 = 6;
    // Exponent after rounding to P significant digits.
    let sci = format!("{:.*e}", (P - 1) as usize, f);
    let (mant, exp) = sci.split_once('e').expect("exponent");
    let exp: i32 = exp.parse().expect("exponent digits");
    if !(-4..P).contains(&exp) {
        let mant = trim_fraction(mant);
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mant}e{sign}{:02}", exp.abs())
    } else {
        let decimals = (P - 1 - exp).max(0) as usize;
        trim_fraction(&format!("{f:.decimals$}")).to_string()
    }
}

fn trim_fraction(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// Broken-down UTC time.
struct Tm {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    min: u32,
    sec: u32,
    weekday: u32,
    yday: u32,
}

fn now_utc() -> Tm {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    tm_from_unix(secs)
}

fn tm_from_unix(secs: i64) -> Tm {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUM[(month - 1) as usize] + day - 1 + u32::from(leap && month > 2);
    Tm {
        year,
        month,
        day,
        hour: (rem / 3600) as u32,
        min: (rem % 3600 / 60) as u32,
        sec: (rem % 60) as u32,
        weekday: (days + 4).rem_euclid(7) as u32,
        yday,
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// C `strftime` for the common conversions (UTC).
fn strftime(t: &Tm, fmt: &str) -> String {
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(spec) = chars.next() else {
            out.push('%');
            break;
        };
        let month = MONTHS[(t.month - 1) as usize];
        let day = DAYS[t.weekday as usize];
        let h12 = if t.hour.is_multiple_of(12) {
            12
        } else {
            t.hour % 12
        };
        match spec {
            'Y' => out.push_str(&t.year.to_string()),
            'y' => out.push_str(&format!("{:02}", t.year.rem_euclid(100))),
            'C' => out.push_str(&format!("{:02}", t.year.div_euclid(100))),
            'm' => out.push_str(&format!("{:02}", t.month)),
            'd' => out.push_str(&format!("{:02}", t.day)),
            'e' => out.push_str(&format!("{:2}", t.day)),
            'j' => out.push_str(&format!("{:03}", t.yday + 1)),
            'H' => out.push_str(&format!("{:02}", t.hour)),
            'I' => out.push_str(&format!("{h12:02}")),
            'M' => out.push_str(&format!("{:02}", t.min)),
            'S' => out.push_str(&format!("{:02}", t.sec)),
            'p' => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
            'B' => out.push_str(month),
            'b' | 'h' => out.push_str(&month[..3]),
            'A' => out.push_str(day),
            'a' => out.push_str(&day[..3]),
            'u' => out.push_str(&(if t.weekday == 0 { 7 } else { t.weekday }).to_string()),
            'w' => out.push_str(&t.weekday.to_string()),
            'F' => out.push_str(&format!("{}-{:02}-{:02}", t.year, t.month, t.day)),
            'D' => out.push_str(&format!(
                "{:02}/{:02}/{:02}",
                t.month,
                t.day,
                t.year.rem_euclid(100)
            )),
            'T' => out.push_str(&format!("{:02}:{:02}:{:02}", t.hour, t.min, t.sec)),
            'R' => out.push_str(&format!("{:02}:{:02}", t.hour, t.min)),
            'Z' => out.push_str("UTC"),
            'z' => out.push_str("+0000"),
            'n' => out.push('\n'),
            't' => out.push('\t'),
            '%' => out.push('%'),
            other => {
                out.push('%');
                out.push(other);
            }
        }
    }
    out
}

fn strftime_now(fmt: String) -> String {
    strftime(&now_utc(), &fmt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g6_like_cpp_ostream() {
        for (f, want) in [
            (0.5, "0.5"),
            (1.0, "1"),
            (1.234567891, "1.23457"),
            (1234567.0, "1.23457e+06"),
            (123456.0, "123456"),
            (0.0001, "0.0001"),
            (0.00001234, "1.234e-05"),
            (-2.5, "-2.5"),
            (100.0, "100"),
            (1e21, "1e+21"),
        ] {
            assert_eq!(format_g6(f), want, "{f}");
        }
    }

    #[test]
    fn dates() {
        let t = tm_from_unix(0);
        assert_eq!(
            strftime(&t, "%Y-%m-%d %H:%M:%S %a %A %b %j"),
            "1970-01-01 00:00:00 Thu Thursday Jan 001"
        );
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = tm_from_unix(1_709_211_909);
        assert_eq!(
            strftime(&t, "%d %B %Y, %I:%M %p (%A) %j %e"),
            "29 February 2024, 01:05 PM (Thursday) 060 29"
        );
        assert_eq!(
            strftime(&t, "%b %d %Y|%d %b %Y|100%%"),
            "Feb 29 2024|29 Feb 2024|100%"
        );
    }
}
