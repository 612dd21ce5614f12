//! The SSD tier for a model with sliding-window layers (Gemma 3): a page's sidecar
//! (the sliding layers' KV of its tokens, kept for prefix hits: [`crate::sliding`])
//! goes to disk when it leaves RAM, a prompt resumes at the deepest page whose
//! window is in either tier with the pages before it in either tier, and a
//! persistent tier gets the RAM sidecars on shutdown.
//!
//! A resume needs its pages and its window to agree: a load that brings back fewer
//! pages or windows than asked leaves nothing to resume from, so the request returns
//! to waiting and is admitted again on what is still cached (what failed to read is
//! forgotten).

use std::collections::HashMap;

use tempo9_models::GroupKind;

use super::{EngineCore, Live, Loading};
use crate::pages::{EvictedPage, PrefixMatch, SeqId, TokenId, ROOT_HASH};
use crate::sliding::EvictedWindow;
use crate::ssd::{LoadId, LoadResult};

/// A sliding-window model's request allocated to resume past its RAM hit.
pub(super) struct WindowResume {
    /// Its RAM hit (leading cached full pages).
    pub ram_match: PrefixMatch,
    /// Hashes of the full pages after them to read back.
    pub disk_pages: Vec<u64>,
    /// The window pages to read back: (index in its page table, page hash).
    pub windows: Vec<(usize, u64)>,
}

/// Window pages that loads in flight fill when they finish, by load.
pub(super) type WindowFills = HashMap<LoadId, Vec<(usize, u64)>>;

impl EngineCore {
    /// The sliding-window group's index in the KV store.
    fn sliding_group(&self) -> Option<usize> {
        self.groups
            .iter()
            .position(|g| matches!(g.kind, GroupKind::Sliding { .. }))
    }

    /// Where `tokens` (a sliding-window model's prompt, as far as a lookup may cover)
    /// resumes with the SSD tier on: the deepest page, in RAM or continuing the RAM
    /// match on disk, whose window is in either tier, if deeper than the RAM hit
    /// alone and its pages from disk fit in RAM now. Returns the pages from RAM and
    /// the hashes of every page up to it.
    fn window_resume_point(&self, tokens: &[TokenId]) -> Option<(usize, Vec<u64>)> {
        let ssd = self.ssd.as_ref()?;
        let sl = self.cache.sliding()?;
        let pool = self.cache.full();
        let ps = self.cache.page_size();
        let ram = self.cache.lookup_full(tokens, 0).pages;
        let f = ram.len();
        let mut hashes: Vec<u64> = ram
            .iter()
            .map(|&p| pool.page_hash_of(p).expect("cached pages are registered"))
            .collect();
        let parent = hashes.last().copied().unwrap_or(ROOT_HASH);
        let max_pages = (tokens.len().saturating_sub(1) / ps).saturating_sub(f);
        hashes.extend(ssd.continue_prefix(parent, 0, &tokens[f * ps..], max_pages));
        let ram_hit = self.cache.lookup_prefix(tokens, 0).pages.len();
        let in_ram = |j: usize| j < f && sl.sidecar(ram[j], pool).is_some();
        // New pages for what comes from disk; a page per running request and one for
        // its first piece stay free (the RAM pages of the hit may be cached ones).
        let reserve = self.running.len() + 1;
        let full_room = pool.n_available().saturating_sub(reserve + f);
        let sliding_room = sl.n_available().saturating_sub(reserve);
        (ram_hit + 1..=hashes.len()).rev().find_map(|k| {
            let window = sl.first_page_seen(k * ps)..k;
            let mut from_disk = 0;
            for j in window {
                if in_ram(j) {
                    continue;
                }
                if !ssd.contains_window(hashes[j]) {
                    return None;
                }
                from_disk += 1;
            }
            let fits = k.saturating_sub(f) <= full_room && from_disk <= sliding_room;
            fits.then(|| (k.min(f), hashes[..k].to_vec()))
        })
    }

    /// Allocates `seq` (a sliding-window model's request) to resume from the SSD tier
    /// past its RAM hit, when it can (see [`Self::window_resume_point`]); `None`, with
    /// nothing allocated, otherwise.
    pub(super) fn allocate_window_resume(
        &mut self,
        seq: SeqId,
        tokens: &[TokenId],
    ) -> Option<WindowResume> {
        let (ram, hashes) = self.window_resume_point(tokens)?;
        let (ram_match, fill) = self
            .cache
            .allocate_resume(seq, tokens, 0, ram, hashes.len())
            .ok()?;
        Some(WindowResume {
            ram_match,
            disk_pages: hashes[ram..].to_vec(),
            windows: fill.into_iter().map(|j| (j, hashes[j])).collect(),
        })
    }

