//! The engine's request API (the in-process SDK surface): what a caller submits
//! and the events it gets back.
//!
//! A [`Request`] carries token ids (the caller applies the chat template), sampling
//! parameters and stop conditions. [`crate::EngineHandle::submit`] returns a
//! [`crate::RequestStream`] of [`Event`]s: one [`Event::Token`] per generated token
//! (with its text delta) and a final [`Event::Finished`] with the reason and usage.

use crate::image::PromptImage;
use crate::sampler::SamplingParams;

/// Identifies a request inside the engine.
pub type RequestId = u64;

/// One generation request.
pub struct Request {
    /// Prompt token ids (BOS included if the model wants one). Must not be empty.
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// When to stop besides `max_tokens`.
    pub stop: StopConditions,
    /// Return the chosen token's log-probability with every token.
    pub logprobs: bool,
    /// Also return the `top_logprobs` most likely tokens at every step (0 = none).
    pub top_logprobs: usize,
    /// Tokens never to sample (e.g. end-of-generation tokens, to ignore EOS).
    pub banned_tokens: Vec<u32>,
    /// Scheduling priority under [`crate::Policy::Priority`]: lower runs first.
    pub priority: i32,
    /// Restricts which tokens may be sampled (a grammar); `None` = free text.
    pub constraint: Option<Box<dyn TokenConstraint>>,
    /// Batch-invariant numbers for this request: its tokens and log-probabilities
    /// do not depend on which other requests share its steps (at some speed cost
    /// for the steps it is in; see `EngineConfig::deterministic`).
    pub deterministic: bool,
    /// Allow speculative decoding for this request when the engine has it on
    /// ([`crate::EngineConfig::speculation`]); `false` opts out.
    pub speculation: bool,
    /// Predicted output (OpenAI's "predicted outputs"): tokens the answer is
    /// expected to largely repeat, such as a file being edited. With speculative
    /// decoding on, drafts come from it first (see [`crate::spec::propose_predicted`]);
    /// the answer itself is what decoding without it gives.
    pub prediction: Vec<u32>,
    /// Images in the prompt, in prompt order, each over its run of placeholder
    /// tokens (needs an engine with a vision encoder, [`crate::EngineConfig::vision`]).
    /// A request with images does not speculate.
    pub images: Vec<PromptImage>,
}

impl Request {
    /// A greedy request for `max_tokens` tokens after `prompt`, stopping at
    /// end-of-generation tokens.
    pub fn new(prompt: Vec<u32>, max_tokens: usize) -> Request {
        Request {
            prompt,
            max_tokens,
            sampling: SamplingParams::default(),
            stop: StopConditions::default(),
            logprobs: false,
            top_logprobs: 0,
            banned_tokens: Vec::new(),
            priority: 0,
            constraint: None,
            deterministic: false,
            speculation: true,
            prediction: Vec::new(),
            images: Vec::new(),
        }
    }
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("prompt_tokens", &self.prompt.len())
            .field("max_tokens", &self.max_tokens)
            .field("sampling", &self.sampling)
            .field("stop", &self.stop)
            .field("priority", &self.priority)
            .field("deterministic", &self.deterministic)
            .field("constrained", &self.constraint.is_some())
            .field("images", &self.images.len())
            .finish()
    }
}

/// Stop conditions of a request.
#[derive(Debug, Clone)]
pub struct StopConditions {
    /// Stop at the model's end-of-generation tokens (the token is reported, its
    /// text is not).
    pub eog: bool,
    /// Stop when the generated text contains one of these strings; the text from
    /// the match on is not emitted.
    pub strings: Vec<String>,
    /// Stop at any of these token ids (reported like end-of-generation tokens).
    pub token_ids: Vec<u32>,
}

impl Default for StopConditions {
    fn default() -> Self {
        StopConditions {
            eog: true,
            strings: Vec::new(),
            token_ids: Vec::new(),
        }
    }
}

/// Something the engine tells a request's stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A generated token.
    Token(TokenEvent),
    /// The request ended; always the last event.
    Finished(Finish),
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    /// Token id.
    pub id: u32,
    /// Text that became final with this token. May be empty (an incomplete UTF-8
    /// sequence, text held back because it may start a stop string, or a stop
    /// token); the concatenation over a request is its whole output text.
    pub text: String,
    /// Log-probability of the token under the model (before sampling filters),
    /// when `logprobs` was asked for.
    pub logprob: Option<f32>,
    /// The most likely tokens and their log-probabilities, when asked for.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    /// Why.
    pub reason: FinishReason,
    /// Token counts.
    pub usage: Usage,
}

