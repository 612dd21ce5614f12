//! OpenAI API: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.
//! Also the request-field parsers other adapters share (sampling, stop, tools).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use tempo9_engine::{SamplingParams, Usage};

use crate::chat::{
    random_id, unix_time, GenEvent, GenParams, Prompt, Stop, TemplateOptions, ToolChoice,
};
use crate::error::{ApiError, ErrorKind, Family};
use crate::{parse_body, sse_data, streaming, AppState, GenSlot};

const F: Family = Family::OpenAi;

/// An optional number field within `[lo, hi]`.
pub fn num(
    v: &Value,
    key: &str,
    lo: f64,
    hi: f64,
    family: Family,
) -> Result<Option<f64>, ApiError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if x.is_finite() && (lo..=hi).contains(&x) {
                Ok(Some(x))
            } else {
                Err(ApiError::bad_param(
                    family,
                    key,
                    format!("'{key}' must be between {lo} and {hi}, got {x}"),
                ))
            }
        }
        Some(_) => Err(ApiError::bad_param(
            family,
            key,
            format!("'{key}' must be a number"),
        )),
    }
}

/// An optional non-negative integer field.
pub fn uint(v: &Value, key: &str, family: Family) -> Result<Option<usize>, ApiError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_u64()
            .map(|n| Some(n.min(usize::MAX as u64) as usize))
            .ok_or_else(|| {
                ApiError::bad_param(
                    family,
                    key,
                    format!("'{key}' must be a non-negative integer"),
                )
            }),
    }
}

/// An optional boolean field.
pub fn boolean(v: &Value, key: &str, family: Family) -> Result<Option<bool>, ApiError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::bad_param(
            family,
            key,
            format!("'{key}' must be a boolean"),
        )),
    }
}

/// An optional string field.
pub fn string<'a>(v: &'a Value, key: &str, family: Family) -> Result<Option<&'a str>, ApiError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ApiError::bad_param(
            family,
            key,
            format!("'{key}' must be a string"),
        )),
    }
}

/// OpenAI's predicted output: `{"type": "content", "content": TEXT}`, the content a
/// string or an array of `{"type": "text", "text": …}` parts (joined).
fn prediction(v: &Value, family: Family) -> Result<Option<String>, ApiError> {
    let p = match v.get("prediction") {
        None | Some(Value::Null) => return Ok(None),
        Some(p) => p,
    };
    let bad = |msg: &str| Err(ApiError::bad_param(family, "prediction", msg));
    if p["type"].as_str() != Some("content") {
        return bad("prediction.type must be \"content\"");
    }
    match &p["content"] {
        Value::String(s) => Ok(Some(s.clone())),
        Value::Array(parts) => {
            let mut text = String::new();
            for part in parts {
                match (part["type"].as_str(), part["text"].as_str()) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => {
                        return bad(
                            "prediction.content parts must be {\"type\": \"text\", \"text\": …}",
                        )
                    }
                }
            }
            Ok(Some(text))
        }
        _ => bad("prediction.content must be a string or an array of text parts"),
    }
}

/// Stop strings: a string or an array of strings.
pub fn stop_strings(v: &Value, key: &str, family: Family) -> Result<Vec<String>, ApiError> {
    let err = || {
        ApiError::bad_param(
            family,
            key,
            format!("'{key}' must be a string or an array of strings"),
        )
    };
    match v.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()])
            .map(|v: Vec<String>| v.into_iter().filter(|s| !s.is_empty()).collect()),
        Some(Value::Array(a)) => {
            let mut out = Vec::new();
            for s in a {
                let s = s.as_str().ok_or_else(err)?;
                if !s.is_empty() {
                    out.push(s.to_string());
                }
            }
            if out.len() > 16 {
                return Err(ApiError::bad_param(family, key, "at most 16 stop strings"));
            }
            Ok(out)
        }
        Some(_) => Err(err()),
    }
}

