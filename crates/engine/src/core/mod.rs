//! The engine core: requests and the step loop, driven by one thread (see
//! [`crate::Engine`] for the threaded wrapper).
//!
//! [`setup`] builds the engine and splits its KV budget; requests come in through
//! [`intake`] (checked against the engine's limits, then queued).
//!
//! Every [`EngineCore::step`] runs one model forward over a batch assembled from all
//! running requests (continuous batching). The step follows the data flow:
//! - admission ([`admission`]): waiting requests get their cached prefix and pages;
//! - the scheduler ([`crate::scheduler::plan`]) turns the running requests' progress
//!   and the cache's state into a plain step plan: decodes first, then prompt chunks
//!   up to a token budget, the cells they write in every cache group, and which
//!   requests are preempted for memory (their KV is dropped and recomputed when they
//!   are admitted again);
//! - the runner ([`runner`]) assembles the model's batch from the plan, runs the
//!   model, commits the KV to the prefix cache and samples ([`output`] turns tokens
//!   into events).
//!
//! [`plan`] sizes the step's prompt budget, asks the scheduler for its plan and
//! carries out the preemptions; requests end in [`finish`]; an idle engine gives
//! memory back ([`idle`]); [`stats`] holds what the engine reports.
//!
//! KV memory is managed per group of layers by [`crate::cache::KvCache`]; with an
//! SSD tier ([`EngineConfig::ssd`], [`crate::ssd`]), cached pages evicted from RAM
//! are written to disk and read back for later hits ([`tier`]).

mod admission;
mod checkpoints;
mod draft;
mod finish;
mod idle;
mod images;
mod intake;
mod mtp;
mod output;
mod plan;
mod runner;
mod setup;
mod speculate;
mod state_tier;
mod stats;
mod tier;
mod window_tier;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tempo9_models::{CacheGroup, Executor, KvStore, Model, ModelError};
use tempo9_tokenizer::Tokenizer;
use tokio::sync::mpsc;

use crate::cache::KvCache;
use crate::image::Images;
#[cfg(doc)]
use crate::request::Request;
use crate::request::{Event, FinishReason, RequestId, TokenConstraint, TokenMask, Usage};
use crate::sampler::Sampler;
use crate::scheduler::{Policy, Progress, Rank, CHUNK_ALIGN};
#[cfg(doc)]
use crate::spec::SpecMode;
use crate::spec::{Depth, DraftCost, SpecConfig, StepCost};
use crate::ssd::{LoadId, SsdConfig, SsdTier};
use crate::stop::TextStream;
use crate::vision::{VisionModel, VisionWorker};
use runner::MaskBuffers;
use speculate::SpecStates;

