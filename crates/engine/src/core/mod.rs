//! The engine core: requests and the step loop, driven by one thread (see
//! [`crate::Engine`] for the threaded wrapper).
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
//! KV memory is managed per group of layers by [`crate::cache::KvCache`]; with an
//! SSD tier ([`EngineConfig::ssd`], [`crate::ssd`]), cached pages evicted from RAM
//! are written to disk and read back for later hits ([`tier`]).

mod admission;
mod checkpoints;
mod draft;
mod images;
mod mtp;
mod output;
mod runner;
mod speculate;
mod state_tier;
mod tier;
mod window_tier;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tempo9_models::vision::ImageDecoding;
use tempo9_models::{CacheGroup, Executor, GroupKind, KvStore, Model, ModelError};
use tempo9_tokenizer::Tokenizer;
use tokio::sync::mpsc;

use crate::cache::KvCache;
use crate::image::Images;
use crate::pages::PagePool;
use crate::partial_page;
use crate::recurrent::{RecurrentStates, RecurrentStats};
use crate::request::{
    Event, Finish, FinishReason, Request, RequestId, TokenConstraint, TokenMask, Usage,
};
use crate::sampler::Sampler;
use crate::scheduler::{self, itl_budget, Policy, Progress, Rank, CHUNK_ALIGN, KV_WINDOW_PAD};
use crate::sliding::{SlidingPages, SlidingStats};
use crate::spec::{Depth, DraftCost, SpecConfig, SpecMode, StepCost, MAX_DRAFT};
use crate::ssd::{LoadId, SsdConfig, SsdStats, SsdTier};
use crate::stop::TextStream;
use crate::stream::{RequestStream, Ticket};
use crate::vision::{VisionModel, VisionWorker};
use runner::MaskBuffers;

pub use draft::DraftModel;
use draft::{Drafter, ModelDrafter};
use mtp::MtpDrafter;

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

/// Full-attention pages and sliding-window pages for a KV `budget` in bytes, given
/// a full page's bytes and, with a sliding group, its page's bytes and window.
///
/// The sliding group gets what every running request's window needs (the window
/// plus a step's tokens, in pages, plus a page), one such window of slack, and the
/// windows a cached prefix keeps ([`EngineConfig::window_checkpoint_tokens`]) for every
/// full page; the full group gets the rest. When the budget cannot give the running
/// requests their windows, both groups get the same number of pages (the memory of
/// one cache for all layers).
fn split_budget(
    budget: usize,
    page_bytes: usize,
    sliding: Option<(usize, usize)>,
    config: &EngineConfig,
) -> (usize, usize) {
    let Some((sliding_bytes, window)) = sliding else {
        return (budget / page_bytes, 0);
    };
    let ps = config.page_tokens;
    let step = config.step_tokens.max(config.solo_step_tokens);
    let live = (window + step).div_ceil(ps) + 1;
    let fixed = (config.max_running + 1) * live;
    // Sliding pages kept per full page of cached prefix.
    let k = config.window_checkpoint_tokens;
    let per_page = if k == 0 {
        0.0
    } else {
        (window.div_ceil(ps) + 3) as f64 / k.div_ceil(ps) as f64
    };
    let same = budget / (page_bytes + sliding_bytes);
    let Some(rest) = budget.checked_sub(fixed * sliding_bytes) else {
        return (same, same);
    };
    let n = (rest as f64 / (page_bytes as f64 + per_page * sliding_bytes as f64)) as usize;
    let m = fixed + (per_page * n as f64).ceil() as usize;
    if m >= n || n * ps < KV_WINDOW_PAD {
        return (same, same);
    }
    (n, m)
}

/// Of `budget` bytes left after the running requests' live states, the bytes for
/// pages and the number of state checkpoint slots of `slot_bytes` each: a checkpoint
/// per [`EngineConfig::state_checkpoint_tokens`] of cached pages, plus two per
/// running request (a prompt's junction and end, or an answer's last page), as far
/// as the budget allows (at most half of it goes to checkpoints).
fn split_state_budget(
    budget: usize,
    page_bytes: usize,
    slot_bytes: usize,
    config: &EngineConfig,
) -> (usize, usize) {
    let fixed = (2 * config.max_running).min(budget / 2 / slot_bytes.max(1));
    let rest = budget - fixed * slot_bytes;
    let every = config.state_checkpoint_tokens;
    if every == 0 {
        return (rest, fixed);
    }
    // Per page: its bytes and its share of a checkpoint.
    let share = config.page_tokens as f64 / every as f64;
    let n_pages = rest as f64 / (page_bytes as f64 + share * slot_bytes as f64);
    let n = ((share * n_pages) as usize).min(rest / 2 / slot_bytes.max(1));
    (rest - n * slot_bytes, fixed + n)
}