/// Sampling from OpenAI-style fields (`temperature`, `top_p`, `top_k`, `min_p`,
/// penalties, `seed`). Unset fields take llama-server's defaults
/// (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), which suit small models
/// better than OpenAI's temperature 1.
pub fn sampling(v: &Value, family: Family) -> Result<SamplingParams, ApiError> {
    let mut s = SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        ..SamplingParams::default()
    };
    if let Some(t) = num(v, "temperature", 0.0, 2.0, family)? {
        s.temperature = t as f32;
    }
    if let Some(p) = num(v, "top_p", 0.0, 1.0, family)? {
        s.top_p = p as f32;
    }
    if let Some(k) = uint(v, "top_k", family)? {
        s.top_k = k;
    }
    if let Some(p) = num(v, "min_p", 0.0, 1.0, family)? {
        s.min_p = p as f32;
    }
    if let Some(p) = num(v, "presence_penalty", -2.0, 2.0, family)? {
        s.presence_penalty = p as f32;
    }
    if let Some(p) = num(v, "frequency_penalty", -2.0, 2.0, family)? {
        s.frequency_penalty = p as f32;
    }
    if let Some(p) = num(v, "repetition_penalty", 0.0, 10.0, family)?.or(num(
        v,
        "repeat_penalty",
        0.0,
        10.0,
        family,
    )?) {
        s.repetition_penalty = p as f32;
    }
    match v.get("seed") {
        None | Some(Value::Null) => {}
        Some(x) => {
            s.seed = Some(
                x.as_i64()
                    .map(|i| i as u64)
                    .or_else(|| x.as_u64())
                    .ok_or_else(|| {
                        ApiError::bad_param(family, "seed", "'seed' must be an integer")
                    })?,
            )
        }
    }
    Ok(s)
}

/// Validates OpenAI chat tools (`{type: "function", function: {name, …}}`).
pub fn chat_tools(v: &Value, family: Family) -> Result<Vec<Value>, ApiError> {
    let Some(tools) = v.get("tools").filter(|t| !t.is_null()) else {
        return Ok(Vec::new());
    };
    let arr = tools
        .as_array()
        .ok_or_else(|| ApiError::bad_param(family, "tools", "'tools' must be an array"))?;
    let mut out = Vec::new();
    for t in arr {
        let f = t.get("function").filter(|f| f.is_object());
        let name = f.and_then(|f| f["name"].as_str()).unwrap_or("");
        if t["type"] != "function" || name.is_empty() {
            return Err(ApiError::bad_param(
                family,
                "tools",
                "each tool must be {\"type\": \"function\", \"function\": {\"name\": …}}",
            ));
        }
        out.push(t.clone());
    }
    Ok(out)
}

/// Template options of an OpenAI-style request, by llama-server's rules:
/// `chat_template_kwargs` go to the template (their `enable_thinking` must be
/// a boolean and switches thinking); `reasoning_effort: "none"` turns thinking
/// off and any other effort reaches the template as `reasoning_effort`.
pub fn template_options(v: &Value, family: Family) -> Result<TemplateOptions, ApiError> {
    let mut o = TemplateOptions::default();
    match v.get("chat_template_kwargs") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            o.kwargs = m.clone();
            match o.kwargs.remove("enable_thinking") {
                None | Some(Value::Null) => {}
                Some(Value::Bool(b)) => o.enable_thinking = Some(b),
                Some(_) => {
                    return Err(ApiError::bad_param(
                        family,
                        "chat_template_kwargs",
                        "chat_template_kwargs.enable_thinking must be a boolean",
                    ))
                }
            }
        }
        Some(_) => {
            return Err(ApiError::bad_param(
                family,
                "chat_template_kwargs",
                "'chat_template_kwargs' must be an object",
            ))
        }
    }
    reasoning_effort(&mut o, string(v, "reasoning_effort", family)?);
    Ok(o)
}

