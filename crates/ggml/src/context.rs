//! Contexts, tensors, graph building and the ops the model graphs use.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use crate::{DType, GgmlError};

/// A ggml context: an arena that holds tensor metadata (never tensor data here:
/// all contexts are `no_alloc`, data lives in backend buffers).
pub struct Context {
    ptr: NonNull<sys::ggml_context>,
    // The arena memory, handed back to the pool on drop (after ggml_free).
    arena: Option<Arena>,
}

/// 64-byte aligned unit of arena memory (ggml wants at least 16).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

type Arena = Vec<Line>;

/// Arenas of dropped contexts, most recent last. A model step builds its graph in
/// a fresh context; taking the same arena back gives the same tensor addresses as
/// the previous step of that shape, and ggml's CUDA backend keys its CUDA-graph
/// cache on those addresses (node pointers and their contents): with a new
/// allocation per step it would re-capture, or never replay, the step's kernels.
static ARENAS: std::sync::Mutex<Vec<Arena>> = std::sync::Mutex::new(Vec::new());
/// Arenas kept for reuse at most (one per concurrently built graph is enough).
const MAX_POOLED_ARENAS: usize = 8;

fn take_arena(bytes: usize) -> Arena {
    let lines = bytes.div_ceil(64);
    let mut pool = ARENAS.lock().unwrap_or_else(|e| e.into_inner());
    // The most recently returned arena that fits, so alternating shapes each keep theirs.
    match pool
        .iter()
        .rposition(|a| a.len() >= lines && a.len() <= 2 * lines + 1024)
    {
        Some(i) => pool.remove(i),
        None => vec![Line([0; 64]); lines],
    }
}

fn give_arena(a: Arena) {
    let mut pool = ARENAS.lock().unwrap_or_else(|e| e.into_inner());
    pool.push(a);
    if pool.len() > MAX_POOLED_ARENAS {
        pool.remove(0);
    }
}

// SAFETY: a context is only used by one thread at a time (it is not Sync); moving it
// between threads is fine, ggml keeps no thread-local state for it.
unsafe impl Send for Context {}

impl Context {
    /// A context with room for `n_tensors` tensor descriptors and, if `graph_nodes > 0`,
    /// one graph of that many nodes.
    pub fn new(n_tensors: usize, graph_nodes: usize) -> Result<Context, GgmlError> {
        // SAFETY: pure size computations.
        let mut size = n_tensors * unsafe { sys::ggml_tensor_overhead() };
        if graph_nodes > 0 {
            size += unsafe { sys::ggml_graph_overhead_custom(graph_nodes, false) };
        }
        let mut arena = take_arena(size);
        let params = sys::ggml_init_params {
            mem_size: arena.len() * 64,
            mem_buffer: arena.as_mut_ptr().cast(),
            no_alloc: true,
        };
        // SAFETY: the arena is 64-byte aligned, `mem_size` bytes long, and outlives the
        // context (we free the context before returning the arena); null on failure.
        let ptr = unsafe { sys::ggml_init(params) };
        match NonNull::new(ptr) {
            Some(ptr) => Ok(Context {
                ptr,
                arena: Some(arena),
            }),
            None => {
                give_arena(arena);
                Err(GgmlError::ContextAlloc(size))
            }
        }
    }

    fn raw(&self) -> *mut sys::ggml_context {
        self.ptr.as_ptr()
    }

    pub(crate) fn raw_ptr(&self) -> *mut sys::ggml_context {
        self.ptr.as_ptr()
    }

