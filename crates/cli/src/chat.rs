//! `tempo9 run`: one-shot generation or an interactive chat on the terminal.

use std::io::{BufRead, Write};
use std::sync::Arc;

use anyhow::{Context as _, Result};
use clap::Args;
use serde_json::{json, Value};
use tempo9_engine::{EngineCore, Event, Request, SamplingParams};
use tempo9_tokenizer::{ChatTemplate, Tokenizer};

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
    engine: EngineCore,
    tok: Arc<Tokenizer>,
    template: ChatTemplate,
    sampling: SamplingParams,
    max_tokens: usize,
}

impl Session {
    /// Generates from `prompt_ids`, streaming text to stdout; returns the text.
    fn answer(&mut self, prompt_ids: Vec<u32>) -> Result<String> {
        let n_prompt = prompt_ids.len();
        let mut req = Request::new(prompt_ids, self.max_tokens);
        req.sampling = self.sampling.clone();
        let mut stream = self.engine.submit(req)?;
        let mut text = String::new();
        let mut out = std::io::stdout().lock();
        let t0 = std::time::Instant::now();
        let mut first: Option<std::time::Duration> = None;
        let finish = 'run: loop {
            self.engine.step()?;
            while let Some(ev) = stream.try_recv() {
                match ev {
                    Event::Token(t) => {
                        first.get_or_insert_with(|| t0.elapsed());
                        text.push_str(&t.text);
                        // A closed stdout (e.g. `| head`) ends generation instead of failing.
                        if out
                            .write_all(t.text.as_bytes())
                            .and_then(|_| out.flush())
                            .is_err()
                        {
                            stream.cancel();
                        }
                    }
                    Event::Finished(f) => break 'run f,
                }
            }
        };
        let n_gen = finish.usage.completion_tokens;
        let ttft = first.unwrap_or_default();
        let gen_s = (t0.elapsed() - ttft).as_secs_f64();
        eprintln!(
            "\n[prompt {n_prompt} tok ({} cached), {:.1} tok/s | generated {n_gen} tok, {:.1} tok/s | {:?}]",
            finish.usage.cached_tokens,
            n_prompt as f64 / ttft.as_secs_f64().max(1e-9),
            (n_gen.saturating_sub(1)) as f64 / gen_s.max(1e-9),
            finish.reason,
        );
        Ok(text)
    }
}

/// Runs `tempo9 run`.
pub fn run(a: RunArgs) -> Result<()> {
    let model = crate::load_model(&a.model.gguf, &a.model.device)?;
    let tok = Arc::new(Tokenizer::from_gguf(model.gguf()).context("building the tokenizer")?);
    let template =
        ChatTemplate::for_model(model.gguf(), &tok).context("reading the chat template")?;
    let cfg = a.model.engine_config(&model)?;
    let engine = EngineCore::new(model, tok.clone(), cfg)?;
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
        let ids = if a.raw {
            s.tok.encode(&text, true, false)
        } else {
            s.tok.encode_prompt(&text, true)
        };
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
        let ids = if a.raw {
            s.tok.encode(&text, true, false)
        } else {
            s.tok.encode_prompt(&text, true)
        };
        let answer = s.answer(ids)?;
        if !a.raw {
            messages.push(json!({"role": "assistant", "content": answer}));
        }
        eprint!("\n> ");
    }
    Ok(())
}
