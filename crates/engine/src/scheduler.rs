//! The scheduler: which tokens of which requests each step computes.
//!
//! [`plan`] turns the running requests' progress and the cache's state into a
//! [`StepPlan`], a plain description of the step: each request's tokens to compute
//! and the cells they write in every cache group, the requests preempted to make room
//! (their pages freed) and those that can never fit. It reads no model, so it is
//! tested on synthetic request states below. The engine core admits requests before
//! planning (`core::admission`) and carries the plan out (`core::runner`).
//!
//! Requests at the decoding stage go first, then prompt chunks, each in policy order
//! (earlier ones get the token budget and pages first; when pages run out, the last
//! ones are preempted).

use crate::cache::{Cells, KvCache};
use crate::request::RequestId;

/// Granularity of a sequence's attention window (cells). llama.cpp pads the same
/// way, and ggml's CPU flash attention picks its kernel (and so its rounding) by
/// window length, so equal padding gives llama.cpp's numbers, and a sequence's
/// numbers do not depend on how its pages are laid out.
pub const KV_WINDOW_PAD: usize = 256;

/// Prompt chunks start at multiples of this many tokens (ggml's CPU flash-attention
/// query tile and a multiple of the repacked matmuls' 16-row blocks), so a prompt
/// token's arithmetic is the same however the prompt is cut into steps: alone,
/// batched, after a prefix hit or after preemption.
pub const CHUNK_ALIGN: usize = 64;

/// Prompt tokens to compute next, out of `remaining`, within `limit`: all of them if
/// they fit; else a multiple of [`CHUNK_ALIGN`] that leaves at least `CHUNK_ALIGN`
/// for later (a shorter last chunk would run through another attention kernel).
/// 0 when `limit` allows no such piece.
pub(crate) fn prompt_piece(remaining: usize, limit: usize) -> usize {
    if remaining <= limit {
        return remaining;
    }
    let mut n = limit / CHUNK_ALIGN * CHUNK_ALIGN;
    if remaining - n < CHUNK_ALIGN {
        n = n.saturating_sub(CHUNK_ALIGN);
    }
    n
}

/// The prompt budget of a step under an ITL target: `fit` tokens (what the target
/// allows at the recent cost per token) per decoding request's share, scaled by
/// prompting / decoding requests when prompts outnumber decodes, as a multiple of
/// [`CHUNK_ALIGN`] within `1..=full` chunks; `full` when nothing decodes.
pub(crate) fn itl_budget(full: usize, fit: f64, decoding: usize, prompting: usize) -> usize {
    if decoding == 0 || fit.is_nan() || fit <= 0.0 {
        return full;
    }
    let share = prompting.max(decoding) as f64 / decoding as f64;
    let n = (share * fit).min(full as f64) as usize;
    (n / CHUNK_ALIGN * CHUNK_ALIGN).clamp(CHUNK_ALIGN.min(full), full)
}

/// Which request goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// First come, first served.
    #[default]
    Fcfs,
    /// Lower [`crate::Request::priority`] first; first come, first served among equals.
    Priority,
    /// Earliest estimated prompt completion first, had each request started when it
    /// arrived: arrival time plus the prompt compute it still needs (tokens left
    /// times the recent cost per token). Among requests that arrive together the
    /// one with the least prompt left goes first, which minimises their mean time to
    /// first token (several agents sending their next turns at once); a request
    /// that has waited longer than the extra work it brings goes before newer,
    /// shorter ones, so none starves.
    Shortest,
}

/// What the policy sees of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rank {
    /// Submission order.
    pub arrival: u64,
    /// The request's priority value.
    pub priority: i32,
    /// Microseconds after the engine started at which it arrived.
    pub arrived_us: u64,
}

impl Policy {
    /// Sort key: smaller runs first. `work_us`: the request's estimated
    /// microseconds of prompt computation left.
    pub(crate) fn key(self, r: Rank, work_us: u64) -> (i64, u64) {
        match self {
            Policy::Fcfs => (0, r.arrival),
            Policy::Priority => (i64::from(r.priority), r.arrival),
            Policy::Shortest => ((r.arrived_us + work_us) as i64, r.arrival),
        }
    }

    /// Parses `fcfs`, `priority` or `shortest`.
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "fcfs" => Some(Policy::Fcfs),
            "priority" => Some(Policy::Priority),
            "shortest" => Some(Policy::Shortest),
            _ => None,
        }
    }
}

