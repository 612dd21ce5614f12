//! `tempo9 bench`: prompt-processing and generation speed, like llama-bench's pp/tg.

use anyhow::Result;
use clap::Args;
use serde_json::json;
use std::sync::Arc;

use tempo9_engine::{EngineCore, Request};
use tempo9_tokenizer::Tokenizer;

use crate::ModelArgs;

/// Arguments of `tempo9 bench`.
#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens processed in one step (0 = skip).
    #[arg(long, value_name = "N", default_value_t = 512)]
    pp: usize,
    /// Tokens generated one at a time (0 = skip).
    #[arg(long, value_name = "N", default_value_t = 128)]
    tg: usize,
    /// Repetitions of each test.
    #[arg(long, value_name = "N", default_value_t = 3)]
    reps: usize,
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> Request {
    let mut r = Request::new(prompt, max_tokens);
    r.stop.eog = false;
    r
}

/// Runs `reqs` to completion on `engine`.
fn run_all(engine: &mut EngineCore, reqs: Vec<Request>) -> Result<()> {
    let streams = reqs
        .into_iter()
        .map(|r| engine.submit(r))
        .collect::<Result<Vec<_>, _>>()?;
    engine.run_until_idle()?;
    drop(streams);
    Ok(())
}

/// Runs `tempo9 bench` and prints one JSON object.
pub fn run(a: BenchArgs) -> Result<()> {
    let model = crate::load_model(&a.model.gguf)?;
    let n_vocab = model.hparams().n_vocab as u64;
    let tok = Arc::new(Tokenizer::from_gguf(model.gguf())?);
    let mut cfg = a.model.engine_config()?;
    cfg.step_tokens = cfg.step_tokens.max(a.pp);
    let threads = cfg.threads;
    let mut engine = EngineCore::new(model, tok, cfg)?;
    // Deterministic pseudo-random prompt tokens (like llama-bench's random batch);
    // never repeated, so the prefix cache does not help.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n_vocab) as u32
    };
    // Warm-up: first use of every kernel and buffer.
    run_all(&mut engine, vec![request(vec![next(), next(), next()], 2)])?;
    let mut pp = Vec::new();
    for _ in 0..a.reps.max(1) * (a.pp > 0) as usize {
        let prompt: Vec<u32> = (0..a.pp).map(|_| next()).collect();
        let t0 = std::time::Instant::now();
        run_all(&mut engine, vec![request(prompt, 1)])?;
        pp.push(a.pp as f64 / t0.elapsed().as_secs_f64());
    }
    let mut tg = Vec::new();
    for _ in 0..a.reps.max(1) * (a.tg > 0) as usize {
        let t0 = std::time::Instant::now();
        // One prompt token, then tg-1 more single-token steps: tg steps of one token each.
        run_all(&mut engine, vec![request(vec![next()], a.tg)])?;
        tg.push(a.tg as f64 / t0.elapsed().as_secs_f64());
    }
    let name = a
        .model
        .gguf
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    let out = json!({
        "model": name,
        "threads": threads,
        "pp": {"n_tokens": a.pp, "tok_s": pp},
        "tg": {"n_tokens": a.tg, "tok_s": tg},
    });
    println!("{out}");
    Ok(())
}
