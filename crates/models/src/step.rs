//! Running steps: the [`Executor`] (backends and scheduler), step graphs built for
//! a batch's shape and kept for the next step of that shape, and writing a step's
//! inputs into its graph.

use std::sync::Arc;

use tempo9_ggml::{
    Backend, Context, DType, Device, DeviceKind, KeptGraph, Scheduler, Tensor,
    HIGH_PRIORITY_STREAMS,
};

use crate::attn::AttnOp;
use crate::deltanet::{StateInputs, StateOp};
use crate::layers::{AttnInputs, Builder, EmbedInputs, Inputs, SeqInputs, StridedInputs};
use crate::{CellRun, Graphs, GroupKind, KvStore, Model, ModelError, StepBatch, StepOutput};

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
    /// The MTP head's graph instead of the trunk's.
    mtp: bool,
    /// Rows whose hidden states are returned.
    n_hidden: usize,
    /// Each sequence's (first row, rows): the matmul row groups.
    seqs: Vec<(usize, usize)>,
    /// Per cache group, its attention ops.
    ops: Vec<Vec<OpShape>>,
    /// [`StepBatch::batch_invariant`].
    invariant: bool,
    /// Each recurrent state op's layout: baked into the graph.
    states: Vec<StateShape>,
    /// Rows whose input is an embedding.
    embed_rows: usize,
}

/// What a recurrent state op bakes into the graph.
#[derive(Debug, PartialEq, Eq)]
struct StateShape {
    row_start: usize,
    n_rows: usize,
    n_seqs: usize,
    /// Its snapshots' (sequence index in the op, rows back).
    snaps: Vec<(usize, usize)>,
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
    /// A gathered op (its cells are an input, not part of the shape).
    gathered: bool,
    matmul: bool,
}

impl OpShape {
    fn of(op: &AttnOp<'_>) -> OpShape {
        OpShape {
            row_start: op.row_start,
            n_rows: op.n_rows,
            fa_rows: op.fa_rows,
            runs: op.runs.clone(),
            swa: op.mask_swa.is_some(),
            strided: op
                .strided
                .as_ref()
                .map(|st| (st.stride, st.q_rows.len(), st.regions.len())),
            gathered: op.gather.is_some(),
            matmul: op.matmul,
        }
    }
}

