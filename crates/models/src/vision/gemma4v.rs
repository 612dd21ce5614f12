//! Gemma 4's vision tower (`gemma4v` projector) as a ggml graph, in llama.cpp's
//! formulation (`tools/mtmd/models/gemma4v.cpp` with `clip_graph::build_vit`):
//! pixels mapped to [-1, 1] in the graph, a bias-free patch convolution, learned
//! positions from two tables (one row per column, one per row), ViT blocks with
//! RMS sandwich norms, per-head Q/K norms, an unweighted V norm, 2-D NeoX rope
//! (x on the first half of each head, y on the second), unscaled attention, a
//! gated feed-forward and a per-block output scalar; then `n_merge × n_merge`
//! average pooling, a `sqrt(width)` scale, the optional standardisation, an
//! unweighted RMS norm and the input projection. Linear layers clamp their
//! input and output where the file has `Gemma4ClippableLinear` bounds.

use tempo9_ggml::{Context, DType, RopeParams, Tensor};
use tempo9_gguf::{GgmlType, GgufFile};

use super::mmproj::{FfnAct, VisionHParams};
use crate::weights::{SpecList, WeightId, WeightUse, Weights};
use crate::ModelError;

/// `GGML_ROPE_TYPE_NEOX`: rotates the two halves of the rotated span.
const ROPE_NEOX: i32 = 2;
/// llama.cpp's rope base for this tower.
const ROPE_THETA: f32 = 100.0;

/// A projection with its optional clamp bounds (`input_min`, `input_max`,
/// `output_min`, `output_max`; the missing ones unbounded, as llama.cpp reads
/// them).
#[derive(Clone, Copy)]
struct Linear {
    w: WeightId,
    clamp: Option<[f32; 4]>,
}

/// Ids of one ViT block's weights.
struct Block {
    ln1: WeightId,
    q: Linear,
    k: Linear,
    v: Linear,
    q_norm: WeightId,
    k_norm: WeightId,
    out: Linear,
    attn_post_norm: WeightId,
    ln2: WeightId,
    gate: Linear,
    up: Linear,
    down: Linear,
    ffn_post_norm: WeightId,
    out_scale: Option<WeightId>,
}

/// Ids of the tower's weights.
pub(super) struct Gemma4VWeights {
    patch: WeightId,
    /// `[n_embd, n_pos_table, 2]`: the x table, then the y table.
    pos: WeightId,
    n_pos_table: usize,
    blocks: Vec<Block>,
    /// `(std_bias, std_scale)`, when the file standardises the pooled output.
    std: Option<(WeightId, WeightId)>,
    proj: Linear,
}

