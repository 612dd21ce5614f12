//! Constrained decoding for Tempo9 on [llguidance]: JSON Schema, regex and Lark
//! grammars, the API shapes that carry them (OpenAI `response_format`, Ollama
//! `format`, tool-call arguments), and a per-request [`Constraint`] the engine
//! asks for a token mask at every step.
//!
//! Flow: build one [`GrammarCompiler`] per loaded model
//! ([`GrammarCompiler::for_tokenizer`] caches it); turn request fields into a
//! [`Grammar`] (constructors validate and return a [`GrammarError`] naming the
//! problem, for an HTTP 400); [`GrammarCompiler::compile`] it into a fresh
//! [`Constraint`] per request. The engine then, per generated token, calls
//! [`Constraint::compute_mask_words`] (≈ tens of µs; may run on a worker thread
//! during the forward pass), samples among allowed tokens, calls
//! [`Constraint::accept_token`], and stops with `ConstraintDone` once
//! [`Constraint::is_finished`].

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod constraint;
mod env;
mod grammar;
mod tools;

pub use constraint::{Constraint, GrammarCompiler};
pub use env::TokenizerEnvImpl;
pub use grammar::{Grammar, GrammarKind, SchemaMode, JSON_WHITESPACE};
pub use tools::{ToolCallFormat, ToolCallGrammar, ToolChoice, ToolSpec};

/// Why a grammar could not be built; the message names the problem and is meant
/// for the client (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The JSON schema is not a valid schema, or cannot be enforced.
    #[error("invalid JSON schema: {0}")]
    InvalidSchema(String),
    /// The regular expression does not parse.
    #[error("invalid regex: {0}")]
    InvalidRegex(String),
    /// The Lark grammar does not parse or is inconsistent.
    #[error("invalid Lark grammar: {0}")]
    InvalidLark(String),
    /// A request field (`response_format`, `format`) has the wrong shape.
    #[error("{0}")]
    InvalidFormat(String),
    /// The tools or tool choice cannot be turned into a grammar.
    #[error("invalid tools: {0}")]
    InvalidTools(String),
    /// The grammar failed to compile for this vocabulary.
    #[error("grammar does not compile: {0}")]
    Compile(String),
}
