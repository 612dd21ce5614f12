//! Safe wrapper over ggml, the tensor library Tempo9 runs on.
//!
//! This is the only crate in the workspace with `unsafe` code: every call into
//! ggml (through the vendored copy in `llama-cpp-sys-2`) lives here, behind a
//! small API of contexts, tensors, graphs, devices, backends, buffers and a
//! scheduler. Only `ggml_*` and `ggml_backend_*` symbols are used.
//!
//! Lifetimes: a [`Tensor`] borrows the [`Context`] that holds its metadata, so it
//! cannot outlive it. Tensor *data* lives in a [`Buffer`] (weights, KV cache) or
//! in the scheduler's compute buffer (graph intermediates); callers keep those
//! alive as long as graphs that use them run (the model and engine types do).

mod backend;
mod context;
pub mod gpu;
mod kernels;
mod quant;

pub use backend::{
    init_logging, load_backend, sched_stats, sm_share_params, Backend, Buffer, BufferType, Device,
    DeviceKind, HostBytes, SchedStats, Scheduler, HIGH_PRIORITY_STREAMS,
};
pub use context::{Context, Graph, KeptGraph, Pod, RopeParams, Tensor, TensorStore};
pub use gpu::DeviceChoice;
pub use kernels::KernelSet;
pub use quant::quantize_rows;

/// Errors raised by the ggml wrapper.
#[derive(Debug, thiserror::Error)]
pub enum GgmlError {
    /// ggml could not create a context (out of memory).
    #[error("ggml context allocation of {0} bytes failed")]
    ContextAlloc(usize),
    /// A backend buffer could not be allocated.
    #[error("could not allocate a {size}-byte buffer of type {buft}")]
    BufferAlloc {
        /// Requested size in bytes.
        size: usize,
        /// Buffer type name.
        buft: String,
    },
    /// The device could not start a backend.
    #[error("could not initialise a backend on device {0}")]
    BackendInit(String),
    /// A backend library could not be loaded.
    #[error("could not load ggml backend library {0}")]
    BackendLoad(String),
    /// Graph allocation failed in the scheduler.
    #[error("graph allocation failed")]
    GraphAlloc,
    /// Graph computation returned an error status.
    #[error("graph computation failed: {0}")]
    Compute(String),
    /// Data handed to or read from a tensor does not fit it.
    #[error("tensor {name}: {what}")]
    TensorData {
        /// Tensor name.
        name: String,
        /// What is wrong.
        what: String,
    },
}

/// Element type of a tensor, as ggml numbers it (`enum ggml_type`).
///
/// The numbering is the same one GGUF files use, so a type read from a file can
/// be passed through with [`DType::from_raw`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DType(u32);

impl DType {
    /// 32-bit float.
    pub const F32: DType = DType(0);
    /// 16-bit IEEE float.
    pub const F16: DType = DType(1);
    /// 4-bit, blocks of 32 with an f16 scale.
    pub const Q4_0: DType = DType(2);
    /// 8-bit, blocks of 32 with an f16 scale.
    pub const Q8_0: DType = DType(8);
    /// 4-bit k-quant (super-blocks of 256).
    pub const Q4_K: DType = DType(12);
    /// 5-bit k-quant (super-blocks of 256).
    pub const Q5_K: DType = DType(13);
    /// 6-bit k-quant (super-blocks of 256).
    pub const Q6_K: DType = DType(14);
    /// bfloat16.
    pub const BF16: DType = DType(30);
    /// 32-bit signed integer.
    pub const I32: DType = DType(26);
    /// 64-bit signed integer.
    pub const I64: DType = DType(27);

    /// Wraps a raw ggml type id; `None` if ggml does not know it.
    pub fn from_raw(raw: u32) -> Option<DType> {
        if raw >= llama_cpp_sys_2::GGML_TYPE_COUNT {
            return None;
        }
        // SAFETY: the id is below GGML_TYPE_COUNT; ggml_type_name returns a static string
        // (or NULL for removed ids, which we reject).
        let name = unsafe { llama_cpp_sys_2::ggml_type_name(raw) };
        if name.is_null() || unsafe { llama_cpp_sys_2::ggml_blck_size(raw) } == 0 {
            return None;
        }
        Some(DType(raw))
    }

    /// The raw ggml id.
    pub fn raw(self) -> u32 {
        self.0
    }

    /// ggml's name for the type (e.g. `q4_K`).
    pub fn name(self) -> &'static str {
        // SAFETY: valid ids only (constructed through from_raw or constants).
        unsafe {
            std::ffi::CStr::from_ptr(llama_cpp_sys_2::ggml_type_name(self.0))
                .to_str()
                .unwrap_or("?")
        }
    }

    /// Bytes of one row of `n` elements (`n` must be a multiple of the block size).
    pub fn row_size(self, n: i64) -> usize {
        // SAFETY: pure function of valid arguments.
        unsafe { llama_cpp_sys_2::ggml_row_size(self.0, n) }
    }

    /// Elements per block (1 for plain types, 32 or 256 for quantized ones).
    pub fn block_size(self) -> usize {
        // SAFETY: valid ids only.
        unsafe { llama_cpp_sys_2::ggml_blck_size(self.0) as usize }
    }

    /// The type ggml calls `name` (case-insensitive, e.g. `q4_k`, `f16`).
    pub fn from_name(name: &str) -> Option<DType> {
        (0..llama_cpp_sys_2::GGML_TYPE_COUNT)
            .filter_map(DType::from_raw)
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Whether the type is a block-quantized one.
    pub fn is_quantized(self) -> bool {
        // SAFETY: pure function.
        unsafe { llama_cpp_sys_2::ggml_is_quantized(self.0) }
    }
}

/// Converts an f32 to ggml's f16 bit pattern (IEEE half).
pub fn f32_to_f16_bits(x: f32) -> u16 {
    // SAFETY: pure conversion.
    unsafe { llama_cpp_sys_2::ggml_fp32_to_fp16(x) }
}

/// Converts ggml's f16 bit pattern (IEEE half) to an f32.
pub fn f16_bits_to_f32(h: u16) -> f32 {
    // SAFETY: pure conversion.
    unsafe { llama_cpp_sys_2::ggml_fp16_to_fp32(h) }
}

/// Bytes of metadata ggml needs per tensor in a no-alloc context.
pub fn tensor_overhead() -> usize {
    // SAFETY: pure function.
    unsafe { llama_cpp_sys_2::ggml_tensor_overhead() }
}
