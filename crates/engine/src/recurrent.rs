//! The cache manager of a recurrent group: layers that carry a fixed-size state from
//! token to token instead of a K/V cell per token (Qwen3.5's gated-DeltaNet layers:
//! a short convolution's last inputs and a matrix state per head).
//!
//! A running sequence owns one **state slot** (its live state, advanced in place by
//! every step). A state cannot be rolled back, so reusing a prefix needs the state as
//! it was after exactly that prefix: a **checkpoint**, a copy of a live state into a
//! slot of its own, taken when a step ends on a page boundary. It is named by the
//! chained hash of the full page it ends (the name the page has in every tier), so it
//! stays valid while that page moves between RAM and the SSD tier, and it is evicted
//! least recently used first. A hit resumes from the deepest page of the match whose
//! checkpoint is cached: its state is copied into the new sequence's slot.
//!
//! Pure bookkeeping: the manager says which slots to copy where ([`StateCopy`]); the
//! runner copies the model's state rows. Where checkpoints are taken is the
//! scheduler's and the engine's choice (prompt ends, junctions, every N tokens): a
//! step must end on the page boundary for its state to be the checkpoint's.

use std::collections::HashMap;

use crate::lru::Lru;
use crate::pages::{PageId, PagePool, SeqId};

/// Index of a state slot.
pub type SlotId = u32;

/// A copy of one state slot's contents into another, for the runner to carry out
/// before (a hit's resume) or after (a checkpoint) the model step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateCopy {
    /// Slot copied from.
    pub from: SlotId,
    /// Slot copied to.
    pub to: SlotId,
}

/// A checkpoint evicted from RAM to make room: its slot still holds the state until
/// the slot is next written (the engine copies it to the SSD tier before that).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvictedState {
    /// The slot that held it.
    pub slot: SlotId,
    /// The chained hash of the page it ends.
    pub hash: u64,
}

/// What a slot holds.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// The sequence whose live state it is.
    live: Option<SeqId>,
    /// The chained hash of the full page whose end it is the checkpoint of.
    twin: Option<u64>,
    /// LRU stamp while it is a cached checkpoint.
    lru: Option<u64>,
}

/// Counters of a [`RecurrentStates`] group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecurrentStats {
    /// State slots in the group.
    pub n_slots: usize,
    /// Slots holding running sequences' live states.
    pub live: usize,
    /// Slots holding cached checkpoints (evictable).
    pub checkpoints: usize,
    /// Free slots.
    pub free: usize,
    /// Checkpoints taken.
    pub taken: u64,
    /// Sequences started from a cached checkpoint (prefix hits).
    pub hits: u64,
    /// Checkpoints evicted to make room.
    pub evicted: u64,
    /// Checkpoints dropped because a newer one replaced them (an answer's
    /// checkpoint moving on page by page) or their copy failed.
    pub dropped: u64,
}

/// State slots of one recurrent group (see the module docs).
#[derive(Debug)]
pub struct RecurrentStates {
    slots: Vec<Slot>,
    free: Vec<SlotId>,
    lru: Lru<SlotId>,
    /// Page hash -> the checkpoint at the page's end.
    checkpoints: HashMap<u64, SlotId>,
    /// Running sequence -> its live slot.
    seqs: HashMap<SeqId, SlotId>,
    /// Whether evictions are logged for the SSD tier.
    log_evictions: bool,
    evicted_log: Vec<EvictedState>,
    taken: u64,
    hits: u64,
    evicted: u64,
    dropped: u64,
}

impl RecurrentStates {
    /// A group of `n_slots` state slots.
    pub fn new(n_slots: usize) -> RecurrentStates {
        assert!(n_slots <= SlotId::MAX as usize);
        RecurrentStates {
            slots: vec![Slot::default(); n_slots],
            free: (0..n_slots as SlotId).rev().collect(),
            lru: Lru::new(),
            checkpoints: HashMap::new(),
            seqs: HashMap::new(),
            log_evictions: false,
            evicted_log: Vec::new(),
            taken: 0,
            hits: 0,
            evicted: 0,
            dropped: 0,
        }
    }

