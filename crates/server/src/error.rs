//! API errors, rendered in each API family's own JSON shape.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// Seconds an overloaded server asks clients to wait (`Retry-After`).
pub const RETRY_AFTER_SECS: &str = "1";

/// Which API family a route belongs to (decides the error shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// OpenAI: `{"error": {"message", "type", "param", "code"}}`.
    OpenAi,
    /// Anthropic: `{"type": "error", "error": {"type", "message"}}`.
    Anthropic,
    /// Ollama: `{"error": "message"}`.
    Ollama,
}

impl Family {
    /// The family of a request path.
    pub fn from_path(path: &str) -> Family {
        if path.starts_with("/v1/messages") {
            Family::Anthropic
        } else if path.starts_with("/api/") {
            Family::Ollama
        } else {
            Family::OpenAi
        }
    }
}

/// What went wrong, independent of the wire shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Malformed or invalid request (400).
    BadRequest,
    /// Prompt (plus requested output) exceeds the context (400).
    ContextOverflow,
    /// Missing or wrong API key (401).
    Unauthorized,
    /// Refused by the access checks: foreign `Host` or `Origin` (403).
    Forbidden,
    /// Unknown model or route (404).
    NotFound,
    /// The client sent its request too slowly (408).
    Timeout,
    /// Body larger than the limit (413).
    TooLarge,
    /// A body not declared as JSON (415).
    UnsupportedMediaType,
    /// The engine's queue is full (429; Anthropic: 529 `overloaded_error`),
    /// with `Retry-After`.
    QueueFull,
    /// Too many requests in flight in the server (429; Anthropic: 529
    /// `overloaded_error`), with `Retry-After`.
    Overloaded,
    /// The engine failed and serves no more (503).
    Unavailable,
    /// The engine failed (500).
    Internal,
}

/// An error answer: kind, message, and the family that shapes it.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// What went wrong.
    pub kind: ErrorKind,
    /// Human-readable message.
    pub message: String,
    /// The wire shape.
    pub family: Family,
    /// OpenAI's `param`, when one field is at fault.
    pub param: Option<String>,
}

