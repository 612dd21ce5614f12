//! Request intake: a request is checked against the engine's fixed limits (here
//! and in the threaded handle, before it reaches the engine thread), refused with a
//! [`SubmitError`], or made a waiting [`Live`] request with its stream.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tempo9_models::vision::ImageDecoding;

use super::{EngineCore, Live};
use crate::image::Images;
use crate::request::{Event, Finish, FinishReason, Request, Usage};
use crate::sampler::Sampler;
use crate::scheduler::Rank;
use crate::spec::{Depth, MAX_DRAFT};
use crate::stop::TextStream;
use crate::stream::{RequestStream, Ticket};

/// Why a request was refused at submission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// Too many requests are waiting.
    #[error("server busy: {waiting} requests already waiting")]
    QueueFull {
        /// Requests waiting.
        waiting: usize,
    },
    /// The prompt leaves no room for output within the context limit.
    #[error("prompt of {prompt_tokens} tokens exceeds the context limit of {max_context} tokens")]
    PromptTooLong {
        /// Prompt tokens.
        prompt_tokens: usize,
        /// The limit (prompt + output).
        max_context: usize,
    },
    /// The request is malformed.
    #[error("invalid request: {0}")]
    BadRequest(String),
    /// The engine has shut down.
    #[error("the engine has stopped")]
    Stopped,
}

/// Checks a request against the engine's fixed limits; shared by the core and the
/// threaded handle (which refuses bad requests before they reach the engine thread).
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub n_vocab: usize,
    pub max_context: usize,
    pub max_waiting: usize,
    /// Most tokens the whole pool can hold for one request.
    pub pool_tokens: usize,
    /// With a vision encoder: pixels per side of one image token (a
    /// preprocessed image's sides are multiples of it).
    pub image_token_side: Option<usize>,
    /// With a vision encoder: how the model takes an image's tokens.
    pub image_decoding: ImageDecoding,
}

impl Limits {
    pub fn check(&self, r: &Request, waiting: usize) -> Result<(), SubmitError> {
        if r.prompt.is_empty() {
            return Err(SubmitError::BadRequest("empty prompt".into()));
        }
        let mut ids = r.prompt.iter().chain(&r.prediction);
        if let Some(&t) = ids.find(|&&t| t as usize >= self.n_vocab) {
            return Err(SubmitError::BadRequest(format!(
                "token {t} outside the vocabulary of {}",
                self.n_vocab
            )));
        }
        if r.prediction.len() > self.max_context {
            return Err(SubmitError::BadRequest(format!(
                "predicted output of {} tokens exceeds the context limit of {} tokens",
                r.prediction.len(),
                self.max_context
            )));
        }
        self.check_images(r)?;
        let limit = self.max_context.min(self.pool_tokens);
        if r.prompt.len() >= limit {
            return Err(SubmitError::PromptTooLong {
                prompt_tokens: r.prompt.len(),
                max_context: limit,
            });
        }
        if waiting >= self.max_waiting {
            return Err(SubmitError::QueueFull { waiting });
        }
        Ok(())
    }
}

impl Limits {
    /// Images must lie in the prompt, in order, on the encoder's grid.
    fn check_images(&self, r: &Request) -> Result<(), SubmitError> {
        if r.images.is_empty() {
            return Ok(());
        }
        let Some(side) = self.image_token_side else {
            return Err(SubmitError::BadRequest(
                "this model takes no images (no vision projector is loaded)".into(),
            ));
        };
        let mut next = 0;
        for (i, img) in r.images.iter().enumerate() {
            let (w, h) = (img.pixels.width, img.pixels.height);
            if w == 0 || h == 0 || !w.is_multiple_of(side) || !h.is_multiple_of(side) {
                return Err(SubmitError::BadRequest(format!(
                    "image {i} of {w}x{h} pixels is not preprocessed for the encoder (sides must be multiples of {side})"
                )));
            }
            if img.pixels.planar.len() != 3 * w * h {
                return Err(SubmitError::BadRequest(format!(
                    "image {i}: {} values for 3 channels of {w}x{h}",
                    img.pixels.planar.len()
                )));
            }
            let end = img.at + (w / side) * (h / side);
            if img.at < next || end > r.prompt.len() {
                return Err(SubmitError::BadRequest(format!(
                    "image {i}'s tokens {}..{end} overlap another image or leave the prompt of {} tokens",
                    img.at,
                    r.prompt.len()
                )));
            }
            next = end;
        }
        Ok(())
    }
}

impl EngineCore {
    /// Per-request limit on prompt plus output tokens.
    pub fn max_context(&self) -> usize {
        self.limits.max_context.min(self.limits.pool_tokens)
    }

    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    pub(crate) fn queued(&self) -> Arc<AtomicUsize> {
        self.queued.clone()
    }

    /// Queues a request; its events arrive on the returned stream as steps run.
    pub fn submit(&mut self, r: Request) -> Result<RequestStream, SubmitError> {
        self.limits.check(&r, self.waiting.len())?;
        self.queued.fetch_add(1, Ordering::Relaxed);
        Ok(self.enqueue(r))
    }

    /// Queues an already checked request under a new id.
    fn enqueue(&mut self, r: Request) -> RequestStream {
        self.next_id += 1;
        let (ticket, stream) = RequestStream::open(self.next_id);
        self.enqueue_ticket(r, ticket);
        stream
    }

    /// Queues an already checked request whose stream the caller already holds.
    pub(crate) fn enqueue_ticket(&mut self, r: Request, ticket: Ticket) {
        let Ticket { id, tx, cancel } = ticket;
        let n_prompt = r.prompt.len();
        let room = self.max_context() - n_prompt;
        let mut sampler = Sampler::new(r.sampling);
        r.prompt.iter().for_each(|&t| sampler.accept(t));
        let side = self.limits.image_token_side.unwrap_or(1);
        let images = Images::new(r.images, side, self.limits.image_decoding);
        let mut prompt = r.prompt;
        images.key_prompt(&mut prompt);
        let live = Live {
            id,
            rank: Rank {
                arrival: id,
                priority: r.priority,
                arrived_us: self.epoch.elapsed().as_micros() as u64,
            },
            tokens: prompt,
            n_computed: 0,
            n_prompt,
            max_tokens: r.max_tokens.min(room),
            stop_eog: r.stop.eog,
            stop_ids: r.stop.token_ids,
            logprobs: r.logprobs,
            top_logprobs: r.top_logprobs,
            banned: r.banned_tokens,
            deterministic: r.deterministic,
            constraint: r.constraint,
            mask: None,
            sampler,
            text: TextStream::new(self.tok.clone(), &r.stop.strings),
            tx,
            cancel,
            usage: Usage {
                prompt_tokens: n_prompt,
                ..Usage::default()
            },
            admitted_before: false,
            exact_cells: 0,
            state_targets: Vec::new(),
            tail_target: None,
            answer_checkpoint: None,
            spec: self
                .config
                .speculation
                .filter(|_| {
                    // Drafters read the tokens, which are cache keys at image cells.
                    r.speculation
                        && images.is_empty()
                        && (self.recurrent_group().is_none() || self.spec_states.streams > 0)
                })
                .map(|c| Depth::new(c.k.clamp(1, MAX_DRAFT))),
            draft: Vec::new(),
            prediction: r.prediction,
            images,
        };
        if r.max_tokens == 0 {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            let reason = if room == 0 {
                FinishReason::ContextFull
            } else {
                FinishReason::Length
            };
            let _ = live.tx.send(Event::Finished(Finish {
                reason,
                usage: live.usage,
            }));
        } else {
            self.waiting.push(live);
        }
    }
}
