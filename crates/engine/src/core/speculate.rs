//! Speculative decoding's part of a step: which requests draft and how many
//! tokens (planned from their acceptance and the measured costs, see
//! [`crate::spec`]), and the drafts themselves, from the request's context, its
//! predicted output, its grammar, or a drafting model (a draft model or the MTP
//! head), proposed before the step is scheduled so they ride in it as rows.
//!
//! Also the scratch state slots a hybrid model's verifying requests write
//! ([`SpecStates`]).

use super::draft::{DraftJob, ModelDrafter};
use super::{EngineCore, Live};
#[cfg(doc)]
use crate::recurrent::RecurrentStates;
use crate::request::RequestId;
use crate::spec::{plan_depths, propose_ngram, propose_predicted, DepthAsk, PlanCost, SpecMode};

/// Scratch state slots of a hybrid model's speculative decoding: the recurrent
/// group's slots `first..first + k * streams`, past those [`RecurrentStates`]
/// manages. A step's `i`-th verifying request writes the state after each of its
/// rows but the last into slots `first + i * k ..`; after sampling, a request that
/// rejected drafts copies the state after its last valid row back into its own
/// slot.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SpecStates {
    pub(super) first: u32,
    pub(super) k: usize,
    /// Requests that may verify drafts in one step (0: no speculation).
    pub(super) streams: usize,
}

impl SpecStates {
    /// The scratch slot holding the state after row `row` (0-based) of the `i`-th
    /// verifying request of a step.
    pub(super) fn slot(&self, i: usize, row: usize) -> u32 {
        debug_assert!(i < self.streams && row < self.k);
        self.first + (i * self.k + row) as u32
    }
}