    /// The context's tensors marked as graph inputs ([`Context::new_input`]).
    pub(crate) fn input_tensors(&self) -> Vec<Tensor<'_>> {
        let mut out = Vec::new();
        // SAFETY: walks the live context's tensor list; each pointer is a tensor of it.
        let mut t = unsafe { sys::ggml_get_first_tensor(self.raw()) };
        while let Some(p) = NonNull::new(t) {
            if unsafe { p.as_ref() }.flags & sys::GGML_TENSOR_FLAG_INPUT as i32 != 0 {
                out.push(self.wrap(p.as_ptr()));
            }
            t = unsafe { sys::ggml_get_next_tensor(self.raw(), p.as_ptr()) };
        }
        out
    }

    fn wrap(&self, t: *mut sys::ggml_tensor) -> Tensor<'_> {
        Tensor {
            ptr: NonNull::new(t).expect("ggml returned a null tensor (context full?)"),
            _ctx: PhantomData,
        }
    }

    /// Checks that the context still has room for `n` more tensors; ggml aborts otherwise.
    fn room(&self, n: usize) {
        // SAFETY: reads arena counters of a live context.
        let (used, size) = unsafe {
            (
                sys::ggml_used_mem(self.raw()),
                sys::ggml_get_mem_size(self.raw()),
            )
        };
        let need = n * unsafe { sys::ggml_tensor_overhead() };
        assert!(
            used + need <= size,
            "ggml context full: {used}+{need} > {size} bytes"
        );
    }

    /// A new tensor of `dtype` with dimensions `shape` (innermost first, 1–4 dims).
    pub fn new_tensor(&self, dtype: DType, shape: &[i64]) -> Tensor<'_> {
        assert!((1..=4).contains(&shape.len()), "tensor rank must be 1..=4");
        assert!(
            shape.iter().all(|&n| n > 0),
            "tensor dims must be positive: {shape:?}"
        );
        self.room(1);
        // SAFETY: arguments validated above; the context has room.
        let t = unsafe {
            sys::ggml_new_tensor(self.raw(), dtype.raw(), shape.len() as i32, shape.as_ptr())
        };
        self.wrap(t)
    }

    /// A new input tensor: allocated by the scheduler, filled with [`Tensor::write`].
    pub fn new_input(&self, name: &str, dtype: DType, shape: &[i64]) -> Tensor<'_> {
        let t = self.new_tensor(dtype, shape);
        t.set_name(name);
        // SAFETY: live tensor.
        unsafe { sys::ggml_set_input(t.raw()) };
        t
    }

    /// A new graph with room for `max_nodes` nodes.
    pub fn new_graph(&self, max_nodes: usize) -> Graph<'_> {
        // SAFETY: context sized for a graph by the caller (Context::new(_, graph_nodes)).
        let g = unsafe { sys::ggml_new_graph_custom(self.raw(), max_nodes, false) };
        Graph {
            ptr: NonNull::new(g).expect("ggml_new_graph_custom returned null"),
            _ctx: PhantomData,
        }
    }

    // ---- ops -------------------------------------------------------------------------

    fn op1(&self, f: impl FnOnce(*mut sys::ggml_context) -> *mut sys::ggml_tensor) -> Tensor<'_> {
        self.room(1);
        self.wrap(f(self.raw()))
    }

    /// Rows of `a` selected by the I32 index vector `idx` (dequantized to F32).
    pub fn get_rows<'a>(&'a self, a: Tensor<'a>, idx: Tensor<'a>) -> Tensor<'a> {
        assert!(idx.dtype() == DType::I32 || idx.dtype() == DType::I64);
        // SAFETY: live tensors; index type checked.
        self.op1(|c| unsafe { sys::ggml_get_rows(c, a.raw(), idx.raw()) })
    }

    /// Rows of the F16 tensor `a` selected by the I32 index vector `idx`, kept F16
    /// (half the bytes of [`Context::get_rows`], and no cast back). ggml's API types
    /// every get_rows result F32 and its CPU kernel always writes F32, but its CUDA
    /// kernel writes the result's type: use this only where the op runs on a GPU
    /// backend (`a` in GPU memory).
    pub fn get_rows_f16_on_gpu<'a>(&'a self, a: Tensor<'a>, idx: Tensor<'a>) -> Tensor<'a> {
        assert!(a.dtype() == DType::F16 && idx.dtype() == DType::I32);
        let t = self.get_rows(a, idx);
        // SAFETY: `t` is a fresh, unallocated result (no data, no views of it yet):
        // retyping it only changes the element size and the strides derived from it.
        unsafe {
            let r = &mut *t.raw();
            r.type_ = DType::F16.0 as _;
            r.nb[0] = 2;
            for d in 1..4 {
                r.nb[d] = r.nb[d - 1] * r.ne[d - 1] as usize;
            }
        }
        t
    }

    /// Writes the rows of `b` into `a` at the row indices `idx`; returns a view of `a`
    /// that depends on the write (read the updated `a` through it).
    pub fn set_rows<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>, idx: Tensor<'a>) -> Tensor<'a> {
        assert_eq!(a.ne()[0], b.ne()[0], "set_rows: row length mismatch");
        assert_eq!(b.ne()[1], idx.ne()[0], "set_rows: one index per row");
        // SAFETY: shapes checked.
        self.op1(|c| unsafe { sys::ggml_set_rows(c, a.raw(), b.raw(), idx.raw()) })
    }

    /// Matrix product `a^T b` in ggml's convention: `[k, m] x [k, n] -> [m, n]`.
    pub fn mul_mat<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        let (an, bn) = (a.ne(), b.ne());
        assert!(
            an[0] == bn[0] && bn[2] % an[2] == 0 && bn[3] % an[3] == 0,
            "mul_mat shape mismatch: {:?} x {:?} ({})",
            a.ne(),
            b.ne(),
            a.name()
        );
        // SAFETY: shapes checked above (ggml's own rule for mul_mat broadcasting).
        self.op1(|c| unsafe { sys::ggml_mul_mat(c, a.raw(), b.raw()) })
    }

    /// Outer-product sum `a b^T` in ggml's convention: `[m, k] x [n, k] -> [m, n]`,
    /// i.e. `out[i, j] = sum_t a[i, t] * b[j, t]`, per matrix of dims 2 and 3 (`b`'s
    /// may be a multiple of `a`'s). Unlike [`Context::mul_mat`] it reduces over `a`'s
    /// rows, so `a` can be a row-major V (F16 or F32) without a transposed copy.
    pub fn out_prod<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        let (an, bn) = (a.ne(), b.ne());
        assert!(
            an[1] == bn[1] && bn[2] % an[2] == 0 && bn[3] % an[3] == 0,
            "out_prod shape mismatch: {an:?} x {bn:?}"
        );
        assert!(
            a.nb()[0] <= a.nb()[1],
            "out_prod: `a` must not be transposed"
        );
        // SAFETY: shapes checked above (ggml's `ggml_can_out_prod`).
        self.op1(|c| unsafe { sys::ggml_out_prod(c, a.raw(), b.raw()) })
    }

    /// `softmax(a * scale + mask)` along dim 0; `mask` (F16 or F32, 0 or -inf) is
    /// `[a.ne0, >= a.ne1]` and broadcast over dims 2 and 3.
    pub fn soft_max_ext<'a>(&'a self, a: Tensor<'a>, mask: Tensor<'a>, scale: f32) -> Tensor<'a> {
        let (an, mn) = (a.ne(), mask.ne());
        assert!(
            mn[0] == an[0] && mn[1] >= an[1] && an[2] % mn[2] == 0 && an[3] % mn[3] == 0,
            "soft_max_ext: mask {mn:?} for {an:?}"
        );
        assert!(
            matches!(mask.dtype(), DType::F16 | DType::F32),
            "soft_max_ext: mask type"
        );
        // SAFETY: shapes and types checked above.
        self.op1(|c| unsafe { sys::ggml_soft_max_ext(c, a.raw(), mask.raw(), scale, 0.0) })
    }

    /// Adds per-head attention sinks (F32 `[n_head]`: one extra logit per head that
    /// takes part in the softmax's normalisation but has no value) to a
    /// [`Context::soft_max_ext`] node `kq` `[n_kv, n_q, n_head]`.
    pub fn soft_max_add_sinks<'a>(&'a self, kq: Tensor<'a>, sinks: Tensor<'a>) {
        assert!(
            sinks.dtype() == DType::F32 && sinks.ne()[0] == kq.ne()[2],
            "soft_max sinks {:?} for {:?}",
            sinks.ne(),
            kq.ne()
        );
        // SAFETY: kq is a soft_max node of this context; shapes checked.
        unsafe { sys::ggml_soft_max_add_sinks(kq.raw(), sinks.raw()) }
    }

    /// Attention sinks (F32 `[n_head]`) for a [`Context::flash_attn`] node `fa`
    /// (`[d_v, n_head, n_q]`); see [`Context::soft_max_add_sinks`].
    pub fn flash_attn_add_sinks<'a>(&'a self, fa: Tensor<'a>, sinks: Tensor<'a>) {
        assert!(
            sinks.dtype() == DType::F32 && sinks.ne()[0] == fa.ne()[1],
            "flash_attn sinks {:?} for {:?}",
            sinks.ne(),
            fa.ne()
        );
        // SAFETY: fa is a flash-attention node of this context; shapes checked.
        unsafe { sys::ggml_flash_attn_ext_add_sinks(fa.raw(), sinks.raw()) }
    }

    /// `a[i0, i1, i2] + b[i0, ids[i1, i2]]`: per selected expert, that expert's
    /// bias row (`a` `[n, k, n_t]`, `b` `[n, n_expert]` F32, `ids` `[k, n_t]` I32).
    pub fn add_id<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>, ids: Tensor<'a>) -> Tensor<'a> {
        let (an, bn, idn) = (a.ne(), b.ne(), ids.ne());
        assert!(
            an[0] == bn[0] && idn[0] == an[1] && idn[1] == an[2] && ids.dtype() == DType::I32,
            "add_id shapes {an:?} + {bn:?} by {idn:?}"
        );
        // SAFETY: shapes checked above.
        self.op1(|c| unsafe { sys::ggml_add_id(c, a.raw(), b.raw(), ids.raw()) })
    }

    /// GPT-OSS's clamped SwiGLU: `g = min(a, limit)`, `u = clamp(b, -limit, limit)`,
    /// `g * sigmoid(alpha * g) * (u + 1)`.
    pub fn swiglu_oai<'a>(
        &'a self,
        a: Tensor<'a>,
        b: Tensor<'a>,
        alpha: f32,
        limit: f32,
    ) -> Tensor<'a> {
        assert_eq!(a.ne(), b.ne(), "swiglu_oai: shape mismatch");
        // SAFETY: shapes checked.
        self.op1(|c| unsafe { sys::ggml_swiglu_oai(c, a.raw(), b.raw(), alpha, limit) })
    }

    fn check_repeat(a: Tensor<'_>, b: Tensor<'_>, op: &str) {
        // SAFETY: live tensors.
        assert!(
            unsafe { sys::ggml_can_repeat(b.raw(), a.raw()) },
            "{op}: {:?} does not broadcast to {:?}",
            b.ne(),
            a.ne()
        );
    }

    /// Element-wise `a + b` (`b` broadcast over `a`).
    pub fn add<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        Self::check_repeat(a, b, "add");
        // SAFETY: broadcast checked.
        self.op1(|c| unsafe { sys::ggml_add(c, a.raw(), b.raw()) })
    }

    /// Element-wise `a * b` (`b` broadcast over `a`).
    pub fn mul<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        Self::check_repeat(a, b, "mul");
        // SAFETY: broadcast checked.
        self.op1(|c| unsafe { sys::ggml_mul(c, a.raw(), b.raw()) })
    }

    /// `a * s`.
    pub fn scale<'a>(&'a self, a: Tensor<'a>, s: f32) -> Tensor<'a> {
        // SAFETY: live tensor.
        self.op1(|c| unsafe { sys::ggml_scale(c, a.raw(), s) })
    }

    /// RMS normalisation over the first dimension.
    pub fn rms_norm<'a>(&'a self, a: Tensor<'a>, eps: f32) -> Tensor<'a> {
        // SAFETY: live tensor.
        self.op1(|c| unsafe { sys::ggml_rms_norm(c, a.raw(), eps) })
    }

    /// Layer normalisation over the first dimension (zero mean, unit variance; no
    /// scale or shift).
    pub fn norm<'a>(&'a self, a: Tensor<'a>, eps: f32) -> Tensor<'a> {
        // SAFETY: live tensor.
        self.op1(|c| unsafe { sys::ggml_norm(c, a.raw(), eps) })
    }

    /// GELU, tanh approximation (PyTorch's `gelu_pytorch_tanh`).
    pub fn gelu<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: live tensor.
        self.op1(|c| unsafe { sys::ggml_gelu(c, a.raw()) })
    }

    /// 2-D convolution of `input` `[w, h, c_in, n]` by `kernel` `[kw, kh, c_in,
    /// c_out]` with strides `s`, zero padding `p` and dilation `d` (x, y): gives
    /// `[w_out, h_out, c_out, n]` (im2col then a matmul, in the kernel's type).
    pub fn conv_2d<'a>(
        &'a self,
        kernel: Tensor<'a>,
        input: Tensor<'a>,
        s: [i32; 2],
        p: [i32; 2],
        d: [i32; 2],
    ) -> Tensor<'a> {
        assert_eq!(
            kernel.ne()[2],
            input.ne()[2],
            "conv_2d: input channels {:?} / {:?}",
            kernel.ne(),
            input.ne()
        );
        assert!(
            s.iter().chain(&d).all(|&v| v > 0),
            "conv_2d: strides, dilations > 0"
        );
        // SAFETY: channel counts checked; ggml checks the rest.
        self.op1(|c| unsafe {
            sys::ggml_conv_2d(
                c,
                kernel.raw(),
                input.raw(),
                s[0],
                s[1],
                p[0],
                p[1],
                d[0],
                d[1],
            )
        })
    }

    /// `a` (F32) resampled to `ne` with bilinear interpolation, sample points
    /// on the corners of both grids (PyTorch's `align_corners=True`).
    pub fn interpolate_bilinear_corners<'a>(&'a self, a: Tensor<'a>, ne: [i64; 4]) -> Tensor<'a> {
        assert!(
            a.dtype() == DType::F32 && ne.iter().all(|&n| n > 0),
            "interpolate: F32, sizes > 0"
        );
        let mode = sys::GGML_SCALE_MODE_BILINEAR | sys::GGML_SCALE_FLAG_ALIGN_CORNERS;
        // SAFETY: live tensor; checked above.
        self.op1(|c| unsafe { sys::ggml_interpolate(c, a.raw(), ne[0], ne[1], ne[2], ne[3], mode) })
    }

    /// `silu(a) * b` (SwiGLU with separate gate and up tensors).
    pub fn swiglu_split<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        assert_eq!(a.ne(), b.ne(), "swiglu: shape mismatch");
        // SAFETY: shapes checked.
        self.op1(|c| unsafe { sys::ggml_swiglu_split(c, a.raw(), b.raw()) })
    }

    /// `gelu(a) * b` (GeGLU with separate gate and up tensors, tanh approximation).
    pub fn geglu_split<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        assert_eq!(a.ne(), b.ne(), "geglu: shape mismatch");
        // SAFETY: shapes checked.
        self.op1(|c| unsafe { sys::ggml_geglu_split(c, a.raw(), b.raw()) })
    }

    /// Rotary position embedding of `a` (`[head_dim, n_head, n_tokens]`) at the I32 positions `pos`.
    /// `freq_factors` (F32, `n_dims / 2`), when given, divides each rotated pair's
    /// frequency (Llama 3's `rope_freqs.weight`).
    pub fn rope<'a>(
        &'a self,
        a: Tensor<'a>,
        pos: Tensor<'a>,
        freq_factors: Option<Tensor<'a>>,
        p: &RopeParams,
    ) -> Tensor<'a> {
        assert_eq!(a.ne()[2], pos.ne()[0], "rope: one position per token");
        assert!(pos.dtype() == DType::I32);
        if let Some(f) = freq_factors {
            assert!(
                f.dtype() == DType::F32 && f.ne()[0] >= i64::from(p.n_dims / 2),
                "rope: freq factors {:?} for {} rotated dims",
                f.ne(),
                p.n_dims
            );
        }
        let factors = freq_factors.map_or(std::ptr::null_mut(), |f| f.raw());
        // SAFETY: shapes checked.
        self.op1(|c| unsafe {
            sys::ggml_rope_ext(
                c,
                a.raw(),
                pos.raw(),
                factors,
                p.n_dims,
                p.mode,
                p.n_ctx_orig,
                p.freq_base,
                p.freq_scale,
                p.ext_factor,
                p.attn_factor,
                p.beta_fast,
                p.beta_slow,
            )
        })
    }

    /// Same data, new shape (element count must match; `a` contiguous).
    pub fn reshape<'a>(&'a self, a: Tensor<'a>, shape: &[i64]) -> Tensor<'a> {
        assert_eq!(
            a.n_elements(),
            shape.iter().product::<i64>(),
            "reshape: element count"
        );
        assert!(a.is_contiguous(), "reshape of a non-contiguous tensor");
        // SAFETY: checked above.
        self.op1(|c| unsafe {
            match shape.len() {
                1 => sys::ggml_reshape_1d(c, a.raw(), shape[0]),
                2 => sys::ggml_reshape_2d(c, a.raw(), shape[0], shape[1]),
                3 => sys::ggml_reshape_3d(c, a.raw(), shape[0], shape[1], shape[2]),
                _ => sys::ggml_reshape_4d(c, a.raw(), shape[0], shape[1], shape[2], shape[3]),
            }
        })
    }

    /// A strided view into `a`: `shape` elements, byte strides `nb` (for dims 1..), at byte `offset`.
    pub fn view<'a>(
        &'a self,
        a: Tensor<'a>,
        shape: &[i64],
        nb: &[usize],
        offset: usize,
    ) -> Tensor<'a> {
        assert_eq!(nb.len() + 1, shape.len(), "view: one stride per outer dim");
        // The furthest byte the view touches must lie inside `a`.
        let row = a.dtype().row_size(shape[0]);
        let last = offset
            + row
            + shape[1..]
                .iter()
                .zip(nb)
                .map(|(&n, &s)| (n as usize - 1) * s)
                .sum::<usize>();
        assert!(
            last <= a.nbytes(),
            "view out of bounds: {last} > {}",
            a.nbytes()
        );
        // SAFETY: bounds checked above.
        self.op1(|c| unsafe {
            match shape.len() {
                1 => sys::ggml_view_1d(c, a.raw(), shape[0], offset),
                2 => sys::ggml_view_2d(c, a.raw(), shape[0], shape[1], nb[0], offset),
                3 => sys::ggml_view_3d(
                    c,
                    a.raw(),
                    shape[0],
                    shape[1],
                    shape[2],
                    nb[0],
                    nb[1],
                    offset,
                ),
                _ => sys::ggml_view_4d(
                    c,
                    a.raw(),
                    shape[0],
                    shape[1],
                    shape[2],
                    shape[3],
                    nb[0],
                    nb[1],
                    nb[2],
                    offset,
                ),
            }
        })
    }

    /// Permutes dimensions (ggml semantics: dim i of `a` goes to position `axes[i]`).
    pub fn permute<'a>(&'a self, a: Tensor<'a>, axes: [i32; 4]) -> Tensor<'a> {
        // SAFETY: ggml validates the permutation.
        self.op1(|c| unsafe { sys::ggml_permute(c, a.raw(), axes[0], axes[1], axes[2], axes[3]) })
    }

    /// A contiguous copy of `a`.
    pub fn cont<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: live tensor.
        self.op1(|c| unsafe { sys::ggml_cont(c, a.raw()) })
    }

    /// Copies `a` into `b` (same number of elements; converts the type when they
    /// differ). Returns a view of `b` that depends on the copy: expand it into the
    /// graph before anything that reads `b`.
    pub fn cpy<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        assert_eq!(a.n_elements(), b.n_elements(), "cpy: element counts differ");
        // SAFETY: live tensors; sizes checked above.
        self.op1(|c| unsafe { sys::ggml_cpy(c, a.raw(), b.raw()) })
    }

    /// `a` (F32, any strides) extended with `pad[d]` zeros at the end of each
    /// dimension `d`.
    pub fn pad<'a>(&'a self, a: Tensor<'a>, pad: [i32; 4]) -> Tensor<'a> {
        assert!(
            a.dtype() == DType::F32 && pad.iter().all(|&p| p >= 0),
            "pad: F32 and non-negative padding"
        );
        // SAFETY: live tensor; checked above.
        self.op1(|c| unsafe { sys::ggml_pad(c, a.raw(), pad[0], pad[1], pad[2], pad[3]) })
    }

    /// `a` and `b` joined along dimension `dim` (all other dimensions equal).
    pub fn concat<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>, dim: usize) -> Tensor<'a> {
        let (an, bn) = (a.ne(), b.ne());
        assert!(
            dim < 4 && a.dtype() == b.dtype(),
            "concat: bad dim or types"
        );
        assert!(
            (0..4).all(|d| d == dim || an[d] == bn[d]),
            "concat: shapes {an:?} / {bn:?}"
        );
        // SAFETY: shapes checked above.
        self.op1(|c| unsafe { sys::ggml_concat(c, a.raw(), b.raw(), dim as i32) })
    }

    /// The index of each row's largest element: `a` `[n, rows]` F32 gives `[rows]`
    /// I32. Ties and NaN follow the backend's kernel (the CPU's runs on one thread
    /// and keeps the last maximum; CUDA's keeps one of them); a row with no value
    /// above `-f32::MAX` gives -1 on CUDA.
    pub fn argmax<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        assert!(a.dtype() == DType::F32, "argmax: F32 input");
        // SAFETY: live tensor; type checked.
        self.op1(|c| unsafe { sys::ggml_argmax(c, a.raw()) })
    }

    /// `softmax(a)` along dim 0.
    pub fn soft_max<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: live tensor.
        self.op1(|c| unsafe { sys::ggml_soft_max(c, a.raw()) })
    }

    /// Element-wise `a / b` (`b` broadcast over `a`).
    pub fn div<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        Self::check_repeat(a, b, "div");
        // SAFETY: broadcast checked.
        self.op1(|c| unsafe { sys::ggml_div(c, a.raw(), b.raw()) })
    }

    /// Sums along dim 0: `[n, a, b, c]` gives `[1, a, b, c]`.
    pub fn sum_rows<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: live tensor.
        self.op1(|c| unsafe { sys::ggml_sum_rows(c, a.raw()) })
    }

    /// `a` clamped to `[min, max]`.
    pub fn clamp<'a>(&'a self, a: Tensor<'a>, min: f32, max: f32) -> Tensor<'a> {
        // SAFETY: live tensor.
        self.op1(|c| unsafe { sys::ggml_clamp(c, a.raw(), min, max) })
    }

    /// `a * s + b` in one op (`ggml_scale_bias`).
    pub fn scale_bias<'a>(&'a self, a: Tensor<'a>, s: f32, b: f32) -> Tensor<'a> {
        // SAFETY: live tensor.
        self.op1(|c| unsafe { sys::ggml_scale_bias(c, a.raw(), s, b) })
    }

    /// Element-wise `a - b` (`b` broadcast over `a`).
    pub fn sub<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        Self::check_repeat(a, b, "sub");
        // SAFETY: broadcast checked.
        self.op1(|c| unsafe { sys::ggml_sub(c, a.raw(), b.raw()) })
    }

    /// `gelu_quick(a) * b` (GeGLU with the sigmoid approximation `x * sigmoid(1.702 x)`).
    pub fn geglu_quick_split<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        assert_eq!(a.ne(), b.ne(), "geglu_quick: shape mismatch");
        // SAFETY: shapes checked.
        self.op1(|c| unsafe { sys::ggml_geglu_quick_split(c, a.raw(), b.raw()) })
    }

    /// `gelu_erf(a) * b` (GeGLU with the exact, erf-based GELU).
    pub fn geglu_erf_split<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        assert_eq!(a.ne(), b.ne(), "geglu_erf: shape mismatch");
        // SAFETY: shapes checked.
        self.op1(|c| unsafe { sys::ggml_geglu_erf_split(c, a.raw(), b.raw()) })
    }

    /// Average pooling over dims 0 and 1 of `a` (`[w, h, c, n]` F32) with a
    /// `k × k` kernel and stride `k`, no padding: `[w / k, h / k, c, n]`.
    pub fn pool_2d_avg<'a>(&'a self, a: Tensor<'a>, k: i32) -> Tensor<'a> {
        assert!(k > 0, "pool_2d: kernel > 0");
        // SAFETY: live tensor; kernel checked.
        self.op1(|c| unsafe {
            sys::ggml_pool_2d(c, a.raw(), sys::GGML_OP_POOL_AVG, k, k, k, k, 0.0, 0.0)
        })
    }

    /// Rotary embedding of dims `offset..offset + p.n_dims` of each head of `a`
    /// (`[head_dim, n_head, n_tokens]`), the other dims copied: [`Context::rope`]
    /// with `ggml_rope_set_offset` (not for the vision mode).
    pub fn rope_at<'a>(
        &'a self,
        a: Tensor<'a>,
        pos: Tensor<'a>,
        p: &RopeParams,
        offset: i32,
    ) -> Tensor<'a> {
        assert!(
            offset >= 0 && i64::from(offset + p.n_dims) <= a.ne()[0],
            "rope_at: dims {offset}..{} of a {}-wide head",
            offset + p.n_dims,
            a.ne()[0]
        );
        let t = self.rope(a, pos, None, p);
        if offset > 0 {
            // SAFETY: t is a rope node of a non-vision mode (ggml asserts both).
            unsafe { sys::ggml_rope_set_offset(t.raw(), offset) };
        }
        t
    }

    /// Element-wise logistic sigmoid.
    pub fn sigmoid<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: live tensor.
        self.op1(|c| unsafe { sys::ggml_sigmoid(c, a.raw()) })
    }

    /// Element-wise hyperbolic tangent.
    pub fn tanh<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: live tensor.
        self.op1(|c| unsafe { sys::ggml_tanh(c, a.raw()) })
    }

    /// `a` tiled to shape `ne` (each dimension a multiple of `a`'s).
    pub fn repeat_4d<'a>(&'a self, a: Tensor<'a>, ne: [i64; 4]) -> Tensor<'a> {
        // SAFETY: live tensor; ggml asserts the shapes tile.
        self.op1(|c| unsafe { sys::ggml_repeat_4d(c, a.raw(), ne[0], ne[1], ne[2], ne[3]) })
    }

    /// Element-wise SiLU, `x * sigmoid(x)`.
    pub fn silu<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: live tensor.
        self.op1(|c| unsafe { sys::ggml_silu(c, a.raw()) })
    }

    /// Element-wise softplus, `log(1 + e^x)` (`x` itself above 20).
    pub fn softplus<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: live tensor.
        self.op1(|c| unsafe { sys::ggml_softplus(c, a.raw()) })
    }

    /// Swaps dims 0 and 1 (a view).
    pub fn transpose<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: live tensor.
        self.op1(|c| unsafe { sys::ggml_transpose(c, a.raw()) })
    }

    /// The indices of the `k` largest elements of each row of `a` (`[n, rows]` F32),
    /// largest first: `[k, rows]` I32.
    pub fn argsort_top_k<'a>(&'a self, a: Tensor<'a>, k: usize) -> Tensor<'a> {
        assert!(
            a.dtype() == DType::F32 && k >= 1 && k as i64 <= a.ne()[0],
            "argsort_top_k: F32 rows of at least k = {k}"
        );
        // SAFETY: checked above.
        self.op1(|c| unsafe { sys::ggml_argsort_top_k(c, a.raw(), k as i32) })
    }

    /// Per-row expert matmul: `experts` `[k, m, n_expert]`, `b` `[k, n_b, n_tokens]`
    /// (`n_b` 1 or `ids.ne0`), `ids` `[n_used, n_tokens]` I32. Row `j` of token `t`
    /// multiplies by expert `ids[j, t]`; gives `[m, n_used, n_tokens]` F32.
    pub fn mul_mat_id<'a>(
        &'a self,
        experts: Tensor<'a>,
        b: Tensor<'a>,
        ids: Tensor<'a>,
    ) -> Tensor<'a> {
        let (an, bn, idn) = (experts.ne(), b.ne(), ids.ne());
        assert!(
            ids.dtype() == DType::I32
                && an[0] == bn[0]
                && bn[2] == idn[1]
                && (bn[1] == 1 || bn[1] == idn[0])
                && idn[0] <= an[2],
            "mul_mat_id shape mismatch: {an:?} x {bn:?} by {idn:?}"
        );
        // SAFETY: shapes checked above (ggml's asserts in ggml_mul_mat_id).
        self.op1(|c| unsafe { sys::ggml_mul_mat_id(c, experts.raw(), b.raw(), ids.raw()) })
    }

    /// Multi-section rotary embedding (`GGML_ROPE_TYPE_IMROPE` and friends, mode in
    /// `p.mode`): `a` `[head_dim, n_head, n_tokens]`, `pos` I32 of `4 * n_tokens`
    /// positions laid out section-major (all tokens' first position, then the second...).
    pub fn rope_multi<'a>(
        &'a self,
        a: Tensor<'a>,
        pos: Tensor<'a>,
        p: &RopeParams,
        sections: [i32; 4],
    ) -> Tensor<'a> {
        assert_eq!(
            a.ne()[2] * 4,
            pos.ne()[0],
            "rope_multi: four positions per token"
        );
        assert!(pos.dtype() == DType::I32);
        let mut sections = sections;
        // SAFETY: shapes checked; ggml copies the four sections into the op.
        self.op1(|c| unsafe {
            sys::ggml_rope_multi(
                c,
                a.raw(),
                pos.raw(),
                std::ptr::null_mut(),
                p.n_dims,
                sections.as_mut_ptr(),
                p.mode,
                p.n_ctx_orig,
                p.freq_base,
                p.freq_scale,
                p.ext_factor,
                p.attn_factor,
                p.beta_fast,
                p.beta_slow,
            )
        })
    }

    /// Depthwise causal convolution: `sx` `[d_conv - 1 + n_t, channels, n_seqs]`
    /// F32 (each channel's previous inputs, then this step's), `w` `[d_conv,
    /// channels]` F32. Gives `[channels, n_t, n_seqs]`.
    pub fn ssm_conv<'a>(&'a self, sx: Tensor<'a>, w: Tensor<'a>) -> Tensor<'a> {
        let (sn, wn) = (sx.ne(), w.ne());
        assert!(
            sx.dtype() == DType::F32 && w.dtype() == DType::F32 && sn[1] == wn[1] && sn[0] >= wn[0],
            "ssm_conv shapes {sn:?} / {wn:?}"
        );
        // SAFETY: checked above.
        self.op1(|c| unsafe { sys::ggml_ssm_conv(c, sx.raw(), w.raw()) })
    }

    /// Gated delta rule over a chunk of tokens per sequence (the recurrence of
    /// gated-DeltaNet linear attention): `q`, `k` `[s, h_k, n_t, n_seqs]`, `v` `[s,
    /// h_v, n_t, n_seqs]` (rows contiguous), `g` (log decay) and `beta` `[1, h_v,
    /// n_t, n_seqs]`, `state` `[s, s, h_v, n_seqs]`, all F32. Queries are scaled by
    /// `1/sqrt(s)` inside. Gives F32 `[s * h_v, n_t * n_seqs + snapshots * s *
    /// n_seqs]`: the outputs, then `snapshots` states per sequence, most recent first
    /// (snapshot `j` is the state `j` tokens before the chunk's end; the final state
    /// is snapshot 0), snapshot-major: snapshot `j` of sequence `i` is the state at
    /// index `j * n_seqs + i`.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_delta_net<'a>(
        &'a self,
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        g: Tensor<'a>,
        beta: Tensor<'a>,
        state: Tensor<'a>,
        snapshots: usize,
    ) -> Tensor<'a> {
        let (qn, vn, sn) = (q.ne(), v.ne(), state.ne());
        assert!(
            (1..=vn[2].max(1) as usize).contains(&snapshots),
            "gated_delta_net: {snapshots} snapshots of a {}-token chunk",
            vn[2]
        );
        assert!(
            qn == k.ne()
                && qn[0] == vn[0]
                && vn[1] % qn[1] == 0
                && qn[2] == vn[2]
                && qn[3] == vn[3]
                && sn == [vn[0], vn[0], vn[1], vn[3]]
                && g.ne() == [1, vn[1], vn[2], vn[3]]
                && beta.ne() == [1, vn[1], vn[2], vn[3]],
            "gated_delta_net shapes q {qn:?} v {vn:?} state {sn:?} g {:?} beta {:?}",
            g.ne(),
            beta.ne()
        );
        // SAFETY: shapes checked above (ggml asserts the rest: F32, contiguity).
        self.op1(|c| unsafe {
            sys::ggml_gated_delta_net(
                c,
                q.raw(),
                k.raw(),
                v.raw(),
                g.raw(),
                beta.raw(),
                state.raw(),
                snapshots as i64,
            )
        })
    }

    /// `a` converted to `dtype`.
    pub fn cast<'a>(&'a self, a: Tensor<'a>, dtype: DType) -> Tensor<'a> {
        // SAFETY: live tensor.
        self.op1(|c| unsafe { sys::ggml_cast(c, a.raw(), dtype.raw()) })
    }

    /// Fused attention: `q [d, n_q, n_head]`, `k`/`v` `[d, n_kv, n_head_kv]` (F16), `mask`
    /// `[n_kv, n_q]` F16 (0 or -inf). Returns `[d_v, n_head, n_q]`. Asks for F32
    /// precision; ggml's CPU kernels for few query rows still accumulate an F16 V
    /// in F16 (about 2e-4 error per output).
    pub fn flash_attn<'a>(
        &'a self,
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        mask: Tensor<'a>,
        scale: f32,
    ) -> Tensor<'a> {
        let (qn, kn, vn, mn) = (q.ne(), k.ne(), v.ne(), mask.ne());
        assert_eq!(qn[0], kn[0], "flash_attn: q/k head dim");
        assert_eq!(kn[1], vn[1], "flash_attn: k/v length");
        assert_eq!(qn[2] % kn[2], 0, "flash_attn: n_head % n_head_kv");
        assert!(
            mn[0] == kn[1] && mn[1] >= qn[1],
            "flash_attn: mask shape {mn:?}"
        );
        assert!(mask.dtype() == DType::F16, "flash_attn: mask must be F16");
        // SAFETY: shapes checked above.
        let t = self.op1(|c| unsafe {
            sys::ggml_flash_attn_ext(c, q.raw(), k.raw(), v.raw(), mask.raw(), scale, 0.0, 0.0)
        });
        // SAFETY: t is a flash-attention node.
        unsafe { sys::ggml_flash_attn_ext_set_prec(t.raw(), sys::GGML_PREC_F32) };
        t
    }
}

