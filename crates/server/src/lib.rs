//! Tempo9's HTTP server: the OpenAI, Anthropic and Ollama APIs over one
//! [`EngineHandle`].
//!
//! The server holds no model state: it renders chat templates, tokenizes,
//! maps each API's parameters to an engine [`tempo9_engine::Request`], and maps
//! the engine's events back to each API's wire format (JSON, SSE or NDJSON),
//! parsing tool calls per model family ([`tools`]). One adapter module per API
//! family: [`openai`] (chat completions, completions, models), [`responses`]
//! (OpenAI Responses), [`anthropic`] (messages, count_tokens), [`ollama`].

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod access;
pub mod anthropic;
pub mod chat;
pub mod error;
mod listen;
pub mod metrics;
pub mod model_names;
pub mod ollama;
pub mod ollama_store;
pub mod openai;
pub mod responses;
pub mod status;
pub mod tools;
pub mod vision;

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use tempo9_engine::EngineHandle;
use tempo9_gguf::GgufFile;
use tempo9_tokenizer::ChatTemplate;
use tokio::sync::{mpsc, Semaphore};

use crate::error::{ApiError, ErrorKind, Family};
pub use crate::listen::{serve, serve_on, shutdown_signal, SHUTDOWN_GRACE};

/// Runs the request-body conversions the Ollama and Anthropic handlers keep
/// private (Ollama `options`/`format`/`think`, Anthropic `tool_choice`/`thinking`
/// and the whole prompt) on `v` and drops the results: an entry point for the
/// fuzz targets (`crates/fuzz-targets`), which must find no panic in them.
#[doc(hidden)]
pub fn request_glue(v: &serde_json::Value) {
    ollama::glue(v);
    anthropic::glue(v);
}
use crate::metrics::Metrics;
use crate::tools::ToolFormat;

/// Default of `--max-concurrent`: generation requests in flight (rendering,
/// waiting in the engine's queue or running) before the server answers 429
/// (Anthropic: 529). Twice the engine's default running batch (64): enough to
/// keep the batch full, few enough that a flood is refused instead of queued
/// for minutes.
pub const DEFAULT_MAX_CONCURRENT: usize = 128;

/// Output budget of a request that names none (`max_tokens` absent): a bound
/// instead of the whole context, below `--max-tokens` and the context left.
pub const DEFAULT_OUTPUT_TOKENS: usize = 16384;

/// Server settings (the `tempo9 serve` flags).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on.
    pub host: String,
    /// Port to listen on.
    pub port: u16,
    /// Required key (`Authorization: Bearer KEY` or `x-api-key: KEY`); `None` = open.
    pub api_key: Option<String>,
    /// The model's name in the APIs (`/v1/models`, `/api/tags`, responses).
    pub model_name: String,
    /// Other names requests may use for the model.
    pub aliases: Vec<String>,
    /// Answer requests naming any model, other local models' names included.
    pub any_model: bool,
    /// Answer only the served name and its aliases (404 for others); by
    /// default unknown names are answered by the served model (see
    /// [`model_names`]).
    pub strict_model_names: bool,
    /// Other models on this machine, whose names stay a 404.
    pub local_models: model_names::LocalModels,
    /// Largest request body in bytes (413 above).
    pub max_body_bytes: usize,
    /// Cap on generated tokens per request (`None`: the context limit; a
    /// request naming no limit gets [`DEFAULT_OUTPUT_TOKENS`] at most).
    pub max_tokens: Option<usize>,
    /// Most generation requests in flight in the server (429 / 529 above).
    pub max_concurrent: usize,
    /// Most tokens (prompt plus output budget) of the generations in flight
    /// together (`--max-total-tokens`; 429 / 529 above); `None`: no limit.
    pub max_total_tokens: Option<usize>,
    /// System-prompt lines starting with one of these are removed (per-request
    /// volatile text that would defeat prefix caching).
    pub volatile_prefixes: Vec<String>,
    /// Digest to report for the model (Ollama's, when resolved from its store).
    pub digest: Option<String>,
    /// A chat template (Jinja source) to use instead of the model's.
    pub chat_template: Option<String>,
    /// Show the start of each request's prompt on the status page
    /// (`/v1/status`); off by default, since prompts may be private.
    pub status_prompts: bool,
    /// Accepted `Host` names and CORS origins (see [`access`]).
    pub access: access::AccessConfig,
    /// Time a client has to send its request body (408 after).
    pub body_timeout: std::time::Duration,
    /// Time a client has to send its request head, and the longest a
    /// keep-alive connection may sit idle between requests.
    pub header_timeout: std::time::Duration,
    /// Most open client connections; further ones wait to be accepted.
    pub max_connections: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 11435,
            api_key: None,
            model_name: "tempo9".into(),
            aliases: Vec::new(),
            any_model: false,
            strict_model_names: false,
            local_models: model_names::LocalModels::default(),
            max_body_bytes: 32 << 20,
            max_tokens: None,
            max_concurrent: DEFAULT_MAX_CONCURRENT,
            max_total_tokens: None,
            volatile_prefixes: vec!["x-anthropic-billing-header:".into()],
            digest: None,
            chat_template: None,
            status_prompts: false,
            access: access::AccessConfig::default(),
            body_timeout: std::time::Duration::from_secs(60),
            header_timeout: std::time::Duration::from_secs(30),
            max_connections: 512,
        }
    }
}

