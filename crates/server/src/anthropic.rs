//! Anthropic Messages API: `/v1/messages` (streaming and not) and
//! `/v1/messages/count_tokens`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tempo9_engine::Usage;

use crate::chat::{random_id, GenEvent, GenParams, Prompt, Stop, TemplateOptions, ToolChoice};
use crate::error::{ApiError, ErrorKind, Family};
use crate::openai::{num, sampling, stop_strings, uint};
use crate::{next_or_keepalive, parse_body, sse_event, streaming, AppState, GenSlot};

const F: Family = Family::Anthropic;

/// Text of a content value: a string or an array of blocks (text blocks joined).
/// An `image` block's `source` as an OpenAI image part: base64 data as a data
/// URL; a `url` source as is (refused when rendering: the server fetches
/// nothing).
fn image_block(source: &Value, i: usize) -> Result<Value, ApiError> {
    match source["type"].as_str() {
        Some("base64") => {
            let media = source["media_type"].as_str().unwrap_or("image");
            let data = source["data"].as_str().ok_or_else(|| {
                ApiError::bad_param(
                    F,
                    "messages",
                    format!("messages[{i}]: an image's base64 source has no data"),
                )
            })?;
            Ok(crate::vision::image_part(crate::vision::data_url(
                media, data,
            )))
        }
        Some("url") => Ok(crate::vision::image_part(
            source["url"].as_str().unwrap_or("").to_string(),
        )),
        other => Err(ApiError::bad_param(
            F,
            "messages",
            format!(
                "messages[{i}]: image source type {} is not supported (base64 is)",
                other.unwrap_or("(none)")
            ),
        )),
    }
}

fn blocks_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Converts an Anthropic request's `system` + `messages` into OpenAI-shaped messages.
pub fn to_openai_messages(v: &Value) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    match v.get("system") {
        None | Some(Value::Null) => {}
        Some(s @ (Value::String(_) | Value::Array(_))) => {
            // Blocks stay separate parts so volatile ones can be dropped alone.
            let parts: Vec<Value> = match s {
                Value::String(t) => vec![json!({"type": "text", "text": t})],
                Value::Array(a) => a
                    .iter()
                    .filter(|b| b["type"] == "text")
                    .map(|b| json!({"type": "text", "text": b["text"].as_str().unwrap_or("")}))
                    .collect(),
                _ => unreachable!(),
            };
            if !parts.is_empty() {
                out.push(json!({"role": "system", "content": parts}));
            }
        }
        Some(_) => {
            return Err(ApiError::bad_param(
                F,
                "system",
                "'system' must be a string or an array of text blocks",
            ))
        }
    }
    let msgs = v
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad_param(F, "messages", "'messages' must be an array"))?;
    for (i, m) in msgs.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or("");
        let content = &m["content"];
        let blocks: Vec<Value> = match content {
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            Value::Array(a) => a.clone(),
            _ => {
                return Err(ApiError::bad_param(
                    F,
                    "messages",
                    format!("messages[{i}].content must be a string or an array of blocks"),
                ))
            }
        };
        match role {
            "system" => out.push(json!({"role": "system", "content": blocks_text(content)})),
            "user" => {
                let mut text_parts = Vec::new();
                for b in &blocks {
                    match b["type"].as_str() {
                        Some("text") => text_parts.push(
                            json!({"type": "text", "text": b["text"].as_str().unwrap_or("")}),
                        ),
                        Some("tool_result") => {
                            let mut c = blocks_text(&b["content"]);
                            if b["is_error"] == true && !c.starts_with("Error") {
                                c = format!("Error: {c}");
                            }
                            out.push(json!({"role": "tool",
                                "tool_call_id": b["tool_use_id"].as_str().unwrap_or(""),
                                "content": c}));
                        }
                        // Images: as OpenAI image parts (a text-only model refuses them
                        // when rendering).
                        Some("image") => text_parts.push(image_block(&b["source"], i)?),
                        // Documents: the models served here cannot read them.
                        Some("document" | "search_result") => {}
                        Some(t) => {
                            return Err(ApiError::bad_param(
                                F,
                                "messages",
                                format!("unsupported content block type '{t}' in a user message"),
                            ))
                        }
                        None => {
                            return Err(ApiError::bad_param(
                                F,
                                "messages",
                                format!("messages[{i}] has a block without a type"),
                            ))
                        }
                    }
                }
                if !text_parts.is_empty() {
                    out.push(json!({"role": "user", "content": text_parts}));
                }
            }
            "assistant" => {
                let mut text = String::new();
                let mut reasoning = String::new();
                let mut calls = Vec::new();
                for b in &blocks {
                    match b["type"].as_str() {
                        Some("text") => text.push_str(b["text"].as_str().unwrap_or("")),
                        Some("thinking") => reasoning.push_str(b["thinking"].as_str().unwrap_or("")),
                        Some("redacted_thinking") => {}
                        Some("tool_use") => calls.push(json!({
                            "id": b["id"].as_str().unwrap_or(""),
                            "type": "function",
                            "function": {"name": b["name"].as_str().unwrap_or(""),
                                         "arguments": b.get("input").cloned().unwrap_or(json!({})).to_string()},
                        })),
                        Some(t) => return Err(ApiError::bad_param(F, "messages", format!("unsupported content block type '{t}' in an assistant message"))),
                        None => return Err(ApiError::bad_param(F, "messages", format!("messages[{i}] has a block without a type"))),
                    }
                }
                let mut msg = json!({"role": "assistant", "content": text});
                if !reasoning.is_empty() {
                    msg["reasoning_content"] = json!(reasoning);
                }
                if !calls.is_empty() {
                    msg["tool_calls"] = Value::Array(calls);
                }
                out.push(msg);
            }
            _ => {
                return Err(ApiError::bad_param(
                    F,
                    "messages",
                    format!("messages[{i}].role must be user or assistant"),
                ))
            }
        }
    }
    Ok(out)
}

