//! Devices, backends, buffers and the graph scheduler (ggml's generic backend API:
//! the same calls serve the CPU, CUDA and Metal).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use llama_cpp_sys_2 as sys;

use crate::context::{Context, Graph, Tensor};
use crate::{DType, GgmlError};

fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: ggml returns NUL-terminated static strings.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Routes ggml's log output into `tracing` (debug level for info, warn/error kept).
pub fn init_logging() {
    unsafe extern "C" fn log_cb(level: sys::ggml_log_level, text: *const c_char, _: *mut c_void) {
        let msg = cstr(text);
        let msg = msg.trim_end();
        if msg.is_empty() {
            return;
        }
        match level {
            sys::GGML_LOG_LEVEL_ERROR => tracing::error!(target: "ggml", "{msg}"),
            sys::GGML_LOG_LEVEL_WARN => tracing::warn!(target: "ggml", "{msg}"),
            _ => tracing::debug!(target: "ggml", "{msg}"),
        }
    }
    // SAFETY: the callback is a plain function valid for the program's life.
    unsafe { sys::ggml_log_set(Some(log_cb), std::ptr::null_mut()) };
}

/// Loads a ggml backend library (e.g. `libggml-cuda.so`) so its devices become
/// visible to [`Device::all`], and returns those devices (none when the library
/// loads but finds no hardware). The library must be built from the same ggml
/// source as the process's `libggml-base`, which it shares.
pub fn load_backend(path: &Path) -> Result<Vec<Device>, GgmlError> {
    let s = path.to_string_lossy().into_owned();
    let c = CString::new(s.clone()).map_err(|_| GgmlError::BackendLoad(s.clone()))?;
    // SAFETY: valid C string; ggml returns null on failure.
    let reg = unsafe { sys::ggml_backend_load(c.as_ptr()) };
    if reg.is_null() {
        return Err(GgmlError::BackendLoad(s));
    }
    // SAFETY: a live registry; device handles stay valid for the program's life.
    let n = unsafe { sys::ggml_backend_reg_dev_count(reg) };
    Ok((0..n)
        .filter_map(|i| NonNull::new(unsafe { sys::ggml_backend_reg_dev_get(reg, i) }))
        .map(|ptr| Device { ptr })
        .collect())
}

/// Kind of compute device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// The host CPU.
    Cpu,
    /// A discrete GPU.
    Gpu,
    /// An integrated GPU sharing host memory.
    IGpu,
    /// Another accelerator.
    Accel,
}

/// A compute device registered with ggml (static for the program's life).
#[derive(Clone, Copy)]
pub struct Device {
    ptr: NonNull<sys::ggml_backend_device>,
}

// SAFETY: device handles are immutable registry entries, valid for the program's life.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.name())
    }
}

impl Device {
    /// All devices ggml knows (the CPU plus any loaded backend's devices).
    pub fn all() -> Vec<Device> {
        // SAFETY: registry queries.
        let n = unsafe { sys::ggml_backend_dev_count() };
        (0..n)
            .filter_map(|i| NonNull::new(unsafe { sys::ggml_backend_dev_get(i) }))
            .map(|ptr| Device { ptr })
            .collect()
    }

    /// The CPU device.
    pub fn cpu() -> Device {
        // Asking the CPU backend's own registry (rather than searching by type) also makes
        // every binary link libggml-cpu directly, so it is found next to the binary.
        // SAFETY: the CPU registry always has exactly one device.
        let p = unsafe { sys::ggml_backend_reg_dev_get(sys::ggml_backend_cpu_reg(), 0) };
        Device {
            ptr: NonNull::new(p).expect("ggml has no CPU device"),
        }
    }

    /// The first device of `kind`, if any.
    pub fn first_of(kind: DeviceKind) -> Option<Device> {
        Device::all().into_iter().find(|d| d.kind() == kind)
    }

    fn raw(&self) -> *mut sys::ggml_backend_device {
        self.ptr.as_ptr()
    }

    /// Device name (e.g. `CPU`, `CUDA0`).
    pub fn name(&self) -> String {
        // SAFETY: live device.
        cstr(unsafe { sys::ggml_backend_dev_name(self.raw()) })
    }

    /// Human-readable description.
    pub fn description(&self) -> String {
        // SAFETY: live device.
        cstr(unsafe { sys::ggml_backend_dev_description(self.raw()) })
    }

    /// Device kind.
    pub fn kind(&self) -> DeviceKind {
        // SAFETY: live device.
        match unsafe { sys::ggml_backend_dev_type(self.raw()) } {
            sys::GGML_BACKEND_DEVICE_TYPE_CPU => DeviceKind::Cpu,
            sys::GGML_BACKEND_DEVICE_TYPE_GPU => DeviceKind::Gpu,
            sys::GGML_BACKEND_DEVICE_TYPE_IGPU => DeviceKind::IGpu,
            _ => DeviceKind::Accel,
        }
    }

