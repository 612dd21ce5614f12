//! Llama (SmolLM2, Llama 2/3, Mistral 7B): pre-norm blocks with RMSNorm, rotary
//! attention with grouped-query heads, SwiGLU feed-forward. Llama 3.1+ files carry
//! `rope_freqs.weight`, per-pair frequency divisors (the converter computes them from
//! the checkpoint's `llama3` rope scaling) that every layer's rope applies. Qwen2
//! reuses this graph with Q/K/V biases, Mistral 3 with query temperature scaling.

use tempo9_ggml::Tensor;
use tempo9_gguf::GgufFile;

use crate::layers::Builder;
use crate::weights::{Embeddings, SpecList, WeightId, WeightUse::*};
use crate::{Arch, HParams};

struct Layer {
    attn_norm: WeightId,
    wq: WeightId,
    wk: WeightId,
    wv: WeightId,
    bias: Option<[WeightId; 3]>,
    wo: WeightId,
    ffn_norm: WeightId,
    gate: WeightId,
    up: WeightId,
    down: WeightId,
}

/// Weights and graph of the Llama family.
pub(crate) struct Llama {
    emb: Embeddings,
    /// Llama 3 rope frequency divisors, `[n_rot / 2]`, when the file has them.
    rope_freqs: Option<WeightId>,
    layers: Vec<Layer>,
}

impl Llama {
    /// Declares the weights; `qkv_bias` adds the Q/K/V bias vectors (Qwen2).
    pub fn declare(hp: &HParams, file: &GgufFile, specs: &mut SpecList, qkv_bias: bool) -> Llama {
        let (e, v) = (hp.n_embd, hp.n_vocab);
        let (q_dim, k_dim, v_dim) = (hp.n_head * hp.head_dim, hp.n_embd_k(), hp.n_embd_v());
        let emb = specs.add_embeddings(file, e, v);
        // llama.cpp reads the divisors for these architectures only.
        let has_freqs = matches!(hp.arch, Arch::Llama | Arch::Mistral3)
            && file.tensor("rope_freqs.weight").is_some();
        let rope_freqs = has_freqs.then(|| {
            let n_rot = hp.rope.n_dims as usize;
            specs.add("rope_freqs.weight", &[n_rot / 2], Elementwise)
        });
        let layers = (0..hp.n_layer)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}");
                Layer {
                    attn_norm: specs.add(n("attn_norm.weight"), &[e], Elementwise),
                    wq: specs.add(n("attn_q.weight"), &[e, q_dim], MatMul),
                    wk: specs.add(n("attn_k.weight"), &[e, k_dim], MatMul),
                    wv: specs.add(n("attn_v.weight"), &[e, v_dim], MatMul),
                    bias: qkv_bias.then(|| {
                        [
                            specs.add(n("attn_q.bias"), &[q_dim], Elementwise),
                            specs.add(n("attn_k.bias"), &[k_dim], Elementwise),
                            specs.add(n("attn_v.bias"), &[v_dim], Elementwise),
                        ]
                    }),
                    wo: specs.add(
                        n("attn_output.weight"),
                        &[hp.n_head * hp.head_dim_v, e],
                        MatMul,
                    ),
                    ffn_norm: specs.add(n("ffn_norm.weight"), &[e], Elementwise),
                    gate: specs.add(n("ffn_gate.weight"), &[e, hp.n_ff], MatMul),
                    up: specs.add(n("ffn_up.weight"), &[e, hp.n_ff], MatMul),
                    down: specs.add(n("ffn_down.weight"), &[hp.n_ff, e], MatMul),
                }
            })
            .collect();
        Llama {
            emb,
            rope_freqs,
            layers,
        }
    }

    /// Builds the step graph; returns logits `[n_vocab, n_outputs]`.
    pub fn build<'a>(&self, b: &mut Builder<'a>) -> Tensor<'a> {
        let hp = b.hp;
        let mut x = b.embed(self.emb.tok_embd, None);
        for (il, l) in self.layers.iter().enumerate() {
            let h = b.rms_norm(x, l.attn_norm);
            let q = b.linear(l.wq, h, l.bias.map(|b| b[0]));
            let k = b.linear(l.wk, h, l.bias.map(|b| b[1]));
            let v = b.linear(l.wv, h, l.bias.map(|b| b[2]));
            let q = b.rope_with_factors(b.heads(q, hp.n_head, hp.head_dim), il, self.rope_freqs);
            let k = b.rope_with_factors(b.heads(k, hp.n_head_kv, hp.head_dim), il, self.rope_freqs);
            let v = b.heads(v, hp.n_head_kv, hp.head_dim_v);
            let q = b.attn_temperature(q);
            let mut a = b.attention(il, q, k, v, hp.attn_scale);
            a = b.linear(l.wo, a, None);
            let mut residual = x;
            if il + 1 == self.layers.len() {
                a = b.select_outputs(a);
                residual = b.select_outputs(residual);
            }
            let h = b.ctx.add(a, residual);
            let f = b.gated_ffn(b.rms_norm(h, l.ffn_norm), l.gate, l.up, l.down, false);
            x = b.ctx.add(f, h);
        }
        let x = b.rms_norm(x, self.emb.output_norm);
        b.linear(self.emb.output, x, None)
    }
}