/// What the scheduler sees of a running request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Progress {
    pub id: RequestId,
    pub rank: Rank,
    /// Prompt tokens.
    pub n_prompt: usize,
    /// Tokens whose KV is in the cache.
    pub n_computed: usize,
    /// Tokens known: the prompt and those generated so far.
    pub n_tokens: usize,
    /// Draft tokens proposed after them for this step (speculative decoding): a
    /// decoding request computes its last token and these, when memory allows.
    pub n_draft: usize,
    /// A prompt position a step must end at (a recurrent-state checkpoint is taken
    /// there: its state exists only at the end of a step); `usize::MAX` for none.
    pub stop_at: usize,
    /// The first prompt position it cannot compute yet (an image the encoder has
    /// not delivered starts there); `usize::MAX` for none.
    pub blocked_at: usize,
    /// Prompt cells `(start, end)` computed as one piece of their own: the next
    /// image whose rows attend to each other (Gemma 4).
    pub whole: Option<(usize, usize)>,
}

impl Progress {
    /// Prompt tokens left to compute.
    pub fn prompt_left(&self) -> usize {
        self.n_prompt.saturating_sub(self.n_computed)
    }

    /// Whether its prompt is computed and a token is left to compute.
    pub fn decoding(&self) -> bool {
        self.n_computed >= self.n_prompt && self.n_computed < self.n_tokens
    }
}

/// One running request's share of a step: its tokens `start..end` and their cells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Work {
    pub id: RequestId,
    pub start: usize,
    pub end: usize,
    pub cells: Cells,
}

/// A step, as the scheduler decided it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct StepPlan {
    /// What to compute, in batch order: decodes first, then prompt chunks.
    pub work: Vec<Work>,
    /// Requests preempted for memory (their pages are freed): back to waiting, to be
    /// recomputed when admitted again.
    pub preempted: Vec<RequestId>,
    /// Requests that cannot fit even alone (their pages are freed): they end.
    pub out_of_memory: Vec<RequestId>,
}

/// Sort key of `p` under `policy`, its prompt work left costed at `cost_us` per
/// token: smaller runs first.
pub(crate) fn sort_key(policy: Policy, p: &Progress, cost_us: f64) -> (i64, u64) {
    policy.key(p.rank, (p.prompt_left() as f64 * cost_us) as u64)
}

/// The next piece of work of `p`: while its prompt is not all computed, as much of
/// it as `budget` allows (see [`prompt_piece`]); after that one token. Tokens
/// generated before a preemption are recomputed one per step, as they were first
/// computed, so a resumed request continues exactly. A piece does not pass the
/// request's `stop_at`, nor its `blocked_at` (0 while it waits there).
fn next_piece(p: &Progress, budget: usize) -> usize {
    if p.n_computed < p.n_prompt {
        let remaining = p
            .n_prompt
            .min(p.stop_at)
            .min(p.blocked_at)
            .saturating_sub(p.n_computed);
        if remaining == 0 {
            return 0;
        }
        let n = match prompt_piece(remaining, budget) {
            // A budget of one aligned chunk cannot split 65..127 remaining tokens
            // (the last chunk must not be shorter): take them all, exceeding it by
            // less than a chunk, rather than never finishing.
            0 if budget >= CHUNK_ALIGN && remaining < 2 * CHUNK_ALIGN => remaining,
            n => n,
        };
        keep_whole(p, n)
    } else if p.n_computed + 1 == p.n_tokens {
        1 + p.n_draft
    } else {
        1
    }
}

/// Prompt piece `n` of `p` with its image computed whole ([`Progress::whole`])
/// a piece of its own, as mtmd decodes it: the text before it stops at its
/// start, and the image is taken whole, over the budget if it must be
/// (llama.cpp needs it in one ubatch). Kernels choose by a piece's row count,
/// so the same pieces as llama.cpp's give the same numbers. 0 past the image
/// (a span planned this step: what follows waits for the next step's).
fn keep_whole(p: &Progress, n: usize) -> usize {
    match p.whole {
        Some((start, end)) if n > 0 => {
            if p.n_computed < start {
                n.min(start - p.n_computed)
            } else {
                end.saturating_sub(p.n_computed)
            }
        }
        _ => n,
    }
}

