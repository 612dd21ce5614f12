//! The facade on the real models (`scripts/fetch-models.sh`), on the CPU:
//! greedy chat equal to the server's answer for the same request, streaming
//! (blocking and async), a tool-call round trip on Qwen2.5-Coder-0.5B,
//! cancellation by drop freeing KV pages (engine stats), two threads sharing
//! one model and its prefix cache, and typed errors.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tempo9::{ChatOptions, ErrorKind, Event, LoadOptions, Model, SsdConfig, Stop};

const SMOL: &str = "smollm2-135m-instruct-q4_1.gguf";
const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// The model's path; `None` (skipped) when missing and
/// `TEMPO9_SKIP_MODEL_TESTS=1`, a failure otherwise (as the engine's tests).
fn model_path(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("TEMPO9_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tempo9/models")
        });
    let p = dir.join(name);
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

fn ssd_dir(test: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tempo9-sdk-{}-{test}", std::process::id()))
}

/// Removes a test's SSD-tier directory when the test ends.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Small settings for a shared 2-core machine; the SSD tier in a directory of
/// this test's own.
fn options(test: &str) -> LoadOptions {
    let dir = ssd_dir(test);
    LoadOptions {
        threads: Some(2),
        context: Some(4096),
        kv_budget_bytes: Some(64 << 20),
        ssd: Some(SsdConfig::new(dir)),
        ..LoadOptions::default()
    }
}

/// The model, and the guard that removes its SSD tier's directory.
fn load(name: &str, test: &str) -> Option<(Model, Cleanup)> {
    let p = model_path(name)?;
    let model = Model::load(p.to_str().unwrap(), &options(test)).expect("load");
    Some((model, Cleanup(ssd_dir(test))))
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// The same request through the HTTP server (in process, own engine on the
/// same file and settings): the OpenAI chat completion's JSON answer.
fn server_answer(name: &str, body: Value) -> Value {
    let path = model_path(name).unwrap();
    let model = Arc::new(
        tempo9_models::Model::load(
            &path,
            tempo9_models::LoadOptions::new(tempo9_ggml::Device::cpu()),
        )
        .unwrap(),
    );
    let tok = Arc::new(tempo9_tokenizer::Tokenizer::from_gguf(model.gguf()).unwrap());
    let o = options("server");
    let cfg = tempo9_engine::EngineConfig {
        threads: 2,
        kv_budget_bytes: o.kv_budget_bytes,
        max_context: o.context,
        ..tempo9_engine::EngineConfig::default()
    };
    let engine = tempo9_engine::Engine::start(model, tok, cfg).unwrap();
    let state = Arc::new(
        tempo9_server::AppState::new(engine.clone(), tempo9_server::ServerConfig::default())
            .unwrap(),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let answer = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, tempo9_server::router(state)).await });
        tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            let b = body.to_string();
            write!(
                s,
                "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
                b.len()
            )
            .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            let (head, body) = out.split_once("\r\n\r\n").unwrap();
            assert!(head.starts_with("HTTP/1.1 200"), "{out}");
            serde_json::from_str::<Value>(body).unwrap()
        })
        .await
        .unwrap()
    });
    engine.shutdown();
    answer
}