    /// (free, total) device memory in bytes.
    pub fn memory(&self) -> (usize, usize) {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: out-pointers to locals.
        unsafe { sys::ggml_backend_dev_memory(self.raw(), &mut free, &mut total) };
        (free, total)
    }

    /// The device's default buffer type.
    pub fn buffer_type(&self) -> BufferType {
        // SAFETY: live device.
        BufferType::from_raw(unsafe { sys::ggml_backend_dev_buffer_type(self.raw()) })
            .expect("device without a buffer type")
    }

    fn proc_address(&self, name: &str) -> *mut c_void {
        let c = CString::new(name).expect("static name");
        // SAFETY: live device and its registry; returns null when absent.
        unsafe {
            let reg = sys::ggml_backend_dev_backend_reg(self.raw());
            if reg.is_null() {
                return std::ptr::null_mut();
            }
            sys::ggml_backend_reg_get_proc_address(reg, c.as_ptr())
        }
    }

    /// The features its backend library reports (`ggml_backend_get_features`: build
    /// options such as `USE_GRAPHS`), as name/value pairs; empty if it reports none.
    pub fn backend_features(&self) -> Vec<(String, String)> {
        let f = self.proc_address("ggml_backend_get_features");
        if f.is_null() {
            return Vec::new();
        }
        // SAFETY: the registry documents this signature for the name.
        let f: sys::ggml_backend_get_features_t = unsafe { std::mem::transmute(f) };
        let mut out = Vec::new();
        // SAFETY: returns a static array terminated by a null name; a live registry.
        unsafe {
            let reg = sys::ggml_backend_dev_backend_reg(self.raw());
            let Some(f) = f else {
                return out;
            };
            let mut p = f(reg);
            while !p.is_null() && !(*p).name.is_null() {
                let s = |c: *const std::os::raw::c_char| {
                    if c.is_null() {
                        String::new()
                    } else {
                        std::ffi::CStr::from_ptr(c).to_string_lossy().into_owned()
                    }
                };
                out.push((s((*p).name), s((*p).value)));
                p = p.add(1);
            }
        }
        out
    }

    /// Extra buffer types the device offers for weights (on the CPU: repacked layouts
    /// that make quantized matmuls faster). Empty if none.
    pub fn extra_buffer_types(&self) -> Vec<BufferType> {
        let f = self.proc_address("ggml_backend_dev_get_extra_bufts");
        if f.is_null() {
            return Vec::new();
        }
        // SAFETY: the registry documents this signature for the name.
        let f: unsafe extern "C" fn(
            sys::ggml_backend_dev_t,
        ) -> *mut sys::ggml_backend_buffer_type_t = unsafe { std::mem::transmute(f) };
        let mut out = Vec::new();
        // SAFETY: returns a null-terminated static array.
        unsafe {
            let mut p = f(self.raw());
            while !p.is_null() && !(*p).is_null() {
                out.extend(BufferType::from_raw(*p));
                p = p.add(1);
            }
        }
        out
    }

    /// Whether this device can run `mul_mat(weight, x)` with `weight` stored in `buft`.
    /// Used to decide which weights may live in a repacked buffer type.
    pub fn supports_mul_mat_in(&self, buft: BufferType, weight: Tensor<'_>) -> bool {
        self.supports_weight_op_in(buft, weight, |ctx, w| {
            let x = ctx.new_tensor(DType::F32, &[w.ne()[0], 512]);
            ctx.mul_mat(w, x)
        })
    }

    /// Like [`Device::supports_mul_mat_in`] for a 3-D expert weight used by
    /// `mul_mat_id` (`n_used` experts per token), as llama.cpp checks it.
    pub fn supports_mul_mat_id_in(
        &self,
        buft: BufferType,
        weight: Tensor<'_>,
        n_used: usize,
    ) -> bool {
        self.supports_weight_op_in(buft, weight, |ctx, w| {
            let x = ctx.new_tensor(DType::F32, &[w.ne()[0], n_used as i64, 512]);
            let ids = ctx.new_tensor(DType::I32, &[n_used as i64, 512]);
            ctx.mul_mat_id(w, x, ids)
        })
    }

