//! Paged KV bookkeeping and the global prefix cache (pure bookkeeping: no tensors).
//!
//! KV memory is `n_pages` pages of `page_size` tokens. Page `p` covers the model's KV
//! cells `p * page_size .. (p + 1) * page_size`, so the model side addresses cells
//! directly from a page table. Each sequence holds a page table; full pages whose
//! tokens are committed are registered in a content-addressed cache and shared,
//! ref-counted, by every sequence whose prompt starts with the same tokens.
//!
//! Every page is in exactly one state:
//! - **free**: on the free list, content meaningless;
//! - **in use**: held by at least one page table (`ref_count > 0`);
//! - **cached**: unreferenced but registered; kept in LRU order until memory is needed.
//!
//! Design choices the scheduler relies on:
//! - A cache entry is identified by (parent page, salt, tokens). The 64-bit hash
//!   ([`page_hash`], chained through parent hashes) only selects a bucket; lookups
//!   compare the parent page id, the salt and the tokens, so a hash collision can
//!   never map wrong KV. By induction from the first page, a matched page holds the
//!   KV of exactly the looked-up token prefix.
//! - [`PagePool::lookup_prefix`] never covers the whole prompt: at least one token is
//!   left to compute so the model produces logits for the next token.
//! - The last, partial page and any page not yet committed are private to their
//!   sequence; only pages that will never be written again are shared.
//! - If a committed page duplicates one already cached (two requests prefilled the
//!   same prompt concurrently), the sequence keeps its own page, which is already
//!   written, as a private page, and continues its cache chain through the cached
//!   twin, so its later pages are still registered and found by lookups. Swapping to
//!   the twin would save a page but would change a page table under a running model
//!   step.
//! - New pages come from the free list first; only when it is empty is the least
//!   recently used cached page evicted. [`PagePool::free`] releases a table deepest
//!   page first, so a prefix's tail is evicted before its head.
//! - Evicting a page also drops the cache entries of all its descendants: their
//!   parent page id will be reused for other content, so they could never match
//!   again. Unreferenced descendants go to the free list; referenced ones (possible
//!   only below a duplicated page) stay in use as private pages of their holders.
//! - A finished sequence may keep the page where its prompt's exact cells end as a
//!   *partial* entry ([`PagePool::free_keeping_tail`]): keyed by its first cells'
//!   tokens under the page before it, never matched by a lookup (those look for whole
//!   pages), a leaf, unreferenced, evicted like any cached page and never reported to
//!   a second tier. Its cells are read only by copying them into another sequence's
//!   page, so the next turn of a chat need not recompute the previous prompt's tail.
//! - Every entry records how many of its leading cells hold KV that another prompt
//!   may copy bit for bit, and of which kind (an opaque tag from the engine), as set
//!   for its sequence by [`PagePool::set_copy_exactness`];
//!   [`PagePool::copy_candidates`] lists a page's registered children (or the first
//!   pages) with such cells, whole or partial, for prompts that share only part of a
//!   page (see [`crate::partial_page`]).
//! - Pages are not cleared: a cell's KV is meaningful only once its token was written
//!   through [`PagePool::append_slots`].
//! - With [`PagePool::set_eviction_log`] on, every evicted unreferenced page is
//!   reported by [`PagePool::take_evicted`] with its full cache key, so a second tier
//!   (the SSD tier, [`crate::ssd`]) can copy its KV out before the page is written
//!   again (pages are only written by model steps, so copying before the next step
//!   is in time). The pool itself only tracks RAM pages.

use std::collections::{HashMap, HashSet};

/// Index of a KV page; page `p` covers cells `p * page_size .. (p + 1) * page_size`.
pub type PageId = u32;

/// A token id, as produced by the tokenizer.
pub type TokenId = u32;

/// Identifies a sequence (request) holding pages.
pub type SeqId = u64;

/// Page hash function: `(parent hash, salt, page tokens) -> hash`.
pub type PageHasher = fn(u64, u64, &[TokenId]) -> u64;

/// Parent hash of a sequence's first page.
pub const ROOT_HASH: u64 = 0x9e37_79b9_7f4a_7c15;

/// "No page" in the intrusive lists.
const NIL: PageId = PageId::MAX;

const K0: u64 = 0xa076_1d64_78bd_642f;
const K1: u64 = 0xe703_7ed1_a0b4_28db;
const K2: u64 = 0x8ebc_6af0_9c88_c6e3;

/// 64x64 -> 128-bit multiply folded to 64 bits (wyhash's mixing step).
fn fold_mul(a: u64, b: u64) -> u64 {
    let r = u128::from(a) * u128::from(b);
    (r as u64) ^ ((r >> 64) as u64)
}

/// The default [`PageHasher`]: a wyhash-style chain over four tokens per step.
///
/// Deterministic across runs and platforms, so a hash can also name a page on disk.
/// `salt` stands for everything besides the tokens that changes the KV (model
/// identity, LoRA, image hashes).
pub fn page_hash(parent: u64, salt: u64, tokens: &[TokenId]) -> u64 {
    let pack = |q: &[TokenId]| {
        (
            u64::from(q[0]) | (u64::from(q[1]) << 32),
            u64::from(q[2]) | (u64::from(q[3]) << 32),
        )
    };
    let mut h = fold_mul(parent ^ K0, salt ^ K1);
    let mut quads = tokens.chunks_exact(4);
    for q in &mut quads {
        let (a, b) = pack(q);
        h = fold_mul(a ^ K1, b ^ h);
    }
    let mut last = [0; 4];
    last[..quads.remainder().len()].copy_from_slice(quads.remainder());
    let (a, b) = pack(&last[..]);
    h = fold_mul(a ^ K2, b ^ h);
    // The length tells zero padding from real zero tokens.
    fold_mul(h ^ K0, tokens.len() as u64 ^ K1)
}

/// Why a [`PagePool`] operation failed. A failed operation changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    /// Not enough free or evictable pages; the scheduler should preempt or wait.
    #[error("out of KV pages: {needed} needed, {available} free or evictable")]
    OutOfPages {
        /// Pages the operation needed.
        needed: usize,
        /// Free plus evictable cached pages at the time.
        available: usize,
    },
    /// The sequence holds no pages (never allocated, or already freed).
    #[error("sequence {0} is not allocated")]
    UnknownSeq(SeqId),
    /// [`PagePool::allocate`] for a sequence that is already allocated.
    #[error("sequence {0} is already allocated")]
    SeqExists(SeqId),
    /// [`PagePool::commit_full_pages`] got tokens that have no KV cell yet.
    #[error("sequence {seq}: {n_tokens} tokens committed but only {n_slots} have KV cells")]
    TokensBeyondSlots {
        /// The sequence.
        seq: SeqId,
        /// Tokens passed.
        n_tokens: usize,
        /// Tokens appended so far.
        n_slots: usize,
    },
}

/// The cached prefix of a prompt.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PrefixMatch {
    /// Cached pages holding the prompt's first `n_cached_tokens` tokens, in order.
    pub pages: Vec<PageId>,
    /// Tokens whose KV is already computed: `pages.len() * page_size`, always less than
    /// the prompt length.
    pub n_cached_tokens: usize,
}

