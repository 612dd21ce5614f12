//! Model architectures as ggml graphs, one file per architecture under `arch/`.
//!
//! A [`Model`] is loaded once from a GGUF file (weights placed on a device) and is
//! immutable afterwards. Each engine step calls [`Model::forward`] with a
//! [`StepBatch`]: a flat list of tokens from any number of sequences, with their
//! positions, the KV cells their keys/values go to and the attention mask saying
//! which cells each token sees. It returns logits only for the rows asked for.

mod arch;
mod attn;
pub mod hparams;
pub mod kv;
mod layers;
pub mod weights;

use std::path::Path;
use std::sync::Arc;

use tempo9_ggml::{
    Backend, Context, DType, Device, DeviceKind, GgmlError, KeptGraph, Scheduler, Tensor,
};
use tempo9_gguf::{GgufError, GgufFile};

pub use attn::MATMUL_DECODE_ABOVE;
pub use hparams::{Arch, HParams};
pub use kv::{KvStore, MaskBuilder};
use layers::{AttnInputs, Builder, Inputs, SeqInputs, StridedInputs};
use weights::{Offload, SpecList, Weights};

/// Errors from loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The GGUF file is invalid.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A ggml call failed.
    #[error(transparent)]
    Ggml(#[from] GgmlError),
    /// The architecture is not implemented.
    #[error("unsupported model architecture '{0}' (supported: llama, qwen2, gemma3)")]
    UnsupportedArch(String),
    /// A required metadata key is missing.
    #[error("missing metadata key {0}")]
    MissingKey(String),
    /// A required tensor is missing.
    #[error("missing tensor {0}")]
    MissingTensor(String),
    /// A tensor has the wrong shape or size.
    #[error("tensor {name} has shape {have:?}, expected {want:?}")]
    TensorShape {
        /// Tensor name.
        name: String,
        /// Expected dims.
        want: Vec<usize>,
        /// Dims in the file.
        have: Vec<u64>,
    },
    /// Inconsistent hyper-parameters.
    #[error("invalid hyper-parameters: {0}")]
    BadHParams(String),
    /// A feature of the file is not supported.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The step batch is malformed.
    #[error("invalid batch: {0}")]
    BadBatch(String),
}

/// One forward step over tokens of one or more sequences.
///
/// Tokens are flattened sequence by sequence; each sequence attends only to its own
/// KV window (`SeqSpan`), so its numbers do not depend on what else is in the step.
#[derive(Debug, Clone, Default)]
pub struct StepBatch {
    /// Token ids, flattened over sequences.
    pub tokens: Vec<u32>,
    /// Position of each token in its sequence.
    pub positions: Vec<i32>,
    /// KV cell each token's keys and values are written to.
    pub kv_slots: Vec<i64>,
    /// The sequences of the step, in token order.
    pub seqs: Vec<SeqSpan>,
    /// Token rows whose logits are returned, in this order.
    pub output_rows: Vec<i32>,
    /// Batch-invariant numbers: on the CPU, a lone decode row of a weight type that
    /// ggml multiplies with tinyBLAS from two rows on is multiplied as two rows, so
    /// it rounds exactly as it would batched with other decode rows. Costs up to
    /// twice the matmul work of a lone decode row (those types are common on AVX2,
    /// where ggml repacks none of Q5_0/Q8_0); off, a lone row takes ggml's dot
    /// products as llama.cpp's own decode does.
    pub batch_invariant: bool,
}

/// A run of consecutive KV cells: `start..start + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CellRun {
    /// First cell.
    pub start: usize,
    /// Number of cells.
    pub len: usize,
}