    /// Whether this device runs the op `build(ctx, weight)` with `weight` in a buffer of `buft`.
    fn supports_weight_op_in(
        &self,
        buft: BufferType,
        weight: Tensor<'_>,
        build: impl for<'c> FnOnce(&'c Context, Tensor<'c>) -> Tensor<'c>,
    ) -> bool {
        let Ok(ctx) = Context::new(4, 0) else {
            return false;
        };
        let op = build(&ctx, weight);
        // SAFETY: a zero-size buffer of `buft` stands in for the weight's future buffer while
        // the device inspects the op; the weight's buffer field is restored before returning.
        unsafe {
            let dummy = sys::ggml_backend_buft_alloc_buffer(buft.raw(), 0);
            if dummy.is_null() {
                return false;
            }
            let w = weight.raw();
            let saved = (*w).buffer;
            (*w).buffer = dummy;
            let ok = sys::ggml_backend_dev_supports_op(self.raw(), op.raw());
            (*w).buffer = saved;
            sys::ggml_backend_buffer_free(dummy);
            ok
        }
    }

    /// Whether this device can look up rows of `weight` (`get_rows`) where it lies.
    pub fn supports_get_rows(&self, weight: Tensor<'_>) -> bool {
        let Ok(ctx) = Context::new(2, 0) else {
            return false;
        };
        // ggml_get_rows takes one index row per matrix of a 3-D or 4-D weight (e.g.
        // Gemma 4 vision's two position tables): the probe's indices must match.
        let ne = weight.ne();
        let ids = ctx.new_tensor(DType::I32, &[8, ne[2], ne[3]]);
        let op = ctx.get_rows(weight, ids);
        self.supports_op(op)
    }

    /// Whether `tensor`'s op can run on this device.
    pub fn supports_op(&self, tensor: Tensor<'_>) -> bool {
        // SAFETY: live device and tensor.
        unsafe { sys::ggml_backend_dev_supports_op(self.raw(), tensor.raw()) }
    }
}

/// A kind of backend memory (host RAM, a GPU's memory, a repacked CPU layout, …).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct BufferType {
    ptr: NonNull<sys::ggml_backend_buffer_type>,
}

// SAFETY: buffer types are static registry entries.
unsafe impl Send for BufferType {}
unsafe impl Sync for BufferType {}

impl std::fmt::Debug for BufferType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BufferType({})", self.name())
    }
}

impl BufferType {
    fn from_raw(p: sys::ggml_backend_buffer_type_t) -> Option<BufferType> {
        NonNull::new(p).map(|ptr| BufferType { ptr })
    }

    fn raw(&self) -> sys::ggml_backend_buffer_type_t {
        self.ptr.as_ptr()
    }

    /// The plain host-memory CPU buffer type.
    pub fn cpu() -> BufferType {
        // SAFETY: static buffer type.
        BufferType::from_raw(unsafe { sys::ggml_backend_cpu_buffer_type() }).expect("cpu buft")
    }

    /// Name (e.g. `CPU`, `CPU_REPACK`, `CUDA0`).
    pub fn name(&self) -> String {
        // SAFETY: live buffer type.
        cstr(unsafe { sys::ggml_backend_buft_name(self.raw()) })
    }

    /// Bytes `tensor` needs in a buffer of this type (may exceed its plain size, e.g. padding).
    pub fn alloc_size(&self, tensor: Tensor<'_>) -> usize {
        // SAFETY: live buffer type and tensor.
        unsafe { sys::ggml_backend_buft_get_alloc_size(self.raw(), tensor.raw()) }
    }

    /// Alignment of tensor data in buffers of this type.
    pub fn alignment(&self) -> usize {
        // SAFETY: live buffer type.
        unsafe { sys::ggml_backend_buft_get_alignment(self.raw()) }
    }

    /// Whether buffers of this type live in host memory.
    pub fn is_host(&self) -> bool {
        // SAFETY: live buffer type.
        unsafe { sys::ggml_backend_buft_is_host(self.raw()) }
    }

    /// Allocates one buffer holding every not-yet-allocated tensor of `ctx`.
    /// Returns `Ok(None)` when `ctx` has no tensor left to allocate.
    pub fn alloc_tensors(&self, ctx: &Context) -> Result<Option<Buffer>, GgmlError> {
        // SAFETY: live context and buffer type; null means nothing to allocate or failure,
        // told apart by the size query.
        unsafe {
            let need =
                sys::ggml_backend_alloc_ctx_tensors_from_buft_size(ctx.raw_ptr(), self.raw());
            if need == 0 {
                return Ok(None);
            }
            let b = sys::ggml_backend_alloc_ctx_tensors_from_buft(ctx.raw_ptr(), self.raw());
            match NonNull::new(b) {
                Some(ptr) => Ok(Some(Buffer { ptr, _owner: None })),
                None => Err(GgmlError::BufferAlloc {
                    size: need,
                    buft: self.name(),
                }),
            }
        }
    }

