//! The live status page: `GET /v1/status` (a JSON snapshot of what the server
//! is doing, or one snapshot per second as server-sent events) and `GET /`
//! (an HTML page, embedded in the binary, that draws those events).
//!
//! Per-request facts the engine does not know (API family, client, time to
//! first token, decode rate) live in a [`StatusRegistry`]: a generation
//! registers when it is submitted and holds a [`StatusGuard`] that removes the
//! entry when the generation is dropped, however it ends (finished, failed,
//! client gone). The engine's own view of each request (waiting, loading or
//! running; cached and computed tokens) comes from
//! [`tempo9_engine::EngineHandle::requests`].
//!
//! The snapshot's fields:
//! - `server`: `version`, `model`, `arch`, `quantization`, `device`,
//!   `device_description`, `context` (per-request token limit), `uptime_secs`,
//!   `time` (Unix seconds of the snapshot), `status_prompts`, `status_streams`
//!   (open event streams).
//! - `queue`: the engine's `running`, `waiting` and `loading` (reading a cached
//!   prefix from the SSD tier) counts, as of its last step.
//! - `requests.running`, `requests.waiting`: one object per generation: `id` (the
//!   engine's), `api` (`openai`, `anthropic`, `ollama`, `responses`), `client`
//!   (`User-Agent`), `state` (`waiting`, `loading`, `prefill`, `decode`),
//!   `age_secs`, `prompt_tokens`, `cached_tokens` (prefix-cache hit; `null`
//!   before admission), `computed_tokens` (prompt tokens prefilled so far),
//!   `ttft_secs`, `generated_tokens`, `max_tokens`, `tokens_per_second` (its
//!   decode rate since its first token), `preemptions`, and `prompt` (the first
//!   [`PROMPT_PREVIEW_CHARS`] characters of the rendered prompt) only with
//!   `--status-prompts`.
//! - `kv`: `page_tokens`, `page_bytes`, `ram` pages (`total`, `used`, `cached`,
//!   `free`); `ssd` (`pages`, `bytes`, `budget_bytes`, `pending_pages`,
//!   `hit_tokens`, `states`, `windows`), `sliding` (pages) and `recurrent`
//!   (state `slots`, `live`, `checkpoints`, `free`, `checkpoint_hits`), each
//!   `null` where the engine has no such tier or group.
//! - `prefix_cache`: `query_tokens`, `hit_tokens`, `hit_rate`.
//! - `tokens_per_second`: generated tokens per second over the last 10 s.
//! - `totals`: counters since the start: `requests_started`, `requests_ended`,
//!   `ttft_count` and `ttft_sum_secs` (a client's mean TTFT over an interval is
//!   the ratio of their differences), `server_generated_tokens`, and the
//!   engine's `prompt_tokens`, `generated_tokens`, `computed_tokens`,
//!   `preemptions`, `steps`, `evicted_pages`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use tempo9_engine::{RequestId, RequestPhase, RequestProgress};

use crate::AppState;

/// The status page (HTML with inline CSS and JS; no outside resources).
pub const PAGE_HTML: &str = include_str!("status/index.html");

/// Characters of prompt text shown per request with `--status-prompts`.
pub const PROMPT_PREVIEW_CHARS: usize = 200;

tokio::task_local! {
    /// The HTTP request being served (set by the router's middleware around
    /// each handler), so a generation knows its API and client without every
    /// handler passing them along.
    static CLIENT: ClientInfo;
}

/// Who sent an HTTP request: its API family and `User-Agent`.
#[derive(Debug, Clone, Default)]
pub struct ClientInfo {
    /// `openai`, `anthropic`, `ollama` or `responses`.
    pub api: &'static str,
    /// The `User-Agent` header.
    pub user_agent: Option<String>,
}

impl ClientInfo {
    /// The API family of a request path, and the request's `User-Agent`.
    pub fn from_request(path: &str, headers: &HeaderMap) -> ClientInfo {
        let api = if path.starts_with("/v1/responses") {
            "responses"
        } else if path.starts_with("/v1/messages") {
            "anthropic"
        } else if path.starts_with("/api/") {
            "ollama"
        } else {
            "openai"
        };
        let user_agent = headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.chars().take(200).collect());
        ClientInfo { api, user_agent }
    }

    /// Runs `f` with `self` as the current request's client (see [`Self::current`]).
    pub async fn scope<F: std::future::Future>(self, f: F) -> F::Output {
        CLIENT.scope(self, f).await
    }

    /// The client of the HTTP request being served on this task, if any.
    pub fn current() -> Option<ClientInfo> {
        CLIENT.try_with(Clone::clone).ok()
    }
}

