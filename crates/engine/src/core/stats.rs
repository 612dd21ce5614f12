//! What the engine reports about itself: its counters ([`EngineStats`]), every
//! request's progress ([`RequestProgress`]), and the KV cache's invariants checked
//! against the requests (tests and debugging).

use super::{EngineCore, Live};
use crate::recurrent::RecurrentStats;
use crate::request::RequestId;
use crate::sliding::SlidingStats;
use crate::ssd::{SsdStats, SsdTier};

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

impl EngineCore {
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
}