/// A clamp scalar of `base` (`<base>.input_max`, ...), if the file has it.
fn scalar(file: &GgufFile, base: &str, what: &str) -> Result<Option<f32>, ModelError> {
    let name = format!("{base}.{what}");
    let Some(t) = file.tensor(&name) else {
        return Ok(None);
    };
    if t.dtype != GgmlType::F32 || t.n_bytes != 4 {
        return Err(ModelError::BadHParams(format!(
            "{name}: a clamp bound must be one F32 value"
        )));
    }
    let b = file.tensor_bytes(t);
    Ok(Some(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
}

/// Declares projection `<name>.weight` and reads its clamp bounds.
fn linear(
    file: &GgufFile,
    specs: &mut SpecList,
    name: &str,
    shape: &[usize],
) -> Result<Linear, ModelError> {
    let w = specs.add(format!("{name}.weight"), shape, WeightUse::MatMul);
    let bounds = [
        scalar(file, name, "input_min")?,
        scalar(file, name, "input_max")?,
        scalar(file, name, "output_min")?,
        scalar(file, name, "output_max")?,
    ];
    let clamp = bounds.iter().any(Option::is_some).then(|| {
        let [a, b, c, d] = bounds;
        [
            a.unwrap_or(-f32::MAX),
            b.unwrap_or(f32::MAX),
            c.unwrap_or(-f32::MAX),
            d.unwrap_or(f32::MAX),
        ]
    });
    Ok(Linear { w, clamp })
}

impl Gemma4VWeights {
    /// Declares every tensor with its shape (innermost first) as the converter
    /// writes them, and reads the clamp scalars.
    pub(super) fn declare(
        hp: &VisionHParams,
        file: &GgufFile,
        specs: &mut SpecList,
    ) -> Result<Self, ModelError> {
        let (e, ff, p, proj) = (hp.n_embd, hp.n_ff, hp.patch_size, hp.projection_dim);
        let d_head = e / hp.n_head;
        let mut blocks = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let n = |s: &str| format!("v.blk.{il}.{s}");
            let mut lin = |s: &str, shape: &[usize]| linear(file, specs, &n(s), shape);
            let q = lin("attn_q", &[e, e])?;
            let k = lin("attn_k", &[e, e])?;
            let v = lin("attn_v", &[e, e])?;
            let out = lin("attn_out", &[e, e])?;
            let gate = lin("ffn_gate", &[e, ff])?;
            let up = lin("ffn_up", &[e, ff])?;
            let down = lin("ffn_down", &[ff, e])?;
            let mut norm = |s: &str, len: usize| {
                specs.add(n(&format!("{s}.weight")), &[len], WeightUse::Elementwise)
            };
            blocks.push(Block {
                ln1: norm("ln1", e),
                q,
                k,
                v,
                q_norm: norm("attn_q_norm", d_head),
                k_norm: norm("attn_k_norm", d_head),
                out,
                attn_post_norm: norm("attn_post_norm", e),
                ln2: norm("ln2", e),
                gate,
                up,
                down,
                ffn_post_norm: norm("ffn_post_norm", e),
                out_scale: file
                    .tensor(&n("out_scale.weight"))
                    .map(|_| norm("out_scale", 1)),
            });
        }
        let n_pos_table = file
            .tensor("v.position_embd.weight")
            .and_then(|t| t.shape.get(1).copied())
            .ok_or_else(|| ModelError::MissingTensor("v.position_embd.weight".into()))?
            as usize;
        let std = match (file.tensor("v.std_bias"), file.tensor("v.std_scale")) {
            (Some(_), Some(_)) => Some((
                specs.add("v.std_bias", &[e], WeightUse::Elementwise),
                specs.add("v.std_scale", &[e], WeightUse::Elementwise),
            )),
            _ => None,
        };
        Ok(Gemma4VWeights {
            patch: specs.add("v.patch_embd.weight", &[p, p, 3, e], WeightUse::MatMul),
            pos: specs.add(
                "v.position_embd.weight",
                &[e, n_pos_table, 2],
                WeightUse::Rows,
            ),
            n_pos_table,
            blocks,
            std,
            proj: linear(file, specs, "mm.input_projection", &[e, proj])?,
        })
    }

    /// Most patches per side the position tables cover.
    pub(super) fn max_patches_per_side(&self) -> usize {
        self.n_pos_table
    }
}

/// The graph's inputs: the image `[w, h, 3]` and each patch's column and row.
pub(super) struct GraphInputs<'c> {
    pub image: Tensor<'c>,
    pub pos_x: Tensor<'c>,
    pub pos_y: Tensor<'c>,
}