pub use draft::DraftModel;
use draft::Drafter;
pub(crate) use intake::Limits;
pub use intake::SubmitError;
use mtp::MtpDrafter;
pub use stats::{EngineStats, RequestPhase, RequestProgress};

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// CPU threads for compute.
    pub threads: usize,
    /// Bytes of KV memory for all requests together; `None` = a quarter of the
    /// system's memory, and on a GPU no more than its free memory after the weights
    /// less a reserve for compute buffers ([`gpu_kv_budget`]). On the CPU, host memory
    /// is committed only as pages are first written, so the budget is a ceiling, not a
    /// start-up cost; on a GPU it is allocated at start.
    pub kv_budget_bytes: Option<usize>,
    /// Tokens per KV page (64, 128 or 256): the prefix cache shares whole pages.
    pub page_tokens: usize,
    /// Most requests running (holding KV) at once.
    pub max_running: usize,
    /// Most requests waiting to be admitted; more are refused with
    /// [`SubmitError::QueueFull`].
    pub max_waiting: usize,
    /// Prompt tokens in one step (each decoding request's token comes on top). A
    /// prompt's last piece, which must not be split below [`CHUNK_ALIGN`] tokens, may
    /// exceed what is left of it by less than [`CHUNK_ALIGN`].
    pub step_tokens: usize,
    /// Prompt tokens in one step while a single request runs and no other waits but
    /// for the prefix it is computing (at least `step_tokens`): nobody's tokens wait
    /// on a longer step then (agents arriving together with one system prompt wait
    /// for the first one's prefix either way), and on a GPU larger chunks cost less
    /// per token (each step builds a graph and a mask at the prompt's depth). While
    /// several prompts share the steps, `step_tokens`-sized chunks let the shorter
    /// ones finish first rather than all at a long step's end.
    pub solo_step_tokens: usize,
    /// While some requests are decoding, prompt chunks shrink (to no fewer than
    /// [`CHUNK_ALIGN`] tokens) so that a step takes about this long, measured from
    /// recent steps: a long prompt arriving on a slow machine then delays the others'
    /// next tokens by this much, not by a full `step_tokens` chunk. `None` = chunks of
    /// `step_tokens` always.
    pub itl_target: Option<std::time::Duration>,
    /// Per-request limit on prompt plus output tokens; `None` = the model's trained
    /// context length. Costs no memory up front.
    pub max_context: Option<usize>,
    /// Which requests go first.
    pub policy: Policy,
    /// Second tier for KV pages on local disk; `None` (the default here; the CLI
    /// turns it on) keeps the prefix cache in RAM only.
    pub ssd: Option<SsdConfig>,
    /// Batch-invariant numbers for every request: a request's tokens and
    /// log-probabilities then do not depend on what else shares its steps (see
    /// `StepBatch::batch_invariant`; [`Request::deterministic`] asks per request).
    /// Off by default: on CPUs where ggml repacks few weight types (AVX2) it can
    /// halve single-stream decode speed.
    pub deterministic: bool,
    /// Keep every token's K/V in sliding-window layers too, as in one full-attention
    /// cache (llama.cpp's `--swa-full`). Off by default: those layers then hold only
    /// the pages their window sees (see [`crate::sliding`]).
    pub swa_full: bool,
    /// Decode rows attend through flash attention at any depth, never through the
    /// CPU's matmul path (see `StepBatch::flash_decode`). Off by default (the matmul
    /// path is faster at depth); on, with `swa_full` and llama.cpp's thread count, a
    /// decode computes llama.cpp's numbers bit for bit where ggml's kernels allow.
    pub flash_decode: bool,
    /// Sliding-window layers keep, for a cached prefix, the window before every
    /// multiple of this many tokens (0: only at prompt and sequence ends), so a later
    /// prompt that forks there reuses the prefix; more often costs more memory (a
    /// window per checkpoint). See [`crate::sliding`].
    pub window_checkpoint_tokens: usize,
    /// Recurrent-state layers (hybrid models) checkpoint a long prompt's state every
    /// this many tokens (a multiple of `page_tokens`; 0: only at prompt ends, answer
    /// pages and where prompts part), so a later prompt that parts from it anywhere
    /// recomputes fewer than 1.25 times this many tokens (an interval position a
    /// quarter interval or less before another one is skipped). Each checkpoint
    /// costs a state slot ([`EngineStats::state_slot_bytes`]), which the KV budget
    /// sets aside per page of cached prefix. See `crate::core::checkpoints`.
    pub state_checkpoint_tokens: usize,
    /// Hybrid models also checkpoint the state after each page an answer fills
    /// (keeping the deepest), so an agent's next turn, which repeats the answer,
    /// skips recomputing it. Off by default: that state is the one decoding
    /// computed, which rounds apart from computing the answer as part of a prompt,
    /// so the next turn's numbers are no longer exactly those of computing it from
    /// scratch (as reusing the answer's K/V pages is not for any model); off, an
    /// answer is recomputed once, as part of the next prompt, and checkpointed
    /// there exactly.
    pub answer_state_checkpoints: bool,
    /// Speculative decoding (see [`crate::spec`]); `None`: off. On a hybrid model
    /// each request verifying drafts also holds `k` scratch state slots for a step
    /// (the state after each of its rows, so rejected drafts can be rolled back):
    /// they come out of the KV budget, and at most as many requests draft at once
    /// as have them.
    pub speculation: Option<SpecConfig>,
    /// The draft model of [`SpecMode::Draft`] (same vocabulary as the model). Its KV
    /// takes a share of `kv_budget_bytes`: as many tokens as the model's pages hold.
    pub draft_model: Option<DraftModel>,
    /// The vision encoder for requests with images ([`Request::images`]); `None`:
    /// requests with images are refused. It runs on a thread of its own, beside the
    /// steps, on the device it was loaded on.
    pub vision: Option<VisionModel>,
    /// Encode images on the engine's thread, inside the step that needs them, as
    /// llama.cpp does: every running request's decode waits for the encode. Off
    /// by default (encodes run beside the steps); for comparisons.
    pub vision_inline: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            threads: default_threads(),
            kv_budget_bytes: None,
            page_tokens: 64,
            max_running: 64,
            max_waiting: 1024,
            step_tokens: 512,
            solo_step_tokens: 512,
            itl_target: Some(std::time::Duration::from_millis(500)),
            max_context: None,
            policy: Policy::Fcfs,
            ssd: None,
            deterministic: false,
            swa_full: false,
            flash_decode: false,
            window_checkpoint_tokens: 8192,
            state_checkpoint_tokens: 2048,
            answer_state_checkpoints: false,
            speculation: None,
            draft_model: None,
            vision: None,
            vision_inline: false,
        }
    }
}

