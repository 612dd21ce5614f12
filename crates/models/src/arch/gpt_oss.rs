//! GPT-OSS: pre-norm blocks whose attention alternates between a sliding window
//! (even layers) and the full context, with biases on Q, K, V and the output
//! projection, per-head attention sinks (a learnt logit per head that joins every
//! softmax's normalisation), NeoX rope with YaRN, and routed experts in every
//! layer (biased router, softmax over the top-k logits, clamped SwiGLU, biased
//! experts, usually MXFP4: see [`crate::moe`]). The norm before the experts is
//! the file's `post_attention_norm`.

use tempo9_ggml::Tensor;
use tempo9_gguf::GgufFile;

use crate::layers::Builder;
use crate::moe::MoeWeights;
use crate::weights::{Embeddings, SpecList, WeightId, WeightUse::*};
use crate::HParams;

struct Layer {
    attn_norm: WeightId,
    /// Q, K, V weights and their biases.
    qkv: [(WeightId, WeightId); 3],
    wo: WeightId,
    wo_b: WeightId,
    /// `[n_head]` F32.
    sinks: WeightId,
    post_attn_norm: WeightId,
    moe: MoeWeights,
}

/// Weights and graph of GPT-OSS.
pub(crate) struct GptOss {
    emb: Embeddings,
    layers: Vec<Layer>,
}

impl GptOss {
    /// Declares the weights.
    pub fn declare(hp: &HParams, file: &GgufFile, specs: &mut SpecList) -> GptOss {
        let e = hp.n_embd;
        let (q_dim, k_dim, v_dim) = (hp.n_head * hp.head_dim, hp.n_embd_k(), hp.n_embd_v());
        let emb = specs.add_embeddings(file, e, hp.n_vocab);
        let layers = (0..hp.n_layer)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}");
                let mut proj = |name: &str, out: usize| {
                    (
                        specs.add(n(&format!("{name}.weight")), &[e, out], MatMul),
                        specs.add(n(&format!("{name}.bias")), &[out], Elementwise),
                    )
                };
                let qkv = [
                    proj("attn_q", q_dim),
                    proj("attn_k", k_dim),
                    proj("attn_v", v_dim),
                ];
                Layer {
                    attn_norm: specs.add(n("attn_norm.weight"), &[e], Elementwise),
                    qkv,
                    wo: specs.add(
                        n("attn_output.weight"),
                        &[hp.n_head * hp.head_dim_v, e],
                        MatMul,
                    ),
                    wo_b: specs.add(n("attn_output.bias"), &[e], Elementwise),
                    sinks: specs.add(n("attn_sinks.weight"), &[hp.n_head], Elementwise),
                    post_attn_norm: specs.add(n("post_attention_norm.weight"), &[e], Elementwise),
                    moe: MoeWeights::declare(hp, specs, i),
                }
            })
            .collect();
        GptOss { emb, layers }
    }

    /// Builds the step graph; returns logits `[n_vocab, n_outputs]`.
    pub fn build<'a>(&self, b: &mut Builder<'a>) -> Tensor<'a> {
        let hp = b.hp;
        let mut x = b.embed(self.emb.tok_embd, None);
        for (il, l) in self.layers.iter().enumerate() {
            let h = b.rms_norm(x, l.attn_norm);
            let [(wq, bq), (wk, bk), (wv, bv)] = l.qkv;
            let q = b.heads(b.linear(wq, h, Some(bq)), hp.n_head, hp.head_dim);
            let k = b.heads(b.linear(wk, h, Some(bk)), hp.n_head_kv, hp.head_dim);
            let v = b.heads(b.linear(wv, h, Some(bv)), hp.n_head_kv, hp.head_dim_v);
            let q = b.rope(q, il);
            let k = b.rope(k, il);
            let a = b.attention_with_sinks(il, q, k, v, hp.attn_scale, Some(l.sinks));
            let a = b.linear(l.wo, a, Some(l.wo_b));
            let h = b.ctx.add(a, x);
            let f = b.moe_ffn(&l.moe, b.rms_norm(h, l.post_attn_norm));
            x = b.ctx.add(f, h);
        }
        // Rows are picked after the last layer, as llama.cpp does for this model
        // (the last layer's matmuls then see the same rows as its).
        let x = b.rms_norm(b.select_outputs(x), self.emb.output_norm);
        b.linear(self.emb.output, x, None)
    }
}
