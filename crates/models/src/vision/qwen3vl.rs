//! Qwen3-VL's vision tower (`qwen3vl_merger` projector) as a ggml graph, in
//! llama.cpp's formulation (`tools/mtmd/models/qwen3vl.cpp`): the patch
//! embedding as two 2-D convolutions (the converter splits the checkpoint's
//! 2-frame 3-D convolution; a still image is both frames, so the two add up),
//! patches reordered into 2×2 merge blocks, learned positions resized
//! bilinearly to the grid, ViT blocks with 2-D M-RoPE, the 2×2 merger, and the
//! deepstack mergers on the layers the file names, concatenated after it.

use tempo9_ggml::{Context, DType, RopeParams, Tensor};

use super::mmproj::VisionHParams;
use crate::weights::{SpecList, WeightId, WeightUse, Weights};

/// `GGML_ROPE_TYPE_VISION`: multi-section rope whose sections rotate
/// (y, x, y, x) halves of each head.
const ROPE_VISION: i32 = 24;

/// Ids of one ViT block's weights.
struct Block {
    ln1: (WeightId, WeightId),
    qkv: (WeightId, WeightId),
    out: (WeightId, WeightId),
    ln2: (WeightId, WeightId),
    up: (WeightId, WeightId),
    down: (WeightId, WeightId),
    /// The deepstack merger fed by this block's output: norm, fc1, fc2.
    deepstack: Option<[(WeightId, WeightId); 3]>,
}

/// Ids of the tower's weights.
pub(super) struct Qwen3VlWeights {
    patch: [WeightId; 2],
    patch_bias: WeightId,
    pos: WeightId,
    blocks: Vec<Block>,
    post_ln: (WeightId, WeightId),
    mm0: (WeightId, WeightId),
    mm2: (WeightId, WeightId),
}

impl Qwen3VlWeights {
    /// Declares every tensor with its shape (innermost first) as the converter
    /// writes them.
    pub(super) fn declare(hp: &VisionHParams, n_pos_embd: usize, specs: &mut SpecList) -> Self {
        let (e, ff, p, proj) = (hp.n_embd, hp.n_ff, hp.patch_size, hp.projection_dim);
        let e4 = e * hp.n_merge * hp.n_merge;
        let mut wb = |name: &str, shape: &[usize], usage: WeightUse| {
            let w = specs.add(format!("{name}.weight"), shape, usage);
            let b = specs.add(
                format!("{name}.bias"),
                &shape[shape.len() - 1..],
                WeightUse::Elementwise,
            );
            (w, b)
        };
        let blocks = (0..hp.n_layer)
            .map(|il| {
                let n = |s: &str| format!("v.blk.{il}.{s}");
                let d = |s: &str| format!("v.deepstack.{il}.{s}");
                Block {
                    ln1: wb(&n("ln1"), &[e], WeightUse::Elementwise),
                    qkv: wb(&n("attn_qkv"), &[e, 3 * e], WeightUse::MatMul),
                    out: wb(&n("attn_out"), &[e, e], WeightUse::MatMul),
                    ln2: wb(&n("ln2"), &[e], WeightUse::Elementwise),
                    up: wb(&n("ffn_up"), &[e, ff], WeightUse::MatMul),
                    down: wb(&n("ffn_down"), &[ff, e], WeightUse::MatMul),
                    deepstack: hp.deepstack_layers.contains(&il).then(|| {
                        [
                            wb(&d("norm"), &[e4], WeightUse::Elementwise),
                            wb(&d("fc1"), &[e4, e4], WeightUse::MatMul),
                            wb(&d("fc2"), &[e4, proj], WeightUse::MatMul),
                        ]
                    }),
                }
            })
            .collect();
        let post_ln = wb("v.post_ln", &[e], WeightUse::Elementwise);
        let mm0 = wb("mm.0", &[e4, e4], WeightUse::MatMul);
        let mm2 = wb("mm.2", &[e4, proj], WeightUse::MatMul);
        Qwen3VlWeights {
            patch: [
                specs.add("v.patch_embd.weight", &[p, p, 3, e], WeightUse::MatMul),
                specs.add("v.patch_embd.weight.1", &[p, p, 3, e], WeightUse::MatMul),
            ],
            patch_bias: specs.add("v.patch_embd.bias", &[e], WeightUse::Elementwise),
            pos: specs.add(
                "v.position_embd.weight",
                &[e, n_pos_embd],
                WeightUse::Elementwise,
            ),
            blocks,
            post_ln,
            mm0,
            mm2,
        }
    }
}

/// The graph's inputs: the image `[w, h, 3]` and the 4 rope positions per patch.
pub(super) struct GraphInputs<'c> {
    pub image: Tensor<'c>,
    pub positions: Tensor<'c>,
}