impl Context {
    /// Fused attention of every query over every key, no mask: `q [d, n_q,
    /// n_head]` F32, `k`/`v` `[d, n_kv, n_head]` F16. Returns `[d, n_head, n_q]`.
    pub fn flash_attn_unmasked<'a>(
        &'a self,
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        scale: f32,
    ) -> Tensor<'a> {
        let (qn, kn, vn) = (q.ne(), k.ne(), v.ne());
        assert_eq!(qn[0], kn[0], "flash_attn: q/k head dim");
        assert_eq!(kn[1], vn[1], "flash_attn: k/v length");
        assert_eq!(qn[2] % kn[2], 0, "flash_attn: n_head % n_head_kv");
        // SAFETY: shapes checked above; a null mask is allowed.
        let t = self.op1(|c| unsafe {
            sys::ggml_flash_attn_ext(
                c,
                q.raw(),
                k.raw(),
                v.raw(),
                std::ptr::null_mut(),
                scale,
                0.0,
                0.0,
            )
        });
        // SAFETY: t is a flash-attention node.
        unsafe { sys::ggml_flash_attn_ext_set_prec(t.raw(), sys::GGML_PREC_F32) };
        t
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: we own the context; tensors borrowing it are gone (lifetimes). ggml
        // does not free a caller-provided arena.
        unsafe { sys::ggml_free(self.raw()) }
        if let Some(a) = self.arena.take() {
            give_arena(a);
        }
    }
}

