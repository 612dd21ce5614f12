//! The engine core: requests, the paged KV cache and the step loop, driven by one
//! thread (see [`crate::Engine`] for the threaded wrapper).
//!
//! Every [`EngineCore::step`] runs one model forward over a batch assembled from all
//! running requests (continuous batching): decodes first, then prompt chunks, up to
//! a token budget, so a long prompt is prefilled in chunks while other streams keep
//! decoding. KV memory is a pool of pages taken as tokens arrive ([`PagePool`]);
//! full pages are shared through the global prefix cache. When pages run out,
//! cached pages are evicted first, then the lowest-ranked running request is
//! preempted (its KV is dropped and recomputed when it is admitted again).
//!
//! With an SSD tier ([`EngineConfig::ssd`], [`crate::ssd`]), cached pages evicted
//! from RAM are written to disk, so a preempted request's full pages and every
//! evicted prefix stay reachable; a prefix that continues on disk is read back into
//! fresh RAM pages before the request's prefill is scheduled (the hooks are in the
//! last `impl EngineCore` block of this file).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tempo9_models::{
    CellRun, Executor, KvStore, MaskBuilder, Model, ModelError, SeqSpan, StepBatch, StepOutput,
};
use tempo9_tokenizer::Tokenizer;
use tokio::sync::mpsc;

use crate::pages::{PagePool, PrefixMatch, ROOT_HASH};
use crate::partial_page::{self, Source, Want, COPY_CANDIDATES, ROW_GROUP};
use crate::request::{
    Event, Finish, FinishReason, Request, RequestId, TokenConstraint, TokenEvent, TokenMask, Usage,
};
use crate::sampler::{log_softmax_top, Sampler};
use crate::scheduler::{Policy, Rank};
use crate::ssd::{LoadId, SsdConfig, SsdStats, SsdTier};
use crate::stop::TextStream;

/// Granularity of a sequence's attention window (cells). llama.cpp pads the same
/// way, and ggml's CPU flash attention picks its kernel (and so its rounding) by
/// window length, so equal padding gives llama.cpp's numbers, and a sequence's
/// numbers do not depend on how its pages are laid out.
pub const KV_WINDOW_PAD: usize = 256;

/// Prompt chunks start at multiples of this many tokens (ggml's CPU flash-attention
/// query tile and a multiple of the repacked matmuls' 16-row blocks), so a prompt
/// token's arithmetic is the same however the prompt is cut into steps: alone,
/// batched, after a prefix hit or after preemption.
pub const CHUNK_ALIGN: usize = 64;

/// Prompt tokens to compute next, out of `remaining`, within `limit`: all of them if
/// they fit; else a multiple of [`CHUNK_ALIGN`] that leaves at least `CHUNK_ALIGN`
/// for later (a shorter last chunk would run through another attention kernel).
/// 0 when `limit` allows no such piece.
fn prompt_piece(remaining: usize, limit: usize) -> usize {
    if remaining <= limit {
        return remaining;
    }
    let mut n = limit / CHUNK_ALIGN * CHUNK_ALIGN;
    if remaining - n < CHUNK_ALIGN {
        n = n.saturating_sub(CHUNK_ALIGN);
    }
    n
}

/// The prompt budget of a step under an ITL target: `fit` tokens (what the target
/// allows at the recent cost per token) per decoding request's share, scaled by
/// prompting / decoding requests when prompts outnumber decodes, as a multiple of
/// [`CHUNK_ALIGN`] within `1..=full` chunks; `full` when nothing decodes.
fn itl_budget(full: usize, fit: f64, decoding: usize, prompting: usize) -> usize {
    if decoding == 0 || fit.is_nan() || fit <= 0.0 {
        return full;
    }
    let share = prompting.max(decoding) as f64 / decoding as f64;
    let n = (share * fit).min(full as f64) as usize;
    (n / CHUNK_ALIGN * CHUNK_ALIGN).clamp(CHUNK_ALIGN.min(full), full)
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// CPU threads for compute.
    pub threads: usize,
    /// Bytes of KV memory for all requests together; `None` = a quarter of the
    /// system's memory. On the CPU, host memory is committed only as pages are first
    /// written, so the budget is a ceiling, not a start-up cost.
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
        }
    }
}

/// Physical cores are what matter for ggml's CPU kernels; use what the OS offers.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get())
}

/// A quarter of the machine's memory (4 GiB when it cannot be read).
fn default_kv_budget() -> usize {
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
    /// Bytes of one page (all layers, K and V).
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
}

/// The stream of events of one submitted request. Dropping it cancels the request.
pub struct RequestStream {
    id: RequestId,
    rx: mpsc::UnboundedReceiver<Event>,
    cancel: Arc<AtomicBool>,
    wake: Option<Arc<dyn Fn() + Send + Sync>>,
}

/// The engine's end of a request's stream: where its events go and the flag its
/// cancellation sets.
pub(crate) struct Ticket {
    id: RequestId,
    tx: mpsc::UnboundedSender<Event>,
    cancel: Arc<AtomicBool>,
}

impl RequestStream {
    /// A new stream for request `id` and the engine's end of it. Made by the
    /// submitter, so submitting never waits for the engine thread.
    pub(crate) fn open(id: RequestId) -> (Ticket, RequestStream) {
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let stream = RequestStream {
            id,
            rx,
            cancel: cancel.clone(),
            wake: None,
        };
        (Ticket { id, tx, cancel }, stream)
    }

    /// The request's id.
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The next event; `None` after [`Event::Finished`], or if the engine stopped
    /// without finishing the request.
    pub async fn recv(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// The next event, blocking the thread (not for async contexts).
    pub fn blocking_recv(&mut self) -> Option<Event> {
        self.rx.blocking_recv()
    }

    /// The next event if one is ready.
    pub fn try_recv(&mut self) -> Option<Event> {
        self.rx.try_recv().ok()
    }

    /// Asks the engine to stop the request; it ends with
    /// [`FinishReason::Cancelled`] and frees its pages at the next step.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
        if let Some(w) = &self.wake {
            w();
        }
    }

    pub(crate) fn set_wake(&mut self, wake: Arc<dyn Fn() + Send + Sync>) {
        self.wake = Some(wake);
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        self.cancel();
    }
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
}

