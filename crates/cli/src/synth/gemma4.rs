//! Gemma 4's metadata keys and tensors, as llama.cpp's converter writes them
//! (`conversion/gemma.py`'s `Gemma4Model`): per-layer arrays for the sliding
//! pattern, KV heads and (double-wide) feed-forward widths, the full layers' head
//! size as `key_length` and the sliding layers' as `key_length_swa`, a generated
//! `rope_freqs.weight` that leaves three quarters of each full head unrotated,
//! fused expert gate/up weights, and no K/V weights in KV-sharing layers.

use tempo9_gguf::{ArrayValue, GgufWriter, Value};

use super::shapes::{Gemma4, Shape};
use super::tensors::{Init, Kind, Spec};

/// The layout of `sh` (a gemma4 shape).
fn layout(sh: &Shape) -> Gemma4 {
    sh.gemma4.expect("a gemma4 shape has its layout")
}

/// First KV-sharing layer.
fn first_shared(sh: &Shape) -> u64 {
    sh.n_layer.saturating_sub(layout(sh).n_shared)
}

/// Layer `i`'s (KV heads, head size).
fn attn_shape(sh: &Shape, i: u64) -> (u64, u64) {
    let g = layout(sh);
    match g.is_full(i) {
        true => (g.n_head_kv_full, g.head_dim_full),
        false => (sh.n_head_kv, sh.head_dim),
    }
}

/// Layer `i`'s feed-forward width.
fn n_ff(sh: &Shape, i: u64) -> u64 {
    match layout(sh).double_wide && i >= first_shared(sh) {
        true => 2 * sh.n_ff,
        false => sh.n_ff,
    }
}

/// Checks that the KV-sharing layers have sources: llama.cpp reads a sliding
/// sharing layer's K/V from the layer two before the first sharing one and a full
/// one's from the layer just before, so those must be a sliding then a full layer.
pub fn check(sh: &Shape) -> Result<(), String> {
    let g = layout(sh);
    let f = first_shared(sh);
    if g.n_shared > 0 && (f < 2 || g.is_full(f - 2) || !g.is_full(f - 1)) {
        return Err(format!(
            "{} layers with {} sharing KV: the two layers before the sharing ones must be \
             a sliding then a full layer",
            sh.n_layer, g.n_shared
        ));
    }
    Ok(())
}

/// Writes the metadata keys.
pub fn metadata(sh: &Shape, n_vocab: u64, w: &mut GgufWriter) {
    let g = layout(sh);
    let k = |x: &str| format!("gemma4.{x}");
    let u = |x: u64| Value::U32(x as u32);
    let per_layer = |f: &dyn Fn(u64) -> u64| {
        Value::Array(ArrayValue::U32(
            (0..sh.n_layer).map(|i| f(i) as u32).collect(),
        ))
    };
    w.set(&k("block_count"), u(sh.n_layer))
        .set(&k("context_length"), Value::U32(sh.n_ctx))
        .set(&k("embedding_length"), u(sh.n_embd));
    match g.double_wide {
        true => w.set(&k("feed_forward_length"), per_layer(&|i| n_ff(sh, i))),
        false => w.set(&k("feed_forward_length"), u(sh.n_ff)),
    };
    w.set(&k("attention.head_count"), u(sh.n_head))
        .set(
            &k("attention.head_count_kv"),
            per_layer(&|i| attn_shape(sh, i).0),
        )
        .set(
            &k("attention.layer_norm_rms_epsilon"),
            Value::F32(sh.rms_eps),
        )
        .set(&k("attention.key_length"), u(g.head_dim_full))
        .set(&k("attention.value_length"), u(g.head_dim_full))
        .set(&k("attention.key_length_swa"), u(sh.head_dim))
        .set(&k("attention.value_length_swa"), u(sh.head_dim))
        .set(&k("rope.freq_base"), Value::F32(sh.rope_base))
        .set(&k("rope.freq_base_swa"), Value::F32(g.rope_base_swa))
        .set(&k("rope.dimension_count"), u(g.head_dim_full))
        .set(&k("rope.dimension_count_swa"), u(sh.head_dim))
        .set(&k("final_logit_softcapping"), Value::F32(g.softcap))
        .set(
            &k("attention.sliding_window"),
            u(sh.swa_window.expect("gemma4 slides") as u64),
        )
        .set(&k("attention.shared_kv_layers"), u(g.n_shared))
        .set(
            &k("embedding_length_per_layer_input"),
            u(g.n_embd_per_layer),
        )
        .set(
            &k("attention.sliding_window_pattern"),
            Value::Array(ArrayValue::Bool(
                (0..sh.n_layer).map(|i| !g.is_full(i)).collect(),
            )),
        );
    if let Some(m) = sh.moe {
        w.set(&k("expert_count"), u(m.n_expert))
            .set(&k("expert_used_count"), u(m.n_used))
            .set(&k("expert_feed_forward_length"), u(m.n_ff_exp));
    }
    w.set(&k("vocab_size"), u(n_vocab));
}