/// Applies a reasoning effort: `"none"` turns thinking off; other values
/// reach the template as `reasoning_effort`.
pub fn reasoning_effort(o: &mut TemplateOptions, effort: Option<&str>) {
    match effort {
        Some("none") => {
            o.enable_thinking = Some(false);
            o.kwargs.remove("reasoning_effort");
        }
        Some(e) if !e.is_empty() => {
            o.kwargs.insert("reasoning_effort".into(), json!(e));
        }
        _ => {}
    }
}

/// OpenAI `tool_choice`: `"auto" | "none" | "required" | {"type":"function","function":{"name"}}`.
pub fn tool_choice(v: &Value, family: Family) -> Result<ToolChoice, ApiError> {
    match v.get("tool_choice") {
        None | Some(Value::Null) => Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" | "any" => Ok(ToolChoice::Required),
            _ => Err(ApiError::bad_param(
                family,
                "tool_choice",
                format!("unknown tool_choice '{s}'"),
            )),
        },
        Some(o) => {
            let name = o["function"]["name"].as_str().or(o["name"].as_str());
            match name {
                Some(n) => Ok(ToolChoice::Named(n.to_string())),
                None => Err(ApiError::bad_param(
                    family,
                    "tool_choice",
                    "tool_choice must name a function",
                )),
            }
        }
    }
}

/// Checks message shapes before the template sees them.
pub fn check_messages(v: &Value) -> Result<Vec<Value>, ApiError> {
    let msgs = v
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad_param(F, "messages", "'messages' must be an array"))?;
    for (i, m) in msgs.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str);
        if !matches!(
            role,
            Some("system" | "developer" | "user" | "assistant" | "tool" | "function")
        ) {
            return Err(ApiError::bad_param(
                F,
                "messages",
                format!("messages[{i}] needs a role of system, developer, user, assistant or tool"),
            ));
        }
        if !matches!(
            m.get("content"),
            None | Some(Value::Null | Value::String(_) | Value::Array(_))
        ) {
            return Err(ApiError::bad_param(
                F,
                "messages",
                format!("messages[{i}].content must be a string, an array of parts or null"),
            ));
        }
    }
    Ok(msgs.clone())
}

/// OpenAI usage object; `reasoning_tokens` of the completion were reasoning.
pub fn usage_json(u: &Usage, reasoning_tokens: usize) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        // Speculative decoding's drafts, under the names OpenAI gives predicted
        // outputs' tokens.
        "completion_tokens_details": {
            "reasoning_tokens": reasoning_tokens,
            "accepted_prediction_tokens": u.accepted_draft_tokens,
            "rejected_prediction_tokens": u.draft_tokens - u.accepted_draft_tokens,
        },
    })
}

/// OpenAI `finish_reason`.
pub fn finish_reason(s: &Stop) -> &'static str {
    match s {
        Stop::ToolCalls => "tool_calls",
        Stop::Length => "length",
        // Not one of OpenAI's values: the grammar left no way to continue.
        Stop::GrammarDeadEnd(_) => "grammar_dead_end",
        _ => "stop",
    }
}

fn tool_call_json(index: Option<usize>, call: &crate::tools::ToolCall) -> Value {
    let mut v = json!({
        "id": format!("call_{}", random_id(24)),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    });
    if let Some(i) = index {
        v["index"] = json!(i);
    }
    v
}

