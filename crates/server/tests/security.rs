//! The server's defences over real HTTP (issue 33): DNS-rebinding `Host`
//! headers, cross-origin requests and preflights, "simple" cross-site POSTs,
//! 429/529 with `Retry-After` when every generation slot is taken, slow
//! clients (header and body timeouts), 413, and the connection cap. Serves
//! SmolLM2-135M (`scripts/fetch-models.sh`) on the CPU on a loopback port with
//! [`tempo9_server::serve_on`] (the server `tempo9 serve` runs); a raw HTTP/1.1
//! client, so a test controls every header and byte.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tempo9_engine::{Engine, EngineConfig};
use tempo9_models::{LoadOptions, Model};
use tempo9_server::{access::AccessConfig, serve_on, AppState, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MODEL: &str = "smollm2-135m-instruct-q4_1.gguf";

/// The model, loaded once; `None` (skipped) when missing and
/// `TEMPO9_SKIP_MODEL_TESTS=1`, a failure otherwise.
fn model() -> Option<Arc<Model>> {
    static M: OnceLock<Option<Arc<Model>>> = OnceLock::new();
    M.get_or_init(|| {
        let dir = std::env::var_os("TEMPO9_MODELS")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tempo9/models")
            });
        let p = dir.join(MODEL);
        if !p.exists() {
            if std::env::var("TEMPO9_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
                eprintln!("skipping: {} missing", p.display());
                return None;
            }
            panic!("model {} missing: run scripts/fetch-models.sh", p.display());
        }
        let opts = LoadOptions::new(tempo9_ggml::Device::cpu());
        Some(Arc::new(Model::load(&p, opts).expect("load model")))
    })
    .clone()
}

/// Starts a server on a free loopback port; its address.
async fn start(config: ServerConfig) -> Option<String> {
    let model = model()?;
    let tok = Arc::new(tempo9_tokenizer::Tokenizer::from_gguf(model.gguf()).expect("tokenizer"));
    let cfg = EngineConfig {
        threads: 2,
        kv_budget_bytes: Some(64 << 20),
        max_context: Some(4096),
        ..EngineConfig::default()
    };
    let engine = Engine::start(model, tok, cfg).expect("engine");
    let state = Arc::new(AppState::new(engine, config).expect("state"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(serve_on(listener, state, std::future::pending()));
    Some(addr)
}

/// An answer: status code, lower-cased head, body.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: String,
}

/// Sends `head` (request line and headers, without the blank line) and `body`
/// with `Connection: close` and `Content-Length`; reads the whole answer.
async fn raw(addr: &str, head: &str, body: &str) -> Answer {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{head}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    read_answer(&mut s).await
}

async fn read_answer(s: &mut TcpStream) -> Answer {
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut raw))
        .await
        .expect("answer in time")
        .unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").expect("HTTP head");
    Answer {
        status: head[9..12].parse().expect("status code"),
        head: head.to_ascii_lowercase(),
        body: body.to_string(),
    }
}