/// Rotary embedding parameters (`ggml_rope_ext`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeParams {
    /// Number of rotated dimensions per head.
    pub n_dims: i32,
    /// ggml rope mode: 0 = normal (GPT-J style pairs), 2 = NeoX (halves).
    pub mode: i32,
    /// Trained context length (for YaRN).
    pub n_ctx_orig: i32,
    /// Base frequency.
    pub freq_base: f32,
    /// Linear position scale (1 / scaling factor).
    pub freq_scale: f32,
    /// YaRN extrapolation mix (0 = off).
    pub ext_factor: f32,
    /// Magnitude scale.
    pub attn_factor: f32,
    /// YaRN low correction dim.
    pub beta_fast: f32,
    /// YaRN high correction dim.
    pub beta_slow: f32,
}

/// A tensor descriptor living in a [`Context`]. Cheap to copy.
#[derive(Clone, Copy)]
pub struct Tensor<'ctx> {
    ptr: NonNull<sys::ggml_tensor>,
    _ctx: PhantomData<&'ctx Context>,
}

impl<'ctx> Tensor<'ctx> {
    pub(crate) fn raw(&self) -> *mut sys::ggml_tensor {
        self.ptr.as_ptr()
    }

    fn get(&self) -> &sys::ggml_tensor {
        // SAFETY: the tensor lives as long as its context, which outlives 'ctx.
        unsafe { self.ptr.as_ref() }
    }

