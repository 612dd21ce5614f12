//! What a synthetic model file holds: the metadata keys and the tensor list
//! (names, ggml `ne` shapes, storage kinds, initialisation) that llama.cpp's
//! converter writes for each architecture (`conversion/qwen.py`,
//! `conversion/base.py`; docs/design/qwen3-family.md has the details).

use tempo9_gguf::{ArrayValue, GgufWriter, Value};

use super::shapes::{RopeScaling, Shape, SynthArch};

/// How a tensor's values are drawn.
#[derive(Debug, Clone, PartialEq)]
pub enum Init {
    /// These values (a tensor the converter computes, e.g. `rope_freqs.weight`).
    Values(Vec<f32>),
    /// Uniform with this standard deviation.
    Uniform(f32),
    /// Every value equal.
    Const(f32),
    /// Uniform around a mean (first) with this standard deviation (second).
    Around(f32, f32),
    /// `-exp(u)` with `u` uniform in `[lo, hi)`: DeltaNet's `ssm_a = -exp(A_log)`.
    NegExp(f32, f32),
}

/// Storage of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A weight matrix: the `--quant` type.
    Weight,
    /// The output projection: q6_K for k-quant files, as llama.cpp quantizes it.
    Output,
    /// Always F32: 1-D tensors, norms, routers, conv kernels (the converter forces these).
    F32,
    /// GPT-OSS's routed experts: MXFP4, as the checkpoint ships them (the converter
    /// repacks them without requantizing).
    Mxfp4,
}

/// One tensor of the file.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// GGUF tensor name.
    pub name: String,
    /// ggml `ne` order (ne0 contiguous).
    pub shape: Vec<u64>,
    /// Storage.
    pub kind: Kind,
    /// Values.
    pub init: Init,
}

