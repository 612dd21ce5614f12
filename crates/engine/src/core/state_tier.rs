//! The SSD tier for a hybrid model's recurrent-state checkpoints: a checkpoint
//! evicted from RAM is written to disk (before its slot is reused), a prompt resumes
//! from the deepest checkpoint in either tier with the pages before it in either
//! tier, and a persistent tier gets the RAM checkpoints on shutdown.
//!
//! A resume needs the pages and the state to agree: a load that brings back fewer
//! pages than asked, or not the state, leaves nothing to resume from, so the
//! request returns to waiting and is admitted again on what is still cached.

use super::{EngineCore, Live, Loading};
use crate::cache::StateStart;
use crate::pages::{PrefixMatch, ROOT_HASH};
use crate::ssd::LoadResult;

/// Where a hybrid model's prompt resumes, counting the SSD tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Resume {
    /// Leading full pages hit in RAM.
    pub ram_pages: usize,
    /// Hashes of the pages after them to read back from the SSD tier.
    pub disk_pages: Vec<u64>,
    /// Where the state starts: zeros, a RAM checkpoint, or `Loaded` from disk.
    pub state: StateStart,
    /// With `Loaded`: the page hash of the checkpoint to read back.
    pub disk_state: Option<u64>,
}

impl EngineCore {
    /// Where `tokens` (a hybrid model's prompt, as far as a lookup may cover) resumes
    /// with the SSD tier on: the deepest page, in RAM or continuing the RAM match on
    /// disk, with a state checkpoint in either tier. `None` without an SSD tier or a
    /// recurrent group, or when its pages on disk do not fit in RAM now (the RAM
    /// hit alone is used then).
    pub(super) fn hybrid_resume(&self, tokens: &[u32]) -> Option<Resume> {
        let ssd = self.ssd.as_ref()?;
        let r = self.cache.recurrent()?;
        let pool = self.cache.full();
        let ps = self.cache.page_size();
        let full = self.cache.lookup_full(tokens, 0);
        let f = full.pages.len();
        let mut hashes: Vec<u64> = full
            .pages
            .iter()
            .map(|&p| pool.page_hash_of(p).expect("cached pages are registered"))
            .collect();
        let parent = hashes.last().copied().unwrap_or(ROOT_HASH);
        let max_pages = (tokens.len().saturating_sub(1) / ps).saturating_sub(f);
        hashes.extend(ssd.continue_prefix(parent, 0, &tokens[f * ps..], max_pages));
        let found = (1..=hashes.len()).rev().find_map(|j| {
            let h = hashes[j - 1];
            if r.checkpoint(h).is_some() {
                Some((j, StateStart::Checkpoint(h), None))
            } else if ssd.contains_state(h) {
                Some((j, StateStart::Loaded, Some(h)))
            } else {
                None
            }
        });
        let resume = match found {
            Some((j, state, disk_state)) => Resume {
                ram_pages: j.min(f),
                disk_pages: hashes[j.min(f)..j].to_vec(),
                state,
                disk_state,
            },
            None => Resume {
                ram_pages: 0,
                disk_pages: Vec::new(),
                state: StateStart::Zero,
                disk_state: None,
            },
        };
        // Pages read back need RAM pages now (and a page per running request).
        let room = self
            .cache
            .n_available()
            .saturating_sub(self.running.len() + 1 + resume.ram_pages);
        (resume.disk_pages.len() <= room).then_some(resume)
    }

    /// After hybrid `s` was allocated on `resume` (its RAM part `m`): reads its pages
    /// and state checkpoint on disk back and parks it until they are in. Returns `s`
    /// when nothing is on disk.
    pub(super) fn ssd_begin_hybrid_load(
        &mut self,
        s: Live,
        resume: Resume,
        m: &PrefixMatch,
        first_admission: bool,
    ) -> Option<Live> {
        if resume.disk_pages.is_empty() && resume.disk_state.is_none() {
            return Some(s);
        }
        let ps = self.cache.page_size();
        if !resume.disk_pages.is_empty() {
            self.cache
                .append(s.id, resume.disk_pages.len() * ps)
                .expect("room was checked");
        }
        self.mark_copy_sources(&s, s.n_computed + resume.disk_pages.len() * ps);
        let ssd = self.ssd.as_mut().expect("a resume from disk has a tier");
        let load = ssd.start_load_with_state(&resume.disk_pages, resume.disk_state);
        tracing::debug!(
            id = s.id,
            pages = resume.disk_pages.len(),
            state = resume.disk_state.is_some(),
            "prefix and state read back from SSD"
        );
        self.loading.push(Loading {
            live: s,
            load,
            first_page: m.pages.len(),
            hashes: resume.disk_pages,
            first_admission,
            state: Some(resume.disk_state),
        });
        None
    }

