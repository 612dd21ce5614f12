//! Request model names over real HTTP on every API: an agent's own name
//! (`claude-…`, `gpt-…`) is answered by the served model and reported under
//! its real name; `strict_model_names` (`--strict-model-names`) refuses it with
//! each API's 404; the name of another model on this machine stays a 404.
//! Serves SmolLM2-135M (`scripts/fetch-models.sh`) on the CPU on a loopback
//! port.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tempo9_engine::{Engine, EngineConfig};
use tempo9_models::{LoadOptions, Model};
use tempo9_server::model_names::LocalModels;
use tempo9_server::{router, AppState, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MODEL: &str = "smollm2-135m-instruct-q4_1.gguf";
const SERVED: &str = "smol";

/// The models directory and the model's path; `None` (skipped) when missing
/// and `TEMPO9_SKIP_MODEL_TESTS=1`, a failure otherwise.
fn model_path() -> Option<(PathBuf, PathBuf)> {
    let dir = std::env::var_os("TEMPO9_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tempo9/models")
        });
    let p = dir.join(MODEL);
    if p.exists() {
        return Some((dir, p));
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

/// Starts a server named [`SERVED`] whose other local models are the GGUF
/// files beside it; its address and that directory.
async fn start(strict: bool) -> Option<(String, PathBuf)> {
    let (dir, path) = model_path()?;
    let model = Arc::new(
        Model::load(&path, LoadOptions::new(tempo9_ggml::Device::cpu())).expect("load model"),
    );
    let tok = Arc::new(tempo9_tokenizer::Tokenizer::from_gguf(model.gguf()).expect("tokenizer"));
    let cfg = EngineConfig {
        threads: 2,
        kv_budget_bytes: Some(64 << 20),
        max_context: Some(2048),
        ..EngineConfig::default()
    };
    let engine = Engine::start(model, tok, cfg).expect("engine");
    let config = ServerConfig {
        model_name: SERVED.into(),
        strict_model_names: strict,
        local_models: LocalModels {
            ollama_root: None,
            gguf_dir: Some(dir.clone()),
        },
        ..ServerConfig::default()
    };
    let state = Arc::new(
        AppState::new(engine, config)
            .expect("state")
            .with_path(path),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, router(state)).await });
    Some((addr, dir))
}

/// Sends one request (`Connection: close`); the status and the JSON body.
async fn http(addr: &str, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str("\r\n");
    req.push_str(&body);
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(120), s.read_to_end(&mut raw))
        .await
        .expect("answer in time")
        .unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").expect("HTTP head");
    let status = head[9..12].parse().expect("status code");
    let v = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    (status, v)
}

/// One generation request per API naming `model`: path, body, and where its
/// answer names the model (`None`: the API's answers carry no model).
fn requests(model: &str) -> Vec<(&'static str, Value, Option<&'static str>)> {
    let msgs = json!([{"role": "user", "content": "Hi"}]);
    vec![
        (
            "/v1/chat/completions",
            json!({"model": model, "messages": msgs, "max_tokens": 2}),
            Some("/model"),
        ),
        (
            "/v1/completions",
            json!({"model": model, "prompt": "Hi", "max_tokens": 2}),
            Some("/model"),
        ),
        (
            "/v1/responses",
            json!({"model": model, "input": "Hi", "max_output_tokens": 2}),
            Some("/model"),
        ),
        (
            "/v1/messages",
            json!({"model": model, "messages": msgs, "max_tokens": 2}),
            Some("/model"),
        ),
        (
            "/v1/messages/count_tokens",
            json!({"model": model, "messages": msgs}),
            None,
        ),
        (
            "/api/chat",
            json!({"model": model, "messages": msgs, "stream": false,
                   "options": {"num_predict": 2}}),
            Some("/model"),
        ),
        (
            "/api/generate",
            json!({"model": model, "prompt": "Hi", "stream": false,
                   "options": {"num_predict": 2}}),
            Some("/model"),
        ),
        ("/api/show", json!({"model": model}), None),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_names_are_answered_by_the_served_model() {
    let Some((addr, _)) = start(false).await else {
        return;
    };
    for name in [
        "claude-sonnet-4-5-20250929",
        "gpt-5-codex",
        "llama3.2:latest",
    ] {
        for (path, body, model_at) in requests(name) {
            let (status, v) = http(&addr, "POST", path, &body).await;
            assert_eq!(status, 200, "{path} {name}: {v}");
            if let Some(at) = model_at {
                assert_eq!(v.pointer(at), Some(&json!(SERVED)), "{path} {name}: {v}");
            }
        }
        let (status, v) = http(&addr, "GET", &format!("/v1/models/{name}"), &Value::Null).await;
        assert_eq!((status, &v["id"]), (200, &json!(SERVED)), "{v}");
    }
    // The lists name the served model only.
    let (_, v) = http(&addr, "GET", "/v1/models", &Value::Null).await;
    let ids: Vec<&Value> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["id"])
        .collect();
    assert_eq!(ids, [SERVED]);
    let (_, v) = http(&addr, "GET", "/api/tags", &Value::Null).await;
    assert_eq!(v["models"][0]["name"], SERVED, "{v}");
    assert_eq!(v["models"].as_array().unwrap().len(), 1, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_local_model_stays_a_404() {
    let Some((addr, dir)) = start(false).await else {
        return;
    };
    // Another GGUF file beside the served one (the test's own, removed after).
    let other = format!("names-test-other-{}", std::process::id());
    let file = dir.join(format!("{other}.gguf"));
    std::fs::write(&file, b"not a model").unwrap();
    let answers = async {
        let mut out = Vec::new();
        for (path, body, _) in requests(&other) {
            out.push((path, http(&addr, "POST", path, &body).await));
        }
        out
    }
    .await;
    std::fs::remove_file(&file).unwrap();
    for (path, (status, v)) in answers {
        assert_eq!(status, 404, "{path}: {v}");
        assert!(
            v.to_string().contains("another model on this machine"),
            "{path}: {v}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_names_restore_the_404() {
    let Some((addr, _)) = start(true).await else {
        return;
    };
    for (path, body, _) in requests("gpt-4o") {
        let (status, v) = http(&addr, "POST", path, &body).await;
        assert_eq!(status, 404, "{path}: {v}");
        // Ollama's error is a string; OpenAI's and Anthropic's an object.
        let m = v["error"]
            .as_str()
            .or(v["error"]["message"].as_str())
            .unwrap_or_default();
        assert!(
            m.contains("'gpt-4o' not found") && m.contains("--strict-model-names"),
            "{path}: {v}"
        );
    }
    assert_eq!(anthropic_type(&addr).await, "not_found_error");
    let (status, _) = http(&addr, "GET", "/v1/models/gpt-4o", &Value::Null).await;
    assert_eq!(status, 404);
    // The served name (with Ollama's `:latest`) and no name are answered.
    for body in [
        json!({"model": "smol:latest", "prompt": "Hi", "max_tokens": 1}),
        json!({"prompt": "Hi", "max_tokens": 1}),
    ] {
        let (status, v) = http(&addr, "POST", "/v1/completions", &body).await;
        assert_eq!(status, 200, "{v}");
    }
}

/// The Anthropic error type of a refused name.
async fn anthropic_type(addr: &str) -> String {
    let body = json!({"model": "claude-x", "max_tokens": 1,
                      "messages": [{"role": "user", "content": "Hi"}]});
    let (_, v) = http(addr, "POST", "/v1/messages", &body).await;
    v["error"]["type"].as_str().unwrap_or_default().to_string()
}
