//! Ollama API: `/api/chat`, `/api/generate` (NDJSON streaming by default),
//! `/api/tags`, `/api/show`, `/api/ps`, `/api/version`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::chat::{GenEvent, GenParams, Prompt, Stop, TemplateOptions, ToolChoice};
use crate::error::{ApiError, ErrorKind, Family};
use crate::openai::{chat_tools, sampling, stop_strings};
use crate::{parse_body, streaming, AppState, GenSlot};

const F: Family = Family::Ollama;

/// The Ollama version reported (clients gate features on it).
pub const OLLAMA_VERSION: &str = "0.12.6";

/// RFC 3339 UTC timestamp with nanoseconds, like Ollama's `created_at`.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_nanos()
    )
}

fn now() -> String {
    rfc3339(std::time::SystemTime::now())
}

/// Ollama `options` → generation parameters (`num_predict` < 0 means no limit).
fn params_of(v: &Value) -> Result<GenParams, ApiError> {
    let opts = match v.get("options") {
        None | Some(Value::Null) => json!({}),
        Some(o @ Value::Object(_)) => o.clone(),
        Some(_) => return Err(ApiError::bad(F, "'options' must be an object")),
    };
    let max_tokens = match opts.get("num_predict") {
        None | Some(Value::Null) => None,
        Some(n) => match n.as_i64() {
            Some(n) if n < 0 => None,
            Some(0) => return Err(ApiError::bad(F, "num_predict must not be 0")),
            Some(n) => Some(n as usize),
            None => return Err(ApiError::bad(F, "num_predict must be an integer")),
        },
    };
    Ok(GenParams {
        max_tokens,
        sampling: sampling(&opts, F)?,
        stop: stop_strings(&opts, "stop", F)?,
        logprobs: false,
        top_logprobs: 0,
        grammar: format_grammar(v)?,
        no_speculation: crate::openai::boolean(&opts, "speculation", F)? == Some(false),
        prediction: None,
    })
}

/// Every conversion of an Ollama request body to engine parameters that the
/// handlers run before a model sees it (options, format, thinking), results
/// dropped: for the fuzz targets ([`crate::request_glue`]).
pub(crate) fn glue(v: &Value) {
    let _ = params_of(v);
    let _ = template_options(v);
}

/// `format` (`"json"` or a JSON schema) as a grammar.
fn format_grammar(v: &Value) -> Result<Option<tempo9_grammar::Grammar>, ApiError> {
    tempo9_grammar::Grammar::from_ollama_format(v.get("format").unwrap_or(&Value::Null))
        .map_err(|e| ApiError::bad(F, e.to_string()))
}

/// Ollama chat messages → OpenAI-shaped messages (tool-call arguments as JSON text).
pub fn to_openai_messages(v: &Value) -> Result<Vec<Value>, ApiError> {
    let msgs = v
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad(F, "'messages' must be an array"))?;
    let mut out = Vec::new();
    let mut call_no = 0;
    for (i, m) in msgs.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or("");
        if !matches!(role, "system" | "user" | "assistant" | "tool") {
            return Err(ApiError::bad(
                F,
                format!("messages[{i}].role must be system, user, assistant or tool"),
            ));
        }
        let content = match &m["content"] {
            Value::Null => String::new(),
            Value::String(s) => s.clone(),
            _ => {
                return Err(ApiError::bad(
                    F,
                    format!("messages[{i}].content must be a string"),
                ))
            }
        };
        let images = images_of(&m["images"], &format!("messages[{i}].images"))?;
        let mut msg = if images.is_empty() {
            json!({"role": role, "content": content})
        } else {
            json!({"role": role, "content": with_images(images, content)})
        };
        if let Some(calls) = m["tool_calls"].as_array() {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    call_no += 1;
                    let args = &c["function"]["arguments"];
                    json!({"id": c["id"].as_str().map(str::to_string).unwrap_or(format!("call_{call_no}")),
                           "type": "function",
                           "function": {"name": c["function"]["name"].as_str().unwrap_or(""),
                                        "arguments": if let Value::String(s) = args { s.clone() } else { args.to_string() }}})
                })
                .collect();
            msg["tool_calls"] = Value::Array(calls);
        }
        if role == "tool" {
            if let Some(n) = m["tool_name"].as_str().or(m["name"].as_str()) {
                msg["name"] = json!(n);
            }
            msg["tool_call_id"] = json!(m["tool_call_id"].as_str().unwrap_or(""));
        }
        if let Some(t) = m["thinking"].as_str().filter(|t| !t.is_empty()) {
            msg["reasoning_content"] = json!(t);
        }
        out.push(msg);
    }
    Ok(out)
}

