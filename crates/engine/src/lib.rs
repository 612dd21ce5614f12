//! Tempo9's inference engine: KV cell management, sampling and the generation loop
//! over a [`tempo9_models::Model`].

pub mod generate;
pub mod kv;
pub mod pages;
pub mod sampler;

pub use generate::{
    default_threads, Engine, EngineConfig, EngineError, FinishReason, GenOutput, GenRequest,
};