/// Writes the architecture's metadata keys (not the vocabulary), as the
/// converter names and types them. `mtp` adds one trailing MTP block.
pub fn metadata(sh: &Shape, mtp: bool, n_vocab: u64, w: &mut GgufWriter) {
    if sh.arch == SynthArch::Gemma4 {
        return super::gemma4::metadata(sh, n_vocab, w);
    }
    let arch = sh.arch.name();
    let k = |x: &str| format!("{arch}.{x}");
    let u = |x: u64| Value::U32(x as u32);
    let n_blocks = sh.n_layer + u64::from(mtp);
    w.set(&k("block_count"), u(n_blocks))
        .set(&k("context_length"), Value::U32(sh.n_ctx))
        .set(&k("embedding_length"), u(sh.n_embd));
    if sh.n_ff > 0 {
        w.set(&k("feed_forward_length"), u(sh.n_ff));
    }
    w.set(&k("attention.head_count"), u(sh.n_head))
        .set(&k("attention.head_count_kv"), u(sh.n_head_kv));
    match sh.arch {
        SynthArch::Llama | SynthArch::Qwen2 | SynthArch::Mistral3 => {
            w.set(&k("rope.dimension_count"), u(sh.n_rot));
        }
        SynthArch::Qwen3 | SynthArch::Qwen3moe | SynthArch::GptOss | SynthArch::Gemma4 => {}
        SynthArch::Qwen3vl | SynthArch::Qwen3vlmoe => {
            let sections = mrope_sections((sh.n_rot / 2) as i32);
            w.set(
                &k("rope.dimension_sections"),
                Value::Array(ArrayValue::I32(sections)),
            )
            .set(&k("n_deepstack_layers"), u(sh.n_deepstack));
        }
        SynthArch::Qwen35 | SynthArch::Qwen35moe => {
            // Text positions are equal in all sections, so only their sum (the
            // rotated pairs, n_rot / 2) matters to the numbers.
            let sections = mrope_sections((sh.n_rot / 2) as i32);
            w.set(
                &k("rope.dimension_sections"),
                Value::Array(ArrayValue::I32(sections)),
            );
        }
    }
    if let Some(w_swa) = sh.swa_window {
        w.set(&k("attention.sliding_window"), u(w_swa as u64));
    }
    if let Some(RopeScaling::Yarn(y)) = sh.rope_scaling {
        w.set(&k("rope.scaling.type"), Value::String("yarn".into()))
            .set(&k("rope.scaling.factor"), Value::F32(y.factor))
            .set(
                &k("rope.scaling.original_context_length"),
                u(y.orig_ctx as u64),
            )
            .set(&k("rope.scaling.yarn_beta_fast"), Value::F32(y.beta.0))
            .set(&k("rope.scaling.yarn_beta_slow"), Value::F32(y.beta.1));
    }
    w.set(&k("rope.freq_base"), Value::F32(sh.rope_base)).set(
        &k("attention.layer_norm_rms_epsilon"),
        Value::F32(sh.rms_eps),
    );
    if let Some(m) = sh.moe {
        w.set(&k("expert_count"), u(m.n_expert))
            .set(&k("expert_used_count"), u(m.n_used));
    }
    if sh.explicit_head_dim {
        // HF head_dim: always present in Qwen3 / Qwen3.5 configs, Llama 3.2's too.
        w.set(&k("attention.key_length"), u(sh.head_dim))
            .set(&k("attention.value_length"), u(sh.head_dim));
    }
    if let Some(m) = sh.moe {
        w.set(&k("expert_feed_forward_length"), u(m.n_ff_exp));
        if let Some(s) = m.n_ff_shexp {
            w.set(&k("expert_shared_feed_forward_length"), u(s));
        }
    }
    if let Some(g) = sh.gdn {
        let recurrent: Vec<bool> = (0..n_blocks)
            .map(|i| i < sh.n_layer && g.is_recurrent(i))
            .collect();
        w.set(&k("ssm.conv_kernel"), u(g.d_conv))
            .set(&k("ssm.state_size"), u(g.d_state))
            .set(&k("ssm.group_count"), u(g.n_k_heads))
            .set(&k("ssm.time_step_rank"), u(g.n_v_heads))
            .set(&k("ssm.inner_size"), u(g.value_dim()))
            .set(
                &k("attention.recurrent_layers"),
                Value::Array(ArrayValue::Bool(recurrent)),
            )
            .set(&k("full_attention_interval"), u(g.interval))
            .set(&k("rope.dimension_count"), u(sh.n_rot));
        if mtp {
            w.set(&k("nextn_predict_layers"), u(1));
        }
    }
    w.set(&k("vocab_size"), u(n_vocab));
    if let (SynthArch::Mistral3, Some(RopeScaling::Yarn(y))) = (sh.arch, sh.rope_scaling) {
        // conversion/mistral3.py's Ministral3Model.
        w.set(
            &k("rope.scaling.yarn_log_multiplier"),
            Value::F32(y.log_mul),
        )
        .set(&k("attention.temperature_scale"), Value::F32(y.temp_scale));
    }
}

/// Splits `half` rotated pairs into the 3 used M-RoPE sections like Qwen3.5's
/// [11, 11, 10, 0] (= 32): as equal as possible, the remainder on the first ones.
fn mrope_sections(half: i32) -> Vec<i32> {
    let base = half / 3;
    let rem = half % 3;
    (0..3)
        .map(|i| base + i32::from(i < rem))
        .chain([0])
        .collect()
}

/// Llama 3's per-pair rope frequency divisors for `n_rot` rotated dimensions, as
/// `conversion/llama.py` computes them: pairs whose wavelength is under
/// `orig_ctx / high_freq_factor` keep their frequency, those over `orig_ctx /
/// low_freq_factor` are divided by `factor`, and the ones between blend smoothly.
pub fn llama3_rope_freqs(sh: &Shape) -> Option<Vec<f32>> {
    let Some(RopeScaling::Llama3 {
        factor,
        low_freq_factor: low,
        high_freq_factor: high,
        orig_ctx,
    }) = sh.rope_scaling
    else {
        return None;
    };
    let (base, dim, old) = (sh.rope_base, sh.n_rot as f32, orig_ctx as f32);
    let (low_wavelen, high_wavelen) = (old / low, old / high);
    let freqs = (0..sh.n_rot / 2).map(|i| {
        // F32 arithmetic, as the converter's torch tensors.
        let freq = 1.0 / base.powf((2 * i) as f32 / dim);
        let wavelen = 2.0 * std::f32::consts::PI / freq;
        if wavelen < high_wavelen {
            1.0
        } else if wavelen > low_wavelen {
            factor
        } else {
            let smooth = (old / wavelen - low) / (high - low);
            1.0 / ((1.0 - smooth) / factor + smooth)
        }
    });
    Some(freqs.collect())
}

