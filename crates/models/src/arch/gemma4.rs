//! Gemma 4 (text): Gemma 3's sandwich-normed blocks with
//! - sliding-window and full layers of their own head size, KV head count, rope
//!   base and rotated dimensions (full layers rotate a quarter of each head through
//!   `rope_freqs.weight`, whose huge divisors leave the rest unrotated);
//! - RMS-normed queries and keys (weighted) and values (unweighted), attention
//!   unscaled;
//! - trailing KV-sharing layers that attend over an earlier layer's K/V and keep
//!   none of their own ([`crate::HParams::kv_source`]);
//! - per-layer token embeddings (E2B/E4B): a second embedding table gives every
//!   layer a small input of its own, mixed with a projection of the token's main
//!   embedding, which each layer gates into its output;
//! - an optional per-layer output scale, final logit soft-capping;
//! - in the MoE variant (26B-A4B), routed GELU experts beside the dense
//!   feed-forward, each branch with its own norms.
//!
//! The math follows llama.cpp's `src/models/gemma4.cpp` op for op. Image rows
//! ([`crate::StepBatch::embeds`], from a `gemma4v` projector) enter unscaled,
//! with token id 0 for their per-layer inputs; the non-causal attention among
//! an image's rows on sliding layers is the caller's mask.

use tempo9_ggml::Tensor;
use tempo9_gguf::GgufFile;

use crate::layers::Builder;
use crate::moe::MoeWeights;
use crate::weights::{Embeddings, SpecList, WeightId, WeightUse::*};
use crate::HParams;

/// The routed-expert branch of a MoE layer, beside the dense feed-forward.
struct Experts {
    moe: MoeWeights,
    /// `[n_embd]`: the router input's scale (`ffn_gate_inp.scale`).
    router_scale: WeightId,
    /// Norm before the experts (`pre_ffw_norm_2`).
    pre_norm: WeightId,
    /// Norms after the dense branch (`post_ffw_norm_1`) and the experts
    /// (`post_ffw_norm_2`).
    post_norm_dense: WeightId,
    post_norm_experts: WeightId,
}

/// A layer's gate into its per-layer embedding.
struct PerLayer {
    /// `[n_embd, n_embd_per_layer]`.
    gate: WeightId,
    /// `[n_embd_per_layer, n_embd]`.
    proj: WeightId,
    post_norm: WeightId,
}

struct Layer {
    attn_norm: WeightId,
    wq: WeightId,
    /// K and V projections; `None` in a KV-sharing layer. V may be absent (V is
    /// then K's projection).
    wk: Option<WeightId>,
    wv: Option<WeightId>,
    q_norm: WeightId,
    k_norm: Option<WeightId>,
    wo: WeightId,
    post_attn_norm: WeightId,
    ffn_norm: WeightId,
    gate: WeightId,
    up: WeightId,
    down: WeightId,
    post_ffn_norm: WeightId,
    experts: Option<Experts>,
    per_layer: Option<PerLayer>,
    /// `[1]`: the layer's output scale.
    out_scale: Option<WeightId>,
}

/// The model-wide tensors of per-layer embeddings.
struct PerLayerInputs {
    /// `[n_embd_per_layer * n_layer, n_vocab]`.
    tok_embd: WeightId,
    /// `[n_embd, n_embd_per_layer * n_layer]`.
    model_proj: WeightId,
    /// `[n_embd_per_layer]`.
    proj_norm: WeightId,
}

/// Weights and graph of Gemma 4.
pub(crate) struct Gemma4 {
    emb: Embeddings,
    /// Full layers' rope divisors (`[head_dim / 2]`).
    rope_freqs: Option<WeightId>,
    per_layer: Option<PerLayerInputs>,
    layers: Vec<Layer>,
}