/// Facts about the served model, from its GGUF file.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The GGUF path.
    pub path: PathBuf,
    /// File size in bytes.
    pub size: u64,
    /// `general.architecture`.
    pub arch: String,
    /// Parameter count.
    pub n_params: u64,
    /// Quantization name (e.g. `Q4_K_M`).
    pub quantization: String,
    /// Trained context length.
    pub context_length: Option<u64>,
    /// Selected metadata for `/api/show` (scalars only).
    pub metadata: serde_json::Map<String, Value>,
    /// File modification time (seconds since the epoch).
    pub modified: u64,
}

impl ModelInfo {
    /// Reads the facts from an open GGUF file at `path`.
    pub fn from_gguf(f: &GgufFile, path: PathBuf) -> ModelInfo {
        let md = f.metadata();
        let arch = f.architecture().unwrap_or("unknown").to_string();
        let n_params = f.tensors().iter().map(|t| t.n_elements()).sum();
        let ftype = md.get_u32("general.file_type").ok().flatten();
        let meta_file = std::fs::metadata(&path).ok();
        let mut metadata = serde_json::Map::new();
        for (k, v) in md.iter() {
            if k.starts_with("tokenizer.") {
                continue;
            }
            let j = if let Some(i) = v.as_integer() {
                json!(i as i64)
            } else if let tempo9_gguf::Value::String(s) = v {
                json!(s)
            } else if let tempo9_gguf::Value::F32(x) = v {
                json!(x)
            } else if let tempo9_gguf::Value::Bool(b) = v {
                json!(b)
            } else {
                continue;
            };
            metadata.insert(k.to_string(), j);
        }
        metadata.insert("general.parameter_count".into(), json!(n_params));
        ModelInfo {
            size: meta_file.as_ref().map(|m| m.len()).unwrap_or(0),
            modified: meta_file
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs())
                .unwrap_or(0),
            context_length: md
                .get_u32(&format!("{arch}.context_length"))
                .ok()
                .flatten()
                .map(u64::from),
            quantization: ftype.map(file_type_name).unwrap_or("unknown").to_string(),
            arch,
            n_params,
            metadata,
            path,
        }
    }

    /// Parameter count as Ollama writes it (`494.03M`, `7.6B`).
    pub fn parameter_size(&self) -> String {
        let n = self.n_params as f64;
        if n >= 1e9 {
            format!("{:.1}B", n / 1e9)
        } else {
            format!("{:.2}M", n / 1e6)
        }
    }
}

/// llama.cpp's `general.file_type` names.
fn file_type_name(t: u32) -> &'static str {
    match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4",
        _ => "unknown",
    }
}

/// Shared state of all handlers.
pub struct AppState {
    /// The engine.
    pub engine: EngineHandle,
    /// The model's chat template.
    pub template: ChatTemplate,
    /// The model's tool-call syntax.
    pub tool_format: ToolFormat,
    /// The template teaches `<think>…</think>` reasoning: it is split off
    /// the output (harmony and Gemma 4 parse their own reasoning channels).
    pub think: bool,
    /// Model facts.
    pub info: ModelInfo,
    /// Settings.
    pub config: ServerConfig,
    /// Server-side measurements.
    pub metrics: Metrics,
    /// Generations in flight, for the status page.
    pub status: Arc<status::StatusRegistry>,
    /// What requests' model names mean.
    pub names: model_names::ModelNames,
    /// Generation requests in flight.
    slots: Arc<Semaphore>,
    /// Tokens (prompt plus output budget) of the generations in flight, counted
    /// against [`ServerConfig::max_total_tokens`].
    admitted_tokens: Arc<std::sync::atomic::AtomicUsize>,
    /// When the server started.
    pub started: Instant,
    /// The model's vision (`None`: a text-only model, or served without a
    /// projector): requests with images get a 400 then.
    pub vision: Option<vision::Vision>,
}

