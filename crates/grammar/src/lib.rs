//! Constrained decoding for Tempo9 on [llguidance]: JSON Schema, regex and Lark
//! grammars, the API shapes that carry them (OpenAI `response_format`, Ollama
//! `format`, tool calls), and a per-request [`Constraint`] that implements the
//! engine's `TokenConstraint`.
//!
//! Flow:
//! 1. Per loaded model: [`GrammarCompiler::for_tokenizer`] (builds llguidance's
//!    token trie once: ~0.1 s for a 49K vocabulary, ~0.35 s for 152K, ~0.9 s for
//!    262K; cached while the tokenizer is in use).
//! 2. Per request, from its fields: [`Grammar::from_openai_response_format`],
//!    [`Grammar::from_ollama_format`], [`Grammar::json_schema`],
//!    [`Grammar::regex`], [`Grammar::lark`], or [`ToolCallGrammar::build`] for
//!    `tool_choice` required / named / auto (Anthropic `any` / `tool` / `auto`).
//!    Errors are [`GrammarError`]s whose message names the problem (HTTP 400).
//! 3. [`GrammarCompiler::compile`] → a fresh [`Constraint`] (~0.3 ms; errors are
//!    400s too), put in `Request::constraint`. If the server already appended
//!    the start of a tool call to the prompt, call [`Constraint::advance_text`]
//!    with that text first.
//! 4. The engine, per token: `compute_mask` (tens of µs, on its worker thread
//!    during the forward pass), samples among allowed tokens, `accept`s, and
//!    ends the request with `ConstraintDone` once `is_finished`; a mask error
//!    is a dead end (`ConstraintDeadEnd`). End-of-generation tokens are allowed
//!    exactly where the grammar may end.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod bounds;
mod call_syntax;
mod constraint;
mod env;
mod grammar;
mod tools;

pub use bounds::{
    OutputBounds, BOUNDS_KEYWORD, DEFAULT_FINISH_RESERVE, DEFAULT_MAX_DIGIT_RUN,
    DEFAULT_MAX_STRING_LENGTH,
};
pub use constraint::{Constraint, GrammarCompiler};
pub use env::TokenizerEnvImpl;
pub use grammar::{
    Grammar, GrammarKind, SchemaMode, JSON_ITEM_SEPARATOR, JSON_KEY_SEPARATOR, TOOL_JSON_WHITESPACE,
};
pub use tools::{
    CallSyntax, ReasoningMarkup, ToolCallFormat, ToolCallGrammar, ToolChoice, ToolSpec,
};

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
