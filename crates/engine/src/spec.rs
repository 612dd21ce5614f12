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
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig {
            mode: SpecMode::Ngram,
            k: 4,
            max_batch: 16,
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

/// Verifications at depth 1 in a row that accept nothing before a request stops
/// drafting for a while (drafts that never hold cost a verification row each step:
/// 0.68x single-stream decode on the H200 with an MTP head whose drafts all fail).
const MISSES_BEFORE_REST: usize = 8;
/// Steps of the first rest; each rest after another run of misses is twice as long,
/// up to [`LONGEST_REST`], and any accepted draft starts over.
const FIRST_REST: usize = 16;
/// The longest rest, in steps.
const LONGEST_REST: usize = 256;

/// A request's draft depth, adapted to how many of its drafts were accepted: up by
/// one after a step that accepted all, halved after one that accepted none; after
/// [`MISSES_BEFORE_REST`] misses at depth 1, no drafts for a rest of steps that
/// doubles while the misses go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Depth {
    /// Draft tokens to ask for next.
    pub now: usize,
    /// The configured most.
    pub max: usize,
    /// Verifications at depth 1 in a row that accepted nothing.
    misses: usize,
    /// Steps left without drafts.
    resting: usize,
    /// The next rest's length.
    next_rest: usize,
}

impl Depth {
    pub fn new(max: usize) -> Depth {
        Depth {
            now: max,
            max,
            misses: 0,
            resting: 0,
            next_rest: FIRST_REST,
        }
    }

    /// Draft tokens to ask for in this step (0 while resting; counts the step).
    pub fn take(&mut self) -> usize {
        if self.resting > 0 {
            self.resting -= 1;
            return 0;
        }
        self.now
    }

    /// Records a verification of `drafted` tokens, `accepted` of them taken.
    pub fn update(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        if accepted > 0 {
            self.misses = 0;
            self.next_rest = FIRST_REST;
        }
        if accepted == drafted {
            self.now = (self.now + 1).min(self.max);
        } else if accepted == 0 {
            if self.now == 1 {
                self.misses += 1;
                if self.misses >= MISSES_BEFORE_REST {
                    self.misses = 0;
                    self.resting = self.next_rest;
                    self.next_rest = (self.next_rest * 2).min(LONGEST_REST);
                }
            }
            self.now = (self.now / 2).max(1);
        }
    }
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
    fn depth_adapts_to_acceptance() {
        let mut d = Depth::new(4);
        d.update(4, 0);
        assert_eq!(d.now, 2);
        d.update(2, 0);
        d.update(1, 0);
        assert_eq!(d.now, 1);
        d.update(1, 1);
        assert_eq!(d.now, 2);
        d.update(2, 1);
        assert_eq!(d.now, 2);
        for _ in 0..5 {
            d.update(d.now, d.now);
        }
        assert_eq!(d.now, 4);
        d.update(0, 0);
        assert_eq!(d.now, 4);
    }

    #[test]
    fn depth_rests_after_misses_and_rests_longer_while_they_go_on() {
        let mut d = Depth::new(2);
        let drafted_steps = |d: &mut Depth, steps: usize, accept: bool| {
            let mut n = 0;
            for _ in 0..steps {
                let k = d.take();
                if k > 0 {
                    n += 1;
                    d.update(k, if accept { k } else { 0 });
                }
            }
            n
        };
        // Depth 2 -> 1, then 8 misses at depth 1, then a rest of 16 steps.
        assert_eq!(drafted_steps(&mut d, 9, false), 9);
        assert_eq!(d.take(), 0);
        assert_eq!(drafted_steps(&mut d, 15, false), 0);
        // Probing again: 8 misses, then a rest of 32.
        assert_eq!(drafted_steps(&mut d, 8, false), 8);
        assert_eq!(drafted_steps(&mut d, 32, false), 0);
        // A draft that holds starts over: drafting every step, rests back to 16.
        assert_eq!(drafted_steps(&mut d, 4, true), 4);
        assert_eq!(d.now, 2);
        assert_eq!(drafted_steps(&mut d, 9, false), 9);
        assert_eq!(drafted_steps(&mut d, 16, false), 0);
        assert_eq!(d.take(), 1);
    }
}
