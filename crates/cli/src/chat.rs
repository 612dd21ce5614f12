//! `tempo9 run`: one-shot generation or an interactive chat on the terminal.

use std::io::{BufRead, Write};
use std::sync::Arc;

use anyhow::{bail, Context as _, Result};
use clap::Args;
use serde_json::{json, Value};
use tempo9_engine::sampler::SamplingParams;
use tempo9_engine::{Engine, GenRequest};
use tempo9_tokenizer::{ChatTemplate, StreamDecoder, Tokenizer};

use crate::ModelArgs;

/// Arguments of `tempo9 run`.
#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Feed PROMPT to the model as is, without the chat template.
    #[arg(long)]
    raw: bool,
    /// Most tokens to generate per answer.
    #[arg(long, value_name = "N", default_value_t = 512)]
    max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, value_name = "T", default_value_t = 0.7)]
    temperature: f32,
    /// Nucleus sampling threshold (1 = off).
    #[arg(long, value_name = "P", default_value_t = 0.95)]
    top_p: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, value_name = "K", default_value_t = 40)]
    top_k: usize,
    /// Random seed (same seed, same output).
    #[arg(long, value_name = "S")]
    seed: Option<u64>,
    /// System prompt for chat mode.
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// The prompt; without it, an interactive chat reads lines from stdin.
    prompt: Option<String>,
}

struct Session {
    engine: Engine,
    tok: Arc<Tokenizer>,
    template: ChatTemplate,
    sampling: SamplingParams,
    max_tokens: usize,
}

impl Session {
    /// Generates from `prompt_ids`, streaming text to stdout; returns the text.
    fn answer(&mut self, prompt_ids: Vec<u32>) -> Result<String> {
        let ctx = self.engine.max_seq_tokens();
        if prompt_ids.len() >= ctx {
            bail!(
                "prompt has {} tokens, the KV cache holds {ctx} (raise --kv-tokens)",
                prompt_ids.len()
            );
        }
        let max_tokens = self.max_tokens.min(ctx - prompt_ids.len());
        let req = GenRequest {
            prompt: prompt_ids,
            max_tokens,
            sampling: self.sampling.clone(),
            stop_at_eog: true,
            top_logprobs: 0,
            banned_tokens: Vec::new(),
        };
        let tok = self.tok.clone();
        let mut dec = StreamDecoder::new(&tok, true);
        let mut text = String::new();
        let mut out = std::io::stdout().lock();
        let t0 = std::time::Instant::now();
        let mut first: Option<std::time::Duration> = None;
        let n_prompt = req.prompt.len();
        let res = self.engine.generate(
            std::slice::from_ref(&req),
            &|t| tok.is_eog(t),
            &mut |_, t| {
                first.get_or_insert_with(|| t0.elapsed());
                if tok.is_eog(t) {
                    return true;
                }
                let piece = dec.push(&tok, t);
                text.push_str(&piece);
                // A closed stdout (e.g. `| head`) ends generation instead of failing.
                out.write_all(piece.as_bytes())
                    .and_then(|_| out.flush())
                    .is_ok()
            },
        )?;
        let rest = dec.finish(&tok);
        text.push_str(&rest);
        let _ = write!(out, "{rest}");
        let _ = out.flush();
        let n_gen = res[0].tokens.len();
        let ttft = first.unwrap_or_default();
        let gen_s = (t0.elapsed() - ttft).as_secs_f64();
        eprintln!(
            "\n[prompt {n_prompt} tok, {:.1} tok/s | generated {n_gen} tok, {:.1} tok/s | {:?}]",
            n_prompt as f64 / ttft.as_secs_f64().max(1e-9),
            (n_gen.saturating_sub(1)) as f64 / gen_s.max(1e-9),
            res[0].finish,
        );
        Ok(text)
    }
}

/// Runs `tempo9 run`.
pub fn run(a: RunArgs) -> Result<()> {
    let model = crate::load_model(&a.model.gguf)?;
    let tok = Arc::new(Tokenizer::from_gguf(model.gguf()).context("building the tokenizer")?);
    let template =
        ChatTemplate::for_model(model.gguf(), &tok).context("reading the chat template")?;
    let engine = Engine::new(model, a.model.engine_config())?;
    let sampling = SamplingParams {
        temperature: a.temperature,
        top_p: a.top_p,
        top_k: a.top_k,
        seed: a.seed,
        ..SamplingParams::default()
    };
    let mut s = Session {
        engine,
        tok,
        template,
        sampling,
        max_tokens: a.max_tokens,
    };
    let mut messages: Vec<Value> = Vec::new();
    if let Some(sys) = &a.system {
        messages.push(json!({"role": "system", "content": sys}));
    }
    if let Some(p) = &a.prompt {
        let text = if a.raw {
            p.clone()
        } else {
            messages.push(json!({"role": "user", "content": p}));
            s.template.render(&messages, None, true)?
        };
        let ids = s.tok.encode(&text, true, !a.raw);
        s.answer(ids)?;
        println!();
        return Ok(());
    }
    // Interactive chat: the whole conversation is re-rendered each turn.
    let stdin = std::io::stdin();
    eprint!("> ");
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            eprint!("> ");
            continue;
        }
        let text = if a.raw {
            line
        } else {
            messages.push(json!({"role": "user", "content": line}));
            s.template.render(&messages, None, true)?
        };
        let ids = s.tok.encode(&text, true, !a.raw);
        let answer = s.answer(ids)?;
        if !a.raw {
            messages.push(json!({"role": "assistant", "content": answer}));
        }
        eprint!("\n> ");
    }
    Ok(())
}
