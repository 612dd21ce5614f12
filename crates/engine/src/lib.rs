//! Engine.
pub mod sampler;
