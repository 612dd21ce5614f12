//! Admission: waiting requests get their cached prefix (whole pages from the prefix
//! cache, part of a page copied from another prompt's, pages read back from the SSD
//! tier) and join the running set, in policy order while memory allows.

use std::sync::atomic::Ordering;

use super::{EngineCore, Live};
use crate::pages::PrefixMatch;
use crate::partial_page::{self, Source, Want, COPY_CANDIDATES, ROW_GROUP};
use crate::request::FinishReason;
use crate::scheduler::{sort_key, CHUNK_ALIGN};

impl EngineCore {
    /// How many leading tokens of `w` a prefix-cache lookup may cover. A hit ends on
    /// a page boundary (a multiple of [`CHUNK_ALIGN`], where the prompt's chunks
    /// start, so the matmuls' row blocks line up) and leaves at least
    /// [`ROW_GROUP`] prompt tokens to compute (or none of the prompt: a resumed
    /// request whose whole prompt and some output are cached): matmuls over fewer
    /// rows (2-7) were seen to round differently. The rest runs through the same
    /// flash-attention kernel as from scratch (padded to a tile:
    /// `SeqSpan::tiled_prompt`). (Beyond the hit, part of the next page may be
    /// copied: [`Self::copy_partial_page`].)
    pub(super) fn usable_prefix(&self, w: &Live) -> usize {
        let m = self.cache.lookup_prefix(&w.tokens, 0);
        let on_disk = self.ssd_continuation(&w.tokens, &m).len();
        let full = m.n_cached_tokens + on_disk * self.cache.page_size();
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
    pub(super) fn mark_copy_sources(&mut self, s: &Live, from: usize) {
        if s.usage.preemptions == 0 {
            let kind = partial_page::tiled(s.n_prompt) as u8;
            let cells = from..partial_page::exact_cells(s.n_prompt).max(from);
            self.cache
                .full_mut()
                .set_copy_exactness(s.id, cells, kind)
                .expect("admitted requests hold pages");
        }
    }

    /// Extends a newly admitted prompt's cached prefix `m` inside the next page: copies
    /// the KV of the longest run of 16-token blocks it shares with another prompt's
    /// page of exact cells under the same cached page (see [`crate::partial_page`]).
    /// Leaves a whole block to compute, as a hit does (see [`Self::usable_prefix`]):
    /// a piece of fewer rows rounds apart from the same rows computed with the rest
    /// of the prompt, short prompts included (on both Qwen2.5-Coder files a repeated
    /// 17-token prompt's one recomputed row changed its log-probabilities; on the
    /// 1.5B's Q4_K and Q6_K weights, pieces of 1, 2, 3 and 6 rows moved the first one
    /// by up to 0.019 nats and pieces of 8 rows or more were exact;
    /// `repeated_short_prompts_are_exact`). With a sliding-window group, the source's cells
    /// there are copied too (and nothing is copied when it no longer has them).
    pub(super) fn copy_partial_page(&mut self, s: &mut Live, m: &PrefixMatch) {
        let ps = self.cache.page_size();
        let start = m.n_cached_tokens;
        let tiled = partial_page::tiled(s.n_prompt);
        let limit = s.n_prompt.saturating_sub(start + ROW_GROUP).min(ps);
        if limit < ROW_GROUP || s.tokens.len() != s.n_prompt || s.n_computed != start {
            return;
        }
        if self.cache.recurrent().is_some() {
            // Copied cells would need the state after them too.
            return;
        }
        let pool = self.cache.full();
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
        // The source's cells in the sliding group: those of the running request that
        // holds the page, else the cached page's sidecar.
        let sliding_page = match self.cache.sliding() {
            None => None,
            Some(sl) => {
                let held = self.running.iter().find_map(|r| {
                    let j = self
                        .cache
                        .page_table(r.id)?
                        .iter()
                        .position(|&p| p == page)?;
                    sl.page_at(r.id, j)
                });
                match held.or_else(|| sl.sidecar(page, self.cache.full())) {
                    Some(p) => Some(p),
                    None => return,
                }
            }
        };
        // Read before taking a page: taking one may evict the (cached) source.
        let read = |g: usize, p: u32| self.kv.read_cells(g, p as usize * ps, n);
        let data = match read(0, page) {
            Ok(data) => data,
            Err(e) => return failed(&e),
        };
        let sliding_data = match sliding_page.map(|p| read(1, p)).transpose() {
            Ok(d) => d,
            Err(e) => return failed(&e),
        };
        let cells = match self.cache.append(s.id, n) {
            Ok(cells) => cells,
            Err(e) => return failed(&e),
        };
        // Taking the page may have evicted one (or a window) still to go to the SSD
        // tier: copy it out before writing over it.
        self.ssd_save_evicted();
        let mut written = self.kv.write_cells(0, cells.full[0], n, &data);
        if let (Ok(()), Some(d)) = (&written, &sliding_data) {
            written = self.kv.write_cells(1, cells.sliding[0], n, d);
        }
        if let Err(e) = written {
            self.cache.truncate(s.id, start).expect("allocated");
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
    pub(super) fn prefix_in_flight(&self, w: &Live, usable: usize) -> bool {
        if self.cache.recurrent().is_some() {
            // A hit needs a state checkpoint: wait only for one that is coming.
            return self.state_in_flight(w, usable);
        }
        let ps = self.cache.page_size();
        let cached = self
            .cache
            .lookup_prefix(&w.tokens[..usable], 0)
            .n_cached_tokens;
        self.running.iter().any(|r| {
            if r.n_computed >= r.n_prompt {
                return false;
            }
            r.shared_prompt(&w.tokens[..usable]) / ps * ps >= cached + ps
        })
    }

    /// Admits waiting requests in policy order while the running limit and free
    /// pages allow, giving them their cached prefix; planning then treats them like
    /// every running request. Returns whether every request left waiting waits for
    /// a prefix that a running request is computing (true when none waits): none
    /// is held back by the running limit or memory, so none would start sooner if
    /// that request's steps were shorter ([`EngineConfig::solo_step_tokens`]).
    pub(super) fn admit(&mut self) -> bool {
        let policy = self.config.policy;
        let cost = self.cost_us();
        self.waiting
            .sort_by_key(|s| sort_key(policy, &s.progress(), cost));
        self.add_junction_targets(None);
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
            let m = self.cache.lookup_prefix(&w.tokens[..usable], 0);
            let revived = m
                .pages
                .iter()
                .filter(|&&p| self.cache.full().ref_count(p) == 0)
                .count();
            // Its first piece: a page of prompt (or one token to replay).
            let need = revived + 1;
            // Keep a page per running request so decodes are not starved right away.
            let reserve = self.running.len();
            if need + reserve > self.cache.n_available() {
                if self.running.is_empty()
                    && self.loading.is_empty()
                    && need > self.cache.n_available()
                {
                    // Cannot fit even alone (the pool was checked at submission, so
                    // this is a resumed request that grew past the pool).
                    let s = self.waiting.remove(i);
                    self.end(s, FinishReason::ContextFull);
                    continue;
                }
                return false;
            }
            if !self.cache.can_start_sequence() {
                return false;
            }
            let mut s = self.waiting.remove(i);
            let tokens = &s.tokens[..usable];
            let junction = self.cache.lookup_full(tokens, 0).n_cached_tokens;
            // A hybrid or sliding-window model with an SSD tier may resume deeper
            // than its RAM hit (with its state or window from either tier).
            let window = self.allocate_window_resume(s.id, tokens);
            let resume = self.hybrid_resume(tokens);
            let at = resume.as_ref().map(|r| {
                self.cache
                    .allocate_at(s.id, tokens, 0, r.ram_pages, r.state)
            });
            let (m, resume) = match (&window, at) {
                (Some(w), _) => (w.ram_match.clone(), None),
                (None, Some(Ok(m))) => (m, resume),
                // Its RAM pages did not fit: the RAM hit alone, as without a tier.
                (None, _) => (
                    self.cache
                        .allocate(s.id, tokens, 0)
                        .expect("a waiting request holds no pages"),
                    None,
                ),
            };
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
            self.plan_state_targets(&mut s, junction);
            let ready = match (window, resume) {
                (Some(w), _) => self.ssd_begin_window_load(s, w, first_admission),
                (None, Some(r)) => self.ssd_begin_hybrid_load(s, r, &m, first_admission),
                (None, None) => self.ssd_begin_load(s, usable, &m, first_admission),
            };
            if let Some(mut s) = ready {
                if first_admission {
                    self.copy_partial_page(&mut s, &m);
                }
                self.running.push(s);
                // Prompts still waiting may part from this one deeper than any
                // checkpoint: it checkpoints there for them.
                self.add_junction_targets(Some(self.running.len() - 1));
            }
        }
    }
}
