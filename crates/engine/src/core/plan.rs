//! Planning a step: the prompt tokens it may compute (the ITL target), the
//! scheduler's plan, and its preemptions carried out (preempted requests wait again,
//! those that can never fit end).

use super::{EngineCore, Live};
use crate::request::FinishReason;
#[cfg(doc)]
use crate::scheduler::Policy;
use crate::scheduler::{self, itl_budget, Progress};

impl EngineCore {
    /// Recent compute cost per prompt token in microseconds (1 ms until measured),
    /// for [`Policy::Shortest`].
    pub(super) fn cost_us(&self) -> f64 {
        self.token_cost_s.map_or(1e3, |c| c * 1e6)
    }

    /// Prompt tokens this step may compute: `step_tokens` (`solo_step_tokens` while
    /// one request runs and the others wait only for its prefix:
    /// `only_prefix_waiters`, from [`Self::admit`]), or while some request is
    /// decoding, what fits the ITL target at the recent cost per token (see
    /// [`itl_budget`]).
    fn prompt_budget(&self, progress: &[Progress], only_prefix_waiters: bool) -> usize {
        let solo = self.running.len() == 1 && only_prefix_waiters && self.loading.is_empty();
        let full = if solo {
            self.config.solo_step_tokens.max(self.config.step_tokens)
        } else {
            self.config.step_tokens
        };
        let decoding = progress.iter().filter(|p| p.decoding()).count();
        let prompting = progress.iter().filter(|p| p.prompt_left() > 0).count();
        match (self.config.itl_target, self.token_cost_s) {
            (Some(target), Some(cost)) => {
                itl_budget(full, target.as_secs_f64() / cost, decoding, prompting)
            }
            _ => full,
        }
    }

    /// Plans the step ([`scheduler::plan`]) and carries out its preemptions: preempted
    /// requests go back to waiting, those that can never fit end. Returns the work,
    /// in batch order.
    pub(super) fn schedule(&mut self, only_prefix_waiters: bool) -> Vec<scheduler::Work> {
        let progress: Vec<Progress> = self.running.iter().map(Live::progress).collect();
        let budget = self.prompt_budget(&progress, only_prefix_waiters);
        let plan = scheduler::plan(
            &progress,
            self.config.policy,
            self.cost_us(),
            budget,
            !self.loading.is_empty(),
            &mut self.cache,
        );
        for id in plan.preempted {
            let i = self.running_index(id).expect("planned requests run");
            let mut s = self.running.remove(i);
            s.n_computed = 0;
            s.usage.preemptions += 1;
            self.stats.preemptions_total += 1;
            tracing::debug!(id = s.id, "preempted");
            self.waiting.push(s);
        }
        for id in plan.out_of_memory {
            let i = self.running_index(id).expect("planned requests run");
            let s = self.running.remove(i);
            self.end(s, FinishReason::ContextFull);
        }
        plan.work
    }
}
