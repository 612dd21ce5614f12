//! Qwen3 (dense) and, with routed experts, Qwen3-MoE: the Llama block with a
//! per-head RMSNorm on Q and K before NeoX rope, no biases, and tied or untied
//! embeddings.

use tempo9_ggml::Tensor;
use tempo9_gguf::GgufFile;

use crate::layers::Builder;
use crate::moe::MoeWeights;
use crate::weights::{Embeddings, SpecList, WeightId, WeightUse::*};
use crate::HParams;

/// A dense SwiGLU feed-forward or routed experts.
pub(crate) enum Ffn {
    Dense {
        gate: WeightId,
        up: WeightId,
        down: WeightId,
    },
    Moe(MoeWeights),
}

impl Ffn {
    /// Declares layer `il`'s feed-forward: experts when the model has them.
    pub fn declare(hp: &HParams, specs: &mut SpecList, il: usize) -> Ffn {
        if hp.moe.is_some() {
            return Ffn::Moe(MoeWeights::declare(hp, specs, il));
        }
        let (e, f) = (hp.n_embd, hp.n_ff);
        let n = |s: &str| format!("blk.{il}.{s}");
        Ffn::Dense {
            gate: specs.add(n("ffn_gate.weight"), &[e, f], MatMul),
            up: specs.add(n("ffn_up.weight"), &[e, f], MatMul),
            down: specs.add(n("ffn_down.weight"), &[f, e], MatMul),
        }
    }

    /// The feed-forward of the normed input `x`.
    pub fn build<'a>(&self, b: &mut Builder<'a>, x: Tensor<'a>) -> Tensor<'a> {
        match self {
            Ffn::Dense { gate, up, down } => b.gated_ffn(x, *gate, *up, *down, false),
            Ffn::Moe(m) => b.moe_ffn(m, x),
        }
    }
}

struct Layer {
    attn_norm: WeightId,
    wq: WeightId,
    wk: WeightId,
    wv: WeightId,
    q_norm: WeightId,
    k_norm: WeightId,
    wo: WeightId,
    ffn_norm: WeightId,
    ffn: Ffn,
}

/// Weights and graph of Qwen3 and Qwen3-MoE.
pub(crate) struct Qwen3 {
    emb: Embeddings,
    layers: Vec<Layer>,
}

impl Qwen3 {
    /// Declares the weights (experts instead of a dense feed-forward for Qwen3-MoE).
    pub fn declare(hp: &HParams, file: &GgufFile, specs: &mut SpecList) -> Qwen3 {
        let (e, hd) = (hp.n_embd, hp.head_dim);
        let emb = specs.add_embeddings(file, e, hp.n_vocab);
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
                    ffn_norm: specs.add(n("ffn_norm.weight"), &[e], Elementwise),
                    ffn: Ffn::declare(hp, specs, i),
                }
            })
            .collect();
        Qwen3 { emb, layers }
    }

    /// Builds the step graph; returns logits `[n_vocab, n_outputs]`.
    pub fn build<'a>(&self, b: &mut Builder<'a>) -> Tensor<'a> {
        let hp = b.hp;
        // Qwen3-VL: image rows take their embeddings, and the first layers'
        // outputs their deepstack features (no-ops for text).
        let mut x = b.embed_inputs(self.emb.tok_embd);
        for (il, l) in self.layers.iter().enumerate() {
            let h = b.rms_norm(x, l.attn_norm);
            let q = b.heads(b.linear(l.wq, h, None), hp.n_head, hp.head_dim);
            let k = b.heads(b.linear(l.wk, h, None), hp.n_head_kv, hp.head_dim);
            let v = b.heads(b.linear(l.wv, h, None), hp.n_head_kv, hp.head_dim_v);
            let q = b.rope(b.rms_norm(q, l.q_norm), il);
            let k = b.rope(b.rms_norm(k, l.k_norm), il);
            let mut a = b.attention(il, q, k, v, hp.attn_scale);
            a = b.linear(l.wo, a, None);
            let mut residual = x;
            if il + 1 == self.layers.len() {
                a = b.select_outputs(a);
                residual = b.select_outputs(residual);
            }
            let h = b.ctx.add(a, residual);
            let h2 = b.rms_norm(h, l.ffn_norm);
            let f = l.ffn.build(b, h2);
            x = b.deepstack(b.ctx.add(f, h), il);
        }
        let x = b.rms_norm(x, self.emb.output_norm);
        b.linear(self.emb.output, x, None)
    }
}
