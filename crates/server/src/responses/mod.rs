//! OpenAI Responses API: `POST /v1/responses` with messages, tools (function,
//! free-form and namespaced: `tools.rs`) and the streaming event sequence
//! (`response.created` … `response.completed`).
//! Stateless: `previous_response_id` is refused (nothing is stored).

pub mod tools;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tempo9_engine::Usage;

use crate::chat::{random_id, unix_time, GenEvent, GenParams, Prompt, Stop, ToolChoice};
use crate::error::{ApiError, ErrorKind, Family};
use crate::openai::{boolean, sampling, uint};
use crate::{next_or_keepalive, parse_body, sse_event, streaming, AppState, GenSlot};

const F: Family = Family::OpenAi;

fn part_text(c: &Value) -> String {
    match c {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter(|p| {
                matches!(
                    p["type"].as_str(),
                    Some("input_text" | "output_text" | "text")
                )
            })
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// A message's content: its text, or, when it holds `input_image` parts, chat
/// content parts (text and `image_url`) in order, which the chat path renders
/// with the images (`crate::vision`).
fn content(c: &Value, i: usize) -> Result<Value, ApiError> {
    let parts = match c.as_array() {
        Some(p) if p.iter().any(|p| p["type"] == "input_image") => p,
        _ => return Ok(json!(part_text(c))),
    };
    let mut out = Vec::new();
    for p in parts {
        match p["type"].as_str() {
            Some("input_text" | "output_text" | "text") => {
                if let Some(t) = p["text"].as_str() {
                    out.push(json!({"type": "text", "text": t}));
                }
            }
            // `image_url` is a string here (a data URL); `file_id` needs file
            // storage, which this stateless server does not have.
            Some("input_image") => match p["image_url"].as_str() {
                Some(url) => out.push(crate::vision::image_part(url.to_string())),
                None => {
                    return Err(ApiError::bad_param(
                        F,
                        "input",
                        format!(
                            "input[{i}]: an input_image needs image_url (a data URL); \
                             file_id is not supported"
                        ),
                    ))
                }
            },
            _ => {}
        }
    }
    Ok(Value::Array(out))
}

/// `instructions` + `input` → OpenAI chat messages.
pub fn to_messages(v: &Value) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    if let Some(i) = v["instructions"].as_str().filter(|s| !s.is_empty()) {
        out.push(json!({"role": "system", "content": i}));
    }
    // A reasoning item's text, for the assistant turn that follows it.
    let mut reasoning: Option<String> = None;
    match &v["input"] {
        Value::String(s) => out.push(json!({"role": "user", "content": s})),
        Value::Array(items) => {
            for (i, it) in items.iter().enumerate() {
                let ty = it["type"].as_str().unwrap_or("message");
                match ty {
                    "message" => {
                        let role = it["role"].as_str().unwrap_or("");
                        if !matches!(role, "user" | "assistant" | "system" | "developer") {
                            return Err(ApiError::bad_param(
                                F,
                                "input",
                                format!(
                                    "input[{i}].role must be user, assistant, system or developer"
                                ),
                            ));
                        }
                        let mut m = json!({"role": role, "content": content(&it["content"], i)?});
                        if role == "assistant" {
                            if let Some(r) = reasoning.take() {
                                m["reasoning_content"] = json!(r);
                            }
                        }
                        out.push(m);
                    }
                    // A free-form tool's earlier call renders as a function call
                    // with its text in `input`, as the tool was offered (tools.rs).
                    "function_call" | "custom_tool_call" => {
                        let name = tools::flat_name(
                            it["namespace"].as_str(),
                            it["name"].as_str().unwrap_or(""),
                        );
                        let arguments = if ty == "custom_tool_call" {
                            json!({"input": it["input"].as_str().unwrap_or("")}).to_string()
                        } else {
                            it["arguments"].as_str().unwrap_or("{}").to_string()
                        };
                        let call = json!({"id": it["call_id"].as_str().unwrap_or(""), "type": "function",
                            "function": {"name": name, "arguments": arguments}});
                        // Consecutive calls belong to one assistant turn.
                        match out.last_mut() {
                            Some(last)
                                if last["role"] == "assistant"
                                    && last.get("tool_calls").is_some() =>
                            {
                                if let Some(a) = last["tool_calls"].as_array_mut() {
                                    a.push(call);
                                }
                            }
                            Some(last) if last["role"] == "assistant" => {
                                last["tool_calls"] = json!([call])
                            }
                            _ => {
                                let mut m = json!({"role": "assistant", "content": "", "tool_calls": [call]});
                                if let Some(r) = reasoning.take() {
                                    m["reasoning_content"] = json!(r);
                                }
                                out.push(m)
                            }
                        }
                    }
                    "function_call_output" | "custom_tool_call_output" => {
                        let output = match &it["output"] {
                            Value::String(s) => s.clone(),
                            o => part_text(o),
                        };
                        out.push(json!({"role": "tool", "tool_call_id": it["call_id"].as_str().unwrap_or(""),
                                        "content": output}));
                    }
                    // Rendered as the next assistant turn's `reasoning_content`
                    // (templates show it on turns after the last user message).
                    "reasoning" => {
                        let parts = it["content"]
                            .as_array()
                            .filter(|c| !c.is_empty())
                            .or(it["summary"].as_array());
                        let text = parts
                            .into_iter()
                            .flatten()
                            .filter_map(|p| p["text"].as_str())
                            .collect::<Vec<_>>()
                            .join("\n");
                        if !text.is_empty() {
                            reasoning = Some(text);
                        }
                    }
                    // Tools sent as an input item (Codex with its own default
                    // models): offered by `to_tools`, no message.
                    "additional_tools" => {}
                    t => {
                        return Err(ApiError::bad_param(
                            F,
                            "input",
                            format!("unsupported input item type '{t}'"),
                        ))
                    }
                }
            }
        }
        Value::Null => return Err(ApiError::bad_param(F, "input", "'input' is required")),
        _ => {
            return Err(ApiError::bad_param(
                F,
                "input",
                "'input' must be a string or an array of items",
            ))
        }
    }
    Ok(out)
}

/// The chat tools a request offers the model (see [`tools::Catalog`]).
pub fn to_tools(v: &Value) -> Result<Vec<Value>, ApiError> {
    Ok(tools::Catalog::of_request(v)?.chat_tools)
}

fn tool_choice(v: &Value) -> Result<ToolChoice, ApiError> {
    match &v["tool_choice"] {
        Value::Null => Ok(ToolChoice::Auto),
        Value::String(s) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            _ => Err(ApiError::bad_param(
                F,
                "tool_choice",
                format!("unknown tool_choice '{s}'"),
            )),
        },
        o => o["name"]
            .as_str()
            .map(|n| ToolChoice::Named(tools::flat_name(o["namespace"].as_str(), n)))
            .ok_or_else(|| {
                ApiError::bad_param(F, "tool_choice", "tool_choice must name a function")
            }),
    }
}

