//! Gemma 3: scaled embeddings, sandwich RMSNorms around attention and feed-forward,
//! per-head RMSNorm on Q and K, GeGLU feed-forward, and 5 of every 6 layers
//! attending within a sliding window with their own rope base.

use tempo9_ggml::Tensor;
use tempo9_gguf::GgufFile;

use crate::layers::Builder;
use crate::weights::{Embeddings, SpecList, WeightId, WeightUse::*};
use crate::HParams;

struct Layer {
    attn_norm: WeightId,
    wq: WeightId,
    wk: WeightId,
    wv: WeightId,
    q_norm: WeightId,
    k_norm: WeightId,
    wo: WeightId,
    post_attn_norm: WeightId,
    ffn_norm: WeightId,
    gate: WeightId,
    up: WeightId,
    down: WeightId,
    post_ffn_norm: WeightId,
}

/// Weights and graph of Gemma 3.
pub(crate) struct Gemma3 {
    emb: Embeddings,
    layers: Vec<Layer>,
}

impl Gemma3 {
    /// Declares the weights.
    pub fn declare(hp: &HParams, file: &GgufFile, specs: &mut SpecList) -> Gemma3 {
        let (e, v, hd) = (hp.n_embd, hp.n_vocab, hp.head_dim);
        let emb = specs.add_embeddings(file, e, v);
        let layers = (0..hp.n_layer)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}");
                Layer {
                    attn_norm: specs.add(n("attn_norm.weight"), &[e], Elementwise),
                    wq: specs.add(n("attn_q.weight"), &[e, hp.n_head * hd], MatMul),
                    wk: specs.add(n("attn_k.weight"), &[e, hp.n_embd_k()], MatMul),
                    wv: specs.add(n("attn_v.weight"), &[e, hp.n_embd_v()], MatMul),
                    q_norm: specs.add(n("attn_q_norm.weight"), &[hd], Elementwise),
                    k_norm: specs.add(n("attn_k_norm.weight"), &[hd], Elementwise),
                    wo: specs.add(
                        n("attn_output.weight"),
                        &[hp.n_head * hp.head_dim_v, e],
                        MatMul,
                    ),
                    post_attn_norm: specs.add(n("post_attention_norm.weight"), &[e], Elementwise),
                    ffn_norm: specs.add(n("ffn_norm.weight"), &[e], Elementwise),
                    gate: specs.add(n("ffn_gate.weight"), &[e, hp.n_ff], MatMul),
                    up: specs.add(n("ffn_up.weight"), &[e, hp.n_ff], MatMul),
                    down: specs.add(n("ffn_down.weight"), &[hp.n_ff, e], MatMul),
                    post_ffn_norm: specs.add(n("post_ffw_norm.weight"), &[e], Elementwise),
                }
            })
            .collect();
        Gemma3 { emb, layers }
    }

    /// Builds the step graph; returns logits `[n_vocab, n_outputs]`.
    pub fn build<'a>(&self, b: &mut Builder<'a>) -> Tensor<'a> {
        let hp = b.hp;
        let mut x = b.embed(self.emb.tok_embd, Some((hp.n_embd as f32).sqrt()));
        for (il, l) in self.layers.iter().enumerate() {
            let h = b.rms_norm(x, l.attn_norm);
            let q = b.heads(b.linear(l.wq, h, None), hp.n_head, hp.head_dim);
            let k = b.heads(b.linear(l.wk, h, None), hp.n_head_kv, hp.head_dim);
            let v = b.heads(b.linear(l.wv, h, None), hp.n_head_kv, hp.head_dim_v);
            let q = b.rope(b.rms_norm(q, l.q_norm), il);
            let k = b.rope(b.rms_norm(k, l.k_norm), il);
            // Gemma scales queries explicitly and attends with scale 1.
            let q = b.ctx.scale(q, hp.attn_scale);
            let mut a = b.attention(il, q, k, v, 1.0);
            a = b.linear(l.wo, a, None);
            let mut residual = x;
            if il + 1 == self.layers.len() {
                a = b.select_outputs(a);
                residual = b.select_outputs(residual);
            }
            let h = b.ctx.add(b.rms_norm(a, l.post_attn_norm), residual);
            let f = b.gated_ffn(b.rms_norm(h, l.ffn_norm), l.gate, l.up, l.down, true);
            x = b.ctx.add(b.rms_norm(f, l.post_ffn_norm), h);
        }
        let x = b.rms_norm(x, self.emb.output_norm);
        b.linear(self.emb.output, x, None)
    }
}
