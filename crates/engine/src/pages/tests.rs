//! Unit tests of the pool through its API (and one corruption check of its state). Apart
//! because most of them drive several parts at once (allocate, commit, look up, evict),
//! so they belong to no single file.

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
