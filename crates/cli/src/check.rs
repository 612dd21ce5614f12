//! `tempo9 check-device`: greedy generations on the chosen device against the CPU,
//! each prompt alone and all prompts batched, in one process.
//!
//! Two backends round differently (the CPU quantizes activations to Q8_K/Q8_0,
//! CUDA to Q8_1; reductions run in other orders), so greedy streams may part where
//! the top two candidates are nearly tied. The report says where each pair of
//! streams first differs and how close the reference's top two were there, plus
//! the largest log-probability difference over the common prefix. With
//! `--gpu-layers N` (partial offload) the device's streams are also compared with
//! the whole model on the device.

use std::sync::Arc;

use anyhow::{bail, Result};
use clap::Args;
use serde_json::{json, Value};
use tempo9_engine::{EngineCore, Event, FinishReason, Request, SamplingParams};
use tempo9_ggml::{Device, DeviceKind};
use tempo9_models::weights::Offload;
use tempo9_models::{LoadOptions, Model};
use tempo9_tokenizer::{ChatTemplate, Tokenizer};

use crate::ModelArgs;

/// Arguments of `tempo9 check-device`.
#[derive(Args)]
pub struct CheckArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Number of prompts (random token ids, 4 to 40 tokens long; with `--chat`,
    /// the built-in questions in turn).
    #[arg(long, value_name = "N", default_value_t = 8)]
    prompts: usize,
    /// Prompts are built-in user questions rendered through the model's chat
    /// template instead of random token ids. Random ids suit synthetic weights; a
    /// real model answering real questions is confident at most steps, which is
    /// the parity that matters in use.
    #[arg(long)]
    chat: bool,
    /// Also write the prompts' token ids and every generation (tokens and top-two
    /// log-probabilities per step) to this JSON file, to compare with another
    /// engine's (scripts/gpu/greedy-compare.py).
    #[arg(long, value_name = "FILE")]
    dump: Option<std::path::PathBuf>,
    /// Tokens generated per prompt.
    #[arg(long, value_name = "N", default_value_t = 32)]
    tokens: usize,
    /// A divergence counts as a near-tie when the reference's top-two
    /// log-probabilities at that step differ by less than this.
    #[arg(long, value_name = "NATS", default_value_t = 0.05)]
    tie: f32,
}

/// One request's greedy tokens with the top-two log-probabilities at each step.
#[derive(Default)]
struct GenOutput {
    tokens: Vec<u32>,
    top_logprobs: Vec<Vec<(u32, f32)>>,
}

/// Greedy generations of `prompts`, each alone (one engine, one request at a time)
/// or all submitted together; a fresh engine each time, so no prefix is cached.
fn generate(
    model: &Arc<Model>,
    tok: &Arc<Tokenizer>,
    a: &CheckArgs,
    prompts: &[Vec<u32>],
    batched: bool,
) -> Result<Vec<GenOutput>> {
    let mut cfg = a.model.engine_config(model)?;
    cfg.max_running = prompts.len().max(1);
    // At most about two prompt chunks per step: every sequence in a step adds its
    // own matmuls, and the step graph's node budget is sized for few of them.
    cfg.step_tokens = 64;
    cfg.solo_step_tokens = 64;
    let mut engine = EngineCore::new(model.clone(), tok.clone(), cfg)?;
    let request = |p: &Vec<u32>| {
        let mut r = Request::new(p.clone(), a.tokens);
        r.sampling = SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        };
        r.stop.eog = false;
        r.top_logprobs = 2;
        r
    };
    let groups: Vec<&[Vec<u32>]> = match batched {
        true => vec![prompts],
        false => prompts.chunks(1).collect(),
    };
    let mut out = Vec::new();
    for g in groups {
        let mut streams = g
            .iter()
            .map(|p| engine.submit(request(p)))
            .collect::<Result<Vec<_>, _>>()?;
        engine.run_until_idle()?;
        for st in &mut streams {
            let mut o = GenOutput::default();
            while let Some(ev) = st.try_recv() {
                match ev {
                    Event::Token(t) => {
                        o.tokens.push(t.id);
                        o.top_logprobs.push(t.top_logprobs);
                    }
                    Event::Finished(f) => {
                        if let FinishReason::Error(e) = f.reason {
                            bail!("request failed: {e}");
                        }
                    }
                }
            }
            out.push(o);
        }
    }
    Ok(out)
}

