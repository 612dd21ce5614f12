//! An engine with nothing to compute: SSD writes still to take in, and step
//! buffers and free KV pages' host memory given back when it goes idle.

use tempo9_models::GroupKind;

use super::EngineCore;
use crate::ssd::SsdTier;
#[cfg(doc)]
use tempo9_models::Executor;

/// Step buffers an idle engine on the CPU keeps (see
/// `EngineCore::release_step_buffers`): a decode step's and a short prompt's.
const IDLE_KEEP_STEP_BYTES: usize = 8 << 20;

impl EngineCore {
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

    /// On the CPU, an engine gone idle frees the step buffers its largest steps grew
    /// ([`Executor::release_buffers`]) when they hold more than
    /// [`IDLE_KEEP_STEP_BYTES`]: a long prompt's masks at depth would otherwise stay
    /// resident beside the KV cache until the process ends (Gemma 3 after a 30K-token
    /// prompt: ~31 MB of input arena). The next step allocates again (a few ms on the
    /// CPU); on a GPU the buffers stay, where allocating them again costs more and
    /// they are device memory.
    pub(super) fn release_step_buffers(&mut self) {
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
}