/// Physical cores are what matter for ggml's CPU kernels; use what the OS offers.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get())
}

/// A GPU's default KV budget: `host` (a quarter of the machine's memory) or, if less,
/// the device's `free` memory (weights already loaded) less a reserve for the
/// compute buffers, which grow at run time with the largest step (~0.7 GiB for
/// 2048-token steps of Qwen3.5-35B-A3B): 1 GiB or 1/16 of the device, the larger.
/// A quarter of host memory alone could ask a 24 GB card holding a 15 GB model for
/// 16 GB of KV and fail at start.
pub(crate) fn gpu_kv_budget(host: usize, free: usize, total: usize) -> usize {
    let reserve = (1usize << 30).max(total / 16);
    host.min(free.saturating_sub(reserve))
}

/// Errors creating or running the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The settings cannot work.
    #[error("invalid engine configuration: {0}")]
    Config(String),
}

/// A request inside the engine.
struct Live {
    id: RequestId,
    rank: Rank,
    /// Prompt followed by generated tokens.
    tokens: Vec<u32>,
    /// Tokens whose KV is in the cache (0 while waiting).
    n_computed: usize,
    /// Prompt tokens (computed in page-sized chunks; later tokens one per step).
    n_prompt: usize,
    max_tokens: usize,
    stop_eog: bool,
    stop_ids: Vec<u32>,
    logprobs: bool,
    top_logprobs: usize,
    banned: Vec<u32>,
    /// Wants batch-invariant steps ([`Request::deterministic`]).
    deterministic: bool,
    constraint: Option<Box<dyn TokenConstraint>>,
    /// The constraint's mask for this step's sample.
    mask: Option<Result<TokenMask, String>>,
    sampler: Sampler,
    text: TextStream,
    tx: mpsc::UnboundedSender<Event>,
    cancel: Arc<AtomicBool>,
    usage: Usage,
    admitted_before: bool,
    /// Leading prompt cells another prompt may copy (see [`crate::partial_page`]);
    /// 0 until its prompt is computed.
    exact_cells: usize,
    /// With a recurrent group: prompt positions (page boundaries, ascending) where
    /// a step ends and the state is checkpointed (see [`checkpoints`]).
    state_targets: Vec<usize>,
    /// With a recurrent group: the prompt's last checkpoint position, taken inside
    /// the step whose piece computes it (a state snapshot: the piece goes on to the
    /// prompt's end instead of stopping there).
    tail_target: Option<usize>,
    /// With a recurrent group: the page hash of the checkpoint its answer last took
    /// (replaced as the answer fills pages).
    answer_checkpoint: Option<u64>,
    /// Speculative decoding's draft depth for it; `None`: it does not speculate.
    spec: Option<Depth>,
    /// Draft tokens proposed for this step (verified after it, then cleared).
    draft: Vec<u32>,
    /// The request's predicted output ([`Request::prediction`]).
    prediction: Vec<u32>,
    /// The prompt's images (their cells' ids in `tokens` are prefix-cache keys,
    /// see [`Images::key_prompt`]).
    images: Images,
}