    /// Allocates an uninitialised buffer of `size` bytes.
    pub fn alloc(&self, size: usize) -> Result<Buffer, GgmlError> {
        // SAFETY: returns null on failure.
        let b = unsafe { sys::ggml_backend_buft_alloc_buffer(self.raw(), size) };
        NonNull::new(b)
            .map(|ptr| Buffer { ptr, _owner: None })
            .ok_or(GgmlError::BufferAlloc {
                size,
                buft: self.name(),
            })
    }
}

/// Host bytes that a [`Buffer`] may wrap without copying (e.g. a memory-mapped model file).
pub trait HostBytes: Send + Sync {
    /// The bytes; must stay at the same address for the object's life.
    fn host_bytes(&self) -> &[u8];

    /// Returns the whole OS pages within `offset..offset + len` to the OS, which
    /// then read as zeros again; false where the memory cannot (the default).
    fn discard(&self, _offset: usize, _len: usize) -> bool {
        false
    }
}

/// An anonymous memory map owned by a [`Buffer`] that ggml writes into.
struct AnonMap(memmap2::MmapMut);

/// OS page size assumed for [`HostBytes::discard`] (a larger real page only makes
/// the kernel round further).
const OS_PAGE: usize = 4096;

impl HostBytes for AnonMap {
    fn host_bytes(&self) -> &[u8] {
        &self.0
    }

    fn discard(&self, offset: usize, len: usize) -> bool {
        let end = offset.saturating_add(len).min(self.0.len());
        let start = offset.next_multiple_of(OS_PAGE);
        let end = end - end % OS_PAGE;
        if start >= end {
            return true;
        }
        // SAFETY: MADV_DONTNEED on a private anonymous mapping drops the pages; the
        // next access reads zeros, as on a fresh map. Rust holds no reference into
        // these bytes (only ggml reads them, through the buffer), and the caller
        // discards only memory no computation is using.
        unsafe {
            self.0
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
                .is_ok()
        }
    }
}

/// Backend memory holding tensor data.
pub struct Buffer {
    ptr: NonNull<sys::ggml_backend_buffer>,
    // Keeps wrapped host memory (a model mapping) alive while the buffer points into it.
    _owner: Option<Arc<dyn HostBytes>>,
}

