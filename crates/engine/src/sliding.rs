//! The cache manager of a sliding-window group: pages of the layers that attend only
//! to the last `window` positions (Gemma 3: 5 of every 6 layers, 512 tokens).
//!
//! Page `j` of a sequence holds the same tokens as page `j` of its full-attention
//! table ([`crate::pages::PagePool`]), in this group's own pool of cells. A running
//! sequence holds only the pages its next rows can see: pages wholly behind the
//! window are released as it advances, so its memory stops growing at about one
//! window plus one step of tokens, whatever its length (llama.cpp's SWA cache, by
//! contrast, is one ring per slot).
//!
//! Prefix reuse: a hit of `h` tokens on the full-attention pages is usable here only
//! if this group still has the pages that position `h` sees. A released page whose
//! full-attention twin is registered in the prefix cache may be kept as that page's
//! *sidecar* (unreferenced, evicted least recently used first), but only where a
//! later hit is likely to need it, so that cached windows do not grow back to a full
//! cache: the window (and two pages more) before each multiple of [`SlidingPages::checkpoint_tokens`]
//! tokens, the window before a prompt's last whole page (the next turn of the same
//! conversation forks there or later), the window at a sequence's end, and the window
//! before a junction of the prefix tree (a cached page under which two prompts part:
//! the first prompt that forks there computes from the checkpoint before it, later
//! ones hit it). Every
//! other released page goes straight back to the free list, which hands out the most
//! recently freed page first, so the memory a process touches stays near what it
//! holds (host KV memory is committed on first write).
//!
//! A sidecar is tied to its full page's registration (its number from
//! [`PagePool::registration`]): when the full page leaves the cache, the sidecar is
//! stale and is dropped the next time it is looked at or evicted.
//!
//! With an SSD tier, sidecars leave RAM for it, named by their full page's chained
//! hash (which the tie records): a sidecar evicted from this group is reported by
//! [`SlidingPages::take_evicted`], and one whose full page is evicted is found by
//! [`SlidingPages::take_evicted_sidecar`]. A prefix that continues on disk resumes
//! with [`SlidingPages::allocate_resume`]: the window it needs from RAM sidecars
//! where they are, in new pages the caller fills from the tier elsewhere. A tied
//! page's cells are never written again, so whatever the tie's state, they hold
//! the window its hash names.

use std::collections::HashMap;

use crate::lru::Lru;
#[cfg(test)]
use crate::pages::TokenId;
use crate::pages::{PageId, PagePool, SeqId};

/// Pages kept before a checkpoint beyond those its window needs, so a hit up to this
/// many pages before it is served too.
const CHECKPOINT_SLACK_PAGES: usize = 2;

/// The full-attention page a sliding page is the sidecar of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Twin {
    full: PageId,
    /// The full page's registration number when tied.
    registration: u64,
    /// The full page's chained hash, the sidecar's name in the SSD tier; `None` for
    /// a partial cache entry, which has no name there.
    hash: Option<u64>,
}

/// A sidecar that left this group's cache (see [`SlidingPages::take_evicted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvictedWindow {
    /// The page; its cells keep the window's KV until the page is written again
    /// (by the next model step at the earliest).
    pub page: PageId,
    /// The chained hash of the full page it was the sidecar of.
    pub hash: u64,
}

/// A page of the group.
#[derive(Debug, Clone, Copy, Default)]
struct Page {
    refs: u32,
    /// The full-attention page this page is the sidecar of.
    twin: Option<Twin>,
    /// Position in the LRU while cached (refs == 0 and a sidecar).
    lru: Option<u64>,
}

/// A sequence's pages in this group: `table[j]` holds its tokens
/// `j * page_size .. (j + 1) * page_size`, `None` where released (or never held).
#[derive(Debug, Default)]
struct SeqPages {
    table: Vec<Option<PageId>>,
    /// Tokens with a cell.
    n_tokens: usize,
    /// Tokens whose KV is written (the first row of the next step): pages are
    /// released behind what it sees, not what later rows see, since several chunks of
    /// one sequence may be planned for one step.
    computed: usize,
    /// Token counts at which a later hit is likely (see the module docs).
    checkpoints: Vec<usize>,
    /// Leading pages already passed to [`SlidingPages::commit`].
    tied: usize,
    /// The registered pages its prefix runs through, from page 0 (as last committed).
    nodes: Vec<PageId>,
}

/// Counters of a [`SlidingPages`] group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlidingStats {
    /// Pages in the group.
    pub n_pages: usize,
    /// Pages held by sequences.
    pub in_use: usize,
    /// Unreferenced sidecars kept for prefix hits (evictable).
    pub cached: usize,
    /// Free pages.
    pub free: usize,
    /// Pages released behind a running sequence's window.
    pub released_pages: u64,
    /// Prefix hits shortened because this group lacked a window's pages.
    pub shortened_hits: u64,
}