/// Why a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// Generated `max_tokens` tokens.
    Length,
    /// Reached the per-request context limit (prompt + output).
    ContextFull,
    /// Emitted an end-of-generation or stop token.
    StopToken(u32),
    /// The output text contained this stop string.
    StopString(String),
    /// The constraint accepted a complete output and allows nothing more.
    ConstraintDone,
    /// The constraint allows no token (a dead end).
    ConstraintDeadEnd(String),
    /// Cancelled by the caller (or its stream was dropped).
    Cancelled,
    /// The engine failed while running the request.
    Error(String),
}

impl FinishReason {
    /// Whether the model finished on its own (stop token, stop string or completed
    /// constraint), as opposed to a limit, a cancellation or an error.
    pub fn is_natural_stop(&self) -> bool {
        matches!(
            self,
            FinishReason::StopToken(_) | FinishReason::StopString(_) | FinishReason::ConstraintDone
        )
    }
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Of those, tokens whose KV came from the prefix cache (not computed).
    pub cached_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Times the request was preempted (its KV dropped and recomputed later).
    pub preemptions: u32,
    /// Draft tokens verified (speculative decoding; see [`crate::spec`]).
    pub draft_tokens: usize,
    /// Of those, tokens accepted (each saved a step of its own).
    pub accepted_draft_tokens: usize,
}

/// A set of allowed token ids, one bit per token of the vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    bits: Vec<u32>,
}

impl TokenMask {
    /// A mask over `n_vocab` tokens with nothing allowed.
    pub fn none(n_vocab: usize) -> TokenMask {
        TokenMask {
            bits: vec![0; n_vocab.div_ceil(32)],
        }
    }

    /// A mask from 32-bit words (bit `t % 32` of word `t / 32` allows token `t`).
    pub fn from_words(bits: Vec<u32>) -> TokenMask {
        TokenMask { bits }
    }

    /// Allows token `t`.
    pub fn allow(&mut self, t: u32) {
        if let Some(w) = self.bits.get_mut(t as usize / 32) {
            *w |= 1 << (t % 32);
        }
    }

    /// Whether token `t` is allowed.
    pub fn is_allowed(&self, t: u32) -> bool {
        self.bits
            .get(t as usize / 32)
            .is_some_and(|w| w & (1 << (t % 32)) != 0)
    }

    /// Whether no token is allowed.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|&w| w == 0)
    }
}

/// A per-request restriction on the next token, e.g. a JSON-schema grammar.
///
/// The engine calls [`compute_mask`](Self::compute_mask) for the next token on a
/// worker thread while the model step that produces the logits runs, then samples
/// among the allowed tokens and reports the choice with [`accept`](Self::accept).
pub trait TokenConstraint: Send {
    /// Tokens allowed next. An error ends the request with
    /// [`FinishReason::ConstraintDeadEnd`].
    fn compute_mask(&mut self) -> Result<TokenMask, String>;
    /// Like [`compute_mask`](Self::compute_mask), knowing that at most `tokens_left`
    /// tokens (this one included) may still be generated: a constraint may then
    /// steer towards an output it can complete in time (e.g. close a JSON answer
    /// rather than be cut by `max_tokens`). The default ignores the budget.
    fn compute_mask_within(&mut self, tokens_left: usize) -> Result<TokenMask, String> {
        let _ = tokens_left;
        self.compute_mask()
    }
    /// Advances past the sampled token (always one the last mask allowed).
    fn accept(&mut self, token: u32) -> Result<(), String>;
    /// Whether the constrained output is complete and nothing more may follow.
    fn is_finished(&self) -> bool;
    /// Tokens the constraint forces next whatever the model says (e.g. the rest of
    /// a JSON key), without advancing. Speculative decoding drafts them first: they
    /// are verified like any draft, so a model that spells the same text with other
    /// tokens loses nothing but the draft. The default knows none.
    fn forced_tokens(&mut self) -> Vec<u32> {
        Vec::new()
    }
    /// How many of `tokens`, in order from here, the constraint would accept,
    /// without advancing. Speculative decoding cuts drafts there: a draft the
    /// constraint forbids can never be taken. The default accepts all.
    fn accepted_prefix(&mut self, tokens: &[u32]) -> usize {
        tokens.len()
    }
}