/// Anthropic tools (`{name, description, input_schema}`) as OpenAI function tools.
pub fn to_openai_tools(v: &Value) -> Result<Vec<Value>, ApiError> {
    let Some(tools) = v.get("tools").filter(|t| !t.is_null()) else {
        return Ok(Vec::new());
    };
    let arr = tools
        .as_array()
        .ok_or_else(|| ApiError::bad_param(F, "tools", "'tools' must be an array"))?;
    let mut out = Vec::new();
    for t in arr {
        let Some(name) = t["name"].as_str().filter(|n| !n.is_empty()) else {
            return Err(ApiError::bad_param(F, "tools", "each tool needs a name"));
        };
        // Server tools (web search, …) have a type and no schema; they cannot run here.
        if t.get("input_schema").is_none() && t.get("type").is_some_and(|ty| ty != "custom") {
            continue;
        }
        // Deferred tools are loaded only through tool search, which this server
        // does not run: the model never sees them (Claude Code sends a
        // `DeferredToolPlaceholder` that must never be called).
        if t["defer_loading"] == true {
            continue;
        }
        let mut f = json!({"name": name,
            "parameters": t.get("input_schema").cloned().unwrap_or(json!({"type": "object", "properties": {}}))});
        if let Some(d) = t["description"].as_str() {
            f["description"] = json!(d);
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(out)
}

/// Every conversion of an Anthropic request body that the handlers run before a
/// model sees it (messages, tools, tool choice, thinking), results dropped: for
/// the fuzz targets ([`crate::request_glue`]).
pub(crate) fn glue(v: &Value) {
    let _ = prompt_of(v);
    let _ = tool_choice(v);
    let _ = template_options(v);
}

fn tool_choice(v: &Value) -> Result<(ToolChoice, bool), ApiError> {
    let tc = &v["tool_choice"];
    if tc.is_null() {
        return Ok((ToolChoice::Auto, true));
    }
    let parallel = tc["disable_parallel_tool_use"] != true;
    let c = match tc["type"].as_str() {
        Some("auto") => ToolChoice::Auto,
        Some("any") => ToolChoice::Required,
        Some("none") => ToolChoice::None,
        Some("tool") => ToolChoice::Named(
            tc["name"]
                .as_str()
                .ok_or_else(|| {
                    ApiError::bad_param(F, "tool_choice", "tool_choice of type 'tool' needs a name")
                })?
                .to_string(),
        ),
        _ => {
            return Err(ApiError::bad_param(
                F,
                "tool_choice",
                "tool_choice.type must be auto, any, tool or none",
            ))
        }
    };
    Ok((c, parallel))
}

/// `thinking: {type: "enabled" | "adaptive" | "disabled"}` switches the
/// template's thinking; without it the model's template default applies.
fn template_options(v: &Value) -> Result<TemplateOptions, ApiError> {
    let mut o = TemplateOptions::default();
    match &v["thinking"] {
        Value::Null => {}
        t => match t["type"].as_str() {
            Some("enabled" | "adaptive") => o.enable_thinking = Some(true),
            Some("disabled") => o.enable_thinking = Some(false),
            _ => {
                return Err(ApiError::bad_param(
                    F,
                    "thinking",
                    "thinking.type must be enabled, adaptive or disabled",
                ))
            }
        },
    }
    Ok(o)
}

fn prompt_of(v: &Value) -> Result<(Prompt, bool), ApiError> {
    let messages = to_openai_messages(v)?;
    let tools = to_openai_tools(v)?;
    let (choice, parallel) = tool_choice(v)?;
    Ok((
        Prompt::Chat {
            messages,
            tools,
            tool_choice: choice,
            template: template_options(v)?,
        },
        parallel,
    ))
}

/// Anthropic usage: `input_tokens` excludes tokens read from the cache.
fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens.min(u.prompt_tokens),
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

fn stop_reason(s: &Stop) -> (&'static str, Value) {
    match s {
        Stop::ToolCalls => ("tool_use", Value::Null),
        Stop::Length => ("max_tokens", Value::Null),
        Stop::StopString(s) => ("stop_sequence", json!(s)),
        _ => ("end_turn", Value::Null),
    }
}

fn tool_use_block(call: &crate::tools::ToolCall) -> Value {
    let input: Value = serde_json::from_str(&call.arguments).unwrap_or(json!({}));
    json!({"type": "tool_use", "id": format!("toolu_{}", random_id(24)), "name": call.name, "input": input})
}

/// The kind of the content block being streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    Thinking,
}

/// Turns generated text, reasoning and calls into Anthropic stream events
/// (`content_block_start` / `_delta` / `_stop`): reasoning streams as a
/// `thinking` block (`thinking_delta`), the answer as a `text` block, a call
/// as a `tool_use` block (`input_json_delta`), whole or while it is written.
#[derive(Debug, Default)]
struct Blocks {
    /// Index of the next (or the open) block.
    index: usize,
    open: Option<Block>,
    /// A streamed `tool_use` block is open.
    tool_open: bool,
}

impl Blocks {
    /// Text or reasoning: extends the open block of that kind, or opens one.
    fn delta(&mut self, kind: Block, t: &str, out: &mut Vec<(&'static str, Value)>) {
        if self.open != Some(kind) {
            self.close(out);
            let block = match kind {
                Block::Text => json!({"type": "text", "text": ""}),
                Block::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            };
            out.push((
                "content_block_start",
                json!({"type": "content_block_start", "index": self.index, "content_block": block}),
            ));
            self.open = Some(kind);
        }
        let delta = match kind {
            Block::Text => json!({"type": "text_delta", "text": t}),
            Block::Thinking => json!({"type": "thinking_delta", "thinking": t}),
        };
        out.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
        ));
    }

    /// Opens the `tool_use` block of a call being written (its `input` comes
    /// as `input_json_delta`s).
    fn call_start(&mut self, name: String, out: &mut Vec<(&'static str, Value)>) {
        self.close(out);
        let block = tool_use_block(&crate::tools::ToolCall {
            name,
            arguments: "{}".into(),
        });
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": self.index, "content_block": block}),
        ));
        self.tool_open = true;
    }

    /// More of the open `tool_use` block's input.
    fn call_delta(&mut self, partial: &str, out: &mut Vec<(&'static str, Value)>) {
        if self.tool_open && !partial.is_empty() {
            out.push(("content_block_delta", json!({"type": "content_block_delta",
                "index": self.index, "delta": {"type": "input_json_delta", "partial_json": partial}})));
        }
    }

    /// A call's end: the rest of a streamed block's input (the first
    /// `streamed` bytes of its arguments went out) and its stop, or a whole block.
    fn call_end(
        &mut self,
        call: &crate::tools::ToolCall,
        streamed: Option<usize>,
        out: &mut Vec<(&'static str, Value)>,
    ) {
        match streamed {
            Some(n) if self.tool_open => {
                self.call_delta(call.arguments.get(n..).unwrap_or_default(), out);
                self.close(out);
            }
            _ => self.call(call, out),
        }
    }

    /// A whole `tool_use` block.
    fn call(&mut self, call: &crate::tools::ToolCall, out: &mut Vec<(&'static str, Value)>) {
        self.close(out);
        let mut block = tool_use_block(call);
        let input = std::mem::replace(&mut block["input"], json!({}));
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": self.index, "content_block": block}),
        ));
        out.push(("content_block_delta", json!({"type": "content_block_delta",
            "index": self.index, "delta": {"type": "input_json_delta", "partial_json": input.to_string()}})));
        out.push((
            "content_block_stop",
            json!({"type": "content_block_stop", "index": self.index}),
        ));
        self.index += 1;
    }

    /// Closes the open text, thinking or streamed `tool_use` block.
    fn close(&mut self, out: &mut Vec<(&'static str, Value)>) {
        let tool = std::mem::take(&mut self.tool_open);
        if self.open.take().is_some() || tool {
            out.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": self.index}),
            ));
            self.index += 1;
        }
    }
}

