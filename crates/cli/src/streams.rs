//! `tempo9 bench --streams N`: aggregate generation throughput of N concurrent
//! requests submitted through the engine's request API (the same path the server
//! uses), each drained by its own client thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::{json, Value};
use tempo9_engine::{Engine, EngineConfig, Event, FinishReason, Request};
use tempo9_models::Model;
use tempo9_tokenizer::Tokenizer;

/// One stream's timings.
struct StreamTimes {
    first_token: Duration,
    done: Duration,
    tokens: usize,
    /// When each token arrived.
    token_times: Vec<Duration>,
}

/// Runs `n` concurrent requests of `prompt_len` random prompt tokens and `gen`
/// generated tokens each; returns a JSON summary. With `shared_prefix > 0` every
/// prompt starts with the same `shared_prefix` tokens (the prefix-hit scenario): one
/// request with that prefix runs first, alone (its time to first token is the cold
/// TTFT), so the timed requests find the prefix in the cache.
#[allow(clippy::too_many_arguments)]
pub fn run(
    model: Arc<Model>,
    tok: Arc<Tokenizer>,
    mut cfg: EngineConfig,
    n: usize,
    prompt_len: usize,
    gen: usize,
    shared_prefix: usize,
    seed: u64,
) -> Result<Value> {
    let n_vocab = model.hparams().n_vocab as u64;
    cfg.max_running = cfg.max_running.max(n);
    let engine = Engine::start(model, tok, cfg)?;
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n_vocab) as u32
    };
    let request = |prompt: Vec<u32>, max_tokens: usize| {
        let mut r = Request::new(prompt, max_tokens);
        r.stop.eog = false;
        r
    };
    // Warm-up outside the timing: first use of every kernel, and a graph of each
    // shape the timed run starts with.
    let warm = engine.submit(request((0..8).map(|_| next()).collect(), 2))?;
    drain(warm)?;
    let prefix: Vec<u32> = (0..shared_prefix).map(|_| next()).collect();
    let prompt = |next: &mut dyn FnMut() -> u32| -> Vec<u32> {
        let mut p = prefix.clone();
        p.extend((0..prompt_len).map(|_| next()));
        p
    };
    let cold = match shared_prefix {
        0 => None,
        _ => {
            let t = Instant::now();
            let mut st = engine.submit(request(prompt(&mut next), 2))?;
            let mut first = None;
            while let Some(ev) = st.blocking_recv() {
                match ev {
                    Event::Token(_) => {
                        first.get_or_insert_with(|| t.elapsed().as_secs_f64());
                    }
                    Event::Finished(_) => break,
                }
            }
            first
        }
    };
    let prompts: Vec<Vec<u32>> = (0..n).map(|_| prompt(&mut next)).collect();
    let s0 = engine.stats();
    let g0 = tempo9_ggml::sched_stats();
    let t0 = Instant::now();
    let streams = prompts
        .into_iter()
        .map(|p| engine.submit(request(p, gen)))
        .collect::<Result<Vec<_>, _>>()?;
    let times: Vec<StreamTimes> = std::thread::scope(|s| {
        let hs: Vec<_> = streams
            .into_iter()
            .map(|mut st| {
                s.spawn(move || -> Result<StreamTimes> {
                    let mut first = None;
                    let mut tokens = 0;
                    let mut token_times = Vec::new();
                    while let Some(ev) = st.blocking_recv() {
                        match ev {
                            Event::Token(_) => {
                                let t = t0.elapsed();
                                first.get_or_insert(t);
                                token_times.push(t);
                                tokens += 1;
                            }
                            Event::Finished(f) => {
                                if let FinishReason::Error(e) = f.reason {
                                    bail!("request failed: {e}");
                                }
                                return Ok(StreamTimes {
                                    first_token: first.unwrap_or_default(),
                                    done: t0.elapsed(),
                                    tokens,
                                    token_times,
                                });
                            }
                        }
                    }
                    bail!("stream ended without a Finished event")
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("client thread panicked"))
            .collect::<Result<Vec<_>>>()
    })?;
    let wall = t0.elapsed().as_secs_f64();
    let s1 = engine.stats();
    let g1 = tempo9_ggml::sched_stats();
    let per_step = |ns: u64| ns as f64 / 1e6 / (g1.computes - g0.computes).max(1) as f64;
    let generated: usize = times.iter().map(|t| t.tokens).sum();
    let mut ttft: Vec<f64> = times.iter().map(|t| t.first_token.as_secs_f64()).collect();
    ttft.sort_by(f64::total_cmp);
    // Per-stream decode rate after its first token.
    let per_stream: Vec<f64> = times
        .iter()
        .map(|t| {
            (t.tokens.saturating_sub(1)) as f64 / (t.done - t.first_token).as_secs_f64().max(1e-9)
        })
        .collect();
    let steps = s1.steps_total - s0.steps_total;
    // Steady decode: tokens per second while every stream decodes (from the last
    // first token to the first stream's end), what llama-batched-bench's S_TG reports
    // (it computes every prompt before decoding); the aggregate above also counts
    // the prompt phase.
    let all_decoding = times
        .iter()
        .map(|t| t.first_token)
        .max()
        .unwrap_or_default();
    let first_done = times.iter().map(|t| t.done).min().unwrap_or_default();
    let steady = (first_done > all_decoding).then(|| {
        let in_window = times
            .iter()
            .flat_map(|t| &t.token_times)
            .filter(|&&t| t > all_decoding && t <= first_done)
            .count();
        in_window as f64 / (first_done - all_decoding).as_secs_f64()
    });
    // Join the engine thread now: its KV pool and SSD flush must not overlap the next
    // run, nor outlive main (freeing device buffers during CUDA's exit teardown aborts).
    engine.shutdown();
    Ok(json!({
        "streams": n,
        "prompt_tokens": prompt_len + shared_prefix,
        "shared_prefix_tokens": shared_prefix,
        "cold_ttft_s": cold,
        "gen_tokens": gen,
        "wall_s": wall,
        "generated": generated,
        "aggregate_tok_s": generated as f64 / wall,
        "steady_decode_tok_s": steady,
        "mean_stream_decode_tok_s": per_stream.iter().sum::<f64>() / n.max(1) as f64,
        "ttft_s_median": ttft.get(ttft.len() / 2),
        "ttft_s_max": ttft.last(),
        "steps": steps,
        "computed_tokens": s1.computed_tokens_total - s0.computed_tokens_total,
        "ms_per_step": wall * 1e3 / steps.max(1) as f64,
        // Scheduler time per step: graph allocation, and computation including the
        // wait for the device; the rest of ms_per_step is host work (graph building,
        // sampling, engine bookkeeping).
        "alloc_ms_per_step": per_step(g1.alloc_ns - g0.alloc_ns),
        "compute_ms_per_step": per_step(g1.compute_ns - g0.compute_ns),
        // Steps that reused the previous step's graph (same shape) instead of
        // building and allocating one.
        "graphs_reused": (g1.computes - g0.computes).saturating_sub(g1.allocs - g0.allocs),
    }))
}

fn drain(mut st: tempo9_engine::RequestStream) -> Result<()> {
    while let Some(ev) = st.blocking_recv() {
        if let Event::Finished(f) = ev {
            if let FinishReason::Error(e) = f.reason {
                bail!("warm-up request failed: {e}");
            }
            return Ok(());
        }
    }
    Ok(())
}