/// Pages of one sliding-window group (see the module docs).
#[derive(Debug)]
pub struct SlidingPages {
    window: usize,
    page_size: usize,
    checkpoint_tokens: usize,
    pages: Vec<Page>,
    /// Free pages; the last one is handed out first.
    free: Vec<PageId>,
    /// Cached sidecars by LRU stamp (oldest first).
    lru: Lru<PageId>,
    /// Full page -> its sidecar.
    sidecars: HashMap<PageId, PageId>,
    seqs: HashMap<SeqId, SeqPages>,
    released: u64,
    shortened: u64,
    /// Sidecars evicted since the last [`SlidingPages::take_evicted`], while on.
    evicted: Option<Vec<EvictedWindow>>,
}

impl SlidingPages {
    /// A group of `n_pages` pages of `page_size` tokens for layers with a window of
    /// `window` positions; keeps the window before every multiple of
    /// `checkpoint_tokens` tokens of a cached prefix (0: none).
    pub fn new(
        n_pages: usize,
        page_size: usize,
        window: usize,
        checkpoint_tokens: usize,
    ) -> SlidingPages {
        assert!(page_size > 0 && window > 0 && n_pages <= PageId::MAX as usize);
        SlidingPages {
            window,
            page_size,
            checkpoint_tokens,
            pages: vec![Page::default(); n_pages],
            // Page 0 is handed out first.
            free: (0..n_pages as PageId).rev().collect(),
            lru: Lru::new(),
            sidecars: HashMap::new(),
            seqs: HashMap::new(),
            released: 0,
            shortened: 0,
            evicted: None,
        }
    }

    /// Turns the eviction log on or off (off by default; turning it off clears it).
    /// While on, every sidecar taken from the cache for reuse is kept for
    /// [`Self::take_evicted`].
    pub fn set_eviction_log(&mut self, on: bool) {
        self.evicted = on.then(Vec::new);
    }

    /// Whether evicted sidecars wait in the log (their KV not yet copied out).
    pub fn has_pending_evictions(&self) -> bool {
        self.evicted.as_ref().is_some_and(|l| !l.is_empty())
    }

    /// The free pages (neither in use nor cached as a sidecar), sorted.
    pub fn free_pages(&self) -> Vec<PageId> {
        let mut f = self.free.clone();
        f.sort_unstable();
        f
    }

