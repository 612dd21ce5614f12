//! Shared helpers for the real-model tests.

#![allow(dead_code)]

use std::path::PathBuf;

use tempo9_gguf::GgufFile;

/// The three real models and their fixture directories.
pub const MODELS: [(&str, &str); 3] = [
    ("smollm2", "smollm2-135m-instruct-q4_1.gguf"),
    ("qwen2.5-coder", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
    ("gemma3", "gemma-3-270m-q4_k_m.gguf"),
];

/// The optional larger real model (`scripts/fetch-models.sh qwen2.5-coder-1.5b`;
/// the test command fetches it) and its fixture directory.
pub const CODER_1_5B: (&str, &str) = (
    "qwen2.5-coder-1.5b",
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
);

/// `$TEMPO9_MODELS` or `~/.cache/tempo9/models`.
pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TEMPO9_MODELS") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").expect("HOME is set");
    PathBuf::from(home).join(".cache/tempo9/models")
}

/// Whether missing models may be skipped (`TEMPO9_SKIP_MODEL_TESTS=1`).
pub fn skip_allowed() -> bool {
    std::env::var("TEMPO9_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1")
}

/// Opens a model; `None` only when it is missing and skipping is allowed
/// (otherwise a missing model fails the test).
pub fn open_model(file: &str) -> Option<GgufFile> {
    let path = models_dir().join(file);
    if !path.exists() {
        if skip_allowed() {
            eprintln!("skipping: {} not found", path.display());
            return None;
        }
        panic!(
            "model {} not found (set TEMPO9_MODELS, or TEMPO9_SKIP_MODEL_TESTS=1 to skip)",
            path.display()
        );
    }
    Some(GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// `tests/fixtures` at the workspace root.
pub fn fixtures_dir() -> PathBuf {
    manifest_dir().join("../../tests/fixtures")
}

/// Loads a fixture file; a missing fixture fails the test.
pub fn load_fixture(dir: &str, file: &str) -> serde_json::Value {
    let path = fixtures_dir().join(dir).join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// Shortens long strings for failure messages.
pub fn clip(s: &str) -> String {
    let s: String = s.chars().take(120).collect();
    format!("{s:?}")
}

/// `$TEMPO9_VOCAB` or `~/.cache/tempo9/vocab`: llama.cpp's vocab-only GGUFs
/// (with their `.inp`/`.out` test vectors) and, in `templates/`, its chat
/// templates (`scripts/fetch-models.sh vocab`).
pub fn vocab_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TEMPO9_VOCAB") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").expect("HOME is set");
    PathBuf::from(home).join(".cache/tempo9/vocab")
}

/// A file under [`vocab_dir`]; `None` (after a loud message) when it is
/// missing: `scripts/fetch-models.sh vocab` puts it there.
pub fn vocab_file(rel: &str) -> Option<PathBuf> {
    let path = vocab_dir().join(rel);
    if path.exists() {
        return Some(path);
    }
    eprintln!(
        "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
         !! SKIPPED: {} is missing: run scripts/fetch-models.sh vocab\n\
         !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n",
        path.display()
    );
    None
}

/// The crate's directory: cargo's `CARGO_MANIFEST_DIR` when it runs the test (a test
/// binary reused from a cache built in another checkout keeps that checkout's path
/// at compile time), else the compile-time one.
pub fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
