//! One file per architecture.

pub(crate) mod gemma3;
pub(crate) mod gemma4;
pub(crate) mod gpt_oss;
pub(crate) mod llama;
pub(crate) mod mistral3;
pub(crate) mod qwen2;
pub(crate) mod qwen3;
pub(crate) mod qwen35;
pub(crate) mod qwen35moe;
pub(crate) mod qwen3moe;
pub(crate) mod qwen3vl;
pub(crate) mod qwen3vlmoe;