/// Ollama's `images` (base64 strings, no data: prefix) as image parts; `field`
/// names them in errors.
fn images_of(v: &Value, field: &str) -> Result<Vec<Value>, ApiError> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(a) => a
            .iter()
            .map(|x| {
                x.as_str()
                    // The format is sniffed from the bytes.
                    .map(|b64| crate::vision::image_part(crate::vision::data_url("image", b64)))
                    .ok_or_else(|| ApiError::bad(F, format!("{field} must be base64 strings")))
            })
            .collect(),
        _ => Err(ApiError::bad(F, format!("{field} must be an array"))),
    }
}

/// Content parts: the images, then the text (Ollama puts a message's images
/// before its text).
fn with_images(images: Vec<Value>, text: String) -> Value {
    let mut parts = images;
    if !text.is_empty() {
        parts.push(json!({"type": "text", "text": text}));
    }
    Value::Array(parts)
}

fn done_reason(s: &Stop) -> &'static str {
    match s {
        Stop::Length => "length",
        _ => "stop",
    }
}

fn ollama_call(call: &crate::tools::ToolCall, index: usize) -> Value {
    let args: Value = serde_json::from_str(&call.arguments).unwrap_or(json!({}));
    json!({"function": {"index": index, "name": call.name, "arguments": args}})
}

struct Timing {
    received: Instant,
    first: Option<Instant>,
}

impl Timing {
    fn stats(&self, prompt: usize, completion: usize) -> Value {
        let end = Instant::now();
        let first = self.first.unwrap_or(end);
        let ns = |d: Duration| d.as_nanos() as u64;
        json!({"total_duration": ns(end - self.received), "load_duration": 0,
               "prompt_eval_count": prompt, "prompt_eval_duration": ns(first - self.received),
               "eval_count": completion, "eval_duration": ns(end - first)})
    }
}

fn merge(mut a: Value, b: Value) -> Value {
    if let (Some(a), Value::Object(b)) = (a.as_object_mut(), b) {
        a.extend(b);
    }
    a
}

fn line(v: &Value) -> Bytes {
    Bytes::from(format!("{v}\n"))
}

/// `POST /api/chat` and `POST /api/generate` share this driver.
async fn run(
    st: Arc<AppState>,
    v: Value,
    prompt: Prompt,
    chat: bool,
    received: Instant,
    slot: tokio::sync::OwnedSemaphorePermit,
) -> Result<Response, ApiError> {
    let params = params_of(&v)?;
    let stream = v["stream"].as_bool().unwrap_or(true);
    // The real name, whatever the request named (see `model_names`).
    let model = st.config.model_name.clone();
    let (prepared, slot) = st
        .blocking(F, slot, move |st, c| {
            st.prepare_cancellable(F, prompt, params, true, c)
        })
        .await?;
    let mut gen = st.start(F, prepared, received).await?;
    let mut timing = Timing {
        received,
        first: None,
    };
    let piece = move |text: &str, thinking: &str, calls: Vec<Value>| -> Value {
        if chat {
            let mut m = json!({"role": "assistant", "content": text});
            if !thinking.is_empty() {
                m["thinking"] = json!(thinking);
            }
            if !calls.is_empty() {
                m["tool_calls"] = Value::Array(calls);
            }
            json!({"message": m})
        } else {
            let mut r = json!({"response": text});
            if !thinking.is_empty() {
                r["thinking"] = json!(thinking);
            }
            r
        }
    };
    if !stream {
        let c = gen.collect().await;
        drop(slot);
        if let Stop::Error(e) = &c.stop {
            return Err(ApiError::new(F, ErrorKind::Internal, e.clone()));
        }
        timing.first = Some(received);
        let calls = c
            .calls
            .iter()
            .enumerate()
            .map(|(i, c)| ollama_call(c, i))
            .collect();
        let mut out = merge(
            json!({"model": model, "created_at": now()}),
            piece(&c.text, &c.reasoning, calls),
        );
        out = merge(
            out,
            json!({"done": true, "done_reason": done_reason(&c.stop)}),
        );
        out = merge(
            out,
            timing.stats(c.usage.prompt_tokens, c.usage.completion_tokens),
        );
        if !chat {
            out["context"] = json!([]);
        }
        return Ok(axum::Json(out).into_response());
    }
    Ok(streaming("application/x-ndjson", move |tx| async move {
        let _slot = slot;
        while let Some(events) = gen.next().await {
            for e in events {
                let p = match e {
                    GenEvent::Text(t) => piece(&t, "", vec![]),
                    GenEvent::Reasoning(t) => piece("", &t, vec![]),
                    GenEvent::ToolCall { index, call, .. } => {
                        piece("", "", vec![ollama_call(&call, index)])
                    }
                    // Ollama's API sends calls whole (calls are not streamed here).
                    GenEvent::ToolCallStart { .. }
                    | GenEvent::ToolCallDelta { .. }
                    | GenEvent::Logprobs(_) => continue,
                    GenEvent::Done { stop, usage, .. } => {
                        if let Stop::Error(msg) = &stop {
                            let _ = tx.send(line(&json!({"error": msg}))).await;
                            return;
                        }
                        let mut out = merge(
                            json!({"model": model, "created_at": now()}),
                            piece("", "", vec![]),
                        );
                        out = merge(
                            out,
                            json!({"done": true, "done_reason": done_reason(&stop)}),
                        );
                        out = merge(
                            out,
                            timing.stats(usage.prompt_tokens, usage.completion_tokens),
                        );
                        if !chat {
                            out["context"] = json!([]);
                        }
                        let _ = tx.send(line(&out)).await;
                        return;
                    }
                };
                timing.first.get_or_insert_with(Instant::now);
                let out = merge(
                    merge(json!({"model": model, "created_at": now()}), p),
                    json!({"done": false}),
                );
                if tx.send(line(&out)).await.is_err() {
                    return;
                }
            }
        }
    }))
}