impl Limits {
    pub fn check(&self, r: &Request, waiting: usize) -> Result<(), SubmitError> {
        if r.prompt.is_empty() {
            return Err(SubmitError::BadRequest("empty prompt".into()));
        }
        if let Some(&t) = r.prompt.iter().find(|&&t| t as usize >= self.n_vocab) {
            return Err(SubmitError::BadRequest(format!(
                "token {t} outside the vocabulary of {}",
                self.n_vocab
            )));
        }
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

/// `s`'s policy sort key, its prompt work left costed at `cost_us` per token.
fn sort_key(policy: Policy, s: &Live, cost_us: f64) -> (i64, u64) {
    let left = s.n_prompt.saturating_sub(s.n_computed);
    policy.key(s.rank, (left as f64 * cost_us) as u64)
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
}

/// One running request's share of a step: tokens `start..end` to compute.
#[derive(Debug, Clone)]
struct Work {
    id: RequestId,
    start: usize,
    end: usize,
    cells: Vec<usize>,
}

/// The engine's state and step loop (single-threaded; see the module docs).
pub struct EngineCore {
    model: Arc<Model>,
    tok: Arc<Tokenizer>,
    exec: Executor,
    kv: Arc<KvStore>,
    pool: PagePool,
    config: EngineConfig,
    limits: Limits,
    page_bytes: usize,
    waiting: Vec<Live>,
    running: Vec<Live>,
    ssd: Option<SsdTier>,
    loading: Vec<Loading>,
    next_id: RequestId,
    /// Requests submitted but not yet admitted (shared with the threaded handle).
    queued: Arc<AtomicUsize>,
    stats: EngineStats,
    /// Seconds per computed token in recent steps of at least [`CHUNK_ALIGN`] tokens
    /// (moving average), for [`EngineConfig::itl_target`].
    token_cost_s: Option<f64>,
    /// Compute-buffer size last logged (the buffers only grow; logged again when a
    /// quarter larger, so small steps of growth do not flood the log).
    compute_bytes_logged: usize,
    /// When the engine started: the origin of [`Rank::arrived_us`].
    epoch: std::time::Instant,
    /// Memory of earlier steps' masks, for the next steps' (see [`MaskBuffers`]).
    mask_buffers: MaskBuffers,
}

/// Attention-mask memory handed from step to step while requests run: a prompt
/// chunk's mask at depth is megabytes (512 rows at 10K cells: 10 MB); built in
/// fresh memory every step (page faults) it took 5 ms of a step on the H200's host,
/// in reused memory 2 ms. Dropped when the engine goes idle, so a long prompt's
/// masks are not kept after it.
#[derive(Default)]
struct MaskBuffers(Vec<Vec<u16>>);

impl MaskBuffers {
    /// Buffers kept at most (a step with many decode rows hands back one each).
    const KEEP: usize = 64;

    /// The smallest kept buffer that holds `len` cells, else the largest (it grows).
    fn take(&mut self, len: usize) -> Vec<u16> {
        let fits = (0..self.0.len())
            .filter(|&i| self.0[i].capacity() >= len)
            .min_by_key(|&i| self.0[i].capacity());
        let pick = fits.or_else(|| (0..self.0.len()).max_by_key(|&i| self.0[i].capacity()));
        pick.map_or_else(Vec::new, |i| self.0.swap_remove(i))
    }

    /// Keeps the masks of a step that has run.
    fn give_back(&mut self, batch: StepBatch) {
        for s in batch.seqs {
            for m in std::iter::once(s.mask).chain(s.mask_swa) {
                if self.0.len() < Self::KEEP {
                    self.0.push(m);
                }
            }
        }
    }
}

impl EngineCore {
    /// Builds the engine over a loaded model: executor, KV pool, page table.
    pub fn new(
        model: Arc<Model>,
        tok: Arc<Tokenizer>,
        config: EngineConfig,
    ) -> Result<EngineCore, EngineError> {
        let hp = model.hparams();
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
        // K and V rows are F16.
        let page_bytes = ps * hp.n_layer * (hp.n_embd_k() + hp.n_embd_v()) * 2;
        let budget = config.kv_budget_bytes.unwrap_or_else(default_kv_budget);
        let n_pages = budget / page_bytes;
        if n_pages * ps < KV_WINDOW_PAD {
            return Err(EngineError::Config(format!(
                "KV budget of {budget} bytes holds {n_pages} pages of {ps} tokens; need at least {KV_WINDOW_PAD} tokens"
            )));
        }
        let max_context = config.max_context.unwrap_or(hp.n_ctx_train).max(2);
        let exec = Executor::new(model.device(), config.threads)?;
        let kv = model.new_kv(n_pages * ps)?;
        tracing::info!(
            n_pages,
            page_tokens = ps,
            kv_mib = (n_pages * page_bytes) >> 20,
            max_context,
            "KV pool reserved"
        );
        let limits = Limits {
            n_vocab: hp.n_vocab,
            max_context,
            max_waiting: config.max_waiting,
            pool_tokens: n_pages * ps,
        };
        let mut pool = PagePool::new(n_pages, ps);
        let ssd = config
            .ssd
            .clone()
            .and_then(|c| open_ssd(&model, &kv, ps, c));
        pool.set_eviction_log(ssd.is_some());
        Ok(EngineCore {
            model,
            tok,
            exec,
            compute_bytes_logged: 0,
            kv,
            pool,
            ssd,
            loading: Vec::new(),
            config,
            limits,
            page_bytes,
            waiting: Vec::new(),
            running: Vec::new(),
            next_id: 0,
            queued: Arc::new(AtomicUsize::new(0)),
            stats: EngineStats::default(),
            token_cost_s: None,
            epoch: std::time::Instant::now(),
            mask_buffers: MaskBuffers::default(),
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

    /// Whether any request is waiting, loading or running.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty() || !self.loading.is_empty()
    }

    /// Current counters.
    pub fn stats(&self) -> EngineStats {
        let p = self.pool.stats();
        EngineStats {
            waiting: self.waiting.len(),
            running: self.running.len(),
            kv_pages_total: p.n_pages,
            kv_pages_used: p.in_use,
            kv_pages_cached: p.cached,
            kv_pages_free: p.free,
            page_tokens: self.pool.page_size(),
            page_bytes: self.page_bytes,
            prefix_query_tokens: p.query_tokens,
            prefix_hit_tokens: p.hit_tokens + self.stats.prefix_copied_tokens,
            evicted_pages: p.evicted_pages,
            loading: self.loading.len(),
            ssd: self.ssd.as_ref().map(SsdTier::stats).unwrap_or_default(),
            ..self.stats
        }
    }

    /// Checks the page pool's invariants (tests and debugging).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check_invariants()?;
        for s in &self.running {
            let n = self
                .pool
                .n_tokens(s.id)
                .ok_or("running request without pages")?;
            if n < s.n_computed {
                return Err(format!(
                    "request {}: {n} cells for {} tokens",
                    s.id, s.n_computed
                ));
            }
        }
        if self.waiting.iter().any(|s| self.pool.contains(s.id)) {
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
        let live = Live {
            id,
            rank: Rank {
                arrival: id,
                priority: r.priority,
                arrived_us: self.epoch.elapsed().as_micros() as u64,
            },
            tokens: r.prompt,
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
        let work = self.schedule(only_prefix_waiters);
        self.ssd_save_evicted();
        if work.is_empty() {
            if !self.loading.is_empty() {
                // Nothing to compute until a prefix is read back: wait for one.
                self.ssd_finish_loads(true);
            }
            return Ok(true);
        }
        let planned = started.elapsed();
        let batch = self.assemble(&work);
        let t0 = std::time::Instant::now();
        let mut out = match self.forward(&work, &batch) {
            Ok(l) => l,
            Err(e) => {
                let msg = e.to_string();
                tracing::error!(error = %msg, "model step failed");
                for w in &work {
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
        self.after_step(&work, &mut out);
        let step_s = started.elapsed().as_secs_f64();
        self.stats.step_seconds_total += step_s;
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
            step_ms = step_s * 1e3,
            "step"
        );
        if self.has_work() {
            self.mask_buffers.give_back(batch);
        } else {
            self.mask_buffers = MaskBuffers::default();
        }
        Ok(true)
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
        if self.pool.contains(s.id) {
            let ps = self.pool.page_size();
            // The exact cells are in this admission's pages once its prompt is computed
            // (a resumed request recomputes them); a failed step's KV is not trusted.
            let written = s.n_computed >= s.n_prompt && !matches!(reason, FinishReason::Error(_));
            let held = self.pool.page_table(s.id).map_or(0, <[_]>::len);
            let tail =
                partial_page::exact_tail(s.exact_cells, ps).filter(|&(j, _)| written && j < held);
            match tail {
                Some((j, exact)) => {
                    let tokens = &s.tokens[j * ps..j * ps + exact];
                    // A page the answer filled is already cached as a whole page.
                    self.pool
                        .free_keeping_tail(s.id, j, tokens)
                        .expect("allocated");
                }
                None => self.pool.free(s.id).expect("allocated"),
            }
        }
        let _ = s.tx.send(Event::Finished(Finish {
            reason,
            usage: s.usage,
        }));
    }

    /// Tokens that can be appended to `id` now: room in its last page plus every
    /// free or evictable page.
    fn room(&self, id: RequestId) -> usize {
        let ps = self.pool.page_size();
        let held = self.pool.n_tokens(id).unwrap_or(0);
        let pages = self.pool.page_table(id).map_or(0, <[_]>::len);
        pages * ps - held + self.pool.n_available() * ps
    }

    /// The next piece of work of running request `i`: while its prompt is not all
    /// computed, as much of it as `budget` allows (see [`prompt_piece`]); after that
    /// one token. Tokens generated before a preemption are recomputed one per step,
    /// as they were first computed, so a resumed request continues exactly.
    fn next_piece(&self, i: usize, budget: usize) -> usize {
        let s = &self.running[i];
        if s.n_computed < s.n_prompt {
            let remaining = s.n_prompt - s.n_computed;
            match prompt_piece(remaining, budget) {
                // A budget of one aligned chunk cannot split 65..127 remaining tokens
                // (the last chunk must not be shorter): take them all, exceeding it
                // by less than a chunk, rather than never finishing.
                0 if budget >= CHUNK_ALIGN && remaining < 2 * CHUNK_ALIGN => remaining,
                n => n,
            }
        } else {
            1
        }
    }

    /// Prompt tokens this step may compute: `step_tokens` (`solo_step_tokens` while
    /// one request runs and the others wait only for its prefix:
    /// `only_prefix_waiters`, from [`Self::admit`]), or while some request
    /// is decoding, what fits the ITL target at the recent cost per token (a multiple
    /// of [`CHUNK_ALIGN`], at least one). The target is per decoding request: when more
    /// requests wait for their prompts than are decoding (many arriving at once), it
    /// grows in proportion, since holding the prompts back would then cost more
    /// requests more time than it saves the decoders.
    fn prompt_budget(&self, only_prefix_waiters: bool) -> usize {
        let solo = self.running.len() == 1 && only_prefix_waiters && self.loading.is_empty();
        let full = if solo {
            self.config.solo_step_tokens.max(self.config.step_tokens)
        } else {
            self.config.step_tokens
        };
        let decoding = self
            .running
            .iter()
            .filter(|s| s.n_computed >= s.n_prompt && s.n_computed < s.tokens.len())
            .count();
        let prompting = self
            .running
            .iter()
            .filter(|s| s.n_computed < s.n_prompt)
            .count();
        match (self.config.itl_target, self.token_cost_s) {
            (Some(target), Some(cost)) => {
                itl_budget(full, target.as_secs_f64() / cost, decoding, prompting)
            }
            _ => full,
        }
    }

    /// Plans the step: which tokens of which running requests to compute, taking KV
    /// cells for them; preempts requests as memory requires. Requests at the
    /// decoding stage go first, then prompt chunks, each in policy order; the
    /// returned work is in that (batch) order.
    fn schedule(&mut self, only_prefix_waiters: bool) -> Vec<Work> {
        let policy = self.config.policy;
        let mut budget = self.prompt_budget(only_prefix_waiters);
        let mut order: Vec<usize> = (0..self.running.len()).collect();
        let cost = self.cost_us();
        order.sort_by_key(|&i| sort_key(policy, &self.running[i], cost));
        let mut planned = vec![false; self.running.len()];
        let mut preempted = vec![false; self.running.len()];
        let mut out_of_memory = vec![false; self.running.len()];
        let mut work: Vec<Work> = Vec::new();
        for decode_pass in [true, false] {
            for (k, &i) in order.iter().enumerate() {
                loop {
                    if preempted[i] || out_of_memory[i] {
                        break;
                    }
                    let s = &self.running[i];
                    let decoding = s.n_computed >= s.n_prompt;
                    if decoding != decode_pass || s.n_computed == s.tokens.len() {
                        break;
                    }
                    let (id, start) = (s.id, s.n_computed);
                    let mut n = self.next_piece(i, budget);
                    if n == 0 {
                        break;
                    }
                    // Make room by preempting the lowest-ranked request not planned yet.
                    while self.room(id) < n {
                        let victim = order[k + 1..]
                            .iter()
                            .rev()
                            .find(|&&j| !planned[j] && !preempted[j] && !out_of_memory[j]);
                        match victim {
                            Some(&j) => {
                                preempted[j] = true;
                                let v = self.running[j].id;
                                self.pool.free(v).expect("running requests hold pages");
                            }
                            None => break,
                        }
                    }
                    // A prompt chunk may shrink to what fits.
                    if !decode_pass && self.room(id) < n {
                        let s = &self.running[i];
                        let fit = prompt_piece(s.n_prompt - s.n_computed, self.room(id));
                        if fit > 0 {
                            n = fit;
                        }
                    }
                    if self.room(id) < n {
                        if !planned[i] {
                            // Higher-ranked requests hold the memory: wait for them.
                            // Nothing is ranked higher (and no request holds pages
                            // for a load from the SSD tier): it can never fit.
                            let alone = order[..k].iter().all(|&j| preempted[j]);
                            if alone && work.is_empty() && self.loading.is_empty() {
                                out_of_memory[i] = true;
                            } else {
                                preempted[i] = true;
                            }
                            self.pool.free(id).expect("running requests hold pages");
                        }
                        break;
                    }
                    let cells = self.pool.append_slots(id, n).expect("room was checked");
                    work.push(Work {
                        id,
                        start,
                        end: start + n,
                        cells,
                    });
                    self.running[i].n_computed += n;
                    planned[i] = true;
                    if decode_pass {
                        // Decodes do not use the prompt budget: every running request
                        // gets its token each step.
                        break;
                    }
                    budget = budget.saturating_sub(n);
                }
            }
        }
        // `n_computed` ran ahead to plan several chunks; it is set for real once the
        // step has run.
        for w in &work {
            let i = self.running_index(w.id).expect("planned requests run");
            self.running[i].n_computed = self.running[i].n_computed.min(w.start);
        }
        // Requeue preempted requests; end those that cannot fit at all.
        for i in (0..self.running.len()).rev() {
            if preempted[i] {
                let mut s = self.running.remove(i);
                s.n_computed = 0;
                s.usage.preemptions += 1;
                self.stats.preemptions_total += 1;
                tracing::debug!(id = s.id, "preempted");
                self.waiting.push(s);
            } else if out_of_memory[i] {
                let s = self.running.remove(i);
                self.end(s, FinishReason::ContextFull);
            }
        }
        work
    }

    /// How many leading tokens of `w` a prefix-cache lookup may cover. A hit ends on
    /// a page boundary (a multiple of [`CHUNK_ALIGN`], where the prompt's chunks
    /// start, so the matmuls' row blocks line up) and leaves at least
    /// [`ROW_GROUP`] prompt tokens to compute (or none of the prompt: a resumed
    /// request whose whole prompt and some output are cached): matmuls over fewer
    /// rows (2-7) were seen to round differently. The rest runs through the same
    /// flash-attention kernel as from scratch (padded to a tile:
    /// `SeqSpan::tiled_prompt`). (Beyond the hit, part of the next page may be
    /// copied: [`Self::copy_partial_page`].)
    fn usable_prefix(&self, w: &Live) -> usize {
        let m = self.pool.lookup_prefix(&w.tokens, 0);
        let on_disk = self.ssd_continuation(&w.tokens, &m).len();
        let full = m.n_cached_tokens + on_disk * self.pool.page_size();
        if full >= w.n_prompt {
            w.tokens.len()
        } else {
            // `lookup_prefix` covers at most (usable - 1) / page_size pages.
            w.n_prompt.saturating_sub(ROW_GROUP - 1).max(1)
        }
    }

    /// Tells the pool which cells of admitted `s`, from cell `from` on, other prompts
    /// may copy (see [`crate::partial_page`]): its prompt's exact cells, computed in
    /// pieces that start at multiples of [`ROW_GROUP`]. A resumed request's pages are
    /// not marked.
    fn mark_copy_sources(&mut self, s: &Live, from: usize) {
        if s.usage.preemptions == 0 {
            let kind = partial_page::tiled(s.n_prompt) as u8;
            let cells = from..partial_page::exact_cells(s.n_prompt).max(from);
            self.pool
                .set_copy_exactness(s.id, cells, kind)
                .expect("admitted requests hold pages");
        }
    }

    /// Extends a newly admitted prompt's cached prefix `m` inside the next page: copies
    /// the KV of the longest run of 16-token blocks it shares with another prompt's
    /// page of exact cells under the same cached page (see [`crate::partial_page`]).
    /// Leaves a token to compute, and a whole block for a prompt of a chunk or more
    /// (see [`Self::usable_prefix`]).
    fn copy_partial_page(&mut self, s: &mut Live, m: &PrefixMatch) {
        let ps = self.pool.page_size();
        let start = m.n_cached_tokens;
        let tiled = partial_page::tiled(s.n_prompt);
        let keep = if tiled { ROW_GROUP } else { 1 };
        let limit = s.n_prompt.saturating_sub(start + keep).min(ps);
        if limit < ROW_GROUP || s.tokens.len() != s.n_prompt || s.n_computed != start {
            return;
        }
        let pool = &self.pool;
        // A preempted and resumed request keeps its `exact_cells`, but its pages hold
        // those cells again only once its prompt is recomputed (or re-hit).
        let running = self
            .running
            .iter()
            .filter(|r| r.n_computed >= r.n_prompt)
            .filter_map(|r| {
                let (j, exact) = partial_page::exact_tail(r.exact_cells, ps)?;
                let table = pool.page_table(r.id).expect("running requests hold pages");
                Some(Source {
                    page: table[j],
                    parent: j.checked_sub(1).map(|i| table[i]),
                    tiled: partial_page::tiled(r.n_prompt),
                    tokens: &r.tokens[j * ps..j * ps + exact],
                })
            });
        let parent = m.pages.last().copied();
        let want = Want {
            parent,
            tiled,
            rest: &s.tokens[start..],
            limit,
        };
        // Registered pages under the same parent: whole pages of earlier prompts that
        // part from this one inside the page, and finished prompts' kept tails.
        let cached = pool
            .copy_candidates(parent, COPY_CANDIDATES)
            .map(|(page, kind, tokens)| Source {
                page,
                parent,
                tiled: kind == 1,
                tokens,
            });
        let sources = running.chain(cached);
        let Some((page, n)) = partial_page::best_match(want, sources) else {
            return;
        };
        let failed = |e: &dyn std::fmt::Display| {
            tracing::warn!(error = %e, "partial-page prefix copy failed; computing it");
        };
        // Read before taking a page: taking one may evict the (cached) source.
        let data = match self.kv.read_cells(page as usize * ps, n) {
            Ok(data) => data,
            Err(e) => return failed(&e),
        };
        let cells = match self.pool.append_slots(s.id, n) {
            Ok(cells) => cells,
            Err(e) => return failed(&e),
        };
        if let Err(e) = self.kv.write_cells(cells[0], n, &data) {
            self.pool.truncate(s.id, start).expect("allocated");
            return failed(&e);
        }
        s.n_computed = start + n;
        s.usage.cached_tokens += n;
        self.stats.prefix_copied_tokens += n as u64;
    }

    /// Whether `w` shares at least a page of prompt beyond its cached prefix with a
    /// running request that is prefilling those tokens now. Admitted now, it would
    /// compute the same pages a second time (agents sharing a long system prompt
    /// arrive together); a few steps later they are a prefix-cache hit.
    fn prefix_in_flight(&self, w: &Live, usable: usize) -> bool {
        let ps = self.pool.page_size();
        let cached = self
            .pool
            .lookup_prefix(&w.tokens[..usable], 0)
            .n_cached_tokens;
        self.running.iter().any(|r| {
            if r.n_computed >= r.n_prompt {
                return false;
            }
            let common = w.tokens[..usable]
                .iter()
                .zip(&r.tokens[..r.n_prompt])
                .take_while(|(a, b)| a == b)
                .count();
            common / ps * ps >= cached + ps
        })
    }

    /// Admits waiting requests in policy order while the running limit and free
    /// pages allow, giving them their cached prefix; planning then treats them like
    /// every running request. Returns whether every request left waiting waits for
    /// a prefix that a running request is computing (true when none waits): none
    /// is held back by the running limit or memory, so none would start sooner if
    /// that request's steps were shorter ([`EngineConfig::solo_step_tokens`]).
    fn admit(&mut self) -> bool {
        let policy = self.config.policy;
        let cost = self.cost_us();
        self.waiting.sort_by_key(|s| sort_key(policy, s, cost));
        loop {
            if self.running.len() + self.loading.len() >= self.config.max_running {
                return self.waiting.is_empty();
            }
            // The first request in policy order that is not waiting for a prefix
            // another request is computing right now.
            let Some((i, usable)) = self.waiting.iter().enumerate().find_map(|(i, w)| {
                let usable = self.usable_prefix(w);
                (!self.prefix_in_flight(w, usable)).then_some((i, usable))
            }) else {
                return true;
            };
            let w = &self.waiting[i];
            let m = self.pool.lookup_prefix(&w.tokens[..usable], 0);
            let revived = m
                .pages
                .iter()
                .filter(|&&p| self.pool.ref_count(p) == 0)
                .count();
            // Its first piece: a page of prompt (or one token to replay).
            let need = revived + 1;
            // Keep a page per running request so decodes are not starved right away.
            let reserve = self.running.len();
            if need + reserve > self.pool.n_available() {
                if self.running.is_empty()
                    && self.loading.is_empty()
                    && need > self.pool.n_available()
                {
                    // Cannot fit even alone (the pool was checked at submission, so
                    // this is a resumed request that grew past the pool).
                    let s = self.waiting.remove(i);
                    self.end(s, FinishReason::ContextFull);
                    continue;
                }
                return false;
            }
            let mut s = self.waiting.remove(i);
            let m = self
                .pool
                .allocate(s.id, &s.tokens[..usable], 0)
                .expect("a waiting request holds no pages");
            debug_assert_eq!(m.n_cached_tokens % CHUNK_ALIGN, 0);
            self.mark_copy_sources(&s, 0);
            let first_admission = !s.admitted_before;
            if !s.admitted_before {
                s.admitted_before = true;
                s.usage.cached_tokens = m.n_cached_tokens;
                self.queued.fetch_sub(1, Ordering::Relaxed);
                self.stats.prompt_tokens_total += s.usage.prompt_tokens as u64;
            }
            s.n_computed = m.n_cached_tokens;
            if let Some(mut s) = self.ssd_begin_load(s, usable, &m, first_admission) {
                if first_admission {
                    self.copy_partial_page(&mut s, &m);
                }
                self.running.push(s);
            }
        }
    }

    /// The step's batch, in `work`'s order: decodes first (they share matmuls),
    /// then prompt chunks.
    fn assemble(&mut self, work: &[Work]) -> StepBatch {
        let ps = self.pool.page_size();
        let n_cells = self.kv.n_cells();
        let swa = self.model.hparams().swa_window;
        let mut b = StepBatch::default();
        for w in work {
            let s = &self.running[self.running_index(w.id).expect("planned requests run")];
            b.batch_invariant |= self.config.deterministic || s.deterministic;
            let table = self
                .pool
                .page_table(w.id)
                .expect("running requests hold pages");
            let row_start = b.tokens.len();
            let n_rows = w.end - w.start;
            // A pool smaller than the padded window caps it (the window's cells must
            // exist); masked cells change no row's numbers on the CPU kernels used for
            // such windows (see tempo9_models' attention plan).
            let n_kv = w.end.next_multiple_of(KV_WINDOW_PAD).min(n_cells);
            let mut window: Vec<CellRun> = Vec::new();
            for &p in &table[..w.end.div_ceil(ps)] {
                let start = p as usize * ps;
                match window.last_mut() {
                    Some(r) if r.start + r.len == start => r.len += ps,
                    _ => window.push(CellRun { start, len: ps }),
                }
            }
            // Pad to the window size with masked cells (any cells will do).
            let pad = n_kv - w.end.div_ceil(ps) * ps;
            if pad > 0 {
                match window.last_mut() {
                    Some(r) if r.start + r.len + pad <= n_cells => r.len += pad,
                    _ => window.push(CellRun { start: 0, len: pad }),
                }
            }
            let len = n_kv * n_rows;
            let mut mask = MaskBuilder::reusing(self.mask_buffers.take(len), n_kv, n_rows);
            let mut mask_swa =
                swa.map(|_| MaskBuilder::reusing(self.mask_buffers.take(len), n_kv, n_rows));
            for (r, pos) in (w.start..w.end).enumerate() {
                b.tokens.push(s.tokens[pos]);
                b.positions.push(pos as i32);
                b.kv_slots.push(w.cells[r] as i64);
                mask.allow_prefix(r, pos as i32, None);
                if let Some(m) = mask_swa.as_mut() {
                    m.allow_prefix(r, pos as i32, swa);
                }
            }
            if w.end == s.tokens.len() {
                b.output_rows.push((b.tokens.len() - 1) as i32);
            }
            b.seqs.push(SeqSpan {
                row_start,
                n_rows,
                window,
                mask: mask.into_data(),
                mask_swa: mask_swa.map(MaskBuilder::into_data),
                tiled_prompt: s.n_prompt >= CHUNK_ALIGN && w.start < s.n_prompt,
            });
        }
        if b.output_rows.is_empty() {
            // Only partial prompt chunks: compute one row's logits and ignore them.
            b.output_rows.push(0);
        }
        b
    }

    /// Runs the model; meanwhile a worker thread computes the constraint masks of
    /// the requests that sample in this step.
    fn forward(&mut self, work: &[Work], batch: &StepBatch) -> Result<StepOutput, ModelError> {
        let sampling: Vec<RequestId> = work
            .iter()
            .filter(|w| {
                self.running_index(w.id)
                    .is_some_and(|i| w.end == self.running[i].tokens.len())
            })
            .map(|w| w.id)
            .collect();
        // On a GPU, greedy picks made there save downloading the logits.
        if self.model.greedy_on_device()
            && self
                .running
                .iter()
                .all(|s| s.plain_greedy() || !sampling.contains(&s.id))
        {
            return self
                .model
                .forward_step(&mut self.exec, &self.kv, batch, true);
        }
        let EngineCore {
            model,
            exec,
            kv,
            running,
            ..
        } = self;
        let constrained: Vec<&mut Live> = running
            .iter_mut()
            .filter(|s| s.constraint.is_some() && sampling.contains(&s.id))
            .collect();
        if constrained.is_empty() {
            return model.forward(exec, kv, batch).map(StepOutput::Logits);
        }
        std::thread::scope(|sc| {
            let masks = sc.spawn(move || {
                for s in constrained {
                    let left = s.max_tokens.saturating_sub(s.usage.completion_tokens);
                    let c = s.constraint.as_mut().expect("filtered");
                    s.mask = Some(c.compute_mask_within(left));
                }
            });
            let logits = model.forward(exec, kv, batch);
            masks.join().expect("mask worker panicked");
            logits.map(StepOutput::Logits)
        })
    }

    /// Commits the step's KV, samples for every request whose tokens are all
    /// computed, sends events and ends finished requests.
    fn after_step(&mut self, work: &[Work], out: &mut StepOutput) {
        let n_vocab = self.model.hparams().n_vocab;
        // Output rows follow the batch order.
        let mut row = 0;
        let mut finished: Vec<(RequestId, FinishReason)> = Vec::new();
        for w in work {
            let i = self.running_index(w.id).expect("planned requests run");
            let s = &mut self.running[i];
            s.n_computed = w.end;
            self.pool
                .commit_full_pages(s.id, &s.tokens[..s.n_computed])
                .expect("cells were appended");
            if w.end == s.n_prompt && s.usage.preemptions == 0 {
                // Its prompt was computed in pieces starting at multiples of
                // ROW_GROUP: the rows in whole blocks are exact (see partial_page).
                s.exact_cells = partial_page::exact_cells(s.n_prompt);
            }
            if w.end < s.tokens.len() {
                continue;
            }
            let ended = match out {
                StepOutput::Logits(logits) => {
                    let l = &mut logits[row * n_vocab..(row + 1) * n_vocab];
                    sample_one(s, l, &self.tok, self.limits.max_context)
                }
                StepOutput::Tokens(ids) => take_token(
                    s,
                    ids[row],
                    None,
                    Vec::new(),
                    &self.tok,
                    self.limits.max_context,
                ),
            };
            row += 1;
            if let Some(reason) = ended {
                finished.push((s.id, reason));
            } else if s.tx.is_closed() {
                finished.push((s.id, FinishReason::Cancelled));
            }
            self.stats.generated_tokens_total += 1;
        }
        for (id, reason) in finished {
            let i = self.running_index(id).expect("still running");
            let s = self.running.remove(i);
            self.end(s, reason);
        }
    }
}

/// Samples `s`'s next token from its logits `l` (changed in place by the sampler),
/// sends its event, and says whether (and why) the request ends.
fn sample_one(
    s: &mut Live,
    l: &mut [f32],
    tok: &Tokenizer,
    max_context: usize,
) -> Option<FinishReason> {
    let want_top = s.top_logprobs.max(usize::from(s.logprobs));
    let top = if want_top > 0 {
        log_softmax_top(l, want_top)
    } else {
        Vec::new()
    };
    // The chosen token's log-probability is of the raw distribution; keep it only
    // when asked for (a vocabulary-sized copy per token otherwise).
    let raw = s.logprobs.then(|| (log_sum_exp(l), l.to_vec()));
    for &t in &s.banned {
        if let Some(x) = l.get_mut(t as usize) {
            *x = f32::NEG_INFINITY;
        }
    }
    let t = match s.mask.take() {
        Some(Err(e)) => return Some(FinishReason::ConstraintDeadEnd(e)),
        Some(Ok(m)) if m.is_empty() => {
            return Some(FinishReason::ConstraintDeadEnd(
                "the constraint allows no token".into(),
            ))
        }
        Some(Ok(m)) => s.sampler.sample_with_mask(l, Some(&|t| m.is_allowed(t))),
        None => s.sampler.sample(l),
    };
    let logprob = raw.map(|(log_z, raw)| chosen_logprob(&top, t, log_z, &raw));
    take_token(s, t, logprob, top, tok, max_context)
}

/// Appends the chosen token `t` to `s` (with its log-probability and top list when
/// asked for), sends its event, and says whether (and why) the request ends.
fn take_token(
    s: &mut Live,
    t: u32,
    logprob: Option<f32>,
    top: Vec<(u32, f32)>,
    tok: &Tokenizer,
    max_context: usize,
) -> Option<FinishReason> {
    s.sampler.accept(t);
    s.tokens.push(t);
    s.usage.completion_tokens += 1;
    let mut finish = None;
    if let Some(c) = s.constraint.as_mut() {
        if let Err(e) = c.accept(t) {
            finish = Some(FinishReason::ConstraintDeadEnd(e));
        }
    }
    let is_stop_token = (s.stop_eog && tok.is_eog(t)) || s.stop_ids.contains(&t);
    let mut text = String::new();
    if finish.is_none() {
        if is_stop_token {
            finish = Some(FinishReason::StopToken(t));
        } else {
            let step = s.text.push(t);
            text = step.text;
            finish = step.stop.map(FinishReason::StopString);
        }
    }
    if finish.is_none() {
        finish = if s.constraint.as_ref().is_some_and(|c| c.is_finished()) {
            Some(FinishReason::ConstraintDone)
        } else if s.usage.completion_tokens >= s.max_tokens {
            if s.tokens.len() >= max_context {
                Some(FinishReason::ContextFull)
            } else {
                Some(FinishReason::Length)
            }
        } else {
            None
        };
    }
    if finish.is_some() && !matches!(finish, Some(FinishReason::StopString(_))) {
        text.push_str(&s.text.finish());
    }
    let top_logprobs = if s.top_logprobs > 0 {
        top.into_iter().take(s.top_logprobs).collect()
    } else {
        Vec::new()
    };
    let _ = s.tx.send(Event::Token(TokenEvent {
        id: t,
        text,
        logprob,
        top_logprobs,
    }));
    finish
}

/// The chosen token's log-probability: from the top list when it is there (same
/// arithmetic as the top list), else from the log-partition.
fn chosen_logprob(top: &[(u32, f32)], t: u32, log_z: f32, l: &[f32]) -> f32 {
    top.iter()
        .find(|&&(id, _)| id == t)
        .map(|&(_, lp)| lp)
        .unwrap_or_else(|| l.get(t as usize).map_or(f32::NEG_INFINITY, |&x| x - log_z))
}

/// `ln(sum(exp(l)))`, ignoring NaN.
fn log_sum_exp(l: &[f32]) -> f32 {
    let max = l
        .iter()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    if !max.is_finite() {
        return max;
    }
    let sum: f64 = l
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&x| f64::from(x - max).exp())
        .sum();
    max + sum.ln() as f32
}

/// Opens the SSD tier for `model`'s KV in pages of `ps` tokens; `None` (with a
/// warning) when its directory cannot be used: the engine then runs RAM-only.
fn open_ssd(model: &Model, kv: &KvStore, ps: usize, cfg: SsdConfig) -> Option<SsdTier> {
    let hp = model.hparams();
    let layout = crate::ssd::KvLayout {
        n_layer: hp.n_layer,
        n_embd_k: hp.n_embd_k(),
        n_embd_v: hp.n_embd_v(),
        page_tokens: ps,
        page_bytes: kv.cells_bytes(ps),
        dtype: "f16",
        device: format!("{:?}", model.device().kind()),
    };
    let gguf = model.gguf();
    let id = crate::ssd::model_identity(gguf.bytes(), gguf.data_offset() as usize, &layout);
    let dir = cfg.dir.clone();
    match SsdTier::open(cfg, id, ps, layout.page_bytes, crate::pages::page_hash) {
        Ok(t) => {
            tracing::info!(dir = %t.dir().display(), budget_mib = t.stats().budget_bytes >> 20,
                "KV SSD tier on");
            Some(t)
        }
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "KV SSD tier off: cannot use its directory");
            None
        }
    }
}

/// SSD tier hooks, called from `step`, `admit` and `reap_cancelled`.
impl EngineCore {
    /// The SSD tier's directory, when it is on.
    pub fn ssd_dir(&self) -> Option<&std::path::Path> {
        self.ssd.as_ref().map(SsdTier::dir)
    }

    /// Waits until the SSD tier's queued writes are on disk (tests, benchmarks).
    pub fn flush_ssd(&mut self) {
        if let Some(ssd) = self.ssd.as_mut() {
            ssd.flush();
        }
    }

    /// Hashes of the SSD pages that continue the RAM match `m` of `tokens` (at most
    /// up to `(tokens.len() - 1) / page_size` pages in all, like a RAM lookup).
    fn ssd_continuation(&self, tokens: &[u32], m: &PrefixMatch) -> Vec<u64> {
        let Some(ssd) = &self.ssd else {
            return Vec::new();
        };
        let ps = self.pool.page_size();
        let parent = m
            .pages
            .last()
            .map_or(Some(ROOT_HASH), |&p| self.pool.page_hash_of(p));
        let Some(parent) = parent else {
            return Vec::new();
        };
        let max_pages = (tokens.len().saturating_sub(1) / ps).saturating_sub(m.pages.len());
        ssd.continue_prefix(parent, 0, &tokens[m.n_cached_tokens..], max_pages)
    }

    /// After `s` was allocated on its RAM match `m` of `tokens[..usable]`: if the
    /// prefix continues in the SSD tier, gives `s` RAM pages for it (as many as are
    /// free beyond a page per running request and one for its first piece), starts
    /// reading them and parks `s` until they are in. Returns `s` when there is
    /// nothing to load.
    fn ssd_begin_load(
        &mut self,
        s: Live,
        usable: usize,
        m: &PrefixMatch,
        first_admission: bool,
    ) -> Option<Live> {
        if self.ssd.is_none() {
            return Some(s);
        }
        let mut hashes = self.ssd_continuation(&s.tokens[..usable], m);
        let room = self
            .pool
            .n_available()
            .saturating_sub(self.running.len() + 1);
        hashes.truncate(room);
        if hashes.is_empty() {
            return Some(s);
        }
        let ps = self.pool.page_size();
        self.pool
            .append_slots(s.id, hashes.len() * ps)
            .expect("room was checked");
        // Pages read back hold KV of unknown making (a prompt's or an answer's): not
        // copy sources. Pages computed after them are.
        self.mark_copy_sources(&s, s.n_computed + hashes.len() * ps);
        let load = self.ssd.as_mut().expect("checked").start_load(&hashes);
        tracing::debug!(id = s.id, pages = hashes.len(), "prefix read back from SSD");
        self.loading.push(Loading {
            live: s,
            load,
            first_page: m.pages.len(),
            hashes,
            first_admission,
        });
        None
    }

    /// Moves requests whose loads finished to the running set: copies the pages read
    /// into their RAM pages, and where a page was bad or missing, drops it and the
    /// rest (they are recomputed). With `block`, waits for at least one load.
    fn ssd_finish_loads(&mut self, block: bool) {
        let Some(ssd) = self.ssd.as_mut() else {
            return;
        };
        if !ssd.has_loads() {
            return;
        }
        let results = if block { ssd.wait() } else { ssd.poll() };
        let ps = self.pool.page_size();
        for r in results {
            let Some(i) = self.loading.iter().position(|l| l.load == r.id) else {
                continue;
            };
            let l = self.loading.remove(i);
            let mut s = l.live;
            let table = self
                .pool
                .page_table(s.id)
                .expect("loading requests hold pages")
                .to_vec();
            let mut n_ok = 0;
            for (k, data) in r.pages.iter().enumerate() {
                let Some(data) = data else { break };
                let cell = table[l.first_page + k] as usize * ps;
                if let Err(e) = self.kv.write_cells(cell, ps, data) {
                    tracing::warn!(error = %e, "KV SSD tier: could not restore a page");
                    break;
                }
                n_ok += 1;
            }
            for (k, data) in r.pages.iter().enumerate() {
                if data.is_none() {
                    ssd.forget(l.hashes[k]);
                }
            }
            s.n_computed += n_ok * ps;
            if n_ok < l.hashes.len() {
                self.pool
                    .truncate(s.id, s.n_computed)
                    .expect("loading requests hold pages");
            }
            self.pool
                .commit_full_pages(s.id, &s.tokens[..s.n_computed])
                .expect("cells were appended");
            ssd.add_hit_tokens(n_ok);
            if l.first_admission {
                s.usage.cached_tokens += n_ok * ps;
            }
            self.running.push(s);
        }
    }

    /// Copies the KV of pages the pool evicted since the last call to the SSD tier
    /// (before any model step can overwrite them).
    fn ssd_save_evicted(&mut self) {
        let Some(ssd) = self.ssd.as_mut() else {
            return;
        };
        let ps = self.pool.page_size();
        for e in self.pool.take_evicted() {
            if ssd.contains(e.hash) {
                continue;
            }
            match self.kv.read_cells(e.page as usize * ps, ps) {
                Ok(data) => ssd.save(&e, data),
                Err(err) => tracing::warn!(error = %err, "KV SSD tier: could not copy a page out"),
            }
        }
    }

    /// Ends cancelled requests whose prefix is still loading.
    fn ssd_reap_cancelled(&mut self) {
        let mut i = 0;
        while i < self.loading.len() {
            if self.loading[i].live.cancelled() {
                let l = self.loading.remove(i);
                if let Some(ssd) = self.ssd.as_mut() {
                    ssd.cancel_load(l.load);
                }
                self.end(l.live, FinishReason::Cancelled);
            } else {
                i += 1;
            }
        }
    }
}

impl Drop for EngineCore {
    /// With a persistent SSD tier, writes the RAM prefix cache out too, so a restart
    /// finds every cached prefix (the tier itself then writes its index).
    fn drop(&mut self) {
        if self.config.ssd.as_ref().is_some_and(|c| c.persist) {
            self.ssd_persist_ram_cache();
        }
    }
}

impl EngineCore {
    /// Copies every registered RAM page not yet in the SSD tier to it, waiting for
    /// room in the write queue.
    fn ssd_persist_ram_cache(&mut self) {
        let Some(ssd) = self.ssd.as_mut() else {
            return;
        };
        let ps = self.pool.page_size();
        for e in self.pool.registered_pages() {
            if ssd.contains(e.hash) {
                continue;
            }
            if let Ok(data) = self.kv.read_cells(e.page as usize * ps, ps) {
                ssd.save_wait(&e, data);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn itl_budget_grows_with_waiting_prompts() {
        // Nothing decoding: no target to keep.
        assert_eq!(itl_budget(512, 100.0, 0, 5), 512);
        // One decoder, one prompt: what the target fits, in whole chunks.
        assert_eq!(itl_budget(512, 150.0, 1, 1), 128);
        // Fewer prompts than decoders: still the decoders' target.
        assert_eq!(itl_budget(512, 150.0, 3, 1), 128);
        // 15 prompts arrived with one decoder: their share, capped by `full`.
        assert_eq!(itl_budget(512, 150.0, 1, 15), 512);
        assert_eq!(itl_budget(512, 150.0, 2, 4), 256);
        // Never below one chunk, nor above `full`.
        assert_eq!(itl_budget(512, 1.0, 4, 1), CHUNK_ALIGN);
        assert_eq!(itl_budget(32, 1.0, 4, 1), 32);
        assert_eq!(itl_budget(512, f64::INFINITY, 1, 1), 512);
    }
}