impl AppState {
    /// State for serving `engine`'s model with `config`.
    pub fn new(engine: EngineHandle, config: ServerConfig) -> anyhow::Result<AppState> {
        let gguf = engine.model().gguf().clone();
        let template = match &config.chat_template {
            Some(src) => ChatTemplate::for_tokenizer(src, engine.tokenizer())?,
            None => ChatTemplate::for_model(&gguf, engine.tokenizer())?,
        };
        let info = ModelInfo::from_gguf(&gguf, PathBuf::new());
        let tool_format = ToolFormat::detect(template.source(), &info.arch);
        let think = crate::tools::think::detect(template.source())
            && !matches!(tool_format, ToolFormat::Harmony | ToolFormat::Gemma4);
        let vision = engine
            .vision()
            .map(|enc| vision::Vision::new(enc.clone(), engine.tokenizer()));
        Ok(AppState {
            vision,
            names: names_of(&config, None),
            slots: Arc::new(Semaphore::new(config.max_concurrent.max(1))),
            admitted_tokens: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            engine,
            template,
            tool_format,
            think,
            info,
            config,
            metrics: Metrics::new(),
            status: status::StatusRegistry::new(),
            started: Instant::now(),
        })
    }

    /// Sets the model file's path (for size and modification time).
    pub fn with_path(mut self, path: PathBuf) -> Self {
        let gguf = self.engine.model().gguf().clone();
        self.names = names_of(&self.config, Some(&path));
        self.info = ModelInfo::from_gguf(&gguf, path);
        self
    }

    /// Checks a request's `model` field: absent, served, or answered by the
    /// served model (see [`model_names`]); 404 for names it refuses.
    pub fn check_model(&self, family: Family, model: Option<&str>) -> Result<(), ApiError> {
        self.names.check(family, model)
    }

    /// Takes `n` tokens (a request's prompt plus output budget) of the server-wide
    /// token limit until the returned reservation is dropped, or 429 (Anthropic:
    /// 529) when the generations in flight already hold too many. `n` is at most
    /// the limit ([`crate::chat`] shortens output budgets to fit it).
    pub fn reserve_tokens(&self, family: Family, n: usize) -> Result<TokenReservation, ApiError> {
        use std::sync::atomic::Ordering;
        let Some(limit) = self.config.max_total_tokens else {
            return Ok(TokenReservation {
                counter: None,
                n: 0,
            });
        };
        self.admitted_tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + n <= limit).then_some(held + n)
            })
            .map_err(|held| {
                ApiError::new(
                    family,
                    ErrorKind::Overloaded,
                    format!(
                        "the server's token limit is taken: {held} of {limit} tokens (prompts plus \
                         output budgets) are in flight and this request needs {n} \
                         (--max-total-tokens)"
                    ),
                )
            })?;
        Ok(TokenReservation {
            counter: Some(self.admitted_tokens.clone()),
            n,
        })
    }

    /// Tokens of the server-wide limit held by generations in flight now.
    pub fn admitted_tokens(&self) -> usize {
        self.admitted_tokens
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// A slot for one generation request, or 429 (Anthropic: 529) when the
    /// server is at its limit.
    pub fn slot(&self, family: Family) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        self.slots.clone().try_acquire_owned().map_err(|_| {
            ApiError::new(
                family,
                ErrorKind::Overloaded,
                format!(
                    "too many concurrent requests (limit {})",
                    self.config.max_concurrent
                ),
            )
        })
    }
}

/// The model-name rules of `config`; other local models count once the
/// served file's `path` is known.
fn names_of(config: &ServerConfig, path: Option<&std::path::Path>) -> model_names::ModelNames {
    let names = model_names::ModelNames::new(
        &config.model_name,
        &config.aliases,
        config.strict_model_names,
        config.any_model,
    );
    match path {
        Some(p) => names.with_local(config.local_models.clone(), p),
        None => names,
    }
}