#[test]
fn greedy_chat_equals_the_servers_answer() {
    let Some((model, _cleanup)) = load(SMOL, "greedy") else {
        return;
    };
    // 32 prompt tokens or more, so that the repeat below copies a cached block (a
    // copy leaves a 16-token block to compute).
    let messages = [
        json!({"role": "system", "content": "You are a concise assistant. Answer in one short sentence, in plain words."}),
        user("Name three colors of the rainbow."),
    ];
    let ours = model
        .chat(&messages, &[], &ChatOptions::greedy(48))
        .unwrap()
        .collect_blocking();
    let theirs = server_answer(
        SMOL,
        json!({"messages": messages, "temperature": 0, "max_tokens": 48}),
    );
    let msg = &theirs["choices"][0]["message"];
    assert!(!ours.text.is_empty());
    assert_eq!(ours.text, msg["content"].as_str().unwrap());
    assert_eq!(
        ours.usage.completion_tokens as u64,
        theirs["usage"]["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        ours.usage.prompt_tokens as u64,
        theirs["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    // The JSON options path (C, Python) is the same request.
    let via_json = model
        .chat_json(
            &serde_json::to_string(&messages).unwrap(),
            "",
            r#"{"temperature": 0, "max_tokens": 48}"#,
        )
        .unwrap()
        .collect_blocking();
    assert_eq!(via_json.text, ours.text);
    // Same prompt again: served from the prefix cache.
    assert!(via_json.usage.cached_tokens > 0, "{:?}", via_json.usage);
}

#[test]
fn streams_blocking_and_async() {
    let Some((model, _cleanup)) = load(SMOL, "stream") else {
        return;
    };
    let messages = [user("Write one sentence about the sea.")];
    let events: Vec<Event> = model
        .chat(&messages, &[], &ChatOptions::greedy(24))
        .unwrap()
        .collect();
    let texts: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            Event::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert!(texts.len() > 3, "streamed in pieces: {texts:?}");
    let Some(Event::Done { usage, stop, .. }) = events.last() else {
        panic!("the last event is Done: {events:?}");
    };
    assert!(matches!(stop, Stop::EndTurn | Stop::Length));
    assert!(usage.completion_tokens > 3);
    // The same request on an async runtime, event by event.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let m = model.clone();
    let async_text = rt.block_on(async move {
        let mut s = m.chat(&messages, &[], &ChatOptions::greedy(24)).unwrap();
        let mut text = String::new();
        let mut done = None;
        while let Some(e) = s.next_event().await {
            match e {
                Event::Text(t) => text.push_str(&t),
                Event::Done { usage, .. } => done = Some(usage),
                _ => {}
            }
        }
        let usage = done.expect("done event");
        assert!(
            usage.cached_tokens > 0,
            "second identical prompt hits the cache"
        );
        text
    });
    assert_eq!(async_text, texts.concat());
    // Plain completion on token ids: exactly max_tokens without stopping at EOG.
    let ids = model.tokenize("The sea is");
    let opts = tempo9::CompleteOptions {
        max_tokens: 8,
        stop_at_eog: false,
        ..Default::default()
    };
    let evs: Vec<_> = model.complete(&ids, &opts).unwrap().collect();
    let tokens = evs
        .iter()
        .filter(|e| matches!(e, tempo9::CompletionEvent::Token(_)))
        .count();
    assert_eq!(tokens, 8);
    assert!(matches!(
        evs.last(),
        Some(tempo9::CompletionEvent::Finished(_))
    ));
}

#[test]
fn tool_call_round_trip() {
    let Some((model, _cleanup)) = load(QWEN, "tools") else {
        return;
    };
    let weather = json!({"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a given city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                       "required": ["city"]}}});
    let tools = [weather];
    let mut messages = vec![
        json!({"role": "system", "content": "You are a helpful assistant."}),
        user("What is the weather in Paris right now?"),
    ];
    let first = model
        .chat(&messages, &tools, &ChatOptions::greedy(40))
        .unwrap()
        .collect_blocking();
    assert_eq!(first.stop, Stop::ToolCalls, "{first:?}");
    let call = &first.calls[0];
    assert_eq!(call.name, "get_weather");
    let args: Value = serde_json::from_str(&call.arguments).unwrap();
    assert!(args["city"]
        .as_str()
        .unwrap()
        .to_lowercase()
        .contains("paris"));
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]}));
    messages.push(
        json!({"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 23 degrees Celsius."}),
    );
    messages.push(user("Now tell me the answer in one sentence."));
    let second = model
        .chat(&messages, &tools, &ChatOptions::greedy(32))
        .unwrap()
        .collect_blocking();
    assert!(
        matches!(second.stop, Stop::EndTurn | Stop::Length),
        "{second:?}"
    );
    assert!(second.calls.is_empty());
    assert!(second.text.contains("23"), "{}", second.text);
    assert!(second.usage.cached_tokens >= 64, "{:?}", second.usage);
}

/// Polls the engine's stats (published after each step) until `f` holds.
fn wait_for(model: &Model, f: impl Fn(&tempo9::EngineStats) -> bool) -> tempo9::EngineStats {
    let t0 = Instant::now();
    loop {
        let s = model.stats();
        if f(&s) {
            return s;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "timed out: {s:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn dropping_a_stream_cancels_and_frees_pages() {
    let Some((model, _cleanup)) = load(SMOL, "cancel") else {
        return;
    };
    let idle = wait_for(&model, |s| s.running == 0);
    assert_eq!(idle.kv_pages_used, 0);
    let mut s = model
        .chat(
            &[user("Tell me a very long story about a dragon.")],
            &[],
            &ChatOptions::greedy(2000),
        )
        .unwrap();
    for _ in 0..4 {
        assert!(matches!(s.next(), Some(Event::Text(_))));
    }
    let busy = wait_for(&model, |s| s.running == 1);
    assert!(busy.kv_pages_used > 0, "{busy:?}");
    drop(s);
    let after = wait_for(&model, |s| s.running == 0 && s.waiting == 0);
    assert_eq!(after.kv_pages_used, 0, "{after:?}");
    // Far fewer tokens than asked for were generated.
    assert!(after.generated_tokens_total < 1000, "{after:?}");
}

#[test]
fn two_threads_share_one_model_and_its_prefix_cache() {
    let Some((model, _cleanup)) = load(SMOL, "threads") else {
        return;
    };
    let system = json!({"role": "system", "content": format!(
        "You are the assistant of a hardware store. {}",
        "Answer questions about tools, paint, garden supplies and opening hours politely. ".repeat(12))});
    let ask = |m: &Model, q: &str| {
        m.chat(&[system.clone(), user(q)], &[], &ChatOptions::greedy(16))
            .unwrap()
            .collect_blocking()
    };
    let warm = ask(&model, "Hello!");
    assert!(warm.usage.prompt_tokens > 128, "{:?}", warm.usage);
    std::thread::scope(|scope| {
        let handles: Vec<_> = ["Do you sell hammers?", "When do you open on Sunday?"]
            .into_iter()
            .map(|q| {
                let m = model.clone();
                let ask = &ask;
                scope.spawn(move || ask(&m, q))
            })
            .collect();
        for h in handles {
            let c = h.join().unwrap();
            assert!(!c.text.is_empty());
            // The system prompt's whole pages came from the first request's cache.
            assert!(c.usage.cached_tokens >= 128, "{:?}", c.usage);
        }
    });
    assert!(model.stats().prefix_hit_tokens >= 256);
}

#[test]
fn errors_are_typed() {
    let missing = Model::load("/nonexistent/model.gguf", &LoadOptions::default());
    assert_eq!(missing.err().unwrap().kind, ErrorKind::BadFile);
    let junk = std::env::temp_dir().join(format!("tempo9-sdk-junk-{}.gguf", std::process::id()));
    std::fs::write(&junk, b"not a gguf file at all").unwrap();
    let bad = Model::load(junk.to_str().unwrap(), &LoadOptions::default());
    std::fs::remove_file(&junk).ok();
    assert_eq!(bad.err().unwrap().kind, ErrorKind::BadFile);
    // A valid GGUF file of an architecture Tempo9 does not implement.
    let other = std::env::temp_dir().join(format!("tempo9-sdk-arch-{}.gguf", std::process::id()));
    let mut w = tempo9_gguf::GgufWriter::new();
    w.set(
        "general.architecture",
        tempo9_gguf::Value::String("mamba9".into()),
    );
    w.write(
        &mut std::fs::File::create(&other).unwrap(),
        |_, _, _| Ok(()),
    )
    .unwrap();
    let arch = Model::load(other.to_str().unwrap(), &LoadOptions::default());
    // A GPU asked for where no CUDA backend library is: a typed error naming it.
    let cuda =
        LoadOptions::from_json(&json!({"device": "cuda", "backend_dir": "/nonexistent"})).unwrap();
    assert_eq!(cuda.device, tempo9::DeviceChoice::Cuda);
    if let Err(e) = Model::load(other.to_str().unwrap(), &cuda) {
        assert_eq!(e.kind, ErrorKind::Engine, "{e}");
        assert!(e.to_string().contains("libggml-cuda.so"), "{e}");
    }
    std::fs::remove_file(&other).ok();
    let e = arch.err().unwrap();
    assert_eq!(e.kind, ErrorKind::UnsupportedArchitecture, "{e}");
    assert_eq!(
        LoadOptions::from_json(&json!({"device": "gpu"}))
            .err()
            .unwrap()
            .kind,
        ErrorKind::BadRequest
    );
    assert_eq!(
        LoadOptions::from_json(&json!({"threads": "two"}))
            .err()
            .unwrap()
            .kind,
        ErrorKind::BadRequest
    );
    let Some((model, _cleanup)) = load(SMOL, "errors") else {
        return;
    };
    let long = "hello ".repeat(5000);
    let e = model
        .chat(&[user(&long)], &[], &ChatOptions::greedy(8))
        .err()
        .unwrap();
    assert_eq!(e.kind, ErrorKind::ContextOverflow, "{e}");
    let opts = ChatOptions {
        response_format: Some(
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 12}}}),
        ),
        ..ChatOptions::greedy(8)
    };
    let e = model.chat(&[user("hi")], &[], &opts).err().unwrap();
    assert_eq!(e.kind, ErrorKind::InvalidSchema, "{e}");
    let e = model
        .chat(
            &[json!({"role": "wizard", "content": "hi"})],
            &[],
            &ChatOptions::greedy(8),
        )
        .err()
        .unwrap();
    assert_eq!(e.kind, ErrorKind::BadRequest, "{e}");
    let e = model
        .chat(
            &[user("hi")],
            &[json!({"type": "function"})],
            &ChatOptions::greedy(8),
        )
        .err()
        .unwrap();
    assert_eq!(e.kind, ErrorKind::BadRequest, "{e}");
    let e = model.chat_json("not json", "", "").err().unwrap();
    assert_eq!(e.kind, ErrorKind::BadRequest, "{e}");
    let e = model
        .complete(&[u32::MAX], &Default::default())
        .err()
        .unwrap();
    assert_eq!(e.kind, ErrorKind::BadRequest, "{e}");
}