/// The answer Ollama gives to a request without input: the model is "loaded".
fn load_response(model: &str, chat: bool) -> Response {
    let mut v = json!({"model": model, "created_at": now(), "done": true, "done_reason": "load"});
    if chat {
        v["message"] = json!({"role": "assistant", "content": ""});
    } else {
        v["response"] = json!("");
    }
    axum::Json(v).into_response()
}

/// Ollama's `think`: `true`/`false` switches the template's thinking; an
/// effort (`"high"`, `"medium"`, `"low"`) turns it on and reaches the template
/// as `reasoning_effort`.
fn template_options(v: &Value) -> Result<TemplateOptions, ApiError> {
    let mut o = TemplateOptions::default();
    match &v["think"] {
        Value::Null => {}
        Value::Bool(b) => o.enable_thinking = Some(*b),
        Value::String(e) if matches!(e.as_str(), "high" | "medium" | "low") => {
            o.enable_thinking = Some(true);
            crate::openai::reasoning_effort(&mut o, Some(e));
        }
        _ => {
            return Err(ApiError::bad(
                F,
                "'think' must be true, false, \"high\", \"medium\" or \"low\"",
            ))
        }
    }
    Ok(o)
}

/// `POST /api/chat`.
pub async fn chat(
    State(st): State<Arc<AppState>>,
    GenSlot(slot): GenSlot,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let received = Instant::now();
    let r = async {
        let v = parse_body(F, body)?;
        st.check_model(F, v["model"].as_str())?;
        let messages = to_openai_messages(&v)?;
        if messages.is_empty() {
            return Ok(load_response(&st.config.model_name, true));
        }
        let tools = chat_tools(&v, F)?;
        let prompt = Prompt::Chat {
            messages,
            tools,
            tool_choice: ToolChoice::Auto,
            template: template_options(&v)?,
        };
        run(st.clone(), v, prompt, true, received, slot).await
    }
    .await;
    r.unwrap_or_else(|e| e.into_response())
}

/// `POST /api/generate`.
pub async fn generate(
    State(st): State<Arc<AppState>>,
    GenSlot(slot): GenSlot,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let received = Instant::now();
    let r = async {
        let v = parse_body(F, body)?;
        st.check_model(F, v["model"].as_str())?;
        let text = match &v["prompt"] {
            Value::Null => String::new(),
            Value::String(s) => s.clone(),
            _ => return Err(ApiError::bad(F, "'prompt' must be a string")),
        };
        if text.is_empty() {
            return Ok(load_response(&st.config.model_name, false));
        }
        let images = images_of(&v["images"], "images")?;
        let prompt = if v["raw"].as_bool().unwrap_or(false) {
            if !images.is_empty() {
                return Err(ApiError::bad(
                    F,
                    "images need the chat template: a raw prompt cannot hold them",
                ));
            }
            Prompt::Text(text)
        } else {
            let mut messages = Vec::new();
            if let Some(s) = v["system"].as_str().filter(|s| !s.is_empty()) {
                messages.push(json!({"role": "system", "content": s}));
            }
            let content = if images.is_empty() {
                json!(text)
            } else {
                with_images(images, text)
            };
            messages.push(json!({"role": "user", "content": content}));
            Prompt::Chat {
                messages,
                tools: Vec::new(),
                tool_choice: ToolChoice::None,
                template: template_options(&v)?,
            }
        };
        run(st.clone(), v, prompt, false, received, slot).await
    }
    .await;
    r.unwrap_or_else(|e| e.into_response())
}

fn details(st: &AppState) -> Value {
    json!({"parent_model": "", "format": "gguf", "family": st.info.arch,
           "families": [st.info.arch], "parameter_size": st.info.parameter_size(),
           "quantization_level": st.info.quantization})
}

