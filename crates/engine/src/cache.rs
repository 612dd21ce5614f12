//! The KV cache coordinator: one manager per group of layers that keep the same kind
//! of cache, over one prefix index.
//!
//! A model declares its groups (`tempo9_models::CacheGroup`): full attention (every
//! token's K/V: [`PagePool`], whose registered pages are also the prefix index every
//! group hangs on), and sliding window (the last `window` positions:
//! [`SlidingPages`]). The coordinator keeps them in step: a sequence's token `t` has
//! a cell in every group, appends and frees go to all groups, and a prefix hit is as
//! long as every group can serve it. Recurrent state (Qwen3.5's linear-attention
//! layers) is the third kind: [`RecurrentStates`] keeps a state slot per sequence
//! and state checkpoints named by the full pages they end, like the sliding group's
//! windows; a hit needs a checkpoint where it ends. A sequence's slot is set up
//! (zeroed, or copied from a checkpoint) by the runner before the sequence's first
//! step: [`KvCache::take_state_inits`]; or, when its checkpoint is read back from
//! the SSD tier, by the tier's loader ([`StateStart::Loaded`]). Likewise a prefix
//! that continues in the SSD tier on a sliding-window model starts with
//! [`KvCache::allocate_resume`]: the tier's loader fills the pages and windows it
//! reads back.
//!
//! Pure bookkeeping, like its managers: the KV data lives in the model's `KvStore`,
//! one pool of cells per group.

use crate::pages::{PageError, PageId, PagePool, PoolStats, PrefixMatch, SeqId, TokenId};
use crate::recurrent::{RecurrentStates, RecurrentStats, SlotId, StateCopy};
use crate::sliding::{SlidingPages, SlidingStats};

/// How a new sequence's state slot starts, before its first step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateInit {
    /// The sequence's slot.
    pub slot: SlotId,
    /// The checkpoint slot to copy from (a prefix hit); None: zeros (from token 0).
    pub from: Option<SlotId>,
}

/// Where a new sequence's recurrent state starts (see [`KvCache::allocate_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateStart {
    /// Zeros: computed from its first token.
    Zero,
    /// The cached checkpoint of this page hash (at the end of its last hit page,
    /// or of a page read back from the SSD tier after them).
    Checkpoint(u64),
    /// Written by the caller (a checkpoint read back from the SSD tier).
    Loaded,
}

/// The cells a step's tokens write, per group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cells {
    /// Full-attention group.
    pub full: Vec<usize>,
    /// Sliding-window group (empty without one).
    pub sliding: Vec<usize>,
}

/// The pages one sequence attends over in a group for a run of rows, and the position
/// held by the first page's first cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupWindow {
    /// Pages in window order.
    pub pages: Vec<PageId>,
    /// Position of the first page's first token.
    pub base: usize,
}

/// Counters of the cache, per group.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CacheStats {
    /// Full-attention group (and the prefix index).
    pub full: PoolStats,
    /// Sliding-window group, if any.
    pub sliding: Option<SlidingStats>,
    /// Recurrent-state group, if any.
    pub recurrent: Option<RecurrentStats>,
}

/// The coordinator (see the module docs).
#[derive(Debug)]
pub struct KvCache {
    full: PagePool,
    sliding: Option<SlidingPages>,
    recurrent: Option<RecurrentStates>,
    /// Slots of sequences started since the runner last took them.
    state_inits: Vec<StateInit>,
}

impl KvCache {
    /// A cache of full-attention pages only.
    pub fn new(full: PagePool) -> KvCache {
        KvCache {
            full,
            sliding: None,
            recurrent: None,
            state_inits: Vec::new(),
        }
    }

    /// A cache with a recurrent-state group beside the full-attention one.
    pub fn with_recurrent(full: PagePool, recurrent: RecurrentStates) -> KvCache {
        KvCache {
            recurrent: Some(recurrent),
            ..KvCache::new(full)
        }
    }

    /// A cache with a sliding-window group beside the full-attention one (same page
    /// size).
    pub fn with_sliding(full: PagePool, sliding: SlidingPages) -> KvCache {
        KvCache {
            sliding: Some(sliding),
            ..KvCache::new(full)
        }
    }

    /// The full-attention pages, which index the prefix cache.
    pub fn full(&self) -> &PagePool {
        &self.full
    }

    /// The full-attention pages, mutably (eviction log, partial-page entries).
    pub fn full_mut(&mut self) -> &mut PagePool {
        &mut self.full
    }

    /// The sliding-window group, if any.
    pub fn sliding(&self) -> Option<&SlidingPages> {
        self.sliding.as_ref()
    }