impl EngineCore {
    /// Speculative decoding: draft tokens for each decoding request that speculates
    /// (see [`crate::spec`]), unless more requests decode than
    /// [`SpecConfig::max_batch`]. Drafts stop before the request's token limit.
    pub(super) fn propose_drafts(&mut self) {
        self.draft_s = 0.0;
        let Some(cfg) = self.config.speculation else {
            return;
        };
        let decoding = self
            .running
            .iter()
            .filter(|s| s.n_computed >= s.n_prompt && s.n_computed < s.tokens.len())
            .count();
        // Requests drafting with the draft model, and how many tokens each.
        let mut wanted: Vec<(RequestId, usize)> = Vec::new();
        // A hybrid model: as many requests draft as have scratch state slots.
        let mut streams = match self.recurrent_group() {
            Some(_) => self.spec_states.streams,
            None => usize::MAX,
        };
        // Who may draft this step (a plain decode step, not one recomputing tokens
        // after a preemption), and at most how many tokens: those that could
        // follow the token this step samples.
        let (mut who, mut asks): (Vec<usize>, Vec<DepthAsk>) = (Vec::new(), Vec::new());
        for (i, s) in self.running.iter_mut().enumerate() {
            s.draft.clear();
            let Some(depth) = s.spec.as_ref() else {
                continue;
            };
            if decoding > cfg.max_batch
                || s.n_computed < s.n_prompt
                || s.n_computed + 1 != s.tokens.len()
            {
                continue;
            }
            let left = s.max_tokens.saturating_sub(s.usage.completion_tokens + 1);
            let ask = DepthAsk {
                max: depth.max.min(left),
                acceptance: depth.acceptance(),
                probe: depth.probe_due(),
                behind: 0,
                left,
            };
            who.push(i);
            asks.push(ask);
        }
        if let Some(d) = self.model_drafter(cfg.mode) {
            for (a, &i) in asks.iter_mut().zip(&who) {
                a.behind = d.behind(self.running[i].id, &self.running[i].tokens);
            }
        }
        let depths: Vec<usize> = match cfg.fixed_depth {
            true => asks.iter().map(|a| a.max).collect(),
            false => {
                let (base, per_row) = self.step_cost.line_or_prior();
                let (draft_token, catch_up_token) = match cfg.mode {
                    SpecMode::Draft | SpecMode::Mtp => {
                        self.draft_cost.seconds(base + per_row, self.token_cost_s)
                    }
                    SpecMode::Ngram => (0.0, 0.0),
                };
                let cost = PlanCost {
                    base,
                    per_row,
                    draft_token,
                    catch_up_token,
                };
                let depths = plan_depths(&asks, decoding, cost);
                tracing::debug!(
                    target: "tempo9_engine::drafts",
                    base_ms = base * 1e3,
                    per_row_ms = per_row * 1e3,
                    draft_token_ms = draft_token * 1e3,
                    catch_up_token_ms = catch_up_token * 1e3,
                    acceptance = ?asks.iter().map(|a| a.acceptance).collect::<Vec<_>>(),
                    behind = ?asks.iter().map(|a| a.behind).collect::<Vec<_>>(),
                    ?depths,
                    "draft depths planned"
                );
                depths
            }
        };
        // What the drafting model reads before drafting (for its cost).
        let mut caught_up = 0;
        for ((&i, ask), &k) in who.iter().zip(&asks).zip(&depths) {
            let s = &mut self.running[i];
            if streams == 0 {
                break;
            }
            // What a grammar forces next is drafted first, at the configured depth
            // (a model that follows its grammar cannot miss it).
            if let Some(c) = s.constraint.as_mut() {
                s.draft = c.forced_tokens();
                s.draft.truncate(ask.max);
            }
            if k > 0 && s.draft.is_empty() && !s.prediction.is_empty() {
                s.draft = propose_predicted(&s.tokens[s.n_prompt..], &s.prediction, k);
            }
            match cfg.mode {
                _ if !s.draft.is_empty() => {}
                SpecMode::Ngram => s.draft = propose_ngram(&s.tokens, k),
                SpecMode::Draft | SpecMode::Mtp if k > 0 => {
                    caught_up += ask.behind;
                    wanted.push((s.id, k));
                }
                SpecMode::Draft | SpecMode::Mtp => {}
            }
            s.cut_drafts_to_constraint();
            let drafting = wanted.last().is_some_and(|w| w.0 == s.id);
            if let Some(d) = s.spec.as_mut() {
                d.drafting(if drafting { k } else { s.draft.len() });
            }
            if !s.draft.is_empty() || drafting {
                streams -= 1;
            }
        }
        if wanted.is_empty() {
            return;
        }
        // All requests' drafts come from the same forward passes of the drafting model.
        let drafter: &mut dyn ModelDrafter = match (cfg.mode, &mut self.drafter, &mut self.mtp) {
            (SpecMode::Mtp, _, Some(m)) => m,
            (SpecMode::Draft, Some(d), _) => d,
            _ => return,
        };
        let passes = wanted.iter().map(|w| w.1).max().unwrap_or(0);
        let running = &self.running;
        let jobs: Vec<DraftJob<'_>> = wanted
            .iter()
            .map(|&(id, k)| DraftJob {
                id,
                tokens: &running[running.iter().position(|s| s.id == id).expect("running")].tokens,
                k,
            })
            .collect();
        let t0 = std::time::Instant::now();
        let proposed = drafter.propose(&jobs);
        self.draft_s = t0.elapsed().as_secs_f64();
        match proposed {
            Ok(drafts) => {
                let (base, per_row) = self.step_cost.line_or_prior();
                self.draft_cost.observe(
                    self.draft_s,
                    jobs.len(),
                    caught_up,
                    passes,
                    base + per_row,
                );
                drop(jobs);
                for ((id, _), d) in wanted.into_iter().zip(drafts) {
                    if let Some(s) = self.running.iter_mut().find(|s| s.id == id) {
                        s.draft = d;
                        s.cut_drafts_to_constraint();
                    }
                }
            }
            Err(e) => {
                // Their drafting KV may be half written: start them afresh next time.
                tracing::warn!(error = %e, mode = ?cfg.mode, "drafting step failed: no drafts this step");
                for (id, _) in wanted {
                    drafter.free(id);
                }
            }
        }
    }

    /// The model that drafts in `mode`, if it has one.
    fn model_drafter(&self, mode: SpecMode) -> Option<&dyn ModelDrafter> {
        match (mode, &self.drafter, &self.mtp) {
            (SpecMode::Mtp, _, Some(m)) => Some(m),
            (SpecMode::Draft, Some(d), _) => Some(d),
            _ => None,
        }
    }

    /// Logs each request's drafts for this step (target `tempo9_engine::drafts`, at
    /// trace level): `n_tokens` counts the tokens before `last`, which the drafts
    /// follow.
    pub(super) fn trace_drafts(&self) {
        if !tracing::enabled!(target: "tempo9_engine::drafts", tracing::Level::TRACE) {
            return;
        }
        for s in self.running.iter().filter(|s| !s.draft.is_empty()) {
            tracing::trace!(
                target: "tempo9_engine::drafts",
                id = s.id,
                n_tokens = s.tokens.len() - 1,
                last = s.tokens[s.tokens.len() - 1],
                drafts = ?s.draft,
                "drafts proposed"
            );
        }
    }

    /// Whether request `s`'s rows in a step hand their hidden states to the MTP head.
    pub(super) fn feeds_mtp(&self, s: &Live) -> bool {
        self.mtp.is_some() && s.spec.is_some()
    }
}