// SAFETY: ggml buffers may be used from any thread; we never use one from two at once
// without the engine's own synchronisation.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl Buffer {
    /// Wraps host memory as a CPU buffer without copying. Tensors placed in it with
    /// [`Buffer::place`] read their data straight from `bytes` (read-only use only).
    /// Fails if the memory is not 32-byte aligned (memory maps always are).
    pub fn from_host(bytes: Arc<dyn HostBytes>) -> Result<Buffer, GgmlError> {
        let s = bytes.host_bytes();
        // ggml aborts on host memory below its tensor alignment (32 bytes).
        if !(s.as_ptr() as usize).is_multiple_of(32) {
            return Err(GgmlError::BufferAlloc {
                size: s.len(),
                buft: "CPU(host ptr, unaligned)".into(),
            });
        }
        // SAFETY: the memory stays alive (we hold `bytes`) and is aligned; ggml only reads weights.
        let b =
            unsafe { sys::ggml_backend_cpu_buffer_from_ptr(s.as_ptr() as *mut c_void, s.len()) };
        let ptr = NonNull::new(b).ok_or(GgmlError::BufferAlloc {
            size: s.len(),
            buft: "CPU(host ptr)".into(),
        })?;
        Ok(Buffer {
            ptr,
            _owner: Some(bytes),
        })
    }

    /// A writable CPU buffer of `size` bytes that reads as zeros until written, in an
    /// anonymous memory map: the OS commits a page only when it is first written
    /// (a KV pool costs nothing until tokens arrive), and its bytes never hold what
    /// the process's allocator last kept there.
    pub fn zeroed_host(size: usize) -> Result<Buffer, GgmlError> {
        let err = || GgmlError::BufferAlloc {
            size,
            buft: "CPU(anonymous map)".into(),
        };
        let map = memmap2::MmapMut::map_anon(size.max(1)).map_err(|_| err())?;
        let ptr = map.as_ptr() as *mut c_void;
        // SAFETY: the map stays alive and at its address while the buffer exists (we
        // hold it); it is page aligned; Rust never touches its bytes afterwards, so
        // ggml is the only writer.
        let b = unsafe { sys::ggml_backend_cpu_buffer_from_ptr(ptr, size) };
        let ptr = NonNull::new(b).ok_or_else(err)?;
        Ok(Buffer {
            ptr,
            _owner: Some(Arc::new(AnonMap(map))),
        })
    }

    fn raw(&self) -> sys::ggml_backend_buffer_t {
        self.ptr.as_ptr()
    }

    /// Returns bytes `offset..offset + len` of `t`'s data to the OS when `t` lives in
    /// this buffer and the buffer is [`Buffer::zeroed_host`] memory: they read as
    /// zeros again and are committed when next written (whole OS pages only). For
    /// an idle engine's free KV pages. False when `t` is not in this buffer or the
    /// memory cannot be discarded. Nothing may be computing on those bytes.
    pub fn discard_tensor_bytes(&self, t: Tensor<'_>, offset: usize, len: usize) -> bool {
        let Some(owner) = &self._owner else {
            return false;
        };
        let base = owner.host_bytes().as_ptr() as usize;
        let size = owner.host_bytes().len();
        // SAFETY: live tensor; reading its data pointer only.
        let data = unsafe { (*t.raw()).data } as usize;
        if data < base || data + t.nbytes() > base + size || offset + len > t.nbytes() {
            return false;
        }
        owner.discard(data - base + offset, len)
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        // SAFETY: live buffer.
        unsafe { sys::ggml_backend_buffer_get_size(self.raw()) }
    }

    /// Name of the buffer's type.
    pub fn type_name(&self) -> String {
        // SAFETY: live buffer.
        cstr(unsafe { sys::ggml_backend_buffer_name(self.raw()) })
    }

    /// Marks the buffer as holding weights (lets schedulers prefer its backend for ops on them).
    pub fn mark_weights(&self) {
        // SAFETY: live buffer.
        unsafe {
            sys::ggml_backend_buffer_set_usage(self.raw(), sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        }
    }

    /// Fills the whole buffer with `byte`.
    pub fn clear(&self, byte: u8) {
        // SAFETY: live buffer.
        unsafe { sys::ggml_backend_buffer_clear(self.raw(), byte) }
    }

    /// Places an unallocated tensor at byte `offset` of this buffer (no copy).
    pub fn place(&self, tensor: Tensor<'_>, offset: usize) -> Result<(), GgmlError> {
        let err = |what: String| GgmlError::TensorData {
            name: tensor.name(),
            what,
        };
        if tensor.is_allocated() {
            return Err(err("already allocated".into()));
        }
        if offset
            .checked_add(tensor.nbytes())
            .is_none_or(|e| e > self.size())
        {
            return Err(err(format!(
                "{}+{} outside a {}-byte buffer",
                offset,
                tensor.nbytes(),
                self.size()
            )));
        }
        // SAFETY: range checked; base is the buffer's start.
        let status = unsafe {
            let base = sys::ggml_backend_buffer_get_base(self.raw()).cast::<u8>();
            sys::ggml_backend_tensor_alloc(self.raw(), tensor.raw(), base.add(offset).cast())
        };
        if status != sys::GGML_STATUS_SUCCESS {
            return Err(err(format!("tensor_alloc failed with status {status}")));
        }
        Ok(())
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: we own the buffer; tensors using it are dropped with their owners first.
        unsafe { sys::ggml_backend_buffer_free(self.raw()) }
    }
}

/// [`Backend::with_params`] string asking the CUDA library built by
/// `scripts/gpu/build-cuda.sh` (feature `STREAM_PRIORITY`) for streams at the
/// device's greatest priority: the block scheduler then serves this backend's
/// kernels first when another backend's (an image encoder's) fill the GPU.
pub const HIGH_PRIORITY_STREAMS: &str = "stream_priority=high";

/// [`Backend::with_params`] string asking the CUDA library built by
/// `scripts/gpu/build-cuda.sh` (feature `GREEN_CTX`) to run this backend's kernels
/// on `percent`% of the GPU's SMs (a CUDA green context), so that an image
/// encoder beside the decode steps leaves most SMs free for their small kernels:
/// stream priorities alone only order the queue of blocks waiting for an SM.
/// Other libraries, and this one where the driver cannot make such a context,
/// run the backend on every SM.
pub fn sm_share_params(percent: u32) -> String {
    format!("sm_share={percent}")
}

/// A running backend (execution stream) on a device.
pub struct Backend {
    ptr: NonNull<sys::ggml_backend>,
    device: Device,
}

// SAFETY: a backend is used by one thread at a time (the engine thread owns it).
unsafe impl Send for Backend {}

impl Backend {
    /// Starts a backend on `device`.
    pub fn new(device: Device) -> Result<Backend, GgmlError> {
        Self::with_params(device, "")
    }

