//! Where a hybrid model's recurrent state is checkpointed, so that later prompts
//! resume from it instead of recomputing from their first token (see
//! [`crate::recurrent`]).
//!
//! A state exists only at the end of a step, so a checkpoint position is a point
//! where the scheduler ends the request's prompt piece ([`Progress::stop_at`]). Each
//! admission plans its positions ([`EngineCore::plan_state_targets`]), all page
//! boundaries that leave at least [`ROW_GROUP`] prompt tokens after them (as a hit
//! does, so the rest is computed with the same arithmetic as without the stop):
//! - every [`EngineConfig::state_checkpoint_tokens`] tokens of a long prompt, so a
//!   prompt that parts from it anywhere recomputes less than that (less than 1.25
//!   times that: an interval position within a quarter interval before another
//!   position is skipped, as each position costs a step boundary and a copy);
//! - the junction: the last page boundary of the full-attention match, when the
//!   deepest checkpoint lies a quarter interval or more before it (the second
//!   prompt of a family recomputes from there once and checkpoints the junction;
//!   later ones hit it);
//! - the prompt's last such boundary (the next turn of an agent continues there).
//!   The piece does not stop there: the step whose piece computes it writes the
//!   state as it was at that row into the checkpoint's slot as well
//!   ([`EngineCore::reserve_state_snapshots`]; the delta rule keeps the states of a
//!   chunk's last rows). A stop would cost a step, and on a mixture-of-experts model
//!   a step of a few dozen rows reads nearly every expert (on the H200, the 64-row
//!   step after a 448-row piece of a 512-token prompt took half as long again).
//!
//! A prompt waiting for a shared prefix that a running prompt is computing adds its
//! junction to that prompt's positions and waits for it
//! ([`EngineCore::add_junction_targets`]). An agent's next turn repeats its answer:
//! it resumes at the previous prompt's end, recomputes the answer as part of its
//! prompt and checkpoints where the cached pages end (its junction). With
//! [`EngineConfig::answer_state_checkpoints`], the state after each page an answer
//! fills is checkpointed instead, replacing the answer's previous one, and the next
//! turn resumes at the answer's last page; that state is the one decoding computed,
//! not what computing the answer as a prompt gives (see that setting).
//!
//! [`Progress::stop_at`]: crate::scheduler::Progress
//! [`EngineConfig::state_checkpoint_tokens`]: super::EngineConfig::state_checkpoint_tokens
//! [`EngineConfig::answer_state_checkpoints`]: super::EngineConfig::answer_state_checkpoints

use tempo9_models::GroupKind;

use super::{EngineCore, Live};
use crate::partial_page::ROW_GROUP;
use crate::request::RequestId;
use crate::scheduler::Work;

/// A checkpoint taken inside a step: request `id`'s state `back` rows before the
/// end of its piece goes to state slot `slot`, the checkpoint of page hash `hash`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Snapshot {
    pub id: RequestId,
    pub slot: u32,
    pub back: usize,
    pub hash: u64,
}

impl EngineCore {
    /// The recurrent group's index in the KV store.
    pub(super) fn recurrent_group(&self) -> Option<usize> {
        self.groups
            .iter()
            .position(|g| g.kind == GroupKind::Recurrent)
    }

    /// The deepest position of `s`'s prompt a checkpoint may be taken at.
    fn last_target(&self, s: &Live) -> usize {
        let ps = self.cache.page_size();
        s.n_prompt.saturating_sub(ROW_GROUP) / ps * ps
    }

    /// Plans where `s`, just admitted with its first `s.n_computed` tokens cached,
    /// checkpoints its prompt; `junction`: the tokens of its full-attention match.
    pub(super) fn plan_state_targets(&self, s: &mut Live, junction: usize) {
        s.state_targets.clear();
        if self.cache.recurrent().is_none() {
            return;
        }
        let last = self.last_target(s);
        let start = s.n_computed;
        let every = self.config.state_checkpoint_tokens;
        s.tail_target = (last > start).then_some(last);
        // Stops; `last` only to keep interval positions away from it (it is taken
        // inside its step, see `reserve_state_snapshots`).
        let mut t: Vec<usize> = vec![last];
        // The junction only where it spares a prompt parting there a quarter interval
        // of recompute: an agent's next turn parts from its own history a page or
        // two after the checkpoint it resumes from, and a stop there would cost it a
        // step for nothing.
        let junction = junction.min(last);
        if junction >= start + every / 4 {
            t.push(junction);
        }
        // Interval positions, but none within a quarter interval before another
        // position (each costs the request a step boundary and a state copy): a
        // prompt parting anywhere still recomputes fewer than 1.25 intervals.
        if let Some(n) = last.checked_div(every) {
            let near = |p: usize| t.iter().any(|&q| q > p && q - p < every / 4);
            let interval: Vec<usize> = (1..=n).map(|i| i * every).filter(|&p| !near(p)).collect();
            t.extend(interval);
        }
        t.retain(|&p| p > start && p > 0 && p != last);
        t.sort_unstable();
        t.dedup();
        s.state_targets = t;
    }

