//! Building the engine: the KV budget split among the model's pages, sliding-window
//! pages, recurrent state slots and checkpoints, a drafting model's KV and
//! speculation's scratch states; then the executor, the KV store, the SSD tier
//! and the vision encoder's thread.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use tempo9_models::{CacheGroup, Executor, GroupKind, Model};
use tempo9_tokenizer::Tokenizer;

use super::draft::Drafter;
use super::mtp::MtpDrafter;
use super::runner::MaskBuffers;
use super::{
    gpu_kv_budget, tier, EngineConfig, EngineCore, EngineError, EngineStats, Limits, SpecStates,
};
use crate::cache::KvCache;
use crate::pages::PagePool;
use crate::recurrent::RecurrentStates;
use crate::scheduler::{CHUNK_ALIGN, KV_WINDOW_PAD};
use crate::sliding::SlidingPages;
use crate::spec::{DraftCost, SpecConfig, SpecMode, StepCost};
use crate::vision::VisionWorker;

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
}
