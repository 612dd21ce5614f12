//! The status page over real HTTP: `/v1/status` JSON with a request in flight
//! (and gone once its client disconnects), its server-sent events, API-key
//! enforcement, and the HTML page at `/`. Serves SmolLM2-135M
//! (`scripts/fetch-models.sh`) on the CPU on a loopback port; a plain HTTP/1.1
//! client on a TCP socket, so a test can hang up mid-stream.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tempo9_engine::{Engine, EngineConfig};
use tempo9_models::{LoadOptions, Model};
use tempo9_server::{router, AppState, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MODEL: &str = "smollm2-135m-instruct-q4_1.gguf";

/// The model's path; `None` (skipped) when missing and
/// `TEMPO9_SKIP_MODEL_TESTS=1`, a failure otherwise (as the engine's tests).
fn model_path() -> Option<PathBuf> {
    let dir = std::env::var_os("TEMPO9_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tempo9/models")
        });
    let p = dir.join(MODEL);
    if p.exists() {
        return Some(p);
    }
    if std::env::var("TEMPO9_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!("skipping: {} missing", p.display());
        return None;
    }
    panic!(
        "model {} missing: run scripts/fetch-models.sh (or set TEMPO9_SKIP_MODEL_TESTS=1)",
        p.display()
    );
}

/// Starts a server on a free loopback port; its address.
async fn start(config: ServerConfig) -> Option<String> {
    start_with(config, 64).await
}

/// [`start`], with the engine running at most `max_running` requests at once.
async fn start_with(config: ServerConfig, max_running: usize) -> Option<String> {
    let path = model_path()?;
    let model = Arc::new(
        Model::load(&path, LoadOptions::new(tempo9_ggml::Device::cpu())).expect("load model"),
    );
    let tok = Arc::new(tempo9_tokenizer::Tokenizer::from_gguf(model.gguf()).expect("tokenizer"));
    let cfg = EngineConfig {
        threads: 2,
        kv_budget_bytes: Some(64 << 20),
        max_context: Some(4096),
        max_running,
        ..EngineConfig::default()
    };
    let engine = Engine::start(model, tok, cfg).expect("engine");
    let state = Arc::new(AppState::new(engine, config).expect("state"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, router(state)).await });
    Some(addr)
}

/// An answer: status code, lower-cased head, body.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

/// Sends one request (`Connection: close`) and reads the whole answer.
async fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut s = open(addr, method, path, headers, body).await;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut raw))
        .await
        .expect("answer in time")
        .unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").expect("HTTP head");
    let status = head[9..12].parse().expect("status code");
    Answer {
        status,
        head: head.to_ascii_lowercase(),
        body: body.to_string(),
    }
}

/// Opens a connection and sends a request on it.
async fn open(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).await.unwrap();
    s
}

/// Reads from `s` until `text` has arrived `n` times; everything read.
async fn read_until(s: &mut TcpStream, text: &str, n: usize) -> String {
    let mut got = String::new();
    let mut buf = [0u8; 16384];
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.matches(text).count() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let k = tokio::time::timeout(left, s.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{n} x {text:?} in time; got {got}"))
            .unwrap();
        assert!(k > 0, "connection closed early; got {got}");
        got.push_str(&String::from_utf8_lossy(&buf[..k]));
    }
    got
}

async fn status(addr: &str) -> Value {
    let a = http(addr, "GET", "/v1/status", &[], "").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(
        a.head.contains("content-type: application/json"),
        "{}",
        a.head
    );
    serde_json::from_str(&a.body).expect("JSON")
}

fn in_flight(s: &Value) -> usize {
    s["requests"]["running"].as_array().unwrap().len()
        + s["requests"]["waiting"].as_array().unwrap().len()
}