    /// The sliding-window group, mutably (the SSD tier's eviction log).
    pub fn sliding_mut(&mut self) -> Option<&mut SlidingPages> {
        self.sliding.as_mut()
    }

    /// The recurrent-state group, if any.
    pub fn recurrent(&self) -> Option<&RecurrentStates> {
        self.recurrent.as_ref()
    }

    /// `seq`'s state slot in the recurrent group.
    pub fn state_slot(&self, seq: SeqId) -> Option<SlotId> {
        self.recurrent.as_ref()?.slot(seq)
    }

    /// Whether one more sequence can start now (a state slot is free or evictable
    /// in the recurrent group; always, without one).
    pub fn can_start_sequence(&self) -> bool {
        self.recurrent.as_ref().is_none_or(|r| r.n_available() > 0)
    }

    /// The state slots of sequences started since the last call, to set up before
    /// the next step.
    pub fn take_state_inits(&mut self) -> Vec<StateInit> {
        std::mem::take(&mut self.state_inits)
    }

    /// Tokens per page (every group).
    pub fn page_size(&self) -> usize {
        self.full.page_size()
    }

    /// Per-group counters.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            full: self.full.stats(),
            sliding: self.sliding.as_ref().map(SlidingPages::stats),
            recurrent: self.recurrent.as_ref().map(RecurrentStates::stats),
        }
    }

    /// Pages obtainable now in the scarcer group.
    pub fn n_available(&self) -> usize {
        let s = self
            .sliding
            .as_ref()
            .map_or(usize::MAX, |s| s.n_available());
        self.full.n_available().min(s)
    }

    /// Whether `seq` holds pages.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.full.contains(seq)
    }

    /// Tokens of `seq` with a cell.
    pub fn n_tokens(&self, seq: SeqId) -> Option<usize> {
        self.full.n_tokens(seq)
    }

    /// `seq`'s full-attention page table.
    pub fn page_table(&self, seq: SeqId) -> Option<&[PageId]> {
        self.full.page_table(seq)
    }

    /// The prefix of `tokens` every group can serve: the cached full pages, cut where
    /// the sliding group lacks the window a hit there needs.
    pub fn lookup_prefix(&self, tokens: &[TokenId], salt: u64) -> PrefixMatch {
        let mut m = self.full.lookup_prefix(tokens, salt);
        let k = self.usable_hit(&m.pages);
        if k < m.pages.len() {
            m.pages.truncate(k);
            m.n_cached_tokens = k * self.page_size();
        }
        m
    }

    /// Of a full-attention hit over `pages`, the leading pages every other group can
    /// serve.
    fn usable_hit(&self, pages: &[PageId]) -> usize {
        let s = self
            .sliding
            .as_ref()
            .map_or(pages.len(), |s| s.usable_hit(pages, &self.full));
        let r = self
            .recurrent
            .as_ref()
            .map_or(pages.len(), |r| r.usable_hit(pages, &self.full));
        s.min(r)
    }

    /// The full-attention pages cached for `tokens`, ignoring what the other groups
    /// can serve (a hybrid model's hit is cut at a checkpoint: this is the match a
    /// checkpoint at its end would make whole).
    pub fn lookup_full(&self, tokens: &[TokenId], salt: u64) -> PrefixMatch {
        self.full.lookup_prefix(tokens, salt)
    }

    /// Starts `seq` on the prefix of `tokens` every group can serve (see
    /// [`Self::lookup_prefix`]).
    pub fn allocate(
        &mut self,
        seq: SeqId,
        tokens: &[TokenId],
        salt: u64,
    ) -> Result<PrefixMatch, PageError> {
        if self.sliding.is_none() && self.recurrent.is_none() {
            return self.full.allocate(seq, tokens, salt);
        }
        let whole = self.full.lookup_prefix(tokens, salt);
        let k = self.usable_hit(&whole.pages);
        let state = match k {
            0 => StateStart::Zero,
            k => match self.full.page_hash_of(whole.pages[k - 1]) {
                Some(h) => StateStart::Checkpoint(h),
                None => unreachable!("cached pages are registered"),
            },
        };
        self.allocate_at(seq, tokens, salt, k, state)
    }

    /// Starts `seq` on the first `k` cached full pages of `tokens` (every group must
    /// serve them: `k` from [`Self::lookup_prefix`], or fewer), its recurrent state
    /// from `state` (with a recurrent group; a `Checkpoint` must be cached).
    pub fn allocate_at(
        &mut self,
        seq: SeqId,
        tokens: &[TokenId],
        salt: u64,
        k: usize,
        state: StateStart,
    ) -> Result<PrefixMatch, PageError> {
        if !self.can_start_sequence() {
            return Err(PageError::OutOfPages {
                needed: 1,
                available: 0,
            });
        }
        let whole = self.full.lookup_prefix(tokens, salt);
        assert!(
            k <= whole.pages.len(),
            "a hit of {k} pages beyond the match"
        );
        // A lookup covers at most (len - 1) / page_size pages.
        let upto = if k < whole.pages.len() {
            k * self.full.page_size() + 1
        } else {
            tokens.len()
        };
        let m = self.full.allocate(seq, &tokens[..upto], salt)?;
        debug_assert_eq!(m.pages.len(), k);
        if let Some(s) = self.sliding.as_mut() {
            s.allocate(seq, &whole.pages, k, &self.full);
        }
        if let Some(r) = self.recurrent.as_mut() {
            let from = match state {
                StateStart::Checkpoint(h) => Some(h),
                StateStart::Zero | StateStart::Loaded => None,
            };
            let copy = r.allocate(seq, from).expect("a slot was available");
            let slot = r.slot(seq).expect("just allocated");
            if state != StateStart::Loaded {
                self.state_inits.push(StateInit {
                    slot,
                    from: copy.map(|c| c.from),
                });
            }
        }
        Ok(m)
    }

    /// Starts `seq` on a sliding-window model at page `k` of `tokens`, of which the
    /// first `ram` are cached full pages (`ram` at most the RAM match) and the rest
    /// are read back from the SSD tier: gives it new full pages for those, and in the
    /// sliding group the window position `k * page_size` sees, from RAM sidecars
    /// where they are and new pages elsewhere (see [`SlidingPages::allocate_resume`]).
    /// The caller fills the new pages before `seq` runs. Returns the RAM match and the
    /// indices of the new sliding pages. All or nothing.
    pub fn allocate_resume(
        &mut self,
        seq: SeqId,
        tokens: &[TokenId],
        salt: u64,
        ram: usize,
        k: usize,
    ) -> Result<(PrefixMatch, Vec<usize>), PageError> {
        assert!(self.recurrent.is_none(), "a sliding-window resume");
        let ps = self.page_size();
        let whole = self.full.lookup_prefix(tokens, salt);
        assert!(
            ram <= whole.pages.len() && ram <= k,
            "a resume of {ram} RAM pages"
        );
        let sliding = self.sliding.as_mut().expect("a sliding-window model");
        let no_room = || PageError::OutOfPages {
            needed: k - ram,
            available: 0,
        };
        // The sliding group first: it checks its room without changing anything.
        let fill = sliding
            .allocate_resume(seq, &whole.pages[..ram], k, &self.full)
            .ok_or_else(no_room)?;
        // A lookup covers at most (len - 1) / page_size pages.
        let upto = if ram < whole.pages.len() {
            ram * ps + 1
        } else {
            tokens.len()
        };
        let allocated = self
            .full
            .allocate(seq, &tokens[..upto], salt)
            .and_then(|m| {
                self.full.append_slots(seq, (k - ram) * ps)?;
                Ok(m)
            });
        match allocated {
            Ok(m) => Ok((m, fill)),
            Err(e) => {
                let _ = self.full.free(seq);
                if let Some(s) = self.sliding.as_mut() {
                    s.free(seq, &self.full);
                }
                Err(e)
            }
        }
    }

    /// Tokens that can be appended to `seq` now in every group.
    pub fn room(&self, seq: SeqId) -> usize {
        let ps = self.page_size();
        let held = self.full.n_tokens(seq).unwrap_or(0);
        let pages = self.full.page_table(seq).map_or(0, <[_]>::len);
        let full = pages * ps - held + self.full.n_available() * ps;
        let sliding = self.sliding.as_ref().map_or(usize::MAX, |s| s.room(seq));
        full.min(sliding)
    }

    /// Gives `seq`'s next `n` tokens a cell in every group (see
    /// [`PagePool::append_slots`]); the sliding group first releases the pages behind
    /// its window. All or nothing.
    pub fn append(&mut self, seq: SeqId, n: usize) -> Result<Cells, PageError> {
        if self.room(seq) < n {
            return Err(PageError::OutOfPages {
                needed: n.div_ceil(self.page_size()),
                available: self.n_available(),
            });
        }
        let full = self.full.append_slots(seq, n)?;
        let sliding = match self.sliding.as_mut() {
            Some(s) => s.append(seq, n, &self.full).expect("room was checked"),
            None => Vec::new(),
        };
        Ok(Cells { full, sliding })
    }

    /// The pages `seq`'s rows `start..end` attend over in the sliding group.
    pub fn sliding_window(&self, seq: SeqId, start: usize, end: usize) -> Option<GroupWindow> {
        let s = self.sliding.as_ref()?;
        let (pages, base) = s.window_pages(seq, start, end);
        Some(GroupWindow { pages, base })
    }

    /// Registers `seq`'s full pages covered by `tokens` (written) in the prefix cache
    /// and ties the sliding group's pages to them.
    pub fn commit(&mut self, seq: SeqId, tokens: &[TokenId]) -> Result<(), PageError> {
        self.full.commit_full_pages(seq, tokens)?;
        if let Some(s) = self.sliding.as_mut() {
            s.set_computed(seq, tokens.len());
            let n = tokens.len() / self.full.page_size();
            if s.tied_pages(seq) < n {
                let nodes = self.full.cached_pages(tokens, 0);
                s.commit(seq, &nodes, n, &self.full);
            }
        }
        Ok(())
    }

    /// Marks `n_tokens` of `seq` as a likely hit point for the sliding group (a
    /// prompt's end).
    pub fn add_checkpoint(&mut self, seq: SeqId, n_tokens: usize) {
        if let Some(s) = self.sliding.as_mut() {
            s.add_checkpoint(seq, n_tokens);
        }
    }

    /// After a step that left `seq`'s recurrent state just after `tokens` (whole
    /// pages, the last committed): takes a checkpoint there (see
    /// [`RecurrentStates::take_checkpoint`]); returns the copy to make now and the
    /// checkpoint's page hash. (Its page may be an equal twin's: a prompt that
    /// recomputed pages another one cached names them the same.)
    pub fn take_checkpoint(&mut self, seq: SeqId, tokens: &[TokenId]) -> Option<(StateCopy, u64)> {
        if tokens.is_empty() || !tokens.len().is_multiple_of(self.page_size()) {
            return None;
        }
        let hash = self.full.chain_hash(tokens, 0);
        let copy = self.recurrent.as_mut()?.take_checkpoint(seq, hash)?;
        Some((copy, hash))
    }

    /// Forgets the recurrent checkpoint of page hash `hash`, if cached.
    pub fn drop_checkpoint(&mut self, hash: u64) {
        if let Some(r) = self.recurrent.as_mut() {
            r.drop_checkpoint(hash);
        }
    }

    /// The recurrent group, mutably (the SSD tier's eviction log and restores).
    pub fn recurrent_mut(&mut self) -> Option<&mut RecurrentStates> {
        self.recurrent.as_mut()
    }

    /// Ends `seq`, dropping its references in every group (see [`PagePool::free`]).
    pub fn free(&mut self, seq: SeqId) -> Result<(), PageError> {
        // The sliding group checks its sidecars against the full pages' registration:
        // release it while those still hold.
        if let Some(s) = self.sliding.as_mut() {
            s.free(seq, &self.full);
        }
        self.free_state(seq);
        self.full.free(seq)
    }

    /// Frees `seq`'s state slot and forgets a set-up still pending for it.
    fn free_state(&mut self, seq: SeqId) {
        if let Some(r) = self.recurrent.as_mut() {
            if let Some(slot) = r.slot(seq) {
                self.state_inits.retain(|i| i.slot != slot);
            }
            r.free(seq);
        }
    }

    /// Ends `seq` like [`Self::free`], keeping its page `page_index` as a partial
    /// entry (see [`PagePool::free_keeping_tail`]).
    pub fn free_keeping_tail(
        &mut self,
        seq: SeqId,
        page_index: usize,
        tail: &[TokenId],
    ) -> Result<Option<PageId>, PageError> {
        let table = self.full.page_table(seq).map(<[_]>::to_vec);
        let kept = self.full.free_keeping_tail(seq, page_index, tail)?;
        if let Some(s) = self.sliding.as_mut() {
            // The kept page was the sequence's page `page_index`.
            let tail = kept.filter(|&p| table.as_ref().and_then(|t| t.get(page_index)) == Some(&p));
            s.free_keeping_tail(seq, tail.map(|p| (page_index, p)), &self.full);
        }
        self.free_state(seq);
        Ok(kept)
    }

    /// Shrinks `seq` to its first `n_tokens` tokens in every group.
    ///
    /// A recurrent state cannot be rolled back: with a recurrent group, only cells
    /// not yet computed may be dropped (the engine never truncates otherwise).
    pub fn truncate(&mut self, seq: SeqId, n_tokens: usize) -> Result<(), PageError> {
        self.full.truncate(seq, n_tokens)?;
        if let Some(s) = self.sliding.as_mut() {
            s.truncate(seq, n_tokens, &self.full);
        }
        Ok(())
    }

    /// Checks every group's invariants and that they agree on the sequences.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.full.check_invariants()?;
        if let Some(s) = &self.sliding {
            s.check_invariants()?;
        }
        if let Some(r) = &self.recurrent {
            r.check_invariants()?;
        }
        Ok(())
    }
}