/// Counters of a [`PagePool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Total pages.
    pub n_pages: usize,
    /// Pages on the free list.
    pub free: usize,
    /// Pages held by at least one sequence.
    pub in_use: usize,
    /// Unreferenced cached pages (evictable).
    pub cached: usize,
    /// Pages registered in the prefix cache, referenced or not.
    pub registered: usize,
    /// Allocated sequences.
    pub n_seqs: usize,
    /// Prompt tokens passed to [`PagePool::allocate`].
    pub query_tokens: u64,
    /// Of those, tokens served from the cache.
    pub hit_tokens: u64,
    /// Cached pages evicted to make room.
    pub evicted_pages: u64,
}

impl PoolStats {
    /// Share of allocated prompt tokens served from the cache (0 when none were asked).
    pub fn hit_rate(&self) -> f64 {
        if self.query_tokens == 0 {
            0.0
        } else {
            self.hit_tokens as f64 / self.query_tokens as f64
        }
    }
}

/// A cached page that left the RAM cache, with everything needed to keep its prefix
/// reachable in another tier (see [`PagePool::take_evicted`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictedPage {
    /// The RAM page; its cells still hold the KV until the next model step.
    pub page: PageId,
    /// The page's chained hash (its name in every tier).
    pub hash: u64,
    /// The chained hash of its parent page ([`ROOT_HASH`] for a first page).
    pub parent_hash: u64,
    /// Salt the page was registered under.
    pub salt: u64,
    /// The page's tokens.
    pub tokens: Box<[TokenId]>,
}

/// A registered page's cache key and tree links.
#[derive(Debug)]
struct Entry {
    hash: u64,
    parent: Option<PageId>,
    salt: u64,
    tokens: Box<[TokenId]>,
    /// Registered pages under this one, oldest first.
    children: Vec<PageId>,
    /// Leading cells another prompt may copy (see [`PagePool::set_copy_exactness`]).
    exact: u32,
    /// The engine's tag for how they were computed; copies need equal tags.
    kind: u8,
}

#[derive(Debug)]
struct Page {
    refs: u32,
    entry: Option<Entry>,
    /// Bumped whenever the registration ends, so a sequence can tell that the cache
    /// node its chain hangs under is gone (even if the page id was re-registered).
    epoch: u64,
    /// LRU links, meaningful while cached.
    prev: PageId,
    next: PageId,
    /// Next page in the same hash bucket.
    hash_next: PageId,
}

/// Pages, free list, LRU and index; kept apart from the sequences so both can be
/// borrowed mutably at once.
#[derive(Debug)]
struct Store {
    page_size: usize,
    hasher: PageHasher,
    pages: Vec<Page>,
    free: Vec<PageId>,
    /// Least recently used cached page (evicted first).
    lru_head: PageId,
    lru_tail: PageId,
    n_cached: usize,
    n_registered: usize,
    /// Position of each page in `free`, or `NIL` when not free.
    free_pos: Vec<PageId>,
    /// Hash -> first page of its bucket; buckets chain through `Page::hash_next`.
    index: HashMap<u64, PageId>,
    /// Registered first pages (no parent), oldest first (like `Entry::children`).
    roots: Vec<PageId>,
    evicted: u64,
    /// Evicted pages not yet taken, when the log is on.
    evicted_log: Option<Vec<EvictedPage>>,
}

impl Store {
    fn page(&self, p: PageId) -> &Page {
        &self.pages[p as usize]
    }

    fn page_mut(&mut self, p: PageId) -> &mut Page {
        &mut self.pages[p as usize]
    }

