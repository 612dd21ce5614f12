//! Qwen3.5 (and, with routed experts plus a shared expert, Qwen3.5-MoE): a hybrid
//! of gated-DeltaNet linear-attention layers, which carry a recurrent state
//! ([`crate::deltanet`]), and every n-th layer gated full attention: the query
//! projection also yields a per-channel output gate, Q and K get per-head RMSNorm,
//! and multi-section rope turns only the first quarter of each head. An MTP
//! ("nextn") block at the end of the file is its own graph ([`Qwen35::build_mtp`]),
//! the draft head of speculative decoding.

use tempo9_ggml::Tensor;
use tempo9_gguf::GgufFile;

use super::qwen3::Ffn;
use crate::deltanet::DeltaNet;
use crate::layers::Builder;
use crate::weights::{Embeddings, SpecList, WeightId, WeightUse::*};
use crate::HParams;

/// A gated full-attention layer's weights.
struct GatedAttn {
    /// Query and gate, interleaved per head: `[n_embd, 2 * n_head * head_dim]`.
    wq: WeightId,
    wk: WeightId,
    wv: WeightId,
    q_norm: WeightId,
    k_norm: WeightId,
    wo: WeightId,
}

impl GatedAttn {
    /// Declares block `il`'s gated attention.
    fn declare(hp: &HParams, specs: &mut SpecList, il: usize) -> GatedAttn {
        let (e, hd) = (hp.n_embd, hp.head_dim);
        let n = |s: &str| format!("blk.{il}.{s}");
        GatedAttn {
            wq: specs.add(n("attn_q.weight"), &[e, 2 * hp.n_head * hd], MatMul),
            wk: specs.add(n("attn_k.weight"), &[e, hp.n_embd_k()], MatMul),
            wv: specs.add(n("attn_v.weight"), &[e, hp.n_embd_v()], MatMul),
            q_norm: specs.add(n("attn_q_norm.weight"), &[hd], Elementwise),
            k_norm: specs.add(n("attn_k_norm.weight"), &[hd], Elementwise),
            wo: specs.add(
                n("attn_output.weight"),
                &[hp.n_head * hp.head_dim_v, e],
                MatMul,
            ),
        }
    }
}

/// A multi-token-prediction ("nextn") block, which speculative decoding runs as a
/// draft: the embedding of the next token and the hidden state of the position
/// before it, each normed, projected together, then one gated-attention block with
/// the model's feed-forward kind, and a final norm before the shared output head.
struct MtpBlock {
    /// `[2 * n_embd, n_embd]` over (embedding ; hidden state).
    eh_proj: WeightId,
    enorm: WeightId,
    hnorm: WeightId,
    /// Its own final norm, when the file has one (else the model's).
    shared_head_norm: Option<WeightId>,
    attn_norm: WeightId,
    attn: GatedAttn,
    post_norm: WeightId,
    ffn: Ffn,
}

impl MtpBlock {
    fn declare(hp: &HParams, file: &GgufFile, specs: &mut SpecList, il: usize) -> MtpBlock {
        let e = hp.n_embd;
        let n = |s: &str| format!("blk.{il}.{s}");
        let shared = n("nextn.shared_head_norm.weight");
        MtpBlock {
            eh_proj: specs.add(n("nextn.eh_proj.weight"), &[2 * e, e], MatMul),
            enorm: specs.add(n("nextn.enorm.weight"), &[e], Elementwise),
            hnorm: specs.add(n("nextn.hnorm.weight"), &[e], Elementwise),
            shared_head_norm: file
                .tensor(&shared)
                .is_some()
                .then(|| specs.add(shared, &[e], Elementwise)),
            attn_norm: specs.add(n("attn_norm.weight"), &[e], Elementwise),
            attn: GatedAttn::declare(hp, specs, il),
            post_norm: specs.add(n("post_attention_norm.weight"), &[e], Elementwise),
            ffn: Ffn::declare(hp, specs, il),
        }
    }
}

/// What mixes tokens in a layer.
enum Mixer {
    Attn(GatedAttn),
    Linear(DeltaNet),
}

struct Layer {
    attn_norm: WeightId,
    mixer: Mixer,
    /// The norm before the feed-forward (HF `post_attention_layernorm`).
    post_norm: WeightId,
    ffn: Ffn,
}

/// Weights and graph of Qwen3.5 and Qwen3.5-MoE.
pub(crate) struct Qwen35 {
    emb: Embeddings,
    layers: Vec<Layer>,
    /// The file's MTP blocks (`nextn_predict_layers`), after the trunk's; the
    /// first drafts.
    mtp: Vec<MtpBlock>,
}