const CHAT: &str = r#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":1}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_rebinding_host_is_refused() {
    let Some(addr) = start(ServerConfig::default()).await else {
        return;
    };
    let port = addr.rsplit(':').next().unwrap();
    // A page of evil.example whose name now resolves to 127.0.0.1.
    let a = raw(
        &addr,
        &format!("GET /v1/models HTTP/1.1\r\nHost: evil.example:{port}"),
        "",
    )
    .await;
    assert_eq!(a.status, 403, "{a:?}");
    assert!(a.body.contains("--allowed-host evil.example"), "{}", a.body);
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        let a = raw(
            &addr,
            &format!("GET /v1/models HTTP/1.1\r\nHost: {host}"),
            "",
        )
        .await;
        assert_eq!(a.status, 200, "{host}: {a:?}");
    }
    // Even the open health check: a rebinding page learns nothing.
    let a = raw(&addr, "GET /health HTTP/1.1\r\nHost: evil.example", "").await;
    assert_eq!(a.status, 403);

    let cfg = ServerConfig {
        access: AccessConfig {
            allowed_hosts: vec!["box.lan".into()],
            ..AccessConfig::default()
        },
        ..ServerConfig::default()
    };
    let Some(addr) = start(cfg).await else { return };
    let a = raw(&addr, "GET /v1/models HTTP/1.1\r\nHost: box.lan:11435", "").await;
    assert_eq!(a.status, 200, "{a:?}");
    let a = raw(&addr, "GET /v1/models HTTP/1.1\r\nHost: other.lan", "").await;
    assert_eq!(a.status, 403, "{a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_origin_is_refused_by_default_and_allowed_with_the_flag() {
    let preflight = "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\
                     Access-Control-Request-Method: POST\r\n\
                     Access-Control-Request-Headers: content-type, authorization";
    let Some(addr) = start(ServerConfig::default()).await else {
        return;
    };
    let a = raw(
        &addr,
        &format!("{preflight}\r\nOrigin: https://app.example"),
        "",
    )
    .await;
    assert_eq!(a.status, 403, "{a:?}");
    assert!(
        !a.head.contains("access-control-allow-origin"),
        "{}",
        a.head
    );
    let get = "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1";
    let a = raw(&addr, &format!("{get}\r\nOrigin: https://app.example"), "").await;
    assert_eq!(a.status, 403, "{a:?}");
    // The server's own pages (the status page) are same-origin.
    let a = raw(
        &addr,
        "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:9\r\nOrigin: http://127.0.0.1:9",
        "",
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");

    let cfg = ServerConfig {
        access: AccessConfig {
            cors_origins: vec!["https://app.example".into()],
            ..AccessConfig::default()
        },
        ..ServerConfig::default()
    };
    let Some(addr) = start(cfg).await else { return };
    let a = raw(
        &addr,
        &format!("{preflight}\r\nOrigin: https://app.example"),
        "",
    )
    .await;
    assert_eq!(a.status, 204, "{a:?}");
    assert!(
        a.head
            .contains("access-control-allow-origin: https://app.example"),
        "{}",
        a.head
    );
    assert!(
        a.head
            .contains("access-control-allow-headers: content-type, authorization"),
        "{}",
        a.head
    );
    let a = raw(&addr, &format!("{get}\r\nOrigin: https://app.example"), "").await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(
        a.head
            .contains("access-control-allow-origin: https://app.example"),
        "{}",
        a.head
    );
    let a = raw(
        &addr,
        &format!("{preflight}\r\nOrigin: https://evil.example"),
        "",
    )
    .await;
    assert_eq!(a.status, 403, "{a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simple_cross_site_posts_are_refused() {
    let Some(addr) = start(ServerConfig::default()).await else {
        return;
    };
    let post = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1";
    // What a page's <form> or fetch(no-cors) can send without a preflight.
    for ty in [
        "text/plain",
        "multipart/form-data; boundary=x",
        "application/x-www-form-urlencoded",
    ] {
        let a = raw(
            &addr,
            &format!("{post}\r\nContent-Type: {ty}\r\nOrigin: null"),
            CHAT,
        )
        .await;
        assert!(a.status == 403 || a.status == 415, "{ty}: {a:?}");
        let a = raw(&addr, &format!("{post}\r\nContent-Type: {ty}"), CHAT).await;
        let want = if ty.starts_with("application/x-www") {
            200
        } else {
            415
        };
        assert_eq!(a.status, want, "{ty} without Origin: {a:?}");
    }
    let a = raw(&addr, &format!("{post}\r\nContent-Type: text/plain"), CHAT).await;
    assert!(a.body.contains("application/json"), "{}", a.body);
    // Ollama's own examples: `curl -d` (form type) and no type at all.
    let a = raw(
        &addr,
        "POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1",
        r#"{"prompt":"Hi","stream":false,"options":{"num_predict":1}}"#,
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    let a = raw(
        &addr,
        &format!("{post}\r\nContent-Type: application/json"),
        CHAT,
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
}

/// A streaming request that holds its generation slot until it is read.
async fn hold_slot(addr: &str) -> TcpStream {
    let body = r#"{"messages":[{"role":"user","content":"Tell a long story."}],"max_tokens":2000,"stream":true,"temperature":0}"#;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_answers_429_and_anthropic_529_with_retry_after() {
    let cfg = ServerConfig {
        max_concurrent: 1,
        ..ServerConfig::default()
    };
    let Some(addr) = start(cfg).await else { return };
    let held = hold_slot(&addr).await;
    let json = "\r\nHost: 127.0.0.1\r\nContent-Type: application/json";
    let a = raw(
        &addr,
        &format!("POST /v1/chat/completions HTTP/1.1{json}"),
        CHAT,
    )
    .await;
    assert_eq!(a.status, 429, "{a:?}");
    assert!(a.head.contains("retry-after: 1"), "{}", a.head);
    assert!(a.body.contains("rate_limit_error"), "{}", a.body);
    let msg = r#"{"model":"x","max_tokens":1,"messages":[{"role":"user","content":"Hi"}]}"#;
    let a = raw(&addr, &format!("POST /v1/messages HTTP/1.1{json}"), msg).await;
    assert_eq!(a.status, 529, "{a:?}");
    assert!(a.head.contains("retry-after: 1"), "{}", a.head);
    assert!(a.body.contains("overloaded_error"), "{}", a.body);
    // Counting tokens renders a template too: same limit.
    let a = raw(
        &addr,
        &format!("POST /v1/messages/count_tokens HTTP/1.1{json}"),
        msg,
    )
    .await;
    assert_eq!(a.status, 529, "{a:?}");
    let a = raw(&addr, &format!("POST /api/chat HTTP/1.1{json}"), CHAT).await;
    assert_eq!(a.status, 429, "{a:?}");
    drop(held);
    // The slot comes back once the client is gone.
    let t0 = Instant::now();
    loop {
        let a = raw(
            &addr,
            &format!("POST /v1/chat/completions HTTP/1.1{json}"),
            CHAT,
        )
        .await;
        if a.status == 200 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "slot never freed: {a:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_wide_token_limit_answers_429_and_529_and_comes_back() {
    let cfg = ServerConfig {
        max_total_tokens: Some(600),
        ..ServerConfig::default()
    };
    let Some(addr) = start(cfg).await else { return };
    let json = "\r\nHost: 127.0.0.1\r\nContent-Type: application/json";
    // A prompt longer than the limit can never be admitted: 400, not 429.
    let long = format!(
        r#"{{"messages":[{{"role":"user","content":"{}"}}],"max_tokens":1}}"#,
        "word ".repeat(700)
    );
    let a = raw(
        &addr,
        &format!("POST /v1/chat/completions HTTP/1.1{json}"),
        &long,
    )
    .await;
    assert_eq!(a.status, 400, "{a:?}");
    assert!(a.body.contains("--max-total-tokens"), "{}", a.body);
    // max_tokens 2000 shrinks to what the limit leaves: the request takes all 600.
    let held = hold_slot(&addr).await;
    let a = raw(
        &addr,
        &format!("POST /v1/chat/completions HTTP/1.1{json}"),
        CHAT,
    )
    .await;
    assert_eq!(a.status, 429, "{a:?}");
    assert!(a.head.contains("retry-after: 1"), "{}", a.head);
    assert!(a.body.contains("token limit"), "{}", a.body);
    let msg = r#"{"model":"tempo9","max_tokens":1,"messages":[{"role":"user","content":"Hi"}]}"#;
    let a = raw(&addr, &format!("POST /v1/messages HTTP/1.1{json}"), msg).await;
    assert_eq!(a.status, 529, "{a:?}");
    assert!(a.body.contains("overloaded_error"), "{}", a.body);
    let a = raw(&addr, &format!("POST /api/chat HTTP/1.1{json}"), CHAT).await;
    assert_eq!(a.status, 429, "{a:?}");
    drop(held);
    // The tokens come back once the client is gone.
    let t0 = Instant::now();
    loop {
        let a = raw(
            &addr,
            &format!("POST /v1/chat/completions HTTP/1.1{json}"),
            CHAT,
        )
        .await;
        if a.status == 200 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "tokens never given back: {a:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_time_out_and_big_bodies_get_413() {
    let cfg = ServerConfig {
        header_timeout: Duration::from_secs(1),
        body_timeout: Duration::from_secs(1),
        max_body_bytes: 1000,
        ..ServerConfig::default()
    };
    let Some(addr) = start(cfg).await else { return };
    // Half a request head, then silence: closed after the header timeout.
    for partial in ["GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n", ""] {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(partial.as_bytes()).await.unwrap();
        let t0 = Instant::now();
        let mut buf = Vec::new();
        let r = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
        assert!(r.is_ok(), "{partial:?}: connection still open after 10 s");
        assert!(t0.elapsed() < Duration::from_secs(5), "{partial:?}");
    }
    // A body that never arrives in full: 408.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"messages\"")
        .await
        .unwrap();
    let a = read_answer(&mut s).await;
    assert_eq!(a.status, 408, "{a:?}");
    let big = format!(
        r#"{{"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(2000)
    );
    let a = raw(
        &addr,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json",
        &big,
    )
    .await;
    assert_eq!(a.status, 413, "{a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_wait() {
    let cfg = ServerConfig {
        max_connections: 2,
        header_timeout: Duration::from_secs(30),
        ..ServerConfig::default()
    };
    let Some(addr) = start(cfg).await else { return };
    let idle1 = TcpStream::connect(&addr).await.unwrap();
    let _idle2 = TcpStream::connect(&addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let early = tokio::time::timeout(Duration::from_millis(700), s.read(&mut buf)).await;
    assert!(
        early.is_err(),
        "a third connection was served beyond the cap of 2"
    );
    drop(idle1);
    let a = read_answer(&mut s).await;
    assert_eq!(a.status, 200, "{a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_panic_fails_its_requests_and_health() {
    let Some(model) = model() else { return };
    let tok = Arc::new(tempo9_tokenizer::Tokenizer::from_gguf(model.gguf()).expect("tokenizer"));
    let cfg = EngineConfig {
        threads: 2,
        kv_budget_bytes: Some(64 << 20),
        max_context: Some(4096),
        ..EngineConfig::default()
    };
    let engine = Engine::start(model, tok, cfg).expect("engine");
    let state = Arc::new(AppState::new(engine.clone(), ServerConfig::default()).expect("state"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(serve_on(listener, state, std::future::pending()));
    let get = "GET /health HTTP/1.1\r\nHost: 127.0.0.1";
    assert_eq!(raw(&addr, get, "").await.status, 200);
    let mut held = hold_slot(&addr).await;
    engine.inject_panic();
    // The running stream ends, with an error.
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), held.read_to_end(&mut rest))
        .await
        .expect("the stream ends")
        .unwrap();
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("error"), "{rest}");
    let h = raw(&addr, get, "").await;
    assert_eq!(h.status, 503, "{h:?}");
    assert!(
        h.body.contains("\"status\":\"error\"") && h.body.contains("injected engine panic"),
        "{}",
        h.body
    );
    let a = raw(
        &addr,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json",
        CHAT,
    )
    .await;
    assert_eq!(a.status, 503, "{a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preparing_stops_when_the_client_is_gone_and_keeps_its_slot_until_then() {
    use tempo9_server::chat::{Cancel, GenParams, Prompt};
    use tempo9_server::error::Family;
    let Some(model) = model() else { return };
    let tok = Arc::new(tempo9_tokenizer::Tokenizer::from_gguf(model.gguf()).expect("tokenizer"));
    let engine = Engine::start(model, tok, EngineConfig::default()).expect("engine");
    let cfg = ServerConfig {
        max_concurrent: 1,
        ..ServerConfig::default()
    };
    let st = Arc::new(AppState::new(engine, cfg).expect("state"));
    // A preparation that runs until its client is gone.
    let (tx, rx) = std::sync::mpsc::channel();
    let slot = st.slot(Family::OpenAi).unwrap();
    let work = st.blocking(Family::OpenAi, slot, move |_, cancel| {
        let t0 = Instant::now();
        while !cancel.is_set() && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(300));
        tx.send(cancel.is_set()).unwrap();
        Ok(())
    });
    // The handler's future is dropped, as when the client disconnects.
    assert!(tokio::time::timeout(Duration::from_millis(200), work)
        .await
        .is_err());
    // The slot stays taken while the blocking work still runs…
    assert!(st.slot(Family::OpenAi).is_err());
    let seen = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the work ends");
    assert!(seen, "the work never saw its client leave");
    // …and comes back when it ends.
    let t0 = Instant::now();
    while st.slot(Family::OpenAi).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // `prepare` stops at its first stage once cancelled.
    let cancel = Cancel::default();
    cancel.set();
    let prompt = Prompt::Chat {
        messages: vec![serde_json::json!({"role": "user", "content": "Hi"})],
        tools: Vec::new(),
        tool_choice: tempo9_server::chat::ToolChoice::Auto,
        template: Default::default(),
    };
    let e = st
        .prepare_cancellable(Family::OpenAi, prompt, GenParams::default(), true, &cancel)
        .err()
        .expect("cancelled");
    assert!(e.message.contains("went away"), "{}", e.message);
}
