//! Shared test helpers: the real models and the schema suite.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use tempo9_engine::{TokenConstraint, TokenMask};
use tempo9_grammar::Constraint;
use tempo9_tokenizer::Tokenizer;

pub const SMOLLM2: &str = "smollm2-135m-instruct-q4_1.gguf";
pub const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
pub const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";

/// Path of a real model; panics (fails the test) when missing unless
/// TEMPO9_SKIP_MODEL_TESTS=1, in which case it returns None.
pub fn model_path(file: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("TEMPO9_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tempo9/models")
        });
    let p = dir.join(file);
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

/// The tokenizer of a real model (weights not loaded).
pub fn tokenizer(file: &str) -> Option<Arc<Tokenizer>> {
    let p = model_path(file)?;
    let f = tempo9_gguf::GgufFile::open(&p).expect("open gguf");
    Some(Arc::new(Tokenizer::from_gguf(&f).expect("tokenizer")))
}

/// One schema of the suite (tests/schemas/*.json).
pub struct Case {
    pub name: String,
    pub prompt: String,
    pub schema: Value,
    pub valid: Vec<Value>,
    pub invalid: Vec<Value>,
}

/// The schema suite, sorted by file name.
pub fn cases() -> Vec<Case> {
    let dir = manifest_dir().join("tests/schemas");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("schemas dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let v: Value =
                serde_json::from_str(&std::fs::read_to_string(&p).expect("read")).expect("json");
            let list = |k: &str| v[k].as_array().expect(k).clone();
            Case {
                name: p.file_stem().unwrap().to_string_lossy().into_owned(),
                prompt: v["prompt"].as_str().expect("prompt").to_string(),
                schema: v["schema"].clone(),
                valid: list("valid"),
                invalid: list("invalid"),
            }
        })
        .collect()
}

/// Whether `instance` validates against `schema` (the reference validator, with
/// `format` asserted as the grammar enforces it).
pub fn schema_valid(schema: &Value, instance: &Value) -> bool {
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .expect("suite schema compiles")
        .is_valid(instance)
}

/// Time spent inside constraints, shared by the [`Timed`] wrappers of a run.
#[derive(Default)]
pub struct GrammarClock {
    pub total_nanos: AtomicU64,
    pub max_nanos: AtomicU64,
    pub calls: AtomicU64,
}

impl GrammarClock {
    fn add(&self, t0: Instant) {
        let ns = t0.elapsed().as_nanos() as u64;
        self.total_nanos.fetch_add(ns, Ordering::Relaxed);
        self.max_nanos.fetch_max(ns, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

/// A constraint that reports the time spent in it (masks and commits).
pub struct Timed {
    inner: Constraint,
    clock: Arc<GrammarClock>,
}

impl Timed {
    pub fn new(inner: Constraint, clock: Arc<GrammarClock>) -> Timed {
        Timed { inner, clock }
    }
}

impl TokenConstraint for Timed {
    fn compute_mask(&mut self) -> Result<TokenMask, String> {
        let t0 = Instant::now();
        let r = self.inner.compute_mask();
        self.clock.add(t0);
        r
    }

    fn compute_mask_within(&mut self, tokens_left: usize) -> Result<TokenMask, String> {
        let t0 = Instant::now();
        let r = self.inner.compute_mask_within(tokens_left);
        self.clock.add(t0);
        r
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        let t0 = Instant::now();
        let r = self.inner.accept(token);
        self.clock.add(t0);
        r
    }

    fn is_finished(&self) -> bool {
        TokenConstraint::is_finished(&self.inner)
    }
}

/// The crate's directory: cargo's `CARGO_MANIFEST_DIR` when it runs the test (a test
/// binary reused from a cache built in another checkout keeps that checkout's path
/// at compile time), else the compile-time one.
pub fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Feeds `text` token by token (`parse_special`: control-token strings in it become
/// those tokens, as a model writes markup); true when every token is allowed and
/// the grammar can end afterwards.
pub fn accepts(c: &mut Constraint, tok: &Tokenizer, text: &str, parse_special: bool) -> bool {
    for t in tok.encode(text, false, parse_special) {
        let Ok(m) = c.compute_mask_words() else {
            return false;
        };
        if m[t as usize / 32] & (1 << (t % 32)) == 0 || c.accept_token(t).is_err() {
            return false;
        }
    }
    if c.is_finished() {
        return true;
    }
    let eos = tok.eos().unwrap();
    let m = c.compute_mask_words().unwrap();
    m[eos as usize / 32] & (1 << (eos % 32)) != 0
}