/// One sequence's part of a [`StepBatch`].
///
/// The sequence attends over a window of KV cells made of `window` runs laid end to
/// end (a paged cache gives one run per stretch of consecutive pages). A window of
/// one run is read in place; several runs are first copied into one contiguous
/// window, so the attention arithmetic is the same wherever the pages lie.
#[derive(Debug, Clone, Default)]
pub struct SeqSpan {
    /// First token row of the sequence in the batch.
    pub row_start: usize,
    /// Number of token rows.
    pub n_rows: usize,
    /// The attention window: cell runs, in window order.
    pub window: Vec<CellRun>,
    /// Full-attention mask, `[n_kv, n_rows]` F16 bits (see [`MaskBuilder`]), where
    /// `n_kv` is the window's total length.
    pub mask: Vec<u16>,
    /// Sliding-window mask of the same shape, for models with sliding-window layers.
    pub mask_swa: Option<Vec<u16>>,
    /// The rows are a chunk of a prompt that ggml's CPU flash attention computes
    /// with its tiled kernel when computed from scratch (prompts of a full tile,
    /// 64 tokens, or more): a shorter chunk of it (after a prefix-cache hit) is
    /// padded to a full tile of query rows, so its rows round the same way.
    pub tiled_prompt: bool,
}

impl SeqSpan {
    /// Cells in the attention window.
    pub fn n_kv(&self) -> usize {
        self.window.iter().map(|r| r.len).sum()
    }
}

enum Graphs {
    Llama(arch::llama::Llama),
    Gemma3(arch::gemma3::Gemma3),
}

/// Compute resources of one executor of steps: the backends and the scheduler that
/// splits graphs between them. Owned by the engine thread.
pub struct Executor {
    sched: Scheduler,
    /// The last step's graph, allocated by `sched`, for the next step of its shape.
    kept: Option<StepGraph>,
    /// Step graphs built so far.
    built: u64,
}

/// Everything a step's graph depends on besides its input values: a step of an
/// equal shape computes on the same graph with new inputs.
#[derive(Debug, PartialEq, Eq)]
struct StepShape {
    /// Addresses of the model and KV store (alive: the kept graph owns them).
    model: usize,
    kv: usize,
    n_tokens: usize,
    n_out: usize,
    /// The graph ends in an argmax (greedy tokens) instead of logits.
    greedy: bool,
    /// Each sequence's (first row, rows): the matmul row groups.
    seqs: Vec<(usize, usize)>,
    ops: Vec<OpShape>,
    /// [`StepBatch::batch_invariant`].
    invariant: bool,
}

/// What an attention op bakes into the graph: its rows and the KV cells it views.
#[derive(Debug, PartialEq, Eq)]
struct OpShape {
    row_start: usize,
    n_rows: usize,
    fa_rows: usize,
    runs: Vec<CellRun>,
    swa: bool,
    /// (stride, regions, rows) of a strided op.
    strided: Option<(usize, usize, usize)>,
    matmul: bool,
}

impl StepShape {
    fn of(
        model: &Model,
        kv: &KvStore,
        b: &StepBatch,
        ops: &[attn::AttnOp<'_>],
        greedy: bool,
    ) -> StepShape {
        StepShape {
            model: model as *const Model as usize,
            kv: kv as *const KvStore as usize,
            n_tokens: b.tokens.len(),
            n_out: b.output_rows.len(),
            greedy,
            invariant: b.batch_invariant,
            seqs: b.seqs.iter().map(|s| (s.row_start, s.n_rows)).collect(),
            ops: ops
                .iter()
                .map(|op| OpShape {
                    row_start: op.row_start,
                    n_rows: op.n_rows,
                    fa_rows: op.fa_rows,
                    runs: op.runs.clone(),
                    swa: op.mask_swa.is_some(),
                    strided: op
                        .strided
                        .as_ref()
                        .map(|st| (st.stride, st.q_rows.len(), st.regions.len())),
                    matmul: op.matmul,
                })
                .collect(),
        }
    }
}

/// A built and allocated step graph with the indices of its kept tensors.
struct StepGraph {
    shape: StepShape,
    graph: KeptGraph,
    ins: InputIds,
}

/// Indices of one attention op's inputs.
struct AttnIds {
    mask: usize,
    mask_swa: Option<usize>,
    /// A strided op's (q_rows, regions).
    strided: Option<(usize, usize)>,
    /// A matmul op's window cells.
    cells: Option<usize>,
}

/// Adds `t` to the tensors a step graph keeps; returns its index.
fn kept<'c>(keep: &mut Vec<Tensor<'c>>, t: Tensor<'c>) -> usize {
    keep.push(t);
    keep.len() - 1
}