/// Parses a JSON request body; size-limit and syntax errors in `family`'s shape.
pub fn parse_body(family: Family, body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let bytes = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(family, ErrorKind::TooLarge, "request body too large")
        } else {
            ApiError::bad(family, e.body_text())
        }
    })?;
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad(family, format!("invalid JSON body: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad(
            family,
            "the request body must be a JSON object",
        ));
    }
    Ok(v)
}

/// A streaming response whose chunks a spawned task sends through `tx`; when the
/// client disconnects, sends fail and the task ends (dropping the engine stream
/// cancels the request).
pub fn streaming<F, Fut>(content_type: &'static str, f: F) -> Response
where
    F: FnOnce(mpsc::Sender<Bytes>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(f(tx));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// How long a stream may stay silent (a long prompt being prefilled) before
/// a keep-alive event is sent: 15 s, or `TEMPO9_KEEPALIVE_MS`.
pub fn keepalive_interval() -> std::time::Duration {
    static D: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *D.get_or_init(|| {
        let ms = std::env::var("TEMPO9_KEEPALIVE_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&ms| ms > 0)
            .unwrap_or(15_000);
        std::time::Duration::from_millis(ms)
    })
}

/// The generation's next events; while none come for [`keepalive_interval`], sends
/// `ping()` through `tx`, so clients with stream idle timeouts keep waiting
/// through a long prefill (Claude Code and Codex give up on a stream silent
/// for 5 minutes). `None` at the end, or when the client went away.
pub async fn next_or_keepalive(
    gen: &mut chat::Generation,
    tx: &mpsc::Sender<Bytes>,
    mut ping: impl FnMut() -> Bytes,
) -> Option<Vec<chat::GenEvent>> {
    let next = gen.next();
    tokio::pin!(next);
    loop {
        tokio::select! {
            events = &mut next => return events,
            _ = tokio::time::sleep(keepalive_interval()) => {
                if tx.send(ping()).await.is_err() {
                    return None;
                }
            }
        }
    }
}

/// One SSE `data:` line with a JSON payload.
pub fn sse_data(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// One SSE event with a name and a JSON payload.
pub fn sse_event(name: &str, v: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {v}\n\n"))
}

/// Paths open without the API key: the health check, and the status page
/// itself (static HTML holding no data; it asks for the key and sends it with
/// its `/v1/status` requests, which need it like every API route).
fn open_path(path: &str) -> bool {
    path == "/health" || path == "/"
}

/// A generation's share of the server-wide token limit
/// ([`AppState::reserve_tokens`]), given back when dropped (the generation ended,
/// or its client left).
#[derive(Debug)]
pub struct TokenReservation {
    counter: Option<Arc<std::sync::atomic::AtomicUsize>>,
    n: usize,
}

impl Drop for TokenReservation {
    fn drop(&mut self) {
        if let Some(c) = &self.counter {
            c.fetch_sub(self.n, std::sync::atomic::Ordering::AcqRel);
        }
    }
}

/// Routes whose requests render a prompt: they take a generation slot
/// ([`GenSlot`]) before their body is even read.
fn generation_route(path: &str) -> bool {
    matches!(
        path,
        "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/responses"
            | "/v1/messages"
            | "/v1/messages/count_tokens"
            | "/api/chat"
            | "/api/generate"
    )
}

/// A generation slot taken by [`guard`] before the request body is read; the
/// handler takes it over with the [`GenSlot`] extractor.
#[derive(Clone)]
struct SlotCell(Arc<std::sync::Mutex<Option<tokio::sync::OwnedSemaphorePermit>>>);

/// The generation slot of a request (one of `--max-concurrent`): held until its
/// answer is complete, so it bounds the requests being parsed, rendered,
/// queued and generated together.
pub struct GenSlot(pub tokio::sync::OwnedSemaphorePermit);

impl axum::extract::FromRequestParts<Arc<AppState>> for GenSlot {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        st: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        let taken = parts
            .extensions
            .remove::<SlotCell>()
            .and_then(|c| c.0.lock().unwrap_or_else(|e| e.into_inner()).take());
        match taken {
            Some(p) => Ok(GenSlot(p)),
            None => st.slot(Family::from_path(parts.uri.path())).map(GenSlot),
        }
    }
}

/// Refuses what [`access`] refuses, checks the API key (except on
/// [`open_path`]s), takes a generation slot and reads the body within
/// `--body-timeout`, counts answers per route, and runs the handler with its
/// [`status::ClientInfo`] (for the status page).
async fn guard(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let family = Family::from_path(&path);
    let refuse = |status: u16, e: ApiError| {
        st.metrics.http(&route, status);
        e.into_response()
    };
    let origin = req.headers().get(header::ORIGIN).cloned();
    let access = &st.config.access;
    if access::is_preflight(req.method(), req.headers()) {
        let headers = access::cors_headers(origin.as_ref(), Some(req.headers()), access);
        if headers.is_empty() {
            let o = origin.as_ref().and_then(|o| o.to_str().ok()).unwrap_or("");
            let msg = access::Refusal::Origin(o.to_string()).message();
            return refuse(403, ApiError::new(family, ErrorKind::Forbidden, msg));
        }
        let mut r = StatusCode::NO_CONTENT.into_response();
        r.headers_mut().extend(headers);
        return r;
    }
    if let Err(refusal) = access::check(req.method(), req.headers(), &st.config.host, access) {
        let kind = match refusal {
            access::Refusal::ContentType(_) => ErrorKind::UnsupportedMediaType,
            _ => ErrorKind::Forbidden,
        };
        let e = ApiError::new(family, kind, refusal.message());
        return refuse(e.status().as_u16(), e);
    }
    if let Some(key) = &st.config.api_key {
        if !open_path(&path) && !access::authorized(req.headers(), key) {
            let e = ApiError::new(
                family,
                ErrorKind::Unauthorized,
                "invalid or missing API key",
            );
            return refuse(401, e);
        }
    }
    let mut req = req;
    if req.method() == axum::http::Method::POST && generation_route(&path) {
        match st.slot(family) {
            Ok(p) => {
                req.extensions_mut()
                    .insert(SlotCell(Arc::new(std::sync::Mutex::new(Some(p)))));
            }
            Err(e) => return refuse(e.status().as_u16(), e),
        }
    }
    if req.method() == axum::http::Method::POST {
        let (parts, body) = req.into_parts();
        let limit = st.config.max_body_bytes;
        let read = tokio::time::timeout(
            st.config.body_timeout,
            axum::body::to_bytes(body, limit.saturating_add(1)),
        )
        .await;
        let bytes = match read {
            Err(_) => {
                let e = ApiError::new(
                    family,
                    ErrorKind::Timeout,
                    format!(
                        "the request body did not arrive within {} s",
                        st.config.body_timeout.as_secs()
                    ),
                );
                return refuse(408, e);
            }
            Ok(Err(_)) => {
                let e = ApiError::new(family, ErrorKind::TooLarge, "request body too large");
                return refuse(413, e);
            }
            Ok(Ok(b)) if b.len() > limit => {
                let e = ApiError::new(family, ErrorKind::TooLarge, "request body too large");
                return refuse(413, e);
            }
            Ok(Ok(b)) => b,
        };
        req = Request::from_parts(parts, Body::from(bytes));
    }
    let method = req.method().clone();
    let t0 = std::time::Instant::now();
    let client = status::ClientInfo::from_request(&path, req.headers());
    let mut resp = client.scope(next.run(req)).await;
    resp.headers_mut()
        .extend(access::cors_headers(origin.as_ref(), None, access));
    tracing::info!(%method, path = %path, status = resp.status().as_u16(),
        ms = t0.elapsed().as_millis() as u64, "http");
    st.metrics.http(&route, resp.status().as_u16());
    resp
}

/// `GET /health`: 200 `ok` while the engine serves; 503 `error` with the
/// reason once its thread died (a bug), so supervisors restart the server.
async fn health(State(st): State<Arc<AppState>>) -> Response {
    if let Some(why) = st.engine.failure() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "error", "model": st.config.model_name,
                              "error": format!("the engine failed: {why}")})),
        )
            .into_response();
    }
    let s = st.engine.stats();
    axum::Json(json!({"status": "ok", "model": st.config.model_name,
                      "waiting": s.waiting, "running": s.running}))
    .into_response()
}

