//! The allocator: the RAM pages, their reference counts, the free list and the LRU of
//! cached pages, and which page a sequence gets next. Apart from the cache index and
//! the sequences because it knows nothing of tokens: the placement policy (runs of
//! consecutive pages, starts on a power-of-two grid) reads on its own here.

use super::*;

impl Store {
    pub(super) fn page(&self, p: PageId) -> &Page {
        &self.pages[p as usize]
    }

    pub(super) fn page_mut(&mut self, p: PageId) -> &mut Page {
        &mut self.pages[p as usize]
    }

    pub(super) fn entry(&self, p: PageId) -> &Entry {
        self.page(p).entry.as_ref().expect("page is registered")
    }

    fn lru_push_back(&mut self, p: PageId) {
        let tail = self.lru_tail;
        let pg = self.page_mut(p);
        pg.prev = tail;
        pg.next = NIL;
        if tail == NIL {
            self.lru_head = p;
        } else {
            self.page_mut(tail).next = p;
        }
        self.lru_tail = p;
        self.n_cached += 1;
    }

    pub(super) fn lru_remove(&mut self, p: PageId) {
        let (prev, next) = (self.page(p).prev, self.page(p).next);
        if prev == NIL {
            self.lru_head = next;
        } else {
            self.page_mut(prev).next = next;
        }
        if next == NIL {
            self.lru_tail = prev;
        } else {
            self.page_mut(next).prev = prev;
        }
        let pg = self.page_mut(p);
        pg.prev = NIL;
        pg.next = NIL;
        self.n_cached -= 1;
    }

    /// A free page, evicting the least recently used cached page if none is free.
    ///
    /// Prefers `after + 1`, so a sequence's pages form long runs of consecutive
    /// pages: the model reads a one-run window in place and copies the runs of a
    /// scattered one. Otherwise a new run starts where it has the most room to grow.
    pub(super) fn take_page(&mut self, after: Option<PageId>) -> Option<PageId> {
        if let Some(next) = after.and_then(|p| p.checked_add(1)) {
            if self.is_free(next) {
                self.free_remove(next);
                return Some(next);
            }
        }
        if self.free.is_empty() && self.lru_head != NIL {
            self.uncache_subtree(self.lru_head);
        }
        let p = self.roomiest_free_page()?;
        self.free_remove(p);
        Some(p)
    }

    fn is_free(&self, p: PageId) -> bool {
        self.free_pos.get(p as usize).is_some_and(|&i| i != NIL)
    }

    pub(super) fn free_push(&mut self, p: PageId) {
        self.free_pos[p as usize] = self.free.len() as PageId;
        self.free.push(p);
    }

    fn free_remove(&mut self, p: PageId) {
        let i = std::mem::replace(&mut self.free_pos[p as usize], NIL) as usize;
        self.free.swap_remove(i);
        if let Some(&moved) = self.free.get(i) {
            self.free_pos[moved as usize] = i as PageId;
        }
    }

    /// Where a new run of pages should start: in the longest stretch of free pages,
    /// at its start when nothing precedes it, else near its middle, leaving the
    /// first part to the run that ends just before (it may still grow). O(pages); called
    /// only when a sequence cannot continue its current run.
    fn roomiest_free_page(&self) -> Option<PageId> {
        if self.free.is_empty() {
            return None;
        }
        let n = self.pages.len();
        let (mut best_start, mut best_len) = (0, 0);
        let mut i = 0;
        while i < n {
            if !self.is_free(i as PageId) {
                i += 1;
                continue;
            }
            let start = i;
            while i < n && self.is_free(i as PageId) {
                i += 1;
            }
            if i - start > best_len {
                (best_start, best_len) = (start, i - start);
            }
        }
        if best_start == 0 {
            return Some(0);
        }
        // The most aligned page of the stretch's middle half: sequences then start
        // on a coarse power-of-two grid, so the model can read the windows of many
        // decoding sequences as one strided view (equal distances between starts).
        let (lo, hi) = (
            best_start + best_len / 4,
            best_start + best_len - best_len / 4,
        );
        let p = (0..usize::BITS - 1)
            .rev()
            .filter_map(|k| lo.checked_next_multiple_of(1 << k))
            .find(|&p| p < hi)
            .unwrap_or(best_start + best_len / 2);
        Some(p as PageId)
    }