    /// The sidecars evicted since the last call (to copy to a second tier before
    /// the next model step writes their pages).
    pub fn take_evicted(&mut self) -> Vec<EvictedWindow> {
        self.evicted
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The window in positions.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Tokens between kept windows of a cached prefix (0: none).
    pub fn checkpoint_tokens(&self) -> usize {
        self.checkpoint_tokens
    }

    /// Pages in the group.
    pub fn n_pages(&self) -> usize {
        self.pages.len()
    }

    /// Pages obtainable now: free plus cached.
    pub fn n_available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// First page a row at position `pos` sees.
    pub fn first_page_seen(&self, pos: usize) -> usize {
        (pos + 1).saturating_sub(self.window) / self.page_size
    }

    /// The current counters.
    pub fn stats(&self) -> SlidingStats {
        // Every page is held, cached or free (see `check_invariants`).
        let in_use = self.pages.len() - self.lru.len() - self.free.len();
        SlidingStats {
            n_pages: self.pages.len(),
            in_use,
            cached: self.lru.len(),
            free: self.free.len(),
            released_pages: self.released,
            shortened_hits: self.shortened,
        }
    }

    /// The page `seq` holds for its tokens `j * page_size ..`, if it still holds it.
    pub fn page_at(&self, seq: SeqId, j: usize) -> Option<PageId> {
        *self.seqs.get(&seq)?.table.get(j)?
    }

    /// The sidecar of full page `full` while its registration lasts.
    pub fn sidecar(&self, full: PageId, pool: &PagePool) -> Option<PageId> {
        let &p = self.sidecars.get(&full)?;
        let t = self.pages[p as usize].twin?;
        let live = t.full == full && Self::registered(t, pool);
        live.then_some(p)
    }

    /// Whether the registration `t` was tied to still holds.
    fn registered(t: Twin, pool: &PagePool) -> bool {
        pool.registration(t.full)
            .is_some_and(|(n, _)| n == t.registration)
    }

    /// The sidecar of full page `full`, which just left the prefix cache under
    /// `hash`, if this group still has it (its cells hold the window `hash` names,
    /// for a second tier to copy before the next model step). A cached one is freed
    /// (no RAM hit can use it any more); one a sequence holds stays held.
    pub fn take_evicted_sidecar(&mut self, full: PageId, hash: u64) -> Option<PageId> {
        let &p = self.sidecars.get(&full)?;
        let t = self.pages[p as usize].twin?;
        if t.full != full || t.hash != Some(hash) {
            return None;
        }
        if self.pages[p as usize].lru.is_some() {
            self.detach(p);
        }
        Some(p)
    }

    /// Starts new sequence `seq` at page `k` of a prefix whose leading full pages
    /// `ram` are cached (the pages after them up to `k` are read back from another
    /// tier): it holds, of the pages position `k * page_size` sees, the live
    /// sidecars of `ram`, and new pages for the others. Returns the indices of the
    /// new pages, whose cells the caller must fill (a window read back) before the
    /// sequence runs; `None`, changing nothing, when the group has too few pages.
    pub fn allocate_resume(
        &mut self,
        seq: SeqId,
        ram: &[PageId],
        k: usize,
        pool: &PagePool,
    ) -> Option<Vec<usize>> {
        assert!(
            !self.seqs.contains_key(&seq),
            "sequence {seq} already allocated"
        );
        assert!(ram.len() <= k, "{} RAM pages beyond page {k}", ram.len());
        let first = self.first_page_seen(k * self.page_size);
        let seen: Vec<(usize, Option<PageId>)> = (first..k)
            .map(|j| (j, ram.get(j).and_then(|&f| self.sidecar(f, pool))))
            .collect();
        let new = seen.iter().filter(|(_, p)| p.is_none()).count();
        let revived = seen
            .iter()
            .filter_map(|&(_, p)| p)
            .filter(|&p| self.pages[p as usize].lru.is_some())
            .count();
        if new + revived > self.n_available() {
            return None;
        }
        let mut table = vec![None; k];
        // Sidecars first: taking new pages may evict cached ones.
        for &(j, p) in &seen {
            if let Some(p) = p {
                self.acquire(p);
                table[j] = Some(p);
            }
        }
        let mut fill = Vec::with_capacity(new);
        for &(j, p) in &seen {
            if p.is_none() {
                let p = self.take_page().expect("availability was checked");
                self.pages[p as usize].refs = 1;
                table[j] = Some(p);
                fill.push(j);
            }
        }
        let n_tokens = k * self.page_size;
        let sp = SeqPages {
            table,
            n_tokens,
            computed: n_tokens,
            checkpoints: Vec::new(),
            // Its pages from the other tier are tied once committed.
            tied: 0,
            nodes: ram.to_vec(),
        };
        self.seqs.insert(seq, sp);
        Some(fill)
    }

    /// Of a full-attention hit over `full_pages` (a prefix's pages in order), the
    /// most leading pages whose hit this group can serve: it holds, for the first
    /// position after them, every page that position sees.
    pub fn usable_hit(&self, full_pages: &[PageId], pool: &PagePool) -> usize {
        let mut k = full_pages.len();
        'shrink: while k > 0 {
            let first = self.first_page_seen(k * self.page_size);
            for j in (first..k).rev() {
                if self.sidecar(full_pages[j], pool).is_none() {
                    // No hit covering page j can be served: try ending before it.
                    k = j;
                    continue 'shrink;
                }
            }
            break;
        }
        k
    }

    /// Gives new sequence `seq` the sidecars of the first `k` pages of a hit (those its
    /// next row sees; see [`Self::usable_hit`]).
    pub fn allocate(&mut self, seq: SeqId, full_pages: &[PageId], k: usize, pool: &PagePool) {
        assert!(
            !self.seqs.contains_key(&seq),
            "sequence {seq} already allocated"
        );
        if k < full_pages.len() {
            self.shortened += 1;
        }
        let mut sp = SeqPages {
            table: vec![None; k],
            n_tokens: k * self.page_size,
            computed: k * self.page_size,
            checkpoints: Vec::new(),
            tied: k,
            nodes: full_pages[..k].to_vec(),
        };
        let first = self.first_page_seen(k * self.page_size);
        for (j, &full) in full_pages.iter().enumerate().take(k).skip(first) {
            let p = self.sidecar(full, pool).expect("usable_hit checked");
            self.acquire(p);
            sp.table[j] = Some(p);
        }
        self.seqs.insert(seq, sp);
    }

    /// Whether `seq` is allocated.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// Marks `n_tokens` as a point where `seq`'s prefix is likely to be hit later:
    /// the window before it is kept when its pages are released.
    pub fn add_checkpoint(&mut self, seq: SeqId, n_tokens: usize) {
        if let Some(sp) = self.seqs.get_mut(&seq) {
            sp.checkpoints.push(n_tokens);
        }
    }

