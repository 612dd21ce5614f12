//! Batched generation: several sequences advance together, one model step at a
//! time. Each step carries every decoding sequence's next token plus prompt chunks
//! of sequences still prefilling, up to a token budget.
//!
//! This is the foundation's synchronous loop; the engine-core issue turns it into
//! the scheduler-driven request API without changing how a step is assembled.

use std::sync::Arc;

use tempo9_models::{Executor, KvStore, MaskBuilder, Model, ModelError, StepBatch};

use crate::kv::{CellAllocator, KvError, SeqId};
use crate::sampler::{log_softmax_top, Sampler, SamplingParams};

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// CPU threads for compute.
    pub threads: usize,
    /// KV cells in the pool (tokens held across all sequences).
    pub kv_cells: usize,
    /// Most tokens in one step.
    pub step_tokens: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            threads: default_threads(),
            kv_cells: 8192,
            step_tokens: 512,
        }
    }
}

/// Physical cores are what matter for ggml's CPU kernels; use what the OS offers.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get())
}

/// One generation request.
#[derive(Debug, Clone)]
pub struct GenRequest {
    /// Prompt token ids (BOS included if the model wants one).
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// Stop when the model emits an end-of-generation token.
    pub stop_at_eog: bool,
    /// Also return the top `n` log-probabilities at each generated step (0 = none).
    pub top_logprobs: usize,
    /// Tokens never to sample (e.g. end-of-generation tokens to ignore EOS).
    pub banned_tokens: Vec<u32>,
}

/// Why a sequence stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// Reached `max_tokens`.
    Length,
    /// Emitted an end-of-generation token (included in the output).
    Stop,
    /// The callback asked to stop.
    Cancelled,
}

/// Result of one request.
#[derive(Debug, Clone)]
pub struct GenOutput {
    /// Generated token ids.
    pub tokens: Vec<u32>,
    /// Why generation ended.
    pub finish: FinishReason,
    /// Per generated token, the top log-probabilities (when asked for).
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
}

/// Errors of the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Out of KV cells.
    #[error(transparent)]
    Kv(#[from] KvError),
    /// A request is invalid.
    #[error("invalid request: {0}")]
    BadRequest(String),
}

struct Seq {
    id: SeqId,
    req_idx: usize,
    /// Prompt followed by generated tokens.
    tokens: Vec<u32>,
    /// Tokens whose K/V are in the cache.
    n_cached: usize,
    sampler: Sampler,
    out: GenOutput,
    done: bool,
}

/// The model plus everything needed to run steps on it.
pub struct Engine {
    model: Arc<Model>,
    exec: Executor,
    kv: KvStore,
    cells: CellAllocator,
    config: EngineConfig,
    next_id: SeqId,
}

impl Engine {
    /// Creates an engine over a loaded model.
    pub fn new(model: Arc<Model>, config: EngineConfig) -> Result<Engine, EngineError> {
        let exec = Executor::new(model.device(), config.threads)?;
        let kv = model.new_kv(config.kv_cells)?;
        let cells = CellAllocator::new(config.kv_cells);
        Ok(Engine {
            model,
            exec,
            kv,
            cells,
            config,
            next_id: 0,
        })
    }

    /// The engine's settings.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Runs `reqs` together to completion. `on_token(request index, token)` sees
    /// every generated token as it is sampled; returning `false` cancels that request.
    /// `is_eog` tells which tokens end generation.
    pub fn generate(
        &mut self,
        reqs: &[GenRequest],
        is_eog: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(usize, u32) -> bool,
    ) -> Result<Vec<GenOutput>, EngineError> {
        let mut seqs = Vec::with_capacity(reqs.len());
        for (i, r) in reqs.iter().enumerate() {
            if r.prompt.is_empty() {
                return Err(EngineError::BadRequest(format!(
                    "request {i}: empty prompt"
                )));
            }
            if let Some(&t) = r
                .prompt
                .iter()
                .find(|&&t| t as usize >= self.model.hparams().n_vocab)
            {
                return Err(EngineError::BadRequest(format!(
                    "request {i}: token {t} outside the vocabulary"
                )));
            }
            let mut sampler = Sampler::new(r.sampling.clone());
            for &t in &r.prompt {
                sampler.accept(t);
            }
            self.next_id += 1;
            seqs.push(Seq {
                id: self.next_id,
                req_idx: i,
                tokens: r.prompt.clone(),
                n_cached: 0,
                sampler,
                out: GenOutput {
                    tokens: Vec::new(),
                    finish: FinishReason::Length,
                    top_logprobs: Vec::new(),
                },
                done: r.max_tokens == 0,
            });
        }
        let result = self.run(&mut seqs, reqs, is_eog, on_token);
        for s in &seqs {
            self.cells.release(s.id);
        }
        result?;
        Ok(seqs.into_iter().map(|s| s.out).collect())
    }