impl Live {
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.tx.is_closed()
    }

    /// Its next token is the top logit and nothing else: no constraint, banned
    /// tokens, penalties or log-probabilities (the device may pick it).
    fn plain_greedy(&self) -> bool {
        self.constraint.is_none()
            && self.banned.is_empty()
            && !self.logprobs
            && self.top_logprobs == 0
            && self.sampler.is_plain_greedy()
    }

    /// Cuts its drafts where its constraint would stop accepting them: a draft the
    /// grammar forbids can never be taken, and every row after it is wasted.
    fn cut_drafts_to_constraint(&mut self) {
        if let (Some(c), false) = (self.constraint.as_mut(), self.draft.is_empty()) {
            let n = c.accepted_prefix(&self.draft);
            self.draft.truncate(n);
        }
    }

    /// Leading tokens of `tokens` that its prompt shares.
    fn shared_prompt(&self, tokens: &[u32]) -> usize {
        tokens
            .iter()
            .zip(&self.tokens[..self.n_prompt])
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// What the scheduler sees of it.
    fn progress(&self) -> Progress {
        Progress {
            id: self.id,
            rank: self.rank,
            n_prompt: self.n_prompt,
            n_computed: self.n_computed,
            n_tokens: self.tokens.len(),
            n_draft: self.draft.len(),
            stop_at: self
                .state_targets
                .iter()
                .copied()
                .find(|&t| t > self.n_computed)
                .unwrap_or(usize::MAX),
            blocked_at: self.images.blocked_at(self.n_computed),
            whole: self.images.whole_span(self.n_computed),
        }
    }
}

/// An admitted request whose cached prefix is being read back from the SSD tier; it
/// holds its pages but is not scheduled until the load is in.
struct Loading {
    live: Live,
    load: LoadId,
    /// Index in its page table of the first page being loaded.
    first_page: usize,
    /// The loaded pages' hashes, in order.
    hashes: Vec<u64>,
    /// Whether this is the request's first admission (its usage counts the hit).
    first_admission: bool,
    /// A hybrid model's load: the page hash of the state checkpoint read back into
    /// the request's state slot after the pages (`None`: its state is a RAM
    /// checkpoint's copy, or zeros); unless every page and the state come back, the
    /// request returns to waiting.
    state: Option<Option<u64>>,
}

