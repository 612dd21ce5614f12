//! `tempo9 bench`: prompt-processing and generation speed, like llama-bench's pp/tg.

use anyhow::Result;
use clap::Args;
use serde_json::{json, Value};
use std::sync::Arc;

use tempo9_engine::{EngineCore, Event, Request, Usage};
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
    /// Instead of pp/tg: aggregate throughput of N concurrent requests through the
    /// engine's request API (comma list for several runs), each with
    /// --stream-prompt random prompt tokens and --tg generated tokens.
    #[arg(long, value_name = "N[,N...]", value_delimiter = ',')]
    streams: Vec<usize>,
    /// Prompt tokens of each request in --streams mode.
    #[arg(long, value_name = "N", default_value_t = 128)]
    stream_prompt: usize,
    /// In --streams mode, a prefix of N tokens shared by every request's prompt
    /// (before its own --stream-prompt tokens), cached by a first request run
    /// alone: the prefix-hit scenario (cold vs warm time to first token).
    #[arg(long, value_name = "N", default_value_t = 0)]
    shared_prefix: usize,
    /// Generate --tg tokens after this file's text (tokenized as is, special-token
    /// text parsed: include the chat template's markers for a chat prompt) instead of
    /// after one random token; tg's tok/s then counts the tokens after the first over
    /// the time after it (decode alone), and the output adds the drafts verified and
    /// accepted (see --speculation-k).
    #[arg(long, value_name = "PATH")]
    tg_prompt_file: Option<std::path::PathBuf>,
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

/// Decode speed of `req` alone: the tokens after its first over the time after the
/// first arrived, and its usage.
fn decode_rate(
    engine: &mut EngineCore,
    req: Request,
    profile: &mut Decoded,
) -> Result<(f64, Usage)> {
    let mut stream = engine.submit(req)?;
    let (mut first, mut n, mut usage) = (None, 0usize, None);
    let mut at_first = None;
    loop {
        let more = engine.step()?;
        while let Some(ev) = stream.try_recv() {
            match ev {
                Event::Token(_) => {
                    n += 1;
                    first.get_or_insert_with(std::time::Instant::now);
                    at_first.get_or_insert_with(tempo9_ggml::sched_stats);
                }
                Event::Finished(f) => usage = Some(f.usage),
            }
        }
        if !more || usage.is_some() {
            break;
        }
    }
    let usage = usage.ok_or_else(|| anyhow::anyhow!("the request did not finish"))?;
    let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
    if let Some(a) = at_first {
        profile.add(a, tempo9_ggml::sched_stats(), secs);
    }
    Ok((n.saturating_sub(1) as f64 / secs.max(1e-9), usage))
}

/// Scheduler counters and wall time summed over the decode parts of
/// [`decode_rate`]'s requests (after their first token: not the prompt's steps).
#[derive(Default)]
struct Decoded {
    stats: tempo9_ggml::SchedStats,
    secs: f64,
}

impl Decoded {
    fn add(&mut self, a: tempo9_ggml::SchedStats, b: tempo9_ggml::SchedStats, secs: f64) {
        let s = &mut self.stats;
        s.allocs += b.allocs - a.allocs;
        s.alloc_ns += b.alloc_ns - a.alloc_ns;
        s.computes += b.computes - a.computes;
        s.compute_ns += b.compute_ns - a.compute_ns;
        s.last_splits = b.last_splits;
        self.secs += secs;
    }
}

