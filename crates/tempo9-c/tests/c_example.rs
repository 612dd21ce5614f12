//! Compiles `examples/chat.c` with the C compiler against `include/tempo9.h` and
//! this crate's static library, runs it on the real models, and checks what it
//! prints: greedy chat equal to the HTTP server's answer for the same request,
//! streaming, the callback variant, cancellation freeing KV pages (engine
//! stats), two threads sharing the prefix cache, typed errors, and a tool-call
//! round trip on Qwen2.5-Coder-0.5B.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde_json::{json, Value};

const SMOL: &str = "smollm2-135m-instruct-q4_1.gguf";
const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

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
    panic!("model {} missing: run scripts/fetch-models.sh", p.display());
}

/// The directory of the built libraries (`target/release`): this test runs
/// from its `deps/` subdirectory.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// The C example, built once for the tests of this run (they run in parallel:
/// a second build over the file one of them runs would fail its exec).
fn build_example() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(compile_example).clone()
}

/// Compiles the C example, linked with the static library `cargo test` just
/// built (`deps/libtempo9_c.a`: the shared one is made by `cargo build`, not by
/// `cargo test`) and ggml's shared libraries; its path.
fn compile_example() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = lib_dir();
    let archive = lib.join("deps/libtempo9_c.a");
    assert!(archive.exists(), "{} missing", archive.display());
    let out = std::env::temp_dir().join(format!("tempo9-c-example-{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
        .arg(dir.join("include"))
        .arg(dir.join("examples/chat.c"))
        .arg(&archive)
        .arg("-L")
        .arg(&lib)
        // ggml (shared, next to the binaries), then what Rust's std needs.
        .args(["-lggml", "-lggml-base", "-lggml-cpu", "-lstdc++", "-lgcc_s"])
        .args(["-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"])
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("a C compiler (cc, or $CC)");
    assert!(status.success(), "{cc} failed");
    out
}

/// Runs the example; its `key: value` lines.
fn run(exe: &Path, mode: &str, model: &Path) -> Vec<(String, String)> {
    let out = Command::new(exe)
        .arg(mode)
        .arg(model)
        .env("OMP_WAIT_POLICY", "passive")
        .output()
        .expect("run the C example");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "C example failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn value<'a>(lines: &'a [(String, String)], key: &str) -> &'a str {
    lines
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no '{key}' in the output: {lines:?}"))
}

fn events(lines: &[(String, String)]) -> Vec<Value> {
    lines
        .iter()
        .filter(|(k, _)| k == "event")
        .map(|(_, v)| serde_json::from_str(v).unwrap())
        .collect()
}

/// The same request through the HTTP server (in process, its own engine on
/// the same file): the OpenAI chat completion's JSON answer.
fn server_answer(path: &Path, body: Value) -> Value {
    let model = Arc::new(
        tempo9_models::Model::load(
            path,
            tempo9_models::LoadOptions::new(tempo9_ggml::Device::cpu()),
        )
        .unwrap(),
    );
    let tok = Arc::new(tempo9_tokenizer::Tokenizer::from_gguf(model.gguf()).unwrap());
    let cfg = tempo9_engine::EngineConfig {
        threads: 2,
        kv_budget_bytes: Some(64 << 20),
        max_context: Some(4096),
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
fn c_example_on_smollm2() {
    let Some(model) = model_path(SMOL) else {
        return;
    };
    let exe = build_example();
    let lines = run(&exe, "smol", &model);
    // Typed errors (the header's values).
    assert_eq!(value(&lines, "missing_file_status"), "-1");
    assert_eq!(value(&lines, "missing_file_error_nonempty"), "1");
    assert_eq!(value(&lines, "bad_options_status"), "-5");
    assert_eq!(value(&lines, "bad_messages_status"), "-5");
    assert_eq!(value(&lines, "bad_schema_status"), "-4");
    assert_eq!(value(&lines, "null_model_status"), "-8");
    // Greedy chat, streamed: equal to the server's answer.
    let evs = events(&lines);
    let text: String = evs
        .iter()
        .filter(|e| e["type"] == "text")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    let texts: usize = value(&lines, "greedy_text_events").parse().unwrap();
    assert!(texts > 3, "streamed in pieces");
    let messages = json!([
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three colors of the rainbow."}]);
    let theirs = server_answer(
        &model,
        json!({"messages": messages, "temperature": 0, "max_tokens": 48}),
    );
    assert_eq!(
        text,
        theirs["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let done: Value = serde_json::from_str(value(&lines, "greedy_done")).unwrap();
    assert_eq!(
        done["usage"]["completion_tokens"],
        theirs["usage"]["completion_tokens"]
    );
    // The callback saw the same events (texts and done); cancelling after 3 and
    // freeing a stream early both left no pages in use.
    let cb: usize = value(&lines, "callback_events").parse().unwrap();
    assert_eq!(cb, texts + 1);
    assert_eq!(value(&lines, "cancelled_after_events"), "3");
    assert_eq!(value(&lines, "pages_used_after_cancel"), "0");
    assert_eq!(value(&lines, "pages_used_after_free"), "0");
    assert_eq!(value(&lines, "completion_tokens"), "5");
    // Both threads' prompts started from the warm-up's cached system prompt.
    let cached: Vec<i64> = value(&lines, "thread_cached_tokens")
        .split(' ')
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(cached.iter().all(|&c| c >= 64), "{cached:?}");
}

#[test]
fn c_example_tool_round_trip_on_qwen() {
    let Some(model) = model_path(QWEN) else {
        return;
    };
    let exe = build_example();
    let lines = run(&exe, "tools", &model);
    let first: Value = serde_json::from_str(value(&lines, "first_done")).unwrap();
    assert_eq!(first["stop"], "tool_calls", "{lines:?}");
    let calls: Vec<Value> = events(&lines)
        .into_iter()
        .filter(|e| e["type"] == "tool_call")
        .collect();
    assert_eq!(calls[0]["name"], "get_weather");
    let args: Value = serde_json::from_str(calls[0]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"]
        .as_str()
        .unwrap()
        .to_lowercase()
        .contains("paris"));
    let second: Value = serde_json::from_str(value(&lines, "second_done")).unwrap();
    assert!(
        matches!(second["stop"].as_str(), Some("end_turn" | "length")),
        "{second}"
    );
    let answer: String = events(&lines)
        .iter()
        .skip_while(|e| e["type"] != "done")
        .filter(|e| e["type"] == "text")
        .map(|e| e["text"].as_str().unwrap().to_string())
        .collect();
    assert!(answer.contains("23"), "{answer}");
    assert!(second["usage"]["cached_tokens"].as_u64().unwrap() >= 64);
}