    /// For each waiting prompt next in line that shares a page or more beyond its
    /// own hit with a running prompt still computing it (`only`: the running
    /// request at that index, else all): makes that prompt checkpoint the last page
    /// boundary they share, so the waiting one resumes there
    /// ([`Self::prefix_in_flight`] holds it back until then).
    pub(super) fn add_junction_targets(&mut self, only: Option<usize>) {
        if self.cache.recurrent().is_none() || self.waiting.is_empty() {
            return;
        }
        let ps = self.cache.page_size();
        let running = match only {
            Some(i) => i..i + 1,
            None => 0..self.running.len(),
        };
        let mut adds: Vec<(usize, usize)> = Vec::new();
        // Those next in line (the waiting list is in policy order): a step compares
        // at most `max_running` waiting prompts with each running one.
        for w in self.waiting.iter().take(self.config.max_running) {
            let usable = self.usable_prefix(w);
            let cached = self
                .cache
                .lookup_prefix(&w.tokens[..usable], 0)
                .n_cached_tokens;
            for i in running.clone() {
                let r = &self.running[i];
                if r.n_computed >= r.n_prompt {
                    continue;
                }
                let common = r.shared_prompt(&w.tokens[..usable]);
                let t = common.min(self.last_target(r)) / ps * ps;
                if t > r.n_computed && t >= cached + ps {
                    adds.push((i, t));
                }
            }
        }
        for (i, t) in adds {
            let targets = &mut self.running[i].state_targets;
            if let Err(at) = targets.binary_search(&t) {
                targets.insert(at, t);
            }
        }
    }

    /// Whether `w` (hybrid model) shares a prompt with a running request that will
    /// checkpoint a page boundary deeper than `w`'s own hit: admitted after that,
    /// it resumes there.
    pub(super) fn state_in_flight(&self, w: &Live, usable: usize) -> bool {
        let ps = self.cache.page_size();
        let cached = self
            .cache
            .lookup_prefix(&w.tokens[..usable], 0)
            .n_cached_tokens;
        self.running.iter().any(|r| {
            let common = r.shared_prompt(&w.tokens[..usable]);
            r.state_targets
                .iter()
                .chain(&r.tail_target)
                .any(|&t| t > r.n_computed && t >= cached + ps && t <= common)
        })
    }

    /// Before a step: for each request whose piece computes its prompt's last
    /// checkpoint position, takes the checkpoint's slot, for the step to write the
    /// state as it was at that row (a snapshot). Evicted checkpoints go to the SSD
    /// tier first: the step overwrites their slots.
    pub(super) fn reserve_state_snapshots(&mut self, work: &[Work]) -> Vec<Snapshot> {
        if self.recurrent_group().is_none() {
            return Vec::new();
        }
        let mut snaps = Vec::new();
        for w in work {
            let i = self.running_index(w.id).expect("planned requests run");
            let s = &mut self.running[i];
            let Some(p) = s.tail_target.filter(|&p| w.start < p && p <= w.end) else {
                continue;
            };
            s.tail_target = None;
            let Some((copy, hash)) = self.cache.take_checkpoint(s.id, &s.tokens[..p]) else {
                continue;
            };
            tracing::debug!(id = s.id, at = p, "state checkpoint taken in step");
            snaps.push(Snapshot {
                id: s.id,
                slot: copy.to,
                back: w.end - p,
                hash,
            });
        }
        self.keep_taken_checkpoints(snaps, |x| (x.hash, x.slot))
    }

    /// Of checkpoints just taken (each `key`: its page hash and slot), those still
    /// in their slot. A slot taken later in the same pass may have evicted one taken
    /// earlier: that checkpoint is gone (its slot is the later one's) and was never
    /// written, so it is neither saved nor copied. Other evicted checkpoints go to
    /// the SSD tier before their slots are written.
    fn keep_taken_checkpoints<T>(
        &mut self,
        taken: Vec<T>,
        key: impl Fn(&T) -> (u64, u32),
    ) -> Vec<T> {
        let r = self.cache.recurrent();
        let (kept, lost): (Vec<T>, Vec<T>) = taken.into_iter().partition(|x| {
            let (hash, slot) = key(x);
            r.is_some_and(|r| r.checkpoint(hash) == Some(slot))
        });
        let lost: Vec<u64> = lost.iter().map(|x| key(x).0).collect();
        self.ssd_save_evicted_states(&lost);
        kept
    }

    /// After a step: checkpoints the states of the requests whose piece ended at one
    /// of their positions, or whose answer just filled a page (before any of them
    /// ends and frees its slot).
    pub(super) fn take_state_checkpoints(&mut self, work: &[Work]) {
        let Some(g) = self.recurrent_group() else {
            return;
        };
        let ps = self.cache.page_size();
        let mut copies = Vec::new();
        for w in work {
            let i = self.running_index(w.id).expect("planned requests run");
            let s = &mut self.running[i];
            // Where its state now is: the piece's end, or after verifying drafts the
            // last valid row (a page end inside the rows it accepted is not checkpointed).
            let end = s.n_computed;
            let answer =
                self.config.answer_state_checkpoints && end > s.n_prompt && end.is_multiple_of(ps);
            // Positions a hit or a load from the SSD tier went past are dropped.
            let target = s.state_targets.contains(&end);
            s.state_targets.retain(|&t| t > end);
            if !answer && !target {
                continue;
            }
            let Some((copy, hash)) = self.cache.take_checkpoint(s.id, &s.tokens[..end]) else {
                continue;
            };
            if answer {
                // One checkpoint per answer: the deepest.
                if let Some(old) = s.answer_checkpoint.replace(hash) {
                    self.cache.drop_checkpoint(old);
                }
            }
            tracing::debug!(id = s.id, at = end, answer, "state checkpoint taken");
            copies.push((copy, hash));
        }
        let copies = self.keep_taken_checkpoints(copies, |(c, hash)| (*hash, c.to));
        for (c, hash) in copies {
            if let Err(e) = self.kv.copy_cells(g, c.from as usize, c.to as usize, 1) {
                tracing::warn!(error = %e, "state checkpoint copy failed; dropped");
                self.cache.drop_checkpoint(hash);
            }
        }
    }
}
