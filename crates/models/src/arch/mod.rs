//! One file per architecture.

pub(crate) mod gemma3;
pub(crate) mod llama;
pub(crate) mod qwen2;
