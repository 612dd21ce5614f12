//! Tempo9's C ABI: the in-process SDK ([`tempo9`]) for C, C++, Swift and
//! Objective-C. The header `include/tempo9.h` is generated from this file by
//! cbindgen; `include/module.modulemap` makes it a Clang module (`import Tempo9`).
//!
//! Shapes:
//! - Opaque handles: a `Tempo9Model` (a loaded model and its engine) and a
//!   `Tempo9Stream` (one request's events).
//! - Rich values are UTF-8 JSON text: messages and tools in OpenAI chat
//!   completion shape, options as the fields of such a request, events as
//!   `{"type": "text" | "reasoning" | "tool_call" | "token" | "done", ...}`.
//! - Every function returns a [`Tempo9Status`]; on failure
//!   [`tempo9_last_error`] says why. No panic crosses this boundary: every
//!   entry point catches unwinding and reports `TEMPO9_ERROR_PANIC`.
//!
//! Thread safety: a `Tempo9Model` may be used from any number of threads at
//! once (their requests are batched together and share one prefix cache). A
//! `Tempo9Stream` may move between threads but must be used by one at a time.
//! Strings this library returns are freed with [`tempo9_string_free`].

#![allow(clippy::missing_safety_doc)] // The safety contract is in each function's C documentation.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use serde_json::Value;
use tempo9::{
    chat::event_json, ChatStream, CompleteOptions, CompletionStream, Error, ErrorKind, LoadOptions,
    Model,
};

/// What a call returned.
#[allow(non_camel_case_types)] // C's spelling: these are the header's constants.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tempo9Status {
    /// Success.
    TEMPO9_OK = 0,
    /// The stream has no more events (`tempo9_stream_next`).
    TEMPO9_DONE = 1,
    /// The model file is missing, unreadable or not GGUF (or an unknown Ollama name).
    TEMPO9_ERROR_BAD_FILE = -1,
    /// The model's architecture is not implemented.
    TEMPO9_ERROR_UNSUPPORTED_ARCHITECTURE = -2,
    /// The prompt does not fit the context limit.
    TEMPO9_ERROR_CONTEXT_OVERFLOW = -3,
    /// A JSON schema (response format, tool parameters) cannot be compiled.
    TEMPO9_ERROR_INVALID_SCHEMA = -4,
    /// Malformed messages, tools, options or token ids.
    TEMPO9_ERROR_BAD_REQUEST = -5,
    /// The engine's waiting queue is full.
    TEMPO9_ERROR_QUEUE_FULL = -6,
    /// The engine failed or stopped.
    TEMPO9_ERROR_ENGINE = -7,
    /// A required pointer was NULL, or a string was not UTF-8.
    TEMPO9_ERROR_INVALID_ARGUMENT = -8,
    /// A bug: Tempo9 panicked (the panic was stopped at this boundary).
    TEMPO9_ERROR_PANIC = -9,
}

use Tempo9Status as S;

/// A loaded model and its running engine (opaque).
pub struct Tempo9Model {
    model: Model,
}

/// One request's events (opaque). Freeing it cancels the request.
pub struct Tempo9Stream {
    inner: Inner,
}

enum Inner {
    Chat(ChatStream),
    Complete(CompletionStream),
}

/// Called once per event with the event's JSON (valid during the call only)
/// and the caller's `user_data`; return 0 to continue, non-zero to cancel the
/// request.
pub type Tempo9EventCallback =
    Option<unsafe extern "C" fn(event_json: *const c_char, user_data: *mut c_void) -> i32>;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn status_of(kind: ErrorKind) -> Tempo9Status {
    match kind {
        ErrorKind::BadFile => S::TEMPO9_ERROR_BAD_FILE,
        ErrorKind::UnsupportedArchitecture => S::TEMPO9_ERROR_UNSUPPORTED_ARCHITECTURE,
        ErrorKind::ContextOverflow => S::TEMPO9_ERROR_CONTEXT_OVERFLOW,
        ErrorKind::InvalidSchema => S::TEMPO9_ERROR_INVALID_SCHEMA,
        ErrorKind::BadRequest => S::TEMPO9_ERROR_BAD_REQUEST,
        ErrorKind::QueueFull => S::TEMPO9_ERROR_QUEUE_FULL,
        _ => S::TEMPO9_ERROR_ENGINE,
    }
}

/// A failure at the boundary: its status and message.
struct Fail(Tempo9Status, String);

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail(status_of(e.kind), e.message)
    }
}

fn invalid(msg: &str) -> Fail {
    Fail(S::TEMPO9_ERROR_INVALID_ARGUMENT, msg.to_string())
}