    /// Starts a backend on `device` with a parameter string for its library
    /// (`ggml_backend_dev_init`'s `params`; libraries ignore what they do not
    /// know). The CUDA library built by `scripts/gpu/build-cuda.sh` takes
    /// [`HIGH_PRIORITY_STREAMS`].
    pub fn with_params(device: Device, params: &str) -> Result<Backend, GgmlError> {
        let params = CString::new(params).map_err(|_| GgmlError::BackendInit(device.name()))?;
        // SAFETY: live device; a NUL-terminated string that outlives the call; null
        // on failure.
        let p = unsafe { sys::ggml_backend_dev_init(device.raw(), params.as_ptr()) };
        NonNull::new(p)
            .map(|ptr| Backend { ptr, device })
            .ok_or_else(|| GgmlError::BackendInit(device.name()))
    }

    /// The device this backend runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Sets the number of CPU threads (no-op on backends without threads). ggml is
    /// built with OpenMP, whose workers persist between graphs.
    pub fn set_threads(&self, n: usize) {
        let n = n.max(1) as c_int;
        let f = self.device.proc_address("ggml_backend_set_n_threads");
        if f.is_null() {
            return;
        }
        // SAFETY: documented signature for this registry name.
        let f: unsafe extern "C" fn(sys::ggml_backend_t, c_int) = unsafe { std::mem::transmute(f) };
        // SAFETY: live backend.
        unsafe { f(self.ptr.as_ptr(), n) };
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: we own the backend.
        unsafe { sys::ggml_backend_free(self.ptr.as_ptr()) }
    }
}

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static ALLOC_NS: AtomicU64 = AtomicU64::new(0);
static COMPUTES: AtomicU64 = AtomicU64::new(0);
static COMPUTE_NS: AtomicU64 = AtomicU64::new(0);
static LAST_SPLITS: AtomicU64 = AtomicU64::new(0);

/// Host-side time spent in graph schedulers, summed over every [`Scheduler`] of the
/// process since it started. Benchmarks take differences to see where a step's time
/// goes: graph allocation (splitting and placing tensors) versus computation (which
/// includes waiting for the device).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedStats {
    /// Graphs allocated.
    pub allocs: u64,
    /// Nanoseconds in [`Scheduler::alloc`].
    pub alloc_ns: u64,
    /// Graphs computed.
    pub computes: u64,
    /// Nanoseconds in [`Scheduler::compute`] (until the results are ready).
    pub compute_ns: u64,
    /// Backend splits of the last graph allocated (1 = it ran on one backend).
    pub last_splits: u64,
}

/// The scheduler counters so far (see [`SchedStats`]).
pub fn sched_stats() -> SchedStats {
    SchedStats {
        allocs: ALLOCS.load(Relaxed),
        alloc_ns: ALLOC_NS.load(Relaxed),
        computes: COMPUTES.load(Relaxed),
        compute_ns: COMPUTE_NS.load(Relaxed),
        last_splits: LAST_SPLITS.load(Relaxed),
    }
}

/// Runs graphs over one or more backends, splitting them by where weights live and
/// allocating intermediate tensors in reusable compute buffers.
pub struct Scheduler {
    ptr: NonNull<sys::ggml_backend_sched>,
    // Declared after `ptr` so the scheduler is freed before the backends it uses.
    backends: Vec<Backend>,
    /// Graph size (nodes plus leafs) the scheduler's tables hold.
    capacity: usize,
    debug_dump: bool,
    inputs: InputArena,
}

/// Host memory for a graph's input tensors, kept from graph to graph and grown
/// with headroom. Why not the scheduler's own buffers: those are reallocated at the
/// exact size whenever a graph needs more (every step of a prompt prefilled at a
/// growing depth, whose masks grow with it), so each step's inputs were written to
/// freshly mapped pages (a 10 MB mask at a 10K-token depth: 5 ms per step on the
/// H200's host, now 2). Ordinary memory, not a GPU's pinned host memory: pinning
/// took up to 30 ms per growth there and saved under 1 ms per step in copies.
struct InputArena {
    buft: BufferType,
    buf: Option<Buffer>,
}

impl InputArena {
    /// Places every unallocated input tensor of `ctx` in the arena, replacing it by
    /// a larger one first if they do not fit (tensors placed in the old one must be
    /// out of use: the caller allocates one graph at a time).
    fn place(&mut self, ctx: &Context) -> Result<(), GgmlError> {
        let inputs: Vec<Tensor<'_>> = ctx
            .input_tensors()
            .into_iter()
            .filter(|t| !t.is_allocated())
            .collect();
        let align = self.buft.alignment().max(1);
        let mut offsets = Vec::with_capacity(inputs.len());
        let mut size = 0usize;
        for &t in &inputs {
            offsets.push(size);
            size += self.buft.alloc_size(t).next_multiple_of(align);
        }
        if self.buf.as_ref().is_none_or(|b| b.size() < size) {
            // Free the old one first; half again as much, so that inputs growing step
            // by step rarely need a new one.
            self.buf = None;
            self.buf = Some(self.buft.alloc((size + size / 2).max(1 << 16))?);
        }
        let buf = self.buf.as_ref().expect("allocated above");
        for (&t, off) in inputs.iter().zip(offsets) {
            buf.place(t, off)?;
        }
        Ok(())
    }
}

