//! Speculative decoding: draft tokens proposed before a step, verified inside it.
//!
//! A decoding request with drafts computes its last token and its `k` draft tokens
//! in one step, as `k + 1` decode rows (each its own sequence span in the batch, so
//! each row's numbers are exactly those it would get decoded alone: the same
//! attention window, kernel and matmul grouping; see `core::runner`). The engine
//! then samples row by row: a draft is accepted while it equals the token sampled
//! at its position, so greedy output is identical to decoding without drafts, and
//! sampled output follows the same distribution (drafts are deterministic proposals:
//! sampling the target and comparing is the rejection rule for a one-point draft
//! distribution). The first row whose draft differs yields the token actually
//! sampled there; the KV of the rejected rows is dropped (the page tail only).
//!
//! Drafts come from the request's predicted output when it has one
//! ([`propose_predicted`]), else from the request's own context ([`propose_ngram`],
//! prompt lookup: agents re-emit code, paths and JSON from their history), or from
//! a smaller draft model with the same vocabulary ([`SpecMode::Draft`]), or the
//! model's own multi-token-prediction head ([`SpecMode::Mtp`]).

/// Where drafts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpecMode {
    /// Prompt lookup: the tokens that followed the latest earlier occurrence of the
    /// context's last n-gram.
    #[default]
    Ngram,
    /// A second, smaller model with the same vocabulary decodes the drafts greedily
    /// (`EngineConfig::draft_model`; see `core::draft`).
    Draft,
    /// The model's own multi-token-prediction head (Qwen3.5's `nextn` block)
    /// decodes the drafts from the model's hidden states (see `core::mtp`).
    Mtp,
}

impl SpecMode {
    /// Parses `ngram`, `draft` or `mtp`.
    pub fn parse(s: &str) -> Option<SpecMode> {
        match s {
            "ngram" => Some(SpecMode::Ngram),
            "draft" => Some(SpecMode::Draft),
            "mtp" => Some(SpecMode::Mtp),
            _ => None,
        }
    }
}

/// Speculative decoding settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecConfig {
    /// Where drafts come from.
    pub mode: SpecMode,
    /// Most draft tokens per request and step (1..=[`MAX_DRAFT`]).
    pub k: usize,
    /// No request drafts while more than this many requests decode: a large batch
    /// already fills the device, and rejected rows then cost more than they save.
    pub max_batch: usize,
    /// Draft `k` tokens whenever drafts are found, whatever they cost (llama.cpp's
    /// way). Off (the default), each step's depths are planned from each request's
    /// acceptance and the measured cost of a step's rows ([`plan_depths`]).
    pub fixed_depth: bool,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig {
            mode: SpecMode::Ngram,
            k: 4,
            max_batch: 16,
            fixed_depth: false,
        }
    }
}

/// Most draft tokens per step a request may verify.
pub const MAX_DRAFT: usize = 16;

/// Longest n-gram [`propose_ngram`] matches.
const NGRAM_MAX: usize = 4;
/// Shortest n-gram [`propose_ngram`] matches (a single token follows too many
/// different tokens to predict the next ones).
const NGRAM_MIN: usize = 2;
/// How far back [`propose_ngram`] searches, in tokens (bounds its cost per step).
const NGRAM_WINDOW: usize = 1 << 16;