/// Indices (into [`KeptGraph::tensor`]) of a step graph's inputs and output.
struct InputIds {
    tokens: usize,
    pos: usize,
    slots: usize,
    out_ids: usize,
    /// The logits, or in a greedy graph the token ids.
    out: usize,
    attn: Vec<AttnIds>,
    /// Window row indices with their values.
    window_rows: Vec<(usize, Vec<i64>)>,
}

impl Executor {
    /// An executor for `device` (plus the CPU for anything the device cannot run).
    pub fn new(device: Device, threads: usize) -> Result<Executor, ModelError> {
        let mut backends = Vec::new();
        if device.kind() != DeviceKind::Cpu {
            backends.push(Backend::new(device)?);
        }
        let cpu = Backend::new(Device::cpu())?;
        cpu.set_threads(threads);
        backends.push(cpu);
        let mut sched = Scheduler::new(backends, INITIAL_SCHED_SIZE)?;
        // TEMPO9_DUMP_TENSORS=1 prints every node's sum, to compare with llama-eval-callback.
        sched.set_debug_dump(std::env::var_os("TEMPO9_DUMP_TENSORS").is_some());
        Ok(Executor {
            sched,
            kept: None,
            built: 0,
        })
    }

    /// Step graphs built so far (a step of the previous step's shape reuses its graph).
    pub fn graphs_built(&self) -> u64 {
        self.built
    }

    /// Bytes of the scheduler's compute buffers (grow with the largest step so far).
    pub fn compute_bytes(&self) -> usize {
        self.sched.compute_buffer_bytes()
    }
}

/// Graph size limit: per-sequence attention makes graphs grow with the number of
/// sequences in a step (≈ 30 layers × 64 sequences × 20 ops).
const MAX_NODES: usize = 1 << 17;

/// The scheduler's first capacity (nodes plus leafs): a decode step of one sequence
/// of a 32-layer model fits; larger steps grow it (see `Scheduler::reserve`).
const INITIAL_SCHED_SIZE: usize = 1 << 13;

/// Options for loading a model.
pub struct LoadOptions<'p> {
    /// Device the weights and graphs go to.
    pub device: Device,
    /// Called with (bytes done, bytes total) while weights load.
    pub progress: Option<&'p mut dyn FnMut(u64, u64)>,
    /// Copy CPU matmul weights into ggml's repacked layouts (faster; costs RAM).
    pub repack: bool,
    /// Which layers a GPU `device` gets (their weights and KV cells); the rest stay
    /// on the CPU. Ignored when `device` is the CPU.
    pub offload: Offload,
}

impl LoadOptions<'_> {
    /// Defaults for `device`: repacking on, no progress callback.
    pub fn new(device: Device) -> Self {
        LoadOptions {
            device,
            progress: None,
            repack: true,
            offload: Offload::All,
        }
    }
}

/// A loaded model: hyper-parameters, weights on a device, and its graph builder.
pub struct Model {
    hp: HParams,
    weights: Weights,
    graphs: Graphs,
    device: Device,
    offload: Offload,
    file: Arc<GgufFile>,
}

impl Model {
    /// Opens and validates a GGUF file, then loads its weights.
    pub fn load(path: &Path, opts: LoadOptions<'_>) -> Result<Model, ModelError> {
        let file = Arc::new(GgufFile::open(path)?);
        Model::from_gguf(file, opts)
    }