    fn entry(&self, p: PageId) -> &Entry {
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

    fn lru_remove(&mut self, p: PageId) {
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

    /// The registered page with exactly this key, if any.
    fn find(
        &self,
        hash: u64,
        parent: Option<PageId>,
        salt: u64,
        tokens: &[TokenId],
    ) -> Option<PageId> {
        let mut p = *self.index.get(&hash)?;
        while p != NIL {
            let e = self.entry(p);
            if e.parent == parent && e.salt == salt && *e.tokens == *tokens {
                return Some(p);
            }
            p = self.page(p).hash_next;
        }
        None
    }

    fn register(
        &mut self,
        p: PageId,
        hash: u64,
        parent: Option<PageId>,
        salt: u64,
        tokens: &[TokenId],
        (exact, kind): (usize, u8),
    ) {
        match parent {
            Some(parent) => {
                let e = self.page_mut(parent).entry.as_mut();
                e.expect("parent is registered").children.push(p);
            }
            None => self.roots.push(p),
        }
        let next = self.index.insert(hash, p).unwrap_or(NIL);
        let pg = self.page_mut(p);
        pg.hash_next = next;
        pg.entry = Some(Entry {
            hash,
            parent,
            salt,
            tokens: tokens.into(),
            children: Vec::new(),
            exact: exact.min(tokens.len()) as u32,
            kind,
        });
        self.n_registered += 1;
    }

    fn index_remove(&mut self, hash: u64, p: PageId) {
        let next = std::mem::replace(&mut self.page_mut(p).hash_next, NIL);
        let head = self.index[&hash];
        if head == p {
            if next == NIL {
                self.index.remove(&hash);
            } else {
                self.index.insert(hash, next);
            }
            return;
        }
        let mut q = head;
        while self.page(q).hash_next != p {
            q = self.page(q).hash_next;
            assert_ne!(q, NIL, "page {p} missing from its hash bucket");
        }
        self.page_mut(q).hash_next = next;
    }

    /// Drops the cache entries of `root` and all its descendants; unreferenced ones
    /// move from the LRU to the free list.
    fn uncache_subtree(&mut self, root: PageId) {
        let siblings = match self.entry(root).parent {
            Some(parent) => {
                let e = self.page_mut(parent).entry.as_mut();
                &mut e.expect("parent is registered").children
            }
            None => &mut self.roots,
        };
        let i = siblings.iter().position(|&c| c == root);
        siblings.remove(i.expect("child is linked"));
        let root_parent_hash = self
            .entry(root)
            .parent
            .map_or(ROOT_HASH, |q| self.entry(q).hash);
        let mut stack = vec![(root, root_parent_hash)];
        while let Some((p, parent_hash)) = stack.pop() {
            let entry = self.page_mut(p).entry.take().expect("page is registered");
            self.index_remove(entry.hash, p);
            self.page_mut(p).epoch += 1;
            self.n_registered -= 1;
            stack.extend(entry.children.iter().map(|&c| (c, entry.hash)));
            if self.page(p).refs == 0 {
                self.lru_remove(p);
                self.free_push(p);
                self.evicted += 1;
                // A partial entry has no name in another tier: it is only dropped.
                let whole = entry.tokens.len() == self.page_size;
                if let Some(log) = self.evicted_log.as_mut().filter(|_| whole) {
                    log.push(EvictedPage {
                        page: p,
                        hash: entry.hash,
                        parent_hash,
                        salt: entry.salt,
                        tokens: entry.tokens,
                    });
                }
            }
        }
    }

    /// A free page, evicting the least recently used cached page if none is free.
    ///
    /// Prefers `after + 1`, so a sequence's pages form long runs of consecutive
    /// pages: the model reads a one-run window in place and copies the runs of a
    /// scattered one. Otherwise a new run starts where it has the most room to grow.
    fn take_page(&mut self, after: Option<PageId>) -> Option<PageId> {
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

    fn free_push(&mut self, p: PageId) {
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

    fn acquire(&mut self, p: PageId) {
        if self.page(p).refs == 0 {
            self.lru_remove(p);
        }
        self.page_mut(p).refs += 1;
    }

    fn release(&mut self, p: PageId) {
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

    fn n_available(&self) -> usize {
        self.free.len() + self.n_cached
    }
}

/// The cache node a sequence's next committed page hangs under.
#[derive(Debug, Clone, Copy)]
enum Chain {
    /// No page committed yet: the next one is a root.
    Root,
    /// Under `page` while its registration `epoch` lasts; `hash` is its hash.
    Node { page: PageId, epoch: u64, hash: u64 },
    /// The chain's node was evicted: later pages of this sequence stay private.
    Broken,
}

#[derive(Debug)]
struct Seq {
    pages: Vec<PageId>,
    /// Tokens that have a KV cell.
    n_tokens: usize,
    /// Leading pages whose content is final (matched or committed). Pages from this
    /// index on are still written and therefore private.
    n_final: usize,
    salt: u64,
    chain: Chain,
    /// Leading cells whose KV another prompt may copy, and their kind (see
    /// [`PagePool::set_copy_exactness`]); recorded in the entries it registers.
    exact: (std::ops::Range<usize>, u8),
}

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

/// KV page allocator with a global, ref-counted prefix cache. See the module docs.
#[derive(Debug)]
pub struct PagePool {
    store: Store,
    seqs: HashMap<SeqId, Seq>,
    query_tokens: u64,
    hit_tokens: u64,
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

    /// Turns the eviction log on or off (off by default; turning it off clears it).
    /// While on, every evicted unreferenced page is kept for [`PagePool::take_evicted`].
    pub fn set_eviction_log(&mut self, on: bool) {
        self.store.evicted_log = on.then(Vec::new);
    }

    /// The pages evicted since the last call, oldest first. Their cells keep their KV
    /// until the pages are written again, which only a model step does: copy them out
    /// before the next step.
    pub fn take_evicted(&mut self) -> Vec<EvictedPage> {
        self.store
            .evicted_log
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Whether evicted pages wait in the log (their KV not yet copied out).
    pub fn has_pending_evictions(&self) -> bool {
        self.store
            .evicted_log
            .as_ref()
            .is_some_and(|l| !l.is_empty())
    }

    /// The free pages (holding nothing anyone can look up), sorted.
    pub fn free_pages(&self) -> Vec<PageId> {
        let mut f = self.store.free.clone();
        f.sort_unstable();
        f
    }

    /// Every registered whole page (in use or cached) with its full cache key, parents
    /// before children (partial entries are left out); used to write the RAM cache to
    /// a persistent tier on shutdown.
    pub fn registered_pages(&self) -> Vec<EvictedPage> {
        let st = &self.store;
        let mut out = Vec::with_capacity(st.n_registered);
        let mut stack: Vec<(PageId, u64)> = st
            .pages
            .iter()
            .enumerate()
            .filter(|(_, pg)| pg.entry.as_ref().is_some_and(|e| e.parent.is_none()))
            .map(|(p, _)| (p as PageId, ROOT_HASH))
            .collect();
        while let Some((p, parent_hash)) = stack.pop() {
            let e = st.entry(p);
            if e.tokens.len() < st.page_size {
                continue; // a partial entry (a leaf): RAM only
            }
            out.push(EvictedPage {
                page: p,
                hash: e.hash,
                parent_hash,
                salt: e.salt,
                tokens: e.tokens.clone(),
            });
            stack.extend(e.children.iter().map(|&c| (c, e.hash)));
        }
        out
    }

    /// The chained hash of the cached page `page` (the name a second tier stores it
    /// under), or `None` when it is not registered.
    pub fn page_hash_of(&self, page: PageId) -> Option<u64> {
        self.store.page(page).entry.as_ref().map(|e| e.hash)
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

    /// Number of page tables holding `page`.
    pub fn ref_count(&self, page: PageId) -> u32 {
        self.store.page(page).refs
    }

    /// Whether `page` is registered in the prefix cache (referenced or not).
    pub fn is_registered(&self, page: PageId) -> bool {
        self.store.page(page).entry.is_some()
    }

    /// While `page` is registered: the number of its registration (which changes
    /// whenever a registration ends) and its tokens; `None` when it is not
    /// registered. A registered page is never written, so an equal number means
    /// unchanged KV.
    pub fn registration(&self, page: PageId) -> Option<(u64, &[TokenId])> {
        let p = self.store.page(page);
        p.entry.as_ref().map(|e| (p.epoch, &e.tokens[..]))
    }

    /// While `page` is registered: the cached page before it in its prompt (`None`
    /// for a first page); `None` when it is not registered.
    pub fn registered_parent(&self, page: PageId) -> Option<Option<PageId>> {
        self.store.page(page).entry.as_ref().map(|e| e.parent)
    }

    /// Registered pages directly under `page` (prompts that continue it differently
    /// once there are two or more); 0 when it is not registered.
    pub fn n_children(&self, page: PageId) -> usize {
        self.store
            .page(page)
            .entry
            .as_ref()
            .map_or(0, |e| e.children.len())
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

    /// Registered pages under `parent` (`None`: first pages), newest first, at most
    /// `max`, with their kind and the tokens of their leading cells another prompt
    /// may copy (those with none are skipped).
    pub fn copy_candidates(
        &self,
        parent: Option<PageId>,
        max: usize,
    ) -> impl Iterator<Item = (PageId, u8, &[TokenId])> + '_ {
        let st = &self.store;
        let pages: &[PageId] = match parent {
            Some(p) => st.page(p).entry.as_ref().map_or(&[], |e| &e.children[..]),
            None => &st.roots,
        };
        pages.iter().rev().take(max).filter_map(move |&p| {
            let e = st.entry(p);
            (e.exact > 0).then(|| (p, e.kind, &e.tokens[..e.exact as usize]))
        })
    }

    /// The longest run of cached full pages that starts `tokens` under `salt`.
    ///
    /// At most `(tokens.len() - 1) / page_size` pages: the last prompt token is always
    /// left to compute, because the model must run on it to produce the next token's
    /// logits. Does not change the pool; [`PagePool::allocate`] takes the pages.
    pub fn lookup_prefix(&self, tokens: &[TokenId], salt: u64) -> PrefixMatch {
        let max_pages = tokens.len().saturating_sub(1) / self.store.page_size;
        self.cached_run(tokens, salt, max_pages)
    }

    /// The registered pages that the whole pages of `tokens` run through under `salt`
    /// (as [`PagePool::lookup_prefix`], but the last page may end the tokens): where a
    /// sequence's committed pages hang in the cache, its own or an equal twin's.
    pub fn cached_pages(&self, tokens: &[TokenId], salt: u64) -> Vec<PageId> {
        let max_pages = tokens.len() / self.store.page_size;
        self.cached_run(tokens, salt, max_pages).pages
    }

    /// The chained hash of the page that ends `tokens` (whole pages) under `salt`:
    /// its name in every tier, whether or not a page with it is registered.
    pub fn chain_hash(&self, tokens: &[TokenId], salt: u64) -> u64 {
        let ps = self.store.page_size;
        debug_assert!(tokens.len().is_multiple_of(ps));
        tokens
            .chunks_exact(ps)
            .fold(ROOT_HASH, |h, t| (self.store.hasher)(h, salt, t))
    }

    fn cached_run(&self, tokens: &[TokenId], salt: u64, max_pages: usize) -> PrefixMatch {
        let st = &self.store;
        let ps = st.page_size;
        let mut pages = Vec::new();
        let (mut parent, mut hash) = (None, ROOT_HASH);
        for page_tokens in tokens.chunks_exact(ps).take(max_pages) {
            let h = (st.hasher)(hash, salt, page_tokens);
            let Some(p) = st.find(h, parent, salt, page_tokens) else {
                break;
            };
            pages.push(p);
            (parent, hash) = (Some(p), h);
        }
        let n_cached_tokens = pages.len() * ps;
        PrefixMatch {
            pages,
            n_cached_tokens,
        }
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

    /// Checks every bookkeeping invariant in O(pages + page-table entries + cached
    /// tokens); returns the first violation. Meant for tests and debug builds.
    ///
    /// - every page is in exactly one of {free, in use, cached}; the counters agree;
    /// - a page's ref count equals the number of page tables holding it;
    /// - a page table covers exactly its sequence's tokens, and every page not yet
    ///   final (the one being written, at least) is private: one reference, not cached;
    /// - cache entries form a forest: parents are registered and list each child
    ///   once, hashes chain from [`ROOT_HASH`], no two entries share a key, and the
    ///   hash index holds exactly the registered pages.
    pub fn check_invariants(&self) -> Result<(), String> {
        macro_rules! ensure {
            ($cond:expr, $($msg:tt)*) => {
                if !$cond {
                    return Err(format!($($msg)*));
                }
            };
        }
        let st = &self.store;
        let n = st.pages.len();
        let ps = st.page_size;

        let mut refs = vec![0u32; n];
        for (&id, s) in &self.seqs {
            ensure!(
                s.pages.len() == s.n_tokens.div_ceil(ps),
                "seq {id}: {} pages for {} tokens",
                s.pages.len(),
                s.n_tokens
            );
            ensure!(
                s.n_final * ps <= s.n_tokens,
                "seq {id}: {} final pages but {} tokens",
                s.n_final,
                s.n_tokens
            );
            for (i, &p) in s.pages.iter().enumerate() {
                ensure!((p as usize) < n, "seq {id}: page {p} out of range");
                refs[p as usize] += 1;
                let pg = st.page(p);
                ensure!(
                    i < s.n_final || (pg.refs == 1 && pg.entry.is_none()),
                    "seq {id}: page {p} at index {i} is still written but not private"
                );
            }
        }
        for (p, pg) in st.pages.iter().enumerate() {
            ensure!(
                pg.refs == refs[p],
                "page {p}: ref count {} but {} page tables hold it",
                pg.refs,
                refs[p]
            );
        }

        // 1 = on the free list, 2 = in the LRU; pages with references are in neither.
        let mut listed = vec![0u8; n];
        for &p in &st.free {
            ensure!((p as usize) < n, "free page {p} out of range");
            ensure!(listed[p as usize] == 0, "page {p} twice on the free list");
            listed[p as usize] = 1;
            let pg = st.page(p);
            ensure!(
                pg.refs == 0 && pg.entry.is_none(),
                "free page {p} is referenced or registered"
            );
        }
        for (i, &p) in st.free.iter().enumerate() {
            ensure!(
                st.free_pos[p as usize] as usize == i,
                "free page {p}: position index is stale"
            );
        }
        ensure!(
            st.free_pos.iter().filter(|&&i| i != NIL).count() == st.free.len(),
            "position index lists pages that are not free"
        );
        let (mut prev, mut p, mut n_lru) = (NIL, st.lru_head, 0);
        while p != NIL {
            ensure!((p as usize) < n, "LRU page {p} out of range");
            ensure!(
                listed[p as usize] == 0,
                "LRU page {p} also listed elsewhere"
            );
            listed[p as usize] = 2;
            let pg = st.page(p);
            ensure!(pg.prev == prev, "LRU page {p}: broken back link");
            ensure!(
                pg.refs == 0 && pg.entry.is_some(),
                "LRU page {p} is referenced or unregistered"
            );
            n_lru += 1;
            (prev, p) = (p, pg.next);
        }
        ensure!(
            st.lru_tail == prev,
            "LRU tail is {} not {prev}",
            st.lru_tail
        );
        ensure!(
            n_lru == st.n_cached,
            "{n_lru} pages in the LRU, counter says {}",
            st.n_cached
        );
        for (p, pg) in st.pages.iter().enumerate() {
            ensure!(
                pg.refs > 0 || listed[p] != 0,
                "page {p} is unreferenced but neither free nor cached"
            );
        }

        let mut n_registered = 0;
        let mut n_with_parent = 0;
        let mut is_child = vec![false; n];
        let mut keys = HashSet::new();
        for (p, pg) in st.pages.iter().enumerate() {
            let Some(e) = &pg.entry else { continue };
            n_registered += 1;
            let partial = !e.tokens.is_empty() && e.tokens.len() < ps;
            ensure!(
                e.tokens.len() == ps || (partial && e.children.is_empty() && pg.refs == 0),
                "page {p}: entry of {} tokens ({} children, {} refs)",
                e.tokens.len(),
                e.children.len(),
                pg.refs
            );
            let parent_hash = match e.parent {
                None => ROOT_HASH,
                Some(q) => {
                    n_with_parent += 1;
                    let Some(pe) = st.pages.get(q as usize).and_then(|x| x.entry.as_ref()) else {
                        return Err(format!("page {p}: parent {q} is not registered"));
                    };
                    pe.hash
                }
            };
            ensure!(
                e.hash == (st.hasher)(parent_hash, e.salt, &e.tokens),
                "page {p}: hash does not chain from its parent"
            );
            ensure!(
                keys.insert((e.parent, e.salt, &e.tokens[..])),
                "page {p}: another cached page has the same key"
            );
            for &c in &e.children {
                let ce = st.pages.get(c as usize).and_then(|x| x.entry.as_ref());
                ensure!(
                    ce.is_some_and(|ce| ce.parent == Some(p as PageId)),
                    "page {p}: child {c} is not registered under it"
                );
                ensure!(!is_child[c as usize], "page {c} listed twice as a child");
                is_child[c as usize] = true;
            }
        }
        let n_children = is_child.iter().filter(|&&c| c).count();
        ensure!(
            n_children == n_with_parent,
            "{n_with_parent} entries have a parent but {n_children} are linked as children"
        );
        for &r in &st.roots {
            let re = st.pages.get(r as usize).and_then(|x| x.entry.as_ref());
            ensure!(
                re.is_some_and(|re| re.parent.is_none()),
                "root {r} is not a registered first page"
            );
            ensure!(!is_child[r as usize], "page {r} listed twice as a root");
            is_child[r as usize] = true;
        }
        ensure!(
            st.roots.len() == n_registered - n_with_parent,
            "{} first pages registered but {} listed as roots",
            n_registered - n_with_parent,
            st.roots.len()
        );
        ensure!(
            n_registered == st.n_registered,
            "{n_registered} registered pages, counter says {}",
            st.n_registered
        );

        let mut indexed = vec![false; n];
        let mut n_indexed = 0;
        for (&h, &head) in &st.index {
            let mut q = head;
            ensure!(q != NIL, "empty bucket for hash {h:#x}");
            while q != NIL {
                ensure!((q as usize) < n, "indexed page {q} out of range");
                ensure!(!indexed[q as usize], "page {q} indexed twice");
                indexed[q as usize] = true;
                let e = st.page(q).entry.as_ref();
                ensure!(
                    e.is_some_and(|e| e.hash == h),
                    "page {q} in bucket {h:#x} is not registered with that hash"
                );
                n_indexed += 1;
                q = st.page(q).hash_next;
            }
        }
        ensure!(
            n_indexed == n_registered,
            "{n_indexed} indexed pages but {n_registered} registered"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(pool: &PagePool) {
        pool.check_invariants().unwrap();
    }

    /// Allocates `seq` for `prompt`, appends the uncached part, commits it; returns the match.
    fn prefill(pool: &mut PagePool, seq: SeqId, prompt: &[TokenId], salt: u64) -> PrefixMatch {
        let m = pool.allocate(seq, prompt, salt).unwrap();
        pool.append_slots(seq, prompt.len() - m.n_cached_tokens)
            .unwrap();
        pool.commit_full_pages(seq, prompt).unwrap();
        ok(pool);
        m
    }

    fn seq_tokens(start: u32, n: usize) -> Vec<TokenId> {
        (start..start + n as u32).collect()
    }

    /// New runs start at the most aligned page of the roomiest stretch's middle, so
    /// the starts of concurrent sequences are equally spaced (see the model's
    /// strided attention).
    #[test]
    fn new_runs_start_on_a_power_of_two_grid() {
        let mut pool = PagePool::new(64, 16);
        for seq in 0..4 {
            prefill(&mut pool, seq, &seq_tokens(seq as u32 * 1000, 16), 0);
        }
        let starts: Vec<PageId> = (0..4).map(|s| pool.page_table(s).unwrap()[0]).collect();
        assert_eq!(starts, vec![0, 32, 16, 48]);
    }

    #[test]
    fn fresh_pool_is_all_free() {
        let pool = PagePool::new(8, 16);
        let s = pool.stats();
        assert_eq!((s.n_pages, s.free, s.in_use, s.cached), (8, 8, 0, 0));
        assert_eq!(pool.n_available(), 8);
        assert_eq!(pool.pages_for_tokens(0), 0);
        assert_eq!(pool.pages_for_tokens(17), 2);
        assert_eq!(s.hit_rate(), 0.0);
        ok(&pool);
    }

    #[test]
    fn append_slots_returns_cells_of_own_pages() {
        let mut pool = PagePool::new(4, 4);
        pool.allocate(1, &[], 0).unwrap();
        let cells = pool.append_slots(1, 6).unwrap();
        let table = pool.page_table(1).unwrap().to_vec();
        assert_eq!(table.len(), 2);
        let expect: Vec<usize> = (0..6).map(|i| pool.cell(table[i / 4], i % 4)).collect();
        assert_eq!(cells, expect);
        // The next token lands in the partial page; a page is added only when it fills.
        assert_eq!(
            pool.append_slots(1, 2).unwrap(),
            vec![pool.cell(table[1], 2), pool.cell(table[1], 3)]
        );
        assert_eq!(pool.pages_to_append(1, 1), Ok(1));
        assert_eq!(pool.append_slots(1, 0).unwrap(), Vec::<usize>::new());
        assert_eq!(pool.n_tokens(1), Some(8));
        assert_eq!(pool.stats().in_use, 2);
        ok(&pool);
        pool.free(1).unwrap();
        assert_eq!(pool.stats().free, 4, "uncommitted pages go straight back");
        ok(&pool);
    }

    #[test]
    fn lookup_leaves_last_token_to_compute() {
        let mut pool = PagePool::new(8, 4);
        let prompt = seq_tokens(10, 8);
        prefill(&mut pool, 1, &prompt, 0);
        pool.free(1).unwrap();
        // Exactly two full pages cached, but the prompt is exactly those 8 tokens.
        assert_eq!(pool.lookup_prefix(&prompt, 0).n_cached_tokens, 4);
        let mut longer = prompt.clone();
        longer.push(99);
        let m = pool.lookup_prefix(&longer, 0);
        assert_eq!((m.pages.len(), m.n_cached_tokens), (2, 8));
        assert_eq!(pool.lookup_prefix(&[], 0), PrefixMatch::default());
        assert_eq!(pool.lookup_prefix(&prompt[..4], 0).n_cached_tokens, 0);
    }

    #[test]
    fn two_sequences_share_a_three_page_prefix() {
        let mut pool = PagePool::new(16, 4);
        let system = seq_tokens(100, 12);
        let a: Vec<_> = system.iter().copied().chain([1, 2]).collect();
        let b: Vec<_> = system.iter().copied().chain([3, 4, 5]).collect();
        assert_eq!(prefill(&mut pool, 1, &a, 0).n_cached_tokens, 0);
        let m = prefill(&mut pool, 2, &b, 0);
        assert_eq!(m.n_cached_tokens, 12);
        let ta = pool.page_table(1).unwrap().to_vec();
        let tb = pool.page_table(2).unwrap().to_vec();
        assert_eq!(ta[..3], tb[..3]);
        assert_eq!(m.pages, ta[..3]);
        for &p in &ta[..3] {
            assert_eq!(pool.ref_count(p), 2);
            assert!(pool.is_registered(p));
        }
        assert_ne!(ta[3], tb[3], "partial pages are private");
        assert_eq!((pool.ref_count(ta[3]), pool.ref_count(tb[3])), (1, 1));
        assert!(!pool.is_registered(ta[3]) && !pool.is_registered(tb[3]));
        let s = pool.stats();
        assert_eq!((s.in_use, s.hit_tokens, s.query_tokens), (5, 12, 29));
        assert!((s.hit_rate() - 12.0 / 29.0).abs() < 1e-12);
        pool.free(1).unwrap();
        assert_eq!(pool.ref_count(tb[0]), 1);
        pool.free(2).unwrap();
        let s = pool.stats();
        assert_eq!((s.in_use, s.cached, s.free), (0, 3, 13));
        ok(&pool);
    }

    #[test]
    fn same_prompt_twice_keeps_written_page_private() {
        let mut pool = PagePool::new(8, 4);
        let prompt = seq_tokens(0, 6);
        prefill(&mut pool, 1, &prompt, 0);
        let m = prefill(&mut pool, 2, &prompt, 0);
        assert_eq!(m.n_cached_tokens, 4);
        let (ta, tb) = (pool.page_table(1).unwrap(), pool.page_table(2).unwrap());
        assert_eq!(ta[0], tb[0]);
        assert_ne!(ta[1], tb[1]);
        assert_eq!(pool.ref_count(tb[1]), 1);
    }

    #[test]
    fn cached_pages_leave_lru_when_referenced_again() {
        let mut pool = PagePool::new(4, 2);
        prefill(&mut pool, 1, &[1, 2, 3, 4, 5], 0);
        pool.free(1).unwrap();
        assert_eq!(pool.stats().cached, 2);
        let m = pool.allocate(2, &[1, 2, 3, 4, 5], 0).unwrap();
        assert_eq!(m.n_cached_tokens, 4);
        let s = pool.stats();
        assert_eq!((s.cached, s.in_use, s.free), (0, 2, 2));
        ok(&pool);
    }

    #[test]
    fn eviction_takes_least_recently_used_page() {
        // Three single-page prompts fill a 3-page pool's cache.
        let mut pool = PagePool::new(3, 2);
        let prompts = [[10, 11, 0], [20, 21, 0], [30, 31, 0]];
        for (i, p) in prompts.iter().enumerate() {
            prefill(&mut pool, i as SeqId, &p[..2], 0);
            pool.free(i as SeqId).unwrap();
        }
        let cached = |pool: &PagePool| -> Vec<bool> {
            prompts
                .iter()
                .map(|p| pool.lookup_prefix(p, 0).n_cached_tokens == 2)
                .collect()
        };
        assert_eq!(cached(&pool), [true, true, true]);
        assert_eq!(pool.stats().cached, 3);
        // Touch the oldest: it becomes the most recently used.
        pool.allocate(9, &prompts[0], 0).unwrap();
        pool.free(9).unwrap();
        pool.allocate(10, &[], 0).unwrap();
        pool.append_slots(10, 1).unwrap();
        assert_eq!(cached(&pool), [true, false, true]);
        pool.append_slots(10, 2).unwrap();
        assert_eq!(cached(&pool), [true, false, false]);
        assert_eq!(pool.stats().evicted_pages, 2);
        ok(&pool);
        assert_eq!(
            pool.append_slots(10, 4),
            Err(PageError::OutOfPages {
                needed: 2,
                available: 1
            })
        );
        pool.append_slots(10, 2).unwrap();
        assert_eq!(cached(&pool), [false, false, false]);
        ok(&pool);
    }

    #[test]
    fn free_pages_are_used_before_eviction() {
        let mut pool = PagePool::new(3, 2);
        prefill(&mut pool, 1, &[1, 2, 3], 0);
        pool.free(1).unwrap();
        assert_eq!((pool.stats().cached, pool.stats().free), (1, 2));
        pool.allocate(2, &[], 0).unwrap();
        pool.append_slots(2, 4).unwrap();
        assert_eq!(pool.lookup_prefix(&[1, 2, 3], 0).n_cached_tokens, 2);
        assert_eq!(pool.stats().evicted_pages, 0);
    }

    #[test]
    fn a_freed_prefix_is_evicted_tail_first() {
        let mut pool = PagePool::new(4, 2);
        prefill(&mut pool, 1, &seq_tokens(0, 7), 0);
        pool.free(1).unwrap();
        assert_eq!(pool.stats().cached, 3);
        pool.allocate(2, &[], 0).unwrap();
        pool.append_slots(2, 4).unwrap(); // one free page, then one eviction
        assert_eq!(pool.lookup_prefix(&seq_tokens(0, 7), 0).n_cached_tokens, 4);
        pool.append_slots(2, 2).unwrap();
        assert_eq!(pool.lookup_prefix(&seq_tokens(0, 7), 0).n_cached_tokens, 2);
        ok(&pool);
    }

    #[test]
    fn salt_separates_identical_tokens() {
        let mut pool = PagePool::new(8, 2);
        let prompt = [5, 6, 7, 8, 9];
        prefill(&mut pool, 1, &prompt, 7);
        assert_eq!(pool.lookup_prefix(&prompt, 7).n_cached_tokens, 4);
        assert_eq!(pool.lookup_prefix(&prompt, 8).n_cached_tokens, 0);
        assert_eq!(prefill(&mut pool, 2, &prompt, 8).n_cached_tokens, 0);
        assert_eq!(pool.stats().registered, 4, "one chain per salt");
        assert_ne!(
            page_hash(ROOT_HASH, 7, &prompt[..2]),
            page_hash(ROOT_HASH, 8, &prompt[..2])
        );
    }

    #[test]
    fn equal_hashes_never_map_wrong_pages() {
        // Every page hashes alike: only the full key comparison tells them apart.
        let mut pool = PagePool::with_hasher(16, 2, |_, _, _| 42);
        let a = [1, 2, 9, 9, 5];
        let b = [3, 4, 9, 9, 5]; // same second page under another parent
        prefill(&mut pool, 1, &a, 0);
        assert_eq!(pool.lookup_prefix(&b, 0).n_cached_tokens, 0);
        prefill(&mut pool, 2, &b, 0);
        let (ta, tb) = (
            pool.page_table(1).unwrap().to_vec(),
            pool.page_table(2).unwrap().to_vec(),
        );
        assert_eq!(pool.lookup_prefix(&a, 0).pages, ta[..2]);
        assert_eq!(pool.lookup_prefix(&b, 0).pages, tb[..2]);
        assert_eq!(pool.lookup_prefix(&[1, 2, 9, 8, 5], 0).pages, ta[..1]);
        assert_eq!(pool.lookup_prefix(&[1, 2, 9, 9, 5], 1).n_cached_tokens, 0);
        assert_eq!(pool.stats().registered, 4);
        ok(&pool);
        // Evicting from a shared bucket unlinks the right pages.
        pool.free(1).unwrap();
        pool.allocate(3, &[], 0).unwrap();
        pool.append_slots(3, 2 * 13).unwrap();
        assert_eq!(pool.lookup_prefix(&a, 0).n_cached_tokens, 0);
        assert_eq!(pool.lookup_prefix(&b, 0).pages, tb[..2]);
        ok(&pool);
    }

    #[test]
    fn duplicate_commit_continues_chain_through_the_cached_twin() {
        let mut pool = PagePool::new(16, 2);
        let prompt = [1, 2, 3, 4, 5];
        // Both start before either commits, so both compute the whole prompt.
        pool.allocate(1, &prompt, 0).unwrap();
        pool.allocate(2, &prompt, 0).unwrap();
        pool.append_slots(1, 5).unwrap();
        pool.append_slots(2, 5).unwrap();
        assert_eq!(pool.commit_full_pages(1, &prompt), Ok(2));
        assert_eq!(pool.commit_full_pages(2, &prompt), Ok(0));
        let (t1, t2) = (
            pool.page_table(1).unwrap().to_vec(),
            pool.page_table(2).unwrap().to_vec(),
        );
        assert!(t2
            .iter()
            .all(|&p| pool.ref_count(p) == 1 && !pool.is_registered(p)));
        // Seq 2 goes on decoding: its next full page hangs under seq 1's cached pages.
        pool.append_slots(2, 1).unwrap();
        assert_eq!(pool.commit_full_pages(2, &[1, 2, 3, 4, 5, 6]), Ok(1));
        let m = pool.lookup_prefix(&[1, 2, 3, 4, 5, 6, 7], 0);
        assert_eq!(m.pages, [t1[0], t1[1], t2[2]]);
        ok(&pool);
    }

    #[test]
    fn evicting_a_parent_drops_its_cached_descendants() {
        let mut pool = PagePool::new(7, 2);
        let long = [1, 2, 3, 4, 5, 6, 7, 8];
        pool.allocate(1, &long, 0).unwrap();
        pool.allocate(2, &long, 0).unwrap();
        pool.append_slots(1, 5).unwrap();
        pool.append_slots(2, 6).unwrap();
        pool.commit_full_pages(1, &long[..4]).unwrap();
        pool.commit_full_pages(2, &long[..6]).unwrap();
        let t2 = pool.page_table(2).unwrap().to_vec();
        assert!(pool.is_registered(t2[2]), "registered under seq 1's page");
        pool.free(1).unwrap(); // seq 1's two cached pages are now the only evictable ones
        assert_eq!(pool.stats().cached, 2);
        pool.allocate(3, &[], 0).unwrap();
        // Two pages are free; the third evicts seq 1's second page (released first),
        // which takes seq 2's registered page out of the cache but not out of seq 2.
        pool.append_slots(3, 6).unwrap();
        assert_eq!(pool.stats().evicted_pages, 1);
        assert!(!pool.is_registered(t2[2]));
        assert_eq!(pool.ref_count(t2[2]), 1);
        assert_eq!(pool.lookup_prefix(&long, 0).n_cached_tokens, 2);
        ok(&pool);
        // Seq 2's chain is gone: its later pages stay private.
        pool.append_slots(2, 2).unwrap();
        assert_eq!(pool.commit_full_pages(2, &long), Ok(0));
        ok(&pool);
        pool.free(2).unwrap();
        pool.free(3).unwrap();
        let s = pool.stats();
        assert_eq!((s.in_use, s.cached, s.free), (0, 0, 7));
        ok(&pool);
    }

    #[test]
    fn a_kept_tail_is_a_cached_leaf_that_lookups_never_match() {
        let mut pool = PagePool::new(4, 4);
        pool.set_eviction_log(true);
        let prompt = [1, 2, 3, 4, 5, 6];
        prefill(&mut pool, 1, &prompt, 0);
        let t1 = pool.page_table(1).unwrap().to_vec();
        // Not the first unfinished page, too long, or empty: freed as usual.
        prefill(&mut pool, 9, &[7, 7, 7, 7, 7], 0);
        assert_eq!(pool.free_keeping_tail(9, 0, &[7, 7]), Ok(None));
        prefill(&mut pool, 8, &[8, 8, 8], 0);
        assert_eq!(pool.free_keeping_tail(8, 0, &[8, 8, 8, 8]), Ok(None));
        assert_eq!(
            pool.stats().registered,
            2,
            "seq 1's and seq 9's whole pages"
        );
        ok(&pool);
        assert_eq!(pool.free_keeping_tail(1, 1, &[5, 6]), Ok(Some(t1[1])));
        ok(&pool);
        assert_eq!(pool.registration(t1[1]).map(|r| r.1), Some(&[5, 6][..]));
        assert_eq!(pool.registered_parent(t1[1]), Some(Some(t1[0])));
        assert_eq!(pool.stats().cached, 3);
        // The same prompt continued: the whole page is a hit, the partial entry is not.
        let m = pool.lookup_prefix(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 0);
        assert_eq!(m.pages, [t1[0]]);
        assert_eq!(
            pool.registered_pages().len(),
            2,
            "partial entries stay in RAM"
        );
        // An equal tail is kept once.
        prefill(&mut pool, 2, &prompt, 0);
        assert_eq!(pool.free_keeping_tail(2, 1, &[5, 6]), Ok(None));
        ok(&pool);
        // Memory pressure evicts it like any cached page (its parent first takes it
        // along), and the eviction log does not report it.
        let kept = pool.registration(t1[1]).unwrap().0;
        pool.take_evicted();
        prefill(&mut pool, 3, &seq_tokens(100, 16), 0);
        assert_ne!(pool.registration(t1[1]).unwrap().0, kept, "reused by seq 3");
        assert!(pool.take_evicted().iter().all(|e| e.tokens.len() == 4));
        pool.free(3).unwrap();
        ok(&pool);
    }

    #[test]
    fn copy_candidates_list_registered_pages_with_exact_cells() {
        let mut pool = PagePool::new(8, 4);
        let cands = |pool: &PagePool, parent| -> Vec<(PageId, u8, Vec<TokenId>)> {
            pool.copy_candidates(parent, 8)
                .map(|(p, k, t)| (p, k, t.to_vec()))
                .collect()
        };
        // Seq 1: 7 exact cells of kind 1 over 10 tokens: page 0 whole, page 1 three
        // cells (the rest were not computed as prompt rows).
        let toks1 = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
        pool.allocate(1, &toks1, 0).unwrap();
        pool.set_copy_exactness(1, 0..7, 1).unwrap();
        pool.append_slots(1, 10).unwrap();
        pool.commit_full_pages(1, &toks1).unwrap();
        let t1 = pool.page_table(1).unwrap().to_vec();
        assert_eq!(cands(&pool, None), [(t1[0], 1, vec![1, 2, 3, 4])]);
        assert_eq!(cands(&pool, Some(t1[0])), [(t1[1], 1, vec![5, 6, 7])]);
        // Seq 2 parts from seq 1 inside the first page; never marked: no cells.
        pool.allocate(2, &[1, 2, 9, 9, 9], 0).unwrap();
        pool.append_slots(2, 5).unwrap();
        pool.commit_full_pages(2, &[1, 2, 9, 9, 9]).unwrap();
        assert_eq!(cands(&pool, None).len(), 1);
        // Seq 3 parts inside the first page too, marked: listed newest first.
        pool.allocate(3, &[1, 2, 3, 8, 8], 0).unwrap();
        pool.set_copy_exactness(3, 0..5, 0).unwrap();
        pool.append_slots(3, 5).unwrap();
        pool.commit_full_pages(3, &[1, 2, 3, 8, 8]).unwrap();
        let t3 = pool.page_table(3).unwrap()[0];
        assert_eq!(
            cands(&pool, None),
            [(t3, 0, vec![1, 2, 3, 8]), (t1[0], 1, vec![1, 2, 3, 4])]
        );
        assert_eq!(pool.copy_candidates(None, 1).count(), 1, "at most max");
        ok(&pool);
        // A kept partial tail carries its exact cells.
        pool.free(1).unwrap();
        pool.allocate(4, &[1, 2, 3, 4, 6, 6], 0).unwrap();
        pool.set_copy_exactness(4, 0..6, 1).unwrap();
        pool.append_slots(4, 2).unwrap();
        let t4 = pool.page_table(4).unwrap()[1];
        assert_eq!(pool.free_keeping_tail(4, 1, &[6, 6]), Ok(Some(t4)));
        let under = cands(&pool, Some(t1[0]));
        assert!(under.contains(&(t4, 1, vec![6, 6])) && under.len() == 2);
        ok(&pool);
        // Evicted pages leave the lists (a first page takes its subtree along).
        pool.free(2).unwrap();
        pool.free(3).unwrap();
        for seq in 10..18 {
            pool.allocate(seq, &[seq as u32], 0).unwrap();
            pool.append_slots(seq, 1).unwrap();
        }
        assert!(cands(&pool, None).is_empty());
        assert!(cands(&pool, Some(t1[0])).is_empty());
        ok(&pool);
        for seq in 10..18 {
            pool.free(seq).unwrap();
        }
        // Exact cells that start after a page's first cell (pages read back from the
        // SSD tier before them): that page has none, the next ones their share.
        let toks5 = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3];
        pool.allocate(5, &toks5, 0).unwrap();
        pool.set_copy_exactness(5, 4..10, 1).unwrap();
        pool.append_slots(5, 10).unwrap();
        pool.commit_full_pages(5, &toks5).unwrap();
        let t5 = pool.page_table(5).unwrap().to_vec();
        assert!(cands(&pool, None).is_empty());
        assert_eq!(cands(&pool, Some(t5[0])), [(t5[1], 1, vec![5, 9, 2, 6])]);
        ok(&pool);
    }

    #[test]
    fn admission_counts_revived_cached_pages() {
        let mut pool = PagePool::new(2, 2);
        prefill(&mut pool, 1, &[1, 2, 3], 0);
        pool.free(1).unwrap();
        assert_eq!(pool.n_available(), 2);
        // Matches the cached page (1 revived) and needs 2 more: 3 > 2.
        assert_eq!(pool.pages_to_admit(&[1, 2, 3, 4, 5], 0), 3);
        assert!(!pool.can_allocate(&[1, 2, 3, 4, 5], 0));
        assert!(pool.can_allocate(&[1, 2, 3], 0));
        assert!(
            pool.can_allocate(&[7, 8, 9, 10], 0),
            "evicts the cached page"
        );
        let m = pool.allocate(2, &[1, 2, 3, 4, 5], 0).unwrap();
        assert_eq!(m.n_cached_tokens, 2);
        assert!(!pool.can_append(2, 3));
        assert_eq!(
            pool.append_slots(2, 3),
            Err(PageError::OutOfPages {
                needed: 2,
                available: 1
            })
        );
        assert_eq!(pool.n_tokens(2), Some(2), "failed append changed nothing");
        assert!(pool.can_append(2, 2));
        pool.append_slots(2, 2).unwrap();
        ok(&pool);
    }

    #[test]
    fn eviction_log_reports_evicted_pages_with_their_keys() {
        let mut pool = PagePool::new(3, 2);
        prefill(&mut pool, 1, &[1, 2, 3, 4, 5], 0);
        assert!(pool.take_evicted().is_empty(), "off by default");
        pool.free(1).unwrap();
        pool.set_eviction_log(true);
        let registered = pool.registered_pages();
        assert_eq!(registered.len(), 2);
        assert_eq!(registered[0].parent_hash, ROOT_HASH);
        assert_eq!(registered[1].parent_hash, registered[0].hash);
        // Two evictions: the tail page first, then the head.
        pool.allocate(2, &[], 0).unwrap();
        pool.append_slots(2, 6).unwrap();
        let ev = pool.take_evicted();
        assert_eq!(ev.len(), 2);
        let tail = &ev[0];
        assert_eq!(*tail.tokens, [3, 4]);
        assert_eq!(tail.hash, page_hash(ev[1].hash, 0, &[3, 4]));
        assert_eq!(tail.parent_hash, ev[1].hash);
        assert_eq!(ev[1].parent_hash, ROOT_HASH);
        assert_eq!(ev[1].hash, registered[0].hash);
        assert!(pool.take_evicted().is_empty());
        ok(&pool);
    }

    #[test]
    fn truncate_releases_pages_past_the_new_end() {
        let mut pool = PagePool::new(8, 2);
        prefill(&mut pool, 1, &[1, 2, 3], 0);
        pool.free(1).unwrap();
        let m = pool.allocate(2, &[1, 2, 3, 4, 5, 6, 7], 0).unwrap();
        assert_eq!(m.n_cached_tokens, 2);
        pool.append_slots(2, 4).unwrap();
        assert_eq!(pool.page_table(2).unwrap().len(), 3);
        pool.truncate(2, 3).unwrap();
        assert_eq!(pool.n_tokens(2), Some(3));
        assert_eq!(pool.page_table(2).unwrap().len(), 2);
        ok(&pool);
        pool.truncate(2, 2).unwrap();
        assert_eq!(pool.page_table(2).unwrap().len(), 1);
        ok(&pool);
        pool.append_slots(2, 5).unwrap();
        pool.commit_full_pages(2, &[1, 2, 3, 4, 5, 6, 7]).unwrap();
        assert_eq!(
            pool.lookup_prefix(&[1, 2, 3, 4, 5, 6, 7, 8], 0)
                .n_cached_tokens,
            6
        );
        ok(&pool);
    }

    #[test]
    fn misuse_is_reported() {
        let mut pool = PagePool::new(2, 2);
        assert_eq!(pool.append_slots(5, 1), Err(PageError::UnknownSeq(5)));
        assert_eq!(
            pool.commit_full_pages(5, &[]),
            Err(PageError::UnknownSeq(5))
        );
        assert_eq!(pool.free(5), Err(PageError::UnknownSeq(5)));
        assert_eq!(pool.pages_to_append(5, 1), Err(PageError::UnknownSeq(5)));
        assert!(!pool.can_append(5, 0));
        pool.allocate(5, &[1], 0).unwrap();
        assert_eq!(pool.allocate(5, &[1], 0), Err(PageError::SeqExists(5)));
        pool.append_slots(5, 1).unwrap();
        assert_eq!(
            pool.commit_full_pages(5, &[1, 2]),
            Err(PageError::TokensBeyondSlots {
                seq: 5,
                n_tokens: 2,
                n_slots: 1
            })
        );
        assert!(pool.contains(5));
        pool.free(5).unwrap();
        assert!(!pool.contains(5) && pool.page_table(5).is_none());
        ok(&pool);
    }

    #[test]
    fn page_hash_depends_on_every_input() {
        let base = [1u32, 2, 3, 4, 5, 6];
        let h = page_hash(ROOT_HASH, 0, &base);
        assert_eq!(h, page_hash(ROOT_HASH, 0, &base), "deterministic");
        assert_ne!(h, page_hash(ROOT_HASH ^ 1, 0, &base));
        assert_ne!(h, page_hash(ROOT_HASH, 1, &base));
        for i in 0..base.len() {
            let mut t = base;
            t[i] ^= 1 << (i * 5);
            assert_ne!(h, page_hash(ROOT_HASH, 0, &t), "token {i}");
        }
        assert_ne!(
            page_hash(ROOT_HASH, 0, &[0]),
            page_hash(ROOT_HASH, 0, &[0, 0])
        );
        // Distinct pages of a small vocabulary never collide in practice.
        let mut seen = HashSet::new();
        for a in 0..64u32 {
            for b in 0..64u32 {
                assert!(seen.insert(page_hash(ROOT_HASH, 0, &[a, b, a ^ b, 7])));
            }
        }
    }

    #[test]
    fn check_invariants_catches_corruption() {
        let mut pool = PagePool::new(4, 2);
        prefill(&mut pool, 1, &[1, 2, 3], 0);
        let p = pool.page_table(1).unwrap()[0];
        pool.store.page_mut(p).refs = 2;
        assert!(pool.check_invariants().unwrap_err().contains("ref count"));
        pool.store.page_mut(p).refs = 1;
        pool.store.free.push(p);
        assert!(pool.check_invariants().is_err());
        pool.store.free.pop();
        ok(&pool);
    }
}