/// Compares `got` with the reference `want`, one entry per prompt.
fn compare(want: &[GenOutput], got: &[GenOutput], tie: f32) -> Value {
    let mut same = 0;
    let mut ties = 0;
    let mut max_dlp = 0f32;
    let mut per = Vec::new();
    for (w, g) in want.iter().zip(got) {
        let n = w
            .tokens
            .iter()
            .zip(&g.tokens)
            .take_while(|(x, y)| x == y)
            .count();
        for k in 0..n.min(w.top_logprobs.len()).min(g.top_logprobs.len()) {
            max_dlp = max_dlp.max((w.top_logprobs[k][0].1 - g.top_logprobs[k][0].1).abs());
        }
        if n == w.tokens.len() && n == g.tokens.len() {
            same += 1;
            per.push(json!({"same": true}));
            continue;
        }
        let margin = |o: &GenOutput| {
            o.top_logprobs
                .get(n)
                .filter(|t| t.len() >= 2)
                .map(|t| t[0].1 - t[1].1)
        };
        let (mw, mg) = (margin(w), margin(g));
        let near_tie = mw.is_some_and(|m| m < tie) || mg.is_some_and(|m| m < tie);
        ties += near_tie as usize;
        per.push(json!({
            "same": false, "first_diff": n, "ref_margin": mw, "margin": mg, "near_tie": near_tie,
        }));
    }
    json!({
        "identical": same,
        "of": want.len(),
        "diverged_at_near_tie": ties,
        "max_top1_logprob_diff_common_prefix": max_dlp,
        "per_prompt": per,
    })
}

/// `n` prompts of 4 to 40 random token ids (a fixed sequence).
fn random_prompts(n_vocab: u64, n: usize) -> Vec<Vec<u32>> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..n)
        .map(|_| {
            let len = 4 + (next() % 37) as usize;
            (0..len).map(|_| (next() % n_vocab) as u32).collect()
        })
        .collect()
}

/// Questions of the kinds agents and chat users ask (code, facts, prose).
const QUESTIONS: [&str; 8] = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is the capital of France, and what is it famous for?",
    "Explain in two sentences what a hash map is.",
    "List three differences between TCP and UDP.",
    "Write a haiku about the sea.",
    "How do I reverse a string in Rust?",
    "Summarize the plot of Romeo and Juliet.",
    "What does the HTTP status code 404 mean?",
];

/// `n` chat prompts: [`QUESTIONS`] in turn, each as one user message through the
/// model's chat template with the generation prompt.
fn chat_prompts(model: &Model, tok: &Tokenizer, n: usize) -> Result<Vec<Vec<u32>>> {
    let template = ChatTemplate::for_model(model.gguf(), tok)?;
    QUESTIONS
        .iter()
        .cycle()
        .take(n)
        .map(|q| {
            let msg = json!({"role": "user", "content": q});
            let text = template.render(&[msg], None, true)?;
            Ok(tok.encode_prompt(&text, true))
        })
        .collect()
}

/// Runs `tempo9 check-device` and prints one JSON object.
pub fn run(a: CheckArgs) -> Result<()> {
    let dev = crate::load_model(&a.model.gguf, &a.model.device)?;
    let cpu = Arc::new(Model::load(&a.model.gguf, LoadOptions::new(Device::cpu()))?);
    let tok = Arc::new(Tokenizer::from_gguf(cpu.gguf())?);
    let prompts = match a.chat {
        true => chat_prompts(&cpu, &tok, a.prompts)?,
        false => random_prompts(cpu.hparams().n_vocab as u64, a.prompts),
    };
    let cpu_alone = generate(&cpu, &tok, &a, &prompts, false)?;
    let dev_alone = generate(&dev, &tok, &a, &prompts, false)?;
    let dev_batch = generate(&dev, &tok, &a, &prompts, true)?;
    // Partial offload (--gpu-layers): also against the whole model on the device.
    let partial = dev.device().kind() != DeviceKind::Cpu && a.model.device.gpu_layers.is_some();
    let vs_full = match partial {
        true => {
            let mut opts = LoadOptions::new(dev.device());
            opts.offload = Offload::All;
            let full = Arc::new(Model::load(&a.model.gguf, opts)?);
            let full_alone = generate(&full, &tok, &a, &prompts, false)?;
            drop(full);
            compare(&full_alone, &dev_alone, a.tie)
        }
        false => Value::Null,
    };
    let mut out = json!({
        "check": "device-vs-cpu",
        "model": a.model.gguf.file_name().map(|n| n.to_string_lossy().into_owned()),
        "device": dev.device().description(),
        "prompts": a.prompts,
        "prompt_kind": if a.chat { "chat" } else { "random-ids" },
        "tokens": a.tokens,
        "tie_nats": a.tie,
        "device_alone_vs_cpu_alone": compare(&cpu_alone, &dev_alone, a.tie),
        "device_batched_vs_device_alone": compare(&dev_alone, &dev_batch, a.tie),
        "device_batched_vs_cpu_alone": compare(&cpu_alone, &dev_batch, a.tie),
    });
    if let Some(path) = &a.dump {
        let gens = |g: &[GenOutput]| -> Value {
            g.iter()
                .map(|o| json!({"tokens": o.tokens, "top": o.top_logprobs}))
                .collect()
        };
        let dump = json!({
            "prompts": prompts,
            "tempo9_cpu_alone": gens(&cpu_alone),
            "tempo9_device_alone": gens(&dev_alone),
            "tempo9_device_batched": gens(&dev_batch),
        });
        std::fs::write(path, dump.to_string())?;
    }
    if partial {
        out["gpu_layers"] = json!(a.model.device.gpu_layers);
        out["n_layer"] = json!(dev.hparams().n_layer);
        out["weights"] = json!(dev.weight_placement());
        out["device_alone_vs_full_offload_alone"] = vs_full;
    }
    println!("{out}");
    Ok(())
}