/// Runs `f`, catching panics; records the error message of a failure.
fn boundary(f: impl FnOnce() -> Result<Tempo9Status, Fail>) -> Tempo9Status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(s)) => s,
        Ok(Err(Fail(s, msg))) => {
            set_error(&msg);
            s
        }
        Err(p) => {
            let why = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            set_error(&format!("internal error (panic): {why}"));
            S::TEMPO9_ERROR_PANIC
        }
    }
}

/// A borrowed UTF-8 string argument; NULL reads as `""` when `optional`.
unsafe fn text<'a>(p: *const c_char, what: &str, optional: bool) -> Result<&'a str, Fail> {
    if p.is_null() {
        return if optional {
            Ok("")
        } else {
            Err(invalid(&format!("{what} is NULL")))
        };
    }
    // SAFETY: the caller passes a NUL-terminated string that lives through the call.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| invalid(&format!("{what} is not UTF-8")))
}

fn json_arg(s: &str, what: &str) -> Result<Value, Fail> {
    if s.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(s).map_err(|e| {
        Fail(
            S::TEMPO9_ERROR_BAD_REQUEST,
            format!("{what}: invalid JSON: {e}"),
        )
    })
}

fn c_string(v: &Value) -> *mut c_char {
    CString::new(v.to_string()).map_or(std::ptr::null_mut(), CString::into_raw)
}

/// Writes `v` through `out` (checked non-NULL by the caller).
unsafe fn put<T>(out: *mut *mut T, v: *mut T) {
    // SAFETY: `out` is a valid, writable pointer (checked non-NULL).
    unsafe { *out = v };
}

/// Loads a model — `source` is a GGUF file path or an Ollama model name — and
/// starts its engine. `options_json` may be NULL or a JSON object:
/// `threads`, `context`, `kv_budget_bytes`, `page_tokens`, `max_running`,
/// `deterministic`, `chat_template`, `speculation_k`, `device` (`"cpu"`,
/// `"cuda"`, or `"auto"`: a GPU when `libggml-cuda.so` loads from `backend_dir`,
/// `TEMPO9_BACKEND_DIR` or the executable's directory, else the CPU; the
/// default), `backend_dir`, `gpu_layers`, `ssd` (`false`, or
/// `{"dir", "budget_bytes", "persist"}`; on by default, as `tempo9 serve`).
/// On success `*out_model` is a handle to free with `tempo9_model_free`.
#[no_mangle]
pub unsafe extern "C" fn tempo9_model_load(
    source: *const c_char,
    options_json: *const c_char,
    out_model: *mut *mut Tempo9Model,
) -> Tempo9Status {
    boundary(|| {
        if out_model.is_null() {
            return Err(invalid("out_model is NULL"));
        }
        // SAFETY: strings per this function's contract.
        let source = unsafe { text(source, "source", false)? };
        let opts = unsafe { text(options_json, "options_json", true)? };
        let opts = LoadOptions::from_json(&json_arg(opts, "options_json")?)?;
        let model = Model::load(source, &opts)?;
        // SAFETY: checked non-NULL above.
        unsafe { put(out_model, Box::into_raw(Box::new(Tempo9Model { model }))) };
        Ok(S::TEMPO9_OK)
    })
}

/// Frees a model handle (NULL is ignored). The engine stops once every stream
/// of the model is freed too.
#[no_mangle]
pub unsafe extern "C" fn tempo9_model_free(model: *mut Tempo9Model) {
    boundary(|| {
        if !model.is_null() {
            // SAFETY: `model` came from `tempo9_model_load` and is freed once.
            drop(unsafe { Box::from_raw(model) });
        }
        Ok(S::TEMPO9_OK)
    });
}

unsafe fn model_ref<'a>(model: *const Tempo9Model) -> Result<&'a Model, Fail> {
    // SAFETY: a live handle from `tempo9_model_load`, or NULL.
    unsafe { model.as_ref() }
        .map(|m| &m.model)
        .ok_or_else(|| invalid("model is NULL"))
}

unsafe fn start_chat(
    model: *const Tempo9Model,
    messages_json: *const c_char,
    tools_json: *const c_char,
    options_json: *const c_char,
) -> Result<ChatStream, Fail> {
    // SAFETY: arguments per the calling function's contract.
    let model = unsafe { model_ref(model)? };
    let messages = unsafe { text(messages_json, "messages_json", false)? };
    let tools = unsafe { text(tools_json, "tools_json", true)? };
    let options = unsafe { text(options_json, "options_json", true)? };
    Ok(model.chat_json(messages, tools, options)?)
}