/// Builds the tower over a `px × py`-patch image; returns the output
/// `[projection_dim, (px / n_merge) * (py / n_merge)]`, pooled tokens row-major.
pub(super) fn build<'c>(
    ctx: &'c Context,
    hp: &VisionHParams,
    ids: &Gemma4VWeights,
    w: &'c Weights,
    inp: &GraphInputs<'c>,
    (px, py): (usize, usize),
) -> Tensor<'c> {
    let (e, n_head) = (hp.n_embd as i64, hp.n_head as i64);
    let d_head = e / n_head;
    let (px, py) = (px as i64, py as i64);
    let n_pos = px * py;
    let g = |id: WeightId| w.get(id);
    let norm = |x: Tensor<'c>, wt: WeightId| ctx.mul(ctx.rms_norm(x, hp.eps), g(wt));
    // Gemma4ClippableLinear: clamp in, multiply, clamp out.
    let mm = |l: Linear, x: Tensor<'c>| match l.clamp {
        None => ctx.mul_mat(g(l.w), x),
        Some([in_lo, in_hi, out_lo, out_hi]) => {
            let y = ctx.mul_mat(g(l.w), ctx.clamp(x, in_lo, in_hi));
            ctx.clamp(y, out_lo, out_hi)
        }
    };

    // Pixels in [0, 1] to [-1, 1]; patches [px, py, e] → [e, n_pos], no bias.
    let img = ctx.scale_bias(inp.image, 2.0, -1.0);
    let x = ctx.conv_2d(g(ids.patch), img, [hp.patch_size as i32; 2], [0; 2], [1; 2]);
    let x = ctx.cont(ctx.transpose(ctx.reshape(x, &[n_pos, e])));
    // Learned positions: a row of the x table per column, of the y table per row.
    let pos = g(ids.pos);
    let row = pos.nb()[1];
    let table = ids.n_pos_table as i64;
    let tbl_x = ctx.view(pos, &[e, table], &[row], 0);
    let tbl_y = ctx.view(pos, &[e, table], &[row], table as usize * row);
    let x = ctx.add(x, ctx.get_rows(tbl_x, inp.pos_x));
    let mut x = ctx.add(x, ctx.get_rows(tbl_y, inp.pos_y));

    let rope = RopeParams {
        n_dims: (d_head / 2) as i32,
        mode: ROPE_NEOX,
        n_ctx_orig: 0,
        freq_base: ROPE_THETA,
        freq_scale: 1.0,
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast: 0.0,
        beta_slow: 0.0,
    };
    // x positions rotate the first half of each head, y positions the second.
    let add_pos = |t: Tensor<'c>| {
        let t = ctx.rope_at(t, inp.pos_x, &rope, 0);
        ctx.rope_at(t, inp.pos_y, &rope, (d_head / 2) as i32)
    };
    let heads = |t: Tensor<'c>| ctx.reshape(t, &[d_head, n_head, n_pos]);
    for b in &ids.blocks {
        let cur = norm(x, b.ln1);
        let q = norm(heads(mm(b.q, cur)), b.q_norm);
        let k = norm(heads(mm(b.k, cur)), b.k_norm);
        let v = heads(mm(b.v, cur));
        let (q, k) = (add_pos(q), add_pos(k));
        let v = ctx.rms_norm(v, hp.eps);
        // As llama.cpp's CPU default (flash attention on): K and V in F16;
        // attention unscaled (kq_scale 1).
        let q = ctx.permute(q, [0, 2, 1, 3]);
        let k = ctx.cast(ctx.permute(k, [0, 2, 1, 3]), DType::F16);
        let v = ctx.cast(ctx.permute(v, [0, 2, 1, 3]), DType::F16);
        let att = ctx.reshape(ctx.flash_attn_unmasked(q, k, v, 1.0), &[e, n_pos]);
        let cur = norm(mm(b.out, att), b.attn_post_norm);
        x = ctx.add(cur, x);

        let cur = norm(x, b.ln2);
        let up = mm(b.up, cur);
        let gate = mm(b.gate, cur);
        let act = match hp.ffn_act {
            FfnAct::Gelu => ctx.geglu_split(gate, up),
            FfnAct::Silu => ctx.swiglu_split(gate, up),
            FfnAct::GeluQuick => ctx.geglu_quick_split(gate, up),
        };
        let cur = norm(mm(b.down, act), b.ffn_post_norm);
        x = ctx.add(x, cur);
        if let Some(s) = b.out_scale {
            x = ctx.mul(x, g(s));
        }
    }

    // Pooler: average over k × k patches on the patch grid, then scale.
    let k = hp.n_merge as i64;
    let grid = ctx.reshape(ctx.cont(ctx.transpose(x)), &[px, py, e, 1]);
    let pooled = ctx.pool_2d_avg(grid, k as i32);
    let n_out = (px / k) * (py / k);
    let cur = ctx.cont(ctx.transpose(ctx.reshape(pooled, &[n_out, e])));
    let mut cur = ctx.scale(cur, (e as f32).sqrt());
    if let Some((bias, scale)) = ids.std {
        cur = ctx.mul(ctx.sub(cur, g(bias)), g(scale));
    }
    // The multimodal embedder: unweighted RMS norm, then the projection.
    mm(ids.proj, ctx.rms_norm(cur, hp.eps))
}

/// Each patch's (column, row), row-major over the `px × py` patch grid, as
/// llama.cpp sets `pos_x` / `pos_y`.
pub(super) fn positions(px: usize, py: usize) -> (Vec<i32>, Vec<i32>) {
    (0..px * py)
        .map(|i| ((i % px) as i32, (i / px) as i32))
        .unzip()
}
