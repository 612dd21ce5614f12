//! Shared test helpers: locating the real models and the llama.cpp fixtures.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use tempo9_ggml::Device;
use tempo9_models::{LoadOptions, Model};

/// The three real models: (fixture dir, file name).
pub const MODELS: [(&str, &str); 3] = [
    ("smollm2", "smollm2-135m-instruct-q4_1.gguf"),
    ("qwen2.5-coder", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
    ("gemma3", "gemma-3-270m-q4_k_m.gguf"),
];

/// The synthetic models the fixtures were recorded on (fixture dir, file name),
/// written by `scripts/synth-models.py` (part of scripts/test.sh): the Qwen3
/// family (the two hybrids at 2 and 3), then Llama 3 (rope scaling), Mistral 3
/// (YaRN, query temperature), GPT-OSS (sinks, sliding window, MXFP4 experts) and
/// Gemma 4 dense (per-layer embeddings, KV-sharing layers) and MoE.
pub const SYNTH_MODELS: [(&str, &str); 9] = [
    ("qwen3-tiny", "qwen3-tiny.gguf"),
    ("qwen3moe-tiny", "qwen3moe-tiny.gguf"),
    ("qwen35-tiny", "qwen35-tiny.gguf"),
    ("qwen35moe-tiny", "qwen35moe-tiny.gguf"),
    ("llama3-tiny", "llama3-tiny.gguf"),
    ("mistral3-tiny", "mistral3-tiny.gguf"),
    ("gpt-oss-tiny", "gpt-oss-tiny.gguf"),
    ("gemma4-tiny", "gemma4-tiny.gguf"),
    ("gemma4moe-tiny", "gemma4moe-tiny.gguf"),
];

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

/// Loads a real model on the CPU.
pub fn load(file: &str) -> Option<Arc<Model>> {
    let p = model_path(file)?;
    Some(Arc::new(
        Model::load(&p, LoadOptions::new(Device::cpu())).expect("load model"),
    ))
}

/// The repository's tests/fixtures directory.
pub fn fixtures_dir() -> PathBuf {
    manifest_dir().join("../../tests/fixtures")
}

/// Reads a fixture JSON file under tests/fixtures.
pub fn fixture(rel: &str) -> serde_json::Value {
    let p = fixtures_dir().join(rel);
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()));
    serde_json::from_str(&s).expect("fixture JSON")
}

/// u32 ids from a JSON array.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// What one request produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    pub tokens: Vec<u32>,
    pub text: String,
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    pub finish: tempo9_engine::Finish,
}

/// Collects a finished stream's events.
pub fn collect(stream: &mut tempo9_engine::RequestStream) -> Output {
    let mut out = Output {
        tokens: Vec::new(),
        text: String::new(),
        top_logprobs: Vec::new(),
        finish: tempo9_engine::Finish {
            reason: tempo9_engine::FinishReason::Error("no finish event".into()),
            usage: Default::default(),
        },
    };
    while let Some(ev) = stream.try_recv() {
        match ev {
            tempo9_engine::Event::Token(t) => {
                out.tokens.push(t.id);
                out.text.push_str(&t.text);
                out.top_logprobs.push(t.top_logprobs);
            }
            tempo9_engine::Event::Finished(f) => {
                out.finish = f;
                break;
            }
        }
    }
    out
}

/// Submits `reqs` together and runs the engine until all are done.
pub fn run_batch(
    core: &mut tempo9_engine::EngineCore,
    reqs: Vec<tempo9_engine::Request>,
) -> Vec<Output> {
    let mut streams: Vec<_> = reqs
        .into_iter()
        .map(|r| core.submit(r).expect("submit"))
        .collect();
    core.run_until_idle().expect("engine step");
    core.check_invariants().expect("invariants");
    streams.iter_mut().map(collect).collect()
}

/// How far a request's numbers may move when it runs batched with others instead
/// of alone, on the files of fixture directory `dir` (nats, top-1
/// log-probability): each sequence attends over its own KV window and repacked
/// weights multiply per sequence, but ggml's other CPU matmul kernels pick tile
/// shapes by batch size, which rounds a little differently (~1e-3 nats on the
/// real models). The synthetic files (random weights) turn rounding into larger
/// moves: llama.cpp's own output on qwen35-tiny moves by up to 0.023 nats with
/// its batch size alone, its CPU and CUDA runs of these files by up to 0.68,
/// and forced decodes of qwen35moe-tiny batched with three others (experts
/// picked for several rows at once) by up to 0.091 here, of gemma4moe-tiny by up
/// to 0.355 (json, step 52; 0.151 on long_300) with AVX-512 kernels and 0.657
/// with AVX2's (x86-64-v3 build, chat_code step 24), while alone it is within
/// 1.2e-3 of llama.cpp on every step. Batched top-1 log-probabilities must stay
/// within the limit of alone's, and a batched run may take another token than
/// alone only where alone's top two are within it (see [`Batched`]).
pub fn batched_limit(dir: &str) -> f32 {
    match dir {
        "gemma4moe-tiny" if tempo9_ggml::KernelSet::current().short_name() == "x86_64-avx2" => 0.7,
        "gemma4moe-tiny" => 0.4,
        _ if dir.ends_with("-tiny") => 0.15,
        _ => 0.02,
    }
}