/// The engine's state and step loop (single-threaded; see the module docs).
pub struct EngineCore {
    model: Arc<Model>,
    tok: Arc<Tokenizer>,
    exec: Executor,
    kv: Arc<KvStore>,
    cache: KvCache,
    /// The model's cache groups as the KV store holds them.
    groups: Vec<CacheGroup>,
    config: EngineConfig,
    limits: Limits,
    page_bytes: usize,
    sliding_page_bytes: usize,
    state_slot_bytes: usize,
    waiting: Vec<Live>,
    running: Vec<Live>,
    ssd: Option<SsdTier>,
    loading: Vec<Loading>,
    /// Sliding-window pages the loads in flight fill (see [`window_tier`]).
    window_fills: window_tier::WindowFills,
    next_id: RequestId,
    /// Requests submitted but not yet admitted (shared with the threaded handle).
    queued: Arc<AtomicUsize>,
    stats: EngineStats,
    /// Seconds per computed token in recent steps of at least [`CHUNK_ALIGN`] tokens
    /// (moving average), for [`EngineConfig::itl_target`].
    token_cost_s: Option<f64>,
    /// What a decode-only step's rows cost in the model (for speculation's depths).
    step_cost: StepCost,
    /// What the drafting model's work costs (speculation's `draft` and `mtp` modes).
    draft_cost: DraftCost,
    /// Seconds this step spent in the drafting model (not the step's rows).
    draft_s: f64,
    /// Compute-buffer size last logged (the buffers only grow; logged again when a
    /// quarter larger, so small steps of growth do not flood the log).
    compute_bytes_logged: usize,
    /// When the engine started: the origin of [`Rank::arrived_us`].
    epoch: std::time::Instant,
    /// Memory of earlier steps' masks, for the next steps' (see [`MaskBuffers`]).
    mask_buffers: MaskBuffers,
    /// The draft model's runner ([`SpecMode::Draft`]).
    drafter: Option<Drafter>,
    /// The MTP head's runner ([`SpecMode::Mtp`]).
    mtp: Option<MtpDrafter>,
    /// The last step's hidden states of the rows the MTP head takes
    /// ([`tempo9_models::StepBatch::hidden_rows`]).
    step_hidden: Vec<f32>,
    /// A hybrid model's speculation scratch: state slots from this one on, `k` per
    /// request verifying drafts in a step (see [`EngineConfig::speculation`]).
    spec_states: SpecStates,
    /// The vision encoder's thread ([`EngineConfig::vision`]).
    vision: Option<VisionWorker>,
}