    /// Records that `seq`'s first `n_computed` tokens are written (after a step).
    pub fn set_computed(&mut self, seq: SeqId, n_computed: usize) {
        if let Some(sp) = self.seqs.get_mut(&seq) {
            sp.computed = n_computed.min(sp.n_tokens);
        }
    }

    /// Appends `n` token cells to `seq` (allocated): releases the pages wholly behind
    /// what its first row still to compute sees, then takes pages for the new tokens. Returns the
    /// cells, or `None` (nothing changed but the releases) when the group has too
    /// few pages.
    pub fn append(&mut self, seq: SeqId, n: usize, pool: &PagePool) -> Option<Vec<usize>> {
        let ps = self.page_size;
        let sp = &self.seqs[&seq];
        let start = sp.n_tokens;
        self.release_behind(seq, self.first_page_seen(sp.computed), pool);
        let held = self.seqs[&seq].table.len();
        let end_page = (start + n).div_ceil(ps);
        let new_pages = end_page.saturating_sub(held);
        if new_pages > self.n_available() {
            return None;
        }
        for _ in 0..new_pages {
            let p = self.take_page().expect("availability was checked");
            self.pages[p as usize].refs = 1;
            self.seqs
                .get_mut(&seq)
                .expect("allocated")
                .table
                .push(Some(p));
        }
        let sp = self.seqs.get_mut(&seq).expect("allocated");
        sp.n_tokens = start + n;
        let cells = (start..start + n)
            .map(|t| sp.table[t / ps].expect("held") as usize * ps + t % ps)
            .collect();
        Some(cells)
    }

    /// The pages `seq` holds for rows `start..end` to attend over: the first page their
    /// first row sees up to the page of `end - 1`, in order, with the position of the
    /// first page's first token.
    pub fn window_pages(&self, seq: SeqId, start: usize, end: usize) -> (Vec<PageId>, usize) {
        let sp = &self.seqs[&seq];
        let first = self.first_page_seen(start);
        let pages = sp.table[first..end.div_ceil(self.page_size)]
            .iter()
            .map(|p| p.expect("pages in the window are held"))
            .collect();
        (pages, first * self.page_size)
    }

    /// After `seq`'s first `n_pages` full pages were committed to the prefix cache:
    /// `nodes` are the registered pages its prefix now runs through (its own or an
    /// equal twin's), from page 0 (fewer than `n_pages` where its chain broke). Ties
    /// this group's pages to those that have no sidecar yet.
    pub fn commit(&mut self, seq: SeqId, nodes: &[PageId], n_pages: usize, pool: &PagePool) {
        let Some(sp) = self.seqs.get_mut(&seq) else {
            return;
        };
        // Up to `n_pages` even where the chain broke: no new lookup until the next page.
        sp.tied = sp.tied.max(n_pages);
        sp.nodes.clear();
        sp.nodes.extend_from_slice(nodes);
        let sp = &self.seqs[&seq];
        let pairs: Vec<(PageId, PageId)> = (0..nodes.len().min(sp.table.len()))
            .filter_map(|j| Some((nodes[j], sp.table[j]?)))
            .filter(|&(node, p)| {
                self.pages[p as usize].twin.is_none() && self.sidecar(node, pool).is_none()
            })
            .collect();
        for (node, p) in pairs {
            let (registration, _) = pool.registration(node).expect("nodes are registered");
            if let Some(old) = self.sidecars.insert(node, p) {
                self.detach(old);
            }
            self.pages[p as usize].twin = Some(Twin {
                full: node,
                registration,
                hash: pool.page_hash_of(node),
            });
        }
    }

    /// Leading pages of `seq` already tied to the prefix cache (0 when unknown).
    pub fn tied_pages(&self, seq: SeqId) -> usize {
        self.seqs.get(&seq).map_or(0, |s| s.tied)
    }

    /// Tokens that can be appended to `seq` now: room in its pages plus every free,
    /// cached or releasable page.
    pub fn room(&self, seq: SeqId) -> usize {
        let Some(sp) = self.seqs.get(&seq) else {
            return self.n_available() * self.page_size;
        };
        let first = self.first_page_seen(sp.computed).min(sp.table.len());
        let releasable = sp.table[..first].iter().filter(|p| p.is_some()).count();
        (sp.table.len() + self.n_available() + releasable) * self.page_size - sp.n_tokens
    }

    /// Frees `seq`'s pages; those that serve a hit at its end or a checkpoint stay as
    /// sidecars.
    pub fn free(&mut self, seq: SeqId, pool: &PagePool) {
        self.free_keeping_tail(seq, None, pool);
    }