fn usage_json(u: &Usage, reasoning_tokens: usize) -> Value {
    json!({"input_tokens": u.prompt_tokens,
           "input_tokens_details": {"cached_tokens": u.cached_tokens},
           "output_tokens": u.completion_tokens,
           "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
           "total_tokens": u.prompt_tokens + u.completion_tokens})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"id": id, "type": "message", "status": status, "role": "assistant",
           "content": if status == "in_progress" { json!([]) } else {
               json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]) }})
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({"id": id, "type": "reasoning", "status": status, "summary": [],
           "content": if status == "in_progress" { json!([]) } else {
               json!([{"type": "reasoning_text", "text": text}]) }})
}

/// The fields every response object carries, echoing the request.
fn skeleton(v: &Value, id: &str, model: &str, created: u64) -> Value {
    json!({
        "id": id, "object": "response", "created_at": created, "status": "in_progress",
        "error": null, "incomplete_details": null,
        "instructions": v.get("instructions").cloned().unwrap_or(Value::Null),
        "max_output_tokens": v.get("max_output_tokens").cloned().unwrap_or(Value::Null),
        "model": model, "output": [], "parallel_tool_calls": v["parallel_tool_calls"].as_bool().unwrap_or(true),
        "previous_response_id": null,
        "reasoning": v.get("reasoning").filter(|r| r.is_object()).cloned().unwrap_or(json!({"effort": null, "summary": null})),
        "store": false,
        "temperature": v.get("temperature").cloned().unwrap_or(json!(1.0)),
        "text": v["text"].get("format").map(|f| json!({"format": f})).unwrap_or(json!({"format": {"type": "text"}})),
        "tool_choice": v.get("tool_choice").cloned().unwrap_or(json!("auto")),
        "tools": v.get("tools").cloned().unwrap_or(json!([])),
        "top_p": v.get("top_p").cloned().unwrap_or(json!(1.0)),
        "truncation": "disabled", "usage": null, "user": null,
        "metadata": v.get("metadata").cloned().unwrap_or(json!({})),
    })
}

