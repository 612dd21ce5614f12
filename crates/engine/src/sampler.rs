//! Token sampling: repetition/presence/frequency penalties, greedy decoding,
//! and temperature → top-k → top-p → min-p → softmax → draw.
//!
//! Designed for 150K–262K-entry vocabularies: every step is a linear pass
//! over the logits except for partial selections (`select_nth_unstable`) and
//! sorts of the few surviving candidates; the candidate buffer is reused
//! between calls, so steady-state sampling does not allocate.
//!
//! Non-finite logits never cause a panic: `NaN` and `-inf` mean "impossible",
//! `+inf` means "certain" (all `+inf` tokens share the probability mass).

use std::collections::{HashMap, VecDeque};

/// Sampling parameters of one request (OpenAI / llama.cpp semantics).
///
/// The default is greedy decoding with every filter and penalty off.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `0` (or any value `<= 0`) means greedy.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` = off.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability sums to
    /// at least `top_p`; `1` = off. The most likely token is always kept.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the most likely
    /// token's; `0` = off.
    pub min_p: f32,
    /// Divide positive / multiply negative logits of recently seen tokens; `1` = off.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every recently seen token; `0` = off.
    pub presence_penalty: f32,
    /// Subtracted from a recently seen token's logit once per occurrence; `0` = off.
    pub frequency_penalty: f32,
    /// How many of the most recent accepted tokens the penalties consider; `0` = none.
    pub penalty_last_n: usize,
    /// RNG seed; `None` draws a random one. Same seed and inputs ⇒ same tokens.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Whether these parameters select the argmax (no randomness).
    pub fn is_greedy(&self) -> bool {
        greedy_temperature(self.temperature)
    }

    fn has_penalties(&self) -> bool {
        self.penalty_last_n > 0
            && (self.repetition_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
}

/// Temperatures that mean "greedy": non-positive, NaN, or so small that
/// `1 / t` is not finite.
fn greedy_temperature(t: f32) -> bool {
    t.is_nan() || t <= 0.0 || !(1.0 / t).is_finite()
}

/// xoshiro256** seeded through SplitMix64: small, fast and — unlike
/// `rand`'s `StdRng` — specified, so a seed reproduces the same tokens on
/// every platform and `rand` version.
#[derive(Debug, Clone)]
struct Rng {
    s: [u64; 4],
}

impl Rng {
    fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A candidate token: id and (scaled) logit.
type Cand = (u32, f32);

/// Descending by logit, ties by ascending id: a total order on finite logits.
fn by_logit_desc(a: &Cand, b: &Cand) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Per-request sampling state: the RNG and the recent-token window used by
/// the penalties.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// The last `penalty_last_n` accepted tokens, oldest first.
    window: VecDeque<u32>,
    /// Occurrences of each token in `window`.
    counts: HashMap<u32, u32>,
    /// Reused candidate buffer.
    cands: Vec<Cand>,
}

impl Sampler {
    /// A sampler for one request, seeded from `params.seed` (or randomly).
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(rand::random);
        Sampler {
            rng: Rng::new(seed),
            window: VecDeque::with_capacity(params.penalty_last_n.min(4096)),
            counts: HashMap::new(),
            cands: Vec::new(),
            params,
        }
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Records a prompt or generated token for the penalties.
    pub fn accept(&mut self, token: u32) {
        let n = self.params.penalty_last_n;
        if n == 0 {
            return;
        }
        if self.window.len() == n {
            if let Some(old) = self.window.pop_front() {
                if let Some(c) = self.counts.get_mut(&old) {
                    *c -= 1;
                    if *c == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
        self.window.push_back(token);
        *self.counts.entry(token).or_insert(0) += 1;
    }

    /// Whether [`Sampler::sample`] is the plain argmax of the logits (greedy, no
    /// penalties).
    pub fn is_plain_greedy(&self) -> bool {
        self.params.is_greedy() && !self.params.has_penalties()
    }

    /// Picks the next token. `logits` (one per vocabulary entry) may be modified
    /// in place: non-finite values sanitized and penalties applied.
    ///
    /// If no token is possible (empty or all `NaN`/`-inf`), returns 0.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.sample_with_mask(logits, None)
    }

    /// Like [`Sampler::sample`], but tokens for which `allowed` returns
    /// `false` are never chosen (their logits are set to `-inf`), e.g. for a
    /// grammar.
    ///
    /// If every allowed token has a `NaN`/`-inf` logit the lowest allowed id
    /// is returned; if nothing at all is allowed, 0.
    pub fn sample_with_mask(
        &mut self,
        logits: &mut [f32],
        allowed: Option<&dyn Fn(u32) -> bool>,
    ) -> u32 {
        if allowed.is_none() && self.is_plain_greedy() {
            // The common greedy case needs no sanitizing pass: `argmax` skips NaN
            // and takes +inf as it is.
            return argmax(logits).unwrap_or(0);
        }
        self.prepare(logits, allowed);
        let chosen = if self.params.is_greedy() {
            argmax(logits)
        } else {
            self.draw(logits)
        };
        chosen.unwrap_or_else(|| match allowed {
            Some(ok) => (0..logits.len() as u32).find(|&t| ok(t)).unwrap_or(0),
            None => 0,
        })
    }

    /// Sanitizes non-finite logits, applies the mask, then the penalties.
    fn prepare(&self, logits: &mut [f32], allowed: Option<&dyn Fn(u32) -> bool>) {
        // NaN → -inf, +inf → f32::MAX (so that `l - max` is never NaN).
        let clean = |l: f32| {
            if l.is_nan() {
                f32::NEG_INFINITY
            } else {
                l.min(f32::MAX)
            }
        };
        match allowed {
            None => logits.iter_mut().for_each(|l| *l = clean(*l)),
            Some(ok) => {
                for (i, l) in logits.iter_mut().enumerate() {
                    *l = if ok(i as u32) {
                        clean(*l)
                    } else {
                        f32::NEG_INFINITY
                    };
                }
            }
        }
        if !self.params.has_penalties() {
            return;
        }
        let p = &self.params;
        for (&token, &count) in &self.counts {
            let Some(l) = logits.get_mut(token as usize) else {
                continue;
            };
            if *l == f32::NEG_INFINITY {
                continue;
            }
            // llama.cpp's rule (llama_sampler_penalties_apply).
            if *l <= 0.0 {
                *l *= p.repetition_penalty;
            } else {
                *l /= p.repetition_penalty;
            }
            *l -= count as f32 * p.frequency_penalty + p.presence_penalty;
            if l.is_nan() {
                *l = f32::NEG_INFINITY;
            } else {
                *l = l.clamp(f32::NEG_INFINITY, f32::MAX);
            }
        }
    }

    /// Temperature → top-k → top-p → min-p → softmax → draw.
    fn draw(&mut self, logits: &[f32]) -> Option<u32> {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            return None;
        }
        let inv_t = 1.0 / self.params.temperature;
        // Scaled logits relative to the maximum: all <= 0, the best exactly 0,
        // never NaN (`l - max` is finite or -inf, `inv_t` finite and > 0).
        let k = self.params.top_k;
        if k > 0 && k <= STREAM_TOP_K {
            // Small k: pick the k best straight from the logits.
            stream_top_k(logits, k, &mut self.cands);
            self.cands.retain(|c| c.1 > f32::NEG_INFINITY);
            self.cands
                .iter_mut()
                .for_each(|c| c.1 = (c.1 - max) * inv_t);
        } else {
            self.cands.clear();
            self.cands.extend(
                logits
                    .iter()
                    .enumerate()
                    .filter(|&(_, &l)| l > f32::NEG_INFINITY)
                    .map(|(i, &l)| (i as u32, (l - max) * inv_t)),
            );
            apply_top_k(&mut self.cands, k);
        }
        // From here on candidates carry unnormalized probabilities
        // exp(x) in [0, 1]; the best one has exactly 1.
        for c in &mut self.cands {
            c.1 = c.1.exp();
        }
        apply_top_p(&mut self.cands, self.params.top_p);
        apply_min_p(&mut self.cands, self.params.min_p);
        if let [only] = self.cands[..] {
            return Some(only.0);
        }
        let total: f64 = self.cands.iter().map(|c| f64::from(c.1)).sum();
        let mut u = self.rng.next_f64() * total;
        for &(id, w) in &self.cands {
            u -= f64::from(w);
            if u < 0.0 {
                return Some(id);
            }
        }
        // Rounding left a sliver: take the last candidate with mass.
        self.cands
            .iter()
            .rev()
            .find(|c| c.1 > 0.0)
            .or(self.cands.last())
            .map(|c| c.0)
    }
}

/// Index of the largest logit, lowest id on ties; `None` if none is > -inf (NaN
/// never wins). Sampling runs on the engine thread for every sequence of a step,
/// so this is written to vectorize: [`ARGMAX_LANES`] independent running maxima
/// (the first index of each lane's maximum), merged at the end.
fn argmax(logits: &[f32]) -> Option<u32> {
    const L: usize = ARGMAX_LANES;
    let mut val = [f32::NEG_INFINITY; L];
    // The chunk where each lane's maximum sits; `u32::MAX` = none above -inf yet.
    let mut at = [u32::MAX; L];
    let chunks = logits.chunks_exact(L);
    let rest = chunks.remainder();
    for (c, chunk) in chunks.enumerate() {
        for j in 0..L {
            // Strictly greater: a lane keeps its first maximum; NaN never wins.
            let better = chunk[j] > val[j];
            val[j] = if better { chunk[j] } else { val[j] };
            at[j] = if better { c as u32 } else { at[j] };
        }
    }
    let mut best: Option<(f32, u32)> = None;
    for j in 0..L {
        if at[j] == u32::MAX {
            continue;
        }
        let id = at[j] * L as u32 + j as u32;
        if best.is_none_or(|(v, i)| val[j] > v || (val[j] == v && id < i)) {
            best = Some((val[j], id));
        }
    }
    // The tail's ids are above every chunk's: only a strictly greater logit wins.
    let base = (logits.len() - rest.len()) as u32;
    for (k, &l) in rest.iter().enumerate() {
        if best.map_or(l > f32::NEG_INFINITY, |(v, _)| l > v) {
            best = Some((l, base + k as u32));
        }
    }
    best.map(|(_, id)| id)
}

/// Running maxima in [`argmax`]: one AVX-512 register of f32.
const ARGMAX_LANES: usize = 16;

/// Largest `k` for which top-k selection streams over the logits.
const STREAM_TOP_K: usize = 64;

/// Fills `out` with the `k` best `(id, logit)` pairs of `logits` (all
/// entries if fewer), best first, ties by lowest id. `logits` must not
/// contain NaN. O(V) plus O(k) per insertion; insertions are rare for
/// unordered input, so use only for small `k`.
fn stream_top_k(logits: &[f32], k: usize, out: &mut Vec<Cand>) {
    out.clear();
    if k == 0 {
        return;
    }
    for (i, &l) in logits.iter().enumerate() {
        let cand = (i as u32, l);
        if out.len() == k {
            // Ids increase, so an equal logit loses to the one already kept.
            if l <= out[k - 1].1 {
                continue;
            }
            out.pop();
        }
        let at = out.partition_point(|x| by_logit_desc(x, &cand).is_lt());
        out.insert(at, cand);
    }
}

/// Keeps the `k` best candidates (unordered); `k == 0` is off.
fn apply_top_k(c: &mut Vec<Cand>, k: usize) {
    if k > 0 && k < c.len() {
        c.select_nth_unstable_by(k - 1, by_logit_desc);
        c.truncate(k);
    }
}

/// Keeps the smallest set of most likely candidates whose weight reaches
/// `p` of the total (`c` holds unnormalized probabilities). Runs a
/// quickselect on the cumulative weight — expected O(n), no full sort — and
/// leaves the kept candidates first, in no particular order.
fn apply_top_p(c: &mut Vec<Cand>, p: f32) {
    if p.is_nan() || p >= 1.0 || c.len() <= 1 {
        return; // off (also for NaN)
    }
    let total: f64 = c.iter().map(|x| f64::from(x.1)).sum();
    let target = f64::from(p.max(0.0)) * total;
    // Invariant: c[..lo] are the lo best candidates with weight `acc` <
    // target (any order); c[hi..] are worse than everything in c[..hi].
    let (mut lo, mut hi, mut acc) = (0, c.len(), 0.0f64);
    loop {
        if hi - lo <= 32 {
            c[lo..hi].sort_unstable_by(by_logit_desc);
            for i in lo..hi {
                acc += f64::from(c[i].1);
                if acc >= target {
                    c.truncate(i + 1);
                    return;
                }
            }
            c.truncate(hi.max(1)); // rounding: everything up to hi is needed
            return;
        }
        let mid = lo + (hi - lo) / 2;
        c[lo..hi].select_nth_unstable_by(mid - lo, by_logit_desc);
        let better: f64 = c[lo..mid].iter().map(|x| f64::from(x.1)).sum();
        if acc + better >= target {
            hi = mid;
        } else {
            acc += better;
            lo = mid;
        }
    }
}

/// Drops candidates whose probability is below `min_p` times the best one's.
/// `c` holds unnormalized probabilities with maximum 1 (true after
/// [`apply_top_k`] and [`apply_top_p`], which always keep the best candidate).
fn apply_min_p(c: &mut Vec<Cand>, min_p: f32) {
    if min_p.is_nan() || min_p <= 0.0 || c.len() <= 1 {
        return;
    }
    // Never above 1, so the best candidate always survives.
    let threshold = min_p.min(1.0);
    c.retain(|x| x.1 >= threshold);
}

/// The `k` most likely tokens with their log-probabilities under
/// `softmax(logits)`, most likely first (ties: lowest id first).
///
/// `NaN` counts as `-inf`; `+inf` tokens share all the probability. Returns
/// fewer than `k` entries when the vocabulary is smaller, and an empty vector
/// when no logit is above `-inf`.
pub fn log_softmax_top(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let clean = |l: f32| {
        if l.is_nan() {
            f32::NEG_INFINITY
        } else {
            l.min(f32::MAX)
        }
    };
    let max = logits
        .iter()
        .map(|&l| clean(l))
        .fold(f32::NEG_INFINITY, f32::max);
    if k == 0 || max == f32::NEG_INFINITY {
        return Vec::new();
    }
    let max64 = f64::from(max);
    let sum: f64 = logits
        .iter()
        .map(|&l| f64::from((clean(l) - max).exp()))
        .sum();
    // log p = (l - max) - ln(sum): subtracting max first keeps precision even
    // when max is huge (a +inf logit becomes f32::MAX).
    let ln_sum = sum.ln();

    let mut top: Vec<Cand> = Vec::with_capacity(k.min(logits.len()));
    if k <= STREAM_TOP_K {
        if logits.iter().any(|l| l.is_nan()) {
            let cleaned: Vec<f32> = logits.iter().map(|&l| clean(l)).collect();
            stream_top_k(&cleaned, k, &mut top);
        } else {
            stream_top_k(logits, k, &mut top);
        }
        top.iter_mut().for_each(|c| c.1 = clean(c.1));
    } else {
        top.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, clean(l))),
        );
        apply_top_k(&mut top, k);
        top.sort_unstable_by(by_logit_desc);
    }
    top.into_iter()
        .map(|(id, l)| (id, ((f64::from(l) - max64) - ln_sum) as f32))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            seed: Some(seed),
            ..SamplingParams::default()
        }
    }

    fn softmax(logits: &[f32], t: f32) -> Vec<f64> {
        let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = logits
            .iter()
            .map(|&l| f64::from((l - m) / t).exp())
            .collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    /// Empirical token frequencies over `n` draws from the same logits.
    fn histogram(p: SamplingParams, logits: &[f32], n: usize) -> Vec<f64> {
        let mut s = Sampler::new(p);
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..n {
            let mut l = logits.to_vec();
            counts[s.sample(&mut l) as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / n as f64).collect()
    }

    /// Asserts `got` matches `want` within 5 standard errors of `n` draws.
    fn assert_close(got: &[f64], want: &[f64], n: usize) {
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let tol = 5.0 * (w * (1.0 - w) / n as f64).sqrt() + 1e-9;
            assert!(
                (g - w).abs() <= tol,
                "token {i}: got {g:.4}, want {w:.4} (tol {tol:.4})\n{got:?}\n{want:?}"
            );
        }
    }

    /// ln of a known distribution: p = [0.5, 0.25, 0.15, 0.1].
    fn known() -> Vec<f32> {
        [0.5f32, 0.25, 0.15, 0.1].iter().map(|p| p.ln()).collect()
    }

    #[test]
    fn default_is_greedy() {
        let p = SamplingParams::default();
        assert!(p.is_greedy());
        assert_eq!(
            (
                p.top_k,
                p.top_p,
                p.min_p,
                p.repetition_penalty,
                p.penalty_last_n
            ),
            (0, 1.0, 0.0, 1.0, 64)
        );
        assert!(!params(0.5, 1).is_greedy());
        assert!(params(-1.0, 1).is_greedy());
        assert!(params(f32::NAN, 1).is_greedy());
        assert!(params(1e-45, 1).is_greedy());
    }

    #[test]
    fn argmax_matches_a_plain_scan() {
        let plain = |l: &[f32]| {
            let mut best = (None, f32::NEG_INFINITY);
            for (i, &x) in l.iter().enumerate() {
                if x > best.1 {
                    best = (Some(i as u32), x);
                }
            }
            best.0
        };
        let mut rng = Rng::new(7);
        for n in [0, 1, 5, 15, 16, 17, 33, 100, 1000, 49_153] {
            for case in 0..20 {
                // Few distinct values, so ties across lanes and the tail are common.
                let mut l: Vec<f32> = (0..n)
                    .map(|_| (rng.next_f64() * 4.0).floor() as f32)
                    .collect();
                for x in l.iter_mut() {
                    match (rng.next_f64() * 50.0) as u32 {
                        0 => *x = f32::NAN,
                        1 => *x = f32::NEG_INFINITY,
                        2 if case % 5 == 0 => *x = f32::INFINITY,
                        _ => {}
                    }
                }
                assert_eq!(argmax(&l), plain(&l), "n {n} case {case}");
            }
        }
        assert_eq!(argmax(&[f32::NAN; 40]), None);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), None);
    }

    #[test]
    fn greedy_picks_argmax_lowest_id_on_ties() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&mut [1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(s.sample(&mut [-5.0, -1.0, -3.0]), 1);
        assert_eq!(s.sample(&mut [7.0]), 0);
        let mut big = vec![0.0f32; 262_144];
        big[200_000] = 0.5;
        big[250_000] = 0.5;
        assert_eq!(s.sample(&mut big), 200_000);
    }

    #[test]
    fn temperature_matches_softmax() {
        let logits = [1.0f32, 2.0, 0.5, -1.0, 3.0, 2.0];
        let n = 200_000;
        for t in [0.7f32, 1.0, 1.8] {
            let got = histogram(params(t, 42), &logits, n);
            assert_close(&got, &softmax(&logits, t), n);
        }
    }

    #[test]
    fn top_k_keeps_k_best_renormalized() {
        let n = 100_000;
        let p = SamplingParams {
            top_k: 2,
            ..params(1.0, 7)
        };
        let got = histogram(p, &known(), n);
        assert_close(&got, &[2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0], n);
        // top_k = 1 is greedy.
        let p = SamplingParams {
            top_k: 1,
            ..params(5.0, 7)
        };
        assert_eq!(histogram(p, &known(), 1000), [1.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn top_p_keeps_smallest_nucleus() {
        let n = 100_000;
        // Cumulative: 0.5, 0.75, 0.9, 1.0 → p = 0.8 keeps the first three.
        let p = SamplingParams {
            top_p: 0.8,
            ..params(1.0, 8)
        };
        let got = histogram(p, &known(), n);
        assert_close(&got, &[0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0.0], n);
        let p = SamplingParams {
            top_p: 0.6,
            ..params(1.0, 8)
        };
        assert_close(
            &histogram(p, &known(), n),
            &[2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0],
            n,
        );
        // top_p = 0 keeps only the best token.
        let p = SamplingParams {
            top_p: 0.0,
            ..params(1.0, 8)
        };
        assert_eq!(histogram(p, &known(), 1000), [1.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        let n = 100_000;
        // min_p 0.4 → keep p >= 0.2: tokens 0 and 1.
        let p = SamplingParams {
            min_p: 0.4,
            ..params(1.0, 9)
        };
        assert_close(
            &histogram(p, &known(), n),
            &[2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0],
            n,
        );
        // min_p 0.25 → keep p >= 0.125: tokens 0, 1, 2.
        let p = SamplingParams {
            min_p: 0.25,
            ..params(1.0, 9)
        };
        assert_close(
            &histogram(p, &known(), n),
            &[0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0.0],
            n,
        );
        // min_p > 1 still keeps the best token.
        let p = SamplingParams {
            min_p: 3.0,
            ..params(1.0, 9)
        };
        assert_eq!(histogram(p, &known(), 1000), [1.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn temperature_applies_before_filters() {
        // At T = 2 the distribution flattens: sqrt of p, renormalized
        // ≈ [0.347, 0.245, 0.190, 0.155...] (cumulative 0.347, 0.592, 0.782).
        let q: Vec<f64> = softmax(&known(), 2.0);
        let p = SamplingParams {
            top_p: 0.7,
            ..params(2.0, 10)
        };
        let n = 100_000;
        let s3 = q[0] + q[1] + q[2];
        assert_close(
            &histogram(p, &known(), n),
            &[q[0] / s3, q[1] / s3, q[2] / s3, 0.0],
            n,
        );
    }

    #[test]
    fn filters_match_reference_on_large_vocab() {
        let mut rng = Rng::new(123);
        for round in 0..60 {
            let n = 1 + (rng.next_u64() % 20_000) as usize;
            let scale = [0.1f32, 1.0, 5.0, 20.0, 200.0][round % 5];
            // Every third round quantizes logits to create many ties.
            let quant = round % 3 == 0;
            let mut base: Vec<Cand> = (0..n as u32)
                .map(|i| {
                    let x = -(rng.next_f64() as f32) * scale;
                    (i, if quant { (x * 2.0).round() / 2.0 } else { x })
                })
                .collect();
            let max = base.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
            base.iter_mut().for_each(|c| c.1 -= max);
            let mut sorted = base.clone();
            sorted.sort_by(by_logit_desc);

            let k = (rng.next_u64() % (n as u64 + 5)) as usize;
            let mut c = base.clone();
            apply_top_k(&mut c, k);
            c.sort_by(by_logit_desc);
            let want_k = if k == 0 { n } else { k.min(n) };
            assert_eq!(c, sorted[..want_k], "top_k {k} of {n}");
            let small_k = 1 + (rng.next_u64() % STREAM_TOP_K as u64) as usize;
            let raw: Vec<f32> = base.iter().map(|c| c.1).collect();
            stream_top_k(&raw, small_k, &mut c);
            assert_eq!(
                c,
                sorted[..small_k.min(n)],
                "streamed top_k {small_k} of {n}"
            );

            // top-p and min-p work on weights exp(x).
            let weights: Vec<Cand> = base.iter().map(|&(i, x)| (i, x.exp())).collect();
            let mut sorted_w = weights.clone();
            sorted_w.sort_by(by_logit_desc);
            let p = [(rng.next_f64() as f32).min(0.999), 0.0, 0.5][round % 3];
            let mut c = weights.clone();
            apply_top_p(&mut c, p);
            c.sort_by(by_logit_desc);
            let total: f64 = sorted_w.iter().map(|x| f64::from(x.1)).sum();
            let mut cum = 0.0;
            let want_p = sorted_w
                .iter()
                .position(|x| {
                    cum += f64::from(x.1);
                    cum >= f64::from(p) * total
                })
                .map_or(n, |i| i + 1);
            assert_eq!(c, sorted_w[..want_p], "top_p {p} of {n}");

            let m = rng.next_f64() as f32;
            let mut c = weights.clone();
            apply_min_p(&mut c, m);
            c.sort_by(by_logit_desc);
            let want_m: Vec<Cand> = sorted_w.iter().copied().filter(|x| x.1 >= m).collect();
            assert_eq!(c, want_m, "min_p {m} of {n}");
            assert!(!c.is_empty());
        }
    }

    #[test]
    fn repetition_penalty_like_llama_cpp() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(p);
        s.accept(0);
        s.accept(1);
        s.accept(0); // counted once for the repetition penalty
        let mut l = [2.0f32, -1.0, 1.5, 0.0];
        assert_eq!(s.sample(&mut l), 2);
        assert_eq!(l, [1.0, -2.0, 1.5, 0.0]);
    }

    #[test]
    fn presence_and_frequency_penalties() {
        let p = SamplingParams {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(p);
        for t in [0, 0, 0, 2, 99_999] {
            s.accept(t); // out-of-vocabulary ids are ignored
        }
        let mut l = [1.0f32, 1.0, 1.0];
        assert_eq!(s.sample(&mut l), 1);
        assert_eq!(l, [1.0 - 0.5 - 0.75, 1.0, 1.0 - 0.5 - 0.25]);
    }

    #[test]
    fn penalty_window_slides() {
        let p = SamplingParams {
            repetition_penalty: 4.0,
            penalty_last_n: 2,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(p);
        for t in [0, 1, 2] {
            s.accept(t);
        }
        let mut l = [4.0f32, 4.0, 4.0, 4.0];
        assert_eq!(s.sample(&mut l), 0);
        assert_eq!(l, [4.0, 1.0, 1.0, 4.0]);
        // penalty_last_n = 0 disables penalties.
        let p = SamplingParams {
            repetition_penalty: 4.0,
            penalty_last_n: 0,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(p);
        s.accept(0);
        let mut l = [4.0f32, 3.0];
        assert_eq!(s.sample(&mut l), 0);
        assert_eq!(l, [4.0, 3.0]);
    }

    fn run(p: SamplingParams, steps: usize) -> Vec<u32> {
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32) * 0.05).collect();
        let mut s = Sampler::new(p);
        (0..steps)
            .map(|_| {
                let t = s.sample(&mut logits.clone());
                s.accept(t);
                t
            })
            .collect()
    }

    #[test]
    fn same_seed_same_tokens_different_seed_different_tokens() {
        let p = |seed| SamplingParams {
            temperature: 1.0,
            top_k: 200,
            top_p: 0.95,
            min_p: 0.01,
            repetition_penalty: 1.1,
            presence_penalty: 0.1,
            frequency_penalty: 0.1,
            ..params(1.0, seed)
        };
        let a = run(p(1), 200);
        assert_eq!(a, run(p(1), 200));
        assert_ne!(a, run(p(2), 200));
        // Unseeded samplers differ from each other (with overwhelming probability).
        let unseeded = SamplingParams { seed: None, ..p(0) };
        assert_ne!(run(unseeded.clone(), 200), run(unseeded, 200));
    }

    #[test]
    fn seeded_sequence_is_pinned() {
        // The RNG is specified (xoshiro256** / SplitMix64), so a seed must
        // keep producing exactly these draws across platforms and versions.
        let mut r = Rng::new(0);
        let first: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(
            first,
            [
                11091344671253066420,
                13793997310169335082,
                1900383378846508768
            ]
        );
    }

    #[test]
    fn non_finite_logits() {
        let nan = f32::NAN;
        let inf = f32::INFINITY;
        for t in [0.0f32, 1.0] {
            let mut s = Sampler::new(SamplingParams {
                top_p: 0.9,
                min_p: 0.05,
                ..params(t, 3)
            });
            assert_eq!(s.sample(&mut [nan, 1.0, nan]), 1);
            assert_eq!(s.sample(&mut [nan, nan]), 0);
            assert_eq!(s.sample(&mut []), 0);
            assert_eq!(s.sample(&mut [f32::NEG_INFINITY, -inf, 0.0]), 2);
            assert_eq!(s.sample(&mut [1e30, inf, -1e30]), 1);
            assert_eq!(s.sample(&mut [f32::MAX, -f32::MAX]), 0);
            for _ in 0..100 {
                let x = s.sample(&mut [inf, 0.0, inf, nan]);
                assert!(x == 0 || x == 2, "{x}");
            }
        }
        // Penalties on extreme values stay well-defined.
        let p = SamplingParams {
            repetition_penalty: 1e-30,
            frequency_penalty: -1e38,
            ..params(1.0, 4)
        };
        let mut s = Sampler::new(p);
        s.accept(0);
        s.accept(0);
        let mut l = [f32::MAX, 0.0];
        assert_eq!(s.sample(&mut l), 0);
        assert!(l.iter().all(|x| !x.is_nan()));
        // Both +inf tokens are drawn about equally often.
        let h = histogram(params(1.0, 5), &[inf, 0.0, inf], 10_000);
        assert_eq!(h[1], 0.0);
        assert!((h[0] - 0.5).abs() < 0.05, "{h:?}");
    }

    #[test]
    fn mask_disallows_tokens() {
        let only_odd = |t: u32| t % 2 == 1;
        for t in [0.0f32, 1.0] {
            let mut s = Sampler::new(params(t, 11));
            for _ in 0..200 {
                let mut l = vec![5.0, 1.0, 5.0, 0.5, 5.0];
                assert_eq!(s.sample_with_mask(&mut l, Some(&only_odd)) % 2, 1);
            }
            // All allowed tokens impossible: lowest allowed id.
            let mut l = vec![5.0, f32::NEG_INFINITY, 5.0, f32::NAN];
            assert_eq!(s.sample_with_mask(&mut l, Some(&only_odd)), 1);
            assert_eq!(l[0], f32::NEG_INFINITY, "masked logits are set to -inf");
            // Nothing allowed at all: 0.
            assert_eq!(s.sample_with_mask(&mut [1.0, 2.0], Some(&|_| false)), 0);
        }
    }

    #[test]
    fn log_softmax_top_values() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, f32::NAN];
        let top = log_softmax_top(&logits, 3);
        let lse = (1f64.exp() + 2.0 * 3f64.exp() + 2f64.exp()).ln();
        let want = [(1u32, 3.0 - lse), (3, 3.0 - lse), (2, 2.0 - lse)];
        assert_eq!(top.len(), 3);
        for (g, w) in top.iter().zip(want) {
            assert_eq!(g.0, w.0);
            assert!((f64::from(g.1) - w.1).abs() < 1e-6, "{g:?} vs {w:?}");
        }
        assert_eq!(log_softmax_top(&logits, 10).len(), 5);
        assert!(log_softmax_top(&logits, 0).is_empty());
        assert!(log_softmax_top(&[f32::NAN, f32::NEG_INFINITY], 2).is_empty());
        let inf = log_softmax_top(&[f32::INFINITY, 0.0, f32::INFINITY], 3);
        assert_eq!(inf[0].0, 0);
        assert_eq!(inf[1].0, 2);
        assert!((inf[0].1 - (0.5f32).ln()).abs() < 1e-6);
        assert!(inf[2].1 <= -1e38, "{inf:?}");
    }

    #[test]
    fn log_softmax_top_small_and_large_k_agree() {
        let mut rng = Rng::new(77);
        let logits: Vec<f32> = (0..50_000)
            .map(|_| (rng.next_f64() * 30.0 - 15.0) as f32)
            .collect();
        let small = log_softmax_top(&logits, 64);
        let large = log_softmax_top(&logits, 65);
        assert_eq!(small[..], large[..64]);
        assert!(small.windows(2).all(|w| w[0].1 >= w[1].1));
        let total: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let want = f64::from(small[0].1).exp();
        let best = logits.iter().copied().fold(f32::MIN, f32::max);
        assert!((want - f64::from(best).exp() / total).abs() < 1e-6);
    }
}