impl EngineCore {
    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The tokenizer used for text deltas and end-of-generation tokens.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tok
    }

    /// The settings.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Whether any request is waiting, loading or running.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty() || !self.loading.is_empty()
    }

    /// Runs steps until no request is left.
    pub fn run_until_idle(&mut self) -> Result<(), EngineError> {
        while self.has_work() {
            self.step()?;
        }
        Ok(())
    }

    /// One step: drops cancelled requests, schedules, runs the model, samples and
    /// sends events. Returns whether there was anything to do. A model failure
    /// ends the requests of the step with [`FinishReason::Error`] (the engine itself
    /// stays usable) and is returned.
    pub fn step(&mut self) -> Result<bool, EngineError> {
        let started = std::time::Instant::now();
        self.reap_cancelled();
        if !self.has_work() {
            return Ok(false);
        }
        self.ssd_finish_loads(false);
        let only_prefix_waiters = self.admit();
        self.poll_images();
        self.propose_drafts();
        self.trace_drafts();
        let work = self.schedule(only_prefix_waiters);
        let work = &work[..];
        self.ssd_save_evicted();
        if work.is_empty() {
            if !self.loading.is_empty() {
                // Nothing to compute until a prefix is read back: wait for one.
                self.ssd_finish_loads(true);
            } else if let Some(v) = self.vision.as_mut() {
                // Nothing to compute until an image is encoded: wait a little for
                // one (new requests are looked at again after it).
                v.wait(std::time::Duration::from_millis(20));
            }
            return Ok(true);
        }
        let planned = started.elapsed();
        // A step of decode rows only (with or without drafts) measures their cost,
        // which only speculation's depths use.
        let decode_only = self.config.speculation.is_some()
            && work.iter().all(|w| {
                self.running_index(w.id)
                    .is_some_and(|i| w.start >= self.running[i].n_prompt)
            });
        let snapshots = self.reserve_state_snapshots(work);
        let batch = self.assemble(work, &snapshots);
        let t0 = std::time::Instant::now();
        let mut out = match self.forward(work, &batch) {
            Ok(l) => l,
            Err(e) => {
                for s in &snapshots {
                    self.cache.drop_checkpoint(s.hash);
                }
                let msg = e.to_string();
                tracing::error!(error = %msg, "model step failed");
                for w in work {
                    if let Some(i) = self.running_index(w.id) {
                        let s = self.running.remove(i);
                        self.end(s, FinishReason::Error(msg.clone()));
                    }
                }
                return Err(e.into());
            }
        };
        let forward_s = t0.elapsed().as_secs_f64();
        self.stats.steps_total += 1;
        self.stats.computed_tokens_total += batch.tokens.len() as u64;
        self.stats.forward_seconds_total += forward_s;
        if batch.tokens.len() >= CHUNK_ALIGN {
            let cost = forward_s / batch.tokens.len() as f64;
            self.token_cost_s = Some(self.token_cost_s.map_or(cost, |c| 0.5 * c + 0.5 * cost));
        }
        let compute_bytes = self.exec.compute_bytes();
        if compute_bytes > self.compute_bytes_logged + self.compute_bytes_logged / 4 {
            self.compute_bytes_logged = compute_bytes;
            tracing::info!(
                mib = compute_bytes >> 20,
                step_tokens = batch.tokens.len(),
                sequences = batch.seqs.len(),
                "compute buffers grew"
            );
        }
        let t1 = std::time::Instant::now();
        let taken = self.cache.stats().recurrent.map_or(0, |r| r.taken);
        self.after_step(work, &mut out);
        let checkpoints = self.cache.stats().recurrent.map_or(0, |r| r.taken) - taken;
        let step_s = started.elapsed().as_secs_f64();
        self.stats.step_seconds_total += step_s;
        if decode_only {
            // The model's part: the drafting model's passes are costed apart.
            self.step_cost
                .observe(batch.tokens.len(), (step_s - self.draft_s).max(0.0));
        }
        // Where a step's time goes: planning (admission, scheduling), building the
        // batch's inputs, the model, then sampling and sending events.
        tracing::debug!(
            tokens = batch.tokens.len(),
            sequences = batch.seqs.len(),
            running = self.running.len(),
            waiting = self.waiting.len(),
            plan_ms = planned.as_secs_f64() * 1e3,
            assemble_ms = (t0 - started - planned).as_secs_f64() * 1e3,
            forward_ms = forward_s * 1e3,
            sample_ms = t1.elapsed().as_secs_f64() * 1e3,
            checkpoints,
            step_ms = step_s * 1e3,
            "step"
        );
        if self.has_work() {
            self.mask_buffers.give_back(batch);
        } else {
            self.mask_buffers = MaskBuffers::default();
            self.release_step_buffers();
        }
        Ok(true)
    }

    fn running_index(&self, id: RequestId) -> Option<usize> {
        self.running.iter().position(|s| s.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::gpu_kv_budget;

    const GIB: usize = 1 << 30;

    #[test]
    fn a_gpu_budget_is_the_host_quarter_or_what_the_device_has_left() {
        // H200 after a 15 GB model: the host quarter (32 GiB) fits.
        assert_eq!(gpu_kv_budget(32 * GIB, 127 * GIB, 143 * GIB), 32 * GIB);
        // A 24 GiB card with 8.5 GiB left: 1.5 GiB (1/16) stays for compute buffers.
        assert_eq!(
            gpu_kv_budget(16 * GIB, 17 * GIB / 2, 24 * GIB),
            17 * GIB / 2 - 3 * GIB / 2
        );
        // A small device keeps at least 1 GiB.
        assert_eq!(gpu_kv_budget(8 * GIB, 3 * GIB, 8 * GIB), 2 * GIB);
        // Nothing left: zero, which the pool then refuses with its own message.
        assert_eq!(gpu_kv_budget(8 * GIB, GIB / 2, 8 * GIB), 0);
    }
}
