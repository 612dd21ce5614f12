//! `tempo9._tempo9`: the native half of the Python package. It passes JSON
//! text both ways (the package's Python half, `python/tempo9/__init__.py`,
//! turns it into objects) and releases the GIL while it waits for the engine.

use std::sync::Mutex;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyStopIteration};
use pyo3::prelude::*;

use tempo9::chat::event_json;
use tempo9::{
    ChatStream, CompleteOptions, CompletionEvent, CompletionStream, Error, ErrorKind, LoadOptions,
    Model as SdkModel,
};

create_exception!(
    _tempo9,
    Tempo9Error,
    PyException,
    "Base class of Tempo9's errors."
);
create_exception!(
    _tempo9,
    BadFileError,
    Tempo9Error,
    "The model file is missing or invalid."
);
create_exception!(
    _tempo9,
    UnsupportedArchitectureError,
    Tempo9Error,
    "The model's architecture is not implemented."
);
create_exception!(
    _tempo9,
    ContextOverflowError,
    Tempo9Error,
    "The prompt does not fit the context."
);
create_exception!(
    _tempo9,
    InvalidSchemaError,
    Tempo9Error,
    "A JSON schema cannot be compiled."
);
create_exception!(
    _tempo9,
    BadRequestError,
    Tempo9Error,
    "Malformed messages, tools or options."
);
create_exception!(
    _tempo9,
    QueueFullError,
    Tempo9Error,
    "The engine's queue is full."
);
create_exception!(
    _tempo9,
    EngineError,
    Tempo9Error,
    "The engine failed or stopped."
);

fn py_err(e: Error) -> PyErr {
    let m = e.message;
    match e.kind {
        ErrorKind::BadFile => BadFileError::new_err(m),
        ErrorKind::UnsupportedArchitecture => UnsupportedArchitectureError::new_err(m),
        ErrorKind::ContextOverflow => ContextOverflowError::new_err(m),
        ErrorKind::InvalidSchema => InvalidSchemaError::new_err(m),
        ErrorKind::BadRequest => BadRequestError::new_err(m),
        ErrorKind::QueueFull => QueueFullError::new_err(m),
        _ => EngineError::new_err(m),
    }
}

fn bad_json(what: &str, e: impl std::fmt::Display) -> PyErr {
    BadRequestError::new_err(format!("{what}: invalid JSON: {e}"))
}

/// A loaded model and its engine.
#[pyclass(module = "tempo9._tempo9", frozen)]
struct Model {
    inner: SdkModel,
}

#[pymethods]
impl Model {
    /// Loads `source` (GGUF path or Ollama name) with load options as JSON text.
    #[new]
    #[pyo3(signature = (source, options_json = None))]
    fn new(py: Python<'_>, source: String, options_json: Option<String>) -> PyResult<Model> {
        let opts = match options_json.as_deref() {
            None | Some("") => LoadOptions::default(),
            Some(s) => LoadOptions::from_json(
                &serde_json::from_str(s).map_err(|e| bad_json("options", e))?,
            )
            .map_err(py_err)?,
        };
        let inner = py
            .allow_threads(|| SdkModel::load(&source, &opts))
            .map_err(py_err)?;
        Ok(Model { inner })
    }

    /// Starts a chat request (messages, tools and options as JSON text).
    fn chat(
        &self,
        py: Python<'_>,
        messages_json: String,
        tools_json: String,
        options_json: String,
    ) -> PyResult<Stream> {
        let s = py
            .allow_threads(|| {
                self.inner
                    .chat_json(&messages_json, &tools_json, &options_json)
            })
            .map_err(py_err)?;
        Ok(Stream::new(Inner::Chat(s)))
    }

    /// Starts a plain completion of token ids (options as JSON text).
    fn complete(&self, tokens: Vec<u32>, options_json: String) -> PyResult<Stream> {
        let opts = CompleteOptions::from_json(&parse("options", &options_json)?).map_err(py_err)?;
        let s = self.inner.complete(&tokens, &opts).map_err(py_err)?;
        Ok(Stream::new(Inner::Complete(s)))
    }

    /// Token ids of `text`.
    fn tokenize(&self, text: &str) -> Vec<u32> {
        self.inner.tokenize(text)
    }

    /// Text of token ids.
    fn detokenize(&self, tokens: Vec<u32>) -> String {
        self.inner.detokenize(&tokens)
    }

    /// Engine counters as JSON text.
    fn stats_json(&self) -> String {
        tempo9::stats_json(&self.inner.stats()).to_string()
    }

    /// Per-request context limit in tokens.
    fn max_context(&self) -> usize {
        self.inner.max_context()
    }

    /// Stops the engine.
    fn shutdown(&self, py: Python<'_>) {
        py.allow_threads(|| self.inner.shutdown());
    }
}

enum Inner {
    Chat(ChatStream),
    Complete(CompletionStream),
}

/// One request's events as JSON text. Closing it (or dropping it) cancels the
/// request.
#[pyclass(module = "tempo9._tempo9", frozen)]
struct Stream {
    inner: Mutex<Option<Inner>>,
}

impl Stream {
    fn new(i: Inner) -> Stream {
        Stream {
            inner: Mutex::new(Some(i)),
        }
    }
}

#[pymethods]
impl Stream {
    /// The next event's JSON, waiting for it with the GIL released; raises
    /// StopIteration after the last one (or once closed).
    fn next_json(&self, py: Python<'_>) -> PyResult<String> {
        let next = py.allow_threads(|| {
            let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            let next = match guard.as_mut() {
                None => None,
                Some(Inner::Chat(c)) => loop {
                    match c.next() {
                        None => break None,
                        Some(e) => {
                            if let Some(v) = event_json(&e) {
                                break Some(v.to_string());
                            }
                        }
                    }
                },
                Some(Inner::Complete(c)) => c.next().map(|e| completion_json(&e)),
            };
            if next.is_none() {
                *guard = None;
            }
            next
        });
        next.ok_or_else(|| PyStopIteration::new_err(()))
    }

    /// Cancels the request (if still running) and ends the stream.
    fn close(&self, py: Python<'_>) {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
        py.allow_threads(move || drop(inner));
    }
}

fn completion_json(e: &CompletionEvent) -> String {
    tempo9::complete::event_json(e).to_string()
}

fn parse(what: &str, s: &str) -> PyResult<serde_json::Value> {
    if s.trim().is_empty() {
        return Ok(serde_json::Value::Null);
    }
    serde_json::from_str(s).map_err(|e| bad_json(what, e))
}

#[pymodule]
fn _tempo9(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_class::<Stream>()?;
    let py = m.py();
    m.add("Tempo9Error", py.get_type::<Tempo9Error>())?;
    m.add("BadFileError", py.get_type::<BadFileError>())?;
    m.add(
        "UnsupportedArchitectureError",
        py.get_type::<UnsupportedArchitectureError>(),
    )?;
    m.add(
        "ContextOverflowError",
        py.get_type::<ContextOverflowError>(),
    )?;
    m.add("InvalidSchemaError", py.get_type::<InvalidSchemaError>())?;
    m.add("BadRequestError", py.get_type::<BadRequestError>())?;
    m.add("QueueFullError", py.get_type::<QueueFullError>())?;
    m.add("EngineError", py.get_type::<EngineError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