    /// The current counters.
    pub fn stats(&self) -> RecurrentStats {
        RecurrentStats {
            n_slots: self.slots.len(),
            live: self.seqs.len(),
            checkpoints: self.lru.len(),
            free: self.free.len(),
            taken: self.taken,
            hits: self.hits,
            evicted: self.evicted,
            dropped: self.dropped,
        }
    }

    /// Logs evicted checkpoints for [`Self::take_evicted`] (with an SSD tier).
    pub fn set_eviction_log(&mut self, on: bool) {
        self.log_evictions = on;
    }

    /// Checkpoints evicted since the last call; their slots hold the states until
    /// the next copy into them or step.
    pub fn take_evicted(&mut self) -> Vec<EvictedState> {
        std::mem::take(&mut self.evicted_log)
    }

    /// Slots obtainable now: free plus cached checkpoints.
    pub fn n_available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// `seq`'s live slot.
    pub fn slot(&self, seq: SeqId) -> Option<SlotId> {
        self.seqs.get(&seq).copied()
    }

    /// The cached checkpoint at the end of the page with chained hash `hash`.
    pub fn checkpoint(&self, hash: u64) -> Option<SlotId> {
        self.checkpoints.get(&hash).copied()
    }

    /// Every cached checkpoint: (page hash, slot), for persistence.
    pub fn checkpoints(&self) -> Vec<(u64, SlotId)> {
        self.checkpoints.iter().map(|(&h, &s)| (h, s)).collect()
    }

    /// Of a full-attention hit over `full_pages`, the most leading pages this group
    /// can resume after: the deepest page with a checkpoint at its end (0 when none).
    pub fn usable_hit(&self, full_pages: &[PageId], pool: &PagePool) -> usize {
        (1..=full_pages.len())
            .rev()
            .find(|&k| {
                pool.page_hash_of(full_pages[k - 1])
                    .is_some_and(|h| self.checkpoints.contains_key(&h))
            })
            .unwrap_or(0)
    }

    /// Gives new sequence `seq` a live slot; starting from the cached checkpoint of
    /// page hash `from` (a hit), also the copy that sets it up. `None` (nothing
    /// changed) when no slot can be had.
    ///
    /// # Panics
    /// If `from` names no cached checkpoint.
    pub fn allocate(&mut self, seq: SeqId, from: Option<u64>) -> Option<Option<StateCopy>> {
        assert!(
            !self.seqs.contains_key(&seq),
            "sequence {seq} already allocated"
        );
        let from = from.map(|h| self.checkpoint(h).expect("a cached checkpoint"));
        // The checkpoint itself must not be evicted for the live slot.
        let stamp = from.and_then(|s| self.slots[s as usize].lru.take());
        if let Some(stamp) = stamp {
            self.lru.remove(stamp);
        }
        let to = self.take_slot();
        if let Some(s) = from {
            self.cache(s);
        }
        let to = to?;
        self.slots[to as usize].live = Some(seq);
        self.seqs.insert(seq, to);
        if from.is_some() {
            self.hits += 1;
        }
        Some(from.map(|from| StateCopy { from, to }))
    }

    /// After a step that left `seq`'s state just after the last token of the full
    /// page with chained hash `hash`: takes a checkpoint there, unless one is cached
    /// already or no slot is free or evictable. Returns the copy to make after the
    /// step.
    pub fn take_checkpoint(&mut self, seq: SeqId, hash: u64) -> Option<StateCopy> {
        let from = self.slot(seq)?;
        if self.checkpoints.contains_key(&hash) {
            return None;
        }
        let to = self.take_slot()?;
        self.checkpoints.insert(hash, to);
        self.slots[to as usize].twin = Some(hash);
        self.cache(to);
        self.taken += 1;
        Some(StateCopy { from, to })
    }