async fn metrics_text(State(st): State<Arc<AppState>>) -> Response {
    use crate::metrics::{counter, counter_f64, gauge};
    let s = st.engine.stats();
    let mut out = String::new();
    gauge(
        &mut out,
        "tempo9_requests_waiting",
        "Requests waiting for admission (queue depth).",
        s.waiting as f64,
    );
    gauge(
        &mut out,
        "tempo9_requests_running",
        "Requests holding KV and computing.",
        s.running as f64,
    );
    gauge(
        &mut out,
        "tempo9_kv_pages_total",
        "KV pages in the pool.",
        s.kv_pages_total as f64,
    );
    gauge(
        &mut out,
        "tempo9_kv_pages_used",
        "KV pages held by running requests.",
        s.kv_pages_used as f64,
    );
    gauge(
        &mut out,
        "tempo9_kv_pages_cached",
        "Unreferenced KV pages kept for prefix reuse.",
        s.kv_pages_cached as f64,
    );
    gauge(
        &mut out,
        "tempo9_kv_pages_free",
        "Free KV pages.",
        s.kv_pages_free as f64,
    );
    gauge(
        &mut out,
        "tempo9_kv_page_tokens",
        "Tokens per KV page.",
        s.page_tokens as f64,
    );
    sliding_metrics(&mut out, &s);
    recurrent_metrics(&mut out, &s);
    let hit = if s.prefix_query_tokens > 0 {
        s.prefix_hit_tokens as f64 / s.prefix_query_tokens as f64
    } else {
        0.0
    };
    gauge(
        &mut out,
        "tempo9_prefix_cache_hit_rate",
        "Prompt tokens found in the prefix cache / prompt tokens looked up.",
        hit,
    );
    counter(
        &mut out,
        "tempo9_prefix_query_tokens_total",
        "Prompt tokens looked up in the prefix cache.",
        s.prefix_query_tokens,
    );
    counter(
        &mut out,
        "tempo9_prefix_hit_tokens_total",
        "Prompt tokens found in the prefix cache.",
        s.prefix_hit_tokens,
    );
    counter(
        &mut out,
        "tempo9_prefix_copied_tokens_total",
        "Of the hits, tokens a prompt shorter than a chunk copied from another short prompt's first page.",
        s.prefix_copied_tokens,
    );
    counter(
        &mut out,
        "tempo9_engine_prompt_tokens_total",
        "Prompt tokens of admitted requests.",
        s.prompt_tokens_total,
    );
    counter(
        &mut out,
        "tempo9_engine_generated_tokens_total",
        "Tokens generated by the engine.",
        s.generated_tokens_total,
    );
    counter(
        &mut out,
        "tempo9_engine_draft_tokens_total",
        "Draft tokens verified by speculative decoding.",
        s.draft_tokens_total,
    );
    counter(
        &mut out,
        "tempo9_engine_accepted_draft_tokens_total",
        "Draft tokens accepted by speculative decoding.",
        s.accepted_draft_tokens_total,
    );
    counter(
        &mut out,
        "tempo9_engine_images_encoded_total",
        "Images the vision encoder computed (a re-sent image found in its cache or the prefix cache is not encoded again).",
        s.images_encoded_total,
    );
    metrics::counter_f64(
        &mut out,
        "tempo9_engine_image_encode_seconds_total",
        "Seconds the vision encoder spent computing those images.",
        s.image_encode_seconds_total,
    );
    counter(
        &mut out,
        "tempo9_preemptions_total",
        "Requests preempted.",
        s.preemptions_total,
    );
    counter(
        &mut out,
        "tempo9_engine_steps_total",
        "Model steps run.",
        s.steps_total,
    );
    counter_f64(
        &mut out,
        "tempo9_engine_step_seconds_total",
        "Seconds in model steps (scheduling, forward pass, sampling, events).",
        s.step_seconds_total,
    );
    counter_f64(
        &mut out,
        "tempo9_engine_forward_seconds_total",
        "Seconds of those steps in the forward pass.",
        s.forward_seconds_total,
    );
    counter(
        &mut out,
        "tempo9_evicted_pages_total",
        "Cached KV pages evicted.",
        s.evicted_pages,
    );
    kv_tier_metrics(&mut out, &s);
    st.metrics.render(&mut out);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

/// The sliding-window cache group's pages (models with sliding-window layers; all
/// zero otherwise): what its layers hold, what they keep for prefix hits, what they
/// released behind running requests' windows.
fn sliding_metrics(out: &mut String, s: &tempo9_engine::EngineStats) {
    use crate::metrics::{counter, gauge};
    let x = &s.sliding;
    for (name, help, v) in [
        ("total", "Pages in the sliding-window group.", x.n_pages),
        (
            "used",
            "Sliding-window pages held by running requests.",
            x.in_use,
        ),
        (
            "cached",
            "Sliding-window pages kept for prefix hits (evictable).",
            x.cached,
        ),
        ("free", "Free sliding-window pages.", x.free),
    ] {
        gauge(
            out,
            &format!("tempo9_kv_sliding_pages_{name}"),
            help,
            v as f64,
        );
    }
    counter(
        out,
        "tempo9_kv_sliding_released_pages_total",
        "Sliding-window pages released behind running requests' windows.",
        x.released_pages,
    );
    counter(
        out,
        "tempo9_kv_sliding_shortened_hits_total",
        "Prefix hits cut short because the sliding-window group lacked the window there.",
        x.shortened_hits,
    );
}

/// The recurrent-state group's slots (hybrid models such as Qwen3.5; all zero
/// otherwise): one per running request, plus state checkpoints kept for prefix hits.
fn recurrent_metrics(out: &mut String, s: &tempo9_engine::EngineStats) {
    use crate::metrics::gauge;
    let x = &s.recurrent;
    for (name, help, v) in [
        ("total", "Recurrent state slots.", x.n_slots),
        ("live", "State slots of running requests.", x.live),
        (
            "checkpoints",
            "State slots holding checkpoints kept for prefix hits (evictable).",
            x.checkpoints,
        ),
        ("free", "Free state slots.", x.free),
    ] {
        gauge(
            out,
            &format!("tempo9_kv_state_slots_{name}"),
            help,
            v as f64,
        );
    }
    gauge(
        out,
        "tempo9_kv_state_slot_bytes",
        "Bytes of one recurrent state slot (every recurrent layer's states).",
        s.state_slot_bytes as f64,
    );
    gauge(
        out,
        "tempo9_kv_state_checkpoint_bytes",
        "Bytes of state checkpoints kept in RAM for prefix hits.",
        (x.checkpoints * s.state_slot_bytes) as f64,
    );
    for (name, help, v) in [
        (
            "taken",
            "State checkpoints taken (prompt positions, junctions, answer pages).",
            x.taken,
        ),
        (
            "hits",
            "Requests that resumed from a state checkpoint in RAM.",
            x.hits,
        ),
        (
            "evicted",
            "State checkpoints evicted from RAM to make room (to the SSD tier when on).",
            x.evicted,
        ),
        (
            "dropped",
            "State checkpoints dropped (replaced by a deeper one of the same answer, or a failed copy).",
            x.dropped,
        ),
    ] {
        crate::metrics::counter(
            out,
            &format!("tempo9_kv_state_checkpoints_{name}_total"),
            help,
            v,
        );
    }
}

/// Pages and bytes in each KV tier, hits per tier, SSD read/write volume and time
/// (throughput = rate of bytes / rate of seconds), SSD errors.
fn kv_tier_metrics(out: &mut String, s: &tempo9_engine::EngineStats) {
    use crate::metrics::{counter, counter_f64, gauge};
    let x = &s.ssd;
    let ram_pages = s.kv_pages_used + s.kv_pages_cached;
    gauge(
        out,
        "tempo9_kv_ram_bytes",
        "Bytes of KV pages in RAM holding tokens (used + cached), every cache group.",
        (ram_pages * s.page_bytes
            + (s.sliding.in_use + s.sliding.cached) * s.sliding_page_bytes
            + (s.recurrent.live + s.recurrent.checkpoints) * s.state_slot_bytes) as f64,
    );
    gauge(
        out,
        "tempo9_kv_ssd_pages",
        "KV pages in the SSD tier (on disk or queued for writing).",
        x.pages as f64,
    );
    gauge(
        out,
        "tempo9_kv_ssd_bytes",
        "Bytes of KV page files in the SSD tier.",
        x.bytes as f64,
    );
    gauge(
        out,
        "tempo9_kv_ssd_budget_bytes",
        "Disk budget of the SSD tier.",
        x.budget_bytes as f64,
    );
    gauge(
        out,
        "tempo9_kv_ssd_states",
        "Recurrent-state checkpoints in the SSD tier (hybrid models; on disk or queued).",
        x.states as f64,
    );
    gauge(
        out,
        "tempo9_kv_ssd_state_bytes",
        "Bytes of recurrent-state checkpoint files in the SSD tier.",
        x.state_bytes as f64,
    );
    for (name, help, v) in [
        (
            "served",
            "State checkpoints read back from the SSD tier for requests.",
            x.served_states,
        ),
        (
            "written",
            "State checkpoints written to the SSD tier.",
            x.write_states,
        ),
        (
            "read_errors",
            "State checkpoint reads that failed (the request recomputes).",
            x.state_read_errors,
        ),
        (
            "evicted",
            "State checkpoints removed from the SSD tier to stay within its budget.",
            x.evicted_states,
        ),
    ] {
        counter(out, &format!("tempo9_kv_ssd_states_{name}_total"), help, v);
    }
    counter(
        out,
        "tempo9_kv_ssd_state_read_bytes_total",
        "Bytes of state checkpoints read from the SSD tier.",
        x.read_state_bytes,
    );
    counter(
        out,
        "tempo9_kv_ssd_state_write_bytes_total",
        "Bytes of state checkpoints written to the SSD tier.",
        x.write_state_bytes,
    );
    let w = &x.windows;
    gauge(
        out,
        "tempo9_kv_ssd_windows",
        "Sliding-window sidecars (one page's sliding-layer KV) in the SSD tier (on disk or queued).",
        w.entries as f64,
    );
    gauge(
        out,
        "tempo9_kv_ssd_window_bytes",
        "Bytes of sliding-window sidecar files in the SSD tier.",
        w.bytes as f64,
    );
    for (name, help, v) in [
        (
            "served",
            "Sliding-window sidecars read back from the SSD tier for requests.",
            w.served,
        ),
        (
            "written",
            "Sliding-window sidecars written to the SSD tier.",
            w.written,
        ),
        (
            "read_errors",
            "Sliding-window sidecar reads that failed (the request recomputes).",
            w.read_errors,
        ),
        (
            "evicted",
            "Sliding-window sidecars removed from the SSD tier to stay within its budget.",
            w.evicted,
        ),
    ] {
        counter(out, &format!("tempo9_kv_ssd_windows_{name}_total"), help, v);
    }
    counter(
        out,
        "tempo9_kv_ssd_window_read_bytes_total",
        "Bytes of sliding-window sidecars read from the SSD tier.",
        w.read_bytes,
    );
    counter(
        out,
        "tempo9_kv_ssd_window_write_bytes_total",
        "Bytes of sliding-window sidecars written to the SSD tier.",
        w.write_bytes,
    );
    gauge(
        out,
        "tempo9_kv_ssd_pending_pages",
        "KV pages queued for writing to the SSD tier.",
        x.pending_pages as f64,
    );
    gauge(
        out,
        "tempo9_kv_loading_requests",
        "Requests waiting for their cached prefix to be read from the SSD tier.",
        s.loading as f64,
    );
    counter(
        out,
        "tempo9_kv_ssd_hit_tokens_total",
        "Prompt tokens served from the SSD tier (RAM hits: tempo9_prefix_hit_tokens_total).",
        x.hit_tokens,
    );
    counter(
        out,
        "tempo9_kv_ssd_read_bytes_total",
        "Bytes read from the SSD tier.",
        x.read_bytes,
    );
    counter_f64(
        out,
        "tempo9_kv_ssd_read_seconds_total",
        "Seconds spent reading the SSD tier.",
        x.read_secs,
    );
    counter(
        out,
        "tempo9_kv_ssd_write_bytes_total",
        "Bytes written to the SSD tier.",
        x.write_bytes,
    );
    counter_f64(
        out,
        "tempo9_kv_ssd_write_seconds_total",
        "Seconds spent writing the SSD tier.",
        x.write_secs,
    );
    counter(
        out,
        "tempo9_kv_ssd_read_errors_total",
        "SSD pages unusable on read (missing, corrupt, foreign); recomputed.",
        x.read_errors,
    );
    counter(
        out,
        "tempo9_kv_ssd_write_errors_total",
        "SSD page writes that failed (disk full, I/O error); recomputed when needed.",
        x.write_errors,
    );
    counter(
        out,
        "tempo9_kv_ssd_writes_dropped_total",
        "Evicted pages not written (write queue full or budget below one page).",
        x.writes_dropped,
    );
    counter(
        out,
        "tempo9_kv_ssd_evicted_pages_total",
        "SSD pages removed to stay within the disk budget.",
        x.evicted_pages,
    );
}

async fn not_found(req: Request) -> Response {
    let path = req.uri().path().to_string();
    ApiError::new(
        Family::from_path(&path),
        ErrorKind::NotFound,
        format!("no route {} {path}", req.method()),
    )
    .into_response()
}

/// All routes.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{*model}", get(openai::model))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .route("/v1/status", get(status::status))
        .route("/", get(status::page))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_file_types() {
        assert_eq!(file_type_name(15), "Q4_K_M");
        assert_eq!(file_type_name(3), "Q4_1");
        assert_eq!(file_type_name(999), "unknown");
    }
}