/// Starts a chat request. `messages_json`: a JSON array of OpenAI chat messages;
/// `tools_json`: NULL or a JSON array of tools (`{"type": "function",
/// "function": {"name", "description", "parameters"}}`); `options_json`: NULL
/// or the fields of an OpenAI chat completion request (`temperature`,
/// `max_tokens`, `stop`, `tool_choice`, `response_format`, …; unset fields take
/// the server's defaults). The prompt is rendered before this returns; read
/// the events with `tempo9_stream_next`, free the stream with
/// `tempo9_stream_free` (which cancels the request if it is still running).
#[no_mangle]
pub unsafe extern "C" fn tempo9_chat(
    model: *const Tempo9Model,
    messages_json: *const c_char,
    tools_json: *const c_char,
    options_json: *const c_char,
    out_stream: *mut *mut Tempo9Stream,
) -> Tempo9Status {
    boundary(|| {
        if out_stream.is_null() {
            return Err(invalid("out_stream is NULL"));
        }
        // SAFETY: arguments per this function's contract.
        let s = unsafe { start_chat(model, messages_json, tools_json, options_json)? };
        let stream = Box::new(Tempo9Stream {
            inner: Inner::Chat(s),
        });
        // SAFETY: checked non-NULL above.
        unsafe { put(out_stream, Box::into_raw(stream)) };
        Ok(S::TEMPO9_OK)
    })
}

/// [`tempo9_chat`] with a callback: blocks until the answer is done, calling
/// `callback` with each event's JSON on this thread. A non-zero return from the
/// callback cancels the request (the call then returns `TEMPO9_OK`).
#[no_mangle]
pub unsafe extern "C" fn tempo9_chat_callback(
    model: *const Tempo9Model,
    messages_json: *const c_char,
    tools_json: *const c_char,
    options_json: *const c_char,
    callback: Tempo9EventCallback,
    user_data: *mut c_void,
) -> Tempo9Status {
    boundary(|| {
        let Some(cb) = callback else {
            return Err(invalid("callback is NULL"));
        };
        // SAFETY: arguments per this function's contract.
        let stream = unsafe { start_chat(model, messages_json, tools_json, options_json)? };
        for e in stream {
            let Some(v) = event_json(&e) else { continue };
            let c = CString::new(v.to_string()).unwrap_or_default();
            // SAFETY: a C function pointer given by the caller, called with a
            // NUL-terminated string that lives through the call.
            if unsafe { cb(c.as_ptr(), user_data) } != 0 {
                // Dropping the stream (leaving the loop) cancels the request.
                break;
            }
        }
        Ok(S::TEMPO9_OK)
    })
}

/// Starts a plain completion of `n_tokens` token ids (no chat template).
/// `options_json`: NULL or `{"max_tokens" (default 16), "temperature",
/// "top_k", "top_p", "min_p", "seed", "stop", "stop_at_eog" (default true)}`.
/// Events: `{"type": "token", "id", "text"}`, then `{"type": "done", "stop",
/// "usage"}`.
#[no_mangle]
pub unsafe extern "C" fn tempo9_complete(
    model: *const Tempo9Model,
    tokens: *const u32,
    n_tokens: usize,
    options_json: *const c_char,
    out_stream: *mut *mut Tempo9Stream,
) -> Tempo9Status {
    boundary(|| {
        if out_stream.is_null() || (tokens.is_null() && n_tokens > 0) {
            return Err(invalid("out_stream or tokens is NULL"));
        }
        // SAFETY: arguments per this function's contract.
        let model = unsafe { model_ref(model)? };
        let ids: &[u32] = if n_tokens == 0 {
            &[]
        } else {
            // SAFETY: `tokens` points to `n_tokens` readable ids.
            unsafe { std::slice::from_raw_parts(tokens, n_tokens) }
        };
        let opts = unsafe { text(options_json, "options_json", true)? };
        let opts = CompleteOptions::from_json(&json_arg(opts, "options_json")?)?;
        let s = model.complete(ids, &opts)?;
        let stream = Box::new(Tempo9Stream {
            inner: Inner::Complete(s),
        });
        // SAFETY: checked non-NULL above.
        unsafe { put(out_stream, Box::into_raw(stream)) };
        Ok(S::TEMPO9_OK)
    })
}

