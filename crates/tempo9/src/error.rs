//! Typed errors: what went wrong, independent of the language binding.

use tempo9_server::error::{ApiError, ErrorKind as ApiKind};

/// What went wrong (stable across the Rust, C and Python APIs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The model file is missing, unreadable or not a valid GGUF file (or an
    /// Ollama model name that is not in the store).
    BadFile,
    /// The file is valid GGUF but its architecture is not implemented.
    UnsupportedArchitecture,
    /// The prompt does not fit the context limit.
    ContextOverflow,
    /// A JSON schema (response format, tool parameters) cannot be compiled.
    InvalidSchema,
    /// A malformed request: bad messages, tools, options or token ids.
    BadRequest,
    /// The engine's waiting queue is full.
    QueueFull,
    /// The engine failed (or stopped).
    Engine,
}

impl ErrorKind {
    /// A short stable name (`"bad_file"`, `"context_overflow"`, …).
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::BadFile => "bad_file",
            ErrorKind::UnsupportedArchitecture => "unsupported_architecture",
            ErrorKind::ContextOverflow => "context_overflow",
            ErrorKind::InvalidSchema => "invalid_schema",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::QueueFull => "queue_full",
            ErrorKind::Engine => "engine",
        }
    }
}

/// An error with its kind and a human-readable message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    /// What went wrong.
    pub kind: ErrorKind,
    /// Why, in words.
    pub message: String,
}

impl Error {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
        }
    }
}

impl From<ApiError> for Error {
    fn from(e: ApiError) -> Error {
        let kind = match e.kind {
            ApiKind::ContextOverflow => ErrorKind::ContextOverflow,
            ApiKind::QueueFull | ApiKind::Overloaded => ErrorKind::QueueFull,
            ApiKind::Internal => ErrorKind::Engine,
            // The grammar compiler's refusals of a response format or of the tools'
            // parameter schemas (tool shapes are checked before).
            ApiKind::BadRequest
                if matches!(e.param.as_deref(), Some("response_format" | "tools")) =>
            {
                ErrorKind::InvalidSchema
            }
            _ => ErrorKind::BadRequest,
        };
        let message = match &e.param {
            Some(p) if !e.message.contains(p.as_str()) => format!("{p}: {}", e.message),
            _ => e.message,
        };
        Error { kind, message }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