/// The tensor list, in the order it is written.
pub fn tensors(sh: &Shape, mtp: bool, n_vocab: u64) -> Vec<Spec> {
    if sh.arch == SynthArch::Gemma4 {
        return super::gemma4::tensors(sh, n_vocab);
    }
    let e = sh.n_embd;
    let (q_dim, kv_dim) = (sh.n_head * sh.head_dim, sh.n_head_kv * sh.head_dim);
    // Scales keep activations O(1) through the layers (inputs of unit RMS times
    // weights of variance 1/fan_in), and make logits spread over a few units so
    // greedy choices are not near-ties.
    let unit = |fan_in: u64| Init::Uniform(1.0 / (fan_in as f32).sqrt());
    let branch_scale = 1.0 / (2.0 * sh.n_layer as f32).sqrt();
    let branch = |fan_in: u64| Init::Uniform(branch_scale / (fan_in as f32).sqrt());
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
    const ONE: Init = Init::Const(1.0);
    // The converter's generated tensors come first.
    if let Some(f) = llama3_rope_freqs(sh) {
        add(
            "rope_freqs.weight".into(),
            &[sh.n_rot / 2],
            F32,
            Init::Values(f),
        );
    }
    add(
        "token_embd.weight".into(),
        &[e, n_vocab],
        Weight,
        Init::Uniform(1.0),
    );
    let n_blocks = sh.n_layer + u64::from(mtp && sh.gdn.is_some());
    for i in 0..n_blocks {
        let n = |s: &str| format!("blk.{i}.{s}");
        let is_mtp = i >= sh.n_layer;
        if is_mtp {
            // The MTP block's input: [norm(embedding) ; norm(hidden)] projected back.
            add(n("nextn.eh_proj.weight"), &[2 * e, e], Weight, unit(2 * e));
            add(n("nextn.enorm.weight"), &[e], F32, ONE);
            add(n("nextn.hnorm.weight"), &[e], F32, ONE);
            add(n("nextn.shared_head_norm.weight"), &[e], F32, ONE);
        }
        add(n("attn_norm.weight"), &[e], F32, ONE);
        match sh.gdn {
            Some(g) if !is_mtp && g.is_recurrent(i) => {
                let (c, v, h) = (g.conv_dim(), g.value_dim(), g.n_v_heads);
                add(n("attn_qkv.weight"), &[e, c], Weight, unit(e));
                add(n("attn_gate.weight"), &[e, v], Weight, unit(e));
                // A few tenths per tap: the conv output stays O(1).
                add(
                    n("ssm_conv1d.weight"),
                    &[g.d_conv, c],
                    F32,
                    Init::Uniform(0.3),
                );
                add(n("ssm_dt.bias"), &[h], F32, Init::Uniform(0.05));
                // Decay exp(softplus(alpha + dt) * a): with alpha ~ ±0.5 (below) the
                // softplus is ~0.5-1, and a in -[0.02, 0.4] keeps it in ~(0.7, 0.99).
                add(
                    n("ssm_a"),
                    &[h],
                    F32,
                    Init::NegExp(0.02f32.ln(), 0.4f32.ln()),
                );
                add(
                    n("ssm_alpha.weight"),
                    &[e, h],
                    Weight,
                    Init::Uniform(0.5 / (e as f32).sqrt()),
                );
                add(n("ssm_beta.weight"), &[e, h], Weight, unit(e));
                add(n("ssm_norm.weight"), &[g.d_state], F32, ONE);
                add(n("ssm_out.weight"), &[v, e], Weight, branch(v));
            }
            _ => {
                // Qwen3.5 attention: per head [query(hd) ; output gate(hd)].
                let q_rows = if sh.arch.is_hybrid() {
                    2 * q_dim
                } else {
                    q_dim
                };
                add(n("attn_q.weight"), &[e, q_rows], Weight, unit(e));
                add(n("attn_k.weight"), &[e, kv_dim], Weight, unit(e));
                add(n("attn_v.weight"), &[e, kv_dim], Weight, unit(e));
                if matches!(sh.arch, SynthArch::Qwen2 | SynthArch::GptOss) {
                    add(n("attn_q.bias"), &[q_dim], F32, Init::Uniform(0.1));
                    add(n("attn_k.bias"), &[kv_dim], F32, Init::Uniform(0.1));
                    add(n("attn_v.bias"), &[kv_dim], F32, Init::Uniform(0.1));
                }
                if !matches!(
                    sh.arch,
                    SynthArch::Llama | SynthArch::Qwen2 | SynthArch::Mistral3 | SynthArch::GptOss
                ) {
                    add(n("attn_q_norm.weight"), &[sh.head_dim], F32, ONE);
                    add(n("attn_k_norm.weight"), &[sh.head_dim], F32, ONE);
                }
                add(n("attn_output.weight"), &[q_dim, e], Weight, branch(q_dim));
                if sh.arch == SynthArch::GptOss {
                    add(n("attn_output.bias"), &[e], F32, Init::Uniform(0.02));
                    // Sink logits of a few units: comparable to the scores, so they
                    // take a visible share of each softmax.
                    add(
                        n("attn_sinks.weight"),
                        &[sh.n_head],
                        F32,
                        Init::Uniform(1.0),
                    );
                }
            }
        }
        let ffn_norm = if sh.arch.is_hybrid() || sh.arch == SynthArch::GptOss {
            "post_attention_norm.weight"
        } else {
            "ffn_norm.weight"
        };
        add(n(ffn_norm), &[e], F32, ONE);
        match sh.moe {
            Some(m) => {
                // Router logits of unit spread: top-k choices change from token to token.
                add(n("ffn_gate_inp.weight"), &[e, m.n_expert], F32, unit(e));
                let (f, x) = (m.n_ff_exp, m.n_expert);
                let (exps, oai) = match sh.arch {
                    SynthArch::GptOss => (Kind::Mxfp4, true),
                    _ => (Weight, false),
                };
                if oai {
                    add(n("ffn_gate_inp.bias"), &[x], F32, Init::Uniform(0.1));
                }
                add(n("ffn_gate_exps.weight"), &[e, f, x], exps, unit(e));
                add(n("ffn_up_exps.weight"), &[e, f, x], exps, unit(e));
                add(n("ffn_down_exps.weight"), &[f, e, x], exps, branch(f));
                if oai {
                    add(n("ffn_gate_exps.bias"), &[f, x], F32, Init::Uniform(0.1));
                    add(n("ffn_up_exps.bias"), &[f, x], F32, Init::Uniform(0.1));
                    add(n("ffn_down_exps.bias"), &[e, x], F32, Init::Uniform(0.02));
                }
                if let Some(s) = m.n_ff_shexp {
                    // HF shared_expert_gate is a Linear(n_embd, 1): ne {n_embd, 1}.
                    add(n("ffn_gate_inp_shexp.weight"), &[e, 1], F32, unit(e));
                    add(n("ffn_gate_shexp.weight"), &[e, s], Weight, unit(e));
                    add(n("ffn_up_shexp.weight"), &[e, s], Weight, unit(e));
                    add(n("ffn_down_shexp.weight"), &[s, e], Weight, branch(s));
                }
            }
            None => {
                add(n("ffn_gate.weight"), &[e, sh.n_ff], Weight, unit(e));
                add(n("ffn_up.weight"), &[e, sh.n_ff], Weight, unit(e));
                add(n("ffn_down.weight"), &[sh.n_ff, e], Weight, branch(sh.n_ff));
            }
        }
    }
    add("output_norm.weight".into(), &[e], F32, ONE);
    let logit_scale = Init::Uniform(4.0 / (e as f32).sqrt());
    add(
        "output.weight".into(),
        &[e, n_vocab],
        Kind::Output,
        logit_scale,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::super::shapes::Preset;
    use super::*;

    fn list(p: Preset, mtp: bool) -> Vec<Spec> {
        let sh = p.shape(p.arch().expect("a named model's preset"));
        tensors(&sh, mtp, sh.n_vocab)
    }

    fn get<'a>(l: &'a [Spec], name: &str) -> &'a Spec {
        l.iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no tensor {name}"))
    }

    #[test]
    fn qwen3_tensors() {
        let l = list(Preset::Qwen3_0_6b, false);
        // embd, output_norm, output + 11 per layer.
        assert_eq!(l.len(), 3 + 28 * 11);
        assert_eq!(get(&l, "blk.0.attn_q.weight").shape, [1024, 2048]);
        assert_eq!(get(&l, "blk.27.attn_k.weight").shape, [1024, 1024]);
        assert_eq!(get(&l, "blk.0.attn_output.weight").shape, [2048, 1024]);
        assert_eq!(get(&l, "blk.0.attn_q_norm.weight").shape, [128]);
        assert_eq!(get(&l, "blk.0.attn_k_norm.weight").kind, Kind::F32);
        assert_eq!(get(&l, "blk.0.ffn_down.weight").shape, [3072, 1024]);
        assert_eq!(get(&l, "output.weight").shape, [1024, 151_936]);
        // --mtp is a Qwen3.5 thing: nothing changes.
        assert_eq!(list(Preset::Qwen3_0_6b, true), l);
    }

    #[test]
    fn llama3_tensors() {
        let l = list(Preset::Llama32_1b, false);
        // rope_freqs, embd, output_norm, output + 9 per layer.
        assert_eq!(l.len(), 4 + 16 * 9);
        let f = &l[0];
        assert_eq!(
            (f.name.as_str(), f.shape.as_slice(), f.kind),
            ("rope_freqs.weight", &[32][..], Kind::F32)
        );
        let Init::Values(v) = &f.init else {
            panic!("rope_freqs has computed values")
        };
        // The fast pairs keep their frequency, the slowest are divided by 32, and
        // the divisors never decrease with the pair's wavelength.
        assert_eq!((v[0], v[31]), (1.0, 32.0));
        assert!(v.windows(2).all(|w| w[0] <= w[1]), "{v:?}");
        let blended = v.iter().filter(|&&x| x > 1.0 && x < 32.0).count();
        assert!(blended > 0, "no pair between the thresholds: {v:?}");
        assert_eq!(get(&l, "blk.0.attn_q.weight").shape, [2048, 2048]);
        assert_eq!(get(&l, "blk.0.attn_k.weight").shape, [2048, 512]);
        assert_eq!(get(&l, "blk.15.ffn_down.weight").shape, [8192, 2048]);
        assert_eq!(get(&l, "output.weight").shape, [2048, 128_256]);

        let l = list(Preset::Llama31_8b, false);
        assert_eq!(get(&l, "rope_freqs.weight").shape, [64]);
        // No rope scaling, no divisors.
        let sh = Preset::S8b.shape(SynthArch::Llama);
        assert!(tensors(&sh, false, sh.n_vocab)
            .iter()
            .all(|s| s.name != "rope_freqs.weight"));
    }

    #[test]
    fn llama3_metadata() {
        let read = |p: Preset| {
            let sh = p.shape(SynthArch::Llama);
            let mut w = GgufWriter::new();
            metadata(&sh, false, 1000, &mut w);
            let bytes = w.to_bytes(|_| Vec::new()).expect("serialises");
            tempo9_gguf::GgufFile::from_bytes(bytes).expect("parses")
        };
        let f = read(Preset::Llama32_1b);
        let m = f.metadata();
        assert_eq!(m.get_f32("llama.rope.freq_base").unwrap(), Some(500_000.0));
        assert_eq!(m.get_u32("llama.rope.dimension_count").unwrap(), Some(64));
        assert_eq!(m.get_u32("llama.attention.key_length").unwrap(), Some(64));
        assert_eq!(m.get_u32("llama.context_length").unwrap(), Some(131_072));
        // Llama 3 scaling lives in the tensor, not in rope.scaling keys.
        assert_eq!(m.get_str("llama.rope.scaling.type").unwrap(), None);
        let f = read(Preset::Llama31_8b);
        assert_eq!(
            f.metadata().get_u32("llama.attention.key_length").unwrap(),
            None
        );
    }

    #[test]
    fn mistral3_layout_and_metadata() {
        let l = list(Preset::Ministral3_3b, false);
        assert_eq!(l.len(), 3 + 26 * 9);
        // head_dim 128 with 32 heads: Q is wider than the embedding.
        assert_eq!(get(&l, "blk.0.attn_q.weight").shape, [3072, 4096]);
        assert_eq!(get(&l, "blk.0.attn_k.weight").shape, [3072, 1024]);
        assert_eq!(get(&l, "blk.25.attn_output.weight").shape, [4096, 3072]);
        assert_eq!(get(&l, "blk.0.ffn_gate.weight").shape, [3072, 9216]);
        assert!(l.iter().all(|s| !s.name.contains("attn_q_norm")));

        let sh = Preset::Ministral3_3b.shape(SynthArch::Mistral3);
        let mut w = GgufWriter::new();
        metadata(&sh, false, 131_072, &mut w);
        let bytes = w.to_bytes(|_| Vec::new()).expect("serialises");
        let f = tempo9_gguf::GgufFile::from_bytes(bytes).expect("parses");
        let m = f.metadata();
        let f32_key = |k: &str| m.get_f32(&format!("mistral3.{k}")).unwrap();
        let u32_key = |k: &str| m.get_u32(&format!("mistral3.{k}")).unwrap();
        assert_eq!(
            m.get_str("mistral3.rope.scaling.type").unwrap(),
            Some("yarn")
        );
        assert_eq!(f32_key("rope.scaling.factor"), Some(16.0));
        assert_eq!(
            u32_key("rope.scaling.original_context_length"),
            Some(16_384)
        );
        assert_eq!(f32_key("rope.scaling.yarn_beta_fast"), Some(32.0));
        assert_eq!(f32_key("rope.scaling.yarn_log_multiplier"), Some(1.0));
        assert_eq!(f32_key("attention.temperature_scale"), Some(0.1));
        assert_eq!(u32_key("attention.key_length"), Some(128));
        assert_eq!(u32_key("rope.dimension_count"), Some(128));
        assert_eq!(u32_key("context_length"), Some(262_144));
    }

    #[test]
    fn gpt_oss_layout_and_metadata() {
        let l = list(Preset::GptOss20b, false);
        // Per layer: 2 norms, Q/K/V/O weights and biases, sinks, the router and its
        // bias, 3 experts and their 3 biases.
        assert_eq!(l.len(), 3 + 24 * 19);
        assert_eq!(get(&l, "blk.0.attn_q.weight").shape, [2880, 4096]);
        assert_eq!(get(&l, "blk.0.attn_q.bias").shape, [4096]);
        assert_eq!(get(&l, "blk.0.attn_k.weight").shape, [2880, 512]);
        assert_eq!(get(&l, "blk.0.attn_output.weight").shape, [4096, 2880]);
        assert_eq!(get(&l, "blk.0.attn_output.bias").shape, [2880]);
        let s = get(&l, "blk.3.attn_sinks.weight");
        assert_eq!((s.shape.as_slice(), s.kind), (&[64][..], Kind::F32));
        assert_eq!(get(&l, "blk.0.post_attention_norm.weight").shape, [2880]);
        assert_eq!(get(&l, "blk.0.ffn_gate_inp.bias").shape, [32]);
        let g = get(&l, "blk.0.ffn_gate_exps.weight");
        assert_eq!(
            (g.shape.as_slice(), g.kind),
            (&[2880, 2880, 32][..], Kind::Mxfp4)
        );
        assert_eq!(get(&l, "blk.0.ffn_down_exps.weight").kind, Kind::Mxfp4);
        assert_eq!(get(&l, "blk.0.ffn_up_exps.bias").shape, [2880, 32]);
        assert_eq!(get(&l, "blk.0.ffn_down_exps.bias").shape, [2880, 32]);
        assert!(l.iter().all(|s| !s.name.contains("ffn_norm")));

        let sh = Preset::GptOss20b.shape(SynthArch::GptOss);
        let mut w = GgufWriter::new();
        metadata(&sh, false, 201_088, &mut w);
        let bytes = w.to_bytes(|_| Vec::new()).expect("serialises");
        let f = tempo9_gguf::GgufFile::from_bytes(bytes).expect("parses");
        let m = f.metadata();
        let u32_key = |k: &str| m.get_u32(&format!("gpt-oss.{k}")).unwrap();
        assert_eq!(u32_key("attention.sliding_window"), Some(128));
        assert_eq!(u32_key("expert_count"), Some(32));
        assert_eq!(u32_key("expert_used_count"), Some(4));
        assert_eq!(u32_key("expert_feed_forward_length"), Some(2880));
        assert_eq!(u32_key("attention.key_length"), Some(64));
        assert_eq!(u32_key("rope.scaling.original_context_length"), Some(4096));
        assert_eq!(
            m.get_f32("gpt-oss.rope.scaling.factor").unwrap(),
            Some(32.0)
        );
        assert_eq!(
            m.get_f32("gpt-oss.rope.freq_base").unwrap(),
            Some(150_000.0)
        );
        // Mistral 3's keys only.
        assert_eq!(
            m.get_f32("gpt-oss.attention.temperature_scale").unwrap(),
            None
        );
    }

    #[test]
    fn qwen3moe_tensors() {
        let l = list(Preset::Qwen3_30bA3b, false);
        assert_eq!(l.len(), 3 + 48 * 12);
        let r = get(&l, "blk.0.ffn_gate_inp.weight");
        assert_eq!((r.shape.as_slice(), r.kind), (&[2048, 128][..], Kind::F32));
        assert_eq!(
            get(&l, "blk.5.ffn_gate_exps.weight").shape,
            [2048, 768, 128]
        );
        assert_eq!(get(&l, "blk.5.ffn_up_exps.weight").shape, [2048, 768, 128]);
        assert_eq!(
            get(&l, "blk.47.ffn_down_exps.weight").shape,
            [768, 2048, 128]
        );
        assert_eq!(get(&l, "blk.0.attn_q.weight").shape, [2048, 4096]);
        assert!(l.iter().all(|s| !s.name.contains("ffn_gate.weight")));
        assert!(l.iter().all(|s| !s.name.contains("shexp")));
    }

    #[test]
    fn qwen35_tensors() {
        let l = list(Preset::Qwen35_0_8b, false);
        // 18 DeltaNet layers of 14 tensors, 6 attention layers of 11.
        assert_eq!(l.len(), 3 + 18 * 14 + 6 * 11);
        assert_eq!(get(&l, "blk.3.attn_q.weight").shape, [1024, 4096]);
        assert_eq!(get(&l, "blk.3.attn_k.weight").shape, [1024, 512]);
        assert_eq!(get(&l, "blk.3.attn_output.weight").shape, [2048, 1024]);
        assert_eq!(get(&l, "blk.3.attn_q_norm.weight").shape, [256]);
        assert_eq!(get(&l, "blk.0.attn_qkv.weight").shape, [1024, 6144]);
        assert_eq!(get(&l, "blk.0.attn_gate.weight").shape, [1024, 2048]);
        let c = get(&l, "blk.0.ssm_conv1d.weight");
        assert_eq!((c.shape.as_slice(), c.kind), (&[4, 6144][..], Kind::F32));
        assert_eq!(get(&l, "blk.0.ssm_a").shape, [16]);
        assert_eq!(get(&l, "blk.0.ssm_dt.bias").shape, [16]);
        assert_eq!(get(&l, "blk.0.ssm_alpha.weight").shape, [1024, 16]);
        assert_eq!(get(&l, "blk.0.ssm_norm.weight").shape, [128]);
        assert_eq!(get(&l, "blk.0.ssm_out.weight").shape, [2048, 1024]);
        assert_eq!(get(&l, "blk.23.post_attention_norm.weight").shape, [1024]);
        assert!(l.iter().all(|s| !s.name.starts_with("blk.3.ssm")));
        assert!(l.iter().all(|s| !s.name.contains("ffn_norm")));

        // V heads != K heads: 4B.
        let l = list(Preset::Qwen35_4b, false);
        assert_eq!(get(&l, "blk.0.attn_qkv.weight").shape, [2560, 8192]);
        assert_eq!(get(&l, "blk.0.ssm_beta.weight").shape, [2560, 32]);

        let l = list(Preset::Qwen35Tiny, true);
        assert_eq!(l.len(), 3 + 6 * 14 + 2 * 11 + (11 + 4));
        assert_eq!(get(&l, "blk.8.nextn.eh_proj.weight").shape, [256, 128]);
        assert_eq!(get(&l, "blk.8.attn_q.weight").shape, [128, 512]);
        assert_eq!(get(&l, "blk.8.ffn_up.weight").shape, [128, 384]);
        assert_eq!(get(&l, "blk.0.ssm_conv1d.weight").shape, [4, 256]);
    }

    #[test]
    fn qwen35moe_tensors() {
        let l = list(Preset::Qwen35_35bA3b, false);
        // 30 DeltaNet layers of 19 tensors, 10 attention layers of 16.
        assert_eq!(l.len(), 3 + 30 * 19 + 10 * 16);
        assert_eq!(get(&l, "blk.0.attn_qkv.weight").shape, [2048, 8192]);
        assert_eq!(get(&l, "blk.0.attn_gate.weight").shape, [2048, 4096]);
        assert_eq!(get(&l, "blk.0.ssm_conv1d.weight").shape, [4, 8192]);
        assert_eq!(get(&l, "blk.0.ssm_alpha.weight").shape, [2048, 32]);
        assert_eq!(get(&l, "blk.0.ssm_out.weight").shape, [4096, 2048]);
        assert_eq!(get(&l, "blk.3.attn_q.weight").shape, [2048, 8192]);
        assert_eq!(get(&l, "blk.3.attn_output.weight").shape, [4096, 2048]);
        assert_eq!(get(&l, "blk.0.ffn_gate_inp.weight").shape, [2048, 256]);
        assert_eq!(
            get(&l, "blk.0.ffn_gate_exps.weight").shape,
            [2048, 512, 256]
        );
        assert_eq!(
            get(&l, "blk.0.ffn_down_exps.weight").shape,
            [512, 2048, 256]
        );
        assert_eq!(get(&l, "blk.0.ffn_gate_shexp.weight").shape, [2048, 512]);
        assert_eq!(get(&l, "blk.0.ffn_down_shexp.weight").shape, [512, 2048]);
        let g = get(&l, "blk.0.ffn_gate_inp_shexp.weight");
        assert_eq!((g.shape.as_slice(), g.kind), (&[2048, 1][..], Kind::F32));

        let l = list(Preset::Qwen35moeTiny, true);
        assert_eq!(l.len(), 3 + 6 * 19 + 2 * 16 + (16 + 4));
        assert_eq!(get(&l, "blk.8.ffn_gate_exps.weight").shape, [128, 64, 8]);
    }

    #[test]
    fn hybrid_metadata() {
        let sh = Preset::Qwen35Tiny.shape(SynthArch::Qwen35);
        let mut w = GgufWriter::new();
        metadata(&sh, true, 1000, &mut w);
        let bytes = w.to_bytes(|_| Vec::new()).expect("serialises");
        let f = tempo9_gguf::GgufFile::from_bytes(bytes).expect("parses");
        let m = f.metadata();
        assert_eq!(m.get_u32("qwen35.block_count").unwrap(), Some(9));
        assert_eq!(m.get_u32("qwen35.nextn_predict_layers").unwrap(), Some(1));
        assert_eq!(m.get_u32("qwen35.rope.dimension_count").unwrap(), Some(16));
        assert_eq!(
            m.get_i32_array("qwen35.rope.dimension_sections").unwrap(),
            Some(&[3, 3, 2, 0][..])
        );
        let r = m
            .get_bool_array("qwen35.attention.recurrent_layers")
            .unwrap();
        let want = [true, true, true, false, true, true, true, false, false];
        assert_eq!(r, Some(&want[..]));
        // The published sections.
        let sh = Preset::Qwen35_35bA3b.shape(SynthArch::Qwen35moe);
        assert_eq!(mrope_sections((sh.n_rot / 2) as i32), [11, 11, 10, 0]);
    }
}
