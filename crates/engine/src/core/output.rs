//! From a step's logits to a request's events: sampling under its constraint, mask
//! and banned tokens, log-probabilities, stop conditions and text deltas.

use tempo9_tokenizer::Tokenizer;

use super::Live;
use crate::request::{Event, FinishReason, TokenEvent};
use crate::sampler::log_softmax_top;

/// Samples `s`'s next token from its logits `l` (changed in place by the sampler),
/// sends its event, and says whether (and why) the request ends.
pub(super) fn sample_one(
    s: &mut Live,
    l: &mut [f32],
    tok: &Tokenizer,
    max_context: usize,
) -> Option<FinishReason> {
    let want_top = s.top_logprobs.max(usize::from(s.logprobs));
    let top = if want_top > 0 {
        log_softmax_top(l, want_top)
    } else {
        Vec::new()
    };
    // The chosen token's log-probability is of the raw distribution; keep it only
    // when asked for (a vocabulary-sized copy per token otherwise).
    let raw = s.logprobs.then(|| (log_sum_exp(l), l.to_vec()));
    for &t in &s.banned {
        if let Some(x) = l.get_mut(t as usize) {
            *x = f32::NEG_INFINITY;
        }
    }
    let t = match s.mask.take() {
        Some(Err(e)) => return Some(FinishReason::ConstraintDeadEnd(e)),
        Some(Ok(m)) if m.is_empty() => {
            return Some(FinishReason::ConstraintDeadEnd(
                "the constraint allows no token".into(),
            ))
        }
        Some(Ok(m)) => s.sampler.sample_with_mask(l, Some(&|t| m.is_allowed(t))),
        None => s.sampler.sample(l),
    };
    let logprob = raw.map(|(log_z, raw)| chosen_logprob(&top, t, log_z, &raw));
    take_token(s, t, logprob, top, tok, max_context)
}

/// Appends the chosen token `t` to `s` (with its log-probability and top list when
/// asked for), sends its event, and says whether (and why) the request ends.
pub(super) fn take_token(
    s: &mut Live,
    t: u32,
    logprob: Option<f32>,
    top: Vec<(u32, f32)>,
    tok: &Tokenizer,
    max_context: usize,
) -> Option<FinishReason> {
    s.sampler.accept(t);
    s.tokens.push(t);
    s.usage.completion_tokens += 1;
    let mut finish = None;
    if let Some(c) = s.constraint.as_mut() {
        if let Err(e) = c.accept(t) {
            finish = Some(FinishReason::ConstraintDeadEnd(e));
        }
    }
    let is_stop_token = (s.stop_eog && tok.is_eog(t)) || s.stop_ids.contains(&t);
    let mut text = String::new();
    if finish.is_none() {
        if is_stop_token {
            finish = Some(FinishReason::StopToken(t));
        } else {
            let step = s.text.push(t);
            text = step.text;
            finish = step.stop.map(FinishReason::StopString);
        }
    }
    if finish.is_none() {
        finish = if s.constraint.as_ref().is_some_and(|c| c.is_finished()) {
            Some(FinishReason::ConstraintDone)
        } else if s.usage.completion_tokens >= s.max_tokens {
            if s.tokens.len() >= max_context {
                Some(FinishReason::ContextFull)
            } else {
                Some(FinishReason::Length)
            }
        } else {
            None
        };
    }
    if finish.is_some() && !matches!(finish, Some(FinishReason::StopString(_))) {
        text.push_str(&s.text.finish());
    }
    let top_logprobs = if s.top_logprobs > 0 {
        top.into_iter().take(s.top_logprobs).collect()
    } else {
        Vec::new()
    };
    let _ = s.tx.send(Event::Token(TokenEvent {
        id: t,
        text,
        logprob,
        top_logprobs,
    }));
    finish
}

/// The chosen token's log-probability: from the top list when it is there (same
/// arithmetic as the top list), else from the log-partition.
fn chosen_logprob(top: &[(u32, f32)], t: u32, log_z: f32, l: &[f32]) -> f32 {
    top.iter()
        .find(|&&(id, _)| id == t)
        .map(|&(_, lp)| lp)
        .unwrap_or_else(|| l.get(t as usize).map_or(f32::NEG_INFINITY, |&x| x - log_z))
}

/// `ln(sum(exp(l)))`, ignoring NaN.
fn log_sum_exp(l: &[f32]) -> f32 {
    let max = l
        .iter()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    if !max.is_finite() {
        return max;
    }
    let sum: f64 = l
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&x| f64::from(x - max).exp())
        .sum();
    max + sum.ln() as f32
}
