//! Per-sequence page tables: a sequence's life from admission on a cached prefix,
//! through appending cells and committing full pages into the cache, to being freed
//! (perhaps keeping its partial tail). Apart because this is the API the scheduler
//! drives every step, and the rules on which pages stay private and how a sequence's
//! cache chain continues (through a twin, or broken by an eviction) live here.

use super::*;

impl Seq {
    /// Exact leading cells of a page starting at cell `start`, and their kind.
    fn exact_leading(&self, start: usize) -> (usize, u8) {
        let (cells, kind) = &self.exact;
        let n = match cells.contains(&start) {
            true => cells.end - start,
            false => 0,
        };
        (n, *kind)
    }
}

impl PagePool {
    /// Sequences holding a page table.
    pub fn n_seqs(&self) -> usize {
        self.seqs.len()
    }

    /// Whether `seq` is allocated.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// `seq`'s page table: page `i` holds its tokens `i * page_size .. (i + 1) * page_size`.
    pub fn page_table(&self, seq: SeqId) -> Option<&[PageId]> {
        self.seqs.get(&seq).map(|s| &s.pages[..])
    }

    /// Tokens of `seq` that have a KV cell (cached prefix plus appended).
    pub fn n_tokens(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.n_tokens)
    }

    /// Pages a new request for `tokens` would consume to hold its whole prompt: new
    /// pages for the uncached part plus matched pages that are now evictable (taking a
    /// reference removes them from the available set).
    pub fn pages_to_admit(&self, tokens: &[TokenId], salt: u64) -> usize {
        let m = self.lookup_prefix(tokens, salt);
        let revived = m.pages.iter().filter(|&&p| self.ref_count(p) == 0).count();
        revived + self.pages_for_tokens(tokens.len()) - m.pages.len()
    }

    /// Whether a new request for `tokens` can be allocated and its whole prompt
    /// appended right now.
    pub fn can_allocate(&self, tokens: &[TokenId], salt: u64) -> bool {
        self.pages_to_admit(tokens, salt) <= self.n_available()
    }

    /// Starts `seq` on the cached prefix of `tokens` (see [`PagePool::lookup_prefix`]):
    /// takes a reference on each matched page and returns the match. The caller then
    /// computes tokens from `n_cached_tokens` on, getting their cells from
    /// [`PagePool::append_slots`]. `salt` covers everything besides tokens that changes
    /// the KV and applies to all of `seq`'s pages. Takes no new pages, so it cannot run
    /// out of memory; check [`PagePool::can_allocate`] for admission.
    pub fn allocate(
        &mut self,
        seq: SeqId,
        tokens: &[TokenId],
        salt: u64,
    ) -> Result<PrefixMatch, PageError> {
        if self.seqs.contains_key(&seq) {
            return Err(PageError::SeqExists(seq));
        }
        let m = self.lookup_prefix(tokens, salt);
        for &p in &m.pages {
            self.store.acquire(p);
        }
        let chain = match m.pages.last() {
            None => Chain::Root,
            Some(&page) => Chain::Node {
                page,
                epoch: self.store.page(page).epoch,
                hash: self.store.entry(page).hash,
            },
        };
        self.seqs.insert(
            seq,
            Seq {
                pages: m.pages.clone(),
                n_tokens: m.n_cached_tokens,
                n_final: m.pages.len(),
                salt,
                chain,
                exact: (0..0, 0),
            },
        );
        self.query_tokens += tokens.len() as u64;
        self.hit_tokens += m.n_cached_tokens as u64;
        Ok(m)
    }

    /// Records that cells `cells` of `seq` hold KV that any prompt with the same
    /// tokens computes bit for bit, given the same `kind`; the pages `seq` registers
    /// from now on (whole, or kept partial) that start inside the range carry their
    /// leading share of it, for [`PagePool::copy_candidates`]. Default: none.
    pub fn set_copy_exactness(
        &mut self,
        seq: SeqId,
        cells: std::ops::Range<usize>,
        kind: u8,
    ) -> Result<(), PageError> {
        let s = self.seqs.get_mut(&seq).ok_or(PageError::UnknownSeq(seq))?;
        s.exact = (cells, kind);
        Ok(())
    }

    /// New pages that appending `n_new_tokens` tokens to `seq` would take.
    pub fn pages_to_append(&self, seq: SeqId, n_new_tokens: usize) -> Result<usize, PageError> {
        let s = self.seqs.get(&seq).ok_or(PageError::UnknownSeq(seq))?;
        Ok(self.pages_for_tokens(s.n_tokens + n_new_tokens) - s.pages.len())
    }

    /// Whether `n_new_tokens` tokens can be appended to `seq` right now.
    pub fn can_append(&self, seq: SeqId, n_new_tokens: usize) -> bool {
        self.pages_to_append(seq, n_new_tokens)
            .is_ok_and(|n| n <= self.n_available())
    }

    /// Gives the next `n_new_tokens` tokens of `seq` KV cells, taking pages (free ones
    /// first, then evicting cached ones) as needed; returns each token's cell, in order.
    /// All cells are in pages private to `seq`; the page table only grows at its end,
    /// so cells handed out earlier stay valid while `seq` lives. All or nothing: on
    /// [`PageError::OutOfPages`] nothing changed.
    pub fn append_slots(
        &mut self,
        seq: SeqId,
        n_new_tokens: usize,
    ) -> Result<Vec<usize>, PageError> {
        let ps = self.store.page_size;
        let s = self.seqs.get_mut(&seq).ok_or(PageError::UnknownSeq(seq))?;
        let needed = (s.n_tokens + n_new_tokens).div_ceil(ps) - s.pages.len();
        let available = self.store.n_available();
        if needed > available {
            return Err(PageError::OutOfPages { needed, available });
        }
        for _ in 0..needed {
            // Eviction frees at least the evicted page, so `available` pages exist.
            let p = self
                .store
                .take_page(s.pages.last().copied())
                .expect("counted as available");
            self.store.page_mut(p).refs = 1;
            s.pages.push(p);
        }
        let start = s.n_tokens;
        s.n_tokens += n_new_tokens;
        let pages = &s.pages;
        Ok((start..start + n_new_tokens)
            .map(|pos| pages[pos / ps] as usize * ps + pos % ps)
            .collect())
    }

    /// Marks `seq`'s full pages covered by `tokens` (its tokens from position 0, whose
    /// KV has been written) as final and registers them in the cache, so later
    /// requests share them. Pages committed before are skipped, as is a partial last
    /// page. A page whose key is already cached stays private (see the module docs).
    /// Returns how many pages were newly registered.
    ///
    /// Call it only once the model step that wrote these tokens' KV has run: from then
    /// on other requests may read the pages. The caller vouches that `tokens` are the
    /// ones written through [`PagePool::append_slots`] (or matched at allocation); the
    /// pool does not keep them.
    pub fn commit_full_pages(
        &mut self,
        seq: SeqId,
        tokens: &[TokenId],
    ) -> Result<usize, PageError> {
        let ps = self.store.page_size;
        let s = self.seqs.get_mut(&seq).ok_or(PageError::UnknownSeq(seq))?;
        if tokens.len() > s.n_tokens {
            return Err(PageError::TokensBeyondSlots {
                seq,
                n_tokens: tokens.len(),
                n_slots: s.n_tokens,
            });
        }
        let st = &mut self.store;
        let mut added = 0;
        for i in s.n_final..tokens.len() / ps {
            let page_tokens = &tokens[i * ps..(i + 1) * ps];
            let parent = match s.chain {
                Chain::Root => Some((None, ROOT_HASH)),
                Chain::Node { page, epoch, hash } if st.page(page).epoch == epoch => {
                    Some((Some(page), hash))
                }
                Chain::Node { .. } | Chain::Broken => None,
            };
            s.chain = match parent {
                None => Chain::Broken,
                Some((parent, parent_hash)) => {
                    let hash = (st.hasher)(parent_hash, s.salt, page_tokens);
                    let node = match st.find(hash, parent, s.salt, page_tokens) {
                        Some(twin) => twin,
                        None => {
                            let exact = s.exact_leading(i * ps);
                            st.register(s.pages[i], hash, parent, s.salt, page_tokens, exact);
                            added += 1;
                            s.pages[i]
                        }
                    };
                    Chain::Node {
                        page: node,
                        epoch: st.page(node).epoch,
                        hash,
                    }
                }
            };
            s.n_final = i + 1;
        }
        Ok(added)
    }

    /// Shrinks `seq` to its first `n_tokens` tokens, releasing the pages past them
    /// (used when KV loaded for them turned out unusable). Final pages cannot be
    /// dropped: `n_tokens` must cover them.
    ///
    /// # Panics
    /// If `n_tokens` is beyond the sequence's tokens or inside its final pages.
    pub fn truncate(&mut self, seq: SeqId, n_tokens: usize) -> Result<(), PageError> {
        let ps = self.store.page_size;
        let s = self.seqs.get_mut(&seq).ok_or(PageError::UnknownSeq(seq))?;
        assert!(
            n_tokens <= s.n_tokens && n_tokens >= s.n_final * ps,
            "truncate to {n_tokens} of {} tokens with {} final pages",
            s.n_tokens,
            s.n_final
        );
        let keep = n_tokens.div_ceil(ps);
        for p in s.pages.drain(keep..).rev() {
            self.store.release(p);
        }
        s.n_tokens = n_tokens;
        Ok(())
    }

    /// Ends `seq` like [`PagePool::free`], but first keeps its page at `page_index`,
    /// whose first `tail.len()` cells hold the KV of `tail` (fewer than a page of
    /// tokens), as a partial cache entry under the page before it. Lookups never match
    /// a partial entry (they look for whole pages), so it is only read by copying
    /// cells out of it (see [`crate::partial_page`]); it stays cached and evictable
    /// like any unreferenced page, and leaves with its parent. Returns the kept page,
    /// or `None` when it cannot be kept: not the sequence's first unfinished page,
    /// `tail` empty, a whole page or beyond the written cells, the sequence's chain
    /// broken, or an equal entry already cached.
    pub fn free_keeping_tail(
        &mut self,
        seq: SeqId,
        page_index: usize,
        tail: &[TokenId],
    ) -> Result<Option<PageId>, PageError> {
        let s = self.seqs.get(&seq).ok_or(PageError::UnknownSeq(seq))?;
        let st = &mut self.store;
        let ps = st.page_size;
        let fits = page_index == s.n_final
            && page_index < s.pages.len()
            && !tail.is_empty()
            && tail.len() < ps
            && page_index * ps + tail.len() <= s.n_tokens;
        let parent = match s.chain {
            _ if !fits => None,
            Chain::Root => Some((None, ROOT_HASH)),
            Chain::Node { page, epoch, hash } if st.page(page).epoch == epoch => {
                Some((Some(page), hash))
            }
            Chain::Node { .. } | Chain::Broken => None,
        };
        let mut kept = None;
        if let Some((parent, parent_hash)) = parent {
            let p = s.pages[page_index];
            let hash = (st.hasher)(parent_hash, s.salt, tail);
            let private = st.page(p).refs == 1 && st.page(p).entry.is_none();
            if private && st.find(hash, parent, s.salt, tail).is_none() {
                let exact = s.exact_leading(page_index * ps);
                st.register(p, hash, parent, s.salt, tail, exact);
                kept = Some(p);
            }
        }
        self.free(seq)?;
        Ok(kept)
    }

    /// Ends `seq` (finished, cancelled or preempted): drops its references. Pages left
    /// unreferenced stay cached (evictable) if registered and are freed otherwise. The
    /// table is released deepest page first so, among equally old pages, the cache
    /// evicts a prefix's tail before its head.
    pub fn free(&mut self, seq: SeqId) -> Result<(), PageError> {
        let s = self.seqs.remove(&seq).ok_or(PageError::UnknownSeq(seq))?;
        for &p in s.pages.iter().rev() {
            self.store.release(p);
        }
        Ok(())
    }
}