    pub(super) fn acquire(&mut self, p: PageId) {
        if self.page(p).refs == 0 {
            self.lru_remove(p);
        }
        self.page_mut(p).refs += 1;
    }

    pub(super) fn release(&mut self, p: PageId) {
        let pg = self.page_mut(p);
        pg.refs -= 1;
        if pg.refs == 0 {
            if pg.entry.is_some() {
                self.lru_push_back(p);
            } else {
                self.free_push(p);
            }
        }
    }

    pub(super) fn n_available(&self) -> usize {
        self.free.len() + self.n_cached
    }
}

impl PagePool {
    /// A pool of `n_pages` pages of `page_size` tokens, hashing with [`page_hash`].
    ///
    /// # Panics
    /// If `page_size` is 0 or `n_pages` does not fit a [`PageId`].
    pub fn new(n_pages: usize, page_size: usize) -> PagePool {
        PagePool::with_hasher(n_pages, page_size, page_hash)
    }

    /// Like [`PagePool::new`] with another hash function. Correctness never depends on
    /// the hash (keys are compared in full); tests pass a degenerate one to force
    /// collisions.
    ///
    /// # Panics
    /// If `page_size` is 0 or `n_pages` does not fit a [`PageId`].
    pub fn with_hasher(n_pages: usize, page_size: usize, hasher: PageHasher) -> PagePool {
        assert!(page_size > 0, "page_size must be positive");
        assert!(n_pages < NIL as usize, "too many pages: {n_pages}");
        let pages = (0..n_pages)
            .map(|_| Page {
                refs: 0,
                entry: None,
                epoch: 0,
                prev: NIL,
                next: NIL,
                hash_next: NIL,
            })
            .collect();
        PagePool {
            store: Store {
                page_size,
                hasher,
                pages,
                free: (0..n_pages as PageId).collect(),
                free_pos: (0..n_pages as PageId).collect(),
                lru_head: NIL,
                lru_tail: NIL,
                n_cached: 0,
                n_registered: 0,
                index: HashMap::new(),
                roots: Vec::new(),
                evicted: 0,
                evicted_log: None,
            },
            seqs: HashMap::new(),
            query_tokens: 0,
            hit_tokens: 0,
        }
    }

    /// The free pages (holding nothing anyone can look up), sorted.
    pub fn free_pages(&self) -> Vec<PageId> {
        let mut f = self.store.free.clone();
        f.sort_unstable();
        f
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.store.page_size
    }

    /// Total pages.
    pub fn n_pages(&self) -> usize {
        self.store.pages.len()
    }

    /// Pages obtainable right now: free plus evictable cached pages.
    pub fn n_available(&self) -> usize {
        self.store.n_available()
    }

    /// Pages needed to hold `n_tokens` tokens.
    pub fn pages_for_tokens(&self, n_tokens: usize) -> usize {
        n_tokens.div_ceil(self.store.page_size)
    }

    /// KV cell of token `offset` (< `page_size`) of page `page`.
    pub fn cell(&self, page: PageId, offset: usize) -> usize {
        debug_assert!(offset < self.store.page_size);
        page as usize * self.store.page_size + offset
    }

    /// Current counters.
    pub fn stats(&self) -> PoolStats {
        let st = &self.store;
        PoolStats {
            n_pages: st.pages.len(),
            free: st.free.len(),
            in_use: st.pages.len() - st.free.len() - st.n_cached,
            cached: st.n_cached,
            registered: st.n_registered,
            n_seqs: self.seqs.len(),
            query_tokens: self.query_tokens,
            hit_tokens: self.hit_tokens,
            evicted_pages: st.evicted,
        }
    }

    /// Number of page tables holding `page`.
    pub fn ref_count(&self, page: PageId) -> u32 {
        self.store.page(page).refs
    }
}
