//! Tempo9's HTTP server: OpenAI, Anthropic and Ollama APIs over the engine.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod tools;