    /// Dimensions, innermost first.
    pub fn ne(&self) -> [i64; 4] {
        self.get().ne
    }

    /// Byte strides.
    pub fn nb(&self) -> [usize; 4] {
        self.get().nb
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        DType(self.get().type_)
    }

    /// Total number of elements.
    pub fn n_elements(&self) -> i64 {
        self.ne().iter().product()
    }

    /// Size of the tensor's data in bytes.
    pub fn nbytes(&self) -> usize {
        // SAFETY: live tensor.
        unsafe { sys::ggml_nbytes(self.raw()) }
    }

    /// Whether the data is laid out contiguously.
    pub fn is_contiguous(&self) -> bool {
        // SAFETY: live tensor.
        unsafe { sys::ggml_is_contiguous(self.raw()) }
    }

    /// The tensor's name.
    pub fn name(&self) -> String {
        // SAFETY: ggml keeps a NUL-terminated name in a fixed array.
        unsafe { CStr::from_ptr(self.get().name.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    /// Sets the tensor's name (truncated to ggml's 63 bytes).
    pub fn set_name(&self, name: &str) {
        let mut bytes: Vec<u8> = name.bytes().filter(|&b| b != 0).take(63).collect();
        bytes.push(0);
        // SAFETY: NUL-terminated buffer; ggml copies it.
        unsafe { sys::ggml_set_name(self.raw(), bytes.as_ptr().cast()) };
    }

    /// Marks the tensor as a graph output (its data survives graph computation).
    pub fn set_output(&self) {
        // SAFETY: live tensor.
        unsafe { sys::ggml_set_output(self.raw()) }
    }

    /// Whether backend memory has been assigned to the tensor.
    pub fn is_allocated(&self) -> bool {
        !self.get().buffer.is_null() && !self.get().data.is_null()
    }

    fn check_io(&self, offset: usize, len: usize) -> Result<(), GgmlError> {
        let err = |what: String| GgmlError::TensorData {
            name: self.name(),
            what,
        };
        if !self.is_allocated() {
            return Err(err("not allocated".into()));
        }
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.nbytes())
        {
            return Err(err(format!(
                "range {offset}+{len} exceeds {} bytes",
                self.nbytes()
            )));
        }
        Ok(())
    }

    /// Copies `data` into the tensor's memory at byte `offset` (any backend).
    pub fn write_bytes(&self, offset: usize, data: &[u8]) -> Result<(), GgmlError> {
        self.check_io(offset, data.len())?;
        // SAFETY: allocated tensor; range checked.
        unsafe {
            sys::ggml_backend_tensor_set(self.raw(), data.as_ptr().cast(), offset, data.len())
        };
        Ok(())
    }

    /// Zeroes `len` bytes of the tensor's memory from byte `offset`, on its backend
    /// (no host buffer is sent to a device).
    pub fn zero_bytes(&self, offset: usize, len: usize) -> Result<(), GgmlError> {
        self.check_io(offset, len)?;
        // SAFETY: allocated tensor; range checked.
        unsafe { sys::ggml_backend_tensor_memset(self.raw(), 0, offset, len) };
        Ok(())
    }

    /// Copies `len` bytes of the tensor's memory from byte `from` to byte `to`, on
    /// the tensor's own backend: a device tensor's bytes never pass through host
    /// memory (a hybrid model's state checkpoint is tens of MB per copy). The ranges
    /// must not overlap.
    pub fn copy_within(&self, from: usize, to: usize, len: usize) -> Result<(), GgmlError> {
        self.check_io(from, len)?;
        self.check_io(to, len)?;
        if from.max(to) < from.min(to) + len {
            return Err(GgmlError::TensorData {
                name: self.name(),
                what: format!("overlapping copy {from} -> {to} of {len} bytes"),
            });
        }
        if len == 0 {
            return Ok(());
        }
        // Two byte tensors over the ranges, placed in the tensor's buffer, copied by
        // the buffer's own copy (a device-to-device copy on a GPU, memcpy on the CPU).
        let ctx = Context::new(2, 0)?;
        let (buffer, base) = (self.get().buffer, self.get().data.cast::<u8>());
        let place = |offset: usize| -> Result<*mut sys::ggml_tensor, GgmlError> {
            // SAFETY: live no-alloc context with room for two descriptors.
            let t = unsafe { sys::ggml_new_tensor_1d(ctx.raw(), sys::GGML_TYPE_I8, len as i64) };
            // SAFETY: `base + offset .. + len` lies inside this allocated tensor, hence
            // inside its buffer (ranges checked above); I8 needs no padding.
            let status =
                unsafe { sys::ggml_backend_tensor_alloc(buffer, t, base.add(offset).cast()) };
            match status == sys::GGML_STATUS_SUCCESS {
                true => Ok(t),
                false => Err(GgmlError::TensorData {
                    name: self.name(),
                    what: format!("cannot place a copy view at byte {offset} (status {status})"),
                }),
            }
        };
        let (src, dst) = (place(from)?, place(to)?);
        // SAFETY: both views are allocated in the same buffer, same layout.
        unsafe { sys::ggml_backend_tensor_copy(src, dst) };
        Ok(())
    }

    /// Copies `out.len()` bytes of the tensor's memory from byte `offset` into `out`
    /// (any backend).
    pub fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<(), GgmlError> {
        self.check_io(offset, out.len())?;
        // SAFETY: allocated tensor; range checked; out is writable for its length.
        unsafe {
            sys::ggml_backend_tensor_get(self.raw(), out.as_mut_ptr().cast(), offset, out.len())
        };
        Ok(())
    }

    /// Copies a slice of plain values (i32, i64, f32, u16 f16 bits) into the tensor from its start.
    pub fn write<T: Pod>(&self, data: &[T]) -> Result<(), GgmlError> {
        // SAFETY: T is a plain-old-data type (sealed trait), so its bytes are initialised.
        let bytes = unsafe {
            std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data))
        };
        self.write_bytes(0, bytes)
    }

