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
    pub slots: Tensor<'a>,
    pub seqs: Vec<SeqInputs<'a>>,
    pub out_ids: Tensor<'a>,
    pub n_tokens: usize,
}

/// One sequence's attention inputs.
pub(crate) struct SeqInputs<'a> {
    pub row_start: usize,
    pub n_rows: usize,
    pub window: Vec<CellRun>,
    pub mask: Tensor<'a>,
    pub mask_swa: Option<Tensor<'a>>,
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
}

/// Weight types whose CPU matmul goes through llamafile's tinyBLAS when several rows
/// multiply at once: its tiles (and so its rounding) depend on the row count.
/// Other types use one dot product per output, the same for any row count.
fn batch_variant_on_cpu(t: DType) -> bool {
    // F32, F16, Q4_0, Q5_0, Q8_0, IQ4_NL, BF16 (ggml type ids).
    matches!(t.raw(), 0 | 1 | 2 | 6 | 8 | 20 | 30)
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

    /// `rms_norm(x) * w`.
    pub fn rms_norm(&self, x: Tensor<'a>, w: WeightId) -> Tensor<'a> {
        let n = self.ctx.rms_norm(x, self.hp.rms_eps);
        self.ctx.mul(n, self.wt(w))
    }

    /// `w x (+ b)`, with the rows of `x` split into groups that each sequence would
    /// also see alone, so its numbers do not depend on what else is in the step:
    /// ggml's CPU matmuls choose kernels and tiles by row count, and some round
    /// differently (repacked weights: gemm for row groups of four, gemv for the rest).
    /// Prompt chunks multiply on their own; single-row decodes multiply together,
    /// except on weights whose CPU kernel depends on the row count (repacked
    /// layouts, tinyBLAS types), where each row goes alone.
    pub fn linear(&self, w: WeightId, x: Tensor<'a>, b: Option<WeightId>) -> Tensor<'a> {
        let n_rows = x.ne()[1] as usize;
        let repacked =
            self.w.is_repacked(w) || (self.cpu && batch_variant_on_cpu(self.wt(w).dtype()));
        // Row ranges: per sequence on all tokens, or (after `select_outputs`) one
        // output row per sequence.
        let spans: Vec<(usize, usize)> = if n_rows == self.inp.n_tokens {
            self.inp
                .seqs
                .iter()
                .map(|s| (s.row_start, s.n_rows))
                .collect()
        } else {
            (0..n_rows).map(|r| (r, 1)).collect()
        };
        // (first row, rows, made of single-row spans only)
        let mut groups: Vec<(usize, usize, bool)> = Vec::new();
        for (start, rows) in spans {
            match groups.last_mut() {
                // Adjacent single rows share one matmul unless the weight is repacked.
                Some(g) if !repacked && rows == 1 && g.2 && g.0 + g.1 == start => g.1 += 1,
                _ => groups.push((start, rows, rows == 1)),
            }
        }
        let y = if groups.len() > 1 {
            let nb1 = x.nb()[1];
            let mut y: Option<Tensor<'a>> = None;
            for &(start, rows, _) in &groups {
                let xs = self
                    .ctx
                    .view(x, &[x.ne()[0], rows as i64], &[nb1], start * nb1);
                let ys = self.ctx.mul_mat(self.wt(w), xs);
                y = Some(match y {
                    None => ys,
                    Some(prev) => self.ctx.concat(prev, ys, 1),
                });
            }
            y.expect("at least one group")
        } else {
            self.ctx.mul_mat(self.wt(w), x)
        };
        match b {
            Some(b) => self.ctx.add(y, self.wt(b)),
            None => y,
        }
    }

    /// Splits `[n_heads * dim, n_tokens]` into `[dim, n_heads, n_tokens]`.
    pub fn heads(&self, x: Tensor<'a>, n_heads: usize, dim: usize) -> Tensor<'a> {
        self.ctx
            .reshape(x, &[dim as i64, n_heads as i64, self.inp.n_tokens as i64])
    }

    /// Rotary embedding for layer `il`.
    pub fn rope(&self, x: Tensor<'a>, il: usize) -> Tensor<'a> {
        self.ctx.rope(x, self.inp.pos, self.hp.rope_for(il))
    }

    /// Writes this step's K/V (`[dim, n_head_kv, n_tokens]`) into layer `il`'s pool, then
    /// attends each sequence's queries (`q`: `[dim, n_head, n_tokens]`) over its own KV
    /// window with its own mask. Returns `[n_head * dim_v, n_tokens]`.
    ///
    /// One attention op per sequence keeps a sequence's arithmetic identical whatever
    /// else shares the step (ggml picks kernels by query count and window length).
    pub fn attention(
        &mut self,
        il: usize,
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        scale: f32,
    ) -> Tensor<'a> {
        let (ctx, hp, n_t) = (self.ctx, self.hp, self.inp.n_tokens as i64);
        let k_rows = ctx.reshape(k, &[hp.n_embd_k() as i64, n_t]);
        let v_rows = ctx.reshape(v, &[hp.n_embd_v() as i64, n_t]);
        // Write first (and make the reads below depend on the writes).
        let k_all = ctx.set_rows(self.kv.k(il), k_rows, self.inp.slots);
        let v_all = ctx.set_rows(self.kv.v(il), v_rows, self.inp.slots);
        self.graph.expand(k_all);
        self.graph.expand(v_all);
        let q_nb = q.nb();
        let mut out: Option<Tensor<'a>> = None;
        for s in &self.inp.seqs {
            let rows = s.n_rows as i64;
            let qs = ctx.view(
                q,
                &[hp.head_dim as i64, hp.n_head as i64, rows],
                &[q_nb[1], q_nb[2]],
                s.row_start * q_nb[2],
            );
            let ks = self.window(k_all, &s.window);
            let vs = self.window(v_all, &s.window);
            let ks = ctx.reshape(ks, &[hp.head_dim as i64, hp.n_head_kv as i64, ks.ne()[1]]);
            let vs = ctx.reshape(vs, &[hp.head_dim_v as i64, hp.n_head_kv as i64, vs.ne()[1]]);
            let mask = match (hp.is_swa[il], s.mask_swa) {
                (true, Some(m)) => m,
                _ => s.mask,
            };
            let q = ctx.permute(qs, [0, 2, 1, 3]);
            let k = ctx.permute(ks, [0, 2, 1, 3]);
            let v = ctx.permute(vs, [0, 2, 1, 3]);
            let o = ctx.flash_attn(q, k, v, mask, scale); // [dim_v, n_head, rows]
            out = Some(match out {
                None => o,
                Some(prev) => ctx.concat(prev, o, 2),
            });
        }
        let out = out.expect("a step has at least one sequence");
        ctx.reshape(out, &[(hp.n_head * hp.head_dim_v) as i64, n_t])
    }

    /// A sequence's attention window `[row, n_kv]` over a pool `[row, n_cells]`: a
    /// view when it is one run of cells, else the runs copied end to end (pairwise,
    /// so each cell is copied O(log runs) times).
    fn window(&self, pool: Tensor<'a>, runs: &[CellRun]) -> Tensor<'a> {
        let ctx = self.ctx;
        let (row, nb1) = (pool.ne()[0], pool.nb()[1]);
        let mut parts: Vec<Tensor<'a>> = runs
            .iter()
            .map(|r| ctx.view(pool, &[row, r.len as i64], &[nb1], r.start * nb1))
            .collect();
        while parts.len() > 1 {
            parts = parts
                .chunks(2)
                .map(|p| match p {
                    [a, b] => ctx.concat(*a, *b, 1),
                    [a] => *a,
                    _ => unreachable!("chunks of two"),
                })
                .collect();
        }
        parts.pop().expect("a window has at least one run")
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