/// The default KV budget on `model`'s device: a quarter of the machine's memory,
/// and on a GPU at most what [`gpu_kv_budget`] leaves.
fn default_kv_budget(model: &Model) -> usize {
    let host = host_kv_budget();
    let Some((free, total)) = model.device_memory() else {
        return host;
    };
    let budget = gpu_kv_budget(host, free, total);
    if budget < host {
        tracing::info!(
            free_mib = free >> 20,
            kv_mib = budget >> 20,
            "KV budget limited by free device memory (--kv-budget sets it)"
        );
    }
    budget
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

/// Step buffers an idle engine on the CPU keeps (see
/// `EngineCore::release_step_buffers`): a decode step's and a short prompt's.
const IDLE_KEEP_STEP_BYTES: usize = 8 << 20;

/// A quarter of the machine's memory (4 GiB when it cannot be read).
fn host_kv_budget() -> usize {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok())
        })
        .map(|kib| kib * 1024);
    total.map_or(4 << 30, |t| t / 4)
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

/// Why a request was refused at submission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// Too many requests are waiting.
    #[error("server busy: {waiting} requests already waiting")]
    QueueFull {
        /// Requests waiting.
        waiting: usize,
    },
    /// The prompt leaves no room for output within the context limit.
    #[error("prompt of {prompt_tokens} tokens exceeds the context limit of {max_context} tokens")]
    PromptTooLong {
        /// Prompt tokens.
        prompt_tokens: usize,
        /// The limit (prompt + output).
        max_context: usize,
    },
    /// The request is malformed.
    #[error("invalid request: {0}")]
    BadRequest(String),
    /// The engine has shut down.
    #[error("the engine has stopped")]
    Stopped,
}

/// A snapshot of the engine's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineStats {
    /// Requests waiting for admission.
    pub waiting: usize,
    /// Requests holding KV and computing.
    pub running: usize,
    /// KV pages in the pool.
    pub kv_pages_total: usize,
    /// Pages held by running requests.
    pub kv_pages_used: usize,
    /// Unreferenced pages kept for the prefix cache (evictable).
    pub kv_pages_cached: usize,
    /// Pages never written or released without being cached.
    pub kv_pages_free: usize,
    /// Tokens per page.
    pub page_tokens: usize,
    /// Bytes of one full-attention page (its layers' K and V).
    pub page_bytes: usize,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_query_tokens: u64,
    /// Of those, tokens found cached (whole pages, or copied into a short prompt's
    /// first page).
    pub prefix_hit_tokens: u64,
    /// Of the hits, tokens copied from another short prompt's first page.
    pub prefix_copied_tokens: u64,
    /// Cached pages evicted to make room.
    pub evicted_pages: u64,
    /// Prompt tokens of all admitted requests.
    pub prompt_tokens_total: u64,
    /// Tokens generated.
    pub generated_tokens_total: u64,
    /// Requests preempted.
    pub preemptions_total: u64,
    /// Model steps run.
    pub steps_total: u64,
    /// Tokens computed by model steps (prompt chunks and decodes).
    pub computed_tokens_total: u64,
    /// Seconds spent in steps that ran the model: scheduling, the forward pass,
    /// sampling and sending events.
    pub step_seconds_total: f64,
    /// Of those, seconds in the forward pass (graph build, compute, reading logits):
    /// the rest is the engine's own host work per step.
    pub forward_seconds_total: f64,
    /// Requests waiting for their cached prefix to be read from the SSD tier.
    pub loading: usize,
    /// The SSD tier's counters (all zero without one).
    pub ssd: SsdStats,
    /// The sliding-window group's pages (all zero without one).
    pub sliding: SlidingStats,
    /// Bytes of one sliding-window page (0 without one).
    pub sliding_page_bytes: usize,
    /// The recurrent-state group's slots (all zero without one).
    pub recurrent: RecurrentStats,
    /// Bytes of one recurrent state slot (every recurrent layer's states; 0 without one).
    pub state_slot_bytes: usize,
    /// Draft tokens verified by speculative decoding.
    pub draft_tokens_total: u64,
    /// Of those, tokens accepted.
    pub accepted_draft_tokens_total: u64,
    /// Images the vision encoder computed (an image found in its cache, or in the
    /// prefix cache, is not encoded again).
    pub images_encoded_total: u64,
    /// Seconds the vision encoder spent on those encodes.
    pub image_encode_seconds_total: f64,
}

/// Where a request is in the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestPhase {
    /// Waiting for admission (queued, or preempted and waiting again).
    Waiting,
    /// Admitted; its cached prefix is being read back from the SSD tier.
    Loading,
    /// Holding KV and computing (prefill or decode).
    Running,
}

/// One request's progress as of the last step ([`EngineCore::requests`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestProgress {
    /// The request's id (its stream's [`crate::RequestStream::id`]).
    pub id: RequestId,
    /// Where it is.
    pub phase: RequestPhase,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Of those, tokens whose KV came from the prefix cache (0 before admission).
    pub cached_tokens: usize,
    /// Tokens whose KV is computed or cached (prompt and output).
    pub computed_tokens: usize,
    /// Tokens generated so far.
    pub generated_tokens: usize,
    /// Times it was preempted.
    pub preemptions: u32,
}