impl ApiError {
    /// An error of `kind` with `message`, shaped for `family`.
    pub fn new(family: Family, kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
            family,
            param: None,
        }
    }

    /// A 400 for a malformed request.
    pub fn bad(family: Family, message: impl Into<String>) -> Self {
        Self::new(family, ErrorKind::BadRequest, message)
    }

    /// A 400 naming the offending field.
    pub fn bad_param(family: Family, param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::bad(family, message);
        e.param = Some(param.to_string());
        e
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match (self.kind, self.family) {
            (ErrorKind::BadRequest | ErrorKind::ContextOverflow, _) => StatusCode::BAD_REQUEST,
            (ErrorKind::Unauthorized, _) => StatusCode::UNAUTHORIZED,
            (ErrorKind::Forbidden, _) => StatusCode::FORBIDDEN,
            (ErrorKind::NotFound, _) => StatusCode::NOT_FOUND,
            (ErrorKind::Timeout, _) => StatusCode::REQUEST_TIMEOUT,
            (ErrorKind::TooLarge, _) => StatusCode::PAYLOAD_TOO_LARGE,
            (ErrorKind::UnsupportedMediaType, _) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            // Anthropic's "overloaded" status, which its SDKs retry.
            (ErrorKind::QueueFull | ErrorKind::Overloaded, Family::Anthropic) => {
                StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
            }
            (ErrorKind::QueueFull | ErrorKind::Overloaded, _) => StatusCode::TOO_MANY_REQUESTS,
            (ErrorKind::Unavailable, _) => StatusCode::SERVICE_UNAVAILABLE,
            (ErrorKind::Internal, _) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The JSON body in the family's shape.
    pub fn body(&self) -> Value {
        match self.family {
            Family::OpenAi => {
                let (ty, code) = match self.kind {
                    ErrorKind::BadRequest => ("invalid_request_error", Value::Null),
                    ErrorKind::ContextOverflow => {
                        ("invalid_request_error", json!("context_length_exceeded"))
                    }
                    ErrorKind::Unauthorized => ("authentication_error", json!("invalid_api_key")),
                    ErrorKind::Forbidden => ("permission_error", json!("forbidden")),
                    ErrorKind::NotFound => ("invalid_request_error", json!("model_not_found")),
                    ErrorKind::Timeout => ("invalid_request_error", json!("request_timeout")),
                    ErrorKind::TooLarge => ("invalid_request_error", json!("request_too_large")),
                    ErrorKind::UnsupportedMediaType => {
                        ("invalid_request_error", json!("unsupported_media_type"))
                    }
                    ErrorKind::QueueFull => ("rate_limit_error", json!("rate_limit_exceeded")),
                    ErrorKind::Overloaded => ("rate_limit_error", json!("server_overloaded")),
                    ErrorKind::Unavailable => ("server_error", json!("engine_failed")),
                    ErrorKind::Internal => ("server_error", Value::Null),
                };
                json!({"error": {"message": self.message, "type": ty,
                                 "param": self.param, "code": code}})
            }
            Family::Anthropic => {
                let ty = match self.kind {
                    ErrorKind::BadRequest | ErrorKind::ContextOverflow => "invalid_request_error",
                    ErrorKind::Unauthorized => "authentication_error",
                    ErrorKind::Forbidden => "permission_error",
                    ErrorKind::NotFound => "not_found_error",
                    ErrorKind::Timeout => "timeout_error",
                    ErrorKind::TooLarge => "request_too_large",
                    ErrorKind::UnsupportedMediaType => "invalid_request_error",
                    ErrorKind::QueueFull | ErrorKind::Overloaded => "overloaded_error",
                    ErrorKind::Unavailable | ErrorKind::Internal => "api_error",
                };
                json!({"type": "error", "error": {"type": ty, "message": self.message}})
            }
            Family::Ollama => json!({"error": self.message}),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        tracing::info!(status = self.status().as_u16(), message = %self.message, "API error");
        let mut r = (self.status(), axum::Json(self.body())).into_response();
        if matches!(
            self.kind,
            ErrorKind::QueueFull | ErrorKind::Overloaded | ErrorKind::Unavailable
        ) {
            // Clients (the OpenAI and Anthropic SDKs among them) wait this long
            // before retrying.
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        r
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_statuses() {
        let e = ApiError::new(Family::OpenAi, ErrorKind::ContextOverflow, "too long");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(e.body()["error"]["code"], "context_length_exceeded");
        let e = ApiError::new(Family::Anthropic, ErrorKind::Unauthorized, "key");
        assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(e.body()["type"], "error");
        assert_eq!(e.body()["error"]["type"], "authentication_error");
        let e = ApiError::new(Family::Ollama, ErrorKind::QueueFull, "busy");
        assert_eq!(e.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.body(), json!({"error": "busy"}));
        let e = ApiError::new(Family::Anthropic, ErrorKind::Overloaded, "busy");
        assert_eq!(e.status().as_u16(), 529);
        assert_eq!(e.body()["error"]["type"], "overloaded_error");
        let r = e.into_response();
        assert_eq!(
            r.headers()[axum::http::header::RETRY_AFTER],
            RETRY_AFTER_SECS
        );
        let e = ApiError::new(Family::OpenAi, ErrorKind::QueueFull, "busy");
        assert_eq!(e.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            ApiError::bad_param(Family::OpenAi, "messages", "x").body()["error"]["param"],
            "messages"
        );
        assert_eq!(
            Family::from_path("/v1/messages/count_tokens"),
            Family::Anthropic
        );
        assert_eq!(Family::from_path("/api/chat"), Family::Ollama);
        assert_eq!(Family::from_path("/v1/chat/completions"), Family::OpenAi);
    }
}
