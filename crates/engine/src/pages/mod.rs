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
//!
//! The code follows the data flow; this file holds the types (the overview), their
//! behaviour lives in:
//! - `store`: the RAM pages, their states and where a new page comes from;
//! - `index`: the content-addressed cache index and the lookups against it;
//! - `seq`: a sequence's page table from admission to freeing;
//! - `evict`: pages leaving the RAM cache, and what a second tier learns of them;
//! - `hash`: the page hash, a page's name in every tier;
//! - `invariants`: the full consistency check.

use std::collections::HashMap;

mod evict;
mod hash;
mod index;
mod invariants;
mod seq;
mod store;
#[cfg(test)]
mod tests;

pub use hash::page_hash;

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

/// KV page allocator with a global, ref-counted prefix cache. See the module docs.
#[derive(Debug)]
pub struct PagePool {
    store: Store,
    seqs: HashMap<SeqId, Seq>,
    query_tokens: u64,
    hit_tokens: u64,
}