/// Runs `tempo9 bench` and prints one JSON object.
pub fn run(a: BenchArgs) -> Result<()> {
    let model = crate::load_model(&a.model.gguf, &a.model.device)?;
    let n_vocab = model.hparams().n_vocab as u64;
    let tok = Arc::new(Tokenizer::from_gguf(model.gguf())?);
    let name = a
        .model
        .gguf
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    let device = model.device().description();
    let placement: serde_json::Map<String, Value> = model
        .weight_placement()
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let mut cfg = a.model.engine_config(&model)?;
    if !a.streams.is_empty() {
        for (i, &n) in a.streams.iter().enumerate() {
            let mut r = crate::streams::run(
                model.clone(),
                tok.clone(),
                cfg.clone(),
                n.max(1),
                a.stream_prompt.max(1),
                a.tg.max(1),
                a.shared_prefix,
                0x9E37_79B9_7F4A_7C15 ^ i as u64,
            )?;
            r["model"] = json!(name);
            r["device"] = json!(device);
            println!("{r}");
        }
        return Ok(());
    }
    cfg.step_tokens = cfg.step_tokens.max(a.pp);
    let threads = cfg.threads;
    let mut engine = EngineCore::new(model, tok.clone(), cfg)?;
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
    let mut drafts = Vec::new();
    let tg_prompt = match &a.tg_prompt_file {
        Some(p) => Some(tok.encode(&std::fs::read_to_string(p)?, true, true)),
        None => None,
    };
    let (s0, t_tg) = (tempo9_ggml::sched_stats(), std::time::Instant::now());
    let mut decoded = Decoded::default();
    for _ in 0..a.reps.max(1) * (a.tg > 0) as usize {
        if let Some(p) = &tg_prompt {
            let (rate, usage) = decode_rate(&mut engine, request(p.clone(), a.tg), &mut decoded)?;
            tg.push(rate);
            drafts.push(
                json!({"drafted": usage.draft_tokens, "accepted": usage.accepted_draft_tokens}),
            );
            continue;
        }
        let t0 = std::time::Instant::now();
        // One prompt token, then tg-1 more single-token steps: tg steps of one token each.
        run_all(&mut engine, vec![request(vec![next()], a.tg)])?;
        tg.push(a.tg as f64 / t0.elapsed().as_secs_f64());
    }
    // With a prompt file, the decode steps only (its prompt's prefill would swamp them).
    let tg_profile = match tg_prompt {
        Some(_) => step_profile(
            decoded.stats,
            std::time::Duration::from_secs_f64(decoded.secs),
        ),
        None => step_profile(since(s0, tempo9_ggml::sched_stats()), t_tg.elapsed()),
    };
    let out = json!({
        "model": name,
        "threads": threads,
        "device": device,
        "weights": placement,
        "tg_step_profile": tg_profile,
        "ggml_libs": crate::device::loaded_ggml_libs(),
        "pp": {"n_tokens": a.pp, "tok_s": pp},
        "tg": {"n_tokens": a.tg, "tok_s": tg, "drafts": drafts},
    });
    println!("{out}");
    Ok(())
}

/// Counters from `a` to `b` (the last graph's splits as of `b`).
fn since(a: tempo9_ggml::SchedStats, b: tempo9_ggml::SchedStats) -> tempo9_ggml::SchedStats {
    let mut d = Decoded::default();
    d.add(a, b, 0.0);
    d.stats
}

/// Where the time of the steps counted in `d` went, per step, in milliseconds: graph
/// allocation (none when a step reuses its predecessor's graph) and computation
/// (the scheduler's counters; computation includes waiting for the device) and the
/// rest of the host's work (graph building, input writes, sampling, engine
/// bookkeeping).
fn step_profile(d: tempo9_ggml::SchedStats, wall: std::time::Duration) -> Value {
    let steps = d.computes.max(1) as f64;
    let ms = |ns: u64| ns as f64 / 1e6 / steps;
    let alloc = ms(d.alloc_ns);
    let compute = ms(d.compute_ns);
    let total = wall.as_secs_f64() * 1e3 / steps;
    json!({
        "steps": d.computes,
        "ms_per_step": total,
        "alloc_ms": alloc,
        "compute_ms": compute,
        "other_host_ms": total - alloc - compute,
        "splits": d.last_splits,
        // Steps that reused the previous step's graph instead of building one.
        "graphs_reused": d.computes.saturating_sub(d.allocs),
    })
}