/// Plans a step over the running requests `running` (`cost_us`: recent compute cost
/// per prompt token, for [`Policy::Shortest`]): up to `budget` prompt tokens, every
/// decoding request's token on top, cells taken from `cache` (preempting the
/// lowest-ranked requests when pages run out). `loads_pending`: some admitted
/// request holds pages while its prefix is read from the SSD tier (a request alone
/// that does not fit then waits for it rather than failing).
pub(crate) fn plan(
    running: &[Progress],
    policy: Policy,
    cost_us: f64,
    mut budget: usize,
    loads_pending: bool,
    cache: &mut KvCache,
) -> StepPlan {
    let n = running.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| sort_key(policy, &running[i], cost_us));
    // Progress as planned so far (several prompt chunks may be planned for one).
    let mut at: Vec<Progress> = running.to_vec();
    let mut planned = vec![false; n];
    let mut preempted = vec![false; n];
    let mut out_of_memory = vec![false; n];
    let mut work: Vec<Work> = Vec::new();
    for decode_pass in [true, false] {
        for (k, &i) in order.iter().enumerate() {
            loop {
                if preempted[i] || out_of_memory[i] {
                    break;
                }
                let p = at[i];
                let decoding = p.n_computed >= p.n_prompt;
                if decoding != decode_pass || p.n_computed == p.n_tokens {
                    break;
                }
                let mut want = next_piece(&p, budget);
                if want == 0 {
                    break;
                }
                if decode_pass && want > 1 && cache.room(p.id) < want {
                    // Drafts never preempt: verify none rather than take others' pages.
                    want = 1;
                }
                // Make room by preempting the lowest-ranked request not planned yet.
                while cache.room(p.id) < want {
                    let victim = order[k + 1..]
                        .iter()
                        .rev()
                        .find(|&&j| !planned[j] && !preempted[j] && !out_of_memory[j]);
                    match victim {
                        Some(&j) => {
                            preempted[j] = true;
                            cache
                                .free(running[j].id)
                                .expect("running requests hold pages");
                        }
                        None => break,
                    }
                }
                // A prompt chunk may shrink to what fits.
                if !decode_pass && cache.room(p.id) < want {
                    let fit = keep_whole(&p, prompt_piece(p.prompt_left(), cache.room(p.id)));
                    if fit > 0 && fit <= cache.room(p.id) {
                        want = fit;
                    }
                }
                if cache.room(p.id) < want {
                    if !planned[i] {
                        // Higher-ranked requests hold the memory: wait for them.
                        // Nothing is ranked higher (and no request holds pages for a
                        // load from the SSD tier): it can never fit.
                        let alone = order[..k].iter().all(|&j| preempted[j]);
                        if alone && work.is_empty() && !loads_pending {
                            out_of_memory[i] = true;
                        } else {
                            preempted[i] = true;
                        }
                        cache.free(p.id).expect("running requests hold pages");
                    }
                    break;
                }
                let cells = cache.append(p.id, want).expect("room was checked");
                work.push(Work {
                    id: p.id,
                    start: p.n_computed,
                    end: p.n_computed + want,
                    cells,
                });
                at[i].n_computed += want;
                planned[i] = true;
                if decode_pass {
                    // Decodes do not use the prompt budget: every running request gets
                    // its token each step.
                    break;
                }
                budget = budget.saturating_sub(want);
                if at[i].n_computed == p.stop_at {
                    // The state there is checkpointed after the step: the next piece
                    // waits for the next step.
                    break;
                }
            }
        }
    }
    let ids = |flags: &[bool]| -> Vec<RequestId> {
        (0..n)
            .filter(|&i| flags[i])
            .map(|i| running[i].id)
            .collect()
    };
    StepPlan {
        work,
        preempted: ids(&preempted),
        out_of_memory: ids(&out_of_memory),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pages::PagePool;

    #[test]
    fn orders() {
        let a = Rank {
            arrival: 1,
            priority: 5,
            arrived_us: 0,
        };
        let b = Rank {
            arrival: 2,
            priority: -1,
            arrived_us: 1_000_000,
        };
        let (wa, wb) = (9_000_000, 2_000_000);
        assert!(Policy::Fcfs.key(a, wa) < Policy::Fcfs.key(b, wb));
        assert!(Policy::Priority.key(b, wb) < Policy::Priority.key(a, wa));
        // b arrived 1 s later with 7 s less work: it finishes sooner.
        assert!(Policy::Shortest.key(b, wb) < Policy::Shortest.key(a, wa));
        // Once a has been computed past the difference, it goes first.
        assert!(Policy::Shortest.key(a, 2_500_000) < Policy::Shortest.key(b, wb));
    }

    #[test]
    fn itl_budget_grows_with_waiting_prompts() {
        // Nothing decoding: no target to keep.
        assert_eq!(itl_budget(512, 100.0, 0, 5), 512);
        // One decoder, one prompt: what the target fits, in whole chunks.
        assert_eq!(itl_budget(512, 150.0, 1, 1), 128);
        // Fewer prompts than decoders: still the decoders' target.
        assert_eq!(itl_budget(512, 150.0, 3, 1), 128);
        // 15 prompts arrived with one decoder: their share, capped by `full`.
        assert_eq!(itl_budget(512, 150.0, 1, 15), 512);
        assert_eq!(itl_budget(512, 150.0, 2, 4), 256);
        // Never below one chunk, nor above `full`.
        assert_eq!(itl_budget(512, 1.0, 4, 1), CHUNK_ALIGN);
        assert_eq!(itl_budget(32, 1.0, 4, 1), 32);
        assert_eq!(itl_budget(512, f64::INFINITY, 1, 1), 512);
    }

    fn progress(id: RequestId, n_prompt: usize, n_computed: usize, n_tokens: usize) -> Progress {
        Progress {
            id,
            rank: Rank {
                arrival: id,
                priority: 0,
                arrived_us: id * 10,
            },
            n_prompt,
            n_computed,
            n_tokens,
            n_draft: 0,
            stop_at: usize::MAX,
            blocked_at: usize::MAX,
            whole: None,
        }
    }

    #[test]
    fn drafts_are_verified_where_pages_allow_and_never_preempt() {
        // Request 1 decodes with 3 drafts, request 2 with 2 (after a preemption: it
        // recomputes a generated token first, one per step, without its drafts).
        let mut a = progress(1, 10, 12, 13);
        a.n_draft = 3;
        let mut b = progress(2, 10, 20, 22);
        b.n_draft = 2;
        let mut cache = cache_with(8, &[(1, 12), (2, 20)]);
        let p = plan(&[a, b], Policy::Fcfs, 1e3, 512, false, &mut cache);
        let got: Vec<_> = p.work.iter().map(|w| (w.id, w.start, w.end)).collect();
        assert_eq!(got, [(1, 12, 16), (2, 20, 21)]);
        // Two pages, both full but for request 1's last 4 cells: its drafts would
        // need request 2's page, so it verifies none and nobody is preempted.
        let mut a = progress(1, 60, 60, 61);
        a.n_draft = 4;
        let mut cache = cache_with(2, &[(1, 60), (2, 64)]);
        let b = progress(2, 64, 64, 64);
        let p = plan(&[a, b], Policy::Fcfs, 1e3, 512, false, &mut cache);
        let got: Vec<_> = p.work.iter().map(|w| (w.id, w.start, w.end)).collect();
        assert_eq!(got, [(1, 60, 61)]);
        assert!(p.preempted.is_empty());
        cache.check_invariants().unwrap();
    }

    /// A cache of `pages` pages of 64 tokens holding `seqs` (id, cached tokens).
    fn cache_with(pages: usize, seqs: &[(RequestId, usize)]) -> KvCache {
        let mut c = KvCache::new(PagePool::new(pages, 64));
        for &(id, n) in seqs {
            c.allocate(id, &[], 0).unwrap();
            if n > 0 {
                c.append(id, n).unwrap();
            }
        }
        c
    }

    #[test]
    fn an_image_computed_whole_is_a_piece_of_its_own() {
        // An image at 600..1700 of a 1720-token prompt, steps of 512 tokens:
        // text up to 512, then up to the image's start, the image whole (over
        // the budget), then the text after it.
        let mut p = progress(1, 1720, 0, 1720);
        p.whole = Some((600, 1700));
        let mut pieces = Vec::new();
        while p.n_computed < p.n_prompt {
            let n = next_piece(&p, 512);
            pieces.push((p.n_computed, p.n_computed + n));
            p.n_computed += n;
            if p.n_computed >= 1700 {
                p.whole = None;
            }
        }
        assert_eq!(pieces, [(0, 512), (512, 600), (600, 1700), (1700, 1720)]);
        // A cached prefix into the image: the rest of it; no budget: nothing.
        p.n_computed = 640;
        p.whole = Some((600, 1700));
        assert_eq!(next_piece(&p, 64), 1060);
        assert_eq!(next_piece(&p, 0), 0);
    }

    #[test]
    fn a_prompt_waiting_for_an_image_stops_before_it_and_others_go_on() {
        // Request 1 waits for an image from position 128 (nothing computed yet),
        // request 2 for one at its next position; request 3 decodes.
        let mut a = progress(1, 300, 0, 300);
        a.blocked_at = 128;
        let mut b = progress(2, 300, 64, 300);
        b.blocked_at = 64;
        let c = progress(3, 10, 12, 13);
        let mut cache = cache_with(64, &[(1, 0), (2, 64), (3, 12)]);
        let p = plan(&[a, b, c], Policy::Fcfs, 1e3, 512, false, &mut cache);
        let got: Vec<_> = p.work.iter().map(|w| (w.id, w.start, w.end)).collect();
        assert_eq!(got, [(3, 12, 13), (1, 0, 128)]);
        assert!(p.preempted.is_empty() && p.out_of_memory.is_empty());
        cache.check_invariants().unwrap();
    }

    #[test]
    fn decodes_go_first_and_prompts_share_the_budget() {
        // Two decoding requests, two prompts of 300 and 700 tokens.
        let running = [
            progress(3, 300, 0, 300),
            progress(1, 10, 12, 13),
            progress(4, 700, 0, 700),
            progress(2, 10, 20, 21),
        ];
        let mut cache = cache_with(64, &[(1, 12), (2, 20), (3, 0), (4, 0)]);
        let p = plan(&running, Policy::Fcfs, 1e3, 512, false, &mut cache);
        let got: Vec<_> = p.work.iter().map(|w| (w.id, w.start, w.end)).collect();
        // Decodes in policy order, then request 3's whole prompt and as much of 4's as
        // the budget leaves, in whole chunks (212 -> 192).
        assert_eq!(got, [(1, 12, 13), (2, 20, 21), (3, 0, 300), (4, 0, 192)]);
        assert!(p.preempted.is_empty() && p.out_of_memory.is_empty());
        for w in &p.work {
            assert_eq!(w.cells.full.len(), w.end - w.start);
            assert!(w.cells.sliding.is_empty());
        }
        cache.check_invariants().unwrap();
    }

    #[test]
    fn the_lowest_ranked_request_is_preempted_when_pages_run_out() {
        // 4 pages of 64 tokens, all held: request 1 three, request 2 one. Both decode
        // into a new page.
        let running = [progress(1, 100, 192, 193), progress(2, 64, 64, 65)];
        let mut cache = cache_with(4, &[(1, 192), (2, 64)]);
        let p = plan(&running, Policy::Fcfs, 1e3, 512, false, &mut cache);
        // Request 1 takes request 2's page; request 2 (ranked lower) is preempted
        // rather than failed: a higher-ranked request holds the memory.
        assert_eq!(p.work.len(), 1);
        assert_eq!((p.work[0].id, p.work[0].start), (1, 192));
        assert_eq!(p.preempted, [2]);
        assert!(!cache.contains(2));
        cache.check_invariants().unwrap();
        // With a fifth page, both run.
        let mut cache = cache_with(6, &[(1, 192), (2, 64)]);
        let p = plan(&running, Policy::Fcfs, 1e3, 512, false, &mut cache);
        assert_eq!(p.work.len(), 2);
        assert!(p.preempted.is_empty());
    }

    #[test]
    fn a_request_that_cannot_fit_alone_runs_out_of_memory() {
        let running = [progress(7, 1000, 0, 1000)];
        let mut cache = cache_with(2, &[(7, 0)]);
        let p = plan(&running, Policy::Fcfs, 1e3, 4096, false, &mut cache);
        // A first chunk that fits (two pages) is planned; it never runs out here.
        assert_eq!(p.work[0].end, 128);
        // Once its pages are full it cannot continue, and nothing ranks above it.
        let running = [progress(7, 1000, 128, 1000)];
        let p = plan(&running, Policy::Fcfs, 1e3, 4096, false, &mut cache);
        assert!(p.work.is_empty());
        assert_eq!(p.out_of_memory, [7]);
        // While a load from the SSD tier holds pages, it waits instead.
        let mut cache = cache_with(2, &[(7, 128)]);
        let p = plan(&running, Policy::Fcfs, 1e3, 4096, true, &mut cache);
        assert_eq!(p.preempted, [7]);
        assert!(p.out_of_memory.is_empty());
        cache.check_invariants().unwrap();
    }

    #[test]
    fn a_prompt_piece_ends_at_its_stop_and_goes_on_next_step() {
        // A checkpoint wanted at 960 of a 1000-token prompt, 512 tokens a step.
        let mut p = progress(1, 1000, 0, 1000);
        p.stop_at = 960;
        let mut cache = cache_with(64, &[(1, 0)]);
        let plan1 = plan(&[p], Policy::Fcfs, 1e3, 2048, false, &mut cache);
        let got: Vec<_> = plan1.work.iter().map(|w| (w.start, w.end)).collect();
        // One piece up to the stop, even with budget left: its state must be the
        // step's last.
        assert_eq!(got, [(0, 960)]);
        p.n_computed = 960;
        p.stop_at = usize::MAX;
        let plan2 = plan(&[p], Policy::Fcfs, 1e3, 2048, false, &mut cache);
        assert_eq!(plan2.work[0].start, 960);
        assert_eq!(plan2.work[0].end, 1000);
        // With a budget of 512 the first piece is cut by it, the second by the stop.
        let mut p = progress(2, 1000, 0, 1000);
        p.stop_at = 960;
        let mut cache = cache_with(64, &[(2, 0)]);
        let plan1 = plan(&[p], Policy::Fcfs, 1e3, 512, false, &mut cache);
        assert_eq!(plan1.work[0].end, 512);
        p.n_computed = 512;
        let plan2 = plan(&[p], Policy::Fcfs, 1e3, 512, false, &mut cache);
        assert_eq!(plan2.work[0].end, 960);
        cache.check_invariants().unwrap();
    }

    #[test]
    fn priority_orders_prompt_chunks() {
        let mut a = progress(1, 512, 0, 512);
        let mut b = progress(2, 512, 0, 512);
        a.rank.priority = 5;
        b.rank.priority = -1;
        let mut cache = cache_with(64, &[(1, 0), (2, 0)]);
        let p = plan(&[a, b], Policy::Priority, 1e3, 512, false, &mut cache);
        let got: Vec<_> = p.work.iter().map(|w| (w.id, w.end)).collect();
        assert_eq!(got, [(2, 512)]);
    }

    #[test]
    fn random_workloads_keep_the_accounting() {
        // Random request states over small pools: every plan stays within the budget
        // and the pages, cells are distinct, and freeing everything returns the pool
        // to empty.
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % m as u64) as usize
        };
        for _ in 0..300 {
            let pages = 2 + next(30);
            let mut cache = KvCache::new(PagePool::new(pages, 64));
            let mut running = Vec::new();
            for id in 1..=(1 + next(6)) as u64 {
                let n_prompt = 1 + next(900);
                let n_computed = if next(2) == 0 { 0 } else { n_prompt + next(40) };
                let n_tokens = n_computed.max(n_prompt) + 1;
                cache.allocate(id, &[], 0).unwrap();
                if n_computed > 0 && cache.append(id, n_computed).is_err() {
                    cache.free(id).unwrap();
                    continue;
                }
                running.push(progress(id, n_prompt, n_computed, n_tokens));
            }
            let budget = 64 * (1 + next(8));
            let p = plan(&running, Policy::Fcfs, 1e3, budget, false, &mut cache);
            cache.check_invariants().unwrap();
            let prompt: usize = p
                .work
                .iter()
                .filter(|w| w.start < running.iter().find(|r| r.id == w.id).unwrap().n_prompt)
                .map(|w| w.end - w.start)
                .sum();
            assert!(prompt <= budget + CHUNK_ALIGN, "{prompt} > {budget}");
            let mut cells: Vec<usize> = p.work.iter().flat_map(|w| w.cells.full.clone()).collect();
            let n = cells.len();
            cells.sort_unstable();
            cells.dedup();
            assert_eq!(cells.len(), n, "a cell handed out twice");
            for r in &running {
                if cache.contains(r.id) {
                    cache.free(r.id).unwrap();
                }
            }
            let s = cache.stats().full;
            assert_eq!(s.in_use, 0);
            assert_eq!(s.free + s.cached, pages);
        }
    }
}