/// Checks a request against the engine's fixed limits; shared by the core and the
/// threaded handle (which refuses bad requests before they reach the engine thread).
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub n_vocab: usize,
    pub max_context: usize,
    pub max_waiting: usize,
    /// Most tokens the whole pool can hold for one request.
    pub pool_tokens: usize,
    /// With a vision encoder: pixels per side of one image token (a
    /// preprocessed image's sides are multiples of it).
    pub image_token_side: Option<usize>,
    /// With a vision encoder: how the model takes an image's tokens.
    pub image_decoding: ImageDecoding,
}

impl Limits {
    pub fn check(&self, r: &Request, waiting: usize) -> Result<(), SubmitError> {
        if r.prompt.is_empty() {
            return Err(SubmitError::BadRequest("empty prompt".into()));
        }
        let mut ids = r.prompt.iter().chain(&r.prediction);
        if let Some(&t) = ids.find(|&&t| t as usize >= self.n_vocab) {
            return Err(SubmitError::BadRequest(format!(
                "token {t} outside the vocabulary of {}",
                self.n_vocab
            )));
        }
        if r.prediction.len() > self.max_context {
            return Err(SubmitError::BadRequest(format!(
                "predicted output of {} tokens exceeds the context limit of {} tokens",
                r.prediction.len(),
                self.max_context
            )));
        }
        self.check_images(r)?;
        let limit = self.max_context.min(self.pool_tokens);
        if r.prompt.len() >= limit {
            return Err(SubmitError::PromptTooLong {
                prompt_tokens: r.prompt.len(),
                max_context: limit,
            });
        }
        if waiting >= self.max_waiting {
            return Err(SubmitError::QueueFull { waiting });
        }
        Ok(())
    }
}

impl Limits {
    /// Images must lie in the prompt, in order, on the encoder's grid.
    fn check_images(&self, r: &Request) -> Result<(), SubmitError> {
        if r.images.is_empty() {
            return Ok(());
        }
        let Some(side) = self.image_token_side else {
            return Err(SubmitError::BadRequest(
                "this model takes no images (no vision projector is loaded)".into(),
            ));
        };
        let mut next = 0;
        for (i, img) in r.images.iter().enumerate() {
            let (w, h) = (img.pixels.width, img.pixels.height);
            if w == 0 || h == 0 || !w.is_multiple_of(side) || !h.is_multiple_of(side) {
                return Err(SubmitError::BadRequest(format!(
                    "image {i} of {w}x{h} pixels is not preprocessed for the encoder (sides must be multiples of {side})"
                )));
            }
            if img.pixels.planar.len() != 3 * w * h {
                return Err(SubmitError::BadRequest(format!(
                    "image {i}: {} values for 3 channels of {w}x{h}",
                    img.pixels.planar.len()
                )));
            }
            let end = img.at + (w / side) * (h / side);
            if img.at < next || end > r.prompt.len() {
                return Err(SubmitError::BadRequest(format!(
                    "image {i}'s tokens {}..{end} overlap another image or leave the prompt of {} tokens",
                    img.at,
                    r.prompt.len()
                )));
            }
            next = end;
        }
        Ok(())
    }
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

/// Scratch state slots of a hybrid model's speculative decoding: the recurrent
/// group's slots `first..first + k * streams`, past those [`RecurrentStates`]
/// manages. A step's `i`-th verifying request writes the state after each of its
/// rows but the last into slots `first + i * k ..`; after sampling, a request that
/// rejected drafts copies the state after its last valid row back into its own
/// slot.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SpecStates {
    first: u32,
    k: usize,
    /// Requests that may verify drafts in one step (0: no speculation).
    streams: usize,
}

impl SpecStates {
    /// The scratch slot holding the state after row `row` (0-based) of the `i`-th
    /// verifying request of a step.
    pub(super) fn slot(&self, i: usize, row: usize) -> u32 {
        debug_assert!(i < self.streams && row < self.k);
        self.first + (i * self.k + row) as u32
    }
}