/// The content blocks of a whole (non-streamed) message.
fn content_blocks(c: &crate::chat::Collected, parallel: bool) -> Vec<Value> {
    let mut content = Vec::new();
    if !c.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": c.reasoning, "signature": ""}));
    }
    if !c.text.is_empty() {
        content.push(json!({"type": "text", "text": c.text}));
    }
    let calls = if parallel {
        &c.calls[..]
    } else {
        &c.calls[..c.calls.len().min(1)]
    };
    content.extend(calls.iter().map(tool_use_block));
    content
}

/// `POST /v1/messages`.
pub async fn messages(
    State(st): State<Arc<AppState>>,
    GenSlot(slot): GenSlot,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let v = parse_body(F, body)?;
    st.check_model(F, v["model"].as_str())?;
    let max_tokens = uint(&v, "max_tokens", F)?
        .ok_or_else(|| ApiError::bad_param(F, "max_tokens", "max_tokens: field required"))?;
    let (prompt, parallel) = prompt_of(&v)?;
    let mut s = sampling(&v, F)?;
    if num(&v, "temperature", 0.0, 1.0, F)?.is_none() {
        // Anthropic's default temperature is 1.0; keep llama-server's 0.8 defaults otherwise.
        s.temperature = 1.0;
    }
    let params = GenParams {
        max_tokens: Some(max_tokens),
        sampling: s,
        stop: stop_strings(&v, "stop_sequences", F)?,
        logprobs: false,
        top_logprobs: 0,
        grammar: None,
        no_speculation: crate::openai::boolean(&v, "speculation", F)? == Some(false),
        prediction: None,
    };
    let stream = v["stream"].as_bool().unwrap_or(false);
    // The real name, whatever the request named (see `model_names`).
    let model = st.config.model_name.clone();
    let (prepared, slot) = st
        .blocking(F, slot, move |st, c| {
            st.prepare_cancellable(F, prompt, params, true, c)
        })
        .await?;
    let prompt_tokens = prepared.tokens.len();
    let mut gen = st.start(F, prepared, received).await?;
    let id = format!("msg_{}", random_id(24));
    if !stream {
        let c = gen.collect().await;
        drop(slot);
        if let Stop::Error(e) = &c.stop {
            return Err(ApiError::new(F, ErrorKind::Internal, e.clone()));
        }
        let content = content_blocks(&c, parallel);
        let (reason, seq) = stop_reason(&c.stop);
        return Ok(axum::Json(json!({
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": reason, "stop_sequence": seq,
            "usage": usage_json(&c.usage),
        }))
        .into_response());
    }
    gen.stream_calls();
    Ok(streaming("text/event-stream", move |tx| async move {
        let _slot = slot;
        let start = json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0,
                      "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}}});
        if tx.send(sse_event("message_start", &start)).await.is_err() {
            return;
        }
        let _ = tx.send(sse_event("ping", &json!({"type": "ping"}))).await;
        let mut blocks = Blocks::default();
        let mut events_out = Vec::new();
        let ping = || sse_event("ping", &json!({"type": "ping"}));
        while let Some(events) = next_or_keepalive(&mut gen, &tx, ping).await {
            for e in events {
                match e {
                    GenEvent::Text(t) => blocks.delta(Block::Text, &t, &mut events_out),
                    GenEvent::Reasoning(t) => blocks.delta(Block::Thinking, &t, &mut events_out),
                    GenEvent::ToolCall {
                        index: ci,
                        call,
                        streamed,
                    } => {
                        if !parallel && ci > 0 {
                            continue;
                        }
                        blocks.call_end(&call, streamed, &mut events_out);
                    }
                    GenEvent::ToolCallStart { index: ci, name } => {
                        if !parallel && ci > 0 {
                            continue;
                        }
                        blocks.call_start(name, &mut events_out);
                    }
                    GenEvent::ToolCallDelta {
                        index: ci,
                        arguments,
                    } => {
                        if !parallel && ci > 0 {
                            continue;
                        }
                        blocks.call_delta(&arguments, &mut events_out);
                    }
                    GenEvent::Logprobs(_) => {}
                    GenEvent::Done { stop, usage, .. } => {
                        blocks.close(&mut events_out);
                        if let Stop::Error(msg) = &stop {
                            events_out.push((
                                "error",
                                ApiError::new(F, ErrorKind::Internal, msg.clone()).body(),
                            ));
                        } else {
                            let (reason, seq) = stop_reason(&stop);
                            events_out.push((
                                "message_delta",
                                json!({"type": "message_delta",
                                "delta": {"stop_reason": reason, "stop_sequence": seq},
                                "usage": usage_json(&usage)}),
                            ));
                            events_out.push(("message_stop", json!({"type": "message_stop"})));
                        }
                    }
                }
            }
            for (name, data) in events_out.drain(..) {
                if tx.send(sse_event(name, &data)).await.is_err() {
                    return;
                }
            }
        }
    }))
}