    /// Loads weights of an already opened GGUF file.
    pub fn from_gguf(file: Arc<GgufFile>, mut opts: LoadOptions<'_>) -> Result<Model, ModelError> {
        let hp = HParams::from_gguf(&file)?;
        let mut specs = SpecList::default();
        let graphs = match hp.arch {
            Arch::Llama => {
                Graphs::Llama(arch::llama::Llama::declare(&hp, &file, &mut specs, false))
            }
            Arch::Qwen2 => Graphs::Llama(arch::qwen2::declare(&hp, &file, &mut specs)),
            Arch::Gemma3 => Graphs::Gemma3(arch::gemma3::Gemma3::declare(&hp, &file, &mut specs)),
        };
        let mut no_progress = |_: u64, _: u64| {};
        let progress: &mut dyn FnMut(u64, u64) = match opts.progress.as_mut() {
            Some(p) => *p,
            None => &mut no_progress,
        };
        let weights = Weights::load_with(
            &file,
            specs.specs(),
            opts.device,
            opts.offload,
            opts.repack,
            progress,
        )?;
        tracing::info!(arch = hp.arch.name(), layers = hp.n_layer, placement = ?weights.placement, "model loaded");
        Ok(Model {
            hp,
            weights,
            graphs,
            device: opts.device,
            offload: opts.offload,
            file,
        })
    }

    /// Hyper-parameters.
    pub fn hparams(&self) -> &HParams {
        &self.hp
    }

    /// The device the model runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Which layers the device holds (all of them unless partially offloaded).
    pub fn offload(&self) -> Offload {
        self.offload
    }