fn finish(
    resp: &mut Value,
    stop: &Stop,
    usage: &Usage,
    reasoning_tokens: usize,
    output: Vec<Value>,
) {
    resp["output"] = Value::Array(output);
    resp["usage"] = usage_json(usage, reasoning_tokens);
    if *stop == Stop::Length {
        resp["status"] = json!("incomplete");
        resp["incomplete_details"] = json!({"reason": "max_output_tokens"});
    } else {
        resp["status"] = json!("completed");
    }
}

/// `POST /v1/responses`.
pub async fn create(
    State(st): State<Arc<AppState>>,
    GenSlot(slot): GenSlot,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let v = parse_body(F, body)?;
    st.check_model(F, v["model"].as_str())?;
    if v["previous_response_id"].is_string() {
        return Err(ApiError::bad_param(
            F,
            "previous_response_id",
            "this server stores no responses: send the whole conversation in 'input'",
        ));
    }
    // Responses puts the schema fields beside `type`; the chat API nests them.
    let format = &v["text"]["format"];
    let grammar = match format["type"].as_str() {
        None | Some("text") => None,
        Some("json_schema") => Some(json!({"type": "json_schema", "json_schema": {
            "name": format["name"], "schema": format["schema"], "strict": format["strict"]}})),
        Some(_) => Some(format.clone()),
    }
    .map(|f| tempo9_grammar::Grammar::from_openai_response_format(&f))
    .transpose()
    .map_err(|e| ApiError::bad_param(F, "text.format", e.to_string()))?
    .flatten();
    let messages = to_messages(&v)?;
    let mut catalog = tools::Catalog::of_request(&v)?;
    // The catalogue keeps what it needs to map calls back; the template takes the list.
    let tools = std::mem::take(&mut catalog.chat_tools);
    let choice = tool_choice(&v)?;
    let parallel = boolean(&v, "parallel_tool_calls", F)?.unwrap_or(true);
    let stream = boolean(&v, "stream", F)?.unwrap_or(false);
    let params = GenParams {
        max_tokens: uint(&v, "max_output_tokens", F)?,
        sampling: sampling(&v, F)?,
        stop: Vec::new(),
        logprobs: false,
        top_logprobs: 0,
        grammar,
        no_speculation: boolean(&v, "speculation", F)? == Some(false),
        prediction: None,
    };
    let model = st.config.model_name.clone();
    // `reasoning.effort` as the chat API's `reasoning_effort` (as llama-server maps it).
    let mut template = crate::openai::template_options(&v, F)?;
    crate::openai::reasoning_effort(&mut template, v["reasoning"]["effort"].as_str());
    let prompt = Prompt::Chat {
        messages,
        tools,
        tool_choice: choice,
        template,
    };
    let (prepared, slot) = st
        .blocking(F, slot, move |st, c| {
            st.prepare_cancellable(F, prompt, params, true, c)
        })
        .await?;
    let mut gen = st.start(F, prepared, received).await?;
    let id = format!("resp_{}", random_id(32));
    let created = unix_time();
    let mut resp = skeleton(&v, &id, &model, created);
    if !stream {
        let c = gen.collect().await;
        drop(slot);
        if let Stop::Error(e) = &c.stop {
            return Err(ApiError::new(F, ErrorKind::Internal, e.clone()));
        }
        let mut output = Vec::new();
        if !c.reasoning.is_empty() {
            output.push(reasoning_item(
                &format!("rs_{}", random_id(24)),
                &c.reasoning,
                "completed",
            ));
        }
        if !c.text.is_empty() {
            output.push(message_item(
                &format!("msg_{}", random_id(24)),
                &c.text,
                "completed",
            ));
        }
        let calls = if parallel {
            &c.calls[..]
        } else {
            &c.calls[..c.calls.len().min(1)]
        };
        for call in calls {
            let prefix = if catalog.is_custom(call) { "ctc" } else { "fc" };
            output.push(catalog.call_item(
                &format!("{prefix}_{}", random_id(24)),
                &format!("call_{}", random_id(24)),
                call,
                "completed",
            ));
        }
        finish(&mut resp, &c.stop, &c.usage, c.reasoning_tokens, output);
        return Ok(axum::Json(resp).into_response());
    }
    gen.stream_calls();
    Ok(streaming("text/event-stream", move |tx| async move {
        let _slot = slot;
        let mut seq = 0u64;
        let mut ev = |ty: &str, mut data: Value| {
            data["type"] = json!(ty);
            data["sequence_number"] = json!(seq);
            seq += 1;
            sse_event(ty, &data)
        };
        let mut out = vec![
            ev("response.created", json!({"response": resp.clone()})),
            ev("response.in_progress", json!({"response": resp.clone()})),
        ];
        for b in out.drain(..) {
            if tx.send(b).await.is_err() {
                return;
            }
        }
        let mut output: Vec<Value> = Vec::new();
        // The open message item: (output index, item id, text so far).
        let mut msg: Option<(usize, String, String)> = None;
        let close_msg = |msg: &mut Option<(usize, String, String)>,
                         output: &mut Vec<Value>,
                         out: &mut Vec<Bytes>,
                         ev: &mut dyn FnMut(&str, Value) -> Bytes| {
            if let Some((oi, item_id, text)) = msg.take() {
                let part =
                    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                out.push(ev(
                    "response.output_text.done",
                    json!({"item_id": item_id, "output_index": oi,
                    "content_index": 0, "text": text, "logprobs": []}),
                ));
                out.push(ev(
                    "response.content_part.done",
                    json!({"item_id": item_id, "output_index": oi,
                    "content_index": 0, "part": part}),
                ));
                let item = message_item(&item_id, &text, "completed");
                out.push(ev(
                    "response.output_item.done",
                    json!({"output_index": oi, "item": item.clone()}),
                ));
                output.push(item);
            }
        };
        // The open reasoning item: (output index, item id, text so far).
        let mut thinking: Option<(usize, String, String)> = None;
        // The function call being streamed: (call index, output index, item id, call id).
        let mut open_call: Option<(usize, usize, String, String)> = None;
        let close_thinking =
            |thinking: &mut Option<(usize, String, String)>,
             output: &mut Vec<Value>,
             out: &mut Vec<Bytes>,
             ev: &mut dyn FnMut(&str, Value) -> Bytes| {
                if let Some((oi, item_id, text)) = thinking.take() {
                    out.push(ev(
                    "response.reasoning_text.done",
                    json!({"item_id": item_id, "output_index": oi, "content_index": 0, "text": text}),
                ));
                    let item = reasoning_item(&item_id, &text, "completed");
                    out.push(ev(
                        "response.output_item.done",
                        json!({"output_index": oi, "item": item.clone()}),
                    ));
                    output.push(item);
                }
            };
        loop {
            // `response.in_progress` again while a long prompt is prefilled.
            let ping = || ev("response.in_progress", json!({"response": resp.clone()}));
            let Some(events) = next_or_keepalive(&mut gen, &tx, ping).await else {
                break;
            };
            for e in events {
                match e {
                    GenEvent::Reasoning(t) => {
                        close_msg(&mut msg, &mut output, &mut out, &mut ev);
                        if thinking.is_none() {
                            let item_id = format!("rs_{}", random_id(24));
                            let oi = output.len();
                            out.push(ev(
                                "response.output_item.added",
                                json!({"output_index": oi,
                                "item": reasoning_item(&item_id, "", "in_progress")}),
                            ));
                            thinking = Some((oi, item_id, String::new()));
                        }
                        if let Some((oi, item_id, text)) = &mut thinking {
                            text.push_str(&t);
                            out.push(ev(
                                "response.reasoning_text.delta",
                                json!({"item_id": item_id, "output_index": oi,
                                "content_index": 0, "delta": t}),
                            ));
                        }
                    }
                    GenEvent::Text(t) => {
                        close_thinking(&mut thinking, &mut output, &mut out, &mut ev);
                        if msg.is_none() {
                            let item_id = format!("msg_{}", random_id(24));
                            let oi = output.len();
                            out.push(ev(
                                "response.output_item.added",
                                json!({"output_index": oi,
                                "item": message_item(&item_id, "", "in_progress")}),
                            ));
                            out.push(ev("response.content_part.added", json!({"item_id": item_id, "output_index": oi,
                                "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})));
                            msg = Some((oi, item_id, String::new()));
                        }
                        if let Some((oi, item_id, text)) = &mut msg {
                            text.push_str(&t);
                            out.push(ev(
                                "response.output_text.delta",
                                json!({"item_id": item_id, "output_index": oi,
                                "content_index": 0, "delta": t, "logprobs": []}),
                            ));
                        }
                    }
                    GenEvent::ToolCallStart { index, name } => {
                        let call = crate::tools::ToolCall {
                            name,
                            arguments: String::new(),
                        };
                        // Free-form input is not JSON: such a call comes whole.
                        if (!parallel && index > 0) || catalog.is_custom(&call) {
                            continue;
                        }
                        close_thinking(&mut thinking, &mut output, &mut out, &mut ev);
                        close_msg(&mut msg, &mut output, &mut out, &mut ev);
                        let oi = output.len();
                        let item_id = format!("fc_{}", random_id(24));
                        let call_id = format!("call_{}", random_id(24));
                        out.push(ev(
                            "response.output_item.added",
                            json!({"output_index": oi,
                            "item": catalog.call_item(&item_id, &call_id, &call, "in_progress")}),
                        ));
                        open_call = Some((index, oi, item_id, call_id));
                    }
                    GenEvent::ToolCallDelta { index, arguments } => {
                        if let Some((_, oi, item_id, _)) =
                            open_call.as_ref().filter(|c| c.0 == index)
                        {
                            out.push(ev(
                                "response.function_call_arguments.delta",
                                json!({"item_id": item_id, "output_index": oi, "delta": arguments}),
                            ));
                        }
                    }
                    GenEvent::ToolCall {
                        index,
                        call,
                        streamed,
                    } => {
                        if !parallel && index > 0 {
                            continue;
                        }
                        if let Some((_, oi, item_id, call_id)) =
                            open_call.take().filter(|c| c.0 == index)
                        {
                            // Streamed: the rest of its arguments, then its end.
                            let rest = call.arguments.get(streamed.unwrap_or(0)..);
                            if let Some(rest) = rest.filter(|r| !r.is_empty()) {
                                out.push(ev(
                                    "response.function_call_arguments.delta",
                                    json!({"item_id": item_id, "output_index": oi, "delta": rest}),
                                ));
                            }
                            let item = catalog.call_item(&item_id, &call_id, &call, "completed");
                            out.push(ev(
                                "response.function_call_arguments.done",
                                json!({"item_id": item_id,
                                "output_index": oi, "name": item["name"], "arguments": call.arguments}),
                            ));
                            out.push(ev(
                                "response.output_item.done",
                                json!({"output_index": oi, "item": item.clone()}),
                            ));
                            output.push(item);
                            continue;
                        }
                        close_thinking(&mut thinking, &mut output, &mut out, &mut ev);
                        close_msg(&mut msg, &mut output, &mut out, &mut ev);
                        let oi = output.len();
                        let custom = catalog.is_custom(&call);
                        let item_id =
                            format!("{}_{}", if custom { "ctc" } else { "fc" }, random_id(24));
                        let call_id = format!("call_{}", random_id(24));
                        out.push(ev(
                            "response.output_item.added",
                            json!({"output_index": oi,
                            "item": catalog.call_item(&item_id, &call_id, &call, "in_progress")}),
                        ));
                        let item = catalog.call_item(&item_id, &call_id, &call, "completed");
                        if custom {
                            out.push(ev(
                                "response.custom_tool_call_input.delta",
                                json!({"item_id": item_id, "output_index": oi, "delta": item["input"]}),
                            ));
                            out.push(ev(
                                "response.custom_tool_call_input.done",
                                json!({"item_id": item_id, "output_index": oi, "input": item["input"]}),
                            ));
                        } else {
                            out.push(ev(
                                "response.function_call_arguments.delta",
                                json!({"item_id": item_id,
                                "output_index": oi, "delta": call.arguments}),
                            ));
                            out.push(ev(
                                "response.function_call_arguments.done",
                                json!({"item_id": item_id,
                                "output_index": oi, "name": item["name"], "arguments": call.arguments}),
                            ));
                        }
                        out.push(ev(
                            "response.output_item.done",
                            json!({"output_index": oi, "item": item.clone()}),
                        ));
                        output.push(item);
                    }
                    GenEvent::Logprobs(_) => {}
                    GenEvent::Done {
                        stop,
                        usage,
                        reasoning_tokens,
                    } => {
                        close_thinking(&mut thinking, &mut output, &mut out, &mut ev);
                        close_msg(&mut msg, &mut output, &mut out, &mut ev);
                        if let Stop::Error(m) = &stop {
                            resp["status"] = json!("failed");
                            resp["error"] = json!({"code": "server_error", "message": m});
                            out.push(ev("response.failed", json!({"response": resp.clone()})));
                        } else {
                            finish(
                                &mut resp,
                                &stop,
                                &usage,
                                reasoning_tokens,
                                std::mem::take(&mut output),
                            );
                            let ty = if stop == Stop::Length {
                                "response.incomplete"
                            } else {
                                "response.completed"
                            };
                            out.push(ev(ty, json!({"response": resp.clone()})));
                        }
                    }
                }
            }
            for b in out.drain(..) {
                if tx.send(b).await.is_err() {
                    return;
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_items() {
        let v = json!({"instructions": "Be brief.", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18C"},
            {"type": "function_call_output", "call_id": "c2", "output": "noon"}]});
        let m = to_messages(&v).unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[1]["content"], "Weather?");
        assert_eq!(m[2]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(m[3]["tool_call_id"], "c1");
        assert_eq!(m.len(), 5);
        assert!(to_messages(&json!({"input": [{"type": "computer_call"}]})).is_err());
        assert!(to_messages(&json!({})).is_err());
    }

    #[test]
    fn input_images_become_image_url_parts() {
        let v = json!({"input": [{"role": "user", "content": [
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"}]}]});
        let m = to_messages(&v).unwrap();
        assert_eq!(
            m[0]["content"],
            json!([{"type": "text", "text": "What is this?"},
                   {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}])
        );
        let by_file = json!({"input": [{"role": "user", "content": [
            {"type": "input_image", "file_id": "file-1"}]}]});
        let e = to_messages(&by_file).unwrap_err();
        assert!(format!("{e:?}").contains("file_id"), "{e:?}");
    }

    #[test]
    fn converts_tools_and_choice() {
        let t = to_tools(
            &json!({"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}},
                                           {"type": "web_search"},
                                           {"type": "function", "name": "g", "defer_loading": true}]}),
        )
        .unwrap();
        assert_eq!(
            t,
            vec![
                json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})
            ]
        );
        assert_eq!(
            tool_choice(&json!({"tool_choice": {"type": "function", "name": "f"}})).unwrap(),
            ToolChoice::Named("f".into())
        );
    }

    #[test]
    fn additional_tools_items() {
        // Codex's request for its own default model: tools in an input item.
        let v = json!({"input": [
            {"type": "additional_tools", "role": "developer", "tools": [
                {"type": "function", "name": "h", "parameters": {"type": "object"}},
                {"type": "custom", "name": "exec", "format": {"type": "grammar"}},
                {"type": "namespace", "name": "clock", "tools": [{"type": "function", "name": "sleep"}]}]},
            {"role": "user", "content": "Hi"}],
            "tools": [{"type": "function", "name": "f"}]});
        let names: Vec<Value> = to_tools(&v)
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].clone())
            .collect();
        assert_eq!(
            names,
            [json!("f"), json!("h"), json!("exec"), json!("clock__sleep")]
        );
        let m = to_messages(&v).unwrap();
        assert_eq!(m, [json!({"role": "user", "content": "Hi"})]);
    }

    #[test]
    fn custom_and_namespaced_calls_in_the_history() {
        let v = json!({"input": [
            {"role": "user", "content": "List files"},
            {"type": "custom_tool_call", "call_id": "c1", "name": "exec", "input": "text(1)"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "1"},
            {"type": "function_call", "call_id": "c2", "namespace": "clock", "name": "sleep", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c2", "output": "slept"}]});
        let m = to_messages(&v).unwrap();
        assert_eq!(m[1]["tool_calls"][0]["function"]["name"], "exec");
        assert_eq!(
            m[1]["tool_calls"][0]["function"]["arguments"],
            r#"{"input":"text(1)"}"#
        );
        assert_eq!(
            m[2],
            json!({"role": "tool", "tool_call_id": "c1", "content": "1"})
        );
        assert_eq!(m[3]["tool_calls"][0]["function"]["name"], "clock__sleep");
        assert_eq!(
            tool_choice(
                &json!({"tool_choice": {"type": "function", "namespace": "clock", "name": "sleep"}})
            )
            .unwrap(),
            ToolChoice::Named("clock__sleep".into())
        );
    }

    #[test]
    fn reasoning_items_and_effort() {
        let v = json!({"input": [
            {"role": "user", "content": "Weather?"},
            {"type": "reasoning", "summary": [],
             "content": [{"type": "reasoning_text", "text": "Call the tool."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18C"}]});
        let m = to_messages(&v).unwrap();
        assert_eq!(m[1]["reasoning_content"], "Call the tool.");
        assert_eq!(m[1]["tool_calls"][0]["id"], "c1");
        let item = reasoning_item("rs_1", "Hmm.", "completed");
        assert_eq!(
            item["content"][0],
            json!({"type": "reasoning_text", "text": "Hmm."})
        );
    }
}