/// Up to `k` draft tokens for the sequence `tokens`: the tokens that followed the
/// most recent earlier occurrence of its last n-gram, longest n-gram first
/// ([`NGRAM_MAX`] down to [`NGRAM_MIN`]); empty when none recurs.
pub fn propose_ngram(tokens: &[u32], k: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 {
        return Vec::new();
    }
    let lo = len.saturating_sub(NGRAM_WINDOW);
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if len <= n {
            continue;
        }
        let tail = &tokens[len - n..];
        // Latest start `i` of an earlier occurrence (ending before the tail's end).
        let found = (lo..len - n).rev().find(|&i| &tokens[i..i + n] == tail);
        if let Some(i) = found {
            let from = i + n;
            let to = (from + k).min(len);
            if from < to {
                return tokens[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

/// Longest tail of the answer [`propose_predicted`] looks for in the prediction
/// once the answer has left it.
const PREDICTION_NGRAM: usize = 8;

/// Up to `k` draft tokens from a request's predicted output (OpenAI's "predicted
/// outputs"): while the answer so far (`answer`) repeats the prediction from its
/// start, the prediction's next tokens; once it has parted from it, the tokens after
/// the first place in the prediction where the answer's last tokens (up to
/// [`PREDICTION_NGRAM`], longest first) occur: an edited file's answer rejoins the
/// original after each change. Empty when nothing fits.
pub fn propose_predicted(answer: &[u32], prediction: &[u32], k: usize) -> Vec<u32> {
    let g = answer.len();
    if k == 0 {
        return Vec::new();
    }
    if prediction.starts_with(answer) {
        return prediction[g.min(prediction.len())..(g + k).min(prediction.len())].to_vec();
    }
    for n in (1..=PREDICTION_NGRAM.min(g)).rev() {
        let tail = &answer[g - n..];
        let found = prediction
            .windows(n)
            .position(|w| w == tail)
            .map(|i| i + n)
            .filter(|&from| from < prediction.len());
        if let Some(from) = found {
            return prediction[from..(from + k).min(prediction.len())].to_vec();
        }
    }
    Vec::new()
}

/// Steps without drafts before a request drafts one token again to measure its
/// acceptance (a request whose drafts stopped holding, or that the plan left
/// without drafts); doubled after each probe that accepts nothing, up to
/// [`LONGEST_REST`], and back to this once a draft holds.
const FIRST_REST: usize = 16;
/// The longest rest, in steps.
const LONGEST_REST: usize = 256;
/// Weight of the past in a request's acceptance per verified draft token: about the
/// last seven count (what an answer repeats changes within it: a tool call's keys
/// and punctuation, then its values).
const ACCEPT_DECAY: f64 = 0.85;
/// A new request's acceptance counts as this many verified draft tokens at
/// [`PRIOR_ACCEPTANCE`] (an optimistic start that its own drafts soon replace).
const PRIOR_TRIES: f64 = 2.0;
/// See [`PRIOR_TRIES`].
const PRIOR_ACCEPTANCE: f64 = 0.8;

/// A request's drafting record: how often its drafts are accepted, and how long
/// it has gone without drafting. Each step's depth comes from [`plan_depths`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Depth {
    /// The configured most draft tokens per step.
    pub max: usize,
    /// Draft tokens accepted, decayed by [`ACCEPT_DECAY`] per verified token.
    hits: f64,
    /// Draft tokens verified up to and including the first rejected one, decayed
    /// alike (the tokens after a rejection say nothing of acceptance).
    tries: f64,
    /// Steps in a row without drafts.
    quiet: usize,
    /// Quiet steps before the next probe.
    probe_after: usize,
}

impl Depth {
    pub fn new(max: usize) -> Depth {
        Depth {
            max,
            hits: PRIOR_TRIES * PRIOR_ACCEPTANCE,
            tries: PRIOR_TRIES,
            quiet: 0,
            probe_after: FIRST_REST,
        }
    }

    /// The chance that a draft token is accepted when the one before it was.
    pub fn acceptance(&self) -> f64 {
        self.hits / self.tries
    }

    /// Whether this step should draft at least one token to measure acceptance
    /// again, after enough steps without drafts.
    pub fn probe_due(&self) -> bool {
        self.quiet >= self.probe_after
    }

    /// Records how many tokens this step drafts.
    pub fn drafting(&mut self, k: usize) {
        self.quiet = if k == 0 { self.quiet + 1 } else { 0 };
    }

    /// Records a verification of `drafted` tokens, `accepted` of them taken.
    pub fn update(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let tried = accepted + usize::from(accepted < drafted);
        let keep = ACCEPT_DECAY.powi(tried as i32);
        self.hits = keep * self.hits + accepted as f64;
        self.tries = keep * self.tries + tried as f64;
        self.probe_after = if accepted > 0 {
            FIRST_REST
        } else {
            (self.probe_after * 2).min(LONGEST_REST)
        };
    }
}

/// What one step costs, as a line in its rows: `base + per_row * rows` seconds,
/// fitted to the engine's recent decode-only steps (their whole time: drafting,
/// the model, sampling), past steps weighing less. The fit is anchored by a prior
/// (one more row costs `prior_row_share` of a one-row step) counted as two steps of
/// 1 and 2 rows at the data's scale, so a few noisy steps, or steps whose rows have
/// not varied, cannot tilt it far; a step slower than four times what the line
/// says (the machine busy with something else) counts as four times.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StepCost {
    /// Share of a one-row step that one more row costs, before measurements.
    prior_row_share: f64,
    /// Decayed sums: weight, rows, seconds, rows², rows × seconds.
    n: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
}

/// Weight of the past in [`StepCost`] per observed step.
const COST_DECAY: f64 = 0.97;
/// Weight of each of [`StepCost`]'s two prior steps.
const COST_PRIOR_STEPS: f64 = 1.0;
/// Bounds of the fitted cost of one more row, as a share of a one-row step. Above
/// one: a drafted row can cost more than a whole plain step (a draft model's own
/// forward pass per draft token, then the row's verification: 1.5B drafted by the
/// 0.5B on two CPU cores decodes at 0.6x with every draft accepted).
const ROW_SHARE: (f64, f64) = (0.01, 4.0);

impl StepCost {
    /// A cost model for a device on which one more row costs `prior_row_share` of a
    /// one-row step until measured (the CPU: most of one; a GPU: little).
    pub fn new(prior_row_share: f64) -> StepCost {
        StepCost {
            prior_row_share,
            n: 0.0,
            sx: 0.0,
            sy: 0.0,
            sxx: 0.0,
            sxy: 0.0,
        }
    }

    /// Records a decode-only step of `rows` rows that took `seconds`.
    pub fn observe(&mut self, rows: usize, seconds: f64) {
        let x = rows as f64;
        let y = match self.line() {
            Some((b, r)) => seconds.min(4.0 * (b + r * x)),
            None => seconds,
        };
        self.n = COST_DECAY * self.n + 1.0;
        self.sx = COST_DECAY * self.sx + x;
        self.sy = COST_DECAY * self.sy + y;
        self.sxx = COST_DECAY * self.sxx + x * x;
        self.sxy = COST_DECAY * self.sxy + x * y;
    }

    /// [`StepCost::line`], or before any step the prior's split of a one-row step
    /// of one (unknown) unit of time: what [`plan_depths`] needs is the ratio.
    pub fn line_or_prior(&self) -> (f64, f64) {
        self.line()
            .unwrap_or((1.0 - self.prior_row_share, self.prior_row_share))
    }

    /// `(base, per_row)` in seconds, or `None` before any step.
    pub fn line(&self) -> Option<(f64, f64)> {
        if self.n < 1.0 {
            return None;
        }
        let share = self.prior_row_share;
        // The prior's one-row time at the data's scale, as steps of 1 and 2 rows.
        let (mx, my) = (self.sx / self.n, self.sy / self.n);
        let t1 = my / (1.0 + share * (mx - 1.0));
        let (y1, y2) = (t1, t1 * (1.0 + share));
        let w = COST_PRIOR_STEPS;
        let n = self.n + 2.0 * w;
        let (mx, my) = ((self.sx + 3.0 * w) / n, (self.sy + w * (y1 + y2)) / n);
        let var = (self.sxx + 5.0 * w) / n - mx * mx;
        let cov = (self.sxy + w * (y1 + 2.0 * y2)) / n - mx * my;
        let slope = cov / var;
        let one_row = my - slope * (mx - 1.0);
        if one_row.is_nan() || one_row <= 0.0 {
            return Some((t1 * (1.0 - share), t1 * share));
        }
        let s = (slope / one_row).clamp(ROW_SHARE.0, ROW_SHARE.1);
        Some((one_row * (1.0 - s), one_row * s))
    }
}

/// What a drafting model's work costs (the `draft` and `mtp` modes; n-gram and
/// predicted drafts cost nothing): seconds per draft token (one forward pass of
/// the drafting model for every request drafting in the step) and per token
/// caught up (the tokens of a request it has not yet seen, computed in one pass
/// before its first draft: the prompt the first time, the tokens since it last
/// drafted after a rest). Until measured, from the target model's own costs: a
/// draft token a share of its one-row step (decode moves every weight once, so
/// about the drafting model's bytes over the target's), a caught-up token a share
/// of what the target's prefill spends per token (a draft model: the same bytes
/// share; the MTP head: one layer of the target's), or before any prefill was
/// measured a quarter of the draft token's. Then decayed averages of what the
/// passes took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DraftCost {
    token: Measured,
    catch_up: Measured,
    /// Share of the target's prefill cost per token that a caught-up token costs.
    catch_up_share: f64,
}

/// A cost in seconds, or a share of a one-row step until measured.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Measured {
    Share(f64),
    Seconds(f64),
}