// SAFETY: owned by the engine thread; moved, never shared.
unsafe impl Send for Scheduler {}

impl Scheduler {
    /// A scheduler over `backends` in priority order; the last one must be the CPU.
    ///
    /// `capacity` bounds a graph's nodes plus leafs; [`Scheduler::reserve`] grows it.
    pub fn new(backends: Vec<Backend>, capacity: usize) -> Result<Scheduler, GgmlError> {
        assert!(!backends.is_empty());
        let ptr = Self::create(&backends, capacity)?;
        Ok(Scheduler {
            ptr,
            backends,
            capacity,
            debug_dump: false,
            inputs: InputArena {
                buft: BufferType::cpu(),
                buf: None,
            },
        })
    }

    fn create(
        backends: &[Backend],
        capacity: usize,
    ) -> Result<NonNull<sys::ggml_backend_sched>, GgmlError> {
        let mut raw: Vec<sys::ggml_backend_t> = backends.iter().map(|b| b.ptr.as_ptr()).collect();
        // SAFETY: live backends; default buffer types (null); op offload on.
        let p = unsafe {
            sys::ggml_backend_sched_new(
                raw.as_mut_ptr(),
                std::ptr::null_mut(),
                raw.len() as c_int,
                capacity,
                false,
                true,
            )
        };
        NonNull::new(p).ok_or_else(|| GgmlError::BackendInit("scheduler".into()))
    }

    /// Makes room for graphs of up to `size` nodes plus leafs, replacing the
    /// scheduler with a larger one (capacity doubled) when needed; its compute
    /// buffers are then allocated again by the next [`Scheduler::alloc`].
    ///
    /// Why not one large scheduler: ggml clears tables sized by the capacity on
    /// every step (~2.6 MB at 2^17 nodes with two backends), a cost each decode step
    /// pays although most graphs have a few thousand nodes.
    pub fn reserve(&mut self, size: usize) -> Result<(), GgmlError> {
        if size <= self.capacity {
            return Ok(());
        }
        let capacity = size.next_power_of_two();
        let ptr = Self::create(&self.backends, capacity)?;
        // SAFETY: we own the old scheduler and no graph allocated by it is in use.
        unsafe { sys::ggml_backend_sched_free(self.ptr.as_ptr()) };
        self.ptr = ptr;
        self.capacity = capacity;
        let dump = self.debug_dump;
        self.set_debug_dump(dump);
        Ok(())
    }

    /// The backends, in priority order.
    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    /// Allocates `graph`, built in `ctx`, placing the context's input tensors in the
    /// scheduler's input arena (host memory reused from graph to graph) and everything
    /// else as [`Scheduler::alloc`] does. Inputs placed for an earlier graph may move:
    /// only the graph allocated last may be computed.
    pub fn alloc_with_inputs(&mut self, ctx: &Context, graph: &Graph<'_>) -> Result<(), GgmlError> {
        self.inputs.place(ctx)?;
        self.alloc(graph)
    }

    /// Allocates all intermediate tensors of `graph`; after this, inputs can be written.
    pub fn alloc(&mut self, graph: &Graph<'_>) -> Result<(), GgmlError> {
        let t0 = Instant::now();
        // SAFETY: live scheduler and graph.
        unsafe {
            sys::ggml_backend_sched_reset(self.ptr.as_ptr());
            if !sys::ggml_backend_sched_alloc_graph(self.ptr.as_ptr(), graph.raw()) {
                return Err(GgmlError::GraphAlloc);
            }
            let splits = sys::ggml_backend_sched_get_n_splits(self.ptr.as_ptr());
            LAST_SPLITS.store(splits.max(0) as u64, Relaxed);
        }
        ALLOCS.fetch_add(1, Relaxed);
        ALLOC_NS.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        Ok(())
    }

    /// Computes an allocated graph and waits for it.
    pub fn compute(&mut self, graph: &Graph<'_>) -> Result<(), GgmlError> {
        let t0 = Instant::now();
        // SAFETY: graph allocated by `alloc`.
        let status =
            unsafe { sys::ggml_backend_sched_graph_compute(self.ptr.as_ptr(), graph.raw()) };
        COMPUTES.fetch_add(1, Relaxed);
        COMPUTE_NS.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        if status != sys::GGML_STATUS_SUCCESS {
            return Err(GgmlError::Compute(cstr(unsafe {
                sys::ggml_status_to_string(status)
            })));
        }
        Ok(())
    }