/// `POST /v1/messages/count_tokens`: the prompt's token count as rendered.
pub async fn count_tokens(
    State(st): State<Arc<AppState>>,
    GenSlot(slot): GenSlot,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = async {
        let v = parse_body(F, body)?;
        st.check_model(F, v["model"].as_str())?;
        let (prompt, _) = prompt_of(&v)?;
        // Counting must not fail on the context limit: render and tokenize
        // only; within the generation slot, as rendering costs as much.
        let (n, _slot) = st
            .blocking(F, slot, move |st, _| {
                st.tokenize(F, prompt).map(|t| t.0.len())
            })
            .await?;
        Ok::<_, ApiError>(axum::Json(json!({"input_tokens": n})).into_response())
    }
    .await;
    r.unwrap_or_else(|e| e.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_system_blocks_tools_and_results() {
        let v = json!({
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc=1"},
                       {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}]},
                    {"type": "text", "text": "Thanks"}]},
            ]
        });
        let m = to_openai_messages(&v).unwrap();
        assert_eq!(m[0]["role"], "system");
        assert_eq!(m[0]["content"][1]["text"], "Be brief.");
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            r#"{"city":"Paris"}"#
        );
        assert_eq!(m[2]["tool_calls"][0]["id"], "toolu_1");
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "18C"})
        );
        assert_eq!(m[4]["role"], "user");
        assert_eq!(m.len(), 5);
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(
            to_openai_messages(&json!({"messages": [{"role": "robot", "content": "x"}]})).is_err()
        );
        assert!(to_openai_messages(
            &json!({"messages": [{"role": "user", "content": [{"type": "video"}]}]})
        )
        .is_err());
        assert!(to_openai_messages(&json!({"system": 5, "messages": []})).is_err());
        assert!(to_openai_tools(&json!({"tools": [{"description": "no name"}]})).is_err());
    }

    #[test]
    fn tools_and_choice() {
        let t = to_openai_tools(&json!({"tools": [{"name": "f", "description": "d",
            "input_schema": {"type": "object"}}, {"type": "web_search_20250305", "name": "web_search"},
            {"name": "DeferredToolPlaceholder", "input_schema": {"type": "object"}, "defer_loading": true}]})).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0]["function"]["parameters"], json!({"type": "object"}));
        assert_eq!(
            tool_choice(&json!({"tool_choice": {"type": "any"}}))
                .unwrap()
                .0,
            ToolChoice::Required
        );
        let (c, par) = tool_choice(&json!({"tool_choice": {"type": "tool", "name": "f",
            "disable_parallel_tool_use": true}}))
        .unwrap();
        assert_eq!(c, ToolChoice::Named("f".into()));
        assert!(!par);
    }

    #[test]
    fn usage_splits_cached_input() {
        let u = Usage {
            prompt_tokens: 100,
            cached_tokens: 64,
            completion_tokens: 5,
            ..Usage::default()
        };
        let j = usage_json(&u);
        assert_eq!(j["input_tokens"], 36);
        assert_eq!(j["cache_read_input_tokens"], 64);
    }

    #[test]
    fn thinking_switch() {
        let on = json!({"thinking": {"type": "enabled", "budget_tokens": 1024}});
        assert_eq!(template_options(&on).unwrap().enable_thinking, Some(true));
        let off = json!({"thinking": {"type": "disabled"}});
        assert_eq!(template_options(&off).unwrap().enable_thinking, Some(false));
        assert_eq!(template_options(&json!({})).unwrap().enable_thinking, None);
        assert!(template_options(&json!({"thinking": {"type": "loud"}})).is_err());
    }

    #[test]
    fn reasoning_streams_as_a_thinking_block() {
        let mut b = Blocks::default();
        let mut out = Vec::new();
        b.delta(Block::Thinking, "Hm", &mut out);
        b.delta(Block::Thinking, "m.", &mut out);
        b.delta(Block::Text, "Hi", &mut out);
        b.call(
            &crate::tools::ToolCall {
                name: "f".into(),
                arguments: "{}".into(),
            },
            &mut out,
        );
        b.close(&mut out);
        let kinds: Vec<String> = out
            .iter()
            .map(|(n, d)| {
                let sub = d["content_block"]["type"]
                    .as_str()
                    .or(d["delta"]["type"].as_str())
                    .unwrap_or("");
                format!("{n}:{}:{sub}", d["index"])
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "content_block_start:0:thinking",
                "content_block_delta:0:thinking_delta",
                "content_block_delta:0:thinking_delta",
                "content_block_stop:0:",
                "content_block_start:1:text",
                "content_block_delta:1:text_delta",
                "content_block_stop:1:",
                "content_block_start:2:tool_use",
                "content_block_delta:2:input_json_delta",
                "content_block_stop:2:",
            ]
        );
        assert_eq!(out[1].1["delta"]["thinking"], "Hm");

        let c = crate::chat::Collected {
            text: "Hi".into(),
            reasoning: "Hmm.".into(),
            ..Default::default()
        };
        let blocks = content_blocks(&c, true);
        assert_eq!(blocks[0]["type"], "thinking");
        assert_eq!(blocks[0]["thinking"], "Hmm.");
        assert_eq!(blocks[1], json!({"type": "text", "text": "Hi"}));
    }
}