    /// The GGUF file the model came from.
    pub fn gguf(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// Bytes of weights per placement (`mmap` = read in place from the file).
    pub fn weight_placement(&self) -> &[(String, usize)] {
        &self.weights.placement
    }

    /// A KV pool of `n_cells` cells for this model, each layer's cells on the
    /// device that holds the layer's weights; shared with the step graphs that read it.
    pub fn new_kv(&self, n_cells: usize) -> Result<Arc<KvStore>, ModelError> {
        KvStore::with_offload(&self.hp, self.device, n_cells, self.offload).map(Arc::new)
    }

    fn check(&self, b: &StepBatch, kv: &KvStore) -> Result<(), ModelError> {
        let n = b.tokens.len();
        let bad = |s: String| Err(ModelError::BadBatch(s));
        if n == 0 {
            return bad("no tokens".into());
        }
        if b.positions.len() != n || b.kv_slots.len() != n {
            return bad("positions/kv_slots length differs from tokens".into());
        }
        if b.tokens.iter().any(|&t| t as usize >= self.hp.n_vocab) {
            return bad("token id outside the vocabulary".into());
        }
        if b.kv_slots
            .iter()
            .any(|&s| s < 0 || s as usize >= kv.n_cells())
        {
            return bad("kv slot outside the pool".into());
        }
        let mut next_row = 0;
        for s in &b.seqs {
            if s.row_start != next_row || s.n_rows == 0 {
                return bad("sequence spans must cover the tokens in order".into());
            }
            next_row += s.n_rows;
            if let Some(r) = s
                .window
                .iter()
                .find(|r| r.len == 0 || r.start + r.len > kv.n_cells())
            {
                return bad(format!(
                    "KV run {}+{} empty or outside 0..{}",
                    r.start,
                    r.len,
                    kv.n_cells()
                ));
            }
            let n_kv = s.n_kv();
            if n_kv == 0 {
                return bad("empty KV window".into());
            }
            let want = n_kv * s.n_rows;
            if s.mask.len() != want || s.mask_swa.as_ref().is_some_and(|m| m.len() != want) {
                return bad("mask size is not n_kv * n_rows".into());
            }
            if self.hp.swa_window.is_some() && s.mask_swa.is_none() {
                return bad(
                    "model has sliding-window layers but a sequence has no mask_swa".into(),
                );
            }
        }
        if next_row != n {
            return bad("sequence spans do not cover every token".into());
        }
        if b.output_rows.is_empty() || b.output_rows.iter().any(|&r| r < 0 || r as usize >= n) {
            return bad("output rows empty or out of range".into());
        }
        Ok(())
    }

    /// Runs one step: writes the batch's K/V into `kv` and returns logits,
    /// `output_rows.len() * n_vocab` floats in output-row order. A step of the same
    /// shape as the executor's previous one (steady decoding) reuses its graph.
    pub fn forward(
        self: &Arc<Self>,
        exec: &mut Executor,
        kv: &Arc<KvStore>,
        batch: &StepBatch,
    ) -> Result<Vec<f32>, ModelError> {
        match self.forward_step(exec, kv, batch, false)? {
            StepOutput::Logits(l) => Ok(l),
            StepOutput::Tokens(_) => unreachable!("a logits graph returns logits"),
        }
    }

    /// Whether greedy steps ([`Model::forward_step`] with `greedy`) save time: the
    /// output layer runs on a GPU.
    /// (On the CPU the logits are already in host memory, and ggml's CPU argmax
    /// runs on one thread.)
    pub fn greedy_on_device(&self) -> bool {
        self.device.kind() != DeviceKind::Cpu && self.offload.is_full(self.hp.n_layer)
    }

    /// Like [`Model::forward`]; with `greedy`, returns each output row's
    /// highest-scoring token instead, picked on the device: a GPU then sends back
    /// one id per row instead of a vocabulary of logits (33 MB per step for 64 rows
    /// of a 128K vocabulary). Exact ties go to whichever id the device's kernel
    /// keeps, and a row whose logits are all NaN or -inf gives token 0. Worth it
    /// only where [`Model::greedy_on_device`] says so.
    pub fn forward_step(
        self: &Arc<Self>,
        exec: &mut Executor,
        kv: &Arc<KvStore>,
        batch: &StepBatch,
        greedy: bool,
    ) -> Result<StepOutput, ModelError> {
        self.check(batch, kv)?;
        let cpu = self.device.kind() == DeviceKind::Cpu;
        let ops = attn::plan(batch, kv.n_cells(), cpu);
        let shape = StepShape::of(self, kv, batch, &ops, greedy);
        let Executor { sched, kept, built } = exec;
        let t0 = std::time::Instant::now();
        if kept.as_ref().is_none_or(|k| k.shape != shape) {
            // Free the old graph's context before building the next.
            *kept = None;
            *kept = Some(self.build(sched, kv, batch, &ops, shape)?);
            *built += 1;
        }
        let build_ms = t0.elapsed().as_secs_f64() * 1e3;
        let step = kept.as_ref().expect("built above");
        let result = self.run(sched, step, batch, &ops, build_ms);
        if result.is_err() {
            // The scheduler may be half-way through it: build afresh next time.
            *kept = None;
        }
        result
    }

    /// Builds and allocates a step's graph.
    fn build(
        self: &Arc<Self>,
        sched: &mut Scheduler,
        kv: &Arc<KvStore>,
        batch: &StepBatch,
        ops: &[attn::AttnOp<'_>],
        shape: StepShape,
    ) -> Result<StepGraph, ModelError> {
        let n_t = batch.tokens.len();
        let n_out = batch.output_rows.len();
        let greedy = shape.greedy;
        let invariant = shape.invariant;
        // Size the arena to this graph (a fixed worst case would cost a large
        // allocation and page faults on every rebuild).
        // Per layer: fixed ops plus, per sequence, its own matmul group in each of
        // the ~7 projections (view, matmul, concat), its attention ops and the K
        // and V window (a view and a copy per run).
        let per_layer: usize = 64
            + batch
                .seqs
                .iter()
                .map(|s| 48 + 6 * s.window.len())
                .sum::<usize>();
        let nodes = 256 + self.hp.n_layer * per_layer;
        if nodes > MAX_NODES {
            return Err(ModelError::BadBatch(format!(
                "step needs ~{nodes} graph nodes, more than {MAX_NODES}: fewer sequences or pages per step"
            )));
        }
        let cpu = self.device.kind() == DeviceKind::Cpu;
        let deps = (self.clone(), kv.clone());
        let (graph, ins) = KeptGraph::build(Context::new(nodes * 2, nodes)?, deps, |ctx, deps| {
            let (model, kv) = (&*deps.0, &*deps.1);
            let mask_input = |name: &str, op: &attn::AttnOp<'_>| {
                ctx.new_input(name, DType::F16, &op.mask_shape())
            };
            let index_input = |name: &str, n: usize| ctx.new_input(name, DType::I32, &[n as i64]);
            let inp = Inputs {
                tokens: ctx.new_input("inp_tokens", DType::I32, &[n_t as i64]),
                pos: ctx.new_input("inp_pos", DType::I32, &[n_t as i64]),
                slots: ctx.new_input("inp_kv_slots", DType::I64, &[n_t as i64]),
                seqs: batch
                    .seqs
                    .iter()
                    .map(|s| SeqInputs {
                        row_start: s.row_start,
                        n_rows: s.n_rows,
                    })
                    .collect(),
                attn: ops
                    .iter()
                    .map(|op| AttnInputs {
                        row_start: op.row_start,
                        n_rows: op.n_rows,
                        fa_rows: op.fa_rows,
                        cells: op.matmul.then(|| index_input("inp_attn_cells", op.n_kv())),
                        runs: op.runs.clone(),
                        mask: mask_input("inp_mask", op),
                        mask_swa: op.mask_swa.as_ref().map(|_| mask_input("inp_mask_swa", op)),
                        strided: op.strided.as_ref().map(|st| StridedInputs {
                            stride: st.stride,
                            q_rows: index_input("inp_attn_q_rows", st.q_rows.len()),
                            regions: index_input("inp_attn_regions", st.regions.len()),
                        }),
                    })
                    .collect(),
                out_ids: ctx.new_input("inp_out_ids", DType::I32, &[n_out as i64]),
                n_tokens: n_t,
                window_rows: Vec::new(),
            };
            let graph = ctx.new_graph(nodes);
            let mut b = Builder {
                ctx,
                graph,
                w: &model.weights,
                kv,
                hp: &model.hp,
                inp,
                cpu,
                invariant,
            };
            let logits: Tensor<'_> = match &model.graphs {
                Graphs::Llama(g) => g.build(&mut b),
                Graphs::Gemma3(g) => g.build(&mut b),
            };
            let out = if greedy { b.ctx.argmax(logits) } else { logits };
            out.set_output();
            b.graph.expand(out);
            let Builder { graph, inp, .. } = b;
            // The tensors written or read each step, by index.
            let mut keep = Vec::new();
            let mut ins = InputIds {
                tokens: kept(&mut keep, inp.tokens),
                pos: kept(&mut keep, inp.pos),
                slots: kept(&mut keep, inp.slots),
                out_ids: kept(&mut keep, inp.out_ids),
                out: kept(&mut keep, out),
                attn: Vec::new(),
                window_rows: Vec::new(),
            };
            for t in &inp.attn {
                let mask = kept(&mut keep, t.mask);
                let swa = t.mask_swa.map(|m| kept(&mut keep, m));
                let strided = t
                    .strided
                    .as_ref()
                    .map(|st| (kept(&mut keep, st.q_rows), kept(&mut keep, st.regions)));
                let cells = t.cells.map(|c| kept(&mut keep, c));
                ins.attn.push(AttnIds {
                    mask,
                    mask_swa: swa,
                    strided,
                    cells,
                });
            }
            for (t, rows) in inp.window_rows {
                ins.window_rows.push((kept(&mut keep, t), rows));
            }
            Ok::<_, ModelError>((graph, keep, ins))
        })?;
        // Nodes (at most `nodes`, the graph's capacity) plus leafs (weights, inputs;
        // fewer than the nodes): ggml's scheduler tables hold both.
        sched.reserve(2 * nodes)?;
        sched.alloc_with_inputs(graph.context(), &graph.graph())?;
        Ok(StepGraph { shape, graph, ins })
    }