    /// Reads the tensor's I32 data from its start into `out`.
    pub fn read_i32(&self, out: &mut [i32]) -> Result<(), GgmlError> {
        if self.dtype() != DType::I32 {
            return Err(GgmlError::TensorData {
                name: self.name(),
                what: "not I32".into(),
            });
        }
        let len = out.len() * 4;
        self.check_io(0, len)?;
        // SAFETY: allocated tensor; range checked; out is len bytes of writable i32s.
        unsafe { sys::ggml_backend_tensor_get(self.raw(), out.as_mut_ptr().cast(), 0, len) };
        Ok(())
    }

    /// Reads the tensor's F32 data starting at element `offset` into `out`.
    pub fn read_f32(&self, offset: usize, out: &mut [f32]) -> Result<(), GgmlError> {
        if self.dtype() != DType::F32 {
            return Err(GgmlError::TensorData {
                name: self.name(),
                what: "not F32".into(),
            });
        }
        let (off, len) = (offset * 4, out.len() * 4);
        self.check_io(off, len)?;
        // SAFETY: allocated tensor; range checked; out is len bytes of writable f32s.
        unsafe { sys::ggml_backend_tensor_get(self.raw(), out.as_mut_ptr().cast(), off, len) };
        Ok(())
    }
}

/// Plain values that can be copied byte-wise into tensors.
pub trait Pod: Copy + sealed::Sealed {}
impl Pod for f32 {}
impl Pod for i32 {}
impl Pod for i64 {}
impl Pod for u16 {}
impl Pod for u8 {}
mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
    impl Sealed for u16 {}
    impl Sealed for u8 {}
}