impl EngineCore {
    /// Builds the engine over a loaded model: executor, KV pool, page table.
    pub fn new(
        model: Arc<Model>,
        tok: Arc<Tokenizer>,
        mut config: EngineConfig,
    ) -> Result<EngineCore, EngineError> {
        let hp = model.hparams();
        // Until measured: a verification row costs about half a one-row step of a
        // small model on a few CPU cores, a few percent of a GPU's.
        let row_share = if model.device_memory().is_some() {
            0.05
        } else {
            0.5
        };
        // A draft token costs about the drafting model's bytes over the target's
        // (decode reads every weight once), a token it catches up that share of
        // the target's prefill per token; the MTP head drafts through one layer
        // and the output head (about a fifth of a small model's step) and catches
        // up through its one layer. Measured once drafting.
        let draft_share = match (&config.draft_model, config.speculation.map(|c| c.mode)) {
            (Some(d), Some(SpecMode::Draft)) => {
                let bytes = |m: &Model| m.gguf().bytes().len().max(1) as f64;
                let share = (bytes(&d.0) / bytes(&model)).clamp(0.02, 1.0);
                (share, share)
            }
            (_, Some(SpecMode::Mtp)) => (0.2, 1.0 / hp.n_layer.max(1) as f64),
            _ => (0.0, 0.0),
        };
        let ps = config.page_tokens;
        if !(CHUNK_ALIGN..=KV_WINDOW_PAD).contains(&ps) || !KV_WINDOW_PAD.is_multiple_of(ps) {
            return Err(EngineError::Config(format!(
                "page size {ps} must be 64, 128 or 256 tokens"
            )));
        }
        if config.step_tokens == 0 || config.max_running == 0 {
            return Err(EngineError::Config(
                "step_tokens and max_running must be positive".into(),
            ));
        }
        if config.max_running > config.step_tokens {
            return Err(EngineError::Config(format!(
                "max_running ({}) above step_tokens ({}): not every running request could decode each step",
                config.max_running, config.step_tokens
            )));
        }
        let groups = model.cache_groups(config.swa_full);
        // K and V rows are F16, of each layer's width.
        let cell_bytes = |g: &CacheGroup| hp.cell_bytes(&g.layers);
        let page_bytes = ps * cell_bytes(&groups[0]);
        let sliding = groups.get(1).and_then(|g| match g.kind {
            GroupKind::Sliding { window } => Some((ps * cell_bytes(g), window)),
            GroupKind::Recurrent => None,
            GroupKind::Full => unreachable!("only group 0 is full attention"),
        });
        // A recurrent group: one state slot (F32 states of every recurrent layer)
        // per running request, taken from the budget first; checkpoint slots share
        // the rest with the pages (`split_state_budget`).
        let slot_bytes = groups
            .iter()
            .find(|g| g.kind == GroupKind::Recurrent)
            .zip(hp.ssm)
            .map(|(g, ssm)| g.layers.len() * (ssm.conv_state_len() + ssm.ssm_state_len()) * 4);
        let every = config.state_checkpoint_tokens;
        if slot_bytes.is_some() && !every.is_multiple_of(ps) {
            return Err(EngineError::Config(format!(
                "state checkpoint interval {every} is not a multiple of the page size {ps}"
            )));
        }
        let budget = config
            .kv_budget_bytes
            .unwrap_or_else(|| default_kv_budget(&model));
        // A draft model's KV holds as many tokens as the model's full-attention pages.
        let (budget, draft_tokens) = match (&config.speculation, &config.draft_model) {
            (
                Some(SpecConfig {
                    mode: SpecMode::Draft,
                    ..
                }),
                Some(d),
            ) => {
                d.check_compatible(&model).map_err(EngineError::Config)?;
                let (t, dt) = (cell_bytes(&groups[0]), Drafter::token_bytes(d));
                let share = (budget as u128 * dt as u128 / (t + dt) as u128) as usize;
                (budget - share, share / dt)
            }
            (
                Some(SpecConfig {
                    mode: SpecMode::Draft,
                    ..
                }),
                None,
            ) => {
                return Err(EngineError::Config(
                    "speculation mode `draft` needs a draft model (--draft-gguf)".into(),
                ))
            }
            (
                Some(SpecConfig {
                    mode: SpecMode::Mtp,
                    ..
                }),
                _,
            ) => {
                if !model.has_mtp() {
                    return Err(EngineError::Config(
                        "speculation mode `mtp` needs a model with an MTP head (a Qwen3.5 file with nextn layers)".into(),
                    ));
                }
                let (t, dt) = (cell_bytes(&groups[0]), model.mtp_token_bytes());
                let share = (budget as u128 * dt as u128 / (t + dt) as u128) as usize;
                (budget - share, share / dt)
            }
            _ => (budget, 0),
        };
        // Each running request of a hybrid model holds a state slot. Where the budget
        // is small (a GPU's free memory), fewer requests run at once rather than the
        // engine failing to start: live states take at most half of the budget.
        if let Some(b) = slot_bytes {
            let fit = budget / 2 / b;
            if fit == 0 {
                return Err(EngineError::Config(format!(
                    "KV budget of {budget} bytes cannot hold two recurrent states of {b} bytes (--kv-budget)"
                )));
            }
            if fit < config.max_running {
                tracing::warn!(
                    max_running = fit,
                    asked = config.max_running,
                    state_mib = b >> 20,
                    "fewer requests run at once: their recurrent states would take over half the KV budget (--kv-budget, --max-running)"
                );
                config.max_running = fit;
            }
        }
        // Speculation on a hybrid model: `k` scratch slots per request verifying
        // drafts, for as many requests as may speculate at once, within a quarter of
        // the budget.
        let spec_streams = match (slot_bytes, &config.speculation) {
            (Some(b), Some(cfg)) => {
                let want = config.max_running.min(cfg.max_batch);
                let fit = budget / 4 / (cfg.k.max(1) * b);
                if fit < want {
                    tracing::warn!(
                        streams = fit,
                        asked = want,
                        state_mib = b >> 20,
                        "fewer requests verify drafts at once: their scratch states would take over a quarter of the KV budget (--kv-budget, --speculation-k)"
                    );
                }
                fit.min(want)
            }
            _ => 0,
        };
        let spec_slots = spec_streams * config.speculation.map_or(0, |c| c.k);
        let live_bytes = slot_bytes.map_or(0, |b| (config.max_running + spec_slots) * b);
        let page_budget = budget - live_bytes;
        let (page_budget, n_checkpoints) = match slot_bytes {
            Some(b) => split_state_budget(page_budget, page_bytes, b, &config),
            None => (page_budget, 0),
        };
        let recurrent = slot_bytes.map(|b| (config.max_running + n_checkpoints, b));
        let state_bytes = recurrent.map_or(0, |(n, b)| (n + spec_slots) * b);
        let spec_states = SpecStates {
            first: recurrent.map_or(0, |(n, _)| n as u32),
            k: config.speculation.map_or(0, |c| c.k),
            streams: spec_streams,
        };
        let (n_pages, n_sliding) = split_budget(page_budget, page_bytes, sliding, &config);
        if n_pages * ps < KV_WINDOW_PAD {
            return Err(EngineError::Config(format!(
                "KV budget of {budget} bytes holds {n_pages} pages of {ps} tokens; need at least {KV_WINDOW_PAD} tokens (--kv-budget; a GPU's default is limited by its free memory)"
            )));
        }
        let max_context = config.max_context.unwrap_or(hp.n_ctx_train).max(2);
        let exec = Executor::new(model.device(), config.threads)?;
        let drafter = match &config.draft_model {
            Some(d) if draft_tokens > 0 => {
                let dr = Drafter::new(d, config.threads, draft_tokens, ps)?;
                tracing::info!(
                    tokens = draft_tokens,
                    kv_mib = (draft_tokens * Drafter::token_bytes(d)) >> 20,
                    "draft model KV reserved"
                );
                Some(dr)
            }
            _ => None,
        };
        let mtp = match config.speculation {
            Some(SpecConfig {
                mode: SpecMode::Mtp,
                ..
            }) if draft_tokens > 0 => {
                let m = MtpDrafter::new(&model, config.threads, draft_tokens, ps)?;
                tracing::info!(
                    tokens = draft_tokens,
                    kv_mib = (draft_tokens * model.mtp_token_bytes()) >> 20,
                    "MTP head KV reserved"
                );
                Some(m)
            }
            _ => None,
        };
        let cells: Vec<usize> = groups
            .iter()
            .map(|g| match g.kind {
                GroupKind::Full => n_pages * ps,
                GroupKind::Sliding { .. } => n_sliding * ps,
                GroupKind::Recurrent => recurrent.map_or(0, |(n, _)| n + spec_slots),
            })
            .collect();
        let kv = model.new_kv(&groups, &cells)?;
        let sliding_page_bytes = sliding.map_or(0, |(b, _)| b);
        tracing::info!(
            n_pages,
            n_sliding_pages = n_sliding,
            n_state_slots = recurrent.map_or(0, |(n, _)| n),
            spec_state_slots = spec_slots,
            page_tokens = ps,
            kv_mib = (n_pages * page_bytes + n_sliding * sliding_page_bytes + state_bytes) >> 20,
            max_context,
            "KV pool reserved"
        );
        let vision = match &config.vision {
            Some(v) => {
                let p = v.0.projector();
                p.check_language_model(hp.arch.name(), hp.n_embd, hp.n_deepstack)
                    .map_err(|e| EngineError::Config(e.to_string()))?;
                let w = VisionWorker::start(v, config.vision_inline).map_err(|e| {
                    EngineError::Config(format!("cannot start the vision encoder thread: {e}"))
                })?;
                Some(w)
            }
            None => None,
        };
        let limits = Limits {
            n_vocab: hp.n_vocab,
            max_context,
            max_waiting: config.max_waiting,
            pool_tokens: n_pages * ps,
            image_token_side: config.vision.as_ref().map(|v| v.0.projector().token_side()),
            image_decoding: config
                .vision
                .as_ref()
                .map(|v| v.0.projector().decoding())
                .unwrap_or_default(),
        };
        let mut pool = PagePool::new(n_pages, ps);
        let ssd = config
            .ssd
            .clone()
            .and_then(|c| tier::open_ssd(&model, &kv, ps, c));
        pool.set_eviction_log(ssd.is_some());
        let cache = match (sliding, recurrent) {
            (Some((_, window)), _) => KvCache::with_sliding(
                pool,
                SlidingPages::new(n_sliding, ps, window, config.window_checkpoint_tokens),
            ),
            (None, Some((n_slots, _))) => {
                KvCache::with_recurrent(pool, RecurrentStates::new(n_slots))
            }
            (None, None) => KvCache::new(pool),
        };
        let mut cache = cache;
        if let (Some(r), true) = (cache.recurrent_mut(), ssd.is_some()) {
            r.set_eviction_log(true);
        }
        if let (Some(s), true) = (cache.sliding_mut(), ssd.is_some()) {
            s.set_eviction_log(true);
        }
        Ok(EngineCore {
            model,
            tok,
            exec,
            compute_bytes_logged: 0,
            kv,
            cache,
            groups,
            ssd,
            loading: Vec::new(),
            window_fills: Default::default(),
            config,
            limits,
            page_bytes,
            sliding_page_bytes,
            state_slot_bytes: recurrent.map_or(0, |(_, b)| b),
            waiting: Vec::new(),
            running: Vec::new(),
            next_id: 0,
            queued: Arc::new(AtomicUsize::new(0)),
            stats: EngineStats::default(),
            token_cost_s: None,
            step_cost: StepCost::new(row_share),
            draft_cost: DraftCost::new(draft_share.0, draft_share.1),
            draft_s: 0.0,
            epoch: std::time::Instant::now(),
            mask_buffers: MaskBuffers::default(),
            drafter,
            mtp,
            step_hidden: Vec::new(),
            spec_states,
            vision,
        })
    }

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

