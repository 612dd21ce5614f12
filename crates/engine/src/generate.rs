//! Batched generation: several sequences advance together, one model step at a
//! time. Each step carries every decoding sequence's next token plus prompt chunks
//! of sequences still prefilling, up to a token budget; a waiting request joins as
//! soon as a KV slot frees up.
//!
//! This is the foundation's synchronous loop; the engine-core issue turns it into
//! the scheduler-driven request API without changing how a step is assembled.

use std::collections::VecDeque;
use std::sync::Arc;

use tempo9_models::{Executor, KvStore, MaskBuilder, Model, ModelError, SeqSpan, StepBatch};

use crate::kv::{KvError, SeqId, SlotAllocator};
use crate::sampler::{log_softmax_top, Sampler, SamplingParams};

/// Granularity of a sequence's attention window (cells). llama.cpp pads the same
/// way, and ggml's CPU flash attention picks its kernel (and so its rounding) by
/// window length, so equal padding gives llama.cpp's numbers.
const KV_WINDOW_PAD: usize = 256;

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// CPU threads for compute.
    pub threads: usize,
    /// KV cells in the pool (tokens held across all sequences).
    pub kv_cells: usize,
    /// Most sequences running at once; each gets `kv_cells / max_seqs` cells.
    pub max_seqs: usize,
    /// Most tokens in one step.
    pub step_tokens: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            threads: default_threads(),
            kv_cells: 8192,
            max_seqs: 4,
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
    /// The sequence filled its KV slot.
    ContextFull,
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
    /// Out of KV space.
    #[error(transparent)]
    Kv(#[from] KvError),
    /// A request is invalid.
    #[error("invalid request: {0}")]
    BadRequest(String),
}

struct Seq {
    id: SeqId,
    req_idx: usize,
    /// First cell of the sequence's slot; position `p` lives in cell `kv_start + p`.
    kv_start: usize,
    /// Prompt followed by generated tokens.
    tokens: Vec<u32>,
    /// Tokens whose K/V are in the cache.
    n_cached: usize,
    sampler: Sampler,
    out: GenOutput,
}

/// The model plus everything needed to run steps on it.
pub struct Engine {
    model: Arc<Model>,
    exec: Executor,
    kv: KvStore,
    slots: SlotAllocator,
    config: EngineConfig,
    next_id: SeqId,
}

impl Engine {
    /// Creates an engine over a loaded model.
    pub fn new(model: Arc<Model>, config: EngineConfig) -> Result<Engine, EngineError> {
        let max_seqs = config.max_seqs.max(1);
        let per_seq = config.kv_cells / max_seqs;
        // Whole windows per slot, so a full window never crosses into the next slot.
        let slot_cells = if per_seq >= KV_WINDOW_PAD {
            per_seq - per_seq % KV_WINDOW_PAD
        } else {
            per_seq
        };
        if slot_cells < 2 {
            return Err(EngineError::BadRequest(format!(
                "{} KV cells cannot hold {max_seqs} sequences",
                config.kv_cells
            )));
        }
        let exec = Executor::new(model.device(), config.threads)?;
        let kv = model.new_kv(slot_cells * max_seqs)?;
        let slots = SlotAllocator::new(max_seqs, slot_cells);
        Ok(Engine {
            model,
            exec,
            kv,
            slots,
            config,
            next_id: 0,
        })
    }