/// One generation as the server sees it.
#[derive(Debug, Clone)]
struct Entry {
    engine_id: RequestId,
    api: &'static str,
    client: Option<String>,
    prompt: Option<String>,
    prompt_tokens: usize,
    max_tokens: usize,
    received: Instant,
    ttft: Option<Duration>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    generated: usize,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    entries: BTreeMap<u64, Entry>,
    /// Generations registered since the start.
    started: u64,
    /// Generations whose entry was removed.
    ended: u64,
    /// First tokens seen, and the sum of their TTFTs (seconds).
    ttft_count: u64,
    ttft_sum: f64,
    /// Tokens seen by the server's generations.
    tokens: u64,
}

/// The generations in flight in the server (see the module docs).
#[derive(Debug, Default)]
pub struct StatusRegistry {
    inner: Mutex<Inner>,
    /// Open `/v1/status` event streams.
    streams: AtomicUsize,
}

/// One open `/v1/status` event stream, counted while it lives.
#[derive(Debug)]
struct StreamGuard(Arc<StatusRegistry>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a generation reports when it registers.
#[derive(Debug, Clone)]
pub struct NewEntry {
    /// The engine's id of the request ([`tempo9_engine::RequestStream::id`]).
    pub engine_id: RequestId,
    /// The API and client.
    pub client: ClientInfo,
    /// The start of the prompt text (only with `--status-prompts`).
    pub prompt: Option<String>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// The most tokens it will generate.
    pub max_tokens: usize,
    /// When the HTTP request arrived.
    pub received: Instant,
}

/// A registered generation's entry: update it as tokens arrive; dropping it
/// removes the entry.
#[derive(Debug)]
pub struct StatusGuard {
    registry: Arc<StatusRegistry>,
    key: u64,
}

impl StatusGuard {
    /// A token arrived at `now`.
    pub fn token(&self, now: Instant) {
        let mut g = self.registry.lock();
        let inner = &mut *g;
        inner.tokens += 1;
        if let Some(e) = inner.entries.get_mut(&self.key) {
            if e.first_token.is_none() {
                let ttft = now.saturating_duration_since(e.received);
                e.ttft = Some(ttft);
                e.first_token = Some(now);
                inner.ttft_count += 1;
                inner.ttft_sum += ttft.as_secs_f64();
            }
            e.last_token = Some(now);
            e.generated += 1;
        }
    }
}

impl Drop for StatusGuard {
    fn drop(&mut self) {
        let mut g = self.registry.lock();
        if g.entries.remove(&self.key).is_some() {
            g.ended += 1;
        }
    }
}

impl StatusRegistry {
    /// An empty registry.
    pub fn new() -> Arc<StatusRegistry> {
        Arc::new(StatusRegistry::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a generation; its entry lives as long as the returned guard.
    pub fn register(self: &Arc<Self>, e: NewEntry) -> StatusGuard {
        let mut g = self.lock();
        g.next += 1;
        g.started += 1;
        let key = g.next;
        g.entries.insert(
            key,
            Entry {
                engine_id: e.engine_id,
                api: e.client.api,
                client: e.client.user_agent,
                prompt: e.prompt,
                prompt_tokens: e.prompt_tokens,
                max_tokens: e.max_tokens,
                received: e.received,
                ttft: None,
                first_token: None,
                last_token: None,
                generated: 0,
            },
        );
        StatusGuard {
            registry: self.clone(),
            key,
        }
    }

    /// Open `/v1/status` event streams.
    pub fn streams(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }

    fn open_stream(self: &Arc<Self>) -> StreamGuard {
        self.streams.fetch_add(1, Ordering::Relaxed);
        StreamGuard(self.clone())
    }

    /// Generations registered now.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether no generation is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The start of a prompt's text: its first [`PROMPT_PREVIEW_CHARS`] characters.
pub fn prompt_preview(tok: &tempo9_tokenizer::Tokenizer, tokens: &[u32]) -> String {
    // A token is at least one character in nearly every vocabulary; decode a few
    // more than needed, then cut at a character boundary.
    let n = tokens.len().min(PROMPT_PREVIEW_CHARS * 2);
    let text = tok.decode(&tokens[..n], true);
    let mut out: String = text.chars().take(PROMPT_PREVIEW_CHARS).collect();
    if text.chars().count() > PROMPT_PREVIEW_CHARS || n < tokens.len() {
        out.push('…');
    }
    out
}

fn phase_name(p: RequestPhase) -> &'static str {
    match p {
        RequestPhase::Waiting => "waiting",
        RequestPhase::Loading => "loading",
        RequestPhase::Running => "running",
    }
}

/// The whole status snapshot (`GET /v1/status`).
pub fn snapshot(st: &AppState) -> Value {
    let now = Instant::now();
    let s = st.engine.stats();
    let progress: BTreeMap<RequestId, RequestProgress> = st
        .engine
        .requests()
        .into_iter()
        .map(|p| (p.id, p))
        .collect();
    let reg = st.status.lock();
    let mut running = Vec::new();
    let mut waiting = Vec::new();
    for e in reg.entries.values() {
        let p = progress.get(&e.engine_id);
        // Not yet seen by the engine (submitted during its step): waiting,
        // unless tokens already came.
        let phase = match p.map(|p| p.phase) {
            Some(ph) => ph,
            None if e.generated > 0 => RequestPhase::Running,
            None => RequestPhase::Waiting,
        };
        let rate = match (e.first_token, e.last_token) {
            (Some(a), Some(b)) if e.generated > 1 && b > a => {
                Some((e.generated - 1) as f64 / (b - a).as_secs_f64())
            }
            _ => None,
        };
        let stage = match phase {
            RequestPhase::Running if e.generated == 0 => "prefill",
            RequestPhase::Running => "decode",
            other => phase_name(other),
        };
        let mut j = json!({
            "id": e.engine_id,
            "api": e.api,
            "client": e.client,
            "state": stage,
            "age_secs": now.saturating_duration_since(e.received).as_secs_f64(),
            "prompt_tokens": e.prompt_tokens,
            "cached_tokens": p.filter(|p| p.phase != RequestPhase::Waiting || p.preemptions > 0)
                .map(|p| p.cached_tokens),
            "computed_tokens": p.map(|p| p.computed_tokens.min(e.prompt_tokens)),
            "ttft_secs": e.ttft.map(|d| d.as_secs_f64()),
            "generated_tokens": e.generated,
            "max_tokens": e.max_tokens,
            "tokens_per_second": rate,
            "preemptions": p.map(|p| p.preemptions).unwrap_or(0),
        });
        if let Some(text) = &e.prompt {
            j["prompt"] = json!(text);
        }
        if phase == RequestPhase::Running {
            running.push(j);
        } else {
            waiting.push(j);
        }
    }
    let totals = json!({
        "requests_started": reg.started,
        "requests_ended": reg.ended,
        "ttft_count": reg.ttft_count,
        "ttft_sum_secs": reg.ttft_sum,
        "server_generated_tokens": reg.tokens,
        "prompt_tokens": s.prompt_tokens_total,
        "generated_tokens": s.generated_tokens_total,
        "computed_tokens": s.computed_tokens_total,
        "preemptions": s.preemptions_total,
        "images_encoded": s.images_encoded_total,
        "steps": s.steps_total,
        "evicted_pages": s.evicted_pages,
    });
    drop(reg);
    let model = st.engine.model();
    let device = model.device();
    let hit_rate = if s.prefix_query_tokens > 0 {
        s.prefix_hit_tokens as f64 / s.prefix_query_tokens as f64
    } else {
        0.0
    };
    let x = &s.ssd;
    let ssd = (x.budget_bytes > 0).then(|| {
        json!({
            "pages": x.pages,
            "bytes": x.bytes,
            "budget_bytes": x.budget_bytes,
            "pending_pages": x.pending_pages,
            "hit_tokens": x.hit_tokens,
            "states": x.states,
            "windows": x.windows.entries,
        })
    });
    let sl = &s.sliding;
    let sliding = (sl.n_pages > 0).then(
        || json!({"total": sl.n_pages, "used": sl.in_use, "cached": sl.cached, "free": sl.free}),
    );
    let r = &s.recurrent;
    let recurrent = (r.n_slots > 0).then(|| {
        json!({"slots": r.n_slots, "live": r.live, "checkpoints": r.checkpoints,
               "free": r.free, "checkpoint_hits": r.hits})
    });
    let unix_now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    json!({
        "server": {
            "version": env!("CARGO_PKG_VERSION"),
            "model": st.config.model_name,
            "arch": st.info.arch,
            "quantization": st.info.quantization,
            "device": device.name(),
            "device_description": device.description(),
            "context": st.engine.max_context(),
            "uptime_secs": st.started.elapsed().as_secs_f64(),
            "time": unix_now,
            "status_prompts": st.config.status_prompts,
            "status_streams": st.status.streams(),
        },
        "queue": {"running": s.running, "waiting": s.waiting, "loading": s.loading},
        "requests": {"running": running, "waiting": waiting},
        "kv": {
            "page_tokens": s.page_tokens,
            "page_bytes": s.page_bytes,
            "ram": {"total": s.kv_pages_total, "used": s.kv_pages_used,
                    "cached": s.kv_pages_cached, "free": s.kv_pages_free},
            "ssd": ssd,
            "sliding": sliding,
            "recurrent": recurrent,
        },
        "prefix_cache": {
            "query_tokens": s.prefix_query_tokens,
            "hit_tokens": s.prefix_hit_tokens,
            "hit_rate": hit_rate,
        },
        "tokens_per_second": st.metrics.tokens_per_second(),
        "totals": totals,
    })
}

/// Query parameters of `GET /v1/status`.
#[derive(Debug, Default, Deserialize)]
pub struct StatusQuery {
    /// `true`: server-sent events (one snapshot per second) instead of one JSON.
    pub stream: Option<bool>,
    /// Milliseconds between events (100 to 60000; default 1000).
    pub interval_ms: Option<u64>,
}

/// `GET /v1/status`: one JSON snapshot, or one per second as server-sent events
/// when `Accept` asks for `text/event-stream` or the query has `stream=true`.
/// The event stream ends when the client goes away.
pub async fn status(
    State(st): State<Arc<AppState>>,
    Query(q): Query<StatusQuery>,
    headers: HeaderMap,
) -> Response {
    let wants_sse = q.stream.unwrap_or(false)
        || headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/event-stream"));
    if !wants_sse {
        return axum::Json(snapshot(&st)).into_response();
    }
    let every = Duration::from_millis(q.interval_ms.unwrap_or(1000).clamp(100, 60_000));
    let open = st.status.open_stream();
    crate::streaming("text/event-stream", move |tx| async move {
        // Counted until the client goes away and this task ends.
        let _open = open;
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                // The client went away (the body was dropped) while we slept.
                _ = tx.closed() => break,
            }
            if tx.send(crate::sse_data(&snapshot(&st))).await.is_err() {
                break;
            }
        }
    })
}

/// `GET /`: the status page.
pub async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE_HTML,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_removes_its_entry() {
        let reg = StatusRegistry::new();
        let t0 = Instant::now();
        let g = reg.register(NewEntry {
            engine_id: 7,
            client: ClientInfo {
                api: "openai",
                user_agent: Some("curl/8".into()),
            },
            prompt: None,
            prompt_tokens: 10,
            max_tokens: 5,
            received: t0,
        });
        assert_eq!(reg.len(), 1);
        g.token(t0 + Duration::from_millis(50));
        g.token(t0 + Duration::from_millis(150));
        {
            let inner = reg.lock();
            let e = inner.entries.values().next().unwrap();
            assert_eq!(e.generated, 2);
            assert_eq!(e.ttft, Some(Duration::from_millis(50)));
            assert_eq!(inner.ttft_count, 1);
        }
        drop(g);
        assert!(reg.is_empty());
        assert_eq!(reg.lock().ended, 1);
    }

    #[test]
    fn api_family_from_path() {
        let h = HeaderMap::new();
        assert_eq!(
            ClientInfo::from_request("/v1/responses", &h).api,
            "responses"
        );
        assert_eq!(
            ClientInfo::from_request("/v1/messages", &h).api,
            "anthropic"
        );
        assert_eq!(ClientInfo::from_request("/api/chat", &h).api, "ollama");
        assert_eq!(
            ClientInfo::from_request("/v1/chat/completions", &h).api,
            "openai"
        );
    }

    #[test]
    fn page_has_no_outside_resources() {
        assert!(PAGE_HTML.starts_with("<!DOCTYPE html>"));
        assert!(!PAGE_HTML.contains("http://"));
        assert!(!PAGE_HTML.contains("https://"));
        assert!(!PAGE_HTML.contains("//cdn"));
        assert!(PAGE_HTML.contains("/v1/status"));
    }
}