/// A computation graph built in a [`Context`].
pub struct Graph<'ctx> {
    ptr: NonNull<sys::ggml_cgraph>,
    _ctx: PhantomData<&'ctx Context>,
}

impl<'ctx> Graph<'ctx> {
    pub(crate) fn raw(&self) -> *mut sys::ggml_cgraph {
        self.ptr.as_ptr()
    }

    /// Adds `t` and everything it depends on to the graph, in dependency order.
    pub fn expand(&mut self, t: Tensor<'ctx>) {
        // SAFETY: live graph and tensor of the same (or an outliving) context.
        unsafe { sys::ggml_build_forward_expand(self.raw(), t.raw()) }
    }

    /// Number of nodes in the graph.
    pub fn n_nodes(&self) -> usize {
        // SAFETY: live graph.
        unsafe { sys::ggml_graph_n_nodes(self.raw()) as usize }
    }
}

/// An owned set of long-lived tensors (model weights, KV cache): a context holding
/// their descriptors plus the buffers holding their data. Tensors are addressed by
/// index and borrowed from the store, so they can never outlive it.
pub struct TensorStore {
    // Field order matters for drop: buffers may be freed before or after the context,
    // but the tensors must not be used once either is gone (guaranteed by borrowing).
    ctx: Context,
    tensors: Vec<NonNull<sys::ggml_tensor>>,
    names: std::collections::HashMap<String, usize>,
    buffers: Vec<crate::Buffer>,
}