    fn run(
        &mut self,
        seqs: &mut [Seq],
        reqs: &[GenRequest],
        is_eog: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(usize, u32) -> bool,
    ) -> Result<(), EngineError> {
        let n_vocab = self.model.hparams().n_vocab;
        while seqs.iter().any(|s| !s.done) {
            // Plan: (seq index, token range) chunks; decodes first so they are never starved.
            let mut budget = self.config.step_tokens;
            let mut plan: Vec<(usize, usize, usize)> = Vec::new();
            let mut order: Vec<usize> = (0..seqs.len()).filter(|&i| !seqs[i].done).collect();
            order.sort_by_key(|&i| seqs[i].tokens.len() - seqs[i].n_cached);
            for i in order {
                let s = &seqs[i];
                let n = (s.tokens.len() - s.n_cached).min(budget);
                if n == 0 {
                    continue;
                }
                plan.push((i, s.n_cached, s.n_cached + n));
                budget -= n;
            }
            let batch = self.assemble(seqs, &plan)?;
            let mut logits = self.model.forward(&mut self.exec, &self.kv, &batch)?;
            // Sample for every sequence whose chunk reached its end.
            let mut row = 0;
            for &(i, _, end) in &plan {
                let s = &mut seqs[i];
                s.n_cached = end;
                if end < s.tokens.len() {
                    continue;
                }
                let l = &mut logits[row * n_vocab..(row + 1) * n_vocab];
                row += 1;
                let req = &reqs[s.req_idx];
                if req.top_logprobs > 0 {
                    s.out
                        .top_logprobs
                        .push(log_softmax_top(l, req.top_logprobs));
                }
                for &t in &req.banned_tokens {
                    if let Some(x) = l.get_mut(t as usize) {
                        *x = f32::NEG_INFINITY;
                    }
                }
                let t = s.sampler.sample(l);
                s.sampler.accept(t);
                s.tokens.push(t);
                s.out.tokens.push(t);
                let keep = on_token(s.req_idx, t);
                if !keep {
                    s.out.finish = FinishReason::Cancelled;
                    s.done = true;
                } else if req.stop_at_eog && is_eog(t) {
                    s.out.finish = FinishReason::Stop;
                    s.done = true;
                } else if s.out.tokens.len() >= req.max_tokens {
                    s.out.finish = FinishReason::Length;
                    s.done = true;
                }
                if s.done {
                    self.cells.release(s.id);
                }
            }
        }
        Ok(())
    }

    /// Builds the step batch for `plan`, reserving cells for the new tokens.
    fn assemble(
        &mut self,
        seqs: &[Seq],
        plan: &[(usize, usize, usize)],
    ) -> Result<StepBatch, EngineError> {
        let mut b = StepBatch::default();
        for &(i, start, end) in plan {
            let s = &seqs[i];
            let positions: Vec<i32> = (start as i32..end as i32).collect();
            let cells = self.cells.reserve(s.id, &positions)?;
            b.tokens.extend_from_slice(&s.tokens[start..end]);
            b.positions.extend_from_slice(&positions);
            b.kv_slots.extend(cells.iter().map(|&c| c as i64));
            if end == s.tokens.len() {
                b.output_rows.push((b.tokens.len() - 1) as i32);
            }
        }
        if b.output_rows.is_empty() {
            // Only partial prompt chunks this step: compute one row's logits and ignore them.
            b.output_rows.push(0);
        }
        b.n_kv = self.cells.span();
        let hp = self.model.hparams();
        let mut mask = MaskBuilder::new(b.n_kv, b.tokens.len());
        let mut mask_swa = hp
            .swa_window
            .map(|_| MaskBuilder::new(b.n_kv, b.tokens.len()));
        let mut row = 0;
        for &(i, start, end) in plan {
            let cells = self.cells.cells(seqs[i].id);
            for pos in start..end {
                mask.allow(row, pos as i32, cells, None);
                if let Some(m) = mask_swa.as_mut() {
                    m.allow(row, pos as i32, cells, hp.swa_window);
                }
                row += 1;
            }
        }
        b.mask = mask.into_data();
        b.mask_swa = mask_swa.map(MaskBuilder::into_data);
        Ok(b)
    }
}