/// A streamed call's next arguments text, as a chunk's `delta` (the shape the
/// official clients accumulate: `index` and `function.arguments` only).
fn arguments_delta(index: usize, arguments: &str) -> Value {
    json!({"tool_calls": [{"index": index, "function": {"arguments": arguments}}]})
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(st): State<Arc<AppState>>,
    GenSlot(slot): GenSlot,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let v = parse_body(F, body)?;
    st.check_model(F, v["model"].as_str())?;
    let messages = check_messages(&v)?;
    let tools = chat_tools(&v, F)?;
    let choice = tool_choice(&v, F)?;
    if uint(&v, "n", F)?.unwrap_or(1) != 1 {
        return Err(ApiError::bad_param(F, "n", "only n = 1 is supported"));
    }
    let parallel = boolean(&v, "parallel_tool_calls", F)?.unwrap_or(true);
    let stream = boolean(&v, "stream", F)?.unwrap_or(false);
    let include_usage = v["stream_options"]["include_usage"]
        .as_bool()
        .unwrap_or(false);
    let logprobs = boolean(&v, "logprobs", F)?.unwrap_or(false);
    let top_logprobs = uint(&v, "top_logprobs", F)?.unwrap_or(0);
    if top_logprobs > 20 {
        return Err(ApiError::bad_param(
            F,
            "top_logprobs",
            "top_logprobs must be at most 20",
        ));
    }
    let grammar = response_format(&v, F)?;
    let params = GenParams {
        max_tokens: uint(&v, "max_completion_tokens", F)?.or(uint(&v, "max_tokens", F)?),
        sampling: sampling(&v, F)?,
        stop: stop_strings(&v, "stop", F)?,
        logprobs: logprobs || top_logprobs > 0,
        top_logprobs,
        grammar,
        no_speculation: boolean(&v, "speculation", F)? == Some(false),
        prediction: prediction(&v, F)?,
    };
    let model = st.config.model_name.clone();
    let prompt = Prompt::Chat {
        messages,
        tools,
        tool_choice: choice,
        template: template_options(&v, F)?,
    };
    let (prepared, slot) = st
        .blocking(F, slot, move |st, c| {
            st.prepare_cancellable(F, prompt, params, parallel, c)
        })
        .await?;
    let mut gen = st.start(F, prepared, received).await?;
    let id = format!("chatcmpl-{}", random_id(29));
    let created = unix_time();
    if !stream {
        let c = gen.collect().await;
        drop(slot);
        if let Stop::Error(e) = &c.stop {
            return Err(ApiError::new(F, ErrorKind::Internal, e.clone()));
        }
        let mut calls = c.calls.clone();
        if !parallel {
            calls.truncate(1);
        }
        let mut msg = json!({"role": "assistant",
            "content": if c.text.is_empty() && !calls.is_empty() { Value::Null } else { json!(c.text) }});
        if !c.reasoning.is_empty() {
            msg["reasoning_content"] = json!(c.reasoning);
        }
        if !calls.is_empty() {
            msg["tool_calls"] =
                Value::Array(calls.iter().map(|c| tool_call_json(None, c)).collect());
        }
        let lp = if params_logprobs(&c.logprobs, logprobs || top_logprobs > 0) {
            json!({"content": c.logprobs.iter().map(|l| l.to_openai()).collect::<Vec<_>>()})
        } else {
            Value::Null
        };
        return Ok(axum::Json(json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "system_fingerprint": "tempo9",
            "choices": [{"index": 0, "message": msg, "logprobs": lp,
                         "finish_reason": finish_reason(&c.stop)}],
            "usage": usage_json(&c.usage, c.reasoning_tokens),
        }))
        .into_response());
    }
    gen.stream_calls();
    Ok(streaming("text/event-stream", move |tx| async move {
        let _slot = slot;
        let chunk = |delta: Value, finish: Value, extra: Option<(&str, Value)>| {
            let mut c = json!({"id": id, "object": "chat.completion.chunk", "created": created,
                "model": model, "system_fingerprint": "tempo9",
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]});
            if let Some((k, v)) = extra {
                c["choices"][0][k] = v;
            }
            if include_usage {
                c["usage"] = Value::Null;
            }
            c
        };
        if tx
            .send(sse_data(&chunk(
                json!({"role": "assistant", "content": ""}),
                Value::Null,
                None,
            )))
            .await
            .is_err()
        {
            return;
        }
        let mut n_calls = 0;
        while let Some(events) = gen.next().await {
            for e in events {
                let c = match e {
                    GenEvent::Text(t) => chunk(json!({"content": t}), Value::Null, None),
                    GenEvent::Reasoning(t) => {
                        chunk(json!({"reasoning_content": t}), Value::Null, None)
                    }
                    GenEvent::ToolCall {
                        index,
                        call,
                        streamed,
                    } => {
                        if !parallel && index > 0 {
                            continue;
                        }
                        n_calls += 1;
                        match streamed {
                            None => chunk(
                                json!({"tool_calls": [tool_call_json(Some(index), &call)]}),
                                Value::Null,
                                None,
                            ),
                            // The start and arguments so far went out: the rest.
                            Some(n) => match call.arguments.get(n..) {
                                Some(rest) if !rest.is_empty() => {
                                    chunk(arguments_delta(index, rest), Value::Null, None)
                                }
                                _ => continue,
                            },
                        }
                    }
                    GenEvent::ToolCallStart { index, name } => {
                        if !parallel && index > 0 {
                            continue;
                        }
                        let call = crate::tools::ToolCall {
                            name,
                            arguments: String::new(),
                        };
                        chunk(
                            json!({"tool_calls": [tool_call_json(Some(index), &call)]}),
                            Value::Null,
                            None,
                        )
                    }
                    GenEvent::ToolCallDelta { index, arguments } => {
                        if !parallel && index > 0 {
                            continue;
                        }
                        chunk(arguments_delta(index, &arguments), Value::Null, None)
                    }
                    GenEvent::Logprobs(l) => chunk(
                        json!({}),
                        Value::Null,
                        Some((
                            "logprobs",
                            json!({"content": l.iter().map(|x| x.to_openai()).collect::<Vec<_>>()}),
                        )),
                    ),
                    GenEvent::Done {
                        stop,
                        usage,
                        reasoning_tokens,
                    } => {
                        if let Stop::Error(msg) = &stop {
                            let err = ApiError::new(F, ErrorKind::Internal, msg.clone()).body();
                            let _ = tx.send(sse_data(&err)).await;
                        } else {
                            let _ = tx
                                .send(sse_data(&chunk(
                                    json!({}),
                                    json!(finish_reason(&stop)),
                                    None,
                                )))
                                .await;
                        }
                        if include_usage {
                            let u = json!({"id": id, "object": "chat.completion.chunk", "created": created,
                                "model": model, "system_fingerprint": "tempo9", "choices": [],
                                "usage": usage_json(&usage, reasoning_tokens)});
                            let _ = tx.send(sse_data(&u)).await;
                        }
                        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
                        let _ = n_calls;
                        return;
                    }
                };
                if tx.send(sse_data(&c)).await.is_err() {
                    return;
                }
            }
        }
    }))
}

