//! The SSD tier's hooks in the step loop: cached pages evicted from RAM are copied
//! to disk before a step can overwrite them, a prefix that continues on disk is read
//! back into fresh RAM pages before the request is scheduled, and a persistent tier
//! gets the RAM cache on shutdown.
//!
//! The tier holds the full-attention group's pages (group 0 of the KV store), a
//! hybrid model's recurrent-state checkpoints (`state_tier`), and a sliding-window
//! model's sidecars, the windows a hit needs in those layers (`window_tier`). Those
//! two kinds of model resume from disk through their own modules; this one loads
//! the pages of the others.

use tempo9_models::{KvStore, Model};

use super::{EngineCore, Live, Loading};
use crate::pages::{PrefixMatch, ROOT_HASH};
use crate::request::FinishReason;
use crate::ssd::{SsdConfig, SsdTier};

/// Opens the SSD tier for `model`'s KV in pages of `ps` tokens; `None` (with a
/// warning) when its directory cannot be used: the engine then runs RAM-only.
pub(super) fn open_ssd(model: &Model, kv: &KvStore, ps: usize, cfg: SsdConfig) -> Option<SsdTier> {
    let hp = model.hparams();
    let group_bytes = |kind: fn(&tempo9_models::GroupKind) -> bool, cells: usize| {
        kv.groups()
            .iter()
            .position(|g| kind(&g.kind))
            .map_or(0, |g| kv.cells_bytes(g, cells))
    };
    let layout = crate::ssd::KvLayout {
        n_layer: hp.n_layer,
        n_embd_k: hp.n_embd_k(),
        n_embd_v: hp.n_embd_v(),
        page_tokens: ps,
        page_bytes: kv.cells_bytes(0, ps),
        dtype: "f16",
        device: format!("{:?}", model.device().kind()),
        state_bytes: group_bytes(|k| *k == tempo9_models::GroupKind::Recurrent, 1),
    };
    // Not part of the identity: it follows from the model file and page size, and a
    // sliding-window model's tier then keeps its directory (an index from before
    // window entries is found there and judged foreign by its version).
    let window_bytes = group_bytes(
        |k| matches!(k, tempo9_models::GroupKind::Sliding { .. }),
        ps,
    );
    let gguf = model.gguf();
    let id = crate::ssd::model_identity(gguf.bytes(), gguf.data_offset() as usize, &layout);
    let dir = cfg.dir.clone();
    let bytes = crate::ssd::EntryBytes {
        page: layout.page_bytes,
        state: layout.state_bytes,
        window: window_bytes,
    };
    let opened = SsdTier::open_sized(cfg, id, ps, bytes, crate::pages::page_hash);
    match opened {
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
    pub(super) fn ssd_continuation(&self, tokens: &[u32], m: &PrefixMatch) -> Vec<u64> {
        // Pages from disk need the sliding windows or recurrent states after them:
        // `window_tier` and `state_tier` resume those models.
        let ram_only = self.cache.sliding().is_some() || self.cache.recurrent().is_some();
        let Some(ssd) = self.ssd.as_ref().filter(|_| !ram_only) else {
            return Vec::new();
        };
        let ps = self.cache.page_size();
        let parent = m
            .pages
            .last()
            .map_or(Some(ROOT_HASH), |&p| self.cache.full().page_hash_of(p));
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
    pub(super) fn ssd_begin_load(
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
            .cache
            .n_available()
            .saturating_sub(self.running.len() + 1);
        hashes.truncate(room);
        if hashes.is_empty() {
            return Some(s);
        }
        let ps = self.cache.page_size();
        self.cache
            .append(s.id, hashes.len() * ps)
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
            state: None,
        });
        None
    }

    /// Moves requests whose loads finished to the running set: copies the pages read
    /// into their RAM pages, and where a page was bad or missing, drops it and the
    /// rest (they are recomputed). With `block`, waits for at least one load.
    pub(super) fn ssd_finish_loads(&mut self, block: bool) {
        let Some(ssd) = self.ssd.as_mut() else {
            return;
        };
        if !ssd.has_loads() {
            return;
        }
        let results = if block { ssd.wait() } else { ssd.poll() };
        let ps = self.cache.page_size();
        for r in results {
            let Some(i) = self.loading.iter().position(|l| l.load == r.id) else {
                continue;
            };
            let l = self.loading.remove(i);
            if let Some(state) = l.state {
                self.finish_state_load(l, r, state);
                continue;
            }
            if let Some(windows) = self.window_fills.remove(&l.load) {
                self.finish_window_load(l, r, windows);
                continue;
            }
            let Some(ssd) = self.ssd.as_mut() else {
                return;
            };
            let s = l.live;
            let table = self
                .cache
                .page_table(s.id)
                .expect("loading requests hold pages")
                .to_vec();
            let mut n_ok = 0;
            for (k, data) in r.pages.iter().enumerate() {
                let Some(data) = data else { break };
                let cell = table[l.first_page + k] as usize * ps;
                if let Err(e) = self.kv.write_cells(0, cell, ps, data) {
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
            if n_ok < l.hashes.len() {
                self.cache
                    .truncate(s.id, s.n_computed + n_ok * ps)
                    .expect("loading requests hold pages");
            }
            self.resume_after_load(s, n_ok, l.first_admission);
        }
    }

    /// A load that leaves nothing to resume from: the request gives its pages back
    /// and waits to be admitted again on what is cached now.
    pub(super) fn requeue_failed_load(&mut self, mut s: Live, first_admission: bool) {
        tracing::debug!(id = s.id, "SSD resume failed; back to waiting");
        self.cache.free(s.id).expect("loading requests hold pages");
        s.n_computed = 0;
        if first_admission {
            s.usage.cached_tokens = 0;
        }
        self.waiting.push(s);
    }

    /// A load that restored the request's next `n_pages` pages: they count as
    /// computed and cached (a hybrid model registers its prompt's pages only), and
    /// the request runs.
    pub(super) fn resume_after_load(&mut self, mut s: Live, n_pages: usize, first_admission: bool) {
        let ps = self.cache.page_size();
        s.n_computed += n_pages * ps;
        let end = match self.cache.recurrent() {
            Some(_) => s.n_computed.min(s.n_prompt),
            None => s.n_computed,
        };
        self.cache
            .commit(s.id, &s.tokens[..end])
            .expect("cells were appended");
        if let Some(ssd) = self.ssd.as_mut() {
            ssd.add_hit_tokens(n_pages);
        }
        if first_admission {
            s.usage.cached_tokens += n_pages * ps;
        }
        self.running.push(s);
    }

    /// Copies the KV of pages the pool evicted since the last call to the SSD tier
    /// (before any model step can overwrite them), with their sliding windows.
    pub(super) fn ssd_save_evicted(&mut self) {
        self.ssd_save_evicted_states(&[]);
        let Some(ssd) = self.ssd.as_mut() else {
            return;
        };
        let ps = self.cache.page_size();
        let evicted = self.cache.full_mut().take_evicted();
        for e in &evicted {
            if ssd.contains(e.hash) {
                continue;
            }
            match self.kv.read_cells(0, e.page as usize * ps, ps) {
                Ok(data) => ssd.save(e, data),
                Err(err) => tracing::warn!(error = %err, "KV SSD tier: could not copy a page out"),
            }
        }
        self.ssd_save_evicted_windows(&evicted);
    }

    /// Ends cancelled requests whose prefix is still loading.
    pub(super) fn ssd_reap_cancelled(&mut self) {
        let mut i = 0;
        while i < self.loading.len() {
            if self.loading[i].live.cancelled() {
                let l = self.loading.remove(i);
                if let Some(ssd) = self.ssd.as_mut() {
                    ssd.cancel_load(l.load);
                }
                self.window_fills.remove(&l.load);
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
    pub(super) fn ssd_persist_ram_cache(&mut self) {
        let Some(ssd) = self.ssd.as_mut() else {
            return;
        };
        let ps = self.cache.page_size();
        for e in self.cache.full().registered_pages() {
            if ssd.contains(e.hash) {
                continue;
            }
            if let Ok(data) = self.kv.read_cells(0, e.page as usize * ps, ps) {
                ssd.save_wait(&e, data);
            }
        }
        self.ssd_persist_ram_states();
        self.ssd_persist_ram_windows();
    }
}
