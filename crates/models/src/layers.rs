//! Building blocks shared by the architectures: the per-step graph builder with
//! norms, projections, attention over the KV pool and gated feed-forward.

use tempo9_ggml::{Context, DType, Graph, Tensor};

use crate::kv::KvStore;
use crate::weights::{WeightId, Weights};
use crate::{CellRun, HParams};

/// Graph inputs of one step (filled after allocation from the `StepBatch`).
pub(crate) struct Inputs<'a> {
    pub tokens: Tensor<'a>,
    pub pos: Tensor<'a>,
    /// Four positions per token, section-major, for multi-section rope (Qwen3.5).
    pub pos_multi: Option<Tensor<'a>>,
    /// Per-token query scale `[1, 1, n_tokens]` F32 ([`crate::AttnTemp`]).
    pub attn_temp: Option<Tensor<'a>>,
    /// Rows whose input is an embedding (image positions).
    pub embeds: Option<EmbedInputs<'a>>,
    /// The step's recurrent-state ops (see [`crate::deltanet`]).
    pub states: Vec<crate::deltanet::StateInputs<'a>>,
    /// Per cache group, the cell each token's K/V goes to in the group's pools.
    pub slots: Vec<Tensor<'a>>,
    pub seqs: Vec<SeqInputs>,
    /// Per cache group, the step's attention ops (see [`crate::attn`]).
    pub attn: Vec<Vec<AttnInputs<'a>>>,
    pub out_ids: Tensor<'a>,
    /// An MTP graph's hidden-state input `[n_embd, n_tokens]` F32 (see
    /// [`crate::Model::mtp_forward`]).
    pub h_in: Option<Tensor<'a>>,
    pub n_tokens: usize,
    /// Row indices (into an assembled attention window) with their values: one
    /// input per distinct (offset, length), shared by all layers.
    pub window_rows: Vec<(Tensor<'a>, Vec<i64>)>,
}

/// Input embeddings of some rows: `rows` I32 `[n]`, `values` F32
/// `[n_embd_inp, n]` (the embedding, then the deepstack features).
#[derive(Clone, Copy)]
pub(crate) struct EmbedInputs<'a> {
    pub rows: Tensor<'a>,
    pub values: Tensor<'a>,
}

/// One sequence's token rows.
#[derive(Clone)]
pub(crate) struct SeqInputs {
    pub row_start: usize,
    pub n_rows: usize,
}

/// One attention op's inputs (see [`crate::attn::AttnOp`]).
#[derive(Clone)]
pub(crate) struct AttnInputs<'a> {
    pub row_start: usize,
    pub n_rows: usize,
    /// Query rows the attention op runs on: `n_rows`, or more (padding) to run
    /// ggml's tiled CPU kernel (see [`crate::SeqSpan::tiled_prompt`]).
    pub fa_rows: usize,
    /// Set to attend through matmuls instead of flash attention (a long decode row
    /// on the CPU: [`crate::attn::MATMUL_DECODE_ABOVE`]): the window's cells, I32.
    pub cells: Option<Tensor<'a>>,
    pub runs: Vec<CellRun>,
    pub mask: Tensor<'a>,
    pub mask_swa: Option<Tensor<'a>>,
    pub strided: Option<StridedInputs<'a>>,
}

/// A strided op's layout (see [`crate::attn::Strided`]): the region stride in
/// cells and the two row maps as I32 inputs, and for a gathered op the pool cell
/// of each slot (I32, `regions × stride`).
#[derive(Clone)]
pub(crate) struct StridedInputs<'a> {
    pub stride: usize,
    pub q_rows: Tensor<'a>,
    pub regions: Tensor<'a>,
    pub gather: Option<Tensor<'a>>,
}

/// Everything an architecture needs to build one step's graph.
pub(crate) struct Builder<'a> {
    pub ctx: &'a Context,
    pub graph: Graph<'a>,
    pub w: &'a Weights,
    pub kv: &'a KvStore,
    pub hp: &'a HParams,
    pub inp: Inputs<'a>,
    /// Whether the graph runs on the CPU backend (whose kernels some grouping
    /// choices below are about).
    pub cpu: bool,
    /// [`crate::StepBatch::batch_invariant`].
    pub invariant: bool,
    /// Every layer's KV pools are in GPU memory (a GPU device, fully offloaded), so
    /// ops reading them run on the GPU.
    pub gpu_kv: bool,
    /// Set by the architecture: every row's final hidden state after the output
    /// norm `[n_embd, n_tokens]`, the input of its MTP head (only architectures
    /// with one set it; see [`crate::StepBatch::hidden_rows`]).
    pub hidden: Option<Tensor<'a>>,
    /// Per layer, its K and V pools as written this step (set by
    /// [`Builder::attention`]), which a KV-sharing layer reads after them.
    pub written: Vec<Option<(Tensor<'a>, Tensor<'a>)>>,
}

