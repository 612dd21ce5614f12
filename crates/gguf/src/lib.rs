//! GGUF parsing.