/// Builds the tower over a `px × py`-patch image; returns the output
/// `[n_embd_out, px * py / 4]`: per merged token, the merger's embedding then
/// each deepstack merger's.
pub(super) fn build<'c>(
    ctx: &'c Context,
    hp: &VisionHParams,
    ids: &Qwen3VlWeights,
    w: &'c Weights,
    inp: &GraphInputs<'c>,
    (px, py): (usize, usize),
) -> Tensor<'c> {
    let (e, n_head) = (hp.n_embd as i64, hp.n_head as i64);
    let d_head = e / n_head;
    let (px, py) = (px as i64, py as i64);
    let n_pos = px * py;
    let g = |id: WeightId| w.get(id);
    let norm = |x: Tensor<'c>, (wt, b): (WeightId, WeightId)| {
        ctx.add(ctx.mul(ctx.norm(x, hp.eps), g(wt)), g(b))
    };
    let linear =
        |x: Tensor<'c>, (wt, b): (WeightId, WeightId)| ctx.add(ctx.mul_mat(g(wt), x), g(b));
    // Row-major patches → 2×2 merge blocks (row-major over blocks; within a
    // block (0,0), (0,1), (1,0), (1,1)), from `[e, px, py]` (contiguous).
    let merge_order = |x: Tensor<'c>| {
        let x = ctx.reshape(x, &[e * 2, px / 2, 2, py / 2]);
        ctx.reshape(ctx.cont(ctx.permute(x, [0, 2, 1, 3])), &[e, n_pos])
    };

    // Patch embedding: [px, py, e] → [e, px, py] → merge order.
    let conv =
        |k: WeightId| ctx.conv_2d(g(k), inp.image, [hp.patch_size as i32; 2], [0; 2], [1; 2]);
    let x = ctx.add(conv(ids.patch[0]), conv(ids.patch[1]));
    let x = ctx.cont(ctx.permute(x, [1, 2, 0, 3]));
    let x = ctx.add(merge_order(x), g(ids.patch_bias));

    // Learned positions, trained on a square grid, resized to this one.
    let mut pos = g(ids.pos);
    if pos.dtype() != DType::F32 {
        pos = ctx.cast(pos, DType::F32);
    }
    let side = (pos.ne()[1] as f64).sqrt() as i64;
    if (px, py) != (side, side) {
        let grid = ctx.permute(ctx.reshape(pos, &[e, side, side]), [2, 0, 1, 3]);
        let resized = ctx.interpolate_bilinear_corners(ctx.cont(grid), [px, py, e, 1]);
        pos = ctx.cont(ctx.permute(resized, [1, 2, 0, 3]));
    }
    let mut x = ctx.add(x, merge_order(ctx.reshape(pos, &[e, px, py])));

    let rope = RopeParams {
        n_dims: (d_head / 2) as i32,
        mode: ROPE_VISION,
        n_ctx_orig: 32768,
        freq_base: 10000.0,
        freq_scale: 1.0,
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
    };
    let sections = [(d_head / 4) as i32; 4];
    let kq_scale = 1.0 / (d_head as f32).sqrt();
    let mut deepstack: Option<Tensor<'c>> = None;
    for b in &ids.blocks {
        let cur = norm(x, b.ln1);
        let qkv = linear(cur, b.qkv);
        let row = qkv.nb()[1];
        let head = |i: i64| {
            ctx.view(
                qkv,
                &[d_head, n_head, n_pos],
                &[d_head as usize * 4, row],
                (i * e) as usize * 4,
            )
        };
        let q = ctx.rope_multi(head(0), inp.positions, &rope, sections);
        let k = ctx.rope_multi(head(1), inp.positions, &rope, sections);
        // As llama.cpp's CPU default (flash attention on): K and V in F16.
        let q = ctx.permute(q, [0, 2, 1, 3]);
        let k = ctx.cast(ctx.permute(k, [0, 2, 1, 3]), DType::F16);
        let v = ctx.cast(ctx.permute(head(2), [0, 2, 1, 3]), DType::F16);
        let att = ctx.flash_attn_unmasked(q, k, v, kq_scale);
        let att = ctx.reshape(att, &[e, n_pos]);
        x = ctx.add(linear(att, b.out), x);

        let cur = norm(x, b.ln2);
        let cur = linear(ctx.gelu(linear(cur, b.up)), b.down);
        x = ctx.add(x, cur);

        if let Some([n, fc1, fc2]) = b.deepstack {
            let feat = ctx.reshape(x, &[e * 4, n_pos / 4]);
            let feat = linear(ctx.gelu(linear(norm(feat, n), fc1)), fc2);
            deepstack = Some(match deepstack {
                None => feat,
                Some(d) => ctx.concat(d, feat, 0),
            });
        }
    }
    let x = norm(x, ids.post_ln);
    let x = ctx.reshape(x, &[e * 4, n_pos / 4]);
    let out = linear(ctx.gelu(linear(x, ids.mm0)), ids.mm2);
    match deepstack {
        Some(d) => ctx.concat(out, d, 0),
        None => out,
    }
}

/// The rope positions of a `px × py`-patch image in merge order, section-major
/// (all patches' y, then x, then y, x again), as llama.cpp sets them.
pub(super) fn positions(px: usize, py: usize) -> Vec<i32> {
    let n = px * py;
    let mut pos = vec![0i32; 4 * n];
    let mut i = 0;
    for by in (0..py).step_by(2) {
        for bx in (0..px).step_by(2) {
            for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                let (y, x) = ((by + dy) as i32, (bx + dx) as i32);
                pos[i] = y;
                pos[n + i] = x;
                pos[2 * n + i] = y;
                pos[3 * n + i] = x;
                i += 1;
            }
        }
    }
    pos
}