/// One query row's attention without flash attention: `q` `[d, 1, n_head]`, `k`
/// `[d, n_kv, n_head_kv]` (an F16 view of the window), `v_pool` a V pool
/// `[d_v * n_head_kv, n_cells]` (F16) and `cells` (I32) the window's cells in it,
/// `mask` `[n_kv, 1]` F16, `sinks` optional per-head sink logits. Scores by a matmul (consecutive query heads share a KV
/// head, as in flash attention), softmax in F32, then the weighted sum of V rows as
/// an outer product over the window's V rows gathered as F32 (`get_rows` converts
/// whole rows with SIMD; ggml's F16 outer product and casts convert element by
/// element). Returns `[d_v, 1, n_head]`.
#[allow(clippy::too_many_arguments)]
fn matmul_attention<'a>(
    ctx: &'a Context,
    q: Tensor<'a>,
    k: Tensor<'a>,
    v_pool: Tensor<'a>,
    cells: Tensor<'a>,
    mask: Tensor<'a>,
    scale: f32,
    sinks: Option<Tensor<'a>>,
) -> Tensor<'a> {
    let (n_kv, n_head, n_head_kv) = (k.ne()[1], q.ne()[2], k.ne()[2]);
    let kq = ctx.mul_mat(k, q); // [n_kv, 1, n_head]
    let p = ctx.soft_max_ext(kq, mask, scale);
    if let Some(s) = sinks {
        ctx.soft_max_add_sinks(p, s);
    }
    let p = ctx.reshape(p, &[1, n_kv, n_head]);
    let v = ctx.get_rows(v_pool, cells); // [d_v * n_head_kv, n_kv] F32
    let dv = v.ne()[0] / n_head_kv;
    let v = ctx.reshape(v, &[dv, n_head_kv, n_kv]);
    let v = ctx.permute(v, [0, 2, 1, 3]); // [d_v, n_kv, n_head_kv]
    ctx.out_prod(v, p)
}

/// The mask layer `il` reads in `op`: a sliding layer kept in a Full group (the
/// `swa_full` layout) reads the op's `mask_swa`; every other layer the op's mask
/// (in a Sliding group, built with the sliding limit already).
fn layer_mask<'a>(hp: &HParams, il: usize, op: &AttnInputs<'a>) -> Tensor<'a> {
    match (hp.is_swa[il], op.mask_swa) {
        (true, Some(m)) => m,
        _ => op.mask,
    }
}

/// Weight types whose CPU matmul goes through llamafile's tinyBLAS when two or more
/// rows multiply at once, but through ggml's dot products for a single row; the two
/// round differently. tinyBLAS itself computes every output the same way whatever
/// the row count (its tiles only change which outputs share registers).
fn tinyblas_on_cpu(t: DType) -> bool {
    // F32, F16, Q4_0, Q5_0, Q8_0, IQ4_NL, BF16 (ggml type ids).
    matches!(t.raw(), 0 | 1 | 2 | 6 | 8 | 20 | 30)
}

/// From this many rows, ggml's CPU backend multiplies K-quant weights (Q2_K..Q6_K,
/// IQ2_XXS, IQ4_XS) with its tiled kernel (AVX-512 builds), whose rounding differs
/// from the dot products a lone decode row gets: with 8 decode rows merged in one
/// matmul, Qwen2.5-Coder-0.5B's (Q6_K) and Gemma 3's numbers moved against the
/// same requests alone, with 7 they did not.
const TILED_MIN_ROWS: usize = 8;

/// Weight types ggml's tiled CPU kernel takes from [`TILED_MIN_ROWS`] rows on.
fn tiled_on_cpu(t: DType) -> bool {
    // Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, IQ4_XS (ggml type ids).
    matches!(t.raw(), 10..=14 | 16 | 23)
}

/// Weight types whose CPU matmul (ggml's dot products, one output at a time)
/// gives each row the same numbers whatever rows share the matmul, checked by the
/// batched parity tests: Q4_1 (SmolLM2). Merging the prompt chunks of different
/// sequences on Q6_K moved Qwen2.5's step-0 logprob by 0.03 (cause not found).
fn merge_chunks_on_cpu(t: DType) -> bool {
    matches!(t.raw(), 3)
}

