//! Ending requests: cancelled ones are reaped at a step's start, and every end
//! (finished, cancelled, failed, out of memory) sends the final event and releases
//! the request's pages, keeping what the prefix cache can reuse.

use std::sync::atomic::Ordering;

use super::draft::ModelDrafter;
use super::{EngineCore, Live};
use crate::partial_page;
use crate::request::{Event, Finish, FinishReason};

impl EngineCore {
    /// Ends cancelled requests, waiting, loading or running.
    pub(super) fn reap_cancelled(&mut self) {
        self.ssd_reap_cancelled();
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].cancelled() {
                let s = self.waiting.remove(i);
                if !s.admitted_before {
                    self.queued.fetch_sub(1, Ordering::Relaxed);
                }
                self.end(s, FinishReason::Cancelled);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].cancelled() {
                let s = self.running.remove(i);
                self.end(s, FinishReason::Cancelled);
            } else {
                i += 1;
            }
        }
    }

    /// Sends the final event and releases the request's pages (its committed full
    /// pages stay in the prefix cache, and so does the page where its prompt's exact
    /// cells end, as a copy source for the next turn: see [`crate::partial_page`]).
    /// Text still held back is dropped: the request ends without a token of its own
    /// (cancelled, failed or out of memory).
    pub(super) fn end(&mut self, s: Live, reason: FinishReason) {
        if let Some(d) = self.drafter.as_mut() {
            d.free(s.id);
        }
        if let Some(m) = self.mtp.as_mut() {
            m.free(s.id);
        }
        if self.cache.contains(s.id) {
            let ps = self.cache.page_size();
            // The exact cells are in this admission's pages once its prompt is computed
            // (a resumed request recomputes them); a failed step's KV is not trusted.
            let written = s.n_computed >= s.n_prompt && !matches!(reason, FinishReason::Error(_));
            let held = self.cache.page_table(s.id).map_or(0, <[_]>::len);
            let tail =
                partial_page::exact_tail(s.exact_cells, ps).filter(|&(j, _)| written && j < held);
            match tail {
                Some((j, exact)) => {
                    let tokens = &s.tokens[j * ps..j * ps + exact];
                    // A page the answer filled is already cached as a whole page.
                    self.cache
                        .free_keeping_tail(s.id, j, tokens)
                        .expect("allocated");
                }
                None => self.cache.free(s.id).expect("allocated"),
            }
        }
        let _ = s.tx.send(Event::Finished(Finish {
            reason,
            usage: s.usage,
        }));
    }
}