impl Gemma4 {
    /// Declares the weights; a KV-sharing layer's K/V weights are not read (the
    /// converter may still write them).
    pub fn declare(hp: &HParams, file: &GgufFile, specs: &mut SpecList) -> Gemma4 {
        let e = hp.n_embd;
        let emb = specs.add_embeddings(file, e, hp.n_vocab);
        let rope_freqs = file
            .tensor("rope_freqs.weight")
            .map(|_| specs.add("rope_freqs.weight", &[hp.head_dim / 2], Elementwise));
        let pl = hp.n_embd_per_layer;
        let per_layer = (pl > 0).then(|| PerLayerInputs {
            tok_embd: specs.add(
                "per_layer_token_embd.weight",
                &[pl * hp.n_layer, hp.n_vocab],
                Rows,
            ),
            model_proj: specs.add("per_layer_model_proj.weight", &[e, pl * hp.n_layer], MatMul),
            proj_norm: specs.add("per_layer_proj_norm.weight", &[pl], Elementwise),
        });
        let layers = (0..hp.n_layer)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}");
                let hd = hp.head_dim_of(i);
                let (q_dim, k_dim, v_dim) = (hp.n_head * hd, hp.n_embd_k_of(i), hp.n_embd_v_of(i));
                let owns = hp.owns_kv(i);
                let has = |s: &str| file.tensor(&n(s)).is_some();
                let ffn = hp.n_ff_arr[i];
                let experts = has("ffn_gate_inp.weight").then(|| Experts {
                    router_scale: specs.add(n("ffn_gate_inp.scale"), &[e], Elementwise),
                    pre_norm: specs.add(n("pre_ffw_norm_2.weight"), &[e], Elementwise),
                    post_norm_dense: specs.add(n("post_ffw_norm_1.weight"), &[e], Elementwise),
                    post_norm_experts: specs.add(n("post_ffw_norm_2.weight"), &[e], Elementwise),
                    moe: MoeWeights::declare_gemma4(hp, file, specs, i),
                });
                Layer {
                    attn_norm: specs.add(n("attn_norm.weight"), &[e], Elementwise),
                    wq: specs.add(n("attn_q.weight"), &[e, q_dim], MatMul),
                    wk: owns.then(|| specs.add(n("attn_k.weight"), &[e, k_dim], MatMul)),
                    wv: (owns && has("attn_v.weight"))
                        .then(|| specs.add(n("attn_v.weight"), &[e, v_dim], MatMul)),
                    q_norm: specs.add(n("attn_q_norm.weight"), &[hd], Elementwise),
                    k_norm: owns.then(|| specs.add(n("attn_k_norm.weight"), &[hd], Elementwise)),
                    wo: specs.add(n("attn_output.weight"), &[q_dim, e], MatMul),
                    post_attn_norm: specs.add(n("post_attention_norm.weight"), &[e], Elementwise),
                    ffn_norm: specs.add(n("ffn_norm.weight"), &[e], Elementwise),
                    gate: specs.add(n("ffn_gate.weight"), &[e, ffn], MatMul),
                    up: specs.add(n("ffn_up.weight"), &[e, ffn], MatMul),
                    down: specs.add(n("ffn_down.weight"), &[ffn, e], MatMul),
                    post_ffn_norm: specs.add(n("post_ffw_norm.weight"), &[e], Elementwise),
                    experts,
                    per_layer: (pl > 0).then(|| PerLayer {
                        gate: specs.add(n("inp_gate.weight"), &[e, pl], MatMul),
                        proj: specs.add(n("proj.weight"), &[pl, e], MatMul),
                        post_norm: specs.add(n("post_norm.weight"), &[e], Elementwise),
                    }),
                    out_scale: has("layer_output_scale.weight")
                        .then(|| specs.add(n("layer_output_scale.weight"), &[1], Elementwise)),
                }
            })
            .collect();
        Gemma4 {
            emb,
            rope_freqs,
            per_layer,
            layers,
        }
    }

    /// Every layer's per-layer input, `[n_embd_per_layer, n_tokens, n_layer]`:
    /// the token's row of the per-layer table (scaled by `sqrt(width)`) plus the
    /// RMS-normed projection of its scaled main embedding `x`, over `sqrt(2)`.
    fn per_layer_inputs<'a>(
        &self,
        b: &Builder<'a>,
        p: &PerLayerInputs,
        x: Tensor<'a>,
    ) -> Tensor<'a> {
        let (ctx, hp) = (b.ctx, b.hp);
        let (pl, nl, n_t) = (
            hp.n_embd_per_layer as i64,
            hp.n_layer as i64,
            b.inp.n_tokens as i64,
        );
        let tok = ctx.get_rows(b.wt(p.tok_embd), b.inp.tokens);
        let tok = ctx.scale(ctx.reshape(tok, &[pl, nl, n_t]), (pl as f32).sqrt());
        let proj = ctx.scale(
            b.linear(p.model_proj, x, None),
            1.0 / (hp.n_embd as f32).sqrt(),
        );
        let proj = b.rms_norm(ctx.reshape(proj, &[pl, nl, n_t]), p.proj_norm);
        let inp = ctx.scale(ctx.add(proj, tok), std::f32::consts::FRAC_1_SQRT_2);
        ctx.cont(ctx.permute(inp, [0, 2, 1, 3]))
    }

    /// Builds the step graph; returns logits `[n_vocab, n_outputs]`.
    pub fn build<'a>(&self, b: &mut Builder<'a>) -> Tensor<'a> {
        let hp = b.hp;
        let ctx = b.ctx;
        // Image rows take their embeddings unscaled; their per-layer inputs
        // below read the table's row of their token id, 0 (llama.cpp's padding
        // row for embedding inputs), and the projection of those embeddings.
        let mut x = b.embed_inputs_scaled(self.emb.tok_embd, Some((hp.n_embd as f32).sqrt()));
        let per_layer = self
            .per_layer
            .as_ref()
            .map(|p| self.per_layer_inputs(b, p, x));
        for (il, l) in self.layers.iter().enumerate() {
            let (hd, n_kv_h) = (hp.head_dim_of(il), hp.n_head_kv_of(il));
            let factors = self.rope_freqs.filter(|_| !hp.is_swa[il]);
            let h = b.rms_norm(x, l.attn_norm);
            let q = b.heads(b.linear(l.wq, h, None), hp.n_head, hd);
            let q = b.rope_with_factors(b.rms_norm(q, l.q_norm), il, factors);
            let a = match (l.wk, l.k_norm) {
                (Some(wk), Some(k_norm)) => {
                    let k = b.linear(wk, h, None);
                    let v = l.wv.map_or(k, |wv| b.linear(wv, h, None));
                    let k = b.rms_norm(b.heads(k, n_kv_h, hd), k_norm);
                    let v = ctx.rms_norm(b.heads(v, n_kv_h, hd), hp.rms_eps);
                    let k = b.rope_with_factors(k, il, factors);
                    b.attention(il, q, k, v, hp.attn_scale)
                }
                _ => b.attention_shared(il, q, hp.attn_scale),
            };
            let a = b.linear(l.wo, a, None);
            let h = ctx.add(b.rms_norm(a, l.post_attn_norm), x);
            let f = match &l.experts {
                None => b.gated_ffn(b.rms_norm(h, l.ffn_norm), l.gate, l.up, l.down, true),
                Some(ex) => {
                    let dense = b.gated_ffn(b.rms_norm(h, l.ffn_norm), l.gate, l.up, l.down, true);
                    let dense = b.rms_norm(dense, ex.post_norm_dense);
                    // The router sees the unweighted norm of the residual, scaled.
                    let r = ctx.scale(ctx.rms_norm(h, hp.rms_eps), 1.0 / (hp.n_embd as f32).sqrt());
                    let r = ctx.mul(r, b.wt(ex.router_scale));
                    let logits = b.linear(ex.moe.router, r, None);
                    let routed = b.moe_ffn_with_logits(&ex.moe, b.rms_norm(h, ex.pre_norm), logits);
                    ctx.add(dense, b.rms_norm(routed, ex.post_norm_experts))
                }
            };
            let mut out = ctx.add(b.rms_norm(f, l.post_ffn_norm), h);
            if let (Some(pl), Some(inp)) = (&l.per_layer, per_layer) {
                let g = ctx.gelu(b.linear(pl.gate, out, None)); // [n_embd_per_layer, n_t]
                let nb = inp.nb();
                let this = ctx.view(inp, &[inp.ne()[0], inp.ne()[1]], &[nb[1]], il * nb[2]);
                let p = b.linear(pl.proj, ctx.mul(g, this), None);
                out = ctx.add(out, b.rms_norm(p, pl.post_norm));
            }
            if let Some(s) = l.out_scale {
                out = ctx.mul(out, b.wt(s));
            }
            x = out;
        }
        // Rows are picked after the last layer, as llama.cpp does for this model.
        let x = b.rms_norm(b.select_outputs(x), self.emb.output_norm);
        let logits = b.linear(self.emb.output, x, None);
        match hp.final_softcap {
            Some(c) => ctx.scale(ctx.tanh(ctx.scale(logits, 1.0 / c)), c),
            None => logits,
        }
    }
}
