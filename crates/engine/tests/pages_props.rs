//! Property tests of the KV page pool and prefix cache: random arrivals sharing a few
//! system prompts, chunked prefill, decode, commits, cancellations and preemption on
//! random (often tiny) pools. A model of the KV store records which token prefix each
//! cell was written for; every sequence must always read back exactly its own tokens,
//! which fails if a page is reused, evicted or shared while another request still
//! reads or writes it. Seeded, so a failure names its seed and step.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tempo9_engine::pages::{page_hash, PageError, PageHasher, PagePool, SeqId, TokenId};

/// Cases per hasher; raise with `PAGES_PROP_CASES` for a longer soak.
fn n_cases(default: u64) -> u64 {
    std::env::var("PAGES_PROP_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const OPS_PER_CASE: usize = 250;
const MAX_LIVE: usize = 8;

/// Exact ids for token prefixes (a trie), so "this cell holds the KV of prefix X" is
/// an O(1) comparison with no hash collisions. Id 0 is the empty prefix.
#[derive(Default)]
struct Prefixes {
    ids: HashMap<(u32, TokenId), u32>,
}

impl Prefixes {
    fn extend(&mut self, parent: u32, token: TokenId) -> u32 {
        let next = self.ids.len() as u32 + 1;
        *self.ids.entry((parent, token)).or_insert(next)
    }

    /// Ids of `tokens[..=i]` for every `i`.
    fn of(&mut self, tokens: &[TokenId]) -> Vec<u32> {
        let mut id = 0;
        tokens
            .iter()
            .map(|&t| {
                id = self.extend(id, t);
                id
            })
            .collect()
    }
}

struct SimSeq {
    id: SeqId,
    salt: u64,
    /// Known tokens: the prompt, then sampled ones; `n_written` of them have KV.
    tokens: Vec<TokenId>,
    prefix_ids: Vec<u32>,
    n_written: usize,
    /// Whether this request commits its full pages after every step (a scheduler
    /// would); others commit at random times.
    eager_commit: bool,
}

struct Sim {
    label: String,
    step: usize,
    rng: StdRng,
    pool: PagePool,
    ps: usize,
    vocab: u32,
    systems: Vec<Vec<TokenId>>,
    max_len: usize,
    /// What each KV cell holds: (salt, prefix id of the tokens up to its own).
    kv: Vec<Option<(u64, u32)>>,
    prefixes: Prefixes,
    live: Vec<SimSeq>,
    next_id: SeqId,
}

macro_rules! check {
    ($sim:expr, $cond:expr, $($msg:tt)*) => {
        if !$cond {
            panic!("{} step {}: {}", $sim.label, $sim.step, format_args!($($msg)*));
        }
    };
}

impl Sim {
    fn new(seed: u64, hasher: PageHasher, hasher_name: &str) -> Sim {
        let mut rng = StdRng::seed_from_u64(seed);
        let ps = [1, 2, 3, 4, 8, 16][rng.random_range(0..6)];
        let n_pages = rng.random_range(1..=40);
        // A tiny vocabulary makes equal pages under different parents common.
        let vocab = rng.random_range(2..=5);
        let systems = (0..3)
            .map(|_| {
                let n = rng.random_range(0..=4 * ps);
                (0..n).map(|_| rng.random_range(0..vocab)).collect()
            })
            .collect();
        let label = format!("seed {seed} ({hasher_name}, {n_pages} pages of {ps})");
        Sim {
            label,
            step: 0,
            rng,
            pool: PagePool::with_hasher(n_pages, ps, hasher),
            ps,
            vocab,
            systems,
            max_len: 8 * ps + 6,
            kv: vec![None; n_pages * ps],
            prefixes: Prefixes::default(),
            live: Vec::new(),
            next_id: 0,
        }
    }

    fn random_prompt(&mut self) -> Vec<TokenId> {
        let mut prompt = if self.rng.random_bool(0.85) {
            self.systems[self.rng.random_range(0..self.systems.len())].clone()
        } else {
            Vec::new()
        };
        for _ in 0..self.rng.random_range(0..=2 * self.ps + 1) {
            prompt.push(self.rng.random_range(0..self.vocab));
        }
        if prompt.is_empty() {
            prompt.push(0);
        }
        prompt
    }

    /// Checks that the first `n` tokens of `tokens` read back from `pages`.
    fn check_cells(&self, what: &str, pages: &[u32], salt: u64, prefix_ids: &[u32], n: usize) {
        for pos in 0..n {
            let cell = self.pool.cell(pages[pos / self.ps], pos % self.ps);
            check!(
                self,
                self.kv[cell] == Some((salt, prefix_ids[pos])),
                "{what}: cell {cell} (position {pos}) holds {:?}, expected {:?}",
                self.kv[cell],
                (salt, prefix_ids[pos])
            );
        }
    }

    fn arrive(&mut self) {
        let prompt = self.random_prompt();
        let salt = u64::from(self.rng.random_bool(0.2));
        let id = self.next_id;
        self.next_id += 1;
        let expected = self.pool.lookup_prefix(&prompt, salt);
        let can = self.pool.can_allocate(&prompt, salt);
        let admit = self.pool.pages_to_admit(&prompt, salt);
        check!(
            self,
            can == (admit <= self.pool.n_available()),
            "can_allocate disagrees with pages_to_admit"
        );
        let before = self.pool.stats();
        let m = self.pool.allocate(id, &prompt, salt).unwrap();
        check!(
            self,
            m == expected,
            "allocate matched {m:?}, lookup said {expected:?}"
        );
        check!(
            self,
            m.n_cached_tokens == m.pages.len() * self.ps && m.n_cached_tokens < prompt.len(),
            "match of {} tokens for a {}-token prompt",
            m.n_cached_tokens,
            prompt.len()
        );
        let after = self.pool.stats();
        check!(
            self,
            after.query_tokens == before.query_tokens + prompt.len() as u64
                && after.hit_tokens == before.hit_tokens + m.n_cached_tokens as u64,
            "hit accounting"
        );
        let prefix_ids = self.prefixes.of(&prompt);
        self.check_cells("cache hit", &m.pages, salt, &prefix_ids, m.n_cached_tokens);
        self.live.push(SimSeq {
            id,
            salt,
            tokens: prompt,
            prefix_ids,
            n_written: m.n_cached_tokens,
            eager_commit: self.rng.random_bool(0.7),
        });
        // Half the time prefill the whole prompt at once: admission must be exact.
        if self.rng.random_bool(0.5) {
            let i = self.live.len() - 1;
            let n = self.live[i].tokens.len() - self.live[i].n_written;
            let ok = self.append(i, n);
            check!(
                self,
                ok == can,
                "can_allocate said {can}, whole-prompt append ok={ok}"
            );
            if !ok {
                self.free(i);
            }
        }
    }

    /// Appends `n` known tokens of live sequence `i`, writing their cells; returns
    /// false (with nothing changed) when the pool is out of pages.
    fn append(&mut self, i: usize, n: usize) -> bool {
        let id = self.live[i].id;
        let need = self.pool.pages_to_append(id, n).unwrap();
        let before = self.pool.stats();
        let table_before = self.pool.page_table(id).unwrap().to_vec();
        match self.pool.append_slots(id, n) {
            Ok(cells) => {
                let table = self.pool.page_table(id).unwrap().to_vec();
                check!(
                    self,
                    table.len() == table_before.len() + need && table.starts_with(&table_before),
                    "table {table_before:?} became {table:?} for {need} new pages"
                );
                check!(
                    self,
                    cells.len() == n,
                    "{} cells for {n} tokens",
                    cells.len()
                );
                let s = &self.live[i];
                for (j, &cell) in cells.iter().enumerate() {
                    let pos = s.n_written + j;
                    let page = table[pos / self.ps];
                    check!(
                        self,
                        cell == self.pool.cell(page, pos % self.ps),
                        "cell of position {pos}"
                    );
                    check!(
                        self,
                        self.pool.ref_count(page) == 1 && !self.pool.is_registered(page),
                        "seq {id} writes page {page}, which is shared or cached"
                    );
                    for o in self.live.iter().filter(|o| o.id != id) {
                        let other = self.pool.page_table(o.id).unwrap();
                        check!(
                            self,
                            !other.contains(&page),
                            "seq {id} writes page {page} held by seq {}",
                            o.id
                        );
                    }
                }
                let s = &mut self.live[i];
                for (j, &cell) in cells.iter().enumerate() {
                    self.kv[cell] = Some((s.salt, s.prefix_ids[s.n_written + j]));
                }
                s.n_written += n;
                if s.eager_commit {
                    let added = self
                        .pool
                        .commit_full_pages(id, &s.tokens[..s.n_written])
                        .unwrap();
                    check!(
                        self,
                        added <= need + 1,
                        "registered {added} pages after appending {need}"
                    );
                }
                true
            }
            Err(PageError::OutOfPages { needed, available }) => {
                check!(
                    self,
                    needed == need && needed > available && available == before.free + before.cached,
                    "OutOfPages {{ needed: {needed}, available: {available} }} but {need} needed, {before:?}"
                );
                check!(
                    self,
                    self.pool.stats() == before,
                    "failed append changed the counters"
                );
                check!(
                    self,
                    self.pool.page_table(id).unwrap() == table_before,
                    "failed append changed the table"
                );
                false
            }
            Err(e) => panic!("{} step {}: {e}", self.label, self.step),
        }
    }

    /// One scheduler step for a random live sequence: a prefill chunk, or one decode
    /// token; preempts the newest sequence when out of pages.
    fn step_one(&mut self) {
        if self.live.is_empty() {
            return;
        }
        let i = self.rng.random_range(0..self.live.len());
        let s = &self.live[i];
        let pending = s.tokens.len() - s.n_written;
        let n = if pending > 0 {
            self.rng.random_range(1..=pending.min(2 * self.ps + 1))
        } else if s.tokens.len() >= self.max_len {
            self.free(i); // finished
            return;
        } else {
            let t = self.rng.random_range(0..self.vocab);
            let s = &mut self.live[i];
            let parent = s.prefix_ids.last().copied().unwrap_or(0);
            s.tokens.push(t);
            s.prefix_ids.push(self.prefixes.extend(parent, t));
            1
        };
        if !self.append(i, n) {
            let newest = (0..self.live.len())
                .max_by_key(|&j| self.live[j].id)
                .unwrap();
            self.free(newest);
        }
    }

    fn commit_one(&mut self) {
        if self.live.is_empty() {
            return;
        }
        let i = self.rng.random_range(0..self.live.len());
        let s = &self.live[i];
        let (id, n_written) = (s.id, s.n_written);
        if s.tokens.len() > n_written && self.rng.random_bool(0.1) {
            let before = self.pool.stats();
            let r = self.pool.commit_full_pages(id, &s.tokens[..n_written + 1]);
            check!(
                self,
                matches!(r, Err(PageError::TokensBeyondSlots { .. })),
                "committed unwritten tokens: {r:?}"
            );
            check!(
                self,
                self.pool.stats() == before,
                "failed commit changed the counters"
            );
            return;
        }
        let k = if self.rng.random_bool(0.8) {
            n_written
        } else {
            self.rng.random_range(0..=n_written)
        };
        let added = self.pool.commit_full_pages(id, &s.tokens[..k]).unwrap();
        check!(
            self,
            added <= k / self.ps,
            "registered {added} pages from {k} tokens"
        );
    }

    fn free(&mut self, i: usize) {
        let s = self.live.swap_remove(i);
        self.pool.free(s.id).unwrap();
        check!(
            self,
            self.pool.free(s.id) == Err(PageError::UnknownSeq(s.id)),
            "double free accepted"
        );
    }

    /// A lookup that is not followed by an allocation: the pages it returns must hold
    /// the looked-up prefix.
    fn probe(&mut self) {
        let prompt = if !self.live.is_empty() && self.rng.random_bool(0.5) {
            let s = &self.live[self.rng.random_range(0..self.live.len())];
            s.tokens.clone()
        } else {
            self.random_prompt()
        };
        let salt = u64::from(self.rng.random_bool(0.2));
        let m = self.pool.lookup_prefix(&prompt, salt);
        let prefix_ids = self.prefixes.of(&prompt);
        self.check_cells("lookup", &m.pages, salt, &prefix_ids, m.n_cached_tokens);
    }

    /// Everything that must hold between operations.
    fn check_all(&self) {
        if let Err(e) = self.pool.check_invariants() {
            panic!("{} step {}: invariant: {e}", self.label, self.step);
        }
        let stats = self.pool.stats();
        check!(
            self,
            stats.free + stats.in_use + stats.cached == stats.n_pages
                && stats.n_seqs == self.live.len(),
            "counters {stats:?}"
        );
        let mut holders: HashMap<u32, usize> = HashMap::new();
        for s in &self.live {
            let table = self.pool.page_table(s.id).unwrap();
            for &p in table {
                *holders.entry(p).or_default() += 1;
            }
            check!(
                self,
                table.len() == s.n_written.div_ceil(self.ps)
                    && self.pool.n_tokens(s.id) == Some(s.n_written),
                "seq {} has {} pages and {:?} tokens for {} written",
                s.id,
                table.len(),
                self.pool.n_tokens(s.id),
                s.n_written
            );
            self.check_cells(
                &format!("seq {}", s.id),
                table,
                s.salt,
                &s.prefix_ids,
                s.n_written,
            );
        }
        check!(
            self,
            holders.len() == stats.in_use,
            "{} distinct held pages, {} in use",
            holders.len(),
            stats.in_use
        );
        for s in &self.live {
            if s.n_written % self.ps != 0 {
                let last = *self.pool.page_table(s.id).unwrap().last().unwrap();
                check!(
                    self,
                    holders[&last] == 1,
                    "seq {}'s partial page {last} is shared",
                    s.id
                );
            }
        }
    }

    fn run(&mut self) {
        self.check_all();
        for step in 0..OPS_PER_CASE {
            self.step = step;
            let r = self.rng.random_range(0..100);
            if r < 20 && self.live.len() < MAX_LIVE {
                self.arrive();
            } else if r < 55 {
                self.step_one();
            } else if r < 70 {
                self.commit_one();
            } else if r < 80 && !self.live.is_empty() {
                let i = self.rng.random_range(0..self.live.len());
                self.free(i); // cancelled or finished
            } else {
                self.probe();
            }
            self.check_all();
        }
        self.step = OPS_PER_CASE;
        while !self.live.is_empty() {
            self.free(self.live.len() - 1);
            self.check_all();
        }
        let s = self.pool.stats();
        check!(
            self,
            s.in_use == 0 && s.free + s.cached == s.n_pages && s.registered == s.cached,
            "idle pool is not at baseline: {s:?}"
        );
        check!(
            self,
            self.pool.n_available() == s.n_pages,
            "idle pool has unavailable pages"
        );
    }
}

fn run_cases(hasher: PageHasher, name: &str, seeds: std::ops::Range<u64>) -> (u64, u64) {
    let (mut hits, mut evictions) = (0, 0);
    for seed in seeds {
        let mut sim = Sim::new(seed, hasher, name);
        sim.run();
        let s = sim.pool.stats();
        hits += s.hit_tokens;
        evictions += s.evicted_pages;
    }
    (hits, evictions)
}

#[test]
fn random_workloads_keep_accounting_and_isolation() {
    let (hits, evictions) = run_cases(page_hash, "page_hash", 0..n_cases(2000));
    // The workload must actually exercise sharing and eviction.
    assert!(
        hits > 0 && evictions > 0,
        "hits {hits}, evictions {evictions}"
    );
}

#[test]
fn random_workloads_with_every_hash_colliding() {
    let (hits, evictions) = run_cases(|_, _, _| 7, "constant hash", 10_000..10_000 + n_cases(500));
    assert!(
        hits > 0 && evictions > 0,
        "hits {hits}, evictions {evictions}"
    );
}

#[test]
fn random_workloads_with_four_hash_buckets() {
    let (hits, evictions) = run_cases(
        |parent, salt, tokens| page_hash(parent, salt, tokens) & 3,
        "2-bit hash",
        20_000..20_000 + n_cases(500),
    );
    assert!(
        hits > 0 && evictions > 0,
        "hits {hits}, evictions {evictions}"
    );
}

#[test]
fn repeated_request_hits_after_idle() {
    // Deterministic end-to-end: a request finishing, then the same conversation
    // continued, reuses every full page; a tight pool then evicts and stays exact.
    let mut pool = PagePool::new(6, 4);
    let turn1: Vec<TokenId> = (0..10).collect();
    let m = pool.allocate(1, &turn1, 0).unwrap();
    assert_eq!(m.n_cached_tokens, 0);
    pool.append_slots(1, 10).unwrap();
    pool.commit_full_pages(1, &turn1).unwrap();
    pool.free(1).unwrap();
    let turn2: Vec<TokenId> = (0..14).collect();
    let m = pool.allocate(2, &turn2, 0).unwrap();
    assert_eq!(m.n_cached_tokens, 8);
    pool.append_slots(2, 6).unwrap();
    pool.commit_full_pages(2, &turn2).unwrap();
    pool.free(2).unwrap();
    let s = pool.stats();
    assert_eq!(
        (s.in_use, s.cached, s.free, s.hit_tokens, s.query_tokens),
        (0, 3, 3, 8, 24)
    );
    pool.check_invariants().unwrap();
    // An unrelated request needing the whole pool evicts everything, tail first.
    pool.allocate(3, &[99; 24], 0).unwrap();
    assert_eq!(pool.append_slots(3, 24).unwrap().len(), 24);
    assert_eq!(pool.lookup_prefix(&turn2, 0).n_cached_tokens, 0);
    pool.free(3).unwrap();
    let s = pool.stats();
    assert_eq!((s.in_use, s.cached, s.free, s.evicted_pages), (0, 0, 6, 3));
    pool.check_invariants().unwrap();
}
