//! Tokenizers and chat templates built from GGUF metadata, matching
//! llama.cpp's behaviour exactly.
//!
//! - [`Tokenizer`]: SPM (`llama`) and byte-level BPE (`gpt2`) vocabularies,
//!   with llama.cpp's pre-tokenizers, special-token handling, BOS/EOS rules,
//!   end-of-generation set and detokenization.
//! - [`StreamDecoder`]: incremental detokenization that never emits broken
//!   UTF-8.
//! - [`ChatTemplate`]: the model's Jinja chat template rendered with the same
//!   inputs and helpers llama.cpp's `/apply-template` uses.
//!
//! Known deviations from llama.cpp (none affect the recorded fixtures):
//! - Pre-tokenizer regexes other than the GPT-2 / Llama-3 / Qwen2 / Qwen3.5 /
//!   digit / newline ones run on Oniguruma (Unicode properties) instead of
//!   llama.cpp's `std::regex` over category-collapsed text; `kimi-k2`,
//!   `afmoe`, `mmbert` and `whitespace` pre-tokenizers and the WPM, UGM, RWKV
//!   and PLaMo-2 vocabularies are not supported.
//! - When several tokens look like an end-of-turn token and the file names
//!   none, [`Tokenizer::eot`] picks the lowest id (llama.cpp takes whichever
//!   its hash map yields first); the end-of-generation set is the same.
//! - Special tokens of equal length are tried in id order (llama.cpp's sort
//!   is unstable); this only matters for overlapping equal-length tokens.
//! - Chat-template capabilities are found by rendering probes instead of
//!   llama.cpp's usage statistics; of llama.cpp's model-specific chat
//!   handlers only Ministral 3's, GPT-OSS's and Gemma 4's message reshaping
//!   and continuation are reproduced; reasoning-effort inputs are not;
//!   non-text content parts are dropped rather than rejected; `tojson`
//!   supports `sort_keys`; `strftime_now` uses UTC.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod bpe;
mod chat;
mod deadline;
mod handler;
mod literal;
mod pretok;
mod pretype;
mod spm;
mod stream;
mod tokenizer;
mod unicode;
mod unicode_table;

pub use chat::{
    ChatTemplate, TemplateOptions, TEMPLATE_FUEL, TEMPLATE_MAX_OUTPUT, TEMPLATE_RECURSION,
};
pub use deadline::TEMPLATE_DEADLINE;
pub use literal::{Literals, ESCAPE};
pub use stream::StreamDecoder;
pub use tokenizer::{SpecialTokenIds, Tokenizer, TokenizerConfig, TokenizerKind};

/// Everything that can go wrong building a tokenizer or rendering a chat.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` names an algorithm this crate does not implement.
    #[error("unsupported tokenizer model '{0}' (supported: llama, gpt2, gemma4)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not know.
    #[error("unsupported pre-tokenizer '{0}'")]
    UnsupportedPreTokenizer(String),
    /// A required metadata key is absent.
    #[error("missing GGUF key '{0}'")]
    MissingKey(String),
    /// A metadata key has the wrong type.
    #[error(transparent)]
    Gguf(#[from] tempo9_gguf::GgufError),
    /// The metadata is inconsistent (e.g. fewer scores than tokens).
    #[error("invalid tokenizer metadata: {0}")]
    Invalid(String),
    /// A pre-tokenizer regex does not compile.
    #[error("invalid pre-tokenizer regex {regex:?}: {message}")]
    Regex {
        /// The regex.
        regex: String,
        /// The regex engine's message.
        message: String,
    },
    /// The chat template does not parse.
    #[error("chat template syntax error at line {line}: {message}")]
    TemplateSyntax {
        /// 1-based line in the template source.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// Rendering the chat template failed (including `raise_exception`).
    #[error("chat template render error{}: {message}", .line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    TemplateRender {
        /// 1-based line in the template source, when known.
        line: Option<usize>,
        /// What went wrong.
        message: String,
    },
    /// A chat message or tool is not shaped like the OpenAI API's.
    #[error("invalid chat input: {0}")]
    InvalidMessage(String),
}