/// The tensor list, in the order it is written.
pub fn tensors(sh: &Shape, n_vocab: u64) -> Vec<Spec> {
    let g = layout(sh);
    let e = sh.n_embd;
    let unit = |fan_in: u64| Init::Uniform(1.0 / (fan_in as f32).sqrt());
    let branch_scale = 1.0 / (2.0 * sh.n_layer as f32).sqrt();
    let branch = |fan_in: u64| Init::Uniform(branch_scale / (fan_in as f32).sqrt());
    // Norm weights near 1 (Gemma 4 stores them unshifted), so a wrong norm shows.
    let norm = || Init::Around(1.0, 0.1);
    let mut out: Vec<Spec> = Vec::new();
    let mut add = |name: String, shape: &[u64], kind: Kind, init: Init| {
        out.push(Spec {
            name,
            shape: shape.to_vec(),
            kind,
            init,
        })
    };
    use Kind::{Weight, F32};
    // Proportional rope: the first `factor * head / 2` pairs rotate, the others
    // get a divisor so large that they stay put.
    let half = g.head_dim_full / 2;
    let rotated = (g.head_dim_full as f32 * g.partial_rotary_full / 2.0) as u64;
    let freqs = (0..half)
        .map(|i| if i < rotated { 1.0 } else { 1e30 })
        .collect();
    add(
        "rope_freqs.weight".into(),
        &[half],
        F32,
        Init::Values(freqs),
    );
    // Embedding rows of RMS 3 after the model's sqrt(n_embd) scale: logits
    // (tied to the embedding) spread over a few units, and the input does not
    // dominate the residual stream (the model would then echo its last token).
    let embd = Init::Uniform(3.0 / (e as f32).sqrt());
    add("token_embd.weight".into(), &[e, n_vocab], Weight, embd);
    let pl = g.n_embd_per_layer;
    if pl > 0 {
        add(
            "per_layer_token_embd.weight".into(),
            &[pl * sh.n_layer, n_vocab],
            Weight,
            Init::Uniform(1.0),
        );
        add(
            "per_layer_model_proj.weight".into(),
            &[e, pl * sh.n_layer],
            Weight,
            unit(e),
        );
        add(
            "per_layer_proj_norm.weight".into(),
            &[pl],
            F32,
            Init::Const(1.0),
        );
    }
    let q_rows = |i: u64| sh.n_head * attn_shape(sh, i).1;
    for i in 0..sh.n_layer {
        let n = |s: &str| format!("blk.{i}.{s}");
        let (kv, hd) = attn_shape(sh, i);
        let owns = i < first_shared(sh);
        add(n("attn_norm.weight"), &[e], F32, norm());
        add(n("attn_q.weight"), &[e, q_rows(i)], Weight, unit(e));
        if owns {
            add(n("attn_k.weight"), &[e, kv * hd], Weight, unit(e));
            if !(g.k_eq_v && g.is_full(i)) {
                add(n("attn_v.weight"), &[e, kv * hd], Weight, unit(e));
            }
        }
        add(n("attn_q_norm.weight"), &[hd], F32, norm());
        if owns {
            add(n("attn_k_norm.weight"), &[hd], F32, norm());
        }
        add(
            n("attn_output.weight"),
            &[q_rows(i), e],
            Weight,
            branch(q_rows(i)),
        );
        add(n("post_attention_norm.weight"), &[e], F32, norm());
        add(
            n("layer_output_scale.weight"),
            &[1],
            F32,
            Init::Around(0.8, 0.1),
        );
        let f = n_ff(sh, i);
        add(n("ffn_norm.weight"), &[e], F32, norm());
        add(n("ffn_gate.weight"), &[e, f], Weight, unit(e));
        add(n("ffn_up.weight"), &[e, f], Weight, unit(e));
        add(n("ffn_down.weight"), &[f, e], Weight, branch(f));
        add(n("post_ffw_norm.weight"), &[e], F32, norm());
        if let Some(m) = sh.moe {
            let (f, x) = (m.n_ff_exp, m.n_expert);
            add(n("ffn_gate_inp.weight"), &[e, x], F32, Init::Uniform(1.0));
            add(n("ffn_gate_inp.scale"), &[e], F32, norm());
            add(n("pre_ffw_norm_2.weight"), &[e], F32, norm());
            add(n("post_ffw_norm_1.weight"), &[e], F32, norm());
            add(n("post_ffw_norm_2.weight"), &[e], F32, norm());
            add(
                n("ffn_gate_up_exps.weight"),
                &[e, 2 * f, x],
                Weight,
                unit(e),
            );
            add(n("ffn_down_exps.weight"), &[f, e, x], Weight, branch(f));
            add(n("ffn_down_exps.scale"), &[x], F32, norm());
        }
        if pl > 0 {
            add(n("inp_gate.weight"), &[e, pl], Weight, unit(e));
            add(n("proj.weight"), &[pl, e], Weight, branch(pl));
            add(n("post_norm.weight"), &[e], F32, norm());
        }
    }
    add("output_norm.weight".into(), &[e], F32, Init::Const(1.0));
    // The output is tied to the token embedding, as in every Gemma 4 checkpoint.
    out
}