impl Measured {
    fn seconds(self, one_row: f64) -> f64 {
        match self {
            Measured::Share(s) => s * one_row,
            Measured::Seconds(s) => s,
        }
    }

    fn observe(&mut self, seconds: f64) {
        *self = Measured::Seconds(match *self {
            Measured::Share(_) => seconds,
            Measured::Seconds(old) => DRAFT_COST_DECAY * old + (1.0 - DRAFT_COST_DECAY) * seconds,
        });
    }
}

/// Weight of the past in [`DraftCost`]'s averages per drafting pass.
const DRAFT_COST_DECAY: f64 = 0.8;

impl DraftCost {
    /// Costs for a drafting model whose draft token costs `token_share` of the
    /// target's one-row step and whose caught-up token costs `catch_up_share` of
    /// the target's prefill per token (0, 0: drafts cost nothing).
    pub fn new(token_share: f64, catch_up_share: f64) -> DraftCost {
        DraftCost {
            token: Measured::Share(token_share),
            catch_up: Measured::Share(token_share / 4.0),
            catch_up_share,
        }
    }

    /// Records one drafting call that took `seconds`: `caught_up` tokens
    /// computed before the first drafts, then `passes` draft passes (the first
    /// draft comes with the catch-up pass). A call that caught up no more than
    /// its last token per request measures a draft token; one that caught up
    /// more measures a caught-up token, less its draft tokens' known cost.
    pub fn observe(
        &mut self,
        seconds: f64,
        jobs: usize,
        caught_up: usize,
        passes: usize,
        one_row: f64,
    ) {
        if passes == 0 {
            return;
        }
        if caught_up <= jobs {
            self.token.observe(seconds / passes as f64);
        } else {
            let drafts = self.token.seconds(one_row) * (passes - 1) as f64;
            self.catch_up
                .observe((seconds - drafts).max(0.0) / caught_up as f64);
        }
    }