    /// After `s` was allocated on `resume`: reads its pages and windows on disk back
    /// and parks it until they are in.
    pub(super) fn ssd_begin_window_load(
        &mut self,
        s: Live,
        resume: WindowResume,
        first_admission: bool,
    ) -> Option<Live> {
        let ps = self.cache.page_size();
        self.mark_copy_sources(&s, s.n_computed + resume.disk_pages.len() * ps);
        let hashes: Vec<u64> = resume.windows.iter().map(|&(_, h)| h).collect();
        let ssd = self.ssd.as_mut().expect("a resume from disk has a tier");
        let load = ssd.start_load_entries(&resume.disk_pages, None, &hashes);
        tracing::debug!(
            id = s.id,
            pages = resume.disk_pages.len(),
            windows = hashes.len(),
            "prefix and sliding window read back from SSD"
        );
        self.window_fills.insert(load, resume.windows);
        self.loading.push(Loading {
            live: s,
            load,
            first_page: resume.ram_match.pages.len(),
            hashes: resume.disk_pages,
            first_admission,
            state: None,
        });
        None
    }

    /// A sliding-window model's load is in: with every page and window, writes them
    /// into its pages and runs it; else sends it back to waiting.
    pub(super) fn finish_window_load(
        &mut self,
        l: Loading,
        r: LoadResult,
        windows: Vec<(usize, u64)>,
    ) {
        let ps = self.cache.page_size();
        let g = self.sliding_group().expect("a sliding-window load");
        let s = l.live;
        // An entry that did not come back, or could not be written: forgotten, so the
        // next admission does not try it again.
        let mut bad_pages: Vec<u64> = r
            .pages
            .iter()
            .zip(&l.hashes)
            .filter(|(d, _)| d.is_none())
            .map(|(_, &h)| h)
            .collect();
        let mut bad_window = None;
        if r.complete() {
            let table = self
                .cache
                .page_table(s.id)
                .expect("loading requests hold pages")
                .to_vec();
            for (k, data) in r.pages.iter().flatten().enumerate() {
                let cell = table[l.first_page + k] as usize * ps;
                if let Err(e) = self.kv.write_cells(0, cell, ps, data) {
                    tracing::warn!(error = %e, "KV SSD tier: could not restore a page");
                    bad_pages.push(l.hashes[k]);
                    break;
                }
            }
            let sl = self.cache.sliding().expect("a sliding-window load");
            for (&(j, hash), data) in windows.iter().zip(r.windows.iter().flatten()) {
                if !bad_pages.is_empty() {
                    break;
                }
                let page = sl.page_at(s.id, j).expect("a resume holds its window");
                if let Err(e) = self.kv.write_cells(g, page as usize * ps, ps, data) {
                    tracing::warn!(error = %e, "KV SSD tier: could not restore a window");
                    bad_window = Some(hash);
                    break;
                }
            }
        }
        let ok = r.complete() && bad_pages.is_empty() && bad_window.is_none();
        let ssd = self.ssd.as_mut().expect("a load has a tier");
        for h in bad_pages {
            ssd.forget(h);
        }
        if let Some(h) = bad_window {
            ssd.forget_window(h);
        }
        if !ok {
            // Nothing to resume from here: admit it again on what is cached now.
            self.requeue_failed_load(s, l.first_admission);
            return;
        }
        self.resume_after_load(s, l.hashes.len(), l.first_admission);
    }

    /// Copies to the SSD tier the sidecars that left RAM since the last call: those
    /// the sliding group evicted, and those of the full pages `evicted` (before a
    /// step writes their pages).
    pub(super) fn ssd_save_evicted_windows(&mut self, evicted: &[EvictedPage]) {
        let g = self.sliding_group();
        let ps = self.cache.page_size();
        let (Some(ssd), Some(g), Some(sl)) = (self.ssd.as_mut(), g, self.cache.sliding_mut())
        else {
            return;
        };
        let mut windows = sl.take_evicted();
        windows.extend(evicted.iter().filter_map(|e| {
            let page = sl.take_evicted_sidecar(e.page, e.hash)?;
            Some(EvictedWindow { page, hash: e.hash })
        }));
        for w in windows {
            if ssd.contains_window(w.hash) {
                continue;
            }
            match self.kv.read_cells(g, w.page as usize * ps, ps) {
                Ok(data) => ssd.save_window(w.hash, data),
                Err(err) => {
                    tracing::warn!(error = %err, "KV SSD tier: could not copy a window out")
                }
            }
        }
    }

    /// Copies every RAM sidecar of a registered page not yet in the SSD tier to it,
    /// waiting for room in the write queue (shutdown with a persistent tier).
    pub(super) fn ssd_persist_ram_windows(&mut self) {
        let g = self.sliding_group();
        let (Some(ssd), Some(g), Some(sl)) = (self.ssd.as_mut(), g, self.cache.sliding()) else {
            return;
        };
        let pool = self.cache.full();
        let ps = self.cache.page_size();
        for e in pool.registered_pages() {
            let Some(page) = sl.sidecar(e.page, pool) else {
                continue;
            };
            if ssd.contains_window(e.hash) {
                continue;
            }
            if let Ok(data) = self.kv.read_cells(g, page as usize * ps, ps) {
                ssd.save_window_wait(e.hash, data);
            }
        }
    }
}