    /// A slot for a checkpoint of page hash `hash` whose state the caller writes
    /// (read back from the SSD tier); `None` when one is cached already or no slot
    /// can be had.
    pub fn insert_checkpoint(&mut self, hash: u64) -> Option<SlotId> {
        if self.checkpoints.contains_key(&hash) {
            return None;
        }
        let to = self.take_slot()?;
        self.checkpoints.insert(hash, to);
        self.slots[to as usize].twin = Some(hash);
        self.cache(to);
        Some(to)
    }

    /// Forgets the cached checkpoint of page hash `hash`, if any (replaced by a newer
    /// one, or its copy failed), freeing its slot.
    pub fn drop_checkpoint(&mut self, hash: u64) {
        if let Some(s) = self.checkpoints.get(&hash).copied() {
            self.release(s);
            self.dropped += 1;
        }
    }

    /// Frees `seq`'s live slot (its checkpoints stay cached).
    pub fn free(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.remove(&seq) {
            self.slots[s as usize].live = None;
            self.free.push(s);
        }
    }

    fn cache(&mut self, s: SlotId) {
        self.slots[s as usize].lru = Some(self.lru.push(s));
    }

    /// Forgets checkpoint `s` and frees its slot.
    fn release(&mut self, s: SlotId) {
        let slot = &mut self.slots[s as usize];
        if let Some(hash) = slot.twin.take() {
            if self.checkpoints.get(&hash) == Some(&s) {
                self.checkpoints.remove(&hash);
            }
        }
        if let Some(stamp) = slot.lru.take() {
            self.lru.remove(stamp);
        }
        self.free.push(s);
    }

    /// A free slot, else the least recently used checkpoint's.
    fn take_slot(&mut self) -> Option<SlotId> {
        if self.free.is_empty() {
            let s = self.lru.pop_oldest()?;
            self.slots[s as usize].lru = None;
            if let (true, Some(hash)) = (self.log_evictions, self.slots[s as usize].twin) {
                self.evicted_log.push(EvictedState { slot: s, hash });
            }
            self.release(s);
            self.evicted += 1;
        }
        self.free.pop()
    }