    /// Seconds per draft token and per caught-up token, given a one-row step's
    /// and, if measured, the target's prefill seconds per token.
    pub fn seconds(&self, one_row: f64, prefill_token: Option<f64>) -> (f64, f64) {
        let catch_up = match (self.catch_up, prefill_token) {
            (Measured::Share(_), Some(p)) => self.catch_up_share * p,
            (c, _) => c.seconds(one_row),
        };
        (self.token.seconds(one_row), catch_up)
    }
}

/// A step's costs for [`plan_depths`], in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PlanCost {
    /// The target model's step: `base + per_row * rows` (see [`StepCost`]).
    pub base: f64,
    /// See [`PlanCost::base`].
    pub per_row: f64,
    /// The drafting model's work per draft token (0 without one).
    pub draft_token: f64,
    /// Its work per token it catches up.
    pub catch_up_token: f64,
}

/// Tokens ahead over which a request's drafting must repay its catch-up (about
/// a tool call's or an edit's length: an answer may end sooner).
const PAYBACK_TOKENS: usize = 128;

/// One decoding request's part in [`plan_depths`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DepthAsk {
    /// Most draft tokens it may take this step.
    pub max: usize,
    /// The chance each draft token is accepted when the one before it was.
    pub acceptance: f64,
    /// It drafts one token if drafting can pay at all (a probe, see
    /// [`Depth::probe_due`]).
    pub probe: bool,
    /// Tokens the drafting model must catch up before its first draft.
    pub behind: usize,
    /// Tokens it may still generate.
    pub left: usize,
}