fn params_logprobs(l: &[crate::chat::TokenLogprob], asked: bool) -> bool {
    asked && !l.is_empty()
}

/// `response_format` (`text`, `json_object`, `json_schema`) as a grammar.
pub fn response_format(
    v: &Value,
    family: Family,
) -> Result<Option<tempo9_grammar::Grammar>, ApiError> {
    match v.get("response_format") {
        None | Some(Value::Null) => Ok(None),
        Some(rf) => tempo9_grammar::Grammar::from_openai_response_format(rf)
            .map_err(|e| ApiError::bad_param(family, "response_format", e.to_string())),
    }
}

/// `POST /v1/completions` (legacy text completions).
pub async fn completions(
    State(st): State<Arc<AppState>>,
    GenSlot(slot): GenSlot,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let v = parse_body(F, body)?;
    st.check_model(F, v["model"].as_str())?;
    let bad_prompt = || {
        ApiError::bad_param(
            F,
            "prompt",
            "'prompt' must be a string, an array of one string, or token ids",
        )
    };
    let prompt = match &v["prompt"] {
        Value::String(s) => Prompt::Text(s.clone()),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => {
            Prompt::Text(a[0].as_str().unwrap_or("").to_string())
        }
        Value::Array(a) if a.len() == 1 && a[0].is_array() => {
            Prompt::Tokens(token_ids(&a[0]).ok_or_else(bad_prompt)?)
        }
        Value::Array(a) if a.iter().all(Value::is_number) && !a.is_empty() => {
            Prompt::Tokens(token_ids(&v["prompt"]).ok_or_else(bad_prompt)?)
        }
        _ => return Err(bad_prompt()),
    };
    if uint(&v, "n", F)?.unwrap_or(1) != 1 {
        return Err(ApiError::bad_param(F, "n", "only n = 1 is supported"));
    }
    let echo = boolean(&v, "echo", F)?.unwrap_or(false);
    let echo_text = match (&prompt, echo) {
        (Prompt::Text(t), true) => t.clone(),
        (Prompt::Tokens(ids), true) => st.engine.tokenizer().decode(ids, false),
        _ => String::new(),
    };
    let top = uint(&v, "logprobs", F)?;
    if top.unwrap_or(0) > 5 {
        return Err(ApiError::bad_param(
            F,
            "logprobs",
            "logprobs must be at most 5",
        ));
    }
    let stream = boolean(&v, "stream", F)?.unwrap_or(false);
    let include_usage = v["stream_options"]["include_usage"]
        .as_bool()
        .unwrap_or(false);
    let params = GenParams {
        // The legacy API's default.
        max_tokens: Some(uint(&v, "max_tokens", F)?.unwrap_or(16)),
        sampling: sampling(&v, F)?,
        stop: stop_strings(&v, "stop", F)?,
        logprobs: top.is_some(),
        top_logprobs: top.unwrap_or(0),
        grammar: response_format(&v, F)?,
        no_speculation: boolean(&v, "speculation", F)? == Some(false),
        prediction: prediction(&v, F)?,
    };
    let model = st.config.model_name.clone();
    let (prepared, slot) = st
        .blocking(F, slot, move |st, c| {
            st.prepare_cancellable(F, prompt, params, true, c)
        })
        .await?;
    let mut gen = st.start(F, prepared, received).await?;
    let id = format!("cmpl-{}", random_id(29));
    let created = unix_time();
    let legacy_lp = |l: &[crate::chat::TokenLogprob]| {
        json!({
            "tokens": l.iter().map(|x| x.token.clone()).collect::<Vec<_>>(),
            "token_logprobs": l.iter().map(|x| x.logprob).collect::<Vec<_>>(),
            "top_logprobs": l.iter().map(|x| {
                let m: Map<String, Value> = x.top.iter().map(|(t, _, p)| (t.clone(), json!(p))).collect();
                Value::Object(m)
            }).collect::<Vec<_>>(),
        })
    };
    if !stream {
        let c = gen.collect().await;
        drop(slot);
        if let Stop::Error(e) = &c.stop {
            return Err(ApiError::new(F, ErrorKind::Internal, e.clone()));
        }
        let lp = if top.is_some() {
            legacy_lp(&c.logprobs)
        } else {
            Value::Null
        };
        return Ok(axum::Json(json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": "tempo9",
            "choices": [{"index": 0, "text": format!("{echo_text}{}", c.text), "logprobs": lp,
                         "finish_reason": finish_reason(&c.stop)}],
            "usage": usage_json(&c.usage, 0),
        }))
        .into_response());
    }
    Ok(streaming("text/event-stream", move |tx| async move {
        let _slot = slot;
        let chunk = |text: &str, finish: Value, lp: Value| {
            json!({"id": id, "object": "text_completion", "created": created, "model": model,
                   "system_fingerprint": "tempo9",
                   "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}]})
        };
        if !echo_text.is_empty()
            && tx
                .send(sse_data(&chunk(&echo_text, Value::Null, Value::Null)))
                .await
                .is_err()
        {
            return;
        }
        while let Some(events) = gen.next().await {
            for e in events {
                let c = match e {
                    GenEvent::Text(t) => chunk(&t, Value::Null, Value::Null),
                    GenEvent::Logprobs(l) => chunk("", Value::Null, legacy_lp(&l)),
                    GenEvent::Done { stop, usage, .. } => {
                        if let Stop::Error(msg) = &stop {
                            let _ = tx
                                .send(sse_data(
                                    &ApiError::new(F, ErrorKind::Internal, msg.clone()).body(),
                                ))
                                .await;
                        } else {
                            let _ = tx
                                .send(sse_data(&chunk(
                                    "",
                                    json!(finish_reason(&stop)),
                                    Value::Null,
                                )))
                                .await;
                        }
                        if include_usage {
                            let u = json!({"id": id, "object": "text_completion", "created": created,
                                "model": model, "choices": [], "usage": usage_json(&usage, 0)});
                            let _ = tx.send(sse_data(&u)).await;
                        }
                        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
                        return;
                    }
                    _ => continue,
                };
                if tx.send(sse_data(&c)).await.is_err() {
                    return;
                }
            }
        }
    }))
}

fn token_ids(v: &Value) -> Option<Vec<u32>> {
    v.as_array()?
        .iter()
        .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

fn model_entry(st: &AppState, name: &str) -> Value {
    // `capabilities` names `vision` when requests may carry images.
    let mut caps = vec!["completion"];
    if st.vision.is_some() {
        caps.push("vision");
    }
    json!({"id": name, "object": "model", "created": st.info.modified, "owned_by": "tempo9",
           "capabilities": caps,
           "meta": {"n_params": st.info.n_params, "n_ctx": st.engine.max_context(),
                    "size": st.info.size, "quantization": st.info.quantization,
                    "vision": st.vision.is_some()}})
}

/// `GET /v1/models`.
pub async fn models(State(st): State<Arc<AppState>>) -> Response {
    let mut data = vec![model_entry(&st, &st.config.model_name)];
    data.extend(st.config.aliases.iter().map(|a| model_entry(&st, a)));
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{model}`.
pub async fn model(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    st.check_model(F, Some(&name))?;
    // An alias is listed under its own name; any other name answered by the
    // served model shows the real one.
    let id = match st.names.resolve(Some(&name)) {
        crate::model_names::Resolution::Served => name.as_str(),
        _ => st.config.model_name.as_str(),
    };
    Ok(axum::Json(model_entry(&st, id)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sampling_and_limits() {
        let v = json!({"temperature": 0, "top_p": 0.5, "seed": 7, "top_k": 3});
        let s = sampling(&v, F).unwrap();
        assert_eq!(s.temperature, 0.0);
        assert_eq!(s.top_p, 0.5);
        assert_eq!(s.seed, Some(7));
        assert_eq!(s.top_k, 3);
        assert!(sampling(&json!({"temperature": 3}), F).is_err());
        assert!(sampling(&json!({"temperature": "hot"}), F).is_err());
        assert_eq!(sampling(&json!({}), F).unwrap().temperature, 0.8);
    }

    #[test]
    fn parses_stop_and_tool_choice() {
        assert_eq!(
            stop_strings(&json!({"stop": "x"}), "stop", F).unwrap(),
            vec!["x"]
        );
        assert_eq!(
            stop_strings(&json!({"stop": ["a", ""]}), "stop", F).unwrap(),
            vec!["a"]
        );
        assert!(stop_strings(&json!({"stop": 3}), "stop", F).is_err());
        assert_eq!(tool_choice(&json!({}), F).unwrap(), ToolChoice::Auto);
        assert_eq!(
            tool_choice(&json!({"tool_choice": "required"}), F).unwrap(),
            ToolChoice::Required
        );
        assert_eq!(
            tool_choice(
                &json!({"tool_choice": {"type": "function", "function": {"name": "f"}}}),
                F
            )
            .unwrap(),
            ToolChoice::Named("f".into())
        );
        assert!(tool_choice(&json!({"tool_choice": "sometimes"}), F).is_err());
    }

    #[test]
    fn parses_predicted_outputs() {
        assert_eq!(prediction(&json!({}), F).unwrap(), None);
        let p = json!({"prediction": {"type": "content", "content": "fn main() {}"}});
        assert_eq!(prediction(&p, F).unwrap().as_deref(), Some("fn main() {}"));
        let parts = json!({"prediction": {"type": "content", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}});
        assert_eq!(prediction(&parts, F).unwrap().as_deref(), Some("ab"));
        for bad in [
            json!({"prediction": "text"}),
            json!({"prediction": {"type": "image", "content": "x"}}),
            json!({"prediction": {"type": "content", "content": 3}}),
            json!({"prediction": {"type": "content", "content": [{"type": "image"}]}}),
        ] {
            assert!(prediction(&bad, F).is_err(), "{bad}");
        }
    }

    #[test]
    fn validates_messages_and_tools() {
        assert!(check_messages(&json!({"messages": [{"role": "user", "content": "hi"}]})).is_ok());
        assert!(
            check_messages(&json!({"messages": [{"role": "robot", "content": "hi"}]})).is_err()
        );
        assert!(check_messages(&json!({"messages": [{"role": "user", "content": 5}]})).is_err());
        assert!(check_messages(&json!({"messages": "hi"})).is_err());
        assert!(chat_tools(
            &json!({"tools": [{"type": "function", "function": {"name": "f"}}]}),
            F
        )
        .is_ok());
        assert!(chat_tools(&json!({"tools": [{"type": "function"}]}), F).is_err());
        assert!(
            response_format(&json!({"response_format": {"type": "text"}}), F)
                .unwrap()
                .is_none()
        );
        assert!(
            response_format(&json!({"response_format": {"type": "json_object"}}), F)
                .unwrap()
                .is_some()
        );
        assert!(response_format(&json!({"response_format": {"type": "yaml"}}), F).is_err());
    }

    #[test]
    fn usage_has_cached_tokens() {
        let u = Usage {
            prompt_tokens: 10,
            cached_tokens: 4,
            completion_tokens: 3,
            draft_tokens: 5,
            accepted_draft_tokens: 2,
            ..Usage::default()
        };
        let j = usage_json(&u, 2);
        assert_eq!(j["total_tokens"], 13);
        assert_eq!(
            j["completion_tokens_details"]["accepted_prediction_tokens"],
            2
        );
        assert_eq!(
            j["completion_tokens_details"]["rejected_prediction_tokens"],
            3
        );
        assert_eq!(j["prompt_tokens_details"]["cached_tokens"], 4);
        assert_eq!(j["completion_tokens_details"]["reasoning_tokens"], 2);
    }

    #[test]
    fn thinking_from_kwargs_and_effort() {
        let o = template_options(
            &json!({"chat_template_kwargs": {"enable_thinking": false, "custom": [1]}}),
            F,
        )
        .unwrap();
        assert_eq!(o.enable_thinking, Some(false));
        // Other kwargs reach the template; the switch itself is not duplicated.
        assert_eq!(Value::Object(o.kwargs), json!({"custom": [1]}));
        let o = template_options(&json!({"reasoning_effort": "none"}), F).unwrap();
        assert_eq!(o.enable_thinking, Some(false));
        let o = template_options(&json!({"reasoning_effort": "high"}), F).unwrap();
        assert_eq!(o.enable_thinking, None);
        assert_eq!(o.kwargs["reasoning_effort"], "high");
        assert_eq!(
            template_options(&json!({}), F).unwrap(),
            TemplateOptions::default()
        );
        assert!(template_options(
            &json!({"chat_template_kwargs": {"enable_thinking": "no"}}),
            F
        )
        .is_err());
        assert!(template_options(&json!({"chat_template_kwargs": [1]}), F).is_err());
    }
}