    /// Checks the group's accounting (tests and debugging).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut free = vec![false; self.slots.len()];
        for &s in &self.free {
            if std::mem::replace(&mut free[s as usize], true) {
                return Err(format!("state slot {s} free twice"));
            }
        }
        for (i, s) in self.slots.iter().enumerate() {
            let states = [s.live.is_some(), s.lru.is_some(), free[i]];
            if states.iter().filter(|&&x| x).count() != 1 {
                return Err(format!(
                    "state slot {i} in {states:?} (live, checkpoint, free)"
                ));
            }
            if s.lru.is_some() != s.twin.is_some() {
                return Err(format!("state slot {i}: a checkpoint without its page"));
            }
            if let Some(h) = s.twin {
                if self.checkpoints.get(&h) != Some(&(i as SlotId)) {
                    return Err(format!("state slot {i}: checkpoint not indexed"));
                }
            }
        }
        if self.checkpoints.len() != self.lru.len() {
            return Err("checkpoint index and LRU disagree".into());
        }
        for (&seq, &s) in &self.seqs {
            if self.slots[s as usize].live != Some(seq) {
                return Err(format!("sequence {seq}'s slot {s} is not its own"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pages::TokenId;

    const PS: usize = 64;

    fn tokens(n: usize, salt: u32) -> Vec<TokenId> {
        (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) ^ salt)
            .collect()
    }

    fn hash_at(pool: &PagePool, t: &[TokenId], at: usize) -> u64 {
        let node = *pool.cached_pages(&t[..at], 0).last().unwrap();
        pool.page_hash_of(node).unwrap()
    }

    /// Computes `t` for `seq` in chunks ending on page boundaries, taking a
    /// checkpoint at each; returns the copies asked for.
    fn run(
        pool: &mut PagePool,
        st: &mut RecurrentStates,
        seq: SeqId,
        t: &[TokenId],
    ) -> Vec<StateCopy> {
        let m = pool.lookup_prefix(t, 0);
        let k = st.usable_hit(&m.pages, pool);
        let upto = if k < m.pages.len() {
            k * PS + 1
        } else {
            t.len()
        };
        pool.allocate(seq, &t[..upto], 0).unwrap();
        let from = (k > 0).then(|| pool.page_hash_of(m.pages[k - 1]).unwrap());
        let mut copies: Vec<StateCopy> = st.allocate(seq, from).unwrap().into_iter().collect();
        let mut at = k * PS;
        while at < t.len() {
            let n = (PS * 4).min(t.len() - at);
            pool.append_slots(seq, n).unwrap();
            at += n;
            pool.commit_full_pages(seq, &t[..at]).unwrap();
            if at.is_multiple_of(PS) {
                copies.extend(st.take_checkpoint(seq, hash_at(pool, t, at)));
            }
            st.check_invariants().unwrap();
        }
        copies
    }

    #[test]
    fn a_hit_resumes_from_the_deepest_checkpoint() {
        let mut pool = PagePool::new(256, PS);
        let mut st = RecurrentStates::new(64);
        let a = tokens(1000, 1);
        let copies = run(&mut pool, &mut st, 1, &a);
        // Checkpoints at 256, 512 and 768 (1000 is not a page boundary).
        assert_eq!(copies.len(), 3);
        assert!(copies.iter().all(|c| c.from == st.slot(1).unwrap()));
        st.free(1);
        pool.free(1).unwrap();
        // A prompt sharing 700 tokens resumes at 512, from the checkpoint taken there.
        let mut b = a[..700].to_vec();
        b.extend(tokens(100, 2));
        let m = pool.lookup_prefix(&b, 0);
        assert_eq!(m.pages.len(), 10);
        assert_eq!(st.usable_hit(&m.pages, &pool), 8);
        let at512 = st.checkpoint(hash_at(&pool, &a, 512)).unwrap();
        let copies = run(&mut pool, &mut st, 2, &b);
        assert_eq!(
            copies[0],
            StateCopy {
                from: at512,
                to: st.slot(2).unwrap()
            }
        );
        assert_eq!(st.stats().hits, 1);
        st.free(2);
        pool.free(2).unwrap();
        st.check_invariants().unwrap();
        assert_eq!(st.stats().live, 0);
    }

    #[test]
    fn checkpoints_are_evicted_for_live_states_and_logged() {
        let mut pool = PagePool::new(40, PS);
        let mut st = RecurrentStates::new(4);
        st.set_eviction_log(true);
        for seq in 1..=6u64 {
            run(&mut pool, &mut st, seq, &tokens(600, seq as u32));
            st.free(seq);
            pool.free(seq).unwrap();
            st.check_invariants().unwrap();
        }
        let s = st.stats();
        assert_eq!((s.live, s.free + s.checkpoints), (0, 4));
        assert!(s.evicted > 0);
        assert_eq!(st.take_evicted().len() as u64, s.evicted);
        // Two running sequences and two slots left: a third cannot start.
        let mut st = RecurrentStates::new(2);
        for seq in 1..=2 {
            assert!(st.allocate(seq, None).is_some());
        }
        assert!(st.allocate(3, None).is_none());
        st.check_invariants().unwrap();
    }

    #[test]
    fn checkpoints_outlive_their_ram_page_and_can_be_replaced() {
        // A checkpoint is named by its page's hash: the page may leave RAM (to the
        // SSD tier) and come back in another page; the checkpoint still fits.
        let mut st = RecurrentStates::new(3);
        st.allocate(1, None).unwrap();
        let c = st.take_checkpoint(1, 0xabc).unwrap();
        assert_eq!(st.checkpoint(0xabc), Some(c.to));
        assert!(st.take_checkpoint(1, 0xabc).is_none(), "taken once");
        let d = st.insert_checkpoint(0xdef).unwrap();
        assert_eq!(st.n_available(), 2);
        st.drop_checkpoint(0xabc);
        assert_eq!(st.checkpoint(0xabc), None);
        assert_eq!(st.stats().dropped, 1);
        assert_eq!(st.checkpoints(), [(0xdef, d)]);
        st.free(1);
        st.check_invariants().unwrap();
        assert_eq!(st.n_available(), 3);
    }
}