/// Draft depths for one step in which `decoding` requests decode, `asks` of them
/// may draft, at `cost`. Draft tokens are added best first: the `j`-th draft of a
/// request with acceptance `a` adds `a^j` expected tokens and costs a row and a
/// draft token; one is added while that beats the tokens per second the step
/// already yields (`a^j > (per_row + draft_token) * tokens / seconds`). So drafts
/// deepen while they hold and rows are cheap (a GPU's decode step), and stop where
/// a row costs about a decode row (a small model on two CPU cores) or the step is
/// already large. A request that must first catch up (the drafting model has not
/// seen its latest tokens) drafts only if what its drafts save over its next
/// [`PAYBACK_TOKENS`] tokens repays that, counting a probe's drafts as certain: a
/// draft model that costs about what it saves never pays for reading the prompt.
pub(crate) fn plan_depths(asks: &[DepthAsk], decoding: usize, cost: PlanCost) -> Vec<usize> {
    let per_draft = cost.per_row + cost.draft_token;
    let mut depth = vec![0usize; asks.len()];
    let mut tokens = decoding as f64;
    let mut seconds = cost.base + cost.per_row * decoding as f64;
    // Seconds a token is worth: what the step spends per token without drafts.
    let worth = seconds / tokens.max(1.0);
    let pays = |a: &DepthAsk, acceptance: f64| {
        // Steps over the payback horizon at about 1 + a tokens each, each saving
        // what an accepted draft is worth less what it costs.
        let steps = a.left.min(PAYBACK_TOKENS) as f64 / (1.0 + acceptance);
        let saving = steps * (acceptance * worth - per_draft);
        saving > a.behind as f64 * cost.catch_up_token
    };
    let open: Vec<bool> = asks
        .iter()
        .map(|a| a.max > 0 && pays(a, if a.probe { 1.0 } else { a.acceptance }))
        .collect();
    // The next draft's gain for each ask.
    let gain = |i: usize, d: &[usize]| asks[i].acceptance.powi(d[i] as i32 + 1);
    for (i, a) in asks.iter().enumerate() {
        if a.probe && open[i] {
            tokens += gain(i, &depth);
            depth[i] = 1;
            seconds += per_draft;
        }
    }
    loop {
        let best = (0..asks.len())
            .filter(|&i| open[i] && depth[i] < asks[i].max)
            .max_by(|&i, &j| gain(i, &depth).total_cmp(&gain(j, &depth)));
        let Some(i) = best else { break };
        let g = gain(i, &depth);
        if g * seconds <= per_draft * tokens {
            break;
        }
        depth[i] += 1;
        tokens += g;
        seconds += per_draft;
    }
    depth
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_proposes_what_followed_the_latest_match() {
        // "1 2 3 9 ... 1 2 3" -> the tokens after the earlier "1 2 3".
        let t = [1, 2, 3, 9, 8, 7, 5, 1, 2, 3];
        assert_eq!(propose_ngram(&t, 3), vec![9, 8, 7]);
        assert_eq!(propose_ngram(&t, 1), vec![9]);
        // The latest occurrence wins.
        let t = [4, 5, 1, 4, 5, 2, 4, 5];
        assert_eq!(propose_ngram(&t, 1), vec![2]);
        // Drafts stop at the context's end.
        let t = [7, 7, 7];
        assert_eq!(propose_ngram(&t, 4), vec![7]);
        // No recurring bigram: nothing.
        assert!(propose_ngram(&[1, 2, 3, 4, 5, 1], 4).is_empty());
        assert!(propose_ngram(&[1, 2, 1, 2], 0).is_empty());
        assert!(propose_ngram(&[], 4).is_empty());
    }

    #[test]
    fn ngram_prefers_the_longer_match() {
        // Bigram "2 3" last occurred followed by 6, but the 3-gram "1 2 3" by 9.
        let t = [1, 2, 3, 9, 0, 2, 3, 6, 0, 1, 2, 3];
        assert_eq!(propose_ngram(&t, 1), vec![9]);
    }

    #[test]
    fn predictions_draft_along_and_rejoin_after_an_edit() {
        let pred = [10, 11, 12, 13, 14, 15, 16];
        // Along the prediction from its start.
        assert_eq!(propose_predicted(&[], &pred, 3), vec![10, 11, 12]);
        assert_eq!(propose_predicted(&[10, 11], &pred, 3), vec![12, 13, 14]);
        assert_eq!(
            propose_predicted(&[10, 11, 12, 13, 14, 15], &pred, 3),
            vec![16]
        );
        // Past its end: nothing.
        assert!(propose_predicted(&pred, &pred, 3).is_empty());
        // The answer changed 12 to 99: nothing until it rejoins, then what follows.
        assert!(propose_predicted(&[10, 11, 99], &pred, 2).is_empty());
        assert_eq!(propose_predicted(&[10, 11, 99, 13], &pred, 2), vec![14, 15]);
        // The longest matching tail wins over a shorter, earlier one.
        let pred = [1, 2, 7, 3, 2, 8];
        assert_eq!(propose_predicted(&[5, 3, 2], &pred, 1), vec![8]);
        assert!(propose_predicted(&[1], &pred, 0).is_empty());
    }

    #[test]
    fn acceptance_follows_recent_verifications() {
        let mut d = Depth::new(4);
        assert!((d.acceptance() - PRIOR_ACCEPTANCE).abs() < 1e-9);
        for _ in 0..30 {
            d.update(4, 4);
        }
        assert!(d.acceptance() > 0.99, "{}", d.acceptance());
        // A rejection counts its position; the drafts after it do not count.
        let mut h = Depth::new(4);
        for _ in 0..50 {
            h.update(4, 1);
        }
        assert!((h.acceptance() - 0.5).abs() < 0.01, "{}", h.acceptance());
        for _ in 0..30 {
            d.update(2, 0);
        }
        assert!(d.acceptance() < 0.05, "{}", d.acceptance());
        d.update(0, 0);
        assert!(d.acceptance() < 0.05);
    }

    #[test]
    fn quiet_requests_probe_and_back_off_while_probes_miss() {
        let mut d = Depth::new(2);
        let quiet = |d: &mut Depth| {
            let mut n = 0;
            while !d.probe_due() {
                d.drafting(0);
                n += 1;
            }
            d.drafting(1);
            n
        };
        assert_eq!(quiet(&mut d), 16);
        d.update(1, 0);
        assert_eq!(quiet(&mut d), 32);
        d.update(1, 0);
        assert_eq!(quiet(&mut d), 64);
        // A draft that holds starts over.
        d.update(1, 1);
        assert_eq!(quiet(&mut d), 16);
        for _ in 0..10 {
            d.update(1, 0);
        }
        assert_eq!(quiet(&mut d), LONGEST_REST);
    }

    #[test]
    fn step_cost_fits_a_line_in_rows() {
        let mut c = StepCost::new(0.5);
        assert_eq!(c.line(), None);
        // Only one-row steps: the prior splits their time.
        for _ in 0..10 {
            c.observe(1, 0.010);
        }
        let (b, r) = c.line().unwrap();
        assert!(
            (b - 0.005).abs() < 1e-9 && (r - 0.005).abs() < 1e-9,
            "{b} {r}"
        );
        // Steps of 1 to 5 rows at 8 ms + 2 ms a row.
        for i in 0..200 {
            let rows = 1 + i % 5;
            c.observe(rows, 0.008 + 0.002 * rows as f64);
        }
        let (b, r) = c.line().unwrap();
        assert!(
            (b - 0.008).abs() < 1e-3 && (r - 0.002).abs() < 2e-4,
            "{b} {r}"
        );
        // A step slowed tenfold by something else moves the row's share little.
        c.observe(3, 0.14);
        let (b2, r2) = c.line().unwrap();
        let share = |b: f64, r: f64| r / (b + r);
        assert!((share(b2, r2) - share(b, r)).abs() < 0.03, "{b2} {r2}");
        // Steps costing nothing per row, or everything, stay within the bounds.
        let mut free = StepCost::new(0.5);
        let mut dear = StepCost::new(0.5);
        for i in 0..100 {
            let rows = 1 + i % 4;
            free.observe(rows, 0.01);
            dear.observe(rows, 0.01 * rows as f64);
        }
        let (b, r) = free.line().unwrap();
        assert!(r / (b + r) <= 0.03, "{b} {r}");
        let (b, r) = dear.line().unwrap();
        assert!(r / (b + r) >= 0.9, "{b} {r}");
    }

    /// A cost with no drafting model: one-row step `base + per_row`.
    fn free_drafts(base: f64, per_row: f64) -> PlanCost {
        PlanCost {
            base,
            per_row,
            draft_token: 0.0,
            catch_up_token: 0.0,
        }
    }

    fn ask(acceptance: f64, max: usize) -> DepthAsk {
        DepthAsk {
            max,
            acceptance,
            probe: false,
            behind: 0,
            left: 1000,
        }
    }

    #[test]
    fn depths_deepen_where_rows_are_cheap_and_drafts_hold() {
        // A GPU-like step (a row costs 2% of a one-row step): deep drafts while
        // they mostly hold, shallow ones when they seldom do.
        assert_eq!(
            plan_depths(&[ask(0.9, 8)], 1, free_drafts(1.0, 0.02)),
            vec![8]
        );
        assert_eq!(
            plan_depths(&[ask(0.2, 8)], 1, free_drafts(1.0, 0.02)),
            vec![2]
        );
        // Two CPU cores on a small model (a row costs about half a one-row step):
        // shallower, and none when drafts seldom hold.
        assert_eq!(
            plan_depths(&[ask(0.8, 4)], 1, free_drafts(1.0, 1.0)),
            vec![2]
        );
        assert_eq!(
            plan_depths(&[ask(0.3, 4)], 1, free_drafts(1.0, 1.0)),
            vec![0]
        );
        // The configured most, and a probe's one draft where a draft can pay.
        assert_eq!(
            plan_depths(&[ask(0.99, 3)], 1, free_drafts(1.0, 0.0)),
            vec![3]
        );
        let probe = DepthAsk {
            probe: true,
            ..ask(0.01, 4)
        };
        assert_eq!(plan_depths(&[probe], 1, free_drafts(1.0, 1.0)), vec![1]);
        // The best drafts across requests first; a large step takes fewer.
        assert_eq!(
            plan_depths(&[ask(0.9, 4), ask(0.5, 4)], 2, free_drafts(1.0, 0.1)),
            vec![4, 1]
        );
        assert_eq!(
            plan_depths(&[ask(0.9, 4), ask(0.5, 4)], 32, free_drafts(1.0, 0.1)),
            vec![2, 0]
        );
    }

    #[test]
    fn a_draft_model_drafts_only_where_it_repays_its_reading() {
        // Measured on two CPU cores (2026-12-05): Qwen2.5-Coder-1.5B's one-row
        // step 29 ms, 16 ms a row more; the 0.5B's draft token ~12 ms, a token
        // caught up 4.4 ms.
        let cpu = PlanCost {
            base: 0.013,
            per_row: 0.016,
            draft_token: 0.012,
            catch_up_token: 0.0044,
        };
        // Drafts that hold 95% save almost nothing a token; never worth reading a
        // 528-token prompt, nor probing for.
        let fresh = DepthAsk {
            behind: 528,
            ..ask(0.95, 2)
        };
        assert_eq!(plan_depths(&[fresh], 1, cpu), vec![0]);
        let probe = DepthAsk {
            probe: true,
            behind: 17,
            ..ask(0.1, 2)
        };
        assert_eq!(plan_depths(&[probe], 1, cpu), vec![0]);
        // A GPU-like cost (rows and draft tokens cheap, catching up cheap): the
        // same request drafts at once, and a probe after a rest goes ahead.
        let gpu = PlanCost {
            base: 0.010,
            per_row: 0.0005,
            draft_token: 0.001,
            catch_up_token: 0.00005,
        };
        assert_eq!(plan_depths(&[fresh], 1, gpu), vec![2]);
        assert_eq!(plan_depths(&[probe], 1, gpu), vec![1]);
        // An answer about to end does not repay a long catch-up.
        let ending = DepthAsk { left: 2, ..fresh };
        assert_eq!(plan_depths(&[ending], 1, gpu), vec![0]);
    }

    #[test]
    fn draft_costs_are_measured_apart() {
        let mut c = DraftCost::new(0.3, 0.3);
        // Before any pass: shares of a one-row step, or of the target's measured
        // prefill per token for a caught-up token.
        let (_, u) = c.seconds(0.030, Some(0.010));
        assert!((u - 0.003).abs() < 1e-12, "{u}");
        let (t, u) = c.seconds(0.030, None);
        assert!(
            (t - 0.009).abs() < 1e-12 && (u - 0.00225).abs() < 1e-12,
            "{t} {u}"
        );
        // A pass with no catch-up: 2 draft tokens in 24 ms.
        c.observe(0.024, 1, 1, 2, 0.030);
        assert_eq!(c.seconds(0.030, None).0, 0.012);
        // A catch-up of 101 tokens then 1 more draft pass: 0.5 s less 12 ms.
        c.observe(0.5, 1, 101, 2, 0.030);
        let (t, u) = c.seconds(0.030, Some(0.010));
        assert_eq!(t, 0.012);
        assert!((u - 0.488 / 101.0).abs() < 1e-12, "{u}");
    }
}
