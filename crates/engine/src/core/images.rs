//! Images of running requests: asking the encoder thread for the ones a prompt
//! still needs and handing its results to the requests waiting for them (see
//! [`crate::vision`]).

use std::sync::atomic::Ordering;

use super::EngineCore;
use crate::request::{FinishReason, RequestId};

impl EngineCore {
    /// Hands finished encodes to every request holding that image, ends those
    /// whose image failed to encode, and asks the encoder for the images running
    /// requests still have to compute (from its cache when it has them). A request
    /// waits only at an image whose embeddings have not arrived (see
    /// `Images::blocked_at`); every other request's steps go on meanwhile.
    pub(super) fn poll_images(&mut self) {
        let EngineCore {
            vision,
            running,
            waiting,
            loading,
            ..
        } = self;
        let Some(v) = vision.as_mut() else {
            return;
        };
        let mut failed: Vec<(RequestId, String)> = Vec::new();
        for (hash, result) in v.take_done() {
            let lives = running
                .iter_mut()
                .chain(waiting.iter_mut())
                .chain(loading.iter_mut().map(|l| &mut l.live));
            for s in lives {
                for p in s.images.iter_mut() {
                    if p.hash() != hash || p.embeds.is_some() {
                        continue;
                    }
                    match &result {
                        Ok(e) => p.embeds = Some(e.clone()),
                        Err(e) => failed.push((s.id, e.clone())),
                    }
                }
            }
        }
        for s in running.iter_mut() {
            let n_computed = s.n_computed;
            for p in s.images.iter_mut() {
                if p.embeds.is_none() && p.end() > n_computed {
                    p.embeds = v.request(&p.pixels);
                }
            }
        }
        for (id, msg) in failed {
            let reason = FinishReason::Error(format!("image encoding failed: {msg}"));
            if let Some(i) = self.running_index(id) {
                let s = self.running.remove(i);
                self.end(s, reason);
            } else if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
                let s = self.waiting.remove(i);
                if !s.admitted_before {
                    self.queued.fetch_sub(1, Ordering::Relaxed);
                }
                self.end(s, reason);
            }
        }
    }
}