    /// Debugging aid: after each graph node is computed, print its name, shape and the
    /// sum of its F32 values to stderr (like llama.cpp's eval-callback tool); with
    /// `TEMPO9_DUMP_VALUES` set, also the first and last three values of its first,
    /// second and last rows (printed before the node's line).
    pub fn set_debug_dump(&mut self, on: bool) {
        unsafe extern "C" fn cb(t: *mut sys::ggml_tensor, ask: bool, _: *mut c_void) -> bool {
            if ask {
                return true;
            }
            // SAFETY: ggml passes a computed tensor; we only read it.
            unsafe {
                let t = &*t;
                let name = CStr::from_ptr(t.name.as_ptr()).to_string_lossy();
                let n = t.ne.iter().product::<i64>() as usize;
                let mut sum = f64::NAN;
                if t.type_ == sys::GGML_TYPE_F32 && sys::ggml_is_contiguous(t) {
                    let mut v = vec![0f32; n];
                    sys::ggml_backend_tensor_get(t, v.as_mut_ptr().cast(), 0, n * 4);
                    sum = v.iter().map(|&x| x as f64).sum();
                    if std::env::var_os("TEMPO9_DUMP_VALUES").is_some() && t.ne[0] >= 6 {
                        let (d0, d1) = (t.ne[0] as usize, t.ne[1].max(1) as usize);
                        for row in [0usize, 1, d1 - 1] {
                            if (row + 1) * d0 <= n {
                                let r = &v[row * d0..(row + 1) * d0];
                                eprintln!("  row {row}: {:.4?} .. {:.4?}", &r[..3], &r[d0 - 3..]);
                            }
                        }
                    }
                }
                let op = cstr(sys::ggml_op_desc(t));
                eprintln!("dump {name:>24} {op:>14} {:?} sum = {sum:.6}", t.ne);
            }
            true
        }
        self.debug_dump = on;
        // SAFETY: plain function pointer, no user data.
        unsafe {
            sys::ggml_backend_sched_set_eval_callback(
                self.ptr.as_ptr(),
                if on { Some(cb) } else { None },
                std::ptr::null_mut(),
            )
        }
    }

    /// Frees the compute buffers and the input arena (the next [`Scheduler::alloc`]
    /// allocates them again, at the size its graph needs): for an idle engine, whose
    /// buffers were sized by its largest step (a long prompt's masks at depth).
    /// Graphs allocated before must not be computed after this.
    pub fn release_buffers(&mut self) -> Result<(), GgmlError> {
        let ptr = Self::create(&self.backends, self.capacity)?;
        // SAFETY: we own the old scheduler; the caller computes no graph it allocated.
        unsafe { sys::ggml_backend_sched_free(self.ptr.as_ptr()) };
        self.ptr = ptr;
        self.inputs.buf = None;
        let dump = self.debug_dump;
        self.set_debug_dump(dump);
        Ok(())
    }

    /// Bytes of the input arena (host memory for graph inputs; see `InputArena`).
    pub fn input_bytes(&self) -> usize {
        self.inputs.buf.as_ref().map_or(0, |b| b.size())
    }

    /// Total bytes of the scheduler's compute buffers.
    pub fn compute_buffer_bytes(&self) -> usize {
        self.backends
            .iter()
            // SAFETY: live scheduler and its backends.
            .map(|b| unsafe {
                sys::ggml_backend_sched_get_buffer_size(self.ptr.as_ptr(), b.ptr.as_ptr())
            })
            .sum()
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        // SAFETY: we own the scheduler; backends are dropped after it.
        unsafe { sys::ggml_backend_sched_free(self.ptr.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row-lookup probe takes weights of any rank: a 3-D table (Gemma 4
    /// vision's x and y position tables) aborted inside ggml_get_rows before.
    #[test]
    fn get_rows_probe_takes_3d_weights() {
        let ctx = Context::new(4, 0).unwrap();
        let cpu = Device::cpu();
        for shape in [&[16, 4][..], &[16, 4, 2], &[16, 4, 2, 3]] {
            let w = ctx.new_tensor(DType::F32, shape);
            assert!(cpu.supports_get_rows(w), "{shape:?}");
        }
    }

    /// A backend's library ignores parameters it does not know (the CPU backend
    /// the stream-priority request); a string that cannot cross into C is refused.
    #[test]
    fn backend_params_reach_the_library() {
        let b = Backend::with_params(Device::cpu(), HIGH_PRIORITY_STREAMS).unwrap();
        assert_eq!(b.device().kind(), DeviceKind::Cpu);
        assert!(matches!(
            Backend::with_params(Device::cpu(), "a\0b"),
            Err(GgmlError::BackendInit(_))
        ));
    }
}