/// The next event of `stream`, blocking until there is one: `TEMPO9_OK` with
/// `*out_event_json` set to the event's JSON (free it with
/// `tempo9_string_free`), or `TEMPO9_DONE` (and NULL) after the last event.
#[no_mangle]
pub unsafe extern "C" fn tempo9_stream_next(
    stream: *mut Tempo9Stream,
    out_event_json: *mut *mut c_char,
) -> Tempo9Status {
    boundary(|| {
        if out_event_json.is_null() {
            return Err(invalid("out_event_json is NULL"));
        }
        // SAFETY: a live handle from `tempo9_chat` / `tempo9_complete`, used by
        // one thread at a time, or NULL.
        let s = unsafe { stream.as_mut() }.ok_or_else(|| invalid("stream is NULL"))?;
        let next = match &mut s.inner {
            Inner::Chat(c) => loop {
                match c.next() {
                    None => break None,
                    Some(e) => {
                        if let Some(v) = event_json(&e) {
                            break Some(v);
                        }
                    }
                }
            },
            Inner::Complete(c) => c.next().map(|e| tempo9::complete::event_json(&e)),
        };
        let (status, ptr) = match next {
            Some(v) => (S::TEMPO9_OK, c_string(&v)),
            None => (S::TEMPO9_DONE, std::ptr::null_mut()),
        };
        // SAFETY: checked non-NULL above.
        unsafe { put(out_event_json, ptr) };
        Ok(status)
    })
}

/// Frees a stream (NULL is ignored); a request still running is cancelled and
/// its KV pages freed at the engine's next step.
#[no_mangle]
pub unsafe extern "C" fn tempo9_stream_free(stream: *mut Tempo9Stream) {
    boundary(|| {
        if !stream.is_null() {
            // SAFETY: `stream` came from this library and is freed once.
            drop(unsafe { Box::from_raw(stream) });
        }
        Ok(S::TEMPO9_OK)
    });
}

/// The engine's counters as JSON in `*out_json` (free with
/// `tempo9_string_free`): `running`, `waiting`, `kv_pages_total`,
/// `kv_pages_used`, `kv_pages_cached`, `kv_pages_free`, `prefix_query_tokens`,
/// `prefix_hit_tokens`, `generated_tokens_total`, `ssd_pages_written`, …, as
/// of the engine's last step.
#[no_mangle]
pub unsafe extern "C" fn tempo9_model_stats(
    model: *const Tempo9Model,
    out_json: *mut *mut c_char,
) -> Tempo9Status {
    boundary(|| {
        if out_json.is_null() {
            return Err(invalid("out_json is NULL"));
        }
        // SAFETY: arguments per this function's contract.
        let model = unsafe { model_ref(model)? };
        let v = tempo9::stats_json(&model.stats());
        // SAFETY: checked non-NULL above.
        unsafe { put(out_json, c_string(&v)) };
        Ok(S::TEMPO9_OK)
    })
}

/// Token ids of `text` (special-token text parsed, BOS added when the model
/// wants one): `*out_tokens` (free with `tempo9_tokens_free`) and `*out_len`.
#[no_mangle]
pub unsafe extern "C" fn tempo9_tokenize(
    model: *const Tempo9Model,
    text_utf8: *const c_char,
    out_tokens: *mut *mut u32,
    out_len: *mut usize,
) -> Tempo9Status {
    boundary(|| {
        if out_tokens.is_null() || out_len.is_null() {
            return Err(invalid("out_tokens or out_len is NULL"));
        }
        // SAFETY: arguments per this function's contract.
        let model = unsafe { model_ref(model)? };
        let t = unsafe { text(text_utf8, "text", false)? };
        let ids = model.tokenize(t).into_boxed_slice();
        let len = ids.len();
        // SAFETY: both checked non-NULL above.
        unsafe {
            put(out_tokens, Box::into_raw(ids) as *mut u32);
            *out_len = len;
        }
        Ok(S::TEMPO9_OK)
    })
}

/// Frees token ids from `tempo9_tokenize` (`len` as returned; NULL is ignored).
#[no_mangle]
pub unsafe extern "C" fn tempo9_tokens_free(tokens: *mut u32, len: usize) {
    boundary(|| {
        if !tokens.is_null() {
            // SAFETY: made by `tempo9_tokenize` as a boxed slice of `len` ids.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(tokens, len)) });
        }
        Ok(S::TEMPO9_OK)
    });
}

/// Frees a string this library returned (NULL is ignored).
#[no_mangle]
pub unsafe extern "C" fn tempo9_string_free(s: *mut c_char) {
    boundary(|| {
        if !s.is_null() {
            // SAFETY: made by `CString::into_raw` in this library, freed once.
            drop(unsafe { CString::from_raw(s) });
        }
        Ok(S::TEMPO9_OK)
    });
}

/// The message of the last failed call on this thread (`""` if none). Valid
/// until the next call into this library on this thread; do not free it.
#[no_mangle]
pub extern "C" fn tempo9_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// This library's version (static string).
#[no_mangle]
pub extern "C" fn tempo9_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}
