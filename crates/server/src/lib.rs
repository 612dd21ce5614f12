//! Tempo9's HTTP server: the OpenAI, Anthropic and Ollama APIs over the engine.
//!
//! The adapters and routes land with the engine's request API; these modules
//! do not depend on it.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod error;
pub mod metrics;
pub mod ollama_store;
pub mod tools;