    /// A hybrid request's load is in: with every page and the state (when asked
    /// for), writes them into its pages and state slot and runs it; else sends it
    /// back to waiting (failed entries are forgotten by the tier or here).
    pub(super) fn finish_state_load(&mut self, l: Loading, r: LoadResult, state: Option<u64>) {
        let ps = self.cache.page_size();
        let s = l.live;
        let g = self.recurrent_group().expect("a hybrid load");
        let pages_ok = r.n_ok() == l.hashes.len();
        let state_data = match state {
            Some(_) => r.state.clone(),
            None => None,
        };
        let mut ok = pages_ok && (state.is_none() || state_data.is_some());
        if ok {
            let table = self
                .cache
                .page_table(s.id)
                .expect("loading requests hold pages")
                .to_vec();
            for (k, data) in r.pages.iter().enumerate() {
                let cell = table[l.first_page + k] as usize * ps;
                let data = data.as_ref().expect("all pages loaded");
                if let Err(e) = self.kv.write_cells(0, cell, ps, data) {
                    tracing::warn!(error = %e, "KV SSD tier: could not restore a page");
                    ok = false;
                    break;
                }
            }
        }
        if let (true, Some(data)) = (ok, &state_data) {
            let slot = self
                .cache
                .state_slot(s.id)
                .expect("hybrid requests own a slot");
            if let Err(e) = self.kv.write_cells(g, slot as usize, 1, data) {
                tracing::warn!(error = %e, "KV SSD tier: could not restore a state");
                ok = false;
            }
        }
        let ssd = self.ssd.as_mut().expect("a load has a tier");
        for (k, data) in r.pages.iter().enumerate() {
            if data.is_none() {
                ssd.forget(l.hashes[k]);
            }
        }
        if !ok {
            // Nothing to resume from here: admit it again on what is cached now.
            if let (Some(h), true) = (state, pages_ok) {
                ssd.forget_state(h);
            }
            self.requeue_failed_load(s, l.first_admission);
            return;
        }
        self.resume_after_load(s, l.hashes.len(), l.first_admission);
    }

    /// Copies the recurrent state checkpoints evicted from RAM since the last call
    /// to the SSD tier (before their slots are written again).
    pub(super) fn ssd_save_evicted_states(&mut self, unwritten: &[u64]) {
        let g = self.recurrent_group();
        let (Some(ssd), Some(g)) = (self.ssd.as_mut(), g) else {
            return;
        };
        let Some(r) = self.cache.recurrent_mut() else {
            return;
        };
        for e in r.take_evicted() {
            // (`unwritten`: checkpoints taken for this step and evicted before it ran)
            if ssd.contains_state(e.hash) || unwritten.contains(&e.hash) {
                continue;
            }
            match self.kv.read_cells(g, e.slot as usize, 1) {
                Ok(data) => ssd.save_state(e.hash, data),
                Err(err) => {
                    tracing::warn!(error = %err, "KV SSD tier: could not copy a state out")
                }
            }
        }
    }

    /// Copies every RAM state checkpoint not yet in the SSD tier to it, waiting for
    /// room in the write queue (shutdown with a persistent tier).
    pub(super) fn ssd_persist_ram_states(&mut self) {
        let g = self.recurrent_group();
        let (Some(ssd), Some(g), Some(r)) = (self.ssd.as_mut(), g, self.cache.recurrent()) else {
            return;
        };
        for (hash, slot) in r.checkpoints() {
            if ssd.contains_state(hash) {
                continue;
            }
            if let Ok(data) = self.kv.read_cells(g, slot as usize, 1) {
                ssd.save_state_wait(hash, data);
            }
        }
    }
}