    /// Like [`Self::free`]; with `tail = Some((j, full))`, the page `seq` holds for its
    /// page `j` also stays, as the sidecar of `full`: the partial cache entry kept of
    /// that page (see [`PagePool::free_keeping_tail`]), whose cells are copied with
    /// their sliding cells.
    pub fn free_keeping_tail(
        &mut self,
        seq: SeqId,
        tail: Option<(usize, PageId)>,
        pool: &PagePool,
    ) {
        let Some(mut sp) = self.seqs.remove(&seq) else {
            return;
        };
        if let Some((j, full)) = tail {
            let number = pool.registration(full).map(|(n, _)| n);
            if let (Some(Some(p)), Some(registration)) = (sp.table.get(j).copied(), number) {
                if self.pages[p as usize].twin.is_none() && self.sidecar(full, pool).is_none() {
                    if let Some(old) = self.sidecars.insert(full, p) {
                        self.detach(old);
                    }
                    // A partial entry: its window is part of a page, kept in RAM only.
                    self.pages[p as usize].twin = Some(Twin {
                        full,
                        registration,
                        hash: None,
                    });
                }
                sp.checkpoints.push((j + 1) * self.page_size);
            }
        }
        sp.checkpoints
            .push(sp.n_tokens / self.page_size * self.page_size);
        let table = std::mem::take(&mut sp.table);
        for (j, p) in table.into_iter().enumerate() {
            if let Some(p) = p {
                let keep = self.keeps(&sp, j, pool);
                self.release(p, keep, pool);
            }
        }
    }

    /// Shrinks `seq` to its first `n_tokens` tokens.
    pub fn truncate(&mut self, seq: SeqId, n_tokens: usize, pool: &PagePool) {
        let ps = self.page_size;
        let Some(sp) = self.seqs.get_mut(&seq) else {
            return;
        };
        let cut = n_tokens.div_ceil(ps);
        let dropped: Vec<PageId> = sp
            .table
            .drain(cut.min(sp.table.len())..)
            .flatten()
            .collect();
        sp.n_tokens = n_tokens.min(sp.n_tokens);
        sp.computed = sp.computed.min(sp.n_tokens);
        for p in dropped {
            self.release(p, false, pool);
        }
    }

    /// Whether page `j` of `sp` is in the window before one of its checkpoints or a
    /// multiple of the checkpoint interval.
    fn keeps(&self, sp: &SeqPages, j: usize, pool: &PagePool) -> bool {
        let ps = self.page_size;
        // A hit a little before a checkpoint needs a page or two more: the next turn's
        // prompt may part from this one inside its last pages.
        let sees = |c: usize| c > j * ps && self.first_page_seen(c) <= j + CHECKPOINT_SLACK_PAGES;
        if sp.checkpoints.iter().any(|&c| sees(c)) {
            return true;
        }
        // A junction: a cached page of this prefix under which two prompts part, so a
        // third one sharing the prefix is likely (agents with one system prompt).
        let last = (j + 1 + self.window.div_ceil(ps) + CHECKPOINT_SLACK_PAGES).min(sp.nodes.len());
        if (j + 1..=last).any(|m| sees(m * ps) && pool.n_children(sp.nodes[m - 1]) >= 2) {
            return true;
        }
        let k = self.checkpoint_tokens;
        // The first multiple of k at or after the page's end.
        // The first multiple of k at or after the page's end, if the sequence got
        // there (a page released behind the window always did).
        k > 0 && {
            let c = ((j + 1) * ps).next_multiple_of(k);
            c <= sp.n_tokens && sees(c)
        }
    }

    fn release_behind(&mut self, seq: SeqId, first_seen: usize, pool: &PagePool) {
        let sp = self.seqs.get_mut(&seq).expect("allocated");
        let upto = first_seen.min(sp.table.len());
        let gone: Vec<(usize, PageId)> = (0..upto)
            .filter_map(|j| Some((j, sp.table[j].take()?)))
            .collect();
        for (j, p) in gone {
            let keep = self.keeps(&self.seqs[&seq], j, pool);
            self.release(p, keep, pool);
            self.released += 1;
        }
    }

    fn acquire(&mut self, p: PageId) {
        let pg = &mut self.pages[p as usize];
        if let Some(stamp) = pg.lru.take() {
            self.lru.remove(stamp);
        }
        pg.refs += 1;
    }

    /// Drops a reference; an unreferenced page stays cached if `keep` and it is a
    /// live sidecar, else it is freed.
    fn release(&mut self, p: PageId, keep: bool, pool: &PagePool) {
        let pg = &mut self.pages[p as usize];
        pg.refs -= 1;
        if pg.refs > 0 {
            return;
        }
        let live = pg.twin.is_some_and(|t| Self::registered(t, pool));
        if keep && live {
            self.pages[p as usize].lru = Some(self.lru.push(p));
        } else {
            self.detach(p);
            self.free.push(p);
        }
    }