impl Qwen35 {
    /// Declares the weights of the trunk and of the file's MTP blocks (loaded and
    /// checked; the step graph does not run them).
    pub fn declare(hp: &HParams, file: &GgufFile, specs: &mut SpecList) -> Qwen35 {
        let e = hp.n_embd;
        let emb = specs.add_embeddings(file, e, hp.n_vocab);
        let layers = (0..hp.n_layer)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}");
                let attn_norm = specs.add(n("attn_norm.weight"), &[e], Elementwise);
                let mixer = match hp.is_recurrent[i] {
                    true => Mixer::Linear(DeltaNet::declare(hp, file, specs, i)),
                    false => Mixer::Attn(GatedAttn::declare(hp, specs, i)),
                };
                Layer {
                    attn_norm,
                    mixer,
                    post_norm: specs.add(n("post_attention_norm.weight"), &[e], Elementwise),
                    ffn: Ffn::declare(hp, specs, i),
                }
            })
            .collect();
        let mtp = (hp.n_layer..hp.n_layer + hp.n_nextn)
            .map(|il| MtpBlock::declare(hp, file, specs, il))
            .collect();
        Qwen35 { emb, layers, mtp }
    }

    /// Builds the step graph; returns logits `[n_vocab, n_outputs]`.
    pub fn build<'a>(&self, b: &mut Builder<'a>) -> Tensor<'a> {
        let mut x = b.embed(self.emb.tok_embd, None);
        for (il, l) in self.layers.iter().enumerate() {
            let h = b.rms_norm(x, l.attn_norm);
            let a = match &l.mixer {
                Mixer::Attn(at) => gated_attention(b, il, at, h),
                Mixer::Linear(dn) => b.delta_net(il, dn, h),
            };
            let r = b.ctx.add(a, x);
            let h2 = b.rms_norm(r, l.post_norm);
            let f = l.ffn.build(b, h2);
            x = b.ctx.add(f, r);
        }
        // Rows are picked after the final norm, as llama.cpp does for this model
        // (the last layer's matmuls then see the same rows as its); the normed
        // rows are also the MTP head's input.
        let x = b.rms_norm(x, self.emb.output_norm);
        b.hidden = Some(x);
        let x = b.select_outputs(x);
        b.linear(self.emb.output, x, None)
    }

    /// Builds the MTP head's graph (layer 0 of its own KV store; the hidden-state
    /// input in `b.inp.h_in`); returns logits `[n_vocab, n_outputs]` and leaves the
    /// head's normed output in `b.hidden` for the next draft.
    pub fn build_mtp<'a>(&self, b: &mut Builder<'a>) -> Result<Tensor<'a>, crate::ModelError> {
        let (Some(m), Some(h_in)) = (self.mtp.first(), b.inp.h_in) else {
            return Err(crate::ModelError::BadBatch(
                "an MTP step without an MTP block or hidden states".into(),
            ));
        };
        let e = b.rms_norm(b.embed(self.emb.tok_embd, None), m.enorm);
        let h = b.rms_norm(h_in, m.hnorm);
        let x = b.linear(m.eh_proj, b.ctx.concat(e, h, 0), None);
        let a = gated_attention(b, 0, &m.attn, b.rms_norm(x, m.attn_norm));
        let r = b.ctx.add(a, x);
        let f = m.ffn.build(b, b.rms_norm(r, m.post_norm));
        let y = b.ctx.add(f, r);
        let y = b.rms_norm(y, m.shared_head_norm.unwrap_or(self.emb.output_norm));
        b.hidden = Some(y);
        let y = b.select_outputs(y);
        Ok(b.linear(self.emb.output, y, None))
    }
}

/// Gated full attention on the normed input `h`.
fn gated_attention<'a>(b: &mut Builder<'a>, il: usize, l: &GatedAttn, h: Tensor<'a>) -> Tensor<'a> {
    let (ctx, hp) = (b.ctx, b.hp);
    let (hd, nh, n_t) = (hp.head_dim as i64, hp.n_head as i64, b.inp.n_tokens as i64);
    let qg = b.linear(l.wq, h, None); // [2 * hd * nh, n_t]
    let f = 4usize; // F32 bytes
    let half = |offset: usize| {
        ctx.view(
            qg,
            &[hd, nh, n_t],
            &[2 * hd as usize * f, qg.nb()[1]],
            offset,
        )
    };
    let q = b.rms_norm(half(0), l.q_norm);
    let gate = ctx.reshape(ctx.cont(half(hd as usize * f)), &[hd * nh, n_t]);
    let k = b.rms_norm(
        b.heads(b.linear(l.wk, h, None), hp.n_head_kv, hp.head_dim),
        l.k_norm,
    );
    let v = b.heads(b.linear(l.wv, h, None), hp.n_head_kv, hp.head_dim_v);
    let q = b.rope(q, il);
    let k = b.rope(k, il);
    let a = b.attention(il, q, k, v, hp.attn_scale);
    let a = ctx.mul(a, ctx.sigmoid(gate));
    b.linear(l.wo, a, None)
}