impl StepShape {
    fn of(
        model: &Model,
        kv: &KvStore,
        b: &StepBatch,
        ops: &[Vec<AttnOp<'_>>],
        states: &[StateOp],
        greedy: bool,
        mtp: bool,
    ) -> StepShape {
        StepShape {
            model: model as *const Model as usize,
            kv: kv as *const KvStore as usize,
            n_tokens: b.tokens.len(),
            n_out: b.output_rows.len(),
            greedy,
            mtp,
            n_hidden: b.hidden_rows.len(),
            invariant: b.batch_invariant,
            embed_rows: b.embeds.as_ref().map_or(0, |e| e.rows.len()),
            seqs: b.seqs.iter().map(|s| (s.row_start, s.n_rows)).collect(),
            states: states
                .iter()
                .map(|op| StateShape {
                    row_start: op.row_start,
                    n_rows: op.n_rows,
                    n_seqs: op.slots.len(),
                    snaps: op.snaps.iter().map(|&(i, back, _)| (i, back)).collect(),
                })
                .collect(),
            ops: ops
                .iter()
                .map(|g| g.iter().map(OpShape::of).collect())
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
    /// A gathered op's cells.
    gather: Option<usize>,
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
    /// Multi-section rope positions.
    pos_multi: Option<usize>,
    /// Input-embedding rows and values.
    embeds: Option<(usize, usize)>,
    /// Per-token query scales.
    attn_temp: Option<usize>,
    /// Each state op's slots, and its snapshots' (rows, slots).
    states: Vec<(usize, Option<(usize, usize)>)>,
    /// Per cache group, its KV slots.
    slots: Vec<usize>,
    out_ids: usize,
    /// The logits, or in a greedy graph the token ids.
    out: usize,
    /// The hidden rows' indices and values (see [`StepBatch::hidden_rows`]).
    hidden: Option<(usize, usize)>,
    /// An MTP graph's hidden-state input.
    h_in: Option<usize>,
    /// Per cache group, its attention ops' inputs.
    attn: Vec<Vec<AttnIds>>,
    /// Window row indices with their values.
    window_rows: Vec<(usize, Vec<i64>)>,
}

impl Executor {
    /// An executor for `device` (plus the CPU for anything the device cannot run).
    pub fn new(device: Device, threads: usize) -> Result<Executor, ModelError> {
        let mut backends = Vec::new();
        if device.kind() != DeviceKind::Cpu {
            // The model's steps before anything else sharing the GPU (an image
            // encoder on its own backend): libraries without the feature ignore it.
            backends.push(Backend::with_params(device, HIGH_PRIORITY_STREAMS)?);
        }
        let cpu = Backend::new(Device::cpu())?;
        cpu.set_threads(threads);
        backends.push(cpu);
        let mut sched = Scheduler::new(backends, INITIAL_SCHED_SIZE)?;
        // TEMPO9_DUMP_TENSORS=1 prints every node's sum, to compare with llama-eval-callback
        // (TEMPO9_DUMP_VALUES=1: a few values of each too).
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

    /// Bytes of step memory held: compute buffers plus the input arena.
    pub fn held_bytes(&self) -> usize {
        self.sched.compute_buffer_bytes() + self.sched.input_bytes()
    }

    /// Drops the kept graph and frees the compute buffers and input memory, which a
    /// long prompt's steps grew (its masks span every cell it attends to: 31 MB for a
    /// 512-token chunk at a 30K-token depth); the next step builds and allocates at
    /// its own size. For an engine gone idle on the CPU, where these buffers are the
    /// host memory it keeps beyond the KV cache.
    pub fn release_buffers(&mut self) -> Result<(), ModelError> {
        self.kept = None;
        self.sched.release_buffers()?;
        Ok(())
    }
}

/// Graph size limit: per-sequence attention makes graphs grow with the number of
/// sequences in a step (≈ 30 layers × 64 sequences × 20 ops).
const MAX_NODES: usize = 1 << 17;

/// The scheduler's first capacity (nodes plus leafs): a decode step of one sequence
/// of a 32-layer model fits; larger steps grow it (see `Scheduler::reserve`).
const INITIAL_SCHED_SIZE: usize = 1 << 13;

impl Model {
    /// Plans `batch` (checked) per cache group, then computes it on the executor's
    /// kept graph when the shape matches, else on a new one.
    pub(crate) fn step(
        self: &Arc<Self>,
        exec: &mut Executor,
        kv: &Arc<KvStore>,
        batch: &StepBatch,
        greedy: bool,
        h_in: Option<&[f32]>,
    ) -> Result<(StepOutput, Vec<f32>), ModelError> {
        let cpu = self.device.kind() == DeviceKind::Cpu;
        let ops: Vec<Vec<AttnOp<'_>>> = (0..kv.n_groups())
            .map(|g| match kv.groups()[g].kind {
                GroupKind::Recurrent => Vec::new(),
                _ => crate::attn::plan(batch, g, kv.n_cells(g), cpu),
            })
            .collect();
        let kinds: Vec<GroupKind> = kv.groups().iter().map(|g| g.kind.clone()).collect();
        let states = crate::deltanet::plan(batch, &kinds);
        let shape = StepShape::of(self, kv, batch, &ops, &states, greedy, h_in.is_some());
        let Executor { sched, kept, built } = exec;
        let t0 = std::time::Instant::now();
        if kept.as_ref().is_none_or(|k| k.shape != shape) {
            // Free the old graph's context before building the next.
            *kept = None;
            *kept = Some(self.build(sched, kv, batch, &ops, &states, shape)?);
            *built += 1;
        }
        let build_ms = t0.elapsed().as_secs_f64() * 1e3;
        let step = kept.as_ref().expect("built above");
        let result = self.run(sched, step, batch, &ops, &states, h_in, build_ms);
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
        ops: &[Vec<AttnOp<'_>>],
        states: &[StateOp],
        shape: StepShape,
    ) -> Result<StepGraph, ModelError> {
        let n_t = batch.tokens.len();
        let n_out = batch.output_rows.len();
        let greedy = shape.greedy;
        let invariant = shape.invariant;
        let mtp = shape.mtp;
        let shape_hidden = shape.n_hidden;
        let hp = self.layer_hparams(mtp);
        let n_embd = hp.n_embd as i64;
        let shape_embed_rows = shape.embed_rows;
        // Size the arena to this graph (a fixed worst case would cost a large
        // allocation and page faults on every rebuild).
        // Per layer: fixed ops plus, per sequence, its attention ops and the K and
        // V window of the layer's group (a view and a copy per run), and on the CPU
        // its own matmul group in each projection (view, matmul, concat; also the
        // experts' routing). A recurrent layer has one convolution and delta-rule
        // op per state op instead of attention.
        let cpu = self.device.kind() == DeviceKind::Cpu;
        let matmul_groups = if cpu { 32 * batch.seqs.len() } else { 0 };
        let per_group: Vec<usize> = (0..kv.n_groups())
            .map(|g| match kv.groups()[g].kind {
                GroupKind::Recurrent => {
                    96 + 40 * states.len()
                        + states.iter().map(|o| 8 + 4 * o.snaps.len()).sum::<usize>()
                        + matmul_groups
                }
                _ => {
                    64 + matmul_groups
                        + batch
                            .seqs
                            .iter()
                            .map(|s| 20 + 6 * s.views[g].window.len())
                            .sum::<usize>()
                }
            })
            .collect();
        let nodes = 256
            + (0..hp.n_layer)
                .map(|il| per_group[kv.group_of(il)])
                .sum::<usize>();
        if nodes > MAX_NODES {
            return Err(ModelError::BadBatch(format!(
                "step needs ~{nodes} graph nodes, more than {MAX_NODES}: fewer sequences or pages per step"
            )));
        }
        let deps = (self.clone(), kv.clone());
        let (graph, ins) = KeptGraph::build(Context::new(nodes * 2, nodes)?, deps, |ctx, deps| {
            let (model, kv) = (&*deps.0, &*deps.1);
            let mask_input =
                |name: &str, op: &AttnOp<'_>| ctx.new_input(name, DType::F16, &op.mask_shape());
            let index_input = |name: &str, n: usize| ctx.new_input(name, DType::I32, &[n as i64]);
            let attn_inputs = |op: &AttnOp<'_>| AttnInputs {
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
                    gather: op
                        .gather
                        .as_ref()
                        .map(|c| index_input("inp_attn_gather", c.len())),
                }),
            };
            let inp = Inputs {
                tokens: ctx.new_input("inp_tokens", DType::I32, &[n_t as i64]),
                pos: ctx.new_input("inp_pos", DType::I32, &[n_t as i64]),
                pos_multi: model
                    .hp
                    .rope_sections
                    .map(|_| ctx.new_input("inp_pos_multi", DType::I32, &[4 * n_t as i64])),
                attn_temp: model
                    .hp
                    .attn_temp
                    .map(|_| ctx.new_input("inp_attn_scale", DType::F32, &[1, 1, n_t as i64])),
                embeds: (shape_embed_rows > 0).then(|| EmbedInputs {
                    rows: ctx.new_input("inp_embd_rows", DType::I32, &[shape_embed_rows as i64]),
                    values: ctx.new_input(
                        "inp_embd",
                        DType::F32,
                        &[model.hp.n_embd_inp() as i64, shape_embed_rows as i64],
                    ),
                }),
                states: states
                    .iter()
                    .map(|op| StateInputs {
                        row_start: op.row_start,
                        n_rows: op.n_rows,
                        slots: index_input("inp_state_slots", op.slots.len()),
                        snaps: op.snaps.iter().map(|&(i, back, _)| (i, back)).collect(),
                        snap_io: (!op.snaps.is_empty()).then(|| {
                            (
                                index_input("inp_state_snap_rows", op.snaps.len()),
                                index_input("inp_state_snap_slots", op.snaps.len()),
                            )
                        }),
                    })
                    .collect(),
                slots: (0..ops.len())
                    .map(|g| {
                        ctx.new_input(&format!("inp_kv_slots_g{g}"), DType::I64, &[n_t as i64])
                    })
                    .collect(),
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
                    .map(|g| g.iter().map(attn_inputs).collect())
                    .collect(),
                out_ids: ctx.new_input("inp_out_ids", DType::I32, &[n_out as i64]),
                h_in: mtp.then(|| ctx.new_input("inp_mtp_h", DType::F32, &[n_embd, n_t as i64])),
                n_tokens: n_t,
                window_rows: Vec::new(),
            };
            let graph = ctx.new_graph(nodes);
            let mut b = Builder {
                ctx,
                graph,
                w: &model.weights,
                kv,
                hp: model.layer_hparams(mtp),
                inp,
                cpu,
                invariant,
                gpu_kv: model.greedy_on_device(),
                hidden: None,
                written: Vec::new(),
            };
            let logits: Tensor<'_> = match &model.graphs {
                Graphs::Qwen35(g) if mtp => g.build_mtp(&mut b)?,
                _ if mtp => return Err(ModelError::BadBatch("the model has no MTP head".into())),
                Graphs::Llama(g) => g.build(&mut b),
                Graphs::Gemma3(g) => g.build(&mut b),
                Graphs::Gemma4(g) => g.build(&mut b),
                Graphs::Qwen3(g) => g.build(&mut b),
                Graphs::Qwen35(g) => g.build(&mut b),
                Graphs::GptOss(g) => g.build(&mut b),
            };
            let out = if greedy { b.ctx.argmax(logits) } else { logits };
            out.set_output();
            b.graph.expand(out);
            let hidden = match (b.hidden, shape_hidden) {
                (_, 0) => None,
                (Some(h), n) => {
                    let ids = b.ctx.new_input("inp_hidden_ids", DType::I32, &[n as i64]);
                    let rows = b.ctx.get_rows(h, ids);
                    rows.set_output();
                    b.graph.expand(rows);
                    Some((ids, rows))
                }
                (None, _) => {
                    return Err(ModelError::BadBatch(
                        "hidden rows asked of a model without an MTP head".into(),
                    ))
                }
            };
            let Builder { graph, inp, .. } = b;
            // The tensors written or read each step, by index.
            let mut keep = Vec::new();
            let mut ins = InputIds {
                tokens: kept(&mut keep, inp.tokens),
                pos: kept(&mut keep, inp.pos),
                pos_multi: inp.pos_multi.map(|t| kept(&mut keep, t)),
                embeds: inp
                    .embeds
                    .map(|e| (kept(&mut keep, e.rows), kept(&mut keep, e.values))),
                attn_temp: inp.attn_temp.map(|t| kept(&mut keep, t)),
                states: inp
                    .states
                    .iter()
                    .map(|s| {
                        let snap = s
                            .snap_io
                            .map(|(r, t)| (kept(&mut keep, r), kept(&mut keep, t)));
                        (kept(&mut keep, s.slots), snap)
                    })
                    .collect(),
                slots: Vec::new(),
                out_ids: kept(&mut keep, inp.out_ids),
                out: kept(&mut keep, out),
                hidden: hidden.map(|(i, r)| (kept(&mut keep, i), kept(&mut keep, r))),
                h_in: inp.h_in.map(|t| kept(&mut keep, t)),
                attn: Vec::new(),
                window_rows: Vec::new(),
            };
            for t in inp.slots {
                ins.slots.push(kept(&mut keep, t));
            }
            for group in &inp.attn {
                let mut ids = Vec::with_capacity(group.len());
                for t in group {
                    let mask = kept(&mut keep, t.mask);
                    let swa = t.mask_swa.map(|m| kept(&mut keep, m));
                    let strided = t
                        .strided
                        .as_ref()
                        .map(|st| (kept(&mut keep, st.q_rows), kept(&mut keep, st.regions)));
                    let cells = t.cells.map(|c| kept(&mut keep, c));
                    let gather = t
                        .strided
                        .as_ref()
                        .and_then(|st| st.gather)
                        .map(|c| kept(&mut keep, c));
                    ids.push(AttnIds {
                        mask,
                        mask_swa: swa,
                        strided,
                        gather,
                        cells,
                    });
                }
                ins.attn.push(ids);
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
    /// logits (or greedy tokens) and hidden rows.
    #[allow(clippy::too_many_arguments)] // The step's parts, each feeding inputs.
    fn run(
        &self,
        sched: &mut Scheduler,
        step: &StepGraph,
        batch: &StepBatch,
        ops: &[Vec<AttnOp<'_>>],
        states: &[StateOp],
        h_in: Option<&[f32]>,
        build_ms: f64,
    ) -> Result<(StepOutput, Vec<f32>), ModelError> {
        let t0 = std::time::Instant::now();
        let (g, ins) = (&step.graph, &step.ins);
        let toks: Vec<i32> = batch.tokens.iter().map(|&t| t as i32).collect();
        g.tensor(ins.tokens).write(&toks)?;
        g.tensor(ins.pos).write(&batch.positions)?;
        if let Some(t) = ins.pos_multi {
            match &batch.positions_multi {
                Some(pos) => g.tensor(t).write(pos)?,
                None => {
                    // Text positions: (p, p, p, 0) per token, section-major.
                    let n = batch.positions.len();
                    let mut pos = Vec::with_capacity(4 * n);
                    for _ in 0..3 {
                        pos.extend_from_slice(&batch.positions);
                    }
                    pos.resize(4 * n, 0);
                    g.tensor(t).write(&pos)?;
                }
            }
        }
        if let (Some((rows, values)), Some(e)) = (ins.embeds, &batch.embeds) {
            g.tensor(rows).write(&e.rows)?;
            g.tensor(values).write(&e.values)?;
        }
        if let (Some(t), Some(temp)) = (ins.attn_temp, self.hp.attn_temp) {
            let scales: Vec<f32> = batch.positions.iter().map(|&p| temp.at(p)).collect();
            g.tensor(t).write(&scales)?;
        }
        for (&(t, snap), op) in ins.states.iter().zip(states) {
            g.tensor(t).write(&op.slots)?;
            if let Some((rows, slots)) = snap {
                let n = op.slots.len();
                let r: Vec<i32> = op
                    .snaps
                    .iter()
                    .map(|&(i, back, _)| (back * n + i) as i32)
                    .collect();
                let s: Vec<i32> = op.snaps.iter().map(|&(_, _, slot)| slot).collect();
                g.tensor(rows).write(&r)?;
                g.tensor(slots).write(&s)?;
            }
        }
        for (&t, slots) in ins.slots.iter().zip(&batch.kv_slots) {
            g.tensor(t).write(slots)?;
        }
        for (ids, op) in ins.attn.iter().flatten().zip(ops.iter().flatten()) {
            let (mask, swa, strided) = (ids.mask, ids.mask_swa, ids.strided);
            if let Some(t) = ids.cells {
                let cells: Vec<i32> = op
                    .runs
                    .iter()
                    .flat_map(|r| r.start as i32..(r.start + r.len) as i32)
                    .collect();
                g.tensor(t).write(&cells)?;
            }
            // A mask no layer reads (e.g. full attention in a Full group whose every
            // layer slides) is not allocated.
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
            if let (Some(t), Some(cells)) = (ids.gather, &op.gather) {
                g.tensor(t).write(cells)?;
            }
        }
        g.tensor(ins.out_ids).write(&batch.output_rows)?;
        if let Some((ids, _)) = ins.hidden {
            g.tensor(ids).write(&batch.hidden_rows)?;
        }
        if let (Some(t), Some(h)) = (ins.h_in, h_in) {
            g.tensor(t).write(h)?;
        }
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
            ops = ops.iter().map(Vec::len).sum::<usize>(),
            build_ms,
            inputs_ms = (t1 - t0).as_secs_f64() * 1e3,
            compute_ms = (t2 - t1).as_secs_f64() * 1e3,
            "forward"
        );
        let mut hidden = Vec::new();
        if let Some((_, rows)) = ins.hidden {
            hidden = vec![0f32; batch.hidden_rows.len() * self.hp.n_embd];
            g.tensor(rows).read_f32(0, &mut hidden)?;
        }
        let n_out = batch.output_rows.len();
        if step.shape.greedy {
            let mut ids = vec![0i32; n_out];
            g.tensor(ins.out).read_i32(&mut ids)?;
            // -1: nothing above -f32::MAX (the host sampler's argmax gives 0 then).
            let ids = ids.into_iter().map(|t| t.max(0) as u32).collect();
            return Ok((StepOutput::Tokens(ids), hidden));
        }
        let mut out = vec![0f32; n_out * self.hp.n_vocab];
        g.tensor(ins.out).read_f32(0, &mut out)?;
        Ok((StepOutput::Logits(out), hidden))
    }
}