/// Polls the status until no request is in flight (fails after 10 s).
async fn wait_empty(addr: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = status(addr).await;
        if in_flight(&s) == 0 {
            return s;
        }
        assert!(Instant::now() < deadline, "requests still listed: {s:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A streaming chat request whose prompt spans more than two KV pages (so a
/// repeat hits the prefix cache) and whose answer is long.
const LONG: &str = r#"{"messages":[{"role":"system","content":"You are a storyteller. Your stories are long, detailed and full of dialogue. You describe every place the characters visit, every meal they eat and every weapon they carry. You never summarise; you always tell the whole story from the very beginning to the very end, with names for every character, even the horses, the innkeepers and the blacksmiths. Stories are set in a land of mountains, rivers, old forests and walled towns."},{"role":"user","content":"Write a very long story about a dragon and a knight."}],"max_tokens":3000,"stream":true,"temperature":0}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_a_running_request_and_forgets_it() {
    let Some(addr) = start(ServerConfig::default()).await else {
        return;
    };
    let idle = status(&addr).await;
    assert_eq!(in_flight(&idle), 0);
    assert_eq!(idle["server"]["model"], "tempo9");
    assert_eq!(idle["server"]["device"], "CPU");
    assert_eq!(idle["server"]["version"], env!("CARGO_PKG_VERSION"));
    assert!(idle["server"]["uptime_secs"].as_f64().unwrap() >= 0.0);
    let ram = &idle["kv"]["ram"];
    assert!(ram["total"].as_u64().unwrap() > 0);
    assert_eq!(ram["free"], ram["total"]);
    assert!(idle["prefix_cache"]["hit_rate"].is_number());

    // A streaming chat completion: once its first tokens arrived it is running.
    let mut s = open(
        &addr,
        "POST",
        "/v1/chat/completions",
        &[("User-Agent", "status-test/1.0")],
        LONG,
    )
    .await;
    read_until(&mut s, "data: ", 3).await;
    let st = status(&addr).await;
    let running = st["requests"]["running"].as_array().unwrap();
    assert_eq!(running.len(), 1, "{st:#}");
    let r = &running[0];
    assert_eq!(r["api"], "openai");
    assert_eq!(r["client"], "status-test/1.0");
    assert_eq!(r["state"], "decode");
    assert!(r["prompt_tokens"].as_u64().unwrap() > 10, "{r}");
    assert_eq!(r["cached_tokens"], 0, "{r}");
    assert!(r["ttft_secs"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["generated_tokens"].as_u64().unwrap() >= 1, "{r}");
    // 3000, or less where the context limit leaves less room.
    let max = r["max_tokens"].as_u64().unwrap();
    assert!(max > 1000 && max <= 3000, "{r}");
    assert!(r.get("prompt").is_none(), "prompts hidden by default: {r}");
    assert_eq!(st["queue"]["running"], 1);
    assert!(st["kv"]["ram"]["used"].as_u64().unwrap() >= 1);

    // The client hangs up mid-answer: the entry goes.
    drop(s);
    let after = wait_empty(&addr).await;
    assert_eq!(after["totals"]["requests_started"], 1);
    assert_eq!(after["totals"]["requests_ended"], 1);
    assert!(after["totals"]["ttft_count"].as_u64().unwrap() == 1);

    // The same prompt again, to the end (non-streaming): a prefix-cache hit,
    // and nothing left listed afterwards.
    let body = LONG
        .replace("\"stream\":true", "\"stream\":false")
        .replace("3000", "8");
    let a = http(&addr, "POST", "/v1/chat/completions", &[], &body).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let done = wait_empty(&addr).await;
    assert_eq!(done["totals"]["requests_ended"], 2);
    assert!(
        done["prefix_cache"]["hit_tokens"].as_u64().unwrap() > 0,
        "{done:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_engine_has_no_room_for_is_waiting() {
    let Some(addr) = start_with(ServerConfig::default(), 1).await else {
        return;
    };
    let mut first = open(&addr, "POST", "/v1/chat/completions", &[], LONG).await;
    read_until(&mut first, "data: ", 2).await;
    let anthropic = r#"{"model":"tempo9","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"Hi"}]}"#;
    let second = open(
        &addr,
        "POST",
        "/v1/messages",
        &[("User-Agent", "claude-cli/2")],
        anthropic,
    )
    .await;
    // Listed as waiting once the server has it, while the first keeps running.
    let deadline = Instant::now() + Duration::from_secs(10);
    let st = loop {
        let st = status(&addr).await;
        // (The engine's counts are as of its last step: they may lag a moment.)
        if st["requests"]["waiting"].as_array().unwrap().len() == 1 && st["queue"]["waiting"] == 1 {
            break st;
        }
        assert!(Instant::now() < deadline, "no waiting request: {st:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let w = &st["requests"]["waiting"][0];
    assert_eq!(w["api"], "anthropic", "{w}");
    assert_eq!(w["client"], "claude-cli/2", "{w}");
    assert_eq!(w["state"], "waiting", "{w}");
    assert_eq!(w["generated_tokens"], 0, "{w}");
    assert!(w["ttft_secs"].is_null(), "{w}");
    assert_eq!(st["requests"]["running"].as_array().unwrap().len(), 1);
    assert_eq!(st["queue"]["waiting"], 1, "{st:#}");
    drop(first);
    drop(second);
    wait_empty(&addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_prompts_flag_shows_the_prompt() {
    let config = ServerConfig {
        status_prompts: true,
        ..ServerConfig::default()
    };
    let Some(addr) = start(config).await else {
        return;
    };
    let mut s = open(&addr, "POST", "/v1/chat/completions", &[], LONG).await;
    read_until(&mut s, "data: ", 2).await;
    let st = status(&addr).await;
    let r = &st["requests"]["running"][0];
    let prompt = r["prompt"].as_str().expect("prompt shown");
    // The start of the rendered prompt: the system message, cut at 200 characters.
    assert!(prompt.contains("You are a storyteller."), "{prompt}");
    assert!(!prompt.contains("a dragon and a knight"), "{prompt}");
    assert!(prompt.ends_with('…'), "{prompt}");
    assert!(prompt.chars().count() <= 201, "{prompt}");
    drop(s);
    wait_empty(&addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_streams_events() {
    let Some(addr) = start(ServerConfig::default()).await else {
        return;
    };
    for (path, headers) in [
        (
            "/v1/status?interval_ms=200",
            &[("Accept", "text/event-stream")][..],
        ),
        ("/v1/status?stream=true&interval_ms=200", &[][..]),
    ] {
        let mut s = open(&addr, "GET", path, headers, "").await;
        let t0 = Instant::now();
        let got = read_until(&mut s, "\n\n", 3).await;
        let (head, body) = got.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/event-stream"),
            "{head}"
        );
        // At least two complete events, each one JSON snapshot.
        let events: Vec<Value> = body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str(d).ok())
            .collect();
        assert!(events.len() >= 2, "{body}");
        for e in &events {
            assert!(e["server"]["uptime_secs"].is_number(), "{e}");
            assert!(e["requests"]["running"].is_array(), "{e}");
        }
        // One per interval, not all at once.
        let (a, b) = (
            events[0]["server"]["time"].as_f64().unwrap(),
            events[1]["server"]["time"].as_f64().unwrap(),
        );
        assert!(b - a >= 0.15, "events {a} and {b} too close");
        assert!(t0.elapsed() >= Duration::from_millis(150));
        assert_eq!(status(&addr).await["server"]["status_streams"], 1);
        drop(s);
    }
    // Both streams ended with their clients (the server stops sending).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = status(&addr).await;
        if s["server"]["status_streams"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "event streams still open: {s:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Plain JSON without either.
    let a = http(&addr, "GET", "/v1/status", &[("Accept", "*/*")], "").await;
    assert!(
        a.head.contains("content-type: application/json"),
        "{}",
        a.head
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_requires_the_api_key() {
    let config = ServerConfig {
        api_key: Some("sekret".into()),
        ..ServerConfig::default()
    };
    let Some(addr) = start(config).await else {
        return;
    };
    let no = http(&addr, "GET", "/v1/status", &[], "").await;
    assert_eq!(no.status, 401, "{}", no.body);
    assert!(!no.body.contains("kv"), "{}", no.body);
    let wrong = http(
        &addr,
        "GET",
        "/v1/status?stream=true",
        &[("Authorization", "Bearer nope")],
        "",
    )
    .await;
    assert_eq!(wrong.status, 401);
    let ok = http(
        &addr,
        "GET",
        "/v1/status",
        &[("Authorization", "Bearer sekret")],
        "",
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    let ok = http(&addr, "GET", "/v1/status", &[("x-api-key", "sekret")], "").await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    // The page itself holds no data: it loads, then asks for the key.
    let page = http(&addr, "GET", "/", &[], "").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("API key"));
    // Other routes stay closed.
    let models = http(&addr, "GET", "/v1/models", &[], "").await;
    assert_eq!(models.status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_is_self_contained_html() {
    let Some(addr) = start(ServerConfig::default()).await else {
        return;
    };
    let a = http(&addr, "GET", "/", &[], "").await;
    assert_eq!(a.status, 200);
    assert!(a.head.contains("content-type: text/html"), "{}", a.head);
    assert!(a.body.starts_with("<!DOCTYPE html>"));
    assert!(a.body.contains("<canvas"));
    assert!(a.body.contains("/v1/status"));
    for outside in ["http://", "https://", "src=\"//", "href=\"//", "@import"] {
        assert!(!a.body.contains(outside), "the page references {outside}");
    }
    // Scripts and styles are inline.
    assert!(!a.body.contains("<script src"), "external script");
    assert!(!a.body.contains("<link"), "external stylesheet");
}