    /// The engine's settings.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Most tokens (prompt + generated) one sequence can hold.
    pub fn max_seq_tokens(&self) -> usize {
        self.slots.slot_cells()
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Runs `reqs` to completion, at most `max_seqs` at a time. `on_token(request
    /// index, token)` sees every generated token as it is sampled; returning `false`
    /// cancels that request. `is_eog` tells which tokens end generation.
    pub fn generate(
        &mut self,
        reqs: &[GenRequest],
        is_eog: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(usize, u32) -> bool,
    ) -> Result<Vec<GenOutput>, EngineError> {
        let n_vocab = self.model.hparams().n_vocab;
        for (i, r) in reqs.iter().enumerate() {
            if r.prompt.is_empty() {
                return Err(EngineError::BadRequest(format!(
                    "request {i}: empty prompt"
                )));
            }
            if let Some(&t) = r.prompt.iter().find(|&&t| t as usize >= n_vocab) {
                return Err(EngineError::BadRequest(format!(
                    "request {i}: token {t} outside the vocabulary"
                )));
            }
            if r.prompt.len() >= self.max_seq_tokens() {
                return Err(EngineError::BadRequest(format!(
                    "request {i}: prompt of {} tokens does not fit a sequence's {} KV cells",
                    r.prompt.len(),
                    self.max_seq_tokens()
                )));
            }
        }
        let mut outputs: Vec<Option<GenOutput>> = vec![None; reqs.len()];
        let mut waiting: VecDeque<usize> = (0..reqs.len()).collect();
        let mut running: Vec<Seq> = Vec::new();
        let result = self.run(
            reqs,
            &mut waiting,
            &mut running,
            &mut outputs,
            is_eog,
            on_token,
        );
        for s in &running {
            self.slots.release(s.id);
        }
        result?;
        Ok(outputs
            .into_iter()
            .map(|o| o.expect("every request finished"))
            .collect())
    }

    fn run(
        &mut self,
        reqs: &[GenRequest],
        waiting: &mut VecDeque<usize>,
        running: &mut Vec<Seq>,
        outputs: &mut [Option<GenOutput>],
        is_eog: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(usize, u32) -> bool,
    ) -> Result<(), EngineError> {
        let n_vocab = self.model.hparams().n_vocab;
        loop {
            // Admit waiting requests while slots are free.
            while self.slots.n_free() > 0 {
                let Some(i) = waiting.pop_front() else { break };
                let r = &reqs[i];
                let empty = GenOutput {
                    tokens: Vec::new(),
                    finish: FinishReason::Length,
                    top_logprobs: Vec::new(),
                };
                if r.max_tokens == 0 {
                    outputs[i] = Some(empty);
                    continue;
                }
                self.next_id += 1;
                let kv_start = self.slots.acquire(self.next_id)?;
                let mut sampler = Sampler::new(r.sampling.clone());
                r.prompt.iter().for_each(|&t| sampler.accept(t));
                running.push(Seq {
                    id: self.next_id,
                    req_idx: i,
                    kv_start,
                    tokens: r.prompt.clone(),
                    n_cached: 0,
                    sampler,
                    out: empty,
                });
            }
            if running.is_empty() {
                return Ok(());
            }
            // Plan: (running index, token range); decodes first so they are never starved.
            let mut budget = self.config.step_tokens.max(1);
            let mut order: Vec<usize> = (0..running.len()).collect();
            order.sort_by_key(|&i| running[i].tokens.len() - running[i].n_cached);
            let mut plan = Vec::new();
            for i in order {
                let s = &running[i];
                let n = (s.tokens.len() - s.n_cached).min(budget);
                if n > 0 {
                    plan.push((i, s.n_cached, s.n_cached + n));
                    budget -= n;
                }
            }
            // Token order: single-token decodes first (they share matmuls), then prompt
            // chunks, each in running order.
            plan.sort_unstable_by_key(|&(i, start, end)| (end - start > 1, i));
            let batch = self.assemble(running, &plan);
            let mut logits = self.model.forward(&mut self.exec, &self.kv, &batch)?;

            // Sample for every sequence whose chunk reached its end.
            let mut row = 0;
            let mut finished = Vec::new();
            for &(i, _, end) in &plan {
                let s = &mut running[i];
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
                let finish = if !on_token(s.req_idx, t) {
                    Some(FinishReason::Cancelled)
                } else if req.stop_at_eog && is_eog(t) {
                    Some(FinishReason::Stop)
                } else if s.out.tokens.len() >= req.max_tokens {
                    Some(FinishReason::Length)
                } else if s.tokens.len() > self.slots.slot_cells() {
                    Some(FinishReason::ContextFull)
                } else {
                    None
                };
                if let Some(f) = finish {
                    s.out.finish = f;
                    finished.push(i);
                }
            }
            for &i in finished.iter().rev() {
                let s = running.remove(i);
                self.slots.release(s.id);
                outputs[s.req_idx] = Some(s.out);
            }
        }
    }

    /// Builds the step batch for `plan` (in token order).
    fn assemble(&self, running: &[Seq], plan: &[(usize, usize, usize)]) -> StepBatch {
        let window = self.model.hparams().swa_window;
        let mut b = StepBatch::default();
        for &(i, start, end) in plan {
            let s = &running[i];
            let row_start = b.tokens.len();
            let n_rows = end - start;
            let n_kv = end
                .next_multiple_of(KV_WINDOW_PAD)
                .min(self.slots.slot_cells());
            let mut mask = MaskBuilder::new(n_kv, n_rows);
            let mut mask_swa = window.map(|_| MaskBuilder::new(n_kv, n_rows));
            for (r, pos) in (start..end).enumerate() {
                b.tokens.push(s.tokens[pos]);
                b.positions.push(pos as i32);
                b.kv_slots.push((s.kv_start + pos) as i64);
                mask.allow_prefix(r, pos as i32, None);
                if let Some(m) = mask_swa.as_mut() {
                    m.allow_prefix(r, pos as i32, window);
                }
            }
            if end == s.tokens.len() {
                b.output_rows.push((b.tokens.len() - 1) as i32);
            }
            b.seqs.push(SeqSpan {
                row_start,
                n_rows,
                kv_start: s.kv_start,
                n_kv,
                mask: mask.into_data(),
                mask_swa: mask_swa.map(MaskBuilder::into_data),
            });
        }
        if b.output_rows.is_empty() {
            // Only partial prompt chunks this step: compute one row's logits and ignore them.
            b.output_rows.push(0);
        }
        b
    }
}
