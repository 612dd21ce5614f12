//! The cache manager of a recurrent group: layers that carry a fixed-size state from
//! token to token instead of a K/V cell per token (Qwen3.5's gated-DeltaNet layers:
//! a short convolution's last inputs and a matrix state per head).
//!
//! A running sequence owns one **state slot** (its live state, advanced in place by
//! every step). A state cannot be rolled back, so reusing a prefix needs the state as
//! it was after exactly that prefix: a **checkpoint**, a copy of a live state into a
//! slot of its own taken when a step ends on a page boundary, kept as the sidecar of
//! the full-attention page that ends there (like [`crate::sliding`]'s windows) and
//! evicted least recently used first. A hit resumes from the deepest page whose
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

/// What a slot holds.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// The sequence whose live state it is.
    live: Option<SeqId>,
    /// The full page (and its registration number) whose end it is the checkpoint of.
    twin: Option<(PageId, u64)>,
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
    /// Checkpoints evicted to make room.
    pub evicted: u64,
}

/// State slots of one recurrent group (see the module docs).
#[derive(Debug)]
pub struct RecurrentStates {
    slots: Vec<Slot>,
    free: Vec<SlotId>,
    lru: Lru<SlotId>,
    /// Full page -> the checkpoint at its end.
    checkpoints: HashMap<PageId, SlotId>,
    /// Running sequence -> its live slot.
    seqs: HashMap<SeqId, SlotId>,
    taken: u64,
    evicted: u64,
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
            taken: 0,
            evicted: 0,
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
            evicted: self.evicted,
        }
    }

    /// Slots obtainable now: free plus cached checkpoints.
    pub fn n_available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// `seq`'s live slot.
    pub fn slot(&self, seq: SeqId) -> Option<SlotId> {
        self.seqs.get(&seq).copied()
    }

    /// The checkpoint at the end of full page `full` while its registration lasts.
    fn checkpoint(&self, full: PageId, pool: &PagePool) -> Option<SlotId> {
        let &s = self.checkpoints.get(&full)?;
        let (twin, number) = self.slots[s as usize].twin?;
        let live = twin == full && pool.registration(full).is_some_and(|(n, _)| n == number);
        live.then_some(s)
    }

    /// Of a full-attention hit over `full_pages`, the most leading pages this group
    /// can resume after: the deepest page with a checkpoint at its end (0 when none).
    pub fn usable_hit(&self, full_pages: &[PageId], pool: &PagePool) -> usize {
        (1..=full_pages.len())
            .rev()
            .find(|&k| self.checkpoint(full_pages[k - 1], pool).is_some())
            .unwrap_or(0)
    }

    /// Gives new sequence `seq` a live slot; with a hit of `k` pages (from
    /// [`Self::usable_hit`]), the copy that starts it from the checkpoint there.
    /// `None` (nothing changed) when no slot can be had.
    pub fn allocate(
        &mut self,
        seq: SeqId,
        full_pages: &[PageId],
        k: usize,
        pool: &PagePool,
    ) -> Option<Option<StateCopy>> {
        assert!(
            !self.seqs.contains_key(&seq),
            "sequence {seq} already allocated"
        );
        let from = (k > 0).then(|| {
            self.checkpoint(full_pages[k - 1], pool)
                .expect("usable_hit")
        });
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
        Some(from.map(|from| StateCopy { from, to }))
    }

    /// After a step that left `seq`'s state just after the last token of full page
    /// `full` (registered): takes a checkpoint there, unless one is cached already or
    /// no slot is free or evictable. Returns the copy to make after the step.
    pub fn take_checkpoint(
        &mut self,
        seq: SeqId,
        full: PageId,
        pool: &PagePool,
    ) -> Option<StateCopy> {
        let from = self.slot(seq)?;
        if self.checkpoint(full, pool).is_some() {
            return None;
        }
        let (number, _) = pool.registration(full)?;
        let to = self.take_slot()?;
        if let Some(old) = self.checkpoints.insert(full, to) {
            self.drop_checkpoint(old);
        }
        self.slots[to as usize].twin = Some((full, number));
        self.cache(to);
        self.taken += 1;
        Some(StateCopy { from, to })
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
    fn drop_checkpoint(&mut self, s: SlotId) {
        let slot = &mut self.slots[s as usize];
        if let Some((full, _)) = slot.twin.take() {
            if self.checkpoints.get(&full) == Some(&s) {
                self.checkpoints.remove(&full);
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
            self.drop_checkpoint(s);
            self.evicted += 1;
        }
        self.free.pop()
    }

    /// Checks the group's accounting (tests and debugging).
    pub fn check_invariants(&self) -> Result<(), String> {
        for (i, s) in self.slots.iter().enumerate() {
            let free = self.free.contains(&(i as SlotId));
            let states = [s.live.is_some(), s.lru.is_some(), free];
            if states.iter().filter(|&&x| x).count() != 1 {
                return Err(format!(
                    "state slot {i} in {states:?} (live, checkpoint, free)"
                ));
            }
            if s.lru.is_some() != s.twin.is_some() {
                return Err(format!("state slot {i}: a checkpoint without its page"));
            }
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
        let mut copies: Vec<StateCopy> = st
            .allocate(seq, &m.pages, k, pool)
            .unwrap()
            .into_iter()
            .collect();
        let mut at = k * PS;
        while at < t.len() {
            let n = (PS * 4).min(t.len() - at);
            pool.append_slots(seq, n).unwrap();
            at += n;
            pool.commit_full_pages(seq, &t[..at]).unwrap();
            if at.is_multiple_of(PS) {
                let node = *pool.cached_pages(&t[..at], 0).last().unwrap();
                copies.extend(st.take_checkpoint(seq, node, pool));
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
        let copies = run(&mut pool, &mut st, 2, &b);
        assert_eq!(
            copies[0],
            StateCopy {
                from: copies_of(&st, &pool, &a, 512),
                to: st.slot(2).unwrap()
            }
        );
        st.free(2);
        pool.free(2).unwrap();
        st.check_invariants().unwrap();
        assert_eq!(st.stats().live, 0);
    }

    fn copies_of(st: &RecurrentStates, pool: &PagePool, t: &[TokenId], at: usize) -> SlotId {
        let node = *pool.cached_pages(&t[..at], 0).last().unwrap();
        st.checkpoint(node, pool).unwrap()
    }

    #[test]
    fn checkpoints_are_evicted_for_live_states_and_go_stale_with_their_page() {
        let mut pool = PagePool::new(40, PS);
        let mut st = RecurrentStates::new(4);
        for seq in 1..=6u64 {
            run(&mut pool, &mut st, seq, &tokens(600, seq as u32));
            st.free(seq);
            pool.free(seq).unwrap();
            st.check_invariants().unwrap();
        }
        let s = st.stats();
        assert_eq!((s.live, s.free + s.checkpoints), (0, 4));
        assert!(s.evicted > 0);
        // Two running sequences and two slots left: a third cannot start.
        let mut pool = PagePool::new(40, PS);
        let mut st = RecurrentStates::new(2);
        for seq in 1..=2 {
            pool.allocate(seq, &[], 0).unwrap();
            assert!(st.allocate(seq, &[], 0, &pool).is_some());
        }
        assert!(st.allocate(3, &[], 0, &pool).is_none());
        st.check_invariants().unwrap();
    }
}