// SAFETY: the raw tensor pointers point into `ctx`, which moves with the store.
unsafe impl Send for TensorStore {}
// SAFETY: shared access only reads descriptors; data writes go through ggml backend calls
// that the engine serialises on its own thread.
unsafe impl Sync for TensorStore {}

impl TensorStore {
    /// A store with room for `capacity` tensors.
    pub fn new(capacity: usize) -> Result<TensorStore, GgmlError> {
        Ok(TensorStore {
            ctx: Context::new(capacity, 0)?,
            tensors: Vec::with_capacity(capacity),
            names: Default::default(),
            buffers: Vec::new(),
        })
    }

    /// Adds an unallocated tensor named `name`; returns its index.
    pub fn add(&mut self, name: &str, dtype: DType, shape: &[i64]) -> usize {
        let t = self.ctx.new_tensor(dtype, shape);
        t.set_name(name);
        let ptr = t.ptr;
        let id = self.tensors.len();
        self.tensors.push(ptr);
        self.names.insert(name.to_string(), id);
        id
    }

    /// The tensor at `id`.
    pub fn get(&self, id: usize) -> Tensor<'_> {
        Tensor {
            ptr: self.tensors[id],
            _ctx: PhantomData,
        }
    }

    /// Index of the tensor named `name`.
    pub fn id(&self, name: &str) -> Option<usize> {
        self.names.get(name).copied()
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Takes ownership of a buffer that holds some of the store's tensors.
    pub fn keep_buffer(&mut self, b: crate::Buffer) {
        self.buffers.push(b);
    }

    /// The buffers holding the store's data.
    pub fn buffers(&self) -> &[crate::Buffer] {
        &self.buffers
    }
}

/// A graph kept, with the context holding its tensors, across model steps of the
/// same shape: they skip building the graph and planning its memory again
/// (llama.cpp reuses its graphs the same way), and ggml's CUDA backend sees the
/// very same nodes, so it replays its captured CUDA graph. It owns what its nodes
/// read outside its context (weights, KV caches), so they live as long as it does.
pub struct KeptGraph {
    graph: NonNull<sys::ggml_cgraph>,
    /// Tensors of `ctx` the caller addresses later (inputs, outputs), by index.
    tensors: Vec<NonNull<sys::ggml_tensor>>,
    // Holds `graph` and `tensors`.
    ctx: Context,
    // What the graph reads besides its own tensors (boxed: its address is stable).
    _deps: Box<dyn std::any::Any + Send + Sync>,
}

// SAFETY: like `Context`: used by one thread at a time, moved freely; `deps` is
// Send + Sync.
unsafe impl Send for KeptGraph {}

impl KeptGraph {
    /// Keeps `ctx` with the graph that `build` makes in it from `deps` (the owners of
    /// every outside tensor the graph uses, e.g. `Arc`s of a model and a KV cache)
    /// and the tensors it lists (addressed later by their index in that list).
    /// `build` may only use tensors of the context and of `deps` (its lifetime
    /// bound sees to that), and may return anything else that borrows neither.
    pub fn build<D, T, E>(
        ctx: Context,
        deps: D,
        build: impl for<'c> FnOnce(&'c Context, &'c D) -> Result<(Graph<'c>, Vec<Tensor<'c>>, T), E>,
    ) -> Result<(KeptGraph, T), E>
    where
        D: Send + Sync + 'static,
    {
        let deps = Box::new(deps);
        let (graph, tensors, out) = build(&ctx, &deps)?;
        let (graph, tensors) = (graph.ptr, tensors.iter().map(|t| t.ptr).collect());
        Ok((
            KeptGraph {
                graph,
                tensors,
                ctx,
                _deps: deps,
            },
            out,
        ))
    }

    /// The context the graph was built in.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The kept graph.
    pub fn graph(&self) -> Graph<'_> {
        Graph {
            ptr: self.graph,
            _ctx: PhantomData,
        }
    }

    /// The `i`-th kept tensor (panics if there are not that many).
    pub fn tensor(&self, i: usize) -> Tensor<'_> {
        Tensor {
            ptr: self.tensors[i],
            _ctx: PhantomData,
        }
    }
}