    /// Per-request limit on prompt plus output tokens.
    pub fn max_context(&self) -> usize {
        self.limits.max_context.min(self.limits.pool_tokens)
    }

    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    pub(crate) fn queued(&self) -> Arc<AtomicUsize> {
        self.queued.clone()
    }

    /// Whether the SSD tier still has writes whose completion the engine has not
    /// taken in: an idle engine thread then calls [`Self::poll_background`] now and
    /// then instead of sleeping until the next request.
    pub fn background_pending(&self) -> bool {
        self.ssd.as_ref().is_some_and(SsdTier::has_pending_writes)
    }

    /// Takes in finished SSD writes (without waiting), so the counters of an idle
    /// engine come back to rest instead of showing the last writes pending forever.
    pub fn poll_background(&mut self) {
        if let Some(ssd) = self.ssd.as_mut() {
            ssd.poll_writes();
        }
    }

    /// Whether any request is waiting, loading or running.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty() || !self.loading.is_empty()
    }

    /// Current counters.
    pub fn stats(&self) -> EngineStats {
        let c = self.cache.stats();
        let p = c.full;
        EngineStats {
            waiting: self.waiting.len(),
            running: self.running.len(),
            kv_pages_total: p.n_pages,
            kv_pages_used: p.in_use,
            kv_pages_cached: p.cached,
            kv_pages_free: p.free,
            page_tokens: self.cache.page_size(),
            page_bytes: self.page_bytes,
            sliding: c.sliding.unwrap_or_default(),
            sliding_page_bytes: self.sliding_page_bytes,
            recurrent: c.recurrent.unwrap_or_default(),
            state_slot_bytes: self.state_slot_bytes,
            prefix_query_tokens: p.query_tokens,
            prefix_hit_tokens: p.hit_tokens + self.stats.prefix_copied_tokens,
            evicted_pages: p.evicted_pages,
            loading: self.loading.len(),
            images_encoded_total: self.vision.as_ref().map_or(0, |v| v.encoder().encodes()),
            image_encode_seconds_total: self
                .vision
                .as_ref()
                .map_or(0.0, |v| v.encoder().encode_seconds()),
            ssd: self.ssd.as_ref().map(SsdTier::stats).unwrap_or_default(),
            ..self.stats
        }
    }

    /// Every request the engine holds (waiting, loading, running) and its progress.
    pub fn requests(&self) -> Vec<RequestProgress> {
        let info = |s: &Live, phase| RequestProgress {
            id: s.id,
            phase,
            prompt_tokens: s.n_prompt,
            cached_tokens: s.usage.cached_tokens,
            computed_tokens: s.n_computed,
            generated_tokens: s.tokens.len() - s.n_prompt,
            preemptions: s.usage.preemptions,
        };
        let mut out =
            Vec::with_capacity(self.waiting.len() + self.loading.len() + self.running.len());
        out.extend(self.running.iter().map(|s| info(s, RequestPhase::Running)));
        out.extend(
            self.loading
                .iter()
                .map(|l| info(&l.live, RequestPhase::Loading)),
        );
        out.extend(self.waiting.iter().map(|s| info(s, RequestPhase::Waiting)));
        out
    }

    /// Checks the KV cache's invariants (tests and debugging).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.cache.check_invariants()?;
        for s in &self.running {
            let n = self
                .cache
                .n_tokens(s.id)
                .ok_or("running request without pages")?;
            if n < s.n_computed {
                return Err(format!(
                    "request {}: {n} cells for {} tokens",
                    s.id, s.n_computed
                ));
            }
        }
        if self.waiting.iter().any(|s| self.cache.contains(s.id)) {
            return Err("a waiting request holds pages".into());
        }
        Ok(())
    }

    /// Queues a request; its events arrive on the returned stream as steps run.
    pub fn submit(&mut self, r: Request) -> Result<RequestStream, SubmitError> {
        self.limits.check(&r, self.waiting.len())?;
        self.queued.fetch_add(1, Ordering::Relaxed);
        Ok(self.enqueue(r))
    }

    /// Queues an already checked request under a new id.
    fn enqueue(&mut self, r: Request) -> RequestStream {
        self.next_id += 1;
        let (ticket, stream) = RequestStream::open(self.next_id);
        self.enqueue_ticket(r, ticket);
        stream
    }

    /// Queues an already checked request whose stream the caller already holds.
    pub(crate) fn enqueue_ticket(&mut self, r: Request, ticket: Ticket) {
        let Ticket { id, tx, cancel } = ticket;
        let n_prompt = r.prompt.len();
        let room = self.max_context() - n_prompt;
        let mut sampler = Sampler::new(r.sampling);
        r.prompt.iter().for_each(|&t| sampler.accept(t));
        let side = self.limits.image_token_side.unwrap_or(1);
        let images = Images::new(r.images, side, self.limits.image_decoding);
        let mut prompt = r.prompt;
        images.key_prompt(&mut prompt);
        let live = Live {
            id,
            rank: Rank {
                arrival: id,
                priority: r.priority,
                arrived_us: self.epoch.elapsed().as_micros() as u64,
            },
            tokens: prompt,
            n_computed: 0,
            n_prompt,
            max_tokens: r.max_tokens.min(room),
            stop_eog: r.stop.eog,
            stop_ids: r.stop.token_ids,
            logprobs: r.logprobs,
            top_logprobs: r.top_logprobs,
            banned: r.banned_tokens,
            deterministic: r.deterministic,
            constraint: r.constraint,
            mask: None,
            sampler,
            text: TextStream::new(self.tok.clone(), &r.stop.strings),
            tx,
            cancel,
            usage: Usage {
                prompt_tokens: n_prompt,
                ..Usage::default()
            },
            admitted_before: false,
            exact_cells: 0,
            state_targets: Vec::new(),
            tail_target: None,
            answer_checkpoint: None,
            spec: self
                .config
                .speculation
                .filter(|_| {
                    // Drafters read the tokens, which are cache keys at image cells.
                    r.speculation
                        && images.is_empty()
                        && (self.recurrent_group().is_none() || self.spec_states.streams > 0)
                })
                .map(|c| Depth::new(c.k.clamp(1, MAX_DRAFT))),
            draft: Vec::new(),
            prediction: r.prediction,
            images,
        };
        if r.max_tokens == 0 {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            let reason = if room == 0 {
                FinishReason::ContextFull
            } else {
                FinishReason::Length
            };
            let _ = live.tx.send(Event::Finished(Finish {
                reason,
                usage: live.usage,
            }));
        } else {
            self.waiting.push(live);
        }
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

    /// On the CPU, an engine gone idle frees the step buffers its largest steps grew
    /// ([`Executor::release_buffers`]) when they hold more than
    /// [`IDLE_KEEP_STEP_BYTES`]: a long prompt's masks at depth would otherwise stay
    /// resident beside the KV cache until the process ends (Gemma 3 after a 30K-token
    /// prompt: ~31 MB of input arena). The next step allocates again (a few ms on the
    /// CPU); on a GPU the buffers stay, where allocating them again costs more and
    /// they are device memory.
    fn release_step_buffers(&mut self) {
        if self.exec.held_bytes() <= IDLE_KEEP_STEP_BYTES || self.model.device_memory().is_some() {
            return;
        }
        if let Err(e) = self.exec.release_buffers() {
            tracing::warn!(error = %e, "releasing idle step buffers failed");
        }
        self.discard_free_kv();
    }

    /// Returns the host memory of free KV pages to the OS (they read as zeros again,
    /// as unwritten cells do). Host KV memory is committed page by page as tokens
    /// are first written, but a page freed stays committed: after a long prompt
    /// whose sliding-window pages were recycled, or cached pages evicted, an idle
    /// engine would keep memory nothing holds (Gemma 3 after an 8K- then a 30K-token
    /// prompt: 6.7 MB less resident when idle). Not while evicted pages wait to be copied to
    /// the SSD tier (their cells still hold their KV).
    fn discard_free_kv(&mut self) {
        let ps = self.cache.page_size();
        if self.cache.full().has_pending_evictions()
            || self
                .cache
                .sliding()
                .is_some_and(|s| s.has_pending_evictions())
        {
            return;
        }
        let mut per_group = vec![(0, self.cache.full().free_pages())];
        if let Some(s) = self.cache.sliding() {
            let g = self
                .kv
                .groups()
                .iter()
                .position(|g| matches!(g.kind, GroupKind::Sliding { .. }));
            per_group.extend(g.map(|g| (g, s.free_pages())));
        }
        for (g, free) in per_group {
            // Runs of consecutive free pages, one discard each.
            let mut i = 0;
            while i < free.len() {
                let mut j = i + 1;
                while j < free.len() && free[j] == free[j - 1] + 1 {
                    j += 1;
                }
                self.kv
                    .discard_cells(g, free[i] as usize * ps, (j - i) * ps);
                i = j;
            }
        }
    }

    /// Recent compute cost per prompt token in microseconds (1 ms until measured),
    /// for [`Policy::Shortest`].
    fn cost_us(&self) -> f64 {
        self.token_cost_s.map_or(1e3, |c| c * 1e6)
    }

    fn running_index(&self, id: RequestId) -> Option<usize> {
        self.running.iter().position(|s| s.id == id)
    }

    /// Ends cancelled requests, waiting, loading or running.
    fn reap_cancelled(&mut self) {
        self.ssd_reap_cancelled();
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].cancelled() {
                let s = self.waiting.remove(i);
                if !s.admitted_before {
                    self.queued.fetch_sub(1, Ordering::Relaxed);
                }
                self.end(s, FinishReason::Cancelled);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].cancelled() {
                let s = self.running.remove(i);
                self.end(s, FinishReason::Cancelled);
            } else {
                i += 1;
            }
        }
    }

    /// Sends the final event and releases the request's pages (its committed full
    /// pages stay in the prefix cache, and so does the page where its prompt's exact
    /// cells end, as a copy source for the next turn: see [`crate::partial_page`]).
    /// Text still held back is dropped: the request ends without a token of its own
    /// (cancelled, failed or out of memory).
    fn end(&mut self, s: Live, reason: FinishReason) {
        if let Some(d) = self.drafter.as_mut() {
            d.free(s.id);
        }
        if let Some(m) = self.mtp.as_mut() {
            m.free(s.id);
        }
        if self.cache.contains(s.id) {
            let ps = self.cache.page_size();
            // The exact cells are in this admission's pages once its prompt is computed
            // (a resumed request recomputes them); a failed step's KV is not trusted.
            let written = s.n_computed >= s.n_prompt && !matches!(reason, FinishReason::Error(_));
            let held = self.cache.page_table(s.id).map_or(0, <[_]>::len);
            let tail =
                partial_page::exact_tail(s.exact_cells, ps).filter(|&(j, _)| written && j < held);
            match tail {
                Some((j, exact)) => {
                    let tokens = &s.tokens[j * ps..j * ps + exact];
                    // A page the answer filled is already cached as a whole page.
                    self.cache
                        .free_keeping_tail(s.id, j, tokens)
                        .expect("allocated");
                }
                None => self.cache.free(s.id).expect("allocated"),
            }
        }
        let _ = s.tx.send(Event::Finished(Finish {
            reason,
            usage: s.usage,
        }));
    }

    /// Prompt tokens this step may compute: `step_tokens` (`solo_step_tokens` while
    /// one request runs and the others wait only for its prefix:
    /// `only_prefix_waiters`, from [`Self::admit`]), or while some request is
    /// decoding, what fits the ITL target at the recent cost per token (see
    /// [`itl_budget`]).
    fn prompt_budget(&self, progress: &[Progress], only_prefix_waiters: bool) -> usize {
        let solo = self.running.len() == 1 && only_prefix_waiters && self.loading.is_empty();
        let full = if solo {
            self.config.solo_step_tokens.max(self.config.step_tokens)
        } else {
            self.config.step_tokens
        };
        let decoding = progress.iter().filter(|p| p.decoding()).count();
        let prompting = progress.iter().filter(|p| p.prompt_left() > 0).count();
        match (self.config.itl_target, self.token_cost_s) {
            (Some(target), Some(cost)) => {
                itl_budget(full, target.as_secs_f64() / cost, decoding, prompting)
            }
            _ => full,
        }
    }

    /// Plans the step ([`scheduler::plan`]) and carries out its preemptions: preempted
    /// requests go back to waiting, those that can never fit end. Returns the work,
    /// in batch order.
    fn schedule(&mut self, only_prefix_waiters: bool) -> Vec<scheduler::Work> {
        let progress: Vec<Progress> = self.running.iter().map(Live::progress).collect();
        let budget = self.prompt_budget(&progress, only_prefix_waiters);
        let plan = scheduler::plan(
            &progress,
            self.config.policy,
            self.cost_us(),
            budget,
            !self.loading.is_empty(),
            &mut self.cache,
        );
        for id in plan.preempted {
            let i = self.running_index(id).expect("planned requests run");
            let mut s = self.running.remove(i);
            s.n_computed = 0;
            s.usage.preemptions += 1;
            self.stats.preemptions_total += 1;
            tracing::debug!(id = s.id, "preempted");
            self.waiting.push(s);
        }
        for id in plan.out_of_memory {
            let i = self.running_index(id).expect("planned requests run");
            let s = self.running.remove(i);
            self.end(s, FinishReason::ContextFull);
        }
        plan.work
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