    /// Unties `p` from its full page (it stays where it is: held, cached or free).
    fn detach(&mut self, p: PageId) {
        if let Some(t) = self.pages[p as usize].twin.take() {
            if self.sidecars.get(&t.full) == Some(&p) {
                self.sidecars.remove(&t.full);
            }
        }
        // A detached cached page is no use to anyone.
        if let Some(stamp) = self.pages[p as usize].lru.take() {
            self.lru.remove(stamp);
            self.free.push(p);
        }
    }

    /// A free page, else the least recently used cached sidecar (logged while the
    /// eviction log is on: stale or not, its cells hold the window its hash names).
    fn take_page(&mut self) -> Option<PageId> {
        if let Some(p) = self.free.pop() {
            return Some(p);
        }
        let p = self.lru.pop_oldest()?;
        self.pages[p as usize].lru = None;
        let hash = self.pages[p as usize].twin.and_then(|t| t.hash);
        if let (Some(log), Some(hash)) = (self.evicted.as_mut(), hash) {
            log.push(EvictedWindow { page: p, hash });
        }
        self.detach(p);
        Some(p)
    }

    /// Checks the group's accounting (tests and debugging).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut refs = vec![0u32; self.pages.len()];
        for sp in self.seqs.values() {
            for p in sp.table.iter().flatten() {
                refs[*p as usize] += 1;
            }
        }
        for (i, pg) in self.pages.iter().enumerate() {
            if pg.refs != refs[i] {
                return Err(format!(
                    "sliding page {i}: {} refs, {} holders",
                    pg.refs, refs[i]
                ));
            }
        }
        let free: std::collections::HashSet<_> = self.free.iter().copied().collect();
        if free.len() != self.free.len() {
            return Err("a sliding page is free twice".into());
        }
        for (i, pg) in self.pages.iter().enumerate() {
            let states = [pg.refs > 0, pg.lru.is_some(), free.contains(&(i as PageId))];
            if states.iter().filter(|&&s| s).count() != 1 {
                return Err(format!(
                    "sliding page {i} in {states:?} (held, cached, free)"
                ));
            }
            if pg.lru.is_some() && pg.twin.is_none() {
                return Err(format!("sliding page {i} cached without a twin"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PS: usize = 64;

    /// Runs sequence `seq` over `tokens` in chunks of `chunk` through both groups,
    /// committing as a step would; checks what the sliding group holds meanwhile.
    fn run(
        pool: &mut PagePool,
        sl: &mut SlidingPages,
        seq: SeqId,
        tokens: &[TokenId],
        chunk: usize,
    ) {
        let m = pool.lookup_prefix(tokens, 0);
        let k = sl.usable_hit(&m.pages, pool);
        let upto = if k < m.pages.len() {
            k * PS + 1
        } else {
            tokens.len()
        };
        let m2 = pool.allocate(seq, &tokens[..upto], 0).unwrap();
        assert_eq!(m2.pages.len(), k);
        sl.allocate(seq, &m.pages, k, pool);
        let mut at = k * PS;
        while at < tokens.len() {
            let n = chunk.min(tokens.len() - at);
            pool.append_slots(seq, n).unwrap();
            let cells = sl.append(seq, n, pool).unwrap();
            assert_eq!(cells.len(), n);
            let (pages, base) = sl.window_pages(seq, at, at + n);
            // The window starts at the first page the chunk's first row sees.
            assert_eq!(base, (at + 1).saturating_sub(sl.window()) / PS * PS);
            assert_eq!(pages.len(), (at + n).div_ceil(PS) - base / PS);
            at += n;
            pool.commit_full_pages(seq, &tokens[..at]).unwrap();
            let nodes = pool.cached_pages(&tokens[..at], 0);
            sl.set_computed(seq, at);
            sl.commit(seq, &nodes, at / PS, pool);
            let held = sl.seqs[&seq].table.iter().flatten().count();
            assert!(
                held <= (sl.window() + chunk).div_ceil(PS) + 1,
                "{held} pages held"
            );
            sl.check_invariants().unwrap();
        }
    }

    fn tokens(n: usize, salt: u32) -> Vec<TokenId> {
        (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) ^ salt)
            .collect()
    }

    #[test]
    fn a_long_sequence_holds_one_window_and_keeps_checkpoints() {
        let mut pool = PagePool::new(1024, PS);
        let mut sl = SlidingPages::new(1024, PS, 512, 4096);
        let t = tokens(10_000, 1);
        run(&mut pool, &mut sl, 1, &t, 512);
        sl.free(1, &pool);
        pool.free(1).unwrap();
        sl.check_invariants().unwrap();
        let st = sl.stats();
        assert_eq!(st.in_use, 0);
        // Kept: the windows (plus slack) before 4096, 8192 and the end (9984).
        let per = 512 / PS + CHECKPOINT_SLACK_PAGES;
        assert_eq!(st.cached, 3 * per, "{st:?}");
        // The same tokens again: the whole prefix is a hit (up to the last page).
        let m = pool.lookup_prefix(&t, 0);
        assert_eq!(m.pages.len(), (10_000 - 1) / PS);
        assert_eq!(sl.usable_hit(&m.pages, &pool), m.pages.len());
        // A prompt that forks at 6000 hits the checkpoint at 4096, not more.
        let mut fork = t[..6000].to_vec();
        fork.extend(tokens(500, 2));
        let m = pool.lookup_prefix(&fork, 0);
        assert_eq!(m.pages.len(), 6000 / PS);
        assert_eq!(sl.usable_hit(&m.pages, &pool) * PS, 4096);
        // A prompt that parts from the first inside its last two pages is served.
        let mut next = t[..9900].to_vec();
        next.extend(tokens(300, 3));
        let m = pool.lookup_prefix(&next, 0);
        assert_eq!(sl.usable_hit(&m.pages, &pool), m.pages.len());
        run(&mut pool, &mut sl, 2, &next, 512);
        assert!(sl.seqs[&2]
            .table
            .iter()
            .take(9900 / PS)
            .any(|p| p.is_some()));
        sl.free(2, &pool);
        pool.free(2).unwrap();
        sl.check_invariants().unwrap();
    }

    #[test]
    fn a_junction_keeps_its_window_for_the_prompts_after_the_first_fork() {
        let mut pool = PagePool::new(1024, PS);
        // No periodic checkpoints: only ends and junctions keep windows.
        let mut sl = SlidingPages::new(1024, PS, 512, 0);
        let t = tokens(3000, 1);
        run(&mut pool, &mut sl, 1, &t, 512);
        sl.free(1, &pool);
        pool.free(1).unwrap();
        // A second prompt forks at 2000 (inside page 31): nothing kept there yet.
        let fork = |salt| {
            let mut p = t[..2000].to_vec();
            p.extend(tokens(700, salt));
            p
        };
        let b = fork(2);
        let m = pool.lookup_prefix(&b, 0);
        assert_eq!(m.pages.len(), 31);
        assert_eq!(sl.usable_hit(&m.pages, &pool), 0);
        run(&mut pool, &mut sl, 2, &b, 512);
        sl.free(2, &pool);
        pool.free(2).unwrap();
        // Page 30 now has two children: the third prompt hits up to the junction.
        let c = fork(3);
        let m = pool.lookup_prefix(&c, 0);
        assert_eq!(sl.usable_hit(&m.pages, &pool), 31);
        run(&mut pool, &mut sl, 3, &c, 512);
        sl.free(3, &pool);
        pool.free(3).unwrap();
        sl.check_invariants().unwrap();
    }

    #[test]
    fn evicted_full_pages_make_sidecars_stale() {
        // A full pool just large enough for one sequence: the next one evicts it.
        let mut pool = PagePool::new(20, PS);
        let mut sl = SlidingPages::new(40, PS, 128, 0);
        let a = tokens(1200, 4);
        run(&mut pool, &mut sl, 1, &a, 256);
        sl.free(1, &pool);
        pool.free(1).unwrap();
        assert!(sl.stats().cached > 0);
        let b = tokens(1200, 5);
        run(&mut pool, &mut sl, 2, &b, 256);
        // a's full pages are gone, and with them its sidecars' use.
        let m = pool.lookup_prefix(&a, 0);
        assert!(m.pages.len() < 1200 / PS);
        assert!(sl.usable_hit(&m.pages, &pool) <= m.pages.len());
        sl.free(2, &pool);
        pool.free(2).unwrap();
        sl.check_invariants().unwrap();
        // Stale sidecars are evicted like any cached page: the group can still hand
        // out every page.
        let c = tokens(40 * PS - 1, 6);
        let mut pool = PagePool::new(64, PS);
        let mut fresh = SlidingPages::new(40, PS, 128, 0);
        run(&mut pool, &mut fresh, 3, &c, 64);
    }

    #[test]
    fn evicted_sidecars_are_reported_with_their_hash() {
        let mut pool = PagePool::new(64, PS);
        let mut sl = SlidingPages::new(24, PS, 128, 0);
        sl.set_eviction_log(true);
        let a = tokens(1200, 7);
        run(&mut pool, &mut sl, 1, &a, 256);
        sl.free(1, &pool);
        pool.free(1).unwrap();
        let cached = sl.stats().cached;
        assert!(cached > 0);
        let named: Vec<(PageId, u64)> = pool
            .cached_pages(&a, 0)
            .iter()
            .filter_map(|&f| Some((sl.sidecar(f, &pool)?, pool.page_hash_of(f)?)))
            .collect();
        assert_eq!(named.len(), cached);
        // A sequence that takes every page: the sidecars are reported.
        sl.allocate(2, &[], 0, &pool);
        sl.append(2, 24 * PS, &pool).unwrap();
        let ev = sl.take_evicted();
        assert_eq!(ev.len(), cached);
        for e in &ev {
            assert!(named.contains(&(e.page, e.hash)), "{e:?}");
        }
        assert!(sl.take_evicted().is_empty());
        sl.free(2, &pool);
        sl.check_invariants().unwrap();
    }

    #[test]
    fn an_evicted_full_page_gives_up_its_sidecar() {
        // A full pool of one sequence's pages: the next one evicts the first's.
        let mut pool = PagePool::new(20, PS);
        pool.set_eviction_log(true);
        let mut sl = SlidingPages::new(40, PS, 128, 0);
        let a = tokens(1200, 4);
        run(&mut pool, &mut sl, 1, &a, 256);
        sl.free(1, &pool);
        pool.free(1).unwrap();
        let cached = sl.stats().cached;
        assert!(cached > 0);
        pool.allocate(2, &[1], 0).unwrap();
        pool.append_slots(2, 20 * PS).unwrap();
        let mut found = 0;
        for e in pool.take_evicted() {
            // Another hash never names it.
            assert!(sl.take_evicted_sidecar(e.page, e.hash ^ 1).is_none());
            if let Some(p) = sl.take_evicted_sidecar(e.page, e.hash) {
                found += 1;
                assert_eq!(sl.pages[p as usize].refs, 0);
                assert!(sl.pages[p as usize].twin.is_none(), "freed");
            }
        }
        assert_eq!(found, cached);
        assert_eq!(sl.stats().cached, 0);
        sl.check_invariants().unwrap();
    }

    #[test]
    fn a_resume_holds_ram_sidecars_and_new_pages_for_the_rest() {
        let mut pool = PagePool::new(1024, PS);
        let mut sl = SlidingPages::new(1024, PS, 512, 0);
        let t = tokens(3000, 9);
        run(&mut pool, &mut sl, 1, &t, 512);
        sl.free(1, &pool);
        pool.free(1).unwrap();
        let m = pool.lookup_prefix(&t, 0);
        let k = m.pages.len();
        assert_eq!(sl.usable_hit(&m.pages, &pool), k);
        // As if the last three full pages were read back from disk: new pages for
        // their windows, the RAM sidecars for the rest of the window.
        let free_before = sl.stats().free;
        let fill = sl.allocate_resume(2, &m.pages[..k - 3], k, &pool).unwrap();
        assert_eq!(fill, vec![k - 3, k - 2, k - 1]);
        assert_eq!(sl.stats().free, free_before - 3);
        let first = sl.first_page_seen(k * PS);
        for j in 0..k {
            let held = sl.page_at(2, j);
            assert_eq!(held.is_some(), j >= first, "page {j}");
            if j >= first && j < k - 3 {
                assert_eq!(held, sl.sidecar(m.pages[j], &pool));
            }
        }
        assert_eq!(sl.tied_pages(2), 0, "tied once committed");
        sl.check_invariants().unwrap();
        // Too few pages: nothing changes.
        let mut small = SlidingPages::new(4, PS, 512, 0);
        assert!(small.allocate_resume(3, &[], k, &pool).is_none());
        assert!(!small.contains(3));
        assert_eq!(small.stats().free, 4);
        sl.free(2, &pool);
        sl.check_invariants().unwrap();
        assert_eq!(sl.stats().free, free_before);
    }

    #[test]
    fn random_sequences_keep_the_accounting() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |m: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % m as u64) as usize
        };
        let mut pool = PagePool::new(400, PS);
        let mut sl = SlidingPages::new(120, PS, 256, 1024);
        let bases: Vec<Vec<TokenId>> = (0..3).map(|i| tokens(3000, 10 + i)).collect();
        for seq in 1..60u64 {
            // A prefix of a shared base, then its own tokens.
            let base = &bases[next(3)];
            let mut t = base[..next(3000)].to_vec();
            t.extend(tokens(1 + next(600), 100 + seq as u32));
            t.truncate(2500);
            run(&mut pool, &mut sl, seq, &t, 64 * (1 + next(8)));
            sl.free(seq, &pool);
            pool.free(seq).unwrap();
            sl.check_invariants().unwrap();
            pool.check_invariants().unwrap();
            assert_eq!(sl.stats().in_use, 0);
        }
    }
}
