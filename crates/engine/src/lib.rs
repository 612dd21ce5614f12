//! Tempo9's inference engine: paged KV cache with a global prefix cache,
//! continuous batching with chunked prefill, sampling, and the request API.
//!
//! Embed it in-process with [`Engine::start`] (a thread owning the model and the
//! cache) and [`EngineHandle::submit`]; [`EngineCore`] is the same engine stepped
//! by the caller.

pub mod cache;
mod core;
mod handle;
pub mod image;
mod lru;
pub mod pages;
mod partial_page;
pub mod recurrent;
pub mod request;
pub mod sampler;
pub mod scheduler;
pub mod sliding;
pub mod spec;
pub mod ssd;
mod stop;
mod stream;
pub mod vision;

pub use crate::core::{
    default_threads, DraftModel, EngineConfig, EngineCore, EngineError, EngineStats, RequestPhase,
    RequestProgress, SubmitError,
};
pub use handle::{Engine, EngineHandle};
pub use image::PromptImage;
pub use request::{
    Event, Finish, FinishReason, Request, RequestId, StopConditions, TokenConstraint, TokenEvent,
    TokenMask, Usage,
};
pub use sampler::SamplingParams;
pub use scheduler::Policy;
pub use scheduler::{CHUNK_ALIGN, KV_WINDOW_PAD};
pub use spec::{SpecConfig, SpecMode};
pub use ssd::{SsdConfig, SsdEntryStats, SsdStats};
pub use stream::RequestStream;
pub use vision::VisionModel;