/// Requests run batched compared with the same requests run alone (each with
/// its top two log-probabilities): see [`batched_limit`].
#[derive(Debug, Default)]
pub struct Batched {
    /// Largest top-1 log-probability difference over the compared steps.
    pub worst: f32,
    /// Runs that left a near-tie the other way: (case, step, alone's margin).
    pub ties: Vec<(String, usize, f32)>,
    /// What broke the limit.
    pub problems: Vec<String>,
}

impl Batched {
    /// Compares `case`'s batched run with its run alone: top-1 log-probabilities
    /// within `limit` at every step up to the first token that differs (that step
    /// included), and tokens identical except that the batched run may leave a
    /// near-tie (alone's top two within `limit`) the other way.
    pub fn compare(&mut self, case: &str, alone: &Output, batched: &Output, limit: f32) {
        let n = alone.tokens.len();
        if batched.tokens.len() != n {
            self.problems.push(format!(
                "{case}: {} tokens batched, {n} alone",
                batched.tokens.len()
            ));
            return;
        }
        let same = alone
            .tokens
            .iter()
            .zip(&batched.tokens)
            .take_while(|(a, b)| a == b)
            .count();
        for step in 0..=same.min(n.saturating_sub(1)) {
            let d = (alone.top_logprobs[step][0].1 - batched.top_logprobs[step][0].1).abs();
            self.worst = self.worst.max(d);
            if d >= limit {
                self.problems.push(format!(
                    "{case} step {step}: batched top-1 logprob differs by {d}"
                ));
            }
        }
        if same < n {
            let top = &alone.top_logprobs[same];
            let margin = top[0].1 - top[1].1;
            if margin >= limit {
                self.problems.push(format!(
                    "{case}: batched differs at step {same} (alone's margin {margin} >= {limit})"
                ));
            }
            self.ties.push((case.to_string(), same, margin));
        }
    }
}

/// The tokenizer of a loaded model.
pub fn tokenizer(model: &Model) -> Arc<tempo9_tokenizer::Tokenizer> {
    Arc::new(tempo9_tokenizer::Tokenizer::from_gguf(model.gguf()).expect("tokenizer"))
}

/// Tiny xorshift RNG for reproducible workloads.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
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

/// The compiler target this build's ggml was compiled for (`tempo9_ggml::KernelSet::codegen`).
pub fn codegen() -> String {
    tempo9_ggml::KernelSet::codegen()
}

/// Allows exactly `tokens` in order: teacher forcing through the engine's grammar
/// hook (parity), or a grammar with one answer (speculation). With `tells` it also
/// names what it forces next and which drafts it would take; without, it keeps the
/// trait's defaults (no forced tokens, every draft kept).
pub struct Forced {
    pub tokens: Vec<u32>,
    pub at: usize,
    pub n_vocab: usize,
    pub tells: bool,
}

impl tempo9_engine::TokenConstraint for Forced {
    fn compute_mask(&mut self) -> Result<tempo9_engine::TokenMask, String> {
        let t = *self.tokens.get(self.at).ok_or("past the forced tokens")?;
        let mut m = tempo9_engine::TokenMask::none(self.n_vocab.max(t as usize + 1));
        m.allow(t);
        Ok(m)
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        if self.tokens.get(self.at) != Some(&token) {
            return Err(format!("token {token} is not the forced one"));
        }
        self.at += 1;
        Ok(())
    }

    fn is_finished(&self) -> bool {
        self.at >= self.tokens.len()
    }

    fn forced_tokens(&mut self) -> Vec<u32> {
        if self.tells {
            self.tokens[self.at..].to_vec()
        } else {
            Vec::new()
        }
    }

    fn accepted_prefix(&mut self, tokens: &[u32]) -> usize {
        if !self.tells {
            return tokens.len();
        }
        tokens
            .iter()
            .zip(&self.tokens[self.at..])
            .take_while(|(a, b)| a == b)
            .count()
    }
}