    /// Writes a step's inputs into its allocated graph, computes it and reads the
    /// logits (or greedy tokens).
    fn run(
        &self,
        sched: &mut Scheduler,
        step: &StepGraph,
        batch: &StepBatch,
        ops: &[attn::AttnOp<'_>],
        build_ms: f64,
    ) -> Result<StepOutput, ModelError> {
        let t0 = std::time::Instant::now();
        let (g, ins) = (&step.graph, &step.ins);
        let toks: Vec<i32> = batch.tokens.iter().map(|&t| t as i32).collect();
        g.tensor(ins.tokens).write(&toks)?;
        g.tensor(ins.pos).write(&batch.positions)?;
        g.tensor(ins.slots).write(&batch.kv_slots)?;
        for (ids, op) in ins.attn.iter().zip(ops) {
            let (mask, swa, strided) = (ids.mask, ids.mask_swa, ids.strided);
            if let Some(t) = ids.cells {
                let cells: Vec<i32> = op
                    .runs
                    .iter()
                    .flat_map(|r| r.start as i32..(r.start + r.len) as i32)
                    .collect();
                g.tensor(t).write(&cells)?;
            }
            // A mask no layer reads (e.g. full attention in a model whose every layer
            // slides) is not allocated.
            let mask = g.tensor(mask);
            if mask.is_allocated() {
                mask.write(&op.mask)?;
            }
            if let (Some(t), Some(m)) = (swa, &op.mask_swa) {
                let t = g.tensor(t);
                if t.is_allocated() {
                    t.write(m)?;
                }
            }
            if let (Some((q_rows, regions)), Some(st)) = (strided, &op.strided) {
                g.tensor(q_rows).write(&st.q_rows)?;
                g.tensor(regions).write(&st.regions)?;
            }
        }
        g.tensor(ins.out_ids).write(&batch.output_rows)?;
        for (t, rows) in &ins.window_rows {
            g.tensor(*t).write(rows)?;
        }
        let t1 = std::time::Instant::now();
        sched.compute(&g.graph())?;
        let t2 = std::time::Instant::now();
        // Where the model's part of a step goes (with the engine's `step` line): graph
        // build and allocation (0 when the last graph was reused), writing the inputs
        // (token ids, masks), computing (device time plus the wait for it).
        tracing::debug!(
            rows = batch.tokens.len(),
            ops = ops.len(),
            build_ms,
            inputs_ms = (t1 - t0).as_secs_f64() * 1e3,
            compute_ms = (t2 - t1).as_secs_f64() * 1e3,
            "forward"
        );
        let n_out = batch.output_rows.len();
        if step.shape.greedy {
            let mut ids = vec![0i32; n_out];
            g.tensor(ins.out).read_i32(&mut ids)?;
            // -1: nothing above -f32::MAX (the host sampler's argmax gives 0 then).
            return Ok(StepOutput::Tokens(
                ids.into_iter().map(|t| t.max(0) as u32).collect(),
            ));
        }
        let mut out = vec![0f32; n_out * self.hp.n_vocab];
        g.tensor(ins.out).read_f32(0, &mut out)?;
        Ok(StepOutput::Logits(out))
    }
}

/// What a step returns for its output rows, in output-row order.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutput {
    /// `output_rows.len() * n_vocab` logits.
    Logits(Vec<f32>),
    /// Each row's highest-scoring token, picked on the device (a greedy step).
    Tokens(Vec<u32>),
}