fn digest(st: &AppState) -> String {
    st.config
        .digest
        .clone()
        .map(|d| d.trim_start_matches("sha256:").to_string())
        .unwrap_or_default()
}

/// `GET /api/tags`.
pub async fn tags(State(st): State<Arc<AppState>>) -> Response {
    let modified = rfc3339(std::time::UNIX_EPOCH + Duration::from_secs(st.info.modified));
    let name = &st.config.model_name;
    axum::Json(
        json!({"models": [{"name": name, "model": name, "modified_at": modified,
        "size": st.info.size, "digest": digest(&st), "details": details(&st)}]}),
    )
    .into_response()
}

/// `GET /api/ps`.
pub async fn ps(State(st): State<Arc<AppState>>) -> Response {
    let name = &st.config.model_name;
    let expires = rfc3339(std::time::SystemTime::now() + Duration::from_secs(365 * 86_400));
    axum::Json(
        json!({"models": [{"name": name, "model": name, "size": st.info.size,
        "digest": digest(&st), "details": details(&st), "expires_at": expires,
        "size_vram": 0, "context_length": st.engine.max_context()}]}),
    )
    .into_response()
}

/// `POST /api/show`.
pub async fn show(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = (|| {
        let v = parse_body(F, body)?;
        let name = v["model"].as_str().or(v["name"].as_str());
        if name.is_none_or(str::is_empty) {
            return Err(ApiError::bad(F, "'model' is required"));
        }
        st.check_model(F, name)?;
        let mut caps = vec!["completion"];
        if st.vision.is_some() {
            caps.push("vision");
        }
        if st.tool_format != crate::tools::ToolFormat::None {
            caps.push("tools");
        }
        // Ollama's clients send `think` only to models that list it.
        let channels = matches!(
            st.tool_format,
            crate::tools::ToolFormat::Harmony | crate::tools::ToolFormat::Gemma4
        );
        if st.think || channels {
            caps.push("thinking");
        }
        let mut info = st.info.metadata.clone();
        info.insert(
            format!("{}.context_length", st.info.arch),
            json!(st.engine.max_context()),
        );
        Ok(axum::Json(json!({
            "modelfile": format!("FROM {}\n", st.info.path.display()),
            "parameters": "",
            "template": st.template.source(),
            "details": details(&st),
            "model_info": info,
            "capabilities": caps,
            "modified_at": rfc3339(std::time::UNIX_EPOCH + Duration::from_secs(st.info.modified)),
        }))
        .into_response())
    })();
    r.unwrap_or_else(|e: ApiError| e.into_response())
}

/// `GET /api/version`.
pub async fn version() -> Response {
    axum::Json(json!({"version": OLLAMA_VERSION})).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_timestamps() {
        let t = std::time::UNIX_EPOCH + Duration::new(1_700_000_000, 5);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20.000000005Z");
        assert_eq!(
            rfc3339(std::time::UNIX_EPOCH),
            "1970-01-01T00:00:00.000000000Z"
        );
        let leap = std::time::UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert!(rfc3339(leap).starts_with("2000-02-29T00:00:00"));
    }

    #[test]
    fn converts_messages_and_options() {
        let v = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
            {"role": "tool", "content": "42", "tool_name": "f"}]});
        let m = to_openai_messages(&v).unwrap();
        assert_eq!(m[1]["tool_calls"][0]["function"]["arguments"], r#"{"a":1}"#);
        assert_eq!(m[2]["name"], "f");
        assert!(to_openai_messages(&json!({"messages": [{"role": "x"}]})).is_err());
        let p =
            params_of(&json!({"options": {"num_predict": 5, "temperature": 0, "stop": ["\n"]}}))
                .unwrap();
        assert_eq!(p.max_tokens, Some(5));
        assert_eq!(p.sampling.temperature, 0.0);
        assert_eq!(p.stop, vec!["\n"]);
        assert_eq!(
            params_of(&json!({"options": {"num_predict": -1}}))
                .unwrap()
                .max_tokens,
            None
        );
        assert!(params_of(&json!({"options": 3})).is_err());
    }

    #[test]
    fn think_switch() {
        assert_eq!(
            template_options(&json!({"think": false}))
                .unwrap()
                .enable_thinking,
            Some(false)
        );
        assert_eq!(
            template_options(&json!({"think": true}))
                .unwrap()
                .enable_thinking,
            Some(true)
        );
        let o = template_options(&json!({"think": "low"})).unwrap();
        assert_eq!(o.enable_thinking, Some(true));
        assert_eq!(o.kwargs["reasoning_effort"], "low");
        assert_eq!(template_options(&json!({})).unwrap().enable_thinking, None);
        assert!(template_options(&json!({"think": "maybe"})).is_err());
    }
}