impl<'a> Builder<'a> {
    /// Weight by id.
    pub fn wt(&self, id: WeightId) -> Tensor<'a> {
        self.w.get(id)
    }

    /// Token embeddings `[n_embd, n_tokens]`, optionally scaled.
    pub fn embed(&self, tok_embd: WeightId, scale: Option<f32>) -> Tensor<'a> {
        let x = self.ctx.get_rows(self.wt(tok_embd), self.inp.tokens);
        match scale {
            Some(s) => self.ctx.scale(x, s),
            None => x,
        }
    }

    /// Token embeddings with the step's input embeddings (image positions) in
    /// their rows, as llama.cpp feeds an embedding batch.
    pub fn embed_inputs(&self, tok_embd: WeightId) -> Tensor<'a> {
        self.embed_inputs_scaled(tok_embd, None)
    }

    /// [`Builder::embed_inputs`] with the token rows scaled by `scale` and the
    /// input embeddings not (llama.cpp scales only token rows: Gemma's
    /// `sqrt(n_embd)`).
    pub fn embed_inputs_scaled(&self, tok_embd: WeightId, scale: Option<f32>) -> Tensor<'a> {
        let x = self.embed(tok_embd, scale);
        match self.inp.embeds {
            Some(e) => self.ctx.set_rows(x, self.embed_part(e, 0), e.rows),
            None => x,
        }
    }

    /// Part `i` (0: the embedding, 1..: deepstack features) of the input
    /// embeddings, `[n_embd, n]`.
    fn embed_part(&self, e: EmbedInputs<'a>, i: usize) -> Tensor<'a> {
        let n_embd = self.hp.n_embd;
        let v = e.values;
        let part = self
            .ctx
            .view(v, &[n_embd as i64, v.ne()[1]], &[v.nb()[1]], i * n_embd * 4);
        self.ctx.cont(part)
    }

    /// Layer `il`'s output `x` plus, at the image rows, the input embeddings'
    /// deepstack feature `il` (Qwen3-VL: layers `0..n_deepstack`; text rows
    /// get nothing added, as llama.cpp's zero-padded text embeddings).
    pub fn deepstack(&self, x: Tensor<'a>, il: usize) -> Tensor<'a> {
        match self.inp.embeds {
            Some(e) if il < self.hp.n_deepstack => {
                let rows = self.ctx.get_rows(x, e.rows);
                let sum = self.ctx.add(rows, self.embed_part(e, il + 1));
                self.ctx.set_rows(x, sum, e.rows)
            }
            _ => x,
        }
    }

    /// `rms_norm(x) * w`.
    pub fn rms_norm(&self, x: Tensor<'a>, w: WeightId) -> Tensor<'a> {
        let n = self.ctx.rms_norm(x, self.hp.rms_eps);
        self.ctx.mul(n, self.wt(w))
    }

    /// `w x (+ b)`, with the rows of `x` grouped so that each sequence's numbers do
    /// not depend on what else is in the step (ggml's matmuls choose kernels by row
    /// count, and some round differently):
    /// - repacked CPU weights (gemm for row groups of four, gemv for the rest): each
    ///   prompt chunk multiplies on its own and each decode row alone;
    /// - Q4_1 on the CPU (see [`merge_chunks_on_cpu`]), and every weight on a GPU
    ///   (checked to a tolerance, not bit for bit): all rows in one matmul, one pass
    ///   over the weight;
    /// - other CPU weights: decode rows together and each prompt chunk on its own;
    ///   for tinyBLAS types (Q8_0, Q5_0, Q4_0, F16, ...) ggml takes its dot products
    ///   for one row and tinyBLAS from two rows on, so a lone decode row is doubled.
    pub fn linear(&self, w: WeightId, x: Tensor<'a>, b: Option<WeightId>) -> Tensor<'a> {
        let repacked = self.w.is_repacked(w);
        let double_lone_rows =
            self.invariant && self.cpu && !repacked && tinyblas_on_cpu(self.wt(w).dtype());
        let n_rows = x.ne()[1] as usize;
        let groups = self.row_groups(n_rows, repacked, self.wt(w).dtype());
        let nb1 = x.nb()[1];
        let mul = |start: usize, rows: usize| {
            if rows == 1 && double_lone_rows {
                // The row twice, then the first result column.
                let xs = self.ctx.view(x, &[x.ne()[0], 1], &[nb1], start * nb1);
                let y = self.ctx.mul_mat(self.wt(w), self.ctx.concat(xs, xs, 1));
                self.ctx.view(y, &[y.ne()[0], 1], &[y.nb()[1]], 0)
            } else if rows == n_rows {
                self.ctx.mul_mat(self.wt(w), x)
            } else {
                let xs = self
                    .ctx
                    .view(x, &[x.ne()[0], rows as i64], &[nb1], start * nb1);
                self.ctx.mul_mat(self.wt(w), xs)
            }
        };
        let parts: Vec<Tensor<'a>> = groups.iter().map(|&(s, r)| mul(s, r)).collect();
        let y = self.concat_all(parts, 1);
        match b {
            Some(b) => self.ctx.add(y, self.wt(b)),
            None => y,
        }
    }

    /// The row groups a matmul of `n_rows` rows by a weight of type `dtype`
    /// (`repacked` into a CPU layout) runs as, one matmul each (see [`Self::linear`]).
    pub(crate) fn row_groups(
        &self,
        n_rows: usize,
        repacked: bool,
        dtype: DType,
    ) -> Vec<(usize, usize)> {
        // Row ranges: per sequence on all tokens (a prompt chunk or one decode row),
        // or (after `select_outputs`) one output row per sequence.
        let spans: Vec<(usize, usize)> = if n_rows == self.inp.n_tokens {
            self.inp
                .seqs
                .iter()
                .map(|s| (s.row_start, s.n_rows))
                .collect()
        } else {
            (0..n_rows).map(|r| (r, 1)).collect()
        };
        if repacked {
            spans
        } else if !self.cpu || merge_chunks_on_cpu(dtype) {
            vec![(0, n_rows)]
        } else {
            // Decode rows together, each prompt chunk on its own; batch-invariant
            // decode rows of K-quant weights in groups small enough for ggml's dot
            // products (see `TILED_MIN_ROWS`).
            let cap = if self.invariant && tiled_on_cpu(dtype) {
                TILED_MIN_ROWS - 1
            } else {
                usize::MAX
            };
            let mut groups: Vec<(usize, usize)> = Vec::new();
            for (i, &(start, rows)) in spans.iter().enumerate() {
                let prev_single = i > 0 && spans[i - 1].1 == 1;
                match groups.last_mut() {
                    Some(g) if rows == 1 && prev_single && g.1 < cap => g.1 += 1,
                    _ => groups.push((start, rows)),
                }
            }
            groups
        }
    }

    /// Concatenates `parts` along `dim` pairwise, so each element is copied
    /// O(log parts) times rather than once per later part.
    pub(crate) fn concat_all(&self, mut parts: Vec<Tensor<'a>>, dim: usize) -> Tensor<'a> {
        while parts.len() > 1 {
            parts = parts
                .chunks(2)
                .map(|p| match p {
                    [a, b] => self.ctx.concat(*a, *b, dim),
                    [a] => *a,
                    _ => unreachable!("chunks of two"),
                })
                .collect();
        }
        parts.pop().expect("at least one part")
    }

    /// Splits `[n_heads * dim, n_tokens]` into `[dim, n_heads, n_tokens]`.
    pub fn heads(&self, x: Tensor<'a>, n_heads: usize, dim: usize) -> Tensor<'a> {
        self.ctx
            .reshape(x, &[dim as i64, n_heads as i64, self.inp.n_tokens as i64])
    }

    /// Rotary embedding for layer `il`.
    pub fn rope(&self, x: Tensor<'a>, il: usize) -> Tensor<'a> {
        self.rope_with_factors(x, il, None)
    }

    /// Rotary embedding for layer `il` with per-pair frequency divisors
    /// (`rope_freqs.weight`: Llama 3's long-context scaling).
    pub fn rope_with_factors(
        &self,
        x: Tensor<'a>,
        il: usize,
        factors: Option<WeightId>,
    ) -> Tensor<'a> {
        match (self.hp.rope_sections, self.inp.pos_multi) {
            (Some(sections), Some(pos)) => {
                self.ctx.rope_multi(x, pos, self.hp.rope_for(il), sections)
            }
            _ => {
                let f = factors.map(|w| self.wt(w));
                self.ctx.rope(x, self.inp.pos, f, self.hp.rope_for(il))
            }
        }
    }

    /// Queries `[dim, n_head, n_tokens]` times their position's temperature scale,
    /// when the model has one ([`crate::AttnTemp`]); unchanged otherwise.
    pub fn attn_temperature(&self, q: Tensor<'a>) -> Tensor<'a> {
        match self.inp.attn_temp {
            Some(s) => self.ctx.mul(q, s),
            None => q,
        }
    }

    /// Writes this step's K/V (`[dim, n_head_kv, n_tokens]`) into layer `il`'s pool, then
    /// attends the queries (`q`: `[dim, n_head, n_tokens]`) op by op as planned in
    /// [`crate::attn`] for the layer's cache group, each row over its own cells.
    /// Returns `[n_head * dim_v, n_tokens]`.
    pub fn attention(
        &mut self,
        il: usize,
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        scale: f32,
    ) -> Tensor<'a> {
        self.attention_with_sinks(il, q, k, v, scale, None)
    }

    /// [`Builder::attention`] with per-head attention sinks (`[n_head]` F32, GPT-OSS):
    /// one more logit per head in each softmax's normalisation, with no value.
    pub fn attention_with_sinks(
        &mut self,
        il: usize,
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        scale: f32,
        sinks: Option<WeightId>,
    ) -> Tensor<'a> {
        let sinks = sinks.map(|w| self.wt(w));
        let (ctx, hp, n_t) = (self.ctx, self.hp, self.inp.n_tokens as i64);
        // A view, not a reshape, of the (roped, contiguous) K: ggml-cuda fuses
        // rope → view → set_rows into one kernel (a reshape breaks the pattern).
        // That kernel addresses the cache with a 32-bit element offset (row index ×
        // row stride, rope.cu), which wraps past 2^31 elements and writes out of
        // bounds: our cache spans the whole KV budget, not one context, so on a GPU
        // with a large budget a reshape keeps the unfused, 64-bit `set_rows`.
        let k_cache = self.kv.k(il);
        let shape = [hp.n_embd_k_of(il) as i64, n_t];
        let k_rows = match fused_offsets_fit(k_cache) {
            true => ctx.view(k, &shape, &[k.nb()[2]], 0),
            false => ctx.reshape(k, &shape),
        };
        let v_rows = ctx.reshape(v, &[hp.n_embd_v_of(il) as i64, n_t]);
        let group = self.kv.group_of(il);
        let slots = self.inp.slots[group];
        // Write first (and make the reads below depend on the writes).
        let k_all = ctx.set_rows(k_cache, k_rows, slots);
        let v_all = ctx.set_rows(self.kv.v(il), v_rows, slots);
        self.graph.expand(k_all);
        self.graph.expand(v_all);
        if self.written.len() < hp.n_layer {
            self.written.resize(hp.n_layer, None);
        }
        self.written[il] = Some((k_all, v_all));
        self.attend(il, q, k_all, v_all, scale, sinks)
    }

    /// Attention of a layer that keeps no K/V (Gemma 4's KV-sharing layers): the
    /// queries attend over the K/V its source layer wrote this step, with that
    /// layer's cells and masks.
    pub fn attention_shared(&mut self, il: usize, q: Tensor<'a>, scale: f32) -> Tensor<'a> {
        let src = self.hp.kv_source[il];
        let (k_all, v_all) = self
            .written
            .get(src)
            .copied()
            .flatten()
            .expect("a KV-sharing layer is built after its source layer");
        self.attend(il, q, k_all, v_all, scale, None)
    }

    /// Attends the queries over the pools `k_all`/`v_all` of layer `il`'s group.
    fn attend(
        &mut self,
        il: usize,
        q: Tensor<'a>,
        k_all: Tensor<'a>,
        v_all: Tensor<'a>,
        scale: f32,
        sinks: Option<Tensor<'a>>,
    ) -> Tensor<'a> {
        let (ctx, hp, n_t) = (self.ctx, self.hp, self.inp.n_tokens as i64);
        let group = self.kv.group_of(il);
        let (hd, hd_v, n_kv_h) = (
            hp.head_dim_of(il) as i64,
            hp.head_dim_v_of(il) as i64,
            hp.n_head_kv_of(il) as i64,
        );
        let q_nb = q.nb();
        let ops: Vec<AttnInputs<'a>> = self.inp.attn[group].clone();
        let mut outs: Vec<Tensor<'a>> = Vec::with_capacity(ops.len());
        for op in &ops {
            if let Some(st) = &op.strided {
                outs.push(self.strided_attention(il, q, k_all, v_all, op, st, scale, sinks));
                continue;
            }
            let rows = op.n_rows as i64;
            let qs = ctx.view(
                q,
                &[hd, hp.n_head as i64, rows],
                &[q_nb[1], q_nb[2]],
                op.row_start * q_nb[2],
            );
            let mask = layer_mask(hp, il, op);
            let ks = self.window(k_all, &op.runs);
            let ks = ctx.reshape(ks, &[hd, n_kv_h, ks.ne()[1]]);
            let mut q = ctx.permute(qs, [0, 2, 1, 3]);
            let k = ctx.permute(ks, [0, 2, 1, 3]);
            if let Some(cells) = op.cells {
                let o = matmul_attention(ctx, q, k, v_all, cells, mask, scale, sinks);
                outs.push(ctx.reshape(o, &[hd_v, hp.n_head as i64, 1]));
                continue;
            }
            let vs = self.window(v_all, &op.runs);
            let vs = ctx.reshape(vs, &[hd_v, n_kv_h, vs.ne()[1]]);
            let v = ctx.permute(vs, [0, 2, 1, 3]);
            if op.fa_rows > op.n_rows {
                // Zero queries after the real ones (their outputs are dropped).
                q = ctx.pad(q, [0, (op.fa_rows - op.n_rows) as i32, 0, 0]);
            }
            let o = ctx.flash_attn(q, k, v, mask, scale); // [dim_v, n_head, fa_rows]
            if let Some(s) = sinks {
                ctx.flash_attn_add_sinks(o, s);
            }
            outs.push(if op.fa_rows > op.n_rows {
                ctx.view(o, &[o.ne()[0], o.ne()[1], rows], &[o.nb()[1], o.nb()[2]], 0)
            } else {
                o
            });
        }
        let out = self.concat_all(outs, 2);
        ctx.reshape(out, &[hp.n_head as i64 * hd_v, n_t])
    }

    /// Decode rows attending in one op over equally spaced regions of the pools
    /// (see [`crate::attn`]), or of their windows gathered from the pools: their
    /// queries gathered into region order, K and V as 4-D views whose last
    /// dimension steps by the stride, the outputs gathered back into row order.
    /// Returns `[dim_v, n_head, rows]`.
    #[allow(clippy::too_many_arguments)]
    fn strided_attention(
        &self,
        il: usize,
        q: Tensor<'a>,
        k_all: Tensor<'a>,
        v_all: Tensor<'a>,
        op: &AttnInputs<'a>,
        st: &StridedInputs<'a>,
        scale: f32,
        sinks: Option<Tensor<'a>>,
    ) -> Tensor<'a> {
        let (ctx, hp, n_t) = (self.ctx, self.hp, self.inp.n_tokens as i64);
        let (first, width) = (op.runs[0].start, op.runs[0].len as i64);
        let n_regions = st.q_rows.ne()[0];
        // A gathered op reads copies of the rows' windows: F16 straight from the
        // pool where the op runs on a GPU; ggml's CPU get_rows gives F32, cast back
        // to the pool's F16 (the same values).
        let (k_all, v_all) = match st.gather {
            Some(cells) => {
                let g = |pool: Tensor<'a>| match self.gpu_kv {
                    true => ctx.get_rows_f16_on_gpu(pool, cells),
                    false => ctx.cast(ctx.get_rows(pool, cells), pool.dtype()),
                };
                (g(k_all), g(v_all))
            }
            None => (k_all, v_all),
        };
        let (hd, n_head) = (hp.head_dim_of(il) as i64, hp.n_head as i64);
        let q2 = ctx.reshape(q, &[hd * n_head, n_t]);
        let qr = ctx.get_rows(q2, st.q_rows); // [hd * n_head, regions]
        let qr = ctx.reshape(qr, &[hd, n_head, 1, n_regions]);
        let regions = |pool: Tensor<'a>, dim: usize| {
            let row = pool.nb()[1];
            let v = ctx.view(
                pool,
                &[dim as i64, hp.n_head_kv_of(il) as i64, width, n_regions],
                &[dim * pool.nb()[0], row, st.stride * row],
                first * row,
            );
            ctx.permute(v, [0, 2, 1, 3]) // [dim, width, n_head_kv, regions]
        };
        let k = regions(k_all, hp.head_dim_of(il));
        let v = regions(v_all, hp.head_dim_v_of(il));
        let mask = layer_mask(hp, il, op);
        let q = ctx.permute(qr, [0, 2, 1, 3]); // [hd, 1, n_head, regions]
        let o = ctx.flash_attn(q, k, v, mask, scale); // [dim_v, n_head, 1, regions]
        if let Some(s) = sinks {
            ctx.flash_attn_add_sinks(o, s);
        }
        let dv = hp.head_dim_v_of(il) as i64;
        let o = ctx.reshape(o, &[dv * n_head, n_regions]);
        let o = ctx.get_rows(o, st.regions); // [dim_v * n_head, rows]
        ctx.reshape(o, &[dv, n_head, op.n_rows as i64])
    }

    /// A sequence's attention window `[row, n_kv]` over a pool `[row, n_cells]`: a
    /// view when it is one run of cells, else a contiguous copy of the runs laid end
    /// to end.
    ///
    /// The copy is one block copy of `n_kv` pool cells placed so that the longest run
    /// lands where it belongs (usually the shared prefix, so it is already right),
    /// then each other run written over its place with `set_rows`. Both move whole
    /// rows on every thread (`concat` moves F16 elements one at a time on one
    /// thread: it made decoding after a prefix hit ~40 % slower). The writes are
    /// chained (each returns the window) and attention reads the last, so the
    /// window's memory is released after attention: copies into views that nothing
    /// reads kept every layer's window allocated for the whole step (99 MiB of
    /// compute buffers for SmolLM2 at 4K tokens).
    fn window(&mut self, pool: Tensor<'a>, runs: &[CellRun]) -> Tensor<'a> {
        let ctx = self.ctx;
        let (row, nb1, n_cells) = (pool.ne()[0], pool.nb()[1], pool.ne()[1] as usize);
        let cells =
            |start: usize, len: usize| ctx.view(pool, &[row, len as i64], &[nb1], start * nb1);
        if let [r] = runs {
            return cells(r.start, r.len);
        }
        let n_kv: usize = runs.iter().map(|r| r.len).sum();
        let mut offsets = Vec::with_capacity(runs.len());
        let mut at = 0;
        for r in runs {
            offsets.push(at);
            at += r.len;
        }
        // The run the block copy puts in place: the longest whose block fits the pool.
        let base_run = (0..runs.len())
            .filter(|&i| {
                runs[i].start >= offsets[i] && runs[i].start - offsets[i] + n_kv <= n_cells
            })
            .max_by_key(|&i| runs[i].len);
        let base = base_run.map_or(0, |i| runs[i].start - offsets[i]);
        let mut window = ctx.cont(cells(base, n_kv));
        for (i, r) in runs.iter().enumerate() {
            if Some(i) == base_run {
                continue;
            }
            let idx = self.window_rows(offsets[i], r.len);
            window = ctx.set_rows(window, cells(r.start, r.len), idx);
        }
        window
    }

    /// The index input `[offset, offset + len)` for [`Builder::window`], shared by
    /// every layer and by K and V.
    fn window_rows(&mut self, offset: usize, len: usize) -> Tensor<'a> {
        let rows = &mut self.inp.window_rows;
        if let Some((t, _)) = rows
            .iter()
            .find(|(_, v)| v.len() == len && v.first() == Some(&(offset as i64)))
        {
            return *t;
        }
        let t = self
            .ctx
            .new_input("inp_window_rows", DType::I64, &[len as i64]);
        rows.push((t, (offset as i64..(offset + len) as i64).collect()));
        t
    }

    /// Keeps only the rows whose logits are wanted (applied in the last layer, where
    /// everything after is row-wise).
    pub fn select_outputs(&self, x: Tensor<'a>) -> Tensor<'a> {
        self.ctx.get_rows(x, self.inp.out_ids)
    }

    /// Gated feed-forward: `down(act(gate x) * up x)`, SiLU or GELU.
    pub fn gated_ffn(
        &self,
        x: Tensor<'a>,
        gate: WeightId,
        up: WeightId,
        down: WeightId,
        gelu: bool,
    ) -> Tensor<'a> {
        let g = self.linear(gate, x, None);
        let u = self.linear(up, x, None);
        let h = if gelu {
            self.ctx.geglu_split(g, u)
        } else {
            self.ctx.swiglu_split(g, u)
        };
        self.linear(down, h, None)
    }
}

/// Whether every element offset into `cache` (one layer's K cells) fits the 32-bit
/// offset of ggml-cuda's fused rope → set_rows kernel.
fn fused_offsets_fit(cache: Tensor<'_>) -> bool {
    let [_, rows, _, _] = cache.ne();
    let nb = cache.nb();
    let stride = (nb[1] / nb[0].max(1)) as i64;
    rows.saturating_add(1).saturating_mul(stride) <= i64::from(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tempo9_ggml::{f16_bits_to_f32 as f16_to_f32, f32_to_f16_bits, Backend, Device, Scheduler};

    /// The fused rope → set_rows kernel is kept only where its 32-bit element
    /// offsets reach every cell: a 2 GiB F16 K of 64-wide rows fits (2^24 rows ×
    /// 64 = 2^30 elements); 2^25 rows (2^31 elements, on a GPU with a large KV
    /// budget) does not.
    #[test]
    fn fused_rope_set_rows_only_within_32_bit_offsets() {
        let ctx = Context::new(8, 0).unwrap();
        assert!(fused_offsets_fit(
            ctx.new_tensor(DType::F16, &[64, 1 << 24])
        ));
        assert!(!fused_offsets_fit(
            ctx.new_tensor(DType::F16, &[64, 1 << 25])
        ));
        // A layer's view into a larger pool counts its own rows.
        let pool = ctx.new_tensor(DType::F32, &[128, 1 << 24, 2]);
        assert!(fused_offsets_fit(ctx.view(
            pool,
            &[128, 1 << 20],
            &[pool.nb()[1]],
            0
        )));
        assert!(!fused_offsets_fit(ctx.view(
            pool,
            &[128, 1 << 24],
            &[pool.nb()[1]],
            0
        )));
    }

    /// The matmul path computes what flash attention computes (a GQA decode row
    /// over a long window with masked cells), both within F16 rounding of an f64
    /// reference; a wrong head mapping, mask or scale would be off by O(1).
    #[test]
    fn matmul_attention_matches_flash_attention() {
        attention_paths_match(None);
    }

    /// The same with attention sinks (GPT-OSS) large enough to take a visible share
    /// of each head's softmax (a sink of 5 against ~470 visible scores near 0: ~25 %).
    #[test]
    fn matmul_attention_with_sinks_matches_flash_attention() {
        attention_paths_match(Some(&[5.0, 4.0, 6.0, 3.0, 5.5, 0.0]));
    }

    fn attention_paths_match(sinks: Option<&[f32]>) {
        let (d, n_head, n_head_kv, n_cells, first, n_kv) = (64, 6, 2, 800, 50, 700);
        let row = d * n_head_kv;
        // Deterministic pseudo-random values in [-1, 1).
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        let q: Vec<f32> = (0..d * n_head).map(|_| 2.0 * rnd()).collect();
        let k: Vec<u16> = (0..row * n_cells).map(|_| f32_to_f16_bits(rnd())).collect();
        let v: Vec<u16> = (0..row * n_cells).map(|_| f32_to_f16_bits(rnd())).collect();
        // Every third cell and the last 100 are masked.
        let visible = |c: usize| c % 3 != 1 && c < n_kv - 100;
        let mask: Vec<u16> = (0..n_kv)
            .map(|c| {
                if visible(c) {
                    0
                } else {
                    crate::kv::NEG_INF_F16
                }
            })
            .collect();
        let cells: Vec<i32> = (first..first + n_kv).map(|c| c as i32).collect();
        let scale = 0.125f32;

        let ctx = Context::new(64, 64).expect("context");
        let ti = |name: &str, t: DType, shape: &[i64]| ctx.new_input(name, t, shape);
        let (d_, hk, h) = (d as i64, n_head_kv as i64, n_head as i64);
        let tq = ti("q", DType::F32, &[d_, 1, h]);
        let tk = ti("k", DType::F16, &[row as i64, n_cells as i64]);
        let tv = ti("v", DType::F16, &[row as i64, n_cells as i64]);
        let tm = ti("mask", DType::F16, &[n_kv as i64, 1]);
        let tc = ti("cells", DType::I32, &[n_kv as i64]);
        let ts = sinks.map(|_| ti("sinks", DType::F32, &[n_head as i64]));
        let ctx = &ctx;
        let window = |pool| {
            let w = ctx.view(
                pool,
                &[d_, hk, n_kv as i64],
                &[d * 2, row * 2],
                first * row * 2,
            );
            ctx.permute(w, [0, 2, 1, 3]) // [d, n_kv, n_head_kv]
        };
        let mm = matmul_attention(ctx, tq, window(tk), tv, tc, tm, scale, ts); // [d, 1, h]
        let fa = ctx.flash_attn(tq, window(tk), window(tv), tm, scale); // [d, h, 1]
        if let Some(t) = ts {
            ctx.flash_attn_add_sinks(fa, t);
        }
        let mut graph = ctx.new_graph(64);
        for t in [mm, fa] {
            t.set_output();
            graph.expand(t);
        }
        let cpu = Backend::new(Device::cpu()).expect("cpu backend");
        let mut sched = Scheduler::new(vec![cpu], 256).expect("scheduler");
        sched.alloc(&graph).expect("alloc");
        tq.write(&q).unwrap();
        tk.write(&k).unwrap();
        tv.write(&v).unwrap();
        tm.write(&mask).unwrap();
        tc.write(&cells).unwrap();
        if let (Some(t), Some(v)) = (ts, sinks) {
            t.write(v).unwrap();
        }
        sched.compute(&graph).expect("compute");
        let (mut got_mm, mut got_fa) = (vec![0f32; d * n_head], vec![0f32; d * n_head]);
        mm.read_f32(0, &mut got_mm).unwrap();
        fa.read_f32(0, &mut got_fa).unwrap();

        let (mut err_mm, mut err_fa) = (0f64, 0f64);
        for hh in 0..n_head {
            let kvh = hh / (n_head / n_head_kv);
            let qh = &q[hh * d..(hh + 1) * d];
            let at = |pool: &[u16], c: usize, i: usize| {
                f16_to_f32(pool[(first + c) * row + kvh * d + i]) as f64
            };
            // Both kernels round q to F16 for the dot products.
            let qr: Vec<f64> = qh
                .iter()
                .map(|&x| f16_to_f32(f32_to_f16_bits(x)) as f64)
                .collect();
            let s: Vec<Option<f64>> = (0..n_kv)
                .map(|c| {
                    visible(c)
                        .then(|| (0..d).map(|i| qr[i] * at(&k, c, i)).sum::<f64>() * scale as f64)
                })
                .collect();
            let sink = sinks.map(|v| v[hh] as f64);
            let m = s
                .iter()
                .flatten()
                .chain(&sink)
                .cloned()
                .fold(f64::MIN, f64::max);
            // A sink joins the normalisation only.
            let z: f64 = s.iter().flatten().chain(&sink).map(|x| (x - m).exp()).sum();
            for i in 0..d {
                let want: f64 = (0..n_kv)
                    .filter_map(|c| s[c].map(|x| (x - m).exp() / z * at(&v, c, i)))
                    .sum();
                err_mm = err_mm.max((got_mm[hh * d + i] as f64 - want).abs());
                err_fa = err_fa.max((got_fa[hh * d + i] as f64 - want).abs());
            }
        }
        eprintln!("max |error| vs f64: matmul {err_mm:.2e}, flash attention {err_fa:.2e}");
        assert!(err_mm < 1e-6, "matmul attention error {err_mm}");
        assert!(err_fa < 2e-3, "flash attention error {err_fa}");
    }
}
